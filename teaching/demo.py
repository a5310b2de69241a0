"""``obfsproxy.py demo``: the whole tunnel on 127.0.0.1, in one process, annotated.

    demo app --SOCKS5--> client ===obfs4===> server --plain--> echo service
                                  ^
                       the wire: what a censor sees

It starts an echo service, a server of the chosen transport in front of it and
a SOCKS client (real sockets, and the real listener: a thread per handshake, one
pump for every relay, all in this process), sends a message that
starts like a TLS ClientHello (the kind of fixed string DPI looks for), and
then walks through that one connection, as it crossed the wire:

=========  ===========================================================================
obfs2      each side's header field by field (SEED in clear, MAGIC, PADLEN), the key
           schedule from the two seeds, the data as sent
obfs3      the two UniformDH public values (uniform strings, not recognisable numbers),
           the shared secret, the derived keys, the padding and the search for the magic
obfs4      the bridge's identity, the representatives, marks and MACs, the ntor
           derivation, every frame with its masked length, the padding frames, and what
           iat-mode did to the writes
webtunnel  the bridge line's synthetic address, the ClientHello field by field with its
           SNI and JA4, every TLS record of both directions as a censor sees it and as
           the key log opens it, the upgrade and the 101 inside, the raw stream after
meek       the POSTs and their answers read off the wire (plain HTTP in the demo), the
           bodies joined back into the message and its echo, and the polling rhythm
dummy      the baseline: the application's bytes, unchanged
=========  ===========================================================================

Each walk ends with what a string-matching filter, the fully-encrypted test
(``capture.FirstPacket``) and a passive observer could and could not do.

Every value printed is checked against the recorded wire bytes: the keys shown
decrypt the wire back to the message, the marks and MACs shown are the ones on
the wire, each side read the other's padding. A value that does not check out
is printed as FAILED and the demo exits with status 1.

The demo reads each side's ephemeral private key out of its transport object
(``Obfs3._x``; obfs4's through its key source, ``keep_secret``): it lives only in
that process's memory and never crosses the wire, which is the whole point. Only
a demo, holding both ends, can show it. For webtunnel the same holds of the TLS
traffic secrets, which the demo's client context writes to a key log.

The walks live beside this file: demo_obfs.py (obfs2, obfs3, obfs4) and
demo_webtunnel.py (webtunnel, with the certificate the demo makes for it); the
machinery they share, running the connection and recording its wire, is
demo_base.py. A transport without a walk of its own gets ``walk_generic``.
"""

import sys
import textwrap

from outbound import format_address
from proxy import program_name
from teaching import capture, demo_meek, demo_obfs, demo_webtunnel, pictures, present
from teaching.demo_base import (
    MESSAGE,
    SHOW_FRAMES,
    SIGNATURES,
    Walk,
    application_bytes,
    run_exchange,
)


def main(name, options, settings, record_dir=None, seed=None, html=None):
    """``obfsproxy.py demo``: 0 when the message came back byte for byte and every value
    shown checked out. A transport without a walk of its own (``WALKS``) gets the
    generic one: every piece each side put on the wire, and the checks that hold
    for any transport. ``seed``: the random choices come from it (demo_base.seeded),
    so a run can be repeated; None (the command) draws from the CSPRNG. ``html``: also
    draw the walk on one page (pictures.py), written to that path."""
    status, walk = walk_one(name, options, settings, record_dir, seed)
    if html is not None and walk is not None:
        return draw([pictures.demo_section(walk)], html, name, status)
    return status


def main_all(options, settings, record_dir=None, html=None):
    """``demo --transport=all``: every transport's demo in turn (``options``: {name: its
    options}, in order), and with ``html`` one page that shows them side by side."""
    walks, status = [], 0
    for number, (name, transport_options) in enumerate(options.items()):
        if number:
            print("\n" + "=" * 100 + "\n")
        one, walk = walk_one(name, transport_options, settings, record_dir)
        status = max(status, one)
        walks += [walk] if walk is not None else []
    if html is not None and walks:
        return draw([pictures.demo_overview(walks)] + [pictures.demo_section(walk) for walk in walks],
                    html, "every transport", status, side_by_side=True)
    return status


def draw(sections, path, what, status, side_by_side=False):
    """Write the page of ``sections`` to ``path``: the demo's status, or 1 if it cannot."""
    try:
        size = pictures.write_page(path, "obfsproxy.py demo: %s, drawn" % what,
                                   "What crossed the wire of one connection on 127.0.0.1, per transport: "
                                   "the same numbers the demo printed.", sections, side_by_side)
    except OSError as exc:
        print("FAILED: the pictures could not be written to %s: %s" % (path, exc.strerror or exc))
        return 1
    print("Pictures: %s (%d bytes, one page, nothing to load: open it in any browser)." % (path, size))
    return status


