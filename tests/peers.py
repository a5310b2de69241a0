"""The other ends of a tunnel, for the end-to-end and interop tests.

* ``Obfs4proxy``: Debian's obfs4proxy as an independent peer for obfs2, obfs3 and
  obfs4, in either role: a server (its SMETHOD port, and for obfs4 the ``cert`` of
  its ARGS) or a SOCKS5 client (its CMETHOD port).
* ``pinned_options``: an obfs4 server identity fixed through
  TOR_PT_SERVER_TRANSPORT_OPTIONS, the same for obfs4proxy and for us.
* ``Destination``: a service behind the tunnel whose behaviour (``hashing_echo``,
  ``duplex``, ``one_way_each``, ...) reports what it received on a queue, so a
  test checks both directions with SHA-256.
* ``Background``: run a function on a thread and re-raise its error on join.

obfs4proxy runs only as a Tor managed transport (pt-spec): it is configured by
``TOR_PT_*`` environment variables and announces its listening addresses on
stdout (``SMETHOD obfs4 127.0.0.1:PORT ARGS:cert=...,iat-mode=0`` or ``CMETHOD
obfs4 socks5 127.0.0.1:PORT``) up to ``SMETHODS DONE`` / ``CMETHODS DONE``. We
read to that line, never wait for a fixed time.

Its stdin stays open as a pipe: with ``TOR_PT_EXIT_ON_STDIN_CLOSE=1`` it exits
when stdin reaches EOF, which is also how we stop it (exit status 0; 255 when a
server had no transport to run).
"""

import hashlib
import os
import queue
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

from support import EchoServer, LineReader, fmt, require_obfs4proxy

_DONE = r"^(?:SMETHODS DONE|CMETHODS DONE)$"
_FATAL = r"^(?:ENV-ERROR|VERSION-ERROR|PROXY-ERROR)"
_SMETHOD = re.compile(r"^SMETHOD (\S+) (\[[0-9a-f:.]+\]|[0-9.]+):(\d+)(?: ARGS:(\S*))?$")
_CMETHOD = re.compile(r"^CMETHOD (\S+) socks5 (\[[0-9a-f:.]+\]|[0-9.]+):(\d+)$")
_METHOD_ERROR = re.compile(r"^[SC]METHOD-ERROR (\S+) (.*)$")

# A pinned obfs4 server identity (obfs4-spec 8): drbg-seed 07 x 24 gives a close delay
# of 1 s (failed handshakes close at accept + 31 s) and a 26-value length table
# without 0 (safe for obfs4proxy in iat-mode 2). The same values as
# vectors/obfs4-server-state.json "identity_from_options", whose cert is known.
PINNED = {"node-id": "11" * 20, "private-key": "21" * 32, "drbg-seed": "07" * 24}
PINNED_CLOSE_AFTER = 31.0   # seconds: 30 s handshake deadline + close_delay 1 s


def pinned_options(iat_mode=0, identity=None, tor=True):
    """The pinned identity (or ``identity``) and ``iat_mode`` as server options:
    Tor's TOR_PT_SERVER_TRANSPORT_OPTIONS (``obfs4:k=v;...``) when ``tor``, else our
    --transport-options (``k=v;...``)."""
    items = dict(identity or PINNED, **{"iat-mode": str(iat_mode)})
    prefix = "obfs4:" if tor else ""
    return ";".join("%s%s=%s" % (prefix, key, value) for key, value in items.items())


def parse_args(text):
    """SMETHOD ARGS ``k=v,k=v`` (no escapes appear in what we parse) -> dict."""
    return dict(item.split("=", 1) for item in text.split(",") if item)


