"""NEP-18 dispatch (the @implements registry, the fallback to numpy with a warning and its
refusal above materialize_limit), NEP-13 routing of ufunc methods and generalized ufuncs, and
the Array API namespace (__array_namespace__)."""
import warnings

import numpy as np
import pytest

import pooltensor as pt
from conftest import pool_fixture
from pooltensor.ops import dispatch, namespace

LIMIT = 1 << 14

pytestmark = pytest.mark.timeout(120)

pool = pool_fixture(1, 2, slab_size=256, cache_bytes=16 * 256, materialize_limit=LIMIT)


@pytest.fixture
def registry():
    """The registry, restored after a test adds to it."""
    saved = dict(dispatch.HANDLED)
    yield dispatch.HANDLED
    dispatch.HANDLED.clear()
    dispatch.HANDLED.update(saved)


# -- the registry ---------------------------------------------------------------------------------

def test_implements_registers_and_numpy_dispatches(pool, registry):
    calls = []

    @dispatch.implements(np.fliplr, np.flipud)
    def flip(m):
        calls.append(m)
        return "mine"

    x = pt.from_numpy(np.arange(12.0).reshape(3, 4))
    assert np.fliplr(x) == "mine" and np.flipud(x) == "mine"
    assert calls == [x, x]
    assert registry[np.fliplr] is flip
    np.testing.assert_array_equal(np.fliplr(np.eye(2)), np.fliplr(np.eye(2)))  # numpy's own


def test_registered_functions_return_pool_arrays_without_warning(pool):
    ref = np.arange(-6.0, 6.0).reshape(3, 4) / 3
    x = pt.from_numpy(ref)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cases = [(np.where(x > 0, x, 0), np.where(ref > 0, ref, 0)),
                 (np.clip(x, -1, 1), np.clip(ref, -1, 1)),
                 (np.copy(x), np.copy(ref)),
                 (np.round(x), np.round(ref)),
                 (np.around(x), np.around(ref)),
                 (np.real(x), np.real(ref)),
                 (np.imag(x + 2j), np.imag(ref + 2j)),
                 (np.zeros_like(x), np.zeros_like(ref)),
                 (np.ones_like(x, dtype=np.int8), np.ones_like(ref, dtype=np.int8)),
                 (np.full_like(x, 7), np.full_like(ref, 7)),
                 (np.astype(x, np.int32), np.astype(ref, np.int32))]
        for got, want in cases:
            assert isinstance(got, pt.ndarray), type(got)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got.to_numpy(), want)
        assert np.empty_like(x).shape == x.shape
        o = np.zeros((3, 4))
        assert np.clip(x, -1, 1, out=o) is o                 # a numpy out= gets the values
        np.testing.assert_array_equal(o, np.clip(ref, -1, 1))
        p = pt.zeros((3, 4))
        assert np.clip(x, -1, 1, out=p) is p
        np.testing.assert_array_equal(p.to_numpy(), np.clip(ref, -1, 1))
        y = pt.zeros((3, 4))
        np.copyto(y, x, where=ref > 0)
        np.testing.assert_array_equal(y.to_numpy(), np.where(ref > 0, ref, 0))
        with pytest.raises(TypeError):
            np.copyto(pt.zeros(3, np.int8), np.ones(3))      # same_kind refuses float->int


# -- the fallback ----------------------------------------------------------------------------------

def test_unregistered_function_falls_back_with_a_warning(pool):
    ref = np.array([[3, 1, 2], [9, 7, 8]], np.int16)
    x = pt.from_numpy(ref)
    with pytest.warns(pt.FallbackWarning, match="numpy.sort"):
        got = np.sort(x, axis=1)
    assert isinstance(got, np.ndarray)
    np.testing.assert_array_equal(got, np.sort(ref, axis=1))
    with pytest.warns(pt.FallbackWarning):
        got = np.diff(x, axis=0)
    np.testing.assert_array_equal(got, np.diff(ref, axis=0))
    assert issubclass(pt.FallbackWarning, UserWarning) and pt.PerformanceWarning is \
        pt.FallbackWarning


def test_fallback_writes_an_out_pool_array(pool):
    ref = np.arange(10, dtype=np.int64)
    x = pt.from_numpy(ref)
    out = pt.zeros(10, np.int64)
    with pytest.warns(pt.FallbackWarning):
        got = np.nancumsum(x, out=out)
    assert got is out
    np.testing.assert_array_equal(out.to_numpy(), np.cumsum(ref))


