#!/usr/bin/env python3
"""obfsproxy.py: an obfuscating TCP proxy that speaks obfs2.

Usage:
  obfsproxy.py client [options] [--dest=HOST:PORT] [<listen>]
  obfsproxy.py server [options] [--dest=HOST:PORT] <listen>
  obfsproxy.py demo [options]
  obfsproxy.py managed [options]
  obfsproxy.py --managed [options]
  obfsproxy.py unmask [options] <capture>...
  obfsproxy.py detect [options] <capture>...
  obfsproxy.py (-h | --help)
  obfsproxy.py --version

Commands:
  client   Listen for SOCKS4/4a/5 clients (Tor, curl, ssh -o ProxyCommand...) on
           <listen> (default 127.0.0.1:1050). The SOCKS CONNECT target is the obfs2
           server. With --dest, no SOCKS: every connection goes to that server.
  server   Listen for obfs2 clients on <listen>; forward the plain stream to --dest
           (for a bridge: Tor's ORPort).
  demo     Start a server, a client and an echo service on 127.0.0.1, send a
           message through them and show what crossed the wire.
  managed  Run as a Tor pluggable transport: configuration comes from Tor's
           TOR_PT_* environment variables, status goes to stdout.
  unmask   The passive attack, for teaching: read a capture of one obfs2
           connection (a pcap file, or the two files of --record-dir) and print
           the keys and the decrypted stream.
  detect   Say which TCP streams in a capture are obfs2, and what it cost.

Options:
  --dest=HOST:PORT              client: the obfs2 server to forward to (no SOCKS).
                                server: where the plain stream goes.
  --transport=NAME              obfs2, or dummy (no obfuscation) [default: obfs2]
  --shared-secret=SECRET        obfs2 shared secret; both ends must use the same.
                                Visible in `ps`: prefer --shared-secret-file.
  --shared-secret-file=PATH     Read the shared secret from the first line of PATH.
  --ss-hash-iterations=N        Hash rounds per key in shared-secret mode
                                [default: 100000]
  --handshake-timeout=SECONDS   Close a connection whose SOCKS, connect or obfs2
                                handshake takes longer [default: 30]
  --max-connections=N           Refuse connections beyond N at once [default: 2048]
  --proxy=URI                   client: reach the server through an outgoing proxy,
                                socks5://[USER[:PASS]@]HOST:PORT, socks4a://HOST:PORT
                                or http://[USER[:PASS]@]HOST:PORT
  --ext-cookie-file=PATH        server: --dest is Tor's Extended ORPort; authenticate
                                with this cookie file and report each client.
  --record-dir=DIR              Save each connection's raw wire bytes (both
                                directions) in DIR. This stores traffic: for
                                teaching and debugging only.
  --full                        unmask: print the whole decrypted streams, not
                                only their first 512 bytes.
  --output-dir=DIR              unmask: also write the decrypted streams to DIR.
  --log-file=PATH               Write the log to PATH instead of stderr.
  --log-min-severity=LEVEL      error, warning, notice, info or debug
                                [default: notice]
  --no-safe-logging             Show IP addresses in the log (they are scrubbed by
                                default).
  -h --help                     Show this help.
  --version                     Show the version.

Examples:
  python obfsproxy.py demo
  python obfsproxy.py server 0.0.0.0:1051 --dest=127.0.0.1:9001
  python obfsproxy.py client 127.0.0.1:1050
  curl --socks5 127.0.0.1:1050 ...        (curl's target must be the obfs2 server)
  python obfsproxy.py client --dest=198.51.100.7:1051 127.0.0.1:2222

Data path. "Upstream" is the cleartext side, towards the application;
"downstream" is the obfuscated side, towards the other obfsproxy:

  application --SOCKS/plain--> client ===obfs2===> server --plain--> destination
              upstream          downstream   downstream         upstream

Each accepted connection is served start to finish by one thread
(``Proxy._run``; threads are reused for later connections), which runs one
handler (``handle_socks_client``, ``handle_fixed_client``, ``handle_server``):
a blocking handshake under one deadline, then ``relay`` pumps both sockets
until both directions are finished, and the thread closes both sockets.
"""

