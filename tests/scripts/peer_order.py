"""Which rank is named when two are seen gone at once: the test stops rank 1 (SIGSTOP), kills
rank 2, lets rank 0 see it lost and exit, then resumes rank 1, whose monitor then finds ranks 0
and 2 both gone. The first lost is rank 2 (rank 0 saw it lost before leaving), not rank 0."""
import os
import sys
import time

import collectives
from collectives import PeerLost

go = sys.argv[1]                 # a file the test makes once rank 1 is resumed
world = collectives.init()
win = world.expose(1 << 12)
world.barrier()
print(f"rank {world.rank}: ready", flush=True)
if world.rank == 2:
    time.sleep(60)               # killed by the test
if world.rank == 1:
    deadline = time.monotonic() + 40
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.01)
try:
    world.barrier(timeout=20)
    raise SystemExit(f"rank {world.rank}: barrier returned although rank 2 is dead")
except PeerLost as e:
    print(f"rank {world.rank}: first lost {world._ctx.first_lost()}: {e}", flush=True)
os._exit(0)
