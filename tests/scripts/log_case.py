"""What POOLTENSOR_LOG=debug shows (tests/test_logging.py): 2 ranks over tcp; rank 0 stops
rank 1 (SIGSTOP), so a get from it times out, then lets it go on; both meet in a barrier."""
import os
import signal
import time

import numpy as np

import collectives
from collectives.errors import Timeout



def stopped(pid, seconds=5.0):
    """Wait until pid is really stopped (SIGSTOP is delivered asynchronously: a server thread
    scheduled at that moment could still answer one more request)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.005)
    raise SystemExit(f"rank 1 (pid {pid}) did not stop")


w = collectives.init()
win = w.expose(4096)
w.barrier()
if w.rank == 0:
    out = np.zeros(8, np.uint8)
    win.get(1, 0, out)
    w._ctx.set_timeout(1.0)
    os.kill(w.pids[1], signal.SIGSTOP)
    stopped(w.pids[1])
    try:
        win.get(1, 0, out)
        raise SystemExit("the get to a stopped rank did not time out")
    except Timeout:
        pass
    finally:
        os.kill(w.pids[1], signal.SIGCONT)
        w._ctx.set_timeout(w.timeout)       # the rest of the job at the usual timeout
    time.sleep(1.5)          # the link watcher's next look (once a second)
w.barrier()
win.close()
print("ok", flush=True)
