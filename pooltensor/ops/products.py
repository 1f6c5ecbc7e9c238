"""Matrix products of pool arrays: matmul (``@``), dot.

Supported: a left operand of any number of dimensions with a right one of one or two
(``(..., N, K) @ (K, M)``, ``(..., N, K) @ (K,)``, ``(K,) @ (K, M)``, ``(K,) @ (K,)``), either
side a pool or numpy array. A right operand with more than two dimensions (stacks of
matrices broadcast against each other) runs numpy's on copies with a FallbackWarning (refused
above the pool's materialize_limit), as any numpy function without a pooltensor version.
Shapes, dtypes and errors are numpy's: numpy checks a zero-size stand-in of each operand
first.

Two ways, by which operand is big:

- rows: the left operand is a pool array of two or more dimensions, distributed by rows. The
  right one is small or replicated: it is read once per process as numpy (a readonly pool
  array is read once and kept until its array dies, since it cannot change). The result is a
  new pool array; under SPMD each rank computes the rows whose left rows it homes, with
  numpy's matmul on its local row blocks, and writes them into the result (allocated with
  the default placement, which for "block" lines up with the left's rows, up to a slab), then
  the pool syncs. A plain script's member processes compute the row tiles they home; memory
  servers compute the result's slabs they hold (rows_units: a server writes only its own
  memory), reading the left rows and a pool right operand they do not hold from their peers.
- contraction: the pool array is the one whose rows are summed over (the right matrix of
  ``numpy @ pool``, or a left vector): its row tiles are multiplied by the matching columns
  of the other operand and the partial products are summed like a reduction (see
  pooltensor.reducer: numpy result up to pool.advanced_limit bytes, a pool array above).
"""
import weakref

import numpy as np

from ..array.array import ndarray
from ..array.creation import _new, from_numpy, zeros
from ..errors import PoolOutOfMemory
from ..cache import transfer
from ..pool import agree, work
from . import reducer, tiles
from .dispatch import fallback, implements
from .reducer import Job, _wide
from .shape import assign
from .tiles import ndim_of as _ndim_of, shape_of as _shape_of

PLAN_NUMPY = 16 << 10      # a numpy right operand up to this travels in a server's plan
_REPLICAS = weakref.WeakKeyDictionary()     # readonly Allocation -> {(off, shape, strides): numpy}


def replicated(b):
    """Pool array b as a read-only numpy array in this process (kept when b is readonly)."""
    if not isinstance(b, ndarray):
        return np.asarray(b)
    key = (b._off, b.shape, b.strides)
    if b._a.access == "readonly":
        per = _REPLICAS.get(b._a)
        if per is not None and key in per:
            return per[key]
    arr = b.to_numpy(copy=True)
    arr.flags.writeable = False
    if b._a.access == "readonly":
        _REPLICAS.setdefault(b._a, {})[key] = arr
    return arr


def _stand(x, keep):
    """A zero-size (or zero-stride) stand-in of x keeping the axes listed in `keep`."""
    shape = tuple(n if i in keep else 0 for i, n in enumerate(x.shape))
    if 0 in shape:
        return np.zeros(shape, x.dtype)
    return np.broadcast_to(np.zeros((), x.dtype), shape)


def _check(a, b, fn, dtype):
    """numpy's result dtype and errors for fn(a, b), without touching the data."""
    na, nb = _ndim_of(a), _ndim_of(b)
    if na == 0 or nb == 0:
        return fn(np.zeros((), a.dtype) if na == 0 else _stand(a, ()),
                  np.zeros((), b.dtype) if nb == 0 else _stand(b, ())).dtype
    ka = {na - 1}
    kb = {0} if nb == 1 else {nb - 2}
    if na == 1 and nb == 1 and a.shape == b.shape:
        sa, sb = np.zeros(1, a.dtype), np.zeros(1, b.dtype)
    else:
        sa, sb = _stand(a, ka), _stand(b, kb)
    kw = {} if dtype is None else {"dtype": dtype}
    return np.asarray(fn(sa, sb, **kw)).dtype


def _asarray(v):
    return v if isinstance(v, ndarray) else np.asarray(v)


def matmul(a, b, out=None, *, dtype=None):
    """a @ b (numpy.matmul) for pool and numpy operands; see the module docstring."""
    a, b = _asarray(a), _asarray(b)
    if a.ndim == 0 or b.ndim == 0:
        np.matmul(np.zeros(a.shape, a.dtype), np.zeros(b.shape, b.dtype))    # numpy's error
    rdt = _check(a, b, np.matmul, dtype)
    if b.ndim > 2:
        return _fallback(np.matmul, a, b, out, {} if dtype is None else {"dtype": dtype})
    return _product(a, b, rdt, out)


