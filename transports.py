"""transports.py: the transport contract, written once, and the registry.

A transport is one side of one connection's obfuscation, with no I/O: bytes
in, bytes out. The proxy core (proxy.py) drives every transport the same way
and knows none of them by name; adding a transport is one new module plus one
line in ``TRANSPORTS`` below. The command line, managed mode, the log lines
("not obfs4: bad MAC") and Tor's SMETHOD ARGS all follow from this registry.

The contract (duck-typed; ``Dummy`` below is the smallest example)::

    class SomeTransport:                 # one side of one connection; no I/O
        name = "obfs4"                   # the pt-spec method name; what log lines say
        ProtocolError = ProtocolError    # what receive() raises when the peer is not speaking us
        expensive = True                 # the core serialises start()/receive() while handshaking

        @classmethod
        def client_config(cls, options) -> config
            # options: {str: str}, the command line's defaults merged with the
            # connection's SOCKS arguments (pt-spec 3.5). ValueError: the SOCKS
            # client gets a general-failure reply.
        @classmethod
        def server_config(cls, options, state_dir) -> (config, announce)
            # once per listener: load or create state (obfs4 keys), the replay
            # filter. announce: {str: str} for SMETHOD ARGS (cert=..., iat-mode=...).
            # ValueError: SMETHOD-ERROR, or a one-line command-line error.
        def __init__(self, initiator, config)   # initiator: True for the client side

        def start(self) -> bytes          # what to send before reading anything (may be b"")
        def receive(self, data) -> bytes  # plaintext the peer's bytes carried (b"" while handshaking)
        def data_to_send(self) -> bytes   # what receiving made us owe the peer (usually b"")
        def send(self, plaintext) -> bytes  # the bytes for the wire; may change lengths
        is_open: bool                     # application data may flow now

        # optional, where ciphertext length == plaintext length (dummy, obfs2, obfs3):
        def send_in_place(self, buffer) -> bool     # transform a writable memoryview where it
        def receive_in_place(self, buffer) -> bool  # lies and return True, or return False,
                                                    # touching nothing, when it cannot right now
        # optional, bytes on the transport's own schedule (obfs4 iat-mode 1 and 2):
        paced: bool
        def send_paced(self, plaintext) -> [(bytes, seconds to wait after them), ...]
        # optional, server-side probe resistance (obfs4):
        failure_linger: seconds after accept until which a failed handshake is
                        drained (read and discarded) before a FIN; None = close now

The core's handshake driver is then the same for every transport::

    send_all(sock, transport.start())
    while not transport.is_open:
        plaintext += transport.receive(recv_some(sock))
        send_all(sock, transport.data_to_send())

and the relay calls ``send``/``receive`` (or the in-place versions) on every
chunk. Config objects may be shared by all connections of a listener, from
many threads: whatever is mutable in them carries its own lock.

Also here: ``Recorder``, the wrapper that copies a live transport's wire bytes
(``--record-dir``, and the demo's tap).
"""

import copy
import dataclasses
import itertools
import os
import threading
import time
from pathlib import Path

import obfs2
import obfs3
import obfs4
import obfs4_crypto


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

    def __init__(self, initiator, config=None):
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
    "obfs4": obfs4.Obfs4,
    "obfs3": obfs3.Obfs3,
    "obfs2": obfs2.Obfs2,
    "dummy": Dummy,
}

# Everything a transport's receive() raises when the peer is not speaking it.
PROTOCOL_ERRORS = tuple({transport.ProtocolError for transport in TRANSPORTS.values()})


def transport_class(name):
    """The registered transport called ``name``; ValueError names the choices."""
    try:
        return TRANSPORTS[name]
    except KeyError:
        raise ValueError("unknown transport %r (have: %s)" % (name, ", ".join(TRANSPORTS)))


# --- Handshake material made ahead of time (pool.py) ------------------------------
#
# What each transport can prepare before a connection exists, and how a connection
# takes it. obfs4 and obfs3 start with an ephemeral keypair that depends on nothing
# (their configs' ``keypairs`` supplier); obfs2 starts with a seed and the first
# message encrypted under a key hashed from it, which depends on the role and the
# shared secret. Dummy has nothing to prepare.

def pool_recipe(name, initiator, config):
    """(key, make) for what a side of transport ``name`` makes first, or None.
    ``make()`` returns one single-use item; sides with equal keys may share a pool."""
    if name == "obfs4":
        return "obfs4 keypairs", obfs4_crypto.generate_keypair
    if name == "obfs3":
        return "obfs3 keypairs", obfs3.generate_keypair
    if name == "obfs2" and config is not None and (initiator or not config.shared_secret):
        # Not a shared-secret responder's: it answers only a client that checked out,
        # so a bare connect must not cost it 100,000 SHA-256, not even to refill a pool.
        key = ("obfs2 first messages", initiator, config.shared_secret, config.hash_iterations)
        return key, lambda: prepare_obfs2(initiator, config)
    return None


def pooled_transport(name, initiator, config, take):
    """A new side of transport ``name`` whose first key work is ``take()``'s item."""
    if name == "obfs4":
        config = copy.copy(config)       # a listener's config is shared: do not change it
        config.keypairs = take
        return obfs4.Obfs4(initiator, config)
    if name == "obfs3":
        return obfs3.Obfs3(initiator, dataclasses.replace(config, keypairs=take))
    if name == "obfs2":
        return PreparedObfs2(initiator, config, take())
    raise ValueError("%s has nothing to prepare" % name)


def prepare_obfs2(initiator, config):
    """(SEED, PADLEN, first message) of a fresh obfs2 side: what ``start()`` computes."""
    side = obfs2.Obfs2(initiator, config)
    return side.seed, side.padlen, side.handshake()


class PreparedObfs2(obfs2.Obfs2):
    """An obfs2 side whose first message, SEED | E(own PAD key, MAGIC | PADLEN |
    padding), was made ahead by ``prepare_obfs2`` for the same role and config.
    Everything after it is plain Obfs2 (the data keys need the peer's seed)."""

    def __init__(self, initiator, config, prepared):
        seed, padlen, self._message = prepared
        obfs2.Obfs2.__init__(self, initiator, config, padlen=padlen)
        self.seed = seed

    def handshake(self):
        return self._message


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
        self.paced = getattr(inner, "paced", False)
        self.failure_linger = getattr(inner, "failure_linger", None)
        self._sent, self._received = sent, received

    @property
    def is_open(self):
        return self.inner.is_open

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
