"""Migration (pooltensor/pool/migrate.py): slabs read mostly by the script move to it at a
safe point (sampled fault counts), explicit moves while other threads read and write under
the array's lock (checked against a reference: no torn read, no lost write), rebalance, and
the bytes/s budget."""
import gc
import threading
import time

import numpy as np
import pytest

import pooltensor as pt
from pooltensor.pool.versions import lock_name

pytestmark = pytest.mark.timeout(60)
KiB = 1 << 10
SLAB = 64 * KiB


@pytest.fixture
def pool():
    pt.finalize()
    # attach=False: the member's slabs go through the cache, as across machines
    p = pt.init(members=2, slab_size=SLAB, memory=8 << 20, cache_bytes=4 * SLAB, attach=False,
                migrate={"budget": "64MiB", "min_faults": 4, "ratio": 2})
    yield p
    pt.finalize()


def test_hot_slabs_move_to_their_reader(pool):
    ref = np.random.default_rng(0).random(16 * SLAB // 8)
    x = pt.asarray(ref, placement=[1])
    assert set(x._a.members) == {1}
    v0 = x._a.version
    for _ in range(8):                        # more slabs than cache frames: faults again
        np.testing.assert_array_equal(x.to_numpy(), ref)
    hot = pool.mover.hot()
    n = len(hot)
    assert n >= 12 and {r for _, _, r in hot} == {0}
    pt.sync()                                 # a safe point: the hot slabs move here
    assert x._a.members.count(0) == n and x._a.version == v0 + n
    st = pool.stats()
    assert st["migrations"]["migrations"] == n and st["migrations"]["bytes"] == n * SLAB
    np.testing.assert_array_equal(x.to_numpy(), ref)
    assert st["members"][1]["used"] == (16 - n) * SLAB      # the old slots were freed
    before = st["migrations"]["sampled_faults"]
    k = x._a.members.index(0) * (SLAB // 8)     # a slab that moved here
    np.testing.assert_array_equal(x[k + 3:k + 1000].to_numpy(), ref[k + 3:k + 1000])
    assert pool.stats()["migrations"]["sampled_faults"] == before   # local now: no fault
    assert pool.mover.hot() == []


def test_moves_under_concurrent_readers_and_writers(pool):
    ref = np.arange(12 * SLAB // 8, dtype=np.int64)
    x = pt.asarray(ref, placement=[1])
    name = lock_name(x)
    stop, errs, seen = threading.Event(), [], []
    n_updates = 30

    def reader():
        last = -1
        try:
            while not stop.is_set():
                with pool.lock(name, timeout=30):
                    got = x.to_numpy()
                k = got - ref
                assert (k == k[0]).all(), "a torn read"
                assert k[0] >= last, "went back in time"
                last = int(k[0])
                seen.append(last)
        except Exception as e:            # noqa: BLE001
            errs.append(e)

    def writer():
        try:
            for _ in range(n_updates):
                pool.update(x, lambda a: a + 1, timeout=30)
        except Exception as e:            # noqa: BLE001
            errs.append(e)
    ts = [threading.Thread(target=reader), threading.Thread(target=writer)]
    for t in ts:
        t.start()
    moved = 0
    for home in ([0], [1], "interleave", [0]):
        moved += x.migrate(home)
    ts[1].join(30)
    stop.set()
    ts[0].join(30)
    assert not errs, errs
    assert moved >= 12 * 3
    np.testing.assert_array_equal(x.to_numpy(), ref + n_updates)
    assert set(x._a.members) == {0} and len(seen) > 0


def test_rebalance_and_budget(pool):
    a = pt.ones(24 * SLAB // 8, placement=[1])
    b = pt.full(8 * SLAB // 8, 2.0, placement=[1])
    used = [m["used"] for m in pool.stats()["members"]]
    assert used == [0, 32 * SLAB]
    moved = pool.rebalance()
    used = [m["used"] for m in pool.stats()["members"]]
    assert moved == 16 and abs(used[0] - used[1]) <= SLAB, used
    assert float(a.sum()) == 24 * SLAB // 8 and float(b.sum()) == 2.0 * (8 * SLAB // 8)
    del a, b
    gc.collect()
    pool.mover.budget.__init__(1 << 20)         # 1 MiB/s, one second of burst
    c = pt.zeros(24 * SLAB // 8, placement=[1])   # 1.5 MiB
    t0 = time.monotonic()
    assert c.migrate("local") == 24
    took = time.monotonic() - t0
    assert 0.4 <= took <= 5, took
    assert pool.stats()["migrations"]["budget_waited_s"] >= 0.4


def test_refusals(pool):
    p = pt.zeros(100, access="private")
    with pytest.raises(ValueError, match="private array"):
        p.migrate("local")
    with pytest.raises(ValueError, match="unknown settings"):
        pt.finalize() or pt.init(migrate={"speed": 1})
