r"""managed.py: obfsproxy as a Tor pluggable transport ("managed mode").

Tor starts ``obfsproxy.py managed`` itself, configures it through ``TOR_PT_*``
environment variables and reads its answers from stdout (pt-spec version 1)::

    Tor client --SOCKS5--> [managed client] ==obfs2==> [managed server] --> ORPort
       |  env: TOR_PT_CLIENT_TRANSPORTS,           env: TOR_PT_SERVER_TRANSPORTS,   or
       |       TOR_PT_PROXY ...                         TOR_PT_SERVER_BINDADDR ...  Extended
       +<- stdout: VERSION 1 / CMETHOD ...          stdout: VERSION 1 / SMETHOD ... ORPort

The conversation, in the order we speak it (one line each, flushed at once)::

    VERSION 1                       or VERSION-ERROR no-version, then exit
    ENV-ERROR <message>             a variable is missing or malformed; exit
    PROXY DONE | PROXY-ERROR <msg>  client, only when TOR_PT_PROXY is set
    CMETHOD <name> socks5 <addr>    or CMETHOD-ERROR <name> <message>, per transport
    CMETHODS DONE
    SMETHOD <name> <addr> [ARGS:k=v,...]   or SMETHOD-ERROR <name> <message>
    SMETHODS DONE

Nothing else may ever reach stdout: Tor would read it as a protocol line. So
``main`` takes the real stdout for itself first and points file descriptor 1
and ``sys.stdout`` at stderr; logs go to a file in the state directory.

Each transport comes from the registry (transports.py): what it accepts in
TOR_PT_SERVER_TRANSPORT_OPTIONS and what it announces in SMETHOD ARGS
(obfs4's cert=) are the transport's own ``server_config``.

Shutdown: SIGTERM stops at once; SIGINT stops accepting and lets live
connections finish (a second SIGINT stops at once); with
``TOR_PT_EXIT_ON_STDIN_CLOSE=1`` the end of stdin stops at once; so does the
death of the parent process (Tor), checked about once a second. A write to Tor
that fails (Tor closed its end of our stdout) ends only what goes to Tor
(``Announcer.broken``): whatever is logged then, those still stop the process.
"""

import errno
import ipaddress
import logging
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

import listener
import outbound
import pool
import process_setup
import proxy
import socks
import transports
from outbound import ProxyURIError, format_address, parse_address

log = proxy.log
NOTICE = proxy.NOTICE
# The values of every transport's secret options (obfs2's shared-secret), in a line to Tor.
_SECRET_NAMES = [re.escape(option) for cls in transports.TRANSPORTS.values()
                 for option in getattr(cls, "secret_options", ())]
SECRETS = re.compile(r"((?:^|[\s,:;])(?:%s)=)(?:\\.|[^,\s])*" % "|".join(_SECRET_NAMES or ["(?!)"]))

SUPPORTED_VERSIONS = ("1",)
LOG_FILE_NAME = "obfsproxy.log"

class EnvError(Exception):
    """Tor gave us a missing or malformed variable: ``ENV-ERROR``, then exit."""


# --- Talking to Tor on stdout ---------------------------------------------------

