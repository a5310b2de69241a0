"""listener.py: the listening sockets' connections, from accept to the end of their tunnels.

    accept --> parked (no thread) until the client speaks, when our side has
               nothing to say first (a SOCKS port; an obfs4 or webtunnel bridge)
           --> a handshake thread runs the listener's handler (proxy.py), in
               turns: SOCKS, connect, transport handshake ... -> a Relay; a
               bridge's handler waits for its client between steps, with no
               thread (handshake_scheduler.py says when each part runs)
           --> the Pump (relay.py) carries the relay until both directions end
           --> Listener._end: one log line, the sockets closed, the count down

``Listener`` is the only owner of a tunnel's sockets: whatever happens (a
handshake that fails, a relay that ends, a stop), they are closed in
``Listener._end``, with a FIN or a reset on each side as the failure policy
(``ENDINGS``, one row per way a tunnel ends) says. Every socket of a tunnel
resets on close from the moment the tunnel has it until it ends cleanly
(``reset_on_close``), so that a process that dies in any way (SIGKILL, the
OOM killer, a crash) resets its tunnels instead of ending them with a FIN
that an application would take for a complete stream. A ``Tunnel`` is one
accepted connection; its role (a client side that faces the application, or
a bridge's server side) is fixed when it is made.

Why threads for handshakes and one pump for relays: a handshake is a short
script of steps under one deadline (SOCKS, connect, the transport's
messages, key work) and reads best as one (a bridge's, as a generator whose
waits for its client hold no thread); a relay is long-lived and mostly idle,
and thousands of them are best watched by one selector. Starting a thread
costs more CPU than a whole obfs2 handshake (measured about 160 us, against
50 us for a hand-over to a waiting thread, and connections come in bursts),
so finished handshake threads wait a little for the next one (``Listener``
says how).

A bridge many people share must stay open to the client that completes its
handshake promptly, whatever else connects. The rules, and why:

* Pending handshakes are counted apart from tunnels. ``--max-connections``
  caps the tunnels relayed; ``max_pending`` (four times that unless given)
  caps the handshakes under way, and so do the descriptors the process may
  open (``process_setup.descriptor_ceiling``: RLIMIT_NOFILE less a reserve
  for the connections to --dest). A waiting socket costs a descriptor and no
  thread, so the room is cheap, and it keeps an attack's thousands from being
  dropped and reopened over and over (that churn is what costs CPU). When
  either limit is reached, a new connection drops the pending handshake that
  has waited longest for bytes from its client (never one being computed, or
  dialling on; found at once, ``Waits.idle``), and is refused only when there
  is none: an attacker's sockets only push each other out, and a prompt
  client's handshake is over long before its turn to go.
* A connection waiting for its client costs a descriptor, not a thread, for
  its whole life: one that has said nothing (where our side has nothing to
  send first, ``proxy.first_wait``), one between two of its client's bytes
  (a bridge's handshake is a series of steps, ``proxy.exchange``, resumed by
  the poller), and one whose handshake failed and lingers before its FIN
  (``proxy.ClientFailed``: the poller reads and discards). A silent one that
  reaches its deadline is ended by the poller itself. So an attack of silent
  or slow sockets costs no thread per socket, and a task limit (a
  container's pids limit, systemd's TasksMax) is never reached by one.
* A thread the system refuses ends that one connection (a reset, counted in
  ``threads_refused``, said once per interval); the poller's own thread
  starts with the listener, so the accept path never needs one.
* The accept loop empties the backlog on each wake-up, and the backlog is
  the system's most (``process_setup.somaxconn``, as Go servers such as
  obfs4proxy use): a storm waits in the kernel's queue instead of
  overflowing it into SYN retransmissions 1, 2 and 4 s later.
"""

import errno
import inspect
import logging
import queue
import re
import selectors
import socket
import struct
import sys
import threading
import time

