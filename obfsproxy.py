#!/usr/bin/env python3
"""obfsproxy.py: an obfuscating TCP proxy (obfs4, obfs3, obfs2) for Tor and anything SOCKS.

Usage:
  obfsproxy.py client [options] [--dest=HOST:PORT] [<listen>]
  obfsproxy.py server [options] --dest=HOST:PORT <listen>
  obfsproxy.py demo [options]
  obfsproxy.py managed [options]
  obfsproxy.py --managed [options]
  obfsproxy.py unmask [options] <capture>...
  obfsproxy.py detect [options] <capture>...
  obfsproxy.py (-h | --help)
  obfsproxy.py --version

Commands:
  client   Listen for SOCKS4/4a/5 clients (Tor, curl, ssh...) on <listen>
           (default 127.0.0.1:1050); the SOCKS CONNECT target is the bridge.
           With --dest or --bridge, no SOCKS: every connection goes to that bridge.
  server   Listen for clients of the transport on <listen>; forward the plain
           stream to --dest (for a bridge: Tor's ORPort).
  demo     Run a server, a client and an echo service on 127.0.0.1, send a
           message through them and show what crossed the wire.
  managed  Run as a Tor pluggable transport: configuration comes from Tor's
           TOR_PT_* environment variables, status goes to stdout.
  unmask   The passive attack, for teaching: read a capture (a pcap file, or
           the files of --record-dir) and show what an eavesdropper gets.
  detect   Say which TCP streams in a capture look like obfs2, obfs3, obfs4 or
           fully encrypted traffic, and which test decided.

Transports and their options:
  --transport=NAME              obfs4, obfs3, obfs2, or dummy (no obfuscation);
                                default obfs2 (demo, unmask: obfs2).
  --bridge=LINE                 client: a pasted bridge line, e.g. "obfs4
                                192.0.2.1:443 FINGERPRINT cert=... iat-mode=0";
                                sets --transport, --dest and the arguments.
  --cert=CERT                   obfs4 client: the bridge's cert= (70 characters).
  --iat-mode=N                  obfs4: 0, 1 or 2 (inter-arrival time obfuscation).
  --state-dir=DIR               obfs4 server: where its keys live
                                (obfs4_state.json, as obfs4proxy keeps them).
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
                                transport handshake takes longer [default: 30]
  --max-connections=N           Refuse connections beyond N at once [default: 2048]
  --proxy=URI                   client: reach the bridge through an outgoing proxy,
                                socks5://[USER[:PASS]@]HOST:PORT, socks4a://HOST:PORT
                                or http://[USER[:PASS]@]HOST:PORT
  --ext-cookie-file=PATH        server: --dest is Tor's Extended ORPort; authenticate
                                with this cookie file and report each client.
  --record-dir=DIR              Save each connection's raw wire bytes in DIR
                                (for teaching and debugging only).
  --full                        unmask: print whole streams, not their first 512 bytes.
  --output-dir=DIR              unmask: also write the decrypted streams to DIR.
  --log-file=PATH               Write the log to PATH instead of stderr.
  --log-min-severity=LEVEL      error, warning, notice, info or debug [default: notice]
  --no-safe-logging             Show IP addresses in the log (scrubbed by default).
  -h --help                     Show this help.
  --version                     Show the version.

Examples:
  python3 obfsproxy.py demo --transport=obfs4
  python3 obfsproxy.py client --bridge="obfs4 192.0.2.1:443 FPR cert=... iat-mode=0" 127.0.0.1:2222
  python3 obfsproxy.py client --transport=obfs4 127.0.0.1:1050      (SOCKS; Tor sends cert=)
  python3 obfsproxy.py server --transport=obfs4 --state-dir=state --dest=127.0.0.1:9001 0.0.0.0:443
  curl --socks5 127.0.0.1:1050 --proxy-user "cert=...;iat-mode=0:" ...
"""

import dataclasses
import re
import signal
import sys
from pathlib import Path

