"""The stress run (issue 21): every transport, bytes checked at their offsets, nothing left behind.

What runs (the slow group, ``python3 -m pytest -q -m slow tests/test_stress.py -s``):
our client and server processes for dummy, obfs2, obfs3, obfs4 in iat-mode 0,
1 and 2 (SOCKS5 with arguments, and a fixed --dest for iat-mode 2), webtunnel
without TLS, and obfs4 against Debian's obfs4proxy in each role. Through each
pair, ``CONNECTIONS`` connections in the patterns of stress.py (echo and duplex
with half-close, idle pauses, slow readers, resets at either end, closes with
bytes unread, a destination that closes first), each direction its own keystream,
checked at every offset where it lands (stress.py says how a wrong, foreign,
duplicated or missing byte is named).

After each configuration our processes must be back where they were before it:
the same descriptors, only the main thread (the pump's thread lingers
relay.Pump.LINGER seconds, a handshake thread listener.Listener.SPARE_SECONDS,
a pool's refill thread pool.LINGER: we wait for them, polling against a deadline
made of those), no socket in CLOSE_WAIT, and no warning, error or traceback in
their logs. Each test prints its figures (run with ``-s``).

The checker itself is proven in the default group (fast): a relay of our own
that splices, duplicates or drops bytes on purpose, or ends a reset stream with
a FIN, and the run names each: kind, connection, direction, offset, source.
"""

import os
import re
import socket
import struct
import threading
import time
from contextlib import ExitStack

import pytest
import stress
from peers import Obfs4proxy, pinned_options
from procwatch import AT_REST, close_wait, cpu_seconds, fd_count, fd_kinds, needs_proc, thread_count
from support import EchoServer, Program, fmt, recv_exact, require_obfs4proxy, socks5_connect

import listener
import pool
import relay
import webtunnel

CONNECTIONS = 500              # per configuration
MIX = dict(max_stream=4 << 20)  # stress.Mix: a stream is 1 B .. 4 MiB; slow readers 2-8 MiB
# iat-mode 1 and 2 send ~190 KB/s per tunnel, by design: smaller streams
PACED_MIX = dict(max_stream=192 << 10, backlog=(192 << 10, 512 << 10))
SEED = int(os.environ.get("STRESS_SEED", "21"))   # the same plan every run; set it to vary
REST_SLACK = 20.0              # seconds past the lingers for a loaded machine
SECRET_PATH = "k7Qm2Zx1c1b00b6"


# --- Watching our processes ---------------------------------------------------------

def label(node):
    """'client --transport=obfs4', for messages."""
    return " ".join([node.args[2]] + [arg for arg in node.args if arg.startswith("--transport=")])


class Rest:
    """A process at rest (only its main thread and poller; its descriptors), to come back to."""

    LINGERS = max(relay.Pump.LINGER, listener.Listener.SPARE_SECONDS, pool.LINGER)

    def __init__(self, node):
        self.node, self.pid = node, node.process.pid
        self.wait(lambda: thread_count(self.pid) == AT_REST, "its main thread and poller alone")
        self.fds, self.kinds = fd_count(self.pid), fd_kinds(self.pid)

    def wait(self, condition, what):
        deadline = time.monotonic() + self.LINGERS + REST_SLACK
        while not condition():
            if time.monotonic() > deadline:
                pytest.fail("%s: not back to %s within %.0f s: %d fds (at rest %s), %d threads, "
                            "CLOSE_WAIT %r; descriptors now %r, at rest %r"
                            % (label(self.node), what, self.LINGERS + REST_SLACK, fd_count(self.pid),
                               getattr(self, "fds", "?"), thread_count(self.pid), close_wait(self.pid),
                               fd_kinds(self.pid), getattr(self, "kinds", "?")))
            time.sleep(0.05)   # polling the condition, with the deadline above

    def back(self):
        """Wait until the descriptors, the threads and no CLOSE_WAIT are as at rest."""
        self.wait(lambda: (fd_count(self.pid), thread_count(self.pid), close_wait(self.pid))
                  == (self.fds, AT_REST, []),
                  "%d fds, its main thread and poller alone, no CLOSE_WAIT" % self.fds)


BAD_LINE = re.compile(r"\[WARNING\]|\[ERROR\]|Traceback|internal error")


def bad_lines(node):
    node.log.rest(0.2)
    return [line for line in node.log.lines if BAD_LINE.search(line)]


def lines_of(node, port):
    """The log lines of the connection whose peer port is ``port`` (--no-safe-logging)."""
    tag = ":%d)" % port
    numbers = {m.group(1) for line in node.log.lines if tag in line
               for m in [re.search(r"conn (\d+) \(", line)] if m}
    return [line for line in node.log.lines
            if any("conn %s (" % n in line for n in numbers)]


# --- The configurations ---------------------------------------------------------------

