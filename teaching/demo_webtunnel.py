"""demo_webtunnel.py: the demo's walk through webtunnel (demo.py says what the demo is):
the bridge line's synthetic address, the ClientHello field by field with its SNI and
JA4, every TLS record of both directions as a censor sees it and as the key log opens
it, the upgrade and the 101 inside, the raw stream after.

webtunnel needs a certificate, and Python's ssl cannot make one: the demo makes a
throwaway CA and a certificate for the URL's host itself (Ed25519, in plain Python: no
package and no `openssl` command), fresh keys each run in a temporary directory that goes
when the demo ends. That works on every machine that runs the rest, ships no private
key, and keeps TLS in the picture, which is what a censor sees of webtunnel. The server
terminates TLS itself (tls-cert=, tls-key=) where a real bridge has nginx."""

import base64
import hashlib
import hmac
import importlib
import ipaddress
import os
import secrets
import ssl
import string
import sys
import textwrap
import time
from urllib.parse import urlsplit

import browser_tls
import proxy
import tlswire
import webtunnel
from cryptoroutes import curve25519
from outbound import format_address, is_ip_literal
from teaching import present
from teaching.demo_base import MESSAGE, Stage, application_bytes, split

# --- webtunnel: the demo's certificate --------------------------------------------------------
#
# Python's ssl can use a certificate but not make one. The demo makes its own: a throwaway
# CA and a leaf for the URL's host, fresh keys every run, kept in the demo's temporary
# directory only while it runs. No key is shipped, and nothing depends on a package or on
# the `openssl` command: the keys are Ed25519 (RFC 8032), whose signature is a few lines
# over the edwards25519 arithmetic curve25519.py already has for obfs4, and which OpenSSL
# (1.1.1 and newer) accepts for TLS 1.2 and 1.3. The DER below is RFC 5280's Certificate,
# written out by hand: tag, length, contents; RFC 8410 says how Ed25519 goes in it.

SEQUENCE, SET = 0x30, 0x31
ED25519 = "1.3.101.112"                     # id-Ed25519: the key's and the signature's algorithm
ED25519_ORDER = (1 << 252) + 27742317777372353535851937790883648493      # L, the base point's order


def der(tag, *contents):
    """One DER element: the tag byte, the length (short or long form), the contents."""
    body = b"".join(contents)
    size = len(body)
    if size < 0x80:
        return bytes([tag, size]) + body
    width = (size.bit_length() + 7) // 8
    return bytes([tag, 0x80 | width]) + size.to_bytes(width, "big") + body


def der_oid(text):
    """An OBJECT IDENTIFIER: 40 x first arc + second, then each arc in base 128."""
    arcs = [int(arc) for arc in text.split(".")]
    body = bytes([40 * arcs[0] + arcs[1]])
    for arc in arcs[2:]:
        digits = [arc & 0x7F]
        while arc > 0x7F:
            arc >>= 7
            digits.insert(0, 0x80 | (arc & 0x7F))
        body += bytes(digits)
    return der(0x06, body)


def der_name(common_name):
    return der(SEQUENCE, der(SET, der(SEQUENCE, der_oid("2.5.4.3"), der(0x0C, common_name.encode()))))


def der_extension(oid, value, critical=False):
    return der(SEQUENCE, der_oid(oid), der(0x01, b"\xff") if critical else b"", der(0x04, value))


def _times_base(scalar):
    """scalar·B on edwards25519, encoded as RFC 8032 5.1.2 says (y, and x's parity on top)."""
    x, y, z, _ = curve25519._ed_mul(curve25519._ED_BASE, scalar)
    inverse = curve25519._inv(z)
    return curve25519._ed_encode(x * inverse % curve25519.P, y * inverse % curve25519.P)


class Ed25519Key:
    """An Ed25519 private key from its 32-byte seed (RFC 8032 5.1.5, 5.1.6)."""

    def __init__(self, seed):
        digest = hashlib.sha512(seed).digest()
        self.seed, self.scalar, self.prefix = seed, curve25519._clamp(digest[:32]), digest[32:]
        self.public = _times_base(self.scalar)

    def sign(self, message):
        """R || S: r = H(prefix || M), R = r·B, k = H(R || A || M), S = r + k·s mod L."""
        def number(*parts):
            return int.from_bytes(hashlib.sha512(b"".join(parts)).digest(), "little") % ED25519_ORDER
        r = number(self.prefix, message)
        encoded_r = _times_base(r)
        s = (r + number(encoded_r, self.public, message) * self.scalar) % ED25519_ORDER
        return encoded_r + s.to_bytes(32, "little")

    def public_key_info(self):
        """SubjectPublicKeyInfo (RFC 8410 4): the algorithm, then the 32-byte key as a BIT STRING."""
        return der(SEQUENCE, der(SEQUENCE, der_oid(ED25519)), der(0x03, b"\x00" + self.public))

    def pem(self):
        """The private key as OpenSSL reads it: PKCS #8 (RFC 8410 7), the seed in an OCTET STRING."""
        body = der(SEQUENCE, der(0x02, b"\x00"), der(SEQUENCE, der_oid(ED25519)),
                   der(0x04, der(0x04, self.seed)))
        text = base64.b64encode(body).decode()
        return "-----BEGIN PRIVATE KEY-----\n%s\n-----END PRIVATE KEY-----\n" % "\n".join(
            textwrap.wrap(text, 64))


