"""listener.py: listening sockets, the handshake threads, and how every tunnel ends.

    accept --> parked (no thread) until the client speaks, when our side has
               nothing to say first (a SOCKS port; an obfs4 or webtunnel bridge)
           --> a handshake thread runs the listener's handler (proxy.py), in
               turns: SOCKS, connect, transport handshake ... -> a Relay
           --> the Pump (relay.py) carries the relay until both directions end
           --> Listener._end: one log line, the sockets closed, the count down

``Listener`` is the only owner of a tunnel's sockets: whatever happens (a
handshake that fails, a relay that ends, a stop), they are closed in
``Listener._end``, after the failure policy has chosen between a FIN and a
reset. A ``Tunnel`` is one accepted connection; its role (a client side that
faces the application, or a bridge's server side) is fixed when it is made.

Why threads for handshakes and one pump for relays: a handshake is a short
script of blocking steps under one deadline (SOCKS, connect, the transport's
messages, key work) and reads best as one; a relay is long-lived and mostly
idle, and thousands of them are best watched by one selector. Starting a
thread costs more CPU than a whole obfs2 handshake (measured about 160 us,
against 50 us for a hand-over to a waiting thread, and connections come in
bursts), so finished handshake threads wait a little for the next
connection (``Listener`` says how).

A bridge many people share must stay open to the client that completes its
handshake promptly, whatever else connects. The rules, and why:

* Pending handshakes are counted apart from tunnels. ``--max-connections``
  caps the tunnels relayed; ``max_pending`` (four times that unless given)
  caps the handshakes under way. A waiting socket costs a descriptor and no
  thread, so the room is cheap, and it keeps an attack's thousands from being
  dropped and reopened over and over (that churn is what costs CPU). When the
  pending set is full, a new connection drops the oldest pending handshake
  that waits for bytes from its client (never one being computed, or
  dialling on), and is refused only when there is none: an attacker's
  sockets only push each other out, and a prompt client's handshake is over
  long before its turn to go.
* A connection whose client has said nothing costs a descriptor, not a
  thread: where our side has nothing to send first (``proxy.first_wait``),
  the listener's one poller (``_Waits``) watches it and starts its thread
  when bytes come (or at its deadline, so that it fails the usual way).
* Handshake threads take turns (``Turns``): per listening socket, at most
  TURNS of them run Python at once; the rest sleep on a lock of their own
  until the poller says their socket is ready and a turn is free. When each
  thread polled its own socket, a thousand clients sending a byte in the
  same instant woke a thousand threads that fought the pump for the GIL
  (1.6 cores spent, live tunnels stalled for seconds), and a storm of 2,000
  handshakes left the pump and the accept loop a fraction of the GIL. Turns
  are per listening socket, like the key-work slot, so that a flood on one
  transport's port cannot queue another's handshakes.
* The accept loop empties the backlog on each wake-up, and the backlog is
  the system's most (``somaxconn``, as Go servers such as obfs4proxy use):
  a storm waits in the kernel's queue instead of overflowing it into SYN
  retransmissions 1, 2 and 4 s later.
"""

import contextlib
import gc
import logging
import queue
import re
import select
import selectors
import socket
import sys
import threading
import time
from collections import deque

import outbound
import relay as relay_
import socks
from proxy import NOTICE, Busy, HopFailed, KeyWork, PeerClosed, Pools, first_wait, log, why

THREAD_STACK = 512 * 1024   # per handshake thread (the default is 8 MiB of address space)


