"""outbound.py: how we reach the next hop.

* Outgoing proxies: ``outbound.connect_via_proxy``, ``--proxy`` and ``TOR_PT_PROXY``.
  The fake upstream proxies (support.FakeProxy: SOCKS5 with or without RFC 1929 auth,
  SOCKS4a, HTTP CONNECT with or without basic auth) record what they were asked
  and relay. A proxy that refuses must give the application a SOCKS error, and
  nothing may ever connect to the destination directly.
* TOR_PT_OUTBOUND_BIND_ADDRESS_V4/_V6: the source address of outgoing
  connections, never used for loopback destinations (as Tor's own
  OutboundBindAddress). Only loopback exists here, so the binding itself is
  shown by calling outbound.connect with the loopback exemption switched off.
* One deadline covers every address of a name.
* Parser edges a fuzzer found: targets a request cannot carry (CR/LF, over 255
  bytes, IPv6 for SOCKS4a) never reach the proxy; proxy URIs that are not
  UTF-8; HTTP status "digits" that int() refuses. Each is a ProxyError or a
  ProxyURIError (a SOCKS failure for the application, PROXY-ERROR for Tor),
  never an "internal error".
"""


import os
import re
import socket
import struct
import time

import pytest
from fake_tor import ManagedPT, client_env, managed_echo_server, tor_env
from support import (
    EchoServer,
    FakeProxy,
    Program,
    SocksReplyError,
    closed_port,
    echo_round_trip,
    hang_up,
    recv_exact,
    socks5_connect,
)

import outbound


def counting_listener():
    """A destination that closes every connection at once and counts them
    (``accepted``): proof of no direct connect."""
    return EchoServer(behaviour=hang_up)


def deadline(seconds=10):
    return outbound.Deadline(seconds)


# --- Addresses ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, address", [
    ("192.0.2.1:80", ("192.0.2.1", 80)),
    ("[2001:db8::1]:443", ("2001:db8::1", 443)),
    ("example.org:65535", ("example.org", 65535)),
    ("localhost:00080", ("localhost", 80)),
])
def test_parse_address(text, address):
    assert outbound.parse_address(text) == address


@pytest.mark.parametrize("text", [
    "[]:80",                          # an empty host (was accepted as "")
    "127.0.0.1:\u0661\u0660\u0665\u0660",   # Arabic-Indic 1050 (was port 1050)
    "127.0.0.1:\u00b2", "127.0.0.1:\uff18\uff10",   # superscript 2, full-width 80
    ":80", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536", "127.0.0.1:123456",
    "127.0.0.1:+80", "127.0.0.1: 80", "2001:db8::1:80", "[2001:db8::1:80", "[:80", "a]:80",
], ids=["empty brackets", "Arabic-Indic digits", "superscript", "full-width", "no host", "no port",
        "empty port", "port 0", "port 65536", "six digits", "+80", "space", "bare IPv6",
        "unclosed bracket", "lone bracket", "stray bracket"])
def test_parse_address_refuses(text):
    with pytest.raises(ValueError):
        outbound.parse_address(text)


@pytest.mark.parametrize("text, problem", [
    ("host\n:80", "control character or space"), ("ho st:80", "control character or space"),
    ("host\x00:80", "control character or space"), ("\u00a0host:80", "control character or space"),
    ("a%b:80", "has no %"), ("[1::2::3]:80", "only an IPv6 address"), ("[192.0.2.1]:80", "only an IPv6"),
    ("[example.org]:80", "only an IPv6"), ("[fe80::1%a b]:80", "control character or space"),
    ("[fe80::1%]:80", "zone"),
])
def test_parse_address_refuses_what_no_host_is(text, problem):
    """Hosts that no name lookup could take were let through to getaddrinfo, and into
    messages: a line break, a space, a %, brackets around what is not IPv6."""
    with pytest.raises(ValueError, match=re.escape(problem)):
        outbound.parse_address(text)


def test_parse_address_keeps_an_ipv6_zone_and_international_names():
    assert outbound.parse_address("[fe80::1%eth0]:80") == ("fe80::1%eth0", 80)
    assert outbound.parse_address("b\u00fccher.example:80") == ("b\u00fccher.example", 80)


