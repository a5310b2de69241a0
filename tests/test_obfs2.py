"""Tests for obfs2.py, the sans-IO obfs2 protocol.

Everything we compare against is computed here, from obfs2-spec.md alone:
``H`` is ``hashlib.sha256``, and AES-128-CTR is rebuilt from single AES-ECB
blocks with a Python integer as the 128-bit counter (``ref_keystream``). That
reference is itself anchored to published vectors (FIPS-197 for AES, NIST
SP 800-38A for CTR), so a mistake shared by the reference and obfs2.py cannot
hide. No expected value is copied from obfs2.py's own output.

Layout of the peer's handshake message, as the reference builds it::

    SEED(16) | E(PAD key of the sender, MAGIC(4) | PADLEN(4) | padding(PADLEN))
"""

import hashlib
import random
import re
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import obfs2
from accel import AES

# --- The reference, written from the spec -------------------------------------

MAGIC = bytes.fromhex("2bf5ca7e")     # UINT32(MAGIC_VALUE) on the wire, before encryption
INIT_PAD = b"Initiator obfuscation padding"
RESP_PAD = b"Responder obfuscation padding"
INIT_DATA = b"Initiator obfuscated data"
RESP_DATA = b"Responder obfuscated data"

INIT_SEED = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
RESP_SEED = bytes.fromhex("f0e1d2c3b4a5968778695a4b3c2d1e0f")


def H(x):
    return hashlib.sha256(x).digest()


def ref_mac(s, x, secret=None, n=1):
    """MAC(s, x) = H(s | x | s); with SECRET: H^n(s | x | H(SECRET) | s), n SHA-256 in a row."""
    if secret is None:
        return H(s + x + s)
    m = s + x + H(secret) + s
    for _ in range(n):
        m = H(m)
    return m


def ref_keystream(m, length):
    """AES-128-CTR keystream from AES-ECB: key m[:16]; the counter block starts at
    m[16:32] and is incremented as one 128-bit big-endian integer, modulo 2**128."""
    ecb = AES.new(m[:16], AES.MODE_ECB)
    counter = int.from_bytes(m[16:32], "big")
    blocks = []
    for i in range((length + 15) // 16):
        blocks.append(ecb.encrypt(((counter + i) % 2 ** 128).to_bytes(16, "big")))
    return b"".join(blocks)[:length]


def xor(a, b):
    assert len(a) == len(b)
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).to_bytes(len(a), "big")


def ref_encrypt(m, data, offset=0):
    """E(m, data) for the bytes at ``offset`` of a keystream that started at m."""
    return xor(ref_keystream(m, offset + len(data))[offset:], data)


def ref_message(seed, pad_key, padlen, padding=None, magic=MAGIC):
    """SEED | E(pad_key, MAGIC | UINT32(PADLEN) | padding). ``padlen`` may lie."""
    padding = filler(padlen) if padding is None else padding
    return seed + ref_encrypt(pad_key, magic + struct.pack(">I", padlen) + padding)


def filler(n, salt=0):
    """n deterministic bytes (Python 3.8 has no random.randbytes)."""
    return bytes((i * 151 + salt * 7 + 13) & 0xFF for i in range(n))


# --- Anchors for the reference -------------------------------------------------

def test_reference_aes_matches_fips197():
    # FIPS-197 appendix C.1, AES-128.
    ecb = AES.new(bytes.fromhex("000102030405060708090a0b0c0d0e0f"), AES.MODE_ECB)
    assert ecb.encrypt(bytes.fromhex("00112233445566778899aabbccddeeff")) == \
        bytes.fromhex("69c4e0d86a7b0430d8cdb78070b4c55a")


# NIST SP 800-38A F.5.1, CTR-AES128.Encrypt: key, initial counter block, 4 blocks.
SP800_38A_KEY = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c")
SP800_38A_CTR = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
SP800_38A_PLAIN = bytes.fromhex(
    "6bc1bee22e409f96e93d7e117393172a" "ae2d8a571e03ac9c9eb76fac45af8e51"
    "30c81c46a35ce411e5fbc1191a0a52ef" "f69f2445df4f9b17ad2b417be66c3710")
SP800_38A_CIPHER = bytes.fromhex(
    "874d6191b620e3261bef6864990db6ce" "9806f66b7970fdff8617187bb9fffdff"
    "5ae4df3edbd5d35e5b4f09020db03eab" "1e031dda2fbe03d1792170a0f3009cee")


