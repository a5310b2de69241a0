"""``obfsproxy.py demo``: the whole tunnel on 127.0.0.1, in one process, annotated.

    demo app --SOCKS5--> client ===obfs2===> server --plain--> echo service
                                  ^
                       the wire: what a censor sees

It starts an echo service, an obfs2 server in front of it and a SOCKS client
(real sockets, threads of this process), sends a message that starts like a
TLS ClientHello (the kind of fixed string DPI looks for), and then shows:

1. each side's handshake message as it crossed the wire, field by field;
2. the key schedule, as the code derived it from the two seeds;
3. the first application bytes, in clear and as sent;
4. what a string-matching filter saw, and what a censor who knows obfs2 sees.

Every value printed is checked: the keys shown decrypt the recorded wire
bytes back to the message, and each side read the other's PADLEN. The
presentation helpers live in capture.py, which ``unmask`` shares.
"""

import dataclasses
import math
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

import capture
import obfs2
import proxy as proxy_
import transports
from outbound import format_address

MESSAGE = (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
           b" <- a TLS ClientHello starts like this; a DPI box matches it. "
           b"Hello from the other side of the obfs2 tunnel!")
SIGNATURES = [("TLS record header 16 03 01", b"\x16\x03\x01"), ('"ClientHello"', b"ClientHello"),
              ('"obfs2 tunnel"', b"obfs2 tunnel")]


class Tap:
    """Keeps each new transport's wire bytes in memory (``transports.Recorder``,
    the same wrapper as --record-dir): ``Settings(tap=Tap())``."""

    def __init__(self):
        self.taps = []            # (transport, bytes it sent, bytes it received)

    def __call__(self, transport):
        sent, received = bytearray(), bytearray()
        self.taps.append((transport, sent, received))
        return transports.Recorder(transport, sent.extend, received.extend)


innermost = transports.innermost


def echo_service():
    """A plain TCP echo on 127.0.0.1: returns (address, listening socket)."""
    listener = proxy_.listen(("127.0.0.1", 0))

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
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    return listener.getsockname()[:2], listener


def socks5_connect(proxy_address, target, timeout=30):
    """Open a SOCKS5 CONNECT to ``target`` (an IPv4 address) through the client."""
    sock = socket.create_connection(proxy_address, timeout=timeout)
    sock.sendall(b"\x05\x01\x00")                      # VER=05 NMETHODS=01 METHODS=[no auth]
    if recv_exact(sock, 2) != b"\x05\x00":
        raise RuntimeError("SOCKS method refused")
    host, port = target
    sock.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(host) + struct.pack("!H", port))
    reply = recv_exact(sock, 10)                       # VER REP RSV ATYP=01 ADDR(4) PORT(2)
    if reply[1] != 0:
        raise RuntimeError("SOCKS CONNECT failed with reply code %d" % reply[1])
    return sock


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise RuntimeError("connection closed early")
        data += chunk
    return data


def entropy(data):
    """Shannon entropy in bits per byte (uniformly random bytes: close to 8)."""
    counts = [0] * 256
    for byte in data:
        counts[byte] += 1
    return -sum(c / len(data) * math.log2(c / len(data)) for c in counts if c)


def run_exchange(name, options, settings):
    """Echo, server and client on 127.0.0.1; send MESSAGE through them.
    Returns (echoed bytes, client taps, server taps, addresses, seconds)."""
    cls = transports.transport_class(name)
    echo_address, echo_listener = echo_service()
    state = tempfile.TemporaryDirectory(prefix="obfsproxy-demo-")
    server_config, announce = cls.server_config(
        {k: v for k, v in options.items() if k != "cert"}, Path(state.name))
    client_options = dict(options, **announce)   # the bridge line's arguments
    server_tap, client_tap = Tap(), Tap()
    server_settings = dataclasses.replace(settings, transport=name, config=server_config,
                                          dest=echo_address, tap=server_tap)
    client_settings = dataclasses.replace(settings, transport=name, options=client_options,
                                          tap=client_tap)
    proxy = proxy_.Proxy()
    server_address = proxy.listen(("127.0.0.1", 0), proxy_.handle_server, server_settings)
    client_address = proxy.listen(("127.0.0.1", 0), proxy_.handle_socks_client, client_settings)
    threading.Thread(target=proxy.serve, daemon=True).start()
    started = time.perf_counter()
    try:
        with socks5_connect(client_address, server_address) as sock:
            sock.sendall(MESSAGE)
            sock.shutdown(socket.SHUT_WR)
            echoed = b""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                echoed += chunk
    finally:
        proxy.stop()
        echo_listener.close()
        state.cleanup()
    addresses = (echo_address, server_address, client_address)
    return (echoed, client_tap.taps[0], server_tap.taps[0], addresses,
            time.perf_counter() - started)


