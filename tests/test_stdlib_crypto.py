"""The crypto routes that need no package (issue 24): libcrypto through ctypes
(libcrypto.py), pure-Python AES-CTR (pure_aes.py), pure-Python Salsa20 with blocks side
by side (pure_salsa20.py), the streaming-SipHash DRBG, and the AES-CTR route table
with its ``AES.new`` shim (chooser.py).

Every route is proven here on published answers, each test parametrised over every
route this machine has (a route whose library is missing is skipped, and fails in CI,
which has them all). The sources of the answers:

* AES: FIPS-197 appendix C.1-C.3 (one block each, AES-128/192/256), and NIST SP 800-38A
  appendix F.5.1, F.5.3, F.5.5 (CTR-AES128/192/256.Encrypt), copied into chooser.py;
* Salsa20: the eSTREAM Salsa20/20 verified test vectors (256-bit key, Set 1, vector 0,
  stream[0..63]), and the shared obfs4-primitives.json "xsalsa20" keystream;
* Poly1305, X25519, SipHash-2-4: obfs4-primitives.json (RFC 8439 2.5.2 and NaCl's
  onetimeauth.c; RFC 7748 5.2 and 6.1; the SipHash reference vectors.h);
* the hash DRBG: obfs4-drbg-probdist.json.
"""

import gc
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_crypto import live_native_objects, make_aes_ecb, salsa20_xor_one_block_at_a_time
from support import IN_CI, ROOT, load_vectors

import obfs4_crypto as c
import obfs4_drbg
from cryptoroutes import aes_ctr as aes_ctr_module
from cryptoroutes import chooser, libcrypto, pure_aes, pure_salsa20

PRIMITIVES = load_vectors("obfs4-primitives.json")
DRBG = load_vectors("obfs4-drbg-probdist.json")
h = bytes.fromhex


def need(present, what):
    """Skip a test whose route is missing, or whose library OBFSPROXY_CRYPTO or
    OBFSPROXY_CRYPTO_SKIP leaves out; in CI, fail it otherwise (CI has OpenSSL 3,
    ctypes, libsodium, nettle and libgcrypt)."""
    if present:
        return
    family = what.split("'")[0].split()[0]
    if chooser.LEFT_OUT.get(family):
        pytest.skip("%s is left out here (%s)" % (family, chooser.LEFT_OUT[family]))
    if IN_CI:
        pytest.fail("%s is missing, but CI has it" % what)
    pytest.skip("%s is not available here" % what)


def _bindings():
    lib, why = libcrypto.find()
    return libcrypto.Bindings(lib) if lib else None


BINDINGS = _bindings()


def _from_bindings(make):
    return getattr(libcrypto, make)(BINDINGS) if BINDINGS else None


LIB_AES_CTR = _from_bindings("make_aes_ctr")
LIB_X25519 = _from_bindings("make_x25519")
LIB_POLY1305 = _from_bindings("make_poly1305")
LIB_SIPHASH = _from_bindings("make_siphash_stream")


# --- AES -------------------------------------------------------------------------------

FIPS_197_PLAINTEXT = h("00112233445566778899aabbccddeeff")
FIPS_197 = [("000102030405060708090a0b0c0d0e0f", "69c4e0d86a7b0430d8cdb78070b4c55a"),
            ("000102030405060708090a0b0c0d0e0f1011121314151617", "dda97ca4864cdfe06eaf70a0ec0d7191"),
            ("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
             "8ea2b7ca516745bfeafc49904b496089")]


@pytest.mark.parametrize("key, ciphertext", FIPS_197)
def test_pure_aes_block_fips_197(key, ciphertext):
    assert pure_aes.encrypt_block(pure_aes.expand_key(h(key)), FIPS_197_PLAINTEXT) == h(ciphertext)


def test_the_carry_answer_is_fips_197_aes_of_the_counter_blocks():
    """The last AES-CTR answer (a counter block carrying across its low 64 bits) is
    derived here from the FIPS-197-proven block function, block by block."""
    key, counter, plaintext, ciphertext = aes_ctr_module.AES_CTR_ANSWERS[-1]
    keys, start = pure_aes.expand_key(key), int.from_bytes(counter, "big")
    stream = b"".join(pure_aes.encrypt_block(keys, (start + i).to_bytes(16, "big")) for i in range(3))
    assert bytes(a ^ b for a, b in zip(plaintext, stream)) == ciphertext
    assert start & (2 ** 64 - 1) == 2 ** 64 - 1        # it does carry into the high half


AES_CTR_ROUTES = [("libcrypto", LIB_AES_CTR), ("pycryptodome", aes_ctr_module._aes_ctr_pycryptodome
                                                if aes_ctr_module._PycryptodomeAES else None),
                  ("pure Python", pure_aes.AesCtr)]