def test_reference_ctr_matches_sp800_38a():
    m = SP800_38A_KEY + SP800_38A_CTR
    assert ref_encrypt(m, SP800_38A_PLAIN) == SP800_38A_CIPHER


def test_ctr_matches_sp800_38a_in_odd_pieces():
    stream = obfs2.ctr(SP800_38A_KEY + SP800_38A_CTR)
    pieces = [SP800_38A_PLAIN[:5], SP800_38A_PLAIN[5:21], SP800_38A_PLAIN[21:22], SP800_38A_PLAIN[22:]]
    assert b"".join(stream.encrypt(p) for p in pieces) == SP800_38A_CIPHER


# --- CTR counter wrap ----------------------------------------------------------

def test_ctr_counter_wraps_from_all_ones_to_zero():
    key = bytes.fromhex("00112233445566778899aabbccddeeff")
    ecb = AES.new(key, AES.MODE_ECB)
    keystream = obfs2.ctr(key + b"\xff" * 16).encrypt(bytes(48))
    assert keystream == (ecb.encrypt(b"\xff" * 16)           # ff..ff
                         + ecb.encrypt(b"\x00" * 16)         # wrapped to 00..00
                         + ecb.encrypt(b"\x00" * 15 + b"\x01"))
    assert keystream == ref_keystream(key + b"\xff" * 16, 48)


def test_ctr_carries_across_all_128_bits():
    # Some CTR modes split the block into a 64-bit nonce and a 64-bit counter;
    # obfs2's counter is the whole block, so the carry must reach the top half.
    key = bytes(range(16))
    ecb = AES.new(key, AES.MODE_ECB)
    iv = b"\x00" * 7 + b"\x05" + b"\xff" * 8
    keystream = obfs2.ctr(key + iv).encrypt(bytes(32))
    assert keystream == ecb.encrypt(iv) + ecb.encrypt(b"\x00" * 7 + b"\x06" + b"\x00" * 8)


def test_data_stream_crosses_the_wrap_when_the_iv_is_near_the_top(monkeypatch):
    # Seeds cannot be chosen to give an IV of ff..ff, so make the data keys
    # have one and check a whole connection still talks across the wrap.
    def keys_at_the_top(init_seed, resp_seed, secret_hash=None, iterations=1):
        return (b"I" * 16 + b"\xff" * 15 + b"\xfe", b"R" * 16 + b"\xff" * 16)
    monkeypatch.setattr(obfs2, "data_keys", keys_at_the_top)
    initiator, responder = make_pair(3, 4)
    connect(initiator, responder)
    message = filler(100)
    wire = initiator.send(message)
    assert wire == ref_encrypt(b"I" * 16 + b"\xff" * 15 + b"\xfe", message)
    assert responder.receive(wire) == message
    wire = responder.send(message)
    assert wire == ref_encrypt(b"R" * 16 + b"\xff" * 16, message)
    assert initiator.receive(wire) == message


# --- Helpers: scripted randomness, pairs, splits -------------------------------

class Script:
    """An injectable ``randbytes``: hands out the given chunks in order (the
    seed, then the padding) and checks that each is asked for at its length."""

    def __init__(self, *chunks):
        self.chunks = list(chunks)

    def __call__(self, n):
        chunk = self.chunks.pop(0)
        assert len(chunk) == n
        return chunk


def make_side(initiator, padlen, seed=None, padding=None, **kwargs):
    seed = (INIT_SEED if initiator else RESP_SEED) if seed is None else seed
    padding = filler(padlen, salt=1 if initiator else 2) if padding is None else padding
    return obfs2.Obfs2(initiator, randbytes=Script(seed, padding), padlen=padlen, **kwargs)


def make_pair(init_padlen, resp_padlen, **kwargs):
    return make_side(True, init_padlen, **kwargs), make_side(False, resp_padlen, **kwargs)


def whole(data):
    return [data]


def bytewise(data):
    return [data[i:i + 1] for i in range(len(data))]


def random_splits(seed):
    def split(data):
        rng = random.Random(seed)
        chunks, i = [], 0
        while i < len(data):
            n = rng.choice([0, 1, 2, 3, 7, 16, 23, 24, 25, 100, 1000, 5000])
            chunks.append(data[i:i + n])
            i += n
        return chunks
    split.__name__ = "random_splits_%d" % seed
    return split


