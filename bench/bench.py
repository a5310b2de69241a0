#!/usr/bin/env python3
"""bench.py: obfsproxy.py against Debian's obfs4proxy (Go), transport by transport.

Run it from anywhere (it finds obfsproxy.py next to this directory):

    python bench/bench.py --quick      # small and fast (a few minutes): does it all work?
    python bench/bench.py              # the full run: 256 MiB streams, 1,000 connections
    python bench/bench.py --json bench/results/run.json | tee bench/results/run.txt

Other options: --size-mib N, --connections N, --secret-connections N, --tunnels N,
--repeat N, --settle S, --setups NAME,NAME, --phases bulk,setup,tunnels, --skip-obfs4proxy,
--obfsproxy PATH, --profile DIR (``--help`` says what each does). For the setup rows alone:

    python bench/bench.py --phases setup --setups ours-obfs2,o4p-obfs2,ours-obfs4,o4p-obfs4

What runs
---------
Only 127.0.0.1. A sink/echo service runs in its own process (``bench.py _sink``); this
process is the load generator, so the two ends of the test traffic do not share one
interpreter. All setups' tunnel processes are started first; then the setups take turns
in each phase (bulk round 1 for every setup, round 2 ..., then setup rate for every
setup, ...), so that ours and obfs4proxy are measured close together in time; at the
end each is stopped the way it expects (ours: SIGTERM; obfs4proxy: its stdin is closed)::

    generator --SOCKS5--> client ==transport==> server --plain--> sink

    ours-obfsN       python obfsproxy.py client  ->  python obfsproxy.py server, N = 2, 3, 4
                     (obfs4 on the routes installed: PyNaCl's whenever it imports)
    ours-obfs4-portable  the same with OBFSPROXY_CRYPTO=portable: obfs4 on pycryptodome
                     alone, as on a machine without PyNaCl
    o4p-obfsN        obfs4proxy client -> obfs4proxy server (managed mode, TOR_PT_* variables)
    ours-dummy       ours with --transport=dummy: the relay alone, no obfuscation
    direct           no tunnel, generator -> sink: the ceiling of this machine and harness
  and, only when named in --setups:
    ours-to-o4p-obfsN, o4p-to-ours-obfsN   one end each (interoperability under load)
    ours-obfsN-nopool  ours with OBFSPROXY_POOL_SIZE=0: what the handshake pools buy
    ours-webtunnel   python obfsproxy.py client ==TLS==> nginx (tests/nginx.py's configuration,
                     the README's) --> python obfsproxy.py server (plain HTTP) --> sink; the
                     client trusts a test CA (tests/testca.py) through SSL_CERT_FILE
    ours-webtunnel-tls  the same without nginx: our server terminates TLS itself (tls-cert=)
    ours-webtunnel-pyssl  ours-webtunnel with OBFSPROXY_HELLO=python: the client on Python's
                     ssl (ours-webtunnel runs the browser route, curl_cffi, when it is installed)
    nginx-upgrade    the ceiling of ours-webtunnel: nginx alone, same configuration. The
                     generator speaks TLS and the upgrade to nginx itself, and the sink
                     answers the 101. nginx-light has no stream module (Debian ships it in
                     libnginx-mod-stream), so the ceiling is this HTTP upgrade behind the
                     same location, not a plain TCP stream; the run says which it used.

The default run is ours and obfs4proxy for obfs2, obfs3 and obfs4 (iat-mode 0; ours on
both of obfs4_crypto's routes), our dummy and direct. "ours-obfs4" never inherits
OBFSPROXY_CRYPTO from the caller's environment. Our proxies' ports are read from their
"listening on HOST:PORT" log line (an obfs4 server's cert from its "bridge line for
clients" line), obfs4proxy's from its SMETHOD/CMETHOD line (the cert from SMETHOD's ARGS).
SOCKS5 is spoken strictly (greeting, wait for the reply, CONNECT, wait for the reply);
obfs4's cert and iat-mode go to either client as the SOCKS5 username/password, as Tor
sends them (pt-spec 3.5).

What is measured (the rows of the first table)
-----------------------------------------------
bulk      One TCP stream of --size-mib MiB (default 256) upstream (generator -> sink),
          then one downstream, then one each way at the same time ("both": MB/s of the
          two directions added). MB/s means 10^6 bytes per second. The data is a 1 MiB
          random block with the stream tag and a chunk counter written into its first
          8 bytes: free to produce, and any lost, duplicated or reordered chunk changes
          the hash. The receiving end hashes what arrives (SHA-256) and that is compared
          with the sender's digest; a mismatch shows as BAD, never as a speed.
          Each stream runs --repeat times (default 3, --quick 1), interleaved
          (up, down, both, up, ...): the table shows the best MB/s and the median CPU.
CPU s/GiB user+system CPU seconds of the two tunnel processes (/proc/PID/stat) per GiB
          carried ("both" carries 2 x size). "all bulk" adds up the three streams.
          webtunnel setups add nginx to the tunnel processes; "front CPU s/GiB" is
          nginx's part alone (the ceiling's tunnel is nginx only). "both" does not run
          where the generator itself holds the TLS socket (nginx-upgrade): one thread
          may not read an ssl.SSLSocket while another writes it.
          /proc counts in 10 ms ticks: with --quick's 32 MiB streams that is +-0.3 s/GiB
          per reading, so trust CPU figures from full runs only.
          "harness CPU s/GiB" is the same for the generator and the sink: it shows how
          much of the 2 cores the harness itself takes.
setup     --connections (default 1,000) sequential connections, each: TCP connect,
          SOCKS5 greeting and CONNECT, the transport's handshake (every client replies
          only after it), a 16-byte echo through the sink, close. conn/s over all of
          them; p50/p99 of one connection's time in ms; "CPU ms/conn": user+system CPU of
          the tunnel processes over the counted connections, divided by their number
          (10 ms ticks per reading: about +-0.03 ms with 1,000 connections in 10 rounds,
          +-0.3 ms with --quick's 100). The setups take turns in 10
          rounds; 5 warm-up connections are not counted. "secret": obfs2 with
          --shared-secret at the default 100,000 hash iterations, ours only (obfs4proxy
          has no shared-secret mode), with fewer connections (--secret-connections,
          default 50) because each costs both ends 4 x 100,000 SHA-256.
tunnels   --tunnels (default 1,000) tunnels opened at once (SOCKS + handshake + a 1-byte
          echo each; "open s"), then, all still open, every one echoes its own 64 KiB at
          the same time ("echo s"), each checked by SHA-256 ("ok").
memory    RSS of client and server just after start, with all --tunnels tunnels open and
          idle for --settle seconds (default 3: our tunnels quiet for a second give their
          thread back, proxy.PARK_AFTER), and the peak (VmHWM, /proc/PID/status) after
          the bulk streams and over the whole setup (the tunnels' 64 KiB echoes come last).
other processes' CPU %   the CPU that processes outside this benchmark used while this
          setup was being measured, in % of the machine (/proc/stat minus our own
          processes): the noise. The line above the table gives it for the whole run.

For obfs4 the run also measures, before each bulk round and once for each of obfs4's
routes (a child process, ``bench.py _ceiling``, with the environment of "ours-obfs4" and
of "ours-obfs4-portable"): the per-frame ceiling, seal + open of one 1430-byte packet with
the checkout's obfs4_crypto (best of 5, CPU time), i.e. the MB/s a tunnel would reach if
framing, the length masks and the relay cost nothing; one length mask (the hash DRBG,
pure Python on every route) and the ceiling with a mask at each end; and a connected
Obfs4 pair sending and receiving 4 MiB in memory on one core. The routes each measured
process runs (obfs4_crypto.route_report(), and obfs3's modexp) are printed first
("[routes]") and again under the tables.

Without /proc (not Linux) the CPU and memory figures print as n/a.

How to read it
--------------
One ratio table per transport (two for obfs4: one per route) divides ours by
obfs4proxy's and checks the targets (TARGETS): obfs2 and obfs3 bulk up and down >= 1.5x,
CPU per GiB <= 0.6x, setup rate >= 1.0x and p99 no worse, 1,000 concurrent tunnels
byte-exact, idle RSS < 150 MiB per process (obfs3 also <= 0.5x); obfs4 with PyNaCl bulk
>= 0.75x and CPU per GiB <= 1.5x, setup rate >= 0.8x, p99 no worse, RSS <= 0.5x; obfs4
on pycryptodome alone bulk >= 0.28x, CPU per GiB <= 4.0x, setup rate >= 0.5x and p99
<= 1.2x. "setup CPU ms/conn" (shown, not judged) is what the tunnel processes spent on
one sequential setup: on this shared machine the steadier figure. Bulk against the route's
per-frame ceiling is shown, not judged: the ceiling leaves out the length masks, which
cost more than libsodium's box.

Only the ratios within one run mean much. This is a 2-core machine shared with other
people's test runs: absolute figures move a lot between runs, and 4 busy processes
(generator, client, server, sink) already compete for the 2 cores, so the bulk MB/s
is "what is left of 2 cores after the harness", and CPU s/GiB is the steadier figure.
Look at "other processes' CPU %" (the last row) and rerun when it was high. The figures
are for the obfsproxy.py in the working tree at that moment (its git commit and whether
it had local changes are printed).
"""

