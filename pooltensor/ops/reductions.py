"""Reductions of pool arrays: sum, prod, mean, std, var, min, max, argmin, argmax, any, all.

Results are numpy's: the same shape, dtype and errors, found by running the numpy function on
a sample of the array's dtype whose every axis has length min(n, 1) (so a bad axis, a bad
dtype or a reduction of nothing raises exactly what numpy raises). A 0-d result is a numpy
scalar.

Small or large results. A result of at most ``pool.advanced_limit`` bytes (64 MiB unless
``pooltensor.init(advanced_limit=...)``; the same rule as advanced indexing) is a numpy array
(or scalar), the same bytes on every rank. A larger one is a new pool array.

How (a local kernel plus a combine):

- small result, input-driven (pooltensor.reducer): the array is cut into tiles
  (pooltensor.tiles); each process reduces the tiles it works on (SPMD: the tiles whose
  lowest byte it homes, so it reads its own slabs; otherwise every tile, remote slabs
  streamed through the cache) with one numpy call per tile into a partial over that tile's
  part of the result, and combines its partials in tile order. In SPMD every rank's combined partials are then allgathered and combined in
  rank order: every rank does the same float operations in the same order, so every rank has
  the same bytes. A reduction over every axis of a contiguous array (any layout when the order
  of the elements does not matter) reduces whole runs of local slabs in one call each.
- large result, output-driven: each process computes the tiles of the result it homes (SPMD)
  or all of them, each from the part of the input it needs (read through the cache), writes
  them where they live, then (SPMD) the pool syncs.

Precision: partial sums of float16/float32 (complex64) are combined in float64 (complex128)
and float16 tiles are summed in float32, so a sum is at least as close as numpy's pairwise
sum; the order of the combine differs from numpy's, so floats agree to rounding, not bitwise.
argmin/argmax give the first occurrence of the extreme (a NaN first, as numpy), whatever
rank found it: partials carry (value, global index) and ties go to the smaller index.

Collective: under SPMD, call a reduction of a shared array on every rank (it reads what was
visible at the last pt.sync()); a private array's reduction is its rank's alone.
"""
import builtins
import operator
import warnings

import numpy as np

from ..array.array import ndarray
from ..array.creation import full
from .dispatch import implements
from .reducer import (AnyAllJob, ArgJob, MeanJob, UfuncJob, _run, _size,
                      _wide)
from .shape import assign
from .tiles import shape_of as _shape_of


_NoValue = np._NoValue
# sum, min, max, any and all below are this module's (numpy's names): builtins.* for Python's


# -- small helpers ---------------------------------------------------------------------------

def _axes(axis, ndim):
    """Normalized sorted tuple of axes (numpy's AxisError / TypeError for bad ones)."""
    if axis is None:
        return tuple(range(ndim))
    if ndim == 0 and not isinstance(axis, tuple) and operator.index(axis) in (0, -1):
        return ()                   # numpy accepts axis 0 / -1 on a 0-d array
    if isinstance(axis, tuple):
        out = [np.lib.array_utils.normalize_axis_index(operator.index(a), ndim) for a in axis]
        if len(set(out)) != len(out):
            raise ValueError("duplicate value in 'axis'")
        return tuple(sorted(out))
    return (np.lib.array_utils.normalize_axis_index(operator.index(axis), ndim),)


def _sample(x):
    """A numpy stand-in for x: axes of length min(n, 1), values 0 (no data is read)."""
    return np.zeros(tuple(builtins.min(n, 1) for n in x.shape), x.dtype)


# -- numpy-facing entry points -------------------------------------------------------------------

def _final_shape(x, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else n for i, n in enumerate(x.shape))
    return tuple(n for i, n in enumerate(x.shape) if i not in axes)


def _finish_result(res, out, probe):
    """Scalars for 0-d numpy results; write into out= when given."""
    if out is not None:
        if tuple(_shape_of(out)) != tuple(_shape_of(res)):
            raise ValueError(f"output parameter has shape {_shape_of(out)}, expected "
                             f"{_shape_of(res)}")
        if isinstance(out, ndarray):
            assign(out, res)
        else:
            np.copyto(out, res, casting="unsafe")
        return out
    if isinstance(res, np.ndarray) and res.ndim == 0:
        return res[()]
    return res


def _check_where(where, name):
    if where is not True:
        raise TypeError(f"{name}: where= is not supported for pooltensor arrays")