SPLITS = [whole, bytewise, random_splits(1), random_splits(2), random_splits(3)]


def feed(receiver, data, split=whole):
    """Feed ``data`` in the pieces ``split`` makes; return all plaintext."""
    out = []
    for chunk in split(data):
        plaintext = receiver.receive(chunk)
        assert type(plaintext) is bytes
        out.append(plaintext)
    return b"".join(out)


def connect(initiator, responder, split=whole):
    """Both send their handshake at once (a shared-secret responder only once
    the initiator's has arrived); each receives the other's."""
    to_responder, to_initiator = initiator.start(), responder.start()
    assert feed(responder, to_responder, split) == b""
    to_initiator += responder.data_to_send()
    assert feed(initiator, to_initiator, split) == b""
    assert initiator.is_open and responder.is_open


# --- Pairs wired in memory -------------------------------------------------------

@pytest.mark.parametrize("split", SPLITS, ids=lambda s: s.__name__)
@pytest.mark.parametrize("padlens", [(0, 0), (1, 17), (300, 0), (8192, 8192)])
def test_pair_talks_both_ways(split, padlens):
    initiator, responder = make_pair(*padlens)
    connect(initiator, responder, split)
    messages = [b"hello", b"", b"x" * 1000, filler(4099), b"\x00" * 3]
    for message in messages:
        assert feed(responder, initiator.send(message), split) == message
        assert feed(initiator, responder.send(message[::-1]), split) == message[::-1]
    # Ciphertext length equals plaintext length; the stream never restarts.
    assert len(initiator.send(b"abc")) == 3
    assert initiator.send(b"same") != initiator.send(b"same")


def test_in_place_methods_continue_the_same_keystreams():
    """The relay's fast path: send_in_place/receive_in_place transform a
    buffer where it lies, interleaved freely with send/receive."""
    initiator, responder = make_pair(5, 9)
    with pytest.raises(RuntimeError):
        initiator.send_in_place(bytearray(3))
    with pytest.raises(RuntimeError):
        initiator.receive_in_place(bytearray(3))
    connect(initiator, responder)
    reference_initiator, reference_responder = make_pair(5, 9)
    connect(reference_initiator, reference_responder)
    for message in [b"first", filler(70000), b"", b"last"]:
        buffer = bytearray(message)
        initiator.send_in_place(memoryview(buffer))
        assert bytes(buffer) == reference_initiator.send(message)
        responder.receive_in_place(memoryview(buffer))
        assert bytes(buffer) == message
        wire = responder.send(message)
        buffer = bytearray(wire)
        initiator.receive_in_place(memoryview(buffer))
        assert bytes(buffer) == message
        assert reference_initiator.receive(reference_responder.send(message)) == message


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: s.__name__)
def test_data_glued_to_the_handshake_comes_out(split):
    # The responder may send data right behind its handshake (it knows both
    # seeds once the initiator's message arrived); the initiator gets it all.
    initiator, responder = make_pair(40, 9)
    to_responder, to_initiator = initiator.start(), responder.start()
    assert feed(responder, to_responder, split) == b""
    wire = to_initiator + responder.send(b"first") + responder.send(b" second")
    assert feed(initiator, wire, split) == b"first second"


def test_trailing_data_in_the_same_chunk_as_the_end_of_the_padding():
    initiator, responder = make_pair(10, 50)
    responder.receive(initiator.start())
    hello = responder.start()
    assert initiator.receive(hello[:-3]) == b""
    assert not initiator.is_open
    assert initiator.receive(hello[-3:] + responder.send(b"glued")) == b"glued"
    assert initiator.is_open


@pytest.mark.parametrize("padlen", [0, 1, 8192])
def test_opens_exactly_at_the_last_padding_byte(padlen):
    initiator, responder = make_pair(padlen, 0)
    hello = initiator.start()
    assert len(hello) == 24 + padlen
    assert responder.receive(hello[:-1]) == b""
    assert not responder.is_open
    assert responder.receive(hello[-1:]) == b""
    assert responder.is_open


def test_default_padlen_is_drawn_from_secrets_over_0_to_8192_inclusive(monkeypatch):
    asked = []

    def top_of_range(n):
        asked.append(n)
        return n - 1
    monkeypatch.setattr(obfs2.secrets, "randbelow", top_of_range)
    side = obfs2.Obfs2(True)
    assert asked == [8193] and side.padlen == 8192
    assert len(side.start()) == 24 + 8192


