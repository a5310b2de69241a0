r"""obfs4_crypto.py: obfs4's frame cipher, NaCl's secretbox, and HKDF, each proven by
known answers; and the report of every obfs4 crypto route.

obfs4 (see ``obfs4.py``) needs, beyond SHA-2/HMAC from ``hashlib``:

* NaCl ``secretbox`` (XSalsa20-Poly1305) for every frame, which needs HSalsa20 and a
  Poly1305 that takes a raw one-time key: here;
* a SipHash-2-4 "hash DRBG" that masks frame lengths and seeds the padding tables, and
  the few Go ``math/rand`` methods obfs4proxy drives with it: obfs4_drbg.py;
* X25519, and Elligator2 in the exact variant obfs4proxy 0.0.14 runs, so that public
  keys on the wire look like uniformly random bytes: curve25519.py.

When PyNaCl (libsodium) is installed, secretbox, X25519 and the Edwards work of key
generation run there instead; pycryptodome (``Crypto`` or ``Cryptodome``) and OpenSSL's
libcrypto through ``ctypes`` serve other pieces; each only after it gives the known
answers at import (cryptoroutes/chooser.py). With none of them (``python3 -I -S``, or
``OBFSPROXY_CRYPTO=stdlib``) everything still runs in pure Python, only slower.

secretbox gives each frame confidentiality and integrity, **provided a nonce is never
used twice with one key**: obfs4 builds the nonce from a per-direction prefix and a
counter that starts at 1 and must never wrap (``SecretBox`` only takes the counter).
Nothing here does I/O, keeps a clock, or logs.

Notation (spec symbol -> code)
------------------------------
=========================  ==================================================
HSalsa20(k, n16)           ``hsalsa20(key32, input16)``
XSalsa20(k, n24)           Salsa20(HSalsa20(k, n24[0:16]), n24[16:24])
Poly1305(k32, m)           ``poly1305(key32, data)``: r = k[0:16] clamped, s = k[16:32]
secretbox(k, n24, m)       ``secretbox_seal``/``secretbox_open``; per direction ``SecretBox``
SipHash-2-4(K, m)          ``siphash24(key16, data)``
HashDRBG(seed24)           ``HashDrbg``: ``next_block``, ``mask16``, ``int63``
rand.New(source)           ``GoRand``: Int63, Int31, Int31n, Intn, Float64, Perm
probdist.New(seed, lo, hi) ``WeightedDist``
X25519(k, u)               ``x25519(scalar32, u32)``; X25519(k, 9) ``x25519_base``
ell2 direct / inverse      ``elligator2_direct(r32)`` / ``elligator2_inverse(u32, tweak)``
clamp(a)·G + T[a[0] & 7]   ``dirty_public_key(priv32)``
NewKeypair(elligator)      ``generate_keypair(randbytes)``
HKDF-SHA256                ``hkdf_sha256(ikm, salt, info, length)`` (RFC 5869)
=========================  ==================================================

One frame's secretbox (obfs4-spec 2.8)
--------------------------------------
::

    nonce24 = nonce_prefix (16, fixed per direction) | BE64(counter)
    subkey  = HSalsa20(key, nonce_prefix)           -- once per direction, not per frame
    stream  = Salsa20/20(subkey, BE64(counter)), block counter from 0

    stream:  [ 0 .. 31 : Poly1305 one-time key ][ 32 .. : XOR with the packet ]
    box:     +--------------------+----------------------------------------+
             | tag = Poly1305(ct) |  ct = packet XOR stream[32:]           |
             +--------------------+----------------------------------------+
                   16 bytes             len(packet) bytes

(libsodium's crypto_secretbox does all of this in one call from key, nonce24, packet;
the portable route does it in two, with the subkey cached per direction.)

Routes (cryptoroutes/chooser.py says how each is chosen)
---------------------------------------------------------
=============  ==========================================  ====================================
piece          candidates, fastest first                   used for
=============  ==========================================  ====================================
secretbox      PyNaCl ``crypto_secretbox``; libsodium      every frame, both directions
               ``crypto_secretbox_easy`` (ctypes); a
               library's keyed Salsa20 + its Poly1305
               context (cryptoroutes/framebox.py); the
               Salsa20 route + the Poly1305 route
Poly1305       libsodium ``crypto_onetimeauth_poly1305``,  the portable secretbox
               libcrypto ``EVP_Q_mac`` (ctypes);
               pycryptodome ``Poly1305_MAC``; pure Python
HSalsa20       libsodium ``crypto_core_hsalsa20``          the portable secretbox (per direction)
               (ctypes); pycryptodome Salsa20 ``seek``;
               pure Python
Salsa20        libsodium ``crypto_stream_salsa20_xor_ic``, the portable secretbox
               nettle ``salsa20_crypt``, libgcrypt
               ``gcry_cipher`` (ctypes); pycryptodome
               ``Salsa20``; pure Python (pure_salsa20.py)
=============  ==========================================  ====================================

Every piece has a pure-Python fallback, so a wrong answer never stops us: it is passed
over, and the report says so. ``routes()`` names the route of every piece of obfs4 (this module's, the
keys' in curve25519.py, the DRBG's in obfs4_drbg.py), ``route_report()`` says the
same in one line (with why a faster route was passed over), and
``pure_python_routes()`` lists the pieces that fell back to pure Python although a C
route exists (install PyNaCl, or a newer pycryptodome, to fix them).
``reported_routes()`` is ``routes()`` plus why faster routes were passed over, for the
start-up NOTICE.

What a frame costs (Python 3.11 on one core of the shared 2-core test machine; the
figures move by 20-50% with the machine's load): seal or open of 1430 bytes is ~3 µs
through PyNaCl (one C call for the whole box; libsodium recomputes HSalsa20 from the
24-byte nonce each time, which costs less than any way round it from Python), against
~11-14 µs through pycryptodome (one Salsa20 call over 0^32 | packet gives the Poly1305
key and the ciphertext, then one Poly1305); HSalsa20 ~8 µs. With no package, through
``ctypes``: the system's libsodium ~4 µs (the same one call as PyNaCl), nettle's or
libgcrypt's Salsa20 with libcrypto's Poly1305 keyed once per direction and called on
buffers of their own (``_DirectSecretBox``, cryptoroutes/framebox.py) ~5-7, where the
same C calls on bytes (``_PortableSecretBox``) cost ~12-17 (bench/frames.py measures
each route). With no C Salsa20 at all (pure-Python Salsa20, libcrypto's Poly1305) ~100-150
µs, the 23 keystream blocks of a frame computed side by side (pure_salsa20.py), and less
when the frames of a write are
sealed together or, reading, the next frames' keystreams are computed ahead
(``_PortableSecretBox``): an in-memory obfs4 pair then carries ~11 MB/s each way on one
core, against ~25-34 on pycryptodome. The frame's length mask (obfs4_drbg.py) costs
~3-6 µs more.
"""

