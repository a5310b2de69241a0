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

This module also holds the two network pieces that only Tor setups need:

* ``connect_via_proxy``: the client's outgoing proxy (``TOR_PT_PROXY`` or
  ``--proxy``): SOCKS5 (RFC 1928, user/password RFC 1929), SOCKS4a, HTTP CONNECT.
* ``ext_orport_handshake``: the server's Extended ORPort client (SAFE_COOKIE
  authentication, then USERADDR, TRANSPORT, DONE), so that the bridge can count
  its users per country and transport.

Shutdown: SIGTERM stops at once; SIGINT stops accepting and lets live
connections finish (a second SIGINT stops at once); with
``TOR_PT_EXIT_ON_STDIN_CLOSE=1`` the end of stdin stops at once; so does the
death of the parent process (Tor), checked about once a second.
"""

import base64
import collections
import errno
import hashlib
import hmac
import ipaddress
import os
import re
import socket
import struct
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

import obfsproxy

log = obfsproxy.log
NOTICE = obfsproxy.NOTICE

SUPPORTED_VERSIONS = ("1",)
LOG_FILE_NAME = "obfsproxy.log"

# Server options each transport accepts in TOR_PT_SERVER_TRANSPORT_OPTIONS.
SERVER_OPTIONS = {"obfs2": {"shared-secret"}, "dummy": set()}


class EnvError(Exception):
    """Tor gave us a missing or malformed variable: ``ENV-ERROR``, then exit."""


class ProxyURIError(ValueError):
    """TOR_PT_PROXY is unusable: ``PROXY-ERROR``, then exit."""


class ProxyError(OSError):
    """The outgoing proxy could not be reached or refused the request.

    An OSError, so the SOCKS client handler turns it into a SOCKS failure
    reply (general failure) and closes the connection.
    """


class ExtORPortError(OSError):
    """The Extended ORPort handshake failed (bad cookie, wrong server hash,
    authentication refused, DENY). The connection is closed; the connection
    handler logs one line."""


# --- Talking to Tor on stdout ---------------------------------------------------

class Announcer:
    """Writes PT messages to Tor, one whole line per call, flushed at once.

    ``write`` takes one line of text (with its newline). Thread-safe, and
    never raises: if Tor stopped listening, the line is only logged.
    """

    def __init__(self, write):
        self._write = write
        self._lock = threading.Lock()
        self.configured = False      # True after the last *METHODS DONE

    def say(self, *words):
        # A value from the environment must not be able to start a new line.
        line = "".join(ch if ch.isprintable() else "?" for ch in " ".join(words))
        with self._lock:
            try:
                self._write(line + "\n")
            except (OSError, ValueError) as exc:
                log.warning("cannot write to Tor's stdout pipe: %s", exc)
        log.debug("to Tor: %s", re.sub(r"(shared-secret=)[^,\s]+", r"\1[scrubbed]", line))


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

    def write_fd(line):
        data = line.encode("utf-8", "replace")   # bytes: "\n", never "\r\n"
        while data:
            data = data[os.write(private, data):]
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
        names.extend(obfsproxy.TRANSPORTS if name == "*" else [name] if name else [])
    known, unknown = [], []
    for name in names:
        target = known if name in obfsproxy.TRANSPORTS else unknown
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
            result.setdefault(name, obfsproxy.parse_address(address, allow_port_zero=True))
        except ValueError as exc:
            raise EnvError("TOR_PT_SERVER_BINDADDR: %s" % exc)
    return result


def _split_escaped(text, separator):
    """Split at each ``separator`` not escaped by a backslash. The parts keep
    their escapes, so joining them with ``separator`` gives ``text`` back."""
    parts, current, i = [], [], 0
    while i < len(text):
        if text[i] == "\\":
            if i + 1 == len(text):
                raise ValueError("%r ends in a lone backslash" % text)
            current.append(text[i:i + 2])
            i += 2
            continue
        if text[i] == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(text[i])
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(text):
    return re.sub(r"\\(.)", r"\1", text, flags=re.DOTALL)


def parse_transport_options(text):
    """TOR_PT_SERVER_TRANSPORT_OPTIONS -> {transport: {key: value}}.

    Format (pt-spec 3.2.3): ``name:key=value`` items joined by ``;``, where a
    backslash escapes ``:``, ``;``, ``=`` and ``\\``. Example:
    ``obfs2:shared-secret=a\\;b`` -> {'obfs2': {'shared-secret': 'a;b'}}.
    """
    options = {}
    try:
        for item in _split_escaped(text, ";"):
            if not item:
                continue
            name, *rest = _split_escaped(item, ":")
            pair = ":".join(rest)
            key, *value = _split_escaped(pair, "=")
            if not rest or not name or not value or not key:
                raise ValueError("%r is not TRANSPORT:KEY=VALUE" % item)
            options.setdefault(_unescape(name), {})[_unescape(key)] = _unescape("=".join(value))
    except ValueError as exc:
        raise EnvError("TOR_PT_SERVER_TRANSPORT_OPTIONS: %s" % exc)
    return options


def escape_arg(text):
    """Escape a key or value for SMETHOD ARGS: ``\\``, ``=`` and ``,``."""
    return re.sub(r"([\\=,])", r"\\\1", text)


ProxyURI = collections.namedtuple("ProxyURI", "scheme host port username password")


def parse_proxy_uri(text):
    """'socks5://user:pass@127.0.0.1:1080' -> ProxyURI; ProxyURIError says why not.

    Types (pt-spec 3.2.2): socks5 (optional RFC 1929 user and password),
    socks4a (optional user id, no password), http (CONNECT, optional basic
    auth). User and password are percent-decoded.
    """
    try:
        parts = urlsplit(text)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ProxyURIError("%r is not a proxy URI: %s" % (text, exc))
    scheme = parts.scheme.lower()
    if scheme not in ("socks5", "socks4a", "http"):
        raise ProxyURIError("unsupported proxy type %r (socks5, socks4a or http)" % parts.scheme)
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ProxyURIError("a proxy URI has only TYPE://[USER[:PASS]@]HOST:PORT")
    if not host or not port:
        raise ProxyURIError("the proxy URI needs a host and a port")
    username = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    if scheme == "socks4a" and password is not None:
        raise ProxyURIError("socks4a has a user id but no password")
    if scheme == "socks5" and username is not None:
        if not 1 <= len(username.encode()) <= 255 or len((password or "").encode()) > 255:
            raise ProxyURIError("SOCKS5 user and password must be 1-255 and 0-255 bytes")
    return ProxyURI(scheme, host, port, username, password)


# --- Managed mode ------------------------------------------------------------------

def main(args):
    """``obfsproxy.py managed``: configure from the environment, answer Tor on
    stdout, serve until told to stop. Returns the exit status."""
    tor = take_stdout()
    try:
        return run(args, os.environ, tor)
    except Exception as exc:  # a bug: the traceback goes to the log, never to stdout
        log.error("managed mode failed", exc_info=True)
        if not tor.configured:
            tor.say("ENV-ERROR", "internal error: %s" % exc)
        return 1


def run(args, env, tor):
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
        base, max_connections = obfsproxy.settings_from_args(args)
        state_dir = Path(require(env, "TOR_PT_STATE_LOCATION"))
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise EnvError("cannot create TOR_PT_STATE_LOCATION %s: %s"
                           % (state_dir, exc.strerror or exc))
        log_file = args["--log-file"] or state_dir / LOG_FILE_NAME
        try:
            obfsproxy.setup_logging(log_file, args["--log-min-severity"])
        except OSError as exc:
            raise EnvError("cannot open the log file %s: %s" % (log_file, exc.strerror or exc))
        base.sources = outbound_sources(env)
        clients = client_config(env, base)
        servers = server_config(env)
        if clients is None and servers is None:
            raise EnvError("neither TOR_PT_CLIENT_TRANSPORTS nor TOR_PT_SERVER_TRANSPORTS is set")
    except (EnvError, ValueError) as exc:  # ValueError: a bad command-line option
        if isinstance(exc, ProxyURIError):
            tor.say("PROXY-ERROR", str(exc))
        else:
            tor.say("ENV-ERROR", str(exc))
        return 1
    log.log(NOTICE, "obfsproxy.py %s in managed mode (pt-spec %s), state in %s",
            obfsproxy.__version__, version, state_dir)
    obfsproxy.prepare_for_serving(base, max_connections)

    proxy = obfsproxy.Proxy(max_connections)
    # Handlers first: Tor may signal as soon as it has read our last line.
    obfsproxy.install_signal_handlers(proxy)
    if env.get("TOR_PT_EXIT_ON_STDIN_CLOSE") == "1":
        threading.Thread(target=watch_stdin, args=(proxy,), name="stdin", daemon=True).start()
    parent_gone = parent_watcher()
    if parent_gone is not None:
        def tick():
            if parent_gone():
                log.log(NOTICE, "our parent process (Tor) is gone; exiting")
                proxy.stop()
        proxy.tick = tick

    try:
        if clients is not None:
            start_clients(proxy, tor, base, *clients)
        if servers is not None:
            start_servers(proxy, tor, base, *servers)
    except BaseException:
        for sock, _, _ in proxy.listeners:
            sock.close()
        raise
    finally:
        tor.configured = True
    if not proxy.listeners:
        log.log(NOTICE, "no transport is listening; exiting")
        return 0
    proxy.serve()
    log.log(NOTICE, "managed mode stopped")
    return 0


def outbound_sources(env):
    """TOR_PT_OUTBOUND_BIND_ADDRESS_V4 / _V6: the source address for outgoing
    connections of each family ({socket.AF_INET: "192.0.2.7"}), or None.
    obfsproxy.connect leaves loopback destinations alone, as Tor does."""
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


def client_config(env, base):
    """(transports, proxy URI or None, whether Tor asked for it), or None when
    we are not a client. Tor's TOR_PT_PROXY wins over --proxy."""
    known = requested_transports(env, "client")
    if known is None:
        return None
    from_tor = env.get("TOR_PT_PROXY") or None
    proxy_uri = from_tor or base.proxy
    if proxy_uri is not None:
        parse_proxy_uri(proxy_uri)  # raises ProxyURIError: PROXY-ERROR before any CMETHOD
    return known, proxy_uri, from_tor is not None