def test_parse_address_port_zero_only_when_allowed():
    assert outbound.parse_address("127.0.0.1:0", allow_port_zero=True) == ("127.0.0.1", 0)
    with pytest.raises(ValueError):
        outbound.parse_address("[]:0", allow_port_zero=True)


# --- The proxy URI -----------------------------------------------------------------------

@pytest.mark.parametrize("uri, expected", [
    ("socks5://127.0.0.1:1080", ("socks5", "127.0.0.1", 1080, None, None)),
    ("socks5://tor:test1234@198.51.100.1:8000", ("socks5", "198.51.100.1", 8000, "tor", "test1234")),
    ("SOCKS5://u%40x:p%3Aw@[::1]:1080", ("socks5", "::1", 1080, "u@x", "p:w")),
    ("socks4a://198.51.100.2:8001", ("socks4a", "198.51.100.2", 8001, None, None)),
    ("socks4a://userid@198.51.100.2:8001", ("socks4a", "198.51.100.2", 8001, "userid", None)),
    ("http://198.51.100.3:443", ("http", "198.51.100.3", 443, None, None)),
    ("http://a:b@proxy.example:3128/", ("http", "proxy.example", 3128, "a", "b")),
])
def test_proxy_uri(uri, expected):
    assert tuple(outbound.parse_proxy_uri(uri)) == expected


@pytest.mark.parametrize("uri", [
    "ftp://127.0.0.1:21", "socks4://127.0.0.1:1080", "socks5://127.0.0.1", "socks5://:1080",
    "http://127.0.0.1:99999", "http://127.0.0.1:0", "socks5://127.0.0.1:1080/path",
    "http://127.0.0.1:80?x=1", "socks4a://u:p@127.0.0.1:1080", "socks5://%s:p@127.0.0.1:1" % ("u" * 256),
    "127.0.0.1:1080", "",
])
def test_proxy_uri_unusable(uri):
    with pytest.raises(outbound.ProxyURIError):
        outbound.parse_proxy_uri(uri)


@pytest.mark.parametrize("uri, password", [
    ("socks5://alice:hunter2/secret@127.0.0.1:1080", "hunter2/secret"),
    ("socks5://alice:pa#ssw0rd@127.0.0.1:1080", "pa#ssw0rd"),
    ("http://bob:s3cr3t?x@127.0.0.1:3128", "s3cr3t?x"),
    ("http://bob:a@b@127.0.0.1:3128/", "a@b"),
])
def test_proxy_password_may_hold_url_delimiters(uri, password):
    """A URL parser ends the address at the first / ? or #, and took part of the
    password for the port ("Port could not be cast to integer value as 'hunter2'",
    on stderr and in PROXY-ERROR). The user and password run to the last @."""
    assert outbound.parse_proxy_uri(uri).password == password


@pytest.mark.parametrize("uri", [
    "socks5://alice:hunter2", "socks5://alice:hunter2@", "socks5://alice:hunter2@127.0.0.1:x",
    "socks5://alice:hunter2@127.0.0.1:1080/hunter2", "alice:hunter2@127.0.0.1:1080",
    "socks5://alice:hunter2@host name:1", "socks5:/alice:hunter2@x:1",
    "http://alice:hunter2@[hunter2]:1",
])
def test_proxy_uri_errors_never_quote_the_password(uri):
    with pytest.raises(outbound.ProxyURIError) as info:
        outbound.parse_proxy_uri(uri)
    assert "hunter2" not in str(info.value), str(info.value)


# Values as an environment variable or argv gives them: undecodable bytes become
# surrogates (os.fsdecode), which cannot be encoded back to UTF-8 for a request.
NOT_UTF8_URIS = [
    os.fsdecode(b"socks5://z\xd5@\x08:4\xc7\x00]"),      # what the fuzzer sent
    os.fsdecode(b"z\xd5@\x08:4\xc7\x00]"),
    os.fsdecode(b"socks5://u\xd5:p@127.0.0.1:1080"),     # a user that is not UTF-8
    os.fsdecode(b"socks4a://\xff@127.0.0.1:1080"),
    os.fsdecode(b"http://u:\xff@127.0.0.1:1080"),        # a password that is not UTF-8
    "socks4a://%ff@127.0.0.1:1080",                      # percent-decodes to no UTF-8
    "http://%ff:x@127.0.0.1:1080",
    "http://u:%c3@127.0.0.1:1080",                       # a cut-off sequence
]