@pytest.fixture(params=[name for name, _ in AES_CTR_ROUTES])
def aes_ctr(request):
    route = dict(AES_CTR_ROUTES)[request.param]
    if request.param == "pycryptodome" and "pycryptodome" not in chooser.MODES.get(chooser.MODE, ()):
        pytest.skip("pycryptodome is ignored here (OBFSPROXY_CRYPTO=%s)" % chooser.MODE)
    need(route is not None, "the %s AES-CTR" % request.param)
    return route


def test_aes_ctr_routes_give_nist_sp800_38a(aes_ctr):
    assert aes_ctr_module.aes_ctr_proven(aes_ctr)
    for key, counter, plaintext, ciphertext in aes_ctr_module.AES_CTR_ANSWERS:
        assert aes_ctr(key, counter).encrypt(plaintext) == ciphertext
        assert aes_ctr(key, counter).decrypt(ciphertext) == plaintext


def test_aes_ctr_routes_agree_on_any_split_and_buffer(aes_ctr):
    key, counter = os.urandom(16), b"\xff" * 12 + os.urandom(4)
    data = os.urandom(3000)
    want = pure_aes.AesCtr(key, counter).encrypt(data)
    cipher, got = aes_ctr(key, counter), []
    for start, end in ((0, 1), (1, 17), (17, 1000), (1000, 1000), (1000, 3000)):
        got.append(cipher.encrypt(memoryview(data)[start:end]))
    assert b"".join(got) == want
    buffer = bytearray(data)
    view = memoryview(buffer)
    cipher = aes_ctr(key, counter)
    assert cipher.encrypt(view[:100], output=view[:100]) is None
    assert cipher.encrypt(view[100:], output=view[100:]) is None
    assert buffer == want
    with pytest.raises(ValueError):
        aes_ctr(key, counter).encrypt(b"abc", output=bytearray(2))


def test_aes_ctr_routes_read_a_view_of_words_as_its_bytes_or_refuse_it(aes_ctr):
    """A memoryview of 4-byte items is encrypted as its 40 bytes, never as its first 10,
    or refused; written in place (``output=``) the same way."""
    import array
    key, counter = os.urandom(16), os.urandom(16)
    data = array.array("I", range(10))
    want = pure_aes.AesCtr(key, counter).encrypt(data.tobytes())
    try:
        got = aes_ctr(key, counter).encrypt(memoryview(data))
    except (TypeError, ValueError):
        return
    assert got == want
    out = array.array("I", bytes(40))
    assert aes_ctr(key, counter).encrypt(memoryview(data), output=out) is None
    assert out.tobytes() == want


def test_the_aes_shim_runs_ctr_on_the_chosen_route():
    key, counter = os.urandom(16), os.urandom(16)
    cipher = aes_ctr_module.AES.new(key, aes_ctr_module.AES.MODE_CTR, nonce=b"", initial_value=counter)
    assert type(cipher) is type(aes_ctr_module.aes_ctr(key, counter))
    assert cipher.encrypt(bytes(40)) == pure_aes.AesCtr(key, counter).encrypt(bytes(40))
    by_int = aes_ctr_module.AES.new(key, aes_ctr_module.AES.MODE_CTR, nonce=b"", initial_value=5)
    five = (5).to_bytes(16, "big")
    assert by_int.encrypt(bytes(16)) == pure_aes.encrypt_block(pure_aes.expand_key(key), five)
    with pytest.raises(ValueError, match="only CTR mode"):
        aes_ctr_module.AES.new(key, aes_ctr_module.AES.MODE_GCM, nonce=bytes(12))
    with pytest.raises(ValueError, match="only CTR mode"):
        aes_ctr_module.AES.new(key, aes_ctr_module.AES.MODE_CTR, nonce=bytes(8))


def test_a_wrong_aes_ctr_route_is_passed_over(monkeypatch):
    class Wrong:
        def __init__(self, key, counter):
            self.real = pure_aes.AesCtr(key, counter[:15] + bytes([counter[15] ^ 1]))
            self.encrypt = self.decrypt = self.real.encrypt
    monkeypatch.setattr(chooser, "LibAesCtr", Wrong)
    monkeypatch.setattr(aes_ctr_module, "_PycryptodomeAES", None)
    assert aes_ctr_module._aes_ctr_route() == (pure_aes.AesCtr, "pure Python",
                                               ["libcrypto EVP_EncryptUpdate"])


