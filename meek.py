r"""meek: Tor's bytes as the bodies of HTTP requests, both roles.

What meek is
------------
The client sends what Tor gives it as the body of HTTPS POST requests to a web
site, and reads what the bridge sends back from the bodies of the responses. A
session is named by an ``X-Session-Id`` header; the bridge (meek-server) keeps,
per session, one connection to Tor's ORPort. HTTP cannot push: the bridge
answers only a request, so the client polls with empty bodies when it has
nothing to send, at a growing interval. With domain fronting (``front=``), the
name a censor sees in DNS and in the TLS SNI is the front's; the URL's host,
the real destination, travels inside TLS in the ``Host`` header.

This is the first transport of the project whose connection is not one TCP
stream: one session spans many requests, and on the bridge one HTTP
connection may carry requests of many sessions (a reverse proxy's keep-alive
connections). It owns its connections (the seam in transports.py): the
protocol below is sans-IO, and the connection objects further down hold the
sockets and the timers, driven by the pump (relay.py) like a relay.

The protocol (upstream meek 0.37 and obfs4proxy's meek_lite, read as facts)
--------------------------------------------------------------------------
* Request: ``POST <url path>`` with ``X-Session-Id``, a body of at most
  ``MAX_PAYLOAD`` (64 KiB) bytes, possibly empty (a poll). One request at a time
  per session; the next goes only after the answer to the last.
* Response: ``200 OK``, the body at most 64 KiB: what Tor sent within
  ``TURNAROUND`` (10 ms) of the request's body reaching it (the server reads
  once, as soon as something comes). Anything but 200 fails the session.
* Polling (client): after a request that sent or received bytes, the next at
  once; after the first empty exchange, ``POLL_INITIAL`` (100 ms), then 1.5
  times longer each time up to ``POLL_MAX`` (5 s) (``PollSchedule``).
* Session id: meek_lite's form, 32 lower-case hex digits (the first 16 bytes
  of SHA-256 of 64 random bytes; upstream meek-client's is 8 random bytes in
  unpadded base64). The server refuses ids shorter than 8 characters (400).
* Server: a session unused for ``SESSION_IDLE`` (120 s) is closed with its
  ORPort connection. ``GET /`` answers a small plain page; any other GET a 404,
  any other method and a POST without a valid session id a 400, a session that
  cannot reach Tor a 500, each with Go's ``net/http`` words and fields
  (``go_response``), since meek-server is a Go program facing the front. The
  server reads requests as ``net/http`` does too (``MessageReader``: bare LF,
  heads up to 1 MiB + 4 KiB, ``OPTIONS *``, the HTTP/2 preface, a body over
  64 KiB + 1 answered with an empty 200) and closes a connection that sends no
  whole request within ``READ_TIMEOUT`` (20 s).
  The client's address for Tor's Extended ORPort is the first element of
  ``Meek-IP`` or ``X-Forwarded-For``, else the TCP peer, with port 1.

Notation (upstream name -> code)
--------------------------------
==========================  =================================================
maxPayloadLength            ``MAX_PAYLOAD``
turnaroundTimeout           ``TURNAROUND``
maxSessionStaleness         ``SESSION_IDLE`` (server option ``session-idle=``)
minSessionIDLength          ``MIN_SESSION_ID``
init/maxPollInterval, x1.5  ``PollSchedule``
url=, front=                ``ClientConfig.url``, ``.front``; Host: ``.host``
==========================  =================================================

What a censor sees
------------------
The front's name (SNI, DNS) and address, the TLS ClientHello (Chrome's through
the browser route, else Python's OpenSSL one: ``webtunnel.hello_route``), and
the traffic's shape: a long series of requests and responses whose sizes
follow Tor's cells, at most 64 KiB each, and, when idle, the polling rhythm
(100 ms, 150 ms, 225 ms, ... 5 s, back to 100 ms on data). What it does not
see: the URL's host and path, the session id and the bytes, all inside TLS.
"""

import hashlib
import os
import posixpath
import re
import ssl
import time
from collections import namedtuple
from email.utils import formatdate
from urllib.parse import unquote, urlsplit

import webtunnel

MAX_PAYLOAD = 0x10000         # bytes in one request's or response's body, at most
TURNAROUND = 0.010            # seconds the server waits for Tor's answer to a request
SESSION_IDLE = 120.0          # seconds: an unused session is closed
MIN_SESSION_ID = 8            # characters: shorter session ids are refused
POLL_INITIAL = 0.1            # seconds: the first wait after an empty exchange
POLL_MAX = 5.0
POLL_MULTIPLIER = 1.5
MAX_SESSIONS = 4096           # sessions one server keeps at once (server option max-sessions=)
MAX_DIALS = 64                # new sessions dialling Tor at once (each on a short thread)
MAX_HEAD = webtunnel.MAX_HEAD  # a response head (the client's reader), terminator included
MAX_REQUEST_HEAD = (1 << 20) + 4096  # a request head: Go's DefaultMaxHeaderBytes and its slack
MAX_REQUEST_BODY = MAX_PAYLOAD + 1   # upstream reads a body through MaxBytesReader(64 KiB + 1)
HEAD_BUDGET = 64 << 20       # bytes of request heads past MAX_HEAD, one listener's connections
                              # together; past it a long head is answered 431 (Go: no such limit)
CHUNK_OVER = 2048             # Go's server chunks a body it has not seen end within this many bytes
FORWARDED_PORT = 1            # the port upstream gives the client address it reports to Tor

COVER_PAGE = "I\u2019m just a happy little web server.\n".encode("utf-8")
TEXT = "text/plain; charset=utf-8"
OCTETS = "application/octet-stream"

CLIENT_OPTIONS = ("url", "front", "utls")
SERVER_OPTIONS = ("tls-cert", "tls-key", "session-idle", "max-sessions")


class ProtocolError(Exception):
    """The peer is not speaking meek to us: an answer that is not 200, a message
    that is not HTTP, a body over 64 KiB. ``.data``: plaintext decoded before it."""

    reply = b""
    data = b""

    def __init__(self, message, data=b""):
        Exception.__init__(self, message)
        self.data = bytes(data)


# --- Polling, session ids -------------------------------------------------------------

class PollSchedule:
    """When the client's next request goes, after an exchange (upstream's rule):
    at once after one that carried bytes either way; after the first empty one,
    POLL_INITIAL; then each empty one multiplies the wait by POLL_MULTIPLIER, up to
    POLL_MAX. ``after(sent, received)`` -> seconds to wait."""

    def __init__(self, initial=POLL_INITIAL, most=POLL_MAX, multiplier=POLL_MULTIPLIER):
        self.initial, self.most, self.multiplier = initial, most, multiplier
        self.interval = initial

    def after(self, sent, received):
        if sent or received:
            self.interval = 0.0
        elif self.interval == 0.0:
            self.interval = self.initial
        else:
            self.interval = min(self.interval * self.multiplier, self.most)
        return self.interval


def new_session_id(random=os.urandom):
    """meek_lite's session id: 32 hex digits, SHA-256 of 64 random bytes cut to 16."""
    return hashlib.sha256(random(64)).hexdigest()[:32]


# --- HTTP messages, sans-IO -------------------------------------------------------------

_REQUEST_LINE = re.compile(r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (\S+) HTTP/(\d\.\d)\Z")
_HEAD_END = re.compile(rb"\n\r?\n")
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_BAD_FIELD_BYTE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_STATUS_LINE = re.compile(r"HTTP/(1\.[01]) (\d\d\d)(?: (.*))?\Z")
_NOT_REQUEST_LINE = re.compile(rb"[^\x20-\x7e]")
_NOT_STATUS_LINE = re.compile(rb"[^\x09\x20-\x7e\x80-\xff]")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,8})[ \t]*(?:;[^\r\n]*)?\Z")

Message = namedtuple("Message", "method target status version fields body keep_alive")
Message.__doc__ = """One HTTP message: a request (method, target) or a response (status).
``fields``: {lower-case name: [values]}; ``keep_alive``: the connection may carry another."""


