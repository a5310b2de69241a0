"""demo_obfs.py: the demo's walks through obfs2, obfs3 and obfs4 (demo.py says what the
demo is): every field of each handshake as it crossed the wire, the keys as both ends
derived them, the data as sent; every value checked against the recorded wire."""

import time

import obfs2
import obfs3
import obfs4
import obfs4_state
from cryptoroutes.curve25519 import elligator2_direct, x25519
from obfs4_crypto import SecretBox
from obfs4_drbg import HashDrbg
from proxy import program_name
from teaching import capture, present
from teaching.demo_base import (
    MESSAGE,
    SHOW_FRAMES,
    Stage,
    application_bytes,
    bytes_from,
    ephemeral_secret,
    hexblock,
)


def walk_obfs2(walk):
    client, server, c_sent, s_sent = walk.client, walk.server, walk.c_sent, walk.s_sent
    secret_hash, iterations = client.secret_hash, client.iterations
    started = time.perf_counter()
    rows = present.key_schedule(client.seed, server.seed, secret_hash, iterations)
    derive_seconds = time.perf_counter() - started
    init_pad, resp_pad, init_secret, resp_secret = (row[3] for row in rows)

    walk.title("The handshake: each side sends one message at once, without waiting for the other"
               if secret_hash is None else
               "The handshake: the client sends at once; with a shared secret our server answers"
               " once the client's message proved the secret")
    for label, obj, sent, pad, initiator in (
            ("client -> server: the initiator's message", client, c_sent, init_pad, True),
            ("server -> client: the responder's message", server, s_sent, resp_pad, False)):
        print("  %s, 24 + PADLEN = %d bytes" % (label, obfs2.HEADER_LENGTH + obj.padlen))
        for line in present.header_lines(sent, initiator, pad, walk.style):
            print(line)
        for offset, length, name in ((0, 16, "SEED"), (16, 4, "MAGIC"), (20, 4, "PADLEN"),
                                     (24, obj.padlen, "padding"), (24 + obj.padlen, None, "data")):
            walk.record(offset, len(sent) - offset if length is None else length, name,
                        "client" if initiator else "server")
    print("  The receiver takes the seed, derives the sender's PAD key, checks MAGIC, drops PADLEN bytes;")
    print("  the server read PADLEN %d (Obfs2.peer_padlen), the client read %d."
          % (server.peer_padlen, client.peer_padlen))
    walk.check((server.peer_padlen, client.peer_padlen) == (client.padlen, server.padlen),
               "a side read the wrong PADLEN")
    walk.check(server.peer_seed == client.seed and client.peer_seed == server.seed,
               "a side read the wrong seed")

    walk.title("The key schedule, as the code derived it (obfs2.pad_key, obfs2.data_keys)")
    print("  INIT_SEED = %s (the client's Obfs2.seed)" % walk.style("wire", client.seed.hex()))
    print("  RESP_SEED = %s (the server's Obfs2.seed)" % walk.style("wire", server.seed.hex()))
    if secret_hash is None:
        print("  MAC(s, x) = SHA-256(s | x | s). Each value m is one SHA-256 output:"
              " AES-128 key = m[0:16],")
    else:
        print("  shared secret: H(SECRET) = %s" % secret_hash.hex())
        print("  Every MAC becomes H^n(s | x | H(SECRET) | s), n = %d (--ss-hash-iterations)."
              % iterations)
        print("  Each value m is the last SHA-256 output: AES-128 key = m[0:16],")
    print("  IV = m[16:32], the whole 128-bit CTR counter block.")
    for line in present.key_schedule_lines(rows, secret_hash, walk.style):
        print(line)
    per_side = 4 * (1 if secret_hash is None else iterations)
    print("  Each side computes all four (its own PAD key, the peer's, both data keys): "
          "%d SHA-256,\n  %s here." % (per_side, present.duration(derive_seconds)))
    if secret_hash is not None:
        print("  Without the secret that would be 4 SHA-256: the secret multiplies the cost by %d,\n"
              "  for both ends and for a censor who knows it." % iterations)
    c_data = c_sent[obfs2.HEADER_LENGTH + client.padlen:]
    s_data = s_sent[obfs2.HEADER_LENGTH + server.padlen:]
    ok = walk.check(obfs2.ctr(init_secret).decrypt(c_data) == MESSAGE,
                    "INIT_SECRET does not decrypt the recorded data")
    ok &= walk.check(obfs2.ctr(resp_secret).decrypt(s_data) == walk.exchange.echoed,
                     "RESP_SECRET does not decrypt the recorded data")
    if ok:
        print("  Checked: INIT_SECRET and RESP_SECRET decrypt the recorded wire bytes back to the message.")

    application_bytes(walk, c_data, s_data, "E(INIT_SECRET, message)", "E(RESP_SECRET, echo)")
    print("  Ciphertext length = plaintext length (%d bytes): obfs2 hides no sizes and no timing."
          % len(c_data))
    if secret_hash is None:
        program = program_name()
        print("  Try `%s demo --transport=obfs2 --shared-secret=SECRET` to see what" % program)
        print("  a shared secret changes, and `%s demo --transport=obfs3` or" % program)
        print("  `%s demo --transport=obfs4` for what came after obfs2." % program)
    else:
        n = iterations
        print("  With a shared secret the seeds alone no longer give the keys. A censor who knows\n"
              "  the secret (it is in the bridge line) pays %d SHA-256 to detect a connection and\n"
              "  4 x %d = %d to read it; one who does not must guess it, at %d SHA-256 a guess."
              % (n, n, 4 * n, n))


