"""listener.py: the accept loop, handshake threads, the pump, and how tunnels end.

In-process tests drive a ``listener.Listener`` on 127.0.0.1 with the real
handlers (proxy.py) and the dummy or obfs2 transport, and watch it from inside
(its counters, this process's threads, its log records). The probe-resistance
tests run the real program: our obfs4 client and server as subprocesses, with
a relay between them that can flip one bit, and watch how the bridge closes.
"""

import contextlib
import logging
import os
import socket
import struct
import threading
import time

import pytest
from support import EchoServer, Program, fmt, recv_all, recv_exact, socks5_connect, socks5_request, wait_until

import handshake_scheduler
import listener
import process_setup
import proxy

WAIT = 10.0


def serving(settings, handler=proxy.handle_server, **attributes):
    """A Listener in this process serving ``settings`` on a thread:
    (the Listener, its address, the thread)."""
    node = listener.Listener(max_connections=10000, pool_size=0)
    for name, value in attributes.items():
        setattr(node, name, value)
    address = node.listen(("127.0.0.1", 0), handler, settings)
    thread = threading.Thread(target=node.serve, daemon=True)
    thread.start()
    assert node.ready.wait(WAIT)
    return node, address, thread


def named_threads(prefix):
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


@pytest.fixture
def dummy_pair():
    """An in-process dummy server in front of an echo, and a SOCKS client:
    (client address, server address, server Listener, client Listener)."""
    echo = EchoServer(backlog=1024)
    server, server_address, server_thread = serving(
        proxy.Settings("dummy", dest=echo.address), SPARE_SECONDS=0.2)
    client, client_address, client_thread = serving(
        proxy.Settings("dummy"), proxy.handle_socks_client, SPARE_SECONDS=0.2)
    yield client_address, server_address, server, client
    for node, thread in ((server, server_thread), (client, client_thread)):
        node.stop()
        thread.join(WAIT)
    echo.close()


def socks_echo(client_address, server_address, payload=b"hello"):
    sock = socks5_connect(client_address, server_address)
    sock.sendall(payload)
    assert recv_exact(sock, len(payload)) == payload
    return sock


# --- Threads: one per handshake, none per tunnel ---------------------------------------

def test_a_live_tunnel_holds_no_thread_and_still_carries_data_both_ways(dummy_pair):
    """Once the handshake is done, the handshake thread goes (after SPARE_SECONDS):
    the tunnel lives in the pump, however long it stays, quiet or busy."""
    client_address, server_address, server, client = dummy_pair
    sock = socks_echo(client_address, server_address)
    wait_until(lambda: not named_threads("conn-"), what="the handshake threads gone")
    assert server.live == 1 and client.live == 1
    assert len(named_threads("pump-")) == 2          # one pump in each listener
    sock.sendall(b"after a quiet spell")
    assert recv_exact(sock, 19) == b"after a quiet spell"
    big = bytes(range(256)) * 4096                   # 1 MiB through the pump
    writer = threading.Thread(target=sock.sendall, args=(big,), daemon=True)
    writer.start()
    assert recv_exact(sock, len(big)) == big
    writer.join(WAIT)
    assert not named_threads("conn-")
    sock.close()
    wait_until(lambda: server.live == 0 and client.live == 0, what="the tunnel ended on both")


def test_closing_many_tunnels_at_once_wakes_no_thread_per_tunnel(dummy_pair):
    client_address, server_address, server, client = dummy_pair
    socks = [socks_echo(client_address, server_address, b"x") for _ in range(150)]
    wait_until(lambda: not named_threads("conn-"), what="the handshake threads gone")
    peak, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], len(named_threads("conn-")) + len(named_threads("pump-")))
            time.sleep(0.001)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for sock in socks:
        sock.close()
    wait_until(lambda: server.live == 0 and client.live == 0, timeout=30, what="every tunnel ended")
    done.set()
    watcher.join(WAIT)
    assert peak[0] <= 2, "%d threads woke to close 150 tunnels" % peak[0]


def test_a_pump_at_rest_goes_and_comes_back():
    """A proxy with no tunnel holds no pump thread (nor its descriptors); the
    next tunnel brings one back."""
    with EchoServer() as echo:
        server, address, thread = serving(proxy.Settings("dummy", dest=echo.address))
        try:
            for round_ in range(2):
                with socket.create_connection(address, timeout=WAIT) as sock:
                    sock.sendall(b"round %d" % round_)
                    sock.shutdown(socket.SHUT_WR)
                    assert recv_all(sock) == b"round %d" % round_
                wait_until(lambda: server.live == 0, what="the tunnel ended")
                assert len(named_threads("pump-")) == 1
                wait_until(lambda: not named_threads("pump-"), timeout=2 * WAIT,
                           what="the idle pump thread gone")
        finally:
            server.stop()
            thread.join(WAIT)