def _key_id(key):
    """RFC 5280 4.2.1.2's method 1: SHA-1 of the subjectPublicKey's bits."""
    return hashlib.sha1(key.public).digest()


def _certificate(subject, key, issuer, issuer_key, extensions):
    """An X.509 v3 certificate (DER), signed with Ed25519, valid from an hour ago for a day."""
    algorithm = der(SEQUENCE, der_oid(ED25519))
    now = time.time()
    validity = der(SEQUENCE, *(der(0x17, time.strftime("%y%m%d%H%M%SZ", time.gmtime(now + delta)).encode())
                               for delta in (-3600, 86400)))
    tbs = der(SEQUENCE, der(0xA0, der(0x02, b"\x02")),                 # version 3
              der(0x02, b"\x01" + os.urandom(8)), algorithm, der_name(issuer), validity,
              der_name(subject), key.public_key_info(),
              der(0xA3, der(SEQUENCE, *extensions)))
    return der(SEQUENCE, tbs, algorithm, der(0x03, b"\x00" + issuer_key.sign(tbs)))


def demo_certificates(host):
    """(CA certificate, leaf certificate, leaf key in PEM) for ``host``, all new: the
    leaf names the host in subjectAltName (a DNS name, or an IP address), with the
    extensions strict verifiers (Python 3.13's) ask for."""
    ca_key, leaf_key = Ed25519Key(os.urandom(32)), Ed25519Key(os.urandom(32))
    try:
        alt_name = der(0x87, ipaddress.ip_address(host).packed)       # iPAddress
    except ValueError:
        alt_name = der(0x82, host.encode("idna"))                     # dNSName
    ca = _certificate(DEMO_CA, ca_key, DEMO_CA, ca_key, [
        der_extension("2.5.29.19", der(SEQUENCE, der(0x01, b"\xff")), critical=True),  # CA:TRUE
        der_extension("2.5.29.15", der(0x03, b"\x01\x06"), critical=True),    # keyCertSign, cRLSign
        der_extension("2.5.29.14", der(0x04, _key_id(ca_key)))])
    leaf = _certificate(host, leaf_key, DEMO_CA, ca_key, [
        der_extension("2.5.29.17", der(SEQUENCE, alt_name)),
        der_extension("2.5.29.19", der(SEQUENCE), critical=True),             # CA:FALSE
        der_extension("2.5.29.15", der(0x03, b"\x07\x80"), critical=True),    # digitalSignature
        der_extension("2.5.29.37", der(SEQUENCE, der_oid("1.3.6.1.5.5.7.3.1"))),  # serverAuth
        der_extension("2.5.29.14", der(0x04, _key_id(leaf_key))),
        der_extension("2.5.29.35", der(SEQUENCE, der(0x80, _key_id(ca_key))))])
    return ca, leaf, leaf_key.pem()


DEMO_CA = "obfsproxy.py demo CA (throwaway)"
KEY_LOG = hasattr(ssl.SSLContext, "keylog_filename")    # Python 3.8 and newer write TLS key logs


class TrustingSettings(proxy.Settings):
    """The demo client's settings: each webtunnel config it makes trusts the demo's
    CA (``trust``, an ssl.SSLContext) instead of the system's roots. That is the only
    change from a real client; the demo checks that the ClientHello is the same (JA4)."""

    def __init__(self, transport, trust=None, **settings):
        proxy.Settings.__init__(self, transport, **settings)
        self.trust = trust

    def client_config(self, args=None):
        return proxy.Settings.client_config(self, args).replace(context=self.trust)


class WebTunnelStage(Stage):
    """A bridge at url= (default https://wt.test/<a new secret path>), served by our
    server terminating TLS itself (tls-cert=, tls-key=: the demo's certificate for the
    URL's host) where a real bridge has nginx in front. The client's SOCKS target is
    the bridge line's synthetic address; it dials addr=, the server's port. Its TLS
    context trusts the demo's CA and writes a key log, which ``finish`` reads: the
    TLS secrets only the ends hold, with which the demo opens the recorded records."""

    def __init__(self, options, directory, rng=None):
        Stage.__init__(self, options, directory, rng)
        unknown = sorted(set(options) - {"url"})
        if unknown:
            raise ValueError("the webtunnel demo takes url= only (it makes its own certificate), "
                             "not %s" % ", ".join(unknown))
        choice = secrets.choice if rng is None else rng.choice
        self.url = options.get("url") or "https://wt.test/" + "".join(
            choice(string.ascii_letters + string.digits) for _ in range(16))
        parts = urlsplit(self.url)
        self.tls = parts.scheme.lower() == "https"
        self.server_options = {"url": self.url}
        self.ca = self.leaf = None
        self.key_log_path, self.key_log = directory / "tls-key-log.txt", ""
        if self.tls and parts.hostname:
            self.ca, self.leaf, key = demo_certificates(parts.hostname)
            cert_file, key_file = directory / "demo-leaf.pem", directory / "demo-leaf.key"
            cert_file.write_text(ssl.DER_cert_to_PEM_cert(self.leaf))
            key_file.write_text(key)
            self.server_options.update({"tls-cert": str(cert_file), "tls-key": str(key_file)})

    def client_side(self, settings, cls, server_config, announce, server_address):
        self.target = cls.public_address(server_config, server_address)
        options = dict(announce, addr=format_address(server_address))
        trust = None
        if self.tls:
            # as default_client_context(); PEM, since Python 3.6 and 3.7 built with OpenSSL 3
            # refuse a DER cadata ("unknown error")
            trust = ssl.create_default_context(cadata=ssl.DER_cert_to_PEM_cert(self.ca))
            trust.set_alpn_protocols(webtunnel.ALPN)
            if KEY_LOG:
                trust.keylog_filename = str(self.key_log_path)
        return TrustingSettings(**dict(vars(settings), options=options, trust=trust)), self.target

    def finish(self):
        if self.key_log_path.exists():
            self.key_log = self.key_log_path.read_text()


