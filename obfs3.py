r"""obfs3, the Threebfuscator: a sans-IO implementation of both ends.

What obfs3 does, and what it does not
-------------------------------------
Like obfs2, obfs3 removes *content signatures*: from the first byte on, both
directions look like uniformly random bytes. Unlike obfs2, the keys come from
an anonymous Diffie-Hellman exchange whose public values themselves look like
random bytes (UniformDH), so a **passive** observer who records both directions
cannot derive the keys and read the inner stream. That is all it does:

* No authentication. Anyone who simply runs the protocol gets a working tunnel:
  a man in the middle can read and change everything, and an active prober
  identifies an obfs3 server at once (it answers 192 random-looking bytes with
  its own, and later with a magic only obfs3 computes).
* No integrity: plain AES-CTR, no MAC. Flipped ciphertext bits flip plaintext.
* After the two paddings, packet sizes and timing are unchanged
  (ciphertext length == plaintext length).
* Python's own ``pow()`` is not constant time. ``MODEXP_ROUTE`` says whether
  the exponentiation runs in pycryptodome's C code instead (see ``modexp``).

Confidentiality and integrity must come from the inner protocol (Tor's TLS).

Notation (spec symbol -> code)
------------------------------
=========================  ================================================
p, g                       ``P`` (RFC 3526 group 5, 1536 bits), ``G`` = 2
g^x mod p                  ``modexp(G, x, P)``
x, X (UniformDH)           ``keypair_from_bytes(raw)`` -> (x, public value)
SHARED_SECRET              ``shared_secret(x, peer_public)``, 192 bytes
HMAC-SHA256(k, m)          ``hmac_sha256(k, m)``
INIT_SECRET, RESP_SECRET   ``derive_keys(secret).init_secret`` / ``.resp_secret``
INIT_MAGIC, RESP_MAGIC     ``derive_keys(secret).init_magic`` / ``.resp_magic``
E(K, data)                 AES-128-CTR, ``ctr(m)``: key m[0:16], counter m[16:32]
PADLEN1, PADLEN2           ``Obfs3.padlen1``, ``Obfs3.padlen2`` (0..4097 each)
MAX_PADDING                ``MAX_PADDING`` = 8194 = 2 * 4097
=========================  ================================================

UniformDH (spec 2.2)
--------------------
1. v = 192 CSPRNG bytes read big-endian.
2. coin = v & 1; x = v with bit 0 cleared (even, up to 1536 bits, never reduced).
3. X = g^x mod p.
4. public value = X if coin == 0 else p - X, sent as exactly 192 bytes.

SHARED_SECRET = (peer value)^x mod p, as exactly 192 bytes. Because x is even,
(p - Y)^x == Y^x (mod p): the coin hides which of the two was sent and changes
nothing for the peer. Any 192 bytes are accepted as a peer value (erratum 7).

What each side sends (both roles alike)
---------------------------------------
::

    start(), at once, without waiting for the peer:

    0                  192                      192 + PADLEN1
    +------------------+------------------------+
    |  public value    |  random padding (PAD1) |
    +------------------+------------------------+

    the first send() once the peer's public value arrived (erratum 4):

    0                  PADLEN2        PADLEN2 + 32
    +------------------+--------------+--------------------------
    |  random (PAD2)   |  own MAGIC   |  E(own key, data) ...
    +------------------+--------------+--------------------------
     clear              clear          one CTR stream per direction

    later sends: E(own key, data), continuing the same stream; no framing.

So the receiver sees, after the peer's public value, PAD1 | PAD2 | MAGIC | data:
the magic starts at pos = PADLEN1 + PADLEN2 <= 8194, and finding it is the only
way to know where the padding ends.

Key derivation (spec 2.3); SHARED_SECRET is the HMAC key, all 192 bytes
------------------------------------------------------------------------
==============  ====================================  ========================  =======================
name            = HMAC-SHA256(SHARED_SECRET, label)   initiator uses it to      responder uses it to
==============  ====================================  ========================  =======================
INIT_SECRET     "Initiator obfuscated data"           encrypt (key | counter)   decrypt
RESP_SECRET     "Responder obfuscated data"           decrypt                   encrypt (key | counter)
INIT_MAGIC      "Initiator magic"                     send                      search for
RESP_MAGIC      "Responder magic"                     search for                send
==============  ====================================  ========================  =======================

Initiator = the side that opened the TCP connection (our client); responder =
the side that accepted it (the bridge).

State machines
--------------
::

    receive:  WAIT_KEY --192 bytes: keys, is_open--> SEARCH_MAGIC --magic at pos <= 8194--> OPEN
                                                          |                              (data)
                      magic at pos > 8194, or 8226 bytes  +--> FAILED (ProtocolError: close)
                      after the public value without it

    send:     start(): PUB | PAD1 --peer key--> KEYED --first send()--> PAD2 | MAGIC | E(data)
              (send() before KEYED is a RuntimeError: the I/O layer relays only once is_open,
              so data written before the peer's value arrived waits in its buffer)

``is_open`` turns True in SEARCH_MAGIC, as soon as the keys exist, not when the
peer's magic is seen: obfs4proxy's server sends its magic only with its first
data, and with Tor that comes only after ours. The deadline for the 192 bytes
is the core's --handshake-timeout (30 s by default, as obfs4proxy's;
``handshake_timeout`` is None); there is none after.

Where the spec text and the implementations differ (obfs4proxy 0.0.14 wins)
---------------------------------------------------------------------------
1. PADLEN: "[0, MAX_PADDING/2]" is 0..4097 inclusive in both implementations;
   pyobfsproxy draws it with ``random``, we use ``secrets`` as obfs4proxy.
2. "Randomly send X or p - X": both implementations use bit 0 of the raw
   private value as the coin. So do we (no extra randomness).
3. Encoding lengths are unspecified: everything is exactly 192 bytes,
   zero-padded on the left, the shared secret (the HMAC key) included. A value
   with a leading zero byte happens about once in 256 connections.
4. The magic goes out "when she wants to send data for the first time":
   obfs4proxy does exactly that (ours too: ``data_to_send()`` stays empty);
   pyobfsproxy sends it as soon as the keys exist. Never wait for the peer's
   magic before sending our own.
5. "Scanned more than MAX_PADDING bytes": obfs4proxy accepts a magic starting
   at pos <= 8194 and fails at 8226 bytes buffered without one (pyobfsproxy
   only beyond 8226). We follow obfs4proxy.
6. No timeouts in the text; obfs4proxy gives 30 s for the public values only.
7. Nobody validates the peer's value (0, p - 1, values >= p all pass). We do
   not either, so we refuse nothing the others accept.

Differences from obfs2 (spec 10)
--------------------------------
* Keys: obfs2 sends 16-byte seeds in clear and hashes them (anyone can derive
  the keys); obfs3 runs UniformDH and applies HMAC-SHA256 to the DH secret. No shared secret.
* Header: obfs2 has an encrypted magic 2bf5ca7e and an explicit PADLEN (one
  padding <= 8192); obfs3 has no header at all, two paddings <= 4097 each, and
  the end of the padding is found by searching a 32-byte HMAC magic.
* Padding and magic travel in clear; one keystream per direction covers data only.
* The same AES-128-CTR with a whole 128-bit counter block (``ctr``).
* Both send their first flight at once; obfs3's magic waits for the first data.
* Cost: two 1536-bit modexps per side instead of a few hashes (``expensive``).
"""

