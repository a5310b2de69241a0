r"""SOCKS4, SOCKS4a and SOCKS5 (RFC 1928, RFC 1929), sans-IO: the server side,
and the client side's messages, so that every SOCKS byte is written here.

Server side: only CONNECT. Feed the client's bytes to ``SocksServer.receive``;
it returns the bytes to send back (method choice, authentication status) and,
once the request is complete, sets ``request``. Bytes the client sent after its
request (pipelined application data) are in ``request.trailing``. The caller
then connects and sends ``reply(SUCCEEDED)`` or ``reply(<failure code>)``.

Client side (the outgoing-proxy client, tests): ``socks5_greeting``,
``socks5_userpass``, ``socks5_connect``, ``socks4a_connect`` build messages;
``socks5_reply_length`` says how much of a SOCKS5 reply is still to be read.

Messages, as they appear on the wire::

    SOCKS4   request   VN=04 CD=01 DSTPORT(2) DSTIP(4) USERID... 00
    SOCKS4a  request   VN=04 CD=01 DSTPORT(2) 0.0.0.x  USERID... 00 HOST... 00   (x != 0)
             reply     VN=00 CD=5A|5B DSTPORT(2) DSTIP(4)
    SOCKS5   greeting  VER=05 NMETHODS METHODS...                 -> VER=05 METHOD
             userpass  VER=01 ULEN UNAME PLEN PASSWD (RFC 1929)   -> VER=01 STATUS
             request   VER=05 CMD RSV=00 ATYP DST.ADDR DST.PORT(2)
             reply     VER=05 REP RSV=00 ATYP BND.ADDR BND.PORT(2)
             ATYP 01: 4-byte IPv4 | 03: LEN(1) and LEN bytes of name | 04: 16-byte IPv6

Every split gives the same answer
---------------------------------
A sans-IO parser must not care how the bytes were cut into reads. The outcome
(the request, the replies, the error and its message) is a function of the
byte string alone. A message is judged once it is complete, except for what
its first bytes decide by themselves (a version byte, a SOCKS5 ATYP, a SOCKS4
USERID or host name that has grown past its limit before its NUL), and every
check is made in the order the bytes arrive, also when the whole message is
there at once. So a 1,030-byte USERID is "too long" whether its NUL came in
the same read or not, even when it is not UTF-8 either.

What is refused, and with which reply
-------------------------------------
=====================================  ===================  ======================
the client sends                       SOCKS5 reply         SOCKS4 reply
=====================================  ===================  ======================
first byte neither 04 nor 05           nothing (not SOCKS)  nothing
no method we support                   05 FF                --
bad per-connection arguments           01 01 (RFC 1929)     5B
a command other than CONNECT           REP=07               5B
an unknown ATYP                        REP=08               --
a host name that cannot be one         REP=01               5B
USERID > 1024 bytes, name > 255 bytes  --                   5B
target port 0                          REP=01               5B
=====================================  ===================  ======================

A target host name (SOCKS5 ATYP 03, the SOCKS4a HOST) is passed on to
``connect()``, to an outgoing SOCKS proxy and into an HTTP ``CONNECT`` request
head, so a name with CR or LF would inject header lines there. A name is
accepted only when ``is_valid_hostname`` says so: valid UTF-8, 1..255 bytes,
made of ASCII letters, digits, ``-``, ``.``, ``_`` and non-ASCII letters,
combining marks and digits (IDNA-style names); never a control character,
space, ``@``, ``/``, ``:``, ``%``... The refusal uses REP=01 (general failure),
not 08 (address type not supported): the type, a domain name, is supported;
08 would tell the client to retry the same target as another type. Port 0 is
refused the same way: no one can connect to it, so the request is an error.

Per-connection arguments
------------------------
Tor passes per-connection transport arguments (pt-spec 3.5) as the SOCKS5
username+password or as the SOCKS4 USERID: ``k=v;k=v`` with backslash escaping
``\``, ``;`` and ``=``. ``parse_args`` decodes them; it is also the parser of
every other ``k=v;k=v`` string of the program, and ``split_escaped`` is the
splitting step under it (TOR_PT_SERVER_TRANSPORT_OPTIONS).

The arguments may carry secrets (obfs2's shared-secret, webtunnel's url= path),
and a target host name is as private as an address, so no error message here
quotes either: an argument error gives its position (and at most its key), a
host-name error what is wrong with the name. The log and Tor's log see these
messages (listener.py, managed.py's LOG lines).
"""