class Announcer:
    """Writes PT messages to Tor, one whole line per call, flushed at once.

    ``write`` takes one line of text (with its newline). Thread-safe, and
    never raises. Once a write fails (Tor closed its end of our stdout, or
    stopped reading it: ``write`` raises), Tor is gone for good: ``broken``
    is set, that is logged once to our own log, and every later line is
    dropped. The process carries on, so stdin's end or a signal can still
    stop it. Nothing is logged while the lock is held: a log line may come
    back here through TorLog, from this very thread.
    """

    def __init__(self, write):
        self._write = write
        self._lock = threading.Lock()
        self.configured = False      # True after the last *METHODS DONE
        self.errors = 0              # CMETHOD-ERROR and SMETHOD-ERROR lines said
        self.broken = False          # a write to Tor failed: nothing more is written

    def say(self, *words):
        method_error = bool(words) and words[0] in ("CMETHOD-ERROR", "SMETHOD-ERROR")
        self.errors += method_error
        # A value from the environment must not be able to start a new line.
        line = "".join(ch if ch.isprintable() else "?" for ch in " ".join(words))
        if words and words[0].endswith("-ERROR"):   # an error carries no secret value (ARGS may)
            line = SECRETS.sub(r"\1[scrubbed]", line)
        failure = None
        with self._lock:
            if not self.broken:
                try:
                    self._write(line + "\n")
                except (OSError, ValueError) as exc:
                    self.broken = True
                    failure = exc
        if failure is not None:
            log.warning("cannot write to Tor's stdout pipe (%s): no more lines go to Tor",
                        getattr(failure, "strerror", None) or failure, extra={"told_tor": True})
        if method_error:
            # Our log says why a transport is not listening, as Tor's log does
            # (TorLog does not send it back to Tor as a LOG line).
            log.warning("%s", line.partition(" ")[2].replace(" ", ": ", 1), extra={"told_tor": True})
        else:
            log.debug("to Tor: %s", SECRETS.sub(r"\1[scrubbed]", line))


# How long one line to Tor may wait for room in the pipe: Tor reads its
# transports' stdout at once, so a pipe full for this long means Tor is stuck
# or gone, and waiting longer would hold every thread that logs a failure.
WRITE_TIMEOUT = 5.0


def take_stdout():
    """An Announcer on the real stdout; everything else now goes to stderr.

    File descriptor 1 itself is redirected too, so not even a C library or a
    child process can print on Tor's channel.
    """
    try:
        fd = sys.stdout.fileno()
        private = os.dup(fd)
    except (AttributeError, OSError, ValueError):  # no real stdout (e.g. captured)
        stream = sys.stdout
        sys.stdout = sys.stderr

        def write_stream(line):
            stream.write(line)
            stream.flush()
        return Announcer(write_stream)
    sys.stdout.flush()
    try:
        err = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        err = os.open(os.devnull, os.O_WRONLY)
    os.dup2(err, fd)
    sys.stdout = sys.stderr

    if sys.platform != "win32":           # select() takes no pipe there: a plain blocking write
        os.set_blocking(private, False)   # see WRITE_TIMEOUT

    def write_fd(line):
        data = line.encode("utf-8", "replace")   # bytes: "\n", never "\r\n"
        end = None
        while data:
            try:
                data = data[os.write(private, data):]
            except BlockingIOError:
                now = time.monotonic()
                end = end or now + WRITE_TIMEOUT
                if now >= end or not outbound.ready(private, True, end - now):
                    raise OSError(errno.ETIMEDOUT, "Tor has not read its pipe for %.0f s"
                                  % WRITE_TIMEOUT)
    return Announcer(write_fd)


# --- Reading Tor's environment (no I/O) ------------------------------------------

def negotiate_version(env):
    """The first version of TOR_PT_MANAGED_TRANSPORT_VER we speak, or None."""
    offered = env.get("TOR_PT_MANAGED_TRANSPORT_VER")
    if offered is None:
        raise EnvError("TOR_PT_MANAGED_TRANSPORT_VER is not set (managed mode is for "
                       "Tor to start; by hand, use the client and server commands)")
    for version in offered.split(","):
        if version.strip() in SUPPORTED_VERSIONS:
            return version.strip()
    return None


def require(env, name):
    value = env.get(name)
    if value is None or not value.strip():
        raise EnvError("%s is not set" % name)
    return value.strip()


def parse_transports(text):
    """'obfs2,obfs4,*' -> (names we have, in order, no repeats; names we lack).

    ``*`` means every transport we have; unknown names are only reported back
    (pt-spec: they get no error line)."""
    names = []
    for name in text.split(","):
        name = name.strip()
        names.extend(transports.TRANSPORTS if name == "*" else [name] if name else [])
    known, unknown = [], []
    for name in names:
        target = known if name in transports.TRANSPORTS else unknown
        if name not in target:
            target.append(name)
    return known, unknown


