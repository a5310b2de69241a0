"""obfs4_crypto against the known answers in shared/vectors, on every route.

Every vector of obfs4-primitives.json, obfs4-elligator2.json and
obfs4-drbg-probdist.json that concerns these primitives is checked here. The ``route``
fixture runs a test once per route: the one the import-time self-tests chose, then
each family patched in by hand (PyNaCl, pycryptodome, pure Python), so every route is
proven on the same vectors whichever one this machine picks. A route whose library is
missing is skipped here, and fails in CI (CI=true), which installs them all; PyNaCl
ignored on purpose (OBFSPROXY_CRYPTO=portable) is skipped everywhere.
"""

import hashlib
import json
import os
import random
import subprocess
import sys
import types

import pytest
from crypto_routes import ROUTES, need, use_route
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_crypto import live_native_objects, salsa20_xor_one_block_at_a_time
from support import ROOT, load_vectors, pycryptodome_cipher

import obfs4_crypto as c
import obfs4_drbg
from cryptoroutes import chooser, framebox, pure_salsa20
from cryptoroutes import curve25519 as curve

Salsa20 = pycryptodome_cipher("Salsa20")   # a second opinion, whatever OBFSPROXY_CRYPTO says

PRIMITIVES = load_vectors("obfs4-primitives.json")
ELLIGATOR = load_vectors("obfs4-elligator2.json")
DRBG = load_vectors("obfs4-drbg-probdist.json")
h = bytes.fromhex
P = 2 ** 255 - 19
@pytest.fixture(params=ROUTES)
def route(request, monkeypatch):
    """Run the test on the self-tested routes, then on each family patched in."""
    use_route(monkeypatch, request.param)
    return request.param


def cases(section):
    return section["cases"]


# --- buffers whose items are not bytes -------------------------------------------------

def words(data):
    """``data`` as a memoryview of 4-byte items (len() counts words, not bytes)."""
    return memoryview(bytearray(data)).cast("I")


def test_every_route_reads_a_view_of_words_as_its_bytes(route):
    """A memoryview whose items are 4-byte words is sealed, opened, MACed and encrypted as
    its bytes on every route (never as its first len() bytes), or refused."""
    key, prefix, packet = bytes(range(32)), bytes(range(16)), bytes(range(200)) * 2    # box: 416 bytes
    box = c.SecretBox(key, prefix).seal(7, packet)
    assert c.SecretBox(key, prefix).seal(7, words(packet)) == box
    assert bytes(c.SecretBox(key, prefix).open_view(7, words(box))) == packet
    assert c.SecretBox(key, prefix).seal_packets(7, [words(packet)]) == [box]
    assert c.poly1305(key, words(packet)) == c.poly1305(key, packet)
    salsa20 = c._salsa20_xor
    assert bytes(salsa20(key, prefix[:8], words(packet))) == bytes(salsa20(key, prefix[:8], packet))


# --- HKDF, HSalsa20, XSalsa20 ---------------------------------------------------------

def test_hkdf_sha256_rfc5869_case_1():
    v = PRIMITIVES["hkdf_sha256"]
    assert c.hkdf_sha256_extract(h(v["salt"]), h(v["ikm"])) == h(v["prk"])
    assert c.hkdf_sha256(h(v["ikm"]), h(v["salt"]), h(v["info"]), v["length"]) == h(v["okm"])
    # a shorter output is a prefix of the longer one (same T(1), T(2), ...)
    assert c.hkdf_sha256(h(v["ikm"]), h(v["salt"]), h(v["info"]), 5) == h(v["okm"])[:5]


def test_hkdf_refuses_more_than_255_blocks():
    with pytest.raises(ValueError, match="8160"):
        c.hkdf_sha256(b"ikm", b"salt", b"info", 255 * 32 + 1)


@pytest.mark.parametrize("v", cases(PRIMITIVES["hsalsa20"]))
def test_hsalsa20(route, v):
    assert c.hsalsa20(h(v["key"]), h(v["input16"])) == h(v["output"])


@settings(max_examples=50)
@given(key=st.binary(min_size=32, max_size=32), input16=st.binary(min_size=16, max_size=16))
def test_hsalsa20_routes_agree(key, input16):
    """The Salsa20-block route must also reach block counters near 2^64 (input16[8:16])."""
    assert c.hsalsa20(key, input16) == c._hsalsa20_pure(key, input16)
    top = input16[:8] + b"\xff" * 8
    assert c.hsalsa20(key, top) == c._hsalsa20_pure(key, top)


@settings(max_examples=60)
@given(key=st.binary(min_size=32, max_size=32), nonce=st.binary(min_size=8, max_size=8),
       data=st.binary(max_size=1500))
def test_salsa20_routes_agree(key, nonce, data):
    """Our Salsa20 (the chosen route, and the pure one a block at a time) against
    pycryptodome's public Salsa20 where it is installed, any buffer type in."""
    want = salsa20_xor_one_block_at_a_time(key, nonce, data)
    if Salsa20 is not None:
        assert Salsa20.new(key=key, nonce=nonce).encrypt(data) == want
    assert bytes(c._salsa20_xor(key, nonce, data)) == want
    assert bytes(c._salsa20_xor(key, nonce, memoryview(bytearray(data)))) == want


def test_a_wrong_key_length_fails_loudly():
    """A wrong key length must raise, never read past a buffer."""
    for key, nonce in ((bytes(31), bytes(8)), (bytes(32), bytes(7))):
        with pytest.raises(ValueError):
            c._salsa20_xor(key, nonce, b"x")
    with pytest.raises(ValueError):
        c.poly1305(bytes(31), b"x")


@pytest.mark.parametrize("v", cases(PRIMITIVES["xsalsa20"]))
def test_xsalsa20_keystream(v):
    first_160 = h(v["keystream_first_160"])
    assert c.xsalsa20_keystream(h(v["key"]), h(v["nonce"]), 32) == h(v["keystream_first_32"])
    assert c.xsalsa20_keystream(h(v["key"]), h(v["nonce"]), len(first_160)) == first_160


# --- Poly1305 and secretbox -----------------------------------------------------------

@pytest.mark.parametrize("v", cases(PRIMITIVES["poly1305"]))
def test_poly1305(route, v):
    assert c.poly1305(h(v["key"]), h(v["msg"])) == h(v["tag"])
    assert c.poly1305(h(v["key"]), memoryview(h(v["msg"]))) == h(v["tag"])


@settings(max_examples=60, deadline=None)
@given(key=st.binary(min_size=32, max_size=32), data=st.binary(max_size=100))
def test_poly1305_routes_agree(key, data):
    assert c.poly1305(key, data) == c._poly1305_pure(key, data)


@pytest.mark.parametrize("v", cases(PRIMITIVES["secretbox"]))
def test_secretbox_seal_and_open(route, v):
    key, nonce, msg, box = h(v["key"]), h(v["nonce"]), h(v["msg"]), h(v["box"])
    assert c.secretbox_seal(key, nonce, msg) == box
    assert c.secretbox_open(key, nonce, box) == msg


@pytest.mark.parametrize("v", cases(PRIMITIVES["secretbox"]))
def test_secretbox_class_is_secretbox_with_a_counter_nonce(route, v):
    """SecretBox(key, nonce[0:16]) with counter = BE64(nonce[16:24]) is the same box."""
    key, nonce, msg, box = h(v["key"]), h(v["nonce"]), h(v["msg"]), h(v["box"])
    counter = int.from_bytes(nonce[16:], "big")
    sb = c.SecretBox(key, nonce[:16])
    assert sb.nonce(counter) == nonce
    assert sb.seal(counter, msg) == box
    assert sb.open(counter, box) == msg
    assert sb.open(counter, memoryview(bytearray(box))) == msg


def test_secretbox_of_the_empty_packet(route):
    sb = c.SecretBox(bytes(range(32)), bytes(16))
    box = sb.seal(1, b"")
    assert len(box) == 16 and sb.open(1, box) == b""


