"""proxy.py: the running proxy, for every transport.

"Upstream" is the cleartext side, towards the application; "downstream" is
the obfuscated side, towards the other obfsproxy::

  application --SOCKS/plain--> client ==transport==> server --plain--> destination
              upstream          downstream  downstream         upstream

Follow one byte from the SOCKS port to the destination:

1. ``Proxy.serve`` accepts the application's connection and hands it to a
   connection thread (``Proxy._run``), which runs one handler.
2. ``handle_socks_client`` reads the SOCKS request (socks.py), makes the
   transport for this connection (``Settings.new_transport``, transports.py;
   its ephemeral keys, or obfs2's first message, come ready-made from the
   ``Proxy``'s pools when it has been idle, pool.py), connects to the server
   (outbound.py) and runs ``transport_handshake``; only then does it send the
   SOCKS success reply.
3. ``relay`` pumps both sockets: each chunk read from the application goes
   through ``transport.send`` (or ``send_in_place``) to the server, and each
   chunk from the server through ``transport.receive`` to the application.
4. On the server, ``handle_server`` runs the same handshake on the accepted
   socket, connects to ``--dest`` (Tor's ORPort, or its Extended ORPort after
   ``outbound.ext_orport_handshake``) and calls the same ``relay``.

One thread per busy connection: a blocking handshake under one ``Deadline``,
then ``relay`` until both directions have ended. A tunnel quiet for a second
gives its thread back and waits in the ``Parking`` (one epoll thread for all
of them), which carries it on when its sockets are ready. ``Proxy._end`` is
the one place that logs how a connection ended and closes its sockets (the
accepted one, and those the handler registered with ``tunnel.owns``).
Finished threads wait a little for the next connection (``Proxy`` says why).

Scale, measured on the 2-core test machine: one process holds about 10,000
tunnels (two descriptors each; --max-connections and the fd limit, which
``raise_descriptor_limit`` raises to 2 x --max-connections + 64, bound it)
at ~17 KiB of RSS per idle tunnel; 9,900 idle tunnels closed at once end in
~2.5 s and ~2.5 CPU-s; SIGTERM ends the process in 0.4-2 s even then
(``install_signal_handlers``). Busy tunnels each hold a thread of
THREAD_STACK address space.
"""

import dataclasses
import errno
import logging
import os
import queue
import select
import selectors
import socket
import struct
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Optional

import outbound
import pool
import socks
import transports
from outbound import Deadline, format_address, open_connection, send_all

log = logging.getLogger("obfsproxy")
NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")
SEVERITIES = {"error": logging.ERROR, "warning": logging.WARNING, "notice": NOTICE,
              "info": logging.INFO, "debug": logging.DEBUG}

CHUNK = 256 * 1024          # bytes read per recv(); also the most one direction holds
THREAD_STACK = 512 * 1024   # per-connection thread stack (the default is 8 MiB of address space)