import errno
import logging
import os
import queue
import re
import selectors
import socket
import struct
import sys
import threading
import time
from pathlib import Path

try:
    from docopt import DocoptExit, docopt

    import obfs2
except ImportError as _missing:
    sys.exit("obfsproxy.py: missing dependency (%s). Install it with "
             "`pip install -r requirements.txt`; offline: on a connected machine run "
             "`pip download -r requirements.txt -d wheels`, copy wheels/ here, then "
             "`pip install --no-index --find-links wheels -r requirements.txt`."
             % _missing)
import socks

__version__ = "0.1.0"

log = logging.getLogger("obfsproxy")
NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")
SEVERITIES = {"error": logging.ERROR, "warning": logging.WARNING, "notice": NOTICE,
              "info": logging.INFO, "debug": logging.DEBUG}

CHUNK = 256 * 1024          # bytes read per recv(); also the most one direction holds
THREAD_STACK = 512 * 1024   # per-connection thread stack (the default is 8 MiB of address space)


# --- Transports -------------------------------------------------------------
#
# The transport contract (see obfs2.Obfs2 for the full text): ``start()``
# returns our handshake bytes, ``receive(bytes)`` returns the plaintext that
# the peer's bytes carried, ``send(bytes)`` returns the bytes for the wire, and
# ``is_open`` says when data may flow. Transports never touch a socket.

class Dummy:
    """The identity transport: no handshake, bytes pass unchanged.

    The teaching baseline, and the control in end-to-end tests: anything that
    works with obfs2 must work with this, and anything that fails with this is
    not obfs2's fault.
    """

    name = "dummy"
    is_open = True

    def __init__(self, initiator, **_settings):
        self.initiator = initiator

    def start(self):
        return b""

    def receive(self, data):
        return data

    def send(self, data):
        return data

    def send_in_place(self, buffer):
        pass

    def receive_in_place(self, buffer):
        pass


TRANSPORTS = {"obfs2": obfs2.Obfs2, "dummy": Dummy}


class Settings:
    """Everything a connection handler needs, from the command line or Tor."""

    def __init__(self, transport="obfs2", shared_secret=None,
                 hash_iterations=obfs2.HASH_ITERATIONS, handshake_timeout=30.0,
                 dest=None, safe_logging=True, proxy=None, ext_cookie_file=None,
                 record_dir=None, sources=None):
        self.transport = transport
        self.shared_secret = shared_secret
        self.hash_iterations = hash_iterations
        self.handshake_timeout = handshake_timeout
        self.dest = dest                  # (host, port) or None
        self.safe_logging = safe_logging
        self.proxy = proxy                # outgoing proxy URI (client), or None
        self.ext_cookie_file = ext_cookie_file  # dest is an Extended ORPort (server)
        self.record_dir = record_dir      # Path to save wire bytes in, or None
        self.sources = sources            # outgoing source address per family, or None

    def new_transport(self, initiator, args=None):
        """A fresh transport for one connection. ``args`` are per-connection
        arguments from SOCKS (pt-spec 3.5); ``shared-secret`` overrides ours."""
        args = args or {}
        unknown = set(args) - {"shared-secret"}
        if unknown:
            raise ValueError("unknown per-connection argument(s): %s" % ", ".join(sorted(unknown)))
        secret = args.get("shared-secret", self.shared_secret)
        if self.transport == "dummy":
            transport = Dummy(initiator)
        else:
            transport = obfs2.Obfs2(initiator, shared_secret=secret,
                                    hash_iterations=self.hash_iterations)
        if self.record_dir is not None:
            import capture
            transport = capture.record_to_dir(transport, self.record_dir)
        return transport

    def show(self, address):
        """An address for the log: scrubbed unless --no-safe-logging."""
        return "[scrubbed]" if self.safe_logging else format_address(address)


# --- Addresses and sockets ----------------------------------------------------

