"""After a run of small collectives over tcp, whose frames a waiting rank reads itself and
after which it leaves the socket to its next wait for a moment (tcp_server.c, PT_TCP_LINGER),
a peer's one-sided get is still served at once by the connection's thread while this rank
does not wait at all (it sleeps): the longest of ROUNDS gets, each right after a collective,
stays far below the thread's long sleep (0.5 s).

    tcp_linger.py ROUNDS -> "linger ok <longest get, ms> <frames read by the waiting rank>"
"""
import sys
import time

import numpy as np

import collectives

world = collectives.init()
rank, size = world.rank, world.size
rounds = int(sys.argv[1])
win = world.expose(4096)
np.frombuffer(win.buffer, np.uint8)[:] = rank + 1
longest = 0.0
for i in range(rounds):
    for _ in range(50):
        collectives.allreduce(np.ones(256, np.float32), algorithm="direct")
    if rank == 0:
        time.sleep(0.3)              # in no wait: the thread alone can serve the get
    else:
        out = bytearray(64)
        t0 = time.monotonic()
        win.get(0, 128, out)
        longest = max(longest, time.monotonic() - t0)
        assert bytes(out) == bytes([1]) * 64
    world.barrier()
s = world._ctx.tcp_stats()
print(f"linger ok {longest * 1e3:.1f} {s['helped']}", flush=True)