# --- Settings ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a connection handler needs, from the command line or Tor.

    Frozen: one Settings is shared by every connection of a listener; make a
    changed copy with ``dataclasses.replace``.
    """

    transport: str = "obfs2"
    options: Any = dataclasses.field(default_factory=dict)  # client: defaults for each connection
    config: Any = None                 # server: the transport's config, made once per listener
    handshake_timeout: float = 30.0
    dest: Optional[tuple] = None       # (host, port): fixed client's server, or server's destination
    safe_logging: bool = True
    proxy: Optional[str] = None        # outgoing proxy URI (client), or None
    ext_cookie_file: Optional[str] = None  # dest is an Extended ORPort (server)
    record: Optional[transports.RecordDir] = None  # --record-dir
    sources: Optional[dict] = None     # outgoing source address per family (Tor's bind addresses)
    tap: Optional[Callable] = None     # wraps each new transport (the demo's recorder)
    pools: Any = None                  # the Proxy's Pools (set by Proxy.listen), or None

    def new_transport(self, initiator, args=None):
        """A fresh transport for one connection. ``args`` are the connection's
        SOCKS arguments (pt-spec 3.5); they override ``options``. Its first key
        work comes from a pool when one holds material for it (pool.py)."""
        cls = transports.transport_class(self.transport)
        if initiator:
            config = cls.client_config(dict(self.options, **(args or {})))
        else:
            config = self.config
        take = None if self.pools is None else self.pools.taker(self.transport, initiator, config)
        if take is not None:
            transport = transports.pooled_transport(self.transport, initiator, config, take)
        else:
            transport = cls(initiator, config)
        if self.record is not None:
            transport = self.record.wrap(transport)
        if self.tap is not None:
            transport = self.tap(transport)
        return transport

    def show(self, address):
        """An address for the log: scrubbed unless --no-safe-logging."""
        return "[scrubbed]" if self.safe_logging else format_address(address)


# --- Errors that end a connection --------------------------------------------------

class PeerClosed(Exception):
    """The peer closed the connection before the handshake was done."""


class HopFailed(Exception):
    """One hop of a tunnel failed; the message says which and why, for the
    log at the default level: "cannot reach --dest 127.0.0.1:1: connection
    refused". ``kind`` groups messages for rate limiting. What happens next:
    the connection is closed (after the SOCKS failure reply, if any)."""

    def __init__(self, kind, message, reply=b""):
        super().__init__(message)
        self.kind, self.reply = kind, reply


def why(exc):
    """A short lower-case reason for an OSError or any exception."""
    if isinstance(exc, socket.timeout):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return text[:1].lower() + text[1:]


def socks_code(exc):
    """The SOCKS5 reply code that tells the application why we failed."""
    if isinstance(exc, socket.timeout):
        return socks.TTL_EXPIRED
    if isinstance(exc, ConnectionRefusedError):
        return socks.CONNECTION_REFUSED
    if isinstance(exc, socket.gaierror):
        return socks.HOST_UNREACHABLE
    if isinstance(exc, OSError) and exc.errno == errno.ENETUNREACH:
        return socks.NETWORK_UNREACHABLE
    if isinstance(exc, OSError) and exc.errno == errno.EHOSTUNREACH:
        return socks.HOST_UNREACHABLE
    return socks.GENERAL_FAILURE


# --- Handshakes ------------------------------------------------------------------

def recv_some(sock, deadline):
    sock.settimeout(deadline.remaining())
    data = sock.recv(CHUNK)
    if not data:
        raise PeerClosed("peer closed the connection during the handshake")
    return data


class KeyWork:
    """The one slot for expensive handshake work (modular exponentiation,
    X25519, shared-secret hashing), held while a transport that says
    ``expensive`` runs ``start`` or ``receive``.

    That work holds the GIL: N handshakes computing at once would slow every
    other thread (live tunnels, the accept loop) N-fold. One at a time (two
    threads cannot run Python in parallel anyway) keeps live tunnels flowing;
    the others queue, each within its own handshake deadline. Owned by the
    ``Proxy``; see also ``prepare_for_serving`` (the switch interval).
    """

    def __init__(self):
        self._slot = threading.BoundedSemaphore(1)
        self._lock = threading.Lock()
        self.handshakes = 0           # transport handshakes under way, any transport
        self._last = 0.0              # when the last one ended (time.monotonic())

    def held(self, transport, deadline):
        return _Held(self._slot if transport.expensive else None, deadline)

    def begin(self):
        with self._lock:
            self.handshakes += 1

    def end(self):
        with self._lock:
            self.handshakes -= 1
            self._last = time.monotonic()

    def idle(self):
        """True after QUIET_SECONDS without any handshake. The pools refill only
        then, so that their key work never takes a core from a connection being
        set up (a 2-core machine running client, server and application has none
        to spare: refilling right after each take made back-to-back setups slower)."""
        return not self.handshakes and time.monotonic() - self._last >= QUIET_SECONDS


QUIET_SECONDS = 0.005   # no handshake for this long: the pools may refill


class Pools:
    """The Proxy's pools of handshake material (pool.py), one per kind of item
    (``transports.pool_recipe``): made when a listener opens, for the config it
    knows then; refilled only after a quiet spell without handshakes
    (``KeyWork.idle``). A connection whose
    config matches no pool (e.g. a SOCKS client sending another obfs2 secret)
    does its key work inline, as without pools."""

    def __init__(self, key_work, size):
        self.key_work, self.size = key_work, size
        self._pools = {}

    def prepare(self, name, initiator, config):
        recipe = transports.pool_recipe(name, initiator, config)
        if recipe is None or self.size <= 0:
            return
        key, make = recipe
        if key not in self._pools:
            self._pools[key] = pool.Pool(make, self.size, self.key_work.idle, name=name)

    def taker(self, name, initiator, config):
        """The ``take`` of the pool for this side, or None."""
        recipe = transports.pool_recipe(name, initiator, config)
        found = self._pools.get(recipe[0]) if recipe else None
        return None if found is None else found.take

    def close(self):
        for key, each in self._pools.items():
            each.close()
            log.info("pool of %s: %d taken ready, %d made on the spot", key[0] if isinstance(key, tuple)
                     else key, each.hits, each.misses)


class _Held:
    def __init__(self, slot, deadline):
        self.slot, self.deadline = slot, deadline

    def __enter__(self):
        if self.slot is not None and not self.slot.acquire(timeout=self.deadline.remaining()):
            raise socket.timeout("handshake deadline passed while waiting to derive keys")

    def __exit__(self, *exc):
        if self.slot is not None:
            self.slot.release()


def transport_handshake(sock, transport, deadline, key_work):
    """Send our first bytes, then read until the transport is open.

    Returns the plaintext that arrived glued to the end of the peer's
    handshake. What to send and when is the transport's business
    (``start``, then ``data_to_send`` after each ``receive``); this driver
    only moves bytes, under one deadline.
    """
    key_work.begin()
    try:
        with key_work.held(transport, deadline):
            ours = transport.start()
        send_all(sock, ours, deadline)
        plaintext = []
        while not transport.is_open:
            data = recv_some(sock, deadline)
            with key_work.held(transport, deadline):
                plaintext.append(transport.receive(data))
                owed = transport.data_to_send()
            send_all(sock, owed, deadline)
    finally:
        key_work.end()
    return b"".join(plaintext)


def drain_until(sock, until):
    """Read and discard until the monotonic time ``until`` or the peer's EOF:
    how an obfs4 server ends a failed handshake (it must not look different
    from a slow one). The caller then closes with a FIN."""
    try:
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            sock.settimeout(min(left, 5.0))
            try:
                if not sock.recv(CHUNK):
                    return
            except socket.timeout:
                continue
    except OSError:
        return


def handle_socks_client(conn, settings, tunnel):
    """SOCKS request -> connect to the server -> transport handshake ->
    only then the SOCKS success reply -> relay."""
    deadline = Deadline(settings.handshake_timeout)
    negotiation = socks.SocksServer()
    while negotiation.request is None:
        send_all(conn, negotiation.receive(recv_some(conn, deadline)), deadline)
    request = negotiation.request
    shown = settings.show((request.host, request.port))
    try:
        transport = settings.new_transport(initiator=True, args=request.args)
    except ValueError as exc:
        raise HopFailed("args", "bad %s arguments for %s: %s" % (settings.transport, shown, exc),
                        negotiation.reply(socks.GENERAL_FAILURE))
    try:
        server = open_connection((request.host, request.port), deadline, settings.proxy,
                                 settings.sources)
    except OSError as exc:
        raise HopFailed("connect", "cannot reach the %s server %s%s: %s"
                        % (settings.transport, shown, " via the proxy" if settings.proxy else "",
                           why(exc)), negotiation.reply(socks_code(exc)))
    tunnel.owns(server)           # closed with the connection, however and wherever it ends
    try:
        to_application = transport_handshake(server, transport, deadline, tunnel.key_work)
    except (OSError, PeerClosed, transport.ProtocolError) as exc:
        code = socks.TTL_EXPIRED if isinstance(exc, socket.timeout) else socks.GENERAL_FAILURE
        raise HopFailed("handshake", "%s handshake with the server %s failed: %s"
                        % (transport.name, shown, handshake_failure(transport, exc)),
                        negotiation.reply(code))
    send_all(conn, negotiation.reply(socks.SUCCEEDED), deadline)
    log.debug("conn %d: %s tunnel to %s open", tunnel.number, transport.name, shown)
    relay(conn, server, transport, tunnel, to_upstream=to_application,
          to_downstream=request.trailing)


HINTS = {("obfs3", True): " (is it an obfs3 server?)",
         ("obfs4", True): " (is it an obfs4 server? the right cert?)",
         ("obfs4", False): " (a prober, or a client with a wrong cert)"}


def handshake_failure(transport, exc):
    """What a failed handshake means, in words a user can act on."""
    if isinstance(exc, transport.ProtocolError):
        hint = HINTS.get((transport.name, transport.initiator), "")
        return "%s%s" % (exc, hint)
    if isinstance(exc, PeerClosed):
        return "the server closed the connection (is it speaking %s?)" % transport.name
    return why(exc)


def handle_fixed_client(conn, settings, tunnel):
    """No SOCKS: every connection goes to the one server in --dest."""
    deadline = Deadline(settings.handshake_timeout)
    transport = settings.new_transport(initiator=True)
    try:
        server = open_connection(settings.dest, deadline, settings.proxy, settings.sources)
    except OSError as exc:
        raise HopFailed("connect", "cannot reach the %s server --dest %s: %s"
                        % (settings.transport, settings.show(settings.dest), why(exc)))
    tunnel.owns(server)
    try:
        to_application = transport_handshake(server, transport, deadline, tunnel.key_work)
    except (OSError, PeerClosed, transport.ProtocolError) as exc:
        raise HopFailed("handshake", "%s handshake with the server failed: %s"
                        % (transport.name, handshake_failure(transport, exc)))
    relay(conn, server, transport, tunnel, to_upstream=to_application)


def handle_server(conn, settings, tunnel):
    """Transport handshake with the client -> connect to --dest -> relay.

    We reach the destination only after the handshake succeeded, so probes
    and garbage never touch Tor's ORPort. A transport with ``failure_linger``
    (obfs4) keeps a failed connection open, reading and discarding, until
    that many seconds after accept: a prober learns nothing from the timing.
    """
    deadline = Deadline(settings.handshake_timeout)
    transport = settings.new_transport(initiator=False)
    try:
        to_destination = transport_handshake(conn, transport, deadline, tunnel.key_work)
    except (socket.timeout, transport.ProtocolError) as exc:
        linger = getattr(transport, "failure_linger", None)
        if linger is not None:
            drain_until(conn, tunnel.accepted_at + linger)
        if isinstance(exc, socket.timeout):
            raise HopFailed("client-handshake", "handshake timed out after %.0f s (%s)"
                            % (settings.handshake_timeout, transport.name))
        raise HopFailed("client-handshake", "not %s: %s"
                        % (transport.name, handshake_failure(transport, exc)))
    try:
        dest = open_connection(settings.dest, deadline, sources=settings.sources)
    except OSError as exc:
        raise HopFailed("dest", "cannot reach --dest %s: %s"
                        % (format_address(settings.dest), why(exc)))
    tunnel.owns(dest)
    if settings.ext_cookie_file:
        outbound.ext_orport_handshake(dest, settings.ext_cookie_file, tunnel.peer,
                                      transport.name, deadline)
    relay(upstream=dest, downstream=conn, transport=transport, tunnel=tunnel,
          to_upstream=to_destination)


# --- The relay -----------------------------------------------------------------

_Selector = getattr(selectors, "PollSelector", selectors.DefaultSelector)
BURST = 8            # chunks one direction moves in a row before the other gets a turn
IDLE_CHECK = 1.0     # seconds between looks for a reset on a socket watched for nothing
SPARE_BUFFERS = 16   # chunk buffers a Proxy keeps for reuse (4 MiB), shared by its tunnels


class BufferPool:
    """Chunk buffers lent to relays and given back when a chunk is written, so
    an idle tunnel holds none. list.pop() and list.append() are atomic: no lock."""

    def __init__(self, spare=SPARE_BUFFERS):
        self._spare, self._buffers = spare, []

    def lend(self):
        try:
            return self._buffers.pop()
        except IndexError:
            return bytearray(CHUNK)

    def give_back(self, buffer):
        if len(self._buffers) < self._spare:
            self._buffers.append(buffer)


_NOTHING = memoryview(b"")
# SO_LINGER on, 0 seconds: close() then sends RST instead of FIN.
_ABORT_ON_CLOSE = struct.pack("HH" if sys.platform == "win32" else "ii", 1, 0)


def sender(transport):
    """The up direction's transform: plaintext chunk -> what to write.
    Returns the same chunk (encrypted where it lies), new bytes, or a list of
    (bytes, delay) pieces for a paced transport."""
    if getattr(transport, "paced", False):
        return lambda chunk: transport.send_paced(bytes(chunk))
    in_place = getattr(transport, "send_in_place", None)
    if in_place is None:
        return lambda chunk: transport.send(bytes(chunk))
    return lambda chunk: chunk if in_place(chunk) else transport.send(bytes(chunk))


def receiver(transport):
    """The down direction's transform: wire chunk -> plaintext to write."""
    in_place = getattr(transport, "receive_in_place", None)
    if in_place is None:
        return lambda chunk: transport.receive(bytes(chunk))
    return lambda chunk: chunk if in_place(chunk) else transport.receive(bytes(chunk))


