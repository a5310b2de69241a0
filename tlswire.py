"""TLS as a passive observer reads it: records, the two hellos, and the JA4 fingerprint.

A TLS connection (webtunnel's, or any HTTPS) starts with two messages in clear,
before any key exists. Everything here reads them from the bytes one side sent
(``pcap.Conversation.streams``); no sockets, no ``ssl``, nothing printed.

The record layer (RFC 8446 5.1) and the hello layout (4.1.2, 4.1.3)::

    record     type(1) | legacy_record_version(2) | length(2) | fragment
                 22 handshake, 20 change_cipher_spec, 21 alert, 23 application_data
    handshake  msg_type(1) | length(3) | body      1 ClientHello, 2 ServerHello;
                                                   one message may span records
    ClientHello  legacy_version(2) | random(32) | session_id(<1>) |
                 cipher_suites(<2>, 2 each) | compression_methods(<1>) | extensions(<2>)
    ServerHello  legacy_version(2) | random(32) | session_id(<1>) |
                 cipher_suite(2) | compression_method(1) | extensions(<2>)
    extension    type(2) | length(2) | data        (<n>: an n-byte length, then that many bytes)

JA4 (FoxIO, github.com/FoxIO-LLC/ja4, technical_details/JA4.md) names a
ClientHello in three parts, ``a_b_c``, e.g. ``t13d1516h2_8daaf6152771_e5627efa2ab1``:

    a  "t" (TLS over TCP; "q" QUIC, "d" DTLS)
       version: the highest in supported_versions (43), else legacy_version:
         0304 "13", 0303 "12", 0302 "11", 0301 "10", 0300 "s3", 0002 "s2", other "00"
       "d" when there is a server_name (0), else "i"
       the number of cipher suites, then of extensions: 2 digits each, at most 99
       the first and last characters of the first ALPN (16) protocol; "00" without
         one; the first and last hex digits of it when either end is not [0-9A-Za-z]
    b  the first 12 hex digits of SHA-256 of the cipher suites as 4-digit lowercase
       hex, sorted, joined by ","
    c  the same of the extension types, sorted, without server_name and ALPN (a
       already says them), then "_" and the signature_algorithms (13) in their
       order (no "_" when there are none)
    GREASE values (RFC 8701: 0a0a, 1a1a, ... fafa) are left out everywhere, and
    an empty list hashes to "000000000000".

Where FoxIO's own tools differ from this text, the text is followed: its Rust
tool prints a one-character ALPN as "a0" and a non-ASCII end as "9", and keeps
GREASE among the signature algorithms; the spec says "aa", the hex digits, and
"ignore GREASE values anywhere". No ClientHello Python's ssl sends meets these cases.
"""

import hashlib
import struct

HANDSHAKE, CHANGE_CIPHER_SPEC, ALERT, APPLICATION_DATA = 22, 20, 21, 23
RECORD_TYPES = {HANDSHAKE: "handshake", CHANGE_CIPHER_SPEC: "change_cipher_spec", ALERT: "alert",
                APPLICATION_DATA: "application_data"}
CLIENT_HELLO, SERVER_HELLO = 1, 2
MAX_RECORD = (1 << 14) + 2048      # RFC 8446 5.2: the largest TLSCiphertext

SERVER_NAME, SIGNATURE_ALGORITHMS, ALPN, SUPPORTED_VERSIONS, KEY_SHARE = 0, 13, 16, 43, 51

JA4_VERSIONS = {0x0304: "13", 0x0303: "12", 0x0302: "11", 0x0301: "10", 0x0300: "s3", 0x0002: "s2",
                0xFEFF: "d1", 0xFEFD: "d2", 0xFEFC: "d3"}
VERSION_NAMES = {0x0304: "TLS 1.3", 0x0303: "TLS 1.2", 0x0302: "TLS 1.1", 0x0301: "TLS 1.0",
                 0x0300: "SSL 3.0"}
GROUPS = {0x0017: "secp256r1", 0x0018: "secp384r1", 0x0019: "secp521r1", 0x001D: "x25519",
          0x001E: "x448", 0x0100: "ffdhe2048", 0x0101: "ffdhe3072", 0x11EC: "X25519MLKEM768"}
