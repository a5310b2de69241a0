"""pure_salsa20.py: Salsa20/20 in pure Python, many 64-byte blocks at once.

Salsa20 is not in OpenSSL, so where neither PyNaCl nor pycryptodome is installed the
obfs4 frame cipher (XSalsa20-Poly1305, obfs4_crypto.py) runs it here. One block is 20
rounds of 32-bit add, rotate and xor on 16 words; done one block at a time in Python
that is ~1,300 interpreted operations per 64 bytes. But the blocks of a keystream are
independent (only the counter words differ), so we compute them **side by side**:

    lane i of a Python int = bits 64 i .. 64 i + 31    (the 32 bits above: guard, always 0)

    word x_w of every block at once:  X_w = sum over blocks i of x_w(i) << 64 i
    a + b  mod 2^32, every lane:      (A + B) & M          M = sum of 0xffffffff << 64 i
    a <<< k, every lane:              (T * D >> (32 - k)) & M,   D = 2^32 + 1

The carry of a 32-bit add stops in the guard bits and the mask drops it; T * D writes
each lane twice, side by side inside its own 64-bit slot (no slot overflows), and a
32-bit window of that is the rotation; the bits that the shift pulls in from the next
slot land above bit 32, where the mask drops them. So one Python operation works on
every block of a frame (or of a whole write: ``keystreams`` takes blocks of many
messages, each with its own nonce) and the interpreter's cost per operation is paid
once; what remains is C loops over the ints' digits.

Measured (Python 3.11, shared 2-core machine; the tests hold the numbers in
pure_salsa20's benchmark, not here): one block at a time ~45 µs a block; 23 blocks
(one obfs4 frame) side by side ~6 µs a block; a 64 KiB write's ~1,000 blocks side by
side ~3 µs a block. Nothing here is constant time (Python integers are not), which is
the same trade as the other pure-Python routes; the keys are per connection.
"""

import array
import struct
import sys

M32 = 0xFFFFFFFF
SIGMA = struct.unpack("<4I", b"expand 32-byte k")       # state words 0, 5, 10, 15
_D = (1 << 32) | 1                                      # T * D: every lane written twice
_WORD_ARRAY = "I" if array.array("I").itemsize == 4 else "L"
_LOW_HALF = 0 if sys.byteorder == "little" else 1       # where a 64-bit slot's low word sits


def _core(state, count):
    """The 64-byte Salsa20/20 blocks of ``count`` lanes, block after block.

    ``state`` is the 16 input words, each a lane int (X_w above); the result is
    bytes: block 0, block 1, ... Each output word is rounds(x)_w + x_w mod 2^32."""
    M = int.from_bytes(b"\xff\xff\xff\xff\x00\x00\x00\x00" * count, "little")
    D = _D
    x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = state
    for _ in range(10):
        # column round: (0 4 8 12) (5 9 13 1) (10 14 2 6) (15 3 7 11)
        x4 ^= (x0 + x12 & M) * D >> 25 & M
        x8 ^= (x4 + x0 & M) * D >> 23 & M
        x12 ^= (x8 + x4 & M) * D >> 19 & M
        x0 ^= (x12 + x8 & M) * D >> 14 & M
        x9 ^= (x5 + x1 & M) * D >> 25 & M
        x13 ^= (x9 + x5 & M) * D >> 23 & M
        x1 ^= (x13 + x9 & M) * D >> 19 & M
        x5 ^= (x1 + x13 & M) * D >> 14 & M
        x14 ^= (x10 + x6 & M) * D >> 25 & M
        x2 ^= (x14 + x10 & M) * D >> 23 & M
        x6 ^= (x2 + x14 & M) * D >> 19 & M
        x10 ^= (x6 + x2 & M) * D >> 14 & M
        x3 ^= (x15 + x11 & M) * D >> 25 & M
        x7 ^= (x3 + x15 & M) * D >> 23 & M
        x11 ^= (x7 + x3 & M) * D >> 19 & M
        x15 ^= (x11 + x7 & M) * D >> 14 & M
        # row round: (0 1 2 3) (5 6 7 4) (10 11 8 9) (15 12 13 14)
        x1 ^= (x0 + x3 & M) * D >> 25 & M
        x2 ^= (x1 + x0 & M) * D >> 23 & M
        x3 ^= (x2 + x1 & M) * D >> 19 & M
        x0 ^= (x3 + x2 & M) * D >> 14 & M
        x6 ^= (x5 + x4 & M) * D >> 25 & M
        x7 ^= (x6 + x5 & M) * D >> 23 & M
        x4 ^= (x7 + x6 & M) * D >> 19 & M
        x5 ^= (x4 + x7 & M) * D >> 14 & M
        x11 ^= (x10 + x9 & M) * D >> 25 & M
        x8 ^= (x11 + x10 & M) * D >> 23 & M
        x9 ^= (x8 + x11 & M) * D >> 19 & M
        x10 ^= (x9 + x8 & M) * D >> 14 & M
        x12 ^= (x15 + x14 & M) * D >> 25 & M
        x13 ^= (x12 + x15 & M) * D >> 23 & M
        x14 ^= (x13 + x12 & M) * D >> 19 & M
        x15 ^= (x14 + x13 & M) * D >> 14 & M
    size = 8 * count
    out = array.array(_WORD_ARRAY, bytes(64 * count))
    for w, (x, start) in enumerate(zip((x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15),
                                       state)):
        lanes = array.array(_WORD_ARRAY, (x + start & M).to_bytes(size, sys.byteorder))
        out[w::16] = lanes[_LOW_HALF::2]
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def _lanes(values):
    """One word of many blocks as a lane int: value i at bit 64 i."""
    return int.from_bytes(struct.pack("<%dQ" % len(values), *values), "little")


