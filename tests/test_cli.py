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
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest
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
import transports

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
}
# Only a command line docopt cannot parse points to --help; a bad value or file does not.
POINTS_TO_HELP = {"server-without-dest"}


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


def into_closed_pipe(*args):
    """Run with stdout a pipe whose reader has already gone: the program's
    first write meets EPIPE, every time."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, PROGRAM, *args], cwd=str(ROOT), stdin=subprocess.DEVNULL,
                              stdout=write, stderr=subprocess.PIPE, timeout=60)
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
@pytest.mark.parametrize("args", [["--help"], ["--version"], ["unmask", "--full", "{recording}"],
                                  ["detect", "{recording}"]],
                         ids=["help", "version", "unmask", "detect"])
def test_printing_into_a_closed_pipe_ends_quietly(args, recording):
    """Like any Unix tool: killed by SIGPIPE, nothing on stderr."""
    result = into_closed_pipe(*[arg.format(recording=recording) for arg in args])
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
