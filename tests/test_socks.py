"""Tests for socks.py: SOCKS4/4a/5 server side and client-side messages, sans-IO.

Every conversation is a list of hex vectors annotated field by field, written
from RFC 1928, RFC 1929, the SOCKS4/4a documents and pt-spec 3.5, and each is
fed three ways: one message per ``receive`` (as tor does), one byte at a time,
and pipelined (every message plus application data in one chunk, and in
seeded random splits). Properties then check that any byte string, and any
SOCKS-looking message with fields near their limits, gives the same outcome
however it is split. The client-side builders have hand-written hex vectors.
"""

import random
import re
import struct
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
    Vector("socks5-idna-domain-utf8", [
        GREETING_NO_AUTH,
        (h("05 01 00 03 0f")              # VER=05 CMD=01 RSV=00 ATYP=03 LEN=15
         + h("62 c3bc 63686572 2e 6578616d706c65")  # "b" "ü" (UTF-8) "cher" "." "example"
         + h("01bb"),                     # DST.PORT=443
         b"")], 5, "b\u00fccher.example", 443, {}),
    Vector("socks5-domain-with-underscore-digits-dash", [
        GREETING_NO_AUTH,
        (h("05 01 00 03 0e") + b"_srv.a-1.test." + h("0050"),  # LEN=14, a trailing dot is fine
         b"")], 5, "_srv.a-1.test.", 80, {}),
    Vector("socks5-domain-of-255-bytes", [
        GREETING_NO_AUTH,
        (h("05 01 00 03 ff") + b"a" * 255 + h("0050"),  # LEN=255: the most SOCKS5 can carry
         b"")], 5, "a" * 255, 80, {}),
    Vector("socks4a-hostname-of-255-bytes", [
        (h("04 01 0050 00000001 00")    # VN=04 CD=01 DSTPORT=80 DSTIP=0.0.0.1 (4a) USERID="" NUL
         + b"h" * 255 + h("00"),         # HOST: 255 bytes, the limit, then NUL
         b"")], 4, "h" * 255, 80, {}),
    Vector("socks5-port-65535", [
        GREETING_NO_AUTH,
        (h("05 01 00 01 c0000201 ffff"), b"")], 5, "192.0.2.1", 65535, {}),
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
            h("04 01 0050 00000001 00") + b"h" * 256,  # no NUL in sight; 256 > 255 bytes
            V4_REJECTED, 9 + 256),
    Refusal("socks4a-host-of-256-bytes-with-its-nul", [],
            h("04 01 0050 00000001 00") + b"h" * 256 + h("00"),
            V4_REJECTED, 9 + 256),        # decided at the 256th byte, before the NUL
    Refusal("socks4-userid-too-long-with-its-nul", [],  # the fuzzer's finding, fed whole
            h("04 01 0050 c0000201") + b"k=" + b"v" * (socks.MAX_SOCKS4_FIELD - 1) + h("00"),
            V4_REJECTED, 8 + socks.MAX_SOCKS4_FIELD + 1),
    Refusal("socks4-userid-too-long-and-not-utf8", [],  # too long wins, as it does byte by byte
            h("04 01 0050 c0000201") + b"k=\xff" + b"v" * socks.MAX_SOCKS4_FIELD + h("00"),
            V4_REJECTED, 8 + socks.MAX_SOCKS4_FIELD + 1),
    Refusal("socks4a-host-crlf", [],
            h("04 01 0050 00000001 00")     # DSTIP=0.0.0.1 USERID="" NUL
            + b"a\r\nb" + h("00"),            # HOST="a" CR LF "b" NUL: header injection
            V4_REJECTED, None),
    Refusal("socks4a-host-not-utf8", [],
            h("04 01 0050 00000001 00") + h("61 ff 62 00"),  # HOST="a" FF "b" NUL
            V4_REJECTED, None),
    Refusal("socks4a-host-with-colon", [],
            h("04 01 0050 00000001 00") + b"a:80" + h("00"),
            V4_REJECTED, None),
    Refusal("socks4-port-0", [],
            h("04 01 0000 c0000201 00"),  # VN=04 CD=01 DSTPORT=0 DSTIP=192.0.2.1 USERID=""
            V4_REJECTED, None),
    Refusal("socks5-domain-crlf", [GREETING_NO_AUTH],
            h("05 01 00 03 09") + b"a\r\nb.test" + h("0050"),  # LEN=9 "a" CR LF "b.test" PORT=80
            h("05 01" + V5_FAILURE), None),  # REP=01 general failure
    Refusal("socks5-domain-nul", [GREETING_NO_AUTH],
            h("05 01 00 03 05") + h("61 62 00 63 64") + h("0050"),  # LEN=5 "ab" NUL "cd"
            h("05 01" + V5_FAILURE), None),
    Refusal("socks5-domain-not-utf8", [GREETING_NO_AUTH],
            h("05 01 00 03 03 61 ff 62 0050"),  # LEN=3 "a" FF "b"
            h("05 01" + V5_FAILURE), None),
    Refusal("socks5-domain-ipv6-literal", [GREETING_NO_AUTH],
            h("05 01 00 03 03") + b"::1" + h("0050"),  # an IPv6 address belongs in ATYP=04
            h("05 01" + V5_FAILURE), None),
    Refusal("socks5-port-0", [GREETING_NO_AUTH],
            h("05 01 00 01 c0000201 0000"),  # ATYP=01 192.0.2.1 PORT=0
            h("05 01" + V5_FAILURE), None),
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
    ("k=\\;\\=\\\\", {"k": ";=\\"}),                # every escape
    ("k\\=x=y", {"k=x": "y"}),                      # an escaped "=" belongs to the key
    ("k=a=b", {"k": "a=b"}),                        # tor does not escape "=" in values
    ("k=", {"k": ""}),
    ("k=\\x", {"k": "x"}),                          # a needless escape is the character
])
def test_parse_args_examples(text, expected):
    assert socks.parse_args(text) == expected


