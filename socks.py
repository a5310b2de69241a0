"""The server side of SOCKS4, SOCKS4a and SOCKS5 (RFC 1928, RFC 1929), sans-IO.

Only CONNECT. Feed the client's bytes to ``SocksServer.receive``; it returns
the bytes to send back (method choice, authentication status) and, once the
request is complete, sets ``request``. Bytes the client sent after its request
(pipelined application data) are in ``request.trailing``. The caller then
connects and sends ``reply(SUCCEEDED)`` or ``reply(<failure code>)``.

Messages, as they appear on the wire::

    SOCKS4   VN=04 CD=01 DSTPORT(2) DSTIP(4) USERID... 00
    SOCKS4a  VN=04 CD=01 DSTPORT(2) 0.0.0.x    USERID... 00 HOST... 00
    SOCKS5   greeting  VER=05 NMETHODS METHODS...
             userpass  VER=01 ULEN UNAME PLEN PASSWD           (RFC 1929)
             request   VER=05 CMD RSV=00 ATYP DST.ADDR DST.PORT(2)

Tor passes per-connection transport arguments (pt-spec 3.5) as the SOCKS5
username+password or as the SOCKS4 USERID: ``k=v;k=v`` with backslash escaping
``\\``, ``;`` and ``=``. ``parse_args`` decodes them.
"""

import ipaddress
import struct

SOCKS4_VERSION = 4
SOCKS5_VERSION = 5
CMD_CONNECT = 1

METHOD_NO_AUTH = 0x00
METHOD_USERPASS = 0x02
METHOD_NONE_ACCEPTABLE = 0xFF

# RFC 1929 username/password subnegotiation: VER=01, then STATUS (00 = success;
# anything else is a failure, after which the server closes).
USERPASS_VERSION = 0x01
USERPASS_SUCCESS = b"\x01\x00"
USERPASS_FAILURE = b"\x01\x01"

ATYP_IPV4 = 1
ATYP_DOMAIN = 3
ATYP_IPV6 = 4

# SOCKS5 reply codes (RFC 1928 section 6).
SUCCEEDED = 0x00
GENERAL_FAILURE = 0x01
NOT_ALLOWED = 0x02
NETWORK_UNREACHABLE = 0x03
HOST_UNREACHABLE = 0x04
CONNECTION_REFUSED = 0x05
TTL_EXPIRED = 0x06
COMMAND_NOT_SUPPORTED = 0x07
ADDRESS_TYPE_NOT_SUPPORTED = 0x08

# SOCKS4 has one success and one failure code.
SOCKS4_GRANTED = 0x5A
SOCKS4_REJECTED = 0x5B

MAX_SOCKS4_FIELD = 1024  # USERID and HOST: a bound, so a client cannot make us buffer forever


class SocksError(Exception):
    """The client broke SOCKS or asked for what we do not do.

    What happens next: the caller sends ``reply`` (possibly empty: an unknown
    version gets no answer) and closes the connection.
    """

    def __init__(self, message, reply=b""):
        super().__init__(message)
        self.reply = reply


class Request:
    """A complete CONNECT request."""

    def __init__(self, version, host, port, args, trailing):
        self.version = version    # 4 or 5 (4a is version 4 with a host name)
        self.host = host          # str: dotted IPv4, IPv6, or a domain name
        self.port = port
        self.args = args          # dict of per-connection arguments (pt-spec 3.5)
        self.trailing = trailing  # bytes the client sent after the request

    def __repr__(self):
        return "Request(v%d, %r, %d, args=%s)" % (self.version, self.host, self.port,
                                                  sorted(self.args))


def parse_args(text):
    """Decode pt-spec 3.5 arguments: ``k=v;k=v``, ``\\`` escapes ``\\ ; =``.

    Raises ValueError on a pair without ``=``, an empty key or a dangling
    backslash.
    """
    args = {}
    if not text:
        return args
    pairs, current, escaped = [], [], False
    for ch in text:
        if escaped:
            current.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ";":
            pairs.append(current)
            current = []
        else:
            current.append(ch)
    if escaped:
        raise ValueError("argument string ends in a lone backslash")
    pairs.append(current)
    for tokens in pairs:
        if not tokens:
            continue
        if "=" not in tokens:  # only an unescaped "=" is a bare token
            raise ValueError("argument %r has no '='" % "".join(tokens))
        split = tokens.index("=")
        key = "".join(t[-1] for t in tokens[:split])
        value = "".join(t[-1] for t in tokens[split + 1:])
        if not key:
            raise ValueError("argument with an empty key")
        args[key] = value
    return args