@pytest.mark.parametrize("uri", NOT_UTF8_URIS)
def test_proxy_uri_that_is_not_utf8_is_unusable(uri):
    with pytest.raises(outbound.ProxyURIError, match="UTF-8"):
        outbound.parse_proxy_uri(uri)


def test_socks4a_user_id_with_nul_is_unusable():
    """A NUL would end the USERID field early: the proxy would read the rest as the host."""
    with pytest.raises(outbound.ProxyURIError, match="NUL"):
        outbound.parse_proxy_uri("socks4a://a%00b@127.0.0.1:1080")


# --- connect_via_proxy, in process ------------------------------------------------------------

KINDS = [("socks5", None), ("socks5", ("tor", "p@ss:word")), ("socks4a", None),
         ("http", None), ("http", ("tor", "secret"))]


def _uri(proxy, auth):
    if auth is None:
        return proxy.uri("id") if proxy.kind == "socks4a" else proxy.uri()
    from urllib.parse import quote
    return proxy.uri(quote(auth[0], safe=""), quote(auth[1], safe=""))


@pytest.mark.parametrize("kind, auth", KINDS)
def test_connect_via_proxy_relays_and_records(kind, auth):
    with EchoServer() as echo, FakeProxy(kind, auth) as proxy:
        with outbound.connect_via_proxy(_uri(proxy, auth), echo.address, deadline()) as sock:
            sock.sendall(b"through the proxy")
            assert recv_exact(sock, 17) == b"through the proxy"
        request = proxy.requests[0]
        assert request["target"] == echo.address
        if kind == "socks5":
            assert request["methods"] == (b"\x00\x02" if auth else b"\x00")
            assert request.get("auth") == auth and request["command"] == 1
        elif kind == "socks4a":
            assert request["userid"] == "id" and request["command"] == 1
        else:
            assert request["method"] == "CONNECT"
            assert request["headers"]["Host"] == "127.0.0.1:%d" % echo.address[1]


@pytest.mark.parametrize("kind", ["socks5", "socks4a", "http"])
def test_connect_via_proxy_sends_host_names_and_ipv6(kind):
    """Host names go to the proxy unresolved (SOCKS4a's reason to exist);
    IPv6 addresses too, where the request can carry them (not SOCKS4a)."""
    targets = [("bridge.example", 1051), ("xn--bcher-kva.example", 443)]
    if kind != "socks4a":
        targets.append(("2001:db8::7", 443))
    with FakeProxy(kind, refuse=True) as proxy:
        for target in targets:
            with pytest.raises(OSError):
                outbound.connect_via_proxy(proxy.uri(), target, deadline())
        assert [r["target"] for r in proxy.requests] == targets


def test_socks5_user_without_password_sends_an_empty_password():
    """RFC 1929 wants PLEN >= 1 and socks.socks5_userpass refuses less; a URI
    with a user and no password still authenticates, with PLEN=0."""
    with EchoServer() as echo, FakeProxy("socks5", auth=("tor", "")) as proxy:
        for uri in (proxy.uri("tor"), proxy.uri("tor", "")):     # socks5://tor@ and socks5://tor:@
            with outbound.connect_via_proxy(uri, echo.address, deadline()) as sock:
                sock.sendall(b"no password")
                assert recv_exact(sock, 11) == b"no password"
        assert [(r["auth"], r["plen"]) for r in proxy.requests] == [(("tor", ""), 0)] * 2


# --- Targets a request cannot carry never reach the proxy ------------------------------------

