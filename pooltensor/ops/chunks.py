"""Chunked passes for the data-dependent algorithms (scans, sorting, unique, nonzero,
searchsorted) on arrays too big to gather into one process.

The array (seen with the working axis first) is cut along that axis into chunks of about
CHUNK_BYTES. Under SPMD the chunks are dealt out in contiguous runs, one run per rank, so each
rank reads (mostly its own) slabs of its run and the ranks meet only to exchange small
per-chunk summaries (counts, totals) with an allgather; in a plain script the script runs
every chunk, streaming the slabs through its cache with the prefetcher ahead, so at most a
few chunks are ever held at once. Nothing here gathers a whole array into one process.

``big(x)`` decides: arrays up to the pool's materialize_limit are gathered and handed to
numpy (the fast path; numpy's exact semantics); larger ones take the chunked passes. Tests
lower the limit (``pooltensor.init(materialize_limit=...)``) to run the chunked passes on
small arrays.
"""
import numpy as np

from ..cache import transfer
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


def mine(chunks):
    """(first index, the chunks this process handles): a contiguous run per SPMD rank, all of
    them in a plain script."""
    pool = current()
    if not (pool.spmd and pool.size > 1):
        return 0, chunks
    n, p, r = len(chunks), pool.size, pool.world.rank
    lo, hi = n * r // p, n * (r + 1) // p
    return lo, chunks[lo:hi]


def gather_list(local_items, first, total):
    """Every chunk's summary in chunk order, from each rank's (first, items): a list of
    `total` entries (SPMD: one allgather; a plain script: the list itself)."""
    parts = executor.allgather((first, list(local_items)))
    out = [None] * total
    for f, items in parts:
        out[f:f + len(items)] = items
    return out


def finish(*outs):
    """SPMD: every rank's one-sided writes into the outputs made visible everywhere."""
    pool = current()
    if pool.spmd and pool.size > 1:
        pool.sync()


def read(x):
    """The elements of pool array x as numpy, without the materialize_limit check: for the
    pieces these passes size themselves (a chunk, a sample, a bucket of a sample sort,
    which may run somewhat past a chunk when the sample misjudged it)."""
    out = np.empty(x.shape, x.dtype)
    return transfer.read(x._a.pool, x._a, x._off, x.shape, x.strides, x.dtype, out)
