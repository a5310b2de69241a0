"""Tests for obfs3.py, the sans-IO obfs3 protocol.

Known answers come from shared/vectors/obfs3.json (the UniformDH test published
with pyobfsproxy and obfs4proxy, keys derived from its shared secret, a
transcript, a counter wrap). Everything else we compare against is computed
here from obfs3-spec.md alone: UniformDH with Python's ``pow``, the keys with
the ``hmac`` module, and AES-128-CTR rebuilt from single AES-ECB blocks with a
Python integer as the 128-bit counter (``ref_keystream``, anchored to NIST
SP 800-38A). No expected value is copied from obfs3.py's own output.

What one side puts on the wire, as the reference builds it::

    PUB(192) | PAD1 | PAD2 | MAGIC(32) | E(own data key, data)
"""

import hashlib
import hmac
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import load_vectors, pycryptodome_cipher

import obfs3

AES = pycryptodome_cipher("AES")

VECTORS = load_vectors("obfs3.json")
KAT = VECTORS["uniformdh_kat"]
DERIVED = VECTORS["derived_from_kat_shared_secret"]
TRANSCRIPT = VECTORS["transcript"]

# --- The reference, written from the spec -------------------------------------

# RFC 3526 group 5, typed again from obfs3-spec.md 2.2.
P = int(
    "FFFFFFFFFFFFFFFF C90FDAA22168C234 C4C6628B80DC1CD1 29024E088A67CC74"
    "020BBEA63B139B22 514A08798E3404DD EF9519B3CD3A431B 302B0A6DF25F1437"
    "4FE1356D6D51C245 E485B576625E7EC6 F44C42E9A637ED6B 0BFF5CB6F406B7ED"
    "EE386BFB5A899FA5 AE9F24117C4B1FE6 49286651ECE45B3D C2007CB8A163BF05"
    "98DA48361C55D39A 69163FA8FD24CF5F 83655D23DCA3AD96 1C62F356208552BB"
    "9ED529077096966D 670C354E4ABC9804 F1746C08CA237327 FFFFFFFFFFFFFFFF".replace(" ", ""), 16)

INIT_DATA = b"Initiator obfuscated data"
RESP_DATA = b"Responder obfuscated data"
INIT_MAGIC = b"Initiator magic"
RESP_MAGIC = b"Responder magic"

X_RAW = bytes.fromhex(KAT["x"])          # odd: the initiator sends p - g^(x-1)
Y_RAW = bytes.fromhex(KAT["y"])          # even: the responder sends g^y
X_PUB = bytes.fromhex(KAT["X"])
Y_PUB = bytes.fromhex(KAT["Y"])
SHARED = bytes.fromhex(KAT["shared_secret"])
X_PRIV = int.from_bytes(X_RAW, "big") & ~1
Y_PRIV = int.from_bytes(Y_RAW, "big") & ~1


def ref_keypair(raw):
    """Spec 2.2: v = raw; coin = v & 1; x = v with bit 0 cleared; X = g^x mod p;
    send X if coin == 0 else p - X, as 192 bytes."""
    v = int.from_bytes(raw, "big")
    x = v - (v % 2)
    X = pow(2, x, P)
    return x, (X if v % 2 == 0 else P - X).to_bytes(192, "big")


def ref_secret(x, peer_public):
    return pow(int.from_bytes(peer_public, "big"), x, P).to_bytes(192, "big")


def ref_hmac(secret, label):
    return hmac.new(secret, label, hashlib.sha256).digest()


