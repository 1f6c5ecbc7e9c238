"""Pool.stats(): what the pool holds and how its transfers go, as one dict.

Usage comes from the allocator (per member: capacity, used, free, the largest free run and
fragmentation of each heap), shares from the members' capacities, the cache's counters from
the slab cache, and the transfers (latency percentiles per transport and operation,
bandwidth over the last interval, each peer's health) from the native counters through the
world (collectives/counters.py). Every field is described in README.md, "Stats".

Other parts of the pool add sections of their own with add_section() (partitions: each
partition's usage), read under the pool's lock with the rest of the usage.
"""

SECTIONS = {}


def add_section(name, read):
    """Add a section `name` to stats(): read(pool) returns a msgpack-able dict (or None: no
    such section in this pool), called with the pool's lock held, so it sees the allocator as
    the members' usage does (the metrics endpoint reads the same usage, but exports only the
    families pool/metrics.py defines). ValueError for a name the report already has."""
    if name in SECTIONS or name in ("members", "pool", "private", "cache", "plans",
                                    "replicas", "transfers", "slab_size", "role", "arrays",
                                    "pending_frees"):
        raise ValueError(f"stats() already has a section {name!r}")
    SECTIONS[name] = read
    return read



def stats(pool, per_peer=False):
    """The dict Pool.stats() returns (see the module's docstring)."""
    out = usage(pool)
    out["transfers"] = pool.world.stats(per_peer)
    return out


def usage(pool, wait=-1):
    """Pool.stats() without "transfers" (what the metrics endpoint reads: it must not move
    the interval that stats() measures bandwidth over). wait: seconds to wait for the pool's
    lock (held through a collective sync, for instance); None when that was not enough."""
    if not pool._lock.acquire(timeout=wait):
        return None
    try:
        if not pool.coherent:
            pool.collect_frees()
        S = pool.slab_size
        members = []
        for m in range(pool.size):
            rw, ro = pool._alloc["rw"][m], pool._alloc["ro"][m]
            used_rw = pool._heap_used["rw"][m] * S
            used_ro = pool._heap_used["ro"][m] * S
            # with leases, free and the largest run count what the member has yet to lend
            # (lent when an allocation is placed there): capacity - used, as without
            free_slabs, unlent = pool.room(m), pool.nslabs[m] - pool.lent(m)
            members.append({
                "member": m, "host": pool.world.hosts[m], "capacity": pool.capacity[m],
                "transport": pool.world.transports[m], "lent": pool.lent(m) * S,
                "used": used_rw + used_ro, "readwrite": used_rw, "readonly": used_ro,
                "free": free_slabs * S,
                "largest_free_run": {
                    "readwrite": min(rw.largest_grown(unlent), free_slabs) * S,
                    "readonly": min(ro.largest_grown(unlent), free_slabs) * S},
                "fragmentation": {"readwrite": round(rw.fragmentation(), 4),
                                  "readonly": round(ro.fragmentation(), 4)}})
        pv = pool._alloc_pv
        out = {"members": members, "slab_size": S, "role": pool.role,
               "arrays": pool._live, "pending_frees": len(pool._pending),
               "private": {"member": pool.me, "used": (pv.nslabs - pv.nfree) * S,
                           "free": pv.nfree * S,
                           "fragmentation": round(pv.fragmentation(), 4)},
               "cache": pool.cache.stats(), "plans": dict(pool.plans),
               "replicas": pool.keeper.stats(),
               "partitions": pool.partitions.stats(),
               "locks": pool.locks.stats(),
               "leases": pool.leases.stats() if pool.leases is not None else None,
               "migrations": pool.mover.stats()}
        for name, read in SECTIONS.items():
            got = read(pool)
            if got is not None:
                out[name] = got
    finally:
        pool._lock.release()
    capacity = sum(m["capacity"] for m in members)
    used = sum(m["used"] for m in members)
    for m in members:
        m["share"] = m["capacity"] / capacity if capacity else 0.0
        m["used_share"] = m["used"] / used if used else 0.0
        m["used_fraction"] = m["used"] / m["capacity"] if m["capacity"] else 0.0
    free = sum(m["free"] for m in members)
    frag = sum(m["fragmentation"]["readwrite"] * m["free"] for m in members)
    out["pool"] = {"capacity": capacity, "lent": sum(m["lent"] for m in members),
                   "used": used, "free": free,
                   "used_fraction": used / capacity if capacity else 0.0,
                   "largest_free_run": max((m["largest_free_run"]["readwrite"]
                                            for m in members), default=0),
                   # the members' read-write fragmentation, weighted by their free bytes
                   "fragmentation": round(frag / free, 4) if free else 0.0}
    return out