class Tunnel:
    """One accepted connection: what its handler, its relay and its end need.

    ``initiator``: True on a client (it faces an application and opens the
    tunnel), False on a bridge's server; fixed here, whichever thread later
    carries the tunnel. ``owned``: the other sockets closed with it (the
    handler's connection to the server or to --dest). ``peer``: the client's
    address, which a transport may correct (webtunnel: X-Forwarded-For).
    ``key_work`` (its listening socket's), ``pools`` and ``note`` are the
    listener's, for the handler; ``turn`` is its place in its listening socket's
    queue for the CPU (``Turn``), None outside a Listener.
    """

    def __init__(self, number, conn, peer, settings, initiator, listener, key_work=None, turn=None):
        self.number, self.conn, self.peer = number, conn, peer
        self.settings, self.initiator = settings, initiator
        self.accepted_at = time.monotonic()
        self.key_work = key_work or listener.key_work
        self.pools, self.note = listener.pools, listener.note
        self.turn = turn
        self.owned = []
        self.relay = None
        self.dropped = False      # dropped while pending, for a newer connection
        self.relaying = False     # counted in Listener.relayed
        self.parked = False       # watched without a thread until its client speaks (_Waits.park)

    def owns(self, sock):
        self.owned.append(sock)

    def waits_for_client(self):
        """True while parked, or while its handshake waits for bytes from its
        client (not for our CPU, nor for the next hop)."""
        turn = self.turn
        return self.parked or (turn is not None and turn.state == NET and turn.fd == self.conn.fileno())

    def deadline(self, seconds):
        """The handshake's deadline: ``seconds`` after accept, in this tunnel's turn."""
        return outbound.Deadline(seconds - (time.monotonic() - self.accepted_at), self.turn)

    @property
    def name(self):
        return "conn %d (%s)" % (self.number, self.settings.loggable(self.peer))


