"""The Array API's manipulation and indexing functions over pool arrays: broadcast_to,
broadcast_arrays, flip, roll, repeat, tile, unstack, take, take_along_axis (and the standard
signatures of concat, stack, expand_dims, squeeze, moveaxis, reshape).

Each result is made by blockwise copies (shape.assign: each home writes the tiles of the
result it homes, reading the input where it lives), never by gathering the input:

- flip: the input seen through a view with negative strides, copied;
- roll: two slab-range copies per rolled axis;
- repeat (one count for all) and tile: the result seen through an interleaved view, e.g.
  (n, r) for repeat, (r, n) for tile, written from the input broadcast along the new axis:
  one copy;
- broadcast_to / broadcast_arrays: copies (the standard allows views; a copy keeps every
  pool array writable without aliasing surprises);
- take / take_along_axis and repeat with per-element counts: advanced indexing, which reads
  only the selected elements one-sided (a numpy result up to pool.advanced_limit, else a pool
  array written chunk by chunk); take with at least a 64th as many indices as elements
  reads an array that fits once, whole, and lets numpy pick; take with a pool index array
  above materialize_limit works through the indices in chunks (chunks.py), each where it
  lives.
"""
import operator

import numpy as np

from ..array.array import ndarray
from . import chunkjobs, chunks, coerce, executor
from . import shape as _shape
from .shape import assign

_norm = np.lib.array_utils.normalize_axis_index


def _new(shp, x, what):
    return executor.new_like(tuple(shp), x.dtype, like=x if tuple(x.shape) == tuple(shp)
                             else None, what=what)


def broadcast_to(x, /, shape):
    """x broadcast to `shape` (numpy's rules and errors), as a new pool array."""
    x = coerce.array(x)
    shp = tuple(operator.index(n) for n in shape)
    np.broadcast_to(np.empty(x.shape, np.bool_), shp)          # numpy's checks
    out = executor.new_like(shp, x.dtype, what="broadcast_to")
    assign(out, x, fresh=True, what="broadcast_to")
    return out


def broadcast_arrays(*arrays):
    """The arrays broadcast against each other (a list of pool arrays; an array already of
    the broadcast shape is returned as it is)."""
    arrays = [coerce.array(a) for a in arrays]
    shp = np.broadcast_shapes(*[a.shape for a in arrays])
    return [a if a.shape == shp else broadcast_to(a, shp) for a in arrays]


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        ax = tuple(_norm(operator.index(a), ndim) for a in axis)
        if len(set(ax)) != len(ax):
            raise ValueError("repeated axis")
        return ax
    return (_norm(operator.index(axis), ndim),)


def flip(x, /, *, axis=None):
    """The order of elements reversed along `axis` (every axis when None): a new pool array,
    copied blockwise from a reversed view."""
    x = coerce.array(x)
    if x.ndim == 0:
        if axis not in (None, ()):
            _axes(axis, 0)
        return x.copy()
    axes = _axes(axis, x.ndim)
    view = x[tuple(slice(None, None, -1) if i in axes else slice(None)
                   for i in range(x.ndim))]
    out = _new(x.shape, x, "flip")
    assign(out, view, fresh=True, what="flip")
    return out


def roll(x, /, shift, *, axis=None):
    """Elements shifted along `axis` (the flattened array when None), wrapping around: a new
    pool array, two blockwise copies per axis."""
    x = coerce.array(x)
    if axis is None:
        if not isinstance(shift, int):
            shift = operator.index(shift) if not isinstance(shift, (tuple, list)) \
                else sum(operator.index(s) for s in shift)
        flat = x.reshape(-1)
        return roll(flat, shift, axis=0).reshape(x.shape)
    shifts = shift if isinstance(shift, (tuple, list)) else (shift,)
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    if len(shifts) == 1 and len(axes) > 1:
        shifts = shifts * len(axes)
    if len(shifts) != len(axes):
        raise ValueError("shift and axis must have the same length")
    per = {}
    for s, a in zip(shifts, axes):
        a = _norm(operator.index(a), x.ndim)
        per[a] = per.get(a, 0) + operator.index(s)
    out = x
    for a, s in per.items():
        n = x.shape[a]
        s = s % n if n else 0
        res = _new(x.shape, x, "roll")
        if s == 0:
            assign(res, out, fresh=True, what="roll")
        else:
            pre = (slice(None),) * a
            assign(res[pre + (slice(s, None),)], out[pre + (slice(0, n - s),)], fresh=True,
                   what="roll")
            assign(res[pre + (slice(0, s),)], out[pre + (slice(n - s, None),)], fresh=True,
                   what="roll")
        out = res
    return out if out is not x else x.copy()