def test_default_padlen_is_random_and_in_range():
    lengths = set()
    for _ in range(40):
        side = obfs2.Obfs2(True)
        assert 0 <= side.padlen <= obfs2.MAX_PADDING
        assert len(side.start()) == 24 + side.padlen
        lengths.add(side.padlen)
    assert len(lengths) > 10


# --- Known answers, computed independently --------------------------------------

def check_known_answers(secret=None, n=1):
    """Our handshakes and data bytes equal the reference's, byte for byte, for
    both roles; and our sides accept the reference's bytes."""
    kwargs = {} if secret is None else {"shared_secret": secret, "hash_iterations": n}
    init_padding, resp_padding = filler(21, salt=5), filler(300, salt=6)
    initiator = make_side(True, 21, padding=init_padding, **kwargs)
    responder = make_side(False, 300, padding=resp_padding, **kwargs)

    init_pad = ref_mac(INIT_PAD, INIT_SEED, secret, n)
    resp_pad = ref_mac(RESP_PAD, RESP_SEED, secret, n)        # erratum 1: RESP_SEED
    init_secret = ref_mac(INIT_DATA, INIT_SEED + RESP_SEED, secret, n)
    resp_secret = ref_mac(RESP_DATA, INIT_SEED + RESP_SEED, secret, n)

    expected_init_hello = ref_message(INIT_SEED, init_pad, 21, init_padding)
    expected_resp_hello = ref_message(RESP_SEED, resp_pad, 300, resp_padding)
    assert initiator.start() == expected_init_hello
    # A shared-secret responder answers only once the initiator checked out.
    responder_first = responder.start()
    assert responder_first == (b"" if secret else expected_resp_hello)

    # Each side is fed the reference's bytes, not the other object's.
    assert feed(responder, expected_init_hello, bytewise) == b""
    assert responder.peer_seed == INIT_SEED and responder.peer_padlen == 21
    assert responder_first + responder.data_to_send() == expected_resp_hello
    assert responder.data_to_send() == b""          # owed once
    assert feed(initiator, expected_resp_hello, random_splits(7)) == b""
    assert initiator.peer_seed == RESP_SEED and initiator.peer_padlen == 300

    # Data: one continuous keystream per direction, from its own IV.
    sent = 0
    for message in [b"GET / HTTP/1.0\r\n\r\n", filler(33), b"z"]:
        assert initiator.send(message) == ref_encrypt(init_secret, message, sent)
        assert responder.receive(ref_encrypt(init_secret, message, sent)) == message
        assert responder.send(message) == ref_encrypt(resp_secret, message, sent)
        assert initiator.receive(ref_encrypt(resp_secret, message, sent)) == message
        sent += len(message)


def test_known_answers_without_a_secret():
    check_known_answers()


def test_known_answers_with_a_shared_secret_and_5_iterations():
    check_known_answers(secret=b"correct horse", n=5)


def test_known_answers_with_a_shared_secret_and_1_iteration():
    check_known_answers(secret=b"s", n=1)


def test_key_functions_match_the_reference():
    assert obfs2.mac(INIT_PAD, INIT_SEED) == H(INIT_PAD + INIT_SEED + INIT_PAD)
    assert obfs2.pad_key(INIT_SEED, True) == ref_mac(INIT_PAD, INIT_SEED)
    assert obfs2.pad_key(RESP_SEED, False) == ref_mac(RESP_PAD, RESP_SEED)
    assert obfs2.data_keys(INIT_SEED, RESP_SEED) == (
        ref_mac(INIT_DATA, INIT_SEED + RESP_SEED), ref_mac(RESP_DATA, INIT_SEED + RESP_SEED))
    secret_hash = H(b"k")
    assert obfs2.mac(INIT_PAD, INIT_SEED, secret_hash, 5) == ref_mac(INIT_PAD, INIT_SEED, b"k", 5)
    assert obfs2.data_keys(INIT_SEED, RESP_SEED, secret_hash, 3)[1] == \
        ref_mac(RESP_DATA, INIT_SEED + RESP_SEED, b"k", 3)


