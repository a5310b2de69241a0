"""proxy.py: what one connection does, for every transport.

"Upstream" is the cleartext side, towards the application; "downstream" is
the obfuscated side, towards the other obfsproxy::

  application --SOCKS/plain--> client ==transport==> server --plain--> destination
              upstream          downstream  downstream         upstream

Follow one byte from the SOCKS port to the destination:

1. ``listener.Listener`` accepts the application's connection and runs this
   listener's handler on a handshake thread.
2. ``handle_socks_client`` reads the SOCKS request (socks.py), makes the
   transport's config from its arguments (``Settings.client_config``,
   transports.py), and ``open_tunnel`` dials where the transport says
   (``routes``: the SOCKS target, or webtunnel's url=), through the outgoing
   proxy if any (outbound.py), and runs ``transport_handshake``; only then
   does it send the SOCKS success reply. It returns a ``relay.Relay``.
3. The listener hands the relay to its pump (relay.py): each chunk read from
   the application goes through ``transport.send`` to the server, each chunk
   from the server through ``transport.receive`` to the application.
4. On the server, ``handle_server`` runs the same handshake on the accepted
   socket, connects to ``--dest`` (Tor's ORPort, or its Extended ORPort after
   ``outbound.ext_orport_handshake``) and returns the same kind of relay.

Every failure the user can act on is a ``HopFailed``: it says which hop failed
and why, carries the SOCKS reply if any, and says whether the application's
connection ends with a reset (a tunnel that failed) or a FIN (a bridge never
tells a prober more than obfs4proxy would). ``listener.Listener._end`` logs it
and closes the sockets.
"""

import errno
import logging
import os
import re
import shlex
import socket
import stat
import sys
import time

import outbound
import pool
import socks
import transports
from cryptoroutes import chooser
from handshake_scheduler import Busy
from outbound import Deadline, format_address, open_connection, send_all
from relay import CHUNK, Relay

log = logging.getLogger("obfsproxy")
NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")
SEVERITIES = {"error": logging.ERROR, "warning": logging.WARNING, "notice": NOTICE,
              "info": logging.INFO, "debug": logging.DEBUG}


# --- How the user started us -------------------------------------------------------

HERE = os.path.dirname(os.path.abspath(__file__))    # the checkout's root, or the .pyz itself


