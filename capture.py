r"""The passive attack on obfs2, for teaching: ``unmask``, ``detect``, and ``--record-dir``.

obfs2 sends each side's seed in clear, and every key is a hash of the seeds.
So anyone who records a connection can do what the two ends did::

    capture (pcap, or the two files of --record-dir)
        |  read_pcap -> ip_packet -> tcp_segment      link layer, IPv4/IPv6, TCP
        |  TcpTable -> reassemble                     each direction in sequence order
        v
    Conversation: the bytes each side sent
        |  read_side: SEED = bytes 0..15 (clear); PAD key = MAC(label, SEED);
        |             decrypt bytes 16..23 -> MAGIC, PADLEN       (detect stops here:
        |                                                          one SHA-256, one AES block)
        |  unmask: data keys = MAC(label, INIT_SEED | RESP_SEED);
        v          decrypt everything after 24 + PADLEN
    the inner stream (for Tor: the TLS ClientHello the censor was looking for)

With a shared secret every MAC costs HASH_ITERATIONS SHA-256 instead of one,
and needs the secret. That is all the secret adds.

No sockets here: everything reads files or bytes. The recording side
(``Recorder``, ``record_to_dir``) is the transport wrapper behind
``--record-dir``; its file names are what ``load`` reads back.

Errors: ``CaptureError`` means the input cannot be read (truncated, corrupt,
unsupported); ``main`` prints it on one line and exits with status 1.
"""

import hashlib
import logging
import os
import socket
import struct
import sys
import time
from pathlib import Path

import obfs2
import transports

log = logging.getLogger("obfsproxy")

SHOW_BYTES = 512          # decrypted bytes shown per direction without --full


class CaptureError(Exception):
    """The capture cannot be read. The message is one line for the user."""


# --- Presentation, shared with demo.py -----------------------------------------

class Style:
    """ANSI colour for a terminal, plain text anywhere else.

    ``Style.for_stream(sys.stdout)`` colours only when the stream is a
    terminal, ``NO_COLOR`` is unset or empty (no-color.org) and TERM is not
    "dumb".
    """

    CODES = {"title": "1", "field": "1;36", "clear": "32", "wire": "33",
             "ok": "1;32", "bad": "1;31", "dim": "2"}

    def __init__(self, enabled=False):
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream):
        isatty = getattr(stream, "isatty", None)
        # The classic Windows console shows ANSI codes raw; Windows Terminal does not.
        ansi = sys.platform != "win32" or "WT_SESSION" in os.environ
        return cls(ansi and bool(isatty and isatty()) and not os.environ.get("NO_COLOR")
                   and os.environ.get("TERM") != "dumb")

    def __call__(self, kind, text):
        if not self.enabled:
            return text
        return "\x1b[%sm%s\x1b[0m" % (self.CODES[kind], text)


PLAIN = Style(False)


def duration(seconds):
    """'42 us', '12.3 ms' or '1.23 s'."""
    if seconds < 0.01:
        return "%.0f us" % (seconds * 1e6)
    return "%.1f ms" % (seconds * 1e3) if seconds < 1 else "%.2f s" % seconds


def hexline(data, limit=16):
    """'16 03 01 ...': the first ``limit`` bytes, spaced."""
    shown = " ".join("%02x" % b for b in data[:limit])
    return shown + (" ..." if len(data) > limit else "")


def hexdump(data, limit=None, indent="    "):
    """Offset, hex and ASCII, 16 bytes a line (like ``hexdump -C``)."""
    shown = data if limit is None else data[:limit]
    lines = []
    for offset in range(0, len(shown), 16):
        row = shown[offset:offset + 16]
        hexes = " ".join("%02x" % b for b in row[:8]) + "  " + " ".join("%02x" % b for b in row[8:])
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in row)
        lines.append("%s%08x  %-49s|%s|" % (indent, offset, hexes, text))
    if len(shown) < len(data):
        lines.append("%s... %d more bytes" % (indent, len(data) - len(shown)))
    return lines


def mac_formula(label, inputs, secret_hash):
    """The spec's formula for one key, as text."""
    if secret_hash is None:
        return 'MAC("%s", %s)' % (label.decode(), inputs)
    return 'H^n(s | %s | H(SECRET) | s), s = "%s"' % (inputs, label.decode())