def server_config(env):
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
            destination = obfsproxy.parse_address(extended)
            cookie_file = require(env, "TOR_PT_AUTH_COOKIE_FILE")
            try:
                read_cookie(cookie_file)
            except OSError as exc:
                raise EnvError("TOR_PT_AUTH_COOKIE_FILE: %s" % (exc.strerror or exc))
        else:
            destination = obfsproxy.parse_address(require(env, "TOR_PT_ORPORT"))
    except ValueError as exc:
        raise EnvError("TOR_PT_%s: %s" % ("EXTENDED_SERVER_PORT" if extended else "ORPORT", exc))
    return known, bindaddrs, options, destination, cookie_file


def transport_settings(base, name, **changes):
    """The command line's Settings (timeouts, hash iterations, logging,
    recording) for one transport; the rest comes from Tor."""
    settings = obfsproxy.Settings(
        transport=name, shared_secret=None, hash_iterations=base.hash_iterations,
        handshake_timeout=base.handshake_timeout, safe_logging=base.safe_logging,
        record_dir=base.record_dir, sources=base.sources)
    for key, value in changes.items():
        setattr(settings, key, value)
    return settings


def start_clients(proxy, tor, base, names, proxy_uri, tor_asked_for_proxy):
    if tor_asked_for_proxy:
        tor.say("PROXY DONE")
    for name in names:
        # A --shared-secret on the command line is the default; a Bridge
        # line's shared-secret=... (SOCKS arguments) overrides it.
        settings = transport_settings(base, name, proxy=proxy_uri, shared_secret=base.shared_secret)
        try:
            bound = proxy.listen(("127.0.0.1", 0), obfsproxy.handle_socks_client, settings)
        except OSError as exc:
            tor.say("CMETHOD-ERROR", name, "cannot listen: %s" % (exc.strerror or exc))
            continue
        address = obfsproxy.format_address(bound)
        log.log(NOTICE, "%s client listening on %s (SOCKS4/4a/5)%s", name, address,
                " via a %s proxy" % urlsplit(proxy_uri).scheme if proxy_uri else "")
        tor.say("CMETHOD", name, "socks5", address)
    tor.say("CMETHODS DONE")


