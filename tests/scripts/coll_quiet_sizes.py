"""Direct collectives over tcp at the sizes around the largest chunk that goes in one
unanswered frame (channel.QUIET_MAX: _native.TCP_FRAME with its header) and past it (several frames),
each checked against numpy on every rank. Prints "quiet sizes ok"."""
import numpy as np

import collectives
from collectives.algorithms import channel

world = collectives.init()
rank, size = world.rank, world.size
assert all(t == "tcp" for r, t in enumerate(world.transports) if r != rank), world.transports
q = channel.QUIET_MAX
f = q + channel.HDR     # a whole frame
for nbytes in (0, 8, q - 8, q, q + 8, f, f + 64, 3 * f):
    n = nbytes // 8
    xs = [np.arange(n, dtype=np.float64) * (r + 1) + nbytes for r in range(size)]
    got = collectives.allreduce(xs[rank], algorithm="direct")
    assert np.array_equal(got, sum(xs)), nbytes
    got = collectives.allgather(xs[rank], algorithm="direct")
    assert np.array_equal(got, np.stack(xs)), nbytes
    got = collectives.broadcast(xs[rank], root=size - 1, algorithm="direct")
    assert np.array_equal(got, xs[size - 1]), nbytes
print("quiet sizes ok", flush=True)