def key_schedule(init_seed, resp_seed, secret_hash=None, iterations=obfs2.HASH_ITERATIONS):
    """The four keys of one connection, computed with obfs2.py's own functions.

    Returns rows (name, label, inputs, m, what it encrypts); m is the 32-byte
    MAC output: AES key = m[:16], CTR initial counter block = m[16:].
    """
    init_secret, resp_secret = obfs2.data_keys(init_seed, resp_seed, secret_hash, iterations)
    return [
        ("INIT_PAD", obfs2.INIT_PAD_LABEL, "INIT_SEED",
         obfs2.pad_key(init_seed, True, secret_hash, iterations),
         "the initiator's MAGIC, PADLEN and padding"),
        ("RESP_PAD", obfs2.RESP_PAD_LABEL, "RESP_SEED",
         obfs2.pad_key(resp_seed, False, secret_hash, iterations),
         "the responder's MAGIC, PADLEN and padding (RESP_SEED: spec erratum 1)"),
        ("INIT_SECRET", obfs2.INIT_DATA_LABEL, "INIT_SEED | RESP_SEED", init_secret,
         "all data initiator -> responder"),
        ("RESP_SECRET", obfs2.RESP_DATA_LABEL, "INIT_SEED | RESP_SEED", resp_secret,
         "all data responder -> initiator"),
    ]


def key_schedule_lines(rows, secret_hash=None, style=PLAIN):
    lines = []
    for name, label, inputs, m, purpose in rows:
        lines.append("  %s = %s" % (style("field", "%-11s" % name), mac_formula(label, inputs, secret_hash)))
        lines.append("                key %s  IV %s" % (style("wire", m[:16].hex()),
                                                        style("wire", m[16:].hex())))
        lines.append("                encrypts %s" % purpose)
    return lines


def header_lines(data, initiator, pad_m, style=PLAIN):
    """One side's handshake message, field by field: what crossed the wire and
    what it decrypts to with that side's PAD key ``pad_m`` (a key_schedule m)."""
    seed = bytes(data[:obfs2.SEED_LENGTH])
    wire = bytes(data[:obfs2.HEADER_LENGTH])
    clear = obfs2.ctr(pad_m).decrypt(wire[16:24])
    magic, padlen = struct.unpack(">II", clear)
    key = "INIT_PAD" if initiator else "RESP_PAD"
    magic_ok = magic == obfs2.MAGIC_VALUE
    verdict = style("ok", "= MAGIC_VALUE") if magic_ok else style("bad", "!= MAGIC_VALUE 2b f5 ca 7e")
    lines = [
        "    offset  length  field    on the wire                         meaning",
        "    %6d  %6d  %s  %s  the sender's seed, in clear"
        % (0, 16, style("field", "SEED   "), style("wire", "%-34s" % seed.hex())),
        "    %6d  %6d  %s  %s  E(%s) -> %s %s"
        % (16, 4, style("field", "MAGIC  "), style("wire", "%-34s" % hexline(wire[16:20])), key,
           hexline(clear[:4]), verdict),
        "    %6d  %6d  %s  %s  E(%s) -> %s = %d"
        % (20, 4, style("field", "PADLEN "), style("wire", "%-34s" % hexline(wire[20:24])), key,
           hexline(clear[4:]), padlen),
    ]
    if magic_ok and padlen <= obfs2.MAX_PADDING:
        padding = data[obfs2.HEADER_LENGTH:obfs2.HEADER_LENGTH + padlen]
        lines.append("    %6d  %6d  %s  %s  E(%s): random, dropped unread by the receiver"
                     % (24, padlen, style("field", "padding"),
                        style("wire", "%-34s" % (hexline(padding, 8) if padding else "(none)")), key))
        data_len = len(data) - obfs2.HEADER_LENGTH - padlen
        lines.append("    %6d  %6d  %s  %s  E(%s, application bytes)"
                     % (24 + padlen, max(data_len, 0), style("field", "data   "),
                        style("wire", "%-34s" % (hexline(data[24 + padlen:], 8) if data_len > 0
                                                 else "(none)")),
                        "INIT_SECRET" if initiator else "RESP_SECRET"))
    return lines