# --- webtunnel: TLS 1.3 records, opened with the key log ----------------------------------------

TLS13_SUITES = {0x1301: (hashlib.sha256, 16), 0x1302: (hashlib.sha384, 32), 0x1303: (hashlib.sha256, 32)}
HANDSHAKE_TYPES = {1: "ClientHello", 2: "ServerHello", 4: "NewSessionTicket", 8: "EncryptedExtensions",
                   11: "Certificate", 13: "CertificateRequest", 15: "CertificateVerify", 20: "Finished",
                   24: "KeyUpdate"}
EXTENSION_NAMES = {0: "server_name", 5: "status_request", 10: "supported_groups", 11: "ec_point_formats",
                   13: "signature_algorithms", 16: "ALPN", 18: "signed_certificate_timestamp",
                   21: "padding", 22: "encrypt_then_mac", 23: "extended_master_secret",
                   27: "compress_certificate", 28: "record_size_limit", 35: "session_ticket",
                   41: "pre_shared_key", 43: "supported_versions", 45: "psk_key_exchange_modes",
                   49: "post_handshake_auth", 51: "key_share", 17513: "application_settings",
                   65037: "encrypted_client_hello", 65281: "renegotiation_info"}
ALERT_NAMES = {0: "close_notify"}
FFDHE_GROUPS = {0x0102: "ffdhe4096", 0x0103: "ffdhe6144", 0x0104: "ffdhe8192"}
KEY_LOG_LABELS = ("CLIENT_HANDSHAKE_TRAFFIC_SECRET", "SERVER_HANDSHAKE_TRAFFIC_SECRET",
                  "CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0")


def hkdf_expand_label(secret, label, length, digest):
    """RFC 8446 7.1: HKDF-Expand(secret, HkdfLabel, length), HkdfLabel = length(2) |
    "tls13 " + label (1-byte length) | an empty context (1-byte length 0)."""
    full = b"tls13 " + label
    info = length.to_bytes(2, "big") + bytes([len(full)]) + full + b"\x00"
    out, block = b"", b""
    for counter in range(1, 256):
        block = hmac.new(secret, block + info + bytes([counter]), digest).digest()
        out += block
        if len(out) >= length:
            break
    return out[:length]


def traffic_keys(secret, suite):
    """(key, iv) of one direction (RFC 8446 7.3)."""
    digest, key_length = TLS13_SUITES[suite]
    return (hkdf_expand_label(secret, b"key", key_length, digest),
            hkdf_expand_label(secret, b"iv", 12, digest))


def open_record(suite, keys, sequence, header, body):
    """(real content type, content) of one sealed TLS 1.3 record, or None when the
    tag does not check out (RFC 8446 5.2, 5.3): nonce = iv XOR the sequence number,
    the 5-byte header is the associated data, the plaintext ends with the real type
    and optional zero padding."""
    key, iv = keys
    nonce = (int.from_bytes(iv, "big") ^ sequence).to_bytes(12, "big")
    inner = aead_open(suite, key, nonce, header, body)
    if inner is None:
        return None
    inner = inner.rstrip(b"\x00")
    return (inner[-1], inner[:-1]) if inner else None


# The records' AEAD: pycryptodome's (pip's Crypto, or Debian's Cryptodome) where it is
# installed; without it, AES-GCM is built below from the transports' AES-CTR route
# (libcrypto or pure Python) and a plain-Python GHASH, which is plenty for the demo's few
# kilobytes. Two Pythons' OpenSSLs always agree on TLS_AES_256_GCM_SHA384 (both list it
# first); ChaCha20-Poly1305 opens only with pycryptodome.
def _pycryptodome_cipher():
    for namespace in ("Crypto", "Cryptodome"):
        try:
            return importlib.import_module(namespace + ".Cipher")
        except ImportError:
            continue
    return None


_CIPHER = _pycryptodome_cipher()


def aead_open(suite, key, nonce, header, body):
    """The plaintext of ``body`` (ciphertext then a 16-byte tag), or None when the tag
    fails or no route can open this suite."""
    if _CIPHER is None:
        return gcm_open(key, nonce, header, body) if suite != 0x1303 else None
    cipher = (_CIPHER.ChaCha20_Poly1305.new(key=key, nonce=nonce) if suite == 0x1303
              else _CIPHER.AES.new(key, _CIPHER.AES.MODE_GCM, nonce=nonce))
    cipher.update(header)
    try:
        return cipher.decrypt_and_verify(body[:-16], body[-16:])
    except ValueError:
        return None