class _Direction:
    """One direction of a tunnel: read ``src``, transform, write ``dst``.

    Holds at most one chunk's output (``pending``, the unwritten rest of it,
    and for a paced transport ``pieces`` still to come, each released
    ``delay`` seconds after the one before); ``src`` is read only when all of
    it is written, which is the backpressure. An in-place chunk stays in a
    lent buffer that goes back as soon as it is written. After EOF on ``src``
    and once everything drains, EOF travels on as shutdown(SHUT_WR).
    """

    __slots__ = ("src", "dst", "transform", "pending", "buffer", "eof", "done", "count",
                 "pieces", "not_before", "delay", "buffers")

    def __init__(self, src, dst, transform, pending, buffers):
        self.src, self.dst, self.transform, self.buffers = src, dst, transform, buffers
        self.pending, self.pieces = _NOTHING, deque()
        self.buffer = None
        self.eof = self.done = False
        self.not_before = self.delay = 0.0
        self.count = 0  # bytes carried (read from src), for the log
        self._take(pending)

    def _take(self, out, buffer=None):
        """Queue a transform's output; give ``buffer`` back unless ``out`` lives in it."""
        if isinstance(out, list):
            self.pieces.extend(out)
            out = _NOTHING
        elif not isinstance(out, memoryview):
            out = memoryview(out)
        if buffer is not None and out.obj is buffer:
            self.buffer = buffer
        elif buffer is not None:
            self.buffers.give_back(buffer)
        self.pending = out

    def waiting(self):
        """Seconds until the next paced piece may go (0 if none waits)."""
        if self.pending or not self.pieces:
            return 0.0
        return max(0.0, self.not_before - time.monotonic())

    def busy(self):
        return bool(self.pending) or bool(self.pieces)

    def pump(self):
        """Write what is pending, then read, transform and write more chunks
        until ``src`` has nothing, ``dst`` is full, or BURST chunks went."""
        for _ in range(BURST):
            if not self.write() or self.eof:
                return
            buffer = self.buffers.lend()
            try:
                size = self.src.recv_into(buffer)
                out = self.transform(memoryview(buffer)[:size]) if size else None
            except BlockingIOError:
                self.buffers.give_back(buffer)
                return
            except BaseException:   # a reset, or the peer broke the protocol: the buffer goes back too
                self.buffers.give_back(buffer)
                raise
            if not size:
                self.buffers.give_back(buffer)
                self.eof = True
                self.write()
                return
            self.count += size
            self._take(out, buffer)
        self.write()

    def write(self):
        """Write what is pending (and paced pieces whose time has come); then
        give the lent buffer back and, after EOF on ``src``, pass the EOF on.
        True when nothing is left to write."""
        while True:
            while self.pending:
                try:
                    sent = self.dst.send(self.pending)
                except BlockingIOError:
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
        if self.eof and not self.done:
            self.done = True
            try:
                self.dst.shutdown(socket.SHUT_WR)
            except OSError:  # the other end is already gone; the other direction will see it
                pass
        return True


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


