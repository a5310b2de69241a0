"""Teaching the protocol: the annotated demo, --record-dir, ``unmask`` and ``detect``.

Captures are made by the tests themselves: recordings from a real client and
server (subprocesses), a pcap written by tcpdump on loopback, and pcaps built
here byte by byte (IPv6, several link types, out-of-order segments,
retransmits, sequence-number wrap). Key values printed by the programs are
checked with hashlib and AES directly, not with obfs2.py.
"""

import hashlib
import io
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from Crypto.Cipher import AES
from support import IN_CI, PROGRAM, ROOT, EchoServer, LineReader, recv_all, socks5_connect, tunnel

import capture
import obfs2

CLIENT_HELLO = (b"\x16\x03\x01\x00\xc8\x01\x00\x00\xc4\x03\x03" + bytes(range(32))
                + b" a TLS ClientHello: what the censor was looking for")


def run(*args, env=None, timeout=60):
    """``obfsproxy.py args`` as a subprocess: (exit status, stdout, stderr)."""
    done = subprocess.run([sys.executable, PROGRAM, *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def mac(label, data, secret=None, iterations=1):
    """The spec's MAC, written independently of obfs2.py."""
    if secret is None:
        return hashlib.sha256(label + data + label).digest()
    m = label + data + hashlib.sha256(secret).digest() + label
    for _ in range(iterations):
        m = hashlib.sha256(m).digest()
    return m


def aes_ctr(m, data):
    return AES.new(m[:16], AES.MODE_CTR, nonce=b"", initial_value=m[16:]).decrypt(data)


# --- The demo -----------------------------------------------------------------------

def parse_demo(out):
    seeds = dict(re.findall(r"(INIT_SEED|RESP_SEED) = ([0-9a-f]{32})", out))
    keys = {name: bytes.fromhex(key + iv) for name, key, iv in re.findall(
        r"(INIT_PAD|RESP_PAD|INIT_SECRET|RESP_SECRET) += .*\n +key ([0-9a-f]{32})  IV ([0-9a-f]{32})", out)}
    fields = re.findall(r"\n +(\d+) +(\d+)  (SEED|MAGIC|PADLEN|padding|data) +(.*)", out)
    return seeds, keys, fields


def check_demo_fields(out, secret=None, iterations=1):
    seeds, keys, fields = parse_demo(out)
    init_seed, resp_seed = bytes.fromhex(seeds["INIT_SEED"]), bytes.fromhex(seeds["RESP_SEED"])
    # The key schedule as printed is the spec's, computed here with hashlib.
    expected = {
        "INIT_PAD": mac(b"Initiator obfuscation padding", init_seed, secret, iterations),
        "RESP_PAD": mac(b"Responder obfuscation padding", resp_seed, secret, iterations),
        "INIT_SECRET": mac(b"Initiator obfuscated data", init_seed + resp_seed, secret, iterations),
        "RESP_SECRET": mac(b"Responder obfuscated data", init_seed + resp_seed, secret, iterations),
    }
    assert keys == expected
    # Each side's handshake message, field by field, as it crossed the wire.
    assert [f[2] for f in fields] == ["SEED", "MAGIC", "PADLEN", "padding", "data"] * 2
    for side, (seed, pad) in enumerate(((init_seed, "INIT_PAD"), (resp_seed, "RESP_PAD"))):
        seed_row, magic_row, padlen_row, padding_row, data_row = fields[side * 5:side * 5 + 5]
        assert seed_row[:2] == ("0", "16") and seed_row[3].startswith(seed.hex())
        wire = bytes.fromhex(magic_row[3].split("E(")[0].replace(" ", "") +
                             padlen_row[3].split("E(")[0].replace(" ", ""))
        magic, padlen = struct.unpack(">II", aes_ctr(keys[pad], wire))
        assert magic == 0x2BF5CA7E and "-> 2b f5 ca 7e = MAGIC_VALUE" in magic_row[3]
        assert padlen_row[3].endswith("= %d" % padlen)
        assert padding_row[:2] == ("24", str(padlen))
        assert data_row[0] == str(24 + padlen)
    return keys


def test_demo_walks_through_every_field():
    status, out, err = run("demo")
    assert status == 0, err
    assert "\x1b[" not in out                       # not a terminal: no colour
    keys = check_demo_fields(out)
    # The first application bytes: in clear, and as sent (E(INIT_SECRET, message)).
    sent = re.search(r"the client sent them as E\(INIT_SECRET, message\):\n +00000000  ([0-9a-f ]+)\|",
                     out).group(1)
    clear = re.search(r"in clear:\n +00000000  ([0-9a-f ]+)\|", out).group(1)
    assert clear.split()[:3] == ["16", "03", "01"]
    assert aes_ctr(keys["INIT_SECRET"], bytes.fromhex(sent.replace(" ", ""))) == \
        bytes.fromhex(clear.replace(" ", ""))
    # What a string-matching filter would have seen.
    assert re.search(r"TLS record header 16 03 01 +offset 0 +not found", out)
    assert "MATCH" not in out
    assert "spec erratum 1" in out and "OK: the message crossed the tunnel" in out


def test_demo_with_shared_secret_shows_the_cost():
    status, out, err = run("demo", "--shared-secret=s3cret", "--ss-hash-iterations=1000")
    assert status == 0, err
    check_demo_fields(out, secret=b"s3cret", iterations=1000)
    assert "H(SECRET) = %s" % hashlib.sha256(b"s3cret").hexdigest() in out
    assert "H^n(s | INIT_SEED | H(SECRET) | s)" in out
    assert "4000 SHA-256" in out and "multiplies the cost by 1000" in out
    assert "4 x 1000 = 4000 to read it" in out


def test_demo_dummy_shows_the_signatures():
    status, out, err = run("demo", "--transport=dummy")
    assert status == 0, err
    assert re.search(r"TLS record header 16 03 01 +offset 0 +offset 0: MATCH", out)


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
@pytest.mark.parametrize("no_color", [None, "1"])
def test_demo_colours_only_a_terminal(no_color):
    import pty
    env = dict(os.environ, TERM="xterm")
    env.pop("NO_COLOR", None)
    if no_color:
        env["NO_COLOR"] = no_color
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, PROGRAM, "demo"], stdin=subprocess.DEVNULL,
                               stdout=slave, stderr=subprocess.PIPE, env=env, cwd=str(ROOT))
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:                               # EIO: the terminal's other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert process.wait(30) == 0
    out = b"".join(chunks)
    assert b"OK" in out
    assert (b"\x1b[" in out) == (no_color is None)


