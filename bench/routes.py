"""How the load generator reaches the sink: directly, through a SOCKS5 client (obfs4's
arguments as the RFC 1929 username/password, as Tor sends them), or TLS + an HTTP
upgrade to nginx (webtunnel's ceiling)."""

import asyncio
import os
import socket
import ssl
import sys

from traffic import SOCKET_TIMEOUT, recv_exact

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import socks  # noqa: E402  (the SOCKS messages are written once, in socks.py)

# webtunnel through nginx: the secret path and the test CA's leaf name (tests/testca.py)
WEBTUNNEL_PATH = "/bench-k7Qm2Zx1c1b00b6"
WEBTUNNEL_NAME = "wt.test"        # the test CA's leaf (tests/testca.py)
METHOD_NO_AUTH, METHOD_USERPASS = bytes([socks.METHOD_NO_AUTH]), bytes([socks.METHOD_USERPASS])

# --- Reaching the sink: directly or through a SOCKS5 client ---------------------------------

def socks5_request(target):
    return socks.socks5_connect(*target)


def socks5_reply_rest(head):
    """What is left to read of a SOCKS5 reply after its first 4 bytes; refused -> error."""
    if head[0] != socks.SOCKS5_VERSION:
        raise ConnectionError("not a SOCKS5 reply: %r" % head)
    if head[1] != 0:
        raise ConnectionError("SOCKS5 reply code 0x%02x" % head[1])
    if head[3] not in (socks.ATYP_IPV4, socks.ATYP_IPV6):
        raise ConnectionError("SOCKS5 reply with address type %d" % head[3])
    return socks.socks5_reply_length(head)      # the bound address and port: ignored


def socks5_auth(args):
    """The pt-spec 3.5 way to pass a bridge's arguments: "k=v;k=v" as the RFC 1929
    username (its first 255 bytes) and password (the rest, or one NUL)."""
    raw = ";".join("%s=%s" % item for item in sorted(args.items())).encode()
    return socks.socks5_userpass(raw[:255], raw[255:] or b"\0")


class Route:
    """How the generator reaches the sink: TCP to ``first_hop``; if ``target`` is set,
    first_hop is a SOCKS5 client and ``target`` the server to CONNECT to, with the
    server's ``args`` (obfs4: cert, iat-mode) as SOCKS5 username/password. ``timeout``:
    the most one socket operation may block (SOCKET_TIMEOUT unless given)."""

    threads = True      # a socket that one thread may read while another writes

    def __init__(self, first_hop, target=None, args=None, timeout=None):
        self.first_hop, self.target, self.args = first_hop, target, args or {}
        self.timeout = timeout

    def connect(self):
        sock = socket.create_connection(self.first_hop, timeout=self.timeout or SOCKET_TIMEOUT)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.target is not None:
                method = METHOD_USERPASS if self.args else METHOD_NO_AUTH
                sock.sendall(socks.socks5_greeting(method))    # greeting: one method
                if recv_exact(sock, 2) != b"\x05" + method:
                    raise ConnectionError("SOCKS5 greeting refused")
                if self.args:
                    sock.sendall(socks5_auth(self.args))
                    if recv_exact(sock, 2) != b"\x01\x00":
                        raise ConnectionError("SOCKS5 arguments refused")
                sock.sendall(socks5_request(self.target))
                recv_exact(sock, socks5_reply_rest(recv_exact(sock, 4)))
        except BaseException:
            sock.close()
            raise
        return sock

    async def open(self):
        reader, writer = await asyncio.open_connection(*self.first_hop)
        try:
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.target is not None:
                method = METHOD_USERPASS if self.args else METHOD_NO_AUTH
                writer.write(socks.socks5_greeting(method))
                if await reader.readexactly(2) != b"\x05" + method:
                    raise ConnectionError("SOCKS5 greeting refused")
                if self.args:
                    writer.write(socks5_auth(self.args))
                    if await reader.readexactly(2) != b"\x01\x00":
                        raise ConnectionError("SOCKS5 arguments refused")
                writer.write(socks5_request(self.target))
                await reader.readexactly(socks5_reply_rest(await reader.readexactly(4)))
        except BaseException:
            writer.close()
            raise
        return reader, writer


class UpgradeRoute(Route):
    """nginx-upgrade: TLS to nginx (the test CA trusted, SNI wt.test), the upgrade of
    webtunnel's secret path, then the sink's protocol inside TLS. ``threads`` is False:
    the socket is an ssl.SSLSocket, which bulk_both would read and write from two threads."""

    threads = False

    def __init__(self, front, ca_file):
        Route.__init__(self, front.address)
        self.front = front
        self.context = ssl.create_default_context(cafile=ca_file)
        self.request = (b"GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: Go-http-client/1.1\r\n"
                        b"Connection: upgrade\r\nUpgrade: websocket\r\n\r\n"
                        % (front.path.encode(), WEBTUNNEL_NAME.encode()))

    @staticmethod
    def check(head):
        if not head.startswith(b"HTTP/1.1 101 "):
            raise ConnectionError("nginx answered %r, not 101" % head[:80])

    def connect(self):
        sock = Route.connect(self)
        try:
            sock = self.context.wrap_socket(sock, server_hostname=WEBTUNNEL_NAME)
            sock.sendall(self.request)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    raise ConnectionError("nginx closed before its answer to the upgrade")
                head += chunk
            self.check(head)
        except BaseException:
            sock.close()
            raise
        return sock

    async def open(self):
        reader, writer = await asyncio.open_connection(*self.first_hop, ssl=self.context,
                                                       server_hostname=WEBTUNNEL_NAME)
        try:
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            writer.write(self.request)
            self.check(await reader.readuntil(b"\r\n\r\n"))
        except BaseException:
            writer.close()
            raise
        return reader, writer
