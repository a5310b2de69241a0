"""Tests for pictures.py and svg.py: ``demo``, ``detect`` and ``unmask`` with ``--html``.

Each page is read back (html.parser) and every number it draws is held to the words the
same command printed, or to the wire it recorded: the tables under the drawings, the
<title> of each mark, and for the size plots the marks' geometry itself, read back
through the axis' own tick labels. A picture that drifted from the analysis fails here.

Then a real browser: headless Chromium (Debian's ``chromium``, which .ci/run installs)
opens each page, must log no console message at all (the page has no script, and its
Content-Security-Policy turns any attempt to load something into a console error), must
show every expected drawing with its title and axis labels, and saves a screenshot.
Outside CI a missing Chromium skips that test; in CI it fails.
"""

import hashlib
import html
import html.parser
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import IN_CI, PROGRAM, ROOT

import transports
from obfs4_drbg import WeightedDist
from teaching import capture, pictures

# The drawings of each transport's demo: every transport has the first four (a transport
# added later gets them too, with its writes unlabelled until its walk files its fields).
EVERY = {"handshake", "sizes", "first-bytes", "test"}
KINDS = dict({name: EVERY for name in transports.TRANSPORTS},
             obfs4=EVERY | {"padding"}, webtunnel=EVERY | {"records"})
DEMO_LINE = re.compile(r"\n    (flagged|exempt \((Ex\d)\))  popcount ([\d.]+) bits/byte, first 6 bytes "
                       r"(printable|not all printable), ([\d.]+)% printable, longest printable run (\d+), "
                       r"(starts like (TLS|HTTP)|no TLS/HTTP start)")


def run(*args, cwd=None, timeout=300):
    done = subprocess.run([sys.executable, PROGRAM, *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, cwd=str(cwd or ROOT), timeout=timeout)
    return done.returncode, done.stdout, done.stderr


class Page(html.parser.HTMLParser):
    """A page read back: ``figures`` is [{kind, heading, svg, rows, section}] in page order."""

    def __init__(self, text):
        html.parser.HTMLParser.__init__(self, convert_charrefs=True)
        self.figures, self.sections, self.scripts = [], [], 0
        self._figure = self._cell = self._row = None
        self._in_svg = self._in_h3 = self._in_h2 = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "link", "img", "iframe", "object", "embed"):
            self.scripts += 1
        if tag == "h2":
            self._in_h2 = True
            self.sections.append("")
        if tag == "figure":
            self._figure = {"kind": attrs["data-figure"], "heading": "", "svg": [], "rows": [],
                            "section": self.sections[-1] if self.sections else None}
            self.figures.append(self._figure)
        elif self._figure is not None:
            if tag == "h3":
                self._in_h3 = True
            if tag == "svg":
                self._in_svg = True
            if self._in_svg:
                self._figure["svg"].append((tag, attrs, ""))
            if tag == "tr":
                self._row = []
            if tag == "td":
                self._cell = ""

    def handle_endtag(self, tag):
        if tag == "h2":
            self._in_h2 = False
        if tag == "h3":
            self._in_h3 = False
        if tag == "svg":
            self._in_svg = False
        if tag == "td" and self._row is not None:
            self._row.append(self._cell)
            self._cell = None
        if tag == "tr" and self._row:
            self._figure["rows"].append(self._row)
            self._row = None
        if tag == "figure":
            self._figure = None

    def handle_data(self, data):
        if self._in_h2:
            self.sections[-1] += data
        if self._figure is None:
            return
        if self._in_h3:
            self._figure["heading"] += data
        if self._cell is not None:
            self._cell += data
        if self._in_svg and self._figure["svg"]:
            tag, attrs, text = self._figure["svg"][-1]
            self._figure["svg"][-1] = (tag, attrs, text + data)

    def of(self, kind, section=None, exact=False):
        """The figures of ``kind`` in the sections whose heading holds ``section`` (is it,
        with ``exact``: "demo --transport=meek" is not "demo --transport=meek_lite")."""
        return [f for f in self.figures if f["kind"] == kind and (
            section is None or (f["section"] == section if exact else section in f["section"]))]