def ref_keystream(m, length):
    """AES-128-CTR keystream from AES-ECB: key m[:16]; the counter block starts at
    m[16:32] and is incremented as one 128-bit big-endian integer, modulo 2**128."""
    ecb = AES.new(m[:16], AES.MODE_ECB)
    counter = int.from_bytes(m[16:32], "big")
    blocks = [ecb.encrypt(((counter + i) % 2 ** 128).to_bytes(16, "big"))
              for i in range((length + 15) // 16)]
    return b"".join(blocks)[:length]


def ref_encrypt(m, data, offset=0):
    """E(m, data) for the bytes at ``offset`` of the keystream that started at m."""
    stream = ref_keystream(m, offset + len(data))[offset:]
    return bytes(a ^ b for a, b in zip(stream, data))


def ref_flight(public, secret, sender_is_initiator, junk, data=b""):
    """What a peer sends: PUB | junk (its two paddings) | MAGIC | E(data)."""
    magic = ref_hmac(secret, INIT_MAGIC if sender_is_initiator else RESP_MAGIC)
    data_key = ref_hmac(secret, INIT_DATA if sender_is_initiator else RESP_DATA)
    assert magic not in junk
    return public + junk + magic + ref_encrypt(data_key, data)


def filler(n, salt=0):
    """n deterministic bytes (Python 3.8 has no random.randbytes)."""
    return bytes((i * 151 + salt * 7 + 13) & 0xFF for i in range(n))


# --- Anchors for the reference -------------------------------------------------

def test_reference_ctr_matches_sp800_38a():
    # NIST SP 800-38A F.5.1, CTR-AES128.Encrypt.
    m = bytes.fromhex("2b7e151628aed2a6abf7158809cf4f3c" "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
    plain = bytes.fromhex("6bc1bee22e409f96e93d7e117393172a" "ae2d8a571e03ac9c9eb76fac45af8e51")
    assert ref_encrypt(m, plain) == bytes.fromhex(
        "874d6191b620e3261bef6864990db6ce" "9806f66b7970fdff8617187bb9fffdff")


def test_reference_uniformdh_matches_the_kat():
    assert ref_keypair(X_RAW) == (X_PRIV, X_PUB)
    assert ref_keypair(Y_RAW) == (Y_PRIV, Y_PUB)
    assert ref_secret(X_PRIV, Y_PUB) == SHARED


# --- Constants ---------------------------------------------------------------------

def test_group_and_constants_are_the_specs():
    assert obfs3.P == P and obfs3.G == 2
    assert P.bit_length() == 1536
    assert obfs3.MAX_PADDING == 8194 and obfs3.MAX_PADLEN == 4097
    assert obfs3.MAGIC_SEARCH_LIMIT == 8226
    assert (obfs3.INIT_DATA_LABEL, obfs3.RESP_DATA_LABEL) == (INIT_DATA, RESP_DATA)
    assert (obfs3.INIT_MAGIC_LABEL, obfs3.RESP_MAGIC_LABEL) == (INIT_MAGIC, RESP_MAGIC)


def test_self_test_constants_are_the_published_kat():
    assert obfs3.KAT_Y == int(KAT["y"], 16) and KAT["y_low_bit"] == 0
    assert obfs3.KAT_Y_PUBLIC == int(KAT["Y"], 16)
    assert obfs3.KAT_X_PUBLIC == int(KAT["X"], 16)
    assert obfs3.KAT_SHARED_SECRET == int(KAT["shared_secret"], 16)


# --- UniformDH: known answers and both modexp routes --------------------------------

def test_uniformdh_kat_keypairs():
    assert KAT["x_low_bit"] == 1 and KAT["y_low_bit"] == 0
    # x is odd: the coin is 1, the exponent is x - 1, and p - g^(x-1) goes out.
    x, public = obfs3.keypair_from_bytes(X_RAW)
    assert x == int(KAT["x"], 16) - 1 and x % 2 == 0
    assert public == X_PUB == (P - pow(2, x, P)).to_bytes(192, "big")
    # y is even: the coin is 0, g^y goes out.
    y, public = obfs3.keypair_from_bytes(Y_RAW)
    assert y == int(KAT["y"], 16)
    assert public == Y_PUB


def test_uniformdh_kat_shared_secret_both_ways():
    assert obfs3.shared_secret(X_PRIV, Y_PUB) == SHARED
    assert obfs3.shared_secret(Y_PRIV, X_PUB) == SHARED


@pytest.mark.parametrize("route", [obfs3.modexp_python, obfs3.modexp_pycryptodome],
                         ids=["pow", "pycryptodome"])
def test_both_modexp_routes_reproduce_the_kat(route):
    assert P - route(2, X_PRIV, P) == int(KAT["X"], 16)
    assert route(2, Y_PRIV, P) == int(KAT["Y"], 16)
    assert route(int(KAT["Y"], 16), X_PRIV, P) == int(KAT["shared_secret"], 16)
    assert route(int(KAT["X"], 16), Y_PRIV, P) == int(KAT["shared_secret"], 16)


@pytest.mark.parametrize("route", [obfs3.modexp_python, obfs3.modexp_pycryptodome],
                         ids=["pow", "pycryptodome"])
@pytest.mark.parametrize("base", [0, 1, 2, P - 1, P, P + 1, 2 ** 1536 - 1])
def test_modexp_routes_on_edge_bases(route, base):
    # Bases at and above p reach modexp unchecked (erratum 7).
    exponent = 2 ** 1535 + 12345678
    assert route(base, exponent, P) == pow(base, exponent, P)


def test_the_fast_route_passed_its_self_test_here():
    # libcrypto (through ctypes) or pycryptodome is always there: a C route must be in use.
    assert obfs3.modexp is obfs3.modexp_pycryptodome
    assert obfs3.MODEXP_ROUTE.startswith(("libcrypto BN_mod_exp", "pycryptodome Integer"))


def test_choose_modexp_refuses_a_route_that_fails_the_kat():
    def wrong(base, exp, mod):
        return pow(base, exp, mod) ^ 1

    def only_base_2(base, exp, mod):           # right for keygen, wrong for secrets
        return pow(base, exp, mod) if base == 2 else 0

    def broken(base, exp, mod):
        raise OSError("no C library")

    for candidate in (wrong, only_base_2, broken):
        assert obfs3.choose_modexp(candidate) == (obfs3.modexp_python, "Python pow()")
    assert obfs3.choose_modexp(obfs3.modexp_pycryptodome)[0] is obfs3.modexp_pycryptodome


def test_keypair_needs_192_bytes():
    with pytest.raises(ValueError):
        obfs3.keypair_from_bytes(X_RAW[1:])
    with pytest.raises(ValueError):
        obfs3.shared_secret(X_PRIV, Y_PUB + b"\0")


# --- Keys and the CTR stream ---------------------------------------------------------

def test_keys_derived_from_the_kat_shared_secret():
    keys = obfs3.derive_keys(SHARED)
    assert keys.init_secret.hex() == DERIVED["INIT_SECRET"] == ref_hmac(SHARED, INIT_DATA).hex()
    assert keys.resp_secret.hex() == DERIVED["RESP_SECRET"] == ref_hmac(SHARED, RESP_DATA).hex()
    assert keys.init_magic.hex() == DERIVED["INIT_MAGIC"]
    assert keys.resp_magic.hex() == DERIVED["RESP_MAGIC"]
    assert DERIVED["INIT_SECRET"] == DERIVED["INIT_KEY"] + DERIVED["INIT_CTR"]
    assert DERIVED["RESP_SECRET"] == DERIVED["RESP_KEY"] + DERIVED["RESP_CTR"]
    init_stream = obfs3.ctr(keys.init_secret)
    assert (init_stream.encrypt(bytes(5)) + init_stream.encrypt(bytes(43))).hex() == \
        DERIVED["initiator_keystream_first_48"]
    assert obfs3.ctr(keys.resp_secret).encrypt(bytes(48)).hex() == DERIVED["responder_keystream_first_48"]
    assert ref_keystream(keys.resp_secret, 48).hex() == DERIVED["responder_keystream_first_48"]


def test_ctr_counter_wraps_from_all_ones_to_zero():
    vector = VECTORS["ctr_wrap"]
    m = bytes.fromhex(vector["key"] + vector["initial_counter"])
    assert obfs3.ctr(m).encrypt(bytes(32)).hex() == vector["keystream_first_32"]
    ecb = AES.new(bytes(16), AES.MODE_ECB)
    assert bytes.fromhex(vector["keystream_first_32"])[16:] == ecb.encrypt(bytes(16))


# --- Helpers: scripted sides, pairs, splits ------------------------------------------

class Script:
    """An injectable ``randbytes``: hands out the given chunks in order and
    checks that each is asked for at its length."""

    def __init__(self, *chunks):
        self.chunks = list(chunks)

    def __call__(self, n):
        chunk = self.chunks.pop(0)
        assert len(chunk) == n
        return chunk


def make_side(initiator, padlen1=0, padlen2=0, keypair=None):
    """A side with the KAT keypair of its role (no keygen cost) and fixed paddings."""
    if keypair is None:
        keypair = (X_PRIV, X_PUB) if initiator else (Y_PRIV, Y_PUB)
    salt = 1 if initiator else 2
    config = obfs3.Obfs3Config(randbytes=Script(filler(padlen1, salt), filler(padlen2, salt + 2)),
                               padlen=iter([padlen1, padlen2]).__next__,
                               keypairs=lambda: keypair)
    return obfs3.Obfs3(initiator, config)


def make_pair(init_pads=(0, 0), resp_pads=(0, 0)):
    return make_side(True, *init_pads), make_side(False, *resp_pads)


def whole(data):
    return [data]


def bytewise(data):
    return [data[i:i + 1] for i in range(len(data))]


def random_splits(seed):
    def split(data):
        rng = random.Random(seed)
        chunks, i = [], 0
        while i < len(data):
            n = rng.choice([0, 1, 2, 3, 31, 32, 33, 191, 192, 193, 1000, 5000])
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


def exchange_public_values(initiator, responder, split=whole):
    """Both send PUB | PAD1 at once; each receives the other's. Both are open
    now, though neither magic has been sent."""
    to_responder, to_initiator = initiator.start(), responder.start()
    assert feed(responder, to_responder, split) == b""
    assert feed(initiator, to_initiator, split) == b""
    assert initiator.is_open and responder.is_open
    assert initiator.state == responder.state == obfs3.SEARCH_MAGIC


# --- The transcript vector -------------------------------------------------------------

def transcript_side(initiator):
    """A side whose raw UniformDH bytes and paddings are the transcript's; the
    keypair goes through the default key generation (keypairs=None)."""
    role = "initiator" if initiator else "responder"
    wire = bytes.fromhex(TRANSCRIPT[role + "_to_" + ("responder" if initiator else "initiator")])
    pad1, pad2 = TRANSCRIPT[role + "_pad1_len"], TRANSCRIPT[role + "_pad2_len"]
    raw = X_RAW if initiator else Y_RAW
    paddings = Script(raw, wire[192:192 + pad1], wire[192 + pad1:192 + pad1 + pad2])
    config = obfs3.Obfs3Config(randbytes=paddings, padlen=iter([pad1, pad2]).__next__)
    return obfs3.Obfs3(initiator, config), wire, bytes.fromhex(TRANSCRIPT[role + "_plaintext"])


def test_transcript_both_directions():
    initiator, init_wire, init_plain = transcript_side(True)
    responder, resp_wire, resp_plain = transcript_side(False)
    init_pad1, resp_pad1 = TRANSCRIPT["initiator_pad1_len"], TRANSCRIPT["responder_pad1_len"]
    # PUB | PAD1 first, then PAD2 | MAGIC | E(data): together the vector, byte for byte.
    assert initiator.start() == init_wire[:192 + init_pad1]
    assert responder.start() == resp_wire[:192 + resp_pad1]
    # Each side is fed the vector's bytes of the other side, not the other object's.
    assert feed(responder, init_wire, bytewise) == init_plain
    assert feed(initiator, resp_wire, random_splits(7)) == resp_plain
    assert responder.peer_padding == TRANSCRIPT["magic_offset_after_pubkey_initiator"]
    assert initiator.peer_padding == TRANSCRIPT["magic_offset_after_pubkey_responder"]
    assert initiator.send(init_plain) == init_wire[192 + init_pad1:]
    assert responder.send(resp_plain) == resp_wire[192 + resp_pad1:]


# --- Pairs wired in memory ----------------------------------------------------------------

@pytest.mark.parametrize("split", SPLITS, ids=lambda s: s.__name__)
@pytest.mark.parametrize("pads", [((0, 0), (0, 0)), ((1, 17), (300, 0)), ((4097, 4097), (4097, 4097))])
def test_pair_talks_both_ways(split, pads):
    initiator, responder = make_pair(*pads)
    exchange_public_values(initiator, responder, split)
    messages = [b"hello", b"", b"x" * 1000, filler(4099), b"\x00" * 3]
    for message in messages:
        assert feed(responder, initiator.send(message), split) == message
        assert feed(initiator, responder.send(message[::-1]), split) == message[::-1]
    assert responder.peer_padding == sum(pads[0])
    assert initiator.peer_padding == sum(pads[1])
    # Ciphertext length equals plaintext length; the stream never restarts.
    assert len(initiator.send(b"abc")) == 3
    assert initiator.send(b"same") != initiator.send(b"same")


def cut_at(sizes):
    """A split that cuts at the given chunk sizes, cycled (zeros are empty reads)."""
    sizes = sizes if any(sizes) else [1]

    def split(data):
        chunks, i = [], 0
        while i < len(data):
            for n in sizes:
                chunks.append(data[i:i + n])
                i += n
        return chunks
    return split


chunk_sizes = st.lists(st.integers(min_value=0, max_value=700), min_size=1, max_size=20)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk_sizes, chunk_sizes, st.tuples(st.integers(0, 600), st.integers(0, 600)))
def test_every_split_gives_the_same_plaintext(to_responder_sizes, to_initiator_sizes, pads):
    # One pair writes both directions' whole wires; an identical fresh pair reads them.
    initiator, responder = make_pair(pads, pads[::-1])
    exchange_public_values(initiator, responder)
    reader_initiator, reader_responder = make_pair(pads, pads[::-1])
    to_responder = reader_initiator.start() + initiator.send(b"GET /") + initiator.send(filler(999))
    to_initiator = reader_responder.start() + responder.send(b"200 OK") + responder.send(b"")
    assert feed(reader_responder, to_responder, cut_at(to_responder_sizes)) == b"GET /" + filler(999)
    assert feed(reader_initiator, to_initiator, cut_at(to_initiator_sizes)) == b"200 OK"
    assert reader_initiator.state == reader_responder.state == obfs3.OPEN


def test_first_send_is_pad2_magic_data_then_data_only():
    initiator, responder = make_pair((3, 11), (0, 0))
    exchange_public_values(initiator, responder)
    keys_secret = ref_secret(X_PRIV, Y_PUB)
    first = initiator.send(b"abc")
    assert first == filler(11, 3) + ref_hmac(keys_secret, INIT_MAGIC) + \
        ref_encrypt(ref_hmac(keys_secret, INIT_DATA), b"abc")
    assert initiator.send(b"de") == ref_encrypt(ref_hmac(keys_secret, INIT_DATA), b"de", 3)
    # The responder's first send, even empty, carries its padding and magic.
    assert responder.send(b"") == ref_hmac(keys_secret, RESP_MAGIC)


def test_data_sent_before_the_peers_magic_arrives_still_decrypts():
    # obfs4proxy's server sends its magic only with its first data; neither side
    # may wait for the other's magic before sending its own.
    initiator, responder = make_pair((5, 6), (7, 8))
    exchange_public_values(initiator, responder)
    to_initiator = responder.send(b"server speaks first")
    to_responder = initiator.send(b"client too")
    assert initiator.receive(to_initiator) == b"server speaks first"
    assert responder.receive(to_responder) == b"client too"
    assert initiator.state == responder.state == obfs3.OPEN


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: s.__name__)
def test_data_glued_to_the_first_flight_comes_out(split):
    initiator, responder = make_pair((40, 9), (100, 2))
    to_responder = initiator.start()
    to_initiator = responder.start()
    assert responder.receive(to_responder) == b""
    wire = to_initiator + responder.send(b"first") + responder.send(b" second")
    assert feed(initiator, wire, split) == b"first second"


def test_open_exactly_at_the_192nd_byte_without_any_magic():
    initiator = make_side(True)
    initiator.start()
    assert initiator.receive(Y_PUB[:191]) == b""
    assert not initiator.is_open and initiator.state == obfs3.WAIT_KEY
    assert initiator.receive(Y_PUB[191:]) == b""
    assert initiator.is_open and initiator.state == obfs3.SEARCH_MAGIC
    assert initiator.data_to_send() == b""       # the magic waits for data (lazy, as obfs4proxy)
    assert initiator.peer_public == Y_PUB


# --- The magic search and its limits ----------------------------------------------------------

def responder_fed(junk_length, data=b"", split=whole):
    """A responder fed the KAT initiator's value, ``junk_length`` bytes of padding,
    its magic and E(data). Returns (responder, plaintext)."""
    responder = make_side(False)
    responder.start()
    flight = ref_flight(X_PUB, SHARED, True, filler(junk_length, 5), data)
    return responder, feed(responder, flight, split)


@pytest.mark.parametrize("split", [whole, bytewise, random_splits(4)], ids=lambda s: s.__name__)
def test_magic_at_the_limit_8194_accepted(split):
    responder, plaintext = responder_fed(8194, b"after the paddings", split)
    assert plaintext == b"after the paddings"
    assert responder.peer_padding == 8194


NO_MAGIC = ("no peer magic within the 8226 bytes after its public value "
            "(its paddings may total 8194 bytes at most)")


def test_magic_at_8195_rejected():
    with pytest.raises(obfs3.ProtocolError) as error:
        responder_fed(8195, b"too late")
    assert str(error.value) == NO_MAGIC


def test_magic_at_8195_rejected_when_fed_byte_by_byte():
    # Fed slowly, the 8226th byte after the value (the magic's 31st) ends it.
    responder = make_side(False)
    responder.start()
    flight = ref_flight(X_PUB, SHARED, True, filler(8195, 5))
    assert feed(responder, flight[:192 + 8225], random_splits(5)) == b""
    with pytest.raises(obfs3.ProtocolError):
        responder.receive(flight[192 + 8225:192 + 8226])


def test_8225_junk_bytes_wait_8226_fail():
    responder = make_side(False)
    responder.start()
    junk = filler(8226, 9)
    assert responder.receive(X_PUB + junk[:8225]) == b""
    assert responder.state == obfs3.SEARCH_MAGIC and responder.is_open
    with pytest.raises(obfs3.ProtocolError, match="no peer magic"):
        responder.receive(junk[8225:])
    assert responder.state == obfs3.FAILED
    # Failed for good: nothing the peer sends later repairs it.
    with pytest.raises(obfs3.ProtocolError):
        responder.receive(ref_hmac(SHARED, INIT_MAGIC))


@pytest.mark.parametrize("cut", range(33))
def test_magic_straddling_two_reads_is_found(cut):
    responder = make_side(False)
    responder.start()
    flight = ref_flight(X_PUB, SHARED, True, filler(100, 6), b"data")
    boundary = 192 + 100 + cut
    assert responder.receive(flight[:boundary]) == b""
    assert responder.receive(flight[boundary:]) == b"data"


def test_reflected_magic_is_not_accepted():
    # A responder searches for INIT_MAGIC; its own RESP_MAGIC coming back is junk.
    responder = make_side(False)
    responder.start()
    reflected = X_PUB + ref_hmac(SHARED, RESP_MAGIC) + filler(8194, 2)
    with pytest.raises(obfs3.ProtocolError):
        responder.receive(reflected)


junk_lengths = st.one_of(st.integers(0, 64), st.integers(8160, 8230))
split_sizes = st.lists(st.integers(min_value=0, max_value=3000), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(junk_lengths, split_sizes)
def test_any_padding_length_opens_or_fails_by_the_limit(junk_length, sizes):
    responder = make_side(False)
    responder.start()
    flight = ref_flight(X_PUB, SHARED, True, filler(junk_length, 8), b"payload")
    chunks, i = [], 0
    for n in sizes * 10:
        chunks.append(flight[i:i + n])
        i += n
    chunks.append(flight[i:])
    out = b""
    try:
        for chunk in chunks:
            out += responder.receive(chunk)
    except obfs3.ProtocolError as error:
        # The same outcome and the same reason for every split (it was "no peer magic in
        # the 8368 bytes" in one split, "8323" in another, "starts 8195 bytes" in a third).
        assert junk_length > 8194 and str(error) == NO_MAGIC
        return
    assert junk_length <= 8194 and out == b"payload"


# --- Fixed-width encodings and peer values nobody checks -----------------------------------

def test_public_value_with_a_leading_zero_byte():
    # An input whose public value (p - X, coin 1) is below 2^1528; checked with the reference.
    raw = hashlib.shake_256(b"obfs3 leading zero 1126").digest(192)
    x, expected = ref_keypair(raw)
    assert expected[0] == 0 and raw[-1] & 1 == 1
    assert obfs3.keypair_from_bytes(raw) == (x, expected)
    initiator = make_side(True, 3, 4, keypair=(x, expected))
    responder = make_side(False, 5, 6)
    exchange_public_values(initiator, responder, bytewise)
    assert responder.peer_public == expected
    assert responder.receive(initiator.send(b"ping")) == b"ping"
    assert initiator.receive(responder.send(b"pong")) == b"pong"


def test_shared_secret_with_a_leading_zero_byte_keys_all_192_bytes():
    raw = hashlib.shake_256(b"obfs3 leading zero secret 158").digest(192)
    x, public = ref_keypair(raw)
    secret = ref_secret(x, Y_PUB)
    assert secret[0] == 0 and len(secret) == 192
    assert obfs3.shared_secret(x, Y_PUB) == secret
    responder = make_side(False)
    responder.start()
    assert responder.receive(ref_flight(public, secret, True, filler(9), b"zero")) == b"zero"


@pytest.mark.parametrize("value", [0, 1, P - 1, P, P + 1, 2 ** 1536 - 1],
                         ids=["0", "1", "p-1", "p", "p+1", "all-ff"])
def test_any_192_byte_peer_value_is_accepted(value):
    # Erratum 7: nobody validates the value; (p - 1)^x = 1 since x is even.
    peer = value.to_bytes(192, "big")
    secret = ref_secret(Y_PRIV, peer)
    responder = make_side(False)
    responder.start()
    assert responder.receive(ref_flight(peer, secret, True, b"", b"degenerate")) == b"degenerate"


# --- The in-place fast path -----------------------------------------------------------------

def test_in_place_paths_wait_for_the_magics_then_match_send_and_receive():
    initiator, responder = make_pair((2, 3), (4, 5))
    reference_initiator, reference_responder = make_pair((2, 3), (4, 5))
    exchange_public_values(initiator, responder)
    exchange_public_values(reference_initiator, reference_responder)

    # Our magic has not gone out: False, and nothing changed.
    buffer = bytearray(b"untouched")
    assert initiator.send_in_place(memoryview(buffer)) is False
    assert buffer == b"untouched"
    first = initiator.send(b"first")
    assert first == reference_initiator.send(b"first")
    # The peer's magic has not been found: False, and nothing changed.
    buffer = bytearray(first)
    assert responder.receive_in_place(memoryview(buffer)) is False
    assert buffer == first and responder.state == obfs3.SEARCH_MAGIC
    assert responder.receive(first) == b"first"
    assert reference_responder.receive(first) == b"first"
    answer = responder.send(b"answer")
    assert initiator.receive(answer) == b"answer" == reference_initiator.receive(
        reference_responder.send(b"answer"))

    for message in [b"x", filler(70000), b"", b"last"]:
        buffer = bytearray(message)
        assert initiator.send_in_place(memoryview(buffer)) is True
        assert bytes(buffer) == reference_initiator.send(message)
        assert responder.receive_in_place(memoryview(buffer)) is True
        assert bytes(buffer) == message
        buffer = bytearray(message)
        assert responder.send_in_place(memoryview(buffer)) is True
        assert bytes(buffer) == reference_responder.send(message)
        assert reference_initiator.receive(bytes(buffer)) == message
        assert initiator.receive_in_place(memoryview(buffer)) is True
        assert bytes(buffer) == message


# --- The transport contract and API misuse ---------------------------------------------------

def test_transport_attributes_and_configs():
    assert obfs3.Obfs3.name == "obfs3"
    assert obfs3.Obfs3.ProtocolError is obfs3.ProtocolError
    assert issubclass(obfs3.ProtocolError, Exception)
    assert obfs3.Obfs3.expensive is True
    assert obfs3.Obfs3.handshake_timeout is None and obfs3.Obfs3.secret_options == ()
    assert obfs3.Obfs3.uses_state_dir is False
    assert not hasattr(obfs3, "HANDSHAKE_TIMEOUT")        # the core's deadline, not ours
    assert isinstance(obfs3.Obfs3.client_config({}), obfs3.Obfs3Config)
    config, announce = obfs3.Obfs3.server_config({}, None)
    assert isinstance(config, obfs3.Obfs3Config) and announce == {} and config.notes == ()


@pytest.mark.parametrize("make", [obfs3.Obfs3.client_config,
                                  lambda options: obfs3.Obfs3.server_config(options, None)],
                         ids=["client", "server"])
def test_arguments_are_refused_not_ignored(make):
    """obfs4proxy ignores them; a user who put obfs4's cert= and iat-mode= on an obfs3
    bridge line then waited 30 s for a timeout. Now it is said at once."""
    with pytest.raises(ValueError) as error:
        make({"iat-mode": "0", "cert": "AAAA"})
    assert str(error.value) == "obfs3 takes no arguments (got cert, iat-mode)"


def test_failure_hints():
    client, server = make_side(True), make_side(False)
    assert client.failure_hint("protocol") == "(is it an obfs3 server?)"
    assert client.failure_hint("timeout").startswith("(is it an obfs3 server?")
    assert "prober" in server.failure_hint("protocol")
    assert server.failure_hint("closed") == "" and client.failure_hint("other") == ""


def test_a_prepared_keypair_comes_first_and_talks():
    key, make = obfs3.Obfs3.prepare(True, obfs3.Obfs3Config())
    assert key == "obfs3 keypairs" and obfs3.Obfs3.prepare(False, None)[0] == key
    config = obfs3.Obfs3Config(keypairs=lambda: pytest.fail("the prepared keypair comes first"))
    pooled = make()
    side = obfs3.Obfs3(True, config, prepared=pooled)
    flight = side.start()
    assert flight[:192] == pooled[1] == side.public
    peer = obfs3.Obfs3(False, prepared=make())
    peer_flight = peer.start()
    assert peer.receive(flight) == b"" and side.receive(peer_flight) == b""
    assert peer.receive(side.send(b"up")) == b"up"
    assert side.receive(peer.send(b"down")) == b"down"


def test_the_constructor_does_no_key_work():
    """The core serialises start() and receive() only: the keypair is made in start()."""
    drawn = []
    side = obfs3.Obfs3(True, obfs3.Obfs3Config(keypairs=lambda: drawn.append(1) or (X_PRIV, X_PUB)))
    assert drawn == []
    side.start()
    assert drawn == [1]


def test_default_config_draws_paddings_from_secrets_and_keys_from_randbytes(monkeypatch):
    asked = []

    def top_of_range(n):
        asked.append(n)
        return n - 1
    monkeypatch.setattr(obfs3.secrets, "randbelow", top_of_range)
    side = obfs3.Obfs3(True, obfs3.Obfs3Config(randbytes=Script(X_RAW, filler(4097))))
    assert asked == [4098, 4098] and side.padlen1 == side.padlen2 == 4097
    assert side.start() == X_PUB + filler(4097)


def test_default_config_is_random_and_in_range():
    lengths = set()
    for _ in range(20):
        side = obfs3.Obfs3(False)
        assert 0 <= side.padlen1 <= 4097 and 0 <= side.padlen2 <= 4097
        lengths.update((side.padlen1, side.padlen2))
    assert len(lengths) > 10
    assert obfs3.Obfs3Config().randbytes is obfs3.os.urandom
    flight = side.start()
    assert len(flight) == 192 + side.padlen1 and flight[:192] == side.public


@pytest.mark.parametrize("padlen", [-1, 4098, 8194])
def test_padlen_out_of_range_raises_value_error(padlen):
    with pytest.raises(ValueError):
        obfs3.Obfs3(True, obfs3.Obfs3Config(padlen=lambda: padlen))


def test_misuse_raises_runtime_error():
    initiator = make_side(True)
    with pytest.raises(RuntimeError):
        initiator.receive(Y_PUB)            # before start()
    initiator.start()
    with pytest.raises(RuntimeError):
        initiator.start()
    with pytest.raises(RuntimeError):
        initiator.send(b"too early")        # no keys yet
    assert initiator.send_in_place(bytearray(3)) is False
    assert initiator.receive_in_place(bytearray(3)) is False