def ours(role, *args):
    return Program(role, "127.0.0.1:0", "--log-min-severity=info", "--no-safe-logging", *args)


def obfs4_server(dest, tmp_path, iat_mode):
    """Our obfs4 server with the pinned identity; its cert from the bridge line it logs."""
    server = ours("server", "--transport=obfs4", "--dest=" + fmt(dest.address),
                  "--state-dir=%s" % (tmp_path / "state"),
                  "--transport-options=" + pinned_options(iat_mode, tor=False))
    try:
        server.cert = server.log.wait_for(r"cert=(\S+) iat-mode=%d$" % iat_mode).group(1)
    except BaseException:
        server.stop()
        raise
    return server


class Setup:
    """What a configuration runs: ``connect()`` opens one tunnel; ``ours`` are our
    processes (checked after the run); ``half_close`` and ``resets_travel`` as in
    stress.Run."""

    def __init__(self, connect, ours, half_close=True, resets_travel=True, mix=MIX):
        self.connect, self.ours = connect, ours
        self.half_close, self.resets_travel, self.mix = half_close, resets_travel, mix


def socks(client, target, args=None):
    return lambda: socks5_connect(client.address, target, timeout=30, args=args)


def plain(transport):
    def start(stack, dest, tmp_path):
        server = stack.enter_context(ours("server", "--transport=" + transport,
                                          "--dest=" + fmt(dest.address)))
        client = stack.enter_context(ours("client", "--transport=" + transport))
        return Setup(socks(client, server.address), [client, server])
    return start


def obfs4(iat_mode, fixed=False):
    def start(stack, dest, tmp_path):
        server = stack.enter_context(obfs4_server(dest, tmp_path, iat_mode))
        if fixed:
            client = stack.enter_context(ours("client", "--transport=obfs4", "--cert=" + server.cert,
                                              "--iat-mode=%d" % iat_mode, "--dest=" + fmt(server.address)))
            connect = lambda: socket.create_connection(client.address, timeout=30)  # noqa: E731
        else:
            client = stack.enter_context(ours("client", "--transport=obfs4"))
            connect = socks(client, server.address, "cert=%s;iat-mode=%d" % (server.cert, iat_mode))
        return Setup(connect, [client, server], mix=PACED_MIX if iat_mode else MIX)
    return start


def webtunnel_plain(stack, dest, tmp_path):
    """webtunnel without TLS: the server checks the path of its url=; the client
    dials its url='s host and port, never the SOCKS target (the bridge line's
    synthetic address, as Tor would send it)."""
    server = stack.enter_context(ours("server", "--transport=webtunnel", "--dest=" + fmt(dest.address),
                                      "--transport-options=url=http://wt.test/" + SECRET_PATH))
    client = stack.enter_context(ours("client", "--transport=webtunnel"))
    url = "http://127.0.0.1:%d/%s" % (server.address[1], SECRET_PATH)
    target = webtunnel.synthetic_address("http://wt.test/" + SECRET_PATH)
    return Setup(socks(client, target, "url=" + url), [client, server])


def ours_to_obfs4proxy(stack, dest, tmp_path):
    """Our obfs4 client, obfs4proxy's server. obfs4proxy closes both directions at
    the first EOF, and ends a failed tunnel with a FIN or a reset as Go's close
    happens to: the run neither half-closes nor expects resets to travel."""
    theirs = stack.enter_context(Obfs4proxy("server", tmp_path, orport=dest.address, transport="obfs4",
                                            options=pinned_options(0)))
    client = stack.enter_context(ours("client", "--transport=obfs4"))
    return Setup(socks(client, theirs.address, "cert=%s;iat-mode=0" % theirs.cert), [client],
                 half_close=False, resets_travel=False)


def obfs4proxy_to_ours(stack, dest, tmp_path):
    """obfs4proxy's client (SOCKS5 with arguments), our obfs4 server."""
    server = stack.enter_context(obfs4_server(dest, tmp_path, 0))
    theirs = stack.enter_context(Obfs4proxy("client", tmp_path, transport="obfs4"))
    return Setup(socks(theirs, server.address, "cert=%s;iat-mode=0" % server.cert), [server],
                 half_close=False, resets_travel=False)


CONFIGS = {
    "dummy": plain("dummy"),
    "obfs2": plain("obfs2"),
    "obfs3": plain("obfs3"),
    "obfs4-iat0": obfs4(0),
    "obfs4-iat1": obfs4(1),
    "obfs4-iat2-fixed-dest": obfs4(2, fixed=True),
    "webtunnel-http": webtunnel_plain,
    "obfs4-ours-to-obfs4proxy": ours_to_obfs4proxy,
    "obfs4-obfs4proxy-to-ours": obfs4proxy_to_ours,
}
NEEDS_OBFS4PROXY = {"obfs4-ours-to-obfs4proxy", "obfs4-obfs4proxy-to-ours"}