import argparse
import asyncio
import hashlib
import json
import math
import os
import platform
import queue
import random
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MiB = 1 << 20
GiB = 1 << 30

BLOCK = MiB                                 # size of the repeated random block
HEADER = struct.Struct("!4sQ4x")            # what the generator asks the sink: mode, size
TAG_UP, TAG_DOWN, TAG_ECHO = 1, 2, 3        # stream tags written into every chunk
ECHO_PAYLOAD = 64 * 1024                    # per tunnel in the concurrency test
PING = b"0123456789abcdef"                  # the small echo of the setup test
SOCKET_TIMEOUT = 120.0                      # no single socket operation may block longer
LISTENING = re.compile(r"listening on (\[[0-9a-fA-F:.]+\]|[^ ]+):(\d+)")
SECRET = "bench-shared-secret"
SETUP_ROUNDS = 10                           # the setup test takes turns in this many rounds
PHASES = ("bulk", "setup", "tunnels")       # in this order; --phases picks some
TRANSPORTS = ("obfs2", "obfs3", "obfs4")    # each measured against obfs4proxy's own


# --- Test data ---------------------------------------------------------------------

def _make_block():
    rng = random.Random(0x0BF5)             # deterministic, same in both processes
    return rng.getrandbits(8 * BLOCK).to_bytes(BLOCK, "little")


RANDOM_BLOCK = _make_block()


def chunks(tag, size):
    """The deterministic stream ``tag`` of ``size`` bytes, as memoryviews of at most
    1 MiB. Each view is only valid until the next one is produced (one buffer is
    reused), which suits sendall() and hash.update()."""
    buf = bytearray(RANDOM_BLOCK)
    view = memoryview(buf)
    for number, offset in enumerate(range(0, size, BLOCK)):
        struct.pack_into("!II", buf, 0, tag, number & 0xFFFFFFFF)
        yield view[:min(BLOCK, size - offset)]


def stream_digest(tag, size):
    digest = hashlib.sha256()
    for chunk in chunks(tag, size):
        digest.update(chunk)
    return digest.digest()


def echo_payload(number):
    """Tunnel ``number``'s own 64 KiB for the concurrency test."""
    return struct.pack("!II", TAG_ECHO, number) + RANDOM_BLOCK[8:ECHO_PAYLOAD]


def recv_exact(sock, size):
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes" % (len(data), size))
        data += chunk
    return bytes(data)


def recv_hashed(sock, size, buffer):
    """Receive exactly ``size`` bytes into ``buffer`` (reused), returning their SHA-256."""
    digest = hashlib.sha256()
    view = memoryview(buffer)
    left = size
    while left:
        got = sock.recv_into(view, min(left, len(view)))
        if not got:
            raise ConnectionError("closed with %d of %d bytes missing" % (left, size))
        digest.update(view[:got])
        left -= got
    return digest.digest()


def send_stream(sock, tag, size):
    for chunk in chunks(tag, size):
        sock.sendall(chunk)


def wait_eof(sock):
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


# --- The sink / echo service (a separate process: `bench.py _sink`) ------------------
#
# Each connection starts with HEADER (mode, size), then:
#   b"UP  "  the sink receives `size` bytes and answers their SHA-256 (32 bytes);
#   b"DOWN"  the sink sends the stream TAG_DOWN of `size` bytes;
#   b"BOTH"  both at once: sends TAG_DOWN while receiving, then the received SHA-256;
#   b"ECHO"  the sink echoes everything until EOF.
# It then waits for the generator to close: obfs4proxy has no half-close, so nobody
# closes before the other side has read everything.
# A connection that starts with "GET " comes through nginx with no webtunnel server
# behind it (nginx-upgrade): the sink answers the upgrade with webtunnel's 101 first.

SWITCHING_PROTOCOLS = (b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n"
                       b"Upgrade: websocket\r\n\r\n")


def read_header(conn):
    """HEADER's (mode, size), after answering an HTTP upgrade if the connection has one."""
    start = recv_exact(conn, 4)
    if start == b"GET ":
        head = start
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk or len(head) > 16384:
                raise ConnectionError("not an upgrade request")
            head += chunk
        conn.sendall(SWITCHING_PROTOCOLS)
        start = head.partition(b"\r\n\r\n")[2]  # the generator sends nothing before the 101
    return HEADER.unpack(start + recv_exact(conn, HEADER.size - len(start)))


def sink_serve(conn):
    try:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.settimeout(SOCKET_TIMEOUT * 2)
        mode, size = read_header(conn)
        if mode == b"ECHO":
            buffer = bytearray(ECHO_PAYLOAD)    # small: 1,000 of these run at once
            view = memoryview(buffer)
            while True:
                got = conn.recv_into(view)
                if not got:
                    return
                conn.sendall(view[:got])
        elif mode == b"UP  ":
            conn.sendall(recv_hashed(conn, size, bytearray(BLOCK)))
        elif mode == b"DOWN":
            send_stream(conn, TAG_DOWN, size)
        elif mode == b"BOTH":
            sender = threading.Thread(target=send_stream, args=(conn, TAG_DOWN, size), daemon=True)
            sender.start()
            digest = recv_hashed(conn, size, bytearray(BLOCK))
            sender.join()
            conn.sendall(digest)
        else:
            return
        wait_eof(conn)
    except OSError:
        pass
    finally:
        conn.close()


def sink_main():
    """Serve each connection on a thread, reusing idle ones: starting a thread per
    connection put about a millisecond of the sink's own latency (and its noise) into
    every sequential setup measured through it."""
    threading.stack_size(256 * 1024)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    print("SINK %s:%d" % listener.getsockname(), flush=True)

    def exit_on_stdin_eof():
        sys.stdin.read()
        os._exit(0)
    threading.Thread(target=exit_on_stdin_eof, daemon=True).start()
    jobs, idle, lock = queue.SimpleQueue(), [0], threading.Lock()

    def worker(conn):
        while True:
            sink_serve(conn)
            with lock:
                idle[0] += 1
            conn = jobs.get()

    while True:
        conn, _ = listener.accept()
        with lock:
            reuse = idle[0] > 0
            if reuse:
                idle[0] -= 1
        if reuse:
            jobs.put(conn)
        else:
            threading.Thread(target=worker, args=(conn,), daemon=True).start()


# --- /proc readings (None where there is no /proc) ---------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pids):
    """User + system CPU seconds of all ``pids`` together (all their threads)."""
    total = 0.0
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS   # utime, stime
    return total


def memory_mib(pid, field):
    """VmRSS or VmHWM of ``pid`` in MiB."""
    try:
        with open("/proc/%d/status" % pid) as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def load_average():
    try:
        return "%.2f %.2f %.2f" % os.getloadavg()
    except (OSError, AttributeError):
        return "n/a"


def raise_fd_limit():
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        return None


# --- Child processes ---------------------------------------------------------------------

class Lines:
    """Reads a child's text stream on a thread, keeping the last lines for errors."""

    def __init__(self, stream):
        self.recent = []
        self._queue = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream):
        for line in stream:
            line = line.rstrip("\r\n")
            self.recent = (self.recent + [line])[-20:]
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern, fail=None, timeout=30.0):
        end = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise RuntimeError("no line matching %r within %.0f s; last lines: %r"
                                   % (pattern.pattern, timeout, self.recent))
            if line is None:
                raise RuntimeError("the process ended; last lines: %r" % self.recent)
            if fail is not None and fail.search(line):
                raise RuntimeError("the process said: %s" % line)
            match = pattern.search(line)
            if match:
                return match


class Child:
    """A started process (ours, obfs4proxy, the sink) and the address it listens on."""

    running = set()              # every Child not yet stopped, for the CPU accounting

    def __init__(self, label, process, address, output, stop_by_stdin, args=None):
        self.label, self.process, self.address = label, process, address
        self.output, self.stop_by_stdin = output, stop_by_stdin
        self.args = args or {}     # a server's arguments for its clients (obfs4: cert, iat-mode)
        Child.running.add(self)

    @property
    def pid(self):
        return self.process.pid

    def stop(self, timeout=15.0):
        """Stop it the way it expects; return its exit status."""
        if self.process.poll() is None:
            if self.stop_by_stdin:
                self.process.stdin.close()
            else:
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        Child.running.discard(self)
        return self.process.returncode


BRIDGE_LINE = re.compile(r"bridge line for clients: Bridge (.*)$")


