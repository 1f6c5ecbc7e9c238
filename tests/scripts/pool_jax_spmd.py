"""Under SPMD each rank contributes its slabs as its shards: with a multi-process JAX
(jax.distributed over the ranks, one CPU device each) and a sharding by rows over every
rank's device, rank r's shard of x.to_jax() is a zero-copy view of the rows rank r homes.

Prints "pool jax spmd ok" on every rank.
"""
import socket

import jax
import numpy as np

import collectives
import pooltensor as pt
import pooltensor.jax as pj

w = collectives.init()
port = None
if w.rank == 0:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
port = w.allgather_object(port)[0]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=w.size, process_id=w.rank,
                           initialization_timeout=60)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

SLAB = 1 << 16
pool = pt.init(slab_size=SLAB, memory=8 << 20)
rows = 32 * w.size                               # 32 rows of 4 KiB: two slabs per rank
x = pt.arange(rows * 1024, dtype=np.float32).reshape(rows, 1024)
mine = x[w.rank * 32:(w.rank + 1) * 32]
assert mine.where() == {w.rank: mine.nbytes}, mine.where()     # block placement

mesh = Mesh(np.array(jax.devices()), ("x",))
pj.reset_stats()
j = x.to_jax(NamedSharding(mesh, P("x")))
assert pj.stats() == {"zero_copy": 1, "copied": 0}, pj.stats()
(sh,) = j.addressable_shards
assert sh.index[0] == slice(w.rank * 32, (w.rank + 1) * 32), sh.index
a = x._a
k = mine._off // SLAB
addr = pool.local[a.heap].ctypes.data + a.slots[k] * SLAB + (mine._off - k * SLAB)
assert sh.data.unsafe_buffer_pointer() == addr, "this rank's shard is not its slabs"
want = np.arange(rows * 1024, dtype=np.float32).reshape(rows, 1024)[w.rank * 32:][:32]
assert np.array_equal(np.asarray(sh.data), want)
del sh, j
pt.finalize()
print("pool jax spmd ok", flush=True)
