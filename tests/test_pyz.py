"""The tool as one file (issue 24): tools/make_pyz.py builds obfsproxy.pyz, which runs with
``python3 -I -S`` (no site-packages, no PYTHON* variables) from a folder outside the
checkout, every command and every transport.

Here: what goes into the archive (and what never does), that the build is reproducible
and refuses a docopt it cannot licence, and the archive run as a user runs it: --help,
the demo of every transport, unmask and detect on a recording, a client and a server
carrying data, managed mode answering Tor. The interop with obfs4proxy and webtunnel
through nginx run the same archive through $OBFSPROXY_UNDER_TEST (support.Program):
.ci/run does that with tests/test_interop.py and tests/test_webtunnel_live.py.
"""

import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fake_tor import ManagedPT, client_env
from peers import Background, Destination, hashing_echo, read_hashing, send_and_shut
from support import ROOT, Program, bootstrap, fmt, socks5_connect

import obfs2
import transports
from teaching import demo_webtunnel

MAKE_PYZ = ROOT / "tools" / "make_pyz.py"
BARE = [sys.executable, "-I", "-S"]        # no site-packages, no PYTHON* variables


@pytest.fixture(scope="module")
def pyz(tmp_path_factory):
    """obfsproxy.pyz built from this checkout into a folder of its own."""
    out = tmp_path_factory.mktemp("pyz") / "obfsproxy.pyz"
    done = subprocess.run([sys.executable, str(MAKE_PYZ), str(out)], capture_output=True, text=True,
                          cwd=str(out.parent), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("%s: " % out), done.stdout
    return out


@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory):
    """A working folder outside the checkout: nothing of ours to import from there."""
    return tmp_path_factory.mktemp("elsewhere")