# --- Recordings from a real client and server -------------------------------------

def exchange(client, server, payload):
    with socks5_connect(client.address, server.address) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        return recv_all(sock)


def recordings(directory, side):
    """The (initiator, responder) files that ``side`` (client/server) recorded."""
    initiator = sorted(Path(directory).glob("*-%s-*.initiator.bin" % side))
    responder = sorted(Path(directory).glob("*-%s-*.responder.bin" % side))
    assert len(initiator) == len(responder) == 1, list(Path(directory).iterdir())
    return initiator[0], responder[0]


def test_record_dir_then_unmask_and_detect(tmp_path):
    record = tmp_path / "rec"                         # created by the program
    payload = CLIENT_HELLO + os.urandom(3000)
    with EchoServer() as echo:
        server, client = tunnel("obfs2", "--record-dir=" + str(record), dest=echo.address)
        with server, client:
            assert exchange(client, server, payload) == payload
    for proxy in (server, client):
        warnings = [line for line in proxy.log.lines if "stores traffic" in line]
        assert len(warnings) == 1 and "WARNING" in warnings[0]
    c_init, c_resp = recordings(record, "client")
    s_init, s_resp = recordings(record, "server")
    # Both ends saw the same wire.
    assert c_init.read_bytes() == s_init.read_bytes() and c_resp.read_bytes() == s_resp.read_bytes()
    wire = c_init.read_bytes()
    assert CLIENT_HELLO[:3] not in wire[:obfs2.HEADER_LENGTH + obfs2.MAX_PADDING + 100]

    out_dir = tmp_path / "plain"
    status, out, err = run("unmask", "--output-dir=" + str(out_dir), str(c_init), str(c_resp))
    assert status == 0, err
    assert "looks like a TLS handshake record" in out
    assert "00000000  16 03 01 00 c8 01 00 00  c4 03 03 00 01 02 03 04" in out
    assert "(--full prints everything" in out
    assert (out_dir / "connection-1.initiator-to-responder.bin").read_bytes() == payload
    assert (out_dir / "connection-1.responder-to-initiator.bin").read_bytes() == payload
    for name in ("INIT_PAD", "RESP_PAD", "INIT_SECRET", "RESP_SECRET"):
        assert name + " " in out
    assert "work: 6 SHA-256" in out                   # 2 PAD keys to check, then all 4 shown

    status, full, err = run("unmask", "--full", str(c_resp), str(c_init))   # any order
    assert status == 0, err
    assert "more bytes" not in full and len(full) > len(out)

    status, out, err = run("detect", str(record))
    assert status == 0, err
    assert out.count("obfs2: the initiator and responder magic decrypts to 2b f5 ca 7e") == 2
    assert "2 of 2 stream(s) are obfs2" in out
    assert re.search(r"work: 2 SHA-256, 2 AES block\(s\), [\d.]+ (us|ms)", out)