def relay(upstream, downstream, transport, tunnel, to_upstream=b"", to_downstream=b""):
    """Pump bytes both ways until both directions have ended.

    ``upstream`` carries cleartext, ``downstream`` the transport's bytes.
    ``to_upstream`` is plaintext that arrived glued to the peer's handshake;
    ``to_downstream`` is application data that came before the tunnel was
    open (pipelined after a SOCKS request), still to be sent through the
    transport.

    Each socket is watched only for what its directions wait for: readable
    while its outgoing direction has room, writable while something is
    pending for it. A socket watched for nothing (its reader is held back
    by a peer that does not read, or it sent EOF) would not show a reset, so
    while there is one, its pending error is checked every IDLE_CHECK
    seconds. Raises OSError when either socket fails, or the transport's
    ProtocolError; the caller closes both sockets.

    In a Proxy (``tunnel.parking`` set) a relay that has waited PARK_AFTER
    seconds for its sockets with no paced piece due parks: this raises
    ``Parked``, its sockets go to the Parking's poller and the thread is free;
    the poller carries the tunnel on from there (``Proxy._resume``), and the
    Proxy closes its sockets when it ends.
    """
    tunnel.relay = Relay(upstream, downstream, transport, tunnel, to_upstream, to_downstream)
    run_relay(tunnel)


class Parked(BaseException):
    """The relay went quiet: ``Proxy._run`` hands the tunnel to the Parking, where
    it waits without a thread. Not an error (hence not an Exception)."""


def run_relay(tunnel):
    """Run ``tunnel.relay`` on this thread until it ends, fails or parks."""
    relay = tunnel.relay
    tunnel.enter_gate()
    parked = False
    try:
        relay.start()
        while not relay.finished:
            relay.handle(_wait(tunnel, relay, relay.watch()))
    except Parked:
        parked = True
        raise
    except OSError:
        relay.abort()
        raise
    finally:
        if not parked:
            relay.close()