def test_thread_start_failure_closes_that_connection_only(monkeypatch, caplog):
    """threading.Thread.start fails for the 2nd and 3rd handshake thread (as it
    does when the OS refuses a thread): those connections are closed with a reset
    and an error line; the others, and the live tunnel, carry on."""
    with EchoServer() as echo:
        node, address, thread = serving(proxy.Settings("dummy", dest=echo.address, handshake_timeout=5),
                                        SPARE_THREADS=0)   # each handshake needs a new thread
        real = threading.Thread
        starts = {"conn": 0}

        class FlakyThread(real):
            def start(self):
                if self.name.startswith("conn-"):
                    starts["conn"] += 1
                    if starts["conn"] in (2, 3):
                        raise RuntimeError("can't start new thread")
                super().start()

        monkeypatch.setattr(listener.threading, "Thread", FlakyThread)
        try:
            with caplog.at_level(logging.INFO, logger="obfsproxy"):
                first = socket.create_connection(address, timeout=WAIT)
                first.sendall(b"one")
                assert recv_exact(first, 3) == b"one"
                for _ in range(2):    # reset: seen by recv, or already by connect on loopback
                    with pytest.raises(ConnectionResetError):
                        with socket.create_connection(address, timeout=WAIT) as doomed:
                            doomed.recv(1)
                with socket.create_connection(address, timeout=WAIT) as fourth:
                    fourth.sendall(b"four")
                    fourth.shutdown(socket.SHUT_WR)
                    assert recv_all(fourth) == b"four"
                first.sendall(b"still one")            # the first tunnel was not disturbed
                first.shutdown(socket.SHUT_WR)
                assert recv_all(first) == b"still one"
                first.close()
                wait_until(lambda: node.live == 0, what="all connections finished")
            errors = [r.getMessage() for r in caplog.records if "cannot start a thread" in r.getMessage()]
            assert len(errors) == 2, errors
        finally:
            monkeypatch.undo()
            node.stop()
            thread.join(WAIT)
        assert not thread.is_alive()


def test_no_pump_for_a_tunnel_closes_it_with_a_reset_and_a_line(monkeypatch, caplog):
    """If the pump cannot take a tunnel (no thread, no descriptor), that tunnel is
    reset and said, never left open or silently dropped."""
    with EchoServer() as echo:
        node, address, thread = serving(proxy.Settings("dummy", dest=echo.address))

        def refuse(relay, on_end):
            raise RuntimeError("no descriptor for the pump: Too many open files")
        try:
            with caplog.at_level(logging.INFO, logger="obfsproxy"):
                monkeypatch.setattr(listener.relay_.Pump, "add", lambda self, *a: refuse(*a))
                with pytest.raises(ConnectionResetError):   # by recv, or already by connect
                    with socket.create_connection(address, timeout=WAIT) as sock:
                        sock.recv(1)
                wait_until(lambda: node.live == 0, what="the connection counted out")
            lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            assert any("cannot relay" in line and "Too many open files" in line for line in lines), lines
        finally:
            monkeypatch.undo()
            node.stop()
            thread.join(WAIT)


# --- Stopping ------------------------------------------------------------------------

def test_graceful_stop_waits_for_live_tunnels_at_most_grace_seconds(caplog):
    """The first Ctrl-C: a tunnel that never ends holds the stop only
    GRACE_SECONDS (here 1 s), and the user is told how to stop at once. Then the
    tunnel is cut with a reset: a truncated stream must never look complete."""
    with EchoServer() as echo, caplog.at_level(logging.INFO, logger="obfsproxy"):
        node, address, thread = serving(proxy.Settings("dummy", dest=echo.address), GRACE_SECONDS=1.0)
        with socket.create_connection(address, timeout=WAIT) as live:
            live.sendall(b"x")
            assert recv_exact(live, 1) == b"x"
            node.stop(graceful=True)
            thread.join(20)
            assert not thread.is_alive(), "still waiting for the live tunnel"
            with pytest.raises(ConnectionResetError):
                live.recv(1)
    messages = [r.getMessage() for r in caplog.records]
    assert ("stopped accepting; waiting for 1 live connection(s), at most 1 s "
            "(interrupt again to stop now)") in messages
    assert any("reset: stopped with the tunnel open" in m for m in messages), messages


def test_a_tunnel_that_ends_during_a_graceful_stop_ends_cleanly(caplog):
    with EchoServer() as echo, caplog.at_level(logging.INFO, logger="obfsproxy"):
        node, address, thread = serving(proxy.Settings("dummy", dest=echo.address), GRACE_SECONDS=30.0)
        with socket.create_connection(address, timeout=WAIT) as live:
            live.sendall(b"x")
            assert recv_exact(live, 1) == b"x"
            node.stop(graceful=True)
            live.sendall(b"yz")                     # still served while it drains
            live.shutdown(socket.SHUT_WR)
            assert recv_all(live) == b"yz"          # then a clean end: EOF, no reset
        thread.join(20)
        assert not thread.is_alive()


def test_graceful_stop_when_idle_stops_at_once(caplog):
    """No live tunnel: nothing to wait for, and nothing said about waiting."""
    with EchoServer() as echo, caplog.at_level(logging.DEBUG, logger="obfsproxy"):
        node, address, thread = serving(proxy.Settings("dummy", dest=echo.address))
        node.stop(graceful=True)
        thread.join(WAIT)     # GRACE_SECONDS is 30: returning at all within 10 s is "at once"
        assert not thread.is_alive()
    assert not [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]


# --- What the log says -------------------------------------------------------------

def test_complaints_are_rate_limited_per_kind_and_text(caplog):
    """A repeated failure is said once per interval; a second, different mistake
    of the same kind is said at once (the user who fixed one and made another
    must see it), up to COMPLAINT_TEXTS texts of a kind per interval."""
    node = listener.Listener(pool_size=0)
    node.COMPLAINT_INTERVAL, node.COMPLAINT_TEXTS = 3600.0, 2
    with caplog.at_level(logging.DEBUG, logger="obfsproxy"):
        for i in range(3):
            node.complain("args", "conn %d: missing iat-mode" % i, text="missing iat-mode")
        node.complain("args", "conn 3: a cert of 69 characters", text="bad cert")   # another text
        node.complain("args", "conn 4: no username", text="no cert")   # past COMPLAINT_TEXTS
        node.complain("socks", "conn 5: socks 0", text="socks 0")      # another kind: its own NOTICE
        node.complain("full", "full 0", logging.WARNING, rest=None, text="full")
        node.complain("full", "full 1", logging.WARNING, rest=None, text="full")  # rest=None: not at all
        node.COMPLAINT_INTERVAL = 0.0                            # the interval has passed
        node.complain("args", "conn 6: missing iat-mode", text="missing iat-mode")
    seen = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert seen == [("NOTICE", "conn 0: missing iat-mode"), ("INFO", "conn 1: missing iat-mode"),
                    ("INFO", "conn 2: missing iat-mode"), ("NOTICE", "conn 3: a cert of 69 characters"),
                    ("INFO", "conn 4: no username"), ("NOTICE", "conn 5: socks 0"),
                    ("WARNING", "full 0"),
                    ("NOTICE", "conn 6: missing iat-mode (and 2 more like this in the last 0 s)")], seen


