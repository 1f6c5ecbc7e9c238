"""Chunked passes for the data-dependent algorithms (scans, sorting, unique, nonzero,
searchsorted, fft, TSQR) on arrays too big to gather into one process.

The array (seen with the working axis first) is cut along that axis into chunks of about
CHUNK_BYTES, and each pass runs one job (chunkjobs.py) on every chunk: whoever homes the
chunk's first row runs it there, reading (mostly) its own slabs in place and writing its
outputs one-sided. Under SPMD that is the rank homing it; in a plain script, a member process
that homes at least $POOLTENSOR_MEMBER_WORK_MIN bytes of the array gets one plan per pass
(pool/work.py, plan "chunks") and runs its chunks while the script runs the rest, streaming
them through its cache. Only the jobs' small summaries (totals, counts, R factors) travel
back and are exchanged (SPMD: one allgather), and the next pass is planned from them. Nothing
here gathers a whole array into one process.

``big(x)`` decides: arrays up to the pool's materialize_limit are gathered and handed to
numpy (the fast path; numpy's exact semantics); larger ones take the chunked passes. Tests
lower the limit (``pooltensor.init(materialize_limit=...)``) to run the chunked passes on
small arrays.
"""
import numpy as np

from ..cache import transfer
from ..pool import work
from ..pool.runtime import current
from . import executor

CHUNK_BYTES = 16 << 20


def big(*arrays):
    """True when the arrays together exceed the pool's materialize_limit."""
    pool = current()
    return sum(a.nbytes for a in arrays) > pool.materialize_limit


def rows(x, nbytes=CHUNK_BYTES):
    """Rows per chunk along axis 0 of x (at least one)."""
    row = max(1, x.nbytes // max(1, x.shape[0])) if x.ndim and x.shape[0] else 1
    limit = min(nbytes, max(1, current().materialize_limit // 4))
    return max(1, limit // row)


def ranges(n, step):
    """[(r0, r1), ...] covering range(n) in runs of `step`."""
    return [(r, min(n, r + step)) for r in range(0, n, step)]


def read(x):
    """The elements of pool array x as numpy, without the materialize_limit check: for the
    pieces these passes size themselves (a chunk, a sample, a bucket of a sample sort,
    which may run somewhat past a chunk when the sample misjudged it)."""
    out = np.empty(x.shape, x.dtype)
    return transfer.read(x._a.pool, x._a, x._off, x.shape, x.strides, x.dtype, out)


def owners(key, parts):
    """The member homing the first row of each chunk of pool array `key` (axis 0)."""
    a = key._a
    S = a.pool.slab_size
    st = key._strides[0] if key.ndim else 0
    return [int(a.members[(key._off + r0 * st) // S]) if r1 > r0 and key.size else
            a.pool.me for r0, r1 in parts]


def run_here(pool, job, arrays, parts, homes, handled):
    """Run `job` on the chunks whose home is in `handled`: {chunk index: summary}."""
    return {i: job(r0, r1, arrays) for i, ((r0, r1), h) in enumerate(zip(parts, homes))
            if h in handled}


def run(job, parts, key, arrays, outs=()):
    """job(r0, r1, arrays) for every chunk of `parts` (rows of pool array `key`), each where
    its first row lives (see the module); the summaries in chunk order, on every rank.
    outs: the arrays the job writes (made visible everywhere before this returns)."""
    pool = current()
    homes = owners(key, parts)
    if pool.spmd and pool.size > 1 and key._a.heap != "pv":
        got = {}
        for d in executor.allgather(run_here(pool, job, arrays, parts, homes, {pool.me})):
            got.update(d)
        if outs:
            pool.sync()
        return [got.get(i) for i in range(len(parts))]
    everyone = frozenset(range(pool.size))
    doers = [m for m in work.doers(pool, key) if m in homes]
    res = None
    if doers and getattr(job, "PLAN_OK", False):
        res = work.share(pool, doers, ("chunks", job, list(arrays), parts, homes),
                         lambda handled: run_here(pool, job, arrays, parts, homes, handled),
                         list(outs))
    if res is None:
        got = run_here(pool, job, arrays, parts, homes, everyone)
    else:
        got, replies = res
        for d in replies.values():
            got.update(d)
    return [got.get(i) for i in range(len(parts))]