def parse_bindaddrs(text):
    """'obfs2-0.0.0.0:1051,dummy-[::1]:0' -> {'obfs2': ('0.0.0.0', 1051), ...}."""
    result = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, address = item.partition("-")
        if not sep or not name:
            raise EnvError("TOR_PT_SERVER_BINDADDR: %r is not NAME-ADDRESS:PORT" % item)
        try:
            result.setdefault(name, parse_address(address, allow_port_zero=True))
        except ValueError as exc:
            raise EnvError("TOR_PT_SERVER_BINDADDR: %s" % exc)
    return result


def parse_transport_options(text):
    """TOR_PT_SERVER_TRANSPORT_OPTIONS -> {transport: {key: value}}.

    Format (pt-spec 3.2.3): ``name:key=value`` items joined by ``;``, where a
    backslash escapes ``:``, ``;``, ``=`` and ``\\``. Example:
    ``obfs2:shared-secret=a\\;b`` -> {'obfs2': {'shared-secret': 'a;b'}}.

    An error says where (item number, character), never the item: its value
    may be a secret, and ENV-ERROR lands in Tor's log.
    """
    options = {}
    try:
        start = 0                  # where the next item begins in ``text``, from 0
        for number, item in enumerate(socks.split_escaped(text, ";"), 1):
            here, start = start + 1, start + len(item) + 1
            if not item:
                continue
            name, *rest = socks.split_escaped(item, ":")
            pair = ":".join(rest)
            key, *value = socks.split_escaped(pair, "=")
            if not rest or not name or not value or not key:
                raise ValueError("item %d (from character %d) is not TRANSPORT:KEY=VALUE"
                                 % (number, here))
            value = socks.unescape("=".join(value))
            options.setdefault(socks.unescape(name), {})[socks.unescape(key)] = value
    except ValueError as exc:
        raise EnvError("TOR_PT_SERVER_TRANSPORT_OPTIONS: %s" % exc)
    return options


def escape_arg(text):
    """Escape a key or value for SMETHOD ARGS: ``\\``, ``=`` and ``,``."""
    return re.sub(r"([\\=,])", r"\\\1", text)


# --- Managed mode ------------------------------------------------------------------

def main(base, cli_options, max_connections, log_file=None, severity="notice"):
    """``obfsproxy.py managed``: configure from the environment, answer Tor on
    stdout, serve until told to stop. Returns the exit status.

    ``base``: the command line's Settings (timeouts, logging, recording);
    ``cli_options``: {transport: {key: value}} from its transport options,
    defaults under what Tor gives (SOCKS arguments, server options)."""
    tor = take_stdout()
    try:
        return run(base, cli_options, max_connections, log_file, severity, os.environ, tor)
    except Exception as exc:  # a bug: the traceback goes to the log, never to stdout
        log.error("managed mode failed", exc_info=True)
        if not tor.configured:
            tor.say("ENV-ERROR", "internal error: %s" % exc)
        return 1


