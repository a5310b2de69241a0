"""Shared test harness: the real program as a subprocess, real sockets on 127.0.0.1.

Synchronisation is on real events: a started proxy is ready when it has logged
"listening on HOST:PORT" (we read the bound port from that line, so every test
uses ephemeral ports), never on sleeps.
"""

import base64
import importlib
import os
import queue
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def copy_runtime(folder):
    """The root's *.py and cryptoroutes/ (the runtime) copied into ``folder``."""
    for path in ROOT.glob("*.py"):
        shutil.copy(str(path), str(folder / path.name))
    shutil.copytree(str(ROOT / "cryptoroutes"), str(folder / "cryptoroutes"),
                    ignore=shutil.ignore_patterns("__pycache__"))


PROGRAM = str(ROOT / "obfsproxy.py")
# The program the end-to-end tests run: this checkout's obfsproxy.py under this Python,
# or $OBFSPROXY_UNDER_TEST, a command line such as "python3 -I -S /tmp/x/obfsproxy.pyz"
# (tests/test_pyz.py, .ci/run), run from the folder of its last word: outside the checkout.
UNDER_TEST = shlex.split(os.environ.get("OBFSPROXY_UNDER_TEST", "")) or [sys.executable, PROGRAM]
UNDER_TEST_CWD = str(Path(UNDER_TEST[-1]).parent) if "OBFSPROXY_UNDER_TEST" in os.environ else str(ROOT)
LISTENING = re.compile(r"listening on (\[[0-9a-f:.]+\]|[^ ]+):(\d+)")
IN_CI = os.environ.get("CI") == "true"


def pycryptodome_cipher(name):
    """pycryptodome's ``Cipher.<name>``, the tests' independent second opinion, whatever
    OBFSPROXY_CRYPTO says: pip's ``Crypto``, else Debian's ``Cryptodome``; None without
    either."""
    for namespace in ("Crypto", "Cryptodome"):
        try:
            return importlib.import_module("%s.Cipher.%s" % (namespace, name))
        except ImportError:
            continue
    return None


def load_vectors(name):
    """The known answers in ``tests/vectors/NAME`` (copied from the project's
    shared/vectors; $OBFSPROXY_VECTORS names another folder). Missing vectors
    fail the test: they are the proof."""
    import json
    folder = Path(os.environ.get("OBFSPROXY_VECTORS") or ROOT / "tests" / "vectors")
    path = folder / name
    if not path.is_file():
        pytest.fail("known-answer vectors %s not found" % path)
    return json.loads(path.read_text(encoding="utf-8"))


def require_obfs4proxy():
    """The path of Debian's obfs4proxy. In CI its absence is a failure (CI
    installs it); elsewhere the test is skipped with the reason."""
    path = shutil.which("obfs4proxy")
    if path is None:
        if IN_CI:
            pytest.fail("obfs4proxy is not installed, but CI must install it (.ci/run)")
        pytest.skip("obfs4proxy is not installed (apt-get install obfs4proxy); "
                    "this interop test needs it and CI installs it")
    return path


# --- A real Tor, through tests/tor-loopback.sh ---------------------------------------

TOR_LOOPBACK = ROOT / "tests" / "tor-loopback.sh"
OURS = "%s %s managed" % (sys.executable, PROGRAM)   # our program as Tor's PT command


