"""obfs4's per-frame ceiling on each crypto route, measured in a child process with
the environment of the setup it belongs to (``bench.py _ceiling``)."""

import json
import os
import subprocess
import sys
import time

from children import BENCH
from setups import ours_environment
from traffic import RANDOM_BLOCK


def measure_ceiling(program, name):
    """obfs4's ceilings on the routes of setup ``name`` ("ours-obfs4": PyNaCl if it
    imports; "ours-obfs4-portable": OBFSPROXY_CRYPTO=portable), measured in a child
    process (``bench.py _ceiling``) with that setup's environment, so that the routes
    are the ones its tunnel processes run. None (and a message) if it fails."""
    result = subprocess.run([sys.executable, BENCH, "_ceiling", program],
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
