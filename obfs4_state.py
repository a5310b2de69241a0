"""obfs4_state.py: an obfs4 bridge's long-term identity and its files (obfs4-spec §5),
what obfs4proxy keeps in statefile.go. obfs4.py, the protocol, does no file I/O: its
``server_config`` (once per listener) gets the bridge's ``Identity`` from here, and so
does ``unmask --state-dir`` (``read_identity``, which never writes).

The identity: NODEID (20 bytes), the private key b (32) and B = X25519(b, 9), the
drbg-seed (24: the length and IAT tables, the close delay) and the iat-mode. Clients
get NODEID | B as the bridge line's cert=.

The files, in the state directory (created 0700, files 0600, as obfs4proxy does)::

    obfs4_state.json      {"node-id":"..","private-key":"..","public-key":"..",
                           "drbg-seed":"..","iat-mode":0}   hex, written as Go writes it
    obfs4_bridgeline.txt  the client's Bridge line, with placeholders for the address

Both are written at a start that changes them (atomically: ``_write_file``), and
left alone otherwise; "public-key" is never trusted on load (B is
recomputed from b). ``load_or_create_state`` gives the order of the steps. A directory
or file that an operator opened to other users (chmod 755, 644) keeps its mode, and the
bridge says so at WARNING on every start, as ssh does for a private key.
"""

import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import shlex
import tempfile
from pathlib import Path

from cryptoroutes.curve25519 import x25519_base
from obfs4_drbg import DRBG_SEED_LENGTH

NODE_ID_LENGTH = 20
KEY_LENGTH = 32                               # X25519 keys: b, B (and x, X, y, Y)
SEED_LENGTH = DRBG_SEED_LENGTH                # the drbg-seed: 24 bytes
CERT_LENGTH = NODE_ID_LENGTH + KEY_LENGTH     # 52 bytes -> 70 base64 characters
CERT_CHARACTERS = 70                           # base64 of the 52 bytes, its "==" dropped
IAT_NONE, IAT_ENABLED, IAT_PARANOID = 0, 1, 2
STATE_FILE = "obfs4_state.json"
BRIDGE_FILE = "obfs4_bridgeline.txt"
POSIX_MODES = os.name == "posix"      # Windows has no group and other bits to check


# --- What the bridge line and the state file hold: hex, iat-mode, the cert --------------

def from_hex(text, length, what):
    """Exactly ``length`` bytes from hex digits (either case), or ValueError."""
    if not isinstance(text, str) or not re.fullmatch(r"(?:[0-9a-fA-F]{2})*", text):
        # Where, never what: the text may be a private key (safe logging).
        bad = re.search(r"[^0-9a-fA-F]", text) if isinstance(text, str) else None
        why = ("not a string" if not isinstance(text, str) else "character %d is not a hex digit"
               % (bad.start() + 1) if bad else "an odd number of digits")
        raise ValueError("malformed %s: not hex (%s)" % (what, why))
    raw = bytes.fromhex(text)
    if len(raw) != length:
        raise ValueError("invalid %s: %d bytes, want %d (%d hex digits)"
                         % (what, len(raw), length, 2 * length))
    return raw


def parse_iat_mode(text):
    """iat-mode as obfs4proxy parses it (Go's strconv.Atoi, then the 0..2 range check):
    ASCII digits with an optional sign, within a 64-bit int, else "malformed"."""
    match = re.fullmatch(r"([+-]?)0*([0-9]+)", text or "")
    # Over 19 significant digits is past int64 for Go, and from 4301 digits on past
    # int()'s limit for Python: decide on the digits before converting them.
    if not match or len(match.group(2)) > 19:
        raise ValueError("malformed iat-mode '%s'" % text)
    mode = int(match.group(1) + match.group(2))
    if not -2 ** 63 <= mode < 2 ** 63:
        raise ValueError("malformed iat-mode '%s'" % text)
    if not IAT_NONE <= mode <= IAT_PARANOID:
        raise ValueError("invalid iat-mode '%d'" % mode)
    return mode


def encode_cert(node_id, public_key):
    """cert = base64(NODEID | B) with the trailing "==" removed: 70 characters, standard
    alphabet (+ and /)."""
    return base64.b64encode(node_id + public_key).decode("ascii")[:-2]


