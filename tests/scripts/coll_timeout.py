"""The last rank skips one collective: every other rank gets collectives.Timeout naming it,
within POOLTENSOR_TIMEOUT (the test sets it to a few seconds).

argv: kind, one of allreduce, allgather, reduce_scatter, broadcast, allreduce_async.
Prints "timeout ok" on every rank that checked the error, "skipped ok" on the one that skipped.
"""
import sys
import time

import numpy as np

import collectives

kind = sys.argv[1]
world = collectives.init()
rank, size = world.rank, world.size
skipper = size - 1
limit = world.timeout

# one correct call first, so the team exists and is warm on every rank
assert np.array_equal(collectives.allreduce(np.ones(4)), np.full(4, float(size)))

if rank == skipper:
    # skip the collective; wait (in a plain barrier) for the others to give up
    world.barrier(timeout=limit * 4 + 30)
    print("skipped ok", flush=True)
    sys.exit(0)

x = np.ones((size, 100), np.float32)
call = {
    "allreduce": lambda: collectives.allreduce(x),
    "allgather": lambda: collectives.allgather(x),
    "reduce_scatter": lambda: collectives.reduce_scatter(x),
    "broadcast": lambda: collectives.broadcast(x, root=0),
    "allreduce_async": lambda: collectives.allreduce_async(x).wait(limit * 4 + 30),
}[kind]
t0 = time.monotonic()
try:
    call()
except collectives.Timeout as e:
    took = time.monotonic() - t0
    assert e.rank == skipper, f"Timeout names rank {e.rank}, not {skipper}: {e}"
    assert f"rank {skipper}" in str(e), f"message does not name rank {skipper}: {e}"
    assert isinstance(e, TimeoutError), type(e).__mro__
    # a little early is impossible, a little late is scheduling on 2 shared cores
    assert limit * 0.9 <= took <= limit + 5.0, f"Timeout after {took:.2f} s, limit {limit} s"
    print(f"timeout ok after {took:.2f} s: {e}", flush=True)
else:
    raise AssertionError(f"{kind} returned although rank {skipper} never called it")
world.barrier(timeout=limit * 4 + 30)