import hashlib
import hmac
import struct

import obfs4_drbg
from cryptoroutes import chooser, curve25519, framebox, pure_salsa20
from cryptoroutes.chooser import KnownAnswerError  # noqa: F401  (re-exported: obfs4_crypto.KnownAnswerError)

# The route chooser (chooser.py), by the names the code below uses.
_nacl, _NaClError, _PASSED_OVER = chooser.nacl, chooser.NaClError, chooser.PASSED_OVER
_choose, _answers, _gives, _byte_view = chooser.choose, chooser.answers, chooser.gives, chooser.byte_view
_Poly1305_MAC, _lib_poly1305, Salsa20 = chooser.Poly1305_MAC, chooser.lib_poly1305, chooser.Salsa20

# --------------------------------------------------------------------------------------
# HKDF-SHA256 (RFC 5869), for ntor's key expansion
# --------------------------------------------------------------------------------------


def hkdf_sha256_extract(salt, ikm):
    """PRK = HMAC-SHA256(salt, IKM)   (an empty salt acts as 32 zero bytes)"""
    return hmac.new(salt, ikm, hashlib.sha256).digest()


def hkdf_sha256_expand(prk, info, length):
    """T(0) = "";  T(i) = HMAC-SHA256(PRK, T(i-1) | info | i);  OKM = T(1) | T(2) | ... [0:L]"""
    if not 0 <= length <= 255 * 32:
        raise ValueError("HKDF-SHA256 can give at most 8160 bytes, not %d" % length)
    blocks, block = [], b""
    for i in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        blocks.append(block)
    return b"".join(blocks)[:length]


def hkdf_sha256(ikm, salt, info, length):
    """HKDF-SHA256(IKM, salt, info, L) = Expand(Extract(salt, IKM), info, L)."""
    return hkdf_sha256_expand(hkdf_sha256_extract(salt, ikm), info, length)


# --------------------------------------------------------------------------------------
# HSalsa20 and XSalsa20 (obfs4-spec 7.1)
# --------------------------------------------------------------------------------------

M32 = 0xFFFFFFFF
SIGMA = struct.unpack("<4I", b"expand 32-byte k")   # the words at state positions 0, 5, 10, 15

# Salsa20's double round: four columns, then four rows; each tuple is (a, b, c, d) of
#   b ^= (a + d) <<< 7;  c ^= (b + a) <<< 9;  d ^= (c + b) <<< 13;  a ^= (d + c) <<< 18
_DOUBLE_ROUND = ((0, 4, 8, 12), (5, 9, 13, 1), (10, 14, 2, 6), (15, 3, 7, 11),
                 (0, 1, 2, 3), (5, 6, 7, 4), (10, 11, 8, 9), (15, 12, 13, 14))


