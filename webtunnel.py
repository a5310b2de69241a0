r"""webtunnel: HTTPS camouflage for Tor, as a sans-IO implementation of both ends.

What webtunnel is, and what it is not
-------------------------------------
webtunnel makes a Tor bridge connection look like a visit to an ordinary web
site. The client opens TLS to a real web server, asks it for a secret path with
an HTTP/1.1 Upgrade request, and once the server answers ``101 Switching
Protocols`` the TLS connection carries Tor's bytes raw, in both directions, with
no framing. On the server side a reverse proxy (nginx, a CDN) terminates TLS,
serves a cover site on every other path, and hands the secret path alone to the
webtunnel server, which speaks plain HTTP behind it.

* It is not WebSocket. There is no RFC 6455 framing after the 101: the upgrade
  only *looks like* one (on the browser route, Chrome's own request, key and all).
* The TLS is the cover's, not a protection of ours. Confidentiality and
  integrity of Tor's traffic come from Tor's own TLS inside the tunnel.
* The secret path is a bearer token. Anyone holding the bridge line can confirm
  the bridge; a prober without it only ever sees the cover site.
* An ``http://`` URL means no TLS at all: the request, the path and everything
  after it cross the network in clear (for tests, or behind another tunnel).

The client, step by step (``initiator=True``)
---------------------------------------------
1. Dial the host and port of ``url=`` (or ``addr=``), *not* the bridge line's
   address: that is a synthetic placeholder (see the server's step 5). This is
   ``routes()``: one route per ``servername=`` candidate, tried in turn.
2. ``https``: TLS with SNI = ``servername`` (default: the URL's host), the
   certificate verified against the system roots (``SSL_CERT_FILE`` replaces
   them), ALPN ``http/1.1``. ``start()`` is the ClientHello: Chrome's WebSocket
   hello when the browser route runs (``browser_tls``, curl_cffi), else Python
   ``ssl``'s (``client_context``). ``http``: no TLS, and ``start()`` is already
   step 3's request.
3. Once TLS is up, the request. On Python's ``ssl`` (and ``http``), exactly as
   lyrebird's Go client writes it (Go's ``net/http`` puts Host, then User-Agent,
   then the other headers sorted)::

       GET /<escaped path of url=> HTTP/1.1\r\n
       Host: <host of url=, no port; IPv6 in brackets>\r\n
       User-Agent: Go-http-client/1.1\r\n
       Connection: upgrade\r\n
       Upgrade: websocket\r\n
       \r\n

   Under Chrome's hello (the browser route), the request Chrome sends for
   ``new WebSocket("wss://HOST/PATH")`` (``browser_request``): Host, Connection:
   Upgrade, Pragma, Cache-Control, Chrome 136's User-Agent, Upgrade, Origin,
   Sec-WebSocket-Version: 13, Accept-Encoding, Accept-Language, a fresh
   Sec-WebSocket-Key, Sec-WebSocket-Extensions, in that order; a Chrome hello
   with Go's User-Agent is the mismatch a JA4-to-User-Agent check flags. Nothing
   else is ever sent before the 101.
4. Read the response head (at most ``MAX_HEAD`` bytes). Only the status line
   ``HTTP/1.1 101 Switching Protocols`` with ``Upgrade: websocket`` and a
   ``Connection`` list holding ``upgrade`` (values case-insensitive) opens the
   tunnel (and a Sec-WebSocket-Accept, when there is one, must be our key's); anything
   else is a ``ProtocolError`` that says what came back and what to check.
5. Data: a raw byte stream both ways. Bytes glued behind the response head are
   the first stream bytes (``receive()`` returns them; the Go client drops them).

The server, step by step (``initiator=False``)
----------------------------------------------
1. Plain HTTP behind a reverse proxy by default. With ``tls-cert=`` and
   ``tls-key=`` it terminates TLS itself: it is then the front, facing clients.
2. Read the request head (at most ``MAX_HEAD`` bytes); bytes after it are
   stream bytes.
3. Refuse (400) what RFC 9112 refuses: an HTTP/1.1 request without exactly one
   ``Host``, several ``Content-Length`` fields, ``Content-Length`` with
   ``Transfer-Encoding``. Then require method ``GET``, ``HTTP/1.1``, the path of
   ``url=`` (``path_matches``: that path and no other, percent-escapes, "//" and dot
   segments read as nginx reads them; a query string is ignored) or, behind a front
   that rewrites it, the path given in ``bridge-path=``, a ``Connection`` list
   holding ``upgrade`` and an ``Upgrade`` list holding ``websocket``. The upstream
   Go server checks only the two headers and leaves the path to the proxy; checking
   it here refuses every path a front should not have passed, and is all that
   guards the bridge when it is the front itself (``tls-cert=``).
4. Answer exactly (``switching_protocols``)::

       HTTP/1.1 101 Switching Protocols\r\n
       Connection: upgrade\r\n
       Upgrade: websocket\r\n
       \r\n

   with ``Sec-WebSocket-Accept`` (RFC 6455's SHA-1 of the key and its GUID) before
   the blank line when the request carried one key, and, when we are the front
   (``tls-cert=``), nginx's ``Server: nginx`` and ``Date`` after the status line, as
   on our other pages. No extension is ever accepted.

   Anything else is answered as nginx would (``error_page``: its page, ``Server:
   nginx``, ``Date``, no body after a HEAD), never with a 101: ``404 Not Found``
   for a well-formed request that is not our upgrade, ``400 Bad Request`` for bytes
   that are not HTTP, a malformed head or one over ``MAX_HEAD``. The answer rides
   on the ``ProtocolError`` (``.reply``) so that the core sends it and closes with a
   FIN. The log line says what did not match, never the path itself (lengths).
5. Managed mode announces ``url=<url>,ver=0.0.2`` at a synthetic address, not
   the listener's: the IPv6 address ``2001:db8::/32`` (documentation range) whose
   last 12 bytes are bytes 4..15 of SHA-256("WEBTUNNEL+" + url), port 443
   (``synthetic_address``). The real client address, for Tor's Extended ORPort,
   is the first element of ``X-Forwarded-For`` with port 60000 (``peer_address``),
   behind a proxy only.

Notation (spec term -> code)
----------------------------
============================  =====================================================
url=                          ``ClientConfig.url``, ``ServerConfig.url``
/<escaped path>               ``request_target(url)`` (Go's ``url.EscapedPath``)
Host header                   ``host_header(url)`` (Go's ``url.Hostname``, bracketed)
servername= (SNI list)        ``ClientConfig.servernames``; this route's: ``.servername``
addr=                         ``ClientConfig.address`` (where to dial)
the request, the 101          ``upgrade_request(config)`` / ``browser_request``, ``switching_protocols``
head limit                    ``MAX_HEAD`` = 16 KiB, terminator included
synthetic address             ``synthetic_address(url)``, ``WebTunnel.public_address``
X-Forwarded-For               ``WebTunnel.peer_address``, port ``FORWARDED_PORT``
TLS as bytes                  ``ssl.SSLObject`` over two ``ssl.MemoryBIO`` (``_tls``), or
                              ``browser_tls.BrowserTLS`` (curl, the same calls)
close_notify                  ``WebTunnel.end()``
============================  =====================================================

States (``WebTunnel.state``)::

    client, https:  TLS_HANDSHAKE --TLS up, request written--> WAIT_RESPONSE --101--> OPEN
    client, http:   start() = request -----------------------> WAIT_RESPONSE --101--> OPEN
    server, TLS:    TLS_HANDSHAKE --TLS up--> WAIT_REQUEST --our upgrade, 101 owed--> OPEN
    server, plain:                            WAIT_REQUEST --our upgrade, 101 owed--> OPEN

    any state --TLS failure, not a 101, not our upgrade--> FAILED
                (ProtocolError; a server's carries the 404/400 page in .reply)
    OPEN --peer's close_notify--> OPEN, peer_ended: receive() returns b"" from then on,
                                  and the relay ends that direction at once
    OPEN --FIN, no close_notify before it nor ours sent--> FAILED (receive_eof)

close_notify and half-close (measured: tests/test_webtunnel.py pins it)
-----------------------------------------------------------------------
``end()`` returns our TLS close_notify (``SSLObject.unwrap()``). OpenSSL still
lets the side that sent close_notify read what the peer sends afterwards
through the same ``SSLObject`` (measured with OpenSSL 3.0, TLS 1.2 and 1.3; the
tests fail wherever that stops being true, a record half-received at end()
included), so a half-closed tunnel keeps flowing the other way, as the core's
per-direction EOF expects. A peer's close_notify ends its direction:
``receive()`` returns the plaintext that came before it and b"" for anything
after, and ``peer_ended`` tells the relay to end that direction without waiting
for the FIN. (CPython reports a close_notify as b"" before ours went out and as
``SSLZeroReturnError`` after; both mean the same here.) A FIN with no
close_notify before it is a stream cut short: ``receive_eof()`` raises, and the
application gets a reset, not a clean end; after our own close_notify a bare FIN
is accepted (nginx closes so). Without TLS, ``end()`` is b"": the FIN says it all.

What a censor still sees
------------------------
* The SNI (``servername``) in clear, the certificate, and the server's address.
* The TLS ClientHello. On the browser route (curl_cffi installed and its
  self-test passed: ``browser_tls``) it is Chrome's when it opens a ``wss://``
  WebSocket, JA4 ``t13d1515h1_8daaf6152771_0a20fe35d3a5`` (``utls=hellofirefox_*``:
  Firefox's), always a full handshake (no resumption: no ``pre_shared_key``,
  so no session ticket links one tunnel to the next) and no close_notify at
  the end. Otherwise it is Python's OpenSSL hello (``ssl.OPENSSL_VERSION``, JA4
  ``t13d1812h1_85036bcba153_d41ae481755e`` with OpenSSL 3.0): its own cipher and
  extension lists and no GREASE, which tells it from every browser and from
  lyrebird's uTLS. The start-up log says which (``hello_route``); a ``utls=``
  we cannot honour is said in ``notes``.
* TLS-in-TLS: Tor's inner TLS handshake shows through as a burst pattern (the bytes
  each side sends before the other answers, the round trips), on a long-lived connection
  to a web server. Its exact record lengths (534 for Tor's ClientHello, 514 k + 39 for
  whole cells) do not: both ends cut their first 16 KiB into records below them (see
  "Record shaping"; ``shaping=off`` turns it off).
* What does not show: the path, the Upgrade exchange and every byte after them
  are inside TLS; a prober without the path gets the cover site (or our 404).
  Blocking the domain is collateral damage when the site is real or behind a CDN,
  which is the point of the design.
"""