def test_two_different_mistakes_in_a_row_are_both_said_at_the_default_level():
    """A SOCKS client that gets the obfs4 arguments wrong twice, differently,
    within a second: the user sees both reasons at once (not one, then silence)."""
    with Program("client", "--transport=obfs4", "127.0.0.1:0") as client:
        for args in ("cert=%s" % ("A" * 70), "cert=AAAA;iat-mode=0"):
            try:
                socks5_connect(client.address, ("127.0.0.1", 9), args=args, timeout=WAIT).close()
            except Exception:   # the failure reply: what matters here is the log
                pass
        client.log.wait_for(r"\[NOTICE\] conn 1 .*bad obfs4 arguments")
        client.log.wait_for(r"\[NOTICE\] conn 2 .*bad obfs4 arguments")


# --- Probe resistance: a bridge closes a broken stream with a FIN, on every path ---------

class BitFlipper:
    """A TCP relay between our obfs4 client and our obfs4 server that, once
    ``arm()``ed, flips one bit of the next chunk going to the server (in the
    Poly1305 tag of its first frame, so that the frame check fails at once), and
    records how the server then closed its side: "FIN" or "RST"."""

    def __init__(self, server_address):
        self.server_address = server_address
        self.armed = threading.Event()
        self.closed_by_server = None
        self.ended = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = self._listener.getsockname()[:2]
        threading.Thread(target=self._run, daemon=True).start()

    def arm(self):
        self.armed.set()

    def _run(self):
        conn, _ = self._listener.accept()
        self._listener.close()
        upstream = socket.create_connection(self.server_address)
        threading.Thread(target=self._down, args=(upstream, conn), daemon=True).start()
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    upstream.shutdown(socket.SHUT_WR)
                    return
                if self.armed.is_set() and len(data) > 5:
                    self.armed.clear()     # a bit of the first frame's tag (its length stays right)
                    data = data[:5] + bytes([data[5] ^ 0x01]) + data[6:]
                upstream.sendall(data)
        except OSError:
            return

    def _down(self, upstream, conn):
        try:
            while True:
                data = upstream.recv(65536)
                if not data:
                    self.closed_by_server = "FIN"
                    break
                conn.sendall(data)
        except ConnectionResetError:
            self.closed_by_server = "RST"
        except OSError:
            self.closed_by_server = "error"
        finally:
            self.ended.set()
            for sock in (conn, upstream):
                sock.close()


@pytest.mark.parametrize("path", ["at once", "idle then small steps", "idle then a large step",
                                  "paced"])
def test_a_bridge_closes_a_tampered_stream_with_a_fin_whatever_its_history(tmp_path, path):
    """One flipped bit on the path makes the bridge's frame check fail mid-stream.
    obfs4proxy then closes with a plain FIN; a bridge of ours must too (a reset
    would tell an on-path prober which implementation runs the bridge), whatever
    the tunnel did before: at once, after a quiet spell and small steps, after a
    quiet spell and one large step, or with iat-mode pacing."""
    iat = ["--iat-mode=1"] if path == "paced" else []
    with EchoServer() as echo, \
            Program("server", "--transport=obfs4", "--state-dir=%s" % tmp_path, *iat,
                    "--dest=" + fmt(echo.address), "127.0.0.1:0", "--log-min-severity=info") as server:
        line = server.log.wait_for(r"bridge line for clients: .*cert=(\S+) iat-mode=(\d)")
        flipper = BitFlipper(server.address)
        with Program("client", "--transport=obfs4", "--cert=" + line.group(1), "--iat-mode=0",
                     "--dest=" + fmt(flipper.address), "127.0.0.1:0") as client:
            with socket.create_connection(client.address, timeout=30) as app:
                app.sendall(b"hello")
                assert recv_exact(app, 5) == b"hello"
                if path != "at once":
                    time.sleep(1.5)            # longer than any quiet-spell threshold the core had
                if path == "idle then small steps":
                    for _ in range(3):
                        app.sendall(b"step")
                        assert recv_exact(app, 4) == b"step"
                elif path == "idle then a large step":
                    big = os.urandom(256 * 1024)
                    writer = threading.Thread(target=app.sendall, args=(big,), daemon=True)
                    writer.start()
                    assert recv_exact(app, len(big)) == big
                    writer.join(WAIT)
                flipper.arm()
                app.sendall(b"tampered")
                assert flipper.ended.wait(30), "the bridge never closed the tampered stream"
            server.log.wait_for(r"conn 1 .*: not obfs4: .*Poly1305")
        assert flipper.closed_by_server == "FIN", flipper.closed_by_server


