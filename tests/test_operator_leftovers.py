"""What an operator is told, where shared/findings/newcomer-4.md found it missing:

- D9: an obfs4 bridge whose state directory or files other users may read starts
  with a WARNING naming each by its role and the chmod that closes it (as ssh
  does for a private key), under the command line and under Tor;
- obfs4's private-key and drbg-seed are secret options: a line to Tor that
  quotes one shows it scrubbed;
- a bad --bridge line is refused by the place of the wrong word, never its text
  (it may be a cert= or a secret url=);
- F7: a live tunnel that the bridge resets is said at NOTICE on the client, and
  one the application resets is not (that is the application's own doing).
"""

import logging
import os
import signal
import socket
import struct
import subprocess
import sys

import pytest
from fake_tor import ManagedPT, server_env
from support import PROGRAM, ROOT, EchoServer, Program, echo_round_trip, fmt, socks5_connect

import managed
import obfs4_state
import transports

WAIT = 30
POSIX_ONLY = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes and signals")


# --- D9: state files open to other users ---------------------------------------------------

def open_up(state, directory=0o755, state_file=0o644, bridge_file=0o600):
    os.chmod(str(state), directory)
    os.chmod(str(state / obfs4_state.STATE_FILE), state_file)
    os.chmod(str(state / obfs4_state.BRIDGE_FILE), bridge_file)


@POSIX_ONLY
def test_state_open_to_others_is_warned_by_role_with_the_chmod(tmp_path):
    state = tmp_path / "state"
    identity, notes = obfs4_state.load_or_create_state(state, {})
    assert notes == ()                                       # made 0700 and 0600: nothing to say
    open_up(state, 0o750, 0o644, 0o604)
    again, notes = obfs4_state.load_or_create_state(state, {})
    assert list(notes) == [
        "the obfs4 state directory %s is open to other users (mode 0750): chmod 700 %s" % (state, state),
        "the bridge's private key file %s is open to other users (mode 0644): chmod 600 %s"
        % (state / "obfs4_state.json", state / "obfs4_state.json"),
        "the bridge line file %s is open to other users (mode 0604): chmod 600 %s"
        % (state / "obfs4_bridgeline.txt", state / "obfs4_bridgeline.txt")]
    assert all(note.level == logging.WARNING for note in notes)
    assert again.private_key == identity.private_key          # a warning, not a refusal
    assert identity.private_key.hex() not in " ".join(notes)  # the role, never the content
    assert (os.stat(str(state)).st_mode & 0o777) == 0o750     # and the operator's modes stay


@POSIX_ONLY
def test_only_the_loose_ones_are_named_and_the_chmod_is_quoted_for_a_shell(tmp_path):
    state = tmp_path / "a state"
    obfs4_state.load_or_create_state(state, {})
    open_up(state, 0o700, 0o640, 0o600)                       # group-readable only
    notes = obfs4_state.load_or_create_state(state, {})[1]
    assert len(notes) == 1 and notes[0].endswith("(mode 0640): chmod 600 '%s'" % (state / "obfs4_state.json"))


def test_a_system_without_posix_modes_says_nothing(tmp_path, monkeypatch):
    state = tmp_path / "state"
    obfs4_state.load_or_create_state(state, {})
    if os.name == "posix":
        open_up(state)
    monkeypatch.setattr(obfs4_state, "POSIX_MODES", False)
    assert obfs4_state.load_or_create_state(state, {})[1] == ()


@POSIX_ONLY
def test_identity_options_keep_their_note_beside_the_warning(tmp_path):
    state = tmp_path / "state"
    obfs4_state.load_or_create_state(state, {})
    open_up(state, 0o700, 0o644)
    options = {"node-id": "01" * 20, "private-key": "ab" * 32, "drbg-seed": "cd" * 24}
    notes = obfs4_state.load_or_create_state(state, options)[1]
    assert notes[0].startswith("node-id, private-key and drbg-seed replaced the identity")
    assert getattr(notes[0], "level", None) is None           # said at NOTICE, as before
    assert notes[1].startswith("the bridge's private key file") and notes[1].level == logging.WARNING


@POSIX_ONLY
def test_a_server_started_on_an_open_state_warns(tmp_path):
    state = tmp_path / "state"
    obfs4_state.load_or_create_state(state, {})
    open_up(state, 0o755, 0o644)
    with EchoServer() as echo, \
            Program("server", "--state-dir=%s" % state, "--dest=" + fmt(echo.address),
                    "127.0.0.1:0") as server:
        said = server.log.wait_for(r"\[WARNING\] obfs4: the obfs4 state directory", timeout=WAIT).string
        server.log.wait_for(r"\[WARNING\] obfs4: the bridge's private key file .* is open to other users "
                            r"\(mode 0644\): chmod 600 ", timeout=WAIT)
    assert said.endswith("(mode 0755): chmod 700 %s" % state), said