class HTTPError(Exception):
    """Bytes that are not an acceptable HTTP message; ``status``: what a server answers
    ("400 Bad Request", "431 Request Header Fields Too Large", ...)."""

    def __init__(self, message, status="400 Bad Request"):
        Exception.__init__(self, message)
        self.status = status


class BodyTooLarge(HTTPError):
    """A request body over the reader's ``max_body``: Go's server answers it (meek-server
    reads bodies through MaxBytesReader) with an empty 200 and closes. ``version``: the
    request's HTTP version."""

    def __init__(self, message, version):
        HTTPError.__init__(self, message, "413 Request Entity Too Large")
        self.version = version


def _request_fields(lines):
    """({lower-case name: [values]}, the HTTPError Go's server gives for a bad name or
    value, or None) of a request's header lines, judged as Go's net/http judges them: a
    line without a colon is refused at once; a folded line continues the one before; an
    empty name is skipped; a bad name or value is refused only after the Host check,
    which comes first there. No error quotes a line (a session id, a secret path)."""
    fields, fault, last = {}, None, None
    for line in lines:
        if line[:1] in (" ", "\t"):
            if last is None:
                raise HTTPError("a folded first header line")
            values = fields[last]
            values[-1] = (values[-1] + " " + line.strip(" \t")).strip(" \t")
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise HTTPError("a header line without a colon")
        if not name:
            continue
        if fault is None and not _FIELD_NAME.match(name):
            fault = HTTPError("a bad header name", "400 Bad Request: invalid header name")
        if fault is None and _BAD_FIELD_BYTE.search(value):
            fault = HTTPError("a bad header value", "400 Bad Request: invalid header value")
        last = name.lower()
        fields.setdefault(last, []).append(value.strip(" \t"))
    return fields, fault


class MessageReader:
    """HTTP/1.x messages from bytes as they come, one after another on a keep-alive
    connection: requests (``requests=True``, a server) or responses. Bodies by
    Content-Length or chunked, at most ``max_body`` bytes (``HTTPError`` beyond:
    "413", ``BodyTooLarge`` for a request). A response without either is read to the
    end of the stream (``eof()``). A request head is read as Go's net/http reads it
    (meek-server faces the front): lines may end in a bare LF, the head may be up to
    ``MAX_REQUEST_HEAD`` bytes, and ``PRI * HTTP/2.0`` is a request (without a body,
    the connection closing after it).
    ``feed(data)``, then ``next()`` -> a Message or None (more bytes needed).
    Every byte is scanned a bounded number of times however the input is split."""

    def __init__(self, requests, max_body=MAX_PAYLOAD):
        self.requests, self.max_body = requests, max_body
        self._buffer = bytearray()
        self._ended = False
        self._reset()

    def _reset(self):
        self._head = None            # (line match, fields) once the head is complete
        self._scanned = 0            # how far the search for the head's end has gone
        self._length = None          # the body's length (Content-Length), or
        self._chunked = False        # ... its chunks
        self._body = bytearray()
        self._chunk_left = None      # chunked: bytes of the current chunk still to come
        self._to_eof = False
        self._fault = None           # a request's bad header, refused after the Host check

    def feed(self, data):
        self._buffer += data

    def eof(self):
        """The stream ended: a response read to its end is complete."""
        self._ended = True

    @property
    def idle(self):
        """Nothing of a next message has come yet."""
        return not self._buffer and self._head is None

    @property
    def buffered(self):
        """Bytes held that no message has taken yet (a head still coming, at most)."""
        return len(self._buffer)

    def drop(self):
        """Forget every byte held (the connection is being refused)."""
        self._buffer = bytearray()
        self._reset()

    def next(self):
        if self._head is None and not self._read_head():
            return None
        if not self._read_body():
            return None
        match, fields = self._head
        body = bytes(self._body)
        if self.requests:
            method, target, version = match.groups()
            status = None
        else:
            version, status = match.group(1), int(match.group(2))
            method = target = None
        connection = webtunnel.tokens(fields, "connection")
        keep_alive = not self._to_eof and (
            "keep-alive" in connection if version == "1.0" else "close" not in connection)
        self._reset()
        return Message(method, target, status, version, fields, body, keep_alive)

    def _read_head(self):
        buffer = self._buffer
        if not buffer:
            return False
        if self.requests:
            return self._read_request_head()
        while buffer[:2] == b"\r\n":   # a blank line between responses is tolerated
            del buffer[:2]
        try:
            line = webtunnel.first_line(buffer, _NOT_STATUS_LINE)
            if line is None:
                return False
            head = webtunnel.split_head(buffer, max(self._scanned, len(line)))
            if head is None:
                self._scanned = max(0, len(buffer) - 3)
                return False
            lines, _ = head
            fields = webtunnel.parse_fields(lines)
        except webtunnel.HeadError as exc:
            raise HTTPError("not HTTP (%s)" % exc)
        match = _STATUS_LINE.match(line)
        if match is None:
            raise HTTPError("not an HTTP/1.x status line: %r" % line[:100])
        del buffer[:buffer.find(b"\r\n\r\n") + 4]
        self._framing(match, fields)
        self._head = (match, fields)
        return True

    def _read_request_head(self):
        """Go's way: wait for the blank line (CR LF or bare LF), up to MAX_REQUEST_HEAD
        bytes; only then judge the lines (so bytes that are not HTTP wait, as there)."""
        buffer = self._buffer
        end = _HEAD_END.search(buffer, self._scanned, MAX_REQUEST_HEAD)
        if end is None:
            if len(buffer) >= MAX_REQUEST_HEAD:
                raise HTTPError("a head longer than %d bytes" % MAX_REQUEST_HEAD,
                                "431 Request Header Fields Too Large")
            self._scanned = max(0, len(buffer) - 2)
            return False
        lines = bytes(buffer[:end.start()]).split(b"\n")
        lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
        try:
            text = [line.decode("latin-1") for line in lines]
            if _NOT_REQUEST_LINE.search(lines[0]):
                raise webtunnel.HeadError("a byte that is not visible ASCII in the request line")
        except webtunnel.HeadError:
            raise HTTPError("not HTTP (a byte that is not visible ASCII in the request line)")
        match = _REQUEST_LINE.match(text[0])
        if match is None:
            raise HTTPError("not an HTTP request line")
        fields, self._fault = _request_fields(text[1:])
        del buffer[:end.end()]
        self._scanned = 0
        self._framing(match, fields)
        self._head = (match, fields)
        return True

    def _framing(self, match, fields):
        """How the body is delimited, with RFC 9112's refusals (request smuggling)."""
        lengths = fields.get("content-length", ())
        coding = webtunnel.tokens(fields, "transfer-encoding")
        if len(set(lengths)) > 1:
            raise HTTPError("%d different Content-Length fields" % len(lengths))
        if lengths and coding:
            raise HTTPError("both Content-Length and Transfer-Encoding")
        if coding and coding != ["chunked"]:
            raise HTTPError("a transfer coding other than chunked", "501 Not Implemented")
        if self.requests:
            # Go's order: the HTTP/2 preface, Host fields, framing, version, Host, names.
            method, target, version = match.groups()
            preface = (method, target, version) == ("PRI", "*", "2.0")
            if len(fields.get("host", ())) > 1:
                raise HTTPError("more than one Host field")
            if preface:
                if self._fault is not None:
                    raise self._fault
                self._length, self._to_eof = 0, True   # no body is read; the connection closes
                return
        if self.requests:
            version = match.group(3)
            if version[0] != "1":
                raise HTTPError("HTTP/%s" % version,
                                "505 HTTP Version Not Supported: unsupported protocol version")
            if version != "1.0" and not fields.get("host"):
                raise HTTPError("no Host field", "400 Bad Request: missing required Host header")
            if self._fault is not None:
                raise self._fault
        if coding:
            self._chunked = True
        elif lengths:
            if not lengths[0].isdigit() or len(lengths[0]) > 12:
                raise HTTPError("a bad Content-Length")
            self._length = int(lengths[0])
            if self._length > self.max_body and self.requests:
                raise BodyTooLarge("a body of %d bytes (at most %d)" % (self._length, self.max_body),
                                   match.group(3))
            if self._length > self.max_body:
                raise HTTPError("a body of %d bytes (at most %d)" % (self._length, self.max_body),
                                "413 Request Entity Too Large")
        elif self.requests:
            self._length = 0
        else:
            status = int(match.group(2))
            self._length = 0 if status in (204, 304) or status < 200 else None
            self._to_eof = self._length is None

    def _read_body(self):
        buffer = self._buffer
        if self._length is not None:
            take = min(self._length - len(self._body), len(buffer))
            self._body += buffer[:take]
            del buffer[:take]
            return len(self._body) == self._length
        if self._to_eof:
            self._body += buffer
            del buffer[:]
            if len(self._body) > self.max_body:
                raise HTTPError("a body over %d bytes" % self.max_body, "413 Request Entity Too Large")
            return self._ended
        while True:        # chunked
            if self._chunk_left is None:
                end = buffer.find(b"\r\n", 0, 200)
                if end < 0:
                    if len(buffer) >= 200:
                        raise HTTPError("a chunk-size line over 200 bytes")
                    return False
                size = _CHUNK_SIZE.match(bytes(buffer[:end]))
                if size is None:
                    raise HTTPError("a bad chunk-size line")
                del buffer[:end + 2]
                self._chunk_left = int(size.group(1), 16)
                if len(self._body) + self._chunk_left > self.max_body and self.requests:
                    raise BodyTooLarge("a body over %d bytes" % self.max_body, self._head[0].group(3))
                if len(self._body) + self._chunk_left > self.max_body:
                    raise HTTPError("a body over %d bytes" % self.max_body, "413 Request Entity Too Large")
                if self._chunk_left == 0:
                    self._chunk_left = -1      # the last chunk: trailers follow
            if self._chunk_left == -1:
                end = buffer.find(b"\r\n\r\n") if buffer[:2] != b"\r\n" else -2
                if end == -1:
                    if len(buffer) >= MAX_HEAD:
                        raise HTTPError("trailers over %d bytes" % MAX_HEAD)
                    return False
                del buffer[:end + 4]
                self._chunk_left = None
                return True
            take = min(self._chunk_left, len(buffer))
            self._body += buffer[:take]
            del buffer[:take]
            self._chunk_left -= take
            if self._chunk_left:
                return False
            if len(buffer) < 2:
                return False
            if buffer[:2] != b"\r\n":
                raise HTTPError("a chunk not followed by CR LF")
            del buffer[:2]
            self._chunk_left = None


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Request Entity Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            501: "Not Implemented"}