def looks_like(data):
    """A guess at a well-known protocol from its first bytes, for the report."""
    if data[:1] == b"\x16" and data[1:2] == b"\x03":
        return "a TLS handshake record"
    if data[:1] == b"\x17" and data[1:2] == b"\x03":
        return "TLS application data"
    if data.split(b" ", 1)[0] in (b"GET", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS",
                                   b"CONNECT") or data.startswith(b"HTTP/"):
        return "HTTP"
    if data.startswith(b"SSH-"):
        return "SSH"
    if data[:1] == b"\x05" and len(data) < 64:
        return "SOCKS5"
    if data and sum(32 <= b < 127 or b in (9, 10, 13) for b in data[:64]) == len(data[:64]):
        return "plain text"
    return None


# --- pcap files -------------------------------------------------------------------

PCAP_MAGICS = {            # magic as stored -> (struct byte order, timestamp unit)
    b"\xd4\xc3\xb2\xa1": ("<", "microsecond"), b"\xa1\xb2\xc3\xd4": (">", "microsecond"),
    b"\x4d\x3c\xb2\xa1": ("<", "nanosecond"), b"\xa1\xb2\x3c\x4d": (">", "nanosecond"),
}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"
LINKTYPES = {0: "BSD loopback", 1: "Ethernet", 101: "raw IP", 108: "OpenBSD loopback",
             113: "Linux cooked (SLL)", 228: "raw IPv4", 229: "raw IPv6",
             276: "Linux cooked v2 (SLL2)"}
MAX_RECORD = 1 << 24      # a record longer than this is corruption, not a packet


class Pcap:
    """A classic pcap file (what ``tcpdump -w`` writes): header, then records.

    Iterate for each packet's frame bytes; ``packets`` counts them. Raises CaptureError on a
    truncated or corrupt file; pcapng is recognised and refused.
    """

    def __init__(self, path):
        self.path = Path(path)
        self._file = self.path.open("rb")
        header = self._file.read(24)
        if header[:4] == PCAPNG_MAGIC:
            self._file.close()
            raise CaptureError("pcapng is not supported; convert it with "
                               "`tcpdump -r FILE -w out.pcap` or `editcap -F pcap FILE out.pcap`")
        if header[:4] not in PCAP_MAGICS:
            self._file.close()
            raise CaptureError("not a pcap file (magic %s)" % (header[:4].hex() or "missing: empty file"))
        if len(header) < 24:
            self._file.close()
            raise CaptureError("truncated pcap: the file header has %d of 24 bytes" % len(header))
        self._order, self.resolution = PCAP_MAGICS[header[:4]]
        major, minor, _, _, self.snaplen, network = struct.unpack(self._order + "HHiIII", header[4:])
        self.linktype = network & 0x0FFFFFFF      # the high bits carry FCS information
        if self.linktype not in LINKTYPES:
            self._file.close()
            raise CaptureError("unsupported link type %d (have: %s)" % (
                self.linktype, ", ".join("%d %s" % item for item in sorted(LINKTYPES.items()))))
        self.version = "%d.%d" % (major, minor)
        self.packets = 0

    def __iter__(self):
        with self._file:
            offset = 24
            while True:
                number = self.packets + 1
                record = self._file.read(16)
                if not record:
                    return
                if len(record) < 16:
                    raise CaptureError("truncated pcap: packet %d's record header at byte %d "
                                       "has %d of 16 bytes" % (number, offset, len(record)))
                _, _, incl_len, orig_len = struct.unpack(self._order + "IIII", record)
                if incl_len > max(self.snaplen, 262144, orig_len) or incl_len > MAX_RECORD:
                    raise CaptureError("corrupt pcap: packet %d at byte %d claims %d bytes"
                                       % (number, offset, incl_len))
                frame = self._file.read(incl_len)
                if len(frame) < incl_len:
                    raise CaptureError("truncated pcap: packet %d at byte %d has %d of its %d bytes"
                                       % (number, offset, len(frame), incl_len))
                offset += 16 + incl_len
                self.packets = number
                yield frame