def test_read_header_decodes_a_reference_message():
    message = ref_message(RESP_SEED, ref_mac(RESP_PAD, RESP_SEED), 7, b"padding")
    seed, magic, padlen, stream = obfs2.read_header(message, initiator=False)
    assert (seed, magic, padlen) == (RESP_SEED, 0x2BF5CA7E, 7)
    assert stream.decrypt(message[24:]) == b"padding"


# --- Erratum 1 -----------------------------------------------------------------

def test_spec_text_responder_pad_key_is_rejected():
    # The spec text derives RESP_PAD from INIT_SEED. A responder doing that is
    # not what runs on the network, and our initiator must not accept it.
    spec_text = ref_message(RESP_SEED, ref_mac(RESP_PAD, INIT_SEED), 0)
    as_deployed = ref_message(RESP_SEED, ref_mac(RESP_PAD, RESP_SEED), 0)
    assert spec_text != as_deployed

    initiator = make_side(True, 0)
    initiator.start()
    with pytest.raises(obfs2.ProtocolError):
        initiator.receive(spec_text)

    initiator = make_side(True, 0)
    initiator.start()
    assert initiator.receive(as_deployed) == b"" and initiator.is_open


# --- Rejections and boundaries ----------------------------------------------------

@pytest.mark.parametrize("receiver_is_initiator", [True, False])
def test_wrong_magic_rejected_at_the_24th_byte(receiver_is_initiator):
    sender_seed = RESP_SEED if receiver_is_initiator else INIT_SEED
    label = RESP_PAD if receiver_is_initiator else INIT_PAD
    message = ref_message(sender_seed, ref_mac(label, sender_seed), 0,
                          magic=bytes.fromhex("2bf5ca7f"))
    receiver = make_side(receiver_is_initiator, 0)
    assert feed(receiver, message[:23], bytewise) == b""
    with pytest.raises(obfs2.ProtocolError, match="magic"):
        receiver.receive(message[23:24])
    assert not receiver.is_open


@pytest.mark.parametrize("receiver_is_initiator", [True, False])
def test_padding_from_the_wrong_role_is_rejected(receiver_is_initiator):
    # A message padded with the receiver's own role's label (a reflected
    # handshake) does not decrypt to the magic.
    seed = filler(16, salt=9)
    own_label = INIT_PAD if receiver_is_initiator else RESP_PAD
    receiver = make_side(receiver_is_initiator, 0)
    with pytest.raises(obfs2.ProtocolError):
        receiver.receive(ref_message(seed, ref_mac(own_label, seed), 0))


def test_random_bytes_rejected():
    rng = random.Random(42)
    for _ in range(50):
        garbage = bytes(rng.getrandbits(8) for _ in range(24 + rng.randrange(100)))
        with pytest.raises(obfs2.ProtocolError):
            make_side(False, 0).receive(garbage)


@pytest.mark.parametrize("padlen", [8193, 0x10000, 0xFFFFFFFF])
def test_padlen_above_max_rejected_before_any_padding(padlen):
    # Right seed, right pad key, right magic: only PADLEN is wrong.
    message = ref_message(INIT_SEED, ref_mac(INIT_PAD, INIT_SEED), padlen, padding=b"")
    responder = make_side(False, 0)
    assert responder.receive(message[:23]) == b""
    with pytest.raises(obfs2.ProtocolError, match="padding"):
        responder.receive(message[23:])


def test_padlen_exactly_max_accepted_with_glued_data():
    message = ref_message(RESP_SEED, ref_mac(RESP_PAD, RESP_SEED), 8192)
    assert len(message) == 24 + 8192
    data = ref_encrypt(ref_mac(RESP_DATA, INIT_SEED + RESP_SEED), b"after 8192")
    initiator = make_side(True, 0)
    assert feed(initiator, message + data, random_splits(11)) == b"after 8192"
    assert initiator.peer_padlen == 8192


# --- Shared secret ------------------------------------------------------------------

def test_shared_secret_pair_talks():
    initiator, responder = make_pair(5, 6, shared_secret="pw", hash_iterations=5)
    connect(initiator, responder, bytewise)
    assert responder.receive(initiator.send(b"ping")) == b"ping"
    assert initiator.receive(responder.send(b"pong")) == b"pong"


def test_str_and_bytes_secrets_are_the_same_secret():
    a = make_side(True, 3, shared_secret="pw", hash_iterations=5).start()
    b = make_side(True, 3, shared_secret=b"pw", hash_iterations=5).start()
    assert a == b == ref_message(INIT_SEED, ref_mac(INIT_PAD, INIT_SEED, b"pw", 5), 3,
                                 filler(3, salt=1))