def go_response(status, body=b"", content_type=TEXT, nosniff=False, close=False, date=None,
                head=False, version="1.1"):
    """A response as Go's net/http writes it (meek-server is a Go program): the status
    line in the request's version, the handler's fields sorted, then Date and
    Content-Length, then ``Connection: close`` when the connection ends after it (an
    HTTP/1.0 request's ends without one); no body after a HEAD. A body over CHUNK_OVER
    bytes goes chunked, in one chunk, as Go's buffered writer sends one large write (to
    an HTTP/1.0 request: no length, the connection's end ends it)."""
    lines = ["HTTP/%s %d %s" % ("1.0" if version == "1.0" else "1.1", status, _REASONS[status])]
    if content_type:
        lines.append("Content-Type: " + content_type)
    if nosniff:
        lines.append("X-Content-Type-Options: nosniff")
    if date is not None:
        lines.append("Date: " + formatdate(date, usegmt=True))
    body = bytes(body)
    large = len(body) > CHUNK_OVER and not head
    length = "Content-Length: %d" % len(body)
    if version == "1.0":
        lines.extend(([] if large else [length]) + ([] if close or large else ["Connection: keep-alive"]))
    else:
        tail = ["Connection: close"] if close else []
        if large:
            lines.extend(tail + ["Transfer-Encoding: chunked"])
            body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
        else:
            lines.extend([length] + tail)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head else body)


def go_error(status, text, close=False, date=None, head=False, version="1.1"):
    """Go's http.Error: the text and a newline, plain text, nosniff."""
    return go_response(status, (text + "\n").encode("utf-8"), nosniff=True, close=close, date=date,
                       head=head, version=version)


def go_body_too_large(date=None, version="1.1"):
    """Go's answer when meek-server's handler stops at a body over MAX_REQUEST_BODY: it
    writes nothing, so the server sends an empty 200, and closes, as MaxBytesReader
    asks (Connection first here: the handler's map holds it)."""
    lines = ["HTTP/%s 200 OK" % ("1.0" if version == "1.0" else "1.1")]
    if version != "1.0":
        lines.append("Connection: close")
    if date is not None:
        lines.append("Date: " + formatdate(date, usegmt=True))
    lines.append("Content-Length: 0")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def go_options(close=False, date=None, version="1.1"):
    """Go's answer to ``OPTIONS *`` (its own handler, before meek-server's)."""
    lines = ["HTTP/%s 200 OK" % ("1.0" if version == "1.0" else "1.1"), "Content-Length: 0"]
    if date is not None:
        lines.append("Date: " + formatdate(date, usegmt=True))
    if close and version != "1.0":
        lines.append("Connection: close")
    elif not close and version == "1.0":
        lines.append("Connection: keep-alive")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def go_bad_message(status):
    """What Go's server writes for a request it cannot parse, then closes: the status
    again as the body, but for a transfer coding it does not know."""
    body = "Unsupported transfer encoding" if status.startswith("501") else status
    return ("HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n%s"
            % (status, body)).encode("latin-1")


def clean_path(target):
    """The request target's path as Go's path.Clean reads it ("/" for "//", "/a/.."),
    percent-decoded; an absolute-form target's path."""
    if "://" in target[:10]:
        target = urlsplit(target).path or "/"
    path = unquote(target.partition("?")[0])
    if not path.startswith("/"):
        return path
    cleaned = posixpath.normpath(path)
    return "/" + cleaned.lstrip("/")


def answer(request, date=None):
    """The server's answer to a request that is not a meek POST (bytes), or None for
    a POST whose session id is acceptable (the caller then serves the session)."""
    head, close = request.method == "HEAD", not request.keep_alive
    version = request.version
    if request.method == "OPTIONS" and request.target == "*":
        return go_options(close=close, date=date, version=version)
    if request.method == "GET":
        if clean_path(request.target) == "/":
            return go_response(200, COVER_PAGE, date=date, close=close, version=version)
        return go_error(404, "404 page not found", date=date, close=close, version=version)
    if request.method != "POST" or len(session_id_of(request)) < MIN_SESSION_ID:
        return go_error(400, "Bad request.", date=date, head=head, close=close, version=version)
    return None


def session_id_of(request):
    return (request.fields.get("x-session-id") or [""])[0]


def client_address(request, peer):
    """(address, FORWARDED_PORT) for Tor's Extended ORPort: the first element of
    Meek-IP or X-Forwarded-For, else the TCP peer's address; None when none parses."""
    for name in ("meek-ip", "x-forwarded-for"):
        values = request.fields.get(name)
        if values:
            forwarded = webtunnel.forwarded_for({"x-forwarded-for": values})
            return None if forwarded is None else (forwarded[0], FORWARDED_PORT)
    return (peer[0], FORWARDED_PORT) if peer else None


# --- The client's requests ----------------------------------------------------------

CHROME_VERSION = "136"
USER_AGENT = ("Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
              "Chrome/%s.0.0.0 Safari/537.36" % CHROME_VERSION)
SEC_CH_UA = '"Chromium";v="%s", "Google Chrome";v="%s", "Not.A/Brand";v="99"' % (
    CHROME_VERSION, CHROME_VERSION)


