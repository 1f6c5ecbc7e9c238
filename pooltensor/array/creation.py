"""Creating pool arrays: zeros, ones, empty, full, arange, linspace, asarray, from_numpy.

Every function allocates the slabs (pool.allocate: placement policy, access mode) and then
fills them slab by slab: the values of slab k are computed from the flat element range it
holds, with numpy, so no Python runs per element and each slab is written once.

Who writes what: in a plain script, the members write the slabs they home (the values are
small classes, not closures, so a plan can carry them: pool/work.py) while the script writes
its own and those of members that do not compute (memory servers: Window.put; readonly slabs
through the init window only the script has). In
SPMD, creation is collective: every rank allocates the same slabs, writes the ones it homes
straight into its own memory, and a barrier ends the call so every rank sees the contents.
Before allocating, the ranks agree on the call (pool.allocate: the function and its scalar
arguments, shape, dtype, placement, access; CollectiveMismatch on every rank otherwise).
The values of from_numpy/asarray are not compared (every rank passes the same data).
Slabs that were never used before are still zero (memfd pages), so zeros() skips them.

Every function takes replicas=k with access='readonly': each slab then lives on k members
(pool/replicas.py) and this process writes every copy (in SPMD: each rank the copies it
homes), so that reads survive the loss of a member.
"""
import operator

import numpy as np

from ..cache import layout, progress, transfer
from .array import _check_dtype, ndarray
from ..pool import work
from ..pool.runtime import current


def _shape(shape):
    if isinstance(shape, (int, np.integer)) or hasattr(type(shape), "__index__"):
        shape = (operator.index(shape),)
    shape = tuple(operator.index(n) for n in shape)
    for n in shape:
        if n < 0:
            raise ValueError("negative dimensions are not allowed")
    return shape


def _new(shape, dtype, placement=None, access="readwrite", what="empty", replicas=None):
    """An uninitialized array and, per slab, whether it is fresh (still all zeros).

    what: the creating call as the ranks compare it in SPMD (the function, with any scalar
    argument that decides the values). replicas: copies of every slab, each on a member of
    its own (access='readonly' only; see pool/replicas.py)."""
    shape, dtype = _shape(shape), _check_dtype(dtype)
    n = 1
    for d in shape:
        n *= d
    alloc, fresh = current().allocate(n * dtype.itemsize, access, placement,
                                      what=(what, shape, dtype), replicas=replicas)
    return ndarray(alloc, 0, shape, layout.c_strides(shape, dtype.itemsize), dtype), fresh


def _value(v):
    """A scalar argument as text for the ranks' comparison (numpy and Python alike)."""
    try:
        return repr(np.asarray(v).tolist())
    except (TypeError, ValueError):
        return repr(v)


def _mine(pool, alloc, k):
    """Does this process write slab k at creation? (SPMD: only the slabs it homes, or a
    copy of.)"""
    if not pool.spmd:
        return True
    if alloc.copies is not None:
        return any(m == pool.me for m, _ in alloc.copies[k])
    return alloc.members[k] == pool.me


def _fill(x, fresh, values, skip_fresh=False):
    """Write values(e0, e1) -> 1-D numpy (elements e0..e1-1 in C order) into each slab; a
    plain script's members write the slabs they home (when values can travel in a plan)."""
    a = x._a
    pool = a.pool
    doers = work.doers(pool, x, local_ok=True) if getattr(values, "PLAN_OK", False) and \
        a.copies is None else ()        # (every copy of a replicated slab is written here)
    if work.share(pool, doers, ("fill", x, values, skip_fresh, fresh),
                  lambda handled: fill_here(x, fresh, values, skip_fresh,
                                            skip=frozenset(doers))) is None:
        fill_here(x, fresh, values, skip_fresh)
    _done(pool, a)
    return x


