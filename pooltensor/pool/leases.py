"""Leases: members lend their memory to the pool a lease at a time, and get it back.

Why: a member that lends its whole ``memory`` for the pool's lifetime holds it (in RSS, once
touched) even when the pool no longer needs it. With leases (the default of a plain script's
pool, 128 MiB; ``lease=0`` lends everything up front) each member starts by lending one lease
(all of a smaller ``memory``), an allocation first makes the members it is placed on lend
what it needs there (placement itself sees what each member could lend: ``Pool.room``), the
pool takes another lease from the member with the most memory left to lend whenever an
allocation leaves less than ``grow_below`` (25%) of the lent memory free, and a member whose use stays below
``shrink_below`` (15%) of what it lends for ``shrink_after`` seconds (300) gets its top leases
back: the pages are punched out of its segments (``madvise(MADV_REMOVE)``, a hole punched in
the memfd), so they leave the member's RSS and the machine's memory at once.

How giving back stays possible: a member's lent memory is always the first ``leased`` slots
of each of its heaps (SlabAllocator.resize), so a lease is a contiguous range of slots at the
top. The allocator takes touched, low slots first and grows upwards, so the top leases are
the ones that empty first; a lease is given back only when it is free in both heaps, whole,
and never from under an allocation (an allocation that crosses into the top lease keeps that
lease lent until it is freed). Slots given back read as zeros again (the hole), so the
allocator counts them as fresh (its high-water mark is lowered) only when the punch worked.

Scope: a plain script's pool (the script is the only allocator, and its members are on this
machine, where the script can map their segments to punch them), and a client of memory
servers (the client's window may exceed the server's memory; the server counts, serves and
keeps only what is lent: server_lend). SPMD ranks would each have to agree on when to
shrink: they lend all their memory, and asking for leases there is a ValueError.
"""
import collections
import ctypes
import logging
import mmap
import threading
import time

log = logging.getLogger("pooltensor")
DEFAULT_LEASE = 128 << 20
GROW_BELOW, SHRINK_BELOW, SHRINK_AFTER = 0.25, 0.15, 300.0
MADV_REMOVE = 9
PAGE = mmap.PAGESIZE
_libc = None