def repeat(x, repeats, /, *, axis=None):
    """Each element repeated `repeats` times along `axis` (the flattened array when None).
    One count for all: one blockwise copy through an interleaved view; a count per element:
    advanced indexing of the input (only the selected elements are read)."""
    x = coerce.array(x)
    if axis is None:
        x = x.reshape(-1)
        axis = 0
    axis = _norm(operator.index(axis), x.ndim)
    n = x.shape[axis]
    if isinstance(repeats, ndarray):
        repeats = repeats.to_numpy() if repeats.ndim else repeats.item()
    if isinstance(repeats, np.ndarray) and repeats.ndim == 0:
        repeats = repeats.item()
    if not isinstance(repeats, np.ndarray):
        r = operator.index(repeats)
        if r < 0:
            raise ValueError("repeats may not be negative")
        shp = x.shape[:axis] + (n * r,) + x.shape[axis + 1:]
        out = executor.new_like(shp, x.dtype, what="repeat")
        if out.size:
            view = out.reshape(x.shape[:axis] + (n, r) + x.shape[axis + 1:])
            src = x.reshape(x.shape[:axis + 1] + (1,) + x.shape[axis + 1:])
            assign(view, src, fresh=True, what="repeat")
        return out
    reps = np.broadcast_to(np.asarray(repeats), (n,))
    if reps.dtype.kind not in "iu":
        raise TypeError("repeats must be integers")
    if (reps < 0).any():
        raise ValueError("repeats may not be negative")
    return take(x, np.repeat(np.arange(n), reps), axis=axis)


def tile(x, repetitions, /):
    """x repeated `repetitions` times along each axis (numpy.tile): one blockwise copy into
    the result seen as (r0, n0, r1, n1, ...)."""
    x = coerce.array(x)
    reps = tuple(operator.index(r) for r in repetitions)
    if any(r < 0 for r in reps):
        raise ValueError("repetitions may not be negative")
    nd = max(len(reps), x.ndim)
    reps = (1,) * (nd - len(reps)) + reps
    xs = (1,) * (nd - x.ndim) + x.shape
    shp = tuple(r * n for r, n in zip(reps, xs))
    out = executor.new_like(shp, x.dtype, what="tile")
    if out.size:
        inter = []
        for r, n in zip(reps, xs):
            inter += [r, n]
        view = out.reshape(tuple(inter))
        src = x.reshape(tuple(v for n in xs for v in (1, n)))
        assign(view, src, fresh=True, what="tile")
    return out


def unstack(x, /, *, axis=0):
    """The slices of x along `axis`, as a tuple of views."""
    x = coerce.array(x)
    if x.ndim == 0:
        raise ValueError("unstack needs an array of at least one dimension")
    axis = _norm(operator.index(axis), x.ndim)
    pre = (slice(None),) * axis
    return tuple(coerce.own(x[pre + (i,)]) for i in range(x.shape[axis]))


def _index_array(indices):
    if isinstance(indices, ndarray):
        indices = indices.to_numpy()
    idx = np.asarray(indices)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, not {idx.dtype}")
    return idx


def take(x, indices, /, *, axis=None):
    """Elements of x at `indices` along `axis` (numpy.take; axis may be None only for 1-D
    x): only those elements are read, one-sided."""
    x = coerce.array(x)
    if axis is None:
        if x.ndim != 1:
            x = x.reshape(-1)
        axis = 0
    axis = _norm(operator.index(axis), x.ndim)
    if isinstance(indices, ndarray) and chunks.big(indices):
        return _take_chunked(x, indices, axis)
    idx = _index_array(indices)
    n = x.shape[axis]
    if not chunks.big(x) and idx.size * 64 >= x.size:    # many indices: read x once
        return coerce.own(_take_whole(x, idx, axis))      # (numpy checks the bounds)
    if idx.size and (idx.max() >= n or idx.min() < -n):
        raise IndexError(f"index out of bounds for axis {axis} with size {n}")
    res = x[(slice(None),) * axis + (idx,)]
    return coerce.own(res)


