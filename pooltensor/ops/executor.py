"""Executors: blockwise work over pool arrays, done where the data lives.

Who computes what. A result (or any target) array is cut into *units*: runs of its slabs that
one member homes in consecutive slots (so a unit is one contiguous piece of that member's
memory), at most BLOCK_BYTES each. In SPMD (every rank runs the same program) each rank
computes the units it homes, writing straight into its own memory, and faults in the input
slabs it needs through the slab cache; the call ends with the pool's sync (flush + barrier +
revalidate), so every rank then sees every result, and an error numpy raised on one rank's
blocks is raised on every rank (no rank is left waiting for the others). The ranks also agree
on the call (pool/agree.py: the operation, the targets' and operands' views) before writing
anything that others could have seen: CollectiveMismatch on every rank otherwise.

A plain script sends each member that homes part of the target a plan (pool/work.py: the
kernel from kernels.py, the arrays by reference) and computes its own units meanwhile; a
member computes the units it homes as an SPMD rank would. The units of homes that do not
compute (a memory server whose inputs are not all its own) the script computes, streaming the
inputs through its cache with the prefetcher ahead, and writes each result at its home
(remote homes with one put per piece).

Python works per unit and per box, never per element (DESIGN rule 1): a unit is a flat
element range of the target in C order, cut into at most 2*ndim-1 rectangular boxes
(``boxes``); numpy computes each box in one call, on views of local memory or of pinned cache
frames when the operand's part lies in one place, on one copy otherwise.

Operands are pool arrays (broadcast to the target's shape: only the part a box needs is read,
then broadcast by numpy), numpy arrays (every rank passes the same values, as with
from_numpy) and scalars. A pool operand that shares memory with the target at other
positions (``x[1:] += x[:-1]``) is copied first, so blockwise order cannot change the result.
"""
import pickle

import numpy as np

import collectives

from ..array.array import ndarray
from ..array.creation import _check_dtype, _new, _shape
from ..cache import prefetch, transfer
from ..cache.layout import contiguous, extent
from ..cache.populate import populate
from ..pool import agree, work
from ..pool.placement import Explicit
from ..pool.runtime import current
from . import kernels

BLOCK_BYTES = 4 << 20     # largest unit of local slabs: numpy's passes stay in the CPU caches


def spmd(pool):
    """True when every rank runs the same program (under mpiexec or the launcher)."""
    return pool.role == "spmd"


def collective(*arrays):
    """True when work on these pool arrays is collective: SPMD and at least one of them lives
    in the shared heaps (private arrays are one rank's own: that rank does all their work)."""
    for x in arrays:
        if isinstance(x, ndarray) and x._a.heap != "pv" and x._a.pool.spmd:
            return True
    return False


# -- result arrays -------------------------------------------------------------------------------

def _byte_of(x, flat):
    """Byte offsets (allocation-relative) of the elements of x at C-order flat indices."""
    if not x._shape:
        return np.full(len(flat), x._off, np.int64)
    idx = np.unravel_index(flat, x._shape)
    b = np.full(len(flat), x._off, np.int64)
    for i, st in zip(idx, x._strides):
        b += i.astype(np.int64) * st
    return b


