"""meek end to end, with real parts: our server as a process behind nginx (TLS at nginx,
plain HTTP to us, keep-alive connections that carry requests of many sessions) or
terminating TLS itself (tls-cert=), obfs4proxy's meek_lite client as the independent
peer, our own client in each of its modes, and Tor's Extended ORPort (fake_tor).

    application --SOCKS--> client ==TLS, POSTs==> nginx --HTTP keep-alive--> our server
        --one connection per session--> destination (or the Extended ORPort)

The clients trust the test CA (tests/testca.py) through SSL_CERT_FILE (obfs4proxy's Go
crypto/tls honours it too). Synchronisation is on real events (a port that accepts, a
destination's accept or end of stream, a log line), never on sleeps.
"""

import contextlib
import hashlib
import os
import random
import re
import shutil
import socket
import threading
import time

import pytest
import testca
from fake_tor import ExtORPort, ManagedPT, client_env, server_env, write_cookie
from nginx import MEEK_SERVER_BLOCK, Nginx, free_port, require_nginx
from peers import Obfs4proxy
from support import (
    OURS,
    EchoServer,
    FakeProxy,
    Program,
    SocksReplyError,
    bootstrap,
    echo_round_trip,
    fmt,
    recv_all,
    require_obfs4proxy,
    socks5_connect,
)

import meek

PATH = "/meek/"
NAME = testca.NAME
PLACEHOLDER = ("192.0.2.3", 2)          # the bridge line's address: never dialled
FINGERPRINT = "0123456789ABCDEF0123456789ABCDEF01234567"


def payload(size, seed):
    return random.Random(seed).getrandbits(8 * size).to_bytes(size, "little")


def sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def parts(tmp_path, ca):
    require_nginx()
    started = Parts(tmp_path, ca)
    try:
        yield started
    finally:
        started.close()


class Parts:
    """Everything a test starts, stopped at the end in reverse order; their logs are
    printed then (pytest shows them when a test fails)."""

    def __init__(self, tmp_path, ca):
        self.tmp_path, self.ca = tmp_path, ca
        self.stack = contextlib.ExitStack()
        self.logs = []

    def close(self):
        self.stack.close()
        for label, lines in self.logs:
            print("--- %s" % label)
            print("\n".join(lines()))

    def env(self):
        return dict(os.environ, SSL_CERT_FILE=self.ca.ca_file)

    def dest(self, behaviour=None):
        return self.stack.enter_context(EchoServer(behaviour=behaviour))

    def program(self, label, *args, env=None):
        program = self.stack.enter_context(Program(*args, env=env))
        self.logs.append((label, lambda: program.log.lines))
        return program

    def server(self, dest, options="", *extra):
        args = ["server", "--transport=meek", "--dest=" + fmt(dest.address), "127.0.0.1:0"]
        if options:
            args.append("--transport-options=" + options)
        return self.program("server", *(args + list(extra)))

    def nginx(self, backend, block=MEEK_SERVER_BLOCK):
        front = Nginx(self.tmp_path / "nginx", backend, self.ca.cert_file, self.ca.key_file,
                      path=PATH, block=block)
        self.stack.callback(front.stop)
        self.logs.append(("nginx error log", lambda: front.error_log().splitlines()))
        return front

    def bridge(self, behaviour=None, options=""):
        """(destination, server, nginx) with our server behind nginx."""
        dest = self.dest(behaviour)
        server = self.server(dest, options)
        return dest, server, self.nginx(server.address)

    def meek_lite(self):
        """obfs4proxy as a managed meek_lite client: its SOCKS5 address."""
        old = os.environ.get("SSL_CERT_FILE")
        os.environ["SSL_CERT_FILE"] = self.ca.ca_file
        try:
            peer = Obfs4proxy("client", self.tmp_path, transport="meek_lite")
        finally:
            if old is None:
                del os.environ["SSL_CERT_FILE"]
            else:
                os.environ["SSL_CERT_FILE"] = old
        self.stack.callback(peer.stop)
        self.logs.append(("obfs4proxy stderr", lambda: peer.stderr.lines))
        return peer.address

    def managed(self, env, *args, label="managed"):
        pt = self.stack.enter_context(ManagedPT(env, *args))
        self.logs.append((label + " stderr", lambda: pt.stderr.lines))
        return pt


