"""``obfsproxy.py demo``: the whole tunnel on 127.0.0.1, in one process, annotated.

    demo app --SOCKS5--> client ===obfs4===> server --plain--> echo service
                                  ^
                       the wire: what a censor sees

It starts an echo service, a server of the chosen transport in front of it and
a SOCKS client (real sockets, threads of this process), sends a message that
starts like a TLS ClientHello (the kind of fixed string DPI looks for), and
then walks through that one connection, as it crossed the wire:

=========  ===========================================================================
obfs2      each side's header field by field (SEED in clear, MAGIC, PADLEN), the key
           schedule from the two seeds, the data as sent
obfs3      the two UniformDH public values (uniform strings, not recognisable numbers),
           the shared secret, the derived keys, the padding and the search for the magic
obfs4      the bridge's identity, the representatives, marks and MACs, the ntor
           derivation, every frame with its masked length, the padding frames, and what
           iat-mode did to the writes
webtunnel  the bridge line's synthetic address, the ClientHello field by field with its
           SNI and JA4, every TLS record of both directions as a censor sees it and as
           the key log opens it, the upgrade and the 101 inside, the raw stream after
dummy      the baseline: the application's bytes, unchanged
=========  ===========================================================================

Each walk ends with what a string-matching filter, the fully-encrypted test
(``capture.FirstPacket``) and a passive observer could and could not do.

Every value printed is checked against the recorded wire bytes: the keys shown
decrypt the wire back to the message, the marks and MACs shown are the ones on
the wire, each side read the other's padding. A value that does not check out
is printed as FAILED and the demo exits with status 1.

The demo reads each side's ephemeral private key out of its transport object
(``Obfs3._x``; obfs4's through its key source, ``keep_secret``): it lives only in
that process's memory and never crosses the wire, which is the whole point. Only
a demo, holding both ends, can show it. For webtunnel the same holds of the TLS
traffic secrets, which the demo's client context writes to a key log.

webtunnel needs a certificate, and Python's ssl cannot make one: the demo makes
a throwaway CA and a certificate for the URL's host with pycryptodome (already
required), fresh keys each run in a temporary directory that goes when the demo
ends. That works on every machine that runs the rest, ships no private key, and
keeps TLS in the picture, which is what a censor sees of webtunnel. The server
terminates TLS itself (tls-cert=, tls-key=) where a real bridge has nginx.
"""

import dataclasses
import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
import ssl
import string
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from Crypto.Cipher import AES, ChaCha20_Poly1305
from Crypto.Hash import SHA256
from Crypto.PublicKey import ECC
from Crypto.Signature import DSS

import capture
import listener
import obfs2
import obfs3
import obfs4
import outbound
import present
import proxy
import tlswire
import transports
import webtunnel
from curve25519 import elligator2_direct, x25519
from obfs4_crypto import SecretBox
from obfs4_drbg import HashDrbg
from outbound import format_address

MESSAGE = (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
           b" <- a TLS ClientHello starts like this; a DPI box matches it. "
           b"Hello from the other side of the tunnel!")
SIGNATURES = [("TLS record header 16 03 01", b"\x16\x03\x01"), ('"ClientHello"', b"ClientHello"),
              ('"the tunnel"', b"the tunnel")]
SHOW_FRAMES = 6           # frames listed per direction


# --- Running one connection ------------------------------------------------------------

class Wire:
    """One side of the demo connection: its transport, and what it put on the wire,
    piece by piece (each start(), data_to_send(), send() result or paced piece)."""

    def __init__(self, transport):
        self.transport = transport
        self.pieces, self.delays = [], []
        self.received = bytearray()
        self.secret = None        # obfs4: the ephemeral private key, kept by the demo only

    def sent_piece(self, data):
        if data:
            self.pieces.append(bytes(data))

    @property
    def sent(self):
        return b"".join(self.pieces)


class _Recorder(transports.Recorder):
    """``transports.Recorder`` that also keeps the delays of paced pieces."""

    def __init__(self, inner, wire):
        transports.Recorder.__init__(self, inner, wire.sent_piece, wire.received.extend)
        self.wire = wire

    def send_paced(self, data):
        pieces = transports.Recorder.send_paced(self, data)
        self.wire.delays.extend(delay for _, delay in pieces)
        return pieces


class Tap:
    """Keeps each new transport's wire bytes in memory (the same wrapper as
    --record-dir): ``Settings(wrappers=(Tap(),))``; ``taps`` lists a ``Wire`` per transport."""

    def __init__(self):
        self.taps = []

    def __call__(self, transport):
        wire = Wire(transport)
        self.taps.append(wire)
        inner = transports.innermost(transport)    # under --record-dir's recorder, if any
        if isinstance(inner, obfs4.Obfs4):
            keep_secret(inner.config, wire)
        return _Recorder(transport, wire)


def keep_secret(config, wire):
    """obfs4 erases its ephemeral private key once ntor is done (forward secrecy),
    so the demo keeps a copy as the key is made: through the config's injectable
    key source (``config.keypairs``, which runs only without a pool: the demo's
    listener has none). A real tunnel keeps no such copy anywhere."""
    make = config.keypairs or (lambda: obfs4.generate_keypair(config.randbytes))

    def keypairs():
        keypair = make()
        wire.secret = keypair[0]
        return keypair
    config.keypairs = keypairs


innermost = transports.innermost


def echo_service():
    """A plain TCP echo on 127.0.0.1: returns (address, listening socket)."""
    echo = listener.listen(("127.0.0.1", 0))

    def serve_one(conn):
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                conn.sendall(data)

    def accept_loop():
        while True:
            try:
                conn, _ = echo.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    return echo.getsockname()[:2], echo


@dataclasses.dataclass
class Exchange:
    """What one demo connection left behind."""

    echoed: bytes
    client: Wire
    server: Wire
    addresses: tuple          # (echo, server, SOCKS client)
    seconds: float
    announce: dict            # the server's bridge-line arguments (obfs4: cert, iat-mode)
    stage: "Stage"            # what was set up around the connection (webtunnel: its certificate)


class Stage:
    """What a transport needs around the demo connection, beyond its options: by
    default nothing. ``server_options`` go to ``server_config``; ``client_side``
    gives the client's settings and the SOCKS target, once the server listens;
    ``finish`` reads what the connection left behind (webtunnel: the key log)."""

    def __init__(self, options, directory):
        self.server_options = dict(options)
        self.target = None

    def client_side(self, settings, cls, server_config, announce, server_address):
        options = dict(self.server_options, **announce)   # the bridge line's arguments
        self.target = server_address
        return dataclasses.replace(settings, options=options), server_address

    def finish(self):
        pass