import base64
import hashlib
import ipaddress
import os
import random as _random
import re
import ssl
import time
from email.utils import formatdate
from urllib.parse import quote, unquote, urlsplit

import addresses
import browser_tls

VERSION = "0.0.2"                 # what the upstream server announces as ver=
MAX_HEAD = 16 * 1024              # a request or response head, terminator included
SYNTHETIC_PREFIX = bytes.fromhex("20010db8")   # 2001:db8::/32, the documentation range
SYNTHETIC_SEED = "WEBTUNNEL+"
SYNTHETIC_PORT = 443
FORWARDED_PORT = 60000            # the port upstream pairs with X-Forwarded-For's address
USER_AGENT = "Go-http-client/1.1"
ALPN = ["http/1.1"]
READ_SIZE = 16 * 1024             # one TLS record's plaintext at most

SWITCHING_PROTOCOLS = (b"HTTP/1.1 101 Switching Protocols\r\n"
                       b"Connection: upgrade\r\n"
                       b"Upgrade: websocket\r\n"
                       b"\r\n")
WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"    # RFC 6455 1.3
STATUS_101 = "HTTP/1.1 101 Switching Protocols"

# States.
TLS_HANDSHAKE = "TLS_HANDSHAKE"
WAIT_RESPONSE = "WAIT_RESPONSE"
WAIT_REQUEST = "WAIT_REQUEST"
OPEN = "OPEN"
FAILED = "FAILED"

# The client's options (lyrebird 0.8.1's, and shaping=, ours); those we take, ignore, and refuse.
CLIENT_OPTIONS = ("url", "servername", "addr", "utls", "ver", "shaping")
REFUSED_CLIENT_OPTIONS = {
    "cert": "cert= (lyrebird's certificate-chain pin) cannot be checked by this implementation: "
            "remove cert= from the bridge line (the certificate is still verified against the CA roots)",
    "cert-domain": "cert-domain= goes with cert=, which this implementation cannot check: "
                   "remove cert-domain= (and cert=) from the bridge line",
    "sni-imitation": "sni-imitation= (a different SNI than the certificate's name) is not supported "
                     "by this implementation: remove sni-imitation= and give the name in servername=",
}
SERVER_OPTIONS = ("url", "tls-cert", "tls-key", "bridge-path", "shaping")


class WarningNote(str):
    """A note (``ClientConfig.notes``) the core says at WARNING rather than NOTICE."""
    level = 30        # logging.WARNING


class ProtocolError(Exception):
    """The peer is not speaking webtunnel to us: a TLS failure, an answer that is
    not our 101, a request that is not our upgrade.

    ``.reply``: bytes to send before closing (a server's 404 or 400 page, TLS
    records and close_notify when it terminates TLS; a TLS alert). ``.data``:
    plaintext decoded before the error, which the relay still delivers. What
    happens next: the caller sends ``.reply`` and closes with a FIN.
    """

    reply = b""
    data = b""

    def __init__(self, message, reply=b"", data=b""):
        Exception.__init__(self, message)
        self.reply = bytes(reply)
        self.data = bytes(data)


# --- The URL: what the client dials, asks for and says in Host ----------------------

def _parse_url(url):
    """(scheme, split URL, port) of an http or https URL with a host (port: the
    scheme's default when none is written); ValueError names url=."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:     # urlsplit's own words may quote the host or the port
        raise ValueError("url= is not a valid URL (%s)" % _url_error_words(str(exc)))
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError("url=: the scheme must be https (or http, without TLS), not %r"
                         % parts.scheme[:20])
    if not parts.hostname:
        raise ValueError("url= has no host")
    if _BAD_HOST.search(_hostname(parts.netloc)) or "\\" in parts.netloc:
        raise ValueError("url=: the host holds a character no host name has "
                         "(a space, a backslash, a quote, ...)")
    return scheme, parts, port or (443 if scheme == "https" else 80)


def _url_error_words(text):
    """urlsplit's complaint in words that quote no part of url= (which it may echo)."""
    if "IPv6" in text:
        return "a bracket in the host is not closed, or not an IPv6 address"
    if "Port" in text or "port" in text:
        return "the port is not a number from 0 to 65535"
    if "NFKC" in text:
        return "the host holds characters that change under NFKC normalization"
    return "it does not parse as one"


# url= carries the secret path (a bearer token) and the bridge's host, which the log
# scrubs elsewhere: errors about it say what is wrong, never the value.
_BAD_HOST = re.compile(r'[\x00-\x20"<>\\^`{|}\x7f]')


def _hostname(netloc):
    """The host of a netloc as written (Go's url.Hostname: case kept, no brackets, no port)."""
    host = netloc.rpartition("@")[2]
    if host.startswith("["):
        return host[1:host.find("]")]
    return host.partition(":")[0]


def _is_ip(host):
    try:
        ipaddress.ip_address(unquote(host).partition("%")[0])
        return True
    except ValueError:
        return False


def host_header(url):
    """The Host header lyrebird sends: the URL's host without port, IPv6 in brackets.

    Go writes ``url.Hostname()`` (brackets stripped) and so sends ``Host: ::1`` for an
    IPv6 literal, which RFC 9112 does not allow; we bracket it. A non-ASCII name is
    sent in its IDNA form, as Go's ``cleanHost`` does.
    """
    host = _hostname(_parse_url(url)[1].netloc)
    if ":" in host:
        return "[%s]" % host.partition("%")[0]     # no zone identifier (RFC 6874)
    try:
        host.encode("ascii")
    except UnicodeError:
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise ValueError("url=: the host is not a valid domain name")
    return host


_PCT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_PATH_OK = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/%\[\]]*\Z")