def _take_whole(x, idx, axis):
    """np.take of x read whole: in place when it is one piece of memory here, else copied
    into a buffer kept for the next call (a fresh 64 MiB array page-faulted for a third of
    the time of such a take)."""
    scratch = executor._Scratch.take()
    try:
        a = executor.read_part(x, x._off, x.shape, x.strides, scratch, "take")
        return np.take(a, idx, axis=axis)
    finally:
        scratch.give()


def _take_chunked(x, ind, axis):
    """take with a pool index array too big to gather: the indices in chunks, each chunk's
    selection read one-sided and written to its rows of the result where the indices live
    (chunks.run), the selected axis first and moved back to `axis` (a view)."""
    if ind.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, not {ind.dtype}")
    n = x.shape[axis]
    if ind.size and (int(ind.max()) >= n or int(ind.min()) < -n):
        raise IndexError(f"index out of bounds for axis {axis} with size {n}")
    xv = _shape.moveaxis(x, axis, 0)
    flat = ind.reshape(-1)
    out = executor.new_like(flat.shape + xv.shape[1:], x.dtype, what="take")
    parts = chunks.ranges(flat.shape[0], chunks.rows(out))
    chunks.run(chunkjobs.TakeRows(), parts, flat, [flat, xv, out], outs=[out])
    res = out.reshape(ind.shape + xv.shape[1:])
    k = ind.ndim
    return _shape.moveaxis(res, list(range(k)), list(range(axis, axis + k)))


def take_along_axis(x, indices, /, *, axis=-1):
    """Elements of x at `indices` matched along `axis` (numpy.take_along_axis): only those
    elements are read, one-sided."""
    x = coerce.array(x)
    idx = _index_array(indices)
    if idx.ndim != x.ndim:
        raise ValueError("indices and x must have the same number of dimensions")
    axis = _norm(operator.index(axis), x.ndim)
    shp = np.broadcast_shapes(tuple(1 if i == axis else n for i, n in enumerate(x.shape)),
                              tuple(1 if i == axis else n for i, n in enumerate(idx.shape)))
    full = tuple(idx.shape[i] if i == axis else shp[i] for i in range(x.ndim))
    idx = np.broadcast_to(idx, full)
    n = x.shape[axis]
    if idx.size and (idx.max() >= n or idx.min() < -n):
        raise IndexError(f"index out of bounds for axis {axis} with size {n}")
    grid = list(np.ogrid[tuple(slice(0, m) for m in full)])
    grid[axis] = idx
    if x.size == 0 or idx.size == 0:
        return coerce.small(np.empty(full, x.dtype))
    return coerce.own(x[tuple(np.broadcast_to(g, full) for g in grid)])


# -- the standard's signatures of pooltensor's shape functions ---------------------------------

def concat(arrays, /, *, axis=0):
    """Join arrays along an existing axis (the flattened arrays when axis is None)."""
    return _shape.concatenate([coerce.array(a) for a in arrays], axis=axis)


def stack(arrays, /, *, axis=0):
    """Join arrays along a new axis."""
    return _shape.stack([coerce.array(a) for a in arrays], axis=axis)


def expand_dims(x, /, axis=0):
    """A length-one axis inserted at `axis` (a view)."""
    x = coerce.array(x)
    return _shape.expand_dims(x, axis)


def squeeze(x, /, axis):
    """Length-one axes removed (a view); ValueError for an axis that is not length one."""
    x = coerce.array(x)
    for a in _axes(axis, x.ndim):
        if x.shape[a] != 1:
            raise ValueError(f"cannot squeeze axis {a} of length {x.shape[a]}")
    return _shape.squeeze(x, axis)


def moveaxis(x, source, destination, /):
    """Axes moved to new positions (a view)."""
    return _shape.moveaxis(coerce.array(x), source, destination)


def permute_dims(x, /, axes):
    """The axes permuted (a view)."""
    return _shape.transpose(coerce.array(x), axes)


def reshape(x, /, shape, *, copy=None):
    """The elements in a new shape: a view when the layout allows (unless copy=True), else a
    copy; copy=False raises ValueError when a view is impossible."""
    return _shape.reshape(coerce.array(x), shape, copy=copy)
