"""Interop with an independent implementation, Debian's obfs4proxy 0.0.14 (Go), for
obfs2, obfs3 and obfs4, in both roles; and our own client with our own server.

    our client        ==T==> obfs4proxy server --> destination
    obfs4proxy client ==T==> our server        --> destination
    our client        ==T==> our server        --> destination     (half-close too)

Every payload is checked by SHA-256 at the far end. obfs4proxy closes both
directions at the first EOF, so across it the tests never half-close: they read the
expected byte count instead of waiting for EOF. Its SOCKS5 is strict (greeting, wait
for 05 00, then CONNECT), which is what support.socks5_connect does; obfs4's
arguments (cert=...;iat-mode=N) travel as the RFC 1929 user name, as Tor sends them.

obfs4 servers, ours and obfs4proxy's, run with the same pinned identity
(peers.PINNED, drbg-seed 07 x 24): the same cert, a length table without 0 (obfs4proxy
panics on a 0 in iat-mode 2, obfs4-spec 3 #14) and a close delay of 1 s, so a failed
handshake closes at accept + 31 s on both.

Sizes: 8 MiB each way in the default group (iat-mode 0, obfs3); 64 MiB each way,
timed, in the slow group (run with -s to see the MB/s). iat-mode 1 and 2 pace every
piece (<= 1448 bytes) by a sampled 0..10 ms, about 240 KB/s and 120 KB/s on both
implementations, by design: 256 KiB in the default group, 8 MiB in the slow group.
"""

import os
import random
import re
import socket
import time
from contextlib import contextmanager

import pytest
from peers import (
    PINNED_CLOSE_AFTER,
    Background,
    Destination,
    Obfs4proxy,
    digest,
    duplex,
    hashing_echo,
    one_way_each,
    pinned_options,
    read_hashing,
    send_and_shut,
    transfer_each_way,
)
from support import (
    Program,
    SocksReplyError,
    fmt,
    load_vectors,
    recv_all,
    recv_exact,
    require_obfs4proxy,
    socks5_connect,
)
from support import echo as echo_to_eof

import obfs4

pytestmark = pytest.mark.interop

MiB = 1024 * 1024
MB = 1e6
BIG = 8 * MiB            # each way, default group
HUGE = 64 * MiB          # each way, slow group, timed
PACED = 256 * 1024       # iat-mode 1/2, default group
PACED_SLOW = 8 * MiB     # iat-mode 1/2, slow group
SEQUENTIAL = 100
IO_TIMEOUT = 20
PROBE_QUIET = 2.0        # fast probes: seconds of silence we insist on
EOF_PROMPTLY = 10.0      # "at once": far below the 31 s a failed handshake lingers

OURS_TO_THEIRS = "our-client->obfs4proxy-server"
THEIRS_TO_OURS = "obfs4proxy-client->our-server"
PAIRINGS = [OURS_TO_THEIRS, THEIRS_TO_OURS]
OURS_TO_OURS = "our-client->our-server"
THEIRS_TO_THEIRS = "obfs4proxy-client->obfs4proxy-server"   # the reference, slow group only
RATES = []               # (label, up MB/s, down MB/s), printed at the end of the module


@pytest.fixture(scope="module")
def obfs4proxy_path():
    return require_obfs4proxy()


@pytest.fixture(scope="module", autouse=True)
def report_rates():
    yield
    if RATES:
        print("\n\nthroughput, each direction alone (MB = 10^6 bytes):")
        for label, up, down in RATES:
            print("  %-62s up %7.1f MB/s   down %7.1f MB/s" % (label, up, down))


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
    if isinstance(peer, Obfs4proxy):
        assert peer.stop() == 0, "obfs4proxy %s exited with %r; stderr: %r" % (
            peer.role, peer.process.returncode, peer.stderr.lines)
    else:
        peer.stop()


BRIDGE_LINE = r"bridge line for clients: Bridge obfs4 127\.0\.0\.1:(\d+) cert=(\S+) iat-mode=(\d)$"