def run(base, cli_options, max_connections, log_file, severity, env, tor):
    try:
        version = negotiate_version(env)
    except EnvError as exc:
        tor.say("ENV-ERROR", str(exc))
        return 1
    if version is None:
        tor.say("VERSION-ERROR", "no-version")
        return 1
    tor.say("VERSION", version)

    # Everything is checked before anything is bound or announced.
    try:
        state_dir = make_state_dir(env)
        start_logging(log_file or state_dir / LOG_FILE_NAME, severity, tor)
        base = base.replace(sources=outbound_sources(env))
        clients = client_env(env, base)
        servers = server_env(env)
        try:
            pool_size = pool.configured_size(env)
        except ValueError as exc:
            raise EnvError(str(exc))
        if clients is None and servers is None:
            raise EnvError("neither TOR_PT_CLIENT_TRANSPORTS nor TOR_PT_SERVER_TRANSPORTS is set")
    except ProxyURIError as exc:
        tor.say("PROXY-ERROR", str(exc))
        return 1
    except EnvError as exc:
        tor.say("ENV-ERROR", str(exc))
        return 1
    log.log(NOTICE, "obfsproxy.py in managed mode (pt-spec %s), state in %s", version, state_dir)
    started = sys.argv[0]
    if started and not os.path.isabs(started) and os.path.abspath(started) in (
            proxy.HERE, os.path.join(proxy.HERE, "obfsproxy.py")):
        # Tor may start us from another folder (the service's is /): there a relative
        # path fails before we can say a word, and Tor logs only "terminated with status
        # code 1".
        log.warning("started by a relative path (%s, from %s): write absolute paths in the torrc line, "
                    "which works from any folder", started, os.getcwd())
    process_setup.prepare_for_serving(max_connections)
    proxy.log_routes(sorted(set((clients or [[]])[0]) | set((servers or [[]])[0])))
    if base.wrappers:
        log.warning("--record-dir: saving the raw wire bytes of every connection "
                    "(for teaching and debugging only)")

    parent_gone = parent_watcher()

    def tick():
        if parent_gone is not None and parent_gone():
            log.log(NOTICE, "our parent process (Tor) is gone; exiting")
            server.stop()

    server = listener.Listener(max_connections, tick=tick, pool_size=pool_size)
    # Handlers first: Tor may signal as soon as it has read our last line.
    process_setup.install_signal_handlers(server)
    if env.get("TOR_PT_EXIT_ON_STDIN_CLOSE") == "1":
        threading.Thread(target=watch_stdin, args=(server,), name="stdin", daemon=True).start()
    try:
        if clients is not None:
            start_clients(server, tor, base, cli_options, *clients)
        if servers is not None:
            start_servers(server, tor, base, cli_options, state_dir, *servers)
    except BaseException:
        for sock, _, _ in server.listeners:
            sock.close()
        raise
    finally:
        tor.configured = True
    if not server.listeners:
        # Nothing asked for that we have: a clean exit. Everything asked for
        # failed (each with its *METHOD-ERROR line): a failure, as obfs4proxy.
        failed = tor.errors > 0
        log.log(NOTICE, "no transport is listening; exiting")
        return 1 if failed else 0
    server.serve()
    log.log(NOTICE, "managed mode stopped")
    return 0


def make_state_dir(env):
    state_dir = Path(require(env, "TOR_PT_STATE_LOCATION"))
    try:
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvError("cannot create TOR_PT_STATE_LOCATION %s: %s" % (state_dir, exc.strerror or exc))
    return state_dir


def start_logging(log_file, severity, tor):
    """Our log file (owner-only), and what is said at NOTICE or above also in
    Tor's own log, as pt-spec LOG lines: a failure shows where the user looks."""
    try:
        proxy.setup_logging(log_file, severity)
    except OSError as exc:
        raise EnvError("cannot open the log file %s: %s" % (log_file, exc.strerror or exc))
    logging.getLogger().addHandler(TorLog(tor))


class TorLog(logging.Handler):
    """A failure the user can act on (a warning or error, or a connection's
    failure said at NOTICE: ``Listener.complain``), also as ``LOG
    SEVERITY=notice MESSAGE="..."`` on stdout (pt-spec 3.3.4; the message is a
    quoted string, ``\\`` and ``\"`` escaped). Startup lines stay in our log.
    A secret option's value (``secret_options``) is scrubbed here too, in case a
    message quotes one: our messages do not, by rule."""

    TOR_SEVERITIES = ((logging.ERROR, "error"), (logging.WARNING, "warning"), (NOTICE, "notice"))

    def __init__(self, tor):
        logging.Handler.__init__(self, NOTICE)
        self.tor = tor

    def emit(self, record):
        if record.levelno < logging.WARNING and not getattr(record, "failure", False):
            return
        if getattr(record, "told_tor", False) or self.tor.broken:   # said already, or no Tor
            return
        try:
            text = SECRETS.sub(r"\1[scrubbed]", record.getMessage())
        except Exception:   # a malformed record: never let logging fail a connection
            return
        name = next(name for level, name in self.TOR_SEVERITIES if record.levelno >= level)
        quoted = text.replace("\\", "\\\\").replace('"', '\\"')
        self.tor.say("LOG", "SEVERITY=%s" % name, 'MESSAGE="%s"' % quoted)


