"""The last rank SIGKILLs itself instead of joining a collective: every other rank gets
PeerLost naming it, well before the timeout, from allreduce (and from the next allgather).

Started straight from POOLTENSOR_* variables by the test (no launcher to stop the survivors).
"""
import os
import signal
import time

import numpy as np

import collectives
from collectives import PeerLost

world = collectives.init()
victim = world.size - 1
collectives.allreduce(np.ones(8))          # the team exists on every rank
if world.rank == victim:
    os.kill(os.getpid(), signal.SIGKILL)
for kind, call in (("allreduce", lambda: collectives.allreduce(np.ones(300_000, np.float32))),
                   ("allgather", lambda: collectives.allgather(np.ones(10)))):
    t0 = time.monotonic()
    try:
        call()
        raise SystemExit(f"rank {world.rank}: {kind} returned although rank {victim} is dead")
    except PeerLost as e:
        assert e.rank == victim and f"rank {victim}" in str(e), str(e)
    took = time.monotonic() - t0
    assert took < world.timeout / 2, f"{kind}: PeerLost only after {took:.1f} s"
    print(f"rank {world.rank}: {kind} PeerLost after {took:.2f} s", flush=True)
# The world is broken: no closing barrier. The survivors still wait for each other (through
# files) before leaving, so that no survivor sees another one leave while it is in a call: that
# one would be gone too, and named so.
meet = os.environ["MEET_DIR"]
open(os.path.join(meet, str(world.rank)), "w").close()
deadline = time.monotonic() + 20
while len(os.listdir(meet)) < world.size - 1 and time.monotonic() < deadline:
    time.sleep(0.05)
os._exit(0)
