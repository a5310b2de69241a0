"""stress.py: many tunnels at once, every byte checked where it lands (issue 21).

The driver plays both ends of every connection, on one thread and one
selector: the application (``app``), which connects through the client proxy,
and the destination (``dest``), the service behind the server proxy::

    app --connect()--> client ==transport==> server --> dest (Destination)
        up: app's keystream ----------------------------> checked at dest
        down: checked at app <---------------------------- dest's keystream

Each connection follows a pattern (``PATTERNS``, mixed by weight):

    echo        the dest echoes the app's stream; the app half-closes once it has sent
                it all, the dest once it has echoed it all
    duplex      both send at once and half-close when done, both ways
    idle        an echo that pauses 1.2-2.5 s before its first byte or mid-stream,
                once everything sent so far has come back (the tunnel is quiet)
    slow        a duplex whose one end reads 2-8 MiB in phases: nothing for 0.1-0.6 s
                (so that the relay's writes block and it holds its chunk), then 1 to 9
                bytes at a time, then normally for a while
    app-rst     the app resets (RST) mid-stream
    unread      one end closes with bytes unread (the kernel sends RST)
    dest-rst    the dest resets mid-stream
    dest-first  the dest reads what the app sent, sends its stream and closes first

Across a peer that closes both directions at the first EOF (obfs4proxy), a
configuration says ``half_close=False``: the ends then send, read exactly what
they expect, and the app closes. Writes are 1 B to 256 KiB (log-uniform),
connections start in batches of 1 to ``Mix.batch`` while others end, up to
``Mix.concurrency`` at once. A quarter of the ends, and every slow reader, have a
small receive buffer, so that a relay's writes block as soon as its reader lags.

The keystreams. Each direction of each connection carries its own bytes:
AES-128-CTR of zeros, keyed by SHA-256(run seed, connection, direction); block
i is AES_k(i). Why not SHA-256 in counter mode: AES-CTR runs in C at memory
speed (the checker must keep up with the proxies), and it can be inverted:
16 bytes of a keystream, decrypted under its key, give back their block number.
So bytes that land where they should not are named (``Check``, ``locate``)::

    foreign     another stream's bytes: "conn 12 up's bytes from its offset 4096"
    duplicated  this stream's earlier bytes again: how many, from which offset
    missing     this stream's later bytes: which ones never came
    wrong       bytes of no stream of this run, or changed in place
    extra       bytes after the end of the stream
    short       EOF or a reset before the end of the stream
    clean-end   the other end cut the tunnel, yet this end saw a plain EOF
                (only where ``resets_travel``: our relay ends a failed tunnel with
                RST on both hops, so that no one takes a cut stream for a whole one)
    preamble, open, stalled   a connection that could not be told apart, opened,
                or finished

The destination learns which connection arrived from an 8-byte preamble the app
sends before its stream (b"strs" + the connection number).
"""

import hashlib
import heapq
import itertools
import math
import queue
import random
import selectors
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

from accel import AES

MAX_WRITE = 256 * 1024          # the largest write; writes are 1 B .. MAX_WRITE, log-uniform
READ = 256 * 1024               # bytes asked per recv() by a reader that is not slow
SIPS = 64                       # reads of 1-9 bytes a slow reader makes after each stall
ZEROS = memoryview(bytes(MAX_WRITE))
PREAMBLE = struct.Struct("!4sI")
MAGIC = b"strs"
WINDOW = 64                     # bytes gathered after a mismatch to name what came instead
ECHO_HELD = 1 << 20             # an echoing dest stops reading while it holds this much
STALL = 20.0                    # seconds without a byte moving: the run has stalled

PATTERNS = {"echo": 3, "duplex": 3, "idle": 1, "slow": 1, "app-rst": 1, "unread": 1,
            "dest-rst": 1, "dest-first": 1}


# --- Keystreams ----------------------------------------------------------------------

def stream_key(seed, conn, direction):
    return hashlib.sha256(b"stress %d %d %s" % (seed, conn, direction.encode())).digest()[:16]


