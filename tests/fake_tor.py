"""A fake Tor for managed-mode tests: the parts of Tor a transport talks to.

``ManagedPT`` starts ``obfsproxy.py managed`` the way Tor does (environment in,
stdin kept open, stdout read line by line) and checks that *every* stdout line
is a pluggable-transport message. ``ExtORPort`` is Tor's Extended ORPort:
SAFE_COOKIE authentication, then USERADDR / TRANSPORT / DONE, answered with
OKAY or DENY, then an echo service standing in for the OR stream.

Synchronisation is on real events only: lines on stdout, a refused connect
(``support.assert_refused``), a process exit.
"""

import contextlib
import hashlib
import hmac
import io
import os
import re
import socket
import struct
import subprocess
import threading

from support import ROOT, UNDER_TEST, UNDER_TEST_CWD, EchoServer, LineReader, echo, recv_exact, socks5_request

import obfs2

ADDR = r"(?:\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-fA-F:.]+\]):\d{1,5}"
MESSAGES = {  # pt-spec version 1, everything a transport may print
    "VERSION": r"VERSION (?P<version>\S+)",
    "VERSION-ERROR": r"VERSION-ERROR (?P<message>.+)",
    "ENV-ERROR": r"ENV-ERROR (?P<message>.+)",
    "PROXY DONE": r"PROXY DONE",
    "PROXY-ERROR": r"PROXY-ERROR (?P<message>.+)",
    "CMETHOD": r"CMETHOD (?P<name>[A-Za-z_][A-Za-z0-9_]*) (?P<socks>socks4|socks5) "
               r"(?P<address>%s)(?: ARGS:(?P<args>\S*))?(?: OPT-ARGS:\S*)?" % ADDR,
    "CMETHOD-ERROR": r"CMETHOD-ERROR (?P<name>\S+) (?P<message>.+)",
    "CMETHODS DONE": r"CMETHODS DONE",
    "SMETHOD": r"SMETHOD (?P<name>[A-Za-z_][A-Za-z0-9_]*) (?P<address>%s)"
               r"(?: ARGS:(?P<args>\S*))?" % ADDR,
    "SMETHOD-ERROR": r"SMETHOD-ERROR (?P<name>\S+) (?P<message>.+)",
    "SMETHODS DONE": r"SMETHODS DONE",
    "LOG": r'LOG SEVERITY=(?:error|warning|notice|info|debug) MESSAGE=".*"',
    "STATUS": r"STATUS TRANSPORT=\S+ .*",
}
_FINAL = re.compile(r"^(CMETHODS DONE|SMETHODS DONE|ENV-ERROR|VERSION-ERROR|PROXY-ERROR)")


def parse_message(line):
    """(keyword, {field: value}) for a PT message; AssertionError otherwise."""
    for keyword, pattern in MESSAGES.items():
        match = re.fullmatch(pattern, line)
        if match:
            return keyword, match.groupdict()
    raise AssertionError("not a pluggable-transport message on stdout: %r" % line)


def parse_smethod_args(text):
    """``k=v,k=v`` (backslash escapes) -> {k: v}."""
    result, key, current, escaped = {}, None, [], False
    for char in text + ",":
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "=" and key is None:
            key, current = "".join(current), []
        elif char == ",":
            if key is not None or current:
                assert key is not None, "ARGS item without '=': %r" % text
                result[key] = "".join(current)
            key, current = None, []
        else:
            current.append(char)
    return result