def start_servers(proxy, tor, base, names, bindaddrs, options, destination, cookie_file):
    for name in names:
        if name not in bindaddrs:
            tor.say("SMETHOD-ERROR", name, "no address for it in TOR_PT_SERVER_BINDADDR")
            continue
        ours = options.get(name, {})
        unknown = sorted(set(ours) - SERVER_OPTIONS[name])
        if unknown:
            tor.say("SMETHOD-ERROR", name, "unknown option(s) %s" % ",".join(unknown))
            continue
        secret = ours.get("shared-secret", base.shared_secret if name == "obfs2" else None)
        # The client needs the secret in its Bridge line: announce it as ARGS
        # (Tor puts them in the bridge's descriptor), which must stay one word.
        if secret is not None and (not secret or any(c.isspace() or not c.isprintable()
                                                     for c in secret)):
            tor.say("SMETHOD-ERROR", name, "shared-secret must be non-empty, printable, no spaces")
            continue
        settings = transport_settings(base, name, shared_secret=secret, dest=destination,
                                      ext_cookie_file=cookie_file)
        try:
            bound = proxy.listen(bindaddrs[name], obfsproxy.handle_server, settings)
        except OSError as exc:
            tor.say("SMETHOD-ERROR", name, "cannot listen on %s: %s"
                    % (obfsproxy.format_address(bindaddrs[name]), exc.strerror or exc))
            continue
        address = obfsproxy.format_address(bound)
        log.log(NOTICE, "%s server listening on %s -> %s%s", name, address,
                obfsproxy.format_address(destination), " (Extended ORPort)" if cookie_file else "")
        words = ["SMETHOD", name, address]
        if secret is not None:
            words.append("ARGS:shared-secret=" + escape_arg(secret))
        tor.say(*words)
    tor.say("SMETHODS DONE")