try:
    from Crypto.Cipher import AES  # noqa: F401  (pycryptodome: checked here, used by the transports)
    from docopt import DocoptExit, docopt
except ImportError as _missing:
    if getattr(_missing, "name", None) not in ("docopt", "Crypto", "Crypto.Cipher"):
        raise  # an ImportError inside our own code is a bug, not a missing dependency
    sys.exit("obfsproxy.py: missing dependency (%s). Set up with: python3 -m venv .venv && "
             ".venv/bin/pip install -r requirements.txt, then run .venv/bin/python3 obfsproxy.py "
             "(offline: see the README's 'Without internet')." % _missing)

import outbound
import proxy
import socks
import transports

__version__ = "0.2.0"
log = proxy.log

# Each option that only one mode uses, and the modes that take it.
MODE_OPTIONS = {
    "--proxy": ("client", "managed"),
    "--bridge": ("client",),
    "--cert": ("client", "managed"),
    "--ext-cookie-file": ("server",),
    "--state-dir": ("server", "unmask"),
    "--full": ("unmask",),
    "--output-dir": ("unmask",),
    "--record-dir": ("client", "server", "managed", "demo"),
    "--dest": ("client", "server"),
}

# obfs2's and obfs4's own shorthands for --transport-options.
SHORTHANDS = {"--shared-secret": ("obfs2", "shared-secret"),
              "--ss-hash-iterations": ("obfs2", "ss-hash-iterations"),
              "--cert": ("obfs4", "cert"),
              "--iat-mode": ("obfs4", "iat-mode")}


class UsageError(ValueError):
    """A bad command line: one line on stderr, exit status 2."""


def mode_of(args):
    for mode in ("client", "server", "demo", "unmask", "detect"):
        if args[mode]:
            return mode
    return "managed"


def number(args, option, kind, low):
    text = args[option]
    try:
        value = kind(text)
    except ValueError:
        raise UsageError("%s: %r is not a %s" % (option, text, "whole number" if kind is int else "number"))
    if not value >= low:
        raise UsageError("%s must be at least %s" % (option, low))
    return value


def read_first_line(option, path):
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError("%s %s: %s" % (option, path, getattr(exc, "strerror", None) or exc))
    if not lines or not lines[0]:
        raise UsageError("%s %s: the first line is empty" % (option, path))
    return lines[0]


def parse_bridge_line(text):
    """'[Bridge] obfs4 192.0.2.1:443 [FINGERPRINT] k=v ...' ->
    (transport, (host, port), {k: v})."""
    words = text.split()
    if words and words[0].lower() == "bridge":
        words = words[1:]
    if len(words) < 2:
        raise UsageError("--bridge: expected \"TRANSPORT HOST:PORT [FINGERPRINT] [K=V ...]\"")
    name, address, rest = words[0], words[1], words[2:]
    if name not in transports.TRANSPORTS:
        raise UsageError("--bridge: unknown transport %r (have: %s)"
                         % (name, ", ".join(transports.TRANSPORTS)))
    try:
        dest = outbound.parse_address(address)
    except ValueError as exc:
        raise UsageError("--bridge: %s" % exc)
    if rest and re.fullmatch(r"[0-9A-Fa-f]{40}", rest[0]):
        rest = rest[1:]  # the fingerprint is Tor's business, not ours
    options = {}
    for word in rest:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise UsageError("--bridge: %r is not KEY=VALUE" % word)
        options[key] = value
    return name, dest, options


def options_by_transport(args):
    """{transport: {key: value}} from the shorthands (--cert is obfs4's,
    --shared-secret obfs2's ...) and --transport-options, which belong to
    --transport (obfs2 when not given)."""
    found = {}
    if args["--transport-options"]:
        try:
            parsed = socks.parse_args(args["--transport-options"])
        except ValueError as exc:
            raise UsageError("--transport-options: %s" % exc)
        found[args["--transport"] or "obfs2"] = dict(parsed)
    if args["--shared-secret-file"]:
        if args["--shared-secret"]:
            raise UsageError("give --shared-secret or --shared-secret-file, not both")
        args = dict(args, **{"--shared-secret": read_first_line("--shared-secret-file",
                                                                 args["--shared-secret-file"])})
    if args["--ss-hash-iterations"] is not None:
        number(args, "--ss-hash-iterations", int, 1)
    for option, (owner, key) in SHORTHANDS.items():
        if args[option] is not None:
            found.setdefault(owner, {})[key] = args[option]
    return found


