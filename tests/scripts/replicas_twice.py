"""Two members lost one after the other (tests/test_replicas.py): 4 members, replicas=3.

After the first loss the pool restores three copies on the three members left; after the
second, two members are left: every slab keeps two copies, reads go on (compared with numpy),
stats() shows every slab under-replicated with too few members to restore, nothing is lost.
An array placed on the two lost members alone (replicas=2, placement=[2, 3]) survives both:
its copies were restored onto other members after the first loss.
"""
import signal
import time

import numpy as np

import pooltensor as pt

SLAB = 64 << 10
pool = pt.init(members=4, slab_size=SLAB, memory=32 << 20, cache_bytes=8 * SLAB, timeout=20)
src = np.random.default_rng(3).integers(0, 1 << 40, 48 * SLAB // 8)
x = pt.from_numpy(src, access="readonly", replicas=3)
y = pt.from_numpy(src[:8 * SLAB // 8] + 1, access="readonly", replicas=2, placement=[2, 3])
assert {m for cs in y._a.copies for m, _ in cs} == {2, 3}


def wait(cond, what):
    t = time.monotonic()
    while True:
        st = pool.stats()["replicas"]
        if cond(st):
            return st
        assert time.monotonic() - t < 30, (what, st)
        assert (x[::7].to_numpy() == src[::7]).all()          # reads go on meanwhile
        time.sleep(0.02)


def live(a):
    return [sorted(m for m, _ in cs) for cs in a.copies]


for victim, left in ((3, 3), (2, 2)):
    pool._procs[victim - 1].send_signal(signal.SIGKILL)
    for _ in range(200):
        i = int(np.random.randint(0, src.size - 999))
        assert (x[i:i + 999].to_numpy() == src[i:i + 999]).all()
        assert (y.to_numpy() == src[:y.size] + 1).all()
    st = wait(lambda s: len(s["lost_members"]) == 4 - left and s["restored"]["slabs"] > 0
              and s["under_replicated"]["slabs"] == s["too_few_members"]["slabs"],
              f"restore after losing {victim}")
    alive = set(range(left))
    for cs in live(x._a):
        assert len(cs) == min(3, left) and set(cs) <= alive, cs
    for cs in live(y._a):
        assert len(cs) == 2 and set(cs) <= alive, cs
assert st["under_replicated"]["slabs"] == len(x._a.copies), st
assert not st["restoring"] and st["lost"]["allocations"] == 0, st
assert pool.lost() == []
assert (x.to_numpy() == src).all() and (y.to_numpy() == src[:y.size] + 1).all()
print("twice ok", st["restored"], flush=True)
