#!/usr/bin/env python3
"""fairness.py: does one user's load hurt the others on a shared bridge? Ours against
obfs4proxy, interleaved in one run, printed as ratios.

    python bench/bench.py --fairness            # the full run (about 15 minutes)
    python bench/bench.py --fairness --quick    # does it all work? (about 2 minutes)
    python bench/fairness.py --tests latency --levels 0,16 --setups ours-obfs4,o4p-obfs4

The setups are bench.py's (``ours-obfs4``, ``o4p-obfs4``, ``ours-obfs2``, ``o4p-obfs2``
by default), started once; then they take turns for every measurement, the order
rotating with each repetition, so ours and obfs4proxy are measured minutes apart at
most. Every load runs in a process of its own (``fairness.py _bulk``, ``_probe``,
``_storm``, ``_attack``), so the harness's Python does not share a GIL with what it
measures; the probes ask for nice -10 (granted to root only) so that their own
wake-ups are not what is measured.

What is measured
----------------
latency   20 interactive tunnels, each sending 100 bytes and waiting for their echo,
          the next 10 ms after the previous send (or at once when the echo took
          longer; one echo in flight per tunnel, so a slow tunnel cannot hide), beside
          N = 0, 1, 4, 16 bulk tunnels downloading as fast as they can (the bridge
          encrypts, the client decrypts: Tor's common direction). RTT p50 and p99 over a
          window, median over repetitions; an echo still outstanding at the end counts
          with the time it has waited. Also the bulk tunnels' MB/s.
iat2      (obfs4 only) one tunnel in iat-mode 2 uploading 256 KiB, alone and then
          beside 4 bulk tunnels: its own rate loaded / unloaded. Its client paces each
          piece with a timer, so this shows whether timers fire on time under load.
storm     1,000 connections opened at once (connect, SOCKS5, the handshake, a 1-byte
          echo, close; 40 s each at most) beside 4 bulk tunnels: the time until all are
          echoed, failures, echo-time p50/p99, and the kernel's listen-queue overflows
          (TcpExt ListenOverflows, machine-wide) during the storm.
attack    2,000 connections to the *bridge* port that send one random byte a second,
          plus 2,048 that send nothing, held for the window: an established tunnel's
          echo RTT p99 (5 tunnels opened before), and the time a good client needs to
          open a tunnel (connect, SOCKS, handshake, 1-byte echo, one after another),
          each with the attack divided by without it. Also the bridge's CPU seconds.
hold      the attack held past the handshake deadline (30 s) and the close delay, for
          --hold seconds (90): 3,000 silent + 1,000 slow sockets reopened as the bridge
          closes them, against a bridge started for the test (the setup's client dials
          it). Throughout, a good client opens a tunnel every 0.2 s (p50/p99/max, failed
          opens) and 5 tunnels echo (p99); first for 10 s without the attack.
          Also the bridge's CPU seconds and its most threads and descriptors. Three
          times: as it is; with the bridge in a cgroup of its own limited to 1,000 tasks
          (pids.max: a container's pids limit, systemd's TasksMax; needs a writable
          /sys/fs/cgroup/pids, else the row says why); and started under `ulimit -n
          1024` (prlimit) with 2,000 silent sockets.

Only the ratios mean much: this is a 2-core machine, and the load generators, the
sink, both tunnel ends and other people's work all share it.
"""

import argparse
import asyncio
import json
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import children  # noqa: E402
import machine  # noqa: E402
import measure  # noqa: E402
import report  # noqa: E402
import routes  # noqa: E402
import setups  # noqa: E402
import traffic  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SETUPS = ("ours-obfs4", "o4p-obfs4", "ours-obfs2", "o4p-obfs2")
TESTS = ("latency", "iat2", "storm", "attack", "hold")
HOLD_LIMITS = ("none", "tasks", "nofile")   # the held attack: plain, under a task limit, few fds
TASK_LIMIT = 1000           # tasks (threads) the bridge may have under "tasks"
GOOD_EVERY = 0.2            # seconds between the good client's opens during a hold
GOOD_TIMEOUT = 5.0          # ... and the most one may take: longer counts as a failed open
ECHO_TUNNELS = 20           # interactive tunnels in the latency test
ECHO_SIZE = 100             # bytes per interactive echo
ECHO_EVERY = 0.010          # seconds between one tunnel's sends
PACED_SIZE = 256 * 1024     # the iat-mode 2 tunnel's upload
STORM_TIMEOUT = 40.0        # seconds one storm connection may take
BULK_FOREVER = 1 << 40      # a DOWN stream that outlasts any window
WARMUP = 1.0                # seconds the bulk tunnels run before a window starts


