"""pooltensor.ndarray against numpy: indexing, assignment, creation, printing.

The pool is built in this test process (a plain script as far as pooltensor knows): with one
member, and with three (two member processes started by pooltensor.init), slabs of 64 bytes
so that selections cross slab boundaries and members, and a cache of a few slabs so that
eviction happens all the time.
"""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pool_strategies as ps
import pooltensor as pt
from conftest import SLAB, pool_fixture, property_settings

PROPS = property_settings("POOL_EXAMPLES", 300, "POOL_DERANDOMIZE")

pool = pool_fixture(1, 3)


PLACEMENTS = ["block", "interleave", "balanced", "local"]


def _pool_copy(ref, placement):
    return pt.from_numpy(ref, placement=placement)


pytestmark = pytest.mark.timeout(240)


def _basic_view(shape, dtype, data):
    """An interleaved pool copy of a reference array and a view of both by a drawn index.

    The index uses only basic indexing (ints, slices, None, Ellipsis), so the pool result is
    a view of the pool array rather than a copy.
    """
    ref = ps.reference(shape, dtype)
    x = pt.from_numpy(ref, placement="interleave")
    idx = data.draw(ps.index_for(shape, invalid=False).filter(
        lambda i: all(c is None or c is Ellipsis or isinstance(c, (int, slice))
                      for c in (i if isinstance(i, tuple) else (i,)))))
    return x, ref, x[idx], ref[idx]


@PROPS
@given(c=ps.case(), placement=st.sampled_from(PLACEMENTS), data=st.data())
def test_getitem_matches_numpy(pool, c, placement, data):
    shape, dtype, index = c
    ref = ps.reference(shape, dtype)
    x = _pool_copy(ref, placement)
    want, werr = ps.outcome(lambda: ref[index])
    got, gerr = ps.outcome(lambda: x[index])
    assert gerr == werr, (index, gerr, werr)
    if werr is None:
        ps.assert_same(got, want, index)
        if isinstance(got, pt.ndarray) and isinstance(want, np.ndarray):
            # a view of a view, and a write through the view reaching the base
            i2 = data.draw(ps.index_for(want.shape, invalid=False))
            w2, e2 = ps.outcome(lambda: want[i2])
            g2, f2 = ps.outcome(lambda: got[i2])
            assert f2 == e2
            if e2 is None:
                ps.assert_same(g2, w2, (index, i2))


@PROPS
@given(c=ps.case(), placement=st.sampled_from(PLACEMENTS), data=st.data())
def test_setitem_matches_numpy(pool, c, placement, data):
    shape, dtype, index = c
    ref = ps.reference(shape, dtype)
    x = _pool_copy(ref, placement)
    sel, err = ps.outcome(lambda: ref[index])
    if err is not None:
        value = 0
    else:
        value = data.draw(ps.value_for(np.shape(sel), dtype))
    want_err = ps.outcome(lambda: ref.__setitem__(index, value))[1]
    got_err = ps.outcome(lambda: x.__setitem__(index, value))[1]
    assert got_err == want_err, (index, got_err, want_err)
    ps.assert_same(x.to_numpy(), ref, index)


@PROPS
@given(shape=ps.SHAPES, dtype=st.sampled_from(ps.DTYPES), data=st.data())
def test_view_assignment_and_transpose(pool, shape, dtype, data):
    x, ref, v, rv = _basic_view(shape, dtype, data)
    if not isinstance(rv, np.ndarray):
        return
    ps.assert_same(v.T, rv.T)
    value = data.draw(ps.value_for(rv.T.shape, np.dtype(dtype)))
    v.T[...] = value
    rv.T[...] = value
    ps.assert_same(x.to_numpy(), ref)
    ps.assert_same(x.to_numpy(), ref)


