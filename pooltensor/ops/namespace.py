"""The Array API namespace of pool arrays, assembled group by group (``x.__array_namespace__()``
is the ``pooltensor`` module, which imports these names).

Elementwise functions are numpy's ufuncs under the standard's names (acos is numpy.arccos, pow
is numpy.power, ...): called on pool arrays they run blockwise through ``__array_ufunc__``
(ufuncs.py) and return pool arrays. Data types are numpy's. What the standard calls by a
name numpy spells differently, or what is not a ufunc in numpy (round, real, imag), is
defined here.
"""
import numpy as np

import collections

from ..array.creation import full
from . import api_special, coerce, dispatch, executor, kernels, ufuncs
from .api_info import API_VERSION, API_VERSIONS, check_device

__array_api_version__ = API_VERSION

# -- data types and constants -----------------------------------------------------------------
bool = np.bool_          # noqa: A001  (the standard's name)
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float32, float64 = np.float32, np.float64
complex64, complex128 = np.complex64, np.complex128
e, inf, nan, pi, newaxis = np.e, np.inf, np.nan, np.pi, None

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64", "complex64", "complex128"]
CONSTANTS = ["e", "inf", "nan", "pi", "newaxis"]

# -- elementwise functions: the standard's name -> numpy's ufunc ----------------------------------
UFUNCS = {
    "abs": np.absolute, "acos": np.arccos, "acosh": np.arccosh, "add": np.add,
    "asin": np.arcsin, "asinh": np.arcsinh, "atan": np.arctan, "atan2": np.arctan2,
    "atanh": np.arctanh, "bitwise_and": np.bitwise_and, "bitwise_left_shift": np.left_shift,
    "bitwise_invert": np.invert, "bitwise_or": np.bitwise_or,
    "bitwise_right_shift": np.right_shift, "bitwise_xor": np.bitwise_xor, "ceil": np.ceil,
    "conj": np.conjugate, "copysign": np.copysign, "cos": np.cos, "cosh": np.cosh,
    "divide": np.divide, "equal": np.equal, "exp": np.exp, "expm1": np.expm1,
    "floor": np.floor, "floor_divide": np.floor_divide, "greater": np.greater,
    "greater_equal": np.greater_equal, "hypot": np.hypot, "isfinite": np.isfinite,
    "isinf": np.isinf, "isnan": np.isnan, "less": np.less, "less_equal": np.less_equal,
    "log": np.log, "log1p": np.log1p, "log2": np.log2, "log10": np.log10,
    "logaddexp": np.logaddexp, "logical_and": np.logical_and, "logical_not": np.logical_not,
    "logical_or": np.logical_or, "logical_xor": np.logical_xor, "maximum": np.maximum,
    "minimum": np.minimum, "multiply": np.multiply, "negative": np.negative,
    "nextafter": np.nextafter, "not_equal": np.not_equal, "positive": np.positive,
    "pow": np.power, "reciprocal": np.reciprocal, "remainder": np.remainder, "sign": np.sign,
    "signbit": np.signbit, "sin": np.sin, "sinh": np.sinh, "square": np.square,
    "sqrt": np.sqrt, "subtract": np.subtract, "tan": np.tan, "tanh": np.tanh,
    "trunc": np.trunc,
}


def _elementwise(name, uf):
    @coerce.api
    def f(*args, **kwargs):
        return uf(*args, **kwargs)
    f.__name__ = f.__qualname__ = name
    f.__doc__ = (f"{name}(x{', y' if uf.nin == 2 else ''}): elementwise numpy.{uf.__name__}; "
                 f"on pool arrays computed blockwise where the slabs live (a new pool array).")
    return f


for _n, _u in UFUNCS.items():
    globals()[_n] = _elementwise(_n, _u)
del _n, _u
floor_divide = coerce.api(api_special.floor_divide)   # the standard's special cases
expm1 = coerce.api(api_special.expm1)
tanh = coerce.api(api_special.tanh)


@coerce.api
def round(x, /):      # noqa: A001
    """Round to the nearest integer, half to even (numpy.round with decimals=0)."""
    return ufuncs.apply(np.round, [x])


@coerce.api
def real(x, /):
    """The real part: x itself for real dtypes (as numpy's .real), else a new pool array."""
    if x.dtype.kind != "c":
        return x
    return _part(x, np.real)


@coerce.api
def imag(x, /):
    """The imaginary part (zeros of x's dtype for real dtypes), as a new pool array."""
    return _part(x, np.imag)


def _part(x, fn):
    dt = fn(np.empty(0, x.dtype)).dtype
    out = executor.new_like(x.shape, dt, like=x, what=f"{fn.__name__} result")

    executor.run(kernels.Part(fn.__name__), [out], [x], fresh=True, what=fn.__name__)
    return out


@coerce.api
def astype(x, dtype, /, *, copy=True, device=None):
    """x cast to `dtype` (a new pool array unless copy=False and the dtype matches)."""
    check_device(device)
    return ufuncs.astype(coerce.array(x), dtype, copy=copy)


