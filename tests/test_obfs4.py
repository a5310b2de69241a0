"""Tests for obfs4.py, the sans-IO obfs4 transport.

Known answers come from ``shared/vectors`` (obfs4-handshake.json: fixed-key ntor and a
whole deterministic session start whose client handshake obfs4proxy 0.0.14 accepted live;
obfs4-server-state.json: files and lines captured from obfs4proxy). What we compute here
to compare against is written from obfs4-spec.md with hashlib/hmac and the primitives of
obfs4_crypto (which have their own known-answer tests): the ntor and HKDF reference, and
``RefEncoder``/``RefDecoder`` for frames (§2.8). Nothing expected is copied from obfs4.py.

The client handshake, as the session vector lays it out::

    X' (32) | P_C (100) | M_C = H16(B | NODEID, X') | MAC_C = H16(B | NODEID, X' | P_C | M_C | E)
"""

import errno
import hashlib
import hmac
import os
import random
import stat
import threading

import pytest
from crypto_routes import ROUTES, use_route
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import load_vectors

import obfs4
import obfs4_state
from cryptoroutes import curve25519
from cryptoroutes.curve25519 import x25519, x25519_base
from obfs4_crypto import secretbox_open, secretbox_seal
from obfs4_drbg import HashDrbg, WeightedDist

HANDSHAKE = load_vectors("obfs4-handshake.json")
STATE = load_vectors("obfs4-server-state.json")
PROBDIST = load_vectors("obfs4-drbg-probdist.json")
S = HANDSHAKE["session"]
hx = bytes.fromhex

NODE_ID = hx(S["server_identity"]["node_id"])
B = hx(S["server_identity"]["public_key_B"])
DRBG_SEED = hx(S["server_identity"]["drbg_seed"])
CERT = S["server_identity"]["cert"]
KEY = B + NODE_ID                                    # the mark/MAC key, public key first
E = int(S["epoch_hour_E"])
CLIENT_KEYPAIR = tuple(hx(S["client_ephemeral"][k]) for k in ("priv", "dirty_u_X", "representative_X'"))
SERVER_KEYPAIR = tuple(hx(S["server_ephemeral"][k]) for k in ("priv", "dirty_u_Y", "representative_Y'"))
OKM = hx(S["okm144"])
C2S, S2C = OKM[:72], OKM[72:]                        # erratum 3: the first half is client->server


# --- The reference, written from the spec ----------------------------------------------

def H16(key, message):
    return hmac.new(key, message, hashlib.sha256).digest()[:16]


def HMAC(key, message):
    return hmac.new(key, message, hashlib.sha256).digest()


