"""Pool locks and versions (pooltensor/pool/locks.py, versions.py): read-modify-write by
several real ranks against the count it must reach, a holder SIGKILLed while holding a lock
releases it after its lease, Timeout instead of a hang, and the same in one process."""
import re
import threading

import numpy as np
import pytest

import pooltensor as pt
from collectives.errors import Timeout
from conftest import check_ranks, run_env_ranks
from pooltensor.pool import locks

pytestmark = pytest.mark.timeout(90)


def test_ranks_update_under_lock_count_exactly():
    p = check_ranks("launch", 3, "pool_locks.py", "count", "8", timeout=80)
    out = p.stdout
    for r in range(3):
        assert f"rank {r} count ok" in out, out
    assert len(re.findall(r"rank \d won 1", out)) == 1, out       # one compare_and_bump wins
    assert len(re.findall(r"rank \d timeout ok", out)) == 2, out
    assert "rank 0 held past lease ok" in out, out


def test_sigkilled_holder_releases_after_lease():
    rcs, outs = run_env_ranks(3, "pool_locks.py", "kill", timeout=60)
    assert rcs[1] == -9 and "rank 1 holding" in outs[1], outs
    waited, taken = [], 0
    for r in (0, 2):
        assert rcs[r] == 0, outs[r]
        m = re.search(r"took dead lock after ([0-9.]+) s expired_taken (\d)", outs[r])
        assert m, outs[r]
        waited.append(float(m.group(1)))
        taken += int(m.group(2))
    assert taken == 1                      # exactly one survivor moved the dead holder on
    assert 0.9 <= min(waited) <= 6.0, waited     # the lease (1 s), not the timeout (20 s)


@pytest.fixture
def pool():
    pt.finalize()
    p = pt.init(slab_size=4096, memory=1 << 20, cache_bytes=1 << 16)
    yield p
    pt.finalize()


def test_one_process_threads_and_versions(pool):
    x = pt.zeros(3000, dtype=np.int64)
    v0 = pool.version(x)
    errs = []

    def work():
        try:
            for _ in range(25):
                pool.update(x, lambda a: a + 1, timeout=30)
        except Exception as e:          # noqa: BLE001 (reported below)
            errs.append(e)
    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errs, errs
    np.testing.assert_array_equal(x.to_numpy(), np.full(3000, 100, np.int64))
    v = pool.version(x)
    assert v >= v0 + 100
    assert pool.compare_and_bump(x, v) and not pool.compare_and_bump(x, v)
    assert pool.version(x) > v
    # a lock held by another thread: Timeout naming it, then usable again
    held = pool.lock("t")
    t = threading.Thread(target=held.acquire)
    t.start()
    t.join(10)
    with pytest.raises(Timeout, match="lock 't' not acquired within 0.2 s"):
        with pool.lock("t", timeout=0.2):
            pass
    with pool.lock("u"):
        with pytest.raises(ValueError, match="thread holds lock 'u' already"):
            pool.lock("u").acquire()
    st = pool.stats()["locks"]
    assert st["held"] == ["t"] and st["timeouts"] == 1
    held.release()
    with pool.lock("t", timeout=5, lease=2.0):   # the abandoned ticket costs one lease
        pass
    assert pool.stats()["locks"]["expired_taken"] == 1
    with pytest.raises(TypeError):
        pool.lock("")
    with pytest.raises(ValueError, match="lease"):
        pool.lock("t", lease=0)


def test_lease_lost_is_reported():
    """A holder that stops beating (its thread stopped here by hand) loses the lock to the
    next waiter and is told on release; the words alone, no pool needed beyond one process."""
    class P:
        me, timeout = 0, 5.0

        class world:
            hosts = ["here"]
    L = locks.Locks(P, None)
    a = L.lock("x", lease=0.3).acquire()
    a._stop.set()                             # the holder's heartbeat dies
    got = []

    def other():
        with L.lock("x", timeout=5, lease=0.3):
            got.append(True)
    t = threading.Thread(target=other)
    t.start()
    t.join(10)
    assert got and L.stats()["expired_taken"] == 1
    with pytest.raises(locks.LeaseExpired, match="lock 'x' was taken"):
        a.release()