def url_of(front, host=NAME):
    """url= with the test certificate's name, and front= that dials nginx by address."""
    return "https://%s%s" % (host, PATH), "127.0.0.1:%d" % front.address[1]


def args_of(front):
    url, dial = url_of(front)
    return "url=%s;front=%s" % (url, dial)


# --- obfs4proxy's meek_lite client, through nginx, to our server ------------------------

def test_meek_lite_through_nginx_carries_megabytes_exact_both_ways(parts):
    """4 MiB echoed: obfs4proxy's client (Go's net/http and crypto/tls) -> nginx -> our
    server -> the destination and back, SHA-256 equal; one session, one destination
    connection."""
    dest, _, front = parts.bridge()
    socks = parts.meek_lite()
    data = payload(4 << 20, seed=1)
    with socks5_connect(socks, PLACEHOLDER, args=args_of(front)) as sock:
        assert sha(echo_round_trip(sock, data)) == sha(data)
    assert dest.accepted == 1


@pytest.mark.slow
def test_meek_lite_carries_64_mib_each_way(parts):
    """64 MiB up, then 64 MiB down, each checked by SHA-256 at the other end."""
    from peers import Destination, one_way_each, transfer_each_way
    size = 64 << 20
    up, down = payload(size, seed=3), payload(size, seed=4)
    dest = parts.stack.enter_context(Destination(one_way_each(down, size)))
    server = parts.server(dest)
    front = parts.nginx(server.address)
    socks = parts.meek_lite()
    with socks5_connect(socks, PLACEHOLDER, args=args_of(front), timeout=600) as sock:
        took = transfer_each_way(sock, dest, up, down)
    print("\nmeek_lite -> nginx -> our meek server, 64 MiB: up %.1f s, down %.1f s"
          % (took["up"], took["down"]))


# --- Our client, in each mode -----------------------------------------------------------

class Client:
    """Our meek client: "socks" (the bridge line's arguments per connection), "bridge"
    (--bridge, no SOCKS) or "managed" (Tor's CMETHOD)."""

    def __init__(self, parts, kind, front, *extra):
        self.kind, self.front = kind, front
        url, dial = url_of(front)
        env = parts.env()
        if kind == "socks":
            self.program = parts.program("client", "client", "--transport=meek", "127.0.0.1:0",
                                         *extra, env=env)
            self.address = self.program.address
        elif kind == "bridge":
            line = "meek %s:%d %s url=%s front=%s" % (PLACEHOLDER + (FINGERPRINT, url, dial))
            self.address = parts.program("client", "client", "--bridge=" + line, "127.0.0.1:0",
                                         *extra, env=env).address
        else:
            variables = client_env(parts.tmp_path, transports="meek")
            variables["SSL_CERT_FILE"] = env["SSL_CERT_FILE"]
            self.address = parts.managed(variables, *extra, label="managed client").cmethods["meek"]

    def connect(self, args=None):
        if self.kind == "bridge":
            return socket.create_connection(self.address, timeout=30)
        return socks5_connect(self.address, PLACEHOLDER, args=args or args_of(self.front))


@pytest.mark.parametrize("kind", ["socks", "bridge", "managed"])
def test_our_client_through_nginx_carries_megabytes_exact_both_ways(parts, kind):
    dest, _, front = parts.bridge()
    client = Client(parts, kind, front)
    data = payload(4 << 20, seed=5)
    with client.connect() as sock:
        assert sha(echo_round_trip(sock, data)) == sha(data)
    assert dest.accepted == 1


def test_our_client_dials_again_when_the_front_closes_keep_alive(parts):
    """nginx closes a client's keep-alive connection after keepalive_requests (1,000 by
    default; 3 here): the client dials the front again, in the same session, and the
    bytes arrive exact; one destination connection throughout."""
    dest = parts.dest()
    server = parts.server(dest)
    front = parts.nginx(server.address, MEEK_SERVER_BLOCK.replace(
        "    server_tokens off;\n", "    server_tokens off;\n    keepalive_requests 3;\n"))
    client = Client(parts, "socks", front, "--log-min-severity=debug")
    data = payload(1 << 20, seed=7)
    with client.connect() as sock:
        assert sha(echo_round_trip(sock, data)) == sha(data)
    client.program.log.wait_for(r"ended the keep-alive connection after 3 requests; dialling it again")
    assert dest.accepted == 1