def request_target(url):
    """``/`` + the URL's escaped path (Go's ``url.EscapedPath()``), no query.

    The path as written when it is a valid escaping; otherwise the decoded path
    escaped as Go escapes a path (alphanumerics and ``-._~$&+,/:;=@`` kept).
    """
    path = _parse_url(url)[1].path
    if not (_PATH_OK.match(path) and not _PCT.search(path)):
        path = quote(unquote(path), safe="$&+,/:;=@")
    return "/" + path[1:] if path.startswith("/") else "/" + path


def synthetic_address(url):
    """(IPv6 text, 443): where the upstream server says it listens for ``url``.

    The first 4 bytes are 20 01 0d b8; the other 12 are bytes 4..15 of
    SHA-256("WEBTUNNEL+" + url). Tor puts it in the bridge line; clients ignore it.
    """
    digest = hashlib.sha256((SYNTHETIC_SEED + url).encode("utf-8")).digest()
    return str(ipaddress.IPv6Address(SYNTHETIC_PREFIX + digest[4:16])), SYNTHETIC_PORT


def parse_addr(text):
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port), by the one address parser
    (``addresses.parse_address``); ValueError names addr= (the address, which logs
    scrub, is not repeated)."""
    try:
        return addresses.parse_address(text)
    except ValueError as exc:
        raise ValueError("addr= must be HOST:PORT (IPv6: [ADDRESS]:PORT): %s"
                         % str(exc).replace(repr(text), "the value"))


# --- Configuration ------------------------------------------------------------------

# create_default_context() reads the CA bundle: ~20 ms, far more than a handshake. One
# context per (SSL_CERT_FILE, SSL_CERT_DIR) serves every connection; it is never changed
# after it is made (replace config.context rather than modify it).
_default_contexts = {}


def default_client_context():
    """``ssl.create_default_context()`` (system roots, or ``SSL_CERT_FILE``; the host
    name checked) with ALPN http/1.1, made once per CA setting of the environment."""
    key = (os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
    context = _default_contexts.get(key)
    if context is None:
        context = ssl.create_default_context()
        context.set_alpn_protocols(ALPN)
        _default_contexts[key] = context
    return context


def client_context(utls=None):
    """(context, note or None): the TLS context whose ClientHello the client sends, for
    lyrebird's ``utls=`` (None: not given), and a note when it is not what was asked.

    The browser route (``browser_tls``: curl_cffi, when its self-test passed) sends
    Chrome's WebSocket hello by default and for ``utls=hellochrome_*``, Firefox's for
    ``utls=hellofirefox_*``; ``utls=none`` (and ``hellogolang``), or no browser
    route, is Python's ``ssl`` (OpenSSL's hello, no browser's). Randomized, Safari,
    iOS and other uTLS hellos are not offered: Chrome's is sent, and the note says so.
    """
    asked = None if utls is None else (utls or "hellorandomizednoalpn")
    kind = (asked or "").lower()
    if kind in ("none", "hellogolang"):
        return default_client_context(), (
            "utls=%s: our TLS ClientHello is Python's OpenSSL one (%s), not Go's crypto/tls one; "
            "neither is a browser's" % (asked, ssl.OPENSSL_VERSION))
    available, why = browser_tls.route()
    if not available:
        if asked is None:
            return default_client_context(), None
        return default_client_context(), (
            "utls=%s: our TLS ClientHello is Python's OpenSSL one (%s), not the uTLS fingerprint "
            "asked for, so a censor with a TLS-fingerprint list can tell it from a browser (a "
            "browser's hello needs curl_cffi: %s)" % (asked, ssl.OPENSSL_VERSION, why))
    family = "firefox" if kind.startswith("hellofirefox") else "chrome"
    context = browser_tls.context(family)
    note = None
    if asked is not None and not kind.startswith(("hellochrome", "hellofirefox")):
        note = ("utls=%s is not offered here (randomized, Safari, iOS and custom hellos are not): "
                "sending %s (%s) instead" % (asked, context.hello, context.target))
    elif kind not in ("", "hellochrome_auto", "hellofirefox_auto"):
        note = ("utls=%s: sending %s (%s); other versions are not offered"
                % (asked, context.hello, context.target))
    return context, note


def hello_route():
    """What the client's ClientHello is in this process, and why (the route report)."""
    available, why = browser_tls.route()
    if available:
        context = browser_tls.context()
        return "%s through curl (%s, JA4 %s; %s)" % (context.hello, context.target, context.ja4, why)
    return "Python's OpenSSL hello (%s, JA4 %s; no browser's): %s" % (
        ssl.OPENSSL_VERSION, browser_tls.ja4_of(default_client_context()), why)


class ClientConfig:
    """What one client connection (one route) needs. ``routes()`` gives copies whose
    ``servername`` is each candidate in turn.

    ``address``      where to dial: (host, port) of url=, or addr=
    ``target``       the request-target: "/" + escaped path
    ``host``         the Host header
    ``servernames``  SNI candidates, in order (https only); ``servername`` this route's
    ``context``      None for http; an ssl.SSLContext, or a browser_tls.BrowserContext
                     (the same wrap_bio) on the browser route (client_context); tests
                     may replace it
    ``shaping``      a Shaping: the first records cut (client_config: on), or None
    """

    def __init__(self, url, tls, address, target, host, servernames, servername, context, notes=(),
                 shaping=None):
        self.url, self.tls, self.address, self.target, self.host = url, tls, address, target, host
        self.servernames, self.servername, self.context, self.notes = servernames, servername, context, notes
        self.shaping = shaping

    def replace(self, **changes):
        """A copy with ``changes`` (keyword arguments of the constructor) applied."""
        return type(self)(**dict(vars(self), **changes))

    def __eq__(self, other):
        return type(other) is type(self) and vars(other) == vars(self)


class ServerConfig:
    """One listener's: the URL it serves, the ``target`` path a client must ask for
    and, when it terminates TLS, its ssl ``context`` (None: plain HTTP behind a reverse
    proxy). ``clock`` (seconds since the epoch) dates the error pages, as a web server
    does; None: pages carry no Date."""

    def __init__(self, url, target, context, notes=(), clock=None, rewritten=False, shaping=None):
        self.url, self.target, self.context, self.notes, self.clock = url, target, context, notes, clock
        self.rewritten = rewritten    # target is bridge-path= (the front rewrites url='s path)
        self.shaping = shaping        # a Shaping: the first writes cut and paced (server_config: on)

    def replace(self, **changes):
        """A copy with ``changes`` (keyword arguments of the constructor) applied."""
        return type(self)(**dict(vars(self), **changes))

    def __eq__(self, other):
        return type(other) is type(self) and vars(other) == vars(self)


def client_config(options):
    """Check the client's arguments (lyrebird's names) and build its ClientConfig."""
    for name in sorted(options):
        if name in REFUSED_CLIENT_OPTIONS:
            raise ValueError(REFUSED_CLIENT_OPTIONS[name])
    unknown = sorted(set(options) - set(CLIENT_OPTIONS))
    if unknown:
        raise ValueError("unknown webtunnel argument(s): %s (webtunnel takes %s)"
                         % (", ".join(unknown), ", ".join(CLIENT_OPTIONS)))
    url = options.get("url")
    if not url:
        # Named in .missing (as obfs4's absent cert=): a SOCKS client still starts
        # without it, since each connection brings the bridge line's url=.
        error = ValueError("webtunnel needs url= (the bridge line's url=https://HOST/PATH)")
        error.missing = "url"
        raise error
    scheme, parts, port = _parse_url(url)
    tls = scheme == "https"
    notes = []
    default_host = _hostname(parts.netloc)
    names = [name.strip() for name in options.get("servername", default_host).split(",")]
    names = tuple(name for name in names if name)
    if not names:
        raise ValueError("servername= is empty (give one name, or several separated by commas)")
    for name in names:
        try:
            name.encode("idna")
        except UnicodeError:
            raise ValueError("servername=: name %d of %d is not a host name"
                             % (names.index(name) + 1, len(names)))
    if not tls and "servername" in options:
        notes.append("servername= has no effect with an http:// url= (no TLS, no SNI)")
    if tls and _is_ip(default_host) and any(not _is_ip(name) for name in names):
        notes.append(WarningNote("url= names an IP address but servername= a name: the request says Host: "
                     "the address under an SNI of the name, a pair no browser sends, which a "
                     "TLS-terminating observer sees; write the name in url= and the address in "
                     "addr= (url=https://NAME/PATH addr=ADDRESS:443)"))
    context = None
    if tls:
        context, note = client_context(options.get("utls"))
        if note:
            notes.append(note)
    if "addr" in options:
        address = parse_addr(options["addr"])
    else:
        address = (unquote(default_host), port)         # an IPv6 zone (%25eth0) as %eth0
    return ClientConfig(url=url, tls=tls, address=address, target=request_target(url),
                        host=host_header(url), servernames=names if tls else (),
                        servername=names[0] if tls else None,
                        context=context, notes=tuple(notes), shaping=shaping_option(options))


