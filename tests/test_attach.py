"""Same-machine slabs in place (pool.mapped / mapped_w), against the copying path
(attach=False) and numpy; x[i] memos under writes and invalidation; populate(); the
huge-page warning."""
import ctypes
import mmap
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pooltensor as pt
from conftest import SLAB, pool_fixture, property_settings
from pooltensor.cache import populate as pop
from pooltensor.errors import HugePageWarning, PoolClosed
from pooltensor.pool import mapping

pytestmark = pytest.mark.timeout(120)

pool = pool_fixture(("2members-mapped", {"members": 2, "attach": True}),
                    ("2members-copy", {"members": 2, "attach": False}),
                    ("3members-mapped", {"members": 3}))
SETTINGS = property_settings("POOLTENSOR_ATTACH_EXAMPLES", 40, "POOLTENSOR_DERANDOMIZE")
N = 40 * SLAB // 8                 # float64 elements: 40 slabs over the members


def _home_bytes(pool, x):
    """x's bytes read at their homes with Window.get, slab by slab (the raw reference)."""
    a, S = x._a, pool.slab_size
    out = np.empty(a.nbytes, np.uint8)
    for k in range(len(a.members)):
        n = a.slab_len(k)
        dst = out[k * S:k * S + n]
        if a.members[k] == pool.me:
            dst[...] = pool.local[a.heap][a.slots[k] * S:a.slots[k] * S + n]
        else:
            pool.read_win[a.heap].get(a.members[k], a.slots[k] * S, dst)
    return out


def test_mapping_is_the_default_and_follows_attach(pool):
    others = [m for m in range(pool.size) if m != pool.me]
    if pool.world.transports[1] != "shm":
        pytest.skip("members are not on shared memory")
    mapped = sorted(m for (h, m) in pool.mapped if h == "rw")
    if pool.mapped:
        assert mapped == others and sorted(m for (h, m) in pool.mapped_w if h == "rw") == others
        assert all(not v.flags.writeable for v in pool.mapped.values())
        assert all(v.flags.writeable for v in pool.mapped_w.values())
        assert {h for h, _ in pool.mapped_w} == {"rw", "ro"}     # the script initializes ro
    else:
        assert pool.mapped_w == {}


@SETTINGS
@given(ops=st.lists(st.tuples(st.sampled_from(["slice", "scalar", "fancy", "setslice",
                                               "setscalar", "setfancy"]),
                              st.integers(-N, N - 1), st.integers(-N, N),
                              st.integers(1, 7), st.floats(-1e6, 1e6)),
                    min_size=1, max_size=25),
       placement=st.sampled_from(["block", "interleave", "balanced", [0], [1]]))
def test_reads_and_writes_give_numpys_bytes(pool, ops, placement):
    ref = np.random.default_rng(len(ops)).random(N)
    x = pt.asarray(ref.copy(), placement=placement)
    fetched = pool.cache.bytes_fetched
    for op, i, j, step, v in ops:
        sl = slice(i, j, step)
        if op == "slice":
            np.testing.assert_array_equal(x[sl].to_numpy(), ref[sl])
        elif op == "scalar":
            got = x[i]
            assert type(got) is np.float64 and got == ref[i]
        elif op == "fancy":
            idx = np.arange(i, N, step * 3) % N
            np.testing.assert_array_equal(x[idx], ref[idx])
        elif op == "setslice":
            vals = np.arange(len(ref[sl]), dtype=np.float64) + v
            x[sl] = vals
            ref[sl] = vals
        elif op == "setscalar":
            x[i] = v
            ref[i] = v
        else:
            idx = np.arange(i, N, step * 5) % N
            x[idx] = v
            ref[idx] = v
    assert _home_bytes(pool, x).tobytes() == ref.tobytes()    # every write landed at home
    np.testing.assert_array_equal(x.to_numpy(), ref)
    assert all(x[k] == ref[k] for k in range(0, N, 7))
    if pool.mapped:           # same-machine slabs never went through the cache
        assert pool.cache.bytes_fetched == fetched
    del x


@pytest.mark.parametrize("placement", ["interleave", [1]])
def test_readonly_arrays_are_initialized_at_home(pool, placement):
    ref = np.random.default_rng(3).standard_normal(N)
    x = pt.asarray(ref, access="readonly", placement=placement)
    assert x.access == "readonly"
    assert _home_bytes(pool, x).tobytes() == ref.tobytes()
    np.testing.assert_array_equal(x.to_numpy(), ref)
    assert x[N - 1] == ref[N - 1] and x[3] == ref[3]
    with pytest.raises(ValueError, match="read-only"):
        x[0] = 1.0
    if pool.size > 1:          # the members refuse a put into their ro heaps themselves
        with pytest.raises(Exception):
            pool.win_ro.put(1, 0, np.zeros(8, np.uint8))
    del x


