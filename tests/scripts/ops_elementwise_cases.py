"""Hypothesis strategies and checks for elementwise operations on pool arrays, shared by the
in-process tests (tests/test_ops_elementwise.py) and the SPMD script
(tests/scripts/ops_elementwise_spmd.py).

A case is a ufunc (or operator) and its operands, each described by a small spec (kind,
shape, dtype, seed, layout, placement) from which build() makes both the numpy reference
value and the value handed to pooltensor: a pool array holding the same elements (laid out
contiguously, starting mid-slab, strided, reversed or transposed), the same numpy array, or
the same scalar. Shapes broadcast to a result shape of up to 4 dimensions, and sometimes
do not (numpy's ValueError is then expected).
"""
import numpy as np
from hypothesis import strategies as st

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128]
REAL = [d for d in DTYPES if np.dtype(d).kind != "c"]
LAYOUTS = ["contig", "contig", "offset", "padded", "strided", "reversed", "transposed"]
PLACEMENTS = ["block", "interleave", "balanced"]

# exact: numpy computes the same bits whatever the memory layout; approx: numpy's SIMD and
# scalar loops may differ in the last bits (compared with a tolerance per dtype)
BINARY_EXACT = [np.add, np.subtract, np.multiply, np.true_divide, np.floor_divide,
                np.remainder, np.maximum, np.minimum, np.fmax, np.fmin, np.bitwise_and,
                np.bitwise_or, np.bitwise_xor, np.left_shift, np.right_shift, np.equal,
                np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal,
                np.logical_and, np.logical_or, np.logical_xor, np.copysign, np.heaviside]
BINARY_APPROX = [np.power, np.arctan2, np.hypot, np.logaddexp]
UNARY_EXACT = [np.negative, np.positive, np.absolute, np.invert, np.logical_not, np.isnan,
               np.isinf, np.isfinite, np.signbit, np.sign, np.floor, np.ceil, np.trunc,
               np.rint, np.sqrt, np.square, np.reciprocal, np.conjugate]
UNARY_APPROX = [np.sin, np.cos, np.tanh, np.exp, np.expm1, np.log, np.log1p, np.arctan,
                np.cbrt]
APPROX = set(BINARY_APPROX + UNARY_APPROX)
RTOL = {"e": 2e-3, "f": 4e-6, "d": 1e-13, "F": 4e-6, "D": 1e-13}


def values(shape, dtype, seed, special=False):
    """Reproducible values of `dtype` with small magnitudes (and inf/nan/-0.0 if special)."""
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    if dtype.kind == "b":
        return np.asarray(rng.random(shape) < 0.5)
    if dtype.kind == "u":
        return np.asarray(rng.integers(0, 40, shape)).astype(dtype)
    if dtype.kind == "i":
        return np.asarray(rng.integers(-20, 21, shape)).astype(dtype)
    v = np.round(rng.standard_normal(shape) * 8, 2)
    if dtype.kind == "c":
        v = v + 1j * np.round(rng.standard_normal(shape) * 8, 2)
    v = np.asarray(v).astype(dtype)
    if special and v.size:
        flat = v.reshape(-1)
        for s in (np.inf, -np.inf, np.nan, -0.0, 0.0):
            flat[rng.integers(0, flat.size)] = s
    return v


@st.composite
def result_shape(draw):
    nd = draw(st.integers(0, 4))
    return tuple(draw(st.lists(st.integers(0, 6) if draw(st.booleans()) else st.integers(1, 6),
                               min_size=nd, max_size=nd)))


@st.composite
def operand_shape(draw, shape, allow_bad=True):
    """A shape that broadcasts to `shape` (or, rarely, one that does not)."""
    drop = draw(st.integers(0, len(shape)))
    s = list(shape[drop:])
    for i in range(len(s)):
        if draw(st.integers(0, 3)) == 0:
            s[i] = 1
    if allow_bad and s and draw(st.integers(0, 15)) == 0:
        i = draw(st.integers(0, len(s) - 1))
        s[i] = s[i] + draw(st.integers(2, 3))       # a length that does not broadcast
    return tuple(s)