@pytest.mark.parametrize("text", [
    "novalue", "=v", "k=v\\", "a=1;novalue", "k\\=v",
    # Empty pairs: obfs4proxy 0.0.14 answers these with RFC 1929 01 01 (seen live), and
    # so do we now (this test used to expect "a=1;;b=2;" -> {"a": "1", "b": "2"}).
    "a=1;", "a=1;;b=2", ";a=1", ";", "a=1;;"])
def test_parse_args_rejects(text):
    with pytest.raises(ValueError):
        socks.parse_args(text)


@pytest.mark.parametrize("text, message", [
    ("a=1;", "argument 2 is empty: a stray ';' at character 4"),
    (";a=1", "argument 1 is empty: a stray ';' at character 1"),
    ("a=1;;b=2", "argument 2 is empty: a stray ';' at character 4"),
    ("a=1;hunter2", "argument 2 (from character 5) has no '=': KEY=VALUE expected"),
    ("a=1;=hunter2", "argument 2 (from character 5) has an empty key"),
    ("k=hunter2\\", "a lone backslash ends the text (character 10)"),
    ("k=\\;x;hunter2", "argument 2 (from character 7) has no '=': KEY=VALUE expected"),  # escapes count
])
def test_parse_args_errors_say_where_never_what(text, message):
    """review-4 finding 4: the text may be an obfs2 shared-secret or a webtunnel
    url= path, and these messages reach the log and Tor's (LOG lines)."""
    with pytest.raises(ValueError) as caught:
        socks.parse_args(text)
    assert str(caught.value) == message


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from("QQQab;=\\"), max_size=24))
def test_no_parse_args_error_quotes_the_text(text):
    """No refusal shows any of the text: "Q" (in no message) never appears."""
    try:
        socks.parse_args(text)
    except ValueError as exc:
        assert "Q" not in str(exc)


@pytest.mark.parametrize("wire, message", [
    (h("05 01 00") + h("05 01 00 03 0d") + b"secret.org/xy" + h("0050"),
     "SOCKS5 domain name is not a host name: it contains '/'"),
    (h("05 01 00") + h("05 01 00 03 0a") + b"secret\xffxyz" + h("0050"),
     "SOCKS5 domain name is not UTF-8 (byte 7 of 10)"),
    (h("04 01 0050 00000001 00") + b"secret host" + h("00"),
     "SOCKS4a host name is not a host name: it contains ' '"),
    (h("05 01 02") + h("01 0e") + b"secret=hunter2" + h("01") + b"\xff",
     "bad per-connection arguments: not UTF-8 (byte 15 of 15)"),
    (h("04 01 0050 7f000001") + b"hunter2;" + h("00"),
     "bad per-connection arguments: argument 1 (from character 1) has no '=': KEY=VALUE expected"),
])
def test_refusals_never_quote_the_host_or_the_arguments(wire, message):
    """review-4 findings 4 and 8: a target name is scrubbed like an address, the
    arguments may be secrets; a refusal says what is wrong, not what was sent."""
    with pytest.raises(socks.SocksError) as caught:
        socks.SocksServer().receive(wire)
    assert str(caught.value) == message


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