def parse_cert(cert):
    """(NODEID, B) from a cert; ValueError unless it decodes to exactly 52 bytes, in
    the words of what the user sees: characters, and obfs4proxy's comma-separated form."""
    if "," in cert:
        raise ValueError("cert= ends at a comma here: separate a bridge's arguments with ';' "
                         "(obfs4proxy's SMETHOD ARGS write cert=...,iat-mode=0)")
    if len(cert) != CERT_CHARACTERS:
        raise ValueError("cert= is %d characters; a bridge line's is %d" % (len(cert), CERT_CHARACTERS))
    try:
        raw = base64.b64decode(cert + "==", validate=True)
    except ValueError as error:          # binascii.Error, or a non-ASCII str
        raise ValueError("failed to decode cert: %s" % error)
    if len(raw) != CERT_LENGTH:
        raise ValueError("cert length %d is invalid" % len(raw))
    return raw[:NODE_ID_LENGTH], raw[NODE_ID_LENGTH:]


class Identity:
    """A server's long-term state: NODEID (20), b (32, stored unclamped; X25519 clamps),
    B = X25519(b, 9), drbg-seed (24, seeds the length and IAT tables and the close
    delay) and iat-mode."""

    def __init__(self, node_id, private_key, drbg_seed, iat_mode=IAT_NONE):
        if len(node_id) != NODE_ID_LENGTH or len(private_key) != KEY_LENGTH \
                or len(drbg_seed) != SEED_LENGTH:
            raise ValueError("an identity needs a 20-byte node-id, a 32-byte private key "
                             "and a 24-byte drbg-seed")
        if iat_mode not in (IAT_NONE, IAT_ENABLED, IAT_PARANOID):
            raise ValueError("invalid iat-mode '%s'" % iat_mode)
        self.node_id = bytes(node_id)
        self.private_key = bytes(private_key)
        self.public_key = x25519_base(self.private_key)
        self.drbg_seed = bytes(drbg_seed)
        self.iat_mode = iat_mode

    @property
    def cert(self):
        return encode_cert(self.node_id, self.public_key)


# --- The files -----------------------------------------------------------------------

BRIDGE_LINE_TEMPLATE = """\
# obfs4 torrc client bridge line
#
# This file is an automatically generated bridge line based on
# the current obfs4proxy configuration.  EDITING IT WILL HAVE
# NO EFFECT.
#
# Before distributing this Bridge, edit the placeholder fields
# to contain the actual values:
#  <IP ADDRESS>  - The public IP address of your obfs4 bridge.
#  <PORT>        - The TCP/IP port of your obfs4 bridge.
#  <FINGERPRINT> - The bridge's fingerprint.

Bridge obfs4 <IP ADDRESS>:<PORT> <FINGERPRINT> cert=%s iat-mode=%d
"""

# obfs4_state.json's fields, in the order obfs4proxy writes them.
STATE_FIELDS = (("node-id", str), ("private-key", str), ("public-key", str),
                ("drbg-seed", str), ("iat-mode", int))


def state_json(state):
    """obfs4_state.json's bytes as Go's json.Marshal writes them: compact, the fields in
    STATE_FIELDS order, no trailing newline, < > & escaped, other text as UTF-8."""
    text = json.dumps({name: state[name] for name, _ in STATE_FIELDS},
                      separators=(",", ":"), ensure_ascii=False)
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                         ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(char, escape)
    return text.encode("utf-8")


# Go's encoding/json matches a name to a field by Unicode simple case folding. The
# field names are ASCII; besides ASCII letters of the other case, only these two
# characters fold to one of their letters.
_FOLDS_TO_ASCII = {"\u017f": "s", "\u212a": "k"}     # LATIN SMALL LONG S, KELVIN SIGN


def _field_name(key):
    """The STATE_FIELDS name that Go's json.Unmarshal would fill from ``key``, or None."""
    folded = "".join(char.lower() if ord(char) < 128 else _FOLDS_TO_ASCII.get(char, char)
                     for char in key)
    return folded if folded in dict(STATE_FIELDS) else None


