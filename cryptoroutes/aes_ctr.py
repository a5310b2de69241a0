"""cryptoroutes/aes_ctr.py: AES-CTR for obfs2 and obfs3, by route, and ``AES.new`` in
pycryptodome's words for the code that calls it that way.

AES-CTR runs on the first of libcrypto (through ``ctypes``), pycryptodome and pure
Python (pure_aes.py) that gives every known answer (chooser.py says how a route is
chosen). ``AES.new(key, AES.MODE_CTR, nonce=b"", initial_value=...)`` is the one call
obfs2 and obfs3 make; it runs on that route whatever is installed.

Importing this module with a bad ``OBFSPROXY_CRYPTO`` raises chooser's
CryptoSettingError, in one line (``from cryptoroutes.aes_ctr import AES`` is the
first thing obfs2 and obfs3 do).
"""

from cryptoroutes import chooser
from cryptoroutes.chooser import PASSED_OVER, byte_view, choose, passed_over_text, pycryptodome

chooser.check_setting()     # a bad OBFSPROXY_CRYPTO stops here, in one line

# --------------------------------------------------------------------------------------
# AES-CTR (obfs2, obfs3): libcrypto, pycryptodome, pure Python
# --------------------------------------------------------------------------------------

_PycryptodomeAES = pycryptodome("Cipher.AES")


class _aes_ctr_pycryptodome:
    """pycryptodome's CTR over a whole 16-byte counter block (``nonce=b""``), given
    ``data`` and ``output`` as their bytes (chooser.byte_view): some versions (Debian
    12's 3.11) take a view of 4-byte items for its item count."""

    __slots__ = ("_encrypt",)

    def __init__(self, key, initial_value):
        self._encrypt = _PycryptodomeAES.new(key, _PycryptodomeAES.MODE_CTR, nonce=b"",
                                             initial_value=initial_value).encrypt

    def encrypt(self, data, output=None):
        if type(data) is not bytes:
            data = byte_view(data)
        if output is None:
            return self._encrypt(data)
        return self._encrypt(data, output=byte_view(output))

    decrypt = encrypt


# NIST SP 800-38A F.5.1, F.5.3, F.5.5 (CTR-AES128/192/256.Encrypt, four blocks each), and
# one counter block that carries across its low 64 bits (obfs2's counter is a random
# 16 bytes; that answer is FIPS-197 AES of the three counter blocks, see the tests).
_SP800_38A_PLAINTEXT = bytes.fromhex(
    "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51"
    "30c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710")
_SP800_38A_COUNTER = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
AES_CTR_ANSWERS = [
    (bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c"), _SP800_38A_COUNTER, _SP800_38A_PLAINTEXT,
     bytes.fromhex("874d6191b620e3261bef6864990db6ce9806f66b7970fdff8617187bb9fffdff"
                   "5ae4df3edbd5d35e5b4f09020db03eab1e031dda2fbe03d1792170a0f3009cee")),
    (bytes.fromhex("8e73b0f7da0e6452c810f32b809079e562f8ead2522c6b7b"), _SP800_38A_COUNTER,
     _SP800_38A_PLAINTEXT,
     bytes.fromhex("1abc932417521ca24f2b0459fe7e6e0b090339ec0aa6faefd5ccc2c6f4ce8e94"
                   "1e36b26bd1ebc670d1bd1d665620abf74f78a7f6d29809585a97daec58c6b050")),
    (bytes.fromhex("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4"),
     _SP800_38A_COUNTER, _SP800_38A_PLAINTEXT,
     bytes.fromhex("601ec313775789a5b7a7f504bbf3d228f443e3ca4d62b59aca84e990cacaf5c5"
                   "2b0930daa23de94ce87017ba2d84988ddfc9c58db67aada613c2dd08457941a6")),
    (bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c"), bytes.fromhex("00000000000000ffffffffffffffffff"),
     bytes(48), bytes.fromhex("dacc9148febbffe342d5805537ea155ff644566de02f529aa57d9a6064ac0ab6"
                              "81bca66820a2754afa4e7b135caed7a9")),
]


def aes_ctr_proven(route):
    """True if the AES-CTR class ``route(key, counter_block)`` gives every answer in one
    call, in two calls split mid-block (the keystream carries over), and in place
    (``output=`` a bytearray): the known answers of every way obfs2/obfs3 call it."""
    try:
        for key, counter, plaintext, ciphertext in AES_CTR_ANSWERS:
            if route(key, counter).encrypt(plaintext) != ciphertext:
                return False
            cipher = route(key, counter)        # (pycryptodome refuses decrypt after encrypt)
            if cipher.encrypt(plaintext[:7]) + cipher.encrypt(memoryview(plaintext)[7:]) != ciphertext:
                return False
            if route(key, counter).decrypt(ciphertext) != plaintext:
                return False
            buffer = bytearray(plaintext)
            if route(key, counter).encrypt(buffer, output=buffer) is not None or buffer != ciphertext:
                return False
        return True
    except Exception:  # a broken fast route must never stop the program: the next one runs
        return False


def _aes_ctr_route():
    """AES-CTR: libcrypto (faster to set up and to run than pycryptodome's Python layer
    over its C: see the module docstring), else pycryptodome, else pure Python."""
    from cryptoroutes import pure_aes
    return choose([(chooser.LibAesCtr, "libcrypto EVP_EncryptUpdate"),
                   (_aes_ctr_pycryptodome if _PycryptodomeAES else None, "pycryptodome AES"),
                   (pure_aes.AesCtr, "pure Python")], aes_ctr_proven)


aes_ctr, AES_CTR_ROUTE, PASSED_OVER["AES-CTR"] = _aes_ctr_route()


def aes_ctr_routes():
    """({piece: route}, [pieces in pure Python]) of AES-CTR, for a transport's
    ``crypto_routes()``; with "passed over" (why faster routes were) when any was."""
    routes = {"AES-CTR": AES_CTR_ROUTE}
    why = passed_over_text(["AES-CTR"], ["pycryptodome", "libcrypto"])
    if why:
        routes["passed over"] = why
    return routes, (["AES-CTR"] if AES_CTR_ROUTE == "pure Python" else [])


AES_MODES = (1, 6, 11)          # pycryptodome's MODE_ECB, MODE_CTR, MODE_GCM


class _AES:
    """``AES.new`` as obfs2 and obfs3 call pycryptodome's: CTR mode over a whole 16-byte
    counter block (``nonce=b""``, ``initial_value`` bytes or int), on the route chosen
    above. No other mode: the transports use none (the tests take pycryptodome's)."""

    MODE_ECB, MODE_CTR, MODE_GCM = AES_MODES

    @staticmethod
    def new(key, mode, *args, **kwargs):
        if mode == _AES.MODE_CTR and not args and kwargs.get("nonce") == b"" \
                and set(kwargs) <= {"nonce", "initial_value"}:
            counter = kwargs.get("initial_value", 0)
            if isinstance(counter, int):
                counter = counter.to_bytes(16, "big")
            return aes_ctr(bytes(key), bytes(counter))
        raise ValueError("AES.new here runs only CTR mode over a whole counter block "
                         "(nonce=b\"\", initial_value=...), not mode %r with %s" % (mode, sorted(kwargs)))


AES = _AES
