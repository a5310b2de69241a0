r"""obfs4's primitives that pycryptodome lacks or hides, each proven by known answers.

obfs4 (see ``obfs4.py``) needs, beyond AES/SHA-2/HMAC/Salsa20 from pycryptodome:

* NaCl ``secretbox`` (XSalsa20-Poly1305) for every frame, which needs HSalsa20 and a
  Poly1305 that takes a raw one-time key;
* a SipHash-2-4 "hash DRBG" that masks frame lengths and seeds the padding tables, and
  the few Go ``math/rand`` methods obfs4proxy drives with it;
* X25519, and Elligator2 in the exact variant obfs4proxy 0.0.14 runs, so that public
  keys on the wire look like uniformly random bytes.

When PyNaCl (libsodium) is installed, secretbox, X25519 and the Edwards work of key
generation run there instead, each only after it gives the known answers at import
("Routes" below); without it everything still runs, only slower.

Nothing here does I/O, keeps a clock, or logs. The randomness of ``generate_keypair`` and
``WeightedDist.sample`` is injectable, so known-answer vectors replay byte for byte.

What each piece protects, and what it does not
----------------------------------------------
* secretbox gives each frame confidentiality and integrity, **provided a nonce is never
  used twice with one key**: obfs4 builds the nonce from a per-direction prefix and a
  counter that starts at 1 and must never wrap (``SecretBox`` only takes the counter).
* The hash DRBG is *not* a secret-keeping generator. It only has to look random: the
  length masks are seeded from session keys, but the padding table seed of a server is
  sent to every client on purpose (clients copy the bridge's length fingerprint).
* Elligator2 hides that the first 32 bytes are a curve point. A censor that maps a
  representative back to ``u`` could still test whether the point lies in the prime-order
  subgroup (every honest X25519 key does), which is why obfs4proxy 0.0.14 adds a random
  low-order point (the "dirty" key below). Half of all keys have no representative: key
  generation is a rejection loop, run *before* a connection so its time does not show.
* Python integers are not constant-time. The pure-Python fallbacks (used only when
  neither PyNaCl nor the installed pycryptodome has a fast route) leak timing to a
  local observer; against a network censor that is the same trade every Python obfs
  implementation makes. One piece is Python by design, whatever is installed: the
  hash DRBG (no library offers an incremental SipHash, see "Routes"); the Elligator2
  maps are Python around one field power (pycryptodome's, when it passes).

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

The hash DRBG (obfs4-spec 6.1)
------------------------------
::

    seed24 = K (16: SipHash key) | o_0 (8)
    block n = o_n = SipHash-2-4(K, o_0 | o_1 | ... | o_(n-1))   -- ONE hasher, never reset
    mask16  = o[0] * 256 + o[1]          Int63 = BE64(o) & (2^63 - 1)

Keypair generation (obfs4-spec 2.2, 7.6)
----------------------------------------
::

    32 CSPRNG bytes --SHA-512--> d      priv = d[0:32] (kept unclamped), tweak = d[63]
    P = clamp(priv)·G + T[priv[0] & 7]  on edwards25519 (T = the 8 torsion points)
    u = (1 + y) / (1 - y)               P mapped to Montgomery form: the "dirty" key
    r = ell2_inverse(u, tweak)          None for about half of all u: draw again
    keep priv (X25519 clamps it), u (our own ntor transcript), r (the 32 bytes sent)

Because the peer's clamped scalar is a multiple of 8, the torsion term changes no shared
secret: X25519(b, dirty u) == X25519(b, clean u).

Where the obfs4 document and the 0.0.14 code differ (the code is what is on the wire)
-------------------------------------------------------------------------------------
1. The DRBG: the document says each block is SipHash of the previous block. The code
   feeds each block into one SipHash state that is never reset, so block n hashes all
   earlier blocks. Both readings agree on the first block only.
2. Elligator2: 0.0.14 maps a representative after masking **both** top bits, and sets
   the two top bits of its own representatives from ``tweak & 0xC0``; its public keys
   carry a torsion term chosen by the *unclamped* low bits of the private key
   (versions up to 0.0.13 clamped first, so the term was always the identity).
3. The length tables: weights are Go ``Float64()`` values and the alias tables are
   built by Vose's method with FIFO work lists; only exact float replay reproduces a
   bridge's table (the vectors compare floats with ``==``).

Routes: libsodium, then pycryptodome, then pure Python
------------------------------------------------------
Each piece has candidate routes, fastest first. A candidate is used only if it gives
every known answer embedded below (copied from ``shared/vectors``; the tests check the
copies) when this module is imported; a candidate that is missing, raises, or answers
wrongly is skipped for the next one. The last candidate, the pure-Python function, is
the fallback (the tests prove it on the same vectors).

=============  ==========================================  ====================================
piece          candidates, fastest first                   used for
=============  ==========================================  ====================================
secretbox      PyNaCl ``crypto_secretbox``;                every frame, both directions
               pycryptodome Salsa20 + the Poly1305 route
Poly1305       pycryptodome ``Poly1305_MAC``; pure Python  the portable secretbox
HSalsa20       pycryptodome Salsa20 ``seek``; pure Python  the portable secretbox (per direction)
Salsa20        pycryptodome ``Salsa20`` only               the portable secretbox, HSalsa20
X25519         PyNaCl ``crypto_scalarmult``;               ntor: two per handshake and side
               pycryptodome ``Crypto.Protocol.DH``;
               pure Python
edwards25519   PyNaCl ``crypto_scalarmult_ed25519_base``   ``dirty_public_key``: about two per
               + ``crypto_core_ed25519_add``;              keypair (the rejection loop)
               pycryptodome ``EccPoint``; pure Python
Elligator2     pycryptodome ``Integer`` (the field power   ``elligator2_inverse``: about two
               of the inverse map); pure Python ``pow``    per keypair
hash DRBG      pure Python only (see below)                one length mask per frame
=============  ==========================================  ====================================

Salsa20 has no fallback: if pycryptodome's Salsa20 fails its known answer, importing
this module raises ``KnownAnswerError`` (we do not run a cipher that gave a wrong
answer). ``routes()`` names the route of every piece, ``route_report()`` says the same
in one line (with why a faster route was passed over), and ``pure_python_routes()``
lists the pieces that fell back to pure Python although a C route exists (install
PyNaCl, or a newer pycryptodome, to fix them).

``OBFSPROXY_CRYPTO=portable`` in the environment makes this module ignore PyNaCl, as if
it were not installed: the tests, CI's second run and the benchmark use it to run the
pycryptodome routes on a machine that has both. Unset (or ``auto``) means "use PyNaCl
when it imports"; any other value is an error.

Why the hash DRBG stays in Python: obfs4proxy's DRBG is *one* SipHash state that absorbs
every block it outputs and is never reset (erratum 1 below), so block n is SipHash over
all n earlier blocks. libsodium's ``crypto_shorthash_siphash24`` is one-shot (it cannot
resume a state), so it could only re-hash the whole history for every frame: quadratic
(measured: 4 µs a block after 1,000 frames, 0.3 ms after 100,000, 3 ms after a million).
Incremental SipHash in Python costs ~6-7 µs a block (8 SipRounds of 64-bit integers),
and after libsodium that is the largest cost of a frame.

We call pycryptodome and PyNaCl only through their public functions: no underscored
names, no cffi handles. (Calling pycryptodome's ``_raw_api`` C handles directly saved
~3.5 µs per frame, but a private route can change its meaning in any release.)

What a frame costs (Python 3.11 on one core of the shared 2-core test machine; the
figures move by 20-50% with the machine's load): seal or open of 1430 bytes is ~3 µs
through PyNaCl (one C call for the whole box; libsodium recomputes HSalsa20 from the
24-byte nonce each time, which costs less than any way round it from Python), against
~11-14 µs through pycryptodome (one Salsa20 call over 0^32 | packet gives the Poly1305
key and the ciphertext, then one Poly1305). The frame's length mask costs ~6.5 µs
(``HashDrbg.masks`` runs the rounds for a whole write or read in one loop). Handshake
pieces: X25519 ~30-50 µs (PyNaCl) or ~80-130 µs (pycryptodome), a dirty public key
~45 µs (PyNaCl) or ~65 µs (``EccPoint``), of which ~13 µs is the inversion that maps it
to Montgomery form; the inverse map's field power ~40 µs (``Integer``) or ~95 µs
(``pow``); HSalsa20 ~8 µs, the representative's square test ~25 µs (a Jacobi symbol,
not a 255-bit power). A keypair (about two draws) costs ~0.17 ms with PyNaCl, ~0.2 ms
on pycryptodome alone (~0.3 ms with ``EccPoint`` and ``pow``, before these routes).
"""

