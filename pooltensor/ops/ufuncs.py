"""Elementwise work on pool arrays: numpy's ufuncs (NEP-13 ``__array_ufunc__``), astype, copy,
where and clip.

Why numpy decides everything but the loop. The result's dtype, the casting checks and the
errors come from calling the very function on zero-size samples of the operands (numpy arrays
of the operands' dtypes; Python scalars passed as they are, so NEP 50's weak scalars promote
as in numpy: int8 array + 1 is int8, + 300 is numpy's OverflowError). The shape is numpy's
broadcast of the operands (and of out=). Then the executor runs the same function block by
block, with out= pointing into the result's memory where it is local, so numpy does the
arithmetic on whole blocks and writes it in place.

Results are new pool arrays placed like the first pool operand of the result's shape (so in
SPMD each rank computes on its own slabs), unless out= names the destination; a 0-d result is a
0-d pool array. A numpy array given as out= receives the result computed on numpy copies of
the operands. ``ndarray ** 2`` is np.square, as numpy's own operator does.

Ufunc methods other than __call__: ``reduce`` goes to reductions.ufunc_reduce when that module
provides it, ``at`` runs on a numpy copy that is written back; the others (accumulate, outer,
reduceat) fall back to numpy on copies with a FallbackWarning. Generalized ufuncs (np.matmul)
go to their registered implementation (dispatch.HANDLED), else the same fallback.
"""
import numbers
import warnings

import numpy as np

from ..array.array import ndarray
from ..errors import FallbackWarning
from ..array.creation import empty
from . import dispatch, elide, executor, kernels, reductions

_SCALARS = (bool, int, float, complex, numbers.Number)


_NDARRAY = []


def _is_pool(v):
    if not _NDARRAY:
        _NDARRAY.append(ndarray)
    return isinstance(v, _NDARRAY[0])


def _normalize(v):
    """An operand as the executor takes it: pool arrays, numpy arrays and scalars as they
    are (Python scalars stay weak), anything else converted by np.asarray."""
    if v is None or _is_pool(v) or isinstance(v, (np.ndarray, np.generic, bool, int, float,
                                                  complex)):
        return v
    return np.asarray(v)


def _sample(v):
    """A zero-size stand-in with v's dtype (Python scalars and None stay themselves)."""
    if _is_pool(v) or isinstance(v, (np.ndarray, np.generic)):
        return np.empty(0, v.dtype)
    return v


def _shape_str(shape):
    return "(" + ",".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def _shape_of(v):
    return tuple(v.shape) if _is_pool(v) or isinstance(v, np.ndarray) else ()


def _broadcast(in_shapes, out_shapes):
    """numpy's broadcast of the inputs and outputs, which every output must match exactly
    (numpy's ValueError and wording otherwise)."""
    try:
        shape = np.broadcast_shapes(*in_shapes, *out_shapes)
    except ValueError:
        raise ValueError("operands could not be broadcast together with shapes " +
                         " ".join(_shape_str(s) for s in list(in_shapes) + list(out_shapes)) +
                         " ") from None
    for s in out_shapes:
        if tuple(s) != shape:
            raise ValueError(f"non-broadcastable output operand with shape {_shape_str(s)} "
                             f"doesn't match the broadcast shape {_shape_str(shape)}")
    return shape


def _like(shape, candidates):
    for v in candidates:
        if _is_pool(v) and tuple(v.shape) == shape:
            return v
    return None