class Keystream:
    """One direction's bytes in order: AES-128-CTR of zeros, block i = AES_k(i)."""

    def __init__(self, key):
        self._cipher = AES.new(key, AES.MODE_CTR, nonce=b"", initial_value=0)

    def next(self, n):
        parts = []
        while n > 0:
            take = min(n, len(ZEROS))
            parts.append(self._cipher.encrypt(ZEROS[:take]))
            n -= take
        return b"".join(parts)


def locate(window, key):
    """(where in ``window``, offset in ``key``'s keystream) of the first 16 bytes
    of ``window`` that are a whole block of that keystream; None if none are.
    Any 31 bytes of a keystream hold a whole block."""
    shifts = range(min(16, len(window) - 15))
    if not shifts:
        return None
    plain = AES.new(key, AES.MODE_ECB).decrypt(b"".join(bytes(window[s:s + 16]) for s in shifts))
    for s in shifts:
        block = plain[16 * s:16 * s + 16]
        if not any(block[:8]):            # a counter below 2**64: this key made these bytes
            return s, int.from_bytes(block, "big") * 16
    return None


def first_difference(a, b):
    """The first index where ``a`` and ``b`` differ (or the shorter length)."""
    lo, hi = 0, min(len(a), len(b))
    while hi - lo > 64:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    for i in range(lo, hi):
        if a[i] != b[i]:
            return i
    return hi


# --- What went wrong -----------------------------------------------------------------

@dataclass
class Fault:
    """One thing wrong with one direction of one connection: ``offset`` is the
    stream offset where it begins; ``source`` (conn, direction, offset) names
    foreign bytes; ``length`` counts duplicated or missing bytes."""

    conn: int
    direction: str
    offset: int
    kind: str
    text: str
    pattern: str = ""
    source: Optional[tuple] = None
    length: Optional[int] = None

    def __str__(self):
        return "conn %d (%s) %s, offset %d: %s: %s" % (self.conn, self.pattern, self.direction,
                                                       self.offset, self.kind, self.text)


class Check:
    """The receiving side of one direction: every byte compared with the keystream
    at its offset. The first mismatch becomes ``fault``, named by what the bytes
    from there on are (``WINDOW`` of them are gathered first); checking stops there.
    ``count``: bytes that matched, from offset 0; ``total``: the stream's length."""

    def __init__(self, conn, direction, key, total, streams):
        self.conn, self.direction, self.key, self.total = conn, direction, key, total
        self.streams = streams            # {key: (conn, direction)} of every stream of the run
        self.count, self.fault = 0, None
        self._stream = Keystream(key)
        self._window = None

    def feed(self, data):
        if self.fault is not None:
            return
        if self._window is not None:
            self._window += data
        else:
            expected = self._stream.next(min(len(data), self.total - self.count))
            if data == expected:
                self.count += len(data)
                return
            at = first_difference(data, expected)
            self.count += at
            self._window = bytearray(data[at:])
        if len(self._window) >= WINDOW:
            self._diagnose()

    def end(self):
        """No more bytes will come: name what the last mismatch was."""
        if self._window is not None and self.fault is None:
            self._diagnose()

    def _diagnose(self):
        at, window = self.count, bytes(self._window[:WINDOW])
        own = locate(window, self.key)
        if own is not None:
            shift, offset = own
            lag = at + shift - offset
            if lag > 0:
                self._report("duplicated", "%d bytes came again: this stream's from offset %d"
                             % (lag, at - lag), length=lag)
            elif lag < 0:
                self._report("missing", "%d bytes (offsets %d..%d) never came; the stream goes on "
                             "at offset %d" % (-lag, at, at - lag - 1, at - lag), length=-lag)
            else:
                self._report("wrong", "%d byte(s) changed in place" % shift, length=shift)
            return
        for key, (conn, direction) in self.streams.items():
            found = locate(window, key) if key != self.key else None
            if found is not None:
                shift, offset = found
                self._report("foreign", "conn %d %s's bytes from its offset %d"
                             % (conn, direction, offset - shift), source=(conn, direction, offset - shift))
                return
        if at >= self.total:
            self._report("extra", "%d+ bytes after the end of the stream (%s...)"
                         % (len(window), window[:16].hex()))
        else:
            self._report("wrong", "bytes of no stream of this run (%s...)" % window[:16].hex())

    def _report(self, kind, text, source=None, length=None):
        self.fault = Fault(self.conn, self.direction, self.count, kind, text, source=source,
                           length=length)