def server_config(options, state_dir=None):
    """(ServerConfig, announce) for one listener; ValueError or OSError name the argument."""
    unknown = sorted(set(options) - set(SERVER_OPTIONS))
    if unknown:
        raise ValueError("unknown webtunnel server option(s): %s (webtunnel takes %s)"
                         % (", ".join(unknown), ", ".join(SERVER_OPTIONS)))
    url = options.get("url")
    if not url:
        raise ValueError("missing url parameter")
    _parse_url(url)
    target = request_target(url)
    if not _segments(target):
        raise ValueError("url= has no path: the secret path is the bridge's only secret "
                         "(url=https://HOST/SECRET, a long random SECRET)")
    cert, key = options.get("tls-cert"), options.get("tls-key")
    if bool(cert) != bool(key):
        raise ValueError("tls-cert= and tls-key= go together (give both to terminate TLS here, "
                         "or neither to serve plain HTTP behind a reverse proxy)")
    rewritten = "bridge-path" in options
    if rewritten:
        target = _bridge_path(options["bridge-path"], bool(cert))
    context = None
    if cert:
        for option, path in (("tls-cert", cert), ("tls-key", key)):
            _check_readable(option, path)
        context = server_context()
        try:
            context.load_cert_chain(cert, key)
        except ssl.SSLError as exc:
            raise ValueError("tls-cert=%s, tls-key=%s: not a certificate and its key (%s)"
                             % (cert, key, exc.reason or exc))
        except OSError as exc:
            raise OSError("tls-cert=%s, tls-key=%s: %s" % (cert, key, exc.strerror or exc))
    config = ServerConfig(url=url, target=target, context=context, clock=time.time,
                          rewritten=rewritten, shaping=shaping_option(options))
    return config, {"url": url, "ver": VERSION}


def _bridge_path(value, terminates_tls):
    """bridge-path=: the path the front passes to the bridge when it rewrites url='s
    (nginx's ``proxy_pass http://HOST:PORT/;`` in the secret location passes "/"). The
    bridge then answers that path alone, and the front is what keeps the secret: it
    must pass nothing else. ValueError names the option, never the value (it may be
    the secret path itself)."""
    if terminates_tls:
        raise ValueError("bridge-path= is for a bridge behind a front that rewrites the path; "
                         "with tls-cert= this server is the front, and it serves url='s path alone")
    if not value.startswith("/") or not _PATH_OK.match(value) or _PCT.search(value):
        raise ValueError("bridge-path= must be a path as the front passes it: starting with "
                         "\"/\", without a query, a fragment, spaces or a malformed escape")
    return value


# nginx's defaults (1.22, ssl_ciphers and ssl_prefer_server_ciphers): its cipher string,
# and the client's preference order rather than the server's. Python's server context
# has its own narrower string and prefers its own order (AES-256 first), which shows in
# every ServerHello. What Python's ssl cannot set is in the README (tls-cert= mode).
NGINX_CIPHERS = "HIGH:!aNULL:!MD5"


def server_context():
    """The TLS context of a server that terminates TLS itself (``tls-cert=``), as close
    to a stock nginx's as Python's ssl allows: nginx's cipher string, the client's
    cipher order, ALPN http/1.1."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    context.set_ciphers(NGINX_CIPHERS)
    context.set_alpn_protocols(ALPN)
    return context


def _check_readable(option, path):
    """OSError naming the option, the file and, when it is a permission, the user."""
    try:
        open(path, "rb").close()
    except PermissionError:
        raise OSError("%s=%s: the user this runs as (%s) cannot read it: give that user "
                      "read access, or run as a user that has it" % (option, path, _user()))
    except OSError as exc:
        raise OSError("%s=%s: %s" % (option, path, exc.strerror or exc))


def _user():
    try:
        import pwd
        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError, AttributeError):     # Windows: no pwd, no geteuid
        return os.environ.get("USERNAME", "this user")


# --- HTTP heads ---------------------------------------------------------------------

# The first line's bytes: a request line is visible ASCII and spaces; a status line's
# reason phrase may also hold HTAB and obs-text. The first other byte decides: CR LF ends
# the line, anything else is not HTTP. Deciding on a prefix alone makes the outcome the
# same for every split of the input.
_NOT_REQUEST_LINE = re.compile(rb"[^\x20-\x7e]")
_NOT_STATUS_LINE = re.compile(rb"[^\x09\x20-\x7e\x80-\xff]")
_REQUEST_LINE = re.compile(r"([!#$%&'*+\-.^_`|~0-9A-Za-z]+) (\S+) (HTTP/\d\.\d)\Z")
_STATUS_LINE = re.compile(r"HTTP/\d\.\d \d\d\d( |\Z)")
_BAD_FIELD_BYTE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")


class HeadError(Exception):
    """A head that is not HTTP (which byte, or which line)."""


def first_line(buffer, not_allowed, start=0):
    """The first line of ``buffer`` as text once its CR LF is there, else None.
    ``start``: where to resume the scan (every byte before it passed already), so that
    a head arriving a byte at a time costs linear work, not quadratic."""
    match = not_allowed.search(buffer, start, MAX_HEAD)
    if match is None:
        if len(buffer) >= MAX_HEAD:
            raise HeadError("no line end in the first %d bytes" % MAX_HEAD)
        return None
    end = match.start()
    if buffer[end:end + 1] == b"\r" and end + 1 == len(buffer):
        return None
    if buffer[end:end + 2] != b"\r\n":
        raise HeadError("byte 0x%02x at offset %d of the first line" % (buffer[end], end))
    return buffer[:end].decode("latin-1")


def split_head(buffer, start=0):
    """(head lines after the first, bytes after the head) once the head is complete, else
    None. ``start``: where to resume looking for the blank line (as in first_line)."""
    end = buffer.find(b"\r\n\r\n", start, MAX_HEAD)
    if end < 0:
        if len(buffer) >= MAX_HEAD:
            raise HeadError("the head is longer than %d bytes" % MAX_HEAD)
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")[1:]
    return lines, bytes(buffer[end + 4:])


def parse_fields(lines):
    """{lower-case name: [values]} of header lines; HeadError for a malformed one."""
    fields = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not _FIELD_NAME.match(name) or _BAD_FIELD_BYTE.search(value):
            raise HeadError("malformed header line %r" % line[:80])
        fields.setdefault(name.lower(), []).append(value.strip(" \t"))
    return fields


_METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH", "PRI")
_VERSION_WORD = re.compile(r"HTTP/\d\.\d\Z")


def _request_line_words(line):
    """A request line for the log with every word but a known method (first) and an
    HTTP version replaced by its length: a line that is slightly off may still carry
    the secret path, which no log line quotes."""
    words = line.split(" ")
    shown = []
    for number, word in enumerate(words):
        if (number == 0 and word in _METHODS) or _VERSION_WORD.match(word) or not word:
            shown.append(word)
        else:
            shown.append("<%d bytes>" % len(word))
    return repr(" ".join(shown)[:200])


def tokens(fields, name):
    """The lower-case comma-separated tokens of every ``name`` field."""
    return [token.strip(" \t").lower() for value in fields.get(name, ())
            for token in value.split(",")]


def upgrade_request(config):
    """The exact bytes of the client's upgrade request (see step 3)."""
    return ("GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: %s\r\n"
            "Connection: upgrade\r\nUpgrade: websocket\r\n\r\n"
            % (config.target, config.host, USER_AGENT)).encode("latin-1")