def dot(a, b, out=None):
    """numpy.dot for pool and numpy operands: a product with a scalar is elementwise, else as
    matmul for a right operand of one or two dimensions."""
    a, b = _asarray(a), _asarray(b)
    if a.ndim == 0 or b.ndim == 0:
        res = np.multiply(a, b)
        return res if out is None else _store(out, res)
    rdt = _check(a, b, np.dot, None)
    if b.ndim > 2:
        return _fallback(np.dot, a, b, out, {})
    return _product(a, b, rdt, out)


def _fallback(fn, a, b, out, kw):
    """Stacks of matrices on the right: numpy's on copies (FallbackWarning, size-limited)."""
    if out is not None:
        kw = dict(kw, out=out)
    return fallback(fn, (a, b), kw)


def _store(out, res):
    if tuple(_shape_of(out)) != tuple(_shape_of(res)):
        raise ValueError(f"output array has shape {_shape_of(out)}, expected {_shape_of(res)}")
    if isinstance(out, ndarray):
        assign(out, res)
    else:
        np.copyto(out, res.to_numpy() if isinstance(res, ndarray) else res, casting="unsafe")
    return out


def _product(a, b, rdt, out):
    # the product as the ranks compare it in SPMD (pool/agree.py): both operands' views
    pool = (a if isinstance(a, ndarray) else b)._a.pool
    call = agree.Call("matmul", None, rdt, operands=(a, b)) if pool.coherent else None
    if isinstance(a, ndarray) and a.ndim >= 2:
        res = _rows(a, b, rdt, call)
    elif isinstance(b, ndarray) and b.ndim == 2:
        res = _contract(b, replicated(a), rdt, True, call)
    elif isinstance(a, ndarray):                       # a 1-D pool vector
        res = _contract(a, b, rdt, False, call)
    else:                                              # numpy a (any ndim) @ 1-D pool b
        res = _contract(b, a, rdt, True, call)
    if isinstance(res, np.ndarray) and res.ndim == 0 and out is None:
        return res[()]
    return res if out is None else _store(out, res)


# -- rows: the left operand distributed by rows ---------------------------------------------------

def _rows(a, b, rdt, call):
    """(..., N, K) pool @ b (K, M) or (K,), pool or numpy: a new pool array, rows computed
    where the left rows live (in SPMD the ranks compare `call` in the sync that ends it: the
    result is new, nobody saw what a mismatched call wrote)."""
    lead, K = a.shape[:-1], a.shape[-1]
    out_shape = lead + b.shape[1:]
    pool = a._a.pool
    pool.check_open()
    if K == 0 or a.size == 0:
        return zeros(out_shape, rdt, access="private" if a._a.heap == "pv" else "readwrite")
    if a._a.heap == "pv":
        out = _new(out_shape, rdt, None, "private", "matmul result")[0]
    else:                     # each result row homed with the left row it comes from
        n = len(lead)
        place = tiles.placement_like(a, out_shape, rdt,
                                     lambda idx: tuple(idx[:n]) + (np.zeros_like(idx[0]),))
        out = _new(out_shape, rdt, place, "readwrite", "matmul result")[0]
    coll = tiles.collective(a)
    if not coll and work.servers(pool):      # memory servers compute the slabs they hold
        if _rows_on_servers(a, b, out, rdt):
            return out
        rows_here(a, replicated(b), out, rdt, False)
        return out
    B = replicated(b)
    if not coll:                   # a plain script's members compute the rows they home
        if work.share(pool, work.doers(pool, a), ("rows", a, B, out, rdt),
                      lambda handled: rows_here(a, B, out, rdt, handled), [out]) is not None:
            return out
    rows_here(a, B, out, rdt, coll)
    if coll:
        pool.sync(call)
    return out