def parse_address(text):
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def tor_env(state_dir, **variables):
    """The environment Tor gives a transport: its own (minus any TOR_PT_*),
    plus the given TOR_PT_* variables (None removes one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOR_PT_")}
    env["TOR_PT_MANAGED_TRANSPORT_VER"] = "1"
    env["TOR_PT_STATE_LOCATION"] = str(state_dir)
    for key, value in variables.items():
        name = key if key.startswith("TOR_PT_") else "TOR_PT_" + key
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


class _StdoutReader(LineReader):
    """Binary stdout: a line counts only with its "\\n"; a "\\r" or a last line
    without newline is kept visible so that parse_message rejects it."""

    def _pump(self, stream):
        for raw in stream:
            text = raw.decode("utf-8", "replace")
            self._queue.put(text[:-1] if text.endswith("\n") else "<no newline>" + text)
        self.ended = True
        self._queue.put(None)

    ended = False

    def rest(self, timeout=5.0):
        if self.ended and self._queue.empty():   # the end was already read by wait_for
            return self.lines
        return super().rest(timeout)


class ManagedPT:
    """``obfsproxy.py managed <args>`` started like Tor starts it.

    ``messages`` holds the parsed stdout lines read so far; ``cmethods`` and
    ``smethods`` map a transport name to its announced (host, port).
    """

    def __init__(self, env, *args, command=None, stdin=subprocess.PIPE, wait=True,
                 mode="managed"):
        self.env = env
        argv = command or [*UNDER_TEST, mode, *args]
        self.process = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        env=env, cwd=UNDER_TEST_CWD if command is None else str(ROOT))
        self.stdout = _StdoutReader(self.process.stdout)
        self.stderr = LineReader(io.TextIOWrapper(self.process.stderr, encoding="utf-8",
                                                  errors="replace"))
        self.messages = []
        if wait:
            self.configured()

    def configured(self, timeout=20.0):
        """Read stdout until configuration ends: one DONE line per role in the
        environment (client, server), or an error line. Returns the messages."""
        roles = ("TOR_PT_CLIENT_TRANSPORTS" in self.env) + ("TOR_PT_SERVER_TRANSPORTS" in self.env)
        done = 0
        while True:
            try:
                line = self.stdout.wait_for(r"^", timeout).string
            except AssertionError as exc:
                self.stderr.rest(timeout=1)
                raise AssertionError("%s; stderr: %r" % (exc, self.stderr.lines[-10:]))
            self.messages.append(parse_message(line))
            if _FINAL.match(line):
                if not line.endswith("DONE"):
                    return self.messages
                done += 1
                if done >= roles:
                    return self.messages

    def keywords(self):
        return [keyword for keyword, _ in self.messages]

    @property
    def cmethods(self):
        return {f["name"]: parse_address(f["address"]) for k, f in self.messages if k == "CMETHOD"}

    @property
    def smethods(self):
        return {f["name"]: parse_address(f["address"]) for k, f in self.messages if k == "SMETHOD"}

    def args(self, name):
        """The SMETHOD ARGS of transport ``name`` as {key: value}, unescaped (pt-spec:
        ``k=v,k=v`` with ``\\`` escaping ``,`` ``=`` and ``\\``)."""
        for keyword, fields in self.messages:
            if keyword == "SMETHOD" and fields["name"] == name:
                return parse_smethod_args(fields["args"] or "")
        raise AssertionError("no SMETHOD %s in %r" % (name, self.stdout.lines))

    def field(self, keyword, name="message"):
        for k, fields in self.messages:
            if k == keyword:
                return fields[name]
        raise AssertionError("no %s line in %r" % (keyword, self.stdout.lines))

    def close_stdin(self):
        self.process.stdin.close()

    def signal(self, signum):
        self.process.send_signal(signum)

    def wait(self, timeout=10.0):
        """The exit status; AssertionError if it is still running after ``timeout``."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("managed transport still running after %.0f s; stderr: %r"
                                 % (timeout, self.stderr.lines[-10:]))

    def finish(self):
        """Kill if still running, then check that every stdout line was a PT message."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.stdout.rest(timeout=5)
        self.stderr.rest(timeout=2)
        for line in self.stdout.lines[len(self.messages):]:
            self.messages.append(parse_message(line))
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream:
                try:
                    stream.close()
                except OSError:
                    pass
        return self.process.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finish()


# --- obfs2 client for tests: we know our own address, so USERADDR can be checked ---

class Obfs2Client:
    """An obfs2 initiator on a plain socket, in the test process."""

    def __init__(self, address, shared_secret=None, hash_iterations=obfs2.HASH_ITERATIONS,
                 timeout=10.0):
        self.sock = socket.create_connection(address, timeout=timeout)
        self.transport = obfs2.Obfs2(True, shared_secret=shared_secret,
                                     hash_iterations=hash_iterations)
        self.sock.sendall(self.transport.start())
        self.buffer = b""
        while not self.transport.is_open:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("server closed during the obfs2 handshake")
            self.buffer += self.transport.receive(data)

    @property
    def local_address(self):
        return self.sock.getsockname()[:2]

    def send(self, data):
        self.sock.sendall(self.transport.send(data))

    def echo(self, data):
        """Send ``data`` and read back as many bytes: the round trip through
        an echo service behind the server."""
        self.send(data)
        return self.recv_exact(len(data))

    def recv_exact(self, n):
        while len(self.buffer) < n:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed after %d of %d bytes" % (len(self.buffer), n))
            self.buffer += self.transport.receive(data)
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out

    def recv_eof(self):
        """All plaintext until the server closes."""
        while True:
            data = self.sock.recv(65536)
            if not data:
                out, self.buffer = self.buffer, b""
                return out
            self.buffer += self.transport.receive(data)

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# --- The Extended ORPort -------------------------------------------------------------

COOKIE_HEADER = b"! Extended ORPort Auth Cookie !\n"


def write_cookie(path, cookie=None):
    """Write Tor's 64-byte cookie file; returns the 32-byte cookie."""
    cookie = cookie or os.urandom(32)
    with open(path, "wb") as f:
        f.write(COOKIE_HEADER + cookie)
    return cookie