def new_like(shape, dtype, like=None, access=None, what="empty"):
    """A new (uninitialized) pool array for a result; collective in SPMD, as creation is
    (what: the operation it is made for, as the ranks compare it).

    like: a pool array of the same shape: the result's slabs are homed where `like` holds the
    same elements (the first element of each result slab decides), so the owners of a
    blockwise computation find their operand on their own member. access defaults to
    'private' when `like` is private, else 'readwrite'."""
    shape = _shape(shape)
    dtype = _check_dtype(dtype)
    if access is None:
        access = "private" if (like is not None and like._a.heap == "pv") else "readwrite"
    pool = current()
    placement = None
    n = 1
    for d in shape:
        n *= d
    if (like is not None and access != "private" and pool.size > 1 and n and
            tuple(like.shape) == shape):
        S = pool.slab_size
        E = S // dtype.itemsize
        nslabs = -(-n * dtype.itemsize // S)
        first = np.arange(nslabs, dtype=np.int64) * E
        ks = _byte_of(like, first) // S
        members = np.asarray(like._a.members, np.int64)
        placement = Explicit(members[ks].tolist())
    return _new(shape, dtype, placement, access, what)[0]


# -- units and boxes -------------------------------------------------------------------------------

def boxes(shape, e0, e1):
    """The C-order flat range [e0, e1) of an array of `shape` as rectangular boxes, in order:
    a list of (index, count), index a tuple of slices (one per axis, step 1) and count its
    elements. At most 2*ndim-1 boxes."""
    nd = len(shape)
    if e0 >= e1:
        return []
    if nd == 0:
        return [((), 1)]
    el = [1] * nd
    for d in range(nd - 2, -1, -1):
        el[d] = el[d + 1] * shape[d + 1]
    out = []
    full = [slice(0, n) for n in shape]

    def rec(a, b, d, prefix):
        s = el[d]
        if a % s == 0 and b % s == 0:
            out.append((prefix + (slice(a // s, b // s),) + tuple(full[d + 1:]), b - a))
            return
        i0, i1 = a // s, (b - 1) // s
        if i0 == i1:
            rec(a - i0 * s, b - i0 * s, d + 1, prefix + (slice(i0, i0 + 1),))
            return
        if a % s:
            rec(a - i0 * s, s, d + 1, prefix + (slice(i0, i0 + 1),))
            i0 += 1
        m1 = b // s
        if m1 > i0:
            out.append((prefix + (slice(i0, m1),) + tuple(full[d + 1:]), (m1 - i0) * s))
        if b % s:
            rec(0, b - m1 * s, d + 1, prefix + (slice(m1, m1 + 1),))

    rec(e0, e1, 0, ())
    return out


def _box_shape(box):
    return tuple(s.stop - s.start for s in box)


def units(x):
    """Work units of pool array x: a list of (e0, e1, owner), flat C-order element ranges.

    C-contiguous x: runs of slabs homed by one member in consecutive slots (one piece of its
    memory), at most BLOCK_BYTES; a slab of another member (plain script) is a unit of its own.
    Other views: chunks of about a slab of elements, owned by the home of their first element.
    """
    n = x.size
    if n == 0:
        return []
    a = x._a
    pool = a.pool
    S = pool.slab_size
    it = x.itemsize
    me = pool.me
    if not contiguous(x._shape, x._strides, it):
        step = max(1, S // it)
        starts = list(range(0, n, step))
        owners = (_byte_of(x, np.asarray(starts, np.int64)) // S).tolist()
        return [(e, min(n, e + step), a.members[k]) for e, k in zip(starts, owners)]
    lo, hi = x._off, x._off + n * it
    k0, k1 = lo // S, (hi - 1) // S
    members, slots = a.members, a.slots
    cap = max(S, BLOCK_BYTES)
    out = []
    k = k0
    while k <= k1:
        m = members[k]
        j = k
        if m == me:
            while (j < k1 and members[j + 1] == m and slots[j + 1] == slots[j] + 1 and
                   (j + 2 - k) * S <= cap):
                j += 1
        b0, b1 = max(lo, k * S), min(hi, (j + 1) * S)
        out.append(((b0 - lo) // it, (b1 - lo) // it, m))
        k = j + 1
    return out


def _mine(pool, owner, coll):
    """Does this process compute a unit homed by `owner`? coll: False (every unit), True (its
    own: SPMD, or a member), or the set of homes it computes for (a plain script whose
    members compute theirs)."""
    if coll is True:
        return owner == pool.me
    return not coll or owner in coll


# -- reading and writing pieces --------------------------------------------------------------------

def _local_base(pool, a, lo, hi, writable):
    """(buffer, byte offset of allocation byte 0 in it) when bytes [lo, hi) of allocation `a`
    are one piece of memory this process can address directly (homed here in consecutive
    slots, or mapped from a same-machine member: pool.mapped, pool.mapped_w for writing);
    else None."""
    S = pool.slab_size
    k0, k1 = lo // S, (hi - 1) // S
    members, slots = a.members, a.slots
    m = members[k0]
    for k in range(k0 + 1, k1 + 1):
        if members[k] != m or slots[k] != slots[k0] + (k - k0):
            return None
    if m == pool.me:
        return pool.local[a.heap], slots[k0] * S - k0 * S
    maps = pool.mapped_w if writable else pool.mapped
    base = maps.get((a.heap, m)) if maps else None
    if base is None:
        return None
    shift = slots[k0] * S - k0 * S
    populate(base, shift + lo, shift + hi, write=writable)     # one call, not a fault a page
    return base, shift


class _Scratch:
    """Temporary buffers of one executor call, kept for the next call (a few sets at most),
    so big blocks do not page-fault fresh memory every time."""

    _free = []

    def __init__(self):
        self.bufs = {}

    @classmethod
    def take(cls):
        return cls._free.pop() if cls._free else cls()

    def give(self):
        if len(self._free) < 4:
            self._free.append(self)

    def get(self, key, shape, dtype):
        n = 1
        for d in shape:
            n *= d
        nbytes = max(1, n * dtype.itemsize)
        b = self.bufs.get(key)
        if b is None or b.nbytes < nbytes:
            b = self.bufs[key] = np.empty(max(nbytes, 4096), np.uint8)
        return b[:n * dtype.itemsize].view(dtype).reshape(shape)


def read_part(x, off, shape, strides, scratch=None, key=None):
    """The elements of the pool view (off, shape, strides) of x's allocation as numpy: a
    read-only view of local (or mapped) memory, a pinned view of one cached slab, or a copy
    (into scratch[key] when given)."""
    a = x._a
    pool = a.pool
    dtype = x._dtype
    n = 1
    for d in shape:
        n *= d
    if n == 0:
        return np.empty(shape, dtype)
    lo, hi = extent(off, shape, strides, dtype.itemsize)
    got = _local_base(pool, a, lo, hi, False)
    if got is not None:
        buf, shift = got
        arr = np.ndarray(shape, dtype, buffer=buf, offset=shift + off, strides=strides)
        arr.flags.writeable = False
        return arr
    S = pool.slab_size
    k = lo // S
    if (hi - 1) // S == k:                     # one remote slab: a view of its cache frame
        e = transfer.slab_entry(pool, a, k)
        frame = pool.cache.ready(e)
        arr = np.ndarray(shape, dtype, buffer=frame, offset=off - k * S, strides=strides)
        return pool.cache.export(e, arr)
    out = scratch.get(key, shape, dtype) if scratch is not None else np.empty(shape, dtype)
    return transfer.read(pool, a, off, shape, strides, dtype, out)


def _sub(off, shape, strides, box):
    """The pool view (off, shape, strides) restricted to `box` (slices, step 1); axes of
    length 1 are broadcast axes and keep their single element."""
    sh = []
    for n, st, s in zip(shape, strides, box):
        if n == 1:
            sh.append(1)
        else:
            off += s.start * st
            sh.append(s.stop - s.start)
    return off, tuple(sh), strides


class _Op:
    """One operand aligned to the target's ndim: kind 'pool', 'numpy' or 'scalar'."""

    __slots__ = ("kind", "value", "x", "off", "shape", "strides")

    def __init__(self, value, ndim):
        self.value = value
        if isinstance(value, ndarray):
            self.kind = "pool"
            self.x = value
            pad = ndim - value.ndim
            self.off = value._off
            self.shape = (1,) * pad + value._shape
            self.strides = (0,) * pad + value._strides
        elif isinstance(value, np.ndarray) and value.ndim:
            self.kind = "numpy"
            self.value = value.reshape((1,) * (ndim - value.ndim) + value.shape)
        else:
            self.kind = "scalar"

    def part(self, box, scratch, key):
        if self.kind == "scalar":
            return self.value
        if self.kind == "numpy":
            v = self.value
            return v[tuple(slice(0, 1) if n == 1 else s for n, s in zip(v.shape, box))]
        off, sh, st = _sub(self.off, self.shape, self.strides, box)
        return read_part(self.x, off, sh, st, scratch, key)

    def slabs(self, box):
        """Slab range [k0, k1] the part for `box` touches (for prefetching)."""
        off, sh, st = _sub(self.off, self.shape, self.strides, box)
        lo, hi = extent(off, sh, st, self.x.itemsize)
        S = self.x._a.pool.slab_size
        return lo // S, (hi - 1) // S


def _overlaps(x, y):
    """x and y (pool arrays) share bytes of one allocation at different element positions."""
    if x._a is not y._a or x.size == 0 or y.size == 0:
        return False
    lo1, hi1 = extent(x._off, x._shape, x._strides, x.itemsize)
    lo2, hi2 = extent(y._off, y._shape, y._strides, y.itemsize)
    if hi1 <= lo2 or hi2 <= lo1:
        return False
    return not (x._off == y._off and x._shape == y._shape and x._strides == y._strides)


def copy(x, like=None):
    """A new pool array holding the values of pool array x (placed like `like`, default x)."""
    out = new_like(x.shape, x.dtype, like=x if like is None else like, what="copy")
    run(_assign, [out], [x], fresh=True, what="copy")
    return out


_assign = kernels.Assign()


# -- the executor ---------------------------------------------------------------------------------

def run(kernel, outs, operands, fill=False, fresh=False, what=None):
    """Compute kernel(parts, dsts) over every box of outs[0]'s units this process handles.

    outs: pool arrays of one shape (the targets); operands: pool arrays, numpy arrays or
    scalars that broadcast to that shape. kernel gets, per box, the operands' parts (numpy
    arrays of at most the box's shape, broadcastable to it, or the scalars) and one writable
    numpy array of the box's shape per target, and must fill the targets. fill=True: the
    targets' current values are read first (a kernel with where= keeps them). what: the
    operation as the ranks compare it (default the kernel's name).
    Collective in SPMD unless every target is private: it starts with the ranks' agreement
    on the call, which is also a barrier (unless fresh=True: targets nobody else has seen yet,
    so no rank can overwrite what another still reads, and a mismatch found at the end spoils
    nothing seen), and ends with the pool's sync, which checks the call again, so every rank
    sees every result."""
    x = outs[0]
    pool = x._a.pool
    pool.check_open()
    shape = x._shape
    for o in outs:
        if o._a.access == "readonly":
            raise ValueError("output array is read-only")
        if o._shape != shape:
            raise ValueError(f"outputs of different shapes: {o._shape} and {shape}")
    coll = collective(*outs)
    call = None
    if coll and pool.size > 1:
        call = agree.Call(what or getattr(kernel, "__qualname__", "kernel"), shape,
                          tuple(o._dtype for o in outs), access=" ".join(o.access for o in outs),
                          targets=outs, operands=operands)
        if not fresh:
            agree.check(pool.world, call)     # before any write, and before copies below
    ops, values = [], []
    for v in operands:
        if isinstance(v, ndarray):
            for o in outs:
                if _overlaps(o, v):
                    v = copy(v)
                    break
        values.append(v)
        ops.append(_Op(v, len(shape)))
    # a plain script's members compute the units they home (pool/work.py)
    if not coll and pool.chans and getattr(kernel, "PLAN_OK", False):
        doers = work.doers(pool, x, local_ok=work.aligned(x, list(outs[1:]) + values),
                           inputs=values if work.aligned(x, outs[1:]) else None)
        if getattr(kernel, "fn", None) is not None:       # user code: where it is allowed
            doers = tuple(m for m in doers if getattr(pool.chans[m], "allow_code", True))

        if work.share(pool, doers, ("run", kernel, list(outs), values, fill, fresh),
                      lambda handled: _compute(kernel, outs, ops, pool, handled, fill, fresh),
                      outs, _code(kernel)) is not None:
            return
    err = None
    try:
        _compute(kernel, outs, ops, pool, coll, fill, fresh)
    except Exception as e:           # noqa: BLE001  (re-raised below, on every rank)
        if call is None:
            raise
        err = e
    if call is not None:
        if pool.sync(call, failed=err is not None):
            _raise_agreed(pool, err)
    elif coll:
        pool.sync()


def _code(kernel):
    """The user code a kernel carries (map_blocks), pickled for the members (cloudpickle:
    functions of the script's __main__, lambdas and closures travel by value); None when
    the kernel is all vocabulary."""
    fn = getattr(kernel, "fn", None)
    if fn is None:
        return None
    import cloudpickle
    return cloudpickle.dumps(fn, protocol=5)


def _compute(kernel, outs, ops, pool, coll, fill, fresh):
    """This process's units of outs (see _mine), fresh targets' own pages faulted in first in
    one call per run of slots (a page at a time inside numpy's loop costs several times more
    on a virtual machine)."""
    scratch = _Scratch.take()
    try:
        if fresh:
            for o in outs:
                if o.size and o._a.heap != "pv":
                    lo, hi = extent(o._off, o._shape, o._strides, o.itemsize)
                    transfer.populate_range(pool, o._a, lo, hi, write=True, only=pool.me)
        _execute(kernel, outs, ops, pool, coll, fill, scratch)
    finally:
        scratch.give()


def run_here(pool, kernel, outs, values, fill, fresh):
    """A member's part of run(): the units of outs it homes (the plan the script sent)."""
    _compute(kernel, outs, [_Op(v, len(outs[0]._shape)) for v in values], pool, True, fill,
             fresh)


def _raise_agreed(pool, err):
    """SPMD: a kernel that failed on one rank (numpy's error on that rank's blocks) fails on
    every rank, with that rank's exception, instead of leaving the others waiting (the sync
    that ended the operation told every rank that one failed)."""
    try:
        mine = pickle.dumps(err) if err is not None else None
        pickle.loads(mine) if mine is not None else None
    except Exception:            # noqa: BLE001  (an exception that does not pickle)
        mine = pickle.dumps(RuntimeError(f"{type(err).__name__}: {err}"))
    errs = allgather(mine)
    if err is not None:
        raise err
    first = next(r for r, e in enumerate(errs) if e is not None)
    exc = pickle.loads(errs[first])
    raise exc from RuntimeError(f"raised on rank {first} while computing its blocks")


def _execute(kernel, outs, ops, pool, coll, fill, scratch):
    x = outs[0]
    shape = x._shape
    mine = [u for u in units(x) if _mine(pool, u[2], coll)]
    if not mine:
        return
    contig = [contiguous(o._shape, o._strides, o.itemsize) for o in outs]
    remote_ops = [op for op in ops if op.kind == "pool"]
    # slabs of each pool operand kept in flight per unit planned ahead
    depth = max(1, prefetch.limit(pool) // max(1, len(remote_ops))) if remote_ops else 0
    plans = [None] * len(mine)

    def plan(i):
        e0, e1, _ = mine[i]
        bx = boxes(shape, e0, e1)
        plans[i] = bx
        for op in remote_ops:
            a = op.x._a
            for box, _ in bx:
                k0, k1 = op.slabs(box)
                for k in range(k0, min(k1, k0 + depth - 1) + 1):
                    if a.members[k] != pool.me:
                        prefetch.issue(pool, a, k)

    planned = 0
    for i, (e0, e1, _) in enumerate(mine):
        while planned < min(len(mine), i + 1 + depth):
            plan(planned)
            planned += 1
        bx = plans[i]
        plans[i] = None
        flat = []                 # per target: (flat numpy, write back?) for contiguous ones
        for j, o in enumerate(outs):
            if contig[j]:
                flat.append(_flat_dst(o, e0, e1, fill, scratch, ("out", j)))
            else:
                flat.append(None)
        pos = 0
        for box, cnt in bx:
            bshape = _box_shape(box)
            parts = [op.part(box, scratch, ("in", n)) for n, op in enumerate(ops)]
            dsts, back = [], []
            for j, o in enumerate(outs):
                if flat[j] is not None:
                    dsts.append(flat[j][0][pos:pos + cnt].reshape(bshape))
                else:
                    d, wb = _box_dst(o, box, fill, scratch, ("box", j))
                    dsts.append(d)
                    back.append((o, box, d, wb))
            kernel(parts, dsts)
            del parts
            for o, box, d, wb in back:
                off, sh, st = _sub(o._off, o._shape, o._strides, box)
                if wb:
                    transfer.write(pool, o._a, off, sh, st, o._dtype, d)
                else:                  # versions (SPMD) and the write count
                    lo, hi = extent(off, sh, st, o.itemsize)
                    S = pool.slab_size
                    transfer.bump(pool, o._a, range(lo // S, (hi - 1) // S + 1))
            pos += cnt
        for j, o in enumerate(outs):
            if flat[j] is None:
                continue
            arr, wb = flat[j]
            lo = o._off + e0 * o.itemsize
            if wb:
                transfer.write(pool, o._a, lo, (e1 - e0,), (o.itemsize,), o._dtype, arr)
            else:                  # versions (SPMD) and the write count
                S = pool.slab_size
                hi = o._off + e1 * o.itemsize
                transfer.bump(pool, o._a, range(lo // S, (hi - 1) // S + 1))


def _flat_dst(o, e0, e1, fill, scratch, key):
    """Where a contiguous target's elements [e0, e1) are computed: (numpy 1-D, write back?)."""
    a = o._a
    pool = a.pool
    it = o.itemsize
    lo, hi = o._off + e0 * it, o._off + e1 * it
    got = _local_base(pool, a, lo, hi, True)
    if got is not None:
        buf, shift = got
        return np.ndarray((e1 - e0,), o._dtype, buffer=buf, offset=shift + lo), False
    arr = scratch.get(key, (e1 - e0,), o._dtype)
    if fill:
        transfer.read(pool, a, lo, (e1 - e0,), (it,), o._dtype, arr)
    return arr, True


def _box_dst(o, box, fill, scratch, key):
    """Where a strided target's box is computed: (numpy of the box's shape, write back?)."""
    a = o._a
    pool = a.pool
    off, sh, st = _sub(o._off, o._shape, o._strides, box)
    lo, hi = extent(off, sh, st, o.itemsize)
    got = _local_base(pool, a, lo, hi, True)
    if got is not None:
        buf, shift = got
        return np.ndarray(sh, o._dtype, buffer=buf, offset=shift + off, strides=st), False
    arr = scratch.get(key, sh, o._dtype)
    if fill:
        transfer.read(pool, a, off, sh, st, o._dtype, arr)
    return arr, True


# -- collectives over ranks ------------------------------------------------------------------------

def _world_of_pool():
    pool = current()
    return pool, (pool.spmd and pool.size > 1)


def allreduce(value, op="sum"):
    """Combine numpy values over the ranks (SPMD): every rank gets the same bytes, in an
    order that does not depend on the algorithm (collectives' deterministic mode). A plain
    script: the value itself. op: 'sum', 'prod', 'min', 'max'."""
    pool, many = _world_of_pool()
    if not many:
        return value
    arr = np.asarray(value)
    res = collectives.allreduce(np.ascontiguousarray(arr), op, world=pool.world,
                                deterministic=True)
    if not isinstance(value, np.ndarray):
        return res.reshape(arr.shape)[()]
    return res.reshape(arr.shape)


def allgather(obj):
    """[obj of rank 0, obj of rank 1, ...] on every rank (SPMD); [obj] in a plain script.

    numpy arrays of one shape and dtype on every rank travel as data (one allgather);
    anything else is pickled (two allgathers: sizes, then the padded bytes)."""
    pool, many = _world_of_pool()
    if not many:
        return [obj]
    w = pool.world
    if isinstance(obj, np.ndarray):
        sig = np.array([obj.ndim, obj.dtype.num, obj.dtype.itemsize] + list(obj.shape) +
                       [0] * (32 - obj.ndim), np.int64)
        sigs = collectives.allgather(sig, world=w)
        if (sigs == sig).all():
            res = collectives.allgather(np.ascontiguousarray(obj), world=w)
            return [res[r] for r in range(w.size)]
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = collectives.allgather(np.array([data.size], np.int64), world=w).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[:data.size] = data
    got = collectives.allgather(buf, world=w)
    return [pickle.loads(got[r, :int(sizes[r])].tobytes()) for r in range(w.size)]