def _hsalsa20_pure(key32, input16):
    """HSalsa20: the Salsa20/20 rounds over

        [ c0  k0  k1  k2 ]
        [ k3  c1  n0  n1 ]      c = "expand 32-byte k", k = key32, n = input16
        [ n2  n3  c2  k4 ]      (little-endian 32-bit words)
        [ k5  k6  k7  c3 ]

    returning words 0, 5, 10, 15, 6, 7, 8, 9 *without* adding the input back.
    Pure Python (50-100 µs; the pycryptodome route below ~8 µs): compute it once per
    direction, never per frame.
    """
    k = struct.unpack("<8I", key32)
    n = struct.unpack("<4I", input16)
    x = [SIGMA[0], k[0], k[1], k[2], k[3], SIGMA[1], n[0], n[1],
         n[2], n[3], SIGMA[2], k[4], k[5], k[6], k[7], SIGMA[3]]
    for _ in range(10):
        for a, b, c, d in _DOUBLE_ROUND:
            t = (x[a] + x[d]) & M32
            x[b] ^= ((t << 7) | (t >> 25)) & M32
            t = (x[b] + x[a]) & M32
            x[c] ^= ((t << 9) | (t >> 23)) & M32
            t = (x[c] + x[b]) & M32
            x[d] ^= ((t << 13) | (t >> 19)) & M32
            t = (x[d] + x[c]) & M32
            x[a] ^= ((t << 18) | (t >> 14)) & M32
    return struct.pack("<8I", x[0], x[5], x[10], x[15], x[6], x[7], x[8], x[9])


def _hsalsa20_pycryptodome(key32, input16):
    """HSalsa20 from one Salsa20 block. Salsa20/20 with key k, nonce n[0:8] and block
    counter LE64(n[8:16]) starts from exactly HSalsa20's input matrix, and its block is
    rounds(x) + x word by word; so HSalsa20's words are block[i] - x[i] for
    i = 0, 5, 10, 15, 6, 7, 8, 9. Needs ``seek`` (set the block counter)."""
    cipher = Salsa20.new(key=bytes(key32), nonce=bytes(input16[:8]))
    cipher.seek(int.from_bytes(input16[8:16], "little") * 64)
    z = struct.unpack("<16I", cipher.encrypt(bytes(64)))
    n = struct.unpack("<4I", input16)
    return struct.pack("<8I", (z[0] - SIGMA[0]) & M32, (z[5] - SIGMA[1]) & M32,
                       (z[10] - SIGMA[2]) & M32, (z[15] - SIGMA[3]) & M32, (z[6] - n[0]) & M32,
                       (z[7] - n[1]) & M32, (z[8] - n[2]) & M32, (z[9] - n[3]) & M32)


def xsalsa20_keystream(key32, nonce24, length):
    """The first ``length`` bytes of XSalsa20(key, nonce):
    Salsa20/20(HSalsa20(key, nonce[0:16]), nonce[16:24]), block counter from 0."""
    return bytes(_salsa20_xor(hsalsa20(key32, nonce24[:16]), bytes(nonce24[16:24]), bytes(length)))


# --------------------------------------------------------------------------------------
# Poly1305 with a raw one-time key (obfs4-spec 7.2)
# --------------------------------------------------------------------------------------

P1305 = (1 << 130) - 5
R_CLAMP = 0x0FFFFFFC0FFFFFFC0FFFFFFC0FFFFFFF
M128 = (1 << 128) - 1


def _poly1305_pure(key32, data):
    """r = LE(key[0:16]) & 0x0ffffffc0ffffffc0ffffffc0fffffff;  s = LE(key[16:32])
    for each 16-byte block b (the last may be shorter):
        acc = (acc + LE(b) + 2^(8·len(b))) · r  mod 2^130 - 5
    tag = (acc + s) mod 2^128, 16 bytes little-endian."""
    if len(key32) != 32:
        raise ValueError("Poly1305 takes a 32-byte key, not %d" % len(key32))
    r = int.from_bytes(key32[:16], "little") & R_CLAMP
    s = int.from_bytes(key32[16:32], "little")
    data = data if type(data) is bytes else _byte_view(data)
    acc = 0
    full = len(data) - len(data) % 16
    for i in range(0, full, 16):
        acc = (acc + int.from_bytes(data[i:i + 16], "little") + (1 << 128)) * r % P1305
    if full < len(data):
        tail = data[full:]
        acc = (acc + int.from_bytes(tail, "little") + (1 << (8 * len(tail)))) * r % P1305
    return ((acc + s) & M128).to_bytes(16, "little")


def _poly1305_pycryptodome(key32, data):
    """pycryptodome's private raw-key class (it clamps r itself)."""
    return _Poly1305_MAC(key32[:16], key32[16:32], data if type(data) is bytes else _byte_view(data)).digest()


def _salsa20_xor_pycryptodome(key32, nonce8, data):
    """Salsa20/20(key, nonce) from block 0, XORed with ``data``: pycryptodome's public API."""
    return Salsa20.new(key=key32, nonce=nonce8).encrypt(data if type(data) is bytes else _byte_view(data))


# RFC 8439 section 2.5.2, and the empty message (whose tag is s itself).
_RFC8439_KEY = bytes.fromhex("85d6be7857556d337f4452fe42d506a80103808afb0db2fd4abff6af4149f51b")
_POLY1305_ANSWERS = [
    ((_RFC8439_KEY, b"Cryptographic Forum Research Group"),
     bytes.fromhex("a8061dc1305136c6c22b8baf0c0127a9")),
    ((_RFC8439_KEY, b""), _RFC8439_KEY[16:]),
]


