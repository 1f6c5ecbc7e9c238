"""Slab views on Dask workers: what a task receives, and how it travels.

A chunk of a pool array, on the worker that homes it, is a numpy view of that worker's own
heap: no copy. It is a ``SlabView`` (an ``np.ndarray`` subclass) so that Dask can tell it from
any other array:

- **Serialization** (``dask_serialize``/``dask_deserialize``): a view of pool memory travels
  as a small handle (pool token, heap, member, byte offset, shape, strides, dtype), never as
  its bytes. The receiving process rebuilds it from its own memory, from the member's heap
  mapped in place (same machine), or with one one-sided get from the member (another
  machine). A SlabView that is no longer pool memory (a copy) travels as numpy's bytes.
- **Spilling** goes through the same serializer, so a spilled chunk is its handle on disk.
- ``sizeof`` stays the real size: the scheduler weighs where the bytes are, not the handle.
- Arithmetic on a SlabView gives plain numpy arrays (results are new memory, not the pool's).

Refs (``Ref``) name a pool array's view and its slabs by value; a task rebuilds the view on
the pool of the process it runs in.
"""
import numpy as np
from numpy.lib.array_utils import byte_bounds

from ..array.array import ndarray
from ..cache.layout import extent
from ..pool.allocation import Allocation
from . import state


class Ref:
    """A pool array's view and the slabs under it, by value (picklable, small): what a task
    is given to find an array in its own process's pool. Only the slabs the view spans
    travel."""

    __slots__ = ("token", "aid", "heap", "nbytes", "members", "slots", "off", "shape",
                 "strides", "dtype")

    def __init__(self, x):
        a = x._a
        S = a.pool.slab_size
        if x.size:
            lo, hi = extent(x._off, x._shape, x._strides, x.itemsize)
            k0, k1 = lo // S, (hi - 1) // S + 1
        else:
            k0 = k1 = 0
        self.token = a.pool.token
        self.aid, self.heap = a.id, a.heap
        self.nbytes = min(a.nbytes - k0 * S, (k1 - k0) * S)
        self.members, self.slots = list(a.members[k0:k1]), list(a.slots[k0:k1])
        self.off = x._off - k0 * S
        self.shape, self.strides, self.dtype = tuple(x._shape), tuple(x._strides), x._dtype.str

    def __getstate__(self):
        return tuple(getattr(self, k) for k in self.__slots__)

    def __setstate__(self, state):
        for k, v in zip(self.__slots__, state):
            setattr(self, k, v)

    def array(self, pool):
        """The view as a pool ndarray of `pool` (this process's; ValueError if it is another
        pool's)."""
        if self.token != pool.token:
            raise ValueError("this array belongs to another pool than this process's (was "
                             "the pool attached again since the graph was built?)")
        a = Allocation(pool, self.aid, self.nbytes, self.heap, self.members, self.slots)
        return ndarray(a, self.off, self.shape, self.strides, np.dtype(self.dtype))