def test_the_flipper_tells_a_reset_from_a_fin():
    """The check above can fail: a server that resets is seen as RST."""
    class Resetting(EchoServer):
        def _serve(self, conn):
            conn.recv(1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()
    with Resetting() as server:
        flipper = BitFlipper(server.address)
        with socket.create_connection(flipper.address, timeout=WAIT) as app:
            app.sendall(b"x")
            assert flipper.ended.wait(WAIT)
    assert flipper.closed_by_server == "RST"


def reply_214_after_eof(conn):
    """Read the request to its end, answer 214 bytes."""
    recv_all(conn)
    conn.sendall(b"y" * 214)


def test_log_lines_count_application_bytes_the_same_way_on_both_ends(tmp_path):
    """"closed after N bytes client->server, M bytes server->client": the same
    application bytes on both ends, however obfs4 framed and padded them."""
    with EchoServer(behaviour=reply_214_after_eof) as web, \
            Program("server", "--transport=obfs4", "--state-dir=%s" % tmp_path,
                    "--dest=" + fmt(web.address), "127.0.0.1:0", "--log-min-severity=info") as server:
        cert = server.log.wait_for(r"cert=(\S+)").group(1)
        with Program("client", "--transport=obfs4", "--cert=" + cert, "--iat-mode=0",
                     "--dest=" + fmt(server.address), "127.0.0.1:0", "--log-min-severity=info") as client:
            with socket.create_connection(client.address, timeout=WAIT) as app:
                app.sendall(b"x" * 89)
                app.shutdown(socket.SHUT_WR)
                assert recv_all(app) == b"y" * 214
            pattern = r"conn 1 .*closed after (\d+) bytes client->server, (\d+) bytes server->client"
            said = [tuple(map(int, node.log.wait_for(pattern).groups())) for node in (client, server)]
    assert said == [(89, 214), (89, 214)], said


def test_bytes_pipelined_behind_the_socks_request_are_counted_on_both_ends():
    """An application that sends its first bytes in the same write as its SOCKS
    request (optimistic data): the client hands them to the relay with the tunnel,
    and its log line counts them as the server's does."""
    with EchoServer(behaviour=reply_214_after_eof) as web, \
            Program("server", "--transport=dummy", "--dest=" + fmt(web.address), "127.0.0.1:0",
                    "--log-min-severity=info") as server, \
            Program("client", "--transport=dummy", "127.0.0.1:0", "--log-min-severity=info") as client:
        with socket.create_connection(client.address, timeout=WAIT) as app:
            app.sendall(b"\x05\x01\x00" + socks5_request(server.address) + b"x" * 89)
            app.shutdown(socket.SHUT_WR)
            assert recv_exact(app, 2) == b"\x05\x00"
            assert recv_exact(app, 10)[1] == 0
            assert recv_all(app) == b"y" * 214
        pattern = r"conn 1 .*closed after (\d+) bytes client->server, (\d+) bytes server->client"
        said = [tuple(map(int, node.log.wait_for(pattern).groups())) for node in (client, server)]
    assert said == [(89, 214), (89, 214)], said


@pytest.mark.slow
def test_sigterm_is_answered_while_thousands_of_tunnels_close():
    """3,000 idle tunnels through a real client and server, all closed at once, then
    SIGTERM to both: they exit within seconds (they used to spend half a minute
    waking 3,000 threads, deaf to SIGTERM meanwhile)."""
    import resource
    import signal
    count = 3000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 3 * count + 200:
        pytest.skip("needs %d descriptors (ulimit -Hn is %d)" % (3 * count + 200, hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * count + 200)), hard))
    limit = "--max-connections=%d" % (count + 50)
    with EchoServer(backlog=1024) as echo, \
            Program("server", "--transport=dummy", "--dest=" + fmt(echo.address), limit,
                  "127.0.0.1:0") as server, \
            Program("client", "--transport=dummy", limit, "127.0.0.1:0") as client:
        socks = [socks5_connect(client.address, server.address) for _ in range(count)]
        for sock in socks:
            sock.close()
        began = time.monotonic()
        for each in (client, server):
            each.process.send_signal(signal.SIGTERM)
        for each in (client, server):
            each.process.wait(30)
        took = time.monotonic() - began
        print("\nSIGTERM during the close of %d tunnels: both exited in %.2f s" % (count, took))
        assert took < 5, "exit took %.1f s" % took


# --- A bridge many people share: pending handshakes, turns, key work -------------------

def test_silent_sockets_beyond_the_pending_limit_do_not_lock_out_a_prompt_client(dummy_pair):
    """Pending handshakes have their own limit, and a new connection drops the
    oldest pending one when it is full: with 4 allowed, 8 sockets that never
    speak leave room for a client that completes its handshake promptly, and
    the 4 oldest are the ones closed (a drop is logged, rate-limited)."""
    client_address, server_address, server, client = dummy_pair
    client.max_pending = 4
    silent = [socket.create_connection(client_address, timeout=WAIT) for _ in range(8)]
    try:
        wait_until(lambda: client.accepted == 8, what="8 silent sockets accepted")
        sock = socks_echo(client_address, server_address, b"prompt")
        sock.close()
        for old in silent[:5]:           # the 5th went for the prompt client
            old.settimeout(WAIT)
            assert old.recv(1) == b""
        assert client.dropped == 5 and len(client.pending) == 3
        for new in silent[5:]:
            new.setblocking(False)
            with pytest.raises(BlockingIOError):
                new.recv(1)              # still pending: neither answered nor closed
    finally:
        for each in silent:
            each.close()


def test_a_socket_that_has_sent_nothing_holds_no_thread(dummy_pair):
    """20 connections that say nothing to a SOCKS port start no handshake thread
    (the listener watches them, ``_Waits.park``); each gets one once it speaks,
    or closes."""
    client_address, server_address, server, client = dummy_pair
    silent = [socket.create_connection(client_address, timeout=WAIT) for _ in range(20)]
    try:
        wait_until(lambda: client.accepted == 20, what="20 silent sockets accepted")
        assert named_threads("conn-") == []
        assert len(client.pending) == 20
    finally:
        for sock in silent:
            sock.close()
    wait_until(lambda: client.live == 0, what="all 20 counted out once closed")