def outbound_sources(env):
    """TOR_PT_OUTBOUND_BIND_ADDRESS_V4 / _V6: the source address for outgoing
    connections of each family ({socket.AF_INET: "192.0.2.7"}), or None.
    outbound.connect leaves loopback destinations alone, as Tor does."""
    sources = {}
    for name, family, version in (("TOR_PT_OUTBOUND_BIND_ADDRESS_V4", socket.AF_INET, 4),
                                  ("TOR_PT_OUTBOUND_BIND_ADDRESS_V6", socket.AF_INET6, 6)):
        text = env.get(name, "").strip()
        if not text:
            continue
        if version == 6 and text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            address = None
        if address is None or address.version != version:
            raise EnvError("%s: %r is not an IPv%d address" % (name, text, version))
        sources[family] = str(address)
    return sources or None


def requested_transports(env, role):
    """The transports Tor asks of us as ``role`` ("client" or "server"), or
    None when it asks for none. Names we do not have are ignored (pt-spec)."""
    text = env.get("TOR_PT_%s_TRANSPORTS" % role.upper())
    if text is None:
        return None
    known, unknown = parse_transports(text)
    if unknown:
        log.info("ignoring %s transport(s) we do not have: %s", role, ", ".join(unknown))
    return known


def client_env(env, base):
    """(transports, proxy URI or None, whether Tor asked for it), or None when
    we are not a client. Tor's TOR_PT_PROXY wins over --proxy."""
    known = requested_transports(env, "client")
    if known is None:
        return None
    from_tor = env.get("TOR_PT_PROXY") or None
    proxy_uri = from_tor or base.outgoing_proxy
    if proxy_uri is not None:
        outbound.parse_proxy_uri(proxy_uri)  # raises ProxyURIError: PROXY-ERROR before any CMETHOD
    return known, proxy_uri, from_tor is not None


def server_env(env):
    """(transports, bind addresses, options, destination, cookie file or None),
    or None when we are not a server."""
    known = requested_transports(env, "server")
    if known is None:
        return None
    bindaddrs = parse_bindaddrs(require(env, "TOR_PT_SERVER_BINDADDR"))
    options = parse_transport_options(env.get("TOR_PT_SERVER_TRANSPORT_OPTIONS", ""))
    # An empty TOR_PT_EXTENDED_SERVER_PORT means "no Extended ORPort": use the ORPort.
    extended = env.get("TOR_PT_EXTENDED_SERVER_PORT", "").strip()
    cookie_file = None
    try:
        if extended:
            destination = parse_address(extended)
            cookie_file = require(env, "TOR_PT_AUTH_COOKIE_FILE")
            try:
                outbound.read_cookie(cookie_file)
            except OSError as exc:
                raise EnvError("TOR_PT_AUTH_COOKIE_FILE: %s" % (exc.strerror or exc))
        else:
            destination = parse_address(require(env, "TOR_PT_ORPORT"))
    except ValueError as exc:
        raise EnvError("TOR_PT_%s: %s" % ("EXTENDED_SERVER_PORT" if extended else "ORPORT", exc))
    return known, bindaddrs, options, destination, cookie_file


