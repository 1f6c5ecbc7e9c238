"""Elementwise operations on pool arrays against numpy: ufuncs (NEP-13), operators, in-place
operators, out= and where=, astype/copy/where/clip, numpy's errors, and the executor they run
on (map_blocks, local_blocks, new_like, allreduce/allgather).

Pools are built in this process (a plain script as far as pooltensor knows) with 1, 2 and 3
members, slabs of 64 bytes (a few elements: blocks start and end mid-row, operands start
mid-slab) and a cache of a few slabs (evictions all the time). The SPMD script
(scripts/ops_elementwise_spmd.py) runs the same kind of cases on 2 and 3 real ranks.
"""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ops_elementwise_cases as oc
import pooltensor as pt
from conftest import SLAB, PAIRED_RUNS, check_ranks, pool_fixture, property_settings
from pooltensor.ops import blocks, executor

PROPS = property_settings("OPS_EXAMPLES", 120, "POOL_DERANDOMIZE")
FEW = settings(PROPS, max_examples=max(10, PROPS.max_examples // 3))

# complex -> real casts warn in numpy's reference computations as in ours
pytestmark = [pytest.mark.timeout(300),
              pytest.mark.filterwarnings("ignore::numpy.exceptions.ComplexWarning")]

# 2 members: their slabs mapped in place (the default); 3: copied through the cache
pool = pool_fixture(1, 2, ("3members-copy", {"members": 3, "attach": False}))


# -- ufuncs ------------------------------------------------------------------------------------

@PROPS
@given(case=oc.ufunc_case())
def test_ufuncs_match_numpy(pool, case):
    uf, specs = case
    oc.run_case(uf, specs, pt)


@FEW
@given(case=oc.ufunc_case(allow_bad=False),
       dtype=st.sampled_from([None, np.float32, np.float64, np.int64, np.int8]),
       casting=st.sampled_from(["same_kind", "unsafe", "safe", "no"]))
def test_dtype_and_casting_arguments(pool, case, dtype, casting):
    uf, specs = case
    oc.run_case(uf, specs, pt, dtype=dtype, casting=casting)


@FEW
@given(shape=oc.result_shape(), dt=st.sampled_from(oc.REAL), seed=st.integers(0, 99),
       uf=st.sampled_from([np.divmod, np.modf, np.frexp]))
def test_ufuncs_with_two_outputs(pool, shape, dt, seed, uf):
    ref = oc.values(shape, dt, seed)
    x = pt.from_numpy(ref)
    args = (x, 3) if uf is np.divmod else (x,)
    nargs = (ref, 3) if uf is np.divmod else (ref,)
    want, werr = oc.outcome(lambda: uf(*nargs))
    got, gerr = oc.outcome(lambda: uf(*args))
    assert gerr == werr
    if werr is None:
        assert isinstance(got, tuple) and len(got) == 2
        for g, w in zip(got, want):
            oc.assert_close(g, w)


def test_python_and_numpy_scalars_promote_as_numpy(pool):
    x8 = pt.from_numpy(np.arange(10, dtype=np.int8))
    f32 = pt.from_numpy(np.linspace(0, 1, 10, dtype=np.float32))
    assert (x8 + 1).dtype == np.int8                 # NEP 50: Python int is weak
    assert (x8 + 1.5).dtype == np.float64
    assert (x8 + np.int16(1)).dtype == np.int16      # numpy scalars are not
    assert (f32 * 2.0).dtype == np.float32
    assert (f32 * np.float64(2)).dtype == np.float64
    assert (x8 + x8.astype(np.uint8)).dtype == np.int16
    with pytest.raises(OverflowError):
        x8 + 300
    with pytest.raises(OverflowError):
        pt.from_numpy(np.arange(3, dtype=np.uint8)) - 1 + (-1)


def test_results_are_placed_like_the_first_operand(pool):
    x = pt.from_numpy(np.arange(300, dtype=np.float64), placement="interleave")
    y = pt.from_numpy(np.arange(300, dtype=np.float64), placement="block")
    r = x * y + 1
    assert list(r.slab_members) == list(x.slab_members)
    r8 = (x > 5)          # 1-byte results: a slab holds 8 source slabs' elements
    assert r8.slab_members[0] == x.slab_members[0]
    np.testing.assert_array_equal(r.to_numpy(), np.arange(300.) ** 2 + 1)


# -- operators ---------------------------------------------------------------------------------

BINOPS = ["+", "-", "*", "/", "//", "%", "**", "&", "|", "^", "<<", ">>", "<", "<=", ">",
          ">=", "==", "!="]


@PROPS
@given(shape=oc.result_shape(), data=st.data(), op=st.sampled_from(BINOPS),
       reflected=st.booleans())
def test_operators_match_numpy(pool, shape, data, op, reflected):
    a = oc.build(data.draw(oc.operand(shape, kinds=("pool",))), pt)
    b = oc.build(data.draw(oc.operand(shape, kinds=("pool", "numpy", "npscalar", "pyscalar"))),
                 pt)
    if reflected:
        a, b = b, a
    fn = eval(f"lambda u, v: u {op} v")      # noqa: S307  (a fixed operator table)
    want, werr = oc.outcome(lambda: fn(a[1], b[1]))
    got, gerr = oc.outcome(lambda: fn(a[0], b[0]))
    assert gerr == werr, (op, gerr, werr)
    if werr is None:
        assert isinstance(got, pt.ndarray)
        oc.assert_close(got, want, op == "**", op)


@FEW
@given(shape=oc.result_shape(), data=st.data(), op=st.sampled_from(["-", "+", "abs", "~"]))
def test_unary_operators_match_numpy(pool, shape, data, op):
    x, ref = oc.build(data.draw(oc.operand(shape, kinds=("pool",))), pt)
    fn = abs if op == "abs" else eval(f"lambda u: {op}u")      # noqa: S307
    want, werr = oc.outcome(lambda: fn(ref))
    got, gerr = oc.outcome(lambda: fn(x))
    assert gerr == werr
    if werr is None:
        oc.assert_close(got, want)


@PROPS
@given(shape=oc.result_shape(), data=st.data(),
       op=st.sampled_from(["+=", "-=", "*=", "/=", "//=", "%=", "**=", "&=", "|=", "^=",
                           "<<=", ">>="]),
       view=st.sampled_from([None, "tail", "cols", "alias"]))
def test_inplace_operators_match_numpy(pool, shape, data, op, view):
    spec = data.draw(oc.operand(shape, kinds=("pool",), allow_bad=False))
    spec["shape"] = shape
    x, ref = oc.build(spec, pt)
    ref = ref.copy()
    if view == "alias" and shape and shape[0] > 1:
        # the right side overlaps the left at other positions: numpy's result, not blockwise
        lhs, rhs = (x[1:], ref[1:]), (x[:-1], ref[:-1].copy())
    else:
        b = oc.build(data.draw(oc.operand(shape, kinds=("pool", "numpy", "npscalar",
                                                        "pyscalar"))), pt)
        rhs = (b[0], b[1])
        if view == "tail" and shape and shape[0] > 1:
            lhs = (x[1:], ref[1:])
            rhs = tuple(r[1:] if getattr(r, "shape", ())[:1] == (shape[0],) else r
                        for r in rhs)
        elif view == "cols" and len(shape) > 1:
            lhs = (x[..., ::2], ref[..., ::2])
            rhs = tuple(r[..., ::2] if getattr(r, "shape", ())[-1:] == shape[-1:] and
                        len(getattr(r, "shape", ())) == len(shape) else r for r in rhs)
        else:
            lhs = (x, ref)
    code = f"def f(u, v):\n    u {op} v\n    return u\n"
    ns = {}
    exec(code, ns)                                         # noqa: S102  (fixed table)
    want, werr = oc.outcome(lambda: ns["f"](lhs[1], rhs[1]))
    got, gerr = oc.outcome(lambda: ns["f"](lhs[0], rhs[0]))
    assert gerr == werr, (op, gerr, werr)
    if werr is None:
        assert got is lhs[0]
        with np.errstate(all="ignore"):
            oc.assert_close(x, ref, op == "**=", (op, view))


def test_inplace_errors_are_numpys(pool):
    x = pt.from_numpy(np.arange(12, dtype=np.int64).reshape(3, 4))
    with pytest.raises(np._core._exceptions._UFuncOutputCastingError):
        x += 1.5
    with pytest.raises(TypeError):
        x /= 2
    np.testing.assert_array_equal(x.to_numpy(), np.arange(12).reshape(3, 4))   # untouched
    b = pt.from_numpy(np.ones(4, bool))
    with pytest.raises(TypeError):
        b - b
    f = pt.from_numpy(np.arange(12.0).reshape(3, 4))
    with pytest.raises(ValueError, match="broadcast"):
        f += np.ones(3)
    with pytest.raises(ValueError, match="non-broadcastable output"):
        np.add(f, 1, out=pt.zeros(4))
    r = pt.from_numpy(np.arange(4.0), access="readonly")
    with pytest.raises(ValueError, match="read-only"):
        r += 1
    with pytest.raises(ValueError, match="broadcast"):
        x + pt.zeros(5)


# -- out= and where= ------------------------------------------------------------------------

@PROPS
@given(shape=oc.result_shape(), data=st.data(), where_kind=st.sampled_from(
    [None, "pool", "numpy", "scalar"]), out_kind=st.sampled_from(["pool", "view", "numpy"]),
    out_dtype=st.sampled_from(oc.DTYPES), uf=st.sampled_from([np.add, np.multiply,
                                                             np.maximum, np.sin]))
def test_out_and_where_match_numpy(pool, shape, data, where_kind, out_kind, out_dtype, uf):
    specs = [data.draw(oc.operand(shape, allow_bad=False)) for _ in range(uf.nin)]
    built = [oc.build(s, pt) for s in specs]
    init = oc.values(shape, out_dtype, 5)
    if out_kind == "numpy":
        out_p, out_n = init.copy(), init.copy()
    elif out_kind == "view" and shape:
        base = np.zeros(shape[:-1] + (shape[-1] + 2,), out_dtype)
        base[..., 1:-1] = init
        out_p, out_n = pt.from_numpy(base)[..., 1:-1], init.copy()
    else:
        out_p, out_n = pt.from_numpy(init), init.copy()
    kw_p, kw_n = {}, {}
    if where_kind == "scalar":
        kw_p["where"] = kw_n["where"] = data.draw(st.booleans())
    elif where_kind is not None:
        mshape = data.draw(oc.operand_shape(shape, allow_bad=False))
        mask = oc.values(mshape, bool, 7)
        kw_n["where"] = mask
        kw_p["where"] = pt.from_numpy(mask) if where_kind == "pool" else mask
    want, werr = oc.outcome(lambda: uf(*[b[1] for b in built], out=out_n, **kw_n))
    got, gerr = oc.outcome(lambda: uf(*[b[0] for b in built], out=out_p, **kw_p))
    assert gerr == werr, (gerr, werr)
    if werr is None:
        assert got is out_p
        oc.assert_close(out_p, out_n, uf is np.sin)


def test_where_without_out_fills_the_selected_elements(pool):
    ref = np.arange(40.0).reshape(5, 8)
    mask = (np.arange(40) % 3 == 0).reshape(5, 8)
    with pytest.warns(UserWarning, match="unitialized"):       # numpy's own warning
        r = np.multiply(pt.from_numpy(ref), 2, where=pt.from_numpy(mask))
    np.testing.assert_array_equal(r.to_numpy()[mask], ref[mask] * 2)


# -- astype, copy, where, clip ---------------------------------------------------------------

@PROPS
@given(shape=oc.result_shape(), data=st.data(), to=st.sampled_from(oc.DTYPES),
       casting=st.sampled_from(["unsafe", "same_kind", "safe"]))
def test_astype_and_copy(pool, shape, data, to, casting):
    spec = data.draw(oc.operand(shape, kinds=("pool",), allow_bad=False))
    spec["shape"] = shape
    x, ref = oc.build(spec, pt)
    want, werr = oc.outcome(lambda: ref.astype(to, casting=casting))
    got, gerr = oc.outcome(lambda: x.astype(to, casting=casting))
    assert gerr == werr
    if werr is None:
        oc.assert_close(got, want)
    c = x.copy()
    oc.assert_close(c, ref)
    if c.size:
        c[(0,) * c.ndim] = 1
        oc.assert_close(x, ref)         # a copy, not a view
    assert x.astype(x.dtype, copy=False) is x
    assert pt.astype(x, x.dtype, copy=False) is x


@PROPS
@given(shape=oc.result_shape(), data=st.data())
def test_where_matches_numpy(pool, shape, data):
    c = oc.build(data.draw(oc.operand(shape, dtypes=[np.bool_, np.int8, np.float32],
                                      kinds=("pool", "numpy"))), pt)
    a = oc.build(data.draw(oc.operand(shape)), pt)
    b = oc.build(data.draw(oc.operand(shape)), pt)
    want, werr = oc.outcome(lambda: np.where(c[1], a[1], b[1]))
    got, gerr = oc.outcome(lambda: np.where(c[0], a[0], b[0]))
    assert gerr == werr
    if werr is None:
        oc.assert_close(got, want)
        oc.assert_close(pt.where(c[0], a[0], b[0]), want)


@PROPS
@given(shape=oc.result_shape(), data=st.data(), kw=st.booleans())
def test_clip_matches_numpy(pool, shape, data, kw):
    x, ref = oc.build(data.draw(oc.operand(shape, dtypes=oc.REAL, kinds=("pool",))), pt)
    lo = oc.build(data.draw(oc.operand(shape, dtypes=oc.REAL)), pt)
    hi = oc.build(data.draw(oc.operand(shape, dtypes=oc.REAL)), pt)
    if data.draw(st.booleans()):
        lo = (None, None)
    if kw:
        want, werr = oc.outcome(lambda: np.clip(ref, min=lo[1], max=hi[1]))
        got, gerr = oc.outcome(lambda: np.clip(x, min=lo[0], max=hi[0]))
    else:
        want, werr = oc.outcome(lambda: np.clip(ref, lo[1], hi[1]))
        got, gerr = oc.outcome(lambda: x.clip(lo[0], hi[0]))
    assert gerr == werr
    if werr is None:
        oc.assert_close(got, want)


# -- other ufunc methods -----------------------------------------------------------------------

def test_ufunc_methods_fall_back_with_a_warning(pool):
    ref = np.arange(20, dtype=np.int32).reshape(4, 5)
    x = pt.from_numpy(ref)
    with pytest.warns(pt.FallbackWarning, match="accumulate"):
        got = np.add.accumulate(x, axis=1)
    np.testing.assert_array_equal(got, np.add.accumulate(ref, axis=1))
    with pytest.warns(pt.FallbackWarning, match="outer"):
        got = np.multiply.outer(x[0], x[1])
    np.testing.assert_array_equal(got, np.multiply.outer(ref[0], ref[1]))
    with pytest.warns(pt.FallbackWarning):
        np.add.at(x, [0, 0, 2], 1)
    want = ref.copy()
    np.add.at(want, [0, 0, 2], 1)
    np.testing.assert_array_equal(x.to_numpy(), want)


# -- the executor --------------------------------------------------------------------------------

@FEW
@given(shape=oc.result_shape(), data=st.data())
def test_map_blocks_and_local_blocks(pool, shape, data):
    x, ref = oc.build(data.draw(oc.operand(shape, dtypes=oc.REAL, kinds=("pool",))), pt)
    y = oc.build(data.draw(oc.operand(shape, dtypes=oc.REAL, kinds=("pool", "numpy",
                                                                     "pyscalar"))), pt)
    try:
        with np.errstate(all="ignore"):
            want = (np.asarray(ref, np.float64) * 2 - y[1]).astype(np.float32)
    except (ValueError, TypeError):
        return
    out = executor.new_like(want.shape, np.float32, like=x if x.shape == want.shape else None)
    with np.errstate(all="ignore"):
        blocks.map_into(lambda a, b: np.asarray(a, np.float64) * 2 - b, out, x, y[0])
    oc.assert_close(out, want)
    seen = np.zeros(ref.shape, np.int64)
    last = -1
    for index, blk in blocks.local_blocks(x):
        assert len(index) == x.ndim and all(isinstance(s, slice) for s in index)
        np.testing.assert_array_equal(blk, ref[index])
        first = np.ravel_multi_index([s.start for s in index], ref.shape) if ref.ndim else 0
        assert first > last                                          # C order
        last = first
        seen[index] += 1
    assert (seen == 1).all()                                         # each element once


def test_boxes_cover_a_flat_range_in_order():
    shape = (3, 4, 5)
    ref = np.arange(60).reshape(shape)
    for e0 in range(0, 60, 7):
        for e1 in range(e0, 61, 5):
            got = [ref[b].reshape(-1) for b, n in executor.boxes(shape, e0, e1)]
            assert len(got) <= 2 * len(shape) - 1
            flat = np.concatenate(got) if got else np.zeros(0, int)
            np.testing.assert_array_equal(flat, np.arange(e0, e1))


def test_allreduce_and_allgather_in_a_plain_script(pool):
    assert executor.spmd(pool) is False
    assert executor.allreduce(np.float64(2.5), "sum") == 2.5
    assert executor.allgather({"a": [1, 2]}) == [{"a": [1, 2]}]
    v = np.arange(3)
    assert executor.allgather(v)[0] is v


def test_new_like_lines_up_with_like(pool):
    x = pt.from_numpy(np.arange(200, dtype=np.int64), placement="interleave")
    y = executor.new_like(x.shape, np.int64, like=x)
    assert list(y.slab_members) == list(x.slab_members)
    z = executor.new_like((10, 20), np.int16)
    assert z.shape == (10, 20) and z.dtype == np.int16 and z.access == "readwrite"
    v = executor.new_like((100,), np.float32, like=x[::2])    # a view: its elements' homes
    homes = x.slab_members[(np.arange(v._a.members.__len__()) * (SLAB // 4) * 2 * 8) // SLAB]
    assert list(v.slab_members) == list(homes)


def test_remote_results_stream_through_a_small_cache(pool):
    ref = np.arange(5000, dtype=np.float64)
    a = pt.from_numpy(ref, placement="interleave")
    b = pt.from_numpy(ref[::-1].copy(), placement="block")
    before = pool.cache.stats()["overcommit"]
    np.testing.assert_array_equal((a * b + a).to_numpy(), ref * ref[::-1] + ref)
    assert pool.cache.stats()["overcommit"] - before <= 8     # pins are released as we go


def test_remote_operands_are_prefetched(pool):
    if pool.size == 1:
        pytest.skip("one member: every slab is local")
    if pool.mapped:
        pytest.skip("the members' slabs are mapped here: read in place, not prefetched")
    ref = np.arange(4000, dtype=np.float64)
    a = pt.from_numpy(ref, placement="interleave")
    b = pt.from_numpy(ref + 1, placement="block")
    pool.cache.reset_counters()
    r = a * b
    s = pool.cache.stats()
    assert s["prefetch_used"] > 0 and s["hits"] > s["misses"], s
    np.testing.assert_array_equal(r.to_numpy(), ref * (ref + 1))


# -- SPMD ----------------------------------------------------------------------------------------

@pytest.mark.timeout(240)
@PAIRED_RUNS
def test_spmd_elementwise(launcher, n):
    p = check_ranks(launcher, n, "ops_elementwise_spmd.py", "40", timeout=220)
    assert p.stdout.count("ops elementwise spmd ok") == n, p.stdout


def test_no_warning_on_the_implemented_path(pool):
    x = pt.from_numpy(np.arange(10.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (x + 1) * np.sin(x)
        np.where(x > 3, x, 0)
        np.clip(x, 1, 2)