def main(name, options, settings):
    """``obfsproxy.py demo``: 0 when the message came back byte for byte."""
    style = capture.Style.for_stream(sys.stdout)
    title = lambda text: print("\n" + style("title", text))
    try:
        echoed, client_tap, server_tap, addresses, seconds = run_exchange(name, options, settings)
    except (RuntimeError, OSError) as exc:
        print(style("bad", "FAILED: the demo connection did not work: %s" % exc))
        return 1
    client, c_sent, c_received = innermost(client_tap[0]), bytes(client_tap[1]), bytes(client_tap[2])
    server, s_sent, s_received = innermost(server_tap[0]), bytes(server_tap[1]), bytes(server_tap[2])
    echo_address, server_address, client_address = addresses

    print(style("title", "obfsproxy.py demo: the %s tunnel on 127.0.0.1, in one process"
                % name))
    print("  demo app --SOCKS5--> client %s ===%s===> server %s --plain--> echo %s"
          % (format_address(client_address), name,
             format_address(server_address), format_address(echo_address)))
    print("  The client is the initiator (it opened the TCP connection); the server is the responder.")
    if settings.record is not None:
        print("  The wire bytes were also saved in %s: try `python3 obfsproxy.py unmask %s`."
              % (settings.record.directory, settings.record.directory))
    problems = []
    if c_sent != s_received or s_sent != c_received:
        problems.append("what one side sent differs from what the other received")

    if isinstance(client, obfs2.Obfs2):
        problems += explain_obfs2(client, server, c_sent, s_sent, style, title)
        c_data = c_sent[obfs2.HEADER_LENGTH + client.padlen:]
        s_data = s_sent[obfs2.HEADER_LENGTH + server.padlen:]
    else:
        title("1. and 2. The handshake and the keys: none")
        print("  The %s transport has no handshake and no keys: the wire carries the application's "
              "bytes unchanged." % name)
        c_data, s_data = c_sent, s_sent
    title("3. The first application bytes")
    print("  the application sent %d bytes, in clear:" % len(MESSAGE))
    for line in capture.hexdump(MESSAGE, 48):
        print(style("clear", line))
    print("  the client sent them as %s:"
          % ("E(INIT_SECRET, message)" if c_data != MESSAGE else "they were"))
    for line in capture.hexdump(c_data, 48):
        print(style("wire", line))
    print("  the echo came back; the server sent it as %s:"
          % ("E(RESP_SECRET, echo)" if s_data != echoed else "it was"))
    for line in capture.hexdump(s_data, 48):
        print(style("wire", line))
    if c_data != MESSAGE:
        print("  Ciphertext length = plaintext length (%d bytes): obfs2 hides no sizes and no timing."
              % len(c_data))

    title("4. What a string-matching filter saw")
    print("  %-28s  %-26s  %s" % ("pattern", "in the application's bytes", "on the wire (both ways)"))
    wire = c_sent + s_sent
    for name, pattern in SIGNATURES:
        at = MESSAGE.find(pattern)
        seen = wire.find(pattern)
        print("  %-28s  %-26s  %s" % (name, "offset %d" % at if at >= 0 else "-",
                                      style("bad", "offset %d: MATCH" % seen) if seen >= 0
                                      else style("ok", "not found")))
    print("  byte entropy: message %.1f bits/byte, wire %.1f bits/byte (random bytes: 8)"
          % (entropy(MESSAGE), entropy(wire)))
    if isinstance(client, obfs2.Obfs2):
        print("  A filter matching strings or regular expressions sees random-looking bytes from the\n"
              "  first byte on: that is all obfs2 is for. (An entropy test already flags that.)")
        if client.secret_hash is None:
            print("  A censor who knows obfs2 needs no string: one SHA-256 over the first 16 bytes and\n"
                  "  one AES block over the next 8 reveal 2b f5 ca 7e (`obfsproxy.py detect`), and the\n"
                  "  two seeds, sent in clear, give every key above (`obfsproxy.py unmask`).")
            print("  Try `python3 obfsproxy.py demo --shared-secret=SECRET` to see what a shared "
                  "secret changes.")
        else:
            n = client.iterations
            print("  With a shared secret the seeds alone no longer give the keys. A censor who knows\n"
                  "  the secret (it is in the bridge line) pays %d SHA-256 to detect a connection and\n"
                  "  4 x %d = %d to read it; one who does not must guess it, at %d SHA-256 a guess."
                  % (n, n, 4 * n, n))
    else:
        print("  With --transport=dummy every signature is on the wire: this is what obfs2 removes.")

    print()
    if echoed != MESSAGE:
        problems.append("the echo differs from the message")
    for problem in problems:
        print(style("bad", "FAILED: %s" % problem))
    if problems:
        return 1
    print(style("ok", "OK") + ": the message crossed the tunnel and came back byte for byte "
          "(%.2f s). More: docs/PROTOCOL.md" % seconds)
    return 0