@pytest.mark.slow
@needs_proc
@pytest.mark.parametrize("name", list(CONFIGS))
def test_stress(name, tmp_path):
    if name in NEEDS_OBFS4PROXY:
        require_obfs4proxy()
    with ExitStack() as stack:
        dest = stack.enter_context(stress.Destination())
        setup = CONFIGS[name](stack, dest, tmp_path)
        rests = [Rest(node) for node in setup.ours]
        mix = stress.Mix(count=CONNECTIONS, **setup.mix)
        result = stress.Run(dest, setup.connect, mix, seed=SEED, half_close=setup.half_close,
                            resets_travel=setup.resets_travel).go()
        print("\n%s (seed %d): %s" % (name, SEED, result.summary()))
        assert not result.faults, explain(result, setup.ours)
        for rest in rests:
            rest.back()
        for node in setup.ours:
            assert not bad_lines(node), "%s logged: %r" % (label(node), bad_lines(node))
        assert set(result.figures) == set(stress.PATTERNS), "a pattern never ran: %s" % result.figures


def explain(result, nodes, most=12):
    """The faults, each with its connection's log lines from our processes."""
    lines = ["%d fault(s):" % len(result.faults)]
    for fault in result.faults[:most]:
        lines.append(str(fault))
        conn = result.conns.get(fault.conn)
        for node in nodes:
            node.log.rest(0.1)
            for port in (conn.app_port, conn.dest_port) if conn else ():
                if port:
                    lines.extend("    %s: %s" % (label(node), line) for line in lines_of(node, port))
    return "\n".join(lines)


# --- The checker, proven on a broken relay of our own ------------------------------------

class BrokenRelay(EchoServer):
    """A relay with a fixed destination, like a client with --dest, that breaks one
    stream on purpose once ``direction`` of some connection has carried AFTER bytes:

    * ``splice``: it first writes a chunk of another connection's same direction
      (the bytes a scheduler that misroutes a chunk would deliver);
    * ``duplicate``: it writes the chunk twice; ``drop``: it never writes it;
    * ``fin-for-rst``: when the destination resets, it closes the app's side with a
      FIN instead (a cut stream that looks whole).

    ``broken`` records where the checker must see it: (conn, direction, offset,
    length, source), the source being (conn, direction, offset) of spliced bytes.
    It reads the app's preamble to know the connections by their numbers. The
    accept loop and ``close()`` are EchoServer's; ``_serve`` is the relay."""

    AFTER = 10000

    def __init__(self, dest, fault, direction="down"):
        self.dest, self.fault, self.direction = dest, fault, direction
        self.broken = None
        self.recent = {}                # (conn, direction) -> (offset, chunk) last carried
        self.lock = threading.Lock()
        super().__init__(backlog=64)

    def _serve(self, app):
        with app, socket.create_connection(self.dest) as dest:
            preamble = b""
            while len(preamble) < stress.PREAMBLE.size:
                more = app.recv(stress.PREAMBLE.size - len(preamble))
                if not more:
                    return
                preamble += more
            dest.sendall(preamble)
            number = stress.PREAMBLE.unpack(preamble)[1]
            up = threading.Thread(target=self._pump, args=(app, dest, number, "up"), daemon=True)
            up.start()
            self._pump(dest, app, number, "down")
            up.join()

    def _pump(self, src, dst, number, direction):
        offset = 0
        try:
            while True:
                try:
                    data = src.recv(4096)
                except ConnectionResetError:
                    if self.fault == "fin-for-rst" and direction == "down":
                        dst.shutdown(socket.SHUT_WR)        # a FIN where a reset belongs
                    else:
                        dst.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        dst.shutdown(socket.SHUT_RDWR)
                    return
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(self._maybe_break(number, direction, offset, data))
                offset += len(data)
        except OSError:     # the other side is gone: its own pump ends the connection
            pass

    def _maybe_break(self, conn, direction, offset, data):
        with self.lock:
            others = [(key, value) for key, value in self.recent.items()
                      if key[0] != conn and key[1] == direction and len(value[1]) >= stress.WINDOW]
            self.recent[(conn, direction)] = (offset, data)
            if self.broken is not None or self.fault == "fin-for-rst" or \
                    direction != self.direction or offset < self.AFTER:
                return data
            if self.fault == "splice":
                if not others:
                    return data
                (source, _), (source_offset, chunk) = others[0]
                self.broken = (conn, direction, offset, len(chunk), (source, direction, source_offset))
                return chunk + data
            if self.fault == "duplicate":   # the second copy is where the stream goes wrong
                self.broken = (conn, direction, offset + len(data), len(data), None)
                return data * 2
            self.broken = (conn, direction, offset, len(data), None)
            return b""


