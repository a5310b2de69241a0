"""The setups measured (ours, obfs4proxy, webtunnel through nginx, ...) and one setup's
life: start its processes, take its turn in each phase, stop them."""

import os
import sys

from children import Child, start_obfs4proxy, start_ours, test_helpers
from machine import Profiler, memory_mib
from measure import Bulk, Sequential, measure_tunnels, one_flight
from report import fmt
from routes import WEBTUNNEL_NAME, WEBTUNNEL_PATH, Route, UpgradeRoute

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRET = "bench-shared-secret"
TRANSPORTS = ("obfs2", "obfs3", "obfs4")    # each measured against obfs4proxy's own

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
# Each transport on the no-package routes (OBFSPROXY_CRYPTO=stdlib: the system's libraries through ctypes,
# then plain Python), what the .pyz runs on a bare Python; only when named.
for _transport in TRANSPORTS:
    SETUPS["ours-%s-stdlib" % _transport] = ("ours", "ours", _transport)
# obfs4 from the one-file build, run bare at both ends (python3 -I -S obfsproxy.pyz: no
# package), on each system library's route; only when named. {setup: environment}
SKIP_ENV = "OBFSPROXY_CRYPTO_SKIP"
PYZ_SETUPS = {"ours-obfs4-pyz": {},                                       # all it finds: libsodium
              "ours-obfs4-pyz-nettle": {SKIP_ENV: "libsodium,libgcrypt"},
              "ours-obfs4-pyz-libgcrypt": {SKIP_ENV: "libsodium,nettle"},
              # no system library beyond the libcrypto Python's ssl runs: Salsa20 in plain Python
              "ours-obfs4-pyz-libcrypto": {SKIP_ENV: "libsodium,nettle,libgcrypt"},
              "ours-obfs4-pyz-python": {"OBFSPROXY_CRYPTO": "python"}}    # plain Python only
for _name in PYZ_SETUPS:
    SETUPS[_name] = ("ours", "ours", "obfs4")
# webtunnel, only when named: ours through nginx, ours terminating TLS, and nginx alone.
SETUPS.update({"ours-webtunnel": ("ours", "ours", "webtunnel"),
               "ours-webtunnel-tls": ("ours", "ours", "webtunnel"),
               "ours-webtunnel-pyssl": ("ours", "ours", "webtunnel"),
               "ours-webtunnel-unshaped": ("ours", "ours", "webtunnel"),
               "nginx-upgrade": ("nginx", "nginx", None)})
# meek, only when named: our server behind nginx (its meek block), our client or
# obfs4proxy's meek_lite client.
SETUPS.update({"ours-meek": ("ours", "ours", "meek"), "o4p-to-ours-meek": ("o4p", "ours", "meek")})
DEFAULT_SETUPS = ["ours-obfs2", "o4p-obfs2", "ours-obfs3", "o4p-obfs3", "ours-obfs4", "ours-obfs4-portable",
                  "o4p-obfs4", "ours-dummy", "direct"]
CRYPTO_ENV = "OBFSPROXY_CRYPTO"     # obfs4_crypto: "portable" ignores PyNaCl
HELLO_ENV = "OBFSPROXY_HELLO"       # browser_tls: "python" ignores curl_cffi


def ours_environment(name):
    """The environment of our processes for setup ``name``: OBFSPROXY_POOL_SIZE=0 for
    -nopool; OBFSPROXY_CRYPTO=portable for -portable, and no OBFSPROXY_CRYPTO at all
    otherwise (so that "ours-obfs4" runs PyNaCl whenever it is installed)."""
    env = {key: value for key, value in os.environ.items() if key not in (CRYPTO_ENV, HELLO_ENV, SKIP_ENV)}
    env.update(PYZ_SETUPS.get(name, {}))
    if name.endswith("-pyssl"):
        env[HELLO_ENV] = "python"
    if name.endswith("-nopool"):
        env["OBFSPROXY_POOL_SIZE"] = "0"
    if name.endswith("-portable"):
        env[CRYPTO_ENV] = "portable"
    if name.endswith("-stdlib"):
        env[CRYPTO_ENV] = "stdlib"
    return env


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
    if name.endswith("-unshaped"):
        server_options += ";shaping=off"
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
    if name.endswith("-unshaped"):
        args["shaping"] = "off"
    return started, front, args


