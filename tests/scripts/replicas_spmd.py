"""SPMD ranks with a replicated read-only array; the last rank is SIGKILLed and the others
read on (tests/test_replicas.py, 3 ranks started from POOLTENSOR_* variables).

Every rank writes the copies it homes at creation; every slab has two copies on distinct
ranks, each with the right bytes. After the kill the survivors read the whole array, slices
and elements (compared with numpy), the unreplicated array's slabs on the lost rank raise
PeerLost naming it, its other slabs read fine, and stats() shows the slabs left with one
copy (an SPMD pool does not restore: a lost rank stops every collective). Survivors leave
with os._exit (finalize would wait for the lost rank).
"""
import os
import signal
import time

import numpy as np

import pooltensor as pt
from collectives.errors import PeerLost

SLAB = 4096
pool = pt.init(slab_size=SLAB, memory=16 << 20, cache_bytes=8 * SLAB)
me, n = pool.me, pool.size
src = np.arange(40 * SLAB // 8, dtype=np.float64) * 0.25
x = pt.from_numpy(src, access="readonly", replicas=2)
y = pt.from_numpy(src * 2)                                     # block: a part on each rank
a = x._a
flat = src.view(np.uint8)
for s, cs in enumerate(a.copies):
    assert len({m for m, _ in cs}) == 2, cs
    for m, slot in cs:
        if m == me:              # the copies this rank homes hold the right bytes
            got = pool.local["ro"][slot * SLAB:slot * SLAB + a.slab_len(s)]
            assert (got == flat[s * SLAB:s * SLAB + a.slab_len(s)]).all(), (s, m)
done = pool.world.expose(8)        # survivors count themselves done here (rank 0's word)
pool.world.barrier()
if me == n - 1:
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.monotonic()
rng = np.random.default_rng(me)
reads = 0
while time.monotonic() - t0 < 1.5:
    i = int(rng.integers(0, src.size - 3000))
    assert (x[i:i + 3000].to_numpy() == src[i:i + 3000]).all()
    e = int(rng.integers(0, src.size))
    assert x[e] == src[e]
    reads += 1
assert (x.to_numpy() == src).all()
deadline = time.monotonic() + 10
while not pool.stats()["replicas"]["lost_members"]:
    assert time.monotonic() < deadline
    time.sleep(0.02)
st = pool.stats()["replicas"]
assert [d["member"] for d in st["lost_members"]] == [n - 1], st
assert st["under_replicated"]["slabs"] > 0 and not st["restoring"], st
assert all(m != n - 1 for m in a.members)
ym = y.slab_members
lost_k = int(np.nonzero(ym == n - 1)[0][0])
E = SLAB // 8
try:
    y[lost_k * E]
except PeerLost as e:
    assert f"member {n - 1}" in str(e), str(e)
else:
    raise AssertionError("a lost slab was read")
mine = int(np.nonzero(ym == me)[0][0])
assert y[mine * E] == src[mine * E] * 2
print(f"rank {me} spmd replicas ok, {reads} reads", flush=True)
done.fetch_add(0, 0, 1)            # stay until both are done: a rank that left early
deadline = time.monotonic() + 20   # would be a lost member to the other
while time.monotonic() < deadline:
    try:
        if done.fetch_add(0, 0, 0) >= n - 1:
            break
    except PeerLost:               # rank 0 saw both done and left
        break
    time.sleep(0.01)
os._exit(0)
