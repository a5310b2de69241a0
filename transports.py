"""transports.py: the transport contract, written once, and the registry.

A transport is one side of one connection's obfuscation, with no I/O: bytes
in, bytes out. It never touches a socket, a thread, a clock it was not given,
or a logger. The core (proxy.py, listener.py, relay.py) drives every transport
the same way and knows none of them by name; adding a transport is one new
module plus one line in ``TRANSPORTS`` below. The command line (its --help
included), managed mode, the demo, the log lines ("not obfs4: bad MAC") and
Tor's SMETHOD ARGS all follow from this registry.

The contract (duck-typed; ``Dummy`` below is the smallest example)::

    class SomeTransport:                 # one side of one connection; no I/O
        name = "obfs4"                   # the pt-spec method name; what log lines say
        ProtocolError = ProtocolError    # what receive() raises when the peer is not speaking us.
                                         #   Optional members: .reply, bytes to send before closing
                                         #   (webtunnel's 404 page); .data, plaintext decoded before
                                         #   the error, which the relay delivers before it ends
        expensive = True                 # the core serialises start()/receive() while handshaking

        @classmethod
        def client_config(cls, options) -> config
            # options: {str: str}, the command line's defaults merged with the
            # connection's SOCKS arguments (pt-spec 3.5). ValueError, in words naming
            # the argument: the SOCKS client gets a general-failure reply. Unknown
            # arguments are refused, not ignored. At start-up it is also called with
            # the command line's options alone: a fixed client's (--bridge, --dest)
            # ValueError refuses to start; a SOCKS client given no options has nothing
            # to refuse (its arguments come with each connection); a SOCKS client given
            # some is refused too, unless the error names in .missing an argument that
            # each connection may still bring (optional: error.missing = "cert").
        @classmethod
        def server_config(cls, options, state_dir) -> (config, announce)
            # once per listener: load or create state (obfs4 keys), the replay
            # filter. announce: {str: str} for SMETHOD ARGS and the bridge line
            # (cert=..., iat-mode=...). ValueError or OSError: SMETHOD-ERROR, or a
            # one-line command-line error.
        def __init__(self, initiator, config, prepared=None)
            # initiator: True for the client side; prepared: one item of prepare()

        def start(self) -> bytes          # what to send before reading anything (may be b"")
        def receive(self, data) -> bytes  # plaintext the peer's bytes carried (b"" while handshaking)
        def data_to_send(self) -> bytes   # what receiving made us owe the peer: polled after
                                          # every receive, while handshaking and after (TLS
                                          # session tickets and key updates); usually b""
        def send(self, plaintext) -> bytes  # the bytes for the wire; may change lengths
        is_open: bool                     # application data may flow now

    Errors never quote a value that may be secret (a secret option's, a private
    key, a url= path): a ProtocolError's or ValueError's text reaches the log and
    Tor's log. Say which argument and what is wrong with it.

    Optional members, each with the default the core uses without it:

        @classmethod
        def routes(cls, config, requested) -> [((host, port), config), ...]
            # where the client dials, tried in turn with a fresh transport each until
            # a handshake succeeds (default: [(requested, config)], the SOCKS target or
            # --dest; webtunnel: the host of url= or addr=, once per servername).
            # Outgoing proxies (--proxy, TOR_PT_PROXY) still apply to each.
        @classmethod
        def public_address(cls, config, bound) -> (host, port)
            # what SMETHOD and the bridge line announce (default: the listener's
            # address; webtunnel: a synthetic 2001:db8:: address clients never dial)
        @classmethod
        def prepare(cls, initiator, config) -> (key, make) or None
            # handshake material made ahead of time (pool.py; default: none): make()
            # returns one single-use item for __init__'s prepared=; sides whose keys
            # are equal share a pool. config is None for a SOCKS client listener whose
            # command-line options made none (its arguments come with each connection).
        @classmethod
        def crypto_routes(cls) -> ({piece: route}, [pieces in pure Python])
            # what the startup log and the route report say (obfs4: PyNaCl, pycryptodome
            # or pure Python, chosen at import by known answers)
        secret_options = ()               # option names whose values never reach a log
                                          # (scrubbed from every line to Tor but SMETHOD)
        ValueError.missing: str           # client_config's error for an absent argument
                                          # (obfs4's cert=, webtunnel's url=), above
        uses_state_dir = False            # server_config keeps state in state_dir
        config.notes: tuple of str        # said once at NOTICE by the core (what utls= becomes);
                                          # a note with a .level says it at that level instead
                                          # (obfs4's state files open to others: WARNING)
        def failure_hint(self, kind) -> str
            # words that say what to check after a failure; kind is "connect" (the dial),
            # "protocol", "timeout" or "closed" (the handshake); default: none. Like the
            # ProtocolError's text, never the address or names dialled: the core says those,
            # scrubbed unless --no-safe-logging
        handshake_timeout: seconds or None  # this side's own handshake deadline (obfs4's
                                          # server: 30 s, as obfs4proxy); None: --handshake-timeout
        failure_linger: seconds or None   # server-side probe resistance: drain a failed
                                          # handshake until this long after accept, then FIN
        peer_address: (host, port) or None  # the real client, once the transport knows it
                                          # (webtunnel behind a reverse proxy: X-Forwarded-For)
        def end(self) -> bytes            # what follows the application's last byte, before
                                          # the FIN (TLS close_notify); default b""
        peer_ended: bool                  # the peer ended its direction inside the stream (its
                                          # close_notify): the relay ends it without the FIN
        def receive_eof(self)             # the peer's FIN came: may raise ProtocolError (a TLS
                                          # stream cut without close_notify), so the
                                          # application gets a reset; default: a clean end
        # where ciphertext length == plaintext length (dummy, obfs2, obfs3, plain webtunnel):
        def send_in_place(self, buffer) -> bool     # transform a writable memoryview where it
        def receive_in_place(self, buffer) -> bool  # lies and return True, or return False,
                                                    # touching nothing, when it cannot right now
        # bytes on the transport's own schedule (obfs4 iat-mode 1 and 2; webtunnel's
        # bridge behind a front, for its first 16 KiB: with send_in_place, paced may
        # turn False, and the relay then sends in place):
        paced: bool
        def send_paced(self, plaintext) -> [(bytes, seconds to wait after them), ...]

The core's handshake driver is then the same for every transport
(``proxy.transport_handshake``)::

    send_all(sock, transport.start())
    while not transport.is_open:
        plaintext += transport.receive(recv_some(sock))
        send_all(sock, transport.data_to_send())

and the relay (relay.py) calls ``send``/``receive`` (or the in-place versions)
on every chunk, and ``data_to_send`` after every ``receive``. Config objects may
be shared by all connections of a listener, from many threads: whatever is
mutable in them carries its own lock.

TLS inside a transport stays sans-IO: ``ssl.SSLContext.wrap_bio`` over two
``ssl.MemoryBIO`` gives an ``SSLObject`` that takes the peer's bytes
(``incoming.write``) and hands back ours (``outgoing.read``), the way wsproto
composes h11: ``start()`` returns the ClientHello, ``receive()`` feeds records
in, and ``data_to_send()`` drains what the TLS layer owes (webtunnel.py).
A TLS stack that insists on a socket of its own (curl, for a browser's
ClientHello: browser_tls.py) is given one end of a ``socketpair()``, and the
transport moves the records between the other end and these same calls: the
connection still belongs to the core, the relay still sees bytes, and its
backpressure and fairness rules hold as for every transport. The cost is two
descriptors per tunnel, and a lock around the TLS stack's calls when one of its
objects is shared between tunnels (browser_tls shares one CA store).

A transport that owns its connection
------------------------------------
Some transports are not one stream over one socket: meek sends Tor's bytes as
a series of HTTP requests (one at a time, a poll on a timer when there is
nothing to send, a new keep-alive connection when the front closes one), and
a meek bridge's HTTP connection carries requests of many sessions, each with
its own connection to Tor. Such a transport runs its handshake through the
same driver as every other (TLS, and for meek's client a first request that
must be answered 200), then hands the core, in place of a ``relay.Relay``, a
connection object of its own::

    def connection(self, upstream, downstream, to_upstream, to_downstream) -> conn
        # client: the application's socket and the dialled one (proxy.new_relay)
    def serve(self, conn, settings, tunnel, first) -> conn
        # server: the accepted socket and the bytes read with the handshake; it
        # dials --dest itself, when and as often as it needs (proxy.handle_server)
    redial: callable(fresh transport) -> (socket, plaintext)
        # set by the core on a client: the same route dialled again (outgoing
        # proxy, source address) and the fresh transport's handshake run on it,
        # on the caller's thread (a thread of the transport's: never the pump's)

The pump drives ``conn`` exactly as it drives a Relay, so its rules hold for it:
``start(buffers)``, ``watch()`` -> ({socket: events}, seconds until its timer or
None), ``handle([(socket, events)], share)`` (``[]``: the timer, or a nudge),
``finished``, ``abort()``, ``close()`` (it closes the sockets the core does not
know), ``registered`` (the pump's), ``upstream``/``downstream`` and
``up.count``/``down.count`` (the listener's closing line). The set of sockets
``watch`` returns may change from one step to the next (the pump registers the
new ones and lets go of the missing). Two more things the pump gives it:
``pump`` (set by ``Pump.add`` when the object has the attribute) to add objects
of its own (a meek session, once its thread has dialled Tor), and
``Pump.nudge(obj)``, from any thread, to have another object stepped soon (a
session's bytes for the request waiting on them; a dial done). So a timer is a
``watch`` timeout, not a sleeping thread; an idle object costs its sockets and
a heap entry; a turn stays one read per socket (fairness); and an object reads
a source only while it has room for what it reads (backpressure). Transports
like snowflake (WebRTC) would need the same seam and more (UDP, a broker).

Also here: ``Recorder``, the wrapper that copies a live transport's wire bytes
(``--record-dir``, and the demo's tap).
"""