import outbound
import relay as relay_
import socks
from handshake_scheduler import Busy, KeyWork, Turn, Turns, Waits
from process_setup import descriptor_ceiling, listen
from proxy import NOTICE, ClientFailed, HopFailed, PeerClosed, Pools, first_wait, log, why


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
        self.steps = None         # a handler's steps under way (a generator: proxy.exchange)
        self.dropped = None       # why it was dropped while pending, for a newer connection
        self.relaying = False     # counted in Listener.relayed
        self.parked = False       # watched without a thread until its client speaks (Waits.park)
        self.drained = False      # its failure's linger is over (or under way)

    def owns(self, sock):
        """``sock`` is closed with the tunnel; from now on it resets if the
        process dies (``reset_on_close``), until the tunnel ends cleanly."""
        reset_on_close(sock)
        self.owned.append(sock)

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
        self.threads_refused = 0      # thread starts the system refused (each closed one connection)
        self.fd_ceiling = descriptor_ceiling()   # descriptors in use this high: make room first
        self._base_fds = 0            # descriptors the process held before it served
        self.key_work = KeyWork()     # for the pools; each listening socket has a sibling slot
        self.waits = Waits()
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
        self.waits.start()
        with socket.socket() as probe:    # the lowest free descriptor: about how many are in use
            self._base_fds = probe.fileno()
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
        self.waits.end_drains()      # failed handshakes lingering: their FIN now
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
        self.waits.close()
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
        SYNs, and clients retry after 1, 2, 4 s). Out of descriptors, the oldest
        handshake that waits for its client makes room (``_make_room``) before
        the accept loop slows down."""
        for _ in range(self.ACCEPT_BATCH):
            try:
                conn, peer = listener.accept()
            except BlockingIOError:   # the backlog is empty (or the client gave up)
                return
            except OSError as exc:    # e.g. EMFILE: the process is out of descriptors
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._make_room():
                    continue
                self.complain("accept", "accept failed: %s; slowing down" % why(exc), logging.WARNING,
                              rest=None)
                time.sleep(0.1)
                return
            self._admit(conn, peer, handler, settings, key_work, turns, parks)

    def _admit(self, conn, peer, handler, settings, key_work, turns, parks):
        """Count a new connection in as pending and start its handshake; refuse it
        when --max-connections tunnels are relayed; drop the oldest pending
        handshake that waits for its client when max_pending are pending, or
        when descriptors run short (the module docstring says why)."""
        victim = None
        with self._lock:
            full = self.relayed >= self.max_connections
            if not full and len(self.pending) >= self.max_pending:
                why_dropped = "%d handshakes were pending, the most allowed" % self.max_pending
            elif not full and self._short_of_descriptors(conn):
                why_dropped = "descriptors run short (ulimit -n)"
            else:
                why_dropped = None
            if why_dropped:
                victim = self._drop_oldest(why_dropped)
                full = victim is None   # every one is being served: no room
            if not full:
                self.live += 1
                self.accepted += 1
                tunnel = Tunnel(self.accepted, conn, peer, settings, handler.initiator, self, key_work)
                tunnel.turn = Turn(turns, conn.fileno(), tunnel)
                self.pending[tunnel.number] = tunnel
        if not full:
            reset_on_close(conn)      # any death from here on resets it, until a clean end
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
            self._end_dropped(*victim)
        job = (handler, tunnel)
        if parks is None:
            tunnel.turn.queue(lambda: self._dispatch(job))
        else:       # nothing to do before its client speaks: no thread until then
            self.waits.park(tunnel, tunnel.accepted_at + parks.seconds,
                            lambda: tunnel.turn.queue(lambda: self._dispatch(job)),
                            lambda: self._end(tunnel, parks.silence(tunnel)))

    def _short_of_descriptors(self, conn):
        """True when the process's descriptors are near its limit: one per
        connection, a second per relayed tunnel, plus what the process held
        before it served; or ``conn``'s own number (POSIX hands out the lowest
        free one) says so."""
        ceiling = self.fd_ceiling
        return ceiling is not None and (self.live + self.relayed + self._base_fds >= ceiling or
                                        conn.fileno() >= ceiling)

    def _drop_oldest(self, reason):
        """Take the handshake that has waited longest for its client out of the
        pending set (``_lock`` held), saying ``reason`` at its end: (tunnel,
        whether it held no thread), or None."""
        found = self.waits.take_idle()
        if found is not None:
            victim = found[0]
            self.pending.pop(victim.number, None)
            victim.dropped = reason
            self.dropped += 1
        return found

    def _make_room(self):
        """Out of descriptors: end the oldest handshake waiting for its client; True if one was."""
        with self._lock:
            victim = self._drop_oldest("out of descriptors (ulimit -n)")
        if victim is None:
            return False
        self._end_dropped(*victim)
        return True

    def _end_dropped(self, tunnel, threadless):
        if threadless:     # nobody else holds it: it ends here
            self._end(tunnel, PeerClosed("dropped"))
        else:
            try:     # its thread, waiting for the peer, sees the end and ends it (_end)
                tunnel.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _dispatch(self, job):
        """Give ``job`` to a waiting thread, or start one for it. The tunnel holds
        its turn (``Turn.queue``): so no more threads run handshakes than turns."""
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
            with self._lock:
                self.threads_refused += 1
            tunnel.turn.give()
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
        """The handshake's next part, on this thread and in its turn: up to the
        next wait for its client (then no thread holds it: ``_step``), or to the
        end, when the relay goes to a pump."""
        turn = tunnel.turn
        try:
            turn.take(tunnel.settings.handshake_timeout)     # at once when queued for it
            if tunnel.steps is None:
                log.debug("%s: accepted", tunnel.name)
                if self._inherits_tuning is None:
                    self._inherits_tuning = outbound.tuned(tunnel.conn)
                if not self._inherits_tuning:
                    outbound.tune(tunnel.conn)
                tunnel.conn.setblocking(False)    # from here to close (outbound.send_all says why)
                relay = handler(tunnel.conn, tunnel.settings, tunnel)
                if inspect.isgenerator(relay):
                    tunnel.steps, relay = relay, None
            if tunnel.steps is not None:
                relay = self._step(handler, tunnel)
                if relay is None:
                    return      # it waits for the network, holding neither this thread nor a turn
        except Exception as exc:
            turn.give()
            self._end(tunnel, exc)
            return
        turn.give()
        self._relay(tunnel, relay)

    def _step(self, handler, tunnel):
        """Run the handler's steps to its Relay (returned), or to a wait for the
        network, which the poller then keeps without a thread (None: from there
        the tunnel is the poller's, and then another thread's)."""
        steps = tunnel.steps
        while True:
            try:
                sock, write, deadline = steps.send(None)
            except StopIteration as done:
                tunnel.steps = None
                return done.value
            if self.waits.epoll is None or self._stopping:   # no poller to wait in: wait here
                try:
                    outbound.wait_until_ready(sock, deadline, write)
                except socket.timeout:
                    pass        # the next step finds its deadline passed
                continue
            tunnel.turn.suspend(sock, write, deadline.end, lambda: self._dispatch((handler, tunnel)))
            return None

    def _relay(self, tunnel, relay):
        """Hand a finished handshake's relay to a pump, if the tunnel is still
        pending (not dropped meanwhile for a newer connection) and there is room."""
        with self._lock:
            dropped = tunnel.number not in self.pending
            full = not dropped and self.relayed >= self.max_connections
            if not dropped and not full:
                del self.pending[tunnel.number]
                self.relayed += 1
                tunnel.relaying = True
        if dropped:       # dropped as its handshake ended: never relayed uncounted
            relay.close()
            self._end(tunnel, PeerClosed("dropped"))
            return
        tunnel.relay = relay
        if full:
            self._end(tunnel, HopFailed("full", "refusing a tunnel: %d tunnels already open "
                                        "(--max-connections)" % self.max_connections))
            return
        try:
            self._pump().add(relay, lambda error: self._end(tunnel, error))
        except RuntimeError as exc:    # stopping now, or no thread for a new pump
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
        end), close its sockets with a FIN or a reset as ENDINGS says, count it out.

        Every socket of a tunnel resets on close from the moment the tunnel has
        it (so that a process killed in any way cuts no stream silently); only
        the sides ENDINGS ends with a FIN are set back to a plain close. A
        failed handshake that must linger first (``ClientFailed``) is drained in
        the poller, and ends here again when that is over."""
        if isinstance(exc, ClientFailed) and exc.linger_until is not None and not tunnel.drained \
                and not self._stopping and self.waits.epoll is not None:
            tunnel.drained = True
            fin_on_close(tunnel.conn)
            self.waits.drain(tunnel.conn, exc.linger_until, lambda: self._end(tunnel, exc))
            return
        if tunnel.dropped and exc is not None:
            self.complain("pending", "%s: dropped: %s; the oldest waiting for its client goes to "
                          "make room for a new one" % (tunnel.name, tunnel.dropped), text=tunnel.dropped)
            exc = None if tunnel.relay is None else exc
        say, accepted, opened = ending(tunnel, exc)
        getattr(self, say)(tunnel, exc)
        relay = tunnel.relay
        sides = {}
        for sock in tunnel.owned:
            sides[sock] = _resets(opened, sock, relay, exc)
        sides[tunnel.conn] = _resets(accepted, tunnel.conn, relay, exc)
        self._close(tunnel, sides)

    # How each row of ENDINGS is said.

    def _say_closed(self, tunnel, exc):
        relay = tunnel.relay
        if relay is not None:
            outward, inward = relay.up.count, relay.down.count
            if not tunnel.initiator:
                outward, inward = inward, outward
            log.info("%s: closed after %d bytes client->server, %d bytes server->client "
                     "(application bytes)", tunnel.name, outward, inward)

    def _say_failure(self, tunnel, exc):
        """A failure the user can act on: at the default level, rate-limited by
        kind and text (numbers in it, such as a magic value, do not count); then
        its reply (a SOCKS failure, a transport's answer) is sent."""
        kind, said = ("socks", "SOCKS: %s" % exc) if isinstance(exc, socks.SocksError) \
            else (exc.kind, str(exc))
        self.complain(kind, "%s: %s" % (tunnel.name, said), text=re.sub(r"0x[0-9a-f]+|\d+", "N", said))
        if exc.reply:
            try:
                tunnel.conn.settimeout(1.0)
                tunnel.conn.sendall(exc.reply)
            except OSError:
                pass

    def _say_not_transport(self, tunnel, exc):
        log.info("%s: not %s: %s", tunnel.name, tunnel.settings.transport, exc)

    def _say_info(self, tunnel, exc):
        log.info("%s: %s", tunnel.name, exc)

    def _say_busy(self, tunnel, exc):
        self.complain("busy", "%s: %s" % (tunnel.name, exc), text="busy")

    def _say_timed_out(self, tunnel, exc):
        log.info("%s: handshake timed out after %.0f s", tunnel.name, tunnel.settings.handshake_timeout)

    def _say_reset(self, tunnel, exc):
        log.info("%s: reset: %s", tunnel.name, exc)

    def _say_no_thread(self, tunnel, exc):
        self.complain("thread", "%s: %s; closing it" % (tunnel.name, exc), logging.ERROR, text="no thread")

    def _say_bridge_reset(self, tunnel, exc):
        self.complain("reset", "%s: the bridge reset the tunnel (the application gets a reset)"
                      % tunnel.name, text="bridge reset")

    def _say_os_error(self, tunnel, exc):
        log.info("%s: %s", tunnel.name, exc.strerror or exc)

    def _say_bug(self, tunnel, exc):
        log.error("%s: internal error; connection closed", tunnel.name,
                  exc_info=(type(exc), exc, exc.__traceback__))

    def _close(self, tunnel, sides):
        """Close the tunnel's sockets, each with a reset or a FIN as ``sides``
        ({socket: reset?}) says, and count the tunnel out."""
        if tunnel.steps is not None:      # a handshake cut between two steps
            tunnel.steps.close()
            tunnel.steps = None
        # No reference cycle may outlive the tunnel: one kept its transport, ciphers and
        # sockets for the garbage collector's next full pass, which then took longer.
        tunnel.turn.tunnel = None
        for sock, reset in sides.items():
            if not reset:
                fin_on_close(sock)
        for sock in tunnel.owned:
            sock.close()
        tunnel.conn.close()
        with self._lock:
            self.live -= 1
            if self.pending.pop(tunnel.number, None) is None and tunnel.relaying:
                self.relayed -= 1
        if self._stopping:
            self._wake()    # serve() recounts (stop() again would end a graceful stop)


