"""Terminal presentation shared by ``demo`` and ``unmask``/``detect``: it draws, it decides nothing.

What a student reads is drawn here, the same way in both commands::

    Style               ANSI colour on a terminal, plain text anywhere else (NO_COLOR)
    hexline, hexdump    bytes as "16 03 01 ..." and as offset | hex | ASCII rows
    field_row           one row of a byte-layout table (offset, length, field, wire, meaning)
    duration            '42 us', '12.3 ms', '1.23 s'
    entropy             bits per byte, the figure shown beside random-looking bytes
    key_schedule        obfs2's four keys, from obfs2.py's own functions, as table rows
    key_schedule_lines  those rows as the spec's formulas, keys and IVs
    header_lines        one obfs2 handshake message, field by field

Nothing here prints: every function returns values or lines for the caller to print.
"""

import math
import os
import struct
import sys

import obfs2


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


FIELD_HEADER = "    %6s  %8s  %-12s  %-34s  %s" % ("offset", "length", "field", "on the wire", "meaning")


def field_row(offset, length, name, wire, meaning, style=PLAIN):
    return "    %6s  %8s  %s  %s  %s" % (offset, length, style("field", "%-12s" % name),
                                         style("wire", "%-34s" % wire), meaning)


def entropy(data):
    """Shannon entropy in bits per byte (uniformly random bytes: close to 8)."""
    counts = [0] * 256
    for byte in data:
        counts[byte] += 1
    return -sum(c / len(data) * math.log2(c / len(data)) for c in counts if c)


# --- obfs2, as a table: its keys and one handshake message ---------------------

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
