r"""obfs4, the obfourscator: a sans-IO implementation of both ends, byte-compatible with
Debian's obfs4proxy 0.0.14 (and so with Tor's lyrebird). The facts come from
``shared/obfs4-spec.md``; section numbers (§) below refer to it.

What obfs4 does, and what it does not
-------------------------------------
* Looks like uniformly random bytes from the first byte on, with random lengths: the
  keys on the wire are Elligator2 representatives, everything else is padding, MACs or
  XSalsa20-Poly1305 ciphertext. DPI that matches content finds nothing.
* Resists active probing: the server answers only a client that knows its NODEID and
  identity key B (both in the bridge line). Anyone else gets silence, then a close at
  accept + 30 s + a per-bridge delay (``failure_linger``). A replayed handshake is
  remembered for 3 hours and gets the same silence.
* An authenticated key exchange (ntor over X25519): the client authenticates the server;
  the data has confidentiality and integrity (XSalsa20-Poly1305 per frame).
* Blurs sizes (per-bridge padding tables) and, in iat-mode 1/2, timing.
* It does NOT hide that a connection exists, its volume or its duration; it does not
  authenticate the client; and a censor who learns the bridge line can confirm the bridge.
  Tor's own TLS still runs inside.

Notation (spec -> code)
-----------------------
=================================  ===============================================
NODEID, b, B, drbg-seed, iat-mode  ``Identity.node_id/private_key/public_key/...``
KEY = B | NODEID (marks, MACs)     ``Obfs4._mac_key``  (the cert is NODEID | B!)
H16(k, m)                          ``h16(k, m)`` = HMAC-SHA256(k, m)[0:16]
x, X', X  /  y, Y', Y              ephemeral priv, representative, u (``_priv``,
                                   ``_representative``, ``_u``); the peer's u comes
                                   from ``elligator2_direct(representative)``
E                                  ``epoch_hour(now)``: ASCII floor(unix_time / 3600)
P_C, P_S                           client / server handshake padding
M_C, MAC_C, M_S, MAC_S             marks and MACs, 16 bytes each
EXP1, EXP2, KEY_SEED, AUTH         ``client_ntor`` / ``server_ntor``
OKM (144 bytes)                    ``kdf(key_seed)``
lenDist, iatDist                   ``WeightedDist`` tables (§6.3)
padBurst                           ``pad_burst(burst_length, target)``
=================================  ===============================================

Client handshake (§2.3; one write, 141 .. 8192 bytes)::

    0      32                 32+PC  48+PC   64+PC
    +------+------------------+------+-------+
    |  X'  |  P_C (77..8128)  | M_C  | MAC_C |    M_C   = H16(KEY, X')
    +------+------------------+------+-------+    MAC_C = H16(KEY, X' | P_C | M_C | E)

Server reply + seed frame (§2.5; one write, 141 .. 8192 bytes)::

    0      32     64                 64+PS  80+PS   96+PS        141+PS
    +------+------+------------------+------+-------+------------+
    |  Y'  | AUTH |  P_S (0..8051)   | M_S  | MAC_S | seed frame |
    +------+------+------------------+------+-------+------------+
    M_S = H16(KEY, Y')   MAC_S = H16(KEY, Y' | AUTH | P_S | M_S | E')
    E' = the E string the server matched (its E, E - 1 or E + 1); seed frame = a type-1
    packet carrying the server's drbg-seed (2 + 16 + 3 + 24 = 45 bytes, no padding).

Frame (§2.8) and the packet inside it (§2.9)::

    +-------+-----+------------------------------------------+
    | L_obf | tag | ciphertext of: type | n | payload | 00.. |
    +-------+-----+------------------------------------------+
      2       16     1      2    n        padding
    L = 16 + len(packet) in 16..1446; L_obf = L XOR mask16 (next block of the sender's
    HashDrbg); box = XSalsa20-Poly1305(key, nonce_prefix | BE64(counter)), counter = 1, 2, ...

ntor, as obfs4 computes it (§2.6)::

    client: EXP1 = X25519(x, Y)  EXP2 = X25519(x, B)    server: EXP1 = X25519(y, X)  EXP2 = X25519(b, X)
    suffix       = B | B | X | Y | PROTOID | NODEID      (B twice: erratum 6)
    secret_input = EXP1 | EXP2 | suffix
    KEY_SEED     = HMAC(t_key, secret_input)      verify = HMAC(t_verify, secret_input)
    AUTH         = HMAC(t_mac, verify | suffix | "Server")
    OKM          = HKDF-SHA256(IKM = KEY_SEED, salt = t_key, info = m_expand, L = 144)

Key schedule (erratum 3: the document has the halves the other way round):

=========  =================================================================
OKM bytes  use
=========  =================================================================
0..31      client->server secretbox key       (client encodes, server decodes)
32..47     client->server nonce prefix
48..71     client->server HashDrbg seed for the length masks (SipHash key | block)
72..143    the same four for server->client    (server encodes, client decodes)
=========  =================================================================

State machines (§2.11)::

    client: NEW --start()--> WAIT_REPLY --M_S found, MAC_S ok, AUTH ok--> OPEN
                                 +--8192 bytes without M_S, bad MAC_S/AUTH, zero DH--> FAILED
    server: WAIT_HANDSHAKE --valid handshake (reply + seed frame in data_to_send())--> OPEN
                +--bad mark/MAC, replay, trailing bytes, zero DH, >= 8192 bytes--> FAILED
                   (the I/O layer drains until accept + failure_linger, then FIN)
    OPEN: any bad frame or packet --> FAILED (close at once)

The document (doc/obfs4-spec.txt) vs the 0.0.14 code, which is what is on the wire (§3)
----------------------------------------------------------------------------------------
1. Client padding is 77..8128 (document: 85 minimum). We send and accept 77..8128.
2. Server padding is 0..8051 so that reply + seed frame fit in 8192; the client search
   accepts M_S anywhere up to offset 8160 (padding up to 8096).
3. OKM 0..71 is client->server (the document says server->client).
4. nonce = 16-byte prefix | 8-byte big-endian counter starting at 1.
5. The length-mask DRBG is one SipHash state that is never reset (``HashDrbg``).
6. ntor suffix B | B | X | Y | PROTOID | NODEID, not Tor's proposal-216 layout.
7. Elligator2: random top two bits on ours, both masked on theirs, "dirty" keys with a
   torsion component (all in ``obfs4_crypto``).
8. The server looks for M_C only at the tail and rejects bytes after MAC_C: a client
   sends nothing more until the reply verifies.
9. Failed server handshakes close after a FIXED per-bridge delay (30 s + close_delay).
10. A replay filter on MAC_C (3 h, 102 400 entries).
11. Packets < 3 bytes or with n beyond the packet are fatal; a bad frame length waits for a
    random length in 16..1446, then fails as a bad tag would.
12. Padding tables are built with Go's math/rand over the hash DRBG (§6.3).
13. obfs4proxy's client decodes the seed frame only after its next read; ours at once.
14. iat-mode 2 with a sampled write size 0 makes obfs4proxy panic; we resample.
15. iat-mode 2 with a table of looping lengths (e.g. [7]) makes obfs4proxy stream padding
    forever on one write; we bound the work per write (``Obfs4.send_paced``).
"""

