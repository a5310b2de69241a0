r"""obfs2, the Twobfuscator: a sans-IO implementation of both ends.

What obfs2 does, and what it does not
-------------------------------------
obfs2 removes *content signatures* from a TCP stream. A DPI box that matches
fixed strings (a TLS ClientHello, Tor's cipher list) sees bytes that look
uniformly random from the first byte on. That is all it does:

* No confidentiality. Each side's seed crosses the wire in clear, and every key
  is a hash of the seeds, so anyone who records both directions can derive the
  keys and read the inner stream (``obfsproxy.py unmask`` does exactly that).
* No authentication and no integrity: there is no MAC on the data.
* Packet sizes and timing are unchanged (ciphertext length == plaintext length).
* It is detectable: one SHA-256 and one AES block over the first 24 bytes of a
  connection reveal the magic value. Active probing finds a server at once.

Confidentiality and integrity must come from the inner protocol (Tor's TLS).
The optional shared secret makes the passive key derivation cost
``4 * HASH_ITERATIONS`` SHA-256 per connection and needs the secret; it is
still not an authenticated key exchange.

Notation (spec symbol -> code)
------------------------------
=======================  ===========================================
H(x)                     ``sha256(x)``
H^n(x)                   ``_iterated_sha256(x, n)``
MAC(s, x)                ``mac(s, x)`` = H(s | x | s)
MAC with a secret        ``mac(s, x, secret_hash, n)`` = H^n(s | x | H(SECRET) | s)
E(K, data)               AES-128-CTR, ``ctr(m)``: key m[:16], counter m[16:]
INIT_SEED / RESP_SEED    ``Obfs2.seed`` on each side, ``peer_seed``
INIT_PAD / RESP_PAD      ``pad_key(seed, initiator)``
INIT_SECRET/RESP_SECRET  ``data_keys(init_seed, resp_seed)``
=======================  ===========================================

The handshake message (each side sends exactly one; see the answer-later rule)
---------------------------------------------------------------------
::

    0        16       20       24                  24+PADLEN
    +--------+--------+--------+-------------------+--------------------
    |  SEED  | MAGIC  | PADLEN |  random padding   |  E(data key, data) ...
    +--------+--------+--------+-------------------+--------------------
     clear    \______ E(own PAD key) : one CTR stream ______/

Key schedule: every value is one SHA-256 output m; AES key = m[0:16],
CTR initial counter block = m[16:32].

=======================================  ==========================  ==========================
label                                    hashed over                 used by / for
=======================================  ==========================  ==========================
"Initiator obfuscation padding"          INIT_SEED                   initiator's magic+padding
"Responder obfuscation padding"          RESP_SEED (erratum 1)       responder's magic+padding
"Initiator obfuscated data"              INIT_SEED | RESP_SEED       all data initiator->responder
"Responder obfuscated data"              INIT_SEED | RESP_SEED       all data responder->initiator
=======================================  ==========================  ==========================

States of the receiving side (as in the C obfsproxy)::

    WAIT_FOR_KEY --24 bytes, good magic--> WAIT_FOR_PADDING --PADLEN dropped--> OPEN
         |                                                                    (data)
         +-- wrong magic or PADLEN > MAX_PADDING --> ProtocolError: close the connection

Errors in the spec text (the implementations that run on the network win)
-------------------------------------------------------------------------
1. The spec derives RESP_PAD from INIT_SEED. Every implementation uses the
   responder's own RESP_SEED, and obfs4proxy rejects a responder that follows
   the spec text ("invalid magic value"). We use RESP_SEED.
2. The spec writes only the key half of the padding keys; the IV is the second
   half of the same hash, exactly as for the data keys.
3. Shared-secret mode: the C obfsproxy 0.1.4 hashes n + 1 times and puts only
   16 bytes of H(SECRET) into the padding MACs. We follow the spec text and
   Python obfsproxy 0.2.x (exactly n rounds, all 32 bytes), so we do not
   interoperate with the C code in that mode. Like Python obfsproxy, we
   treat an empty secret as no secret.
"""