class Listener:
    """Listening sockets, the accept loop, handshake threads and the pump.

    Methods for the caller: ``listen(address, handler, settings)`` binds and
    returns the bound (host, port); ``serve()`` accepts until ``stop()``;
    ``stop(graceful)`` is safe from any thread or a signal handler. ``tick``,
    if given, is called about once a second from ``serve()``. Counters:
    ``live`` (connections open), ``relayed`` (tunnels in a pump, at most
    ``max_connections``), ``pending`` (handshakes under way, at most
    ``max_pending``), ``accepted``, ``dropped``.

    Handshake threads are reused, and the invariant is: a thread whose
    handshake ended waits up to SPARE_SECONDS for the next one, and at most
    SPARE_THREADS threads wait; ``_waiting`` counts exactly the waiting threads
    not yet given a job, so a job is put on ``_jobs`` only when a thread has
    been counted out for it and no job is ever left in the queue without a
    thread to take it.

    Stopping: graceful (a first SIGINT) stops accepting and waits up to
    GRACE_SECONDS for live tunnels; "now" (SIGTERM, a second SIGINT, or the
    grace running out) resets the tunnels still live, so that no application
    mistakes a cut stream for a complete one.
    """

    SPARE_THREADS = 8
    SPARE_SECONDS = 2.0
    COMPLAINT_INTERVAL = 10.0   # seconds between two log lines of one kind and text
    COMPLAINT_TEXTS = 8         # distinct texts of one kind said in full per interval
    GRACE_SECONDS = 30.0        # a graceful stop waits at most this long for live tunnels

    def __init__(self, max_connections=2048, tick=None, pool_size=None, max_pending=None):
        self.max_connections = max_connections   # tunnels relayed at once
        self.max_pending = 4 * max_connections if max_pending is None else max_pending
        self.tick = tick
        self.listeners = []           # (socket, handler, settings, its KeyWork, its Turns)
        self.live = 0                 # connections open: pending and relayed
        self.relayed = 0              # of those, tunnels handed to a pump
        self.pending = {}             # number -> Tunnel whose handshake runs, oldest first
        self.accepted = 0
        self.dropped = 0              # pending handshakes dropped for newer ones
        self.key_work = KeyWork()     # for the pools; each listening socket has a sibling slot
        self.waits = _Waits()
        self.pools = Pools(self.key_work, pool_size)
        self.pumps = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = None         # None, "graceful" or "now"
        self.ready = threading.Event()
        self._complaints = {}         # (kind, text) -> [when last said, how many not said since]
        # connections for the waiting threads (SimpleQueue is 3.7's; 3.6 takes a Queue)
        self._jobs = getattr(queue, "SimpleQueue", queue.Queue)()
        self._waiting = 0             # threads waiting for a job and not yet given one
        self._inherits_tuning = None  # do accepted sockets get the listener's options? (None: not seen yet)

    def listen(self, address, handler, settings):
        sock = listen(address)
        sock.setblocking(False)
        try:
            outbound.tune(sock)       # for the connections it accepts, where the OS copies options
        except OSError:
            self._inherits_tuning = False
        config = settings.config
        if handler.initiator:
            try:
                config = settings.client_config()
            except ValueError:    # the defaults need the SOCKS arguments (obfs4's cert)
                config = None
        self.pools.prepare(settings.transport_class, handler.initiator, config)
        parks = first_wait(handler, settings) if self.waits.epoll is not None else None
        self.listeners.append((sock, handler, settings, self.key_work.sibling(), Turns(self.waits), parks))
        return sock.getsockname()[:2]

    @property
    def stopping_now(self):
        return self._stopping == "now"

    def stop(self, graceful=False):
        if self._stopping != "now":
            self._stopping = "graceful" if graceful and not self._stopping else "now"
        self._wake()

    def _wake(self):
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def serve(self):
        selector = _Selector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        for entry in self.listeners:
            selector.register(entry[0], selectors.EVENT_READ, entry)
        self.ready.set()
        try:
            while self._stopping is None:
                for key, _ in selector.select(timeout=1.0):
                    if key.data is None:
                        self._drain_wakeups()
                    else:
                        self._accept(*key.data)
                if self.tick:
                    self.tick()
        finally:
            for sock, *_ in self.listeners:
                selector.unregister(sock)
                sock.close()
            self.listeners = []
        if self._stopping == "graceful" and self.live:
            log.log(NOTICE, "stopped accepting; waiting for %d live connection(s), at most %.0f s "
                    "(interrupt again to stop now)", self.live, self.GRACE_SECONDS)
            end = time.monotonic() + self.GRACE_SECONDS
            while self._stopping == "graceful" and self.live and time.monotonic() < end:
                selector.select(timeout=0.5)
                self._drain_wakeups()
                if self.tick:
                    self.tick()
        selector.close()
        self.pools.close()
        # Said, so that the log shows that transfers were cut short (a handshake
        # still in progress ends too, with its own line at info).
        cut = sum(len(pump) for pump in self.pumps)
        if cut:
            log.log(NOTICE, "stopping now: %d live tunnel(s) reset", cut)
        for pump in self.pumps:       # what is still live is cut: reset, never a clean end
            pump.stop(abort=True)
        with self._lock:  # let the waiting threads go
            waiting, self._waiting = self._waiting, 0
        for _ in range(waiting):
            self._jobs.put(None)

    def _drain_wakeups(self):
        try:
            while self._wake_r.recv(64):
                pass
        except OSError:
            pass

    ACCEPT_BATCH = 64     # connections accepted per wake-up of the accept loop, at most

    def _accept(self, listener, handler, settings, key_work, turns, parks):
        """Accept what the backlog holds (up to ACCEPT_BATCH): during a storm one
        wake-up per connection left the backlog to overflow (the kernel then drops
        SYNs, and clients retry after 1, 2, 4 s)."""
        for _ in range(self.ACCEPT_BATCH):
            try:
                conn, peer = listener.accept()
            except BlockingIOError:   # the backlog is empty (or the client gave up)
                return
            except OSError as exc:    # e.g. EMFILE: the process is out of descriptors
                self.complain("accept", "accept failed: %s; slowing down" % why(exc), logging.WARNING,
                              rest=None)
                time.sleep(0.1)
                return
            self._admit(conn, peer, handler, settings, key_work, turns, parks)

    def _admit(self, conn, peer, handler, settings, key_work, turns, parks):
        """Count a new connection in as pending and start its handshake; refuse it
        when --max-connections tunnels are relayed; drop the oldest pending
        handshake when max_pending are pending (the module docstring says why)."""
        victim = None
        with self._lock:
            full = self.relayed >= self.max_connections
            if not full:
                if len(self.pending) >= self.max_pending:
                    victim = next((each for each in self.pending.values() if each.waits_for_client()),
                                  None)
                    full = victim is None   # every one is being served: no room
                if victim is not None:
                    del self.pending[victim.number]
                    victim.dropped = True
                    self.dropped += 1
            if not full:
                self.live += 1
                self.accepted += 1
                tunnel = Tunnel(self.accepted, conn, peer, settings, handler.initiator, self,
                                key_work, Turn(turns, conn.fileno()))
                self.pending[tunnel.number] = tunnel
        if full:
            conn.close()
            if self.relayed >= self.max_connections:
                self.complain("full", "refusing a connection: %d connections already open "
                              "(--max-connections)" % self.max_connections, logging.WARNING, rest=None)
            else:
                self.complain("full", "refusing a connection: %d handshakes under way, none of them "
                              "waiting for its client" % self.max_pending, logging.WARNING, rest=None)
            return
        if victim is not None:
            if self.waits.unpark(victim):
                self._end(victim, PeerClosed("dropped"))
            else:
                try:     # its thread, waiting for the peer, sees the end and ends it (_end)
                    victim.conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if parks is None:
            self._dispatch((handler, tunnel))
        else:       # nothing to do before its client speaks: no thread until then
            self.waits.park(tunnel, tunnel.accepted_at + parks, lambda: self._dispatch((handler, tunnel)))

    def _dispatch(self, job):
        """Give ``job`` to a waiting thread, or start one for it."""
        with self._lock:
            reuse = self._waiting > 0
            if reuse:
                self._waiting -= 1
        if reuse:
            self._jobs.put(job)
            return
        tunnel = job[1]
        try:
            threading.Thread(target=self._worker, args=(job,), name="conn-%d" % tunnel.number,
                             daemon=True).start()
        except RuntimeError as exc:  # cannot start a new thread
            self._end(tunnel, NoThread("cannot start a thread (%s)" % exc))

    def _worker(self, job):
        """Run handshakes one after another until none comes for a while."""
        while job is not None:
            self._run(*job)
            with self._lock:
                if self._stopping or self._waiting >= self.SPARE_THREADS:
                    return
                self._waiting += 1
            try:
                job = self._jobs.get(timeout=self.SPARE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._waiting > 0:  # nobody counted on us: leave
                        self._waiting -= 1
                        return
                job = self._jobs.get()  # a job was handed to us just now: take it

    def _run(self, handler, tunnel):
        """The handshake, on this thread and in its turn; then the relay goes to a pump."""
        log.debug("%s: accepted", tunnel.name)
        try:
            tunnel.turn.take(tunnel.settings.handshake_timeout)
            if self._inherits_tuning is None:
                self._inherits_tuning = outbound.tuned(tunnel.conn)
            if not self._inherits_tuning:
                outbound.tune(tunnel.conn)
            tunnel.conn.setblocking(False)    # from here to close (outbound.send_all says why)
            relay = handler(tunnel.conn, tunnel.settings, tunnel)
        except Exception as exc:
            tunnel.turn.give()
            self._end(tunnel, exc)
            return
        finally:
            tunnel.turn.give()
        tunnel.relay = relay
        with self._lock:
            full = self.relayed >= self.max_connections
            if not full and self.pending.pop(tunnel.number, None) is not None:
                self.relayed += 1
                tunnel.relaying = True
        if full:
            relay.abort()
            self._end(tunnel, HopFailed("full", "refusing a tunnel: %d tunnels already open "
                                        "(--max-connections)" % self.max_connections))
            return
        try:
            self._pump().add(relay, lambda error: self._end(tunnel, error))
        except RuntimeError as exc:    # stopping now, or no thread for a new pump
            relay.abort()
            self._end(tunnel, relay_.Stopped("stopped as its handshake ended") if self._stopping
                      else NoThread("cannot relay (%s)" % exc))

    def _pump(self):
        """A pump with room (one, unless the selector is select() itself)."""
        with self._lock:
            for pump in self.pumps:
                if pump.capacity is None or len(pump) < pump.capacity:
                    return pump
            pump = relay_.Pump("pump-%d" % (len(self.pumps) + 1))
            self.pumps.append(pump)
            return pump

    def complain(self, kind, message, level=NOTICE, rest=logging.INFO, text=None):
        """Log ``message`` at ``level``, at most once per COMPLAINT_INTERVAL for each
        kind and ``text`` (the message without what changes per connection), and the
        rest at ``rest`` (None: not at all): a flood of failing connections must not
        become a flood of log lines at the default level, while a second, different
        mistake is still said at once (up to COMPLAINT_TEXTS texts of a kind per
        interval); at info every connection still gets its line."""
        now = time.monotonic()
        key = (kind, text)
        with self._lock:
            if len(self._complaints) > 1024:     # many texts (addresses shown): forget old ones
                self._complaints = {k: v for k, v in self._complaints.items()
                                    if now - v[0] < self.COMPLAINT_INTERVAL}
            last, quiet = self._complaints.get(key, (None, 0))
            recent = sum(1 for (k, _), (when, _) in self._complaints.items()
                         if k == kind and now - when < self.COMPLAINT_INTERVAL)
            if (last is not None and now - last < self.COMPLAINT_INTERVAL) or \
                    (last is None and recent >= self.COMPLAINT_TEXTS):
                if last is not None:
                    self._complaints[key] = (last, quiet + 1)
                if rest is None:
                    return
                level = rest
            else:
                self._complaints[key] = (now, 0)
                if quiet:
                    message += " (and %d more like this in the last %.0f s)" % (quiet, now - last)
        log.log(level, "%s", message, extra={"failure": True})

    def note(self, text):
        """Say ``text`` at NOTICE once per COMPLAINT_INTERVAL (a transport's notes)."""
        self.complain("note", text, text=text, rest=logging.DEBUG)

    def _end(self, tunnel, exc):
        """Log how the connection ended (``exc``: what ended it, None for a clean
        end), choose FIN or reset, close its sockets, count it out."""
        conn, settings, name = tunnel.conn, tunnel.settings, tunnel.name
        relay = tunnel.relay
        if tunnel.dropped and exc is not None:
            self.complain("pending", "%s: dropped: %d handshakes were pending, the most allowed; "
                          "the oldest goes to make room for a new one" % (name, self.max_pending),
                          text="dropped")
            exc = None if relay is None else exc
        if exc is None:
            if relay is not None:
                outward, inward = relay.up.count, relay.down.count
                if not tunnel.initiator:
                    outward, inward = inward, outward
                log.info("%s: closed after %d bytes client->server, %d bytes server->client "
                         "(application bytes)", name, outward, inward)
        elif isinstance(exc, (HopFailed, socks.SocksError)):
            # A failure the user can act on: at the default level, rate-limited by
            # kind and text (numbers in it, such as a magic value, do not count).
            kind, said = ("socks", "SOCKS: %s" % exc) if isinstance(exc, socks.SocksError) \
                else (exc.kind, str(exc))
            self.complain(kind, "%s: %s" % (name, said), text=re.sub(r"0x[0-9a-f]+|\d+", "N", said))
            if exc.reply:
                try:
                    conn.settimeout(1.0)
                    conn.sendall(exc.reply)
                except OSError:
                    pass
            if getattr(exc, "reset", False):
                relay_.abort(conn)
        elif relay is not None and isinstance(exc, relay.transport.ProtocolError):
            log.info("%s: not %s: %s", name, settings.transport, exc)
            # The application (a client's SOCKS side, a bridge's --dest) learns of
            # the failure by a reset: a cut stream must never look complete. Only
            # the obfuscated peer gets a plain FIN, as obfs4proxy closes it (a reset
            # would tell a prober that flips one bit which implementation runs).
            relay_.abort(relay.upstream)
        elif isinstance(exc, PeerClosed):
            log.info("%s: %s", name, exc)
        elif isinstance(exc, Busy):
            self.complain("busy", "%s: %s" % (name, exc), text="busy")
        elif isinstance(exc, socket.timeout):   # only handshakes block; relays never time out
            log.info("%s: handshake timed out after %.0f s", name, settings.handshake_timeout)
        elif isinstance(exc, relay_.Stopped):
            log.info("%s: reset: %s", name, exc)
        elif isinstance(exc, NoThread):
            log.error("%s: %s; closing it", name, exc)
            relay_.abort(conn)
        elif tunnel.initiator and relay is not None and _reset_by(relay.downstream, exc):
            self.complain("reset", "%s: the bridge reset the tunnel (the application gets a reset)" % name,
                          text="bridge reset")   # a cut stream: the operator must hear of it
        elif isinstance(exc, OSError):
            log.info("%s: %s", name, exc.strerror or exc)
        else:  # a bug: keep serving everyone else
            log.error("%s: internal error; connection closed", name,
                      exc_info=(type(exc), exc, exc.__traceback__))
            relay_.abort(conn)
        for sock in tunnel.owned:
            sock.close()
        conn.close()
        with self._lock:
            self.live -= 1
            if self.pending.pop(tunnel.number, None) is None and tunnel.relaying:
                self.relayed -= 1
        if self._stopping:
            self._wake()    # serve() recounts (stop() again would end a graceful stop)


class NoThread(Exception):
    """No thread could be had for a tunnel (the process is at its limit, or stopping)."""


_Selector = getattr(selectors, "PollSelector", selectors.DefaultSelector)


# --- Turns: one handshake thread computes at a time per listening socket -------------

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
    """One handshake's place in its listening socket's ``Turns``; used by its own
    thread only. The thread sleeps on a lock of its own while it waits, for the
    CPU or for the network, and is woken only when it may run: so a thousand
    handshakes waiting cost no CPU, and never wake all at once to fight over
    the GIL (the cost measured when each polled its own socket)."""

    def __init__(self, turns, client_fd=None):
        self.turns, self.waits = turns, turns.waits
        self.state = IDLE
        self.fd = None
        self.client_fd = client_fd    # the accepted socket's descriptor
        self.further = False      # past its client's part: back from the next hop, or a connect
        self._wake = threading.Lock()
        self._wake.acquire()

    def handed(self):
        self.state = HELD
        self._wake.release()

    def take(self, seconds):
        """Wait for the turn; proxy.Busy when ``seconds`` pass first."""
        with self.waits.mutex:
            if self.state == HELD:
                return
            self.turns.ready(self)
        self._sleep(seconds)

    def give(self):
        """Give the turn up, if held."""
        with self.waits.mutex:
            if self.state == HELD:
                self.state = IDLE
                self.turns.pass_on()

    def wait(self, sock, write, seconds):
        """Give the turn up until ``sock`` is ready to read (or write), then come
        back with it: True; or socket.timeout when ``seconds`` pass first."""
        if self.waits.epoll is None:       # no epoll here: the thread polls its own socket
            end = time.monotonic() + seconds
            self.give()
            if not outbound._ready(sock, write, seconds):
                raise socket.timeout("timed out")
            self.take(max(end - time.monotonic(), 0.0))
            return True
        self.further = sock.fileno() != self.client_fd
        with self.waits.mutex:
            self.waits.watch(self, sock, write)
            if self.state == HELD:
                self.turns.pass_on()
            self.state = NET
        self._sleep(seconds)
        return True

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


class _Waits:
    """A Listener's one poller for every handshake waiting for the network
    (epoll, one-shot): a socket that becomes ready puts its Turn in the queue
    of its listening socket. Where there is no epoll, each thread polls its
    own socket (``Turn.wait``)."""

    def __init__(self):
        self.mutex = threading.Lock()
        self.epoll = select.epoll() if hasattr(select, "epoll") else None
        self._by_fd = {}
        self._parked = {}             # fd -> (tunnel, when its wait ends, what to do then)
        self._next_check = 0.0        # when to look for parked connections out of time
        self._thread = None

    def park(self, tunnel, until, then):
        """Call ``then`` (on the poller's thread) once ``tunnel.conn`` has bytes,
        or at ``until``: a connection whose client has not spoken holds no thread."""
        fd = tunnel.conn.fileno()
        with self.mutex:
            tunnel.parked = True
            self._parked[fd] = (tunnel, until, then)
            self.epoll.register(fd, select.EPOLLIN | select.EPOLLONESHOT)
            self._start()

    def unpark(self, tunnel):
        """True if ``tunnel`` was still parked (it is not any more), False if it
        was handed on already, or never parked."""
        with self.mutex:
            fd = tunnel.conn.fileno()
            entry = self._parked.get(fd)
            if entry is None or entry[0] is not tunnel:
                return False
            del self._parked[fd]
            tunnel.parked = False
            try:
                self.epoll.unregister(fd)
            except OSError:
                pass
            return True

    def _unparked(self, fd):
        tunnel, _, then = self._parked.pop(fd)
        tunnel.parked = False
        return then

    def _start(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="handshake-waits", daemon=True)
            self._thread.start()

    def watch(self, turn, sock, write):
        """Wake ``turn`` once ``sock`` is ready (``mutex`` held)."""
        fd = sock.fileno()
        mask = (select.EPOLLOUT if write else select.EPOLLIN) | select.EPOLLONESHOT
        try:
            self.epoll.register(fd, mask)
        except FileExistsError:     # registered before, disarmed since it fired
            self.epoll.modify(fd, mask)
        self._by_fd[fd] = turn
        turn.fd = fd
        self._start()

    def forget(self, turn):
        """``turn`` waits no more (its time ran out; ``mutex`` held)."""
        if self._by_fd.get(turn.fd) is turn:
            del self._by_fd[turn.fd]
            try:
                self.epoll.unregister(turn.fd)
            except OSError:
                pass

    def _run(self):
        """Until nobody has waited for half a second: a listener at rest keeps no
        thread for this (``watch`` starts one again)."""
        while True:
            events = self.epoll.poll(0.5 if not self._parked else PARK_CHECK)
            due = []
            with self.mutex:
                for fd, _ in events:
                    turn = self._by_fd.pop(fd, None)
                    if turn is not None and turn.state == NET:
                        turn.turns.ready(turn)
                    elif fd in self._parked:
                        due.append(self._unparked(fd))
                if self._parked:
                    now = time.monotonic()
                    if now >= self._next_check:
                        self._next_check = now + PARK_CHECK
                        for fd in [fd for fd, (_, until, _) in self._parked.items() if until <= now]:
                            due.append(self._unparked(fd))
                idle = not events and not due and not self._by_fd and not self._parked
                if idle:
                    self._thread = None
                    return
            for then in due:        # its handshake thread starts (its deadline may have passed)
                then()


PARK_CHECK = 0.5    # seconds between looks for parked connections out of time


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


# --- Process setup -----------------------------------------------------------------

def install_signal_handlers(listener):
    """SIGTERM: stop now. First SIGINT: stop accepting, let tunnels finish
    (up to Listener.GRACE_SECONDS); a second SIGINT: stop now.

    Stopping now resets the tunnels still live, then the process ends: the
    garbage collector's last pass over every tunnel's objects at interpreter
    exit is skipped (``gc.freeze``), since the OS frees the memory anyway.
    With 9,900 open tunnels that pass alone held the exit for 2-3 s."""
    import signal

    def exit_soon():
        gc.disable()
        getattr(gc, "freeze", lambda: None)()   # 3.6 has no freeze

    def on_int(signum, frame):
        listener.stop(graceful=True)
        if listener.stopping_now:
            exit_soon()

    def on_term(signum, frame):
        listener.stop(graceful=False)
        exit_soon()

    signal.signal(signal.SIGINT, on_int)
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, on_term)


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


def _reset_by(sock, exc):
    """True if ``exc`` is a reset and it was ``sock``'s peer that reset: the
    system no longer counts ``sock`` connected."""
    if not isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return False
    try:
        sock.getpeername()
        return False
    except OSError:
        return True