# --- The load processes ------------------------------------------------------------------

def route_of(spec):
    """A routes.Route from its JSON form (first hop, SOCKS target, SOCKS arguments)."""
    first_hop, target, args = spec
    return routes.Route(tuple(first_hop), tuple(target) if target else None, args)


def be_nice():
    try:
        os.nice(-10)
    except OSError:
        pass        # not root: the probes run at the ordinary priority


def bulk_main(spec, count):
    """``count`` tunnels downloading from the sink until stdin closes; then print the
    bytes each moved after the warm-up."""
    route = route_of(json.loads(spec))
    socks = []
    for _ in range(int(count)):
        sock = route.connect()
        sock.sendall(traffic.HEADER.pack(b"DOWN", BULK_FOREVER))
        sock.setblocking(False)
        socks.append(sock)
    selector = selectors.DefaultSelector()
    for number, sock in enumerate(socks):
        selector.register(sock, selectors.EVENT_READ, number)
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, None)
    moved = [0] * len(socks)
    buffer = bytearray(256 * 1024)
    start = time.monotonic()
    counting, commands = False, b""
    print("READY", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data is None:                   # GO: count from here; STOP or EOF: report
                read = os.read(sys.stdin.fileno(), 64)
                commands += read
                if read and b"STOP" not in commands:
                    if b"GO" in commands and not counting:
                        moved = [0] * len(socks)
                        start, counting = time.monotonic(), True
                    continue
                elapsed = time.monotonic() - start
                print(json.dumps({"bytes": sum(moved), "seconds": elapsed, "counting": counting}),
                      flush=True)
                return 0
            try:
                got = key.fileobj.recv_into(buffer)
            except BlockingIOError:
                continue
            if not got:
                raise SystemExit("a bulk tunnel ended early")
            moved[key.data] += got


def probe_main(spec, window, tunnels, wait="0"):
    """``tunnels`` interactive tunnels echoing ECHO_SIZE bytes every ECHO_EVERY seconds
    for ``window`` seconds; print the RTTs in seconds. With ``wait`` "1", the tunnels
    are opened first, "OPEN" is printed, and the window starts at a line on stdin."""
    be_nice()
    route = route_of(json.loads(spec))
    window, tunnels = float(window), int(tunnels)
    payload = os.urandom(ECHO_SIZE)
    socks = []
    for _ in range(tunnels):
        sock = route.connect()
        sock.sendall(traffic.HEADER.pack(b"ECHO", 0) + b"w")
        traffic.recv_exact(sock, 1)
        socks.append(sock)
    if wait == "1":
        print("OPEN", flush=True)
        sys.stdin.readline()
    for sock in socks:
        sock.setblocking(False)
    selector = selectors.DefaultSelector()
    state = []                     # per tunnel: [sent at, bytes still due, next send at]
    now = time.monotonic()
    for number, sock in enumerate(socks):
        selector.register(sock, selectors.EVENT_READ, number)
        state.append([None, 0, now + ECHO_EVERY * number / tunnels])
    rtts, end = [], now + window
    while True:
        now = time.monotonic()
        if now >= end:
            break
        for number, (sent, _due, next_at) in enumerate(state):
            if sent is None and now >= next_at:
                socks[number].send(payload)        # 100 bytes: the socket buffer takes them
                state[number] = [now, ECHO_SIZE, now + ECHO_EVERY]
        waits = [entry[2] for entry in state if entry[0] is None]
        timeout = max(0.0, min(waits + [end]) - time.monotonic())
        for key, _ in selector.select(timeout):
            entry = state[key.data]
            got = len(key.fileobj.recv(65536))
            if not got:
                raise SystemExit("an interactive tunnel ended early")
            entry[1] -= got
            if entry[1] <= 0 and entry[0] is not None:
                done = time.monotonic()
                rtts.append(done - entry[0])
                entry[0] = None
                entry[2] = max(entry[2], done)
    outstanding = [end - entry[0] for entry in state if entry[0] is not None]
    print(json.dumps({"rtts": rtts + outstanding}), flush=True)
    for sock in socks:
        sock.close()
    return 0


def storm_main(spec, count):
    """``count`` connections at once: SOCKS, handshake, 1-byte echo, close."""
    be_nice()
    route = route_of(json.loads(spec))

    async def one():
        began = time.monotonic()
        reader, writer = await route.open()
        try:
            writer.write(traffic.HEADER.pack(b"ECHO", 0) + b"s")
            await reader.readexactly(1)
            return time.monotonic() - began
        finally:
            writer.close()

    async def run():
        start = time.monotonic()
        outcomes = await asyncio.gather(*[asyncio.wait_for(one(), STORM_TIMEOUT)
                                          for _ in range(int(count))], return_exceptions=True)
        return time.monotonic() - start, outcomes

    took, outcomes = asyncio.run(run())
    times = sorted(outcome for outcome in outcomes if isinstance(outcome, float))
    errors = sorted({type(o).__name__ for o in outcomes if isinstance(o, BaseException)})
    print(json.dumps({"took": took, "times": times, "failed": len(outcomes) - len(times),
                      "errors": errors}), flush=True)
    return 0


def attack_main(server, slow, silent):
    """``slow`` connections to ``server`` sending one random byte a second and ``silent``
    ones sending nothing, until stdin closes."""
    host, port = json.loads(server)

    async def hold(trickle, opened):
        """One attacker's connection, reopened whenever the bridge closes it."""
        first = True
        while True:
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                if first:
                    opened.append(False)
                await asyncio.sleep(1.0)
                continue
            if first:
                opened.append(True)
                first = False
            try:
                while True:
                    if trickle:
                        writer.write(os.urandom(1))
                    try:
                        if not await asyncio.wait_for(reader.read(4096), 1.0):
                            break                   # closed by the bridge: come back
                    except asyncio.TimeoutError:
                        pass
            except OSError:
                pass
            finally:
                writer.close()

    async def run():
        loop = asyncio.get_running_loop()
        opened = []
        tasks = [asyncio.ensure_future(hold(True, opened)) for _ in range(int(slow))]
        tasks += [asyncio.ensure_future(hold(False, opened)) for _ in range(int(silent))]
        while len(opened) < len(tasks):
            await asyncio.sleep(0.05)
        print(json.dumps({"opened": opened.count(True), "refused": opened.count(False)}), flush=True)
        await loop.run_in_executor(None, sys.stdin.read)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    return 0


# --- Driving them -------------------------------------------------------------------------

class Load:
    """One load process: started, its lines read on a thread, told GO/STOP, stopped."""

    ANY = re.compile(r"^(.*)$")

    def __init__(self, *args):
        self.process = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + [str(a) for a in args],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines = children.Lines(self.process.stdout)

    def line(self, timeout=120.0):
        return self.lines.wait_for(self.ANY, timeout=timeout).group(1)

    def tell(self, text):
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()

    def stop(self):
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def spec_of(route):
    return json.dumps([route.first_hop, route.target, route.args])


def run_bulk(route, count):
    """Start ``count`` bulk tunnels and let them warm up; returns the Load or None."""
    if not count:
        return None
    load = Load("_bulk", spec_of(route), count)
    if load.line() != "READY":
        raise RuntimeError("the bulk load did not start")
    time.sleep(WARMUP)
    load.tell("GO")
    return load


def bulk_rate(load):
    if load is None:
        return None
    load.tell("STOP")
    try:
        result = json.loads(load.line())
    finally:
        load.stop()
    return result["bytes"] / result["seconds"] / 1e6


def probe(route, window, tunnels=ECHO_TUNNELS):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "_probe", spec_of(route),
                          str(window), str(tunnels)], capture_output=True, text=True,
                         timeout=window + 120)
    if out.returncode:
        raise RuntimeError("the probe failed: %s" % out.stderr.strip()[-300:])
    return sorted(json.loads(out.stdout)["rtts"])