@settings(max_examples=40, deadline=None)
@given(packet=st.binary(max_size=1430), counter=st.integers(0, 2 ** 64 - 1))
def test_secretbox_round_trip(packet, counter):
    sb = c.SecretBox(b"\x11" * 32, b"\x22" * 16)
    box = sb.seal(counter, packet)
    assert len(box) == 16 + len(packet)
    assert sb.open(counter, box) == packet
    assert sb.seal(counter ^ 1, packet) != box                  # each counter its own stream


@settings(max_examples=30, deadline=None)
@given(packet=st.binary(max_size=1430), counter=st.integers(0, 2 ** 64 - 1))
def test_secretbox_routes_agree(packet, counter):
    """The PyNaCl box and the portable one: the same bytes, each opens the other's."""
    if c._nacl is None:
        return
    nacl, portable = (box(b"\x11" * 32, b"\x22" * 16) for box in (c._NaClSecretBox, c._PortableSecretBox))
    sealed = nacl.seal(counter, packet)
    assert sealed == portable.seal(counter, packet)
    assert portable.open(counter, sealed) == nacl.open(counter, sealed) == packet


@pytest.mark.parametrize("first", [1, 2 ** 64 - 3])
def test_seal_packets_is_seal_one_by_one(route, first):
    sb = c.SecretBox(bytes(range(32)), bytes(range(16)))
    packets = [b"", b"a", bytes(1430), os.urandom(700)]
    assert sb.seal_packets(first, packets[:3]) == [sb.seal(first + i, p) for i, p in enumerate(packets[:3])]
    assert sb.seal_packets(first, []) == sb.seal_packets(0, []) == []
    with pytest.raises(ValueError, match="64 bits"):
        sb.seal_packets(2 ** 64 - 3, packets)                    # the last would be 2^64
    with pytest.raises(ValueError, match="64 bits"):
        sb.seal_packets(-1, packets)


def test_secretbox_is_an_instance_of_the_chosen_route(route):
    sb = c.SecretBox(bytes(32), bytes(16))
    assert isinstance(sb, c.SecretBox) and type(sb) is c._SecretBoxRoute
    assert type(c._PortableSecretBox(bytes(32), bytes(16))) is c._PortableSecretBox


@pytest.fixture
def sealed(route):
    sb = c.SecretBox(b"\x01" * 32, b"\x02" * 16)
    return sb, sb.seal(7, bytes(range(200)))


