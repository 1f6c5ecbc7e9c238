"""The direct allreduce's native one-exchange path (_native.Channel) against its Python path
and numpy, over tcp. Every op and dtype, odd sizes: the native result is bitwise the Python
path's (the same rank-order reduction) and, for integers, numpy's. A rank that comes late
(SLOW: it sleeps before some calls) makes the native call hand its receives back to Python
(`sent`); with POOLTENSOR_CHANNEL_SLOTS=1 a slot not free yet hands the whole call back
(`unsent`). A call that differs on one rank is a CollectiveMismatch on both, and the next
calls are right, through algorithm="direct" and through the short way of algorithm="auto".
Prints "native ok" and the counts.
"""
import sys
import time

import numpy as np

import collectives
from collectives import CollectiveMismatch
from collectives.algorithms import channel

SLOW = "slow" in sys.argv[1:]
world = collectives.init()
rank, size = world.rank, world.size
assert all(t == "tcp" for r, t in enumerate(world.transports) if r != rank), world.transports
rng = np.random.default_rng(7)
DTYPES = [np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.float16, np.float32,
          np.float64]
calls = 0


def inputs(dtype, n, seed):
    g = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        return [g.standard_normal(n).astype(dtype) for _ in range(size)]
    return [g.integers(-50 if np.dtype(dtype).kind == "i" else 0, 50, n).astype(dtype)
            for _ in range(size)]


for dtype in DTYPES:
    for op in ("sum", "prod", "min", "max"):
        for n in (0, 1, 7, 1001, 4099):
            calls += 1
            xs = inputs(dtype, n, calls)
            if SLOW and rank == calls % size:
                time.sleep(0.003)           # past the native wait: its receives go on here
            channel.NATIVE = True
            a = collectives.allreduce(xs[rank], op, algorithm="direct")
            channel.NATIVE = False
            b = collectives.allreduce(xs[rank], op, algorithm="direct")
            channel.NATIVE = True
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (dtype, op, n)
            if np.dtype(dtype).kind != "f":
                f = {"sum": np.add, "prod": np.multiply, "min": np.minimum,
                     "max": np.maximum}[op]
                want = xs[0].copy()
                for x in xs[1:]:
                    want = f(want, x)
                assert np.array_equal(a, want), (dtype, op, n)

counts = world._channels.fast().counts()      # (a failed call retires the channel)
assert counts["done"] > 0, counts
if SLOW:
    assert counts["sent"] > 0, counts

# a call that differs on one rank (same bytes, another shape): found by both, then all well
x = np.arange(64, dtype=np.float32)
try:
    collectives.allreduce(x if rank else x.reshape(8, 8), algorithm="direct")
    raise AssertionError("no mismatch")
except CollectiveMismatch:
    pass
for i in range(5):
    got = collectives.allreduce(np.full(33, rank + i, np.int64), algorithm="direct")
    assert np.array_equal(got, np.full(33, sum(range(size)) + size * i)), got
after = world._channels.fast().counts()           # the channel made anew after the failure
assert sum(after.values()) == 5, after

# the same through algorithm="auto": once a size ran direct, ops.allreduce takes its short way
# (into `out` as well); a rank whose call differs there is found by both, and all is well after
y = np.empty(64, np.float32)
for i in range(3):
    got = collectives.allreduce(x + i, out=y)
    assert got is y and np.array_equal(y, size * (x + i)), y
assert world._allreduce_algo.get(x.nbytes) == "direct", world._allreduce_algo
try:
    collectives.allreduce(x if rank else x.reshape(8, 8))
    raise AssertionError("no mismatch")
except CollectiveMismatch:
    pass
for i in range(3):
    got = collectives.allreduce(x - i, "max")
    assert np.array_equal(got, x - i), got
print("native ok", counts, flush=True)
