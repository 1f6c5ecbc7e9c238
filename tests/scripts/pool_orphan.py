"""A plain script that starts two members and then dies by SIGKILL without cleaning up:
the members must notice and exit by themselves (tests/test_pool.py)."""
import os
import signal

import pooltensor as pt

pool = pt.init(members=3, slab_size=4096, memory=1 << 20)
x = pt.arange(10000)
assert x[9999] == 9999
print(" ".join(str(p.pid) for p in pool._procs), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