def read_page(path):
    page = Page(Path(path).read_text(encoding="utf-8"))
    assert page.scripts == 0
    return page


def texts(figure, cls):
    return [(float(attrs["y"]), float(attrs["x"]), text) for tag, attrs, text in figure["svg"]
            if tag == "text" and attrs.get("class") == cls]


def marks_read_back(figure):
    """The value each size mark is drawn at, read back from its position through the
    y axis' tick labels (the top tick, and the zero line's), and its <title>."""
    ticks = texts(figure, "ytick")
    zero_y = next(y for y, _, words in ticks if words == "0") - 4     # labels sit 4 px below their line
    top_y, _, top = min(ticks)
    per_byte = (zero_y - (top_y - 4)) / float(top)
    found, elements = [], figure["svg"]
    for index, (tag, attrs, _) in enumerate(elements):
        if tag in ("circle", "rect") and index + 1 < len(elements) and elements[index + 1][0] == "title":
            centre = float(attrs["cy"]) if tag == "circle" else float(attrs["y"]) + float(attrs["height"]) / 2
            found.append(((zero_y - centre) / per_byte, elements[index + 1][2]))
    return found, per_byte


def check_sizes(figure, writes):
    """The sizes drawn are ``writes`` [(direction, bytes)] in each direction's order: in the
    table, in each mark's <title>, and where each mark is drawn (within half a pixel)."""
    rows = [(direction, int(size)) for direction, _, _, size in figure["rows"]]
    assert rows == writes
    marks, per_byte = marks_read_back(figure)
    assert len(marks) == len(writes)
    by_title = {}
    for value, tip in marks:
        direction, number, size = re.match(r"(.*), (?:write|packet) (\d+): (\d+) bytes at", tip).groups()
        by_title[(direction, int(number))] = (value, int(size))
    for direction in pictures.DIRECTIONS:
        sizes = [size for d, size in writes if d == direction]
        for number, size in enumerate(sizes, 1):
            value, titled = by_title[(direction, number)]
            assert titled == size
            sign = 1 if direction == pictures.DIRECTIONS[0] else -1
            assert abs(value - sign * size) * per_byte <= 0.5, (direction, number, value, size)


def check_test(figure, match, packet):
    """The test as drawn is the test as printed (``match``: DEMO_LINE or capture's line)."""
    rows = {row[0]: row for row in figure["rows"]}
    verdict, popcount, prefix, share, run_ = (match.group(1), match.group(3), match.group(4),
                                              match.group(5), match.group(6))
    assert rows["verdict"][1] == verdict
    assert rows["Ex1"][2] == "%s bits/byte" % popcount
    assert rows["Ex2"][2] == ("yes" if prefix == "printable" else "no")
    assert rows["Ex3"][2] == "%s%%" % share
    assert rows["Ex4"][2] == "%s bytes" % run_
    first = capture.FirstPacket(packet)
    assert [rows[name][4] == "applies" for name in ("Ex1", "Ex2", "Ex3", "Ex4", "Ex5")] == \
        [applies for _, applies in first.rules]
    assert verdict in figure["heading"]


def check_bytes(figure, packet):
    rows = figure["rows"]
    assert [(int(offset), int(value, 16)) for offset, value, _ in rows] == \
        list(enumerate(packet[:pictures.SHOW_BYTES]))
    assert "(%d of %d bytes)" % (min(len(packet), pictures.SHOW_BYTES), len(packet)) in figure["heading"]


def recorded(record_dir):
    """(client -> server, server -> client) bytes, as the demo's client recorded them."""
    initiator, = Path(record_dir).glob("*-client-*.initiator.bin")
    responder, = Path(record_dir).glob("*-client-*.responder.bin")
    return initiator.read_bytes(), responder.read_bytes()


def printed_field(out, name, offset, length):
    """Whether the walk printed a field row ``offset length name`` (a TLS record: its
    row ``offset type body-length``)."""
    if name in ("handshake", "application_data", "change_cipher_spec", "alert"):
        return re.search(r"\n +%d  %s +%d   " % (offset, name, length - 5), out) is not None
    return re.search(r"\n +%d +%d  %s[ \x1b]" % (offset, length, re.escape(name)), out) is not None


