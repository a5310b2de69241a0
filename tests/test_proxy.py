"""The running program under faults, hostile input and load, on real sockets.

Every test runs the real program (``support.Program``: a subprocess whose port is
read from its log) on 127.0.0.1 and watches it from outside: its log lines, its
sockets' states in /proc/net/tcp, its descriptors in /proc/PID/fd, its threads
and CPU time in /proc/PID/status and /proc/PID/stat. Waits are on those real
events, polled against a deadline (``wait_until``), never a bare sleep; the only
sleeps pace a deliberately slow peer or are the measuring window of a CPU test.

What each group proves:

* bounded handshakes: a silent, trickling or garbage-speaking peer is closed
  within its deadline, on the client's SOCKS port, on the server's port and
  from the client's side towards a bad server, with one log line, no traceback;
* a flood of shared-secret handshakes cannot stall live tunnels;
* bounded resources: ``--max-connections``, a failed thread start, bounded buffers;
* nothing leaks: descriptors, threads and CLOSE_WAIT sockets return to their
  baseline after connections that end every way;
* no stalls: black holes and dead destinations hold only their own tunnel, the
  other side of a failed tunnel is closed, idle tunnels cost no CPU;
* not an open proxy, no leaks of who, clean shutdown;
* failures that say something: at the default log level the user is told
  which hop failed and why, once per kind, text and COMPLAINT_INTERVAL.

Performance figures (RTT during a key-work flood, CPU of idle tunnels) and the
load versions (10,000 connections, 1,000 tunnels, 1 GiB) are in the slow group
at the end (``python3 -m pytest -m slow``): a busy machine must not fail the
default run, which proves each property by an event or a CPU-time budget.
"""

import hashlib
import os
import queue
import random
import re
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from procwatch import (
    AT_REST,
    close_wait,
    cpu_seconds,
    fd_count,
    needs_proc,
    proc_number,
    rss_bytes,
    tcp_sockets,
    thread_count,
)
from support import (
    PROGRAM,
    ROOT,
    EchoServer,
    Program,
    SocksReplyError,
    assert_refused,
    closed_port,
    echo,
    fmt,
    listening_socket,
    pycryptodome_cipher,
    recv_all,
    recv_exact,
    reserved_port,
    socks5_connect,
)

import handshake_scheduler
import listener
import obfs2
import outbound
import proxy

AES = pycryptodome_cipher("AES")

needs_signals = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

HS = 1.0            # --handshake-timeout for the handshake tests, in seconds
SLACK = 3.0         # how late after its deadline a close may be observed (busy CI)


# --- Watching a process from outside ---------------------------------------------

def wait_until(check, timeout, what):
    """Poll ``check()`` until it returns a true value; return it, or fail
    saying ``what`` and the last value seen."""
    end = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail("%s: not within %.0f s (last: %r)" % (what, timeout, value))
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


class Usage:
    """A process's descriptors and threads now, to compare with later."""

    def __init__(self, node):
        """Taken at rest: only the main thread and the poller run (the last connection's
        thread may still be closing its sockets when the test sees the end)."""
        self.node, self.pid = node, node.process.pid
        wait_until(lambda: thread_count(self.pid) == AT_REST, 10, "%s at rest" % node.args[2])
        self.fds, self.threads = fd_count(self.pid), thread_count(self.pid)

    def back_to_baseline(self, timeout=30):
        """Wait until descriptors and threads are back where they were and no
        socket of the process sits in CLOSE_WAIT; return (fds, threads)."""
        end = time.monotonic() + timeout
        while True:
            fds, threads, waiting = fd_count(self.pid), thread_count(self.pid), close_wait(self.pid)
            if (fds, threads, waiting) == (self.fds, self.threads, []):
                return fds, threads
            if time.monotonic() > end:
                pytest.fail("%s did not return to its baseline of %d fds, %d threads and no "
                            "CLOSE_WAIT within %d s: now %d fds, %d threads, CLOSE_WAIT %r"
                            % (self.node.args[2], self.fds, self.threads, timeout,
                               fds, threads, waiting))
            time.sleep(0.05)   # polling the condition, with the deadline above


# --- The programs under test ----------------------------------------------------------

def start(role, *args, severity="info"):
    """``obfsproxy.py <role> 127.0.0.1:0 <args>``, ready (it logged its port);
    obfs2 unless ``args`` name a transport."""
    return Program(role, "127.0.0.1:0", "--log-min-severity=" + severity, *with_transport(args))


def with_transport(args):
    return args if any(arg.startswith("--transport=") for arg in args) else ("--transport=obfs2",) + args


def wait_line(node, pattern, timeout=20.0, after=0):
    """The first new log line matching ``pattern`` whose first group (a
    connection number) is greater than ``after``."""
    end = time.monotonic() + timeout
    while True:
        match = node.log.wait_for(pattern, timeout=max(0.1, end - time.monotonic()))
        if not match.groups() or int(match.group(1)) > after:
            return match


def drain(*nodes):
    """Consume the log lines already written, so that the next wait_for only
    sees what comes after (the shared processes serve many tests)."""
    for node in nodes:
        node.log.rest(0.05)


def conn_lines(node, number):
    tag = "conn %d (" % number
    return [line for line in node.log.lines if tag in line]


def assert_no_traceback(*nodes):
    for node in nodes:
        bad = [line for line in node.log.lines
               if "Traceback" in line or "internal error" in line or "[ERROR]" in line]
        assert not bad, "unexpected error lines: %r" % bad