class NoThread(Exception):
    """No thread could be had for a tunnel (the process is at its limit, or stopping)."""


# How a tunnel's sockets close. FIN and RST as said; ASKED: what the error
# asks (``HopFailed.reset``); CLEARTEXT: a reset on the socket that carries
# cleartext (the application, --dest), a FIN to the obfuscated peer, as
# obfs4proxy closes it (a reset would tell a prober that flips one bit which
# implementation runs the bridge).
FIN, RST, ASKED, CLEARTEXT = "FIN", "RST", "as asked", "RST to cleartext"


def _clean(tunnel, exc):
    return exc is None


def _broke_the_protocol(tunnel, exc):
    return tunnel.relay is not None and isinstance(exc, tunnel.relay.transport.ProtocolError)


def _bridge_reset(tunnel, exc):
    """A client's bridge reset a live tunnel: a cut stream the operator must hear of."""
    return tunnel.initiator and tunnel.relay is not None and _reset_by(tunnel.relay.downstream, exc)


def _relay_failed(tunnel, exc):
    return tunnel.relay is not None and isinstance(exc, OSError)


def _anything(tunnel, exc):
    return True


# The failure policy: what ended a tunnel -> how it is said, and how the
# connection we accepted (a client's application, a bridge's client) and the
# sockets we opened for it (the bridge, --dest) close. The first row that
# matches (an exception class, or a test of the tunnel and the exception) wins.
# "complaint": at the default level, at most once per COMPLAINT_INTERVAL for
# its kind and text (Listener.complain); "info": one line at info.
ENDINGS = (
    # what ended it                  how it is said         accepted   opened      said as
    (_clean,                         "_say_closed",         FIN,       FIN),       # info, bytes each way
    ((HopFailed, socks.SocksError),  "_say_failure",        ASKED,     RST),       # complaint, its reply
    (_broke_the_protocol,            "_say_not_transport",  CLEARTEXT, CLEARTEXT), # info: "not obfs4"
    (PeerClosed,                     "_say_info",           FIN,       RST),       # info
    (Busy,                           "_say_busy",           FIN,       RST),       # complaint
    (socket.timeout,                 "_say_timed_out",      FIN,       RST),       # info
    (relay_.Stopped,                 "_say_reset",          RST,       RST),       # info
    (NoThread,                       "_say_no_thread",      RST,       RST),       # complaint, ERROR
    (_bridge_reset,                  "_say_bridge_reset",   RST,       RST),       # complaint
    (_relay_failed,                  "_say_os_error",       RST,       RST),       # info
    (OSError,                        "_say_os_error",       FIN,       RST),       # info
    (_anything,                      "_say_bug",            RST,       RST),       # ERROR, traceback
)