class Relay:
    """A tunnel's two directions and what its sockets are watched for: the state
    of ``relay()``, kept in an object so that a parked tunnel can be carried on
    by another thread (see ``Parking``)."""

    def __init__(self, upstream, downstream, transport, tunnel, to_upstream=b"", to_downstream=b""):
        send = sender(transport)
        # up: from upstream (cleartext) to the other obfsproxy, encoded on the way;
        # down: from the other obfsproxy to upstream, decoded on the way.
        if to_downstream:
            to_downstream = (transport.send_paced if getattr(transport, "paced", False)
                             else transport.send)(bytes(to_downstream))
        self.up = _Direction(upstream, downstream, send, to_downstream, tunnel.buffers)
        self.down = _Direction(downstream, upstream, receiver(transport), to_upstream, tunnel.buffers)
        tunnel.relaying = (self.up, self.down)
        self.buffers = tunnel.buffers
        self.upstream, self.downstream = upstream, downstream
        upstream.setblocking(False)
        downstream.setblocking(False)
        self.selector = _Selector()
        self.registered = {upstream: 0, downstream: 0}
        self.unwatched = []
        self.timer = None             # seconds until a paced piece may go, or None

    @property
    def finished(self):
        return self.up.done and self.down.done

    @property
    def moved(self):
        return self.up.count + self.down.count

    def start(self):
        self.up.write()
        self.down.write()

    def watch(self):
        """Register what each socket waits for; the seconds to wait at most (None:
        until something happens)."""
        up, down, registered = self.up, self.down, self.registered
        wanted = {self.upstream: 0, self.downstream: 0}
        timeout = None
        for direction in (up, down):
            if direction.pending:
                wanted[direction.dst] |= selectors.EVENT_WRITE
            elif direction.pieces:  # a paced piece waits for its time
                wait = direction.waiting()
                timeout = wait if timeout is None else min(timeout, wait)
            elif not direction.eof:
                wanted[direction.src] |= selectors.EVENT_READ
        self.timer = timeout
        for sock, events in wanted.items():
            if events != registered[sock]:
                if not registered[sock]:
                    self.selector.register(sock, events)
                elif not events:
                    self.selector.unregister(sock)
                else:
                    self.selector.modify(sock, events)
                registered[sock] = events
        self.unwatched = [sock for sock, events in registered.items() if not events]
        if self.unwatched:
            timeout = IDLE_CHECK if timeout is None else min(timeout, IDLE_CHECK)
        return timeout

    def parked_interest(self):
        """{socket: epoll mask} for the Parking: what the relay waits for, and 0 (only
        errors and hang-ups, which epoll always reports) for a socket watched for
        nothing, so that its reset still shows; not for a socket shut both ways (it
        would report a hang-up for ever, and has nothing left to lose)."""
        shut = {self.upstream: self.up.eof and self.down.done,
                self.downstream: self.down.eof and self.up.done}
        return {sock: _EPOLL_EVENTS.get(events, 0) for sock, events in self.registered.items()
                if events or not shut[sock]}

    def handle(self, ready):
        """Act on [(socket, events)], or on a wait that timed out ([])."""
        up, down = self.up, self.down
        if not ready:
            for direction in (up, down):   # a paced piece's time may have come
                if direction.pieces and not direction.pending:
                    direction.pump()
            if self.unwatched and not any(d.pieces for d in (up, down)):
                for sock in self.unwatched:     # IDLE_CHECK passed quietly: look for a reset
                    raise_pending_error(sock)
        for sock, events in ready:
            for direction in (up, down):
                if (sock is direction.dst and events & selectors.EVENT_WRITE) or \
                        (sock is direction.src and events & selectors.EVENT_READ):
                    direction.pump()

    def abort(self):
        # A failed tunnel ends abortively on both hops (RST, not FIN), so that
        # each peer sees a failure rather than a clean end of the stream.
        abort(self.upstream, self.downstream)

    def close(self):
        """Give back what the relay holds (not the sockets: their owner closes them)."""
        self.selector.close()
        for direction in (self.up, self.down):
            if direction.buffer is not None:
                direction.pending = _NOTHING
                self.buffers.give_back(direction.buffer)
                direction.buffer = None


def _wait(tunnel, relay, timeout):
    """Wait for the relay's sockets: [(socket, events)], empty after ``timeout``;
    never with the gate held. A relay with nothing to do but wait for its
    sockets, quiet for PARK_AFTER seconds, parks instead (raises Parked)."""
    tunnel.leave_gate()
    try:
        if not any(relay.registered.values()):          # only a paced piece to wait for
            time.sleep(timeout or 0)
            return []
        idle = relay.timer is None and tunnel.parking is not None
        ready = relay.selector.select(PARK_AFTER if idle else timeout)
        if ready or not idle:
            return [(key.fileobj, events) for key, events in ready]
    finally:
        tunnel.enter_gate()
    for sock in relay.unwatched:      # what IDLE_CHECK would have looked at by now
        raise_pending_error(sock)
    raise Parked()    # Proxy._run hands the tunnel to the Parking once this thread lets go


PARK_AFTER = 1.0     # seconds a relay waits in its own poll() before it parks
RUN_ON_THREAD = 64 * 1024   # a parked tunnel that moves this much at once gets a thread again


class Parking:
    """Where quiet tunnels wait, without a thread: one poller thread watches
    (epoll) the sockets of every parked tunnel and carries each on when they
    are ready (``Proxy._resume``): a step of its relay, here, under the gate;
    then park it again, end it, or give it back a thread if data is flowing.

    Why: a tunnel whose thread blocks in its own poll() wakes the moment its
    socket is ready, so thousands of idle tunnels closed at once (a Tor restart)
    made thousands of threads runnable together, and CPython wakes every thread
    waiting for the GIL each switch interval: closing 5,000 took about a minute
    and 100 CPU-s, and SIGTERM's handler could not run for as long. Parked, they
    are one event list worked through by one thread. An idle tunnel also holds
    no thread (nor its stack) any more.

        relay quiet for PARK_AFTER --park()--> epoll  (the thread is free)
        epoll: ready --> step --> idle again: park again
                              --> both directions ended: log, close, done
                              --> moving data (RUN_ON_THREAD): a thread again

    The poller thread starts with the first parked tunnel and ends when none
    has been parked for LINGER seconds. Without epoll (not Linux) nothing parks.
    """

    LINGER = 2.0

    def __init__(self, resume):
        self._resume = resume         # resume(tunnel, [(socket, events)]), on the poller thread
        self._lock = threading.Lock()
        self._epoll = select.epoll()  # made now: parking never needs a descriptor later
        self._parked = {}             # fd -> (tunnel, socket)
        self._running = False

    @classmethod
    def make(cls, resume):
        """A Parking, or None where there is no epoll (or no descriptor for it)."""
        try:
            return cls(resume) if hasattr(select, "epoll") else None
        except OSError:
            return None

    def __len__(self):
        with self._lock:
            return len({tunnel for tunnel, _ in self._parked.values()})

    def park(self, tunnel):
        """Watch the tunnel's sockets for what its relay last registered. False if
        it cannot be parked (no thread for the poller, an epoll limit): then it
        keeps a thread, as without a Parking."""
        with self._lock:
            done = []
            try:
                if not self._running:
                    threading.Thread(target=self._poll, name="parking", daemon=True).start()
                    self._running = True
                for sock, mask in tunnel.relay.parked_interest().items():
                    self._epoll.register(sock.fileno(), mask)
                    self._parked[sock.fileno()] = (tunnel, sock)
                    done.append(sock.fileno())
            except (OSError, RuntimeError):
                for fd in done:
                    self._epoll.unregister(fd)
                    del self._parked[fd]
                return False
        return True

    def _poll(self):
        quiet_since = time.monotonic()
        while True:
            events = self._epoll.poll(1.0)
            ready = {}
            with self._lock:
                for fd, mask in events:
                    entry = self._parked.get(fd)
                    if entry is not None:
                        tunnel, sock = entry
                        ready.setdefault(tunnel, []).append((sock, _selector_events(mask)))
                for tunnel in ready:              # no more events until parked again
                    for sock in (tunnel.relay.upstream, tunnel.relay.downstream):
                        if self._parked.pop(sock.fileno(), None):
                            self._epoll.unregister(sock.fileno())
                if self._parked or ready:
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since > self.LINGER:
                    self._running = False
                    return
            for tunnel, events in ready.items():
                try:
                    self._resume(tunnel, events)
                except Exception:     # a bug: never let it stop the poller of every other tunnel
                    log.error("conn %d: internal error in the parking", tunnel.number, exc_info=True)