@pytest.mark.parametrize("init_secret, resp_secret", [
    ("one", "two"), ("one", None), (None, "two")])
def test_mismatched_secrets_rejected_by_both_sides(init_secret, resp_secret):
    initiator = make_side(True, 0, shared_secret=init_secret, hash_iterations=5)
    responder = make_side(False, 0, shared_secret=resp_secret, hash_iterations=5)
    with pytest.raises(obfs2.ProtocolError):
        responder.receive(initiator.start())
    with pytest.raises(obfs2.ProtocolError):
        initiator.receive(responder.handshake())


def test_a_shared_secret_responder_says_nothing_until_the_initiator_checks_out():
    """The answer-later rule: a bare connect, or a wrong secret, costs the
    server no key work and gets no reply."""
    responder = make_side(False, 0, shared_secret="pw", hash_iterations=5)
    assert responder.expensive and responder.start() == b""
    assert responder.receive(b"\x00" * 10) == b"" and responder.data_to_send() == b""
    with pytest.raises(obfs2.ProtocolError):
        responder.receive(make_side(True, 0, shared_secret="other", hash_iterations=5).start()[:14])
    assert responder.data_to_send() == b""
    assert not make_side(False, 0).expensive        # without a secret: both send at once


def test_mismatched_iteration_counts_rejected():
    initiator = make_side(True, 0, shared_secret="pw", hash_iterations=5)
    responder = make_side(False, 0, shared_secret="pw", hash_iterations=6)
    with pytest.raises(obfs2.ProtocolError):
        responder.receive(initiator.start())


@pytest.mark.parametrize("variant", ["n-1 rounds", "n+1 rounds (C 0.1.4)", "16-byte H(SECRET)"])
def test_other_shared_secret_derivations_rejected(variant):
    # Exactly n SHA-256 rounds over the full 32-byte H(SECRET): the variants
    # that differ by one round or by a truncated H(SECRET) must not open.
    secret, n = b"pw", 5
    if variant == "n-1 rounds":
        key = ref_mac(INIT_PAD, INIT_SEED, secret, n - 1)
    elif variant.startswith("n+1"):
        key = ref_mac(INIT_PAD, INIT_SEED, secret, n + 1)
    else:
        key = INIT_PAD + INIT_SEED + H(secret)[:16] + INIT_PAD
        for _ in range(n):
            key = H(key)
    responder = make_side(False, 0, shared_secret=secret, hash_iterations=n)
    with pytest.raises(obfs2.ProtocolError):
        responder.receive(ref_message(INIT_SEED, key, 0))


def test_empty_shared_secret_means_no_secret():
    # Python obfsproxy tests the secret for truth: "" is no secret at all. A
    # SOCKS argument "shared-secret=" must therefore still talk to it.
    assert make_side(True, 2, shared_secret="").start() == \
        ref_message(INIT_SEED, ref_mac(INIT_PAD, INIT_SEED), 2, filler(2, salt=1))
    assert make_side(True, 2, shared_secret=b"").start() == make_side(True, 2).start()


# --- The contract's other members -------------------------------------------------

def test_contract_members():
    assert obfs2.Obfs2.secret_options == ("shared-secret",)        # never logged
    assert obfs2.Obfs2.uses_state_dir is False and obfs2.Obfs2.handshake_timeout is None
    assert obfs2.Obfs2.expensive is False
    assert obfs2.Obfs2.client_config({}).notes == ()
    assert obfs2.Obfs2.server_config({"shared-secret": "x"})[0].notes == ()


def test_a_wrong_magic_is_the_error_and_the_hint_says_what_to_check():
    initiator = make_side(True, 0, shared_secret="one", hash_iterations=5)
    responder = make_side(False, 0, shared_secret="two", hash_iterations=5)
    with pytest.raises(obfs2.ProtocolError) as error:
        responder.receive(initiator.start())
    assert re.fullmatch(r"invalid magic value 0x[0-9a-f]{8}", str(error.value))
    hint = "(wrong protocol, or a different shared secret)"
    assert responder.failure_hint("protocol") == initiator.failure_hint("protocol") == hint
    assert initiator.failure_hint("closed") == hint      # a secret responder just closes
    assert initiator.failure_hint("timeout") == "(is it an obfs2 server?)"
    assert responder.failure_hint("timeout") == ""


