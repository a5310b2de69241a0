"""tlscrypto.py: the crypto the webtunnel demo needs beyond the transports', on any machine.

The demo (demo_webtunnel.py) makes a throwaway CA and certificate (ECDSA P-256 with
SHA-256) and opens the TLS 1.3 records it shows with the key log (AES-GCM and
ChaCha20-Poly1305). It calls these through pycryptodome's names::

    AES.new(key, AES.MODE_GCM, nonce=n)       .update(aad)  .decrypt_and_verify(ct, tag)
    ChaCha20_Poly1305.new(key=k, nonce=n)     (the same two methods)
    SHA256.new(data)
    ECC.generate(curve="P-256")               .pointQ.x/.y  .public_key().export_key(format="DER")
                                              .export_key(format="PEM")
    DSS.new(key, "fips-186-3", encoding="der").sign(SHA256.new(data))

Where pycryptodome is used (accel.py: ``Crypto`` or Debian's ``Cryptodome``; not with
OBFSPROXY_CRYPTO=stdlib) these names are its own modules. Elsewhere they are the small
classes below, the same calls on OpenSSL's libcrypto through ``ctypes`` (the library
Python's ``ssl`` runs): an AEAD context that opens one record, an EC key made and
signed with ``EVP_PKEY``, exported as DER and PEM. Only what the demo calls is there.
Each object frees its native handles when it goes (``weakref.finalize``).
"""

import base64
import ctypes
import hashlib
import weakref

import accel

_c_int, _c_size_t, _c_void_p, _c_char_p = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p


def _bind(name, restype, *argtypes):
    function = getattr(accel.LIBCRYPTO.lib, name)
    function.restype, function.argtypes = restype, argtypes
    return function


class _Lib:
    """The libcrypto functions used here, bound on first use."""

    def __init__(self):
        if accel.LIBCRYPTO is None:
            raise RuntimeError("the webtunnel demo needs pycryptodome or OpenSSL's libcrypto: %s"
                               % accel.LIBCRYPTO_UNAVAILABLE)
        b = accel.LIBCRYPTO
        self.ctx_new, self.ctx_free = b.EVP_CIPHER_CTX_new, b.EVP_CIPHER_CTX_free
        self.clear = b.ERR_clear_error
        self.decrypt_init = _bind("EVP_DecryptInit_ex", _c_int, _c_void_p, _c_void_p, _c_void_p, _c_char_p,
                                  _c_char_p)
        self.decrypt_update = _bind("EVP_DecryptUpdate", _c_int, _c_void_p, _c_void_p, ctypes.POINTER(_c_int),
                                    _c_char_p, _c_int)
        self.decrypt_final = _bind("EVP_DecryptFinal_ex", _c_int, _c_void_p, _c_void_p,
                                   ctypes.POINTER(_c_int))
        self.ctrl = _bind("EVP_CIPHER_CTX_ctrl", _c_int, _c_void_p, _c_int, _c_int, _c_void_p)
        self.ciphers = {name: _bind(name, _c_void_p)() for name in
                        ("EVP_aes_128_gcm", "EVP_aes_256_gcm", "EVP_chacha20_poly1305")}
        self.pkey_ctx_new_from_name = _bind("EVP_PKEY_CTX_new_from_name", _c_void_p, _c_void_p, _c_char_p,
                                            _c_char_p)
        self.pkey_ctx_free = b.EVP_PKEY_CTX_free
        self.keygen_init = _bind("EVP_PKEY_keygen_init", _c_int, _c_void_p)
        self.set_group = _bind("EVP_PKEY_CTX_set_group_name", _c_int, _c_void_p, _c_char_p)
        self.generate = _bind("EVP_PKEY_generate", _c_int, _c_void_p, ctypes.POINTER(_c_void_p))
        self.pkey_free = b.EVP_PKEY_free
        self.i2d_pubkey = _bind("i2d_PUBKEY", _c_int, _c_void_p, ctypes.POINTER(_c_void_p))
        self.i2d_private = _bind("i2d_PrivateKey", _c_int, _c_void_p, ctypes.POINTER(_c_void_p))
        self.crypto_free = _bind("CRYPTO_free", None, _c_void_p, _c_char_p, _c_int)
        self.md_ctx_new = _bind("EVP_MD_CTX_new", _c_void_p)
        self.md_ctx_free = _bind("EVP_MD_CTX_free", None, _c_void_p)
        self.sha256 = _bind("EVP_sha256", _c_void_p)
        self.sign_init = _bind("EVP_DigestSignInit", _c_int, _c_void_p, _c_void_p, _c_void_p, _c_void_p,
                               _c_void_p)
        self.sign = _bind("EVP_DigestSign", _c_int, _c_void_p, _c_char_p, ctypes.POINTER(_c_size_t),
                          _c_char_p, _c_size_t)

    def der(self, encode, pkey):
        """The DER that ``encode`` (i2d_*) writes for ``pkey``, in a buffer we free."""
        out = _c_void_p()
        size = encode(pkey, ctypes.byref(out))
        if size <= 0:
            self.clear()
            raise ValueError("libcrypto could not encode the key")
        try:
            return ctypes.string_at(out.value, size)
        finally:
            self.crypto_free(out, b"tlscrypto", 0)


