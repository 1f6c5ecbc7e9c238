"""posix profile: shm_open names leave /dev/shm as soon as every same-host peer has mapped
them. After setup none of this job's names is left; a window every peer has touched has none
either; one no peer has touched yet keeps its name. Then every rank SIGKILLs itself (the test
checks that the next context made on the machine reaps what is left)."""
import os
import signal

import collectives

world = collectives.init()
pids = world.allgather_object(os.getpid())
world.barrier()


def names():
    return sorted(e for e in os.listdir("/dev/shm") if any(e.startswith(f"pt.{p}.") for p in pids))


assert names() == [], f"rank {world.rank}: left after setup: {names()}"
world.barrier()                  # (every rank has looked before any makes a new segment)
win = world.expose(1 << 16)
for r in range(world.size):
    win.get(r, 0, bytearray(8))
collectives.allreduce(win.buffer[:64])
world.barrier()
assert names() == [], f"rank {world.rank}: left after every peer mapped: {names()}"
world.barrier()
untouched = world.expose(1 << 12)
world.barrier()
mine = [e for e in names() if e.startswith(f"pt.{os.getpid()}.")]
assert len(mine) == 1, f"rank {world.rank}: the window no peer mapped yet: {mine}"
print(f"rank {world.rank}: names ok {' '.join(str(p) for p in pids)}", flush=True)
world.barrier()
os.kill(os.getpid(), signal.SIGKILL)