def require_tor():
    """The directory holding tor (for PATH). In CI its absence is a failure (.ci/run
    installs it); elsewhere the test is skipped with the reason."""
    found = shutil.which("tor") or shutil.which("tor", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        if IN_CI:
            pytest.fail("tor is not installed, but CI must install it (.ci/run)")
        pytest.skip("tor is not installed (apt-get install tor); this test runs a real "
                    "Tor client and bridge on loopback, and CI installs it")
    return str(Path(found).parent)


def bootstrap(client_pt, server_pt, transport, **env):
    """Run tor-loopback.sh (``env``: its variables, e.g. BRIDGE_ARGS); returns (exit
    status, its stdout+stderr, seconds)."""
    assert " " not in PROGRAM and " " not in sys.executable, "torrc lines split at spaces"
    environment = dict(os.environ, BRIDGE_LOG="debug", **env)
    environment["PATH"] = require_tor() + os.pathsep + environment.get("PATH", "")
    started = time.monotonic()
    done = subprocess.run(["bash", str(TOR_LOOPBACK), client_pt, server_pt, transport],
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=environment, timeout=400)
    seconds = time.monotonic() - started
    return done.returncode, done.stdout, seconds


class LineReader:
    """Reads a stream's lines on a thread, so tests can wait with a deadline."""

    def __init__(self, stream):
        self.lines = []
        self._queue = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream):
        for line in stream:
            self._queue.put(line.rstrip("\r\n"))
        self._queue.put(None)

    def wait_for(self, pattern, timeout=20.0):
        """The first match of ``pattern`` in a new line, or AssertionError."""
        regex = re.compile(pattern)
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError("no line matching %r within %.0f s; saw: %r"
                                     % (pattern, timeout, self.lines[-20:]))
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError("stream ended before a line matching %r; saw: %r"
                                     % (pattern, self.lines[-20:]))
            self.lines.append(line)
            match = regex.search(line)
            if match:
                return match

    def rest(self, timeout=5.0):
        """Collect lines until the stream ends (or timeout)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self._queue.get(timeout=max(0.01, end - time.monotonic()))
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
        return self.lines


class Program:
    """``obfsproxy.py <args>`` running, with its bound address read from its log."""

    def __init__(self, *args, env=None, interpreter=None, script=None, cwd=None):
        """``interpreter``: the command that runs the program, before its path
        (default: this Python); ``script``: the program (default: this checkout's).
        Neither given: the program under test (``UNDER_TEST``). ``cwd``: where it
        runs (default: the checkout, or UNDER_TEST's folder)."""
        if interpreter is None and script is None:
            self.args, where = [*UNDER_TEST, *args], UNDER_TEST_CWD
        else:
            self.args, where = [*(interpreter or [sys.executable]), script or PROGRAM, *args], str(ROOT)
        self.process = subprocess.Popen(
            self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env, cwd=str(cwd or where))
        self.log = LineReader(self.process.stderr)
        try:
            match = self.log.wait_for(LISTENING.pattern)
        except BaseException:       # it never said where it listens: never leave it running
            self.stop(timeout=2)
            raise
        host = match.group(1).strip("[]")
        self.address = (host, int(match.group(2)))

    def stop(self, timeout=10):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.rest(timeout=1)
        self.process.stdout.close()
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def tunnel(transport="obfs2", *extra, dest, family="127.0.0.1"):
    """A server forwarding to ``dest`` and a SOCKS client, as two processes."""
    listen = "[::1]:0" if family == "::1" else "127.0.0.1:0"
    server = Program("server", "--transport=" + transport, "--dest=" + fmt(dest), listen,
                   "--log-min-severity=info", *extra)
    try:
        client = Program("client", "--transport=" + transport, listen,
                       "--log-min-severity=info", *extra)
    except BaseException:
        server.stop()
        raise
    return server, client


def fmt(address):
    host, port = address[:2]
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def listening_socket(host="127.0.0.1", backlog=128):
    """A TCP socket listening on an ephemeral port of ``host`` (IPv4 or IPv6)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen(backlog)
    return listener


class EchoServer:
    """A TCP service on loopback: an echo, or any per-connection behaviour.

    Every accepted connection is counted in ``accepted`` and served on a
    thread of its own by ``_serve``, which by default runs ``behaviour(conn)``
    (``echo`` unless given), closes the connection and keeps what it raised in
    ``errors``. The fake services of the tests (an Extended ORPort, upstream
    proxies, the reliability tests' destination) subclass it and override
    ``_serve``; a subclass sets its own attributes before calling
    ``__init__``, which starts accepting.
    """

    def __init__(self, host="127.0.0.1", behaviour=None, backlog=128):
        self.behaviour = behaviour or echo
        self.errors = []
        self.accepted = 0
        self.closed = False
        self.listener = listening_socket(host, backlog)
        self.address = self.listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.closed:       # accepted as close() ran: never serve it with our behaviour
                conn.close()
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            with conn:
                self.behaviour(conn)
        except Exception as exc:  # recorded for the test to assert on
            self.errors.append(exc)

    def close(self):
        """Stop listening and accepting, for good: the port leaves LISTEN at once
        and the accept thread has ended when this returns, so no later connection
        (to this port, or to a descriptor number the OS hands out again) is ever
        served with this server's behaviour."""
        self.closed = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)   # wakes the accept() below
        except OSError:
            pass
        self.listener.close()
        if self._thread is not threading.current_thread():
            self._thread.join(10)
            assert not self._thread.is_alive(), "the accept thread did not end"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FakeProxy(EchoServer):
    """An upstream proxy on 127.0.0.1 of ``kind`` socks5, socks4a or http.

    ``auth``: (user, password) the proxy demands (socks5, http). ``refuse``:
    answer every request with a failure instead of connecting. ``glue``:
    bytes sent in the same segment as the success reply, as if the
    destination had spoken at once. ``status``: the HTTP status line to
    answer instead of 200 (the proxy then closes). ``requests`` records one
    dict per request (target, credentials, ...), before the reply is sent.
    """

    def __init__(self, kind, auth=None, refuse=False, glue=b"", silent=False, status=None):
        self.kind, self.auth, self.refuse, self.glue, self.silent = kind, auth, refuse, glue, silent
        self.status = status
        self.requests = []
        super().__init__(backlog=16)

    def uri(self, user=None, password=None):
        credentials = ""
        if user is not None:
            credentials = user + (":" + password if password is not None else "") + "@"
        return "%s://%s127.0.0.1:%d" % (self.kind, credentials, self.address[1])

    def _serve(self, conn):
        with conn:
            conn.settimeout(10)
            try:
                if self.silent:
                    conn.recv(1024)   # take the request, never answer
                    conn.recv(1024)
                    return
                upstream = getattr(self, "_" + self.kind)(conn)
            except (OSError, AssertionError) as exc:
                self.requests.append({"error": repr(exc)})
                return
            if upstream is not None:
                with upstream:
                    _relay(conn, upstream)

    def _connect(self, record, host, port):
        record["target"] = (host, port)
        self.requests.append(record)
        if self.refuse:
            return None
        try:
            return socket.create_connection((host, port), timeout=10)
        except OSError:
            return None

    def _socks5(self, conn):
        # VER=05 NMETHODS METHODS
        _, count = recv_exact(conn, 2)
        methods = recv_exact(conn, count)
        record = {"methods": methods}
        if self.auth:
            if 2 not in methods:
                conn.sendall(b"\x05\xff")
                raise AssertionError("client did not offer username/password")
            conn.sendall(b"\x05\x02")
            # VER=01 ULEN UNAME PLEN PASSWD
            _, ulen = recv_exact(conn, 2)
            user = recv_exact(conn, ulen)
            plen = recv_exact(conn, 1)[0]
            password = recv_exact(conn, plen)
            record["auth"] = (user.decode(), password.decode())
            record["plen"] = plen
            if record["auth"] != self.auth:
                conn.sendall(b"\x01\x01")
                self.requests.append(record)
                return None
            conn.sendall(b"\x01\x00")
        else:
            conn.sendall(b"\x05\x00")
        # VER=05 CMD=01 RSV=00 ATYP DST.ADDR DST.PORT
        _, cmd, _, atyp = recv_exact(conn, 4)
        if atyp == 1:
            host = socket.inet_ntop(socket.AF_INET, recv_exact(conn, 4))
        elif atyp == 4:
            host = socket.inet_ntop(socket.AF_INET6, recv_exact(conn, 16))
        else:
            host = recv_exact(conn, recv_exact(conn, 1)[0]).decode()
        port = struct.unpack("!H", recv_exact(conn, 2))[0]
        record["command"] = cmd
        upstream = self._connect(record, host, port)
        # VER=05 REP RSV=00 ATYP=01 BND.ADDR=0.0.0.0 BND.PORT=0
        conn.sendall(bytes([5, 0 if upstream else 5, 0, 1]) + bytes(6) + (self.glue if upstream else b""))
        return upstream

    def _socks4a(self, conn):
        # VN=04 CD=01 DSTPORT DSTIP USERID 00 [HOST 00]
        _, cmd, port = struct.unpack("!BBH", recv_exact(conn, 4))
        ip = recv_exact(conn, 4)
        userid = _read_until(conn, b"\0")
        if ip[:3] == b"\0\0\0" and ip[3]:
            host = _read_until(conn, b"\0").decode()
        else:
            host = socket.inet_ntoa(ip)
        upstream = self._connect({"command": cmd, "userid": userid.decode()}, host, port)
        conn.sendall(bytes([0, 0x5A if upstream else 0x5B]) + bytes(6) + (self.glue if upstream else b""))
        return upstream

    def _http(self, conn):
        head = _read_until(conn, b"\r\n\r\n").decode("latin-1").split("\r\n")
        method, authority, _ = head[0].split(" ")
        headers = dict(line.split(": ", 1) for line in head[1:] if line)
        record = {"method": method, "headers": headers}
        if self.auth:
            expected = "Basic " + base64.b64encode(("%s:%s" % self.auth).encode()).decode()
            if headers.get("Proxy-Authorization") != expected:
                self.requests.append(record)
                conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
                return None
        host, _, port = authority.rpartition(":")
        if self.status is not None:
            record["target"] = (host.strip("[]"), int(port))
            self.requests.append(record)
            conn.sendall(self.status + b"\r\nContent-Length: 0\r\n\r\n")
            return None
        upstream = self._connect(record, host.strip("[]"), int(port))
        if upstream is None:
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return None
        conn.sendall(b"HTTP/1.1 200 Connection established\r\nX-Fake: yes\r\n\r\n" + self.glue)
        return upstream


def _read_until(conn, end):
    data = b""
    while not data.endswith(end):
        data += recv_exact(conn, 1)
    return data[:-len(end)]


def _relay(a, b):
    """Both directions until both ended, EOF passed on as shutdown(SHUT_WR)."""
    def pump(src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    other = threading.Thread(target=pump, args=(b, a), daemon=True)
    other.start()
    pump(a, b)
    other.join(30)


def echo(conn):
    """Echo until the peer's EOF."""
    while True:
        data = conn.recv(262144)
        if not data:
            return
        conn.sendall(data)


def hang_up(conn):
    """A behaviour that closes every connection at once, having read nothing."""


def closed_port():
    """A loopback address with nothing listening (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()


def reserved_port(host="127.0.0.1"):
    """A socket bound but not listening: connections to its port are refused,
    and no other process can take the port while we hold it (unlike
    ``closed_port``). Use it as a context manager."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.bind((host, 0))
    return sock


def assert_refused(address, timeout=10.0):
    """Wait until nothing listens on ``address`` any more (a real event:
    connect is refused); AssertionError after ``timeout``."""
    end = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(address, timeout=2).close()
        except ConnectionRefusedError:
            return
        except (ConnectionResetError, ConnectionAbortedError):
            pass    # caught in the listen queue as the listener closed: try again
        if time.monotonic() > end:
            raise AssertionError("%r still accepts connections" % (address,))
        time.sleep(0.02)  # polling a real condition, not a sleep standing in for one


def wait_until(check, timeout=10.0, what="condition"):
    """Poll ``check()`` (a real condition: a counter, a thread gone) until it is
    true; the test fails saying ``what`` after ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            pytest.fail("%s: not within %.0f s" % (what, timeout))
        time.sleep(0.005)


def has_ipv6_loopback():
    """True when this machine can bind ::1."""
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


def echo_round_trip(sock, payload):
    """Send ``payload`` on a thread while reading the echo; returns what came back."""
    sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
    sender.start()
    got = recv_exact(sock, len(payload))
    sender.join(10)
    return got


def recv_exact(sock, n):
    chunks, have = [], 0
    while have < n:
        chunk = sock.recv(min(n - have, 1 << 20))
        if not chunk:
            raise AssertionError("connection closed after %d of %d bytes" % (have, n))
        chunks.append(chunk)
        have += len(chunk)
    return b"".join(chunks)


def recv_all(sock):
    chunks = []
    while True:
        chunk = sock.recv(1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def socks5_connect(proxy_address, target, timeout=30, args=None):
    """SOCKS5 CONNECT to ``target`` through ``proxy_address``, message by
    message like Tor. Returns the socket; raises SocksReplyError on failure."""
    sock = socket.create_connection(proxy_address, timeout=timeout)
    try:
        if args is None:
            sock.sendall(b"\x05\x01\x00")              # VER=05 NMETHODS=01 METHODS=[00]
            assert recv_exact(sock, 2) == b"\x05\x00"
        else:
            sock.sendall(b"\x05\x01\x02")              # METHODS=[02 username/password]
            assert recv_exact(sock, 2) == b"\x05\x02"
            raw = args.encode()
            uname, passwd = raw[:255], raw[255:] or b"\0"
            sock.sendall(bytes([1, len(uname)]) + uname + bytes([len(passwd)]) + passwd)
            assert recv_exact(sock, 2) == b"\x01\x00"
        sock.sendall(socks5_request(target))
        reply = recv_exact(sock, 4)
        rest = {1: 4, 4: 16}.get(reply[3], 0) + 2
        recv_exact(sock, rest)
        if reply[1] != 0:
            raise SocksReplyError(reply[1])
    except BaseException:
        sock.close()
        raise
    return sock


def socks5_request(target):
    """VER=05 CMD=01 RSV=00 ATYP ADDR PORT"""
    host, port = target[:2]
    if ":" in host:
        addr = b"\x04" + socket.inet_pton(socket.AF_INET6, host)
    else:
        try:
            addr = b"\x01" + socket.inet_aton(host)
        except OSError:
            addr = b"\x03" + bytes([len(host)]) + host.encode()
    return b"\x05\x01\x00" + addr + struct.pack("!H", port)


class SocksReplyError(Exception):
    def __init__(self, code):
        super().__init__("SOCKS reply code 0x%02x" % code)
        self.code = code