import collections
import functools
import hashlib
import hmac
import os
import secrets
import struct
import threading
import time

import obfs4_crypto
import obfs4_state
from cryptoroutes.curve25519 import elligator2_direct, generate_keypair, x25519
from obfs4_crypto import SecretBox, hkdf_sha256
from obfs4_drbg import HashDrbg, WeightedDist, close_delay
from obfs4_state import (
    IAT_ENABLED,
    IAT_NONE,
    KEY_LENGTH,
    NODE_ID_LENGTH,
    from_hex,
    parse_cert,
    parse_iat_mode,
)
from obfs4_state import Identity as Identity  # what ServerConfig takes (made by obfs4_state)

# --- Constants (§2.1), with the spec's names -------------------------------------------

MAX_HANDSHAKE_LENGTH = 8192
MARK_LENGTH = 16
MAC_LENGTH = 16
REPRESENTATIVE_LENGTH = 32
AUTH_LENGTH = 32
# X' | M_C | MAC_C = 64;  Y' | AUTH | M_S | MAC_S = 96;  the seed frame 2 + 16 + 3 + 24 = 45
CLIENT_MIN_HANDSHAKE_LENGTH = REPRESENTATIVE_LENGTH + MARK_LENGTH + MAC_LENGTH
SERVER_MIN_HANDSHAKE_LENGTH = REPRESENTATIVE_LENGTH + AUTH_LENGTH + MARK_LENGTH + MAC_LENGTH
INLINE_SEED_FRAME_LENGTH = 2 + 16 + 3 + 24
# 96 + 45 - 64 = 77 (erratum 1) .. 8192 - 64 = 8128
CLIENT_MIN_PAD_LENGTH = SERVER_MIN_HANDSHAKE_LENGTH + INLINE_SEED_FRAME_LENGTH - CLIENT_MIN_HANDSHAKE_LENGTH
CLIENT_MAX_PAD_LENGTH = MAX_HANDSHAKE_LENGTH - CLIENT_MIN_HANDSHAKE_LENGTH
# 0 .. 8192 - 96 - 45 = 8051 (erratum 2)
SERVER_MIN_PAD_LENGTH = 0
SERVER_MAX_PAD_LENGTH = MAX_HANDSHAKE_LENGTH - SERVER_MIN_HANDSHAKE_LENGTH - INLINE_SEED_FRAME_LENGTH

MAXIMUM_SEGMENT_LENGTH = 1448                 # the largest frame on the wire
LENGTH_LENGTH = 2
TAG_LENGTH = 16
FRAME_OVERHEAD = LENGTH_LENGTH + TAG_LENGTH                          # 18
MAXIMUM_FRAME_PAYLOAD_LENGTH = MAXIMUM_SEGMENT_LENGTH - FRAME_OVERHEAD  # 1430, largest packet
PACKET_OVERHEAD = 3                           # type (1) | payload length n (2)
PACKET_HEADER = struct.Struct(">BH")
MAX_PACKET_PAYLOAD_LENGTH = MAXIMUM_FRAME_PAYLOAD_LENGTH - PACKET_OVERHEAD  # 1427
HEADER_LENGTH = FRAME_OVERHEAD + PACKET_OVERHEAD                     # 21: an empty packet's frame
MIN_FRAME_LENGTH = FRAME_OVERHEAD - LENGTH_LENGTH                    # 16: L = tag only
MAX_FRAME_LENGTH = MAXIMUM_SEGMENT_LENGTH - LENGTH_LENGTH            # 1446
MAX_NONCE_COUNTER = (1 << 64) - 1

PACKET_TYPE_PAYLOAD = 0
PACKET_TYPE_PRNG_SEED = 1
SEED_LENGTH = 24                              # a HashDrbg seed: SipHash key (16) | block (8)
SEED_PACKET_PAYLOAD_LENGTH = SEED_LENGTH
DIRECTION_KEY_LENGTH = 32 + 16 + SEED_LENGTH  # 72: secretbox key | nonce prefix | DRBG seed
OKM_LENGTH = 2 * DIRECTION_KEY_LENGTH         # 144

SERVER_HANDSHAKE_TIMEOUT = 30                 # seconds: obfs4proxy's serverHandshakeTimeout (the
                                              # server's handshake_timeout, the base of failure_linger)
REPLAY_TTL = 3 * 3600                         # seconds a MAC_C is remembered
REPLAY_MAX_ENTRIES = 102400

MAX_IAT_DELAY = 100                           # iatDist values 0..100 ...
IAT_UNIT = 100e-6                             # ... in units of 100 µs: at most 10 ms
PACED_QUIRK_LIMIT = 32                        # iat-mode 2: two-frame padBursts per write, then
                                              # the bounded ending (Obfs4.send_paced)
ZERO_DRAW_LIMIT = 64                          # iat-mode 2: lenDist draws of 0 in a row, then
                                              # the table's largest value

PROTOID = b"ntor-curve25519-sha256-1"
T_MAC = PROTOID + b":mac"
T_KEY = PROTOID + b":key_extract"
T_VERIFY = PROTOID + b":key_verify"
M_EXPAND = PROTOID + b":key_expand"
SERVER_STRING = b"Server"


# Connection states.
NEW = "NEW"
WAIT_REPLY = "WAIT_REPLY"
WAIT_HANDSHAKE = "WAIT_HANDSHAKE"
OPEN = "OPEN"
FAILED = "FAILED"