def run_exchange(name, options, settings):
    """Echo, server and client on 127.0.0.1; send MESSAGE through them."""
    cls = transports.transport_class(name)
    state = tempfile.TemporaryDirectory(prefix="obfsproxy-demo-")   # obfs4's keys, the demo's certificate
    try:
        stage = STAGES.get(name, Stage)(options, Path(state.name))
        server_config, announce = cls.server_config(stage.server_options, Path(state.name))
        echo_address, echo_listener = echo_service()
        server_tap, client_tap = Tap(), Tap()
        server_settings = dataclasses.replace(settings, transport=name, config=server_config,
                                              dest=echo_address, wrappers=settings.wrappers + (server_tap,))
        tunnels = listener.Listener(pool_size=0)   # every key made on the spot, and seen (keep_secret)
        try:
            server_address = tunnels.listen(("127.0.0.1", 0), proxy.handle_server, server_settings)
            client_settings, target = stage.client_side(
                dataclasses.replace(settings, transport=name, wrappers=settings.wrappers + (client_tap,)),
                cls, server_config, announce, server_address)
            client_address = tunnels.listen(("127.0.0.1", 0), proxy.handle_socks_client, client_settings)
            threading.Thread(target=tunnels.serve, daemon=True).start()
            started = time.perf_counter()
            with outbound.connect_via_proxy("socks5://" + format_address(client_address),
                                            target, outbound.Deadline(30)) as sock:
                sock.settimeout(30)
                sock.sendall(MESSAGE)
                sock.shutdown(socket.SHUT_WR)
                echoed = b""
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    echoed += chunk
            seconds = time.perf_counter() - started
        finally:
            tunnels.stop()
            echo_listener.close()
        stage.finish()
    finally:
        state.cleanup()
    return Exchange(echoed, client_tap.taps[0], server_tap.taps[0],
                    (echo_address, server_address, client_address), seconds, announce, stage)


# --- Printing ----------------------------------------------------------------------------

class Walk:
    """One demo connection and the helpers every walk-through uses."""

    def __init__(self, name, exchange, style):
        self.name, self.exchange, self.style = name, exchange, style
        self.client = innermost(exchange.client.transport)
        self.server = innermost(exchange.server.transport)
        self.c_sent, self.s_sent = exchange.client.sent, exchange.server.sent
        self.problems = []
        self.section = 0
        self.observed = name      # which OBSERVER entry ends the walk

    def title(self, text):
        self.section += 1
        print("\n" + self.style("title", "%d. %s" % (self.section, text)))

    def check(self, ok, problem):
        if not ok:
            self.problems.append(problem)
        return ok

    def dump(self, data, kind="wire", limit=48):
        for line in present.hexdump(data, limit):
            print(self.style(kind, line))

    def field(self, offset, length, name, wire, meaning):
        print(present.field_row(offset, length, name, wire, meaning, self.style))


def hexblock(data, indent="      ", width=32):
    """Every byte of ``data`` in hex, ``width`` bytes a line."""
    return "\n".join(indent + data[i:i + width].hex() for i in range(0, len(data), width))


def ephemeral_secret(wire):
    """The private key a side made and never sent (obfs3: the exponent x or y, still
    in its transport object; obfs4: the X25519 scalar, which the transport erased
    after the handshake and the demo's tap copied). Only a demo, holding both ends,
    has it."""
    transport = innermost(wire.transport)
    return transport._x if isinstance(transport, obfs3.Obfs3) else wire.secret


def main(name, options, settings, record_dir=None):
    """``obfsproxy.py demo``: 0 when the message came back byte for byte and every value
    shown checked out. A transport without a walk of its own (``WALKS``) gets the
    generic one: every piece each side put on the wire, and the checks that hold
    for any transport."""
    style = present.Style.for_stream(sys.stdout)
    try:
        exchange = run_exchange(name, options, settings)
    except (RuntimeError, OSError, ValueError) as exc:
        print(style("bad", "FAILED: the demo connection did not work: %s" % exc))
        return 1
    walk = Walk(name, exchange, style)
    echo_address, server_address, client_address = exchange.addresses
    print(style("title", "obfsproxy.py demo: the %s tunnel on 127.0.0.1, in one process" % name))
    print("  demo app --SOCKS5--> client %s ===%s===> server %s --plain--> echo %s"
          % (format_address(client_address), name,
             format_address(server_address), format_address(echo_address)))
    print("  The client is the initiator (it opened the TCP connection); the server is the responder.")
    if record_dir is not None:
        print("  The wire bytes were also saved in %s: try `python3 obfsproxy.py unmask %s`."
              % (record_dir, record_dir))
    walk.check(walk.c_sent == bytes(exchange.server.received)
               and walk.s_sent == bytes(exchange.client.received),
               "what one side sent differs from what the other received")
    WALKS.get(name, walk_generic)(walk)
    filters(walk)
    observer(walk)
    walk.check(exchange.echoed == MESSAGE, "the echo differs from the message")
    print()
    for problem in walk.problems:
        print(style("bad", "FAILED: %s" % problem))
    if walk.problems:
        return 1
    print(style("ok", "OK") + ": the message crossed the tunnel and came back byte for byte, and "
          "every value shown checked out (%.2f s). More: docs/PROTOCOL.md" % exchange.seconds)
    return 0


def application_bytes(walk, c_data, s_data, how_c, how_s):
    """The message in clear, and as each side put it on the wire."""
    walk.title("The first application bytes")
    print("  the application sent %d bytes, in clear:" % len(MESSAGE))
    walk.dump(MESSAGE, "clear")
    print("  the client sent them as %s:" % how_c)
    walk.dump(c_data)
    print("  the echo came back; the server sent it as %s:" % how_s)
    walk.dump(s_data)


