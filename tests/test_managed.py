r"""Managed mode (pt-spec v1): the environment parsers, the Extended ORPort
handshake, and ``obfsproxy.py managed`` run as Tor runs it (tests/fake_tor.py).

Every subprocess test goes through ``ManagedPT``, which fails the test if any
stdout line is not a pluggable-transport message.
"""

import base64
import hashlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys

import pytest
from fake_tor import (
    OBFS4_BRIDGE_LINE,
    OBFS4_STATE,
    ExtORPort,
    ManagedPT,
    Obfs2Client,
    client_env,
    managed_echo_server,
    obfs4_state,
    parse_address,
    server_env,
    socks5_connect_split,
    tor_env,
    write_cookie,
)
from support import (
    PROGRAM,
    ROOT,
    UNDER_TEST,
    UNDER_TEST_CWD,
    EchoServer,
    Program,
    SocksReplyError,
    assert_refused,
    echo_round_trip,
    has_ipv6_loopback,
    listening_socket,
    load_vectors,
    recv_exact,
    require_obfs4proxy,
    reserved_port,
    socks5_connect,
    wait_until,
)

import managed
import outbound

FAST = "--ss-hash-iterations=10"   # shared-secret mode, cheap enough for tests
POSIX_SIGNALS = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def same(a, b):
    return hashlib.sha256(a).digest() == hashlib.sha256(b).digest()


# --- Parsers (no I/O) ------------------------------------------------------------------

def test_transport_options_with_escapes():
    text = r"obfs2:shared-secret=a\:b\;c\=d\\e;dummy:x=1;obfs2:k=v=w"
    assert managed.parse_transport_options(text) == {
        "obfs2": {"shared-secret": "a:b;c=d\\e", "k": "v=w"}, "dummy": {"x": "1"}}
    assert managed.parse_transport_options("") == {}


@pytest.mark.parametrize("text", ["obfs2", "obfs2:novalue", ":k=v", "obfs2:=v", "obfs2:k=v\\"])
def test_transport_options_malformed(text):
    with pytest.raises(managed.EnvError):
        managed.parse_transport_options(text)


@pytest.mark.parametrize("text, message", [
    ("obfs2:hunter2", "item 1 (from character 1) is not TRANSPORT:KEY=VALUE"),
    ("obfs2:k=v;;hunter2", "item 3 (from character 12) is not TRANSPORT:KEY=VALUE"),
    ("obfs2:shared-secret=hunter2\\", "a lone backslash ends the text (character 28)"),
])
def test_transport_options_errors_say_where_never_what(text, message):
    """review-4 finding 4: the item may hold a secret, and ENV-ERROR reaches Tor's log."""
    with pytest.raises(managed.EnvError) as caught:
        managed.parse_transport_options(text)
    assert str(caught.value) == "TOR_PT_SERVER_TRANSPORT_OPTIONS: " + message


def test_bindaddrs():
    assert managed.parse_bindaddrs("obfs2-0.0.0.0:1051, dummy-[::1]:0") == {
        "obfs2": ("0.0.0.0", 1051), "dummy": ("::1", 0)}


@pytest.mark.parametrize("text", ["obfs2", "obfs2-1.2.3.4", "obfs2-::1:0", "-1.2.3.4:5",
                                  "obfs2-1.2.3.4:65536"])
def test_bindaddrs_malformed(text):
    with pytest.raises(managed.EnvError):
        managed.parse_bindaddrs(text)


def test_transport_names():
    assert managed.parse_transports("obfs4,obfs2, obfs2,snowflake") == (["obfs4", "obfs2"], ["snowflake"])
    assert managed.parse_transports("*") == (["meek", "meek_lite", "webtunnel", "obfs4", "obfs3", "obfs2",
                                             "dummy"], [])
    assert managed.parse_transports("dummy,*") == (
        ["dummy", "meek", "meek_lite", "webtunnel", "obfs4", "obfs3", "obfs2"], [])
    assert managed.parse_transports("") == ([], [])


def test_smethod_args_escaping():
    assert managed.escape_arg(r"a=b,c\d;e:f") == r"a\=b\,c\\d;e:f"


@pytest.mark.parametrize("offered, expected", [("1", "1"), ("3,1", "1"), ("2", None), ("", None)])
def test_version_negotiation(offered, expected):
    assert managed.negotiate_version({"TOR_PT_MANAGED_TRANSPORT_VER": offered}) == expected


def test_version_missing_is_an_env_error():
    with pytest.raises(managed.EnvError):
        managed.negotiate_version({})


# --- Stdout belongs to Tor --------------------------------------------------------------

def test_announcer_keeps_each_message_on_one_line():
    written = []
    managed.Announcer(written.append).say("ENV-ERROR", "bad\nVERSION 1\r")
    assert written == ["ENV-ERROR bad?VERSION 1?\n"]


def test_lines_to_tor_scrub_secret_values_except_in_smethod_args():
    """A second guard behind the messages themselves: a LOG line or an error line
    that quoted a secret option's value (obfs2's shared-secret) shows none."""
    import logging
    written = []
    tor = managed.Announcer(written.append)
    handler = managed.TorLog(tor)
    record = logging.LogRecord("obfsproxy", logging.WARNING, __file__, 1,
                               "conn 1: shared-secret=hunter2 is wrong", None, None)
    handler.emit(record)
    tor.say("SMETHOD-ERROR", "obfs2", "bad shared-secret=hunter2;x")
    tor.say("SMETHOD", "obfs2", "127.0.0.1:1", "ARGS:shared-secret=hunter2")   # what clients need
    assert written == ['LOG SEVERITY=warning MESSAGE="conn 1: shared-secret=[scrubbed] is wrong"\n',
                       "SMETHOD-ERROR obfs2 bad shared-secret=[scrubbed]\n",
                       "SMETHOD obfs2 127.0.0.1:1 ARGS:shared-secret=hunter2\n"]