def browser_request(config, user_agent, key):
    """The upgrade request Chrome sends for ``new WebSocket("wss://HOST/PATH")``, for the
    browser route, whose ClientHello is Chrome's: its header names, order, case and
    values (Chromium's, as third-party captures of Chrome 58 to 145 show them), the
    ``user_agent`` of the Chrome version the hello belongs to, ``key`` as
    Sec-WebSocket-Key and an Origin of the same site. ``Connection: Upgrade`` alone, as
    Chrome writes it: the upstream Go server compares the whole value with "upgrade".
    The permessage-deflate offer is Chrome's; no server of ours accepts it, so no frame
    is ever compressed (nor framed at all: the stream after the 101 is raw)."""
    host = authority(config.url)
    return ("GET %s HTTP/1.1\r\n"
            "Host: %s\r\n"
            "Connection: Upgrade\r\n"
            "Pragma: no-cache\r\n"
            "Cache-Control: no-cache\r\n"
            "User-Agent: %s\r\n"
            "Upgrade: websocket\r\n"
            "Origin: https://%s\r\n"
            "Sec-WebSocket-Version: 13\r\n"
            "Accept-Encoding: gzip, deflate, br, zstd\r\n"
            "Accept-Language: en-US,en;q=0.9\r\n"
            "Sec-WebSocket-Key: %s\r\n"
            "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
            "\r\n" % (config.target, host, user_agent, host, key)).encode("latin-1")


def authority(url):
    """HOST, or HOST:PORT when url='s port is not https's 443: the Host (and Origin) a
    browser writes for a ``wss://`` URL."""
    port = _parse_url(url)[2]
    return host_header(url) + ("" if port == 443 else ":%d" % port)


def websocket_key(random_bytes=os.urandom):
    """A fresh Sec-WebSocket-Key: 16 random bytes in base64 (RFC 6455 4.1)."""
    return base64.b64encode(random_bytes(16)).decode("ascii")


def websocket_accept(key):
    """The Sec-WebSocket-Accept for ``key``: base64 of SHA-1(key + the GUID) (RFC 6455 4.2.2)."""
    return base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode("latin-1")).digest()).decode("ascii")


def switching_protocols(key=None, date=None, front=False):
    """Our 101: the upstream Go server's bytes, plus Sec-WebSocket-Accept when the request
    carried one Sec-WebSocket-Key (no other header is answered: no extension, no
    subprotocol). ``front``: we terminate TLS ourselves, so the 101 carries nginx's
    Server and Date (``date``, seconds since the epoch; None: no Date) in nginx's order,
    as our other pages do and as nginx's 101 does behind it."""
    head = "HTTP/1.1 101 Switching Protocols\r\n"
    if front:
        head += "Server: nginx\r\n"
        if date is not None:
            head += "Date: %s\r\n" % formatdate(date, usegmt=True)
    head += "Connection: upgrade\r\nUpgrade: websocket\r\n"
    if key is not None:
        head += "Sec-WebSocket-Accept: %s\r\n" % websocket_accept(key)
    return (head + "\r\n").encode("latin-1")


def error_page(status, date=None, head=False):
    """A web server's error response ("404 Not Found"), closing the connection: nginx's
    page and fields, byte for byte as a stock nginx with ``server_tokens off`` sends
    them, with its ``Date`` (``date``: seconds since the epoch; None: no Date) and no
    body after a HEAD. Behind nginx, nginx replaces Server and Date with its own."""
    body = ("<html>\r\n<head><title>%s</title></head>\r\n<body>\r\n"
            "<center><h1>%s</h1></center>\r\n<hr><center>nginx</center>\r\n"
            "</body>\r\n</html>\r\n" % (status, status))
    dated = "" if date is None else "Date: %s\r\n" % formatdate(date, usegmt=True)
    return ("HTTP/1.1 %s\r\nServer: nginx\r\n%sContent-Type: text/html\r\nContent-Length: %d\r\n"
            "Connection: close\r\n\r\n%s"
            % (status, dated, len(body), "" if head else body)).encode("latin-1")


NOT_FOUND = "404 Not Found"
BAD_REQUEST = "400 Bad Request"


def _status_advice(code):
    """What to check when the answer to our upgrade has status ``code``."""
    if code == "101":
        return ("the reverse proxy must pass Upgrade and Connection through "
                "(nginx: proxy_http_version 1.1 and both proxy_set_header lines)")
    if code == "404":     # our server's answer behind a front that got the path right, too
        return ("check the path in url=; if it is right, the web server does not pass "
                "the upgrade to the bridge (nginx: proxy_http_version 1.1 and both "
                "proxy_set_header Upgrade/Connection lines) or rewrites the path: the "
                "bridge's log says which")
    if code == "200":     # a front serves its cover page on every path it does not route to us
        return ("the web server served a page, as it does on every path but the bridge's: "
                "check the path in url=")
    if code in ("301", "302", "303", "307", "308"):
        return "the web server redirects: check the scheme and host in url="
    if code in ("400", "421"):      # nginx's 400: plain HTTP sent to its TLS port, among others
        return "check the scheme (https) and host in url=, and servername="
    if code in ("502", "503", "504"):
        return ("the web server cannot reach the webtunnel bridge behind it: is the bridge "
                "running, on the port the web server passes to, with http:// (the bridge's log "
                "says when https:// reached it)?")
    return "check url="


# --- Record shaping: Tor's record sizes cut out of the first flights ----------------------
#
# Behind the 101 the tunnel carries Tor's own TLS, and an outer TLS record is one write
# of the sender plus 17 bytes (a 5-byte header, the 1-byte inner type, a 16-byte GCM tag).
# Without shaping the first client record after the upgrade is 534 bytes, Tor's 517-byte
# ClientHello record, and whole cells show as records of 514 k + 39 bytes: exact lengths
# that need no classifier. Both ends here cut the first bytes of their stream into pieces
# of random size below the smallest of those marks (a plaintext of 517 makes the 534),
# and every write into at least two pieces, so that no record is a whole write. A TLS
# sender makes one record per piece (``SSLObject.write`` and curl's ``curl_easy_send``
# each make one record per call). A bridge behind a front (nginx) does not make the
# records: the front makes one per read from us, so the bridge sends the pieces of a
# write apart, a pause of 1-2 ms between two, through the transport contract's
# ``send_paced``, and the front's reads (its records) follow the cuts. The peer reads
# the same bytes either way.
#
# What this does not change: how many bytes go each way between turns (burst sizes) and
# the number of round trips. A classifier of bursts and timing still sees Tor's handshake.

SHAPED_BYTES = 16 * 1024          # each direction's first stream bytes that are cut
SMALLEST_PIECE = 48               # a piece's plaintext, before the last piece of a write
LARGEST_PIECE = 511               # below Tor's 512-byte hello, a 517-byte record, and a cell
PAUSE = (0.001, 0.002)            # seconds after each paced piece (a front's reads follow)


class Shaping:
    """How one side cuts its first stream bytes (a listener's or a bridge line's setting,
    shared by its connections, never changed): ``window`` bytes cut into pieces of
    ``smallest``..``largest`` bytes, each paced piece followed by a pause drawn from
    ``pause`` (seconds). ``random``: a function returning a fresh ``random.Random``-like
    source for one connection (tests give a seeded one); by default one seeded from
    ``os.urandom``, so that no two tunnels cut alike."""

    def __init__(self, window=SHAPED_BYTES, smallest=SMALLEST_PIECE, largest=LARGEST_PIECE,
                 pause=PAUSE, random=None):
        if not 1 <= smallest <= largest:
            raise ValueError("shaping: a piece's size range is empty")
        self.window, self.smallest, self.largest = window, smallest, largest
        self.pause, self.random = tuple(pause), random

    def start(self):
        """A Shaper for one connection's direction."""
        source = self.random() if self.random is not None else _random.Random(os.urandom(32))
        return Shaper(self, source)


