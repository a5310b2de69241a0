r"""The passive attacks, for teaching: ``unmask`` and ``detect``.

obfs2 sends each side's seed in clear, and every key is a hash of the seeds.
So anyone who records a connection can do what the two ends did::

    capture (pcap, or the two files of --record-dir)
        |  pcap.load                                  pcap.py: link layer, IP, TCP,
        v                                             reassembly, recordings
    Conversation: the bytes each side sent (and each side's first TCP payload)
        |  read_side: SEED = bytes 0..15 (clear); PAD key = MAC(label, SEED);
        |             decrypt bytes 16..23 -> MAGIC, PADLEN       (detect stops here:
        |                                                          one SHA-256, one AES block)
        |  unmask: data keys = MAC(label, INIT_SEED | RESP_SEED);
        v          decrypt everything after 24 + PADLEN
    the inner stream (for Tor: the TLS ClientHello the censor was looking for)

With a shared secret every MAC costs HASH_ITERATIONS SHA-256 instead of one,
and needs the secret. That is all the secret adds.

obfs3 and obfs4 put no key on the wire: ``unmask`` says, field by field, what
the same attack finds there and why it stops (``explain_obfs3``,
``explain_obfs4``). Given an obfs4 bridge's state directory it checks what the
bridge's keys can check, the handshake marks and MACs (``Bridge``), and shows
why they still do not decrypt anything: ntor is forward secure.

``detect`` also runs a test that needs no protocol knowledge at all: the
"fully encrypted traffic" heuristic that the Great Firewall of China deployed
in November 2021, as Wu et al. measured it (``FirstPacket``). It looks at one
packet, the client's first, and flags obfs2, obfs3 and obfs4 alike.

No sockets here: everything reads files or bytes (pcap.py), and what is shown
is drawn by present.py, which ``demo`` uses too. The recording side is the
transport wrapper behind ``--record-dir`` (``transports.RecordDir``).

Errors: ``CaptureError`` (pcap.py) means the input cannot be read (truncated,
corrupt, unsupported, not a capture); ``main`` prints it on one line and exits
with status 1.
"""

import functools
import hashlib
import hmac
import os
import re
import struct
import sys
import textwrap
import time
from pathlib import Path

import obfs2
import obfs3
import obfs4
import obfs4_state
import tlswire
from cryptoroutes.curve25519 import elligator2_direct, x25519
from teaching import tls_in_tls
from teaching.pcap import CaptureError, load
from teaching.present import (
    FIELD_HEADER,
    PLAIN,
    duration,
    entropy,
    field_row,
    header_lines,
    hexdump,
    hexline,
    key_schedule,
    key_schedule_lines,
)

SHOW_BYTES = 512          # decrypted bytes shown per direction without --full


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


# --- The fully-encrypted test (the Great Firewall, November 2021) ------------------
#
# Wu et al., "How the Great Firewall of China Detects and Blocks Fully Encrypted
# Traffic", USENIX Security 2023, measured this rule from outside. Rather than
# recognise encrypted traffic, it exempts what is unlikely to be encrypted and
# flags the rest. It looks at one packet only, the client's first data packet,
# and the first exemption that applies decides:
#
#     Ex1  popcount(pkt) / len(pkt) <= 3.4  or  >= 4.6   set bits per byte (random: 4.0)
#     Ex2  pkt[0:6] all printable (0x20..0x7e)
#     Ex3  more than 50% of pkt printable
#     Ex4  more than 20 contiguous printable bytes
#     Ex5  pkt starts like TLS ([16-17] 03 [00-09]) or HTTP ("GET ", "PUT ", "POST", "HEAD")
#     none applies: flagged (the GFW then blocked a fraction of such connections)
#
# What follows is our reconstruction of that published measurement, not the censor's code.

POPCOUNT_LOW, POPCOUNT_HIGH = 3.4, 4.6
PRINTABLE_PREFIX = 6
PRINTABLE_SHARE = 0.5
PRINTABLE_RUN = 20
TLS_START = re.compile(rb"[\x16\x17]\x03[\x00-\x09]")
HTTP_STARTS = (b"GET ", b"PUT ", b"POST", b"HEAD")
RECORDING_PACKET = 1460   # a recording has no packet boundaries: one Ethernet MSS stands in
WU_2023 = "Wu et al., USENIX Security 2023"


def is_printable(byte):
    return 0x20 <= byte <= 0x7E