def parse_address(text, allow_port_zero=False):
    """'192.0.2.1:80', '[2001:db8::1]:80' or 'example.org:80' -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError("%r is not HOST:PORT" % text)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("%r: write IPv6 addresses as [ADDRESS]:PORT" % text)
    if not port.isdigit() or not (0 if allow_port_zero else 1) <= int(port) <= 65535:
        raise ValueError("%r: bad port %r" % (text, port))
    return host, int(port)


def format_address(address):
    host, port = address[0], address[1]
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


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


def is_loopback(host):
    try:
        import ipaddress
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Deadline:
    """One deadline shared by every step of a handshake, so that a peer that
    trickles a byte at a time cannot stretch it."""

    def __init__(self, seconds):
        self.end = time.monotonic() + seconds

    def remaining(self):
        left = self.end - time.monotonic()
        if left <= 0:
            raise socket.timeout("handshake deadline passed")
        return left


class PeerClosed(Exception):
    """The peer closed the connection before the handshake was done."""


def recv_some(sock, deadline):
    sock.settimeout(deadline.remaining())
    data = sock.recv(CHUNK)
    if not data:
        raise PeerClosed("peer closed the connection during the handshake")
    return data


def send_all(sock, data, deadline):
    if data:
        sock.settimeout(deadline.remaining())
        sock.sendall(data)


def connect(address, timeout, sources=None):
    """socket.create_connection to (host, port), from the source address that
    ``sources`` ({socket.AF_INET: "192.0.2.7", socket.AF_INET6: ...}, Tor's
    TOR_PT_OUTBOUND_BIND_ADDRESS_V4/_V6) gives for the destination's family.
    Like Tor's OutboundBindAddress, never for a loopback destination.
    Every address the name resolves to is tried within the one ``timeout``
    (the name lookup itself is not bounded by it)."""
    deadline = Deadline(timeout)
    error = OSError("no address to connect to")
    for family, _, _, _, sockaddr in socket.getaddrinfo(address[0], address[1], 0,
                                                        socket.SOCK_STREAM):
        source = None if not sources or is_loopback(sockaddr[0]) else sources.get(family)
        try:
            return socket.create_connection(sockaddr[:2], timeout=deadline.remaining(),
                                            source_address=(source, 0) if source else None)
        except OSError as exc:
            error = exc
    raise error


def open_connection(address, deadline, proxy=None, sources=None):
    """A TCP connection to (host, port) with TCP_NODELAY and keepalive, within
    the deadline; through the outgoing ``proxy`` URI when one is given (never
    around it); from the ``sources`` addresses (see ``connect``)."""
    if proxy is not None:
        import managed
        sock = managed.connect_via_proxy(proxy, address, deadline, sources)
    else:
        sock = connect(address, deadline.remaining(), sources)
    try:
        tune(sock)
    except OSError:   # e.g. reset already: do not leak the descriptor
        sock.close()
        raise
    return sock


# A peer that vanishes (power cut, a NAT dropping its state) sends neither FIN
# nor RST; an idle tunnel to it would hold a thread and two descriptors
# forever. TCP keepalive notices: after KEEPIDLE seconds of silence, KEEPCNT
# unanswered probes KEEPINTVL seconds apart close the socket (about 4 minutes).
KEEPIDLE, KEEPINTVL, KEEPCNT = 120, 30, 4
# macOS calls the idle time TCP_KEEPALIVE (0x10; Python exports it from 3.10).
_KEEPALIVE_OPTIONS = (
    (getattr(socket, "TCP_KEEPIDLE", None)
     or (getattr(socket, "TCP_KEEPALIVE", 0x10) if sys.platform == "darwin" else None), KEEPIDLE),
    (getattr(socket, "TCP_KEEPINTVL", None), KEEPINTVL),
    (getattr(socket, "TCP_KEEPCNT", None), KEEPCNT),
)


def tune(sock):
    """TCP_NODELAY and keepalive on a tunnel socket (the timings where the OS
    lets us set them; its defaults elsewhere)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in _KEEPALIVE_OPTIONS:
        if option is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
            except OSError:
                pass


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


# --- Handshakes ----------------------------------------------------------------