def test_recordings_without_roles_in_their_names(tmp_path):
    """Two raw stream files named anything: roles are found by trying both labels."""
    client = obfs2.Obfs2(True)
    server = obfs2.Obfs2(False)
    c_wire, s_wire = client.start(), server.start()
    server.receive(c_wire)
    client.receive(s_wire)
    (tmp_path / "a.raw").write_bytes(s_wire + server.send(b"HTTP/1.1 200 OK\r\n\r\n"))
    (tmp_path / "b.raw").write_bytes(c_wire + client.send(b"GET / HTTP/1.1\r\n\r\n"))
    status, out, err = run("unmask", str(tmp_path / "a.raw"), str(tmp_path / "b.raw"))
    assert status == 0, err
    assert "|GET / HTTP/1.1..|" in out and "|HTTP/1.1 200 OK.|" in out
    status, out, err = run("unmask", str(tmp_path / "b.raw"))
    assert status == 1 and "Both directions are needed" in out


def test_not_obfs2_through_the_dummy_transport(tmp_path):
    request = b"GET /index.html HTTP/1.1\r\nHost: example.org\r\n\r\n"
    with EchoServer() as echo:
        server, client = tunnel("dummy", "--record-dir=" + str(tmp_path), dest=echo.address)
        with server, client:
            assert exchange(client, server, request) == request
    status, out, err = run("detect", str(tmp_path))
    assert status == 0, err
    assert out.count("not obfs2: it looks like HTTP") == 2 and "0 of 2 stream(s) are obfs2" in out
    status, out, err = run("unmask", *map(str, recordings(tmp_path, "client")))
    assert status == 1 and "not obfs2: it looks like HTTP" in out
    assert "shared secret" not in out


def test_shared_secret_recording_needs_the_secret(tmp_path):
    payload = CLIENT_HELLO * 3
    secret = ("--shared-secret=s3cret", "--ss-hash-iterations=1000")
    with EchoServer() as echo:
        server, client = tunnel("obfs2", *secret, "--record-dir=" + str(tmp_path), dest=echo.address)
        with server, client:
            assert exchange(client, server, payload) == payload
    files = list(map(str, recordings(tmp_path, "client")))

    status, out, err = run("unmask", *files)
    assert status == 1, out + err
    assert "the secret is needed" in out and "--shared-secret=SECRET" in out
    assert "4 x 100000 = 400000 SHA-256 per connection" in out

    status, out, err = run("unmask", *secret, *files)
    assert status == 0, err
    assert "every MAC below is 1000 rounds of SHA-256" in out
    assert "00000000  16 03 01 00 c8 01 00 00" in out
    assert "work: 6002 SHA-256" in out                # public try, secret try, then all 4 shown

    status, out, err = run("detect", *files)
    assert "not obfs2: no magic value under the public key schedule" in out
    status, out, err = run("detect", *secret, *files)
    assert "obfs2 with the shared secret" in out
    assert "work: 2002 SHA-256" in out                # public try + secret try, each side