def ip_packet(linktype, frame):
    """The IPv4 or IPv6 packet inside one link-layer frame, or None."""
    if linktype == 1:                                  # Ethernet: dst(6) src(6) type(2)
        offset, ethertype = 14, frame[12:14]
        while ethertype in (b"\x81\x00", b"\x88\xa8"):  # 802.1Q / 802.1ad VLAN tags
            ethertype, offset = frame[offset + 2:offset + 4], offset + 4
        if ethertype not in (b"\x08\x00", b"\x86\xdd"):
            return None
    elif linktype == 113:                              # SLL: ... protocol(2) at 14
        offset = 16 if frame[14:16] in (b"\x08\x00", b"\x86\xdd") else None
    elif linktype == 276:                              # SLL2: protocol(2) at 0, 20 bytes
        offset = 20 if frame[0:2] in (b"\x08\x00", b"\x86\xdd") else None
    elif linktype in (0, 108):                         # a 4-byte address family
        offset = 4
    else:                                              # raw IP
        offset = 0
    if offset is None or len(frame) <= offset or frame[offset] >> 4 not in (4, 6):
        return None
    return frame[offset:]


class Segment:
    __slots__ = ("src", "dst", "seq", "flags", "payload", "cut")

    def __init__(self, src, dst, seq, flags, payload, cut):
        self.src, self.dst, self.seq, self.flags = src, dst, seq, flags
        self.payload, self.cut = payload, cut


SYN, ACK = 0x02, 0x10


def tcp_segment(packet):
    """The TCP segment in one IP packet, or None. ValueError when malformed.

    IPv4: header length IHL*4, total length at 2, protocol at 9, addresses at
    12 and 16. IPv6: payload length at 4, next header at 6, addresses at 8 and
    24; extension headers are skipped. Fragments are not reassembled (TCP
    avoids them; loopback never makes them): they are skipped.
    """
    if packet[0] >> 4 == 4:
        ihl = (packet[0] & 0x0F) * 4
        if ihl < 20 or len(packet) < ihl:
            raise ValueError("bad IPv4 header length")
        total, fragment = struct.unpack(">H2xH", packet[2:8])
        if packet[9] != 6 or fragment & 0x3FFF:        # not TCP, or MF / fragment offset set
            return None
        src = socket.inet_ntop(socket.AF_INET, packet[12:16])
        dst = socket.inet_ntop(socket.AF_INET, packet[16:20])
        start, end = ihl, total or len(packet)         # total 0: a TSO packet, as captured
    else:
        if len(packet) < 40:
            raise ValueError("short IPv6 header")
        end = 40 + (struct.unpack(">H", packet[4:6])[0] or len(packet) - 40)
        next_header, start = packet[6], 40
        while next_header in (0, 43, 60):              # hop-by-hop, routing, destination options
            if len(packet) < start + 2:
                raise ValueError("short IPv6 extension header")
            next_header, start = packet[start], start + (packet[start + 1] + 1) * 8
        if next_header != 6:                           # not TCP, or a fragment (44)
            return None
        src = socket.inet_ntop(socket.AF_INET6, packet[8:24])
        dst = socket.inet_ntop(socket.AF_INET6, packet[24:40])
    if end < start + 20 or len(packet) < start + 20:
        raise ValueError("short TCP header")
    tcp = packet[start:end]
    sport, dport, seq, _, offset_byte, flags = struct.unpack(">HHIIBB", tcp[:14])
    data_offset = (offset_byte >> 4) * 4
    if data_offset < 20 or data_offset > len(tcp):
        raise ValueError("bad TCP data offset")
    return Segment((src, sport), (dst, dport), seq, flags, bytes(tcp[data_offset:]),
                   cut=len(packet) < end)


def reassemble(segments, first_seq=None):
    """One direction's bytes in sequence order, from (seq, payload) pairs in
    capture order: out-of-order segments are placed by sequence number,
    retransmits and overlaps are dropped (the first copy wins).

    ``first_seq`` is the sequence number of the first data byte (SYN + 1) when
    the SYN was captured; otherwise the lowest sequence number seen starts the
    stream. Returns (bytes, complete): complete is False at a hole, where the
    capture missed a segment; the bytes stop there.
    """
    if not segments:
        return b"", True
    origin = segments[0][0] if first_seq is None else first_seq

    def offset(seq):          # signed distance from origin, modulo 2**32 (seq wraps)
        return (seq - origin + 0x80000000) % 0x100000000 - 0x80000000

    placed = sorted(((offset(seq), payload) for seq, payload in segments), key=lambda item: item[0])
    start = 0 if first_seq is not None else placed[0][0]
    out = bytearray()
    for position, payload in placed:
        position -= start
        if position + len(payload) <= len(out):
            continue                                   # a retransmit of bytes we have
        if position > len(out):
            return bytes(out), False                   # a hole: bytes missing from the capture
        out += payload[len(out) - position:]
    return bytes(out), True


