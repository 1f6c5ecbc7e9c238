"""Hypothesis strategies and checks for the shape functions of pool arrays (reshape, ravel,
flatten, transpose, swapaxes, moveaxis, squeeze, expand_dims, concatenate, stack), shared by
tests/test_ops_shape.py and the SPMD script tests/scripts/ops_shape_spmd.py.

Each case builds a numpy reference view and a pool view with the same elements and layout
(contiguous, starting mid-array, strided, reversed, transposed: ops_reduce_cases.layout), calls
the function on both, and requires the same exception type or the same shape, dtype and
values; and a view exactly when numpy gives a view (our result shares the base's
allocation when numpy's shares the base's memory), a new array otherwise.
"""
import math
import warnings

import numpy as np
from hypothesis import strategies as st

import ops_reduce_cases as rc

DTYPES = [np.bool_, np.int8, np.int32, np.uint16, np.float32, np.float64, np.complex64]


def _values(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return np.asarray(rng.random(shape) < 0.5)
    return np.asarray(rng.integers(0, 100, shape) * (1 if dtype.kind in "iu" else 1.5),
                      dtype=dtype)


@st.composite
def array_spec(draw, shape=None, dtypes=DTYPES):
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=4)))
    return dict(shape=shape, dtype=np.dtype(draw(st.sampled_from(dtypes))),
                layout=draw(rc.layout(shape)), seed=draw(st.integers(0, 2**32 - 1)),
                placement=draw(st.sampled_from(rc.PLACEMENTS)))


def build(spec, pt):
    """(numpy base, numpy view, pool base, pool view)."""
    base_shape, index, perm = spec["layout"]
    ref_base = _values(base_shape, spec["dtype"], spec["seed"])
    x_base = pt.from_numpy(ref_base, placement=spec["placement"])
    ref, x = (ref_base, x_base) if index == () else (ref_base[index], x_base[index])
    if perm is not None:
        ref, x = ref.transpose(perm), np.transpose(x, perm)
    return ref_base, ref, x_base, x


@st.composite
def new_shape(draw, size, nd_max=4):
    """A shape of `size` elements, maybe with one -1; sometimes a wrong one."""
    dims, left = [], size
    for _ in range(draw(st.integers(0, nd_max - 1))):
        d = draw(st.sampled_from([d for d in range(1, 7) if left % d == 0] if left
                                 else [0, 1, 2, 3]))
        dims.append(d)
        left = left // d if left else 0
    dims.append(left)
    assert math.prod(dims) == size
    kind = draw(st.sampled_from(["exact", "exact", "minus", "bad", "twominus"]))
    if kind == "minus":
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    elif kind == "bad":
        dims = dims + [2] if size else [1, 3]
    elif kind == "twominus" and len(dims) >= 2:
        dims[0] = dims[1] = -1
    return tuple(dims)


@st.composite
def view_case(draw):
    spec = draw(array_spec())
    shape = spec["shape"]
    nd = len(shape)
    size = math.prod(shape)
    fn = draw(st.sampled_from(["reshape", "reshape", "ravel", "flatten", "transpose", "swapaxes",
                               "moveaxis", "squeeze", "expand_dims"]))
    kw = {}
    if fn == "reshape":
        kw = dict(shape=draw(new_shape(size)), order=draw(st.sampled_from(["C", "F"])),
                  copy=draw(st.sampled_from([None, None, True, False])))
    elif fn in ("ravel", "flatten"):
        kw = dict(order=draw(st.sampled_from(["C", "F", "A", "K"])))
    elif fn == "transpose":
        if draw(st.booleans()) and nd:
            axes = list(draw(st.permutations(range(nd))))
            if draw(st.integers(0, 4)) == 0:
                axes[0] = nd                           # out of bounds
            kw = dict(axes=tuple(a - nd if draw(st.booleans()) else a for a in axes))
        elif draw(st.integers(0, 5)) == 0:
            kw = dict(axes=(0,) * (nd + 1))            # wrong length
    elif fn == "swapaxes":
        kw = dict(axis1=draw(st.integers(-nd - 1, nd)),
                  axis2=draw(st.integers(-nd, max(nd - 1, 0))))
    elif fn == "moveaxis":
        kw = dict(source=draw(st.integers(-nd, nd)), destination=draw(st.integers(-nd, nd)))
    elif fn == "squeeze":
        ones = [i for i, n in enumerate(shape) if n == 1]
        choice = draw(st.sampled_from(["none", "one", "bad"]))
        if choice == "one" and ones:
            kw = dict(axis=draw(st.sampled_from(ones)))
        elif choice == "bad" and nd:
            kw = dict(axis=draw(st.integers(-nd, nd)))
    elif fn == "expand_dims":
        kw = dict(axis=draw(st.integers(-nd - 2, nd + 1)))
    how = draw(st.sampled_from(["numpy", "method"] if fn not in ("moveaxis", "expand_dims")
                               else ["numpy"]))
    return dict(fn=fn, spec=spec, kw=kw, how=how)


