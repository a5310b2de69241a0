"""outbound.py: how we reach the next hop.

Everything that opens or speaks on an *outgoing* connection lives here, so
that the proxy core only says "connect me to X":

* ``Deadline``, ``send_all``, ``recv_within``, ``recv_exact``: socket steps
  bounded by one deadline for a whole handshake.
* ``connect`` and ``open_connection``: TCP connect under that deadline, from
  Tor's outbound bind address, then ``tune`` (TCP_NODELAY, keepalive).
* the outgoing-proxy client (``TOR_PT_PROXY`` or ``--proxy``): SOCKS5
  (RFC 1928, user/password RFC 1929), SOCKS4a, HTTP CONNECT. The SOCKS bytes
  themselves are built in socks.py.
* the Extended ORPort client (``ext_orport_handshake``): SAFE_COOKIE
  authentication, then USERADDR, TRANSPORT, DONE, so that a bridge counts its
  users per country and transport.
* addresses: ``parse_address``, ``format_address``, ``is_loopback``, from addresses.py
  (a leaf, so that webtunnel parses ``addr=`` with the same rules).

Errors are OSErrors (``ProxyError``, ``ExtORPortError``, socket.timeout,
ConnectionRefusedError ...), so the SOCKS handler maps each to a SOCKS reply.
"""

import base64
import collections
import contextlib
import errno
import hashlib
import hmac
import ipaddress
import os
import re
import select
import socket
import struct
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import socks
from addresses import format_address, is_ip_literal, is_loopback, parse_address  # noqa: F401


class Deadline:
    """One deadline shared by every step of a handshake, so that a peer that
    trickles a byte at a time cannot stretch it.

    ``turn``, if given, is the handshake's place in its listener's queue for the
    CPU (listener.Turn): every step that waits for the network waits through it
    (``turn.wait``), and a blocking call that is not a socket step (a connect, a
    name lookup) runs ``outside()`` the turn, so that a handshake holds its turn
    only while it computes."""

    def __init__(self, seconds, turn=None):
        self.end = time.monotonic() + seconds
        self.turn = turn

    def remaining(self):
        left = self.end - time.monotonic()
        if left <= 0:
            raise socket.timeout("handshake deadline passed")
        return left

    def within(self, seconds):
        """A shorter deadline (at most this one's) for one part, in the same turn."""
        part = Deadline(seconds, self.turn)
        part.end = min(part.end, self.end)
        return part

    def outside(self):
        """A context for a blocking call made without the turn (a no-op without one)."""
        return self.turn.outside(self) if self.turn is not None else contextlib.ExitStack()


# The steps below take a socket in either mode. The proxy's own sockets are
# non-blocking from accept (or connect) to close: a step tries the call first
# and waits in poll() only when the call would block. In timeout mode (a caller's
# socket), every step set the time left as the timeout (an ioctl) and CPython
# polled before every call, ready or not: three system calls where one does.
# Either way, a step starts only while the deadline has not passed.

def send_all(sock, data, deadline):
    """Send all of ``data`` before the deadline (socket.timeout when it passes)."""
    if not data:
        return
    if sock.gettimeout() != 0.0:
        sock.settimeout(deadline.remaining())
        sock.sendall(data)
        return
    view = memoryview(data)
    while view:
        deadline.remaining()
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            wait_until_ready(sock, deadline, write=True)


def recv_within(sock, size, deadline):
    """Up to ``size`` bytes, as soon as some come before the deadline; b"" at EOF."""
    if sock.gettimeout() != 0.0:
        sock.settimeout(deadline.remaining())
        return sock.recv(size)
    while True:
        deadline.remaining()
        try:
            return sock.recv(size)
        except BlockingIOError:
            wait_until_ready(sock, deadline)


def recv_exact(sock, n, deadline, error):
    """Exactly ``n`` bytes, or ``error`` (an exception class) if the peer closes first."""
    data = b""
    while len(data) < n:
        chunk = recv_within(sock, n - len(data), deadline)
        if not chunk:
            raise error("the connection closed in the middle of the handshake")
        data += chunk
    return data


