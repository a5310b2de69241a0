"""The processes measured: ours, obfs4proxy (managed mode) and the sink, each started
and stopped the way it expects, with the address it listens on."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench.py")
LISTENING = re.compile(r"listening on (\[[0-9a-fA-F:.]+\]|[^ ]+):(\d+)")

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


def start_ours(program, role, transport, dest=None, extra=(), state_dir=None, env=None, prefix=()):
    """Our client or server. An obfs4 server gets --state-dir, and its bridge line's
    arguments (cert=..., iat-mode=0) become the Child's ``args``. ``prefix``: a
    command that runs it (``prlimit ... --``), and must exec it in the same process."""
    bare = ["-I", "-S"] if program.endswith(".pyz") else []      # the one file runs bare
    argv = list(prefix) + [sys.executable] + bare + [program, role, "--transport=" + transport]
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


def start_obfs4proxy(binary, role, transport, state_dir, orport=None, prefix=()):
    """obfs4proxy in managed mode; a server's SMETHOD ARGS (obfs4: cert, iat-mode)
    become the Child's ``args``. ``prefix`` as for start_ours."""
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
    process = subprocess.Popen(list(prefix) + [binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
    process = subprocess.Popen([sys.executable, BENCH, "_sink"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    output = Lines(process.stdout)
    match = output.wait_for(re.compile(r"^SINK (\S+):(\d+)"))
    return Child("sink", process, (match.group(1), int(match.group(2))), output,
                 stop_by_stdin=True)


def test_helpers():
    """tests/testca.py and tests/nginx.py (the nginx configuration the README gives)."""
    tests = os.path.join(os.path.dirname(os.path.dirname(BENCH)), "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import nginx
    import testca
    return nginx, testca
