"""The capture readers: what ``unmask`` and ``detect`` analyse, as bytes. No analysis here.

::

    a pcap file (tcpdump -w)                     the files of --record-dir
        |  Pcap: header, then (time, frame)          <prefix>.initiator.bin
        |  ip_packet: link layer -> IPv4/IPv6        <prefix>.responder.bin
        |  tcp_segment: the TCP header                   |
        |  TcpTable: segments by connection              |  read_recordings
        |  reassemble: each direction in order           |
        v                                                v
    Conversation: the bytes each side sent, who opened the connection (if known),
                  each side's first TCP payload (a pcap only), notes on what is missing

``load(paths)`` takes the command line's capture arguments (pcap files, recording
files, directories of recordings) and returns (descriptions, conversations).

Errors: ``CaptureError`` means the input cannot be read (truncated, corrupt,
unsupported, not a capture); its message is one line for the user. Nothing
here prints, and nothing writes.
"""

import re
import socket
import struct
import time
from pathlib import Path

from outbound import format_address
from transports import ROLE_SUFFIXES


class CaptureError(Exception):
    """The capture cannot be read. The message is one line for the user."""


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

    Iterate for each packet's (time in unix seconds, frame bytes); ``packets`` counts them.
    Raises CaptureError on a truncated or corrupt file; pcapng is recognised and refused.
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
        self._fraction = 1e-9 if self.resolution == "nanosecond" else 1e-6
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
                seconds, fraction, incl_len, orig_len = struct.unpack(self._order + "IIII", record)
                if incl_len > max(self.snaplen, 262144, orig_len) or incl_len > MAX_RECORD:
                    raise CaptureError("corrupt pcap: packet %d at byte %d claims %d bytes"
                                       % (number, offset, incl_len))
                frame = self._file.read(incl_len)
                if len(frame) < incl_len:
                    raise CaptureError("truncated pcap: packet %d at byte %d has %d of its %d bytes"
                                       % (number, offset, len(frame), incl_len))
                offset += 16 + incl_len
                self.packets = number
                yield seconds + fraction * self._fraction, frame


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


def _placed(segments, first_seq=None):
    """(offset from the stream's first byte, payload) for each (seq, payload), in capture
    order. ``first_seq``: the first data byte's sequence number (SYN + 1) when the SYN
    was captured; otherwise the lowest sequence number seen starts the stream."""
    origin = segments[0][0] if first_seq is None else first_seq

    def offset(seq):          # signed distance from origin, modulo 2**32 (seq wraps)
        return (seq - origin + 0x80000000) % 0x100000000 - 0x80000000

    placed = [(offset(seq), payload) for seq, payload in segments]
    if first_seq is None:
        start = min(position for position, _ in placed)
        placed = [(position - start, payload) for position, payload in placed]
    return placed


def reassemble(segments, first_seq=None):
    """One direction's bytes in sequence order, from (seq, payload) pairs in
    capture order: out-of-order segments are placed by sequence number,
    retransmits and overlaps are dropped (the first copy wins).

    Returns (bytes, complete): complete is False at a hole, where the capture
    missed a segment; the bytes stop there. (``_placed`` says where a stream starts.)
    """
    if not segments:
        return b"", True
    out = bytearray()
    for position, payload in sorted(_placed(segments, first_seq), key=lambda item: item[0]):
        if position + len(payload) <= len(out):
            continue                                   # a retransmit of bytes we have
        if position > len(out):
            return bytes(out), False                   # a hole: bytes missing from the capture
        out += payload[len(out) - position:]
    return bytes(out), True


def first_payload(segments, first_seq=None):
    """The payload of the segment that starts the stream (the first captured copy):
    the packet a censor's first-packet test looks at. None if it was not captured."""
    if not segments:
        return None
    return next((payload for position, payload in _placed(segments, first_seq) if position == 0), None)