def _epoll_events():
    if not hasattr(select, "epoll"):
        return {}
    read, write = select.EPOLLIN, select.EPOLLOUT
    return {selectors.EVENT_READ: read, selectors.EVENT_WRITE: write,
            selectors.EVENT_READ | selectors.EVENT_WRITE: read | write}


_EPOLL_EVENTS = _epoll_events()


def _selector_events(mask):
    """epoll's bits as the selectors module reports them: errors and hang-ups wake
    both readers and writers."""
    events = 0
    if mask & ~select.EPOLLIN:
        events |= selectors.EVENT_WRITE
    if mask & ~select.EPOLLOUT:
        events |= selectors.EVENT_READ
    return events


def abort(*socks_):
    """Make close() send RST instead of FIN on each socket."""
    for sock in socks_:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT_ON_CLOSE)
        except OSError:
            pass


# --- Listeners and connection threads --------------------------------------------

class Tunnel:
    """One accepted connection: what its handler, its relay and the log need.

    ``gate`` is the Proxy's relay gate (a lock, or None): a relay holds it
    whenever it is not waiting for its sockets, and keeps it from its last
    wake-up until everything is closed (``Proxy._end``); the Parking's poller
    holds it for the steps it runs. Handshakes, the accept loop and signal
    handlers never take it. Why: tunnels that wake together (thousands closed
    at once) would otherwise hand the GIL to each other at each of their dozen
    system calls; behind the gate they wait on a plain lock, without the GIL,
    and go one after another. The GIL lets one thread run Python at a time
    anyway. ``owned`` are the other sockets closed with this connection
    (the handlers' connection to the server or --dest)."""

    def __init__(self, number, peer, key_work, buffers, gate=None, parking=None):
        self.number = number
        self.peer = peer
        self.accepted_at = time.monotonic()
        self.key_work = key_work      # the Proxy's KeyWork
        self.buffers = buffers        # the Proxy's BufferPool
        self.relaying = None          # (up, down) directions once the relay runs
        self.relay = None             # the Relay, once it runs
        self.gate = gate
        self.parking = parking        # the Proxy's Parking, for a relay gone quiet
        self.owned = []
        self.job = None               # (handler, conn, settings), for a parked tunnel's end
        self._in_gate = False

    def owns(self, sock):
        self.owned.append(sock)

    def enter_gate(self):
        if self.gate is not None and not self._in_gate:
            self.gate.acquire()
            self._in_gate = True

    def leave_gate(self):
        if self._in_gate:
            self._in_gate = False
            self.gate.release()