def listen_overflows():
    """The kernel's TcpExt ListenOverflows counter (machine-wide), or None."""
    try:
        with open("/proc/net/netstat") as netstat:
            lines = netstat.read().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2]):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:]))
            return int(table.get("ListenOverflows", 0))
    return None


def percentiles(ordered):
    if not ordered:
        return None, None
    return measure.percentile(ordered, 50) * 1000, measure.percentile(ordered, 99) * 1000


def test_latency(setup, level, options):
    load = run_bulk(setup.route, level)
    try:
        rtts = probe(setup.route, options.window)
    finally:
        rate = bulk_rate(load) if load else None
    p50, p99 = percentiles(rtts)
    return {"p50": p50, "p99": p99, "n": len(rtts), "bulk_mbs": rate}


def paced_upload(setup):
    """One iat-mode 2 tunnel uploads PACED_SIZE bytes: its MB/s."""
    route = routes.Route(setup.route.first_hop, setup.route.target,
                        dict(setup.route.args, **{"iat-mode": "2"}))
    with route.connect() as sock:
        sock.settimeout(300)
        start = time.monotonic()
        sock.sendall(traffic.HEADER.pack(b"UP  ", PACED_SIZE))
        traffic.send_stream(sock, traffic.TAG_UP, PACED_SIZE)
        traffic.recv_exact(sock, 32)
        return PACED_SIZE / (time.monotonic() - start) / 1e6


