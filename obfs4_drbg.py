r"""obfs4_drbg.py: obfs4's non-secret randomness: the SipHash-2-4 hash DRBG, the few
Go ``math/rand`` methods obfs4proxy drives with it, and the weighted length and delay
tables (obfs4-spec 6).

The hash DRBG masks every frame's length field and seeds the server's padding and
iat tables. It is *not* a secret-keeping generator. It only has to look random: the
length masks are seeded from session keys, but the padding table seed of a server is
sent to every client on purpose (clients copy the bridge's length fingerprint). The
randomness of ``WeightedDist.sample`` is injectable, so known answers replay byte for
byte. Nothing here does I/O, keeps a clock, or logs.

The hash DRBG (obfs4-spec 6.1)
------------------------------
::

    seed24 = K (16: SipHash key) | o_0 (8)
    block n = o_n = SipHash-2-4(K, o_0 | o_1 | ... | o_(n-1))   -- ONE hasher, never reset
    mask16  = o[0] * 256 + o[1]          Int63 = BE64(o) & (2^63 - 1)

Where the obfs4 document and the 0.0.14 code differ (the code is what is on the wire)
-------------------------------------------------------------------------------------
1. The DRBG: the document says each block is SipHash of the previous block. The code
   feeds each block into one SipHash state that is never reset, so block n hashes all
   earlier blocks. Both readings agree on the first block only.
2. The length tables: weights are Go ``Float64()`` values and the alias tables are
   built by Vose's method with FIFO work lists; only exact float replay reproduces a
   bridge's table (the vectors compare floats with ``==``).

Its routes: libcrypto's streaming SipHash, else pure Python
------------------------------------------------------------
obfs4proxy's DRBG is *one* SipHash state that absorbs every block it outputs and is
never reset (1. above), so block n is SipHash over all n earlier blocks. A one-shot
SipHash (libsodium's ``crypto_shorthash_siphash24``) could only re-hash the whole
history for every frame: quadratic (measured: 4 µs a block after 1,000 frames, 0.3 ms
after 100,000), so PyNaCl does not serve here. OpenSSL 3's ``EVP_MAC("SIPHASH")`` can:
its context can be duplicated, so each block is "absorb, duplicate, finish the copy"
(libcrypto.SipHashStream), four C calls through ``ctypes``: ~3 µs a block in a batch
against ~6-8 µs for the Python rounds below (measured in the same run on the shared
2-core machine). It runs only after it gives the ``hash_drbg_blocks`` answers at import
(cryptoroutes/chooser.py); ``DRBG_ROUTE`` names the route. Incremental SipHash in Python costs ~6-7 µs
a block (8 SipRounds of 64-bit integers; ``HashDrbg.masks`` runs the rounds for a whole
write or read in one loop).
"""

import random
import secrets
import struct

from cryptoroutes import chooser

chooser.check_setting()     # a bad OBFSPROXY_CRYPTO stops here, in one line

# --------------------------------------------------------------------------------------
# SipHash-2-4 (obfs4-spec 7.4), built from three steps so the DRBG can run it incrementally
# --------------------------------------------------------------------------------------

M64 = 0xFFFFFFFFFFFFFFFF
_ROTATE = (1 << 64) | 1        # x * _ROTATE >> (64 - k) & M64 == x <<< k, for x < 2^64


def _sip_rounds(v0, v1, v2, v3, n):
    """n SipRounds:  v0 += v1; v1 <<<= 13; v1 ^= v0; v0 <<<= 32;
                     v2 += v3; v3 <<<= 16; v3 ^= v2;
                     v0 += v3; v3 <<<= 21; v3 ^= v0;
                     v2 += v1; v1 <<<= 17; v1 ^= v2; v2 <<<= 32      (all mod 2^64)"""
    for _ in range(n):
        v0 = (v0 + v1) & M64
        v1 = ((v1 << 13) & M64 | v1 >> 51) ^ v0
        v0 = (v0 << 32) & M64 | v0 >> 32
        v2 = (v2 + v3) & M64
        v3 = ((v3 << 16) & M64 | v3 >> 48) ^ v2
        v0 = (v0 + v3) & M64
        v3 = ((v3 << 21) & M64 | v3 >> 43) ^ v0
        v2 = (v2 + v1) & M64
        v1 = ((v1 << 17) & M64 | v1 >> 47) ^ v2
        v2 = (v2 << 32) & M64 | v2 >> 32
    return v0, v1, v2, v3