def test_scalar_memo_sees_writes_and_invalidation(pool):
    ref = np.arange(N, dtype=np.float64)
    x = pt.asarray(ref.copy(), placement="interleave")
    a, S = x._a, pool.slab_size
    E = S // 8
    k = next(k for k in range(len(a.members)) if a.members[k] != pool.me)
    i = k * E + 3
    assert x[i] == i and x[i + 1] == i + 1                 # remembered now
    x[i] = -1.0                                             # through x[...] =
    assert x[i] == -1.0
    x[k * E:(k + 1) * E] = np.full(E, 7.0)
    assert x[i] == 7.0 and x[i + 1] == 7.0
    # a member writes its own slab behind this process's back (as members do when they
    # compute): the home's bytes change, then the cache entry, if any, is invalidated
    m, slot = a.members[k], a.slots[k]
    pool.win_rw.put(m, slot * S + 3 * 8, np.array([42.0]))
    pool.cache.discard_keys([("rw", m, slot)])
    assert x[i] == 42.0
    for j in range(0, N, E):                                # evict everything, then again
        x[j]
    assert x[i] == 42.0 and x[i + 1] == 7.0
    y = x[1::2]                                             # another view, same allocation
    j = (i - 1) // 2
    assert y[j] == x[1 + 2 * j] and y[-1] == x[N - 1 if N % 2 == 0 else N - 2]
    del x, y


def test_scalar_reads_refuse_after_finalize():
    pt.finalize()
    p = pt.init(members=2, slab_size=SLAB, memory=8 << 20, cache_bytes=8 * SLAB)
    try:
        x = pt.asarray(np.arange(N, dtype=np.float64), placement=[0])
        y = pt.asarray(np.arange(N, dtype=np.float64), placement=[1])
        z = pt.asarray(np.arange(N, dtype=np.float64), placement="interleave")
        assert x[5] == 5 and y[6] == 6 and z[7] == 7 and z[N - 1] == N - 1
        assert x[-1] == N - 1 and y[-N] == 0
        ref = np.arange(N, dtype=np.float64)
        for arr in (x, y, z):                   # one run, another member's, both (parts)
            for v, r in ((arr, ref), (arr[::-3], ref[::-3]), (arr[5:-7:2], ref[5:-7:2])):
                assert [v[i] for i in range(-len(r), len(r))] == list(r) * 2
        w = pt.asarray(np.arange(N, dtype=np.int16), placement="block")
        assert [w[i] for i in range(N)] == list(range(N))
        assert (z._parts is not None, x._np is not None, y._np is not None) == (
            bool(p.mapped), True, bool(p.mapped))
        with pytest.raises(IndexError, match=f"index {N} is out of bounds for axis 0"):
            x[N]
        with pytest.raises(IndexError):
            y[-N - 1]
    finally:
        pt.finalize()
    assert p.closed
    for arr in (x, y, z):
        with pytest.raises(PoolClosed):
            arr[5]


# -- populate --------------------------------------------------------------------------------

def test_populate_on_a_mapping_keeps_bytes_and_takes_unaligned_ranges(pool):
    if not pool.mapped:
        pytest.skip("nothing mapped (attach=False)")
    view = pool.mapped[("rw", 1)]
    wview = pool.mapped_w[("rw", 1)]
    rng = np.random.default_rng(5)
    for lo, hi in [(1, 3 * pop.PAGE + 17), (pop.PAGE - 1, 2 * pop.PAGE + 1), (123, 200),
                   (5 * pop.PAGE + 3, 9 * pop.PAGE - 5)]:
        data = rng.integers(0, 256, hi - lo + 64, dtype=np.uint8)
        wview[lo - 1:hi + 63] = data                     # bytes on both sides of the range
        before = bytes(view[:12 * pop.PAGE])
        for write in (False, True):
            pop.populate(wview if write else view, lo, hi, write=write)
        assert bytes(view[:12 * pop.PAGE]) == before
        assert bytes(view[lo - 1:hi + 63]) == data.tobytes()
    if pop.available():
        n = pop.calls()
        assert pop.populate(view, 7 * pop.PAGE + 1, 10 * pop.PAGE - 1)
        assert pop.populate(view, 7 * pop.PAGE + 9, 9 * pop.PAGE)      # remembered
        assert pop.calls() == n + 1
    assert not pop.populate(view, 10, 20)               # inside one page: nothing to do
    assert not pop.populate(view, 20, 10)


