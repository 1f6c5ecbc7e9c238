"""Collectives on a finalized world raise Finalized at once (no new world made behind the
user's back, no barrier that returns after its timeout); collectives.init() starts a new world,
which works. Prints "finalize ok" on every rank."""
import time

import numpy as np

import collectives
from collectives import Finalized

world = collectives.init()
rank, size = world.rank, world.size
assert collectives.allreduce(np.ones(3))[0] == size
collectives.finalize()

x = np.ones((size, 3))
calls = {
    "allreduce": lambda: collectives.allreduce(x),
    "allgather": lambda: collectives.allgather(x),
    "reduce_scatter": lambda: collectives.reduce_scatter(x),
    "broadcast": lambda: collectives.broadcast(x),
    "barrier": lambda: collectives.barrier(),
    "allreduce_async": lambda: collectives.allreduce_async(x).wait(5),
    "old world's allreduce": lambda: collectives.allreduce(x, world=world),
    "old world's barrier": lambda: collectives.barrier(world=world),
    "World.barrier": lambda: world.barrier(),
}
for what, call in calls.items():
    t0 = time.monotonic()
    try:
        call()
    except Finalized as e:
        took = time.monotonic() - t0
        assert took < 1.0, f"{what}: Finalized only after {took:.2f} s"
        assert isinstance(e, collectives.PooltensorError) and isinstance(e, RuntimeError)
        assert "finalize" in str(e) and "collectives.init()" in str(e), str(e)
    else:
        raise AssertionError(f"{what} after finalize() did not raise Finalized")
assert collectives.world.current() is None, "a world was made behind the user's back"

again = collectives.init()
assert again is not world and again.size == size and again.rank == rank
assert np.array_equal(collectives.allreduce(np.full(3, rank)), np.full(3, size * (size - 1) // 2))
collectives.barrier()
again.barrier()
print("finalize ok", flush=True)