class Obfs4proxy:
    """One obfs4proxy process, as a server or a SOCKS5 client, for one or more transports.

    ``transport``: "obfs2", "obfs3", "obfs4" or several joined with "," (one process
    serves them all). ``options``: TOR_PT_SERVER_TRANSPORT_OPTIONS (see
    ``pinned_options``). ``state_location``: the exact TOR_PT_STATE_LOCATION (default:
    ``state_dir``/<role>-state). ``logging``: ``-enableLogging -logLevel DEBUG
    -unsafeLogging`` (obfs4proxy.log in the state location).

    After start: ``addresses`` {transport: (host, port)} (the transport's port for a
    server, the SOCKS5 port for a client), ``address`` the first of them, ``args``
    {transport: {key: value}} from SMETHOD ARGS (``cert``, ``iat-mode``), ``cert`` the
    obfs4 cert (or None), ``errors`` {transport: message} from *METHOD-ERROR lines.
    ``require_all=False`` lets a test look at errors instead of failing on them.
    """

    def __init__(self, role, state_dir, orport=None, transport="obfs2", options=None,
                 state_location=None, logging=False, require_all=True, timeout=20.0):
        assert role in ("server", "client")
        path = require_obfs4proxy()
        names = transport.split(",")
        self.role, self.names = role, names
        self.state = Path(state_location) if state_location else Path(state_dir) / (role + "-state")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOR_PT_")}
        env.update(TOR_PT_MANAGED_TRANSPORT_VER="1", TOR_PT_STATE_LOCATION=str(self.state),
                   TOR_PT_EXIT_ON_STDIN_CLOSE="1")
        if role == "server":
            env.update(TOR_PT_SERVER_TRANSPORTS=transport,
                       TOR_PT_SERVER_BINDADDR=",".join("%s-127.0.0.1:0" % name for name in names),
                       TOR_PT_ORPORT=fmt(orport))
            if options:
                env["TOR_PT_SERVER_TRANSPORT_OPTIONS"] = options
        else:
            env.update(TOR_PT_CLIENT_TRANSPORTS=transport)
        argv = [path] + (["-enableLogging", "-logLevel", "DEBUG", "-unsafeLogging"] if logging else [])
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env)
        self.stdout = LineReader(self.process.stdout)
        self.stderr = LineReader(self.process.stderr)
        self.addresses, self.args, self.errors = {}, {}, {}
        try:
            self._read_methods(timeout)
            missing = [name for name in names if name not in self.addresses]
            if missing and require_all:
                raise AssertionError("obfs4proxy %s refused to start %s: %r"
                                     % (role, ", ".join(missing), self.stdout.lines))
        except BaseException:
            self.stop()
            raise
        self.address = self.addresses.get(names[0])
        self.cert = self.args.get("obfs4", {}).get("cert")

    def _read_methods(self, timeout):
        while True:
            line = self.stdout.wait_for(r"^", timeout).string
            if re.match(_FATAL, line):
                raise AssertionError("obfs4proxy %s refused to start: %r" % (self.role, line))
            method = _SMETHOD.match(line) or _CMETHOD.match(line)
            if method:
                name = method.group(1)
                self.addresses[name] = (method.group(2).strip("[]"), int(method.group(3)))
                if method.re is _SMETHOD:
                    self.args[name] = parse_args(method.group(4) or "")
            error = _METHOD_ERROR.match(line)
            if error:
                self.errors[error.group(1)] = error.group(2)
            if re.match(_DONE, line):
                return

    def stop(self, timeout=10):
        """Close stdin (its signal to exit) and wait; kill it if it hangs.
        Returns the exit status."""
        if self.process.stdin and not self.process.stdin.closed:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# --- Threads ----------------------------------------------------------------------

class Background:
    """``fn(*args)`` on a daemon thread; ``join()`` returns its result or
    re-raises its exception, and fails if it is still running."""

    def __init__(self, fn, *args):
        self.result = self.error = None
        self.thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self.thread.start()

    def _run(self, fn, args):
        try:
            self.result = fn(*args)
        except BaseException as exc:  # handed to the joining thread
            self.error = exc

    def join(self, timeout=30.0):
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError("background task still running after %.0f s" % timeout)
        if self.error is not None:
            raise self.error
        return self.result


