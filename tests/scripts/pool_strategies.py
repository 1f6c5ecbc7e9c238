"""Hypothesis strategies and checks shared by the pool's property tests (in-process, plain
script with members, and SPMD under mpiexec/launcher).

An example is (shape, dtype, index): a numpy reference array is built from them and the
same index is applied to it and to a pool array holding the same data; results must match
in shape, dtype and values, and a bad index must raise the same exception type as numpy.
"""
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

DTYPES = [np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float32, np.float64,
          np.complex64, np.complex128]
SHAPES = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=7)


def reference(shape, dtype, salt=0):
    """Distinct, dtype-valid values (so a misplaced element shows)."""
    n = int(np.prod(shape, dtype=np.int64))
    base = np.arange(salt, salt + n, dtype=np.int64)
    if np.dtype(dtype) == np.bool_:
        vals = (base % 3 == 1)
    elif np.dtype(dtype).kind == "c":
        vals = (base % 251) + 1j * (base % 7)
    else:
        vals = base % (120 if np.dtype(dtype).itemsize == 1 else 30011)
    return np.asarray(vals).astype(dtype).reshape(shape)


@st.composite
def mixed_index(draw, shape):
    """A tuple mixing ints, slices, integer arrays (broadcasting together) and maybe Ellipsis."""
    nd = len(shape)
    k = draw(st.integers(0, nd))
    parts = []
    bshape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    for d in range(k):
        kind = draw(st.sampled_from(["int", "slice", "array", "array"]))
        n = shape[d]
        if kind == "array" and n > 0:
            parts.append(draw(hnp.arrays(np.intp, bshape, elements=st.integers(-n, n - 1))))
        elif kind == "int" and n > 0:
            parts.append(draw(st.integers(-n, n - 1)))
        else:
            parts.append(draw(st.slices(n)))
    if k < nd and draw(st.booleans()):
        parts.append(Ellipsis)
    if draw(st.booleans()) and parts:
        parts.insert(draw(st.integers(0, len(parts))), None)
    return tuple(parts)


@st.composite
def index_for(draw, shape, invalid=True):
    """Any index numpy accepts for `shape`, sometimes one it refuses."""
    choices = ["basic", "basic", "basic", "mixed", "bool"]
    if all(n > 0 for n in shape) and shape:
        choices.append("arrays")
    if invalid:
        choices.append("bad")
    kind = draw(st.sampled_from(choices))
    if kind == "basic":
        return draw(hnp.basic_indices(shape, min_dims=0, allow_newaxis=True,
                                      allow_ellipsis=True))
    if kind == "arrays":
        return draw(hnp.integer_array_indices(
            shape, result_shape=hnp.array_shapes(min_dims=0, max_dims=2, max_side=4)))
    if kind == "bool":
        k = draw(st.integers(0, len(shape)))
        mask = draw(hnp.arrays(np.bool_, shape[:k]))
        return (mask,) if draw(st.booleans()) else (Ellipsis, draw(hnp.arrays(np.bool_, shape[len(shape) - k:])))
    if kind == "mixed":
        return draw(mixed_index(shape))
    bad = draw(st.sampled_from(["oob", "many", "float", "list_oob", "mask"]))
    nd = len(shape)
    if bad == "oob" and nd:
        d = draw(st.integers(0, nd - 1))
        return (slice(None),) * d + (shape[d] + draw(st.integers(0, 3)),)
    if bad == "many":
        return (0,) * (nd + 1)
    if bad == "float":
        return (1.5,)
    if bad == "list_oob" and nd:
        return ([0, shape[0] + 2],)
    return (np.ones(tuple(n + 1 for n in shape) or (2,), bool),)


@st.composite
def case(draw, invalid=True):
    shape = draw(SHAPES)
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    index = draw(index_for(shape, invalid))
    return shape, dtype, index


def outcome(fn):
    """(result, None) or (None, exception type) of calling fn()."""
    try:
        return fn(), None
    except (IndexError, ValueError, TypeError) as e:
        return None, type(e)


def as_numpy(r):
    import pooltensor as pt
    return r.to_numpy() if isinstance(r, pt.ndarray) else r


def assert_same(got, want, what=""):
    """shape, dtype and values agree (NaN equal to NaN); scalars stay scalars."""
    got = as_numpy(got)
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), (what, type(got), want)
        assert got.shape == want.shape, (what, got.shape, want.shape)
        assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
        assert np.array_equal(got, want, equal_nan=want.dtype.kind in "fc"), (what, got, want)
    else:
        assert isinstance(got, np.generic) and not isinstance(got, np.ndarray), \
            (what, type(got), type(want))
        assert got.dtype == want.dtype, (what, got.dtype, want.dtype)
        assert got == want or (got != got and want != want), (what, got, want)


@st.composite
def value_for(draw, target_shape, dtype):
    """A value numpy can assign to a selection of `target_shape` (broadcasting)."""
    if draw(st.integers(0, 4)) == 0:
        return reference((), dtype, draw(st.integers(0, 50))).item()
    nd = draw(st.integers(0, len(target_shape)))
    tail = target_shape[len(target_shape) - nd:]
    vshape = tuple(draw(st.sampled_from([1, n])) for n in tail)
    return reference(vshape, dtype, draw(st.integers(0, 1000)))
