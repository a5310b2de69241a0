#!/usr/bin/env python3
"""obfsproxy.py: an obfuscating TCP proxy (TRANSPORT_NAMES) for Tor and anything SOCKS.

Usage:
  obfsproxy.py client [options] [<listen>]
  obfsproxy.py client [options] --bridge=LINE <listen>
  obfsproxy.py client [options] --dest=HOST:PORT <listen>
  obfsproxy.py server [options] --dest=HOST:PORT <listen>
  obfsproxy.py demo [options]
  obfsproxy.py managed [options]
  obfsproxy.py --managed [options]
  obfsproxy.py unmask [options] <capture>...
  obfsproxy.py detect [options] <capture>...
  obfsproxy.py guide [options]
  obfsproxy.py [COMMAND] (-h | --help)
  obfsproxy.py --version

Commands:
  client   Listen for SOCKS4/4a/5 clients (Tor, curl, ssh...) on <listen>
           (default 127.0.0.1:1050); the SOCKS CONNECT target is the bridge.
           With --bridge or --dest, no SOCKS: every connection goes to that bridge.
  server   Listen for clients of the transport on <listen>; forward the plain
           stream to --dest (for a bridge: Tor's ORPort).
  demo     Run a server, a client and an echo service on 127.0.0.1, send a
           message through them and show what crossed the wire.
  managed  Run as a Tor pluggable transport: configuration comes from Tor's
           TOR_PT_* environment variables, status goes to stdout.
  unmask   The passive attack, for teaching: read a capture (a pcap file, or
           the files of --record-dir) and show what an eavesdropper gets.
  detect   Say which TCP streams in a capture look like obfs2, fully encrypted
           traffic or TLS, and which test decided.
  guide    Print the protocol guide (docs/PROTOCOL.md: how each transport works,
           with walks and examples to run), or the README with --readme. The
           .pyz carries both.

Transports and their options:
  --transport=NAME              TRANSPORT_NAMES (default obfs4).
                                dummy passes bytes unchanged (the baseline).
                                demo: all runs every transport, one after another.
  --bridge=LINE                 client: a pasted bridge line, e.g. "obfs4
                                192.0.2.1:443 FINGERPRINT cert=... iat-mode=0";
                                sets --transport, the bridge and its arguments.
  --cert=CERT                   obfs4 client: the bridge's cert= (70 characters).
  --iat-mode=N                  obfs4: 0, 1 or 2 (inter-arrival time obfuscation).
  --state-dir=DIR               obfs4 server: where its keys live (obfs4_state.json,
                                as obfs4proxy keeps them); unmask: a bridge's keys.
  --shared-secret=SECRET        obfs2: a shared secret both ends must use.
                                Visible in `ps`: prefer --shared-secret-file.
  --shared-secret-file=PATH     obfs2: read the shared secret from PATH's first line.
  --ss-hash-iterations=N        obfs2: hash rounds per key with a shared secret
                                (default 100000).
  --transport-options=K=V;...   Any transport's arguments, as Tor writes them
                                (escape ; = \\ with a backslash).

Other options:
  --dest=HOST:PORT              client: the bridge to forward to (no SOCKS).
                                server: where the plain stream goes.
  --handshake-timeout=SECONDS   Close a connection whose SOCKS, connect or
                                transport handshake takes longer (default 30).
  --max-connections=N           Refuse connections beyond N at once (default 2048).
  --proxy=URI                   client: reach the bridge through an outgoing proxy,
                                socks5://[USER[:PASS]@]HOST:PORT, socks4a://HOST:PORT
                                or http://[USER[:PASS]@]HOST:PORT
  --ext-cookie-file=PATH        server: --dest is Tor's Extended ORPort; authenticate
                                with this cookie file and report each client.
  --record-dir=DIR              Save each connection's raw wire bytes in DIR
                                (for teaching and debugging only).
  --full                        unmask: print whole streams, not their first 512 bytes.
  --output-dir=DIR              unmask: also write the decrypted streams to DIR.
  --html=FILE                   demo, unmask, detect: also draw what they show, on
                                one HTML page any browser opens (it loads nothing).
  --readme                      guide: the README instead of the protocol guide.
  --write=FILE                  guide: write it to FILE instead of printing it.
  --log-file=PATH               Write the log to PATH (owner-only) instead of stderr.
  --log-min-severity=LEVEL      error, warning (or warn), notice, info or debug
                                (default notice).
  --no-safe-logging             Show IP addresses in the log (scrubbed by default).
  -h --help                     Show this help (after a command: that command's).
  --version                     Show the version.

Examples:
  python3 obfsproxy.py demo --transport=obfs4
  python3 obfsproxy.py client --bridge="obfs4 192.0.2.1:443 FPR cert=... iat-mode=0" 127.0.0.1:2222
  python3 obfsproxy.py client --transport=obfs4 127.0.0.1:1050      (SOCKS; Tor sends cert=)
  python3 obfsproxy.py server --transport=obfs4 --state-dir=state --dest=127.0.0.1:9001 0.0.0.0:443
  curl --socks5 127.0.0.1:1050 --proxy-user "cert=...;iat-mode=0:" ...
"""