def test_the_chosen_aes_ctr_route_is_the_fastest_here():
    if LIB_AES_CTR is not None and chooser.LEFT_OUT["libcrypto"] is None:
        assert aes_ctr_module.AES_CTR_ROUTE == "libcrypto EVP_EncryptUpdate"
    assert chooser.PASSED_OVER["AES-CTR"] == []


# --- Salsa20 ---------------------------------------------------------------------------

ESTREAM_SET1_V0 = (b"\x80" + bytes(31), bytes(8), h(
    "e3be8fdd8beca2e3ea8ef9475b29a6e7003951e1097a5c38d23b7a5fad9f6844"
    "b22c97559e2723c7cbbd3fe4fc8d9a0744652a83e72a9c461876af4d7ef1a117"))

SALSA20_ROUTES = [pure_salsa20.salsa20_xor, salsa20_xor_one_block_at_a_time,
                  lambda key, nonce, data: pure_salsa20.salsa20_xor_many(key, [(nonce, data)])[0]]


@pytest.mark.parametrize("salsa20_xor", SALSA20_ROUTES, ids=["side by side", "one block at a time", "many"])
def test_pure_salsa20_known_answers(salsa20_xor):
    key, nonce, stream = ESTREAM_SET1_V0
    assert salsa20_xor(key, nonce, bytes(64)) == stream
    assert salsa20_xor(key, nonce, bytes(30)) == stream[:30]
    assert chooser.gives(salsa20_xor, c._SALSA20_ANSWERS)
    v = PRIMITIVES["xsalsa20"]["cases"][0]
    subkey = c._hsalsa20_pure(h(v["key"]), h(v["nonce"])[:16])
    assert salsa20_xor(subkey, h(v["nonce"])[16:], bytes(160)) == h(v["keystream_first_160"])


def test_pure_salsa20_many_messages_match_one_at_a_time():
    key = os.urandom(32)
    messages = [(os.urandom(8), os.urandom(size)) for size in (0, 1, 63, 64, 65, 1462, 200)]
    assert pure_salsa20.salsa20_xor_many(key, messages) == [
        salsa20_xor_one_block_at_a_time(key, nonce, data) for nonce, data in messages]
    assert pure_salsa20.salsa20_xor_many(key, []) == []


FRAME_COUNTERS = st.one_of(st.integers(0, (1 << 64) - 1), st.sampled_from([0, 1, (1 << 32) - 1, 1 << 32,
                                                                           (1 << 64) - 2, (1 << 64) - 1]))


@settings(max_examples=40, deadline=None)
@given(key=st.binary(min_size=32, max_size=32),
       requests=st.lists(st.tuples(FRAME_COUNTERS, st.integers(0, 1600)), max_size=5))
def test_side_by_side_keystreams_equal_one_block_at_a_time(key, requests):
    """Every block of every frame side by side (pure_salsa20.keystreams) against each
    block alone, for random keys, frame counters as obfs4 makes its nonces (BE64, up to
    the last before 2^64 wraps, and across 2^32) and lengths (whole and partial blocks,
    up to a frame and more). The block counter of one message starts at 0 and stays
    far below 2^32 (a frame is 23 blocks), as both compute it."""
    nonces = [(counter.to_bytes(8, "big"), length) for counter, length in requests]
    streams = pure_salsa20.keystreams(key, nonces)
    assert [len(stream) for stream in streams] == [length for _, length in nonces]
    assert streams == [salsa20_xor_one_block_at_a_time(key, nonce, bytes(length)) for nonce, length in nonces]


def test_pure_salsa20_refuses_wrong_lengths():
    for key, nonce in ((bytes(31), bytes(8)), (bytes(32), bytes(7))):
        with pytest.raises(ValueError):
            pure_salsa20.salsa20_xor(key, nonce, b"x")


def test_the_batched_seal_equals_one_frame_at_a_time(monkeypatch):
    """The portable secretbox on pure Salsa20 seals a write's frames side by side,
    across several batches; each box must be what ``seal`` gives alone, and open."""
    monkeypatch.setattr(c, "_salsa20_xor", pure_salsa20.salsa20_xor)
    box = c._PortableSecretBox(os.urandom(32), os.urandom(16))
    monkeypatch.setattr(box, "BATCH_BLOCKS", 50)
    packets = [os.urandom(size) for size in (1430, 0, 5, 1430, 700, 1430, 1430)]
    sealed = box.seal_packets(2 ** 64 - 7, packets)
    assert sealed == [box.seal(2 ** 64 - 7 + i, packet) for i, packet in enumerate(packets)]
    assert [box.open(2 ** 64 - 7 + i, b) for i, b in enumerate(sealed)] == packets
    with pytest.raises(ValueError, match="64 bits"):
        box.seal_packets(2 ** 64 - 6, packets)


