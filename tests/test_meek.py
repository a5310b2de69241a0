"""meek's protocol parts, sans-IO: the poll schedule, session ids, the HTTP reader (every
split of the same bytes reads the same), Go's answers, the client's request and config."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import meek


def test_the_poll_schedule_grows_by_half_to_five_seconds_and_starts_over_on_data():
    schedule = meek.PollSchedule()
    waits = [schedule.after(0, 0) for _ in range(12)]
    assert waits[0] == pytest.approx(0.15)          # after the handshake's empty poll: 0.1 * 1.5
    schedule = meek.PollSchedule()
    assert schedule.after(10, 0) == 0.0             # sent bytes: at once
    assert schedule.after(0, 0) == pytest.approx(0.1)
    expected = [0.1 * 1.5 ** n for n in range(1, 10)]
    got = [schedule.after(0, 0) for _ in range(9)]
    assert got == pytest.approx([min(value, 5.0) for value in expected])
    assert schedule.after(0, 0) == 5.0
    assert schedule.after(0, 7) == 0.0              # received bytes: at once, and start over
    assert schedule.after(0, 0) == pytest.approx(0.1)


def test_session_ids_are_meek_lite_s_32_hex_digits():
    ids = {meek.new_session_id() for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"[0-9a-f]{32}", sid) for sid in ids)
    assert meek.new_session_id(lambda n: b"\0" * n) == \
        "f5a5fd42d16a20302798ef6ed309979b"           # SHA-256 of 64 zero bytes, cut to 16 bytes


REQUEST = (b"POST /meek/ HTTP/1.1\r\nHost: b.test\r\nX-Session-Id: 0123456789abcdef\r\n"
           b"Content-Length: 5\r\n\r\nhello")
CHUNKED = (b"POST /meek/ HTTP/1.1\r\nHost: b.test\r\nX-Session-Id: 0123456789abcdef\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;x=y\r\nlo\r\n0\r\n\r\n")
RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 3\r\n\r\nabc"
GO_CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n4\r\nwxyz\r\n0\r\n\r\n")


def read_all(data, requests, split):
    reader = meek.MessageReader(requests=requests)
    out, at = [], 0
    while at < len(data):
        step = split(len(data) - at)
        reader.feed(data[at:at + step])
        at += step
        while True:
            message = reader.next()
            if message is None:
                break
            out.append((message.method, message.status, message.body, message.keep_alive))
    return out


@settings(deadline=None, max_examples=60)
@given(st.lists(st.integers(1, 40), min_size=1))
def test_every_split_reads_the_same_messages(sizes):
    steps = iter(sizes * 200)

    def split(left):
        return min(left, next(steps, left))
    requests = REQUEST + CHUNKED + REQUEST
    assert read_all(requests, True, split) == read_all(requests, True, lambda n: n) == \
        [("POST", None, b"hello", True)] * 3
    responses = RESPONSE + GO_CHUNKED
    assert read_all(responses, False, split) == [(None, 200, b"abc", True), (None, 200, b"wxyz", True)]


@pytest.mark.parametrize("data, status", [
    (b"POST / HTTP/1.1\r\nHost: b\r\nContent-Length: 70000\r\n\r\n", "413 Request Entity Too Large"),
    (b"POST / HTTP/1.1\r\nHost: b\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
     "400 Bad Request"),
    (b"POST / HTTP/1.1\r\nHost: b\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "400 Bad Request"),
    (b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", "400 Bad Request: missing required Host header"),
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "400 Bad Request"),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX Y: b\r\n\r\n", "400 Bad Request: invalid header name"),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: \x01\r\n\r\n", "400 Bad Request: invalid header value"),
    (b"GET / HTTP/3.0\r\nHost: a\r\n\r\n", "505 HTTP Version Not Supported: unsupported protocol version"),
    (b"POST / HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: gzip\r\n\r\n", "501 Not Implemented"),
    (b"POST / HTTP/1.1\r\nHost: b\r\nTransfer-Encoding: chunked\r\n\r\n10001\r\n",
     "413 Request Entity Too Large"),
    (b"POST / HTTP/1.1\r\nHost: b\r\nX: " + b"y" * meek.MAX_REQUEST_HEAD + b"\r\n\r\n",
     "431 Request Header Fields Too Large"),
    (b"GET / HTTP/1.1\r\nHost: b\r\nX: " + b"y" * meek.MAX_REQUEST_HEAD,
     "431 Request Header Fields Too Large"),
    (b"\x16\x03\x01\x00\x10garbage\r\n\r\n", "400 Bad Request"),
    (b"GET / SPDY/3\r\n\r\n", "400 Bad Request"),
    (b"GET / HTTP/1.1\r\nHost: a\r\nno colon\r\n\r\n", "400 Bad Request"),
    (b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", "400 Bad Request: missing required Host header"),
    (b"GET / HTTP/1.1\r\n folded\r\nHost: a\r\n\r\n", "400 Bad Request"),
])
def test_what_the_reader_refuses_and_the_status_it_names(data, status):
    reader = meek.MessageReader(requests=True)
    reader.feed(data)
    with pytest.raises(meek.HTTPError) as error:
        reader.next()
    assert error.value.status == status


def test_a_body_over_the_limit_is_its_own_error_with_the_version():
    for data in (b"POST / HTTP/1.1\r\nHost: b\r\nContent-Length: 65538\r\n\r\n",
                 b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n10002\r\n"):
        reader = meek.MessageReader(requests=True, max_body=meek.MAX_REQUEST_BODY)
        reader.feed(data)
        with pytest.raises(meek.BodyTooLarge) as error:
            reader.next()
        assert error.value.version == data.split(b"\r\n")[0][-3:].decode()
    reader = meek.MessageReader(requests=True, max_body=meek.MAX_REQUEST_BODY)
    reader.feed(b"POST / HTTP/1.1\r\nHost: b\r\nContent-Length: 65537\r\n\r\n" + b"x" * 65537)
    assert len(reader.next().body) == 65537


def test_requests_are_read_as_go_reads_them():
    """Bare LF line ends, a head of 1 MiB, bytes without a line end waiting for more,
    and the HTTP/2 preface as a request without a body that ends the connection."""
    assert read_all(b"GET / HTTP/1.1\nHost: b\nConnection: close\n\n", True, lambda n: n) == \
        [("GET", None, b"", False)]
    big = b"GET / HTTP/1.1\r\nHost: b\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
    assert read_all(big, True, lambda n: 65536) == [("GET", None, b"", True)]
    reader = meek.MessageReader(requests=True)
    reader.feed(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40)
    assert reader.next() is None
    folded = request(b"GET / HTTP/1.2\r\nHost: b\r\nX: a\r\n\tb\r\n: skipped\r\n\r\n")
    assert (folded.version, folded.keep_alive, folded.fields) == ("1.2", True, {"host": ["b"], "x": ["a b"]})
    preface = request(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert (preface.method, preface.target, preface.version, preface.keep_alive) == \
        ("PRI", "*", "2.0", False)


def test_the_reader_says_what_it_holds_and_can_drop_it():
    """What the server counts against its budget for long heads: the bytes held."""
    reader = meek.MessageReader(requests=True)
    reader.feed(b"GET / HTTP/1.1\r\nHost: b\r\nX: " + b"a" * 50000)
    assert reader.next() is None and reader.buffered == 28 + 50000
    reader.drop()
    assert reader.buffered == 0 and reader.idle
    reader.feed(b"GET / HTTP/1.1\r\nHost: b\r\n\r\nGET")
    assert reader.next().method == "GET" and reader.buffered == 3


def test_go_writes_connection_close_last_and_chunks_a_large_body():
    small = meek.go_response(200, b"abc", content_type=meek.OCTETS, close=True, date=0)
    assert small == (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\nContent-Length: 3\r\n"
                     b"Connection: close\r\n\r\nabc")
    body = bytes(range(256)) * 9
    large = meek.go_response(200, body, content_type=meek.OCTETS, close=True, date=0)
    assert large == (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                     b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\nConnection: close\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n900\r\n" + body + b"\r\n0\r\n\r\n")
    assert read_all(large, False, lambda n: n) == [(None, 200, body, False)]
    assert len(meek.go_response(200, b"x" * 2048)) < len(meek.go_response(200, b"x" * 2049))
    assert b"Content-Length: 2048\r\n" in meek.go_response(200, b"x" * 2048)
    old = meek.go_response(200, b"abc", close=True, version="1.0")
    assert old.startswith(b"HTTP/1.0 200 OK\r\n") and b"Connection" not in old
    assert meek.go_body_too_large(date=0) == (b"HTTP/1.1 200 OK\r\nConnection: close\r\n"
                                              b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n"
                                              b"Content-Length: 0\r\n\r\n")


def test_http_1_0_and_connection_close_end_keep_alive():
    def keeps(text):
        return read_all(text, True, lambda n: n)[0][3]
    assert keeps(b"GET / HTTP/1.0\r\n\r\n") is False
    assert keeps(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n") is True
    assert keeps(b"GET / HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n") is False


def test_a_response_without_a_length_is_read_to_the_end():
    reader = meek.MessageReader(requests=False)
    reader.feed(b"HTTP/1.0 200 OK\r\n\r\nall of it")
    assert reader.next() is None
    reader.eof()
    message = reader.next()
    assert (message.body, message.keep_alive) == (b"all of it", False)


def request(text):
    reader = meek.MessageReader(requests=True)
    reader.feed(text)
    return reader.next()


@pytest.mark.parametrize("text, first_line", [
    (b"GET / HTTP/1.1\r\nHost: b\r\n\r\n", b"HTTP/1.1 200 OK"),
    (b"GET //./a/.. HTTP/1.1\r\nHost: b\r\n\r\n", b"HTTP/1.1 200 OK"),     # path.Clean: "/"
    (b"GET /?q=1 HTTP/1.1\r\nHost: b\r\n\r\n", b"HTTP/1.1 200 OK"),
    (b"GET /meek/ HTTP/1.1\r\nHost: b\r\n\r\n", b"HTTP/1.1 404 Not Found"),
    (b"HEAD / HTTP/1.1\r\nHost: b\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
    (b"OPTIONS * HTTP/1.1\r\nHost: b\r\n\r\n", b"HTTP/1.1 200 OK"),
    (b"OPTIONS / HTTP/1.1\r\nHost: b\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
    (b"PRI * HTTP/2.0\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
    (b"GET / HTTP/1.0\r\n\r\n", b"HTTP/1.0 200 OK"),
    (b"POST / HTTP/1.1\r\nHost: b\r\nX-Session-Id: 1234567\r\n\r\n", b"HTTP/1.1 400 Bad Request"),
])
def test_go_s_answers(text, first_line):
    reply = meek.answer(request(text), date=0)
    assert reply.split(b"\r\n", 1)[0] == first_line
    assert b"\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\n" in reply
    if first_line.endswith(b"400 Bad Request") and not text.startswith(b"HEAD"):
        assert reply.endswith(b"\r\n\r\nBad request.\n")
    if text.startswith(b"HEAD"):
        assert reply.endswith(b"\r\n\r\n")      # no body after a HEAD


def test_a_post_with_a_session_id_of_8_goes_to_its_session():
    assert meek.answer(request(b"POST /x HTTP/1.1\r\nHost: b\r\nX-Session-Id: 12345678\r\n\r\n")) is None


def test_the_client_address_for_tor():
    forwarded = request(b"POST / HTTP/1.1\r\nHost: b\r\nX-Forwarded-For: 198.51.100.7, 10.0.0.1\r\n\r\n")
    assert meek.client_address(forwarded, ("127.0.0.1", 5)) == ("198.51.100.7", 1)
    meek_ip = request(b"POST / HTTP/1.1\r\nHost: b\r\nMeek-IP: 2001:db8::1\r\n"
                      b"X-Forwarded-For: 1.2.3.4\r\n\r\n")
    assert meek.client_address(meek_ip, None) == ("2001:db8::1", 1)
    plain = request(b"POST / HTTP/1.1\r\nHost: b\r\n\r\n")
    assert meek.client_address(plain, ("203.0.113.5", 40000)) == ("203.0.113.5", 1)


def test_front_is_dialled_and_named_in_sni_while_the_url_s_host_goes_in_host():
    config = meek.client_config({"url": "https://meek.example:8443/path?x=1", "front": "cdn.example"})
    assert (config.address, config.servername, config.host, config.target) == \
        (("cdn.example", 443), "cdn.example", "meek.example:8443", "/path?x=1")
    plain = meek.client_config({"url": "http://127.0.0.1:8080/"})
    assert (plain.address, plain.servername, plain.context) == (("127.0.0.1", 8080), None, None)
    assert meek.Meek.routes(config, ("192.0.2.3", 2)) == [(("cdn.example", 443), config)]


@pytest.mark.parametrize("options, words", [
    ({}, "meek needs url="),
    ({"url": "ftp://x/"}, "scheme"),
    ({"url": "https:///x"}, "no host"),
    ({"url": "https://x/", "front": "y:port"}, "bad port"),
    ({"url": "https://x/", "cert": "AAAA"}, "unknown meek argument"),
])
def test_bad_client_arguments_say_which(options, words):
    with pytest.raises(ValueError, match=words):
        meek.client_config(options)


@pytest.mark.parametrize("options, words", [
    ({"tls-cert": "/x"}, "go together"),
    ({"session-idle": "0"}, "positive"),
    ({"max-sessions": "many"}, "positive"),
    ({"url": "https://x/"}, "unknown meek server option"),
])
def test_bad_server_options_say_which(options, words):
    with pytest.raises(ValueError, match=words):
        meek.server_config(options)


def test_the_request_looks_like_a_fetch_post_of_the_url_s_site():
    config = meek.client_config({"url": "https://meek.example/p", "front": "cdn.example"})
    wire = meek.build_request(config, "a" * 32, b"\x00\x01")
    head, _, body = wire.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /p HTTP/1.1" and body == b"\x00\x01"
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert fields["Host"] == "meek.example" and fields["Content-Length"] == "2"
    assert fields["X-Session-Id"] == "a" * 32 and fields["Origin"] == "https://meek.example"
    assert fields["Sec-Fetch-Mode"] == "cors" and "Chrome/" in fields["User-Agent"]
    assert [line.split(":")[0] for line in lines[1:4]] == ["Host", "Connection", "Content-Length"]


def test_only_200_with_meek_s_bytes_opens_the_client():
    config = meek.client_config({"url": "http://b.test/meek/"})
    for response, words in [
            (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "answered 404.*path of url="),
            (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nhi",
             "a page .*check the path of url="),
            (b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n", "refuses the Host"),
            (b"SSH-2.0-OpenSSH\r\n\r\n", "not HTTP")]:
        client = meek.Meek(True, config)
        assert client.start().startswith(b"POST /meek/ HTTP/1.1\r\nHost: b.test\r\n")
        with pytest.raises(meek.ProtocolError, match=words):
            client.receive(response)
    client = meek.Meek(True, config)
    client.start()
    assert client.receive(RESPONSE) == b"abc" and client.is_open