def wait_until_ready(sock, deadline, write=False):
    """Wait until the non-blocking ``sock`` can be read (or written), or raise
    socket.timeout when the deadline passes first, as a socket in timeout mode would.
    With a turn, the wait gives the turn up and comes back with it (``Deadline``)."""
    seconds = deadline.remaining()
    turn = deadline.turn
    came = turn.wait(sock, write, seconds) if turn is not None else ready(sock, write, seconds)
    if not came:
        raise socket.timeout("timed out")


if hasattr(select, "poll"):
    def ready(sock, write, seconds):
        """Whether ``sock`` (a socket or a descriptor) is ready to read (or write)
        within ``seconds``; poll(), which takes any descriptor number."""
        poller = select.poll()
        poller.register(sock, select.POLLOUT if write else select.POLLIN)
        return bool(poller.poll(seconds * 1000))
else:   # Windows: select() (one socket, so its limit on descriptors does not matter)
    def ready(sock, write, seconds):
        readable, writable, _ = select.select(() if write else (sock,), (sock,) if write else (),
                                              (), seconds)
        return bool(readable or writable)


# --- Connecting ---------------------------------------------------------------

def _literal_family(host):
    """socket.AF_INET or AF_INET6 for an IP address written out, None for
    anything getaddrinfo must look at (a name, a scoped IPv6 address)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return family
        except (OSError, ValueError):
            pass
    return None


def connect(address, timeout, sources=None):
    """socket.create_connection to (host, port), from the source address that
    ``sources`` ({socket.AF_INET: "192.0.2.7", socket.AF_INET6: ...}, Tor's
    TOR_PT_OUTBOUND_BIND_ADDRESS_V4/_V6) gives for the destination's family.
    Like Tor's OutboundBindAddress, never for a loopback destination.
    Every address the name resolves to is tried within the one ``timeout``
    (the name lookup itself is not bounded by it)."""
    deadline = Deadline(timeout)
    error = OSError("no address to connect to")
    family = _literal_family(address[0])
    if family is not None:    # an address already: create_connection looks it up once anyway
        resolved = [(family, None, None, None, tuple(address[:2]))]
    else:
        resolved = socket.getaddrinfo(address[0], address[1], 0, socket.SOCK_STREAM)
    for family, _, _, _, sockaddr in resolved:
        source = None if not sources or is_loopback(sockaddr[0]) else sources.get(family)
        try:
            return socket.create_connection(sockaddr[:2], timeout=deadline.remaining(),
                                            source_address=(source, 0) if source else None)
        except OSError as exc:
            error = exc
    raise error


def open_connection(address, deadline, proxy=None, sources=None):
    """A TCP connection to (host, port) with TCP_NODELAY and keepalive, within
    the deadline; through the outgoing ``proxy`` URI when one is given (never
    around it); from the ``sources`` addresses (see ``connect``)."""
    with deadline.outside():      # waits only: the proxy's exchange is a few bytes
        if proxy is not None:
            sock = connect_via_proxy(proxy, address, deadline, sources)
        else:
            sock = connect(address, deadline.remaining(), sources)
    try:
        tune(sock)
    except OSError:   # e.g. reset already: do not leak the descriptor
        sock.close()
        raise
    return sock


# A peer that vanishes (power cut, a NAT dropping its state) sends neither FIN
# nor RST; an idle tunnel to it would hold a thread and two descriptors
# forever. TCP keepalive notices: after KEEPIDLE seconds of silence, KEEPCNT
# unanswered probes KEEPINTVL seconds apart close the socket (about 4 minutes).
KEEPIDLE, KEEPINTVL, KEEPCNT = 120, 30, 4
# macOS calls the idle time TCP_KEEPALIVE (0x10; Python exports it from 3.10).
_KEEPALIVE_OPTIONS = (
    (getattr(socket, "TCP_KEEPIDLE", None)
     or (getattr(socket, "TCP_KEEPALIVE", 0x10) if sys.platform == "darwin" else None), KEEPIDLE),
    (getattr(socket, "TCP_KEEPINTVL", None), KEEPINTVL),
    (getattr(socket, "TCP_KEEPCNT", None), KEEPCNT),
)


def tune(sock):
    """TCP_NODELAY and keepalive on a tunnel socket (the timings where the OS
    lets us set them; its defaults elsewhere)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in _KEEPALIVE_OPTIONS:
        if option is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
            except OSError:
                pass