class Conversation:
    """The bytes both sides of one TCP connection sent, ready for analysis.

    ``ends`` names the two sides, ``streams`` holds what each side sent, and
    ``initiator`` is 0 or 1 when we know who opened the connection (a captured
    SYN, or a recording's file name), else None and both roles are tried.
    ``first_packets``: each side's first TCP payload (None: packet boundaries are
    not known, as in a recording). ``time``: unix time of its first packet (a
    recording: its file's modification time), or None. ``timeline``: each captured
    segment with data, in capture order, as (time, side, first byte's offset in that
    side's stream, offset after its last byte), side 0 for ``ends[0]`` (retransmits too:
    a censor sees them); None for a recording, which keeps no packets. ``flow`` and
    ``packets`` are views of it.
    """

    def __init__(self, name, ends, streams, initiator=None, notes=(), first_packets=(None, None),
                 time=None, timeline=None):
        self.name, self.ends, self.streams = name, ends, streams
        self.initiator = initiator
        self.notes = list(notes)
        self.first_packets = tuple(first_packets)
        self.time = time
        self.timeline = timeline

    @property
    def flow(self):
        """[(time, side, bytes)] of each packet that carried data (empty for a recording)."""
        return [(when, side, end - start) for when, side, start, end in self.timeline or ()]

    @property
    def packets(self):
        """Each side's packets with data, [(time, bytes)], or None for a recording."""
        if self.timeline is None:
            return None
        return tuple([(when, size) for when, side, size in self.flow if side == index]
                     for index in (0, 1))

    def role_name(self, index):
        """'initiator', or '127.0.0.1:5000 (initiator)' when the capture names the ends."""
        role = "initiator" if index == (self.initiator or 0) else "responder"
        if self.initiator is None:
            role = "taken as the " + role
        end = self.ends[index]
        return role if end in ("initiator", "responder") else "%s (%s)" % (end, role)

    def client_first(self):
        """(what the initiator sent, what the responder sent); the first side seen when
        nobody knows who opened the connection."""
        first = self.initiator or 0
        return self.streams[first], self.streams[1 - first]


class TcpTable:
    """TCP connections in a capture, keyed by their two endpoints."""

    def __init__(self):
        self.connections = []
        self._current = {}

    def add(self, segment, when=None):
        key = tuple(sorted((segment.src, segment.dst)))
        conn = self._current.get(key)
        syn_only = segment.flags & (SYN | ACK) == SYN
        if conn is not None and syn_only and \
                conn["first_seq"][conn["ends"].index(segment.src)] != (segment.seq + 1) % 2 ** 32:
            conn = None                                # a new connection on the same ports
        if conn is None:
            conn = {"ends": (segment.src, segment.dst), "initiator": None, "time": when,
                    "first_seq": [None, None], "segments": ([], []), "cut": 0, "order": []}
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
            conn["order"].append((when, side, len(conn["segments"][side])))
            conn["segments"][side].append((seq, segment.payload))
        conn["cut"] += segment.cut

    def conversations(self):
        for conn in self.connections:
            if not any(conn["segments"]):
                continue
            streams, notes, firsts = [], [], []
            for side in (0, 1):
                data, complete = reassemble(conn["segments"][side], conn["first_seq"][side])
                streams.append(data)
                firsts.append(first_payload(conn["segments"][side], conn["first_seq"][side]))
                if not complete:
                    notes.append("%s's stream has a hole after %d bytes: segments are missing "
                                 "from the capture" % (format_address(conn["ends"][side]), len(data)))
            if conn["cut"]:
                notes.append("%d packet(s) were cut at the capture's snapshot length" % conn["cut"])
            ends = tuple(format_address(end) for end in conn["ends"])
            timeline = _timeline(conn)
            if conn["initiator"] == 1:
                ends, streams, firsts = ends[::-1], streams[::-1], firsts[::-1]
                timeline = [(when, 1 - side, start, end) for when, side, start, end in timeline]
            initiator = None if conn["initiator"] is None else 0
            arrow = "->" if initiator == 0 else "<->"
            yield Conversation("%s %s %s" % (ends[0], arrow, ends[1]), ends, tuple(streams),
                               initiator, notes, firsts, conn["time"], timeline)


def _timeline(conn):
    """[(time, side, start, end)] of a connection's segments with data, in capture order,
    with offsets in each side's stream as ``reassemble`` places them."""
    placed = [_placed(segments, first_seq) if segments else []
              for segments, first_seq in zip(conn["segments"], conn["first_seq"])]
    return [(when, side, placed[side][index][0], placed[side][index][0] + len(placed[side][index][1]))
            for when, side, index in conn["order"]]


def read_pcap(path):
    """(description, conversations) of one pcap file."""
    pcap = Pcap(path)
    table = TcpTable()
    malformed = 0
    for when, frame in pcap:
        packet = ip_packet(pcap.linktype, frame)
        if packet is None:
            continue
        try:
            segment = tcp_segment(packet)
        except (ValueError, struct.error, IndexError):
            malformed += 1
            continue
        if segment is not None:
            table.add(segment, when)
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
# The suffixes are transports.ROLE_SUFFIXES: RecordDir writes what this reads.
# The time in the name is when the connection began, in the recording machine's local
# time: unmask matches obfs4's epoch hour from it (searching 72 hours each way, which
# absorbs any time zone), so a recording copied elsewhere, days later, still reads.