import hashlib
import hmac
import os
import random
import secrets
import struct

from Crypto.Cipher import Salsa20

# The fast routes (see "Routes" above); each is used only after its import-time self-test.
try:
    from Crypto.Hash.Poly1305 import Poly1305_MAC as _Poly1305_MAC  # private class
except ImportError:
    _Poly1305_MAC = None
try:
    from Crypto.Protocol import DH as _DH  # pycryptodome >= 3.21
except ImportError:
    _DH = None
try:
    from Crypto.Math.Numbers import Integer as _Integer  # obfs3's modexp uses it too
except ImportError:
    _Integer = None

# --------------------------------------------------------------------------------------
# PyNaCl, the optional accelerator, and OBFSPROXY_CRYPTO
# --------------------------------------------------------------------------------------

CRYPTO_ENV = "OBFSPROXY_CRYPTO"


def _use_nacl(environ):
    """False if ``OBFSPROXY_CRYPTO=portable`` (ignore PyNaCl), True if unset or ``auto``;
    any other value is a ValueError (a typo must not silently pick a route)."""
    value = environ.get(CRYPTO_ENV, "").strip().lower()
    if value in ("", "auto"):
        return True
    if value == "portable":
        return False
    raise ValueError("%s=%r: use 'portable' (ignore PyNaCl) or 'auto' (the default)"
                     % (CRYPTO_ENV, environ[CRYPTO_ENV]))