def tuned(sock):
    """True when ``sock`` already has everything ``tune`` sets. Linux copies a
    listening socket's options to every connection it accepts, so a listener
    tuned once spares each accepted connection five system calls; the Listener
    asks this of its first connection rather than assume it of every OS."""
    try:
        if not (sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                and sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)):
            return False
        return all(sock.getsockopt(socket.IPPROTO_TCP, option) == value
                   for option, value in _KEEPALIVE_OPTIONS if option is not None)
    except OSError:
        return False


class ProxyURIError(ValueError):
    """An outgoing proxy URI (TOR_PT_PROXY, --proxy) is unusable. Managed mode
    answers ``PROXY-ERROR``; the command line refuses to start."""


class ProxyError(OSError):
    """The outgoing proxy could not be reached or refused the request.

    An OSError, so the SOCKS client handler turns it into a SOCKS failure
    reply (general failure) and closes the connection.
    """


class ExtORPortError(OSError):
    """The Extended ORPort handshake failed (bad cookie, wrong server hash,
    authentication refused, DENY). The connection is closed; the connection
    handler logs one line."""


# --- Outgoing proxies (client side) --------------------------------------------------

ProxyURI = collections.namedtuple("ProxyURI", "scheme host port username password")


_SHAPE = "TYPE://[USER[:PASS]@]HOST:PORT"


def parse_proxy_uri(text):
    """'socks5://user:pass@127.0.0.1:1080' -> ProxyURI; ProxyURIError says why not.

    Types (pt-spec 3.2.2): socks5 (optional RFC 1929 user and password),
    socks4a (optional user id, no password), http (CONNECT, optional basic
    auth). User and password are percent-decoded.

    The user and password run up to the last ``@``, so a password may hold
    ``/``, ``?``, ``#`` or ``@`` as typed (a URL parser would end the address
    at the first of them and take part of the password for the port). An
    error names the part that is wrong, never its text: the password is in
    there, and the message reaches stderr or Tor's log (PROXY-ERROR).
    """
    try:
        text.encode("utf-8")  # an environment value may carry undecodable bytes (surrogates)
    except UnicodeError:
        raise ProxyURIError("the proxy URI is not valid UTF-8 text")
    scheme, sep, rest = text.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]{0,15}", scheme):
        raise ProxyURIError("not a proxy URI (%s): it does not start with TYPE://" % _SHAPE)
    if scheme.lower() not in ("socks5", "socks4a", "http"):
        raise ProxyURIError("unsupported proxy type %r (socks5, socks4a or http)" % scheme)
    scheme = scheme.lower()
    userinfo, at, address = rest.rpartition("@")
    if address.endswith("/"):
        address = address[:-1]
    if any(char in address for char in "/?#"):
        raise ProxyURIError("a proxy URI has only %s: something follows the port" % _SHAPE)
    try:
        host, port = parse_address(address)
    except ValueError:
        raise ProxyURIError("the proxy URI needs HOST:PORT (a port of 1-65535) after TYPE:// "
                            "and the last @, if any")
    username = password = None
    if at:
        username, colon, password = userinfo.partition(":")
        password = password if colon else None
        try:
            username = unquote(username, errors="strict")
            password = unquote(password, errors="strict") if password is not None else None
        except UnicodeError:
            raise ProxyURIError("the proxy user and password must be UTF-8 once percent-decoded")
    if scheme == "socks4a" and password is not None:
        raise ProxyURIError("socks4a has a user id but no password")
    if scheme == "socks4a" and username is not None and "\0" in username:
        raise ProxyURIError("a SOCKS4a user id cannot contain NUL (it ends the field)")
    if scheme == "socks5" and username is not None:
        if not 1 <= len(username.encode()) <= 255 or len((password or "").encode()) > 255:
            raise ProxyURIError("SOCKS5 user and password must be 1-255 and 0-255 bytes")
    return ProxyURI(scheme, host.lower(), port, username, password)