class Conversation:
    """The bytes both sides of one TCP connection sent, ready for analysis.

    ``ends`` names the two sides, ``streams`` holds what each side sent, and
    ``initiator`` is 0 or 1 when we know who opened the connection (a captured
    SYN, or a recording's file name), else None and both roles are tried.
    """

    def __init__(self, name, ends, streams, initiator=None, notes=()):
        self.name, self.ends, self.streams = name, ends, streams
        self.initiator = initiator
        self.notes = list(notes)


def _endpoint(address):
    host, port = address
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


class TcpTable:
    """TCP connections in a capture, keyed by their two endpoints."""

    def __init__(self):
        self.connections = []
        self._current = {}

    def add(self, segment):
        key = tuple(sorted((segment.src, segment.dst)))
        conn = self._current.get(key)
        syn_only = segment.flags & (SYN | ACK) == SYN
        if conn is not None and syn_only and \
                conn["first_seq"][conn["ends"].index(segment.src)] != (segment.seq + 1) % 2 ** 32:
            conn = None                                # a new connection on the same ports
        if conn is None:
            conn = {"ends": (segment.src, segment.dst), "initiator": None,
                    "first_seq": [None, None], "segments": ([], []), "cut": 0}
            self._current[key] = conn
            self.connections.append(conn)
        side = conn["ends"].index(segment.src)
        seq = segment.seq
        if segment.flags & SYN:
            seq = (seq + 1) % 2 ** 32                  # the SYN takes one sequence number
            conn["first_seq"][side] = seq
            if syn_only:
                conn["initiator"] = side
        if segment.payload:
            conn["segments"][side].append((seq, segment.payload))
        conn["cut"] += segment.cut

    def conversations(self):
        for conn in self.connections:
            if not any(conn["segments"]):
                continue
            streams, notes = [], []
            for side in (0, 1):
                data, complete = reassemble(conn["segments"][side], conn["first_seq"][side])
                streams.append(data)
                if not complete:
                    notes.append("%s's stream has a hole after %d bytes: segments are missing "
                                 "from the capture" % (_endpoint(conn["ends"][side]), len(data)))
            if conn["cut"]:
                notes.append("%d packet(s) were cut at the capture's snapshot length" % conn["cut"])
            ends = tuple(_endpoint(end) for end in conn["ends"])
            if conn["initiator"] == 1:
                ends, streams = ends[::-1], streams[::-1]
            initiator = None if conn["initiator"] is None else 0
            arrow = "->" if initiator == 0 else "<->"
            yield Conversation("%s %s %s" % (ends[0], arrow, ends[1]), ends, tuple(streams),
                               initiator, notes)


def read_pcap(path):
    """(description, conversations) of one pcap file."""
    pcap = Pcap(path)
    table = TcpTable()
    malformed = 0
    for frame in pcap:
        packet = ip_packet(pcap.linktype, frame)
        if packet is None:
            continue
        try:
            segment = tcp_segment(packet)
        except (ValueError, struct.error, IndexError):
            malformed += 1
            continue
        if segment is not None:
            table.add(segment)
    conversations = list(table.conversations())
    description = "%s: pcap %s, %s, %s timestamps, %d packets, %d TCP connection(s) with data" % (
        path, pcap.version, LINKTYPES[pcap.linktype], pcap.resolution, pcap.packets, len(conversations))
    if malformed:
        description += "; %d malformed packet(s) skipped" % malformed
    return description, conversations


# --- Recordings (--record-dir) ----------------------------------------------------
#
# Each connection makes two files that share a prefix:
#     <YYYYmmdd-HHMMSS>-<client|server>-<pid>-<n>.initiator.bin   bytes the initiator sent
#     <YYYYmmdd-HHMMSS>-<client|server>-<pid>-<n>.responder.bin   bytes the responder sent
# "client" or "server" says which end recorded them; both see the same bytes.