def test_relayed_tunnels_and_pending_handshakes_are_counted_apart(dummy_pair):
    """--max-connections caps tunnels relayed, not handshakes pending: a tunnel
    counts once its relay is handed to the pump, and is counted out at its end."""
    client_address, server_address, server, client = dummy_pair
    silent = socket.create_connection(client_address, timeout=WAIT)
    sock = socks_echo(client_address, server_address)
    wait_until(lambda: client.relayed == 1 and len(client.pending) == 1, what="1 relayed, 1 pending")
    sock.close()
    silent.close()
    wait_until(lambda: client.relayed == 0 and not client.pending and client.live == 0,
               what="both counted out")


class Toy:
    """A server-side transport that needs one byte from its client and spends
    ``COMPUTE`` seconds on it (sleeping, so that threads can overlap), recording
    how many of its kind compute at once: ``running``, ``most``."""

    name, expensive, handshake_timeout = "toy", False, None
    COMPUTE = 0.05
    lock = threading.Lock()
    running = most = 0

    class ProtocolError(Exception):
        pass

    def __init__(self, initiator, config):
        self.is_open = False

    @classmethod
    def server_config(cls, options, state_dir=None):
        return None, {}

    def start(self):
        return b""

    def receive(self, data):
        with Toy.lock:
            Toy.running += 1
            Toy.most = max(Toy.most, Toy.running)
        time.sleep(Toy.COMPUTE)
        with Toy.lock:
            Toy.running -= 1
        self.is_open = True
        return data

    def data_to_send(self):
        return b""

    def send(self, data):
        return data


@pytest.fixture(params=["parked"])
def toy_server(monkeypatch, request):
    """A Listener serving the Toy transport in front of an echo, 2 turns wide;
    with the param "not parked", a connection gets its thread at once."""
    import transports
    monkeypatch.setitem(transports.TRANSPORTS, "toy", Toy)
    monkeypatch.setattr(handshake_scheduler, "TURNS", 2)
    if request.param == "not parked":
        monkeypatch.setattr(listener, "first_wait", lambda handler, settings: None)
    Toy.running = Toy.most = 0
    with EchoServer(backlog=128) as echo:
        node, address, thread = serving(proxy.Settings("toy", dest=echo.address))
        yield node, address
        node.stop()
        thread.join(WAIT)


def test_the_handshakes_of_a_listening_socket_compute_a_few_at_a_time(toy_server):
    """12 handshakes whose bytes all arrive at once: at most TURNS of them
    run their transport's work at the same time (without turns, all 12 did);
    all 12 then carry data."""
    node, address = toy_server
    socks = [socket.create_connection(address, timeout=WAIT) for _ in range(12)]
    for sock in socks:
        sock.sendall(b"x")
    for sock in socks:
        assert recv_exact(sock, 1) == b"x"
        sock.close()
    assert Toy.most == 2, Toy.most


@pytest.mark.parametrize("toy_server", ["not parked"], indirect=True)
def test_a_handshake_waiting_for_its_client_holds_no_turn(toy_server):
    """With one turn, 5 connections that never send (each on its thread, not
    parked) still leave it free for one that does: a handshake gives its turn
    up while it waits for the network."""
    node, address = toy_server
    node.listeners[0][4].width = 1
    silent = [socket.create_connection(address, timeout=WAIT) for _ in range(5)]
    try:
        wait_until(lambda: node.accepted == 5, what="5 silent connections accepted")
        with socket.create_connection(address, timeout=WAIT) as prompt:
            prompt.sendall(b"p")
            assert recv_exact(prompt, 1) == b"p"
    finally:
        for sock in silent:
            sock.close()


def test_each_listening_socket_has_its_own_key_work_slot():
    """A bridge with two listening sockets (obfs2 with a shared secret on
    both): while the first's key-work slot is held (a flood of probes there),
    a handshake on the second still completes; it waited, in vain, when the
    process had one slot."""
    secret = {"shared-secret": "one slot each", "ss-hash-iterations": "10"}
    import obfs2
    config = obfs2.Obfs2.server_config(secret)[0]
    with EchoServer() as echo:
        node = listener.Listener(pool_size=0)
        settings = proxy.Settings("obfs2", config=config, dest=echo.address, handshake_timeout=5)
        node.listen(("127.0.0.1", 0), proxy.handle_server, settings)
        second = node.listen(("127.0.0.1", 0), proxy.handle_server, settings)
        thread = threading.Thread(target=node.serve, daemon=True)
        thread.start()
        client, client_address, client_thread = serving(
            proxy.Settings("obfs2", options=secret, handshake_timeout=5), proxy.handle_socks_client)
        assert node.listeners[0][3] is not node.listeners[1][3]
        node.listeners[0][3]._slot.acquire()       # the first listening socket is busy
        try:
            sock = socks_echo(client_address, second, b"through the second")
            sock.close()
        finally:
            node.listeners[0][3]._slot.release()
            for each, runner in ((node, thread), (client, client_thread)):
                each.stop()
                runner.join(WAIT)