def _read_state(path):
    """The fields of an existing obfs4_state.json, read as Go's json.Unmarshal reads it
    into a struct: names match by simple case folding ("NODE-ID", "drbg-\u017feed"),
    unknown fields are dropped, null is the zero value, wrong types are errors, and a
    byte sequence that is not UTF-8 reads as U+FFFD (inside a string it passes; an
    ignored field may hold one; anywhere else it is no JSON). ValueError naming the
    file; OSError if it cannot be read."""
    try:
        loaded = json.loads(path.read_bytes().decode("utf-8", "replace"))
    except ValueError as error:
        raise ValueError("failed to load statefile '%s': %s" % (path, error))
    except RecursionError:               # [[[[... deeper than Python's stack (Go allows 10,000)
        raise ValueError("failed to load statefile '%s': nested too deeply" % path)
    if not isinstance(loaded, dict):
        raise ValueError("failed to load statefile '%s': not a JSON object" % path)
    state = {"node-id": "", "private-key": "", "public-key": "", "drbg-seed": "", "iat-mode": 0}
    types = dict(STATE_FIELDS)
    for key, value in loaded.items():
        name = _field_name(key)
        if name is None or value is None:
            continue
        if type(value) is not types[name]:
            raise ValueError("failed to load statefile '%s': '%s' must be a %s"
                             % (path, name, "string" if types[name] is str else "integer"))
        state[name] = value
    return state


def _state_identity(state):
    """The Identity of a state's fields (from the file, or from the options); ValueError
    on a bad iat-mode or hex that is not exactly 20, 32 and 24 bytes (no spaces)."""
    if not IAT_NONE <= state["iat-mode"] <= IAT_PARANOID:
        raise ValueError("invalid iat-mode '%d'" % state["iat-mode"])
    return Identity(from_hex(state["node-id"], NODE_ID_LENGTH, "node-id"),
                    from_hex(state["private-key"], KEY_LENGTH, "private-key"),
                    from_hex(state["drbg-seed"], SEED_LENGTH, "drbg-seed"),
                    state["iat-mode"])


def read_identity(state_dir):
    """The bridge identity in STATE_DIR/obfs4_state.json, read exactly as the server reads
    it at start-up, and never created or written: for tools that only look (unmask's
    --state-dir). The server (``load_or_create_state``) reads through the same two steps,
    ``_read_state`` and ``_state_identity``; only the wording of a bad field differs: the
    server says it as obfs4proxy does (without the file's name), this adds the name.

    What is read: a JSON object whose names match case-insensitively ("NODE-ID"), unknown
    names ignored, null or absent meaning "" or 0; node-id, private-key and drbg-seed in
    hex of exactly 20, 32 and 24 bytes, either case, nothing around it; iat-mode 0..2.
    "public-key" is never trusted: B is recomputed from private-key.

    OSError if the file cannot be read (FileNotFoundError when there is none); ValueError,
    naming the file, when it is not a valid state.
    """
    path = Path(state_dir) / STATE_FILE
    state = _read_state(path)
    try:
        return _state_identity(state)
    except ValueError as error:
        raise ValueError("failed to load statefile '%s': %s" % (path, error))


def _write_file(path, data):
    """Make the file at ``path`` hold ``data``, so that a crash, a full disk or a
    power cut at any moment leaves either the old file or the new one, never a
    short one: obfs4_state.json holds the bridge's private key, and the bridge
    lines handed out depend on it. Nothing is written when the file already
    holds ``data``. Otherwise a temporary file in the same directory gets the
    data, the mode of the file it replaces (0600 for a new one) and an fsync,
    is renamed over it, and the directory is fsynced so the rename lasts. A
    symbolic link is followed: its target is replaced."""
    path = Path(os.path.realpath(str(path)))
    try:
        if path.read_bytes() == data:
            return
        mode = os.stat(str(path)).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600
    fd, temporary = tempfile.mkstemp(prefix="." + path.name + ".", suffix=".tmp", dir=str(path.parent))
    try:
        try:
            if POSIX_MODES:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, str(path))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _sync_directory(path.parent)