import itertools
import os
import threading
import time
from pathlib import Path

import meek
import obfs2
import obfs3
import obfs4
import webtunnel


class Dummy:
    """The identity transport: no handshake, bytes pass unchanged.

    The teaching baseline, and the control in end-to-end tests: anything that
    works with obfs2 must work with this, and anything that fails with this is
    not obfs2's fault.
    """

    name = "dummy"
    is_open = True
    expensive = False

    class ProtocolError(Exception):
        """Never raised: every byte string is valid dummy traffic."""

    @classmethod
    def client_config(cls, options):
        return _no_options(cls.name, options)

    @classmethod
    def server_config(cls, options, state_dir=None):
        return _no_options(cls.name, options), {}

    def __init__(self, initiator, config=None, prepared=None):
        self.initiator = initiator

    def start(self):
        return b""

    def receive(self, data):
        return data

    def data_to_send(self):
        return b""

    def send(self, data):
        return data

    def send_in_place(self, buffer):
        return True

    def receive_in_place(self, buffer):
        return True


def _no_options(name, options):
    if options:
        raise ValueError("%s takes no arguments (got %s)" % (name, ", ".join(sorted(options))))
    return None


TRANSPORTS = {
    "meek": meek.Meek,
    "meek_lite": meek.MeekLite,
    "webtunnel": webtunnel.WebTunnel,
    "obfs4": obfs4.Obfs4,
    "obfs3": obfs3.Obfs3,
    "obfs2": obfs2.Obfs2,
    "dummy": Dummy,
}