# --- obfs3 -----------------------------------------------------------------------------------

def legendre(value):
    """+1 if ``value`` is a square modulo p, -1 if not (Euler: value^((p-1)/2) mod p)."""
    return 1 if pow(value, (obfs3.P - 1) // 2, obfs3.P) == 1 else -1


def walk_obfs3(walk):
    client, server, c_sent, s_sent = walk.client, walk.server, walk.c_sent, walk.s_sent
    X, Y = c_sent[:192], s_sent[:192]

    walk.title("The handshake: each side sends its UniformDH public value and PAD1, at once")
    for label, who, value, padlen in (("client -> server: X", client, X, client.padlen1),
                                      ("server -> client: Y", server, Y, server.padlen1)):
        print("  %s, 192 bytes, then PAD1 = %d random bytes (Obfs3.padlen1), all in one write:"
              % (label, padlen))
        print(walk.style("wire", hexblock(value, "    ", 48)))
        walk.check(value == who.public, "the public value on the wire is not the object's")
        walk.check(len(walk.exchange.client.pieces[0] if who is client else walk.exchange.server.pieces[0])
                   == 192 + padlen, "the first write is not PUB | PAD1")
    print("  These are two 1536-bit numbers below p (RFC 3526 group 5), but p is within 2^-64 of")
    print("  2^1536: as bytes they are as uniform as random ones. Plain Diffie-Hellman would still")
    print("  show: g^x mod p is always a square modulo p (g = 2 is one here), and a censor can test")
    print("  that in one exponentiation, while random numbers are squares only half the time.")
    print("  UniformDH sends p - g^x instead on a coin flip (the low bit of x), and p - g^x is never")
    squares = []
    for who, value, e in ((walk.exchange.client, X, "x"), (walk.exchange.server, Y, "y")):
        square = legendre(int.from_bytes(value, "big")) == 1
        plain = obfs3.modexp(obfs3.G, ephemeral_secret(who), obfs3.P).to_bytes(192, "big") == value
        walk.check(square == plain, "a public value's Legendre symbol does not match its coin")
        squares.append("a square (+1: g^%s was sent)" % e if square else
                       "not a square (-1: p - g^%s was sent)" % e)
    print("  a square. Here X is %s, Y is %s;" % tuple(squares))
    print("  for random bytes each is a coin flip too.")

    walk.title("The shared secret and the keys (obfs3.shared_secret, obfs3.derive_keys)")
    started = time.perf_counter()
    from_client = obfs3.shared_secret(ephemeral_secret(walk.exchange.client), Y)
    seconds = time.perf_counter() - started
    from_server = obfs3.shared_secret(ephemeral_secret(walk.exchange.server), X)
    keys = obfs3.derive_keys(from_client)
    print("  x and y, the private exponents, stayed in the two processes (x = %s..., 1536 bits)."
          % ephemeral_secret(walk.exchange.client).to_bytes(192, "big")[:8].hex())
    print("  SHARED_SECRET = Y^x mod p (the client) = X^y mod p (the server), 192 bytes:")
    print(walk.style("wire", hexblock(from_client, "    ", 48)))
    walk.check(from_client == from_server, "the two ends computed different shared secrets")
    print("  Each key is HMAC-SHA256(SHARED_SECRET, label); AES-128-CTR key = m[0:16], counter = m[16:32]:")
    for label, m, use in (("INIT_SECRET", keys.init_secret, "encrypts client -> server data"),
                          ("RESP_SECRET", keys.resp_secret, "encrypts server -> client data"),
                          ("INIT_MAGIC", keys.init_magic, "marks the end of the client's padding"),
                          ("RESP_MAGIC", keys.resp_magic, "marks the end of the server's padding")):
        print("    %s = %s" % (walk.style("field", "%-11s" % label), walk.style("wire", m.hex())))
        print("                  %s" % use)
    print("  Each side does two modexps, one for its key pair and one for the shared secret (%s here);"
          % present.duration(seconds))
    print("  obfs2 needed 4 SHA-256. In exchange, an observer faces the Diffie-Hellman problem.")

    walk.title("The padding, and the search for the magic")
    c_pos = c_sent.find(keys.init_magic, 192)
    s_pos = s_sent.find(keys.resp_magic, 192)
    for label, who, peer, sent, pos, magic in (
            ("client", client, server, c_sent, c_pos, "INIT_MAGIC"),
            ("server", server, client, s_sent, s_pos, "RESP_MAGIC")):
        print("  The %s's stream:" % label)
        walk.side = label
        walk.field(0, 192, "public value", present.hexline(sent[:192], 8), "sent by start()")
        walk.field(192, who.padlen1, "PAD1", present.hexline(sent[192:192 + who.padlen1], 8),
                   "random, sent by start() with the public value")
        walk.field(192 + who.padlen1, who.padlen2, "PAD2", present.hexline(sent[192 + who.padlen1:pos], 8),
                   "random, sent with the first data")
        walk.field(pos, 32, magic, present.hexline(sent[pos:pos + 32], 8), "clear, found by the %s"
                   % ("server" if who is client else "client"))
        walk.field(pos + 32, len(sent) - pos - 32, "data", present.hexline(sent[pos + 32:], 8),
                   "E(%s_SECRET, ...)" % magic[:4])
        walk.check(pos == 192 + who.padlen1 + who.padlen2 == 192 + peer.peer_padding,
                   "the %s's magic is not where its paddings end" % label)
        print("    The %s searched the bytes after the public value for %s: found after %d bytes,"
              % ("server" if who is client else "client", magic, peer.peer_padding))
        print("    PADLEN1 + PADLEN2 = %d + %d (Obfs3.peer_padding); it would give up beyond 8194."
              % (who.padlen1, who.padlen2))

    c_data, s_data = c_sent[c_pos + 32:], s_sent[s_pos + 32:]
    ok = walk.check(obfs3.ctr(keys.init_secret).decrypt(c_data) == MESSAGE,
                    "INIT_SECRET does not decrypt the recorded data")
    ok &= walk.check(obfs3.ctr(keys.resp_secret).decrypt(s_data) == walk.exchange.echoed,
                     "RESP_SECRET does not decrypt the recorded data")
    application_bytes(walk, c_data, s_data, "E(INIT_SECRET, message)", "E(RESP_SECRET, echo)")
    if ok:
        print("  Checked: INIT_SECRET and RESP_SECRET decrypt the recorded wire bytes back to the message.")
    print("  Ciphertext length = plaintext length (%d bytes): after the paddings obfs3 hides no sizes."
          % len(c_data))


# --- obfs4 -----------------------------------------------------------------------------------

def walk_obfs4(walk):
    client, server, c_sent, s_sent = walk.client, walk.server, walk.c_sent, walk.s_sent
    identity = server.config.identity
    key = identity.public_key + identity.node_id

    walk.title("The bridge: a long-term identity, handed to clients in the bridge line")
    print("  NODEID = %s   (20 bytes)" % identity.node_id.hex())
    print("  B      = %s   X25519(b, 9); b stays on the bridge" % identity.public_key.hex())
    print("  cert   = base64(NODEID | B) = %s" % walk.exchange.announce["cert"])
    print("  iat-mode = %d. The client knows NODEID and B from the cert; KEY = B | NODEID signs"
          % identity.iat_mode)
    print("  every mark and MAC below, so only clients given the bridge line can speak to it.")
    cert = obfs4_state.encode_cert(identity.node_id, identity.public_key)
    walk.check(walk.exchange.announce["cert"] == cert, "the cert is not NODEID | B")

    walk.title("The client's handshake: X' | P_C | M_C | MAC_C, one write")
    m_c = obfs4.h16(key, c_sent[:32])
    pos = c_sent.find(m_c, 32)
    e = capture.match_epoch(key, c_sent[:pos + 16], c_sent[pos + 16:pos + 32], time.time())
    walk.check(pos > 0 and e is not None and len(walk.exchange.client.pieces[0]) == pos + 32,
               "the client's first write is not X' | P_C | M_C | MAC_C")
    e = e or b"?"
    walk.side = "client"
    walk.field("offset", "length", "field", "on the wire", "meaning")
    walk.field(0, 32, "X'", present.hexline(c_sent[:32], 8),
               "Elligator2 representative of the client's X25519 key X")
    walk.field(32, pos - 32, "P_C", present.hexline(c_sent[32:pos], 8), "random padding, 77..8128 bytes")
    walk.field(pos, 16, "M_C", m_c.hex(), "H16(KEY, X'): where the server finds the end")
    walk.field(pos + 16, 16, "MAC_C", c_sent[pos + 16:pos + 32].hex(),
               'H16(KEY, X\' | P_C | M_C | E), E = "%s", the hour' % e.decode())
    x_u = elligator2_direct(c_sent[:32])
    print("  X = ell2(X') = %s" % walk.style("wire", x_u.hex()))
    print("  A raw X25519 key is recognisable (it is a curve point, and half of all 32-byte strings")
    print("  are not); every 32-byte string is the representative of some X. The client drew key")
    print("  pairs until its X had a representative (about 2 tries), before the connection.")
    walk.check(x_u == client._u, "ell2(X') is not the client's public key")

    walk.title("The server's reply: Y' | AUTH | P_S | M_S | MAC_S, then the seed frame, one write")
    m_s = obfs4.h16(key, s_sent[:32])
    spos = s_sent.find(m_s, 64)
    walk.check(spos > 0 and obfs4.h16(key, s_sent[:spos + 16] + e) == s_sent[spos + 16:spos + 32],
               "MAC_S does not check out")
    walk.side = "server"
    walk.field("offset", "length", "field", "on the wire", "meaning")
    walk.field(0, 32, "Y'", present.hexline(s_sent[:32], 8), "the server's representative")
    walk.field(32, 32, "AUTH", present.hexline(s_sent[32:64], 8), "proves the server holds b (below)")
    walk.field(64, spos - 64, "P_S", present.hexline(s_sent[64:spos], 8), "random padding, 0..8051 bytes")
    walk.field(spos, 16, "M_S", m_s.hex(), "H16(KEY, Y')")
    walk.field(spos + 16, 16, "MAC_S", s_sent[spos + 16:spos + 32].hex(),
               "H16(KEY, Y' | AUTH | P_S | M_S | E), the client's E")
    walk.field(spos + 32, 45, "seed frame", present.hexline(s_sent[spos + 32:spos + 77], 8),
               "a frame carrying the bridge's drbg-seed (below)")

    y_u = elligator2_direct(s_sent[:32])
    okm = ntor_section(walk, x_u, y_u, s_sent[32:64])
    c_frames = frames_section(walk, "client -> server", c_sent[pos + 32:], okm[:72], pos + 32)
    s_frames = frames_section(walk, "server -> client", s_sent[spos + 32:], okm[72:], spos + 32)
    c_data = b"".join(p[3:3 + int.from_bytes(p[1:3], "big")] for *_, p in c_frames if p[0] == 0)
    s_data = b"".join(p[3:3 + int.from_bytes(p[1:3], "big")] for *_, p in s_frames if p[0] == 0)
    walk.check(c_data == MESSAGE and s_data == walk.exchange.echoed,
               "the frames do not open to the message and its echo")
    walk.check(s_frames[:1] and s_frames[0][4][0] == obfs4.PACKET_TYPE_PRNG_SEED
               and s_frames[0][4][3:27] == identity.drbg_seed, "the seed frame does not carry the drbg-seed")
    if walk.client.iat_mode == obfs4.IAT_NONE:    # 1 and 2 cut bursts into pieces: see below
        bursts_section(walk, c_frames)
    print("  Checked: every frame opened (Poly1305 tags), the payloads are the message and its echo,")
    print("  and the server's first frame carries its drbg-seed, %s: the client's" % identity.drbg_seed.hex())
    print("  padding now follows the bridge's length table, so all its clients look alike.")
    iat_section(walk)


def bursts_section(walk, frames):
    """Where each burst of the client's (one write in iat-mode 0: data frames, then the
    padding frames of padBurst, obfs4-spec 2.10) ended, against the bridge's table.

    padBurst pads to a sampled length t modulo 1448 (t = 1448 ends on 0), so a burst
    ends on t, unless the padding it needed was 1..21 bytes: no larger than a frame's
    overhead, too small for a frame of its own. Then it sends a full 1448-byte padding
    frame and one of pad + 21 bytes, and the burst ends 21 bytes past t. obfs4proxy
    does the same, so we copy it: the burst lengths of ours and theirs must not differ."""
    segment, overhead = obfs4.MAXIMUM_SEGMENT_LENGTH, obfs4.HEADER_LENGTH
    table = walk.server.config.len_dist
    lengths = {(table.lo + value) % segment for value in table.values}     # 1448 ends a burst on 0
    start, shown = 0, []
    for piece in walk.exchange.client.pieces[1:]:
        end = start + len(piece)
        padding = [2 + length for pos, _, _, length, packet in frames
                   if start <= pos < end and packet[0] == 0 and packet[1:3] == b"\0\0"]
        ends = len(piece) % segment
        if not padding or (len(padding) == 1 and padding[0] > overhead):
            target, how = ends, "%d" % ends              # no padding, or one frame of just what was needed
        elif len(padding) == 2 and padding[0] == segment and overhead < padding[1] <= 2 * overhead:
            target = (ends - overhead) % segment
            how = "%d = %d + 21, padBurst's two-frame case" % (ends, target)
        else:
            target, how = None, "%d, padding frames padBurst does not make" % ends
        shown.append("%d (mod 1448: %s)" % (len(piece), how))
        walk.check(target in lengths, "the client's burst of %d bytes does not end on a length from "
                   "the bridge's table (padBurst)" % len(piece))
        start = end
    print("  The client's bursts: %s; each ends on a length from the bridge's table." % ", ".join(shown))
    print("  When the padding needed is 1..21 bytes (no more than a frame's 21-byte overhead), padBurst")
    print("  adds a 1448-byte frame and one of pad + 21 bytes: the burst ends 21 bytes past the length")
    print("  drawn. obfs4proxy does the same, so ours copies it: a different length would tell us apart.")


def ntor_section(walk, x_u, y_u, auth_on_wire):
    """EXP1, EXP2, KEY_SEED and AUTH as both ends computed them; returns the OKM."""
    identity = walk.server.config.identity
    walk.title("ntor: both ends reach KEY_SEED; AUTH proves the server knows b")
    x, y, b = (ephemeral_secret(walk.exchange.client), ephemeral_secret(walk.exchange.server),
               identity.private_key)
    c_exp1, c_exp2 = x25519(x, y_u), x25519(x, identity.public_key)
    s_exp1, s_exp2 = x25519(y, x_u), x25519(b, x_u)
    print("  client: EXP1 = X25519(x, Y) = %s" % c_exp1.hex())
    print("          EXP2 = X25519(x, B) = %s" % c_exp2.hex())
    print("  server: EXP1 = X25519(y, X) = %s" % s_exp1.hex())
    print("          EXP2 = X25519(b, X) = %s" % s_exp2.hex())
    walk.check((c_exp1, c_exp2) == (s_exp1, s_exp2), "the two ends computed different EXP1/EXP2")
    try:
        key_seed, auth = obfs4.ntor(c_exp1, c_exp2, identity.public_key, x_u, y_u, identity.node_id)
    except obfs4.ProtocolError as exc:          # only if a value above is wrong
        walk.check(False, str(exc))
        key_seed, auth = bytes(32), bytes(32)
    print("  secret_input = EXP1 | EXP2 | B | B | X | Y | PROTOID | NODEID")
    print("  KEY_SEED = HMAC-SHA256(t_key, secret_input) = %s" % walk.style("wire", key_seed.hex()))
    print("  AUTH = HMAC-SHA256(t_mac, HMAC-SHA256(t_verify, secret_input) | B | B | X | Y | ...)")
    print("       = %s" % walk.style("wire", auth.hex()))
    walk.check(auth == auth_on_wire, "AUTH is not the one on the wire")
    print("  = bytes 32..63 of the reply: a server without b could not have computed EXP2, nor AUTH.")
    okm = obfs4.kdf(key_seed)
    print("  OKM = HKDF-SHA256(KEY_SEED, salt t_key, info m_expand), 144 bytes; each direction's 72:")
    for label, part in (("client -> server", okm[:72]), ("server -> client", okm[72:])):
        print("    %s: secretbox key %s" % (label, part[:32].hex()))
        print("                      nonce prefix %s, length-mask DRBG seed %s"
              % (part[32:48].hex(), part[48:72].hex()))
    print("  x and y are gone when the connection is: whoever records the wire and later steals b")
    print("  still lacks EXP1. That is forward secrecy.")
    return okm


def open_frames(wire, key72):
    """[(offset, L_obf, mask, L, packet)] for each whole frame of one direction, opened
    with that direction's 72 OKM bytes: L = L_obf XOR the next DRBG mask."""
    box, drbg = SecretBox(key72[:32], key72[32:48]), HashDrbg(key72[48:72])
    frames, pos = [], 0
    while pos + 2 <= len(wire):
        l_obf = int.from_bytes(wire[pos:pos + 2], "big")
        mask = drbg.mask16()
        length = l_obf ^ mask
        if not obfs4.MIN_FRAME_LENGTH <= length <= obfs4.MAX_FRAME_LENGTH or pos + 2 + length > len(wire):
            break
        try:
            packet = bytes(box.open(len(frames) + 1, bytes(wire[pos + 2:pos + 2 + length])))
        except ValueError:
            break
        frames.append((pos, l_obf, mask, length, packet))
        pos += 2 + length
    return frames


def frames_section(walk, label, wire, key72, start=0):
    """One direction's frames, opened; ``start``: where they begin in that side's stream
    (each frame is filed there for the pictures)."""
    frames = open_frames(wire, key72)
    walk.title("The frames, %s (%d bytes after the handshake)" % (label, len(wire)))
    print("    offset  L_obf  mask  L = L_obf XOR mask  the packet (L - 16 bytes): type | n | payload "
          "| zeros")
    for pos, l_obf, mask, length, packet in frames[:SHOW_FRAMES]:
        kind, n = packet[0], int.from_bytes(packet[1:3], "big")
        what = {0: "payload", 1: "PRNG seed"}.get(kind, "unknown")
        print("    %6d  %04x   %04x  %4d                type %d (%s), n = %d, %d zero bytes"
              % (pos, l_obf, mask, length, kind, what, n, len(packet) - 3 - n))
    if len(frames) > SHOW_FRAMES:
        print("    ... %d more frames" % (len(frames) - SHOW_FRAMES))
    for pos, _, _, length, packet in frames:
        kind = "seed frame" if packet[0] == 1 else "padding" if packet[1:3] == b"\0\0" else "data frame"
        walk.record(start + pos, 2 + length, kind, label.split()[0])
    walk.check(sum(2 + f[3] for f in frames) == len(wire), "the %s bytes are not whole frames" % label)
    print("  Each frame on the wire is 2 + L bytes. The 2-byte length is masked by a SipHash DRBG")
    print("  seeded from OKM: the wire shows no frame boundary. Type-0 packets with n = 0 are pure")
    print("  padding: each burst is padded to a length drawn from the bridge's table (lenDist).")
    return frames


def iat_section(walk):
    client = walk.exchange.client
    mode = walk.client.iat_mode
    walk.title("What iat-mode %d did to the client's writes" % mode)
    sizes = [len(piece) for piece in client.pieces[1:]]
    print("  after the handshake the client produced %d piece(s): %s bytes"
          % (len(sizes), ", ".join(map(str, sizes))))
    if mode == obfs4.IAT_NONE:
        print("  iat-mode 0: one write per send(), the data frames and their padding frames together;")
        print("  the timing is the application's. --iat-mode=1 or 2 changes that (try it).")
    else:
        print("  and waited after each: %s" % ", ".join(present.duration(d) for d in client.delays))
        print("  iat-mode %d: %s," % (mode, "the padded burst cut into pieces of at most 1448 bytes"
                                      if mode == obfs4.IAT_ENABLED else
                                      "every piece exactly one lenDist sample long, padding included"))
        print("  each followed by a pause drawn from the bridge's IAT table (0..10 ms): the writes no")
        print("  longer show the application's timing or write sizes.")
        walk.check(all(size <= obfs4.MAXIMUM_SEGMENT_LENGTH for size in sizes) or mode != obfs4.IAT_ENABLED,
                   "an iat-mode 1 piece is longer than 1448 bytes")


class Obfs4Stage(Stage):
    """obfs4's bridge makes its long-term identity (NODEID, b, drbg-seed, and so its
    length table) in the demo's state directory: from ``rng`` when the demo has a seed."""

    def server_config(self, cls, directory, rng=None):
        if rng is None:
            return Stage.server_config(self, cls, directory)
        return cls.server_config(self.server_options, directory, randbytes=bytes_from(rng))