TLS13_SUITES = {0x1301: "TLS_AES_128_GCM_SHA256", 0x1302: "TLS_AES_256_GCM_SHA384",
                0x1303: "TLS_CHACHA20_POLY1305_SHA256"}
# TLS 1.2 suites by key exchange: the ones OpenSSL, Go and the browsers offer.
ECDHE_SUITES = {0xC009, 0xC00A, 0xC013, 0xC014, 0xC023, 0xC024, 0xC027, 0xC028, 0xC02B, 0xC02C,
                0xC02F, 0xC030, 0xCCA8, 0xCCA9}
DHE_SUITES = {0x0033, 0x0039, 0x0067, 0x006B, 0x009E, 0x009F, 0xCCAA}
RSA_SUITES = {0x000A, 0x002F, 0x0035, 0x003C, 0x003D, 0x009C, 0x009D}


def is_grease(value):
    """RFC 8701: 0x0a0a, 0x1a1a, ... 0xfafa, values a peer must ignore."""
    return value & 0x0F0F == 0x0A0A and value >> 8 == value & 0xFF


def records(data):
    """Each complete record at the start of ``data``, as (type, payload), lazily; stops at
    the first thing that is not one (not TLS, or cut short by the end of the capture)."""
    offset = 0
    while offset + 5 <= len(data):
        kind, major, _, length = struct.unpack(">BBBH", data[offset:offset + 5])
        if kind not in RECORD_TYPES or major != 3 or length > MAX_RECORD or offset + 5 + length > len(data):
            return
        yield kind, data[offset + 5:offset + 5 + length]
        offset += 5 + length


class Reader:
    """Big-endian fields off the front of a bytes object; ValueError past its end."""

    def __init__(self, data):
        self.data, self.offset = data, 0

    def take(self, n):
        if self.offset + n > len(self.data):
            raise ValueError("%d bytes wanted at %d of %d" % (n, self.offset, len(self.data)))
        self.offset += n
        return self.data[self.offset - n:self.offset]

    def number(self, n):
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes):           # <n>: a length, then that many bytes
        return self.take(self.number(length_bytes))

    def numbers(self, length_bytes, size=2):  # a vector of ``size``-byte numbers
        data = self.vector(length_bytes)
        return [int.from_bytes(data[i:i + size], "big") for i in range(0, len(data) - size + 1, size)]

    def done(self):
        return self.offset == len(self.data)


class Hello:
    """One ClientHello or ServerHello, as sent; ValueError if it is malformed.

    ``ciphers``: the suites offered (a ServerHello: one, the chosen). ``extensions``:
    [(type, data)]. Both keep the wire order and the GREASE. Read from the extensions:
    ``sni`` (str or None), ``alpn`` ([bytes]), ``signature_algorithms``,
    ``supported_versions`` (a ServerHello: the chosen one), ``key_shares`` ([(group,
    public key)]: a ClientHello's offers, a ServerHello's answer), and ``version``:
    the highest supported version, else legacy_version.
    """

    def __init__(self, client, body):
        r = Reader(body)
        self.client = client
        self.legacy_version = r.number(2)
        self.random = r.take(32)
        self.session_id = r.vector(1)
        self.ciphers = r.numbers(2) if client else [r.number(2)]
        self.compression = r.vector(1) if client else r.take(1)
        self.extensions = []
        if not r.done():
            extensions = Reader(r.vector(2))
            while not extensions.done():
                self.extensions.append((extensions.number(2), extensions.vector(2)))
        if not r.done():
            raise ValueError("%d bytes after the extensions" % (len(body) - r.offset))
        self.sni = self._sni(self.extension(SERVER_NAME))
        data = self.extension(ALPN)                                   # RFC 7301 3.1
        names = Reader(Reader(data).vector(2) if data else b"")
        self.alpn = []
        while not names.done():
            self.alpn.append(names.vector(1))
        data = self.extension(SIGNATURE_ALGORITHMS)
        self.signature_algorithms = Reader(data).numbers(2) if data else []
        data = self.extension(SUPPORTED_VERSIONS)
        self.supported_versions = [] if not data else Reader(data).numbers(1) if client \
            else [Reader(data).number(2)]
        versions = [v for v in self.supported_versions if not is_grease(v)]
        self.version = max(versions) if versions else self.legacy_version
        self.key_shares = self._key_shares(self.extension(KEY_SHARE))

    def extension(self, kind):
        return next((data for ext, data in self.extensions if ext == kind), None)

    @staticmethod
    def _sni(data):
        """The host_name in server_name (RFC 6066 3), or None."""
        names = Reader(Reader(data).vector(2) if data else b"")
        while not names.done():
            kind, name = names.number(1), names.vector(2)
            if kind == 0:
                return name.decode("ascii", "replace")
        return None

    def _key_shares(self, data):
        """RFC 8446 4.2.8: a ClientHello sends a list of KeyShareEntry (group, key), a
        ServerHello one entry, a HelloRetryRequest only the group it asks for."""
        if not data:
            return []
        if not self.client and len(data) == 2:
            return [(Reader(data).number(2), b"")]
        shares = Reader(Reader(data).vector(2) if self.client else data)
        found = []
        while not shares.done():
            found.append((shares.number(2), shares.vector(2)))
        return [(group, key) for group, key in found if not is_grease(group)]