class FirstPacket:
    """The figures of one packet that the fully-encrypted test reads, and its verdict.

    ``rule`` is "Ex1" .. "Ex5" for the exemption that applied first, or None: flagged;
    ``rules`` says of each whether it applied. The thresholds ride along as class
    attributes, for whoever draws them (pictures.py).
    """

    POPCOUNT_LOW, POPCOUNT_HIGH, PRINTABLE_PREFIX = POPCOUNT_LOW, POPCOUNT_HIGH, PRINTABLE_PREFIX
    PRINTABLE_SHARE, PRINTABLE_RUN, SOURCE = PRINTABLE_SHARE, PRINTABLE_RUN, WU_2023
    is_printable = staticmethod(is_printable)

    def __init__(self, packet):
        self.packet = bytes(packet)
        self.length = len(packet)
        bits = sum(bin(byte).count("1") for byte in packet)
        self.popcount = bits / len(packet) if packet else 0.0
        printable = [is_printable(byte) for byte in packet]
        self.printable_share = sum(printable) / len(packet) if packet else 0.0
        self.longest_run = run = 0
        for flag in printable:
            run = run + 1 if flag else 0
            self.longest_run = max(self.longest_run, run)
        self.prefix_printable = len(packet) >= PRINTABLE_PREFIX and all(printable[:PRINTABLE_PREFIX])
        if TLS_START.match(packet):
            self.looks_like = "TLS"
        elif packet.startswith(HTTP_STARTS):
            self.looks_like = "HTTP"
        else:
            self.looks_like = None
        self.rules = [("Ex1", not POPCOUNT_LOW < self.popcount < POPCOUNT_HIGH),    # (name, applies)
                      ("Ex2", self.prefix_printable),
                      ("Ex3", self.printable_share > PRINTABLE_SHARE),
                      ("Ex4", self.longest_run > PRINTABLE_RUN),
                      ("Ex5", self.looks_like is not None)]
        self.rule = next((name for name, applies in self.rules if applies), None)

    @property
    def verdict(self):
        return "flagged" if self.rule is None else "exempt (%s)" % self.rule

    def figures(self):
        return "popcount %.2f bits/byte, first %d bytes %s, %.1f%% printable, longest printable " \
               "run %d, %s" % (
                   self.popcount, PRINTABLE_PREFIX,
                   "printable" if self.prefix_printable else "not all printable",
                   100 * self.printable_share, self.longest_run,
                   "starts like %s" % self.looks_like if self.looks_like else "no TLS/HTTP start")


def fully_encrypted_test(conv):
    """(FirstPacket, or None when that side sent no data; the ``detect`` line) for one
    conversation: the test on the initiator's first packet. ``run_detect`` counts and
    explains from the FirstPacket, never from the words of the line."""
    side = conv.initiator if conv.initiator is not None else 0
    who = "the initiator" if conv.initiator is not None else conv.ends[side]
    unknown = "" if conv.initiator is not None else "; who opened the connection is unknown"
    packet = conv.first_packets[side]
    if packet is None:
        packet = conv.streams[side][:RECORDING_PACKET]
        where = "%s's first %d bytes: packet boundaries are not known" % (who, len(packet))
    else:
        where = "%s's first packet, %d bytes" % (who, len(packet))
    if not packet:
        return None, "fully-encrypted test: not applicable: %s sent no data" % who
    first = FirstPacket(packet)
    return first, "fully-encrypted test: %s  %s  (%s%s)" % (first.verdict, first.figures(), where, unknown)


def fully_encrypted_line(conv):
    """The ``detect`` line for one conversation (``fully_encrypted_test``'s)."""
    return fully_encrypted_test(conv)[1]

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


@functools.lru_cache(maxsize=None)
def hash_rate():
    """SHA-256 per second on this machine, measured briefly, once per run (so that every
    connection of one capture gets the same estimate)."""
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


# --- Why the attack fails on obfs3 and obfs4 -------------------------------------

def obfs2_attempt_lines(conv):
    """What the obfs2 attack read in each direction: the would-be seed, and what
    the PAD key made from it decrypts bytes 16..23 to."""
    lines = []
    for index, data in enumerate(conv.streams):
        if len(data) < obfs2.HEADER_LENGTH:
            continue
        initiator = index == (conv.initiator or 0)
        seed, magic, padlen, _ = obfs2.read_header(data, initiator)
        lines.append("  %s: bytes 0..15 as SEED %s; %s from it decrypts bytes 16..23 to"
                     % (conv.role_name(index), hexline(seed, 6), "INIT_PAD" if initiator else "RESP_PAD"))
        lines.append("      %s, not 2b f5 ca 7e and a PADLEN <= 8192"
                     % hexline(struct.pack(">II", magic, padlen)))
    return lines