# --- Lifecycle: stdin and parent death -----------------------------------------------

def watch_stdin(proxy):
    """TOR_PT_EXIT_ON_STDIN_CLOSE=1: Tor closes our stdin to tell us to exit.

    Reads file descriptor 0 directly (not ``sys.stdin``, whose buffer lock
    would block interpreter shutdown while this thread waits)."""
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    log.log(NOTICE, "stdin closed: exiting")
    proxy.stop()


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


# --- Outgoing proxies (client side) --------------------------------------------------

def _recv_exact(sock, n, deadline, error=ProxyError):
    data = b""
    while len(data) < n:
        sock.settimeout(deadline.remaining())
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise error("the connection closed in the middle of the handshake")
        data += chunk
    return data


def connect_via_proxy(proxy_uri, address, deadline, sources=None):
    """A socket connected to ``address`` (host, port) through the outgoing proxy.

    Never connects directly. Failures are OSErrors that the SOCKS handler maps
    to reply codes: ConnectionRefusedError (the proxy says refused),
    socket.timeout (deadline), OSError with ENETUNREACH/EHOSTUNREACH, and
    ProxyError for everything else.
    """
    try:
        proxy = parse_proxy_uri(proxy_uri)
    except ProxyURIError as exc:
        raise ProxyError("bad outgoing proxy: %s" % exc)
    try:
        sock = obfsproxy.connect((proxy.host, proxy.port), deadline.remaining(), sources)
    except socket.timeout:
        raise
    except OSError as exc:
        raise ProxyError("cannot reach the %s proxy: %s" % (proxy.scheme, exc.strerror or exc))
    try:
        _HANDSHAKES[proxy.scheme](sock, proxy, address, deadline)
    except BaseException:
        sock.close()
        raise
    return sock


# SOCKS5 reply codes (RFC 1928 section 6) -> the error we raise.
_SOCKS5_FAILURES = {
    0x03: lambda: OSError(errno.ENETUNREACH, "the proxy says: network unreachable"),
    0x04: lambda: OSError(errno.EHOSTUNREACH, "the proxy says: host unreachable"),
    0x05: lambda: ConnectionRefusedError(errno.ECONNREFUSED, "the proxy says: connection refused"),
    0x06: lambda: socket.timeout("the proxy says: TTL expired"),
}