# --- Options ----------------------------------------------------------------------

def test_options_make_the_config_and_the_announce():
    config, announce = obfs2.Obfs2.server_config({"shared-secret": "pw", "ss-hash-iterations": "0010"})
    assert (config.shared_secret, config.hash_iterations) == (b"pw", 10)
    assert announce == {"shared-secret": "pw", "ss-hash-iterations": "10"}
    assert obfs2.Obfs2.client_config({}).hash_iterations == obfs2.HASH_ITERATIONS


def test_unknown_options_are_refused_naming_them_and_the_accepted_ones():
    with pytest.raises(ValueError) as error:
        obfs2.Obfs2.client_config({"cert": "x", "iat-mode": "0"})
    assert str(error.value) == ("unknown obfs2 argument(s): cert, iat-mode "
                                "(obfs2 takes shared-secret, ss-hash-iterations)")


@pytest.mark.parametrize("text", ["\u00b2", "\u2082", "\u2460", "\u0661\u0660", "1" * 5000, "0", "10000001",
                                  "-1", "+5", " 5", "5 ", "", "1e3", "0x10"],
                         ids=["superscript 2", "subscript 2", "circled 1", "Arabic-Indic 10",
                              "5000 digits", "0", "over the bound", "-1", "+5", "leading space",
                              "trailing space", "empty", "1e3", "hex"])
def test_ss_hash_iterations_takes_ascii_digits_within_the_bound(text):
    """str.isdigit() took the first three and int() refused them ("invalid literal for
    int()", naming no option); int() took Arabic-Indic digits as 10; over 4300 digits
    int() refuses too. Every one is a ValueError naming the option and its range."""
    with pytest.raises(ValueError) as error:
        obfs2.Obfs2.client_config({"ss-hash-iterations": text})
    assert str(error.value).startswith("ss-hash-iterations must be a whole number in 1..10000000, not ")
    assert len(str(error.value)) < 120


# --- The first message made ahead (pool.py) ------------------------------------------

@pytest.mark.parametrize("secret", [None, b"s3cret"])
@pytest.mark.parametrize("initiator", [True, False])
def test_a_prepared_side_sends_the_prepared_message_and_talks(secret, initiator):
    config = obfs2.Config(secret, hash_iterations=10)
    recipe = obfs2.Obfs2.prepare(initiator, config)
    if secret and not initiator:
        assert recipe is None            # a secret responder answers only checked initiators
        return
    key, make = recipe
    seed, padlen, message = prepared = make()
    side = obfs2.Obfs2(initiator, config, prepared=prepared,
                       randbytes=lambda n: pytest.fail("a prepared side draws no seed"))
    assert side.seed == seed and side.padlen == padlen and side.start() == message
    assert message[:16] == seed and len(message) == 24 + padlen
    other = obfs2.Obfs2(not initiator, config)
    connect(*((side, other) if initiator else (other, side)))
    assert other.receive(side.send(b"ping")) == b"ping"
    assert side.receive(other.send(b"pong")) == b"pong"


def test_prepared_pools_are_per_role_secret_and_rounds():
    keys = {obfs2.Obfs2.prepare(initiator, obfs2.Config(secret, rounds))[0]
            for initiator in (True, False) for secret in (None, b"a", b"b") for rounds in (10, 11)
            if obfs2.Obfs2.prepare(initiator, obfs2.Config(secret, rounds))}
    assert keys == {("obfs2 first messages", True, secret, rounds) for secret in (None, b"a", b"b")
                    for rounds in (10, 11)} | {("obfs2 first messages", False, None, rounds)
                                               for rounds in (10, 11)}
    assert obfs2.Obfs2.prepare(True, None)[0] == ("obfs2 first messages", True, None, obfs2.HASH_ITERATIONS)


# --- API misuse ---------------------------------------------------------------------

def test_send_before_open_raises():
    initiator, responder = make_pair(0, 100)
    with pytest.raises(RuntimeError):
        initiator.send(b"too early")
    hello = responder.start()
    initiator.start()
    initiator.receive(hello[:30])             # seed known, padding not finished
    assert not initiator.is_open
    with pytest.raises(RuntimeError):
        initiator.send(b"still too early")


