"""Hypothesis strategies and checks for reductions and matrix products of pool arrays, shared by
the in-process tests (tests/test_ops_reductions.py) and the SPMD script
(tests/scripts/ops_reduce_spmd.py).

A case names the function, the array (shape, dtype, seed, layout: contiguous, starting
mid-slab, strided, reversed, transposed) and the arguments (axis: None, one, negative, a tuple,
sometimes a bad one; keepdims; dtype=; ddof). check_reduction() builds the numpy reference and
a pool array holding the same elements, calls numpy's function on the reference and ours
(as a method, through numpy's function, or pooltensor's) and compares: the same exception
type, or the same kind of result (numpy scalar / array; a pool array only above the pool's
advanced_limit), shape, dtype, and values:

- exact for integer and boolean results, min/max/argmin/argmax/any/all (NaN where numpy has
  NaN) and products (their float inputs are -1, 0, 1, so every order gives the same bits);
- floating sums and means within 16 * eps(result dtype) * sum(|x|) (over the reduced elements,
  computed in float64): partial sums are combined in another order than numpy's pairwise sum
  (a float32 sum of a huge array can legitimately differ from numpy's in the 6th digit; the
  bound grows with the magnitudes summed, not with a fixed rtol);
- var/std within a tolerance per dtype against numpy's (two-pass, as numpy).
"""
import warnings

import numpy as np
from hypothesis import strategies as st

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64, np.float16,
          np.float32, np.float64, np.complex64, np.complex128]
FUNCS = ["sum", "prod", "mean", "var", "std", "min", "max", "argmin", "argmax", "any", "all"]
EXACT = {"min", "max", "argmin", "argmax", "any", "all", "prod"}
PLACEMENTS = ["block", "interleave", "balanced"]
VAR_RTOL = {"e": 5e-3, "f": 2e-5, "d": 1e-11}


def values(shape, dtype, seed, fn="sum", nan=False):
    """Reproducible values: small magnitudes; -1/0/1 for float products; NaN if asked."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if fn in ("sum", "prod"):                       # wraps as numpy's, in any order
            return np.asarray(rng.integers(info.min, info.max, shape, dtype=dtype,
                                           endpoint=True))
        lo = 0 if dtype.kind == "u" else -100
        return np.asarray(rng.integers(lo, 100, shape), dtype=dtype)
    if fn == "prod":
        v = rng.integers(-1, 2, shape).astype(np.float64)
        if dtype.kind == "c":
            v = v + 1j * 0
    else:
        scale = 4 if dtype == np.float16 else 100            # float16 sums stay finite
        v = rng.uniform(-scale, scale, shape)
        if dtype.kind == "c":
            v = v + 1j * rng.uniform(-scale, scale, shape)
    v = np.asarray(v).astype(dtype)
    if nan and v.size and dtype.kind in "fc":
        flat = v.reshape(-1)
        for _ in range(rng.integers(1, 3)):
            flat[rng.integers(0, flat.size)] = np.nan
    return v


@st.composite
def layout(draw, shape):
    """(base shape, index, perm): base[index].transpose(perm) has `shape` (perm applied
    last); index slices start mid-array, skip, or run backwards."""
    nd = len(shape)
    perm = None
    if nd > 1 and draw(st.integers(0, 3)) == 0:
        perm = tuple(draw(st.permutations(range(nd))))
    pre = shape if perm is None else tuple(shape[perm.index(i)] for i in range(nd))
    if draw(st.booleans()):
        return pre, (), perm                             # the whole (contiguous) array
    base, index = [], []
    for n in pre:
        step = draw(st.sampled_from([1, 1, 2, -1]))
        start = draw(st.integers(0, 3))
        extra = draw(st.integers(0, 1))
        if n == 0:
            base.append(start + extra)
            index.append(slice(start, start))
            continue
        span = (n - 1) * abs(step) + 1
        base.append(start + span + extra)
        if step > 0:
            index.append(slice(start, start + span, step))
        else:
            index.append(slice(start + span - 1, start - 1 if start else None, step))
    return tuple(base), tuple(index), perm


@st.composite
def axis_for(draw, nd, single=False):
    kind = draw(st.sampled_from(["none", "int", "int", "tuple", "bad"] if not single
                                else ["none", "int", "int", "bad"]))
    if kind == "none" or (nd == 0 and kind != "bad"):
        return None if kind != "tuple" else ()
    if kind == "int":
        return draw(st.integers(-nd, nd - 1))
    if kind == "tuple":
        k = draw(st.integers(0, nd))
        axes = draw(st.permutations(range(nd)))[:k]
        return tuple(a - nd if draw(st.booleans()) else a for a in axes)
    bad = draw(st.sampled_from(["oob", "neg", "dup"] if nd and not single else ["oob", "neg"]))
    if bad == "oob":
        return nd
    if bad == "neg":
        return -nd - 1
    return (0, -nd)


@st.composite
def reduction_case(draw, funcs=FUNCS):
    fn = draw(st.sampled_from(funcs))
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=4)))
    if draw(st.integers(0, 5)) == 0:
        shape = tuple(max(1, n) for n in shape)
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    lay = draw(layout(shape))
    single = fn in ("argmin", "argmax")
    axis = draw(axis_for(len(shape), single))
    kw = {}
    if draw(st.booleans()):
        kw["keepdims"] = draw(st.booleans())
    if fn in ("sum", "prod", "mean", "var", "std") and draw(st.integers(0, 3)) == 0:
        choices = [np.float64, np.float32, np.int64, np.complex128]
        if fn == "prod":     # a float product of big integers rounds differently per order
            choices = [np.int64, np.uint8] if dtype.kind in "biu" else [np.float64, np.int64]
        kw["dtype"] = draw(st.sampled_from(choices))
    if fn in ("var", "std") and draw(st.booleans()):
        kw["ddof"] = draw(st.integers(0, 2))
    seed = draw(st.integers(0, 2**32 - 1))
    nan = fn in ("sum", "min", "max", "argmin", "argmax", "any", "all") and \
        draw(st.integers(0, 3)) == 0
    how = draw(st.sampled_from(["method", "numpy", "pooltensor"]))
    placement = draw(st.sampled_from(PLACEMENTS))
    return dict(fn=fn, shape=shape, dtype=dtype, layout=lay, axis=axis, kw=kw, seed=seed,
                nan=nan, how=how, placement=placement)


def build(case, pt):
    """(numpy reference view, pool view with the same elements, base arrays)."""
    base_shape, index, perm = case["layout"]
    ref_base = values(base_shape, case["dtype"], case["seed"], case["fn"], case["nan"])
    x_base = pt.from_numpy(ref_base, placement=case["placement"])
    ref, x = (ref_base, x_base) if index == () else (ref_base[index], x_base[index])
    if perm is not None:
        ref, x = ref.transpose(perm), x.transpose(perm)
    return ref, x


def outcome(fn):
    """(result, None) or (None, exception type)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return fn(), None
    except (IndexError, ValueError, TypeError) as e:
        return None, type(e)