def test_reading_ahead_opens_every_frame_as_sealed(monkeypatch):
    """Full-sized frames make open_view compute the next frames' keystreams ahead; a
    small frame, a longer one than was read ahead, a forged one and a counter out of
    turn must all still open (or fail) exactly as the frame alone would."""
    monkeypatch.setattr(c, "_salsa20_xor", pure_salsa20.salsa20_xor)
    key, prefix = os.urandom(32), os.urandom(16)
    sender, receiver = c._PortableSecretBox(key, prefix), c._PortableSecretBox(key, prefix)
    sizes = [1430] * 20 + [10, 1100, 1430, 1430, 1430, 1430, 0, 1430, 1430]
    packets = [os.urandom(size) for size in sizes]
    boxes = sender.seal_packets(1, packets)
    for counter, (box, packet) in enumerate(zip(boxes, packets), 1):
        if counter == 24:           # the next frames were read ahead for 1100 bytes each
            assert receiver._ahead
            forged = bytes([box[0] ^ 1]) + box[1:]
            with pytest.raises(ValueError, match="bad tag"):
                receiver.open_view(counter, forged)
        assert bytes(receiver.open_view(counter, box)) == packet
    assert bytes(receiver.open_view(5, boxes[4])) == packets[4]      # out of turn
    longer = sender.seal(40, os.urandom(1430))
    receiver._ahead = {40: bytes(100)}                               # too short: recomputed
    assert len(receiver.open(40, longer)) == 1430
    with pytest.raises(ValueError, match="bad tag"):
        receiver.open_view(7, boxes[7])                              # sealed under counter 8


# --- Poly1305, X25519 through libcrypto -------------------------------------------------

@pytest.mark.parametrize("v", PRIMITIVES["poly1305"]["cases"])
def test_libcrypto_poly1305(v):
    need(LIB_POLY1305 is not None, "libcrypto's EVP_Q_mac (OpenSSL 3)")
    assert LIB_POLY1305(h(v["key"]), h(v["msg"])) == h(v["tag"])
    assert LIB_POLY1305(h(v["key"]), memoryview(h(v["msg"]))) == h(v["tag"])
    assert chooser.gives(LIB_POLY1305, c._POLY1305_ANSWERS)
    with pytest.raises(ValueError):
        LIB_POLY1305(bytes(31), b"x")


@pytest.mark.parametrize("v", PRIMITIVES["x25519"]["cases"])
def test_libcrypto_x25519(v):
    need(LIB_X25519 is not None, "libcrypto's X25519")
    assert LIB_X25519(h(v["scalar"]), h(v["u"])) == h(v["out"])


def test_libcrypto_x25519_low_order_and_lengths():
    need(LIB_X25519 is not None, "libcrypto's X25519")
    from cryptoroutes import curve25519
    assert chooser.gives(LIB_X25519, curve25519._X25519_ANSWERS)
    assert LIB_X25519(os.urandom(32), bytes(32)) == bytes(32)
    with pytest.raises(ValueError):
        LIB_X25519(bytes(31), bytes(32))


# --- SipHash and the hash DRBG ---------------------------------------------------------

def test_libcrypto_siphash_stream_reference_vectors():
    """The stream absorbs 8 bytes a call (``blocks(m, 1)`` absorbs m, returns the digest
    so far): after 8 k bytes 00 01 .. it is SipHash of them, the paper's vectors."""
    need(LIB_SIPHASH is not None, "libcrypto's EVP_MAC SipHash (OpenSSL 3)")
    v = PRIMITIVES["siphash24"]
    stream = LIB_SIPHASH(h(v["key"]))
    for length in range(8, len(v["digests_by_length"]), 8):
        assert stream.blocks(bytes(range(length - 8, length)), 1) == [h(v["digests_by_length"][length])]
    with pytest.raises(ValueError):
        LIB_SIPHASH(bytes(15))


DRBG_ROUTES = ["pure Python", "libcrypto"]


@pytest.fixture(params=DRBG_ROUTES)
def drbg(request):
    if request.param == "libcrypto":
        need(chooser.LibSipHashStream is not None, "libcrypto's EVP_MAC SipHash (OpenSSL 3)")
        return obfs4_drbg._LibcryptoHashDrbg
    return obfs4_drbg._PureHashDrbg


def test_drbg_routes_give_the_vectors(drbg):
    assert obfs4_drbg.drbg_proven(drbg)
    v = DRBG["hash_drbg_blocks"]
    one = drbg(h(v["seed"]))
    assert [one.next_block().hex() for _ in v["blocks"]] == v["blocks"]
    for case in DRBG["hash_drbg_go_compat"]["cases"]:
        source = drbg(h(case["seed"]))
        assert [source.int63() for _ in case["int63_first3"]] == case["int63_first3"]