# --- A pcap written by tcpdump on loopback -----------------------------------------------

def tcpdump_path():
    path = shutil.which("tcpdump") or next(
        (p for p in ("/usr/sbin/tcpdump", "/usr/bin/tcpdump") if Path(p).exists()), None)
    if path is None:
        if IN_CI:
            pytest.fail("tcpdump is not installed, but CI must install it (.ci/run)")
        pytest.skip("tcpdump is not installed (apt-get install tcpdump); CI installs it")
    return path


class Tcpdump:
    """tcpdump -w on loopback, ready once it says "listening on"."""

    def __init__(self, path, ports):
        interface = "lo" if sys.platform.startswith("linux") else "lo0"
        expression = " or ".join("tcp port %d" % port for port in ports)
        self.process = subprocess.Popen(
            [tcpdump_path(), "-i", interface, "-U", "-n", "-w", str(path), expression],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = LineReader(self.process.stderr)
        try:
            self.log.wait_for("listening on", timeout=20)
        except AssertionError as exc:
            self.process.kill()
            self.process.wait()
            if IN_CI:
                raise
            pytest.skip("tcpdump cannot capture here: %s" % exc)

    def stop(self):
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def wait_for_capture(path, expected, timeout=10):
    """Read the pcap until its connections carry ``expected`` bytes in all
    (tcpdump writes each packet as it sees it)."""
    end = time.monotonic() + timeout
    while True:
        try:
            _, conversations = capture.read_pcap(path)
            if sum(len(s) for c in conversations for s in c.streams) >= expected:
                return conversations
        except capture.CaptureError:
            pass                                      # a packet half written: read again
        if time.monotonic() > end:
            raise AssertionError("the capture did not reach %d bytes" % expected)
        time.sleep(0.05)


def test_tcpdump_capture_unmask_and_detect(tmp_path):
    pcap = tmp_path / "lo.pcap"
    payload = CLIENT_HELLO + os.urandom(300_000)      # many segments on loopback
    http = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"
    with EchoServer() as echo:
        server, client = tunnel("obfs2", "--record-dir=" + str(tmp_path / "rec"), dest=echo.address)
        with server, client:
            dump = Tcpdump(pcap, [server.address[1], echo.address[1]])
            try:
                assert exchange(client, server, payload) == payload
                with socket.create_connection(echo.address) as sock:   # plain HTTP: not obfs2
                    sock.sendall(http)
                    sock.shutdown(socket.SHUT_WR)
                    assert recv_all(sock) == http
                init, resp = recordings(tmp_path / "rec", "client")
                wire = len(init.read_bytes()) + len(resp.read_bytes())
                wait_for_capture(pcap, wire + 2 * len(payload) + 2 * len(http))
            finally:
                dump.stop()

    # The obfs2 connection, reassembled from the pcap, is byte for byte the recording.
    _, conversations = capture.read_pcap(pcap)
    tunnel_conv = [c for c in conversations if c.ends[1].endswith(":%d" % server.address[1])]
    assert len(tunnel_conv) == 1 and tunnel_conv[0].initiator == 0
    assert tunnel_conv[0].streams == (init.read_bytes(), resp.read_bytes())

    status, out, err = run("detect", str(pcap))
    assert status == 0, err
    assert "pcap 2.4, Ethernet" in out or "Linux cooked" in out
    assert "3 TCP connection(s) with data" in out
    assert out.count("obfs2: the initiator and responder magic") == 1
    assert "not obfs2: it looks like a TLS handshake record" in out   # server -> echo, in clear
    assert "not obfs2: it looks like HTTP" in out
    assert "1 of 3 stream(s) are obfs2" in out

    status, out, err = run("unmask", "--output-dir=" + str(tmp_path / "plain"), str(pcap))
    assert status == 0, err
    assert "00000000  16 03 01 00 c8 01 00 00  c4 03 03 00 01 02 03 04" in out
    plain = sorted((tmp_path / "plain").glob("connection-*.initiator-to-responder.bin"))
    assert [p.read_bytes() for p in plain] == [payload]


# --- pcaps built here --------------------------------------------------------------------

ETHERTYPE = {4: b"\x08\x00", 6: b"\x86\xdd"}


def ip(src, dst, segment, hop_by_hop=False):
    if ":" not in src:
        return struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(segment), 1, 0x4000, 64, 6, 0,
                           socket.inet_aton(src), socket.inet_aton(dst)) + segment
    extension = b""
    next_header = 6
    if hop_by_hop:                                    # next header 6, length 0 (8 bytes), PadN
        extension, next_header = b"\x06\x00\x01\x04\x00\x00\x00\x00", 0
    return struct.pack(">IHBB16s16s", 6 << 28, len(extension) + len(segment), next_header, 64,
                       socket.inet_pton(socket.AF_INET6, src),
                       socket.inet_pton(socket.AF_INET6, dst)) + extension + segment