def fill_here(x, fresh, values, skip_fresh=False, skip=None):
    """The slabs of x this process writes (see _mine; a member: the ones it homes), but none
    homed by a member in `skip` (those fill their own)."""
    a = x._a
    pool = a.pool
    S = pool.slab_size
    it = x.itemsize
    E = S // it
    total = x.size
    only_own = pool.role in ("member", "server")
    if a.heap != "pv" and any(fresh):      # this process's fresh slabs, one call per run
        transfer.populate_range(pool, a, 0, a.nbytes, write=True, only=pool.me)
    with progress.for_bytes(0 if only_own else x.nbytes, "fill") as pb:
        for k in range(len(a.members)):
            m = a.members[k]
            if (not _mine(pool, a, k) or (skip_fresh and fresh[k]) or (skip and m in skip) or
                    (only_own and m != pool.me)):
                continue
            e0, e1 = k * E, min(total, (k + 1) * E)
            data = np.ascontiguousarray(values(e0, e1), x.dtype)
            transfer.put_bytes(pool, a, k, 0, data.view(np.uint8))
            pb.update(data.nbytes)
    return x


class Repeat:
    """values(e0, e1) of an array whose every element is `value`."""

    PLAN_OK = True

    def __init__(self, value, dtype, n):
        self.value, self.dtype, self.n = value, np.dtype(dtype), int(n)

    def __getstate__(self):
        return {"value": self.value, "dtype": self.dtype, "n": self.n}

    def __setstate__(self, st):
        self.__dict__.update(st)

    def __call__(self, e0, e1):
        v = self.__dict__.get("_v")
        if v is None:
            v = self._v = np.full(self.n, self.value, self.dtype)
        return v[:e1 - e0]


class Arange:
    """values(e0, e1) of arange: b0 + i*delta in the dtype (numpy's second value exactly)."""

    PLAN_OK = True

    def __init__(self, b0, delta, second, dtype):
        self.b0, self.delta, self.second, self.dtype = b0, delta, second, np.dtype(dtype)

    def __call__(self, e0, e1):
        dtype = self.dtype
        if dtype.kind in "iub":
            return (np.arange(e0, e1, dtype=np.int64) * self.delta + self.b0).astype(dtype)
        y = np.arange(e0, e1, dtype=np.int64).astype(dtype) * self.delta + self.b0
        if e0 <= 1 < e1:
            y[1 - e0] = self.second     # numpy's second value is start + step, then cast
        return y


class Linspace:
    """values(e0, e1) of linspace, computed as numpy.linspace does."""

    PLAN_OK = True

    def __init__(self, s0, delta, step, div, num, endpoint, stop, dt, dtype):
        self.s0, self.delta, self.step, self.div, self.num = s0, delta, step, div, num
        self.endpoint, self.stop, self.dt, self.dtype = endpoint, stop, dt, dtype

    def __call__(self, e0, e1):
        step, div = self.step, self.div
        any_step_zero = step == 0 if np.isscalar(step) or np.ndim(step) == 0 else False
        y = np.arange(e0, e1, dtype=np.int64).astype(self.dt)
        if div > 0:
            y = y / div * self.delta if any_step_zero else y * step
        else:
            y = y * self.delta
        y = y + self.s0
        if self.endpoint and self.num > 1 and e1 == self.num:
            y[-1] = self.stop
        if self.dtype.kind in "iu":
            y = np.floor(y)
        return y.astype(self.dtype, copy=False)


def _done(pool, alloc):
    """SPMD: creation ends together, so every rank sees every slab's contents."""
    if pool.spmd and pool.size > 1 and alloc.heap != "pv":
        pool.world.barrier()


def empty(shape, dtype=float, *, placement=None, access="readwrite", replicas=None):
    """A new array without initializing its elements (collective in SPMD)."""
    return _new(shape, dtype, placement, access, replicas=replicas)[0]


