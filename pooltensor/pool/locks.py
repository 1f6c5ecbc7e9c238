"""Pool locks: ``with pool.lock("name", timeout=10): ...`` across every process of a pool.

Why: read-modify-write of shared slabs by several processes (SPMD ranks, Dask workers) needs
mutual exclusion that a dead process cannot keep forever.

Each lock is a ticket lock in four int64 words of member 0's lock window (a page of
``SLOTS`` slots; a name maps to a slot by crc32, so two names may share one lock, which is
correct, only coarser):

    next     tickets handed out: a taker's fetch_add(next, 1) is its ticket (fair: FIFO)
    serving  the ticket that holds the lock; release is compare_swap(serving, t, t + 1)
    beat     the holder's heartbeat: bumped when it takes the lock and every lease / 4
    holder   rank + 1 of the holder (0: none), for stats and messages

Leases without shared clocks: a waiter that sees (serving, beat) unchanged for ``lease``
seconds of its own clock takes the holder for dead (SIGKILLed, or a waiter that gave up its
ticket) and moves ``serving`` on with compare_swap, so exactly one waiter does it. A holder
alive but too slow to beat finds on release that ``serving`` moved: LeaseExpired, so it
knows its critical section was not exclusive. Every wait has a timeout (Timeout); member 0
gone is PeerLost from the window. A pool of one process (a client of memory servers) keeps
the same words in its own memory, served under a thread lock.
"""
import threading
import time
import zlib

import numpy as np

from collectives.errors import PooltensorError, Timeout

SLOTS = 64
SLOT = 64                         # bytes per lock: four words, on their own cache line
BYTES = SLOTS * SLOT
NEXT, SERVING, BEAT, HOLDER = 0, 8, 16, 24
DEFAULT_LEASE = 10.0


class LeaseExpired(PooltensorError, RuntimeError):
    """A lock's holder lost it: its lease ran out (no heartbeat for `lease` seconds) and the
    next waiter took the lock."""


class LocalWords:
    """The lock words of a pool of one process: atomics under a thread lock."""

    def __init__(self):
        self.buf = np.zeros(BYTES // 8, np.int64)
        self._mu = threading.Lock()

    def fetch_add(self, rank, offset, value):
        with self._mu:
            old = int(self.buf[offset // 8])
            self.buf[offset // 8] = old + value
            return old

    def compare_swap(self, rank, offset, expected, new):
        with self._mu:
            old = int(self.buf[offset // 8])
            if old == expected:
                self.buf[offset // 8] = new
            return old


def slot_of(name):
    if not isinstance(name, str) or not name:
        raise TypeError(f"a lock's name is a non-empty str, not {name!r}")
    return zlib.crc32(name.encode()) % SLOTS * SLOT


class Locks:
    """The locks of one pool (Pool.locks); lock() makes the context manager."""

    def __init__(self, pool, win):
        self.pool = pool
        self.words = win if win is not None else LocalWords()
        self.home = 0
        self.held = {}                # name -> Held: the locks this process holds now
        self.counters = {"acquired": 0, "waited_s": 0.0, "expired_taken": 0, "timeouts": 0,
                         "lease_lost": 0}
        self._mu = threading.Lock()

    def read(self, off):
        return int(self.words.compare_swap(self.home, off, -1, -1))   # an atomic load

    def lock(self, name, timeout=None, lease=DEFAULT_LEASE):
        """A context manager holding lock `name` (see the module docstring)."""
        if not (isinstance(lease, (int, float)) and lease > 0):
            raise ValueError(f"lease must be a positive number of seconds, not {lease!r}")
        timeout = self.pool.timeout if timeout is None else float(timeout)
        return Held(self, name, slot_of(name), timeout, float(lease))

    def stats(self):
        with self._mu:
            return {"held": sorted(self.held), **self.counters}


class Held:
    """One acquisition of a pool lock (taking it again in the thread holding it is a
    ValueError)."""

    def __init__(self, locks, name, base, timeout, lease):
        self.locks, self.name, self.base = locks, name, base
        self.timeout, self.lease = timeout, lease
        self.ticket = self.thread = None
        self._stop = threading.Event()
        self._beater = None

    def _word(self, w):
        return self.base + w

    def acquire(self):
        L = self.locks
        have = L.held.get(self.name)
        if have is not None and have.thread == threading.get_ident():
            raise ValueError(f"this thread holds lock {self.name!r} already")
        W, me = L.words, L.pool.me
        t0 = time.monotonic()
        deadline = t0 + self.timeout
        t = W.fetch_add(L.home, self._word(NEXT), 1)
        seen, since, pause = None, t0, 0.0002
        while True:
            serving = L.read(self._word(SERVING))
            if serving == t:
                break
            now = time.monotonic()
            beat = L.read(self._word(BEAT))
            if (serving, beat) != seen:
                seen, since = (serving, beat), now
            elif now - since >= self.lease:
                # the holder (or the ticket being served) stopped beating: its lease is over
                if W.compare_swap(L.home, self._word(SERVING), serving,
                                  serving + 1) == serving:
                    with L._mu:
                        L.counters["expired_taken"] += 1
                    W.fetch_add(L.home, self._word(BEAT), 1)
                seen, since = None, now
                continue
            if now >= deadline:
                with L._mu:
                    L.counters["timeouts"] += 1
                holder = L.read(self._word(HOLDER)) - 1
                who = f"held by rank {holder}" if holder >= 0 else "held"
                raise Timeout(f"lock {self.name!r} not acquired within {self.timeout:g} s "
                              f"({who}; ticket {t}, serving {serving}; a waiter that gives "
                              f"up costs the next one at most one lease, {self.lease:g} s)",
                              rank=L.home, host=L.pool.world.hosts[L.home])
            time.sleep(pause)
            pause = min(pause * 2, 0.01)
        self.ticket = t
        self.thread = threading.get_ident()
        W.compare_swap(L.home, self._word(HOLDER), L.read(self._word(HOLDER)), me + 1)
        W.fetch_add(L.home, self._word(BEAT), 1)
        with L._mu:
            L.held[self.name] = self
            L.counters["acquired"] += 1
            L.counters["waited_s"] += time.monotonic() - t0
        self._beater = threading.Thread(target=self._beat, daemon=True,
                                        name=f"pooltensor lock {self.name}")
        self._beater.start()
        return self

    def _beat(self):
        L = self.locks
        while not self._stop.wait(self.lease / 4):
            try:
                if L.read(self._word(SERVING)) != self.ticket:
                    return
                L.words.fetch_add(L.home, self._word(BEAT), 1)
            except PooltensorError:
                return

    def release(self):
        L = self.locks
        self._stop.set()
        if self._beater is not None:
            self._beater.join()
        with L._mu:
            L.held.pop(self.name, None)
        t = self.ticket
        self.ticket = None
        W = L.words
        W.compare_swap(L.home, self._word(HOLDER), L.pool.me + 1, 0)
        if W.compare_swap(L.home, self._word(SERVING), t, t + 1) != t:
            with L._mu:
                L.counters["lease_lost"] += 1
            raise LeaseExpired(f"lock {self.name!r} was taken from this process: it held it "
                               f"past its lease ({self.lease:g} s without a heartbeat)")

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False
