"""The Array API's creation functions, with the standard's signatures (``device=``, ``copy=``,
``dtype=None`` meaning the default dtypes) over pooltensor's creation (array/creation.py).

The pool is the one device (``pooltensor.POOL``, see api_info.py); ``device=None`` or the pool
is accepted, anything else is a ValueError. Every function here also takes ``placement=`` and
``access=`` and ``replicas=`` (copies of every slab of a read-only array: pool/replicas.py)
as pooltensor's own creation functions do.

Distributed: eye writes its diagonal as a strided view, tril/triu are blockwise through the
executor with the row and column numbers as small numpy operands (each home computes its own
slabs), meshgrid's outputs are blockwise broadcast copies.
"""
import builtins

import numpy as np

from ..array import creation
from ..array.array import ndarray
from . import coerce, executor, kernels, ufuncs
from .api_info import check_device

_assign = kernels.Assign()


def _default(dtype, kind="f"):
    """The standard's default dtype for dtype=None (float64 for floats)."""
    return np.dtype(np.float64 if kind == "f" else np.int64) if dtype is None else dtype


def _scalar_dtype(v):
    """The standard's dtype for a Python scalar (bool, int64, float64, complex128); numpy's
    for anything else."""
    if isinstance(v, ndarray):
        return v.dtype
    if isinstance(v, (bool, np.bool_)):
        return np.dtype(np.bool_)
    if isinstance(v, int):
        return np.dtype(np.int64)
    if isinstance(v, float):
        return np.dtype(np.float64)
    if isinstance(v, complex):
        return np.dtype(np.complex128)
    return np.asarray(v).dtype


def asarray(obj, /, dtype=None, *, device=None, copy=None, placement=None, access=None,
            replicas=None):
    """`obj` as a pool array (the Array API's asarray).

    A pool array comes back as itself when dtype, placement and access allow and copy is not
    True; copy=True always makes a new pool array. Anything else numpy accepts (numpy arrays
    and scalars, Python scalars, nested sequences, buffers, DLPack producers) is copied in:
    pool memory is not numpy's, so copy=False raises ValueError for it. Python scalars get the
    standard's dtypes (bool, int64, float64, complex128)."""
    check_device(device)
    if dtype is not None:
        dtype = np.dtype(dtype)
    if isinstance(obj, ndarray):
        same = (dtype is None or dtype == obj.dtype) and placement is None and \
            (access is None or access == obj.access) and replicas is None
        if same and copy is not True:
            return obj
        if copy is False:
            raise ValueError("asarray(copy=False): a new pool array would be needed (another "
                             "dtype, placement or access)")
        if placement is None and (access is None or access == obj.access) and \
                replicas is None:
            return ufuncs.astype(obj, obj.dtype if dtype is None else dtype, copy=True)
        obj = obj.to_numpy()
    if copy is False:
        raise ValueError("asarray(copy=False) of a non-pool object: its data must be copied "
                         "into the pool")
    if dtype is None and isinstance(obj, (bool, int, float, complex)) and \
            not isinstance(obj, np.generic):
        dtype = _scalar_dtype(obj)
    if isinstance(obj, (list, tuple)) and any(isinstance(v, ndarray) for v in obj):
        obj = [v.to_numpy() if isinstance(v, ndarray) else v for v in obj]
    arr = np.asarray(obj, dtype=dtype)
    if dtype is None and arr.dtype.kind == "i" and arr.dtype != np.int64 and \
            not isinstance(obj, (np.ndarray, np.generic)):
        arr = arr.astype(np.int64)
    creation._check_dtype(arr.dtype)
    return creation.from_numpy(arr, placement=placement, access=access or "readwrite",
                               replicas=replicas)


def empty(shape, dtype=None, *, device=None, placement=None, access="readwrite",
          replicas=None):
    """A new pool array of `shape`, its elements not initialized (dtype default float64)."""
    check_device(device)
    return creation.empty(shape, _default(dtype), placement=placement, access=access,
                         replicas=replicas)


def zeros(shape, dtype=None, *, device=None, placement=None, access="readwrite",
          replicas=None):
    """A new pool array of zeros (dtype default float64)."""
    check_device(device)
    return creation.zeros(shape, _default(dtype), placement=placement, access=access,
                         replicas=replicas)


def ones(shape, dtype=None, *, device=None, placement=None, access="readwrite",
         replicas=None):
    """A new pool array of ones (dtype default float64)."""
    check_device(device)
    return creation.ones(shape, _default(dtype), placement=placement, access=access,
                        replicas=replicas)


def full(shape, fill_value, dtype=None, *, device=None, placement=None, access="readwrite",
         replicas=None):
    """A new pool array filled with fill_value (dtype from it: bool, int64, float64 or
    complex128 for Python scalars)."""
    check_device(device)
    if isinstance(fill_value, ndarray):
        fill_value = fill_value.item()
    dtype = _scalar_dtype(fill_value) if dtype is None else dtype
    return creation.full(shape, fill_value, dtype, placement=placement, access=access,
                         replicas=replicas)


def arange(start, /, stop=None, step=1, dtype=None, *, device=None, placement=None,
           access="readwrite", replicas=None):
    """Evenly spaced values in [start, stop) (int64 for integers, float64 otherwise)."""
    check_device(device)
    return creation.arange(start, stop, step, dtype, placement=placement, access=access,
                           replicas=replicas)