def test_a_failed_write_to_tor_stops_the_forwarding_not_the_thread():
    """Tor closed our stdout: the first failed write is logged once, in our log
    only, without re-entering the Announcer from the thread that holds it, and
    nothing more is written to Tor."""
    import logging
    import threading
    attempts = []

    def write(line):
        attempts.append(line)
        raise BrokenPipeError(32, "Broken pipe")
    tor = managed.Announcer(write)
    handler, ours = managed.TorLog(tor), []
    catch = logging.Handler()
    catch.emit = lambda record: ours.append(record.getMessage())
    for h in (handler, catch):
        managed.log.addHandler(h)
    try:
        said = threading.Thread(target=managed.log.warning, args=("a failure",), daemon=True)
        said.start()
        said.join(10)
        assert not said.is_alive(), "logging a failure hung after Tor's pipe broke"
        managed.log.warning("another failure")
        tor.say("LOG", "SEVERITY=notice", 'MESSAGE="x"')
    finally:
        for h in (handler, catch):
            managed.log.removeHandler(h)
    assert tor.broken and len(attempts) == 1
    assert sum("no more lines go to Tor" in text for text in ours) == 1


def test_nothing_but_messages_reaches_stdout():
    """After take_stdout, prints, raw writes on fd 1 and tracebacks go to stderr."""
    code = ("import os, sys; sys.path.insert(0, %r); import managed\n"
            "tor = managed.take_stdout()\n"
            "print('stray print'); os.write(1, b'stray fd write\\n'); sys.__stdout__.write('x\\n')\n"
            "tor.say('VERSION', '1')\n"
            "raise RuntimeError('boom')\n" % str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=30)
    assert done.stdout == b"VERSION 1\n"
    for text in (b"stray print", b"stray fd write", b"RuntimeError: boom"):
        assert text in done.stderr


# --- The Extended ORPort handshake, in process ------------------------------------------

def ext_handshake(tmp_path, server_cookie, file_cookie, answer="OKAY",
                  client=("2001:db8::1", 5678, 0, 0)):
    cookie_file = tmp_path / "cookie"
    write_cookie(cookie_file, file_cookie)
    with ExtORPort(server_cookie, answer) as ext:
        with socket.create_connection(ext.address, timeout=10) as sock:
            try:
                outbound.ext_orport_handshake(sock, cookie_file, client, "obfs2",
                                             outbound.Deadline(10))
                sock.sendall(b"hello")
                assert recv_exact(sock, 5) == b"hello"
            finally:
                sock.close()
                session = ext.wait_session()
    return session


def test_ext_orport_okay(tmp_path):
    cookie = os.urandom(32)
    session = ext_handshake(tmp_path, cookie, cookie)
    assert session["client_hash_ok"] is True
    assert session["useraddr"] == "[2001:db8::1]:5678"
    assert session["transport"] == "obfs2"
    assert session["done"] is True


def test_ext_orport_deny_is_a_typed_oserror(tmp_path):
    cookie = os.urandom(32)
    with pytest.raises(outbound.ExtORPortError, match="denied") as info:
        ext_handshake(tmp_path, cookie, cookie, answer="DENY", client=("192.0.2.7", 4000))
    assert isinstance(info.value, OSError)


def test_ext_orport_wrong_cookie(tmp_path):
    with pytest.raises(outbound.ExtORPortError, match="wrong server hash"):
        ext_handshake(tmp_path, os.urandom(32), os.urandom(32))


def test_ext_orport_bad_cookie_file(tmp_path):
    (tmp_path / "cookie").write_bytes(b"not a cookie")
    with pytest.raises(outbound.ExtORPortError, match="not an Extended ORPort cookie"):
        with socket.socket() as sock:
            outbound.ext_orport_handshake(sock, tmp_path / "cookie", ("127.0.0.1", 1), "obfs2",
                                         outbound.Deadline(1))


# --- The environment matrix ---------------------------------------------------------------

def run_to_exit(env, *args):
    with ManagedPT(env, *args) as pt:
        status = pt.wait(10)
    return pt, status


@pytest.mark.parametrize("version, first", [(None, "ENV-ERROR"), ("2", "VERSION-ERROR"),
                                            ("", "VERSION-ERROR")])
def test_unusable_version(tmp_path, version, first):
    env = client_env(tmp_path, MANAGED_TRANSPORT_VER=version)
    pt, status = run_to_exit(env)
    assert pt.keywords() == [first] and status == 1
    if first == "VERSION-ERROR":
        assert pt.field(first) == "no-version"


def test_second_offered_version_is_chosen(tmp_path):
    with ManagedPT(client_env(tmp_path, MANAGED_TRANSPORT_VER="3,1")) as pt:
        assert pt.keywords() == ["VERSION", "CMETHOD", "CMETHODS DONE"]
        assert pt.field("VERSION", "version") == "1"


def _file_in_the_way(tmp_path):
    (tmp_path / "file").write_text("x")
    return str(tmp_path / "file" / "state")