def reset(sock):
    """Close with SO_LINGER 0: the kernel sends RST instead of FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def wait_closed(sock, timeout):
    """Read and discard until the peer closes (EOF or RST); seconds it took.
    Fails if the connection is still open after ``timeout``."""
    began = time.monotonic()
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    except socket.timeout:
        pytest.fail("the connection was still open after %.1f s" % timeout)
    return time.monotonic() - began


# --- The destination: what each connection does is chosen by its first 8 bytes ------

class Dest(EchoServer):
    """A service on 127.0.0.1 behind the tunnel. The application names the
    behaviour in the first 8 bytes it sends (see ``_behave``); ``events`` gets
    (mode, how it ended) for every connection, once it is closed; ``accepted``
    counts connections."""

    def __init__(self, backlog=1024):
        self.events = queue.Queue()
        self.release = threading.Event()      # lets "hold" connections go
        super().__init__(backlog=backlog)

    def _serve(self, conn):
        mode, how = b"?", "ok"
        try:
            with conn:
                try:
                    mode = recv_exact(conn, 8)
                except AssertionError:
                    how = "closed before a mode"
                    return
                how = self._behave(conn, mode.rstrip(b" ").decode("ascii", "replace"))
        except OSError as exc:
            how = type(exc).__name__
        finally:
            self.events.put((mode.rstrip(b" ").decode("ascii", "replace"), how))

    def _behave(self, conn, mode):
        if mode == "echo":        # echo until EOF, then close
            echo(conn)
            return "eof"
        if mode == "digest":      # read to EOF, then answer SHA-256 and length (half-close)
            digest, count = hashlib.sha256(), 0
            while True:
                data = conn.recv(1 << 20)
                if not data:
                    break
                digest.update(data)
                count += len(data)
            conn.sendall(digest.digest() + struct.pack("!Q", count))
            return "eof"
        if mode == "send":        # send N bytes and close first
            count = struct.unpack("!I", recv_exact(conn, 4))[0]
            conn.sendall(pattern(count))
            conn.shutdown(socket.SHUT_WR)
            return "sent"
        if mode == "rst":         # send N bytes, then reset mid-transfer
            count = struct.unpack("!I", recv_exact(conn, 4))[0]
            conn.sendall(pattern(count))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return "reset"
        if mode == "hold":        # never read (a black hole) until released
            self.release.wait()
            return "released"
        if mode == "watch":       # say "w", read until the tunnel closes us, say how
            conn.sendall(b"w")
            while conn.recv(65536):
                pass
            return "eof"
        return "unknown mode"

    def close(self):
        self.release.set()
        super().close()


def pattern(count):
    block = hashlib.sha256(b"pattern").digest() * 2048   # 64 KiB
    return (block * (count // len(block) + 1))[:count]


def mode(name):
    return name.encode().ljust(8)


def open_tunnel(client, server, behaviour, timeout=30):
    sock = socks5_connect(client.address, server.address, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # small writes go at once
    sock.sendall(mode(behaviour))
    return sock


# --- obfs2 and other bytes a hostile peer sends --------------------------------------

def obfs2_header(initiator, magic=obfs2.MAGIC_VALUE, padlen=0, seed=None):
    """SEED | E(PAD key of the sender, MAGIC | PADLEN) with no padding."""
    seed = seed or os.urandom(obfs2.SEED_LENGTH)
    stream = obfs2.ctr(obfs2.pad_key(seed, initiator))
    return seed + stream.encrypt(struct.pack(">II", magic, padlen))


HTTP_REQUEST = b"GET / HTTP/1.1\r\nHost: example.com\r\nUser-Agent: probe\r\nAccept: */*\r\n\r\n"
HTTP_RESPONSE = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def tls_client_hello(host=b"example.com"):
    """A TLS 1.2 ClientHello with SNI, as a probe or a DPI box would send."""
    sni = struct.pack("!HB H", len(host) + 3, 0, len(host)) + host
    extensions = struct.pack("!HH", 0, len(sni)) + sni
    body = (b"\x03\x03" + os.urandom(32) + b"\x00"                 # version, random, no session
            + struct.pack("!H", 4) + b"\xc0\x2f\x00\x9c"           # two cipher suites
            + b"\x01\x00"                                          # compression: null
            + struct.pack("!H", len(extensions)) + extensions)
    handshake = b"\x01" + struct.pack("!I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack("!H", len(handshake)) + handshake


def tls_server_hello():
    body = b"\x03\x03" + os.urandom(32) + b"\x00" + b"\xc0\x2f" + b"\x00"
    handshake = b"\x02" + struct.pack("!I", len(body))[1:] + body
    return b"\x16\x03\x03" + struct.pack("!H", len(handshake)) + handshake


def not_socks(data):
    """Random bytes that cannot start a SOCKS4 or SOCKS5 greeting."""
    return bytes([data[0] | 0x80]) + data[1:]


def trickle(sock, data, interval=0.25):
    """Send ``data`` a byte at a time on a thread, until it ends or the peer closes.
    The trickles here outlast HS + SLACK: a deadline that each byte renewed
    would show as a close long after it."""
    def run():
        for i in range(len(data)):
            try:
                sock.send(data[i:i + 1])
            except OSError:
                return
            time.sleep(interval)   # the pace of the slow peer, not synchronisation
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# === Bounded handshakes ===================================================================

@pytest.fixture(scope="module")
def dest():
    with Dest() as d:
        yield d


@pytest.fixture(scope="module")
def pair(dest):
    """A server in front of ``dest`` and a SOCKS client, both with a short
    handshake deadline, logging at info (one line per connection)."""
    server = start("server", "--dest=" + fmt(dest.address), "--handshake-timeout=%s" % HS)
    client = start("client", "--handshake-timeout=%s" % HS)
    with server, client:
        yield server, client
    assert_no_traceback(server, client)


def one_line_for_the_connection(node, expected, marker):
    """Wait for the connection's closing line; make a ``marker`` connection
    (whose line is logged after it); then that connection must have exactly one
    log line, the expected one."""
    match = wait_line(node, r"conn (\d+) \(.*: (%s)" % expected)
    number = int(match.group(1))
    marker()
    wait_line(node, r"conn (\d+) \(", after=number)
    lines = conn_lines(node, number)
    assert len(lines) == 1, lines
    assert_no_traceback(node)
    return lines[0]


def server_marker(server):
    def run():
        with socket.create_connection(server.address, timeout=5) as s:
            s.sendall(b"\0" * 64)
            wait_closed(s, 5)
    return run


def socks_marker(client):
    def run():
        with socket.create_connection(client.address, timeout=5) as s:
            s.sendall(b"\0")
            wait_closed(s, 5)
    return run


TIMED_OUT = "handshake timed out"
NOT_OBFS2 = "not obfs2"


def assert_on_time(took, timed_out, what="closed"):
    """A handshake that timed out ended at its deadline (HS), not before and at
    most SLACK late. Any other failure is told from a timeout by its log line
    (and the SOCKS code), not by a clock that a busy machine can stretch."""
    if timed_out:
        assert HS - 0.1 <= took <= HS + SLACK, "%s after %.2f s; deadline %.1f s" % (what, took, HS)


SERVER_PORT_CASES = {
    # name: (bytes sent at once, bytes trickled afterwards, expected log line)
    "silent": (b"", b"", TIMED_OUT),
    "trickling padding": (obfs2_header(True, padlen=8192), os.urandom(8192), TIMED_OUT),
    "trickling header": (b"", os.urandom(23), TIMED_OUT),
    "random bytes": (os.urandom(64), b"", NOT_OBFS2),
    "HTTP request": (HTTP_REQUEST, b"", NOT_OBFS2),
    "TLS ClientHello": (tls_client_hello(), b"", NOT_OBFS2),
    "wrong magic": (obfs2_header(True, magic=obfs2.MAGIC_VALUE ^ 1), b"", "invalid magic"),
    "PADLEN 8193": (obfs2_header(True, padlen=8193), b"", "padding length 8193 exceeds 8192"),
    "half a header, then gone": (os.urandom(10), b"", "peer closed"),
}


@pytest.mark.parametrize("case", sorted(SERVER_PORT_CASES))
def test_server_port_closes_bad_handshakes_within_the_deadline(pair, dest, case):
    server, _ = pair
    drain(server)
    at_once, slowly, expected = SERVER_PORT_CASES[case]
    accepted_before = dest.accepted
    sock = socket.create_connection(server.address, timeout=5)
    with sock:
        sock.sendall(at_once)
        if case == "half a header, then gone":
            sock.shutdown(socket.SHUT_WR)
        elif slowly:
            trickle(sock, slowly)
        took = wait_closed(sock, HS + SLACK + 2)
    assert_on_time(took, timed_out=expected == TIMED_OUT)
    line = one_line_for_the_connection(server, expected, server_marker(server))
    # Never a warning for a peer's mistake. NOTICE or INFO: the first complaint
    # of a kind in COMPLAINT_INTERVAL is a NOTICE (test_a_flood_of_failures...).
    assert re.search(r"\[(INFO|NOTICE)\]", line), line
    assert dest.accepted == accepted_before, "the server touched --dest for a failed handshake"


SOCKS_PORT_CASES = {
    "silent": (b"", b"", TIMED_OUT),
    "trickling SOCKS5": (b"", b"\x05\x01\x00\x05\x01\x00\x03\xc8" + b"a" * 200 + b"\x01\xbb",
                         TIMED_OUT),
    "trickling SOCKS4 user id": (b"\x04\x01\x01\xbb\x7f\x00\x00\x01", b"u" * 200, TIMED_OUT),
    "random bytes": (not_socks(os.urandom(64)), b"", "SOCKS: not a SOCKS4 or SOCKS5 client"),
    "HTTP request": (HTTP_REQUEST, b"", "SOCKS: not a SOCKS4 or SOCKS5 client"),
    "HTTP CONNECT": (b"CONNECT example.com:443 HTTP/1.1\r\n\r\n", b"",
                     "SOCKS: not a SOCKS4 or SOCKS5 client"),
    "TLS ClientHello": (tls_client_hello(), b"", "SOCKS: not a SOCKS4 or SOCKS5 client"),
    "SOCKS4 user id too long": (b"\x04\x01\x01\xbb\x7f\x00\x00\x01" + b"u" * 2000, b"",
                                "SOCKS: SOCKS4 USERID is longer than"),
    "SOCKS5 BIND": (b"\x05\x01\x00\x05\x02\x00\x01\x7f\x00\x00\x01\x01\xbb", b"",
                    "SOCKS: SOCKS5 command 2 is not supported"),
}


@pytest.mark.parametrize("case", sorted(SOCKS_PORT_CASES))
def test_socks_port_closes_bad_handshakes_within_the_deadline(pair, case):
    _, client = pair
    drain(client)
    at_once, slowly, expected = SOCKS_PORT_CASES[case]
    with socket.create_connection(client.address, timeout=5) as sock:
        sock.sendall(at_once)
        if slowly:
            trickle(sock, slowly)
        took = wait_closed(sock, HS + SLACK + 2)
    assert_on_time(took, timed_out=expected == TIMED_OUT)
    one_line_for_the_connection(client, re.escape(expected), socks_marker(client))


def bad_server(send=b"", slowly=b"", close=False):
    """A fake obfs2 server: reads what the client sends, answers ``send``,
    then trickles ``slowly``, or closes at once when ``close``."""
    def behaviour(conn):
        if close:
            return
        conn.sendall(send)
        if slowly:
            trickle(conn, slowly).join()
        while conn.recv(65536):
            pass
    return behaviour


BAD_SERVER_CASES = {
    # name: (fake server, SOCKS5 reply code expected, log line expected)
    "silent": (bad_server(), 0x06, "timed out|deadline"),
    "trickling padding": (bad_server(obfs2_header(False, padlen=8192), os.urandom(8192)), 0x06,
                          "timed out|deadline"),
    "random bytes": (bad_server(os.urandom(64)), 0x01, "invalid magic"),
    "HTTP response": (bad_server(HTTP_RESPONSE), 0x01, "invalid magic"),
    "TLS ServerHello": (bad_server(tls_server_hello()), 0x01, "invalid magic"),
    "wrong magic": (bad_server(obfs2_header(False, magic=0)), 0x01, "invalid magic"),
    "PADLEN 8193": (bad_server(obfs2_header(False, padlen=8193)), 0x01, "padding length 8193"),
    "closes at once": (bad_server(close=True), 0x01, "closed the connection|reset"),
}


@pytest.mark.parametrize("case", sorted(BAD_SERVER_CASES))
def test_client_closes_bad_server_handshakes_within_the_deadline(pair, case):
    """The client's other handshake, towards the obfs2 server, is bounded too,
    and its failure reaches the application as a SOCKS error."""
    _, client = pair
    drain(client)
    behaviour, code, expected = BAD_SERVER_CASES[case]
    with EchoServer(behaviour=behaviour) as fake:
        began = time.monotonic()
        with pytest.raises(SocksReplyError) as failure:
            socks5_connect(client.address, fake.address, timeout=HS + SLACK + 2)
        took = time.monotonic() - began
    assert failure.value.code == code
    assert_on_time(took, timed_out=code == 0x06, what="answered")
    one_line_for_the_connection(client, "obfs2 handshake with the bridge .*failed: .*(%s)"
                                % expected, socks_marker(client))


def test_unanswered_connect_is_bounded_and_blocks_no_one(pair, dest):
    """A server address that never answers (its SYNs are dropped: a listener
    with a full accept queue) costs one connection its deadline; meanwhile
    other tunnels through the same client work."""
    server, client = pair
    blackhole = socket.socket()
    blackhole.bind(("127.0.0.1", 0))
    blackhole.listen(0)
    fillers = []
    try:
        # Fill the accept queue so that further SYNs are dropped, not refused.
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(blackhole.getsockname())
            fillers.append(s)
        probe = socket.socket()
        probe.settimeout(0.5)
        try:
            probe.connect(blackhole.getsockname())
            pytest.skip("this kernel answers SYNs beyond a full accept queue")
        except socket.timeout:
            pass
        finally:
            probe.close()
        outcome = {}

        def doomed():
            began = time.monotonic()
            try:
                socks5_connect(client.address, blackhole.getsockname(), timeout=HS + SLACK + 2)
                outcome["code"] = 0
            except SocksReplyError as exc:
                outcome["code"] = exc.code
            outcome["took"] = time.monotonic() - began
        waiting = threading.Thread(target=doomed)
        waiting.start()
        # While it waits, another tunnel through the same client works.
        with open_tunnel(client, server, "echo") as sock:
            sock.sendall(b"still flowing")
            sock.shutdown(socket.SHUT_WR)
            assert recv_all(sock) == b"still flowing"
        waiting.join(HS + SLACK + 5)
        assert outcome.get("code") == 0x06, outcome       # TTL expired
        assert HS - 0.1 <= outcome["took"] <= HS + SLACK, outcome
    finally:
        for s in fillers:
            s.close()
        blackhole.close()


# === Shared-secret work cannot stall the process ===========================================

def ping(sock, rounds=1):
    """Round-trip times of one byte through an echo tunnel."""
    times = []
    for _ in range(rounds):
        began = time.monotonic()
        sock.sendall(b"p")
        recv_exact(sock, 1)
        times.append(time.monotonic() - began)
    return times


def test_expensive_handshake_steps_run_one_at_a_time():
    """KeyWork: while one expensive step (start or receive) runs, another
    expensive one waits for the slot (here past its deadline), a cheap one
    does not wait, and the slot is free again afterwards. The effect on a live
    tunnel's RTT during a flood is measured in the slow group."""
    key_work = handshake_scheduler.KeyWork()
    first, second, cheap = SlowKeys(), SlowKeys(), SlowKeys(expensive=False)
    second.release.set()
    cheap.release.set()
    a, b = socket.socketpair()
    with a, b:
        holder = threading.Thread(target=proxy.transport_handshake,
                                  args=(a, first, outbound.Deadline(30), key_work), daemon=True)
        holder.start()
        assert first.entered.wait(10)
        with pytest.raises(proxy.Busy, match="waited for this process.s key work"):
            proxy.transport_handshake(b, second, outbound.Deadline(0.2), key_work)
        assert not second.entered.is_set(), "two expensive steps ran at once"
        proxy.transport_handshake(b, cheap, outbound.Deadline(10), key_work)
        assert cheap.entered.is_set()
        first.release.set()
        holder.join(10)
        proxy.transport_handshake(b, second, outbound.Deadline(10), key_work)
        assert second.entered.is_set()