def transport_handshake(sock, transport, deadline):
    """Send our handshake at once, then read until the transport is open.

    Returns the plaintext that arrived glued to the end of the peer's
    handshake. Both sides send first: neither waits for the other.

    In shared-secret mode the transport's calls are slow (``key_work``), and
    a responder answers only once the initiator's handshake has arrived and
    checked out: a bare connect then costs it no key work. The initiator
    never waits for us before sending, so this cannot deadlock.
    """
    costly = derives_secret_keys(transport)
    answer_later = costly and not transport.initiator
    if not answer_later:
        with key_work(costly, deadline):
            ours = transport.start()
        send_all(sock, ours, deadline)
    plaintext = b""
    while not transport.is_open:
        data = recv_some(sock, deadline)
        with key_work(costly, deadline):
            plaintext += transport.receive(data)
    if answer_later:
        with key_work(costly, deadline):
            ours = transport.start()
        send_all(sock, ours, deadline)
    return plaintext


# Shared-secret keys cost 100000 SHA-256 per MAC, four MACs per connection,
# paid before the peer can be checked: anyone who connects can make us do it.
# Each hash holds the GIL, so N connections deriving at once would slow every
# other thread (live tunnels, the accept loop) N-fold. One derivation at a time
# (two threads cannot run Python in parallel anyway) keeps live tunnels
# flowing; the others queue, each within its own handshake deadline. And while
# one derives, a relay thread waking up waits for the GIL up to the switch
# interval (5 ms by default) at every step: 1 ms keeps a tunnel's round trip
# at a few milliseconds (measured: mean 12 ms at 5 ms, 3 ms at 1 ms).
_KEY_WORK = threading.BoundedSemaphore(1)
KEY_WORK_SWITCH_INTERVAL = 0.001


def derives_secret_keys(transport):
    """True when the handshake derives shared-secret keys; looks through
    wrappers that keep the real transport in ``inner`` (--record-dir)."""
    while transport is not None:
        if getattr(transport, "secret_hash", None) is not None:
            return True
        transport = getattr(transport, "inner", None)
    return False


class key_work:
    """``with key_work(costly, deadline):`` holds the key-derivation slot
    when ``costly``; raises socket.timeout if the deadline passes first."""

    def __init__(self, costly, deadline):
        self.costly, self.deadline = costly, deadline

    def __enter__(self):
        if not self.costly:
            return
        if sys.getswitchinterval() > KEY_WORK_SWITCH_INTERVAL:  # once per process
            sys.setswitchinterval(KEY_WORK_SWITCH_INTERVAL)
        if not _KEY_WORK.acquire(timeout=self.deadline.remaining()):
            raise socket.timeout("handshake deadline passed while waiting to derive keys")

    def __exit__(self, *exc):
        if self.costly:
            _KEY_WORK.release()


def handle_socks_client(conn, settings, tunnel):
    """SOCKS request -> connect to the obfs2 server -> obfs2 handshake ->
    only then the SOCKS success reply -> relay."""
    deadline = Deadline(settings.handshake_timeout)
    negotiation = socks.SocksServer()
    while negotiation.request is None:
        send_all(conn, negotiation.receive(recv_some(conn, deadline)), deadline)
    request = negotiation.request
    tunnel.target = (request.host, request.port)
    try:
        transport = settings.new_transport(initiator=True, args=request.args)
    except ValueError as exc:
        raise socks.SocksError(str(exc), negotiation.reply(socks.GENERAL_FAILURE))
    try:
        server = open_connection((request.host, request.port), deadline, settings.proxy,
                                 settings.sources)
    except OSError as exc:
        raise socks.SocksError("cannot reach the server: %s" % exc,
                               negotiation.reply(socks_code(exc)))
    try:
        try:
            to_application = transport_handshake(server, transport, deadline)
        except (OSError, obfs2.ProtocolError, PeerClosed) as exc:
            code = socks.TTL_EXPIRED if isinstance(exc, socket.timeout) else socks.GENERAL_FAILURE
            raise socks.SocksError("%s handshake with the server failed: %s"
                                   % (transport.name, exc), negotiation.reply(code))
        send_all(conn, negotiation.reply(socks.SUCCEEDED), deadline)
        relay(conn, server, transport, tunnel, to_upstream=to_application,
              to_downstream=request.trailing)
    finally:
        server.close()


