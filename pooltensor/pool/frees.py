"""Giving slabs back: the frees the pool queues when an allocation's last array dies.

An Allocation's finalizer only queues its slabs (every copy of them, for a replicated one);
they are given back at a safe point: at the next allocation in a plain script; in SPMD at the
next collective point (creation or sync), for the arrays every rank has dropped (the
agreement row of that point says whether any rank has something queued, then one allgather
of (id, digest of its slabs) pairs: the ranks must agree on each id's slabs).
"""
import numpy as np

import collectives

from . import agree, rejoin

SYNC = agree.Call("sync")         # a plain pt.sync(), as the ranks compare it


def _pairs(members, slots, copies):
    """(member, slot) of every slab copy an allocation holds."""
    if copies is None:
        return zip(members, slots)
    return [c for cs in copies for c in cs]


def word(entry):
    """The digest of a queued free's slabs (as the ranks compare them)."""
    _, heap, members, slots, copies = entry
    if copies is None:
        return agree.slabs_word(heap, members, slots)
    pairs = list(_pairs(members, slots, copies))
    return agree.slabs_word(heap, [m for m, _ in pairs], [s for _, s in pairs])


def apply(pool, pend):
    """Give the slabs of the queued frees `pend` back to their allocators."""
    for aid, heap, members, slots, copies in pend:
        per = {}
        for m, s in _pairs(members, slots, copies):
            per.setdefault(m, []).append(s)
        for m, ss in per.items():
            ss.sort()
            runs, st, ln = [], ss[0], 1
            for s in ss[1:]:
                if s == st + ln:
                    ln += 1
                else:
                    runs.append((st, ln))
                    st, ln = s, 1
            runs.append((st, ln))
            if heap == "pv":
                pool._alloc_pv.free(runs)
            else:
                pool._alloc[heap][m].free(runs)
                pool._used[m] -= len(ss)
                pool._heap_used[heap][m] -= len(ss)
                if m != pool.me:
                    pool.cache.discard_keys([(heap, m, s) for s in ss])
                    rejoin.given_back(pool, m, ss)
        pool.partitions.forget(aid)
        pool._live -= 1


def collect(pool, call=None, failed=False):
    """Give back the slabs of dropped arrays (collective in SPMD).

    SPMD: one allreduce of every rank's agreement row for `call` (the collective point
    this is part of; default a plain sync) carrying its count of queued frees and
    `failed`; CollectiveMismatch on every rank, with nothing freed, when the calls differ.
    Returns whether any rank passed failed=True."""
    with pool._lock:
        if pool._pending_pv:
            apply(pool, pool._pending_pv)
            pool._pending_pv = []
        if not pool.coherent:
            pend, pool._pending = pool._pending, []
            apply(pool, pend)
            return failed
        call = SYNC if call is None else call
        pend = list(pool._pending)      # a finalizer may queue more while we wait
        red = agree.reduce(pool.world, call, len(pend), int(failed))
        return agreed(pool, red, call, pend)


def agreed(pool, red, call, pend):
    """After the agreement row of a collective point (`red`, reduced over the ranks):
    verify it, then free what every rank dropped (of `pend`, the queue when the row was
    sent). Returns whether any rank's row said failed."""
    agree.verify(pool.world, red, call)
    mx = int(red[0])
    if mx:
        # (id >= 1, digest of its slabs) padded with 0 to the longest list: one allgather
        mine = [(p[0], word(p)) for p in pend]
        mine += [(0, 0)] * (mx - len(mine))
        per = [dict(lst) for lst in
               collectives.allgather(np.array(mine, np.int64), world=pool.world).tolist()]
        common = set(per[0]).intersection(*per[1:]) - {0}
        if common:
            _check(pool, per, common)
            now = [p for p in pend if p[0] in common]
            pool._pending = [p for p in pool._pending if p[0] not in common]
            apply(pool, now)
    return bool(red[1])


def _check(pool, per, common):
    """Every rank holds the same slabs under each id about to be freed (per: one
    {id: slab digest} per rank); else the pools diverged: CollectiveMismatch on every
    rank, nothing freed."""
    me = pool.me
    for aid in sorted(common):
        digests = [p[aid] for p in per]
        if digests.count(digests[0]) != len(digests):
            other = next(r for r, d in enumerate(digests) if d != digests[me])
            raise collectives.CollectiveMismatch(
                f"the ranks would free allocation {aid} with different slabs (slab "
                f"digests {digests}, rank by rank): their pools diverged; nothing was freed",
                rank=other, host=pool.world.hosts[other])