def ghash(h, data):
    """GHASH (NIST SP 800-38D 6.4) of ``data`` (a multiple of 16 bytes) under ``h``: each
    block XORed in, then multiplied by H in GF(2^128), bits read from the left (6.3)."""
    y = 0
    for at in range(0, len(data), 16):
        x, v, y = y ^ int.from_bytes(data[at:at + 16], "big"), h, 0
        for bit in range(127, -1, -1):
            if x >> bit & 1:
                y ^= v
            v = v >> 1 ^ (0xE1 << 120) if v & 1 else v >> 1
    return y


def gcm_open(key, nonce, header, body):
    """AES-GCM decryption with a 12-byte nonce (SP 800-38D 7.2) over an AES-CTR route:
    H = E(0^128), J0 = nonce || 1, the plaintext is CTR from J0 + 1, the tag
    GHASH(A, C, their bit lengths) XOR E(J0). None when the tag differs."""
    from cryptoroutes.aes_ctr import aes_ctr  # the transports' route: libcrypto, else pure Python
    ciphertext, tag = body[:-16], body[-16:]
    h = int.from_bytes(aes_ctr(key, bytes(16)).encrypt(bytes(16)), "big")
    j0 = nonce + b"\x00\x00\x00\x01"
    stream = aes_ctr(key, j0)
    mask = stream.encrypt(bytes(16))

    def padded(data):
        return data + bytes(-len(data) % 16)
    lengths = (8 * len(header)).to_bytes(8, "big") + (8 * len(ciphertext)).to_bytes(8, "big")
    expected = (ghash(h, padded(header) + padded(ciphertext) + lengths)
                ^ int.from_bytes(mask, "big")).to_bytes(16, "big")
    if not hmac.compare_digest(expected, tag):
        return None
    return stream.encrypt(ciphertext)


def key_log_secrets(text, client_random):
    """{label: secret} of the key log's lines for this connection (SSLKEYLOGFILE's
    format: LABEL <client random hex> <secret hex>)."""
    found = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 3 and words[1] == client_random.hex():
            found[words[0]] = bytes.fromhex(words[2])
    return found


class Record:
    """One TLS record of one direction: where it was (``offset``), what the observer
    saw (``kind``, the header's content type, and the ``body``'s length), and what the
    key log opened it to (``inner``, the real type, None until opened; ``content``;
    ``what``, its name)."""

    def __init__(self, offset, kind, body):
        self.offset, self.kind, self.body = offset, kind, body
        self.inner, self.content, self.what = None, b"", ""


def open_direction(data, suite, handshake_keys, application_keys):
    """Every record of one direction, the sealed ones opened: under the handshake keys
    until this side's Finished, then under the application keys, each key's sequence
    numbers from 0. A record that does not open stays with ``inner`` None."""
    found, offset, keys, sequence, messages = [], 0, handshake_keys, 0, b""
    for kind, body in tlswire.records(data):
        record = Record(offset, kind, body)
        offset += 5 + len(body)
        found.append(record)
        if kind != tlswire.APPLICATION_DATA:
            record.inner, record.content = kind, body
            continue
        opened = open_record(suite, keys, sequence, data[record.offset:record.offset + 5], body)
        sequence += 1
        if opened is None:
            continue
        record.inner, record.content = opened
        if record.inner == tlswire.HANDSHAKE:
            messages += record.content
            names = []
            while len(messages) >= 4 and len(messages) >= 4 + int.from_bytes(messages[1:4], "big"):
                names.append(HANDSHAKE_TYPES.get(messages[0], "type %d" % messages[0]))
                messages = messages[4 + int.from_bytes(messages[1:4], "big"):]
            record.what = ", ".join(names)
            if "Finished" in names and keys is handshake_keys:
                keys, sequence = application_keys, 0
    return found, offset


def handshake_messages(records):
    """{message name: body} of the handshake messages in the opened records."""
    data = b"".join(r.content for r in records if r.inner == tlswire.HANDSHAKE
                    and r.kind == tlswire.APPLICATION_DATA)
    found, at = {}, 0
    while at + 4 <= len(data):
        length = int.from_bytes(data[at + 1:at + 4], "big")
        found.setdefault(HANDSHAKE_TYPES.get(data[at], str(data[at])), data[at + 4:at + 4 + length])
        at += 4 + length
    return found


# --- webtunnel: the walk ---------------------------------------------------------------------------

def walk_webtunnel(walk):
    stage = walk.exchange.stage
    bridge_line_section(walk, stage)
    if not stage.tls:
        walk.observed = "webtunnel over http"
        request, response = upgrade_section(walk, walk.c_sent, walk.s_sent, "on the wire, in clear")
        application_bytes(walk, walk.c_sent[len(request):], walk.s_sent[len(response):],
                          "they were: no TLS, nothing hides them", "it was")
        return
    hello = client_hello_section(walk)
    opened = hello and tls_records_section(walk, hello)
    if not opened:
        return
    c_records, s_records = opened
    walk.records = opened
    c_plain, s_plain = application_data(c_records), application_data(s_records)
    request, response = upgrade_section(walk, c_plain, s_plain, "inside TLS, as the key log opened it")
    stream_section(walk, c_records, c_plain[len(request):], s_plain[len(response):])