def start_clients(server, tor, base, cli_options, names, proxy_uri, tor_asked_for_proxy):
    if tor_asked_for_proxy:
        tor.say("PROXY DONE")
    for name in names:
        # The command line's transport options are the defaults; a Bridge
        # line's arguments (SOCKS arguments, per connection) override them.
        settings = base.replace(transport=name, options=cli_options.get(name, {}),
                                outgoing_proxy=proxy_uri)
        try:
            bound = server.listen(("127.0.0.1", 0), proxy.handle_socks_client, settings)
        except OSError as exc:
            tor.say("CMETHOD-ERROR", name, "cannot listen: %s" % (exc.strerror or exc))
            continue
        address = format_address(bound)
        log.log(NOTICE, "%s client listening on %s (SOCKS4/4a/5)%s", name, address,
                " via a %s proxy" % outbound.parse_proxy_uri(proxy_uri).scheme if proxy_uri else "")
        tor.say("CMETHOD", name, "socks5", address)
    tor.say("CMETHODS DONE")


def start_servers(server, tor, base, cli_options, state_dir, names, bindaddrs, options,
                  destination, cookie_file):
    for name in names:
        if name not in bindaddrs:
            tor.say("SMETHOD-ERROR", name, "no address for it in TOR_PT_SERVER_BINDADDR")
            continue
        # Tor's options win over the command line's.
        ours = dict(cli_options.get(name, {}), **options.get(name, {}))
        cls = transports.TRANSPORTS[name]
        try:
            config, announce = cls.server_config(ours, state_dir)
        except (ValueError, OSError) as exc:
            tor.say("SMETHOD-ERROR", name, str(exc))
            continue
        # ARGS reach clients through the bridge's descriptor: each must stay one word.
        bad = [key for key, value in announce.items()
               if not value or any(c.isspace() or not c.isprintable() for c in value)]
        if bad:
            tor.say("SMETHOD-ERROR", name, "%s must be non-empty, printable, no spaces" % bad[0])
            continue
        settings = base.replace(transport=name, config=config, dest=destination,
                                ext_cookie_file=cookie_file)
        try:
            bound = server.listen(bindaddrs[name], proxy.handle_server, settings)
        except OSError as exc:
            tor.say("SMETHOD-ERROR", name, "cannot listen on %s: %s"
                    % (format_address(bindaddrs[name]), exc.strerror or exc))
            continue
        log.log(NOTICE, "%s server listening on %s -> %s%s", name, format_address(bound),
                format_address(destination), " (Extended ORPort)" if cookie_file else "")
        for note in getattr(config, "notes", ()):
            log.log(getattr(note, "level", NOTICE), "%s: %s", name, note)
        # What Tor publishes: the listener, unless the transport names its public
        # address (webtunnel: a synthetic one; clients dial the host of its url=).
        public = getattr(cls, "public_address", None)
        address = format_address(public(config, bound) if public else bound)
        tor.say("SMETHOD", name, address, "ARGS:" + ",".join(
            "%s=%s" % (escape_arg(key), escape_arg(value)) for key, value in sorted(announce.items())))
    tor.say("SMETHODS DONE")


# --- Lifecycle: stdin and parent death -----------------------------------------------

def watch_stdin(server):
    """TOR_PT_EXIT_ON_STDIN_CLOSE=1: Tor closes our stdin to tell us to exit.

    Reads file descriptor 0 directly (not ``sys.stdin``, whose buffer lock
    would block interpreter shutdown while this thread waits)."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    log.log(NOTICE, "stdin closed: exiting")
    server.stop()


def parent_watcher():
    """A function that returns True once our parent process has died, or None
    when this platform gives us no way to tell."""
    if sys.platform == "win32":
        try:
            import ctypes
            kernel32 = ctypes.windll.kernel32
            synchronize, wait_object_0 = 0x00100000, 0
            handle = kernel32.OpenProcess(synchronize, False, os.getppid())
        except (AttributeError, OSError):
            return None
        if not handle:
            return None
        return lambda: kernel32.WaitForSingleObject(handle, 0) == wait_object_0
    # POSIX: an orphan is adopted by init (or a subreaper), so its parent id changes.
    parent = os.getppid()
    if parent <= 1:
        return None
    return lambda: os.getppid() != parent