def explain_obfs3(conv):
    """obfs3, field by field: the clear values are public keys, not seeds."""
    lines = ["obfs3 (UniformDH): each side sends at once a public value, then padding:", FIELD_HEADER]
    for data, initiator, label in zip(conv.client_first(), ("INIT", "RESP"), ("initiator", "responder")):
        if len(data) < obfs3.PUBLIC_KEY_LENGTH:
            lines.append("    the %s sent %d bytes: too few for obfs3's 192-byte public value"
                         % (label, len(data)))
            continue
        value = "X" if initiator == "INIT" else "Y"
        lines += [
            "    the %s's %d bytes:" % (label, len(data)),
            field_row(0, 192, "public value", hexline(data[:192], 8),
                      "%s = g^%s mod p, or p - %s: the private %s never crossed the wire"
                      % (value, value.lower(), value, value.lower())),
            field_row(192, "0..8194", "PAD1 | PAD2", hexline(data[192:], 8),
                      "random; the padding ends where %s_MAGIC starts" % initiator),
            field_row("?", 32, "%s_MAGIC" % initiator, "(nowhere to be found)",
                      'HMAC-SHA256(SHARED_SECRET, "%s magic")' % label.capitalize()),
            field_row("?", "rest", "data", "", "E(%s_SECRET, ...), %s_SECRET = HMAC-SHA256("
                      "SHARED_SECRET, ...)" % (initiator, initiator)),
        ]
    lines += [
        "  obfs2's clear seeds gave every key. obfs3's clear values are Diffie-Hellman public keys:",
        "  SHARED_SECRET = Y^x mod p = X^y mod p needs x or y, which never left the two ends. From X",
        "  and Y alone it is the Diffie-Hellman problem in a 1536-bit group (RFC 3526 group 5): no",
        "  key, no magic, not even where the padding ends. (An active man in the middle, though, can",
        "  run UniformDH with each side: obfs3 authenticates nobody.)",
    ]
    return lines


def explain_obfs4(conv):
    """obfs4 without the bridge's keys: nothing to find, nothing to check."""
    first, second = conv.client_first()
    return [
        "obfs4 (ntor over X25519): the client sends its handshake, the server answers:",
        FIELD_HEADER,
        "    the initiator's %d bytes:" % len(first),
        field_row(0, 32, "X'", hexline(first[:32], 8),
                  "Elligator2 representative of X = x*G: every 32 bytes decode to some X"),
        field_row(32, "77..8128", "P_C", hexline(first[32:], 8), "random padding"),
        field_row("?", 16, "M_C", "(cannot be found)", "H16(B | NODEID, X'): B and NODEID are in the "
                  "bridge line (cert=), never on the wire"),
        field_row("?", 16, "MAC_C", "", "H16(B | NODEID, X' | P_C | M_C | E), E = the hour"),
        "    the responder's %d bytes:" % len(second),
        field_row(0, 32, "Y'", hexline(second[:32], 8), "the server's representative"),
        field_row(32, 32, "AUTH", hexline(second[32:64], 8), "proves the server holds b, B's private key"),
        field_row(64, "0..8051", "P_S", hexline(second[64:], 8), "random padding, then M_S and MAC_S"),
        field_row("?", "rest", "frames", "", "length XOR a DRBG mask (2) | tag (16) | XSalsa20 ciphertext"),
        "  KEY_SEED = HMAC(t_key, X25519(x, Y) | X25519(x, B) | B | B | X | Y | PROTOID | NODEID) needs",
        "  the client's x, or the server's y and b. x and y are erased once the handshake is done.",
        "  Without the bridge line an observer cannot even find M_C; with the bridge's state",
        "  directory (--state-dir=DIR) unmask checks the marks and MACs, and still gets no key.",
    ]


