"""Crypto the tests use as references and probes, kept out of the runtime (a helper
module, not a test module): AES-ECB through libcrypto (a reference block cipher where
pycryptodome is not used), Salsa20 one block at a time (the baseline the side-by-side
computation of cryptoroutes/pure_salsa20.py is checked against), and the count of
libcrypto's native contexts still alive (the leak test's probe).
"""

import ctypes
import struct

from cryptoroutes import libcrypto, pure_salsa20


def live_native_objects():
    """How many native contexts cryptoroutes/libcrypto.py made are still waiting to be freed."""
    return libcrypto._live[0]


def salsa20_xor_one_block_at_a_time(key32, nonce8, data):
    """Salsa20/20(key32, nonce8) from block 0 XOR ``data``, each block on its own (lanes
    of one): the same function as ``pure_salsa20.salsa20_xor``, computed another way."""
    sigma, out = pure_salsa20.SIGMA, []
    for block in range(-(-len(data) // 64)):
        counter = struct.pack("<Q", block)
        state = struct.unpack("<16I", struct.pack("<4I", sigma[0], *struct.unpack("<3I", key32[:12]))
                              + key32[12:16] + struct.pack("<I", sigma[1]) + nonce8 + counter
                              + struct.pack("<I", sigma[2]) + key32[16:32] + struct.pack("<I", sigma[3]))
        out.append(pure_salsa20._core(state, 1))
    return pure_salsa20.xor(data, b"".join(out)[:len(data)])


def make_aes_ecb(bindings):
    """The ``AesEcb`` class (AES on whole 16-byte blocks, FIPS-197's cipher and its
    inverse) over libcrypto ``bindings``, or None where a name is missing."""
    lib, c_int, c_void_p, c_char_p = bindings.lib, ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p
    ciphers = {}
    for bits in (128, 192, 256):
        get = libcrypto._bind(lib, "EVP_aes_%d_ecb" % bits, c_void_p)
        ciphers[bits // 8] = get() if get else None
    init = libcrypto._bind(lib, "EVP_CipherInit_ex", c_int, c_void_p, c_void_p, c_void_p, c_char_p,
                           c_char_p, c_int)
    update = libcrypto._bind(lib, "EVP_CipherUpdate", c_int, c_void_p, c_void_p, ctypes.POINTER(c_int),
                             c_char_p, c_int)
    padding = libcrypto._bind(lib, "EVP_CIPHER_CTX_set_padding", c_int, c_void_p, c_int)
    if not (init and update and padding and bindings.EVP_CIPHER_CTX_new and ciphers.get(16)):
        return None

    class AesEcb:
        def __init__(self, key):
            if ciphers.get(len(key)) is None:
                raise ValueError("AES takes a 16, 24 or 32-byte key")
            self._key = bytes(key)

        def _run(self, data, encrypt):
            data = bytes(data)
            if len(data) % 16:
                raise ValueError("AES-ECB takes whole 16-byte blocks")
            ctx = bindings.EVP_CIPHER_CTX_new()
            try:
                out, length = ctypes.create_string_buffer(len(data) + 16), c_int(0)
                if not ctx or init(ctx, ciphers[len(self._key)], None, self._key, None, encrypt) != 1 or \
                        padding(ctx, 0) != 1 or update(ctx, out, ctypes.byref(length), data, len(data)) != 1:
                    raise ValueError("AES-ECB failed")
                return out.raw[:length.value]
            finally:
                if ctx:
                    bindings.EVP_CIPHER_CTX_free(ctx)

        def encrypt(self, data):
            return self._run(data, 1)

        def decrypt(self, data):
            return self._run(data, 0)

    return AesEcb
