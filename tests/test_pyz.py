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

import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from fake_tor import ManagedPT, client_env
from peers import (
    Background,
    Destination,
    Obfs4proxy,
    digest,
    duplex,
    hashing_echo,
    pinned_options,
    read_hashing,
    send_and_shut,
)
from support import ROOT, Program, bootstrap, fmt, require_obfs4proxy, socks5_connect

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
    assert {"docs/PROTOCOL.md", "README.md"} <= names      # the guide command shows them
    stray = [name for name in names if name.split("/")[0] in ("tests", "bench", "tools", ".venv")
             or name.startswith("docs/") and name != "docs/PROTOCOL.md" or "__pycache__" in name]
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
    # advice that works where PEP 668 refuses a bare pip install (Debian 12): a venv, or apt
    assert "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt" in line, line
    assert "apt-get install python3-docopt" in line and "python3 -m pip install" not in line, line


def test_classic_docopt_makes_a_file_for_python_3_6_with_its_debian_licence(any_python_pyz):
    """--docopt with Debian's python3-docopt: docopt.py inside, its package's copyright
    file as its licence, and a floor of 3.6."""
    pyz, floor = any_python_pyz
    if not CLASSIC_DOCOPT.is_file():
        pytest.skip("no %s (apt-get install python3-docopt)" % CLASSIC_DOCOPT)
    names = zipfile.ZipFile(str(pyz)).namelist()
    assert floor == 6 and "docopt.py" in names and "docopt/__init__.py" not in names
    licence, = [name for name in names if name.startswith("LICENSES/python3-docopt-")]
    assert licence.endswith("-copyright.txt")
    assert b"Permission is hereby granted" in zipfile.ZipFile(str(pyz)).read(licence)


# --- The archive run bare, from elsewhere -----------------------------------------------

@pytest.mark.parametrize("args", [["--help"], ["--version"], ["client", "--help"]], ids=" ".join)
def test_help_and_version_are_the_checkouts(pyz, elsewhere, args):
    """The same text, except the program's name: the file names itself as it was started."""
    expected = subprocess.run([sys.executable, "obfsproxy.py", *args], capture_output=True,
                              text=True, timeout=60, cwd=str(ROOT))
    done = run_pyz(pyz, elsewhere, *args)
    said = done.stdout.replace("python3 -I -S %s" % pyz, "python3 obfsproxy.py")
    assert (done.returncode, said, done.stderr) == (0, expected.stdout, ""), done


def test_the_file_names_itself_as_it_was_started(pyz, elsewhere):
    """``python3 -I -S obfsproxy.pyz`` and ``./obfsproxy.pyz`` in the help and in the
    commands the demo prints; never a file the user does not have."""
    copy = elsewhere / "obfsproxy.pyz"
    copy.write_bytes(pyz.read_bytes())
    copy.chmod(0o755)
    bare = subprocess.run([*BARE, "obfsproxy.pyz", "demo", "--transport=obfs2"], cwd=str(elsewhere),
                          capture_output=True, text=True, timeout=120)
    assert "Try `python3 -I -S obfsproxy.pyz demo --transport=obfs2 --shared-secret=SECRET`" in bare.stdout
    assert "More: the guide, `python3 -I -S obfsproxy.pyz guide`." in bare.stdout
    assert "obfsproxy.py " not in bare.stdout.replace("obfsproxy.py demo:", "")
    direct = subprocess.run(["./obfsproxy.pyz", "client", "--help"], cwd=str(elsewhere),
                            capture_output=True, text=True, timeout=60)
    assert "\n  ./obfsproxy.pyz client [options] --bridge=LINE <listen>\n" in direct.stdout, direct


def test_the_guide_travels_inside(pyz, elsewhere, tmp_path):
    """No checkout: the file prints the protocol guide and writes the README."""
    shown = run_pyz(pyz, elsewhere, "guide")
    guide = (ROOT / "docs" / "PROTOCOL.md").read_text(encoding="utf-8")
    assert shown.returncode == 0 and shown.stdout == guide
    done = run_pyz(pyz, elsewhere, "guide", "--readme", "--write=%s" % (tmp_path / "README.md"))
    assert done.returncode == 0 and (tmp_path / "README.md").read_bytes() == (ROOT / "README.md").read_bytes()


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


# --- Every Python from 3.6 on: the demos and obfs4 against obfs4proxy ------------------------