def apply(func, inputs, out=None, where=True, nout=1, **kw):
    """func(*inputs, out=..., where=..., **kw) over pool arrays, blockwise.

    func: a ufunc, or a numpy function with an out= argument that works elementwise (np.clip).
    out: None or a tuple of nout entries (None, pool array or numpy array).
    Returns what numpy returns: the outputs (one, or a tuple of nout)."""
    inputs = [_normalize(v) for v in inputs]
    outs = list(out) if out is not None else [None] * nout
    if len(outs) != nout:
        raise ValueError(f"The 'out' tuple must have exactly {nout} entries: one per ufunc "
                         f"output")
    has_where = not (where is True)
    if has_where:
        where = _normalize(where)
    # numpy's own checks and result dtypes, on zero-size samples
    ufunc = isinstance(func, np.ufunc)        # other functions take out= as one array
    skw = dict(kw)
    if any(o is not None for o in outs):
        skw["out"] = tuple(None if o is None else np.empty(0, o.dtype) for o in outs)
        if not ufunc:
            skw["out"] = skw["out"][0]
    if has_where:
        skw["where"] = _sample(where) if not isinstance(where, (bool, np.bool_)) else where
    res = func(*[_sample(v) for v in inputs], **skw)
    res = res if isinstance(res, tuple) else (res,)
    dtypes = [np.asarray(r).dtype for r in res]
    shape = _broadcast([_shape_of(v) for v in inputs],
                       [tuple(o.shape) for o in outs if o is not None])
    if has_where:
        ws = _shape_of(where)
        try:
            ok = np.broadcast_shapes(ws, shape) == shape
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"operands could not be broadcast together with shapes "
                             f"{_shape_str(shape)} {_shape_str(ws)} ")
    if any(isinstance(o, np.ndarray) for o in outs):
        return _into_numpy(func, ufunc, inputs, outs, where if has_where else True, kw)
    reuse = None
    if ufunc and nout == 1 and out is None and not has_where and not kw:
        pool = next((v._a.pool for v in inputs if _is_pool(v)), None)
        if pool is not None and not pool.spmd:
            if not elide._TEMP:
                elide.calibrate(lambda: empty((1,), np.float64))
            i = elide.candidate(inputs, shape, dtypes[0], pool)
            if i is not None:
                reuse = inputs[i]         # a temporary: the result goes into it (elide.py)
    like = _like(shape, inputs + outs)
    name = getattr(func, "__name__", repr(func))
    if kw:
        name += "(" + ", ".join(f"{k}={v!r}" for k, v in sorted(kw.items())) + ")"
    targets = []
    for o, dt in zip(outs, dtypes):
        targets.append(o if o is not None else reuse if reuse is not None else
                       executor.new_like(shape, dt, like=like, what=f"{name} result"))
    ops = inputs + ([where] if has_where else [])
    nin = len(inputs)

    if kernels.plannable(func):           # numpy's own: members can run it
        kernel = kernels.Ufunc(func.__name__, nin, has_where, _plain_kw(kw), ufunc)
    elif has_where:
        def kernel(parts, dsts):
            func(*parts[:nin], out=tuple(dsts), where=parts[nin], **kw)
    elif ufunc:
        def kernel(parts, dsts):
            func(*parts, out=tuple(dsts), **kw)
    else:
        def kernel(parts, dsts):
            func(*parts, out=dsts[0], **kw)
    executor.run(kernel, targets, ops, fill=has_where,
                 fresh=reuse is None and all(o is None for o in outs), what=name)
    return targets[0] if nout == 1 else tuple(targets)


def _plain_kw(kw):
    """ufunc keywords as a plan carries them: dtype types as numpy dtypes."""
    out = {}
    for k, v in kw.items():
        out[k] = np.dtype(v) if isinstance(v, type) and issubclass(v, np.generic) else v
    return out


def _into_numpy(func, ufunc, inputs, outs, where, kw):
    """Outputs that include numpy arrays: compute on numpy copies, write pool outputs back."""
    def mat(v):
        return v.to_numpy() if _is_pool(v) else v
    tmp = tuple(np.array(o.to_numpy(), copy=True) if _is_pool(o) else o for o in outs)
    if where is not True:
        kw = dict(kw, where=mat(where))
    func(*[mat(v) for v in inputs], out=tmp if ufunc else tmp[0], **kw)
    for o, t in zip(outs, tmp):
        if _is_pool(o):
            executor.run(_assign, [o], [t], what=f"{getattr(func, '__name__', func)} out")
    return outs[0] if len(outs) == 1 else tuple(outs)