import hashlib
import hmac
import os
import secrets
from collections import namedtuple

from cryptoroutes.aes_ctr import AES, aes_ctr_routes
from cryptoroutes.chooser import ModexpInteger as Integer  # libcrypto's, pycryptodome's, or None: pow()

# RFC 3526 group 5, the 1536-bit MODP group; generator 2.
P = int(
    "FFFFFFFFFFFFFFFF" "C90FDAA22168C234" "C4C6628B80DC1CD1" "29024E088A67CC74"
    "020BBEA63B139B22" "514A08798E3404DD" "EF9519B3CD3A431B" "302B0A6DF25F1437"
    "4FE1356D6D51C245" "E485B576625E7EC6" "F44C42E9A637ED6B" "0BFF5CB6F406B7ED"
    "EE386BFB5A899FA5" "AE9F24117C4B1FE6" "49286651ECE45B3D" "C2007CB8A163BF05"
    "98DA48361C55D39A" "69163FA8FD24CF5F" "83655D23DCA3AD96" "1C62F356208552BB"
    "9ED529077096966D" "670C354E4ABC9804" "F1746C08CA237327" "FFFFFFFFFFFFFFFF", 16)
G = 2

PUBLIC_KEY_LENGTH = 192      # public values and the shared secret, big-endian, zero-padded
MAX_PADDING = 8194
MAX_PADLEN = MAX_PADDING // 2          # each of the two paddings: 0..4097 inclusive
KEYLEN = 16                  # AES-128
CTRLEN = 16                  # the whole initial counter block
MAGIC_LENGTH = 32            # a full HMAC-SHA256 output
MAGIC_SEARCH_LIMIT = MAX_PADDING + MAGIC_LENGTH   # 8226 bytes after the public value

