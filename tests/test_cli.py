"""End to end: the real program as client and server subprocesses.

application --SOCKS--> our client ==transport==> our server --plain--> destination

Every test uses ephemeral ports on loopback and waits on real events (a log
line, a byte, an EOF), never on sleeps. Data is checked by SHA-256 in both
directions: what came back to the application, and what the destination
reported it received.
"""

import functools
import hashlib
import os
import re
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
    Proxy,
    SocksReplyError,
    fmt,
    has_ipv6_loopback,
    recv_all,
    recv_exact,
    socks5_connect,
    socks5_request,
    tunnel,
)

KiB, MiB = 1024, 1024 * 1024
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


def reserved_port(host="127.0.0.1"):
    """A socket bound but not listening: connections to its port are refused,
    and no other process can take the port while we hold it."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.bind((host, 0))
    return sock


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
    server = Proxy("server", "--dest=" + fmt(echo.address), "127.0.0.1:0",
                   "--shared-secret-file=%s" % secret_file, FAST_SS)
    client = Proxy("client", "127.0.0.1:0", "--shared-secret=" + SECRET, FAST_SS)
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
    server = Proxy("server", "--dest=" + fmt(echo.address), "127.0.0.1:0")
    procs.append(server)
    client = Proxy("client", "--dest=" + fmt(server.address), "127.0.0.1:0")
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
        client = Proxy("client", "127.0.0.1:0", "--handshake-timeout=1")
        procs.append(client)
        code, seconds = socks_failure(client, silent.getsockname())
    assert code == 0x06
    assert 0.9 <= seconds <= 3.5, "the handshake timeout fired after %.2f s" % seconds


HTTP_RESPONSE = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
                 b"Content-Length: 0\r\nConnection: close\r\n\r\n")


def speak_http(conn, report):
    conn.sendall(HTTP_RESPONSE)
    recv_all(conn)


def test_server_that_is_not_obfs2_gives_general_failure(procs):
    """A web server answers instead of obfs2: the magic check fails at once,
    long before the (10 s) handshake timeout."""
    with Destination(speak_http) as web:
        client = Proxy("client", "127.0.0.1:0", "--handshake-timeout=10")
        procs.append(client)
        code, seconds = socks_failure(client, web.address)
    assert code == 0x01
    assert seconds < 5


@pytest.mark.parametrize("client_secret", ["--shared-secret=not the same", None],
                         ids=["different-secret", "no-secret"])
def test_mismatched_shared_secret_gives_general_failure(echo, procs, client_secret):
    server = Proxy("server", "--dest=" + fmt(echo.address), "127.0.0.1:0",
                   "--shared-secret=" + SECRET, FAST_SS)
    procs.append(server)
    client = Proxy("client", "127.0.0.1:0", FAST_SS,
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

def run_cli(*args):
    return subprocess.run([sys.executable, PROGRAM, *args], cwd=str(ROOT),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=30)


@pytest.mark.parametrize("args, mentions", [
    (["client", "--transport=rot13", "127.0.0.1:0"], "rot13"),
    (["client", "127.0.0.1"], "127.0.0.1"),
    (["client", "127.0.0.1:70000"], "70000"),
    (["server", "--dest=localhost", "127.0.0.1:0"], "localhost"),
    (["server", "127.0.0.1:0"], "--dest"),
    (["client", "--shared-secret=a", "--shared-secret-file={file}", "127.0.0.1:0"],
     "--shared-secret"),
], ids=["unknown-transport", "address-without-port", "port-out-of-range", "bad-dest",
        "server-without-dest", "both-secrets"])
def test_bad_arguments_exit_2_with_a_one_line_error(args, mentions, secret_file):
    result = run_cli(*[arg.format(file=secret_file) for arg in args])
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert lines, "no error message"
    # One line says what is wrong and names it; at most one more line may
    # point to --help. A usage dump is not an error message.
    assert len(lines) <= 2, "expected a one-line error, got:\n" + result.stderr
    assert lines[0].startswith("obfsproxy.py") and mentions in lines[0], lines[0]


def test_help_and_version_exit_0():
    helped = run_cli("--help")
    assert helped.returncode == 0 and "Usage:" in helped.stdout and "client" in helped.stdout
    version = run_cli("--version")
    assert version.returncode == 0
    assert re.fullmatch(r"obfsproxy\.py \d+\.\d+\.\d+", version.stdout.strip()), version.stdout


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
    server = Proxy("server", "--dest=" + fmt(echo.address), "127.0.0.1:0", *extra)
    procs.append(server)
    client = Proxy("client", "127.0.0.1:0", *extra)
    procs.append(client)
    with connect(client, server.address) as sock:
        send_and_shut(sock, b"log me")
        assert recv_all(sock) == b"log me"
    with reserved_port() as nobody:                 # and one failure, logged too
        assert socks_failure(client, nobody.getsockname())[0] == 0x05
    wait_for_all(server.log, r"conn 1\b.*closed")
    wait_for_all(client.log, r"conn 1\b.*closed", r"conn 2\b.*cannot reach the obfs2 server")
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