def bridge_line_section(walk, stage):
    url, config = stage.url, walk.client.config
    walk.title("The bridge line: a URL, and an address nobody dials")
    print("  url=%s" % url)
    print("  Its path, %s, is the bridge's only secret: the web server answers it with a 101"
          % config.target)
    print("  and every other path with its cover site (here: our server's 404 page).")
    digest = hashlib.sha256(("WEBTUNNEL+" + url).encode("utf-8")).digest()
    synthetic = str(ipaddress.IPv6Address(bytes.fromhex("20010db8") + digest[4:16]))
    print("  The server announces the method at a synthetic address, not where it listens:")
    print('    SHA-256("WEBTUNNEL+" + url) = %s' % walk.style("wire", digest.hex()))
    print("    2001:db8::/32 (the documentation range) + bytes 4..15 of it = [%s]:443" % synthetic)
    walk.check(stage.target == (synthetic, 443), "the synthetic address is not SHA-256's bytes 4..15")
    print("  The bridge line, with the bridge's Tor fingerprint (no Tor here) in its place:")
    print("    " + walk.style("field", "webtunnel [%s]:443 FINGERPRINT %s" % (synthetic, " ".join(
        "%s=%s" % item for item in sorted(walk.exchange.announce.items())))))
    port = urlsplit(url).port or (443 if stage.tls else 80)
    print("  Tor gives the client that address as the SOCKS target, and so did the demo. The client")
    print("  ignores it and dials the host of url= (%s), or addr=, as here: %s."
          % (format_address((config.host, port)), format_address(config.address)))
    walk.check(config.address == walk.exchange.addresses[1], "the client did not dial addr=")
    if stage.tls:
        print("  A real bridge sits behind a web server (nginx) that holds a real certificate and hands")
        print("  only the secret path to it, in plain HTTP. Here our server terminates TLS itself")
        print("  (tls-cert=, tls-key=) with a certificate for %s that the demo made a moment ago,"
              % config.servername)
        print('  signed by "%s" (Ed25519 keys made in plain Python, valid' % DEMO_CA)
        print("  for a day, deleted at exit). The demo's client trusts that CA instead of the system's")
        print("  roots; nothing else differs from a real client.")
    else:
        print("  url=http:// means no TLS: the request, the path and every byte after them cross in")
        print("  clear (for tests, or behind another tunnel). Leave url= out for the https:// bridge.")


def client_hello_section(walk):
    config, first = walk.client.config, walk.exchange.client.pieces[0]
    hello = tlswire.hello(first)
    walk.title("The ClientHello: the client's first write, %d bytes, in clear" % len(first))
    if not walk.check(hello is not None, "the client's first write is not a ClientHello"):
        return None
    walk.side = "client"
    walk.field("offset", "length", "field", "on the wire", "meaning")
    walk.field(0, 5, "record", present.hexline(first[:5]),
               "handshake (22), 03 01, length %d" % int.from_bytes(first[3:5], "big"))
    walk.field(5, 4, "message", present.hexline(first[5:9]),
               "ClientHello (1), length %d" % int.from_bytes(first[6:9], "big"))
    walk.field(9, 2, "version", present.hexline(first[9:11]), "TLS 1.2 (the versions offered: an extension)")
    walk.field(11, 32, "random", present.hexline(hello.random, 8), "new for every connection")
    session = 1 + len(hello.session_id)
    walk.field(43, session, "session_id", present.hexline(first[43:43 + session], 8),
               "random too (RFC 8446 D.4)")
    at, length = 43 + session, 2 + 2 * len(hello.ciphers)
    walk.field(at, length, "suites", present.hexline(first[at:at + length], 8),
               "%d cipher suites, TLS 1.3's first:" % len(hello.ciphers))
    for line in textwrap.wrap(" ".join("%04x" % c for c in hello.ciphers), 90):
        print("      " + line)
    print("  then compression (01 00: none) and %d extensions, in this order:" % len(hello.extensions))
    for kind, data in hello.extensions:
        words = textwrap.wrap(extension_words(hello, kind, data), 64) or [""]
        print("    %5d  %-22s %s" % (kind, EXTENSION_NAMES.get(kind, "?"), words[0]))
        for line in words[1:]:
            print("    %5s  %-22s %s" % ("", "", line))

    a, b, c = tlswire.ja4_raw(hello)
    ja4 = tlswire.ja4(hello)
    print("  JA4 = %s (FoxIO's fingerprint of a ClientHello; tlswire.ja4):" % walk.style("field", ja4))
    print("    %s  TCP, TLS %s, %s, %d cipher suites, %d extensions, ALPN %s"
          % (a, "1.3" if a[1:3] == "13" else a[1:3], "an SNI" if a[3] == "d" else "no SNI",
             int(a[4:6]), int(a[6:8]), a[8:] if a[8:] != "00" else "none"))
    print("    %s  = SHA-256 of the suites, sorted, joined by commas: its first 12 hex digits"
          % hashlib.sha256(b.encode()).hexdigest()[:12])
    print("    %s  = the same of the extensions less SNI and ALPN, sorted, _ the signature algorithms"
          % hashlib.sha256(c.encode()).hexdigest()[:12])
    walk.check(ja4 == "%s_%s_%s" % (a, hashlib.sha256(b.encode()).hexdigest()[:12],
                                     hashlib.sha256(c.encode()).hexdigest()[:12]),
               "the JA4 is not made of its three parts")
    walk.check(hello.sni == (None if is_ip_literal(config.servername) else config.servername),
               "the SNI is not servername= (none for an IP address: RFC 6066 3)")
    walk.check(hello.alpn == [b"http/1.1"], "the ALPN is not http/1.1")
    reference = tlswire.hello(browser_tls.first_flight(webtunnel.default_client_context(), config.servername))
    if walk.check(reference is not None and tlswire.ja4(reference) == ja4,
                  "the demo client's JA4 is not that of webtunnel.default_client_context()'s ClientHello"):
        print("  Checked: the SNI is servername=, the ALPN http/1.1, and webtunnel.default_client_context()")
        print("  (the system's roots) makes a ClientHello with this same JA4: every webtunnel client on")
        print("  Python's ssl (%s) sends this fingerprint, to every bridge." % ssl.OPENSSL_VERSION)
    print("  Whose: %s." % tlswire.whose(hello))
    print("  The demo's client runs Python's ssl (its key log opens the records below). A client with")
    print("  curl_cffi runs the browser route instead (browser_tls.py), whose hello, made in memory:")
    available, why = browser_tls.route()
    if available:
        browser = tlswire.hello(browser_tls.first_flight(browser_tls.context(), config.servername))
        print("    JA4 %s, %s." % (tlswire.ja4(browser), tlswire.whose(browser)))
    else:
        print("    none here (%s): this machine's clients send the hello above." % why)
    print("  A censor with a list of fingerprints tells Python's hello from a browser's; lyrebird")
    print("  shapes its hello with uTLS (randomized by default: no browser's either) for that reason.")
    return hello