def _rows_on_servers(a, b, out, rdt):
    """a @ b on memory servers: each server computes the result slabs it holds (rows_units),
    reading the rows of `a` it needs, and `b` when it is a pool array (sent by reference up
    to the materialize limit, so it never travels through this process), from the servers
    that hold them. The units of homes that do not compute (a restarted server, inputs a
    server cannot read) this process computes. False when no server took the plan."""
    pool = a._a.pool
    by_ref = isinstance(b, ndarray) and b._a.heap != "pv" and \
        b.nbytes <= pool.materialize_limit
    B = b if by_ref else replicated(b)
    if not by_ref and B.nbytes > PLAN_NUMPY:      # put in the pool once, read by reference
        try:
            B = from_numpy(B)
        except PoolOutOfMemory:
            pass                    # in the plan if it fits a frame, else all done here
    # a server's work is its rows of `a`, not its result bytes: (N, K) @ (K, 1) writes K
    # times fewer bytes than it reads
    M = b.shape[-1] if b.ndim == 2 else 1
    weight = max(1.0, a.shape[-1] * a.itemsize / (max(M, 1) * out.itemsize))
    doers = work.doers(pool, out, inputs=[a, B], weight=weight)
    return work.share(pool, doers, ("rows", a, B, out, rdt, True),
                      lambda handled: rows_units(a, B, out, rdt, handled), [out]) is not None


def _whole(b):
    """Pool array b as numpy, read here (in a server: from its peers one-sided)."""
    out = np.empty(b.shape, b.dtype)
    return transfer.read(b._a.pool, b._a, b._off, b._shape, b._strides, b.dtype, out)