import ipaddress
import re
import socket
import string
import struct
import unicodedata

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

MAX_SOCKS4_FIELD = 1024  # USERID: a bound, so a client cannot make us buffer forever
MAX_HOSTNAME = 255       # bytes: what SOCKS5's LEN byte can carry, and DNS's own limit

# The characters of a host name, beyond ASCII letters, digits, "-", "." and "_":
# non-ASCII letters, combining marks and decimal digits (Unicode categories), as
# in internationalised (IDNA) names.
_HOSTNAME_ASCII = frozenset(string.ascii_letters + string.digits + "-._")
_HOSTNAME_CATEGORIES = frozenset(["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd"])


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
        self.host = host          # str: dotted IPv4, IPv6, or a name is_valid_hostname accepts
        self.port = port          # 1..65535
        self.args = args          # dict of per-connection arguments (pt-spec 3.5)
        self.trailing = trailing  # bytes the client sent after the request

    def __repr__(self):
        return "Request(v%d, %r, %d, args=%s)" % (self.version, self.host, self.port,
                                                  sorted(self.args))


# --- k=v;k=v strings ----------------------------------------------------------------

def split_escaped(text, separator):
    r"""Split ``text`` at each ``separator`` that no backslash escapes.

    The parts keep their escapes (``unescape`` removes them), so a later split
    of a part at another separator still sees them, and joining the parts with
    ``separator`` gives ``text`` back. A backslash escapes the one character
    after it, whatever it is; a lone backslash at the end is a ValueError::

        split_escaped(r"obfs2:shared-secret=a\;b;x:k=v", ";")
            -> ["obfs2:shared-secret=a\;b", "x:k=v"]

    Without a backslash this is ``str.split``, which is what most texts take
    (an obfs4 bridge's ``cert=...;iat-mode=0`` on every SOCKS request: the
    character loop below cost a client ~30 us a connection).
    """
    if "\\" not in text:
        return text.split(separator)
    parts, current, i = [], [], 0
    while i < len(text):
        if text[i] == "\\":
            if i + 1 == len(text):
                raise ValueError("a lone backslash ends the text (character %d)" % len(text))
            current.append(text[i:i + 2])
            i += 2
            continue
        if text[i] == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(text[i])
        i += 1
    parts.append("".join(current))
    return parts


def unescape(text):
    r"""Drop each escaping backslash: ``a\;b\\c`` -> ``a;b\c``."""
    if "\\" not in text:
        return text
    return re.sub(r"\\(.)", r"\1", text, flags=re.DOTALL)


def parse_args(text):
    r"""Decode pt-spec 3.5 arguments: ``k=v;k=v``, where ``\`` escapes ``\ ; =``.

    The first unescaped ``=`` of a pair ends its key: ``k=a=b`` is k -> "a=b"
    (tor escapes only ``\`` and ``;``). ``""`` is no arguments at all.

    Raises ValueError on a pair without ``=``, an empty key, a lone trailing
    backslash, and an empty pair, so also on a trailing ``;`` (``a=1;``) and
    on ``a=1;;b=2``: obfs4proxy 0.0.14 refuses those (RFC 1929 ``01 01``,
    seen live), and we match it, so that a bridge line that works with one
    client works with the other. One leniency is kept on purpose: a needless
    escape (``\x``) is the character itself, which obfs4proxy refuses: the
    ``k=v`` parts of TOR_PT_SERVER_TRANSPORT_OPTIONS may escape ``:`` too.

    Errors say where, never what: the text may hold a secret (the module
    docstring). Positions count characters from 1, escapes included.
    """
    args = {}
    if not text:
        return args
    start = 0                      # where this pair begins in ``text``, from 0
    for number, pair in enumerate(split_escaped(text, ";"), 1):
        if not pair:
            raise ValueError("argument %d is empty: a stray ';' at character %d"
                             % (number, max(start, 1)))
        key, *value = split_escaped(pair, "=")
        if not value:
            raise ValueError("argument %d (from character %d) has no '=': KEY=VALUE expected"
                             % (number, start + 1))
        if not key:
            raise ValueError("argument %d (from character %d) has an empty key" % (number, start + 1))
        args[unescape(key)] = unescape("=".join(value))
        start += len(pair) + 1
    return args