# --- demo --html, one transport at a time --------------------------------------------------

@pytest.mark.parametrize("transport", sorted(KINDS))
def test_every_number_drawn_is_one_the_demo_printed(tmp_path, transport):
    page_path = tmp_path / "demo.html"
    status, out, err = run("demo", "--transport=" + transport, "--html=" + str(page_path),
                           "--record-dir=" + str(tmp_path / "rec"))
    assert status == 0, err + out[-3000:]
    assert out.rstrip().endswith("(%d bytes, one page, nothing to load: open it in any browser)."
                                 % page_path.stat().st_size)
    page = read_page(page_path)
    assert {f["kind"] for f in page.figures} == KINDS[transport]
    c_wire, s_wire = recorded(tmp_path / "rec")

    # The handshake: the writes add up to the recorded wire, and every field drawn in a
    # side's first write is a row the walk printed.
    handshake, = page.of("handshake")
    messages = {}
    for number, direction, what, size, field, offset, length in handshake["rows"]:
        messages.setdefault((int(number), direction, what, int(size)), []).append((field, int(offset),
                                                                                   int(length)))
    for (_, direction, what, size), fields in messages.items():
        assert sum(length for _, _, length in fields) == size
        assert [offset for _, offset, _ in fields] == [sum(f[2] for f in fields[:i])
                                                       for i in range(len(fields))]
        if what == "write 1" and transport in ("obfs2", "obfs3", "obfs4", "webtunnel"):
            named = [f for f in fields if f[0] not in ("rest", "bytes")]
            assert named, (direction, fields)
            for field, offset, length in named:
                assert printed_field(out, field, offset, length), (direction, field, offset, length)

    # The sizes: each direction's writes are the recorded wire, cut where the demo's tap cut it.
    sizes, = page.of("sizes")
    writes = [(row[0], int(row[3])) for row in sizes["rows"]]
    for direction, wire in zip(pictures.DIRECTIONS, (c_wire, s_wire)):
        mine = [size for d, size in writes if d == direction]
        assert 0 < len(mine) <= pictures.FIRST
        assert sum(mine) == len(wire) or len(mine) == pictures.FIRST
    check_sizes(sizes, writes)

    # The first write and the test on it: the bytes recorded, the figures printed.
    first_size = next(size for d, size in writes if d == pictures.DIRECTIONS[0])
    packet = c_wire[:first_size]
    check_bytes(page.of("first-bytes")[0], packet)
    check_test(page.of("test")[0], DEMO_LINE.search(out), packet)

    if transport == "obfs4":
        # Each side's second write is its frames after the handshake (the server's seed frame
        # rode in its first), as the walk opened and listed them: 2 + L bytes each.
        for direction in pictures.DIRECTIONS:
            table = out.split("The frames, %s" % direction, 1)[1].split("Each frame on the wire", 1)[0]
            listed = [2 + int(length) for length in
                      re.findall(r"\n +\d+  [0-9a-f]{4}   [0-9a-f]{4}  +(\d+)  +type ", table)]
            frames = messages[next(key for key in messages if key[1] == direction and key[2] == "write 2")]
            assert frames and {f[0] for f in frames} <= {"data frame", "padding", "seed frame"}
            drawn = [length for _, _, length in frames]
            assert drawn == listed[len(listed) - len(drawn):], (direction, drawn, listed)
        seed = bytes.fromhex(re.search(r"carries its drbg-seed, ([0-9a-f]{48})", out).group(1))
        other = hashlib.sha256(b"another bridge " + seed).digest()[:24]
        padding, = page.of("padding")
        for label_seed, table in ((seed, WeightedDist(seed, 0, 1448)), (other, WeightedDist(other, 0, 1448))):
            label = [row for row in padding["rows"] if label_seed.hex()[:12] in row[0]]
            expected = sorted((value, 100 * weight / sum(table.weights))
                              for value, weight in zip(table.values, table.weights))
            assert [(int(row[1]), float(row[2])) for row in label] == \
                [(value, round(share, 2)) for value, share in expected]
    if transport == "webtunnel":
        records, = page.of("records")
        outer = [int(row[3]) for row in records["rows"] if row[0].startswith("on the wire")]
        inner = [int(row[3]) for row in records["rows"] if row[0].startswith("carried")]
        printed = [int(length) for length in re.findall(r"\n +\d+  (?:handshake|application_data|"
                                                        r"change_cipher_spec|alert) +(\d+)   ", out)]
        assert outer == [5 + length for length in printed[:len(outer)]]
        carried = [int(n) for n in re.findall(r"\n +\d+  application_data +\d+   (\d+) bytes: ", out)]
        assert all(n in inner for n in carried)