class Shaper:
    """One direction's cuts: ``cut(data)`` gives the pieces of one write, in order and
    whole (their concatenation is ``data``), ``pause()`` the seconds after a paced piece.
    Once ``window`` bytes have been cut, writes pass whole (``active`` is False)."""

    def __init__(self, shaping, source):
        self._shaping, self._random = shaping, source
        self.left = shaping.window        # bytes still to be cut

    @property
    def active(self):
        return self.left > 0

    def cut(self, data):
        """The pieces of one write: sizes drawn from smallest..largest while the window
        lasts, and a write that would fit one piece cut in two at a random byte, so that
        no record is one whole write; past the window, the rest in one piece."""
        shaping, draw = self._shaping, self._random.randint
        view, at, pieces = memoryview(data), 0, []
        while at < len(view) and self.left > 0:
            left = len(view) - at
            size = draw(shaping.smallest, shaping.largest)
            if size >= left:
                size = draw(1, left - 1) if at == 0 and left > 1 else left
            pieces.append(bytes(view[at:at + size]))
            at += size
            self.left -= size
        if at < len(view) or not pieces:
            pieces.append(bytes(view[at:]))
        return pieces

    def pause(self):
        low, high = self._shaping.pause
        return self._random.uniform(low, high)


def shaping_option(options, name="shaping"):
    """Shaping() unless the option says off: ``shaping=off`` (or 0, no, false) turns it
    off, ``on`` (1, yes, true, or no option) leaves it on; ValueError for anything else."""
    value = options.get(name, "on").strip().lower()
    if value in ("on", "1", "yes", "true"):
        return Shaping()
    if value in ("off", "0", "no", "false"):
        return None
    raise ValueError("%s= must be on or off (it cuts the first TLS records below Tor's record "
                     "sizes), not %r" % (name, value[:20]))


# --- The transport ------------------------------------------------------------------

FRONT_IDLE_TIMEOUT = 60.0             # seconds: nginx's client_header_timeout default
X509_V_ERR_HOSTNAME_MISMATCH = 62     # OpenSSL's verify code (x509_vfy.h)