# --- Plans ------------------------------------------------------------------------------

@dataclass
class Side:
    """What one end of a connection does.

    It sends its keystream (``send_key``, ``send_total`` bytes; only the first
    ``limit`` when it cuts) or echoes (``echo``) what it reads; it checks what
    it reads against ``recv_key`` (``recv_total`` bytes). ``cut``: "rst" (reset
    once ``limit`` bytes are sent) or "unread" (close once ``cut_recv`` bytes
    are read and more wait unread). ``far``: the other end cuts, so this one's
    stream ends early. ``send_after``: bytes to read before sending anything.
    ``close_after_send``: close as soon as everything is sent (dest-first),
    ``close_at_total``: as soon as everything is sent and read (no half-close).
    ``pause_at``: stop after this many bytes (0: before the first) until all of
    them have come back, then wait ``pause`` seconds. ``slow``: read in phases
    (``End.on_readable``). ``rcvbuf``: a small SO_RCVBUF, so that the relay's
    writes block as soon as this end lags (loopback's autotuned buffers hold
    megabytes: without it a relay hardly ever holds a chunk it could not write)."""

    recv_key: bytes
    recv_total: int
    send_key: Optional[bytes] = None
    send_total: int = 0
    echo: bool = False
    half_close: bool = True
    limit: Optional[int] = None
    cut: Optional[str] = None
    cut_recv: Optional[int] = None
    far: bool = False
    send_after: int = 0
    close_after_send: bool = False
    close_at_total: bool = False
    pause_at: Optional[int] = None
    pause: float = 0.0
    slow: bool = False
    rcvbuf: Optional[int] = None


@dataclass
class Mix:
    """The knobs of one run: sizes, weights and the pace of arrivals."""

    count: int = 200                   # connections
    max_stream: int = 4 << 20          # a stream is 1 B .. max_stream, log-uniform
    min_stream: int = 1
    # A slow reader reads ``backlog`` bytes in all, more than the socket buffers
    # between it and the relay hold (loopback's hold a few MB), ``phase`` bytes
    # between two stalls of ``stall`` seconds.
    backlog: tuple = (2 << 20, 8 << 20)
    phase: tuple = (64 << 10, 1 << 20)
    stall: tuple = (0.1, 0.6)
    weights: dict = field(default_factory=lambda: dict(PATTERNS))
    concurrency: int = 200             # connections open at most at once
    batch: int = 60                    # connections started together, at most
    pause: tuple = (1.2, 2.5)          # seconds an idle connection pauses
    # The share of ends (and every slow reader) with a small receive buffer, of
    # ``rcvbuf`` bytes (smaller than 128 KiB, with loopback's 64 KiB segments,
    # TCP waits for delayed ACKs and the run crawls).
    small_buffers: float = 0.25
    rcvbuf: tuple = (128 << 10, 512 << 10)


def plan(pattern, rng, mix, up, down, half_close):
    """(app Side, dest Side) of one connection of ``pattern``; ``up``, ``down``:
    its two keys."""
    app, dest = _sides(pattern, rng, mix, up, down, half_close)
    for side in (app, dest):
        if side.slow or rng.random() < mix.small_buffers:
            side.rcvbuf = rng.randint(*mix.rcvbuf)
    return app, dest