def ref_hkdf(ikm, salt, info, length):
    """RFC 5869: PRK = HMAC(salt, IKM); T(i) = HMAC(PRK, T(i-1) | info | i)."""
    prk, t, okm = HMAC(salt, ikm), b"", b""
    for i in range(1, (length + 31) // 32 + 1):
        t = HMAC(prk, t + info + bytes([i]))
        okm += t
    return okm[:length]


def ref_ntor(exp1, exp2, b_pub, x_pub, y_pub, node_id):
    """Every intermediate of §2.6 (suffix has B twice, NODEID last)."""
    protoid = b"ntor-curve25519-sha256-1"
    secret_input = exp1 + exp2 + b_pub + b_pub + x_pub + y_pub + protoid + node_id
    verify = HMAC(protoid + b":key_verify", secret_input)
    auth_input = verify + secret_input[64:] + b"Server"
    key_seed = HMAC(protoid + b":key_extract", secret_input)
    return {"secret_input": secret_input, "verify": verify, "auth_input": auth_input,
            "key_seed": key_seed, "auth": HMAC(protoid + b":mac", auth_input),
            "okm144": ref_hkdf(key_seed, protoid + b":key_extract", protoid + b":key_expand", 144)}


def be16(n):
    return n.to_bytes(2, "big")


class RefEncoder:
    """§2.8: frame = BE16(L XOR mask) | secretbox(key, prefix | BE64(counter), packet)."""

    def __init__(self, key72):
        self.key, self.prefix, self.drbg, self.counter = key72[:32], key72[32:48], HashDrbg(key72[48:]), 1

    def frame(self, packet, length=None):
        box = secretbox_seal(self.key, self.prefix + self.counter.to_bytes(8, "big"), packet)
        self.counter += 1
        mask = self.drbg.next_block()
        length = 16 + len(packet) if length is None else length
        return be16(length ^ int.from_bytes(mask[:2], "big")) + box


class RefDecoder:
    """Splits a frame stream into (wire size, packet) pairs, strictly."""

    def __init__(self, key72):
        self.key, self.prefix, self.drbg, self.counter = key72[:32], key72[32:48], HashDrbg(key72[48:]), 1

    def frames(self, wire):
        out, pos = [], 0
        while pos < len(wire):
            mask = int.from_bytes(self.drbg.next_block()[:2], "big")
            length = int.from_bytes(wire[pos:pos + 2], "big") ^ mask
            assert 16 <= length <= 1446
            box = wire[pos + 2:pos + 2 + length]
            assert len(box) == length, "frame cut short"
            nonce = self.prefix + self.counter.to_bytes(8, "big")
            out.append((2 + length, secretbox_open(self.key, nonce, box)))
            self.counter += 1
            pos += 2 + length
        return out


def packet(ptype, payload=b"", padding=0):
    """§2.9: type | BE16(n) | payload | zero padding."""
    return bytes([ptype]) + be16(len(payload)) + payload + bytes(padding)


def filler(n, salt=0):
    return bytes((i * 151 + salt * 7 + 13) & 0xFF for i in range(n))


# --- Building sides with scripted randomness --------------------------------------------

class Script:
    """An injectable ``randbytes`` handing out the given chunks in order, each checked
    against the length asked for."""

    def __init__(self, *chunks):
        self.chunks = list(chunks)

    def __call__(self, n):
        chunk = self.chunks.pop(0)
        assert len(chunk) == n
        return chunk


def at_hour(hour, second=1800):
    return lambda: hour * 3600 + second


def identity(iat_mode=0):
    return obfs4.Identity(NODE_ID, hx(S["server_identity"]["private_key_b"]), DRBG_SEED, iat_mode)


def make_client(pad=100, padding=None, hour=E, iat_mode=0, keypair=CLIENT_KEYPAIR, options=None,
                target=None):
    config = obfs4.Obfs4.client_config(options or {"cert": CERT, "iat-mode": str(iat_mode)})
    config.keypairs = lambda: keypair
    config.pad_length = lambda lo, hi: pad
    config.randbytes = Script(filler(pad, 1) if padding is None else padding)
    config.clock = at_hour(hour)
    if target is not None:
        config.sample = lambda dist: target
    return obfs4.Obfs4(True, config)


def make_server(config=None, pad=32, hour=E, keypair=SERVER_KEYPAIR, target=None, iat_mode=0):
    config = config or obfs4.ServerConfig(identity(iat_mode))
    config.keypairs = lambda: keypair
    config.pad_length = lambda lo, hi: pad
    config.randbytes = lambda n: filler(n, 2)
    config.clock = at_hour(hour)
    if target is not None:
        config.sample = lambda dist: target
    return obfs4.Obfs4(False, config)


def feed(side, data, split=None):
    out = []
    for chunk in (split(data) if split else [data]):
        plaintext = side.receive(chunk)
        assert type(plaintext) is bytes
        out.append(plaintext)
    return b"".join(out)


def connect(client, server, split=None):
    assert feed(server, client.start(), split) == b""
    assert server.is_open
    assert feed(client, server.data_to_send(), split) == b""
    assert client.is_open


def bytewise(data):
    return [data[i:i + 1] for i in range(len(data))]


def cuts(points):
    """A split function cutting at the given offsets (taken modulo the length)."""
    def split(data):
        offsets = sorted({p % (len(data) + 1) for p in points} | {0, len(data)})
        return [data[a:b] for a, b in zip(offsets, offsets[1:])]
    return split


def assert_silent(server):
    assert not server.is_open
    assert server.data_to_send() == b""


def assert_fails(server, data):
    with pytest.raises(obfs4.ProtocolError):
        server.receive(data)
    assert_silent(server)


@pytest.fixture(params=ROUTES)
def crypto_route(request, monkeypatch):
    """The test once per family of obfs4_crypto routes (PyNaCl, pycryptodome, pure
    Python, and the one chosen at import): the session must replay on each."""
    use_route(monkeypatch, request.param)
    monkeypatch.setattr(obfs4, "x25519", curve25519.x25519)        # obfs4 holds the name
    return request.param


# --- Known answers: ntor, HKDF, frames -------------------------------------------------

def test_reference_ntor_matches_every_fixed_key_intermediate():
    v = HANDSHAKE["ntor_fixed_keys"]
    ref = ref_ntor(hx(v["exp1_x_Y"]), hx(v["exp2_x_B"]), hx(v["B"]), hx(v["X"]), hx(v["Y"]), hx(v["node_id"]))
    for name in ("secret_input", "verify", "auth_input", "key_seed", "auth"):
        assert ref[name] == hx(v[name]), name
    assert ref["okm144"] == hx(v["okm144"])
    assert len(ref["secret_input"]) == 236 and len(ref["auth_input"]) == 210


def test_ntor_both_sides_and_kdf_match_the_fixed_key_vector():
    v = HANDSHAKE["ntor_fixed_keys"]
    b, x, y = hx(v["b"]), hx(v["x"]), hx(v["y"])
    b_pub, x_pub, y_pub, node_id = hx(v["B"]), hx(v["X"]), hx(v["Y"]), hx(v["node_id"])
    expected = (hx(v["key_seed"]), hx(v["auth"]))
    assert obfs4.client_ntor(x, x_pub, y_pub, b_pub, node_id) == expected
    assert obfs4.server_ntor(y, y_pub, x_pub, b, b_pub, node_id) == expected
    okm = obfs4.kdf(expected[0])
    assert okm == hx(v["okm144"])
    split = v["okm_split"]
    for half, name in ((okm[:72], "client_to_server"), (okm[72:], "server_to_client")):
        keys = split[name]
        assert half == hx(keys["secretbox_key"] + keys["nonce_prefix"]
                          + keys["siphash_key"] + keys["drbg_ofb_iv"])


def test_ntor_refuses_a_zero_diffie_hellman_result():
    v = HANDSHAKE["ntor_fixed_keys"]
    with pytest.raises(obfs4.ProtocolError):
        obfs4.client_ntor(hx(v["x"]), hx(v["X"]), bytes(32), hx(v["B"]), hx(v["node_id"]))
    with pytest.raises(obfs4.ProtocolError):
        obfs4.server_ntor(hx(v["y"]), hx(v["Y"]), bytes(32), hx(v["b"]), hx(v["B"]), hx(v["node_id"]))


def test_research_frames_encode_and_decode(crypto_route):
    frames = HANDSHAKE["research_frames"]
    okm = hx(HANDSHAKE["ntor_fixed_keys"]["okm144"])
    encoder, c2s = obfs4.FrameEncoder(okm[:72]), frames["client_to_server"]
    assert encoder.encode(packet(0, b"hello")) == hx(c2s["frame1(packet type0 'hello')"])
    assert encoder.encode(packet(0, b"", 10)) == hx(c2s["frame2(type0 empty, 10 pad)"])
    seed_frame = hx(frames["server_to_client_seed_frame"])
    packets = obfs4.FrameDecoder(okm[72:]).decode(seed_frame)
    assert len(packets) == 1
    ptype, payload = obfs4.parse_packet(packets[0])
    assert ptype == obfs4.PACKET_TYPE_PRNG_SEED and len(payload) == 24


def test_session_vector_is_what_the_spec_says(crypto_route):
    """Anchor: the session's fields, rebuilt with hmac from the spec, are its messages."""
    x_repr, pad_c = hx(S["client_ephemeral"]["representative_X'"]), hx(S["client_padding_P_C"])
    m_c = H16(KEY, x_repr)
    mac_c = H16(KEY, x_repr + pad_c + m_c + S["epoch_hour_E"].encode())
    assert (m_c, mac_c) == (hx(S["M_C"]), hx(S["MAC_C"]))
    assert x_repr + pad_c + m_c + mac_c == hx(S["client_handshake"])
    assert CERT == obfs4_state.encode_cert(NODE_ID, B) and len(CERT) == 70
    for frames, key in ((S["client_to_server_frames"], C2S), (S["server_to_client_frames"], S2C)):
        drbg = HashDrbg(key[48:])
        for i, f in enumerate(frames, 1):
            assert hx(f["nonce"]) == key[32:48] + i.to_bytes(8, "big")
            assert hx(f["length_mask"]) == drbg.next_block()[:2]
            frame = hx(f["frame"])
            mask = int.from_bytes(hx(f["length_mask"]), "big")
            assert int.from_bytes(frame[:2], "big") ^ mask == len(frame) - 2
            assert secretbox_open(key[:32], hx(f["nonce"]), frame[2:]) == hx(f["packet"])


def test_session_replays_byte_for_byte(crypto_route):
    # Client: the real keypair generation from the vector's CSPRNG input, then P_C.
    config = obfs4.Obfs4.client_config({"cert": CERT, "iat-mode": "0"})
    config.randbytes = Script(hx(S["client_ephemeral"]["csprng_input32"]), hx(S["client_padding_P_C"]))
    config.pad_length = lambda lo, hi: (lo, hi) == (77, 8128) and len(S["client_padding_P_C"]) // 2
    config.clock = at_hour(E, 3599)
    config.sample = lambda dist: 70                   # GET frame (39 bytes) + one 31-byte padding frame
    client = obfs4.Obfs4(True, config)
    assert client.start() == hx(S["client_handshake"])
    assert len(hx(S["client_handshake"])) == S["client_handshake_len"]

    server_config = obfs4.ServerConfig(identity())
    server_config.randbytes = Script(hx(S["server_ephemeral"]["csprng_input32"]), hx(S["server_padding_P_S"]))
    server_config.pad_length = lambda lo, hi: (lo, hi) == (0, 8051) and len(S["server_padding_P_S"]) // 2
    server_config.clock = at_hour(E, 0)
    server_config.sample = lambda dist: 38            # exactly the data frame: no padding
    server = obfs4.Obfs4(False, server_config)
    assert server.start() == b"" and server.data_to_send() == b""
    assert server.receive(hx(S["client_handshake"])) == b""
    assert server.is_open
    reply = server.data_to_send()
    assert reply == hx(S["server_reply_including_seed_frame"])
    assert len(reply) == S["server_reply_len"]
    assert reply[-45:] == hx(S["server_seed_frame"]) == hx(S["server_to_client_frames"][0]["frame"])
    assert server.data_to_send() == b""

    assert client.receive(reply) == b""
    assert client.is_open
    c2s, s2c = S["client_to_server_frames"], S["server_to_client_frames"]
    wire = client.send(hx(c2s[0]["packet"])[3:])
    assert wire == hx(c2s[0]["frame"]) + hx(c2s[1]["frame"])
    assert server.receive(wire) == b"GET / HTTP/1.0\r\n\r\n"
    wire = server.send(hx(s2c[1]["packet"])[3:])
    assert wire == hx(s2c[1]["frame"])
    assert client.receive(wire) == b"HTTP/1.0 200 OK\r\n"


def test_identity_and_cert():
    ident = identity()
    assert ident.public_key == B == x25519_base(hx(S["server_identity"]["private_key_b"]))
    assert ident.cert == CERT
    assert obfs4.parse_cert(CERT) == (NODE_ID, B)
    assert "+" in STATE["generated_identity"]["obfs4_bridgeline.txt"]      # standard alphabet
    for bad in ("AAAA", CERT[:-1], CERT + "AAAA", CERT[:-2] + "-_", "é" * 70):
        with pytest.raises(ValueError):
            obfs4.parse_cert(bad)


# --- Client and server wired in memory --------------------------------------------------

MESSAGES = [b"hello", b"x" * 1427, b"y" * 1428, filler(5000), filler(40000, 3), b"\x00"]


@pytest.mark.parametrize("split", [None, bytewise, cuts([1, 64, 140, 141, 200])],
                         ids=["whole", "bytewise", "cuts"])
def test_pair_talks_both_ways(split):
    client, server = make_client(), make_server()
    connect(client, server, split)
    for message in MESSAGES:
        chunking = split if split is not bytewise or len(message) < 3000 else cuts(range(0, 50000, 997))
        assert feed(server, client.send(message), chunking) == message
        assert feed(client, server.send(message[::-1]), chunking) == message[::-1]
    assert client.send(b"") == b"" and server.send(b"") == b""


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(points=st.lists(st.integers(0, 9000), max_size=12), size=st.integers(1, 4000),
       pad=st.integers(77, 8128), server_pad=st.integers(0, 8051))
def test_every_split_gives_the_same_result(points, size, pad, server_pad):
    split = cuts(points)
    client_whole, server_whole = make_client(pad=pad), make_server(pad=server_pad, target=700)
    client, server = make_client(pad=pad, target=9), make_server(pad=server_pad, target=700)
    hello = client.start()
    assert hello == client_whole.start()
    assert feed(server, hello, split) == b"" and feed(server_whole, hello) == b""
    reply = server.data_to_send()
    assert reply == server_whole.data_to_send()
    message = filler(size, 5)
    glued = reply + server.send(message)          # data may follow the seed frame at once
    assert server_whole.send(message) == glued[len(reply):]
    assert feed(client, glued, split) == message
    assert feed(server, client.send(message), split) == message


def test_client_keeps_the_E_it_sent():
    # The server answers with the E' it matched; the client checks with its stored E,
    # even if its clock crossed the hour in between.
    client, server = make_client(hour=E), make_server(hour=E + 1)
    assert server.receive(client.start()) == b""
    client.config.clock = at_hour(E + 5)
    assert client.receive(server.data_to_send()) == b""
    assert client.is_open


def test_ephemeral_keys_are_made_in_start_and_in_the_accepting_receive():
    """Key generation is the work the core serialises (start() and receive()), so the
    constructor makes none; a server makes its keypair only for a handshake that
    verified, so a prober costs it none."""
    drawn = []
    config = obfs4.Obfs4.client_config({"cert": CERT, "iat-mode": "0"})
    config.keypairs = lambda: drawn.append("client") or CLIENT_KEYPAIR
    config.pad_length, config.randbytes, config.clock = (lambda lo, hi: 100), filler, at_hour(E)
    client = obfs4.Obfs4(True, config)
    server_config = obfs4.ServerConfig(identity())
    server_config.keypairs = lambda: drawn.append("server") or SERVER_KEYPAIR
    server_config.clock = at_hour(E)
    server, prober = obfs4.Obfs4(False, server_config), obfs4.Obfs4(False, server_config)
    assert drawn == []
    hello = client.start()
    assert drawn == ["client"] and hello[:32] == CLIENT_KEYPAIR[2]
    assert prober.receive(hello[:100]) == b"" and drawn == ["client"]      # no mark yet
    assert_fails(prober, os.urandom(8192))
    assert drawn == ["client"]
    assert server.receive(hello) == b"" and drawn == ["client", "server"]
    assert server.data_to_send()[:32] == SERVER_KEYPAIR[2]


def test_a_prepared_keypair_comes_before_the_configs_and_is_used_once():
    key, make = obfs4.Obfs4.prepare(True, None)
    assert key == "obfs4 keypairs" and obfs4.Obfs4.prepare(False, None)[0] == key
    config = obfs4.Obfs4.client_config({"cert": CERT, "iat-mode": "0"})
    config.keypairs = lambda: pytest.fail("the prepared keypair comes first")
    pooled = make()
    client = obfs4.Obfs4(True, config, prepared=pooled)
    hello = client.start()
    assert hello[:32] == pooled[2]                          # X' on the wire is the pooled one
    server_config = obfs4.ServerConfig(identity())
    pooled = make()
    server = obfs4.Obfs4(False, server_config, prepared=pooled)
    assert server.receive(hello) == b""
    reply = server.data_to_send()
    assert reply[:32] == pooled[2]                          # and Y'
    assert client.receive(reply) == b""
    assert server.receive(client.send(b"ping")) == b"ping"
    assert client.receive(server.send(b"pong")) == b"pong"
    assert server_config.keypairs is None                   # the listener's config is untouched


def test_default_randomness_talks():
    client = obfs4.Obfs4(True, obfs4.Obfs4.client_config({"cert": CERT, "iat-mode": "0"}))
    server = obfs4.Obfs4(False, obfs4.ServerConfig(identity()))
    hello = client.start()
    assert 141 <= len(hello) <= 8192
    assert server.receive(hello) == b""
    reply = server.data_to_send()
    assert 141 <= len(reply) <= 8192
    assert client.receive(reply) == b""
    assert server.receive(client.send(b"ping")) == b"ping"
    assert client.receive(server.send(b"pong")) == b"pong"


def test_misuse_is_a_runtime_error():
    client = make_client()
    with pytest.raises(RuntimeError):
        client.receive(b"x")
    with pytest.raises(RuntimeError):
        client.send(b"x")
    client.start()
    with pytest.raises(RuntimeError):
        client.start()


# --- Server: what it rejects, and that it stays silent ----------------------------------

@pytest.mark.parametrize("pad", [77, 8128])
def test_server_accepts_padding_77_and_8128(pad):
    client, server = make_client(pad=pad), make_server()
    hello = client.start()
    assert len(hello) == 64 + pad
    assert server.receive(hello) == b"" and server.is_open


def test_server_waits_on_padding_76_and_fails_at_8192():
    server = make_server()
    hello = make_client(pad=76).start()
    assert len(hello) == 140
    assert server.receive(hello) == b""
    assert_silent(server)
    assert server.receive(bytes(8191 - 140)) == b""
    assert_fails(server, b"\x00")


def test_server_rejects_padding_8129():
    assert_fails(make_server(), make_client(pad=8129).start())


@pytest.mark.parametrize("offset", [-1, 1])
def test_server_accepts_an_hour_of_skew(offset):
    client, server = make_client(hour=E + offset), make_server(hour=E)
    assert server.receive(client.start()) == b"" and server.is_open
    assert client.receive(server.data_to_send()) == b"" and client.is_open


@pytest.mark.parametrize("offset", [-2, 2])
def test_server_rejects_two_hours_of_skew(offset):
    assert_fails(make_server(hour=E), make_client(hour=E + offset).start())


def test_a_byte_after_mac_c_gets_no_reply():
    # The mark is looked for only at the tail, so the handshake plus one byte waits ...
    server = make_server()
    assert server.receive(make_client().start() + b"\x00") == b""
    assert_silent(server)
    # ... and at the 8192-byte limit the MAC matches but the trailing byte fails it.
    hello = make_client(pad=8128).start()
    assert len(hello) == 8192
    assert_fails(make_server(), hello + b"\x00")


def test_replay_insert_happens_before_the_trailing_byte_check():
    config = obfs4.ServerConfig(identity())
    hello = make_client(pad=8128).start()
    assert_fails(make_server(config), hello + b"\x00")
    assert_fails(make_server(config), hello)


def test_replayed_handshake_is_rejected_but_new_padding_is_not():
    config = obfs4.ServerConfig(identity())
    hello = make_client().start()
    assert make_server(config).receive(hello) == b""
    assert_fails(make_server(config), hello)
    # The same ephemeral key with other padding is a new MAC_C (live: accepted).
    server = make_server(config)
    assert server.receive(make_client(padding=filler(100, 9)).start()) == b"" and server.is_open
    assert len(config.replay_filter) == 2


@pytest.mark.parametrize("options", [
    {"cert": obfs4_state.encode_cert(b"\x01" * 20, B), "iat-mode": "0"},                  # wrong NODEID
    {"cert": obfs4_state.encode_cert(NODE_ID, x25519_base(b"\x05" * 32)), "iat-mode": "0"},  # wrong B
], ids=["node-id", "public-key"])
def test_wrong_bridge_identity_gets_silence(options):
    server = make_server()
    hello = make_client(options=options).start()
    assert server.receive(hello) == b""
    assert_silent(server)
    assert_fails(server, bytes(8192 - len(hello)))


def test_8192_junk_bytes_fail():
    server = make_server()
    assert server.receive(os.urandom(8191)) == b""
    assert_fails(server, os.urandom(1))
    assert_fails(make_server(), os.urandom(8192))
    assert_fails(make_server(), os.urandom(20000))


def test_zero_representative_fails():
    # X' = 0 decodes to u = 0, a low-order point: every DH result is zero.
    assert_fails(make_server(), make_client(keypair=(CLIENT_KEYPAIR[0], bytes(32), bytes(32))).start())


def test_a_failed_server_stays_failed_and_silent():
    server = make_server()
    assert_fails(server, os.urandom(8192))
    assert_fails(server, make_client().start())


def test_failure_linger_is_30_s_plus_the_close_delay():
    for case in PROBDIST["close_delay_verified_live"]["cases"]:
        config = obfs4.ServerConfig(obfs4.Identity(NODE_ID, bytes(32), hx(case["drbg_seed"])))
        config.keypairs = lambda: SERVER_KEYPAIR
        assert obfs4.Obfs4(False, config).failure_linger == 30 + case["close_delay_s"]
        assert 30 + case["close_delay_s"] == case["measured_close_s"]
    assert make_client().failure_linger is None


def test_contract_members_by_side():
    client, server = make_client(), make_server()
    assert obfs4.Obfs4.secret_options == ("private-key", "drbg-seed")   # a server's; cert= is public
    assert obfs4.Obfs4.uses_state_dir is True
    assert obfs4.Obfs4.handshake_timeout is None
    # The server's deadline is obfs4proxy's 30 s whatever --handshake-timeout says: a
    # prober must see the same timing as from obfs4proxy. The client's is the core's.
    assert server.handshake_timeout == 30 and client.handshake_timeout is None
    assert not hasattr(obfs4, "CLIENT_HANDSHAKE_TIMEOUT")          # never enforced: gone
    assert client.config.notes == () and server.config.notes == ()


def test_failure_hints_name_the_wrong_cert():
    client, server = make_client(), make_server()
    # A wrong cert= gets silence, so on the client it is a timeout, and the hint says so.
    assert "wrong cert=" in client.failure_hint("timeout")
    assert "stays silent" in client.failure_hint("timeout")
    assert client.failure_hint("protocol") == "(is it an obfs4 server? the right cert?)"
    assert "wrong cert=" in client.failure_hint("closed")
    for kind in ("protocol", "timeout", "closed"):
        assert server.failure_hint(kind) == "(a prober, or a client with a wrong cert)"
        assert client.failure_hint(kind).startswith("(") and client.failure_hint(kind).endswith(")")
    assert client.failure_hint("something else") == ""


# --- Client: what it rejects -----------------------------------------------------------

def reply_for(client, **server_kwargs):
    server = make_server(**server_kwargs)
    server.receive(client.start())
    return server.data_to_send()


def test_client_rejects_a_bad_mac_s():
    client = make_client()
    reply = bytearray(reply_for(client))
    reply[32 + 32 + 32 + 16] ^= 1                 # first byte of MAC_S (P_S is 32 bytes)
    with pytest.raises(obfs4.ProtocolError):
        client.receive(bytes(reply))
    assert not client.is_open


def test_client_rejects_a_bad_auth_under_a_good_mac_s():
    client = make_client()
    reply = reply_for(client)
    auth = bytearray(reply[32:64])
    auth[0] ^= 1
    head = reply[:32] + bytes(auth) + reply[64:96 + 16]
    forged = head + H16(KEY, head + str(E).encode()) + reply[-45:]
    with pytest.raises(obfs4.ProtocolError, match="AUTH"):
        client.receive(forged)


def test_client_rejects_a_low_order_server_key():
    client = make_client()
    client.start()
    head = bytes(32) + os.urandom(32) + H16(KEY, bytes(32))
    with pytest.raises(obfs4.ProtocolError):
        client.receive(head + H16(KEY, head + str(E).encode()))


@pytest.mark.parametrize("pad", [8051, 8096])
def test_client_accepts_server_padding_up_to_8096(pad):
    client = make_client()
    assert client.receive(reply_for(client, pad=pad)) == b"" and client.is_open


def test_client_rejects_server_padding_8097():
    client = make_client()
    reply = reply_for(client, pad=8097)
    assert client.receive(reply[:8191]) == b""
    with pytest.raises(obfs4.ProtocolError):
        client.receive(reply[8191:])


def test_client_takes_the_first_m_s_it_finds():
    # A copy of M_S inside P_S comes first, so the MAC_S check runs there and fails,
    # as in obfs4proxy (bytes.Index); a last-occurrence search would have accepted.
    client = make_client()
    server = make_server(pad=48)
    m_s = H16(KEY, SERVER_KEYPAIR[2])
    server.config.randbytes = lambda n: m_s + filler(n - 16)
    server.receive(client.start())
    reply = server.data_to_send()
    assert reply.count(m_s) == 2
    with pytest.raises(obfs4.ProtocolError, match="MAC_S"):
        client.receive(reply)


def test_client_waits_for_the_mark_then_gives_up_at_8192():
    client = make_client()
    client.start()
    assert client.receive(os.urandom(8000)) == b""
    assert not client.is_open
    with pytest.raises(obfs4.ProtocolError):
        client.receive(os.urandom(192))


# --- Frames and packets ----------------------------------------------------------------

def open_session_pair():
    """The session vector's pair, open, so that its OKM (and so C2S/S2C) is known."""
    client, server = make_client(), make_server()
    connect(client, server)
    return client, server


def test_the_session_pairs_keys_are_the_vectors_okm():
    client, server = open_session_pair()
    server.config.sample = lambda dist: 2 + 16 + 3 + 5            # no padding frame
    c2s = RefEncoder(C2S)
    assert server.receive(c2s.frame(packet(0, b"known keys"))) == b"known keys"
    s2c = RefDecoder(S2C)
    s2c.frames(hx(S["server_seed_frame"]))
    assert s2c.frames(server.send(b"reply")) == [(2 + 16 + 3 + 5, packet(0, b"reply"))]


def test_bad_tag_fails():
    client, server = open_session_pair()
    frame = bytearray(RefEncoder(C2S).frame(packet(0, b"data")))
    frame[-1] ^= 0x80
    with pytest.raises(obfs4.ProtocolError):
        server.receive(bytes(frame))
    with pytest.raises(obfs4.ProtocolError):
        server.receive(b"more")


def test_a_frame_under_the_next_counter_fails():
    client, server = open_session_pair()
    encoder = RefEncoder(C2S)
    encoder.counter = 2
    with pytest.raises(obfs4.ProtocolError):
        server.receive(encoder.frame(packet(0, b"data")))


@pytest.mark.parametrize("bad_length", [0, 15, 1447, 0xFFFF])
def test_bad_length_waits_for_a_random_length_then_fails(bad_length):
    client, server = make_client(), make_server()
    asked = []
    server.config.randbelow = lambda n: asked.append(n) or 100          # pretend L = 116
    connect(client, server)
    frame = RefEncoder(C2S).frame(packet(0, b"data"), length=bad_length)
    assert server.receive(frame[:2] + bytes(115)) == b""
    assert asked == [1446 - 16 + 1]
    with pytest.raises(obfs4.ProtocolError):
        server.receive(b"\x00")


def test_bad_length_with_the_real_randomness_is_open_for_15_bytes_and_closed_by_1446():
    client, server = open_session_pair()
    frame = RefEncoder(C2S).frame(packet(0, b"data"), length=2000)
    assert server.receive(frame[:2] + bytes(15)) == b""
    with pytest.raises(obfs4.ProtocolError):
        server.receive(bytes(1446 - 15))


@pytest.mark.parametrize("bad_packet", [b"", b"\x00\x00", b"\x00\x00\x10" + bytes(5),
                                        b"\x00\x00\x06" + bytes(5)],
                         ids=["empty", "2 bytes", "n beyond the packet", "n one past the end"])
def test_bad_packets_fail(bad_packet):
    client, server = open_session_pair()
    with pytest.raises(obfs4.ProtocolError):
        server.receive(RefEncoder(C2S).frame(bad_packet))


def deliver(side, pieces):
    """Feed ``pieces`` in turn as the relay would: (all the payload delivered, the
    error's reason or None). On ProtocolError the relay delivers its ``.data``, then stops."""
    out = []
    for piece in pieces:
        try:
            out.append(side.receive(piece))
        except obfs4.ProtocolError as exc:
            assert type(exc.data) is bytes
            return b"".join(out) + exc.data, str(exc)
    return b"".join(out), None


def two_reads(wire):
    return [[wire[:i], wire[i:]] for i in range(len(wire) + 1)]


def bad_tag(frame):
    return frame[:-1] + bytes([frame[-1] ^ 0x80])


# Each wire: good frames, then a bad one (and maybe more), with what must come out.
def wire_good_good_bad_tag():
    e = RefEncoder(C2S)
    wire = (e.frame(packet(0, b"first")) + e.frame(packet(0, b"second", 9))
            + bad_tag(e.frame(packet(0, b"lost"))) + e.frame(packet(0, b"after")))
    return wire, b"firstsecond", "frame 3: bad Poly1305 tag"


def wire_bad_packet_then_bad_tag():
    """Frame 2 authenticates but its packet is bad; frame 3 has a bad tag. In order,
    the packet is the first failure, whichever frames arrive in the same read."""
    e = RefEncoder(C2S)
    wire = e.frame(packet(0, b"ok")) + e.frame(b"\x00\x00\x10" + bytes(5)) + bad_tag(e.frame(packet(0, b"x")))
    return wire, b"ok", "packet payload length 16 exceeds the 5 bytes present"


def wire_bad_length():
    """A length out of range after a good frame: wait for the pretend length (here 116,
    see ``randbelow`` below), then fail; the good frame still comes out."""
    e = RefEncoder(C2S)
    return e.frame(packet(0, b"kept")) + e.frame(packet(0, b"data"), length=2000)[:2] + bytes(116), \
        b"kept", "frame length out of range (failed after the pretend length)"


def wire_short_packet():
    e = RefEncoder(C2S)
    return e.frame(packet(0, filler(1427))) + e.frame(b"\x00\x00"), filler(1427), \
        "packet of 2 bytes is shorter than its header"


WIRES = [wire_good_good_bad_tag, wire_bad_packet_then_bad_tag, wire_bad_length, wire_short_packet]


@pytest.mark.parametrize("make_wire", WIRES, ids=lambda f: f.__name__[5:])
def test_good_frames_before_a_bad_one_are_delivered_whatever_the_split(make_wire):
    """obfs4proxy relays what it decoded before tearing down: so do we, through the
    error's ``.data``. Whole, in two reads at every offset, and byte by byte: the same
    payload, then the same reason."""
    wire, payload, reason = make_wire()
    for pieces in [[wire]] + two_reads(wire) + [bytewise(wire)]:
        client, server = make_client(), make_server()
        server.config.randbelow = lambda n: 100                   # a pretend length of 116
        connect(client, server)
        assert deliver(server, pieces) == (payload, reason), [len(p) for p in pieces]
        assert not server.is_open
        with pytest.raises(obfs4.ProtocolError, match="already failed"):
            server.receive(b"more")


def test_the_client_delivers_frames_that_came_with_the_reply_before_a_bad_one(crypto_route):
    client, server = make_client(), make_server()
    assert server.receive(client.start()) == b""
    s2c = RefEncoder(S2C)
    s2c.frame(b"")                                                # the seed frame: counter 1
    reply = server.data_to_send() + s2c.frame(packet(0, b"early")) + bad_tag(s2c.frame(packet(0, b"x")))
    assert deliver(client, [reply]) == (b"early", "frame 3: bad Poly1305 tag")
    assert not client.is_open


def test_handshake_errors_carry_no_data():
    server = make_server()
    with pytest.raises(obfs4.ProtocolError) as failure:
        server.receive(bytes(8192))
    assert failure.value.data == b""


def test_the_decoder_hands_over_the_packets_before_a_bad_frame():
    e = RefEncoder(C2S)
    decoder = obfs4.FrameDecoder(C2S)
    with pytest.raises(obfs4.ProtocolError, match="frame 3") as failure:
        decoder.decode(e.frame(packet(0, b"a")) + e.frame(packet(0, b"b")) + bad_tag(e.frame(packet(0))))
    assert [bytes(p) for p in failure.value.packets] == [packet(0, b"a"), packet(0, b"b")]


def test_unknown_types_and_misplaced_seeds_are_ignored():
    client, server = open_session_pair()
    encoder = RefEncoder(C2S)
    wire = (encoder.frame(packet(7, b"unknown")) + encoder.frame(packet(1, bytes(24)))
            + encoder.frame(packet(0, b"a", 30)) + encoder.frame(packet(0)) + encoder.frame(packet(0, b"b")))
    assert server.receive(wire) == b"ab"
    server.config.sample = lambda dist: dist.values[0]
    assert len(server.send(b"z")) == table_values(DRBG_SEED)[0]      # the server kept its table
    # The client ignores a seed packet whose payload is not 24 bytes.
    s2c = RefEncoder(S2C)
    s2c.frame(b"")                                     # the seed frame already consumed counter 1
    client.config.sample = lambda dist: dist.values[0]
    assert client.receive(s2c.frame(packet(1, bytes(23))) + s2c.frame(packet(0, b"c"))) == b"c"
    assert len(client.send(b"z")) == table_values(DRBG_SEED)[0]      # still the bridge's table


def test_a_seed_packet_rebuilds_the_clients_tables():
    client, server = open_session_pair()
    s2c = RefEncoder(S2C)
    s2c.frame(b"")
    seed = bytes(range(24))
    assert client.receive(s2c.frame(packet(1, seed))) == b""
    for _ in range(20):
        total = len(client.send(filler(100)))
        assert total % 1448 in table_values(seed) or (total - 21) % 1448 in table_values(seed)


def test_send_refuses_to_wrap_the_nonce_counter():
    client, server = open_session_pair()
    client._encoder.counter = 2 ** 64 - 1
    client.config.sample = lambda dist: 2 + 16 + 3 + 10        # no padding frame
    client.send(b"last frame")
    with pytest.raises(obfs4.ProtocolError):
        client.send(b"one too many")


def test_decoder_refuses_to_wrap_the_nonce_counter():
    decoder = obfs4.FrameDecoder(C2S)
    encoder = RefEncoder(C2S)
    decoder.counter = encoder.counter = 2 ** 64 - 1
    assert decoder.decode(encoder.frame(packet(0, b"x"))) == [packet(0, b"x")]
    mask = int.from_bytes(encoder.drbg.next_block()[:2], "big")
    with pytest.raises(obfs4.ProtocolError, match="wrap"):
        decoder.decode(be16(16 ^ mask) + bytes(16))               # a valid length, counter 2^64


def test_the_decoder_draws_one_mask_per_frame_whatever_the_split():
    decoder = obfs4.FrameDecoder(C2S)
    encoder = RefEncoder(C2S)
    wire = b"".join(encoder.frame(packet(0, filler(n))) for n in (0, 1, 1427, 50))
    got = []
    for piece in (wire[:1], wire[1:2], wire[2:40], wire[40:1000], wire[1000:]):
        got += decoder.decode(piece)
    assert got == [packet(0, filler(n)) for n in (0, 1, 1427, 50)]


def test_a_batch_of_packets_is_the_frames_one_by_one(crypto_route):
    """encode_packets seals a whole write in one pass: the same bytes as the reference
    encoder's frames, one mask and one counter each, in order."""
    packets = [packet(0, filler(n)) for n in (1427, 0, 700, 1427, 5)] + [packet(0, b"", 1427)]
    reference = RefEncoder(C2S)
    encoder = obfs4.FrameEncoder(C2S)
    assert encoder.encode_packets(packets[:4]) == b"".join(reference.frame(p) for p in packets[:4])
    assert encoder.encode(packets[4]) == reference.frame(packets[4])
    assert encoder.encode_packets(packets[5:]) == reference.frame(packets[5])
    assert encoder.counter == reference.counter == 7


def test_a_batch_that_would_wrap_the_counter_seals_nothing():
    encoder, reference = obfs4.FrameEncoder(C2S), RefEncoder(C2S)
    encoder.counter = reference.counter = 2 ** 64 - 2
    with pytest.raises(obfs4.ProtocolError, match="wrap"):
        encoder.encode_packets([packet(0, b"a"), packet(0, b"b"), packet(0, b"c")])
    assert encoder.counter == 2 ** 64 - 2                      # untouched, masks not drawn
    assert encoder.encode_packets([packet(0, b"a"), packet(0, b"b")]) == \
        reference.frame(packet(0, b"a")) + reference.frame(packet(0, b"b"))


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 1427), min_size=1, max_size=40),
       points=st.lists(st.integers(0, 60000), max_size=10))