def ending(tunnel, exc):
    """The row of ENDINGS for ``tunnel`` ended by ``exc``: (how it is said,
    accepted, opened)."""
    for matches, say, accepted, opened in ENDINGS:
        if isinstance(matches, (type, tuple)):
            if isinstance(exc, matches):
                return say, accepted, opened
        elif matches(tunnel, exc):
            return say, accepted, opened
    raise AssertionError("ENDINGS ends with a row for anything")


def _resets(rule, sock, relay, exc):
    """True if ``sock`` closes with a reset under ``rule`` (an ENDINGS cell)."""
    if rule == ASKED:
        return getattr(exc, "reset", False)
    if rule == CLEARTEXT:
        return sock is relay.upstream
    return rule == RST


# SO_LINGER on with 0 seconds: close() sends RST, and so does the kernel when it
# closes the socket of a process that died (SIGKILL, the OOM killer, a crash).
_RESET = struct.pack("HH" if sys.platform == "win32" else "ii", 1, 0)
_FIN = struct.pack("HH" if sys.platform == "win32" else "ii", 0, 0)


def reset_on_close(sock):
    """From now on, closing ``sock`` (by us, or by the kernel for a dead process)
    sends RST: what a tunnel's sockets carry until it ends cleanly."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
    except OSError:
        pass


def fin_on_close(sock):
    """Closing ``sock`` sends a plain FIN again (the system's default)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _FIN)
    except OSError:
        pass


_Selector = getattr(selectors, "PollSelector", selectors.DefaultSelector)


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