ENV_ERRORS = {
    "no state location": ("client", {"STATE_LOCATION": None}, ()),
    "state location unusable": ("client", {"STATE_LOCATION": _file_in_the_way}, ()),
    "no transports at all": ("client", {"CLIENT_TRANSPORTS": None}, ()),
    "server without bind address": ("server", {"SERVER_BINDADDR": None}, ()),
    "malformed bind address": ("server", {"SERVER_BINDADDR": "obfs2:127.0.0.1:0"}, ()),
    "server without ORPort": ("server", {"ORPORT": None}, ()),
    "malformed ORPort": ("server", {"ORPORT": "nowhere"}, ()),
    "Extended ORPort without cookie": ("server", {"EXTENDED_SERVER_PORT": "127.0.0.1:9"}, ()),
    "missing cookie file": ("server", {"EXTENDED_SERVER_PORT": "127.0.0.1:9",
                                       "AUTH_COOKIE_FILE": "/nonexistent/cookie"}, ()),
    "malformed transport options": ("server", {"SERVER_TRANSPORT_OPTIONS": "obfs2:secret"}, ()),
    "bad command-line option": ("client", {}, ("--handshake-timeout=0",)),
}


@pytest.mark.parametrize("case", list(ENV_ERRORS))
def test_env_error(tmp_path, case):
    role, changes, args = ENV_ERRORS[case]
    changes = {k: v(tmp_path) if callable(v) else v for k, v in changes.items()}
    if role == "client":
        env = client_env(tmp_path, **changes)
    else:
        env = server_env(tmp_path, ("127.0.0.1", 9), **changes)
    pt, status = run_to_exit(env, *args)
    assert pt.keywords() in (["VERSION", "ENV-ERROR"], ["ENV-ERROR"]), pt.messages
    assert status == 1


def test_unknown_transports_are_ignored(tmp_path):
    env = client_env(tmp_path, "scramblesuit,snowflake")
    env.update(server_env(tmp_path, ("127.0.0.1", 9), "snowflake", "snowflake-127.0.0.1:0"))
    pt, status = run_to_exit(env)
    assert pt.keywords() == ["VERSION", "CMETHODS DONE", "SMETHODS DONE"]
    assert status == 0   # nothing to serve: exit, nothing bound

    with ManagedPT(client_env(tmp_path, "scramblesuit,obfs2,snowflake")) as pt:
        assert pt.keywords() == ["VERSION", "CMETHOD", "CMETHODS DONE"]
        assert list(pt.cmethods) == ["obfs2"]


def test_star_client_and_server_in_one_process(tmp_path):
    """`*` means every transport we have; our own clients tunnel to our own
    servers, obfs4's client with the cert its server announced in ARGS. webtunnel's
    server needs its url= from ServerTransportOptions: without it, SMETHOD-ERROR
    for it alone, as the upstream server says it."""
    payload = os.urandom(100_000)
    names = ["obfs4", "obfs3", "obfs2", "dummy"]
    with EchoServer() as echo:
        env = client_env(tmp_path, "*")
        env.update(server_env(tmp_path, echo.address, "*",
                              ",".join("%s-127.0.0.1:0" % name for name in ["webtunnel"] + names)))
        with ManagedPT(env, mode="--managed") as pt:   # the older torrc spelling
            assert pt.keywords() == ["VERSION"] + ["CMETHOD"] * 7 + ["CMETHODS DONE"] + \
                ["SMETHOD-ERROR"] * 3 + ["SMETHOD"] * 4 + ["SMETHODS DONE"]
            assert pt.stdout.lines[9:12] == [
                "SMETHOD-ERROR meek no address for it in TOR_PT_SERVER_BINDADDR",
                "SMETHOD-ERROR meek_lite no address for it in TOR_PT_SERVER_BINDADDR",
                "SMETHOD-ERROR webtunnel missing url parameter"]
            assert list(pt.cmethods) == ["meek", "meek_lite", "webtunnel"] + names
            assert list(pt.smethods) == names
            args = {f["name"]: f["args"] for k, f in pt.messages if k == "SMETHOD"}
            announced = args["obfs4"]
            assert re.fullmatch(r"cert=[A-Za-z0-9+/]{70},iat-mode=0", announced), announced
            assert args["obfs3"] == args["obfs2"] == args["dummy"] == ""
            for name in names:
                args = announced.replace(",", ";") if name == "obfs4" else None
                with socks5_connect(pt.cmethods[name], pt.smethods[name], args=args) as sock:
                    assert same(echo_round_trip(sock, payload), payload), name


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback")
def test_ipv6_bind_address(tmp_path):
    with managed_echo_server(tmp_path, bindaddr="obfs2-[::1]:0") as pt:
        assert pt.field("SMETHOD", "address").startswith("[::1]:")
        with Obfs2Client(pt.smethods["obfs2"]) as client:
            assert client.echo(b"over IPv6") == b"over IPv6"


@pytest.mark.parametrize("case", ["port in use", "no bind address", "unknown option",
                                  "secret with a space"])
