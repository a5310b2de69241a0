"""TLS in TLS, as a passive observer reads it: what ``detect`` says of a webtunnel flow.

webtunnel carries Tor's own TLS inside the TLS of a web site. The outer TLS hides the
bytes, not where records end: unless the sender cuts its writes, each outer record is
one inner write plus 17 bytes (tlswire, "Tor inside TLS"), and Tor's first writes have
exact lengths. From one captured connection this module reads::

    each side's records (tlswire.records)       -> the data phase: the client's records
                                                   after its Finished and the upgrade
                                                   request; the server's after the client's
                                                   first data record (the capture's order)
    the first FIRST data records of each side   -> their sizes, and which of them carry one
                                                   of Tor's exact lengths (tlswire.tor_marker)
    both sides in capture order                 -> bursts: the bytes one side sends before
                                                   the other answers, and round trips

What it shows is what an exact-length rule sees (the marks, or none when webtunnel's
record shaping cut them) and what a burst-level classifier still sees: shaping moves
record ends, not the bytes of each burst or the number of turns. Xue, Kallitsis,
Houmansadr and Ensafi (USENIX Security 2024) fingerprint encapsulated TLS handshakes on
those sizes and timings; nothing here claims more than that exact-length rules fail.

No sockets, no printing in ``analyse``: it returns plain data (``Flow``) that
``flow_lines`` turns into the report's text and any other view can draw.
"""

import bisect

import tlswire

FIRST = 16                # data records per side shown and checked (the tests' number too)
BURSTS = 8                # bursts shown
WINDOW = 16 * 1024        # the bytes over which round trips are counted (shaping's window)
MAX_SEGMENT = 1 << 17     # the most one captured segment carries (TSO on loopback included)


class Flow:
    """One TLS connection's first flights, as numbers.

    ``client``, ``server``: the data phase's record lengths (length fields), in order;
    ``marks``: [(side, index, length, what)] of those among the first FIRST of each side
    that carry one of Tor's exact lengths; ``bursts``: [(side, wire bytes, records)] of
    the data phase, both sides in capture order (None without the capture's order: a
    recording); ``round_trips``: client bursts answered by the server within the first
    WINDOW bytes of the data phase (None likewise); ``skipped``: the client's records
    before its data (its Finished and the upgrade request)."""

    def __init__(self, client, server, marks, bursts, round_trips, skipped):
        self.client, self.server, self.marks = client, server, marks
        self.bursts, self.round_trips, self.skipped = bursts, round_trips, skipped

    @property
    def shaped_look(self):
        """Every data record of the first flights under Tor's smallest mark: what
        webtunnel's record shaping gives (a pattern of its own a censor may learn)."""
        first = self.client[:FIRST] + self.server[:FIRST]
        return bool(first) and max(first) < tlswire.TOR_HELLO_RECORD


def _records(data):
    """[(offset, type, length field)] of the complete records at the start of ``data``."""
    found, offset = [], 0
    for kind, body in tlswire.records(data):
        found.append((offset, kind, len(body)))
        offset += 5 + len(body)
    return found


def _first_seen(timeline, side):
    """A function: stream offset of ``side`` -> the index in capture order of the first
    segment that carried it."""
    spans = sorted((start, end, order) for order, (_, s, start, end) in enumerate(timeline)
                   if s == side and end > start)
    starts = [span[0] for span in spans]

    def seen(offset):
        best = None
        for at in range(bisect.bisect_right(starts, offset) - 1, -1, -1):
            start, end, order = spans[at]
            if start < offset - MAX_SEGMENT:
                break                     # no segment reaches this far: none earlier does
            if offset < end and (best is None or order < best):
                best = order              # the first copy (a retransmit comes later)
        return best if best is not None else len(timeline)
    return seen


