"""relay.py in this process, on real sockets: the Relay driven by a Pump.

Each test wires the relay between two socket pairs and plays both outer ends
itself::

    app <-> upstream  ==relay(transport)==  downstream <-> peer
        (cleartext)                              (the transport's bytes)

socket.socketpair() where any stream will do, connected TCP pairs on
127.0.0.1 where TCP matters (resets). The transports are toys defined here,
each showing one thing the relay must handle: ``Framed`` changes lengths and
has no in-place path, ``Paced`` asks for its pieces to be spaced out.
Synchronisation is on bytes and EOFs arriving, not on sleeps; the one timing
assertion is a lower bound.
"""

import os
import selectors
import socket
import struct
import sys
import threading
import time

import pytest
from support import IN_CI, recv_all, recv_exact

import outbound
import relay as relay_
import transports

WAIT = 5.0   # seconds any one expected event may take before the test fails


# --- Toy transports ---------------------------------------------------------------

class FramedError(Exception):
    pass


def frame(data):
    """LEN(2, big-endian) | body xor 0x5A, in frames of at most 65535 bytes."""
    return b"".join(struct.pack(">H", len(data[i:i + 65535])) + bytes(b ^ 0x5A for b in data[i:i + 65535])
                    for i in range(0, len(data), 65535))


def unframe(wire):
    """The peer's decoder, written apart from Framed.receive."""
    out, pos = [], 0
    while pos < len(wire):
        (length,) = struct.unpack(">H", wire[pos:pos + 2])
        out.append(bytes(b ^ 0x5A for b in wire[pos + 2:pos + 2 + length]))
        pos += 2 + length
    assert pos == len(wire), "a partial frame at the end"
    return b"".join(out)


class Framed:
    """A length-changing transport: send() frames; receive() buffers across any
    split and returns the bodies of the complete frames. A frame of length 0
    is a protocol error. No in-place methods."""

    name = "framed"
    ProtocolError = FramedError
    expensive = False
    is_open = True
    initiator = True

    def __init__(self):
        self._buffer = bytearray()

    def start(self):
        return b""

    def data_to_send(self):
        return b""

    def send(self, data):
        return frame(data)

    def receive(self, data):
        self._buffer += data
        out = []
        while len(self._buffer) >= 2:
            (length,) = struct.unpack(">H", self._buffer[:2])
            if length == 0:
                raise self.bad_frame(out)
            if len(self._buffer) < 2 + length:
                break
            out.append(bytes(b ^ 0x5A for b in self._buffer[2:2 + length]))
            del self._buffer[:2 + length]
        return b"".join(out)

    def bad_frame(self, decoded):
        """The error for an empty frame; ``decoded``: the bodies before it in this read."""
        return FramedError("empty frame")