@pytest.mark.parametrize("fault, direction, kind", [
    ("splice", "down", "foreign"), ("splice", "up", "foreign"),
    ("duplicate", "down", "duplicated"), ("duplicate", "up", "duplicated"),
    ("drop", "down", "missing"), ("drop", "up", "missing"),
])
def test_the_checker_names_spliced_duplicated_and_dropped_bytes(fault, direction, kind):
    with stress.Destination() as dest:
        broken = BrokenRelay(dest.address, fault, direction)
        try:
            mix = stress.Mix(count=8, min_stream=64 << 10, max_stream=256 << 10, weights={"duplex": 1},
                             concurrency=8, batch=8)
            result = stress.Run(dest, lambda: socket.create_connection(broken.address), mix).go()
        finally:
            broken.close()
    assert broken.broken is not None, "the relay never broke a stream"
    conn, where, offset, length, source = broken.broken
    assert len(result.faults) == 1, [str(f) for f in result.faults]
    found = result.faults[0]
    assert (found.kind, found.conn, found.direction, found.offset) == (kind, conn, where, offset), str(found)
    if kind == "foreign":
        assert found.source == source, str(found)
    else:
        assert found.length == length, str(found)
    assert result.figures["duplex"][0] == 8


def test_the_checker_names_a_reset_that_arrived_as_a_fin():
    """Our relay ends a failed tunnel with RST on both hops: a relay that turns the
    destination's reset into a FIN is caught at the app, with where it happened."""
    with stress.Destination() as dest:
        broken = BrokenRelay(dest.address, "fin-for-rst")
        try:
            mix = stress.Mix(count=6, min_stream=1024, max_stream=64 << 10, weights={"dest-rst": 1},
                             concurrency=6, batch=6)
            result = stress.Run(dest, lambda: socket.create_connection(broken.address), mix).go()
        finally:
            broken.close()
    kinds = {(f.kind, f.direction) for f in result.faults}
    assert kinds == {("clean-end", "down")}, [str(f) for f in result.faults]
    assert len(result.faults) == 6


def test_a_closed_echo_server_serves_no_later_connection():
    """The harness's services must not outlive ``close()``: a listener left in
    LISTEN behind a blocked accept() served one more connection with the old
    behaviour (a plain echo answering on a test's --dest hop). After close the
    port refuses and the accept thread has ended."""
    echo = EchoServer()
    address = echo.address
    with socket.create_connection(address, timeout=5) as sock:
        sock.sendall(b"ping")
        assert sock.recv(4) == b"ping"
    echo.close()
    assert not echo._thread.is_alive(), "the accept thread outlived close()"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=5).close()
    assert echo.accepted == 1


@pytest.mark.slow
@needs_proc
def test_a_crowd_of_silent_and_slow_sockets_locks_no_prompt_client_out(tmp_path):
    """A bridge (obfs4, --max-connections=256, so 256 pending handshakes at most)
    with 1,000 sockets that never speak and 500 that send a byte every half
    second (10 s in all): a tunnel opened before keeps echoing, and each of the
    tunnels opened meanwhile gets through. Prints the server's threads and CPU."""
    with EchoServer(backlog=1024) as dest, ExitStack() as stack:
        server = stack.enter_context(Program(
            "server", "--transport=obfs4", "--state-dir=%s" % tmp_path, "--dest=" + fmt(dest.address),
            "--max-connections=256", "127.0.0.1:0"))
        cert = server.log.wait_for(r"bridge line for clients: .*cert=(\S+) iat-mode").group(1)
        client = stack.enter_context(Program("client", "--transport=obfs4", "127.0.0.1:0"))
        args = "cert=%s;iat-mode=0" % cert
        live = stack.enter_context(socks5_connect(client.address, server.address, args=args))
        crowd = [stack.enter_context(socket.create_connection(server.address, timeout=10))
                 for _ in range(1500)]
        slow = crowd[1000:]
        for sock in slow:
            sock.setblocking(False)
        cpu_before = cpu_seconds(server.process.pid)
        opened, most_threads = 0, 0
        end = time.monotonic() + 10
        while time.monotonic() < end:
            for sock in slow:
                try:
                    sock.send(b"\x17")
                except OSError:       # dropped to make room: the crowd does not come back
                    pass
            with socks5_connect(client.address, server.address, args=args) as prompt:
                prompt.sendall(b"prompt")
                assert recv_exact(prompt, 6) == b"prompt"
            opened += 1
            live.sendall(b"live")
            assert recv_exact(live, 4) == b"live"
            most_threads = max(most_threads, thread_count(server.process.pid))
            time.sleep(0.5)
        print("\n%d prompt tunnels opened beside 1,000 silent and 500 slow sockets; the server "
              "ran at most %d threads and spent %.1f CPU-s"
              % (opened, most_threads, cpu_seconds(server.process.pid) - cpu_before))