# --- Host names and ports -------------------------------------------------------------

def _hostname_problem(name):
    """Why ``name`` (str) can never be a host name, or None when it can be one."""
    if not name:
        return "it is empty"
    for ch in name:
        if ch not in _HOSTNAME_ASCII and (
                ch < "\x80" or unicodedata.category(ch) not in _HOSTNAME_CATEGORIES):
            return "it contains %r" % ch
    if len(name.encode("utf-8")) > MAX_HOSTNAME:
        return "it is longer than %d bytes" % MAX_HOSTNAME
    return None


def is_valid_hostname(text):
    """True when ``text`` (a str) may be a host name: 1..255 bytes of UTF-8,
    only ASCII letters, digits, ``-``, ``.``, ``_`` and non-ASCII letters,
    marks and digits. Never CR, LF, NUL, space, ``@``, ``/``, ``:``...

    Outgoing code checks again with this before a name reaches any request.
    An IP literal is no host name by this rule when it has a ``:`` (IPv6).
    """
    return isinstance(text, str) and _hostname_problem(text) is None


def _ip_literal(host):
    """The IPv4/IPv6 address ``host`` spells, or None. A scoped IPv6 address
    (``fe80::1%eth0``) is none: SOCKS cannot carry the scope."""
    if "%" in host:
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _is_socks4a_marker(dstip):
    """SOCKS4a: a DSTIP of 0.0.0.x with x != 0 means "a host name follows the USERID"."""
    return dstip[:3] == b"\0\0\0" and dstip[3] != 0


def _check_port(port):
    if not 1 <= port <= 0xFFFF:
        raise ValueError("port %r is not 1..65535" % (port,))


def _encoded_hostname(host):
    """The UTF-8 bytes of a host name for a request; ValueError when it cannot be one."""
    problem = _hostname_problem(host)
    if problem:
        raise ValueError("not a host name: %s" % problem)
    return host.encode("utf-8")


# --- Client side: the messages we send to a SOCKS server ------------------------------

def socks5_greeting(methods):
    """The method offer (RFC 1928 section 3)::

        VER=05 NMETHODS(1) METHODS[NMETHODS]     (NMETHODS is 1..255)

    ``methods``: method numbers, e.g. ``[METHOD_NO_AUTH, METHOD_USERPASS]``.
    """
    methods = bytes(list(methods))
    if not 1 <= len(methods) <= 255:
        raise ValueError("a SOCKS5 greeting offers 1..255 methods, not %d" % len(methods))
    return bytes([SOCKS5_VERSION, len(methods)]) + methods


def socks5_userpass(user, password):
    """Username/password authentication (RFC 1929 section 2)::

        VER=01 ULEN(1) UNAME[ULEN] PLEN(1) PASSWD[PLEN]    (ULEN, PLEN are 1..255)

    ``user`` and ``password`` are bytes; the RFC allows neither to be empty.
    """
    user, password = bytes(user), bytes(password)
    for what, field in (("username", user), ("password", password)):
        if not 1 <= len(field) <= 255:
            raise ValueError("an RFC 1929 %s is 1..255 bytes, not %d" % (what, len(field)))
    return bytes([USERPASS_VERSION, len(user)]) + user + bytes([len(password)]) + password


def socks5_connect(host, port):
    """A CONNECT request (RFC 1928 section 4)::

        VER=05 CMD=01 RSV=00 ATYP(1) DST.ADDR DST.PORT(2)
        ATYP=01  DST.ADDR = 4 bytes          (host is an IPv4 literal)
        ATYP=04  DST.ADDR = 16 bytes         (host is an IPv6 literal)
        ATYP=03  DST.ADDR = LEN(1) NAME[LEN] (anything else: a host name, UTF-8)

    ValueError for a port outside 1..65535 and for a name that
    ``is_valid_hostname`` refuses (so also one longer than 255 bytes).
    """
    _check_port(port)
    address = _ip_literal(host)
    if address is None:
        name = _encoded_hostname(host)
        destination = bytes([ATYP_DOMAIN, len(name)]) + name
    else:
        destination = bytes([ATYP_IPV4 if address.version == 4 else ATYP_IPV6]) + address.packed
    return bytes([SOCKS5_VERSION, CMD_CONNECT, 0]) + destination + struct.pack("!H", port)


