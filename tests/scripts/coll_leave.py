"""How ranks leave after a collective Timeout; argv[1] is the mode.

  uncaught   the last rank comes late to an allreduce: the others' Timeout goes uncaught (they
             exit 1); leaving on an error, they wait for no one at the rendezvous
  linger     rank 0 finishes at once; the last rank stays (sleeps past rank 0's closing barrier
             and its wait for the others to leave, a timeout each) and then finishes: rank 0
             warns once, naming it and how long it waited
"""
import sys
import time

import numpy as np

import collectives

mode = sys.argv[1]
world = collectives.init()
last = world.size - 1
collectives.allreduce(np.ones(4))
if mode == "uncaught":
    if world.rank == last:
        time.sleep(world.timeout + 5)
    collectives.allreduce(np.ones(4))
elif mode == "linger":
    if world.rank == last:
        time.sleep(world.timeout * 2 + 3)     # past rank 0's closing barrier and its wait
    print(f"rank {world.rank} done", flush=True)