import hashlib
import re
import secrets
import struct

from cryptoroutes.aes_ctr import AES, aes_ctr_routes

MAGIC_VALUE = 0x2BF5CA7E
SEED_LENGTH = 16
MAX_PADDING = 8192
KEYLEN = 16
IVLEN = 16
HASH_ITERATIONS = 100000
MAX_HASH_ITERATIONS = 10 ** 7  # a bound: a SOCKS argument must not stall a thread for hours
HEADER_LENGTH = SEED_LENGTH + 8  # SEED | E(MAGIC | PADLEN)

INIT_PAD_LABEL = b"Initiator obfuscation padding"
RESP_PAD_LABEL = b"Responder obfuscation padding"
INIT_DATA_LABEL = b"Initiator obfuscated data"
RESP_DATA_LABEL = b"Responder obfuscated data"

# Receiving states.
WAIT_FOR_KEY = "WAIT_FOR_KEY"
WAIT_FOR_PADDING = "WAIT_FOR_PADDING"
OPEN = "OPEN"


class ProtocolError(Exception):
    """The peer is not speaking obfs2 (wrong magic, padding too long).

    What happens next: the caller closes the connection. Nothing the peer
    sends later can repair it.
    """


def _iterated_sha256(data, n):
    """H^n(data): SHA-256 applied n times in a row (n >= 1)."""
    for _ in range(n):
        data = hashlib.sha256(data).digest()
    return data


def mac(label, x, secret_hash=None, iterations=HASH_ITERATIONS):
    """MAC(s, x) = H(s | x | s); with a shared secret H^n(s | x | H(SECRET) | s)."""
    if secret_hash is None:
        return hashlib.sha256(label + x + label).digest()
    return _iterated_sha256(label + x + secret_hash + label, iterations)


def secret_hash(secret):
    """H(SECRET) = SHA-256(secret), the value every MAC with a shared secret
    takes; None when there is no secret. ``secret``: str (UTF-8) or bytes. An
    empty secret is no secret, as in Python obfsproxy (erratum 3)."""
    if not secret:
        return None
    return hashlib.sha256(secret.encode() if isinstance(secret, str) else secret).digest()


def pad_key(seed, initiator, secret_hash=None, iterations=HASH_ITERATIONS):
    """INIT_PAD = MAC("Initiator obfuscation padding", INIT_SEED)
    RESP_PAD = MAC("Responder obfuscation padding", RESP_SEED)   (erratum 1)
    """
    label = INIT_PAD_LABEL if initiator else RESP_PAD_LABEL
    return mac(label, seed, secret_hash, iterations)


def data_keys(init_seed, resp_seed, secret_hash=None, iterations=HASH_ITERATIONS):
    """INIT_SECRET = MAC("Initiator obfuscated data", INIT_SEED | RESP_SEED)
    RESP_SECRET = MAC("Responder obfuscated data", INIT_SEED | RESP_SEED)

    Both hash INIT_SEED first, whichever side computes them.
    """
    seeds = init_seed + resp_seed
    return (mac(INIT_DATA_LABEL, seeds, secret_hash, iterations),
            mac(RESP_DATA_LABEL, seeds, secret_hash, iterations))


def ctr(m):
    """E(K, .) as a keystream object: AES-128-CTR with key m[:16] and the whole
    128-bit counter block m[16:32], incremented big-endian and wrapping from
    ff..ff to 00..00."""
    return AES.new(m[:KEYLEN], AES.MODE_CTR, nonce=b"",
                   initial_value=m[KEYLEN:KEYLEN + IVLEN])