# Classic docopt 0.6.2 (Debian's python3-docopt) runs on 3.6; docopt-ng 0.8 and newer need 3.7.
CLASSIC_DOCOPT = Path("/usr/lib/python3/dist-packages/docopt.py")


def pyenv_root():
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    if shutil.which("pyenv"):
        said = subprocess.run(["pyenv", "root"], capture_output=True, text=True, timeout=30)
        root = said.stdout.strip() or root
    return root


def pyenv_pythons(root):
    """{minor: the newest ``root``/versions/3.<minor>.*/bin/python3} for 3.6..3.13."""
    found = {}
    for minor in range(6, 14):
        paths = glob.glob(os.path.join(root, "versions", "3.%d.*" % minor, "bin", "python3"))
        paths = [path for path in paths if re.search(r"/3\.%d\.\d+/bin" % minor, path)]
        if paths:
            found[minor] = max(paths, key=lambda path: int(re.search(r"3\.\d+\.(\d+)", path).group(1)))
    return found


PYENV_ROOT = pyenv_root()
PYTHONS = pyenv_pythons(PYENV_ROOT)
PYTHON_2 = sorted(glob.glob(os.path.join(PYENV_ROOT, "versions", "2.7.*", "bin", "python2.7")))
# The oldest and the newest in the default group; the ones between are slow (.ci/run runs them all).
MATRIX = [pytest.param(minor, id="3.%d" % minor, marks=() if minor in (6, 13) else pytest.mark.slow)
          for minor in range(6, 14)]


