"""End to end: the real program as client and server subprocesses.

application --SOCKS--> our client ==transport==> our server --plain--> destination

Every test uses ephemeral ports on loopback and waits on real events (a log
line, a byte, an EOF), never on sleeps. Data is checked by SHA-256 in both
directions: what came back to the application, and what the destination
reported it received.

The command line (issue 14): a bad argument is one line on stderr naming the
option (and the path), exit status 2, before anything listens; --help is for
users; printing commands end quietly, like any Unix tool, when the reader of
their pipe goes away (``| head``).
"""

import functools
import hashlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import support
from fake_tor import ExtORPort, ManagedPT, client_env, write_cookie
from peers import (
    Background,
    Destination,
    digest,
    duplex,
    hashing_echo,
    read_hashing,
    send_and_shut,
)
from support import (
    PROGRAM,
    ROOT,
    EchoServer,
    Program,
    SocksReplyError,
    copy_runtime,
    fmt,
    has_ipv6_loopback,
    recv_all,
    recv_exact,
    reserved_port,
    socks5_connect,
    socks5_request,
    tunnel,
)

import obfs2
import obfs4_state
import obfsproxy
import transports
from proxy import program_name

KiB, MiB = 1024, 1024 * 1024
needs_sigpipe = pytest.mark.skipif(not hasattr(signal, "SIGPIPE"), reason="POSIX SIGPIPE")
IO_TIMEOUT = 20  # per socket operation: a hang fails the test instead of the run
SECRET = "correct horse battery staple"
FAST_SS = "--ss-hash-iterations=10"


@functools.lru_cache(maxsize=None)
def payload(size):
    return os.urandom(size)


def connect(client, target):
    return socks5_connect(client.address, target, timeout=IO_TIMEOUT)


@pytest.fixture
def procs():
    """Proxies started by a test, stopped at its end whatever happens."""
    started = []
    yield started
    for proxy in started:
        proxy.stop()


def start_tunnel(procs, transport, dest, *extra, family="127.0.0.1"):
    server, client = tunnel(transport, *extra, dest=dest, family=family)
    procs += [server, client]
    return server, client


# --- Round trips: transports x payload sizes -----------------------------------

@pytest.fixture(scope="module")
def echo():
    with Destination(hashing_echo) as dest:
        yield dest


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("secret") / "secret.txt"
    path.write_text(SECRET + "\n", encoding="utf-8")
    return path


CONFIGS = {
    "dummy": ("dummy",),
    "obfs2": ("obfs2",),
    "obfs2-shared-secret": ("obfs2", "--shared-secret=" + SECRET, FAST_SS),
    "obfs2-shared-secret-file": ("obfs2", "--shared-secret-file={file}", FAST_SS),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def config_tunnel(request, echo, secret_file):
    transport, *extra = CONFIGS[request.param]
    extra = [arg.format(file=secret_file) for arg in extra]
    server, client = tunnel(transport, *extra, dest=echo.address)
    with server, client:
        yield server, client


@pytest.mark.parametrize("size", [0, 1, 64 * KiB, 64 * MiB], ids=["0B", "1B", "64KiB", "64MiB"])
def test_round_trip(config_tunnel, echo, size):
    server, client = config_tunnel
    data = payload(size)
    echo.drain()
    with connect(client, server.address) as sock:
        sender = Background(send_and_shut, sock, data)
        back = read_hashing(sock)
        sender.join()
    assert echo.result() == (size, digest(data)), "the destination got other bytes"
    assert back == (size, digest(data)), "the application got other bytes back"


def test_secret_file_gives_the_same_secret_as_the_option(echo, secret_file, procs):
    """The file's first line, without its newline, is the secret."""
    server = Program("server", "--transport=obfs2", "--dest=" + fmt(echo.address), "127.0.0.1:0",
                   "--shared-secret-file=%s" % secret_file, FAST_SS)
    client = Program("client", "--transport=obfs2", "127.0.0.1:0", "--shared-secret=" + SECRET, FAST_SS)
    procs += [server, client]
    with connect(client, server.address) as sock:
        send_and_shut(sock, b"same secret")
        assert recv_all(sock) == b"same secret"


# --- Stream semantics ---------------------------------------------------------------

@pytest.mark.parametrize("transport", ["dummy", "obfs2"])
def test_full_duplex_both_directions_at_full_speed(transport, procs):
    """The application and the destination each send 16 MiB while reading
    16 MiB, and each half-closes only after it has read the other's whole
    stream. A relay that serves one direction at a time, or blocks on one
    direction while the other waits, deadlocks here (and times out)."""
    up, down = os.urandom(16 * MiB), os.urandom(16 * MiB)
    with Destination(duplex(down, expect=len(up))) as dest:
        server, client = start_tunnel(procs, transport, dest.address)
        with connect(client, server.address) as sock:
            sender = Background(sock.sendall, up)
            got = read_hashing(sock, len(down))
            sender.join()
            assert dest.result() == (len(up), digest(up)), "the destination got other bytes"
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(1) == b"", "the destination's EOF should follow its stream"
        assert got == (len(down), digest(down)), "the application got other bytes"


def reply_after_eof(body):
    """Read the request to EOF, then reply with its SHA-256 and ``body``."""
    def behaviour(conn, report):
        request = recv_all(conn)
        report(len(request))
        conn.sendall(digest(request).encode() + body)
    return behaviour


@pytest.mark.parametrize("transport", ["dummy", "obfs2"])
def test_half_close_reply_after_request_eof(transport, procs):
    request, body = os.urandom(100 * KiB), os.urandom(1 * MiB)
    with Destination(reply_after_eof(body)) as dest:
        server, client = start_tunnel(procs, transport, dest.address)
        with connect(client, server.address) as sock:
            sock.sendall(request)
            sock.shutdown(socket.SHUT_WR)
            reply = recv_all(sock)
        assert dest.result() == len(request)
    assert reply == digest(request).encode() + body


def banner_then_echo(banner):
    def behaviour(conn, report):
        conn.sendall(banner)
        hashing_echo(conn, report)
    return behaviour


@pytest.mark.parametrize("transport", ["dummy", "obfs2"])
def test_destination_that_speaks_first(transport, procs):
    """Like SSH or SMTP: the destination's banner must reach an application
    that has sent nothing yet."""
    banner = b"SSH-2.0-banner-from-the-destination\r\n"
    with Destination(banner_then_echo(banner)) as dest:
        server, client = start_tunnel(procs, transport, dest.address)
        with connect(client, server.address) as sock:
            assert recv_exact(sock, len(banner)) == banner
            send_and_shut(sock, b"hello")
            assert recv_all(sock) == b"hello"


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback (::1) here")
@pytest.mark.parametrize("transport", ["dummy", "obfs2"])
def test_ipv6_end_to_end(transport, procs):
    data = os.urandom(1 * MiB)
    with Destination(hashing_echo, host="::1") as dest:
        server, client = start_tunnel(procs, transport, dest.address, family="::1")
        assert server.address[0] == "::1" and client.address[0] == "::1"
        with connect(client, server.address) as sock:   # SOCKS5 ATYP=04 (IPv6)
            sender = Background(send_and_shut, sock, data)
            back = read_hashing(sock)
            sender.join()
        assert dest.result() == (len(data), digest(data))
    assert back == (len(data), digest(data))


def test_fixed_forward_client_without_socks(echo, procs):
    """`client --dest=SERVER`: every connection goes to that server, no SOCKS."""
    server = Program("server", "--transport=obfs2", "--dest=" + fmt(echo.address), "127.0.0.1:0")
    procs.append(server)
    client = Program("client", "--transport=obfs2", "--dest=" + fmt(server.address), "127.0.0.1:0")
    procs.append(client)
    data = os.urandom(1 * MiB)
    echo.drain()
    with socket.create_connection(client.address, timeout=IO_TIMEOUT) as sock:
        sender = Background(send_and_shut, sock, data)
        back = read_hashing(sock)
        sender.join()
    assert echo.result() == (len(data), digest(data))
    assert back == (len(data), digest(data))


# --- SOCKS dialects -----------------------------------------------------------------

@pytest.fixture(scope="module")
def obfs2_tunnel(echo):
    server, client = tunnel("obfs2", dest=echo.address)
    with server, client:
        yield server, client


def socks4_request(host, port, userid=b""):
    """VN=04 CD=01 DSTPORT DSTIP USERID 00, and for SOCKS4a a host name:
    DSTIP=0.0.0.1 (0.0.0.x, x != 0) then HOST 00."""
    try:
        ip, tail = socket.inet_aton(host), b""
    except OSError:
        ip, tail = b"\0\0\0\1", host.encode() + b"\0"
    return struct.pack("!BBH4s", 4, 1, port, ip) + userid + b"\0" + tail


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"], ids=["socks4", "socks4a"])
def test_socks4_and_socks4a(obfs2_tunnel, echo, host):
    server, client = obfs2_tunnel
    data = os.urandom(64 * KiB)
    with socket.create_connection(client.address, timeout=IO_TIMEOUT) as sock:
        sock.sendall(socks4_request(host, server.address[1]))
        reply = recv_exact(sock, 8)                  # VN=00 CD=5A DSTPORT DSTIP
        assert reply[:2] == b"\x00\x5a", "SOCKS4 request rejected: %r" % reply
        sender = Background(send_and_shut, sock, data)
        back = read_hashing(sock)
        sender.join()
    assert back == (len(data), digest(data))


def test_socks5_domain_name(obfs2_tunnel):
    server, client = obfs2_tunnel
    with connect(client, ("localhost", server.address[1])) as sock:  # ATYP=03
        send_and_shut(sock, b"by name")
        assert recv_all(sock) == b"by name"


def test_socks5_pipelined_greeting_request_and_data(obfs2_tunnel):
    """Greeting, request and the first data in one send, as some clients do."""
    server, client = obfs2_tunnel
    data = os.urandom(10 * KiB)
    with socket.create_connection(client.address, timeout=IO_TIMEOUT) as sock:
        sock.sendall(b"\x05\x01\x00" + socks5_request(server.address) + data)
        assert recv_exact(sock, 2) == b"\x05\x00"        # VER=05 METHOD=00
        reply = recv_exact(sock, 4)                      # VER REP RSV ATYP
        assert reply[:2] == b"\x05\x00", "SOCKS5 reply %r" % reply
        recv_exact(sock, {1: 4, 4: 16}[reply[3]] + 2)    # BND.ADDR BND.PORT
        assert recv_exact(sock, len(data)) == data
        sock.shutdown(socket.SHUT_WR)
        assert recv_all(sock) == b""


# --- Failures reach the application as the right SOCKS reply -------------------------

def socks_failure(client, target):
    """The SOCKS5 reply code and the seconds it took."""
    start = time.monotonic()
    with pytest.raises(SocksReplyError) as failure:
        connect(client, target).close()
    return failure.value.code, time.monotonic() - start


def test_server_refused_gives_connection_refused(obfs2_tunnel):
    _, client = obfs2_tunnel
    with reserved_port() as nobody:
        code, _ = socks_failure(client, nobody.getsockname())
    assert code == 0x05


def test_silent_server_gives_ttl_expired_after_the_handshake_timeout(procs):
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepted by the kernel, never answered
        client = Program("client", "--transport=obfs2", "127.0.0.1:0", "--handshake-timeout=1")
        procs.append(client)
        code, seconds = socks_failure(client, silent.getsockname())
    assert code == 0x06
    # Not before the deadline; and this deadline, not the 30 s default nor
    # IO_TIMEOUT (the upper bound is loose: a busy machine may be late).
    assert 0.9 <= seconds < 10, "the handshake timeout fired after %.2f s" % seconds


HTTP_RESPONSE = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
                 b"Content-Length: 0\r\nConnection: close\r\n\r\n")