def build_request(config, session_id, body):
    """The bytes of one POST, shaped like the fetch() of a script on the URL's site in
    Chrome 136 on Windows over HTTP/1.1 (the same-origin fields, Chrome's field order as
    far as we know it; not checked against a capture here)."""
    origin = "%s://%s" % (config.scheme, config.host)
    fields = (("Host", config.host),
              ("Connection", "keep-alive"),
              ("Content-Length", str(len(body))),
              ("sec-ch-ua-platform", '"Windows"'),
              ("User-Agent", USER_AGENT),
              ("sec-ch-ua", SEC_CH_UA),
              ("Content-Type", OCTETS),
              ("X-Session-Id", session_id),
              ("sec-ch-ua-mobile", "?0"),
              ("Accept", "*/*"),
              ("Origin", origin),
              ("Sec-Fetch-Site", "same-origin"),
              ("Sec-Fetch-Mode", "cors"),
              ("Sec-Fetch-Dest", "empty"),
              ("Referer", origin + "/"),
              ("Accept-Encoding", "gzip, deflate, br, zstd"),
              ("Accept-Language", "en-US,en;q=0.9"))
    head = "POST %s HTTP/1.1\r\n%s\r\n\r\n" % (config.target, "\r\n".join("%s: %s" % f for f in fields))
    return head.encode("latin-1") + bytes(body)


def status_advice(status):
    """What to check when the front answers ``status`` instead of 200."""
    if status in (301, 302, 303, 307, 308):
        return "the web server redirects: check the scheme, host and path of url="
    if status == 400:
        return ("the server refused the request: is url= a meek bridge (a meek server "
                "answers 400 to a request without a session id)?")
    if status in (403, 421):
        return ("the front refuses the Host (url='s host): it does not route to that site; "
                "check front= and url=")
    if status == 404:
        return "check the path of url=: nothing answers it there"
    if status == 405:
        return "the site does not take POST on that path: check url="
    if status == 500:
        return "the meek bridge cannot reach its Tor relay, or the session failed: try again later"
    if status in (502, 503, 504):
        return "the front cannot reach the meek bridge behind it: is the bridge running?"
    return "check url= and front="


# --- Configuration ------------------------------------------------------------------

class ClientConfig:
    """One client's: where it dials (``address``: front= or url='s host, and port; the
    SNI ``servername``, None for http://), what it asks for (the ``host`` field,
    url='s host[:port]; the request ``target``, url='s path and query), its TLS
    ``context`` (ssl.SSLContext, or browser_tls.BrowserContext; None for http://)."""

    def __init__(self, url, scheme, host, target, address, servername, front, context, notes=()):
        self.url, self.scheme, self.host, self.target = url, scheme, host, target
        self.address, self.servername, self.front = address, servername, front
        self.context, self.notes = context, tuple(notes)


class ServerConfig:
    """One listener's: its TLS ``context`` (None behind a reverse proxy), its limits,
    the ``clock`` that dates answers (None: no Date) and its ``sessions`` table."""

    def __init__(self, context, session_idle=SESSION_IDLE, max_sessions=MAX_SESSIONS, clock=None,
                 sessions=None, notes=()):
        self.context, self.session_idle, self.max_sessions = context, session_idle, max_sessions
        self.clock, self.sessions, self.notes = clock, sessions, tuple(notes)


def _split_host_port(text, default_port, what):
    """(host, port) of "host", "host:port" or "[v6]:port" (Go's url.Host)."""
    parts = urlsplit("//" + text)
    try:
        port = parts.port
    except ValueError:
        raise ValueError("%s has a bad port" % what)
    if not parts.hostname:
        raise ValueError("%s has no host" % what)
    return parts.hostname, port or default_port


def client_config(options):
    """Check the client's arguments (meek_lite's: url=, front=; utls= as webtunnel's)."""
    unknown = sorted(set(options) - set(CLIENT_OPTIONS))
    if unknown:
        raise ValueError("unknown meek argument(s): %s (meek takes %s)"
                         % (", ".join(unknown), ", ".join(CLIENT_OPTIONS)))
    url = options.get("url")
    if not url:
        error = ValueError("meek needs url= (the bridge line's url=https://HOST/PATH)")
        error.missing = "url"
        raise error
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError("url=: the scheme must be https (or http, without TLS)")
    default_port = 443 if scheme == "https" else 80
    _split_host_port(parts.netloc.rpartition("@")[2], default_port, "url=")
    host = parts.netloc.rpartition("@")[2]
    front = options.get("front") or None
    dial = front if front else host
    address = _split_host_port(dial, default_port, "front=" if front else "url=")
    target = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    notes, context, servername = [], None, None
    if scheme == "https":
        context, note = webtunnel.client_context(options.get("utls"))
        if note:
            notes.append(note)
        servername = address[0]
    elif "utls" in options:
        notes.append("utls= has no effect with an http:// url= (no TLS)")
    return ClientConfig(url=url, scheme=scheme, host=host, target=target, address=address,
                        servername=servername, front=front, context=context, notes=tuple(notes))


def server_config(options, state_dir=None):
    """(ServerConfig, announce) for one listener; ValueError or OSError name the option."""
    unknown = sorted(set(options) - set(SERVER_OPTIONS))
    if unknown:
        raise ValueError("unknown meek server option(s): %s (meek takes %s)"
                         % (", ".join(unknown), ", ".join(SERVER_OPTIONS)))
    cert, key = options.get("tls-cert"), options.get("tls-key")
    if bool(cert) != bool(key):
        raise ValueError("tls-cert= and tls-key= go together (give both to terminate TLS here, "
                         "or neither to serve plain HTTP behind a reverse proxy)")
    context = None
    if cert:
        for option, path in (("tls-cert", cert), ("tls-key", key)):
            webtunnel._check_readable(option, path)
        context = webtunnel.server_context()
        try:
            context.load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            raise ValueError("tls-cert=%s, tls-key=%s: not a certificate and its key (%s)"
                             % (cert, key, exc.reason or exc))
    idle = _number(options, "session-idle", SESSION_IDLE, float)
    most = _number(options, "max-sessions", MAX_SESSIONS, int)
    return ServerConfig(context=context, session_idle=idle, max_sessions=most, clock=time.time,
                        sessions=Sessions()), {}


def _number(options, name, default, kind):
    if name not in options:
        return default
    try:
        value = kind(options[name])
    except ValueError:
        value = 0
    if not value > 0:
        raise ValueError("%s= must be a positive number" % name)
    return value


# --- The transport: the handshake part, sans-IO ----------------------------------------

TLS_HANDSHAKE, WAIT_FIRST, OPEN, FAILED = "TLS_HANDSHAKE", "WAIT_FIRST", "OPEN", "FAILED"
READ_SIZE = 16 * 1024


