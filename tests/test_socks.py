"""Tests for socks.py: SOCKS4/4a/5 server side, sans-IO.

Every conversation is a list of hex vectors annotated field by field, written
from RFC 1928, RFC 1929, the SOCKS4/4a documents and pt-spec 3.5, and each is
fed three ways: one message per ``receive`` (as tor does), one byte at a time,
and pipelined (every message plus application data in one chunk, and in
seeded random splits).
"""

import random
from collections import namedtuple

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import socks


def h(text):
    """Hex bytes; spaces separate fields."""
    return bytes.fromhex(text)


DATA = b"\x16\x03\x01 pipelined application data"

# A conversation: (client message, exact server answer) pairs, then the request.
Vector = namedtuple("Vector", "name steps version host port args")

# A refused conversation: good exchanges first, then the bad message, the exact
# reply sent before closing, and ``at``: how many bytes of the bad message it
# takes to decide (None: the whole message).
Refusal = namedtuple("Refusal", "name steps bad reply at")

GREETING_NO_AUTH = (h("05 01 00"),   # VER=05 NMETHODS=01 METHODS=[00 no auth]
                    h("05 00"))      # VER=05 METHOD=00
GREETING_USERPASS = (h("05 01 02"),  # VER=05 NMETHODS=01 METHODS=[02 username/password]
                     h("05 02"))     # VER=05 METHOD=02
AUTH_OK = h("01 00")                 # VER=01 STATUS=00 (success)
AUTH_FAILED = h("01 01")             # VER=01 STATUS=01 (failure; server closes)
V5_FAILURE = "00 01 00000000 0000"   # RSV=00 ATYP=01 BND.ADDR=0.0.0.0 BND.PORT=0
V4_REJECTED = h("00 5b 0000 00000000")   # VN=00 CD=5B DSTPORT=0 DSTIP=0.0.0.0


def userpass(uname, passwd):
    """VER=01 ULEN UNAME PLEN PASSWD, lengths from the fields (for long fields)."""
    return bytes([1, len(uname)]) + uname + bytes([len(passwd)]) + passwd


SPILL_VALUE = "x" * 240 + ";" + "y" * 50
SPILL_ARGS = b"shared-secret=" + b"x" * 240 + b"\\;" + b"y" * 50   # 306 bytes encoded
assert len(SPILL_ARGS[:255]) == 255 and SPILL_ARGS[254:255] == b"\\"  # the escape straddles

