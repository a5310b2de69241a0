"""cryptoroutes/nettle.py: Salsa20 from the system's nettle through ``ctypes``.

nettle is GnuTLS's crypto library, so nearly every Linux has it (Debian and Ubuntu:
apt -> libgnutls30 -> libnettle8; RHEL and Fedora through gnutls). Of what obfs4
needs it offers Salsa20/20, which is all a frame needs: obfs4's secretbox runs
HSalsa20 once per direction, and each frame is then Salsa20 under that subkey with
the frame counter as nonce (obfs4_crypto.py). ``salsa20_xor`` keeps its context (the
64-byte ``struct salsa20_ctx`` of ``<nettle/salsa20.h>``) in a buffer of its own per
call: key, nonce (which starts the block counter at 0), crypt.

Measured through ``ctypes`` (Python 3.11, one core of the shared 2-core machine): a
1,462-byte frame ~5 µs, where plain Python takes ~60-110.

Nothing here is trusted: obfs4_crypto.py runs it against known answers before any
transport does, and a missing library or function leaves it None (syslib.py finds
the library). Every length is a byte length (syslib.readable).
"""

import ctypes

from cryptoroutes import syslib

CONTEXT_SIZE = 64           # struct salsa20_ctx: uint32_t input[16]


class Bindings:
    """nettle's Salsa20 functions (None where missing)."""

    def __init__(self, lib, name):
        b, void_p, size_t = syslib.bind, ctypes.c_void_p, ctypes.c_size_t
        self.lib, self.name = lib, name
        version_major = b(lib, "nettle_version_major", ctypes.c_int)
        version_minor = b(lib, "nettle_version_minor", ctypes.c_int)
        self.version = ("nettle %d.%d" % (version_major(), version_minor())
                        if version_major and version_minor else "nettle")
        self.set_key_256 = b(lib, "nettle_salsa20_256_set_key", None, void_p, ctypes.c_char_p)
        self.set_key = b(lib, "nettle_salsa20_set_key", None, void_p, size_t, ctypes.c_char_p)
        self.set_nonce = b(lib, "nettle_salsa20_set_nonce", None, void_p, ctypes.c_char_p)
        self.crypt = b(lib, "nettle_salsa20_crypt", None, void_p, size_t, void_p, void_p)


def load():
    """(Bindings, None) or (None, why not)."""
    lib, name, why = syslib.load("nettle", "nettle_salsa20_crypt")
    if lib is None:
        return None, why
    return Bindings(lib, name), None


def make_salsa20_xor(bindings):
    """salsa20_xor(key32, nonce8, data) -> bytes, Salsa20/20 from block 0 XOR data, or None."""
    set_nonce, crypt = bindings.set_nonce, bindings.crypt
    if bindings.set_key_256 is not None:
        set_key = bindings.set_key_256
    elif bindings.set_key is not None:          # nettle before 3.0 has only the sized call
        sized = bindings.set_key

        def set_key(ctx, key):
            sized(ctx, 32, key)
    else:
        return None
    if not (set_nonce and crypt):
        return None
    buffer_of, readable = ctypes.create_string_buffer, syslib.readable

    def salsa20_xor(key32, nonce8, data):
        if len(key32) != 32 or len(nonce8) != 8:
            raise ValueError("Salsa20 takes a 32-byte key and an 8-byte nonce, not %d and %d"
                             % (len(key32), len(nonce8)))
        source, size = readable(data)
        ctx, out = buffer_of(CONTEXT_SIZE), buffer_of(size or 1)
        set_key(ctx, bytes(key32))
        set_nonce(ctx, bytes(nonce8))
        crypt(ctx, size, out, source)
        return out.raw[:size]
    return salsa20_xor


def make_salsa20_keyed(bindings):
    """keyed(key32) -> crypt(nonce8, size, dst, src), or None: Salsa20/20 under a key
    set once, in a context of its own (64 bytes), for the frames of one direction.
    Each ``crypt`` restarts at block 0 of ``nonce8`` and writes ``size`` bytes of
    src XOR keystream at dst (both addresses of ``size`` bytes, which may be equal:
    nettle allows it): two C calls, nonce and crypt, where ``salsa20_xor`` makes two
    buffers and sets the key each time (cryptoroutes/framebox.py uses it)."""
    set_key = bindings.set_key_256
    set_nonce, crypt_c = bindings.set_nonce, bindings.crypt
    if not (set_key and set_nonce and crypt_c):
        return None

    def keyed(key32):
        if len(key32) != 32:
            raise ValueError("Salsa20 takes a 32-byte key, not %d" % len(key32))
        context = ctypes.create_string_buffer(CONTEXT_SIZE)
        set_key(context, bytes(key32))
        address = ctypes.addressof(context)

        def crypt(nonce8, size, dst, src, _context=context):     # the default keeps the context
            set_nonce(address, nonce8)
            crypt_c(address, size, dst, src)
        return crypt
    return keyed
