"""handshake_scheduler.py: when a handshake may run, and what it waits for without a thread.

A bridge many people share must stay open to the client that completes its
handshake promptly, whatever else connects; and the GIL lets one thread run
Python at a time, so handshakes must not fight the pump (relay.py) or the
accept loop for it. Three pieces decide when a handshake's code runs:

* ``Turns`` and ``Turn``: per listening socket, at most TURNS handshakes run
  Python at once, and a thread is given to a handshake only with a turn; the
  rest wait in the queue, with no thread, or (a client's dial to its bridge)
  asleep on a lock of their own. When each thread polled its own socket, a
  thousand clients sending a byte in the same instant woke a thousand
  threads that fought the pump for the GIL (1.6 cores spent, live tunnels
  stalled for seconds), and a storm of 2,000 handshakes left the pump and the
  accept loop a fraction of the GIL. Turns are per listening socket, like the
  key-work slot, so that a flood on one transport's port cannot queue
  another's handshakes.
* ``Waits``: the listener's one poller (epoll, and a thread of its own for
  the listener's life) for every handshake waiting for the network: a socket
  that becomes ready puts its Turn in its listening socket's queue. It also
  keeps the connections whose client has not spoken (``park``), the
  handshakes between two steps (``Turn.suspend``) and the failed handshakes
  that linger before their FIN (``drain``), each costing a descriptor and no
  thread; and it knows, longest first, which of them wait for their own
  client (``idle``), the ones a newer connection may push out.
* ``KeyWork``: one listening socket's slot for expensive handshake work
  (modular exponentiation, X25519, a TLS handshake), and ``Busy``, what a
  handshake that waited past its deadline for this process says.

Nothing here knows transports, tunnels' ends or the log: the listener
(listener.py) owns the tunnels and drives these.
"""

import collections
import contextlib
import select
import socket
import threading
import time
from collections import deque

import outbound


class KeyWork:
    """One listening socket's slot for expensive handshake work (modular
    exponentiation, X25519, shared-secret hashing, a TLS handshake), held while
    a transport that says ``expensive`` runs ``start`` or ``receive``.

    That work holds the GIL: N handshakes computing at once would slow every
    other thread (the pump, the accept loop) N-fold. One at a time per listening
    socket keeps live tunnels flowing; the others queue, each within its own
    handshake deadline. One slot per listening socket, not per process: a
    bridge serving obfs2 with a shared secret (100,000 SHA-256 before the first
    check, so cheap to probe) and obfs4 side by side must not let a flood of
    24-byte obfs2 probes queue obfs4's handshakes behind it (with one slot
    for the process, an obfs4 handshake took 10 s instead of 2.4 ms at 30
    probes a second). Slots made by ``sibling`` share the
    count of handshakes under way, which the pools read (``idle``). Owned by the
    ``Listener``; see also ``process_setup.prepare_for_serving`` (the switch interval).
    """

    def __init__(self, _activity=None):
        self._slot = threading.BoundedSemaphore(1)
        self._activity = _activity or _Activity()

    def sibling(self):
        """A slot of its own that counts in the same activity (another listening socket)."""
        return KeyWork(self._activity)

    def held(self, transport, deadline):
        return _Held(self._slot if transport.expensive else None, deadline)

    def begin(self):
        self._activity.begin()

    def end(self):
        self._activity.end()

    @property
    def handshakes(self):
        return self._activity.handshakes

    def idle(self):
        """True after QUIET_SECONDS without any handshake. The pools refill only
        then, so that their key work never takes a core from a connection being
        set up (a 2-core machine running client, server and application has none
        to spare: refilling right after each take made back-to-back setups slower)."""
        return self._activity.idle()


class _Activity:
    """How many transport handshakes are under way, on any listening socket."""

    def __init__(self):
        self._lock = threading.Lock()
        self.handshakes = 0
        self._last = 0.0              # when the last one ended (time.monotonic())

    def begin(self):
        with self._lock:
            self.handshakes += 1

    def end(self):
        with self._lock:
            self.handshakes -= 1
            self._last = time.monotonic()

    def idle(self):
        return not self.handshakes and time.monotonic() - self._last >= QUIET_SECONDS


QUIET_SECONDS = 0.005   # no handshake for this long: the pools may refill


class Busy(socket.timeout):
    """The deadline passed while this handshake waited for its listener's key-work
    slot or its turn for the CPU (``Turn``): this process was busy, the peer
    did nothing wrong. A socket.timeout, so
    that every path that ends a timed-out handshake ends this one too; the log
    says it as what it is (``why``, ``failure_kind``: "busy")."""