def check_client_options(cls, options, fixed):
    """Check a client's command-line options at start-up, as the contract's
    client_config says: ValueError to refuse to start.

    ``fixed``: every connection goes to one bridge (--bridge, --dest), so the
    options are all it will ever have: any ValueError refuses. A SOCKS client's
    arguments come with each connection: given no options it has nothing to
    check; given some, a ValueError refuses, unless it names in ``.missing`` an
    argument that a connection may still bring.
    """
    if not fixed and not options:
        return
    try:
        cls.client_config(dict(options))
    except ValueError as exc:
        if fixed or not getattr(exc, "missing", None):
            raise


def transport_class(name):
    """The registered transport called ``name``; ValueError names the choices."""
    try:
        return TRANSPORTS[name]
    except KeyError:
        raise ValueError("unknown transport %r (have: %s)" % (name, ", ".join(TRANSPORTS)))


# --- Recording the wire ----------------------------------------------------------

class Recorder:
    """A transport that copies every wire byte of the one it wraps.

    ``sent(bytes)`` receives what this side puts on the wire (its handshake,
    then ciphertext); ``received(bytes)`` what arrived from the peer, before
    decryption. Otherwise it is the wrapped transport (``inner``).
    """

    def __init__(self, inner, sent, received):
        self.inner, self.name, self.initiator = inner, inner.name, inner.initiator
        self.ProtocolError = inner.ProtocolError
        self.expensive = getattr(inner, "expensive", False)
        self.failure_linger = getattr(inner, "failure_linger", None)
        self.handshake_timeout = getattr(inner, "handshake_timeout", None)
        self._sent, self._received = sent, received

    @property
    def is_open(self):
        return self.inner.is_open

    # A transport that owns its connection (meek) moves its wire bytes through wrap()
    # and unwrap() (and request(), a client's POST): the recorder sees them there, and
    # hands the connection itself to the transport's class, so that the connection
    # calls the recorder.
    _PASSED = ("config", "session_id", "peer_ended", "feed_responses", "state")

    def __getattr__(self, name):
        if name in ("connection", "serve"):
            # the innermost transport's class (recorders may be stacked: --record-dir's
            # under the demo's); AttributeError: it has none
            method = getattr(type(innermost(self.inner)), name)
            return lambda *args: method(self, *args)
        if name in self._PASSED:
            return getattr(self.inner, name)
        raise AttributeError(name)

    def wrap(self, data):
        out = self.inner.wrap(data)
        self._sent(out)
        return out

    def unwrap(self, data):
        self._received(data)
        return self.inner.unwrap(data)

    def request(self, body):
        out = self.inner.request(body)
        self._sent(out)
        return out

    @property
    def paced(self):
        return getattr(self.inner, "paced", False)

    @property
    def peer_address(self):
        return getattr(self.inner, "peer_address", None)

    def failure_hint(self, kind):
        return getattr(self.inner, "failure_hint", lambda kind: "")(kind)

    def end(self):
        data = getattr(self.inner, "end", lambda: b"")()
        self._sent(data)
        return data

    def start(self):
        data = self.inner.start()
        self._sent(data)
        self._received(b"")
        return data

    def receive(self, data):
        self._received(data)
        return self.inner.receive(data)

    def data_to_send(self):
        data = self.inner.data_to_send()
        self._sent(data)
        return data

    def send(self, data):
        out = self.inner.send(data)
        self._sent(out)
        return out

    def send_paced(self, data):
        pieces = self.inner.send_paced(data)
        for piece, _ in pieces:
            self._sent(piece)
        return pieces

    def receive_in_place(self, buffer):
        fast = getattr(self.inner, "receive_in_place", None)
        copy = bytes(buffer)
        if fast is None or not fast(buffer):
            return False
        self._received(copy)
        return True

    def send_in_place(self, buffer):
        fast = getattr(self.inner, "send_in_place", None)
        if fast is None or not fast(buffer):
            return False
        self._sent(bytes(buffer))
        return True