def test_iat2(setup, loaded):
    load = run_bulk(setup.route, 4 if loaded else 0)
    try:
        return {"rate": paced_upload(setup)}
    finally:
        if load:
            bulk_rate(load)


def test_storm(setup, options):
    load = run_bulk(setup.route, 4)
    before = listen_overflows()
    try:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "_storm",
                              spec_of(setup.route), str(options.storm)],
                             capture_output=True, text=True, timeout=STORM_TIMEOUT + 120)
    finally:
        after = listen_overflows()
        bulk_rate(load)
    if out.returncode:
        raise RuntimeError("the storm failed: %s" % out.stderr.strip()[-300:])
    result = json.loads(out.stdout)
    p50, p99 = percentiles(result["times"])
    return {"took": result["took"], "failed": result["failed"], "p50": p50, "p99": p99,
            "overflows": None if None in (before, after) else after - before,
            "errors": result["errors"]}


def good_client(setup, count):
    """``count`` new tunnels one after another (connect, SOCKS, handshake, echo): times."""
    times = []
    for _ in range(count):
        began = time.monotonic()
        measure.one_echo(setup.route)
        times.append(time.monotonic() - began)
    return sorted(times)


def test_attack(setup, attacked, options):
    server = setup.children[1]
    load = None
    if attacked:
        load = Load("_attack", json.dumps(server.address), options.slow, options.silent)
        opened = json.loads(load.line(timeout=180))
    cpu_before = machine.cpu_seconds([server.pid])
    try:
        rtts = probe(setup.route, options.window, tunnels=5)
        opens = good_client(setup, 20)
    finally:
        cpu_after = machine.cpu_seconds([server.pid])
        if load:
            load.stop()
    result = {"rtt_p99": percentiles(rtts)[1], "open_p50": percentiles(opens)[0],
              "open_max": opens[-1] * 1000,
              "server_cpu": None if None in (cpu_before, cpu_after) else cpu_after - cpu_before}
    if attacked:
        result.update(opened)
    return result


def limited(limit):
    """(the command prefix that starts a bridge under ``limit``, the cgroup to remove
    afterwards or None). RuntimeError when this machine cannot impose it."""
    if limit == "none":
        return [], None
    if limit == "nofile":
        return ["prlimit", "--nofile=%d:%d" % (NOFILE_LIMIT[0], NOFILE_LIMIT[0]), "--"], None
    # A pids cgroup of its own (cgroup v1's pids controller): RLIMIT_NPROC binds no root
    # process, and counts a user's tasks, not one process's.
    group = "/sys/fs/cgroup/pids/obfsproxy-fairness-%d" % os.getpid()
    try:
        os.mkdir(group)
        with open(os.path.join(group, "pids.max"), "w") as limit_file:
            limit_file.write("%d\n" % TASK_LIMIT)
    except OSError as exc:
        raise RuntimeError("no task limit here (cannot make a pids cgroup: %s)" % (exc.strerror or exc))
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', group], group


NOFILE_LIMIT = [1024]       # the descriptors of a bridge under "nofile" (--quick: fewer)


def start_bridge(setup, options, state_dir, prefix):
    """A server of the setup's kind and transport in front of the sink, under ``prefix``."""
    if setup.server_kind == "ours":
        return children.start_ours(options.obfsproxy, "server", setup.transport, setup.sink.address,
                                   state_dir=state_dir, env=setups.ours_environment(setup.name),
                                   prefix=prefix)
    return children.start_obfs4proxy(options.obfs4proxy, "server", setup.transport, state_dir,
                                     setup.sink.address, prefix=prefix)


def proc_counts(pid):
    """(threads, open descriptors) of ``pid``, or (None, None) without /proc."""
    try:
        with open("/proc/%d/status" % pid) as status:
            threads = int(re.search(r"^Threads:\s+(\d+)", status.read(), re.M).group(1))
        return threads, len(os.listdir("/proc/%d/fd" % pid))
    except (OSError, AttributeError):
        return None, None