def start_meek(options, name, sink, directory):
    """ours-meek or o4p-to-ours-meek: nginx (tests/nginx.py's meek block) before our
    server; ([client, server], nginx Child, the client's SOCKS arguments)."""
    nginx, testca = test_helpers()
    ca = testca.make_ca(os.path.join(directory, "ca"))
    env = dict(ours_environment(name), SSL_CERT_FILE=ca.ca_file)
    started, front = [], None
    try:
        started.append(start_ours(options.obfsproxy, "server", "meek", sink, env=env))
        made = nginx.Nginx(os.path.join(directory, "nginx"), started[0].address, ca.cert_file,
                           ca.key_file, path="/meek/", server_name=WEBTUNNEL_NAME,
                           block=nginx.MEEK_SERVER_BLOCK)
        front = Child("nginx", made.process, made.address, None, stop_by_stdin=False)
        front.front = made
        if name == "ours-meek":
            started.insert(0, start_ours(options.obfsproxy, "client", "meek", env=env))
        else:
            saved = os.environ.get("SSL_CERT_FILE")
            os.environ["SSL_CERT_FILE"] = ca.ca_file    # obfs4proxy's Go TLS reads it
            try:
                started.insert(0, start_obfs4proxy(options.obfs4proxy, "client", "meek_lite", directory))
            finally:
                if saved is None:
                    del os.environ["SSL_CERT_FILE"]
                else:
                    os.environ["SSL_CERT_FILE"] = saved
    except BaseException:
        for child in started + ([front] if front else []):
            child.stop()
        raise
    args = {"url": "https://%s/meek/" % WEBTUNNEL_NAME, "front": "127.0.0.1:%d" % front.address[1]}
    return started, front, args


def start_pair(options, client_kind, server_kind, transport, sink, state_dir, extra=(), env=None,
               program=None):
    """Start the server (forwarding to the sink), then the client. Returns [client, server].
    ``program``: ours to run (default --obfsproxy; a .pyz runs bare, python3 -I -S)."""
    started = []
    program = program or options.obfsproxy
    try:
        if server_kind == "ours":
            started.append(start_ours(program, "server", transport, sink, extra,
                                      state_dir=state_dir, env=env))
        else:
            started.append(start_obfs4proxy(options.obfs4proxy, "server", transport, state_dir, sink))
        if client_kind == "ours":
            started.insert(0, start_ours(program, "client", transport, extra=extra,
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
        self.flights = Sequential(one_flight)     # webtunnel: Tor's first turns per tunnel
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
            if self.transport == "meek":
                self.children, self.front, args = start_meek(self.options, self.name,
                                                             self.sink.address, state_dir)
            elif self.transport == "webtunnel":
                # The SOCKS target is a placeholder: webtunnel dials url='s host.
                self.children, self.front, args = start_webtunnel(self.options, self.name,
                                                                  self.sink.address, state_dir)
            else:
                self.children = start_pair(self.options, self.client_kind, self.server_kind,
                                           self.transport, self.sink.address, state_dir,
                                           env=ours_environment(self.name),
                                           program=self.options.pyz if self.name in PYZ_SETUPS else None)
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
        if self.transport == "webtunnel":
            self.measure("setup", lambda: self.flights.round(self.route, count, warmup,
                                                             self.tunnel_pids))

    def setup_done(self):
        if "setup" in self.result["failed"]:
            return
        figures = self.sequential.figures("setup_")
        self.result.update(figures)
        flights = self.flights.figures("flights_")
        self.result.update(flights)
        if flights:
            self.say("Tor's first turns: p50 %.2f ms, p99 %.2f ms, %s ms CPU per tunnel"
                     % (flights["flights_p50"], flights["flights_p99"], fmt(flights.get("flights_cpu"), 2)))
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