def _probe_out(out, probe_fn, res_probe):
    """Let numpy check out='s dtype against the result (casting errors as numpy's)."""
    if out is not None:
        fake = np.empty(_shape_of(res_probe), np.asarray(out).dtype if not isinstance(out, ndarray)
                        else out.dtype)
        probe_fn(fake)


def _empty_case(x, fn, axes, final_shape, dtype, out):
    """A reduction of an empty array: numpy's value (or error, or warning) on an empty
    stand-in whose reduced axes are x's and other axes min(n, 1), spread over the result."""
    stand = np.zeros(tuple(n if i in axes else builtins.min(n, 1) for i, n in enumerate(x.shape)),
                     x.dtype)
    val = np.asarray(fn(stand))
    if val.size == 0 or _size(final_shape) == 0:
        return _finish_result(np.empty(final_shape, dtype), out, None)
    v = val.reshape(-1)[0]
    if _size(final_shape) * np.dtype(dtype).itemsize <= x._a.pool.advanced_limit:
        return _finish_result(np.full(final_shape, v, dtype), out, None)
    return _finish_result(full(final_shape, v, dtype), out, None)


def _ufunc_reduction(name, ufunc, npfn, x, axis, dtype, out, keepdims, initial, where,
                     widen=True):
    """sum / prod / min / max: numpy's checks on a sample, then the distributed job."""
    _check_where(where, name)
    if not isinstance(x, ndarray):
        res = npfn(np.asarray(x), axis=axis, **({} if dtype is None else {"dtype": dtype}),
                   keepdims=keepdims, **({} if initial is _NoValue else {"initial": initial}))
        return _finish_result(np.asarray(res), out, None)
    kw = {} if dtype is None else {"dtype": dtype}
    if initial is not _NoValue:
        kw["initial"] = initial
    probe = npfn(_sample(x), axis=axis, keepdims=keepdims, **kw)
    _probe_out(out, lambda o: npfn(_sample(x), axis=axis, keepdims=keepdims, out=o, **kw), probe)
    axes = _axes(axis, x.ndim)
    final = _final_shape(x, axes, keepdims)
    r = np.asarray(probe).dtype
    if x.size == 0:
        return _empty_case(x, lambda s: npfn(s, axis=axes, keepdims=keepdims, **kw), axes,
                           final, r, out)
    if widen:                       # sum: float16 tiles in float32, combined wide
        part, comb = (np.float32 if r == np.float16 else r), _wide(r)
    else:                           # prod, min, max: numpy's own dtype throughout
        part, comb = (r if ufunc is np.multiply else None), r

    def make(v, ax, flat):
        return UfuncJob(v, ax, ufunc, r, part_dtype=part, comb_dtype=comb, initial=initial)
    what = name if initial is _NoValue else f"{name} initial {initial!r}"
    return _finish_result(_run(x, make, axes, final, r, what=what), out, probe)


def sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=_NoValue, where=True):
    """Sum of the elements over the given axes (numpy.sum)."""
    return _ufunc_reduction("sum", np.add, np.sum, a, axis, dtype, out, keepdims, initial, where)


def prod(a, axis=None, dtype=None, out=None, keepdims=False, initial=_NoValue, where=True):
    """Product of the elements over the given axes (numpy.prod)."""
    return _ufunc_reduction("prod", np.multiply, np.prod, a, axis, dtype, out, keepdims,
                            initial, where, widen=False)


def _minmax(name, ufunc, npfn, a, axis, out, keepdims, initial, where):
    return _ufunc_reduction(name, ufunc, npfn, a, axis, None, out, keepdims, initial, where,
                            widen=False)


def min(a, axis=None, out=None, keepdims=False, initial=_NoValue, where=True):
    """Minimum over the given axes (numpy.min; NaN propagates)."""
    return _minmax("min", np.minimum, np.min, a, axis, out, keepdims, initial, where)


def max(a, axis=None, out=None, keepdims=False, initial=_NoValue, where=True):
    """Maximum over the given axes (numpy.max; NaN propagates)."""
    return _minmax("max", np.maximum, np.max, a, axis, out, keepdims, initial, where)