def _socks5_reply(code, host="0.0.0.0", port=0):
    """VER=05 REP RSV=00 ATYP BND.ADDR BND.PORT"""
    address = ipaddress.ip_address(host)
    atyp = ATYP_IPV4 if address.version == 4 else ATYP_IPV6
    return struct.pack("!BBBB", SOCKS5_VERSION, code, 0, atyp) + address.packed + struct.pack("!H", port)


def _socks4_reply(granted):
    """VN=00 CD=5A|5B DSTPORT(2) DSTIP(4): the address fields are ignored by clients."""
    return struct.pack("!BBH4s", 0, SOCKS4_GRANTED if granted else SOCKS4_REJECTED, 0, b"\0" * 4)


class SocksServer:
    """One client's SOCKS negotiation, fed bytes in any split.

    ``receive(data) -> bytes`` returns what to send back now. When the request
    is complete, ``request`` is set and further ``receive`` calls are an error.
    ``receive`` raises ``SocksError`` as soon as the bytes so far show the
    client is wrong; its ``reply`` is everything to send before closing,
    including the answers to earlier messages that came in the same chunk.
    ``reply(code, host, port)`` formats the final answer for the version the
    client spoke (SOCKS4 maps every failure to 5B).
    """

    def __init__(self):
        self._buffer = bytearray()
        self._step = self._version
        self.version = None
        self.request = None
        self._args = {}

    def receive(self, data):
        if self.request is not None:
            raise RuntimeError("socks: receive() after the request was complete")
        self._buffer += data
        out = b""
        while self.request is None:
            try:
                step = self._step()
            except SocksError as exc:
                # A pipelining client gets the answers to the messages before
                # the bad one first, or it would read the failure as one of them.
                exc.reply = out + exc.reply
                raise
            if step is None:  # need more bytes
                break
            out += step
        return out

    def reply(self, code, host="0.0.0.0", port=0):
        if self.version == SOCKS4_VERSION:
            return _socks4_reply(code == SUCCEEDED)
        return _socks5_reply(code, host, port)

    # Each step consumes one message from the buffer and returns the bytes to
    # send (possibly b""), or None when the message is not complete yet.

    def _fail(self, message, code):
        raise SocksError(message, self.reply(code))

    def _version(self):
        if not self._buffer:
            return None
        version = self._buffer[0]
        if version == SOCKS5_VERSION:
            self._step = self._socks5_greeting
        elif version == SOCKS4_VERSION:
            self._step = self._socks4_request
        else:
            # Not SOCKS at all (an HTTP client, a prober): no reply we could
            # send would mean anything to it.
            raise SocksError("not a SOCKS4 or SOCKS5 client (first byte 0x%02x)" % version)
        self.version = version
        return b""

    def _socks4_request(self):
        # VN=04 CD DSTPORT(2) DSTIP(4) USERID NUL [HOST NUL]
        if len(self._buffer) < 9:
            return None
        cd, port, ip = struct.unpack("!xBH4s", self._buffer[:8])
        end = self._buffer.find(b"\0", 8)
        if end < 0:
            if len(self._buffer) > 8 + MAX_SOCKS4_FIELD:
                self._fail("SOCKS4 USERID too long", GENERAL_FAILURE)
            return None
        userid = bytes(self._buffer[8:end])
        consumed = end + 1
        if ip[:3] == b"\0\0\0" and ip[3] != 0:  # SOCKS4a: a host name follows
            host_end = self._buffer.find(b"\0", consumed)
            if host_end < 0:
                if len(self._buffer) > consumed + MAX_SOCKS4_FIELD:
                    self._fail("SOCKS4a host name too long", GENERAL_FAILURE)
                return None
            host = self._decode(self._buffer[consumed:host_end], "SOCKS4a host name")
            if not host:
                self._fail("empty SOCKS4a host name", GENERAL_FAILURE)
            consumed = host_end + 1
        else:
            host = str(ipaddress.IPv4Address(ip))
        if cd != CMD_CONNECT:
            self._fail("SOCKS4 command %d is not supported (CONNECT only)" % cd,
                       COMMAND_NOT_SUPPORTED)
        args = self._parse_args(userid, self.reply(GENERAL_FAILURE))
        self._finish(host, port, args, consumed)
        return b""

    def _socks5_greeting(self):
        # VER=05 NMETHODS METHODS[NMETHODS]
        if len(self._buffer) < 2 or len(self._buffer) < 2 + self._buffer[1]:
            return None
        methods = self._buffer[2:2 + self._buffer[1]]
        del self._buffer[:2 + len(methods)]
        # A client that offers username/password may be passing arguments: choose it.
        if METHOD_USERPASS in methods:
            self._step = self._socks5_userpass
            return bytes([SOCKS5_VERSION, METHOD_USERPASS])
        if METHOD_NO_AUTH in methods:
            self._step = self._socks5_request
            return bytes([SOCKS5_VERSION, METHOD_NO_AUTH])
        raise SocksError("SOCKS5 client offers no method we support",
                         bytes([SOCKS5_VERSION, METHOD_NONE_ACCEPTABLE]))

    def _socks5_userpass(self):
        # VER=01 ULEN UNAME[ULEN] PLEN PASSWD[PLEN]
        b = self._buffer
        if not b:
            return None
        if b[0] != USERPASS_VERSION:
            raise SocksError("bad username/password version %d" % b[0], USERPASS_FAILURE)
        if len(b) < 2 or len(b) < 3 + b[1] or len(b) < 3 + b[1] + b[2 + b[1]]:
            return None
        ulen = b[1]
        plen = b[2 + ulen]
        uname = bytes(b[2:2 + ulen])
        passwd = bytes(b[3 + ulen:3 + ulen + plen])
        del b[:3 + ulen + plen]
        # pt-spec 3.5: the arguments fill UNAME and spill into PASSWD; a lone
        # NUL in PASSWD is a placeholder, not part of the arguments.
        if passwd == b"\0":
            passwd = b""
        self._args = self._parse_args(uname + passwd, USERPASS_FAILURE)
        self._step = self._socks5_request
        return USERPASS_SUCCESS

    def _socks5_request(self):
        # VER=05 CMD RSV=00 ATYP DST.ADDR DST.PORT(2), where DST.ADDR is 4
        # bytes (IPv4), 16 bytes (IPv6), or a length byte and a domain name.
        # An unknown ATYP is refused at once: its length cannot be known.
        b = self._buffer
        if len(b) < 4:
            return None
        ver, cmd, atyp = b[0], b[1], b[3]
        if ver != SOCKS5_VERSION:
            self._fail("bad SOCKS5 request version %d" % ver, GENERAL_FAILURE)
        if atyp == ATYP_IPV4:
            end = 4 + 4
        elif atyp == ATYP_IPV6:
            end = 4 + 16
        elif atyp == ATYP_DOMAIN:
            if len(b) < 5:
                return None
            end = 5 + b[4]
        else:
            self._fail("SOCKS5 address type %d is not supported" % atyp,
                       ADDRESS_TYPE_NOT_SUPPORTED)
        if len(b) < end + 2:
            return None
        if cmd != CMD_CONNECT:
            self._fail("SOCKS5 command %d is not supported (CONNECT only)" % cmd,
                       COMMAND_NOT_SUPPORTED)
        if atyp == ATYP_DOMAIN:
            host = self._decode(b[5:end], "SOCKS5 domain name")
            if not host:
                self._fail("empty SOCKS5 domain name", GENERAL_FAILURE)
        else:
            host = str(ipaddress.ip_address(bytes(b[4:end])))
        port = struct.unpack("!H", b[end:end + 2])[0]
        self._finish(host, port, self._args, end + 2)
        return b""

    def _decode(self, raw, what):
        try:
            return bytes(raw).decode("ascii")
        except UnicodeDecodeError:
            self._fail("%s is not ASCII" % what, GENERAL_FAILURE)

    def _parse_args(self, raw, failure_reply):
        """pt-spec 3.5 arguments from the SOCKS4 USERID or the SOCKS5
        UNAME | PASSWD bytes, decoded the same way for both."""
        try:
            return parse_args(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise SocksError("bad per-connection arguments: %s" % exc, failure_reply)

    def _finish(self, host, port, args, consumed):
        trailing = bytes(self._buffer[consumed:])
        self._buffer = bytearray()
        self.request = Request(self.version, host, port, args, trailing)
