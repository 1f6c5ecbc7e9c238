"""x.to_jax(): zero-copy shards, aliasing, pinning, copied cases counted; from_jax/asarray.

One process with four CPU devices (set before JAX starts its backend). Prints "pool jax ok".
"""
import gc
import weakref

import jax

jax.config.update("jax_num_cpu_devices", 4)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

import pooltensor as pt  # noqa: E402
import pooltensor.jax as pj  # noqa: E402

SLAB = 1 << 16
pool = pt.init(slab_size=SLAB, memory=16 << 20)


def slab_address(v):
    """Address of view v's first byte in this process's pool memory."""
    a = v._a
    k = v._off // SLAB
    return pool.local[a.heap].ctypes.data + a.slots[k] * SLAB + (v._off - k * SLAB)


def counts():
    s = pj.stats()
    return s["zero_copy"], s["copied"]


# whole array on the default device: one zero-copy shard at the slab's address
x = pt.arange(64 * 1024, dtype=np.float32).reshape(64, 1024)
pj.reset_stats()
j = x.to_jax()
assert isinstance(j, jax.Array) and j.shape == x.shape and j.dtype == x.dtype
assert j.unsafe_buffer_pointer() == slab_address(x), "not a view of the slabs"
assert counts() == (1, 0), counts()
assert np.array_equal(np.asarray(j), np.arange(64 * 1024, dtype=np.float32).reshape(64, 1024))

# aliasing: a later write to x shows through the jax.Array
x[3, 5] = -1.0
assert float(j[3, 5]) == -1.0

# sharded over four devices by rows: four zero-copy shards, each at its slab's address
mesh = Mesh(np.array(jax.devices()), ("x",))
pj.reset_stats()
js = x.to_jax(NamedSharding(mesh, P("x")))
assert counts() == (4, 0), counts()
for sh in js.addressable_shards:
    assert sh.data.unsafe_buffer_pointer() == slab_address(x[sh.index]), sh.index
assert np.array_equal(np.asarray(js), np.asarray(x.to_numpy()))

# copied, and counted: columns (strided), a start off the 64-byte grid, replicated copies
pj.reset_stats()
jc = x.to_jax(NamedSharding(mesh, P(None, "x")))
assert counts() == (0, 4), counts()
assert np.array_equal(np.asarray(jc), np.asarray(x.to_numpy()))
pj.reset_stats()
y = x.reshape(-1)[1:1001]
jy = y.to_jax()
assert counts() == (0, 1), counts()
assert np.array_equal(np.asarray(jy), y.to_numpy())
pj.reset_stats()
jr = x[:16].to_jax(NamedSharding(mesh, P()))          # replicated: one view per device
assert counts() == (4, 0), counts()

# pinning: the slabs stay allocated while a jax.Array over them lives
alloc = weakref.ref(x._a)
del x, y, js, jc, jy, jr, sh
gc.collect()
assert alloc() is not None, "the allocation went while a jax.Array over it lives"
assert not any(f[0] == alloc().id for f in pool._pending), "its slabs were queued for reuse"
z = pt.full(64 * 1024, 9.0, dtype=np.float32)
assert float(j[0, 1]) == 1.0 and float(j[3, 5]) == -1.0
del j
gc.collect()
assert alloc() is None, "the allocation outlived the jax.Array over it"

# the other way: from_jax and asarray copy a jax.Array into the pool
a = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4)
for b in (pt.from_jax(a), pt.asarray(a)):
    assert isinstance(b, pt.ndarray) and b.shape == (3, 4)
    assert np.array_equal(b.to_numpy(), np.asarray(a))
try:
    pt.from_jax(np.ones(3))
    raise AssertionError("from_jax took a numpy array")
except TypeError:
    pass
try:
    pj.to_jax(np.ones(3))
    raise AssertionError("to_jax took a numpy array")
except TypeError:
    pass
pt.finalize()
print("pool jax ok", flush=True)