def innermost(transport):
    """The protocol object under any Recorder."""
    while isinstance(transport, Recorder):
        transport = transport.inner
    return transport


ROLE_SUFFIXES = (".initiator.bin", ".responder.bin")


def _appender(path):
    def append(data):
        if not data:
            return
        # Open per write: nothing to close, nothing lost at a crash. Owner-only:
        # anyone who can read these can decrypt obfs2 (unmask).
        fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND
                     | getattr(os, "O_BINARY", 0), 0o600)
        with os.fdopen(fd, "ab") as f:
            f.write(data)
    return append


class RecordDir:
    """``--record-dir``: each connection's raw wire bytes, saved in ``directory``
    as <prefix>.initiator.bin and <prefix>.responder.bin.

    Created once at startup (the directory is made owner-only then, so that a
    bad path fails before anything listens); ``wrap`` is called per connection
    from many threads.
    """

    def __init__(self, directory):
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)

    def wrap(self, transport):
        with self._lock:
            number = next(self._numbers)
        prefix = "%s-%s-%d-%d" % (time.strftime("%Y%m%d-%H%M%S"),
                                  "client" if transport.initiator else "server", os.getpid(), number)
        ours, theirs = ROLE_SUFFIXES if transport.initiator else ROLE_SUFFIXES[::-1]
        return Recorder(transport, _appender(self.directory / (prefix + ours)),
                        _appender(self.directory / (prefix + theirs)))


def crypto_routes(names=None):
    """({piece: route}, [pieces running in pure Python where a C route exists]) of
    the transports ``names`` (default: all) that report the crypto routes they
    chose at import (the optional ``crypto_routes()`` classmethod)."""
    routes, slow = {}, []
    for cls in (TRANSPORTS[name] for name in (TRANSPORTS if names is None else names)):
        report = getattr(cls, "crypto_routes", None)
        if report is not None:
            chosen, pure = report()
            routes.update(chosen)
            slow.extend(piece for piece in pure if piece not in slow)
    return routes, slow
