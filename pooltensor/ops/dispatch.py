"""NEP-18 dispatch: numpy functions called on pool arrays (np.where(c, x, y), np.sum(x), ...).

One registry, filled with ``@implements(np.func, ...)`` by the modules that implement numpy
functions for pool arrays (ufuncs.py for the elementwise ones; reductions, linear algebra and
shape functions in their own modules). ``ndarray.__array_function__`` calls array_function():
a registered function runs its implementation; any other numpy function falls back to numpy on
materialized copies of the pool arrays, with a FallbackWarning, and is refused with
MaterializeTooLarge when those copies would exceed the pool's materialize_limit (the same limit
as to_numpy()). A fallback result is what numpy returns (numpy arrays, not pool arrays), except
that an ``out=`` pool array is written and returned.

Ufuncs (np.add, np.sin, ...) do not come here: numpy sends them to ``__array_ufunc__``
(NEP-13, ufuncs.py), which uses this registry for generalized ufuncs such as np.matmul.
"""
import warnings

import numpy as np

from ..array.array import ndarray
from ..errors import FallbackWarning, MaterializeTooLarge
from . import executor, kernels

HANDLED = {}     # numpy function (or ufunc) -> implementation for pool arrays


def implements(*np_funcs):
    """Decorator: register the decorated function as the implementation of `np_funcs` for
    pool arrays (it receives the arguments numpy's function was called with)."""
    def deco(impl):
        for f in np_funcs:
            HANDLED[f] = impl
        return impl
    return deco


def _pool_arrays(obj, found):
    """Collect the pool arrays in obj (nested lists, tuples and dicts)."""
    if isinstance(obj, ndarray):
        found.append(obj)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _pool_arrays(v, found)
    elif isinstance(obj, dict):
        for v in obj.values():
            _pool_arrays(v, found)
    return found


def _materialize(obj):
    if isinstance(obj, ndarray):
        return obj.to_numpy(copy=True)
    if isinstance(obj, list):
        return [_materialize(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_materialize(v) for v in obj)
    if isinstance(obj, dict):
        return {k: _materialize(v) for k, v in obj.items()}
    return obj


def _name(func):
    mod = getattr(func, "__module__", None) or "numpy"
    mod = "numpy" if mod.startswith("numpy") else mod
    return f"{mod}.{getattr(func, '__name__', repr(func))}"


def fallback(func, args, kwargs, what=None):
    """Run numpy's `func` on numpy copies of the pool arrays in args/kwargs, with a
    FallbackWarning; MaterializeTooLarge above the pool's materialize_limit. A pool array
    passed as out= receives the result (and is returned)."""
    arrays = _pool_arrays((args, kwargs), [])
    what = what or _name(func)
    if arrays:
        pool = arrays[0]._a.pool
        pool.check_open()
        total = sum(a.nbytes for a in {id(a): a for a in arrays}.values())
        if total > pool.materialize_limit:
            raise MaterializeTooLarge(
                f"{what} has no pooltensor implementation, and running numpy's on copies of "
                f"the pool arrays would materialize {total} bytes, over the limit of "
                f"{pool.materialize_limit} bytes (pooltensor.init(materialize_limit=...))")
    warnings.warn(f"{what} has no pooltensor implementation: it runs numpy's on copies of "
                  f"the pool arrays in this process", FallbackWarning, stacklevel=4)
    out = kwargs.get("out")
    pool_out = _pool_arrays(out, []) if out is not None else []
    if pool_out:
        kwargs = {k: v for k, v in kwargs.items() if k != "out"}
    res = func(*_materialize(args), **_materialize(kwargs))
    if not pool_out:
        return res
    single = not isinstance(out, tuple)
    outs = (out,) if single else out
    vals = (res,) if single or not isinstance(res, tuple) else res
    for o, v in zip(outs, vals):
        _write_back(o, v)
    return out if single or len(out) > 1 else out[0]


def _write_back(o, v):
    """o[...] = v for a pool array (each rank its own homes in SPMD) or a numpy array."""
    if not isinstance(o, ndarray):
        o[...] = v
        return
    executor.run(_cast_into, [o], [np.asarray(v)], what="out=")


_cast_into = kernels.Assign()


def _types_ok(types):
    return all(issubclass(t, (ndarray, np.ndarray)) for t in types)


def array_function(self, func, types, args, kwargs):
    """NEP-18 entry (ndarray.__array_function__): the registered implementation of `func`,
    else numpy's on materialized copies (FallbackWarning; refused above materialize_limit).
    NotImplemented when another array type takes part, so it may handle the call."""
    if not _types_ok(types):
        return NotImplemented
    impl = HANDLED.get(func)
    if impl is not None:
        return impl(*args, **kwargs)
    return fallback(func, args, kwargs)