def test_a_local_wait_for_key_work_is_not_blamed_on_the_bridge():
    """A client whose handshake waited past its deadline for this process's key
    work says so, not "timed out (... a wrong cert= ...)": the bridge was never
    waited on."""
    secret = {"shared-secret": "busy here", "ss-hash-iterations": "10"}
    settings = proxy.Settings("obfs2", options=secret, handshake_timeout=0.5)
    key_work = handshake_scheduler.KeyWork()

    class Tunnel:
        pools = None
        turn = None
        note = staticmethod(lambda text: None)
        owned = []

        def owns(self, sock):
            self.owned.append(sock)
    Tunnel.key_work = key_work
    bridge = socket.create_server(("127.0.0.1", 0))
    key_work._slot.acquire()
    try:
        with pytest.raises(proxy.HopFailed) as failure:
            proxy.open_tunnel(settings, settings.client_config(), bridge.getsockname()[:2],
                              proxy.Deadline(0.5), Tunnel())
    finally:
        key_work._slot.release()
        bridge.close()
    text = str(failure.value)
    assert "not the bridge's fault" in text and "key work" in text, text
    assert "timed out" not in text, text


def test_the_listen_backlog_follows_the_system_limit(monkeypatch):
    """listen() asks for the system's most (somaxconn: 4,096 on a recent Linux),
    not 512: a storm waits in the backlog instead of overflowing it."""
    asked = []
    real = socket.socket.listen
    monkeypatch.setattr(socket.socket, "listen", lambda sock, backlog: asked.append(backlog) or
                        real(sock, backlog))
    process_setup.listen(("127.0.0.1", 0)).close()
    assert asked == [process_setup.somaxconn()]
    if os.path.exists("/proc/sys/net/core/somaxconn"):
        with open("/proc/sys/net/core/somaxconn") as limit:
            assert process_setup.somaxconn() == int(limit.read())


@pytest.mark.parametrize("path", ["at once", "idle then a large step"])
def test_a_bridge_resets_dest_when_the_stream_is_tampered_with(tmp_path, path):
    """The same flipped bit: the obfuscated peer gets a FIN (above), but --dest
    gets a reset, so that the application behind the bridge never takes a cut
    stream for a complete one."""
    endings = []

    def echo_and_record(conn):
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    endings.append("FIN")
                    return
                conn.sendall(data)
        except ConnectionResetError:
            endings.append("RST")
    with EchoServer(behaviour=echo_and_record) as dest, \
            Program("server", "--transport=obfs4", "--state-dir=%s" % tmp_path,
                    "--dest=" + fmt(dest.address), "127.0.0.1:0", "--log-min-severity=info") as server:
        line = server.log.wait_for(r"bridge line for clients: .*cert=(\S+) iat-mode=(\d)")
        flipper = BitFlipper(server.address)
        with Program("client", "--transport=obfs4", "--cert=" + line.group(1), "--iat-mode=0",
                     "--dest=" + fmt(flipper.address), "127.0.0.1:0") as client:
            with socket.create_connection(client.address, timeout=30) as app:
                app.sendall(b"hello")
                assert recv_exact(app, 5) == b"hello"
                if path != "at once":
                    big = os.urandom(256 * 1024)
                    writer = threading.Thread(target=app.sendall, args=(big,), daemon=True)
                    writer.start()
                    assert recv_exact(app, len(big)) == big
                    writer.join(WAIT)
                flipper.arm()
                app.sendall(b"tampered")
                assert flipper.ended.wait(30), "the bridge never closed the tampered stream"
            server.log.wait_for(r"conn 1 .*: not obfs4: .*Poly1305")
            wait_until(lambda: endings, what="--dest closed")
    assert endings == ["RST"], endings
    assert flipper.closed_by_server == "FIN", flipper.closed_by_server


def test_a_full_pending_set_drops_no_handshake_being_computed(toy_server, monkeypatch):
    """With 2 pending handshakes allowed and both computing (not waiting for their
    client), a third connection is refused, and the two complete."""
    node, address = toy_server
    monkeypatch.setattr(Toy, "COMPUTE", 1.0)
    node.max_pending = 2
    busy = [socket.create_connection(address, timeout=WAIT) for _ in range(2)]
    try:
        for sock in busy:
            sock.sendall(b"b")
        wait_until(lambda: Toy.running == 2, what="both computing")
        with socket.create_connection(address, timeout=WAIT) as third:
            assert third.recv(1) == b""          # refused: closed at once
        for sock in busy:
            assert recv_exact(sock, 1) == b"b"
        assert node.dropped == 0
    finally:
        for sock in busy:
            sock.close()


# --- Every way a process ends resets its live tunnels ----------------------------------

DOWNLOAD = 256 << 20     # far more than every socket buffer on the path holds


def give_download(conn):
    """The destination: DOWNLOAD bytes, then a clean close (an error once cut)."""
    block = bytes(1 << 20)
    try:
        for _ in range(DOWNLOAD >> 20):
            conn.sendall(block)
    except OSError:
        pass


def read_to_the_end(sock):
    """"complete", "reset" (an error), or "clean end after N bytes" (the failure)."""
    got = 0
    try:
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            got += len(chunk)
    except OSError:
        return "reset"
    return "complete" if got == DOWNLOAD else "clean end after %d bytes" % got


STOPS = [("SIGHUP",), ("SIGTERM",), ("SIGQUIT",), ("SIGUSR1",), ("SIGUSR2",), ("SIGKILL",),
         ("SIGINT", "SIGINT")]


@contextlib.contextmanager
def client_and_server(transport, dest, state_dir):
    """Our client (SOCKS) and server (to ``dest``) of ``transport``, as processes."""
    keys = ["--state-dir=%s" % state_dir] if transport == "obfs4" else []
    with Program("server", "--transport=" + transport, *keys, "--dest=" + fmt(dest.address),
                 "127.0.0.1:0") as server:
        cert = []
        if transport == "obfs4":
            line = server.log.wait_for(r"bridge line for clients: .*cert=(\S+) iat-mode=(\d)")
            cert = ["--cert=" + line.group(1), "--iat-mode=0"]
        with Program("client", "--transport=" + transport, *cert, "127.0.0.1:0") as client:
            yield client, server