def test_the_decoder_opens_any_number_of_frames_in_any_split(sizes, points):
    """Masks are drawn ahead of use (about one per 1448 bytes in hand): whatever the
    split, every frame gets the next mask and the packets come out in order."""
    encoder = RefEncoder(C2S)
    wire = b"".join(encoder.frame(packet(0, filler(n, n))) for n in sizes)
    decoder, got = obfs4.FrameDecoder(C2S), []
    for piece in cuts(points)(wire):
        got += decoder.decode(piece)
    assert got == [packet(0, filler(n, n)) for n in sizes]


# --- Padding (§2.10) -------------------------------------------------------------------

@pytest.mark.parametrize("burst, target, padding", [
    (39, 70, [10]),            # the session: one 31-byte frame (10 zero bytes + 21)
    (38, 38, []),              # already there
    (100, 122, [1]),           # pad 22: one frame of 22 bytes
    (100, 121, [1427, 21]),    # pad 21: the two-frame quirk
    (100, 101, [1427, 1]),     # pad 1
    (1448, 0, []),             # tail 0, target 0
    (1000, 10, [437]),         # target < tail: (1448 - 1000) + 10 = 458 = 437 + 21
    (2896 + 5, 1448, [1422]),  # tail 5 -> pad 1443
])
def test_pad_burst_examples(burst, target, padding):
    assert obfs4.pad_burst(burst, target) == padding