class Bridge:
    """An obfs4 bridge's identity, read (never written) from its state directory's
    obfs4_state.json by the server's own loader (``obfs4_state.read_identity``), so that
    unmask accepts exactly the state files a bridge accepts."""

    def __init__(self, state_dir):
        path = Path(state_dir) / obfs4_state.STATE_FILE
        try:
            self.identity = obfs4_state.read_identity(state_dir)
        except FileNotFoundError:
            raise CaptureError("%s: no %s: --state-dir must be an obfs4 bridge's state directory"
                               % (state_dir, obfs4_state.STATE_FILE))
        except OSError as exc:
            raise CaptureError("%s: %s" % (path, exc.strerror or exc))
        except ValueError as exc:
            raise CaptureError("not an obfs4 state file: %s" % exc)
        self.path = path
        self.key = self.identity.public_key + self.identity.node_id      # KEY = B | NODEID


def match_epoch(key, head, mac, when):
    """E such that H16(KEY, head | E) == mac, searched from the hour of ``when``
    outwards, 72 hours each way; None if no hour matches."""
    hour = int(when if when is not None else time.time()) // 3600
    for distance in range(73):
        for candidate in {hour - distance, hour + distance}:
            e = str(candidate).encode("ascii")
            if hmac.compare_digest(obfs4.h16(key, head + e), mac):
                return e
    return None


def find_mark(data, mark, start):
    """Where ``mark`` sits in data[start:8192] with 16 bytes after it for the MAC, or -1."""
    pos = data.find(mark, start, obfs4.MAX_HANDSHAKE_LENGTH)
    return pos if pos >= 0 and pos + 32 <= len(data) else -1


def find_client_handshake(conv, key):
    """(client index, position of M_C) of the first side whose bytes hold an obfs4 client
    handshake for KEY (M_C = H16(KEY, X') after at least 77 bytes of padding), or None."""
    sides = [conv.initiator] if conv.initiator is not None else [0, 1]
    for client in sides:
        data = conv.streams[client]
        pos = find_mark(data, obfs4.h16(key, data[:32]), 32 + obfs4.CLIENT_MIN_PAD_LENGTH)
        if pos >= 0:
            return client, pos
    return None


def check_obfs4(conv, bridge, style=PLAIN):
    """(lines, verified): the client's and server's marks and MACs, checked with KEY =
    B | NODEID from the bridge's state; then why its private key b still reads nothing."""
    identity = bridge.identity
    lines = ["obfs4: the bridge %s has NODEID %s and B %s" % (bridge.path, identity.node_id.hex(),
                                                                identity.public_key.hex()),
             "  its bridge line says cert=%s: KEY = B | NODEID is public to every client" % identity.cert]
    found = find_client_handshake(conv, bridge.key)
    if found is None:
        return lines + ["  no M_C = H16(B | NODEID, X') in the first 8192 bytes%s: this is not an obfs4 "
                        "client of this bridge (obfs3? another bridge? a probe?)"
                        % ("" if conv.initiator is not None else " of either side")], False
    client, pos = found
    c_data, s_data = conv.streams[client], conv.streams[1 - client]
    e = match_epoch(bridge.key, c_data[:pos + 16], c_data[pos + 16:pos + 32], conv.time)
    lines.append("  %s: the client's handshake, %d bytes" % (conv.role_name(client), pos + 32))
    lines += client_handshake_rows(c_data, pos, e, style)
    spos = find_mark(s_data, obfs4.h16(bridge.key, s_data[:32]), 64)
    if spos >= 0 and e:
        lines.append("  %s: the server's reply" % conv.role_name(1 - client))
        lines += server_reply_rows(s_data, spos, bridge.key, e, style)
    x_u = elligator2_direct(c_data[:32])
    lines += [
        "  What the bridge's private key b gives: X = ell2(X') = %s," % x_u.hex(),
        "    EXP2 = X25519(b, X) = %s." % x25519(identity.private_key, x_u).hex(),
        "  What it does not: EXP1 = X25519(y, X) needs the server's ephemeral y, erased once the",
        "    handshake was done. KEY_SEED = HMAC(t_key, EXP1 | EXP2 | ...): without EXP1 there is no",
        "    key, and the frames stay sealed. ntor is forward secure: not even the bridge's operator",
        "    can decrypt a recorded connection. What the cert does prove: this connection is a",
        "    client of this bridge (M_C, MAC_C), and E is the hour its clock said.",
    ]
    return lines, e is not None


