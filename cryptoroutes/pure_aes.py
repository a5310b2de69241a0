"""cryptoroutes/pure_aes.py: AES (FIPS-197) encryption and AES-CTR in pure Python, the last resort.

obfs2 and obfs3 encrypt every byte with AES-128-CTR. Where neither pycryptodome nor a
libcrypto reachable through ``ctypes`` is there (a Python built without ``_ctypes``,
or without ``ssl``), this module keeps them working, slowly: CTR mode needs only the
forward cipher, done here with the classic four 256-entry tables (each round of a
column is four table look-ups and four XORs). cryptoroutes/chooser.py uses it only after the
NIST SP 800-38A answers, and says in the route report when it does.

Python integers are not constant time and the table look-ups depend on the key: a
local observer could time it. That is the same trade as every pure-Python route.
"""

import struct


def _xtime(a):
    """a * x in GF(2^8) mod x^8 + x^4 + x^3 + x + 1."""
    a <<= 1
    return a ^ 0x11B if a & 0x100 else a


def _make_sbox():
    """The S-box: the inverse in GF(2^8) (0 for 0), then the affine map with 0x63."""
    exp, log, value = [0] * 255, [0] * 256, 1
    for i in range(255):                    # 3 generates the multiplicative group
        exp[i], log[value] = value, i
        value ^= _xtime(value)
    sbox = []
    for a in range(256):
        b = exp[(255 - log[a]) % 255] if a else 0
        s = b
        for shift in range(1, 5):
            s ^= ((b << shift) | (b >> (8 - shift))) & 0xFF
        sbox.append(s ^ 0x63)
    return sbox


SBOX = _make_sbox()
# T0[a] = the column (2 s, s, s, 3 s) of MixColumns applied to s = S(a), as a big-endian
# word; T1..T3 are its byte rotations (the other three rows of a column).
T0 = [(_xtime(s) << 24) | (s << 16) | (s << 8) | (_xtime(s) ^ s) for s in SBOX]
T1 = [(t >> 8) | ((t & 0xFF) << 24) for t in T0]
T2 = [(t >> 8) | ((t & 0xFF) << 24) for t in T1]
T3 = [(t >> 8) | ((t & 0xFF) << 24) for t in T2]


def expand_key(key):
    """The round keys as a list of 4 (Nr + 1) big-endian words (FIPS-197 5.2)."""
    nk = len(key) // 4
    if len(key) not in (16, 24, 32):
        raise ValueError("AES takes a 16, 24 or 32-byte key, not %d" % len(key))
    words = list(struct.unpack(">%dI" % nk, key))
    rcon = 1
    for i in range(nk, 4 * (nk + 7)):
        t = words[-1]
        if i % nk == 0:
            t = ((t << 8) & 0xFFFFFFFF) | (t >> 24)                      # RotWord
            t = (SBOX[t >> 24] << 24 | SBOX[t >> 16 & 0xFF] << 16 | SBOX[t >> 8 & 0xFF] << 8
                 | SBOX[t & 0xFF]) ^ (rcon << 24)                         # SubWord, Rcon
            rcon = _xtime(rcon)
        elif nk > 6 and i % nk == 4:
            t = SBOX[t >> 24] << 24 | SBOX[t >> 16 & 0xFF] << 16 | SBOX[t >> 8 & 0xFF] << 8 | SBOX[t & 0xFF]
        words.append(words[i - nk] ^ t)
    return words


def encrypt_block(round_keys, block):
    """One 16-byte block, AES forward cipher (FIPS-197 5.1), with the T-tables."""
    s0, s1, s2, s3 = struct.unpack(">4I", block)
    return struct.pack(">4I", *_encrypt_words(round_keys, s0, s1, s2, s3))