def filters(walk):
    """What a string-matching filter and the fully-encrypted test saw."""
    walk.title("What a string-matching filter and an entropy test saw")
    print("  %-28s  %-26s  %s" % ("pattern", "in the application's bytes", "on the wire (both ways)"))
    wire = walk.c_sent + walk.s_sent
    for label, pattern in SIGNATURES:
        at, seen = MESSAGE.find(pattern), wire.find(pattern)
        print("  %-28s  %-26s  %s" % (label, "offset %d" % at if at >= 0 else "-",
                                      walk.style("bad", "offset %d: MATCH" % seen) if seen >= 0
                                      else walk.style("ok", "not found")))
    print("  byte entropy: message %.1f bits/byte, wire %.1f bits/byte (random bytes: 8)"
          % (present.entropy(MESSAGE), present.entropy(wire)))
    first_piece = walk.exchange.client.pieces[0] if walk.exchange.client.pieces else b""
    first = capture.FirstPacket(first_piece)
    print("  The fully-encrypted test (the Great Firewall since November 2021, as %s" % capture.WU_2023)
    print("  measured it; `obfsproxy.py detect` runs it) on the client's first write, %d bytes:"
          % len(first_piece))
    print("    %s  %s" % (walk.style("bad" if first.rule is None else "ok", first.verdict), first.figures()))


OBSERVER = {
    "dummy": (["every byte: the TLS record header, the strings, the sizes, the timing"],
              ["nothing is hidden: this is the baseline the transports improve on"]),
    "obfs2": (["detect it: one SHA-256 over the clear seed and one AES block give 2b f5 ca 7e "
               "(`obfsproxy.py detect`)",
               "read it: both seeds are in clear, and every key is a hash of them "
               "(`obfsproxy.py unmask`)",
               "flag it as fully encrypted (first packet), and see every size and every pause"],
              ["match a string: from the first byte on there is none"]),
    "obfs3": (["flag it as fully encrypted (first packet); see that both sides send at least 192 "
               "random bytes at once",
               "see the sizes and timing of everything after the paddings (ciphertext length = "
               "plaintext length)"],
              ["compute SHARED_SECRET from X and Y (it needs x or y): so no key, no magic, not even "
               "where the padding ends",
               "match a string, or run obfs2's magic test (`obfsproxy.py unmask` explains)",
               "but an ACTIVE attacker can: obfs3 authenticates nobody, so a man in the middle runs "
               "UniformDH with each side and reads everything, and a prober gets 192+ bytes back "
               "from any server"]),
    "obfs4": (["flag it as fully encrypted (first packet); see volumes, and sizes blurred to the "
               "bridge's length table",
               "see timing (iat-mode 0: as the application sends; 1 and 2 blur it)",
               "with the bridge line (cert): find M_C and check MAC_C, so confirm obfs4 to that bridge"],
              ["find the marks without the bridge line: every byte looks random",
               "compute a key, even with the bridge's private key b: ntor needs x or y, erased after "
               "the handshake (forward secrecy; `obfsproxy.py unmask --state-dir` shows it)",
               "probe the bridge without its cert: the server stays silent and closes after "
               "30 s + a per-bridge delay; a man in the middle without b fails AUTH"]),
    "webtunnel": (["read the SNI (the web site's name) and the server's address, and fetch its "
                   "certificate by connecting with that SNI (TLS 1.3 sends it sealed)",
                   "tell Python's OpenSSL from a browser by the ClientHello's JA4, the same for every "
                   "webtunnel client on this Python",
                   "see the record sizes and timing: the upgrade, then the application's writes, each "
                   "22 bytes larger; with Tor inside, its TLS handshake shows through (TLS in TLS) on a "
                   "long-lived connection to a web site",
                   "with the bridge line (url=): ask the web server for the secret path and get a 101, "
                   "so confirm the bridge; or block the domain, at the cost of the whole site"],
                  ["flag it as fully encrypted: it is TLS, and the test exempts TLS (Ex5, or Ex1 first "
                   "for a ClientHello's zero bytes)",
                   "match a string, read the path, the Upgrade exchange or a byte after it: all sealed",
                   "decrypt a recording later, even with the certificate's key: the keys come from an "
                   "ephemeral ECDHE exchange (forward secrecy)",
                   "find the bridge by probing without the path: every other path gets the cover "
                   "site (here the 404 page), never a 101"]),
    "webtunnel over http": (["everything: the request with the secret path, the 101 and every byte after "
                             "them cross in clear, as the string filter above shows"],
                            ["nothing is hidden: http:// is for tests, or behind another tunnel"]),
}


def observer(walk):
    could, could_not = OBSERVER.get(walk.observed, (
        ["everything the pieces above show: their sizes, their timing, and any fixed bytes"],
        ["what depends on how %s hides the stream: its module's docstring (%s.py) says what it "
         "protects and what it does not" % (walk.name, type(walk.client).__module__)]))
    walk.title("What a passive observer could and could not do")
    for heading, lines in (("could:", could), ("could not:", could_not)):
        print("  " + heading)
        for line in lines:
            print(textwrap.fill(line, 100, initial_indent="    - ", subsequent_indent="      "))


# --- any transport, dummy and obfs2 ---------------------------------------------------------

def walk_generic(walk):
    """What every transport can show: each piece it put on the wire, in order."""
    for label, wire in (("client", walk.exchange.client), ("server", walk.exchange.server)):
        walk.title("What the %s put on the wire: %d bytes in %d pieces"
                   % (label, len(wire.sent), len(wire.pieces)))
        for number, piece in enumerate(wire.pieces[:SHOW_FRAMES], 1):
            print("  piece %d, %d bytes:" % (number, len(piece)))
            walk.dump(piece)
        if len(wire.pieces) > SHOW_FRAMES:
            print("  ... and %d more pieces" % (len(wire.pieces) - SHOW_FRAMES))



def walk_dummy(walk):
    walk.title("The handshake and the keys: none")
    print("  The dummy transport has no handshake and no keys: the wire carries the application's "
          "bytes unchanged.")
    application_bytes(walk, walk.c_sent, walk.s_sent, "they were", "it was")


