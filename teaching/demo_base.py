"""demo_base.py: the demo's machinery, shared by its walks (demo.py says what the
demo is): one connection run in this process with each side's wire recorded
(``run_exchange``: an echo service, a server and a SOCKS client on 127.0.0.1), the
demo's seeded random source (``seeded``, ``reseed``), and the helpers every walk
prints and checks with (``Walk``)."""

import random
import socket
import tempfile
import threading
import time
from pathlib import Path

import listener
import obfs2
import obfs3
import obfs4
import outbound
import process_setup
import proxy
import transports
import webtunnel
from outbound import format_address
from teaching import present

MESSAGE = (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
           b" <- a TLS ClientHello starts like this; a DPI box matches it. "
           b"Hello from the other side of the tunnel!")
SIGNATURES = [("TLS record header 16 03 01", b"\x16\x03\x01"), ('"ClientHello"', b"ClientHello"),
              ('"the tunnel"', b"the tunnel")]
SHOW_FRAMES = 6           # frames listed per direction


# --- Running one connection ------------------------------------------------------------

class Wire:
    """One side of the demo connection: its transport, and what it put on the wire,
    piece by piece (each start(), data_to_send(), send() result or paced piece), and when
    (``times``: the demo's perf_counter as each piece was made; a paced piece at the time
    its pauses put it on the wire)."""

    def __init__(self, transport):
        self.transport = transport
        self.pieces, self.delays, self.times = [], [], []
        self.received = bytearray()
        self.secret = None        # obfs4: the ephemeral private key, kept by the demo only

    def sent_piece(self, data):
        if data:
            self.pieces.append(bytes(data))
            self.times.append(time.perf_counter())

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
        delays = [delay for piece, delay in pieces if piece]     # each piece waits for the ones before
        times, waited = self.wire.times, 0.0
        for index, delay in enumerate(delays):
            times[len(times) - len(delays) + index] += waited
            waited += delay
        return pieces


class Tap:
    """Keeps each new transport's wire bytes in memory (the same wrapper as
    --record-dir): ``Settings(wrappers=(Tap(),))``; ``taps`` lists a ``Wire`` per transport.
    With ``rng`` (a seeded ``random.Random``), each new transport draws from it (``reseed``)."""

    def __init__(self, rng=None):
        self.taps = []
        self.rng = rng

    def __call__(self, transport):
        wire = Wire(transport)
        self.taps.append(wire)
        inner = transports.innermost(transport)    # under --record-dir's recorder, if any
        if self.rng is not None:
            reseed(inner, self.rng)
        if isinstance(inner, obfs4.Obfs4):
            keep_secret(inner.config, wire)
        return _Recorder(transport, wire)


# --- The seeded random source ----------------------------------------------------------
#
# A real tunnel draws from the CSPRNG. The demo can draw from a seed instead, so that a
# run is repeated by its seed: the tests run hundreds of seeds, and a walk whose checks
# hold only for most draws fails on a seed that can be run again. Each role (the
# bridge's state, the server, the client, the stage) has a stream of its own, so the
# order in which the threads draw does not change what each draws. Python's ssl draws
# its own randomness: a webtunnel run repeats its path and its record cuts, not its TLS
# bytes.

def seeded(seed, role):
    """The ``random.Random`` of ``role`` for ``seed``, or None (the CSPRNG) without a seed."""
    return None if seed is None else random.Random("obfsproxy demo %s %s" % (seed, role))


def bytes_from(rng):
    """``randbytes(n)`` drawn from ``rng`` (``random.Random.randbytes`` is Python 3.9+)."""
    return lambda n: rng.getrandbits(8 * n).to_bytes(n, "little") if n else b""


def reseed(transport, rng):
    """Make a new transport, before its ``start()``, draw from ``rng`` what it would draw
    from the CSPRNG: obfs4's and obfs3's through their configs' injectable sources;
    obfs2 draws its SEED and PADLEN as it is made, so they are drawn again here;
    webtunnel starts its record cutter (its Shaper) as it is made, so it is started
    again here, on a stream split off ``rng``. Other transports keep their own
    randomness (webtunnel's TLS: Python's ssl draws its own)."""
    randbytes = bytes_from(rng)
    if isinstance(transport, obfs4.Obfs4):
        config = transport.config
        config.randbytes, config.randbelow, config.pad_length = randbytes, rng.randrange, rng.randint
        config.sample = lambda dist: dist.sample(rng.randrange, rng.random)
    elif isinstance(transport, obfs3.Obfs3):
        transport.config = transport.config.replace(randbytes=randbytes,
                                                    padlen=lambda: rng.randint(0, obfs3.MAX_PADLEN))
        transport.padlen1, transport.padlen2 = transport.config.padlen(), transport.config.padlen()
    elif isinstance(transport, obfs2.Obfs2):
        transport.seed, transport._randbytes = randbytes(obfs2.SEED_LENGTH), randbytes
        transport.padlen = rng.randint(0, obfs2.MAX_PADDING)
    elif isinstance(transport, webtunnel.WebTunnel) and transport._shaper is not None:
        transport._shaper = webtunnel.Shaper(transport.config.shaping, split(rng))


