"""A member holding replicas is SIGKILLed while this script reads (tests/test_replicas.py).

    python replicas_loss.py local N ATTACH           N members of a plain script (attach 0/1);
                                                     the script kills the last one itself
    python replicas_loss.py servers SECRET ADDR...   memory servers; the test kills the last
                                                     one when this prints "reading"

Checked against numpy: every read during and after the loss returns the source's bytes; the
pool restores two copies of every slab (stats), each on a live member, every copy holding the
right bytes; the array that lived only on the lost member raises PeerLost naming it, the one
that never touched it works, pool.lost() lists the first only; new arrays avoid the lost
member. Prints one JSON line of figures ("figures {...}") and "replicas ok".
"""
import json
import signal
import sys
import threading
import time

import numpy as np

import pooltensor as pt
from collectives.errors import PeerLost

SLAB = 64 << 10
mode = sys.argv[1]
if mode == "local":
    n, attach = int(sys.argv[2]), sys.argv[3] == "1"
    pool = pt.init(members=n, slab_size=SLAB, memory=64 << 20, cache_bytes=16 * SLAB,
                   attach=attach, timeout=20)
else:
    secret, servers = sys.argv[2], sys.argv[3:]
    pool = pt.init(connect=servers, secret_file=secret, slab_size=SLAB,
                   cache_bytes=16 * SLAB, memory=48 << 20, timeout=20)
victim = pool.size - 1
holders = [m for m in range(pool.size) if pool.nslabs[m] > 0]
rng = np.random.default_rng(7)
src = rng.standard_normal(160 * SLAB // 8)             # 160 slabs, 10x the cache
x = pt.from_numpy(src, access="readonly", replicas=2)
y = pt.from_numpy(src[:20 * SLAB // 8] * 2, placement=[victim])          # only on the victim
z = pt.from_numpy(src[:20 * SLAB // 8] * 3, placement=[m for m in holders if m != victim])
machines = pool.keeper.machines


def check_copies(a, k, ref, dead=()):
    """Every slab has k copies on distinct live members (distinct machines where the pool
    has them), each holding the right bytes; the first is where reads go."""
    flat = ref.view(np.uint8)
    spread = len({machines[m] for m in holders if m not in dead})
    buf = np.empty(SLAB, np.uint8)
    for s, cs in enumerate(a.copies):
        ms = [m for m, _ in cs]
        assert len(ms) == k and len(set(ms)) == k, (s, cs)
        assert not set(ms) & set(dead), (s, cs, dead)
        assert len({machines[m] for m in ms}) == min(k, spread), (s, ms, machines)
        assert (a.members[s], a.slots[s]) == cs[0], (s, cs, a.members[s])
        n = a.slab_len(s)
        for m, slot in cs:
            pool.read_win["ro"].get(m, slot * SLAB, buf[:n]) if m != pool.me else \
                buf.__setitem__(slice(0, n), pool.local["ro"][slot * SLAB:slot * SLAB + n])
            assert (buf[:n] == flat[s * SLAB:s * SLAB + n]).all(), (s, m, slot)


check_copies(x._a, 2, src)
assert pool.stats()["replicas"]["replicated_slabs"] == len(x._a.members)
print("ready", json.dumps({"machines": len(set(machines[m] for m in holders))}), flush=True)

killed = [None]
if mode == "local":
    def kill():
        killed[0] = time.monotonic()
        pool._procs[victim - 1].send_signal(signal.SIGKILL)
    threading.Timer(0.4, kill).start()
print("reading", flush=True)
N = src.size
lat, reads, t0 = [], 0, time.monotonic()
after_first = None
while time.monotonic() - t0 < 2.5 or reads < 50:
    i = int(rng.integers(0, N - 40000))
    w = int(rng.integers(1, 40000))
    t = time.monotonic()
    got = x[i:i + w].to_numpy()
    e = int(rng.integers(0, N))
    v = x[e]
    dt = time.monotonic() - t
    lat.append(dt)
    assert (got == src[i:i + w]).all(), (i, w)
    assert v == src[e], e
    if reads % 25 == 0:
        for off, blk in x[i:i + 3 * SLAB // 8].blocks(with_index=True):
            assert (blk == src[i + off:i + off + blk.size]).all()
    if killed[0] is not None and after_first is None and t > killed[0]:
        after_first = time.monotonic() - killed[0]
    reads += 1
assert (x.to_numpy() == src).all()
assert pool.world.lost() == [victim], pool.world.lost()

# restore: back to two copies of every slab, in the background
t = time.monotonic()
while True:
    st = pool.stats()["replicas"]
    if st["under_replicated"]["slabs"] == 0 and st["restored"]["slabs"] > 0:
        break
    assert time.monotonic() - t < 30, st
    time.sleep(0.05)
assert [d["member"] for d in st["lost_members"]] == [victim], st
check_copies(x._a, 2, src, dead=(victim,))
assert (x.to_numpy() == src).all()
np.testing.assert_allclose(float(x.sum()), src.sum(), rtol=1e-9)   # whole-array work goes on

# no replica: only the array on the lost member says so, naming it
for what in (lambda: y.to_numpy(), lambda: y[3], lambda: float(y.sum())):
    try:
        what()
    except PeerLost as e:
        who = "member" if mode == "local" else "memory server"
        assert f"{who} {victim}" in str(e) and e.rank == victim, str(e)
    else:
        raise AssertionError("a read of a lost slab did not raise")
assert (z.to_numpy() == src[:z.size] * 3).all()
np.testing.assert_allclose(float((z + 1).sum()), ((src[:z.size] * 3) + 1).sum(), rtol=1e-9)
lost = pool.lost()
assert pt.lost() == lost
assert [d["allocation"] for d in lost] == [y._a.id], lost
assert list(lost[0]["members"]) == [victim] and lost[0]["bytes"] == y.nbytes, lost
assert st["lost"]["allocations"] == 1 and st["lost"]["bytes"] == y.nbytes, st
fresh = pt.ones(30 * SLAB // 8, access="readonly", replicas=2)
assert victim not in {m for cs in fresh._a.copies for m, _ in cs}
assert float(fresh.sum()) == fresh.size
try:
    pt.zeros(10, access="readonly", replicas=len(holders))
except ValueError as e:
    assert f"replicas={len(holders)}" in str(e), str(e)
else:
    raise AssertionError("more replicas than live members was accepted")
lat.sort()
print("figures", json.dumps({
    "reads": reads, "read_p50_ms": round(1e3 * lat[len(lat) // 2], 3),
    "read_max_ms": round(1e3 * lat[-1], 3),
    "first_read_after_kill_ms": None if after_first is None else round(1e3 * after_first, 3),
    "restored_slabs": st["restored"]["slabs"], "restored_bytes": st["restored"]["bytes"],
    "restore_seconds": st["restored"]["seconds"]}), flush=True)
print("replicas ok", flush=True)