class SlowKeys:
    """A transport whose key work (``start``) sets ``entered`` and then waits
    for ``release``; open at once after it."""

    name, is_open, ProtocolError = "slow-keys", True, Exception

    def __init__(self, expensive=True):
        self.expensive = expensive
        self.entered, self.release = threading.Event(), threading.Event()

    def start(self):
        self.entered.set()
        assert self.release.wait(30)
        return b""


@pytest.mark.slow
def test_shared_secret_flood_does_not_stall_live_tunnels(dest):
    """Every connection to a shared-secret server costs 100000 SHA-256 per MAC
    before the peer is checked. 50 connections at once must not stall a live
    tunnel through the same server (each MAC holds the GIL for ~0.1 s: run
    side by side, 50 of them would starve everything else)."""
    secret = "--shared-secret=flood test"
    server = start("server", "--dest=" + fmt(dest.address), secret)
    client = start("client", secret)
    with server, client, open_tunnel(client, server, "echo") as live:
        live.settimeout(60)
        before = ping(live, 20)
        flood = []
        for _ in range(50):
            s = socket.create_connection(server.address, timeout=60)
            s.sendall(os.urandom(obfs2.HEADER_LENGTH))   # forces both padding MACs
            flood.append(s)
        during, began = [], time.monotonic()
        open_flood = list(flood)
        while open_flood:
            during += ping(live)
            readable = [s for s in open_flood if outbound.ready(s, False, 0)]   # poll: any descriptor
            for s in readable:
                try:
                    if s.recv(65536):
                        continue
                except ConnectionResetError:
                    pass
                open_flood.remove(s)
            assert time.monotonic() - began < 60, "the flood was not handled within 60 s"
        flood_took = time.monotonic() - began
        for s in flood:
            s.close()
        during.sort()
        median, p90 = during[len(during) // 2], during[len(during) * 9 // 10]
        print("\nflood of 50 shared-secret handshakes handled in %.1f s; live tunnel RTT "
              "before: max %.1f ms; during (%d pings): mean %.1f ms, median %.1f ms, 90th "
              "percentile %.1f ms, max %.1f ms"
              % (flood_took, max(before) * 1000, len(during), sum(during) / len(during) * 1000,
                 median * 1000, p90 * 1000, during[-1] * 1000))
        assert len(during) >= 20, "the flood ended too soon to measure anything"
        # The maximum is not asserted: on a shared CI machine any process can be
        # descheduled for a while. A stalled process shows in the median.
        # Measured on 2 cores: mean 3 ms, 90th percentile 4 ms; with no bound on
        # the key work, mean 100-150 ms and 90th percentile 240-360 ms.
        mean = sum(during) / len(during)
        assert mean < 0.04, "mean RTT %.3f s during the flood" % mean
        assert p90 < 0.08, "90th percentile RTT %.3f s during the flood" % p90
        assert_no_traceback(server, client)


# === Bounded resources ===================================================================

def test_max_connections_refuses_cleanly_and_recovers(dest):
    server = start("server", "--dest=" + fmt(dest.address), "--max-connections=3",
                   "--handshake-timeout=60", severity="debug")
    client = start("client")
    began = time.monotonic()
    with server, client:
        held = [open_tunnel(client, server, "echo") for _ in range(3)]   # tunnels, not handshakes
        for sock in held:       # an echo: each is relayed by the server's pump, so counted
            sock.sendall(b"?")
            assert recv_exact(sock, 1) == b"?"
        for _ in range(5):
            with socket.create_connection(server.address, timeout=5) as extra:
                # Refused cleanly: a FIN (EOF), not a hang and not an error.
                extra.settimeout(5)
                assert extra.recv(1) == b""
        server.log.wait_for(r"refusing a connection.*--max-connections")
        # One connection ends: the server takes tunnels again. Its slot is free
        # just after its line is logged, so a tunnel tried at once may still be
        # refused: try until one gets through.
        held.pop().close()
        server.log.wait_for(r"conn \d+ \(.*: closed after")

        def tunnel_again():
            try:
                return open_tunnel(client, server, "echo")
            except SocksReplyError:
                return None

        with wait_until(tunnel_again, 10, "a tunnel once a slot is free") as sock:
            sock.sendall(b"after the cap")
            sock.shutdown(socket.SHUT_WR)
            assert recv_all(sock) == b"after the cap"
        for s in held:
            s.close()
        server.log.wait_for(r"closed after \d+ bytes client->server")
        refusals = [line for line in server.log.rest(0.5) if "refusing a connection" in line]
        # Logged, but not once per refused connection: a flood must not flood the log.
        took = time.monotonic() - began
        assert 1 <= len(refusals) <= 1 + took // listener.Listener.COMPLAINT_INTERVAL, (took, refusals)
    assert_no_traceback(server, client)


LIMITED = r"""
import resource, runpy, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def limited_proxy(limit, *args):
    """``support.Program`` started under a hard descriptor limit."""
    return Program(args[0], *with_transport(args[1:]),
                   interpreter=[sys.executable, "-c", LIMITED, str(limit)])


@needs_proc
def test_out_of_descriptors_fails_single_connections_and_recovers(dest):
    """A server allowed only 40 descriptors: it says so at start; tunnels
    beyond what fits fail one by one (EMFILE on accept or on connect), the
    process carries on, and once tunnels close it serves again."""
    pytest.importorskip("resource")
    server = limited_proxy(40, "server", "127.0.0.1:0", "--dest=" + fmt(dest.address),
                          "--handshake-timeout=%s" % HS, "--log-min-severity=info")
    client = start("client", "--handshake-timeout=%s" % HS)
    with server, client:
        assert any("only 40 file descriptors allowed" in line for line in server.log.lines)
        held, failed, began = [], 0, time.monotonic()
        while failed < 3 and len(held) < 40:
            try:
                sock = open_tunnel(client, server, "echo", timeout=HS + SLACK + 2)
                sock.sendall(b"?")
                sock.settimeout(HS + SLACK + 2)
                if sock.recv(1) == b"?":
                    held.append(sock)
                    continue
                sock.close()
            except (SocksReplyError, OSError):
                pass
            failed += 1
        # About 40 / 2 tunnels fit, less the quarter of the descriptors kept for
        # handshakes that complete (listener.descriptor_ceiling).
        assert failed and len(held) >= 8, (len(held), failed)
        assert server.process.poll() is None
        for sock in held:                     # the survivors still work
            sock.sendall(b"!")
            assert recv_exact(sock, 1) == b"!"
            sock.close()
        wait_until(lambda: thread_count(server.process.pid) == AT_REST, 10, "the server at rest")
        with open_tunnel(client, server, "echo") as sock:
            sock.sendall(b"recovered")
            sock.shutdown(socket.SHUT_WR)
            assert recv_all(sock) == b"recovered"
        lines = server.log.rest(0.3)
        took = time.monotonic() - began
        complaints = [line for line in lines if "accept failed" in line]
        print("\n40 descriptors: %d tunnels held, %d failed, %d 'accept failed' line(s) in %.1f s"
              % (len(held), failed, len(complaints), took))
        # Rate-limited: one line per 10 s (Program.COMPLAINT_INTERVAL), not one per attempt.
        assert len(complaints) <= 1 + took // 10, complaints
    assert_no_traceback(server, client)


@needs_proc
def test_black_hole_holds_bounded_memory_and_blocks_no_one(dest):
    """A destination that stops reading: the tunnel stops taking data (its
    buffers are bounded, so are the processes' memory), and other tunnels
    through the same processes keep flowing."""
    server = start("server", "--dest=" + fmt(dest.address))
    client = start("client")
    with server, client:
        rss = {node: rss_bytes(node.process.pid) for node in (server, client)}
        hole = open_tunnel(client, server, "hold")
        hole.setblocking(False)
        block, sent, stalled_since = os.urandom(1 << 20), 0, None
        while sent < (512 << 20):
            writable = outbound.ready(hole, True, 0.25)
            if not writable:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 1.0:   # 1 s without progress: full
                    break
                continue
            stalled_since = None
            try:
                sent += hole.send(block)
            except BlockingIOError:
                pass
        grown = {node.args[2]: rss_bytes(node.process.pid) - rss[node] for node in rss}
        print("\nblack hole took %.1f MiB before stopping; RSS growth %s"
              % (sent / 2 ** 20, {k: "%.1f MiB" % (v / 2 ** 20) for k, v in grown.items()}))
        assert sent < (256 << 20), "the tunnel kept taking data: %d MiB" % (sent >> 20)
        for name, growth in grown.items():
            assert growth < (32 << 20), "%s grew by %d MiB" % (name, growth >> 20)
        # Others are not blocked: full round trips through the same processes.
        for _ in range(3):
            with open_tunnel(client, server, "echo") as sock:
                payload = os.urandom(300000)
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)
                assert recv_all(sock) == payload
        dest.release.set()
        hole.close()
    dest.release.clear()


# === One side fails: the other side is closed too ================================================

def next_event(dest, timeout=10):
    try:
        return dest.events.get(timeout=timeout)
    except queue.Empty:
        pytest.fail("the destination's connection was not closed within %d s" % timeout)


def drain_events(dest):
    while not dest.events.empty():
        dest.events.get_nowait()


def test_application_reset_closes_the_destination(pair, dest):
    server, client = pair
    drain_events(dest)
    sock = open_tunnel(client, server, "watch")
    assert recv_exact(sock, 1) == b"w"
    sock.sendall(b"x" * 1000)
    reset(sock)
    assert next_event(dest)[0] == "watch"


def test_destination_reset_closes_the_application(pair, dest):
    server, client = pair
    with open_tunnel(client, server, "rst") as sock:
        sock.sendall(struct.pack("!I", 100000))
        assert wait_closed(sock, 10) < 10


def test_server_process_killed_closes_the_application_and_destination(dest):
    """A peer that vanishes whole (its process killed): both ends see the close."""
    server = start("server", "--dest=" + fmt(dest.address))
    client = start("client")
    with client:
        drain_events(dest)
        sock = open_tunnel(client, server, "watch")
        assert recv_exact(sock, 1) == b"w"
        server.process.kill()
        server.stop()
        assert next_event(dest)[0] == "watch"
        assert wait_closed(sock, 10) < 10
        sock.close()
        assert_no_traceback(client)


def test_application_reset_while_backpressured_closes_the_tunnel(dest):
    """The application gives up (RST) on a tunnel whose destination stopped
    reading: the tunnel must end on both proxies, not wait for the black hole."""
    server = start("server", "--dest=" + fmt(dest.address))
    client = start("client")
    with server, client:
        drain_events(dest)
        usage = [Usage(server), Usage(client)]
        hole = open_tunnel(client, server, "hold")
        hole.setblocking(False)
        block, stalled_since = os.urandom(1 << 20), None
        while True:  # fill every buffer on the way
            writable = outbound.ready(hole, True, 0.25)
            if writable:
                stalled_since = None
                try:
                    hole.send(block)
                except BlockingIOError:
                    pass
            else:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 0.5:
                    break
        reset(hole)
        try:
            # relay.IDLE_CHECK (1 s) on each proxy, then Program.SPARE_SECONDS (2 s)
            # before the finished connection threads leave. The black hole holds
            # until ``finally``: any bound proves the tunnel did not wait for it.
            client.log.wait_for(r"conn \d+ \(.*: (Connection reset|closed after)", timeout=20)
            for u in usage:
                u.back_to_baseline(timeout=20)
        finally:
            dest.release.set()
    dest.release.clear()


# === Nothing leaks ==============================================================================

def end_normally(client, server, dest):
    """The application sends, half-closes first, reads the whole echo, closes."""
    with open_tunnel(client, server, "echo") as sock:
        data = os.urandom(20000)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        assert recv_all(sock) == data


def end_destination_first(client, server, dest):
    with open_tunnel(client, server, "send") as sock:
        sock.sendall(struct.pack("!I", 30000))
        assert recv_all(sock) == pattern(30000)


def end_half_close(client, server, dest):
    """The reply comes only after the application's EOF (a half-closed tunnel)."""
    with open_tunnel(client, server, "digest") as sock:
        data = os.urandom(50000)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = recv_all(sock)
        assert answer == hashlib.sha256(data).digest() + struct.pack("!Q", len(data))


def end_application_reset(client, server, dest):
    sock = open_tunnel(client, server, "echo")
    sock.sendall(os.urandom(100000))
    recv_exact(sock, 1000)
    reset(sock)


def end_destination_reset(client, server, dest):
    with open_tunnel(client, server, "rst") as sock:
        sock.sendall(struct.pack("!I", 200000))
        wait_closed(sock, 10)


def end_garbage_to_server(client, server, dest):
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(os.urandom(100))
        wait_closed(sock, 10)


def end_garbage_to_socks(client, server, dest):
    with socket.create_connection(client.address, timeout=10) as sock:
        sock.sendall(HTTP_REQUEST)
        wait_closed(sock, 10)


def end_upstream_not_obfs2(client, server, dest):
    """The SOCKS target is not an obfs2 server: the client's handshake fails."""
    with pytest.raises(SocksReplyError):
        socks5_connect(client.address, dest.address, timeout=10)


def end_refused_server(client, server, dest):
    with pytest.raises(SocksReplyError) as failure:
        socks5_connect(client.address, closed_port(), timeout=10)
    assert failure.value.code == 0x05


def end_application_vanishes_mid_handshake(client, server, dest):
    with socket.create_connection(client.address, timeout=10) as sock:
        sock.sendall(b"\x05\x01\x00\x05\x01")
        recv_exact(sock, 2)
        reset(sock)


ENDINGS = [end_normally, end_destination_first, end_half_close, end_application_reset,
           end_destination_reset, end_garbage_to_server, end_garbage_to_socks,
           end_upstream_not_obfs2, end_refused_server, end_application_vanishes_mid_handshake]

VANISHING_APP = r"""
import socket, struct, sys, time
port, server_port, count = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
held = []
for _ in range(count):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"\x05\x01\x00")
    s.recv(2)
    s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + struct.pack("!H", server_port))
    s.recv(10)
    s.sendall(b"echo    " + b"v" * 300000)   # the echo comes back and is never read
    held.append(s)
print("ready", flush=True)
time.sleep(600)
"""


def vanish(client, server, count):
    """An application process that opens ``count`` tunnels and is killed
    (SIGKILL) with data in flight: the peer vanishes without a goodbye."""
    app = subprocess.Popen([sys.executable, "-c", VANISHING_APP, str(client.address[1]),
                            str(server.address[1]), str(count)], stdout=subprocess.PIPE, text=True)
    try:
        assert app.stdout.readline().strip() == "ready"
    finally:
        app.kill()
        app.wait()
        app.stdout.close()


def end_every_way(client, server, dest, refusing_server, rounds, workers):
    """Run every ending ``rounds`` times over ``workers`` threads, plus tunnels
    to a refused destination, a few silent peers (handshake timeouts) and
    vanishing applications. Returns the number of connections."""
    jobs = [(ending, server) for ending in ENDINGS for _ in range(rounds)]
    jobs += [(end_destination_first_refused, refusing_server)] * rounds
    jobs += [(end_silent, server)] * max(1, rounds // 10)
    random.Random(len(jobs)).shuffle(jobs)          # mixed, the same way every run
    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(ending, client, target, dest) for ending, target in jobs]
        for _ in range(max(1, rounds // 20)):
            vanish(client, server, 20)
        for future in futures:
            future.result()
    return len(jobs) + max(1, rounds // 20) * 20


def end_silent(client, server, dest):
    """Silent on both ports: closed by the handshake deadlines."""
    with socket.create_connection(server.address, timeout=10) as one, \
            socket.create_connection(client.address, timeout=10) as other:
        wait_closed(one, 30)
        wait_closed(other, 30)


def end_destination_first_refused(client, server, dest):
    """The server cannot reach its --dest: the tunnel is closed after the handshake."""
    with socks5_connect(client.address, server.address, timeout=10) as sock:
        assert wait_closed(sock, 10) < 10


@pytest.fixture()
def refusing_server():
    with start("server", "--dest=" + fmt(closed_port())) as node:
        yield node


@needs_proc
def test_nothing_leaks_after_connections_end_every_way(dest, refusing_server):
    server = start("server", "--dest=" + fmt(dest.address), "--handshake-timeout=2")
    client = start("client", "--handshake-timeout=2")
    with server, client:
        end_normally(client, server, dest)            # warm up: lazy imports, first thread
        baseline = [Usage(node) for node in (server, client, refusing_server)]
        began = time.monotonic()
        total = end_every_way(client, server, dest, refusing_server, rounds=12, workers=12)
        took = time.monotonic() - began
        after = [u.back_to_baseline() for u in baseline]
        print("\n%d connections ending %d ways in %.1f s; (fds, threads) before %s, after %s"
              % (total, len(ENDINGS) + 3, took, [(u.fds, u.threads) for u in baseline],
                 after))
        assert_no_traceback(server, client, refusing_server)


# === Idle tunnels cost nothing; vanished peers are noticed ===========================================

@pytest.mark.slow
@needs_proc
def test_idle_tunnels_cost_no_cpu(dest):
    server = start("server", "--dest=" + fmt(dest.address))
    client = start("client")
    with server, client:
        tunnels = []
        try:
            for _ in range(100):
                sock = open_tunnel(client, server, "echo")
                sock.sendall(b"?")
                assert recv_exact(sock, 1) == b"?"      # the relay is running
                tunnels.append(sock)
            assert fd_count(client.process.pid) >= 200
            before = [cpu_seconds(n.process.pid) for n in (server, client)]
            assert all(before), "the CPU counters read nothing: %r" % before   # they started
            time.sleep(10)          # the measuring window
            used = [cpu_seconds(n.process.pid) - b for n, b in zip((server, client), before)]
            print("\n100 idle tunnels for 10 s: server %.3f CPU-s, client %.3f CPU-s" % tuple(used))
            assert sum(used) < 0.1, used
            for sock in tunnels:
                sock.sendall(b"!")
                assert recv_exact(sock, 1) == b"!"      # and they still work
        finally:
            for sock in tunnels:
                sock.close()


@needs_proc
def test_tunnel_sockets_have_keepalive(pair):
    """A peer that vanishes without FIN or RST (power cut, NAT timeout) is only
    noticed by TCP keepalive: every established socket of a tunnel runs a
    keepalive timer (/proc/net/tcp "tr" = 2), on both proxies."""
    server, client = pair
    with open_tunnel(client, server, "echo") as sock:
        sock.sendall(b"k")
        recv_exact(sock, 1)
        for node in (server, client):
            def keepalive(node=node):
                established = [s for s in tcp_sockets(node.process.pid) if s[0] == "ESTABLISHED"]
                # Timer 1 (retransmission, loss probe) may show for a moment after a send.
                return len(established) >= 2 and all(s[1] == 2 for s in established)
            wait_until(keepalive, 5, "keepalive timers on %s's tunnel sockets" % node.args[2])


# === Not an open proxy ========================================================================

def read_startup(args, patterns=("listening on", "cannot listen"), prefix=()):
    """Start the program, return its log lines up to the first of ``patterns``."""
    process = subprocess.Popen([*prefix, sys.executable, PROGRAM, *args], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               cwd=str(ROOT))
    lines = []
    try:
        for line in process.stderr:
            lines.append(line)
            if any(p in line for p in patterns):
                break
    finally:
        process.terminate()
        process.wait(10)
        process.stderr.close()
    return "".join(lines)


def test_socks_listener_defaults_to_loopback():
    """With no <listen>, the client takes 127.0.0.1:1050. We hold that port
    (or someone else does: then the program cannot have it either), so the
    program says which address it tried, every time, and the tests never open
    a fixed port that another run could be using."""
    holder = socket.socket()
    try:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # past a TIME_WAIT
        holder.bind(("127.0.0.1", 1050))
        holder.listen(1)
    except OSError:
        pass   # taken, by a listener: the program's bind fails the same way
    try:
        text = read_startup(["client"])
    finally:
        holder.close()
    assert "cannot listen on 127.0.0.1:1050" in text, text


def only_loopback_up():
    """True when every network interface but lo is down (Linux sysfs)."""
    try:
        for name in os.listdir("/sys/class/net"):
            with open("/sys/class/net/%s/operstate" % name) as f:
                if name != "lo" and f.read().strip() == "up":
                    return False
    except OSError:
        return False
    return True


def test_socks_listener_elsewhere_warns_loudly():
    args = ["client", "0.0.0.0:0"]
    if only_loopback_up():
        prefix = []             # 0.0.0.0 here reaches nothing but loopback
    elif shutil.which("unshare") and subprocess.call(
            ["unshare", "-rn", "true"], stderr=subprocess.DEVNULL) == 0:
        prefix = ["unshare", "-rn"]   # a network namespace of its own: nothing to reach
    else:
        pytest.skip("binding 0.0.0.0 here would open a port beyond loopback")
    text = read_startup(args, prefix=prefix)
    assert "listening on 0.0.0.0:" in text, text
    warning = [line for line in text.splitlines() if "[WARNING]" in line]
    assert warning and "reachable from other machines" in warning[0], text


def test_server_never_connects_where_a_socks_request_asks(pair, dest):
    """A SOCKS request sent to the server's port is garbage to it; and a SOCKS
    request carried *inside* a valid obfs2 stream is only data for --dest."""
    server, _ = pair
    drain(server)
    target = Dest()
    try:
        request = (b"\x05\x01\x00" + b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1")
                   + struct.pack("!H", target.address[1]) + HTTP_REQUEST)
        accepted = dest.accepted
        with socket.create_connection(server.address, timeout=5) as sock:
            sock.sendall(request)
            assert wait_closed(sock, 5) < 1
        server.log.wait_for(r"not obfs2")
        # Inside a real obfs2 handshake: the server forwards the bytes to --dest only.
        client_side = obfs2.Obfs2(initiator=True)
        with socket.create_connection(server.address, timeout=5) as sock:
            sock.sendall(client_side.start())
            received = b""
            while not client_side.is_open:
                chunk = sock.recv(65536)
                assert chunk, "the server closed a valid handshake"
                received += client_side.receive(chunk)
            sock.sendall(client_side.send(mode("echo") + request))
            sock.shutdown(socket.SHUT_WR)
            echoed = received + client_side.receive(recv_all(sock))
        assert echoed == request
        assert dest.accepted == accepted + 1
        assert target.accepted == 0, "the server connected where the SOCKS request said"
    finally:
        target.close()


# === No leaks of who =============================================================================

CLIENT_IP = "127.33.44.55"   # an application address that appears nowhere else
IP_OR_PORT = re.compile(r"\b\d{1,3}(\.\d{1,3}){3}\b|::1|\[[0-9a-f:]+\]")


def from_client_ip(address):
    sock = socket.socket()
    try:
        sock.bind((CLIENT_IP, 0))
    except OSError:
        sock.close()
        pytest.skip("cannot bind %s (only Linux routes all of 127/8 to loopback)" % CLIENT_IP)
    sock.settimeout(10)
    sock.connect(address)
    return sock


def socks_from_client_ip(client, target):
    sock = from_client_ip(client.address)
    sock.sendall(b"\x05\x01\x00\x05\x01\x00\x01" + socket.inet_aton(target[0])
                 + struct.pack("!H", target[1]))
    recv_exact(sock, 2)
    return sock, recv_exact(sock, 10)[1]


@pytest.mark.parametrize("safe", [True, False], ids=["default", "no-safe-logging"])
def test_no_address_in_the_log_unless_asked(safe):
    """The processes' own startup lines show their own addresses; every line about
    a connection scrubs the addresses in it, unless --no-safe-logging. The test has
    its own destination (a shared one once answered a byte string that only a
    stale harness listener could have sent), and says what each process logged
    when the echo differs."""
    extra = () if safe else ("--no-safe-logging",)
    with Dest() as dest:
        server = start("server", "--dest=" + fmt(dest.address), "--handshake-timeout=%s" % HS,
                       *extra, severity="debug")
        client = start("client", "--handshake-timeout=%s" % HS, *extra, severity="debug")
        with server, client:
            lines = talk_through(server, client, dest)
    talk = [line for line in lines if "listening on" not in line and "bridge line for clients" not in line]
    assert any("[DEBUG]" in line for line in talk)
    if safe:
        leaked = [line for line in talk if IP_OR_PORT.search(line)]
        assert not leaked, leaked
    else:
        assert any(CLIENT_IP in line for line in talk), talk


def talk_through(server, client, dest):
    """A whole tunnel, handshake failures, a refused target and a reset mid-transfer:
    the log lines of both processes."""
    sock, code = socks_from_client_ip(client, server.address)       # a whole tunnel
    assert code == 0
    sock.sendall(mode("echo") + b"who?")
    sock.shutdown(socket.SHUT_WR)
    echoed = recv_all(sock)
    assert echoed == b"who?", "echo %r; server said %r; client said %r" % (
        echoed, [line for line in server.log.rest(0.5) if "conn 1 " in line],
        [line for line in client.log.rest(0.5) if "conn 1 " in line])
    sock.close()
    for garbage in (HTTP_REQUEST, b""):                            # handshake failures
        with from_client_ip(server.address) as s:
            s.sendall(garbage)
            wait_closed(s, HS + SLACK + 2)
        with from_client_ip(client.address) as s:
            s.sendall(garbage)
            wait_closed(s, HS + SLACK + 2)
    sock, code = socks_from_client_ip(client, closed_port())        # refused
    assert code == 0x05
    sock.close()
    end_application_reset(client, server, dest)                     # reset mid-transfer
    for node, count in ((server, 4), (client, 5)):
        for _ in range(count):
            node.log.wait_for(r"conn \d+ \(.*: (?!accepted)")
    return server.log.rest(0.3) + client.log.rest(0.3)


# === Clean shutdown ============================================================================

@needs_signals
def test_sigterm_exits_promptly_and_the_port_is_free_at_once(dest):
    server = start("server", "--dest=" + fmt(dest.address))
    client = start("client")
    with client:
        port = server.address[1]
        live = open_tunnel(client, server, "echo")
        live.sendall(b"x")
        recv_exact(live, 1)
        # With the tunnel still open: a graceful stop would wait GRACE_SECONDS (30).
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(10)
        assert server.process.returncode == 0
        server.stop()
        wait_closed(live, 5)
        live.close()
        with Program("server", "--transport=obfs2", "127.0.0.1:%d" % port,
                     "--dest=" + fmt(dest.address)) as rebound:
            assert rebound.address[1] == port
            with open_tunnel(client, rebound, "echo") as sock:
                sock.sendall(b"rebound")
                sock.shutdown(socket.SHUT_WR)
                assert recv_all(sock) == b"rebound"


@needs_signals
def test_first_sigint_drains_live_tunnels_second_exits(dest):
    server = start("server", "--dest=" + fmt(dest.address))
    client = start("client")
    with server, client:
        first = open_tunnel(client, server, "echo")
        second = open_tunnel(client, server, "echo")
        for sock in (first, second):
            sock.sendall(b"1")
            recv_exact(sock, 1)
        server.process.send_signal(signal.SIGINT)
        server.log.wait_for(r"\[NOTICE\] stopped accepting; waiting for 2 live connection\(s\), at most "
                            r"30 s \(interrupt again to stop now\)")
        assert_refused(server.address, timeout=0)    # no longer accepting after SIGINT
        # The live tunnels go on; the first one finishes...
        first.sendall(b"first goes on")
        first.shutdown(socket.SHUT_WR)
        assert recv_all(first) == b"first goes on"
        first.close()
        server.log.wait_for(r"closed after")
        # ...and the second keeps working after that.
        assert server.process.poll() is None, "exited with a tunnel still live"
        payload = os.urandom(200000)
        second.sendall(payload)
        assert recv_exact(second, len(payload)) == payload
        second.shutdown(socket.SHUT_WR)
        assert recv_all(second) == b""
        second.close()
        # The last tunnel gone, it exits by itself.
        server.process.wait(5)
        assert server.process.returncode == 0
        # A second SIGINT ends it even with a live tunnel.
        other = start("server", "--dest=" + fmt(dest.address))
        with other:
            live = open_tunnel(client, other, "echo")
            live.sendall(b"2")
            recv_exact(live, 1)
            other.process.send_signal(signal.SIGINT)
            other.log.wait_for(r"stopped accepting; waiting for 1 live")
            other.process.send_signal(signal.SIGINT)
            other.process.wait(10)      # with the tunnel still live: well before GRACE_SECONDS
            wait_closed(live, 5)
            live.close()
    assert_no_traceback(server, client, other)


# === The answer-later rule (a shared-secret server does no key work for a bare connect) ===



SECRET, ROUNDS = "correct horse", 2000


def secret_server(dest, *extra):
    return Program("server", "--transport=obfs2", "--dest=" + fmt(dest), "127.0.0.1:0", *extra)


def test_plain_server_speaks_first():
    """Without a secret the server sends its handshake at once, as obfs4proxy
    does and as clients may expect."""
    with EchoServer() as echo, secret_server(echo.address) as node:
        with socket.create_connection(node.address, timeout=5) as sock:
            assert len(recv_exact(sock, obfs2.HEADER_LENGTH)) == obfs2.HEADER_LENGTH


def test_secret_server_answers_only_after_the_client_proved_the_secret():
    with EchoServer() as echo, secret_server(echo.address, "--shared-secret=" + SECRET,
                                             "--ss-hash-iterations=%d" % ROUNDS,
                                             "--handshake-timeout=1.5") as node:
        # A bare connect: all the server ever sends on it, until its handshake
        # deadline closes it, is nothing.
        with socket.create_connection(node.address, timeout=20) as sock:
            assert recv_all(sock) == b"", "the server answered a bare connect"
        with socket.create_connection(node.address, timeout=20) as sock:
            client = obfs2.Obfs2(True, shared_secret=SECRET, hash_iterations=ROUNDS)
            sock.sendall(client.start())
            while not client.is_open:               # the server's answer now arrives...
                data = sock.recv(65536)
                assert data, "the server closed instead of answering"
                assert client.receive(data) == b""
            sock.sendall(client.send(b"ping"))      # ...and it carries the tunnel
            assert client.receive(recv_exact(sock, 4)) == b"ping"


def derivation_cpu_seconds(iterations=obfs2.HASH_ITERATIONS):
    """CPU seconds of one shared-secret key derivation here (the best of 3)."""
    secret_hash = hashlib.sha256(SECRET.encode()).digest()
    best = None
    for _ in range(3):
        began = time.process_time()
        obfs2.pad_key(os.urandom(obfs2.SEED_LENGTH), False, secret_hash, iterations)
        took = time.process_time() - began
        best = took if best is None else min(best, took)
    return best


@needs_proc
def test_bare_connects_cost_a_secret_server_no_key_work():
    """Each bare connect used to cost the server a key derivation (100,000
    SHA-256, one at a time), so a trickle of them starved real clients past
    their deadline. Now 40 bare connects cost less CPU time than 5 derivations,
    counted from one moment of rest to the next (only the main thread left:
    connection threads and any background key work have ended), so work moved
    off the connection's thread counts too. CPU time, not wall time: a busy
    machine does not change it. Then a real client gets through."""
    one = derivation_cpu_seconds()
    with EchoServer() as echo, secret_server(echo.address, "--shared-secret=" + SECRET,
                                             "--log-min-severity=info") as node:
        pid = node.process.pid

        def at_rest():
            return thread_count(pid) == AT_REST

        wait_until(at_rest, 30, "the server at rest before")
        before = cpu_seconds(pid)
        for _ in range(40):
            socket.create_connection(node.address, timeout=10).close()
        for _ in range(40):
            node.log.wait_for(r"conn \d+ \(")      # each bare connect's one line: it is over
        wait_until(at_rest, 30, "the server at rest after")
        used = cpu_seconds(pid) - before
        print("\n40 bare connects: %.3f CPU-s on the server; one derivation here: %.3f CPU-s"
              % (used, one))
        assert used < 5 * one, "40 bare connects cost %.2f CPU-s (%.1f derivations)" % (used, used / one)
        with socket.create_connection(node.address, timeout=30) as sock:
            client = obfs2.Obfs2(True, shared_secret=SECRET)
            sock.sendall(client.start())
            while not client.is_open:
                data = sock.recv(65536)
                assert data, "the server closed instead of answering"
                client.receive(data)


# === Failures that say something at the default level ====================================================
#
# At the default log level (no --log-min-severity) a user must be told which hop
# failed and why, but a flood of failures must not flood the log: one NOTICE per
# kind and Program.COMPLAINT_INTERVAL, the rest at INFO.

def at_default_level(role, *args):
    return Program(role, "127.0.0.1:0", *with_transport(args))


def test_default_level_says_the_server_cannot_reach_dest():
    with reserved_port() as nobody:
        port = nobody.getsockname()[1]
        with at_default_level("server", "--dest=127.0.0.1:%d" % port) as server, \
                at_default_level("client") as client:
            with socks5_connect(client.address, server.address, timeout=20) as sock:
                wait_closed(sock, 20)
            server.log.wait_for(r"\[NOTICE\] conn 1 \(\[scrubbed\]\): cannot reach --dest "
                                r"127\.0\.0\.1:%d: connection refused$" % port)


def test_default_level_says_the_client_cannot_reach_the_server():
    with reserved_port() as nobody, at_default_level("client") as client:
        with pytest.raises(SocksReplyError) as failure:
            socks5_connect(client.address, nobody.getsockname(), timeout=20)
        assert failure.value.code == 0x05
        client.log.wait_for(r"\[NOTICE\] conn 1 \(\[scrubbed\]\): cannot reach the obfs2 bridge "
                            r"\[scrubbed\]: connection refused$")


def test_default_level_says_the_fixed_client_cannot_reach_its_dest():
    with reserved_port() as nobody, at_default_level("client", "--dest=" + fmt(nobody.getsockname())) \
            as client:
        with socket.create_connection(client.address, timeout=20) as sock:
            wait_closed(sock, 20)
        client.log.wait_for(r"\[NOTICE\] conn 1 \(\[scrubbed\]\): cannot reach the obfs2 bridge "
                            r"\[scrubbed\]: connection refused$")


def test_default_level_says_the_server_is_not_obfs2():
    with EchoServer(behaviour=bad_server(HTTP_RESPONSE)) as web, at_default_level("client") as client:
        with pytest.raises(SocksReplyError) as failure:
            socks5_connect(client.address, web.address, timeout=20)
        assert failure.value.code == 0x01
        client.log.wait_for(r"\[NOTICE\] conn 1 \(\[scrubbed\]\): obfs2 handshake with the bridge "
                            r"\[scrubbed\] failed: invalid magic value 0x[0-9a-f]{8} \(wrong protocol, "
                            r"or a different shared secret\)$")


def test_default_level_says_a_different_secret_on_both_sides(dest):
    fast = "--ss-hash-iterations=10"
    with at_default_level("server", "--dest=" + fmt(dest.address), "--shared-secret=ours", fast) \
            as server, at_default_level("client", "--shared-secret=theirs", fast) as client:
        with pytest.raises(SocksReplyError) as failure:
            socks5_connect(client.address, server.address, timeout=20)
        assert failure.value.code == 0x01
        server.log.wait_for(r"\[NOTICE\] conn 1 \(\[scrubbed\]\): not obfs2: invalid magic value "
                            r"0x[0-9a-f]{8} \(wrong protocol, or a different shared secret\); "
                            r"closed after \d+ s$")
        client.log.wait_for(r"\[NOTICE\] conn 1 \(\[scrubbed\]\): obfs2 handshake with the bridge "
                            r"\[scrubbed\] failed: ")


FLOOD = 25


def test_a_flood_of_failures_gives_one_notice_line_per_kind_and_interval(dest):
    """At info every failed connection has its line, but only the first of
    its kind in COMPLAINT_INTERVAL is a NOTICE: the default level shows one."""
    with start("server", "--dest=" + fmt(dest.address)) as server:
        began = time.monotonic()
        for _ in range(FLOOD):
            with socket.create_connection(server.address, timeout=10) as sock:
                sock.sendall(obfs2_header(True, magic=obfs2.MAGIC_VALUE ^ 1))
                wait_closed(sock, 10)
        lines = [server.log.wait_for(r"conn \d+ \(.*: not obfs2: invalid magic").string
                 for _ in range(FLOOD)]
        took = time.monotonic() - began
    notices = [line for line in lines if "[NOTICE]" in line]
    infos = [line for line in lines if "[INFO]" in line]
    assert len(notices) + len(infos) == FLOOD, lines
    assert 1 <= len(notices) <= 1 + took // listener.Listener.COMPLAINT_INTERVAL, (took, notices)


# === Load and soak: the slow group (python3 -m pytest -m slow) ===================
#
# Load and soak, the slow group: ``python -m pytest -m slow``.
#
# * 10,000 connections that end every way, then descriptors, threads and
#   CLOSE_WAIT sockets back to their baseline, while the streams that end
#   normally are checked byte for byte;
# * 1,000 concurrent tunnels through one client and one server, every stream
#   checked by SHA-256, with both proxies holding more than 1,100 descriptors
#   (and having raised their own descriptor limit from a soft 1024);
# * a 1 GiB stream through obfs2, byte-exact, with the proxies' memory bounded.
#
# Each test prints its figures (run with ``-s`` to see them), with the helpers above.

_Selector = getattr(selectors, "PollSelector", selectors.DefaultSelector)


@pytest.mark.slow
@needs_proc
def test_ten_thousand_connections_ending_every_way_leave_nothing_behind():
    with Dest() as dest:
        server = start("server", "--dest=" + fmt(dest.address), "--handshake-timeout=5")
        client = start("client", "--handshake-timeout=5")
        refusing = start("server", "--dest=" + fmt(closed_port()))
        with server, client, refusing:
            end_normally(client, server, dest)           # warm up
            baseline = [Usage(node) for node in (server, client, refusing)]
            began = time.monotonic()
            total = 0
            while total < 10000:                         # batches, to watch progress
                total += end_every_way(client, server, dest, refusing, rounds=100, workers=24)
            took = time.monotonic() - began
            after = [u.back_to_baseline(timeout=60) for u in baseline]
            print("\n%d connections ending every way in %.1f s (%.0f/s); (fds, threads) "
                  "before %s, after %s; no CLOSE_WAIT"
                  % (total, took, total / took, [(u.fds, u.threads) for u in baseline],
                     after))
            assert_no_traceback(server, client, refusing)


# --- 1,000 concurrent tunnels ---------------------------------------------------------------

class SelectorEcho:
    """An echo service on one thread: a thousand connections, no thousand threads."""

    def __init__(self):
        self.listener = listening_socket(backlog=1024)
        self.listener.setblocking(False)
        self.address = self.listener.getsockname()
        self._stop_r, self._stop_w = socket.socketpair()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        selector = _Selector()
        selector.register(self.listener, selectors.EVENT_READ)
        selector.register(self._stop_r, selectors.EVENT_READ)
        state = {}                                   # conn -> [pending bytearray, eof]
        try:
            while True:
                for key, events in selector.select():
                    sock = key.fileobj
                    if sock is self._stop_r:
                        return
                    if sock is self.listener:
                        self._accept(selector, state)
                        continue
                    pending, eof = state[sock]
                    if events & selectors.EVENT_READ:
                        try:
                            data = sock.recv(262144)
                        except (BlockingIOError, InterruptedError):
                            data = None
                        if data:
                            pending += data
                        elif data is not None:
                            eof = state[sock][1] = True
                    if pending:
                        try:
                            del pending[:sock.send(pending)]
                        except BlockingIOError:
                            pass
                    if eof and not pending:
                        selector.unregister(sock)
                        sock.close()
                        del state[sock]
                        continue
                    wanted = (selectors.EVENT_READ if not eof and len(pending) < (1 << 20) else 0) \
                        | (selectors.EVENT_WRITE if pending else 0)
                    selector.modify(sock, wanted)
        finally:
            for sock in state:
                sock.close()
            selector.close()

    def _accept(self, selector, state):
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            state[conn] = [bytearray(), False]
            selector.register(conn, selectors.EVENT_READ)

    def close(self):
        self._stop_w.send(b"x")
        self.thread.join(10)
        self.listener.close()
        self._stop_r.close()
        self._stop_w.close()


def open_files_limit(pid):
    return proc_number(pid, "limits", "Max open files", column=3)


@pytest.fixture()
def descriptors():
    """Room for 1,000 tunnels in this process (2,000 sockets and more), and
    the proxies started with a soft limit of 1024 so that they must raise
    their own. Guarded: POSIX only, and only as far as the hard limit allows."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if room < 2300:
        pytest.skip("the hard descriptor limit (%d) is too low for 1,000 tunnels" % hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))

    def with_soft_1024(starter):
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        try:
            return starter()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))
    yield with_soft_1024
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
@needs_proc
def test_thousand_concurrent_tunnels_each_checked_by_sha256(descriptors):
    count, size = 1000, 64 * 1024
    echo = SelectorEcho()
    try:
        server = descriptors(lambda: start("server", "--dest=" + fmt(echo.address)))
        client = descriptors(lambda: start("client"))
        with server, client:
            limits = [open_files_limit(node.process.pid) for node in (server, client)]
            assert min(limits) > 2100, "the proxies did not raise their descriptor limit: %s" % limits
            began = time.monotonic()
            with ThreadPoolExecutor(16) as pool:
                tunnels = list(pool.map(lambda _: socks5_connect(client.address, server.address),
                                        range(count)))
            opened = time.monotonic() - began
            # All 1,000 are open at once, through both processes, and hold no thread each:
            # one pump carries them all (plus the handshake threads still waiting for work).
            # (The burst's handshake threads leave within SPARE_SECONDS; wait for that.)
            spare = listener.Listener.SPARE_THREADS + 4
            for node in (server, client):
                wait_until(lambda pid=node.process.pid: thread_count(pid) <= spare,
                           listener.Listener.SPARE_SECONDS + 10, "%s's handshake threads gone" % node.args[2])
            held = {node.args[2]: (fd_count(node.process.pid), thread_count(node.process.pid))
                    for node in (server, client)}
            for name, (fds, threads) in held.items():
                assert fds > 2000 and threads <= spare, (name, fds, threads)
            began = time.monotonic()
            checked = pump_and_check(tunnels, size, deadline=180)
            moved = time.monotonic() - began
            print("\n%d concurrent tunnels opened in %.1f s; (fds, threads) held %s; soft "
                  "limits raised to %s; %d x %d KiB echoed and SHA-256-checked in %.1f s"
                  % (count, opened, held, limits, checked, size // 1024, moved))
            assert checked == count
            assert_no_traceback(server, client)
    finally:
        echo.close()


def pump_and_check(tunnels, size, deadline):
    """Send each tunnel its own random bytes, half-close, read the echo to EOF
    and compare SHA-256, all at once on one selector. Returns how many matched."""
    selector = _Selector()
    state = {}
    for sock in tunnels:
        data = os.urandom(size)
        sock.setblocking(False)
        state[sock] = {"out": memoryview(data), "want": hashlib.sha256(data).digest(),
                       "got": hashlib.sha256(), "n": 0}
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    matched, end = 0, time.monotonic() + deadline
    try:
        while state:
            assert time.monotonic() < end, "%d tunnels unfinished after %d s" % (len(state), deadline)
            for key, events in selector.select(timeout=5):
                sock, s = key.fileobj, state[key.fileobj]
                if events & selectors.EVENT_WRITE and s["out"]:
                    try:
                        s["out"] = s["out"][sock.send(s["out"][:65536]):]
                    except BlockingIOError:
                        pass
                    if not s["out"]:
                        sock.shutdown(socket.SHUT_WR)
                        selector.modify(sock, selectors.EVENT_READ)
                if events & selectors.EVENT_READ:
                    try:
                        data = sock.recv(262144)
                    except BlockingIOError:
                        continue
                    if data:
                        s["got"].update(data)
                        s["n"] += len(data)
                        continue
                    assert s["n"] == size and s["got"].digest() == s["want"], \
                        "a stream came back altered (%d of %d bytes)" % (s["n"], size)
                    matched += 1
                    selector.unregister(sock)
                    sock.close()
                    del state[sock]
    finally:
        for sock in state:
            sock.close()
        selector.close()
    return matched


# --- 1 GiB -------------------------------------------------------------------------------------

def keystream(seed, chunk, total):
    """``total`` pseudo-random bytes (AES-CTR of zeros), ``chunk`` at a time."""
    cipher = AES.new(hashlib.sha256(seed).digest()[:16], AES.MODE_CTR, nonce=b"")
    zeros = bytes(chunk)
    for _ in range(total // chunk):
        yield cipher.encrypt(zeros)


@pytest.mark.slow
@needs_proc
def test_one_gib_stream_arrives_byte_exact():
    total, chunk = 1 << 30, 1 << 20
    with Dest() as dest:
        server = start("server", "--dest=" + fmt(dest.address))
        client = start("client")
        with server, client:
            rss = {node: rss_bytes(node.process.pid) for node in (server, client)}
            sock = socks5_connect(client.address, server.address, timeout=120)
            with sock:
                sock.sendall(mode("digest"))
                sent = hashlib.sha256()
                began = time.monotonic()
                for block in keystream(b"one gibibyte", chunk, total):
                    sock.sendall(block)
                    sent.update(block)
                sock.shutdown(socket.SHUT_WR)
                answer = recv_exact(sock, 40)
                took = time.monotonic() - began
            grown = {node.args[2]: (rss_bytes(node.process.pid) - before) >> 20
                     for node, before in rss.items()}
        digest, count = answer[:32], struct.unpack("!Q", answer[32:])[0]
        print("\n1 GiB through obfs2 in %.1f s: %.0f MB/s; RSS growth %s MiB"
              % (took, total / took / 1e6, grown))
        assert count == total
        assert digest == sent.digest()
        for name, growth in grown.items():
            assert growth < 64, "%s grew by %d MiB moving 1 GiB" % (name, growth)


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e12", "-1"])
def test_a_handshake_timeout_that_no_timer_takes_is_refused_at_start(value):
    """--handshake-timeout=inf (or nan, or more than a day) passed the check once and
    then failed every connection as an internal error; now it is one line, exit 2."""
    result = subprocess.run([sys.executable, PROGRAM, "server", "--transport=dummy",
                             "--dest=127.0.0.1:1", "--handshake-timeout=" + value, "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--handshake-timeout" in lines[0], lines
