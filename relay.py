"""relay.py: the pump. Once a tunnel's handshake is done, its bytes go through here.

A ``Relay`` is one tunnel's two directions between two sockets::

    upstream (cleartext: the application, or the server's --dest)
        | up:   read, transport.send (or send_in_place, send_paced), write
        v                                                      ^
    downstream (the transport's bytes: the other obfsproxy)    | down: read,
                                                               | transport.receive, write

A ``Pump`` is one thread that drives every relay handed to it with one selector:
it watches each socket only for what its directions wait for, gives the relay a
turn when a socket is ready or a timer is due (a turn is small: one read per
direction, so that every relay gets its turn soon), and calls back once the
relay has ended. Nothing here knows tunnels, listeners, logging policy or transport
names; it knows sockets, the transport contract's data-phase calls
(transports.py) and buffers.

The rules every direction follows (sshuttle's ``ssnet.py`` is the model):

* it holds at most one chunk's output (``pending``, and for a paced transport
  the ``pieces`` still to go), and reads its source only once all of that is
  written: that is the backpressure, so a reader that does not read stops its
  writer without the relay growing;
* EOF on its source travels on as shutdown(SHUT_WR) once everything before it
  is written, after ``transport.end()``'s bytes (TLS close_notify) on the way
  to the peer; the other direction keeps flowing (half-close);
* the tunnel ends when both directions have ended; a reset on either socket
  ends it abortively (RST on both hops, so neither end mistakes a failure for
  a clean end of stream); the transport's ProtocolError ends it after the
  plaintext decoded before the error (its ``data``) has been delivered.

Why one thread for every relay: the GIL lets one thread run Python at a time, so
thousands of relay threads only fight over it. Measured on a 2-core machine
with a thread per relay: 5,000 idle tunnels closed at once woke 5,000 threads
and took about a minute and ~100 CPU-s, SIGTERM unanswered meanwhile; a
parking poller plus a gate in front of the relay threads brought that to
0.63 s and 0.74 CPU-s, with three schedulers for one state machine. One pump
does the same work with one scheduler (figures in the README's Performance
section).
"""

import errno
import heapq
import itertools
import logging
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections import deque

# A turn: what one relay does each time the pump comes to it. Each woken
# direction reads once, so a relay that becomes ready waits for at most one read
# of each busy relay, plus due timers. 8 reads of 256 KiB made an interactive
# tunnel's echo wait 1.5-3 s beside 16 bulk obfs4 tunnels; with one 64 KiB read,
# about what obfs4proxy's waits (sshuttle reads 64 KiB per socket per wake-up).
# But a 64 KiB read costs the relay about twice the CPU per byte of a 256 KiB
# one when the transform is fast (dummy, obfs2). So a direction's read doubles
# from CHUNK up to MAX_CHUNK while a read takes under half TURN_SECONDS, and
# halves when one takes over it (obfs4 spends ~0.65 ms of CPU on 64 KiB with
# PyNaCl, so it stays at CHUNK; dummy moves 256 KiB in ~0.1 ms); and the relays
# of a pump share ROUND: with n relays, each reads at most ROUND / n, never
# less than CHUNK. So a round moves at most max(ROUND, n x CHUNK) a direction,
# and as many readers that stall hold at most about that (a stalled direction
# keeps the rest of its last read; 256 KiB reads made 200 such tunnels hold
# 25 MiB, 64 KiB ones 7 MiB). A full destination brings the read back to CHUNK.
CHUNK = 64 * 1024        # bytes a direction reads in one turn, at first
MAX_CHUNK = 4 * CHUNK    # ... and at most, while its reads take under TURN_SECONDS / 2
# ... and at least, where the transform itself is slow. Below CHUNK a read halves
# only while the thread's CPU time for a turn (not the time on the clock, which
# waits for the GIL and the scheduler inflate on any route) stays over
# TURN_SECONDS: plain-Python AES (a Python without ctypes) spends ~72 ms of CPU on
# 64 KiB, so its turns come down to ~2.3 ms; every other route's 64 KiB costs
# well under 1 ms of CPU and never reads less than CHUNK.
MIN_CHUNK = 2 * 1024
TURN_SECONDS = 0.001     # about the most a turn grows to take
ROUND = 16 * CHUNK       # what one read of every relay of a pump may add up to (1 MiB)
IDLE_CHECK = 1.0         # seconds between looks for a reset on a socket watched for nothing
SPARE_BUFFERS = 2        # MAX_CHUNK buffers a Pump keeps for reuse. A turn gives its buffer
                         # back before the next turn starts, so one is lent at a time

