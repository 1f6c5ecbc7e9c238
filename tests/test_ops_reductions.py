"""Reductions and matrix products of pool arrays against numpy.

Property tests (tests/scripts/ops_reduce_cases.py: shapes up to 4-D, every axis form,
keepdims, dtype=, ddof, views starting mid-slab, strided, reversed, transposed) run in this
process on pools of 1, 2 and 3 members (a plain script; slabs of 64 bytes, so a few elements
each, and a cache of 8 slabs), the 2-member pool with advanced_limit=64 so that nearly every
reduced array comes back as a pool array (the output-driven path). The SPMD script runs the
same cases on 2 and 3 ranks under mpiexec and the launcher and checks that every rank holds
the same bytes.
"""
import numpy as np
import pytest
from hypothesis import given

import ops_reduce_cases as rc
import pooltensor as pt
from conftest import SLAB, PAIRED_RUNS, check_ranks, pool_fixture, property_settings

PROPS = property_settings("OPS_EXAMPLES", 150, "OPS_DERANDOMIZE")

pytestmark = pytest.mark.timeout(300)

pool = pool_fixture(1, ("2members-poolresults", {"members": 2, "advanced_limit": 64}), 3)


@PROPS
@given(case=rc.reduction_case())
def test_reductions_match_numpy(pool, case):
    rc.check_reduction(case, pt, pool.advanced_limit)


@PROPS
@given(case=rc.matmul_case())
def test_matmul_matches_numpy(pool, case):
    rc.check_matmul(case, pt, pool.advanced_limit)


def test_ufunc_reduce_routes_here(pool):
    ref = np.arange(60, dtype=np.int16).reshape(3, 4, 5) - 20
    x = pt.from_numpy(ref)
    for uf in (np.add, np.multiply, np.minimum, np.maximum, np.bitwise_or, np.logical_and):
        for axis in (0, -1, None, (0, 2)):
            got = uf.reduce(x, axis=axis)
            want = uf.reduce(ref, axis=axis)
            g = got.to_numpy() if isinstance(got, pt.ndarray) else got
            assert np.asarray(g).dtype == np.asarray(want).dtype
            np.testing.assert_array_equal(g, want)
    assert np.add.reduce(x, keepdims=True).shape == (1, 4, 5)      # ufunc.reduce: axis=0


def test_numpy_errors(pool):
    x = pt.zeros((3, 4))
    for fn in (np.sum, np.mean, np.min, np.argmax, np.std):
        with pytest.raises(np.exceptions.AxisError):
            fn(x, axis=2)
    with pytest.raises(ValueError):
        x.sum(axis=(0, 0))
    e = pt.zeros((0, 3))
    with pytest.raises(ValueError):
        e.min()
    with pytest.raises(ValueError):
        e.argmax()
    assert e.sum() == 0 and e.sum().dtype == np.float64
    np.testing.assert_array_equal(e.max(axis=0, initial=-1.0), np.full(3, -1.0))
    np.testing.assert_array_equal(e.sum(axis=0), np.zeros(3))
    with pytest.warns(RuntimeWarning):
        assert np.isnan(e.mean())
    with pytest.warns(np.exceptions.ComplexWarning):            # as numpy
        assert pt.ones(3, np.complex128).sum(dtype=np.int64) == 3
    with pytest.raises(TypeError):
        pt.ones(3).sum(axis=1.5)
    with pytest.raises(ValueError):
        pt.ones((3, 4)) @ pt.ones((3, 4))
    with pytest.raises(ValueError):
        np.dot(pt.ones((3, 4)), np.ones(5))
    with pytest.raises(ValueError):
        pt.ones(3) @ 2.0                                       # matmul takes no scalars
    with pytest.warns(pt.FallbackWarning):                     # stacks of matrices: numpy's
        r = pt.ones((2, 3, 4)) @ np.ones((2, 4, 5))
    np.testing.assert_array_equal(r, np.full((2, 3, 5), 4.0))