def test_fallback_is_refused_above_the_limit(pool):
    big = pt.zeros(LIMIT // 8 + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")              # refused before any warning
        with pytest.raises(pt.MaterializeTooLarge, match="materialize_limit"):
            np.sort(big)
        small = pt.zeros(LIMIT // 16)
        with pytest.raises(pt.MaterializeTooLarge):     # the limit counts every operand
            np.convolve(small, pt.zeros(LIMIT // 16 + 8))
    assert isinstance(pt.MaterializeTooLarge("x"), ValueError)


def test_other_array_types_get_their_turn(pool):
    class Other:
        def __array_function__(self, func, types, args, kwargs):
            return NotImplemented

        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
            return "other"

    x = pt.from_numpy(np.arange(3.0))
    with pytest.raises(TypeError, match="no implementation found"):
        np.where(x > 0, x, Other())
    assert np.add(x, Other()) == "other"         # NEP-13: we step aside, Other answers


def test_types_forbidding_ufuncs_give_numpys_type_error(pool):
    class NoUfuncs:
        __array_ufunc__ = None

        def __radd__(self, other):
            return "radd"

    x = pt.from_numpy(np.arange(3.0))
    assert x + NoUfuncs() == "radd"                # the operator defers
    with pytest.raises(TypeError):
        np.add(x, NoUfuncs())


# -- ufunc methods and generalized ufuncs ----------------------------------------------------------

def test_gufuncs_go_to_their_registered_implementation(pool, registry):
    x = pt.from_numpy(np.arange(6.0).reshape(2, 3))
    y = np.ones((3, 2))
    registry.pop(np.matmul, None)
    with pytest.warns(pt.FallbackWarning, match="matmul"):
        got = np.matmul(x, y)
    np.testing.assert_array_equal(got, np.arange(6.0).reshape(2, 3) @ y)

    @dispatch.implements(np.matmul)
    def mm(a, b, **kw):
        return ("routed", kw)

    assert np.matmul(x, y) == ("routed", {})


def test_ufunc_reduce_matches_numpy(pool):
    ref = np.arange(24, dtype=np.int32).reshape(4, 6)
    x = pt.from_numpy(ref)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pt.FallbackWarning)    # without reductions: fallback
        got = np.add.reduce(x, axis=1)
        got2 = np.maximum.reduce(x, axis=0, keepdims=True)
    got = got.to_numpy() if isinstance(got, pt.ndarray) else got
    got2 = got2.to_numpy() if isinstance(got2, pt.ndarray) else got2
    np.testing.assert_array_equal(got, np.add.reduce(ref, axis=1))
    np.testing.assert_array_equal(got2, np.maximum.reduce(ref, axis=0, keepdims=True))


# -- the Array API namespace -----------------------------------------------------------------------

def test_array_namespace_is_pooltensor(pool):
    x = pt.from_numpy(np.arange(4.0))
    xp = x.__array_namespace__()
    assert xp is pt
    assert x.__array_namespace__(api_version="2023.12") is pt
    with pytest.raises(ValueError, match="unsupported"):
        x.__array_namespace__(api_version="1999.01")
    assert xp.__array_api_version__ == "2024.12"
    for name in namespace.DTYPES + namespace.ELEMENTWISE + namespace.DTYPE_FUNCTIONS + \
            pt._CREATION + pt._OPS:
        assert hasattr(xp, name), name
    assert xp.float32 is np.float32 and xp.bool is np.bool_
    assert xp.result_type(x, xp.float32) == np.float64
    assert xp.can_cast(x, xp.int64) is False
    assert xp.finfo(xp.float32).eps == np.finfo(np.float32).eps
    assert xp.iinfo(xp.int8).max == 127
    assert xp.isdtype(x.dtype, "real floating")


def _inputs(name, uf):
    """Arguments inside each function's domain, as numpy arrays."""
    if name.startswith("bitwise") or name in ("remainder", "floor_divide"):
        a, b = np.arange(1, 13, dtype=np.int32), np.arange(2, 14, dtype=np.int32) % 5 + 1
    elif name.startswith("logical"):
        a, b = np.arange(12) % 2 == 0, np.arange(12) % 3 == 0
    elif name in ("acosh",):
        a = b = np.linspace(1, 4, 12)
    elif name in ("acos", "asin", "atanh"):
        a = b = np.linspace(-0.9, 0.9, 12)
    else:
        a, b = np.linspace(0.5, 3, 12), np.linspace(-2, 2, 12)
    return (a, b)[:uf.nin]


def test_every_elementwise_function_matches_numpy(pool):
    for name, uf in namespace.UFUNCS.items():
        args = _inputs(name, uf)
        want = uf(*args)
        got = getattr(pt, name)(*[pt.from_numpy(a) for a in args])
        assert isinstance(got, pt.ndarray), name
        assert got.dtype == want.dtype, name
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-12, err_msg=name)
    x = pt.from_numpy(np.array([0.5, 1.5, 2.5, -0.5]))
    np.testing.assert_array_equal(pt.round(x).to_numpy(), [0.0, 2.0, 2.0, -0.0])
    z = pt.from_numpy(np.array([1 + 2j, 3 - 4j]))
    np.testing.assert_array_equal(pt.real(z).to_numpy(), [1, 3])
    np.testing.assert_array_equal(pt.imag(z).to_numpy(), [2, -4])
    np.testing.assert_array_equal(z.real.to_numpy(), [1, 3])
    assert x.real is x
    np.testing.assert_array_equal(pt.clip(x, min=0, max=1).to_numpy(), [0.5, 1, 1, 0])
    np.testing.assert_array_equal(pt.where(x > 1, x, -1).to_numpy(), [-1, 1.5, 2.5, -1])
    np.testing.assert_array_equal(pt.zeros_like(x).to_numpy(), np.zeros(4))
    assert pt.full_like(x, 3, dtype=pt.int8).dtype == np.int8