def _socks5(sock, proxy, address, deadline):
    host, port = address
    # Greeting: VER=05 NMETHODS METHODS; offer username/password (02) only with a user.
    methods = b"\x00\x02" if proxy.username is not None else b"\x00"
    obfsproxy.send_all(sock, b"\x05" + bytes([len(methods)]) + methods, deadline)
    version, method = _recv_exact(sock, 2, deadline)
    if version != 5:
        raise ProxyError("the proxy does not speak SOCKS5")
    if method == 0x02 and proxy.username is not None:
        # RFC 1929: VER=01 ULEN UNAME PLEN PASSWD -> VER=01 STATUS (00 = success)
        user, password = proxy.username.encode(), (proxy.password or "").encode()
        obfsproxy.send_all(sock, b"\x01" + bytes([len(user)]) + user
                           + bytes([len(password)]) + password, deadline)
        if _recv_exact(sock, 2, deadline)[1] != 0:
            raise ProxyError("the SOCKS5 proxy rejected our username and password")
    elif method != 0x00:
        raise ProxyError("the SOCKS5 proxy accepts none of our authentication methods")
    # Request: VER=05 CMD=01 RSV=00 ATYP DST.ADDR DST.PORT (socks.py's layout, client side)
    try:
        ip = ipaddress.ip_address(host)
        dst = (b"\x01" if ip.version == 4 else b"\x04") + ip.packed
    except ValueError:
        dst = b"\x03" + bytes([len(host.encode())]) + host.encode()
    obfsproxy.send_all(sock, b"\x05\x01\x00" + dst + struct.pack("!H", port), deadline)
    # Reply: VER REP RSV ATYP BND.ADDR BND.PORT; read exactly it, so no relayed byte is lost.
    version, reply, _, atyp = _recv_exact(sock, 4, deadline)
    if reply != 0:
        make = _SOCKS5_FAILURES.get(reply)
        raise make() if make else ProxyError("the SOCKS5 proxy failed (reply 0x%02x)" % reply)
    if atyp == 3:
        length = _recv_exact(sock, 1, deadline)[0]
    elif atyp in (1, 4):
        length = 4 if atyp == 1 else 16
    else:
        raise ProxyError("the SOCKS5 proxy sent address type %d" % atyp)
    _recv_exact(sock, length + 2, deadline)


def _socks4a(sock, proxy, address, deadline):
    host, port = address
    # VN=04 CD=01 DSTPORT DSTIP USERID 00, and for SOCKS4a DSTIP=0.0.0.1 and HOST 00 after.
    userid = (proxy.username or "").encode()
    try:
        request = struct.pack("!BBH", 4, 1, port) + ipaddress.IPv4Address(host).packed + userid + b"\0"
    except ValueError:
        request = struct.pack("!BBH", 4, 1, port) + b"\0\0\0\1" + userid + b"\0" + host.encode() + b"\0"
    obfsproxy.send_all(sock, request, deadline)
    # Reply: VN=00 CD DSTPORT(2) DSTIP(4); CD=5A granted, anything else refused.
    reply = _recv_exact(sock, 8, deadline)
    if reply[1] != 0x5A:
        raise ProxyError("the SOCKS4a proxy rejected the request (0x%02x)" % reply[1])


def _http_connect(sock, proxy, address, deadline):
    authority = obfsproxy.format_address(address)
    request = "CONNECT %s HTTP/1.1\r\nHost: %s\r\n" % (authority, authority)
    if proxy.username is not None:
        credentials = "%s:%s" % (proxy.username, proxy.password or "")
        request += "Proxy-Authorization: Basic %s\r\n" % base64.b64encode(
            credentials.encode()).decode("ascii")
    obfsproxy.send_all(sock, (request + "\r\n").encode(), deadline)
    # Read the response head one byte at a time: the server's first bytes may
    # follow the blank line at once, and they belong to the tunnel.
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        if len(head) > 16384:
            raise ProxyError("the HTTP proxy's response header is too long")
        head += _recv_exact(sock, 1, deadline)
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    words = status.split(" ", 2)
    if len(words) < 2 or not words[0].startswith("HTTP/1.") or not words[1].isdigit():
        raise ProxyError("the proxy does not speak HTTP: %r" % status[:80])
    if not 200 <= int(words[1]) < 300:
        raise ProxyError("the HTTP proxy answered %r" % status[:80])