def _sides(pattern, rng, mix, up, down, half_close):
    def size(top=mix.max_stream, least=mix.min_stream):
        """least .. top bytes, log-uniform (0 one time in five when least is 0)."""
        if least == 0 and rng.random() < 0.2:
            return 0
        least = max(1, least)
        return max(least, min(top, int(math.exp(rng.uniform(math.log(least), math.log(top + 1))))))

    hc = half_close
    if pattern in ("echo", "idle"):
        u = size(least=max(2, mix.min_stream))
        app = Side(up, u, send_key=up, send_total=u, half_close=hc, close_at_total=not hc)
        dest = Side(up, u, echo=True, half_close=hc)
        if pattern == "idle":
            app.pause_at = rng.choice((0, rng.randint(1, u - 1)))
            app.pause = rng.uniform(*mix.pause)
        return app, dest
    if pattern in ("duplex", "slow"):
        slow_app = pattern == "slow" and rng.random() < 0.5
        slow_dest = pattern == "slow" and not slow_app
        # What a slow reader reads is larger than the buffers between it and the relay.
        u = rng.randint(*mix.backlog) if slow_dest else size()
        d = rng.randint(*mix.backlog) if slow_app else size()
        app = Side(down, d, send_key=up, send_total=u, half_close=hc, close_at_total=not hc,
                   slow=slow_app)
        dest = Side(up, u, send_key=down, send_total=d, half_close=hc, slow=slow_dest)
        return app, dest
    if pattern == "dest-first":
        u, d = size(least=0), size()
        app = Side(down, d, send_key=up, send_total=u, half_close=False)
        dest = Side(up, u, send_key=down, send_total=d, half_close=False, send_after=u,
                    close_after_send=True)
        return app, dest
    # The cuts: the cutting end sends only part of its stream, so the other end's
    # reading cannot end normally: it ends with the cut.
    u, d = size(least=2), size(least=2)
    app = Side(down, d, send_key=up, send_total=u, half_close=hc)
    dest = Side(up, u, send_key=down, send_total=d, half_close=hc)
    cutter, other = (app, dest) if pattern == "app-rst" or (pattern == "unread" and rng.random() < 0.5) \
        else (dest, app)
    cutter.limit = rng.randint(0, cutter.send_total - 1)
    if pattern == "unread":
        cutter.cut, cutter.cut_recv = "unread", rng.randint(0, cutter.recv_total - 1)
    else:
        cutter.cut = "rst"
    other.far = True
    other.close_at_total = False
    return app, dest


# --- The two ends -------------------------------------------------------------------

class Conn:
    """One connection: its plan, its two ends and how each ended."""

    def __init__(self, number, pattern, app, dest):
        self.number, self.pattern, self.plans = number, pattern, {"app": app, "dest": dest}
        self.ends = {}                  # side -> End, once it exists
        self.finished = set()           # sides that ended
        self.opened = False
        self.app_port = self.dest_port = None

    def state(self):
        parts = []
        for side in ("app", "dest"):
            end = self.ends.get(side)
            waiting = "not arrived" if self.opened else "opening (SOCKS or connect)"
            parts.append("%s: %s" % (side, end.state() if end else waiting))
        return "; ".join(parts)


