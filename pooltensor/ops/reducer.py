"""The engine behind reductions and contractions: jobs (a local kernel per tile plus a
combine) and how they run over a pool array.

A job says, for numpy blocks of the input: part(block) -> partial over the block's region of
the result (reduced axes kept with length 1), combine(p, q) -> partial, finish(p) -> the
region's result. Two ways to run one (see pooltensor.reductions for when each is used):

- _run_small, input-driven: each process folds the tiles it works on (pooltensor.tiles: in
  SPMD the tiles whose lowest byte it homes; otherwise all, streamed through the cache) into
  one partial per region, in tile order; in SPMD the ranks' partials are allgathered and
  combined in rank order, so every rank does the same float operations in the same order and
  holds the same bytes. A reduction over every axis of a contiguous array reads whole runs of
  local slabs (tiles.flat_blocks) instead of tiles.
- _run_big, output-driven: a new pool array, each slab homed with the input it is computed
  from; each process computes the result tiles it homes (SPMD) or all of them, each from the
  part of the input it needs, writes them where they live, then (SPMD) the pool syncs.
"""
import builtins

import numpy as np

from ..array.array import ndarray
from ..array.creation import _new
from ..cache import layout, transfer
from ..pool import agree, work
from . import tiles

_NoValue = np._NoValue


def _wide(dt):
    """Where partials are combined: float64 for float16/32, complex128 for complex64."""
    dt = np.dtype(dt)
    if dt.kind == "f" and dt.itemsize < 8:
        return np.dtype(np.float64)
    if dt.kind == "c" and dt.itemsize < 16:
        return np.dtype(np.complex128)
    return dt


def _isnan(v):
    return np.isnan(v) if v.dtype.kind in "fc" else np.zeros(v.shape, bool)


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# -- jobs: what one reduction computes per tile ------------------------------------------------

class Job:
    """A reduction of array x over `axes`, as partial / combine / finish on numpy blocks.
    Jobs hold only arrays, dtypes, ufuncs and numbers: a plan can carry one to the members.

    Partials are tuples of arrays shaped like their region of the result with the reduced
    axes kept (length 1); `dtypes` are their components' dtypes; `keep` is the result's
    shape with reduced axes kept; `dtype` the result's dtype."""

    PLAN_OK = True

    def __init__(self, x, axes, dtype, dtypes):
        self.x, self.axes = x, axes
        self.keep = tuple(1 if i in axes else n for i, n in enumerate(x.shape))
        self.dtype, self.dtypes = np.dtype(dtype), [np.dtype(d) for d in dtypes]

    def region(self, starts, stops):
        """(key, slices of the kept-dims result) a tile [starts, stops) contributes to."""
        key, sl = [], []
        for i, (a, b) in enumerate(zip(starts, stops)):
            if i in self.axes:
                sl.append(slice(0, 1))
            else:
                key.append((a, b))
                sl.append(slice(a, b))
        return tuple(key), tuple(sl)

    def out_tiles(self, nbytes):
        """Tiles of the kept-dims result, for the output-driven path."""
        return tiles.split(self.keep, self.dtype.itemsize, nbytes)

    def sub(self, starts, stops):
        """The part of x that result tile [starts, stops) is computed from."""
        st = tuple(0 if i in self.axes else a for i, a in enumerate(starts))
        sp = tuple(n if i in self.axes else b for i, (b, n) in enumerate(zip(stops, self.x.shape)))
        return st, sp

    @property
    def result_dtype(self):
        """dtype of what the whole reduction returns (after any second pass)."""
        return self.dtype

    def to_x(self, idx):
        """Index arrays of the kept-dims result -> x's (where its inputs start)."""
        return tuple(np.zeros_like(i) if k in self.axes else i for k, i in enumerate(idx))

    def stage2(self, result, origin):
        """The second pass of a two-pass reduction (var), given this pass's result over the
        region at `origin`; None for one-pass reductions."""
        return None