@settings(max_examples=200, deadline=None)
@given(burst=st.integers(0, 100000), target=st.integers(0, 1448))
def test_pad_burst_brings_the_total_to_the_target(burst, target):
    padding = obfs4.pad_burst(burst, target)
    total = burst + sum(n + 21 for n in padding)
    assert all(0 <= n <= 1427 for n in padding)
    if len(padding) == 2:                  # 1..21 bytes short: 1448 + pad + 21 bytes
        assert padding[0] == 1427 and 1 <= padding[1] <= 21
        assert total % 1448 == (target + 21) % 1448
    else:
        assert total % 1448 == target % 1448


def table_values(seed, lo=0, hi=1448):
    return [lo + v for v in WeightedDist(seed, lo, hi).values]


def test_bursts_pad_to_the_bridges_table_with_the_real_sampler():
    client, server = make_client(), make_server()
    server.config.sample = obfs4.sample_table
    connect(client, server)
    values = table_values(DRBG_SEED)
    decoder = RefDecoder(S2C)
    decoder.frames(hx(S["server_seed_frame"]))
    for size in (1, 17, 1427, 1428, 3000, 32768) * 3:
        message = filler(size, size)
        wire = server.send(message)
        frames = decoder.frames(wire)
        assert all(n <= 1448 for n, _ in frames)
        assert b"".join(obfs4.parse_packet(p)[1] for _, p in frames) == message
        assert len(wire) % 1448 in values or (len(wire) - 21) % 1448 in values
        assert client.receive(wire) == message