def tcp(sport, dport, seq, flags, data=b""):
    # SPORT DPORT SEQ ACK OFFSET=5 FLAGS WINDOW CHECKSUM URGENT
    return struct.pack(">HHIIBBHHH", sport, dport, seq % 2 ** 32, 0, 5 << 4, flags, 65535, 0, 0) + data


def frame(linktype, packet):
    version = packet[0] >> 4
    if linktype == 1:                                 # Ethernet, with an 802.1Q tag on IPv6
        vlan = b"\x81\x00\x00\x07" if version == 6 else b""
        return b"\x02" * 6 + b"\x04" * 6 + vlan + ETHERTYPE[version] + packet
    if linktype == 0:                                 # BSD loopback: AF_INET 2, AF_INET6 30 (host order)
        return struct.pack("<I", 2 if version == 4 else 30) + packet
    if linktype == 113:                               # SLL: type, ARPHRD, addr len, addr(8), protocol
        return struct.pack(">HHH8s", 0, 772, 6, b"") + ETHERTYPE[version] + packet
    if linktype == 276:                               # SLL2: protocol, reserved, ifindex, ..., addr(8)
        return ETHERTYPE[version] + b"\x00" * 18 + packet
    return packet                                     # 101: raw IP


def pcap_file(frames, linktype, order="<", nano=False):
    out = struct.pack(order + "IHHiIII", 0xA1B23C4D if nano else 0xA1B2C3D4, 2, 4, 0, 0, 262144, linktype)
    for number, data in enumerate(frames):
        out += struct.pack(order + "IIII", 1700000000 + number, number, len(data), len(data)) + data
    return out


def obfs2_pair(request, reply, **options):
    client = obfs2.Obfs2(True, padlen=700, **options)
    server = obfs2.Obfs2(False, padlen=3, **options)
    c_wire, s_wire = client.start(), server.start()
    server.receive(c_wire)
    client.receive(s_wire)
    return c_wire + client.send(request), s_wire + server.send(reply)


def segments(rng, stream, isn, src, dst):
    """A stream cut into segments, shuffled, some retransmitted or overlapping."""
    cuts, position = [], 0
    while position < len(stream):
        size = rng.randint(1, 300)
        cuts.append((position, stream[position:position + size]))
        position += size
    extra = [rng.choice(cuts) for _ in range(5)]                         # retransmits
    for _ in range(3):                                                   # overlaps
        start = rng.randrange(len(stream))
        extra.append((start, stream[start:start + rng.randint(1, 500)]))
    packets = cuts + extra
    rng.shuffle(packets)
    return [(src, dst, isn + offset, 0x18, data) for offset, data in packets]