class Meek:
    """One side of meek (the contract in transports.py), for the part the core's
    handshake driver runs; then the connection it owns takes over (``connection``
    on a client, ``serve`` on a bridge).

    Client: ``start()`` is the ClientHello (https) or the first request (http);
    the handshake is TLS, then a first poll (an empty POST): the tunnel opens
    only when it is answered 200, so that a front or URL that answers wrongly
    fails the SOCKS request with words that say what to check. Its body is the
    first plaintext. Server: the TLS handshake when it terminates TLS
    (``tls-cert=``), else nothing: the first bytes of the request are the
    "plaintext" handed to ``serve``.
    """

    name = "meek"
    ProtocolError = ProtocolError
    secret_options = ()
    uses_state_dir = False

    @classmethod
    def client_config(cls, options):
        return client_config(options)

    @classmethod
    def server_config(cls, options, state_dir=None):
        return server_config(options, state_dir)

    @classmethod
    def routes(cls, config, requested):
        """The front (or url='s host), never the bridge line's placeholder address."""
        return [(config.address, config)]

    @classmethod
    def crypto_routes(cls):
        return {"meek client hello": webtunnel.hello_route()}, []

    def __init__(self, initiator, config, prepared=None, session_id=None):
        self.initiator, self.config = initiator, config
        self.session_id = session_id or (new_session_id() if initiator else None)
        self.reader = MessageReader(requests=not initiator)
        self._owed = bytearray()
        self._plain = bytearray()
        self.peer_address = None
        self._tls = None
        context = config.context if config is not None else None
        if context is not None:
            self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            if initiator:
                self._tls = context.wrap_bio(self._incoming, self._outgoing,
                                             server_hostname=config.servername)
            else:
                self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
                self.handshake_timeout = webtunnel.FRONT_IDLE_TIMEOUT
        self.expensive = self._tls is not None and not isinstance(
            self._tls, webtunnel.browser_tls.BrowserTLS)
        self.state = TLS_HANDSHAKE if self._tls is not None else (WAIT_FIRST if initiator else OPEN)
        self._server_plain_open = False

    @property
    def is_open(self):
        if not self.initiator and self._tls is None:
            return self._server_plain_open
        return self.state == OPEN

    def start(self):
        if self._tls is not None:
            if self.initiator:
                self._handshake()
            return self._outgoing.read()
        return build_request(self.config, self.session_id, b"") if self.initiator else b""

    def receive(self, data):
        """Handshake: b"" until open; then the first response's body (client) or
        the request bytes read so far (server)."""
        if not self.initiator and self._tls is None:
            self._server_plain_open = True
            return bytes(data)
        if self._tls is not None:
            self._incoming.write(data)
            if self.state == TLS_HANDSHAKE:
                if not self._handshake():
                    return b""
                self.state = WAIT_FIRST if self.initiator else OPEN
                if self.initiator:
                    self._tls.write(build_request(self.config, self.session_id, b""))
            data = self._read_tls()
        if not self.initiator:
            return data
        messages = self.feed_responses(data)
        if not messages:
            return b""
        kind = (messages[0].fields.get("content-type") or ["none"])[0]
        if kind.lower() != OCTETS:
            # A web server's page (nginx's cover on another path) is no meek server's answer.
            raise self._fail("the server answered 200 with a page (Content-Type %s), not a meek "
                             "server's bytes (%s): check the path of url=" % (kind[:40], OCTETS))
        self.state = OPEN
        return b"".join(message.body for message in messages)

    def data_to_send(self):
        if self._tls is not None:
            return self._outgoing.read()
        return b""

    def send(self, plaintext):
        raise RuntimeError("meek: the connection it owns sends (request())")

    # What the connections use -----------------------------------------------------------

    def wrap(self, plaintext):
        """Bytes for the wire: TLS records of ``plaintext``, or itself."""
        if self._tls is None:
            return bytes(plaintext)
        if plaintext:
            self._tls.write(plaintext)
        return self._outgoing.read()

    def unwrap(self, data):
        """The plaintext the peer's bytes carry."""
        if self._tls is None:
            return bytes(data)
        self._incoming.write(data)
        return self._read_tls()

    def request(self, body):
        """One POST of ``body`` for the wire (client)."""
        return self.wrap(build_request(self.config, self.session_id, body))

    def feed_responses(self, plaintext):
        """Complete responses in ``plaintext`` (client); ProtocolError for any but 200."""
        reader = self.reader
        reader.feed(plaintext)
        messages = []
        while True:
            try:
                message = reader.next()
            except HTTPError as exc:
                raise self._fail("the answer is not HTTP (%s): check url= and front=" % exc)
            if message is None:
                return messages
            if 100 <= message.status < 200:
                continue
            if message.status != 200:
                raise self._fail("the server answered %d, not 200: %s"
                                 % (message.status, status_advice(message.status)),
                                 b"".join(m.body for m in messages))
            if message.fields.get("content-encoding"):
                raise self._fail("the front compressed the answer (Content-Encoding): a meek "
                                 "server never does; check url= and front=")
            messages.append(message)

    def _read_tls(self):
        pieces = []
        try:
            while True:
                piece = self._tls.read(READ_SIZE)
                if not piece:
                    self.peer_ended = True
                    break
                pieces.append(piece)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            self.peer_ended = True
        except ssl.SSLError as exc:
            raise self._fail("TLS: %s" % (exc.reason or exc))
        return b"".join(pieces)

    peer_ended = False

    def _handshake(self):
        try:
            self._tls.do_handshake()
            return True
        except ssl.SSLWantReadError:
            return False
        except ssl.SSLError as exc:
            verify = getattr(exc, "verify_message", None)
            if verify:
                raise self._fail("TLS: the certificate did not verify (%s): check front= (the "
                                 "name the certificate must hold) and the CA roots (SSL_CERT_FILE)"
                                 % str(verify).replace(str(self.config.servername), "that name"))
            if not self.initiator and exc.reason == "HTTP_REQUEST":
                error = self._fail("the client spoke plain HTTP to our TLS port: answered 400")
                error.reply = go_bad_message("400 Bad Request")
                raise error
            words = "the client's TLS handshake failed" if not self.initiator else (
                "the TLS handshake with the front failed: check front= and url=")
            raise self._fail("TLS: %s (%s)" % (words, exc.reason or exc))

    def _fail(self, message, data=b""):
        self.state = FAILED
        error = ProtocolError(message, data)
        if self._tls is not None:
            try:
                error.reply = self._outgoing.read()
            except ssl.SSLError:
                pass
        return error

    def failure_hint(self, kind):
        if not self.initiator:
            return ""
        if kind == "connect":
            return "(meek dials front=, or url='s host, never the bridge line's address)"
        if kind in ("timeout", "closed") and self.state == WAIT_FIRST:
            return "(the web server did not answer the first request: check url= and front=)"
        return ""

    # The connections (below) --------------------------------------------------------

    def connection(self, upstream, downstream, to_upstream=b"", to_downstream=b""):
        """The client's connection, in place of a Relay (transports.py)."""
        return ClientConnection(self, upstream, downstream, to_upstream, to_downstream)

    def serve(self, conn, settings, tunnel, first):
        """The bridge's HTTP connection, in place of a Relay (transports.py)."""
        return ServerConnection(self, conn, settings, tunnel, first)


class MeekLite(Meek):
    """obfs4proxy's name for the meek client (bridge lines say ``meek_lite``)."""

    name = "meek_lite"


# --- The connections meek owns: sockets and timers, driven by the pump --------------------
#
# Everything below runs on the pump's thread (relay.Pump), but for the threads that
# dial: a bridge's new session's connection to Tor, a client's next keep-alive
# connection. They hand their result over and ``Pump.nudge`` the waiting object.

import logging  # noqa: E402  (the I/O half of the module)
import selectors  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
from collections import deque  # noqa: E402

import outbound  # noqa: E402
import relay as relay_  # noqa: E402

log = logging.getLogger("obfsproxy")
READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE
CHUNK = relay_.CHUNK


class _Count:
    """Application bytes one way, as the listener's closing line reads them (``.count``)."""

    __slots__ = ("count",)

    def __init__(self):
        self.count = 0


class _Owned:
    """What a connection a transport owns shares with a Relay, for the pump and the
    listener: ``registered``, ``pump`` (set by Pump.add), counts, ``abort``."""

    pump = None
    finished = False

    def start(self, buffers):
        pass

    def abort(self):
        relay_.abort(*[sock for sock in (self.upstream, self.downstream) if sock is not None])

    def close(self):
        pass


# --- The bridge -------------------------------------------------------------------

class Sessions:
    """One listener's sessions by id (``ServerConfig.sessions``). The table is read
    and changed on the pump's thread and by the threads that dial: hence the lock."""

    QUIET = 10.0      # seconds between two warnings of one kind (a flood is one line)

    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.dialling = 0           # sessions whose thread dials Tor right now
        self.long_heads = 0         # bytes past MAX_HEAD that connections' heads hold (HEAD_BUDGET)
        self._said = {}

    def warn(self, kind, message, *args):
        """Say a warning, at most once per QUIET seconds for each kind."""
        now = time.monotonic()
        with self.lock:
            if now - self._said.get(kind, -self.QUIET) < self.QUIET:
                return
            self._said[kind] = now
        log.warning(message, *args)