# --- Host names ------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "example.com", "a", "127.0.0.1", "xn--bcher-kva.example", "b\u00fccher.example",
    "\u65e5\u672c\u8a9e.jp", "\u0926\u0947\u0935\u0928\u093e\u0917\u0930\u0940.test",  # marks (Mc)
    "_srv.a-1.test.", "a" * 255, "\u00e9" * 127 + "a"])     # 255 bytes of UTF-8
def test_is_valid_hostname_accepts(name):
    assert socks.is_valid_hostname(name)


@pytest.mark.parametrize("name", [
    "", "a\r\nb", "\r", "\n", "a\0b", "a b", "a\tb", "a\x7fb", "user@host", "a/b", "a:80",
    "::1", "[::1]", "a%eth0", "a\\b", "a,b", "a;b", "a\"b", "a?b", "a#b",
    "a\x85b", "a\u2028b", "a\u00a0b", "a\ufeffb", "a\u3002b",   # NEL, LINE SEP, NBSP, BOM, 。
    "a\ud800b",                                                 # a lone surrogate
    "a" * 256, "\u00e9" * 128,                                  # 256 bytes of UTF-8
    b"example.com", None])
def test_is_valid_hostname_refuses(name):
    assert not socks.is_valid_hostname(name)


BAD_NAMES = [b"a\r\nb", b"\r", b"\n", b"a\0b", b"a b", b"user@host", b"a/b", b"a:80", b"\xff",
             b"a\xc3", b"\xc2\x85"]   # invalid UTF-8 (FF, a cut-off sequence), U+0085 (NEL)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_socks5_bad_domain_names_get_general_failure(name):
    server = socks.SocksServer()
    with pytest.raises(socks.SocksError) as caught:
        # VER=05 NMETHODS=01 [00] | VER=05 CMD=01 RSV=00 ATYP=03 LEN NAME PORT=80
        server.receive(h("05 01 00") + h("05 01 00 03") + bytes([len(name)]) + name + h("0050"))
    assert caught.value.reply == h("05 00") + h("05 01" + V5_FAILURE)   # METHOD=00, then REP=01
    assert "domain name" in str(caught.value)


@pytest.mark.parametrize("name", [n for n in BAD_NAMES if b"\0" not in n])
def test_socks4a_bad_host_names_are_rejected(name):
    server = socks.SocksServer()
    with pytest.raises(socks.SocksError) as caught:
        # VN=04 CD=01 DSTPORT=80 DSTIP=0.0.0.1 USERID="" NUL HOST NUL
        server.receive(h("04 01 0050 00000001 00") + name + h("00"))
    assert caught.value.reply == V4_REJECTED
    assert "host name" in str(caught.value)


def test_socks4a_nul_ends_the_host_name():
    # A NUL cannot be inside a SOCKS4a name: it ends it, and what follows is trailing data.
    server = socks.SocksServer()
    server.receive(h("04 01 0050 00000001 00") + b"a" + h("00") + b"b")
    assert (server.request.host, server.request.trailing) == ("a", b"b")


def test_error_messages_show_control_characters_escaped():
    # The message goes to a log line: CR/LF must not reach it raw.
    server = socks.SocksServer()
    with pytest.raises(socks.SocksError) as caught:
        server.receive(h("05 01 00 05 01 00 03 03") + b"a\r\n" + h("0050"))
    assert "\r" not in str(caught.value) and "\n" not in str(caught.value)
    assert "\\r" in str(caught.value)


# --- Client-side messages ------------------------------------------------------------------

@pytest.mark.parametrize("methods, wire", [
    ([socks.METHOD_NO_AUTH], "05 01 00"),                  # VER=05 NMETHODS=01 METHODS=[00]
    ([0x00, 0x02], "05 02 00 02"),                         # VER=05 NMETHODS=02 METHODS=[00 02]
    (b"\x02", "05 01 02"),                                 # bytes work as a method list too
    (range(255), "05 ff " + bytes(range(255)).hex()),      # NMETHODS=255: the most there can be
])
def test_socks5_greeting(methods, wire):
    assert socks.socks5_greeting(methods) == h(wire)