def hello(data, client=True):
    """The ClientHello (or ServerHello) that starts ``data``, the bytes one side sent,
    or None: not TLS, another message first, malformed, or cut short. The message may
    span several handshake records, as the record layer allows."""
    handshake = b""
    for kind, payload in records(data):
        if kind != HANDSHAKE:
            break
        handshake += payload
        if len(handshake) >= 4 and len(handshake) >= 4 + int.from_bytes(handshake[1:4], "big"):
            break
    if len(handshake) < 4 or handshake[0] != (CLIENT_HELLO if client else SERVER_HELLO):
        return None
    length = int.from_bytes(handshake[1:4], "big")
    if len(handshake) < 4 + length:
        return None
    try:
        return Hello(client, handshake[4:4 + length])
    except ValueError:
        return None


def _hash12(text):
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:12] if text else "000000000000"


def _alpn_chars(first):
    if not first:
        return "00"
    if all(b < 0x80 and chr(b).isalnum() for b in (first[0], first[-1])):
        return chr(first[0]) + chr(first[-1])
    return first.hex()[0] + first.hex()[-1]


def ja4_raw(client_hello):
    """(a, b, c) before hashing: JA4_r, as the spec prints it with -r."""
    h = client_hello
    ciphers = [c for c in h.ciphers if not is_grease(c)]
    extensions = [e for e, _ in h.extensions if not is_grease(e)]
    alpn = h.alpn
    a = "t%s%s%02d%02d%s" % (JA4_VERSIONS.get(h.version, "00"), "d" if SERVER_NAME in extensions else "i",
                            min(len(ciphers), 99), min(len(extensions), 99),
                            _alpn_chars(alpn[0] if alpn else b""))
    b = ",".join(sorted("%04x" % c for c in ciphers))
    c = ",".join(sorted("%04x" % e for e in extensions if e not in (SERVER_NAME, ALPN)))
    signatures = ",".join("%04x" % s for s in h.signature_algorithms if not is_grease(s))
    return a, b, c + ("_" + signatures if c and signatures else "")


def ja4(client_hello):
    """The JA4 fingerprint of a ClientHello (a Hello with client=True)."""
    a, b, c = ja4_raw(client_hello)
    return "%s_%s_%s" % (a, _hash12(b), _hash12(c))


def key_exchange(server_hello):
    """(kind, words): where a connection's keys come from, read from its ServerHello.
    kind: "ephemeral" ((EC)DHE: forward secret), "static" (RSA key transport) or "unknown"."""
    suite = server_hello.ciphers[0]
    if server_hello.version == 0x0304:            # TLS 1.3: (EC)DHE always, over the key_share group
        group = server_hello.key_shares[0][0] if server_hello.key_shares else None
        name = GROUPS.get(group, "group %04x" % (group or 0))
        if group == 0x11EC:
            return "ephemeral", "hybrid ECDHE + ML-KEM (%s)" % name
        return "ephemeral", "%s over %s" % ("DHE" if group and group >> 8 == 1 else "ECDHE", name)
    if suite in ECDHE_SUITES:
        return "ephemeral", "ECDHE (TLS 1.2, cipher suite %04x)" % suite
    if suite in DHE_SUITES:
        return "ephemeral", "DHE (TLS 1.2, cipher suite %04x)" % suite
    if suite in RSA_SUITES:
        return "static", "RSA key transport (cipher suite %04x)" % suite
    return "unknown", "cipher suite %04x, whose key exchange this tool does not know" % suite


