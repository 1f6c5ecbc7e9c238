"""A restore that finds no room waits, and finishes once memory is freed (tests/test_replicas.py).

3 members of 64 slabs each; a replicated array and a filler leave members 0 and 1 no free
slab; member 2 is killed: the slabs it held a copy of stay under-replicated (stats says so,
reads go on), and once the filler is dropped the keeper restores them within a few seconds.
"""
import signal
import time

import numpy as np

import pooltensor as pt

SLAB = 64 << 10
pool = pt.init(members=3, slab_size=SLAB, memory=64 * SLAB, cache_bytes=8 * SLAB, timeout=20)
src = np.arange(60 * SLAB // 8, dtype=np.int64)
x = pt.from_numpy(src, access="readonly", replicas=2)
free = pool.free_bytes()
filler = [pt.empty(free[m] // 8, np.int64, placement=[m]) for m in (0, 1)]
assert pool.free_bytes()[:2] == [0, 0], pool.free_bytes()
pool._procs[1].send_signal(signal.SIGKILL)
t = time.monotonic()
while time.monotonic() - t < 3:
    assert (x.to_numpy() == src).all()
    st = pool.stats()["replicas"]
    time.sleep(0.05)
assert st["lost_members"] and st["under_replicated"]["slabs"] > 0, st
assert st["restored"]["slabs"] == 0 and st["too_few_members"]["slabs"] == 0, st
assert st["restoring"], st
waiting = st["under_replicated"]["slabs"]
del filler
t = time.monotonic()
while pool.stats()["replicas"]["under_replicated"]["slabs"]:
    assert time.monotonic() - t < 15, pool.stats()["replicas"]
    assert (x[::5].to_numpy() == src[::5]).all()
    time.sleep(0.05)
st = pool.stats()["replicas"]
assert st["restored"]["slabs"] == waiting, (st, waiting)
for cs in x._a.copies:
    assert sorted(m for m, _ in cs) == [0, 1], cs
assert (x.to_numpy() == src).all()
print("full ok", waiting, round(time.monotonic() - t, 2), flush=True)