def socks4a_connect(host, port, userid=b""):
    """A SOCKS4 CONNECT for an IPv4 literal, otherwise a SOCKS4a one::

        VN=04 CD=01 DSTPORT(2) DSTIP(4) USERID 00                (host is IPv4)
        VN=04 CD=01 DSTPORT(2) 0.0.0.1  USERID 00 HOST 00        (host is a name)

    An address 0.0.0.x (x != 0) goes as a name: as DSTIP it would mean "a name follows".

    ``userid`` is bytes without NUL. ValueError for an IPv6 literal (SOCKS4
    cannot carry it), a bad port, or a name ``is_valid_hostname`` refuses.
    """
    _check_port(port)
    userid = bytes(userid)
    if b"\0" in userid:
        raise ValueError("a SOCKS4 USERID cannot contain NUL")
    head = struct.pack("!BBH", SOCKS4_VERSION, CMD_CONNECT, port)
    address = _ip_literal(host)
    if address is not None and address.version != 4:
        raise ValueError("SOCKS4a cannot carry the IPv6 address %s" % host)
    if address is None or _is_socks4a_marker(address.packed):
        return head + b"\0\0\0\1" + userid + b"\0" + _encoded_hostname(host) + b"\0"
    return head + address.packed + userid + b"\0"


def socks5_reply_length(head):
    """How many bytes of a SOCKS5 reply are still to be read after ``head``,
    the reply's first bytes (at least VER REP RSV ATYP; 0 = the reply is complete)::

        VER REP RSV ATYP | BND.ADDR (4, 16, or LEN(1) NAME[LEN]) | BND.PORT(2)

    For ATYP=03 the length lies in the 5th byte: with only 4 bytes this
    returns 1 (read LEN, then ask again). Reading exactly this many bytes
    matters: what follows the reply is the tunnel's data. ValueError on an
    unknown ATYP::

        reply = read(4)
        while socks5_reply_length(reply):
            reply += read(socks5_reply_length(reply))
    """
    head = bytes(head)
    if len(head) < 4:
        raise ValueError("a SOCKS5 reply starts with 4 bytes, not %d" % len(head))
    atyp = head[3]
    if atyp == ATYP_IPV4:
        total = 4 + 4 + 2
    elif atyp == ATYP_IPV6:
        total = 4 + 16 + 2
    elif atyp == ATYP_DOMAIN:
        if len(head) < 5:
            return 5 - len(head)
        total = 5 + head[4] + 2
    else:
        raise ValueError("SOCKS5 reply with unknown address type %d" % atyp)
    return max(total - len(head), 0)


# --- Server side ---------------------------------------------------------------------

def _socks5_reply(code, host="0.0.0.0", port=0):
    """VER=05 REP RSV=00 ATYP BND.ADDR BND.PORT"""
    if host == "0.0.0.0" and port == 0 and code in _SOCKS5_REPLIES:    # every reply of ours
        return _SOCKS5_REPLIES[code]
    address = ipaddress.ip_address(host)
    atyp = ATYP_IPV4 if address.version == 4 else ATYP_IPV6
    return struct.pack("!BBBB", SOCKS5_VERSION, code, 0, atyp) + address.packed + struct.pack("!H", port)


