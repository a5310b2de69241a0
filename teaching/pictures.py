"""pictures.py: what ``demo``, ``unmask`` and ``detect`` draw with ``--html FILE``: one
self-contained page (no script, no font, no request anywhere: a Content-Security-Policy
forbids them) of inline SVG drawings made by svg.py.

Every number drawn is one the command's analysis already holds, never recomputed here:

=================  ===========================================================================
handshake          each side's writes in order, split into the fields the walk printed
                   (``Walk.fields``: offset, length, name); demo and, for obfs2, unmask
sizes              packet (capture) or write (demo) sizes over time, both directions, the
                   first ``FIRST`` of each
first bytes        the client's first packet, byte by byte, against the printable band
the test           that packet against each exemption of the fully-encrypted test
                   (``capture.FirstPacket``), with the verdict and the rule that decided
padding            obfs4: the burst lengths this bridge's table draws, beside another's
records            webtunnel: each TLS record's size on the wire beside what it carried;
                   ``record_series`` lists the series, so a shaped run is one more entry
map                every stream's first packet on the test's two main axes
=================  ===========================================================================

A transport the module does not know gets the drawings every transport has (handshake
by writes, sizes, first bytes, the test): the page iterates over what it is given.
"""

import os
import time

from teaching import svg

FIRST = 20                 # packets (or writes) drawn per direction
SHOW_BYTES = 256           # bytes of the first packet drawn
SHOW_MESSAGES = 8          # handshake messages drawn
WIDTH = 860
DIRECTIONS = ("client -> server", "server -> client")


class Section:
    """One part of a page: a heading, a line of words, its figures."""

    def __init__(self, key, heading, summary, figures, first=None, wide=False):
        self.key, self.heading, self.summary, self.figures = key, heading, summary, figures
        self.first = first        # the FirstPacket behind it, for a page's overview
        self.wide = wide          # side by side: across the page, above the columns


# --- The drawings ------------------------------------------------------------------------

def sizes_figure(flows, what, caption):
    """Sizes over time, both directions mirrored: client -> server up, server -> client
    down. ``flows``: two lists of (seconds since the connection began, bytes); ``what``:
    "write" or "packet"."""
    flows = [flow[:FIRST] for flow in flows]
    start = min([t for flow in flows for t, _ in flow] or [0.0])
    series, rows = [], []
    for index, (label, flow) in enumerate(zip(DIRECTIONS, flows)):
        sign = 1 if index == 0 else -1
        points = []
        for number, (when, size) in enumerate(flow, 1):
            ms = (when - start) * 1000
            tip = "%s, %s %d: %d bytes at %.3f ms" % (label, what, number, size, ms)
            points.append((ms, sign * size, tip))
            rows.append((label, number, "%.3f" % ms, size))
        series.append((label, svg.LOOKS[index], points))
    biggest = max([size for flow in flows for _, size in flow] or [1])
    latest = max([ms for _, _, points in series for ms, _, _ in points] or [1.0])
    figure = svg.Figure("sizes", "%s sizes over time, the first %d each way" % (what.capitalize(), FIRST),
                        WIDTH, 330, caption, (("direction", what, "time (ms)", "bytes"), rows))
    x_axis = svg.Axis(0, latest or 1.0, 70, WIDTH - 20, "time since the first %s (ms)" % what)
    y_axis = svg.Axis(-biggest, biggest, 260, 40, "bytes (up: to the server, down: to the client)")
    svg.frame(figure, x_axis, y_axis, zero_line=True)
    svg.stems(figure, x_axis, y_axis, series)
    svg.legend(figure, 80, 20, [(label, look) for label, look, _ in series])
    return figure


