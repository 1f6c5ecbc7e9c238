"""Pool arrays and JAX: `x.to_jax(sharding=None)`, `from_jax(a)` (and `pooltensor.asarray(a)`).

to_jax builds a jax.Array whose shards are *views* of the pool's memory where they can be:
each shard this process holds (one per addressable device of the sharding; the whole array on
the default device when sharding is None) is x[index of the shard]; when that lies in one run of
consecutive slots of one member whose memory this process has (its own slabs, or a same-machine
member's mapped here), is C-contiguous and starts on a 64-byte boundary, the shard is
jax.device_put of a numpy view of that memory, which XLA's CPU client takes without a copy.
Any other shard (spanning slabs that are not adjacent, remote slabs, a strided view, a start
off the 64-byte grid, a non-CPU device) is copied; stats() counts both kinds.

Aliasing, on purpose: a zero-copy shard *is* the pool's memory. A later write to x (or to the
slabs under it, from any rank) shows through the "immutable" jax.Array, and JAX computations
read whatever the memory holds when they run. Copy first (jnp.array(a, copy=True)) to freeze
it. The slabs stay allocated while the jax.Array lives (each view holds the allocation), so
they are never reused under it, and their memory stays mapped until the last view goes, even
after pooltensor.finalize().

Under SPMD with a multi-process JAX (jax.distributed.initialize) and a sharding over every
process's devices, each rank contributes the shards of its own devices, so with a placement
that homes the rows of rank r's shard on rank r, every rank's shards are its own slabs.

from_jax copies the other way: pool memory belongs to the pool, so a jax.Array's buffer is
copied into new slabs (placement and access as for pooltensor.asarray).
"""
import numpy as np

from .array.array import ndarray
from .array.creation import asarray
from .cache import layout

_STATS = {"zero_copy": 0, "copied": 0}


def stats():
    """{'zero_copy': shards handed to JAX as views of pool memory, 'copied': shards copied}."""
    return dict(_STATS)


def reset_stats():
    """Set the counters of stats() to zero."""
    for k in _STATS:
        _STATS[k] = 0


class _Pinned:
    """Owner of a numpy view of pool memory handed to JAX: holds the allocation (its slabs are
    not freed, so not reused, while JAX holds the view) and the view."""

    __slots__ = ("__array_interface__", "_keep", "__weakref__")

    def __init__(self, view, alloc):
        self.__array_interface__ = view.__array_interface__
        self._keep = (view, alloc)


def _memory_of(v):
    """(buffer, byte offset) of view v's bytes when they lie in one run of consecutive slots
    of one member whose memory this process has (its own, or mapped here); else None."""
    a = v._a
    pool = a.pool
    if pool.closed or v.size == 0 or not layout.contiguous(v._shape, v._strides, v.itemsize):
        return None
    S = pool.slab_size
    lo, hi = v._off, v._off + v.nbytes
    k0, k1 = lo // S, (hi - 1) // S
    m = a.members[k0]
    if m == pool.me:
        buf = pool.local.get(a.heap)
    else:
        buf = pool.mapped.get((a.heap, m)) if pool.mapped else None
    if buf is None:
        return None
    s0 = a.slots[k0]
    for k in range(k0 + 1, k1 + 1):
        if a.members[k] != m or a.slots[k] != s0 + k - k0:
            return None
    if m != pool.me:
        from .cache import transfer
        transfer.populate_range(pool, a, lo, hi)
    return buf, s0 * S + (lo - k0 * S)


def _shard(v):
    """A numpy array for view v: a pinned view of pool memory when JAX can take it without a
    copy (see the module docstring), else a copy. Returns (array, zero_copy)."""
    where = _memory_of(v)
    if where is not None:
        buf, off = where
        view = np.ndarray(v._shape, v._dtype, buffer=buf, offset=off, strides=v._strides)
        if view.ctypes.data % 64 == 0:
            if v._a.access == "readonly":
                view.flags.writeable = False
            owner = _Pinned(view, v._a)
            pool = v._a.pool
            if v._a.heap == "rw" and v._a.members[v._off // pool.slab_size] == pool.me:
                S = pool.slab_size
                for k in range(v._off // S, (v._off + v.nbytes - 1) // S + 1):
                    pool.note_export(v._a.slots[k], owner)
            return np.asarray(owner), True
    return _aligned_copy(v), False


def _aligned_copy(v):
    data = v.to_numpy(copy=True)
    n = data.nbytes
    raw = np.empty(n + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    out = raw[off:off + n].view(data.dtype).reshape(data.shape)
    out[...] = data
    return out


def to_jax(x, sharding=None):
    """x as a jax.Array whose shards are zero-copy views of x's slabs where possible (module
    docstring: which shards, the aliasing, the pinning). sharding: a jax.sharding.Sharding, or
    None for the whole array on JAX's default device."""
    import jax
    if not isinstance(x, ndarray):
        raise TypeError(f"to_jax expects a pooltensor ndarray, not {type(x).__name__}")
    x._check()
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    elif not isinstance(sharding, jax.sharding.Sharding):
        raise TypeError(f"sharding must be a jax.sharding.Sharding or None, not "
                        f"{type(sharding).__name__}")
    shape = x.shape
    arrays = []
    for dev, index in sharding.addressable_devices_indices_map(shape).items():
        part = x[index] if index is not None and _narrows(index, shape) else x
        host, zero = _shard(part)
        if dev.platform != "cpu":
            zero = False                # another memory: device_put copies
        _STATS["zero_copy" if zero else "copied"] += 1
        arrays.append(jax.device_put(host, dev))
    return jax.make_array_from_single_device_arrays(shape, sharding, arrays)


def _narrows(index, shape):
    return any(not (isinstance(s, slice) and s.indices(n) == (0, n, 1))
               for s, n in zip(index, shape))


def from_jax(a, *, placement=None, access=None):
    """A new pool array holding a copy of jax.Array a (fetched from its devices)."""
    import jax
    if not isinstance(a, jax.Array):
        raise TypeError(f"from_jax expects a jax.Array, not {type(a).__name__}")
    return asarray(np.asarray(a), placement=placement, access=access)