def analyse(conv, client=0):
    """The Flow of a TLS connection whose client side is ``client`` (0 or 1), or None
    when either side sent no TLS records or the client has no data records yet."""
    sides = (conv.streams[client], conv.streams[1 - client])
    records = [_records(data) for data in sides]
    if not records[0] or not records[1]:
        return None
    answer = tlswire.hello(sides[1], client=False)
    # TLS 1.3 seals the client's Finished as application_data; the request comes next.
    skipped = 2 if answer is not None and answer.version == 0x0304 else 1
    c_data = [r for r in records[0] if r[1] == tlswire.APPLICATION_DATA][skipped:]
    if not c_data:
        return None
    s_app = [r for r in records[1] if r[1] == tlswire.APPLICATION_DATA]
    timeline = getattr(conv, "timeline", None)
    bursts = round_trips = None
    if timeline:
        sides_timeline = [(when, side if client == 0 else 1 - side, start, end)
                          for when, side, start, end in timeline]
        c_seen, s_seen = _first_seen(sides_timeline, 0), _first_seen(sides_timeline, 1)
        begin = c_seen(c_data[0][0])
        s_data = [r for r in s_app if s_seen(r[0]) > begin]
        ordered = sorted([(c_seen(r[0]), 0, r[0], r[2]) for r in c_data] +
                         [(s_seen(r[0]), 1, r[0], r[2]) for r in s_data])
        bursts, total, round_trips = [], 0, 0
        for _, side, _, length in ordered:
            if bursts and bursts[-1][0] == side:
                bursts[-1][1] += 5 + length
                bursts[-1][2] += 1
            else:
                if side == 1 and bursts and total < WINDOW:
                    round_trips += 1
                bursts.append([side, 5 + length, 1])
            total += 5 + length
        bursts = [tuple(burst) for burst in bursts]
    else:
        # No order between the directions: the server's data records are those after the
        # handshake's four (EncryptedExtensions .. Finished), tickets and 101 included.
        s_data = s_app[4:]
    client_lengths = [length for _, _, length in c_data]
    server_lengths = [length for _, _, length in s_data]
    marks = [(side, index, length, tlswire.tor_marker(length))
             for side, lengths in ((0, client_lengths), (1, server_lengths))
             for index, length in enumerate(lengths[:FIRST]) if tlswire.tor_marker(length)]
    return Flow(client_lengths, server_lengths, marks, bursts, round_trips, skipped)


SIDES = ("client", "server")


def flow_lines(flow):
    """The report's lines for one Flow (no indentation of their own)."""
    lines = ["TLS in TLS: the first %d data records of each side (length fields; the client's after "
             "its Finished and the upgrade request)" % FIRST,
             "  client -> server: %s" % " ".join(map(str, flow.client[:FIRST])),
             "  server -> client: %s" % (" ".join(map(str, flow.server[:FIRST])) or "none")]
    if flow.marks:
        lines.append("exact-length marks of Tor inside (a record = one inner write + 17 bytes):")
        for side, index, length, what in flow.marks:
            lines.append("  %s record %d: %d = %s" % (SIDES[side], index + 1, length, what))
        lines.append("  %d of %d records: a rule on exact lengths flags this flow, no classifier needed"
                     % (len(flow.marks), len(flow.client[:FIRST]) + len(flow.server[:FIRST])))
    else:
        lines.append("exact-length marks of Tor inside: none (no 534 = Tor's ClientHello + 17, no "
                     "514 k + 39 = whole cells)")
    if flow.shaped_look:
        lines.append("  every record is under %d bytes: cut below Tor's marks, as webtunnel's record "
                     "shaping does; many small records are themselves a pattern a censor can learn"
                     % tlswire.TOR_HELLO_RECORD)
    if flow.bursts is None:
        lines.append("bursts: the capture keeps no order between the directions (a recording)")
    else:
        lines.append("what a burst-level observer still sees (bytes on the wire before the other side "
                     "answers; records):")
        lines.append("  " + " ".join("%s%d(%d)" % (">" if side == 0 else "<", size, count)
                                     for side, size, count in flow.bursts[:BURSTS]))
        lines.append("  %d round trip(s) in the first %d KiB. Cutting records changes none of this: "
                     "classifiers of burst sizes and timing (Xue et al., USENIX Security 2024) still "
                     "see Tor's handshake" % (flow.round_trips, WINDOW // 1024))
    return lines
