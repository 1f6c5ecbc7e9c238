"""Migration: slabs move to the member that reads them, explicitly or by sampled access counts.

Why: placement is decided at allocation, but the member that ends up reading a slab most may
not be its home; every read of it is then a transfer (a fault into the slab cache), where a
local slab is a view. Moving the slab once saves every later transfer.

Access counts are sampled at cache faults (pooltensor/cache/fault.py calls note()): a fault
is one slab's worth of reading, so the count costs one dict increment per slab moved, never
per element. A member's reads of its own slabs never fault, so the counts say who reads
*remote* slabs: a slab faulted in at least ``min_faults`` times by this process, and at
least ``ratio`` times more than by any other counting process, is hot here.

A move, for one slab k of an allocation (under the pool's lock and the array's pool lock, so
that ``pool.update`` writers are ordered with it, before or after, never lost): take a slot on
the new home, copy the slab's bytes, repoint the allocation's directory (members[k],
slots[k]), bump the allocation's version, drop every stale copy this process holds (cache
entries, x[i] memos, numpy views, the prefetcher's state), and queue the old slot's free.
Readers that look the slab up afterwards read the new home; the old slot is reused only at
the next allocation, after the reads in flight ended. A budget (bytes per second) paces moves
so that migrating never takes the bandwidth it is meant to save.

Scope: the pools whose one process allocates (a plain script, with members or memory
servers). Under SPMD every rank keeps the directory, and ranks would have to agree on moves.
"""
import collections
import threading
import time

import numpy as np

from ..errors import PoolOutOfMemory

DEFAULT_BUDGET = 1 << 30          # bytes/s
DEFAULT_RATIO, DEFAULT_MIN_FAULTS = 4.0, 8


def check(settings):
    """migrate= of init() checked: {budget (bytes/s, or a size such as '512MiB'), ratio,
    min_faults}; unknown keys are a ValueError."""
    from .partitions import _size
    if not isinstance(settings, dict):
        raise TypeError(f"migrate must be a dict of budget, ratio and min_faults, not "
                        f"{type(settings).__name__}")
    bad = set(settings) - {"budget", "ratio", "min_faults"}
    if bad:
        raise ValueError(f"migrate: unknown settings {sorted(bad)} (budget, ratio, "
                         f"min_faults)")
    out = dict(settings)
    if "budget" in out:
        out["budget"] = _size("migrate budget", out["budget"])
        if out["budget"] <= 0:
            raise ValueError("migrate budget must be > 0 bytes/s")
    if float(out.get("ratio", 1)) < 0 or int(out.get("min_faults", 1)) < 1:
        raise ValueError("migrate: ratio must be >= 0 and min_faults >= 1")
    return out


class Budget:
    """A token bucket of `rate` bytes/s (one second of burst); take() sleeps when empty."""

    def __init__(self, rate):
        self.rate = float(rate)
        self.tokens = self.rate
        self.t = time.monotonic()
        self.slept = 0.0

    def take(self, n):
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.t) * self.rate)
        self.t = now
        self.tokens -= n
        if self.tokens < 0:
            wait = -self.tokens / self.rate
            self.slept += wait
            time.sleep(wait)