def test_smethod_error_leaves_the_other_transport_running(tmp_path, case):
    busy = listening_socket(backlog=1)
    bind = {"obfs2": "127.0.0.1:0", "dummy": "127.0.0.1:0"}
    options = ""
    if case == "port in use":
        bind["obfs2"] = "127.0.0.1:%d" % busy.getsockname()[1]
    elif case == "no bind address":
        del bind["obfs2"]
    elif case == "unknown option":
        options = "obfs2:colour=blue"
    else:
        options = "obfs2:shared-secret=two words"
    bindaddr = ",".join("%s-%s" % item for item in bind.items())
    try:
        with EchoServer() as echo:
            env = server_env(tmp_path, echo.address, "obfs2,dummy", bindaddr,
                             SERVER_TRANSPORT_OPTIONS=options)
            with ManagedPT(env) as pt:
                assert pt.keywords() == ["VERSION", "SMETHOD-ERROR", "SMETHOD", "SMETHODS DONE"]
                assert pt.field("SMETHOD-ERROR", "name") == "obfs2"
                with socket.create_connection(pt.smethods["dummy"], timeout=10) as sock:
                    assert echo_round_trip(sock, b"dummy still works") == b"dummy still works"
    finally:
        busy.close()
    # newcomer-4 D10: our own log says why, as Tor's does (and Tor is not told twice).
    logged = (tmp_path / "server-state" / managed.LOG_FILE_NAME).read_text(encoding="utf-8")
    assert "[WARNING] obfs2: %s\n" % pt.field("SMETHOD-ERROR") in logged, logged
    assert not [line for line in pt.stdout.lines if line.startswith("LOG ")], pt.stdout.lines


# --- Shared secret: server options in, SOCKS arguments in -------------------------------------

def test_shared_secret_from_options_and_socks_arguments(tmp_path):
    secret = "a:b;c=d\\e"
    payload = os.urandom(300_000)
    with EchoServer() as echo:
        server = ManagedPT(server_env(tmp_path, echo.address,
                                      SERVER_TRANSPORT_OPTIONS=r"obfs2:shared-secret=a\:b\;c\=d\\e"),
                           FAST)
        client = ManagedPT(client_env(tmp_path), FAST)
        with server, client:
            # The client needs the secret in its Bridge line: announced as ARGS.
            assert server.field("SMETHOD", "args") == r"shared-secret=a:b;c\=d\\e,ss-hash-iterations=10"
            bridge, socks = server.smethods["obfs2"], client.cmethods["obfs2"]
            arguments = "shared-secret=" + secret.replace("\\", "\\\\").replace(";", "\\;") \
                .replace("=", "\\=")
            with socks5_connect(socks, bridge, args=arguments) as sock:
                assert same(echo_round_trip(sock, payload), payload)
            # The wrong secret, or none: the handshake fails and the SOCKS reply says so.
            for wrong in ("shared-secret=nope", None):
                with pytest.raises(SocksReplyError) as info:
                    socks5_connect(socks, bridge, args=wrong)
                assert info.value.code == 0x01


def test_shared_secret_from_the_command_line(tmp_path):
    """`... managed --shared-secret=X` on both torrc lines: no Bridge arguments needed."""
    with EchoServer() as echo:
        server = ManagedPT(server_env(tmp_path, echo.address), FAST, "--shared-secret=cli")
        client = ManagedPT(client_env(tmp_path), FAST, "--shared-secret=cli")
        with server, client:
            assert server.field("SMETHOD", "args") == "shared-secret=cli,ss-hash-iterations=10"
            with socks5_connect(client.cmethods["obfs2"], server.smethods["obfs2"]) as sock:
                assert echo_round_trip(sock, b"default secret") == b"default secret"


def test_shared_secret_in_a_socks4_userid(tmp_path):
    """pt-spec 3.5 over SOCKS4: the arguments are the USERID."""
    with EchoServer() as echo:
        server = ManagedPT(server_env(tmp_path, echo.address,
                                      SERVER_TRANSPORT_OPTIONS="obfs2:shared-secret=four"), FAST)
        client = ManagedPT(client_env(tmp_path), FAST)
        with server, client:
            host, port = server.smethods["obfs2"]
            with socket.create_connection(client.cmethods["obfs2"], timeout=30) as sock:
                # VN=04 CD=01 DSTPORT DSTIP USERID="shared-secret=four" 00
                sock.sendall(struct.pack("!BBH", 4, 1, port) + socket.inet_aton(host)
                             + b"shared-secret=four\0")
                assert recv_exact(sock, 8)[1] == 0x5A      # VN=00 CD=5A granted
                assert echo_round_trip(sock, b"socks4 args") == b"socks4 args"


def test_shared_secret_in_socks_arguments_longer_than_uname(tmp_path):
    """pt-spec 3.5: arguments spill from the SOCKS5 UNAME into PASSWD."""
    secret = "s" * 300
    with EchoServer() as echo:
        server = ManagedPT(server_env(tmp_path, echo.address,
                                      SERVER_TRANSPORT_OPTIONS="obfs2:shared-secret=" + secret), FAST)
        client = ManagedPT(client_env(tmp_path), FAST)
        with server, client:
            with socks5_connect(client.cmethods["obfs2"], server.smethods["obfs2"],
                                args="shared-secret=" + secret) as sock:
                assert echo_round_trip(sock, b"long secret") == b"long secret"


# --- The Extended ORPort, end to end --------------------------------------------------------

def ext_server_env(tmp_path, ext, cookie_file):
    # TOR_PT_ORPORT points nowhere: the Extended ORPort must be used instead.
    return server_env(tmp_path, ("127.0.0.1", 9), EXTENDED_SERVER_PORT="%s:%d" % ext.address,
                      AUTH_COOKIE_FILE=str(cookie_file))


def log_lines(tmp_path, role="server"):
    return (tmp_path / ("%s-state" % role) / "obfsproxy.log").read_text().splitlines()


def test_extended_orport_reports_the_real_client(tmp_path):
    cookie_file = tmp_path / "extended_orport_auth_cookie"
    cookie = write_cookie(cookie_file)
    payload = os.urandom(50_000)
    with ExtORPort(cookie) as ext:
        with ManagedPT(ext_server_env(tmp_path, ext, cookie_file)) as pt:
            with Obfs2Client(pt.smethods["obfs2"]) as client:
                assert same(client.echo(payload), payload)
                here = client.local_address
            session = ext.wait_session()
    assert session["client_hash_ok"] is True
    assert session["useraddr"] == "%s:%d" % here
    assert session["transport"] == "obfs2"
    assert session["done"] is True