UNCARRIABLE = [
    ("socks5", ("evil.example\r\nX-Injected: yes", 443)),
    ("socks4a", ("evil.example\r\nX-Injected: yes", 443)),
    ("http", ("evil.example\r\nX-Injected: yes", 443)),      # would add a header line
    ("http", ("evil.example\n\nGET / HTTP/1.1", 80)),
    ("http", ("a b", 80)),
    ("socks5", ("a" * 300, 443)),                            # LEN is one byte
    ("socks4a", ("a" * 300, 443)),
    ("http", ("a." * 150, 443)),
    ("socks4a", ("2001:db8::7", 443)),                        # SOCKS4a has no IPv6
    ("socks5", ("fe80::1%eth0", 443)),                        # a scope cannot travel
]


@pytest.mark.parametrize("kind, target", UNCARRIABLE,
                         ids=["%s-%d" % (kind, i) for i, (kind, _) in enumerate(UNCARRIABLE)])
def test_target_a_request_cannot_carry_never_reaches_the_proxy(kind, target):
    with FakeProxy(kind) as proxy:
        with pytest.raises(outbound.ProxyError) as failure:
            outbound.connect_via_proxy(proxy.uri(), target, deadline())
        assert proxy.accepted == 0 and proxy.requests == [], "the proxy was asked"
    # The message names neither the target nor a part of it: the log scrubs addresses.
    assert "evil" not in str(failure.value) and "2001" not in str(failure.value)


# --- HTTP status lines that are not HTTP -------------------------------------------------------

@pytest.mark.parametrize("status", [
    b"HTTP/1.1 \xb200 OK",                 # latin-1 SUPERSCRIPT TWO: str.isdigit() says yes
    "HTTP/1.1 \u00b200 OK".encode(),        # the same in UTF-8
    "HTTP/1.1 \u0662\u0660\u0660 OK".encode(),   # Arabic-Indic 200
    b"HTTP/1.1 2OO OK", b"HTTP/1.1 20 OK", b"HTTP/1.1 2000 OK", b"HTTP/1.1", b"SSH-2.0-x",
], ids=["latin1-superscript", "utf8-superscript", "arabic-indic", "letters", "short", "long",
        "no-code", "not-http"])
def test_http_status_that_is_not_three_ascii_digits_is_a_proxy_error(status):
    with counting_listener() as destination, FakeProxy("http", status=status) as proxy:
        with pytest.raises(outbound.ProxyError, match="does not speak HTTP"):
            outbound.connect_via_proxy(proxy.uri(), destination.address, deadline())
        assert [r["target"] for r in proxy.requests] == [destination.address]
        assert destination.accepted == 0


@pytest.mark.parametrize("kind", ["socks5", "socks4a", "http"])
def test_bytes_glued_to_the_reply_belong_to_the_tunnel(kind):
    """The obfs2 server speaks first: its bytes may share a segment with the reply."""
    with EchoServer() as echo, FakeProxy(kind, glue=b"EARLY") as proxy:
        with outbound.connect_via_proxy(proxy.uri(), echo.address, deadline()) as sock:
            assert recv_exact(sock, 5) == b"EARLY"
            sock.sendall(b"then echo")
            assert recv_exact(sock, 9) == b"then echo"


@pytest.mark.parametrize("kind, error", [("socks5", ConnectionRefusedError),
                                         ("socks4a", outbound.ProxyError),
                                         ("http", outbound.ProxyError)])
def test_refusing_proxy_is_an_oserror_and_no_direct_connection(kind, error):
    with counting_listener() as destination:
        with FakeProxy(kind, refuse=True) as proxy:
            with pytest.raises(error):
                outbound.connect_via_proxy(proxy.uri(), destination.address, deadline())
        assert destination.accepted == 0


@pytest.mark.parametrize("kind", ["socks5", "http"])
def test_wrong_credentials(kind):
    with EchoServer() as echo, FakeProxy(kind, auth=("tor", "right")) as proxy:
        with pytest.raises(outbound.ProxyError):
            outbound.connect_via_proxy(proxy.uri("tor", "wrong"), echo.address, deadline())


def test_unreachable_proxy_is_never_bypassed():
    port = closed_port()[1]   # nothing listens there
    with counting_listener() as destination:
        with pytest.raises(outbound.ProxyError, match="cannot reach the socks5 proxy"):
            outbound.connect_via_proxy("socks5://127.0.0.1:%d" % port, destination.address, deadline())
        assert destination.accepted == 0