class Proxy:
    """Listeners, the accept loop, and one thread per connection.

    Methods for the caller: ``listen(address, handler, settings)`` binds and
    returns the bound (host, port); ``serve()`` accepts until ``stop()``;
    ``stop(graceful)`` is safe from any thread or a signal handler. ``tick``,
    if given, is called about once a second from ``serve()``.

    Each connection is served start to finish by one thread. Thread reuse,
    and its invariant: a thread whose connection ended waits up to
    SPARE_SECONDS for the next one, and at most SPARE_THREADS threads wait;
    ``_waiting`` counts exactly the waiting threads not yet given a job, so
    a job is put on ``_jobs`` only when a thread has been counted out for it
    and no job is ever left in the queue without a thread to take it.
    (Starting a thread costs more CPU than a whole obfs2 handshake: measured
    about 160 us against 50 us for a hand-over to a waiting thread, and new
    connections come in bursts.)
    """

    SPARE_THREADS = 8
    SPARE_SECONDS = 2.0
    COMPLAINT_INTERVAL = 10.0   # seconds between two log lines of one kind
    GRACE_SECONDS = 30.0        # a graceful stop waits at most this long for live tunnels

    def __init__(self, max_connections=2048, tick=None, pool_size=None):
        self.max_connections = max_connections
        self.tick = tick
        self.listeners = []           # (socket, handler, settings)
        self.live = 0
        self.accepted = 0
        self.key_work = KeyWork()
        self.buffers = BufferPool()
        self.gate = threading.Lock()  # the relay gate (see Tunnel)
        self.parking = Parking.make(self._resume)
        self.pools = Pools(self.key_work, pool.configured_size() if pool_size is None else pool_size)
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = None         # None, "graceful" or "now"
        self.ready = threading.Event()
        self._complaints = {}         # kind -> (when last logged, how many not logged since)
        self._jobs = queue.SimpleQueue()  # connections for the waiting threads
        self._waiting = 0             # threads waiting for a job and not yet given one

    def listen(self, address, handler, settings):
        sock = listen(address)
        sock.setblocking(False)
        settings = dataclasses.replace(settings, pools=self.pools)
        initiator = handler is not handle_server
        config = settings.config
        if initiator:
            try:
                config = transports.transport_class(settings.transport).client_config(dict(settings.options))
            except ValueError:    # the defaults need the SOCKS arguments (obfs4's cert)
                config = None
        self.pools.prepare(settings.transport, initiator, config)
        self.listeners.append((sock, handler, settings))
        return sock.getsockname()[:2]

    @property
    def stopping_now(self):
        return self._stopping == "now"

    def stop(self, graceful=False):
        if self._stopping != "now":
            self._stopping = "graceful" if graceful and not self._stopping else "now"
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def serve(self):
        selector = _Selector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        for entry in self.listeners:
            selector.register(entry[0], selectors.EVENT_READ, entry)
        self.ready.set()
        try:
            while self._stopping is None:
                for key, _ in selector.select(timeout=1.0):
                    if key.data is None:
                        self._drain_wakeups()
                    else:
                        self._accept(*key.data)
                if self.tick:
                    self.tick()
        finally:
            for sock, _, _ in self.listeners:
                selector.unregister(sock)
                sock.close()
            self.listeners = []
        # Graceful: no new connections; wait for live tunnels, a second stop()
        # or GRACE_SECONDS, whichever comes first.
        if self._stopping == "graceful" and self.live:
            log.log(NOTICE, "stopped accepting; waiting for %d live connection(s), at most %.0f s "
                    "(interrupt again to stop now)", self.live, self.GRACE_SECONDS)
            end = time.monotonic() + self.GRACE_SECONDS
            while self._stopping == "graceful" and self.live and time.monotonic() < end:
                selector.select(timeout=0.5)
                self._drain_wakeups()
                if self.tick:
                    self.tick()
        selector.close()
        self.pools.close()
        with self._lock:  # let the waiting threads go
            waiting, self._waiting = self._waiting, 0
        for _ in range(waiting):
            self._jobs.put(None)

    def _drain_wakeups(self):
        try:
            while self._wake_r.recv(64):
                pass
        except OSError:
            pass

    def _accept(self, listener, handler, settings):
        try:
            conn, peer = listener.accept()
        except BlockingIOError:   # another wake-up took it, or the client gave up
            return
        except OSError as exc:    # e.g. EMFILE: the process is out of descriptors
            self.complain("accept", "accept failed: %s; slowing down" % why(exc), logging.WARNING,
                          rest=None)
            time.sleep(0.1)
            return
        with self._lock:
            if self.live >= self.max_connections:
                full = True
            else:
                full = False
                self.live += 1
                self.accepted += 1
                number = self.accepted
        if full:
            conn.close()
            self.complain("full", "refusing a connection: %d connections already open "
                          "(--max-connections)" % self.max_connections, logging.WARNING, rest=None)
            return
        self._dispatch((handler, conn, settings,
                        Tunnel(number, peer, self.key_work, self.buffers, self.gate, self.parking)))

    def _dispatch(self, job):
        """Give ``job`` to a waiting thread, or start one for it."""
        with self._lock:
            reuse = self._waiting > 0
            if reuse:
                self._waiting -= 1
        if reuse:
            self._jobs.put(job)
            return
        handler, conn, settings, tunnel = job
        try:
            threading.Thread(target=self._worker, args=(job,), name="conn-%d" % tunnel.number,
                             daemon=True).start()
        except RuntimeError as exc:  # cannot start a new thread
            log.error("conn %d: cannot start a thread (%s); closing it", tunnel.number, exc)
            tunnel.enter_gate()
            self._close(conn, tunnel)

    def complain(self, kind, message, level=NOTICE, rest=logging.INFO):
        """Log ``message`` at ``level`` at most once per COMPLAINT_INTERVAL for
        each kind, and the rest at ``rest`` (None: not at all): a flood of
        failing connections must not become a flood of log lines at the
        default level, while at info every connection still gets its line."""
        now = time.monotonic()
        with self._lock:
            last, quiet = self._complaints.get(kind, (None, 0))
            if last is not None and now - last < self.COMPLAINT_INTERVAL:
                self._complaints[kind] = (last, quiet + 1)
                if rest is None:
                    return
                level = rest
            else:
                self._complaints[kind] = (now, 0)
                if quiet:
                    message += " (and %d more like this in the last %.0f s)" % (quiet, now - last)
        log.log(level, "%s", message)

    def _finished(self):
        with self._lock:
            self.live -= 1
        if self._stopping:
            # Only wake serve() to recount: stop() again would turn a graceful
            # stop into "now" and cut the connections still draining.
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass

    def _worker(self, job):
        """Serve connections one after another until none comes for a while."""
        while job is not None:
            self._run(*job)
            with self._lock:
                if self._stopping or self._waiting >= self.SPARE_THREADS:
                    return
                self._waiting += 1
            try:
                job = self._jobs.get(timeout=self.SPARE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._waiting > 0:  # nobody counted on us: leave
                        self._waiting -= 1
                        return
                job = self._jobs.get()  # a job was handed to us just now: take it

    def _run(self, handler, conn, settings, tunnel):
        """The one place that catches a connection's errors and closes its sockets
        (``_end``), unless its relay parked: then the Parking carries it on."""
        tunnel.job = (handler, conn, settings)
        if tunnel.relay is None:
            log.debug("conn %d (%s): accepted", tunnel.number, settings.show(tunnel.peer))
        try:
            if tunnel.relay is None:
                outbound.tune(conn)
            handler(conn, settings, tunnel)
        except Parked:
            tunnel.leave_gate()
            if tunnel.parking.park(tunnel):   # the Parking's now: this thread lets it go
                return
            tunnel.parking = None             # it cannot park: carry on here, as before
            self._run(_carry_on, conn, settings, tunnel)
            return
        except Exception as exc:
            self._end(tunnel, exc)
        else:
            self._end(tunnel, None)

    def _resume(self, tunnel, ready):
        """A parked tunnel's sockets are ready (on the Parking's thread): one step
        of its relay here, then park it again, end it, or give it a thread if it
        is busy (moving data, or waiting on a timer)."""
        relay, (_, conn, settings) = tunnel.relay, tunnel.job
        tunnel.enter_gate()
        try:
            for sock, _ in ready:
                if not relay.registered[sock]:    # watched for errors only: a reset?
                    raise_pending_error(sock)
            before = relay.moved
            relay.handle(ready)
            if relay.finished:
                relay.close()
                self._end(tunnel, None)
                return
            relay.watch()
            busy = relay.timer is not None or relay.moved - before >= RUN_ON_THREAD
            tunnel.leave_gate()
            if busy or not tunnel.parking.park(tunnel):
                self._dispatch((_carry_on, conn, settings, tunnel))
        except Exception as exc:
            tunnel.enter_gate()
            if isinstance(exc, OSError):
                relay.abort()
            relay.close()
            self._end(tunnel, exc)

    def _end(self, tunnel, exc):
        """Log how the connection ended (``exc``: what ended it, None for a clean end),
        close its sockets, count it out. Called holding the gate if it relayed."""
        handler, conn, settings = tunnel.job
        name = "conn %d (%s)" % (tunnel.number, settings.show(tunnel.peer))
        if exc is None:
            if tunnel.relaying:
                up, down = tunnel.relaying
                log.info("%s: closed after %d bytes up, %d bytes down", name, up.count, down.count)
        elif isinstance(exc, (socks.SocksError, HopFailed)):
            # A failure the user can act on: at the default level, rate-limited.
            kind = "socks" if isinstance(exc, socks.SocksError) else exc.kind
            self.complain(kind, "%s: %s%s" % (name, "SOCKS: " if kind == "socks" else "", exc))
            if exc.reply:
                try:
                    conn.settimeout(1.0)
                    conn.sendall(exc.reply)
                except OSError:
                    pass
            elif isinstance(exc, HopFailed) and exc.kind in ("connect", "handshake", "dest"):
                # No SOCKS reply to carry the failure (a fixed client, or the server
                # whose --dest failed): the peer sees a reset, as for a tunnel that
                # fails later, never a clean end of the stream.
                abort(conn)
        elif isinstance(exc, transports.PROTOCOL_ERRORS):   # in the relay: the peer broke the protocol
            log.info("%s: not %s: %s", name, settings.transport, exc)
            # The application learns of the failure by a reset; a server closes its
            # peer with a plain FIN, as obfs4proxy does (a reset would tell a prober
            # that flips one bit which implementation runs the bridge).
            if handler is not handle_server:
                abort(conn)
        elif isinstance(exc, PeerClosed):
            log.info("%s: %s", name, exc)
        elif isinstance(exc, socket.timeout):
            if tunnel.relaying:  # in the relay: TCP gave up (keepalive, retransmissions)
                log.info("%s: %s", name, exc.strerror or exc)
            else:
                log.info("%s: handshake timed out after %.0f s", name, settings.handshake_timeout)
        elif isinstance(exc, OSError):
            log.info("%s: %s", name, exc.strerror or exc)
        else:  # a bug: keep serving everyone else
            log.error("%s: internal error; connection closed", name,
                      exc_info=(type(exc), exc, exc.__traceback__))
        self._close(conn, tunnel)

    def _close(self, conn, tunnel):
        for sock in tunnel.owned:
            sock.close()
        conn.close()
        self._finished()
        tunnel.leave_gate()


def _carry_on(conn, settings, tunnel):
    """The handler of a tunnel given a thread again by the Parking."""
    run_relay(tunnel)


def listen(address, backlog=512):
    """A listening socket on (host, port); port 0 picks a free one."""
    host, port = address
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        host, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        if sys.platform == "win32":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


# --- Process setup -----------------------------------------------------------------

def setup_logging(path=None, severity="notice"):
    """Log to ``path`` (or stderr) at ``severity`` and above. OSError if the
    file cannot be opened."""
    handler = logging.FileHandler(str(path)) if path else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(SEVERITIES[severity])


def install_signal_handlers(proxy):
    """SIGTERM: stop now. First SIGINT: stop accepting, let tunnels finish
    (up to Proxy.GRACE_SECONDS); a second SIGINT: stop now.

    Stopping now means the process ends with its tunnels open: the garbage
    collector's last pass over every tunnel's objects at interpreter exit is then
    skipped (``gc.freeze``), since the OS frees the memory anyway. With 9,900
    open tunnels that pass alone held the exit for 2-3 s; without it the process
    is gone in under a second."""
    import gc
    import signal

    def exit_soon():
        gc.disable()
        gc.freeze()

    def on_int(signum, frame):
        proxy.stop(graceful=True)
        if proxy.stopping_now:
            exit_soon()

    def on_term(signum, frame):
        proxy.stop(graceful=False)
        exit_soon()

    signal.signal(signal.SIGINT, on_int)
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, on_term)