def _sip_init(key16):
    """k0, k1 = the key as two little-endian u64;
    v = (k0 ^ "somepseu", k1 ^ "dorandom", k0 ^ "lygenera", k1 ^ "tedbytes")."""
    k0, k1 = struct.unpack("<QQ", key16)
    return (k0 ^ 0x736F6D6570736575, k1 ^ 0x646F72616E646F6D,
            k0 ^ 0x6C7967656E657261, k1 ^ 0x7465646279746573)


def _sip_absorb(v, m):
    """Compression of one 8-byte word m (little-endian u64): v3 ^= m; 2 rounds; v0 ^= m."""
    v0, v1, v2, v3 = _sip_rounds(v[0], v[1], v[2], v[3] ^ m, 2)
    return v0 ^ m, v1, v2, v3


def _sip_finish(v, b):
    """Last word b (tail bytes, length mod 256 in the top byte), v2 ^= 0xff, 4 rounds;
    the result is v0 ^ v1 ^ v2 ^ v3. Works on a copy: ``v`` stays usable."""
    v0, v1, v2, v3 = _sip_absorb(v, b)
    v0, v1, v2, v3 = _sip_rounds(v0, v1, v2 ^ 0xFF, v3, 4)
    return v0 ^ v1 ^ v2 ^ v3


def siphash24(key16, data):
    """SipHash-2-4 of ``data`` under ``key16``, as 8 bytes (the u64 result little-endian)."""
    v = _sip_init(key16)
    full = len(data) - len(data) % 8
    for i in range(0, full, 8):
        v = _sip_absorb(v, int.from_bytes(data[i:i + 8], "little"))
    b = (len(data) & 0xFF) << 56 | int.from_bytes(data[full:], "little")
    return _sip_finish(v, b).to_bytes(8, "little")


# --------------------------------------------------------------------------------------
# The hash DRBG, Go math/rand and the weighted tables (obfs4-spec 6)
# --------------------------------------------------------------------------------------

DRBG_SEED_LENGTH = 24
INT63_MASK = (1 << 63) - 1


