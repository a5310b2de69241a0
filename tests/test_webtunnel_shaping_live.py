"""Record shaping live: our client, nginx and our server, the records read off a tcpdump
capture of the client <-> nginx hop (teaching/tls_in_tls.py reads them, as ``detect`` does).

    application --SOCKS--> our client ==TLS==> nginx --HTTP--> our server --> destination
                                      ^ tcpdump: the TLS records a censor sees

The application and the destination play Tor's first turns (the sizes measured through
webtunnel: the client's 517-byte ClientHello record, the server's 1182-byte flight, cells
of 536 bytes and batches of them), each side waiting for the other's whole turn, so that
each turn is one write. Shaping off, the marks are there (the detector proves itself):
the client's first data record is 534, cells show as 514 k + 39 both ways. Shaping on
(the default), none among the client's first 16 records; toward the client, a mark only
where nginx read two paced pieces at once (a record longer than any piece: counted and
printed). The slow test does the same with a real Tor bootstrapping through nginx
(tests/tor-loopback.sh).
"""

import io
import re
import shutil
import time

import pytest
from nginx import free_port
from support import OURS, bootstrap, recv_exact
from test_capture import Tcpdump
from test_webtunnel_live import NAME, SERVER_URL, parts  # noqa: F401 (the fixture)
from test_webtunnel_shaping import noise

import webtunnel
from teaching import capture, pcap, tls_in_tls

# (what the client sends, what the server answers), turn by turn
TURNS = [(517, 1182), (80, 79), (33, 79), (1050, 2077), (1050, 536), (536, 536), (1564, 2592),
         (200, 536), (536, 1050)]
FIRST = tls_in_tls.FIRST


def scripted(conn):
    """The destination's side of TURNS: read the client's turn whole, answer with one write."""
    for number, (up, down) in enumerate(TURNS):
        recv_exact(conn, up)
        conn.sendall(noise(down, 1000 + number))


def flows(path, port):
    """The Flows of the capture's connections to nginx's ``port`` (none while unreadable)."""
    try:
        _, conversations = pcap.read_pcap(path)
    except pcap.CaptureError:
        return []
    found = []
    for conv in conversations:
        if conv.ends[1].endswith(":%d" % port):
            flow = tls_in_tls.analyse(conv, 0)
            if flow is not None:
                found.append(flow)
    return found


def ended(path, port):
    """Whether the capture holds a FIN or RST from both ends of a connection to ``port``:
    tcpdump writes in order, so every data segment before them is in the file too."""
    sides = set()
    try:
        capture = pcap.Pcap(path)
        for _, frame in capture:
            packet = pcap.ip_packet(capture.linktype, frame)
            segment = pcap.tcp_segment(packet) if packet is not None else None
            if segment is not None and segment.flags & 0x05 and port in (segment.src[1], segment.dst[1]):
                sides.add(segment.src[1] == port)
    except (pcap.CaptureError, ValueError):
        return False                          # a packet half written: read again
    return sides == {True, False}


def carried(flow):
    return (sum(n - 17 for n in flow.client), sum(n - 17 for n in flow.server))


def run_turns(parts, tmp_path, shaping, route, monkeypatch):  # noqa: F811 (parts)
    """One tunnel through nginx playing TURNS under tcpdump; returns its Flow and the pcap."""
    if route == "python":
        monkeypatch.setenv("OBFSPROXY_HELLO", "python")
    dest = parts.dest(scripted)
    server = parts.server(dest, url=SERVER_URL + ("" if shaping else ";shaping=off"))
    url = parts.nginx(server.address).url
    port = int(url.split("/")[2].rpartition(":")[2])
    client = parts.client("socks")
    path = tmp_path / ("shaping-%s-%s.pcap" % ("on" if shaping else "off", route))
    dump = Tcpdump(path, [port])
    try:
        args = client.args(url=url) if shaping else client.args(url=url, shaping="off")
        with client.connect(args) as conn:
            for number, (up, down) in enumerate(TURNS):
                conn.sendall(noise(up, number))
                assert recv_exact(conn, down) == noise(down, 1000 + number)
        wanted = (sum(up for up, _ in TURNS), sum(down for _, down in TURNS))
        end = time.monotonic() + 20
        while time.monotonic() < end:
            found = flows(path, port)
            if found and all(a >= b for a, b in zip(carried(found[0]), wanted)):
                break
            time.sleep(0.05)                  # polling tcpdump's output file
    finally:
        dump.stop()
    found = flows(path, port)
    assert len(found) == 1, "one tunnel, one TLS connection to nginx: %d" % len(found)
    return found[0], path


def detect(path):
    out = io.StringIO()
    assert capture.main("detect", [str(path)], out=out) == 0
    return out.getvalue()


def merges(flow):
    """Records toward the client longer than any one piece: nginx read pieces together."""
    return sum(1 for n in flow.server[:FIRST] if n - 17 > webtunnel.LARGEST_PIECE)


def merged(flow):
    """Marks toward the client, each of which must be nginx reading two paced pieces at
    once: a record longer than any one piece."""
    marks = [m for m in flow.marks if m[0] == 1]
    assert all(length - 17 > webtunnel.LARGEST_PIECE for _, _, length, _ in marks)
    return marks


