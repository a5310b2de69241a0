"""Load and soak (issue 4), the slow group: ``python -m pytest -m slow``.

* 10,000 connections that end every way, then descriptors, threads and
  CLOSE_WAIT sockets back to their baseline, while the streams that end
  normally are checked byte for byte;
* 1,000 concurrent tunnels through one client and one server, every stream
  checked by SHA-256, with both proxies holding more than 1,100 descriptors
  (and having raised their own descriptor limit from a soft 1024);
* a 1 GiB stream through obfs2, byte-exact, with the proxies' memory bounded.

Each test prints its figures (run with ``-s`` to see them). The helpers are
those of test_reliability.py.
"""

import hashlib
import os
import selectors
import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from Crypto.Cipher import AES
from support import closed_port, fmt, listening_socket, recv_exact, socks5_connect
from test_reliability import (
    Dest,
    Usage,
    assert_no_traceback,
    end_every_way,
    end_normally,
    fd_count,
    mode,
    needs_proc,
    proc_number,
    rss_bytes,
    start,
    thread_count,
)

pytestmark = pytest.mark.slow

_Selector = getattr(selectors, "PollSelector", selectors.DefaultSelector)


@needs_proc
def test_ten_thousand_connections_ending_every_way_leave_nothing_behind():
    with Dest() as dest:
        server = start("server", "--dest=" + fmt(dest.address), "--handshake-timeout=5")
        client = start("client", "--handshake-timeout=5")
        refusing = start("server", "--dest=" + fmt(closed_port()))
        with server, client, refusing:
            end_normally(client, server, dest)           # warm up
            baseline = [Usage(node) for node in (server, client, refusing)]
            began = time.monotonic()
            total = 0
            while total < 10000:                         # batches, to watch progress
                total += end_every_way(client, server, dest, refusing, rounds=100, workers=24)
            took = time.monotonic() - began
            after = [u.back_to_baseline(timeout=60) for u in baseline]
            print("\n%d connections ending every way in %.1f s (%.0f/s); (fds, threads) "
                  "before %s, after %s; no CLOSE_WAIT"
                  % (total, took, total / took, [(u.fds, u.threads) for u in baseline],
                     after))
            assert_no_traceback(server, client, refusing)


# --- 1,000 concurrent tunnels ---------------------------------------------------------------

class SelectorEcho:
    """An echo service on one thread: a thousand connections, no thousand threads."""

    def __init__(self):
        self.listener = listening_socket(backlog=1024)
        self.listener.setblocking(False)
        self.address = self.listener.getsockname()
        self._stop_r, self._stop_w = socket.socketpair()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        selector = _Selector()
        selector.register(self.listener, selectors.EVENT_READ)
        selector.register(self._stop_r, selectors.EVENT_READ)
        state = {}                                   # conn -> [pending bytearray, eof]
        try:
            while True:
                for key, events in selector.select():
                    sock = key.fileobj
                    if sock is self._stop_r:
                        return
                    if sock is self.listener:
                        self._accept(selector, state)
                        continue
                    pending, eof = state[sock]
                    if events & selectors.EVENT_READ:
                        try:
                            data = sock.recv(262144)
                        except (BlockingIOError, InterruptedError):
                            data = None
                        if data:
                            pending += data
                        elif data is not None:
                            eof = state[sock][1] = True
                    if pending:
                        try:
                            del pending[:sock.send(pending)]
                        except BlockingIOError:
                            pass
                    if eof and not pending:
                        selector.unregister(sock)
                        sock.close()
                        del state[sock]
                        continue
                    wanted = (selectors.EVENT_READ if not eof and len(pending) < (1 << 20) else 0) \
                        | (selectors.EVENT_WRITE if pending else 0)
                    selector.modify(sock, wanted)
        finally:
            for sock in state:
                sock.close()
            selector.close()

    def _accept(self, selector, state):
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            state[conn] = [bytearray(), False]
            selector.register(conn, selectors.EVENT_READ)

    def close(self):
        self._stop_w.send(b"x")
        self.thread.join(10)
        self.listener.close()
        self._stop_r.close()
        self._stop_w.close()


def open_files_limit(pid):
    return proc_number(pid, "limits", "Max open files", column=3)