class End:
    """One socket of a connection, driven by the run's selector: it writes and
    reads as its ``Side`` says, feeds what it reads to its ``Check``, and after
    every step (``progress``) cuts, pauses, half-closes, ends, or says which
    events it waits for. ``verdict()`` once it has ended."""

    def __init__(self, run, conn, side, sock, first=b""):
        self.run, self.conn, self.side, self.sock = run, conn, side, sock
        self.plan = plan_ = conn.plans[side]
        self.rng = random.Random("%d %d %s" % (run.seed, conn.number, side))
        self.out = Keystream(plan_.send_key) if plan_.send_key else None
        self.limit = plan_.send_total if plan_.limit is None else plan_.limit
        self.echo = bytearray() if plan_.echo else None
        direction = "down" if side == "app" else "up"
        self.check = Check(conn.number, direction + (" (echo)" if conn.plans["dest"].echo and
                                                     side == "app" else ""),
                           plan_.recv_key, plan_.recv_total, run.streams)
        if plan_.rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, plan_.rcvbuf)
        self.pending = memoryview(first)
        self.sent = self.received = 0
        self.eof = self.shut = self.closed = False
        self.paused_once = plan_.pause_at is None
        self.resume = None              # monotonic time a pause ends
        self.how = None
        self.mask = 0
        self.stalled, self.sips, self.phase_left = False, 0, 0
        conn.ends[side] = self
        if plan_.pause_at == 0:
            self._pause()
        if plan_.slow:
            self._stall()
        self.progress()

    def state(self):
        return "sent %d/%d, read %d/%d%s%s%s" % (
            self.sent, self.plan.send_total, self.received, self.plan.recv_total,
            ", EOF" if self.eof else "", ", half-closed" if self.shut else "",
            ", ended (%s)" % self.how if self.closed else "")

    # -- sending

    def _write_size(self):
        return int(2 ** self.rng.uniform(0, math.log2(MAX_WRITE)))

    def _produce(self):
        """The next bytes to write, or None."""
        if self.echo is not None:
            if not self.echo:
                return None
            n = min(len(self.echo), self._write_size())
            data = bytes(self.echo[:n])
            del self.echo[:n]
            self.sent += n
            return data
        plan_ = self.plan
        n = min(self._write_size(), self.limit - self.sent)
        if not self.paused_once:
            n = min(n, plan_.pause_at - self.sent)
        if n <= 0 or self.resume is not None or self.received < plan_.send_after:
            return None
        self.sent += n
        return self.out.next(n)

    def on_writable(self):
        for _ in range(8):
            if self.resume is not None:     # paused (the preamble too, before the first byte)
                break
            if not self.pending:
                data = self._produce()
                if data is None:
                    break
                self.pending = memoryview(data)
            try:
                n = self.sock.send(self.pending)
            except BlockingIOError:
                break
            except OSError:
                self.finish("reset")
                return
            self.pending = self.pending[n:]
            self.run.moved()
            if self.pending:
                break
        self.progress()

    # -- receiving

    def on_readable(self):
        plan_ = self.plan
        if plan_.cut_recv is not None and self.received >= plan_.cut_recv:
            self.finish("cut")          # bytes wait unread: the kernel answers close() with RST
            return
        for _ in range(SIPS if plan_.slow else 4):
            n = READ
            if plan_.slow:
                n = self.rng.randint(1, 9) if self.sips else min(READ, self.phase_left)
            if plan_.cut_recv is not None:
                n = min(n, plan_.cut_recv - self.received)
            if n <= 0 or (self.echo is not None and len(self.echo) >= ECHO_HELD):
                break
            try:
                data = self.sock.recv(n)
            except BlockingIOError:
                break
            except OSError:
                self.finish("reset")
                return
            self.run.moved()
            if not data:
                self.eof = True
                break
            self.received += len(data)
            self.check.feed(data)
            if self.echo is not None:
                self.echo += data
            if plan_.slow:
                self.sips = max(0, self.sips - 1)
                self.phase_left -= len(data)
                if self.phase_left <= 0:
                    self._stall()
                    break
        self.progress()

    def _stall(self):
        """A slow reader stops reading for a while; then sips, then reads a phase."""
        self.stalled = True
        self.run.later(time.monotonic() + self.rng.uniform(*self.run.mix.stall), self._drink)

    def _drink(self):
        self.stalled, self.sips = False, SIPS
        self.phase_left = self.rng.randint(*self.run.mix.phase)
        self.progress()

    # -- what next

    def _pause(self):
        self.paused_once = True
        self.resume = time.monotonic() + self.plan.pause
        self.run.later(self.resume, self.unpause)

    def unpause(self):
        self.resume = None
        self.progress()

    def progress(self):
        """After any step: cut, pause, half-close or end when it is time; else
        watch the socket for what this end waits for."""
        if self.closed:
            return
        plan_ = self.plan
        idle = not self.pending
        if plan_.cut == "rst" and idle and self.sent >= self.limit and "dest" in self.conn.ends:
            # (the app waits for the dest to have its preamble: a reset may discard it)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.finish("cut")
            return
        if not self.paused_once and idle and self.sent >= plan_.pause_at and \
                self.received >= plan_.pause_at:
            self._pause()
        if self.echo is not None:
            sent_all = idle and self.eof and not self.echo
        else:
            sent_all = idle and self.sent >= plan_.send_total
        if sent_all and plan_.half_close and not self.shut:
            self.shut = True
            try:
                self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                self.finish("reset")
                return
        # An EOF before the whole stream does not stop the sending (the verdict says
        # whether it was right), as an application goes on after its peer's EOF.
        if sent_all and (plan_.close_after_send or self.eof or
                         (plan_.close_at_total and self.received >= plan_.recv_total)):
            self.finish("done")
        else:
            self._watch()

    def _writing(self):
        if self.resume is not None:
            return False
        if self.pending:
            return True
        if self.echo is not None:
            return bool(self.echo)
        return self.sent < self.limit and self.received >= self.plan.send_after and \
            (self.paused_once or self.sent < self.plan.pause_at)

    def _watch(self):
        reading = not self.eof and not self.stalled and \
            not (self.echo is not None and len(self.echo) >= ECHO_HELD)
        mask = (selectors.EVENT_WRITE if self._writing() else 0) | (selectors.EVENT_READ if reading else 0)
        self.run.watch(self, mask)

    def finish(self, how):
        if self.closed:
            return
        self.closed, self.how = True, how
        self.run.watch(self, 0)
        self.sock.close()
        self.check.end()
        self.run.ended(self)

    def on_event(self, mask):
        if mask & selectors.EVENT_READ and not self.closed:
            self.on_readable()
        if mask & selectors.EVENT_WRITE and not self.closed:
            self.on_writable()

    def verdict(self, resets_travel):
        """The Fault of this end, or None."""
        plan_, check = self.plan, self.check
        fault = check.fault
        if fault is None and self.how != "cut":
            if plan_.far:
                if self.eof and resets_travel:
                    fault = Fault(check.conn, check.direction, check.count, "clean-end",
                                  "the other end cut the tunnel, but this end saw a plain EOF "
                                  "(a cut stream that looks whole)")
            elif self.how != "done" or check.count != plan_.recv_total:
                fault = Fault(check.conn, check.direction, check.count, "short",
                              "%s after %d of %d bytes" % ("EOF" if self.how == "done" else self.how,
                                                           check.count, plan_.recv_total))
        if fault is not None:
            fault.pattern = self.conn.pattern
        return fault