class UfuncJob(Job):
    """ufunc.reduce: add, multiply, minimum, maximum, logical and bitwise ones.

    dtype: the reduce's own result dtype; part_dtype: the dtype= of the per-tile reduce
    (None: numpy's default); comb_dtype: where partials are combined; scale: divide the
    result by it (mean); final: the dtype returned (default dtype)."""

    def __init__(self, x, axes, ufunc, dtype, part_dtype=None, comb_dtype=None, initial=_NoValue,
                 scale=None, final=None):
        comb = np.dtype(comb_dtype or dtype)
        super().__init__(x, axes, final or dtype, [comb])
        self.ufunc, self.part_dtype, self.initial, self.scale = ufunc, part_dtype, initial, scale
        self.red_dtype = np.dtype(dtype)

    def part(self, blk, starts, stops):
        if self.part_dtype is None:
            p = self.ufunc.reduce(blk, axis=self.axes, keepdims=True)
        else:
            p = self.ufunc.reduce(blk, axis=self.axes, dtype=self.part_dtype, keepdims=True)
        return (p.astype(self.dtypes[0], copy=False),)

    def combine(self, p, q):
        return (self.ufunc(p[0], q[0], dtype=self.dtypes[0]),)

    def finish(self, p, sl):
        r = p[0]
        if self.initial is not _NoValue:
            r = self.ufunc(r, self.initial, dtype=self.dtypes[0])
        r = np.array(r, dtype=self.red_dtype)              # an array (out= below), not 0-d
        if self.scale is not None:                       # mean: sum / count, numpy's way
            r = np.true_divide(r, self.scale, out=r, casting="unsafe")
        return r.astype(self.dtype, copy=False)


class AnyAllJob(UfuncJob):
    """any / all: numpy's any/all per tile (any dtype), combined with logical or / and."""

    def __init__(self, x, axes, ufunc):
        super().__init__(x, axes, ufunc, np.bool_)
        self.fn = np.any if ufunc is np.logical_or else np.all

    def part(self, blk, starts, stops):
        return (self.fn(blk, axis=self.axes, keepdims=True),)


class ArgJob(Job):
    """argmin / argmax over one axis (or every axis, flat C-order index)."""

    def __init__(self, x, axes, flat, op):
        super().__init__(x, axes, np.intp, [x.dtype, np.intp])
        self.flat, self.op = flat, op                   # flat: axis=None over x.ndim axes
        self.find = np.argmin if op == "min" else np.argmax
        self.better = np.less if op == "min" else np.greater

    def part(self, blk, starts, stops):
        ones = (1,) * blk.ndim
        if self.flat:
            i = int(self.find(blk))
            where = np.unravel_index(i, blk.shape)
            g = np.ravel_multi_index(tuple(int(w) + s for w, s in zip(where, starts)),
                                     self.x.shape) if blk.ndim else 0
            return (np.asarray(blk[where]).reshape(ones), np.full(ones, g, np.intp))
        a = self.axes[0]
        idx = self.find(blk, axis=a, keepdims=True)
        vals = np.take_along_axis(blk, idx, axis=a)
        return (vals, (idx + starts[a]).astype(np.intp, copy=False))

    def combine(self, p, q):
        av, ai = p
        bv, bi = q
        an, bn = _isnan(av), _isnan(bv)
        take = (self.better(bv, av) & ~an) | (bn & ~an) | (((bv == av) | (an & bn)) & (bi < ai))
        return np.where(take, bv, av), np.where(take, bi, ai)

    def finish(self, p, sl):
        return p[1]


class DevJob(UfuncJob):
    """Second pass of var/std: sum of |x - mean|**2 over the axes, / max(n - ddof, 0)."""

    def __init__(self, x, axes, mean, origin, sum_dtype, dtype, ddof, sqrt):
        self.mean, self.origin = mean, origin
        d = np.subtract(np.zeros(1, x.dtype), np.zeros(1, mean.dtype))
        d2 = _square(d)
        r = np.add.reduce(d2, dtype=sum_dtype).dtype
        part = np.float32 if r == np.float16 else r
        super().__init__(x, axes, np.add, r, part_dtype=part, comb_dtype=_wide(r), final=dtype)
        self.ddof, self.sqrt = ddof, sqrt
        self.count = _size([x.shape[i] for i in axes])

    def part(self, blk, starts, stops):
        sl = tuple(slice(0, 1) if i in self.axes else slice(a - o, b - o)
                   for i, (a, b, o) in enumerate(zip(starts, stops, self.origin)))
        d2 = _square(np.subtract(blk, self.mean[sl]))
        return (np.add.reduce(d2, axis=self.axes, dtype=self.part_dtype,
                              keepdims=True).astype(self.dtypes[0], copy=False),)

    def finish(self, p, sl):
        r = np.array(p[0], dtype=self.red_dtype)
        r = np.true_divide(r, builtins.max(self.count - self.ddof, 0), out=r, casting="unsafe")
        if self.sqrt:                # numpy's scalar path: dtype.type(sqrt(var)); its
            r = np.sqrt(r)           # array path raises for integers, as our probe did
        return r.astype(self.dtype, copy=False)


def _square(d):
    """|d|**2 as numpy's var computes it (real part of d * conj(d) for complex)."""
    if d.dtype.kind == "c":
        return (d.real * d.real + d.imag * d.imag).astype(d.real.dtype, copy=False)
    return np.square(d)