@pytest.mark.parametrize("methods", [[], range(256), [256], [-1]])
def test_socks5_greeting_refuses(methods):
    with pytest.raises(ValueError):
        socks.socks5_greeting(methods)


def test_socks5_userpass():
    # VER=01 ULEN=05 UNAME="alice" PLEN=06 PASSWD="secret"
    assert socks.socks5_userpass(b"alice", b"secret") == h("01 05 616c696365 06 736563726574")
    # ULEN=ff and PLEN=ff: each field's most
    assert socks.socks5_userpass(b"u" * 255, b"p" * 255) == \
        h("01 ff") + b"u" * 255 + h("ff") + b"p" * 255


@pytest.mark.parametrize("user, password", [
    (b"", b"secret"), (b"alice", b""), (b"u" * 256, b"p"), (b"u", b"p" * 256)])
def test_socks5_userpass_refuses_what_rfc1929_cannot_carry(user, password):
    with pytest.raises(ValueError):
        socks.socks5_userpass(user, password)


@pytest.mark.parametrize("host, port, wire", [
    # VER=05 CMD=01 RSV=00 ATYP=01 DST.ADDR=192.0.2.1 DST.PORT=80
    ("192.0.2.1", 80, "05 01 00 01 c0000201 0050"),
    # ATYP=04 DST.ADDR=2001:db8::1 DST.PORT=443
    ("2001:db8::1", 443, "05 01 00 04 20010db8000000000000000000000001 01bb"),
    # ATYP=03 LEN=0b DST.ADDR="example.com" DST.PORT=65535
    ("example.com", 65535, "05 01 00 03 0b 6578616d706c652e636f6d ffff"),
    # ATYP=03 LEN=0f "b" "ü" (c3 bc) "cher.example" DST.PORT=1
    ("b\u00fccher.example", 1, "05 01 00 03 0f 62c3bc636865722e6578616d706c65 0001"),
    # ATYP=03 LEN=ff: 255 bytes of name
    ("a" * 255, 80, "05 01 00 03 ff " + "61" * 255 + " 0050"),
])
def test_socks5_connect(host, port, wire):
    assert socks.socks5_connect(host, port) == h(wire)


@pytest.mark.parametrize("host, port", [
    ("a" * 256, 80),             # more than LEN can say
    ("\u00e9" * 128, 80),        # 128 characters, but 256 bytes
    ("a\r\nb", 80), ("", 80), ("[::1]", 80), ("fe80::1%eth0", 80), ("user@host", 80),
    ("example.com", 0), ("example.com", 65536), ("192.0.2.1", -1)])
def test_socks5_connect_refuses(host, port):
    with pytest.raises(ValueError):
        socks.socks5_connect(host, port)


@pytest.mark.parametrize("host, port, userid, wire", [
    # SOCKS4: VN=04 CD=01 DSTPORT=80 DSTIP=192.0.2.1 USERID="" NUL
    ("192.0.2.1", 80, b"", "04 01 0050 c0000201 00"),
    # SOCKS4: VN=04 CD=01 DSTPORT=443 DSTIP=127.0.0.1 USERID="k=v" NUL
    ("127.0.0.1", 443, b"k=v", "04 01 01bb 7f000001 6b3d76 00"),
    # SOCKS4a: VN=04 CD=01 DSTPORT=80 DSTIP=0.0.0.1 USERID="k=v" NUL HOST="example.com" NUL
    ("example.com", 80, b"k=v", "04 01 0050 00000001 6b3d76 00 6578616d706c652e636f6d 00"),
    # SOCKS4a with no USERID: DSTIP=0.0.0.1 NUL HOST="a.b" NUL
    ("a.b", 8080, b"", "04 01 1f90 00000001 00 612e62 00"),
])
def test_socks4a_connect(host, port, userid, wire):
    assert socks.socks4a_connect(host, port, userid) == h(wire)


@pytest.mark.parametrize("host, port, userid", [
    ("2001:db8::1", 80, b""),    # SOCKS4 has no IPv6
    ("a" * 256, 80, b""), ("a\r\nb", 80, b""), ("", 80, b""),
    ("example.com", 80, b"a\0b"),  # a NUL would end the USERID early
    ("example.com", 0, b""), ("192.0.2.1", 65536, b"")])
def test_socks4a_connect_refuses(host, port, userid):
    with pytest.raises(ValueError):
        socks.socks4a_connect(host, port, userid)