_HANDSHAKES = {"socks5": _socks5, "socks4a": _socks4a, "http": _http_connect}


# --- Extended ORPort (server side) ------------------------------------------------------

COOKIE_HEADER = b"! Extended ORPort Auth Cookie !\n"
AUTH_SAFE_COOKIE = 0x01
SERVER_HASH_LABEL = b"ExtORPort authentication server-to-client hash"
CLIENT_HASH_LABEL = b"ExtORPort authentication client-to-server hash"
EXT_DONE, EXT_USERADDR, EXT_TRANSPORT = 0x0000, 0x0001, 0x0002
EXT_OKAY, EXT_DENY = 0x1000, 0x1001


def read_cookie(path):
    """The 32-byte cookie from Tor's 64-byte cookie file (header | cookie)."""
    data = Path(path).read_bytes()
    if len(data) != 64 or not data.startswith(COOKIE_HEADER):
        raise ExtORPortError("%s is not an Extended ORPort cookie file" % path)
    return data[32:]


def ext_command(kind, body=b""):
    """TYPE (2 bytes) | LENGTH (2 bytes) | BODY"""
    return struct.pack("!HH", kind, len(body)) + body


def ext_orport_handshake(sock, cookie_file, client_address, transport_name, deadline):
    """Authenticate to Tor's Extended ORPort and report one client.

    Raises ExtORPortError (an OSError) when Tor does not let the connection
    through; the caller closes it.
    """
    # The cookie changes when Tor restarts: read it for each connection.
    cookie = read_cookie(cookie_file)

    def recv(n):
        return _recv_exact(sock, n, deadline, ExtORPortError)

    # 1. Tor lists its authentication types, ended by 0x00.
    offered = b""
    while not offered.endswith(b"\0"):
        if len(offered) > 256:
            raise ExtORPortError("Extended ORPort: endless list of authentication types")
        offered += recv(1)
    if AUTH_SAFE_COOKIE not in offered[:-1]:
        raise ExtORPortError("Extended ORPort does not offer SAFE_COOKIE authentication")
    # 2. We choose SAFE_COOKIE and send ClientNonce.
    client_nonce = os.urandom(32)
    obfsproxy.send_all(sock, bytes([AUTH_SAFE_COOKIE]) + client_nonce, deadline)
    # 3. Tor proves it knows the cookie: ServerHash | ServerNonce.
    reply = recv(64)
    server_hash, server_nonce = reply[:32], reply[32:]
    expected = hmac.new(cookie, SERVER_HASH_LABEL + client_nonce + server_nonce,
                        hashlib.sha256).digest()
    if not hmac.compare_digest(server_hash, expected):
        raise ExtORPortError("Extended ORPort: wrong server hash (is %s Tor's current "
                             "cookie?)" % cookie_file)
    # 4. We prove it: ClientHash.
    client_hash = hmac.new(cookie, CLIENT_HASH_LABEL + client_nonce + server_nonce,
                           hashlib.sha256).digest()
    obfsproxy.send_all(sock, client_hash, deadline)
    # 5. Tor's verdict: 1 = success.
    if recv(1) != b"\x01":
        raise ExtORPortError("Extended ORPort refused our authentication")
    # 6. Who the client is and how it came; Tor answers OKAY or DENY.
    host, port = client_address[0].split("%")[0], client_address[1]
    mapped = getattr(ipaddress.ip_address(host), "ipv4_mapped", None)
    if mapped is not None:  # an IPv4 client of a dual-stack [::] listener:
        host = str(mapped)  # Tor's GeoIP would not place ::ffff:1.2.3.4
    useraddr = obfsproxy.format_address((host, port)).encode()
    obfsproxy.send_all(sock, ext_command(EXT_USERADDR, useraddr)
                       + ext_command(EXT_TRANSPORT, transport_name.encode())
                       + ext_command(EXT_DONE), deadline)
    while True:
        kind, length = struct.unpack("!HH", recv(4))
        if length:
            recv(length)
        if kind == EXT_OKAY:
            return      # 7. From here on: the ordinary OR stream.
        if kind == EXT_DENY:
            raise ExtORPortError("Extended ORPort denied the connection")
        # Any other reply type is ignored (ext-orport-spec).
