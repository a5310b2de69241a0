"""svg.py: drawings as inline SVG text, made with the standard library only. It draws, it
decides nothing: pictures.py says what to draw, from the analysis the text output prints.

::

    Figure          one drawing: title, the SVG, a caption (what to look at), and a table
                    of the same numbers for a reader who cannot see it; ``html()``
    Axis            a linear scale: value <-> pixel, "nice" ticks, a label with its unit
    stems           values over x as stems with markers, several series (packet sizes)
    strips          rows of proportional segments (a handshake message's fields)
    gauges          one row per threshold test: a scale, its exempt zones, the value
    marker          a point drawn as a shape, so that series differ by more than colour

Colours are Okabe and Ito's palette (safe for the common colour-vision deficiencies), and
every series also has its own marker shape and line dash. Each mark carries a <title>
(what a screen reader or a mouse pointer gets), and ``Figure.table`` holds the numbers.
"""

import html
import math

# Okabe & Ito, "Color Universal Design" (2008): distinguishable with any common deficiency.
BLUE, VERMILLION, GREEN, ORANGE, PURPLE, SKY, YELLOW, BLACK = (
    "#0072B2", "#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
# A series' look: (colour, marker shape, stroke dash). The first two are the directions.
LOOKS = [(BLUE, "circle", ""), (VERMILLION, "square", "5 3"), (GREEN, "diamond", "2 2"),
         (ORANGE, "triangle", "8 3 2 3"), (PURPLE, "cross", "1 3"), (SKY, "circle", "6 2")]
GREY, LIGHT = "#595959", "#e8e8e8"
FONT = "font-family:sans-serif"


def esc(text):
    return html.escape(str(text), quote=True)


def title(text):
    """A <title> child: the tooltip, and what a screen reader says for the mark."""
    return "<title>%s</title>" % esc(text)


def text(x, y, words, size=12, anchor="start", weight="normal", colour=BLACK, rotate=None, cls=None):
    turn = ' transform="rotate(%d %.1f %.1f)"' % (rotate, x, y) if rotate else ""
    kind = ' class="%s"' % cls if cls else ""
    return ('<text x="%.1f" y="%.1f" font-size="%d" text-anchor="%s" font-weight="%s" fill="%s"%s%s>'
            '%s</text>' % (x, y, size, anchor, weight, colour, turn, kind, esc(words)))


def marker(shape, x, y, colour, size=4.5, tip=None):
    """A point as a shape (circle, square, diamond, triangle, cross), with its <title>."""
    inner = title(tip) if tip else ""
    if shape == "circle":
        return '<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s">%s</circle>' % (x, y, size, colour, inner)
    if shape == "square":
        return '<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s">%s</rect>' % (
            x - size, y - size, 2 * size, 2 * size, colour, inner)
    points = {"diamond": [(0, -1.3), (1.3, 0), (0, 1.3), (-1.3, 0)],
              "triangle": [(0, -1.3), (1.2, 1), (-1.2, 1)],
              "cross": [(-1, -1), (0, -0.4), (1, -1), (0.4, 0), (1, 1), (0, 0.4), (-1, 1), (-0.4, 0)]}[shape]
    return '<polygon points="%s" fill="%s">%s</polygon>' % (
        " ".join("%.1f,%.1f" % (x + dx * size, y + dy * size) for dx, dy in points), colour, inner)


def nice_ticks(low, high, count=5):
    """Round tick values covering [low, high]: steps of 1, 2 or 5 times a power of ten."""
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(power * m for m in (1, 2, 5, 10) if power * m >= raw)
    first = math.floor(low / step) * step
    ticks, value = [], first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    if ticks[-1] < high:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def number(value):
    """A tick or table value: no needless decimals."""
    return ("%d" % value) if float(value).is_integer() else ("%.3g" % value)


class Axis:
    """A linear scale from [low, high] (its ticks' range) onto pixels [start, end]."""

    def __init__(self, low, high, start, end, label, ticks=None):
        self.ticks = ticks or nice_ticks(low, high)
        self.low, self.high = self.ticks[0], self.ticks[-1]
        self.start, self.end, self.label = start, end, label

    def __call__(self, value):
        return self.start + (value - self.low) / ((self.high - self.low) or 1) * (self.end - self.start)


class Figure:
    """One drawing and its words. ``kind`` names it for the page and the tests; ``table``
    is (headers, rows): the numbers drawn, as text."""

    def __init__(self, kind, heading, width, height, caption, table):
        self.kind, self.heading, self.caption = kind, heading, caption
        self.width, self.height = width, height
        self.body = []
        self.headers, self.rows = table

    def add(self, *parts):
        self.body.extend(parts)

    def svg(self):
        return ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" '
                'role="img" style="%s;max-width:100%%;height:auto">%s<desc>%s</desc>%s</svg>'
                % (self.width, self.height, self.width, self.height, FONT, title(self.heading),
                   esc(self.caption), "".join(self.body)))

    def html(self):
        head = "".join("<th scope=\"col\">%s</th>" % esc(h) for h in self.headers)
        rows = "".join("<tr>%s</tr>" % "".join("<td>%s</td>" % esc(cell) for cell in row)
                       for row in self.rows)
        return ('<figure class="drawing" data-figure="%s"><h3>%s</h3>%s<figcaption>%s</figcaption>'
                '<details><summary>The numbers drawn (%d row%s)</summary><table><thead><tr>%s</tr></thead>'
                '<tbody>%s</tbody></table></details></figure>'
                % (esc(self.kind), esc(self.heading), self.svg(), esc(self.caption), len(self.rows),
                   "" if len(self.rows) == 1 else "s", head, rows))