class MeanJob(UfuncJob):
    """First pass of var/std: the mean with the reduced axes kept, in the sum's dtype."""

    def __init__(self, x, axes, sum_dtype, final, ddof, sqrt):
        r = np.add.reduce(np.zeros(1, x.dtype), dtype=sum_dtype).dtype
        part = np.float32 if r == np.float16 else r
        super().__init__(x, axes, np.add, r, part_dtype=part, comb_dtype=_wide(r),
                         scale=_size([x.shape[i] for i in axes]))
        self.sum_dtype, self.final, self.ddof, self.sqrt = sum_dtype, final, ddof, sqrt

    @property
    def result_dtype(self):
        return np.dtype(self.final)

    def stage2(self, result, origin):
        return DevJob(self.x, self.axes, result, origin, self.sum_dtype, self.final, self.ddof,
                      self.sqrt)


# -- running a job -----------------------------------------------------------------------------

def _fold(job, acc, key, sl, p):
    """acc[key] combined with partial p (region slices sl), or p when key is new."""
    cur = acc.get(key)
    if cur is None:
        acc[key] = [sl, p]
    else:
        cur[1] = job.combine(cur[1], p)


def _accumulate(job, work, acc):
    """Fold (starts, stops, block) items into acc: {region key: [slices, partial]}."""
    for starts, stops, blk in work:
        key, sl = job.region(starts, stops)
        _fold(job, acc, key, sl, job.part(blk, starts, stops))
    return acc


def _tile_work(x, tl, scratch, prefetching):
    for (s, e), blk in tiles.blocks(x, tl, scratch, prefetching):
        yield s, e, blk


def _flat_work(x, coll):
    for e0, blk in tiles.flat_blocks(x, coll):
        yield (e0,), (e0 + blk.size,), blk


def _specs(job, keys_per_rank, slices):
    out = []
    for keys in keys_per_rank:
        sp = []
        for k in keys:
            shape = tuple(s.stop - s.start for s in slices[k])
            sp += [(shape, dt) for dt in job.dtypes]
        out.append(sp)
    return out


def _work(job, flat, coll, scratch, prefetching):
    x = job.x
    if flat:
        return _flat_work(x, coll)
    tl = tiles.split(x.shape, x.itemsize, tiles.target(x._a.pool))
    return _tile_work(x, tiles.mine(x, tl, coll), scratch, prefetching)


def partials_here(job, flat):
    """A member's part of a plain script's reduction: its partials over the slabs it homes,
    {region key: [slices, partial]} (the script combines them in member order)."""
    return _accumulate(job, _work(job, flat, True, tiles.Scratch(), False), {})


def _delegated(job, flat, pool):
    """A plain script whose members compute: fold this process's share, then the members'
    partials in member order (the same order every time: the same bytes every time)."""
    doers = work.doers(pool, job.x, local_ok=flat, inputs=[job.x], written=False)
    got = work.share(pool, doers, ("reduce", job, flat),
                     lambda handled: _accumulate(job, _work(job, flat, handled, tiles.Scratch(),
                                                            True), {}))
    if got is None:
        return _accumulate(job, _work(job, flat, False, tiles.Scratch(), True), {})
    acc, replies = got
    for m in sorted(replies):
        for k, (sl, p) in replies[m].items():
            _fold(job, acc, k, sl, p)
    return acc