@st.composite
def operand(draw, shape, dtypes=DTYPES, kinds=("pool", "pool", "pool", "numpy", "npscalar",
                                                  "pyscalar"), allow_bad=True):
    kind = draw(st.sampled_from(kinds))
    spec = {"kind": kind, "dtype": np.dtype(draw(st.sampled_from(dtypes))).str,
            "seed": draw(st.integers(0, 2 ** 16)), "special": draw(st.integers(0, 4)) == 0}
    if kind in ("pool", "numpy"):
        spec["shape"] = draw(operand_shape(shape, allow_bad))
        spec["layout"] = draw(st.sampled_from(LAYOUTS))
        spec["placement"] = draw(st.sampled_from(PLACEMENTS))
    elif kind == "pyscalar":
        spec["value"] = draw(st.sampled_from([True, False, 0, 1, 2, -3, 7, 300, -1, 1.5, -0.0,
                                              2.25, float("nan"), float("inf"), 1 + 2j]))
    return spec


def _layout(ref, layout):
    """(numpy base, index) with base[index] == ref, laid out as `layout` says."""
    nd = ref.ndim
    if nd == 0 or layout == "contig" or ref.size == 0:
        return ref.copy(), ()
    if layout == "offset":
        base = np.zeros((ref.shape[0] + 1,) + ref.shape[1:], ref.dtype)
        idx = (slice(1, None),)
    elif layout == "padded":
        base = np.zeros(ref.shape[:-1] + (ref.shape[-1] + 3,), ref.dtype)
        idx = (Ellipsis, slice(2, -1))
    elif layout == "strided":
        base = np.zeros(ref.shape[:-1] + (2 * ref.shape[-1],), ref.dtype)
        idx = (Ellipsis, slice(1, None, 2))
    elif layout == "reversed":
        base = np.zeros(ref.shape, ref.dtype)
        idx = (slice(None, None, -1),)
    else:   # transposed
        return np.ascontiguousarray(ref.T), "T"
    base[idx] = ref
    return base, idx


def build(spec, pt):
    """(value for pooltensor, numpy reference value) of an operand spec."""
    kind = spec["kind"]
    if kind == "pyscalar":
        return spec["value"], spec["value"]
    dtype = np.dtype(spec["dtype"])
    if kind == "npscalar":
        v = values((), dtype, spec["seed"], spec["special"])[()]
        return v, v
    ref = values(spec["shape"], dtype, spec["seed"], spec["special"])
    if kind == "numpy":
        return ref, ref
    base, idx = _layout(ref, spec["layout"])
    x = pt.from_numpy(base, placement=spec["placement"])
    x = x.T if idx == "T" else x[idx] if idx != () else x
    return x, ref


def outcome(fn):
    """(result, None) or (None, exception type) of fn(), numpy's warnings silenced."""
    try:
        with np.errstate(all="ignore"):
            return fn(), None
    except (ValueError, TypeError, ArithmeticError) as e:
        return None, type(e)


def as_numpy(r):
    return r.to_numpy() if hasattr(r, "to_numpy") else r


def assert_close(got, want, approx=False, what=""):
    """Same shape and dtype; equal values (NaN == NaN), within RTOL when approx."""
    got = np.asarray(as_numpy(got))
    want = np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
    if approx and want.dtype.char in RTOL:
        np.testing.assert_allclose(got, want, rtol=RTOL[want.dtype.char], atol=0,
                                   equal_nan=True, err_msg=str(what))
    else:
        assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), \
            (what, got, want)


@st.composite
def ufunc_case(draw, allow_bad=True):
    """(ufunc, operand specs) for a unary or binary ufunc; at least one pool operand."""
    binary = draw(st.booleans())
    uf = draw(st.sampled_from(BINARY_EXACT + BINARY_APPROX if binary else
                              UNARY_EXACT + UNARY_APPROX))
    shape = draw(result_shape())
    specs = [draw(operand(shape, allow_bad=allow_bad)) for _ in range(uf.nin)]
    i = draw(st.integers(0, uf.nin - 1))
    if specs[i]["kind"] != "pool":
        specs[i] = draw(operand(shape, kinds=("pool",), allow_bad=allow_bad))
    return uf, specs


def run_case(uf, specs, pt, **kw):
    """Apply uf to the pool operands and to the numpy references; compare."""
    built = [build(s, pt) for s in specs]
    want, werr = outcome(lambda: uf(*[b[1] for b in built], **kw))
    got, gerr = outcome(lambda: uf(*[b[0] for b in built], **kw))
    assert gerr == werr, (uf.__name__, specs, gerr, werr)
    if werr is None:
        assert isinstance(got, pt.ndarray), (uf.__name__, type(got))
        with np.errstate(all="ignore"):
            assert_close(got, want, uf in APPROX, (uf.__name__, specs))
    return got, want