INIT_DATA_LABEL = b"Initiator obfuscated data"
RESP_DATA_LABEL = b"Responder obfuscated data"
INIT_MAGIC_LABEL = b"Initiator magic"
RESP_MAGIC_LABEL = b"Responder magic"

# Receiving states (spec 2.6).
WAIT_KEY = "WAIT_KEY"
SEARCH_MAGIC = "SEARCH_MAGIC"
OPEN = "OPEN"
FAILED = "FAILED"


class ProtocolError(Exception):
    """The peer is not speaking obfs3 (its magic is missing or too far out).

    What happens next: the caller closes the connection. Nothing the peer
    sends later can repair it.
    """


# --- Modular exponentiation: pycryptodome's C code if it proves itself ---------

# The UniformDH known answer published, identically, with pyobfsproxy
# (test_obfs3_dh.py) and obfs4proxy (uniformdh_test.go): the responder's raw
# private value y (even, so its public value is g^y), both public values and
# the shared secret.
KAT_Y = int(
    "736562206f72656b74207268756f68676f2020666c6f2c646120646e77206568657254206568207968736c61206c7262"
    "6165206b68746f7267752068676169612e6e482020656e6b776f2073687772652065685479656820766120657274646f"
    "652072616874732766206569646c2c736120646e77206568657254206568207974736c69206c72746165206468746d65"
    "202c6e612064687720796f6e6f20656e63206e61622068656c6f206468546d6561202073685479657420657264610a2e", 16)
KAT_Y_PUBLIC = int(
    "d04e156e554c37ffd7aba749df6623501e4ff4466cb12be055617c1a3687223736d2c3fdce9ee0f9b27774350849112a"
    "a5aeb1f126811c9c2f3a9cb13d2f0c3a7e6fa2d3bf71baf50d839171534f227efbb2ce4227a38c25abdc5ba7fc430111"
    "3a2cb2069c9b305faac4b72bf21fec71578a9c369bcac84e1a7dcf0754e342f5bc8fe4917441b88254435e2abaf297e9"
    "3e1e57968672d45bd7d4c8ba1bc3d314889b5bc3d3e4ea33d4f2dfdd34e5e5a72ff24ee46316d4757dad09366a0b66b3", 16)