def client_handshake_rows(data, pos, e, style=PLAIN):
    """X' | P_C | M_C | MAC_C, with M_C at ``pos`` and the hour ``e`` that MAC_C matched."""
    if e:
        matched = (style("ok", '= H16(KEY, X\' | P_C | M_C | E), E = "%s"' % e.decode())
                   + " (%s UTC)" % time.strftime("%Y-%m-%d %H:00", time.gmtime(int(e) * 3600)))
    else:
        matched = style("bad", "matches no hour within 72 h of the capture")
    return [FIELD_HEADER,
            field_row(0, 32, "X'", hexline(data[:32], 8), "the client's representative"),
            field_row(32, pos - 32, "P_C", hexline(data[32:pos], 8), "random padding"),
            field_row(pos, 16, "M_C", data[pos:pos + 16].hex(),
                      style("ok", "= H16(KEY, X'): found") + " (the server looks for it here)"),
            field_row(pos + 16, 16, "MAC_C", data[pos + 16:pos + 32].hex(), matched)]


def server_reply_rows(data, pos, key, e, style=PLAIN):
    """Y' | AUTH | P_S | M_S | MAC_S | frames, with M_S at ``pos``; MAC_S under the client's E."""
    ok = hmac.compare_digest(obfs4.h16(key, data[:pos + 16] + e), data[pos + 16:pos + 32])
    return [FIELD_HEADER,
            field_row(0, 32, "Y'", hexline(data[:32], 8), "the server's representative"),
            field_row(32, 32, "AUTH", hexline(data[32:64], 8),
                      "HMAC(t_mac, verify | ...): verify needs X25519(x, Y): cannot be checked"),
            field_row(64, pos - 64, "P_S", hexline(data[64:pos], 8), "random padding"),
            field_row(pos, 16, "M_S", data[pos:pos + 16].hex(), style("ok", "= H16(KEY, Y'): found")),
            field_row(pos + 16, 16, "MAC_S", data[pos + 16:pos + 32].hex(),
                      style("ok", "= H16(KEY, Y' | AUTH | P_S | M_S | E)") if ok
                      else style("bad", "does not match")),
            field_row(pos + 32, len(data) - pos - 32, "frames", hexline(data[pos + 32:], 8),
                      "the seed frame (45 bytes), then data: sealed with keys from KEY_SEED")]


# --- TLS (webtunnel, or any HTTPS): tlswire.py reads it and says what it shows ---------

def tls_client(conv):
    """(index, ClientHello) of the side that opened with a TLS ClientHello, or None."""
    sides = [conv.initiator] if conv.initiator is not None else [0, 1]
    return next(((index, hello) for index in sides
                 for hello in [tlswire.hello(conv.streams[index])] if hello), None)


def explain_tls(conv, index, hello):
    """unmask on TLS: what is in clear, where the keys come from, what stays sealed."""
    return tlswire.explain(hello, conv.streams[index], conv.streams[1 - index],
                           conv.role_name(index), conv.role_name(1 - index))


# --- meek: requests and answers, and the rhythm of an idle session's polls ------------

def exchanges(flow, client=0):
    """[(time, client bytes, server bytes)]: each run of the client's packets and the
    server's packets after it, from a conversation's ``flow`` (a request and its answer,
    for a protocol that takes turns, as HTTP/1.1 does)."""
    found = []
    for when, side, size in flow:
        if side == client and (not found or found[-1][2]):
            found.append([when, 0, 0])
        if not found:
            continue
        found[-1][1 if side == client else 2] += size
    return [tuple(each) for each in found]


def polling_rhythm(turns, small=2000):
    """The gaps (seconds) between consecutive small exchanges (polls: a request and an
    answer that carry no payload worth the name), and whether a run of at least four
    grows by about 1.5 times each (meek's idle schedule: 0.1 s x 1.5 up to 5 s)."""
    gaps = []
    run = best = 0
    for before, after in zip(turns, turns[1:]):
        if max(before[1], before[2], after[1], after[2]) > small or before[0] is None:
            run = 0
            continue
        gap = after[0] - before[0]
        if gaps and 1.3 <= gap / max(gaps[-1], 1e-6) <= 1.7:
            run += 1
            best = max(best, run)
        else:
            run = 0
        gaps.append(gap)
    return gaps, best >= 3