def walk_one(name, options, settings, record_dir=None, seed=None):
    """Run and walk through one connection: (exit status, the Walk, or None if the
    connection did not work)."""
    style = present.Style.for_stream(sys.stdout)
    try:
        exchange = run_exchange(name, options, settings, STAGES.get(name), seed)
    except (RuntimeError, OSError, ValueError) as exc:
        print(style("bad", "FAILED: the demo connection did not work: %s" % exc))
        return 1, None
    walk = Walk(name, exchange, style)
    echo_address, server_address, client_address = exchange.addresses
    print(style("title", "obfsproxy.py demo: the %s tunnel on 127.0.0.1, in one process" % name))
    print("  demo app --SOCKS5--> client %s ===%s===> server %s --plain--> echo %s"
          % (format_address(client_address), name,
             format_address(server_address), format_address(echo_address)))
    print("  The client is the initiator (it opened the TCP connection); the server is the responder.")
    if record_dir is not None:
        print("  The wire bytes were also saved in %s: try `%s unmask %s`."
              % (record_dir, program_name(), record_dir))
    walk.check(walk.c_sent == bytes(exchange.server.received)
               and walk.s_sent == bytes(exchange.client.received),
               "what one side sent differs from what the other received")
    WALKS.get(name, walk_generic)(walk)
    filters(walk)
    observer(walk)
    walk.check(exchange.echoed == MESSAGE, "the echo differs from the message")
    print()
    for problem in walk.problems:
        print(style("bad", "FAILED: %s" % problem))
    if walk.problems:
        return 1, walk
    print(style("ok", "OK") + ": the message crossed the tunnel and came back byte for byte, and "
          "every value shown checked out (%.2f s). More: the guide, `%s guide`."
          % (exchange.seconds, program_name()))
    return 0, walk


def filters(walk):
    """What a string-matching filter and the fully-encrypted test saw."""
    walk.title("What a string-matching filter and an entropy test saw")
    print("  %-28s  %-26s  %s" % ("pattern", "in the application's bytes", "on the wire (both ways)"))
    wire = walk.c_sent + walk.s_sent
    for label, pattern in SIGNATURES:
        at, seen = MESSAGE.find(pattern), wire.find(pattern)
        print("  %-28s  %-26s  %s" % (label, "offset %d" % at if at >= 0 else "-",
                                      walk.style("bad", "offset %d: MATCH" % seen) if seen >= 0
                                      else walk.style("ok", "not found")))
    print("  byte entropy: message %.1f bits/byte, wire %.1f bits/byte (random bytes: 8)"
          % (present.entropy(MESSAGE), present.entropy(wire)))
    first_piece = walk.exchange.client.pieces[0] if walk.exchange.client.pieces else b""
    first = capture.FirstPacket(first_piece)
    walk.first = first if first_piece else None
    print("  The fully-encrypted test (the Great Firewall since November 2021, as %s" % capture.WU_2023)
    print("  measured it; the detect command runs it) on the client's first write, %d bytes:"
          % len(first_piece))
    print("    %s  %s" % (walk.style("bad" if first.rule is None else "ok", first.verdict), first.figures()))


