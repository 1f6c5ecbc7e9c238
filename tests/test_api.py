"""The Array API namespace against numpy: what every function takes (numpy arrays, numpy and
Python scalars) and gives (pool arrays), creation with the standard's signatures, the
manipulation, sorting, set, searching and scan functions, pooltensor.linalg and
pooltensor.fft, and the inspection names (device, __array_namespace_info__, DLPack).

Arrays here fit the materialize limit, so the data-dependent functions run numpy on gathered
copies; test_api_big.py runs their chunked passes. Pools of 1 and 2 members with 64-byte
slabs, so every array crosses slabs and members.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pooltensor as pt
from conftest import pool_fixture, property_settings

PROPS = property_settings("API_EXAMPLES", 8, "POOL_DERANDOMIZE")
pytestmark = [pytest.mark.timeout(300)]
pool = pool_fixture(1, 2)

DTYPES = [np.int8, np.int64, np.uint16, np.float32, np.float64]


def values(shape, dtype, seed):
    """Deterministic values of `dtype`, repeats and (for floats) negative numbers included."""
    rng = np.random.default_rng(seed)
    v = rng.integers(-5, 6, size=shape)
    if np.dtype(dtype).kind == "u":
        v = np.abs(v)
    if np.dtype(dtype).kind == "f":
        v = v + rng.random(shape).round(1)
    return v.astype(dtype)


def same(got, want):
    """got is a pool array with numpy's shape, dtype and values."""
    assert isinstance(got, pt.ndarray), type(got)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    assert got.dtype == np.asarray(want).dtype, (got.dtype, np.asarray(want).dtype)
    np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-6, atol=1e-9)


shapes = st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple)


# -- what the namespace takes and gives --------------------------------------------------------

def test_numpy_and_python_scalars_in_pool_arrays_out(pool):
    a = np.arange(6.0).reshape(2, 3)
    same(pt.add(a, 1), a + 1)
    same(pt.multiply(np.float32(2), pt.asarray(a)), 2 * a)
    s = pt.sum(pt.asarray(a))
    assert isinstance(s, pt.ndarray) and s.shape == ()
    same(pt.sqrt(pt.sum(pt.asarray(a), axis=0)), np.sqrt(a.sum(axis=0)))
    same(pt.max(np.float64(3.5)), np.float64(3.5))
    x = pt.asarray(a)
    same(pt.exp(x[0, 1]), np.exp(a[0, 1]))           # an element, then a function of it
    same(x @ np.ones((3, 2)), a @ np.ones((3, 2)))
    assert pt.isnan(pt.sum(x, axis=1)).__array_namespace__() is pt
    assert complex(pt.asarray(1.5 + 2j)) == 1.5 + 2j


def test_creation_signatures(pool):
    assert pt.ones((2,), dtype=None).dtype == np.float64
    assert pt.zeros(3).dtype == np.float64
    assert pt.full(2, 7).dtype == np.int64 and pt.full(2, 1.5).dtype == np.float64
    assert pt.full(2, True).dtype == np.bool_ and pt.full(2, 1j).dtype == np.complex128
    assert pt.asarray(3).dtype == np.int64 and pt.asarray([1.0]).dtype == np.float64
    x = pt.asarray(np.arange(4))
    assert pt.asarray(x) is x and pt.asarray(x, copy=True) is not x
    with pytest.raises(ValueError):
        pt.asarray(np.arange(3), copy=False)
    with pytest.raises(ValueError):
        pt.asarray(x, dtype=np.float32, copy=False)
    same(pt.linspace(0, 1, num=5), np.linspace(0, 1, 5))
    same(pt.arange(5, device=pt.POOL), np.arange(5))
    with pytest.raises(ValueError, match="device"):
        pt.zeros(3, device="cuda:0")
    same(pt.from_dlpack(np.arange(3.0)), np.arange(3.0))
    assert pt.from_dlpack(x) is x
    same(pt.zeros_like(np.ones((2, 2), np.int8)), np.zeros((2, 2), np.int8))


@PROPS
@given(n=st.integers(0, 6), m=st.integers(0, 6), k=st.integers(-6, 6), seed=st.integers(0, 9))
def test_eye_tril_triu(pool, n, m, k, seed):
    same(pt.eye(n, m, k=k), np.eye(n, m, k=k))
    a = values((2, n, m), np.float64, seed)
    same(pt.tril(a, k=k), np.tril(a, k))
    same(pt.triu(pt.asarray(a), k=k), np.triu(a, k))