def test_iat_mode_1_pieces_are_at_most_1448_bytes_with_table_delays():
    client = make_client(iat_mode=1)
    server = make_server(iat_mode=1)
    server.config.sample = obfs4.sample_table
    connect(client, server)
    assert server.paced and client.paced and not make_client().paced
    iat_case = PROBDIST["iat_tables"]["cases"][0]
    assert obfs4.iat_seed(hx(iat_case["derived_from_drbg_seed"])) == hx(iat_case["seed"])
    delays = {v * 100e-6 for v in table_values(obfs4.iat_seed(DRBG_SEED), 0, 100)}
    message = filler(10000)
    pieces = server.send_paced(message)
    assert [len(p) for p, _ in pieces[:-1]] == [1448] * (len(pieces) - 1)
    assert 0 < len(pieces[-1][0]) <= 1448
    assert all(delay in delays for _, delay in pieces)
    assert client.receive(b"".join(p for p, _ in pieces)) == message
    assert client.receive(server.send(b"send joins the pieces")) == b"send joins the pieces"


def test_iat_mode_2_pieces_are_table_values_and_never_0():
    client = make_client(iat_mode=2)
    server = make_server(iat_mode=2)
    connect(client, server)
    values = table_values(DRBG_SEED)
    draws = iter([0, 0] + values * 400)                  # 0 first: must be drawn again
    server.config.sample = lambda dist: next(draws) if dist.hi == 1448 else 7
    message = filler(20000)
    pieces = server.send_paced(message)
    assert all(len(p) in values for p, _ in pieces)
    assert all(delay == 7 * 100e-6 for _, delay in pieces)
    assert client.receive(b"".join(p for p, _ in pieces)) == message
    # The client side, after the seed packet, samples the server's table too.
    client.config.sample = obfs4.sample_table
    pieces = client.send_paced(b"tiny")
    assert pieces and all(len(p) in values for p, _ in pieces)
    assert server.receive(b"".join(p for p, _ in pieces)) == b"tiny"


def test_iat_mode_2_survives_a_table_of_only_zero():
    client, server = make_client(iat_mode=2), make_server(iat_mode=2)
    connect(client, server)

    class OnlyZero:
        values, hi = [0], 1448
    server._len_dist = OnlyZero()
    server.config.sample = lambda dist: 0 if dist.hi == 1448 else 1
    pieces = server.send_paced(b"data")
    assert all(len(p) > 0 for p, _ in pieces)
    assert client.receive(b"".join(p for p, _ in pieces)) == b"data"


# --- iat-mode 2: bounded work per write (stress-3 fuzz finding 1) ---------------------------

# Two bridge identities whose length tables are one looping value: 1469 mod v is 1..21
# bytes short of v, so after one two-frame quirk the old loop quirked forever.
LOOPING_SEEDS = {"1edefc61be562612cb72ffc52eaffa40897b1b9338f42f96": 7,
                 "c45ba75fe5c9715ef9dd6ea024b5b524af811a6ab9a91951": 211}
QUIRK_BYTES = 1448 + 21 + 21           # the most one quirk adds
ENDING_BYTES = 1448 + 20               # the most the last padding adds


class Budget:
    """A sampler that fails the test after ``draws`` draws instead of letting a loop
    that never ends (the old iat-mode 2 code) hang it and eat memory."""

    def __init__(self, sample, draws=200000):
        self.sample, self.left = sample, draws

    def __call__(self, dist):
        self.left -= 1
        assert self.left >= 0, "send_paced keeps sampling: it does not end"
        return self.sample(dist)


class Table:
    """A stand-in lenDist (lo = 0, hi = 1448) with these values."""

    def __init__(self, *values):
        self.values, self.hi = list(values), 1448


def frame_bytes(size):
    """The data frames of a write of ``size`` bytes: + 21 per frame of <= 1427 bytes."""
    return size + 21 * -(-size // 1427)


def old_send_paced(side, plaintext, max_quirks=200):
    """The iat-mode 2 loop before the bound, step for step (§6.4 as written): the
    pieces, or None once it took more than ``max_quirks`` quirks (it may never end)."""
    buffer = bytearray(side._encoder.encode_packets(side._data_packets(plaintext)))
    pos, pieces, quirks = 0, [], 0
    while pos < len(buffer):
        target = side._nonzero_length()
        if len(buffer) - pos < target:
            buffer += side._encoder.encode_packets(side._padding_packets(len(buffer) - pos, target))
            if len(buffer) - pos != target:
                quirks += 1
                if quirks > max_quirks:
                    return None
                continue
        pieces.append((bytes(buffer[pos:pos + target]), side._iat_delay()))
        pos += target
    return pieces


def paranoid_session_pair():
    """The session vector's pair in iat-mode 2, open: two of them are byte-identical."""
    client, server = make_client(iat_mode=2), make_server(iat_mode=2)
    connect(client, server)
    return client, server


def paced_pair(seed):
    """Our client and server, real configs, for a bridge with this drbg-seed in iat-mode 2."""
    bridge = obfs4.Identity(bytes(20), bytes(range(32)), hx(seed), 2)
    server_config = obfs4.ServerConfig(bridge)
    client_config = obfs4.Obfs4.client_config({"cert": bridge.cert, "iat-mode": "2"})
    for config in (server_config, client_config):
        config.sample = Budget(obfs4.sample_table)
    client, server = obfs4.Obfs4(True, client_config), obfs4.Obfs4(False, server_config)
    assert server.receive(client.start()) == b""
    assert client.receive(server.data_to_send()) == b""
    return client, server


@pytest.mark.parametrize("size", [5, 169, 400, 1427, 3000])
@pytest.mark.parametrize("seed", list(LOOPING_SEEDS))
def test_iat_mode_2_bridges_whose_table_looped_end_every_write(seed, size):
    """The repro: such a bridge as our server, a handshake, then send_paced(b"hello")
    never returned; our client against it did the same on its first write (it takes
    the bridge's table from the seed frame). Both ways now end, with table-sized pieces
    the peer decodes, and no quirk at all in a table that can only loop."""
    v = LOOPING_SEEDS[seed]
    client, server = paced_pair(seed)
    assert server.config.len_dist.values == [v] and obfs4.quirk_loops_forever(v)
    message = filler(size, size)
    for sender, receiver in ((server, client), (client, server)):
        pieces = sender.send_paced(message)
        assert {len(piece) for piece, _ in pieces} == {v}
        wire = b"".join(piece for piece, _ in pieces)
        assert len(wire) <= frame_bytes(size) + ENDING_BYTES
        assert receiver.receive(wire) == message
    assert client.send_paced(b"hello") and server.send_paced(b"hello")      # the fuzzer's write


def test_the_looping_lengths_are_the_110_of_the_finding():
    looping = [v for v in range(1, 1449) if obfs4.quirk_loops_forever(v)]
    assert len(looping) == 110
    assert looping[:12] == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14]           # 13 divides 1469
    assert {210, 211, 212, 735, 745} <= set(looping) and 13 not in looping and 1448 not in looping
    assert obfs4.paced_quirk_limit(Table(0, 7)) == 0                           # 0 is drawn again
    assert obfs4.paced_quirk_limit(Table(7, 14)) == obfs4.PACED_QUIRK_LIMIT == 32


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v=st.integers(1, 1448), size=st.integers(1, 6000))
def test_iat_mode_2_with_any_one_value_table_ends_and_the_peer_decodes(v, size):
    """Every one-value table: the write ends, its pieces are all v, its size is bounded,
    the peer decodes exactly the plaintext; and wherever the old loop ended, the bytes
    are the old ones (two identical sessions, the old loop on one)."""
    message = filler(size, v)
    (client, server), (_, old_server) = paranoid_session_pair(), paranoid_session_pair()
    for side in (server, old_server):
        side._len_dist = Table(v)
        side.config.sample = Budget(lambda dist: dist.values[0] if dist.hi == 1448 else 3)
    pieces = server.send_paced(message)
    wire = b"".join(piece for piece, _ in pieces)
    assert {len(piece) for piece, _ in pieces} == {v}
    assert len(wire) <= frame_bytes(size) + QUIRK_BYTES + ENDING_BYTES
    assert client.receive(wire) == message
    old = old_send_paced(old_server, message, max_quirks=2)     # one value: 0 or 1, or forever
    if old is not None:
        assert old == pieces
    else:
        assert obfs4.quirk_loops_forever(v)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=st.dictionaries(st.integers(1, 1448) | st.sampled_from([7, 14, 211, 245, 295, 740]),
                             st.integers(1, 1000), min_size=2, max_size=5),
       size=st.integers(1, 6000), seed=st.integers(0, 2 ** 32))
