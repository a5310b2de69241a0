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
E(K, data)               AES-128-CTR, ``_ctr(m)``: key m[:16], counter m[16:]
INIT_SEED / RESP_SEED    ``Obfs2.seed`` on each side, ``peer_seed``
INIT_PAD / RESP_PAD      ``pad_key(seed, initiator)``
INIT_SECRET/RESP_SECRET  ``data_keys(init_seed, resp_seed)``
=======================  ===========================================

The handshake message (each side sends exactly one, without waiting)
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
import secrets
import struct

from Crypto.Cipher import AES

MAGIC_VALUE = 0x2BF5CA7E
SEED_LENGTH = 16
MAX_PADDING = 8192
KEYLEN = 16
IVLEN = 16
HASH_ITERATIONS = 100000
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


class Obfs2:
    """One side of one obfs2 connection, with no I/O.

    Methods for the caller (the transport contract, shared with ``Dummy``):

    ``start() -> bytes``
        Our handshake message. Send it at once; do not wait for the peer.
    ``receive(data) -> bytes``
        Feed bytes from the peer in any split. Returns the plaintext they
        carried, which is empty until the handshake is done. Bytes that arrive
        glued to the end of the padding come out of the same call.
        Raises ``ProtocolError`` when the peer is not obfs2.
    ``send(plaintext) -> bytes``
        The bytes to put on the wire. Only once ``is_open``.
    ``is_open``
        True once the peer's seed and padding have arrived and both data keys
        exist.
    ``send_in_place(buffer)``, ``receive_in_place(buffer)``
        The data phase's fast path: transform the bytes of a writable buffer
        (a memoryview of a bytearray) where they lie, with no new allocation.
        The same keystreams as ``send`` and ``receive``; only once ``is_open``.

    ``initiator`` is True for the side that opened the TCP connection (our
    client), False for the side that accepted it (our server).
    """

    name = "obfs2"

    def __init__(self, initiator, shared_secret=None, hash_iterations=HASH_ITERATIONS,
                 randbytes=secrets.token_bytes, padlen=None):
        self.initiator = initiator
        # An empty secret is no secret, as in Python obfsproxy ("if secret:"),
        # so that a SOCKS argument "shared-secret=" still talks to it.
        if not shared_secret:
            self.secret_hash = None
        else:
            if isinstance(shared_secret, str):
                shared_secret = shared_secret.encode()
            self.secret_hash = hashlib.sha256(shared_secret).digest()
        if hash_iterations < 1:
            raise ValueError("hash_iterations must be at least 1")
        self.iterations = hash_iterations
        self._randbytes = randbytes
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

    def start(self):
        """SEED | E(own PAD, UINT32(MAGIC_VALUE) | UINT32(PADLEN) | padding)."""
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
                raise ProtocolError("invalid magic value 0x%08x (wrong protocol, "
                                    "or a different shared secret)" % magic)
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

    def receive_in_place(self, buffer):
        if self._decrypt is None:
            raise RuntimeError("obfs2: receive_in_place() before the handshake completed")
        self._decrypt(buffer, output=buffer)
