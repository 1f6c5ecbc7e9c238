"""The pool in a plain script: members, placement, access modes, out of memory, the slab
cache (eviction, pinning, write-through), the prefetcher, and the member processes' lifecycle.

Pools are built in this test process; `members=3` starts two member processes."""
import gc
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import SCRIPTS, rank_env

import pooltensor as pt
from collectives.errors import PooltensorError, RemoteAccessError

pytestmark = pytest.mark.timeout(120)
SLAB = 4096
E = SLAB // 8                       # float64 elements per slab


@pytest.fixture(scope="module")
def pool():
    pt.finalize()
    # the copying path (members stand in for other machines): the cache and the prefetcher
    # are what these tests are about; the mapped path is test_attach.py's
    p = pt.init(members=3, slab_size=SLAB, memory=256 * SLAB, cache_bytes=8 * SLAB,
                attach=False)
    yield p
    pt.finalize()


@pytest.fixture
def fresh(pool):
    """Start each test with an empty cache and zeroed counters."""
    pool.cache.resize(8 * SLAB)
    pool.cache.clear()
    pool.cache.reset_counters()
    yield pool


def test_placement_policies_decide_where_slabs_live(fresh):
    n = 9 * E
    assert list(pt.zeros(n, placement="block").slab_members) == [0] * 3 + [1] * 3 + [2] * 3
    assert list(pt.zeros(n, placement="interleave").slab_members) == [0, 1, 2] * 3
    assert list(pt.zeros(n, placement="local").slab_members) == [0] * 9
    assert list(pt.zeros(n, placement=[2, 1]).slab_members) == [2] * 5 + [1] * 4
    x = pt.zeros(5 * E, placement=[1])
    assert x.where() == {1: 5 * SLAB}
    assert x[E:E + 3].where() == {1: SLAB}
    # balanced: the member with most free memory first
    hog = pt.zeros(30 * E, placement=[1])
    b = pt.zeros(6 * E, placement="balanced")
    assert 1 not in b.where()
    del hog, b
    with pytest.raises(ValueError):
        pt.zeros(3, placement=[3])
    with pytest.raises(ValueError):
        pt.zeros(3, placement="everywhere")


def test_access_modes_are_enforced_where_the_memory_lives(fresh):
    pool = fresh
    ref = np.arange(3 * E, dtype=np.float64)
    r = pt.from_numpy(ref, access="readonly", placement="interleave")
    assert r.access == "readonly"
    np.testing.assert_array_equal(r.to_numpy(), ref)
    with pytest.raises(ValueError, match="read-only"):
        r[1] = 0
    # the member's memory refuses writes through the readonly window, whoever tries
    with pytest.raises(RemoteAccessError, match="read-only"):
        pool.win_ro.put(1, r._a.slots[1] * SLAB, np.zeros(8, np.uint8))
    np.testing.assert_array_equal(r.to_numpy(), ref)
    # zero-copy views of local readonly memory are read-only numpy arrays
    v = r[0:4].to_numpy()
    assert not v.flags.writeable
    with pytest.raises(ValueError):
        v[0] = 1
    # private arrays live on the calling member, in memory that no window exposes
    p = pt.from_numpy(ref, access="private", placement="interleave")
    assert set(p.slab_members) == {0} and p._a.heap == "pv"
    heap = pool.local["pv"]
    assert all(w is None or w.buffer is not heap for w in (pool.win_rw, pool.win_ro,
                                                           pool.win_ro_init))
    p[5] = -1
    assert p[5] == -1 and p[6] == 6
    with pytest.raises(ValueError, match="access"):
        pt.zeros(3, access="public")


def test_out_of_memory_then_reuse_after_free(fresh):
    pool = fresh
    gc.collect()            # arrays of earlier tests left in reference cycles: freed now, not
    pool.collect_frees()    # in the middle of this test's accounting
    free0 = pool.free_bytes()
    big = pt.zeros(600 * E)                          # 600 of the 768 slabs
    with pytest.raises(pt.PoolOutOfMemory) as e:
        pt.zeros(200 * E)
    err = e.value
    assert isinstance(err, MemoryError) and isinstance(err, PooltensorError)
    assert set(err.free) == {0, 1, 2} and sum(err.free.values()) == sum(free0) - 600 * SLAB
    assert "member 0" in str(err) and "member 2" in str(err)
    with pytest.raises(pt.PoolOutOfMemory):
        pt.zeros(100 * E, placement=[0])             # an explicit list does not spill
    small = pt.ones(160 * E, placement="local")      # spills past member 0
    assert set(small.where()) != {0}
    st = pool.stats()
    assert sum(m["used"] for m in st["members"]) >= 760 * SLAB
    del big, small
    assert pool.free_bytes() == free0                # freed (at the next safe point)
    st = pool.stats()
    assert all(m["fragmentation"]["readwrite"] == 0.0 for m in st["members"])
    x = pt.zeros(760 * E)                            # the whole pool again, reused
    assert x[-1] == 0.0
    del x