def test_populate_refused_is_quiet(monkeypatch):
    mm = mmap.mmap(-1, 16 * pop.PAGE)
    buf = np.frombuffer(mm, np.uint8)
    buf[:] = 9
    seen = []

    def refuse(addr, n, advice):
        seen.append((addr, n, advice))
        ctypes.set_errno(22)
        return -1
    monkeypatch.setattr(pop, "_madvise", refuse)
    monkeypatch.setattr(pop, "_refused", {pop.MADV_POPULATE_READ: False,
                                          pop.MADV_POPULATE_WRITE: False})
    assert not pop.populate(buf, 3, 5 * pop.PAGE + 1)
    assert not pop.populate(buf, 3, 5 * pop.PAGE + 1)    # not asked again
    assert len(seen) == 1 and seen[0][2] == pop.MADV_POPULATE_READ
    assert seen[0][0] % pop.PAGE == 0 and seen[0][1] == 6 * pop.PAGE    # page-aligned
    assert not pop.available() and pop.available(write=True)
    assert (buf == 9).all()


def test_populate_write_on_fresh_memory():
    mm = mmap.mmap(-1, 64 * pop.PAGE)
    buf = np.frombuffer(mm, np.uint8)
    pop.populate(buf, 100, 40 * pop.PAGE - 3, write=True)
    assert not buf.any()                                 # still zeros
    buf[100:200] = 1
    assert int(buf.sum()) == 100
    pop.forget(buf)
    del buf
    mm.close()


# -- the huge-page warning -------------------------------------------------------------------

def test_huge_page_warning_once_per_process(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLTENSOR_THP_WARNING", "1")
    monkeypatch.setattr(mapping, "_warned", [False])
    off, on = tmp_path / "off", tmp_path / "on"
    off.write_text("always within_size advise [never] deny force\n")
    on.write_text("always within_size [advise] never deny force\n")
    assert mapping.thp_setting(str(off)) == "never" and mapping.thp_setting(str(on)) == "advise"
    assert mapping.thp_setting(str(tmp_path / "none")) is None
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert not mapping.check_huge_pages(str(on), kind="memfd")
        assert not mapping.check_huge_pages(str(off), kind="tmpfs")   # huge pages of its own
        assert mapping.check_huge_pages(str(off), kind="memfd") == sys.platform.startswith(
            "linux")
        assert not mapping.check_huge_pages(str(off), kind="memfd")   # once per process
    ours = [w for w in got if issubclass(w.category, HugePageWarning)]
    assert len(ours) == (1 if sys.platform.startswith("linux") else 0)
    if ours:
        text = str(ours[0].message)
        assert f"echo advise > {off}" in text and "only a speed matter" in text
    monkeypatch.setattr(mapping, "_warned", [False])
    monkeypatch.setenv("POOLTENSOR_THP_WARNING", "0")
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert not mapping.check_huge_pages(str(off), kind="memfd")
    assert not got


@pytest.mark.parametrize("segments", ["memfd", "auto"])
def test_huge_page_warning_in_a_script(segments):
    """Once per process when pool memory gets no huge pages: memfds with shmem huge pages
    off; not where the segments come from the private huge tmpfs (auto, where it works)."""
    code = ("import warnings, pooltensor as pt\n"
            "from collectives.native import segment_kind\n"
            "warnings.simplefilter('always')\n"
            "for _ in range(2):\n"
            "    pt.init(members=2, memory=1 << 22)\n"
            "    pt.finalize()\n"
            "print(segment_kind())\n")
    env = dict(os.environ, POOLTENSOR_THP_WARNING="1", POOLTENSOR_TIMEOUT="30",
               POOLTENSOR_SEGMENTS=segments)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=90)
    assert p.returncode == 0, p.stderr
    value = mapping.thp_setting()
    off = sys.platform.startswith("linux") and value is not None and value not in mapping.THP_ON
    kind = p.stdout.split()[-1]
    assert kind in ("memfd", "tmpfs", "shm_open") and (segments == "auto" or kind != "tmpfs")
    assert p.stderr.count("HugePageWarning") == (1 if off and kind != "tmpfs" else 0), p.stderr