class Paced(transports.Dummy):
    """Bytes unchanged, but each chunk cut into PIECES pieces with DELAY seconds
    to wait after each (the shape of obfs4's iat-mode)."""

    paced = True
    PIECES = 4
    DELAY = 0.05

    def __init__(self):
        transports.Dummy.__init__(self, True)
        self.calls = []

    def send_paced(self, data):
        self.calls.append(("send_paced", data))
        step = -(-len(data) // self.PIECES)
        return [(data[i:i + step], self.DELAY) for i in range(0, len(data), step)]

    def send(self, data):
        self.calls.append(("send", data))
        step = -(-len(data) // self.PIECES)
        return b"".join(data[i:i + step] for i in range(0, len(data), step))


def dummy():
    return transports.Dummy(True)


class CountingPool(relay_.BufferPool):
    """A BufferPool that counts its loans."""

    def __init__(self):
        relay_.BufferPool.__init__(self)
        self.lent = self.returned = 0

    def lend(self):
        self.lent += 1
        return relay_.BufferPool.lend(self)

    def give_back(self, buffer):
        self.returned += 1
        relay_.BufferPool.give_back(self, buffer)


# --- Harness ----------------------------------------------------------------------

class Relay:
    """A relay.Relay(upstream, downstream, transport) run by a Pump of its own."""

    def __init__(self, upstream, downstream, transport, **initial):
        self.pool = CountingPool()
        self.pump = relay_.Pump("test-pump")
        self.pump.buffers = self.pool
        self.relay = relay_.Relay(upstream, downstream, transport, **initial)
        self.error = None
        self.ended = threading.Event()
        self.pump.add(self.relay, self._end)

    def _end(self, error):
        self.error = error
        self.ended.set()

    def result(self):
        """What the relay ended with (None: a clean end); fails if it does not end."""
        assert self.ended.wait(WAIT), "the relay did not end"
        assert self.pump.stop(timeout=WAIT), "the pump did not stop"
        return self.error


@pytest.fixture
def ends():
    """ends(tcp=False) -> (app, upstream, downstream, peer); all closed afterwards."""
    made = []

    def make(tcp=False):
        app, upstream = connected_pair() if tcp else socket.socketpair()
        downstream, peer = connected_pair() if tcp else socket.socketpair()
        for sock in (app, peer):
            sock.settimeout(WAIT)
        made.extend((app, upstream, downstream, peer))
        return app, upstream, downstream, peer
    yield make
    for sock in made:
        sock.close()


def in_background(function, *args):
    thread = threading.Thread(target=function, args=args, daemon=True)
    thread.start()
    return thread


def send_then_eof(sock, data):
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def recv_plaintext(sock, n, decoder):
    """Read until ``decoder.receive`` has given n bytes (however they were framed)."""
    out = b""
    while len(out) < n:
        chunk = sock.recv(65536)
        assert chunk, "EOF after %d of %d bytes" % (len(out), n)
        out += decoder.receive(chunk)
    return out


def linger(sock):
    return struct.unpack("ii", sock.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8))


def reset(sock):
    """Close with RST instead of FIN."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


# --- Bytes both ways ------------------------------------------------------------------

def test_dummy_carries_every_byte_both_ways(ends):
    app, upstream, downstream, peer = ends()
    up_data, down_data = os.urandom(700000), os.urandom(600000)   # several chunks each
    relay = Relay(upstream, downstream, dummy())
    writers = [in_background(send_then_eof, app, up_data), in_background(send_then_eof, peer, down_data)]
    assert recv_all(peer) == up_data
    assert recv_all(app) == down_data
    for writer in writers:
        writer.join(WAIT)
    assert relay.result() is None
    up, down = relay.relay.up, relay.relay.down
    assert (up.count, down.count) == (len(up_data), len(down_data))


def test_a_length_changing_transport_carries_every_byte_both_ways(ends):
    app, upstream, downstream, peer = ends()
    up_data, down_data = os.urandom(300000), os.urandom(200000)
    wire = frame(down_data[:1]) + frame(down_data[1:70000]) + frame(down_data[70000:])
    cuts = [0, 1, 2, 3, 5000, 65537, 65539, 140000, len(wire)]   # frames cut anywhere
    relay = Relay(upstream, downstream, Framed())

    def write_down():
        for a, b in zip(cuts, cuts[1:]):
            peer.sendall(wire[a:b])
        peer.shutdown(socket.SHUT_WR)

    writers = [in_background(send_then_eof, app, up_data), in_background(write_down)]
    assert recv_all(app) == down_data
    assert unframe(recv_all(peer)) == up_data
    for writer in writers:
        writer.join(WAIT)
    assert relay.result() is None


def test_paced_pieces_go_in_order_and_wait_their_delays(ends):
    app, upstream, downstream, peer = ends()
    transport = Paced()
    relay = Relay(upstream, downstream, transport)
    data = bytes(range(256)) * 40
    began = time.monotonic()
    send_then_eof(app, data)
    got = recv_all(peer)
    elapsed = time.monotonic() - began
    assert got == data                         # every piece, in order, then the EOF
    assert transport.calls == [("send_paced", chunk) for _, chunk in transport.calls]
    assert b"".join(chunk for _, chunk in transport.calls) == data
    peer.shutdown(socket.SHUT_WR)
    assert relay.result() is None
    # However the relay chunked the data, each piece after the first waited
    # for the delay of the one before it.
    least = (Paced.PIECES - 1) * Paced.DELAY
    assert elapsed >= least, "paced pieces went early: %.3f s < %.3f s" % (elapsed, least)


class PacedAtFirst(Paced):
    """Paced for its first chunk only, then in place (webtunnel's bridge behind a front
    paces its first bytes only)."""

    DELAY = 0.001

    @property
    def paced(self):
        return not any(call[0] == "send_paced" for call in self.calls)

    def send_in_place(self, buffer):
        self.calls.append(("in_place", bytes(buffer)))
        return True


def test_a_transport_that_stops_pacing_goes_back_to_sending_in_place(ends):
    app, upstream, downstream, peer = ends()
    transport = PacedAtFirst()
    relay = Relay(upstream, downstream, transport)
    first, rest = b"first chunk", bytes(range(256)) * 40
    app.sendall(first)
    assert recv_exact(peer, len(first)) == first
    send_then_eof(app, rest)
    assert recv_all(peer) == rest
    peer.shutdown(socket.SHUT_WR)
    assert relay.result() is None
    assert transport.calls[0] == ("send_paced", first)
    assert transport.calls[1:] and all(kind == "in_place" for kind, _ in transport.calls[1:])
    assert b"".join(data for _, data in transport.calls[1:]) == rest


@pytest.mark.parametrize("make_transport", [dummy, Framed, Paced], ids=["dummy", "framed", "paced"])
def test_initial_bytes_go_first_and_in_order(ends, make_transport):
    """to_upstream (plaintext glued to the peer's handshake) reaches the app and
    to_downstream (data pipelined before the tunnel was open) the peer before
    anything the relay reads, even bytes already waiting when it starts."""
    app, upstream, downstream, peer = ends()
    transport = make_transport()
    app.sendall(b" and what followed it")
    peer.sendall(transport.send(b" and more from the peer"))
    calls = getattr(transport, "calls", [])
    del calls[:]
    relay = Relay(upstream, downstream, transport, to_upstream=b"glued to the handshake",
                  to_downstream=b"pipelined request")
    app.shutdown(socket.SHUT_WR)
    peer.shutdown(socket.SHUT_WR)
    up, down = recv_all(peer), recv_all(app)
    assert relay.result() is None
    assert (unframe(up) if make_transport is Framed else up) == b"pipelined request and what followed it"
    assert down == b"glued to the handshake and more from the peer"
    if make_transport is Paced:
        assert calls[0] == ("send_paced", b"pipelined request")   # paced too, and first


# --- Ends of streams ----------------------------------------------------------------

@pytest.mark.parametrize("make_transport", [dummy, Framed], ids=["dummy", "framed"])
@pytest.mark.parametrize("first", ["app", "peer"])
def test_a_half_close_crosses_and_the_other_direction_keeps_flowing(ends, make_transport, first):
    app, upstream, downstream, peer = ends()
    encode, decode = (frame, unframe) if make_transport is Framed else (bytes, bytes)
    relay = Relay(upstream, downstream, make_transport())
    if first == "app":
        send_then_eof(app, b"request")
        assert decode(recv_all(peer)) == b"request"      # the data, then the EOF as a FIN
        for part in (b"response, ", b"still flowing"):
            peer.sendall(encode(part))
        assert recv_exact(app, 23) == b"response, still flowing"
        peer.shutdown(socket.SHUT_WR)
        assert app.recv(1) == b""
    else:
        send_then_eof(peer, encode(b"banner"))
        assert recv_all(app) == b"banner"
        for part in (b"reply after ", b"the peer's EOF"):
            app.sendall(part)
        assert recv_plaintext(peer, 26, make_transport()) == b"reply after the peer's EOF"
        app.shutdown(socket.SHUT_WR)
        assert peer.recv(1) == b""
    assert relay.result() is None
    assert relay.pool.lent == relay.pool.returned


def test_a_reader_that_does_not_read_stops_the_relay_reading(ends):
    app, upstream, downstream, peer = ends()
    for sock in (app, upstream, downstream, peer):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)
    kernel = sum(sock.getsockopt(socket.SOL_SOCKET, option)
                 for sock in (app, upstream, downstream, peer)
                 for option in (socket.SO_SNDBUF, socket.SO_RCVBUF))
    bound = 2 * kernel + relay_.MAX_CHUNK    # what the kernel buffers, and one chunk in the relay
    data = os.urandom(4 * bound)
    relay = Relay(upstream, downstream, dummy())
    # The peer reads nothing. Write until the app's socket stays full.
    app.setblocking(False)
    written = 0
    while written < len(data):
        if not outbound.ready(app, True, 0.3):
            break
        try:
            written += app.send(data[written:written + 65536])
        except BlockingIOError:
            pass
    assert written < bound, "the relay took %d bytes that nobody reads (bound %d)" % (written, bound)
    up = relay.relay.up
    assert up.count <= written and len(up.pending) <= relay_.MAX_CHUNK
    assert relay.pool.lent - relay.pool.returned <= 1, "the relay holds more than one chunk"
    # The peer starts reading: everything arrives, nothing lost or repeated.
    app.settimeout(WAIT)
    writer = in_background(send_then_eof, app, data[written:])
    assert recv_all(peer) == data
    writer.join(WAIT)
    peer.shutdown(socket.SHUT_WR)
    assert relay.result() is None


@pytest.mark.parametrize("who", ["app", "peer"])
def test_a_reset_on_either_side_fails_the_relay_abortively(ends, who):
    app, upstream, downstream, peer = ends(tcp=True)
    relay = Relay(upstream, downstream, dummy())
    app.sendall(b"ping")
    assert recv_exact(peer, 4) == b"ping"          # the relay is running
    gone, other = (app, peer) if who == "app" else (peer, app)
    reset(gone)
    error = relay.result()
    assert isinstance(error, OSError), "the relay ended with %r" % error
    # Both hops are left to end with RST when the caller closes them.
    assert linger(upstream) == linger(downstream) == (1, 0)
    upstream.close()
    downstream.close()
    with pytest.raises(ConnectionResetError):
        other.recv(1)


def test_a_protocol_error_mid_stream_ends_the_relay_with_it(ends):
    app, upstream, downstream, peer = ends()
    relay = Relay(upstream, downstream, Framed())
    peer.sendall(frame(b"good data"))
    assert recv_exact(app, 9) == b"good data"
    peer.sendall(b"\0\0 not a frame")
    assert isinstance(relay.result(), FramedError)


@pytest.mark.parametrize("make_transport", [dummy, Framed], ids=["in-place", "copying"])
def test_every_lent_buffer_goes_back_to_the_pool(ends, make_transport):
    app, upstream, downstream, peer = ends()
    relay = Relay(upstream, downstream, make_transport())
    encode = frame if make_transport is Framed else bytes
    writers = [in_background(send_then_eof, app, os.urandom(3 * relay_.CHUNK)),
               in_background(send_then_eof, peer, encode(os.urandom(100000)))]
    recv_all(peer)
    recv_all(app)
    for writer in writers:
        writer.join(WAIT)
    assert relay.result() is None
    pool = relay.pool
    assert pool.lent >= 4 and pool.lent == pool.returned
    assert 1 <= len(pool._buffers) <= relay_.SPARE_BUFFERS


@pytest.mark.parametrize("failure", ["reset", "protocol-error"])
def test_a_failed_relay_gives_its_buffers_back_too(ends, failure):
    app, upstream, downstream, peer = ends(tcp=True)
    relay = Relay(upstream, downstream, Framed())
    peer.sendall(frame(b"ok"))
    assert recv_exact(app, 2) == b"ok"
    if failure == "reset":
        reset(peer)
    else:
        peer.sendall(b"\0\0")
    assert relay.result() is not None
    assert relay.pool.lent == relay.pool.returned


# --- What the contract lets a transport ask of the relay ------------------------------

class Owing(transports.Dummy):
    """Bytes unchanged, but every chunk received makes it owe the peer an
    acknowledgement (as TLS owes a KeyUpdate or a session ticket answer), and the
    end of the application's stream makes it send a closing record first."""

    CLOSE = b"<close_notify>"

    def __init__(self):
        transports.Dummy.__init__(self, True)
        self.owed = b""

    def receive(self, data):
        self.owed += b"<ack %d>" % len(data)
        return data

    def receive_in_place(self, buffer):
        return False               # always through receive(): it owes something each time

    def data_to_send(self):
        owed, self.owed = self.owed, b""
        return owed

    def end(self):
        return self.CLOSE


def test_what_receiving_makes_the_transport_owe_reaches_the_peer_in_order(ends):
    app, upstream, downstream, peer = ends()
    relay = Relay(upstream, downstream, Owing())
    peer.sendall(b"hello")
    assert recv_exact(app, 5) == b"hello"
    assert recv_exact(peer, 7) == b"<ack 5>"
    app.sendall(b"data after it")
    assert recv_exact(peer, 13) == b"data after it"          # owed bytes first, then the data
    peer.shutdown(socket.SHUT_WR)
    assert app.recv(1) == b""
    send_then_eof(app, b"")
    # The application's EOF: the transport's closing bytes, then the FIN.
    assert recv_all(peer) == Owing.CLOSE
    assert relay.result() is None


class Failing(Framed):
    """A Framed whose ProtocolError carries the plaintext of the good frames that
    came in the same read before the bad one (the contract's ``.data``)."""

    def bad_frame(self, decoded):
        error = FramedError("empty frame")
        error.data = b"".join(decoded)
        return error


def test_plaintext_decoded_before_a_protocol_error_is_delivered_first(ends):
    """Two good frames and a bad one in one read: the application gets both
    frames' bytes, then the relay ends with the error (obfs4proxy too relays
    what it decoded before it tears a connection down)."""
    app, upstream, downstream, peer = ends()
    relay = Relay(upstream, downstream, Failing())
    peer.sendall(frame(b"first ") + frame(b"second") + b"\0\0")
    assert recv_exact(app, 12) == b"first second"
    error = relay.result()
    assert isinstance(error, FramedError) and error.data == b"first second"


def test_one_pump_carries_many_relays_each_to_its_own_peer():
    pump = relay_.Pump("test-pump")
    pairs, ended = [], []
    try:
        for _ in range(60):
            app, upstream = socket.socketpair()
            downstream, peer = socket.socketpair()
            for sock in (app, peer):
                sock.settimeout(WAIT)
            pairs.append((app, upstream, downstream, peer))
            pump.add(relay_.Relay(upstream, downstream, Framed()), ended.append)
        payloads = [os.urandom(1000 + 977 * i) for i in range(len(pairs))]
        for (app, _, _, peer), data in zip(pairs, payloads):
            app.sendall(data)
            peer.sendall(frame(data[::-1]))
        for (app, _, _, peer), data in zip(pairs, payloads):
            assert unframe(recv_exact(peer, len(frame(data)))) == data
            assert recv_exact(app, len(data)) == data[::-1]
            app.shutdown(socket.SHUT_WR)
            peer.shutdown(socket.SHUT_WR)
        end = time.monotonic() + WAIT
        while len(ended) < len(pairs) and time.monotonic() < end:
            time.sleep(0.01)
        assert ended == [None] * len(pairs) and len(pump) == 0
    finally:
        assert pump.stop(timeout=WAIT)
        for group in pairs:
            for sock in group:
                sock.close()


def test_stopping_a_pump_with_abort_resets_the_live_tunnels(ends):
    """A forced stop must not look like a complete stream to either end."""
    app, upstream, downstream, peer = ends(tcp=True)
    pump = relay_.Pump("test-pump")
    ended = []

    def close_both(error):      # what the listener does in on_end: close the sockets
        ended.append(error)
        upstream.close()
        downstream.close()
    pump.add(relay_.Relay(upstream, downstream, transports.Dummy(True)), close_both)
    app.sendall(b"ping")
    assert recv_exact(peer, 4) == b"ping"
    assert pump.stop(abort=True, timeout=WAIT)
    assert len(ended) == 1 and isinstance(ended[0], relay_.Stopped)
    for end in (app, peer):
        with pytest.raises(ConnectionResetError):
            end.recv(1)


# --- Fair turns, timers on time, little held ----------------------------------------

class Endless:
    """A bulk tunnel's socket, faked: every recv_into reads all it may and every
    send takes it all, so a relay between two of them always has a chunk to move.
    The selector watches ``real``, a socket that stays writable, and readable
    too when a byte waits in it unread. ``moved`` counts the bytes read;
    ``on_read(size)`` runs before each read."""

    def __init__(self, real, on_read=None):
        self.real, self.on_read, self.moved = real, on_read, 0

    def fileno(self):
        return self.real.fileno()

    def gettimeout(self):
        return 0.0

    def recv_into(self, buffer, nbytes=0):
        size = nbytes or len(buffer)
        if self.on_read is not None:
            self.on_read(size)
        self.moved += size
        return size

    def send(self, data):
        return len(data)

    def shutdown(self, how):
        pass

    def setsockopt(self, *args):
        pass

    def getsockopt(self, *args):
        return self.real.getsockopt(*args)


class Noted:
    """A real socket whose successful reads and sends also call ``note(size)``."""

    def __init__(self, real, note):
        self.real, self.note = real, note

    def __getattr__(self, name):
        return getattr(self.real, name)

    def recv_into(self, buffer, nbytes=0):
        size = self.real.recv_into(buffer, nbytes)
        if size:
            self.note(size)
        return size

    def send(self, data):
        sent = self.real.send(data)
        self.note(sent)
        return sent


@pytest.fixture
def bulk():
    """bulk(pump, on_read=None) -> an Endless upstream of a relay that always has a
    chunk to move up; the pump is stopped (abort) and the sockets closed afterwards."""
    made, pumps = [], []

    def make(pump, on_read=None):
        near, far = socket.socketpair()
        far.send(b"!")                       # near stays readable; far has nothing to read
        made.extend((near, far))
        if pump not in pumps:
            pumps.append(pump)
        upstream = Endless(near, on_read)
        pump.add(relay_.Relay(upstream, Endless(far), dummy()), lambda error: None)
        return upstream
    yield make
    for pump in pumps:
        assert pump.stop(abort=True, timeout=WAIT)
    for sock in made:
        sock.close()


def test_a_relay_that_becomes_ready_waits_for_at_most_one_turn_of_each_busy_relay(ends, bulk):
    """Three bulk relays keep the pump busy; a byte reaches an idle relay's
    application socket three times, written from inside a bulk relay's read (on
    the pump's thread, so where the pump stands is known exactly). Between the
    write and the idle relay's read, each bulk relay may read once (one turn,
    at most MAX_CHUNK), whatever the order in which the selector reports the
    sockets."""
    app, upstream, downstream, peer = ends()
    pump = relay_.Pump("test-pump")
    reads, writes, marks = [0], [], []
    done = threading.Event()
    bulks = []

    def snapshot():
        return [each.moved for each in bulks]

    def on_bulk_read(size):
        if len(bulks) < 3:
            return                            # count the reads once all three run
        reads[0] += 1
        if reads[0] in (5, 30, 60):
            app.send(b"x")
            writes.append(snapshot())

    def on_read(size):
        marks.extend([snapshot()] * size)     # for each byte, where the bulk relays stood
        if len(marks) >= 3:
            done.set()

    pump.add(relay_.Relay(Noted(upstream, on_read), downstream, dummy()), lambda error: None)
    for _ in range(3):
        bulks.append(bulk(pump, on_bulk_read))
    assert done.wait(WAIT), "the idle relay read %d of its 3 bytes" % len(marks)
    for written, read in zip(writes, marks):
        moved = [after - before for before, after in zip(written, read)]
        assert max(moved) <= relay_.MAX_CHUNK, \
            "bulk relays moved %s bytes before a ready relay's turn (at most %d)" % (moved, relay_.MAX_CHUNK)
    assert recv_exact(peer, 3) == b"xxx"


class FakeTime:
    """relay.py's clock, moved on by the bulk bytes read: SECONDS_PER_BYTE
    each, powers of two so that every sum is exact."""

    SECONDS_PER_BYTE = 2.0 ** -30       # a 64 KiB chunk: 2**-14 s, about 61 µs

    def __init__(self, seconds_per_byte=SECONDS_PER_BYTE):
        self.now, self.seconds_per_byte = 1.0, seconds_per_byte

    def monotonic(self):
        return self.now

    def advance(self, size):
        self.now += size * self.seconds_per_byte


class Slow(Paced):
    DELAY = 17 * 2.0 ** -14              # about 1 ms of FakeTime: 4.25 reads of 256 KiB, so
                                         # that rounds of four bulk turns do not line up with it


def test_paced_pieces_go_on_time_while_bulk_relays_keep_the_pump_busy(ends, bulk, monkeypatch):
    """A paced relay's pieces beside four bulk relays, on a clock that moves
    only as bulk bytes are read: each piece goes at most one bulk turn (one
    read) after its time, not after a round of every ready relay."""
    clock = FakeTime()
    monkeypatch.setattr(relay_, "time", clock)
    app, upstream, downstream, peer = ends()
    pump = relay_.Pump("test-pump")
    for _ in range(4):
        bulk(pump, clock.advance)
    sent = []
    done = threading.Event()

    def on_send(size):
        sent.append(clock.now)
        if len(sent) == Slow.PIECES:
            done.set()

    app.sendall(b"p" * 4000)
    pump.add(relay_.Relay(upstream, Noted(downstream, on_send), Slow()), lambda error: None)
    assert done.wait(WAIT), "%d of %d paced pieces went" % (len(sent), Slow.PIECES)
    late = [after - (before + Slow.DELAY) for before, after in zip(sent, sent[1:])]
    turn = relay_.MAX_CHUNK * FakeTime.SECONDS_PER_BYTE
    assert min(late) >= 0, "a paced piece went early: %s" % late
    assert max(late) <= turn, "paced pieces late by %s s (one turn: %s s)" % (late, turn)
    assert recv_exact(peer, 4000) == b"p" * 4000


@pytest.mark.parametrize("per_byte, largest", [(2.0 ** -30, "MAX_CHUNK"), (2.0 ** -25, "CHUNK")],
                         ids=["quick", "slow"])
def test_a_relay_alone_reads_more_only_while_its_reads_are_quick(bulk, monkeypatch, per_byte, largest):
    """Alone in its pump, a bulk relay's reads double from CHUNK up to MAX_CHUNK
    while each takes under half TURN_SECONDS (64 KiB: 61 µs of FakeTime), and
    stay at CHUNK when one takes longer (64 KiB: 2 ms, obfs4's pace or slower)."""
    clock = FakeTime(per_byte)
    monkeypatch.setattr(relay_, "time", clock)
    sizes, done = [], threading.Event()

    def on_read(size):
        clock.advance(size)
        sizes.append(size)
        if len(sizes) == 10:
            done.set()

    bulk(relay_.Pump("test-pump"), on_read)
    assert done.wait(WAIT)
    assert sizes[0] == relay_.CHUNK and max(sizes[:10]) == getattr(relay_, largest)


@pytest.mark.parametrize("cpu_per_byte, smallest", [(2.0 ** -20, "MIN_CHUNK"), (2.0 ** -34, "CHUNK")],
                         ids=["slow work", "slow clock only"])
def test_a_turn_is_bounded_in_time_where_the_work_is_slow(bulk, monkeypatch, cpu_per_byte, smallest):
    """Plain-Python AES spends ~72 ms of CPU on a 64 KiB read: CHUNK was a floor, so
    each turn of a bulk tunnel held every other tunnel of the pump that long. Reads
    now halve below CHUNK, down to MIN_CHUNK, while a turn's CPU time stays over
    TURN_SECONDS (at 2**-20 s of CPU a byte, as slow: 64 KiB takes 62 ms, and even
    MIN_CHUNK 2 ms, so the reads come down to the floor and stay). A clock slowed by
    waits (the GIL, the scheduler: here 2 ms of FakeTime per 64 KiB) with quick work
    (2**-34 s of CPU a byte) keeps CHUNK."""
    clock, cpu = FakeTime(max(2.0 ** -25, cpu_per_byte)), FakeTime(cpu_per_byte)   # CPU <= wall
    monkeypatch.setattr(relay_, "time", clock)
    monkeypatch.setattr(relay_, "_cpu_time", cpu.monotonic)
    sizes, done = [], threading.Event()

    def on_read(size):
        clock.advance(size)
        cpu.advance(size)
        sizes.append(size)
        if len(sizes) == 20:
            done.set()

    bulk(relay_.Pump("test-pump"), on_read)
    assert done.wait(WAIT)
    assert sizes[0] == relay_.CHUNK and min(sizes[:20]) == getattr(relay_, smallest), sizes[:20]
    if smallest == "MIN_CHUNK":       # and it stays there
        assert sizes[10:20] == [relay_.MIN_CHUNK] * 10, sizes[:20]


def test_the_relays_of_a_pump_share_round_bytes_a_read(bulk):
    """With ROUND / CHUNK relays in the pump, each reads CHUNK a turn, however
    quick its reads are: a round, and what stalled readers can hold, stay about
    ROUND. Counted from the last relay's second read: every round since its
    first began with all of them in the pump."""
    many = relay_.ROUND // relay_.CHUNK
    sizes, done, last_reads = [], threading.Event(), []

    def on_read(size):
        if len(last_reads) >= 2:
            sizes.append(size)
            if len(sizes) == 4 * many:
                done.set()

    def on_last_read(size):
        last_reads.append(size)
        on_read(size)

    pump = relay_.Pump("test-pump")
    for number in range(many):
        bulk(pump, on_read if number < many - 1 else on_last_read)
    assert done.wait(WAIT)
    assert max(sizes[:4 * many]) == relay_.CHUNK


@pytest.mark.parametrize("make_transport", [dummy, Framed], ids=["in-place", "copying"])
def test_a_stalled_direction_holds_its_unwritten_bytes_not_a_chunk(ends, make_transport):
    """The peer reads nothing: once its socket is full, the up direction keeps
    what is left to write, and no lent buffer (nor the larger output it came
    from). Then the peer reads and every byte arrives, in order."""
    app, upstream, downstream, peer = ends()
    pool = CountingPool()
    relay = relay_.Relay(upstream, downstream, make_transport())
    relay.start(pool)
    app.setblocking(False)
    data, written = os.urandom(8 * 1024 * 1024), 0
    up = relay.up
    for _ in range(1000):
        try:
            written += app.send(data[written:written + 65536])
        except BlockingIOError:
            pass
        relay.handle([(upstream, selectors.EVENT_READ)])
        if up.pending:
            break
    assert up.pending, "the peer's socket never filled"
    assert pool.lent == pool.returned, "a stalled direction holds a lent chunk buffer"
    assert 0 < len(up.pending) <= len(frame(bytes(relay_.CHUNK)))   # at most one chunk's output
    assert up.pending.nbytes == len(up.pending.obj)                 # in an object of its own size
    # The peer reads now: all of it arrives (the relay driven by hand, as the pump would).
    app.shutdown(socket.SHUT_WR)
    peer.setblocking(False)
    got = bytearray()
    for _ in range(100000):
        try:
            got += peer.recv(1 << 20)
        except BlockingIOError:
            pass
        relay.handle([(upstream, selectors.EVENT_READ), (downstream, selectors.EVENT_WRITE)])
        if up.done:
            break
    peer.settimeout(WAIT)
    got += recv_all(peer)
    assert (unframe(bytes(got)) if make_transport is Framed else got) == data[:written]
    relay.close()
    assert pool.lent == pool.returned


# --- A soft error is not a reset ---------------------------------------------------

def can_inject():
    if not sys.platform.startswith("linux"):
        return "raw ICMP injection on loopback is written for Linux"
    try:
        socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close()
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800)).close()
    except (OSError, AttributeError) as exc:
        return ("needs raw sockets (root): %s; run as root or with sudo: sudo .venv/bin/python3 "
                "-m pytest tests/test_relay.py -k icmp" % exc)
    return None


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def connected_pair():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    return near, far