def handshake_figure(messages, caption, heading=None, common_scale=False, limit=SHOW_MESSAGES):
    """The first messages as rows, in the order they were sent: who sent it, its size, and
    its fields as proportional segments. ``messages``: (direction index, label, size,
    [(field, offset, length)]). ``common_scale``: every row on one scale of bytes (to
    compare messages), else each row as wide as the drawing (to read its fields)."""
    shown = messages[:limit]
    rows = [(number, DIRECTIONS[side], label, size, name, offset, length)
            for number, (side, label, size, fields) in enumerate(shown, 1)
            for name, offset, length in fields]
    figure = svg.Figure("handshake", heading or "The messages, in the order they were sent, field by field",
                        WIDTH, 70 + 60 * len(shown), caption,
                        (("message", "direction", "what", "bytes", "field", "offset", "length"), rows))
    figure.add(svg.hatch("hatch-0", svg.BLUE), svg.hatch("hatch-1", svg.VERMILLION))
    biggest = max([size for _, _, size, _ in shown] or [1])
    figure.add(svg.text(250, 28, "fields, each as wide as its length in bytes (at least 30 px)%s"
                        % ("; one scale for every row" if common_scale else ""), 11, colour=svg.GREY))
    for number, (side, label, size, fields) in enumerate(shown, 1):
        y = 44 + 60 * (number - 1)
        colour, shape, _ = svg.LOOKS[side]
        arrow = "->" if side == 0 else "<-"
        who, what = ("%s %s" % (arrow, DIRECTIONS[side]), label) if not common_scale else (
            "%s: %s" % (label.split(", ")[0], DIRECTIONS[side]), label.split(", ")[-1])
        figure.add(svg.marker(shape, 14, y + 16, colour),
                   svg.text(26, y + 12, "%d. %s" % (number, who), 12, weight="bold"),
                   svg.text(26, y + 28, "%s: %d bytes" % (what, size), 12, cls="message-size"))
        segments = [(name, length, "message %d, %s: %s, offset %d, %d bytes"
                     % (number, DIRECTIONS[side], name, offset, length)) for name, offset, length in fields]
        wide = WIDTH - 270
        if common_scale:
            wide = max(30 * len(segments), wide * size / biggest)
        svg.strip(figure, 250, y, wide, 36, segments, colour, "hatch-%d" % side)
    if len(messages) > len(shown):
        figure.add(svg.text(26, 62 + 60 * len(shown), "... and %d more messages"
                            % (len(messages) - len(shown)), 12, colour=svg.GREY))
    return figure


def bytes_figure(first, caption, what="The client's first packet"):
    """The bytes of the packet a ``FirstPacket`` read: value against offset, the printable
    band shaded."""
    packet = first.packet
    shown = packet[:SHOW_BYTES]
    figure = svg.Figure("first-bytes", "%s, byte by byte (%d of %d bytes)" % (what, len(shown), len(packet)),
                        WIDTH, 300, caption,
                        (("offset", "byte (hex)", "printable"),
                         [(at, "%02x" % b, "yes" if first.is_printable(b) else "no")
                          for at, b in enumerate(shown)]))
    step = 32 if len(shown) > 128 else 16 if len(shown) > 48 else 4
    x_axis = svg.Axis(0, len(shown), 70, WIDTH - 20, "offset in the packet (bytes)",
                      ticks=list(range(0, len(shown) + step, step)))
    y_axis = svg.Axis(0, 256, 250, 30, "byte value (0-255)", ticks=[0, 32, 64, 96, 128, 160, 192, 224, 256])
    band_top, band_bottom = y_axis(0x7E), y_axis(0x20)
    figure.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" fill-opacity="0.18">%s</rect>'
               % (x_axis.start, band_top, x_axis.end - x_axis.start, band_bottom - band_top, svg.GREEN,
                  svg.title("printable ASCII, 0x20-0x7e")),
               svg.text(x_axis.end - 4, band_top + 14, "printable ASCII (0x20-0x7e)", 11, "end",
                        colour="#00573f"))
    svg.frame(figure, x_axis, y_axis)
    for at, byte in enumerate(shown):
        printable = first.is_printable(byte)
        figure.add(svg.marker("square" if printable else "circle", x_axis(at + 0.5), y_axis(byte),
                              svg.GREEN if printable else svg.BLUE, 2.2,
                              "offset %d: %02x%s" % (at, byte, " (printable)" if printable else "")))
    return figure