def call(case, arr, pt, pool_side):
    fn, kw = case["fn"], dict(case["kw"])
    if case["axis"] is not None:
        kw["axis"] = case["axis"]
    if not pool_side:
        return getattr(np, fn)(arr, **kw)
    if case["how"] == "method":
        return getattr(arr, fn)(**kw)
    if case["how"] == "numpy":
        return getattr(np, fn)(arr, **kw)
    return getattr(pt, fn)(arr, **kw)


def _eps(dtype):
    dtype = np.dtype(dtype)
    return np.finfo(dtype).eps if dtype.kind in "fc" else 0.0


def check_reduction(case, pt, limit):
    """Run one case against numpy; returns our result as numpy (for cross-rank checks)."""
    ref, x = build(case, pt)
    want, werr = outcome(lambda: call(case, ref, pt, False))
    got, gerr = outcome(lambda: call(case, x, pt, True))
    assert gerr == werr, (case, gerr, werr)
    if werr is not None:
        return None
    return compare(case, got, want, ref, pt, limit)


def compare(case, got, want, ref, pt, limit, what=None):
    """Kind, shape, dtype, values (see the module docstring); returns got as numpy."""
    what = what or case
    if isinstance(case, dict) and case.get("how") == "pooltensor" and \
            case.get("kw", {}).get("out") is None:
        # the Array API namespace gives pool arrays, small results too (held locally)
        assert isinstance(got, pt.ndarray), (what, type(got))
        g = got.to_numpy()
        assert g.shape == np.shape(want), (what, g.shape, np.shape(want))
    elif isinstance(want, np.ndarray):
        big = want.nbytes > limit
        assert isinstance(got, pt.ndarray if big else np.ndarray), (what, type(got), big)
        g = got.to_numpy() if isinstance(got, pt.ndarray) else got
        assert g.shape == want.shape, (what, g.shape, want.shape)
    else:
        assert isinstance(got, np.generic), (what, type(got), type(want))
        g = np.asarray(got)
    assert g.dtype == want.dtype, (what, g.dtype, want.dtype)
    fn = case["fn"] if isinstance(case, dict) and "fn" in case else "matmul"
    w = np.asarray(want)
    if w.dtype.kind in "biu" or fn in EXACT:
        assert np.array_equal(g, w, equal_nan=w.dtype.kind in "fc"), (what, g, w)
        return g
    if fn in ("var", "std"):
        r = VAR_RTOL[np.dtype(w.dtype).char.lower() if w.dtype.kind == "f" else "d"]
        r64 = ref.astype(np.complex128 if ref.dtype.kind == "c" else np.float64)
        mag = float(np.max(np.abs(r64))) if r64.size else 0.0
        atol = r * mag * mag if fn == "var" else np.sqrt(r) * mag
        assert np.allclose(g, w, rtol=r, atol=atol, equal_nan=True), (what, g, w)
        return g
    sum_tolerance(case, g, w, ref)
    return g