@pytest.mark.parametrize("bit", [0, 7, 8 * 15 + 7])
def test_open_rejects_a_flipped_bit_in_the_tag(route, sealed, bit):
    sb, box = sealed
    damaged = bytearray(box)
    damaged[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(ValueError, match="bad tag"):
        sb.open(7, bytes(damaged))


@pytest.mark.parametrize("bit", [0, 8 * 16 + 3, 8 * 199 + 7])
def test_open_rejects_a_flipped_bit_in_the_ciphertext(route, sealed, bit):
    sb, box = sealed
    damaged = bytearray(box)
    damaged[16 + bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(ValueError, match="bad tag"):
        sb.open(7, bytes(damaged))


def test_open_rejects_the_wrong_counter_key_and_prefix(route, sealed):
    sb, box = sealed
    for counter in (6, 8, 7 + 2 ** 32):
        with pytest.raises(ValueError, match="bad tag"):
            sb.open(counter, box)
    with pytest.raises(ValueError, match="bad tag"):
        c.SecretBox(b"\x03" * 32, b"\x02" * 16).open(7, box)
    with pytest.raises(ValueError, match="bad tag"):
        c.SecretBox(b"\x01" * 32, b"\x04" * 16).open(7, box)


@pytest.mark.parametrize("length", [0, 1, 15])
def test_open_rejects_a_box_shorter_than_a_tag(route, sealed, length):
    sb, box = sealed
    with pytest.raises(ValueError, match="bad tag"):
        sb.open(7, box[:length])


def test_secretbox_argument_errors(route):
    with pytest.raises(ValueError):
        c.SecretBox(bytes(31), bytes(16))
    with pytest.raises(ValueError):
        c.SecretBox(bytes(32), bytes(24))
    sb = c.SecretBox(bytes(32), bytes(16))
    for counter in (-1, 2 ** 64):
        with pytest.raises(ValueError, match="64 bits"):
            sb.seal(counter, b"x")
        with pytest.raises(ValueError, match="64 bits"):
            sb.open(counter, bytes(17))
    with pytest.raises(ValueError, match="24 bytes"):
        c.secretbox_seal(bytes(32), bytes(23), b"x")


# --- SipHash-2-4 ----------------------------------------------------------------------

@pytest.mark.parametrize("length", range(64))
def test_siphash24_reference_vectors(length):
    v = PRIMITIVES["siphash24"]
    assert obfs4_drbg.siphash24(h(v["key"]), bytes(range(length))) == h(v["digests_by_length"][length])


def test_siphash24_paper_example_as_an_integer():
    """The SipHash paper's appendix: 15-byte message, result 0xa129ca6149be45e5."""
    digest = obfs4_drbg.siphash24(bytes(range(16)), bytes(range(15)))
    assert int.from_bytes(digest, "little") == 0xA129CA6149BE45E5


# --- X25519 ---------------------------------------------------------------------------

@pytest.mark.parametrize("v", cases(PRIMITIVES["x25519"]))
def test_x25519(route, v):
    assert curve.x25519(h(v["scalar"]), h(v["u"])) == h(v["out"])
    if v["u"] == "09" + "00" * 31:
        assert curve.x25519_base(h(v["scalar"])) == h(v["out"])


def test_x25519_on_pynacl_checks_lengths_before_calling_c():
    """PyNaCl passes X25519's buffers to C unchecked: a short one must not be read past."""
    need(c._nacl is not None, "PyNaCl")
    for scalar, u in ((bytes(31), bytes(32)), (bytes(32), bytes(33))):
        with pytest.raises(ValueError, match="32-byte"):
            curve._x25519_nacl(scalar, u)


# u of low order (and their non-canonical encodings), cr.yp.to/ecdh.html#validate
X1 = 325606250916557431795983626356110631294008115727848805560023387167927233504
X2 = 39382357235489614581723060781553021112529911719440698176882885853963445705823
LOW_ORDER = [0, 1, X1, X2, P - 1, P, P + 1, 2 ** 255 + 1]   # (bit 255 is ignored)


@pytest.mark.parametrize("u", LOW_ORDER)
def test_x25519_low_order_u_gives_zeros(route, u):
    """pycryptodome raises for these; the ladder gives 0. Either way: 32 zero bytes."""
    u32 = (u % 2 ** 256).to_bytes(32, "little")
    assert curve.x25519(bytes(range(1, 33)), u32) == bytes(32)


def test_x25519_ignores_bit_255_and_reduces_u(route):
    v = cases(PRIMITIVES["x25519"])[0]
    scalar, u = h(v["scalar"]), bytearray(h(v["u"]))
    u[31] |= 0x80
    assert curve.x25519(scalar, bytes(u)) == h(v["out"])
    nine_plus_p = (9 + P).to_bytes(32, "little")        # a non-canonical encoding of 9
    assert curve.x25519(scalar, nine_plus_p) == curve._x25519_pure(scalar, curve.X25519_BASE)


def test_dirty_keys_agree_like_clean_ones(route):
    """The torsion term changes no shared secret: the peer's clamped scalar kills it."""
    draws = iter(hashlib.sha256(bytes([i])).digest() for i in range(100))
    a_priv, a_u, _ = curve.generate_keypair(lambda n: next(draws))
    b_priv, b_u, _ = curve.generate_keypair(lambda n: next(draws))
    shared = curve.x25519(a_priv, b_u)
    assert shared == curve.x25519(b_priv, a_u) != bytes(32)
    assert shared == curve.x25519(a_priv, curve.x25519_base(b_priv))


# --- hash DRBG, Go math/rand, close delay ---------------------------------------------

@pytest.mark.parametrize("v", cases(DRBG["hash_drbg_go_compat"]))
def test_hash_drbg_go_compat(v):
    drbg = obfs4_drbg.HashDrbg(h(v["seed"]))
    assert [drbg.int63() for _ in v["int63_first3"]] == v["int63_first3"]


def test_hash_drbg_blocks_and_masks():
    v = DRBG["hash_drbg_blocks"]
    drbg = obfs4_drbg.HashDrbg(h(v["seed"]))
    assert [drbg.next_block().hex() for _ in v["blocks"]] == v["blocks"]
    drbg = obfs4_drbg.HashDrbg(h(v["seed"]))
    assert [drbg.mask16() for _ in v["blocks"]] == [int(b[:4], 16) for b in v["blocks"]]


def test_hash_drbg_is_not_siphash_of_the_previous_block():
    """Erratum 1: block 2 is SipHash(K, o_0 | o_1), not SipHash(K, o_1)."""
    seed = h(DRBG["hash_drbg_blocks"]["seed"])
    blocks = [h(b) for b in DRBG["hash_drbg_blocks"]["blocks"]]
    assert blocks[0] == obfs4_drbg.siphash24(seed[:16], seed[16:])
    assert blocks[1] == obfs4_drbg.siphash24(seed[:16], seed[16:] + blocks[0])
    assert blocks[1] != obfs4_drbg.siphash24(seed[:16], blocks[0])


def test_hash_drbg_batches_are_the_same_stream():
    """blocks(n) and masks(n) continue one stream, in any mix with single draws."""
    v = DRBG["hash_drbg_blocks"]
    want = [int.from_bytes(h(b), "little") for b in v["blocks"]]
    drbg = obfs4_drbg.HashDrbg(h(v["seed"]))
    got = drbg.blocks(1) + [int.from_bytes(drbg.next_block(), "little")] + drbg.blocks(len(want) - 2)
    assert got == want
    drbg = obfs4_drbg.HashDrbg(h(v["seed"]))
    assert drbg.masks(3) + [drbg.mask16()] + drbg.masks(len(want) - 4) == \
        [int(b[:4], 16) for b in v["blocks"]]
    assert obfs4_drbg.HashDrbg(h(v["seed"])).blocks(0) == []


def test_hash_drbg_seed_length():
    with pytest.raises(ValueError, match="24 bytes"):
        obfs4_drbg.HashDrbg(bytes(16))


GO = DRBG["go_math_rand"]["seed_000102..17"]
GO_SEED = bytes(range(24))


def test_go_math_rand_streams():
    drbg = obfs4_drbg.HashDrbg(GO_SEED)
    assert [drbg.int63() for _ in range(5)] == GO["int63_first5"]
    drbg = obfs4_drbg.HashDrbg(GO_SEED)
    assert [drbg.next_block().hex() for _ in range(5)] == GO["next_block_first5"]
    assert obfs4_drbg.GoRand(obfs4_drbg.HashDrbg(GO_SEED)).intn(60) == GO["fresh_intn60"]
    rng = obfs4_drbg.GoRand(obfs4_drbg.HashDrbg(GO_SEED))
    assert [rng.float64() for _ in range(3)] == GO["fresh_float64_first3"]
    assert obfs4_drbg.GoRand(obfs4_drbg.HashDrbg(GO_SEED)).perm(10) == GO["fresh_perm10"]
    rng = obfs4_drbg.GoRand(obfs4_drbg.HashDrbg(GO_SEED))
    assert [rng.intn(n) for n in (7, 100, 1, 1448)] == GO["fresh_intn_sequence_7_100_1_1448"]


class Scripted:
    """A source whose Int63 values are given, to reach Go's rare branches."""

    def __init__(self, values):
        self.values = list(values)

    def int63(self):
        return self.values.pop(0)


def test_go_int31n_rejects_values_above_the_limit():
    """n = 3: limit = (2^31 - 1) - 2^31 mod 3 = 2^31 - 3; Int31 = 2^31 - 1 is redrawn."""
    rng = obfs4_drbg.GoRand(Scripted([(2 ** 31 - 1) << 32, (2 ** 31 - 3) << 32, 5 << 32]))
    assert rng.int31n(3) == (2 ** 31 - 3) % 3
    assert rng.int31n(3) == 2


def test_go_int31n_power_of_two_masks_and_float64_redraws_one():
    assert obfs4_drbg.GoRand(Scripted([(2 ** 31 - 1) << 32])).int31n(8) == 7
    # float(2^63 - 1) rounds to 2^63, so Float64 would be 1.0: Go draws again
    assert obfs4_drbg.GoRand(Scripted([2 ** 63 - 1, 2 ** 62])).float64() == 0.5
    with pytest.raises(ValueError):
        obfs4_drbg.GoRand(Scripted([])).intn(0)


@pytest.mark.parametrize("v", cases(DRBG["close_delay_verified_live"]))
def test_close_delay_verified_live(v):
    assert obfs4_drbg.close_delay(h(v["drbg_seed"])) == v["close_delay_s"]


def test_close_delay_derived():
    assert obfs4_drbg.close_delay(GO_SEED) == GO["fresh_intn60"]


# --- weighted tables ------------------------------------------------------------------

TABLES = (cases(DRBG["length_tables"]) + cases(DRBG["iat_tables"])
          + cases(DRBG["biased_table_example"]))


@pytest.mark.parametrize("v", TABLES, ids=lambda v: v["seed"][-8:] + ("-biased" if v["biased"] else ""))
def test_weighted_tables(v):
    dist = obfs4_drbg.WeightedDist(h(v["seed"]), v["min"], v["max"], v["biased"])
    assert len(dist.values) == v["n"]
    assert dist.values == v["values"]
    assert dist.weights == v["weights"]
    assert dist.prob == v["prob"]
    assert dist.alias == v["alias"]


def test_iat_table_seed_is_sha256_of_the_drbg_seed():
    v = cases(DRBG["iat_tables"])[0]
    assert h(v["seed"]) == hashlib.sha256(h(v["derived_from_drbg_seed"])).digest()[:24]


@pytest.mark.parametrize("v", cases(DRBG["length_tables"])[:2], ids=["13 values", "3 values"])
def test_sample_picks_the_index_or_its_alias(v):
    dist = obfs4_drbg.WeightedDist(h(v["seed"]), v["min"], v["max"])
    for i, (prob, alias) in enumerate(zip(v["prob"], v["alias"])):
        own, other = v["min"] + v["values"][i], v["min"] + v["values"][alias]
        assert dist.sample(constant(i), constant(0.0)) == own
        assert dist.sample(constant(i), constant(prob)) == own           # c == prob[i]: own
        if prob < 1.0:
            above = prob + (1.0 - prob) / 2
            assert dist.sample(constant(i), constant(above)) == other


def constant(value):
    return lambda *args: value


def test_sample_follows_the_weights():
    """Vose's tables must reproduce w_i / sum(w); 30 000 seeded draws, 4 sigma."""
    v = cases(DRBG["length_tables"])[0]
    dist = obfs4_drbg.WeightedDist(h(v["seed"]), v["min"], v["max"])
    rng = random.Random(1)
    draws = 30000
    counts = {}
    for _ in range(draws):
        value = dist.sample(rng.randrange, rng.random)
        counts[value] = counts.get(value, 0) + 1
    total = sum(v["weights"])
    assert set(counts) == set(v["values"])
    for value, weight in zip(v["values"], v["weights"]):
        p = weight / total
        assert abs(counts[value] - draws * p) < 4 * (draws * p * (1 - p)) ** 0.5, value


def test_sample_defaults_to_the_csprng():
    dist = obfs4_drbg.WeightedDist(GO_SEED, 0, 1448)
    assert {dist.sample() for _ in range(300)} <= set(dist.values)


# --- Elligator2 and the dirty keys ----------------------------------------------------

def le(hex32):
    return int.from_bytes(h(hex32), "little")


@settings(max_examples=300)
@given(x=st.integers(0, 2 ** 256))
def test_is_square_is_eulers_criterion(x):
    """The Jacobi-symbol square test against x^((p-1)/2) == 1, the definition."""
    assert curve._is_square(x) == (pow(x, (P - 1) // 2, P) == 1)


def test_is_square_edges():
    """0 (and p) is not a non-zero square; -1 is one (p = 1 mod 4); 2 is not (p = 5 mod 8)."""
    assert [curve._is_square(x) for x in (0, P, 1, 4, P - 1, 2, 2 * 9)] == \
        [False, False, True, True, True, False, False]


@settings(max_examples=200)
@given(x=st.integers(-2 ** 256, 2 ** 256))
def test_both_field_inversions_agree(x):
    """pow(x, -1, p) (3.8 and newer) and Fermat's x^(p-2) (3.6, 3.7) give the same
    inverse, and 0 for 0; the one in use is the first where pow() takes -1."""
    assert curve._inv_euclid(x) == curve._inv_fermat(x)
    assert x % P == 0 or curve._inv_fermat(x) * x % P == 1
    assert curve._inv is (curve._inv_euclid if sys.version_info >= (3, 8) else curve._inv_fermat)


def test_constants():
    k = ELLIGATOR["constants"]
    assert k["A"] == curve.A and k["non_square_Z"] == 2 and not curve._is_square(2)
    assert le(k["sqrt_minus_1"]) == curve.SQRT_M1 and curve.SQRT_M1 ** 2 % P == P - 1
    assert le(k["minus_2"]) == -2 % P
    assert le(k["lop_x"]) == curve.LOP_X and le(k["lop_y"]) == curve.LOP_Y
    assert le(k["edwards_d"]) == curve.D
    assert le(k["ed25519_base_x"]) == curve.ED_GX and le(k["ed25519_base_y"]) == curve.ED_GY


@pytest.mark.parametrize("v", cases(ELLIGATOR["direct_map"]))
def test_elligator2_direct_map(v):
    assert curve.elligator2_direct(h(v["representative"])) == h(v["u"])


TWEAKED = [(v["u"], int(key[len("tweak_"):], 16), r)
           for v in cases(ELLIGATOR["inverse_map"]) for key, r in v.items() if key.startswith("tweak_")]


@pytest.mark.parametrize("u, tweak, representative", TWEAKED)
def test_elligator2_inverse_map(route, u, tweak, representative):
    assert curve.elligator2_inverse(h(u), tweak) == h(representative)
    assert curve.elligator2_direct(h(representative)) == h(u)


@pytest.mark.parametrize("u", ELLIGATOR["inverse_map"]["u_without_representative"])
def test_elligator2_u_without_representative(route, u):
    for tweak in (0, 1, 0x40, 0xC1, 0xFF):
        assert curve.elligator2_inverse(h(u), tweak) is None


def test_elligator2_inverse_reads_u_like_x25519(route):
    """Bit 255 ignored, u reduced mod p (as RFC 7748 reads u)."""
    u, tweak, representative = TWEAKED[0]
    top_bit = bytearray(h(u))
    top_bit[31] |= 0x80
    assert curve.elligator2_inverse(bytes(top_bit), tweak) == h(representative)
    assert curve.elligator2_inverse((1 + P).to_bytes(32, "little"), 0) == curve.elligator2_inverse(
        (1).to_bytes(32, "little"), 0)


def test_elligator2_argument_errors():
    with pytest.raises(ValueError, match="32 bytes"):
        curve.elligator2_direct(bytes(31))
    with pytest.raises(ValueError, match="32 bytes"):
        curve.dirty_public_key(bytes(33))


def on_curve(x, y):
    return (-x * x + y * y - 1 - curve.D * x * x * y * y) % P == 0


def test_torsion_points():
    points = ELLIGATOR["torsion_points"]["points"]
    assert [(le(p["x"]), le(p["y"])) for p in points] == curve.TORSION
    assert len(set(curve.TORSION)) == 8
    for x, y in curve.TORSION:
        assert on_curve(x, y)
        eight = curve._ed_mul(curve._ed_point(x, y), 8)
        assert eight[0] == 0 and eight[1] == eight[2]            # 8·T is the identity
    one = curve._ed_mul(curve._ed_point(curve.LOP_X, curve.LOP_Y), 4)
    assert one[1] != one[2]                                       # T[1] has order exactly 8


@pytest.mark.parametrize("v", cases(ELLIGATOR["dirty_keypairs"]),
                         ids=lambda v: "torsion %d" % v["torsion_index_priv0_and_7"])
def test_dirty_keypairs(route, v):
    digest = hashlib.sha512(h(v["csprng_input32"])).digest()
    priv, tweak = digest[:32], digest[63]
    assert priv == h(v["priv32_sha512_first_half"]) and tweak == v["tweak_sha512_byte63"]
    assert priv[0] & 7 == v["torsion_index_priv0_and_7"]
    assert curve.dirty_public_key(priv) == h(v["dirty_u"])
    assert curve.x25519_base(priv) == h(v["clean_u_x25519_base"])
    assert (h(v["dirty_u"]) == h(v["clean_u_x25519_base"])) == (priv[0] & 7 == 0)
    assert curve.elligator2_inverse(h(v["dirty_u"]), tweak) == h(v["representative"])
    assert curve.elligator2_direct(h(v["representative"])) == h(v["dirty_u"])


@pytest.mark.parametrize("v", cases(ELLIGATOR["research_inverse_vectors"]), ids=lambda v: str(v["tweak"]))
def test_research_inverse_vectors(route, v):
    priv = h(v["priv32(unclamped)"])
    assert priv[0] & 7 == v["low3bits_of_priv0"]
    assert curve.dirty_public_key(priv) == h(v["dirty_u"])
    assert curve.x25519_base(priv) == h(v["clean_u(X25519 base)"])
    assert curve.elligator2_inverse(h(v["dirty_u"]), v["tweak"]) == h(v["representative"])


def test_keypair_generation_with_rejected_draws(route):
    attempts = ELLIGATOR["keypair_generation"]["attempts"]
    draws = [h(a["csprng_input32"]) for a in attempts]
    for a in attempts:
        digest = hashlib.sha512(h(a["csprng_input32"])).digest()
        assert digest[:32] == h(a["priv32"]) and digest[63] == a["tweak"]
        assert curve.dirty_public_key(h(a["priv32"])) == h(a["dirty_u"])
        representative = curve.elligator2_inverse(h(a["dirty_u"]), a["tweak"])
        assert representative == (a["representative"] and h(a["representative"]))

    asked = []

    def randbytes(n):
        asked.append(n)
        return draws[len(asked) - 1]
    last = attempts[-1]
    assert curve.generate_keypair(randbytes) == (h(last["priv32"]), h(last["dirty_u"]),
                                             h(last["representative"]))
    assert asked == [32] * len(attempts)


@settings(max_examples=15, deadline=None)
@given(seed=st.binary(min_size=32, max_size=32))
def test_generated_keys_decode_to_their_u(seed):
    draws = iter(hashlib.sha256(seed + bytes([i])).digest() for i in range(200))
    priv, u, representative = curve.generate_keypair(lambda n: next(draws))
    assert curve.elligator2_direct(representative) == u == curve.dirty_public_key(priv)
    assert len(priv) == len(u) == len(representative) == 32


def test_generate_keypair_uses_the_csprng_by_default():
    keys = {curve.generate_keypair()[2] for _ in range(4)}
    assert len(keys) == 4
    assert {r[31] >> 6 for r in keys} <= {0, 1, 2, 3}


# --- the route choice ---------------------------------------------------------------

NACL_ROUTES = {"secretbox": "PyNaCl crypto_secretbox", "X25519": "PyNaCl crypto_scalarmult",
               "edwards25519": "PyNaCl crypto_scalarmult_ed25519_base"}
SALSA20_ROUTES = ("libsodium crypto_stream_salsa20_xor_ic", "nettle salsa20_crypt",
                  "libgcrypt gcry_cipher Salsa20", "pycryptodome Salsa20", "pure Python")
POLY1305_ROUTES = ("libsodium crypto_onetimeauth_poly1305", "libcrypto EVP_Q_mac",
                   "pycryptodome Poly1305_MAC", "pure Python")
POLY1305_CONTEXT_ROUTES = ("libsodium crypto_onetimeauth_poly1305", "libcrypto EVP_MAC", "libgcrypt gcry_mac")
PORTABLE_ROUTES = {"secretbox": ("libsodium crypto_secretbox_easy",) + tuple(
                       "Salsa20 (%s) + Poly1305 (%s)" % (salsa, poly)
                       for salsa in SALSA20_ROUTES for poly in POLY1305_ROUTES + POLY1305_CONTEXT_ROUTES),
                   "X25519": ("libsodium crypto_scalarmult", "libcrypto EVP_PKEY_derive",
                              "pycryptodome Crypto.Protocol.DH", "pure Python"),
                   "edwards25519": ("libsodium crypto_scalarmult_ed25519_base", "pycryptodome EccPoint",
                                    "pure Python"),
                   "Poly1305": POLY1305_ROUTES,
                   "HSalsa20": ("libsodium crypto_core_hsalsa20", "pycryptodome Salsa20 seek", "pure Python"),
                   "Elligator2": ("libcrypto BN_mod_exp_mont_consttime",
                                  "pycryptodome Integer (%s)" % getattr(chooser.Integer, "__name__", "-"),
                                  "pure Python"),
                   "Salsa20": SALSA20_ROUTES,
                   "hash DRBG": ("libcrypto EVP_MAC SipHash", "pure Python")}


def test_routes_name_every_piece_and_match_what_runs():
    routes = c.routes()
    assert set(routes) == set(PORTABLE_ROUTES)
    for piece, route in routes.items():
        assert route in PORTABLE_ROUTES[piece] + (NACL_ROUTES.get(piece),), piece
    assert routes["secretbox"] == c.SECRETBOX_ROUTE and routes["X25519"] == curve.X25519_ROUTE
    assert routes["edwards25519"] == curve.EDWARDS_ROUTE and routes["Poly1305"] == c.POLY1305_ROUTE
    assert routes["HSalsa20"] == c.HSALSA20_ROUTE and routes["Salsa20"] == c.SALSA20_ROUTE
    assert routes["Elligator2"] == curve.ELLIGATOR2_ROUTE
    assert (curve._field_pow is curve._field_pow_pure) == (curve.ELLIGATOR2_ROUTE == "pure Python")
    assert (c._SecretBoxRoute is c._NaClSecretBox) == (c.SECRETBOX_ROUTE == NACL_ROUTES["secretbox"])
    assert (curve.x25519 is curve._x25519_nacl) == (curve.X25519_ROUTE == NACL_ROUTES["X25519"])
    assert (curve._dirty_u is curve._dirty_u_nacl) == (curve.EDWARDS_ROUTE == NACL_ROUTES["edwards25519"])
    assert (c.hsalsa20 is c._hsalsa20_pure) == (c.HSALSA20_ROUTE == "pure Python")
    assert (c.poly1305 is c._poly1305_pure) == (c.POLY1305_ROUTE == "pure Python")
    assert (curve.x25519 is curve._x25519_pure) == (curve.X25519_ROUTE == "pure Python")
    assert (curve._dirty_u is curve._dirty_u_pure) == (curve.EDWARDS_ROUTE == "pure Python")


def test_route_report_names_every_route_and_why_pynacl_is_not_used():
    report = c.route_report()
    for piece, route in c.routes().items():
        assert "%s: %s" % (piece, route) in report
    assert ("PyNaCl not used: " in report) == (c._nacl is None)
    assert ("pycryptodome not used: " in report) == (chooser.PYCRYPTODOME is None)


def test_the_reported_routes_say_why_a_family_was_passed_over(monkeypatch):
    """What obfs4 gives the start-up NOTICE says why, as route_report() does."""
    reported = c.reported_routes()
    assert {piece: route for piece, route in reported.items() if piece != "passed over"} == c.routes()
    assert ("passed over" in reported) == bool(chooser.unavailable() or any(chooser.PASSED_OVER.values()))
    monkeypatch.setattr(chooser, "NACL_UNAVAILABLE", "OBFSPROXY_CRYPTO=stdlib")
    monkeypatch.setattr(chooser, "PYCRYPTODOME_UNAVAILABLE", "OBFSPROXY_CRYPTO=stdlib")
    why = c.reported_routes()["passed over"]
    assert "PyNaCl not used: OBFSPROXY_CRYPTO=stdlib; pycryptodome not used: OBFSPROXY_CRYPTO=stdlib" in why


def test_the_fast_routes_run_wherever_their_library_is():
    """A fast route that exists but fails its self-test falls back silently (correct, but
    slower): with the libraries this project installs, the fastest must be chosen."""
    if c._nacl is not None:
        assert {piece: c.routes()[piece] for piece in NACL_ROUTES} == NACL_ROUTES
        assert c.pure_python_routes() == []
        return
    first = {"secretbox": [(chooser.sodium_secretbox, "libsodium crypto_secretbox_easy")],
             "Poly1305": [(chooser.sodium_poly1305, POLY1305_ROUTES[0]),
                          (chooser.lib_poly1305, POLY1305_ROUTES[1]), (c._Poly1305_MAC, POLY1305_ROUTES[2])],
             "X25519": [(chooser.sodium_x25519, "libsodium crypto_scalarmult"),
                        (chooser.lib_x25519, "libcrypto EVP_PKEY_derive"),
                        (chooser.DH, "pycryptodome Crypto.Protocol.DH")],
             "edwards25519": [(chooser.sodium_ed25519, "libsodium crypto_scalarmult_ed25519_base"),
                              (curve._dirty_u_pycryptodome is not curve._dirty_u_unavailable or None,
                               "pycryptodome EccPoint")],
             "hash DRBG": [(chooser.LibSipHashStream, "libcrypto EVP_MAC SipHash")],
             "Salsa20": [(chooser.sodium_salsa20_xor, SALSA20_ROUTES[0]),
                         (chooser.nettle_salsa20_xor, SALSA20_ROUTES[1]),
                         (chooser.gcrypt_salsa20_xor, SALSA20_ROUTES[2]),
                         (chooser.Salsa20, SALSA20_ROUTES[3])],
             # pip's pycryptodome (Debian 12's 3.11 lacks the seek this uses)
             "HSalsa20": [(chooser.sodium_hsalsa20, "libsodium crypto_core_hsalsa20"),
                          (chooser.PYCRYPTODOME == "Crypto" or None, "pycryptodome Salsa20 seek")],
             "Elligator2": [(chooser.lib_modexp, "libcrypto BN_mod_exp_mont_consttime")]}
    for piece, candidates in first.items():
        present = [name for value, name in candidates if value is not None]
        if present:
            assert c.routes()[piece] == present[0], piece
    if chooser.lib_modexp is None and chooser.Integer is not None:
        assert curve.ELLIGATOR2_ROUTE.startswith("pycryptodome Integer")


def test_choose_takes_the_first_candidate_that_passes():
    answers = chooser.answers(c._POLY1305_ANSWERS)
    right = lambda key, data: c._poly1305_pure(key, data)
    wrong = lambda key, data: bytes(16)
    pure = (c._poly1305_pure, "pure Python")

    def raises(key, data):
        raise TypeError("another signature")
    assert chooser.choose([(right, "fast"), pure], answers) == (right, "fast", [])
    assert chooser.choose([(wrong, "wrong"), (raises, "raises"), (None, "missing"), (right, "fast"), pure],
                     answers) == (right, "fast", ["wrong", "raises"])
    assert chooser.choose([(wrong, "wrong"), pure], answers) == (c._poly1305_pure, "pure Python", ["wrong"])
    assert chooser.choose([(None, "missing"), pure], answers) == (c._poly1305_pure, "pure Python", [])


class FakeNaCl:
    """Stands in for nacl.bindings, so that the PyNaCl candidates are tried even on a
    machine without PyNaCl (every test below replaces the candidate itself)."""


@pytest.fixture
def fake_nacl(monkeypatch):
    if c._nacl is None:
        monkeypatch.setattr(c, "_nacl", FakeNaCl())
        monkeypatch.setattr(curve, "_nacl", c._nacl)


def test_a_wrong_field_power_is_not_chosen(monkeypatch):
    """Proven through the whole inverse map: a power that is right only for squares fails."""
    assert curve._elligator2_route()[0] in (curve._field_pow_libcrypto, curve._field_pow_pycryptodome,
                                            curve._field_pow_pure)
    wrong = lambda x, e: pow(x, e - 1, curve.P)
    monkeypatch.setattr(curve, "_field_pow_pycryptodome", wrong)
    monkeypatch.setattr(curve, "_field_pow_libcrypto", wrong)
    monkeypatch.setattr(curve, "_Integer", chooser.Integer or object)
    monkeypatch.setattr(chooser, "lib_modexp", chooser.lib_modexp or object())
    power, name, passed_over = curve._elligator2_route()
    assert power is curve._field_pow_pure and name == "pure Python" and len(passed_over) == 2


def test_a_wrong_pynacl_x25519_or_edwards_route_is_not_chosen(monkeypatch, fake_nacl):
    monkeypatch.setattr(curve, "_x25519_nacl", lambda scalar, u: bytes(32))
    function, name, passed_over = curve._x25519_route()
    assert function is not curve._x25519_nacl and passed_over == ["PyNaCl crypto_scalarmult"]
    assert name in PORTABLE_ROUTES["X25519"]

    def ignores_bit_255(scalar, u):                  # right on the RFC vector, wrong on u | 2^255
        return curve._x25519_pure(scalar, u) if u[31] < 0x80 else bytes(32)
    monkeypatch.setattr(curve, "_x25519_nacl", ignores_bit_255)
    assert curve._x25519_route()[1] != "PyNaCl crypto_scalarmult"

    def no_torsion(priv):                            # a clean key: right for index 0 only
        return curve.x25519_base(priv)
    monkeypatch.setattr(curve, "_dirty_u_nacl", no_torsion)
    function, name, passed_over = curve._edwards_route()
    assert function is not no_torsion and passed_over[0] == "PyNaCl crypto_scalarmult_ed25519_base"


class SealsWrong(c._PortableSecretBox):
    def seal(self, counter, packet):
        box = c._PortableSecretBox.seal(self, counter, packet)
        return box[:-1] + bytes([box[-1] ^ 1])


class OpensUnchecked(c._PortableSecretBox):
    """Decrypts but never checks the tag: right on every positive answer."""

    def open_view(self, counter, box):
        return c._salsa20_xor(self._subkey, counter.to_bytes(8, "big"), bytes(32) + bytes(box[16:]))[32:]


class Raises(c._PortableSecretBox):
    def seal(self, counter, packet):
        raise RuntimeError("libsodium: unavailable in this build")


@pytest.mark.parametrize("broken", [SealsWrong, OpensUnchecked, Raises])
def test_a_wrong_pynacl_secretbox_is_not_chosen(monkeypatch, fake_nacl, broken):
    """The secretbox self-test proves the refusals too: a box that opens forgeries fails."""
    assert c._secretbox_proven(c._PortableSecretBox)
    monkeypatch.setattr(c, "_NaClSecretBox", broken)
    assert not c._secretbox_proven(broken)
    route, name, passed_over = c._secretbox_route()
    assert passed_over == ["PyNaCl crypto_secretbox"]
    if chooser.sodium_secretbox is not None:
        assert route is c._SodiumSecretBox and name == "libsodium crypto_secretbox_easy"
        monkeypatch.setattr(c, "_SodiumSecretBox", broken)
        route, name, passed_over = c._secretbox_route()
        assert passed_over == ["PyNaCl crypto_secretbox", "libsodium crypto_secretbox_easy"]
    if c._salsa20_keyed is not None and c._poly1305_context is not None:
        assert route is c._DirectSecretBox and name.startswith("Salsa20 (")
        monkeypatch.setattr(c, "_DirectSecretBox", broken)
        before = passed_over
        route, name, passed_over = c._secretbox_route()
        assert passed_over[:-1] == before and passed_over[-1].startswith("Salsa20 (")
    assert route is c._PortableSecretBox and name.startswith("Salsa20 (")


def test_pynacl_seals_alike_with_and_without_the_easy_api():
    """PyNaCl 1.5 (Debian 12) has only crypto_secretbox; 1.6 adds crypto_secretbox_easy,
    which we prefer. Both must give the vectors' boxes."""
    need(c._nacl is not None, "PyNaCl")
    for key, nonce, message, box in c._SECRETBOX_ANSWERS:
        assert c._nacl.crypto_secretbox(message, nonce, key) == box
        if hasattr(c._nacl, "crypto_secretbox_easy"):
            assert c._nacl.crypto_secretbox_easy(message, nonce, key) == box


def test_the_real_pynacl_routes_pass_their_self_tests():
    need(c._nacl is not None, "PyNaCl")
    assert c._secretbox_proven(c._NaClSecretBox)
    assert chooser.gives(curve._x25519_nacl, curve._X25519_ANSWERS)
    assert chooser.gives(curve._dirty_u_nacl, curve._EDWARDS_ANSWERS)


def test_pure_python_routes_lists_the_fallbacks_in_use(monkeypatch):
    monkeypatch.setattr(c, "_SecretBoxRoute", c._NaClSecretBox)
    monkeypatch.setattr(c, "SECRETBOX_ROUTE", NACL_ROUTES["secretbox"])
    monkeypatch.setattr(c, "SALSA20_ROUTE", "pycryptodome Salsa20")
    for module, piece, name in ((c, "POLY1305_ROUTE", "pure Python"), (c, "HSALSA20_ROUTE", "pure Python"),
                                (curve, "X25519_ROUTE", "pycryptodome Crypto.Protocol.DH"),
                                (curve, "EDWARDS_ROUTE", "pure Python"),
                                (curve, "ELLIGATOR2_ROUTE", "pure Python")):
        monkeypatch.setattr(module, piece, name)
    assert c.pure_python_routes() == ["edwards25519", "Elligator2"]     # Poly1305/HSalsa20: unused
    monkeypatch.setattr(c, "_SecretBoxRoute", c._PortableSecretBox)
    assert c.pure_python_routes() == ["Poly1305", "HSalsa20", "edwards25519", "Elligator2"]


@pytest.mark.parametrize("library", ["sodium_salsa20_xor", "nettle_salsa20_xor", "gcrypt_salsa20_xor"])
def test_a_wrong_system_salsa20_is_passed_over(monkeypatch, library):
    """Each system library's Salsa20, given a wrong answer (the nonce ignored), is
    passed over for the next route, and named as passed over."""
    names = dict(zip(["sodium_salsa20_xor", "nettle_salsa20_xor", "gcrypt_salsa20_xor"], SALSA20_ROUTES))
    for other in names:
        monkeypatch.setattr(chooser, other, None)
    monkeypatch.setattr(chooser, library,
                        lambda key, nonce, data: pure_salsa20.salsa20_xor(key, bytes(8), data))
    function, name, passed_over = c._salsa20_route()
    assert passed_over == [names[library]] and name != names[library]
    assert name in SALSA20_ROUTES


def test_a_wrong_salsa20_is_passed_over_for_the_pure_one(monkeypatch):
    for library in ("sodium_salsa20_xor", "nettle_salsa20_xor", "gcrypt_salsa20_xor"):
        monkeypatch.setattr(chooser, library, None)
    monkeypatch.setattr(c, "Salsa20", c.Salsa20 or object())
    assert c._salsa20_route()[1] in ("pycryptodome Salsa20", "pure Python")
    for broken in (lambda key, nonce, data: bytes(len(data)),
                   lambda key, nonce, data: pure_salsa20.salsa20_xor(key, bytes(8), data)):
        monkeypatch.setattr(c, "_salsa20_xor_pycryptodome", broken)
        assert c._salsa20_route() == (pure_salsa20.salsa20_xor, "pure Python", ["pycryptodome Salsa20"])


def run_python(code, **env):
    environ = {k: v for k, v in os.environ.items() if k not in (chooser.CRYPTO_ENV, chooser.SKIP_ENV)}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=environ,
                          capture_output=True, text=True, timeout=60)


# Python that breaks pycryptodome's Salsa20 (every byte of its keystream xor 1), run
# before anything imports obfs4_crypto.
BREAK_SALSA20 = ("from %s.Cipher import Salsa20\n" % chooser.PYCRYPTODOME +
                 "real = Salsa20.new\n"
                 "class Broken:\n"
                 "    def __init__(self, cipher): self.cipher = cipher\n"
                 "    def encrypt(self, data): return bytes(a ^ 1 for a in self.cipher.encrypt(data))\n"
                 "    def seek(self, position): self.cipher.seek(position)\n"
                 "Salsa20.new = lambda **kw: Broken(real(**kw))\n")


def test_importing_with_a_broken_salsa20_passes_it_over_and_says_so():
    """The module is imported after pycryptodome's Salsa20 is broken: the pure route
    runs, and the report says why (HSalsa20's seek route is broken with it)."""
    need(chooser.Salsa20 is not None, "pycryptodome's Salsa20")
    result = run_python(BREAK_SALSA20 + "import obfs4_crypto\nprint(obfs4_crypto.route_report())\n",
                        OBFSPROXY_CRYPTO_SKIP="libsodium,nettle,libgcrypt")
    assert result.returncode == 0, result.stderr
    assert "Salsa20: pure Python (pycryptodome Salsa20 failed its known answer)" in result.stdout
    if hasattr(Salsa20.new(key=bytes(32), nonce=bytes(8)), "seek"):
        assert "HSalsa20: pure Python (pycryptodome Salsa20 seek failed its known answer)" in result.stdout
    else:       # Debian 12's 3.11: no seek at all, which the report says
        assert "HSalsa20: pure Python (pycryptodome Salsa20 seek not used: this pycryptodome (3.11" \
            in result.stdout and ") lacks seek)" in result.stdout


@pytest.mark.parametrize("mode", ["client", "managed"])
def test_a_bad_obfsproxy_crypto_is_one_line_and_an_env_error_for_tor(mode, tmp_path):
    """The command line says it once, without a traceback; in managed mode on stdout
    too, as ENV-ERROR, where Tor reads it (newcomer report 4, D11)."""
    run = ("import sys\n"
           "sys.argv = ['obfsproxy.py', %r, '127.0.0.1:0']\n"
           "import runpy\nrunpy.run_path('obfsproxy.py', run_name='__main__')\n" % mode)
    result = run_python(run, TOR_PT_MANAGED_TRANSPORT_VER="1", TOR_PT_STATE_LOCATION=str(tmp_path),
                        OBFSPROXY_CRYPTO="fast")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().startswith("obfsproxy.py: OBFSPROXY_CRYPTO='fast' is not a crypto route")
    assert len(result.stderr.strip().splitlines()) == 1
    assert ("ENV-ERROR OBFSPROXY_CRYPTO='fast'" in result.stdout) == (mode == "managed"), result.stdout


def test_obfsproxy_crypto_stdlib_uses_no_package():
    result = run_python("import json, sys, obfs4_crypto as c, obfs2, obfs3\n"
                        "print(json.dumps([c.routes(), c.route_report(), obfs2.Obfs2.crypto_routes()[0],"
                        " sorted(m for m in sys.modules"
                        "        if m.split('.')[0] in ('nacl', 'Crypto', 'Cryptodome'))]))",
                        OBFSPROXY_CRYPTO="stdlib")
    assert result.returncode == 0, result.stderr
    routes, report, aes, imported = json.loads(result.stdout)
    assert imported == []
    names = list(routes.values()) + [aes["AES-CTR"]]
    assert not any("PyNaCl" in route or "pycryptodome" in route for route in names)
    assert report.endswith("PyNaCl not used: OBFSPROXY_CRYPTO=stdlib; "
                           "pycryptodome not used: OBFSPROXY_CRYPTO=stdlib")
    assert aes["passed over"] == "pycryptodome not used: OBFSPROXY_CRYPTO=stdlib"


def test_obfsproxy_crypto_portable_picks_no_pynacl_route():
    result = run_python("import json, obfs4_crypto as c; print(json.dumps([c.routes(), c.route_report()]))",
                        OBFSPROXY_CRYPTO="portable")
    assert result.returncode == 0, result.stderr
    routes, report = json.loads(result.stdout)
    assert not any(family in route for route in routes.values() for family in ("PyNaCl", "libsodium"))
    assert report.endswith("PyNaCl not used: OBFSPROXY_CRYPTO=portable; libsodium not used: "
                           "OBFSPROXY_CRYPTO=portable; nettle not used: OBFSPROXY_CRYPTO=portable; "
                           "libgcrypt not used: OBFSPROXY_CRYPTO=portable")


def test_a_misspelt_obfsproxy_crypto_stops_the_import():
    result = run_python("import obfs4_crypto", OBFSPROXY_CRYPTO="portabel")
    assert result.returncode != 0 and "OBFSPROXY_CRYPTO='portabel'" in result.stderr


@pytest.mark.parametrize("value, use", [("", True), ("auto", True), (" Portable ", False),
                                        ("portable", False), ("stdlib", False)])
def test_obfsproxy_crypto_values(value, use):
    assert chooser.use_nacl({chooser.CRYPTO_ENV: value}) is use
    assert chooser.use_nacl({}) is True


def test_pynacl_missing_or_broken_is_a_missing_route(monkeypatch):
    assert chooser.import_nacl(False) == (None, (), "OBFSPROXY_CRYPTO=portable")
    monkeypatch.setitem(sys.modules, "nacl", None)              # "import nacl" -> ImportError
    assert chooser.import_nacl(True) == (None, (), "PyNaCl is not installed")    # (site-packages on)
    broken = types.ModuleType("nacl")
    broken.__path__ = []

    def fails(name):
        raise OSError("libsodium.so.23: cannot open shared object file")
    broken.__getattr__ = fails
    monkeypatch.setitem(sys.modules, "nacl", broken)
    module, error, why = chooser.import_nacl(True)
    assert module is None and error == () and why.startswith("PyNaCl failed to import (OSError: libsodium")


def test_the_embedded_self_test_answers_are_the_vectors():
    """The import-time known answers are copies of shared vectors; keep them in step."""
    rfc8439 = cases(PRIMITIVES["poly1305"])[0]
    assert c._POLY1305_ANSWERS[0] == ((h(rfc8439["key"]), h(rfc8439["msg"])), h(rfc8439["tag"]))
    stream = cases(PRIMITIVES["xsalsa20"])[0]
    subkey = c._hsalsa20_pure(h(stream["key"]), h(stream["nonce"])[:16])
    assert [args for args, _ in c._SALSA20_ANSWERS] == [
        (subkey, h(stream["nonce"])[16:], bytes(32)), (subkey, h(stream["nonce"])[16:], bytes(160))]
    assert [answer for _, answer in c._SALSA20_ANSWERS] == [
        h(stream["keystream_first_32"]), h(stream["keystream_first_160"])]
    assert [(h(v["key"]), h(v["input16"])) for v in cases(PRIMITIVES["hsalsa20"])] == \
        [args for args, _ in c._HSALSA20_ANSWERS]
    assert [h(v["output"]) for v in cases(PRIMITIVES["hsalsa20"])] == [out for _, out in c._HSALSA20_ANSWERS]
    assert c._SECRETBOX_ANSWERS == [(h(v["key"]), h(v["nonce"]), h(v["msg"]), h(v["box"]))
                                    for v in cases(PRIMITIVES["secretbox"])]
    x = cases(PRIMITIVES["x25519"])
    top_bit = bytearray(h(x[0]["u"]))
    top_bit[31] |= 0x80
    assert curve._X25519_ANSWERS[:3] == [((h(x[0]["scalar"]), h(x[0]["u"])), h(x[0]["out"])),
                                     ((h(x[0]["scalar"]), bytes(top_bit)), h(x[0]["out"])),
                                     ((h(x[3]["scalar"]), h(x[3]["u"])), h(x[3]["out"]))]
    assert curve._X25519_ANSWERS[3] == ((bytes(range(32)), bytes(32)), bytes(32))
    inverse = {(v["u"], int(key[len("tweak_"):], 16)): r for v in cases(ELLIGATOR["inverse_map"])
               for key, r in v.items() if key.startswith("tweak_")}
    for (u, tweak), r in curve._ELLIGATOR2_ANSWERS[:-1]:
        assert inverse[(u.hex(), tweak)] == r.hex()
    (u, _), none = curve._ELLIGATOR2_ANSWERS[-1]
    assert u.hex() in ELLIGATOR["inverse_map"]["u_without_representative"] and none is None
    dirty = cases(ELLIGATOR["dirty_keypairs"])
    assert [v["torsion_index_priv0_and_7"] for v in dirty] == list(range(8))
    assert curve._EDWARDS_ANSWERS == [((h(v["priv32_sha512_first_half"]),), h(v["dirty_u"])) for v in dirty]


ROUTE_REPORT = "import json, obfs4_crypto as c; print(json.dumps(c.routes()))"


@pytest.mark.parametrize("skip, salsa20", [("", "libsodium"), ("libsodium", "nettle"),
                                           ("libsodium,nettle", "libgcrypt")])
def test_the_route_report_names_the_system_library_in_use(skip, salsa20):
    """With no package (OBFSPROXY_CRYPTO=stdlib): libsodium for obfs4's box and keys where
    it is; with it left out, nettle for Salsa20, then libgcrypt; each as this machine has it."""
    left_out = [family for family in ("libsodium", "nettle", "libgcrypt") if family in skip.split(",")]
    found = {"libsodium": chooser.sodium_secretbox, "nettle": chooser.nettle_salsa20_xor,
             "libgcrypt": chooser.gcrypt_salsa20_xor}
    need(found[salsa20] is not None or chooser.LEFT_OUT[salsa20], salsa20)
    result = run_python(ROUTE_REPORT, OBFSPROXY_CRYPTO="stdlib", OBFSPROXY_CRYPTO_SKIP=skip)
    assert result.returncode == 0, result.stderr
    routes = json.loads(result.stdout)
    assert routes["Salsa20"].split()[0] == salsa20 and salsa20 not in left_out
    if salsa20 == "libsodium":
        assert routes["secretbox"] == "libsodium crypto_secretbox_easy"
        assert routes["X25519"] == "libsodium crypto_scalarmult"
        assert routes["edwards25519"] == "libsodium crypto_scalarmult_ed25519_base"
    else:
        assert routes["secretbox"].startswith("Salsa20 (%s" % salsa20)
        assert not any("libsodium" in route for route in routes.values())


def test_plain_python_only_when_every_library_is_left_out():
    for environ in ({"OBFSPROXY_CRYPTO": "python"},
                    {"OBFSPROXY_CRYPTO": "stdlib",
                     "OBFSPROXY_CRYPTO_SKIP": "libcrypto, LIBSODIUM,nettle,libgcrypt"}):
        result = run_python(ROUTE_REPORT, **environ)
        assert result.returncode == 0, result.stderr
        routes = json.loads(result.stdout)
        assert routes["secretbox"] == "Salsa20 (pure Python) + Poly1305 (pure Python)"
        assert set(routes.values()) - {routes["secretbox"]} == {"pure Python"}, routes
    result = run_python(ROUTE_REPORT, OBFSPROXY_CRYPTO_SKIP="libsodum")
    assert result.returncode != 0
    assert "OBFSPROXY_CRYPTO_SKIP='libsodum' names no crypto library (libsodum)" in result.stderr


# --- framebox.py: a system library's Salsa20 and Poly1305 on buffers of their own ----------

KEYED_SALSA20 = {"libsodium": "sodium_salsa20_keyed", "nettle": "nettle_salsa20_keyed",
                 "libgcrypt": "gcrypt_salsa20_keyed"}
POLY1305_CONTEXTS = {"libsodium": "sodium_poly1305_context", "libcrypto": "lib_poly1305_context",
                     "libgcrypt": "gcrypt_poly1305_context"}


def framebox_parts(salsa20, poly1305):
    keyed, new_mac = getattr(chooser, KEYED_SALSA20[salsa20]), getattr(chooser, POLY1305_CONTEXTS[poly1305])
    need(keyed is not None, salsa20)
    need(new_mac is not None, "%s (OpenSSL 3)" % poly1305 if poly1305 == "libcrypto" else poly1305)
    return keyed, new_mac


def reference_box(subkey, nonce8, packet):
    """secretbox under a cached subkey, from the one-block-at-a-time Salsa20 and pure Poly1305."""
    out = salsa20_xor_one_block_at_a_time(subkey, nonce8, bytes(32) + bytes(packet))
    return c._poly1305_pure(out[:32], out[32:]) + out[32:]


@pytest.mark.parametrize("salsa20", sorted(KEYED_SALSA20))
@pytest.mark.parametrize("poly1305", sorted(POLY1305_CONTEXTS))
def test_each_keyed_salsa20_and_poly1305_context_gives_the_known_answers(salsa20, poly1305):
    keyed, new_mac = framebox_parts(salsa20, poly1305)
    assert chooser.gives(framebox.salsa20_xor_of(keyed), c._SALSA20_ANSWERS)
    assert chooser.gives(framebox.poly1305_of(new_mac), c._POLY1305_ANSWERS)
    for key, nonce, message, box in c._SECRETBOX_ANSWERS:
        frames = framebox.FrameBox(keyed, new_mac, c._hsalsa20_pure(key, nonce[:16]))
        assert frames.seal(nonce[16:], message) == box
        assert frames.open(nonce[16:], box) == message


@settings(max_examples=60, deadline=None)
@given(salsa20=st.sampled_from(sorted(KEYED_SALSA20)), poly1305=st.sampled_from(sorted(POLY1305_CONTEXTS)),
       subkey=st.binary(min_size=32, max_size=32), counters=st.lists(
           st.integers(0, (1 << 64) - 1), min_size=1, max_size=4),
       sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=4), flip=st.integers(0, 1 << 20))
def test_a_framebox_seals_and_opens_as_the_reference_frame_after_frame(salsa20, poly1305, subkey, counters,
                                                                       sizes, flip):
    """One FrameBox for many frames (its buffers and contexts reused, grown past 1,536
    bytes): each box is the reference's, opens back, and refuses one flipped bit."""
    keyed, new_mac = framebox_parts(salsa20, poly1305)
    frames = framebox.FrameBox(keyed, new_mac, subkey)
    for counter, size in zip(counters, sizes):
        nonce8, packet = counter.to_bytes(8, "big"), os.urandom(size)
        box = frames.seal(nonce8, packet)
        assert box == reference_box(subkey, nonce8, packet)
        assert frames.open(nonce8, memoryview(bytearray(box))) == packet
        forged = bytearray(box)
        forged[flip % len(box)] ^= 1 << (flip % 8)
        with pytest.raises(ValueError, match="bad tag"):
            frames.open(nonce8, bytes(forged))
        with pytest.raises(ValueError, match="bad tag"):
            frames.open(nonce8, box[:15])


def test_a_framebox_reads_a_view_of_words_as_its_bytes():
    keyed, new_mac = framebox_parts("nettle", "libcrypto")
    frames, nonce8 = framebox.FrameBox(keyed, new_mac, bytes(range(32))), bytes(8)
    words = memoryview(bytearray(range(64))).cast("I")
    box = frames.seal(nonce8, words)
    assert box == reference_box(bytes(range(32)), nonce8, bytes(range(64)))
    assert frames.open(nonce8, memoryview(bytearray(box)).cast("I")) == bytes(range(64))


def test_framebox_contexts_are_freed_when_their_box_goes():
    keyed, new_mac = framebox_parts("nettle", "libcrypto")
    before = live_native_objects()
    boxes = [framebox.FrameBox(keyed, new_mac, bytes(32)) for _ in range(5)]
    assert live_native_objects() == before + 5
    del boxes
    assert live_native_objects() == before


def test_a_wrong_keyed_salsa20_or_poly1305_context_is_passed_over(monkeypatch):
    """A keyed Salsa20 that ignores the nonce, and a Poly1305 context that ignores the
    data, give wrong known answers: each is passed over for the next library."""
    def nonce_ignored(keyed):
        def broken(key32):
            crypt = keyed(key32)
            return lambda nonce8, size, dst, src: crypt(bytes(8), size, dst, src)
        return broken

    def data_ignored(new_mac):
        def broken():
            mac = new_mac()
            return lambda key, data, size, tag: mac(key, data, 0, tag)
        return broken

    for names, route, wrong in ((KEYED_SALSA20, c._salsa20_keyed_route, nonce_ignored),
                                (POLY1305_CONTEXTS, c._poly1305_context_route, data_ignored)):
        present = [name for name in names.values() if getattr(chooser, name) is not None]
        if not present:
            continue
        first = present[0]
        value, name, passed_over = route()
        monkeypatch.setattr(chooser, first, wrong(getattr(chooser, first)))
        broken_value, broken_name, broken_passed_over = route()
        assert broken_passed_over == [name] and broken_name != name