def speak_http(conn, report):
    conn.sendall(HTTP_RESPONSE)
    recv_all(conn)


def test_server_that_is_not_obfs2_gives_general_failure(procs):
    """A web server answers instead of obfs2: the magic check fails at once,
    not at the (60 s) handshake timeout, which would answer TTL expired (06)."""
    with Destination(speak_http) as web:
        client = Program("client", "--transport=obfs2", "127.0.0.1:0", "--handshake-timeout=60")
        procs.append(client)
        code, seconds = socks_failure(client, web.address)
    assert code == 0x01
    assert seconds < 30


@pytest.mark.parametrize("client_secret", ["--shared-secret=not the same", None],
                         ids=["different-secret", "no-secret"])
def test_mismatched_shared_secret_gives_general_failure(echo, procs, client_secret):
    server = Program("server", "--transport=obfs2", "--dest=" + fmt(echo.address), "127.0.0.1:0",
                   "--shared-secret=" + SECRET, FAST_SS)
    procs.append(server)
    client = Program("client", "--transport=obfs2", "127.0.0.1:0", FAST_SS,
                   *([client_secret] if client_secret else []))
    procs.append(client)
    code, _ = socks_failure(client, server.address)
    assert code == 0x01


def test_destination_refused_resets_the_tunnel(procs):
    """The server finishes the obfs2 handshake, then cannot reach --dest: the
    client has already answered SOCKS success (it opens on the server's
    handshake), so the failure reaches the application as a reset, never as a
    clean end of stream; the server says at the default level which hop failed."""
    with reserved_port() as nobody:
        server, client = start_tunnel(procs, "obfs2", nobody.getsockname())
        with connect(client, server.address) as sock:
            with pytest.raises(ConnectionResetError):
                sock.recv(1)
        server.log.wait_for(r"cannot reach --dest 127\.0\.0\.1:%d: connection refused"
                            % nobody.getsockname()[1], timeout=IO_TIMEOUT)


# --- Command line -----------------------------------------------------------------