def test_results_scalars_out_and_initial(pool):
    ref = np.arange(24, dtype=np.int8).reshape(2, 3, 4)
    x = pt.from_numpy(ref)
    s = x.sum()
    assert isinstance(s, np.int64) and s == ref.sum()        # int8 sums in int64, as numpy
    assert isinstance(x.mean(), np.float64)
    assert isinstance(pt.from_numpy(ref.astype(np.float32)).sum(), np.float32)
    assert x.argmax(axis=1, keepdims=True).shape == (2, 1, 4)
    out = np.empty(4)
    assert x.sum(axis=(0, 1), out=out) is out
    np.testing.assert_array_equal(out, ref.sum(axis=(0, 1)))
    pout = pt.zeros((2, 4), np.int64)
    assert np.max(x, axis=1, out=pout) is pout
    np.testing.assert_array_equal(pout.to_numpy(), ref.max(axis=1))
    assert x.sum(initial=100) == ref.sum(initial=100)
    np.testing.assert_array_equal(x.min(axis=0, initial=3), ref.min(axis=0, initial=3))
    assert np.var(x, correction=1) == pytest.approx(np.var(ref, ddof=1))


def test_nan_semantics_and_first_occurrence(pool):
    ref = np.array([3.0, 1.0, np.nan, 1.0, np.nan, -2.0, -2.0])
    x = pt.from_numpy(ref, placement="interleave")
    assert np.isnan(x.min()) and np.isnan(x.max()) and np.isnan(x.sum())
    assert x.argmin() == 2 and x.argmax() == 2
    ref2 = np.array([5, 1, 7, 1, 7, 0, 0, 7], np.int32)
    x2 = pt.from_numpy(ref2, placement="interleave")       # ties on different members
    assert x2.argmin() == 5 and x2.argmax() == 2


def test_big_float32_sum_is_close_to_float64(pool):
    """A float32 sum over many slabs (partials combined in float64): within a few float32
    ulps of the float64 reference, closer than the 1e-6 * n bound a naive sum would need."""
    rng = np.random.default_rng(7)
    ref = rng.uniform(0, 1, 20000).astype(np.float32)
    x = pt.from_numpy(ref)
    exact = ref.astype(np.float64).sum()
    got = x.sum()
    assert got.dtype == np.float32
    eps = np.finfo(np.float32).eps
    assert abs(float(got) - exact) <= 4 * eps * exact
    assert abs(float(x.mean()) - exact / ref.size) <= 4 * eps * exact / ref.size


def test_reductions_of_private_arrays(pool):
    ref = np.arange(50, dtype=np.float64).reshape(5, 10)
    x = pt.from_numpy(ref, access="private")
    np.testing.assert_array_equal(x.sum(axis=0), ref.sum(axis=0))
    np.testing.assert_array_equal((x @ np.eye(10)).to_numpy(), ref)
    assert (x @ np.eye(10)).access == "private"


def test_matmul_left_rows_placement_and_replica(pool):
    """The result rows are homed with the left rows; a readonly right operand is read once."""
    from pooltensor.ops import products as linalg
    ref = np.arange(40 * 6, dtype=np.float64).reshape(40, 6)
    a = pt.from_numpy(ref)
    w = pt.from_numpy(np.eye(6) * 2, access="readonly")
    y = a @ w
    np.testing.assert_array_equal(y.to_numpy(), ref * 2)
    assert linalg.replicated(w) is linalg.replicated(w)
    if pool.size > 1:          # each result slab lives with the left row of its first element
        per = SLAB // 8
        want = [a._a.members[((k * per) // 6) * 6 * 8 // SLAB] for k in range(len(y._a.members))]
        assert list(y._a.members) == want
        assert len(set(want)) == pool.size


@pytest.mark.timeout(400)
@PAIRED_RUNS
def test_spmd_reductions(launcher, n):
    p = check_ranks(launcher, n, "ops_reduce_spmd.py", "40", timeout=360)
    assert p.stdout.count("ops reduce spmd ok") == n, p.stdout
