"""pooltensor SPMD: every rank is a member of the pool.

    mpiexec -n 4 python examples/spmd_mpirun.py
    python -m collectives.launch -n 4 examples/spmd_mpirun.py

Creation is collective (every rank runs the same deterministic allocator, so all agree on
where each slab lives without exchanging a message, and fills the slabs it homes); indexing
and assignment are one-sided (no other rank takes part); pooltensor.sync() is flush + barrier
+ revalidation of cached copies, after which every rank sees every write made before it.
"""
import time

import numpy as np

import pooltensor as pt

pool = pt.init(slab_size=1 << 20)
me, n = pool.me, pool.size
say = print if me == 0 else (lambda *a, **k: None)
say(f"{n} ranks, each one a member; slab {pool.slab_size >> 10} KiB")

# a (rows, cols) matrix: "block" placement gives each rank a contiguous band of slabs
rows, cols = 4096, 1024
x = pt.random.standard_normal((rows, cols), seed=7, dtype=np.float32)
homes = np.asarray(x.slab_members)
print(f"rank {me}: homes slabs {np.flatnonzero(homes == me)[[0, -1]].tolist()} "
      f"({x.where().get(me, 0) >> 20} MiB)", flush=True)

# each rank updates its own rows where it lives (local memory, no transfer) ...
band = rows // n
mine = slice(me * band, (me + 1) * band)
x[mine, :8] = me
# ... and one column in every other rank's band, one-sided, element by element
x[me::n, cols - 1] = -1 - me
pt.sync()                                   # now every rank sees every write

# every rank reads the whole matrix through its cache (remote slabs fetched, prefetched)
t = time.perf_counter()
col_sums = np.zeros(cols, np.float64)
for start, blk in x.blocks(with_index=True):
    col_sums += blk.reshape(-1, cols).sum(axis=0, dtype=np.float64)
dt = time.perf_counter() - t
assert all(x[r * band, 0] == r for r in range(n))
assert all(x[r, cols - 1] == -1 - (r % n) for r in range(0, rows, 97))
c = pool.stats()["cache"]
print(f"rank {me}: read {x.nbytes >> 20} MiB in {dt * 1e3:.1f} ms; cache hit rate "
      f"{c['hit_rate']:.1%}, prefetch accuracy {c['prefetch_accuracy']:.1%}, "
      f"fetched {c['bytes_fetched'] >> 20} MiB", flush=True)

# readonly arrays: every rank writes its own slabs while creating; afterwards the memory
# refuses writes wherever they come from
w = pt.asarray(np.arange(1 << 20, dtype=np.int64), access="readonly")
try:
    w[0] = 1
except ValueError as e:
    say(f"readonly: {e}")
pt.sync()
say("done")
pt.finalize()
