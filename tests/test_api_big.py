"""The chunked passes of the data-dependent functions (ops/chunks.py) against numpy: sort and
argsort (sample sort, stable), unique_values/counts/inverse/all, cumulative_sum/prod, nonzero,
searchsorted, take with a big index array, fft along an uncut axis, TSQR
qr/svd/svdvals/lstsq, and the clear error of a factorization that would need a gather.

The pools' materialize_limit is lowered to 2 KiB, so arrays of a few hundred elements are "too
big to gather" and a chunk is 512 bytes: many chunks, buckets and carries. 64-byte slabs over 1
and 3 members; the SPMD script (scripts/api_big_spmd.py) runs the same functions on 2 real
ranks, where each chunk is worked on by the rank homing its first row. With 3 members the
members run their chunks (plan "chunks"), which the sort case checks.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pooltensor as pt
from conftest import check_ranks, pool_fixture, property_settings
from pooltensor.ops import chunks
from test_api import values

def same(got, want):
    """got is a pool array with numpy's shape, dtype and values (read past the limit)."""
    assert isinstance(got, pt.ndarray), type(got)
    assert got.shape == np.shape(want) and got.dtype == np.asarray(want).dtype, \
        (got.shape, got.dtype, np.shape(want), np.asarray(want).dtype)
    np.testing.assert_allclose(chunks.read(got), want, rtol=1e-9, atol=1e-9)


PROPS = property_settings("API_EXAMPLES", 5, "POOL_DERANDOMIZE")
LIMIT = 2048
pytestmark = [pytest.mark.timeout(600)]
pool = pool_fixture(1, 3, materialize_limit=LIMIT)


@PROPS
@given(n=st.integers(600, 1000), dt=st.sampled_from([np.int32, np.float64, np.int64]),
       seed=st.integers(0, 99))
def test_sample_sort_and_unique(pool, n, dt, seed):
    a = values((n,), dt, seed)
    if dt == np.float64:
        a[::17] = np.nan
    x = pt.asarray(a)
    assert x.nbytes > LIMIT
    before = pool.plans.get("chunks", 0)
    same(pt.sort(x), np.sort(a, kind="stable"))
    if pool.size > 1:                 # the members sorted the chunks they home
        assert pool.plans.get("chunks", 0) > before
    same(pt.argsort(x), np.argsort(a, kind="stable"))
    same(pt.sort(x, descending=True), np.flip(np.sort(a)))
    want = np.flip(n - 1 - np.argsort(np.flip(a), kind="stable"))
    same(pt.argsort(x, descending=True), want)
    same(pt.unique_values(x), np.unique(a, equal_nan=False))
    v, c = pt.unique_counts(x)
    wv, wc = np.unique(a, return_counts=True, equal_nan=False)
    same(v, wv)
    same(c, wc.astype(np.int64))


@PROPS
@given(shape=st.sampled_from([(700,), (30, 25), (4, 9, 20)]),
       dt=st.sampled_from([np.int32, np.float64, np.int64]), seed=st.integers(0, 99),
       nans=st.booleans())
def test_unique_all_and_inverse(pool, shape, dt, seed, nans):
    a = values(shape, dt, seed)
    if nans and dt == np.float64:
        a.reshape(-1)[::13] = np.nan
        a.reshape(-1)[5::11] = -0.0
    x = pt.asarray(a)
    assert x.nbytes > LIMIT           # a gather would raise MaterializeTooLarge
    before = pool.plans.get("chunks", 0)
    v, i, inv, c = np.unique(a.reshape(-1), return_index=True, return_inverse=True,
                             return_counts=True, equal_nan=False)
    got = pt.unique_all(x)
    if pool.size > 1:
        assert pool.plans.get("chunks", 0) > before
    for g, w in zip(got, (v, i.astype(np.int64), inv.reshape(shape).astype(np.int64),
                          c.astype(np.int64))):
        same(g, w)
    gv, ginv = pt.unique_inverse(x)
    same(gv, v)
    same(ginv, inv.reshape(shape).astype(np.int64))
    np.testing.assert_array_equal(chunks.read(gv)[chunks.read(ginv)], a)


@PROPS
@given(shape=st.sampled_from([(80, 6), (7, 60), (3, 40, 4)]), seed=st.integers(0, 99),
       data=st.data())