def send_and_shut(sock, data):
    """Send everything, then half-close (SHUT_WR): EOF travels through the tunnel."""
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def digest(data):
    return hashlib.sha256(data).hexdigest()


def read_hashing(sock, count=None):
    """Read to EOF (or exactly ``count`` bytes) without keeping the bytes:
    returns (number of bytes, SHA-256 hex digest)."""
    h, have = hashlib.sha256(), 0
    while count is None or have < count:
        chunk = sock.recv(1 << 20 if count is None else min(1 << 20, count - have))
        if not chunk:
            if count is not None:
                raise AssertionError("EOF after %d of %d bytes" % (have, count))
            break
        h.update(chunk)
        have += len(chunk)
    return have, h.hexdigest()


# --- Destinations -------------------------------------------------------------------

class Destination(EchoServer):
    """A TCP service on loopback; ``behaviour(conn, report)`` runs for each
    connection and calls ``report(value)`` to hand results to the test."""

    def __init__(self, behaviour, host="127.0.0.1"):
        self.results = queue.Queue()
        super().__init__(host, behaviour=lambda conn: behaviour(conn, self.results.put))

    def result(self, timeout=30.0):
        """The next reported value, in connection order."""
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("the destination reported nothing within %.0f s "
                                 "(its errors: %r)" % (timeout, self.errors))

    def drain(self):
        """Forget results of earlier connections."""
        while True:
            try:
                self.results.get_nowait()
            except queue.Empty:
                return


def hashing_echo(conn, report):
    """Echo everything; at EOF report (bytes received, SHA-256) and close."""
    h, count = hashlib.sha256(), 0
    while True:
        data = conn.recv(262144)
        if not data:
            break
        h.update(data)
        count += len(data)
        conn.sendall(data)
    report((count, h.hexdigest()))


def duplex(outgoing, expect, half_close=True):
    """A behaviour that sends ``outgoing`` on a thread while it reads exactly
    ``expect`` bytes, and reports (bytes received, SHA-256) of what arrived.

    Only when it has both sent everything and read everything does it
    half-close (``half_close=True``), then it waits for the peer's EOF. So
    neither direction can end before the other has fully flowed: a relay
    that pumps one direction at a time deadlocks here. obfs4proxy closes both
    directions at the first EOF, so across it use ``half_close=False``.
    """
    def behaviour(conn, report):
        sender = Background(conn.sendall, outgoing)
        report(read_hashing(conn, expect))
        sender.join()
        try:
            if half_close:
                conn.shutdown(socket.SHUT_WR)
            while conn.recv(65536):
                pass
        except OSError:  # obfs4proxy may reset rather than close
            pass
    return behaviour


def one_way_each(outgoing, expect):
    """A behaviour for timing each direction alone: read exactly ``expect`` bytes and
    report (bytes received, SHA-256, the monotonic time the last one arrived); only
    then send ``outgoing`` (so the down direction starts at that moment), and wait
    for the peer to close. No half-close: it works across obfs4proxy."""
    def behaviour(conn, report):
        count, hexdigest = read_hashing(conn, expect)
        report((count, hexdigest, time.monotonic()))
        conn.sendall(outgoing)
        try:
            while conn.recv(65536):
                pass
        except OSError:  # obfs4proxy may reset rather than close
            pass
    return behaviour


def transfer_each_way(sock, dest, up, down, timeout=600.0):
    """Send ``up`` through ``sock`` to a ``one_way_each(down, len(up))`` destination,
    then read ``down`` back. Checks both by SHA-256 and returns the seconds each
    direction took: {"up": s, "down": s} (both measured on this process's clock)."""
    started = time.monotonic()
    sock.sendall(up)
    count, hexdigest, up_done = dest.result(timeout)
    assert (count, hexdigest) == (len(up), digest(up)), "the destination got other bytes"
    assert read_hashing(sock, len(down)) == (len(down), digest(down)), \
        "the application got other bytes"
    return {"up": up_done - started, "down": time.monotonic() - up_done}