def test_figure(first, where, caption):
    """A ``capture.FirstPacket`` against each exemption, in the test's order, and the verdict."""
    reads = [
        ("Ex1", "set bits per byte", 0, 8, [(0, first.POPCOUNT_LOW), (first.POPCOUNT_HIGH, 8)],
         first.popcount, "%.2f bits/byte" % first.popcount,
         "exempt at <= %s or >= %s" % (first.POPCOUNT_LOW, first.POPCOUNT_HIGH)),
        ("Ex2", "first 6 bytes printable", 0, 1, [(0.5, 1)], 1 if first.prefix_printable else 0,
         "yes" if first.prefix_printable else "no", "exempt if all %d are" % first.PRINTABLE_PREFIX),
        ("Ex3", "printable share (%)", 0, 100, [(100 * first.PRINTABLE_SHARE, 100)],
         100 * first.printable_share, "%.1f%%" % (100 * first.printable_share),
         "exempt above %d%%" % (100 * first.PRINTABLE_SHARE)),
        ("Ex4", "longest printable run", 0, max(40, first.longest_run),
         [(first.PRINTABLE_RUN, max(40, first.longest_run))], first.longest_run,
         "%d bytes" % first.longest_run, "exempt above %d" % first.PRINTABLE_RUN),
        ("Ex5", "starts like TLS or HTTP", 0, 1, [(0.5, 1)], 1 if first.looks_like else 0,
         first.looks_like or "no", "exempt if it does"),
    ]
    applying = {name for name, applies in first.rules if applies}
    rows = [(name, label, reading, rule, "applies" if name in applying else "does not apply")
            for name, label, _, _, _, _, reading, rule in reads]
    verdict = ("FLAGGED as fully encrypted: no exemption applies" if first.rule is None else
               "EXEMPT by %s (the first exemption that applies decides)" % first.rule)
    figure = svg.Figure("test", "The fully-encrypted test on %s: %s" % (where, first.verdict),
                        WIDTH, 60 + 46 * len(reads) + 30, caption,
                        (("rule", "what it reads", "this packet", "threshold", "result"),
                         rows + [("verdict", first.verdict, "", "", verdict)]))
    figure.add(svg.hatch("exempt", svg.GREEN))
    figure.add(svg.text(8, 22, "hatched: exempt; the diamond: this packet (%d bytes)" % first.length, 11,
                        colour=svg.GREY))
    for index, (name, label, low, high, zones, value, reading, rule) in enumerate(reads):
        y = 56 + 46 * index
        applies = name in applying
        svg.gauge(figure, 230, y, 340, low, high, zones, value, "%s %s" % (name, label),
                  "%s: %s" % (reading, "applies" if applies else "does not apply"), applies,
                  "%s %s: %s (%s)" % (name, label, reading, rule), ("no", "yes") if high == 1 else None)
    figure.add(svg.text(8, 60 + 46 * len(reads) + 8, verdict, 14, weight="bold",
                        colour=svg.VERMILLION if first.rule is None else "#00573f", cls="verdict"))
    return figure


