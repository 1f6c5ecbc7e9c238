"""Sorting, set and searching functions: sort, argsort, unique_all, unique_counts,
unique_inverse, unique_values, searchsorted, nonzero (the Array API's; numpy's semantics where
the standard is silent: NaNs sort last, every NaN is its own unique value).

Up to the materialize limit each runs numpy on a gathered copy. Above it (chunks.py), with no
gather of the whole array:

- sort / argsort along an axis of an array of two or more dimensions: the sorted axis moved
  last, the other axes cut into chunks, each chunk sorted by numpy and written back;
- sort / argsort of one long axis: a sample sort. Splitters from an evenly spaced sample;
  pass 1 counts each chunk's elements per bucket (exchanged: one allgather), which fixes
  where every bucket and every chunk's share of it go; pass 2 writes each chunk's elements
  (and their indices) into their buckets' places in a scratch pool array, in input order;
  pass 3 sorts each bucket (groups of buckets up to a chunk) and writes it into the result.
  Buckets keep input order, so a stable sort of each bucket is a stable sort of the whole.
  Every chunk and every group of buckets is worked on where its first element lives
  (chunks.run: SPMD ranks, a plain script's members);
- unique_*: the sample-sorted values, then one chunked pass that keeps each value differing
  from its predecessor and counts the runs; unique_all / unique_inverse sort the stable
  permutation along, take each run's first original index from it, number every sorted
  element by its run and send the numbers back to the elements' places (a partition by
  destination chunk, then one contiguous write per chunk);
- nonzero: one pass counting each chunk's nonzeros, one writing their indices;
- searchsorted: the needles in chunks, each searched in the sorted array (read in chunks too,
  through the chunk boundaries when the sorted array is itself too big).
"""
import collections
import operator

import numpy as np

from ..array.array import ndarray
from ..pool.runtime import current
from . import chunkjobs, chunks, coerce, executor

_norm = np.lib.array_utils.normalize_axis_index

UniqueAll = collections.namedtuple("UniqueAll", "values indices inverse_indices counts")
UniqueCounts = collections.namedtuple("UniqueCounts", "values counts")
UniqueInverse = collections.namedtuple("UniqueInverse", "values inverse_indices")


# -- sort and argsort --------------------------------------------------------------------------

def _np_argsort(a, axis, descending, stable):
    kind = "stable" if stable else None
    if not descending:
        return np.argsort(a, axis=axis, kind=kind)
    n = a.shape[axis]
    rev = np.flip(a, axis=axis)
    idx = np.argsort(rev, axis=axis, kind=kind)
    return np.flip(n - 1 - idx, axis=axis)


def sort(x, /, *, axis=-1, descending=False, stable=True):
    """x sorted along `axis` (ascending unless descending; stable when asked: equal elements
    keep their order)."""
    x = coerce.array(x)
    if x.ndim == 0:
        raise ValueError("sort needs an array of at least one dimension")
    axis = _norm(operator.index(axis), x.ndim)
    if not chunks.big(x):
        a = x.to_numpy()
        res = np.sort(a, axis=axis, kind="stable" if stable else None)
        return coerce.own(np.flip(res, axis=axis) if descending else res)
    res = _big_sort(x, axis, want_index=False)
    return _flip(res, axis) if descending else res


def argsort(x, /, *, axis=-1, descending=False, stable=True):
    """Indices that sort x along `axis` (int64; stable when asked, also when descending:
    equal elements keep their order)."""
    x = coerce.array(x)
    if x.ndim == 0:
        raise ValueError("argsort needs an array of at least one dimension")
    axis = _norm(operator.index(axis), x.ndim)
    if not chunks.big(x):
        return coerce.own(_np_argsort(x.to_numpy(), axis, descending, stable).astype(np.int64))
    if not descending:
        return _big_sort(x, axis, want_index=True)
    n = x.shape[axis]
    idx = _big_sort(_flip(x, axis), axis, want_index=True)
    return _flip((n - 1) - idx, axis)