def test_drbg_routes_agree_far_into_the_stream(drbg):
    seed = os.urandom(24)
    ours, pure = drbg(seed), obfs4_drbg._PureHashDrbg(seed)
    assert ours.masks(1000) == pure.masks(1000)
    assert ours.blocks(37) == pure.blocks(37)
    assert ours.mask16() == pure.mask16()


def test_a_wrong_drbg_route_is_passed_over(monkeypatch):
    class Wrong(obfs4_drbg._PureHashDrbg):
        def blocks(self, count):
            return [block ^ 1 for block in obfs4_drbg._PureHashDrbg.blocks(self, count)]
    monkeypatch.setattr(obfs4_drbg, "_LibcryptoHashDrbg", Wrong)
    monkeypatch.setattr(chooser, "LibSipHashStream", object())
    assert obfs4_drbg._drbg_route() == (obfs4_drbg._PureHashDrbg, "pure Python",
                                        ["libcrypto EVP_MAC SipHash"])


# --- native objects are freed -----------------------------------------------------------

def test_every_native_context_is_freed():
    """Contexts live with their Python objects and go with them: make many, drop them,
    and the count of live native contexts is back where it was."""
    need(LIB_AES_CTR is not None and LIB_SIPHASH is not None, "libcrypto (OpenSSL 3)")
    gc.collect()
    before = live_native_objects()
    ciphers = [LIB_AES_CTR(os.urandom(16), os.urandom(16)) for _ in range(200)]
    streams = [LIB_SIPHASH(os.urandom(16)) for _ in range(200)]
    for stream in streams:
        stream.blocks(bytes(8), 3)
    assert live_native_objects() == before + 400
    del ciphers, streams, stream
    gc.collect()
    assert live_native_objects() == before
    with pytest.raises(ValueError):
        LIB_AES_CTR(bytes(15), bytes(16))      # refused before anything is made
    assert live_native_objects() == before


def test_one_shot_calls_do_not_grow_the_process():
    """X25519 and Poly1305 free what they make on every path (success, a refused
    low-order point): many thousands of calls leave the resident size flat."""
    need(LIB_X25519 is not None and LIB_POLY1305 is not None, "libcrypto (OpenSSL 3)")
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc/self/statm")

    def resident_pages():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1])

    def work(n):
        for _ in range(n):
            LIB_X25519(os.urandom(32), os.urandom(32))
            LIB_X25519(os.urandom(32), bytes(32))
            LIB_POLY1305(os.urandom(32), bytes(1500))
    work(2000)                                  # let allocators reach their steady state
    start = resident_pages()
    work(8000)
    # a leak of even one 32-byte key per call would be 8000 * 3 * ~100 bytes = 2.4 MB
    assert resident_pages() - start < 1000 * 1024 // os.sysconf("SC_PAGE_SIZE")


# --- the routes Python alone runs --------------------------------------------------------

def test_python_alone_imports_the_transports(tmp_path):
    """``python3 -I -S``: no site-packages at all, so no pycryptodome, PyNaCl nor
    docopt; the transports import and report their routes."""
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import obfs2, obfs3, obfs4, webtunnel, obfs4_crypto\n"
            "from cryptoroutes import aes_ctr\n"
            "print(obfs4_crypto.route_report())\n"
            "print(aes_ctr.AES_CTR_ROUTE)\n" % str(ROOT))
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    report, aes = result.stdout.splitlines()
    assert "PyNaCl" not in report.split("PyNaCl not used")[0] and "pycryptodome Salsa20" not in report
    salsa20 = report.split("; Salsa20: ")[1].split(";")[0]
    assert salsa20.split()[0] in ("libsodium", "nettle", "libgcrypt", "pure")
    assert aes in ("libcrypto EVP_EncryptUpdate", "pure Python")

# --- the families and the setting (chooser.py) ---------------------------------------------

def test_pycryptodome_is_found_under_either_namespace(monkeypatch):
    assert chooser.import_pycryptodome(False, "stdlib") == (None, "OBFSPROXY_CRYPTO=stdlib")
    assert chooser.import_pycryptodome(True, namespaces=("NoSuchNamespace",))[0] is None
    found = [name for name in ("Crypto", "Cryptodome")
             if chooser.import_pycryptodome(True, namespaces=(name,))[0]]
    need(found, "pycryptodome")
    for name in found:      # pip's Crypto first; where it is absent, Debian's Cryptodome
        assert chooser.import_pycryptodome(True, namespaces=("NoSuchNamespace", name)) == (name, None)
    for name in [name for name in sys.modules if name.split(".")[0] == "Crypto"] + ["Crypto"]:
        monkeypatch.setitem(sys.modules, name, None)            # "import Crypto..." -> ImportError
    assert chooser.import_pycryptodome(True)[0] == ("Cryptodome" if "Cryptodome" in found else None)


