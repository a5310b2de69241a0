"""The tables: every figure of every setup, and ours / obfs4proxy against the targets."""

import os
import subprocess
import sys

from children import BENCH, test_helpers
from traffic import TOR_TURNS, MiB

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


# The targets, ours / obfs4proxy on the same transport in one run (obfs4's are "at
# Go's speed": with PyNaCl, and on pycryptodome alone):
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


WEBTUNNEL_SETUPS = ("ours-webtunnel", "ours-webtunnel-unshaped", "ours-webtunnel-pyssl", "ours-webtunnel-tls",
                    "nginx-upgrade")


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
                               ("Tor's first turns p50 ms (setup included)", "flights_p50", 2),
                               ("Tor's first turns p99 ms", "flights_p99", 2),
                               ("Tor's first turns CPU ms (all tunnel processes)", "flights_cpu", 2),
                               ("open %d tunnels s" % options.tunnels, "open_s", 2),
                               ("echo %dx64KiB s" % options.tunnels, "echo_s", 2)]:
        row = [label] + [cell(results[name], key, digits) for name in names]
        ours, top = results.get("ours-webtunnel", {}).get(key), (ceiling or {}).get(key)
        ok = isinstance(ours, (int, float)) and isinstance(top, (int, float)) and top
        row.append("%.2fx" % (ours / top) if ok else "n/a")
        rows.append(row)
    return table(["webtunnel"] + names + ["ours-webtunnel / nginx-upgrade"], rows) + shaping_bytes()


def shaping_bytes(seeds=200):
    """What record shaping adds on the wire per tunnel and direction: 22 bytes (a header,
    the inner type and the tag) per record beyond one per write, on Tor's first turns
    (traffic.TOR_TURNS) and over the whole window (the rest in 4 KiB writes), averaged over
    ``seeds`` connections' cuts. Exact for those writes: the records follow from the cuts
    alone (the live tests read them off captures)."""
    root = os.path.dirname(os.path.dirname(BENCH))
    if root not in sys.path:
        sys.path.insert(0, root)
    import random

    import webtunnel
    turns = rest = 0
    for seed in range(seeds):
        shaper = webtunnel.Shaping(random=lambda seed=seed: random.Random(seed)).start()
        turns += sum(len(shaper.cut(bytes(size))) - 1 for size in TOR_TURNS)
        while shaper.active:
            rest += len(shaper.cut(bytes(4096))) - 1
    on_turns = 22.0 * turns / seeds
    return ("\nrecord shaping on the wire, per tunnel and direction (%d connections' cuts): +%.0f bytes "
            "on Tor's first turns (%d bytes written), +%.0f bytes over its whole %d KiB window"
            % (seeds, on_turns, sum(TOR_TURNS), on_turns + 22.0 * rest / seeds,
               webtunnel.SHAPED_BYTES // 1024))