@pytest.mark.parametrize("head, more", [
    ("05 00 00 01", 4 + 2),                  # ATYP=01: BND.ADDR(4) BND.PORT(2) to come
    ("05 00 00 04", 16 + 2),                 # ATYP=04: BND.ADDR(16) BND.PORT(2)
    ("05 00 00 03", 1),                      # ATYP=03: first LEN, then ask again
    ("05 00 00 03 0b", 11 + 2),              # LEN=11: the name and BND.PORT
    ("05 00 00 03 00", 2),                   # LEN=0: only BND.PORT
    ("05 00 00 01 c0000201", 2),             # part of the address is in already
    ("05 05 00 01 00000000 0000", 0),        # complete (REP does not matter here)
    ("05 00 00 03 01 61 0050 ffff", 0),      # complete, with the tunnel's data after it
])
def test_socks5_reply_length(head, more):
    assert socks.socks5_reply_length(h(head)) == more


@pytest.mark.parametrize("head", ["05 00 00 02", "05 00 00 00", "05 00 00 ff", "05 00 00", ""])
def test_socks5_reply_length_refuses(head):
    with pytest.raises(ValueError):
        socks.socks5_reply_length(h(head))


def test_socks5_reply_length_reads_a_server_reply_exactly():
    # The documented loop, over the replies our own server writes.
    server = socks.SocksServer()
    server.receive(h("05 01 00 05 01 00 01 c0000201 0050"))
    for reply in (server.reply(socks.SUCCEEDED, "2001:db8::7", 443), server.reply(socks.GENERAL_FAILURE)):
        stream = reply + DATA
        got = stream[:4]
        while socks.socks5_reply_length(got):
            got += stream[len(got):len(got) + socks.socks5_reply_length(got)]
        assert got == reply


hosts = st.one_of(
    st.ip_addresses().map(str),
    st.text(st.sampled_from("abcXYZ019-._\u00fc\u65e5"), min_size=1, max_size=80))


@settings(max_examples=150, deadline=None)
@given(hosts, st.integers(1, 65535), arg_dicts, st.booleans())
def test_builders_say_what_our_server_reads(host, port, args, socks4):
    """Client and server halves agree: what a builder writes, the server parses back."""
    encoded = encode_args(args).encode("utf-8")
    server = socks.SocksServer()
    if socks4 and ":" not in host:   # SOCKS4 cannot carry IPv6
        assume(len(encoded) <= socks.MAX_SOCKS4_FIELD)
        server.receive(socks.socks4a_connect(host, port, encoded))
    elif encoded:
        assume(len(encoded) <= 2 * 255)
        auth = socks.socks5_userpass(encoded[:255], encoded[255:] or b"\0")   # spill, or NUL
        assert server.receive(socks.socks5_greeting([0x02]) + auth) == h("05 02") + AUTH_OK
        server.receive(socks.socks5_connect(host, port))
    else:
        assert server.receive(socks.socks5_greeting([0x00])) == h("05 00")
        server.receive(socks.socks5_connect(host, port))
    assert (server.request.host, server.request.port, server.request.args) == (host, port, args)


def test_socks4a_connect_sends_0_0_0_x_as_a_name():
    # DSTIP 0.0.0.x (x != 0) is SOCKS4a's "a name follows": that address must go as a name.
    # VN=04 CD=01 DSTPORT=80 DSTIP=0.0.0.1 USERID="" NUL HOST="0.0.0.7" NUL
    assert socks.socks4a_connect("0.0.0.7", 80) == h("04 01 0050 00000001 00 302e302e302e37 00")
    # 0.0.0.0 is no such marker: plain SOCKS4
    assert socks.socks4a_connect("0.0.0.0", 80) == h("04 01 0050 00000000 00")


# --- split_escaped: the TOR_PT_SERVER_TRANSPORT_OPTIONS step -------------------------------