# Each reply code's answer with BND 0.0.0.0:0, made once (parsing the address for
# every answer cost more than the rest of a SOCKS5 exchange).
_SOCKS5_REPLIES = {code: struct.pack("!BBBB4sH", SOCKS5_VERSION, code, 0, ATYP_IPV4, b"\0" * 4, 0)
                   for code in range(256)}


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

    States (``_step``)::

        _version --04--> _socks4_request ----------------------------> request
                 --05--> _socks5_greeting --02--> _socks5_userpass --> _socks5_request --> request
                                          --00------------------------^
    """

    def __init__(self):
        self._buffer = bytearray()
        self._step = SocksServer._version   # the function: a bound method would be a cycle
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
                step = self._step(self)
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
    # send (possibly b""), or None when the message is not complete yet. A step
    # judges only a complete message or a field already past its limit, so the
    # outcome never depends on how the bytes were split.

    def _fail(self, message, code):
        raise SocksError(message, self.reply(code))

    def _version(self):
        if not self._buffer:
            return None
        version = self._buffer[0]
        if version == SOCKS5_VERSION:
            self._step = SocksServer._socks5_greeting
        elif version == SOCKS4_VERSION:
            self._step = SocksServer._socks4_request
        else:
            # Not SOCKS at all (an HTTP client, a prober): no reply we could
            # send would mean anything to it.
            raise SocksError("not a SOCKS4 or SOCKS5 client (first byte 0x%02x)" % version)
        self.version = version
        return b""

    def _nul_terminated(self, start, limit, what):
        """The field from ``start`` to the next NUL, and the offset after the NUL;
        (None, None) while the NUL has not come. A field longer than ``limit``
        is refused as soon as that many bytes have come, NUL or not."""
        end = self._buffer.find(b"\0", start)
        if (len(self._buffer) if end < 0 else end) - start > limit:
            self._fail("%s is longer than %d bytes" % (what, limit), GENERAL_FAILURE)
        if end < 0:
            return None, None
        return bytes(self._buffer[start:end]), end + 1

    def _socks4_request(self):
        # VN=04 CD DSTPORT(2) DSTIP(4) USERID NUL [HOST NUL]
        if len(self._buffer) < 8:
            return None
        userid, consumed = self._nul_terminated(8, MAX_SOCKS4_FIELD, "SOCKS4 USERID")
        if userid is None:
            return None
        cd, port, ip = struct.unpack("!xBH4s", self._buffer[:8])
        socks4a = _is_socks4a_marker(ip)
        if socks4a:
            raw_host, consumed = self._nul_terminated(consumed, MAX_HOSTNAME, "SOCKS4a host name")
            if raw_host is None:
                return None
        # The message is complete.
        if cd != CMD_CONNECT:
            self._fail("SOCKS4 command %d is not supported (CONNECT only)" % cd,
                       COMMAND_NOT_SUPPORTED)
        if socks4a:
            host = self._hostname(raw_host, "SOCKS4a host name")
        else:
            host = socket.inet_ntoa(ip)          # dotted decimal, as ipaddress writes it
        self._check_target_port(port)
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
            self._step = SocksServer._socks5_userpass
            return bytes([SOCKS5_VERSION, METHOD_USERPASS])
        if METHOD_NO_AUTH in methods:
            self._step = SocksServer._socks5_request
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
        self._step = SocksServer._socks5_request
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
        # The message is complete.
        if cmd != CMD_CONNECT:
            self._fail("SOCKS5 command %d is not supported (CONNECT only)" % cmd,
                       COMMAND_NOT_SUPPORTED)
        if atyp == ATYP_DOMAIN:
            host = self._hostname(bytes(b[5:end]), "SOCKS5 domain name")
        else:
            raw = bytes(b[4:end])
            host = socket.inet_ntoa(raw) if atyp == ATYP_IPV4 else str(ipaddress.IPv6Address(raw))
        port = struct.unpack("!H", b[end:end + 2])[0]
        self._check_target_port(port)
        self._finish(host, port, self._args, end + 2)
        return b""

    def _hostname(self, raw, what):
        """A target host name from the wire, or a refusal (see the module docstring)."""
        # Never the name itself: it is the target, which the log scrubs like an address.
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self._fail("%s is not UTF-8 (byte %d of %d)" % (what, exc.start + 1, len(raw)),
                       GENERAL_FAILURE)
        problem = _hostname_problem(name)
        if problem:
            self._fail("%s is not a host name: %s" % (what, problem), GENERAL_FAILURE)
        return name

    def _check_target_port(self, port):
        if port == 0:
            self._fail("target port 0: nothing can be reached there", GENERAL_FAILURE)

    def _parse_args(self, raw, failure_reply):
        """pt-spec 3.5 arguments from the SOCKS4 USERID or the SOCKS5
        UNAME | PASSWD bytes, decoded the same way for both."""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:   # its text quotes a byte of the arguments: not said
            raise SocksError("bad per-connection arguments: not UTF-8 (byte %d of %d)"
                             % (exc.start + 1, len(raw)), failure_reply)
        try:
            return parse_args(text)
        except ValueError as exc:
            raise SocksError("bad per-connection arguments: %s" % exc, failure_reply)

    def _finish(self, host, port, args, consumed):
        trailing = bytes(self._buffer[consumed:])
        self._buffer = bytearray()
        self.request = Request(self.version, host, port, args, trailing)