@pytest.fixture(scope="module")
def any_python_pyz(tmp_path_factory):
    """The file built for every Python from 3.6 on (classic docopt inside), or, where that
    docopt is missing, the usual build (3.7 and newer); with bytecode for each of them."""
    out = tmp_path_factory.mktemp("pyz36") / "obfsproxy.pyz"
    extra = ["--docopt=%s" % CLASSIC_DOCOPT] if CLASSIC_DOCOPT.is_file() else []
    extra += ["--bytecode-for=%s" % python for python in PYTHONS.values()]
    done = subprocess.run([sys.executable, str(MAKE_PYZ), *extra, str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    floor = int(re.search(r"runs on Python 3\.(\d+) or newer", done.stdout).group(1))
    return out, floor


def python_for(minor, floor):
    python = PYTHONS.get(minor)
    if python is None:
        pytest.skip("Python 3.%d is not under $(pyenv root)/versions on this machine" % minor)
    if minor < floor:
        pytest.skip("no classic docopt (%s) to build a file for Python 3.%d with" % (CLASSIC_DOCOPT, minor))
    return python


@pytest.mark.interop
@pytest.mark.parametrize("minor", MATRIX)
def test_the_file_on_python_3_x(any_python_pyz, elsewhere, tmp_path, minor):
    """The file run bare by Python 3.<minor>: the demo of every transport, then an obfs4
    tunnel against obfs4proxy both ways (our client to its server, its client to our
    server), 256 KiB each way checked by SHA-256."""
    pyz, floor = any_python_pyz
    bare = [python_for(minor, floor), "-I", "-S"]
    require_obfs4proxy()
    for transport in transports.TRANSPORTS:
        done = subprocess.run([*bare, str(pyz), "demo", "--transport=" + transport], cwd=str(elsewhere),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        last = ([line for line in done.stdout.splitlines() if line.strip()] or [""])[-1]
        assert done.returncode == 0 and last.startswith("OK: "), (transport, done.stdout[-1500:], done.stderr)
        assert done.stderr == "", (transport, done.stderr)
    up, down = os.urandom(256 * 1024), os.urandom(256 * 1024)

    def ours(*args):
        return Program(*args, interpreter=bare, script=str(pyz), cwd=elsewhere)

    # obfs4proxy closes both directions at the first EOF: both sides send while they read
    with Destination(duplex(down, expect=len(up), half_close=False)) as dest:
        theirs = Obfs4proxy("server", tmp_path, orport=dest.address, transport="obfs4",
                            options=pinned_options(0))
        try:
            with ours("client", "--transport=obfs4", "127.0.0.1:0") as client:
                carry(client.address, theirs.address, "cert=%s;iat-mode=0" % theirs.cert, up, down, dest)
        finally:
            theirs.stop()
        with ours("server", "--transport=obfs4", "--state-dir=%s" % (tmp_path / "ours"),
                  "--dest=" + fmt(dest.address), "127.0.0.1:0") as server:
            cert = server.log.wait_for(r"bridge line for clients: .* cert=(\S+) iat-mode=0").group(1)
            theirs = Obfs4proxy("client", tmp_path, transport="obfs4")
            try:
                carry(theirs.address, server.address, "cert=%s;iat-mode=0" % cert, up, down, dest)
            finally:
                theirs.stop()
    version = subprocess.run([bare[0], "--version"], capture_output=True, text=True, timeout=30)
    print("\nthe file ran on %s" % (version.stdout or version.stderr).strip())


@pytest.mark.parametrize("minor", [6, 13])
def test_another_python_imports_the_bytecode_built_for_it(any_python_pyz, elsewhere, minor):
    """--bytecode-for: that Python imports the modules from bytecode/<its tag>/ (what
    ``-v`` says of obfs4), and compiles none of them."""
    pyz, floor = any_python_pyz
    python = python_for(minor, floor)
    if Path(python).resolve() == Path(sys.executable).resolve():
        pytest.skip("the Python that builds uses the archive's own .pyc files")
    done = subprocess.run([python, "-v", "-I", "-S", str(pyz), "--version"], cwd=str(elsewhere),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"^import 'obfs4' # <__main__\.use_bytecode_for_this_python\.<locals>\.Loader ",
                     done.stderr, re.M), done.stderr[-3000:]
    zipped = set(re.findall(r"^import (\S+) # loaded from Zip", done.stderr, re.M))
    assert zipped <= {"__main__"}, zipped            # runpy runs __main__.py itself


def carry(socks, server, args, up, down, dest):
    """``up`` to the destination while ``down`` comes back, both checked by SHA-256."""
    with socks5_connect(socks, server, timeout=30, args=args) as sock:
        sock.settimeout(60)
        sender = Background(sock.sendall, up)
        got = read_hashing(sock, len(down))
        sender.join(timeout=60)
    assert dest.result() == (len(up), digest(up)), "the destination got other bytes"
    assert got == (len(down), digest(down)), "the application got other bytes"


def test_python_2_says_which_python_it_needs(pyz, any_python_pyz, elsewhere):
    """Python 2.7 (and any Python older than the file's floor): one line, before any import."""
    if not PYTHON_2:
        pytest.skip("no Python 2.7 under $(pyenv root)/versions on this machine")
    for archive in (any_python_pyz[0], pyz):
        for args in (["--help"], ["demo"]):
            done = subprocess.run([PYTHON_2[-1], str(archive), *args], cwd=str(elsewhere),
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 1 and done.stdout == "", done
            assert re.fullmatch(r"obfsproxy\.pyz needs Python 3\.\d or newer( \(its [^)]*\))?; this is "
                                r"Python 2\.7\.\d+ \(\S+\)\n", done.stderr), done.stderr
    done = subprocess.run([PYTHON_2[-1], str(ROOT / "obfsproxy.py"), "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.startswith("obfsproxy.py needs Python 3.6 or newer; this is "
                                                           "Python 2.7."), done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_a_python_below_the_files_floor_says_so(pyz, elsewhere):
    """A file carrying docopt-ng 0.9 (3.7 and newer) on Python 3.6: the one line, naming why."""
    python = PYTHONS.get(6)
    if python is None:
        pytest.skip("Python 3.6 is not under $(pyenv root)/versions on this machine")
    floor = zipfile.ZipFile(str(pyz)).read("__main__.py").decode()
    if "(3, 6)" in floor:
        pytest.skip("this build's docopt runs on 3.6")
    done = subprocess.run([python, "-I", "-S", str(pyz), "--version"], cwd=str(elsewhere),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and re.fullmatch(
        r"obfsproxy\.pyz needs Python 3\.7 or newer \(its docopt-ng-[\d.]+ does\); this is Python "
        r"3\.6\.\d+ \(\S+\)\n", done.stderr), done.stderr


def test_the_readme_gives_the_files_size(pyz):
    """The size the README states (about N MB) is the size of the file this checkout builds."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = float(re.search(r"about (\d+\.\d) MB in all", text).group(1))
    assert abs(pyz.stat().st_size / 1e6 - stated) <= 0.1, (pyz.stat().st_size, stated)