OBSERVER = {
    "dummy": (["every byte: the TLS record header, the strings, the sizes, the timing"],
              ["nothing is hidden: this is the baseline the transports improve on"]),
    "obfs2": (["detect it: one SHA-256 over the clear seed and one AES block give 2b f5 ca 7e "
               "(the detect command)",
               "read it: both seeds are in clear, and every key is a hash of them "
               "(the unmask command)",
               "flag it as fully encrypted (first packet), and see every size and every pause"],
              ["match a string: from the first byte on there is none"]),
    "obfs3": (["flag it as fully encrypted (first packet); see that both sides send at least 192 "
               "random bytes at once",
               "see the sizes and timing of everything after the paddings (ciphertext length = "
               "plaintext length)"],
              ["compute SHARED_SECRET from X and Y (it needs x or y): so no key, no magic, not even "
               "where the padding ends",
               "match a string, or run obfs2's magic test (the unmask command explains)",
               "but an ACTIVE attacker can: obfs3 authenticates nobody, so a man in the middle runs "
               "UniformDH with each side and reads everything, and a prober gets 192+ bytes back "
               "from any server"]),
    "obfs4": (["flag it as fully encrypted (first packet); see volumes, and sizes blurred to the "
               "bridge's length table",
               "see timing (iat-mode 0: as the application sends; 1 and 2 blur it)",
               "with the bridge line (cert): find M_C and check MAC_C, so confirm obfs4 to that bridge"],
              ["find the marks without the bridge line: every byte looks random",
               "compute a key, even with the bridge's private key b: ntor needs x or y, erased after "
               "the handshake (forward secrecy; unmask --state-dir shows it)",
               "probe the bridge without its cert: the server stays silent and closes after "
               "30 s + a per-bridge delay; a man in the middle without b fails AUTH"]),
    "webtunnel": (["read the SNI (the web site's name) and the server's address, and fetch its "
                   "certificate by connecting with that SNI (TLS 1.3 sends it sealed)",
                   "tell Python's OpenSSL from a browser by the ClientHello's JA4, the same for every "
                   "webtunnel client on Python's ssl (with curl_cffi the client sends Chrome's "
                   "WebSocket hello instead: a full handshake every time, and no close_notify)",
                   "see the record sizes and timing: the upgrade, then the application's writes, cut "
                   "into records below Tor's exact lengths for the first 16 KiB (record shaping); with "
                   "Tor inside, its TLS handshake still shows in the bytes of each turn and the round "
                   "trips (TLS in TLS) on a long-lived connection to a web site",
                   "with the bridge line (url=): ask the web server for the secret path and get a 101, "
                   "so confirm the bridge; or block the domain, at the cost of the whole site"],
                  ["flag it as fully encrypted: it is TLS, and the test exempts TLS (Ex5, or Ex1 first "
                   "for a ClientHello's zero bytes)",
                   "match a string, read the path, the Upgrade exchange or a byte after it: all sealed",
                   "decrypt a recording later, even with the certificate's key: the keys come from an "
                   "ephemeral ECDHE exchange (forward secrecy)",
                   "find the bridge by probing without the path: every other path gets the cover "
                   "site (here the 404 page), never a 101"]),
    "webtunnel over http": (["everything: the request with the secret path, the 101 and every byte after "
                             "them cross in clear, as the string filter above shows"],
                            ["nothing is hidden: http:// is for tests, or behind another tunnel"]),
}


def observer(walk):
    could, could_not = OBSERVER.get(walk.observed, (
        ["everything the pieces above show: their sizes, their timing, and any fixed bytes"],
        ["what depends on how %s hides the stream: its module's docstring (%s.py) says what it "
         "protects and what it does not" % (walk.name, type(walk.client).__module__)]))
    walk.title("What a passive observer could and could not do")
    for heading, lines in (("could:", could), ("could not:", could_not)):
        print("  " + heading)
        for line in lines:
            print(textwrap.fill(line, 100, initial_indent="    - ", subsequent_indent="      "))


# --- any transport, and dummy ---------------------------------------------------------------

def walk_generic(walk):
    """What every transport can show: each piece it put on the wire, in order."""
    for label, wire in (("client", walk.exchange.client), ("server", walk.exchange.server)):
        walk.title("What the %s put on the wire: %d bytes in %d pieces"
                   % (label, len(wire.sent), len(wire.pieces)))
        for number, piece in enumerate(wire.pieces[:SHOW_FRAMES], 1):
            print("  piece %d, %d bytes:" % (number, len(piece)))
            walk.dump(piece)
        if len(wire.pieces) > SHOW_FRAMES:
            print("  ... and %d more pieces" % (len(wire.pieces) - SHOW_FRAMES))


def walk_dummy(walk):
    walk.title("The handshake and the keys: none")
    print("  The dummy transport has no handshake and no keys: the wire carries the application's "
          "bytes unchanged.")
    application_bytes(walk, walk.c_sent, walk.s_sent, "they were", "it was")


# Each transport's own walk (the generic one for a transport that has none), and what it
# needs around the demo connection (webtunnel: its certificate and key log).
WALKS = {"dummy": walk_dummy, "obfs2": demo_obfs.walk_obfs2, "obfs3": demo_obfs.walk_obfs3,
         "obfs4": demo_obfs.walk_obfs4, "webtunnel": demo_webtunnel.walk_webtunnel,
         "meek": demo_meek.walk_meek}
STAGES = {"obfs4": demo_obfs.Obfs4Stage, "webtunnel": demo_webtunnel.WebTunnelStage,
          "meek": demo_meek.MeekStage}
OBSERVER["meek"] = demo_meek.OBSERVER
WALKS["meek_lite"], STAGES["meek_lite"] = WALKS["meek"], STAGES["meek"]   # obfs4proxy's name