def _recv_exact(sock, n, deadline, error=None):
    return recv_exact(sock, n, deadline, error or ProxyError)


def connect_via_proxy(proxy_uri, address, deadline, sources=None):
    """A socket connected to ``address`` (host, port) through the outgoing proxy.

    Never connects directly. Failures are OSErrors that the SOCKS handler maps
    to reply codes: ConnectionRefusedError (the proxy says refused),
    socket.timeout (deadline), OSError with ENETUNREACH/EHOSTUNREACH, and
    ProxyError for everything else.

    The request is built before we connect, so a target it cannot carry
    (``check_target``) never reaches the proxy::

        parse_proxy_uri -> build the request -> connect to the proxy -> exchange -> tunnel
    """
    try:
        proxy = parse_proxy_uri(proxy_uri)
    except ProxyURIError as exc:
        raise ProxyError("bad outgoing proxy: %s" % exc)
    build, exchange = _PROTOCOLS[proxy.scheme]
    try:
        request = build(proxy, address)
    except ValueError as exc:
        raise ProxyError("cannot ask the %s proxy for this target: %s" % (proxy.scheme, exc))
    try:
        sock = connect((proxy.host, proxy.port), deadline.remaining(), sources)
    except socket.timeout:
        raise
    except OSError as exc:
        raise ProxyError("cannot reach the %s proxy: %s" % (proxy.scheme, exc.strerror or exc))
    try:
        exchange(sock, proxy, request, deadline)
    except BaseException:
        sock.close()
        raise
    return sock


def check_target(host, ipv6=True):
    """ValueError unless a proxy request can carry ``host``: an IP literal
    (IPv6 only when ``ipv6``), or a host name by ``socks.is_valid_hostname``.
    The name goes into a SOCKS field or an HTTP header line, where CR/LF would
    inject. The message never quotes the host: it may be the bridge's address,
    which the log scrubs."""
    literal = "%" not in host and is_ip_literal(host)   # a scope (fe80::1%eth0) cannot travel
    if not literal and not socks.is_valid_hostname(host):
        raise ValueError("the target is not a host name (a character no host name has, "
                         "or longer than 255 bytes)")
    if literal and not ipv6 and ":" in host:
        raise ValueError("SOCKS4a cannot carry an IPv6 address")


# --- SOCKS5 (RFC 1928, user and password RFC 1929): the bytes come from socks.py ---------

# SOCKS5 reply codes (RFC 1928 section 6) -> the error we raise.
_SOCKS5_FAILURES = {
    socks.NETWORK_UNREACHABLE:
        lambda: OSError(errno.ENETUNREACH, "the proxy says: network unreachable"),
    socks.HOST_UNREACHABLE:
        lambda: OSError(errno.EHOSTUNREACH, "the proxy says: host unreachable"),
    socks.CONNECTION_REFUSED:
        lambda: ConnectionRefusedError(errno.ECONNREFUSED, "the proxy says: connection refused"),
    socks.TTL_EXPIRED: lambda: socket.timeout("the proxy says: TTL expired"),
}


def _socks5_request(proxy, address):
    """VER=05 CMD=01 RSV=00 ATYP DST.ADDR DST.PORT"""
    check_target(address[0])
    return socks.socks5_connect(*address)


def _socks5_userpass(user, password):
    """RFC 1929's VER=01 ULEN UNAME PLEN PASSWD for a proxy URI's user and
    password (str, or None for no password).

    The RFC asks for PLEN >= 1, so ``socks.socks5_userpass`` refuses an empty
    password; a URI with a user and no password (socks5://tor@HOST:PORT) is
    sent with PLEN=0, as curl sends it and as SOCKS5 proxies take it.
    """
    user, password = user.encode(), (password or "").encode()
    if password:
        return socks.socks5_userpass(user, password)
    return bytes([socks.USERPASS_VERSION, len(user)]) + user + b"\x00"   # PLEN=0, no PASSWD