def test_iat_mode_2_with_several_lengths_is_the_old_loop_until_the_bound(table, size, seed):
    """Random weighted tables, often of looping lengths: the same bytes as the old loop
    whenever it ended within PACED_QUIRK_LIMIT quirks; always an end, table-sized
    pieces, bounded size, the plaintext at the peer."""
    values, weights = list(table), list(table.values())
    message = filler(size, seed % 256)
    runs = []
    for _ in range(2):
        client, server = paranoid_session_pair()
        rng = random.Random(seed)                 # both sessions draw the same lengths
        server._len_dist = Table(*values)
        server.config.sample = Budget(
            lambda dist, rng=rng: rng.choices(values, weights)[0] if dist.hi == 1448 else 3)
        runs.append((client, server))
    (client, server), (_, old_server) = runs
    pieces = server.send_paced(message)
    wire = b"".join(piece for piece, _ in pieces)
    assert {len(piece) for piece, _ in pieces} <= set(values)
    assert len(wire) <= frame_bytes(size) + obfs4.PACED_QUIRK_LIMIT * QUIRK_BYTES + ENDING_BYTES
    assert client.receive(wire) == message
    old = old_send_paced(old_server, message, max_quirks=obfs4.PACED_QUIRK_LIMIT)
    if old is not None:
        assert old == pieces


def test_a_table_of_looping_lengths_stops_at_the_bound():
    """{7, 14} loops forever too (every piece keeps 1469 mod 7 = 6): 32 quirks, then the
    ending, whatever the draws."""
    client, server = paranoid_session_pair()
    server._len_dist = Table(7, 14)
    draws = iter([7, 14] * 5000)
    server.config.sample = Budget(lambda dist: next(draws) if dist.hi == 1448 else 3)
    pieces = server.send_paced(b"hello")
    wire = b"".join(piece for piece, _ in pieces)
    assert {len(piece) for piece, _ in pieces} <= {7, 14}
    assert frame_bytes(5) + 32 * 1448 < len(wire) <= frame_bytes(5) + 32 * QUIRK_BYTES + ENDING_BYTES
    assert client.receive(wire) == b"hello"


def test_a_table_that_draws_only_zero_gets_its_largest_length_after_64_draws():
    """0 is drawn again (obfs4proxy panics on it); a sampler that keeps drawing 0 from a
    table that has other lengths gets the largest after ZERO_DRAW_LIMIT draws."""
    client, server = paranoid_session_pair()
    server._len_dist = Table(0, 40, 90)
    drawn = []
    server.config.sample = Budget(lambda dist: drawn.append(0) or 0 if dist.hi == 1448 else 3)
    pieces = server.send_paced(b"hello")
    assert {len(piece) for piece, _ in pieces} == {90}
    assert len(drawn) == obfs4.ZERO_DRAW_LIMIT * len(pieces) == 64
    assert client.receive(b"".join(piece for piece, _ in pieces)) == b"hello"


def quirk_chain_tail(lengths, quirks):
    """max over the states right after a quirk of P(at least ``quirks`` more quirks in this
    write), for a table {length: probability}: the exact Markov chain over the bytes left
    (what the docstring's figures come from, there over 20,000 random tables)."""
    items = sorted(lengths.items())
    starts = [t + 1469 for t, _ in items]
    step = []                                       # step[a][b]: next quirk is b, from a
    for start in starts:
        visits = [0.0] * (start + 1)
        visits[start] = 1.0
        for left in range(start, 0, -1):
            if visits[left]:
                for t, p in items:
                    if t <= left:
                        visits[left - t] += visits[left] * p
        step.append([p * sum(visits[max(1, t - 21):t]) for t, p in items])
    tail = [1.0] * len(items)
    for _ in range(quirks):
        tail = [sum(row[b] * tail[b] for b in range(len(items))) for row in step]
    return max(tail)


def test_the_worst_terminating_table_found_almost_never_reaches_the_bound():
    """The worst of 20,000 random bridge tables that end (two looping lengths, 245 and
    295): a write needs more than 32 quirks with a chance of about 1e-14; more than 16,
    about 1e-7. Figures quoted in Obfs4.send_paced."""
    dist = WeightedDist(hx("21a0d163d41af67e392fc5a89dee88c13788a50033a797d0"), 0, 1448)
    n = len(dist.values)
    mass = [0.0] * n
    for i in range(n):                               # the alias tables' exact probabilities
        mass[i] += dist.prob[i] / n
        mass[dist.alias[i]] += (1.0 - dist.prob[i]) / n
    lengths = dict(zip(dist.values, mass))
    assert sorted(lengths) == [245, 295] and round(lengths[245], 2) == 0.87
    assert 1e-15 < quirk_chain_tail(lengths, 32) < 2e-14
    assert 1e-8 < quirk_chain_tail(lengths, 16) < 2e-7
    assert quirk_chain_tail({7: 1.0}, 32) == 1.0                              # loops forever


# --- State files (§5) ------------------------------------------------------------------

def mode(path):
    return stat.S_IMODE(os.stat(str(path)).st_mode)


def test_identity_from_options_writes_obfs4proxys_exact_files(tmp_path):
    v = STATE["identity_from_options"]
    options = {"node-id": "11" * 20, "private-key": "21" * 32, "drbg-seed": "07" * 24}
    state_dir = tmp_path / "a" / "b" / "state"
    config, args = obfs4.Obfs4.server_config(options, state_dir)
    assert "cert=%s,iat-mode=%s" % (args["cert"], args["iat-mode"]) == v["smethod_args"]
    assert (state_dir / "obfs4_state.json").read_bytes() == v["obfs4_state.json"].encode()
    assert (state_dir / "obfs4_bridgeline.txt").read_bytes() == v["obfs4_bridgeline.txt"].encode()
    assert mode(state_dir) == mode(tmp_path / "a") == mode(tmp_path / "a" / "b") == 0o700
    assert mode(state_dir / "obfs4_state.json") == mode(state_dir / "obfs4_bridgeline.txt") == 0o600
    assert config.close_delay == v["close_delay_s_measured"]


def test_generated_identity_file_is_loaded_and_rewritten_identically(tmp_path):
    v = STATE["generated_identity"]
    (tmp_path / "obfs4_state.json").write_text(v["obfs4_state.json"])
    config, args = obfs4.Obfs4.server_config({}, tmp_path)
    smethod = [line for line in v["stdout"] if line.startswith("SMETHOD obfs4 ")][0]
    assert smethod.endswith(" ARGS:cert=%s,iat-mode=%s" % (args["cert"], args["iat-mode"]))
    assert (tmp_path / "obfs4_state.json").read_bytes() == v["obfs4_state.json"].encode()
    assert (tmp_path / "obfs4_bridgeline.txt").read_bytes() == v["obfs4_bridgeline.txt"].encode()
    assert config.close_delay == v["close_delay_s"]
    assert obfs4.Obfs4(False, config).failure_linger == 30 + v["close_delay_s"]
    # The live-checked length table of this bridge (its padded bursts were these mod 1448).
    case = [c for c in PROBDIST["length_tables"]["cases"] if v["obfs4_state.json"].count(c["seed"])][0]
    assert config.len_dist.values == case["values"] and config.iat_dist is None


def test_stale_public_key_is_preserved(tmp_path):
    v = STATE["stale_public_key_preserved"]
    path = tmp_path / "obfs4_state.json"
    path.write_text('{\n  "node-id": "%s",\n  "private-key": "%s",\n  "public-key": "deadbeef",\n'
                    '  "drbg-seed": "%s",\n  "iat-mode": 1,\n  "comment": "unknown field"\n}\n'
                    % ("55" * 20, "66" * 32, "77" * 24))
    os.chmod(str(path), 0o644)
    config, args = obfs4.Obfs4.server_config({}, tmp_path)
    assert path.read_bytes() == v["rewritten_obfs4_state.json"].encode()
    assert "cert=%s,iat-mode=%s" % (args["cert"], args["iat-mode"]) == v["smethod_args"]
    assert mode(path) == 0o644
    assert config.iat_mode == 1 and config.iat_dist is not None


def test_state_field_names_match_case_insensitively_as_in_go(tmp_path):
    v = STATE["identity_from_options"]
    (tmp_path / "obfs4_state.json").write_text(
        '{"NODE-ID":"%s","Private-Key":"%s","drbg-SEED":"%s","public-key":null}'
        % ("11" * 20, "21" * 32, "07" * 24))
    config, args = obfs4.Obfs4.server_config({}, tmp_path)
    assert "cert=%s,iat-mode=%s" % (args["cert"], args["iat-mode"]) == v["smethod_args"]
    assert (tmp_path / "obfs4_state.json").read_bytes() == v["obfs4_state.json"].encode()