def our_server(transport, state_dir, dest, *extra):
    """Our server for ``transport``; for obfs4 also the cert its log announces."""
    args = ["server", "--transport=" + transport, "--dest=" + fmt(dest), "127.0.0.1:0",
            "--log-min-severity=info", *extra]
    if transport == "obfs4":
        args.append("--state-dir=%s" % state_dir)
    server = Program(*args)
    server.cert = None
    if transport == "obfs4":
        try:
            match = server.log.wait_for(BRIDGE_LINE)
        except BaseException:
            server.stop()
            raise
        assert int(match.group(1)) == server.address[1]
        server.cert, server.iat_mode = match.group(2), int(match.group(3))
    return server


@contextmanager
def tunnel(transport, pairing, tmp_path, dest, iat_mode=0):
    """A client and a server of ``pairing`` for ``transport``, the server forwarding to
    ``dest``. Yields (SOCKS address, server address, SOCKS arguments or None). obfs4
    servers are pinned (peers.PINNED) with ``iat_mode``; the client uses it too."""
    server_is_ours = pairing.endswith("our-server")
    client_is_ours = pairing.startswith("our-client")
    peers = []
    try:
        if server_is_ours:
            options = ["--transport-options=" + pinned_options(iat_mode, tor=False)] \
                if transport == "obfs4" else []
            server = our_server(transport, tmp_path / "our-state", dest, *options)
        else:
            server = Obfs4proxy("server", tmp_path, orport=dest, transport=transport,
                                options=pinned_options(iat_mode) if transport == "obfs4" else None)
        peers.append(server)
        if client_is_ours:
            client = Program("client", "--transport=" + transport, "127.0.0.1:0")
        else:
            client = Obfs4proxy("client", tmp_path, transport=transport)
        peers.append(client)
        args = None
        if transport == "obfs4":
            assert server.cert == PINNED_CERT, "the pinned identity gives another cert"
            args = "cert=%s;iat-mode=%d" % (server.cert, iat_mode)
        yield client.address, server.address, args
    except BaseException:
        for peer in reversed(peers):   # keep the test's own error, not a status check's
            peer.stop()
        raise
    for peer in reversed(peers):
        stop_cleanly(peer)


# vectors/obfs4-server-state.json: obfs4proxy's own cert for the pinned identity.
_STATE_VECTORS = load_vectors("obfs4-server-state.json")
PINNED_CERT = re.search(r"cert=(\S+),", _STATE_VECTORS["identity_from_options"]["smethod_args"]).group(1)
OTHER_CERT = re.search(r"cert=(\S+),", _STATE_VECTORS["generated_identity"]["stdout"][2]).group(1)


# === obfs2 (kept from the first interop round) ================================================

@pytest.fixture(scope="module")
def pairings(obfs4proxy_path, echo, tmp_path_factory):
    """Both pairings at once: (SOCKS port, obfs2 server address) for
    'ours->theirs' and 'theirs->ours', all forwarding to ``echo``."""
    state = tmp_path_factory.mktemp("obfs4proxy")
    their_server = Obfs4proxy("server", state, orport=echo.address)
    their_client = Obfs4proxy("client", state)
    our_server = Program("server", "--transport=obfs2", "--dest=" + fmt(echo.address), "127.0.0.1:0")
    our_client = Program("client", "--transport=obfs2", "127.0.0.1:0")
    try:
        yield {OURS_TO_THEIRS: (our_client.address, their_server.address),
               THEIRS_TO_OURS: (their_client.address, our_server.address)}
    finally:
        our_client.stop()
        our_server.stop()
        stop_cleanly(their_client)
        stop_cleanly(their_server)


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_sequential_connections_exercise_padding_lengths(pairings, pairing):
    """Each connection draws new seeds and a new padding length on both sides
    (0..8192): 100 connections cover many lengths, in both roles."""
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
    both_directions_at_once("obfs2", pairing, tmp_path, BIG)


# === Both directions at once, across obfs4proxy ===============================================

GREETING = b"server speaks first"