def test_the_test_figure_reads_each_rule_as_capture_does():
    """In process, on packets chosen to stop at each rule: the drawn readings, results
    and verdict are the FirstPacket's, and the marks' <title>s say the same."""
    packets = [bytes(64), b"GET / HTTP/1.1\r\n" + bytes(range(128, 200)), b"\x16\x03\x01" + os.urandom(300),
               os.urandom(500), bytes([0x41, 0xC3]) * 60]
    for packet in packets:
        first = capture.FirstPacket(packet)
        figure = pictures.test_figure(first, "a packet", "caption")
        rows = {row[0]: row for row in figure.rows}
        assert rows["verdict"][1] == first.verdict
        assert rows["Ex1"][2] == "%.2f bits/byte" % first.popcount
        assert rows["Ex3"][2] == "%.1f%%" % (100 * first.printable_share)
        assert rows["Ex4"][2] == "%d bytes" % first.longest_run
        assert [rows[name][4] == "applies" for name, _ in first.rules] == [a for _, a in first.rules]
        svg_text = figure.svg()
        assert ("FLAGGED" in svg_text) == (first.rule is None)
        assert "<title>Ex1 set bits per byte: %.2f bits/byte" % first.popcount in svg_text


def test_the_records_figure_draws_every_series_it_is_given():
    """A third series (a shaped run, say) is one more entry: one more bar per record,
    each bar as tall as its number, in the table and in its <title>."""
    series = [("on the wire", [(0, 522), (0, 40), (1, 1400)]),
              ("carried inside", [(0, 500), (0, 18), (1, 1378)]),
              ("on the wire, shaped", [(0, 1200), (0, 1200), (1, 1200)])]
    figure = pictures.records_figure(series, "caption")
    assert [tuple(row) for row in figure.rows] == [(label, number, pictures.DIRECTIONS[side], size)
                                                   for label, points in series
                                                   for number, (side, size) in enumerate(points, 1)]
    bars = re.findall(r'<rect x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)" fill="[^"]+" '
                      r'stroke="[^"]+"><title>([^<]*): (\d+) bytes</title>', figure.svg())
    assert len(bars) == 9
    _, tallest, _, biggest = max(bars, key=lambda bar: int(bar[3]))
    per_byte = float(tallest) / int(biggest)
    for _, height, _, size in bars:
        assert abs(float(height) - per_byte * int(size)) < 0.5


def test_a_page_escapes_what_it_shows_and_loads_nothing(tmp_path):
    first = capture.FirstPacket(b"<script>alert(1)</script>" * 4)
    section = pictures.Section("x", "<b>heading</b>", "a & b", [pictures.test_figure(first, "<i>", "c")])
    path = tmp_path / "p.html"
    pictures.write_page(path, "<title>", "intro <img src=x>", [section])
    text = path.read_text(encoding="utf-8")
    assert "<script" not in text and "<img" not in text and "<b>" not in text
    assert "default-src 'none'" in text
    assert read_page(path).figures[0]["kind"] == "test"


# --- demo --transport=all, detect and unmask ------------------------------------------------