# While one thread does key work, a relay thread waking up waits for the GIL
# up to the switch interval (5 ms by default) at every step: 1 ms keeps a
# tunnel's round trip at a few milliseconds during a handshake flood
# (measured with obfs2 shared secrets: mean 12 ms at 5 ms, 3 ms at 1 ms).
SWITCH_INTERVAL = 0.001


def prepare_for_serving(max_connections):
    """What every long-running mode does once, before it listens: smaller
    thread stacks, enough file descriptors, a short GIL switch interval."""
    threading.stack_size(THREAD_STACK)
    raise_descriptor_limit(max_connections)
    if sys.getswitchinterval() > SWITCH_INTERVAL:
        sys.setswitchinterval(SWITCH_INTERVAL)


def raise_descriptor_limit(max_connections):
    """Raise the soft RLIMIT_NOFILE as far as --max-connections needs (two
    descriptors a connection): the common default of 1024 would fail
    connections long before the cap. Warn when the hard limit forbids it."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * max_connections + 64
    unlimited = resource.RLIM_INFINITY
    if soft != unlimited and soft < need:
        target = need if hard == unlimited else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != unlimited and soft < need:
        log.warning("only %d file descriptors allowed (ulimit -n); --max-connections=%d "
                    "needs about %d, so connections beyond ~%d will fail",
                    soft, max_connections, need, (soft - 64) // 2)