@pytest.mark.parametrize("value, mode", [("", "auto"), (" AUTO ", "auto"), ("portable", "portable"),
                                         ("Stdlib", "stdlib")])
def test_crypto_mode_values(value, mode):
    assert chooser.crypto_mode({chooser.CRYPTO_ENV: value}) == mode
    assert chooser.crypto_mode({}) == "auto"


def test_a_bad_crypto_mode_is_one_line_naming_the_values():
    with pytest.raises(chooser.CryptoSettingError) as caught:
        chooser.crypto_mode({chooser.CRYPTO_ENV: "fast"})
    text = str(caught.value)
    assert "\n" not in text and "OBFSPROXY_CRYPTO='fast'" in text
    assert all("'%s'" % mode in text for mode in chooser.MODES)
    assert isinstance(caught.value, chooser.KnownAnswerError)      # obfsproxy.py's one-line path


def test_a_bad_crypto_mode_stops_every_route_module():
    for module in ("obfs2", "obfs3", "obfs4_drbg", "cryptoroutes.curve25519", "cryptoroutes.aes_ctr",
                   "obfs4_crypto"):
        result = subprocess.run([sys.executable, "-c", "import %s" % module], cwd=str(ROOT),
                                capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, OBFSPROXY_CRYPTO="fast"))
        assert result.returncode == 1, module
        assert result.stderr.strip().splitlines()[-1].startswith(
            "cryptoroutes.chooser.CryptoSettingError: OBFSPROXY_CRYPTO='fast' is not a crypto route "
            "setting"), module


# --- modular exponentiation through libcrypto (obfs3, Elligator2) ------------------------

def test_libcrypto_modexp_gives_the_uniformdh_answers_and_pow_on_edges():
    need(chooser.lib_modexp is not None, "libcrypto's BN_mod_exp_mont_consttime")
    import obfs3
    modexp = chooser.lib_modexp
    assert modexp(obfs3.G, obfs3.KAT_Y, obfs3.P) == obfs3.KAT_Y_PUBLIC
    assert modexp(obfs3.KAT_X_PUBLIC, obfs3.KAT_Y, obfs3.P) == obfs3.KAT_SHARED_SECRET
    exponent = 2 ** 1535 + 12345678
    for base in (0, 1, 2, obfs3.P - 1, obfs3.P, obfs3.P + 1, 2 ** 1536 - 1):
        assert modexp(base, exponent, obfs3.P) == pow(base, exponent, obfs3.P)
    assert modexp(5, 0, obfs3.P) == 1
    assert int(chooser.LibcryptoInteger(7).inplace_pow(3, 11)) == 7 ** 3 % 11
    with pytest.raises(ValueError):
        modexp(2, 3, 10)                    # Montgomery needs an odd modulus
    assert chooser._modexp_proven(modexp)
    assert not chooser._modexp_proven(lambda base, exponent, modulus: pow(base, exponent, modulus) ^ 1)


def test_the_tests_reference_aes_ecb_gives_fips_197():
    """The tests' reference block cipher where pycryptodome is not used: libcrypto's
    AES-ECB, both ways, on FIPS-197."""
    need(BINDINGS is not None, "libcrypto")
    AesEcb = make_aes_ecb(BINDINGS)
    need(AesEcb is not None, "libcrypto's AES-ECB")
    for key, ciphertext in FIPS_197:
        ecb = AesEcb(h(key))
        assert ecb.encrypt(FIPS_197_PLAINTEXT * 2) == h(ciphertext) * 2
        assert ecb.decrypt(h(ciphertext)) == FIPS_197_PLAINTEXT
    with pytest.raises(ValueError, match="whole 16-byte blocks"):
        AesEcb(bytes(16)).encrypt(bytes(15))


def test_a_wrong_libcrypto_poly1305_or_x25519_is_passed_over(monkeypatch):
    from cryptoroutes import curve25519
    monkeypatch.setattr(c, "_lib_poly1305", lambda key, data: bytes(16))
    monkeypatch.setattr(chooser, "sodium_poly1305", None)
    monkeypatch.setattr(chooser, "sodium_x25519", None)
    function, name, passed_over = c._poly1305_route()
    assert passed_over == ["libcrypto EVP_Q_mac"] and name in ("pycryptodome Poly1305_MAC", "pure Python")
    monkeypatch.setattr(curve25519, "_nacl", None)
    monkeypatch.setattr(curve25519, "_lib_x25519", lambda scalar, u: curve25519._x25519_pure(scalar, u[::-1]))
    function, name, passed_over = curve25519._x25519_route()
    assert passed_over == ["libcrypto EVP_PKEY_derive"]
    assert name in ("pycryptodome Crypto.Protocol.DH", "pure Python")