@pytest.mark.parametrize("route", ["browser", "python"])
def test_through_nginx_shaping_hides_the_marks_and_off_they_are_back(parts, tmp_path, route,  # noqa: F811
                                                                      monkeypatch):
    off, off_pcap = run_turns(parts, tmp_path, False, route, monkeypatch)
    print("\nshaping off (%s): client %s\n  server %s\n  marks %s"
          % (route, off.client[:FIRST], off.server[:FIRST], off.marks))
    assert off.client[0] == 534, off.client
    assert len([m for m in off.marks if m[0] == 0]) >= 4       # 534, 1067, 1067, 553, 1581
    assert len([m for m in off.marks if m[0] == 1]) >= 4       # 553, 553, 2609, 553, 1067

    on, on_pcap = run_turns(parts, tmp_path, True, route, monkeypatch)
    print("shaping on (%s): client %s\n  server %s\n  marks %s\n  bursts %s"
          % (route, on.client[:FIRST], on.server[:FIRST], on.marks, on.bursts[:8]))
    assert len(on.client) >= FIRST and len(on.server) >= FIRST
    assert not [m for m in on.marks if m[0] == 0], on.marks
    assert max(on.client[:FIRST]) <= webtunnel.LARGEST_PIECE + 17
    toward_client = merged(on)
    print("  toward the client, records nginx read as two pieces or more: %d of %d; of them marks: %d"
          % (merges(on), FIRST, len(toward_client)))
    assert len(toward_client) < len([m for m in off.marks if m[0] == 1])
    # What shaping does not change: the round trips, one per turn. The tunnel's end may add
    # one (close_notify answered, or not yet, when the capture ends), with or without shaping.
    assert len(TURNS) <= on.round_trips <= len(TURNS) + 1
    assert len(TURNS) <= off.round_trips <= len(TURNS) + 1

    # detect says the same from each capture.
    said = detect(off_pcap)
    assert "client -> server: %s\n" % " ".join(map(str, off.client[:FIRST])) in said
    assert "client record 1: 534 = Tor's ClientHello (517 + 17)" in said
    assert "%d round trip(s) in the first 16 KiB" % off.round_trips in said
    said = detect(on_pcap)
    print(said)
    assert "client -> server: %s\n" % " ".join(map(str, on.client[:FIRST])) in said
    assert "exact-length marks of Tor inside: none" in said or toward_client
    # (unless nginx read pieces together into a record of 534 bytes or more)
    assert ("cut below Tor's marks" in said) == (max(on.client[:FIRST] + on.server[:FIRST]) < 534)
    assert "Xue et al., USENIX Security 2024" in said


SUCCESS = re.compile(r"^tor bootstrap through webtunnel: client got the bridge descriptor "
                     r"\((.*)\) \[(/tmp/torbs\.\w+)\]$", re.MULTILINE)


def tor_through_nginx(parts, tmp_path, shaping):  # noqa: F811 (parts)
    """tor-loopback.sh with our PT on both sides, the bridge behind nginx, under tcpdump on
    nginx's port; returns the Flow of the client's first connection to nginx."""
    port = free_port()
    front = parts.nginx(("127.0.0.1", port))
    nginx_port = front.address[1]
    path = tmp_path / ("tor-shaping-%s.pcap" % shaping)
    dump = Tcpdump(path, [nginx_port])
    try:
        status, output, seconds = bootstrap(
            OURS, OURS, "webtunnel", PT_PORT=str(port), SSL_CERT_FILE=parts.ca.ca_file,
            BRIDGE_EXTRA="ServerTransportOptions webtunnel url=%s shaping=%s" % (SERVER_URL, shaping),
            BRIDGE_ARGS="url=https://127.0.0.1:%d%s servername=%s shaping=%s"
                        % (nginx_port, SERVER_URL.split("wt.test")[1], NAME, shaping))
        end = time.monotonic() + 30
        while not ended(path, nginx_port) and time.monotonic() < end:
            time.sleep(0.05)                  # polling tcpdump's output file: it lags under load
    finally:
        dump.stop()
    match = SUCCESS.search(output)
    assert status == 0 and match, output
    shutil.rmtree(match.group(2), ignore_errors=True)
    found = flows(path, nginx_port)
    if not found:
        description, conversations = pcap.read_pcap(path)
        raise AssertionError("no TLS connection to nginx's port %d in the capture: %s; %s" % (
            nginx_port, description, [(c.name, [len(x) for x in c.streams]) for c in conversations]))
    print("\ntor through nginx, shaping %s: bootstrap in %.1f s" % (shaping, seconds))
    return found[0]


@pytest.mark.slow
def test_tor_bootstrap_through_nginx_shows_no_marks_with_shaping_and_shows_them_without(parts, tmp_path):  # noqa: F811
    off = tor_through_nginx(parts, tmp_path, "off")
    print("  client %s\n  server %s\n  marks %s\n  bursts %s"
          % (off.client[:FIRST], off.server[:FIRST], off.marks, off.bursts[:8]))
    assert off.client[0] == 534 and [m for m in off.marks if m[0] == 0][1:], off.marks
    assert [m for m in off.marks if m[0] == 1], off.marks

    on = tor_through_nginx(parts, tmp_path, "on")
    print("  client %s\n  server %s\n  marks %s\n  bursts %s"
          % (on.client[:FIRST], on.server[:FIRST], on.marks, on.bursts[:8]))
    assert not [m for m in on.marks if m[0] == 0], on.marks
    toward_client = merged(on)
    print("  toward the client, records nginx read as two pieces or more: %d of %d; of them marks: %d"
          % (merges(on), len(on.server[:FIRST]), len(toward_client)))
    assert len(toward_client) < len([m for m in off.marks if m[0] == 1])