class Arrival:
    """A connection accepted by the destination, until its preamble says whose it is."""

    def __init__(self, run, sock):
        self.run, self.sock, self.got = run, sock, b""
        self.closed, self.mask = False, 0
        sock.setblocking(False)
        run.watch(self, selectors.EVENT_READ)

    def on_event(self, mask):
        try:
            data = self.sock.recv(PREAMBLE.size - len(self.got))
        except BlockingIOError:
            return
        except OSError as exc:
            return self._fail("reset after %d bytes of its preamble (%s)" % (len(self.got), exc))
        if not data:
            return self._fail("EOF after %d bytes of its preamble" % len(self.got))
        self.got += data
        if len(self.got) < PREAMBLE.size:
            return
        magic, number = PREAMBLE.unpack(self.got)
        conn = self.run.conns.get(number)
        if magic != MAGIC or conn is None or "dest" in conn.ends:
            return self._fail("a preamble for no connection waiting: %s" % self.got.hex())
        self.run.watch(self, 0)
        self.closed = True
        self.run.arrivals.discard(self)
        try:
            conn.dest_port = self.sock.getpeername()[1]
        except OSError:                 # reset already: the End finds out
            pass
        End(self.run, conn, "dest", self.sock)
        app = conn.ends.get("app")
        if app is not None:
            app.progress()              # an app that waits to cut may cut now

    def _fail(self, text):
        self.run.watch(self, 0)
        self.closed = True
        self.sock.close()
        self.run.arrivals.discard(self)
        self.run.faults.append(Fault(-1, "up", 0, "preamble", "a connection to the destination: "
                                     + text))


