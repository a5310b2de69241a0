"""Interop with an independent obfs2: Debian's obfs4proxy (Go).

    our client  ==obfs2==> obfs4proxy server --> destination
    obfs4proxy client ==obfs2==> our server  --> destination

obfs4proxy closes both directions at the first EOF, so these tests never
half-close across it: they read the expected byte count instead of waiting
for EOF. Its SOCKS5 is strict (greeting, wait for 05 00, then CONNECT), which
is what support.socks5_connect does.
"""

import os
import random

import pytest
from peers import Background, Destination, Obfs4proxy, digest, duplex, read_hashing
from support import Proxy, fmt, recv_exact, require_obfs4proxy, socks5_connect
from support import echo as echo_to_eof

pytestmark = pytest.mark.interop

MiB = 1024 * 1024
BIG = 8 * MiB
SEQUENTIAL = 100
IO_TIMEOUT = 20


@pytest.fixture(scope="module")
def obfs4proxy_path():
    return require_obfs4proxy()


@pytest.fixture(scope="module")
def echo():
    def echo_until_closed(conn, report):
        # Echo until the peer closes; obfs4proxy may reset instead of FIN.
        try:
            echo_to_eof(conn)
        except ConnectionResetError:
            pass
    with Destination(echo_until_closed) as dest:
        yield dest


def stop_cleanly(peer):
    assert peer.stop() == 0, "obfs4proxy %s exited with %r; stderr: %r" % (
        peer.role, peer.process.returncode, peer.stderr.lines)


@pytest.fixture(scope="module")
def pairings(obfs4proxy_path, echo, tmp_path_factory):
    """Both pairings at once: (SOCKS port, obfs2 server address) for
    'ours->theirs' and 'theirs->ours', all forwarding to ``echo``."""
    state = tmp_path_factory.mktemp("obfs4proxy")
    their_server = Obfs4proxy("server", state, orport=echo.address)
    their_client = Obfs4proxy("client", state)
    our_server = Proxy("server", "--dest=" + fmt(echo.address), "127.0.0.1:0")
    our_client = Proxy("client", "127.0.0.1:0")
    try:
        yield {"our-client->obfs4proxy-server": (our_client.address, their_server.address),
               "obfs4proxy-client->our-server": (their_client.address, our_server.address)}
    finally:
        our_client.stop()
        our_server.stop()
        stop_cleanly(their_client)
        stop_cleanly(their_server)


PAIRINGS = ["our-client->obfs4proxy-server", "obfs4proxy-client->our-server"]


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_sequential_connections_exercise_padding_lengths(pairings, pairing):
    """Each connection draws new seeds and a new padding length on both sides
    (0..8192): 50 connections cover many lengths, in both roles."""
    socks, server = pairings[pairing]
    rng = random.Random()
    for n in range(SEQUENTIAL):
        data = os.urandom(rng.randint(1, 20000))
        with socks5_connect(socks, server, timeout=IO_TIMEOUT) as sock:
            sender = Background(sock.sendall, data)
            assert recv_exact(sock, len(data)) == data, "connection %d" % n
            sender.join()


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_8_mib_both_directions_at_once(obfs4proxy_path, tmp_path, pairing):
    """The application and the destination each send 8 MiB while reading
    8 MiB; both streams are checked by SHA-256."""
    up, down = os.urandom(BIG), os.urandom(BIG)
    with Destination(duplex(down, expect=len(up), half_close=False)) as dest:
        if pairing.startswith("our-client"):
            server = Obfs4proxy("server", tmp_path, orport=dest.address)
            client = Proxy("client", "127.0.0.1:0")
        else:
            server = Proxy("server", "--dest=" + fmt(dest.address), "127.0.0.1:0")
            client = Obfs4proxy("client", tmp_path)
        try:
            with socks5_connect(client.address, server.address, timeout=IO_TIMEOUT) as sock:
                sender = Background(sock.sendall, up)
                got = read_hashing(sock, len(down))
                sender.join()
                assert dest.result() == (len(up), digest(up)), "the destination got other bytes"
            assert got == (len(down), digest(down)), "the application got other bytes"
        finally:
            for peer in (client, server):
                if isinstance(peer, Obfs4proxy):
                    stop_cleanly(peer)
                else:
                    peer.stop()