@coerce.api
def where(condition, x1, x2, /):
    """Elements of x1 where condition is true, else of x2."""
    return ufuncs.where(condition, x1, x2)


@coerce.api
def clip(x, /, min=None, max=None):     # noqa: A002
    """Values of x limited to [min, max] (the result keeps x's dtype)."""
    x = coerce.array(x)
    if min is None and max is None:
        return x.copy()
    res = ufuncs.clip(x, min, max)
    return res if res.dtype == x.dtype else ufuncs.astype(res, x.dtype)


# -- data type functions ---------------------------------------------------------------------------
def _dt(v):
    return v.dtype if hasattr(v, "dtype") and not isinstance(v, (type, np.dtype)) else v


def result_type(*arrays_and_dtypes):
    """numpy.result_type of the arguments (pool arrays count by their dtype)."""
    vals = [_dt(v) for v in arrays_and_dtypes]
    if vals and all(isinstance(v, (bool, int, float, complex)) for v in vals):
        raise ValueError("result_type needs at least one array or dtype")
    return np.result_type(*vals)


def can_cast(from_, to, /):
    """Whether a value of dtype (or array) `from_` casts to `to` under 'safe' casting."""
    return np.can_cast(_dt(from_), to)


FInfo = collections.namedtuple("FInfo", "bits eps max min smallest_normal dtype")
IInfo = collections.namedtuple("IInfo", "bits max min dtype")


def finfo(type, /):      # noqa: A002
    """Limits of a floating dtype (or an array's): bits, eps, max, min, smallest_normal as
    Python floats, and the dtype (complex dtypes give their real part's limits)."""
    f = np.finfo(_dt(type))
    return FInfo(int(f.bits), float(f.eps), float(f.max), float(f.min),
                 float(f.smallest_normal), f.dtype)


def iinfo(type, /):      # noqa: A002
    """Limits of an integer dtype (or an array's): bits, max, min as Python ints, and the
    dtype."""
    i = np.iinfo(_dt(type))
    return IInfo(int(i.bits), int(i.max), int(i.min), i.dtype)


def isdtype(dtype, kind):
    """numpy.isdtype: is `dtype` of `kind` ('bool', 'integral', 'real floating', ...)."""
    return np.isdtype(dtype, kind)


# -- creation from another array -------------------------------------------------------------------
def empty_like(x, /, *, dtype=None, device=None):
    """An uninitialized pool array of x's shape (placed like x)."""
    return executor.new_like(x.shape, x.dtype if dtype is None else dtype,
                             like=x if hasattr(x, "_a") else None, what="empty_like")


def full_like(x, /, fill_value, *, dtype=None, device=None):
    """A pool array of x's shape filled with fill_value (placed like x)."""
    out = empty_like(x, dtype=dtype)
    executor.run(_fill, [out], [np.asarray(fill_value, out.dtype)], fresh=True,
                 what="full_like")
    return out


def zeros_like(x, /, *, dtype=None, device=None):
    """A pool array of x's shape filled with zeros."""
    return full_like(x, 0, dtype=dtype)


def ones_like(x, /, *, dtype=None, device=None):
    """A pool array of x's shape filled with ones."""
    return full_like(x, 1, dtype=dtype)


_fill = kernels.Fill()


@dispatch.implements(np.round, np.around)
def _np_round(a, decimals=0, out=None):
    return ufuncs.apply(np.round, [a], out=None if out is None else (out,), decimals=decimals)


@dispatch.implements(np.real)
def _np_real(val):
    return real(val)


@dispatch.implements(np.imag)
def _np_imag(val):
    return imag(val)


def _register_like():
    """np.empty_like/zeros_like/ones_like/full_like of a pool array: a pool array."""
    def make(fill):
        def impl(prototype, *args, dtype=None, order="K", subok=True, shape=None, device=None):
            if shape is not None and tuple(np.atleast_1d(shape)) != prototype.shape:
                return full(shape, 0 if fill is None else fill, dtype or prototype.dtype)
            if fill is None:
                return empty_like(prototype, dtype=dtype)
            return full_like(prototype, fill, dtype=dtype)
        return impl
    dispatch.HANDLED[np.empty_like] = make(None)
    dispatch.HANDLED[np.zeros_like] = make(0)
    dispatch.HANDLED[np.ones_like] = make(1)

    def full_impl(a, fill_value, dtype=None, order="K", subok=True, shape=None, device=None):
        if shape is not None and tuple(np.atleast_1d(shape)) != a.shape:
            return full(shape, fill_value, dtype or a.dtype)
        return full_like(a, fill_value, dtype=dtype)
    dispatch.HANDLED[np.full_like] = full_impl


_register_like()

ELEMENTWISE = sorted(UFUNCS) + ["round", "real", "imag", "clip", "where", "astype"]
DTYPE_FUNCTIONS = ["result_type", "can_cast", "finfo", "iinfo", "isdtype"]