KAT_X_PUBLIC = int(
    "76a3d17d5c55b03e865fa3e8267990a724baa24b0bdd0cc4af93be8de30be120d5533c91bf63ef923b02edcb84b74438"
    "3f7de232cca6eb46d07cad83dcaa317fbecbc68ca13e2c4019e6a3653106745004aecc0be1dff0a78733fb0e7d5cb7c4"
    "97cab77b1331bf347e5f3a7847aa0bc0f4bc64146b48407fed7b931d16972d25fb4da5e6dc074ce2a58daa8de7624247"
    "cdf2ebe4e4dfec6d5989aac778c87559d3213d6040d4111ce3a2acae19f9ee1532509e037f69b252fdc30243cbbce9d0", 16)
KAT_SHARED_SECRET = int(
    "78afaf5f457f1fdb832bebc397644a33038be9dba10ca2ce4a076f327f3a0ce3151d477b869ee7ac467755292ad8a77d"
    "b9bd87ffbbc39955bcfb03b1583888c8fd037834ff3f401d463c10f899aa6378445140b7f8386a7d509e7b9db19b677f"
    "062a7a1a4e1509604d7a0839ccd5da6173e10afd9eab6dda74539d60493ca37fa5c98cd9640b409cd8bb3be2bc5136fd"
    "42e764fc3f3c0ddb8db3d87abcf2e6598d2b101bef7a56f50ebc658f9df1287da81359543e77e4a4cfa7598a4152e4c0", 16)


def modexp_python(base, exp, mod):
    """base^exp mod mod with Python's pow(): always right, not constant time, and slow
    (here 7 ms per key generation, 8.5 ms per shared secret)."""
    return pow(base, exp, mod)


def modexp_pycryptodome(base, exp, mod):
    """base^exp mod mod with pycryptodome's Integer: C code, here 1.0 ms per key
    generation or shared secret; its IntegerNat runs in constant time for a
    secret exponent. ``base % mod`` first, so that every library accepts it."""
    return int(Integer(base % mod).inplace_pow(exp, mod))


def choose_modexp(candidate):
    """(function, route name): ``candidate`` if it reproduces the UniformDH
    known answer (key generation g^y and shared secret X^y), else pow()."""
    try:
        ok = (candidate(G, KAT_Y, P) == KAT_Y_PUBLIC
              and candidate(KAT_X_PUBLIC, KAT_Y, P) == KAT_SHARED_SECRET)
    except Exception:       # a broken or missing library: any failure means "do not use it"
        ok = False
    if ok:
        return candidate, getattr(Integer, "ROUTE", "pycryptodome Integer (%s)" % Integer.__name__)
    return modexp_python, "Python pow()"


modexp, MODEXP_ROUTE = choose_modexp(modexp_pycryptodome)


# --- UniformDH and the keys ------------------------------------------------------

def keypair_from_bytes(raw):
    """UniformDH key generation (spec 2.2) from 192 raw CSPRNG bytes.

    Returns (x, public value as 192 bytes)."""
    if len(raw) != PUBLIC_KEY_LENGTH:
        raise ValueError("UniformDH needs %d raw bytes, got %d" % (PUBLIC_KEY_LENGTH, len(raw)))
    v = int.from_bytes(raw, "big")
    coin = v & 1                         # erratum 2: bit 0 is the coin ...
    x = v & ~1                           # ... and is cleared: x is even, not reduced
    X = modexp(G, x, P)                  # X = g^x mod p
    public = X if coin == 0 else P - X  # send X or p - X
    return x, public.to_bytes(PUBLIC_KEY_LENGTH, "big")


def generate_keypair(randbytes=os.urandom):
    """A fresh UniformDH keypair (x, public value) from 192 CSPRNG bytes."""
    return keypair_from_bytes(randbytes(PUBLIC_KEY_LENGTH))


def shared_secret(x, peer_public):
    """SHARED_SECRET = (peer value)^x mod p, as exactly 192 bytes (erratum 3).

    Any 192 bytes are accepted as the peer's value (erratum 7)."""
    if len(peer_public) != PUBLIC_KEY_LENGTH:
        raise ValueError("a UniformDH public value is %d bytes, got %d"
                         % (PUBLIC_KEY_LENGTH, len(peer_public)))
    Y = int.from_bytes(peer_public, "big")
    return modexp(Y, x, P).to_bytes(PUBLIC_KEY_LENGTH, "big")