class ExtORPort(EchoServer):
    """Tor's Extended ORPort, server side (ext-orport-spec), then an echo.

    ``answer`` is "OKAY" or "DENY". Each connection appends a dict to
    ``sessions``: client_hash_ok, useraddr, transport, done, error.
    ``finished`` is set each time a session has been recorded completely.
    """

    def __init__(self, cookie, answer="OKAY", host="127.0.0.1"):
        self.cookie, self.answer = cookie, answer
        self.sessions = []
        self.finished = threading.Semaphore(0)
        super().__init__(host, backlog=16)

    def _serve(self, conn):
        session = {"client_hash_ok": None, "useraddr": None, "transport": None,
                   "done": False, "error": None}
        try:
            with conn:
                conn.settimeout(10)
                self._session(conn, session)
        except (OSError, AssertionError) as exc:
            session["error"] = repr(exc)
        finally:
            self.sessions.append(session)
            self.finished.release()

    def _session(self, conn, session):
        # 1. Our authentication types: SAFE_COOKIE (1), end of list (0).
        conn.sendall(b"\x01\x00")
        # 2. The client's choice and ClientNonce.
        chosen = recv_exact(conn, 1)
        assert chosen == b"\x01", "client chose auth type %r" % chosen
        client_nonce = recv_exact(conn, 32)
        # 3. ServerHash | ServerNonce.
        server_nonce = os.urandom(32)
        conn.sendall(_hmac(self.cookie, b"ExtORPort authentication server-to-client hash",
                           client_nonce, server_nonce) + server_nonce)
        # 4. ClientHash, checked; 5. our verdict.
        client_hash = recv_exact(conn, 32)
        session["client_hash_ok"] = hmac.compare_digest(client_hash, _hmac(
            self.cookie, b"ExtORPort authentication client-to-server hash",
            client_nonce, server_nonce))
        conn.sendall(b"\x01" if session["client_hash_ok"] else b"\x00")
        if not session["client_hash_ok"]:
            return
        # 6. Commands until DONE.
        while True:
            kind, length = struct.unpack("!HH", recv_exact(conn, 4))
            body = recv_exact(conn, length) if length else b""
            if kind == 0x0001:
                session["useraddr"] = body.decode()
            elif kind == 0x0002:
                session["transport"] = body.decode()
            elif kind == 0x0000:
                session["done"] = True
                break
        if self.answer != "OKAY":
            conn.sendall(struct.pack("!HH", 0x1001, 0))
            return
        conn.sendall(struct.pack("!HH", 0x1000, 0))
        echo(conn)

    def wait_session(self, timeout=10.0):
        """The next recorded session (after its connection ended)."""
        assert self.finished.acquire(timeout=timeout), "no Extended ORPort session ended"
        return self.sessions[-1]


