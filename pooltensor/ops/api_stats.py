"""The Array API's statistical, utility and searching functions with the standard's
signatures: sum prod mean std var min max all any (reductions.py), cumulative_sum and
cumulative_prod (scans.py), diff, argmax argmin count_nonzero, and the sorting, set and
searching names (sorting.py: sort argsort unique_* searchsorted nonzero).

Results are pool arrays (coerce.own: a small result is held by this process).
"""
import operator

import numpy as np

from ..array.array import ndarray
from . import coerce, reductions, scans, sorting

_norm = np.lib.array_utils.normalize_axis_index


def _axis(axis):
    return tuple(axis) if isinstance(axis, list) else axis


def _sum_dtype(x, dtype):
    """The standard's accumulation dtype: int64/uint64 for smaller integers (numpy agrees),
    the input's for floats."""
    if dtype is not None:
        return dtype
    return None


def sum(x, /, *, axis=None, dtype=None, keepdims=False):    # noqa: A001
    """Sum over `axis` (all when None); integers accumulate in the default integer."""
    x = coerce.array(x)
    return coerce.own(reductions.sum(x, _axis(axis), _sum_dtype(x, dtype), None, keepdims))


def prod(x, /, *, axis=None, dtype=None, keepdims=False):
    """Product over `axis` (all when None)."""
    x = coerce.array(x)
    return coerce.own(reductions.prod(x, _axis(axis), _sum_dtype(x, dtype), None, keepdims))


def mean(x, /, *, axis=None, keepdims=False):
    """Arithmetic mean over `axis` (all when None)."""
    return coerce.own(reductions.mean(coerce.array(x), _axis(axis), None, None, keepdims))


def var(x, /, *, axis=None, correction=0.0, keepdims=False):
    """Variance over `axis` with `correction` (numpy's ddof)."""
    return coerce.own(reductions.var(coerce.array(x), _axis(axis), None, None,
                                     keepdims=keepdims, correction=correction))


def std(x, /, *, axis=None, correction=0.0, keepdims=False):
    """Standard deviation over `axis` with `correction` (numpy's ddof)."""
    return coerce.own(reductions.std(coerce.array(x), _axis(axis), None, None,
                                     keepdims=keepdims, correction=correction))


def min(x, /, *, axis=None, keepdims=False):     # noqa: A001
    """Minimum over `axis` (ValueError for an empty reduction)."""
    return coerce.own(reductions.min(coerce.array(x), _axis(axis), None, keepdims))


def max(x, /, *, axis=None, keepdims=False):     # noqa: A001
    """Maximum over `axis` (ValueError for an empty reduction)."""
    return coerce.own(reductions.max(coerce.array(x), _axis(axis), None, keepdims))


def all(x, /, *, axis=None, keepdims=False):     # noqa: A001
    """Whether every element along `axis` is true."""
    return coerce.own(reductions.all(coerce.array(x), _axis(axis), None, keepdims))


def any(x, /, *, axis=None, keepdims=False):     # noqa: A001
    """Whether any element along `axis` is true."""
    return coerce.own(reductions.any(coerce.array(x), _axis(axis), None, keepdims))


def argmax(x, /, *, axis=None, keepdims=False):
    """Index of the first maximum (flattened when axis is None), int64."""
    return coerce.own(np.asarray(reductions.argmax(coerce.array(x), axis, None,
                                                   keepdims=keepdims)).astype(np.int64))


def argmin(x, /, *, axis=None, keepdims=False):
    """Index of the first minimum (flattened when axis is None), int64."""
    return coerce.own(np.asarray(reductions.argmin(coerce.array(x), axis, None,
                                                   keepdims=keepdims)).astype(np.int64))


def count_nonzero(x, /, *, axis=None, keepdims=False):
    """How many elements along `axis` are not zero (int64)."""
    x = coerce.array(x)
    nz = x != 0
    return coerce.own(reductions.sum(nz if isinstance(nz, ndarray) else coerce.array(nz),
                                     _axis(axis), np.int64, None, keepdims))


def cumulative_sum(x, /, *, axis=None, dtype=None, include_initial=False):
    """Running sums along `axis` (required above one dimension); include_initial puts a zero
    first. Distributed above the materialize limit (scans.py)."""
    return scans.cumulative(coerce.array(x), "sum", axis, dtype, include_initial)


def cumulative_prod(x, /, *, axis=None, dtype=None, include_initial=False):
    """Running products along `axis` (required above one dimension); include_initial puts a
    one first."""
    return scans.cumulative(coerce.array(x), "prod", axis, dtype, include_initial)


def diff(x, /, *, axis=-1, n=1, prepend=None, append=None):
    """n-th differences along `axis` (numpy.diff), elementwise on shifted views."""
    x = coerce.array(x)
    if x.ndim == 0:
        raise ValueError("diff needs an array of at least one dimension")
    axis = _norm(operator.index(axis), x.ndim)
    n = operator.index(n)
    if n < 0:
        raise ValueError(f"order must be non-negative but got {n}")
    from .api_manip import concat
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = concat([coerce.array(p) for p in parts], axis=axis)
    pre = (slice(None),) * axis
    for _ in range(n):
        if x.dtype == np.bool_:
            x = x[pre + (slice(1, None),)] != x[pre + (slice(None, -1),)]
        else:
            x = x[pre + (slice(1, None),)] - x[pre + (slice(None, -1),)]
    return coerce.own(x if isinstance(x, ndarray) else np.asarray(x))


sort = sorting.sort
argsort = sorting.argsort
unique_all = sorting.unique_all
unique_counts = sorting.unique_counts
unique_inverse = sorting.unique_inverse
unique_values = sorting.unique_values
searchsorted = sorting.searchsorted
nonzero = sorting.nonzero
