"""cryptoroutes/pure_salsa20.py: Salsa20/20 in pure Python, many 64-byte blocks at once.

Salsa20 is not in OpenSSL, so where neither PyNaCl nor pycryptodome is installed the
obfs4 frame cipher (XSalsa20-Poly1305, obfs4_crypto.py) runs it here. One block is 20
rounds of 32-bit add, rotate and xor on 16 words; done one block at a time in Python
that is ~1,300 interpreted operations per 64 bytes. But the blocks of a keystream are
independent (only the counter words differ), so we compute them **side by side**:

    lane i of a Python int = bits 40 i .. 40 i + 31    (the 8 bits above: guard, kept 0)

    word x_w of every block at once:  X_w = sum over blocks i of x_w(i) << 40 i
    x ^= (a + b) <<< k, every lane:   T = A + B
                                      X ^= (T << k) & H_k  |  (T >> (32 - k)) & L_k

H_k keeps bits k .. 31 of every lane, L_k bits 0 .. k-1. The carry of the 32-bit add
stops in the guard bits (bit 32 of its lane); the two masks drop it wherever the shifts
take it (into bits 32 .. 39, into the next lane's bits below k, or to bit k of its own
lane), and drop the bits a shift pulls in from the neighbouring lane, so the add needs
no mask of its own; the lanes stay byte-aligned (5 bytes each), which makes the words
cheap to pack and unpack. (Lanes of 64 bits, rotating with one multiply by 2^32 + 1,
take one operation less a step but ints 1.6 times as long: measured 1.1x slower for one
frame, 1.4x for a batch.) So one Python operation works on every block of a frame (or
of a whole write: ``keystreams`` takes blocks of many messages, each with its own
nonce) and the interpreter's cost per operation is paid once; what remains is C loops
over the ints' digits.

Measured (Python 3.11, one core of the shared 2-core machine, same run): one block at
a time ~70-95 µs a block; the 23 blocks of one obfs4 frame side by side ~5-10 µs a
block (12-14x less); a batch of 100-1,000 blocks ~3-4 µs a block. obfs4's sealing of
a whole write (obfs4_crypto.SecretBox.seal_packets) batches its frames this way.

Nothing here is constant time (Python integers are not), which is the same trade as the
other pure-Python routes; the keys are per connection.
"""

import struct

M32 = 0xFFFFFFFF
SIGMA = struct.unpack("<4I", b"expand 32-byte k")       # state words 0, 5, 10, 15
LANE_BYTES = 5                                          # 32 bits of a word, 8 guard bits


def _masks(count):
    """(M, H7, L7, H9, L9, H13, L13, H18, L18, ONE) for ``count`` lanes: M keeps the 32
    bits of every lane, Hk its bits k..31, Lk its bits 0..k-1, ONE is 1 in every lane."""
    found = _MASKS.get(count)
    if found is None:
        def every_lane(word):
            return int.from_bytes(word.to_bytes(LANE_BYTES, "little") * count, "little")
        found = (every_lane(M32),) + tuple(
            mask for k in (7, 9, 13, 18) for mask in (every_lane(M32 << k & M32), every_lane((1 << k) - 1))
        ) + (every_lane(1),)
        if len(_MASKS) > 64:
            _MASKS.clear()
        _MASKS[count] = found
    return found


_MASKS = {}