def test_a_transient_icmp_error_does_not_end_a_tunnel():
    """Linux's SO_ERROR also reports "soft" errors (an ICMP host unreachable
    quoting an established connection), which TCP itself rides out. The relay
    looks at SO_ERROR on a socket it does not watch (here: the application
    half-closed); it must not take such an error for a reset."""
    reason = can_inject()
    if reason:
        if IN_CI:
            pytest.fail("CI runs as root and must run this test: " + reason)
        pytest.skip(reason)
    sniffer = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    sniffer.bind(("lo", 0))
    sniffer.settimeout(0.2)
    app, upstream = connected_pair()
    downstream, peer = connected_pair()
    ended = []
    pump = relay_.Pump("test-pump")
    pump.add(relay_.Relay(upstream, downstream, transports.Dummy(True)), ended.append)
    try:
        app.sendall(b"request")
        app.shutdown(socket.SHUT_WR)                  # upstream is now watched for nothing
        peer.settimeout(5)
        assert recv_exact(peer, 7) == b"request" and peer.recv(1) == b""
        # The sequence number upstream sends next, from its latest segment to
        # the application (its ACK of the FIN; not the SYN-ACK, whose number is
        # out of the window, so the kernel would ignore the ICMP).
        ports = (upstream.getsockname()[1], app.getsockname()[1])
        seq, end = None, time.monotonic() + 0.5
        while time.monotonic() < end:
            try:
                frame = sniffer.recv(65535)
            except socket.timeout:
                continue
            ip = frame[14:]
            if ip[9] != 6:
                continue
            tcp = ip[(ip[0] & 15) * 4:]
            if struct.unpack("!HH", tcp[:4]) == ports and not tcp[13] & 0x02:  # not SYN
                seq = struct.unpack("!I", tcp[4:8])[0]
        assert seq is not None, "saw no segment from upstream to the application"
        # ICMP type 3 code 1 (host unreachable) quoting a segment upstream -> app.
        inner = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0, 64, 6, 0,
                            socket.inet_aton("127.0.0.1"), socket.inet_aton("127.0.0.1"))
        inner += struct.pack("!HHI", ports[0], ports[1], seq)
        body = struct.pack("!BBHI", 3, 1, 0, 0) + inner
        body = body[:2] + struct.pack("!H", checksum(body)) + body[4:]
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as raw:
            raw.sendto(body, ("127.0.0.1", 0))
        time.sleep(relay_.IDLE_CHECK * 2.5)       # the relay looks, and must carry on
        assert not ended, "the relay ended on a transient ICMP error: %r" % ended
        peer.sendall(b"response")
        peer.shutdown(socket.SHUT_WR)
        app.settimeout(5)
        assert recv_exact(app, 8) == b"response"
        end = time.monotonic() + 5
        while not ended and time.monotonic() < end:
            time.sleep(0.01)
        assert ended == [None]
    finally:
        pump.stop()
        for sock in (sniffer, app, upstream, downstream, peer):
            sock.close()


