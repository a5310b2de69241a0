"""pool.py: handshake material made before a connection needs it.

Most of a handshake's key work does not depend on the peer: an obfs3 side starts
with a UniformDH keypair (one 1536-bit modexp, ~1 ms), an obfs4 side with an
X25519 keypair that has an Elligator2 representative (~2 draws, ~0.3 ms), an
obfs2 side with a random seed and the padding its first message carries,
encrypted under a key hashed from that seed (~20 µs; with a shared secret,
100,000 SHA-256). Made while the proxy has nothing else to do, it leaves a
connection's critical path: the peer gets our first bytes sooner.

What a ``Pool`` promises::

    bounded     at most ``size`` items wait; memory is tiny (a keypair each)
    single use  ``take()`` hands each item out exactly once, then forgets it;
                items are never logged, written or copied anywhere
    never late  an empty pool gives None: the connection then does its own key
                work, inside the proxy's key-work slot, as if there were no pool
                (made here, on the connection's thread, it would run outside
                that slot: a connect flood would run every keygen at once)
    idle only   one daemon thread refills it, one item at a time, and starts
                an item only when ``idle()`` says the proxy has been quiet (no
                handshake for a few ms); while it is busy the thread looks again
                after 5 ms, 10, 20 ... at most IDLE_POLL_MAX, so a busy proxy
                pays for a couple of wake-ups a second, not one per connection;
                once full and untouched for LINGER seconds the thread ends, and
                the next ``take()`` starts another: a proxy at rest runs no thread

    take() --item--> connection          refiller: wait until below size
      |                                             and idle() -> make() -> stock
      +-- stock empty: None (the transport makes its own, in the key-work slot)

The listener (proxy.Pools, listener.py) owns the pools and tells them when it is
idle; each transport says what an item is (its ``prepare`` classmethod) and
takes one as ``prepared=`` (transports.py).
``OBFSPROXY_POOL_SIZE`` (default ``DEFAULT_SIZE``, at most ``MAX_SIZE``) sets the
size; 0 turns the pools off, which is how the benchmark measures what they buy.
"""

import os
import re
import threading
from collections import deque

DEFAULT_SIZE = 16
MAX_SIZE = 4096        # items per pool: ~4 s of obfs3 key work to fill, a few MB at most
IDLE_POLL_MIN = 0.005  # seconds before the refiller looks again at a busy owner, doubling ...
IDLE_POLL_MAX = 0.5    # ... up to this
LINGER = 2.0           # seconds a full pool's refill thread waits for a take() before ending


def configured_size(environ=os.environ):
    """Pool size from OBFSPROXY_POOL_SIZE: ASCII digits, 0..MAX_SIZE; unset or empty:
    DEFAULT_SIZE. Anything else is a ValueError naming the variable, raised at start-up,
    rather than a silent DEFAULT_SIZE: someone set it on purpose (the benchmark sets 0),
    and a value we cannot honour ("l6", "²", "-1") should be seen, as a bad command-line
    option is. (str.isdigit() took "²", which int() then refused naming nothing.)"""
    text = environ.get("OBFSPROXY_POOL_SIZE", "")
    if not text:
        return DEFAULT_SIZE
    if not (re.fullmatch(r"[0-9]{1,9}", text) and int(text) <= MAX_SIZE):
        raise ValueError("OBFSPROXY_POOL_SIZE must be a whole number in 0..%d, not %r"
                         % (MAX_SIZE, text if len(text) <= 20 else text[:20] + "..."))
    return int(text)


class Pool:
    """A bounded stock of single-use items from ``make()``, refilled by one daemon
    thread while ``idle()`` returns True. ``hits`` and ``misses`` count takes served
    from the stock and takes that found it empty (None)."""

    def __init__(self, make, size=DEFAULT_SIZE, idle=lambda: True, name="pool"):
        self._make, self.size, self._idle, self.name = make, size, idle, name
        self._stock = deque()
        self._changed = threading.Condition()
        self._closed = self._refilling = False
        self.hits = self.misses = 0
        with self._changed:
            self._start_refill()

    def __len__(self):
        return len(self._stock)

    def take(self):
        """One item, never handed out before, from the stock; None when it is empty."""
        with self._changed:
            was_full = len(self._stock) >= self.size
            item = self._stock.popleft() if self._stock else None
            if item is None:
                self.misses += 1
            else:
                self.hits += 1
            self._start_refill()
            if was_full:                    # the refiller waits for room: there is some now
                self._changed.notify()      # (otherwise it is busy or backing off: let it be)
        return item

    def close(self):
        """Stop refilling and drop the stock (the items are never used)."""
        with self._changed:
            self._closed = True
            self._stock.clear()
            self._changed.notify()

    def _start_refill(self):
        """Start the refill thread unless it runs (call with the lock held)."""
        if self._refilling or self._closed or self.size <= 0:
            return
        self._refilling = True
        try:
            threading.Thread(target=self._refill, name="%s-refill" % self.name, daemon=True).start()
        except RuntimeError:     # no thread to be had: take() gives None, connections do their own
            self._refilling = False

    def _refill(self):
        delay = IDLE_POLL_MIN
        while True:
            with self._changed:
                while not self._closed and len(self._stock) >= self.size:
                    if not self._changed.wait(LINGER) and len(self._stock) >= self.size:
                        self._refilling = False          # full and untouched: rest
                        return
                if self._closed:
                    self._refilling = False
                    return
                if not self._idle():                     # busy: look again later
                    self._changed.wait(delay)
                    delay = min(2 * delay, IDLE_POLL_MAX)
                    continue
            delay = IDLE_POLL_MIN
            item = self._make()
            with self._changed:
                if self._closed:
                    self._refilling = False
                    return
                self._stock.append(item)