_NOTHING = memoryview(b"")
if hasattr(time, "CLOCK_THREAD_CPUTIME_ID"):
    _CLOCK, _THREAD_CPU = time.clock_gettime, time.CLOCK_THREAD_CPUTIME_ID

    def _cpu_time():
        """The CPU time this thread has used, in seconds."""
        return _CLOCK(_THREAD_CPU)
else:                   # Windows: no clock per thread; the clock on the wall stands in
    _cpu_time = time.monotonic
# SO_LINGER on, 0 seconds: close() then sends RST instead of FIN.
_ABORT_ON_CLOSE = struct.pack("HH" if sys.platform == "win32" else "ii", 1, 0)


class BufferPool:
    """Chunk buffers lent to directions and given back once a chunk is written,
    so that an idle tunnel holds none. Used by its Pump's thread only, so it
    needs no lock."""

    def __init__(self, spare=SPARE_BUFFERS):
        self._spare, self._buffers = spare, []

    def lend(self):
        return self._buffers.pop() if self._buffers else bytearray(MAX_CHUNK)

    def give_back(self, buffer):
        if len(self._buffers) < self._spare:
            self._buffers.append(buffer)


def abort(*sockets):
    """Make close() send RST instead of FIN on each socket."""
    for sock in sockets:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT_ON_CLOSE)
        except OSError:
            pass


# Linux's SO_ERROR also returns (and clears) "soft" errors, such as a transient
# ICMP unreachable, that TCP itself survives on an established connection.
_SOFT_ERRORS = {errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN,
                errno.ECONNREFUSED, errno.EPROTO, errno.ENOPROTOOPT}


def raise_pending_error(sock):
    """Raise the socket's pending error (a reset) as OSError, if it has one."""
    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if error in _SOFT_ERRORS:
        try:
            sock.getpeername()  # still connected: TCP rides it out
            return
        except OSError:
            pass
    if error:
        text = os.strerror(error) if sys.platform != "win32" else "socket error %d" % error
        raise OSError(error, text)


# --- One direction --------------------------------------------------------------------