def _hmac(key, label, client_nonce, server_nonce):
    return hmac.new(key, label + client_nonce + server_nonce, hashlib.sha256).digest()


def client_env(tmp_path, transports="obfs2", **variables):
    settings = {"CLIENT_TRANSPORTS": transports, "EXIT_ON_STDIN_CLOSE": "1"}
    settings.update(variables)
    return tor_env(tmp_path / "client-state", **settings)


def server_env(tmp_path, orport, transports="obfs2", bindaddr=None, **variables):
    """Tor's environment for a server of ``transports`` ("obfs2,obfs4"); ``bindaddr``
    defaults to 127.0.0.1:0 for each of them."""
    if bindaddr is None:
        bindaddr = ",".join("%s-127.0.0.1:0" % name for name in transports.split(","))
    # Like tor 0.4.9: TOR_PT_EXTENDED_SERVER_PORT is always set, empty when unused.
    settings = {"SERVER_TRANSPORTS": transports, "SERVER_BINDADDR": bindaddr,
                "ORPORT": "%s:%d" % orport, "EXTENDED_SERVER_PORT": "",
                "EXIT_ON_STDIN_CLOSE": "1"}
    settings.update(variables)
    return tor_env(tmp_path / "server-state", **settings)


@contextlib.contextmanager
def managed_echo_server(tmp_path, **variables):
    """``obfsproxy.py managed`` as an obfs2 server (``server_env``) in front
    of an echo service; yields the ManagedPT."""
    with EchoServer() as service, ManagedPT(server_env(tmp_path, service.address, **variables)) as pt:
        yield pt


# --- SOCKS5 the way Tor sends a Bridge line's arguments --------------------------------

def socks5_connect_split(proxy_address, target, uname, passwd, timeout=30):
    """SOCKS5 CONNECT with RFC 1929 UNAME and PASSWD given separately (pt-spec 3.5:
    Tor puts the first 255 bytes of the arguments in UNAME and the rest in PASSWD, or a
    single NUL when there is no rest; a transport must join them). Returns
    (socket, CONNECT reply code); the socket is open only when the code is 0."""
    uname, passwd = uname.encode(), passwd.encode()
    assert 1 <= len(uname) <= 255 and 1 <= len(passwd) <= 255
    sock = socket.create_connection(proxy_address, timeout=timeout)
    try:
        sock.sendall(b"\x05\x01\x02")                  # VER=05 NMETHODS=01 METHODS=[02]
        assert recv_exact(sock, 2) == b"\x05\x02"
        sock.sendall(bytes([1, len(uname)]) + uname + bytes([len(passwd)]) + passwd)
        assert recv_exact(sock, 2) == b"\x01\x00", "RFC 1929 authentication refused"
        sock.sendall(socks5_request(target))
        reply = recv_exact(sock, 4)
        recv_exact(sock, {1: 4, 4: 16}.get(reply[3], 0) + 2)
    except BaseException:
        sock.close()
        raise
    if reply[1] != 0:
        sock.close()
    return sock, reply[1]


# --- obfs4 state files (TOR_PT_STATE_LOCATION) ---------------------------------------

OBFS4_STATE, OBFS4_BRIDGE_LINE = "obfs4_state.json", "obfs4_bridgeline.txt"


def obfs4_state(state_dir):
    """(obfs4_state.json as bytes, its fields, the bridge line file's cert and iat-mode)."""
    import json
    raw = (state_dir / OBFS4_STATE).read_bytes()
    line = re.search(r"^Bridge obfs4 <IP ADDRESS>:<PORT> <FINGERPRINT> cert=(\S+) iat-mode=(\d)$",
                     (state_dir / OBFS4_BRIDGE_LINE).read_text(), re.MULTILINE)
    assert line, "no bridge line in %s" % (state_dir / OBFS4_BRIDGE_LINE)
    return raw, json.loads(raw), line.groups()