def start_ours(program, role, transport, dest=None, extra=(), state_dir=None, env=None):
    """Our client or server. An obfs4 server gets --state-dir, and its bridge line's
    arguments (cert=..., iat-mode=0) become the Child's ``args``."""
    argv = [sys.executable, program, role, "--transport=" + transport]
    if dest is not None:
        argv.append("--dest=%s:%d" % dest)
    if role == "server" and transport == "obfs4":
        argv.append("--state-dir=" + os.path.join(state_dir, "ours-server-state"))
    argv += list(extra) + ["127.0.0.1:0"]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=env,
                               cwd=os.path.dirname(os.path.abspath(program)))
    output = Lines(process.stderr)
    args = {}
    try:
        match = output.wait_for(LISTENING)
        if role == "server" and transport == "obfs4":
            line = output.wait_for(BRIDGE_LINE).group(1)
            args = dict(word.split("=", 1) for word in line.split() if "=" in word)
    except RuntimeError:
        process.kill()
        process.wait()
        raise
    return Child("ours " + role, process, (match.group(1).strip("[]"), int(match.group(2))),
                 output, stop_by_stdin=False, args=args)


O4P_FAIL = re.compile(r"^(SMETHOD-ERROR|CMETHOD-ERROR|ENV-ERROR|VERSION-ERROR|PROXY-ERROR)")


def start_obfs4proxy(binary, role, transport, state_dir, orport=None):
    """obfs4proxy in managed mode; a server's SMETHOD ARGS (obfs4: cert, iat-mode)
    become the Child's ``args``."""
    env = dict(os.environ, TOR_PT_MANAGED_TRANSPORT_VER="1", TOR_PT_EXIT_ON_STDIN_CLOSE="1",
               TOR_PT_STATE_LOCATION=os.path.join(state_dir, "o4p-%s-%s-state" % (transport, role)))
    if role == "server":
        env.update(TOR_PT_SERVER_TRANSPORTS=transport,
                   TOR_PT_SERVER_BINDADDR="%s-127.0.0.1:0" % transport,
                   TOR_PT_ORPORT="%s:%d" % orport)
        ready = re.compile(r"^SMETHOD %s (\S+):(\d+)(?: ARGS:(\S*))?" % transport)
    else:
        env.update(TOR_PT_CLIENT_TRANSPORTS=transport)
        ready = re.compile(r"^CMETHOD %s socks5 (\S+):(\d+)" % transport)
    process = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)
    output = Lines(process.stdout)
    try:
        match = output.wait_for(ready, fail=O4P_FAIL)
    except RuntimeError:
        process.kill()
        process.wait()
        raise
    args = {}
    if role == "server" and match.group(3):
        args = dict(item.split("=", 1) for item in match.group(3).split(","))
    return Child("obfs4proxy " + role, process, (match.group(1), int(match.group(2))),
                 output, stop_by_stdin=True, args=args)


def start_sink():
    process = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_sink"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    output = Lines(process.stdout)
    match = output.wait_for(re.compile(r"^SINK (\S+):(\d+)"))
    return Child("sink", process, (match.group(1), int(match.group(2))), output,
                 stop_by_stdin=True)


# --- Reaching the sink: directly or through a SOCKS5 client ---------------------------------

def socks5_request(target):
    host, port = target
    return b"\x05\x01\x00\x01" + socket.inet_aton(host) + struct.pack("!H", port)


def socks5_reply_rest(head):
    if head[0] != 5:
        raise ConnectionError("not a SOCKS5 reply: %r" % head)
    if head[1] != 0:
        raise ConnectionError("SOCKS5 reply code 0x%02x" % head[1])
    if head[3] not in (1, 4):
        raise ConnectionError("SOCKS5 reply with address type %d" % head[3])
    return {1: 4, 4: 16}[head[3]] + 2          # the bound address and port: ignored


def socks5_auth(args):
    """The pt-spec 3.5 way to pass a bridge's arguments: "k=v;k=v" as the RFC 1929
    username (its first 255 bytes) and password (the rest, or one NUL)."""
    raw = ";".join("%s=%s" % item for item in sorted(args.items())).encode()
    user, password = raw[:255], raw[255:] or b"\0"
    return bytes([1, len(user)]) + user + bytes([len(password)]) + password


class Route:
    """How the generator reaches the sink: TCP to ``first_hop``; if ``target`` is set,
    first_hop is a SOCKS5 client and ``target`` the server to CONNECT to, with the
    server's ``args`` (obfs4: cert, iat-mode) as SOCKS5 username/password."""

    threads = True      # a socket that one thread may read while another writes

    def __init__(self, first_hop, target=None, args=None):
        self.first_hop, self.target, self.args = first_hop, target, args or {}

    def connect(self):
        sock = socket.create_connection(self.first_hop, timeout=SOCKET_TIMEOUT)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.target is not None:
                method = b"\x02" if self.args else b"\x00"
                sock.sendall(b"\x05\x01" + method)           # greeting: one method
                if recv_exact(sock, 2) != b"\x05" + method:
                    raise ConnectionError("SOCKS5 greeting refused")
                if self.args:
                    sock.sendall(socks5_auth(self.args))
                    if recv_exact(sock, 2) != b"\x01\x00":
                        raise ConnectionError("SOCKS5 arguments refused")
                sock.sendall(socks5_request(self.target))
                recv_exact(sock, socks5_reply_rest(recv_exact(sock, 4)))
        except BaseException:
            sock.close()
            raise
        return sock

    async def open(self):
        reader, writer = await asyncio.open_connection(*self.first_hop)
        try:
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.target is not None:
                method = b"\x02" if self.args else b"\x00"
                writer.write(b"\x05\x01" + method)
                if await reader.readexactly(2) != b"\x05" + method:
                    raise ConnectionError("SOCKS5 greeting refused")
                if self.args:
                    writer.write(socks5_auth(self.args))
                    if await reader.readexactly(2) != b"\x01\x00":
                        raise ConnectionError("SOCKS5 arguments refused")
                writer.write(socks5_request(self.target))
                await reader.readexactly(socks5_reply_rest(await reader.readexactly(4)))
        except BaseException:
            writer.close()
            raise
        return reader, writer


class UpgradeRoute(Route):
    """nginx-upgrade: TLS to nginx (the test CA trusted, SNI wt.test), the upgrade of
    webtunnel's secret path, then the sink's protocol inside TLS. ``threads`` is False:
    the socket is an ssl.SSLSocket, which bulk_both would read and write from two threads."""

    threads = False

    def __init__(self, front, ca_file):
        Route.__init__(self, front.address)
        self.front = front
        self.context = ssl.create_default_context(cafile=ca_file)
        self.request = (b"GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: Go-http-client/1.1\r\n"
                        b"Connection: upgrade\r\nUpgrade: websocket\r\n\r\n"
                        % (front.path.encode(), WEBTUNNEL_NAME.encode()))

    @staticmethod
    def check(head):
        if not head.startswith(b"HTTP/1.1 101 "):
            raise ConnectionError("nginx answered %r, not 101" % head[:80])

    def connect(self):
        sock = Route.connect(self)
        try:
            sock = self.context.wrap_socket(sock, server_hostname=WEBTUNNEL_NAME)
            sock.sendall(self.request)
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    raise ConnectionError("nginx closed before its answer to the upgrade")
                head += chunk
            self.check(head)
        except BaseException:
            sock.close()
            raise
        return sock

    async def open(self):
        reader, writer = await asyncio.open_connection(*self.first_hop, ssl=self.context,
                                                       server_hostname=WEBTUNNEL_NAME)
        try:
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            writer.write(self.request)
            self.check(await reader.readuntil(b"\r\n\r\n"))
        except BaseException:
            writer.close()
            raise
        return reader, writer


# --- Measurements ----------------------------------------------------------------------------

class Digests:
    """The senders' digests of the bulk streams, computed once before timing."""

    def __init__(self, size):
        self.up = stream_digest(TAG_UP, size)
        self.down = stream_digest(TAG_DOWN, size)


def bulk_up(route, size, digests, buffer):
    with route.connect() as sock:
        start = time.perf_counter()
        sock.sendall(HEADER.pack(b"UP  ", size))
        send_stream(sock, TAG_UP, size)
        digest = recv_exact(sock, 32)
        elapsed = time.perf_counter() - start
    return elapsed, digest == digests.up, size


def bulk_down(route, size, digests, buffer):
    with route.connect() as sock:
        start = time.perf_counter()
        sock.sendall(HEADER.pack(b"DOWN", size))
        digest = recv_hashed(sock, size, buffer)
        elapsed = time.perf_counter() - start
    return elapsed, digest == digests.down, size


def bulk_both(route, size, digests, buffer):
    with route.connect() as sock:
        failure = []

        def send():
            try:
                send_stream(sock, TAG_UP, size)
            except OSError as exc:
                failure.append(exc)
        start = time.perf_counter()
        sock.sendall(HEADER.pack(b"BOTH", size))
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        down = recv_hashed(sock, size, buffer)
        up = recv_exact(sock, 32)               # the sink's digest of what it received
        elapsed = time.perf_counter() - start
        sender.join()
        if failure:
            raise failure[0]
    return elapsed, down == digests.down and up == digests.up, 2 * size


BULK = (("up", bulk_up), ("down", bulk_down), ("both", bulk_both))