def test_meshgrid(pool):
    a, b, c = np.arange(3), np.arange(4) + 10, np.arange(2) - 5
    for idx in ("xy", "ij"):
        for got, want in zip(pt.meshgrid(a, b, c, indexing=idx), np.meshgrid(a, b, c,
                                                                                 indexing=idx)):
            same(got, want)


# -- manipulation ----------------------------------------------------------------------------

@PROPS
@given(shape=shapes, dt=st.sampled_from(DTYPES), seed=st.integers(0, 99), data=st.data())
def test_manipulation_matches_numpy(pool, shape, dt, seed, data):
    a = values(shape, dt, seed)
    x = pt.asarray(a)
    nd = len(shape)
    ax = data.draw(st.integers(-nd, nd - 1))
    same(pt.flip(x, axis=ax), np.flip(a, ax))
    same(pt.flip(x), np.flip(a))
    sh = data.draw(st.integers(-7, 7))
    same(pt.roll(x, sh, axis=ax), np.roll(a, sh, ax))
    same(pt.roll(x, sh), np.roll(a, sh))
    same(pt.roll(x, (sh, 1), axis=(ax, 0)), np.roll(a, (sh, 1), (ax, 0)))
    r = data.draw(st.integers(0, 3))
    same(pt.repeat(x, r, axis=ax), np.repeat(a, r, ax))
    reps = data.draw(st.lists(st.integers(0, 3), min_size=a.shape[ax], max_size=a.shape[ax]))
    same(pt.repeat(x, np.array(reps), axis=ax), np.repeat(a, reps, ax))
    same(pt.repeat(x, r), np.repeat(a, r))
    t = tuple(data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4)))
    same(pt.tile(x, t), np.tile(a, t))
    same(pt.broadcast_to(x, (2,) + shape), np.broadcast_to(a, (2,) + shape))
    for got, want in zip(pt.unstack(x, axis=ax), [np.take(a, i, ax) for i in range(a.shape[ax])]):
        same(got, want)
    idx = np.array(data.draw(st.lists(st.integers(-a.shape[ax], a.shape[ax] - 1),
                                      max_size=5)), np.int64)
    same(pt.take(x, idx, axis=ax), np.take(a, idx, ax))
    ia = data.draw(st.integers(0, 3))
    tidx = np.random.default_rng(seed).integers(0, a.shape[ax], size=tuple(
        ia if i == ax % nd else n for i, n in enumerate(shape)))
    same(pt.take_along_axis(x, tidx, axis=ax), np.take_along_axis(a, tidx, ax))
    b = values(shape[-1:], dt, seed + 1)
    for got, want in zip(pt.broadcast_arrays(x, b), np.broadcast_arrays(a, b)):
        same(got, want)


# -- sorting, sets, searching, scans ---------------------------------------------------------

def _argsort_desc(a, axis):
    n = a.shape[axis]
    return np.flip(n - 1 - np.argsort(np.flip(a, axis), axis=axis, kind="stable"), axis)


@PROPS
@given(shape=shapes, dt=st.sampled_from(DTYPES), seed=st.integers(0, 99), data=st.data())
def test_sorting_sets_searching(pool, shape, dt, seed, data):
    a = values(shape, dt, seed)
    x = pt.asarray(a)
    ax = data.draw(st.integers(-len(shape), len(shape) - 1))
    same(pt.sort(x, axis=ax), np.sort(a, ax, kind="stable"))
    same(pt.sort(x, axis=ax, descending=True), np.flip(np.sort(a, ax), ax))
    same(pt.argsort(x, axis=ax), np.argsort(a, ax, kind="stable"))
    same(pt.argsort(x, axis=ax, descending=True), _argsort_desc(a, ax % len(shape)))
    same(pt.unique_values(x), np.unique(a))
    v, c = pt.unique_counts(x)
    wv, wc = np.unique(a, return_counts=True)
    same(v, wv)
    same(c, wc.astype(np.int64))
    r = pt.unique_all(x)
    w = np.unique_all(a)
    same(r.values, w.values)
    same(r.indices, w.indices.astype(np.int64))
    same(r.inverse_indices, w.inverse_indices.reshape(a.shape).astype(np.int64))
    same(pt.unique_inverse(x).inverse_indices, w.inverse_indices.reshape(a.shape))
    s = np.sort(a.reshape(-1))
    needles = values((4,), dt, seed + 2)
    for side in ("left", "right"):
        same(pt.searchsorted(s, needles, side=side), np.searchsorted(s, needles, side=side))
    for got, want in zip(pt.nonzero(x), np.nonzero(a)):
        same(got, want.astype(np.int64))
    for got, want in zip(pt.nonzero(x.T[::2] > 0), np.nonzero(a.T[::2] > 0)):  # a view
        same(got, want.astype(np.int64))
    same(pt.cumulative_sum(x, axis=ax), np.cumsum(a, axis=ax))
    same(pt.cumulative_prod(x, axis=ax, include_initial=True),
         np.concatenate([np.ones_like(np.cumprod(a, axis=ax).take([0], ax)),
                         np.cumprod(a, axis=ax)], axis=ax))
    same(np.cumsum(x), np.cumsum(a))
    same(pt.diff(x, axis=ax), np.diff(a, axis=ax))
    same(pt.count_nonzero(x, axis=ax), np.count_nonzero(a, axis=ax))