def both_directions_at_once(transport, pairing, tmp_path, size, iat_mode=0):
    """The destination greets, then the application and the destination each send
    ``size`` bytes while reading ``size``; both checked by SHA-256.

    The greeting makes obfs4proxy's client read once before it writes: only then does
    it apply the server's seed packet (obfs4-spec 3 #13), so in iat-mode 2 it never
    samples from its own random table, which may hold the 0 it panics on (3 #14)."""
    up, down = os.urandom(size), os.urandom(size)
    inner = duplex(down, expect=len(up), half_close=False)

    def greet_then_duplex(conn, report):
        conn.sendall(GREETING)
        inner(conn, report)

    with Destination(greet_then_duplex) as dest:
        with tunnel(transport, pairing, tmp_path, dest.address, iat_mode) as (socks, server, args):
            with socks5_connect(socks, server, timeout=IO_TIMEOUT, args=args) as sock:
                sock.settimeout(60 + size / 50000)   # iat-mode 2 moves ~120 KB/s
                assert recv_exact(sock, len(GREETING)) == GREETING
                sender = Background(sock.sendall, up)
                got = read_hashing(sock, len(down))
                sender.join(timeout=60 + size / 50000)
                assert dest.result() == (len(up), digest(up)), "the destination got other bytes"
            assert got == (len(down), digest(down)), "the application got other bytes"


@pytest.mark.parametrize("iat_mode", [0, 1, 2])
@pytest.mark.parametrize("pairing", PAIRINGS)
def test_obfs4_both_directions_at_once(obfs4proxy_path, tmp_path, pairing, iat_mode):
    """obfs4 across obfs4proxy, both ends in iat-mode 0, 1 or 2."""
    both_directions_at_once("obfs4", pairing, tmp_path, BIG if iat_mode == 0 else PACED, iat_mode)


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_obfs3_both_directions_at_once(obfs4proxy_path, tmp_path, pairing):
    both_directions_at_once("obfs3", pairing, tmp_path, BIG)


@pytest.mark.slow
def test_obfs4_paced_8_mib_both_directions_at_once(obfs4proxy_path, tmp_path):
    """iat-mode 1 and 2, both pairings, 8 MiB each way: the four runs go at once (they
    mostly sleep between paced pieces), each checked by SHA-256 and timed."""
    def run(pairing, iat_mode):
        folder = tmp_path / ("%s-%d" % (pairing.replace(">", ""), iat_mode))
        folder.mkdir()
        started = time.monotonic()
        both_directions_at_once("obfs4", pairing, folder, PACED_SLOW, iat_mode)
        return time.monotonic() - started

    runs = {(pairing, iat_mode): Background(run, pairing, iat_mode)
            for pairing in PAIRINGS for iat_mode in (1, 2)}
    for (pairing, iat_mode), job in runs.items():
        seconds = job.join(timeout=600)
        print("\nobfs4 iat-mode %d, %s: 8 MiB each way at once in %.1f s (%.2f MB/s each way)"
              % (iat_mode, pairing, seconds, PACED_SLOW / MB / seconds))


# === 64 MiB each way, timed (slow) ============================================================

@pytest.mark.slow
@pytest.mark.parametrize("pairing", [OURS_TO_THEIRS, THEIRS_TO_OURS, OURS_TO_OURS, THEIRS_TO_THEIRS])
@pytest.mark.parametrize("transport", ["obfs4", "obfs3"])
def test_64_mib_each_way(obfs4proxy_path, tmp_path, transport, pairing):
    """64 MiB up, then 64 MiB down on the same connection, each direction timed alone
    and checked by SHA-256. obfs4proxy with itself is the reference for the figures."""
    up, down = os.urandom(HUGE), os.urandom(HUGE)
    with Destination(one_way_each(down, len(up))) as dest:
        with tunnel(transport, pairing, tmp_path, dest.address) as (socks, server, args):
            with socks5_connect(socks, server, timeout=IO_TIMEOUT, args=args) as sock:
                sock.settimeout(120)
                seconds = transfer_each_way(sock, dest, up, down)
    rates = HUGE / MB / seconds["up"], HUGE / MB / seconds["down"]
    RATES.append(("%s 64 MiB %s" % (transport, pairing),) + rates)
    print("\n%s 64 MiB each way, %s: up %.1f MB/s, down %.1f MB/s" % ((transport, pairing) + rates))


# === Our client with our server ===============================================================