def _import_nacl(use_nacl):
    """(nacl.bindings, nacl.exceptions.CryptoError, None) or (None, (), why not).

    An ImportError is the normal "not installed"; any other exception while importing
    (a broken build, a libsodium that fails to load) also leaves PyNaCl out, and says so."""
    if not use_nacl:
        return None, (), "%s=portable" % CRYPTO_ENV
    try:
        from nacl import bindings
        from nacl.exceptions import CryptoError
    except ImportError:
        return None, (), "PyNaCl is not installed"
    except Exception as exc:  # a broken PyNaCl is a missing one: the routes below fall back
        return None, (), "PyNaCl failed to import (%s: %s)" % (type(exc).__name__, exc)
    return bindings, CryptoError, None


# _nacl is None without PyNaCl; _NaClError is () then, so "except _NaClError" catches nothing.
_nacl, _NaClError, NACL_UNAVAILABLE = _import_nacl(_use_nacl(os.environ))


class KnownAnswerError(RuntimeError):
    """A primitive that has no fallback gave a wrong known answer at import."""


def _gives(function, answers):
    """True if ``function(*args) == expected`` for every (args, expected) in ``answers``.
    Any exception is a failure: what it calls may be missing (None, or an attribute
    gone), take another signature (TypeError) or reject the input (ValueError)."""
    try:
        return all(function(*args) == expected for args, expected in answers)
    except Exception:  # a broken fast route must never stop the program: the next one runs
        return False


def _choose(candidates, proven):
    """(value, route name, [names of the candidates passed over]) for the first of
    ``candidates`` that ``proven(value)`` accepts.

    ``candidates`` are (value, name) pairs, fastest first; a value of None is a route
    whose library is missing (not tried, not reported). The last pair is the fallback,
    used without a test when no other passes (the pure-Python functions, which the
    tests prove). ``proven`` is ``_answers(...)`` or a function of its own."""
    passed_over = []
    for value, name in candidates[:-1]:
        if value is None:
            continue
        if proven(value):
            return value, name, passed_over
        passed_over.append(name)
    value, name = candidates[-1]
    return value, name, passed_over


def _answers(answers):
    """``proven`` for ``_choose``: the candidate function gives every known answer."""
    return lambda function: _gives(function, answers)


# piece -> the routes that failed their known answers at import (for ``route_report``)
_PASSED_OVER = {}

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
    cipher = Salsa20.new(key=hsalsa20(key32, nonce24[:16]), nonce=bytes(nonce24[16:24]))
    return cipher.encrypt(bytes(length))


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
    r = int.from_bytes(key32[:16], "little") & R_CLAMP
    s = int.from_bytes(key32[16:32], "little")
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
    return _Poly1305_MAC(key32[:16], key32[16:32], data).digest()


def _salsa20_xor_pycryptodome(key32, nonce8, data):
    """Salsa20/20(key, nonce) from block 0, XORed with ``data``: pycryptodome's public API."""
    return Salsa20.new(key=key32, nonce=nonce8).encrypt(data)


# RFC 8439 section 2.5.2, and the empty message (whose tag is s itself).
_RFC8439_KEY = bytes.fromhex("85d6be7857556d337f4452fe42d506a80103808afb0db2fd4abff6af4149f51b")
_POLY1305_ANSWERS = [
    ((_RFC8439_KEY, b"Cryptographic Forum Research Group"),
     bytes.fromhex("a8061dc1305136c6c22b8baf0c0127a9")),
    ((_RFC8439_KEY, b""), _RFC8439_KEY[16:]),
]