class ProtocolError(Exception):
    """The peer is not speaking obfs4 to us (bad mark, MAC, AUTH, frame or packet).

    What happens next: a client closes at once; a server whose handshake failed keeps
    reading and discarding until ``failure_linger`` seconds after accept, then closes
    with FIN (at once on peer EOF); a data-phase error closes at once, after the caller
    has delivered ``data``: the payload of the good frames that arrived in the same
    ``receive()`` before the bad one (b"" if none, and for every handshake error).
    """

    data = b""


# --- Small helpers ------------------------------------------------------------------

def h16(key, message):
    """H16(k, m) = the first 16 bytes of HMAC-SHA256(k, m)."""
    return hmac.new(key, message, hashlib.sha256).digest()[:MARK_LENGTH]


def epoch_hour(now):
    """E = ASCII decimal of floor(unix_time / 3600), no leading zeros, e.g. b"498974"."""
    return str(int(now) // 3600).encode("ascii")


def uniform_length(lo, hi):
    """A CSPRNG length uniform in lo..hi inclusive (the handshake paddings)."""
    return lo + secrets.randbelow(hi - lo + 1)


def sample_table(dist):
    """One draw from a lenDist/iatDist table, with the CSPRNG (§6.3 step 6)."""
    return dist.sample()


@functools.lru_cache(maxsize=32)
def table(seed, lo, hi):
    """WeightedDist(seed, lo, hi), remembered: building one costs ~10 ms (1449 Go rand
    draws over SipHash) and a client rebuilds the same bridge's table on every
    connection. The tables are immutable after construction, so sharing is safe."""
    return WeightedDist(seed, lo, hi)


def iat_seed(seed):
    """The IAT table's seed: SHA-256(seed)[0:24] (§6.3)."""
    return hashlib.sha256(seed).digest()[:SEED_LENGTH]


# The arguments each side takes. A client's node-id + public-key is the legacy form of cert.
CLIENT_OPTIONS = ("cert", "iat-mode", "node-id", "public-key")
SERVER_OPTIONS = ("node-id", "private-key", "drbg-seed", "iat-mode")


def refuse_unknown(options, accepted, side):
    """ValueError naming the arguments not in ``accepted``, and the accepted ones.
    obfs4proxy ignores them; we refuse them, so that a typo (iat_mode=1) or another
    transport's argument is seen at once instead of as a silent bridge."""
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError("unknown obfs4 argument(s): %s (an obfs4 %s takes %s)"
                         % (", ".join(unknown), side, ", ".join(accepted)))


def parse_client_args(options):
    """(NODEID, B, iat-mode) from the bridge line's arguments, as obfs4proxy's client:
    ``cert`` (or, without it, the legacy ``node-id`` + ``public-key`` in hex), and
    ``iat-mode`` 0..2, mandatory. ValueError otherwise, in the words of a bridge line
    (unknown arguments too, unlike obfs4proxy)."""
    refuse_unknown(options, CLIENT_OPTIONS, "client")
    if "cert" in options:
        node_id, public_key = parse_cert(options["cert"])
    elif "node-id" not in options and "public-key" not in options:
        raise absent_argument("cert", "no cert= given (the bridge line's cert=...; for SOCKS, pass it as "
                      "the username)")
    else:
        for given, missing in (("node-id", "public-key"), ("public-key", "node-id")):
            if missing not in options:
                raise ValueError("%s= without %s= (or give the bridge line's cert=...)" % (given, missing))
        node_id = from_hex(options["node-id"], NODE_ID_LENGTH, "node-id")
        public_key = from_hex(options["public-key"], KEY_LENGTH, "public-key")
    if "iat-mode" not in options:
        raise absent_argument("iat-mode", "no iat-mode= given (add iat-mode=0, as in the bridge line)")
    return node_id, public_key, parse_iat_mode(options["iat-mode"])


def absent_argument(name, text):
    """The ValueError for an absent argument, naming it in ``.missing``: a SOCKS
    client may still start without it, since each connection can bring it."""
    error = ValueError(text)
    error.missing = name
    return error


# --- The replay filter (§4) ----------------------------------------------------------

class ReplayFilter:
    """MAC_C values of recent valid handshakes, so that a replayed handshake gets no reply.

    Entries live ``ttl`` seconds (first sighting, never refreshed); at most ``max_entries``,
    the oldest evicted first; if the clock goes backwards the whole filter is emptied.
    One filter per listener, shared by its connections' threads, hence the lock."""

    def __init__(self, ttl=REPLAY_TTL, max_entries=REPLAY_MAX_ENTRIES):
        self.ttl, self.max_entries = ttl, max_entries
        self._first_seen = collections.OrderedDict()      # MAC_C -> time, oldest first
        self._lock = threading.Lock()

    def __len__(self):
        return len(self._first_seen)

    def test_and_set(self, now, mac):
        """True if ``mac`` was seen (a replay); otherwise remember it and return False."""
        with self._lock:
            self._compact(now)
            if mac in self._first_seen:
                return True
            self._first_seen[mac] = now
            return False

    def _compact(self, now):
        seen = self._first_seen
        while seen:
            oldest = next(iter(seen))
            if len(seen) < self.max_entries:
                age = now - seen[oldest]
                if age < 0:                  # the clock jumped backwards
                    seen.clear()
                    return
                if age < self.ttl:
                    return
            del seen[oldest]


# --- ntor and the key schedule (§2.6) -----------------------------------------------

ZERO_KEY = bytes(KEY_LENGTH)


def ntor(exp1, exp2, public_key, x_u, y_u, node_id):
    """(KEY_SEED, AUTH) from the two DH results; ProtocolError if either is all zero.

    secret_input = EXP1 | EXP2 | B | B | X | Y | PROTOID | NODEID
    KEY_SEED = HMAC(t_key, secret_input)   verify = HMAC(t_verify, secret_input)
    AUTH     = HMAC(t_mac, verify | B | B | X | Y | PROTOID | NODEID | "Server")
    """
    if hmac.compare_digest(exp1, ZERO_KEY) | hmac.compare_digest(exp2, ZERO_KEY):
        raise ProtocolError("ntor: a Diffie-Hellman result is zero (low-order key)")
    suffix = public_key + public_key + x_u + y_u + PROTOID + node_id
    secret_input = exp1 + exp2 + suffix
    key_seed = hmac.new(T_KEY, secret_input, hashlib.sha256).digest()
    verify = hmac.new(T_VERIFY, secret_input, hashlib.sha256).digest()
    auth = hmac.new(T_MAC, verify + suffix + SERVER_STRING, hashlib.sha256).digest()
    return key_seed, auth


def client_ntor(x, x_u, y_u, public_key, node_id):
    """Client: EXP1 = X25519(x, Y), EXP2 = X25519(x, B)."""
    return ntor(x25519(x, y_u), x25519(x, public_key), public_key, x_u, y_u, node_id)


def server_ntor(y, y_u, x_u, private_key, public_key, node_id):
    """Server: EXP1 = X25519(y, X), EXP2 = X25519(b, X)."""
    return ntor(x25519(y, x_u), x25519(private_key, x_u), public_key, x_u, y_u, node_id)


def kdf(key_seed):
    """OKM = HKDF-SHA256(IKM = KEY_SEED, salt = t_key, info = m_expand, L = 144);
    OKM[0:72] is client->server, OKM[72:144] server->client (erratum 3)."""
    return hkdf_sha256(key_seed, T_KEY, M_EXPAND, OKM_LENGTH)


# --- Frames and packets (§2.8, §2.9) ---------------------------------------------------

def make_packet(packet_type, payload=b"", padding=0):
    """type (1) | n = len(payload) (2, big-endian) | payload | ``padding`` zero bytes."""
    return PACKET_HEADER.pack(packet_type, len(payload)) + payload + bytes(padding)


def parse_packet(packet):
    """(type, payload) of a decrypted packet; ProtocolError if it is shorter than 3 bytes
    or its n runs past its end (erratum 11). Padding after the payload is ignored."""
    if len(packet) < PACKET_OVERHEAD:
        raise ProtocolError("packet of %d bytes is shorter than its header" % len(packet))
    packet_type, n = PACKET_HEADER.unpack_from(packet)
    if n > len(packet) - PACKET_OVERHEAD:
        raise ProtocolError("packet payload length %d exceeds the %d bytes present"
                            % (n, len(packet) - PACKET_OVERHEAD))
    return packet_type, packet[PACKET_OVERHEAD:PACKET_OVERHEAD + n]


class FrameEncoder:
    """One direction's sender: OKM's 72 bytes -> secretbox key | nonce prefix | DRBG seed.

    frame = BE16(L XOR mask16) | tag | ciphertext, L = 16 + len(packet); the nonce
    counter starts at 1 and we refuse to let it wrap. ``encode_packets`` seals a whole
    write in one pass: the boxes from one ``SecretBox.seal_packets`` call, their masks
    from one ``HashDrbg.masks`` call, the frames joined once."""

    def __init__(self, key72):
        self._box = SecretBox(key72[0:32], key72[32:48])
        self._drbg = HashDrbg(key72[48:72])
        self.counter = 1

    def encode(self, packet):
        return self.encode_packets([packet])

    def encode_packets(self, packets):
        """The frames of ``packets``, in order, as one bytes. The counter is checked for
        the whole list first: nothing is sealed if the last frame would wrap it."""
        count = len(packets)
        if self.counter + count - 1 > MAX_NONCE_COUNTER:
            raise ProtocolError("frame nonce counter would wrap")
        boxes = self._box.seal_packets(self.counter, packets)
        self.counter += count
        out = []
        for box, mask in zip(boxes, self._drbg.masks(count)):
            out += ((len(box) ^ mask).to_bytes(LENGTH_LENGTH, "big"), box)
        return b"".join(out)


class FrameDecoder:
    """One direction's receiver: bytes in any split -> the packets of complete frames.

    1. length unknown: need 2 bytes; L = L_obf XOR mask16 (this draws a DRBG block even if
       L then proves bad). L outside 16..1446: like obfs4proxy, pretend L is random in
       16..1446, wait for that many bytes, then fail as a bad tag would.
    2. wait for L bytes (L is remembered: no second draw), open the box, counter += 1.

    Every complete frame of a read is opened in one call, straight from the bytes
    received (memoryview slices); only a partial frame is kept for the next read. Masks
    are drawn ahead, about one per 1448 bytes in hand, and kept in order until used:
    the stream of masks is the same whatever the split. Frames are opened in order and
    the first bad one stops the call: its ProtocolError carries ``.packets``, the
    packets of the frames before it in this call (authenticated, and still to deliver).
    """

    def __init__(self, key72, randbelow=secrets.randbelow):
        self._box = SecretBox(key72[0:32], key72[32:48])
        self._drbg = HashDrbg(key72[48:72])
        self._randbelow = randbelow
        self.counter = 1
        self._buffer = b""                    # a partial frame from the last read
        self._masks = collections.deque()     # drawn, not yet used
        self._next_length = None
        self._length_invalid = False

    def decode(self, data):
        """The packets (bytes) of every frame completed by ``data``."""
        return [bytes(packet) for packet in self.open_frames(data)]

    def open_frames(self, data):
        """As ``decode``, but the packets as the secretbox route gives them (bytes or
        memoryviews, valid until dropped)."""
        if self._buffer:
            data = self._buffer + data
        view, pos, packets = memoryview(data), 0, []
        end, counter, length = len(view), self.counter, self._next_length
        masks, open_box = self._masks, self._box.open_view
        try:
            while True:
                if length is None:
                    if end - pos < LENGTH_LENGTH:
                        break
                    if not masks:
                        masks.extend(self._drbg.masks((end - pos) // MAXIMUM_SEGMENT_LENGTH + 1))
                    length = (view[pos] << 8 | view[pos + 1]) ^ masks.popleft()
                    pos += LENGTH_LENGTH
                    if not MIN_FRAME_LENGTH <= length <= MAX_FRAME_LENGTH:
                        self._length_invalid = True
                        length = MIN_FRAME_LENGTH + self._randbelow(MAX_FRAME_LENGTH - MIN_FRAME_LENGTH + 1)
                if end - pos < length:
                    break
                if self._length_invalid:
                    raise ProtocolError("frame length out of range (failed after the pretend length)")
                if counter > MAX_NONCE_COUNTER:
                    raise ProtocolError("frame nonce counter would wrap")
                try:
                    packets.append(open_box(counter, view[pos:pos + length]))
                except ValueError:
                    raise ProtocolError("frame %d: bad Poly1305 tag" % counter) from None
                pos += length
                counter += 1
                length = None
        except ProtocolError as exc:
            exc.packets = packets
            raise
        finally:
            self.counter, self._next_length = counter, length
        self._buffer = bytes(view[pos:])      # at most one partial frame stays behind
        return packets


def pad_burst(burst_length, target):
    """padBurst (§2.10): the padding frames that bring a burst of ``burst_length`` frame
    bytes to ``target`` modulo 1448, as a list of zero-padding byte counts, one per
    empty type-0 packet (each frame is that count + 21 bytes on the wire).

        tail = burst_length mod 1448
        pad  = target - tail if target >= tail else (1448 - tail) + target
        pad > 21       -> [pad - 21]           one frame of exactly pad bytes
        1 <= pad <= 21 -> [1427, pad]          1448 + (pad + 21) bytes: the quirk, copied
        pad == 0       -> []
    """
    tail = burst_length % MAXIMUM_SEGMENT_LENGTH
    if target >= tail:
        pad = target - tail
    else:
        pad = (MAXIMUM_SEGMENT_LENGTH - tail) + target
    if pad > HEADER_LENGTH:
        return [pad - HEADER_LENGTH]
    if pad > 0:
        return [MAX_PACKET_PAYLOAD_LENGTH, pad]
    return []


def quirk_loops_forever(v):
    """True if a table whose only length is v repeats padBurst's two-frame quirk forever
    in iat-mode 2: after one, the pieces of v leave 1469 mod v bytes, which are again
    1..21 bytes short of v (110 of the lengths 1..1448)."""
    left = (MAXIMUM_SEGMENT_LENGTH + HEADER_LENGTH) % v
    return left != 0 and v - left <= HEADER_LENGTH


def paced_quirk_limit(dist):
    """The two-frame quirks one iat-mode 2 write may take with this lenDist: none if its
    only non-zero length loops forever (0 is drawn again, so {0, v} is v alone), else
    PACED_QUIRK_LIMIT (see Obfs4.send_paced)."""
    lengths = {value for value in dist.values if value}
    if len(lengths) == 1 and quirk_loops_forever(next(iter(lengths))):
        return 0
    return PACED_QUIRK_LIMIT


# --- Configuration (once per listener or per client connection) ----------------------

class _Config:
    """What every connection of a config shares, and the injectable randomness:

    ``clock()``              unix time in seconds (for E and the replay filter)
    ``randbytes(n)``         CSPRNG bytes (handshake padding, the ephemeral keys)
    ``pad_length(lo, hi)``   the handshake padding length, uniform in lo..hi
    ``sample(dist)``         one draw from a lenDist/iatDist table
    ``randbelow(n)``         the decoder's pretend length after a bad length field
    ``keypairs()``           (priv, u, representative), or None for generate_keypair;
                             a connection's ``prepared`` item comes first

    and ``notes``, lines for the core to say once at NOTICE (a tuple of str).
    """

    def __init__(self, iat_mode):
        self.iat_mode = iat_mode
        self.notes = ()                    # lines the core says once at NOTICE
        self.clock = time.time
        self.randbytes = os.urandom
        self.pad_length = uniform_length
        self.sample = sample_table
        self.randbelow = secrets.randbelow
        self.keypairs = None


class ClientConfig(_Config):
    """A client connection's view of the bridge: NODEID, B and our iat-mode."""

    def __init__(self, node_id, public_key, iat_mode):
        _Config.__init__(self, iat_mode)
        self.node_id, self.public_key = bytes(node_id), bytes(public_key)


class ServerConfig(_Config):
    """A listener's identity, its tables (shared, read-only), close delay and replay filter."""

    def __init__(self, identity):
        _Config.__init__(self, identity.iat_mode)
        self.identity = identity
        self.node_id, self.public_key = identity.node_id, identity.public_key
        self.len_dist = table(identity.drbg_seed, 0, MAXIMUM_SEGMENT_LENGTH)
        self.iat_dist = None
        if identity.iat_mode != IAT_NONE:
            self.iat_dist = table(iat_seed(identity.drbg_seed), 0, MAX_IAT_DELAY)
        self.close_delay = close_delay(identity.drbg_seed)
        self.replay_filter = ReplayFilter()


# --- The transport ---------------------------------------------------------------------

class Obfs4:
    """One side of one obfs4 connection, with no I/O (the contract in transports.py).

    Client (``initiator=True``): ``start()`` is the whole client handshake; ``receive()``
    returns b"" until the reply verifies, then the payload of the frames behind it.
    Server: ``start()`` is b""; ``receive()`` checks the client handshake and leaves the
    reply + seed frame in ``data_to_send()``; then ``is_open``. Both: ``send(plaintext)``
    returns frames and padding; in iat-mode 1/2 (``paced``) ``send_paced(plaintext)``
    returns (bytes, seconds to wait after them) pieces. Any peer error: ``ProtocolError``.

    The ephemeral keypair (x, X, X') is the key work the core serialises, so it is made
    inside ``start()`` (client) and inside the ``receive()`` that verified MAC_C (server:
    a prober, which never gets that far, costs no key generation at all), never in the
    constructor, which runs unserialised for every accepted connection. It is, in order:
    ``prepared`` (one item of ``prepare()``'s pool), else ``config.keypairs()`` (tests),
    else ``generate_keypair(config.randbytes)``.
    """

    name = "obfs4"
    ProtocolError = ProtocolError
    expensive = True            # key generation and ntor: the core serialises the handshake
    paced = False               # per connection: True in iat-mode 1 and 2 (use send_paced)
    failure_linger = None       # per connection: the server's 30 s + close_delay
    handshake_timeout = None    # per connection: the server's 30 s, whatever --handshake-timeout
                                # says (probe timing must match obfs4proxy's); a client's is the core's
    secret_options = ("private-key", "drbg-seed")   # a server's; cert= is public (every bridge line)
    uses_state_dir = True       # the server's identity lives in obfs4_state.json

    # What to check when a handshake failed, by side and kind (failure_hint).
    HINTS = {
        (True, "protocol"): "(is it an obfs4 server? the right cert?)",
        (True, "timeout"): "(no answer: a wrong cert=, or not an obfs4 bridge at that address; "
                           "an obfs4 bridge stays silent for a client without its cert)",
        (True, "closed"): "(closed without an answer: a wrong cert=, or not an obfs4 bridge at that "
                          "address; an obfs4 bridge closes on a client without its cert after 30 to 89 s)",
        (False, "protocol"): "(a prober, or a client with a wrong cert)",
        (False, "timeout"): "(a prober, or a client with a wrong cert)",
        (False, "closed"): "(a prober, or a client with a wrong cert)",
    }

    @classmethod
    def crypto_routes(cls):
        """{piece: route} as obfs4_crypto chose them at import (PyNaCl, pycryptodome
        or pure Python), and the pieces that run in pure Python where a C route exists."""
        return obfs4_crypto.reported_routes(), obfs4_crypto.pure_python_routes()

    @classmethod
    def client_config(cls, options):
        return ClientConfig(*parse_client_args(options))

    @classmethod
    def server_config(cls, options, state_dir, randbytes=os.urandom):
        """(ServerConfig, SMETHOD ARGS {"cert": ..., "iat-mode": "N"}), once per listener.
        The bridge's identity comes from its state directory, which obfs4_state reads and
        writes (the protocol itself touches no file); ``randbytes`` makes a fresh identity
        when the directory has none."""
        refuse_unknown(options, SERVER_OPTIONS, "server")
        if state_dir is None:
            raise ValueError("obfs4 needs a state directory (--state-dir)")
        identity, notes = obfs4_state.load_or_create_state(state_dir, options, randbytes)
        config = ServerConfig(identity)
        config.notes = notes
        return config, {"cert": identity.cert, "iat-mode": str(identity.iat_mode)}

    @classmethod
    def prepare(cls, initiator, config):
        """Both sides start from an ephemeral X25519 keypair with an Elligator2
        representative, which depends on nothing: one pool for every config and role."""
        return "obfs4 keypairs", generate_keypair

    def __init__(self, initiator, config, prepared=None):
        self.initiator = initiator
        self.config = config
        self.iat_mode = config.iat_mode
        self.paced = self.iat_mode != IAT_NONE
        self._prepared = prepared                   # a (x, X, X') made ahead, or None
        self._priv = self._u = self._representative = None
        self._mac_key = config.public_key + config.node_id          # KEY = B | NODEID
        self._buffer = bytearray()
        self._peer_mark = None
        self._to_send = b""
        self._encoder = self._decoder = None
        if initiator:
            self.state = NEW
            self.failure_linger = self.handshake_timeout = None
            self._search_from = REPRESENTATIVE_LENGTH + AUTH_LENGTH + SERVER_MIN_PAD_LENGTH
            # Our own random tables until the server's seed packet arrives (built lazily:
            # with obfs4proxy or us as the server, the seed comes with the reply).
            self._len_seed = None
            self._len_dist = self._iat_dist = None
        else:
            self.state = WAIT_HANDSHAKE
            self.handshake_timeout = SERVER_HANDSHAKE_TIMEOUT
            self.failure_linger = SERVER_HANDSHAKE_TIMEOUT + config.close_delay
            self._len_dist, self._iat_dist = config.len_dist, config.iat_dist

    @property
    def is_open(self):
        return self.state == OPEN

    def failure_hint(self, kind):
        """What to check after a failed handshake, in a user's words: a parenthesised
        clause for the core to put after its own ("timed out", the error). ``kind`` is
        "protocol", "timeout" or "closed". A wrong cert= shows on the client as a
        timeout: the bridge answers nothing to a client that does not know its cert."""
        return self.HINTS.get((self.initiator, kind), "")

    def _make_keypair(self):
        """x, X and X' (client) or y, Y and Y' (server): the pooled item, else the
        config's supplier, else fresh from config.randbytes. Called once, by start()
        or by the receive() that accepts the client's handshake."""
        if self._prepared is not None:
            keypair, self._prepared = self._prepared, None
        elif self.config.keypairs:
            keypair = self.config.keypairs()
        else:
            keypair = generate_keypair(self.config.randbytes)
        self._priv, self._u, self._representative = keypair

    def start(self):
        """Client: X' | P_C | M_C | MAC_C (§2.3), remembering the E string it used."""
        if not self.initiator:
            return b""
        if self.state != NEW:
            raise RuntimeError("obfs4: start() called twice")
        config = self.config
        self._make_keypair()                                             # x, X, X'
        pad_length = config.pad_length(CLIENT_MIN_PAD_LENGTH, CLIENT_MAX_PAD_LENGTH)
        mark = h16(self._mac_key, self._representative)                  # M_C = H16(KEY, X')
        head = self._representative + config.randbytes(pad_length) + mark
        self._epoch_hour = epoch_hour(config.clock())
        self.state = WAIT_REPLY
        return head + h16(self._mac_key, head + self._epoch_hour)        # MAC_C

    def data_to_send(self):
        out, self._to_send = self._to_send, b""
        return out

    def receive(self, data):
        if self.state == OPEN:
            return self._receive_frames(data)
        if self.state == FAILED:
            raise ProtocolError("obfs4: the connection has already failed")
        if self.state == NEW:
            raise RuntimeError("obfs4: receive() before start()")
        try:
            if self.initiator:
                return self._receive_reply(data)
            return self._receive_client_handshake(data)
        except ProtocolError:
            self._fail()
            raise

    def _fail(self):
        self.state = FAILED
        self._buffer = self._encoder = self._decoder = None

    # The server's side of the handshake (§2.4).
    def _receive_client_handshake(self, data):
        buffer = self._buffer
        buffer += data
        # 1. Fewer than 64 bytes: wait.
        if len(buffer) < CLIENT_MIN_HANDSHAKE_LENGTH:
            return b""
        # 2. M_C = H16(KEY, X'), computed once.
        if self._peer_mark is None:
            self._peer_mark = h16(self._mac_key, bytes(buffer[:REPRESENTATIVE_LENGTH]))
        # 3. Tail check only: M_C must sit 32 bytes before min(len, 8192).
        end = min(len(buffer), MAX_HANDSHAKE_LENGTH)
        pos = end - MARK_LENGTH - MAC_LENGTH
        if pos < REPRESENTATIVE_LENGTH + CLIENT_MIN_PAD_LENGTH or \
                not hmac.compare_digest(buffer[pos:pos + MARK_LENGTH], self._peer_mark):
            if len(buffer) >= MAX_HANDSHAKE_LENGTH:
                raise ProtocolError("no client handshake in the first %d bytes" % MAX_HANDSHAKE_LENGTH)
            return b""
        # 4. MAC_C = H16(KEY, X' | P_C | M_C | E') for E' in (E, E - 1, E + 1), all three
        #    computed; on a match, a MAC_C already in the replay filter is a replay.
        now = self.config.clock()
        hour = int(now) // 3600
        head_mac = hmac.new(self._mac_key, bytes(buffer[:pos + MARK_LENGTH]), hashlib.sha256)
        mac_c = bytes(buffer[pos + MARK_LENGTH:pos + MARK_LENGTH + MAC_LENGTH])
        matched = None
        for candidate in (hour, hour - 1, hour + 1):
            e = str(candidate).encode("ascii")
            mac = head_mac.copy()
            mac.update(e)
            if hmac.compare_digest(mac.digest()[:MAC_LENGTH], mac_c):
                if self.config.replay_filter.test_and_set(now, mac_c):
                    raise ProtocolError("replayed client handshake")
                matched = e
        # 5. No match: failed.
        if matched is None:
            raise ProtocolError("bad MAC_C (wrong bridge identity, or clock off by over an hour)")
        # 6. Nothing may follow MAC_C.
        if len(buffer) != pos + MARK_LENGTH + MAC_LENGTH:
            raise ProtocolError("bytes after MAC_C")
        # 7. X = ell2_direct(X'); our y, Y, Y' (only now: a prober costs no key work);
        #    ntor, server side.
        x_u = elligator2_direct(bytes(buffer[:REPRESENTATIVE_LENGTH]))
        self._make_keypair()
        identity = self.config.identity
        key_seed, auth = server_ntor(self._priv, self._u, x_u, identity.private_key,
                                     identity.public_key, identity.node_id)
        self._priv = None                                                # y is needed no more
        okm = kdf(key_seed)
        self._encoder = FrameEncoder(okm[DIRECTION_KEY_LENGTH:])         # server -> client
        self._decoder = FrameDecoder(okm[:DIRECTION_KEY_LENGTH], self.config.randbelow)
        # 8. Reply Y' | AUTH | P_S | M_S | MAC_S and the seed frame, in one piece.
        pad_length = self.config.pad_length(SERVER_MIN_PAD_LENGTH, SERVER_MAX_PAD_LENGTH)
        head = (self._representative + auth + self.config.randbytes(pad_length)
                + h16(self._mac_key, self._representative))              # M_S = H16(KEY, Y')
        seed_frame = self._encoder.encode(make_packet(PACKET_TYPE_PRNG_SEED, identity.drbg_seed))
        self._to_send = head + h16(self._mac_key, head + matched) + seed_frame
        self._buffer = None
        self.state = OPEN
        return b""

    # The client's side of the handshake (§2.7).
    def _receive_reply(self, data):
        buffer = self._buffer
        buffer += data
        # 1. Wait for 96 bytes; M_S = H16(KEY, Y'), computed once.
        if len(buffer) < SERVER_MIN_HANDSHAKE_LENGTH:
            return b""
        if self._peer_mark is None:
            self._peer_mark = h16(self._mac_key, bytes(buffer[:REPRESENTATIVE_LENGTH]))
        # 2. The first M_S in buffer[64:min(len, 8192)], with room for MAC_S after it.
        #    Bytes already searched are not searched again.
        end = min(len(buffer), MAX_HANDSHAKE_LENGTH)
        pos = buffer.find(self._peer_mark, self._search_from, end)
        if pos == -1 or pos + MARK_LENGTH + MAC_LENGTH > end:
            self._search_from = pos if pos != -1 else max(self._search_from, end - MARK_LENGTH + 1)
            if len(buffer) >= MAX_HANDSHAKE_LENGTH:
                raise ProtocolError("no server mark in the first %d bytes" % MAX_HANDSHAKE_LENGTH)
            return b""
        # 3. MAC_S = H16(KEY, Y' | AUTH | P_S | M_S | E), E the string we sent.
        mac_s = h16(self._mac_key, bytes(buffer[:pos + MARK_LENGTH]) + self._epoch_hour)
        if not hmac.compare_digest(mac_s, buffer[pos + MARK_LENGTH:pos + MARK_LENGTH + MAC_LENGTH]):
            raise ProtocolError("bad MAC_S")
        # 4. Y = ell2_direct(Y'); ntor, client side; AUTH must match.
        y_u = elligator2_direct(bytes(buffer[:REPRESENTATIVE_LENGTH]))
        key_seed, auth = client_ntor(self._priv, self._u, y_u, self.config.public_key,
                                     self.config.node_id)
        self._priv = None                                                # x is needed no more
        if not hmac.compare_digest(auth, buffer[REPRESENTATIVE_LENGTH:REPRESENTATIVE_LENGTH + AUTH_LENGTH]):
            raise ProtocolError("bad AUTH: this is not the bridge of the cert")
        # 5. Keys; everything after MAC_S is the server's frame stream.
        okm = kdf(key_seed)
        self._encoder = FrameEncoder(okm[:DIRECTION_KEY_LENGTH])         # client -> server
        self._decoder = FrameDecoder(okm[DIRECTION_KEY_LENGTH:], self.config.randbelow)
        rest = bytes(buffer[pos + MARK_LENGTH + MAC_LENGTH:])
        self._buffer = None
        self.state = OPEN
        return self._receive_frames(rest)

    # The data phase.
    def _receive_frames(self, data):
        """The payload of every frame that ``data`` completes, frame by frame in order:
        open, parse, next (§2.8, §2.9).

        The first bad frame or packet ends it: ProtocolError, whose ``.data`` is the
        payload of the good frames before it in this call. The caller delivers ``.data``,
        then ends the tunnel (obfs4proxy also relays what it decoded before tearing down).
        However the bytes are split into calls, the same payload comes out, then the same
        error."""
        out = []
        try:
            try:
                packets, failure = self._decoder.open_frames(data), None
            except ProtocolError as exc:    # the frames before the bad one still count
                packets, failure = exc.packets, exc
            for packet in packets:
                packet_type, payload = parse_packet(packet)
                if packet_type == PACKET_TYPE_PAYLOAD:
                    out.append(payload)
                elif packet_type == PACKET_TYPE_PRNG_SEED:
                    # Only the client acts on it, and only on a 24-byte seed (§2.9).
                    if self.initiator and len(payload) == SEED_PACKET_PAYLOAD_LENGTH:
                        self._reseed(bytes(payload))
                # Other types are authenticated, then ignored.
            if failure is not None:
                raise failure
            return b"".join(out)
        except ProtocolError as exc:
            exc.data = b"".join(out)
            self._fail()
            raise

    def _reseed(self, seed):
        """The client's tables from a seed: lenDist = table(seed, 0, 1448); with iat-mode
        != 0 also iatDist = table(SHA-256(seed)[0:24], 0, 100). Built on first use."""
        self._len_seed = seed
        self._len_dist = self._iat_dist = None

    def _length_dist(self):
        if self._len_dist is None:
            if self._len_seed is None:          # no seed packet yet: our own random table
                self._len_seed = self.config.randbytes(SEED_LENGTH)
            self._len_dist = table(self._len_seed, 0, MAXIMUM_SEGMENT_LENGTH)
        return self._len_dist

    def _iat_delay(self):
        """Seconds to wait after a piece: iatDist.sample() x 100 µs."""
        if self._iat_dist is None:
            self._length_dist()                 # makes sure a seed exists
            self._iat_dist = table(iat_seed(self._len_seed), 0, MAX_IAT_DELAY)
        return self.config.sample(self._iat_dist) * IAT_UNIT

    def _data_packets(self, plaintext):
        """Step 1 of §2.10: chunks of at most 1427 bytes, each one unpadded type-0 packet."""
        if self._encoder is None:
            raise RuntimeError("obfs4: send() before the handshake completed")
        view, header = memoryview(plaintext), PACKET_HEADER.pack
        return [header(PACKET_TYPE_PAYLOAD, len(chunk)) + chunk
                for chunk in (view[i:i + MAX_PACKET_PAYLOAD_LENGTH]
                              for i in range(0, len(view), MAX_PACKET_PAYLOAD_LENGTH))]

    def _padding_packets(self, burst_length, target):
        return self._padding_packets_of(pad_burst(burst_length, target))

    @staticmethod
    def _padding_packets_of(paddings):
        """Empty type-0 packets with these numbers of zero bytes (frames of n + 21 bytes)."""
        return [make_packet(PACKET_TYPE_PAYLOAD, b"", padding) for padding in paddings]

    def send(self, plaintext):
        """One burst (§2.10): data frames, then padBurst to a lenDist target; sealed in one
        pass. The burst's length before padding is len(plaintext) + 21 per data frame."""
        if self.paced:
            return b"".join(piece for piece, _ in self.send_paced(plaintext))
        packets = self._data_packets(plaintext)
        if not packets:
            return b""
        burst_length = len(plaintext) + HEADER_LENGTH * len(packets)
        packets += self._padding_packets(burst_length, self.config.sample(self._length_dist()))
        return self._encoder.encode_packets(packets)

    def send_paced(self, plaintext):
        """iat-mode 1 and 2 (§6.4): [(bytes, seconds to wait after them), ...].

        1: the padded burst cut into pieces of at most 1448 bytes (not on frame bounds).
        2: no burst padding; each piece is exactly a lenDist sample t: when fewer than t
           bytes are left, padBurst them to t; if that took two frames, sample again.
           A sample of 0 is drawn again (obfs4proxy panics there, erratum 14).

        Why mode 2's work is bounded. With r bytes left and 1 <= t - r <= 21, padBurst's
        two-frame quirk adds 1448 + (t - r) + 21 bytes and sampling starts again. In a
        table whose only length v has 1469 mod v in v - 21 .. v - 1 (110 of the 1448
        lengths, e.g. 2..21 but 13, 211, 735..745: about one bridge in 1,400) every
        v-piece leaves 1469 mod v bytes and the quirk comes back forever; obfs4proxy,
        which writes each piece as it goes, then streams padding forever and the
        connection never carries another byte of data. We take at most
        PACED_QUIRK_LIMIT (32) quirks in one write, none in such a one-length table; at
        the next one the bytes left and one padding frame (two past 1448 bytes) make the
        fewest whole pieces of the sample t in hand (``_paced_ending``). Every piece is
        still a table length and the peer decodes the same data; a write is at most its
        frames + 32 x 1490 + 1468 bytes. Until the limit, the draws and the bytes are
        obfs4proxy's; how rarely a table that ends reaches it is in docs/PROTOCOL.md 14.4.
        """
        packets = self._data_packets(plaintext)
        if not packets:
            return []
        burst_length = len(plaintext) + HEADER_LENGTH * len(packets)
        if self.iat_mode == IAT_ENABLED:
            packets += self._padding_packets(burst_length, self.config.sample(self._length_dist()))
            burst = self._encoder.encode_packets(packets)
            return [(burst[i:i + MAXIMUM_SEGMENT_LENGTH], self._iat_delay())
                    for i in range(0, len(burst), MAXIMUM_SEGMENT_LENGTH)]
        buffer, pos, pieces, quirks = bytearray(self._encoder.encode_packets(packets)), 0, [], 0
        limit = paced_quirk_limit(self._length_dist())
        while pos < len(buffer):
            target = self._nonzero_length()
            left = len(buffer) - pos
            if left < target:
                padding = pad_burst(left, target)
                if len(padding) == 2:                   # the quirk: 1448 + pad + 21 bytes
                    if quirks == limit:
                        return pieces + self._paced_ending(buffer, pos, target)
                    quirks += 1
                buffer += self._encoder.encode_packets(self._padding_packets_of(padding))
                if len(padding) == 2:                   # now more than t bytes: sample again
                    continue
            pieces.append((bytes(buffer[pos:pos + target]), self._iat_delay()))
            pos += target
        return pieces

    def _paced_ending(self, buffer, pos, target):
        """The rest of an iat-mode 2 write once PACED_QUIRK_LIMIT quirks are spent: the
        ``left`` bytes and padding frames (21..target + 20 bytes: one frame, or two when
        over 1448) make the fewest whole pieces of ``target``, the sample in hand."""
        left = len(buffer) - pos
        copies = -(-(left + HEADER_LENGTH) // target)   # room for at least one frame
        fill = copies * target - left                    # HEADER_LENGTH .. target + 20
        frames = [fill] if fill <= MAXIMUM_SEGMENT_LENGTH else [fill - HEADER_LENGTH, HEADER_LENGTH]
        buffer += self._encoder.encode_packets(self._padding_packets_of([n - HEADER_LENGTH for n in frames]))
        return [(bytes(buffer[i:i + target]), self._iat_delay()) for i in range(pos, len(buffer), target)]

    def _nonzero_length(self):
        """A lenDist sample other than 0, drawn again while it is 0 (obfs4proxy panics
        there: any answer is ours), at most ZERO_DRAW_LIMIT times; then the table's
        largest value, so that a table weighted almost all on 0 costs bounded work."""
        dist = self._length_dist()
        if not any(dist.values):                # a table of only 0: no sample would do
            return MAXIMUM_SEGMENT_LENGTH
        for _ in range(ZERO_DRAW_LIMIT):
            target = self.config.sample(dist)
            if target:
                return target
        return max(dist.values)                 # lenDist has lo = 0: values are lengths
