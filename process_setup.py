"""process_setup.py: what a long-running proxy does once, before and around serving.

Its listening sockets (``listen``, with the system's largest backlog), the
signals that stop it (``install_signal_handlers``), and the process's limits:
smaller thread stacks, enough file descriptors for --max-connections, the
ceiling at which pending handshakes make room (``descriptor_ceiling``), a
short GIL switch interval, and the start-up's objects frozen out of the
garbage collector's way (``prepare_for_serving``). The listener (listener.py)
serves; this sets the process up for it.
"""

import gc
import os
import socket
import sys
import threading

from proxy import log

THREAD_STACK = 512 * 1024   # per handshake thread (the default is 8 MiB of address space)


def somaxconn():
    """The system's limit on a listen backlog: a larger backlog is cut to it, a
    smaller one overflows first (obfs4proxy, like every Go server, listens with it)."""
    try:
        with open("/proc/sys/net/core/somaxconn") as limit:
            return max(int(limit.read()), 1)
    except (OSError, ValueError):
        return socket.SOMAXCONN


def listen(address, backlog=None):
    """A listening socket on (host, port); port 0 picks a free one. The backlog
    is the system's most (``somaxconn``) unless given: a storm of connections
    must wait in it, not be dropped by it."""
    if backlog is None:
        backlog = somaxconn()
    host, port = address
    family, kind, proto, _, sockaddr = socket.getaddrinfo(
        host, port, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        if sys.platform == "win32":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        if isinstance(exc, PermissionError) and 0 < port < 1024 and sys.platform != "win32":
            raise PermissionError(exc.errno, "%s (ports below 1024 need root or the "
                                  "CAP_NET_BIND_SERVICE capability)" % exc.strerror)
        raise
    return sock


# The signals that stop the process: what an operator (kill, systemd, logrotate
# scripts), Tor, or a terminal (Ctrl-C, Ctrl-\, a closed window's SIGHUP; on
# Windows Ctrl-Break) sends. Each one's default action ends the process anyway;
# handled, the end is told in the log and every live tunnel is reset, in order.
# SIGQUIT too: its core dump of an interpreter helps nobody, and a user who
# presses Ctrl-\ wants the process gone. SIGUSR1 and SIGUSR2 too: we give them no
# other meaning, and whoever sends one to a process that does not handle it
# means it to end.
STOP_SIGNALS = ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGBREAK")


def install_signal_handlers(listener):
    """SIGINT first: stop accepting, let tunnels finish (up to
    Listener.GRACE_SECONDS). Any of STOP_SIGNALS, or SIGINT a second time: stop
    now. One more while stopping now: exit at once (``os._exit``).

    Stopping now resets the tunnels still live, then the process ends: the
    garbage collector's last pass over every tunnel's objects at interpreter
    exit is skipped (``gc.freeze``), since the OS frees the memory anyway.
    With 9,900 open tunnels that pass alone held the exit for 2-3 s. Exiting
    at once loses nothing: every live tunnel's sockets reset when the kernel
    closes them (``listener.reset_on_close``)."""
    import signal

    def exit_soon():
        gc.disable()
        getattr(gc, "freeze", lambda: None)()   # 3.6 has no freeze

    def on_int(signum, frame):
        if listener.stopping_now:
            os._exit(128 + signum)
        listener.stop(graceful=True)
        if listener.stopping_now:
            exit_soon()

    def on_stop(signum, frame):
        if listener.stopping_now:
            os._exit(128 + signum)
        listener.stop(graceful=False)
        exit_soon()

    signal.signal(signal.SIGINT, on_int)
    for name in STOP_SIGNALS:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), on_stop)


# While one thread does key work, the pump waking up waits for the GIL up to
# the switch interval (5 ms by default) at every step: 1 ms keeps a tunnel's
# round trip at a few milliseconds during a handshake flood (measured with
# obfs2 shared secrets: mean 12 ms at 5 ms, 3 ms at 1 ms).
SWITCH_INTERVAL = 0.001


def prepare_for_serving(max_connections):
    """What every long-running mode does once, before it listens: smaller
    thread stacks, enough file descriptors, a short GIL switch interval, and
    the start-up's objects out of the garbage collector's way.

    Why the last: a pass over the collector's oldest generation scans every
    tracked object in one go, on whichever thread triggers it, and start-up
    leaves ~22,000 there (modules, classes, pycryptodome's and docopt's
    tables): such a pass held a connection up for 20-30 ms, about once per
    2,000 sequential setups. Collected once and frozen (``gc.freeze``: never
    scanned again), they cost nothing."""
    threading.stack_size(THREAD_STACK)
    raise_descriptor_limit(max_connections)
    if sys.getswitchinterval() > SWITCH_INTERVAL:
        sys.setswitchinterval(SWITCH_INTERVAL)
    gc.collect()
    getattr(gc, "freeze", lambda: None)()   # 3.6 has no freeze: it scans them


def descriptor_ceiling():
    """The descriptor number from which a new connection first makes room, by
    dropping the handshake that has waited longest for its client: the soft
    RLIMIT_NOFILE less a reserve (an eighth, or 64 if more, but at most a
    quarter) for what connections
    being set up still open (a connection to --dest each, a pump's wake-up
    pair, a log file). Pending handshakes then never take the descriptors a
    prompt client needs. None where descriptors are not small numbers handed
    out lowest first (Windows), or are not limited."""
    try:
        import resource
    except ImportError:
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return soft - max(soft // 8, min(64, soft // 4))


def raise_descriptor_limit(max_connections):
    """Raise the soft RLIMIT_NOFILE as far as --max-connections needs (two
    descriptors a tunnel, and one for each pending handshake, whose limit is
    four times as many): the common default of 1024 would fail connections long
    before the cap. Warn when the hard limit forbids it."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 6 * max_connections + 64
    unlimited = resource.RLIM_INFINITY
    if soft != unlimited and soft < need:
        target = need if hard == unlimited else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != unlimited and soft < need:
        log.warning("only %d file descriptors allowed (ulimit -n); --max-connections=%d "
                    "needs about %d, so connections beyond ~%d will fail",
                    soft, max_connections, need, (soft - 64) // 6)