ROLE_SUFFIXES = transports.ROLE_SUFFIXES


def read_recordings(paths):
    """Conversations from recording files: pairs named <prefix>.initiator.bin
    and <prefix>.responder.bin; otherwise two files are one connection with
    unknown roles, and one file is one direction."""
    pairs, loose = {}, []
    for path in paths:
        for role, suffix in enumerate(ROLE_SUFFIXES):
            if path.name.endswith(suffix):
                pairs.setdefault(str(path)[:-len(suffix)], [None, None])[role] = path
                break
        else:
            loose.append(path)
    groups = [(Path(prefix).name, files, 0) for prefix, files in sorted(pairs.items())]
    if len(loose) == 2:
        groups.append(("%s + %s" % (loose[0].name, loose[1].name), loose, None))
    elif loose:
        groups.extend((path.name, [path, None], None) for path in loose)
    conversations = []
    for name, files, initiator in groups:
        streams = tuple(path.read_bytes() if path else b"" for path in files)
        ends = ("initiator", "responder") if initiator == 0 else \
            tuple(path.name if path else "(missing)" for path in files)
        notes = ["only one direction was recorded: %s is missing" % ("initiator", "responder")[side]
                 for side, path in enumerate(files) if path is None and initiator == 0]
        conversations.append(Conversation(name, ends, streams, initiator, notes))
    return conversations


def load(paths):
    """(descriptions, conversations) from capture arguments: pcap files,
    recording files, or directories of recordings."""
    descriptions, conversations, recordings = [], [], []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.name.endswith(ROLE_SUFFIXES))
            if not found:
                raise CaptureError("%s: no recordings (*.initiator.bin, *.responder.bin) in this "
                                   "directory" % path)
            recordings.extend(found)
            continue
        with path.open("rb") as f:
            magic = f.read(4)
        if magic in PCAP_MAGICS or magic == PCAPNG_MAGIC or path.suffix in (".pcap", ".cap", ".pcapng"):
            try:
                description, found = read_pcap(path)
            except CaptureError as exc:
                raise CaptureError("%s: %s" % (path, exc))
            descriptions.append(description)
            conversations.extend(found)
        else:
            recordings.append(path)
    if recordings:
        found = read_recordings(recordings)
        descriptions.append("%d recording file(s): %d connection(s)" % (len(recordings), len(found)))
        conversations.extend(found)
    return descriptions, conversations


# --- The attack ------------------------------------------------------------------

class Work:
    """What an analysis cost: SHA-256 applications, AES blocks, time."""

    def __init__(self):
        self.hashes = self.aes_blocks = 0
        self.seconds = 0.0

    def mac(self, secret_hash, iterations):
        self.hashes += 1 if secret_hash is None else iterations

    def __str__(self):
        return "%d SHA-256, %d AES block(s), %s" % (self.hashes, self.aes_blocks,
                                                    duration(self.seconds))


class Side:
    """What the first 24 bytes of one direction told us."""

    def __init__(self, data):
        self.data = data
        self.initiator = None     # True / False once a PAD key decrypted the magic
        self.seed = self.padlen = None
        self.secret = False       # the magic needed the shared secret


def read_side(data, roles, secret_hash, iterations, work):
    """Try to read an obfs2 handshake at the start of ``data``, for each
    possible sender role in turn: derive the PAD key from the clear seed,
    decrypt MAGIC and PADLEN, compare. One SHA-256 and one AES block a try
    (HASH_ITERATIONS SHA-256 with a shared secret)."""
    side = Side(data)
    if len(data) < obfs2.HEADER_LENGTH:
        return side
    schedules = [(None, False)] + ([(secret_hash, True)] if secret_hash is not None else [])
    start = time.perf_counter()
    for key_hash, with_secret in schedules:
        for initiator in roles:
            work.mac(key_hash, iterations)
            work.aes_blocks += 1
            seed, magic, padlen, _ = obfs2.read_header(data, initiator, key_hash, iterations)
            if magic == obfs2.MAGIC_VALUE and padlen <= obfs2.MAX_PADDING:
                side.initiator, side.seed, side.padlen, side.secret = initiator, seed, padlen, with_secret
                work.seconds += time.perf_counter() - start
                return side
    work.seconds += time.perf_counter() - start
    return side