def hmac_sha256(key, message):
    return hmac.new(key, message, hashlib.sha256).digest()


Keys = namedtuple("Keys", "init_secret resp_secret init_magic resp_magic")


def derive_keys(secret):
    """INIT_SECRET = HMAC-SHA256(SHARED_SECRET, "Initiator obfuscated data")
    RESP_SECRET = HMAC-SHA256(SHARED_SECRET, "Responder obfuscated data")
    INIT_MAGIC  = HMAC-SHA256(SHARED_SECRET, "Initiator magic")
    RESP_MAGIC  = HMAC-SHA256(SHARED_SECRET, "Responder magic")
    """
    return Keys(hmac_sha256(secret, INIT_DATA_LABEL), hmac_sha256(secret, RESP_DATA_LABEL),
                hmac_sha256(secret, INIT_MAGIC_LABEL), hmac_sha256(secret, RESP_MAGIC_LABEL))


def ctr(m):
    """E(K, .) as a keystream object: AES-128-CTR with key m[0:16] (*_KEY) and
    the whole 128-bit counter block m[16:32] (*_CTR), incremented big-endian and
    wrapping from ff..ff to 00..00."""
    return AES.new(m[:KEYLEN], AES.MODE_CTR, nonce=b"", initial_value=m[KEYLEN:KEYLEN + CTRLEN])


# --- One side of one connection -------------------------------------------------

def random_padlen():
    """PADLEN: uniform in 0..4097 inclusive, from a CSPRNG (erratum 1)."""
    return secrets.randbelow(MAX_PADLEN + 1)


class Obfs3Config:
    """What every connection of one listener (or one client) shares. Never changed
    in place, so many threads may use one. The defaults are the real ones; tests and the
    core inject their own:

    ``randbytes(n)``  padding bytes, and the raw UniformDH bytes when
                      ``keypairs`` is None (default ``os.urandom``)
    ``padlen()``      one padding length, 0..4097; called twice per connection
    ``keypairs()``    -> (x, 192-byte public value), for tests; None:
                      ``generate_keypair(randbytes)`` in ``start()``. A
                      connection's ``prepared`` keypair (pool.py) comes first.

    and ``notes``, lines the core says once at NOTICE (none for obfs3). Make a
    changed copy with ``replace``.
    """

    def __init__(self, randbytes=os.urandom, padlen=random_padlen, keypairs=None, notes=()):
        self.randbytes, self.padlen, self.keypairs, self.notes = randbytes, padlen, keypairs, notes

    def replace(self, **changes):
        """A copy with ``changes`` (keyword arguments of the constructor) applied."""
        return type(self)(**dict(vars(self), **changes))


def _no_arguments(options):
    if options:
        raise ValueError("obfs3 takes no arguments (got %s)" % ", ".join(sorted(options)))
    return Obfs3Config()