_assign = kernels.Assign()


def _defer(values):
    """NEP-13: another type that overrides ufuncs (or forbids them) takes part."""
    for v in values:
        t = type(v)
        if v is None or isinstance(v, (ndarray, np.ndarray, np.generic) + _SCALARS):
            continue
        if hasattr(t, "__array_ufunc__"):
            return True
    return False


def array_ufunc(self, ufunc, method, *inputs, **kwargs):
    """NEP-13 entry (ndarray.__array_ufunc__); see the module docstring."""
    out = kwargs.get("out")
    if _defer(inputs + (tuple(out) if out is not None else ())):
        return NotImplemented
    if method == "__call__":
        if ufunc.signature is not None:
            impl = dispatch.HANDLED.get(ufunc)
            if impl is not None:
                return impl(*inputs, **kwargs)
            return dispatch.fallback(ufunc, inputs, kwargs, what=f"numpy.{ufunc.__name__}")
        kw = dict(kwargs)
        out = kw.pop("out", None)
        where = kw.pop("where", True)
        return apply(ufunc, inputs, out=out, where=where, nout=ufunc.nout, **kw)
    if method == "reduce":
        res = _reduce(ufunc, inputs, kwargs)
        if res is not NotImplemented:
            return res
    if method == "at":
        return _at(ufunc, inputs, kwargs)
    return dispatch.fallback(getattr(ufunc, method), inputs, kwargs,
                             what=f"numpy.{ufunc.__name__}.{method}")


def _reduce(ufunc, inputs, kwargs):
    """ufunc.reduce through the reductions module (when it provides ufunc_reduce)."""
    try:
        fn = reductions.ufunc_reduce
    except (ImportError, AttributeError):
        return NotImplemented
    x = inputs[0]
    if len(inputs) != 1 or not _is_pool(x) or \
            set(kwargs) - {"axis", "dtype", "keepdims", "out", "initial"}:
        return NotImplemented
    kw = {}
    if kwargs.get("out") is not None:
        out = kwargs["out"]
        kw["out"] = out[0] if isinstance(out, tuple) else out
    if "initial" in kwargs:
        kw["initial"] = kwargs["initial"]
    return fn(ufunc, x, kwargs.get("axis", 0), kwargs.get("dtype"),
              kwargs.get("keepdims", False), **kw)


def _at(ufunc, inputs, kwargs):
    """ufunc.at(x, indices[, b]) on a pool array: on a numpy copy, written back blockwise."""
    x = inputs[0]
    if not _is_pool(x):
        return dispatch.fallback(ufunc.at, inputs, kwargs, what=f"numpy.{ufunc.__name__}.at")
    pool = x._a.pool
    if x.nbytes > pool.materialize_limit:
        dispatch.fallback(ufunc.at, inputs, kwargs)       # raises MaterializeTooLarge
    warnings.warn(f"numpy.{ufunc.__name__}.at has no pooltensor implementation: it runs on a "
                  f"copy of the array in this process", FallbackWarning, stacklevel=3)
    arr = x.to_numpy(copy=True)
    rest = [v.to_numpy() if _is_pool(v) else v for v in inputs[1:]]
    ufunc.at(arr, *rest, **kwargs)
    if x.access == "readonly":
        raise ValueError("output array is read-only")
    executor.run(_assign, [x], [arr], what=f"{ufunc.__name__}.at")
    return None


# -- astype, copy, where, clip -----------------------------------------------------------------

