"""cryptoroutes/libcrypto.py: OpenSSL's libcrypto through ``ctypes``, with no compiler and no package.

Python's own ``ssl`` and ``hashlib`` modules are linked against a libcrypto, so wherever
Python can speak TLS that library is on the machine; ``ctypes`` (standard library) can
call it. This module finds it, binds the few functions the transports need, and offers
them as small objects. It proves nothing itself: cryptoroutes/chooser.py runs each one against known
answers before any transport uses it, and a missing or wrong one is passed over.

Where the library is (``find``), best first:

1. the file of the ``_ssl`` (then ``_hashlib``) extension module: on Linux and macOS,
   ``ctypes.CDLL`` on it resolves the ``EVP_*`` names through its dependencies, so we
   get exactly the libcrypto Python itself runs;
2. on Windows, python.org builds ship ``libcrypto-*.dll`` beside ``_ssl.pyd``: opened
   by its full name;
3. ``ctypes.util.find_library("crypto")``, the system's.

What it offers (each None when the library or the name is missing; OpenSSL >= 1.1.1):

=================  ===========================================  ===========================
``AesCtr``         AES-128/192/256-CTR, ``EVP_EncryptUpdate``    obfs2, obfs3: every byte
``x25519``         ``EVP_PKEY_derive`` on two raw X25519 keys    obfs4's ntor
``poly1305``       ``EVP_Q_mac("POLY1305")`` (OpenSSL 3)        the portable secretbox
(its context)      ``EVP_MAC("POLY1305")``, one context per     framebox.py's frames
                   direction, called on addresses
``SipHashStream``  ``EVP_MAC("SIPHASH")`` with ``EVP_MAC_CTX_dup``  obfs4's length DRBG
                   (OpenSSL 3): a streaming SipHash
``modexp``         ``BN_mod_exp_mont_consttime``                obfs3's UniformDH,
                                                                Elligator2's field power
=================  ===========================================  ===========================

Measured against the other routes in one run (Python 3.11, OpenSSL 3.0, one core of
a shared 2-core machine; each cryptoroutes/chooser.py table puts the fastest first): AES-CTR set-up
~5 µs (pycryptodome ~11), 64 KiB in place ~6 GB/s (pycryptodome ~2.7); X25519 ~100-170
µs with its EVP_PKEY set-up (pycryptodome ~155-260, PyNaCl ~50); Poly1305 of a frame
~8 µs (pycryptodome ~35); a DRBG block ~3.5 µs in a batch (Python ~11); obfs3's
1536-bit power ~1.1 ms (pycryptodome ~1.8, pow() ~11).

Every native object is freed: a context that lives with a Python object is freed by a
``weakref.finalize`` when the object goes (``_live`` counts them, and the tests prove
it returns to where it was); the one-shot calls free theirs before they
return, failure or not. Errors are cleared from OpenSSL's per-thread queue.
"""

import ctypes
import ctypes.util
import glob
import os
import sys
import weakref

from cryptoroutes import syslib

_c_int, _c_size_t, _c_void_p, _c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
_live = [0]     # native contexts still owned by a Python object (the tests read it)


def library_files(platform=sys.platform):
    """The candidate libcrypto files, best first (see the module docstring)."""
    files = []
    for name in ("_ssl", "_hashlib"):
        try:
            path = getattr(__import__(name), "__file__", None)
        except ImportError:
            continue
        if not path:
            continue        # built into the interpreter: no file to open
        if platform == "win32":
            files.extend(sorted(glob.glob(os.path.join(os.path.dirname(path), "libcrypto*.dll")),
                                reverse=True))
        else:
            files.append(path)
    system = ctypes.util.find_library("crypto") or ctypes.util.find_library("libcrypto")
    if system and not (platform == "darwin" and syslib.is_unversioned_dylib(system)):
        files.append(system)        # (macOS aborts the process that opens /usr/lib/libcrypto.dylib)
    return list(dict.fromkeys(files))


def find():
    """(ctypes library, None) for the first candidate that opens and has EVP, or
    (None, why not)."""
    why = "no libcrypto found beside Python's ssl module nor on the system"
    for path in library_files():
        try:
            lib = ctypes.CDLL(path)
            lib.EVP_EncryptUpdate  # noqa: B018 (the name must resolve)
            lib.OpenSSL_version_num.restype = ctypes.c_ulong
            if lib.OpenSSL_version_num() < 0x10101000:
                why = "libcrypto older than OpenSSL 1.1.1 (%s)" % os.path.basename(path)
                continue
            return lib, None
        except (OSError, AttributeError) as exc:
            why = "libcrypto could not be loaded (%s: %s)" % (type(exc).__name__, exc)
    return None, why