def _poly1305_route():
    """Poly1305: pycryptodome's raw-key class, else pure Python."""
    return _choose([(_poly1305_pycryptodome if _Poly1305_MAC else None, "pycryptodome Poly1305_MAC"),
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


def _require_salsa20(salsa20_xor):
    """Salsa20 has no fallback (there is no pure-Python Salsa20 here: pycryptodome is a
    dependency), so its known answer does not pick a route, it decides whether we run
    at all: KnownAnswerError unless ``salsa20_xor`` gives every answer."""
    if not _gives(salsa20_xor, _SALSA20_ANSWERS):
        raise KnownAnswerError(
            "pycryptodome's Salsa20 gave a wrong known answer (NaCl's stream3 vector): "
            "refusing to run obfs4 with a broken cipher. Reinstall pycryptodome "
            "(python3 -m pip install --force-reinstall pycryptodome) and try again.")
    return salsa20_xor


_salsa20_xor = _require_salsa20(_salsa20_xor_pycryptodome)
SALSA20_ROUTE = "pycryptodome Salsa20"

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
    """HSalsa20: one seeked pycryptodome Salsa20 block, else pure Python."""
    return _choose([(_hsalsa20_pycryptodome, "pycryptodome Salsa20 seek"), (_hsalsa20_pure, "pure Python")],
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
    if len(box) < TAG_LENGTH:
        raise ValueError("bad tag")
    box = memoryview(box)
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

    * ``_NaClSecretBox``: libsodium's crypto_secretbox, the whole box in one C call;
    * ``_PortableSecretBox``: the HSalsa20 subkey depends only on the key and the
      prefix, so it is computed once per direction; each frame then costs one
      pycryptodome Salsa20 call and one Poly1305.
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


class _PortableSecretBox(SecretBox):
    """pycryptodome's Salsa20 and the Poly1305 route, with the HSalsa20 subkey cached."""

    def __init__(self, key32, nonce_prefix16):
        SecretBox.__init__(self, key32, nonce_prefix16)
        self._subkey = hsalsa20(self._key, self.nonce_prefix)

    def seal(self, counter, packet):
        return _seal(self._subkey, _be64(counter), packet)

    def open_view(self, counter, box):
        return _open(self._subkey, _be64(counter), box)


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
    """secretbox: PyNaCl, else pycryptodome's Salsa20 with the Poly1305 route."""
    portable = "pycryptodome Salsa20 + %s" % (
        "Poly1305_MAC" if poly1305 is _poly1305_pycryptodome else "pure-Python Poly1305")
    return _choose([(_NaClSecretBox if _nacl else None, "PyNaCl crypto_secretbox"),
                    (_PortableSecretBox, portable)], _secretbox_proven)


_SecretBoxRoute, SECRETBOX_ROUTE, _PASSED_OVER["secretbox"] = _secretbox_route()


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


class HashDrbg:
    """obfs4's SipHash-2-4 "OFB" generator, exactly as obfs4proxy runs it (erratum 1).

    One SipHash state keyed with seed[0:16] absorbs every block it outputs and is never
    reset: block n = SipHash(K, o_0 | ... | o_(n-1)). We keep v0..v3 after each absorbed
    block (every input is a whole 8-byte word, so no tail is pending) and finish a copy
    for each digest: O(1) per block.

    ``blocks(count)`` and ``masks(count)`` draw many blocks in one call: each block is
    8 SipRounds that no trick shortens (each needs the last), so the savings are
    Python's: one loop with everything in local variables (~5.5-7 µs a block, against
    ~7-9 through the three helper functions). Blocks are kept as little-endian integers.
    No C library helps here (see "Routes"): this is the largest cost of a frame once
    libsodium seals it."""

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


# --------------------------------------------------------------------------------------
# Field arithmetic mod p = 2^255 - 19
# --------------------------------------------------------------------------------------

P = (1 << 255) - 19
A = 486662                                  # Curve25519: v^2 = u^3 + A u^2 + u
A24 = (A - 2) // 4                          # 121665, the ladder's constant
SQRT_M1 = pow(2, (P - 1) // 4, P)           # sqrt(-1), since 2 is a non-square mod p
HALF_P = (P - 1) // 2                       # field elements above this are "negative"
M255 = (1 << 255) - 1


def _inv(x):
    """1 / x mod p (extended Euclid; ~6x faster than x^(p-2)), and 0 for x = 0 as x^(p-2) gives."""
    x %= P
    return pow(x, -1, P) if x else 0


def _is_square(x):
    """True for a non-zero square mod p: the Jacobi symbol (x / p) is 1.

    Euler's criterion x^((p-1)/2) == 1 says the same with a 255-bit power (~100 µs);
    the Jacobi symbol takes ~30 µs, by reciprocity, as Euclid's algorithm:
        (2 / n) = -1 iff n = 3, 5 mod 8;  (a / n) = -(n / a) iff a = n = 3 mod 4
    Its time depends on x: use it on public values only (a received representative)."""
    a, n, sign = x % P, P, 1
    while a:
        twos = (a & -a).bit_length() - 1
        a >>= twos
        if twos & 1 and n & 7 in (3, 5):
            sign = -sign
        if a & n & 3 == 3:
            sign = -sign
        a, n = n % a, a
    return n == 1 and sign == 1


def _field_pow_pure(x, exponent):
    """x^exponent mod p with Python's pow(): ~95 µs for a 252-bit exponent."""
    return pow(x, exponent, P)


def _field_pow_pycryptodome(x, exponent):
    """x^exponent mod p with pycryptodome's Integer (C: ~40 µs for a 252-bit exponent)."""
    return int(_Integer(x % P).inplace_pow(exponent, P))


def _inv_sqrt(x, power=_field_pow_pure):
    """s with s^2 = 1/x, or None when x is 0 or not a square; one exponentiation.
    Since p = 5 mod 8, c = x^((p-5)/8) gives c^2 x = x^((p-1)/4), a fourth root of 1
    when x is a square: c^2 x = 1 means s = c; c^2 x = -1 means s = c·sqrt(-1);
    anything else (sqrt(-1) or its negative, or 0) means no root. ``power`` is the
    field-power route (``_field_pow``)."""
    c = power(x, (P - 5) // 8)
    check = c * c * x % P
    if check == 1:
        return c
    if check == P - 1:
        return c * SQRT_M1 % P
    return None


def _clamp(scalar32):
    """k[0] &= 248; k[31] &= 127; k[31] |= 64; read little-endian."""
    k = int.from_bytes(scalar32, "little")
    return (k & ~7 & M255) | (1 << 254)


def _u_int(u32):
    """u from 32 bytes: bit 255 ignored, reduced mod p (RFC 7748 section 5)."""
    return (int.from_bytes(u32, "little") & M255) % P


def _bytes32(x):
    return x.to_bytes(32, "little")


# --------------------------------------------------------------------------------------
# X25519 (RFC 7748; obfs4-spec 7.5)
# --------------------------------------------------------------------------------------

X25519_BASE = _bytes32(9)


def _x25519_pure(scalar32, u32):
    """RFC 7748's Montgomery ladder on projective (x : z), one bit of the clamped scalar
    at a time from bit 254 down. Low-order u give 0, i.e. 32 zero bytes. ~2 ms."""
    k = _clamp(scalar32)
    x1 = _u_int(u32)
    x2, z2, x3, z3 = 1, 0, x1, 1
    for t in range(254, -1, -1):
        if (k >> t) & 1:
            x2, z2, x3, z3 = x3, z3, x2, z2
        a, b = x2 + z2, x2 - z2
        aa, bb = a * a % P, b * b % P
        e = aa - bb
        c, d = x3 + z3, x3 - z3
        da, cb = d * a % P, c * b % P
        x3, z3 = (da + cb) ** 2 % P, x1 * (da - cb) ** 2 % P
        x2, z2 = aa * bb % P, e * (aa + A24 * e) % P
        if (k >> t) & 1:
            x2, z2, x3, z3 = x3, z3, x2, z2
    return _bytes32(x2 * _inv(z2) % P)


def _x25519_pycryptodome(scalar32, u32):
    """Crypto.Protocol.DH (pycryptodome >= 3.21): the peer's point times the clamped
    scalar. (Not ``key_agreement``: importing our private key would first compute our
    own public key, a second scalar multiplication, 190 µs against 80.) The import
    refuses low-order u with ValueError and a product at infinity has no x; the
    ladder's answer for both is 0, so that is what we return (obfs4: a failed
    handshake, never a crash)."""
    try:
        point = _DH.import_x25519_public_key(_bytes32(_u_int(u32))).pointQ * _clamp(scalar32)
        return _bytes32(point.x)
    except ValueError:
        return bytes(32)


def _x25519_nacl(scalar32, u32):
    """libsodium's crypto_scalarmult, which clamps the scalar and ignores bit 255 of u
    as RFC 7748 says. It refuses a low-order u (and any all-zero product) with an
    error, where the ladder's answer is 0: so 0 it is, as on the other routes. PyNaCl
    hands the buffers to C unchecked: the lengths are checked here."""
    if len(scalar32) != 32 or len(u32) != 32:
        raise ValueError("X25519 takes a 32-byte scalar and a 32-byte u, not %d and %d"
                         % (len(scalar32), len(u32)))
    try:
        return _nacl.crypto_scalarmult(bytes(scalar32), bytes(u32))
    except RuntimeError:        # nacl.exceptions.RuntimeError: libsodium returned -1
        return bytes(32)


_RFC7748_SCALAR = bytes.fromhex("a546e36bf0527c9d3b16154b82465edd62144c0ac1fc5a18506a2244ba449ac4")
_RFC7748_U = bytes.fromhex("e6db6867583030db3594c1a424b15f7c726624ec26b3353b10a903a6d0ab1c4c")
_RFC7748_OUT = bytes.fromhex("c3da55379de9c6908e94ea4df28d084f32eccf03491c71f754b4075577a28552")
# RFC 7748 section 5.2 (first vector), the same u with bit 255 set (which must be
# ignored), section 6.1's shared secret (Alice's scalar, Bob's public key), and a
# low-order u (0), whose answer is all zeros.
_X25519_ANSWERS = [
    ((_RFC7748_SCALAR, _RFC7748_U), _RFC7748_OUT),
    ((_RFC7748_SCALAR, _RFC7748_U[:31] + bytes([_RFC7748_U[31] | 0x80])), _RFC7748_OUT),
    ((bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"),
      bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")),
     bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")),
    ((bytes(range(32)), bytes(32)), bytes(32)),
]


def _x25519_route():
    """X25519: PyNaCl, else pycryptodome's DH, else the pure ladder."""
    return _choose([(_x25519_nacl if _nacl else None, "PyNaCl crypto_scalarmult"),
                    (_x25519_pycryptodome if _DH else None, "pycryptodome Crypto.Protocol.DH"),
                    (_x25519_pure, "pure Python")], _answers(_X25519_ANSWERS))


x25519, X25519_ROUTE, _PASSED_OVER["X25519"] = _x25519_route()


def x25519_base(scalar32):
    """The public key X25519(k, 9)."""
    return x25519(scalar32, X25519_BASE)


# --------------------------------------------------------------------------------------
# Elligator2, the obfs4proxy 0.0.14 variant (obfs4-spec 7.6)
# --------------------------------------------------------------------------------------

REPRESENTATIVE_LENGTH = 32


def elligator2_direct(representative32):
    """Representative -> u (what the receiver does with every key on the wire):

    1. r = LE(representative) with BOTH top bits of byte 31 cleared (r < 2^254 < p)
    2. w = -A / (1 + 2 r^2)                        (never 0 over 0: -1/2 is a non-square)
    3. u = w if w^3 + A w^2 + w is a non-zero square, else u = -A - w
    r = 0 gives w = -A, whose curve value -A is a non-square, so u = 0."""
    if len(representative32) != REPRESENTATIVE_LENGTH:
        raise ValueError("a representative is 32 bytes, not %d" % len(representative32))
    r = int.from_bytes(representative32, "little") & ((1 << 254) - 1)
    w = -A * _inv(1 + 2 * r * r) % P
    value = w * (w * w + A * w + 1) % P
    u = w if value != 0 and _is_square(value) else (-A - w) % P
    return _bytes32(u)


def elligator2_inverse(u32, tweak):
    """u -> representative, or None when u has none (about half of all u):

    1. t = -2 u (u + A); no representative if t = 0 or t is not a square
    2. s = 1 / sqrt(t)                           (either root: step 4 fixes the sign)
    3. r = u s if tweak & 1 == 0, else r = (u + A) s
    4. if r > (p - 1) / 2: r = p - r
    5. 32 bytes little-endian (top two bits 0), byte 31 |= tweak & 0xC0.

    Key generation runs this about twice per keypair; the exponentiation of step 2 is
    most of its cost, so it goes through the field-power route (``ELLIGATOR2_ROUTE``)."""
    return _elligator2_inverse(u32, tweak, _field_pow)


def _elligator2_inverse(u32, tweak, power):
    u = _u_int(u32)
    s = _inv_sqrt(-2 * u * (u + A) % P, power)
    if s is None:
        return None
    r = (u if tweak & 1 == 0 else u + A) * s % P
    if r > HALF_P:
        r = P - r
    out = bytearray(_bytes32(r))
    out[31] |= tweak & 0xC0
    return bytes(out)


# obfs4-elligator2.json's inverse_map: two u with both formulas of step 3 (tweak bit 0)
# and top bits, and a u without a representative (None).
_ELLIGATOR2_ANSWERS = [((bytes.fromhex(u), tweak), r and bytes.fromhex(r)) for u, tweak, r in (
    ("242ae39ef158ed60f20b89396d7d7eef5374aba15dc312a6aea6d1e57cacf85e", 0x00,
     "53ac376d482ecf2e086eafecf7884c0a60beeca18a1f154e6e9829a632436c0e"),
    ("242ae39ef158ed60f20b89396d7d7eef5374aba15dc312a6aea6d1e57cacf85e", 0x81,
     "673a505e107189ee54ca93310ac42e4545e9e59050aaac6f8b5f64295c8ec0af"),
    ("696f341266c64bcfa7afa834f8c34b2730be11c932e08474d1a22f26ed82410b", 0x00,
     "922688fa428d42bc1fa8806998fbc5959ae801817e85a42a45e8ec25a0d7541a"),
    ("696f341266c64bcfa7afa834f8c34b2730be11c932e08474d1a22f26ed82410b", 0x01,
     "d828b3b651927661a4698315d4f04d339652baa1e169799178371eead15f803a"),
    ("0300000000000000000000000000000000000000000000000000000000000000", 0x00, None))]


def _elligator2_route():
    """The field power of Elligator2's inverse map: pycryptodome's Integer, else pow(),
    each proven through the whole map on the vectors."""
    name = "pycryptodome Integer (%s)" % getattr(_Integer, "__name__", "missing")
    return _choose([(_field_pow_pycryptodome if _Integer else None, name), (_field_pow_pure, "pure Python")],
                   lambda power: _gives(lambda u32, tweak: _elligator2_inverse(u32, tweak, power),
                                        _ELLIGATOR2_ANSWERS))


_field_pow, ELLIGATOR2_ROUTE, _PASSED_OVER["Elligator2"] = _elligator2_route()


# --------------------------------------------------------------------------------------
# edwards25519 and the "dirty" public key (obfs4-spec 2.2, 7.6)
# --------------------------------------------------------------------------------------

D = -121665 * _inv(121666) % P              # edwards25519: -x^2 + y^2 = 1 + d x^2 y^2
ED_GY = 4 * _inv(5) % P                     # the base point: y = 4/5, x the even root
ED_GX = 0x216936D3CD6E53FEC0A4E231FDD6DC5C692CC7609525A7B2C9562D608F25D51A
# obfs4proxy's (edwards25519-extra's) point of order 8, "lop" = low-order point.
LOP_X = 0x1FD5B9A006394A28E933993238DE4ABB5C193C7013E5E238DEA14646C545D14A
LOP_Y = 0x05FC536D880238B13933C6D305ACDFD5F098EFF289F4C345B027B2C28F95E826
# T[i] for i = priv[0] & 7, in obfs4proxy's order.
TORSION = [(0, 1), (LOP_X, LOP_Y), (SQRT_M1, 0), (LOP_X, P - LOP_Y),
           (0, P - 1), (P - LOP_X, P - LOP_Y), (P - SQRT_M1, 0), (P - LOP_X, LOP_Y)]


def _u_from_edwards(y, z=1):
    """Montgomery u of the Edwards point with affine y = Y/Z: u = (1 + y)/(1 - y) = (Z + Y)/(Z - Y)."""
    return (z + y) * _inv(z - y) % P


def _ed_add(p1, p2):
    """Extended coordinates (X : Y : Z : T), x = X/Z, y = Y/Z, x·y = T/Z; the unified
    addition for a = -1 (Hisil-Wong-Carter-Dawson 2008), complete on edwards25519:
    A = (Y1-X1)(Y2-X2), B = (Y1+X1)(Y2+X2), C = 2d T1 T2, D = 2 Z1 Z2,
    E = B-A, F = D-C, G = D+C, H = B+A;  (X3, Y3, Z3, T3) = (EF, GH, FG, EH)."""
    x1, y1, z1, t1 = p1
    x2, y2, z2, t2 = p2
    a = (y1 - x1) * (y2 - x2) % P
    b = (y1 + x1) * (y2 + x2) % P
    c = 2 * D * t1 * t2 % P
    d = 2 * z1 * z2 % P
    e, f, g, h = b - a, d - c, d + c, b + a
    return e * f % P, g * h % P, f * g % P, e * h % P


def _ed_point(x, y):
    return x, y, 1, x * y % P


def _ed_mul(point, k):
    """k·point by double-and-add from the top bit (not constant-time; see the docstring)."""
    result = (0, 1, 1, 0)
    for bit in bin(k)[2:]:
        result = _ed_add(result, result)
        if bit == "1":
            result = _ed_add(result, point)
    return result


_ED_BASE = _ed_point(ED_GX, ED_GY)
_ED_TORSION = [_ed_point(x, y) for x, y in TORSION]


def _dirty_u_pure(priv32):
    """u of clamp(priv)·G + T[priv[0] & 7], with plain-Python extended coordinates."""
    point = _ed_add(_ed_mul(_ED_BASE, _clamp(priv32)), _ED_TORSION[priv32[0] & 7])
    return _bytes32(_u_from_edwards(point[1], point[2]))


def _make_dirty_u_pycryptodome():
    """The same with pycryptodome's public EccPoint on "Ed25519" (>= 3.15)."""
    from Crypto.PublicKey.ECC import EccPoint
    base = EccPoint(ED_GX, ED_GY, curve="Ed25519")
    torsion = [EccPoint(x, y, curve="Ed25519") for x, y in TORSION]

    def _dirty_u_pycryptodome(priv32):
        """u of clamp(priv)·G + T[priv[0] & 7], with pycryptodome's EccPoint."""
        point = base * _clamp(priv32) + torsion[priv32[0] & 7]
        return _bytes32(_u_from_edwards(int(point.y)))
    return _dirty_u_pycryptodome


def _dirty_u_unavailable(priv32):
    raise RuntimeError("pycryptodome's Ed25519 EccPoint is not available")


try:
    _dirty_u_pycryptodome = _make_dirty_u_pycryptodome()
except Exception:  # too old or changed: the self-test below then picks the next route
    _dirty_u_pycryptodome = _dirty_u_unavailable


def _ed_encode(x, y):
    """An edwards25519 point as RFC 8032 (and libsodium) encodes it: y little-endian,
    with x mod 2 in bit 255."""
    return (y | (x & 1) << 255).to_bytes(32, "little")


_TORSION_ENCODED = [_ed_encode(x, y) for x, y in TORSION]


def _dirty_u_nacl(priv32):
    """u of clamp(priv)·G + T[priv[0] & 7] with libsodium:

        E = crypto_scalarmult_ed25519_base(clamp(priv))   (constant time; it clamps
                                                          again, which changes nothing)
        E = crypto_core_ed25519_add(E, T[i])             for i = priv[0] & 7 != 0
        u = (1 + y) / (1 - y)                            y = E's encoding, bit 255 cleared

    We pass the clamped scalar, not priv: libsodium refuses an all-zero input, and
    clamp(priv) (between 2^254 and 2^255) is never 0 nor a multiple of the group order."""
    point = _nacl.crypto_scalarmult_ed25519_base(_bytes32(_clamp(priv32)))
    index = priv32[0] & 7
    if index:
        point = _nacl.crypto_core_ed25519_add(point, _TORSION_ENCODED[index])
    return _bytes32(_u_from_edwards(int.from_bytes(point, "little") & M255))


# The dirty keys of obfs4-elligator2.json's dirty_keypairs: one for each torsion index
# 0..7 (in this order), so that every torsion point is proven.
_EDWARDS_ANSWERS = [((bytes.fromhex(priv),), bytes.fromhex(u)) for priv, u in (
    ("b81ef6327d03a6f88c00609864ecb20274788613c6d3a2fb4623bbcc7c02cc75",
     "d9cd8e229ba9e3414c56b7e66f58cc6c0680ac60b343c71822b59eaf78c03722"),
    ("919f82e84ea4eb467154f12e5f8333e1eaf851f39500344a3dd71946d70c4842",
     "dec70317a984828717c549ffe65de813732f68c9242994287c33fe81a420a411"),
    ("22be2d7ff2da6bc1367cd9cea21e8e6d7c382e87360c1cac21da91171d152c15",
     "3feb1ccde0cab3e12f2c27795edb8bebaefebf90a29bdc3ea9994efb78083105"),
    ("5b7cd72d6fea3d15d09b052599feb763060cb7c8d4aef4ae62ac5586f8ccc954",
     "e1e6081b5abcede15fb0b7538b5acdab766ecccc0c76aef24efb3016d4956505"),
    ("dc6d0ee8aceed348525776c7c364e3224ef7e04fc4be6d407a5bac40fa18e727",
     "a1325741f5b21d4e7b7bc4e026c1e684dbe3b9c818dafe518e728e6c7fa5ba67"),
    ("9d3399c25c376e0d5baac55ef5166d88a97defe58995f0b31fb69c481921594e",
     "08a903dc1acb53c887d8a254ac71910a3ec1980c434ff39784e60edbfebf7b29"),
    ("0e6e1a626321cbd0d12971b1770b7fcd170e47007b0002980d054739d5deaaba",
     "7f06da6076bf15e04b82fb281e709a5418ab3db01e259c648fb146af6ebe1e04"),
    ("df1c089cc98282ba9c1b23338715f6ab1ffef0ab605e1f320b2271cc3d49e932",
     "df035ae1494d7c550bd5d896372f8df941a85b7dc2d8dd85961e80d7abdef370"))]


def _edwards_route():
    """The dirty key's Edwards work: PyNaCl, else pycryptodome's EccPoint, else pure Python."""
    return _choose([(_dirty_u_nacl if _nacl else None, "PyNaCl crypto_scalarmult_ed25519_base"),
                    (None if _dirty_u_pycryptodome is _dirty_u_unavailable else _dirty_u_pycryptodome,
                     "pycryptodome EccPoint"),
                    (_dirty_u_pure, "pure Python")], _answers(_EDWARDS_ANSWERS))


_dirty_u, EDWARDS_ROUTE, _PASSED_OVER["edwards25519"] = _edwards_route()


def dirty_public_key(priv32):
    """The public key obfs4proxy 0.0.14 puts behind its representatives: the Montgomery u
    of clamp(priv)·G + T[priv[0] & 7]. ``priv32`` is the unclamped private key; its low
    three bits pick the torsion point, which X25519 with it ignores (the peer's clamped
    scalar is a multiple of 8)."""
    if len(priv32) != 32:
        raise ValueError("a private key is 32 bytes, not %d" % len(priv32))
    return _dirty_u(priv32)


def generate_keypair(randbytes=os.urandom):
    """(priv32, u32, representative32) by obfs4proxy's rejection loop:
    d = SHA-512(randbytes(32)); priv = d[0:32]; tweak = d[63]; u = dirty_public_key(priv);
    r = elligator2_inverse(u, tweak); draw again while r is None (about 1 in 2)."""
    while True:
        digest = hashlib.sha512(randbytes(32)).digest()
        priv, tweak = digest[:32], digest[63]
        u = dirty_public_key(priv)
        representative = elligator2_inverse(u, tweak)
        if representative is not None:
            return priv, u, representative


# --------------------------------------------------------------------------------------
# The route report
# --------------------------------------------------------------------------------------

DRBG_ROUTE = "pure Python"      # always: no library has an incremental SipHash (see "Routes")


def routes():
    """{piece: route} for every piece obfs4 runs, as chosen at import, e.g.
    {"secretbox": "PyNaCl crypto_secretbox", ..., "hash DRBG": "pure Python"}.
    Poly1305, HSalsa20 and Salsa20 are the portable secretbox's parts (and HSalsa20
    serves ``xsalsa20_keystream``); obfs3's modexp is reported by obfs3.MODEXP_ROUTE."""
    return {"secretbox": SECRETBOX_ROUTE, "X25519": X25519_ROUTE, "edwards25519": EDWARDS_ROUTE,
            "Elligator2": ELLIGATOR2_ROUTE, "hash DRBG": DRBG_ROUTE, "Poly1305": POLY1305_ROUTE,
            "HSalsa20": HSALSA20_ROUTE, "Salsa20": SALSA20_ROUTE}


def pure_python_routes():
    """The pieces in use that fell back to pure Python although a C route exists, for a
    one-time warning (slower, and not constant time): e.g. ["X25519"] when neither
    PyNaCl nor pycryptodome >= 3.21 is there. Poly1305 and HSalsa20 count only when
    the portable secretbox runs. Not listed, because no install changes it: the hash
    DRBG, which is Python by design (see "Routes")."""
    pieces = ["X25519", "edwards25519", "Elligator2"]
    if _SecretBoxRoute is _PortableSecretBox:
        pieces = ["Poly1305", "HSalsa20"] + pieces
    chosen = routes()
    return [piece for piece in pieces if chosen[piece] == "pure Python"]


def route_report():
    """One line naming every route (for the startup log and ``python3 -c``), with why a
    faster route was passed over: PyNaCl missing or ignored, or a known answer failed."""
    parts = []
    for piece, route in routes().items():
        failed = _PASSED_OVER.get(piece)
        parts.append("%s: %s%s" % (piece, route, " (%s failed its known answer)" % ", ".join(failed)
                                   if failed else ""))
    if NACL_UNAVAILABLE:
        parts.append("PyNaCl not used: %s" % NACL_UNAVAILABLE)
    return "; ".join(parts)