def transport_options(args, name):
    """The options for ``name``; an option of another transport is refused, not ignored."""
    found = options_by_transport(args)
    options = found.pop(name, {})
    for option, (owner, _) in SHORTHANDS.items():
        if owner in found and args[option] is not None:
            raise UsageError("%s is an %s option (the transport is %s)" % (option, owner, name))
    return options


def check_modes(args, mode):
    for option, modes in MODE_OPTIONS.items():
        if args[option] not in (None, False) and mode not in modes:
            raise UsageError("%s is not used by %s (only by %s)" % (option, mode, ", ".join(modes)))


def base_settings(args):
    """(Settings common to every listener, max connections) from the command line."""
    timeout = number(args, "--handshake-timeout", float, 0.001)
    max_connections = number(args, "--max-connections", int, 1)
    if args["--log-min-severity"] not in proxy.SEVERITIES:
        raise UsageError("--log-min-severity must be one of %s" % ", ".join(proxy.SEVERITIES))
    if args["--proxy"]:
        try:
            outbound.parse_proxy_uri(args["--proxy"])
        except outbound.ProxyURIError as exc:
            raise UsageError("--proxy: %s" % exc)
    record = None
    if args["--record-dir"]:
        try:
            record = transports.RecordDir(args["--record-dir"])
        except OSError as exc:
            raise UsageError("--record-dir %s: %s" % (args["--record-dir"], exc.strerror or exc))
    settings = proxy.Settings(handshake_timeout=timeout, safe_logging=not args["--no-safe-logging"],
                              proxy=args["--proxy"], ext_cookie_file=args["--ext-cookie-file"],
                              record=record)
    return settings, max_connections


def setup_logging(args):
    try:
        proxy.setup_logging(args["--log-file"], args["--log-min-severity"])
    except OSError as exc:
        raise UsageError("--log-file %s: %s" % (args["--log-file"], exc.strerror or exc))