# --- The seam for a connection a transport owns (transports.py) ---------------------------

class Owned:
    """A pump object of the kind a transport may own: it watches one socket of a pair at
    a time and moves to the other when told (``switch``, from any thread, then a nudge);
    ``events`` records what woke it. It finishes once it has read from both."""

    pump = None
    finished = False

    def __init__(self, first, second):
        import selectors
        self.upstream, self.downstream = first, second
        self.current = first
        self.registered = {}
        self.read = []
        self.nudges = 0
        self.READ = selectors.EVENT_READ
        self.ended = threading.Event()
        self.error = None

    def start(self, buffers):
        pass

    def watch(self):
        return {self.current: self.READ}, None

    def handle(self, ready, share=None):
        if not ready:
            self.nudges += 1
        for sock, _ in ready:
            assert sock is self.current, "stepped for a socket it let go of"
            self.read.append(sock.recv(10))
        self.finished = len(self.read) == 2

    def abort(self):
        pass

    def close(self):
        pass


def test_a_pump_object_may_change_its_sockets_and_be_nudged_from_another_thread():
    """The pump registers the socket an object newly watches, lets go of the one it no
    longer names (bytes on it then wake nothing), steps it on Pump.nudge from any thread,
    and gives it ``pump`` when the object has that attribute."""
    a, a_peer = socket.socketpair()
    b, b_peer = socket.socketpair()
    pump = relay_.Pump("owned")
    owned = Owned(a, b)
    done = threading.Event()
    try:
        pump.add(owned, lambda error: (setattr(owned, "error", error), done.set()))
        assert owned.pump is pump
        a_peer.sendall(b"one")
        deadline = time.monotonic() + 10
        while not owned.read:
            assert time.monotonic() < deadline
            time.sleep(0.01)     # polling the object's record (a real condition)
        owned.current = b        # from this thread: the pump learns of it at the nudge
        pump.nudge(owned)
        deadline = time.monotonic() + 10
        while not owned.nudges or owned.current not in owned.registered or a in owned.registered:
            assert time.monotonic() < deadline     # stepped, b registered and a let go of
            time.sleep(0.01)
        a_peer.sendall(b"ignored")   # a is no longer watched: it wakes nothing
        b_peer.sendall(b"two")
        assert done.wait(10) and owned.error is None
        assert owned.read == [b"one", b"two"]
    finally:
        pump.stop()
        for sock in (a, a_peer, b, b_peer):
            sock.close()
