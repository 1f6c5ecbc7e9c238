"""Pool.check() and ``pooltensor check HOST:PORT``: does the pool's state hold together?

Why: the directory (which slabs each array holds), the allocators' books, the partitions'
counts, the versions and the replicas are kept apart for speed; a bug, a lost write or
memory changed behind the pool's back shows as a disagreement between them. Checked here:

- directory: every slab of a live array is inside what its member lends, in use in that
  heap's allocator, and held by one array only; each member's used count equals the slabs
  of live arrays plus the frees still queued;
- partitions: each partition's used bytes equal what its live arrays hold;
- versions: no cached copy of a read-write slab is newer than its home's version (SPMD),
  and no allocation's version is negative;
- replicas: every copy of a replicated slab holds the same bytes as the first (read from
  each member and compared).

The report is a dict: {"ok": bool, "checked": {...counts}, "differences": [sentences]}.
A job that serves metrics (``pooltensor.init(metrics=...)``) also answers it at /check,
which is what ``pooltensor check HOST:PORT`` reads.
"""
import numpy as np


def run(pool, limit=100):
    """The report (see the module docstring); at most `limit` differences are listed."""
    diffs = []
    counts = {"arrays": 0, "slabs": 0, "replica_slabs": 0, "cached_versions": 0}

    def differ(text):
        if len(diffs) < limit:
            diffs.append(text)

    with pool._lock:
        if not pool.coherent:
            pool.collect_frees()
        live = [a for a in list(pool.mover.live or ()) if a.heap != "pv"]
        owner = {}
        per_member = [0] * pool.size
        per_part = {}
        free = {h: [pool._alloc[h][m].free_runs() for m in range(pool.size)]
                for h in ("rw", "ro")}
        for a in live:
            counts["arrays"] += 1
            pairs = ([c for cs in a.copies for c in cs] if a.copies is not None
                     else list(zip(a.members, a.slots)))
            if a.version < 0:
                differ(f"array {a.id}: negative version {a.version}")
            if a.partition is not None:
                per_part[a.partition] = per_part.get(a.partition, 0) + len(pairs) * \
                    pool.slab_size
            for m, s in pairs:
                counts["slabs"] += 1
                per_member[m] += 1
                if not 0 <= s < pool.lent(m):
                    differ(f"array {a.id}: slab ({a.heap}, member {m}, slot {s}) is outside "
                           f"the {pool.lent(m)} slots member {m} lends")
                if any(st <= s < st + ln for st, ln in free[a.heap][m]):
                    differ(f"array {a.id}: slab ({a.heap}, member {m}, slot {s}) is free in "
                           f"the allocator")
                # keyed by allocator: a client's two heaps are one allocator's slots
                other = owner.setdefault((id(pool._alloc[a.heap][m]), s), a.id)
                if other != a.id:
                    differ(f"slab ({a.heap}, member {m}, slot {s}) is held by arrays {other} "
                           f"and {a.id}")
        queued = [0] * pool.size
        for aid, heap, members, slots, copies in pool._pending:
            for m in (members if copies is None else [c[0] for cs in copies for c in cs]):
                queued[m] += 1
        for m in range(pool.size):
            if per_member[m] + queued[m] != pool._used[m]:
                differ(f"member {m}: the allocator counts {pool._used[m]} slabs used, live "
                       f"arrays hold {per_member[m]} and {queued[m]} wait to be freed")
        for name, p in pool.partitions.stats().items():
            held = per_part.get(name, 0)
            if not pool._pending and held != p["used"]:
                differ(f"partition {name!r}: counts {p['used']} B used, its live arrays hold "
                       f"{held} B")
    if pool.coherent:
        for (heap, m, slot), e in list(pool.cache.entries.items()):
            if heap == "rw":
                counts["cached_versions"] += 1
                home = pool.slab_version(m, slot)
                if e.version > home:
                    differ(f"cached copy of (rw, member {m}, slot {slot}) has version "
                           f"{e.version}, newer than its home's {home}")
    S = pool.slab_size
    for a in live:
        if a.copies is None:
            continue
        for k, cs in enumerate(a.copies):
            n = a.slab_len(k)
            first = None
            for m, s in cs:
                if m in pool.keeper.gone:
                    continue
                buf = np.empty(n, np.uint8)
                if m == pool.me:
                    buf[:] = pool.local[a.heap][s * S: s * S + n]
                else:
                    pool.read_win[a.heap].get(m, s * S, buf)
                counts["replica_slabs"] += 1
                if first is None:
                    first = (m, buf)
                elif not np.array_equal(first[1], buf):
                    bad = int(np.flatnonzero(first[1] != buf)[0])
                    differ(f"array {a.id} slab {k}: the copy on member {m} differs from the "
                           f"one on member {first[0]} (first at byte {bad})")
    return {"ok": not diffs, "checked": counts, "differences": diffs}