def examine(conv, secret_hash=None, iterations=obfs2.HASH_ITERATIONS):
    """(sides, work): each direction's handshake, if it has one."""
    work = Work()
    sides = []
    for index, data in enumerate(conv.streams):
        roles = (True, False) if conv.initiator is None else (index == conv.initiator,)
        sides.append(read_side(data, roles, secret_hash, iterations, work))
    return sides, work


def verdict(sides, secret_tried=False):
    """(is_obfs2, one line of explanation)."""
    long_enough = [side for side in sides if len(side.data) >= obfs2.HEADER_LENGTH]
    found = [side for side in long_enough if side.initiator is not None]
    secret = " with the shared secret" if any(side.secret for side in found) else ""
    if not long_enough:
        return False, "too short to tell: fewer than 24 bytes each way"
    if found and len(found) == len(long_enough):
        roles = " and ".join("initiator" if side.initiator else "responder" for side in found)
        return True, "obfs2%s: the %s magic decrypts to 2b f5 ca 7e" % (secret, roles)
    if found:
        return True, "obfs2%s on one side only; the other side is not obfs2 (a probe?)" % secret
    guesses = sorted({looks_like(side.data) for side in long_enough} - {None})
    if guesses:
        return False, "not obfs2: it looks like %s" % " / ".join(guesses)
    return False, "not obfs2: no magic value under the public key schedule%s" % (
        " nor under the given shared secret" if secret_tried else "")


def hash_rate():
    """SHA-256 per second on this machine, measured briefly."""
    data, rounds = b"\0" * 32, 5000
    start = time.perf_counter()
    for _ in range(rounds):
        data = hashlib.sha256(data).digest()
    return rounds / max(time.perf_counter() - start, 1e-9)


def cost_lines(iterations):
    """What the shared secret costs a censor, in SHA-256 and in time here."""
    rate = hash_rate()
    return [
        "The shared secret is obfs2's only protection against this. Its cost for a censor:",
        "  knowing the secret (it is in the bridge line): 4 x %d = %d SHA-256 per connection "
        "to unmask it (about %.2f s of one core here); %d to detect it."
        % (iterations, 4 * iterations, 4 * iterations / rate, iterations),
        "  not knowing it: a guess costs %d SHA-256 against one connection's first 24 bytes."
        % iterations,
    ]


# --- Commands ----------------------------------------------------------------------

def run_detect(conversations, secret_hash, iterations, out):
    total = Work()
    count = 0
    for number, conv in enumerate(conversations, 1):
        sides, work = examine(conv, secret_hash, iterations)
        is_obfs2, why = verdict(sides, secret_hash is not None)
        count += is_obfs2
        total.hashes += work.hashes
        total.aes_blocks += work.aes_blocks
        total.seconds += work.seconds
        print("stream %d  %s  (%d / %d bytes)" % (number, conv.name, len(conv.streams[0]),
                                                  len(conv.streams[1])), file=out)
        print("  %s" % why, file=out)
        print("  work: %s" % work, file=out)
        for note in conv.notes:
            print("  note: %s" % note, file=out)
    print(file=out)
    print("%d of %d stream(s) are obfs2; all the checks together cost %s." % (
        count, len(conversations), total), file=out)
    if secret_hash is None:
        print("Each check derives a PAD key from the clear seed (one SHA-256) and decrypts "
              "8 bytes (one AES block): obfs2 is trivially detectable.", file=out)
    return 0