@pytest.mark.parametrize("padlen", [-1, 8193, 100000])
def test_padlen_out_of_range_raises_value_error(padlen):
    with pytest.raises(ValueError):
        obfs2.Obfs2(True, padlen=padlen)


def test_hash_iterations_below_one_raises_value_error():
    with pytest.raises(ValueError):
        obfs2.Obfs2(True, shared_secret="pw", hash_iterations=0)


# --- Properties --------------------------------------------------------------------

def chunked(data, sizes):
    """Cut ``data`` at the given chunk sizes (cycled); the last chunk takes the rest."""
    chunks, i = [], 0
    for n in sizes:
        if i >= len(data):
            break
        chunks.append(data[i:i + n])
        i += n
    if i < len(data):
        chunks.append(data[i:])
    return chunks


split_sizes = st.lists(st.integers(min_value=0, max_value=64), max_size=40)


@st.composite
def peer_messages(draw):
    """What a peer might send: noise, or a header from the right pad key with
    any magic and any PADLEN, then any bytes."""
    receiver_is_initiator = draw(st.booleans())
    if draw(st.booleans()):
        return receiver_is_initiator, None, draw(st.binary(max_size=120))
    seed = draw(st.binary(min_size=16, max_size=16))
    label = RESP_PAD if receiver_is_initiator else INIT_PAD
    magic = draw(st.sampled_from([MAGIC, bytes.fromhex("2bf5ca7f"), b"\0\0\0\0"]))
    padlen = draw(st.one_of(st.integers(0, 40), st.sampled_from([8192, 8193, 2 ** 32 - 1])))
    header = seed + ref_encrypt(ref_mac(label, seed), magic + struct.pack(">I", padlen))
    tail = draw(st.binary(max_size=100))
    return receiver_is_initiator, (seed, magic, padlen), header + tail


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(peer_messages(), split_sizes)
def test_any_input_gives_bytes_or_protocol_error(message, sizes):
    receiver_is_initiator, header, data = message
    receiver = make_side(receiver_is_initiator, 0)
    valid = header is not None and header[1] == MAGIC and header[2] <= 8192
    fed, plaintext = 0, b""
    for chunk in chunked(data, sizes):
        try:
            out = receiver.receive(chunk)
        except obfs2.ProtocolError:
            # Only a bad header is refused, and only once all 24 bytes are in.
            assert not valid
            assert fed < 24 <= fed + len(chunk)
            return
        assert type(out) is bytes
        plaintext += out
        fed += len(chunk)
    if header is None:
        assert fed < 24 or receiver.is_open   # noise passes only if it happens to hold the magic
        return
    seed, _, padlen = header
    assert (fed < 24) or valid
    assert receiver.is_open == (valid and fed >= 24 + padlen)
    if receiver.is_open:
        init_seed, resp_seed = (INIT_SEED, seed) if receiver_is_initiator else (seed, RESP_SEED)
        label = RESP_DATA if receiver_is_initiator else INIT_DATA
        data_key = ref_mac(label, init_seed + resp_seed)
        assert plaintext == ref_encrypt(data_key, data[24 + padlen:])
    else:
        assert plaintext == b""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(init_seed=st.binary(min_size=16, max_size=16), resp_seed=st.binary(min_size=16, max_size=16),
       padlens=st.tuples(*[st.one_of(st.integers(0, 300), st.just(8192))] * 2),
       payload=st.binary(max_size=300), sizes=split_sizes, big_sizes=st.booleans())
def test_valid_handshake_in_any_split_opens_with_the_same_plaintext(
        init_seed, resp_seed, padlens, payload, sizes, big_sizes):
    if big_sizes:
        sizes = [n * 97 for n in sizes]
    initiator = make_side(True, padlens[0], seed=init_seed)
    responder = make_side(False, padlens[1], seed=resp_seed)
    init_hello, resp_hello = initiator.start(), responder.start()
    # Responder -> initiator: its handshake with data glued on, in the drawn split.
    responder.receive(init_hello)
    wire = resp_hello + responder.send(payload)
    out = b"".join(initiator.receive(chunk) for chunk in chunked(wire, sizes))
    assert initiator.is_open and out == payload
    # Initiator -> responder: the same, through a fresh responder with the same seed.
    responder = make_side(False, padlens[1], seed=resp_seed)
    wire = init_hello + initiator.send(payload)
    out = b"".join(responder.receive(chunk) for chunk in chunked(wire, sizes))
    assert responder.is_open and out == payload