def _anyall(name, ufunc, npfn, a, axis, out, keepdims, where):
    _check_where(where, name)
    if not isinstance(a, ndarray):
        return _finish_result(np.asarray(npfn(np.asarray(a), axis=axis, keepdims=keepdims)),
                              out, None)
    probe = npfn(_sample(a), axis=axis, keepdims=keepdims)
    axes = _axes(axis, a.ndim)
    final = _final_shape(a, axes, keepdims)
    if a.size == 0:
        return _empty_case(a, lambda s: npfn(s, axis=axes, keepdims=keepdims), axes, final,
                           np.bool_, out)
    res = _run(a, lambda v, ax, flat: AnyAllJob(v, ax, ufunc), axes, final, np.bool_,
               what=name)
    return _finish_result(res, out, probe)


def any(a, axis=None, out=None, keepdims=False, *, where=True):
    """Whether any element over the given axes is true (numpy.any)."""
    return _anyall("any", np.logical_or, np.any, a, axis, out, keepdims, where)


def all(a, axis=None, out=None, keepdims=False, *, where=True):
    """Whether every element over the given axes is true (numpy.all)."""
    return _anyall("all", np.logical_and, np.all, a, axis, out, keepdims, where)


def _arg(name, op, npfn, a, axis, out, keepdims):
    if not isinstance(a, ndarray):
        return _finish_result(np.asarray(npfn(np.asarray(a), axis=axis, keepdims=keepdims)),
                              out, None)
    if a.size == 0:
        npfn(np.zeros(a.shape, a.dtype), axis=axis, keepdims=keepdims)   # numpy's error
    probe = npfn(_sample(a), axis=axis, keepdims=keepdims)
    _probe_out(out, lambda o: npfn(_sample(a), axis=axis, keepdims=keepdims, out=o), probe)
    if axis is None:
        axes = tuple(range(a.ndim))
        final = (1,) * a.ndim if keepdims else ()
    else:
        axes = _axes(axis, a.ndim)
        final = _final_shape(a, axes, keepdims)
    if a.size == 0:
        return _finish_result(np.zeros(final, np.intp), out, probe)
    flat_all = axis is None or a.ndim == 0

    def make(v, ax, flat):
        return ArgJob(v, ax, flat_all or flat, op)
    res = _run(a, make, axes, final, np.intp, order_free=False, what=name)
    return _finish_result(res, out, probe)


def argmin(a, axis=None, out=None, *, keepdims=False):
    """Index of the first minimum (flat C-order index when axis is None; numpy.argmin)."""
    return _arg("argmin", "min", np.argmin, a, axis, out, keepdims)


def argmax(a, axis=None, out=None, *, keepdims=False):
    """Index of the first maximum (flat C-order index when axis is None; numpy.argmax)."""
    return _arg("argmax", "max", np.argmax, a, axis, out, keepdims)


def mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=True):
    """Arithmetic mean over the given axes (numpy.mean: float64 for integers)."""
    _check_where(where, "mean")
    if not isinstance(a, ndarray):
        return _finish_result(np.asarray(np.mean(np.asarray(a), axis=axis, dtype=dtype,
                                                 keepdims=keepdims)), out, None)
    probe = np.mean(_sample(a), axis=axis, dtype=dtype, keepdims=keepdims)
    _probe_out(out, lambda o: np.mean(_sample(a), axis=axis, dtype=dtype, keepdims=keepdims,
                                      out=o), probe)
    axes = _axes(axis, a.ndim)
    final = _final_shape(a, axes, keepdims)
    r = np.asarray(probe).dtype
    if a.size == 0:
        return _empty_case(a, lambda s: np.mean(s, axis=axes, dtype=dtype, keepdims=keepdims),
                           axes, final, r, out)
    sdt = dtype
    if sdt is None:
        if a.dtype.kind in "biu":
            sdt = np.dtype(np.float64)
        elif a.dtype == np.float16:
            sdt = np.dtype(np.float32)
    s = np.add.reduce(np.zeros(1, a.dtype), dtype=sdt).dtype
    part = np.float32 if s == np.float16 else s
    count = _size([a.shape[i] for i in axes])

    def make(v, ax, flat):
        return UfuncJob(v, ax, np.add, s, part_dtype=part, comb_dtype=_wide(s), scale=count,
                        final=r)
    return _finish_result(_run(a, make, axes, final, r, what="mean"), out, probe)