OUR_OBFS4_VARIANTS = {
    # name: (client command line after "client", server extras, iat-mode); {cert} {server}
    "socks-args": (["--transport=obfs4", "127.0.0.1:0"], [], 0),
    "fixed-dest": (["--transport=obfs4", "--cert={cert}", "--iat-mode=0", "--dest={server}",
                    "127.0.0.1:0"], [], 0),
    "bridge-line": (["--bridge=obfs4 {server} 0123456789ABCDEF0123456789ABCDEF01234567 "
                     "cert={cert} iat-mode=0", "127.0.0.1:0"], [], 0),
    "iat-mode-1": (["--transport=obfs4", "--cert={cert}", "--iat-mode=1", "--dest={server}",
                    "127.0.0.1:0"], ["--iat-mode=1"], 1),
    "iat-mode-2": (["--bridge=Bridge obfs4 {server} cert={cert} iat-mode=2", "127.0.0.1:0"],
                   ["--iat-mode=2"], 2),
}
OUR_OBFS3_VARIANTS = {
    "socks": (["--transport=obfs3", "127.0.0.1:0"], [], 0),
    "fixed-dest": (["--transport=obfs3", "--dest={server}", "127.0.0.1:0"], [], 0),
    "bridge-line": (["--bridge=obfs3 {server}", "127.0.0.1:0"], [], 0),
}


@pytest.mark.parametrize("transport,variant", [("obfs4", v) for v in OUR_OBFS4_VARIANTS]
                         + [("obfs3", v) for v in OUR_OBFS3_VARIANTS])
def test_ours_with_ours_half_close(tmp_path, transport, variant):
    """Our client and our server, configured every way a user can: SOCKS with
    per-connection arguments, a fixed --dest with --cert/--iat-mode, a pasted bridge
    line. The application sends and half-closes; the destination echoes to EOF and
    closes; the application reads the echo to EOF."""
    client_args, server_extra, iat_mode = (OUR_OBFS4_VARIANTS if transport == "obfs4"
                                           else OUR_OBFS3_VARIANTS)[variant]
    size = 2 * MiB if iat_mode == 0 else PACED
    payload = os.urandom(size)
    with Destination(hashing_echo) as dest:
        server = our_server(transport, tmp_path / "state", dest.address, *server_extra)
        try:
            if transport == "obfs4":
                assert server.iat_mode == iat_mode
            values = {"cert": server.cert, "server": fmt(server.address)}
            client = Program("client", *[arg.format(**values) for arg in client_args])
        except BaseException:
            server.stop()
            raise
        with server, client:
            fixed = "socks" not in variant
            if fixed:
                sock = socket.create_connection(client.address, timeout=IO_TIMEOUT)
            else:
                args = "cert=%s;iat-mode=0" % server.cert if transport == "obfs4" else None
                sock = socks5_connect(client.address, server.address, timeout=IO_TIMEOUT, args=args)
            with sock:
                sock.settimeout(60)
                sender = Background(send_and_shut, sock, payload)
                got = read_hashing(sock)      # to EOF: the destination's close came through
                sender.join()
            assert dest.result() == (len(payload), digest(payload)), "the destination got other bytes"
            assert got == (len(payload), digest(payload)), "the echo differs"


# === State directories: obfs4proxy's and ours are the same thing ==============================

STATE_FILE, BRIDGE_FILE = "obfs4_state.json", "obfs4_bridgeline.txt"


def mode(path):
    return path.stat().st_mode & 0o777


def bridge_line_cert(state_dir):
    text = (state_dir / BRIDGE_FILE).read_text()
    return re.search(r"^Bridge obfs4 <IP ADDRESS>:<PORT> <FINGERPRINT> cert=(\S+) iat-mode=(\d)$",
                     text, re.MULTILINE).groups()