def extension_words(hello, kind, data):
    """What one ClientHello extension says, in a few words."""
    if kind == tlswire.SERVER_NAME:
        return "%s   <- the SNI: in clear, the name a censor reads" % hello.sni
    if kind == tlswire.ALPN:
        return ", ".join(name.decode("ascii", "replace") for name in hello.alpn)
    if kind == tlswire.SUPPORTED_VERSIONS:
        return ", ".join(tlswire.VERSION_NAMES.get(v, "%04x" % v) for v in hello.supported_versions)
    if kind == tlswire.KEY_SHARE:
        return ", ".join("%s, %d bytes: the client's ephemeral public key" % (group_name(group), len(key))
                         for group, key in hello.key_shares)
    if kind == 10 and len(data) >= 2:
        return ", ".join(group_name(group) for group in tlswire.Reader(data).numbers(2))
    if kind == tlswire.SIGNATURE_ALGORITHMS:
        return "%d algorithms" % len(hello.signature_algorithms)
    if kind == 21:
        return "%d zero bytes, to make the hello 512 bytes long (RFC 7685)" % len(data)
    return "%d bytes" % len(data) if data else "(empty)"


def group_name(group):
    return tlswire.GROUPS.get(group) or FFDHE_GROUPS.get(group, "%04x" % group)


def tls_records_section(walk, hello):
    """The ServerHello and the key log's secrets; every record of both directions,
    opened. Returns (client records, server records), or None."""
    stage = walk.exchange.stage
    answer = tlswire.hello(walk.s_sent, client=False)
    walk.title("The server's answer: a ServerHello in clear, then sealed records")
    if not walk.check(answer is not None, "the server's first bytes are not a ServerHello"):
        return None
    suite = answer.ciphers[0]
    group = answer.key_shares[0][0] if answer.key_shares else None
    version = tlswire.VERSION_NAMES.get(answer.version, "%04x" % answer.version)
    print("  ServerHello: %s, cipher suite %04x %s," % (version, suite, tlswire.TLS13_SUITES.get(suite, "")))
    print("  key share %s: the server's ephemeral public key" % group_name(group or 0))
    walk.check(group in [g for g, _ in hello.key_shares],
               "the server's key share is not of a group the client offered")
    if not walk.check(answer.version == 0x0304 and suite in TLS13_SUITES,
                      "the demo opens TLS 1.3 records only; this connection used %s, suite %04x"
                      % (version, suite)):
        return None
    if not KEY_LOG:
        print("  The rest is sealed. This Python (%d.%d) cannot write a TLS key log (3.8 and newer can),"
              % sys.version_info[:2])
        print("  so the demo cannot open the records here: run it on Python 3.8 or newer to see inside.")
        return None
    found = key_log_secrets(stage.key_log, hello.random)
    if not walk.check(all(label in found for label in KEY_LOG_LABELS),
                      "the key log has no secrets for this connection's client random"):
        return None
    digest = TLS13_SUITES[suite][0]
    print("  Both ends now hold the same ECDHE secret, and the rest is sealed: every later record says")
    print("  application_data (23) in its header; its real type is inside (RFC 8446 5.2). The demo's")
    print("  client context wrote its secrets to a key log (the SSLKEYLOGFILE format Wireshark reads),")
    print("  filed under the ClientHello's random. They never crossed the wire: only an end has them.")
    print("  Each gives a key and an IV (HKDF-Expand-Label, RFC 8446 7.1, over %s):" % digest().name.upper())
    keys = {}
    for label in KEY_LOG_LABELS:
        keys[label] = traffic_keys(found[label], suite)
        print("    %s" % walk.style("field", label))
        print("      = %s" % walk.style("wire", found[label].hex()))
        print("      key %s  iv %s" % (keys[label][0].hex(), keys[label][1].hex()))
    print("  A sealed record is 17 03 03 LENGTH (in clear, authenticated as associated data), then the")
    print("  AEAD ciphertext of content | real type (1 byte), then a 16-byte tag: 17 bytes more than")
    print("  it carries. Nonce = iv XOR the record's number, from 0 under each key.")
    c_records, c_end = open_direction(walk.c_sent, suite, keys[KEY_LOG_LABELS[0]], keys[KEY_LOG_LABELS[2]])
    s_records, s_end = open_direction(walk.s_sent, suite, keys[KEY_LOG_LABELS[1]], keys[KEY_LOG_LABELS[3]])
    records_table(walk, "client -> server", c_records, c_end, len(walk.c_sent),
                  len(walk.client.request), "the upgrade request")
    records_table(walk, "server -> client", s_records, s_end, len(walk.s_sent),
                  len(walk.server.response), "the 101")
    walk.check(stage.leaf in handshake_messages(s_records).get("Certificate", b""),
               "the server's Certificate message does not carry the demo's certificate")
    print("  Checked: every sealed record opened (its tag verified) and the server's Certificate message")
    print("  carries the certificate the demo made. A censor sees the left-hand columns only.")
    return c_records, s_records