def _socks5(sock, proxy, request, deadline):
    # 1. Greeting: offer username/password (02) only when the URI has a user.
    methods = [socks.METHOD_NO_AUTH]
    if proxy.username is not None:
        methods.append(socks.METHOD_USERPASS)
    send_all(sock, socks.socks5_greeting(methods), deadline)
    version, method = _recv_exact(sock, 2, deadline)          # VER METHOD
    if version != socks.SOCKS5_VERSION:
        raise ProxyError("the proxy does not speak SOCKS5")
    # 2. RFC 1929 when the proxy chose it: -> VER=01 STATUS (00 = success).
    if method == socks.METHOD_USERPASS and proxy.username is not None:
        send_all(sock, _socks5_userpass(proxy.username, proxy.password), deadline)
        if _recv_exact(sock, 2, deadline)[1] != 0:
            raise ProxyError("the SOCKS5 proxy rejected our username and password")
    elif method != socks.METHOD_NO_AUTH:
        raise ProxyError("the SOCKS5 proxy accepts none of our authentication methods")
    # 3. CONNECT -> VER REP RSV ATYP BND.ADDR BND.PORT. Read exactly the reply:
    #    what follows it is the tunnel's first bytes.
    send_all(sock, request, deadline)
    reply = _recv_exact(sock, 4, deadline)
    if reply[1] != socks.SUCCEEDED:
        make = _SOCKS5_FAILURES.get(reply[1])
        raise make() if make else ProxyError("the SOCKS5 proxy failed (reply 0x%02x)" % reply[1])
    try:
        more = socks.socks5_reply_length(reply)
        while more:
            reply += _recv_exact(sock, more, deadline)
            more = socks.socks5_reply_length(reply)
    except ValueError:
        raise ProxyError("the SOCKS5 proxy sent address type %d" % reply[3])


# --- SOCKS4a ------------------------------------------------------------------------------

def _socks4a_request(proxy, address):
    """VN=04 CD=01 DSTPORT DSTIP USERID 00, for a name DSTIP=0.0.0.1 and HOST 00 after."""
    check_target(address[0], ipv6=False)
    return socks.socks4a_connect(address[0], address[1], (proxy.username or "").encode())


def _socks4a(sock, proxy, request, deadline):
    send_all(sock, request, deadline)
    # Reply: VN=00 CD DSTPORT(2) DSTIP(4); CD=5A granted, anything else refused.
    reply = _recv_exact(sock, 8, deadline)
    if reply[1] != socks.SOCKS4_GRANTED:
        raise ProxyError("the SOCKS4a proxy rejected the request (0x%02x)" % reply[1])


# --- HTTP CONNECT --------------------------------------------------------------------------

def _http_request(proxy, address):
    """CONNECT HOST:PORT HTTP/1.1, Host, and Proxy-Authorization: Basic when the URI has a user."""
    check_target(address[0])
    authority = format_address(address)
    request = "CONNECT %s HTTP/1.1\r\nHost: %s\r\n" % (authority, authority)
    if proxy.username is not None:
        credentials = "%s:%s" % (proxy.username, proxy.password or "")
        request += "Proxy-Authorization: Basic %s\r\n" % base64.b64encode(
            credentials.encode()).decode("ascii")
    return (request + "\r\n").encode()


def _http_connect(sock, proxy, request, deadline):
    send_all(sock, request, deadline)
    # Read the response head one byte at a time: the server's first bytes may
    # follow the blank line at once, and they belong to the tunnel.
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        if len(head) > 16384:
            raise ProxyError("the HTTP proxy's response header is too long")
        head += _recv_exact(sock, 1, deadline)
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    words = status.split(" ", 2)
    # [0-9]{3}, not str.isdigit(): that also accepts digits such as "²" that int() refuses.
    if len(words) < 2 or not words[0].startswith("HTTP/1.") or not re.fullmatch("[0-9]{3}", words[1]):
        raise ProxyError("the proxy does not speak HTTP: %r" % status[:80])
    if not 200 <= int(words[1]) < 300:
        raise ProxyError("the HTTP proxy answered %r" % status[:80])


# scheme -> (build the request, exchange it on the connected socket)
_PROTOCOLS = {"socks5": (_socks5_request, _socks5),
              "socks4a": (_socks4a_request, _socks4a),
              "http": (_http_request, _http_connect)}