def test_sort_along_an_axis_scan_fft(pool, shape, seed, data):
    a = values(shape, np.float64, seed)
    x = pt.asarray(a)
    ax = data.draw(st.integers(-len(shape), len(shape) - 1))
    same(pt.sort(x, axis=ax), np.sort(a, ax, kind="stable"))
    same(pt.argsort(x, axis=ax), np.argsort(a, ax, kind="stable"))
    same(pt.cumulative_sum(x, axis=ax), np.cumsum(a, axis=ax))
    same(pt.cumulative_prod(x / 4, axis=ax), np.cumprod(a / 4, axis=ax))
    first = np.zeros_like(np.take(a, [0], ax))
    same(pt.cumulative_sum(x, axis=ax, include_initial=True),
         np.concatenate([first, np.cumsum(a, axis=ax)], axis=ax))
    same(pt.fft.fft(x, axis=ax), np.fft.fft(a, axis=ax))
    same(pt.fft.rfft(x, axis=ax), np.fft.rfft(a, axis=ax))
    with pytest.raises(pt.MaterializeTooLarge):
        pt.fft.fftn(x)


@PROPS
@given(n=st.integers(300, 600), seed=st.integers(0, 99))
def test_nonzero_and_searchsorted(pool, n, seed):
    a = values((n // 4, 4), np.int64, seed) * (values((n // 4, 4), np.int64, seed + 1) > 0)
    x = pt.asarray(a)
    for got, want in zip(pt.nonzero(x), np.nonzero(a)):
        same(got, want)
    s = np.sort(values((n,), np.float64, seed))
    needles = values((n // 2,), np.float64, seed + 5)
    for side in ("left", "right"):
        same(pt.searchsorted(pt.asarray(s), pt.asarray(needles), side=side),
             np.searchsorted(s, needles, side=side))
    same(pt.searchsorted(pt.asarray(s), needles[:3]), np.searchsorted(s, needles[:3]))


@PROPS
@given(n=st.integers(300, 600), seed=st.integers(0, 99))
def test_take_with_a_big_index_array(pool, n, seed):
    a = values((30, 7), np.float64, seed)
    rng = np.random.default_rng(seed)
    x = pt.asarray(a)
    rows = rng.integers(-30, 30, (n // 4, 4))
    assert rows.nbytes > LIMIT        # a gather of the indices would raise
    same(pt.take(x, pt.asarray(rows), axis=0), np.take(a, rows, axis=0))
    cols = rng.integers(-7, 7, n)
    same(pt.take(x, pt.asarray(cols), axis=1), np.take(a, cols, axis=1))
    flat = rng.integers(0, a.size, n)
    same(pt.take(x.reshape(-1), pt.asarray(flat)), np.take(a.reshape(-1), flat))
    with pytest.raises(IndexError):
        pt.take(x, pt.asarray(cols + 7), axis=1)


@PROPS
@given(m=st.integers(300, 500), n=st.integers(1, 3), seed=st.integers(0, 99))
def test_tsqr(pool, m, n, seed):
    a = values((m, n), np.float64, seed) + np.eye(m, n)
    x = pt.asarray(a)
    q, r = pt.linalg.qr(x)
    assert q.shape == (m, n) and r.shape == (n, n)
    qn = chunks.read(q)
    np.testing.assert_allclose(qn @ r.to_numpy(), a, atol=1e-9)
    np.testing.assert_allclose(qn.T @ qn, np.eye(n), atol=1e-9)
    same(pt.linalg.svdvals(x), np.linalg.svd(a, compute_uv=False))
    u, s, vh = pt.linalg.svd(x, full_matrices=False)
    np.testing.assert_allclose((chunks.read(u) * s.to_numpy()) @ vh.to_numpy(), a, atol=1e-9)
    b = values((m,), np.float64, seed + 1)
    same(pt.linalg.lstsq(x, b), np.linalg.lstsq(a, b)[0])
    with pytest.raises(pt.MaterializeTooLarge, match="materialize_limit"):
        pt.linalg.inv(pt.ones((20, 20)))


def test_on_two_spmd_ranks(launcher):
    check_ranks(launcher, 2, "api_big_spmd.py")