def test_fresh_state_from_the_csprng_and_reuse_keeps_the_cert(tmp_path):
    node_id, key_input, seed = filler(20, 1), filler(32, 2), filler(24, 3)
    identity = obfs4_state.load_or_create_state(tmp_path / "s", {}, Script(node_id, key_input, seed))[0]
    private_key = hashlib.sha512(key_input).digest()[:32]           # stored unclamped
    public_key = x25519(private_key, (9).to_bytes(32, "little"))
    expected = ('{"node-id":"%s","private-key":"%s","public-key":"%s","drbg-seed":"%s","iat-mode":0}'
                % (node_id.hex(), private_key.hex(), public_key.hex(), seed.hex())).encode()
    assert (tmp_path / "s" / "obfs4_state.json").read_bytes() == expected
    assert identity.cert == obfs4_state.encode_cert(node_id, public_key)
    assert mode(tmp_path / "s" / "obfs4_state.json") == 0o600 and mode(tmp_path / "s") == 0o700
    again = obfs4_state.load_or_create_state(tmp_path / "s", {}, Script())[0]   # draws nothing
    assert again.cert == identity.cert
    assert (tmp_path / "s" / "obfs4_state.json").read_bytes() == expected
    # iat-mode from the options overrides and is written back.
    third = obfs4_state.load_or_create_state(tmp_path / "s", {"iat-mode": "2"}, Script())[0]
    assert third.iat_mode == 2 and third.cert == identity.cert
    assert (tmp_path / "s" / "obfs4_state.json").read_bytes() == expected.replace(b':0}', b':2}')
    assert (tmp_path / "s" / "obfs4_bridgeline.txt").read_text().endswith(" iat-mode=2\n")


@pytest.mark.parametrize("content", [b"[" * 2000, b"#(\x13" + b"[" * 2000, b'{"node-id":' + b"[" * 100000],
                         ids=["2000 levels", "the fuzzer's input", "100000 levels in an object"])
def test_a_deeply_nested_state_file_is_a_value_error(tmp_path, content):
    """It raised RecursionError: the server died with a traceback, managed mode said
    nothing (no SMETHOD-ERROR) and unmask crashed. The file is left as it was."""
    (tmp_path / "obfs4_state.json").write_bytes(content)
    with pytest.raises(ValueError, match="failed to load statefile"):
        obfs4.Obfs4.server_config({}, tmp_path)
    with pytest.raises(ValueError, match="failed to load statefile"):
        obfs4_state.read_identity(tmp_path)
    assert (tmp_path / "obfs4_state.json").read_bytes() == content
    assert not (tmp_path / "obfs4_bridgeline.txt").exists()


GOOD_STATE = '{"node-id":"%s","private-key":"%s","public-key":"","drbg-seed":"%s","iat-mode":%%s}' % (
    "11" * 20, "21" * 32, "07" * 24)


@pytest.mark.parametrize("content, iat_mode", [
    (GOOD_STATE % 0, 0),
    (GOOD_STATE % 2, 2),
    (GOOD_STATE % "null", 0),                                    # null is Go's zero value
    (GOOD_STATE.replace(',"iat-mode":%s', ""), 0),               # absent too
    (GOOD_STATE.replace('"node-id"', '"NODE-ID"').replace('"drbg-seed"', '"Drbg-Seed"') % 1, 1),
    (GOOD_STATE.replace("11" * 20, "AB" * 20) % 0, 0),           # hex in either case
    (GOOD_STATE.replace('"public-key":""', '"public-key":"junk","extra":[1]') % 0, 0),
], ids=["iat 0", "iat 2", "iat null", "iat absent", "names in any case", "upper-case hex",
        "public-key and unknown names ignored"])
def test_read_identity_reads_what_the_server_reads_and_writes_nothing(tmp_path, content, iat_mode):
    path = tmp_path / "obfs4_state.json"
    path.write_text(content)
    os.utime(str(path), (1000000000, 1000000000))
    identity = obfs4_state.read_identity(tmp_path)
    assert identity.iat_mode == iat_mode
    assert identity.private_key == hx("21" * 32) and identity.drbg_seed == hx("07" * 24)
    assert path.read_text() == content and os.stat(str(path)).st_mtime == 1000000000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["obfs4_state.json"]
    assert obfs4.Obfs4.server_config({}, tmp_path)[0].identity.cert == identity.cert   # the same


@pytest.mark.parametrize("content", [
    GOOD_STATE.replace("11" * 20, " " + "11" * 20) % 0,           # bytes.fromhex took spaces
    GOOD_STATE.replace("11" * 20, "11" * 19) % 0,
    GOOD_STATE.replace("21" * 32, "2g" * 32) % 0,
    GOOD_STATE % 3,
    GOOD_STATE % '"1"',
    GOOD_STATE % "true",
    GOOD_STATE % "1.0",
    GOOD_STATE.replace('"drbg-seed":"%s",' % ("07" * 24), "") % 0,
    "[]", '"text"', "", "\ufeff" + GOOD_STATE % 0,
], ids=["hex with a space", "short node-id", "not hex", "iat 3", "iat a string", "iat true",
        "iat 1.0", "no drbg-seed", "an array", "a string", "empty", "a BOM"])
def test_read_identity_refuses_what_the_server_refuses(tmp_path, content):
    (tmp_path / "obfs4_state.json").write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=r"failed to load statefile '.*obfs4_state\.json'"):
        obfs4_state.read_identity(tmp_path)
    with pytest.raises(ValueError):
        obfs4.Obfs4.server_config({}, tmp_path)


def test_read_identity_of_a_missing_or_unreadable_file_is_an_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        obfs4_state.read_identity(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()                   # nothing created
    (tmp_path / "obfs4_state.json").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="failed to load statefile"):
        obfs4_state.read_identity(tmp_path)                             # not UTF-8: not a state


@pytest.mark.parametrize("content", [
    (GOOD_STATE % 0).encode().replace(b'"public-key":""', b'"public-key":"00\xcb00"'),
    (GOOD_STATE % 0).encode().replace(b'"drbg-seed"', "\"drbg-\u017feed\"".encode()),
    (GOOD_STATE % 0).encode().replace(b'"private-key"', "\"private-\u212aey\"".encode()),
], ids=["not UTF-8 in public-key", "long s in drbg-seed", "Kelvin sign in private-key"])
def test_a_state_file_obfs4proxy_accepts_is_accepted_with_the_same_cert(tmp_path, content):
    """Go's json reads a byte that is not UTF-8 as U+FFFD, and matches names by simple
    case folding (U+017F folds to s, U+212A to k): obfs4proxy 0.0.14 accepts these
    files and announces the cert of the clean file; so do we."""
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "obfs4_state.json").write_text(GOOD_STATE % 0)
    (tmp_path / "obfs4_state.json").write_bytes(content)
    assert obfs4_state.read_identity(tmp_path).cert == obfs4_state.read_identity(tmp_path / "clean").cert


@pytest.mark.parametrize("content", [
    (GOOD_STATE % 0).encode().replace(b'{"node-id"', b'{\xcb"node-id"'),          # not in a string
    (GOOD_STATE % 0).encode().replace(b'"drbg-seed"', "\"drbg-\u00dfeed\"".encode()),  # sharp s: no fold
], ids=["not UTF-8 between tokens", "sharp s"])
def test_a_state_file_obfs4proxy_refuses_is_refused(tmp_path, content):
    (tmp_path / "obfs4_state.json").write_bytes(content)
    with pytest.raises(ValueError, match="failed to load statefile"):
        obfs4_state.read_identity(tmp_path)


def test_an_unchanged_state_file_is_not_written_again(tmp_path):
    """Each start rewrote both files in place: a full disk or a crash at that moment
    left the bridge's private key file empty. Unchanged bytes are now left alone."""
    obfs4_state.load_or_create_state(tmp_path, {})
    files = [tmp_path / "obfs4_state.json", tmp_path / "obfs4_bridgeline.txt"]
    for path in files:
        os.utime(str(path), ns=(10 ** 18, 10 ** 18))
    before = [os.stat(str(path)) for path in files]
    obfs4_state.load_or_create_state(tmp_path, {})
    after = [os.stat(str(path)) for path in files]
    assert [(st.st_ino, st.st_mtime_ns) for st in after] == [(st.st_ino, st.st_mtime_ns) for st in before]


def test_a_changed_state_file_is_replaced_whole_keeping_its_mode(tmp_path):
    obfs4_state.load_or_create_state(tmp_path, {})
    path = tmp_path / "obfs4_state.json"
    path.chmod(0o640)
    inode = os.stat(str(path)).st_ino
    identity, notes = obfs4_state.load_or_create_state(tmp_path, {"iat-mode": "1"})
    assert os.stat(str(path)).st_ino != inode        # a new file renamed over the old one
    assert mode(path) == 0o640 and obfs4_state.read_identity(tmp_path).iat_mode == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["obfs4_bridgeline.txt", "obfs4_state.json"]