def test_nan_and_errors(pool):
    a = np.array([2.0, np.nan, 1.0, np.nan, 2.0])
    same(pt.sort(a), np.sort(a))
    same(pt.unique_values(a), np.unique(a, equal_nan=False))
    with pytest.raises(ValueError):
        pt.nonzero(pt.asarray(1.0))
    with pytest.raises(ValueError):
        pt.cumulative_sum(pt.ones((2, 2)))
    with pytest.raises(ValueError):
        pt.searchsorted(a, a, side="middle")


# -- linalg and fft ----------------------------------------------------------------------------

@PROPS
@given(n=st.integers(1, 5), m=st.integers(1, 5), seed=st.integers(0, 99))
def test_linalg_matches_numpy(pool, n, m, seed):
    la = pt.linalg
    a = values((2, n, m), np.float64, seed)
    b = values((m, 3), np.float64, seed + 1)
    same(la.matmul(a, b), a @ b)
    same(la.tensordot(a, b, axes=1), np.tensordot(a, b, axes=1))
    same(la.tensordot(a, a, axes=([1, 2], [1, 2])), np.tensordot(a, a, ([1, 2], [1, 2])))
    same(la.vecdot(a, a[0]), np.sum(a * a[0], axis=-1))
    same(la.matrix_transpose(a), np.swapaxes(a, -1, -2))
    for k in (-1, 0, 1):
        same(la.diagonal(a, offset=k), np.diagonal(a, k, -2, -1))
        same(la.trace(a, offset=k), np.trace(a, k, axis1=-2, axis2=-1))
    same(la.outer(a[0, 0], a[1, 0]), np.outer(a[0, 0], a[1, 0]))
    v, w = values((4, 3), np.float64, seed), values((4, 3), np.float64, seed + 3)
    same(la.cross(v, w), np.cross(v, w))
    for o in (2, 1, np.inf, -np.inf, 0, 3):
        same(la.vector_norm(a, axis=(-2, -1), ord=o),
             np.linalg.vector_norm(a, axis=(-2, -1), ord=o))
    for o in ("fro", 1, -1, np.inf, -np.inf, "nuc", 2):
        same(la.matrix_norm(a, ord=o), np.linalg.matrix_norm(a, ord=o))
    s = values((2, n, n), np.float64, seed) + 40 * np.eye(n)
    spd = s @ np.swapaxes(s, -1, -2)
    same(la.cholesky(spd), np.linalg.cholesky(spd))
    same(la.inv(s), np.linalg.inv(s))
    same(la.det(s), np.linalg.det(s))
    same(la.solve(s, values((2, n, 2), np.float64, seed)),
         np.linalg.solve(s, values((2, n, 2), np.float64, seed)))
    same(la.eigvalsh(spd), np.linalg.eigvalsh(spd))
    same(la.svdvals(a), np.linalg.svdvals(a))
    same(la.matrix_rank(a), np.linalg.matrix_rank(a))
    same(la.pinv(a), np.linalg.pinv(a))
    same(la.matrix_power(s, 3), np.linalg.matrix_power(s, 3))
    q, r = la.qr(a)
    same(la.matmul(q, r), a)


@PROPS
@given(shape=st.lists(st.integers(2, 6), min_size=1, max_size=3).map(tuple),
       seed=st.integers(0, 99), data=st.data())