@pytest.fixture(scope="module")
def all_pages(tmp_path_factory):
    """``demo --transport=all --html`` with its recordings, then ``detect --html`` and
    ``unmask --html`` on those recordings: {name: (page path, printed text)}."""
    folder = tmp_path_factory.mktemp("all")
    pages = {}
    status, out, err = run("demo", "--transport=all", "--record-dir=rec", "--html=demo-all.html", cwd=folder)
    assert status == 0, err + out[-3000:]
    pages["demo-all"] = (folder / "demo-all.html", out)
    for command in ("detect", "unmask"):
        status, out, err = run(command, "rec", "--html=%s.html" % command, cwd=folder)
        assert status == 0 and err == "", err
        pages[command] = (folder / ("%s.html" % command), out)
    return pages


def test_the_all_page_sets_every_transport_side_by_side(all_pages):
    path, out = all_pages["demo-all"]
    page = read_page(path)
    text = path.read_text(encoding="utf-8")
    assert '<div class="grid">' in text
    for name in KINDS:
        assert "demo --transport=%s" % name in page.sections
        section = "demo --transport=%s" % name
        assert {f["kind"] for f in page.figures if f["section"] == section} == KINDS[name]
    overview, = page.of("map")
    printed = [match.group(1) for match in DEMO_LINE.finditer(out)]
    assert [row[3] for row in overview["rows"]] == printed
    assert [row[0] for row in overview["rows"]] == [name for name in _order(out)]
    # The comparison on one scale: each side's first write of each transport, as drawn in
    # that transport's own section.
    compared, = page.of("handshake", "side by side")
    for name in KINDS:
        own, = page.of("handshake", "demo --transport=%s" % name, exact=True)
        for direction in pictures.DIRECTIONS:
            mine = [row[4:] for row in own["rows"] if row[1] == direction and row[2] == "write 1"]
            there = [row[4:] for row in compared["rows"] if row[1] == direction
                     and row[2] == "%s, write 1" % name]
            assert mine == there and mine, (name, direction)


def _order(out):
    return re.findall(r"obfsproxy\.py demo: the (\S+) tunnel on 127\.0\.0\.1", out)


def test_detect_draws_what_it_printed(all_pages):
    path, out = all_pages["detect"]
    page = read_page(path)
    lines = [re.search(r"fully-encrypted test: (flagged|exempt \((Ex\d)\))  popcount ([\d.]+) bits/byte, "
                       r"first 6 bytes (printable|not all printable), ([\d.]+)% printable, longest "
                       r"printable run (\d+)", line)
             for line in out.splitlines() if "fully-encrypted test:" in line]
    overview, = page.of("map")
    assert [row[3] for row in overview["rows"]] == [line.group(1) for line in lines]
    assert [row[1] for row in overview["rows"]] == [line.group(3) for line in lines]
    tests = page.of("test")
    assert len(tests) == len(lines) == 2 * len(KINDS)     # every transport, recorded by each end
    for figure, line in zip(tests, lines):
        assert figure["rows"][-1][1] == line.group(1)
        assert figure["rows"][0][2] == "%s bits/byte" % line.group(3)
    assert page.of("sizes") == []                         # recordings have no packets


def test_unmask_draws_the_obfs2_handshakes_it_read(all_pages):
    path, out = all_pages["unmask"]
    page = read_page(path)
    handshakes = page.of("handshake")
    assert len(handshakes) == 2 == out.count("key schedule, recomputed from the two seeds in clear")
    for figure in handshakes:
        padlens = [int(n) for n in re.findall(r"\n +24 +(\d+)  padding", out)]
        drawn = [int(row[6]) for row in figure["rows"] if row[4] == "padding"]
        assert len(drawn) == 2 and all(n in padlens for n in drawn)
        assert [row[4] for row in figure["rows"]][:3] == ["SEED", "MAGIC", "PADLEN"]
        assert {row[2] for row in figure["rows"]} == {"all it sent"}


