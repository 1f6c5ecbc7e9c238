"""Large collectives (chunks past one tcp frame: several unanswered frames), against numpy.

Each rank builds every rank's input from its rank, so it can compute what every collective
must give; integer-valued float32 keeps every sum exact whatever the order. allreduce,
allgather, reduce_scatter and broadcast, with element counts that are not multiples of the
rank count or of a chunk. Prints "coll large ok" on success.

argv: ELEMENTS (float32 elements of the allreduce; default 1_500_007, ~6 MB)
"""
import sys

import numpy as np

import collectives

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_500_007
world = collectives.init()
rank, size = world.rank, world.size


def data(r, n, salt):
    return ((np.arange(n, dtype=np.int64) * (r + 3) + salt) % 1000).astype(np.float32)


for salt in range(3):                            # back to back: chunks of calls in a row
    want = sum(data(r, N, salt) for r in range(size))
    got = collectives.allreduce(data(rank, N, salt), algorithm="ring")
    assert np.array_equal(got, want), f"allreduce {salt}: differs at {np.argmax(got != want)}"
n = N // size + 1
got = collectives.allgather(data(rank, n, 7))
assert np.array_equal(got.reshape(size, n), np.stack([data(r, n, 7) for r in range(size)]))
x = data(rank, n * size, 9).reshape(size, n)
got = collectives.reduce_scatter(x)
want = sum(data(r, n * size, 9) for r in range(size)).reshape(size, n)[rank]
assert np.array_equal(got, want), "reduce_scatter differs"
b = data(rank, N, 11) if rank == size - 1 else np.empty(N, np.float32)
got = collectives.broadcast(b, root=size - 1)
assert np.array_equal(got, data(size - 1, N, 11)), "broadcast differs"
collectives.finalize()
print("coll large ok", flush=True)