class Session(_Owned):
    """One meek session on the bridge: its connection to Tor's ORPort, the requests
    waiting for it (one served at a time, the others queue), and its idle timer.

    It reads from Tor only while a request waits for the answer (``TURNAROUND``),
    at most MAX_PAYLOAD bytes, so what Tor sends between requests waits in the
    kernel's buffer: the backpressure costs no memory here. An idle session is a
    socket and this object, watched for nothing, with a timer: no thread."""

    def __init__(self, sid, table, idle):
        self.id, self.table, self.idle = sid, table, idle
        self.sock = None
        self.upstream = self.downstream = None
        self.registered = {}
        self.waiters = deque()      # ServerConnections, the first being served
        self.to_tor = bytearray()
        self.inbox = None           # bytes from Tor for the first waiter (b"": Tor closed)
        self.failed = False         # the dial failed, or the session ended
        self.tor_eof = False
        self.last_seen = time.monotonic()
        self.fresh = True
        self.up, self.down = _Count(), _Count()

    @property
    def ready(self):
        return self.sock is not None

    def watch(self):
        if self.finished:
            return {}, None
        events = 0
        if self.to_tor:
            events |= WRITE
        waiter = self.waiters[0] if self.waiters else None
        if waiter is not None and waiter.state == TURNAROUND_STATE and self.inbox is None \
                and not self.to_tor:
            events |= READ
        timeout = None
        if self.fresh:
            timeout = 0.0
        elif not self.waiters:
            timeout = max(0.0, self.last_seen + self.idle - time.monotonic())
        return {self.sock: events}, timeout

    def handle(self, ready, share=CHUNK):
        if self.fresh:
            self.fresh = False
            self._nudge_waiter()
        for _, events in ready:
            if events & WRITE and self.to_tor:
                sent = self._send()
                if sent and not self.to_tor:
                    self._nudge_waiter()
            if events & READ and self.inbox is None:
                try:
                    data = self.sock.recv(MAX_PAYLOAD)
                except BlockingIOError:
                    data = None
                except OSError:
                    data = b""
                if data is not None:
                    if not data:
                        self.tor_eof = True
                    self.down.count += len(data)
                    self.inbox = data
                    self._nudge_waiter()
        if not ready and not self.waiters and \
                time.monotonic() >= self.last_seen + self.idle:
            self.end()

    def give(self, body):
        """A request's body for Tor (pump thread); written now as far as it goes."""
        self.to_tor += body
        self.up.count += len(body)
        self.last_seen = time.monotonic()
        if self.to_tor:
            self._send()
        return not self.to_tor

    def _send(self):
        try:
            sent = self.sock.send(self.to_tor)
        except BlockingIOError:
            return 0
        except OSError:
            self.tor_eof = True
            self.to_tor = bytearray()
            return 0
        del self.to_tor[:sent]
        return sent

    def take(self):
        """What Tor sent for the first waiter, and let the next one come."""
        data, self.inbox = self.inbox, None
        self.last_seen = time.monotonic()
        return data

    def done_with(self, connection):
        """``connection`` is answered (or gone): the next waiter's turn."""
        if connection in self.waiters:
            first = self.waiters[0] is connection
            self.waiters.remove(connection)
            if first:
                self._nudge_waiter()
        self.last_seen = time.monotonic()
        if self.tor_eof and not self.waiters:
            self.end()
        elif self.pump is not None:
            self.pump.nudge(self)

    def end(self):
        """Out of the table; the pump then ends it (its socket closed in ``ended``)."""
        with self.table.lock:
            if self.table.by_id.get(self.id) is self:
                del self.table.by_id[self.id]
        self.failed = True
        self.finished = True
        for waiter in list(self.waiters):
            if waiter.pump is not None:
                waiter.pump.nudge(waiter)
        if self.pump is not None:
            self.pump.nudge(self)

    def ended(self, error):
        """The pump's on_end: close the ORPort connection."""
        self.failed = True
        self.finished = True
        with self.table.lock:
            if self.table.by_id.get(self.id) is self:
                del self.table.by_id[self.id]
        if self.sock is not None:
            self.sock.close()
        for waiter in list(self.waiters):
            if waiter.pump is not None:
                waiter.pump.nudge(waiter)

    def _nudge_waiter(self):
        if self.waiters and self.waiters[0].pump is not None:
            self.waiters[0].pump.nudge(self.waiters[0])


READ_REQUEST, DIALING, QUEUED, FORWARD, TURNAROUND_STATE, WRITE_RESPONSE, CLOSED = (
    "READ_REQUEST", "DIALING", "QUEUED", "FORWARD", "TURNAROUND", "WRITE_RESPONSE", "CLOSED")
LINGER = "LINGER"
READ_TIMEOUT = 20.0  # seconds: meek-server's ReadTimeout (and so IdleTimeout): for a whole
                     # request from its first bytes, and between an answer and the next
                     # request's first bytes; then the connection closes, unanswered
LINGER_TIME = 0.5   # seconds: after the last response, the write side shut, what comes is read
                    # and dropped (Go's closeWriteAndWait), so that unread bytes cause no RST