def test_obfs4proxy_state_dir_serves_as_ours(obfs4proxy_path, echo, tmp_path):
    """obfs4proxy creates a state directory; our server started on it has the same cert
    (and leaves the file as obfs4proxy wrote it); obfs4proxy's client connects to us."""
    state = tmp_path / "shared-state"
    theirs = Obfs4proxy("server", tmp_path, orport=echo.address, transport="obfs4",
                        state_location=state)
    their_cert = theirs.cert
    stop_cleanly(theirs)
    written = (state / STATE_FILE).read_bytes()
    assert mode(state) == 0o700 and mode(state / STATE_FILE) == mode(state / BRIDGE_FILE) == 0o600
    assert bridge_line_cert(state) == (their_cert, "0")

    with our_server("obfs4", state, echo.address) as ours, \
            Obfs4proxy("client", tmp_path, transport="obfs4") as client:
        assert ours.cert == their_cert
        assert (state / STATE_FILE).read_bytes() == written
        assert bridge_line_cert(state) == (their_cert, "0")
        payload = os.urandom(300_000)
        with socks5_connect(client.address, ours.address, timeout=IO_TIMEOUT,
                            args="cert=%s;iat-mode=0" % their_cert) as sock:
            sender = Background(sock.sendall, payload)
            assert digest(recv_exact(sock, len(payload))) == digest(payload)
            sender.join()
        assert client.stop() == 0


def test_our_state_dir_serves_as_obfs4proxys(obfs4proxy_path, echo, tmp_path):
    """Our server creates a state directory (and its parents, 0700; files 0600);
    obfs4proxy started on it has the same cert, and our client connects to it."""
    state = tmp_path / "new" / "state"
    with our_server("obfs4", state, echo.address) as ours:
        our_cert = ours.cert
    for directory in (tmp_path / "new", state):
        assert mode(directory) == 0o700, directory
    assert mode(state / STATE_FILE) == mode(state / BRIDGE_FILE) == 0o600
    assert bridge_line_cert(state) == (our_cert, "0")

    theirs = Obfs4proxy("server", tmp_path, orport=echo.address, transport="obfs4",
                        state_location=state)
    try:
        assert theirs.cert == our_cert
        assert theirs.args["obfs4"]["iat-mode"] == "0"
        with Program("client", "--bridge=obfs4 %s cert=%s iat-mode=0" % (fmt(theirs.address), our_cert),
                   "127.0.0.1:0") as client:
            payload = os.urandom(300_000)
            with socket.create_connection(client.address, timeout=IO_TIMEOUT) as sock:
                sender = Background(sock.sendall, payload)
                assert digest(recv_exact(sock, len(payload))) == digest(payload)
                sender.join()
    finally:
        stop_cleanly(theirs)


# === Probes: an obfs4 server answers nobody who lacks the cert ================================

def client_handshake(cert):
    """A fresh obfs4 client (our sans-IO module) for ``cert`` and its handshake bytes."""
    client = obfs4.Obfs4(True, obfs4.Obfs4.client_config({"cert": cert, "iat-mode": "0"}))
    return client, client.start()


def open_session(address, client, handshake):
    """A socket on which ``handshake`` (``client``'s) has been answered: ``client`` is open."""
    sock = socket.create_connection(address, timeout=IO_TIMEOUT)
    try:
        sock.sendall(handshake)
        while not client.is_open:
            data = sock.recv(65536)
            assert data, "the server closed during a valid handshake"
            assert client.receive(data) == b""
    except BaseException:
        sock.close()
        raise
    return sock


def valid_session(address, client, handshake):
    """Run ``handshake`` to the end on a new connection and echo one message through
    it: after this the server has dialled its destination."""
    with open_session(address, client, handshake) as sock:
        sock.sendall(client.send(b"ping"))
        plaintext = b""
        while len(plaintext) < 4:
            data = sock.recv(65536)
            assert data, "the server closed after a valid handshake"
            plaintext += client.receive(data)
        assert plaintext == b"ping"


def probes(servers):
    """{server: {probe name: bytes}}. Each server first gets one valid session; its
    handshake, sent again, is that server's "replayed handshake"."""
    kinds = {}
    for server, address in servers.items():
        client, handshake = client_handshake(PINNED_CERT)
        valid_session(address, client, handshake)
        _, wrong = client_handshake(OTHER_CERT)
        kinds[server] = {"silence": b"", "100 random bytes": os.urandom(100),
                         "8192 random bytes": os.urandom(8192), "replayed handshake": handshake,
                         "wrong cert": wrong}
    return kinds