def test_fft_matches_numpy(pool, shape, seed, data):
    a = values(shape, np.float64, seed)
    ax = data.draw(st.integers(-len(shape), len(shape) - 1))
    for name in ("fft", "ifft", "rfft", "hfft", "ihfft"):
        same(getattr(pt.fft, name)(a, axis=ax), getattr(np.fft, name)(a, axis=ax))
    for name in ("fftn", "ifftn", "rfftn"):
        same(getattr(pt.fft, name)(a), getattr(np.fft, name)(a))
    same(pt.fft.irfft(pt.fft.rfft(a, axis=ax), n=shape[ax], axis=ax), a)
    same(pt.fft.fftshift(a), np.fft.fftshift(a))
    same(pt.fft.ifftshift(a, axes=ax), np.fft.ifftshift(a, axes=ax))
    same(pt.fft.fftfreq(5, d=0.5), np.fft.fftfreq(5, 0.5))
    same(pt.fft.rfftfreq(6, dtype=np.float32), np.fft.rfftfreq(6).astype(np.float32))


# -- inspection -----------------------------------------------------------------------------------

def test_info_device_dlpack(pool):
    info = pt.__array_namespace_info__()
    assert info.devices() == [pt.POOL] and info.default_device() == pt.POOL
    assert info.default_dtypes()["real floating"] == np.float64
    assert set(info.dtypes(kind="integral")) == {"int8", "int16", "int32", "int64", "uint8",
                                                 "uint16", "uint32", "uint64"}
    assert info.capabilities()["boolean indexing"]
    x = pt.asarray(np.arange(6.0).reshape(2, 3))
    assert x.device == pt.POOL and x.to_device(pt.POOL) is x
    same(x.mT, np.arange(6.0).reshape(2, 3).T)
    assert x.__dlpack_device__() == (1, 0)
    small = pt.asarray(np.float64(2.5))
    np.testing.assert_array_equal(np.from_dlpack(small), 2.5)
    big = pt.zeros(100)                        # 800 bytes over 64-byte slabs
    with pytest.raises(BufferError, match="copy=True"):
        big.__dlpack__()
    np.testing.assert_array_equal(np.from_dlpack(pt.asarray(np.zeros(0))), np.zeros(0))
    if pool.size > 1:          # in a slab of member 1, whose memory is mapped here: zero-copy
        on1 = pt.asarray(np.arange(3.0), placement=[1])
        assert list(on1.slab_members) == [1]
        view = np.from_dlpack(on1)
        on1[1] = 7.0
        np.testing.assert_array_equal(view, [0.0, 7.0, 2.0])
    assert pt.finfo(np.float32).eps == float(np.finfo(np.float32).eps)
    assert type(pt.finfo(np.float64).max) is float and type(pt.iinfo(np.int8).min) is int


def test_a_zero_copy_view_outlives_its_pool_array(pool):
    """to_numpy() of a local array is a view of pool memory: it keeps the slabs, so a pool
    array made after the first one died does not show through it."""
    v = pt.asarray(np.float64(1.25)).to_numpy()
    others = [pt.asarray(np.float64(-i)) for i in range(8)]
    assert v == 1.25 and len(others) == 8


def test_special_cases_of_the_standard(pool):
    """Where numpy's special cases differ, the namespace and the // operators follow the
    standard; np.floor_divide on pool arrays keeps numpy's."""
    inf = np.inf
    a = np.array([inf, -inf, 1.0, -1.0, 7.0])
    b = np.array([2.0, 2.0, -inf, inf, 2.0])
    want = np.array([inf, -inf, -0.0, -0.0, 3.0])
    got = pt.floor_divide(a, b).to_numpy()
    np.testing.assert_array_equal(got, want)
    assert list(np.signbit(got)) == list(np.signbit(want))
    np.testing.assert_array_equal((pt.asarray(a) // pt.asarray(b)).to_numpy(), want)
    np.testing.assert_array_equal((pt.asarray(a) // 2.0).to_numpy(),
                                  np.array([inf, -inf, 0.0, -1.0, 3.0]))
    x = pt.asarray(a.copy())
    x //= pt.asarray(b)
    np.testing.assert_array_equal(x.to_numpy(), want)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(np.floor_divide(pt.asarray(a), pt.asarray(b)).to_numpy(),
                                      np.floor_divide(a, b))
    z = np.array([complex(inf, 0.0), complex(-inf, inf), complex(np.nan, 0.0),
                  complex(-0.0, 0.0)])
    e = pt.expm1(z).to_numpy()
    np.testing.assert_array_equal(e, np.array([complex(inf, 0), complex(-1, 0),
                                               complex(np.nan, 0), 0j]))
    assert not np.signbit(e[3].real)
    t = pt.tanh(np.array([complex(inf, 3e150), complex(-inf, -2.0)])).to_numpy()
    assert list(t.real) == [1.0, -1.0] and list(np.signbit(t.imag)) == [False, True]
