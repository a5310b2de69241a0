import hashlib
import os

from support import EchoServer, recv_all, socks5_connect, tunnel


def test_obfs2_tunnel_round_trip():
    payload = os.urandom(200_000)
    with EchoServer() as echo:
        server, client = tunnel("obfs2", dest=echo.address)
        with server, client:
            with socks5_connect(client.address, server.address) as sock:
                sock.sendall(payload)
                sock.shutdown(1)
                got = recv_all(sock)
    assert hashlib.sha256(got).digest() == hashlib.sha256(payload).digest()