@pytest.mark.parametrize("kind", ["socks5", "socks4a", "http"])
def test_silent_proxy_times_out_on_the_deadline(kind):
    with FakeProxy(kind, silent=True) as proxy:
        with pytest.raises(socket.timeout):
            outbound.connect_via_proxy(proxy.uri(), ("127.0.0.1", 9), deadline(0.3))


# --- Through the real program ------------------------------------------------------------------

@pytest.mark.parametrize("kind, auth", [("socks5", ("tor", "pw")), ("socks4a", None),
                                        ("http", ("tor", "pw"))])
def test_external_client_with_proxy_option(kind, auth):
    payload = os.urandom(200_000)
    with EchoServer() as echo, FakeProxy(kind, auth) as upstream:
        server = Program("server", "--transport=obfs2", "--dest=%s:%d" % echo.address, "127.0.0.1:0")
        client = Program("client", "--transport=obfs2", "--proxy=" + _uri(upstream, auth), "127.0.0.1:0")
        with server, client:
            with socks5_connect(client.address, server.address) as sock:
                assert echo_round_trip(sock, payload) == payload
        assert [r["target"] for r in upstream.requests] == [server.address]


def test_managed_client_with_tor_pt_proxy(tmp_path):
    with EchoServer() as echo, FakeProxy("socks5", ("tor", "test1234")) as upstream:
        server = Program("server", "--transport=obfs2", "--dest=%s:%d" % echo.address, "127.0.0.1:0")
        env = tor_env(tmp_path / "state", CLIENT_TRANSPORTS="obfs2", EXIT_ON_STDIN_CLOSE="1",
                      PROXY=upstream.uri("tor", "test1234"))
        with server, ManagedPT(env) as pt:
            assert pt.keywords() == ["VERSION", "PROXY DONE", "CMETHOD", "CMETHODS DONE"]
            with socks5_connect(pt.cmethods["obfs2"], server.address) as sock:
                sock.sendall(b"via TOR_PT_PROXY")
                assert recv_exact(sock, 16) == b"via TOR_PT_PROXY"
        assert upstream.requests[0]["target"] == server.address
        assert upstream.requests[0]["auth"] == ("tor", "test1234")


def test_managed_client_honours_the_proxy_option(tmp_path):
    """--proxy on the torrc line, no TOR_PT_PROXY: used, but no PROXY DONE (Tor did not ask)."""
    with EchoServer() as echo, FakeProxy("http") as upstream:
        server = Program("server", "--transport=obfs2", "--dest=%s:%d" % echo.address, "127.0.0.1:0")
        env = tor_env(tmp_path / "state", CLIENT_TRANSPORTS="obfs2", EXIT_ON_STDIN_CLOSE="1")
        with server, ManagedPT(env, "--proxy=" + upstream.uri()) as pt:
            assert pt.keywords() == ["VERSION", "CMETHOD", "CMETHODS DONE"]
            with socks5_connect(pt.cmethods["obfs2"], server.address) as sock:
                sock.sendall(b"via --proxy")
                assert recv_exact(sock, 11) == b"via --proxy"
        assert upstream.requests[0]["target"] == server.address


@pytest.mark.parametrize("kind, code", [("socks5", 0x05), ("socks4a", 0x01), ("http", 0x01), (None, 0x01)])
def test_managed_client_proxy_failure_is_a_socks_error(tmp_path, kind, code):
    """A refusing (or absent) proxy: a SOCKS error reply, never a direct connection."""
    with counting_listener() as destination:
        if kind is None:
            uri = "socks5://127.0.0.1:%d" % closed_port()[1]
            upstream = None
        else:
            upstream = FakeProxy(kind, refuse=True)
            uri = upstream.uri()
        env = tor_env(tmp_path / "state", CLIENT_TRANSPORTS="obfs2", EXIT_ON_STDIN_CLOSE="1",
                      PROXY=uri)
        with ManagedPT(env) as pt:
            with pytest.raises(SocksReplyError) as info:
                socks5_connect(pt.cmethods["obfs2"], destination.address)
            assert info.value.code == code
        assert destination.accepted == 0
        if upstream:
            assert upstream.requests[0]["target"] == destination.address
            upstream.close()


