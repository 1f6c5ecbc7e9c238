"""run_spmd(fn, *arrays): fn on every member of an attached pool at once, as SPMD ranks.

The workers are ranks 1..N of the pool's world and the client is rank 0, so fn runs on each
worker (a task pinned to it) and in this process at the same time: ``collectives.allreduce``,
``barrier`` and the other collectives inside fn meet across all of them. Pool arrays passed
in arrive as the same arrays in each member's pool (any element readable and writable
one-sided; ``pooltensor.dask.local_part(x)`` is the part a member homes, as a numpy view).

For the call, every member's pool is an SPMD pool, as under mpiexec: pool arrays' operations
(``x * 2 + 1``, ``x.sum()``, ``pooltensor.zeros(...)``, ``pooltensor.sync()``) are collective
across the members, each computing the slabs it homes. Outside run_spmd only the client
allocates; so on entry the client's allocator state travels to the workers with the call (the
members then allocate in step, as SPMD ranks do), every member drops its cached copies of
others' slabs (Dask tasks wrote without versions), and the call ends with the pool's sync.
Afterwards the client's allocator is the pool's again: arrays made inside fn live on as the
client's (rank 0's) copies, so return them from rank 0; the workers' copies must be dropped.
One run_spmd at a time, and no other Dask work on pool arrays meanwhile (a worker with several
threads would run it against a pool that is SPMD for the while).
"""
import threading

import numpy as np

from collectives.errors import CollectiveMismatch, PeerLost, Timeout

from ..pool import alloc
from . import member, views
from .session import attached


def _as_refs(arrays):
    return [views.Ref(a) if hasattr(a, "_a") else a for a in arrays]


_CONSEQUENCES = (CollectiveMismatch, PeerLost, Timeout)   # what one member's error makes
_MODE = ("role", "spmd", "coherent", "exclusive", "placement")
_one = threading.Lock()          # one SPMD call at a time from this client


def _enter(pool, state):
    """Turn this member's pool SPMD (every member does, then meets the others at a
    barrier); returns what _leave() restores. state: the client's allocator state (None on
    the client)."""
    if pool.win_ver is None:
        raise RuntimeError("this pool keeps no slab versions, so it cannot turn SPMD")
    saved = {k: getattr(pool, k) for k in _MODE}
    with pool._lock:
        if state is not None:
            alloc.take_pool_state(pool, state)
        pool.role, pool.spmd, pool.coherent = "spmd", True, pool.size > 1
        pool.exclusive = False
        pool.cache.clear()
    return saved


def _leave(pool, saved, error):
    """End the SPMD call on this member: the pool's sync (every member then sees every
    write, and what all dropped is freed), then the pool's own mode again. error: what fn
    raised here, if anything. A member whose fn raised its own error still comes to the
    sync, saying it failed: the others meet it there (or, still inside an operation, get
    CollectiveMismatch) instead of waiting. One whose collective already failed (mismatch,
    a lost peer, a timeout: the others saw it too) does not."""
    try:
        if not isinstance(error, _CONSEQUENCES):
            pool.sync(failed=error is not None)
    except Exception:                  # noqa: BLE001  (fn's own error is the one to see)
        if error is None:
            raise
    finally:
        with pool._lock:
            for k, v in saved.items():
                setattr(pool, k, v)
            if pool.role == "member":
                pool._pending = []
            pool.cache.clear()


def _on_member(fn, refs, state=None):
    pool = member.process_pool()
    args = [r.array(pool) if isinstance(r, views.Ref) else r for r in refs]
    saved, error = _enter(pool, state), None
    try:
        pool.world.barrier()          # every member SPMD before any of them goes on
        return fn(*args)
    except BaseException as e:
        error = e
        raise
    finally:
        _leave(pool, saved, error)


def local_part(x):
    """The elements of pool array `x` this process homes, as a flat numpy view of its memory
    with their first element index: (start, view); (0, empty) when it homes none. Only for a
    C-contiguous x whose slabs here are one run (as the default placements make them)."""
    pool = member.process_pool()
    a, S = x._a, pool.slab_size
    ks = [k for k, m in enumerate(a.members) if m == pool.me]
    if not ks:
        return 0, np.empty(0, x.dtype)
    lo = max(ks[0] * S, x._off)
    hi = min((ks[-1] + 1) * S, x._off + x.nbytes)
    it = x.itemsize
    e0, e1 = -(-(lo - x._off) // it), (hi - x._off) // it
    flat = x.reshape(-1) if x.ndim != 1 else x
    v = views.slab_view(pool, flat[e0:e1], writable=True)
    if v is None:
        raise ValueError("this member's part of x is not one run of its memory")
    return e0, v


def run_spmd(fn, *arrays, timeout=None):
    """Run fn(*arrays) on every member of the attached pool at once, the client included (as
    rank 0), and return their results in rank order (see the module docstring). A member
    that fails raises here: its own error, not what it caused the others (their
    collectives then fail with CollectiveMismatch, PeerLost or Timeout rather than wait
    forever)."""
    from distributed import wait
    client, pool, ranks = attached()
    refs = _as_refs(arrays)
    with _one:
        state = alloc.pool_state(pool)
        futs = [client.submit(_on_member, fn, refs, state, workers=[w],
                              allow_other_workers=False, pure=False)
                for w, _ in sorted(ranks.items(), key=lambda t: t[1])]
        out, err = [None], [None]

        def mine():
            try:
                out[0] = _on_member(fn, refs)
            except BaseException as e:       # noqa: BLE001  (raised below, after the others)
                err[0] = e

        t = threading.Thread(target=mine, name="pooltensor-spmd-rank0", daemon=True)
        t.start()
        try:
            wait(futs)
        finally:
            t.join(timeout if timeout is not None else pool.timeout + 5)
    for a in arrays:                         # the members may have written them: new tokens
        if hasattr(a, "_a"):
            a._a.version += 1
    pool.cache.gen += 1
    if t.is_alive():
        raise TimeoutError("run_spmd: rank 0 (this process) did not finish with the workers")
    errors = [(0, err[0])] if err[0] is not None else []
    errors += [(r, f.exception()) for r, f in enumerate(futs, 1) if f.status == "error"]
    if errors:                 # the cause: a member's own error before its consequences
        own = [e for _, e in errors if not isinstance(e, _CONSEQUENCES)]
        raise (own or [e for _, e in errors])[0]
    return out + client.gather(futs)