def read_header(header, initiator, secret_hash=None, iterations=HASH_ITERATIONS):
    """Decode the first HEADER_LENGTH bytes that one side sent.

    ``initiator`` says who *sent* them. Returns (seed, magic, padlen, pad
    keystream positioned after PADLEN). The magic is returned, not checked,
    so that tools can report it; ``Obfs2.receive`` checks it.
    """
    seed = bytes(header[:SEED_LENGTH])
    stream = ctr(pad_key(seed, initiator, secret_hash, iterations))
    magic, padlen = struct.unpack(">II", stream.decrypt(bytes(header[SEED_LENGTH:HEADER_LENGTH])))
    return seed, magic, padlen, stream


class Config:
    """What one listener (or one SOCKS connection) tells its obfs2 sides.

    ``shared_secret``: str or bytes, or None; an empty secret is no secret, as
    in Python obfsproxy (``if secret:``), so that a SOCKS argument
    ``shared-secret=`` still talks to a server without one.
    ``hash_iterations``: n in H^n, shared-secret mode only.
    ``notes``: lines the core says once at NOTICE (none for obfs2).
    """

    def __init__(self, shared_secret=None, hash_iterations=HASH_ITERATIONS):
        if not 1 <= hash_iterations <= MAX_HASH_ITERATIONS:
            raise ValueError("hash_iterations must be in 1..%d" % MAX_HASH_ITERATIONS)
        self.shared_secret = shared_secret or None
        self.hash_iterations = hash_iterations
        self.notes = ()             # lines the core says once at NOTICE


# The options obfs2 takes (--transport-options, SOCKS arguments, Tor's
# TOR_PT_SERVER_TRANSPORT_OPTIONS). ss-hash-iterations is ours (the spec's
# default is 100000); obfs4proxy's obfs2 refuses shared-secret altogether.
OPTIONS = ("shared-secret", "ss-hash-iterations")


def _config(options):
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError("unknown obfs2 argument(s): %s (obfs2 takes %s)"
                         % (", ".join(unknown), ", ".join(OPTIONS)))
    text = options.get("ss-hash-iterations", str(HASH_ITERATIONS))
    # ASCII digits only (str.isdigit() also takes "²", which int() refuses, and int()
    # takes "١٠", Arabic-Indic ten), and few enough that int() is cheap and allowed.
    if not (re.fullmatch(r"[0-9]{1,20}", text) and 1 <= int(text) <= MAX_HASH_ITERATIONS):
        raise ValueError("ss-hash-iterations must be a whole number in 1..%d, not %r"
                         % (MAX_HASH_ITERATIONS, text if len(text) <= 20 else text[:20] + "..."))
    secret = options.get("shared-secret")
    try:
        secret = secret.encode() if isinstance(secret, str) else secret
    except UnicodeError:   # e.g. undecodable bytes from the environment
        raise ValueError("the shared secret is not valid UTF-8 text")
    return Config(secret, int(text))