class _PureHashDrbg:
    """obfs4's SipHash-2-4 "OFB" generator, exactly as obfs4proxy runs it (erratum 1).

    One SipHash state keyed with seed[0:16] absorbs every block it outputs and is never
    reset: block n = SipHash(K, o_0 | ... | o_(n-1)). We keep v0..v3 after each absorbed
    block (every input is a whole 8-byte word, so no tail is pending) and finish a copy
    for each digest: O(1) per block.

    ``blocks(count)`` and ``masks(count)`` draw many blocks in one call: each block is
    8 SipRounds that no trick shortens (each needs the last), so the savings are
    Python's: one loop with everything in local variables (~5.5-7 µs a block, against
    ~7-9 through the three helper functions). Blocks are kept as little-endian integers.
    Without OpenSSL 3 (see "Its routes" above) this is the largest cost of a frame
    once libsodium seals it."""

    def __init__(self, seed24):
        if len(seed24) != DRBG_SEED_LENGTH:
            raise ValueError("a hash-DRBG seed is 24 bytes, not %d" % len(seed24))
        self._v = _sip_init(seed24[:16])
        self._fed = 0                                           # bytes absorbed so far
        self._block = int.from_bytes(seed24[16:24], "little")   # o_0

    def next_block(self):
        """Feed the current block into the hasher; the digest is the next block."""
        return self.blocks(1)[0].to_bytes(8, "little")

    def mask16(self):
        """The next length mask: o[0] * 256 + o[1] of a fresh block."""
        return self.masks(1)[0]

    def masks(self, count):
        """The next ``count`` length masks, o[0] * 256 + o[1] of each block (o's bytes
        are the little-endian block: o[0] is its low byte)."""
        return [(block & 0xFF) << 8 | (block >> 8) & 0xFF for block in self.blocks(count)]

    def int63(self):
        """Go's Source.Int63 over this DRBG: BE64(next block) & (2^63 - 1)."""
        return int.from_bytes(self.next_block(), "big") & INT63_MASK

    def blocks(self, count):
        """The next ``count`` blocks as little-endian integers: for each, absorb the
        last block m (v3 ^= m; 2 SipRounds; v0 ^= m), then finish a copy with the length
        word b = (bytes absorbed mod 256) << 56 (v3 ^= b; 2 rounds; v0 ^= b; v2 ^= 0xff;
        4 rounds; v0 ^ v1 ^ v2 ^ v3).

        This is the hottest loop of a bulk transfer, so the eight rounds of _sip_rounds
        are written out (no loop counters: ~5% of a block) and cheapened (~5% more):

        * x <<< k as ``x * R >> (64 - k) & M``, R = 2^64 + 1: for x < 2^64, x * R is x
          written twice side by side, and any 64-bit window of it is a rotation of x
          (3 operations instead of 4). Python's precedence is * >> & ^, so
          ``v1 * R >> 51 & M ^ v0`` is (v1 <<< 13) ^ v0;
        * the last half-round adds v0 into v3 and then takes v0 ^ v1 ^ v2 ^ v3, so v0
          cancels: v0 ^ v1 ^ v2 ^ v3 = (v1 <<< 17) ^ v2 ^ (v2 <<< 32) ^ (v3 <<< 21),
          with v2 already += v1.
        """
        M, R = M64, _ROTATE
        v0, v1, v2, v3 = self._v
        m, fed, out = self._block, self._fed, []
        for _ in range(count):
            v3 ^= m
            # absorb m: round 1 of 2
            v0 = v0 + v1 & M
            v1 = v1 * R >> 51 & M ^ v0
            v0 = v0 * R >> 32 & M
            v2 = v2 + v3 & M
            v3 = v3 * R >> 48 & M ^ v2
            v0 = v0 + v3 & M
            v3 = v3 * R >> 43 & M ^ v0
            v2 = v2 + v1 & M
            v1 = v1 * R >> 47 & M ^ v2
            v2 = v2 * R >> 32 & M
            # absorb m: round 2 of 2
            v0 = v0 + v1 & M
            v1 = v1 * R >> 51 & M ^ v0
            v0 = v0 * R >> 32 & M
            v2 = v2 + v3 & M
            v3 = v3 * R >> 48 & M ^ v2
            v0 = v0 + v3 & M
            v3 = v3 * R >> 43 & M ^ v0
            v2 = v2 + v1 & M
            v1 = v1 * R >> 47 & M ^ v2
            v2 = v2 * R >> 32 & M
            v0 ^= m
            fed += 8
            b = (fed & 0xFF) << 56
            a0, a1, a2, a3 = v0, v1, v2, v3 ^ b
            # finish a copy: absorb b, round 1 of 2
            a0 = a0 + a1 & M
            a1 = a1 * R >> 51 & M ^ a0
            a0 = a0 * R >> 32 & M
            a2 = a2 + a3 & M
            a3 = a3 * R >> 48 & M ^ a2
            a0 = a0 + a3 & M
            a3 = a3 * R >> 43 & M ^ a0
            a2 = a2 + a1 & M
            a1 = a1 * R >> 47 & M ^ a2
            a2 = a2 * R >> 32 & M
            # absorb b, round 2 of 2
            a0 = a0 + a1 & M
            a1 = a1 * R >> 51 & M ^ a0
            a0 = a0 * R >> 32 & M
            a2 = a2 + a3 & M
            a3 = a3 * R >> 48 & M ^ a2
            a0 = a0 + a3 & M
            a3 = a3 * R >> 43 & M ^ a0
            a2 = a2 + a1 & M
            a1 = a1 * R >> 47 & M ^ a2
            a2 = a2 * R >> 32 & M
            a0 ^= b
            a2 ^= 0xFF
            # finalisation round 1 of 4
            a0 = a0 + a1 & M
            a1 = a1 * R >> 51 & M ^ a0
            a0 = a0 * R >> 32 & M
            a2 = a2 + a3 & M
            a3 = a3 * R >> 48 & M ^ a2
            a0 = a0 + a3 & M
            a3 = a3 * R >> 43 & M ^ a0
            a2 = a2 + a1 & M
            a1 = a1 * R >> 47 & M ^ a2
            a2 = a2 * R >> 32 & M
            # finalisation round 2 of 4
            a0 = a0 + a1 & M
            a1 = a1 * R >> 51 & M ^ a0
            a0 = a0 * R >> 32 & M
            a2 = a2 + a3 & M
            a3 = a3 * R >> 48 & M ^ a2
            a0 = a0 + a3 & M
            a3 = a3 * R >> 43 & M ^ a0
            a2 = a2 + a1 & M
            a1 = a1 * R >> 47 & M ^ a2
            a2 = a2 * R >> 32 & M
            # finalisation round 3 of 4
            a0 = a0 + a1 & M
            a1 = a1 * R >> 51 & M ^ a0
            a0 = a0 * R >> 32 & M
            a2 = a2 + a3 & M
            a3 = a3 * R >> 48 & M ^ a2
            a0 = a0 + a3 & M
            a3 = a3 * R >> 43 & M ^ a0
            a2 = a2 + a1 & M
            a1 = a1 * R >> 47 & M ^ a2
            a2 = a2 * R >> 32 & M
            # finalisation round 4 of 4, as far as v0 ^ v1 ^ v2 ^ v3 needs it
            a0 = a0 + a1 & M
            a1 = a1 * R >> 51 & M ^ a0
            a0 = a0 * R >> 32 & M
            a2 = a2 + a3 & M
            a3 = a3 * R >> 48 & M ^ a2
            a2 = a2 + a1 & M
            m = (a1 * R >> 47 ^ a2 * R >> 32 ^ a3 * R >> 43) & M ^ a2
            out.append(m)
        self._v, self._block, self._fed = (v0, v1, v2, v3), m, fed
        return out