@POSIX_ONLY
def test_a_managed_bridge_on_an_open_state_tells_tor(tmp_path):
    """Under Tor, a WARNING also goes to Tor's own log, where the operator looks."""
    env = server_env(tmp_path, ("127.0.0.1", 1), transports="obfs4")
    state = tmp_path / "server-state"
    obfs4_state.load_or_create_state(state, {})
    open_up(state, 0o700, 0o644)
    with ManagedPT(env) as tor:                               # read up to SMETHODS DONE
        assert "SMETHOD" in tor.keywords(), tor.stdout.lines
    said = [line for line in tor.stdout.lines if line.startswith("LOG SEVERITY=warning")]
    path = state / "obfs4_state.json"
    assert said == ['LOG SEVERITY=warning MESSAGE="obfs4: the bridge\'s private key file %s is open to '
                    'other users (mode 0644): chmod 600 %s"' % (path, path)], tor.stdout.lines


# --- obfs4's secret options ----------------------------------------------------------------

def test_obfs4s_private_key_and_drbg_seed_are_scrubbed_from_lines_to_tor():
    """Safe logging's list for obfs4 (``secret_options``): the server's private key and
    drbg-seed, which Tor passes in TOR_PT_SERVER_TRANSPORT_OPTIONS."""
    assert {"private-key", "drbg-seed"} <= set(transports.TRANSPORTS["obfs4"].secret_options)
    written = []
    managed.Announcer(written.append).say(
        "SMETHOD-ERROR", "obfs4", "bad options: private-key=c0ffee15dec0de,drbg-seed=5eed5eed5eed node-id=01")
    assert written == ["SMETHOD-ERROR obfs4 bad options: private-key=[scrubbed],drbg-seed=[scrubbed] "
                       "node-id=01\n"]


# --- A bad --bridge line: where, never what ------------------------------------------------

SECRET = "Q7SecretQ7Value"
CERT = "SeKrIt" + "A" * 64

BAD_BRIDGES = {
    "a cert= where the address goes": ("obfs4 cert=%s 127.0.0.1:1" % CERT,
                                       "word 2 is not the bridge's HOST:PORT"),
    "a url= where the address goes": ("Bridge webtunnel url=https://example.org/%s" % SECRET,
                                      "word 3 is not the bridge's HOST:PORT"),
    "a secret where the transport goes": ("%s 127.0.0.1:1" % SECRET, "word 1 is not a transport name"),
    "cert: for cert=": ("obfs4 127.0.0.1:1 cert:%s iat-mode=0" % CERT, "word 3 is neither"),
    "no key": ("Bridge obfs4 127.0.0.1:1 %s iat-mode=0 =%s" % ("0123456789" * 4, SECRET),
               "word 6 is neither"),
}


@pytest.mark.parametrize("case", list(BAD_BRIDGES))
def test_a_bad_bridge_line_is_refused_by_the_place_of_the_word(case):
    line, said = BAD_BRIDGES[case]
    done = subprocess.run([sys.executable, PROGRAM, "client", "--bridge=" + line, "127.0.0.1:0"],
                          cwd=str(ROOT), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "--bridge: " + said in done.stderr, done.stderr
    assert SECRET not in done.stderr + done.stdout and "SeKrIt" not in done.stderr + done.stdout


# --- F7: the bridge resets a live tunnel --------------------------------------------------

def live_tunnel(server, client):
    app = socks5_connect(client.address, server.address, timeout=WAIT)
    assert echo_round_trip(app, b"live") == b"live"
    return app


@POSIX_ONLY
def test_a_tunnel_the_bridge_resets_is_said_at_notice_on_the_client():
    with EchoServer() as echo, \
            Program("server", "--transport=dummy", "--dest=" + fmt(echo.address), "127.0.0.1:0") as server, \
            Program("client", "--transport=dummy", "127.0.0.1:0") as client:
        with live_tunnel(server, client) as app:
            server.process.send_signal(signal.SIGTERM)        # stopping now: live tunnels are reset
            server.log.wait_for(r"stopping now: 1 live tunnel\(s\) reset", timeout=WAIT)
            app.settimeout(WAIT)
            with pytest.raises(ConnectionResetError):         # the application's reset, as before
                while app.recv(4096):
                    pass
            client.log.wait_for(r"\[NOTICE\] conn 1 \(\[scrubbed\]\): the bridge reset the tunnel "
                                r"\(the application gets a reset\)$", timeout=WAIT)


@POSIX_ONLY
def test_a_tunnel_the_application_resets_is_not_blamed_on_the_bridge():
    with EchoServer() as echo, \
            Program("server", "--transport=dummy", "--dest=" + fmt(echo.address), "127.0.0.1:0") as server, \
            Program("client", "--transport=dummy", "--log-min-severity=info", "127.0.0.1:0") as client:
        app = live_tunnel(server, client)
        app.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        app.close()                                           # the application resets its own
        client.log.wait_for(r"\[INFO\] conn 1 \(\[scrubbed\]\): (Connection reset by peer|Broken pipe)$",
                            timeout=WAIT)
    assert not [line for line in client.log.lines if "the bridge reset" in line], client.log.lines