def test_huge_requests_fail_at_once(fresh):
    """A request the pool could never hold is PoolOutOfMemory at once (nothing made per slab
    first), whatever its size and placement; one numpy itself could never make is numpy's
    ValueError, word for word."""
    pool = fresh
    gc.collect()             # arrays of earlier tests still held by cycles: freed now, not
    pool.collect_frees()     # in the middle of this test
    free0 = pool.free_bytes()
    cases = [((1 << 36,), {}), (((1 << 20), 1 << 29), {}), ((1 << 62,), {}),
             ((1 << 62,), {"placement": "interleave"}), ((1 << 62,), {"placement": [1, 2]}),
             ((1 << 62,), {"placement": "balanced"}), ((1 << 62,), {"placement": "local"}),
             ((1 << 62,), {"access": "readonly"}), ((1 << 62,), {"access": "private"}),
             ((1 << 40,), {"access": "private"})]
    for shape, kw in cases:
        t0 = time.monotonic()
        with pytest.raises(pt.PoolOutOfMemory, match="could ever hold") as e:
            pt.empty(shape, np.uint8, **kw)
        assert time.monotonic() - t0 < 0.2, (shape, kw)
        assert e.value.needed == int(np.prod(shape, dtype=object)), e.value.needed
    for shape, dtype in (((1 << 60,), np.float64), ((1 << 40, 1 << 40), np.uint8),
                         ((1 << 62, 4), np.int16), ((3, 1 << 62), np.complex128)):
        with pytest.raises(ValueError) as ref:
            np.empty(shape, dtype)
        t0 = time.monotonic()
        with pytest.raises(ValueError) as e:
            pt.empty(shape, dtype)
        assert time.monotonic() - t0 < 0.2
        assert str(e.value) == str(ref.value) and not isinstance(e.value, MemoryError)
    assert pool.free_bytes() == free0
    assert pt.zeros(10)[9] == 0.0                     # the pool is untouched


def test_zeros_after_reuse_are_zero(fresh):
    a = pt.full(20 * E, 7.0)
    del a
    b = pt.zeros(20 * E)
    assert not b.to_numpy().any()


def test_tight_cache_evicts_and_stays_correct(fresh):
    pool = fresh
    pool.cache.resize(4 * SLAB)
    ref = np.random.default_rng(1).standard_normal(60 * E)
    x = pt.from_numpy(ref, placement=[1, 2])
    rng = np.random.default_rng(2)
    for _ in range(300):
        i = int(rng.integers(0, ref.size - 50))
        j = i + int(rng.integers(1, 50))
        np.testing.assert_array_equal(x[i:j].to_numpy(), ref[i:j])
        assert x[j] == ref[j]
    np.testing.assert_array_equal(x[::7].to_numpy(), ref[::7])
    c = pool.cache.stats()
    assert c["evictions"] > 100 and c["cached_slabs"] <= 4 and c["overcommit"] == 0


def test_pinned_blocks_survive_eviction(fresh):
    pool = fresh
    pool.cache.resize(4 * SLAB)
    ref = np.arange(40 * E, dtype=np.float64)
    x = pt.from_numpy(ref, placement=[2])
    held = []
    for i, (start, blk) in enumerate(x.blocks(with_index=True)):
        assert not blk.flags.writeable
        if i % 10 == 0:
            held.append((start, blk, blk[3:9]))          # a view of a block pins it too
    del blk
    assert pool.cache.stats()["pinned"] == len(held)
    y = pt.from_numpy(ref[::-1].copy(), placement=[1])   # churn the cache
    np.testing.assert_array_equal(y.to_numpy(), ref[::-1])
    for start, blk, part in held:
        np.testing.assert_array_equal(blk, ref[start:start + E])
        np.testing.assert_array_equal(part, ref[start + 3:start + 9])
    only = [h[2] for h in held]
    del held, start, blk, part
    assert pool.cache.stats()["pinned"] == len(only)     # the slices still pin
    del only
    assert pool.cache.stats()["pinned"] == 0
    assert pool.cache.nframes <= pool.cache.max_frames + 4


def test_write_through_updates_the_cached_copy(fresh):
    pool = fresh
    x = pt.zeros(4 * E, placement=[1])
    assert x[10] == 0                                    # slab 0 now cached
    x[10] = 5.0
    x[::9] = 3.0
    misses = pool.cache.misses
    assert x[10] == 5.0 and x[9] == 3.0
    assert pool.cache.misses == misses                   # served from the (updated) cache
    pool.cache.clear()
    assert x[10] == 5.0 and x[18] == 3.0 and x[11] == 0  # and the home has them too