@pytest.mark.parametrize("uri", ["ftp://127.0.0.1:21", "socks5://127.0.0.1", "socks4a://u:p@127.0.0.1:1080",
                                 "http://127.0.0.1:1080/path",
                                 # bytes that are not UTF-8, as Tor's environment may hold them
                                 os.fsdecode(b"socks5://z\xd5@\x08:4\xc7]"),
                                 os.fsdecode(b"socks5://u\xd5:p@127.0.0.1:1080"),
                                 os.fsdecode(b"socks4a://\xff@127.0.0.1:1080"),
                                 os.fsdecode(b"http://u:\xff@127.0.0.1:1080")],
                         ids=["ftp", "no-port", "socks4a-password", "path", "fuzzed", "socks5-user",
                              "socks4a-user", "http-password"])
def test_unusable_tor_pt_proxy_is_a_proxy_error(tmp_path, uri):
    env = tor_env(tmp_path / "state", CLIENT_TRANSPORTS="obfs2", EXIT_ON_STDIN_CLOSE="1", PROXY=uri)
    with ManagedPT(env) as pt:
        assert pt.wait(10) == 1
    assert pt.keywords() == ["VERSION", "PROXY-ERROR"]


def test_http_proxy_status_that_is_not_http_is_a_socks_failure():
    """The proxy answers "HTTP/1.1 \u00b200" (a digit to str.isdigit(), not to int()):
    the application gets a SOCKS failure and the log says why, at the default
    level, with no internal error."""
    with counting_listener() as destination, FakeProxy("http", status=b"HTTP/1.1 \xb200 OK") as upstream:
        with Program("client", "--transport=obfs2", "--proxy=" + upstream.uri(), "127.0.0.1:0") as client:
            with pytest.raises(SocksReplyError) as failure:
                socks5_connect(client.address, destination.address)
            assert failure.value.code == 0x01
            client.log.wait_for(r"\[NOTICE\] conn 1 .*cannot reach the obfs2 bridge \[scrubbed\] "
                                r"via the outgoing proxy: the proxy does not speak HTTP")
            client.stop()
        assert not [line for line in client.log.lines if "internal error" in line or "Traceback" in line]
        assert destination.accepted == 0


def socks4a_request(host, port):
    """VN=04 CD=01 DSTPORT DSTIP=0.0.0.1 USERID="" 00 HOST 00 (test_cli has its own copy)."""
    return struct.pack("!BBH4s", 4, 1, port, b"\0\0\0\1") + b"\0" + host + b"\0"


def test_socks4a_target_too_long_for_a_socks5_proxy_is_a_socks_failure():
    """SOCKS4a carries a 300-byte name; the SOCKS5 proxy's LEN byte could not:
    refused (5B) before anything reaches the proxy, with no internal error."""
    with FakeProxy("socks5") as upstream:
        with Program("client", "--transport=obfs2", "--proxy=" + upstream.uri(), "127.0.0.1:0") as client:
            with socket.create_connection(client.address, timeout=10) as sock:
                sock.sendall(socks4a_request(b"a" * 300, 443))
                assert recv_exact(sock, 8)[:2] == b"\x00\x5b"    # VN=00 CD=5B rejected
            client.log.wait_for(r"\[NOTICE\] conn 1 .*SOCKS4a host name is longer than 255 bytes")
            client.stop()
        assert not [line for line in client.log.lines if "internal error" in line or "Traceback" in line]
        assert upstream.accepted == 0


# === Outbound bind addresses ===============================================================

def peer_of_one_connection(sources):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        with outbound.connect(listener.getsockname(), 5, sources):
            conn, peer = listener.accept()
            conn.close()
    return peer[0]


def test_loopback_destinations_keep_the_default_source():
    assert peer_of_one_connection({socket.AF_INET: "127.0.0.2"}) == "127.0.0.1"
    assert peer_of_one_connection(None) == "127.0.0.1"