_LIB = []


def _lib():
    if not _LIB:
        _LIB.append(_Lib())
    return _LIB[0]


# --------------------------------------------------------------------------------------
# AEAD: open one TLS 1.3 record
# --------------------------------------------------------------------------------------

EVP_CTRL_AEAD_SET_IVLEN, EVP_CTRL_AEAD_SET_TAG = 0x9, 0x11


class _Aead:
    """One record's AEAD, to open (decrypt and verify) once: ``update(aad)``, then
    ``decrypt_and_verify(ciphertext, tag)``, ValueError on a bad tag."""

    def __init__(self, cipher_name, key, nonce):
        lib = _lib()
        self._lib, self._aad = lib, b""
        ctx = lib.ctx_new()
        if not ctx:
            raise MemoryError("EVP_CIPHER_CTX_new failed")
        weakref.finalize(self, lib.ctx_free, ctx)
        if lib.decrypt_init(ctx, lib.ciphers[cipher_name], None, None, None) != 1 or \
                lib.ctrl(ctx, EVP_CTRL_AEAD_SET_IVLEN, len(nonce), None) != 1 or \
                lib.decrypt_init(ctx, None, None, bytes(key), bytes(nonce)) != 1:
            lib.clear()
            raise ValueError("%s refused the key or nonce" % cipher_name)
        self._ctx = ctx

    def update(self, aad):
        self._aad += bytes(aad)

    def decrypt_and_verify(self, ciphertext, tag):
        lib, ctx, length = self._lib, self._ctx, _c_int(0)
        ciphertext = bytes(ciphertext)
        out = ctypes.create_string_buffer(len(ciphertext) + 16)
        tag_buffer = ctypes.create_string_buffer(bytes(tag), len(tag))
        ok = (lib.decrypt_update(ctx, None, ctypes.byref(length), self._aad, len(self._aad)) == 1
              and lib.decrypt_update(ctx, out, ctypes.byref(length), ciphertext, len(ciphertext)) == 1)
        size = length.value
        ok = ok and lib.ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, len(tag), tag_buffer) == 1
        ok = ok and lib.decrypt_final(ctx, ctypes.byref(out, size), ctypes.byref(length)) == 1
        if not ok:
            lib.clear()
            raise ValueError("MAC check failed")
        return out.raw[:size + length.value]


class _AESModule:
    """AES-GCM here; the other modes (CTR, ECB) as accel.AES runs them."""
    MODE_ECB, MODE_CTR, MODE_GCM = accel.AES_MODES

    @staticmethod
    def new(key, mode, *args, **kwargs):
        if mode != _AESModule.MODE_GCM:
            return accel.AES.new(key, mode, *args, **kwargs)
        if len(key) not in (16, 32) or args or set(kwargs) != {"nonce"}:
            raise ValueError("only AES-128/256-GCM with a nonce is here without pycryptodome")
        return _Aead("EVP_aes_%d_gcm" % (8 * len(key)), key, kwargs["nonce"])


class _ChaCha20Poly1305Module:
    @staticmethod
    def new(key, nonce):
        return _Aead("EVP_chacha20_poly1305", key, nonce)


# --------------------------------------------------------------------------------------
# SHA-256, and ECDSA P-256 keys and signatures
# --------------------------------------------------------------------------------------