class _Direction:
    """One direction of a relay: read ``src``, transform, write ``dst``.

    ``pending`` is the unwritten rest of the last output; ``pieces`` are (bytes,
    delay) still to go after it: a paced transport's pieces, each released
    ``delay`` seconds after the one before, and bytes the transport owes the
    peer (``owe``). An in-place chunk stays in a lent buffer that goes back as
    soon as it is written, or once ``dst`` is full (``hold_little``). ``count``
    is the application bytes it carried: read from ``src`` going up, delivered
    to ``dst`` coming down.
    """

    __slots__ = ("src", "dst", "transform", "pending", "buffer", "eof", "done", "count", "size",
                 "pieces", "not_before", "delay", "buffers", "at_eof", "failure", "counts_output",
                 "ended", "probing")

    def __init__(self, src, dst, transform, counts_output=False, at_eof=None, ended=None):
        self.src, self.dst, self.transform = src, dst, transform
        self.counts_output, self.at_eof, self.ended = counts_output, at_eof, ended
        self.pending, self.pieces = _NOTHING, deque()
        self.buffer = self.buffers = self.failure = None
        self.eof = self.done = False
        self.not_before = self.delay = 0.0
        self.count = 0
        self.size = CHUNK
        self.probing = False     # the next turn also measures its CPU time (see MIN_CHUNK)

    def take(self, out, buffer=None):
        """Queue a transform's output (bytes, a memoryview of ``buffer``, or a list
        of paced pieces); give ``buffer`` back unless the output lives in it."""
        if isinstance(out, list):
            self.pieces.extend(out)
            out = _NOTHING
        elif not isinstance(out, memoryview):
            out = memoryview(out)
        if self.counts_output:
            self.count += len(out)
        if buffer is not None and out.obj is buffer:
            self.buffer = buffer
        elif buffer is not None:
            self.buffers.give_back(buffer)
        self.pending = out

    def owe(self, data):
        """Bytes the transport owes the peer (``data_to_send``), after what is queued."""
        self.pieces.append((data, 0.0))

    def waiting(self):
        """Seconds until the next piece may go (0 if none waits, or it may go now)."""
        if self.pending or not self.pieces:
            return 0.0
        return max(0.0, self.not_before - time.monotonic())

    def reading(self):
        return not self.eof and self.failure is None

    def hold_little(self):
        """``dst`` is full, maybe for good (a reader that never reads): keep a
        copy of what is left, not the lent buffer or the larger output it lies
        in, so that a stalled direction holds only its unwritten bytes. The
        copy is at most a chunk, made once each time ``dst`` fills."""
        pending = self.pending
        if self.buffer is not None or pending.nbytes < len(pending.obj):
            self.pending = memoryview(bytes(pending))
            if self.buffer is not None:
                self.buffers.give_back(self.buffer)
                self.buffer = None

    def pump(self, share=CHUNK):
        """One turn: write what is pending; once all of it has gone, read one
        chunk, transform it and write it. The chunk is at most ``size`` bytes
        and at most ``share``, this relay's part of ROUND. A
        direction with more to read is ready again and gets its next turn after
        the other ready relays have had theirs (Pump)."""
        if not self.write() or not self.reading():
            return
        buffer, size, wanted = self.buffers.lend(), 0, min(self.size, share)
        began = time.monotonic()
        cpu = _cpu_time() if self.probing else None
        try:
            size = self.src.recv_into(buffer, wanted)
            out = self.transform(memoryview(buffer)[:size]) if size else None
        except BlockingIOError:
            self.buffers.give_back(buffer)
            return
        except BaseException as exc:
            self.buffers.give_back(buffer)
            data = getattr(exc, "data", None) if size else None
            if not data:
                raise            # a reset, or a protocol error with nothing to deliver first
            self.failure = exc   # deliver the plaintext decoded before the error, then fail
            self.take(data)
            self.write()
            return
        if not size:
            self.buffers.give_back(buffer)
            self.eof = True
            if self.at_eof is not None:
                tail = self.at_eof()
                if tail:
                    self.owe(tail)
            self.write()
            return
        if not self.counts_output:
            self.count += size
        self.take(out, buffer)
        if self.ended is not None and self.ended():   # the stream ended inside it (TLS close_notify)
            self.eof = True
        written = self.write()
        took = time.monotonic() - began
        if cpu is not None:                # a probe: is the work itself slow, or was it a wait?
            cpu = _cpu_time() - cpu
            self.probing = False
            if cpu > TURN_SECONDS and MIN_CHUNK < self.size <= CHUNK and 2 * size >= self.size:
                self.size //= 2
                self.probing = True        # and look again at the smaller read
                return
        elif took > TURN_SECONDS and MIN_CHUNK < self.size <= CHUNK:
            self.probing = True
        if not written:
            self.size = min(self.size, CHUNK)   # dst is full: it sets the pace, small reads do
        elif size == wanted == self.size:  # the source had more: size the next read to time
            if took < TURN_SECONDS / 2 and size < MAX_CHUNK:
                self.size = 2 * size
            elif took > TURN_SECONDS and size > CHUNK:
                self.size = size // 2

    def write(self):
        """Write what is pending (and pieces whose time has come); then give the
        lent buffer back and, after EOF on ``src``, pass the EOF on. True when
        nothing is left to write. Raises the stored failure once its plaintext
        has gone."""
        while True:
            while self.pending:
                try:
                    sent = self.dst.send(self.pending)
                except BlockingIOError:
                    self.hold_little()
                    return False
                self.pending = self.pending[sent:]
                if not self.pending and self.delay:   # a paced piece went: the next waits
                    self.not_before = time.monotonic() + self.delay
                    self.delay = 0.0
            if self.buffer is not None:
                self.pending = _NOTHING
                self.buffers.give_back(self.buffer)
                self.buffer = None
            if not self.pieces:
                break
            if time.monotonic() < self.not_before:
                return False
            piece, self.delay = self.pieces.popleft()
            self.pending = memoryview(piece)
        if self.failure is not None:
            raise self.failure
        if self.eof and not self.done:
            self.done = True
            try:
                self.dst.shutdown(socket.SHUT_WR)
            except OSError:  # the other end is already gone; the other direction will see it
                pass
        return True