def handle_fixed_client(conn, settings, tunnel):
    """No SOCKS: every connection goes to the one server in --dest."""
    deadline = Deadline(settings.handshake_timeout)
    transport = settings.new_transport(initiator=True)
    tunnel.target = settings.dest
    server = open_connection(settings.dest, deadline, settings.proxy, settings.sources)
    try:
        to_application = transport_handshake(server, transport, deadline)
        relay(conn, server, transport, tunnel, to_upstream=to_application)
    finally:
        server.close()


def handle_server(conn, settings, tunnel):
    """obfs2 handshake with the client -> connect to --dest -> relay.

    We reach the destination only after the handshake succeeded, so probes
    and garbage never touch Tor's ORPort.
    """
    deadline = Deadline(settings.handshake_timeout)
    transport = settings.new_transport(initiator=False)
    to_destination = transport_handshake(conn, transport, deadline)
    dest = open_connection(settings.dest, deadline, sources=settings.sources)
    try:
        if settings.ext_cookie_file:
            import managed
            managed.ext_orport_handshake(dest, settings.ext_cookie_file, tunnel.peer,
                                         transport.name, deadline)
        relay(upstream=dest, downstream=conn, transport=transport, tunnel=tunnel,
              to_upstream=to_destination)
    finally:
        dest.close()


# --- The relay -----------------------------------------------------------------

_Selector = getattr(selectors, "PollSelector", selectors.DefaultSelector)
BURST = 8            # chunks one direction moves in a row before the other gets a turn
IDLE_CHECK = 1.0     # seconds between looks for a reset on a socket watched for nothing
SPARE_BUFFERS = 16   # chunk buffers kept for reuse (4 MiB), shared by all tunnels
_spare_buffers = []  # list.pop() and list.append() are atomic: no lock needed


def _lend_buffer():
    try:
        return _spare_buffers.pop()
    except IndexError:
        return bytearray(CHUNK)


def _return_buffer(buffer):
    if len(_spare_buffers) < SPARE_BUFFERS:
        _spare_buffers.append(buffer)


_NOTHING = memoryview(b"")
# SO_LINGER on, 0 seconds: close() then sends RST instead of FIN.
_ABORT_ON_CLOSE = struct.pack("HH" if sys.platform == "win32" else "ii", 1, 0)