def check(lease, grow_below, shrink_below, shrink_after, slab):
    """init()'s lease settings checked: (lease bytes or None, grow_below, shrink_below,
    shrink_after). lease: None or True (the default, 128 MiB, rounded up to a multiple of
    the slab and the page), bytes, or a size such as '64MiB'; 0 or False: no leases (every
    member lends all its memory up front)."""
    from .partitions import _size
    if lease is False or (lease is not None and lease is not True and
                          not isinstance(lease, str) and lease == 0):
        if any(v is not None for v in (grow_below, shrink_below, shrink_after)):
            raise ValueError("grow_below=, shrink_below= and shrink_after= are lease "
                             "settings, but lease=0 turns leases off")
        return None
    unit = slab * PAGE // _gcd(slab, PAGE)
    if lease is None or lease is True:
        n = -(-DEFAULT_LEASE // unit) * unit
    else:
        n = _size("lease", lease)
    if n <= 0 or n % unit:
        raise ValueError(f"lease must be a positive multiple of the slab size and the page "
                         f"size ({unit} B), not {n}")
    out = [n]
    for name, v, d in (("grow_below", grow_below, GROW_BELOW),
                       ("shrink_below", shrink_below, SHRINK_BELOW)):
        v = d if v is None else float(v)
        if not 0.0 <= v < 1.0:
            raise ValueError(f"{name} must be a fraction in [0, 1), not {v}")
        out.append(v)
    after = SHRINK_AFTER if shrink_after is None else float(shrink_after)
    if not after >= 0:
        raise ValueError(f"shrink_after must be seconds >= 0, not {shrink_after}")
    return tuple(out + [after])


def _gcd(a, b):
    while b:
        a, b = b, a % b
    return a


def punch(view, start, stop):
    """Give bytes [start, stop) of a shared writable mapping back (MADV_REMOVE); whether the
    kernel did."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = view.ctypes.data
    lo = -(-(base + start) // PAGE) * PAGE
    hi = (base + min(stop, view.nbytes)) // PAGE * PAGE
    if hi <= lo:
        return True
    return _libc.madvise(lo, hi - lo, MADV_REMOVE) == 0


class Leases:
    """The leases of a plain script's pool (Pool.leases; None with lease=0 or under SPMD)."""

    def __init__(self, pool, lease, grow_below, shrink_below, shrink_after):
        if pool.role not in ("plain", "client"):
            raise ValueError("leases are for a plain script's pool (members=N, one process, "
                             "or memory servers): under SPMD every rank lends all its memory")
        self.pool = pool
        self.lease, self.grow_below = lease, grow_below
        self.shrink_below, self.shrink_after = shrink_below, shrink_after
        self.unit = lease // pool.slab_size
        self.low_since = [None] * pool.size
        self.events = collections.deque(maxlen=1000)   # (time, member, kind, bytes lent after)
        self.counters = {"grown": 0, "shrunk": 0, "given_back_bytes": 0, "punch_failed": 0}
        self.t0 = time.time()
        for m in range(pool.size):
            self._resize(m, min(self.unit, pool.nslabs[m]))
            if pool.role == "client" and m:
                self._lend(m)                 # connect() asked for one lease already
        self._stop = threading.Event()
        self._thread = None
        if shrink_after < float("inf"):
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="pooltensor leases")
            self._thread.start()

    def leased(self, m):
        return self.pool._alloc["rw"][m].nslabs

    def _resize(self, m, n):
        a = self.pool._alloc
        old = a["rw"][m].nslabs
        if not a["rw"][m].resize(n):
            return False
        if not a["ro"][m].resize(n):
            a["rw"][m].resize(old)
            return False
        return True

    # -- growing (under the pool's lock, at allocation) ------------------------------------------
    def cover(self, homes):
        """Before slabs are placed on `homes` (one member per slab): each of those members
        lends, a lease at a time, at least what it will then use. PoolOutOfMemory when a
        memory server will not lend more (what was lent so far stays lent)."""
        pool = self.pool
        need = collections.Counter(homes)
        for m in sorted(need):
            while pool._used[m] + need[m] > self.leased(m):
                if not self._more(m):
                    from ..errors import PoolOutOfMemory
                    S = pool.slab_size
                    who = "memory server" if pool.role == "client" else "member"
                    raise PoolOutOfMemory(
                        f"{who} {m} cannot lend {need[m] * S} more bytes: it lends "
                        f"{self.leased(m) * S} and has no more to lend",
                        free={k: (self.leased(k) - pool._used[k]) * S
                              for k in range(pool.size)}, needed=need[m] * S)

    def headroom(self):
        """After an allocation: while the pool has less than grow_below of what is lent free,
        take a lease from the member with the most memory left to lend."""
        pool = self.pool
        tried = set()
        while True:
            lent = sum(self.leased(m) for m in range(pool.size))
            if lent - sum(pool._used) >= self.grow_below * lent:
                return
            spare = [(pool.nslabs[m] - self.leased(m), -m) for m in range(pool.size)
                     if pool.nslabs[m] > self.leased(m) and m not in pool.keeper.gone
                     and m not in tried]
            if not spare:
                return                         # nothing left to lend
            m = -max(spare)[1]
            if not self._more(m):
                tried.add(m)                   # a server said no: it has no more for us

    def _more(self, m):
        """Member m lends one more lease (what is left, at the end); whether it did."""
        pool = self.pool
        old = self.leased(m)
        if old >= pool.nslabs[m] or m in pool.keeper.gone:
            return False
        self._resize(m, min(pool.nslabs[m], old + self.unit))
        if not self._lend(m):                 # a server said no: it has no more for us
            self._resize(m, old)
            return False
        self._event(m, "grow")
        return True

    # -- shrinking (a thread of its own, every shrink_after / 4, at most 1 s) -------------------
    def _run(self):
        every = min(1.0, max(0.05, self.shrink_after / 4))
        while not self._stop.wait(every):
            try:
                self.tick()
            except Exception as e:           # noqa: BLE001 (a closing pool; logged)
                if self.pool.closed:
                    return
                log.debug("pooltensor: lease check failed: %s", e)

    def tick(self, now=None):
        """Give back what members have lent too long unused (see the module docstring)."""
        pool = self.pool
        now = time.monotonic() if now is None else now
        with pool._lock:
            if pool.closed:
                return
            # frees queued since the last safe point are not applied here: that touches the
            # slab cache, which only the reading thread does (they count at the next
            # allocation, sync() or stats())
            for m in range(pool.size):
                lent = self.leased(m)
                if lent <= self.unit or pool._used[m] >= self.shrink_below * lent:
                    self.low_since[m] = None
                    continue
                if self.low_since[m] is None:
                    self.low_since[m] = now
                if now - self.low_since[m] >= self.shrink_after:
                    self._shrink(m)

    def _shrink(self, m):
        pool, unit = self.pool, self.unit
        keep = -(-int(pool._used[m] / (1 - self.grow_below)) // unit) * unit
        keep = max(unit, keep)
        old = self.leased(m)
        new = old
        while new > keep:
            nxt = (new - 1) // unit * unit
            if not self._resize(m, nxt):
                break
            new = nxt
        if new == old:
            return
        S = pool.slab_size
        ok = all(self._punch(heap, m, new * S, old * S) for heap in ("rw", "ro"))
        if ok:
            for heap in ("rw", "ro"):
                a = pool._alloc[heap][m]
                a.hwm = min(a.hwm, new)
        else:
            self.counters["punch_failed"] += 1
        self.counters["given_back_bytes"] += (old - new) * S
        self.low_since[m] = None
        self._event(m, "shrink")

    def _lend(self, m):
        """A client of memory servers: tell server m what it lends now (it counts that
        against its memory, and punches out what it gets back); whether it agreed."""
        pool = self.pool
        if pool.role != "client":
            return True
        from collectives.control import ServerRefused
        try:
            return pool.world.lend(m, pool.win_rw.buffer, self.leased(m) * pool.slab_size)
        except ServerRefused:
            return False

    def _punch(self, heap, m, lo, hi):
        pool = self.pool
        if pool.role == "client":
            return heap == "ro" or self._lend(m)   # one heap per server: its rw allocation
        if m == pool.me:
            view = pool.local[heap]
        else:
            view = pool.mapped_w.get((heap, m))
            if view is None:
                win = pool.win_rw if heap == "rw" else pool.win_ro_init
                view = None if win is None else win.attach(m, 0, pool.capacity[m],
                                                           writable=True)
        return view is not None and punch(view, lo, hi)

    def _event(self, m, kind):
        self.counters["grown" if kind == "grow" else "shrunk"] += 1
        lent = self.leased(m) * self.pool.slab_size
        self.events.append((round(time.time() - self.t0, 3), m, kind, lent))
        log.debug("pooltensor: member %d %s to %d bytes lent", m, kind, lent)

    def stats(self):
        """What pt.stats() shows: the settings, bytes lent per member, counters, events."""
        S = self.pool.slab_size
        return {"lease": self.lease, "grow_below": self.grow_below,
                "shrink_below": self.shrink_below, "shrink_after": self.shrink_after,
                "lent": [self.leased(m) * S for m in range(self.pool.size)],
                **self.counters,
                "events": [{"t": t, "member": m, "kind": k, "lent": b}
                           for t, m, k, b in self.events]}

    def close(self):
        self._stop.set()


def server_lend(server, client, msg):
    """A memory server's answer to {"op": "lend", "id", "bytes"}: make `bytes` of the
    client's allocation `id` what it lends (counted against --memory and the client's
    partition); less than before punches the rest out of the segment."""
    import numpy as np
    aid, n = msg.get("id"), msg.get("bytes")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (aid, n)) or n < 0:
        return {"ok": False, "error": "lend needs an integer id and bytes >= 0"}
    a = client.allocs.get(aid)
    if a is None:
        return {"ok": False, "error": f"no allocation {aid} on this connection"}
    new = min(a.size, -(-n // PAGE) * PAGE)
    with server._lock:
        old = a.lent
        delta = new - old
        if delta > 0:
            free = server.memory - server._used
            why = server.ledger.refusal(a.partition, delta, free) if delta <= free else \
                f"cannot lend {delta} more bytes: {free} bytes free"
            if why is not None:
                server.counters["refused"] += 1
                return {"ok": False, "error": why,
                        "free": server.ledger.free_to(a.partition, free)}
            server._used += delta
            server.ledger.take(a.partition, delta)
            a.lent = new
    for key in a.keys:                 # the engine serves only what is lent (a put or get
        server._ctx.limit(key, new)    # past it is refused: out of bounds)
    punched = True
    if delta < 0:
        punched = punch(np.frombuffer(memoryview(a.seg), np.uint8), new, old)
        with server._lock:
            server._used += delta
            a.lent = new
        server.ledger.give_back(a.partition, -delta)
    return {"ok": True, "lent": new, "punched": punched, "free": server.free}