class ServerConnection(_Owned):
    """One HTTP connection to the bridge (from the front, or from a client in
    ``tls-cert=`` mode), carrying requests one after another (keep-alive), of one
    session or of several. A request goes: read whole (head and body, at most
    MAX_PAYLOAD) -> its session (made, and Tor dialled, on a thread, if new) -> the
    body written to Tor -> up to TURNAROUND for Tor's answer -> the response written
    -> the next request. It reads the next request only after the response has
    gone, so a client that does not read holds one response, no more."""

    def __init__(self, transport, conn, settings, tunnel, first):
        self.transport, self.settings, self.tunnel = transport, settings, tunnel
        self.config = transport.config
        self.upstream = self.downstream = conn
        self.registered = {conn: 0}
        self.up, self.down = _Count(), _Count()
        self.reader = MessageReader(requests=True, max_body=MAX_REQUEST_BODY)
        self.state = READ_REQUEST
        self.session = None
        self.request = None
        self.out = memoryview(b"")
        self.close_after = False
        self.peer_eof = False
        self.until = None
        self.read_until = time.monotonic() + READ_TIMEOUT
        self.charged = 0             # this connection's share of Sessions.long_heads
        self.head_refused = False
        if first:
            self.reader.feed(first)

    def start(self, buffers):
        if self.out or not self.reader.idle:
            self.pending_start = True

    pending_start = False

    def watch(self):
        conn = self.downstream
        if self.finished:
            return {conn: 0}, None
        events = 0
        if self.out:
            events = WRITE
        elif self.state in (READ_REQUEST, LINGER) and not self.peer_eof:
            events = READ
        timeout = None
        if self.pending_start:
            timeout = 0.0
        elif self.state in (TURNAROUND_STATE, LINGER) and self.until is not None:
            timeout = max(0.0, self.until - time.monotonic())
        elif self.state == DIALING:
            timeout = self.settings.handshake_timeout
        elif self.state == READ_REQUEST:
            timeout = max(0.0, self.read_until - time.monotonic())
        return {conn: events}, timeout

    def handle(self, ready, share=CHUNK):
        self.pending_start = False
        for sock, events in ready:
            if events & READ and self.state == LINGER:
                try:
                    if sock.recv(CHUNK) == b"":
                        self.peer_eof = True
                except BlockingIOError:
                    pass
                continue
            if events & READ and self.state == READ_REQUEST:
                try:
                    data = sock.recv(CHUNK)
                except BlockingIOError:
                    data = None
                if data == b"":
                    self.peer_eof = True
                elif data:
                    plain = self.transport.unwrap(data)
                    if plain and self.reader.idle:     # a next request begins: its ReadTimeout
                        self.read_until = time.monotonic() + READ_TIMEOUT
                    self.reader.feed(plain)
                    if self.transport.peer_ended:
                        self.peer_eof = True
                    owed = self.transport.data_to_send()
                    if owed:
                        self._queue(owed)
                    if not self._charge():
                        self.head_refused = True
                        self.reader.drop()
        self._advance(bool(ready))
        self._charge()

    def _charge(self):
        """Keep this connection's bytes past MAX_HEAD counted in the listener's total;
        False when the total is past HEAD_BUDGET (many long heads at once: a flood)."""
        table = self.config.sessions
        over = max(0, self.reader.buffered - MAX_HEAD)
        with table.lock:
            table.long_heads += over - self.charged
            self.charged = over
            return not over or table.long_heads <= HEAD_BUDGET

    def _queue(self, data):
        self.out = memoryview(bytes(self.out) + data) if self.out else memoryview(data)

    def _advance(self, woken):
        now = time.monotonic()
        while True:
            if self.out:
                if not self._write():
                    return
            if self.state == WRITE_RESPONSE:
                if self.close_after:
                    self._linger()
                    continue
                self.state = READ_REQUEST
                self.read_until = now + READ_TIMEOUT
            if self.state == LINGER:
                if self.peer_eof or now >= self.until:
                    self.finished = True
                return
            if self.state == READ_REQUEST and self.head_refused:
                self.head_refused = False
                table = self.config.sessions
                table.warn("heads", "meek: refusing a long request head: %d bytes of long heads held "
                           "at once (at most %d)", table.long_heads, HEAD_BUDGET)
                self._respond(go_bad_message("431 Request Header Fields Too Large"), close=True)
                continue
            if self.state == READ_REQUEST:
                try:
                    request = self.reader.next()
                except BodyTooLarge as exc:
                    log.info("meek: a request we cannot take (%s): answered 200, empty", exc)
                    self._respond(go_body_too_large(self._date(), exc.version), close=True)
                    continue
                except HTTPError as exc:
                    log.info("meek: a request we cannot take (%s): answered %s", exc, exc.status)
                    self._respond(go_bad_message(exc.status), close=True)
                    continue
                if request is None:
                    if self.peer_eof:
                        self.finished = True
                    elif now >= self.read_until:
                        log.info("meek: no whole request within %.0f s: closed", READ_TIMEOUT)
                        self.finished = True
                    return
                self._begin(request)
                continue
            if self.state == DIALING:
                session = self.session
                if session.failed:
                    self._fail_session()
                    continue
                if not session.ready:
                    if self.until is not None and now >= self.until:
                        self._fail_session()
                        continue
                    return
                self.state = QUEUED
            if self.state == QUEUED:
                session = self.session
                if session.failed:
                    self._fail_session()
                    continue
                if session.waiters[0] is not self:
                    return
                self.state = FORWARD
                if not session.give(self.request.body):
                    session.pump.nudge(session)
                    return
            if self.state == FORWARD:
                session = self.session
                if session.failed:
                    self._fail_session()
                    continue
                if session.to_tor:
                    return
                self.state = TURNAROUND_STATE
                self.until = time.monotonic() + TURNAROUND
                session.pump.nudge(session)
                return
            if self.state == TURNAROUND_STATE:
                session = self.session
                if session.failed and session.inbox is None:
                    self._fail_session()
                    continue
                if session.inbox is None and time.monotonic() < self.until:
                    return
                data = session.take() if session.inbox is not None else b""
                self.session, self.until = None, None
                if data == b"" and session.tor_eof:
                    session.done_with(self)
                    session.end()
                    self._respond(go_error(500, "Internal server error.", date=self._date(),
                                       close=not self.request_keep_alive,
                                   version=self.request.version))
                    continue
                self.up.count += len(data or b"")     # from Tor (a Relay's up direction)
                session.done_with(self)
                data = data or b""
                version = self.request.version
                self._respond(go_response(200, data, content_type=OCTETS, date=self._date(),
                                          close=not self.request_keep_alive, version=version),
                              close=version == "1.0" and len(data) > CHUNK_OVER)
                continue
            return

    def _linger(self):
        """The last response has gone: shut the write side and read what still comes
        for LINGER_TIME (a peer that sent more than was read then sees the answer and a
        FIN, not a reset)."""
        self.state = LINGER
        self.until = time.monotonic() + LINGER_TIME
        try:
            self.downstream.shutdown(socket.SHUT_WR)
        except OSError:
            self.finished = True

    def _date(self):
        clock = self.config.clock
        return clock() if clock is not None else None

    def _respond(self, response, close=False):
        self.state = WRITE_RESPONSE
        self.close_after = close or not self.request_keep_alive
        self._queue(self.transport.wrap(response))

    request_keep_alive = True

    def _begin(self, request):
        """A whole request: answer it at once, or go to its session."""
        self.request = request
        self.request_keep_alive = request.keep_alive
        reply = answer(request, self._date())
        if reply is not None:
            self._respond(reply)
            return
        sid = session_id_of(request)
        self.down.count += len(request.body)     # from the client (a Relay's down direction)
        table = self.config.sessions
        with table.lock:
            session = table.by_id.get(sid)
            full = session is None and len(table.by_id) >= self.config.max_sessions
            busy = session is None and table.dialling >= MAX_DIALS
            if session is None and not (full or busy):
                session = table.by_id[sid] = Session(sid, table, self.config.session_idle)
                table.dialling += 1
                fresh = True
            else:
                fresh = False
        if full or busy:
            if full:
                table.warn("full", "meek: refusing a new session: %d sessions open (max-sessions=)",
                           self.config.max_sessions)
            else:
                table.warn("busy", "meek: refusing a new session: %d new sessions are dialling Tor "
                           "already", MAX_DIALS)
            self._respond(go_error(500, "Internal server error.", date=self._date(),
                                       close=not self.request_keep_alive,
                                   version=self.request.version))
            return
        self.session = session
        session.waiters.append(self)
        session.last_seen = time.monotonic()
        if fresh:
            self.state = DIALING
            self.until = time.monotonic() + self.settings.handshake_timeout
            peer = client_address(request, self.tunnel.peer)
            try:
                threading.Thread(target=_dial_tor, args=(session, self.settings, peer, self.pump),
                                 name="meek-dial", daemon=True).start()
            except RuntimeError:          # no thread to be had: as a failed dial
                with table.lock:
                    table.dialling -= 1
                session.end()
        elif not session.ready:
            self.state = DIALING
            self.until = time.monotonic() + self.settings.handshake_timeout
        else:
            self.state = QUEUED

    def _fail_session(self):
        session, self.session, self.until = self.session, None, None
        if session is not None:
            session.done_with(self)
        self._respond(go_error(500, "Internal server error.", date=self._date(),
                                       close=not self.request_keep_alive,
                                   version=self.request.version))

    def _write(self):
        try:
            sent = self.downstream.send(self.out)
        except BlockingIOError:
            return False
        self.out = self.out[sent:]
        if not self.out:
            self.out = memoryview(b"")
            return True
        return False

    def ended(self):
        """The listener ends the connection: a session it waited on lets it go, and its
        held head bytes leave the listener's count."""
        if self.session is not None:
            self.session.done_with(self)
            self.session = None
        self.reader.drop()
        self._charge()

    def close(self):
        self.ended()


def _dial_tor(session, settings, peer, pump):
    """On its own thread: the session's connection to Tor (its Extended ORPort, when
    Tor gave one, reporting ``peer``), then the session goes to ``pump``."""
    try:
        _dial(session, settings, peer, pump)
    finally:
        with session.table.lock:
            session.table.dialling -= 1