def _poly1305_route():
    """Poly1305: libsodium's one call through ctypes (~2 µs a frame), else libcrypto's
    one-call EVP_Q_mac (~4 µs, where pycryptodome's Python layer around its C costs ~8),
    else pycryptodome's raw-key class, else pure Python (measured in one run)."""
    return _choose([(chooser.sodium_poly1305, "libsodium crypto_onetimeauth_poly1305"),
                    (_lib_poly1305, "libcrypto EVP_Q_mac"),
                    (_poly1305_pycryptodome if _Poly1305_MAC else None, "pycryptodome Poly1305_MAC"),
                    (_poly1305_pure, "pure Python")], _answers(_POLY1305_ANSWERS))


poly1305, POLY1305_ROUTE, _PASSED_OVER["Poly1305"] = _poly1305_route()

# Salsa20 (obfs4-primitives.json, "xsalsa20": NaCl's stream3 under its HSalsa20 subkey,
# the second "hsalsa20" output): 160 bytes, so three blocks.
_SALSA20_KEY = bytes.fromhex("dc908dda0b9344a953629b733820778880f3ceb421bb61b91cbd4c3e66256ce4")
_SALSA20_ANSWERS = [
    ((_SALSA20_KEY, bytes.fromhex("8219e0036b7a0b37"), bytes(32)),
     bytes.fromhex("eea6a7251c1e72916d11c2cb214d3c252539121d8e234e652d651fa4c8cff880")),
    ((_SALSA20_KEY, bytes.fromhex("8219e0036b7a0b37"), bytes(160)), bytes.fromhex(
        "eea6a7251c1e72916d11c2cb214d3c252539121d8e234e652d651fa4c8cff880309e645a74e9e0a60d8243acd9"
        "177ab51a1beb8d5a2f5d700c093c5e5585579625337bd3ab619d615760d8c5b224a85b1d0efe0eb8a7ee163abb"
        "0376529fcc09bab506c618e13ce777d82c3ae9d1a6f972d4160287cbfe60bf2130fc0a6ff6049d0a5c8a82f429"
        "231f008082e845d7e189d37f9ed2b464e6b919e6523a8c1210")),
]


def _salsa20_route():
    """Salsa20 (not in OpenSSL): the system's libsodium, nettle or libgcrypt through
    ctypes (~3, ~5 and ~6 µs a 1,462-byte frame, where pycryptodome's Python layer
    around its C costs ~33: measured in one run), else pycryptodome's, else pure Python
    with every block of a frame side by side (pure_salsa20.py)."""
    return _choose([(chooser.sodium_salsa20_xor, "libsodium crypto_stream_salsa20_xor_ic"),
                    (chooser.nettle_salsa20_xor, "nettle salsa20_crypt"),
                    (chooser.gcrypt_salsa20_xor, "libgcrypt gcry_cipher Salsa20"),
                    (_salsa20_xor_pycryptodome if Salsa20 else None, "pycryptodome Salsa20"),
                    (pure_salsa20.salsa20_xor, "pure Python")], _answers(_SALSA20_ANSWERS))


_salsa20_xor, SALSA20_ROUTE, _PASSED_OVER["Salsa20"] = _salsa20_route()



def _salsa20_keyed_route():
    """The Salsa20 of framebox.py's secretbox (keyed once per direction, on addresses):
    libsodium's, nettle's or libgcrypt's, proven by the same answers; None without any."""
    return _choose([(chooser.sodium_salsa20_keyed, "libsodium crypto_stream_salsa20_xor_ic"),
                    (chooser.nettle_salsa20_keyed, "nettle salsa20_crypt"),
                    (chooser.gcrypt_salsa20_keyed, "libgcrypt gcry_cipher Salsa20"),
                    (None, "none")],
                   lambda keyed: _gives(framebox.salsa20_xor_of(keyed), _SALSA20_ANSWERS))


def _poly1305_context_route():
    """The Poly1305 of framebox.py's secretbox (a context per direction, on addresses):
    libsodium's one call, else libcrypto's EVP_MAC context (three calls, ~1.5 µs a frame
    less than EVP_Q_mac), else libgcrypt's gcry_mac handle; None without any."""
    return _choose([(chooser.sodium_poly1305_context, "libsodium crypto_onetimeauth_poly1305"),
                    (chooser.lib_poly1305_context, "libcrypto EVP_MAC"),
                    (chooser.gcrypt_poly1305_context, "libgcrypt gcry_mac"),
                    (None, "none")],
                   lambda new: _gives(framebox.poly1305_of(new), _POLY1305_ANSWERS))


_salsa20_keyed, SALSA20_KEYED_ROUTE, _PASSED_OVER["Salsa20 (keyed)"] = _salsa20_keyed_route()
_poly1305_context, POLY1305_CONTEXT_ROUTE, _PASSED_OVER["Poly1305 (context)"] = _poly1305_context_route()