@pytest.fixture()
def descriptors():
    """Room for 1,000 tunnels in this process (2,000 sockets and more), and
    the proxies started with a soft limit of 1024 so that they must raise
    their own. Guarded: POSIX only, and only as far as the hard limit allows."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    room = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if room < 2300:
        pytest.skip("the hard descriptor limit (%d) is too low for 1,000 tunnels" % hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))

    def with_soft_1024(starter):
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        try:
            return starter()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (room, hard))
    yield with_soft_1024
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@needs_proc
def test_thousand_concurrent_tunnels_each_checked_by_sha256(descriptors):
    count, size = 1000, 64 * 1024
    echo = SelectorEcho()
    try:
        server = descriptors(lambda: start("server", "--dest=" + fmt(echo.address)))
        client = descriptors(lambda: start("client"))
        with server, client:
            limits = [open_files_limit(node.process.pid) for node in (server, client)]
            assert min(limits) > 2100, "the proxies did not raise their descriptor limit: %s" % limits
            began = time.monotonic()
            with ThreadPoolExecutor(16) as pool:
                tunnels = list(pool.map(lambda _: socks5_connect(client.address, server.address),
                                        range(count)))
            opened = time.monotonic() - began
            # All 1,000 are open at once, through both processes.
            held = {node.args[2]: (fd_count(node.process.pid), thread_count(node.process.pid))
                    for node in (server, client)}
            for name, (fds, threads) in held.items():
                assert fds > 1100 and threads > count, (name, fds, threads)
            began = time.monotonic()
            checked = pump_and_check(tunnels, size, deadline=180)
            moved = time.monotonic() - began
            print("\n%d concurrent tunnels opened in %.1f s; (fds, threads) held %s; soft "
                  "limits raised to %s; %d x %d KiB echoed and SHA-256-checked in %.1f s"
                  % (count, opened, held, limits, checked, size // 1024, moved))
            assert checked == count
            assert_no_traceback(server, client)
    finally:
        echo.close()


def pump_and_check(tunnels, size, deadline):
    """Send each tunnel its own random bytes, half-close, read the echo to EOF
    and compare SHA-256, all at once on one selector. Returns how many matched."""
    selector = _Selector()
    state = {}
    for sock in tunnels:
        data = os.urandom(size)
        sock.setblocking(False)
        state[sock] = {"out": memoryview(data), "want": hashlib.sha256(data).digest(),
                       "got": hashlib.sha256(), "n": 0}
        selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
    matched, end = 0, time.monotonic() + deadline
    try:
        while state:
            assert time.monotonic() < end, "%d tunnels unfinished after %d s" % (len(state), deadline)
            for key, events in selector.select(timeout=5):
                sock, s = key.fileobj, state[key.fileobj]
                if events & selectors.EVENT_WRITE and s["out"]:
                    try:
                        s["out"] = s["out"][sock.send(s["out"][:65536]):]
                    except BlockingIOError:
                        pass
                    if not s["out"]:
                        sock.shutdown(socket.SHUT_WR)
                        selector.modify(sock, selectors.EVENT_READ)
                if events & selectors.EVENT_READ:
                    try:
                        data = sock.recv(262144)
                    except BlockingIOError:
                        continue
                    if data:
                        s["got"].update(data)
                        s["n"] += len(data)
                        continue
                    assert s["n"] == size and s["got"].digest() == s["want"], \
                        "a stream came back altered (%d of %d bytes)" % (s["n"], size)
                    matched += 1
                    selector.unregister(sock)
                    sock.close()
                    del state[sock]
    finally:
        for sock in state:
            sock.close()
        selector.close()
    return matched


# --- 1 GiB -------------------------------------------------------------------------------------

def keystream(seed, chunk, total):
    """``total`` pseudo-random bytes (AES-CTR of zeros), ``chunk`` at a time."""
    cipher = AES.new(hashlib.sha256(seed).digest()[:16], AES.MODE_CTR, nonce=b"")
    zeros = bytes(chunk)
    for _ in range(total // chunk):
        yield cipher.encrypt(zeros)


@needs_proc
def test_one_gib_stream_arrives_byte_exact():
    total, chunk = 1 << 30, 1 << 20
    with Dest() as dest:
        server = start("server", "--dest=" + fmt(dest.address))
        client = start("client")
        with server, client:
            rss = {node: rss_bytes(node.process.pid) for node in (server, client)}
            sock = socks5_connect(client.address, server.address, timeout=120)
            with sock:
                sock.sendall(mode("digest"))
                sent = hashlib.sha256()
                began = time.monotonic()
                for block in keystream(b"one gibibyte", chunk, total):
                    sock.sendall(block)
                    sent.update(block)
                sock.shutdown(socket.SHUT_WR)
                answer = recv_exact(sock, 40)
                took = time.monotonic() - began
            grown = {node.args[2]: (rss_bytes(node.process.pid) - before) >> 20
                     for node, before in rss.items()}
        digest, count = answer[:32], struct.unpack("!Q", answer[32:])[0]
        print("\n1 GiB through obfs2 in %.1f s: %.0f MB/s; RSS growth %s MiB"
              % (took, total / took / 1e6, grown))
        assert count == total
        assert digest == sent.digest()
        for name, growth in grown.items():
            assert growth < 64, "%s grew by %d MiB moving 1 GiB" % (name, growth)