def _bind(lib, name, restype, *argtypes):
    """lib.name with its C signature, or None when the library lacks it."""
    function = getattr(lib, name, None)
    if function is not None:
        function.restype, function.argtypes = restype, argtypes
    return function


def version(lib):
    """OpenSSL's own version text, e.g. "OpenSSL 3.0.19 27 Jan 2026"."""
    text = _bind(lib, "OpenSSL_version", _c_char_p, _c_int)
    return text(0).decode("ascii", "replace") if text else "libcrypto"


def _readable(data):
    """A pointer-like argument for ``data`` and its length in bytes (syslib.readable:
    items that are not bytes count by their bytes)."""
    return syslib.readable(data)


class Bindings:
    """The functions this module uses, bound to one library (attributes None where missing)."""

    def __init__(self, lib):
        self.lib = lib
        self.version = version(lib)
        self.ERR_clear_error = _bind(lib, "ERR_clear_error", None)
        # ciphers
        self.EVP_CIPHER_CTX_new = _bind(lib, "EVP_CIPHER_CTX_new", _c_void_p)
        self.EVP_CIPHER_CTX_free = _bind(lib, "EVP_CIPHER_CTX_free", None, _c_void_p)
        self.EVP_EncryptInit_ex = _bind(lib, "EVP_EncryptInit_ex", _c_int, _c_void_p, _c_void_p,
                                        _c_void_p, _c_char_p, _c_char_p)
        self.EVP_EncryptUpdate = _bind(lib, "EVP_EncryptUpdate", _c_int, _c_void_p, _c_void_p,
                                       ctypes.POINTER(_c_int), _c_void_p, _c_int)
        self.ciphers = {}
        for bits in (128, 192, 256):
            get = _bind(lib, "EVP_aes_%d_ctr" % bits, _c_void_p)
            self.ciphers[bits // 8] = get() if get else None
        # X25519
        self.EVP_PKEY_new_raw_private_key = _bind(lib, "EVP_PKEY_new_raw_private_key", _c_void_p, _c_int,
                                                  _c_void_p, _c_char_p, _c_size_t)
        self.EVP_PKEY_new_raw_public_key = _bind(lib, "EVP_PKEY_new_raw_public_key", _c_void_p, _c_int,
                                                 _c_void_p, _c_char_p, _c_size_t)
        self.EVP_PKEY_free = _bind(lib, "EVP_PKEY_free", None, _c_void_p)
        self.EVP_PKEY_CTX_new = _bind(lib, "EVP_PKEY_CTX_new", _c_void_p, _c_void_p, _c_void_p)
        self.EVP_PKEY_CTX_free = _bind(lib, "EVP_PKEY_CTX_free", None, _c_void_p)
        self.EVP_PKEY_derive_init = _bind(lib, "EVP_PKEY_derive_init", _c_int, _c_void_p)
        self.EVP_PKEY_derive_set_peer = _bind(lib, "EVP_PKEY_derive_set_peer", _c_int, _c_void_p, _c_void_p)
        self.EVP_PKEY_derive = _bind(lib, "EVP_PKEY_derive", _c_int, _c_void_p, _c_char_p,
                                     ctypes.POINTER(_c_size_t))
        # MACs (OpenSSL 3)
        self.EVP_Q_mac = _bind(lib, "EVP_Q_mac", _c_void_p, _c_void_p, _c_char_p, _c_char_p, _c_char_p,
                               _c_void_p, _c_char_p, _c_size_t, _c_void_p, _c_size_t, _c_char_p,
                               _c_size_t, ctypes.POINTER(_c_size_t))
        self.EVP_MAC_fetch = _bind(lib, "EVP_MAC_fetch", _c_void_p, _c_void_p, _c_char_p, _c_char_p)
        self.EVP_MAC_free = _bind(lib, "EVP_MAC_free", None, _c_void_p)
        self.EVP_MAC_CTX_new = _bind(lib, "EVP_MAC_CTX_new", _c_void_p, _c_void_p)
        self.EVP_MAC_CTX_free = _bind(lib, "EVP_MAC_CTX_free", None, _c_void_p)
        self.EVP_MAC_CTX_dup = _bind(lib, "EVP_MAC_CTX_dup", _c_void_p, _c_void_p)
        self.EVP_MAC_init = _bind(lib, "EVP_MAC_init", _c_int, _c_void_p, _c_char_p, _c_size_t, _c_void_p)
        self.EVP_MAC_update = _bind(lib, "EVP_MAC_update", _c_int, _c_void_p, _c_char_p, _c_size_t)
        self.EVP_MAC_CTX_set_params = _bind(lib, "EVP_MAC_CTX_set_params", _c_int, _c_void_p, _c_void_p)
        self.EVP_MAC_final = _bind(lib, "EVP_MAC_final", _c_int, _c_void_p, _c_char_p,
                                   ctypes.POINTER(_c_size_t), _c_size_t)


def _failed(bindings, what):
    """Clear OpenSSL's error queue and raise ValueError(what)."""
    if bindings.ERR_clear_error:
        bindings.ERR_clear_error()
    raise ValueError(what)


# --------------------------------------------------------------------------------------
# AES-CTR
# --------------------------------------------------------------------------------------

def make_aes_ctr(bindings):
    """The ``AesCtr`` class over ``bindings``, or None if a name it needs is missing."""
    b = bindings
    if not (b.EVP_CIPHER_CTX_new and b.EVP_CIPHER_CTX_free and b.EVP_EncryptInit_ex
            and b.EVP_EncryptUpdate and b.ciphers.get(16)):
        return None
    new, free = b.EVP_CIPHER_CTX_new, b.EVP_CIPHER_CTX_free
    init, update = b.EVP_EncryptInit_ex, b.EVP_EncryptUpdate
    ciphers, char, buffer_of = b.ciphers, ctypes.c_char, ctypes.create_string_buffer
    chunk = 1 << 30                 # EVP_EncryptUpdate takes an int length

    def release(ctx):
        free(ctx)
        _live[0] -= 1

    class AesCtr:
        """AES-CTR over a whole 16-byte counter block that counts up as one 128-bit
        big-endian number (as pycryptodome's ``nonce=b""`` CTR does): ``encrypt`` and
        ``decrypt`` are the same XOR with the keystream, and take ``output=`` (a
        writable buffer of the same length, which may be the input) as pycryptodome's do."""

        def __init__(self, key, initial_value):
            cipher = ciphers.get(len(key))
            if cipher is None or len(initial_value) != 16:
                raise ValueError("AES-CTR takes a 16, 24 or 32-byte key and a 16-byte counter block")
            ctx = new()
            if not ctx:
                raise MemoryError("EVP_CIPHER_CTX_new failed")
            _live[0] += 1
            self._finalizer = weakref.finalize(self, release, ctx)
            if init(ctx, cipher, None, bytes(key), bytes(initial_value)) != 1:
                self._finalizer()
                _failed(bindings, "EVP_EncryptInit_ex refused the key")
            self._ctx, self._length = ctx, _c_int()
            self._out_length = ctypes.byref(self._length)

        def encrypt(self, data, output=None):
            """data XOR the next len(data) keystream bytes: bytes, or None when written
            into ``output``."""
            size = len(data) if type(data) is bytes else memoryview(data).nbytes
            if output is None:
                out = buffer_of(size)
            elif memoryview(output).nbytes != size:
                raise ValueError("output must have the length of the input")
            else:
                out = (char * size).from_buffer(memoryview(output).cast("B"))
            source, _ = (out, size) if output is data else _readable(data)
            ctx, length = self._ctx, self._out_length
            if size <= chunk:
                if update(ctx, out, length, source, size) != 1:
                    _failed(bindings, "EVP_EncryptUpdate failed")
            else:
                address, offset_of = ctypes.addressof(out), ctypes.c_char_p
                for offset in range(0, size, chunk):
                    part = min(chunk, size - offset)
                    source_part = bytes(memoryview(data).cast("B")[offset:offset + part])
                    if update(ctx, address + offset, length, offset_of(source_part), part) != 1:
                        _failed(bindings, "EVP_EncryptUpdate failed")
            return out.raw if output is None else None

        decrypt = encrypt

    return AesCtr


# --------------------------------------------------------------------------------------
# X25519
# --------------------------------------------------------------------------------------

EVP_PKEY_X25519 = 1034          # NID_X25519


P25519 = (1 << 255) - 19
# The u of the points of order 1, 2, 4 and 8 (mod p): X25519 of any clamped scalar with
# them is 0, which OpenSSL refuses to derive.
LOW_ORDER_U = frozenset([0, 1, P25519 - 1,
                         325606250916557431795983626356110631294008115727848805560023387167927233504,
                         39382357235489614581723060781553021112529911719440698176882885853963445705823])


def is_low_order(u32):
    """True if ``u32`` (bit 255 ignored, read mod p, as RFC 7748 reads it) is a low-order u."""
    return (int.from_bytes(bytes(u32), "little") & ((1 << 255) - 1)) % P25519 in LOW_ORDER_U


def make_x25519(bindings):
    """x25519(scalar32, u32) -> 32 bytes through EVP_PKEY_derive, or None. OpenSSL
    clamps the scalar and ignores bit 255 of u (RFC 7748); it refuses an all-zero
    result (a low-order u), for which we return 32 zero bytes, the ladder's answer.
    Any other failure raises: zeros there would pass for a result (a bridge's public
    key of 0)."""
    b = bindings
    names = (b.EVP_PKEY_new_raw_private_key, b.EVP_PKEY_new_raw_public_key, b.EVP_PKEY_free,
             b.EVP_PKEY_CTX_new, b.EVP_PKEY_CTX_free, b.EVP_PKEY_derive_init,
             b.EVP_PKEY_derive_set_peer, b.EVP_PKEY_derive)
    if not all(names):
        return None
    private, public, pkey_free, ctx_new, ctx_free, derive_init, set_peer, derive = names
    clear = b.ERR_clear_error or (lambda: None)

    def x25519(scalar32, u32):
        """X25519(k, u) (RFC 7748) through libcrypto."""
        if len(scalar32) != 32 or len(u32) != 32:
            raise ValueError("X25519 takes a 32-byte scalar and a 32-byte u, not %d and %d"
                             % (len(scalar32), len(u32)))
        ours = private(EVP_PKEY_X25519, None, bytes(scalar32), 32)
        peer = public(EVP_PKEY_X25519, None, bytes(u32), 32)
        ctx = ctx_new(ours, None) if ours else None
        try:
            out, size = ctypes.create_string_buffer(32), _c_size_t(32)
            if ctx and derive_init(ctx) == 1 and peer and set_peer(ctx, peer) == 1 \
                    and derive(ctx, out, ctypes.byref(size)) == 1 and size.value == 32:
                return out.raw
            clear()
            if not (ours and peer and ctx):
                raise MemoryError("libcrypto could not make an X25519 key")
            if is_low_order(u32):
                return bytes(32)    # refused: a low-order u, whose product is 0
            raise ValueError("libcrypto's X25519 derive failed")
        finally:
            for free, pointer in ((ctx_free, ctx), (pkey_free, peer), (pkey_free, ours)):
                if pointer:
                    free(pointer)
    return x25519


# --------------------------------------------------------------------------------------
# Poly1305 and SipHash (EVP_MAC, OpenSSL 3)
# --------------------------------------------------------------------------------------

class OSSL_PARAM(ctypes.Structure):
    """OpenSSL 3's parameter record (one element of a list ending in an empty one)."""
    _fields_ = [("key", _c_char_p), ("data_type", ctypes.c_uint), ("data", _c_void_p),
                ("data_size", _c_size_t), ("return_size", _c_size_t)]


OSSL_PARAM_UNSIGNED_INTEGER = 2
OSSL_PARAM_UNMODIFIED = ctypes.c_size_t(-1).value


def make_poly1305(bindings):
    """poly1305(key32, data) -> 16-byte tag, one EVP_Q_mac call, or None."""
    q_mac = bindings.EVP_Q_mac
    if q_mac is None:
        return None
    clear = bindings.ERR_clear_error or (lambda: None)

    def poly1305(key32, data):
        """Poly1305 with a raw one-time key (r is clamped by OpenSSL), through libcrypto."""
        if len(key32) != 32:
            raise ValueError("Poly1305 takes a 32-byte key")
        source, size = _readable(data)
        out, length = ctypes.create_string_buffer(16), _c_size_t(0)
        if not q_mac(None, b"POLY1305", None, None, None, bytes(key32), 32, source, size,
                     out, 16, ctypes.byref(length)) or length.value != 16:
            clear()
            raise ValueError("EVP_Q_mac(POLY1305) failed")
        return out.raw
    return poly1305


def make_poly1305_context(bindings):
    """new() -> mac(key_address, data_address, size, tag_address), or None without
    OpenSSL 3's EVP_MAC: Poly1305 with a raw one-time key on one EVP_MAC_CTX, kept for
    the frames of one direction (freed when ``mac`` goes). ``EVP_MAC_init`` with a new
    key starts a new message; then update, and final writes the 16-byte tag at
    tag_address. Three calls on addresses, where ``EVP_Q_mac`` looks the algorithm
    up by name on every call (cryptoroutes/framebox.py uses it)."""
    b, own, lib = bindings, syslib.bind_own, bindings.lib
    fetch, mac_free, ctx_new = b.EVP_MAC_fetch, b.EVP_MAC_free, b.EVP_MAC_CTX_new
    ctx_free = b.EVP_MAC_CTX_free
    init = own(lib, "EVP_MAC_init", _c_int, _c_void_p, _c_void_p, _c_size_t, _c_void_p)
    update = own(lib, "EVP_MAC_update", _c_int, _c_void_p, _c_void_p, _c_size_t)
    final = own(lib, "EVP_MAC_final", _c_int, _c_void_p, _c_void_p, _c_void_p, _c_size_t)
    if not all((fetch, mac_free, ctx_new, ctx_free, init, update, final)):
        return None
    algorithm = fetch(None, b"POLY1305", None)
    if not algorithm:
        _failed_quietly(b)
        return None
    # One EVP_MAC for the process (fetched once, as OpenSSL recommends); freed at exit.
    weakref.finalize(make_poly1305_context, mac_free, algorithm)

    def release(ctx):
        ctx_free(ctx)
        _live[0] -= 1

    def new():
        ctx = ctx_new(algorithm)
        if not ctx:
            raise MemoryError("EVP_MAC_CTX_new failed")
        _live[0] += 1
        length = _c_size_t(0)
        length_address = ctypes.addressof(length)

        def mac(key_address, data_address, size, tag_address, _length=length):
            if init(ctx, key_address, 32, None) != 1 or update(ctx, data_address, size) != 1 or \
                    final(ctx, tag_address, length_address, 16) != 1 or _length.value != 16:
                _failed(b, "EVP_MAC(POLY1305) failed")
        weakref.finalize(mac, release, ctx)
        return mac
    return new


def make_siphash_stream(bindings):
    """The ``SipHashStream`` class (a SipHash-2-4 state that can be finished again and
    again while it absorbs more), or None without OpenSSL 3's EVP_MAC."""
    b = bindings
    names = (b.EVP_MAC_fetch, b.EVP_MAC_free, b.EVP_MAC_CTX_new, b.EVP_MAC_CTX_free, b.EVP_MAC_CTX_dup,
             b.EVP_MAC_init, b.EVP_MAC_update, b.EVP_MAC_final, b.EVP_MAC_CTX_set_params)
    if not all(names):
        return None
    fetch, mac_free, ctx_new, ctx_free, ctx_dup, mac_init, mac_update, mac_final, set_params = names
    algorithm = fetch(None, b"SIPHASH", None)
    if not algorithm:
        _failed_quietly(b)
        return None
    # One EVP_MAC for the process (fetched once, as OpenSSL recommends); freed at exit.
    weakref.finalize(make_siphash_stream, mac_free, algorithm)
    size = _c_size_t(8)
    params = (OSSL_PARAM * 2)(OSSL_PARAM(b"size", OSSL_PARAM_UNSIGNED_INTEGER,
                                         ctypes.cast(ctypes.byref(size), _c_void_p), 8,
                                         OSSL_PARAM_UNMODIFIED), OSSL_PARAM())
    params_pointer = ctypes.cast(params, _c_void_p)
    keep_alive = (size, params)     # params_pointer points into these

    def release(ctx):
        ctx_free(ctx)
        _live[0] -= 1

    class SipHashStream:
        """SipHash-2-4 (8-byte output) under ``key16``, one state that absorbs and is
        never reset: ``blocks(m, count)`` is obfs4's DRBG loop, each digest taken
        from a duplicate of the state (EVP_MAC_CTX_dup), so the stream goes on."""

        def __init__(self, key16):
            if len(key16) != 16:
                raise ValueError("SipHash takes a 16-byte key")
            ctx = ctx_new(algorithm)
            if not ctx:
                raise MemoryError("EVP_MAC_CTX_new failed")
            _live[0] += 1
            self._finalizer = weakref.finalize(self, release, ctx)
            # the output size after the key: OpenSSL 3.0 refuses it before (or with) one
            if mac_init(ctx, bytes(key16), 16, None) != 1 or set_params(ctx, params_pointer) != 1:
                self._finalizer()
                _failed(b, "EVP_MAC_init(SIPHASH) failed")
            self._ctx, self._params = ctx, keep_alive
            self._out, self._length = ctypes.create_string_buffer(8), _c_size_t(0)

        def blocks(self, block, count):
            """obfs4's DRBG: ``count`` times absorb the 8-byte ``block`` and let the
            digest be the next one; returns the list of new blocks (8 bytes each)."""
            ctx, out, length, out_length = self._ctx, self._out, self._length, ctypes.byref(self._length)
            found = []
            for _ in range(count):
                if mac_update(ctx, block, 8) != 1:
                    _failed(b, "EVP_MAC_update failed")
                copy = ctx_dup(ctx)
                if not copy:
                    _failed(b, "EVP_MAC_CTX_dup failed")
                ok = mac_final(copy, out, out_length, 8)
                ctx_free(copy)
                if ok != 1 or length.value != 8:
                    _failed(b, "EVP_MAC_final failed")
                block = out.raw
                found.append(block)
            return found

    return SipHashStream


def _failed_quietly(bindings):
    if bindings.ERR_clear_error:
        bindings.ERR_clear_error()


# --------------------------------------------------------------------------------------
# Modular exponentiation (obfs3's UniformDH, 1536-bit)
# --------------------------------------------------------------------------------------

def make_modexp(bindings):
    """modexp(base, exponent, modulus) -> int with BN_mod_exp_mont_consttime (the
    exponent is a secret key: constant time), or None. The modulus must be odd (a
    prime), and base is reduced first; every BIGNUM is cleared and freed."""
    lib = bindings.lib
    names = [("BN_CTX_new", _c_void_p), ("BN_CTX_free", None), ("BN_new", _c_void_p),
             ("BN_clear_free", None), ("BN_bin2bn", _c_void_p), ("BN_bn2binpad", _c_int),
             ("BN_mod_exp_mont_consttime", _c_int)]
    functions = {}
    for name, restype in names:
        function = getattr(lib, name, None)
        if function is None:
            return None
        function.restype = restype
        functions[name] = function
    functions["BN_CTX_free"].argtypes = functions["BN_clear_free"].argtypes = (_c_void_p,)
    functions["BN_bin2bn"].argtypes = (_c_char_p, _c_int, _c_void_p)
    functions["BN_bn2binpad"].argtypes = (_c_void_p, _c_char_p, _c_int)
    functions["BN_mod_exp_mont_consttime"].argtypes = (_c_void_p,) * 6
    ctx_new, ctx_free, bn_new, bn_free = (functions[name] for name in
                                          ("BN_CTX_new", "BN_CTX_free", "BN_new", "BN_clear_free"))
    from_bytes, to_bytes, power = functions["BN_bin2bn"], functions["BN_bn2binpad"], \
        functions["BN_mod_exp_mont_consttime"]
    clear = bindings.ERR_clear_error or (lambda: None)

    def modexp(base, exponent, modulus):
        """base^exponent mod modulus through libcrypto (modulus odd, exponent >= 0)."""
        if modulus <= 1 or not modulus & 1 or exponent < 0:
            raise ValueError("libcrypto's modexp takes an odd modulus > 1 and an exponent >= 0")
        size = (modulus.bit_length() + 7) // 8
        values = [(base % modulus).to_bytes(size, "big"),
                  exponent.to_bytes((exponent.bit_length() + 7) // 8 or 1, "big"),
                  modulus.to_bytes(size, "big")]
        ctx, made = ctx_new(), []
        try:
            for value in values:
                made.append(from_bytes(value, len(value), None))
            result = bn_new()
            made.append(result)
            if not (ctx and all(made)) or power(result, made[0], made[1], made[2], ctx, None) != 1:
                clear()
                raise ValueError("BN_mod_exp_mont_consttime failed")
            out = ctypes.create_string_buffer(size)
            if to_bytes(result, out, size) != size:
                clear()
                raise ValueError("BN_bn2binpad failed")
            return int.from_bytes(out.raw, "big")
        finally:
            for number in made:
                if number:
                    bn_free(number)
            if ctx:
                ctx_free(ctx)
    return modexp