class Mover:
    """Pool.mover: access counts and slab moves of one pool (see the module docstring)."""

    def __init__(self, pool, budget=DEFAULT_BUDGET, ratio=DEFAULT_RATIO,
                 min_faults=DEFAULT_MIN_FAULTS):
        self.pool = pool
        self.faults = collections.Counter()          # (heap, member, slot) -> faults here
        self.homes = collections.Counter()           # ... -> plans its home ran on it
        self.live = None                             # WeakSet of allocations (made on use)
        self.budget = Budget(budget)
        self.ratio, self.min_faults = float(ratio), int(min_faults)
        self.counters = {"migrations": 0, "bytes": 0, "rebalanced": 0}
        self.pending = False
        self._mu = threading.Lock()

    def note(self, heap, m, slot):
        key = (heap, m, slot)
        c = self.faults[key] = self.faults[key] + 1
        if c == self.min_faults:
            self.pending = True          # migrate_hot has something to look at

    def note_homes(self, allocs, members):
        """A plan on `allocs` went to `members`: each works on the slabs it homes (one
        access each; a plain script's members are the only processes it hears from)."""
        ms = set(members)
        for a in allocs:
            if a.heap != "pv":
                for m, s in zip(a.members, a.slots):
                    if m in ms:
                        self.homes[(a.heap, m, s)] += 1

    def _not_spmd(self):
        if self.pool.coherent:
            raise ValueError("slabs move only in a pool whose one process allocates (a plain "
                             "script, with members or memory servers): under SPMD every "
                             "rank keeps its slabs where they were placed (x.migrate and "
                             "pool.rebalance are refused; create the array with the "
                             "placement wanted instead)")

    def track(self, alloc):
        import weakref
        if self.live is None:
            self.live = weakref.WeakSet()
        self.live.add(alloc)

    def _check(self, alloc):
        self._not_spmd()
        if alloc.heap == "pv":
            raise ValueError("a private array lives on its member alone: it does not move")
        if alloc.copies is not None:
            raise ValueError("a replicated array's copies do not move")

    # -- one slab ------------------------------------------------------------------------------
    def move(self, alloc, k, dest):
        """Move slab k of `alloc` to member `dest`; whether it moved (False: it is there, or
        dest has no room)."""
        pool, S = self.pool, self.pool.slab_size
        heap, src, slot = alloc.heap, alloc.members[k], alloc.slots[k]
        if src == dest:
            return False
        n = alloc.slab_len(k)
        self.budget.take(n)
        with pool._lock:
            if pool.room(dest) < 1 or dest in pool.keeper.gone:
                return False
            if pool.leases is not None:
                try:
                    pool.leases.cover([dest])     # dest lends a lease more when it is full
                except PoolOutOfMemory:
                    return False
            (new,), _ = pool.take(heap, [dest])
            buf = np.empty(n, np.uint8)
            if src == pool.me:
                buf[:] = pool.local[heap][slot * S: slot * S + n]
            else:
                pool.read_win[heap].get(src, slot * S, buf)
            if dest == pool.me:
                pool.local[heap][new * S: new * S + n] = buf
            else:
                win = pool.write_win[heap]
                win.put(dest, new * S, buf)
                win.flush()
            alloc.members[k], alloc.slots[k] = dest, new
            alloc.version += 1
            self._forget(alloc, [(heap, src, slot)])
            pool._queue_free(0, heap, [src], [slot])
            self.counters["migrations"] += 1
            self.counters["bytes"] += n
            self.faults.pop((heap, src, slot), None)
            self.homes.pop((heap, src, slot), None)
        return True

    def _forget(self, alloc, keys):
        pool = self.pool
        pool.cache.discard_keys(keys)
        pool.cache.gen += 1                  # x[i] memos stop matching
        alloc.memo.clear()
        alloc.pf = None
        for ref in list(pool.views.values()):
            v = ref()
            if v is not None and v._a is alloc:
                v._np = v._parts = None
                v._tried = False

    # -- whole arrays, hot slabs, balance ---------------------------------------------------
    def migrate(self, x, placement):
        """Move x's slabs to the homes `placement` gives them (x.migrate); slabs moved."""
        from . import placement as _placement
        from .locks import DEFAULT_LEASE
        from .versions import lock_name
        alloc = x._a
        self._check(alloc)
        pool = self.pool
        policy = _placement.check(placement, pool.size)
        n = len(alloc.members)
        with pool._lock:
            free = [pool.room(m) for m in range(pool.size)]
            for m in alloc.members:
                free[m] += 1                 # its own slabs count as room where they are
            homes = _placement.plan(policy, n, free, pool.me)
        moved = 0
        with pool.lock(lock_name(x), lease=DEFAULT_LEASE):
            for k, dest in enumerate(homes):
                moved += self.move(alloc, k, dest)
        return moved

    def hot(self):
        """[(allocation, slab, reader)] of slabs this process reads enough to own."""
        pool, out = self.pool, []
        for alloc in list(self.live or ()):
            if alloc.heap == "pv" or alloc.copies is not None:
                continue
            for k, (m, s) in enumerate(zip(alloc.members, alloc.slots)):
                c = self.faults.get((alloc.heap, m, s), 0)
                if m != pool.me and c >= self.min_faults and \
                        c >= self.ratio * self.homes.get((alloc.heap, m, s), 0):
                    out.append((alloc, k, pool.me))
        return out

    def migrate_hot(self):
        """Move the hot slabs to this process's member, while it has room; slabs moved."""
        return len(self._move_hot())

    def _move_hot(self):
        if self.pool.coherent or not self.pending:
            return []
        self.pending = False
        moved = []
        for alloc, k, dest in self.hot():
            if not self.move(alloc, k, dest):
                break
            moved.append((alloc.id, k))
        return moved

    def rebalance(self):
        """Hot slabs first, then even out the members' used fraction by moving the last
        slabs of the fullest member to the emptiest, while a move narrows the spread (the
        hot slabs just moved stay with their reader); returns the slabs moved."""
        pool = self.pool
        self._not_spmd()
        hot = set(self._move_hot())          # these stay with their reader
        moved = len(hot)
        for _ in range(sum(pool.nslabs)):
            with pool._lock:
                pool.collect_frees()
                frac = [pool._used[m] / max(1, pool.nslabs[m]) for m in range(pool.size)]
                hi = max(range(pool.size), key=lambda m: (frac[m], -m))
                lo = min(range(pool.size), key=lambda m: (frac[m], m))
                # one more slab from hi to lo would not narrow the spread
                if frac[hi] - frac[lo] <= (1.0 / max(1, pool.nslabs[lo])
                                           + 1.0 / max(1, pool.nslabs[hi])) / 2:
                    break
                pick = next(((a, k) for a in list(self.live or ())
                             if a.heap != "pv" and a.copies is None
                             for k in range(len(a.members) - 1, -1, -1)
                             if a.members[k] == hi and (a.id, k) not in hot), None)
            if pick is None or not self.move(pick[0], pick[1], lo):
                break
            moved += 1
            self.counters["rebalanced"] += 1
        return moved

    def stats(self):
        return {**self.counters, "budget": self.budget.rate,
                "budget_waited_s": round(self.budget.slept, 3),
                "sampled_slabs": len(self.faults),
                "sampled_faults": sum(self.faults.values())}