class _LibcryptoHashDrbg(_PureHashDrbg):
    """The same generator on libcrypto's streaming SipHash (OpenSSL 3's EVP_MAC, whose
    state is duplicated to finish each block): absorb the last block, finish a copy."""

    def __init__(self, seed24):
        if len(seed24) != DRBG_SEED_LENGTH:
            raise ValueError("a hash-DRBG seed is 24 bytes, not %d" % len(seed24))
        self._sip = chooser.LibSipHashStream(bytes(seed24[:16]))
        self._last = bytes(seed24[16:24])

    def _raw_blocks(self, count):
        blocks = self._sip.blocks(self._last, count) if count > 0 else []
        if blocks:
            self._last = blocks[-1]
        return blocks

    def blocks(self, count):
        return [int.from_bytes(block, "little") for block in self._raw_blocks(count)]

    def masks(self, count):
        return [block[0] << 8 | block[1] for block in self._raw_blocks(count)]

    def next_block(self):
        return self._raw_blocks(1)[0]


# obfs4-drbg-probdist.json, "hash_drbg_blocks": the first 8 blocks for seed 00 01 .. 17.
DRBG_SEED_ANSWER = bytes(range(24))
DRBG_BLOCK_ANSWERS = [bytes.fromhex(block) for block in (
    "28b572b88c1ab776", "a8de197d8e7de4b3", "4d3a58549e36707c", "9c0614afb5a7a147",
    "5df05f9589818d85", "aacc3481efb1a58c", "aff5068fe2d23f22", "35f4d94f858333a3")]


def drbg_proven(route):
    """True if the DRBG class ``route`` gives the 8 known blocks one at a time, the
    same as masks and ints in one batch (3 then 5), and refuses a short seed."""
    try:
        one = route(DRBG_SEED_ANSWER)
        if [one.next_block() for _ in DRBG_BLOCK_ANSWERS] != DRBG_BLOCK_ANSWERS:
            return False
        batch = route(DRBG_SEED_ANSWER)
        masks = batch.masks(3) + batch.masks(0)
        ints = batch.blocks(5)
        if masks != [block[0] << 8 | block[1] for block in DRBG_BLOCK_ANSWERS[:3]] or \
                ints != [int.from_bytes(block, "little") for block in DRBG_BLOCK_ANSWERS[3:]]:
            return False
        try:
            route(DRBG_SEED_ANSWER[:23])
        except ValueError:
            return True
        return False
    except Exception:  # a broken fast route must never stop the program: the next one runs
        return False


def _drbg_route():
    """The hash DRBG: libcrypto's streaming SipHash, else the Python rounds."""
    streaming = _LibcryptoHashDrbg if chooser.LibSipHashStream else None
    return chooser.choose([(streaming, "libcrypto EVP_MAC SipHash"),
                         (_PureHashDrbg, "pure Python")], drbg_proven)


HashDrbg, DRBG_ROUTE, chooser.PASSED_OVER["hash DRBG"] = _drbg_route()