def test_tor_pt_proxy_carries_the_managed_client_and_its_redials(parts, tmp_path):
    """TOR_PT_PROXY: every connection to the front goes through Tor's outgoing proxy, the
    first and each one made after the front closed keep-alive (keepalive_requests 3)."""
    dest = parts.dest()
    server = parts.server(dest)
    front = parts.nginx(server.address, MEEK_SERVER_BLOCK.replace(
        "    server_tokens off;\n", "    server_tokens off;\n    keepalive_requests 3;\n"))
    upstream = parts.stack.enter_context(FakeProxy("socks5", ("tor", "pw")))
    variables = client_env(tmp_path, transports="meek", PROXY=upstream.uri("tor", "pw"))
    variables["SSL_CERT_FILE"] = parts.ca.ca_file
    pt = parts.managed(variables, label="managed client")
    assert pt.keywords() == ["VERSION", "PROXY DONE", "CMETHOD", "CMETHODS DONE"]
    data = payload(256 << 10, seed=8)
    with socks5_connect(pt.cmethods["meek"], PLACEHOLDER, args=args_of(front)) as sock:
        assert sha(echo_round_trip(sock, data)) == sha(data)
    targets = {request["target"] for request in upstream.requests}
    assert targets == {("127.0.0.1", front.address[1])} and len(upstream.requests) >= 2
    assert dest.accepted == 1


def test_our_client_to_our_server_terminating_tls_itself(parts):
    """tls-cert= mode: no front; url= is the server's own https address."""
    dest = parts.dest()
    server = parts.server(dest, "tls-cert=%s;tls-key=%s" % (parts.ca.cert_file, parts.ca.key_file))
    client = parts.program("client", "client", "--transport=meek", "127.0.0.1:0", env=parts.env())
    args = "url=https://%s%s;front=127.0.0.1:%d" % (NAME, PATH, server.address[1])
    data = payload(1 << 20, seed=6)
    with socks5_connect(client.address, PLACEHOLDER, args=args) as sock:
        assert sha(echo_round_trip(sock, data)) == sha(data)


def test_a_wrong_path_fails_the_socks_request_and_says_what_to_check(parts):
    """nginx's cover page answers every other path with 200 and HTML: the client refuses
    it before the SOCKS reply, and its log says to check the path of url=."""
    _, _, front = parts.bridge()
    client = parts.program("client", "client", "--transport=meek", "127.0.0.1:0", env=parts.env())
    args = "url=https://%s/elsewhere;front=127.0.0.1:%d" % (NAME, front.address[1])
    with pytest.raises(SocksReplyError):
        socks5_connect(client.address, PLACEHOLDER, args=args).close()
    client.log.wait_for(r"not a meek server's bytes .*check the path of url=")


# --- The bridge's answers and limits ------------------------------------------------------

def exchange(address, data):
    """Send ``data`` on a new connection and read the answer until the server closes."""
    with socket.create_connection(address, timeout=20) as sock:
        sock.sendall(data)
        return recv_all(sock)


def post(sid, body=b"", close=True):
    return (b"POST / HTTP/1.1\r\nHost: b.test\r\nX-Session-Id: %s\r\nContent-Length: %d\r\n%s\r\n%s"
            % (sid, len(body), b"Connection: close\r\n" if close else b"", body))