def run_cli(*args, timeout=30):
    """Run the program to its end; a serving mode that should have refused to
    start fails the test by timing out instead."""
    return subprocess.run([sys.executable, PROGRAM, *args], cwd=str(ROOT),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


# (arguments, words the one error line must contain, words it must not contain)
BAD_ARGUMENTS = {
    "unknown-transport": (["client", "--transport=rot13", "127.0.0.1:0"], ["rot13"], []),
    "address-without-port": (["client", "127.0.0.1"], ["127.0.0.1"], []),
    "port-out-of-range": (["client", "127.0.0.1:70000"], ["70000"], []),
    "bad-dest": (["server", "--dest=localhost", "127.0.0.1:0"], ["localhost"], []),
    "server-without-dest": (["server", "127.0.0.1:0"], ["--dest"], []),
    "both-secrets": (["client", "--shared-secret=a", "--shared-secret-file={file}", "127.0.0.1:0"],
                     ["--shared-secret"], []),
    # An outgoing proxy the client could never use is refused before it listens.
    "proxy-ftp": (["client", "--proxy=ftp://127.0.0.1:21", "127.0.0.1:0"], ["--proxy", "ftp"], []),
    "proxy-without-port": (["client", "--proxy=socks5://127.0.0.1", "127.0.0.1:0"],
                           ["--proxy", "port"], []),
    "proxy-socks4a-user-not-utf8": (["client", os.fsdecode(b"--proxy=socks4a://\xff@127.0.0.1:1080"),
                                     "127.0.0.1:0"], ["--proxy", "UTF-8"], []),
    "proxy-http-password-not-utf8": (["client", os.fsdecode(b"--proxy=http://u:\xd5@127.0.0.1:8080"),
                                      "127.0.0.1:0"], ["--proxy", "UTF-8"], []),
    "proxy-http-password-percent-not-utf8": (["client", "--proxy=http://u:%ff@127.0.0.1:8080",
                                              "127.0.0.1:0"], ["--proxy", "UTF-8"], []),
    # A file that cannot be used: the option and the path, and why.
    "secret-file-missing": (["client", "--shared-secret-file=/nonexistent", "127.0.0.1:0"],
                            ["--shared-secret-file", "/nonexistent", "No such file"], []),
    "log-file-unwritable": (["client", "--log-file=/sys/x.log", "127.0.0.1:0"],
                            ["--log-file", "/sys/x.log"], []),
    "record-dir-impossible": (["client", "--record-dir=/proc/x", "127.0.0.1:0"],
                              ["--record-dir", "/proc/x"], []),
    # A bad number names its option, and only it.
    "timeout-not-a-number": (["client", "--handshake-timeout=abc", "127.0.0.1:0"],
                             ["--handshake-timeout", "abc"], ["could not convert"]),
    "max-connections-zero": (["client", "--max-connections=0", "127.0.0.1:0"],
                             ["--max-connections"], ["--handshake-timeout", "--ss-hash-iterations"]),
    # An option of another mode is refused, not ignored.
    "client-ext-cookie-file": (["client", "--ext-cookie-file=/tmp/cookie", "127.0.0.1:0"],
                               ["--ext-cookie-file", "server"], []),
    "server-proxy": (["server", "--proxy=socks5://127.0.0.1:1080", "--dest=127.0.0.1:1",
                      "127.0.0.1:0"], ["--proxy", "client"], []),
    "server-full": (["server", "--full", "--dest=127.0.0.1:1", "127.0.0.1:0"], ["--full", "unmask"], []),
    # issue 20 (shared/findings/newcomer-3.md): what a newcomer got wrong, and was not told.
    # D3: a transport that keeps no state ignored --state-dir (and obfs2 was the default).
    "obfs2-state-dir": (["server", "--transport=obfs2", "--state-dir=x", "--dest=127.0.0.1:1", "127.0.0.1:0"],
                        ["--state-dir", "obfs2", "obfs4"], []),
    # D11: an obfs4 line edited to obfs3 kept its arguments, silently ignored.
    "obfs3-bridge-with-arguments": (["client", "--bridge=obfs3 127.0.0.1:1 cert=AAAA iat-mode=0",
                                     "127.0.0.1:0"], ["obfs3", "no arguments", "cert, iat-mode"], []),
    # D12: unmask and detect read obfs2 whatever --transport said.
    "unmask-transport": (["unmask", "--transport=obfs4", "x"], ["--transport", "unmask"], []),
    "detect-transport": (["detect", "--transport=obfs4", "x"], ["--transport", "detect"], []),
    # D15: the server's logged line pasted with its placeholders, or a made-up fingerprint.
    "bridge-ip-placeholder": (["client", "--bridge=Bridge obfs4 <IP ADDRESS>:443 <FINGERPRINT> cert=AAAA "
                               "iat-mode=0", "127.0.0.1:0"], ["replace the placeholder <IP ADDRESS>"], []),
    "bridge-fingerprint-placeholder": (["client", "--bridge=Bridge obfs4 127.0.0.1:443 <FINGERPRINT> "
                                        "cert=AAAA iat-mode=0", "127.0.0.1:0"],
                                       ["<FINGERPRINT> is a placeholder", "40-hex", "leave it out"], []),
    "bridge-not-a-fingerprint": (["client", "--bridge=obfs4 127.0.0.1:443 ABCDEFG cert=AAAA iat-mode=0",
                                  "127.0.0.1:0"], ["word 3", "40-hex fingerprint", "KEY=VALUE"],
                                 ["ABCDEFG"]),   # where, never what: it may be a secret
    # D8 and F5: a bridge line without cert= or iat-mode= names what to add (never node-id).
    "bridge-without-cert": (["client", "--bridge=obfs4 127.0.0.1:1 iat-mode=0", "127.0.0.1:0"],
                            ["no cert= given"], ["node-id"]),
    "bridge-without-iat-mode": (["client", "--bridge=obfs4 127.0.0.1:1 cert=" + "A" * 70, "127.0.0.1:0"],
                                ["no iat-mode= given", "add iat-mode=0"], ["missing argument"]),
    # F10: with --bridge the address to listen on is required (the usage line says so).
    "bridge-without-listen": (["client", "--bridge=obfs4 127.0.0.1:1 cert=%s iat-mode=0" % ("A" * 70)],
                              ["give the address to listen on"], []),
    "log-severity-unknown": (["client", "--log-min-severity=loud", "127.0.0.1:0"],
                             ["--log-min-severity", "warning"], []),
}
# Only a command line docopt cannot parse points to --help; a bad value or file does not.
POINTS_TO_HELP = {"server-without-dest", "bridge-without-listen"}


@pytest.mark.parametrize("case", list(BAD_ARGUMENTS))
def test_bad_arguments_exit_2_with_a_one_line_error(case, secret_file):
    args, mentions, absent = BAD_ARGUMENTS[case]
    result = run_cli(*[arg.format(file=secret_file) for arg in args])
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "listening on" not in result.stderr, "it started serving"
    # One line says what is wrong and names it. A usage dump is not an error message.
    assert len(lines) == 1, "expected a one-line error, got:\n" + result.stderr
    line = lines[0]
    assert line.startswith("obfsproxy.py"), line
    for word in mentions:
        assert word in line, "%r not in %r" % (word, line)
    for word in absent:
        assert word not in line, "%r in %r" % (word, line)
    assert ("--help" in line) == (case in POINTS_TO_HELP), line


def test_help_and_version_exit_0():
    helped = run_cli("--help")
    assert helped.returncode == 0 and "Usage:" in helped.stdout and "client" in helped.stdout
    version = run_cli("--version")
    assert version.returncode == 0
    assert re.fullmatch(r"obfsproxy\.py \d+\.\d+\.\d+", version.stdout.strip()), version.stdout


def test_help_is_for_users():
    """The usage line a server needs, examples a user can paste (python3, as
    on Debian and macOS, where `python` may be missing or Python 2), and no
    internals at the end (the module's notes for developers: ``Program._run``,
    reStructuredText double backticks)."""
    text = run_cli("--help").stdout
    assert "obfsproxy.py server [options] --dest=HOST:PORT <listen>" in text, text
    commands = [line.strip() for line in text.split("Examples:", 1)[1].splitlines()
                if "obfsproxy.py " in line and not line.strip().startswith("curl")]
    assert commands and all(line.startswith("python3 obfsproxy.py ") for line in commands), commands
    for internal in ("``", "Program._run", "handle_socks_client", "upstream"):
        assert internal not in text, (internal, text[-600:])


# --- Printing commands end quietly when their reader goes away ------------------

@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    """A --record-dir recording of one obfs2 connection with 512 KiB each way,
    made in memory: what `unmask --full` prints of it is megabytes."""
    folder = tmp_path_factory.mktemp("recording")
    client = transports.RecordDir(folder).wrap(obfs2.Obfs2(True))
    server = obfs2.Obfs2(False)
    to_server, to_client = client.start(), server.start()
    assert server.receive(to_server) == b""
    assert client.receive(to_client + server.data_to_send()) == b""
    assert client.is_open and server.is_open
    for i in range(8):
        block = bytes([i]) * 65536
        assert server.receive(client.send(block)) == block
        assert client.receive(server.send(block)) == block
    return folder


def into_closed_pipe(*args, buffered=True):
    """Run with stdout a pipe whose reader has already gone: the program's
    first write meets EPIPE, every time. ``buffered``: stdout as Python makes
    it for a pipe (the first write may then be the last flush, at exit), not
    unbuffered as PYTHONUNBUFFERED=1 in the environment would make it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, PROGRAM, *args], cwd=str(ROOT), stdin=subprocess.DEVNULL,
                              stdout=write, stderr=subprocess.PIPE, timeout=60, env=env)
    finally:
        os.close(write)


def head(lines, *args):
    """`obfsproxy.py ARGS | head -LINES`: read that many lines, close the pipe
    while the program may still be writing, and wait. (status, stderr)."""
    process = subprocess.Popen([sys.executable, PROGRAM, *args], cwd=str(ROOT),
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(lines):
            assert process.stdout.readline(), "the output ended before %d lines" % lines
        process.stdout.close()
        stderr = process.stderr.read()
        return process.wait(60), stderr.decode("utf-8", "replace")
    finally:
        process.kill()
        process.wait()


@needs_sigpipe
@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("args", [["--help"], ["--version"], ["unmask", "--full", "{recording}"],
                                  ["detect", "{recording}"], ["demo"], ["demo", "--transport=obfs2"]],
                         ids=["help", "version", "unmask", "detect", "demo", "demo-obfs2"])
def test_printing_into_a_closed_pipe_ends_quietly(args, recording, buffered):
    """Like any Unix tool: killed by SIGPIPE, nothing on stderr. demo too (D5:
    `demo | head -1` ended in a BrokenPipeError traceback; demo prints while it
    serves, and serving modes ignore SIGPIPE; with its whole output still in
    the buffer, it even ended with status 0, its output lost)."""
    result = into_closed_pipe(*[arg.format(recording=recording) for arg in args], buffered=buffered)
    assert result.stderr == b"", result.stderr.decode("utf-8", "replace")
    assert result.returncode == -signal.SIGPIPE, result.returncode


@needs_sigpipe
def test_help_piped_into_head_ends_quietly():
    """`--help | head -1`, many times: the help may or may not be written
    whole before the reader leaves; either way no BrokenPipeError traceback."""
    for _ in range(20):
        status, stderr = head(1, "--help")
        assert stderr == "", stderr
        assert status in (0, -signal.SIGPIPE), status


@needs_sigpipe
def test_unmask_piped_into_head_ends_quietly(recording):
    """`unmask --full CAPTURE | head -2`: megabytes to print, so the reader
    always leaves mid-write. Not "Broken pipe" on stderr, not status 1."""
    for _ in range(3):
        status, stderr = head(2, "unmask", "--full", str(recording))
        assert stderr == "", stderr
        assert status == -signal.SIGPIPE, status


# --- Safe logging ------------------------------------------------------------------

CONN_LINE = re.compile(r"\bconn \d+\b")


def wait_for_all(log, *patterns):
    """Wait until every pattern has matched a log line, in any order."""
    def missing():
        return [p for p in patterns if not any(re.search(p, line) for line in log.lines)]
    while missing():
        log.wait_for("|".join("(?:%s)" % p for p in missing()), timeout=IO_TIMEOUT)


@pytest.mark.parametrize("safe", [True, False], ids=["safe-logging", "no-safe-logging"])
def test_connection_log_lines_scrub_addresses(echo, procs, safe):
    extra = ["--log-min-severity=debug"] + ([] if safe else ["--no-safe-logging"])
    server = Program("server", "--transport=obfs2", "--dest=" + fmt(echo.address), "127.0.0.1:0", *extra)
    procs.append(server)
    client = Program("client", "--transport=obfs2", "127.0.0.1:0", *extra)
    procs.append(client)
    with connect(client, server.address) as sock:
        send_and_shut(sock, b"log me")
        assert recv_all(sock) == b"log me"
    with reserved_port() as nobody:                 # and one failure, logged too
        assert socks_failure(client, nobody.getsockname())[0] == 0x05
    wait_for_all(server.log, r"conn 1\b.*closed")
    wait_for_all(client.log, r"conn 1\b.*closed", r"conn 2\b.*cannot reach the obfs2 bridge")
    for proxy in (server, client):
        lines = [line for line in proxy.log.lines if CONN_LINE.search(line)]
        assert len(lines) >= 2, proxy.log.lines
        if safe:
            for line in lines:
                assert "[scrubbed]" in line and "127.0.0.1" not in line, line
        else:
            assert any("127.0.0.1:" in line for line in lines), lines
            assert not any("[scrubbed]" in line for line in lines), lines


# --- What a new user and a bridge operator meet, following the README (issue 20) ----------
#
# Each test names the item of the findings (shared/findings/newcomer-3.md) it keeps fixed:
# D1..D17 are the defects, F1..F16 the frictions.

README = ROOT / "README.md"


def readme_section(title):
    """The text of the README section whose heading is ``title`` (up to the next heading)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(r"^#+ %s\n(.*?)(?=^#+ |\Z)" % re.escape(title), text, re.M | re.S)
    assert match, "no section %r in the README" % title
    return match.group(1)


@pytest.fixture(scope="module")
def bridge(tmp_path_factory, echo):
    """An obfs4 server (the default transport) in front of the echo service, and
    the bridge line it logged."""
    state = tmp_path_factory.mktemp("bridge-state")
    server = Program("server", "--state-dir=%s" % state, "--dest=" + fmt(echo.address), "127.0.0.1:0",
                     "--log-min-severity=info")
    with server:
        line = server.log.wait_for(r"bridge line for clients: (Bridge obfs4 .*)$").group(1)
        yield server, line, re.search(r"cert=(\S+)", line).group(1)


def echo_through(client, data, bridge=None, args=None):
    """``data`` through the client at ``client``, and what came back: with SOCKS
    to ``bridge`` (``args``: the SOCKS arguments), or without (--bridge, --dest)."""
    if bridge is None:
        sock = socket.create_connection(client, timeout=IO_TIMEOUT)
    else:
        sock = socks5_connect(client, bridge, timeout=IO_TIMEOUT, args=args)
    with sock:
        send_and_shut(sock, data)
        return recv_all(sock)


def without_dependencies(*args, env=None):
    """Run the program under this Python without its site-packages (``-S``) or
    the environment's PYTHON* variables (``-I``): as Debian's python3 runs it
    before the README's setup."""
    return subprocess.run([sys.executable, "-I", "-S", PROGRAM, *args], cwd=str(ROOT),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, env=env)


def test_the_readme_starts_with_two_commands_that_run_as_root_without_sudo():
    """F1, F2: the first command began with `sudo`, which a container or a Debian
    installed with a root password does not have (`sudo: command not found`, and
    nothing else ran); and the warning that Debian's tor starts a system Tor
    came after the command that installs it. (Issue 20 ran both commands on a
    fresh Debian 12, as root and as a user with sudo; this keeps their shape.)"""
    text = README.read_text(encoding="utf-8")
    before, block = re.search(r"\A(.*?)^```\n(.*?)^```", text, re.M | re.S).groups()
    commands = block.splitlines()
    assert len(commands) == 2, commands
    for command in commands:
        assert command.startswith("SUDO=$(command -v sudo); "), command
        assert not re.search(r"(^|[;&|]\s*)sudo\b", command), command
    assert "apt-get install -y obfs4proxy tor " in commands[1]
    assert "starts a system Tor service that connects to the Tor" in " ".join(before.split())


def test_a_missing_dependency_says_how_to_set_up():
    """D10, issue 24: one line on stderr, exit 1, nothing on stdout, naming the three
    ways to run (each with its command) and the README section that has them."""
    done = without_dependencies("client", "127.0.0.1:0")
    assert done.returncode == 1 and done.stdout == "", done
    line, = done.stderr.splitlines()
    assert line.startswith("obfsproxy.py: missing dependency (No module named "), line
    for way in ("python3 -m venv .venv && .venv/bin/pip install -r requirements.txt",
                "apt-get install python3-pycryptodome python3-docopt",
                "python3 tools/make_pyz.py", "python3 -I -S obfsproxy.pyz"):
        assert way in line, (way, line)
    heading = re.search(r"see the README's '([^']+)'", line).group(1)
    text = README.read_text(encoding="utf-8")     # a heading, or a paragraph's bold label
    assert re.search(r"^#+ %s$|\*\*%s:\*\*" % (re.escape(heading), re.escape(heading)), text, re.M), heading


# Runs the program with docopt hidden (as if not installed), pycryptodome still there.
WITHOUT_DOCOPT = ("import runpy, sys; sys.modules['docopt'] = None; sys.argv[0] = sys.argv[1]; "
                  "del sys.argv[1]; runpy.run_path(sys.argv[0], run_name='__main__')")


def without_docopt(program, *args):
    return subprocess.run([sys.executable, "-c", WITHOUT_DOCOPT, str(program), *args],
                          cwd=str(Path(program).parent), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=30)


HELP_REQUESTS = [["--help"], ["-h"], ["--version"], ["client", "127.0.0.1:0", "--version"]] + \
    [[command, "--help"] for command in obfsproxy.COMMANDS]


@pytest.mark.parametrize("args", HELP_REQUESTS, ids=" ".join)
def test_help_and_version_need_no_docopt(args):
    """Issue 24: --help, each command's help and --version answer the same, exit 0,
    where docopt is not installed."""
    expected = run_cli(*args)
    done = without_docopt(PROGRAM, *args)
    assert expected.returncode == 0 and expected.stdout, expected
    assert (done.returncode, done.stdout, done.stderr) == (0, expected.stdout, ""), done


@pytest.mark.parametrize("args", HELP_REQUESTS, ids=" ".join)
def test_help_and_version_need_no_package_at_all(args):
    """Issue 24: the same with no site-packages at all (-I -S): nothing installed, the
    crypto on its no-package routes."""
    expected = run_cli(*args)
    done = without_dependencies(*args)
    # the help names the program as it was started: with -I -S here
    said = done.stdout.replace("python3 -I -S obfsproxy.py", "python3 obfsproxy.py")
    assert (done.returncode, said, done.stderr) == (0, expected.stdout, ""), done


def test_a_missing_dependency_names_the_virtual_environment_beside_the_script(tmp_path):
    """Issue 24: a copy of the tool with a .venv beside it (one the user made, then ran
    the system's python3): the message says which Python to run instead."""
    with_venv, without = tmp_path / "with", tmp_path / "without"
    for folder in (with_venv, without):    # copies: the checkout itself may have a .venv or not
        folder.mkdir()
        copy_runtime(folder)
    venv = with_venv / ".venv" / "bin" / "python3"
    venv.parent.mkdir(parents=True)
    venv.write_text("")
    done = without_docopt(with_venv / "obfsproxy.py", "client", "127.0.0.1:0")
    assert done.returncode == 1 and done.stdout == "", done
    line, = done.stderr.splitlines()
    assert line.startswith("obfsproxy.py: missing dependency (import of docopt halted"), line
    assert "This checkout has a virtual environment: run %s obfsproxy.py." % venv in line, line
    assert "This checkout has" not in without_docopt(without / "obfsproxy.py", "client").stderr


CLASSIC_DOCOPT = "/usr/bin/python3"    # Debian's, with python3-docopt (docopt 0.6.2)
PARSE = ("import json, sys; from docopt import DocoptExit, docopt\n"
         "usage, cases = json.load(sys.stdin)\n"
         "def parse(argv):\n"
         "    try:\n"
         "        return sorted(dict(docopt(usage, argv=argv)).items())\n"
         "    except DocoptExit:\n"
         "        return 'usage error'\n"
         "print(json.dumps([parse(argv) for argv in cases]))\n")
PARSE_CASES = [line.split() for line in """\
client
client 127.0.0.1:0 --transport=obfs3
client --transport obfs2 --iat-mode 1 127.0.0.1:0
client --bridge=x 127.0.0.1:1
client --dest=192.0.2.1:5
server --dest=192.0.2.1:1 0.0.0.0:1 --state-dir=s --iat-mode=1 --no-safe-logging
server 0.0.0.0:1
demo --transport=webtunnel --transport-options=url=https://x/y
managed --log-min-severity=info
--managed
unmask a b --full --output-dir=o --shared-secret-file=f --ss-hash-iterations=3
detect
detect c --shared-secret=s
--bogus
client --bogus
client --trans=obfs2 x
frob
client a b""".splitlines()] + [[]]


def test_classic_docopt_parses_the_usage_as_docopt_ng_does():
    """Issue 24: Debian's python3-docopt is docopt 0.6.2, not docopt-ng. The same
    command lines, parsed by both, give the same arguments and the same refusals
    (--help and --version never reach docopt: main() answers them)."""
    import docopt
    classic = subprocess.run([CLASSIC_DOCOPT, "-I", "-c", "import docopt; print(docopt.__version__)"],
                             capture_output=True, text=True) if Path(CLASSIC_DOCOPT).exists() else None
    if classic is None or classic.stdout.strip() != "0.6.2":
        if support.IN_CI:
            pytest.fail("CI must install python3-docopt (.ci/run)")
        pytest.skip("%s has no docopt 0.6.2 (apt-get install python3-docopt)" % CLASSIC_DOCOPT)
    if docopt.__version__.startswith("0.6"):
        pytest.skip("this Python's docopt is the classic one: the run under docopt-ng compares them")
    cases = json.dumps([obfsproxy.USAGE, PARSE_CASES])
    done = subprocess.run([CLASSIC_DOCOPT, "-I", "-c", PARSE], input=cases,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    ours = subprocess.run([sys.executable, "-c", PARSE], input=cases,
                          capture_output=True, text=True, timeout=30)
    assert json.loads(done.stdout) == json.loads(ours.stdout)
    assert json.loads(ours.stdout).count("usage error") == 9


@pytest.mark.parametrize("role", ["client", "server"])
def test_a_missing_dependency_in_managed_mode_reaches_tor_as_env_error(tmp_path, role):
    """D2: Tor reads only our stdout, and logged only "terminated with status code 1".
    Now it gets pt-spec's ENV-ERROR with the reason and the torrc line to write
    (the plugin line of the role Tor asked for, and this checkout's obfsproxy.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOR_PT_")}
    env.update(TOR_PT_MANAGED_TRANSPORT_VER="1", TOR_PT_STATE_LOCATION=str(tmp_path))
    env["TOR_PT_%s_TRANSPORTS" % role.upper()] = "obfs4,obfs3"
    done = without_dependencies("managed", env=env)
    assert done.returncode == 1
    line, = done.stdout.splitlines()
    assert line.startswith("ENV-ERROR missing dependency (No module named "), line
    venv = ROOT / ".venv" / "bin" / "python3"     # named when the checkout has one
    shown = str(venv) if venv.exists() else "/path/to/.venv/bin/python3"
    assert line.endswith("In the torrc, name the Python that has them: %sTransportPlugin obfs4,obfs3 exec "
                         "%s %s managed" % (role.capitalize(), shown, PROGRAM)), line


def test_the_default_transport_is_obfs4(echo, tmp_path, procs):
    """D3, F8: a server started without --transport served obfs2 (read by any
    observer, confirmed by any prober) and ignored --state-dir. The default is
    obfs4 now, for every command; --state-dir with a transport that keeps no
    state is refused (BAD_ARGUMENTS)."""
    server = Program("server", "--state-dir=%s" % tmp_path, "--dest=" + fmt(echo.address), "127.0.0.1:0")
    procs.append(server)
    client = Program("client", "127.0.0.1:0")
    procs.append(client)
    assert server.log.lines[-1].endswith("obfs4 server listening on %s -> %s"
                                         % (fmt(server.address), fmt(echo.address))), server.log.lines
    assert client.log.lines[-1].endswith("obfs4 client listening on %s (SOCKS4/4a/5)" % fmt(client.address))
    assert (tmp_path / "obfs4_state.json").is_file()
    cert = server.log.wait_for(r"cert=(\S+) iat-mode=0$").group(1)
    assert echo_through(client.address, b"obfs4 by default", server.address,
                        "cert=%s;iat-mode=0" % cert) == b"obfs4 by default"


def test_the_bridge_line_the_server_logs_pastes_into_the_client(bridge, procs):
    """F3: a server on a specific address logs its line with that address and no
    <FINGERPRINT> placeholder (a tunnel without Tor needs none): pasted as it
    is into --bridge, it works."""
    server, line, cert = bridge
    assert line == "Bridge obfs4 %s cert=%s iat-mode=0" % (fmt(server.address), cert), line
    client = Program("client", "--bridge=" + line, "127.0.0.1:0")
    procs.append(client)
    assert echo_through(client.address, b"pasted") == b"pasted"


def test_a_wrong_cert_is_named_on_the_client(bridge, procs):
    """D4: a wrong cert= shows only as a timeout (the bridge stays silent by
    design), so the timeout itself says what to check."""
    server, line, cert = bridge
    wrong = ("A" if cert[0] != "A" else "B") + cert[1:]
    client = Program("client", "--bridge=" + line.replace(cert, wrong), "--handshake-timeout=1",
                     "127.0.0.1:0")
    procs.append(client)
    with socket.create_connection(client.address, timeout=IO_TIMEOUT) as app:
        with pytest.raises(ConnectionResetError):
            app.recv(1)
    client.log.wait_for(r"\[NOTICE\] conn 1 \(\[scrubbed\]\): obfs4 handshake with the bridge \[scrubbed\] "
                        r"failed: timed out \(no answer: a wrong cert=, or not an obfs4 bridge at that "
                        r"address; ", timeout=IO_TIMEOUT)


@pytest.mark.slow
def test_a_probe_gets_silence_and_the_log_says_how_long(bridge):
    """D4: the bridge closes a probe after 30 s plus its own delay, and its log
    said "after 30 s" whatever the delay was, without the hint. Now the line
    gives the real time the connection stayed open, and who sends such things."""
    server, _, _ = bridge
    with socket.create_connection(server.address, timeout=120) as probe:
        probe.sendall(os.urandom(100))
        opened = time.monotonic()
        assert probe.recv(1) == b"", "the bridge answered a probe"
        held = time.monotonic() - opened
    said = server.log.wait_for(r"\[NOTICE\] conn \d+ \(\[scrubbed\]\): (handshake timed out: no obfs4 "
                               r"handshake within 30 s .*; closed after (\d+) s)$", timeout=IO_TIMEOUT)
    assert 30 <= held < 91, held
    assert abs(int(said.group(2)) - held) <= 1.5, (said.group(0), held)
    row, = [row for row in troubleshooting_rows() if row.startswith("handshake timed out")]
    assert re.fullmatch(row_pattern(row), said.group(1)), (row, said.group(1))


@pytest.mark.parametrize("defaults, per_connection", [
    (["--cert={cert}"], "iat-mode=0"),
    (["--iat-mode=1"], "cert={cert}"),
], ids=["cert-default", "iat-mode-default"])
def test_cert_and_iat_mode_defaults_each_alone(bridge, procs, defaults, per_connection):
    """D6: "--cert and --iat-mode set defaults (SOCKS arguments override them)":
    either one alone refused to start ("missing argument 'node-id'"). Now either
    starts, and the SOCKS arguments bring the rest."""
    server, _, cert = bridge
    client = Program("client", "--transport=obfs4", *[arg.format(cert=cert) for arg in defaults],
                     "127.0.0.1:0")
    procs.append(client)
    args = per_connection.format(cert=cert)
    assert echo_through(client.address, b"defaults", server.address, args) == b"defaults"


@needs_sigpipe
@pytest.mark.parametrize("role", ["client", "server"])
@pytest.mark.parametrize("how", ["second-sigint", "sigterm"])
def test_stopping_now_resets_live_tunnels(echo, procs, role, how):
    """D7: a second Ctrl-C (or SIGTERM) during a download gave the application a
    clean end of stream: a truncated download looked complete. Stopping now
    resets every live tunnel, on either end of it."""
    server, client = start_tunnel(procs, "obfs2", echo.address)
    stopped = {"client": client, "server": server}[role]
    with connect(client, server.address) as app:
        app.sendall(b"live")
        assert recv_exact(app, 4) == b"live"
        if how == "sigterm":
            stopped.process.send_signal(signal.SIGTERM)
        else:
            stopped.process.send_signal(signal.SIGINT)
            stopped.log.wait_for(r"stopped accepting; waiting for 1 live connection\(s\)")
            stopped.process.send_signal(signal.SIGINT)
        assert stopped.process.wait(IO_TIMEOUT) == 0
        with pytest.raises(ConnectionResetError):
            app.recv(1)


def test_help_says_which_commands_take_the_state_dir():
    """D13: unmask takes --state-dir (an obfs4 bridge's keys) and the help said
    only "obfs4 server"."""
    refused = run_cli("client", "--state-dir=x", "127.0.0.1:0").stderr
    takers = re.search(r"only by ([\w, ]+)\)", refused).group(1).split(", ")
    block = re.search(r"^  --state-dir=DIR .*?(?=^  -)", run_cli("--help").stdout, re.M | re.S).group(0)
    assert takers == ["server", "unmask"] and all(name in block for name in takers), (takers, block)


def test_each_command_has_its_own_help():
    """F10: `COMMAND --help` printed the one global help. Now: that command's
    usage lines (the client's with --bridge and a required <listen>) and only
    the options it takes."""
    client = run_cli("client", "--help")
    assert client.returncode == 0
    usage = client.stdout.split("\n\n", 1)[0].splitlines()
    assert "  python3 obfsproxy.py client [options] --bridge=LINE <listen>" in usage, usage
    assert all(line.startswith(("Usage:", "  python3 obfsproxy.py client ")) for line in usage), usage
    # Which options each command takes: MODE_OPTIONS, by which check_modes refuses the others.
    for command in obfsproxy.COMMANDS:
        text = run_cli(command, "--help").stdout
        options = set(re.findall(r"^  (--[\w-]+)", text, re.M))
        takes = {option for option, modes in obfsproxy.MODE_OPTIONS.items() if command in modes}
        assert options == takes | {"--version"}, (command, options ^ (takes | {"--version"}))


@pytest.mark.parametrize("spelling", ["warn", "WARNING", "Warn"])
def test_tor_spelling_of_the_warning_level_is_accepted(spelling):
    """F9: Tor and obfs4proxy write `warn`; we refused it. At that level the
    listening line is not said, but a failure to listen is."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        done = run_cli("client", "--log-min-severity=" + spelling, fmt(taken.getsockname()))
    assert done.returncode == 1, done.stderr
    assert re.fullmatch(r"\S+ \S+ \[ERROR\] cannot listen on 127\.0\.0\.1:\d+: Address already in use\n",
                        done.stderr), done.stderr


def test_the_program_is_executable():
    """F11: obfsproxy.py has a shebang, and the README's commands may run it as
    ./obfsproxy.py: the file (and so git's index) must have its run bit."""
    assert os.access(PROGRAM, os.X_OK), "obfsproxy.py is not executable (git update-index --chmod=+x)"
    with open(PROGRAM, encoding="utf-8") as f:
        assert f.readline() == "#!/usr/bin/env python3\n"


def test_secret_values_stay_out_of_the_log_and_the_log_file_is_owner_only(echo, tmp_path, procs):
    """F14: the obfs2 secret read from a file (to keep it out of `ps`) was logged
    in the bridge line, and the log file was readable by all."""
    secret = tmp_path / "secret"
    secret.write_text("s3cret-of-the-bridge\n", encoding="utf-8")
    log_file = tmp_path / "server.log"
    log_file.write_text("")
    os.chmod(log_file, 0o644)      # an older log left readable by all
    server = Program("server", "--transport=obfs2", "--shared-secret-file=%s" % secret, FAST_SS,
                     "--dest=" + fmt(echo.address), "127.0.0.1:0")
    procs.append(server)
    line = server.log.wait_for(r"bridge line for clients: (.*)$").group(1)
    assert line == "Bridge obfs2 %s shared-secret=<as given> ss-hash-iterations=10" % fmt(server.address)
    assert not any("s3cret" in said for said in server.log.lines)
    with socket.create_server(("127.0.0.1", 0)) as taken:     # the client logs one error, and ends
        done = run_cli("client", "--log-file=%s" % log_file, fmt(taken.getsockname()))
    assert done.returncode == 1 and "cannot listen on" in log_file.read_text(encoding="utf-8")
    assert (os.stat(log_file).st_mode & 0o777) == 0o600


def test_iat_mode_stays_in_the_state_as_obfs4proxy_keeps_it(echo, tmp_path):
    """F4, as the README says: a server started once with --iat-mode=2 keeps it
    in its state (and its bridge line) when restarted without the option."""
    args = ["server", "--state-dir=%s" % tmp_path, "--dest=" + fmt(echo.address), "127.0.0.1:0"]
    with Program(*args, "--iat-mode=2") as first:
        first.log.wait_for(r"bridge line for clients: .* iat-mode=2$")
    with Program(*args) as again:
        again.log.wait_for(r"bridge line for clients: .* iat-mode=2$")


def test_a_managed_client_failure_reaches_tors_log(bridge, tmp_path):
    """F6: under Tor, a wrong cert showed in Tor's log only as "Bootstrapped 2%";
    the reason was in our own log file, at the default level. It is now also a
    pt-spec LOG line on stdout, which Tor writes into its own log."""
    server, _, cert = bridge
    wrong = ("A" if cert[0] != "A" else "B") + cert[1:]
    with ManagedPT(client_env(tmp_path, "obfs4"), "--handshake-timeout=1") as pt:
        with pytest.raises(SocksReplyError):
            socks5_connect(pt.cmethods["obfs4"], server.address, timeout=IO_TIMEOUT,
                           args="cert=%s;iat-mode=0" % wrong).close()
        pt.stdout.wait_for(r'^LOG SEVERITY=notice MESSAGE=".*obfs4 handshake with the bridge \[scrubbed\] '
                           r'failed: timed out \(no answer: a wrong cert=', timeout=IO_TIMEOUT)


# The README's Troubleshooting table, row by row: each row's log line is made
# here by the mistake it describes, and must match what the program says, so
# that the two cannot drift apart. In a row, "..." stands for any text, a lone
# N for a number and an address for any address.

def row_pattern(row):
    pattern = ""
    for piece in re.split(r"(\.\.\.|\bN\b|\d+\.\d+\.\d+\.\d+:\d+)", row):
        if piece == "...":
            pattern += ".*"
        elif piece == "N":
            pattern += r"\d+"
        elif re.fullmatch(r"\d+\.\d+\.\d+\.\d+:\d+", piece or "x"):
            pattern += r"\d+\.\d+\.\d+\.\d+:\d+"
        else:
            pattern += re.escape(piece)
    return pattern


def troubleshooting_rows():
    """The log lines of the README's Troubleshooting table, as written there."""
    section = readme_section("Troubleshooting")
    return re.findall(r"^\| `([^`]+)` \|", section, re.M)


def assert_said(lines, row):
    """Some of the program's ``lines`` says the README ``row``."""
    pattern = re.compile(row_pattern(row))
    assert any(pattern.search(line) for line in lines), \
        "the README row %r is not what the program says: %r" % (row, lines[-5:])


class Scene:
    """What a mistake is made with: the test's proxies (``procs``, stopped at
    its end), the obfs4 ``bridge`` (server, line, cert), the ``echo`` service
    and a folder of the test's own."""

    def __init__(self, procs, bridge, echo, folder):
        self.procs, self.echo, self.folder = procs, echo, folder
        self.bridge, _, self.cert = bridge

    def start(self, *args):
        program = Program(*args)
        self.procs.append(program)
        return program

    def wrong_cert(self):
        return ("A" if self.cert[0] != "A" else "B") + self.cert[1:]


def dest_down(scene):
    with reserved_port() as nobody:
        server, client = start_tunnel(scene.procs, "obfs2", nobody.getsockname())
        with connect(client, server.address) as app:
            with pytest.raises(ConnectionResetError):
                app.recv(1)
        server.log.wait_for(r"conn 1 ", timeout=IO_TIMEOUT)
    return server.log.lines


def bridge_refuses(scene):
    with reserved_port() as nobody:
        client = scene.start("client", "--bridge=obfs4 %s cert=%s iat-mode=0"
                             % (fmt(nobody.getsockname()), scene.cert), "127.0.0.1:0")
        with socket.create_connection(client.address, timeout=IO_TIMEOUT) as app:
            with pytest.raises(ConnectionResetError):
                app.recv(1)
    client.log.wait_for(r"conn 1 ", timeout=IO_TIMEOUT)
    return client.log.lines


def socks_to_the_bridge(scene, args, *options):
    """One SOCKS connection to the bridge with ``args``, which fails."""
    client = scene.start("client", "--transport=obfs4", "127.0.0.1:0", *options)
    with pytest.raises(SocksReplyError):
        socks5_connect(client.address, scene.bridge.address, args=args, timeout=IO_TIMEOUT).close()
    client.log.wait_for(r"conn 1 ", timeout=IO_TIMEOUT)
    return client.log.lines


def http_to_the_socks_port(scene):
    client = scene.start("client", "127.0.0.1:0")
    with socket.create_connection(client.address, timeout=IO_TIMEOUT) as app:
        app.sendall(b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n")
        assert recv_all(app) == b""
    client.log.wait_for(r"conn 1 ", timeout=IO_TIMEOUT)
    return client.log.lines


def different_secret(scene):
    server = scene.start("server", "--transport=obfs2", "--shared-secret=one", FAST_SS,
                         "--dest=" + fmt(scene.echo.address), "127.0.0.1:0")
    client = scene.start("client", "--transport=obfs2", "--shared-secret=two", FAST_SS, "127.0.0.1:0")
    with pytest.raises(SocksReplyError):
        connect(client, server.address).close()
    server.log.wait_for(r"conn 1 ", timeout=IO_TIMEOUT)
    return server.log.lines


def too_many(scene):
    server, client = start_tunnel(scene.procs, "obfs2", scene.echo.address, "--max-connections=1")
    with connect(client, server.address) as first:
        first.sendall(b"1")
        assert recv_exact(first, 1) == b"1"
        with socket.create_connection(client.address, timeout=IO_TIMEOUT) as second:
            assert recv_all(second) == b""
        client.log.wait_for(r"refusing a connection", timeout=IO_TIMEOUT)
    return client.log.lines


def port_taken(scene):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        return run_cli("client", fmt(taken.getsockname())).stderr.splitlines()


# A system that keeps ports below 1024 for root, whoever runs the tests (root may bind them).
PRIVILEGED_BIND = """import errno, runpy, socket, sys
def bind(self, address):
    raise PermissionError(errno.EACCES, "Permission denied")
socket.socket.bind = bind
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def port_below_1024(scene):
    return subprocess.run([sys.executable, "-c", PRIVILEGED_BIND, PROGRAM, "client", "127.0.0.1:443"],
                          cwd=str(ROOT), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=30).stderr.splitlines()


def live_dummy_tunnel(scene):
    """(server, client, application socket) of a live tunnel through the dummy transport."""
    server = scene.start("server", "--transport=dummy", "--dest=" + fmt(scene.echo.address), "127.0.0.1:0")
    client = scene.start("client", "--transport=dummy", "127.0.0.1:0")
    app = connect(client, server.address)
    app.sendall(b"live")
    assert recv_exact(app, 4) == b"live"
    return server, client, app


def stopped_with_a_live_tunnel(scene):
    server, client, app = live_dummy_tunnel(scene)
    with app:
        client.process.send_signal(signal.SIGTERM)
        client.log.wait_for(r"stopping now", timeout=IO_TIMEOUT)
    return client.log.lines


def the_bridge_stops_under_a_tunnel(scene):
    server, client, app = live_dummy_tunnel(scene)
    with app:
        server.process.send_signal(signal.SIGTERM)
        client.log.wait_for(r"the bridge reset", timeout=IO_TIMEOUT)
    return client.log.lines


def state_open_to_others(scene):
    state = scene.folder / "state"
    args = ("server", "--state-dir=%s" % state, "--dest=" + fmt(scene.echo.address), "127.0.0.1:0")
    scene.start(*args).stop()
    os.chmod(str(state / "obfs4_state.json"), 0o644)
    server = scene.start(*args)
    server.log.wait_for(r"\[WARNING\] obfs4: ", timeout=IO_TIMEOUT)
    return server.log.lines


def extended_orport_denies(scene):
    cookie_file = scene.folder / "cookie"
    with ExtORPort(write_cookie(cookie_file), answer="DENY") as ext:
        server = scene.start("server", "--transport=obfs2", "--dest=" + fmt(ext.address),
                             "--ext-cookie-file=%s" % cookie_file, "127.0.0.1:0")
        client = scene.start("client", "--transport=obfs2", "127.0.0.1:0")
        with connect(client, server.address) as app:
            with pytest.raises(ConnectionResetError):
                app.recv(1)
        server.log.wait_for(r"conn 1 ", timeout=IO_TIMEOUT)
    return server.log.lines


# README row (its start) -> the mistake that makes the program say it (the lines it logged).
TROUBLESHOOTING = {
    "obfsproxy.py: missing dependency": lambda scene: without_dependencies("client").stderr.splitlines(),
    "cannot listen on 127.0.0.1:1050: Address already in use": port_taken,
    "cannot listen on 0.0.0.0:443: Permission denied": port_below_1024,
    "cannot reach the obfs4 bridge": bridge_refuses,
    "obfs4 handshake with the bridge": lambda scene: socks_to_the_bridge(
        scene, "cert=%s;iat-mode=0" % scene.wrong_cert(), "--handshake-timeout=1"),
    "bad obfs4 arguments for [scrubbed]: no cert=": lambda scene: socks_to_the_bridge(scene, "iat-mode=0"),
    "bad obfs4 arguments for [scrubbed]: no iat-mode=": lambda scene: socks_to_the_bridge(
        scene, "cert=" + scene.cert),
    "SOCKS: not a SOCKS4 or SOCKS5 client": http_to_the_socks_port,
    "cannot reach --dest": dest_down,
    # made by test_a_probe_gets_silence_and_the_log_says_how_long (slow: 30 to 90 s)
    "handshake timed out: no obfs4 handshake": None,
    "not obfs2: ": different_secret,
    "Extended ORPort denied the connection": extended_orport_denies,
    "refusing a connection": too_many,
    "conn N ([scrubbed]): the bridge reset the tunnel": the_bridge_stops_under_a_tunnel,
    "stopping now: N live tunnel(s) reset": stopped_with_a_live_tunnel,
    "obfs4: the bridge's private key file": state_open_to_others,
}


def test_every_troubleshooting_row_is_made_by_a_test():
    rows = troubleshooting_rows()
    assert [start for start in TROUBLESHOOTING if any(row.startswith(start) for row in rows)] \
        == list(TROUBLESHOOTING), rows
    for row in rows:
        assert [start for start in TROUBLESHOOTING if row.startswith(start)], \
            "no test makes the README row %r" % row


@pytest.mark.parametrize("start", [start for start, make in TROUBLESHOOTING.items() if make])
def test_troubleshooting_rows_are_what_the_program_says(start, procs, bridge, echo, tmp_path):
    row, = [row for row in troubleshooting_rows() if row.startswith(start)]
    assert_said(TROUBLESHOOTING[start](Scene(procs, bridge, echo, tmp_path)), row)


# --- Smoke -------------------------------------------------------------------

def test_smoke_obfs2_tunnel_round_trip():
    payload = os.urandom(200_000)
    with EchoServer() as echo:
        server, client = tunnel("obfs2", dest=echo.address)
        with server, client:
            with socks5_connect(client.address, server.address) as sock:
                sock.sendall(payload)
                sock.shutdown(1)
                got = recv_all(sock)
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()


def test_a_webtunnel_bridge_line_client_says_where_it_really_dials():
    """The bridge line's address is a placeholder (the synthetic 2001:db8:: one): the
    startup line names the host of url=, which is what the client dials."""
    line = ("webtunnel [2001:db8::1]:443 0123456789ABCDEF0123456789ABCDEF01234567 "
            "url=https://wt.example:8443/secret ver=0.0.2")
    with Program("client", "--bridge=" + line, "127.0.0.1:0") as client:
        started = [text for text in client.log.lines if "listening on" in text]
    assert started and started[0].endswith("webtunnel client listening on %s -> wt.example:8443"
                                           % fmt(client.address)), started


# --- The program names itself as it was started ------------------------------------------

PLAIN, BARE_FLAGS = types.SimpleNamespace(isolated=0, no_site=0), types.SimpleNamespace(isolated=1, no_site=1)
START_FORMS = [
    # (argv[0], sys.executable, flags, current folder) -> what the help and hints say
    ((str(ROOT / "obfsproxy.py"), "/usr/bin/python3", PLAIN, str(ROOT)), "python3 obfsproxy.py"),
    (("obfsproxy.py", "/usr/bin/python3", PLAIN, str(ROOT)), "python3 obfsproxy.py"),
    (("obfsproxy.py", "/usr/bin/python3", BARE_FLAGS, str(ROOT)), "python3 -I -S obfsproxy.py"),
    (("./obfsproxy.py", "/usr/bin/python3", PLAIN, str(ROOT)), "./obfsproxy.py"),
    (("./obfsproxy.py", "/usr/bin/python3", BARE_FLAGS, str(ROOT)), "python3 -I -S ./obfsproxy.py"),
    ((str(ROOT / "obfsproxy.py"), "/opt/py/bin/python3.6", PLAIN, "/"),
     "python3.6 %s" % (ROOT / "obfsproxy.py")),
    (("CHECKOUT/obfsproxy.py", "/x/.venv/bin/python", PLAIN, str(ROOT.parent)),
     "python3 %s/obfsproxy.py" % ROOT.name),
    # run inside another program (pytest, a script importing the demo): the checkout's words
    (("/usr/bin/pytest", "/usr/bin/python3", PLAIN, str(ROOT)), "python3 obfsproxy.py"),
    (("", "/usr/bin/python3", PLAIN, str(ROOT)), "python3 obfsproxy.py"),
]


@pytest.mark.parametrize("started, says", START_FORMS, ids=[said for _, said in START_FORMS])
def test_the_program_names_itself_as_it_was_started(started, says):
    argv0, executable, flags, cwd = started
    argv0 = argv0.replace("CHECKOUT", ROOT.name)
    assert program_name(argv0, executable, flags, cwd) == says


def test_the_help_and_a_hint_name_the_program_as_started():
    """Help, an error's hint: the command as the user typed it (here with -I -S)."""
    bare = subprocess.run([sys.executable, "-I", "-S", "obfsproxy.py", "client", "--help"], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60)
    assert "\n  python3 -I -S obfsproxy.py client [options] --bridge=LINE <listen>\n" in bare.stdout
    hint = subprocess.run([sys.executable, "./obfsproxy.py", "--bogus"], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60)
    assert hint.stderr.endswith("Run `./obfsproxy.py --help` for the usage.\n"), hint.stderr


def test_guide_prints_the_protocol_guide_and_writes_the_readme(tmp_path):
    shown = run_cli("guide")
    guide = (ROOT / "docs" / "PROTOCOL.md").read_text(encoding="utf-8")
    assert shown.returncode == 0 and shown.stdout == guide
    written = run_cli("guide", "--readme", "--write=%s" % (tmp_path / "README.md"))
    assert written.returncode == 0, written.stderr
    assert (tmp_path / "README.md").read_bytes() == (ROOT / "README.md").read_bytes()
    refused = run_cli("demo", "--write=x")
    assert refused.returncode == 2 and "--write is not used by demo (only by guide)" in refused.stderr


def test_guide_says_so_in_a_copy_without_the_docs(tmp_path):
    copy_runtime(tmp_path)
    done = subprocess.run([sys.executable, str(tmp_path / "obfsproxy.py"), "guide"], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == ("obfsproxy.py guide: docs/PROTOCOL.md is not here (a copy of the runtime alone): "
                           "it is in the checkout, and inside obfsproxy.pyz\n")


# --- Error texts that point where the problem is ------------------------------------------

@pytest.mark.parametrize("line, says", [
    ("obfs4 192.0.2.1:<PORT> cert=x iat-mode=0",
     "--bridge: replace the placeholder <PORT> with the bridge's port"),
    ("\u201cobfs4 192.0.2.1:443 cert=x iat-mode=0\u201d", "--bridge: the line holds curly quotes"),
], ids=["port placeholder", "curly quotes"])
def test_a_bridge_line_error_names_what_to_change(line, says):
    done = run_cli("client", "--bridge=" + line, "127.0.0.1:0")
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_a_cert_error_speaks_in_characters_and_of_the_comma():
    done = run_cli("client", "--cert=" + "A" * 60, "127.0.0.1:0")
    assert done.returncode == 2, done.stderr
    assert "cert= is 60 characters; a bridge line's is 70" in done.stderr, done.stderr
    with pytest.raises(ValueError, match="cert= ends at a comma here: separate a bridge's arguments"):
        obfs4_state.parse_cert("A" * 70 + ",iat-mode=0")      # obfs4proxy's SMETHOD ARGS form


def test_a_state_or_record_error_names_the_file_by_its_absolute_path(tmp_path):
    (tmp_path / "state" / "obfs4_state.json").mkdir(parents=True)    # unreadable as a file
    (tmp_path / "rec").write_text("a file, not a folder")
    server = subprocess.run([sys.executable, PROGRAM, "server", "--state-dir=state", "--dest=127.0.0.1:1",
                             "127.0.0.1:0"], cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert server.returncode == 2, server.stderr
    assert "obfs4 state %s: " % (tmp_path / "state" / "obfs4_state.json") in server.stderr, server.stderr
    client = subprocess.run([sys.executable, PROGRAM, "client", "--record-dir=rec", "127.0.0.1:0"],
                            cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert client.returncode == 2 and "--record-dir %s: " % (tmp_path / "rec") in client.stderr, client.stderr


def test_managed_mode_started_by_a_relative_path_says_to_write_absolute_ones(tmp_path):
    """Tor may start a transport from another folder, where a relative path in the torrc
    line fails with only "terminated with status code 1": when it happens to work, say so."""
    pt = ManagedPT(client_env(tmp_path, transports="obfs2"),
                   command=[sys.executable, "obfsproxy.py", "managed"])
    try:
        logs = [line for line in pt.stdout.lines if line.startswith("LOG SEVERITY=warning ")]
        assert any("started by a relative path (obfsproxy.py, from %s): write absolute paths in the torrc"
                   % ROOT in line for line in logs), pt.stdout.lines
    finally:
        pt.close_stdin()
        pt.wait()
        pt.finish()