class Bulk:
    """One setup's bulk streams, gathered over the rounds: best MB/s, median CPU."""

    def __init__(self):
        self.speeds, self.cpus, self.bad = {}, {}, set()
        self.tunnel_cpu = self.harness_cpu = self.front_cpu = self.moved = 0.0
        self.harness_known = True

    def round(self, route, size, digests, tunnel_pids, harness_pids, say, front_pids=()):
        """Up, down and both, once each (both only where ``route.threads``). ``front_pids``
        (nginx), also among ``tunnel_pids``, are measured apart too."""
        buffer = bytearray(BLOCK)
        for name, run in BULK:
            if name == "both" and not route.threads:
                continue
            tunnel_before, harness_before = cpu_seconds(tunnel_pids), cpu_seconds(harness_pids)
            front_before = cpu_seconds(front_pids)
            elapsed, exact, moved = run(route, size, digests, buffer)
            tunnel_after, harness_after = cpu_seconds(tunnel_pids), cpu_seconds(harness_pids)
            front_after = cpu_seconds(front_pids)
            if not exact:
                self.bad.add(name)
                say("bulk %s: SHA-256 MISMATCH" % name)
                continue
            self.speeds.setdefault(name, []).append(moved / elapsed / 1e6)
            self.moved += moved
            cpu = None
            if tunnel_pids and None not in (tunnel_before, tunnel_after):
                cpu = (tunnel_after - tunnel_before) / (moved / GiB)
                self.cpus.setdefault(name, []).append(cpu)
                self.tunnel_cpu += tunnel_after - tunnel_before
            if None in (harness_before, harness_after):
                self.harness_known = False
            else:
                self.harness_cpu += harness_after - harness_before
            if front_pids and None not in (front_before, front_after):
                self.front_cpu += front_after - front_before
            say("bulk %-4s %7.1f MB/s  %s CPU s/GiB  (SHA-256 ok)"
                % (name, self.speeds[name][-1], fmt(cpu, 2)))

    def figures(self):
        result = {}
        for name, _ in BULK:
            if name in self.bad:
                result[name + "_mbs"] = "BAD"
            elif name in self.speeds:
                result[name + "_mbs"] = max(self.speeds[name])
            if name in self.cpus:
                result[name + "_cpu"] = median(self.cpus[name])
        if self.moved:
            if self.cpus:
                result["bulk_cpu"] = self.tunnel_cpu / (self.moved / GiB)
            if self.harness_known:
                result["harness_cpu"] = self.harness_cpu / (self.moved / GiB)
            if self.front_cpu:
                result["front_cpu"] = self.front_cpu / (self.moved / GiB)
        return result


def one_echo(route):
    with route.connect() as sock:
        sock.sendall(HEADER.pack(b"ECHO", 0) + PING)
        if recv_exact(sock, len(PING)) != PING:
            raise ConnectionError("the echo came back different")


class Sequential:
    """Sequential connections (connect, SOCKS, handshake, echo, close), possibly in
    several rounds: conn/s over all of them, p50 and p99 of one in ms, and the CPU
    the tunnel processes ``pids`` spent on each, in ms (None without /proc)."""

    def __init__(self):
        self.times, self.elapsed, self.cpu = [], 0.0, 0.0

    def round(self, route, count, warmup=0, pids=()):
        for _ in range(warmup):
            one_echo(route)
        before = cpu_seconds(pids) if pids else None
        start = time.perf_counter()
        for _ in range(count):
            began = time.perf_counter()
            one_echo(route)
            self.times.append(time.perf_counter() - began)
        self.elapsed += time.perf_counter() - start
        after = cpu_seconds(pids) if pids else None
        if self.cpu is not None:
            self.cpu = None if None in (before, after) else self.cpu + after - before

    def figures(self, prefix):
        ordered = sorted(self.times)
        if not ordered:
            return {}
        result = {prefix + "rate": len(ordered) / self.elapsed,
                  prefix + "p50": percentile(ordered, 50) * 1000,
                  prefix + "p99": percentile(ordered, 99) * 1000, prefix + "n": len(ordered)}
        if self.cpu is not None:
            result[prefix + "cpu"] = self.cpu / len(ordered) * 1000
        return result


def measure_tunnels(route, count, tunnel_pids, settle, say):
    """Open ``count`` tunnels at once; read RSS while they are idle; then all echo."""
    async def run():
        opened = asyncio.Event()
        go = asyncio.Event()
        state = {"finished_opening": 0}

        def one_opened():
            state["finished_opening"] += 1
            if state["finished_opening"] == count:
                opened.set()

        async def tunnel(number):
            writer = None
            try:
                try:
                    reader, writer = await route.open()
                    writer.write(HEADER.pack(b"ECHO", 0) + b"x")
                    await reader.readexactly(1)
                finally:
                    one_opened()
                await go.wait()
                payload = echo_payload(number)
                writer.write(payload)
                await writer.drain()
                echoed = await reader.readexactly(len(payload))
                return hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
            finally:
                if writer is not None:
                    writer.close()

        tasks = [asyncio.ensure_future(asyncio.wait_for(tunnel(n), SOCKET_TIMEOUT * 2))
                 for n in range(count)]
        start = time.perf_counter()
        await opened.wait()
        open_time = time.perf_counter() - start
        await asyncio.sleep(settle)
        idle = [memory_mib(pid, "VmRSS") for pid in tunnel_pids]
        start = time.perf_counter()
        go.set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        echo_time = time.perf_counter() - start
        return open_time, idle, echo_time, outcomes

    open_time, idle, echo_time, outcomes = asyncio.run(run())
    good = sum(1 for outcome in outcomes if outcome is True)
    bad = sum(1 for outcome in outcomes if outcome is False)
    errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if bad or errors:
        kinds = sorted({type(exc).__name__ + (": %s" % exc if str(exc) else "") for exc in errors})
        say("tunnels: %d mismatched, %d failed (%s)" % (bad, len(errors), "; ".join(kinds[:3])))
    result = {"open_s": open_time, "echo_s": echo_time, "ok": "%d/%d" % (good, count),
              "all_ok": good == count}
    if len(idle) == 2:
        result["idle_rss_client"], result["idle_rss_server"] = idle
    return result


def percentile(ordered, p):
    """Nearest-rank percentile of a sorted list."""
    return ordered[max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))]


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


# --- Setups ------------------------------------------------------------------------------------

# name: (client, server, transport); "ours" or "o4p", None for no tunnel. The default
# run: each transport ours against obfs4proxy's, plus our dummy and no tunnel at all.
SETUPS = {"direct": (None, None, None), "ours-dummy": ("ours", "ours", "dummy")}
for _transport in TRANSPORTS:
    SETUPS.update({
        "ours-%s" % _transport: ("ours", "ours", _transport),
        "o4p-%s" % _transport: ("o4p", "o4p", _transport),
        "ours-to-o4p-%s" % _transport: ("ours", "o4p", _transport),
        "o4p-to-ours-%s" % _transport: ("o4p", "ours", _transport),
        # ours with the handshake pools off (OBFSPROXY_POOL_SIZE=0): what they buy
        "ours-%s-nopool" % _transport: ("ours", "ours", _transport),
    })
# obfs4 on pycryptodome alone (OBFSPROXY_CRYPTO=portable: PyNaCl ignored); "ours-obfs4"
# runs what is installed (PyNaCl's routes when it imports).
SETUPS["ours-obfs4-portable"] = ("ours", "ours", "obfs4")
# webtunnel, only when named: ours through nginx, ours terminating TLS, and nginx alone.
SETUPS.update({"ours-webtunnel": ("ours", "ours", "webtunnel"),
               "ours-webtunnel-tls": ("ours", "ours", "webtunnel"),
               "ours-webtunnel-pyssl": ("ours", "ours", "webtunnel"),
               "nginx-upgrade": ("nginx", "nginx", None)})
WEBTUNNEL_PATH = "/bench-k7Qm2Zx1c1b00b6"
WEBTUNNEL_NAME = "wt.test"        # the test CA's leaf (tests/testca.py)
DEFAULT_SETUPS = ["ours-obfs2", "o4p-obfs2", "ours-obfs3", "o4p-obfs3", "ours-obfs4", "ours-obfs4-portable",
                  "o4p-obfs4", "ours-dummy", "direct"]
CRYPTO_ENV = "OBFSPROXY_CRYPTO"     # obfs4_crypto: "portable" ignores PyNaCl
HELLO_ENV = "OBFSPROXY_HELLO"       # browser_tls: "python" ignores curl_cffi


def ours_environment(name):
    """The environment of our processes for setup ``name``: OBFSPROXY_POOL_SIZE=0 for
    -nopool; OBFSPROXY_CRYPTO=portable for -portable, and no OBFSPROXY_CRYPTO at all
    otherwise (so that "ours-obfs4" runs PyNaCl whenever it is installed)."""
    env = {key: value for key, value in os.environ.items() if key not in (CRYPTO_ENV, HELLO_ENV)}
    if name.endswith("-pyssl"):
        env[HELLO_ENV] = "python"
    if name.endswith("-nopool"):
        env["OBFSPROXY_POOL_SIZE"] = "0"
    if name.endswith("-portable"):
        env[CRYPTO_ENV] = "portable"
    return env