def _core(state, count):
    """The 64-byte Salsa20/20 blocks of ``count`` lanes, block after block.

    ``state`` is the 16 input words, each a lane int (X_w above); the result is
    bytes: block 0, block 1, ... Each output word is rounds(x)_w + x_w mod 2^32."""
    M, H7, L7, H9, L9, H13, L13, H18, L18, _ = _masks(count)
    x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15 = state
    for _ in range(10):
        # column round: (0 4 8 12) (5 9 13 1) (10 14 2 6) (15 3 7 11)
        t = x0 + x12
        x4 ^= t << 7 & H7 | t >> 25 & L7
        t = x4 + x0
        x8 ^= t << 9 & H9 | t >> 23 & L9
        t = x8 + x4
        x12 ^= t << 13 & H13 | t >> 19 & L13
        t = x12 + x8
        x0 ^= t << 18 & H18 | t >> 14 & L18
        t = x5 + x1
        x9 ^= t << 7 & H7 | t >> 25 & L7
        t = x9 + x5
        x13 ^= t << 9 & H9 | t >> 23 & L9
        t = x13 + x9
        x1 ^= t << 13 & H13 | t >> 19 & L13
        t = x1 + x13
        x5 ^= t << 18 & H18 | t >> 14 & L18
        t = x10 + x6
        x14 ^= t << 7 & H7 | t >> 25 & L7
        t = x14 + x10
        x2 ^= t << 9 & H9 | t >> 23 & L9
        t = x2 + x14
        x6 ^= t << 13 & H13 | t >> 19 & L13
        t = x6 + x2
        x10 ^= t << 18 & H18 | t >> 14 & L18
        t = x15 + x11
        x3 ^= t << 7 & H7 | t >> 25 & L7
        t = x3 + x15
        x7 ^= t << 9 & H9 | t >> 23 & L9
        t = x7 + x3
        x11 ^= t << 13 & H13 | t >> 19 & L13
        t = x11 + x7
        x15 ^= t << 18 & H18 | t >> 14 & L18
        # row round: (0 1 2 3) (5 6 7 4) (10 11 8 9) (15 12 13 14)
        t = x0 + x3
        x1 ^= t << 7 & H7 | t >> 25 & L7
        t = x1 + x0
        x2 ^= t << 9 & H9 | t >> 23 & L9
        t = x2 + x1
        x3 ^= t << 13 & H13 | t >> 19 & L13
        t = x3 + x2
        x0 ^= t << 18 & H18 | t >> 14 & L18
        t = x5 + x4
        x6 ^= t << 7 & H7 | t >> 25 & L7
        t = x6 + x5
        x7 ^= t << 9 & H9 | t >> 23 & L9
        t = x7 + x6
        x4 ^= t << 13 & H13 | t >> 19 & L13
        t = x4 + x7
        x5 ^= t << 18 & H18 | t >> 14 & L18
        t = x10 + x9
        x11 ^= t << 7 & H7 | t >> 25 & L7
        t = x11 + x10
        x8 ^= t << 9 & H9 | t >> 23 & L9
        t = x8 + x11
        x9 ^= t << 13 & H13 | t >> 19 & L13
        t = x9 + x8
        x10 ^= t << 18 & H18 | t >> 14 & L18
        t = x15 + x14
        x12 ^= t << 7 & H7 | t >> 25 & L7
        t = x12 + x15
        x13 ^= t << 9 & H9 | t >> 23 & L9
        t = x13 + x12
        x14 ^= t << 13 & H13 | t >> 19 & L13
        t = x14 + x13
        x15 ^= t << 18 & H18 | t >> 14 & L18
    size = LANE_BYTES * count
    out = bytearray(64 * count)
    for w, (x, start) in enumerate(zip((x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15),
                                       state)):
        lanes = (x + start & M).to_bytes(size, "little")
        for byte in range(4):
            out[4 * w + byte::64] = lanes[byte::LANE_BYTES]
    return bytes(out)


def _ramp(count):
    """0, 1, 2, .. count - 1 in lanes 0 .. count - 1: the block counters of one message."""
    found = _RAMPS.get(count)
    if found is None:
        found = int.from_bytes(b"".join(i.to_bytes(LANE_BYTES, "little") for i in range(count)), "little")
        if len(_RAMPS) > 64:
            _RAMPS.clear()
        _RAMPS[count] = found
    return found


_RAMPS = {}


def keystreams(key32, requests):
    """[Salsa20/20(key32, nonce8) keystream of ``length`` bytes, block counter from 0,
    for each (nonce8, length) in ``requests``]: every block of every request side by
    side in one pass of the rounds. (Block counters stay below 2^32: word 9 is 0.)"""
    if len(key32) != 32:
        raise ValueError("Salsa20 takes a 32-byte key, not %d" % len(key32))
    counts = [-(-length // 64) for _, length in requests]
    total = sum(counts)
    if total == 0:
        return [b"" for _ in requests]
    nonce_low = nonce_high = counter_low = 0
    shift = 0
    for (nonce8, _), count in zip(requests, counts):
        if len(nonce8) != 8:
            raise ValueError("Salsa20 takes an 8-byte nonce, not %d" % len(nonce8))
        n0, n1 = struct.unpack("<2I", nonce8)
        one = _masks(count)[-1]
        nonce_low |= n0 * one << shift
        nonce_high |= n1 * one << shift
        counter_low |= _ramp(count) << shift
        shift += 8 * LANE_BYTES * count
    same = _masks(total)[-1]    # 1 in every lane
    k = struct.unpack("<8I", key32)
    state = (SIGMA[0] * same, k[0] * same, k[1] * same, k[2] * same, k[3] * same, SIGMA[1] * same,
             nonce_low, nonce_high, counter_low, 0,
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
    """Salsa20/20(key32, nonce8) from block 0, XORed with ``data`` (read as its bytes,
    whatever the format of a memoryview)."""
    if type(data) is not bytes:
        data = memoryview(data).cast("B") if memoryview(data).c_contiguous else bytes(memoryview(data))
    return xor(data, keystreams(key32, [(nonce8, len(data))])[0])


def salsa20_xor_many(key32, messages):
    """[salsa20_xor(key32, nonce8, data) for each (nonce8, data)], all blocks in one pass."""
    streams = keystreams(key32, [(nonce8, len(data)) for nonce8, data in messages])
    return [xor(data, stream) for (_, data), stream in zip(messages, streams)]