def map_figure(points, caption):
    """Every stream's first packet on the test's two main axes: set bits per byte (Ex1)
    and the printable share (Ex3). ``points``: (label, FirstPacket)."""
    first = points[0][1]             # the thresholds (class attributes) are every packet's
    figure = svg.Figure("map", "Where each first packet falls: the box in the middle is what gets flagged",
                        WIDTH, max(360, 60 + 22 * len(points)), caption,
                        (("stream", "bits/byte", "printable %", "verdict"),
                         [(label, "%.2f" % first.popcount, "%.1f" % (100 * first.printable_share),
                           first.verdict) for label, first in points]))
    x_axis = svg.Axis(0, 8, 70, WIDTH - 220, "set bits per byte (popcount / length)")
    y_axis = svg.Axis(0, 100, 290, 30, "printable bytes (%)")
    figure.add(svg.hatch("exempt-map", svg.GREEN))
    for low, high in ((0, first.POPCOUNT_LOW), (first.POPCOUNT_HIGH, 8)):
        figure.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="url(#exempt-map)" '
                   'fill-opacity="0.35"/>' % (x_axis(low), y_axis(100), x_axis(high) - x_axis(low),
                                              y_axis(0) - y_axis(100)))
    figure.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="url(#exempt-map)" '
               'fill-opacity="0.35"/>' % (x_axis(first.POPCOUNT_LOW), y_axis(100),
                                          x_axis(first.POPCOUNT_HIGH) - x_axis(first.POPCOUNT_LOW),
                                          y_axis(100 * first.PRINTABLE_SHARE) - y_axis(100)))
    figure.add(svg.text(x_axis(4), y_axis(25), "flagged", 13, "middle", "bold", svg.VERMILLION),
               svg.text(x_axis(1.7), y_axis(90), "exempt (Ex1)", 12, "middle", colour="#00573f"),
               svg.text(x_axis(6.3), y_axis(90), "exempt (Ex1)", 12, "middle", colour="#00573f"),
               svg.text(x_axis(4), y_axis(80), "exempt (Ex3)", 12, "middle", colour="#00573f"))
    svg.frame(figure, x_axis, y_axis)
    for index, (label, first) in enumerate(points):
        colour, shape, _ = svg.LOOKS[(index + 2) % len(svg.LOOKS)]
        x, y = x_axis(min(first.popcount, 8)), y_axis(100 * first.printable_share)
        figure.add(svg.marker(shape, x, y, colour, 6, "%s: %.2f bits/byte, %.1f%% printable, %s"
                              % (label, first.popcount, 100 * first.printable_share, first.verdict)))
        figure.add(svg.marker(shape, WIDTH - 200, 40 + 22 * index, colour, 5),
                   svg.text(WIDTH - 190, 45 + 22 * index, "%s: %s" % (label, first.verdict), 13))
    return figure


def padding_figure(tables, caption):
    """obfs4: the burst lengths (mod 1448) each bridge's table draws, and how often:
    ``tables`` is [(label, WeightedDist)]; a value's chance is its weight over the sum."""
    series, rows = [], []
    for index, (label, table) in enumerate(tables):
        total = sum(table.weights)
        points = []
        for value, weight in sorted(zip(table.values, table.weights)):
            share = 100 * weight / total
            tip = "%s: %d bytes, %.2f%%" % (label, table.lo + value, share)
            points.append((table.lo + value, share, tip))
            rows.append((label, table.lo + value, "%.2f" % share))
        series.append((label, svg.LOOKS[index * 2], points))
    top = max([y for _, _, points in series for _, y, _ in points] or [1])
    figure = svg.Figure("padding", "obfs4: the burst lengths each bridge's table draws",
                        WIDTH, 320, caption, (("bridge", "length (bytes, mod 1448)", "chance (%)"), rows))
    x_axis = svg.Axis(0, 1448, 70, WIDTH - 20, "burst length drawn, modulo 1448 (bytes)",
                      ticks=[0, 200, 400, 600, 800, 1000, 1200, 1448])
    y_axis = svg.Axis(0, top, 260, 40, "chance of being drawn (%)")
    svg.frame(figure, x_axis, y_axis)
    svg.stems(figure, x_axis, y_axis, series)
    svg.legend(figure, 80, 20, [(label, look) for label, look, _ in series])
    return figure