def sum_tolerance(case, g, w, ref):
    """Floating sum/mean check (see the module docstring)."""
    kw = dict(case["kw"])
    kw.pop("dtype", None)
    kw.pop("ddof", None)
    axis = case["axis"]
    r64 = np.abs(ref.astype(np.complex128 if ref.dtype.kind == "c" else np.float64))
    mag = np.sum(r64, axis=axis, keepdims=kw.get("keepdims", False))
    if case["fn"] == "mean":
        n = ref.size if axis is None else int(np.prod(
            [ref.shape[a] for a in ((axis,) if isinstance(axis, int) else axis)]))
        mag = mag / max(n, 1)
    tol = 16 * _eps(w.dtype) * mag + 1e-300
    bad = ~(np.abs(g.astype(np.complex128) - w.astype(np.complex128)) <= tol)
    bad &= ~(np.isnan(g) & np.isnan(w))
    bad &= ~((g == w) & np.isinf(w))
    assert not np.any(bad), (case, g, w, tol)


# -- matrix products -----------------------------------------------------------------------------

MM_DTYPES = [np.bool_, np.int8, np.int32, np.int64, np.float32, np.float64, np.complex128]


@st.composite
def matmul_case(draw):
    """Shapes (..., N, K) @ (K, M) / (K,), (K,) @ (K, M) / (K,); which side is a pool array;
    sometimes a K that does not match."""
    kind = draw(st.sampled_from(["mat", "mat", "matvec", "vecmat", "vecvec", "batch"]))
    N, K, M = (draw(st.integers(0, 9)) for _ in range(3))
    K2 = K if draw(st.integers(0, 7)) else K + draw(st.integers(1, 2))
    sa = {"mat": (N, K), "matvec": (N, K), "vecmat": (K,), "vecvec": (K,),
          "batch": (draw(st.integers(1, 3)), N, K)}[kind]
    sb = {"mat": (K2, M), "matvec": (K2,), "vecmat": (K2, M), "vecvec": (K2,),
          "batch": (K2, M)}[kind]
    pool_side = draw(st.sampled_from(["left", "right", "both"]))
    return dict(kind=kind, sa=sa, sb=sb, pool=pool_side,
                da=np.dtype(draw(st.sampled_from(MM_DTYPES))),
                db=np.dtype(draw(st.sampled_from(MM_DTYPES))),
                fn=draw(st.sampled_from(["@", "matmul", "dot"])),
                seed=draw(st.integers(0, 2**32 - 1)),
                offset=draw(st.booleans()), readonly=draw(st.booleans()),
                placement=draw(st.sampled_from(PLACEMENTS)))


def _mm_values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        return rng.integers(-5, 6, shape).astype(dtype)
    v = rng.uniform(-2, 2, shape)
    if dtype.kind == "c":
        v = v + 1j * rng.uniform(-2, 2, shape)
    return v.astype(dtype)


def _pool_copy(arr, case, pt, access="readwrite"):
    """A pool array with arr's elements, starting mid-array when case['offset']."""
    if case["offset"] and arr.ndim:
        big = np.zeros((arr.shape[0] + 1,) + arr.shape[1:], arr.dtype)
        big[1:] = arr
        return pt.from_numpy(big, placement=case["placement"], access=access)[1:]
    return pt.from_numpy(arr, placement=case["placement"], access=access)


def check_matmul(case, pt, limit):
    a = _mm_values(case["sa"], case["da"], case["seed"])
    b = _mm_values(case["sb"], case["db"], case["seed"] + 1)
    pa = _pool_copy(a, case, pt) if case["pool"] in ("left", "both") else a
    pb = (_pool_copy(b, case, pt, "readonly" if case["readonly"] else "readwrite")
          if case["pool"] in ("right", "both") else b)
    op = {"@": lambda u, v: u @ v, "matmul": np.matmul, "dot": np.dot}[case["fn"]]
    want, werr = outcome(lambda: op(a, b))
    got, gerr = outcome(lambda: op(pa, pb))
    assert gerr == werr, (case, gerr, werr)
    if werr is not None:
        return None
    rows = isinstance(pa, pt.ndarray) and pa.ndim >= 2
    if isinstance(want, np.ndarray) and (rows or want.nbytes > limit):
        assert isinstance(got, pt.ndarray), (case, type(got))
        g = got.to_numpy()
    else:
        assert isinstance(got, (np.ndarray, np.generic)), (case, type(got))
        assert isinstance(got, np.ndarray) == isinstance(want, np.ndarray), (case, type(got))
        g = np.asarray(got)
    w = np.asarray(want)
    assert g.shape == w.shape and g.dtype == w.dtype, (case, g.shape, w.shape, g.dtype, w.dtype)
    if w.dtype.kind in "biu":
        assert np.array_equal(g, w), (case, g, w)
    else:
        mag = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
        tol = 16 * np.finfo(w.dtype).eps * mag + 1e-300
        assert np.all(np.abs(g - w) <= tol), (case, g, w)
    return g