# --- What it tells a censor: the lines unmask and detect print ----------------------

def summary(client_hello):
    """'SNI wt.test, JA4 t13d...  (TLS 1.3, 18 cipher suites, 11 extensions, no ALPN)'."""
    h, counts = client_hello, ja4_raw(client_hello)[0][4:8]
    return "SNI %s, JA4 %s  (%s, %d cipher suites, %d extensions, %s)" % (
        h.sni or "(none)", ja4(h), VERSION_NAMES.get(h.version, "version %04x" % h.version),
        int(counts[:2]), int(counts[2:]), "ALPN " + h.alpn[0].decode("ascii", "replace") if h.alpn
        else "no ALPN")


# JA4 -> (whose hello, a browser's?), for detect and the demo. The browsers' values are
# captures of those browsers' hellos by third parties; Python's, measured here.
KNOWN_HELLOS = {
    "t13d1515h1_8daaf6152771_0a20fe35d3a5": ("Chrome opening a wss:// WebSocket (webtunnel's browser "
                                             "route)", True),
    "t13d1516h2_8daaf6152771_d8a2da3f94cd": ("Chrome 133 to 149 loading a page", True),
    "t13d1517h1_8daaf6152771_3cbfd9057e0d": ("Firefox 155 offering http/1.1 alone (webtunnel's browser "
                                             "route, utls=hellofirefox_*)", True),
    "t13d1812h1_85036bcba153_d41ae481755e": ("Python's ssl on OpenSSL 3.0, ALPN http/1.1 (webtunnel's "
                                             "ssl route)", False),
    "t13d181100_85036bcba153_d41ae481755e": ("Python's ssl on OpenSSL 3.0, no ALPN", False),
}


def whose(client_hello):
    """"a browser's: ..." or "no browser's: ..." for a JA4 in ``KNOWN_HELLOS``, else
    words saying that this tool's short list does not know it."""
    known = KNOWN_HELLOS.get(ja4(client_hello))
    if known is None:
        return "not in this tool's short list of hellos (tlswire.KNOWN_HELLOS)"
    return "%s: %s" % ("a browser's" if known[1] else "no browser's", known[0])


def exemption_lines(rule):
    """Why the fully-encrypted test lets TLS through; ``rule``: the exemption that applied."""
    return ["TLS is exempt by design (%s): a censor that blocked what starts like TLS would block "
            "the web." % ("Ex5" if rule == "Ex5" else "Ex5, though %s came first here" % rule),
            "  That is webtunnel's point: real TLS to a real web site; what the censor reads instead "
            "is the SNI and the JA4 above."]


def record_counts(data):
    """'1 handshake, 1 change_cipher_spec, 4 application_data (2,305 bytes sealed)'."""
    found = list(records(data))
    kinds = [kind for kind, _ in found]
    sealed = sum(len(body) for kind, body in found if kind == APPLICATION_DATA)
    text = ", ".join("%d %s" % (kinds.count(kind), RECORD_TYPES[kind])
                     for kind in sorted(set(kinds), key=kinds.index))
    return "%s (%s bytes sealed)" % (text or "no complete record", format(sealed, ","))


def _shares(hello, whose):
    return ["      key share %s: %s ..., %s ephemeral public key"
            % (GROUPS.get(group, "%04x" % group), key[:8].hex(" "), whose) for group, key in hello.key_shares]


