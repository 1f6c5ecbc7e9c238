"""A short multi-rank tour of the one-sided windows: who the ranks are, which transport joins
each pair, a get/put round around the ring, an atomic counter, and bandwidth to a neighbour.

    python -m collectives.launch -n 2 examples/windows_demo.py
    mpiexec -n 2 python examples/windows_demo.py
"""
import time

import numpy as np

import collectives

world = collectives.init()
rank, size = world.rank, world.size
d = world.describe()
if rank == 0:
    print(f"world of {size} rank(s), bootstrapped by {d['bootstrap']}, kernels: {d['kernels']}")
world.barrier()
print(f"rank {rank}: host {world.host}, local rank {world.local_rank}/{world.local_size}, "
      f"transports {d['transports']}", flush=True)

nbytes = 64 << 20
win = world.expose(nbytes)                 # every rank contributes 64 MiB of shared memory
win.buffer[:4096] = rank
world.barrier()

right, left = (rank + 1) % size, (rank - 1) % size
got = bytearray(8)
win.get(right, 0, got)                     # one-sided: the right neighbour takes no part
win.put(right, 4096, np.full(8, rank, np.uint8))
old = win.fetch_add(0, 8192, 1)            # an atomic counter on rank 0
world.barrier()
assert got == bytes([right]) * 8
assert bytes(win.buffer[4096:4104]) == bytes([left]) * 8
if rank == 0:
    total = int(win.buffer[8192:8200].view(np.int64)[0])
    print(f"get/put round ok; counter on rank 0 reached {total} (expected {size})")

# bandwidth of large gets from the right neighbour, next to a local copy of the same size
out = np.empty(nbytes, np.uint8)
src = np.ones(nbytes, np.uint8)
out[:] = 0


def best(fn, reps=5):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


t_get = best(lambda: win.get(right, 0, out))
t_cpy = best(lambda: np.copyto(out, src))
world.barrier()
print(f"rank {rank}: get 64 MiB from rank {right}: {nbytes / t_get / 1e9:5.1f} GB/s "
      f"(local memcpy {nbytes / t_cpy / 1e9:5.1f} GB/s, ratio {t_cpy / t_get:.2f})", flush=True)
win.close()