class WebTunnel:
    """One side of one webtunnel connection, with no I/O (the contract in transports.py).

    Client: ``start()`` is the ClientHello (https) or the whole request (http);
    ``receive()`` returns b"" until the 101, then the stream bytes, the first of
    them glued to the response head. Server: ``start()`` is b""; ``receive()``
    reads the request and leaves the 101 in ``data_to_send()``, or raises
    ``ProtocolError`` carrying the 404/400 page in ``.reply``. Both: ``send()``
    gives TLS records (or the bytes themselves), ``data_to_send()`` what TLS owes
    (handshake flights, the request, the 101, session tickets), ``end()`` the
    close_notify. Without TLS the data phase is the identity (the in-place
    methods return True).
    """

    name = "webtunnel"
    ProtocolError = ProtocolError
    expensive = True            # per connection: True when this side does TLS
    # url= holds the secret path; bridge-path= may be it, or a part of it.
    secret_options = ("url", "bridge-path")
    uses_state_dir = False

    @classmethod
    def client_config(cls, options):
        return client_config(options)

    @classmethod
    def crypto_routes(cls):
        """The route report: which ClientHello the client sends, and why."""
        return {"webtunnel client hello": hello_route()}, []

    @classmethod
    def server_config(cls, options, state_dir=None):
        return server_config(options, state_dir)

    @classmethod
    def routes(cls, config, requested):
        """One route per servername, to url='s host (or addr=); ``requested`` (the bridge
        line's synthetic address) is never dialled."""
        if not config.tls:
            return [(config.address, config)]
        return [(config.address, config.replace(servername=name)) for name in config.servernames]

    @classmethod
    def public_address(cls, config, bound):
        return synthetic_address(config.url)

    def __init__(self, initiator, config, prepared=None):
        self.initiator = initiator
        self.config = config
        self.peer_address = None
        self.peer_ended = False          # the peer's close_notify came
        self._ended = False              # ours went out
        self._buffer = bytearray()       # a head being read
        self._scanned = 0                # how much of it passed the first-line scan
        self._head_scanned = 0           # ... and the search for its end
        self._line = None                # its first line, once complete
        self._method = None              # the request's method, once known (HEAD: no body)
        self._owed = bytearray()         # without TLS: the 101 to send
        self._tls = None
        self._shaper = None              # the data phase's first writes cut (Shaper)
        context = config.context
        if context is not None:
            self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
            if initiator:
                self._tls = context.wrap_bio(self._incoming, self._outgoing,
                                             server_hostname=config.servername)
            else:
                self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        # TLS handshakes: the core serialises them. Not curl's (browser_tls): they run in C
        # without the GIL, under browser_tls's own lock, and the first step waits a
        # millisecond for curl's timer, which must not hold every other handshake back.
        self.expensive = self._tls is not None and not isinstance(self._tls, browser_tls.BrowserTLS)
        if self._tls is not None and not initiator:
            # We are the front: an idle connection closes when nginx's would
            # (client_header_timeout, 60 s), not at the core's 30 s.
            self.handshake_timeout = FRONT_IDLE_TIMEOUT
        if self._tls is not None:
            self.state = TLS_HANDSHAKE
        else:
            self.state = WAIT_RESPONSE if initiator else WAIT_REQUEST
        # The client's request: Chrome's under Chrome's hello (the browser route), else
        # lyrebird's (Python's ssl, whose hello is no browser's, and http://). A server's
        # 101, once sent, is ``response``.
        self._key = None
        self.request = self.response = None
        if initiator:
            user_agent = getattr(context, "user_agent", None)
            if isinstance(self._tls, browser_tls.BrowserTLS) and user_agent:
                self._key = websocket_key()
                self.request = browser_request(config, user_agent, self._key)
            else:
                self.request = upgrade_request(config)
        self._start_shaping(getattr(config, "shaping", None))

    @property
    def is_open(self):
        return self.state == OPEN

    # Handshake ------------------------------------------------------------------------

    def start(self):
        """Client: the ClientHello, or (http) the request. Server: b""."""
        if self._tls is not None:
            if self.initiator:
                self._handshake()
            return self._outgoing.read()
        return self.request if self.initiator else b""

    def receive(self, data):
        """The plaintext the peer's bytes carried: b"" while handshaking, then the stream."""
        if self.state == FAILED:
            raise RuntimeError("webtunnel: receive() after a ProtocolError")
        if self._tls is None:
            if self.state == OPEN:
                return bytes(data)
            return self._read_head(data)
        if self.peer_ended:
            return b""
        self._incoming.write(data)
        if self.state == TLS_HANDSHAKE:
            if not self._handshake():
                return b""
            if self.initiator:
                self._tls.write(self.request)
            self.state = WAIT_REQUEST if not self.initiator else WAIT_RESPONSE
        plaintext = self._read_tls()
        if self.state == OPEN:
            return plaintext
        return self._read_head(plaintext)

    def data_to_send(self):
        if self._tls is not None:
            return self._outgoing.read()
        owed, self._owed = bytes(self._owed), bytearray()
        return owed

    def _handshake(self):
        """One step of the TLS handshake: True once it is done. TLS failures become
        ProtocolError in words a user can act on, carrying OpenSSL's alert."""
        try:
            self._tls.do_handshake()
            return True
        except ssl.SSLWantReadError:
            return False
        except ssl.CertificateError as exc:   # 3.7+: SSLCertVerificationError; 3.6: a name mismatch
            raise self._fail(self._certificate_words(exc), self._outgoing.read())
        except ssl.SSLError as exc:
            if exc.reason == "CERTIFICATE_VERIFY_FAILED":   # Python 3.6 says a bad chain so
                raise self._fail(self._certificate_words(exc), self._outgoing.read())
            if not self.initiator and exc.reason == "HTTP_REQUEST":
                # Plain HTTP to our TLS port: a web server answers that in plain HTTP.
                raise self._fail("the client spoke plain HTTP to our TLS port: answered 400",
                                 self._page(BAD_REQUEST))
            raise self._fail(self._tls_words(exc), self._outgoing.read())

    def _certificate_words(self, exc):
        """A sentence for a certificate that did not verify. It names neither the
        servername nor the certificate's own names: the log scrubs hosts (the core says
        them with --no-safe-logging), and the certificate's names point at the bridge's
        site as much as the servername does. OpenSSL's reason is kept, the name it may
        quote taken out."""
        if getattr(exc, "verify_code", None) == X509_V_ERR_HOSTNAME_MISMATCH:
            return ("TLS: the web server's certificate is not valid for the name in servername= "
                    "(or, without it, url='s host): check that name, and that the web server "
                    "serves the certificate of that site")
        reason = str(getattr(exc, "verify_message", None) or exc.reason or exc)
        name = self.config.servername or ""
        if name:
            reason = reason.replace("'%s'" % name, "that name").replace(name, "that name")
        return ("TLS: the web server's certificate did not verify (%s): check the CA roots "
                "(SSL_CERT_FILE) and servername=" % reason.rstrip("."))

    def _tls_words(self, exc):
        reason = exc.reason or str(exc)
        if not self.initiator:
            return "TLS: the client's handshake failed (%s)" % reason
        if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
            return ("TLS: the host of url= (or addr=) did not answer in TLS (%s): is it an "
                    "http:// server (url=), or is addr= wrong?" % reason)
        return "TLS: the handshake failed (%s): check servername=, url= and addr=" % reason

    def _read_tls(self):
        """Every plaintext byte the incoming TLS records hold; notes a close_notify."""
        pieces = []
        try:
            while True:
                piece = self._tls.read(READ_SIZE)
                if not piece:            # close_notify: the peer's direction is over
                    self.peer_ended = True
                    break
                pieces.append(piece)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:   # close_notify after ours: CPython raises, not b""
            self.peer_ended = True
        except ssl.SSLError as exc:
            raise self._fail("TLS: %s" % (exc.reason or exc), self._outgoing.read(), b"".join(pieces))
        return b"".join(pieces)

    def _read_head(self, data):
        """Buffer a request (server) or response (client) head; act once it is complete.
        Every decision rests on a prefix of the peer's bytes (the first line, then the
        whole head), so every split of the same bytes ends the same way; each byte is
        scanned a bounded number of times, however the head is split."""
        if not data and not self.peer_ended:     # a TLS record not whole yet: nothing new
            return b""
        self._buffer += data
        buffer = self._buffer
        head = None
        try:
            if self._line is None:
                if self.initiator:
                    line = first_line(buffer, _NOT_STATUS_LINE, self._scanned)
                    if line is not None and not _STATUS_LINE.match(line):
                        raise HeadError("its first line is %r" % line[:200])
                else:
                    line = first_line(buffer, _NOT_REQUEST_LINE, self._scanned)
                    if line is not None and not _REQUEST_LINE.match(line):
                        raise HeadError("not a request line: %s" % _request_line_words(line))
                self._line = line
                self._scanned = max(0, len(buffer) - 1)     # a CR at the end waits for its LF
                self._head_scanned = len(line or "")
            if self._line is not None:
                head = split_head(buffer, self._head_scanned)
                self._head_scanned = max(0, len(buffer) - 3)   # "\r\n\r\n" may straddle
            if head is not None:
                lines, rest = head
                fields = parse_fields(lines)
        except HeadError as exc:
            if self.initiator:
                raise self._fail("the server's answer is not HTTP (%s): check url= and addr=" % exc)
            if buffer[:1] == b"\x16" and self._tls is None:     # a TLS handshake record
                raise self._refuse(BAD_REQUEST, "a TLS ClientHello (byte 0x16 first): the web "
                                   "server speaks https:// to this plain-HTTP port (nginx: "
                                   "proxy_pass http://, not https://): answered 400")
            raise self._refuse(BAD_REQUEST, "not an HTTP request (%s): answered 400" % exc)
        if head is None:
            if self.peer_ended:     # a close_notify in the middle of the head
                if self.initiator:
                    raise self._fail("the server closed TLS before its answer to the upgrade was "
                                     "complete: " + _status_advice("101"))
                raise self._fail("the client closed TLS before its request was complete")
            return b""
        line, self._buffer = self._line, None
        if self.initiator:
            self._check_response(line, fields)
        else:
            self._check_request(line, fields)
        self.state = OPEN
        return rest

    def _check_response(self, line, fields):
        """Step 4: only our 101 opens the tunnel."""
        upgrade = [value.lower() for value in fields.get("upgrade", ())]
        if line == STATUS_101 and upgrade == ["websocket"] and "upgrade" in tokens(fields, "connection"):
            accept = fields.get("sec-websocket-accept")
            if self._key is not None and accept is not None and accept != [websocket_accept(self._key)]:
                # An Accept is optional (the upstream server sends none); a wrong one is
                # not an answer to our request.
                raise self._fail("the server's 101 carries a Sec-WebSocket-Accept that is not "
                                 "the one for our key: check url= and addr=")
            return
        code = line.split(" ")[1] if line.count(" ") else ""
        if line == STATUS_101:
            raise self._fail("the server answered 101 without Upgrade: websocket and Connection: "
                             "upgrade (Upgrade: %r, Connection: %r): %s"
                             % (", ".join(fields.get("upgrade", ())),
                                ", ".join(fields.get("connection", ())), _status_advice("101")))
        advice = _status_advice(code)
        if code[:1] == "3" and fields.get("location"):
            advice += " (%s)" % _where_it_points(fields["location"][0], self.config.url)
        raise self._fail("the server answered %r, not 101 Switching Protocols: %s"
                         % (line[:200], advice))

    def _check_request(self, line, fields):
        """Step 3: our upgrade, or a web server's answer; note X-Forwarded-For."""
        method, target, version = _REQUEST_LINE.match(line).groups()
        self._method = method
        if not version.startswith("HTTP/1."):
            raise self._refuse(BAD_REQUEST, "not HTTP/1.x (%s): answered 400" % _request_line_words(line))
        malformed = _malformed(fields, version)
        if malformed:     # RFC 9112 says to refuse these, and nginx answers them 400
            raise self._refuse(BAD_REQUEST, "a malformed request (%s): answered 400" % malformed)
        path = target.partition("?")[0]
        why = None
        if method != "GET" or version != "HTTP/1.1":
            why = "%s %s, not GET HTTP/1.1" % (method if method in _METHODS else
                                                "<%d bytes>" % len(method), version)
        elif not path_matches(path, self.config.target):
            why = path_mismatch(path, self.config.target, self.config.rewritten, self._tls is None)
        elif "upgrade" not in tokens(fields, "connection"):
            why = "no Connection: upgrade"
        elif "websocket" not in tokens(fields, "upgrade"):
            why = "no Upgrade: websocket"
        if why:
            raise self._refuse(NOT_FOUND, "not a webtunnel upgrade (%s): answered 404" % why)
        keys = fields.get("sec-websocket-key", ())
        key = keys[0] if len(keys) == 1 else None
        if self._tls is None:
            self.peer_address = forwarded_for(fields)
            self.response = switching_protocols(key)
            self._owed += self.response
        else:     # we are the front: X-Forwarded-For is whatever the client wrote
            clock = getattr(self.config, "clock", None)
            self.response = switching_protocols(key, clock() if clock else None, front=True)
            self._tls.write(self.response)

    def _fail(self, message, reply=b"", data=b""):
        self.state = FAILED
        self._buffer = None
        return ProtocolError(message, reply, data)

    def _page(self, status):
        clock = getattr(self.config, "clock", None)
        return error_page(status, clock() if clock else None, head=self._method == "HEAD")

    def _refuse(self, status, message):
        """A server's failure: its ``status`` page as the reply (in TLS, then close_notify)."""
        page = self._page(status)
        if self._tls is None:
            return self._fail(message, page)
        self._tls.write(page)
        self._shutdown()
        return self._fail(message, self._outgoing.read())

    # Data phase -----------------------------------------------------------------------

    def send(self, plaintext):
        if self.state != OPEN:
            raise RuntimeError("webtunnel: send() before the upgrade completed")
        if self._tls is None:
            return bytes(plaintext)
        if self._ended:
            raise RuntimeError("webtunnel: send() after end()")
        if self._shaper is not None and self._shaper.active:
            return self._shaped_send(plaintext)
        self._tls.write(plaintext)
        return self._outgoing.read()

    def send_in_place(self, buffer):
        return self._tls is None and self.state == OPEN and not self.paced

    # Data phase, shaped (see "Record shaping" above) ----------------------------------

    _pacing = False     # a bridge behind a front: its first writes paced (send_paced)

    @property
    def paced(self):
        """While a bridge behind a front (no TLS here) is still shaping: then the relay
        calls send_paced; after that, send_in_place again."""
        return self._pacing and self._shaper.active

    def _start_shaping(self, shaping):
        """With TLS, this side makes the records: it cuts its writes (no pause needed).
        A server without TLS (behind a front that makes the records) cuts and paces.
        A client without TLS (http://) has no records to shape."""
        if shaping is None or (self._tls is None and self.initiator):
            return
        self._shaper = shaping.start()
        self._pacing = self._tls is None

    def _shaped_send(self, plaintext):
        """send() with TLS while shaping lasts: one record per piece."""
        for piece in self._shaper.cut(plaintext):
            self._tls.write(piece)
        return self._outgoing.read()

    def send_paced(self, plaintext):
        """[(bytes, seconds to wait after them)]: a bridge's write cut into pieces with a
        pause between two pieces while shaping lasts, so that a front's reads, and its
        records, follow the cuts; then the write whole. No pause after a write's last
        piece: the next write's first piece may join it in one read of the front, which
        gives a record of no write's length (and the pauses cost the most time there)."""
        if self._tls is not None or self._shaper is None or not self._shaper.active:
            return [(self.send(plaintext), 0.0)]
        if self.state != OPEN:
            raise RuntimeError("webtunnel: send() before the upgrade completed")
        shaper = self._shaper
        pieces = shaper.cut(plaintext)
        return [(piece, shaper.pause()) for piece in pieces[:-1]] + [(pieces[-1], 0.0)]

    def receive_in_place(self, buffer):
        return self._tls is None and self.state == OPEN

    def end(self):
        """After the application's last byte: our close_notify (b"" without TLS, before
        the TLS handshake is done, or the second time). The peer's direction stays
        readable (see the module docstring)."""
        if self._tls is None or self._ended or self.state in (TLS_HANDSHAKE, FAILED):
            return b""
        self._shutdown()
        return self._outgoing.read()

    def _shutdown(self):
        self._ended = True
        try:
            self._tls.unwrap()
        except ssl.SSLWantReadError:     # close_notify sent; the peer's not yet seen
            pass
        except ssl.SSLError:             # a broken session has no clean close
            pass

    def receive_eof(self):
        """The peer's FIN came, with nothing after it (the relay calls this at the end of
        the incoming direction). With TLS, a FIN that no close_notify came before is a
        stream cut short, perhaps in the middle of a record: a ProtocolError, so that the
        application sees a failure (a reset), never a clean end of stream. Once our own
        close_notify went out, a bare FIN is the peer's answer to it (TLS 1.2 lets it
        discard what it still had to send; nginx closes so after our close_notify), not a
        cut. A front that ends its side cleanly whatever happened behind it (close_notify,
        then FIN) cannot be told from a real end."""
        if self._tls is not None and self.state == OPEN and not self.peer_ended and not self._ended:
            raise self._fail("TLS: the stream ended without close_notify (cut short: a FIN "
                             "in the middle of the stream)")

    def failure_hint(self, kind):
        """Words for a connection that could not be made ("connect": we dial url='s host,
        which a user may take for the bridge line's address), or a handshake that timed
        out or was closed, by where it stopped."""
        if not self.initiator:
            return ""
        if kind == "connect":
            return ("(webtunnel dials the host of url=, or addr=, never the bridge line's address): "
                    "check the host and port of url= (or addr=)")
        if kind not in ("timeout", "closed"):
            return ""
        what = "answered nothing" if kind == "timeout" else "closed the connection"
        if self.state == TLS_HANDSHAKE:
            return ("(it %s during the TLS handshake: the host of url= (or addr=) answered nothing "
                    "like a web server; check url=, addr= and servername=)" % what)
        if self.state == WAIT_RESPONSE:
            return ("(the web server %s instead of answering the upgrade: check the path in url=, "
                    "and that the reverse proxy passes Upgrade and Connection to a running "
                    "bridge)" % what)
        return ""