def records_figure(series, caption):
    """webtunnel: one bar pair per TLS record, per series: ``series`` is [(label, [(direction
    index, bytes)])], each list in record order; more series (a shaped run) add more bars."""
    count = max([len(points) for _, points in series] or [1])
    shown = min(count, 2 * FIRST)
    biggest = max([size for _, points in series for _, size in points] or [1])
    rows = [(label, number, DIRECTIONS[side], size) for label, points in series
            for number, (side, size) in enumerate(points[:shown], 1)]
    figure = svg.Figure("records", "webtunnel: each TLS record on the wire, beside what it carried",
                        WIDTH, 330, caption, (("series", "record", "direction", "bytes"), rows))
    x_axis = svg.Axis(0, shown, 70, WIDTH - 20, "record number, in the order each side sent them "
                      "(client's first, then the server's)",
                      ticks=list(range(0, shown + 1, max(1, shown // 10))))
    y_axis = svg.Axis(0, biggest, 260, 40, "bytes")
    svg.frame(figure, x_axis, y_axis)
    slot = (x_axis.end - x_axis.start) / max(shown, 1)
    bar = slot * 0.8 / max(len(series), 1)
    for s, (label, points) in enumerate(series):
        colour, _, _ = svg.LOOKS[2 + s]
        fill = colour if s % 2 == 0 else "url(#records-%d)" % s
        if s % 2:
            figure.add(svg.hatch("records-%d" % s, colour))
        for number, (side, size) in enumerate(points[:shown]):
            x = x_axis(number) + slot * 0.1 + bar * s
            figure.add('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="%s">%s</rect>'
                       % (x, y_axis(size), bar, y_axis(0) - y_axis(size), fill, colour,
                          svg.title("%s, record %d (%s): %d bytes" % (label, number + 1, DIRECTIONS[side],
                                                                      size))))
    turn = next((number for number, (side, _) in enumerate(series[0][1][:shown]) if side == 1), None) \
        if series else None
    if turn:                       # where the client's records end and the server's begin
        x = x_axis(turn)
        figure.add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-dasharray="6 4"/>'
                   % (x, y_axis.end - 4, x, y_axis.start, svg.GREY),
                   svg.text(x - 6, y_axis.end + 10, "<- sent by the client", 11, "end", colour=svg.GREY),
                   svg.text(x + 6, y_axis.end + 10, "sent by the server ->", 11, colour=svg.GREY))
    svg.legend(figure, 80, 20, [(label, (svg.LOOKS[2 + s][0], "square", "" if s % 2 == 0 else "4 2"))
                                for s, (label, _) in enumerate(series)])
    return figure


# --- From the analysis to the drawings ------------------------------------------------------

def messages_from(pieces_by_side, fields_by_side, times_by_side):
    """Each side's pieces in time order, each split into the fields its walk recorded
    (offsets in that side's stream, clipped to the piece; a gap is "rest")."""
    messages = []
    for side, pieces in enumerate(pieces_by_side):
        fields = sorted(fields_by_side[side], key=lambda field: field[0])
        at = 0
        for number, piece in enumerate(pieces):
            end, cursor, parts = at + len(piece), at, []
            for offset, length, name in fields:
                if offset < cursor or offset >= end or length <= 0:
                    continue
                if offset > cursor:
                    parts.append(("rest", cursor - at, offset - cursor))
                parts.append((name, offset - at, min(offset + length, end) - offset))
                cursor = min(offset + length, end)
            if cursor < end:
                parts.append(("rest" if parts else "bytes", cursor - at, end - cursor))
            messages.append((times_by_side[side][number], side, "write %d" % (number + 1), len(piece), parts))
            at = end
    messages.sort(key=lambda message: message[0])
    return [message[1:] for message in messages]


def demo_section(walk):
    """The drawings of one demo run (``teaching.demo``'s Walk, after its walk and checks)."""
    exchange, name = walk.exchange, walk.name
    wires = (exchange.client, exchange.server)
    figures = [handshake_figure(
        messages_from([w.pieces for w in wires], [walk.fields["client"], walk.fields["server"]],
                      [w.times for w in wires]),
        "Each row is one write, as the demo's tap recorded it; the segments are the fields the walk "
        "above printed. Look at what is fixed and what is random, and at which writes are padding.")]
    figures.append(sizes_figure(
        [list(zip(w.times, map(len, w.pieces))) for w in wires], "write",
        "Every write each side put on the wire, as the demo recorded it (the first %d each way). "
        "Look at the sizes a censor sees before any data, and whether they repeat from run to run." % FIRST))
    if walk.first is not None:
        figures.append(bytes_figure(walk.first, "The client's first write: random-looking bytes spread over "
                                    "0-255; text sits in the shaded band. The test below reads only this."))
        figures.append(test_figure(walk.first, "the client's first write",
                                   "Each row is one exemption of the test, in order (%s). A packet is "
                                   "flagged when none applies." % walk.first.SOURCE))
    len_dist = getattr(getattr(walk.server, "config", None), "len_dist", None)
    if len_dist is not None:
        figures.append(padding_figure(padding_tables(walk.server.config), "Each bridge draws its own "
                       "table from its drbg-seed: its clients' bursts end on these lengths. Look at how "
                       "different two bridges are: the lengths tell bridges apart, not clients."))
    records = getattr(walk, "records", None)
    if records:
        figures.append(records_figure(record_series(records), "Each TLS record on the wire is its "
                       "contents plus 22 bytes (5 header, 1 type, 16 tag): the outer sizes follow the "
                       "inner writes. Look at how the bars move together."))
    verdict = walk.first.verdict if walk.first is not None else "no first write"
    return Section(name, "demo --transport=%s" % name,
                   "fully-encrypted test on the first write: %s" % verdict, figures, walk.first)


def padding_tables(config):
    """[(label, WeightedDist)]: this bridge's length table, and another bridge's made the
    same way from another drbg-seed (SHA-256 of this one's, so a run repeats)."""
    import hashlib

    from obfs4_drbg import WeightedDist
    table = config.len_dist
    seed = config.identity.drbg_seed
    other = hashlib.sha256(b"another bridge " + seed).digest()[:24]
    return [("this bridge (drbg-seed %s...)" % seed.hex()[:12], table),
            ("another bridge (drbg-seed %s...)" % other.hex()[:12], WeightedDist(other, table.lo, table.hi))]


def record_series(records):
    """webtunnel: [(label, [(direction, bytes)])]: each record's size on the wire (header
    included) and the bytes it carried once opened, client's records first. Another run
    to compare (record shaping, say) is one more (label, sizes) entry in this list:
    ``records_figure`` draws as many bars per record as there are series."""
    outer = [(side, 5 + len(r.body)) for side, found in enumerate(records) for r in found]
    inner = [(side, len(r.content)) for side, found in enumerate(records) for r in found]
    return [("on the wire (TLS record)", outer), ("carried inside", inner)]


def capture_sections(command, conversations, tests, notes):
    """The drawings of ``unmask`` or ``detect``: for each conversation its first packet,
    the test, its packet sizes (a pcap); a map of every stream first. ``tests``: the
    FirstPacket of each conversation (or None), as the text output reported it;
    ``notes``: per conversation, [(side, fields)] of obfs2 handshakes unmask read."""
    sections, points = [], []
    for number, (conv, first, found) in enumerate(zip(conversations, tests, notes), 1):
        figures = []
        if found:
            sides = [[conv.streams[0]], [conv.streams[1]]]
            fields = [[], []]
            for side, rows in found:
                fields[side] = rows
            read = [(side, "all it sent", size, parts) for side, _, size, parts
                    in messages_from(sides, fields, [[0], [1]])]
            figures.append(handshake_figure(read,
                                            "Both obfs2 handshakes as unmask read them: the seed in clear, "
                                            "MAGIC and PADLEN under a key made from it, then padding."))
        if conv.packets and all(when is not None for flow in conv.packets for when, _ in flow):
            figures.append(sizes_figure(conv.packets, "packet",
                                        "Every TCP packet with data in the capture (the first %d each way)."
                                        % FIRST))
        if first is not None:
            if conv.first_packets[conv.initiator or 0] is None:
                figures.append(bytes_figure(first, "A recording has no packet boundaries: the test "
                                            "reads the initiator's first %d bytes, as detect says. This "
                                            "page holds them: share it as you would the recording."
                                            % first.length, "The initiator's first bytes"))
            else:
                figures.append(bytes_figure(first, "The packet the test reads: the initiator's first. "
                                            "This page holds its bytes: share it as you would the "
                                            "capture.", "The initiator's first packet"))
            figures.append(test_figure(first, "stream %d's first packet" % number, "Each row is one "
                                       "exemption of the test, in order (%s)." % first.SOURCE))
            points.append(("stream %d" % number, first))
        sections.append(Section("stream-%d" % number, "stream %d: %s" % (number, conv.name),
                                "fully-encrypted test: %s" % (first.verdict if first else "not applicable"),
                                figures))
    if points:
        sections.insert(0, overview(points, "%s: every stream" % command))
    return sections


def demo_overview(walks):
    """The top of ``demo --transport=all``'s page: every transport's first write against
    the test, and each side's first write of every transport on one scale."""
    points = [(walk.name, walk.first) for walk in walks if walk.first is not None]
    firsts = []
    for walk in walks:
        wires = (walk.exchange.client, walk.exchange.server)
        messages = messages_from([w.pieces for w in wires], [walk.fields["client"], walk.fields["server"]],
                                 [w.times for w in wires])
        for side in (0, 1):
            found = [m for m in messages if m[0] == side][:1]
            firsts += [(side, "%s, %s" % (walk.name, label), size, fields)
                       for _, label, size, fields in found]
    figures = [map_figure(points, "Each marker is one transport's first write. The test flags the middle "
                          "box (random-looking bytes); webtunnel's TLS and dummy's plain bytes fall "
                          "outside.")]
    figures.append(handshake_figure(firsts, "Each transport's first write from each side, on one scale. "
                                    "Look at the random padding of obfs3 and obfs4, the bare 24 + PADLEN of "
                                    "obfs2, and webtunnel's TLS records.",
                                    "The first write of each side, every transport, one scale",
                                    common_scale=True, limit=len(firsts)))
    return Section("overview", "Every transport, side by side", "one demo connection each", figures,
                   wide=True)


def overview(points, heading):
    """The section that opens a page of several streams: where each first packet falls."""
    return Section("map", heading, "%d first packet(s) against the fully-encrypted test" % len(points),
                   [map_figure(points, "Each marker is one stream's first packet. The fully-encrypted "
                               "test flags the middle box: about 4 set bits per byte and mostly "
                               "unprintable, like random bytes; text and TLS fall outside it.")])


# --- The page ------------------------------------------------------------------------------

STYLE = """
body{font-family:sans-serif;margin:1.5em;color:#111;background:#fff;line-height:1.35}
h1{font-size:1.6em;margin:0 0 .2em} h2{font-size:1.25em;margin:1.2em 0 .3em;border-bottom:2px solid #0072B2}
h3{font-size:1.02em;margin:.2em 0} .summary{color:#333;margin:.2em 0 .6em}
figure.drawing{margin:0 0 1.2em;padding:.6em;border:1px solid #ccc;border-radius:6px;background:#fff}
figcaption{font-size:.92em;color:#222;margin:.3em 0}
table{border-collapse:collapse;font-size:.85em} td,th{border:1px solid #ccc;padding:1px 6px;text-align:left}
details{margin-top:.3em} summary{cursor:pointer;color:#0a4f80}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:1em;align-items:start}
.grid>section{border:1px solid #999;border-radius:8px;padding:.4em .8em}
.pair{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:1em;align-items:start}
"""
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def page(heading, intro, sections, side_by_side=False):
    """The whole HTML page as text: nothing in it loads anything."""
    wide, columns = [], []
    for section in sections:
        inner = "".join(figure.html() for figure in section.figures)
        (wide if side_by_side and section.wide else columns).append(
            '<section id="%s"><h2>%s</h2><p class="summary">%s</p>%s</section>'
            % (svg.esc(section.key), svg.esc(section.heading), svg.esc(section.summary),
               '<div class="pair">%s</div>' % inner if side_by_side and section.wide else inner))
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta http-equiv="Content-Security-Policy" content="%s">'
            '<meta name="viewport" content="width=device-width,initial-scale=1">'
            '<title>%s</title><style>%s</style></head><body><h1>%s</h1><p>%s</p>%s%s</body></html>\n'
            % (CSP, svg.esc(heading), STYLE, svg.esc(heading), svg.esc(intro), "".join(wide),
               '<div class="grid">%s</div>' % "".join(columns) if side_by_side else "".join(columns)))


def write_page(path, heading, intro, sections, side_by_side=False):
    """Write the page to ``path`` (created or replaced); returns its size in bytes."""
    text = page(heading, "%s Made by obfsproxy.py on %s." % (intro, time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                   time.gmtime())),
                sections, side_by_side)
    data = text.encode("utf-8")
    with open(os.fspath(path), "wb") as f:
        f.write(data)
    return len(data)