def test_detect_draws_the_packets_of_a_pcap(tmp_path):
    """A pcap built here (test_capture's builder): the sizes drawn are its TCP packets
    with data, in capture order, and their capture times."""
    from test_capture import REPLY, REQUEST, conversation_frames, obfs2_pair, pcap_file
    c_stream, s_stream = obfs2_pair(REQUEST, REPLY)
    frames, _ = conversation_frames(random.Random(3), 1, ("192.0.2.1", 1234), ("192.0.2.2", 443),
                                    c_stream, s_stream)
    path = tmp_path / "crafted.pcap"
    path.write_bytes(pcap_file(frames, 1))
    status, out, err = run("detect", str(path), "--html=" + str(tmp_path / "d.html"))
    assert status == 0, err
    _, conversations = capture.load([str(path)])
    sizes, = read_page(tmp_path / "d.html").of("sizes")
    packets = conversations[0].packets
    start = min(when for flow in packets for when, _ in flow[:pictures.FIRST])
    expected = [(direction, number, "%.3f" % ((when - start) * 1000), str(size))
                for direction, flow in zip(pictures.DIRECTIONS, packets)
                for number, (when, size) in enumerate(flow[:pictures.FIRST], 1)]
    assert [tuple(row) for row in sizes["rows"]] == [(d, str(n), t, s) for d, n, t, s in expected]
    assert sum(len(flow) for flow in packets) == sum(1 for f in frames if len(f) > 14 + 20 + 20)
    check_sizes(sizes, [(d, int(s)) for d, _, _, s in expected])


# --- In a real browser ----------------------------------------------------------------------

def chromium():
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if IN_CI:
            pytest.fail("chromium is not installed, but CI must install it (.ci/run)")
        pytest.skip("chromium is not installed (apt-get install chromium); CI installs it")
    return path


def browse(page_path, screenshot, width=1400, height=2400):
    """Headless Chromium on ``page_path``: (the DOM it built, its console lines). One run
    saves a screenshot, another dumps the DOM; both log the console to stderr."""
    base = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            "--no-first-run", "--disable-extensions", "--disable-dev-shm-usage", "--enable-logging=stderr",
            "--v=0",
            "--user-data-dir=%s" % (Path(screenshot).parent / "chromium-profile")]
    url = Path(page_path).resolve().as_uri()
    shot = subprocess.run(base + ["--window-size=%d,%d" % (width, height), "--screenshot=%s" % screenshot,
                                  url], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    dom = subprocess.run(base + ["--dump-dom", url], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=120)
    console = [line for line in (shot.stderr + dom.stderr).splitlines() if ":CONSOLE" in line]
    assert shot.returncode == 0 and dom.returncode == 0, (shot.stderr[-2000:], dom.stderr[-2000:])
    assert Path(screenshot).stat().st_size > 10000 and \
        Path(screenshot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return dom.stdout, console


PAGES = ["demo-%s" % name for name in sorted(KINDS)] + ["demo-all", "detect", "unmask"]


def test_every_page_renders_in_chromium(tmp_path, all_pages):
    """Each page in headless Chromium: no console message, every drawing there with its
    title and labelled axes. With OBFSPROXY_SCREENSHOT=FILE the all-transports page's
    screenshot is also copied to FILE (the README's docs/pictures.png)."""
    chromium()
    paths = {name: path for name, (path, _) in all_pages.items()}
    for name in KINDS:
        paths["demo-" + name] = tmp_path / ("demo-%s.html" % name)
        status, out, err = run("demo", "--transport=" + name, "--html=" + str(paths["demo-" + name]))
        assert status == 0, err
    for name in PAGES:
        dom, console = browse(paths[name], tmp_path / ("%s.png" % name),
                              *((1400, 820) if name == "demo-all" else (1000, 2600)))
        assert console == [], (name, console)
        assert "<svg" in dom and dom.count("<figure") == len(read_page(paths[name]).figures)
        for figure in read_page(paths[name]).figures:
            assert figure["heading"] in html.unescape(dom), (name, figure["heading"])
            labels = [words for _, attrs, words in figure["svg"]
                      if attrs.get("class") in ("xlabel", "ylabel")]
            if figure["kind"] in ("sizes", "first-bytes", "map", "padding", "records"):
                assert len(labels) == 2 and all("(" in label or label == "bytes" for label in labels), labels
        print("%s: %s" % (name, tmp_path / ("%s.png" % name)))
    wanted = os.environ.get("OBFSPROXY_SCREENSHOT")
    if wanted:
        shutil.copyfile(str(tmp_path / "demo-all.png"), wanted)