class GoRand:
    """The value streams of Go 1.x ``rand.New(source)`` that obfs4proxy uses.

    ``source`` is anything with ``int63()`` (a ``HashDrbg``). The algorithms must match
    Go's bit for bit, rejections included, or the tables come out different."""

    def __init__(self, source):
        self.source = source

    def int63(self):
        return self.source.int63()

    def int31(self):
        """Int31() = Int63() >> 32"""
        return self.source.int63() >> 32

    def int31n(self, n):
        """n a power of two: Int31() & (n - 1); else reject v > (2^31 - 1) - 2^31 mod n,
        return v mod n."""
        if n <= 0:
            raise ValueError("invalid argument to Int31n: %d" % n)
        if n & (n - 1) == 0:
            return self.int31() & (n - 1)
        limit = (1 << 31) - 1 - (1 << 31) % n
        v = self.int31()
        while v > limit:
            v = self.int31()
        return v % n

    def intn(self, n):
        """Intn(n) = Int31n(n) for every n below 2^31 (all that obfs4 uses)."""
        if n >= 1 << 31:
            raise ValueError("Intn beyond 2^31 - 1 is not implemented: %d" % n)
        return self.int31n(n)

    def float64(self):
        """f = Int63() / 2^63, drawn again while f == 1.0 (rounding can give exactly 1)."""
        while True:
            f = float(self.source.int63()) / 9223372036854775808.0
            if f != 1.0:
                return f

    def perm(self, n):
        """m = [0] * n; for i in 0 .. n-1: j = Intn(i + 1); m[i] = m[j]; m[j] = i
        (Intn(1) at i = 0 still consumes a value)."""
        m = [0] * n
        for i in range(n):
            j = self.intn(i + 1)
            m[i] = m[j]
            m[j] = i
        return m


_SYSTEM_RANDOM = random.SystemRandom()


class WeightedDist:
    """obfs4proxy's ``probdist``: a random table of values with random weights, sampled
    with Vose's alias method. Lengths use (lo, hi) = (0, 1448), IAT (0, 100).

    Built (obfs4-spec 6.3) from ``rng = GoRand(HashDrbg(seed))``:
        count  = hi + 1 - lo;  perm = rng.Perm(count)
        n      = rng.Intn(min(100, max(1, count))) + 1;  values = perm[0:n]
        w_i    = rng.Float64()     (biased: (1 - sum of earlier w) * rng.Float64())
        alias tables from scaled_i = w_i * n / sum(w)   (FIFO ``small`` and ``large``)

    The tables never change after construction, so one instance may be shared by every
    connection of a listener and sampled from many threads."""

    def __init__(self, seed24, lo, hi, biased=False):
        self.lo, self.hi, self.biased = lo, hi, biased
        rng = GoRand(HashDrbg(seed24))
        count = hi + 1 - lo
        perm = rng.perm(count)
        n = rng.intn(min(100, max(1, count))) + 1
        self.values = perm[:n]
        self.weights = []
        total_before = 0.0
        for _ in range(n):
            w = (1.0 - total_before) * rng.float64() if biased else rng.float64()
            total_before += w
            self.weights.append(w)
        self.prob, self.alias = _vose(self.weights)

    def sample(self, randbelow=secrets.randbelow, random_float=_SYSTEM_RANDOM.random):
        """lo + values[i] if c <= prob[i] else lo + values[alias[i]], where i is uniform in
        [0, n) and c uniform in [0, 1), both from the CSPRNG (not the DRBG)."""
        i = randbelow(len(self.values))
        if random_float() > self.prob[i]:
            i = self.alias[i]
        return self.lo + self.values[i]


def _vose(weights):
    """Vose's alias tables (prob, alias) for ``weights``, in obfs4proxy's exact order."""
    n = len(weights)
    total = 0.0
    for w in weights:
        total += w
    scaled = [w * n / total for w in weights]       # multiply, then divide (as Go)
    small = [i for i in range(n) if scaled[i] < 1.0]
    large = [i for i in range(n) if scaled[i] >= 1.0]
    prob, alias = [0.0] * n, [0] * n
    s = g = 0                                       # fronts of the two FIFO queues
    while s < len(small) and g < len(large):
        less, more = small[s], large[g]
        s, g = s + 1, g + 1
        prob[less] = scaled[less]
        alias[less] = more
        scaled[more] = (scaled[more] + scaled[less]) - 1.0
        (small if scaled[more] < 1.0 else large).append(more)
    for i in large[g:] + small[s:]:
        prob[i] = 1.0
    return prob, alias


def close_delay(drbg_seed24):
    """A server's fixed extra delay (seconds, 0..59) before closing a failed connection:
    Intn(60) as the first call on a fresh HashDrbg(drbg-seed)."""
    return GoRand(HashDrbg(drbg_seed24)).intn(60)
