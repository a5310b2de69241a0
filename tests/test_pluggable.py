"""A new transport is one module plus one registry line: proven with a toy.

``TOY`` below is a transport written from the contract at the top of
transports.py alone, as a new author would write it: its ``client_config``
raises a plain ValueError for an absent argument (no optional ``.missing``),
and its SOCKS client still starts with no options. The test copies the
project's modules into a temporary folder, adds ``toy.py`` there and exactly
two lines to the copy of transports.py (its import, and its line in
``TRANSPORTS``), and then runs the
copy as a user and Tor would: ``--help`` lists it; ``server`` serves it (with
its option, announced in the bridge line); ``client`` speaks it over SOCKS
with arguments and as a fixed forward from a pasted bridge line; ``managed``
offers it in both roles (SMETHOD ARGS from its ``server_config``); ``demo``
walks through it with the generic walk; and the import rules still hold.
"""

import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fake_tor import ManagedPT, client_env, server_env
from support import ROOT, EchoServer, Program, SocksReplyError, fmt, recv_all, socks5_connect

TOY = '''"""toy: a transport for the tests, written from transports.py's contract alone.

Each side sends MAGIC, then every byte XOR ``key`` (an argument, 1..255). The
server announces its key in the bridge line. Not obfuscation worth the name.
"""

CLIENT_MAGIC, SERVER_MAGIC = b"TOY>", b"TOY<"


class ProtocolError(Exception):
    pass


class Config:
    def __init__(self, key):
        self.key = key


def parse(options):
    unknown = sorted(set(options) - {"key"})
    if unknown:
        raise ValueError("unknown toy argument(s): %s (toy takes key)" % ", ".join(unknown))
    text = options.get("key")
    if text is None:
        raise ValueError("no key= given")
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 255:
        raise ValueError("key must be 1..255")
    return Config(int(text))


class Toy:
    name = "toy"
    ProtocolError = ProtocolError
    expensive = False

    @classmethod
    def client_config(cls, options):
        return parse(options)

    @classmethod
    def server_config(cls, options, state_dir):
        config = parse(options)
        return config, {"key": str(config.key)}

    def __init__(self, initiator, config, prepared=None):
        self.initiator, self.key = initiator, config.key
        self.is_open = False
        self._magic = bytearray()

    def start(self):
        return CLIENT_MAGIC if self.initiator else SERVER_MAGIC

    def receive(self, data):
        if not self.is_open:
            want = SERVER_MAGIC if self.initiator else CLIENT_MAGIC
            take = len(want) - len(self._magic)
            self._magic += data[:take]
            if not want.startswith(bytes(self._magic)):
                raise ProtocolError("not toy")
            if len(self._magic) < len(want):
                return b""
            self.is_open, data = True, data[take:]
        return bytes(b ^ self.key for b in data)

    def data_to_send(self):
        return b""

    def send(self, data):
        return bytes(b ^ self.key for b in data)
'''

WAIT = 30


@pytest.fixture(scope="module")
def copy(tmp_path_factory):
    """The project's modules, toy.py, and transports.py with two more lines."""
    folder = tmp_path_factory.mktemp("with-toy")
    for path in ROOT.glob("*.py"):
        shutil.copy(path, folder)
    for package in ("cryptoroutes", "teaching"):
        shutil.copytree(ROOT / package, folder / package, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "toy.py").write_text(TOY, encoding="utf-8")
    registry = folder / "transports.py"
    text = registry.read_text(encoding="utf-8")
    import_line, registry_line = "import obfs4\n", "TRANSPORTS = {\n"
    assert text.count(import_line) == 1 and text.count(registry_line) == 1
    text = text.replace(import_line, import_line + "import toy\n")
    text = text.replace(registry_line, registry_line + '    "toy": toy.Toy,\n')
    registry.write_text(text, encoding="utf-8")
    return folder


def program(copy, *args):
    return Program(*args, interpreter=[sys.executable], script=str(copy / "obfsproxy.py"))


def run(copy, *args):
    return subprocess.run([sys.executable, str(copy / "obfsproxy.py"), *args], cwd=str(copy),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)


def round_trip(sock, payload):
    threading.Thread(target=lambda: (sock.sendall(payload), sock.shutdown(1)), daemon=True).start()
    return recv_all(sock)