def meek_lines(conv):
    """What detect says of a TLS stream's shape: its exchanges and any polling rhythm."""
    client = conv.initiator or 0
    turns = exchanges(conv.flow, client)
    if len(turns) < 2:
        return []
    sizes = sorted(turn[1] for turn in turns)
    lines = ["exchanges: %d (client bytes then server bytes each; a client's bytes: median %d, "
             "max %d)" % (len(turns), sizes[len(sizes) // 2], sizes[-1])]
    gaps, growing = polling_rhythm(turns)
    if gaps:
        shown = ", ".join("%.2f" % gap for gap in gaps[:10]) + (" ..." if len(gaps) > 10 else "")
        lines.append("gaps between small exchanges (s): " + shown)
    if growing:
        lines.append("the gaps grow by about 1.5 times each: the idle polling of meek "
                     "(100 ms x 1.5 up to 5 s), a series of HTTP requests inside TLS")
    return lines


# --- Commands ----------------------------------------------------------------------

def draw(command, conversations, tests, drawn, path, out):
    """With ``path``: the page of pictures (pictures.py) of what was just printed; 0.
    OSError (the page cannot be written) is main's to report."""
    if path is None:
        return 0
    from teaching import pictures  # only here: the text commands need no drawing
    size = pictures.write_page(path, "obfsproxy.py %s, drawn" % command,
                               "Each stream of the capture as %s read it: the same numbers it printed."
                               % command, pictures.capture_sections(command, conversations, tests, drawn))
    print("Pictures: %s (%d bytes, one page, nothing to load: open it in any browser)." % (path, size),
          file=out)
    return 0


FULLY_ENCRYPTED_NOTE = textwrap.fill(
    "The fully-encrypted test is a reconstruction of a published measurement of the Great "
    "Firewall of China (%s), not the censor's code. It reads the client's first data packet "
    "only: the packet is exempt if (Ex1) it has <= 3.4 or >= 4.6 set bits per byte on average, "
    "(Ex2) its first 6 bytes are printable ASCII, (Ex3) more than 50%% of it is, (Ex4) it has "
    "more than 20 printable bytes in a row, or (Ex5) it starts like TLS or HTTP; anything else is "
    "flagged as fully encrypted. It needs no key and no knowledge of obfs2, obfs3 or obfs4, and "
    "it flags all three; the censor then blocked a fraction of the flagged connections." % WU_2023, 92)
NO_MAGIC_HINT = ("random from the first byte, with no magic: obfs3, obfs4 and obfs2 with a shared "
                 "secret look like this (`unmask` says why none gives its keys away)")


def run_detect(conversations, secret_hash, iterations, out, tests=None):
    """Print what each conversation is; ``tests`` (a list) receives each one's FirstPacket."""
    total = Work()
    count = flagged = tls_streams = 0
    for number, conv in enumerate(conversations, 1):
        sides, work = examine(conv, secret_hash, iterations)
        is_obfs2, why = verdict(sides, secret_hash is not None)
        count += is_obfs2
        total.hashes += work.hashes
        total.aes_blocks += work.aes_blocks
        total.seconds += work.seconds
        first, encrypted = fully_encrypted_test(conv)
        if tests is not None:
            tests.append(first)
        flagged += first is not None and first.rule is None
        print("stream %d  %s  (%d / %d bytes)" % (number, conv.name, len(conv.streams[0]),
                                                  len(conv.streams[1])), file=out)
        print("  %s" % why, file=out)
        if why.startswith("not obfs2: no magic value"):
            print("  %s" % NO_MAGIC_HINT, file=out)
        tls = tls_client(conv)
        if tls:
            print("  TLS ClientHello: %s" % tlswire.summary(tls[1]), file=out)
            print("    whose: %s" % tlswire.whose(tls[1]), file=out)
            flow = tls_in_tls.analyse(conv, tls[0])
            if flow is not None:
                print("\n".join("  " + line for line in tls_in_tls.flow_lines(flow)), file=out)
            for line in meek_lines(conv):
                print("  %s" % line, file=out)
        print("  work: %s" % work, file=out)
        print("  %s" % encrypted, file=out)
        if tls and first is not None and first.looks_like == "TLS":
            tls_streams += 1
            print("\n".join("  " + line for line in tlswire.exemption_lines(first.rule)), file=out)
        for note in conv.notes:
            print("  note: %s" % note, file=out)
    print(file=out)
    print("%d of %d stream(s) are obfs2; all the checks together cost %s." % (
        count, len(conversations), total), file=out)
    if secret_hash is None:
        print("Each check derives a PAD key from the clear seed (one SHA-256) and decrypts "
              "8 bytes (one AES block): obfs2 is trivially detectable.", file=out)
    print("%d of %d stream(s) flagged by the fully-encrypted test%s." % (
        flagged, len(conversations), "; %d TLS stream(s) exempt, as webtunnel counts on" % tls_streams
        if tls_streams else ""), file=out)
    print(FULLY_ENCRYPTED_NOTE, file=out)
    return 0


def unmask_one(conv, secret_hash, iterations, full, output_dir, number, out, bridge=None, drawn=None):
    """Print one connection's handshakes, keys and decrypted streams, or why there
    are none. Returns True when it could be unmasked. ``drawn`` (a list) receives the
    fields of the obfs2 handshakes read, [(side, [(offset, length, name)])], for the pictures."""
    def say(line=""):
        print(line, file=out)

    say("== connection %d: %s ==" % (number, conv.name))
    for note in conv.notes:
        say("note: %s" % note)
    sides, work = examine(conv, secret_hash, iterations)
    found = [side for side in sides if side.initiator is not None]
    unmasked = len(found) == 2 and found[0].initiator != found[1].initiator
    if drawn is not None:
        drawn.append([(index, [(0, 16, "SEED"), (16, 4, "MAGIC"), (20, 4, "PADLEN"),
                               (24, side.padlen, "padding"),
                               (24 + side.padlen, len(side.data) - 24 - side.padlen, "data")])
                      for index, side in enumerate(sides) if unmasked])
    if unmasked:
        for line in unmask_obfs2(conv, found, work, secret_hash, iterations, full, output_dir, number):
            say(line)                   # line by line: --full on a big capture prints as it goes
        return True
    is_obfs2, why = verdict(sides, secret_hash is not None)
    say(why if not is_obfs2 else "cannot unmask: " + why)
    long_enough = [side for side in sides if len(side.data) >= obfs2.HEADER_LENGTH]
    tls = tls_client(conv) if not found else None
    if tls:
        for line in explain_tls(conv, *tls):
            say(line)
    elif not found and long_enough and not any(looks_like(side.data) for side in long_enough):
        for line in explain_no_key(conv, secret_hash, iterations, bridge):
            say(line)
    elif len(found) == 1 and not all(conv.streams):
        say("Both directions are needed: the data keys hash both seeds.")
    return False


def explain_no_key(conv, secret_hash, iterations, bridge):
    """Random-looking bytes that are not obfs2: what the attack read, and why each
    protocol that looks like this keeps its keys off the wire."""
    lines = ["What the obfs2 attack read, and why it stops:"] + obfs2_attempt_lines(conv)
    lines.append("Both directions look random (%s bits/byte of entropy; random bytes: 8): nothing in"
                 % " and ".join("%.2f" % entropy(data) for data in conv.streams if data))
    lines.append("them is a key.")
    checked, is_obfs4 = check_obfs4(conv, bridge) if bridge is not None else ([], False)
    if is_obfs4:
        return lines + ["It is obfs4, to the bridge of --state-dir: its marks and MACs check out."] + checked
    lines.append("Three protocols look like this, and none of them puts its keys on the wire:")
    if secret_hash is None:
        lines += ["obfs2 with a shared secret: the secret is needed. Give it with --shared-secret=SECRET",
                  "  (and --ss-hash-iterations=N unless it used %d)." % iterations]
        lines += ["  " + line for line in cost_lines(iterations)]
    lines += explain_obfs3(conv)
    return lines + (checked if bridge is not None else explain_obfs4(conv))


def unmask_obfs2(conv, found, work, secret_hash, iterations, full, output_dir, number):
    """Both seeds are in clear: derive what both ends derived (obfs2.py's own
    functions) and decrypt both directions. Yields the lines to print, as they come."""
    init, resp = sorted(found, key=lambda side: not side.initiator)
    key_hash = secret_hash if init.secret else None
    start = time.perf_counter()
    rows = key_schedule(init.seed, resp.seed, key_hash, iterations)
    work.seconds += time.perf_counter() - start
    for _ in rows:
        work.mac(key_hash, iterations)
    if key_hash is not None:
        yield "shared secret: every MAC below is %d rounds of SHA-256 over s | x | H(SECRET) | s" % iterations
    for side, row, direction in ((init, rows[0], "initiator -> responder"),
                                 (resp, rows[1], "responder -> initiator")):
        yield "%s: %d bytes on the wire" % (direction, len(side.data))
        yield from header_lines(side.data, side.initiator, row[3])
    yield "key schedule, recomputed from the two seeds in clear:"
    yield from key_schedule_lines(rows, key_hash)
    for side, row, direction in ((init, rows[2], "initiator-to-responder"),
                                 (resp, rows[3], "responder-to-initiator")):
        start = time.perf_counter()
        ciphertext = side.data[obfs2.HEADER_LENGTH + side.padlen:]
        plaintext = obfs2.ctr(row[3]).decrypt(ciphertext)
        work.seconds += time.perf_counter() - start
        work.aes_blocks += (len(ciphertext) + 15) // 16
        guess = looks_like(plaintext)
        yield "%s, decrypted with %s: %d bytes%s" % (
            direction.replace("-to-", " -> "), row[0], len(plaintext),
            " (it looks like %s)" % guess if guess else "")
        yield from hexdump(plaintext, None if full else SHOW_BYTES)
        if len(plaintext) > SHOW_BYTES and not full:
            yield "    (--full prints everything; --output-dir=DIR writes it to files)"
        if output_dir:
            target = Path(output_dir) / ("connection-%d.%s.bin" % (number, direction))
            write_private(target, plaintext)
            yield "    written to %s" % target
    yield "work: %s" % work


def write_private(target, data):
    """Decrypted traffic: owner-only, in an owner-only directory."""
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(str(target), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_BINARY", 0), 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def main(command, paths, secret=None, iterations=obfs2.HASH_ITERATIONS, full=False,
         output_dir=None, state_dir=None, out=None, html=None):
    """``obfsproxy.py unmask|detect [options] <capture>...``; returns the exit status.

    No transport is given, and none is needed: every stream is tried against
    each, and says what it is (obfs2 by its magic; obfs3, obfs4, TLS, HTTP ...
    by what the attack finds there). ``secret`` and ``iterations``: obfs2's
    shared secret (str, "" or None: none) and hash rounds, tried beside the
    public key schedule. ``state_dir``: an obfs4 bridge's state directory
    (unmask). ``full``, ``output_dir``: unmask's output. ``out``: where the
    report goes (stdout); errors go to stderr, one line. ``html``: also draw the
    streams on one page (pictures.py), written to that path.

    Exit status:
      0  the capture was read, and every stream in it was either unmasked or
         explained: another protocol, keys that never crossed the wire
         (obfs3, obfs4, TLS), a shared secret that is needed, a missing
         direction, too few bytes. An explanation is a result, not a failure.
      1  the capture cannot be read: a missing, empty, truncated or corrupt
         file, one that is not a capture, a bad --state-dir; or (unmask) it
         holds no TCP connection with data, so there was nothing to read.
    (2, a bad command line, is obfsproxy.py's.)
    """
    out = out or sys.stdout
    secret_hash = obfs2.secret_hash(secret)
    obfs2.read_header(bytes(obfs2.HEADER_LENGTH), True)   # warm up: time the checks, not the imports
    try:
        bridge = Bridge(state_dir) if state_dir and command == "unmask" else None
        descriptions, conversations = load(paths)
        for description in descriptions:
            print(description, file=out)
        print(file=out)
        tests, drawn = [], []
        if command == "detect":
            status = run_detect(conversations, secret_hash, iterations, out, tests)
            return draw(command, conversations, tests, [[]] * len(tests), html, out) or status
        if output_dir:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
        if not conversations:
            print("no TCP connection with data in the capture: nothing to unmask", file=out)
            return 1
        unmasked = 0
        for number, conv in enumerate(conversations, 1):
            if number > 1:
                print(file=out)
            unmasked += unmask_one(conv, secret_hash, iterations, full,
                                   output_dir, number, out, bridge, drawn)
        print(file=out)
        print("%d of %d connection(s) unmasked%s." % (
            unmasked, len(conversations), "" if unmasked == len(conversations)
            else "; each of the others says above why it cannot be"), file=out)
        return draw(command, conversations, [fully_encrypted_test(conv)[0] for conv in conversations],
                    drawn, html, out)
    except CaptureError as exc:
        print("obfsproxy.py %s: %s" % (command, exc), file=sys.stderr)
        return 1
    except OSError as exc:
        print("obfsproxy.py %s: %s: %s" % (command, exc.filename or "", exc.strerror or exc),
              file=sys.stderr)
        return 1
