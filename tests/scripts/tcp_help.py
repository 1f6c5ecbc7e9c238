"""Small direct collectives between ranks over tcp: the results against numpy, and how many
of the peers' frames this rank read itself while it waited (the tcp server's "helped").

    tcp_help.py CALLS   -> one line per rank: "help ok <frames read by the waiting rank> <requests>"
"""
import sys

import numpy as np

import collectives

world = collectives.init()
rank, size = world.rank, world.size
calls = int(sys.argv[1])
for i in range(calls):
    n = 1 + (i * 37) % 3000
    x = np.arange(n, dtype=np.float64) * (rank + 1) + i
    got = collectives.allreduce(x, algorithm="direct")
    want = np.arange(n, dtype=np.float64) * (size * (size + 1) // 2) + i * size
    if not np.array_equal(got, want):
        raise SystemExit(f"rank {rank}: call {i} gave a wrong sum")
    g = collectives.allgather(np.full(3, rank + i, np.int32), algorithm="direct")
    if not np.array_equal(g.ravel(), np.repeat(np.arange(size, dtype=np.int32) + i, 3)):
        raise SystemExit(f"rank {rank}: call {i} gave a wrong allgather")
s = world._ctx.tcp_stats()
world.barrier()
print(f"help ok {s['helped']} {s['requests']}", flush=True)
