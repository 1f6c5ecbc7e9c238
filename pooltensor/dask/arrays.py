"""Pool arrays into Dask arrays and back: to_dask, from_dask, homes, map_blocks.

``to_dask(x)``: one future per chunk, each submitted to the worker that homes the chunk's
slabs with ``workers=[home], allow_other_workers=False``. Pinning is done with futures, not
with ``dask.annotate(workers=...)``: dask.array's graph optimization drops annotations of
the layers it fuses, and with ``array.query-planning`` the expressions do not carry them at
all; a future is already in memory where it ran, and the scheduler then runs dependent tasks
on the worker holding their inputs. The chunk a task receives is a SlabView of the home's
own heap (views.py): no copy. Chunks are cut along the first axis at the boundaries between
homes and then every ``chunk_bytes`` (default 16 slabs), so a C-contiguous array's chunks
are whole slabs of one member whenever its rows allow it.

The pool array stays alive while any of its chunk futures does (the chunks are views of its
slabs).

``from_dask(d)``: persists `d`, then writes every chunk into a new pool array from the worker
that computed it; by default the new array's slabs are placed on the workers holding the
chunks (so the writes are local), or as ``placement`` says, or lined up with ``like``.
"""
import bisect
import math
import threading
import weakref

import numpy as np

from ..array import creation
from ..pool import placement as _placement
from ..pool import work
from . import member, views
from .session import CHUNKS, attached

CHUNK_SLABS = 16            # default chunk: this many slabs
_made = {}                  # dask array name -> block index -> worker (to_dask's homes)
_copying = threading.Lock()  # a worker's threads copy through its one slab cache in turn


class _Keep:
    """Holds a pool array while the futures of its chunks live."""

    def __init__(self, x, n):
        self.x, self.n = x, n

    def drop(self):
        self.n -= 1
        if self.n <= 0:
            self.x = None


def _chunk_bytes(chunk_bytes, S):
    if chunk_bytes is None:
        return CHUNK_SLABS * S
    if isinstance(chunk_bytes, str):
        from dask.utils import parse_bytes
        chunk_bytes = parse_bytes(chunk_bytes)
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, (int, np.integer)):
        raise TypeError(f"chunk_bytes must be a number of bytes, not "
                        f"{type(chunk_bytes).__name__}")
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, not {chunk_bytes}")
    return int(chunk_bytes)


def _contiguous(x):
    st, want = [], x.itemsize
    for n in reversed(x._shape):
        st.append(want)
        want *= n
    return tuple(reversed(st)) == tuple(x._strides) or x.size <= 1


