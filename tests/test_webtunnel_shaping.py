"""Record shaping in webtunnel (webtunnel.py, "Record shaping"), sans-IO.

What is checked:

* the peer reads exactly the bytes that were written, whatever the cuts and however the
  wire splits them (both directions, both client routes, the paced server);
* the records a shaped side makes: below Tor's marks (no 534, no 514 k + 39), no record one
  whole write, for the first 16 of each direction, over many seeds;
* the detector (``tlswire.tor_marker``) finds the marks when shaping is off: the same writes
  then give Tor's ClientHello record and whole cells, so a pass above is not a blind test.

The writes are Tor's first ones as measured through webtunnel (the findings' tables):
the client's ClientHello record (517), CCS + Finished (80), 33, then two 1050-byte writes
of two cells each; the server's flight (1182), 79, 79, 2077, a cell each (536) and five cells.
"""

import random
import ssl

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_webtunnel import URL, drive, noise, random_splits, tls_configs

import browser_tls
import tlswire
import webtunnel
from webtunnel import Shaping, WebTunnel

CLIENT_WRITES = (517, 80, 33, 1050, 1050, 514 + 22, 3 * 514 + 22, 200)
SERVER_WRITES = (1182, 79, 79, 2077, 536, 536, 2592, 514 + 22)
FIRST = 16
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.function_scoped_fixture])


@pytest.fixture
def trusted(ca, monkeypatch):
    """The test CA as the only root (SSL_CERT_FILE): the browser route reads it there."""
    monkeypatch.setenv("SSL_CERT_FILE", ca.ca_file)
    return ca


def seeded(seed):
    """A Shaping whose connections draw from a seeded source (as a test may inject)."""
    return Shaping(random=lambda: random.Random(seed))


def open_pair(ca, route, client_shaping, server_shaping):
    """A TLS pair through its upgrade: our client on ``route`` ("python": Python's ssl,
    "browser": curl's Chrome hello) and our server terminating TLS."""
    client_config, server_config = tls_configs(ca)
    if route == "python":
        client_config = client_config.replace(context=ssl.create_default_context(cafile=ca.ca_file))
    elif not isinstance(client_config.context, browser_tls.BrowserContext):
        pytest.skip("the browser route is not available here (curl_cffi)")
    client_config = client_config.replace(shaping=client_shaping)
    server_config = server_config.replace(shaping=server_shaping)
    client, server = WebTunnel(True, client_config), WebTunnel(False, server_config)
    drive(client, server)
    assert client.is_open and server.is_open
    return client, server


def writes(sizes, seed):
    return [noise(size, seed + i) for i, size in enumerate(sizes)]


def whole_writes(lengths, sizes):
    """The writes (by index) that went out in one record of their own, among those the
    records ``lengths`` cover: a record that is one whole write shows the write's length."""
    ends, at = set(), 0
    for n in lengths:
        at += n - 17
        ends.add(at)
    found, start = [], 0
    for i, size in enumerate(sizes):
        if start + size > at:
            break
        if start in ends | {0} and start + size in ends and not any(start < e < start + size for e in ends):
            found.append(i)
        start += size
    return found


def markers(lengths):
    """[(index, length, what)] of the records that give Tor away by their exact length."""
    return [(i, n, tlswire.tor_marker(n)) for i, n in enumerate(lengths) if tlswire.tor_marker(n)]


# --- The cuts themselves ----------------------------------------------------------------

@settings(max_examples=200, **SETTINGS)
@given(seed=st.integers(0, 2 ** 32), sizes=st.lists(st.integers(0, 3000), max_size=30))
def test_cuts_are_whole_in_order_and_below_the_marks(seed, sizes):
    shaper = seeded(seed).start()
    total = 0
    for size in sizes:
        data = noise(size, seed + size)
        in_window = shaper.active
        pieces = shaper.cut(data)
        assert b"".join(pieces) == data
        if in_window and size > 1:
            assert len(pieces) >= 2, "a whole write in one piece shows its length"
        cut_here = [len(p) for p in pieces][:-1] if shaper.active or not in_window else []
        assert all(n <= webtunnel.LARGEST_PIECE for n in cut_here)
        total += size
    if total >= webtunnel.SHAPED_BYTES + webtunnel.LARGEST_PIECE:
        assert not shaper.active


def test_past_the_window_a_write_goes_whole():
    shaper = Shaping(window=1000, random=lambda: random.Random(7)).start()
    first = shaper.cut(b"a" * 5000)
    assert sum(map(len, first[:-1])) >= 1000 and len(first[-1]) > 3000
    assert shaper.cut(b"b" * 5000) == [b"b" * 5000]


def test_the_option_turns_it_off_and_nothing_else():
    assert isinstance(webtunnel.shaping_option({}), Shaping)
    assert isinstance(webtunnel.shaping_option({"shaping": "on"}), Shaping)
    assert webtunnel.shaping_option({"shaping": "off"}) is None
    with pytest.raises(ValueError, match="shaping= must be on or off"):
        webtunnel.shaping_option({"shaping": "sometimes"})
    assert WebTunnel.client_config({"url": URL}).shaping is not None
    assert WebTunnel.client_config({"url": URL, "shaping": "off"}).shaping is None
    assert WebTunnel.server_config({"url": URL}, None)[0].shaping is not None
    assert WebTunnel.server_config({"url": URL, "shaping": "off"}, None)[0].shaping is None
    # Neither announces it: the bridge line stays upstream's.
    assert WebTunnel.server_config({"url": URL, "shaping": "off"}, None)[1] == {"url": URL, "ver": "0.0.2"}