VECTORS = [
    Vector("socks4-ipv4", [
        (h("04 01 0050 c0000201 00"),   # VN=04 CD=01 DSTPORT=80 DSTIP=192.0.2.1 USERID="" NUL
         b"")], 4, "192.0.2.1", 80, {}),
    Vector("socks4-userid-args", [
        (h("04 01 01bb 7f000001")       # VN=04 CD=01 DSTPORT=443 DSTIP=127.0.0.1
         + b"shared-secret=foo;k=v\\;w"  # USERID: pt-spec 3.5 args, "\;" escapes ";"
         + h("00"),                      # NUL
         b"")], 4, "127.0.0.1", 443, {"shared-secret": "foo", "k": "v;w"}),
    Vector("socks4-dstip-0.0.0.0-is-not-4a", [
        (h("04 01 0050 00000000 00"),   # VN=04 CD=01 DSTPORT=80 DSTIP=0.0.0.0 (x=0: plain v4)
         b"")], 4, "0.0.0.0", 80, {}),
    Vector("socks4a-hostname", [
        (h("04 01 0050 00000001 00")    # VN=04 CD=01 DSTPORT=80 DSTIP=0.0.0.1 (4a) USERID="" NUL
         + b"example.com" + h("00"),     # HOST="example.com" NUL
         b"")], 4, "example.com", 80, {}),
    Vector("socks4a-hostname-and-args", [
        (h("04 01 1f90 000000ff")       # VN=04 CD=01 DSTPORT=8080 DSTIP=0.0.0.255 (4a)
         + b"shared-secret=a\\=b" + h("00")  # USERID="shared-secret=a\=b" NUL
         + b"bridge.example" + h("00"),  # HOST="bridge.example" NUL
         b"")], 4, "bridge.example", 8080, {"shared-secret": "a=b"}),
    Vector("socks5-no-auth-ipv4", [
        GREETING_NO_AUTH,
        (h("05 01 00 01 c0000201 0050"),  # VER=05 CMD=01 RSV=00 ATYP=01 DST=192.0.2.1 PORT=80
         b"")], 5, "192.0.2.1", 80, {}),
    Vector("socks5-no-auth-ipv6", [
        GREETING_NO_AUTH,
        (h("05 01 00 04"                  # VER=05 CMD=01 RSV=00 ATYP=04
           " 20010db8000000000000000000000001"  # DST.ADDR=2001:db8::1
           " 01bb"),                      # DST.PORT=443
         b"")], 5, "2001:db8::1", 443, {}),
    Vector("socks5-no-auth-domain", [
        (h("05 03 01 80 00"),             # VER=05 NMETHODS=03 METHODS=[01 GSSAPI, 80 private, 00]
         h("05 00")),                     # VER=05 METHOD=00
        (h("05 01 00 03 0b")              # VER=05 CMD=01 RSV=00 ATYP=03 LEN=11
         + b"example.com" + h("0050"),    # DST.ADDR="example.com" DST.PORT=80
         b"")], 5, "example.com", 80, {}),
    Vector("socks5-tor-0.4.9-shared-secret", [
        (h("05 02 00 02"),                # VER=05 NMETHODS=02 METHODS=[00, 02]
         h("05 02")),                     # VER=05 METHOD=02: offered, so chosen
        (h("01 11") + b"shared-secret=foo"  # VER=01 ULEN=17 UNAME="shared-secret=foo"
         + h("01 00"),                    # PLEN=01 PASSWD=NUL (placeholder, not an argument)
         AUTH_OK),
        (h("05 01 00 01 7f000001 4a3b"),  # VER=05 CMD=01 RSV=00 ATYP=01 DST=127.0.0.1 PORT=19003
         b"")], 5, "127.0.0.1", 19003, {"shared-secret": "foo"}),
    Vector("socks5-userpass-escapes", [
        GREETING_USERPASS,
        (h("01 18") + b"shared-secret=a\\;b\\=c\\\\d"  # VER=01 ULEN=24 UNAME with \; \= \\
         + h("01 00"),                    # PLEN=01 PASSWD=NUL
         AUTH_OK),
        (h("05 01 00 01 c0000201 0050"), b"")],
        5, "192.0.2.1", 80, {"shared-secret": "a;b=c\\d"}),
    Vector("socks5-userpass-tor-leaves-=-unescaped", [
        GREETING_USERPASS,
        (h("01 14") + b"shared-secret=a=b;c=" + h("01 00"),  # ULEN=20 UNAME; PLEN=01 PASSWD=NUL
         AUTH_OK),
        (h("05 01 00 01 c0000201 0050"), b"")],
        5, "192.0.2.1", 80, {"shared-secret": "a=b", "c": ""}),
    Vector("socks5-userpass-spills-into-passwd", [
        GREETING_USERPASS,
        # VER=01 ULEN=ff UNAME=first 255 bytes (ends in the "\" of "\;")
        # PLEN=33 PASSWD=";" + "y"*50 (the rest)
        (h("01 ff") + SPILL_ARGS[:255] + h("33") + SPILL_ARGS[255:], AUTH_OK),
        (h("05 01 00 03 04") + b"host" + h("0050"), b"")],  # ATYP=03 LEN=4 "host" PORT=80
        5, "host", 80, {"shared-secret": SPILL_VALUE}),
    Vector("socks5-userpass-passwd-carries-a-second-argument", [
        GREETING_USERPASS,
        (h("01 08") + b"a=1;b=2;"          # VER=01 ULEN=8 UNAME="a=1;b=2;"
         + h("03") + b"c=3",               # PLEN=3 PASSWD="c=3": not a placeholder
         AUTH_OK),
        (h("05 01 00 01 c0000201 0050"), b"")],
        5, "192.0.2.1", 80, {"a": "1", "b": "2", "c": "3"}),
]