def linspace(start, stop, /, num=50, endpoint=True, dtype=None, *, device=None,
             placement=None, access="readwrite", replicas=None):
    """num evenly spaced values from start to stop (float64, complex128 for complex ends)."""
    check_device(device)
    if dtype is None:
        dtype = np.complex128 if any(isinstance(v, complex) for v in (start, stop)) \
            else np.float64
    return creation.linspace(start, stop, num, endpoint, dtype, placement=placement,
                             access=access, replicas=replicas)


def empty_like(x, /, *, dtype=None, device=None):
    """A new uninitialized pool array of x's shape and (default) dtype, placed like x."""
    check_device(device)
    x = coerce.array(x)
    return executor.new_like(x.shape, x.dtype if dtype is None else dtype, like=x,
                             what="empty_like")


def full_like(x, /, fill_value, *, dtype=None, device=None):
    """A new pool array of x's shape filled with fill_value, placed like x."""
    out = empty_like(x, dtype=dtype, device=device)
    if isinstance(fill_value, ndarray):
        fill_value = fill_value.item()
    executor.run(kernels.Fill(), [out], [np.full(1, fill_value, out.dtype)[0]], fresh=True,
                 what="full_like")
    return out


def zeros_like(x, /, *, dtype=None, device=None):
    """A new pool array of x's shape filled with zeros."""
    return full_like(x, 0, dtype=dtype, device=device)


def ones_like(x, /, *, dtype=None, device=None):
    """A new pool array of x's shape filled with ones."""
    return full_like(x, 1, dtype=dtype, device=device)


def eye(n_rows, n_cols=None, /, *, k=0, dtype=None, device=None, placement=None):
    """An n_rows x n_cols pool array with ones on diagonal k, zeros elsewhere; the zeros are
    written where the slabs live and the diagonal through one strided view."""
    check_device(device)
    m = n_rows if n_cols is None else n_cols
    x = creation.zeros((n_rows, m), _default(dtype), placement=placement)
    i0 = builtins.max(0, -k)
    count = builtins.max(0, builtins.min(n_rows - i0, m - (i0 + k)))
    if count and x.size:
        flat = x.reshape_flat()
        start = i0 * m + i0 + k
        flat[start:start + (count - 1) * (m + 1) + 1:m + 1] = 1
    return x


class _Tri:
    """tril/triu on a block: parts are (x, row numbers, column numbers)."""

    def __init__(self, k, lower):
        self.k, self.lower = k, lower

    def __call__(self, x, i, j):
        keep = (j - i <= self.k) if self.lower else (j - i >= self.k)
        return np.where(keep, x, np.zeros((), np.asarray(x).dtype))


def _tri(x, k, lower):
    x = coerce.array(x)
    if x.ndim < 2:
        raise ValueError("tril/triu need an array of at least two dimensions")
    out = executor.new_like(x.shape, x.dtype, like=x, what="tril" if lower else "triu")
    n, m = x.shape[-2:]
    rows = np.arange(n).reshape(n, 1)
    cols = np.arange(m).reshape(1, m)
    executor.run(kernels.Func(_Tri(int(k), lower)), [out], [x, rows, cols], fresh=True,
                 what=f"{'tril' if lower else 'triu'} {int(k)}")
    return out


def tril(x, /, *, k=0):
    """The lower triangle of the last two axes (zeros above diagonal k), blockwise."""
    return _tri(x, k, True)


def triu(x, /, *, k=0):
    """The upper triangle of the last two axes (zeros below diagonal k), blockwise."""
    return _tri(x, k, False)


def meshgrid(*arrays, indexing="xy"):
    """Coordinate matrices from 1-D arrays (numpy.meshgrid: 'xy' or 'ij'), as new pool
    arrays written blockwise."""
    if indexing not in ("xy", "ij"):
        raise ValueError("indexing must be 'xy' or 'ij'")
    arrays = [coerce.array(a) for a in arrays]
    for a in arrays:
        if a.ndim != 1:
            raise ValueError("meshgrid takes one-dimensional arrays")
    if len({a.dtype for a in arrays}) > 1:
        raise ValueError("meshgrid: the arrays must have one dtype")
    shape = [a.shape[0] for a in arrays]
    if indexing == "xy" and len(shape) > 1:
        shape[0], shape[1] = shape[1], shape[0]
    outs = []
    for i, a in enumerate(arrays):
        ax = i
        if indexing == "xy" and len(arrays) > 1 and i < 2:
            ax = 1 - i
        view = a.reshape((1,) * ax + (a.shape[0],) + (1,) * (len(shape) - ax - 1)) \
            if len(shape) > 1 else a
        out = executor.new_like(tuple(shape), a.dtype, what="meshgrid")
        executor.run(_assign, [out], [view], fresh=True, what="meshgrid")
        outs.append(out)
    return outs


def from_dlpack(x, /, *, device=None, copy=None):
    """A pool array from a DLPack producer: a pool array as itself (unless copy=True); the
    data of any other producer (numpy, JAX, ...) is copied into the pool, so copy=False
    raises BufferError for those."""
    check_device(device)
    if isinstance(x, ndarray):
        return x.copy() if copy else x
    if copy is False:
        raise BufferError("from_dlpack(copy=False): pool memory is not the producer's; the "
                          "data must be copied in")
    if not hasattr(x, "__dlpack__"):
        raise TypeError(f"{type(x).__name__} does not implement __dlpack__")
    return asarray(np.from_dlpack(x))