def _flip(x, axis):
    from .api_manip import flip
    return flip(x, axis=axis)


def _big_sort(x, axis, want_index):
    """Sorted values (or the stable sorting indices) of a big pool array along `axis`."""
    dt = np.dtype(np.int64) if want_index else x.dtype
    out = executor.new_like(x.shape, dt, what="argsort" if want_index else "sort")
    if x.ndim == 1:
        _sample_sort(x, out, want_index)
        return out
    xv = x.swapaxes(axis, -1)
    ov = out.swapaxes(axis, -1)
    parts = chunks.ranges(xv.shape[0], chunks.rows(xv))
    chunks.run(chunkjobs.RowSort(want_index), parts, xv, [xv, ov], outs=[out])
    return out


def _splitters(x, nb):
    """nb - 1 values cutting x (1-D) into about equal buckets, from an evenly spaced sample."""
    n = x.shape[0]
    want = min(64 * nb, chunks.rows(x))
    step = max(1, n // max(1, want))
    sample = np.sort(chunks.read(x[::step])) if n else np.empty(0, x.dtype)
    if not sample.size or nb <= 1:
        return sample[:0]
    pos = (np.arange(1, nb) * sample.size) // nb
    return np.unique(sample[pos])


def _sample_sort(x, out, want_index, index_out=None):
    """out = sort(x) (or the stable argsort when want_index) of 1-D pool array x; with
    index_out, out gets the values and index_out the stable argsort."""
    n = x.shape[0]
    step = chunks.rows(x)
    nb = max(2, -(-n // step) * 2)
    tmp, tmpi, bstart = _partition(x, _splitters(x, nb), step)
    nb = bstart.size - 1
    groups, g0 = [], 0                    # consecutive buckets up to a chunk's size
    for k in range(nb):
        if bstart[k + 1] - bstart[g0] > step and k > g0:
            groups.append((int(bstart[g0]), int(bstart[k])))
            g0 = k
    groups.append((int(bstart[g0]), int(bstart[nb])))
    groups = [g for g in groups if g[1] > g[0]]
    arrays = [out, tmp, tmpi] + ([index_out] if index_out is not None else [])
    chunks.run(chunkjobs.BucketSort(want_index), groups, tmp, arrays, outs=arrays[:1] +
               arrays[3:])


def _partition(key, spl, step, payload=None):
    """(keys, carried, bucket starts): the elements of 1-D pool array `key` moved into the
    buckets the sorted splitters `spl` cut (bucket b: spl[b-1] <= v < spl[b]), bucket after
    bucket, each in input order, with their indices (or rows of `payload`) carried along.
    Pass 1 counts each chunk's elements per bucket (exchanged: one allgather), which fixes
    where every bucket and every chunk's share of it go; pass 2 writes them there."""
    n = key.shape[0]
    parts = chunks.ranges(n, step)
    nb = spl.size + 1
    counts = chunks.run(chunkjobs.BucketCount(spl), parts, key, [key])
    counts = np.array(counts, np.int64).reshape(-1, nb)
    bstart = np.concatenate([[0], np.cumsum(counts.sum(axis=0))])
    place = bstart[:nb] + (np.cumsum(counts, axis=0) - counts)   # chunk c's share of bucket b
    tmp = executor.new_like((n,), key.dtype, what="sample sort values")
    tmpi = executor.new_like((n,), np.int64 if payload is None else payload.dtype,
                             what="sample sort indices")
    job = chunkjobs.Partition(spl, [r0 for r0, _ in parts], place)
    arrays = [key, tmp, tmpi] + ([payload] if payload is not None else [])
    chunks.run(job, parts, key, arrays, outs=[tmp, tmpi])
    return tmp, tmpi, bstart


def _unpermute(p, values):
    """out with out[p[j]] = values[j], for a permutation p of range(n) (1-D pool arrays):
    the pairs partitioned by destination chunk (_partition, splitters at the chunk
    boundaries, so bucket b holds exactly chunk b's destinations), then each chunk written
    whole where it lives. No element-wise one-sided writes."""
    n = p.shape[0]
    step = chunks.rows(p)
    dest, vals, _ = _partition(p, np.arange(step, n, step, dtype=p.dtype), step, values)
    out = executor.new_like((n,), values.dtype, what="unique inverse")
    chunks.run(chunkjobs.Unpermute(), chunks.ranges(n, step), dest, [dest, vals, out],
               outs=[out])
    return out


# -- unique --------------------------------------------------------------------------------------

def _np_unique(x, **kw):
    a = x.to_numpy().reshape(-1)
    return np.unique(a, equal_nan=False, **kw)


def unique_values(x, /):
    """The distinct values of x, sorted (each NaN distinct)."""
    x = coerce.array(x)
    if not chunks.big(x):
        return coerce.own(_np_unique(x))
    return _big_unique(x)[0]


def unique_counts(x, /):
    """(values, counts): the distinct values of x, sorted, and how often each occurs."""
    x = coerce.array(x)
    if not chunks.big(x):
        v, c = _np_unique(x, return_counts=True)
        return UniqueCounts(coerce.own(v), coerce.own(c.astype(np.int64)))
    v, c = _big_unique(x)
    return UniqueCounts(v, c)


def unique_inverse(x, /):
    """(values, inverse_indices): the distinct values and, for each element of x (in x's
    shape), the index of its value among them."""
    x = coerce.array(x)
    if not chunks.big(x):
        v, _, inv, _ = _unique_np_all(x)
        return UniqueInverse(coerce.own(v), coerce.own(inv))
    v, _, inv, _ = _big_unique(x, full=True)
    return UniqueInverse(v, inv)


def unique_all(x, /):
    """(values, indices, inverse_indices, counts): the distinct values, the first index of
    each in the flattened x, each element's value index (x's shape), and the counts."""
    x = coerce.array(x)
    if not chunks.big(x):
        return UniqueAll(*(coerce.own(r) for r in _unique_np_all(x)))
    return UniqueAll(*_big_unique(x, full=True))


def _unique_np_all(x):
    a = x.to_numpy()
    flat = a.reshape(-1)
    v, i, inv, c = np.unique(flat, return_index=True, return_inverse=True, return_counts=True,
                             equal_nan=False)
    return v, i.astype(np.int64), inv.reshape(a.shape).astype(np.int64), c.astype(np.int64)


def _big_unique(x, full=False):
    """(values, counts) of a big pool array, or with full (values, first indices, inverse
    indices in x's shape, counts): sample-sorted (with the stable sorting permutation when
    full), then one chunked pass keeping each value that differs from its predecessor (NaN
    differs from everything) and, when full, the permutation's index at each kept place (the
    first occurrence: the sort is stable) and every sorted element's value number, which
    _unpermute sends back to the element's place in x."""
    flat = x.reshape(-1)
    n = flat.shape[0]
    s = executor.new_like(flat.shape, flat.dtype, what="unique sorted")
    perm = executor.new_like(flat.shape, np.int64, what="unique order") if full else None
    _sample_sort(flat, s, want_index=False, index_out=perm)
    parts = chunks.ranges(n, chunks.rows(s))
    sizes = chunks.run(chunkjobs.RunStarts(), parts, s, [s])
    total = int(sum(sizes))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    vals = executor.new_like((total,), flat.dtype, what="unique values")
    pos = executor.new_like((total + 1,), np.int64, what="unique starts")
    arrays = [s, vals, pos]
    if full:
        first = executor.new_like((total,), np.int64, what="unique indices")
        number = executor.new_like((n,), np.int64, what="unique numbers")
        arrays += [perm, first, number]
    job = chunkjobs.RunStarts([r0 for r0, _ in parts], offsets)
    chunks.run(job, parts, s, arrays, outs=[a for a in arrays[1:] if a is not perm])
    pos[total:total + 1] = np.array([n], np.int64)
    if current().spmd:
        current().sync()
    counts = pos[1:] - pos[:-1]
    if not full:
        return vals, counts
    inv = _unpermute(perm, number).reshape(x.shape)
    return vals, first, inv, counts


# -- searching -----------------------------------------------------------------------------------

def searchsorted(x1, x2, /, *, side="left", sorter=None):
    """Where the elements of x2 would go in the sorted 1-D x1 to keep it sorted (int64, x2's
    shape); side 'left' or 'right'; sorter: the indices that sort x1."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', not {side!r}")
    x1 = coerce.array(x1)
    if x1.ndim != 1:
        raise ValueError("searchsorted needs a one-dimensional x1")
    if sorter is not None:
        x1 = coerce.array(_take(x1, sorter))
    x2 = coerce.array(x2)
    if not chunks.big(x1, x2):
        return coerce.own(np.searchsorted(x1.to_numpy(), x2.to_numpy(), side=side)
                          .astype(np.int64))
    out = executor.new_like(x2.shape, np.int64, like=x2, what="searchsorted")
    if chunks.big(x1):                 # x1 through the first element of each of its chunks
        step = chunks.rows(x1)
        job = chunkjobs.Search(side, bounds=chunks.read(x1[::step]), step=step)
    else:
        job = chunkjobs.Search(side, whole=x1.to_numpy())
    flat2 = x2.reshape(-1) if x2.ndim != 1 else x2
    fo = out.reshape(-1) if out.ndim != 1 else out
    parts = chunks.ranges(flat2.shape[0], chunks.rows(flat2))
    chunks.run(job, parts, flat2, [flat2, fo, x1], outs=[out])
    return out


def _take(x1, sorter):
    from .api_manip import take
    return take(x1, sorter)


def nonzero(x, /):
    """The indices of x's nonzero elements, one int64 array per axis (C order); a 0-d x is a
    ValueError, as the standard asks."""
    x = coerce.array(x)
    if x.ndim == 0:
        raise ValueError("nonzero of a 0-d array: use nonzero(atleast_1d(x))")
    if not chunks.big(x):
        return _nonzero_blocks(x)
    flat = x.reshape(-1)
    parts = chunks.ranges(flat.shape[0], chunks.rows(flat))
    sizes = chunks.run(chunkjobs.NonzeroRows(x.shape), parts, flat, [flat])
    total = int(sum(sizes))
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    out = executor.new_like((x.ndim, total), np.int64, what="nonzero")
    job = chunkjobs.NonzeroRows(x.shape, [r0 for r0, _ in parts], offsets)
    chunks.run(job, parts, flat, [flat, out], outs=[out])
    return tuple(out[i] for i in range(x.ndim))


def _nonzero_blocks(x):
    """nonzero of an array that fits, in slab-sized blocks of x (zero-copy where the slab is
    mapped here): one pass counts, the other writes each block's indices (unravelled into
    x's shape) straight into the results, held by this process. Why not numpy's nonzero on
    x.to_numpy(): the gathered copy, then the results' copy into the pool made it twice
    numpy's time. Each block's indices are written before the next block's are computed, so
    the temporary reuses the same (already faulted-in) memory."""
    total = sum(int(np.count_nonzero(b)) for b in x.blocks())
    outs = [coerce.empty_small((total,), np.int64) for _ in range(x.ndim)]
    at = 0
    for start, blk in x.blocks(with_index=True):
        f = np.flatnonzero(blk)
        if f.size:
            f += start
            coords = np.unravel_index(f, x.shape) if x.ndim > 1 else (f,)
            for o, c in zip(outs, coords):
                o[at:at + f.size] = c
            at += f.size
    return tuple(outs)