# NaCl's core1/core2 examples (obfs4-primitives.json, "hsalsa20"); the second has a
# non-zero block counter, so it proves that ``seek`` reaches it.
_HSALSA20_ANSWERS = [
    ((bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742"), bytes(16)),
     bytes.fromhex("1b27556473e985d462cd51197a9a46c76009549eac6474f206c4ee0844f68389")),
    ((bytes.fromhex("1b27556473e985d462cd51197a9a46c76009549eac6474f206c4ee0844f68389"),
      bytes.fromhex("69696ee955b62b73cd62bda875fc73d6")),
     bytes.fromhex("dc908dda0b9344a953629b733820778880f3ceb421bb61b91cbd4c3e66256ce4")),
]


def _hsalsa20_route():
    """HSalsa20: libsodium's crypto_core_hsalsa20, else one seeked pycryptodome Salsa20
    block, else pure Python."""
    return _choose([(chooser.sodium_hsalsa20, "libsodium crypto_core_hsalsa20"),
                    (_hsalsa20_pycryptodome if Salsa20 else None, "pycryptodome Salsa20 seek"),
                    (_hsalsa20_pure, "pure Python")],
                   _answers(_HSALSA20_ANSWERS))


hsalsa20, HSALSA20_ROUTE, _PASSED_OVER["HSalsa20"] = _hsalsa20_route()


# --------------------------------------------------------------------------------------
# secretbox = XSalsa20-Poly1305 (obfs4-spec 2.8, 7.3)
# --------------------------------------------------------------------------------------

TAG_LENGTH = 16
_ZERO32 = bytes(32)


def _seal(subkey, nonce8, message):
    """tag | ct, where ct = message XOR stream[32:], tag = Poly1305(stream[0:32], ct).

    One Salsa20 call does both: Salsa20(0^32 | message) = stream[0:32] | ct."""
    out = _salsa20_xor(subkey, nonce8, _ZERO32 + message)
    ciphertext = memoryview(out)[32:]
    return poly1305(bytes(out[:32]), ciphertext) + ciphertext


def _open(subkey, nonce8, box):
    """The message in tag | ct, or ValueError("bad tag"). Salsa20(0^32 | ct) gives the
    Poly1305 key and the message in one call; the message is returned only if the tag
    over ct matches (constant-time compare). A memoryview of the result."""
    box = _byte_view(box)
    if len(box) < TAG_LENGTH:
        raise ValueError("bad tag")
    ciphertext = box[TAG_LENGTH:]
    out = _salsa20_xor(subkey, nonce8, _ZERO32 + ciphertext)
    if not hmac.compare_digest(poly1305(bytes(out[:32]), ciphertext), box[:TAG_LENGTH]):
        raise ValueError("bad tag")
    return memoryview(out)[32:]


class SecretBox:
    """One direction of obfs4 frames: a fixed key and 16-byte nonce prefix.

        nonce = nonce_prefix | BE64(counter)        box = tag (16) | ciphertext

    ``seal``/``open`` take the frame counter (0 .. 2^64 - 1; obfs4 starts at 1) and
    never let a nonce leave 64 bits. ``SecretBox(key, prefix)`` makes an instance of
    the route chosen at import (``SECRETBOX_ROUTE``):

    * ``_NaClSecretBox``: libsodium's crypto_secretbox, the whole box in one C call
      (``_SodiumSecretBox``: the same through ctypes, with no package);
    * ``_DirectSecretBox``: a system library's Salsa20 keyed once per direction and
      its Poly1305 context, on buffers of their own (cryptoroutes/framebox.py);
    * ``_PortableSecretBox``: the HSalsa20 subkey depends only on the key and the
      prefix, so it is computed once per direction; each frame then costs one
      Salsa20 call and one Poly1305 on the chosen routes.

    One instance is one direction of one connection, used by one thread at a time.
    """

    def __new__(cls, key32, nonce_prefix16):
        return super().__new__(_SecretBoxRoute if cls is SecretBox else cls)

    def __init__(self, key32, nonce_prefix16):
        if len(key32) != 32 or len(nonce_prefix16) != 16:
            raise ValueError("SecretBox needs a 32-byte key and a 16-byte nonce prefix")
        self.nonce_prefix = bytes(nonce_prefix16)
        self._key = bytes(key32)

    def nonce(self, counter):
        """nonce = nonce_prefix | BE64(counter)   (24 bytes)"""
        return self.nonce_prefix + _be64(counter)

    def seal(self, counter, packet):
        """tag (16) | ciphertext (len(packet))."""
        raise NotImplementedError

    def seal_packets(self, counter, packets):
        """[seal(counter, packets[0]), seal(counter + 1, packets[1]), ...]: a whole write
        in one call. Nothing is sealed if the last counter would leave 64 bits."""
        _check_counters(counter, len(packets))
        seal = self.seal
        return [seal(n, packet) for n, packet in enumerate(packets, counter)]

    def open(self, counter, box):
        """The packet inside ``box`` (tag | ciphertext); ValueError("bad tag") if forged,
        damaged, too short, or sealed under another counter."""
        return bytes(self.open_view(counter, box))

    def open_view(self, counter, box):
        """``open`` without a final copy: the packet as bytes or a memoryview (the
        decoder's hot path slices payloads out of it)."""
        raise NotImplementedError


# crypto_secretbox_easy (PyNaCl >= 1.6) spares NaCl's 32 bytes of zero padding, ~0.15 µs
# a frame; PyNaCl 1.5 (Debian 12's python3-nacl) has only crypto_secretbox. Both return
# tag | ciphertext, and the self-test proves whichever is used.
_nacl_seal = getattr(_nacl, "crypto_secretbox_easy", None) or getattr(_nacl, "crypto_secretbox", None)


class _NaClSecretBox(SecretBox):
    """crypto_secretbox through PyNaCl. libsodium takes the whole 24-byte nonce and
    derives HSalsa20(key, prefix) itself on every call (~0.1 µs of C, less than any
    way round it from Python); seal and open are one C call each."""

    def seal(self, counter, packet):
        return _nacl_seal(bytes(packet), self.nonce_prefix + _be64(counter), self._key)

    def seal_packets(self, counter, packets):
        _check_counters(counter, len(packets))
        seal, prefix, key = _nacl_seal, self.nonce_prefix, self._key
        return [seal(bytes(packet), prefix + n.to_bytes(8, "big"), key)
                for n, packet in enumerate(packets, counter)]

    def open_view(self, counter, box):
        # crypto_secretbox_open (not _easy): it prepends NaCl's 16 zero bytes with "+", so
        # it takes the decoder's memoryview as it is (bytes() first would cost ~0.2 µs a
        # frame, _easy ~0.4 µs more); a short box fails as a bad one. The self-test opens
        # a memoryview, and the tests fail if this route is ever passed over.
        try:
            return _nacl.crypto_secretbox_open(box, self.nonce_prefix + _be64(counter), self._key)
        except _NaClError:
            raise ValueError("bad tag") from None


class _SodiumSecretBox(SecretBox):
    """crypto_secretbox_easy through ctypes, from the system's libsodium with no package
    (libsodium.py): the whole box in one C call each way, as ``_NaClSecretBox``."""

    def seal(self, counter, packet):
        return _sodium_seal(packet, self.nonce_prefix + _be64(counter), self._key)

    def seal_packets(self, counter, packets):
        _check_counters(counter, len(packets))
        seal, prefix, key = _sodium_seal, self.nonce_prefix, self._key
        return [seal(packet, prefix + n.to_bytes(8, "big"), key) for n, packet in enumerate(packets, counter)]

    def open_view(self, counter, box):
        return _sodium_open(box, self.nonce_prefix + _be64(counter), self._key)


_sodium_seal, _sodium_open = chooser.sodium_secretbox or (None, None)


class _PortableSecretBox(SecretBox):
    """The Salsa20 and Poly1305 routes, with the HSalsa20 subkey cached.

    On the pure-Python Salsa20 (pure_salsa20.py), whose cost per block falls the more
    blocks it computes side by side, frames are batched both ways:

    * ``seal_packets`` computes the keystreams of a whole write's frames together (up
      to ``BATCH_BLOCKS`` blocks at a time: past that the integers outgrow the CPU's
      cache and each block costs more again);
    * ``open_view`` knows the next frames' nonces before they arrive (the counter goes
      up by one a frame), so while frames come full-sized and in turn it computes the
      keystreams of the next ones with this one, up to ``READ_AHEAD`` frames (the run
      doubles on each large frame, and falls back to one frame at the first small one
      or one out of turn, so interactive traffic computes nothing it does not use).
      The streams kept are the keystream of frames still to come: they are as secret
      as the key beside them, and go with it."""

    BATCH_BLOCKS = 512
    READ_AHEAD = 16
    LARGE = 1024            # a frame at least this long (ciphertext bytes) is bulk traffic

    def __init__(self, key32, nonce_prefix16):
        SecretBox.__init__(self, key32, nonce_prefix16)
        self._subkey = hsalsa20(self._key, self.nonce_prefix)
        self._ahead, self._run = {}, 1        # counter -> 32 + length keystream bytes
        self._next = None                     # the counter that follows the last opened

    def open_view(self, counter, box):
        if _salsa20_xor is not pure_salsa20.salsa20_xor:
            return _open(self._subkey, _be64(counter), box)
        box = _byte_view(box)
        if len(box) < TAG_LENGTH:
            raise ValueError("bad tag")
        ciphertext = box[TAG_LENGTH:]
        stream = self._keystream(counter, 32 + len(ciphertext))
        if not hmac.compare_digest(poly1305(stream[:32], ciphertext), box[:TAG_LENGTH]):
            raise ValueError("bad tag")
        return memoryview(pure_salsa20.xor(ciphertext, stream[32:32 + len(ciphertext)]))

    def _keystream(self, counter, length):
        """At least ``length`` keystream bytes of frame ``counter``: read ahead before,
        or computed now with those of the next frames (see the class docstring)."""
        stream = self._ahead.pop(counter, None)
        sequential, self._next = counter == self._next, counter + 1
        if stream is not None and len(stream) >= length:
            return stream
        _be64(counter)
        large = length >= 32 + self.LARGE
        self._run = min(2 * self._run, self.READ_AHEAD) if large and sequential else 1
        counters = range(counter, min(counter + self._run, 1 << 64))
        streams = pure_salsa20.keystreams(self._subkey, [(n.to_bytes(8, "big"), length) for n in counters])
        self._ahead = dict(zip(counters[1:], streams[1:]))
        return streams[0]

    def seal(self, counter, packet):
        return _seal(self._subkey, _be64(counter), packet)

    def seal_packets(self, counter, packets):
        if _salsa20_xor is not pure_salsa20.salsa20_xor:
            return SecretBox.seal_packets(self, counter, packets)
        _check_counters(counter, len(packets))
        sealed, batch, blocks = [], [], 0
        for n, packet in enumerate(packets, counter):
            batch.append((n.to_bytes(8, "big"), _ZERO32 + bytes(packet)))
            blocks += (len(packet) + 95) // 64
            if blocks >= self.BATCH_BLOCKS:
                sealed += self._seal_batch(batch)
                batch, blocks = [], 0
        return sealed + self._seal_batch(batch) if batch else sealed

    def _seal_batch(self, batch):
        boxes = []
        for out in pure_salsa20.salsa20_xor_many(self._subkey, batch):
            ciphertext = memoryview(out)[32:]
            boxes.append(poly1305(out[:32], ciphertext) + ciphertext)
        return boxes


class _DirectSecretBox(SecretBox):
    """A system library's Salsa20 and Poly1305 on buffers of their own, with the
    HSalsa20 subkey cached (cryptoroutes/framebox.py): where libsodium is missing,
    nettle's or libgcrypt's Salsa20 with libcrypto's or libgcrypt's Poly1305 cost
    about half of what ``_PortableSecretBox`` pays for the same C calls on bytes."""

    def __init__(self, key32, nonce_prefix16):
        SecretBox.__init__(self, key32, nonce_prefix16)
        self._frames = framebox.FrameBox(_salsa20_keyed, _poly1305_context,
                                         hsalsa20(self._key, self.nonce_prefix))

    def seal(self, counter, packet):
        return self._frames.seal(_be64(counter), packet)

    def seal_packets(self, counter, packets):
        _check_counters(counter, len(packets))
        seal = self._frames.seal
        return [seal(n.to_bytes(8, "big"), packet) for n, packet in enumerate(packets, counter)]

    def open_view(self, counter, box):
        return self._frames.open(_be64(counter), box)


def _be64(counter):
    if not 0 <= counter <= 0xFFFFFFFFFFFFFFFF:
        raise ValueError("secretbox counter %r does not fit in 64 bits" % (counter,))
    return counter.to_bytes(8, "big")


def _check_counters(first, count):
    """ValueError unless first .. first + count - 1 all fit in 64 bits."""
    if count:
        _be64(first)
        _be64(first + count - 1)


def secretbox_seal(key32, nonce24, message):
    """NaCl crypto_secretbox with the tag first (as Go's secretbox.Seal): tag | ct."""
    return SecretBox(key32, nonce24[:16]).seal(_counter_of(nonce24), message)


def secretbox_open(key32, nonce24, box):
    """The message in ``box`` (tag | ct); ValueError("bad tag") when it does not verify."""
    return SecretBox(key32, nonce24[:16]).open(_counter_of(nonce24), box)


def _counter_of(nonce24):
    if len(nonce24) != 24:
        raise ValueError("a secretbox nonce is 24 bytes, not %d" % len(nonce24))
    return int.from_bytes(nonce24[16:], "big")


# obfs4-primitives.json, "secretbox": NaCl's secretbox.c (131 bytes) and Go's
# TestSecretBox (64 bytes), as (key, nonce, message, tag | ciphertext).
_SECRETBOX_ANSWERS = [
    (bytes.fromhex("1b27556473e985d462cd51197a9a46c76009549eac6474f206c4ee0844f68389"),
     bytes.fromhex("69696ee955b62b73cd62bda875fc73d68219e0036b7a0b37"),
     bytes.fromhex(
         "be075fc53c81f2d5cf141316ebeb0c7b5228c52a4c62cbd44b66849b64244ffce5ecbaaf33bd751a1ac728d45e6c6129"
         "6cdc3c01233561f41db66cce314adb310e3be8250c46f06dceea3a7fa1348057e2f6556ad6b1318a024a838f21af1f"
         "de048977eb48f59ffd4924ca1c60902e52f0a089bc76897040e082f937763848645e0705"),
     bytes.fromhex(
         "f3ffc7703f9400e52a7dfb4b3d3305d98e993b9f48681273c29650ba32fc76ce48332ea7164d96a4476fb8c531a1186a"
         "c0dfc17c98dce87b4da7f011ec48c97271d2c20f9b928fe2270d6fb863d51738b48eeee314a7cc8ab932164548e526"
         "ae90224368517acfeabd6bb3732bc0e9da99832b61ca01b6de56244a9e88d5f9b37973f622a43d14a6599b1f654cb4"
         "5a74e355a5")),
    (b"\x01" * 32, b"\x02" * 24, b"\x03" * 64, bytes.fromhex(
        "8442bc313f4626f1359e3b50122b6ce6fe66ddfe7d39d14e637eb4fd5b45beadab55198df6ab5368439792a23c87db70"
        "acb6156dc5ef957ac04f6276cf6093b84be77ff0849cc33e34b7254d5a8f65ad")),
]


def _secretbox_proven(route):
    """True if the SecretBox class ``route`` seals each vector's message to its box
    (alone and as a one-packet batch), opens the box back (given bytes and given a
    memoryview), and refuses the box with the first or the last bit flipped, and a
    box shorter than a tag: the known answers, and the known refusals."""
    try:
        for key, nonce, message, box in _SECRETBOX_ANSWERS:
            sb, counter = route(key, nonce[:16]), _counter_of(nonce)
            if sb.seal(counter, message) != box or sb.seal_packets(counter, [message]) != [box]:
                return False
            if bytes(sb.open_view(counter, box)) != message or \
                    bytes(sb.open_view(counter, memoryview(box))) != message:
                return False
            for forged in (bytes([box[0] ^ 1]) + box[1:], box[:-1] + bytes([box[-1] ^ 0x80]), box[:15]):
                try:
                    sb.open_view(counter, forged)
                except ValueError:
                    continue
                return False
        return True
    except Exception:  # a broken fast route must never stop the program: the next one runs
        return False


def _secretbox_route():
    """secretbox: PyNaCl, else the system's libsodium through ctypes, else the Salsa20
    route with the Poly1305 route."""
    portable = "Salsa20 (%s) + Poly1305 (%s)" % (SALSA20_ROUTE, POLY1305_ROUTE)
    direct = "Salsa20 (%s) + Poly1305 (%s)" % (SALSA20_KEYED_ROUTE, POLY1305_CONTEXT_ROUTE)
    return _choose([(_NaClSecretBox if _nacl else None, "PyNaCl crypto_secretbox"),
                    (_SodiumSecretBox if chooser.sodium_secretbox else None,
                     "libsodium crypto_secretbox_easy"),
                    (_DirectSecretBox if _salsa20_keyed and _poly1305_context else None, direct),
                    (_PortableSecretBox, portable)], _secretbox_proven)


_SecretBoxRoute, SECRETBOX_ROUTE, _PASSED_OVER["secretbox"] = _secretbox_route()


# --------------------------------------------------------------------------------------
# The route report
# --------------------------------------------------------------------------------------

def routes():
    """{piece: route} for every piece obfs4 runs, as chosen at import, e.g.
    {"secretbox": "PyNaCl crypto_secretbox", ..., "hash DRBG": "pure Python"}.
    Poly1305, HSalsa20 and Salsa20 are the portable secretbox's parts (and HSalsa20
    serves ``xsalsa20_keystream``); obfs3's modexp is reported by obfs3.MODEXP_ROUTE."""
    return {"secretbox": SECRETBOX_ROUTE, "X25519": curve25519.X25519_ROUTE,
            "edwards25519": curve25519.EDWARDS_ROUTE, "Elligator2": curve25519.ELLIGATOR2_ROUTE,
            "hash DRBG": obfs4_drbg.DRBG_ROUTE, "Poly1305": POLY1305_ROUTE,
            "HSalsa20": HSALSA20_ROUTE, "Salsa20": SALSA20_ROUTE}


def reported_routes():
    """``routes()`` and, when any faster route was passed over, a last entry "passed
    over" saying why (a family not used, a known answer failed): what obfs4 reports
    for the start-up NOTICE, so that it says what ``route_report()`` says."""
    chosen = routes()
    why = chooser.passed_over_text(list(chosen))
    if why:
        chosen["passed over"] = why
    return chosen


def pure_python_routes():
    """The pieces in use that fell back to pure Python although a C route exists, for a
    one-time warning (slower, and not constant time): e.g. ["X25519"] when neither
    PyNaCl nor pycryptodome >= 3.21 is there. Poly1305 and HSalsa20 count only when
    the portable secretbox runs. Not listed, because no install changes it: the hash
    DRBG, which is Python by design (obfs4_drbg.py says why)."""
    pieces = ["X25519", "edwards25519", "Elligator2"]
    if _SecretBoxRoute is _PortableSecretBox:
        pieces = ["Salsa20", "Poly1305", "HSalsa20"] + pieces
    elif _SecretBoxRoute is _DirectSecretBox:          # its Salsa20 and Poly1305 are a library's
        pieces = ["HSalsa20"] + pieces
    chosen = routes()
    return [piece for piece in pieces if chosen[piece] == "pure Python"]


def route_report():
    """One line naming every route (for the startup log and ``python3 -c``), with why a
    faster route was passed over: PyNaCl missing or ignored, or a known answer failed."""
    parts = []
    for piece, route in routes().items():
        failed = _PASSED_OVER.get(piece)
        parts.append("%s: %s%s" % (piece, route, " (%s)" % chooser.failed_text(failed) if failed else ""))
    parts += ["%s not used: %s" % item for item in chooser.unavailable().items()]
    return "; ".join(parts)