def split(rng):
    """A ``random.Random`` of its own, seeded from ``rng``: its draws, made whenever
    (webtunnel's cuts happen as the relay sends), do not move ``rng``'s."""
    return random.Random(rng.getrandbits(128))


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
    echo = process_setup.listen(("127.0.0.1", 0))

    def serve_one(conn):
        with conn:
            try:
                while True:
                    data = conn.recv(65536)
                    if not data:
                        return
                    conn.sendall(data)
            except OSError:     # reset by the stop: a meek session outlives its client's tunnel
                return

    def accept_loop():
        while True:
            try:
                conn, _ = echo.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(conn,), daemon=True).start()

    threading.Thread(target=accept_loop, daemon=True).start()
    return echo.getsockname()[:2], echo


class Exchange:
    """What one demo connection left behind: the bytes echoed, each side's ``Wire``,
    the ``addresses`` (echo, server, SOCKS client), the ``seconds`` it took, the
    server's bridge-line arguments (``announce``; obfs4: cert, iat-mode) and the
    ``stage`` set up around the connection (webtunnel: its certificate)."""

    def __init__(self, echoed, client, server, addresses, seconds, announce, stage):
        self.echoed, self.client, self.server = echoed, client, server
        self.addresses, self.seconds, self.announce, self.stage = addresses, seconds, announce, stage


class Stage:
    """What a transport needs around the demo connection, beyond its options: by
    default nothing. ``server_options`` go to ``server_config``; ``client_side``
    gives the client's settings and the SOCKS target, once the server listens;
    ``finish`` reads what the connection left behind (webtunnel: the key log)."""

    def __init__(self, options, directory, rng=None):
        self.server_options = dict(options)
        self.target = None
        self.rng = rng            # a seeded random.Random for the stage's own choices, or None

    def server_config(self, cls, directory, rng=None):
        """The server's config and bridge-line arguments. ``rng``: where the bytes of a
        new long-term identity would come from (a stage whose transport makes one uses
        it), None for the CSPRNG."""
        return cls.server_config(self.server_options, directory)

    def client_side(self, settings, cls, server_config, announce, server_address):
        options = dict(self.server_options, **announce)   # the bridge line's arguments
        self.target = server_address
        return settings.replace(options=options), server_address

    def finish(self):
        pass


def run_exchange(name, options, settings, stage_class=None, seed=None):
    """Echo, server and client on 127.0.0.1; send MESSAGE through them. ``stage_class``:
    what the transport needs around the connection (default ``Stage``: nothing);
    ``seed``: draw the random choices from it (``seeded``), None for the CSPRNG."""
    cls = transports.transport_class(name)
    state = tempfile.TemporaryDirectory(prefix="obfsproxy-demo-")   # obfs4's keys, the demo's certificate
    try:
        stage = (stage_class or Stage)(options, Path(state.name), seeded(seed, "stage"))
        server_config, announce = stage.server_config(cls, Path(state.name), seeded(seed, "state"))
        echo_address, echo_listener = echo_service()
        server_tap, client_tap = Tap(seeded(seed, "server")), Tap(seeded(seed, "client"))
        server_settings = settings.replace(transport=name, config=server_config,
                                            dest=echo_address, wrappers=settings.wrappers + (server_tap,))
        tunnels = listener.Listener(pool_size=0)   # every key made on the spot, and seen (keep_secret)
        try:
            server_address = tunnels.listen(("127.0.0.1", 0), proxy.handle_server, server_settings)
            client_settings, target = stage.client_side(
                settings.replace(transport=name, wrappers=settings.wrappers + (client_tap,)),
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
        # What the pictures draw (--html), as the walk printed it: the fields of each side's
        # stream, [(offset, length, name)], filed under ``side`` by ``field`` and ``record``;
        # the fully-encrypted test on the first write; webtunnel's opened records.
        self.side, self.fields = None, {"client": [], "server": []}
        self.first = self.records = None

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
        self.record(offset, length, name)

    def record(self, offset, length, name, side=None):
        """File a field of ``side``'s stream (default: the side set last) for the pictures;
        a header row (offset not a number) is not a field."""
        side = side or self.side
        if side in self.fields and isinstance(offset, int) and isinstance(length, int):
            self.fields[side].append((offset, length, name))


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


def application_bytes(walk, c_data, s_data, how_c, how_s):
    """The message in clear, and as each side put it on the wire."""
    walk.title("The first application bytes")
    print("  the application sent %d bytes, in clear:" % len(MESSAGE))
    walk.dump(MESSAGE, "clear")
    print("  the client sent them as %s:" % how_c)
    walk.dump(c_data)
    print("  the echo came back; the server sent it as %s:" % how_s)
    walk.dump(s_data)