REFUSALS = [
    Refusal("unknown-version", [],
            b"GET / HTTP/1.1\r\n",        # first byte 47: not SOCKS, no reply at all
            b"", 1),
    Refusal("no-acceptable-method", [],
            h("05 01 01"),                # VER=05 NMETHODS=01 METHODS=[01 GSSAPI]
            h("05 ff"), None),            # VER=05 METHOD=FF (no acceptable methods)
    Refusal("no-methods-at-all", [],
            h("05 00"),                   # VER=05 NMETHODS=00
            h("05 ff"), None),
    Refusal("socks5-bind", [GREETING_NO_AUTH],
            h("05 02 00 01 c0000201 0050"),  # VER=05 CMD=02 (BIND) ATYP=01 192.0.2.1:80
            h("05 07" + V5_FAILURE), None),  # REP=07 command not supported
    Refusal("socks5-udp-associate", [GREETING_NO_AUTH],
            h("05 03 00 01 00000000 0000"),  # VER=05 CMD=03 (UDP ASSOCIATE) ATYP=01 0.0.0.0:0
            h("05 07" + V5_FAILURE), None),
    Refusal("socks5-bad-address-type", [GREETING_NO_AUTH],
            h("05 01 00 05"),             # VER=05 CMD=01 RSV=00 ATYP=05 (no such type)
            h("05 08" + V5_FAILURE), 4),  # REP=08 address type not supported, at once
    Refusal("socks5-request-bad-version", [GREETING_NO_AUTH],
            h("04 01 00 01 c0000201 0050"),  # VER=04 inside a SOCKS5 negotiation
            h("05 01" + V5_FAILURE), 4),
    Refusal("socks5-empty-domain", [GREETING_NO_AUTH],
            h("05 01 00 03 00 0050"),     # ATYP=03 LEN=00 PORT=80
            h("05 01" + V5_FAILURE), None),
    Refusal("socks4-bind", [],
            h("04 02 0050 c0000201 00"),  # VN=04 CD=02 (BIND) DSTPORT=80 DSTIP=192.0.2.1 USERID=""
            V4_REJECTED, None),
    Refusal("socks4-userid-too-long", [],
            h("04 01 0050 c0000201") + b"a" * (socks.MAX_SOCKS4_FIELD + 1),  # no NUL in sight
            V4_REJECTED, 8 + socks.MAX_SOCKS4_FIELD + 1),
    Refusal("socks4a-host-too-long", [],
            h("04 01 0050 00000001 00") + b"h" * (socks.MAX_SOCKS4_FIELD + 1),
            V4_REJECTED, 9 + socks.MAX_SOCKS4_FIELD + 1),
    Refusal("socks4a-empty-host", [],
            h("04 01 0050 00000001 00 00"),  # DSTIP=0.0.0.1 USERID="" HOST=""
            V4_REJECTED, None),
    Refusal("socks4-userid-not-args", [],
            h("04 01 0050 c0000201") + b"alice" + h("00"),  # USERID="alice": no "="
            V4_REJECTED, None),
    Refusal("socks4-userid-dangling-backslash", [],
            h("04 01 0050 c0000201") + b"k=v\\" + h("00"),
            V4_REJECTED, None),
    Refusal("socks5-credentials-not-args", [GREETING_USERPASS],
            h("01 05") + b"alice" + h("06") + b"secret",  # ULEN=5 "alice" PLEN=6 "secret"
            AUTH_FAILED, None),
    Refusal("socks5-args-empty-key", [GREETING_USERPASS],
            h("01 04") + b"=foo" + h("01 00"),
            AUTH_FAILED, None),
    Refusal("socks5-args-not-utf8", [GREETING_USERPASS],
            h("01 03") + b"k=\xff" + h("01 00"),
            AUTH_FAILED, None),
    Refusal("socks5-userpass-bad-version", [GREETING_USERPASS],
            h("05 01 00 01 c0000201 0050"),  # a request where VER=01 ULEN... belongs
            AUTH_FAILED, 1),
]