def test_scalar_types_and_errors(pool):
    ref = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    x = pt.from_numpy(ref)
    assert type(x[1, 2, 3]) is np.float32 and x[1, 2, 3] == 23
    assert type(x[-1, -1, -1]) is np.float32
    assert isinstance(x[1, 2], pt.ndarray) and x[1, 2].shape == (4,)
    assert x[1][2][3] == 23
    z = x[0, 0, 0, ...]
    assert isinstance(z, pt.ndarray) and z.shape == ()
    assert z[()] == 0
    for bad in [(2,), (0, 3), (0, 0, 4), (0, 0, 0, 0), 1.5, "a"]:
        with pytest.raises(IndexError) as ours:
            x[bad]
        with pytest.raises(IndexError) as theirs:
            ref[bad]
        assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError) as ours:
        x[0] = np.ones(5)
    with pytest.raises(ValueError):
        ref[0] = np.ones(5)
    assert x.shape == (2, 3, 4) and x.ndim == 3 and x.size == 24 and x.nbytes == 96
    assert x.itemsize == 4 and x.dtype == np.float32 and x.T.shape == (4, 3, 2)
    assert len(x) == 2
    assert x.tolist() == ref.tolist()
    assert x.item(5) == ref.item(5) and x.item(1, 2, 3) == ref.item(1, 2, 3)
    assert pt.from_numpy(np.array([7])).item() == 7
    with pytest.raises(ValueError):
        x.item()
    with pytest.raises(TypeError):
        len(pt.from_numpy(np.float64(1.0)))
    np.testing.assert_array_equal(np.asarray(x), ref)
    np.testing.assert_array_equal(np.asarray(x, dtype=np.float64), ref.astype(np.float64))


def _outcome(conv, a):
    """What conv(a) gives: its value and type, or the exception's type and message; and the
    warnings it raised."""
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        try:
            v = conv(a)
            out = (type(v), v)
        except Exception as e:
            out = (type(e), str(e))
    return out, [(x.category, str(x.message)) for x in w]


def test_conversion_to_python_scalars_matches_numpy(pool):
    """float(), int(), complex(), operator.index() and bool() of a pool array do what they
    do to the numpy array (numpy 2: only 0-d arrays convert, size 1 or not)."""
    import operator
    for shape in [(), (1,), (1, 1), (1, 1, 1), (2,), (0,), (3, 1)]:
        for dtype in [np.float64, np.int32, np.int8, np.bool_, np.complex128, np.float16]:
            ref = (np.arange(int(np.prod(shape))) + 2).astype(dtype).reshape(shape)
            x = pt.from_numpy(ref)
            for conv in (float, int, complex, operator.index, bool):
                assert _outcome(conv, x) == _outcome(conv, ref), (conv, shape, dtype)


def test_creation_functions(pool):
    for shape, dtype in [((10, 7), np.float64), ((130,), np.int32), ((3, 0, 2), np.int8),
                         ((), np.complex128), ((33,), np.bool_)]:
        ps.assert_same(pt.zeros(shape, dtype).to_numpy(), np.zeros(shape, dtype))
        ps.assert_same(pt.ones(shape, dtype).to_numpy(), np.ones(shape, dtype))
        ps.assert_same(pt.full(shape, 3, dtype).to_numpy(), np.full(shape, 3, dtype))
        assert pt.empty(shape, dtype).shape == shape
    ps.assert_same(pt.full((5, 3), 2.5).to_numpy(), np.full((5, 3), 2.5))
    ps.assert_same(pt.full(4, 7).to_numpy(), np.full(4, 7))
    for args, kw in [((100,), {}), ((3, 250, 7), {}), ((0.5, 40.2, 0.37), {}),
                     ((10, -30, -3), {}), ((5,), {"dtype": np.float32}),
                     ((1, 300, 1.5), {"dtype": np.float32}), ((0, 100), {"dtype": np.int16}),
                     ((0.0, 1.0, 0.1), {}), ((3,), {"dtype": np.complex64}), ((5.0,), {}),
                     ((1, 10.0), {}), ((2, 9, np.float32(1.5)), {}), ((np.int8(3), 40), {}),
                     ((10, 0, -0.5), {"dtype": np.float32})]:
        ps.assert_same(pt.arange(*args, **kw).to_numpy(), np.arange(*args, **kw), args)
    for args, kw in [((0, 1, 50), {}), ((-3.5, 17.25, 301), {}), ((2, 10, 7),
                      {"endpoint": False}), ((0, 1, 1), {}), ((0, 1, 0), {}),
                     ((1, 100, 77), {"dtype": np.int32}), ((0, 5, 31), {"dtype": np.float32}),
                     ((5, 5, 20), {})]:
        ps.assert_same(pt.linspace(*args, **kw).to_numpy(), np.linspace(*args, **kw), args)
    ref = np.random.default_rng(3).standard_normal((17, 9))
    ps.assert_same(pt.asarray(ref).to_numpy(), ref)
    ps.assert_same(pt.asarray([[1, 2], [3, 4]]).to_numpy(), np.asarray([[1, 2], [3, 4]]))
    a = pt.asarray(ref)
    assert pt.asarray(a) is a
    ps.assert_same(pt.asarray(a, dtype=np.float32).to_numpy(), ref.astype(np.float32))
    with pytest.raises(TypeError):
        pt.zeros(3, dtype=object)
    with pytest.raises(ValueError):
        pt.zeros((-1, 3))


