"""Versions of whole arrays and read-modify-write under a pool lock.

Why: a process that reads an array, computes and writes it back must know that nobody wrote
in between. An array's version is the sum of its read-write slabs' versions at their homes
(the int64 per slab that every write bumps in SPMD, see pool.py "Coherence"), so it is the
same number on every process; in a pool whose only writer is this process (a plain script,
a client of memory servers) it is the allocation's own count of writes.

``compare_and_bump`` and ``update`` hold the array's pool lock (locks.py, named after the
allocation) so that a multi-slab check-then-write is atomic for the other processes doing
the same; plain writes outside the lock are not ordered by it (as with any lock).
"""


def _slabs(x):
    a = x._a
    return a, list(zip(a.members, a.slots))


def _shared(pool, a):
    return pool.coherent and a.heap == "rw"


def version(pool, x):
    """x's version (see the module docstring)."""
    pool.check_open()
    a, slabs = _slabs(x)
    if _shared(pool, a):
        return sum(pool.slab_version(m, s) for m, s in slabs)
    return a.version


def lock_name(x):
    return f"pooltensor.array.{x._a.id}"


def bump(pool, x):
    a, slabs = _slabs(x)
    if _shared(pool, a):
        for m, s in slabs:
            pool.bump(m, s)
    a.version += 1


def compare_and_bump(pool, x, expected, timeout=None):
    """Bump x's version when it is `expected`; whether it did."""
    with pool.lock(lock_name(x), timeout):
        if version(pool, x) != expected:
            return False
        bump(pool, x)
        return True


def update(pool, x, fn, timeout=None):
    """Under x's lock: drop this process's cached copies of x's slabs, read x, x[...] =
    fn(value), write it through to the homes; returns the new value."""
    with pool.lock(lock_name(x), timeout):
        a, slabs = _slabs(x)
        if a.heap != "pv":
            pool.cache.discard_keys([(a.heap, m, s) for m, s in slabs if m != pool.me])
        new = fn(x.to_numpy())
        x[...] = new
        for w in (pool.win_rw, pool.win_ver):
            if w is not None:
                w.flush()
        if not _shared(pool, a):
            a.version += 1      # SPMD: the write bumped the slabs' versions already
        return new