# --- Helpers --------------------------------------------------------------------

def request_fields(request):
    return request.version, request.host, request.port, request.args


def random_chunks(data, seed):
    rng = random.Random(seed)
    chunks, i = [], 0
    while i < len(data):
        n = rng.choice([0, 1, 2, 3, 5, 8, 13, 100])
        chunks.append(data[i:i + n])
        i += n
    return chunks


# --- Conversations that succeed ----------------------------------------------------

@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.name)
def test_vector_one_message_at_a_time(vector):
    server = socks.SocksServer()
    for message, answer in vector.steps:
        assert server.request is None
        assert server.receive(message) == answer
    assert request_fields(server.request) == vector[2:]
    assert server.request.trailing == b""


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.name)
def test_vector_one_byte_at_a_time(vector):
    # Each answer comes exactly with the last byte of its message, not before.
    server = socks.SocksServer()
    for message, answer in vector.steps:
        for i in range(len(message) - 1):
            assert server.receive(message[i:i + 1]) == b""
            assert server.request is None
        assert server.receive(message[-1:]) == answer
    assert request_fields(server.request) == vector[2:]
    assert server.request.trailing == b""


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.name)
def test_vector_pipelined_keeps_the_trailing_data(vector):
    server = socks.SocksServer()
    everything = b"".join(message for message, _ in vector.steps) + DATA
    assert server.receive(everything) == b"".join(answer for _, answer in vector.steps)
    assert request_fields(server.request) == vector[2:]
    assert server.request.trailing == DATA


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.name)
def test_vector_pipelined_in_random_splits(vector, seed):
    server = socks.SocksServer()
    everything = b"".join(message for message, _ in vector.steps) + DATA
    chunks = random_chunks(everything, seed)
    answers = b""
    while server.request is None:
        answers += server.receive(chunks.pop(0))
    assert answers == b"".join(answer for _, answer in vector.steps)
    assert request_fields(server.request) == vector[2:]
    assert server.request.trailing + b"".join(chunks) == DATA


def test_socks4_userid_of_the_maximum_length_is_accepted():
    userid = b"k=" + b"v" * (socks.MAX_SOCKS4_FIELD - 2)
    server = socks.SocksServer()
    server.receive(h("04 01 0050 c0000201") + userid + h("00"))
    assert server.request.args == {"k": "v" * (socks.MAX_SOCKS4_FIELD - 2)}


def test_userpass_is_chosen_whenever_offered():
    server = socks.SocksServer()
    assert server.receive(h("05 03 00 01 02")) == h("05 02")   # NMETHODS=03 [00 01 02]


def test_receive_after_the_request_is_an_api_error():
    server = socks.SocksServer()
    server.receive(h("04 01 0050 c0000201 00"))
    with pytest.raises(RuntimeError):
        server.receive(b"more")


# --- Replies ------------------------------------------------------------------------

def socks5_server():
    server = socks.SocksServer()
    server.receive(GREETING_NO_AUTH[0] + h("05 01 00 01 c0000201 0050"))
    return server


def socks4_server():
    server = socks.SocksServer()
    server.receive(h("04 01 0050 c0000201 00"))
    return server


def test_socks5_success_reply_default_address():
    # VER=05 REP=00 RSV=00 ATYP=01 BND.ADDR=0.0.0.0 BND.PORT=0
    assert socks5_server().reply(socks.SUCCEEDED) == h("05 00 00 01 00000000 0000")


def test_socks5_success_reply_ipv4_bound_address():
    # VER=05 REP=00 RSV=00 ATYP=01 BND.ADDR=192.0.2.7 BND.PORT=1080
    assert socks5_server().reply(socks.SUCCEEDED, "192.0.2.7", 1080) == \
        h("05 00 00 01 c0000207 0438")


def test_socks5_success_reply_ipv6_bound_address():
    # VER=05 REP=00 RSV=00 ATYP=04 BND.ADDR=2001:db8::7 BND.PORT=443
    assert socks5_server().reply(socks.SUCCEEDED, "2001:db8::7", 443) == \
        h("05 00 00 04 20010db8000000000000000000000007 01bb")