def sender(transport):
    """The up direction's transform: plaintext chunk -> what to write. Returns
    the same chunk (encrypted where it lies), new bytes, or a list of (bytes,
    delay) pieces for a paced transport. One that also sends in place (webtunnel's
    bridge, which paces its first bytes only) is asked each time whether it still
    paces, so that the rest goes in place."""
    in_place = getattr(transport, "send_in_place", None)
    if getattr(transport, "paced", False):
        if in_place is None:
            return lambda chunk: transport.send_paced(bytes(chunk))
        return lambda chunk: (transport.send_paced(bytes(chunk)) if transport.paced
                              else chunk if in_place(chunk) else transport.send(bytes(chunk)))
    if in_place is None:
        return lambda chunk: transport.send(bytes(chunk))
    return lambda chunk: chunk if in_place(chunk) else transport.send(bytes(chunk))


def receiver(transport):
    """The down direction's transform: wire chunk -> plaintext to write."""
    in_place = getattr(transport, "receive_in_place", None)
    if in_place is None:
        return lambda chunk: transport.receive(bytes(chunk))
    return lambda chunk: chunk if in_place(chunk) else transport.receive(bytes(chunk))


# --- One relay ---------------------------------------------------------------------------

class Relay:
    """One tunnel's two directions, and what its sockets wait for.

    ``upstream`` carries cleartext, ``downstream`` the transport's bytes.
    ``to_upstream`` is plaintext that arrived glued to the peer's handshake;
    ``to_downstream`` is application data that came before the tunnel was
    open (pipelined after a SOCKS request), still to go through the transport.

    Methods for the driver (``Pump``): ``start()`` once; then ``watch()`` ->
    ({socket: events}, seconds until a timer is due or None), and
    ``handle([(socket, events)], share)`` when sockets are ready (``[]``: the
    timer is due; ``share``: the most a direction may read, see ROUND) until
    ``finished``;
    ``abort()`` after an OSError; ``close()`` always, at the end (it gives the
    buffers back, never closes the sockets: their owner does). ``handle``
    raises OSError when a socket fails and the transport's ProtocolError when
    the peer breaks the protocol.
    """

    def __init__(self, upstream, downstream, transport, to_upstream=b"", to_downstream=b""):
        self.upstream, self.downstream, self.transport = upstream, downstream, transport
        end = getattr(transport, "end", None)
        self.up = _Direction(upstream, downstream, sender(transport), at_eof=end)
        # A transport may see its peer end the stream before the FIN (peer_ended: TLS
        # close_notify), and may refuse a FIN that came without such an end (receive_eof).
        ended = (lambda: transport.peer_ended) if hasattr(transport, "peer_ended") else None
        self.down = _Direction(downstream, upstream, self._receive_then_owe(receiver(transport)),
                               counts_output=True, at_eof=getattr(transport, "receive_eof", None),
                               ended=ended)
        self.initial = (to_upstream, to_downstream)
        self.registered = {upstream: 0, downstream: 0}
        self.unwatched = []
        for sock in (upstream, downstream):
            if sock.gettimeout() != 0.0:    # the proxy's sockets are non-blocking already
                sock.setblocking(False)

    def _receive_then_owe(self, receive):
        """Receiving may make the transport owe the peer bytes (TLS key updates and
        session tickets, an answer): they go out on the up direction, in order.

        The closure holds the up direction, never the relay itself: a relay in a
        reference cycle outlived its tunnel until the garbage collector's next
        full pass, with its transport, its ciphers and its sockets (a few
        thousand objects after a few hundred tunnels, and a longer pause at
        each pass); without one it goes as soon as the pump lets go of it."""
        data_to_send = self.transport.data_to_send
        owe = self.up.owe

        def transform(chunk):
            out = receive(chunk)
            owed = data_to_send()
            if owed:
                owe(owed)
            return out
        return transform

    @property
    def finished(self):
        return self.up.done and self.down.done

    def start(self, buffers):
        """Take the pump's buffers; queue and write the initial bytes."""
        self.up.buffers = self.down.buffers = buffers
        to_upstream, to_downstream = self.initial
        self.initial = None
        if to_downstream:
            transport = self.transport
            self.up.count += len(to_downstream)   # read from the application, as pump() counts
            self.up.take((transport.send_paced if getattr(transport, "paced", False)
                          else transport.send)(bytes(to_downstream)))
        self.down.take(to_upstream)
        if self.down.ended is not None and self.down.ended():   # it ended with the handshake
            self.down.eof = True
        self.up.write()
        self.down.write()

    def watch(self):
        """({socket: events wanted}, seconds until the relay needs a look without
        any socket being ready, or None)."""
        up, down = self.up, self.down
        wanted = {self.upstream: 0, self.downstream: 0}
        timeout = None
        for direction in (up, down):
            if direction.pending:
                wanted[direction.dst] |= selectors.EVENT_WRITE
            elif direction.pieces:  # a paced piece waits for its time
                wait = direction.waiting()
                timeout = wait if timeout is None else min(timeout, wait)
            elif direction.reading():
                wanted[direction.src] |= selectors.EVENT_READ
        self.unwatched = [sock for sock, events in wanted.items() if not events]
        if self.unwatched:
            timeout = IDLE_CHECK if timeout is None else min(timeout, IDLE_CHECK)
        return wanted, timeout

    def handle(self, ready, share=CHUNK):
        """Act on [(socket, events)], or on a timer that came due ([])."""
        up, down = self.up, self.down
        if not ready:
            for direction in (up, down):   # a paced piece's time may have come
                if direction.pieces and not direction.pending:
                    direction.pump()
            if self.unwatched and not any(d.pieces for d in (up, down)):
                for sock in self.unwatched:     # IDLE_CHECK passed quietly: look for a reset
                    raise_pending_error(sock)
        woken = []                             # one turn each, however many sockets woke it
        for sock, events in ready:
            for direction in (down, up):
                if direction not in woken and (
                        (sock is direction.dst and events & selectors.EVENT_WRITE) or
                        (sock is direction.src and events & selectors.EVENT_READ)):
                    woken.append(direction)
        for direction in woken:
            direction.pump(share)
        if up.pieces and not up.pending:       # what receiving made the transport owe
            up.write()

    def abort(self):
        """A failed tunnel ends abortively on both hops (RST, not FIN), so that
        each peer sees a failure rather than a clean end of the stream."""
        abort(self.upstream, self.downstream)

    def close(self):
        """Give back what the relay holds (not the sockets: their owner closes them)."""
        for direction in (self.up, self.down):
            if direction.buffer is not None:
                direction.pending = _NOTHING
                direction.buffers.give_back(direction.buffer)
                direction.buffer = None