# --- The run -------------------------------------------------------------------------

class Destination:
    """The listening socket of the service behind the server proxy; a Run serves it."""

    def __init__(self):
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(1024)
        self.listener.setblocking(False)
        self.address = self.listener.getsockname()

    def close(self):
        self.listener.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class Result:
    """What a run found (``faults``, in the order found) and carried."""

    faults: list
    figures: dict                      # pattern -> [connections, bytes up, bytes down]
    seconds: float
    conns: dict                        # number -> Conn
    peak: int                          # connections open at once, at most

    def totals(self):
        return [sum(row[i] for row in self.figures.values()) for i in range(3)]

    def summary(self):
        conns, up, down = self.totals()
        lines = ["%d connections (up to %d at once), %.1f MB up, %.1f MB down checked in %.1f s"
                 % (conns, self.peak, up / 1e6, down / 1e6, self.seconds)]
        for pattern, (n, u, d) in sorted(self.figures.items()):
            lines.append("  %-10s %5d connections  %9d bytes up  %9d bytes down" % (pattern, n, u, d))
        return "\n".join(lines)


class Run:
    """One stress run: ``mix.count`` connections opened with ``connect()`` (a
    blocking call on an opener thread that returns a socket whose tunnel is open:
    SOCKS done, or a plain connect for a fixed --dest), served by ``dest``.

    ``half_close``: the tunnel carries a half-close (False across obfs4proxy).
    ``resets_travel``: a cut at one end reaches the other as a reset (our relay).
    """

    def __init__(self, dest, connect, mix, seed=1, half_close=True, resets_travel=True,
                 deadline=600.0, openers=8):
        self.dest, self.connect, self.mix, self.seed = dest, connect, mix, seed
        self.half_close, self.resets_travel = half_close, resets_travel
        self.deadline, self.openers = deadline, openers
        self.rng = random.Random(seed)
        self.selector = selectors.DefaultSelector()
        self.conns = {}                 # number -> Conn, while live
        self.done = {}                  # number -> Conn, ended
        self.streams = {}               # key -> (conn, direction)
        self.arrivals = set()
        self.faults = []
        self.figures = {}
        self._timers, self._order = [], itertools.count()
        self._opened = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._last_move = time.monotonic()
        self._started = self.peak = 0

    # -- for the ends

    def moved(self):
        self._last_move = time.monotonic()

    def later(self, when, fn):
        heapq.heappush(self._timers, (when, next(self._order), fn))

    def watch(self, owner, mask):
        if mask == owner.mask:
            return
        if not owner.mask:
            self.selector.register(owner.sock, mask, owner)
        elif not mask:
            self.selector.unregister(owner.sock)
        else:
            self.selector.modify(owner.sock, mask, owner)
        owner.mask = mask

    def ended(self, end):
        conn = end.conn
        conn.finished.add(end.side)
        if conn.finished == {"app", "dest"}:
            self._close_conn(conn)

    def _close_conn(self, conn):
        del self.conns[conn.number]
        self.done[conn.number] = conn
        row = self.figures.setdefault(conn.pattern, [0, 0, 0])
        row[0] += 1
        for side, end in conn.ends.items():
            fault = end.verdict(self.resets_travel)
            if fault is not None:
                self.faults.append(fault)
            row[2 if side == "app" else 1] += end.check.count

    # -- the loop

    def go(self):
        began = time.monotonic()
        self.selector.register(self.dest.listener, selectors.EVENT_READ, "accept")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "opened")
        self.later(began, self._start_batch)
        try:
            with ThreadPoolExecutor(self.openers) as self._pool:
                while self.conns or self.arrivals or self._started < self.mix.count:
                    now = time.monotonic()
                    if now - self._last_move > STALL or now - began > self.deadline:
                        self._stalled(now - self._last_move > STALL)
                        break
                    timeout = 1.0
                    if self._timers:
                        timeout = min(timeout, max(0.0, self._timers[0][0] - now))
                    for key, mask in self.selector.select(timeout):
                        if key.data == "accept":
                            self._accept()
                        elif key.data == "opened":
                            self._take_opened()
                        elif not key.data.closed:
                            key.data.on_event(mask)
                    now = time.monotonic()
                    while self._timers and self._timers[0][0] <= now:
                        heapq.heappop(self._timers)[2]()
        finally:
            self._close_all()
        return Result(self.faults, self.figures, time.monotonic() - began, self.done, self.peak)

    def _start_batch(self):
        mix = self.mix
        room = min(mix.count - self._started, mix.concurrency - len(self.conns))
        for _ in range(min(room, self.rng.randint(1, mix.batch))):
            self._start_one()
        if self._started < mix.count:
            self.later(time.monotonic() + self.rng.uniform(0.0, 0.25), self._start_batch)

    def _start_one(self):
        number = self._started
        self._started += 1
        # A connection's plan depends on the seed and its number alone (not on the
        # timing), so that "seed 21, conn 123" is the same connection in every run.
        rng = random.Random("%d plan %d" % (self.seed, number))
        pattern = rng.choices(list(self.mix.weights), weights=list(self.mix.weights.values()))[0]
        up, down = stream_key(self.seed, number, "up"), stream_key(self.seed, number, "down")
        self.streams[up], self.streams[down] = (number, "up"), (number, "down")
        app, dest = plan(pattern, rng, self.mix, up, down, self.half_close)
        conn = self.conns[number] = Conn(number, pattern, app, dest)
        self.peak = max(self.peak, len(self.conns))
        self.moved()
        self._pool.submit(self._open, conn)

    def _open(self, conn):
        """On an opener thread: connect, then hand the socket to the loop."""
        try:
            sock = self.connect()
        except Exception as exc:      # reported as the connection's fault
            sock = exc
        self._opened.put((conn, sock))
        self._wake_w.send(b"x")

    def _take_opened(self):
        self._wake_r.recv(4096)
        while True:
            try:
                conn, sock = self._opened.get_nowait()
            except queue.Empty:
                return
            self.moved()
            if isinstance(sock, Exception):
                self.faults.append(Fault(conn.number, "up", 0, "open", "could not open the tunnel: %r"
                                         % (sock,), pattern=conn.pattern))
                conn.finished.update(("app", "dest"))
                self._close_conn(conn)
                continue
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.opened, conn.app_port = True, sock.getsockname()[1]
            End(self, conn, "app", sock, first=PREAMBLE.pack(MAGIC, conn.number))

    def _accept(self):
        while True:
            try:
                sock, _ = self.dest.listener.accept()
            except BlockingIOError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.arrivals.add(Arrival(self, sock))
            self.moved()

    def _stalled(self, stalled):
        what = "nothing moved for %.0f s" % STALL if stalled else "the run passed %.0f s" % self.deadline
        for conn in list(self.conns.values()):
            self.faults.append(Fault(conn.number, "both", 0, "stalled", "%s: %s" % (what, conn.state()),
                                     pattern=conn.pattern))
        for arrival in self.arrivals:
            self.faults.append(Fault(-1, "up", len(arrival.got), "stalled",
                                     "%s: a destination connection still waits for its preamble" % what))

    def _close_all(self):
        for conn in list(self.conns.values()):
            for end in conn.ends.values():
                if not end.closed:
                    end.closed = True
                    end.sock.close()
        for arrival in list(self.arrivals):
            arrival.sock.close()
        while not self._opened.empty():  # opened after the loop ended (a stall)
            sock = self._opened.get()[1]
            if isinstance(sock, socket.socket):
                sock.close()
        self.selector.close()
        self._wake_r.close()
        self._wake_w.close()