def forwarded_for(fields):
    """(first address of X-Forwarded-For, 60000), or None when absent or malformed."""
    values = fields.get("x-forwarded-for")
    if not values:
        return None
    first = values[0].split(",")[0].strip()
    try:
        address = ipaddress.ip_address(first)
    except ValueError:
        return None
    return str(address), FORWARDED_PORT




def _malformed(fields, version):
    """What RFC 9112 makes a request head unacceptable for, or None: an HTTP/1.1
    request without exactly one Host (3.2), several Content-Length fields, or
    Content-Length with Transfer-Encoding (6.3: request smuggling's ingredients)."""
    hosts = len(fields.get("host", ()))
    if version == "HTTP/1.1" and hosts != 1:
        return "no Host field" if not hosts else "%d Host fields" % hosts
    if hosts > 1:
        return "%d Host fields" % hosts
    if len(fields.get("content-length", ())) > 1:
        return "%d Content-Length fields" % len(fields["content-length"])
    if "content-length" in fields and "transfer-encoding" in fields:
        return "both Content-Length and Transfer-Encoding"
    return None


def _segments(path):
    """A request path as a web server matches it: percent-decoded, with empty and "."
    segments dropped and ".." resolved (nginx passes the path as the client wrote it;
    ``/%6B7Qm...``, ``//k7Qm...`` and ``/x/../k7Qm...`` all reached its exact location).
    A final "/" stays significant, and so does one that decoding or a final "." or
    ".." makes (RFC 3986 5.2.4: ``/k7Qm.../.`` is ``/k7Qm.../``)."""
    segments = []
    written = unquote(path).split("/")
    for segment in written:
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    if segments and written[-1] in ("", ".", ".."):
        segments.append("")
    return segments


def path_matches(path, target):
    """Whether a request for ``path`` is for ``target``, the one path this bridge serves
    (url='s, or ``bridge-path=`` when the front rewrites it): the same segments once
    read as a web server reads them (``_segments``: percent-escapes decoded, empty and
    dot segments resolved, a final "/" significant), which is how nginx's exact
    ``location`` matched it. An origin-form target only (it starts with "/"). Nothing
    else matches: not "/", not a part of the path, not the path with a "/" added, so
    a front that forwards every path (or none: ``tls-cert=``) hands a prober without
    the secret path no 101. (url='s path has a segment at least: ``server_config``.)"""
    return path.startswith("/") and _segments(path) == _segments(target)


def path_mismatch(path, target, rewritten=False, front=True):
    """Why ``path`` is not ``target``, in words that never quote either (url='s path is
    the bridge's secret, and so may be ``bridge-path=``): their lengths and numbers of
    segments. ``rewritten``: ``target`` is bridge-path='s. ``front``: a front stands
    before us (no ``tls-cert=``), so a path cut short may be its doing."""
    got, wanted = _segments(path), _segments(target)
    whose, what = ("bridge-path='s", "bridge-path=") if rewritten else ("url='s", "url='s path")
    words = ("the path is not %s: %d bytes in %d segment(s) arrived, %s is %d bytes in %d"
             % (whose, len(path), len(got), what, len(target), len(wanted)))
    if not front or rewritten:
        return words
    if len(got) < len(wanted) and got == wanted[len(wanted) - len(got):]:
        return words + ("; if the front cuts a leading part off the path (nginx: proxy_pass "
                        "http://HOST:PORT/;), give the path it passes in bridge-path=")
    return words + "; a front that rewrites the path: give the path it passes in bridge-path="


def _where_it_points(location, url):
    """Where a redirect points, relative to url=, without quoting it (url= and the
    Location carry the secret path and the bridge's host)."""
    try:
        to, ours = urlsplit(location), urlsplit(url)
    except ValueError:
        return "its Location is not a valid URL"
    words = []
    if to.scheme and to.scheme.lower() != ours.scheme.lower():
        words.append("to %s://" % to.scheme.lower()[:10])
    if to.netloc:
        words.append("the same host" if to.netloc.lower() == ours.netloc.lower() else "another host")
    words.append("the same path" if to.path == ours.path else "another path")
    return "it points to " + ", ".join(words)