RECORDING_TIME = re.compile(r"(\d{8}-\d{6})-")


def recorded_at(prefix, files):
    """When a connection was recorded: the time its name carries, else (a recording
    renamed by hand) the earliest modification time of its files."""
    match = RECORDING_TIME.match(Path(prefix).name)
    if match:
        try:
            return time.mktime(time.strptime(match.group(1), "%Y%m%d-%H%M%S"))
        except (ValueError, OverflowError):
            pass                                    # 20261399-...: not a time after all
    return min(path.stat().st_mtime for path in files if path)


def read_recordings(paths):
    """Conversations from recording files, paired by name: <prefix>.initiator.bin
    and <prefix>.responder.bin are one connection; either alone is one direction."""
    pairs = {}
    for path in paths:
        role = 0 if path.name.endswith(ROLE_SUFFIXES[0]) else 1
        pairs.setdefault(str(path)[:-len(ROLE_SUFFIXES[role])], [None, None])[role] = path
    conversations = []
    for prefix, files in sorted(pairs.items()):
        streams = tuple(path.read_bytes() if path else b"" for path in files)
        notes = ["only one direction was recorded: %s is missing" % ("initiator", "responder")[side]
                 for side, path in enumerate(files) if path is None]
        when = recorded_at(prefix, files)
        conversations.append(Conversation(Path(prefix).name, ("initiator", "responder"), streams, 0,
                                          notes, time=when))
    # A client and a server both run with --record-dir each record every connection:
    # two copies of the same bytes, each still read on its own, and said to be one.
    clients = {conv.streams: conv.name for conv in conversations if "-client-" in conv.name}
    for conv in conversations:
        twin = clients.get(conv.streams) if "-server-" in conv.name and any(conv.streams) else None
        if twin:
            conv.twin = twin
            conv.notes.append("the same connection as %s: the server's copy of the bytes the client "
                              "recorded" % twin)
    return conversations


NOT_A_CAPTURE = ("Give a pcap file (tcpdump -w), or the recordings of --record-dir "
                 "(*.initiator.bin, *.responder.bin) or their directory")


def not_a_capture(path, magic):
    """The CaptureError for a file that is neither a pcap (by its magic or its name)
    nor a recording (by its name), saying what it looks like instead."""
    with path.open("rb") as f:
        head = magic + f.read(508)
    if not head:
        why = "the file is empty"
    elif all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        why = "it is a text file"
    else:
        why = "neither a pcap file (it starts %s, no pcap magic) nor a recording (by its name)" \
            % " ".join("%02x" % b for b in magic)
    return CaptureError("%s: not a capture: %s. %s" % (path, why, NOT_A_CAPTURE))


def load(paths):
    """(descriptions, conversations) from capture arguments: pcap files (known by
    their magic, or a .pcap/.cap/.pcapng name), recording files (known by their
    name only: *.initiator.bin, *.responder.bin), or directories of recordings.
    Any other file is refused (CaptureError), never read as a raw stream."""
    descriptions, conversations, recordings = [], [], []
    for path in map(Path, paths):
        if path.is_dir():
            files = [p for p in path.iterdir() if not p.is_dir()]
            found = sorted(p for p in files if p.name.endswith(ROLE_SUFFIXES))
            if not found:
                raise CaptureError("%s: no recordings (*.initiator.bin, *.responder.bin) in this "
                                   "directory%s" % (path, ", only %d other file(s)" % len(files)
                                                    if files else ": it is empty"))
            if len(found) < len(files):
                descriptions.append("%s: %d file(s) not named like a recording, not read"
                                    % (path, len(files) - len(found)))
            recordings.extend(found)
            continue
        if path.name.endswith(ROLE_SUFFIXES):         # a recording is known by its name only
            recordings.append(path)
            continue
        with path.open("rb") as f:
            magic = f.read(4)
        if magic not in PCAP_MAGICS and magic != PCAPNG_MAGIC and \
                path.suffix not in (".pcap", ".cap", ".pcapng"):
            raise not_a_capture(path, magic)
        try:
            description, found = read_pcap(path)
        except CaptureError as exc:
            raise CaptureError("%s: %s" % (path, exc))
        descriptions.append(description)
        conversations.extend(found)
    if recordings:
        found = read_recordings(recordings)
        twins = sum(1 for conv in found if getattr(conv, "twin", None))
        descriptions.append("%d recording file(s): %d connection(s)%s" % (
            len(recordings), len(found), "" if not twins else
            "; %d of them the server's copy of a connection its client recorded too (both ends "
            "ran --record-dir): %d distinct" % (twins, len(found) - twins)))
        conversations.extend(found)
    return descriptions, conversations