def astype(x, dtype, casting="unsafe", copy=True):
    """x's values cast to `dtype` (numpy's casting rules and TypeError), as a new pool array;
    x itself when copy=False and the dtype already matches."""
    dtype = np.dtype(dtype)
    if not np.can_cast(x.dtype, dtype, casting):
        raise TypeError(f"Cannot cast array data from {x.dtype!r} to {dtype!r} according to "
                        f"the rule {casting!r}")
    if not copy and dtype == x.dtype:
        return x
    out = executor.new_like(x.shape, dtype, like=x, what="astype result")
    executor.run(_assign, [out], [x], fresh=True, what="astype")
    return out


def copy(x):
    """A new pool array with x's values, placed like x."""
    return astype(x, x.dtype, copy=True)


def where(condition, x, y):
    """Elements of x where condition is true, else of y (np.where with three arguments):
    numpy's promotion and broadcasting, as a new pool array."""
    inputs = [_normalize(v) for v in (condition, x, y)]
    dt = np.where(np.empty(0, bool), _sample(inputs[1]), _sample(inputs[2])).dtype
    shape = _broadcast([_shape_of(v) for v in inputs], [])
    out = executor.new_like(shape, dt, like=_like(shape, inputs[1:] + inputs[:1]),
                            what="where result")
    cond = inputs[0]
    if not isinstance(cond, np.ndarray) and not _is_pool(cond):
        cond = np.asarray(cond)
    for i in (1, 2):         # Python scalars wrap into the result dtype, as np.where does
        if isinstance(inputs[i], (bool, int, float, complex)):
            with np.errstate(all="ignore"):
                inputs[i] = np.asarray(inputs[i]).astype(dt)

    executor.run(kernels.Where(), [out], [cond, inputs[1], inputs[2]], fresh=True,
                 what="where")
    return out


def clip(a, a_min=None, a_max=None, out=None, **kwargs):
    """np.clip: numpy's result dtype and casting, computed blockwise."""
    if "min" in kwargs:
        a_min = kwargs.pop("min")
    if "max" in kwargs:
        a_max = kwargs.pop("max")
    outs = None if out is None else (out if isinstance(out, tuple) else (out,))
    return apply(np.clip, [a, a_min, a_max], out=outs, **kwargs)


@dispatch.implements(np.where)
def _np_where(condition, *args):
    if len(args) == 2:
        return where(condition, *args)
    if not args:
        return dispatch.fallback(np.where, (condition,), {})
    raise ValueError("either both or neither of x and y should be given")


@dispatch.implements(np.clip)
def _np_clip(a, a_min=np._NoValue, a_max=np._NoValue, out=None, *, min=np._NoValue,
             max=np._NoValue, **kwargs):
    if a_min is np._NoValue:
        a_min = None if min is np._NoValue else min
    elif min is not np._NoValue:
        raise ValueError("Passed more than one argument for the minimum: a_min and min")
    if a_max is np._NoValue:
        a_max = None if max is np._NoValue else max
    elif max is not np._NoValue:
        raise ValueError("Passed more than one argument for the maximum: a_max and max")
    return clip(a, a_min, a_max, out=out, **kwargs)


@dispatch.implements(np.copy)
def _np_copy(a, order="K", subok=False):
    return copy(a)


@dispatch.implements(np.copyto)
def _np_copyto(dst, src, casting="same_kind", where=True):
    if not _is_pool(dst):
        return dispatch.fallback(np.copyto, (dst, src), {"casting": casting, "where": where})
    src = _normalize(src)
    np.copyto(np.empty(0, dst.dtype), _sample(src), casting=casting)    # numpy's checks
    _broadcast([_shape_of(src)] + ([_shape_of(where)] if where is not True else []),
               [dst.shape])
    if where is True:
        executor.run(_assign, [dst], [src], what="copyto")
    else:
        executor.run(kernels.AssignWhere(), [dst], [src, _normalize(where)], fill=True,
                     what="copyto where")


@dispatch.implements(np.astype)
def _np_astype(x, dtype, /, *, copy=True, device=None):
    return astype(x, dtype, copy=copy)