def frame(figure, x_axis, y_axis, zero_line=False):
    """Grid lines, tick labels and both axis labels (with units) for a plot area."""
    parts = []
    top, bottom = min(y_axis.start, y_axis.end), max(y_axis.start, y_axis.end)
    for tick in y_axis.ticks:
        y = y_axis(tick)
        parts.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>'
                     % (x_axis.start, y, x_axis.end, y, "#999999" if tick == 0 and zero_line else LIGHT))
        parts.append(text(x_axis.start - 6, y + 4, number(abs(tick)), 12, "end", colour=GREY, cls="ytick"))
    for tick in x_axis.ticks:
        x = x_axis(tick)
        parts.append(text(x, bottom + 16, number(tick), 12, "middle", colour=GREY, cls="xtick"))
    parts.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>'
                 % (x_axis.start, bottom, x_axis.end, bottom, GREY))
    parts.append(text((x_axis.start + x_axis.end) / 2, bottom + 34, x_axis.label, 13, "middle",
                      cls="xlabel"))
    parts.append(text(16, (top + bottom) / 2, y_axis.label, 13, "middle", rotate=-90, cls="ylabel"))
    figure.add(*parts)


def legend(figure, x, y, entries):
    """A row of (label, look) at (x, y): marker, dash and words, so no entry needs colour."""
    for label, (colour, shape, dash) in entries:
        figure.add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2" '
                   'stroke-dasharray="%s"/>' % (x, y, x + 22, y, colour, dash),
                   marker(shape, x + 11, y, colour), text(x + 28, y + 4, label, 13, cls="legend"))
        x += 40 + 7.5 * len(label)


def stems(figure, x_axis, y_axis, series):
    """Each series: (label, look, [(x, y, tip)]). A stem from y = 0 to each value, a marker
    on its end; the <title> of the marker is ``tip``."""
    for _, (colour, shape, dash), points in series:
        for x, y, tip in points:
            px, py = x_axis(x), y_axis(y)
            figure.add('<line class="stem" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" '
                       'stroke-width="2" stroke-dasharray="%s"/>' % (px, y_axis(0), px, py, colour, dash),
                       marker(shape, px, py, colour, tip=tip))


def strip(figure, x, y, width, height, segments, colour, pattern):
    """One message as a row of segments proportional to their lengths (each at least 30 px
    wide, so that a 2-byte field stays visible and its name stays readable): segments are
    (name, length, tip). ``pattern``: the fill's id (hatching tells the directions apart)."""
    total = sum(length for _, length, _ in segments) or 1
    floor = 30.0
    spare = max(width - floor * len(segments), 0)
    at = x
    for index, (name, length, tip) in enumerate(segments):
        wide = floor + spare * length / total
        shade = "url(#%s)" % pattern if index % 2 else colour
        figure.add('<g class="segment"><rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" '
                   'stroke="white" stroke-width="1.5" fill-opacity="%s">%s</rect>'
                   % (at, y, wide, height, shade, "1" if index % 2 == 0 else "0.9", title(tip)))
        fits = int((wide - 4) // 7.5)          # characters of bold 12 px that fit
        if fits >= 2:
            figure.add(text(at + wide / 2, y + height / 2 - 1, name[:fits], 12, "middle", "bold",
                            "white" if index % 2 == 0 else BLACK),
                       text(at + wide / 2, y + height / 2 + 13, str(length)[:fits + 1], 11, "middle",
                            colour="white" if index % 2 == 0 else BLACK), "</g>")
        else:
            figure.add("</g>")
        at += wide


def hatch(pattern, colour):
    """A <defs> pattern of diagonal lines in ``colour`` on white."""
    return ('<defs><pattern id="%s" width="6" height="6" patternUnits="userSpaceOnUse" '
            'patternTransform="rotate(45)"><rect width="6" height="6" fill="white"/>'
            '<line x1="0" y1="0" x2="0" y2="6" stroke="%s" stroke-width="2"/></pattern></defs>'
            % (pattern, colour))


def gauge(figure, x, y, width, axis_low, axis_high, zones, value, label, reading, applies, tip, ends=None):
    """One threshold test as a row: a scale from axis_low to axis_high, its exempt
    ``zones`` [(low, high)] hatched, the packet's ``value`` as a marker, and in words
    the test and what it read. ``ends``: words for the two ends of a yes/no scale."""
    scale = Axis(axis_low, axis_high, x, x + width, "", ticks=[axis_low, axis_high])
    figure.add(text(8, y + 4, label, 12, weight="bold"),
               '<rect x="%.1f" y="%.1f" width="%.1f" height="14" fill="%s"/>' % (x, y - 7, width, LIGHT))
    for low, high in zones:
        says = title("exempt from %s to %s" % (number(low), number(high)))
        figure.add('<rect class="zone" x="%.1f" y="%.1f" width="%.1f" height="14" fill="url(#exempt)">'
                   '%s</rect>' % (scale(low), y - 7, scale(high) - scale(low), says))
    low_end, high_end = ends or (number(axis_low), number(axis_high))
    figure.add(text(x, y + 22, low_end, 10, "middle", colour=GREY),
               text(x + width, y + 22, high_end, 10, "middle", colour=GREY))
    for low, high in zones if ends is None else ():
        for edge in (low, high):
            if axis_low < edge < axis_high:
                figure.add(text(scale(edge), y + 22, number(edge), 10, "middle", colour=GREY))
    shown = min(max(value, axis_low), axis_high)
    figure.add(marker("diamond", scale(shown), y, VERMILLION if applies else BLUE, 7, tip),
               text(x + width + 14, y + 4, reading, 12, weight="bold" if applies else "normal"))