def keystreams(key32, requests):
    """[Salsa20/20(key32, nonce8) keystream of ``length`` bytes, block counter from 0,
    for each (nonce8, length) in ``requests``]: every block of every request side by
    side in one pass of the rounds."""
    if len(key32) != 32:
        raise ValueError("Salsa20 takes a 32-byte key, not %d" % len(key32))
    counts = [-(-length // 64) for _, length in requests]
    total = sum(counts)
    if total == 0:
        return [b"" for _ in requests]
    nonce_low, nonce_high, counter_low, counter_high = [], [], [], []
    for (nonce8, _), count in zip(requests, counts):
        if len(nonce8) != 8:
            raise ValueError("Salsa20 takes an 8-byte nonce, not %d" % len(nonce8))
        n0, n1 = struct.unpack("<2I", nonce8)
        nonce_low += [n0] * count
        nonce_high += [n1] * count
        counter_low += range(count)
        counter_high += [0] * count
    same = int.from_bytes(b"\x01\x00\x00\x00\x00\x00\x00\x00" * total, "little")   # 1 in every lane
    k = struct.unpack("<8I", key32)
    state = (SIGMA[0] * same, k[0] * same, k[1] * same, k[2] * same, k[3] * same, SIGMA[1] * same,
             _lanes(nonce_low), _lanes(nonce_high), _lanes(counter_low), _lanes(counter_high),
             SIGMA[2] * same, k[4] * same, k[5] * same, k[6] * same, k[7] * same, SIGMA[3] * same)
    stream = memoryview(_core(state, total))
    out, start = [], 0
    for (_, length), count in zip(requests, counts):
        out.append(bytes(stream[64 * start:64 * start + length]))
        start += count
    return out


def xor(data, stream):
    """data XOR stream (same length), as bytes: one big-int XOR."""
    size = len(data)
    return (int.from_bytes(data, "little") ^ int.from_bytes(stream, "little")).to_bytes(size, "little")


def salsa20_xor(key32, nonce8, data):
    """Salsa20/20(key32, nonce8) from block 0, XORed with ``data``."""
    return xor(data, keystreams(key32, [(nonce8, len(data))])[0])


def salsa20_xor_many(key32, messages):
    """[salsa20_xor(key32, nonce8, data) for each (nonce8, data)], all blocks in one pass."""
    streams = keystreams(key32, [(nonce8, len(data)) for nonce8, data in messages])
    return [xor(data, stream) for (_, data), stream in zip(messages, streams)]


def salsa20_xor_one_block_at_a_time(key32, nonce8, data):
    """The same as ``salsa20_xor``, each block on its own (lanes of one): the baseline
    that the side-by-side computation is measured against, and a second opinion in
    the tests."""
    out = []
    for block in range(-(-len(data) // 64)):
        counter = struct.pack("<Q", block)
        state = struct.unpack("<16I", struct.pack("<4I", SIGMA[0], *struct.unpack("<3I", key32[:12]))
                              + key32[12:16] + struct.pack("<I", SIGMA[1]) + nonce8 + counter
                              + struct.pack("<I", SIGMA[2]) + key32[16:32] + struct.pack("<I", SIGMA[3]))
        out.append(_core(state, 1))
    return xor(data, b"".join(out)[:len(data)])
