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


def _give(res, kw):
    """A namespace result: a pool array, except what numpy's out= asked for."""
    return res if kw.get("out") is not None else coerce.own(res)


# Each takes the standard's arguments and, beyond them, numpy's (out=, where=, initial=,
# dtype= of mean, ddof=): pooltensor's namespace is also the numpy-like one of pool arrays.

def sum(x, /, *, axis=None, dtype=None, keepdims=False, **kw):    # noqa: A001
    """Sum over `axis` (all when None); integers accumulate in the default integer."""
    return _give(reductions.sum(coerce.array(x), _axis(axis), dtype, keepdims=keepdims, **kw),
                 kw)


def prod(x, /, *, axis=None, dtype=None, keepdims=False, **kw):
    """Product over `axis` (all when None)."""
    return _give(reductions.prod(coerce.array(x), _axis(axis), dtype, keepdims=keepdims, **kw),
                 kw)


def mean(x, /, *, axis=None, keepdims=False, **kw):
    """Arithmetic mean over `axis` (all when None)."""
    return _give(reductions.mean(coerce.array(x), _axis(axis), keepdims=keepdims, **kw), kw)


def var(x, /, *, axis=None, correction=None, keepdims=False, **kw):
    """Variance over `axis` with `correction` (numpy's ddof; default 0)."""
    if correction is not None:
        kw["correction"] = correction
    return _give(reductions.var(coerce.array(x), _axis(axis), keepdims=keepdims, **kw), kw)


def std(x, /, *, axis=None, correction=None, keepdims=False, **kw):
    """Standard deviation over `axis` with `correction` (numpy's ddof; default 0)."""
    if correction is not None:
        kw["correction"] = correction
    return _give(reductions.std(coerce.array(x), _axis(axis), keepdims=keepdims, **kw), kw)


def min(x, /, *, axis=None, keepdims=False, **kw):     # noqa: A001
    """Minimum over `axis` (ValueError for an empty reduction)."""
    return _give(reductions.min(coerce.array(x), _axis(axis), keepdims=keepdims, **kw), kw)


def max(x, /, *, axis=None, keepdims=False, **kw):     # noqa: A001
    """Maximum over `axis` (ValueError for an empty reduction)."""
    return _give(reductions.max(coerce.array(x), _axis(axis), keepdims=keepdims, **kw), kw)


def all(x, /, *, axis=None, keepdims=False, **kw):     # noqa: A001
    """Whether every element along `axis` is true."""
    return _give(reductions.all(coerce.array(x), _axis(axis), keepdims=keepdims, **kw), kw)


def any(x, /, *, axis=None, keepdims=False, **kw):     # noqa: A001
    """Whether any element along `axis` is true."""
    return _give(reductions.any(coerce.array(x), _axis(axis), keepdims=keepdims, **kw), kw)


def argmax(x, /, *, axis=None, keepdims=False, **kw):
    """Index of the first maximum (flattened when axis is None)."""
    return _give(reductions.argmax(coerce.array(x), axis, keepdims=keepdims, **kw), kw)


def argmin(x, /, *, axis=None, keepdims=False, **kw):
    """Index of the first minimum (flattened when axis is None)."""
    return _give(reductions.argmin(coerce.array(x), axis, keepdims=keepdims, **kw), kw)


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