# --- the system libraries: how they are found, and what they refuse ----------------------

def test_libcrypto_x25519_gives_zeros_only_for_a_low_order_u():
    """When derive fails, zeros (the ladder's answer) only where u is of low order (its
    five values mod p, also with bit 255 set or plus p); any other failure raises, so
    that it never passes for a key (a bridge's public key of 0)."""
    need(BINDINGS is not None and LIB_X25519 is not None, "libcrypto's X25519")
    p = 2 ** 255 - 19
    for u in libcrypto.LOW_ORDER_U:
        for form in (u, u + p, u | 1 << 255):     # u + p is another name of u below 2^255 only
            if form < 2 ** 255 or form == u | 1 << 255:
                assert libcrypto.is_low_order(form.to_bytes(32, "little"))
                assert LIB_X25519(os.urandom(32), form.to_bytes(32, "little")) == bytes(32)
    assert not libcrypto.is_low_order((9).to_bytes(32, "little"))

    class FailingDerive:
        def __getattr__(self, name):
            return getattr(BINDINGS, name)
        EVP_PKEY_derive = staticmethod(lambda ctx, out, size: 0)
    x25519 = libcrypto.make_x25519(FailingDerive())
    assert x25519(os.urandom(32), bytes(32)) == bytes(32)
    with pytest.raises(ValueError, match="derive failed"):
        x25519(os.urandom(32), (9).to_bytes(32, "little"))


def test_macos_never_opens_an_unversioned_system_library(monkeypatch):
    """On macOS dlopen of /usr/lib/libcrypto.dylib (and its kind) aborts the process:
    such a name is never a candidate there; a versioned one is."""
    from cryptoroutes import syslib
    monkeypatch.setattr(libcrypto.ctypes.util, "find_library", lambda name: "/usr/lib/libcrypto.dylib")
    assert "/usr/lib/libcrypto.dylib" not in libcrypto.library_files(platform="darwin")
    assert "/usr/lib/libcrypto.dylib" in libcrypto.library_files(platform="linux")
    found = syslib.candidates("libsodium", "darwin", lambda name: "/usr/lib/libsodium.dylib")
    assert "/usr/lib/libsodium.dylib" not in found and "libsodium.23.dylib" in found
    found = syslib.candidates("nettle", "darwin", lambda name: "/opt/local/lib/libnettle.8.dylib")
    assert found[-1] == "/opt/local/lib/libnettle.8.dylib"
    assert syslib.candidates("libgcrypt", "win32", lambda name: None) == ["libgcrypt-20.dll"]


def test_a_missing_system_library_is_a_route_not_taken():
    """Nothing that loads is required: no file, a file without the function, or a
    find_library that fails are each a reason, never an exception."""
    from cryptoroutes import syslib

    def no_file(name):
        raise OSError("%s: cannot open shared object file" % name)

    def raises(name):
        raise RuntimeError("ldconfig is not there")
    lib, name, why = syslib.load("nettle", "nettle_salsa20_crypt", "linux", raises, no_file)
    assert lib is None and why == "nettle not found"

    class Empty:
        pass
    lib, name, why = syslib.load("libsodium", "sodium_init", "linux", lambda n: None, lambda n: Empty())
    assert lib is None and why == "libsodium (libsodium.so.23) lacks sodium_init"


@pytest.mark.parametrize("family", ["libsodium", "nettle", "libgcrypt"])
def test_each_system_salsa20_gives_the_known_answers(family):
    """Each library's Salsa20, where it is on this machine, gives the vectors'
    keystream (and the import-time answers), for any length and offset of a frame."""
    salsa20 = getattr(chooser, {"libsodium": "sodium_salsa20_xor", "nettle": "nettle_salsa20_xor",
                                "libgcrypt": "gcrypt_salsa20_xor"}[family])
    need(salsa20 is not None, family)
    assert chooser.gives(salsa20, c._SALSA20_ANSWERS)
    key, nonce = os.urandom(32), os.urandom(8)
    for length in (0, 1, 63, 64, 65, 1462, 1494, 70000):
        data = os.urandom(length)
        assert salsa20(key, nonce, data) == pure_salsa20.salsa20_xor(key, nonce, data)
        assert salsa20(key, nonce, bytearray(data)) == salsa20(key, nonce, memoryview(data))
    with pytest.raises(ValueError):
        salsa20(bytes(31), nonce, b"x")