def zeros(shape, dtype=float, *, placement=None, access="readwrite", replicas=None):
    """A new array of zeros (slabs never used before are already zero and not written)."""
    x, fresh = _new(shape, dtype, placement, access, "zeros", replicas)
    return _fill(x, fresh, Repeat(0, x.dtype, x._a.pool.slab_size // x.itemsize),
                 skip_fresh=True)


def ones(shape, dtype=float, *, placement=None, access="readwrite", replicas=None):
    """A new array of ones."""
    return full(shape, 1, dtype, placement=placement, access=access, replicas=replicas)


def full(shape, fill_value, dtype=None, *, placement=None, access="readwrite",
         replicas=None):
    """A new array with every element `fill_value` (dtype inferred as numpy's full does)."""
    if dtype is None:
        dtype = np.array(fill_value).dtype
    x, fresh = _new(shape, dtype, placement, access, f"full {_value(fill_value)}",
                    replicas)
    v = np.full(1, fill_value, x.dtype)[0]       # numpy's conversion (and its errors) here
    return _fill(x, fresh, Repeat(v, x.dtype, x._a.pool.slab_size // x.itemsize))


def arange(start, stop=None, step=1, dtype=None, *, placement=None, access="readwrite",
           replicas=None):
    """Evenly spaced values in [start, stop), the same values numpy.arange gives."""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ZeroDivisionError("division by zero")   # numpy's own message for step 0
    if dtype is None:                # numpy: intp promoted with the types of start, stop, step
        dtype = np.dtype(np.intp)
        for v in (start, stop, step):
            dtype = np.promote_types(dtype, np.asarray(v).dtype)
    # numpy fills b0 + i*delta in the dtype, from its first two values: take them from numpy
    probe = np.arange(start, start + 2 * step, step, dtype=dtype)
    dtype = probe.dtype
    n = int(max(0, np.ceil((stop - start) / step)))
    b0 = probe[0]
    delta = probe[1] - probe[0] if len(probe) > 1 else probe[0] * 0
    x, fresh = _new((n,), dtype, placement, access,
                    f"arange {_value(start)} {_value(stop)} {_value(step)}", replicas)
    if dtype.kind in "iub":
        b0, delta = int(b0), int(delta)
    second = probe[1] if len(probe) > 1 else None
    return _fill(x, fresh, Arange(b0, delta, second, dtype))


def linspace(start, stop, num=50, endpoint=True, dtype=None, *, placement=None,
             access="readwrite", replicas=None):
    """num evenly spaced values from start to stop, the same values numpy.linspace gives."""
    num = operator.index(num)
    if num < 0:
        raise ValueError(f"Number of samples, {num}, must be non-negative.")
    div = (num - 1) if endpoint else num
    dt = np.result_type(start, stop, float(num))
    dtype = dt if dtype is None else np.dtype(dtype)
    x, fresh = _new((num,), dtype, placement, access,
                    f"linspace {_value(start)} {_value(stop)} {endpoint}", replicas)
    s0, delta = np.asarray(start, dt), np.asarray(stop, dt) - np.asarray(start, dt)
    step = delta / div if div > 0 else np.nan
    return _fill(x, fresh, Linspace(s0, delta, step, div, num, endpoint, stop, dt, dtype))


def from_numpy(arr, *, placement=None, access="readwrite", replicas=None):
    """A pool copy of numpy array `arr` (in SPMD, every rank passes the same data and
    writes the slabs it homes)."""
    arr = np.asarray(arr)
    x, fresh = _new(arr.shape, arr.dtype, placement, access, "from_numpy", replicas)
    flat = np.ascontiguousarray(arr).reshape(-1)
    return _fill(x, fresh, lambda e0, e1: flat[e0:e1])


def asarray(obj, dtype=None, *, placement=None, access=None, replicas=None):
    """`obj` as a pool array: a pool array as is (when dtype and access already match),
    anything numpy accepts copied in."""
    if isinstance(obj, ndarray):
        if (dtype is None or np.dtype(dtype) == obj.dtype) and \
                (access is None or access == obj.access) and placement is None and \
                replicas is None:
            return obj
        obj = obj.to_numpy()
    arr = np.asarray(obj, dtype=dtype)
    return from_numpy(arr, placement=placement, access=access or "readwrite",
                      replicas=replicas)