class Obfs3:
    """One side of one obfs3 connection, with no I/O (the transport contract).

    Methods for the caller:

    ``start() -> bytes``
        PUB | PAD1. Send it at once; do not wait for the peer. Generates our
        keypair (one modexp), hence ``expensive``, unless one was ``prepared``.
    ``receive(data) -> bytes``
        Feed the peer's bytes in any split, after ``start()``. Returns the plaintext:
        empty until the peer's magic has been found; bytes glued behind the
        magic come out of the same call. Raises ``ProtocolError`` when the
        magic is missing or too far out.
    ``data_to_send() -> bytes``
        Always b"": our magic goes out lazily with the first ``send()``.
    ``send(plaintext) -> bytes``
        The first call returns PAD2 | MAGIC | E(data), later ones E(data). Only
        once ``is_open``.
    ``is_open``
        True once the peer's public value has arrived and the keys exist; the
        peer's magic may still be on its way.
    ``send_in_place(buffer)``, ``receive_in_place(buffer) -> bool``
        The data phase's fast path: transform a writable buffer where it lies
        and return True; return False, touching nothing, while our magic has
        not gone out yet (send) or the peer's has not been found (receive).

    ``initiator`` is True for the side that opened the TCP connection;
    ``prepared`` is one keypair from ``prepare()``'s pool (made ahead, used once).
    Key work happens only in ``start()`` (our keypair) and ``receive()`` (the
    shared secret), the calls the core serialises; the constructor draws the two
    padding lengths and nothing else.
    """

    name = "obfs3"
    ProtocolError = ProtocolError
    expensive = True
    handshake_timeout = None    # the core's --handshake-timeout, for the 192 bytes
    secret_options = ()
    uses_state_dir = False

    # What to check when a handshake failed, by side and kind (failure_hint).
    HINTS = {
        (True, "protocol"): "(is it an obfs3 server?)",
        (True, "timeout"): "(is it an obfs3 server? one sends its 192 bytes at once)",
        (True, "closed"): "(is it an obfs3 server?)",
        (False, "protocol"): "(a prober, or a client of another transport)",
        (False, "timeout"): "(a prober, or a client of another transport)",
    }

    @classmethod
    def crypto_routes(cls):
        """({"obfs3 modexp": route, "AES-CTR": route}, [the pieces in pure Python:
        slower, not constant time])."""
        routes, slow = aes_ctr_routes()
        return (dict({"obfs3 modexp": MODEXP_ROUTE}, **routes),
                (["obfs3 modexp"] if modexp is modexp_python else []) + slow)

    @classmethod
    def client_config(cls, options):
        """obfs3 has no parameters. Arguments are refused, not ignored as obfs4proxy
        does: a bridge line with obfs4's cert= and iat-mode= on an obfs3 bridge is a
        mistake, and ignoring it left the user waiting for a timeout."""
        return _no_arguments(options)

    @classmethod
    def server_config(cls, options, state_dir):
        """No options, no state files; SMETHOD announces an empty ARGS:."""
        return _no_arguments(options), {}

    @classmethod
    def prepare(cls, initiator, config):
        """Both sides start from a UniformDH keypair, which depends on nothing: one
        pool for every config and role."""
        return "obfs3 keypairs", generate_keypair

    def __init__(self, initiator, config=None, prepared=None):
        self.initiator = initiator
        self.config = Obfs3Config() if config is None else config
        self._prepared = prepared
        self.padlen1 = self._draw_padlen()
        self.padlen2 = self._draw_padlen()
        self.public = None            # our 192-byte public value, made by start()
        self.peer_public = None
        self.state = WAIT_KEY
        self._x = None
        self._buffer = bytearray()    # the peer's bytes until its magic is found
        self._scanned = 0             # how much of _buffer has been searched
        self.peer_padding = None      # PADLEN1 + PADLEN2 of the peer, once its magic is found
        self._failure = None
        self._own_magic = self._peer_magic = None
        self._encrypt = self._decrypt = None
        self._magic_sent = False

    def _draw_padlen(self):
        padlen = self.config.padlen()
        if not 0 <= padlen <= MAX_PADLEN:
            raise ValueError("padlen must be in 0..%d, got %r" % (MAX_PADLEN, padlen))
        return padlen

    @property
    def is_open(self):
        return self._encrypt is not None

    def failure_hint(self, kind):
        """What to check after a failed handshake ("protocol", "timeout" or "closed"),
        as a parenthesised clause for the core to put after its own words, or ""."""
        return self.HINTS.get((self.initiator, kind), "")

    def start(self):
        """PUB | PAD1: our UniformDH public value, then PADLEN1 random bytes."""
        if self.public is not None:
            raise RuntimeError("obfs3: start() called twice")
        if self._prepared is not None:
            (self._x, self.public), self._prepared = self._prepared, None
        elif self.config.keypairs is None:
            self._x, self.public = generate_keypair(self.config.randbytes)
        else:
            self._x, self.public = self.config.keypairs()
        if len(self.public) != PUBLIC_KEY_LENGTH:
            raise ValueError("keypairs() gave a %d-byte public value" % len(self.public))
        return self.public + self.config.randbytes(self.padlen1)

    def receive(self, data):
        if self.state == OPEN:
            return self._decrypt(data)
        if self.state == FAILED:
            raise ProtocolError("the obfs3 handshake already failed: %s" % self._failure)
        if self._x is None:
            raise RuntimeError("obfs3: receive() before start()")
        self._buffer += data

        if self.state == WAIT_KEY:
            # 1. Buffer until the peer's 192-byte public value is in; then
            #    compute the shared secret and all keys. We are open now.
            if len(self._buffer) < PUBLIC_KEY_LENGTH:
                return b""
            self.peer_public = bytes(self._buffer[:PUBLIC_KEY_LENGTH])
            del self._buffer[:PUBLIC_KEY_LENGTH]
            self._make_keys(shared_secret(self._x, self.peer_public))
            self.state = SEARCH_MAGIC

        # 2. Search the peer's magic where it may lie: starting at pos <= 8194 (two
        #    paddings of at most 4097), so within the 8226 bytes after the public
        #    value. A magic straddling two reads starts at most 31 bytes before the old end.
        start = max(0, self._scanned - (MAGIC_LENGTH - 1))
        pos = self._buffer.find(self._peer_magic, start, MAGIC_SEARCH_LIMIT)
        # 3. Not there: wait, or give up once all 8226 bytes are in. One outcome and one
        #    reason whatever the split (a magic at 8195 or later is the same failure as none).
        if pos < 0:
            if len(self._buffer) >= MAGIC_SEARCH_LIMIT:
                return self._fail("no peer magic within the %d bytes after its public value "
                                  "(its paddings may total %d bytes at most)"
                                  % (MAGIC_SEARCH_LIMIT, MAX_PADDING))
            self._scanned = len(self._buffer)
            return b""

        # 4. Drop the paddings and the magic; every later byte is data, from
        #    position 0 of the peer's keystream, including bytes in this chunk.
        self.peer_padding = pos
        del self._buffer[:pos + MAGIC_LENGTH]
        trailing, self._buffer = bytes(self._buffer), None
        self.state = OPEN
        return self._decrypt(trailing) if trailing else b""

    def _make_keys(self, secret):
        keys = derive_keys(secret)
        if self.initiator:
            ours, theirs = keys.init_secret, keys.resp_secret
            self._own_magic, self._peer_magic = keys.init_magic, keys.resp_magic
        else:
            ours, theirs = keys.resp_secret, keys.init_secret
            self._own_magic, self._peer_magic = keys.resp_magic, keys.init_magic
        # Two cipher objects per connection, each one continuous keystream.
        self._decrypt = ctr(theirs).decrypt
        self._encrypt = ctr(ours).encrypt

    def _fail(self, message):
        self.state, self._failure, self._buffer = FAILED, message, None
        raise ProtocolError(message)

    def data_to_send(self):
        return b""

    def send(self, plaintext):
        if self._encrypt is None:
            raise RuntimeError("obfs3: send() before the peer's public value arrived (no keys yet)")
        if self._magic_sent:
            return self._encrypt(plaintext)
        # The first data: PAD2 | MAGIC | E(data), padding and magic in clear.
        self._magic_sent = True
        return self.config.randbytes(self.padlen2) + self._own_magic + self._encrypt(plaintext)

    def send_in_place(self, buffer):
        if not self._magic_sent:
            return False
        self._encrypt(buffer, output=buffer)
        return True

    def receive_in_place(self, buffer):
        if self.state != OPEN:
            return False
        self._decrypt(buffer, output=buffer)
        return True