class _Direction:
    """One direction of a tunnel: read ``src``, transform, write ``dst``.

    Holds at most one chunk (``pending``, the unwritten rest of it); ``src`` is
    read only when it is empty, which is the backpressure. A chunk is read
    into a lent buffer and transformed where it lies; the buffer goes back as
    soon as the chunk is written, so an idle tunnel holds none. After EOF on
    ``src`` and once ``pending`` drains, EOF travels on as shutdown(SHUT_WR).
    """

    __slots__ = ("src", "dst", "transform", "pending", "buffer", "eof", "done", "count")

    def __init__(self, src, dst, transform, pending):
        self.src, self.dst, self.transform = src, dst, transform
        self.pending = memoryview(pending)
        self.buffer = None
        self.eof = self.done = False
        self.count = len(self.pending)  # bytes carried, for the log

    def pump(self):
        """Write what is pending, then read, transform and write more chunks
        until ``src`` has nothing, ``dst`` is full, or BURST chunks went."""
        for _ in range(BURST):
            if not self.write() or self.eof:
                return
            buffer = _lend_buffer()
            try:
                size = self.src.recv_into(buffer)
            except BlockingIOError:
                _return_buffer(buffer)
                return
            if not size:
                _return_buffer(buffer)
                self.eof = True
                self.write()
                return
            chunk = memoryview(buffer)[:size]
            self.transform(chunk)
            self.count += size
            self.pending, self.buffer = chunk, buffer
        self.write()

    def write(self):
        """Write what is pending; then give the lent buffer back and, after
        EOF on ``src``, pass the EOF on. True when nothing is left to write."""
        while self.pending:
            try:
                sent = self.dst.send(self.pending)
            except BlockingIOError:
                return False
            self.pending = self.pending[sent:]
        if self.buffer is not None:
            self.pending = _NOTHING
            _return_buffer(self.buffer)
            self.buffer = None
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
    seconds. Raises OSError when either socket fails; the caller closes both.
    """
    if to_downstream:
        to_downstream = transport.send(to_downstream)
    # up: from upstream (cleartext) to the other obfsproxy, encrypted on the way;
    # down: from the other obfsproxy to upstream, decrypted on the way.
    up = _Direction(upstream, downstream, transport.send_in_place, to_downstream)
    down = _Direction(downstream, upstream, transport.receive_in_place, to_upstream)
    tunnel.directions = (up, down)
    upstream.setblocking(False)
    downstream.setblocking(False)
    selector = _Selector()
    registered = {upstream: 0, downstream: 0}
    try:
        up.write()
        down.write()
        while not (up.done and down.done):
            wanted = {upstream: 0, downstream: 0}
            for direction in (up, down):
                if direction.pending:
                    wanted[direction.dst] |= selectors.EVENT_WRITE
                elif not direction.eof:
                    wanted[direction.src] |= selectors.EVENT_READ
            for sock, events in wanted.items():
                if events != registered[sock]:
                    if not registered[sock]:
                        selector.register(sock, events)
                    elif not events:
                        selector.unregister(sock)
                    else:
                        selector.modify(sock, events)
                    registered[sock] = events
            unwatched = [sock for sock, events in registered.items() if not events]
            ready = selector.select(IDLE_CHECK if unwatched else None)
            if not ready:  # IDLE_CHECK passed quietly: look for a reset
                for sock in unwatched:
                    raise_pending_error(sock)
            for key, events in ready:
                for direction in (up, down):
                    if (key.fileobj is direction.dst and events & selectors.EVENT_WRITE) or \
                            (key.fileobj is direction.src and events & selectors.EVENT_READ):
                        direction.pump()
    except OSError:
        # A failed tunnel ends abortively on both hops (RST, not FIN), so that
        # each peer sees a failure rather than a clean end of the stream.
        for sock in (upstream, downstream):
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT_ON_CLOSE)
            except OSError:
                pass
        raise
    finally:
        selector.close()
        for direction in (up, down):
            if direction.buffer is not None:
                direction.pending = _NOTHING
                _return_buffer(direction.buffer)
                direction.buffer = None


# --- Listeners and connection threads --------------------------------------------

class Tunnel:
    """What the log needs to know about one connection."""

    def __init__(self, number, peer):
        self.number = number
        self.peer = peer
        self.target = None
        self.directions = ()


class Proxy:
    """Listeners, the accept loop, and one thread per connection.

    Methods for the caller: ``listen(address, handler, settings)`` binds and
    returns the bound (host, port); ``serve()`` accepts until ``stop()``;
    ``stop(graceful)`` is safe from any thread or a signal handler.

    Each connection is served start to finish by one thread. A thread whose
    connection ended waits up to SPARE_SECONDS for the next one (at most
    SPARE_THREADS threads wait): starting a thread costs more CPU than a
    whole obfs2 handshake (measured: about 160 us against 50 us for a
    hand-over to a waiting thread), and new connections come in bursts.
    """

    SPARE_THREADS = 8
    SPARE_SECONDS = 2.0

    def __init__(self, max_connections=2048):
        self.max_connections = max_connections
        self.listeners = []           # (socket, handler, settings)
        self.live = 0
        self.accepted = 0
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = None         # None, "graceful" or "now"
        self.ready = threading.Event()
        self.tick = None              # called about once a second from serve()
        self._complaints = {}         # kind -> (when last logged, how many not logged since)
        self._jobs = queue.SimpleQueue()  # connections for the waiting threads
        self._waiting = 0             # threads waiting for a job and not yet given one

    def listen(self, address, handler, settings):
        sock = listen(address)
        sock.setblocking(False)
        self.listeners.append((sock, handler, settings))
        return sock.getsockname()[:2]

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
        # Graceful: no new connections; wait for live tunnels or a second stop().
        if self._stopping == "graceful":
            log.log(NOTICE, "stopped accepting; waiting for %d live connection(s)", self.live)
            while self._stopping == "graceful" and self.live:
                selector.select(timeout=0.5)
                self._drain_wakeups()
                if self.tick:
                    self.tick()
        selector.close()
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
        except OSError as exc:  # e.g. EMFILE: the process is out of descriptors
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._complain("accept", "accept failed: %s; slowing down" % exc)
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
            self._complain("full", "refusing a connection: %d connections already open "
                           "(--max-connections)" % self.max_connections)
            return
        job = (handler, conn, settings, Tunnel(number, peer))
        with self._lock:
            reuse = self._waiting > 0
            if reuse:
                self._waiting -= 1
        if reuse:
            self._jobs.put(job)
            return
        try:
            threading.Thread(target=self._worker, args=(job,), name="conn-%d" % number,
                             daemon=True).start()
        except RuntimeError as exc:  # cannot start a new thread
            log.error("conn %d: cannot start a thread (%s); closing it", number, exc)
            conn.close()
            self._finished()

    COMPLAINT_INTERVAL = 10.0   # seconds between two warnings of one kind

    def _complain(self, kind, message):
        """A warning at most once per COMPLAINT_INTERVAL for each kind: a flood
        of refused connections must not become a flood of log lines."""
        now = time.monotonic()
        last, quiet = self._complaints.get(kind, (None, 0))
        if last is not None and now - last < self.COMPLAINT_INTERVAL:
            self._complaints[kind] = (last, quiet + 1)
            return
        if quiet:
            message += " (%d more like this not logged)" % quiet
        log.warning("%s", message)
        self._complaints[kind] = (now, 0)

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
        """The one place that catches a connection's errors and closes its socket."""
        name = "conn %d (%s)" % (tunnel.number, settings.show(tunnel.peer))
        log.debug("%s: accepted", name)
        try:
            tune(conn)
            handler(conn, settings, tunnel)
        except socks.SocksError as exc:
            log.info("%s: SOCKS: %s", name, exc)
            if exc.reply:
                try:
                    conn.settimeout(1.0)
                    conn.sendall(exc.reply)
                except OSError:
                    pass
        except obfs2.ProtocolError as exc:
            log.info("%s: not obfs2: %s", name, exc)
        except PeerClosed as exc:
            log.info("%s: %s", name, exc)
        except socket.timeout as exc:
            if tunnel.directions:  # in the relay: TCP gave up (keepalive, retransmissions)
                log.info("%s: %s", name, exc.strerror or exc)
            else:
                log.info("%s: handshake timed out after %.0f s", name, settings.handshake_timeout)
        except OSError as exc:
            log.info("%s: %s", name, exc.strerror or exc)
        except Exception:  # a bug: keep serving everyone else
            log.error("%s: internal error; connection closed", name, exc_info=True)
        else:
            up, down = tunnel.directions or (None, None)
            if up is not None:
                log.info("%s: closed after %d bytes up, %d bytes down",
                         name, up.count, down.count)
        finally:
            conn.close()
            self._finished()