CASES = [("obfs2", each) for each in STOPS] + [("obfs4", ("SIGKILL",)), ("dummy", ("SIGKILL",))]


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("transport, signals", CASES, ids=["%s-%s" % (t, "+".join(s)) for t, s in CASES])
@pytest.mark.parametrize("role", ["client", "server"])
def test_a_download_cut_by_the_end_of_either_proxy_never_looks_complete(tmp_path, role, transport, signals):
    """A download mid-stream through our client and server; then ``signals`` to
    one of them. Whatever ends the process (a terminal's hang-up, a kill, the
    OOM killer's SIGKILL, a second Ctrl-C), the application either gets every
    byte or sees a reset: never a clean end short of its length."""
    import signal
    with EchoServer(behaviour=give_download) as dest, \
            client_and_server(transport, dest, tmp_path) as (client, server):
        app = socks5_connect(client.address, server.address, timeout=WAIT)
        with app:
            assert recv_exact(app, 1) == b"\0"          # the tunnel is live, mid-stream
            victim = client if role == "client" else server
            for number, name in enumerate(signals):
                if number:       # the first was a Ctrl-C: the second comes once it was heard
                    victim.log.wait_for(r"stopped accepting")
                victim.process.send_signal(getattr(signal, name))
            outcome = read_to_the_end(app)
            assert victim.process.wait(WAIT) is not None
    assert outcome in ("complete", "reset"), outcome


# --- Attack sockets wait in the poller, never on a thread --------------------------------

@pytest.fixture
def quick_obfs4_bridge(tmp_path, monkeypatch):
    """An in-process obfs4 bridge (in front of an echo) whose handshakes time out
    after 1 s and whose failed handshakes linger 1 s more: (its Listener, its address)."""
    import obfs4
    monkeypatch.setattr(obfs4, "SERVER_HANDSHAKE_TIMEOUT", 1)
    config = obfs4.Obfs4.server_config({}, tmp_path)[0]
    config.close_delay = 1
    with EchoServer() as echo:
        node, address, thread = serving(proxy.Settings("obfs4", config=config, dest=echo.address))
        yield node, address
        node.stop()
        thread.join(WAIT)


def test_silent_slow_and_failed_clients_hold_no_thread_through_their_linger(quick_obfs4_bridge, caplog):
    """20 sockets that say nothing, 20 that send a byte every 0.1 s and 20 that
    send garbage: past the 1 s deadline all 60 linger (read and discarded) until
    2 s after accept, then get a FIN; and at no time do they hold more threads
    than the listener's turns and spare threads (they held one each). A silent
    one is logged as silent, not as this process's overload."""
    node, address = quick_obfs4_bridge
    silent = [socket.create_connection(address, timeout=WAIT) for _ in range(20)]
    slow = [socket.create_connection(address, timeout=WAIT) for _ in range(20)]
    garbage = [socket.create_connection(address, timeout=WAIT) for _ in range(20)]
    every = silent + slow + garbage
    most, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            most[0] = max(most[0], len(named_threads("conn-")))
            time.sleep(0.002)
    watcher = threading.Thread(target=watch, daemon=True)
    with caplog.at_level(logging.INFO, logger="obfsproxy"):
        watcher.start()
        try:
            for sock in garbage:
                sock.sendall(os.urandom(8192 + 64))     # no mark within obfs4's most: a failure
            for _ in range(15):
                for sock in slow:
                    sock.sendall(b"x")
                time.sleep(0.1)
            for sock in every:
                assert sock.recv(65536) == b""          # the FIN, once the linger is over
            wait_until(lambda: node.live == 0, what="all 60 counted out")
        finally:
            done.set()
            watcher.join(WAIT)
            for sock in every:
                sock.close()
    assert most[0] <= handshake_scheduler.TURNS + node.SPARE_THREADS, "%d handshake threads at once" % most[0]
    lines = [r.getMessage() for r in caplog.records]
    timeouts = [line for line in lines if "handshake timed out: no obfs4 handshake within 1 s" in line]
    assert len(timeouts) == 40, lines
    assert not [line for line in lines if "key work" in line], lines


def test_a_server_that_speaks_first_holds_no_thread_for_a_silent_client():
    """obfs2 (the server sends its seed first): 30 clients that never answer
    take no thread each (their threads go long before the 5 s deadline); each
    is closed at its deadline."""
    with EchoServer() as echo:
        node, address, thread = serving(proxy.Settings("obfs2", dest=echo.address, handshake_timeout=5),
                                        SPARE_THREADS=0, SPARE_SECONDS=0.1)
        try:
            silent = [socket.create_connection(address, timeout=WAIT) for _ in range(30)]
            for sock in silent:
                assert len(sock.recv(16)) > 0             # the server's seed: its handshake started
            wait_until(lambda: not named_threads("conn-"), what="no handshake thread left")
            assert node.live == 30
            for sock in silent:
                assert recv_all(sock)[-1:] != b""         # its deadline: closed
            wait_until(lambda: node.live == 0, what="all 30 counted out")
        finally:
            node.stop()
            thread.join(WAIT)