class SlabView(np.ndarray):
    """A numpy view of pool memory on a Dask worker (see the module docstring): travels and
    spills as a handle; arithmetic on it gives plain numpy arrays."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kw):
        inputs = tuple(i.view(np.ndarray) if isinstance(i, SlabView) else i for i in inputs)
        out = kw.get("out")
        if out is not None:
            kw["out"] = tuple(o.view(np.ndarray) if isinstance(o, SlabView) else o for o in out)
        return getattr(ufunc, method)(*inputs, **kw)

    def __array_function__(self, func, types, args, kwargs):
        r = super().__array_function__(func, types, args, kwargs)
        if isinstance(r, SlabView) and locate(r) is None:
            return r.view(np.ndarray)        # a copy: plain numpy from here on
        return r

    def __reduce__(self):                    # plain pickle (outside Dask): its bytes
        return (np.asarray, (np.array(self.view(np.ndarray)),))


def slab_view(pool, x, writable=False):
    """A zero-copy SlabView of pool ndarray `x` when its bytes are in one run of consecutive
    slots of one member whose heap this process holds (its own, or mapped in place; for
    writing, mapped writable), else None."""
    a = x._a
    if x.size == 0 or a.heap == "pv":
        return None
    S = pool.slab_size
    lo, hi = extent(x._off, x._shape, x._strides, x.itemsize)
    k0, k1 = lo // S, (hi - 1) // S + 1
    m, s0 = a.members[k0], a.slots[k0]
    for k in range(k0 + 1, k1):
        if a.members[k] != m or a.slots[k] != s0 + (k - k0):
            return None
    maps = pool.mapped_w if writable else pool.mapped
    buf = pool.local[a.heap] if m == pool.me else maps.get((a.heap, m))
    if buf is None:
        return None
    if m != pool.me or writable:
        from ..cache.populate import populate
        populate(buf, s0 * S + lo - k0 * S, s0 * S + hi - k0 * S, write=writable)
    start = s0 * S + x._off - k0 * S
    v = np.ndarray(x._shape, x._dtype, buffer=buf, offset=start, strides=x._strides)
    return v.view(SlabView)


def _heaps(pool):
    """(heap, member, buffer) for every heap this process holds: its own and the mapped."""
    out = [(h, pool.me, pool.local[h]) for h in ("rw", "ro") if pool.local.get(h) is not None]
    out += [(h, m, buf) for (h, m), buf in pool.mapped.items()]
    return out


def locate(arr):
    """The handle of numpy `arr` if it is a view of pool memory this process holds (its own
    heap or one mapped in place): (token, heap, member, offset of its first element, shape,
    strides, dtype); else None."""
    pool = state.process_pool(required=False)
    if pool is None or arr.size == 0:
        return None
    lo, hi = byte_bounds(arr)
    for heap, m, buf in _heaps(pool):
        base = buf.ctypes.data
        if base <= lo and hi <= base + buf.nbytes:
            ptr = arr.__array_interface__["data"][0]
            return (pool.token, heap, m, ptr - base, arr.shape, arr.strides, arr.dtype.str)
    return None


def from_handle(h):
    """The array a handle names, in this process: a view of its own or mapped memory, else
    the bytes got one-sided from the member."""
    token, heap, m, start, shape, strides, dt = h
    pool = state.process_pool()
    if token != pool.token:
        raise ValueError("a slab view of another pool reached this process (was the pool "
                         "attached again since it was made?)")
    dtype = np.dtype(dt)
    lo, hi = _bounds(start, shape, strides, dtype.itemsize)
    buf = pool.local.get(heap) if m == pool.me else pool.mapped.get((heap, m))
    if buf is not None:
        if m != pool.me:
            from ..cache.populate import populate
            populate(buf, lo, hi)
        return np.ndarray(shape, dtype, buffer=buf, offset=start, strides=strides).view(SlabView)
    raw = np.empty(hi - lo, np.uint8)
    pool.read_win[heap].get(m, lo, raw)
    return np.ndarray(shape, dtype, buffer=raw, offset=start - lo, strides=strides)


def _bounds(start, shape, strides, itemsize):
    lo = hi = start
    for n, st in zip(shape, strides):
        if n == 0:
            return start, start
        if st > 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return lo, hi + itemsize


def register():
    """Register SlabView with Dask's serialization and sizeof (once per process)."""
    from dask.sizeof import sizeof
    from distributed.protocol import dask_deserialize, dask_serialize
    from distributed.protocol.numpy import deserialize_numpy_ndarray, serialize_numpy_ndarray

    @dask_serialize.register(SlabView)
    def _serialize(x):
        h = locate(x)
        if h is None:
            header, frames = serialize_numpy_ndarray(np.asarray(x.view(np.ndarray)))
            return {"pooltensor": "bytes", "numpy": header}, frames
        return {"pooltensor": "handle", "handle": h}, []

    @dask_deserialize.register(SlabView)
    def _deserialize(header, frames):
        if header["pooltensor"] == "bytes":
            return deserialize_numpy_ndarray(header["numpy"], frames)
        h = header["handle"]
        return from_handle((h[0], h[1], h[2], h[3], tuple(h[4]), tuple(h[5]), h[6]))

    @sizeof.register(SlabView)
    def _sizeof(x):
        return int(x.nbytes)