def records_table(walk, label, records, end, total, head_length, head_name):
    """One direction's records: the header a censor reads, and what the key log opened."""
    walk.title("Every record, %s: what a censor sees, and what it held" % label)
    print("    offset  header: type       length   inside (opened with the key log)")
    carried, walk.side = 0, label.split()[0]
    for record in records:
        if record.kind != tlswire.APPLICATION_DATA:
            inside = ("in clear: %s" % HANDSHAKE_TYPES.get(record.body[0], "?")
                      if record.kind == tlswire.HANDSHAKE else "in clear: ignored (RFC 8446 D.4)"
                      if record.kind == tlswire.CHANGE_CIPHER_SPEC else "in clear")
        elif record.inner is None:
            inside = walk.style("bad", "did not open")
        elif record.inner == tlswire.HANDSHAKE:
            inside = "handshake: %s" % (record.what or "part of a message")
        elif record.inner == tlswire.ALERT:
            inside = "alert: %s" % ALERT_NAMES.get(record.content[1] if len(record.content) == 2 else None,
                                                    record.content.hex())
        elif record.inner == tlswire.APPLICATION_DATA:
            start, carried = carried, carried + len(record.content)
            stream = carried - max(start, head_length)
            parts = ([head_name] if start < head_length else []) + (
                ["%d bytes of the stream" % stream] if stream > 0 else [])
            inside = "%d bytes: %s" % (len(record.content), " + ".join(parts))
        else:
            inside = "content type %d" % record.inner
        print("    %6d  %-18s %6d   %s" % (record.offset, tlswire.RECORD_TYPES.get(record.kind, "?"),
                                          len(record.body), inside))
        walk.record(record.offset, 5 + len(record.body), tlswire.RECORD_TYPES.get(record.kind, "?"))
        walk.check(record.inner is not None,
                   "the record %s at offset %d did not open" % (label, record.offset))
    walk.check(end == total, "the %s bytes are not whole records" % label)


def application_data(records):
    return b"".join(r.content for r in records if r.kind == r.inner == tlswire.APPLICATION_DATA)


def upgrade_section(walk, c_plain, s_plain, where):
    """The request and the 101 as they were sent; returns both."""
    request, response = walk.client.request, walk.server.response     # the bytes each one sent
    walk.title("The upgrade, %s" % where)
    for label, data, expected, made_by in (
            ("client -> server", c_plain, request, "webtunnel.upgrade_request"),
            ("server -> client", s_plain, response, "webtunnel.switching_protocols")):
        print("  %s, %d bytes (%s):" % (label, len(expected), made_by))
        for line in expected.decode("latin-1").split("\r\n")[:-1]:
            print(walk.style("clear", "    %s\\r\\n" % line))
        walk.check(data[:len(expected)] == expected, "the %s bytes are not %s" % (label, made_by))
    walk.check(walk.server.is_open and walk.server.config.target == walk.client.config.target,
               "the server did not open the tunnel for the secret path")
    print("  It looks like a WebSocket upgrade and is not one: no Sec-WebSocket-Key, and no frames")
    print("  after it. The server checked the path and the two headers; any other request gets a web")
    print("  server's 404 page, never a 101 (behind nginx: the cover site). The client sends nothing")
    print("  before the 101; after it, the connection carries the application's bytes, raw.")
    print("  Checked: these are the bytes that crossed, and the server opened the tunnel.")
    return request, response