# --- Extended ORPort (server side) ------------------------------------------------------

COOKIE_HEADER = b"! Extended ORPort Auth Cookie !\n"
AUTH_SAFE_COOKIE = 0x01
SERVER_HASH_LABEL = b"ExtORPort authentication server-to-client hash"
CLIENT_HASH_LABEL = b"ExtORPort authentication client-to-server hash"
EXT_DONE, EXT_USERADDR, EXT_TRANSPORT = 0x0000, 0x0001, 0x0002
EXT_OKAY, EXT_DENY = 0x1000, 0x1001


def read_cookie(path):
    """The 32-byte cookie from Tor's 64-byte cookie file (header | cookie)."""
    data = Path(path).read_bytes()
    if len(data) != 64 or not data.startswith(COOKIE_HEADER):
        raise ExtORPortError("%s is not an Extended ORPort cookie file" % path)
    return data[32:]


def ext_command(kind, body=b""):
    """TYPE (2 bytes) | LENGTH (2 bytes) | BODY"""
    return struct.pack("!HH", kind, len(body)) + body


def ext_orport_handshake(sock, cookie_file, client_address, transport_name, deadline):
    """Authenticate to Tor's Extended ORPort and report one client.

    Raises ExtORPortError (an OSError) when Tor does not let the connection
    through; the caller closes it.
    """
    # The cookie changes when Tor restarts: read it for each connection.
    cookie = read_cookie(cookie_file)

    def recv(n):
        return _recv_exact(sock, n, deadline, ExtORPortError)

    # 1. Tor lists its authentication types, ended by 0x00.
    offered = b""
    while not offered.endswith(b"\0"):
        if len(offered) > 256:
            raise ExtORPortError("Extended ORPort: endless list of authentication types")
        offered += recv(1)
    if AUTH_SAFE_COOKIE not in offered[:-1]:
        raise ExtORPortError("Extended ORPort does not offer SAFE_COOKIE authentication")
    # 2. We choose SAFE_COOKIE and send ClientNonce.
    client_nonce = os.urandom(32)
    send_all(sock, bytes([AUTH_SAFE_COOKIE]) + client_nonce, deadline)
    # 3. Tor proves it knows the cookie: ServerHash | ServerNonce.
    reply = recv(64)
    server_hash, server_nonce = reply[:32], reply[32:]
    expected = hmac.new(cookie, SERVER_HASH_LABEL + client_nonce + server_nonce,
                        hashlib.sha256).digest()
    if not hmac.compare_digest(server_hash, expected):
        raise ExtORPortError("Extended ORPort: wrong server hash (is %s Tor's current "
                             "cookie?)" % cookie_file)
    # 4. We prove it: ClientHash.
    client_hash = hmac.new(cookie, CLIENT_HASH_LABEL + client_nonce + server_nonce,
                           hashlib.sha256).digest()
    send_all(sock, client_hash, deadline)
    # 5. Tor's verdict: 1 = success.
    if recv(1) != b"\x01":
        raise ExtORPortError("Extended ORPort refused our authentication")
    # 6. Who the client is and how it came; Tor answers OKAY or DENY.
    host, port = client_address[0].split("%")[0], client_address[1]
    mapped = getattr(ipaddress.ip_address(host), "ipv4_mapped", None)
    if mapped is not None:  # an IPv4 client of a dual-stack [::] listener:
        host = str(mapped)  # Tor's GeoIP would not place ::ffff:1.2.3.4
    useraddr = format_address((host, port)).encode()
    send_all(sock, ext_command(EXT_USERADDR, useraddr)
                       + ext_command(EXT_TRANSPORT, transport_name.encode())
                       + ext_command(EXT_DONE), deadline)
    while True:
        kind, length = struct.unpack("!HH", recv(4))
        if length:
            recv(length)
        if kind == EXT_OKAY:
            return      # 7. From here on: the ordinary OR stream.
        if kind == EXT_DENY:
            raise ExtORPortError("Extended ORPort denied the connection")
        # Any other reply type is ignored (ext-orport-spec).