def test_libsodium_routes_give_the_known_answers():
    """libsodium through ctypes, where it is: its HSalsa20, Poly1305, X25519 and
    secretbox on the import-time answers, and a forged box refused."""
    need(chooser.sodium_secretbox is not None, "libsodium")
    from cryptoroutes import curve25519
    assert chooser.gives(chooser.sodium_hsalsa20, c._HSALSA20_ANSWERS)
    assert chooser.gives(chooser.sodium_poly1305, c._POLY1305_ANSWERS)
    assert chooser.gives(chooser.sodium_x25519, curve25519._X25519_ANSWERS)
    assert chooser.gives(curve25519._dirty_u_sodium, curve25519._EDWARDS_ANSWERS)
    assert c._secretbox_proven(c._SodiumSecretBox)
    seal, open_box = chooser.sodium_secretbox
    key, nonce = os.urandom(32), os.urandom(24)
    box = seal(b"", nonce, key)
    assert len(box) == 16 and open_box(box, nonce, key) == b""
    for forged in (box[:15], bytes([box[0] ^ 1]) + box[1:]):
        with pytest.raises(ValueError, match="bad tag"):
            open_box(forged, nonce, key)


# --- the words: what the report and the start-up line say --------------------------------

def test_a_library_lacking_a_call_is_said_to_lack_it(monkeypatch):
    """An older library without a call (Debian 12's pycryptodome 3.11 has no Salsa20
    seek) is passed over as lacking it, not as answering wrongly."""
    class NoSeek:
        def encrypt(self, data):
            return data
    lacking = lambda key, data: NoSeek().seek(0)         # noqa: E731 (AttributeError: 'seek')
    wrong = lambda key, data: bytes(16)                  # noqa: E731
    monkeypatch.setattr(chooser, "LACKS", {})
    answers = chooser.answers(c._POLY1305_ANSWERS)
    value, name, passed_over = chooser.choose([(lacking, "old one"), (wrong, "wrong one"),
                                               (c._poly1305_pure, "pure Python")], answers)
    assert passed_over == ["old one", "wrong one"] and chooser.LACKS == {"old one": "seek"}
    assert chooser.failed_text(passed_over) == "old one not used: this old lacks seek; " \
                                               "wrong one failed its known answer"


@pytest.mark.parametrize("situation, warn, words", [
    ("left out", False, "the crypto setting leaves out PyNaCl"),
    ("-S", False, "site-packages are off (python3 -S), so an installed PyNaCl or pycryptodome is not "
                  "looked for"),
    ("pyz", False, "where you may install software, the system's libsodium"),
    ("checkout", True, "install PyNaCl or a recent pycryptodome")])
def test_plain_python_is_a_warning_only_where_installing_helps(monkeypatch, situation, warn, words):
    monkeypatch.setattr(chooser, "LEFT_OUT", dict.fromkeys(chooser.FAMILIES))
    monkeypatch.setattr(chooser, "site_packages_off", lambda: situation == "-S")
    monkeypatch.setattr(chooser, "in_zipapp", lambda: situation == "pyz")
    if situation == "left out":
        monkeypatch.setitem(chooser.LEFT_OUT, "PyNaCl", "OBFSPROXY_CRYPTO=portable")
    got_warn, text = chooser.plain_python_notice(["Salsa20", "X25519"])
    assert got_warn is warn
    assert text.startswith("Salsa20, X25519 run in plain Python here (slower, and not constant-time): ")
    assert words in text
    assert "libsodium" in text or situation == "left out"


def test_site_packages_off_is_not_said_to_be_not_installed(tmp_path):
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from cryptoroutes import chooser\n"
            "print(chooser.unavailable()['PyNaCl'])\n" % str(ROOT))
    environ = {k: v for k, v in os.environ.items() if k not in (chooser.CRYPTO_ENV, chooser.SKIP_ENV)}
    result = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                            timeout=60, cwd=str(tmp_path), env=environ)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "PyNaCl is not looked for: site-packages are off (python3 -S)"


def test_the_start_up_line_is_a_notice_where_the_user_cannot_improve_it(monkeypatch, caplog):
    import logging

    import proxy
    import transports
    monkeypatch.setattr(transports, "crypto_routes", lambda names: ({"Salsa20": "pure Python"}, ["Salsa20"]))
    for warn, level in ((False, proxy.NOTICE), (True, logging.WARNING)):
        monkeypatch.setattr(chooser, "plain_python_notice", lambda pieces, warn=warn: (warn, "the words"))
        caplog.clear()
        with caplog.at_level(1):
            proxy.log_routes(["obfs4"])
        assert [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage() == "the words"] == \
            [(level, "the words")]
