"""The last rank SIGKILLs itself mid-job; every other rank must get PeerLost (from the barrier and
from a one-sided get) within the timeout, never hang."""
import os
import signal
import time

import collectives
from collectives import PeerLost

world = collectives.init()
win = world.expose(1 << 16)
victim = world.size - 1
world.barrier()
if collectives._native.PLATFORM == "linux":
    # segments are memfds or nameless files of a private tmpfs: they have no name in
    # /dev/shm and vanish with their last process
    kind = collectives._native.segment_kind()
    with open("/proc/self/maps") as f:
        maps = f.read()
    if kind == "memfd":
        assert "memfd:pooltensor" in maps, "window memory is not a memfd segment"
    else:
        assert kind == "tmpfs" and " (deleted)" in maps, f"window memory: {kind}"
else:
    # posix: shm_open names, gone once every same-host peer mapped them: left is the window
    # no peer has touched yet (the survivors reap the victim's once they see it dead); with
    # no peer over shared memory (tcp) none is left at all
    mine = [e for e in os.listdir("/dev/shm") if e.startswith(f"pt.{os.getpid()}.")]
    want = 1 if "shm" in world.transports else 0
    assert len(mine) == want, f"shm_open names of ours in /dev/shm: {mine}"
if world.rank == victim:
    print(f"rank {world.rank}: pid {os.getpid()} dying", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.monotonic()
try:
    world.barrier(timeout=20)
    raise SystemExit(f"rank {world.rank}: barrier returned although rank {victim} is dead")
except PeerLost as e:
    assert f"rank {victim}" in str(e), str(e)
took = time.monotonic() - t0
assert took < 10, took
try:
    win.get(victim, 0, bytearray(8))
    raise SystemExit("get from a dead rank succeeded")
except PeerLost as e:
    assert f"rank {victim}" in str(e)
print(f"rank {world.rank}: PeerLost after {took:.2f} s", flush=True)
os._exit(0)  # the world is broken; skip the closing barrier
