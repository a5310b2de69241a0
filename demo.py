"""``obfsproxy.py demo``: the whole tunnel on 127.0.0.1, in one process.

    demo app --SOCKS5--> client ===obfs2===> server --plain--> echo service
                                  ^
                       the wire: what a censor sees

It starts an echo service, an obfs2 server in front of it and a SOCKS client,
sends a message that starts like a TLS record (the kind of fixed string DPI
looks for), and prints the message beside the bytes that crossed the wire.
"""

import socket
import struct
import threading

import obfsproxy

MESSAGE = (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
           b" <- a TLS ClientHello starts like this; a DPI box matches it. "
           b"Hello from the other side of the obfs2 tunnel!")


class Wire:
    """Records what one transport put on and took off the wire."""

    def __init__(self):
        self.sent = bytearray()
        self.received = bytearray()


class RecordingTransport:
    """Wraps a transport and copies every wire byte into a ``Wire``."""

    def __init__(self, inner, wire):
        self.inner, self.wire, self.name = inner, wire, inner.name

    @property
    def is_open(self):
        return self.inner.is_open

    def start(self):
        data = self.inner.start()
        self.wire.sent += data
        return data

    def receive(self, data):
        self.wire.received += data
        return self.inner.receive(data)

    def send(self, data):
        out = self.inner.send(data)
        self.wire.sent += out
        return out


class RecordingSettings(obfsproxy.Settings):
    def __init__(self, wire, **kwargs):
        super().__init__(**kwargs)
        self.wire = wire

    def new_transport(self, initiator, args=None):
        return RecordingTransport(super().new_transport(initiator, args), self.wire)


def echo_service():
    """A plain TCP echo on 127.0.0.1: returns (address, listening socket)."""
    listener = obfsproxy.listen(("127.0.0.1", 0))

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


def hexline(data, limit=32):
    shown = " ".join("%02x" % b for b in data[:limit])
    return shown + (" ..." if len(data) > limit else "")


def main(args):
    settings, _ = obfsproxy.settings_from_args(args)
    wire = Wire()
    common = dict(transport=settings.transport, shared_secret=settings.shared_secret,
                  hash_iterations=settings.hash_iterations,
                  handshake_timeout=settings.handshake_timeout)
    echo_address, echo_listener = echo_service()
    proxy = obfsproxy.Proxy()
    server_address = proxy.listen(("127.0.0.1", 0), obfsproxy.handle_server,
                                  obfsproxy.Settings(dest=echo_address, **common))
    client_address = proxy.listen(("127.0.0.1", 0), obfsproxy.handle_socks_client,
                                  RecordingSettings(wire, **common))
    threading.Thread(target=proxy.serve, daemon=True).start()
    try:
        print("echo service    %s" % obfsproxy.format_address(echo_address))
        print("%s server    %s  -> echo" % (settings.transport, obfsproxy.format_address(server_address)))
        print("%s client    %s  (SOCKS)" % (settings.transport, obfsproxy.format_address(client_address)))
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
    handshake = len(wire.sent) - len(MESSAGE)
    on_wire = bytes(wire.sent[handshake:])
    print()
    print("application sent  %4d bytes: %s" % (len(MESSAGE), hexline(MESSAGE)))
    print("the wire carried  %4d bytes: %s" % (len(wire.sent), hexline(wire.sent)))
    print("  = %d bytes of handshake (seed, magic, padding length, padding)" % handshake)
    print("  + %d bytes of data:         %s" % (len(on_wire), hexline(on_wire)))
    print("echo came back    %4d bytes: %s" % (len(echoed), hexline(echoed)))
    print()
    print("TLS signature 16 03 01 visible on the wire: %s"
          % ("yes" if b"\x16\x03\x01" in wire.sent else "no"))
    if echoed != MESSAGE:
        print("FAILED: the echo differs from the message")
        return 1
    print("OK: the message crossed the tunnel and came back byte for byte.")
    return 0