def hold_phase(route, bridge, seconds, attack=None):
    """``seconds`` of a good client opening a tunnel every GOOD_EVERY s beside 5 echoing
    tunnels (opened before the attack: live tunnels), with ``attack`` = (slow, silent)
    sockets on the bridge, or none."""
    load, opened = None, {}
    echo = Load("_probe", spec_of(route), seconds, 5, 1)
    opens, failed, most = [], 0, [0, 0]
    try:
        if echo.line(timeout=60) != "OPEN":
            raise RuntimeError("the echoing tunnels did not open")
        if attack:
            load = Load("_attack", json.dumps(bridge.address), attack[0], attack[1])
            opened = json.loads(load.line(timeout=300))
        cpu_before = machine.cpu_seconds([bridge.pid])
        echo.tell("GO")
        began = time.monotonic()
        end, tick = began + seconds, began
        while time.monotonic() < end:
            start = time.monotonic()
            try:
                measure.one_echo(route)
                opens.append(time.monotonic() - start)
            except Exception:        # refused, reset or timed out: a failed open
                failed += 1
            for index, count in enumerate(proc_counts(bridge.pid)):
                most[index] = max(most[index], count or 0)
            tick += GOOD_EVERY
            time.sleep(max(0.0, tick - time.monotonic()))
        cpu_after = machine.cpu_seconds([bridge.pid])
        try:
            rtts = sorted(json.loads(echo.line(timeout=seconds + 60))["rtts"])
            echo_error = None
        except (RuntimeError, ValueError, KeyError) as exc:    # a tunnel cut: said, not raised
            rtts, echo_error = [], str(exc)[-200:]
    finally:
        echo.stop()
        if load:
            load.stop()
    opens.sort()
    p50, p99 = percentiles(opens)
    return {"open_p50": p50, "open_p99": p99, "open_max": opens[-1] * 1000 if opens else None,
            "failed": failed, "opens": len(opens), "rtt_p99": percentiles(rtts)[1],
            "echo_error": echo_error,
            "cpu": None if None in (cpu_before, cpu_after) else cpu_after - cpu_before,
            "threads": most[0], "fds": most[1], "opened": opened.get("opened"),
            "refused": opened.get("refused")}


def test_hold(setup, limit, options, state_dir):
    """The held attack (``hold`` in the docstring) on a bridge started under ``limit``."""
    prefix, group = limited(limit)
    bridge = None
    try:
        bridge = start_bridge(setup, options, state_dir, prefix)
        route = routes.Route(setup.route.first_hop, bridge.address, bridge.args, timeout=GOOD_TIMEOUT)
        attack = (0, options.nofile_silent) if limit == "nofile" else (options.hold_slow, options.hold_silent)
        quiet = hold_phase(route, bridge, options.hold_quiet)
        attacked = hold_phase(route, bridge, options.hold, attack)
    finally:
        if bridge is not None:
            bridge.stop()
        if group is not None:
            try:
                os.rmdir(group)
            except OSError:
                pass
    return {"quiet": quiet, "attacked": attacked, "attack": attack}


# --- Report ---------------------------------------------------------------------------------

def ratio(ours, theirs):
    if ours is None or not theirs:
        return "-"
    return "%.2fx" % (ours / theirs)


def pairs(names):
    """(ours, obfs4proxy) setup names of the same transport, both in this run."""
    return [(name, "o4p-" + name[len("ours-"):]) for name in names
            if name.startswith("ours-") and "o4p-" + name[len("ours-"):] in names]


