"""The measurements: bulk streams, sequential setups, many tunnels at once."""

import asyncio
import hashlib
import math
import threading
import time

from machine import cpu_seconds, memory_mib
from report import fmt
from traffic import (
    BLOCK,
    HEADER,
    PING,
    SOCKET_TIMEOUT,
    TAG_DOWN,
    TAG_UP,
    TOR_TURNS,
    echo_payload,
    recv_exact,
    recv_hashed,
    send_stream,
    stream_digest,
)

GiB = 1 << 30

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




def one_flight(route):
    """One tunnel (connect, SOCKS, handshake) and Tor's first turns through it, each
    written at once and waited for."""
    with route.connect() as sock:
        sock.sendall(HEADER.pack(b"ECHO", 0))
        for size in TOR_TURNS:
            data = bytes([size & 0xFF]) * size
            sock.sendall(data)
            if recv_exact(sock, size) != data:
                raise ConnectionError("the echo came back different")


class Sequential:
    """Sequential connections (connect, SOCKS, handshake, echo, close), possibly in
    several rounds: conn/s over all of them, p50 and p99 of one in ms, and the CPU
    the tunnel processes ``pids`` spent on each, in ms (None without /proc)."""

    def __init__(self, one=one_echo):
        self.times, self.elapsed, self.cpu = [], 0.0, 0.0
        self.one = one

    def round(self, route, count, warmup=0, pids=()):
        for _ in range(warmup):
            self.one(route)
        before = cpu_seconds(pids) if pids else None
        start = time.perf_counter()
        for _ in range(count):
            began = time.perf_counter()
            self.one(route)
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
