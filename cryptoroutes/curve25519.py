r"""cryptoroutes/curve25519.py: obfs4's keys: X25519, the "dirty" public keys of obfs4proxy 0.0.14, and
Elligator2 in its exact variant, so that public keys on the wire look like uniformly
random bytes (obfs4-spec 2.2, 7.5, 7.6).

* Elligator2 hides that the first 32 bytes are a curve point. A censor that maps a
  representative back to ``u`` could still test whether the point lies in the prime-order
  subgroup (every honest X25519 key does), which is why obfs4proxy 0.0.14 adds a random
  low-order point (the "dirty" key below). Half of all keys have no representative: key
  generation is a rejection loop, run *before* a connection so its time does not show
  (the listener's pools, pool.py).
* Python integers are not constant-time. The pure-Python fallbacks (used only when
  neither PyNaCl nor the installed pycryptodome has a fast route) leak timing to a
  local observer; against a network censor that is the same trade every Python obfs
  implementation makes. The Elligator2 maps are Python around one field power
  (pycryptodome's, when it passes).

Nothing here does I/O, keeps a clock, or logs. The randomness of ``generate_keypair`` is
injectable, so known-answer vectors replay byte for byte.

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
Elligator2: 0.0.14 maps a representative after masking **both** top bits, and sets the
two top bits of its own representatives from ``tweak & 0xC0``; its public keys carry a
torsion term chosen by the *unclamped* low bits of the private key (versions up to
0.0.13 clamped first, so the term was always the identity).

Routes (chooser.py says how each is chosen)
-----------------------------------------
=============  ==========================================  ====================================
piece          candidates, fastest first                   used for
=============  ==========================================  ====================================
X25519         PyNaCl ``crypto_scalarmult``;               ntor: two per handshake and side
               libsodium ``crypto_scalarmult`` (ctypes);
               libcrypto ``EVP_PKEY_derive`` (ctypes);
               pycryptodome ``Crypto.Protocol.DH``;
               pure Python
edwards25519   PyNaCl ``crypto_scalarmult_ed25519_base``   ``dirty_public_key``: about two per
               + ``crypto_core_ed25519_add``;              keypair (the rejection loop)
               the same from libsodium (ctypes);
               pycryptodome ``EccPoint``; pure Python
Elligator2     the field power of the inverse map:         ``elligator2_inverse``: about two
               libcrypto ``BN_mod_exp_mont_consttime``;    per keypair
               pycryptodome ``Integer``; pure ``pow``
=============  ==========================================  ====================================

What a keypair costs (Python 3.11 on one core of the shared 2-core test machine; the
figures move by 20-50% with the machine's load): X25519 ~30-50 µs (PyNaCl) or ~80-130
µs (pycryptodome), a dirty public key ~45 µs (PyNaCl) or ~65 µs (``EccPoint``), of which
~13 µs is the inversion that maps it to Montgomery form; the inverse map's field power
~40 µs (``Integer``) or ~95 µs (``pow``); the representative's square test ~25 µs (a
Jacobi symbol, not a 255-bit power). A keypair (about two draws) costs ~0.17 ms with
PyNaCl, ~0.2 ms on pycryptodome alone.
"""

import hashlib
import os

from cryptoroutes import chooser

chooser.check_setting()     # a bad OBFSPROXY_CRYPTO stops here, in one line

# The route chooser (chooser.py), by the names the code below uses.
_nacl, _NaClError, _PASSED_OVER = chooser.nacl, chooser.NaClError, chooser.PASSED_OVER
_choose, _answers, _gives = chooser.choose, chooser.answers, chooser.gives
_DH, _Integer, _lib_x25519 = chooser.DH, chooser.Integer, chooser.lib_x25519

# --------------------------------------------------------------------------------------
# Field arithmetic mod p = 2^255 - 19
# --------------------------------------------------------------------------------------