def test_prefetch_sequential_scan_hits(fresh):
    pool = fresh
    pool.cache.resize(16 * SLAB)
    ref = np.arange(100 * E, dtype=np.float64)
    x = pt.from_numpy(ref, placement=[1])
    pool.cache.clear()
    pool.cache.reset_counters()
    for k in range(100):
        assert x[k * E:(k + 1) * E].to_numpy()[7] == ref[k * E + 7]
    c = pool.cache.stats()
    assert c["hit_rate"] >= 0.9, c
    assert c["prefetch_accuracy"] >= 0.9, c
    # blocks(): everything but the first slab was already asked for
    pool.cache.clear()
    pool.cache.reset_counters()
    total = sum(float(b.sum()) for b in x.blocks())
    assert total == float(ref.sum())
    c = pool.cache.stats()
    assert c["hit_rate"] >= 0.95 and c["prefetch_issued"] >= 90, c


def test_prefetch_strided_and_random(fresh):
    pool = fresh
    pool.cache.resize(16 * SLAB)
    x = pt.arange(200 * E, dtype=np.float64, placement=[2])
    pool.cache.clear()
    pool.cache.reset_counters()
    for k in range(0, 200, 5):                           # every 5th slab
        assert x[k * E + 1] == k * E + 1
    c = pool.cache.stats()
    assert c["hit_rate"] >= 0.8 and c["prefetch_accuracy"] >= 0.8, c
    pool.cache.clear()
    pool.cache.reset_counters()
    for k in np.random.default_rng(5).permutation(200)[:60]:
        assert x[int(k) * E] == k * E
    c = pool.cache.stats()
    assert c["prefetch_issued"] <= 10, c                 # random: the window stays shut
    assert x.prefetch(slice(0, 3 * E)) == 3
    pool.cache.reset_counters()
    assert x[E + 2] == E + 2 and pool.cache.stats()["prefetch_used"] == 1


def test_init_twice_finalize_and_closed(pool):
    assert pt.init() is pool
    with pytest.raises(ValueError, match="already initialized"):
        pt.init(members=2)
    with pytest.raises(ValueError, match="already initialized"):
        pt.init(slab_size=128)


def test_init_again_must_agree_and_arguments_are_checked(pool):
    same = dict(members=3, slab_size=SLAB, memory=256 * SLAB, cache_bytes=8 * SLAB,
                placement="block", materialize_limit=pool.materialize_limit,
                advanced_limit=pool.advanced_limit, attach=False, timeout=pool.timeout)
    assert pt.init(**same) is pool and pt.init(members=np.int64(3)) is pool
    for name, other in [("cache_bytes", 16 * SLAB), ("placement", "interleave"),
                        ("placement", [1, 2]), ("memory", 512 * SLAB),
                        ("materialize_limit", 1 << 20), ("advanced_limit", 0),
                        ("attach", True), ("timeout", pool.timeout + 1)]:
        with pytest.raises(ValueError, match=rf"already initialized with {name}=.*, not "
                                             rf"{name}=.*pooltensor\.finalize\(\) first"):
            pt.init(**{name: other})
    with pytest.raises(ValueError, match="already initialized without memory servers"):
        pt.init(connect=["127.0.0.1:1"])
    # arguments are checked as Python and numpy check theirs (with or without a pool)
    with pytest.raises(TypeError) as ref:
        range(2.5)
    with pytest.raises(TypeError, match=f"members: {ref.value}"):
        pt.init(members=2.5)
    cases = [(dict(members="2"), TypeError, "members: 'str' object cannot be interpreted"),
             (dict(members=0), ValueError, "members must be >= 1"),
             (dict(cache_bytes=-1), ValueError, "cache_bytes must be >= 0, not -1"),
             (dict(cache_bytes=1e6), TypeError, "cache_bytes: 'float' object"),
             (dict(memory=-5), ValueError, "memory must be >= 1"),
             (dict(memory=1.5e9), TypeError, "memory: 'float' object"),
             (dict(slab_size=4096.0), TypeError, "slab_size: 'float' object"),
             (dict(slab_size=-64), ValueError, "positive multiple of 64"),
             (dict(materialize_limit=-1), ValueError, "materialize_limit must be >= 0"),
             (dict(advanced_limit=2.0), TypeError, "advanced_limit: 'float' object"),
             (dict(timeout="5"), TypeError, "timeout must be a number of seconds"),
             (dict(timeout=-1), ValueError, "timeout must be a positive number"),
             (dict(attach="yes"), TypeError, "attach must be True, False or None")]
    for kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            pt.init(**kw)
    assert pt.current() is pool


def test_embedded_default_and_finalize_stops_members(pool):
    procs = list(pool._procs)
    x = pt.zeros(3)
    pt.finalize()
    for p in procs:
        assert p.wait(10) == 0
    with pytest.raises(pt.PoolClosed):
        x[0]
    q = pt.current()                                     # the embedded default: one member
    assert q.size == 1 and q.role == "plain" and q is not pool
    y = pt.arange(10)
    assert y[3] == 3
    pt.finalize()


def test_members_exit_when_the_script_dies():
    """A script that is SIGKILLed leaves no member running."""
    p = subprocess.run([sys.executable, str(SCRIPTS / "pool_orphan.py")], env=rank_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == -signal.SIGKILL, p.stderr
    pids = [int(t) for t in p.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        if not alive:
            break
        time.sleep(0.1)
    assert not alive, f"members still running: {alive}"


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False