class Obfs2:
    """One side of one obfs2 connection, with no I/O.

    Methods for the caller (the transport contract, written once in
    transports.py):

    ``start() -> bytes``
        Our handshake message, to send at once: both sides send without
        waiting, except a responder with a shared secret (below).
    ``receive(data) -> bytes``
        Feed bytes from the peer in any split. Returns the plaintext they
        carried, which is empty until the handshake is done. Bytes that arrive
        glued to the end of the padding come out of the same call.
        Raises ``ProtocolError`` when the peer is not obfs2.
    ``data_to_send() -> bytes``
        What receiving made us owe the peer: only a shared-secret responder
        owes anything (its handshake, once the initiator's has checked out).
    ``send(plaintext) -> bytes``
        The bytes to put on the wire. Only once ``is_open``.
    ``is_open``
        True once the peer's seed and padding have arrived and both data keys
        exist.
    ``send_in_place(buffer)``, ``receive_in_place(buffer)``
        The data phase's fast path: transform the bytes of a writable buffer
        (a memoryview of a bytearray) where they lie, with no new allocation,
        and return True. The same keystreams as ``send`` and ``receive``.

    ``initiator`` is True for the side that opened the TCP connection (our
    client), False for the side that accepted it (our server). ``prepared``
    is one item of ``prepare()``'s pool, made ahead for the same role and config.

    The answer-later rule: in shared-secret mode every key costs
    4 x HASH_ITERATIONS SHA-256 (``expensive``), paid before the peer can be
    checked. So that a bare connect costs a server nothing, the responder
    then says nothing in ``start()`` and answers through ``data_to_send()``
    once the initiator's handshake has arrived and checked out. The
    initiator never waits for us before sending, so this cannot deadlock.
    """

    name = "obfs2"
    ProtocolError = ProtocolError
    expensive = False           # per connection: True with a shared secret (the hashing)
    handshake_timeout = None    # the core's --handshake-timeout
    secret_options = ("shared-secret",)     # never logged
    uses_state_dir = False

    # What to check when a handshake failed, by side and kind (failure_hint).
    HINTS = {
        (True, "protocol"): "(wrong protocol, or a different shared secret)",
        (True, "timeout"): "(is it an obfs2 server?)",
        (True, "closed"): "(wrong protocol, or a different shared secret)",
        (False, "protocol"): "(wrong protocol, or a different shared secret)",
    }

    @classmethod
    def crypto_routes(cls):
        """({"AES-CTR": route}, ["AES-CTR"] if it runs in pure Python)."""
        return aes_ctr_routes()

    @classmethod
    def client_config(cls, options):
        return _config(options)

    @classmethod
    def server_config(cls, options, state_dir=None):
        config = _config(options)
        secret = config.shared_secret
        if isinstance(secret, bytes):
            secret = secret.decode("utf-8", "replace")
        # The client needs the secret (and a non-default round count) in its
        # Bridge line: Tor publishes the ARGS.
        announce = {"shared-secret": secret} if secret else {}
        if secret and config.hash_iterations != HASH_ITERATIONS:
            announce["ss-hash-iterations"] = str(config.hash_iterations)
        return config, announce

    @classmethod
    def prepare(cls, initiator, config):
        """(key, make) for our first message made ahead: make() -> (SEED, PADLEN,
        SEED | E(own PAD key, MAGIC | PADLEN | padding)), which depends on the role,
        the secret and the round count (the pool's key). None for a shared-secret
        responder: it answers only an initiator that checked out, so a bare connect
        must not cost it 4 x HASH_ITERATIONS SHA-256, not even to refill a pool."""
        config = config or Config()
        if config.shared_secret and not initiator:
            return None
        key = ("obfs2 first messages", initiator, config.shared_secret, config.hash_iterations)
        return key, lambda: cls._first_message(initiator, config)

    @classmethod
    def _first_message(cls, initiator, config):
        side = cls(initiator, config)
        return side.seed, side.padlen, side.handshake()

    def __init__(self, initiator, config=None, prepared=None, randbytes=secrets.token_bytes,
                 padlen=None, **config_fields):
        config = config or Config(**config_fields)
        self.initiator = initiator
        self.secret_hash = secret_hash(config.shared_secret)
        self.iterations = config.hash_iterations
        self.expensive = self.secret_hash is not None
        self._answer_later = self.expensive and not initiator
        self._owed = b""
        self._randbytes = randbytes
        self._prepared_message = None
        if prepared is not None:        # made ahead by prepare() for this role and config
            padlen = prepared[1]
            self.seed, self._prepared_message = prepared[0], prepared[2]
        else:
            self.seed = randbytes(SEED_LENGTH)
        # PADLEN is uniform in 0..MAX_PADDING inclusive, from a CSPRNG.
        self.padlen = secrets.randbelow(MAX_PADDING + 1) if padlen is None else padlen
        if not 0 <= self.padlen <= MAX_PADDING:
            raise ValueError("padlen must be in 0..%d" % MAX_PADDING)
        self.state = WAIT_FOR_KEY
        self.peer_seed = None
        self.peer_padlen = None
        self._buffer = bytearray()
        self._padding_left = 0
        self._encrypt = self._decrypt = None

    @property
    def is_open(self):
        return self.state == OPEN

    def failure_hint(self, kind):
        """What to check after a failed handshake ("protocol", "timeout" or "closed"),
        as a parenthesised clause for the core to put after its own words, or "".
        A responder with a shared secret closes on an initiator with another one:
        the initiator sees "closed"."""
        return self.HINTS.get((self.initiator, kind), "")

    def start(self):
        """SEED | E(own PAD, UINT32(MAGIC_VALUE) | UINT32(PADLEN) | padding),
        or b"" for a shared-secret responder (see the answer-later rule)."""
        return b"" if self._answer_later else self.handshake()

    def data_to_send(self):
        owed, self._owed = self._owed, b""
        return owed

    def handshake(self):
        """Our handshake message: SEED | E(own PAD, MAGIC | PADLEN | padding), the
        prepared one if there is one. The key work (one SHA-256, or 4 x HASH_ITERATIONS
        with a secret) happens here, called by start() or receive(), never by the
        constructor: the core serialises only those two."""
        if self._prepared_message is not None:
            return self._prepared_message
        stream = ctr(pad_key(self.seed, self.initiator, self.secret_hash, self.iterations))
        body = struct.pack(">II", MAGIC_VALUE, self.padlen) + self._randbytes(self.padlen)
        return self.seed + stream.encrypt(body)

    def receive(self, data):
        if self.state == OPEN:
            return self._decrypt(data)
        self._buffer += data

        if self.state == WAIT_FOR_KEY:
            # 1. Accumulate until the seed, magic and padlen are buffered.
            if len(self._buffer) < HEADER_LENGTH:
                return b""
            # 2. Derive the peer's PAD key from its seed; decrypt magic, padlen.
            peer_is_initiator = not self.initiator
            seed, magic, padlen, _ = read_header(self._buffer, peer_is_initiator,
                                                 self.secret_hash, self.iterations)
            # 3. Wrong magic or too much padding: the peer is not obfs2.
            if magic != MAGIC_VALUE:
                raise ProtocolError("invalid magic value 0x%08x" % magic)
            if padlen > MAX_PADDING:
                raise ProtocolError("padding length %d exceeds %d" % (padlen, MAX_PADDING))
            self.peer_seed, self.peer_padlen = seed, padlen
            del self._buffer[:HEADER_LENGTH]
            self._padding_left = padlen
            self.state = WAIT_FOR_PADDING

        # 4. Discard exactly PADLEN bytes, without decrypting them.
        drop = min(self._padding_left, len(self._buffer))
        del self._buffer[:drop]
        self._padding_left -= drop
        if self._padding_left:
            return b""

        # 5. Both seeds are known: derive the data keys. Every byte after the
        #    padding is data, including any that came in this same chunk.
        if self.initiator:
            init_seed, resp_seed = self.seed, self.peer_seed
        else:
            init_seed, resp_seed = self.peer_seed, self.seed
        init_secret, resp_secret = data_keys(init_seed, resp_seed,
                                             self.secret_hash, self.iterations)
        ours, theirs = (init_secret, resp_secret) if self.initiator else (resp_secret, init_secret)
        self._send_stream, self._receive_stream = ctr(ours), ctr(theirs)
        self._encrypt = self._send_stream.encrypt
        self._decrypt = self._receive_stream.decrypt
        self.state = OPEN
        if self._answer_later:  # the initiator checked out: now we answer
            self._owed = self.handshake()
        trailing, self._buffer = bytes(self._buffer), None
        return self._decrypt(trailing) if trailing else b""

    def send(self, plaintext):
        if self._encrypt is None:
            raise RuntimeError("obfs2: send() before the handshake completed")
        return self._encrypt(plaintext)

    def send_in_place(self, buffer):
        if self._encrypt is None:
            raise RuntimeError("obfs2: send_in_place() before the handshake completed")
        self._encrypt(buffer, output=buffer)
        return True

    def receive_in_place(self, buffer):
        if self._decrypt is None:
            raise RuntimeError("obfs2: receive_in_place() before the handshake completed")
        self._decrypt(buffer, output=buffer)
        return True