def conversation_frames(rng, linktype, client, server, c_stream, s_stream, with_syn=True, v6_ext=False):
    c_isn, s_isn = 0xFFFFFF00, 0x7FFFFFF0             # the client's sequence numbers wrap
    packets = []
    if with_syn:
        packets += [(client, server, c_isn, 0x02, b""), (server, client, s_isn, 0x12, b""),
                    (client, server, c_isn + 1, 0x10, b"")]
    data = segments(rng, c_stream, c_isn + 1, client, server) + \
        segments(rng, s_stream, s_isn + 1, server, client)
    rng.shuffle(data)
    if not with_syn:     # the capture began after the handshake; the first segment must start a stream
        data.sort(key=lambda p: p[2] not in (c_isn + 1, s_isn + 1))
    packets += data
    packets += [(client, server, c_isn + 1 + len(c_stream), 0x11, b""),
                (server, client, s_isn + 1 + len(s_stream), 0x11, b"")]
    return [frame(linktype, ip(src[0], dst[0], tcp(src[1], dst[1], seq, flags, payload), v6_ext))
            for src, dst, seq, flags, payload in packets]


REQUEST = b"GET /secret HTTP/1.1\r\nHost: bridge\r\n\r\n" * 20
REPLY = b"HTTP/1.1 200 OK\r\n\r\n" + bytes(range(256)) * 8


@pytest.mark.parametrize("linktype,order,nano", [(1, "<", False), (0, ">", True), (113, "<", True),
                                                 (276, ">", False), (101, "<", False)])
def test_crafted_pcap_reassembly(tmp_path, linktype, order, nano):
    rng = random.Random(linktype)
    c_stream, s_stream = obfs2_pair(REQUEST, REPLY)
    v6_client, v6_server = ("2001:db8::1", 40001), ("2001:db8::2", 443)
    frames = conversation_frames(rng, linktype, v6_client, v6_server, c_stream, s_stream,
                                 v6_ext=linktype == 101)
    http = b"GET / HTTP/1.1\r\nHost: example.org\r\n\r\n"
    v4_client, v4_server = ("192.0.2.1", 50000), ("198.51.100.2", 80)
    frames += conversation_frames(rng, linktype, v4_client, v4_server, http, b"HTTP/1.1 200 OK\r\n\r\n")
    path = tmp_path / "crafted.pcap"
    path.write_bytes(pcap_file(frames, linktype, order, nano))

    description, conversations = capture.read_pcap(path)
    assert capture.LINKTYPES[linktype] in description
    assert ("nanosecond" if nano else "microsecond") in description
    assert [c.name for c in conversations] == ["[2001:db8::1]:40001 -> [2001:db8::2]:443",
                                               "192.0.2.1:50000 -> 198.51.100.2:80"]
    assert conversations[0].streams == (c_stream, s_stream)
    assert conversations[0].notes == []

    status, text = run_capture("detect", path)
    assert status == 0
    assert "obfs2: the initiator and responder magic decrypts" in text
    assert "not obfs2: it looks like HTTP" in text

    status, text = run_capture("unmask", path, full=True)
    assert status == 0
    assert "|GET /secret HTTP|" in text and "|HTTP/1.1 200 OK.|" in text
    assert "not obfs2: it looks like HTTP" in text      # the second connection


def run_capture(command, *paths, full=False):
    """capture.main as the command line calls it: (status, printed text)."""
    out = io.StringIO()
    status = capture.main(command, [str(p) for p in paths], full=full, out=out)
    return status, out.getvalue()


def test_crafted_pcap_without_syn_finds_the_roles(tmp_path):
    rng = random.Random(7)
    c_stream, s_stream = obfs2_pair(REQUEST, REPLY)
    frames = conversation_frames(rng, 1, ("10.0.0.1", 1234), ("10.0.0.2", 443), c_stream, s_stream,
                                 with_syn=False)
    path = tmp_path / "nosyn.pcap"
    path.write_bytes(pcap_file(frames, 1))
    _, conversations = capture.read_pcap(path)
    assert conversations[0].initiator is None and set(conversations[0].streams) == {c_stream, s_stream}
    status, text = run_capture("unmask", path)
    assert status == 0 and "|GET /secret HTTP|" in text