class _Held:
    def __init__(self, slot, deadline):
        self.slot, self.deadline = slot, deadline

    def __enter__(self):
        if self.slot is not None:
            left = self.deadline.remaining()   # passed before any wait here: a timeout, not Busy
            try:
                acquired = self.slot.acquire(timeout=left)
            except socket.timeout:
                acquired = False
            if not acquired:
                raise Busy("the deadline passed while it waited for this process's "
                                     "key work (too many handshakes here at once)")

    def __exit__(self, *exc):
        if self.slot is not None:
            self.slot.release()


HELD, QUEUED, NET, IDLE = "held", "queued", "net", "idle"   # where a Turn is


class Turns:
    """One listening socket's queue for the CPU: at most ``width`` of its
    handshake threads run Python at once, the others in the order they became
    ready, except that a handshake back from the next hop (a connect, the
    bridge's answer) goes first: finishing one frees its thread and starts its
    relay sooner than starting another would. ``running`` hold a turn,
    ``queue`` waits for one; the rest wait for the network. (The width is more
    than one because a turn handed over waits for the GIL, up to the switch
    interval while the pump holds it; with one, handshakes queued on those
    waits.)"""

    def __init__(self, waits, width=None):
        self.waits = waits
        self.width = TURNS if width is None else width
        self.running = 0
        self.queue = deque()

    def pass_on(self):
        """A turn given up goes to the first in the queue (waking only that
        thread), or back to the pool. Called with ``waits.mutex`` held."""
        if self.queue:
            self.queue.popleft().handed()
        else:
            self.running -= 1

    def ready(self, turn):
        """``turn`` may run now: it takes a free turn, or queues for one, at the
        front if it is further along (``Turn.further``; ``waits.mutex`` held)."""
        if self.running < self.width:
            self.running += 1
            turn.handed()
        else:
            if turn.further:
                self.queue.appendleft(turn)
            else:
                self.queue.append(turn)
            turn.state = QUEUED


TURNS = 4      # handshake threads of one listening socket computing at once


class Turn:
    """One handshake's place in its listening socket's ``Turns``. A thread that
    runs the handshake sleeps on a lock of its own while it waits, for the CPU
    or for the network, and is woken only when it may run: so a thousand
    handshakes waiting cost no CPU, and never wake all at once to fight over
    the GIL (the cost measured when each polled its own socket). A handshake
    may also wait with no thread at all (``queue``, ``suspend``): then
    ``resume`` runs, on a thread, once it holds the turn."""

    def __init__(self, turns, client_fd=None, tunnel=None):
        self.turns, self.waits = turns, turns.waits
        self.state = IDLE
        self.fd = None
        self.client_fd = client_fd    # the accepted socket's descriptor
        self.tunnel = tunnel
        self.further = False      # past its client's part: back from the next hop, or a connect
        self.resume = None        # while it waits without a thread: what to run once it holds the turn
        self._wake = threading.Lock()
        self._wake.acquire()

    def handed(self):
        """It holds the turn now (``waits.mutex`` held): wake its thread, or have
        ``resume`` run (``Waits.run_handed``)."""
        self.state = HELD
        resume, self.resume = self.resume, None
        if resume is None:
            self._wake.release()
        else:
            self.waits.handed.append(resume)

    def queue(self, resume):
        """Run ``resume`` on a thread once this handshake holds a turn; no thread
        waits for the turn meanwhile."""
        with self.waits.mutex:
            self.resume = resume
            self.turns.ready(self)
        self.waits.run_handed()

    def take(self, seconds):
        """Wait for the turn; Busy when ``seconds`` pass first."""
        with self.waits.mutex:
            if self.state == HELD:
                return
            self.turns.ready(self)
        self.waits.run_handed()
        self._sleep(seconds)

    def give(self):
        """Give the turn up, if held."""
        with self.waits.mutex:
            if self.state == HELD:
                self.state = IDLE
                self.turns.pass_on()
        self.waits.run_handed()

    def wait(self, sock, write, seconds):
        """Give the turn up until ``sock`` is ready to read (or write), then come
        back with it: True; or socket.timeout when ``seconds`` pass first."""
        if self.waits.epoll is None:       # no epoll here: the thread polls its own socket
            end = time.monotonic() + seconds
            self.give()
            if not outbound.ready(sock, write, seconds):
                raise socket.timeout("timed out")
            self.take(max(end - time.monotonic(), 0.0))
            return True
        self.further = sock.fileno() != self.client_fd
        with self.waits.mutex:
            self.waits.watch(self, sock, write)
            if self.state == HELD:
                self.turns.pass_on()
            self.state = NET
        self.waits.run_handed()
        self._sleep(seconds)
        return True

    def suspend(self, sock, write, until, resume):
        """Give the turn up until ``sock`` is ready to read (or write), or the
        monotonic time ``until``; then ``resume`` runs on a thread, with the
        turn. No thread waits meanwhile."""
        self.further = sock.fileno() != self.client_fd
        with self.waits.mutex:
            self.resume = resume
            self.waits.watch(self, sock, write, until)
            if self.state == HELD:
                self.turns.pass_on()
            self.state = NET
        self.waits.run_handed()

    @contextlib.contextmanager
    def outside(self, deadline):
        """Run a blocking call (a connect) without the turn; take it back after."""
        held = self.state == HELD
        self.give()
        yield
        if held:
            self.further = True
            self.take(max(deadline.end - time.monotonic(), 0.0))

    def _sleep(self, seconds):
        if self._wake.acquire(timeout=max(seconds, 0.0)):
            return
        with self.waits.mutex:
            if self.state == HELD:      # handed over as the time ran out: ours after all
                self._wake.acquire()
                return
            waited_for_cpu = self.state == QUEUED
            if waited_for_cpu:
                self.turns.queue.remove(self)
            elif self.state == NET:
                self.waits.forget(self)
            self.state = IDLE
        if waited_for_cpu:
            raise Busy("the deadline passed while it waited for its turn here "
                       "(too many handshakes at once)")
        raise socket.timeout("timed out")