def explain(client_hello, client_data, server_data, client_name, server_name):
    """unmask's lines for a TLS connection: what is in clear, where its keys come from,
    what a censor sees and what stays sealed. ``*_name``: how to call each side."""
    answer = hello(server_data, client=False)
    lines = ["TLS (webtunnel looks exactly like this: HTTPS to a web site): the obfs2 attack has",
             "nothing to work on. Bytes 0..23 are a record header and the start of a ClientHello, not",
             "a seed and an encrypted magic; nothing in clear is a key.",
             "  %s: a ClientHello, in clear: %s" % (client_name, summary(client_hello))]
    lines += _shares(client_hello, "the client's")
    if answer is None:
        kind, how = "ephemeral", ("(EC)DHE: the ServerHello is not in the capture, but TLS 1.3, which "
                                  "the ClientHello offers, has no other key exchange")
    else:
        kind, how = key_exchange(answer)
        suite = answer.ciphers[0]
        lines.append("  %s: a ServerHello, in clear: %s, cipher suite %04x%s" % (
            server_name, VERSION_NAMES.get(answer.version, "version %04x" % answer.version), suite,
            " (%s)" % TLS13_SUITES[suite] if suite in TLS13_SUITES else ""))
        lines += _shares(answer, "the server's")
    lines += ["  records from the %s: %s" % (client_name, record_counts(client_data)),
              "  records from the %s: %s" % (server_name, record_counts(server_data))]
    if kind == "static":
        lines += ["  The keys come from %s: the client sent the premaster secret encrypted" % how,
                  "  to the certificate's key, so whoever holds that key can decrypt this recording. Not",
                  "  forward secret; TLS 1.3 (and webtunnel's clients) never do this."]
    elif kind == "unknown":
        lines += ["  The keys come from the key exchange of %s; no key crossed the wire." % how]
    else:
        lines += ["  The keys come from an ephemeral exchange, %s:" % how,
                  "  each side's private value never crossed the wire and is erased after the handshake,",
                  "  so this recording stays sealed, even to whoever later gets the server's certificate",
                  "  key (forward secrecy)."]
    certificate = (["encrypted under TLS 1.3,", "  but anyone can fetch it by connecting with the same SNI."]
                   if answer is None or answer.version == 0x0304 else ["in clear under TLS 1.2.", None])
    return lines + [line for line in (
        "  What a censor sees: the SNI and the JA4 above (they tell Python or Go from a browser),",
        "  the sizes and timing of the records, and the server's certificate: " + certificate[0],
        certificate[1],
        "  What it does not see: the HTTP request inside, for webtunnel GET /<secret path> with",
        "  Upgrade: websocket, and everything after it. Without the path, a prober gets the cover site.",
    ) if line]


# --- Tor inside TLS: the exact record lengths it leaves ---------------------------------
#
# A tunnel that carries Tor's TLS inside an outer TLS (webtunnel) seals each inner write
# in one outer record unless the sender cuts it: the outer record's length field = inner
# bytes + 17 (a 1-byte inner content type and a 16-byte GCM tag; TLS 1.3, AES-GCM). Two
# kinds of inner write then have an exact length a rule can match, no classifier needed:
#   Tor's ClientHello: a 512-byte handshake message in a 517-byte inner record -> 534
#   whole cells: k 514-byte cells (link protocol 4) in one inner record of 5 + 514 k + 17
#     bytes -> 514 k + 39: 553, 1067, 1581, ...
# Lengths here are record length fields (the bytes after the 5-byte header).

OUTER_OVERHEAD = 1 + 16              # what an outer TLS 1.3 AES-GCM record adds to a write
TOR_HELLO_RECORD = 5 + 512 + OUTER_OVERHEAD      # 534
CELL = 514                           # a cell of link protocol 4 (4-byte circuit id)
CELLS_OVERHEAD = 5 + 17 + OUTER_OVERHEAD         # inner header, type and tag, then outer: 39


def tor_marker(length):
    """What an outer record whose length field is ``length`` gives away of Tor inside, or
    None: "Tor's ClientHello" for 534, "k whole cells" for 514 k + 39."""
    if length == TOR_HELLO_RECORD:
        return "Tor's ClientHello (517 + 17)"
    cells, rest = divmod(length - CELLS_OVERHEAD, CELL)
    if length > CELLS_OVERHEAD and rest == 0:
        return "%d whole cell%s (%d x 514 + 22 + 17)" % (cells, "s" * (cells > 1), cells)
    return None


def record_lengths(data, kinds=(APPLICATION_DATA,)):
    """The length fields of the complete records at the start of ``data`` whose type is in
    ``kinds``, in order."""
    return [len(body) for kind, body in records(data) if kind in kinds]