def _dial(session, settings, peer, pump):
    deadline = outbound.Deadline(settings.handshake_timeout)
    sock = None
    try:
        sock = outbound.open_connection(settings.dest, deadline, sources=settings.sources)
        if settings.ext_cookie_file:
            outbound.ext_orport_handshake(sock, settings.ext_cookie_file,
                                          peer or ("0.0.0.0", FORWARDED_PORT), session_transport_name,
                                          deadline)
        sock.setblocking(False)
    except OSError as exc:
        if sock is not None:
            sock.close()
        session.table.warn("dest", "meek: a new session cannot reach --dest %s: %s",
                           outbound.format_address(settings.dest), exc.strerror or exc)
        session.end()
        return
    session.sock = session.upstream = sock
    session.registered = {sock: 0}
    try:
        pump.add(session, session.ended)
    except RuntimeError:
        sock.close()
        session.end()


session_transport_name = "meek"


# --- The client ---------------------------------------------------------------------

class ClientConnection(_Owned):
    """One meek session on the client: the application's socket (``upstream``) and
    a keep-alive connection to the front (``downstream``), one request at a time.

    A request goes as soon as there is application data and none is in flight,
    else when the poll timer (``PollSchedule``) comes due. What the application
    sends waits here up to MAX_PAYLOAD (then it is not read: backpressure), and
    the next request waits until the last answer's body has been written to the
    application. When the front closes the keep-alive connection between two
    requests (nginx does after 1,000 requests, or on ``Connection: close``), a
    thread dials it again (the core's ``redial``: the same route, proxy and all),
    with a fresh TLS handshake and an empty poll for the same session."""

    def __init__(self, transport, upstream, downstream, to_upstream=b"", to_downstream=b""):
        self.transport = transport
        self.upstream, self.downstream = upstream, downstream
        self.registered = {upstream: 0, downstream: 0}
        self.up, self.down = _Count(), _Count()
        self.outgoing = bytearray(to_downstream)
        self.up.count += len(to_downstream)
        self.to_app = memoryview(bytes(to_upstream))
        self.down.count += len(to_upstream)
        self.schedule = PollSchedule()
        self.next_poll = time.monotonic() + self.schedule.after(0, len(to_upstream))
        self.wire = memoryview(b"")
        self.in_flight = False
        self.sent = 0
        self.app_eof = False
        self.front_eof = False
        self.dialing = False
        self.dialled = None
        self.retired = []
        self.requests = 1             # on this connection: the handshake's poll was the first
        # After the application's end of stream, requests go back to back until one
        # exchange moves nothing either way: what the bridge still had (an echo, the
        # end of a reply) reaches the application before the end. meek cannot tell the
        # bridge that the application ended (the session times out there).
        self.quiet_after_eof = False
        for sock in (upstream, downstream):
            sock.setblocking(False)

    def start(self, buffers):
        self._write_app()

    def watch(self):
        app_events = 0
        if not self.app_eof and len(self.outgoing) < MAX_PAYLOAD:
            app_events |= READ
        if self.to_app:
            app_events |= WRITE
        wanted = {self.upstream: app_events}
        if self.downstream is not None and not self.dialing:
            front = WRITE if self.wire else (READ if not self.front_eof else 0)
            wanted[self.downstream] = front
        timeout = None
        if self.dialled is not None:
            timeout = 0.0
        elif self.app_eof and not (self.in_flight or self.dialing or self.to_app or self.finished):
            timeout = 0.0
        elif not (self.in_flight or self.dialing or self.to_app or self.finished):
            timeout = 0.0 if (self.outgoing or self.app_eof) else \
                max(0.0, self.next_poll - time.monotonic())
        return wanted, timeout

    def handle(self, ready, share=CHUNK):
        for sock in self.retired:
            sock.close()
        self.retired = []
        for sock, events in ready:
            if sock is self.upstream:
                if events & WRITE:
                    self._write_app()
                if events & READ and not self.app_eof and len(self.outgoing) < MAX_PAYLOAD:
                    try:
                        data = sock.recv(MAX_PAYLOAD - len(self.outgoing))
                    except BlockingIOError:
                        data = None
                    if data == b"":
                        self.app_eof = True
                    elif data:
                        self.outgoing += data
                        self.up.count += len(data)
            elif sock is self.downstream:
                if events & WRITE:
                    self._write_front()
                if events & READ:
                    self._read_front(sock)
        if self.dialled is not None:
            self._take_dialled()
        self._act()

    def _read_front(self, sock):
        try:
            data = sock.recv(CHUNK)
        except BlockingIOError:
            return
        if not data:
            if self.in_flight:
                raise ProtocolError("the front closed the connection before answering a request")
            self.front_eof = True
            return
        transport = self.transport
        messages = transport.feed_responses(transport.unwrap(data))
        if transport.peer_ended:
            self.front_eof = True
        if messages and not self.in_flight:
            raise ProtocolError("the front sent an answer to no request")
        for message in messages:
            self.in_flight = False
            self.to_app = memoryview(message.body)
            self.down.count += len(message.body)
            self.next_poll = time.monotonic() + self.schedule.after(self.sent, len(message.body))
            if not message.keep_alive:
                self.front_eof = True
            if self.app_eof and not self.sent and not message.body:
                self.quiet_after_eof = True
        self._write_app()

    def _act(self):
        """Send the next request when it is due and allowed; end after the
        application's end once everything has gone."""
        if self.finished or self.in_flight or self.dialing or self.to_app:
            return
        if self.app_eof and not self.outgoing and self.quiet_after_eof:
            self.finished = True
            return
        if not self.outgoing and not self.app_eof and time.monotonic() < self.next_poll:
            return
        if self.downstream is None or self.front_eof:
            self._redial()
            return
        body = bytes(self.outgoing[:MAX_PAYLOAD])
        del self.outgoing[:len(body)]
        self.sent = len(body)
        self.wire = memoryview(self.transport.request(body))
        self.in_flight = True
        self.requests += 1
        self._write_front()

    def _write_front(self):
        while self.wire:
            try:
                sent = self.downstream.send(self.wire)
            except BlockingIOError:
                return
            self.wire = self.wire[sent:]

    def _write_app(self):
        while self.to_app:
            try:
                sent = self.upstream.send(self.to_app)
            except BlockingIOError:
                return
            self.to_app = self.to_app[sent:]

    def _redial(self):
        redial = getattr(self.transport, "redial", None)
        if redial is None:
            raise ProtocolError("the front closed the keep-alive connection")
        log.debug("meek: the front ended the keep-alive connection after %d requests; dialling "
                  "it again for the same session", self.requests)
        self.requests = 1
        self.dialing = True
        if self.downstream is not None:
            self.retired.append(self.downstream)
            self.downstream = None
        old = self.transport
        while hasattr(old, "inner"):          # under a recorder (--record-dir, the demo)
            old = old.inner
        fresh = type(old)(True, old.config, session_id=old.session_id)
        fresh.redial = redial
        threading.Thread(target=self._dial, args=(redial, fresh), name="meek-redial",
                         daemon=True).start()

    def _dial(self, redial, fresh):
        """On its own thread: a new connection to the front, its TLS handshake and an
        empty poll for the same session; handed over through ``dialled``."""
        try:
            sock, plaintext = redial(fresh)
        except Exception as exc:      # the tunnel ends with it, on the pump's thread
            self.dialled = exc
        else:
            if self.finished:         # the tunnel ended meanwhile (a stop): nobody takes it
                sock.close()
                return
            self.dialled = (sock, fresh, plaintext)
        pump = self.pump
        if pump is not None:
            pump.nudge(self)

    def _take_dialled(self):
        dialled, self.dialled = self.dialled, None
        self.dialing = False
        if isinstance(dialled, Exception):
            raise dialled
        sock, fresh, plaintext = dialled
        sock.setblocking(False)
        self.downstream, self.transport = sock, fresh
        self.front_eof = False
        self.to_app = memoryview(plaintext)
        self.down.count += len(plaintext)
        self.next_poll = time.monotonic() + self.schedule.after(0, len(plaintext))
        self._write_app()

    def abort(self):
        relay_.abort(*[sock for sock in (self.upstream, self.downstream) if sock is not None])

    def close(self):
        for sock in self.retired:
            sock.close()
        self.retired = []
        if self.downstream is not None:
            self.downstream.close()    # one made by a redial: the core knows only the first