def probe(address, data, quiet=None):
    """Connect, send ``data``. With ``quiet``: insist on ``quiet`` seconds of silence,
    then half-close. Returns (seconds from connect to the server's close, "FIN" or
    "RST", bytes the server sent)."""
    with socket.create_connection(address, timeout=IO_TIMEOUT) as sock:
        started = time.monotonic()
        sock.sendall(data)
        received = b""
        if quiet is not None:
            sock.settimeout(quiet)
            try:
                received = sock.recv(65536)
                return time.monotonic() - started, "FIN" if not received else "data", received
            except socket.timeout:
                pass
            sock.shutdown(socket.SHUT_WR)
            started = time.monotonic()
            sock.settimeout(EOF_PROMPTLY)
        else:
            sock.settimeout(PINNED_CLOSE_AFTER + 15)
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    return time.monotonic() - started, "FIN", received
                received += chunk
        except ConnectionResetError:
            return time.monotonic() - started, "RST", received


def run_probes(servers, kinds, quiet):
    """Every probe against every server at once: {(server, probe): probe result}."""
    results = {}

    def one(server, name, data):
        results[server, name] = probe(servers[server], data, quiet)

    workers = [Background(one, server, name, data)
               for server in servers for name, data in kinds[server].items()]
    for worker in workers:
        worker.join(timeout=PINNED_CLOSE_AFTER + 30)
    return results


@contextmanager
def probed_servers(tmp_path, with_obfs4proxy):
    """Our pinned obfs4 server and (optionally) obfs4proxy's, each in front of its own
    counting destination. Yields ({name: address}, {name: destination})."""
    dests = {"ours": Destination(lambda conn, report: echo_to_eof(conn))}
    peers = []
    try:
        ours = our_server("obfs4", tmp_path / "state", dests["ours"].address,
                          "--transport-options=" + pinned_options(0, tor=False))
        peers.append(ours)
        addresses = {"ours": ours.address}
        if with_obfs4proxy:
            dests["obfs4proxy"] = Destination(lambda conn, report: echo_to_eof(conn))
            theirs = Obfs4proxy("server", tmp_path, orport=dests["obfs4proxy"].address,
                                transport="obfs4", options=pinned_options(0))
            peers.append(theirs)
            addresses["obfs4proxy"] = theirs.address
            assert theirs.cert == ours.cert == PINNED_CERT
        yield addresses, dests
    finally:
        for peer in peers:
            stop_cleanly(peer)
        for dest in dests.values():
            dest.close()


def test_probes_get_silence_never_reach_dest_and_eof_closes_at_once(obfs4proxy_path, tmp_path):
    """Silence, garbage, a replayed handshake, a wrong cert: our server (and
    obfs4proxy's, side by side) sends nothing for 2 s, and when the prober half-closes
    it closes (FIN) at once, not at accept + 31 s. Our server never dials --dest for
    any of them: its destination saw exactly the one valid session."""
    with probed_servers(tmp_path, with_obfs4proxy=True) as (addresses, dests):
        results = run_probes(addresses, probes(addresses), quiet=PROBE_QUIET)
        assert len(results) == 10
        for (server, kind), (seconds, end, received) in sorted(results.items()):
            assert received == b"", "%s server answered %s: %r" % (server, kind, received[:32])
            assert end == "FIN", "%s server ended %s with %s" % (server, kind, end)
            assert seconds < EOF_PROMPTLY, "%s server lingered %.1f s after %s's EOF" % (
                server, seconds, kind)
        assert dests["ours"].accepted == 1, "our server dialled --dest for a probe"


@pytest.mark.slow
def test_probes_side_by_side_with_obfs4proxy(obfs4proxy_path, tmp_path):
    """The same probes, left alone: both servers send nothing and close with a FIN at
    accept + 30 s + close_delay (1 s for drbg-seed 07 x 24), within a second of each
    other; our server never dials --dest for a probe."""
    with probed_servers(tmp_path, with_obfs4proxy=True) as (addresses, dests):
        results = run_probes(addresses, probes(addresses), quiet=None)
        assert len(results) == 10
        for (server, kind), (seconds, end, received) in sorted(results.items()):
            assert received == b"", "%s server answered %s: %r" % (server, kind, received[:32])
            assert end == "FIN", "%s server ended %s with %s" % (server, kind, end)
            assert abs(seconds - PINNED_CLOSE_AFTER) <= 1.0, "%s server closed %s after %.1f s" % (
                server, kind, seconds)
        for kind in sorted({kind for _, kind in results}):
            ours, theirs = results["ours", kind][0], results["obfs4proxy", kind][0]
            print("\nprobe %-20s our server closed after %.2f s, obfs4proxy after %.2f s"
                  % (kind, ours, theirs))
            assert abs(ours - theirs) <= 1.0, kind
        assert dests["ours"].accepted == 1, "our server dialled --dest for a probe"


