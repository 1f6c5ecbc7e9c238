"""Ranks that disagree on a collective pool operation, run by tests/test_pool_agree.py under
mpiexec and the launcher: for each rank-dependent call (shapes, dtypes, placements, access,
creation kinds and values, views in an elementwise op, rank-dependent scalars, reductions over
different axes, different operations, a sync met by a reduction, diverged frees) every rank
must raise CollectiveMismatch whose message names the field that differs and the ranks, the
pool state must still be the same on every rank and no array may have changed, and the next
matching operation must work (its result checked against numpy).

    python -m collectives.launch -n 3 tests/scripts/pool_agree.py
"""
import gc
import time

import numpy as np

import pooltensor as pt
from collectives import CollectiveMismatch
from spmd_check import SLAB, start

pool, me, n, world = start(memory=4 << 20)
assert n > 1, "needs several ranks"
E = SLAB // 8
x = pt.arange(4 * n * E, dtype=np.float64)          # the array every case must leave alone
X = np.arange(4 * n * E, dtype=np.float64)
m = pt.arange(6 * 10, dtype=np.float64).reshape(6, 10)
M = np.arange(6 * 10, dtype=np.float64).reshape(6, 10)
pt.sync()


def state():
    """What every rank must hold alike: allocation ids, slabs in use, each heap's free runs,
    queued frees (after collecting cyclic garbage, so that every rank has queued the same)."""
    gc.collect()
    return [pool._next_id, list(pool._used), len(pool._pending),
            [[list(map(list, a.free_runs())) for a in pool._alloc[h]] for h in ("rw", "ro")]]


def same_everywhere(what, value):
    got = world.allgather_object(value)
    assert all(g == got[0] for g in got), f"{what}: ranks differ: {got}"


def mismatch(label, fn, *words):
    """fn() must raise CollectiveMismatch on this rank (on every rank, since each checks),
    soon (not a Timeout), naming `words` and the ranks; afterwards nothing diverged."""
    t0 = time.monotonic()
    try:
        fn()
    except CollectiveMismatch as e:
        msg = str(e)
    else:
        raise AssertionError(f"{label}: no CollectiveMismatch on rank {me}")
    took = time.monotonic() - t0
    assert took < world.timeout / 2, f"{label}: mismatch only after {took:.1f} s"
    for w in words:
        assert w in msg, f"{label}: {w!r} not in the message on rank {me}: {msg}"
    assert "rank 0" in msg or "ranks 0" in msg, f"{label}: no ranks named: {msg}"
    same_everywhere(label + " (pool state)", state())
    np.testing.assert_array_equal(x.to_numpy(), X, err_msg=f"{label}: x changed")
    np.testing.assert_array_equal(m.to_numpy(), M, err_msg=f"{label}: m changed")
    return msg


def works():
    """A matching collective operation right after an error, checked against numpy."""
    y = pt.zeros(3 * E + 5)
    y += 2
    same_everywhere("homes", list(map(int, y.slab_members)))
    np.testing.assert_array_equal(y.to_numpy(), np.full(3 * E + 5, 2.0))
    assert float(x.sum()) == float(X.sum())
    pt.sync()


cases = [
    ("shape", lambda: pt.zeros(8 + 8 * me), "shape", "(8,)", "(16,)"),
    ("dtype", lambda: pt.ones(8, dtype=np.float32 if me == 0 else np.float64), "dtype",
     "<f4", "<f8"),
    ("placement list", lambda: pt.zeros(4 * E, placement=[me]), "placement", "(0,)", "(1,)"),
    ("placement policy", lambda: pt.zeros(4 * E, placement="block" if me else "interleave"),
     "placement", "interleave", "block"),
    ("access", lambda: pt.zeros(8, access="readonly" if me == 0 else "readwrite"), "access",
     "readonly", "readwrite"),
    ("creation kind", lambda: (pt.zeros if me == 0 else pt.empty)(8), "different collective",
     "zeros", "empty"),
    ("full value", lambda: pt.full(8, float(me)), "operation", "full 0.0", "full 1.0"),
    ("arange", lambda: pt.arange(me, 8), "operation"),
    ("from_numpy shape", lambda: pt.from_numpy(np.zeros(4 + me)), "shape"),
    ("random seed", lambda: pt.random.random(8, seed=me), "operation", "seed 0", "seed 1"),
    ("view in +=", lambda: x[me::n].__iadd__(1), "targets", "offset 0", "offset 8"),
    ("view in copyto", lambda: np.copyto(x[me * E:(me + 1) * E], 5.0), "targets"),
    ("operand view", lambda: m.__iadd__(m[me % 2]), "operands"),
    ("fresh result of a view", lambda: x[me::n] + 1, "collective pool operation"),
    ("scalar", lambda: x * float(me + 1), "operands", "float 1.0", "float 2.0"),
    ("ufunc", lambda: np.add(x, 1) if me == 0 else np.multiply(x, 1), "different collective",
     "add", "multiply"),
    ("reduction axes", lambda: m.sum(axis=me % 2), "different collective",
     "sum over axes (0,)", "sum over axes (1,)"),
    ("reduction views", lambda: x[me::n].sum(), "operands"),
    ("reduction kind", lambda: m.max() if me == 0 else m.min(), "different collective",
     "max", "min"),
    ("sync met by a reduction", lambda: pt.sync() if me == 0 else m.sum(),
     "different collective", "sync", "sum"),
    ("sync met by a creation", lambda: pt.sync() if me == 0 else pt.zeros(8),
     "different collective", "sync", "zeros"),
    ("copy of a view", lambda: pt.reshape(m[:, me % 2:me % 2 + 3], -1), "collective pool operation"),
    ("concatenate", lambda: pt.concatenate([x[:8 + me], m.reshape(-1)]),
     "collective pool operation"),
]
for label, fn, *words in cases:
    msg = mismatch(label, fn, *words)
    if me == 0:
        print(f"{label}: {msg}", flush=True)
    works()

# the pool after all of that: the same allocations everywhere, still usable
same_everywhere("state at the end", state())
y = pt.from_numpy(M * 3)
same_everywhere("homes", list(map(int, y.slab_members)))
np.testing.assert_allclose((y + m).sum(axis=0), (M * 3 + M).sum(axis=0))

# frees of allocations the ranks see differently (their pools diverged: simulated here by
# editing one rank's queue) are refused on every rank, and nothing is freed
z = pt.zeros(3 * E)
zid = z._a.id
del z
pend = [p for p in pool._pending if p[0] == zid]
assert pend, "the dropped array is not queued"
saved = list(pool._pending)
if me == n - 1:
    pool._pending = [(a, h, ms, [s + 1 for s in ss], c) if a == zid else (a, h, ms, ss, c)
                     for a, h, ms, ss, c in pool._pending]
before = state()
try:
    pt.sync()
except CollectiveMismatch as e:
    assert f"allocation {zid}" in str(e) and "diverged" in str(e), str(e)
else:
    raise AssertionError("diverged frees went unnoticed")
assert state() == before, "something was freed"
pool._pending = saved
pt.sync()
assert all(p[0] != zid for p in pool._pending), "not freed once the ranks agree"
same_everywhere("state after the frees", state())

print(f"pool agree ok {me}", flush=True)
pt.finalize()
