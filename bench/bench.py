#!/usr/bin/env python3
"""bench.py: obfsproxy.py against Debian's obfs4proxy (Go), transport by transport.

Run it from anywhere (it finds obfsproxy.py next to this directory):

    python bench/bench.py --quick      # small and fast (a few minutes): does it all work?
    python bench/bench.py              # the full run: 256 MiB streams, 1,000 connections
    python bench/bench.py --json bench/results/run.json | tee bench/results/run.txt
    python bench/bench.py --fairness   # a shared bridge: one user's load against the others'
                                       # (bench/fairness.py, its own section and docstring)

The parts, each readable alone: traffic.py (test streams, the sink), children.py (starting
ours, obfs4proxy, the sink), routes.py (SOCKS5 and TLS upgrade to the sink), measure.py
(bulk, setups, many tunnels), machine.py (/proc CPU and memory, the noise, py-spy),
setups.py (what each setup is and its life), report.py (tables, targets), ceiling.py
(obfs4's per-frame ceiling); this file is the options and the run's order.

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
    ours-obfsN-stdlib  ours with OBFSPROXY_CRYPTO=stdlib: no package, the system's
                     libraries through ctypes then plain Python
    ours-obfs4-pyz   the one-file build at both ends, run bare (python3 -I -S obfsproxy.pyz,
                     --pyz or built by tools/make_pyz.py for the run): every system library
                     it finds (libsodium first); -nettle and -libgcrypt leave the others
                     out (OBFSPROXY_CRYPTO_SKIP), -libcrypto all three (Salsa20 in plain
                     Python), -python every library (OBFSPROXY_CRYPTO=python)
    ours-webtunnel   python obfsproxy.py client ==TLS==> nginx (tests/nginx.py's configuration,
                     the README's) --> python obfsproxy.py server (plain HTTP) --> sink; the
                     client trusts a test CA (tests/testca.py) through SSL_CERT_FILE
    ours-webtunnel-tls  the same without nginx: our server terminates TLS itself (tls-cert=)
    ours-webtunnel-unshaped  ours-webtunnel with record shaping off (shaping=off on both
                     sides): what cutting and pacing the first 16 KiB costs
    ours-webtunnel-pyssl  ours-webtunnel with OBFSPROXY_HELLO=python: the client on Python's
                     ssl (ours-webtunnel runs the browser route, curl_cffi, when it is installed)
    ours-meek        python obfsproxy.py client ==TLS, POSTs==> nginx (tests/nginx.py's meek
                     block) --> python obfsproxy.py server (plain HTTP) --> sink
    o4p-to-ours-meek the same with obfs4proxy's meek_lite client
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
          webtunnel setups also play "Tor's first turns" in each round, as many
          connections again: each writes Tor's first writes through webtunnel
          (traffic.TOR_TURNS: 517, 80, 33, 1050, ... bytes) one at a time and waits for
          the echo of each, so that record shaping (ours-webtunnel-unshaped has it
          off) shows its cost: p50/p99 ms of the whole connection and the tunnel
          processes' CPU. Its bytes on the wire follow from the cuts alone (22 per
          extra record); the webtunnel table ends with them (report.shaping_bytes).
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
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from ceiling import ceiling_main, describe_ceiling, measure_ceiling
from children import start_sink
from machine import Meter, describe_tree, load_average, raise_fd_limit
from measure import Digests
from report import (
    CEILING_SETUPS,
    TARGETS,
    WEBTUNNEL_SETUPS,
    fmt,
    nginx_stream_module,
    ratio_table,
    results_table,
    webtunnel_table,
)
from setups import DEFAULT_SETUPS, PYZ_SETUPS, SETUPS, Setup
from traffic import sink_main

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MiB = 1 << 20
SETUP_ROUNDS = 10                           # the setup test takes turns in this many rounds
PHASES = ("bulk", "setup", "tunnels")       # in this order; --phases picks some


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
    parser.add_argument("--pyz", metavar="PATH",
                        help="the obfsproxy.pyz of the ours-obfs4-pyz setups [built from the "
                             "checkout by tools/make_pyz.py for the run]")
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
    if "--fairness" in argv:                   # its own section: bench/fairness.py
        import fairness
        return fairness.main([arg for arg in argv if arg != "--fairness"])
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

    pyz_dir = None
    if any(name in PYZ_SETUPS for name in options.setups) and not options.pyz:
        pyz_dir = tempfile.mkdtemp(prefix="bench-pyz-")
        options.pyz = os.path.join(pyz_dir, "obfsproxy.pyz")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_pyz.py"), options.pyz],
                       check=True, capture_output=True, timeout=300)
    if options.pyz:
        info["pyz"] = "%s (%d bytes)" % (options.pyz, os.path.getsize(options.pyz))
        print("pyz:        %s" % info["pyz"], file=sys.stderr, flush=True)

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
        if pyz_dir:
            shutil.rmtree(pyz_dir, ignore_errors=True)
    other, available = meter.other_since(at_start)
    info["other_cpu"] = 100 * other / available if available else None
    info["load_end"] = load_average()
    info["seconds"] = round(time.monotonic() - began, 1)

    print()
    print("obfsproxy.py benchmark, %s; %s" % (info["date"], info["host"]))
    print("obfsproxy.py: %s" % info["obfsproxy"])
    print("obfs4proxy:   %s" % info["obfs4proxy"])
    if info.get("pyz"):
        print("pyz:          %s" % info["pyz"])
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