def walk_obfs2(walk):
    client, server, c_sent, s_sent = walk.client, walk.server, walk.c_sent, walk.s_sent
    secret_hash, iterations = client.secret_hash, client.iterations
    started = time.perf_counter()
    rows = present.key_schedule(client.seed, server.seed, secret_hash, iterations)
    derive_seconds = time.perf_counter() - started
    init_pad, resp_pad, init_secret, resp_secret = (row[3] for row in rows)

    walk.title("The handshake: each side sends one message at once, without waiting for the other"
               if secret_hash is None else
               "The handshake: the client sends at once; with a shared secret our server answers"
               " once the client's message proved the secret")
    for label, obj, sent, pad, initiator in (
            ("client -> server: the initiator's message", client, c_sent, init_pad, True),
            ("server -> client: the responder's message", server, s_sent, resp_pad, False)):
        print("  %s, 24 + PADLEN = %d bytes" % (label, obfs2.HEADER_LENGTH + obj.padlen))
        for line in present.header_lines(sent, initiator, pad, walk.style):
            print(line)
    print("  The receiver takes the seed, derives the sender's PAD key, checks MAGIC, drops PADLEN bytes;")
    print("  the server read PADLEN %d (Obfs2.peer_padlen), the client read %d."
          % (server.peer_padlen, client.peer_padlen))
    walk.check((server.peer_padlen, client.peer_padlen) == (client.padlen, server.padlen),
               "a side read the wrong PADLEN")
    walk.check(server.peer_seed == client.seed and client.peer_seed == server.seed,
               "a side read the wrong seed")

    walk.title("The key schedule, as the code derived it (obfs2.pad_key, obfs2.data_keys)")
    print("  INIT_SEED = %s (the client's Obfs2.seed)" % walk.style("wire", client.seed.hex()))
    print("  RESP_SEED = %s (the server's Obfs2.seed)" % walk.style("wire", server.seed.hex()))
    if secret_hash is None:
        print("  MAC(s, x) = SHA-256(s | x | s). Each value m is one SHA-256 output:"
              " AES-128 key = m[0:16],")
    else:
        print("  shared secret: H(SECRET) = %s" % secret_hash.hex())
        print("  Every MAC becomes H^n(s | x | H(SECRET) | s), n = %d (--ss-hash-iterations)."
              % iterations)
        print("  Each value m is the last SHA-256 output: AES-128 key = m[0:16],")
    print("  IV = m[16:32], the whole 128-bit CTR counter block.")
    for line in present.key_schedule_lines(rows, secret_hash, walk.style):
        print(line)
    per_side = 4 * (1 if secret_hash is None else iterations)
    print("  Each side computes all four (its own PAD key, the peer's, both data keys): "
          "%d SHA-256,\n  %s here." % (per_side, present.duration(derive_seconds)))
    if secret_hash is not None:
        print("  Without the secret that would be 4 SHA-256: the secret multiplies the cost by %d,\n"
              "  for both ends and for a censor who knows it." % iterations)
    c_data = c_sent[obfs2.HEADER_LENGTH + client.padlen:]
    s_data = s_sent[obfs2.HEADER_LENGTH + server.padlen:]
    ok = walk.check(obfs2.ctr(init_secret).decrypt(c_data) == MESSAGE,
                    "INIT_SECRET does not decrypt the recorded data")
    ok &= walk.check(obfs2.ctr(resp_secret).decrypt(s_data) == walk.exchange.echoed,
                     "RESP_SECRET does not decrypt the recorded data")
    if ok:
        print("  Checked: INIT_SECRET and RESP_SECRET decrypt the recorded wire bytes back to the message.")

    application_bytes(walk, c_data, s_data, "E(INIT_SECRET, message)", "E(RESP_SECRET, echo)")
    print("  Ciphertext length = plaintext length (%d bytes): obfs2 hides no sizes and no timing."
          % len(c_data))
    if secret_hash is None:
        print("  Try `python3 obfsproxy.py demo --shared-secret=SECRET` to see what a shared secret "
              "changes,\n  and `--transport=obfs3` or `--transport=obfs4` for what came after obfs2.")
    else:
        n = iterations
        print("  With a shared secret the seeds alone no longer give the keys. A censor who knows\n"
              "  the secret (it is in the bridge line) pays %d SHA-256 to detect a connection and\n"
              "  4 x %d = %d to read it; one who does not must guess it, at %d SHA-256 a guess."
              % (n, n, 4 * n, n))


# --- obfs3 -----------------------------------------------------------------------------------

