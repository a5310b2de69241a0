"""cryptoroutes/libsodium.py: the system's libsodium through ``ctypes``, with no package.

libsodium is the library PyNaCl wraps; many systems carry it without PyNaCl (Debian's
``libsodium23``, which vim, qemu and others depend on). Through ``ctypes`` it gives
every route the PyNaCl route gives, and the secretbox's parts one by one:

=====================  ===========================================  =====================
here                   libsodium                                    obfs4 uses it for
=====================  ===========================================  =====================
``SecretBox``          ``crypto_secretbox_easy`` /                  every frame
                       ``crypto_secretbox_open_easy``
``x25519``             ``crypto_scalarmult``                        ntor
``ed25519_base``,      ``crypto_scalarmult_ed25519_base``,          the dirty public key
``ed25519_add``        ``crypto_core_ed25519_add``                  of each keypair
``salsa20_xor``        ``crypto_stream_salsa20_xor_ic``             the portable secretbox
``hsalsa20``           ``crypto_core_hsalsa20``                     (once per direction)
``poly1305``           ``crypto_onetimeauth_poly1305``
=====================  ===========================================  =====================

SipHash is not offered: libsodium's ``crypto_shorthash_siphash24`` is one-shot, and
obfs4's DRBG needs a stream (obfs4_drbg.py says why).

Nothing here is trusted: chooser.py and the modules that use these functions run each
against known answers before any transport does. ``load()`` finds the library
(syslib.py: platform names, then ``ctypes.util.find_library``), calls ``sodium_init``
(which must come first, and is safe to call again), and binds the functions; a missing
one leaves that route None. Every length is a byte length (syslib.readable).
"""

import ctypes

from cryptoroutes import syslib

_c_int, _c_ulonglong, _c_uint64 = ctypes.c_int, ctypes.c_ulonglong, ctypes.c_uint64
_c_char_p, _c_void_p = ctypes.c_char_p, ctypes.c_void_p
_buffer = ctypes.create_string_buffer
readable = syslib.readable

KEY, NONCE, MAC = 32, 24, 16


class Bindings:
    """The functions used here, bound to one libsodium (attributes None where missing)."""

    def __init__(self, lib, name):
        self.lib, self.name = lib, name
        b = syslib.bind
        version = b(lib, "sodium_version_string", _c_char_p)
        self.version = "libsodium %s" % (version().decode("ascii", "replace") if version else "?")
        self.secretbox_easy = b(lib, "crypto_secretbox_easy", _c_int, _c_void_p, _c_void_p, _c_ulonglong,
                                _c_char_p, _c_char_p)
        self.secretbox_open_easy = b(lib, "crypto_secretbox_open_easy", _c_int, _c_void_p, _c_void_p,
                                     _c_ulonglong, _c_char_p, _c_char_p)
        self.scalarmult = b(lib, "crypto_scalarmult", _c_int, _c_void_p, _c_char_p, _c_char_p)
        self.ed25519_base = b(lib, "crypto_scalarmult_ed25519_base", _c_int, _c_void_p, _c_char_p)
        self.ed25519_add = b(lib, "crypto_core_ed25519_add", _c_int, _c_void_p, _c_char_p, _c_char_p)
        self.stream_salsa20_xor_ic = b(lib, "crypto_stream_salsa20_xor_ic", _c_int, _c_void_p, _c_void_p,
                                       _c_ulonglong, _c_char_p, _c_uint64, _c_char_p)
        self.core_hsalsa20 = b(lib, "crypto_core_hsalsa20", _c_int, _c_void_p, _c_char_p, _c_char_p,
                               _c_char_p)
        self.onetimeauth_poly1305 = b(lib, "crypto_onetimeauth_poly1305", _c_int, _c_void_p, _c_void_p,
                                      _c_ulonglong, _c_char_p)
        # on addresses (framebox.py)
        self.onetimeauth_on_addresses = syslib.bind_own(lib, "crypto_onetimeauth_poly1305", _c_int, _c_void_p,
                                                        _c_void_p, _c_ulonglong, _c_void_p)


def load():
    """(Bindings, None) or (None, why not). ``sodium_init`` returns 0 the first time, 1
    when already done, -1 when libsodium cannot run (no entropy source)."""
    lib, name, why = syslib.load("libsodium", "sodium_init")
    if lib is None:
        return None, why
    init = syslib.bind(lib, "sodium_init", _c_int)
    if init() < 0:
        return None, "libsodium (%s): sodium_init failed" % name
    return Bindings(lib, name), None


def _check(what, got, want):
    if got != want:
        raise ValueError("%s takes %d bytes, not %d" % (what, want, got))


def make_secretbox(bindings):
    """(seal, open) over crypto_secretbox_easy, or None: ``seal(message, nonce24,
    key32)`` -> tag | ciphertext; ``open(box, nonce24, key32)`` -> the message, or
    ValueError("bad tag") (a forged, damaged or short box)."""
    seal_c, open_c = bindings.secretbox_easy, bindings.secretbox_open_easy
    if not (seal_c and open_c):
        return None

    def seal(message, nonce24, key32):
        """XSalsa20-Poly1305 with the tag first, as Go's and NaCl's secretbox."""
        _check("a secretbox nonce", len(nonce24), NONCE)
        _check("a secretbox key", len(key32), KEY)
        source, size = readable(message)
        out = _buffer(size + MAC)
        if seal_c(out, source, size, nonce24, key32) != 0:
            raise ValueError("crypto_secretbox_easy failed")
        return out.raw

    def open_box(box, nonce24, key32):
        """The message in ``box`` (tag | ciphertext), or ValueError("bad tag")."""
        _check("a secretbox nonce", len(nonce24), NONCE)
        _check("a secretbox key", len(key32), KEY)
        source, size = readable(box)
        if size < MAC:
            raise ValueError("bad tag")
        out = _buffer(size - MAC or 1)
        if open_c(out, source, size, nonce24, key32) != 0:
            raise ValueError("bad tag")
        return out.raw[:size - MAC]

    return seal, open_box