def test_the_copy_differs_from_the_project_by_one_module_and_two_lines(copy):
    ours = (ROOT / "transports.py").read_text(encoding="utf-8").splitlines()
    theirs = (copy / "transports.py").read_text(encoding="utf-8").splitlines()
    assert sorted(set(theirs) - set(ours)) == ['    "toy": toy.Toy,', "import toy"]
    assert {p.name for p in copy.glob("*.py")} - {p.name for p in ROOT.glob("*.py")} == {"toy.py"}


def test_help_lists_it(copy):
    helped = run(copy, "--help")
    assert helped.returncode == 0 and "toy," in helped.stdout.splitlines()[0], helped.stdout[:200]


def test_server_and_socks_client_with_arguments(copy):
    with EchoServer() as echo, \
            program(copy, "server", "--transport=toy", "--transport-options=key=7",
                    "--dest=" + fmt(echo.address), "127.0.0.1:0") as server, \
            program(copy, "client", "--transport=toy", "127.0.0.1:0") as client:
        line = server.log.wait_for(r"bridge line for clients: (.*)").group(1)
        assert line == "Bridge toy %s key=7" % fmt(server.address), line
        with socks5_connect(client.address, server.address, args="key=7", timeout=WAIT) as sock:
            assert round_trip(sock, b"through the toy" * 1000) == b"through the toy" * 1000
        with pytest.raises(SocksReplyError):      # a wrong key: the SOCKS client is refused
            socks5_connect(client.address, server.address, args="key=300", timeout=WAIT)
        client.log.wait_for(r"bad toy arguments for \[scrubbed\]: key must be 1\.\.255")


@pytest.mark.parametrize("args, refusal", [
    (["--transport-options=key=300"], "toy client: key must be 1..255"),       # a bad default
    (["--transport-options=colour=1"], "toy client: unknown toy argument(s): colour"),
    (["--dest=127.0.0.1:1"], "toy client: no key= given"),        # a fixed client has only these
])
def test_client_options_are_checked_at_start_up_when_there_are_some(copy, args, refusal):
    """The contract's start-up rule, for a transport that never heard of .missing:
    a SOCKS client given no options starts (test above); given some, or fixed to
    one bridge, it is refused at once with the transport's words."""
    refused = run(copy, "client", "--transport=toy", *args, "127.0.0.1:0")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("obfsproxy.py client: " + refusal), refused.stderr


def test_a_pasted_bridge_line_gives_a_fixed_forward(copy):
    with EchoServer() as echo, \
            program(copy, "server", "--transport=toy", "--transport-options=key=9",
                    "--dest=" + fmt(echo.address), "127.0.0.1:0") as server:
        line = server.log.wait_for(r"bridge line for clients: (.*)").group(1)
        with program(copy, "client", "--bridge=" + line, "127.0.0.1:0") as client:
            with socket.create_connection(client.address, timeout=WAIT) as sock:
                assert round_trip(sock, b"forwarded") == b"forwarded"


def test_managed_mode_offers_it_in_both_roles(copy, tmp_path):
    command = [sys.executable, str(copy / "obfsproxy.py"), "managed"]
    with EchoServer() as echo:
        env = server_env(tmp_path, echo.address, transports="toy",
                         SERVER_TRANSPORT_OPTIONS="toy:key=5")
        with ManagedPT(env, command=command) as server:
            assert server.args("toy") == {"key": "5"}
            with ManagedPT(client_env(tmp_path, transports="toy"), command=command) as client:
                with socks5_connect(client.cmethods["toy"], server.smethods["toy"], args="key=5",
                                    timeout=WAIT) as sock:
                    assert round_trip(sock, b"managed") == b"managed"
        missing = server_env(tmp_path, echo.address, transports="toy")
        with ManagedPT(missing, command=command) as failed:
            assert [k for k in failed.keywords() if k.startswith("SMETHOD")] == ["SMETHOD-ERROR",
                                                                                 "SMETHODS DONE"]


def test_demo_walks_through_it(copy):
    shown = run(copy, "demo", "--transport=toy", "--transport-options=key=3")
    assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr
    assert "What the client put on the wire" in shown.stdout
    assert "OK: the message crossed the tunnel" in shown.stdout


def test_the_import_rules_still_hold(copy):
    checked = subprocess.run([sys.executable, str(ROOT / "tools" / "check_imports.py"), str(copy)],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stderr
    assert "toy -> (nothing of ours)" in checked.stdout and "transports -> " in checked.stdout


def test_the_toy_is_really_registered_only_in_the_copy():
    assert "toy" not in (ROOT / "transports.py").read_text(encoding="utf-8")
    assert not Path(ROOT / "toy.py").exists()