def legendre(value):
    """+1 if ``value`` is a square modulo p, -1 if not (Euler: value^((p-1)/2) mod p)."""
    return 1 if pow(value, (obfs3.P - 1) // 2, obfs3.P) == 1 else -1


def walk_obfs3(walk):
    client, server, c_sent, s_sent = walk.client, walk.server, walk.c_sent, walk.s_sent
    X, Y = c_sent[:192], s_sent[:192]

    walk.title("The handshake: each side sends its UniformDH public value and PAD1, at once")
    for label, who, value, padlen in (("client -> server: X", client, X, client.padlen1),
                                      ("server -> client: Y", server, Y, server.padlen1)):
        print("  %s, 192 bytes, then PAD1 = %d random bytes (Obfs3.padlen1), all in one write:"
              % (label, padlen))
        print(walk.style("wire", hexblock(value, "    ", 48)))
        walk.check(value == who.public, "the public value on the wire is not the object's")
        walk.check(len(walk.exchange.client.pieces[0] if who is client else walk.exchange.server.pieces[0])
                   == 192 + padlen, "the first write is not PUB | PAD1")
    print("  These are two 1536-bit numbers below p (RFC 3526 group 5), but p is within 2^-64 of")
    print("  2^1536: as bytes they are as uniform as random ones. Plain Diffie-Hellman would still")
    print("  show: g^x mod p is always a square modulo p (g = 2 is one here), and a censor can test")
    print("  that in one exponentiation, while random numbers are squares only half the time.")
    print("  UniformDH sends p - g^x instead on a coin flip (the low bit of x), and p - g^x is never")
    squares = []
    for who, value in ((walk.exchange.client, X), (walk.exchange.server, Y)):
        square = legendre(int.from_bytes(value, "big")) == 1
        plain = obfs3.modexp(obfs3.G, ephemeral_secret(who), obfs3.P).to_bytes(192, "big") == value
        walk.check(square == plain, "a public value's Legendre symbol does not match its coin")
        squares.append("a square (+1: g^x was sent)" if square else "not a square (-1: p - g^x was sent)")
    print("  a square. Here X is %s, Y is %s;" % tuple(squares))
    print("  for random bytes each is a coin flip too.")

    walk.title("The shared secret and the keys (obfs3.shared_secret, obfs3.derive_keys)")
    started = time.perf_counter()
    from_client = obfs3.shared_secret(ephemeral_secret(walk.exchange.client), Y)
    seconds = time.perf_counter() - started
    from_server = obfs3.shared_secret(ephemeral_secret(walk.exchange.server), X)
    keys = obfs3.derive_keys(from_client)
    print("  x and y, the private exponents, stayed in the two processes (x = %s..., 1536 bits)."
          % ephemeral_secret(walk.exchange.client).to_bytes(192, "big")[:8].hex())
    print("  SHARED_SECRET = Y^x mod p (the client) = X^y mod p (the server), 192 bytes:")
    print(walk.style("wire", hexblock(from_client, "    ", 48)))
    walk.check(from_client == from_server, "the two ends computed different shared secrets")
    print("  Each key is HMAC-SHA256(SHARED_SECRET, label); AES-128-CTR key = m[0:16], counter = m[16:32]:")
    for label, m, use in (("INIT_SECRET", keys.init_secret, "encrypts client -> server data"),
                          ("RESP_SECRET", keys.resp_secret, "encrypts server -> client data"),
                          ("INIT_MAGIC", keys.init_magic, "marks the end of the client's padding"),
                          ("RESP_MAGIC", keys.resp_magic, "marks the end of the server's padding")):
        print("    %s = %s" % (walk.style("field", "%-11s" % label), walk.style("wire", m.hex())))
        print("                  %s" % use)
    print("  Each side does two modexps, one for its key pair and one for the shared secret (%s here);"
          % present.duration(seconds))
    print("  obfs2 needed 4 SHA-256. In exchange, an observer faces the Diffie-Hellman problem.")

    walk.title("The padding, and the search for the magic")
    c_pos = c_sent.find(keys.init_magic, 192)
    s_pos = s_sent.find(keys.resp_magic, 192)
    for label, who, peer, sent, pos, magic in (
            ("client", client, server, c_sent, c_pos, "INIT_MAGIC"),
            ("server", server, client, s_sent, s_pos, "RESP_MAGIC")):
        print("  The %s's stream:" % label)
        walk.field(0, 192, "public value", present.hexline(sent[:192], 8), "sent by start()")
        walk.field(192, who.padlen1, "PAD1", present.hexline(sent[192:192 + who.padlen1], 8),
                   "random, sent by start() with the public value")
        walk.field(192 + who.padlen1, who.padlen2, "PAD2", present.hexline(sent[192 + who.padlen1:pos], 8),
                   "random, sent with the first data")
        walk.field(pos, 32, magic, present.hexline(sent[pos:pos + 32], 8), "clear, found by the %s"
                   % ("server" if who is client else "client"))
        walk.field(pos + 32, len(sent) - pos - 32, "data", present.hexline(sent[pos + 32:], 8),
                   "E(%s_SECRET, ...)" % magic[:4])
        walk.check(pos == 192 + who.padlen1 + who.padlen2 == 192 + peer.peer_padding,
                   "the %s's magic is not where its paddings end" % label)
        print("    The %s searched the bytes after the public value for %s: found after %d bytes,"
              % ("server" if who is client else "client", magic, peer.peer_padding))
        print("    PADLEN1 + PADLEN2 = %d + %d (Obfs3.peer_padding); it would give up beyond 8194."
              % (who.padlen1, who.padlen2))

    c_data, s_data = c_sent[c_pos + 32:], s_sent[s_pos + 32:]
    ok = walk.check(obfs3.ctr(keys.init_secret).decrypt(c_data) == MESSAGE,
                    "INIT_SECRET does not decrypt the recorded data")
    ok &= walk.check(obfs3.ctr(keys.resp_secret).decrypt(s_data) == walk.exchange.echoed,
                     "RESP_SECRET does not decrypt the recorded data")
    application_bytes(walk, c_data, s_data, "E(INIT_SECRET, message)", "E(RESP_SECRET, echo)")
    if ok:
        print("  Checked: INIT_SECRET and RESP_SECRET decrypt the recorded wire bytes back to the message.")
    print("  Ciphertext length = plaintext length (%d bytes): after the paddings obfs3 hides no sizes."
          % len(c_data))


# --- obfs4 -----------------------------------------------------------------------------------

def walk_obfs4(walk):
    client, server, c_sent, s_sent = walk.client, walk.server, walk.c_sent, walk.s_sent
    identity = server.config.identity
    key = identity.public_key + identity.node_id

    walk.title("The bridge: a long-term identity, handed to clients in the bridge line")
    print("  NODEID = %s   (20 bytes)" % identity.node_id.hex())
    print("  B      = %s   X25519(b, 9); b stays on the bridge" % identity.public_key.hex())
    print("  cert   = base64(NODEID | B) = %s" % walk.exchange.announce["cert"])
    print("  iat-mode = %d. The client knows NODEID and B from the cert; KEY = B | NODEID signs"
          % identity.iat_mode)
    print("  every mark and MAC below, so only clients given the bridge line can speak to it.")
    walk.check(walk.exchange.announce["cert"] == obfs4.encode_cert(identity.node_id, identity.public_key),
               "the cert is not NODEID | B")

    walk.title("The client's handshake: X' | P_C | M_C | MAC_C, one write")
    m_c = obfs4.h16(key, c_sent[:32])
    pos = c_sent.find(m_c, 32)
    e = capture.match_epoch(key, c_sent[:pos + 16], c_sent[pos + 16:pos + 32], time.time())
    walk.check(pos > 0 and e is not None and len(walk.exchange.client.pieces[0]) == pos + 32,
               "the client's first write is not X' | P_C | M_C | MAC_C")
    e = e or b"?"
    walk.field("offset", "length", "field", "on the wire", "meaning")
    walk.field(0, 32, "X'", present.hexline(c_sent[:32], 8),
               "Elligator2 representative of the client's X25519 key X")
    walk.field(32, pos - 32, "P_C", present.hexline(c_sent[32:pos], 8), "random padding, 77..8128 bytes")
    walk.field(pos, 16, "M_C", m_c.hex(), "H16(KEY, X'): where the server finds the end")
    walk.field(pos + 16, 16, "MAC_C", c_sent[pos + 16:pos + 32].hex(),
               'H16(KEY, X\' | P_C | M_C | E), E = "%s", the hour' % e.decode())
    x_u = elligator2_direct(c_sent[:32])
    print("  X = ell2(X') = %s" % walk.style("wire", x_u.hex()))
    print("  A raw X25519 key is recognisable (it is a curve point, and half of all 32-byte strings")
    print("  are not); every 32-byte string is the representative of some X. The client drew key")
    print("  pairs until its X had a representative (about 2 tries), before the connection.")
    walk.check(x_u == client._u, "ell2(X') is not the client's public key")

    walk.title("The server's reply: Y' | AUTH | P_S | M_S | MAC_S, then the seed frame, one write")
    m_s = obfs4.h16(key, s_sent[:32])
    spos = s_sent.find(m_s, 64)
    walk.check(spos > 0 and obfs4.h16(key, s_sent[:spos + 16] + e) == s_sent[spos + 16:spos + 32],
               "MAC_S does not check out")
    walk.field("offset", "length", "field", "on the wire", "meaning")
    walk.field(0, 32, "Y'", present.hexline(s_sent[:32], 8), "the server's representative")
    walk.field(32, 32, "AUTH", present.hexline(s_sent[32:64], 8), "proves the server holds b (below)")
    walk.field(64, spos - 64, "P_S", present.hexline(s_sent[64:spos], 8), "random padding, 0..8051 bytes")
    walk.field(spos, 16, "M_S", m_s.hex(), "H16(KEY, Y')")
    walk.field(spos + 16, 16, "MAC_S", s_sent[spos + 16:spos + 32].hex(),
               "H16(KEY, Y' | AUTH | P_S | M_S | E), the client's E")
    walk.field(spos + 32, 45, "seed frame", present.hexline(s_sent[spos + 32:spos + 77], 8),
               "a frame carrying the bridge's drbg-seed (below)")

    y_u = elligator2_direct(s_sent[:32])
    okm = ntor_section(walk, x_u, y_u, s_sent[32:64])
    c_frames = frames_section(walk, "client -> server", c_sent[pos + 32:], okm[:72])
    s_frames = frames_section(walk, "server -> client", s_sent[spos + 32:], okm[72:])
    c_data = b"".join(p[3:3 + int.from_bytes(p[1:3], "big")] for *_, p in c_frames if p[0] == 0)
    s_data = b"".join(p[3:3 + int.from_bytes(p[1:3], "big")] for *_, p in s_frames if p[0] == 0)
    walk.check(c_data == MESSAGE and s_data == walk.exchange.echoed,
               "the frames do not open to the message and its echo")
    walk.check(s_frames[:1] and s_frames[0][4][0] == obfs4.PACKET_TYPE_PRNG_SEED
               and s_frames[0][4][3:27] == identity.drbg_seed, "the seed frame does not carry the drbg-seed")
    if walk.client.iat_mode == obfs4.IAT_NONE:    # 1 and 2 cut bursts into pieces: see below
        table = walk.server.config.len_dist
        lengths = [table.lo + value for value in table.values]
        bursts = [len(piece) for piece in walk.exchange.client.pieces[1:]]
        walk.check(all(burst % obfs4.MAXIMUM_SEGMENT_LENGTH in lengths for burst in bursts),
                   "a burst of the client is not a length from the bridge's table")
        print("  The client's bursts: %s bytes of frames; mod 1448: %s, lengths from the bridge's table."
              % (", ".join(map(str, bursts)), ", ".join(str(b % obfs4.MAXIMUM_SEGMENT_LENGTH)
                                                        for b in bursts)))
    print("  Checked: every frame opened (Poly1305 tags), the payloads are the message and its echo,")
    print("  and the server's first frame carries its drbg-seed, %s: the client's" % identity.drbg_seed.hex())
    print("  padding now follows the bridge's length table, so all its clients look alike.")
    iat_section(walk)


def ntor_section(walk, x_u, y_u, auth_on_wire):
    """EXP1, EXP2, KEY_SEED and AUTH as both ends computed them; returns the OKM."""
    identity = walk.server.config.identity
    walk.title("ntor: both ends reach KEY_SEED; AUTH proves the server knows b")
    x, y, b = (ephemeral_secret(walk.exchange.client), ephemeral_secret(walk.exchange.server),
               identity.private_key)
    c_exp1, c_exp2 = x25519(x, y_u), x25519(x, identity.public_key)
    s_exp1, s_exp2 = x25519(y, x_u), x25519(b, x_u)
    print("  client: EXP1 = X25519(x, Y) = %s" % c_exp1.hex())
    print("          EXP2 = X25519(x, B) = %s" % c_exp2.hex())
    print("  server: EXP1 = X25519(y, X) = %s" % s_exp1.hex())
    print("          EXP2 = X25519(b, X) = %s" % s_exp2.hex())
    walk.check((c_exp1, c_exp2) == (s_exp1, s_exp2), "the two ends computed different EXP1/EXP2")
    try:
        key_seed, auth = obfs4.ntor(c_exp1, c_exp2, identity.public_key, x_u, y_u, identity.node_id)
    except obfs4.ProtocolError as exc:          # only if a value above is wrong
        walk.check(False, str(exc))
        key_seed, auth = bytes(32), bytes(32)
    print("  secret_input = EXP1 | EXP2 | B | B | X | Y | PROTOID | NODEID")
    print("  KEY_SEED = HMAC-SHA256(t_key, secret_input) = %s" % walk.style("wire", key_seed.hex()))
    print("  AUTH = HMAC-SHA256(t_mac, HMAC-SHA256(t_verify, secret_input) | B | B | X | Y | ...)")
    print("       = %s" % walk.style("wire", auth.hex()))
    walk.check(auth == auth_on_wire, "AUTH is not the one on the wire")
    print("  = bytes 32..63 of the reply: a server without b could not have computed EXP2, nor AUTH.")
    okm = obfs4.kdf(key_seed)
    print("  OKM = HKDF-SHA256(KEY_SEED, salt t_key, info m_expand), 144 bytes; each direction's 72:")
    for label, part in (("client -> server", okm[:72]), ("server -> client", okm[72:])):
        print("    %s: secretbox key %s" % (label, part[:32].hex()))
        print("                      nonce prefix %s, length-mask DRBG seed %s"
              % (part[32:48].hex(), part[48:72].hex()))
    print("  x and y are gone when the connection is: whoever records the wire and later steals b")
    print("  still lacks EXP1. That is forward secrecy.")
    return okm


def open_frames(wire, key72):
    """[(offset, L_obf, mask, L, packet)] for each whole frame of one direction, opened
    with that direction's 72 OKM bytes: L = L_obf XOR the next DRBG mask."""
    box, drbg = SecretBox(key72[:32], key72[32:48]), HashDrbg(key72[48:72])
    frames, pos = [], 0
    while pos + 2 <= len(wire):
        l_obf = int.from_bytes(wire[pos:pos + 2], "big")
        mask = drbg.mask16()
        length = l_obf ^ mask
        if not obfs4.MIN_FRAME_LENGTH <= length <= obfs4.MAX_FRAME_LENGTH or pos + 2 + length > len(wire):
            break
        try:
            packet = bytes(box.open(len(frames) + 1, bytes(wire[pos + 2:pos + 2 + length])))
        except ValueError:
            break
        frames.append((pos, l_obf, mask, length, packet))
        pos += 2 + length
    return frames


def frames_section(walk, label, wire, key72):
    frames = open_frames(wire, key72)
    walk.title("The frames, %s (%d bytes after the handshake)" % (label, len(wire)))
    print("    offset  L_obf  mask  L = L_obf XOR mask  the packet (L - 16 bytes): type | n | payload "
          "| zeros")
    for pos, l_obf, mask, length, packet in frames[:SHOW_FRAMES]:
        kind, n = packet[0], int.from_bytes(packet[1:3], "big")
        what = {0: "payload", 1: "PRNG seed"}.get(kind, "unknown")
        print("    %6d  %04x   %04x  %4d                type %d (%s), n = %d, %d zero bytes"
              % (pos, l_obf, mask, length, kind, what, n, len(packet) - 3 - n))
    if len(frames) > SHOW_FRAMES:
        print("    ... %d more frames" % (len(frames) - SHOW_FRAMES))
    walk.check(sum(2 + f[3] for f in frames) == len(wire), "the %s bytes are not whole frames" % label)
    print("  Each frame on the wire is 2 + L bytes. The 2-byte length is masked by a SipHash DRBG")
    print("  seeded from OKM: the wire shows no frame boundary. Type-0 packets with n = 0 are pure")
    print("  padding: each burst is padded to a length drawn from the bridge's table (lenDist).")
    return frames


def iat_section(walk):
    client = walk.exchange.client
    mode = walk.client.iat_mode
    walk.title("What iat-mode %d did to the client's writes" % mode)
    sizes = [len(piece) for piece in client.pieces[1:]]
    print("  after the handshake the client produced %d piece(s): %s bytes"
          % (len(sizes), ", ".join(map(str, sizes))))
    if mode == obfs4.IAT_NONE:
        print("  iat-mode 0: one write per send(), the data frames and their padding frames together;")
        print("  the timing is the application's. --iat-mode=1 or 2 changes that (try it).")
    else:
        print("  and waited after each: %s" % ", ".join(present.duration(d) for d in client.delays))
        print("  iat-mode %d: %s," % (mode, "the padded burst cut into pieces of at most 1448 bytes"
                                      if mode == obfs4.IAT_ENABLED else
                                      "every piece exactly one lenDist sample long, padding included"))
        print("  each followed by a pause drawn from the bridge's IAT table (0..10 ms): the writes no")
        print("  longer show the application's timing or write sizes.")
        walk.check(all(size <= obfs4.MAXIMUM_SEGMENT_LENGTH for size in sizes) or mode != obfs4.IAT_ENABLED,
                   "an iat-mode 1 piece is longer than 1448 bytes")


# --- webtunnel: the demo's certificate --------------------------------------------------------
#
# Python's ssl can use a certificate but not make one. The demo makes its own, with
# pycryptodome (already required): a throwaway CA and a leaf for the URL's host, fresh
# keys every run, kept in the demo's temporary directory only while it runs. No key is
# shipped, and nothing depends on the `openssl` command. The DER below is RFC 5280's
# Certificate, written out by hand: tag, length, contents.

SEQUENCE, SET = 0x30, 0x31


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


def _key_id(key):
    """RFC 5280 4.2.1.2's method 1: SHA-1 of the public key's point, uncompressed."""
    point = key.pointQ
    return hashlib.sha1(b"\x04" + int(point.x).to_bytes(32, "big")
                        + int(point.y).to_bytes(32, "big")).digest()


def _certificate(subject, key, issuer, issuer_key, extensions):
    """An X.509 v3 certificate (DER), ECDSA with SHA-256, valid from an hour ago for a day."""
    algorithm = der(SEQUENCE, der_oid("1.2.840.10045.4.3.2"))          # ecdsa-with-SHA256
    now = time.time()
    validity = der(SEQUENCE, *(der(0x17, time.strftime("%y%m%d%H%M%SZ", time.gmtime(now + delta)).encode())
                               for delta in (-3600, 86400)))
    tbs = der(SEQUENCE, der(0xA0, der(0x02, b"\x02")),                 # version 3
              der(0x02, b"\x01" + os.urandom(8)), algorithm, der_name(issuer), validity,
              der_name(subject), key.public_key().export_key(format="DER"),
              der(0xA3, der(SEQUENCE, *extensions)))
    signature = DSS.new(issuer_key, "fips-186-3", encoding="der").sign(SHA256.new(tbs))
    return der(SEQUENCE, tbs, algorithm, der(0x03, b"\x00" + signature))


def demo_certificates(host):
    """(CA certificate, leaf certificate, leaf key) for ``host``, all new: the leaf
    names the host in subjectAltName (a DNS name, or an IP address), with the
    extensions strict verifiers (Python 3.13's) ask for."""
    ca_key, leaf_key = ECC.generate(curve="P-256"), ECC.generate(curve="P-256")
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
    return ca, leaf, leaf_key


DEMO_CA = "obfsproxy.py demo CA (throwaway)"


@dataclasses.dataclass(frozen=True)
class TrustingSettings(proxy.Settings):
    """The demo client's settings: each webtunnel config it makes trusts the demo's
    CA instead of the system's roots. That is the only change from a real client;
    the demo checks that the ClientHello is the same (JA4)."""

    trust: Optional[ssl.SSLContext] = None

    def client_config(self, args=None):
        return dataclasses.replace(proxy.Settings.client_config(self, args), context=self.trust)


class WebTunnelStage(Stage):
    """A bridge at url= (default https://wt.test/<a new secret path>), served by our
    server terminating TLS itself (tls-cert=, tls-key=: the demo's certificate for the
    URL's host) where a real bridge has nginx in front. The client's SOCKS target is
    the bridge line's synthetic address; it dials addr=, the server's port. Its TLS
    context trusts the demo's CA and writes a key log, which ``finish`` reads: the
    TLS secrets only the ends hold, with which the demo opens the recorded records."""

    def __init__(self, options, directory):
        Stage.__init__(self, options, directory)
        unknown = sorted(set(options) - {"url"})
        if unknown:
            raise ValueError("the webtunnel demo takes url= only (it makes its own certificate), "
                             "not %s" % ", ".join(unknown))
        self.url = options.get("url") or "https://wt.test/" + "".join(
            secrets.choice(string.ascii_letters + string.digits) for _ in range(16))
        parts = urlsplit(self.url)
        self.tls = parts.scheme.lower() == "https"
        self.server_options = {"url": self.url}
        self.ca = self.leaf = None
        self.key_log_path, self.key_log = directory / "tls-key-log.txt", ""
        if self.tls and parts.hostname:
            self.ca, self.leaf, key = demo_certificates(parts.hostname)
            cert_file, key_file = directory / "demo-leaf.pem", directory / "demo-leaf.key"
            cert_file.write_text(ssl.DER_cert_to_PEM_cert(self.leaf))
            key_file.write_text(key.export_key(format="PEM"))
            self.server_options.update({"tls-cert": str(cert_file), "tls-key": str(key_file)})

    def client_side(self, settings, cls, server_config, announce, server_address):
        self.target = cls.public_address(server_config, server_address)
        options = dict(announce, addr=format_address(server_address))
        trust = None
        if self.tls:
            trust = ssl.create_default_context(cadata=self.ca)     # as default_client_context()
            trust.set_alpn_protocols(webtunnel.ALPN)
            trust.keylog_filename = str(self.key_log_path)
        fields = {field.name: getattr(settings, field.name) for field in dataclasses.fields(settings)}
        return TrustingSettings(**dict(fields, options=options, trust=trust)), self.target

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
CHROME_JA4 = "t13d1516h2_8daaf6152771_02713d6af862"     # Chrome over TCP, in the JA4 project's README


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
    cipher = (ChaCha20_Poly1305.new(key=key, nonce=nonce) if suite == 0x1303
              else AES.new(key, AES.MODE_GCM, nonce=nonce))
    cipher.update(header)
    try:
        inner = cipher.decrypt_and_verify(body[:-16], body[-16:]).rstrip(b"\x00")
    except ValueError:
        return None
    return (inner[-1], inner[:-1]) if inner else None


def key_log_secrets(text, client_random):
    """{label: secret} of the key log's lines for this connection (SSLKEYLOGFILE's
    format: LABEL <client random hex> <secret hex>)."""
    found = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 3 and words[1] == client_random.hex():
            found[words[0]] = bytes.fromhex(words[2])
    return found


@dataclasses.dataclass
class Record:
    """One TLS record of one direction: where it was, what the observer saw (the
    header's type and length), and what the key log opened it to."""

    offset: int
    kind: int                 # the header's content type: what a censor sees
    body: bytes
    inner: Optional[int] = None   # the real type, once opened
    content: bytes = b""
    what: str = ""


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
        print('  signed by "%s" (ECDSA P-256 keys from pycryptodome, valid' % DEMO_CA)
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
    walk.check(hello.sni == (None if is_ip_address(config.servername) else config.servername),
               "the SNI is not servername= (none for an IP address: RFC 6066 3)")
    walk.check(hello.alpn == [b"http/1.1"], "the ALPN is not http/1.1")
    reference = tlswire.hello(in_memory_client_hello(webtunnel.default_client_context(), config.servername))
    if walk.check(reference is not None and tlswire.ja4(reference) == ja4,
                  "the demo client's JA4 is not that of webtunnel.default_client_context()'s ClientHello"):
        print("  Checked: the SNI is servername=, the ALPN http/1.1, and webtunnel.default_client_context()")
        print("  (the system's roots) makes a ClientHello with this same JA4: every webtunnel client on")
        print("  this Python (%s) sends this fingerprint, to every bridge." % ssl.OPENSSL_VERSION)
    print("  Chrome's, in the JA4 project's own table, is %s:" % CHROME_JA4)
    print("  other lists, GREASE, ALPN h2. A censor with a list of fingerprints tells the two apart;")
    print("  lyrebird shapes its ClientHello with uTLS for that reason. Python's ssl cannot (a bridge")
    print("  line's utls= gets a NOTICE that says so).")
    return hello


def is_ip_address(text):
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def in_memory_client_hello(context, servername):
    """The first flight a client context sends for ``servername``, made in memory."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=servername)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


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
                      % (tlswire.VERSION_NAMES.get(answer.version, "%04x" % answer.version), suite)):
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
                  len(webtunnel.upgrade_request(walk.client.config)), "the upgrade request")
    records_table(walk, "server -> client", s_records, s_end, len(walk.s_sent),
                  len(webtunnel.SWITCHING_PROTOCOLS), "the 101")
    walk.check(stage.leaf in handshake_messages(s_records).get("Certificate", b""),
               "the server's Certificate message does not carry the demo's certificate")
    print("  Checked: every sealed record opened (its tag verified) and the server's Certificate message")
    print("  carries the certificate the demo made. A censor sees the left-hand columns only.")
    return c_records, s_records


def records_table(walk, label, records, end, total, head_length, head_name):
    """One direction's records: the header a censor reads, and what the key log opened."""
    walk.title("Every record, %s: what a censor sees, and what it held" % label)
    print("    offset  header: type       length   inside (opened with the key log)")
    carried = 0
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
        walk.check(record.inner is not None,
                   "the record %s at offset %d did not open" % (label, record.offset))
    walk.check(end == total, "the %s bytes are not whole records" % label)


def application_data(records):
    return b"".join(r.content for r in records if r.kind == r.inner == tlswire.APPLICATION_DATA)


def upgrade_section(walk, c_plain, s_plain, where):
    """The request and the 101 as they were sent; returns both."""
    request, response = webtunnel.upgrade_request(walk.client.config), webtunnel.SWITCHING_PROTOCOLS
    walk.title("The upgrade, %s" % where)
    for label, data, expected, made_by in (
            ("client -> server", c_plain, request, "webtunnel.upgrade_request"),
            ("server -> client", s_plain, response, "webtunnel.SWITCHING_PROTOCOLS")):
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
    record = next((r for r in c_records if r.kind == r.inner == tlswire.APPLICATION_DATA
                   and r.content == MESSAGE), None)
    if walk.check(record is not None and c_data == MESSAGE and s_data == walk.exchange.echoed,
                  "the records after the upgrade do not open to the message and its echo"):
        print("  the client sent them as one record, at offset %d of its bytes: %d + 17 bytes, sealed:"
              % (record.offset, len(MESSAGE)))
        walk.dump(walk.c_sent[record.offset:record.offset + 5 + len(record.body)])
        print("  Checked: it opened to the application's bytes exactly, and the server's to the echo:")
        print("  no frame, no length, no mask inside. The sizes of the writes show through, 22 bytes")
        print("  more each (header, type, tag); with Tor inside, its own TLS records do (TLS in TLS).")
    print("  A string filter finds a TLS record header at offset 0 of the wire (below): webtunnel is TLS.")


WALKS = {"dummy": walk_dummy, "obfs2": walk_obfs2, "obfs3": walk_obfs3, "obfs4": walk_obfs4,
         "webtunnel": walk_webtunnel}
STAGES = {"webtunnel": WebTunnelStage}
