"""The pool's pure parts, without processes: slab allocator, placement policies, index
arithmetic (the slab pieces of a view cover exactly its bytes)."""
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pooltensor import placement
from pooltensor.cache import layout
from pooltensor.pool.alloc import SlabAllocator

pytestmark = pytest.mark.timeout(120)


def _runs(slots):
    """Sorted slots as coalesced runs [(start, length), ...]."""
    runs = []
    for s in sorted(slots):
        if runs and runs[-1][0] + runs[-1][1] == s:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((s, 1))
    return runs


def _model_alloc(free, k, hwm):
    """What the allocator must hand out for k slabs from free runs `free` when slabs below
    `hwm` were handed out before (touched): the shortest touched run that is long enough (the
    first of equals); else, if the touched slabs are enough, the largest touched runs first,
    sorted; else every touched slab and the first fresh ones from hwm on."""
    touched = [(st_, max(0, min(st_ + ln, hwm) - st_)) for st_, ln in free]
    fits = [(ln, i) for i, (_, ln) in enumerate(touched) if ln >= k]
    if fits:
        return [(free[min(fits)[1]][0], k)]
    if sum(ln for _, ln in touched) < k:
        have = {s for st_, ln in touched for s in range(st_, st_ + ln)}
        return _runs(have | set(range(hwm, hwm + k - len(have))))
    free, runs, left = [r for r in touched if r[1]], [], k
    while left:
        i = max(range(len(free)), key=lambda j: free[j][1])
        start, ln = free[i]
        take = min(left, ln)
        runs.append((start, take))
        free[i] = (start + take, ln - take)
        left -= take
    return sorted(runs)


@settings(max_examples=400, deadline=None)
@given(n=st.integers(1, 64), ops=st.lists(st.tuples(st.booleans(), st.integers(1, 20)),
                                          max_size=60))
def test_allocator_against_a_model(n, ops):
    a = SlabAllocator(n)
    owned = []
    used = set()
    for do_alloc, k in ops:
        if do_alloc:
            free, hwm = a.free_runs(), a.hwm
            twin = SlabAllocator.from_state(pickle.loads(pickle.dumps(a.state())))
            runs = a.alloc(k)
            assert twin.alloc(k) == runs and twin.state() == a.state()   # allocates in step
            if k > n - len(used):
                assert runs is None
                continue
            slabs = {s for st_, ln in runs for s in range(st_, st_ + ln)}
            assert len(slabs) == k and not slabs & used and all(0 <= s < n for s in slabs)
            assert runs == _model_alloc(free, k, hwm), (free, k, hwm, runs)
            assert a.hwm == max([hwm] + [st_ + ln for st_, ln in runs])
            used |= slabs
            owned.append(runs)
        elif owned:
            runs = owned.pop(k % len(owned))
            a.free(runs)
            used -= {s for st_, ln in runs for s in range(st_, st_ + ln)}
        assert a.nfree == n - len(used)
        free = {s for st_, ln in a.free_runs() for s in range(st_, st_ + ln)}
        assert free == set(range(n)) - used
        runs = a.free_runs()
        assert all(runs[i][0] + runs[i][1] < runs[i + 1][0] for i in range(len(runs) - 1)), \
            "free runs must be coalesced"
    for runs in owned:
        a.free(runs)
    assert a.free_runs() == [(0, n)] and a.fragmentation() == 0.0


def test_allocator_best_fit_double_free_and_hwm():
    a = SlabAllocator(10)
    r1, r2, r3 = a.alloc(3), a.alloc(2), a.alloc(3)
    assert (r1, r2, r3) == ([(0, 3)], [(3, 2)], [(5, 3)]) and a.hwm == 8
    a.free(r2)
    assert a.alloc(2) == [(3, 2)]          # best fit: the hole, not the tail
    a.free(r1)
    a.free(r3)
    assert a.fragmentation() > 0
    with pytest.raises(ValueError, match="already free"):
        a.free(r1)
    assert a.alloc(7) == [(0, 3), (5, 4)]  # every touched slab (below 8), then fresh ones
    assert a.hwm == 9 and a.alloc(1) == [(9, 1)] and a.alloc(1) is None
    b = SlabAllocator(20)                  # holes of 5 and 2 ahead of the tail
    parts = [b.alloc(k) for k in (5, 1, 2, 1)]
    b.free(parts[0])
    b.free(parts[2])
    assert b.free_runs() == [(0, 5), (6, 2), (9, 11)]
    assert b.alloc(2) == [(6, 2)]          # best fit: the shortest run enough, not the first
    assert b.alloc(4) == [(0, 4)]