def run_external(args, mode):
    settings, max_connections = base_settings(args)
    name = args["--transport"] or "obfs2"
    dest = outbound.parse_address(args["--dest"]) if args["--dest"] else None
    options = {}
    if args["--bridge"]:
        if args["--transport"] or args["--dest"]:
            raise UsageError("--bridge sets the transport and the destination: drop --transport/--dest")
        name, dest, options = parse_bridge_line(args["--bridge"])
    cls = transports.transport_class(name)
    options.update(transport_options(args, name))
    announce = {}
    if mode == "server":
        try:
            config, announce = cls.server_config(options, Path(args["--state-dir"]) if args["--state-dir"]
                                                 else None)
        except (ValueError, OSError) as exc:
            raise UsageError("%s server: %s" % (name, exc))
        settings = dataclasses.replace(settings, transport=name, config=config, dest=dest)
        handler, default_listen = proxy.handle_server, None
    else:
        if dest is not None or options:  # check the defaults now, not at the first connection
            try:
                cls.client_config(options)
            except ValueError as exc:
                raise UsageError("%s client: %s" % (name, exc))
        settings = dataclasses.replace(settings, transport=name, options=options, dest=dest)
        handler = proxy.handle_fixed_client if dest else proxy.handle_socks_client
        default_listen = None if dest else "127.0.0.1:1050"
    listen_text = args["<listen>"] or default_listen
    if listen_text is None:
        raise UsageError("give the address to listen on, e.g. 127.0.0.1:2222")
    try:
        address = outbound.parse_address(listen_text, allow_port_zero=True)
    except ValueError as exc:
        raise UsageError(str(exc))
    setup_logging(args)
    proxy.prepare_for_serving(max_connections)
    if settings.record is not None:
        log.warning("--record-dir: saving the raw wire bytes of every connection in %s. "
                    "This stores traffic (obfs2 can be decrypted from it with `obfsproxy.py "
                    "unmask`): for teaching and debugging only.", settings.record.directory)
    server = proxy.Proxy(max_connections)
    try:
        bound = server.listen(address, handler, settings)
    except OSError as exc:
        log.error("cannot listen on %s: %s", listen_text, exc.strerror or exc)
        return 1
    if handler is proxy.handle_socks_client and not outbound.is_loopback(bound[0]):
        log.warning("the SOCKS port %s is reachable from other machines: anyone who "
                    "can reach it can use your tunnel. Bind to 127.0.0.1 unless you "
                    "mean it.", outbound.format_address(bound))
    log.log(proxy.NOTICE, "%s %s listening on %s%s", name, mode, outbound.format_address(bound),
            " (SOCKS4/4a/5)" if handler is proxy.handle_socks_client else
            " -> %s" % outbound.format_address(dest))
    if announce:
        log.log(proxy.NOTICE, "bridge line for clients: Bridge %s <IP ADDRESS>:%d <FINGERPRINT> %s",
                name, bound[1], " ".join("%s=%s" % item for item in sorted(announce.items())))
    proxy.install_signal_handlers(server)
    server.serve()
    log.log(proxy.NOTICE, "%s stopped", mode)
    return 0


def explain_usage(argv):
    """What docopt refused, in words, from the arguments alone."""
    words = [word for word in argv if not word.startswith("-")]
    if words[:1] == ["server"] and not any(word.startswith("--dest") for word in argv):
        return "server needs --dest=HOST:PORT (where the plain stream goes) and the address to listen on"
    known = re.findall(r"^\s+(-[-\w]+)", __doc__, re.MULTILINE)
    for word in argv:
        option = word.split("=", 1)[0]
        if word.startswith("-") and option not in known:
            return "unknown option %s" % option
    if not words or words[0] not in ("client", "server", "demo", "managed", "unmask", "detect"):
        return "expected a command: client, server, demo, managed, unmask or detect"
    return "bad command line (%s)" % " ".join(argv)[:200]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    # Printing commands end quietly when their reader goes away (`... | head`),
    # like any Unix tool; serving modes set SIGPIPE back to "ignore" below.
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        args = docopt(__doc__, argv=argv, version="obfsproxy.py " + __version__)
    except DocoptExit:
        print("obfsproxy.py: %s. Run `obfsproxy.py --help` for the usage." % explain_usage(argv),
              file=sys.stderr)
        return 2
    mode = mode_of(args)
    if mode not in ("unmask", "detect") and hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        check_modes(args, mode)
        if mode == "demo":
            import demo
            settings, _ = base_settings(args)
            name = args["--transport"] or "obfs2"
            return demo.main(name, transport_options(args, name), settings)
        if mode == "managed":
            import managed
            settings, max_connections = base_settings(args)
            return managed.main(settings, options_by_transport(args), max_connections,
                                args["--log-file"], args["--log-min-severity"])
        if mode in ("unmask", "detect"):
            import capture
            name = args["--transport"]
            options = transport_options(args, name or "obfs2")
            return capture.main(mode, args["<capture>"], options.get("shared-secret"),
                                int(options.get("ss-hash-iterations", 100000)),
                                full=args["--full"], output_dir=args["--output-dir"],
                                state_dir=args["--state-dir"])
        return run_external(args, mode)
    except (UsageError, ValueError) as exc:
        if mode == "managed":   # Tor reads only our stdout: tell it there
            print("ENV-ERROR bad command line: %s" % str(exc).replace("\n", " "), flush=True)
            return 1
        print("obfsproxy.py %s: %s" % (mode, exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
