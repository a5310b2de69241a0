"""The other ends of a tunnel, for the end-to-end and interop tests.

* ``Obfs4proxy``: Debian's obfs4proxy as an independent obfs2 peer.
* ``Destination``: a service behind the tunnel whose behaviour (``hashing_echo``,
  ``duplex``, ...) reports what it received on a queue, so a test checks
  both directions with SHA-256.
* ``Background``: run a function on a thread and re-raise its error on join.

obfs4proxy runs only as a Tor managed transport (pt-spec): it is configured by
``TOR_PT_*`` environment variables and announces its listening address on
stdout (``SMETHOD obfs2 127.0.0.1:PORT ARGS:`` or ``CMETHOD obfs2 socks5
127.0.0.1:PORT``). We wait for that line, never for a fixed time.

Its stdin stays open as a pipe: with ``TOR_PT_EXIT_ON_STDIN_CLOSE=1`` it exits
when stdin reaches EOF, which is also how we stop it (exit status 0).
"""

import hashlib
import os
import queue
import socket
import subprocess
import threading
from pathlib import Path

from support import EchoServer, LineReader, fmt, require_obfs4proxy

# SMETHOD obfs2 127.0.0.1:PORT ARGS:   /   CMETHOD obfs2 socks5 127.0.0.1:PORT
_METHOD = r"^(?:SMETHOD obfs2|CMETHOD obfs2 socks5) (\[[0-9a-f:.]+\]|[0-9.]+):(\d+)"
_ERROR = r"^(?:[SC]METHOD-ERROR|ENV-ERROR|VERSION-ERROR|PROXY-ERROR)"


class Obfs4proxy:
    """One obfs4proxy process speaking obfs2, as a server or a SOCKS5 client.

    ``address`` is the (host, port) it listens on: the obfs2 port for a
    server, the SOCKS5 port for a client.
    """

    def __init__(self, role, state_dir, orport=None, timeout=20.0):
        assert role in ("server", "client")
        path = require_obfs4proxy()
        env = {k: v for k, v in os.environ.items() if not k.startswith("TOR_PT_")}
        env.update(TOR_PT_MANAGED_TRANSPORT_VER="1",
                   TOR_PT_STATE_LOCATION=str(Path(state_dir) / (role + "-state")),
                   TOR_PT_EXIT_ON_STDIN_CLOSE="1")
        if role == "server":
            env.update(TOR_PT_SERVER_TRANSPORTS="obfs2",
                       TOR_PT_SERVER_BINDADDR="obfs2-127.0.0.1:0",
                       TOR_PT_ORPORT=fmt(orport))
        else:
            env.update(TOR_PT_CLIENT_TRANSPORTS="obfs2")
        self.role = role
        self.process = subprocess.Popen(
            [path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env)
        self.stdout = LineReader(self.process.stdout)
        self.stderr = LineReader(self.process.stderr)
        try:
            match = self.stdout.wait_for(_METHOD + "|" + _ERROR, timeout)
            if match.group(1) is None:
                raise AssertionError("obfs4proxy %s refused to start: %r"
                                     % (role, match.string))
            self.address = (match.group(1).strip("[]"), int(match.group(2)))
        except BaseException:
            self.stop()
            raise

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
