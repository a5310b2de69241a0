"""Watching a process from outside, on Linux: its descriptors and threads, its memory
and CPU time (/proc/PID/fd, status, stat), and its TCP sockets with their states
(/proc/PID/net/tcp*). A helper for tests that start the real program (test_proxy.py,
test_stress.py); ``needs_proc`` skips such a test where there is no /proc."""

import os

import pytest

LINUX_PROC = os.path.isdir("/proc/self/fd") and os.path.exists("/proc/self/net/tcp")
needs_proc = pytest.mark.skipif(not LINUX_PROC, reason="reads /proc (Linux)")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def fd_count(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def fd_kinds(pid):
    """What each open descriptor is (socket:[...], pipe:[...], anon_inode:[eventpoll]),
    for a failure message that says which ones stayed."""
    folder = "/proc/%d/fd" % pid
    found = {}
    for name in os.listdir(folder):
        try:
            found[int(name)] = os.readlink(os.path.join(folder, name))
        except OSError:
            pass
    return found


def proc_number(pid, name, label, column=1):
    """The number in ``column`` of the line of /proc/PID/<name> that starts
    with ``label`` (/proc/PID/status, /proc/PID/limits)."""
    with open("/proc/%d/%s" % (pid, name)) as f:
        for line in f:
            if line.startswith(label):
                return int(line.split()[column])
    raise AssertionError("no %r line in /proc/%d/%s" % (label, pid, name))


def thread_count(pid):
    return proc_number(pid, "status", "Threads:")


# A proxy at rest runs its main thread (the accept loop) and its listener's
# poller (handshake_scheduler.Waits), which starts with the listener and never idles out,
# so that no connection ever needs a thread start for it.
AT_REST = 2


def rss_bytes(pid):
    return proc_number(pid, "status", "VmRSS:") * 1024


def cpu_seconds(pid):
    """User + system CPU time of the whole process (all its threads)."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK   # utime, stime: fields 14, 15


TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN",
              11: "CLOSING"}


def tcp_sockets(pid):
    """[(state name, timer, local port, remote port)] for the TCP sockets that
    ``pid`` holds a descriptor for (matched by inode in /proc/PID/net/tcp*).

    ``timer`` is /proc/net/tcp's "tr" field: 2 means a keepalive timer runs.
    """
    inodes = set()
    base = "/proc/%d/fd" % pid
    for fd in os.listdir(base):
        try:
            link = os.readlink(os.path.join(base, fd))
        except OSError:   # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open("/proc/%d/net/%s" % (pid, table)) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            # sl local_address rem_address st tx:rx tr:tm->when retrnsmt uid timeout inode
            fields = row.split()
            if fields[9] in inodes:
                found.append((TCP_STATES.get(int(fields[3], 16), fields[3]),
                              int(fields[5].split(":")[0], 16),
                              int(fields[1].rsplit(":", 1)[1], 16),
                              int(fields[2].rsplit(":", 1)[1], 16)))
    return found


def close_wait(pid):
    return [s for s in tcp_sockets(pid) if s[0] == "CLOSE_WAIT"]