def test_other_destinations_get_the_source_of_their_family(monkeypatch):
    monkeypatch.setattr(outbound, "is_loopback", lambda host: False)
    assert peer_of_one_connection({socket.AF_INET: "127.0.0.2"}) == "127.0.0.2"
    # An IPv6 source is not used for an IPv4 destination.
    assert peer_of_one_connection({socket.AF_INET6: "::1"}) == "127.0.0.1"


@pytest.mark.parametrize("variable, value", [
    ("OUTBOUND_BIND_ADDRESS_V4", "not-an-address"),
    ("OUTBOUND_BIND_ADDRESS_V4", "::1"),
    ("OUTBOUND_BIND_ADDRESS_V6", "127.0.0.1"),
])
def test_a_bad_bind_address_is_an_env_error(tmp_path, variable, value):
    with ManagedPT(client_env(tmp_path, **{variable: value})) as pt:
        assert pt.keywords() == ["VERSION", "ENV-ERROR"], pt.messages
        assert pt.process.wait(10) != 0


def test_managed_client_with_bind_addresses_still_tunnels(tmp_path):
    env = client_env(tmp_path, OUTBOUND_BIND_ADDRESS_V4="127.0.0.2",
                     OUTBOUND_BIND_ADDRESS_V6="[::1]")
    with managed_echo_server(tmp_path) as server, ManagedPT(env) as client:
        assert client.keywords() == ["VERSION", "CMETHOD", "CMETHODS DONE"], client.messages
        with socks5_connect(client.cmethods["obfs2"], server.smethods["obfs2"]) as sock:
            sock.sendall(b"through the bridge")
            assert recv_exact(sock, 18) == b"through the bridge"


# === Deadlines ===============================================================================

def black_hole(family, host, port=0):
    """A listener whose accept queue is full: further SYNs are dropped, so a
    connect to it hangs. Returns (listener, port, the sockets filling it)."""
    listener = socket.socket(family)
    listener.bind((host, port))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket(family)
        filler.setblocking(False)
        try:
            filler.connect((host, port))
        except BlockingIOError:
            pass
        fillers.append(filler)
    outbound.ready(fillers[0], True, 2)   # the first one is in the queue
    return listener, port, fillers


@pytest.mark.skipif(not socket.has_ipv6, reason="needs IPv6")
def test_one_deadline_covers_every_address_of_a_name(monkeypatch):
    try:
        a, port, fill_a = black_hole(socket.AF_INET, "127.0.0.1")
        b, _, fill_b = black_hole(socket.AF_INET6, "::1", port)
    except OSError as exc:
        pytest.skip("cannot build black holes here: %s" % exc)
    real = socket.getaddrinfo

    def two_addresses(host, *args, **kwargs):  # a name with an A and an AAAA record
        if host == "bridge.test":
            return real("127.0.0.1", *args, **kwargs) + real("::1", *args, **kwargs)
        return real(host, *args, **kwargs)

    calls = []   # (timeout given, when the attempt ended) for each connect attempt
    real_create_connection = socket.create_connection

    def create_connection(address, timeout=None, **kwargs):
        try:
            return real_create_connection(address, timeout=timeout, **kwargs)
        finally:
            calls.append((timeout, time.monotonic()))

    monkeypatch.setattr(socket, "getaddrinfo", two_addresses)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    deadline = outbound.Deadline(1.0)
    try:
        with pytest.raises(OSError):
            outbound.open_connection(("bridge.test", port), deadline)
        # Each attempt gets only what the attempts before it left (not 1 s per
        # address): no attempt can end after the one deadline.
        assert calls and calls[0][0] <= 1.0, calls
        for (_, ended), (timeout, _) in zip(calls, calls[1:]):
            assert timeout <= deadline.end - ended, calls
    finally:
        for sock in [a, b] + fill_a + fill_b:
            sock.close()


def test_a_part_of_a_deadline_never_outlasts_it():
    """``within`` gives a part at most the time left, in the same turn;
    ``outside`` without a turn changes nothing."""
    deadline = outbound.Deadline(5.0, turn="a turn")
    part = deadline.within(60.0)
    assert part.end <= deadline.end and part.turn == "a turn"
    assert deadline.within(1.0).end < deadline.end
    with outbound.Deadline(5.0).outside():
        pass