@pytest.mark.parametrize("code, rep", [
    (socks.GENERAL_FAILURE, "01"), (socks.NOT_ALLOWED, "02"), (socks.NETWORK_UNREACHABLE, "03"),
    (socks.HOST_UNREACHABLE, "04"), (socks.CONNECTION_REFUSED, "05"), (socks.TTL_EXPIRED, "06"),
    (socks.COMMAND_NOT_SUPPORTED, "07"), (socks.ADDRESS_TYPE_NOT_SUPPORTED, "08")])
def test_socks5_failure_replies(code, rep):
    # VER=05 REP=<code> RSV=00 ATYP=01 BND.ADDR=0.0.0.0 BND.PORT=0
    assert socks5_server().reply(code) == h("05 " + rep + V5_FAILURE)


def test_socks4_granted_reply():
    # VN=00 CD=5A DSTPORT=0 DSTIP=0.0.0.0
    assert socks4_server().reply(socks.SUCCEEDED) == h("00 5a 0000 00000000")


@pytest.mark.parametrize("code", [socks.GENERAL_FAILURE, socks.CONNECTION_REFUSED,
                                  socks.TTL_EXPIRED, socks.HOST_UNREACHABLE])
def test_socks4_every_failure_is_rejected_5b(code):
    assert socks4_server().reply(code) == V4_REJECTED


# --- Conversations that are refused ------------------------------------------------

def prior_answers(refusal):
    return b"".join(answer for _, answer in refusal.steps)


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda r: r.name)
def test_refusal_one_message_at_a_time(refusal):
    server = socks.SocksServer()
    for message, answer in refusal.steps:
        assert server.receive(message) == answer
    with pytest.raises(socks.SocksError) as caught:
        server.receive(refusal.bad)
    assert caught.value.reply == refusal.reply
    assert server.request is None


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda r: r.name)
def test_refusal_one_byte_at_a_time(refusal):
    # Refused exactly when the bytes so far decide it, with nothing sent before.
    server = socks.SocksServer()
    for message, answer in refusal.steps:
        assert b"".join(server.receive(message[i:i + 1]) for i in range(len(message))) == answer
    at = len(refusal.bad) if refusal.at is None else refusal.at
    for i in range(at - 1):
        assert server.receive(refusal.bad[i:i + 1]) == b""
    with pytest.raises(socks.SocksError) as caught:
        server.receive(refusal.bad[at - 1:at])
    assert caught.value.reply == refusal.reply


@pytest.mark.parametrize("refusal", REFUSALS, ids=lambda r: r.name)
def test_refusal_pipelined_answers_earlier_messages_first(refusal):
    server = socks.SocksServer()
    everything = b"".join(message for message, _ in refusal.steps) + refusal.bad + DATA
    with pytest.raises(socks.SocksError) as caught:
        server.receive(everything)
    assert caught.value.reply == prior_answers(refusal) + refusal.reply


def test_tor_style_conversation_with_a_bad_request_after_auth():
    server = socks.SocksServer()
    with pytest.raises(socks.SocksError) as caught:
        server.receive(h("05 02 00 02")                           # greeting
                       + h("01 11") + b"shared-secret=foo" + h("01 00")   # args
                       + h("05 02 00 01 7f000001 4a3b"))          # BIND
    # METHOD=02, STATUS=00, then REP=07: in the order the client asked.
    assert caught.value.reply == h("05 02") + AUTH_OK + h("05 07" + V5_FAILURE)


# --- parse_args ------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("", {}),
    ("shared-secret=foo", {"shared-secret": "foo"}),
    ("a=1;b=2", {"a": "1", "b": "2"}),
    ("a=1;;b=2;", {"a": "1", "b": "2"}),            # empty pairs are skipped
    ("k=\\;\\=\\\\", {"k": ";=\\"}),                # every escape
    ("k\\=x=y", {"k=x": "y"}),                      # an escaped "=" belongs to the key
    ("k=a=b", {"k": "a=b"}),                        # tor does not escape "=" in values
    ("k=", {"k": ""}),
    ("k=\\x", {"k": "x"}),                          # a needless escape is the character
])
def test_parse_args_examples(text, expected):
    assert socks.parse_args(text) == expected