def run_pyz(pyz, elsewhere, *args, timeout=120):
    return subprocess.run([*BARE, str(pyz), *args], cwd=str(elsewhere), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


# --- The archive --------------------------------------------------------------------

def test_the_archive_holds_the_tool_docopt_and_their_licences_and_nothing_else(pyz):
    names = set(zipfile.ZipFile(str(pyz)).namelist())
    ours = {path.name for path in ROOT.glob("*.py")}
    teaching = {path.relative_to(ROOT).as_posix() for path in ROOT.glob("teaching/**/*.py")}
    crypto = {path.relative_to(ROOT).as_posix() for path in ROOT.glob("cryptoroutes/**/*.py")}
    assert crypto and ours | teaching | crypto <= names
    assert {"__main__.py", "LICENSE", "docopt/__init__.py"} <= names
    assert [name for name in names if name.startswith("LICENSES/docopt")], names
    assert {name[:-1] for name in names if name.endswith(".pyc")} == {n for n in names if n.endswith(".py")}
    stray = [name for name in names if name.split("/")[0] in ("tests", "bench", "tools", "docs", ".venv")
             or "__pycache__" in name]
    assert stray == []
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")


def test_the_build_is_reproducible(pyz, tmp_path):
    again = tmp_path / "again.pyz"
    subprocess.run([sys.executable, str(MAKE_PYZ), str(again)], check=True, capture_output=True, timeout=120)
    assert again.read_bytes() == pyz.read_bytes()


def test_the_build_refuses_a_python_without_docopt(tmp_path):
    """Without docopt the archive could not parse a command line: no archive, one line."""
    hide = ("import runpy, sys; sys.modules['docopt'] = None; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    out = tmp_path / "x.pyz"
    done = subprocess.run([sys.executable, "-c", hide, str(MAKE_PYZ), str(out)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and not out.exists(), done
    line, = done.stderr.splitlines()
    assert line.startswith("make_pyz.py: this Python (") and "has no docopt: install docopt-ng" in line, line


# --- The archive run bare, from elsewhere -----------------------------------------------

@pytest.mark.parametrize("args", [["--help"], ["--version"], ["client", "--help"]], ids=" ".join)
def test_help_and_version_are_the_checkouts(pyz, elsewhere, args):
    expected = subprocess.run([sys.executable, str(ROOT / "obfsproxy.py"), *args], capture_output=True,
                              text=True, timeout=60)
    done = run_pyz(pyz, elsewhere, *args)
    assert (done.returncode, done.stdout, done.stderr) == (0, expected.stdout, ""), done


@pytest.mark.parametrize("transport", list(transports.TRANSPORTS))
def test_the_demo_of_every_transport(pyz, elsewhere, transport):
    done = run_pyz(pyz, elsewhere, "demo", "--transport=" + transport)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    last = [line for line in done.stdout.splitlines() if line.strip()][-1]
    assert last.startswith("OK: "), last


def test_the_demo_draws_its_page_bare(pyz, elsewhere):
    """demo --html from the archive on a bare Python: one page, every drawing, nothing
    loaded from anywhere (no script, no link, no font; the page forbids them)."""
    done = run_pyz(pyz, elsewhere, "demo", "--transport=obfs4", "--html=obfs4.html")
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.stdout[-2000:], done.stderr[-2000:])
    assert done.stdout.rstrip().splitlines()[-1].startswith("Pictures: obfs4.html (")
    page = (elsewhere / "obfs4.html").read_text(encoding="utf-8")
    for kind in ("handshake", "sizes", "first-bytes", "test", "padding"):
        assert 'data-figure="%s"' % kind in page
    assert "default-src 'none'" in page and not re.search(r"<(script|link|img|iframe)\b", page)


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A --record-dir recording of one obfs2 connection, made in memory."""
    folder = tmp_path_factory.mktemp("recording")
    client = transports.RecordDir(folder).wrap(obfs2.Obfs2(True))
    server = obfs2.Obfs2(False)
    assert server.receive(client.start()) == b""
    assert client.receive(server.start() + server.data_to_send()) == b""
    assert server.receive(client.send(b"GET / HTTP/1.1\r\n\r\n")) == b"GET / HTTP/1.1\r\n\r\n"
    return folder


@pytest.mark.parametrize("command,says", [("unmask", "1 of 1 connection(s) unmasked."), ("detect", "obfs2")])
def test_unmask_and_detect_read_a_recording(pyz, elsewhere, recording, command, says):
    done = run_pyz(pyz, elsewhere, command, str(recording))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert says in done.stdout, done.stdout


@pytest.mark.parametrize("transport", ["obfs4", "obfs3", "obfs2"])
def test_a_client_and_a_server_carry_data(pyz, elsewhere, tmp_path, transport):
    """Both ends from the archive, the data checked by SHA-256 both ways."""
    payload = os.urandom(1 << 20)

    def start(*args):
        return Program(*args, interpreter=BARE, script=str(pyz), cwd=elsewhere)

    state = ["--state-dir=%s" % tmp_path] if transport == "obfs4" else []
    with Destination(hashing_echo) as dest, \
            start("server", "--transport=" + transport, "--dest=" + fmt(dest.address), "127.0.0.1:0",
                  *state) as server:
        args = None
        if transport == "obfs4":
            cert = server.log.wait_for(r"bridge line for clients: .* cert=(\S+) iat-mode=0").group(1)
            args = "cert=%s;iat-mode=0" % cert
        with start("client", "--transport=" + transport, "127.0.0.1:0") as client:
            with socks5_connect(client.address, server.address, timeout=30, args=args) as sock:
                sock.settimeout(60)
                sender = Background(send_and_shut, sock, payload)
                got = read_hashing(sock)
                sender.join()
        assert dest.result() == got == (len(payload), hashlib.sha256(payload).hexdigest())


def test_managed_mode_answers_tor(pyz, tmp_path):
    """Tor's environment in, CMETHOD lines out; stdin closed, it exits 0."""
    pt = ManagedPT(client_env(tmp_path, transports="obfs4,webtunnel"), command=[*BARE, str(pyz), "managed"])
    try:
        assert set(pt.cmethods) == {"obfs4", "webtunnel"}
        pt.close_stdin()
        assert pt.wait() == 0
    finally:
        pt.finish()


@pytest.mark.slow
@pytest.mark.interop
def test_the_readmes_torrc_line_bootstraps_a_real_tor(pyz):
    """The README's torrc line for the archive (python3 -I -S obfsproxy.pyz managed) on
    both sides of a real Tor client and bridge on loopback (tests/tor-loopback.sh): the
    client fetches the bridge's descriptor through obfs4, the bridge's side through the
    Extended ORPort."""
    plugin = "%s -I -S %s managed" % (sys.executable, pyz)
    status, output, seconds = bootstrap(plugin, plugin, "obfs4")
    match = re.search(r"^tor bootstrap through obfs4: client got the bridge descriptor \((.*)\)",
                      output, re.M)
    assert status == 0 and match, "exit status %d:\n%s" % (status, output)
    assert "ExtORPort auth ok" in match.group(1), match.group(1)
    print("\ntor bootstrap through the .pyz in %.1f s" % seconds)


def test_the_archive_needs_no_checkout(pyz, tmp_path):
    """Copied alone (a new name, a folder of its own) it still runs: nothing is read
    from beside it."""
    alone = tmp_path / "copied" / "tool.pyz"
    alone.parent.mkdir()
    alone.write_bytes(pyz.read_bytes())
    done = run_pyz(alone, alone.parent, "--version")
    assert done.returncode == 0 and done.stdout.startswith("obfsproxy.py "), done
    assert Path(ROOT).resolve() not in Path(alone).resolve().parents


# --- What the webtunnel demo does without a package ------------------------------------

def test_the_demos_ed25519_signs_as_rfc_8032_says():
    """RFC 8032 7.1, TEST 2 (one-byte message): the public key and the signature."""
    key = demo_webtunnel.Ed25519Key(bytes.fromhex(
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb"))
    assert key.public.hex() == "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c"
    assert key.sign(bytes.fromhex("72")).hex() == (
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da"
        "085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00")


@pytest.mark.parametrize("key_length", [16, 32])
def test_the_demos_gcm_opens_what_pycryptodome_seals(key_length):
    """gcm_open (the AES-CTR route and a plain-Python GHASH) against pycryptodome's
    AES-GCM, which the demo uses where it is installed: the same plaintext, and None
    for any flipped bit of the record or its header."""
    cipher = demo_webtunnel._CIPHER
    if cipher is None:
        pytest.skip("pycryptodome is not installed: nothing to compare with")
    key, nonce, header = os.urandom(key_length), os.urandom(12), bytes.fromhex("1703030123")
    for size in (0, 1, 15, 16, 17, 1000):
        plaintext = os.urandom(size)
        sealer = cipher.AES.new(key, cipher.AES.MODE_GCM, nonce=nonce)
        sealer.update(header)
        body = b"".join(sealer.encrypt_and_digest(plaintext))
        assert demo_webtunnel.gcm_open(key, nonce, header, body) == plaintext
        flipped = bytearray(body)
        flipped[size // 2] ^= 1
        assert demo_webtunnel.gcm_open(key, nonce, header, bytes(flipped)) is None
        assert demo_webtunnel.gcm_open(key, nonce, b"\x18" + header[1:], body) is None