def test_a_failed_write_leaves_the_old_state_file_whole(tmp_path, monkeypatch):
    """ENOSPC (a disk filled by logs) while the state is written: the old identity
    stays on disk, and no temporary file is left behind."""
    obfs4_state.load_or_create_state(tmp_path, {})
    path = tmp_path / "obfs4_state.json"
    old = path.read_bytes()

    def full_disk(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(obfs4_state.os, "fsync", full_disk)
    with pytest.raises(ValueError, match="No space left on device"):
        obfs4_state.load_or_create_state(tmp_path, {"iat-mode": "2"})
    monkeypatch.undo()
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["obfs4_bridgeline.txt", "obfs4_state.json"]


IDENTITY_OPTIONS = {"node-id": "11" * 20, "private-key": "21" * 32, "drbg-seed": "07" * 24}


@pytest.mark.parametrize("before, options, replaced", [
    (None, IDENTITY_OPTIONS, False),                              # nothing to replace
    ("other", IDENTITY_OPTIONS, True),                            # another identity
    ("not json", IDENTITY_OPTIONS, True),                         # an unreadable file
    ("same", IDENTITY_OPTIONS, False),                            # the one a last run wrote
    ("same", dict(IDENTITY_OPTIONS, **{"iat-mode": "1"}), True),  # same keys, other iat-mode
    ("other", {}, False),                                         # no identity options: loaded
], ids=["no file", "another identity", "unreadable", "the same", "another iat-mode", "no options"])
def test_identity_options_that_replace_a_state_file_say_so(tmp_path, before, options, replaced):
    """As obfs4proxy, explicit node-id, private-key and drbg-seed replace the state file,
    even an unreadable one; unlike it, the config's notes say so (the core logs them)."""
    path = tmp_path / "obfs4_state.json"
    if before == "other":
        path.write_text(GOOD_STATE.replace("11" * 20, "55" * 20) % 0)
    elif before == "same":
        obfs4.Obfs4.server_config(IDENTITY_OPTIONS, tmp_path)
    elif before is not None:
        path.write_text(before)
    if path.exists():
        path.chmod(0o600)      # as the bridge makes it: an open file adds a warning of its own
    config, _ = obfs4.Obfs4.server_config(options, tmp_path)
    if replaced:
        assert config.notes == ("node-id, private-key and drbg-seed replaced the identity in %s" % path,)
    else:
        assert config.notes == ()
    assert obfs4_state.read_identity(tmp_path).cert == config.identity.cert    # what is on disk now


def parse_pt_options(text):
    """'obfs4:k=v;obfs4:k=v' -> {k: v} (the vector's TOR_PT_SERVER_TRANSPORT_OPTIONS)."""
    return dict(item.split(":", 1)[1].split("=", 1) for item in text.split(";"))


@pytest.mark.parametrize("case", STATE["option_errors"], ids=lambda c: c["options"])
def test_option_errors_as_obfs4proxy_reports_them(tmp_path, case):
    options = parse_pt_options(case["options"].replace("<40 hex>", "ab" * 20))
    if isinstance(case["stdout"], str):
        # obfs4proxy ignores unknown keys (a normal start); we refuse them, naming them.
        with pytest.raises(ValueError, match=r"^unknown obfs4 argument\(s\): foo \(an obfs4 server takes "
                                             r"node-id, private-key, drbg-seed, iat-mode\)$"):
            obfs4.Obfs4.server_config(options, tmp_path)
        assert list(tmp_path.iterdir()) == []               # refused before any file is touched
        return
    message = case["stdout"][1][len("SMETHOD-ERROR obfs4 "):]
    with pytest.raises(ValueError) as error:
        obfs4.Obfs4.server_config(options, tmp_path)
    assert str(error.value) == message
    assert not (tmp_path / "obfs4_bridgeline.txt").exists()
    if "files" in case:
        created = case["files"].startswith("obfs4_state.json created")
        assert (tmp_path / "obfs4_state.json").exists() == created


@pytest.mark.parametrize("options, content", [
    ({"node-id": "11" * 20, "private-key": "21" * 32}, None),
    ({"node-id": "11" * 19, "private-key": "21" * 32, "drbg-seed": "07" * 24}, None),
    ({"node-id": "1" * 40, "private-key": "zz" * 32, "drbg-seed": "07" * 24}, None),
    ({"iat-mode": "-1"}, None),
    ({}, "not json"),
    ({}, '{"node-id": 5}'),
    ({}, '{"iat-mode": 3, "node-id": "%s", "private-key": "%s", "drbg-seed": "%s"}'
     % ("11" * 20, "21" * 32, "07" * 24)),
])
def test_bad_server_options_and_state_are_value_errors(tmp_path, options, content):
    if content is not None:
        (tmp_path / "obfs4_state.json").write_text(content)
    with pytest.raises(ValueError):
        obfs4.Obfs4.server_config(options, tmp_path)


def test_server_config_needs_a_state_dir():
    with pytest.raises(ValueError, match=r"obfs4 needs a state directory \(--state-dir\)"):
        obfs4.Obfs4.server_config({}, None)


def test_state_json_escapes_like_go():
    state = {"node-id": "a", "private-key": "b", "public-key": "<&>\u2028é", "drbg-seed": "c", "iat-mode": 1}
    assert obfs4_state.state_json(state) == (
        '{"node-id":"a","private-key":"b","public-key":"\\u003c\\u0026\\u003e\\u2028é",'
        '"drbg-seed":"c","iat-mode":1}').encode()


# --- Client arguments (§5) -------------------------------------------------------------

def test_client_socks_args_vectors():
    cases = {c["uname"]: c["result"] for c in STATE["client_socks_args"]}
    assert cases["cert=<70 chars>;iat-mode=0"].startswith("05 00")
    assert obfs4.parse_client_args({"cert": CERT, "iat-mode": "0"}) == (NODE_ID, B, 0)
    assert cases["node-id=<40 hex>;public-key=<64 hex>;iat-mode=0"].startswith("success")
    assert obfs4.parse_client_args({"node-id": NODE_ID.hex(), "public-key": B.hex().upper(),
                                    "iat-mode": "2"}) == (NODE_ID, B, 2)
    assert "05 01" in cases["cert=<70 chars>"]
    with pytest.raises(ValueError, match=r"^no iat-mode= given \(add iat-mode=0, as in the bridge line\)$"):
        obfs4.Obfs4.client_config({"cert": CERT})
    assert "05 01" in cases["cert=AAAA;iat-mode=0"]
    with pytest.raises(ValueError):
        obfs4.Obfs4.client_config({"cert": "AAAA", "iat-mode": "0"})


@pytest.mark.parametrize("options", [
    {"cert": CERT, "iat-mode": "3"},
    {"cert": CERT, "iat-mode": "x"},
    {"cert": CERT, "iat-mode": ""},
    {"iat-mode": "0"},
    {"node-id": NODE_ID.hex(), "iat-mode": "0"},
    {"node-id": NODE_ID.hex()[:-2], "public-key": B.hex(), "iat-mode": "0"},
    {"node-id": NODE_ID.hex(), "public-key": B.hex() + "00", "iat-mode": "0"},
    {"node-id": NODE_ID.hex(), "public-key": " " + B.hex()[1:], "iat-mode": "0"},
])
def test_bad_client_args_are_value_errors(options):
    with pytest.raises(ValueError):
        obfs4.Obfs4.client_config(options)


@pytest.mark.parametrize("options, message", [
    ({"iat-mode": "0"},
     "no cert= given (the bridge line's cert=...; for SOCKS, pass it as the username)"),
    ({}, "no cert= given (the bridge line's cert=...; for SOCKS, pass it as the username)"),
    ({"cert": CERT}, "no iat-mode= given (add iat-mode=0, as in the bridge line)"),
    ({"node-id": NODE_ID.hex(), "iat-mode": "0"},
     "node-id= without public-key= (or give the bridge line's cert=...)"),
    ({"public-key": B.hex(), "iat-mode": "0"},
     "public-key= without node-id= (or give the bridge line's cert=...)"),
    ({"cert": CERT, "iat-mode": "0", "iat_mode": "1", "extra": "x"},
     "unknown obfs4 argument(s): extra, iat_mode (an obfs4 client takes cert, iat-mode, node-id, "
     "public-key)"),
    ({"cert": CERT, "iat-mode": "0", "shared-secret": "x"},
     "unknown obfs4 argument(s): shared-secret (an obfs4 client takes cert, iat-mode, node-id, "
     "public-key)"),
], ids=["no cert", "nothing", "no iat-mode", "node-id alone", "public-key alone", "typo", "obfs2's"])
def test_client_arg_errors_say_what_the_user_wrote(options, message):
    """Never "missing argument 'node-id'", a name no user wrote: a bridge line has cert=."""
    with pytest.raises(ValueError) as error:
        obfs4.Obfs4.client_config(options)
    assert str(error.value) == message


@pytest.mark.parametrize("text, message", [
    ("1" * 5000, "malformed iat-mode '%s'" % ("1" * 5000)),          # was int()'s digit limit
    ("9223372036854775808", "malformed iat-mode '9223372036854775808'"),  # past Go's int64
    ("-9223372036854775809", "malformed iat-mode '-9223372036854775809'"),
    ("9223372036854775807", "invalid iat-mode '9223372036854775807'"),  # an int64: out of range
    ("0" * 5000 + "2", 2),                                          # Atoi takes leading zeros
    ("+1", 1), ("-0", 0),
    ("\u0662", "malformed iat-mode '\u0662'"),                        # Arabic-Indic 2
])
def test_iat_mode_is_parsed_as_go_atoi_parses_it(text, message):
    if isinstance(message, int):
        assert obfs4.parse_iat_mode(text) == message
        return
    with pytest.raises(ValueError) as error:
        obfs4.parse_iat_mode(text)
    assert str(error.value) == message


def test_unknown_server_args_are_refused_before_the_state_is_touched(tmp_path):
    with pytest.raises(ValueError, match=r"unknown obfs4 argument\(s\): cert, iat_mode \(an obfs4 server"):
        obfs4.Obfs4.server_config({"iat_mode": "1", "cert": "x"}, tmp_path / "state")
    assert not (tmp_path / "state").exists()


# --- The replay filter -----------------------------------------------------------------

def test_replay_filter_ttl_cap_and_clock_going_back():
    f = obfs4.ReplayFilter(ttl=100, max_entries=3)
    assert not f.test_and_set(1000, b"a")
    assert f.test_and_set(1050, b"a")                      # first sighting is not refreshed
    assert not f.test_and_set(1101, b"a") and len(f) == 1  # 101 s later: expired
    assert not f.test_and_set(1102, b"b") and not f.test_and_set(1102, b"c") and len(f) == 3
    assert not f.test_and_set(1103, b"d") and len(f) == 3  # full: the oldest ("a") went first
    assert not f.test_and_set(1103, b"a")                  # so "a" is new again ("b" went)
    assert f.test_and_set(1103, b"a") and len(f) == 2      # full again: "c" went, "a" is seen
    assert not f.test_and_set(500, b"a") and len(f) == 1   # the clock went back: emptied


def test_replay_filter_is_thread_safe():
    f = obfs4.ReplayFilter()
    results = []

    def insert():
        results.extend(f.test_and_set(0, b"%d" % (i % 50)) for i in range(500))
    threads = [threading.Thread(target=insert) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(False) == 50 and len(f) == 50