def _run_small(job, flat, coll, call=None):
    """Input-driven: the result as a numpy array of shape job.keep (call: the reduction as
    the ranks compare it in SPMD; its row leads the partials they allgather)."""
    x = job.x
    pool = x._a.pool
    if not coll and pool.chans:
        acc = _delegated(job, flat, pool)
    else:
        acc = _accumulate(job, _work(job, flat, coll, tiles.Scratch(), not coll), {})
    if coll:
        n = pool.size
        keys, slices, seen = [[] for _ in range(n)], {}, [set() for _ in range(n)]
        if flat:
            S = pool.slab_size
            lo, hi = x._off, x._off + x.nbytes
            homes = set(x._a.members[lo // S:(hi - 1) // S + 1])
            for r in sorted(homes):
                keys[r].append(())
            slices[()] = (slice(0, 1),)
        else:
            tl = tiles.split(x.shape, x.itemsize, tiles.target(pool))
            for t in tl:
                k, sl = job.region(*t)
                r = tiles.owner(x, *t)
                slices[k] = sl
                if k not in seen[r]:
                    seen[r].add(k)
                    keys[r].append(k)
        mine = []
        for k in keys[pool.me]:
            mine += list(acc[k][1])
        got = tiles.exchange(pool.world, mine, _specs(job, keys, slices), call)
        acc = {}
        m = len(job.dtypes)
        for r in range(n):
            for i, k in enumerate(keys[r]):
                _fold(job, acc, k, slices[k], tuple(got[r][i * m:(i + 1) * m]))
    if isinstance(job, MeanJob):
        mean = np.empty(job.keep, job.dtype)
        for sl, p in acc.values():
            mean[sl] = job.finish(p, sl)
        return _run_small(job.stage2(mean, (0,) * len(job.keep)), flat, coll, call)
    out = np.empty(job.keep, job.dtype)
    for sl, p in acc.values():
        out[sl] = job.finish(p, sl)
    return out


def _result_array(job, shape, what):
    """A new pool array for a large result: private when the input is, else each slab homed
    with the input it is computed from (tiles.placement_like)."""
    x = job.x
    dt = job.result_dtype
    if x._a.heap == "pv":
        return _new(shape, dt, None, "private", what)[0]
    return _new(shape, dt, tiles.placement_like(x, job.keep, dt, job.to_x), "readwrite",
                what)[0]


def _run_big(job, final_shape, coll, call=None):
    """Output-driven: a new pool array of final_shape (C-contiguous; its bytes are also the
    kept-dims result). call: as for _run_small, checked in the sync that ends it (the
    result is new: nobody saw what a mismatched call wrote into it)."""
    x = job.x
    pool = x._a.pool
    out = _result_array(job, final_shape,
                        f"{call.name if call is not None else 'reduction'} result")
    keep = ndarray(out._a, out._off, job.keep, layout.c_strides(job.keep, out.itemsize),
                   out.dtype)
    scratch = tiles.Scratch()
    nb = tiles.target(pool)
    for t in tiles.mine(keep, job.out_tiles(nb), coll):
        arr = _region_result(job, t, scratch, nb)
        off, shape, strides = tiles.view_of(keep, *t)
        transfer.write(pool, keep._a, off, shape, strides, keep.dtype, arr)
    if coll:
        pool.sync(call)
    return out


def _region_result(job, t, scratch, nb):
    """The result over result tile t, computed from the part of x it depends on."""
    x = job.x
    st, sp = job.sub(*t)
    sub_shape = tuple(b - a for a, b in zip(st, sp))
    tl = [(tuple(a + o for a, o in zip(s, st)), tuple(b + o for b, o in zip(e, st)))
          for s, e in tiles.split(sub_shape, x.itemsize, nb)]
    acc = _accumulate(job, _tile_work(x, tl, scratch, True), {})
    shape = tuple(b - a for a, b in zip(*t))
    res = np.empty(shape, job.dtype)
    for sl, p in acc.values():
        res[tuple(slice(s.start - a, s.stop - a) for s, a in zip(sl, t[0]))] = job.finish(p, sl)
    nxt = job.stage2(res, t[0])
    if nxt is not None:
        return _region_result(nxt, t, scratch, nb)
    return res


def _flat_view(x, order_free):
    """x as a 1-D C-contiguous pool view over the same elements, or None.

    order_free: the order of the elements does not matter (not argmin/argmax), so any layout
    whose bytes are contiguous (a transpose, reversed axes) qualifies."""
    if x.ndim == 0:
        return None
    if layout.contiguous(x.shape, x.strides, x.itemsize):
        return ndarray(x._a, x._off, (x.size,), (x.itemsize,), x.dtype)
    if order_free:
        off, shape, strides, _, _ = layout.normalize(x._off, x.shape, x.strides)
        if layout.contiguous(shape, strides, x.itemsize):
            return ndarray(x._a, off, (x.size,), (x.itemsize,), x.dtype)
    return None


def _run(x, make_job, axes, final_shape, result_dtype, order_free=True, what="reduction"):
    """Run a reduction of pool array x; returns numpy (small) or a pool array (large).
    what: its name, for the ranks' comparison of the call in SPMD (pool/agree.py)."""
    pool = x._a.pool
    pool.check_open()
    coll = tiles.collective(x)
    call = agree.Call(f"{what} over axes {axes}", final_shape, np.dtype(result_dtype),
                      operands=(x,)) if coll else None
    nbytes = _size(final_shape) * np.dtype(result_dtype).itemsize
    if nbytes > pool.advanced_limit:
        return _run_big(make_job(x, axes, False), final_shape, coll, call)
    flat = None
    if len(axes) == x.ndim:
        flat = _flat_view(x, order_free)
    if flat is not None:
        res = _run_small(make_job(flat, (0,), True), True, coll, call)
    else:
        res = _run_small(make_job(x, axes, False), False, coll, call)
    return res.reshape(final_shape)