def test_random_is_independent_of_members_and_slabs(pool):
    from pooltensor.random import BLOCK
    n = BLOCK + 1000
    x = pt.random.random(n, seed=11)
    want = np.concatenate([np.random.default_rng([11, 0]).random(BLOCK),
                           np.random.default_rng([11, 1]).random(BLOCK)])[:n]
    ps.assert_same(x.to_numpy(), want)
    y = pt.random.standard_normal((100, 3), seed=5, dtype=np.float32, placement="interleave")
    ps.assert_same(y.to_numpy(), np.random.default_rng([5, 0]).standard_normal(
        BLOCK, dtype=np.float32)[:300].reshape(100, 3))
    z = pt.random.integers(-5, 9, (40, 40), seed=2, dtype=np.int16)
    ps.assert_same(z.to_numpy(), np.random.default_rng([2, 0]).integers(
        -5, 9, BLOCK, dtype=np.int16)[:1600].reshape(40, 40))
    assert not np.array_equal(pt.random.random(10).to_numpy(), pt.random.random(10).to_numpy())


def test_repr_fetches_only_what_it_prints(pool):
    small = np.arange(12, dtype=np.float32).reshape(3, 4) / 3
    pad = " " * len("pooltensor.ndarray(")
    assert repr(pt.from_numpy(small)) == repr(small).replace("array(", "pooltensor.ndarray(") \
        .replace("\n      ", "\n" + pad)
    assert str(pt.from_numpy(small)) == str(small)
    big = np.arange(40 * 50, dtype=np.int64).reshape(40, 50)
    x = pt.from_numpy(big)
    assert str(x) == str(big)
    assert repr(x).replace("pooltensor.ndarray(", "array(").replace("\n" + pad, "\n      ") \
        == repr(big)
    assert repr(pt.zeros((0, 3))) == "pooltensor.ndarray([], shape=(0, 3), dtype=float64)"
    long = pt.arange(10 ** 6, dtype=np.int32)
    pool.cache.reset_counters()
    assert str(long) == str(np.arange(10 ** 6, dtype=np.int32))
    # only the printed edges moved: a couple of slabs, not 4 MB
    assert pool.cache.bytes_fetched <= 8 * SLAB


def test_advanced_result_above_limit_is_a_pool_array(pool):
    ref = np.arange(1000, dtype=np.float64)
    x = pt.from_numpy(ref)
    old = pool.advanced_limit
    pool.advanced_limit = 100
    try:
        r = x[np.arange(999, -1, -3)]
        assert isinstance(r, pt.ndarray)
        ps.assert_same(r.to_numpy(), ref[np.arange(999, -1, -3)])
        ps.assert_same(x[[1, 2]], ref[[1, 2]])
    finally:
        pool.advanced_limit = old