def test_helpers():
    """tests/testca.py and tests/nginx.py (the nginx configuration the README gives)."""
    tests = os.path.join(ROOT, "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import nginx
    import testca
    return nginx, testca


def start_nginx(directory, backend, ca):
    """nginx (tests/nginx.py) before ``backend`` on the secret path, as a Child."""
    nginx, _ = test_helpers()
    front = nginx.Nginx(os.path.join(directory, "nginx"), backend, ca.cert_file, ca.key_file,
                        path=WEBTUNNEL_PATH, server_name=WEBTUNNEL_NAME)
    child = Child("nginx", front.process, front.address, None, stop_by_stdin=False)
    child.front = front
    return child


def start_webtunnel(options, name, sink, directory):
    """ours-webtunnel (nginx before our server) or ours-webtunnel-tls (our server's own
    TLS): ([client, server], nginx Child or None, the client's SOCKS arguments)."""
    _, testca = test_helpers()
    ca = testca.make_ca(os.path.join(directory, "ca"))
    url = "https://%s%s" % (WEBTUNNEL_NAME, WEBTUNNEL_PATH)
    server_options = "url=" + url
    if name == "ours-webtunnel-tls":
        server_options += ";tls-cert=%s;tls-key=%s" % (ca.cert_file, ca.key_file)
    env = dict(ours_environment(name), SSL_CERT_FILE=ca.ca_file)
    started, front = [], None
    try:
        started.append(start_ours(options.obfsproxy, "server", "webtunnel", sink,
                                  ["--transport-options=" + server_options], env=env))
        if name != "ours-webtunnel-tls":
            front = start_nginx(directory, started[0].address, ca)
            dial = front.address
        else:
            dial = started[0].address
        started.insert(0, start_ours(options.obfsproxy, "client", "webtunnel", env=env))
    except BaseException:
        for child in started + ([front] if front else []):
            child.stop()
        raise
    args = {"url": "https://127.0.0.1:%d%s" % (dial[1], WEBTUNNEL_PATH), "servername": WEBTUNNEL_NAME}
    return started, front, args


def start_pair(options, client_kind, server_kind, transport, sink, state_dir, extra=(), env=None):
    """Start the server (forwarding to the sink), then the client. Returns [client, server]."""
    started = []
    try:
        if server_kind == "ours":
            started.append(start_ours(options.obfsproxy, "server", transport, sink, extra,
                                      state_dir=state_dir, env=env))
        else:
            started.append(start_obfs4proxy(options.obfs4proxy, "server", transport, state_dir, sink))
        if client_kind == "ours":
            started.insert(0, start_ours(options.obfsproxy, "client", transport, extra=extra,
                                         env=env))
        else:
            started.insert(0, start_obfs4proxy(options.obfs4proxy, "client", transport, state_dir))
    except BaseException:
        for child in started:
            child.stop()
        raise
    return started


class Setup:
    """One setup: its two tunnel processes (none for "direct"), how to reach the sink
    through them, and its figures. Every setup is started first and they take turns
    in each phase, so that ours and obfs4proxy are measured close together in time."""

    def __init__(self, name, options, sink, meter):
        self.name, self.options, self.sink, self.meter = name, options, sink, meter
        self.client_kind, self.server_kind, self.transport = SETUPS[name]
        self.result = {"errors": [], "failed": []}
        self.children, self.pids = [], []
        self.front = None            # webtunnel's nginx: a tunnel process, not client or server
        self.route = None
        self.bulk = Bulk()
        self.sequential = Sequential()
        self.other = [0.0, 0.0]      # CPU seconds used by other processes; CPU seconds available

    def say(self, text):
        print("[%s] %s" % (self.name, text), file=sys.stderr, flush=True)

    def start(self, state_dir):
        args = None
        try:
            if self.client_kind is None:
                self.route = Route(self.sink.address)
                return
            os.makedirs(state_dir, exist_ok=True)
            if self.name == "nginx-upgrade":
                ca = test_helpers()[1].make_ca(os.path.join(state_dir, "ca"))
                self.front = start_nginx(state_dir, self.sink.address, ca)
                self.route = UpgradeRoute(self.front.front, ca.ca_file)
                return
            if self.transport == "webtunnel":
                # The SOCKS target is a placeholder: webtunnel dials url='s host.
                self.children, self.front, args = start_webtunnel(self.options, self.name,
                                                                  self.sink.address, state_dir)
            else:
                self.children = start_pair(self.options, self.client_kind, self.server_kind,
                                           self.transport, self.sink.address, state_dir,
                                           env=ours_environment(self.name))
        except Exception as exc:
            self.fail("start", exc)
            return
        self.route = Route(self.children[0].address, self.children[1].address,
                           args if args is not None else self.children[1].args)
        self.pids = [child.pid for child in self.children]
        self.result["start_rss_client"] = memory_mib(self.pids[0], "VmRSS")
        self.result["start_rss_server"] = memory_mib(self.pids[1], "VmRSS")

    def fail(self, phase, exc):
        self.result["failed"].append(phase)
        self.result["errors"].append("%s: %s: %s" % (phase, type(exc).__name__, exc))
        self.say("%s FAILED: %s: %s" % (phase, type(exc).__name__, exc))

    def measure(self, phase, work, label=None, profile=True):
        """Run ``work()`` (returns a dict of figures), counting other processes' CPU
        meanwhile, under py-spy if --profile; a failure is recorded, not raised."""
        if self.route is None or phase in self.result["failed"]:
            return {}
        profiler = None
        if profile and self.options.profile and self.client_kind == self.server_kind == "ours":
            profiler = Profiler(self.options.profile, self.name, label or phase, self.children)
        before = self.meter.snapshot()
        try:
            if profiler:
                profiler.start()
            figures = work() or {}
        except Exception as exc:
            self.fail(phase, exc)
            figures = {}
        finally:
            if profiler:
                profiler.stop(self.say)
        other, available = self.meter.other_since(before)
        self.other[0] += other
        self.other[1] += available
        self.result.update(figures)
        return figures

    @property
    def tunnel_pids(self):
        """The processes a tunnel costs: client and server, and nginx where there is one."""
        return self.pids + ([self.front.pid] if self.front else [])

    def bulk_round(self, digests, number):
        harness = [os.getpid(), self.sink.pid]
        front = [self.front.pid] if self.front else []
        self.measure("bulk", lambda: self.bulk.round(self.route, self.options.size, digests,
                                                     self.tunnel_pids, harness, self.say, front),
                     label="bulk" if self.options.repeat == 1 else "bulk%d" % number)

    def bulk_done(self):
        self.result.update(self.bulk.figures())
        if self.pids:
            self.result["bulk_hwm_client"] = memory_mib(self.pids[0], "VmHWM")
            self.result["bulk_hwm_server"] = memory_mib(self.pids[1], "VmHWM")

    def setup_round(self, count, warmup):
        self.measure("setup", lambda: self.sequential.round(self.route, count, warmup,
                                                            self.tunnel_pids))

    def setup_done(self):
        if "setup" in self.result["failed"]:
            return
        figures = self.sequential.figures("setup_")
        self.result.update(figures)
        if figures:
            self.say("setup %.0f conn/s, p50 %.2f ms, p99 %.2f ms, %s ms CPU each (%d connections)"
                     % (figures["setup_rate"], figures["setup_p50"], figures["setup_p99"],
                        fmt(figures.get("setup_cpu"), 2), figures["setup_n"]))

    def secret_rate(self):
        """Setup with a shared secret: a separate pair of our processes."""
        def work():
            children = start_pair(self.options, "ours", "ours", "obfs2", self.sink.address, None,
                                  extra=["--shared-secret=" + SECRET])
            try:
                sequential = Sequential()
                sequential.round(Route(children[0].address, children[1].address),
                                 self.options.secret_connections, warmup=1)
                return sequential.figures("secret_")
            finally:
                for child in children:
                    child.stop()
        figures = self.measure("secret", work, profile=False)     # other processes
        if figures:
            self.say("secret setup %.2f conn/s, p50 %.0f ms, p99 %.0f ms (%d connections)"
                     % (figures["secret_rate"], figures["secret_p50"], figures["secret_p99"],
                        figures["secret_n"]))

    def tunnels(self):
        figures = self.measure("tunnels", lambda: measure_tunnels(
            self.route, self.options.tunnels, self.pids, self.options.settle, self.say))
        if figures:
            self.say("tunnels: %d opened in %.2f s, idle RSS %s / %s MiB, echo %s in %.2f s"
                     % (self.options.tunnels, figures["open_s"],
                        fmt(figures.get("idle_rss_client"), 1), fmt(figures.get("idle_rss_server"), 1),
                        figures["ok"], figures["echo_s"]))

    def stop(self):
        if self.pids:
            self.result["peak_rss_client"] = memory_mib(self.pids[0], "VmHWM")
            self.result["peak_rss_server"] = memory_mib(self.pids[1], "VmHWM")
        codes = [(child.label, child.stop()) for child in self.children + [self.front] if child]
        bad = ["%s exited with %s" % code for code in codes if code[1] != 0]
        if bad:
            self.result["errors"].append("stop: " + "; ".join(bad))
            self.say("; ".join(bad))
        if self.other[1]:
            self.result["other_cpu"] = 100 * self.other[0] / self.other[1]
        return self.result


class Meter:
    """The CPU that processes outside this benchmark take: the machine's busy time
    (/proc/stat) minus ours (this process, its children alive or waited for). That
    is the noise in the figures. None where there is no /proc."""

    def snapshot(self):
        times = os.times()
        own = times.user + times.system + times.children_user + times.children_system
        for child in list(Child.running):
            own += cpu_seconds([child.pid]) or 0.0
        return time.monotonic(), machine_busy(), own

    def other_since(self, before):
        """(CPU seconds others used, CPU seconds the machine had) since ``before``."""
        after = self.snapshot()
        if before[1] is None or after[1] is None:
            return 0.0, 0.0
        wall, busy, own = (b - a for a, b in zip(before, after))
        return max(0.0, busy - own), wall * (os.cpu_count() or 1)


def machine_busy():
    """Busy CPU seconds of all CPUs since boot, from /proc/stat, or None."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(field) for field in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


class Profiler:
    """--profile: py-spy samples our client and server during one phase.

    How to read its summary: py-spy sees Python frames only, so time in C (AES,
    send/recv/poll system calls) counts as "own" time of the Python function that
    called it. Idle threads are not sampled, but a thread that is ready to run and
    waiting for a CPU is: on a loaded machine that inflates where threads wake up
    (select). The collapsed stacks in DIR have the detail (flamegraph.pl reads them).
    """

    def __init__(self, directory, setup, phase, children):
        self.directory, self.setup, self.phase, self.children = directory, setup, phase, children
        self.spies = []

    def start(self):
        spy = shutil.which("py-spy")
        if spy is None:
            raise RuntimeError("--profile needs py-spy (pip install py-spy)")
        os.makedirs(self.directory, exist_ok=True)
        for child in self.children:
            path = os.path.join(self.directory, "%s-%s-%s.txt"
                                % (self.setup, self.phase, child.label.split()[-1]))
            process = subprocess.Popen([spy, "record", "--pid", str(child.pid), "--format", "raw",
                                        "--function", "--nonblocking", "--rate", "250",
                                        "--output", path],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.spies.append((child, path, process))
        time.sleep(1.0)                        # let py-spy attach

    def stop(self, say):
        for child, path, process in self.spies:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            say("py-spy, %s, %s phase (%s): top functions by own samples"
                % (child.label, self.phase, path))
            for line in profile_summary(path):
                say("    " + line)


def profile_summary(path, top=12):
    """Own ("self") and total samples per function from py-spy's collapsed stacks."""
    own, total, samples = {}, {}, 0
    try:
        with open(path) as collapsed:
            for line in collapsed:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                count = int(count)
                frames = [re.sub(r" \(.*/", " (", frame) for frame in stack.split(";")]
                if frames and frames[0].startswith("process "):
                    frames = frames[1:]
                if not frames:
                    continue
                samples += count
                own[frames[-1]] = own.get(frames[-1], 0) + count
                for frame in set(frames):
                    total[frame] = total.get(frame, 0) + count
    except OSError as exc:
        return ["(no profile: %s)" % exc]
    if not samples:
        return ["(no samples)"]
    lines = ["%6s %6s  %s" % ("own%", "total%", "function")]
    for frame, count in sorted(own.items(), key=lambda item: -item[1])[:top]:
        lines.append("%5.1f%% %5.1f%%  %s" % (100 * count / samples, 100 * total[frame] / samples, frame))
    return lines


# --- Report ----------------------------------------------------------------------------------------

def fmt(value, digits=1):
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    return "%.*f" % (digits, value)


def table(header, rows):
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    line = lambda row: "  ".join(str(cell).ljust(widths[0]) if i == 0 else str(cell).rjust(widths[i])
                                 for i, cell in enumerate(row))
    return "\n".join([line(header), "  ".join("-" * width for width in widths)]
                     + [line(row) for row in rows])


def phase_of(key):
    if key.startswith(("setup_", "secret_")):
        return key.split("_")[0]
    if key.startswith(("up_", "down_", "both_", "bulk_", "harness_", "front_")):
        return "bulk"
    if key.startswith(("open_", "echo_", "ok", "idle_")):
        return "tunnels"
    if key == "other_cpu":
        return "none"
    return "start"


def cell(result, key, digits):
    """A figure; "ERR" if its phase failed (the errors are listed under the tables),
    "-" if it does not apply (no CPU or RSS for "direct", no secret but for ours)."""
    if key in result:
        return fmt(result[key], digits)
    if phase_of(key) in result["failed"] or ("start" in result["failed"] and key != "other_cpu"):
        return "ERR"
    return "-"


def results_table(results, options):
    names = list(results)
    size = "%d MiB" % (options.size // MiB)
    rows_spec = [
        ("bulk up MB/s (%s)" % size, "up_mbs", 1),
        ("bulk down MB/s", "down_mbs", 1),
        ("bulk both MB/s (sum)", "both_mbs", 1),
        ("CPU s/GiB up", "up_cpu", 2),
        ("CPU s/GiB down", "down_cpu", 2),
        ("CPU s/GiB both", "both_cpu", 2),
        ("CPU s/GiB all bulk", "bulk_cpu", 2),
        ("harness CPU s/GiB", "harness_cpu", 2),
        ("front (nginx) CPU s/GiB, of all bulk", "front_cpu", 2),
        ("setup conn/s (n=%d)" % options.connections, "setup_rate", 0),
        ("setup p50 ms", "setup_p50", 2),
        ("setup p99 ms", "setup_p99", 2),
        ("setup CPU ms/conn (tunnel processes)", "setup_cpu", 2),
        ("secret setup conn/s (n=%d)" % options.secret_connections, "secret_rate", 2),
        ("secret setup p50 ms", "secret_p50", 0),
        ("secret setup p99 ms", "secret_p99", 0),
        ("open %d tunnels s" % options.tunnels, "open_s", 2),
        ("echo %dx64KiB s" % options.tunnels, "echo_s", 2),
        ("echo byte-exact", "ok", 0),
        ("RSS at start MiB client", "start_rss_client", 1),
        ("RSS at start MiB server", "start_rss_server", 1),
        ("RSS %d idle MiB client" % options.tunnels, "idle_rss_client", 1),
        ("RSS %d idle MiB server" % options.tunnels, "idle_rss_server", 1),
        ("peak RSS MiB client, bulk", "bulk_hwm_client", 1),
        ("peak RSS MiB server, bulk", "bulk_hwm_server", 1),
        ("peak RSS MiB client, all", "peak_rss_client", 1),
        ("peak RSS MiB server, all", "peak_rss_server", 1),
        ("other processes' CPU %", "other_cpu", 0),
    ]
    rows = [[label] + [cell(results[name], key, digits) for name in names]
            for label, key, digits in rows_spec]
    return table(["metric"] + names, rows)


# The targets, ours / obfs4proxy on the same transport in one run (issue 12; obfs4's
# from issue 19, "obfs4 at Go's speed": with PyNaCl, and on pycryptodome alone):
# key -> target ratio (higher is better for MB/s and conn/s, lower for the rest).
TARGETS = {
    "obfs2": {"up_mbs": 1.5, "down_mbs": 1.5, "bulk_cpu": 0.6, "setup_rate": 1.0, "setup_p99": 1.0},
    "obfs3": {"up_mbs": 1.5, "down_mbs": 1.5, "bulk_cpu": 0.6, "setup_rate": 1.0, "setup_p99": 1.0,
              "idle_rss_client": 0.5, "idle_rss_server": 0.5},
    "obfs4": {"up_mbs": 0.75, "down_mbs": 0.75, "bulk_cpu": 1.5, "setup_rate": 0.8, "setup_p99": 1.0,
              "idle_rss_client": 0.5, "idle_rss_server": 0.5},
    "obfs4-portable": {"up_mbs": 0.28, "down_mbs": 0.28, "bulk_cpu": 4.0, "setup_rate": 0.5,
                       "setup_p99": 1.2},
}
# The obfs4 setups whose routes measure_ceiling measures (in a child with their environment).
CEILING_SETUPS = ("ours-obfs4", "ours-obfs4-portable")


def ratio_table(name, transport, results, options, ceiling):
    """Ours (setup ``name``: "ours-obfs4", "ours-obfs4-portable", ...) against
    obfs4proxy on ``transport``, with the targets of TARGETS[name minus "ours-"]."""
    ours, theirs = results.get(name), results.get("o4p-" + transport)
    targets = TARGETS[name[len("ours-"):]]
    rows = []

    def verdict(ratio, target, higher_is_better):
        if target is None:
            return "", ""
        needed = "%s %sx" % (">=" if higher_is_better else "<=", fmt(target, 2).rstrip("0").rstrip("."))
        passed = ratio >= target if higher_is_better else ratio <= target
        return needed, "PASS" if passed else "FAIL"

    def compare(label, key, digits, higher_is_better):
        a = ours.get(key) if ours else None
        b = theirs.get(key) if theirs else None
        target = targets.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
            ratio = a / b
            rows.append([label, fmt(a, digits), fmt(b, digits), "%.2fx" % ratio]
                        + list(verdict(ratio, target, higher_is_better)))
        else:
            rows.append([label, fmt(a if a is not None else "n/a", digits),
                         fmt(b if b is not None else "n/a", digits), "n/a",
                         "" if target is None else "-", "n/a" if target is not None else ""])

    compare("bulk up MB/s", "up_mbs", 1, True)
    compare("bulk down MB/s", "down_mbs", 1, True)
    compare("bulk both MB/s", "both_mbs", 1, True)
    compare("CPU s/GiB all bulk", "bulk_cpu", 2, False)
    compare("CPU s/GiB up", "up_cpu", 2, False)
    compare("CPU s/GiB down", "down_cpu", 2, False)
    compare("setup conn/s", "setup_rate", 0, True)
    compare("setup p50 ms", "setup_p50", 2, False)
    compare("setup p99 ms", "setup_p99", 2, False)
    compare("setup CPU ms/conn", "setup_cpu", 2, False)
    compare("open %d tunnels s" % options.tunnels, "open_s", 2, False)
    compare("echo %dx64KiB s" % options.tunnels, "echo_s", 2, False)
    compare("RSS %d idle MiB client" % options.tunnels, "idle_rss_client", 1, False)
    compare("RSS %d idle MiB server" % options.tunnels, "idle_rss_server", 1, False)
    if ceiling:
        # Report only: the box's ceiling leaves out the length masks (~2 x 6-7 us a
        # frame, pure Python on every route), which bound the tunnel first.
        for label, key in (("bulk up / frame ceiling", "up_mbs"), ("bulk down / frame ceiling", "down_mbs")):
            a = ours.get(key) if ours else None
            if isinstance(a, (int, float)):
                rows.append([label, fmt(a, 1), "%.1f (ceiling)" % ceiling["frame_mbs"],
                             "%.2fx" % (a / ceiling["frame_mbs"]), "", ""])
    small = " (ran %d)" % options.tunnels if options.tunnels < 1000 else ""
    for label, key, passed in [
            ("%d tunnels byte-exact%s" % (1000, small), "ok", lambda v: ours.get("all_ok")),
            ("idle RSS client < 150 MiB%s" % small, "idle_rss_client", lambda v: v < 150),
            ("idle RSS server < 150 MiB%s" % small, "idle_rss_server", lambda v: v < 150)]:
        a = ours.get(key) if ours else None
        b = theirs.get(key) if theirs else None
        rows.append([label, fmt(a, 1), fmt(b, 1), "", "absolute",
                     ("PASS" if passed(a) else "FAIL") if a is not None else "n/a"])
    return table(["%s: ours vs obfs4proxy" % transport, name, "o4p-" + transport,
                  "ratio", "needed", "result"], rows)


WEBTUNNEL_SETUPS = ("ours-webtunnel", "ours-webtunnel-pyssl", "ours-webtunnel-tls", "nginx-upgrade")


def nginx_stream_module():
    """Whether this nginx could proxy a plain TCP stream (its stream module): never in
    nginx-light, whose ceiling setup is therefore an HTTP upgrade (nginx-upgrade)."""
    nginx, _ = test_helpers()
    binary = nginx.find_nginx()
    if binary is None:
        return "nginx is not installed (apt-get install nginx-light)"
    built = subprocess.run([binary, "-V"], capture_output=True, text=True, timeout=10).stderr
    if "--with-stream " in built + " " or os.path.exists("/usr/lib/nginx/modules/ngx_stream_module.so"):
        return "this nginx has a stream module, but the ceiling stays the HTTP upgrade (same location)"
    return ("nginx-light has no stream module (Debian's libnginx-mod-stream), so the ceiling is an "
            "HTTP upgrade to the sink behind the same location")


def webtunnel_table(results, options):
    """The webtunnel setups beside nginx alone (nginx-upgrade), with ours / ceiling."""
    names = [name for name in WEBTUNNEL_SETUPS if name in results]
    ceiling = results.get("nginx-upgrade")
    rows = []
    for label, key, digits in [("bulk up MB/s", "up_mbs", 1), ("bulk down MB/s", "down_mbs", 1),
                               ("CPU s/GiB up (all tunnel processes)", "up_cpu", 2),
                               ("CPU s/GiB down (all tunnel processes)", "down_cpu", 2),
                               ("of which nginx, CPU s/GiB (all bulk)", "front_cpu", 2),
                               ("setup conn/s", "setup_rate", 0), ("setup p50 ms", "setup_p50", 2),
                               ("setup p99 ms", "setup_p99", 2),
                               ("open %d tunnels s" % options.tunnels, "open_s", 2),
                               ("echo %dx64KiB s" % options.tunnels, "echo_s", 2)]:
        row = [label] + [cell(results[name], key, digits) for name in names]
        ours, top = results.get("ours-webtunnel", {}).get(key), (ceiling or {}).get(key)
        ok = isinstance(ours, (int, float)) and isinstance(top, (int, float)) and top
        row.append("%.2fx" % (ours / top) if ok else "n/a")
        rows.append(row)
    return table(["webtunnel"] + names + ["ours-webtunnel / nginx-upgrade"], rows)


def measure_ceiling(program, name):
    """obfs4's ceilings on the routes of setup ``name`` ("ours-obfs4": PyNaCl if it
    imports; "ours-obfs4-portable": OBFSPROXY_CRYPTO=portable), measured in a child
    process (``bench.py _ceiling``) with that setup's environment, so that the routes
    are the ones its tunnel processes run. None (and a message) if it fails."""
    result = subprocess.run([sys.executable, os.path.abspath(__file__), "_ceiling", program],
                            env=ours_environment(name), capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        print("[ceiling] %s FAILED: %s" % (name, result.stderr.strip()[-2000:]), file=sys.stderr, flush=True)
        return None
    return json.loads(result.stdout)


def ceiling_main(program, seconds=0.3):
    """``bench.py _ceiling PROGRAM``: in this process, with the obfs4_crypto next to
    PROGRAM and the routes the environment selects, print as JSON:

    * seal + open of one 1430-byte packet (the largest), best of 5 runs of ``seconds``
      each: 1427 payload bytes / that time is the frame ceiling, the MB/s a tunnel
      would reach if framing, the length masks and the relay cost nothing;
    * one length mask (HashDrbg, best of 5 x 1,000) and the ceiling with two of them
      per frame (the sender's and the receiver's);
    * a connected Obfs4 pair sending and receiving 4 MiB in memory (one core);
    * obfs4_crypto's route_report() and routes(), and obfs3's modexp route.
    Times are CPU time of this thread, so other processes' load moves them less."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    import obfs3
    import obfs4
    import obfs4_crypto
    import obfs4_drbg
    clock = time.thread_time
    box = obfs4_crypto.SecretBox(bytes(range(32)), bytes(16))
    packet = RANDOM_BLOCK[:1430]
    sealed = box.seal(1, packet)
    drbg = obfs4_drbg.HashDrbg(bytes(24))
    best = {}
    for name, run, per_run in (("seal", lambda: box.seal(1, packet), 1),
                               ("open", lambda: box.open(1, sealed), 1),
                               ("mask", lambda: drbg.masks(1000), 1000)):
        for _ in range(5):
            count, start = 0, clock()
            while clock() - start < seconds / 3:
                for _ in range(100 // per_run or 1):
                    run()
                count += (100 // per_run or 1) * per_run
            us = (clock() - start) / count * 1e6
            best[name] = min(best.get(name, us), us)
    identity = obfs4.Identity(bytes(20), bytes(range(32)), bytes(24))
    server_config = obfs4.ServerConfig(identity)
    client = obfs4.Obfs4(True, obfs4.ClientConfig(identity.node_id, identity.public_key, 0))
    server = obfs4.Obfs4(False, server_config)
    server.receive(client.start())
    client.receive(server.data_to_send())
    data, inprocess = RANDOM_BLOCK * 4, 0.0
    for _ in range(3):
        start = clock()
        if server.receive(client.send(data)) != data:
            raise RuntimeError("obfs4 in memory: the data came back different")
        inprocess = max(inprocess, len(data) / (clock() - start) / 1e6)
    frame_us = best["seal"] + best["open"]
    print(json.dumps({
        "seal_us": best["seal"], "open_us": best["open"], "mask_us": best["mask"], "frame_us": frame_us,
        "frame_mbs": 1427 / frame_us, "masked_mbs": 1427 / (frame_us + 2 * best["mask"]),
        "inprocess_mbs": inprocess, "routes": obfs4_crypto.routes(),
        "report": "%s; obfs3 modexp: %s" % (obfs4_crypto.route_report(), obfs3.MODEXP_ROUTE)}))
    return 0


def describe_ceiling(ceiling):
    return ("seal %.1f + open %.1f us per 1430-byte packet = %.1f MB/s; with a %.1f us length mask "
            "at each end %.1f MB/s; an Obfs4 pair in memory (send + receive, one core) %.1f MB/s"
            % (ceiling["seal_us"], ceiling["open_us"], ceiling["frame_mbs"], ceiling["mask_us"],
               ceiling["masked_mbs"], ceiling["inprocess_mbs"]))


def describe_tree(program):
    """The git commit of obfsproxy.py's checkout, and whether it had local changes."""
    directory = os.path.dirname(os.path.abspath(program))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=directory,
                                capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=directory,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return "%s%s" % (commit or "unknown", " + local changes" if dirty else "")


# --- Main ------------------------------------------------------------------------------------------

def parse_options(argv):
    parser = argparse.ArgumentParser(
        description="Benchmark obfsproxy.py against obfs4proxy (obfs2, obfs3, obfs4) on 127.0.0.1. "
                    "See the docstring at the top of this file for how to read the output.")
    parser.add_argument("--quick", action="store_true",
                        help="small fast run: 32 MiB streams, 100 connections, 200 tunnels, "
                             "5 secret connections (every stream still checked byte-exact)")
    parser.add_argument("--size-mib", type=int, help="bulk stream size [256; quick: 32]")
    parser.add_argument("--connections", type=int, help="sequential setup connections [1000; quick: 100]")
    parser.add_argument("--secret-connections", type=int,
                        help="setup connections with a shared secret [50; quick: 5]")
    parser.add_argument("--tunnels", type=int, help="concurrent tunnels [1000; quick: 200]")
    parser.add_argument("--repeat", type=int,
                        help="run each bulk stream N times: best MB/s, median CPU [3; quick: 1]")
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds to wait with all tunnels open before reading RSS [3.0]")
    parser.add_argument("--setups", default=",".join(DEFAULT_SETUPS),
                        help="comma-separated setups [%s]; also: %s"
                             % (",".join(DEFAULT_SETUPS),
                                ", ".join(name for name in SETUPS if name not in DEFAULT_SETUPS)))
    parser.add_argument("--phases", default=",".join(PHASES),
                        help="comma-separated phases to run [%s]; the rows of the others "
                             "print as -" % ",".join(PHASES))
    parser.add_argument("--skip-obfs4proxy", action="store_true",
                        help="only the setups without obfs4proxy")
    parser.add_argument("--obfsproxy", default=os.path.join(ROOT, "obfsproxy.py"),
                        help="the obfsproxy.py to measure [the one in this checkout]")
    parser.add_argument("--obfs4proxy", default=shutil.which("obfs4proxy") or "/usr/bin/obfs4proxy",
                        help="the obfs4proxy binary [from PATH]")
    parser.add_argument("--json", metavar="PATH", help="also write all figures as JSON to PATH")
    parser.add_argument("--profile", metavar="DIR",
                        help="sample our client and server (setups with ours at both ends) with "
                             "py-spy in each phase; write collapsed stacks to DIR, print the top "
                             "functions (this costs CPU: do not compare that run's figures; "
                             "the setup test then runs in one round)")
    options = parser.parse_args(argv)
    quick = options.quick
    options.size = (options.size_mib or (32 if quick else 256)) * MiB
    options.connections = options.connections or (100 if quick else 1000)
    options.secret_connections = options.secret_connections or (5 if quick else 50)
    options.tunnels = options.tunnels or (200 if quick else 1000)
    options.repeat = options.repeat or (1 if quick else 3)
    options.setups = [name.strip() for name in options.setups.split(",") if name.strip()]
    unknown = [name for name in options.setups if name not in SETUPS]
    if unknown:
        parser.error("unknown setup(s): %s" % ", ".join(unknown))
    options.phases = [name.strip() for name in options.phases.split(",") if name.strip()]
    if not options.phases or set(options.phases) - set(PHASES):
        parser.error("--phases takes some of %s" % ", ".join(PHASES))
    if options.skip_obfs4proxy or not os.path.exists(options.obfs4proxy):
        if not options.skip_obfs4proxy:
            print("obfs4proxy not found at %s: skipping its setups (apt-get install obfs4proxy)"
                  % options.obfs4proxy, file=sys.stderr)
        options.setups = [name for name in options.setups if "o4p" not in name]
    return options


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_sink"]:
        return sink_main()
    if argv[:1] == ["_ceiling"]:
        return ceiling_main(argv[1])
    options = parse_options(argv)
    fd_limit = raise_fd_limit()
    threading.stack_size(512 * 1024)

    info = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "host": "%s, %s, %s CPUs, Python %s" % (platform.platform(), platform.machine(),
                                                os.cpu_count(), platform.python_version()),
        "obfsproxy": "%s (git %s)" % (options.obfsproxy, describe_tree(options.obfsproxy)),
        "obfs4proxy": options.obfs4proxy if any("o4p" in s for s in options.setups) else "skipped",
        "size_mib": options.size // MiB, "connections": options.connections,
        "secret_connections": options.secret_connections, "tunnels": options.tunnels,
        "repeat": options.repeat, "fd_limit": fd_limit, "load_start": load_average(),
    }
    if info["obfs4proxy"] != "skipped":
        try:
            info["obfs4proxy"] += " (%s)" % subprocess.run(
                [options.obfs4proxy, "-version"], capture_output=True, text=True,
                timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    for key in ("date", "host", "obfsproxy", "obfs4proxy", "load_start"):
        print("%-11s %s" % (key + ":", info[key]), file=sys.stderr, flush=True)

    began = time.monotonic()
    meter = Meter()
    at_start = meter.snapshot()
    sink = start_sink()
    setups = [Setup(name, options, sink, meter) for name in options.setups]
    ceiling_failed = False
    ceilings = {name: [] for name in CEILING_SETUPS}   # obfs4's two routes: figures per round
    try:
        with tempfile.TemporaryDirectory(prefix="bench-o4p-") as state_dir:
            for number, setup in enumerate(setups):
                setup.start(os.path.join(state_dir, str(number)))
            digests = Digests(options.size) if "bulk" in options.phases else None
            for number in range(1, options.repeat + 1 if "bulk" in options.phases else 1):
                if any(setup.transport == "obfs4" for setup in setups):
                    for name, found in ceilings.items():
                        ceiling = measure_ceiling(options.obfsproxy, name)
                        if ceiling is None:
                            ceiling_failed = True
                            continue
                        found.append(ceiling)
                        if number == 1:
                            print("[routes] %s: %s" % (name, ceiling["report"]), file=sys.stderr, flush=True)
                        print("[ceiling] %s: %s" % (name, describe_ceiling(ceiling)),
                              file=sys.stderr, flush=True)
                for setup in setups:
                    setup.bulk_round(digests, number)
            for setup in setups:
                if "bulk" in options.phases:
                    setup.bulk_done()
            rounds = 1 if options.profile else min(SETUP_ROUNDS, options.connections)
            for number in range(rounds if "setup" in options.phases else 0):
                count = options.connections // rounds + (number < options.connections % rounds)
                for setup in setups:
                    setup.setup_round(count, warmup=5 if number == 0 else 0)
            for setup in setups if "setup" in options.phases else ():
                setup.setup_done()
                if setup.name == "ours-obfs2" and options.secret_connections:
                    setup.secret_rate()
            for setup in setups if "tunnels" in options.phases else ():
                setup.tunnels()
    finally:
        results = {setup.name: setup.stop() for setup in setups}
        sink.stop()
    other, available = meter.other_since(at_start)
    info["other_cpu"] = 100 * other / available if available else None
    info["load_end"] = load_average()
    info["seconds"] = round(time.monotonic() - began, 1)

    print()
    print("obfsproxy.py benchmark, %s; %s" % (info["date"], info["host"]))
    print("obfsproxy.py: %s" % info["obfsproxy"])
    print("obfs4proxy:   %s" % info["obfs4proxy"])
    print("took %.0f s; load average %s at start, %s at end (this run's own processes count too)"
          % (info["seconds"], info["load_start"], info["load_end"]))
    print("other processes used %s%% of the machine's CPU during the run (the noise; per setup "
          "in the last row)" % fmt(info["other_cpu"], 0))
    print()
    print(results_table(results, options))
    print()
    if any(name in WEBTUNNEL_SETUPS for name in results):
        print("webtunnel's ceiling: %s" % nginx_stream_module())
        print(webtunnel_table(results, options))
        print()
    best = {name: max(found, key=lambda c: c["frame_mbs"]) for name, found in ceilings.items() if found}
    if best:
        info["ceilings"] = best
        for name, ceiling in best.items():
            print("obfs4 per-frame ceiling on %s's routes, best of %d: %s"
                  % (name, len(ceilings[name]), describe_ceiling(ceiling)))
            print("  routes: %s" % ceiling["report"])
        print()
    for name in [name for name in options.setups if name.startswith("ours-")]:
        transport = SETUPS[name][2]
        if name[len("ours-"):] in TARGETS and "o4p-" + transport in results and name in results:
            print(ratio_table(name, transport, results, options, best.get(name)))
            print()
    for name, result in results.items():
        for error in result["errors"]:
            print("error: %s: %s" % (name, error))
    print("Ratios are what matter: absolute figures move between runs on this shared machine.")
    if options.json:
        directory = os.path.dirname(os.path.abspath(options.json))
        os.makedirs(directory, exist_ok=True)
        with open(options.json, "w") as out:
            json.dump({"info": info, "results": results}, out, indent=2, sort_keys=True)
    failed = ceiling_failed or any(result["errors"] for result in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