def tables(results, options):
    lines = []
    fmt = report.fmt
    if "latency" in results:
        lines.append("Interactive RTT, ms, p50 / p99 (median over %d repetitions; bulk MB/s)"
                     % options.reps)
        header = ["setup"] + ["%d bulk" % level for level in options.levels]
        rows = []
        for name in options.setups:
            row = [name]
            for level in options.levels:
                cell = results["latency"].get((name, level))
                row.append("-" if not cell else "%s / %s%s" % (
                    fmt(cell["p50"], 2), fmt(cell["p99"], 1),
                    "" if cell["bulk_mbs"] is None else " (%s MB/s)" % fmt(cell["bulk_mbs"], 0)))
            rows.append(row)
        for ours, theirs in pairs(options.setups):
            row = ["%s / o4p" % ours]
            for level in options.levels:
                a = results["latency"].get((ours, level))
                b = results["latency"].get((theirs, level))
                row.append("-" if not (a and b) else "%s / %s" % (ratio(a["p50"], b["p50"]),
                                                                   ratio(a["p99"], b["p99"])))
            rows.append(row)
        lines.append(report.table(header, rows))
        lines.append("floors: ratio p50 and p99 <= 1.5x at 1, 4 and 16 bulk; p50 <= 2.0x at 0 bulk")
        lines.append("")
    if results.get("iat2"):
        lines.append("iat-mode 2 tunnel's own upload, MB/s: unloaded -> beside 4 bulk (loaded / unloaded)")
        rows = []
        for name in options.setups:
            cell = results["iat2"].get(name)
            if cell:
                rows.append([name, "%s -> %s (%s)" % (fmt(cell["unloaded"], 3), fmt(cell["loaded"], 3),
                                                      ratio(cell["loaded"], cell["unloaded"]))])
        lines.append(report.table(["setup", "paced tunnel"], rows))
        lines.append("floor: loaded / unloaded >= 0.7 (obfs4proxy measured 0.76 in the study)")
        lines.append("")
    if "storm" in results:
        lines.append("%d connections at once beside 4 bulk tunnels" % options.storm)
        rows = []
        for name in options.setups:
            cell = results["storm"].get(name)
            if cell:
                rows.append([name, fmt(cell["took"], 2), "%d" % cell["failed"],
                             "%s / %s" % (fmt(cell["p50"], 0), fmt(cell["p99"], 0)),
                             "-" if cell["overflows"] is None else "%d" % cell["overflows"]])
        for ours, theirs in pairs(options.setups):
            a, b = results["storm"].get(ours), results["storm"].get(theirs)
            if a and b:
                rows.append(["%s / o4p" % ours, ratio(a["took"], b["took"]), "", "%s / %s" % (
                    ratio(a["p50"], b["p50"]), ratio(a["p99"], b["p99"])), ""])
        lines.append(report.table(["setup", "all echoed, s", "failed", "echo p50 / p99, ms",
                                  "listen overflows"], rows))
        lines.append("floor: time <= 1.5x obfs4proxy's, 0 failures, 0 listen overflows")
        lines.append("")
    if "attack" in results:
        lines.append("%d slow (1 byte/s) + %d silent connections to the bridge port: with / without"
                     % (options.slow, options.silent))
        rows = []
        for name in options.setups:
            cell = results["attack"].get(name)
            if cell and cell.get("with") and cell.get("without"):
                w, wo = cell["with"], cell["without"]
                rows.append([name, "%s -> %s (%s)" % (fmt(wo["rtt_p99"], 1), fmt(w["rtt_p99"], 1),
                                                      ratio(w["rtt_p99"], wo["rtt_p99"])),
                             "%s -> %s (%s)" % (fmt(wo["open_p50"], 1), fmt(w["open_p50"], 1),
                                                ratio(w["open_p50"], wo["open_p50"])),
                             "%s -> %s" % (fmt(wo["open_max"], 0), fmt(w["open_max"], 0)),
                             fmt(w["server_cpu"], 2), "%s/%s" % (w.get("opened"), w.get("refused"))])
        lines.append(report.table(["setup", "tunnel echo p99, ms", "good open p50, ms",
                                  "good open max, ms", "bridge CPU s", "attack opened/refused"], rows))
        lines.append("floor: with / without <= 2x for the echo p99 and the good client's open time")
        lines.append("")
    if results.get("hold"):
        lines.append("Attack held %.0f s (%d silent + %d slow; nofile: %d silent under ulimit -n %d; "
                     "tasks: a %d-task cgroup); good client every %.1f s: quiet -> attacked"
                     % (options.hold, options.hold_silent, options.hold_slow, options.nofile_silent,
                        NOFILE_LIMIT[0], TASK_LIMIT, GOOD_EVERY))
        rows = []
        for limit in HOLD_LIMITS:
            for name in options.setups:
                cell = results["hold"].get((name, limit))
                if not cell:
                    continue
                if "error" in cell:
                    rows.append([name, limit, cell["error"], "", "", "", ""])
                    continue
                q, a = cell["quiet"], cell["attacked"]
                rows.append([name, limit,
                             "%s / %s -> %s / %s" % (fmt(q["open_p50"], 1), fmt(q["open_p99"], 1),
                                                     fmt(a["open_p50"], 1), fmt(a["open_p99"], 1)),
                             "%d of %d" % (a["failed"], a["failed"] + a["opens"]),
                             "%s -> %s (%s)" % (fmt(q["rtt_p99"], 1), fmt(a["rtt_p99"], 1),
                                                ratio(a["rtt_p99"], q["rtt_p99"])),
                             fmt(a["cpu"], 1), "%s / %s" % (a["threads"], a["fds"])])
            for ours, theirs in pairs(options.setups):
                a, b = results["hold"].get((ours, limit)), results["hold"].get((theirs, limit))
                if a and b and "error" not in a and "error" not in b:
                    rows.append(["%s / o4p" % ours, limit, "open p99 %s" % ratio(
                        a["attacked"]["open_p99"], b["attacked"]["open_p99"]),
                        "%d vs %d" % (a["attacked"]["failed"], b["attacked"]["failed"]),
                        "echo p99 %s" % ratio(a["attacked"]["rtt_p99"], b["attacked"]["rtt_p99"]), "", ""])
        lines.append(report.table(["setup", "limit", "good open p50 / p99, ms", "failed opens",
                                  "echo p99, ms (attacked / quiet)", "bridge CPU s", "threads / fds max"],
                                 rows))
        lines.append("floors: attacked open p99 <= 2x obfs4proxy's; 0 failed opens under every limit; "
                     "echo p99 attacked / quiet <= 2x")
        lines.append("")
    return "\n".join(lines)