class _SHA256Module:
    @staticmethod
    def new(data=b""):
        """hashlib's SHA-256, with the data kept for EVP_DigestSign (which hashes itself)."""
        return _Hash(hashlib.sha256(data), bytes(data))


class _Hash:
    def __init__(self, digest, data):
        self._digest, self.data = digest, data

    def digest(self):
        return self._digest.digest()


class _Point:
    def __init__(self, x, y):
        self.x, self.y = x, y


class _EccKey:
    """A P-256 key pair in libcrypto (an EVP_PKEY), freed when the object goes."""

    def __init__(self, pkey, public_only=False):
        lib = _lib()
        self._lib, self._pkey, self._public_only = lib, pkey, public_only
        if not public_only:
            weakref.finalize(self, lib.pkey_free, pkey)
        spki = lib.der(lib.i2d_pubkey, pkey)
        point = spki[-65:]          # SubjectPublicKeyInfo ends with the point 04 | x | y
        if point[0] != 4:
            raise ValueError("not an uncompressed P-256 point")
        self.pointQ = _Point(int.from_bytes(point[1:33], "big"), int.from_bytes(point[33:], "big"))
        self._spki = spki

    def public_key(self):
        public = _EccKey.__new__(_EccKey)
        public.__dict__.update(self.__dict__)
        public._owner, public._public_only = self, True       # keeps the EVP_PKEY alive
        return public

    def export_key(self, format):
        if format == "DER" and self._public_only:
            return self._spki
        if format == "PEM" and not self._public_only:
            body = base64.encodebytes(self._lib.der(self._lib.i2d_private, self._pkey)).decode("ascii")
            return "-----BEGIN EC PRIVATE KEY-----\n%s-----END EC PRIVATE KEY-----\n" % body
        raise ValueError("only the public key as DER and the private key as PEM are here")


class _ECCModule:
    @staticmethod
    def generate(curve):
        if curve != "P-256":
            raise ValueError("only P-256 is here without pycryptodome")
        lib = _lib()
        ctx = lib.pkey_ctx_new_from_name(None, b"EC", None)
        pkey = _c_void_p()
        try:
            if not ctx or lib.keygen_init(ctx) != 1 or lib.set_group(ctx, b"P-256") != 1 or \
                    lib.generate(ctx, ctypes.byref(pkey)) != 1:
                lib.clear()
                raise ValueError("libcrypto could not make a P-256 key")
        finally:
            if ctx:
                lib.pkey_ctx_free(ctx)
        return _EccKey(pkey.value)


class _Signer:
    def __init__(self, key):
        self._key = key

    def sign(self, hashed):
        lib, key = self._key._lib, self._key
        md = lib.md_ctx_new()
        try:
            size = _c_size_t(0)
            if not md or lib.sign_init(md, None, lib.sha256(), None, key._pkey) != 1 or \
                    lib.sign(md, None, ctypes.byref(size), hashed.data, len(hashed.data)) != 1:
                lib.clear()
                raise ValueError("EVP_DigestSign failed")
            out = ctypes.create_string_buffer(size.value)
            if lib.sign(md, out, ctypes.byref(size), hashed.data, len(hashed.data)) != 1:
                lib.clear()
                raise ValueError("EVP_DigestSign failed")
            return out.raw[:size.value]
        finally:
            if md:
                lib.md_ctx_free(md)


class _DSSModule:
    @staticmethod
    def new(key, mode, encoding):
        if mode != "fips-186-3" or encoding != "der":
            raise ValueError("only FIPS 186-3 ECDSA with DER signatures is here")
        return _Signer(key)


def _choose():
    """pycryptodome's modules where accel uses pycryptodome, else the libcrypto ones."""
    modules = [accel.pycryptodome(name) for name in
               ("Cipher.AES", "Cipher.ChaCha20_Poly1305", "Hash.SHA256", "PublicKey.ECC", "Signature.DSS")]
    if all(modules):
        return tuple(modules) + ("pycryptodome",)
    return (_AESModule, _ChaCha20Poly1305Module, _SHA256Module, _ECCModule, _DSSModule,
            "libcrypto through ctypes")


AES, ChaCha20_Poly1305, SHA256, ECC, DSS, ROUTE = _choose()