# --- The one driver ---------------------------------------------------------------------

# Selectors whose waiting call sees descriptors that another thread registers
# meanwhile (epoll_wait(2), NOTES); the others (poll, select, kqueue, /dev/poll)
# are woken to look again.
_LIVE_REGISTRATION = tuple(getattr(selectors, name) for name in ("EpollSelector",)
                           if hasattr(selectors, name))

class Stopped(Exception):
    """The pump stopped while the relay was live (the process is stopping now)."""


class Pump:
    """One thread and one selector driving every relay handed to it.

    Methods for the caller: ``add(relay, on_end)`` from any thread: the relay
    is started (its first bytes written) on the caller's thread, and once it
    has ended ``on_end(error)`` is called on the pump's thread (error: None
    for a clean end, else the OSError, the transport's ProtocolError or
    ``Stopped``), after giving its buffers back; if starting fails, at once on
    the caller's thread. The sockets are the caller's to close, in
    ``on_end``. ``stop(abort)``
    ends the pump for good; with ``abort`` every live relay's sockets are set
    to reset when closed and their ``on_end`` gets ``Stopped``. ``len(pump)``:
    the live relays.

    The thread, its selector and its wake-up pair exist only while there is
    work: LINGER seconds without a relay and they are gone (a proxy at rest
    holds nothing), and the next ``add`` makes them again. ``capacity``
    (relays) is set only where the selector is select() itself (Windows),
    which fails past 512 sockets: the caller then starts another pump.

    The hand-over wakes the pump only where it must. With epoll, ``add``
    registers the relay's sockets itself (under the pump's lock): epoll_wait(2)
    notices descriptors another thread adds while it waits, so the pump wakes
    when the relay has bytes to move, not once more for the hand-over (each
    wake-up was a context switch and a fight for the GIL on every tunnel's
    critical path). Elsewhere, and for a relay that needs a timer at once,
    the relay goes on ``_incoming`` and the wake-up pair is written.

    Fair turns. Each time round, the relays the selector reports ready get one
    turn each (every woken direction reads once: ``_Direction.pump``), those
    served longest ago first. So a relay that becomes ready waits for at most
    one turn of each busy relay, whatever order the selector reports them in:
    a read of at most MAX_CHUNK, and of CHUNK once the pump holds ROUND / CHUNK
    relays (see CHUNK). Due timers
    (a paced transport's next piece) are served before every turn, not once
    per round: one is late by at most the turn under way, and the earliest
    timer is the selector's timeout when no relay is ready.

    Connections a transport owns (meek's: transports.py says what they answer to) are
    driven the same way, with two more things: the sockets ``watch`` names may change
    from one step to the next (new ones are registered, missing ones let go of), and
    ``nudge(obj)``, from any thread, steps an object soon with no socket ready, so
    that one object can tell another that what it waits for has changed.
    """

    LINGER = 2.0

    def __init__(self, name="pump"):
        self.capacity = 200 if selectors.DefaultSelector is selectors.SelectSelector else None
        self.buffers = BufferPool()
        self.name = name
        self._lock = threading.Lock()
        self._incoming = []           # (relay, on_end) handed over, not yet started
        self._relays = {}             # relay -> on_end
        self._timers = []             # heap of (when, order, relay); stale ones are skipped
        self._due = {}                # relay -> when its current timer is due
        self._served = {}             # relay -> the turn it last had (none yet: first in line)
        self._turns = 0
        self._order = itertools.count()
        self._stop = None             # None, "stop" or "abort"
        self._running = None          # the running thread's (selector, wake pair, ended)
        self._nudged = []             # relays to step again soon (nudge)
        self._ident = None            # the running thread's

    def __len__(self):
        with self._lock:
            return len(self._relays) + len(self._incoming)

    def add(self, relay, on_end):
        """Start ``relay`` and hand it over. RuntimeError (the relay started but
        not handed over) if the pump has stopped, or no thread or descriptor
        can be had for it."""
        try:
            relay.start(self.buffers)     # no buffer is lent here: the pool stays the pump's
        except Exception as exc:
            self._give_up(relay, on_end, exc)
            return
        if hasattr(relay, "pump"):       # a connection a transport owns (transports.py)
            relay.pump = self
        wanted, timeout = relay.watch()
        with self._lock:
            if self._stop is not None:
                raise RuntimeError("the pump has stopped")
            if self._running is None:
                self._running = self._start_thread()
            selector = self._running[0]
            if timeout is None and isinstance(selector, _LIVE_REGISTRATION) and \
                    self._register(selector, relay, wanted):
                self._relays[relay] = on_end
                return
            self._incoming.append((relay, on_end))
            self._wake(self._running)

    @staticmethod
    def _register(selector, relay, wanted):
        """Register a new relay's sockets; True if all went in. On an error
        (a socket closed or reset already) it takes back what it registered
        and says False: the pump then ends the relay the usual way."""
        try:
            for sock, events in wanted.items():
                if events:
                    selector.register(sock, events, relay)
                    relay.registered[sock] = events
        except (OSError, ValueError, KeyError):
            Pump._unregister(selector, relay)
            return False
        return True

    @staticmethod
    def _unregister(selector, relay):
        """Take the relay's sockets out of the selector (a socket closed or
        reset already may be out of it: that is no error)."""
        for sock, events in relay.registered.items():
            if events:
                try:
                    selector.unregister(sock)
                except (KeyError, ValueError, OSError):
                    pass
                relay.registered[sock] = 0

    @staticmethod
    def _give_up(relay, on_end, exc):
        """A relay that failed before the pump had it: ended here, as ``_fail`` would."""
        if isinstance(exc, OSError):
            relay.abort()
        relay.close()
        try:
            on_end(exc)
        except Exception:
            logging.getLogger("obfsproxy").error("error ending a relay", exc_info=True)

    def _start_thread(self):
        try:
            selector = selectors.DefaultSelector()
            try:
                wake = socket.socketpair()
            except OSError:
                selector.close()
                raise
        except OSError as exc:
            raise RuntimeError("no descriptor for the pump: %s" % (exc.strerror or exc))
        for end in wake:
            end.setblocking(False)
        selector.register(wake[0], selectors.EVENT_READ, None)
        running = (selector, wake, threading.Event())
        try:
            threading.Thread(target=self._run, args=(running,), name=self.name, daemon=True).start()
        except RuntimeError:
            self._close(running)
            raise
        return running

    def stop(self, abort=False, timeout=5.0):
        """End the pump for good; wait up to ``timeout`` for its thread. True if it ended."""
        with self._lock:
            self._stop = "abort" if abort else "stop"
            running = self._running
            if running is not None:
                self._wake(running)
        return running is None or running[2].wait(timeout)

    def nudge(self, relay):
        """Step ``relay`` again soon with no socket ready (``handle([])``), from
        any thread: how one connection a transport owns tells another that
        something it waits for has changed (a meek session's bytes for the HTTP
        request waiting on them), so that the pump asks it again what it watches.
        A relay that has ended meanwhile is skipped."""
        with self._lock:
            self._nudged.append(relay)
            running = self._running
        if running is not None and threading.get_ident() != self._ident:
            self._wake(running)

    @staticmethod
    def _wake(running):
        try:
            running[1][1].send(b"x")
        except OSError:   # full (it will wake anyway)
            pass

    @staticmethod
    def _close(running):
        running[0].close()
        for end in running[1]:
            end.close()

    def _run(self, running):
        selector, wake, ended = running
        self._ident = threading.get_ident()
        idle_since = time.monotonic()
        try:
            while self._stop is None:
                timeout = self.LINGER
                if self._nudged:
                    timeout = 0.0
                elif self._timers:
                    timeout = max(0.0, self._timers[0][0] - time.monotonic())
                ready = {}
                for key, events in selector.select(timeout):
                    if key.data is None:
                        self._drain_wake(wake[0])
                    else:
                        ready.setdefault(key.data, []).append((key.fileobj, events))
                if self._incoming:        # read without the lock: an add() now has woken us too
                    self._start_new(selector)
                # The relays served longest ago go first: one that has just become
                # ready waits for at most one turn of each busy relay.
                share = max(CHUNK, ROUND // max(1, len(self._relays)))
                for relay in sorted(ready, key=lambda relay: self._served.get(relay, 0)):
                    self._fire_timers(selector)
                    if relay not in self._relays:
                        with self._lock:      # an add() may be registering it right now:
                            pass              # let it finish (or it was a relay just ended)
                        if relay not in self._relays:
                            continue
                    self._turns += 1
                    self._served[relay] = self._turns
                    self._step(selector, relay, ready[relay], share)
                self._fire_timers(selector)
                if self._relays:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since >= self.LINGER:
                    with self._lock:
                        if not self._incoming and not self._relays and self._stop is None:
                            self._running = None      # the next add() starts another thread
                            return
            self._start_new(selector)
            for relay in list(self._relays):
                if self._stop == "abort":
                    relay.abort()
                self._end(selector, relay, Stopped("stopped with the tunnel open"))
        finally:
            self._close(running)
            ended.set()

    def _fire_timers(self, selector):
        """Step the relays whose timer is due (a paced piece's time has come).
        Called before every turn, so that a timer is late by at most the one
        turn under way, however many relays are ready."""
        if self._nudged:
            with self._lock:
                nudged, self._nudged = self._nudged, []
            for relay in nudged:
                if relay in self._relays:
                    self._step(selector, relay, [])
        if not self._timers or self._timers[0][0] > time.monotonic():
            return
        now, due = time.monotonic(), []
        while self._timers and self._timers[0][0] <= now:
            when, _, relay = heapq.heappop(self._timers)
            if self._due.get(relay) == when:
                del self._due[relay]
                due.append(relay)
        for relay in due:
            if relay in self._relays:
                self._step(selector, relay, [])

    @staticmethod
    def _drain_wake(sock):
        try:
            while len(sock.recv(4096)) == 4096:   # a short read took them all
                pass
        except OSError:
            pass

    def _start_new(self, selector):
        """Take over the relays handed over through ``_incoming`` (started already)."""
        with self._lock:
            incoming, self._incoming = self._incoming, []
        for relay, on_end in incoming:
            self._relays[relay] = on_end
            self._settle(selector, relay)

    def _step(self, selector, relay, events, share=CHUNK):
        try:
            relay.handle(events, share)
        except Exception as exc:
            self._fail(selector, relay, exc)
            return
        self._settle(selector, relay)

    def _settle(self, selector, relay):
        """After a step: end a finished relay, or register what it waits for."""
        if relay.finished:
            self._end(selector, relay, None)
            return
        wanted, timeout = relay.watch()
        registered = relay.registered
        try:
            for sock in [sock for sock in registered if sock not in wanted]:
                if registered.pop(sock):      # a socket the relay has let go of
                    selector.unregister(sock)
            for sock, events in wanted.items():
                if events != registered.get(sock, 0):
                    if not registered.get(sock, 0):
                        selector.register(sock, events, relay)
                    elif not events:
                        selector.unregister(sock)
                    else:
                        selector.modify(sock, events, relay)
                registered[sock] = events
        except (OSError, ValueError) as exc:   # a socket already closed or reset
            self._fail(selector, relay, exc if isinstance(exc, OSError) else OSError(errno.EBADF, str(exc)))
            return
        if timeout is None:
            self._due.pop(relay, None)
            return
        when = time.monotonic() + timeout
        if self._due.get(relay, when) < when:
            return      # an earlier timer stands: the relay then asks again (no heap entry a turn)
        self._due[relay] = when
        heapq.heappush(self._timers, (when, next(self._order), relay))

    def _fail(self, selector, relay, exc):
        if isinstance(exc, OSError):
            relay.abort()
        self._end(selector, relay, exc)

    def _end(self, selector, relay, error):
        on_end = self._relays.pop(relay)
        self._due.pop(relay, None)
        self._served.pop(relay, None)
        self._unregister(selector, relay)
        relay.close()
        try:
            on_end(error)
        except Exception:   # a bug in the caller: never let it stop every other tunnel
            logging.getLogger("obfsproxy").error("error ending a relay", exc_info=True)