# --- Command line -------------------------------------------------------------------

def setup_logging(path=None, severity="notice"):
    handler = logging.FileHandler(str(path)) if path else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(SEVERITIES[severity])


def read_secret_file(path):
    text = Path(path).read_text(encoding="utf-8").splitlines()
    if not text or not text[0]:
        raise ValueError("%s: the first line is empty" % path)
    return text[0]


def settings_from_args(args):
    """Settings from docopt's dictionary; ValueError says what is wrong."""
    transport = args["--transport"]
    if transport not in TRANSPORTS:
        raise ValueError("unknown transport %r (have: %s)" % (transport, ", ".join(TRANSPORTS)))
    secret = args["--shared-secret"]
    if args["--shared-secret-file"]:
        if secret:
            raise ValueError("give --shared-secret or --shared-secret-file, not both")
        secret = read_secret_file(args["--shared-secret-file"])
    try:
        iterations = int(args["--ss-hash-iterations"])
        timeout = float(args["--handshake-timeout"])
        max_connections = int(args["--max-connections"])
    except ValueError as exc:
        raise ValueError("bad number: %s" % exc)
    if iterations < 1 or timeout <= 0 or max_connections < 1:
        raise ValueError("--ss-hash-iterations, --handshake-timeout and "
                         "--max-connections must be positive")
    if args["--log-min-severity"] not in SEVERITIES:
        raise ValueError("--log-min-severity must be one of %s" % ", ".join(SEVERITIES))
    dest = parse_address(args["--dest"]) if args["--dest"] else None
    settings = Settings(transport, secret, iterations, timeout, dest,
                        safe_logging=not args["--no-safe-logging"],
                        proxy=args["--proxy"], ext_cookie_file=args["--ext-cookie-file"],
                        record_dir=Path(args["--record-dir"]) if args["--record-dir"] else None)
    return settings, max_connections