def rows_units(a, B, out, rdt, coll):
    """The result units of a @ B this process computes (executor.units of the new C-order
    `out`, by their home: coll as executor._mine takes it), each written where it lives. A
    unit is whole slabs of one member, so a memory server writes only memory it holds. A
    unit's pieces: the tail of a result row its first slab starts in (that row of `a` times
    the columns of B needed), whole rows in blocks of about a tile of `a` (the next block's
    slabs prefetched), the head of the row it ends in. B: numpy, or a pool array read whole
    first."""
    from .executor import _mine, boxes, units
    pool = a._a.pool
    mine = [u for u in units(out) if _mine(pool, u[2], coll)]
    if not mine:
        return
    if isinstance(B, ndarray):
        B = _whole(B)
    lo, hi = out._off, out._off + out.nbytes
    transfer.populate_range(pool, out._a, lo, hi, write=True, only=pool.me)
    lead, K = a.shape[:-1], a.shape[-1]
    M = B.shape[1] if B.ndim == 2 else 1
    it = out.itemsize
    step = max(1, tiles.target(pool) // (K * a.itemsize))
    pieces = []                       # (first row, end row, first column, end column)
    for e0, e1, _ in mine:
        r, c = divmod(e0, M)
        if c:                         # the rest of a row begun in the slab before
            pieces.append((r, r + 1, c, min(M, c + e1 - e0)))
            r += 1
        full = e1 // M
        pieces += [(q, min(full, q + step), 0, M) for q in range(r, full, step)]
        if e1 % M and full >= r:      # the start of a row that goes on in the next slab
            pieces.append((full, full + 1, 0, e1 % M))

    def boxes_of(r, rc):
        return [(tuple(s.start for s in box) + (0,), tuple(s.stop for s in box) + (K,), n)
                for box, n in boxes(lead, r, rc)]

    scratch = tiles.Scratch()
    res = np.empty(0, rdt)
    for i, (r, rc, c0, c1) in enumerate(pieces):
        if i + 1 < len(pieces):
            for s, e, _ in boxes_of(*pieces[i + 1][:2]):
                tiles.hint(a, s, e)
        w = c1 - c0
        Bc = B if w == M else B[:, c0:c1]
        if res.size < (rc - r) * w:
            res = np.empty((rc - r) * w, rdt)
        pos = 0
        for s, e, cnt in boxes_of(r, rc):
            blk = tiles.read(a, s, e, scratch).reshape(cnt, K)
            res[pos:pos + cnt * w] = np.matmul(blk, Bc).reshape(-1)    # cast as astype(rdt)
            pos += cnt * w
        transfer.write(pool, out._a, out._off + (r * M + c0) * it, (pos,), (it,), out.dtype,
                       res[:pos])


def rows_here(a, B, out, rdt, coll=True):
    """The row tiles of a @ B this process computes (see tiles.handles; a member: its own),
    each written where its result rows live."""
    pool = a._a.pool
    K = a.shape[-1]
    lead = a.shape[:-1]
    row_tiles = tiles.split(lead, K * a.itemsize, tiles.target(pool))
    todo = [((s + (0,), e + (K,)), (s + (0,) * (B.ndim - 1), e + B.shape[1:]))
            for s, e in row_tiles]
    if coll:
        todo = [w for w in todo if tiles.handles(pool, tiles.owner(a, *w[0]), coll)]
    scratch = tiles.Scratch()
    for i, (src, dst) in enumerate(todo):
        if coll is not True and i + 1 < len(todo):
            tiles.hint(a, *todo[i + 1][0])
        blk = tiles.read(a, src[0], src[1], scratch)
        res = np.matmul(blk, B)
        if res.dtype != rdt:
            res = res.astype(rdt)
        off, shape, strides = tiles.view_of(out, *dst)
        transfer.write(pool, out._a, off, shape, strides, out.dtype, res.reshape(shape))


# -- contraction: the pool array's rows are summed over -----------------------------------------

class ContractJob(Job):
    """Tiles of pool array x (K,) or (K, M) times the matching slices of numpy `other`:
    left=True: other[..., k0:k1] @ tile; left=False: tile @ other[k0:k1]."""

    def __init__(self, x, other, rdt, left):
        self.other, self.left = other, left
        if left:
            keep = other.shape[:-1] + x.shape[1:]
        else:
            keep = other.shape[1:]
        self.x, self.axes = x, (0,)
        self.keep = keep
        self.dtype = np.dtype(rdt)
        self.dtypes = [_wide(rdt) if np.dtype(rdt).kind in "fc" else np.dtype(rdt)]
        self.lead = len(keep) - (x.ndim - 1)

    def region(self, starts, stops):
        if self.x.ndim == 2 and self.left:
            j0, j1 = starts[1], stops[1]
            return (j0, j1), tuple(slice(0, n) for n in self.keep[:-1]) + (slice(j0, j1),)
        return (), tuple(slice(0, n) for n in self.keep)

    def part(self, blk, starts, stops):
        k0, k1 = starts[0], stops[0]
        if self.left:
            p = np.matmul(self.other[..., k0:k1], blk)
        elif isinstance(self.other, ndarray):
            p = np.matmul(blk, tiles.read(self.other, (k0,), (k1,), tiles.Scratch()))
        else:
            p = np.matmul(blk, self.other[k0:k1])
        return (np.asarray(p, self.dtypes[0]),)

    def combine(self, p, q):
        return (np.add(p[0], q[0], dtype=self.dtypes[0]),)

    def finish(self, p, sl):
        return p[0].astype(self.dtype)

    def out_tiles(self, nbytes):
        if self.x.ndim == 2 and self.left:
            M = self.keep[-1]
            per_col = self.dtype.itemsize * max(1, int(np.prod(self.keep[:-1], dtype=np.int64)))
            step = max(1, nbytes // per_col)
            return [((0,) * self.lead + (j,), self.keep[:-1] + (min(M, j + step),))
                    for j in range(0, M, step)]
        return [((0,) * len(self.keep), self.keep)]

    def to_x(self, idx):
        if self.x.ndim == 2 and self.left:
            return (np.zeros_like(idx[-1]), idx[-1])
        return tuple(np.zeros_like(idx[0]) if idx else np.zeros(1, np.int64)
                     for _ in range(self.x.ndim))

    def sub(self, starts, stops):
        if self.x.ndim == 2 and self.left:
            return (0, starts[-1]), (self.x.shape[0], stops[-1])
        return (0,) * self.x.ndim, self.x.shape


def _contract(x, other, rdt, left, call):
    """Sum over the rows of pool array x of (other's matching columns) @ (row tile), or of
    (row tile of vector x) @ (other's matching rows). call: as for the reductions."""
    pool = x._a.pool
    pool.check_open()
    job = ContractJob(x, other, rdt, left)
    final = job.keep
    coll = tiles.collective(x, *([other] if isinstance(other, ndarray) else []))
    nbytes = int(np.prod(final, dtype=np.int64)) * job.dtype.itemsize
    if x.size == 0:                      # an empty sum: zeros, by the same size rule
        if nbytes > pool.advanced_limit:
            return zeros(final, rdt, access="private" if x._a.heap == "pv" else "readwrite")
        return np.zeros(final, rdt)
    call = call if coll else None
    if nbytes > pool.advanced_limit:
        return reducer._run_big(job, final, coll, call)
    return reducer._run_small(job, False, coll, call)


def _register():

    @implements(np.matmul)
    def _matmul_ufunc(a, b, out=None, **kw):
        """np.matmul as a generalized ufunc (out= comes as a tuple; dtype= is honoured)."""
        dtype = kw.pop("dtype", None)
        if kw:
            raise TypeError(f"matmul: {', '.join(sorted(kw))} not supported for pooltensor "
                            f"arrays")
        if isinstance(out, tuple):
            out = out[0]
        return matmul(a, b, out=out, dtype=dtype)

    implements(np.dot)(dot)


_register()