def test_extended_orport_cookie_is_read_per_connection(tmp_path):
    """Tor rewrites the cookie when it restarts; the next connection uses the new one."""
    cookie_file = tmp_path / "cookie"
    write_cookie(cookie_file)
    new_cookie = os.urandom(32)
    with ExtORPort(new_cookie) as ext:
        with ManagedPT(ext_server_env(tmp_path, ext, cookie_file)) as pt:
            write_cookie(cookie_file, new_cookie)
            with Obfs2Client(pt.smethods["obfs2"]) as client:
                assert client.echo(b"fresh cookie") == b"fresh cookie"
            assert ext.wait_session()["client_hash_ok"] is True


def test_extended_orport_by_hand(tmp_path):
    """`server --dest=<Extended ORPort> --ext-cookie-file=PATH`, without Tor's environment."""
    cookie_file = tmp_path / "cookie"
    cookie = write_cookie(cookie_file)
    with ExtORPort(cookie) as ext:
        server = Program("server", "--transport=obfs2", "--dest=%s:%d" % ext.address,
                       "--ext-cookie-file=%s" % cookie_file, "127.0.0.1:0")
        with server:
            with Obfs2Client(server.address) as client:
                assert client.echo(b"by hand") == b"by hand"
                here = client.local_address
            session = ext.wait_session()
    assert session["client_hash_ok"] is True
    assert session["useraddr"] == "%s:%d" % here and session["transport"] == "obfs2"


@pytest.mark.parametrize("case", ["DENY", "wrong cookie"])
def test_extended_orport_refusal_closes_the_connection(tmp_path, case):
    """A bridge whose Tor refuses every client must say so at the default level
    (and in Tor's own log), and the client sees its tunnel fail: a reset."""
    cookie_file = tmp_path / "cookie"
    cookie = write_cookie(cookie_file)
    server_cookie = cookie if case == "DENY" else os.urandom(32)
    with ExtORPort(server_cookie, answer="DENY" if case == "DENY" else "OKAY") as ext:
        env = ext_server_env(tmp_path, ext, cookie_file)
        with ManagedPT(env) as pt:
            with Obfs2Client(pt.smethods["obfs2"]) as client:
                # The reset may come before our first byte leaves (the bridge asks
                # Tor as soon as the handshake is done): it fails the send, then.
                with pytest.raises(ConnectionResetError):
                    client.send(b"let me in")
                    client.recv_eof()
            session = ext.wait_session()
            pt.close_stdin()
            assert pt.wait() == 0
    if case == "DENY":
        assert session["client_hash_ok"] is True and session["done"] is True
        expected = "Extended ORPort denied the connection"
    else:   # we closed before sending our hash: Tor did not prove it knows the cookie
        assert session["client_hash_ok"] is None
        expected = "wrong server hash"
    said = [line for line in log_lines(tmp_path) if expected in line]
    assert len(said) == 1 and "[NOTICE]" in said[0], said
    told_tor = [line for line in pt.stdout.rest(1) if line.startswith("LOG ") and expected in line]
    assert told_tor and told_tor[0].startswith('LOG SEVERITY=notice MESSAGE="'), pt.stdout.lines


# --- State directory and logging --------------------------------------------------------------

@pytest.mark.parametrize("safe", [True, False])
def test_state_directory_is_created_and_holds_the_log(tmp_path, safe):
    state = tmp_path / "data" / "pt_state"
    with EchoServer() as echo:
        env = server_env(tmp_path, echo.address, STATE_LOCATION=str(state))
        args = ["--log-min-severity=debug"] + ([] if safe else ["--no-safe-logging"])
        with ManagedPT(env, *args) as pt:
            with Obfs2Client(pt.smethods["obfs2"]) as client:
                client.echo(b"x")
                here = "%s:%d" % client.local_address
            pt.close_stdin()
            assert pt.wait() == 0
    assert sorted(p.name for p in state.iterdir()) == ["obfsproxy.log"]
    text = (state / "obfsproxy.log").read_text()
    assert "managed mode stopped" in text
    assert (here in text) is (not safe)
    assert ("[scrubbed]" in text) is safe


# --- Lifecycle ------------------------------------------------------------------------------

def test_stdin_close_exits_when_asked(tmp_path):
    with ManagedPT(client_env(tmp_path, "obfs2,dummy")) as pt:
        pt.close_stdin()
        assert pt.wait(5) == 0
    for address in pt.cmethods.values():
        assert_refused(address, timeout=0)


@pytest.mark.parametrize("flag", [None, "0"])
@POSIX_SIGNALS
def test_stdin_close_means_nothing_without_the_flag(tmp_path, flag):
    with EchoServer() as echo:
        with ManagedPT(client_env(tmp_path, "dummy", EXIT_ON_STDIN_CLOSE=flag)) as pt:
            pt.close_stdin()
            # A full round trip after the EOF, then still running.
            with socks5_connect(pt.cmethods["dummy"], echo.address) as sock:
                assert echo_round_trip(sock, b"still here") == b"still here"
            with pytest.raises(subprocess.TimeoutExpired):
                pt.process.wait(0.5)
            pt.signal(signal.SIGTERM)
            assert pt.wait(5) == 0
        assert_refused(pt.cmethods["dummy"], timeout=0)