def unmask_one(conv, secret_hash, iterations, full, output_dir, number, out):
    """Print one connection's handshakes, keys and decrypted streams.
    Returns True when it could be unmasked."""
    def say(line=""):
        print(line, file=out)

    say("== connection %d: %s ==" % (number, conv.name))
    for note in conv.notes:
        say("note: %s" % note)
    sides, work = examine(conv, secret_hash, iterations)
    found = [side for side in sides if side.initiator is not None]
    if len(found) < 2 or found[0].initiator == found[1].initiator:
        is_obfs2, why = verdict(sides, secret_hash is not None)
        say(why if not is_obfs2 else "cannot unmask: " + why)
        if not found and secret_hash is None and not any(looks_like(s.data) for s in sides):
            say("If this tunnel used a shared secret, the secret is needed: give it with "
                "--shared-secret=SECRET (and --ss-hash-iterations=N unless it used %d)." % iterations)
            for line in cost_lines(iterations):
                say(line)
        elif len(found) == 1 and not all(conv.streams):
            say("Both directions are needed: the data keys hash both seeds.")
        return False

    # Both seeds are in clear: derive what both ends derived (obfs2.py's own functions).
    init, resp = sorted(found, key=lambda side: not side.initiator)
    key_hash = secret_hash if init.secret else None
    start = time.perf_counter()
    rows = key_schedule(init.seed, resp.seed, key_hash, iterations)
    work.seconds += time.perf_counter() - start
    for _ in rows:
        work.mac(key_hash, iterations)
    if key_hash is not None:
        say("shared secret: every MAC below is %d rounds of SHA-256 over s | x | H(SECRET) | s"
            % iterations)
    for side, row, direction in ((init, rows[0], "initiator -> responder"),
                                 (resp, rows[1], "responder -> initiator")):
        say("%s: %d bytes on the wire" % (direction, len(side.data)))
        for line in header_lines(side.data, side.initiator, row[3]):
            say(line)
    say("key schedule, recomputed from the two seeds in clear:")
    for line in key_schedule_lines(rows, key_hash):
        say(line)
    for side, row, direction in ((init, rows[2], "initiator-to-responder"),
                                 (resp, rows[3], "responder-to-initiator")):
        start = time.perf_counter()
        ciphertext = side.data[obfs2.HEADER_LENGTH + side.padlen:]
        plaintext = obfs2.ctr(row[3]).decrypt(ciphertext)
        work.seconds += time.perf_counter() - start
        work.aes_blocks += (len(ciphertext) + 15) // 16
        guess = looks_like(plaintext)
        say("%s, decrypted with %s: %d bytes%s" % (
            direction.replace("-to-", " -> "), row[0], len(plaintext),
            " (it looks like %s)" % guess if guess else ""))
        for line in hexdump(plaintext, None if full else SHOW_BYTES):
            say(line)
        if len(plaintext) > SHOW_BYTES and not full:
            say("    (--full prints everything; --output-dir=DIR writes it to files)")
        if output_dir:
            target = Path(output_dir) / ("connection-%d.%s.bin" % (number, direction))
            Path(output_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(str(target), os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                         | getattr(os, "O_BINARY", 0), 0o600)
            with os.fdopen(fd, "wb") as f:  # decrypted traffic: owner-only
                f.write(plaintext)
            say("    written to %s" % target)
    say("work: %s" % work)
    return True


def main(command, paths, secret=None, iterations=obfs2.HASH_ITERATIONS, full=False,
         output_dir=None, state_dir=None, out=None):
    """``obfsproxy.py unmask|detect [options] <capture>...``: 0 on success,
    1 when the capture cannot be read (or, for unmask, nothing could be
    unmasked)."""
    out = out or sys.stdout
    secret_hash = hashlib.sha256(secret.encode()).digest() if secret else None  # "" is none, as in obfs2.py
    obfs2.read_header(bytes(obfs2.HEADER_LENGTH), True)   # warm up: time the checks, not the imports
    try:
        descriptions, conversations = load(paths)
        for description in descriptions:
            print(description, file=out)
        print(file=out)
        if command == "detect":
            return run_detect(conversations, secret_hash, iterations, out)
        if output_dir:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
        unmasked = 0
        for number, conv in enumerate(conversations, 1):
            if number > 1:
                print(file=out)
            unmasked += unmask_one(conv, secret_hash, iterations, full,
                                   output_dir, number, out)
        if not conversations:
            print("no TCP connection with data in the capture", file=out)
        return 0 if unmasked else 1
    except CaptureError as exc:
        print("obfsproxy.py %s: %s" % (command, exc), file=sys.stderr)
        return 1
    except OSError as exc:
        print("obfsproxy.py %s: %s: %s" % (command, exc.filename or "", exc.strerror or exc),
              file=sys.stderr)
        return 1
