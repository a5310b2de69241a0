"""What the machine and our processes spend: CPU and memory from /proc (None where
there is no /proc), other people's share of the CPU (the noise), and py-spy profiles."""

import os
import re
import shutil
import signal
import subprocess
import time

from children import Child


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