P = (1 << 255) - 19
A = 486662                                  # Curve25519: v^2 = u^3 + A u^2 + u
A24 = (A - 2) // 4                          # 121665, the ladder's constant
SQRT_M1 = pow(2, (P - 1) // 4, P)           # sqrt(-1), since 2 is a non-square mod p
HALF_P = (P - 1) // 2                       # field elements above this are "negative"
M255 = (1 << 255) - 1


def _inv_euclid(x):
    """1 / x mod p by pow(x, -1, p) (extended Euclid, Python 3.8 and newer; ~6x faster
    than x^(p-2)), and 0 for x = 0 as x^(p-2) gives."""
    x %= P
    return pow(x, -1, P) if x else 0  # novermin (used only where pow() takes -1: _pow_takes_inverse)


def _inv_fermat(x):
    """1 / x mod p as x^(p-2) (Fermat), for Pythons whose pow() takes no negative
    exponent (3.6, 3.7); 0 for x = 0."""
    return pow(x % P, P - 2, P)


def _pow_takes_inverse():
    try:
        return pow(3, -1, 7) == 5  # novermin (the probe: 3.7 and older raise)
    except (TypeError, ValueError):     # 3.7 and older: "cannot be negative when 3rd argument specified"
        return False


_inv = _inv_euclid if _pow_takes_inverse() else _inv_fermat


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
    """X25519: PyNaCl, else the system's libsodium through ctypes (the same C), else
    libcrypto's (~100 µs with its EVP_PKEY set-up, where pycryptodome's DH takes ~150),
    else pycryptodome's DH, else the pure ladder."""
    return _choose([(_x25519_nacl if _nacl else None, "PyNaCl crypto_scalarmult"),
                    (chooser.sodium_x25519, "libsodium crypto_scalarmult"),
                    (_lib_x25519, "libcrypto EVP_PKEY_derive"),
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


def _field_pow_libcrypto(x, exponent):
    """x^exponent mod p with libcrypto's BN_mod_exp_mont_consttime (~40 µs through ctypes
    where pycryptodome's Integer takes ~60 and pow() ~160, measured in one run)."""
    return chooser.lib_modexp(x, exponent, P)


def _elligator2_route():
    """The field power of Elligator2's inverse map: libcrypto's, else pycryptodome's
    Integer, else pow(), each proven through the whole map on the vectors."""
    name = "pycryptodome Integer (%s)" % getattr(_Integer, "__name__", "missing")
    libcrypto = _field_pow_libcrypto if chooser.lib_modexp else None
    return _choose([(libcrypto, "libcrypto BN_mod_exp_mont_consttime"),
                    (_field_pow_pycryptodome if _Integer else None, name), (_field_pow_pure, "pure Python")],
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
    EccPoint = chooser.pycryptodome("PublicKey.ECC", "EccPoint")
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


def _make_dirty_u_sodium(ed25519):
    """``_dirty_u_nacl``'s two steps on the system's libsodium through ctypes
    (chooser.sodium_ed25519: base and add)."""
    base, add = ed25519

    def _dirty_u_sodium(priv32):
        """u of clamp(priv)·G + T[priv[0] & 7], libsodium through ctypes."""
        point = base(_bytes32(_clamp(priv32)))
        index = priv32[0] & 7
        if index:
            point = add(point, _TORSION_ENCODED[index])
        return _bytes32(_u_from_edwards(int.from_bytes(point, "little") & M255))
    return _dirty_u_sodium


_dirty_u_sodium = _make_dirty_u_sodium(chooser.sodium_ed25519) if chooser.sodium_ed25519 else None


def _edwards_route():
    """The dirty key's Edwards work: PyNaCl, else the system's libsodium through ctypes,
    else pycryptodome's EccPoint, else pure Python."""
    return _choose([(_dirty_u_nacl if _nacl else None, "PyNaCl crypto_scalarmult_ed25519_base"),
                    (_dirty_u_sodium, "libsodium crypto_scalarmult_ed25519_base"),
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