def install_signal_handlers(proxy):
    """SIGTERM: stop now. First SIGINT: stop accepting, let tunnels finish;
    a second SIGINT: stop now."""
    import signal

    def on_int(signum, frame):
        proxy.stop(graceful=True)

    def on_term(signum, frame):
        proxy.stop(graceful=False)

    signal.signal(signal.SIGINT, on_int)
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, on_term)


def prepare_for_serving(settings, max_connections):
    """What every long-running mode does once, before it listens."""
    threading.stack_size(THREAD_STACK)
    raise_descriptor_limit(max_connections)
    if settings.record_dir is not None:  # create it, and warn now rather than at the first connection
        import capture
        capture.prepare_record_dir(settings.record_dir)


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


def run_external(args):
    settings, max_connections = settings_from_args(args)
    if args["server"]:
        if settings.dest is None:
            raise ValueError("server needs --dest=HOST:PORT: where to send the plain stream")
        handler, default_listen = handle_server, None
    elif settings.dest:
        handler, default_listen = handle_fixed_client, None
    else:
        handler, default_listen = handle_socks_client, "127.0.0.1:1050"
    listen_text = args["<listen>"] or default_listen
    if listen_text is None:
        raise ValueError("give the address to listen on, e.g. 127.0.0.1:2222")
    address = parse_address(listen_text, allow_port_zero=True)
    setup_logging(args["--log-file"], args["--log-min-severity"])
    prepare_for_serving(settings, max_connections)
    proxy = Proxy(max_connections)
    try:
        bound = proxy.listen(address, handler, settings)
    except OSError as exc:
        log.error("cannot listen on %s: %s", listen_text, exc.strerror or exc)
        return 1
    role = "server" if args["server"] else "client"
    if handler is handle_socks_client and not is_loopback(bound[0]):
        log.warning("the SOCKS port %s is reachable from other machines: anyone who "
                    "can reach it can use your tunnel. Bind to 127.0.0.1 unless you "
                    "mean it.", format_address(bound))
    log.log(NOTICE, "%s %s listening on %s%s", settings.transport, role,
            format_address(bound),
            " (SOCKS4/4a/5)" if handler is handle_socks_client else
            " -> %s" % format_address(settings.dest))
    install_signal_handlers(proxy)
    proxy.serve()
    log.log(NOTICE, "%s stopped", role)
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = docopt(__doc__, argv=argv, version="obfsproxy.py " + __version__)
    except DocoptExit as exc:
        # docopt's message is a "found unmatched" warning and the whole usage:
        # say what it did not understand, on one line.
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        detail = re.sub(r"^Warning: found unmatched \(duplicate\?\) arguments ", "", detail)
        detail = re.sub(r"(?:Argument|Option)\(None, '([^']*)'[^)]*\)", r"\1", detail)
        if detail.startswith("Usage"):
            detail = ""
        print("obfsproxy.py: bad command line%s. Run `obfsproxy.py --help` for the usage."
              % (" (did not understand: %s)" % detail.strip("[]") if detail else ""),
              file=sys.stderr)
        return 2
    try:
        if args["demo"]:
            import demo
            return demo.main(args)
        if args["managed"] or args["--managed"]:
            import managed
            return managed.main(args)
        if args["unmask"] or args["detect"]:
            import capture
            return capture.main(args)
        return run_external(args)
    except (ValueError, OSError) as exc:
        print("obfsproxy.py: %s" % exc, file=sys.stderr)
        print("Run `obfsproxy.py --help` for the usage.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # Let `import obfsproxy` in our other modules find this running module
    # instead of loading a second copy of it.
    sys.modules.setdefault("obfsproxy", sys.modules[__name__])
    sys.exit(main())