def parse_options(argv):
    parser = argparse.ArgumentParser(description="Fairness of a shared bridge, ours against "
                                     "obfs4proxy; see this file's docstring.")
    parser.add_argument("--quick", action="store_true",
                        help="one repetition, 2-s windows, levels 0 and 4, a 200-connection storm, "
                             "a 200 + 200 attack")
    parser.add_argument("--setups", default=",".join(DEFAULT_SETUPS))
    parser.add_argument("--tests", default=",".join(TESTS))
    parser.add_argument("--levels", help="bulk tunnels beside the interactive ones [0,1,4,16]")
    parser.add_argument("--reps", type=int, help="repetitions of the latency test [3]")
    parser.add_argument("--window", type=float, help="seconds per latency window [5]")
    parser.add_argument("--storm", type=int, help="connections in the storm [2000]")
    parser.add_argument("--slow", type=int, help="slow attack connections [2000]")
    parser.add_argument("--silent", type=int, help="silent attack connections [2048]")
    parser.add_argument("--hold", type=float, help="seconds the held attack lasts [90; quick: 3, "
                        "obfs4 only]")
    parser.add_argument("--hold-silent", type=int, help="silent sockets in the held attack [3000]")
    parser.add_argument("--hold-slow", type=int, help="slow sockets in the held attack [1000]")
    parser.add_argument("--limits", default=",".join(HOLD_LIMITS),
                        help="the held attack's limits, of %s" % ", ".join(HOLD_LIMITS))
    parser.add_argument("--obfsproxy", default=os.path.join(setups.ROOT, "obfsproxy.py"))
    parser.add_argument("--obfs4proxy", default=shutil.which("obfs4proxy") or "/usr/bin/obfs4proxy")
    parser.add_argument("--json", metavar="PATH")
    options = parser.parse_args(argv)
    quick = options.quick
    options.levels = [int(x) for x in (options.levels or ("0,4" if quick else "0,1,4,16")).split(",")]
    options.reps = options.reps or (1 if quick else 3)
    options.window = options.window or (2.0 if quick else 5.0)
    options.storm = options.storm or (200 if quick else 1000)
    options.slow = options.slow or (200 if quick else 2000)
    options.silent = options.silent or (200 if quick else 2048)
    options.hold = options.hold or (3.0 if quick else 90.0)
    options.hold_quiet = 1.0 if quick else 10.0
    options.hold_silent = options.hold_silent or (150 if quick else 3000)
    options.hold_slow = options.hold_slow or (50 if quick else 1000)
    NOFILE_LIMIT[0] = 128 if quick else 1024       # quick: still more silent sockets than fds
    options.nofile_silent = 250 if quick else 2000
    options.limits = [name for name in options.limits.split(",") if name]
    options.setups = [name for name in options.setups.split(",") if name]
    options.tests = [name for name in options.tests.split(",") if name]
    unknown = [name for name in options.setups if name not in setups.SETUPS]
    if unknown or set(options.tests) - set(TESTS) or set(options.limits) - set(HOLD_LIMITS):
        wrong = (unknown + sorted(set(options.tests) - set(TESTS))
                 + sorted(set(options.limits) - set(HOLD_LIMITS)))
        parser.error("unknown setup or test: %s" % ", ".join(wrong))
    if not os.path.exists(options.obfs4proxy):
        print("obfs4proxy not found: measuring ours alone, no ratios", file=sys.stderr)
        options.setups = [name for name in options.setups if not name.startswith("o4p-")]
    return options


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    commands = {"_bulk": bulk_main, "_probe": probe_main, "_storm": storm_main, "_attack": attack_main}
    if argv[:1] and argv[0] in commands:
        return commands[argv[0]](*argv[1:])
    options = parse_options(argv)
    machine.raise_fd_limit()
    # setups.Setup reads these from bench.py's own options; fairness needs no others.
    options.profile = None
    meter = machine.Meter()
    sink = children.start_sink()
    running = [setups.Setup(name, options, sink, meter) for name in options.setups]
    results = {test: {} for test in options.tests}
    began = time.monotonic()

    def turns(rep):
        """The setups in this repetition's order: rotated each time."""
        shift = rep % len(running)
        return [s for s in running[shift:] + running[:shift] if s.route is not None]

    def attempt(setup, what, work, *args):
        try:
            return work(setup, *args)
        except Exception as exc:            # a failure is reported, not raised
            setup.say("%s FAILED: %s: %s" % (what, type(exc).__name__, exc))
            return None

    try:
        with tempfile.TemporaryDirectory(prefix="fairness-") as state_dir:
            for number, setup in enumerate(running):
                setup.start(os.path.join(state_dir, str(number)))
            if "latency" in options.tests:
                for level in options.levels:
                    found = {}
                    for rep in range(options.reps):
                        for setup in turns(rep):
                            cell = attempt(setup, "latency", test_latency, level, options)
                            if cell:
                                found.setdefault(setup.name, []).append(cell)
                                setup.say("%d bulk: RTT p50 %.2f ms, p99 %.1f ms (%d echoes)"
                                          % (level, cell["p50"], cell["p99"], cell["n"]))
                    for name, cells in found.items():
                        results["latency"][(name, level)] = {
                            key: (None if any(c[key] is None for c in cells)
                                  else measure.median([c[key] for c in cells]))
                            for key in ("p50", "p99", "bulk_mbs")}
            obfs4 = [s for s in running if s.transport == "obfs4"]
            if "iat2" in options.tests:
                for setup in turns(0):
                    if setup in obfs4:
                        unloaded = attempt(setup, "iat2", test_iat2, False)
                        loaded = attempt(setup, "iat2", test_iat2, True)
                        if unloaded and loaded:
                            results["iat2"][setup.name] = {"unloaded": unloaded["rate"],
                                                           "loaded": loaded["rate"]}
                            setup.say("iat-mode 2: %.3f -> %.3f MB/s" % (unloaded["rate"], loaded["rate"]))
            if "storm" in options.tests:
                for setup in turns(1):
                    cell = attempt(setup, "storm", test_storm, options)
                    if cell:
                        results["storm"][setup.name] = cell
                        setup.say("storm: %.2f s, %d failed, %s overflows" % (
                            cell["took"], cell["failed"], cell["overflows"]))
            if "attack" in options.tests:
                for setup in turns(0):
                    if not setup.children:
                        continue
                    cell = {"without": attempt(setup, "attack", test_attack, False, options),
                            "with": attempt(setup, "attack", test_attack, True, options)}
                    results["attack"][setup.name] = cell
                    if cell["with"] and cell["without"]:
                        setup.say("attack: echo p99 %.1f -> %.1f ms, good open p50 %.1f -> %.1f ms"
                                  % (cell["without"]["rtt_p99"], cell["with"]["rtt_p99"],
                                     cell["without"]["open_p50"], cell["with"]["open_p50"]))
            if "hold" in options.tests:
                for limit in options.limits:
                    for number, setup in enumerate(turns(0)):
                        if not setup.children or setup.transport == "webtunnel":
                            continue
                        if options.quick and setup.transport != "obfs4":   # quick: one pair
                            continue
                        directory = os.path.join(state_dir, "hold-%s-%d" % (limit, number))
                        os.makedirs(directory, exist_ok=True)
                        try:
                            cell = test_hold(setup, limit, options, directory)
                        except Exception as exc:        # reported in the table, not raised
                            cell = {"error": "%s: %s" % (type(exc).__name__, str(exc)[:80])}
                            setup.say("hold (%s) FAILED: %s" % (limit, cell["error"]))
                        else:
                            a = cell["attacked"]
                            setup.say("hold (%s): open p99 %s ms, %d failed, echo p99 %s ms, %s threads, "
                                      "%s fds" % (limit, report.fmt(a["open_p99"], 1), a["failed"],
                                                  report.fmt(a["rtt_p99"], 1), a["threads"], a["fds"]))
                        results["hold"][(setup.name, limit)] = cell
    finally:
        for setup in running:
            setup.stop()
        sink.stop()
    print()
    print("fairness, %s; obfsproxy.py %s; took %.0f s"
          % (time.strftime("%Y-%m-%d %H:%M"), machine.describe_tree(options.obfsproxy),
             time.monotonic() - began))
    print()
    print(tables(results, options))
    print("Ratios are ours / obfs4proxy's in the same run; absolute figures move with the "
          "machine's other load.")
    if options.json:
        with open(options.json, "w") as out:
            json.dump({test: {str(k): v for k, v in found.items()} for test, found in results.items()},
                      out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