@pytest.mark.parametrize("text, separator, parts", [
    (r"obfs2:shared-secret=a\;b", ";", [r"obfs2:shared-secret=a\;b"]),   # "\;" does not split
    (r"obfs2:shared-secret=a\;b;dummy:x=1", ";", [r"obfs2:shared-secret=a\;b", "dummy:x=1"]),
    (r"obfs2:k=a\:b:c", ":", ["obfs2", r"k=a\:b", "c"]),                  # "\:" does not split
    (r"k\=x=a=b", "=", [r"k\=x", "a", "b"]),                               # "\=" does not split
    (r"a\\;b", ";", [r"a\\", "b"]),                 # "\\" is one backslash: the ";" splits
    (r"a\\\;b", ";", [r"a\\\;b"]),                  # "\\" then "\;"
    ("a;;b;", ";", ["a", "", "b", ""]),              # empty parts are kept
    ("", ";", [""]),
])
def test_split_escaped(text, separator, parts):
    assert socks.split_escaped(text, separator) == parts


@pytest.mark.parametrize("text", ["a\\", "obfs2:k=v\\", "\\", "a;b\\\\\\"])
def test_split_escaped_lone_trailing_backslash(text):
    with pytest.raises(ValueError):
        socks.split_escaped(text, ";")


def test_split_escaped_and_parse_args_read_transport_options():
    # managed.py's TOR_PT_SERVER_TRANSPORT_OPTIONS case, read with the pieces socks.py offers.
    text = r"obfs2:shared-secret=a\:b\;c\=d\\e;dummy:x=1;obfs2:k=v=w"
    options = {}
    for item in socks.split_escaped(text, ";"):
        name, *rest = socks.split_escaped(item, ":")
        options.setdefault(socks.unescape(name), {}).update(socks.parse_args(":".join(rest)))
    assert options == {"obfs2": {"shared-secret": "a:b;c=d\\e", "k": "v=w"}, "dummy": {"x": "1"}}


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from("ab;:=\\"), max_size=20), st.sampled_from(";:="))
def test_split_escaped_joins_back_and_leaves_no_bare_separator(text, separator):
    try:
        parts = socks.split_escaped(text, separator)
    except ValueError:
        # Only for a lone backslash at the end: the text ends in an odd run of them.
        assert (len(text) - len(text.rstrip("\\"))) % 2 == 1
        return
    assert (len(text) - len(text.rstrip("\\"))) % 2 == 0
    assert separator.join(parts) == text
    for part in parts:
        assert separator not in re.sub(r"\\.", "", part, flags=re.DOTALL)


# --- Every split of the same bytes gives the same outcome -------------------------------------

def outcome(chunks):
    """What a server makes of ``chunks``: the request (with all bytes after it),
    the refusal, or "incomplete"; with every reply byte it emitted, in order."""
    server = socks.SocksServer()
    replies = b""
    for i, chunk in enumerate(chunks):
        try:
            replies += server.receive(chunk)
        except socks.SocksError as exc:
            return ("refused", type(exc), str(exc), replies + exc.reply)
        if server.request is not None:
            r = server.request
            return ("request", r.version, r.host, r.port, r.args,
                    r.trailing + b"".join(chunks[i + 1:]), replies, server.reply(socks.SUCCEEDED))
    return ("incomplete", replies)


def cut(data, sizes):
    chunks, i = [], 0
    for n in sizes:
        chunks.append(data[i:i + n])
        i += n
    return chunks + [data[i:]]


def assert_split_invariant(data, sizes):
    whole = outcome([data])
    assert outcome([data[i:i + 1] for i in range(len(data))]) == whole
    assert outcome(cut(data, sizes)) == whole
    return whole


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(socks_inputs(), st.binary(max_size=60)), st.lists(st.integers(0, 12), max_size=30))
def test_every_split_of_any_bytes_gives_the_same_outcome(data, sizes):
    assert_split_invariant(data, sizes)


def near(limit):
    """A field length: small, or within 3 of ``limit``."""
    return st.one_of(st.integers(0, 4), st.integers(max(limit - 3, 0), limit + 3))


# Field contents: argument-like text, host-name text, and the bytes that break either.
ARGS_FILLERS = [b"k=v", b"k=v;", b"x", b"\xc3\xbc"]
HOST_FILLERS = [b"a", b"a.b-", b"_", b"\xc3\xbc"]
SPECIALS = [b"\0", b"\r", b"\n", b" ", b"=", b";", b"\\", b"\xff", b"\xc3", b":", b"."]


@st.composite
def field(draw, limit, fillers, prefix=b""):
    """``near(limit)`` bytes: ``prefix`` and then one filler over and over,
    with up to 3 special bytes put anywhere."""
    n = draw(near(limit))
    data = bytearray((prefix + draw(st.sampled_from(fillers)) * n)[:n])
    for _ in range(draw(st.integers(0, 3)) if n else 0):
        data[draw(st.integers(0, n - 1))] = draw(st.sampled_from(SPECIALS))[0]
    return bytes(data)