def _sync_directory(path):
    """fsync a directory, so that a rename in it survives a crash (POSIX only:
    Windows cannot open a directory, and makes a rename durable itself)."""
    if not POSIX_MODES:
        return
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_state_dir(path):
    """mkdir -p with mode 0700 for every directory created (Go's os.MkdirAll(dir, 0700))."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(str(directory), 0o700)
        except FileExistsError:
            pass


def load_or_create_state(state_dir, options, randbytes=os.urandom):
    """(Identity, notes): the server's Identity, exactly as obfs4proxy 0.0.14 gets it
    (§5), and the lines for the core to say once (a tuple: one when identity options
    replaced a different, or unreadable, identity in an existing state file):

    1. node-id, private-key, drbg-seed in ``options``: all three or none
       ("missing argument 'private-key'"); given -> the file gets "public-key":"", and
       whatever identity it held is replaced (even an unreadable file), as obfs4proxy does.
       None -> load obfs4_state.json (``read_identity``'s rules), or create a fresh
       identity from ``randbytes`` and write it.
    2. iat-mode in ``options`` overrides ("malformed iat-mode 'x'", "invalid iat-mode '3'").
    3. Write obfs4_bridgeline.txt, then write the state back (public-key verbatim: it is
       ignored on load and recomputed from private-key); a file that already holds
       those bytes is left alone, another is replaced whole (``_write_file``).

    Files are created 0600, directories 0700; a directory or file that exists keeps its
    mode, and one open to group or others adds a ``WarningNote`` (``loose_modes``).
    ValueError on anything bad.
    """
    state_dir = Path(state_dir)
    notes = ()
    try:
        _make_state_dir(state_dir)
        path = state_dir / STATE_FILE
        given = [name for name in ("node-id", "private-key", "drbg-seed") if name in options]
        if not given:
            if path.exists():
                state = _read_state(path)
            else:
                # obfs4proxy's order: node-id, then b = SHA-512(32 bytes)[0:32], then the seed.
                node_id = randbytes(NODE_ID_LENGTH)
                private_key = hashlib.sha512(randbytes(32)).digest()[:32]
                drbg_seed = randbytes(SEED_LENGTH)
                state = {"node-id": node_id.hex(), "private-key": private_key.hex(),
                         "public-key": x25519_base(private_key).hex(),
                         "drbg-seed": drbg_seed.hex(), "iat-mode": IAT_NONE}
                _write_file(path, state_json(state))
        else:
            for name in ("private-key", "node-id", "drbg-seed"):
                if name not in options:
                    raise ValueError("missing argument '%s'" % name)
            state = {"node-id": options["node-id"], "private-key": options["private-key"],
                     "public-key": "", "drbg-seed": options["drbg-seed"], "iat-mode": IAT_NONE}
        if "iat-mode" in options:
            state["iat-mode"] = parse_iat_mode(options["iat-mode"])
        identity = _state_identity(state)
        if given and os.path.lexists(str(path)) and not _holds(path, identity):
            notes = ("node-id, private-key and drbg-seed replaced the identity in %s" % path,)
        _write_file(state_dir / BRIDGE_FILE,
                    (BRIDGE_LINE_TEMPLATE % (identity.cert, identity.iat_mode)).encode("ascii"))
        _write_file(path, state_json(state))
        notes += loose_modes(state_dir)
    except OSError as error:
        raise ValueError("obfs4 state %s: %s" % (os.path.abspath(error.filename or str(state_dir)),
                                            error.strerror or error))
    return identity, notes


class WarningNote(str):
    """A note the core says at WARNING rather than NOTICE (transports.py: config.notes)."""
    level = logging.WARNING


def loose_modes(state_dir):
    """A ``WarningNote`` for the state directory and each of its two files that group or
    others may use (any of the mode bits 077), naming it by its role and saying the
    chmod that closes it; none where the system has no POSIX modes (Windows)."""
    if not POSIX_MODES:
        return ()
    warnings = []
    for path, role, private in ((state_dir, "the obfs4 state directory", 0o700),
                                (state_dir / STATE_FILE, "the bridge's private key file", 0o600),
                                (state_dir / BRIDGE_FILE, "the bridge line file", 0o600)):
        mode = os.stat(str(path)).st_mode & 0o777
        if mode & 0o077:
            warnings.append(WarningNote("%s %s is open to other users (mode %04o): chmod %o %s"
                                        % (role, path, mode, private, shlex.quote(str(path)))))
    return tuple(warnings)


def _holds(path, identity):
    """True if the state file at ``path`` reads as this very identity (keys, seed and
    iat-mode); False if it differs or cannot be read."""
    try:
        held = read_identity(path.parent)
    except (OSError, ValueError):
        return False
    return (held.node_id, held.private_key, held.drbg_seed, held.iat_mode) == \
        (identity.node_id, identity.private_key, identity.drbg_seed, identity.iat_mode)