@pytest.mark.parametrize("server", ["ours", "obfs4proxy"])
def test_tampered_frame_closes_at_once_with_fin(obfs4proxy_path, tmp_path, server):
    """A valid session, then a genuine burst whose first frame has a byte of its tag
    flipped (the tag fails): the server sends nothing more and closes at once, with
    a FIN. The first frame: a burst is the data frame and a padding frame after it,
    and flipping the burst's last byte broke only the padding, so the payload went
    through to the echo, and came back when the echo beat the close (1 run in 8).

    The client is open once the server's handshake has arrived; what the server
    sent with it (its first frames: padding, the PRNG seed) may still be on the
    way when the bad frame goes, so whatever arrives is fed to the client, and
    must be those frames: no payload, no error."""
    with probed_servers(tmp_path, with_obfs4proxy=True) as (addresses, dests):
        client, handshake = client_handshake(PINNED_CERT)
        with open_session(addresses[server], client, handshake) as sock:
            frame = bytearray(client.send(b"x" * 100))
            frame[2] ^= 1              # after the 2-byte length: the first frame's tag
            sock.sendall(bytes(frame))
            sock.settimeout(EOF_PROMPTLY)
            try:
                received = recv_all(sock)
            except ConnectionResetError:
                pytest.fail("%s server reset the connection (RST), obfs4proxy closes with a FIN"
                            % server)
            assert client.receive(received) == b"", "%s server answered the bad frame" % server


# === A wrong cert on our client ===============================================================

def test_malformed_cert_on_our_client_is_a_socks_general_failure(tmp_path, echo):
    """cert=AAAA (not 52 bytes): our SOCKS client answers 05 01 at once (as obfs4proxy's
    client does, vectors: client_socks_args) and logs one line, no traceback."""
    with Program("client", "--transport=obfs4", "127.0.0.1:0") as client:
        for args in ("cert=AAAA;iat-mode=0", "cert=%s" % PINNED_CERT):   # bad cert; no iat-mode
            with pytest.raises(SocksReplyError) as info:
                socks5_connect(client.address, ("127.0.0.1", 9), timeout=IO_TIMEOUT, args=args)
            assert info.value.code == 0x01, args
    assert not [line for line in client.log.lines if "Traceback" in line], client.log.lines


def test_wrong_cert_on_our_client_fails_the_socks_request(tmp_path, echo):
    """A well-formed cert of another bridge: the server stays silent (it cannot tell us
    from a prober), so our client gives up at its handshake timeout and the application
    gets a SOCKS failure reply, never a success; one log line, no traceback."""
    with our_server("obfs4", tmp_path / "state", echo.address) as server, \
            Program("client", "--transport=obfs4", "--handshake-timeout=2", "127.0.0.1:0",
                  "--log-min-severity=info") as client:
        with pytest.raises(SocksReplyError) as info:
            socks5_connect(client.address, server.address, timeout=IO_TIMEOUT,
                           args="cert=%s;iat-mode=0" % OTHER_CERT)
        assert info.value.code == 0x06, "expected TTL expired (the handshake timed out)"
        client.log.wait_for(r"obfs4 handshake with the bridge .* failed")
        # The right cert still works through the same client.
        with socks5_connect(client.address, server.address, timeout=IO_TIMEOUT,
                            args="cert=%s;iat-mode=0" % server.cert) as sock:
            sock.sendall(b"ok")
            assert recv_exact(sock, 2) == b"ok"
    assert not [line for line in client.log.lines if "Traceback" in line], client.log.lines