@pytest.mark.parametrize("text", ["novalue", "=v", "k=v\\", "a=1;novalue", "k\\=v"])
def test_parse_args_rejects(text):
    with pytest.raises(ValueError):
        socks.parse_args(text)


# --- Properties ------------------------------------------------------------------------

def escape(text, specials="\\;="):
    """pt-spec 3.5 escaping: a backslash before each special character."""
    return "".join("\\" + ch if ch in specials else ch for ch in text)


def encode_args(args):
    return ";".join(escape(k) + "=" + escape(v) for k, v in args.items())


def tor_encode_args(args):
    """What tor itself sends: only "\\" and ";" escaped."""
    return ";".join(escape(k) + "=" + escape(v, "\\;") for k, v in args.items())


arg_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=12)
arg_dicts = st.dictionaries(arg_text.filter(bool), arg_text, max_size=6)


@settings(max_examples=300, deadline=None)
@given(arg_dicts)
def test_parse_args_round_trips(args):
    assert socks.parse_args(encode_args(args)) == args


@settings(max_examples=200, deadline=None)
@given(arg_dicts.filter(lambda d: not any("=" in k for k in d)))
def test_parse_args_reads_tor_style_escaping(args):
    assert socks.parse_args(tor_encode_args(args)) == args


@settings(max_examples=200, deadline=None)
@given(arg_dicts, st.booleans())
def test_args_survive_socks5_and_socks4_as_tor_sends_them(args, socks4):
    encoded = encode_args(args).encode("utf-8")
    request_v5 = h("05 01 00 01 c0000201 0050")
    if socks4:
        assume(len(encoded) <= socks.MAX_SOCKS4_FIELD)
        wire = h("04 01 0050 c0000201") + encoded + h("00")
    else:
        assume(len(encoded) <= 2 * 255)
        uname, passwd = encoded[:255], encoded[255:] or b"\0"   # spill, or the NUL placeholder
        wire = h("05 01 02") + userpass(uname, passwd) + request_v5
    server = socks.SocksServer()
    server.receive(wire)
    assert server.request.args == args


ALL_STREAMS = [b""] + [b"".join(m for m, _ in v.steps) for v in VECTORS] + \
    [b"".join(m for m, _ in r.steps) + r.bad for r in REFUSALS if len(r.bad) < 100]


@st.composite
def socks_inputs(draw):
    """Noise, or a real conversation cut anywhere, perhaps with one byte changed,
    followed by noise."""
    stream = bytearray(draw(st.sampled_from(ALL_STREAMS)))
    stream = stream[:draw(st.integers(0, len(stream)))]
    if stream and draw(st.booleans()):
        stream[draw(st.integers(0, len(stream) - 1))] = draw(st.integers(0, 255))
    return bytes(stream) + draw(st.binary(max_size=40))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(socks_inputs(), st.lists(st.integers(0, 12), max_size=30))
def test_any_input_gives_bytes_a_request_or_socks_error(data, sizes):
    server = socks.SocksServer()
    chunks, i = [], 0
    for n in sizes:
        chunks.append(data[i:i + n])
        i += n
    chunks.append(data[i:])
    fed = b""
    for chunk in chunks:
        fed += chunk
        try:
            out = server.receive(chunk)
        except socks.SocksError as exc:
            assert type(exc.reply) is bytes
            return
        assert type(out) is bytes
        if server.request is not None:
            request = server.request
            assert request.version in (4, 5)
            assert type(request.host) is str and request.host
            assert 0 <= request.port <= 65535
            assert type(request.args) is dict
            assert type(request.trailing) is bytes and fed.endswith(request.trailing)
            assert len(request.trailing) <= len(chunk)
            assert type(server.reply(socks.SUCCEEDED)) is bytes
            return