def row_bounds(x, chunk_bytes=None):
    """The chunks of `x` along its first axis: a list of (first row, end row)."""
    S = x._a.pool.slab_size
    target = _chunk_bytes(chunk_bytes, S)
    if x.ndim == 0:
        return [(0, 1)]
    n = x._shape[0]
    if n == 0:
        return [(0, 0)]
    row = max(1, x.nbytes // n)
    per = max(1, target // row)
    cuts = {0, n}
    if _contiguous(x):
        if row < S and S % row == 0:
            rs = S // row
            per = max(rs, per // rs * rs)
        a = x._a
        k0 = x._off // S
        k1 = (x._off + x.nbytes - 1) // S + 1
        for k in range(k0 + 1, k1):
            if a.members[k] != a.members[k - 1]:
                r = int(round((k * S - x._off) / row))
                if 0 < r < n:
                    cuts.add(r)
    edges = sorted(cuts)
    out = []
    for lo, hi in zip(edges, edges[1:]):
        for r in range(lo, hi, per):
            out.append((r, min(hi, r + per)))
    return out


def _home(x):
    """The member homing most of view x's bytes (None when it has none)."""
    if x.size == 0:
        return None
    a, S = x._a, x._a.pool.slab_size
    from ..cache.layout import extent
    lo, hi = extent(x._off, x._shape, x._strides, x.itemsize)
    per = {}
    for k in range(lo // S, (hi - 1) // S + 1):
        b = min(hi, (k + 1) * S) - max(lo, k * S)
        per[a.members[k]] = per.get(a.members[k], 0) + b
    return max(sorted(per), key=per.get)


def _pieces(x, chunk_bytes):
    """(block index, view, home worker or None) for every chunk of x."""
    _, _, ranks = attached()
    worker = {r: w for w, r in ranks.items()}
    out = []
    for i, (r0, r1) in enumerate(row_bounds(x, chunk_bytes)):
        v = x[r0:r1] if x.ndim else x
        idx = (i,) + (0,) * (x.ndim - 1) if x.ndim else ()
        out.append((idx, v, worker.get(_home(v))))
    return out


def homes(x, chunk_bytes=None):
    """Block index -> the Dask worker that homes it: of a pool array's chunks (as to_dask()
    cuts them with the same chunk_bytes), or of a Dask array made by to_dask()."""
    name = getattr(x, "name", None)
    if isinstance(name, str) and name in _made:
        return dict(_made[name])
    if not hasattr(x, "_a"):
        raise TypeError(f"homes() takes a pool array or a Dask array made by to_dask(), not "
                        f"{type(x).__name__}")
    return {idx: w for idx, _, w in _pieces(x, chunk_bytes)}


def _chunk(ref):
    """On the home worker: the chunk as a zero-copy view of this worker's slabs (a copy read
    one-sided where the chunk is not in one run of memory this process holds)."""
    pool = member.process_pool()
    x = ref.array(pool)
    v = views.slab_view(pool, x)
    if v is not None:
        return v
    with _copying:                        # the slab cache is one per process
        _forget(pool, x)
        return x.to_numpy(copy=True)


def _forget(pool, x):
    """Drop this process's cached copies of x's slabs (other members write between tasks)."""
    a = x._a
    pool.cache.discard_keys([(a.heap, m, s) for m, s in zip(a.members, a.slots)
                             if m != pool.me])


def _collection(client, name, chunks, dtype, futures):
    import dask.array as da
    meta = np.empty((0,) * len(chunks), dtype)
    dsk = {f.key: f for f in futures}
    if da.array_expr_enabled():
        from dask.array._array_expr._collection import from_graph
        return from_graph(dsk, meta, chunks, list(dsk), name)
    from dask.highlevelgraph import HighLevelGraph
    return da.Array(HighLevelGraph.from_collections(name, dsk, dependencies=()), name, chunks,
                    meta=meta)


def to_dask(x, chunk_bytes=None):
    """A dask.array.Array over pool array `x`: each chunk a future pinned to the worker that
    homes its slabs, which holds it as a view of its own memory (see the module docstring).
    chunk_bytes: bytes per chunk (a number or a size like '64MiB'; default 16 slabs)."""
    from dask.base import tokenize
    client, pool, ranks = attached()
    if x._a.pool is not pool:
        raise ValueError("x is not an array of the pool attached to the Dask client")
    if x._a.heap == "pv":
        raise ValueError("a private array lives in this process alone: Dask workers cannot "
                         "read it (create it with access='readwrite' or 'readonly')")
    pieces = _pieces(x, chunk_bytes)
    name = CHUNKS + tokenize(x, [p[0] for p in pieces], [p[1].shape for p in pieces])
    futures = []
    for idx, v, w in pieces:
        pin = {"workers": [w], "allow_other_workers": False} if w is not None else {}
        futures.append(client.submit(_chunk, views.Ref(v), key=(name,) + idx, pure=False,
                                     **pin))
    keep = _Keep(x, len(futures))
    for f in futures:
        weakref.finalize(f, keep.drop)
    chunks = (tuple(v.shape[0] for _, v, _ in pieces),) + tuple((n,) for n in x.shape[1:]) \
        if x.ndim else ()
    d = _collection(client, name, chunks, x.dtype, futures)
    for n in {name, d.name}:       # query planning names the collection apart
        _made[n] = {idx: w for idx, _, w in pieces}
        weakref.finalize(futures[0], _made.pop, n, None)
    return d


def _region(chunks, idx):
    """The slices of block `idx` of an array chunked as `chunks`."""
    out = []
    for c, i in zip(chunks, idx):
        lo = sum(c[:i])
        out.append(slice(lo, lo + c[i]))
    return tuple(out)


def _store(block, ref):
    """On the worker holding a computed chunk: write it into its region of a pool array
    (in place where the memory is this process's own or mapped, else one-sided puts)."""
    pool = member.process_pool()
    y = ref.array(pool)
    block = np.asarray(block)
    v = views.slab_view(pool, y, writable=True)
    if v is not None:
        np.copyto(v, block, casting="unsafe")
    else:
        with _copying:
            y[...] = block
    return None


def _computed_homes(shape, dtype, chunks, holder, S):
    """One member per slab of a new C-ordered array: the one holding the chunk the slab's
    middle element is in."""
    itemsize = np.dtype(dtype).itemsize
    nbytes = math.prod(shape) * itemsize
    n = -(-nbytes // S)
    ends = [np.cumsum(c).tolist() for c in chunks]
    out = []
    for k in range(n):
        e = min(nbytes - 1, k * S + S // 2) // itemsize
        idx = np.unravel_index(e, shape) if shape else ()
        blk = tuple(bisect.bisect_right(ends[a], int(i)) for a, i in enumerate(idx))
        out.append(holder.get(blk))
    known = [m for m in out if m is not None]
    fill = known[0] if known else None
    return [fill if m is None else m for m in out] if fill is not None else None


def _like_homes(like, nbytes, S):
    a = like._a
    n = -(-nbytes // S)
    m = len(a.members)
    return [a.members[min(m - 1, k * m // max(n, 1))] for k in range(n)]


def from_dask(d, placement=None, like=None):
    """A pool array with the values of dask array `d`, each chunk written into the pool by
    the worker that computed it. placement: where the new array's slabs live (a pooltensor
    placement); like: a pool array whose slabs the new one's line up with; neither: on the
    workers holding the chunks once `d` is computed (so every write is local)."""
    from distributed import futures_of, wait
    client, pool, ranks = attached()
    if placement is not None and like is not None:
        raise ValueError("give placement= or like=, not both")
    if like is not None and tuple(like.shape) != tuple(d.shape):
        raise ValueError(f"like has shape {tuple(like.shape)}, the dask array "
                         f"{tuple(d.shape)}")
    if any(math.isnan(c) for cs in d.chunks for c in cs):
        raise ValueError("the dask array has unknown chunk sizes (compute_chunk_sizes() "
                         "first)")
    dp = client.persist(d)
    futs = {f.key: f for f in futures_of(dp)}
    wait(list(futs.values()))
    keys = dict(zip((tuple(k[1:]) for k in futs), futs))
    who = client.who_has(list(futs.values()))
    holder = {}
    for idx, key in keys.items():
        ws = [w for w in who.get(key, ()) if w in ranks]
        holder[idx] = ranks[ws[0]] if ws else None
    shape, dtype, S = tuple(d.shape), d.dtype, pool.slab_size
    nbytes = math.prod(shape) * dtype.itemsize
    if like is not None:
        placement = _placement.Explicit(_like_homes(like, nbytes, S)) if nbytes else None
    elif placement is None and nbytes:
        hs = _computed_homes(shape, dtype, d.chunks, holder, S)
        placement = _placement.Explicit(hs) if hs is not None else None
    y = creation.empty(shape, dtype, placement=placement)
    worker = {r: w for w, r in ranks.items()}
    stores = []
    for idx, key in keys.items():
        region = _region(d.chunks, idx)
        part = y[region] if shape else y
        if part.size == 0:
            continue
        w = worker.get(holder[idx])       # else a member fetches the chunk and writes it
        pin = {"workers": [w]} if w is not None else {"workers": sorted(ranks)}
        stores.append(client.submit(_store, futs[key], views.Ref(part), pure=False, **pin))
    try:
        client.gather(stores)
    finally:
        work.written(pool, [y], frozenset(ranks.values()))
    return y


def map_blocks(fn, x, *args, dtype=None, chunk_bytes=None, **kwargs):
    """fn applied to every chunk of pool array `x` by a Dask task on the worker homing it (the
    chunk a zero-copy view of its slabs), like dask.array's map_blocks; the result, a pool
    array placed like `x`, written where it is computed. Pool arrays among args of x's shape
    are chunked like x; fn must keep a chunk's shape (dtype: of the result, default x's)."""
    d = to_dask(x, chunk_bytes)
    bound = []
    for a in args:
        if hasattr(a, "_a") and tuple(a.shape) == tuple(x.shape):
            bound.append(to_dask(a, chunk_bytes).rechunk(d.chunks))
        else:
            bound.append(a)
    out = d.map_blocks(fn, *bound, dtype=x.dtype if dtype is None else dtype, **kwargs)
    return from_dask(out, like=x)