def test_crafted_pcap_with_a_hole(tmp_path):
    c_stream, s_stream = obfs2_pair(REQUEST, REPLY)
    client, server = ("10.0.0.1", 1234), ("10.0.0.2", 443)
    packets = [(client, server, 100, 0x02, b""), (server, client, 900, 0x12, b""),
               (client, server, 101, 0x18, c_stream[:800]),
               (client, server, 101 + 900, 0x18, c_stream[900:]),              # 100 bytes missing
               (server, client, 901, 0x18, s_stream)]
    frames = [frame(1, ip(s[0], d[0], tcp(s[1], d[1], seq, flags, data)))
              for s, d, seq, flags, data in packets]
    path = tmp_path / "hole.pcap"
    path.write_bytes(pcap_file(frames, 1))
    status, text = run_capture("unmask", path)
    assert status == 0 and "stream has a hole after 800 bytes" in text


@pytest.fixture(scope="module")
def good_pcap():
    c_stream, s_stream = obfs2_pair(b"hello", b"world")
    frames = conversation_frames(random.Random(1), 1, ("10.0.0.1", 1), ("10.0.0.2", 2), c_stream, s_stream)
    return pcap_file(frames, 1)


def corruptions(good):
    first_record = 24
    bad_length = bytearray(good)
    bad_length[first_record + 8:first_record + 12] = struct.pack("<I", 0x7FFFFFF0)
    bad_link = bytearray(good)
    bad_link[20:24] = struct.pack("<I", 147)
    return {
        "empty": (b"", "not a pcap file"),
        "header cut": (good[:10], "truncated pcap: the file header has 10 of 24 bytes"),
        "record header cut": (good[:first_record + 7], "packet 1's record header"),
        "packet cut": (good[:-5], "of its"),
        "huge record": (bytes(bad_length), "corrupt pcap: packet 1"),
        "bad magic": (b"\x00\x11\x22\x33" + good[4:], "not a pcap file (magic 00112233)"),
        "pcapng": (b"\x0a\x0d\x0d\x0a" + good[4:], "pcapng is not supported"),
        "link type": (bytes(bad_link), "unsupported link type 147"),
    }


def test_truncated_and_corrupt_captures_give_one_clear_line(tmp_path, good_pcap):
    for name, (data, message) in corruptions(good_pcap).items():
        path = tmp_path / ("broken-%s.pcap" % name.replace(" ", "-"))
        path.write_bytes(data)
        for command in ("detect", "unmask"):
            status, out, err = run(command, str(path))
            assert status == 1, (name, out, err)
            assert "Traceback" not in err + out
            assert len(err.strip().splitlines()) == 1 and message in err, (name, err)
    status, out, err = run("detect", str(tmp_path / "missing.pcap"))
    assert status == 1 and "No such file" in err and "Traceback" not in err


def test_mangled_captures_never_raise(tmp_path, good_pcap):
    """Random damage inside packets and records: a report or a CaptureError, never a crash."""
    rng = random.Random(2024)
    path = tmp_path / "mangled.pcap"
    for _ in range(150):
        data = bytearray(good_pcap)
        for _ in range(rng.randint(1, 20)):
            data[rng.randrange(24, len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            del data[rng.randrange(24, len(data)):]
        path.write_bytes(bytes(data))
        for command in ("detect", "unmask"):
            assert run_capture(command, path)[0] in (0, 1)


def test_short_recording_is_too_short_to_tell(tmp_path):
    (tmp_path / "x.initiator.bin").write_bytes(b"\x01" * 10)
    (tmp_path / "x.responder.bin").write_bytes(b"")
    status, out, err = run("detect", str(tmp_path))
    assert status == 0 and "too short to tell" in out
    status, out, err = run("unmask", str(tmp_path))
    assert status == 1 and "too short to tell" in out and "Traceback" not in err


# --- docs/PROTOCOL.md ---------------------------------------------------------------------

def test_worked_example_in_the_docs_is_real():
    """The doc's worked example is the output of the script printed beside it."""
    doc = (ROOT / "docs" / "PROTOCOL.md").read_text(encoding="utf-8")
    script = re.search(r"<!-- worked-example-script -->\n```python\n(.*?)```", doc, re.S).group(1)
    shown = re.search(r"<!-- worked-example-output -->\n```\n(.*?)```", doc, re.S).group(1)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=str(ROOT), timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout == shown