def _encrypt_words(rk, s0, s1, s2, s3):
    """The forward cipher on four big-endian state words."""
    s0 ^= rk[0]
    s1 ^= rk[1]
    s2 ^= rk[2]
    s3 ^= rk[3]
    t0_, t1_, t2_, t3_ = T0, T1, T2, T3
    for r in range(4, len(rk) - 4, 4):
        s0, s1, s2, s3 = (
            t0_[s0 >> 24] ^ t1_[s1 >> 16 & 255] ^ t2_[s2 >> 8 & 255] ^ t3_[s3 & 255] ^ rk[r],
            t0_[s1 >> 24] ^ t1_[s2 >> 16 & 255] ^ t2_[s3 >> 8 & 255] ^ t3_[s0 & 255] ^ rk[r + 1],
            t0_[s2 >> 24] ^ t1_[s3 >> 16 & 255] ^ t2_[s0 >> 8 & 255] ^ t3_[s1 & 255] ^ rk[r + 2],
            t0_[s3 >> 24] ^ t1_[s0 >> 16 & 255] ^ t2_[s1 >> 8 & 255] ^ t3_[s2 & 255] ^ rk[r + 3])
    S, r = SBOX, len(rk) - 4        # the last round: no MixColumns
    return ((S[s0 >> 24] << 24 | S[s1 >> 16 & 255] << 16 | S[s2 >> 8 & 255] << 8 | S[s3 & 255]) ^ rk[r],
            (S[s1 >> 24] << 24 | S[s2 >> 16 & 255] << 16 | S[s3 >> 8 & 255] << 8 | S[s0 & 255]) ^ rk[r + 1],
            (S[s2 >> 24] << 24 | S[s3 >> 16 & 255] << 16 | S[s0 >> 8 & 255] << 8 | S[s1 & 255]) ^ rk[r + 2],
            (S[s3 >> 24] << 24 | S[s0 >> 16 & 255] << 16 | S[s1 >> 8 & 255] << 8 | S[s2 & 255]) ^ rk[r + 3])


def _bytes_of(buffer):
    """A memoryview of ``buffer`` whose items are bytes (len() and slices count bytes)."""
    view = memoryview(buffer)
    if view.ndim == 1 and view.format in ("B", "b", "c"):
        return view
    return view.cast("B")


class AesCtr:
    """AES-CTR over a whole 16-byte counter block that counts up as one 128-bit
    big-endian number; ``encrypt`` = ``decrypt`` = XOR with the keystream, with
    ``output=`` as pycryptodome's (libcrypto.AesCtr has the same shape)."""

    def __init__(self, key, initial_value):
        if len(initial_value) != 16:
            raise ValueError("AES-CTR takes a 16-byte counter block")
        self._keys = expand_key(bytes(key))
        self._counter = int.from_bytes(initial_value, "big")
        self._spare = b""           # keystream left over from the last block

    def _keystream(self, size):
        spare = self._spare
        needed = size - len(spare)
        blocks = [spare]
        if needed > 0:
            keys, counter, encrypt, pack = self._keys, self._counter, _encrypt_words, struct.pack
            for n in range(counter, counter + -(-needed // 16)):
                n &= (1 << 128) - 1
                blocks.append(pack(">4I", *encrypt(keys, n >> 96, n >> 64 & 0xFFFFFFFF,
                                                   n >> 32 & 0xFFFFFFFF, n & 0xFFFFFFFF)))
            self._counter = counter + -(-needed // 16)
        stream = b"".join(blocks)
        self._spare = stream[size:]
        return stream[:size]

    def encrypt(self, data, output=None):
        """data XOR the keystream; ``data`` and ``output`` are read and written as their
        bytes, whatever the format of a memoryview."""
        if type(data) is not bytes:
            data = _bytes_of(data)
        size = len(data)
        if output is not None:
            output = _bytes_of(output)
            if len(output) != size:
                raise ValueError("output must have the length of the input")
        stream = self._keystream(size)
        result = (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(size, "big")
        if output is None:
            return result
        output[:] = result
        return None

    decrypt = encrypt