def test_the_answers_of_a_go_server(parts):
    """GET / is the cover page, other paths Go's 404, other methods and a POST without a
    session id Go's 400, bytes that are not HTTP Go's bare 400; nothing reaches Tor."""
    dest = parts.dest()
    server = parts.server(dest)
    address = server.address
    cover = exchange(address, b"GET / HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n")
    assert re.match(rb"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n"
                    rb"Date: [^\r]+ GMT\r\nContent-Length: 38\r\nConnection: close\r\n\r\n"
                    rb"I\xe2\x80\x99m just a happy little web server.\n\Z", cover), cover
    missing = exchange(address, b"GET /robots.txt HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n")
    assert missing.startswith(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain; charset=utf-8\r\n"
                              b"X-Content-Type-Options: nosniff\r\n")
    assert missing.endswith(b"\r\n\r\n404 page not found\n")
    for request in (b"PUT / HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n", post(b"short")):
        bad = exchange(address, request)
        assert bad.startswith(b"HTTP/1.1 400 Bad Request\r\n") and bad.endswith(b"Bad request.\n")
    garbage = exchange(address, b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
    assert garbage == (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
                       b"Connection: close\r\n\r\n400 Bad Request")
    no_host = exchange(address, b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert no_host.startswith(b"HTTP/1.1 400 Bad Request: missing required Host header\r\n")
    bare_lf = exchange(address, b"GET / HTTP/1.1\nHost: b.test\nConnection: close\n\n")
    old = exchange(address, b"GET / HTTP/1.0\r\n\r\n")
    assert bare_lf.endswith(b"happy little web server.\n") and old.startswith(b"HTTP/1.0 200 OK\r\n")
    assert b"Connection" not in old
    options = exchange(address, b"OPTIONS * HTTP/1.1\r\nHost: b.test\r\nConnection: close\r\n\r\n")
    assert re.match(rb"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nDate: [^\r]+\r\nConnection: close\r\n\r\n\Z",
                    options), options
    # A body over 64 KiB + 1 (with more bytes behind it than the server reads): Go's empty
    # 200 and a FIN, never a reset that could throw the answer away.
    large = exchange(address, post(b"abcdefgh70000", b"z" * 70000))
    assert re.match(rb"HTTP/1.1 200 OK\r\nConnection: close\r\nDate: [^\r]+\r\nContent-Length: 0\r\n\r\n\Z",
                    large), large
    assert dest.accepted == 0


def test_a_body_of_64_kib_and_1_is_taken_and_a_large_answer_is_chunked(parts):
    """meek-server reads a body through MaxBytesReader(64 KiB + 1): 65,537 bytes reach
    Tor; the echo comes back in a chunked answer, as Go sends a body over 2048 bytes."""
    dest = parts.dest()
    server = parts.server(dest)
    answer = exchange(server.address, post(b"abcdefgh65537", b"x" * 65537))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.endswith(b"\r\nConnection: close\r\nTransfer-Encoding: chunked"), head
    size, _, rest = body.partition(b"\r\n")
    assert 2048 < int(size, 16) <= 65536 and rest == b"x" * int(size, 16) + b"\r\n0\r\n\r\n"
    assert dest.accepted == 1


@pytest.mark.slow
def test_a_request_that_never_ends_is_closed_unanswered_after_the_read_timeout(parts):
    """Bytes that never make a request (a TLS hello on the plain port) get no answer and,
    after meek-server's ReadTimeout (20 s), a close, as the Go server does."""
    server = parts.server(parts.dest())
    with socket.create_connection(server.address, timeout=3 * meek.READ_TIMEOUT) as sock:
        sock.sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40)
        started = time.monotonic()
        assert recv_all(sock) == b""
        assert time.monotonic() - started >= meek.READ_TIMEOUT - 1.0


def test_sessions_are_kept_apart_and_an_idle_one_closes_on_time(parts):
    """Two session ids, two destination connections, each with its own bytes; with
    session-idle=1 the destination sees each session end once nothing comes."""
    ended = []
    done = threading.Semaphore(0)

    def echo_until_end(conn):
        while True:
            data = conn.recv(65536)
            if not data:
                break
            conn.sendall(data)
        ended.append(time.monotonic())
        done.release()
    dest = parts.dest(echo_until_end)
    server = parts.server(dest, "session-idle=1")
    with socket.create_connection(server.address, timeout=20) as sock:
        for sid, body in ((b"a" * 32, b"first"), (b"b" * 32, b"second")):
            sock.sendall(post(sid, body, close=False))
            answer = b""
            while not answer.endswith(b"\r\n\r\n" + body):   # the echo within the turnaround, or a poll
                chunk = sock.recv(65536)
                assert chunk, answer
                answer += chunk
                if answer.endswith(b"Content-Length: 0\r\n\r\n"):
                    sock.sendall(post(sid, close=False))
                    answer = b""
        opened = time.monotonic()
        assert done.acquire(timeout=30) and done.acquire(timeout=30), "an idle session stayed open"
    assert dest.accepted == 2
    assert min(ended) - opened >= 0.5


def test_a_session_that_cannot_be_made_is_answered_500(parts):
    """Tor unreachable, or max-sessions reached: Go's 500, the session not kept, and the
    log says why at the default level."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    unreachable = parts.program("server", "server", "--transport=meek", "--dest=127.0.0.1:%d" % port,
                                "127.0.0.1:0")
    answer = exchange(unreachable.address, post(b"c" * 32))
    assert answer.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert answer.endswith(b"Internal server error.\n")
    unreachable.log.wait_for(r"meek: a new session cannot reach --dest")
    dest = parts.dest()
    full = parts.server(dest, "max-sessions=1")
    assert exchange(full.address, post(b"d" * 32)).startswith(b"HTTP/1.1 200 OK\r\n")
    assert exchange(full.address, post(b"e" * 32)).startswith(b"HTTP/1.1 500 ")
    assert exchange(full.address, post(b"d" * 32)).startswith(b"HTTP/1.1 200 OK\r\n")
    full.log.wait_for(r"refusing a new session: 1 sessions open \(max-sessions=\)")
    assert dest.accepted == 1


def test_x_forwarded_for_becomes_useraddr_with_port_1(parts, tmp_path):
    """Managed server with an Extended ORPort, behind nginx: Tor hears of the address
    nginx saw, port 1, transport meek; obfs4proxy's meek_lite carries the data. The
    session ends (session-idle=1 in ServerTransportOptions) and with it the record."""
    cookie_file = tmp_path / "cookie"
    ext = parts.stack.enter_context(ExtORPort(write_cookie(cookie_file)))
    port = free_port()
    pt = parts.managed(server_env(tmp_path, ("127.0.0.1", 1), transports="meek",
                                  bindaddr="meek-127.0.0.1:%d" % port,
                                  SERVER_TRANSPORT_OPTIONS="meek:session-idle=1",
                                  EXTENDED_SERVER_PORT="%s:%d" % ext.address,
                                  AUTH_COOKIE_FILE=str(cookie_file)),
                       label="managed server")
    assert pt.keywords() == ["VERSION", "SMETHOD", "SMETHODS DONE"]
    front = parts.nginx(("127.0.0.1", port))
    socks = parts.meek_lite()
    with socks5_connect(socks, PLACEHOLDER, args=args_of(front)) as sock:
        assert echo_round_trip(sock, b"through nginx") == b"through nginx"
    session = ext.wait_session(timeout=60)
    assert (session["useraddr"], session["transport"], session["done"]) == ("127.0.0.1:1", "meek", True)


# --- A real Tor -------------------------------------------------------------------------

SUCCESS = re.compile(r"^tor bootstrap through meek(?:_lite)?: client got the bridge descriptor "
                     r"\((.*)\) \[(/tmp/torbs\.\w+)\]$", re.MULTILINE)


@pytest.mark.slow
@pytest.mark.parametrize("client", ["ours", "obfs4proxy"])
def test_tor_bootstraps_through_nginx_and_meek(parts, client):
    """tor-loopback.sh: the bridge's meek listens on PT_PORT behind nginx; the client's
    Bridge line dials nginx with the test CA trusted (ours, or obfs4proxy's meek_lite)."""
    port = free_port()
    front = parts.nginx(("127.0.0.1", port))
    url, dial = url_of(front)
    status, output, seconds = bootstrap(
        OURS if client == "ours" else require_obfs4proxy(), OURS,
        "meek" if client == "ours" else "meek_lite",
        PT_PORT=str(port), SSL_CERT_FILE=parts.ca.ca_file,
        BRIDGE_ARGS="url=%s front=%s" % (url, dial))
    print("\nmeek (%s client): tor-loopback.sh in %.1f s, exit status %d:\n%s"
          % (client, seconds, status, output))
    match = SUCCESS.search(output)
    assert status == 0 and match, output
    assert "ExtORPort auth ok" in match.group(1), match.group(1)
    shutil.rmtree(match.group(2), ignore_errors=True)


# --- Idle sessions: no thread, bounded memory, closed on time ------------------------------

class Counting:
    """A destination on one thread and one selector: counts connections accepted and
    ended (no thread per connection, so a thousand cost the test nothing)."""

    def __init__(self):
        import selectors
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1024)
        self.listener.setblocking(False)
        self.address = self.listener.getsockname()
        self.accepted = self.ended = 0
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.stopping = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        import selectors
        while not self.stopping:
            for key, _ in self.selector.select(0.2):
                if key.fileobj is self.listener:
                    try:
                        conn, _ = self.listener.accept()
                    except BlockingIOError:
                        continue
                    conn.setblocking(False)
                    self.selector.register(conn, selectors.EVENT_READ)
                    self.accepted += 1
                else:
                    try:
                        data = key.fileobj.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        self.selector.unregister(key.fileobj)
                        key.fileobj.close()
                        self.ended += 1

    def wait(self, attribute, count, timeout):
        end = time.monotonic() + timeout
        while getattr(self, attribute) < count:
            assert time.monotonic() < end, "%s: %d of %d" % (attribute, getattr(self, attribute), count)
            time.sleep(0.05)    # polling a real condition (the count), not a sleep for one

    def close(self):
        self.stopping = True
        self.thread.join(5)
        self.listener.close()


def status_of(pid):
    fields = dict(line.split(":", 1) for line in open("/proc/%d/status" % pid))
    return int(fields["VmRSS"].split()[0]), int(fields["Threads"])


def open_sessions(address, count, connections=10):
    """``count`` sessions, each opened by one empty POST, over ``connections`` keep-alive
    connections; every answer read."""
    socks = [socket.create_connection(address, timeout=30) for _ in range(connections)]
    try:
        for number in range(count):
            sock = socks[number % connections]
            sock.sendall(post(b"%032x" % number, close=False))
            answer = b""
            while not answer.endswith(b"\r\n\r\n"):
                answer += sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n"), answer
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_a_thousand_idle_sessions_cost_no_thread_and_close_on_time(parts):
    """1,000 sessions opened and left idle: the server's threads are back to what they
    were with none, its memory grows by a bounded amount per session (the figures are
    printed), and with session-idle=3 every session's Tor connection ends."""
    dest = Counting()
    parts.stack.callback(dest.close)
    server = parts.server(dest, "session-idle=3", "--max-connections=4096")
    pid = server.process.pid
    open_sessions(server.address, 1, connections=1)
    dest.wait("ended", 1, 60)
    rss_before, threads_before = status_of(pid)
    open_sessions(server.address, 1000)
    dest.wait("accepted", 1001, 60)
    rss_after, threads_after = status_of(pid)
    per_session = (rss_after - rss_before) * 1024 / 1000
    print("\n1,000 idle meek sessions: RSS %d -> %d KiB (%.0f bytes a session), threads %d -> %d"
          % (rss_before, rss_after, per_session, threads_before, threads_after))
    dest.wait("ended", 1001, 120)
    rss_closed, threads_closed = status_of(pid)
    print("all closed: RSS %d KiB, threads %d" % (rss_closed, threads_closed))
    assert per_session < 16 * 1024
    assert threads_after <= threads_before + 2, "idle sessions hold threads"
    assert threads_closed <= threads_before + 2


# --- detect: what a censor's capture shows of a meek session ---------------------------------

def test_detect_names_the_front_and_the_polling_rhythm(parts, tmp_path):
    """tcpdump on the front's port while a session idles: `obfsproxy.py detect` reads the
    ClientHello (front= is an address here, so no SNI; a name would show), the exchanges,
    and the gaps between the polls growing by 1.5 times each."""
    import signal
    import subprocess
    import sys

    from teaching import capture, pcap
    tcpdump = shutil.which("tcpdump") or "/usr/sbin/tcpdump"
    if not os.path.exists(tcpdump):
        pytest.skip("tcpdump is not installed (apt-get install tcpdump)")
    _, _, front = parts.bridge()
    client = Client(parts, "socks", front)
    path = tmp_path / "meek.pcap"
    dump = subprocess.Popen([tcpdump, "-i", "lo", "-U", "-n", "-B", "65536", "-s", "0", "-w", str(path),
                             "tcp port %d" % front.address[1]],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        line = dump.stderr.readline().decode(errors="replace")
        if "listening on" not in line:
            pytest.skip("tcpdump cannot capture here: %s" % line.strip())
        with socks5_connect(client.address, PLACEHOLDER, args=args_of(front)) as sock:
            assert echo_round_trip(sock, b"hello") == b"hello"
            end = time.monotonic() + 30
            while True:       # polling the capture (a real condition) until the rhythm shows
                try:
                    conversations = pcap.read_pcap(path)[1]
                except pcap.CaptureError:
                    conversations = []
                if any(capture.polling_rhythm(capture.exchanges(c.flow, c.initiator or 0))[1]
                       for c in conversations):
                    break
                assert time.monotonic() < end, "no polling rhythm in the capture"
                time.sleep(0.2)
    finally:
        dump.send_signal(signal.SIGINT)
        dump.wait(10)
    done = subprocess.run([sys.executable, "obfsproxy.py", "detect", str(path)], capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          timeout=60)
    print(done.stdout)
    assert "the idle polling of meek" in done.stdout
    assert "exchanges: " in done.stdout