def stream_section(walk, c_records, c_data, s_data):
    walk.title("The raw stream after the 101")
    print("  the application sent %d bytes, in clear:" % len(MESSAGE))
    walk.dump(MESSAGE, "clear")
    carrying = [r for r in c_records if r.kind == r.inner == tlswire.APPLICATION_DATA][1:]
    carrying = [r for r in carrying if r.content]
    if walk.check(carrying and c_data == MESSAGE and s_data == walk.exchange.echoed
                  and b"".join(r.content for r in carrying) == MESSAGE,
                  "the records after the upgrade do not open to the message and its echo"):
        record = carrying[0]
        print("  the client cut them into %d records (record shaping, on by default: below), %s bytes;"
              % (len(carrying), " + ".join("%d" % len(r.content) for r in carrying)))
        print("  the first at offset %d of its bytes: %d + 17 bytes, sealed:"
              % (record.offset, len(record.content)))
        walk.dump(walk.c_sent[record.offset:record.offset + 5 + len(record.body)])
        print("  Checked: they opened to the application's bytes exactly, and the server's to the echo:")
        print("  no frame, no length, no mask inside. Each record is 22 bytes more than its piece")
        print("  (header, type, tag); without shaping each write is one record, and its size shows.")
    print("  A string filter finds a TLS record header at offset 0 of the wire (below): webtunnel is TLS.")
    shaping_section(walk)


# --- webtunnel: record shaping, with and without ------------------------------------------------

# Tor's first writes through webtunnel (measured): the client's ClientHello record, CCS +
# Finished, a third; two writes of two cells; the server's flight, two short writes, the
# CERTS burst, two single cells, five cells.
TOR_CLIENT_WRITES = (517, 80, 33, 1050, 1050)
TOR_SERVER_WRITES = (1182, 79, 79, 2077, 536, 536, 2592)


def in_memory_pair(walk, shaping):
    """A client and a server of ours through their upgrade in memory, with the demo's
    configs (its certificate, its CA trusted), record shaping on or off on both (its
    cuts drawn from the demo's seed, if it has one)."""
    rng = walk.exchange.stage.rng
    made = webtunnel.Shaping(random=None if rng is None else lambda: split(rng)) if shaping else None
    client = webtunnel.WebTunnel(True, walk.client.config.replace(shaping=made))
    server = webtunnel.WebTunnel(False, walk.server.config.replace(shaping=made))
    to_server, to_client = client.start(), b""
    for _ in range(20):
        if to_server:
            server.receive(to_server)
        to_client = server.data_to_send()
        if to_client:
            client.receive(to_client)
        to_server = client.data_to_send()
        if client.is_open and server.is_open and not to_server:
            break
    return client, server


def shaping_section(walk):
    """Tor's first writes sent through a tunnel of ours in memory, without and with
    shaping: the record lengths a censor reads, and Tor's exact lengths among them."""
    walk.title("Record shaping: Tor's first writes, without it and with it")
    print("  With Tor inside, each of its writes is one outer record, length = write + 17: its")
    print("  ClientHello gives a record of 534, whole cells records of 514 k + 39. Those exact lengths")
    print("  need no classifier. So each side cuts the first 16 KiB of its stream into pieces of")
    print("  %d..%d bytes (every write in at least two): one record per piece. A bridge behind nginx"
          % (webtunnel.SMALLEST_PIECE, webtunnel.LARGEST_PIECE))
    print("  does not make the records, nginx does, one per read: it sends its pieces %g-%g ms apart."
          % tuple(1000 * p for p in webtunnel.PAUSE))
    print("  Tor's first writes through two tunnels of ours in memory (* = one of Tor's exact lengths):")
    results = {}
    for shaping in (False, True):
        client, server = in_memory_pair(walk, shaping)
        if not walk.check(client.is_open and server.is_open, "the in-memory tunnel did not open"):
            return
        rows = []
        for label, side, sizes in (("client -> server", client, TOR_CLIENT_WRITES),
                                   ("server -> client", server, TOR_SERVER_WRITES)):
            turns = [tlswire.record_lengths(side.send(bytes(size))) for size in sizes]
            rows.append((label, sizes, turns))
        results[shaping] = rows
        print("    shaping=%s" % ("on (the default)" if shaping else "off"))
        for label, _, turns in rows:
            text = " | ".join(" ".join("%d%s" % (n, "*" if tlswire.tor_marker(n) else "") for n in turn)
                              for turn in turns)
            print("      %s: %s" % (label, text))
    marks = {shaping: sum(1 for _, _, turns in rows for turn in turns for n in turn if tlswire.tor_marker(n))
             for shaping, rows in results.items()}
    walk.check(marks[False] > 0 and marks[True] == 0,
               "shaping did not take Tor's exact lengths away (%d without it, %d with it)"
               % (marks[False], marks[True]))
    print("  Without shaping: %d records with Tor's exact lengths. With it: %d; the peer read the same bytes."
          % (marks[False], marks[True]))
    bursts = {shaping: [sum(5 + n for n in turn) for _, _, turns in rows for turn in turns]
              for shaping, rows in results.items()}
    print("  What it does not change: the bytes of each turn (a burst) and the turns themselves:")
    print("    bytes on the wire per write, off: %s" % " ".join(map(str, bursts[False])))
    print("                                  on: %s  (22 more per extra record)"
          % " ".join(map(str, bursts[True])))
    print("  A classifier of burst sizes and timing (Xue et al., USENIX Security 2024) still sees Tor's")
    print("  handshake; shaping defeats exact-length rules, nothing more. `detect` on a capture says both.")
