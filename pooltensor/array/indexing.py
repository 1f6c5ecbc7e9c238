"""Index arithmetic: from a numpy index to the view it selects, as byte offsets.

Nothing here touches pool memory; every function is pure and works on (byte offset, shape,
byte strides) triples, so it is tested on its own. From such a triple to slab pieces is the
cache's arithmetic (cache/layout.py).

Why numpy does the index parsing: numpy's indexing rules (negative steps, Ellipsis, None,
integer arrays, boolean masks, the order of advanced dimensions) and its IndexError messages
are subtle. Rather than re-implement them we apply the user's index to stand-in arrays that
have our shape and strides but no data to read:

- basic indexing: ``as_strided`` over a one-element buffer. Indexing it only computes a new
  data pointer, shape and strides (numpy never reads the elements of a view), and those three
  are the view we want.
- advanced indexing: numpy must read elements, so we index zero-stride ``broadcast_to`` views
  of ``arange(n) * stride`` (one small array per axis) and sum the results: the byte offset of
  every selected element, in numpy's result order, computed by numpy's own code.
"""
import numpy as np
from numpy.lib.stride_tricks import as_strided

_ONE = {}              # dtype -> one-element buffer that as_strided views stand on


def as_tuple(index):
    """The index as a tuple, as numpy reads it (a list is an array index, not a tuple)."""
    return index if isinstance(index, tuple) else (index,)


def _basic_item(c):
    if c is None or c is Ellipsis or isinstance(c, slice):
        return True
    if isinstance(c, (bool, np.bool_, np.ndarray, list, tuple)):
        return False
    return hasattr(type(c), "__index__")


def is_basic(index):
    """True when every part is an int, slice, None or Ellipsis (the result is a view)."""
    return all(_basic_item(c) for c in index)


def is_scalar_index(index, ndim):
    """True when a basic index names one element (numpy then returns a scalar)."""
    return len(index) == ndim and all(
        c is not None and c is not Ellipsis and not isinstance(c, slice) for c in index)


def basic(shape, strides, dtype, index):
    """Apply a basic index: (byte offset delta, new shape, new strides). numpy's errors."""
    buf = _ONE.get(dtype)
    if buf is None:
        buf = _ONE[dtype] = np.zeros(1, dtype)
    fake = as_strided(buf, shape=shape, strides=strides, writeable=False)
    if not any(c is Ellipsis for c in index):
        index = index + (Ellipsis,)     # a full integer index then gives a 0-d view, not a read
    v = fake[index]
    return (v.__array_interface__["data"][0] - buf.__array_interface__["data"][0], v.shape,
            v.strides)


def advanced(shape, strides, index):
    """Byte offset deltas of the elements an advanced index selects, in numpy's result shape.

    Returns an int64 ndarray, or a Python int when numpy would return a scalar."""
    nd = len(shape)
    res = np.broadcast_to(np.zeros((), np.int64), shape)[index]   # numpy checks the index
    if not isinstance(res, np.ndarray):
        total = 0
    else:
        total = np.zeros(res.shape, np.int64)
    for d in range(nd):
        if shape[d] <= 1 or strides[d] == 0:
            continue
        col = (np.arange(shape[d], dtype=np.int64) * strides[d]).reshape(
            [-1 if i == d else 1 for i in range(nd)])
        total = total + np.broadcast_to(col, shape)[index]
    return int(total) if not isinstance(res, np.ndarray) else np.asarray(total, np.int64)