from __future__ import print_function  # lets Python 2 parse this file, to read the next lines

import sys

if sys.version_info < (3, 6):
    sys.exit("obfsproxy.py needs Python 3.6 or newer; this is Python %s (%s)"
             % (sys.version.split()[0], sys.executable))

import math  # noqa: E402  (the version check comes first)
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

# Our modules sit beside this file; Python 3.11's `-I` (which implies -P) leaves that
# folder off sys.path, and `python3 -I -S obfsproxy.py` must still find them.
if os.path.dirname(os.path.abspath(__file__)) not in map(os.path.abspath, sys.path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cryptoroutes import chooser  # noqa: E402  (found through the path above)

__version__ = "0.3.0"
COMMANDS = ("client", "server", "demo", "managed", "unmask", "detect", "guide")
# Answered by main() before docopt is needed: they work where nothing is installed.
HELP_WORDS = ("-h", "--help")
VERSION_WORD = "--version"


def missing_dependency(missing):
    """A package this Python lacks: one line that names the three ways to run (the
    README's 'Three ways to run'), and this checkout's .venv when there is one; for
    Tor (managed mode, which reads only our stdout) an ENV-ERROR with the torrc line."""
    here = os.path.dirname(os.path.abspath(__file__))
    venv = os.path.join(here, ".venv", "bin", "python3")
    has_venv = os.path.exists(venv)
    text = ("missing dependency (%s): this Python (%s) lacks a package obfsproxy.py needs. "
            % (missing, sys.executable))
    if has_venv:
        text += "This checkout has a virtual environment: run %s obfsproxy.py. " % venv
    text += ("Three ways to run (see the README's 'Three ways to run'): a virtual environment "
             "(python3 -m venv .venv && .venv/bin/pip install -r requirements.txt, then "
             ".venv/bin/python3 obfsproxy.py); Debian's packages (apt-get install "
             "python3-pycryptodome python3-docopt, then /usr/bin/python3 obfsproxy.py); or "
             "nothing installed (python3 tools/make_pyz.py where the packages are, then "
             "python3 -I -S obfsproxy.pyz).")
    if any(word in ("managed", "--managed") for word in sys.argv[1:]):
        # Tor reads only our stdout: say it there, in pt-spec's words, with the
        # torrc line to write (this checkout's paths; only safe characters of
        # Tor's variables, which must not start a line of their own).
        server = os.environ.get("TOR_PT_SERVER_TRANSPORTS")
        names = re.sub(r"[^\w,]", "", server or os.environ.get("TOR_PT_CLIENT_TRANSPORTS") or "") or "obfs4"
        print("ENV-ERROR %s In the torrc, name the Python that has them: %sTransportPlugin %s exec %s %s "
              "managed" % (text, "Server" if server else "Client", names,
                           venv if has_venv else "/path/to/.venv/bin/python3",
                           os.path.join(here, "obfsproxy.py")), flush=True)
    sys.exit("obfsproxy.py: " + text)


def is_ours(missing):
    """True when the module that failed to import is one of this tool's own files:
    an ImportError there is a bug (or a broken copy), not a missing package."""
    name = (getattr(missing, "name", None) or "").split(".")[0]
    here = os.path.dirname(os.path.abspath(__file__))
    return bool(name) and (name in sys.modules or os.path.exists(os.path.join(here, name + ".py"))
                           or os.path.isdir(os.path.join(here, name)))


try:
    # docopt-ng, or classic docopt 0.6.2 (Debian's python3-docopt): both parse USAGE
    # alike, and what differs between them (--help, --version, their usage errors) is
    # done here, not by docopt.
    with warnings.catch_warnings():
        # Classic docopt's regular expressions are plain strings with backslashes, which
        # Python 3.12 and newer warn about as they compile it (a .pyz built by another
        # Python compiles it at each start): the warning is the library's, not the user's.
        warnings.simplefilter("ignore", SyntaxWarning)
        from docopt import DocoptExit, docopt
except ImportError as _missing:
    if getattr(_missing, "name", None) != "docopt":
        raise  # an ImportError inside docopt itself is not a missing docopt
    if not any(word in HELP_WORDS + (VERSION_WORD,) for word in sys.argv[1:]):
        missing_dependency(_missing)
    DocoptExit = docopt = None     # main() answers --help and --version without it

try:   # importing the transports proves each crypto route by its known answers
    import listener
    import outbound
    import pool
    import process_setup
    import proxy
    import socks
    import transports
except ImportError as _missing:
    if is_ours(_missing):
        raise
    missing_dependency(_missing)
except chooser.KnownAnswerError as _wrong:
    # A primitive with no fallback gave a wrong answer: refuse to run it, and say so
    # where the user (or Tor) will read it.
    if any(word in ("managed", "--managed") for word in sys.argv[1:]):
        print("ENV-ERROR %s" % _wrong, flush=True)
    sys.exit("obfsproxy.py: %s" % _wrong)

log = proxy.log
USAGE = __doc__.replace("TRANSPORT_NAMES", ", ".join(transports.TRANSPORTS))
DEFAULT_TRANSPORT = "obfs4"   # the only one probe-resistant and unreadable by an observer

# Which commands take each option; any other command refuses it (never ignores it).
SERVING = ("client", "server", "managed")
MODE_OPTIONS = {
    "--transport": ("client", "server", "demo", "managed"),
    "--bridge": ("client",),
    "--cert": ("client", "managed"),
    "--iat-mode": ("client", "server", "managed", "demo"),
    "--state-dir": ("server", "unmask"),
    "--shared-secret": SERVING + ("demo", "unmask", "detect"),
    "--shared-secret-file": SERVING + ("demo", "unmask", "detect"),
    "--ss-hash-iterations": SERVING + ("demo", "unmask", "detect"),
    "--transport-options": SERVING + ("demo",),
    "--dest": ("client", "server"),
    "--handshake-timeout": SERVING,
    "--max-connections": SERVING,
    "--proxy": ("client", "managed"),
    "--ext-cookie-file": ("server",),
    "--record-dir": SERVING + ("demo",),
    "--full": ("unmask",),
    "--output-dir": ("unmask",),
    "--html": ("demo", "unmask", "detect"),
    "--readme": ("guide",),
    "--write": ("guide",),
    "--log-file": SERVING,
    "--log-min-severity": SERVING,
    "--no-safe-logging": SERVING,
}

# obfs2's and obfs4's own shorthands for --transport-options.
SHORTHANDS = {"--shared-secret": ("obfs2", "shared-secret"),
              "--ss-hash-iterations": ("obfs2", "ss-hash-iterations"),
              "--cert": ("obfs4", "cert"),
              "--iat-mode": ("obfs4", "iat-mode")}
SEVERITY_SPELLINGS = {"warn": "warning", "err": "error"}


class UsageError(ValueError):
    """A bad command line: one line on stderr, exit status 2."""


def mode_of(args):
    for mode in COMMANDS:
        if args.get(mode):
            return mode
    return "managed"


def number(args, option, kind, low, default, high=None):
    text = args[option]
    if text is None:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise UsageError("%s: %r is not a %s" % (option, text, "whole number" if kind is int else "number"))
    if not math.isfinite(value):    # float() takes "inf" and "nan"; no timer does
        raise UsageError("%s: %r is not a finite number" % (option, text))
    if not value >= low:
        raise UsageError("%s must be at least %s" % (option, low))
    if high is not None and value > high:
        raise UsageError("%s must be at most %s" % (option, high))
    return value


def read_first_line(option, path):
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError("%s %s: %s" % (option, path, getattr(exc, "strerror", None) or exc))
    if not lines or not lines[0]:
        raise UsageError("%s %s: the first line is empty" % (option, path))
    return lines[0]


def address(option, text, allow_port_zero=False):
    try:
        return outbound.parse_address(text, allow_port_zero=allow_port_zero)
    except ValueError as exc:
        raise UsageError("%s%s" % (option + ": " if option else "", exc))


def transport_class(option, name):
    try:
        return transports.transport_class(name)
    except ValueError as exc:
        raise UsageError("%s: %s" % (option, exc))


def parse_bridge_line(text):
    """'[Bridge] obfs4 192.0.2.1:443 [FINGERPRINT] k=v ...' ->
    (transport, (host, port), {k: v}). An error says which word is wrong by its
    place in the line, never what it holds: it may be a cert= or a secret url=."""
    if "<IP ADDRESS>" in text or "<IP" in text.split():
        raise UsageError("--bridge: replace the placeholder <IP ADDRESS> with the bridge's address")
    if "<PORT>" in text:
        raise UsageError("--bridge: replace the placeholder <PORT> with the bridge's port")
    if any(quote in text for quote in "\u201c\u201d\u2018\u2019"):
        raise UsageError("--bridge: the line holds curly quotes (\u201c \u201d), which a word processor or "
                         "a web page made: put the line between straight quotes (\")")
    words = text.split()
    first = 1                            # the place of words[0] in the line as given
    if words and words[0].lower() == "bridge":
        words, first = words[1:], 2
    if len(words) < 2:
        raise UsageError("--bridge: expected \"TRANSPORT HOST:PORT [FINGERPRINT] [K=V ...]\"")
    name, where, rest = words[0], words[1], words[2:]
    if name not in transports.TRANSPORTS:
        raise UsageError("--bridge: word %d is not a transport name (have: %s)"
                         % (first, ", ".join(transports.TRANSPORTS)))
    try:
        dest = outbound.parse_address(where)
    except ValueError:
        raise UsageError("--bridge: word %d is not the bridge's HOST:PORT" % (first + 1))
    place = first + 2
    if rest and re.fullmatch(r"[0-9A-Fa-f]{40}", rest[0]):
        rest, place = rest[1:], place + 1   # the fingerprint is Tor's business, not ours
    options = {}
    for word in rest:
        key, sep, value = word.partition("=")
        if word == "<FINGERPRINT>":
            raise UsageError("--bridge: <FINGERPRINT> is a placeholder: put the bridge's 40-hex "
                             "fingerprint there, or leave it out (a tunnel without Tor needs none)")
        if not sep or not key:
            raise UsageError("--bridge: word %d is neither a 40-hex fingerprint nor KEY=VALUE" % place)
        options[key] = value
        place += 1
    return name, dest, options


def options_by_transport(args, name):
    """{transport: {key: value}} from --transport-options (they belong to
    ``name``) and the shorthands (--cert is obfs4's, --shared-secret obfs2's ...)."""
    found = {}
    if args["--transport-options"]:
        if name is None:
            raise UsageError("--transport-options needs --transport (whose options they are)")
        try:
            found[name] = dict(socks.parse_args(args["--transport-options"]))
        except ValueError as exc:
            raise UsageError("--transport-options: %s" % exc)
    if args["--shared-secret-file"]:
        if args["--shared-secret"]:
            raise UsageError("give --shared-secret or --shared-secret-file, not both")
        args = dict(args, **{"--shared-secret": read_first_line("--shared-secret-file",
                                                                 args["--shared-secret-file"])})
    if args["--ss-hash-iterations"] is not None:
        number(args, "--ss-hash-iterations", int, 1, None)
    for option, (owner, key) in SHORTHANDS.items():
        if args[option] is not None:
            found.setdefault(owner, {})[key] = args[option]
    return found


def transport_options(args, name):
    """The options for ``name``; an option of another transport is refused, not ignored."""
    found = options_by_transport(args, name)
    options = found.pop(name, {})
    for option, (owner, _) in SHORTHANDS.items():
        if owner in found and args[option] is not None:
            raise UsageError("%s is an %s option (the transport is %s)" % (option, owner, name))
    return options


def check_modes(args, mode):
    for option, modes in MODE_OPTIONS.items():
        if args[option] not in (None, False) and mode not in modes:
            raise UsageError("%s is not used by %s (only by %s)" % (option, mode, ", ".join(modes)))


def severity(args):
    text = (args["--log-min-severity"] or "notice").lower()
    text = SEVERITY_SPELLINGS.get(text, text)
    if text not in proxy.SEVERITIES:
        raise UsageError("--log-min-severity must be one of %s" % ", ".join(proxy.SEVERITIES))
    return text


def base_settings(args, name):
    """(Settings common to every listener of ``name``, max connections) from the command line."""
    timeout = number(args, "--handshake-timeout", float, 0.001, 30.0, high=86400)   # a day
    max_connections = number(args, "--max-connections", int, 1, 2048)
    if args["--proxy"]:
        try:
            outbound.parse_proxy_uri(args["--proxy"])
        except outbound.ProxyURIError as exc:
            raise UsageError("--proxy: %s" % exc)
    wrappers = ()
    if args["--record-dir"]:
        try:
            wrappers = (transports.RecordDir(args["--record-dir"]).wrap,)
        except OSError as exc:
            raise UsageError("--record-dir %s: %s" % (os.path.abspath(args["--record-dir"]),
                                                      exc.strerror or exc))
    settings = proxy.Settings(transport=name, handshake_timeout=timeout,
                              safe_logging=not args["--no-safe-logging"],
                              outgoing_proxy=args["--proxy"], ext_cookie_file=args["--ext-cookie-file"],
                              wrappers=wrappers)
    return settings, max_connections


def setup_logging(args):
    try:
        proxy.setup_logging(args["--log-file"], severity(args))
    except OSError as exc:
        raise UsageError("--log-file %s: %s" % (args["--log-file"], exc.strerror or exc))


def bridge_line(cls, config, name, bound, announce):
    """The line to hand out, as far as we know it: the address when the listener
    has a specific one (the transport's public address if it names one), a
    placeholder for a wildcard; secret values stay out of the log."""
    public = getattr(cls, "public_address", None)
    host, port = public(config, bound) if public else bound
    where = "<IP ADDRESS>:%d" % port if host in ("0.0.0.0", "::") else outbound.format_address((host, port))
    secret = getattr(cls, "secret_options", ())
    words = ["%s=%s" % (key, "<as given>" if key in secret else value)
             for key, value in sorted(announce.items())]
    return " ".join(["Bridge", name, where] + words)


def run_external(args, mode):
    """``client`` and ``server``: check everything, listen, serve until stopped."""
    name, dest, options = args["--transport"] or DEFAULT_TRANSPORT, None, {}
    if args["--bridge"]:
        if args["--transport"] or args["--dest"]:
            raise UsageError("--bridge sets the transport and the bridge: drop --transport/--dest")
        name, dest, options = parse_bridge_line(args["--bridge"])
    elif args["--dest"]:
        dest = address("--dest", args["--dest"])
    cls = transport_class("--transport", name)
    settings, max_connections = base_settings(args, name)
    options.update(transport_options(args, name))
    if args["--state-dir"] and not getattr(cls, "uses_state_dir", False):
        keeping = [n for n, c in transports.TRANSPORTS.items() if getattr(c, "uses_state_dir", False)]
        raise UsageError("--state-dir: %s keeps no state (only %s %s)"
                         % (name, ", ".join(keeping), "does" if len(keeping) == 1 else "do"))
    if mode == "server" or dest is not None:
        listen_text = args["<listen>"]
        if listen_text is None:
            raise UsageError("give the address to listen on, e.g. 127.0.0.1:2222")
    else:
        listen_text = args["<listen>"] or "127.0.0.1:1050"
    where = address(None, listen_text, allow_port_zero=True)
    announce, config = {}, None
    if mode == "server":
        try:
            config, announce = cls.server_config(options, Path(args["--state-dir"]) if args["--state-dir"]
                                                 else None)
        except (ValueError, OSError) as exc:
            raise UsageError("%s server: %s" % (name, exc))
        settings = settings.replace(config=config, dest=dest)
        handler = proxy.handle_server
    else:
        settings = settings.replace(options=options, dest=dest)
        try:   # the defaults now, not at the first connection
            transports.check_client_options(cls, options, fixed=dest is not None)
        except ValueError as exc:
            raise UsageError("%s client: %s" % (name, exc))
        handler = proxy.handle_fixed_client if dest else proxy.handle_socks_client
    try:
        pool_size = pool.configured_size()
    except ValueError as exc:
        raise UsageError(str(exc))
    setup_logging(args)
    process_setup.prepare_for_serving(max_connections)
    proxy.log_routes([name])
    if args["--record-dir"]:
        log.warning("--record-dir: saving the raw wire bytes of every connection in %s. "
                    "This stores traffic (obfs2 can be decrypted from it with `%s "
                    "unmask`): for teaching and debugging only.", args["--record-dir"], proxy.program_name())
    server = listener.Listener(max_connections, pool_size=pool_size)
    try:
        bound = server.listen(where, handler, settings)
    except OSError as exc:
        log.error("cannot listen on %s: %s", listen_text, exc.strerror or exc)
        return 1
    if handler is proxy.handle_socks_client and not outbound.is_loopback(bound[0]):
        log.warning("the SOCKS port %s is reachable from other machines: anyone who "
                    "can reach it can use your tunnel. Bind to 127.0.0.1 unless you "
                    "mean it.", outbound.format_address(bound))
    if handler is proxy.handle_fixed_client and hasattr(cls, "routes"):
        # Where the transport dials, not the bridge line's address (webtunnel's is a
        # placeholder): its first route.
        dest = cls.routes(settings.client_config(), dest)[0][0]
    # The poller's thread first (serve() would start it): a process that says it listens
    # is at rest, its main thread and the poller, which tools watching it count on.
    server.waits.start()
    log.log(proxy.NOTICE, "%s %s listening on %s%s", name, mode, outbound.format_address(bound),
            " (SOCKS4/4a/5)" if handler is proxy.handle_socks_client else
            " -> %s" % outbound.format_address(dest))
    if mode == "server":
        log.log(proxy.NOTICE, "bridge line for clients: %s", bridge_line(cls, config, name, bound, announce))
    for note in getattr(config, "notes", ()):
        log.log(getattr(note, "level", proxy.NOTICE), "%s: %s", name, note)
    process_setup.install_signal_handlers(server)
    server.serve()
    log.log(proxy.NOTICE, "%s stopped", mode)
    return 0


def as_started(text):
    """``text`` (help, a hint) with the commands it shows written as the user started
    this program (proxy.program_name: ``python3 -I -S obfsproxy.pyz``, ``./obfsproxy.pyz``...)."""
    program = proxy.program_name()
    text = re.sub(r"^( *)(?:python3 )?obfsproxy\.py(?= )", lambda m: m.group(1) + program, text, flags=re.M)
    return text.replace("`obfsproxy.py ", "`%s " % program)


GUIDES = {False: "docs/PROTOCOL.md", True: "README.md"}


def guide(args):
    """``guide``: print the protocol guide (or the README), or write it to --write. Read
    beside this file in a checkout, and from inside the archive in a .pyz (which carries
    both: tools/make_pyz.py)."""
    name = GUIDES[bool(args["--readme"])]
    try:
        text = __loader__.get_data(os.path.join(proxy.HERE, *name.split("/"))).decode("utf-8")
    except OSError:
        print("obfsproxy.py guide: %s is not here (a copy of the runtime alone): it is in the "
              "checkout, and inside obfsproxy.pyz" % name, file=sys.stderr)
        return 1
    if args["--write"] is None:
        sys.stdout.write(text)
        return 0
    try:
        with open(args["--write"], "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        print("obfsproxy.py guide: --write %s: %s" % (os.path.abspath(args["--write"]), exc.strerror or exc),
              file=sys.stderr)
        return 1
    print("wrote %s (%d bytes) to %s" % (name, len(text.encode("utf-8")), args["--write"]))
    return 0


def command_help(command):
    """``obfsproxy.py COMMAND --help``: that command's usage lines, what it does,
    and only the options it takes."""
    usage = [line for line in USAGE.split("Commands:")[0].splitlines()
             if line.strip().startswith("obfsproxy.py %s " % command)
             or line.strip() == "obfsproxy.py %s" % command]
    body = USAGE.split("Commands:", 1)[1].split("Transports and their options:", 1)[0]
    described = re.search(r"^  %s +(.*?)(?=^  \S|\Z)" % command, body, re.M | re.S).group(0)
    lines = ["Usage:"] + usage + ["", described.rstrip(), "", "Options:"]
    blocks = re.findall(r"^(  -[^\n]*(?:\n {20,}[^\n]*)*)", USAGE, re.M)
    for block in blocks:
        option = block.split()[0].split("=")[0]
        modes = MODE_OPTIONS.get(option)
        if modes is None or command in modes:
            lines.append(block)
    return "\n".join(lines) + "\n"


def explain_usage(argv):
    """What docopt refused, in words, from the arguments alone."""
    words = [word for word in argv if not word.startswith("-")]
    if words[:1] == ["server"] and not any(word.startswith("--dest") for word in argv):
        return "server needs --dest=HOST:PORT (where the plain stream goes) and the address to listen on"
    if words == ["client"] and any(word.split("=", 1)[0] in ("--bridge", "--dest") for word in argv):
        return "give the address to listen on after --bridge or --dest, e.g. 127.0.0.1:2222"
    known = re.findall(r"^\s+(-[-\w]+)", USAGE, re.MULTILINE)
    for word in argv:
        option = word.split("=", 1)[0]
        if word.startswith("-") and option not in known:
            return "unknown option %s" % option
    if not words or words[0] not in COMMANDS:
        return "expected a command: %s" % ", ".join(COMMANDS)
    return "bad command line (%s)" % " ".join(argv)[:200]


def quiet_exit_on_closed_stdout():
    """The reader of our stdout went away (``| head``): end as a Unix tool does,
    killed by SIGPIPE, with nothing on stderr."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
    return 141


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # Printing commands end quietly when their reader goes away (`... | head`),
    # like any Unix tool; serving modes set SIGPIPE back to "ignore" below.
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # --help and --version anywhere, as docopt would (help first): here, so that they
    # need no docopt and say the same whichever docopt is installed.
    if any(word in HELP_WORDS for word in argv):
        print(as_started(command_help(argv[0]) if argv[0] in COMMANDS else USAGE.strip("\n") + "\n"), end="")
        return 0
    if VERSION_WORD in argv:
        print("obfsproxy.py " + __version__)
        return 0
    try:
        args = docopt(USAGE, argv=argv)
    except DocoptExit:
        print("obfsproxy.py: %s. Run `%s --help` for the usage."
              % (explain_usage(argv), proxy.program_name()), file=sys.stderr)
        return 2
    mode = mode_of(args)
    if mode not in ("unmask", "detect") and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)   # sockets: EPIPE is an error, not a death
    try:
        status = dispatch(args, mode)
        # What is still in the buffer goes now, while a reader that went away is
        # still caught below; at exit its EPIPE would be lost (demo: status 0).
        sys.stdout.flush()
        return status
    except UsageError as exc:
        if mode == "managed":   # Tor reads only our stdout: tell it there
            print("ENV-ERROR bad command line: %s" % str(exc).replace("\n", " "), flush=True)
            return 1
        print("obfsproxy.py %s: %s" % (mode, exc), file=sys.stderr)
        return 2
    except BrokenPipeError:
        return quiet_exit_on_closed_stdout()
    except KeyboardInterrupt:
        return 130


def teaching_absent(error, mode):
    """1, and one line, when the teaching/ folder is not beside this script: the runtime at
    the root serves traffic without it, but demo, unmask and detect live there. Any other
    ImportError (a module of teaching/ missing a dependency) is raised as it is."""
    if error.name not in ("teaching", "teaching.demo", "teaching.capture"):
        raise error
    print("obfsproxy.py %s: the teaching tools are not here: demo, unmask and detect need the "
          "teaching/ folder beside obfsproxy.py (client, server and managed run without it)" % mode,
          file=sys.stderr)
    return 1


def dispatch(args, mode):
    check_modes(args, mode)
    if mode == "demo":
        try:
            from teaching import demo
        except ImportError as error:
            return teaching_absent(error, mode)
        name = args["--transport"] or DEFAULT_TRANSPORT
        if name == "all":                  # each transport with the options that are its own
            settings, _ = base_settings(args, DEFAULT_TRANSPORT)
            found = options_by_transport(args, None)
            return demo.main_all({each: found.get(each, {}) for each in transports.TRANSPORTS}, settings,
                                 args["--record-dir"], args["--html"])
        transport_class("--transport", name)
        settings, _ = base_settings(args, name)
        return demo.main(name, transport_options(args, name), settings, args["--record-dir"],
                         html=args["--html"])
    if mode == "guide":
        return guide(args)
    if mode == "managed":
        import managed
        settings, max_connections = base_settings(args, args["--transport"] or DEFAULT_TRANSPORT)
        if args["--transport"]:
            transport_class("--transport", args["--transport"])
        return managed.main(settings, options_by_transport(args, args["--transport"]), max_connections,
                            args["--log-file"], severity(args))
    if mode in ("unmask", "detect"):
        try:
            from teaching import capture
        except ImportError as error:
            return teaching_absent(error, mode)
        options = transport_options(args, "obfs2")   # unmask reads obfs2 with its secret
        more = {"iterations": int(options["ss-hash-iterations"])} if "ss-hash-iterations" in options else {}
        return capture.main(mode, args["<capture>"], options.get("shared-secret"),
                            full=args["--full"], output_dir=args["--output-dir"],
                            state_dir=args["--state-dir"], html=args["--html"], **more)
    return run_external(args, mode)


if __name__ == "__main__":
    sys.exit(main())