def test_materialize_limit_and_zero_copy(pool):
    ref = np.arange(1000, dtype=np.float64)
    x = pt.from_numpy(ref, placement="local")
    old = pool.materialize_limit
    pool.materialize_limit = 800
    try:
        with pytest.raises(pt.MaterializeTooLarge, match="over the limit"):
            x.to_numpy()
        with pytest.raises(ValueError):
            np.asarray(x)
        assert x[:100].to_numpy().shape == (100,)
    finally:
        pool.materialize_limit = old
    # a selection inside one local slab comes back without a copy
    v = x[2:6].to_numpy()
    assert v.base is not None
    x[3] = -1.0
    assert v[1] == -1.0
    with pytest.raises(ValueError):
        x[2:50].to_numpy(copy=False)
    r = pt.from_numpy(ref, access="readonly", placement="local")
    rv = r[0:4].to_numpy()
    assert not rv.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        r[0] = 5
    ps.assert_same(r.to_numpy(), ref)


@PROPS
@given(shape=ps.SHAPES, dtype=st.sampled_from(ps.DTYPES), data=st.data())
def test_blocks_cover_the_view_in_c_order(pool, shape, dtype, data):
    x, ref, v, rv = _basic_view(shape, dtype, data)
    if not isinstance(rv, np.ndarray):
        return
    got = list(v.blocks(with_index=True))
    flat = rv.reshape(-1)
    pos = 0
    for start, blk in got:
        assert start == pos and not blk.flags.writeable and blk.ndim == 1
        np.testing.assert_array_equal(blk, flat[pos:pos + blk.size])
        pos += blk.size
    assert pos == flat.size


def test_pool_to_pool_assignment_in_chunks(pool, monkeypatch):
    import pooltensor.array.array as arr
    monkeypatch.setattr(arr, "CHUNK", 256)
    ref = np.arange(3000, dtype=np.float64).reshape(100, 30)
    src = pt.from_numpy(ref * 2, placement="interleave")
    x = pt.from_numpy(ref)
    x[::-1] = src
    np.testing.assert_array_equal(x.to_numpy(), (ref * 2)[::-1])
    x[5] = src[7]
    np.testing.assert_array_equal(x[5].to_numpy(), ref[7] * 2)
    x[:, 3] = pt.from_numpy(np.ones(100))
    assert x[50, 3] == 1.0


def test_every_public_name_has_a_docstring():
    names = [getattr(pt, n) for n in pt.__all__]
    names += [getattr(pt.ndarray, n) for n in dir(pt.ndarray) if not n.startswith("_")]
    names += [getattr(pt.Pool, n) for n in dir(pt.Pool) if not n.startswith("_")]
    names += [getattr(pt.random, n) for n in ("random", "standard_normal", "integers")]
    missing = [getattr(o, "__qualname__", repr(o)) for o in names
               if callable(o) and not (getattr(o, "__doc__", None) or "").strip()]
    assert not missing, missing


@PROPS
@given(kind=st.sampled_from(["int", "float", "mixed"]), a=st.integers(-300, 300),
       b=st.integers(-300, 300), s=st.integers(-40, 40).filter(lambda v: v != 0),
       f=st.floats(-50, 50, allow_nan=False), g=st.floats(0.01, 7),
       dtype=st.sampled_from([None, np.float32, np.float64, np.int32, np.int64]),
       num=st.integers(0, 400), endpoint=st.booleans())
def test_arange_and_linspace_match_numpy(pool, kind, a, b, s, f, g, dtype, num, endpoint):
    if kind == "int":
        args = (a, b, s)
    elif kind == "float":
        args = (f, f + g * 37, g)
    else:
        args = (a, b + 0.5, s / 4)
    want, werr = ps.outcome(lambda: np.arange(*args, dtype=dtype))
    got, gerr = ps.outcome(lambda: pt.arange(*args, dtype=dtype))
    assert gerr == werr
    if werr is None:
        ps.assert_same(got.to_numpy(), want, args)
    lw = np.linspace(args[0], args[1], num, endpoint=endpoint, dtype=dtype)
    ps.assert_same(pt.linspace(args[0], args[1], num, endpoint=endpoint, dtype=dtype).to_numpy(),
                   lw, (args, num, endpoint))