def args_field(limit):
    return field(limit, ARGS_FILLERS, prefix=b"k=")


def host_field(limit):
    return field(limit, HOST_FILLERS)


def some(values):
    """Mostly one of the ``values`` that mean something; one time in ten any byte."""
    return st.integers(0, 9).flatmap(
        lambda r: st.integers(0, 255) if r == 0 else st.sampled_from(values))


@st.composite
def socks4_messages(draw):
    # VN=04 CD DSTPORT(2) DSTIP(4) USERID NUL [HOST NUL], IP 0.0.0.x meaning 4a
    cd = draw(some([1, 2]))
    port = draw(st.sampled_from([80, 80, 443, 65535, 0]))
    if draw(st.booleans()):
        dstip = bytes([0, 0, 0, draw(st.integers(1, 255))])      # SOCKS4a
    else:
        dstip = draw(st.binary(min_size=4, max_size=4))
    message = bytes([4, cd]) + struct.pack("!H", port) + dstip
    message += draw(args_field(socks.MAX_SOCKS4_FIELD)) + b"\0"
    message += draw(host_field(socks.MAX_HOSTNAME)) + b"\0"
    return message


@st.composite
def socks5_messages(draw):
    methods = draw(st.lists(some([0, 2]), min_size=1, max_size=3))
    message = bytes([5, len(methods)]) + bytes(methods)
    if 2 in methods:
        # VER=01 ULEN UNAME PLEN PASSWD, with lengths near 0 and 255
        uname = draw(args_field(255))[:255]
        passwd = draw(st.one_of(st.just(b"\0"), field(255, ARGS_FILLERS).map(lambda f: f[:255])))
        message += bytes([draw(some([1])), len(uname)]) + uname + bytes([len(passwd)]) + passwd
    # VER=05 CMD RSV ATYP DST.ADDR DST.PORT
    atyp = draw(some([1, 3, 4]))
    if atyp == 3:
        name = draw(host_field(255))[:255]
        address = bytes([len(name)]) + name
    else:
        size = {1: 4, 4: 16}.get(atyp, 0)
        address = draw(st.binary(min_size=size, max_size=size)) + draw(st.binary(max_size=2))
    port = draw(st.sampled_from([b"\0\0", b"\0\x50", b"\0\x50", b"\xff\xff"]))
    return message + bytes([draw(some([5])), draw(some([1, 2])), 0, atyp]) + address + port


@st.composite
def socks_messages(draw):
    """A SOCKS4/4a/5 conversation with fields near their limits, perhaps cut
    short, followed by perhaps some application data."""
    message = draw(st.one_of(socks4_messages(), socks5_messages()))
    if draw(st.booleans()):
        message = message[:draw(st.integers(0, len(message)))]
    return message + draw(st.sampled_from([b"", DATA, b"\0\0"]))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(socks_messages(), st.lists(st.integers(0, 400), max_size=12))
def test_every_split_of_a_socks_message_gives_the_same_outcome(data, sizes):
    assert_split_invariant(data, sizes)


def test_the_fuzzers_streams_give_one_answer():
    userid = b"k=" + b"v" * 1000                           # "a ~1,000-byte USERID"
    request = h("04 01 0050 c0000201") + userid + h("00")
    # Behind 2f...: not SOCKS (first byte 0x2f), refused at once with no reply, however cut.
    stream = h("2f400033b72f") + request
    for at in range(len(stream) + 1):
        assert outcome([stream[:at], stream[at:]]) == \
            ("refused", socks.SocksError, "not a SOCKS4 or SOCKS5 client (first byte 0x2f)", b"")
    # On its own: accepted, however cut.
    for at in range(0, len(request) + 1, 7):
        assert outcome([request[:at], request[at:]])[:4] == ("request", 4, "192.0.2.1", 80)
    # A USERID over the limit, or over it and not UTF-8: one refusal, however cut.
    for userid in (b"k=" + b"v" * 1028, b"k=\xff" + b"v" * 1028):
        request = h("04 01 0050 c0000201") + userid + h("00")
        answers = {outcome([request[:at], request[at:]]) for at in range(len(request) + 1)}
        assert answers == {("refused", socks.SocksError, "SOCKS4 USERID is longer than 1024 bytes",
                            V4_REJECTED)}