def program_name(argv0=None, executable=None, flags=None, cwd=None):
    """The command that starts this program again, as the user started it, for help,
    hints and printed commands: ``python3 obfsproxy.py``, ``python3 -I -S obfsproxy.pyz``,
    ``./obfsproxy.pyz``, ``python3.6 /opt/obfsproxy.pyz``. A path the user gave stays as
    given (a path in the current folder is shortened to its name); ``./NAME`` started
    without flags is repeated as is, since the file runs by its shebang. Run inside
    another program (the tests, a script importing the demo), the checkout's
    ``python3 obfsproxy.py``. The arguments default to ``sys.argv[0]``,
    ``sys.executable``, ``sys.flags`` and the current folder (tests give their own)."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    executable = sys.executable if executable is None else executable
    flags = sys.flags if flags is None else flags
    started = os.path.abspath(os.path.join(cwd or os.getcwd(), argv0)) if argv0 else ""
    if started not in (HERE, os.path.join(HERE, "obfsproxy.py")):
        return "python3 obfsproxy.py"
    path = argv0
    if os.path.isabs(path) and os.path.dirname(path) == (cwd or os.getcwd()):
        path = os.path.basename(path)
    options = [flag for flag, on in (("-I", flags.isolated), ("-S", flags.no_site)) if on]
    if path.startswith("./") and not options and os.access(started, os.X_OK):
        return path
    interpreter = os.path.basename(executable or "")
    if not re.match(r"python3(\.\d+)?$", interpreter):
        interpreter = "python3"
    return " ".join([interpreter] + options + [shlex.quote(path)])


# --- Settings ----------------------------------------------------------------------

class Settings:
    """A listener's configuration, from the command line or Tor.

    Shared by every connection of a listener, so never changed in place: make a
    changed copy with ``replace``. Configuration only: the listener's running
    parts (key work, pools, pumps) are the Listener's.

    ``transport``         a name in transports.TRANSPORTS
    ``options``           client: defaults for each connection's arguments
    ``config``            server: the transport's config, made once per listener
    ``dest``              (host, port): a fixed client's bridge, or the server's destination
    ``outgoing_proxy``    client: an outgoing proxy URI, or None
    ``ext_cookie_file``   server: ``dest`` is an Extended ORPort
    ``sources``           outgoing source address per family (Tor's bind addresses)
    ``wrappers``          each wraps every new transport (--record-dir, the demo's tap)
    """

    def __init__(self, transport, options=None, config=None, handshake_timeout=30.0, dest=None,
                 safe_logging=True, outgoing_proxy=None, ext_cookie_file=None, sources=None,
                 wrappers=()):
        self.transport = transport
        self.options = {} if options is None else options
        self.config = config
        self.handshake_timeout = handshake_timeout
        self.dest = dest
        self.safe_logging = safe_logging
        self.outgoing_proxy = outgoing_proxy
        self.ext_cookie_file = ext_cookie_file
        self.sources = sources
        self.wrappers = tuple(wrappers)

    def replace(self, **changes):
        """A copy with ``changes`` (keyword arguments of the constructor) applied."""
        return type(self)(**dict(vars(self), **changes))

    @property
    def transport_class(self):
        return transports.transport_class(self.transport)

    def client_config(self, args=None):
        """The transport's client config: the command line's ``options`` with the
        connection's SOCKS arguments (pt-spec 3.5) over them. ValueError if bad."""
        return self.transport_class.client_config(dict(self.options, **(args or {})))

    def new_transport(self, initiator, config, pools=None):
        """A fresh transport for one connection; its first key work ready-made
        when a pool holds material for it (pool.py), wrapped by ``wrappers``."""
        cls = self.transport_class
        prepared = None if pools is None else pools.take(cls, initiator, config)
        transport = cls(initiator, config) if prepared is None else cls(initiator, config, prepared)
        for wrap in self.wrappers:
            transport = wrap(transport)
        return transport

    def loggable(self, address):
        """An address for the log: scrubbed unless --no-safe-logging."""
        return "[scrubbed]" if self.safe_logging else format_address(address)


# --- Errors that end a connection --------------------------------------------------

class PeerClosed(Exception):
    """The peer closed the connection before the handshake was done."""


class HopFailed(Exception):
    """One hop of a tunnel failed; the message says which and why, for the log
    at the default level: "cannot reach --dest 127.0.0.1:1: connection
    refused". ``kind`` groups messages for rate limiting. What happens next:
    ``reply`` (a SOCKS failure reply, or a transport's answer to a bad client)
    is sent, then the connection is closed, with a reset if ``reset`` (the
    application must see that its tunnel failed), else with a FIN."""

    def __init__(self, kind, message, reply=b"", reset=True, code=socks.GENERAL_FAILURE):
        super().__init__(message)
        self.kind, self.reply, self.reset, self.code = kind, reply, reset, code


def why(exc):
    """A short lower-case reason for an OSError or any exception; a first word in
    capitals is an acronym and keeps them ("TLS: ...", not "tLS: ...")."""
    if isinstance(exc, Busy):
        return str(exc)
    if isinstance(exc, socket.timeout):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    if text[1:2].isupper():
        return text
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


def hint(transport, kind):
    """The transport's words for what to check after a failure of ``kind``
    ("connect": the dial itself; "protocol", "timeout" or "closed": the
    handshake), with a leading space, or ""."""
    words = getattr(transport, "failure_hint", lambda kind: "")(kind)
    return " " + words if words else ""


def failure_kind(transport, exc):
    """How a handshake failed: "protocol", "timeout", "closed" (by the peer, or
    reset), "busy" (this process: it waited past the deadline for key work) or
    "other" (another socket error)."""
    if isinstance(exc, Busy):
        return "busy"
    if isinstance(exc, transport.ProtocolError):
        return "protocol"
    if isinstance(exc, (PeerClosed, ConnectionResetError)):
        return "closed"
    return "timeout" if isinstance(exc, socket.timeout) else "other"


# --- The pools of key work ----------------------------------------------------------

class Pools:
    """A listener's pools of handshake material (pool.py), one per kind of item
    that a transport's ``prepare`` names: made when a listener opens, for the
    config it knows then; refilled only after a quiet spell without handshakes
    (``KeyWork.idle``). A connection whose config matches no pool (e.g. a SOCKS
    client sending another obfs2 secret), or that finds its pool empty, does its
    key work itself, inside the key-work slot."""

    def __init__(self, key_work, size=None):
        self.key_work = key_work
        self.size = pool.configured_size() if size is None else size
        self._pools = {}

    def _recipe(self, cls, initiator, config):
        prepare = getattr(cls, "prepare", None)
        return None if prepare is None else prepare(initiator, config)

    def prepare(self, cls, initiator, config):
        """A pool for what this side of ``cls`` prepares; ``config`` is None for a SOCKS
        client whose arguments come with each connection (obfs4's keypairs do not
        depend on them)."""
        recipe = self._recipe(cls, initiator, config)
        if recipe is None or self.size <= 0:
            return
        key, make = recipe
        if key not in self._pools:
            self._pools[key] = pool.Pool(make, self.size, self.key_work.idle, name=cls.name)

    def take(self, cls, initiator, config):
        """One prepared item for this side, or None."""
        recipe = self._recipe(cls, initiator, config) if self._pools else None
        found = self._pools.get(recipe[0]) if recipe else None
        return None if found is None else found.take()

    def close(self):
        for key, each in self._pools.items():
            each.close()
            log.info("pool of %s: %d taken ready, %d connections did their own key work",
                     key[0] if isinstance(key, tuple) else key, each.hits, each.misses)


# --- The handshake driver ----------------------------------------------------------

def recv_some(sock, deadline):
    data = outbound.recv_within(sock, CHUNK, deadline)
    if not data:
        raise PeerClosed("peer closed the connection during the handshake")
    return data


def transport_handshake(sock, transport, deadline, key_work):
    """Send our first bytes, then read until the transport is open, on this
    thread: each wait for ``sock`` goes through the deadline's turn
    (``outbound.wait_until_ready``). Returns the plaintext that arrived glued to
    the end of the peer's handshake (``exchange`` says what is sent when)."""
    steps = exchange(sock, transport, deadline, key_work)
    try:
        while True:
            waited, write, _ = next(steps)
            outbound.wait_until_ready(waited, deadline, write)
    except StopIteration as done:
        return done.value
    finally:
        steps.close()


def exchange(sock, transport, deadline, key_work):
    """The transport handshake as steps: a generator that yields (socket, write?,
    deadline) whenever the non-blocking ``sock`` would block, to be resumed once
    it is ready, and returns the plaintext glued to the end of the peer's
    handshake. What to send and when is the transport's business (``start``,
    then ``data_to_send`` after each ``receive``); this only moves bytes, under
    one deadline. It counts as a handshake under way (``KeyWork.begin``) from
    its first step to its end, so that the pools refill only between
    handshakes."""
    key_work.begin()
    try:
        with key_work.held(transport, deadline):
            ours = transport.start()
        yield from _send_steps(sock, ours, deadline)
        plaintext = []
        while not transport.is_open:
            data = yield from _recv_step(sock, deadline)
            with key_work.held(transport, deadline):
                plaintext.append(transport.receive(data))
                owed = transport.data_to_send()
            yield from _send_steps(sock, owed, deadline)
    finally:
        key_work.end()
    return b"".join(plaintext)


def _recv_step(sock, deadline):
    """Some bytes from ``sock`` (a generator, as ``exchange``); PeerClosed at its end."""
    while True:
        if sock.gettimeout() != 0.0:     # a caller's socket in timeout mode: it blocks
            data = outbound.recv_within(sock, CHUNK, deadline)
            break
        deadline.remaining()
        try:
            data = sock.recv(CHUNK)
            break
        except BlockingIOError:
            yield sock, False, deadline
    if not data:
        raise PeerClosed("peer closed the connection during the handshake")
    return data


def _send_steps(sock, data, deadline):
    """Send all of ``data`` (a generator, as ``exchange``)."""
    if sock.gettimeout() != 0.0:
        send_all(sock, data, deadline)
        return
    view = memoryview(data)
    while view:
        deadline.remaining()
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            yield sock, True, deadline


# --- The handlers: one connection each, as a script ----------------------------------

def handle_socks_client(conn, settings, tunnel):
    """SOCKS request -> the transport's config from its arguments -> dial and
    handshake (``open_tunnel``) -> only then the SOCKS success reply -> a Relay.

    The config is made before we dial, as lyrebird does, so that work such as
    key generation happens before the censor sees a connection."""
    deadline = tunnel.deadline(settings.handshake_timeout)
    negotiation = socks.SocksServer()
    while negotiation.request is None:
        send_all(conn, negotiation.receive(recv_some(conn, deadline)), deadline)
    request = negotiation.request
    target = (request.host, request.port)
    try:
        config = settings.client_config(request.args)
    except ValueError as exc:
        raise HopFailed("args", "bad %s arguments for %s: %s"
                        % (settings.transport, settings.loggable(target), exc),
                        negotiation.reply(socks.GENERAL_FAILURE))
    try:
        server, transport, to_application = open_tunnel(settings, config, target, deadline, tunnel)
    except HopFailed as exc:
        exc.reply = negotiation.reply(exc.code)
        raise
    send_all(conn, negotiation.reply(socks.SUCCEEDED), deadline)
    log.debug("%s: %s tunnel open", tunnel.name, transport.name)
    return new_relay(conn, server, transport, to_upstream=to_application, to_downstream=request.trailing)


def handle_fixed_client(conn, settings, tunnel):
    """No SOCKS: every connection goes to the one bridge of --dest or --bridge. One
    that the application already closed, having sent nothing (a readiness probe, a
    port scan), costs no dial: each was a TLS handshake, an upgrade and a connection
    to Tor's ORPort with webtunnel."""
    if application_gone(conn):
        raise PeerClosed("the application closed the connection before sending anything: "
                         "nothing dialled")
    deadline = tunnel.deadline(settings.handshake_timeout)
    config = settings.client_config()
    server, transport, to_application = open_tunnel(settings, config, settings.dest, deadline, tunnel)
    return new_relay(conn, server, transport, to_upstream=to_application)


def new_relay(upstream, downstream, transport, to_upstream=b"", to_downstream=b""):
    """A Relay for the tunnel, or the connection the transport owns (transports.py:
    ``connection``, meek's request loop), which the pump drives the same way."""
    own = getattr(transport, "connection", None)
    if own is not None:
        return own(upstream, downstream, to_upstream, to_downstream)
    return Relay(upstream, downstream, transport, to_upstream=to_upstream, to_downstream=to_downstream)


def application_gone(conn):
    """True when ``conn`` holds an end of stream or a reset and no byte before it."""
    timeout = conn.gettimeout()
    conn.setblocking(False)
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        conn.settimeout(timeout)


def open_tunnel(settings, config, target, deadline, tunnel):
    """(socket, transport, plaintext glued to the handshake) of a tunnel whose
    handshake succeeded, trying the transport's routes in turn (default: the
    target as given; webtunnel: the host of its url=, once per servername),
    each with a fresh transport and an equal share of the time left; or
    HopFailed for the last route's failure. A route that failed before the next
    is tried is said at NOTICE, once per rate-limit interval (``tunnel.note``):
    it is a failure the user can act on (a servername that no longer verifies,
    or that a censor blocks), even when a later route saves the connection."""
    for note in getattr(config, "notes", ()):
        tunnel.note("%s: %s" % (settings.transport, note))
    cls = settings.transport_class
    routes = cls.routes(config, target) if hasattr(cls, "routes") else [(target, config)]
    for left in range(len(routes), 0, -1):
        address, route_config = routes[-left]
        attempt = deadline if left == 1 else deadline.within(deadline.remaining() / left)
        label = "" if len(routes) == 1 else " (route %d of %d)" % (len(routes) - left + 1, len(routes))
        try:
            return _dial(settings, route_config, address, attempt, tunnel, label)
        except HopFailed as exc:
            if left == 1:
                raise
            tunnel.note("%s; trying the next route" % exc)
    raise ValueError("%s gave no route to dial" % settings.transport)


def _dial(settings, config, address, deadline, tunnel, label=""):
    """One route: connect, then the transport's handshake. Transports' messages never
    name the address or names they dial (they cannot know --no-safe-logging); the
    address is said here, scrubbed unless asked, with ``label``: which route it was."""
    shown = settings.loggable(address) + label
    via = " via the outgoing proxy" if settings.outgoing_proxy else ""
    transport = settings.new_transport(True, config, tunnel.pools)
    try:
        server = open_connection(address, deadline, settings.outgoing_proxy, settings.sources)
    except OSError as exc:
        raise HopFailed("connect", "cannot reach the %s bridge %s%s: %s%s"
                        % (settings.transport, shown, via, why(exc), hint(transport, "connect")),
                        code=socks_code(exc))
    try:
        server.setblocking(False)     # like every socket of a tunnel (outbound.send_all says why)
        to_application = transport_handshake(server, transport, deadline, tunnel.key_work)
    except BaseException as exc:
        server.close()            # this route failed: its socket goes now, not with the tunnel
        if not isinstance(exc, (OSError, PeerClosed, transport.ProtocolError)):
            raise
        kind = failure_kind(transport, exc)
        reason = "the server closed the connection" if isinstance(exc, PeerClosed) else why(exc)
        failed = "not finished (not the bridge's fault)" if kind == "busy" else "failed"
        raise HopFailed("handshake", "%s handshake with the bridge %s %s: %s%s"
                        % (transport.name, shown, failed, reason, hint(transport, kind)),
                        code=socks.TTL_EXPIRED if kind == "timeout" else socks.GENERAL_FAILURE)
    tunnel.owns(server)           # closed with the connection, however and wherever it ends
    if hasattr(transport, "connection"):
        transport.redial = _redialer(settings, address, tunnel)
    return server, transport, to_application


def _redialer(settings, address, tunnel):
    """For a transport that owns its connection (meek): ``redial(transport)`` dials
    the same route again (outgoing proxy and source address included) and runs the
    fresh ``transport``'s handshake, on the caller's thread, under a new deadline;
    (socket, plaintext glued to the handshake), or the OSError or ProtocolError."""
    def redial(transport):
        deadline = Deadline(settings.handshake_timeout)
        sock = open_connection(address, deadline, settings.outgoing_proxy, settings.sources)
        try:
            sock.setblocking(False)
            plaintext = transport_handshake(sock, transport, deadline, tunnel.key_work)
        except BaseException:
            sock.close()
            raise
        return sock, plaintext
    return redial


def handle_server(conn, settings, tunnel):
    """Transport handshake with the client -> connect to --dest -> a Relay.

    A generator (``exchange``): it yields whenever it waits for its client, and
    the listener resumes it once the client's bytes come, so a silent or slow
    client holds no thread; it returns the Relay.

    We reach the destination only after the handshake succeeded, so for obfs4
    and webtunnel probes and garbage never touch Tor's ORPort. obfs3, and obfs2
    without a shared secret, authenticate nobody: whoever speaks them opens a
    connection to --dest, and for obfs3 any 192 bytes do (obfs4proxy's obfs3 too).
    A failed handshake gets the transport's answer if it has one (webtunnel: a
    web server's 404 page), or silence; a transport with ``failure_linger``
    (obfs4) keeps it open, reading and discarding, until that many seconds
    after accept (the listener drains it in its poller: ``ClientFailed``); then
    a FIN, as obfs4proxy closes: a prober learns nothing from the timing or the
    close.
    """
    transport = settings.new_transport(False, settings.config, tunnel.pools)
    limit = getattr(transport, "handshake_timeout", None) or settings.handshake_timeout
    deadline = tunnel.deadline(limit)
    try:
        to_destination = yield from exchange(conn, transport, deadline, tunnel.key_work)
    except (socket.timeout, PeerClosed, transport.ProtocolError) as exc:
        kind = failure_kind(transport, exc)
        reply = getattr(exc, "reply", b"")
        if reply:
            _send_what_goes(conn, reply)
        if kind == "closed":
            raise       # the client gave up: not for the default level (a port scan does it)
        raise client_failed(transport, kind, exc, limit, tunnel.accepted_at)
    serve = getattr(transport, "serve", None)
    if serve is not None:     # it owns its connections (meek: sessions dial --dest themselves)
        return serve(conn, settings, tunnel, to_destination)
    peer = getattr(transport, "peer_address", None)
    if peer:
        tunnel.peer = peer    # the real client, behind a reverse proxy: for USERADDR and the log
    try:
        dest = open_connection(settings.dest, deadline, sources=settings.sources)
    except OSError as exc:
        raise HopFailed("dest", "cannot reach --dest %s: %s" % (format_address(settings.dest), why(exc)))
    tunnel.owns(dest)
    dest.setblocking(False)
    if settings.ext_cookie_file:
        try:
            outbound.ext_orport_handshake(dest, settings.ext_cookie_file, tunnel.peer,
                                          transport.name, deadline)
        except OSError as exc:
            reason = str(exc) if isinstance(exc, outbound.ExtORPortError) else why(exc)
            raise HopFailed("dest", "%s (the Extended ORPort %s: is the cookie file Tor's current "
                            "one, and does Tor take this transport?)"
                            % (reason, format_address(settings.dest)))
    return Relay(dest, conn, transport, to_upstream=to_destination)


def _send_what_goes(sock, data):
    """Send what the socket takes now of ``data`` (a short answer to a failed
    client, which fits in any socket buffer); never wait."""
    view = memoryview(data)
    try:
        while view:
            view = view[sock.send(view):]
    except OSError:
        pass


class ClientFailed(HopFailed):
    """A bridge's client failed its handshake. Its line says how long the
    connection stayed open, so it is said at the close: ``linger_until`` (a
    monotonic time, or None) is how long the connection is first drained
    (read and discarded, as obfs4proxy does, so that a prober learns nothing
    from the timing), then it ends with a FIN."""

    def __init__(self, text, accepted_at, linger_until=None):
        super().__init__("client-handshake", text, reset=False)
        self.accepted_at, self.linger_until = accepted_at, linger_until

    def __str__(self):
        return "%s; closed after %.0f s" % (self.args[0], time.monotonic() - self.accepted_at)


def client_failed(transport, kind, exc, limit, accepted_at):
    """The ClientFailed for a bridge's handshake that failed by ``kind``
    (``failure_kind``) with ``exc``, under a deadline of ``limit`` seconds."""
    if kind == "timeout":
        text = "handshake timed out: no %s handshake within %.0f s" % (transport.name, limit)
    elif kind == "busy":
        text = "%s handshake not finished: %s" % (transport.name, exc)
    else:
        text = "not %s: %s" % (transport.name, exc)
    linger = getattr(transport, "failure_linger", None)
    return ClientFailed(text + hint(transport, kind), accepted_at,
                        None if linger is None else accepted_at + linger)


class FirstWait:
    """How long a new connection may wait for its client's first bytes without a
    thread (``seconds``), and how it ends if none come (``silence(tunnel)``: the
    exception its end is logged with)."""

    def __init__(self, seconds, silence):
        self.seconds, self.silence = seconds, silence


def first_wait(handler, settings):
    """None when a new connection of this handler may need action from our side
    before its client sends anything; else a FirstWait: how long it may wait for
    the client's first bytes (the listener then watches it without a thread),
    and how it ends if they never come.

    A SOCKS client always waits for the application's request. A server waits
    when its transport has nothing to send first and is not open yet (obfs4,
    webtunnel, obfs2 with a shared secret), found by asking a fresh transport,
    once per listening socket; obfs3 and plain obfs2 send first, and dummy is
    open at once (its --dest may be the one to speak first)."""
    if handler is handle_socks_client:
        return FirstWait(settings.handshake_timeout,
                         lambda tunnel: socket.timeout("no SOCKS request within %.0f s"
                                                       % settings.handshake_timeout))
    if handler is not handle_server:
        return None
    probe = settings.transport_class(False, settings.config)
    if probe.start() or probe.is_open:
        return None
    limit = getattr(probe, "handshake_timeout", None) or settings.handshake_timeout
    return FirstWait(limit, lambda tunnel: client_failed(probe, "timeout", None, limit, tunnel.accepted_at))


# Each handler's side of the protocol, fixed for every tunnel it serves.
handle_socks_client.initiator = True
handle_fixed_client.initiator = True
handle_server.initiator = False


# --- Logging ----------------------------------------------------------------------------

def setup_logging(path=None, severity="notice"):
    """Log to ``path`` (or stderr) at ``severity`` and above. A log file is
    created owner-only (it may name clients when --no-safe-logging is given).
    OSError if the file cannot be opened."""
    if path:
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_BINARY", 0),
                     0o600)
        try:
            if hasattr(os, "fchmod") and stat.S_ISREG(os.fstat(fd).st_mode):
                os.fchmod(fd, 0o600)    # an older log file may have been left readable by all
        finally:
            os.close(fd)
        handler = logging.FileHandler(str(path))
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(levelname)s] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(SEVERITIES[severity])


def log_routes(names):
    """Say at startup which crypto route each piece of the transports ``names``
    runs on (a library, or plain Python), and once when a piece runs in plain Python
    although a C route exists: slower, and not constant-time. A WARNING only where
    installing a package would change it; else a NOTICE with the advice that fits
    (cryptoroutes.chooser.plain_python_notice)."""
    routes, slow = transports.crypto_routes(names)
    if routes:
        log.log(NOTICE, "crypto routes: %s", "; ".join("%s: %s" % item for item in routes.items()))
    if slow:
        warn, text = chooser.plain_python_notice(slow)
        log.log(logging.WARNING if warn else NOTICE, "%s", text)
