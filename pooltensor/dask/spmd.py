"""run_spmd(fn, *arrays): fn on every member of an attached pool at once, as SPMD ranks.

The workers are ranks 1..N of the pool's world and the client is rank 0, so fn runs on each
worker (a task pinned to it) and in this process at the same time: ``collectives.allreduce``,
``barrier`` and the other collectives inside fn meet across all of them. Pool arrays passed
in arrive as the same arrays in each member's pool (any element readable and writable
one-sided; ``pooltensor.dask.local_part(x)`` is the part a member homes, as a numpy view).
"""
import threading

import numpy as np

from . import member, views
from .session import attached


def _as_refs(arrays):
    return [views.Ref(a) if hasattr(a, "_a") else a for a in arrays]


def _on_member(fn, refs):
    pool = member.process_pool()
    args = [r.array(pool) if isinstance(r, views.Ref) else r for r in refs]
    return fn(*args)


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
    that fails raises here (the first by rank); the others' collectives then fail with
    PeerLost or Timeout rather than wait forever."""
    client, pool, ranks = attached()
    refs = _as_refs(arrays)
    futs = [client.submit(_on_member, fn, refs, workers=[w], allow_other_workers=False,
                          pure=False) for w, _ in sorted(ranks.items(), key=lambda t: t[1])]
    out, err = [None], [None]

    def mine():
        try:
            out[0] = _on_member(fn, refs)
        except BaseException as e:       # noqa: BLE001  (raised below, after the others)
            err[0] = e

    t = threading.Thread(target=mine, name="pooltensor-spmd-rank0", daemon=True)
    t.start()
    try:
        rest = client.gather(futs, errors="raise")
    finally:
        t.join(timeout if timeout is not None else pool.timeout + 5)
    if err[0] is not None:
        raise err[0]
    return out + list(rest)