@POSIX_SIGNALS
def test_sigterm_exits_promptly_with_a_live_connection(tmp_path):
    with managed_echo_server(tmp_path) as pt:
        address = pt.smethods["obfs2"]
        with Obfs2Client(address) as client:
            assert client.echo(b"live") == b"live"
            pt.signal(signal.SIGTERM)
            assert pt.wait(5) == 0
            with pytest.raises(ConnectionResetError):   # cut, not a clean end of stream
                client.recv_eof()
        assert_refused(address, timeout=0)


@pytest.mark.parametrize("how", ["stdin", "sigterm"])
@POSIX_SIGNALS
def test_exits_after_tor_closed_our_stdout_and_a_failure_was_logged(tmp_path, how):
    """Tor went away: its end of our stdout is closed. A failure said at NOTICE
    is then forwarded to Tor, the write fails, and that failure is logged: the
    process must still answer its SOCKS client, and exit at the end of stdin
    or at SIGTERM, its ports released."""
    env = client_env(tmp_path, "obfs2")
    process = subprocess.Popen([*UNDER_TEST, "managed"], env=env, cwd=UNDER_TEST_CWD,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    try:
        address = None
        for line in iter(process.stdout.readline, b""):
            if line.startswith(b"CMETHOD obfs2 "):
                address = parse_address(line.split()[3].decode())
            if line == b"CMETHODS DONE\n":
                break
        assert address, "no CMETHOD obfs2 line"
        process.stdout.close()                  # Tor's end of our stdout is gone
        with reserved_port() as bridge:         # refuses: the tunnel fails, said to Tor
            with pytest.raises(SocksReplyError):
                socks5_connect(address, bridge.getsockname(), timeout=10)
        log = tmp_path / "client-state" / "obfsproxy.log"
        wait_until(lambda: "no more lines go to Tor" in log.read_text(), what="the broken pipe logged")
        if how == "stdin":
            process.stdin.close()
        else:
            process.send_signal(signal.SIGTERM)
        try:
            assert process.wait(5) == 0
        except subprocess.TimeoutExpired:
            pytest.fail("still running 5 s after %s; log: %s" % (how, log.read_text()[-2000:]))
        assert_refused(address, timeout=0)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        process.stdin.close()


@pytest.mark.parametrize("second_sigint", [False, True])
@POSIX_SIGNALS
def test_sigint_stops_accepting_and_lets_connections_finish(tmp_path, second_sigint):
    with managed_echo_server(tmp_path) as pt:
        address = pt.smethods["obfs2"]
        with Obfs2Client(address) as client:
            assert client.echo(b"before") == b"before"
            pt.signal(signal.SIGINT)
            assert_refused(address)
            assert client.echo(b"during") == b"during"
            assert pt.process.poll() is None
            if second_sigint:
                pt.signal(signal.SIGINT)
                assert pt.wait(5) == 0
        assert pt.wait(10) == 0


@POSIX_SIGNALS
def test_parent_death_is_noticed(tmp_path):
    """Tor dies without closing our stdin (SIGKILL): we exit on our own."""
    wrapper = "import subprocess, sys; subprocess.Popen(sys.argv[1:]).wait()"
    env = client_env(tmp_path, EXIT_ON_STDIN_CLOSE=None)
    command = [sys.executable, "-c", wrapper, sys.executable, PROGRAM, "managed"]
    with ManagedPT(env, command=command, stdin=subprocess.DEVNULL) as pt:
        address = pt.cmethods["obfs2"]
        pt.process.kill()           # the "Tor" between us and the transport
        pt.process.wait()
        # The transport held our stdout pipe: it ends when the transport exits.
        with pytest.raises(AssertionError, match="stream ended"):
            pt.stdout.wait_for(r"(?!)", timeout=10)
        assert_refused(address, timeout=0)


# --- obfs3 and obfs4 under Tor: several transports, obfs4's state, options and arguments ------

SEVERAL = "obfs2,obfs3,obfs4"
STATE_VECTORS = load_vectors("obfs4-server-state.json")
PINNED_STATE = json.loads(STATE_VECTORS["identity_from_options"]["obfs4_state.json"])
PINNED = ";".join("obfs4:%s=%s" % (key, PINNED_STATE[key])
                  for key in ("node-id", "private-key", "drbg-seed"))


def bridge_socks_args(pt, name):
    """What Tor sends our client for a Bridge line carrying ``name``'s SMETHOD ARGS:
    the k=v items joined with ";" (pt-spec 3.5), or None when there are none."""
    return ";".join("%s=%s" % item for item in sorted(pt.args(name).items())) or None


def test_obfs2_obfs3_obfs4_together_in_each_role(tmp_path):
    """One managed client and one managed server, each asked for obfs2, obfs3 and
    obfs4 at once: one CMETHOD / SMETHOD each, ARGS only for obfs4 (cert, iat-mode),
    and a tunnel through every one of them, all open at the same time."""
    payload = os.urandom(200_000)
    with EchoServer() as echo:
        server = ManagedPT(server_env(tmp_path, echo.address, SEVERAL))
        client = ManagedPT(client_env(tmp_path, SEVERAL))
        with server, client:
            assert client.keywords() == ["VERSION"] + ["CMETHOD"] * 3 + ["CMETHODS DONE"]
            assert server.keywords() == ["VERSION"] + ["SMETHOD"] * 3 + ["SMETHODS DONE"]
            assert server.args("obfs2") == server.args("obfs3") == {}
            line = [line for line in server.stdout.lines if line.startswith("SMETHOD obfs4 ")]
            assert len(line) == 1 and re.fullmatch(
                r"SMETHOD obfs4 127\.0\.0\.1:\d+ ARGS:cert=[A-Za-z0-9+/]{70},iat-mode=0", line[0]), line
            tunnels_through_all(client, server, payload)


def test_obfs4_state_lives_in_tor_pt_state_location(tmp_path):
    """obfs4_state.json and obfs4_bridgeline.txt in TOR_PT_STATE_LOCATION, in
    obfs4proxy's format and modes; the cert in SMETHOD ARGS is the bridge line's and
    decodes to the state's node-id and public key; a restart keeps the identity."""
    state = tmp_path / "server-state"
    with EchoServer() as echo:
        env = server_env(tmp_path, echo.address, "obfs4")
        with ManagedPT(env) as pt:
            args = pt.args("obfs4")
            pt.close_stdin()
            assert pt.wait() == 0
        raw, fields, (cert, iat_mode) = obfs4_state(state)
        assert (cert, iat_mode) == (args["cert"], args["iat-mode"]) == (cert, "0")
        assert list(fields) == ["node-id", "private-key", "public-key", "drbg-seed", "iat-mode"]
        assert b" " not in raw and not raw.endswith(b"\n") and fields["iat-mode"] == 0
        assert base64.b64decode(cert + "==").hex() == fields["node-id"] + fields["public-key"]
        assert [len(fields[k]) for k in ("node-id", "private-key", "drbg-seed")] == [40, 64, 48]
        assert (state.stat().st_mode & 0o777) == 0o700
        for name in (OBFS4_STATE, OBFS4_BRIDGE_LINE):
            assert ((state / name).stat().st_mode & 0o777) == 0o600, name

        with ManagedPT(env) as again:
            assert again.args("obfs4") == args
            assert obfs4_state(state)[0] == raw


@pytest.mark.parametrize("iat_mode", [None, "1", "2"])
def test_obfs4_identity_and_iat_mode_from_server_options(tmp_path, iat_mode):
    """TOR_PT_SERVER_TRANSPORT_OPTIONS obfs4:node-id/private-key/drbg-seed (and
    iat-mode): the SMETHOD ARGS and both files are byte for byte what obfs4proxy wrote
    for the same options (vectors: identity_from_options)."""
    vector = STATE_VECTORS["identity_from_options"]
    expected_args, expected_state = vector["smethod_args"], vector["obfs4_state.json"]
    expected_line = vector["obfs4_bridgeline.txt"]
    options = PINNED
    if iat_mode is not None:      # iat-mode changes only the iat-mode fields
        options += ";obfs4:iat-mode=" + iat_mode
        expected_args = expected_args.replace("iat-mode=0", "iat-mode=" + iat_mode)
        expected_state = expected_state.replace('"iat-mode":0', '"iat-mode":' + iat_mode)
        expected_line = expected_line.replace("iat-mode=0", "iat-mode=" + iat_mode)
    state = tmp_path / "server-state"
    with ManagedPT(server_env(tmp_path, ("127.0.0.1", 9), "obfs4",
                              SERVER_TRANSPORT_OPTIONS=options)) as pt:
        assert pt.field("SMETHOD", "args") == expected_args
    assert (state / OBFS4_STATE).read_text() == expected_state
    assert (state / OBFS4_BRIDGE_LINE).read_text() == expected_line


OPTION_ERRORS = {case["options"]: case for case in STATE_VECTORS["option_errors"]}


@pytest.mark.parametrize("options", list(OPTION_ERRORS))
def test_obfs4_option_errors_are_worded_like_obfs4proxy(tmp_path, options):
    """Bad obfs4 server options: the same stdout as obfs4proxy's, line for line
    (vectors: option_errors). One difference, on purpose: obfs4proxy ignores an
    unknown option; we refuse it, naming it and the options obfs4 takes (an operator's
    typo, "iat_mode=1", must not leave a bridge running with defaults it did not
    choose). A missing part of the identity writes no file; a bad iat-mode after a
    fresh identity writes only the state file, as obfs4proxy does."""
    case = OPTION_ERRORS[options]
    state = tmp_path / "server-state"
    options = options.replace("<40 hex>", "11" * 20)
    with ManagedPT(server_env(tmp_path, ("127.0.0.1", 9), "obfs4",
                              SERVER_TRANSPORT_OPTIONS=options)) as pt:
        if isinstance(case["stdout"], list):
            assert pt.stdout.lines == case["stdout"]
            assert pt.wait() == 1     # every transport failed: exit non-zero, like obfs4proxy
        else:   # obfs4proxy: "normal SMETHOD line; unknown server options are ignored"
            assert pt.stdout.lines[:3] == [
                "VERSION 1", "SMETHOD-ERROR obfs4 unknown obfs4 argument(s): foo (an obfs4 server "
                "takes node-id, private-key, drbg-seed, iat-mode)", "SMETHODS DONE"]
    files = sorted(path.name for path in state.iterdir() if path.name.startswith("obfs4_"))
    expected_files = {"obfs4:node-id": [], "obfs4:iat-mode=3": [OBFS4_STATE]}
    for prefix, names in expected_files.items():
        if options.startswith(prefix):
            assert files == names, files


OBFS4_SPLITS = ["uname only", "uname and passwd", "longer than uname", "socks4 userid"]


@pytest.mark.parametrize("split", OBFS4_SPLITS)
def test_obfs4_socks_arguments_however_tor_sends_them(tmp_path, split):
    """The cert reaches our managed obfs4 client whichever way the SOCKS request
    carries it: all in UNAME (PASSWD a lone NUL), cut anywhere between UNAME and
    PASSWD, longer than UNAME (a long value makes it spill, as a long Bridge line
    does), or as a SOCKS4 USERID."""
    payload = os.urandom(100_000)
    with EchoServer() as echo:
        server = ManagedPT(server_env(tmp_path, echo.address, "obfs4"))
        client = ManagedPT(client_env(tmp_path, "obfs4"))
        with server, client:
            args = bridge_socks_args(server, "obfs4")
            socks, bridge = client.cmethods["obfs4"], server.smethods["obfs4"]
            if split == "uname only":
                sock, code = socks5_connect_split(socks, bridge, args, "\0")
            elif split == "uname and passwd":
                sock, code = socks5_connect_split(socks, bridge, args[:40], args[40:])
            elif split == "longer than uname":
                long_args = args + ";iat-mode=" + "0" * 250   # as Go's Atoi, zeros lead a number
                assert len(long_args) > 255
                sock, code = socks5_connect_split(socks, bridge, long_args[:255], long_args[255:])
            else:
                sock = socket.create_connection(socks, timeout=30)
                # VN=04 CD=01 DSTPORT DSTIP USERID NUL
                sock.sendall(struct.pack("!BBH", 4, 1, bridge[1]) + socket.inet_aton(bridge[0])
                             + args.encode() + b"\0")
                code = 0 if recv_exact(sock, 8)[1] == 0x5A else 1
            assert code == 0
            with sock:
                assert same(echo_round_trip(sock, payload), payload)


# --- Interop with obfs4proxy (Debian's, Go), both managed ------------------------------------

def obfs4proxy_env(tmp_path, role, **variables):
    return tor_env(tmp_path / ("obfs4proxy-%s" % role), EXIT_ON_STDIN_CLOSE="1", **variables)


@pytest.mark.interop
def test_our_managed_client_with_obfs4proxy_managed_server(tmp_path):
    obfs4proxy = require_obfs4proxy()
    payload = os.urandom(1 << 20)
    with EchoServer() as echo:
        env = obfs4proxy_env(tmp_path, "server", SERVER_TRANSPORTS="obfs2",
                             SERVER_BINDADDR="obfs2-127.0.0.1:0", ORPORT="%s:%d" % echo.address)
        with ManagedPT(env, command=[obfs4proxy]) as theirs, ManagedPT(client_env(tmp_path)) as ours:
            with socks5_connect(ours.cmethods["obfs2"], theirs.smethods["obfs2"]) as sock:
                assert same(echo_round_trip(sock, payload), payload)
            theirs.close_stdin()
            assert theirs.wait() == 0


@pytest.mark.interop
def test_obfs4proxy_managed_client_with_our_managed_server(tmp_path):
    obfs4proxy = require_obfs4proxy()
    payload = os.urandom(1 << 20)
    with EchoServer() as echo:
        env = obfs4proxy_env(tmp_path, "client", CLIENT_TRANSPORTS="obfs2")
        with ManagedPT(server_env(tmp_path, echo.address)) as ours, \
                ManagedPT(env, command=[obfs4proxy]) as theirs:
            with socks5_connect(theirs.cmethods["obfs2"], ours.smethods["obfs2"]) as sock:
                assert same(echo_round_trip(sock, payload), payload)
            ours.close_stdin()
            assert ours.wait() == 0


def tunnels_through_all(client, server, payload):
    """A tunnel through each of obfs2, obfs3 and obfs4 at once, from ``client``'s
    CMETHODs to ``server``'s SMETHODs, obfs4 with the server's ARGS as a Bridge line
    would give them; each echo checked by SHA-256."""
    names = SEVERAL.split(",")
    assert list(client.cmethods) == list(server.smethods) == names
    socks = {name: socks5_connect(client.cmethods[name], server.smethods[name],
                                  args=bridge_socks_args(server, name)) for name in names}
    try:
        for name, sock in socks.items():
            assert same(echo_round_trip(sock, payload), payload), name
    finally:
        for sock in socks.values():
            sock.close()


@pytest.mark.interop
def test_our_managed_client_with_obfs4proxy_managed_server_for_obfs3_and_obfs4(tmp_path):
    obfs4proxy = require_obfs4proxy()
    with EchoServer() as echo:
        env = obfs4proxy_env(tmp_path, "server", SERVER_TRANSPORTS=SEVERAL,
                             SERVER_BINDADDR=",".join("%s-127.0.0.1:0" % name
                                                      for name in SEVERAL.split(",")),
                             ORPORT="%s:%d" % echo.address)
        with ManagedPT(env, command=[obfs4proxy]) as theirs, \
                ManagedPT(client_env(tmp_path, SEVERAL)) as ours:
            assert sorted(theirs.args("obfs4")) == ["cert", "iat-mode"]
            tunnels_through_all(ours, theirs, os.urandom(1 << 20))
            theirs.close_stdin()
            assert theirs.wait() == 0


@pytest.mark.interop
def test_obfs4proxy_managed_client_with_our_managed_server_for_obfs3_and_obfs4(tmp_path):
    obfs4proxy = require_obfs4proxy()
    with EchoServer() as echo:
        env = obfs4proxy_env(tmp_path, "client", CLIENT_TRANSPORTS=SEVERAL)
        with ManagedPT(server_env(tmp_path, echo.address, SEVERAL)) as ours, \
                ManagedPT(env, command=[obfs4proxy]) as theirs:
            tunnels_through_all(theirs, ours, os.urandom(1 << 20))
            ours.close_stdin()
            assert ours.wait() == 0