def explain_obfs2(client, server, c_sent, s_sent, style, title):
    """Sections 1 and 2: the handshake messages and the key schedule.
    Returns a list of problems (values that do not check out)."""
    problems = []
    secret_hash, iterations = client.secret_hash, client.iterations
    started = time.perf_counter()
    rows = capture.key_schedule(client.seed, server.seed, secret_hash, iterations)
    derive_seconds = time.perf_counter() - started
    init_pad, resp_pad, init_secret, resp_secret = (row[3] for row in rows)

    title("1. The handshake: each side sends one message at once, without waiting for the other"
          if secret_hash is None else
          "1. The handshake: the client sends at once; with a shared secret our server answers"
          " once the client's message proved the secret")
    for name, obj, sent, pad, initiator in (
            ("client -> server: the initiator's message", client, c_sent, init_pad, True),
            ("server -> client: the responder's message", server, s_sent, resp_pad, False)):
        print("  %s, 24 + PADLEN = %d bytes" % (name, obfs2.HEADER_LENGTH + obj.padlen))
        for line in capture.header_lines(sent, initiator, pad, style):
            print(line)
    print("  The receiver takes the seed, derives the sender's PAD key, checks MAGIC, drops PADLEN bytes;")
    print("  the server read PADLEN %d (Obfs2.peer_padlen), the client read %d."
          % (server.peer_padlen, client.peer_padlen))
    if (server.peer_padlen, client.peer_padlen) != (client.padlen, server.padlen):
        problems.append("a side read the wrong PADLEN")
    if server.peer_seed != client.seed or client.peer_seed != server.seed:
        problems.append("a side read the wrong seed")

    title("2. The key schedule, as the code derived it (obfs2.pad_key, obfs2.data_keys)")
    print("  INIT_SEED = %s (the client's Obfs2.seed)" % style("wire", client.seed.hex()))
    print("  RESP_SEED = %s (the server's Obfs2.seed)" % style("wire", server.seed.hex()))
    if secret_hash is None:
        print("  MAC(s, x) = SHA-256(s | x | s). Each value m is one SHA-256 output:"
              " AES-128 key = m[0:16],")
    else:
        print("  shared secret: H(SECRET) = %s" % secret_hash.hex())
        print("  Every MAC becomes H^n(s | x | H(SECRET) | s), n = %d (--ss-hash-iterations)."
              % iterations)
        print("  Each value m is the last SHA-256 output: AES-128 key = m[0:16],")
    print("  IV = m[16:32], the whole 128-bit CTR counter block.")
    for line in capture.key_schedule_lines(rows, secret_hash, style):
        print(line)
    per_side = 4 * (1 if secret_hash is None else iterations)
    print("  Each side computes all four (its own PAD key, the peer's, both data keys): "
          "%d SHA-256,\n  %s here." % (per_side, capture.duration(derive_seconds)))
    if secret_hash is not None:
        print("  Without the secret that would be 4 SHA-256: the secret multiplies the cost by %d,\n"
              "  for both ends and for a censor who knows it." % iterations)
    # Check that these are the keys the tunnel used: they must decrypt the wire.
    for name, sent, obj, m in (("INIT_SECRET", c_sent, client, init_secret),
                               ("RESP_SECRET", s_sent, server, resp_secret)):
        if obfs2.ctr(m).decrypt(sent[obfs2.HEADER_LENGTH + obj.padlen:]) != MESSAGE:
            problems.append("%s does not decrypt the recorded data" % name)
    if not problems:
        print("  Checked: INIT_SECRET and RESP_SECRET decrypt the recorded wire bytes back to the message.")
    return problems