class Waits:
    """A Listener's one poller (epoll; a thread of its own from ``start`` to
    ``close``) for every handshake waiting for the network: a socket that
    becomes ready puts its Turn in the queue of its listening socket. It also
    keeps, with no thread, the connections whose client has not spoken
    (``park``) and the failed handshakes that linger before their FIN
    (``drain``). Where there is no epoll, each thread polls its own socket
    (``Turn.wait``).

    ``idle``: the handshakes waiting for their own client, longest first, so
    that the one to drop for a newer connection is found at once
    (``take_idle``). ``handed``: what may run now that its handshake holds a
    turn (``Turn.handed``), run outside ``mutex`` by ``run_handed``."""

    def __init__(self):
        self.mutex = threading.Lock()
        self.epoll = select.epoll() if hasattr(select, "epoll") else None
        self._by_fd = {}              # fd -> Turn waiting for it
        self._until = {}              # fd -> when the threadless wait of its Turn ends
        self._parked = {}             # fd -> (tunnel, until, on bytes, on silence)
        self._draining = {}           # fd -> (socket, until, then)
        self.idle = collections.OrderedDict()   # Turn -> None
        self.handed = []
        self._next_check = 0.0        # when to look for waits out of time
        self._thread = None
        self._running_handed = threading.local()
        self._closing = False
        self._wake_r = self._wake_w = None

    def start(self):
        """The poller's thread, for the listener's life (RuntimeError if the
        system refuses it: at start-up, never on the accept path)."""
        if self.epoll is None or self._thread is not None:
            return
        self._wake_r, self._wake_w = socket.socketpair()
        for end in (self._wake_r, self._wake_w):
            end.setblocking(False)
        self.epoll.register(self._wake_r.fileno(), select.EPOLLIN)
        self._thread = threading.Thread(target=self._run, name="handshake-waits", daemon=True)
        self._thread.start()

    def close(self):
        """Stop the poller's thread."""
        if self._thread is None:
            return
        with self.mutex:
            self._closing = True
        self._wake()
        self._thread.join(5)
        self._thread = None
        for end in (self._wake_r, self._wake_w):
            end.close()

    def _wake(self):
        try:
            self._wake_w.send(b"x")
        except (OSError, AttributeError):
            pass

    def run_handed(self):
        """Run what ``Turn.handed`` queued, outside ``mutex`` (one loop per thread:
        what a run hands on is run by the same loop)."""
        if getattr(self._running_handed, "on", False):
            return
        self._running_handed.on = True
        try:
            while True:
                with self.mutex:
                    if not self.handed:
                        return
                    jobs, self.handed = self.handed, []
                for job in jobs:
                    job()
        finally:
            self._running_handed.on = False

    def park(self, tunnel, until, then, late):
        """Call ``then`` (on the poller's thread) once ``tunnel.conn`` has bytes,
        or ``late`` at ``until``: a connection whose client has not spoken holds
        no thread."""
        fd = tunnel.conn.fileno()
        with self.mutex:
            tunnel.parked = True
            self._parked[fd] = (tunnel, until, then, late)
            self.idle[tunnel.turn] = None
            self.epoll.register(fd, select.EPOLLIN | select.EPOLLONESHOT)

    def _unpark(self, fd):
        """(``mutex`` held) The parked entry of ``fd``, no longer parked."""
        entry = self._parked.pop(fd)
        entry[0].parked = False
        self.idle.pop(entry[0].turn, None)
        return entry

    def take_idle(self):
        """The handshake that has waited longest for its client, taken out of
        every wait: (its tunnel, True) when no thread holds it (it is the
        caller's to end), (its tunnel, False) when its thread sleeps on it (the
        caller shuts its socket, which wakes the thread); or None."""
        with self.mutex:
            if not self.idle:
                return None
            turn, _ = self.idle.popitem(last=False)
            tunnel = turn.tunnel
            fd = tunnel.conn.fileno()
            if tunnel.parked:
                self._unpark(fd)
                self._unregister(fd)
                return tunnel, True
            if turn.resume is None:
                return tunnel, False
            self.forget(turn)
            turn.state, turn.resume = IDLE, None
            return tunnel, True

    def watch(self, turn, sock, write, until=None):
        """Wake ``turn`` once ``sock`` is ready (``mutex`` held); at ``until`` too, if given."""
        fd = sock.fileno()
        mask = (select.EPOLLOUT if write else select.EPOLLIN) | select.EPOLLONESHOT
        try:
            self.epoll.register(fd, mask)
        except FileExistsError:     # registered before, disarmed since it fired
            self.epoll.modify(fd, mask)
        self._by_fd[fd] = turn
        turn.fd = fd
        if fd == turn.client_fd:
            self.idle[turn] = None
        if until is not None:
            self._until[fd] = until

    def forget(self, turn):
        """``turn`` waits no more (``mutex`` held)."""
        self.idle.pop(turn, None)
        if self._by_fd.get(turn.fd) is turn:
            del self._by_fd[turn.fd]
            self._until.pop(turn.fd, None)
            self._unregister(turn.fd)

    def drain(self, sock, until, then):
        """Read and discard what ``sock`` receives until the monotonic time
        ``until`` or its end, then call ``then`` (on the poller's thread): how
        an obfs4 bridge ends a failed handshake, with no thread."""
        fd = sock.fileno()
        with self.mutex:
            self._draining[fd] = (sock, until, then)
            try:
                self.epoll.register(fd, select.EPOLLIN)
            except FileExistsError:     # registered before, disarmed since it fired
                self.epoll.modify(fd, select.EPOLLIN)

    def end_drains(self):
        """End every drain now (the listener stops)."""
        with self.mutex:
            drains, self._draining = self._draining, {}
            for fd in drains:
                self._unregister(fd)
        for _, _, then in drains.values():
            then()

    def _unregister(self, fd):
        try:
            self.epoll.unregister(fd)
        except OSError:
            pass

    @staticmethod
    def _drained(sock):
        """Read what ``sock`` holds; True at its end (or a reset)."""
        try:
            while sock.recv(65536):
                pass
            return True
        except BlockingIOError:
            return False
        except OSError:
            return True

    def _run(self):
        wake = self._wake_r.fileno()
        while True:
            if self._closing:
                return
            # Never without a timeout: waits with an end come and go with every
            # connection, and waking the poller for each (to shorten its sleep)
            # cost every prompt handshake a context switch.
            events = self.epoll.poll(PARK_CHECK)
            due = []
            with self.mutex:
                for fd, _ in events:
                    if fd == wake:
                        try:
                            self._wake_r.recv(4096)
                        except OSError:
                            pass
                        continue
                    turn = self._by_fd.pop(fd, None)
                    if turn is not None:
                        self._until.pop(fd, None)
                        self.idle.pop(turn, None)
                        if turn.state == NET:
                            turn.turns.ready(turn)
                    elif fd in self._parked:
                        due.append(self._unpark(fd)[2])
                    elif fd in self._draining and self._drained(self._draining[fd][0]):
                        self._unregister(fd)
                        due.append(self._draining.pop(fd)[2])
                now = time.monotonic()
                if now >= self._next_check:
                    self._next_check = now + PARK_CHECK
                    due.extend(self._out_of_time(now))
            self.run_handed()
            for then in due:
                then()

    def _out_of_time(self, now):
        """(``mutex`` held) End the waits whose time has come; what to call then."""
        due = []
        for fd in [fd for fd, entry in self._parked.items() if entry[1] <= now]:
            self._unregister(fd)
            due.append(self._unpark(fd)[3])
        for fd in [fd for fd, until in self._until.items() if until <= now]:
            turn = self._by_fd[fd]
            self.forget(turn)
            if turn.state == NET:
                turn.turns.ready(turn)      # its next step finds the deadline passed
        for fd in [fd for fd, entry in self._draining.items() if entry[1] <= now]:
            self._unregister(fd)
            due.append(self._draining.pop(fd)[2])
        return due


PARK_CHECK = 0.5    # seconds between looks for parked connections out of time