def make_x25519(bindings):
    """x25519(scalar32, u32) -> 32 bytes with crypto_scalarmult, or None. libsodium
    clamps the scalar and ignores bit 255 of u; it refuses (-1) only an all-zero
    product, which a low-order u gives: that is the ladder's answer, 32 zero bytes, as
    on every route."""
    scalarmult = bindings.scalarmult
    if scalarmult is None:
        return None

    def x25519(scalar32, u32):
        """X25519(k, u) (RFC 7748) through libsodium."""
        if len(scalar32) != 32 or len(u32) != 32:
            raise ValueError("X25519 takes a 32-byte scalar and a 32-byte u, not %d and %d"
                             % (len(scalar32), len(u32)))
        out = _buffer(32)
        if scalarmult(out, bytes(scalar32), bytes(u32)) != 0:
            return bytes(32)
        return out.raw
    return x25519


def make_ed25519(bindings):
    """(base, add) or None: ``base(scalar32)`` -> the encoded point scalar·G
    (crypto_scalarmult_ed25519_base: it clamps, and refuses 0); ``add(p, q)`` -> the
    encoded sum (crypto_core_ed25519_add: refuses an invalid point). A refusal is
    ValueError."""
    base_c, add_c = bindings.ed25519_base, bindings.ed25519_add
    if not (base_c and add_c):
        return None

    def base(scalar32):
        _check("an Ed25519 scalar", len(scalar32), 32)
        out = _buffer(32)
        if base_c(out, bytes(scalar32)) != 0:
            raise ValueError("crypto_scalarmult_ed25519_base refused the scalar")
        return out.raw

    def add(p, q):
        _check("an Ed25519 point", len(p), 32)
        _check("an Ed25519 point", len(q), 32)
        out = _buffer(32)
        if add_c(out, bytes(p), bytes(q)) != 0:
            raise ValueError("crypto_core_ed25519_add refused a point")
        return out.raw
    return base, add


def make_salsa20_xor(bindings):
    """salsa20_xor(key32, nonce8, data) -> bytes, Salsa20/20 from block 0 XOR data
    (crypto_stream_salsa20_xor_ic), or None."""
    xor_ic = bindings.stream_salsa20_xor_ic
    if xor_ic is None:
        return None

    def salsa20_xor(key32, nonce8, data):
        _check("a Salsa20 key", len(key32), 32)
        _check("a Salsa20 nonce", len(nonce8), 8)
        source, size = readable(data)
        out = _buffer(size or 1)
        if xor_ic(out, source, size, bytes(nonce8), 0, bytes(key32)) != 0:
            raise ValueError("crypto_stream_salsa20_xor_ic failed")
        return out.raw[:size]
    return salsa20_xor


def make_hsalsa20(bindings):
    """hsalsa20(key32, input16) -> 32 bytes (crypto_core_hsalsa20, NaCl's constants), or None."""
    core = bindings.core_hsalsa20
    if core is None:
        return None

    def hsalsa20(key32, input16):
        _check("an HSalsa20 key", len(key32), 32)
        _check("an HSalsa20 input", len(input16), 16)
        out = _buffer(32)
        if core(out, bytes(input16), bytes(key32), None) != 0:
            raise ValueError("crypto_core_hsalsa20 failed")
        return out.raw
    return hsalsa20


def make_poly1305(bindings):
    """poly1305(key32, data) -> 16-byte tag (crypto_onetimeauth_poly1305), or None."""
    onetimeauth = bindings.onetimeauth_poly1305
    if onetimeauth is None:
        return None

    def poly1305(key32, data):
        _check("a Poly1305 key", len(key32), 32)
        source, size = readable(data)
        out = _buffer(16)
        if onetimeauth(out, source, size, bytes(key32)) != 0:
            raise ValueError("crypto_onetimeauth_poly1305 failed")
        return out.raw
    return poly1305


def make_salsa20_keyed(bindings):
    """keyed(key32) -> crypt(nonce8, size, dst, src), or None: as nettle.py's (one C
    call per frame here, which takes the key each time), for cryptoroutes/framebox.py."""
    xor_ic = bindings.stream_salsa20_xor_ic
    if xor_ic is None:
        return None

    def keyed(key32):
        _check("a Salsa20 key", len(key32), 32)
        key = bytes(key32)

        def crypt(nonce8, size, dst, src):
            if xor_ic(dst, src, size, nonce8, 0, key) != 0:
                raise ValueError("crypto_stream_salsa20_xor_ic failed")
        return crypt
    return keyed


def make_poly1305_context(bindings):
    """new() -> mac(key_address, data_address, size, tag_address), or None: one
    crypto_onetimeauth_poly1305 call on addresses (libsodium keeps no context), for
    cryptoroutes/framebox.py."""
    onetimeauth = bindings.onetimeauth_on_addresses
    if onetimeauth is None:
        return None

    def new():
        def mac(key_address, data_address, size, tag_address):
            if onetimeauth(tag_address, data_address, size, key_address) != 0:
                raise ValueError("crypto_onetimeauth_poly1305 failed")
        return mac
    return new