def _varstd(name, a, axis, dtype, out, ddof, keepdims, where, sqrt):
    _check_where(where, name)
    npfn = np.std if sqrt else np.var
    if not isinstance(a, ndarray):
        return _finish_result(np.asarray(npfn(np.asarray(a), axis=axis, dtype=dtype, ddof=ddof,
                                              keepdims=keepdims)), out, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        probe = npfn(_sample(a), axis=axis, dtype=dtype, ddof=ddof, keepdims=keepdims)
        _probe_out(out, lambda o: npfn(_sample(a), axis=axis, dtype=dtype, ddof=ddof,
                                       keepdims=keepdims, out=o), probe)
    axes = _axes(axis, a.ndim)
    final = _final_shape(a, axes, keepdims)
    r = np.asarray(probe).dtype
    if a.size == 0:
        return _empty_case(a, lambda s: npfn(s, axis=axes, dtype=dtype, ddof=ddof,
                                             keepdims=keepdims), axes, final, r, out)
    count = _size([a.shape[i] for i in axes])
    if ddof >= count:
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=3)
    sdt = dtype
    if sdt is None and a.dtype.kind in "biu":
        sdt = np.dtype(np.float64)

    def make(v, ax, flat):
        return MeanJob(v, ax, sdt, r, ddof, sqrt)
    with np.errstate(divide="ignore" if ddof >= count else "warn",
                     invalid="ignore" if ddof >= count else "warn"):
        res = _run(a, make, axes, final, r, what=f"{name} ddof {ddof}")
    return _finish_result(res, out, probe)


def _ddof(name, ddof, mean, correction):
    if mean is not None:
        raise TypeError(f"{name}: mean= is not supported for pooltensor arrays")
    if correction is not None:
        if ddof != 0:
            raise ValueError("ddof and correction can't be provided simultaneously.")
        return correction
    return ddof


def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True, mean=None,
        correction=None):
    """Variance over the given axes (numpy.var, two passes: the mean, then the deviations;
    correction= is the Array API's name for ddof)."""
    return _varstd("var", a, axis, dtype, out, _ddof("var", ddof, mean, correction), keepdims,
                   where, False)


def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False, *, where=True, mean=None,
        correction=None):
    """Standard deviation over the given axes (numpy.std; correction= as ddof)."""
    return _varstd("std", a, axis, dtype, out, _ddof("std", ddof, mean, correction), keepdims,
                   where, True)


# -- ufunc.reduce --------------------------------------------------------------------------------

_UFUNCS = {np.add: True, np.multiply: False, np.minimum: False, np.maximum: False,
           np.fmin: False, np.fmax: False, np.logical_and: False, np.logical_or: False,
           np.logical_xor: False, np.bitwise_and: False, np.bitwise_or: False,
           np.bitwise_xor: False}


def ufunc_reduce(ufunc, x, axis=0, dtype=None, keepdims=False, out=None, initial=_NoValue):
    """ufunc.reduce(x, ...) for the associative ufuncs (add, multiply, minimum, maximum, fmin,
    fmax, logical and bitwise and/or/xor); NotImplemented for any other ufunc."""
    if ufunc not in _UFUNCS or not isinstance(x, ndarray):
        return NotImplemented
    kw = {} if dtype is None else {"dtype": dtype}
    if initial is not _NoValue:
        kw["initial"] = initial
    probe = ufunc.reduce(_sample(x), axis=axis, keepdims=keepdims, **kw)
    _probe_out(out, lambda o: ufunc.reduce(_sample(x), axis=axis, keepdims=keepdims, out=o,
                                           **kw), probe)
    axes = _axes(axis, x.ndim)
    final = _final_shape(x, axes, keepdims)
    r = np.asarray(probe).dtype
    if x.size == 0:
        return _empty_case(x, lambda s: ufunc.reduce(s, axis=axes, keepdims=keepdims, **kw),
                           axes, final, r, out)
    widen = _UFUNCS[ufunc]
    part = (np.float32 if r == np.float16 else r) if widen else dtype

    def make(v, ax, flat):
        return UfuncJob(v, ax, ufunc, r, part_dtype=part,
                        comb_dtype=_wide(r) if widen else r, initial=initial)
    return _finish_result(_run(x, make, axes, final, r, what=f"{ufunc.__name__}.reduce"),
                          out, probe)


# -- NEP-18: numpy's functions on pool arrays come here ------------------------------------------

def _register():
    implements(np.sum)(sum)
    implements(np.prod)(prod)
    implements(np.mean)(mean)
    implements(np.min, np.amin)(min)
    implements(np.max, np.amax)(max)
    implements(np.argmin)(argmin)
    implements(np.argmax)(argmax)
    implements(np.any)(any)
    implements(np.all)(all)
    implements(np.var)(var)
    implements(np.std)(std)


_register()