def outcome(fn):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn(), None
    except (IndexError, ValueError, TypeError) as e:
        return None, type(e)


def _apply(case, arr, numpy_side):
    fn, kw = case["fn"], dict(case["kw"])
    if fn == "flatten":
        return arr.flatten(**kw)
    if case["how"] == "method" and not numpy_side:
        if fn == "transpose":
            return arr.transpose(*([kw["axes"]] if "axes" in kw else []))
        if fn == "reshape":
            shape = kw.pop("shape")
            return arr.reshape(shape, **kw)
        return getattr(arr, fn)(**kw)
    if fn == "reshape":
        shape = kw.pop("shape")
        return np.reshape(arr, shape, **kw)
    return getattr(np, fn)(arr, **kw)


def check_view(case, pt):
    ref_base, ref, x_base, x = build(case["spec"], pt)
    want, werr = outcome(lambda: _apply(case, ref, True))
    got, gerr = outcome(lambda: _apply(case, x, False))
    assert gerr == werr, (case, gerr, werr)
    if werr is not None:
        return None
    assert isinstance(got, pt.ndarray), (case, type(got))
    assert got.shape == want.shape and got.dtype == want.dtype, (case, got.shape, want.shape)
    g = got.to_numpy()
    assert np.array_equal(g, want), (case, g, want)
    numpy_view = want.size > 0 and np.shares_memory(want, ref_base)
    if want.size > 0:
        assert (got._a is x_base._a) == numpy_view, (case, numpy_view)
    return g


# -- concatenate and stack -------------------------------------------------------------------

@st.composite
def join_case(draw):
    fn = draw(st.sampled_from(["concatenate", "concatenate", "stack"]))
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1 if fn == "concatenate" else 0,
                                max_size=3)))
    nd = len(shape)
    k = draw(st.integers(1, 4))
    if fn == "concatenate":
        axis = draw(st.sampled_from([None, draw(st.integers(-nd, nd - 1)), nd]))
    else:
        axis = draw(st.integers(-nd - 2, nd + 1))
    shapes = []
    for i in range(k):
        s = list(shape)
        if fn == "concatenate" and isinstance(axis, int) and -nd <= axis < nd:
            s[axis] = draw(st.integers(0, 4))
        if draw(st.integers(0, 9)) == 0 and s:
            s[draw(st.integers(0, len(s) - 1))] += 1          # a mismatch
        shapes.append(tuple(s))
    specs = [draw(array_spec(s)) for s in shapes]
    kinds = [draw(st.sampled_from(["pool", "pool", "numpy"])) for _ in shapes]
    if "pool" not in kinds:
        kinds[0] = "pool"
    kw = {}
    if draw(st.integers(0, 4)) == 0:
        kw["dtype"] = np.dtype(draw(st.sampled_from([np.float64, np.int32, np.complex128])))
        if draw(st.booleans()):
            kw["casting"] = "unsafe"
    out = draw(st.sampled_from([None, None, None, "pool", "numpy"]))
    return dict(fn=fn, axis=axis, specs=specs, kinds=kinds, kw=kw, out=out)


def check_join(case, pt):
    refs, xs = [], []
    for spec, kind in zip(case["specs"], case["kinds"]):
        _, ref, _, x = build(spec, pt)
        refs.append(ref)
        xs.append(x if kind == "pool" else ref.copy())
    npfn = getattr(np, case["fn"])
    want, werr = outcome(lambda: npfn(refs, axis=case["axis"], **case["kw"]))
    out = None
    if werr is None and case["out"] is not None:
        out = (pt.zeros(want.shape, want.dtype) if case["out"] == "pool"
               else np.zeros(want.shape, want.dtype))
    kw = dict(case["kw"])
    if out is not None:
        kw.pop("dtype", None)
        kw["out"] = out
    got, gerr = outcome(lambda: npfn(xs, axis=case["axis"], **kw))
    assert gerr == werr, (case, gerr, werr)
    if werr is not None:
        return None
    if out is not None:
        assert got is out
    assert isinstance(got, pt.ndarray) or case["out"] == "numpy", (case, type(got))
    g = got.to_numpy() if isinstance(got, pt.ndarray) else got
    assert g.shape == want.shape and g.dtype == want.dtype, (case, g.shape, want.shape,
                                                             g.dtype, want.dtype)
    assert np.array_equal(g, want), (case, g, want)
    return g