def test_allocator_hands_out_touched_slabs_first():
    a = SlabAllocator(100)
    parts = [a.alloc(k) for k in (3, 1, 2, 1, 4)]      # slabs 0..10 touched
    assert a.hwm == 11
    for i in (0, 2, 4):
        a.free(parts[i])
    assert a.free_runs() == [(0, 3), (4, 2), (7, 93)]   # the tail run starts at 7 < hwm
    assert a.alloc(4) == [(7, 4)]          # the touched part of the tail, not fresh 11..14
    assert a.hwm == 11
    assert a.alloc(4) == [(0, 3), (4, 1)]  # no touched run is enough: largest touched first
    assert a.hwm == 11
    assert a.alloc(3) == [(5, 1), (11, 2)]  # the last touched slab, then fresh ones
    assert a.hwm == 13
    b = SlabAllocator(100)                 # the same calls give the same slabs
    for k in (3, 1, 2, 1, 4):
        b.alloc(k)
    for r in ([(0, 3)], [(4, 2)], [(7, 4)]):
        b.free(r)
    assert [b.alloc(4), b.alloc(4), b.alloc(3)] == [[(7, 4)], [(0, 3), (4, 1)],
                                                    [(5, 1), (11, 2)]]


def test_placement_policies():
    free = [10, 10, 10]
    assert placement.plan("block", 7, free, 0) == [0, 0, 0, 1, 1, 2, 2]
    assert placement.plan("interleave", 5, free, 0) == [0, 1, 2, 0, 1]
    assert placement.plan("local", 3, free, 2) == [2, 2, 2]
    assert placement.plan((2, 0), 5, free, 1) == [2, 2, 2, 0, 0]
    assert placement.plan("balanced", 7, [1, 9, 4], 0) == [1, 1, 1, 1, 1, 1, 2]
    assert placement.water_fill(9, [1, 9, 4]) == [0, 7, 2]
    assert placement.spill([0, 0, 0, 1], [2, 5, 5], range(3)) == [0, 0, 2, 1]  # most room
    assert placement.spill([0, 0, 0], [1, 1, 0], (0, 1)) is None
    for bad, err in [("nope", ValueError), ([3], ValueError), ([], ValueError),
                     ([1, 1], ValueError), (5, TypeError)]:
        with pytest.raises(err):
            placement.check(bad, 3)


@st.composite
def views(draw):
    itemsize = draw(st.sampled_from([1, 2, 4, 8, 16]))
    slab = 64 * draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=0, max_size=4)))
    base = np.empty(shape, dtype=f"V{itemsize}") if shape else np.empty((), f"V{itemsize}")
    idx = tuple(draw(st.sampled_from([slice(None), slice(None, None, -1), slice(1, None, 2),
                                      slice(None, None, 3)])) for _ in shape)
    perm = draw(st.permutations(range(len(shape))))
    return base, idx, perm, itemsize, slab


@settings(max_examples=300, deadline=None)
@given(v=views())
def test_decompose_covers_exactly_the_view(v):
    base, idx, perm, itemsize, slab = v
    view = base[idx].transpose(perm) if base.ndim else base
    if view.size == 0:
        return
    b0 = base.__array_interface__["data"][0]
    off = view.__array_interface__["data"][0] - b0
    # every element's byte offset, straight from numpy
    want = np.zeros(view.shape, np.int64) + off
    for d, (n, s) in enumerate(zip(view.shape, view.strides)):
        want = want + (np.arange(n) * s).reshape([-1 if i == d else 1 for i in range(view.ndim)])
    noff, nshape, nstrides, order, flips = layout.normalize(off, view.shape, view.strides)
    target = np.full(view.shape, -1, np.int64)
    cn = layout.counterpart(target, view.shape, order, flips)
    for p in layout.decompose(noff, nshape, nstrides, itemsize, slab):
        if p[0] == layout.SLAB:
            _, k, o, sh, st_, sel = p
            got = np.zeros(sh, np.int64) + k * slab + o
            for d, (n, s) in enumerate(zip(sh, st_)):
                got = got + (np.arange(n) * s).reshape([-1 if i == d else 1
                                                        for i in range(len(sh))])
            assert got.min() // slab == k and got.max() // slab == k
            blk = cn[sel] if sel else cn
            assert (blk == -1).all(), "pieces overlap"
            blk[...] = got
        else:
            _, lo, hi, sel = p
            blk = cn[sel] if sel else cn
            assert (blk == -1).all()
            blk[...] = np.arange(lo, hi, itemsize).reshape(blk.shape)
    np.testing.assert_array_equal(target, want)