def test_a_refused_thread_is_counted_and_said_once_per_interval_and_the_listener_carries_on(
        monkeypatch, caplog):
    """Every handshake thread start fails for a while (the system's task limit):
    each such connection is reset, counted, and the log says so once per
    interval, not once per connection; the listener keeps accepting, and serves
    again once threads can be had."""
    with EchoServer() as echo:
        node, address, thread = serving(proxy.Settings("dummy", dest=echo.address, handshake_timeout=5),
                                        SPARE_THREADS=0)
        real, refusing = threading.Thread, [True]

        class Refused(real):
            def start(self):
                if refusing[0] and self.name.startswith("conn-"):
                    raise RuntimeError("can't start new thread")
                super().start()

        monkeypatch.setattr(listener.threading, "Thread", Refused)
        try:
            with caplog.at_level(logging.NOTICE if hasattr(logging, "NOTICE") else 25, logger="obfsproxy"):
                for _ in range(10):
                    with pytest.raises(ConnectionResetError):
                        with socket.create_connection(address, timeout=WAIT) as doomed:
                            doomed.recv(1)
                wait_until(lambda: node.threads_refused == 10, what="10 refusals counted")
                refusing[0] = False
                with socket.create_connection(address, timeout=WAIT) as sock:
                    sock.sendall(b"again")
                    sock.shutdown(socket.SHUT_WR)
                    assert recv_all(sock) == b"again"
            said = [r.getMessage() for r in caplog.records if "cannot start a thread" in r.getMessage()]
            assert len(said) == 1, said
        finally:
            monkeypatch.undo()
            node.stop()
            thread.join(WAIT)


def test_the_poller_never_needs_a_thread_start_after_the_listener_is_up(monkeypatch):
    """Thread starts refused once the listener serves: connections that wait
    for their client are still parked (the poller's thread started with the
    listener), and the listener stays up."""
    with EchoServer() as echo:
        node, address, thread = serving(proxy.Settings("dummy"), proxy.handle_socks_client)
        real = threading.Thread

        class Refused(real):
            def start(self):
                if self.name == "handshake-waits":
                    raise RuntimeError("can't start new thread")
                super().start()

        monkeypatch.setattr(listener.threading, "Thread", Refused)
        try:
            for _ in range(3):
                socket.create_connection(address, timeout=WAIT).close()
            wait_until(lambda: node.accepted == 3 and node.live == 0, what="3 parked, then closed")
            # Time for a poller that idles out to have done so (this one never does).
            time.sleep(handshake_scheduler.PARK_CHECK * 2)
            with socket.create_connection(address, timeout=WAIT) as parked:
                wait_until(lambda: node.accepted == 4, what="a 4th parked")
                sock = socks_echo(address, echo.address, b"still serving")
                sock.close()
                parked.close()
            assert thread.is_alive()
        finally:
            monkeypatch.undo()
            node.stop()
            thread.join(WAIT)


LIMITED = r"""
import resource, runpy, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="descriptors numbered lowest first (POSIX)")
def test_silent_sockets_never_take_the_descriptors_a_prompt_client_needs():
    """A bridge allowed 200 descriptors (``ulimit -n 200``) and 400 sockets that
    never answer its obfs2 seed: the oldest are dropped as descriptors run
    short, so a prompt client still gets its tunnel at once (the pending limit,
    four times --max-connections, is far above what the descriptors hold: the
    prompt client waited in the backlog until its handshake deadline)."""
    import sys
    with EchoServer(backlog=16) as echo, \
            Program("server", "--transport=obfs2", "--handshake-timeout=20", "--dest=" + fmt(echo.address),
                    "127.0.0.1:0", interpreter=[sys.executable, "-c", LIMITED, "200"]) as server, \
            Program("client", "--transport=obfs2", "--handshake-timeout=20", "127.0.0.1:0") as client:
        silent = []
        try:
            for _ in range(400):
                silent.append(socket.create_connection(server.address, timeout=WAIT))
            with socks5_connect(client.address, server.address, timeout=10) as app:
                app.sendall(b"prompt")
                assert recv_exact(app, 6) == b"prompt"
        finally:
            for sock in silent:
                sock.close()


def test_a_refused_connection_scans_no_pending_handshake(dummy_pair):
    """Pending handshakes full and none waiting for its client: a new connection
    is refused without a look at each pending one (the scan held the lock that
    every tunnel's end takes: 0.9 ms at 8,192)."""
    client_address, server_address, server, client = dummy_pair

    class Unscannable(dict):
        def values(self):
            raise AssertionError("the pending handshakes were scanned")
        __iter__ = values

    client.max_pending = 0
    client.pending = Unscannable()
    with socket.create_connection(client_address, timeout=WAIT) as refused:
        assert refused.recv(1) == b""
    assert client.accepted == 0


def test_a_tunnel_dropped_as_its_handshake_ends_is_never_relayed():
    """A pending tunnel dropped for a newer connection just as its handshake
    completes (a race) is closed, not handed to a pump outside the count of
    relayed tunnels."""
    with EchoServer() as echo:
        holder = {}

        def racing(conn, settings, tunnel):
            relay = yield from proxy.handle_server(conn, settings, tunnel)
            node = holder["node"]
            with node._lock:           # what _admit does to a victim, in the race window
                node.pending.pop(tunnel.number)
                tunnel.dropped = "a race"
            return relay
        racing.initiator = False
        node, address, thread = serving(proxy.Settings("dummy", dest=echo.address), racing)
        holder["node"] = node
        try:
            with socket.create_connection(address, timeout=WAIT) as sock:
                sock.sendall(b"x")
                try:
                    echoed = sock.recv(1)
                except ConnectionResetError:       # closed with the "x" unread
                    echoed = b""
                assert echoed == b"", "relayed"
            wait_until(lambda: node.live == 0, what="counted out")
            assert node.relayed == 0 and not any(len(pump) for pump in node.pumps)
        finally:
            node.stop()
            thread.join(WAIT)