def test_two_connections_cut_differently_by_default():
    cuts = [Shaping().start().cut(bytes(4000)) for _ in range(2)]
    assert [len(p) for p in cuts[0]] != [len(p) for p in cuts[1]]


# --- The peer reads the same bytes --------------------------------------------------------

@settings(max_examples=20, **SETTINGS)
@given(seed=st.integers(0, 2 ** 32), up=st.lists(st.integers(0, 5000), max_size=12),
       down=st.lists(st.integers(0, 5000), max_size=12), route=st.sampled_from(["python", "browser"]))
def test_shaped_streams_arrive_exact_at_every_split(trusted, seed, up, down, route):
    client, server = open_pair(trusted, route, seeded(seed), seeded(seed + 1))
    split = random_splits(seed)
    sent, got = [b"", b""], [bytearray(), bytearray()]
    for size_up, size_down in zip(up + [0] * len(down), down + [0] * len(up)):
        data_up, data_down = noise(size_up, seed), noise(size_down, seed + 2)
        sent[0] += data_up
        sent[1] += data_down
        for piece in split(client.send(data_up) if data_up else b""):
            got[1] += server.receive(piece)
        for piece in split(server.send(data_down) if data_down else b""):
            got[0] += client.receive(piece)
    assert bytes(got[1]) == sent[0] and bytes(got[0]) == sent[1]


@settings(max_examples=50, **SETTINGS)
@given(seed=st.integers(0, 2 ** 32), sizes=st.lists(st.integers(0, 9000), max_size=20))
def test_paced_server_pieces_are_the_stream_with_pauses_of_one_to_two_ms_between(seed, sizes):
    config, _ = WebTunnel.server_config({"url": URL}, None)
    server = WebTunnel(False, config.replace(shaping=seeded(seed)))
    server.receive(b"GET /k7Qm2Zx1c1b00b6 HTTP/1.1\r\nHost: wt.test\r\n"
                   b"Connection: upgrade\r\nUpgrade: websocket\r\n\r\n")
    assert server.is_open and server.paced and server.send_in_place(memoryview(bytearray(1))) is False
    stream, out = b"", b""
    for size in sizes:
        data = noise(size, seed + size)
        stream += data
        shaping = server._shaper.active
        pieces = server.send_paced(data)
        out += b"".join(piece for piece, _ in pieces)
        if shaping:
            assert all(0.001 <= pause <= 0.002 for _, pause in pieces[:-1])
            assert pieces[-1][1] == 0.0          # the next write waits for nothing
        else:
            assert pieces == [(data, 0.0)]
    assert out == stream


def test_a_plain_client_and_a_server_with_shaping_off_are_not_paced():
    config, _ = WebTunnel.server_config({"url": URL, "shaping": "off"}, None)
    assert not WebTunnel(False, config).paced
    client = WebTunnel(True, WebTunnel.client_config({"url": "http://wt.test/p"}))
    assert not client.paced and client._shaper is None


# --- The records: no exact Tor length among the first ------------------------------------

@pytest.mark.parametrize("route", ["python", "browser"])
def test_the_detector_finds_tor_in_unshaped_records(trusted, route):
    """Shaping off: each write is one record of its size + 17, and the marks are there:
    the first client record is Tor's ClientHello, cells show as 514 k + 39."""
    client, server = open_pair(trusted, route, None, None)
    c_lengths = tlswire.record_lengths(b"".join(client.send(w) for w in writes(CLIENT_WRITES, 1)))
    s_lengths = tlswire.record_lengths(b"".join(server.send(w) for w in writes(SERVER_WRITES, 2)))
    assert c_lengths == [n + 17 for n in CLIENT_WRITES]
    assert s_lengths == [n + 17 for n in SERVER_WRITES]
    assert c_lengths[0] == 534 and markers(c_lengths)[0][2].startswith("Tor's ClientHello")
    assert [i for i, _, _ in markers(c_lengths)] == [0, 3, 4, 5, 6]
    assert [i for i, _, _ in markers(s_lengths)] == [4, 5, 6, 7]
    assert whole_writes(c_lengths, CLIENT_WRITES) == list(range(len(CLIENT_WRITES)))


@pytest.mark.parametrize("route", ["python", "browser"])
def test_shaped_records_hide_the_marks_and_every_write_length(trusted, route):
    for seed in range(20):
        client, server = open_pair(trusted, route, seeded(seed), seeded(seed + 100))
        for side, sizes in ((client, CLIENT_WRITES), (server, SERVER_WRITES)):
            lengths = tlswire.record_lengths(b"".join(side.send(w) for w in writes(sizes, seed)))
            first = lengths[:FIRST]
            assert len(first) == FIRST
            assert not markers(first), (seed, first)
            assert max(first) <= webtunnel.LARGEST_PIECE + 17
            assert not whole_writes(first, sizes), (seed, first)


def test_paced_pieces_behind_a_front_hide_the_marks_when_the_front_follows_them():
    """A front that makes one record per piece (nginx reading each paced piece on its own)
    sends records of piece + 17: none of Tor's lengths among the first 16, over many seeds."""
    config, _ = WebTunnel.server_config({"url": URL}, None)
    for seed in range(50):
        server = WebTunnel(False, config.replace(shaping=seeded(seed)))
        server.receive(b"GET /k7Qm2Zx1c1b00b6 HTTP/1.1\r\nHost: wt.test\r\n"
                       b"Connection: upgrade\r\nUpgrade: websocket\r\n\r\n")
        lengths = [len(piece) + 17 for w in writes(SERVER_WRITES, seed)
                   for piece, _ in server.send_paced(w)][:FIRST]
        assert not markers(lengths) and not whole_writes(lengths, SERVER_WRITES)
