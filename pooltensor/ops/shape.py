"""Shape functions of pool arrays: reshape, ravel, transpose, swapaxes, moveaxis, squeeze,
expand_dims, concatenate, stack, and blockwise assignment between arrays.

What is a view and what is materialized. A pool array is (allocation, byte offset, shape,
byte strides), numpy's own description, so every function that numpy can answer with a view
gives a view here too, computed by numpy itself: the function is applied to a stand-in array
with our shape and strides over a one-element buffer (numpy never reads a view's elements),
and the stand-in's new shape, strides and offset are ours. Hence:

- transpose / .T / swapaxes / moveaxis / squeeze / expand_dims: always views.
- reshape / ravel: a view whenever numpy could reshape a numpy array of the same layout
  without copying (always for a C-contiguous array with order='C': the address space is
  flat); otherwise a copy into a new C-contiguous pool array (collective under SPMD, as
  creation is), then a view of it. copy=True always copies; copy=False raises numpy's
  ValueError when a view is impossible. flatten() always copies.
- concatenate / stack: a new pool array, written blockwise (pooltensor.tiles): under SPMD
  each rank writes the tiles of the result whose first byte it homes, reading the inputs
  (pool or numpy) where they are, then the pool syncs.

Under SPMD the ranks agree on every copy (pool/agree.py): before writing into an array others
may have seen, and again in the sync that ends it; CollectiveMismatch on every rank otherwise.
"""
import operator

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..array.array import ndarray
from ..array.creation import _new as _create
from ..cache import layout, transfer
from ..pool import agree, work
from . import kernels, tiles
from .dispatch import implements
from .tiles import ndim_of as _ndim_of, shape_of as _shape_of


_normalize = np.lib.array_utils.normalize_axis_index
_ASSIGN = kernels.Assign()


def _stand_in(x, zero=False):
    """(one-element buffer, numpy array with x's shape and strides over it)."""
    buf = np.zeros(1, x.dtype)
    strides = (0,) * x.ndim if zero else x.strides
    return buf, as_strided(buf, shape=x.shape, strides=strides, writeable=False)


def _view(x, fn):
    """The pool view numpy's fn makes of an array laid out as x (fn must return a view)."""
    buf, fake = _stand_in(x)
    v = fn(fake)
    delta = v.__array_interface__["data"][0] - buf.__array_interface__["data"][0]
    return ndarray(x._a, x._off + delta, v.shape, v.strides, x.dtype)


def _new(shape, dtype, like, what):
    """A result array: shared (collective under SPMD) unless a pool input is private."""
    private = any(isinstance(a, ndarray) and a._a.heap == "pv" for a in like)
    return _create(shape, dtype, None, "private" if private else "readwrite", what)[0]


def assign(dst, src, sync=True, fresh=False, what="assign"):
    """dst[...] = src, blockwise: numpy's broadcasting and casting (as x[...] = y).

    Under SPMD with a shared dst (and no private src) every rank calls it and writes the
    tiles of dst it homes, then the pool syncs (sync=False leaves that to the caller). The
    ranks agree on the call first (unless fresh=True: dst was just made, nobody has seen
    it; then the sync checks it) and in the sync."""
    pool = dst._a.pool
    pool.check_open()
    if dst._a.access == "readonly":
        raise ValueError("assignment destination is read-only")
    src_pool = isinstance(src, ndarray)
    if src_pool:
        call_src = src
        if src.shape != dst.shape:
            src = _view(src, lambda f: np.broadcast_to(f, dst.shape))
        coll = tiles.collective(dst, src)
        it = max(dst.itemsize, src.itemsize)
    else:
        call_src = src = np.asarray(src)
        src = np.broadcast_to(src, dst.shape)
        coll = tiles.collective(dst)
        it = max(dst.itemsize, src.dtype.itemsize)
    call = None
    if coll:
        call = agree.Call(what, dst.shape, dst.dtype, access=dst.access, targets=(dst,),
                          operands=(call_src,))
        if not fresh:
            agree.check(pool.world, call)
    if not coll and src_pool and call_src.ndim <= dst.ndim and work.servers(pool) and \
            work.doers(pool, dst, local_ok=work.aligned(dst, [call_src]), inputs=[call_src]):
        # memory servers: the executor's units are whole slabs of the target, so each server
        # writes only what it holds, reading src from its peers (the rest runs here; when no
        # server can, the tiles below, by this process alone)
        from . import executor
        executor.run(_ASSIGN, [dst], [call_src], fresh=fresh, what=what)
        return
    if not coll:                   # a plain script's members write the tiles they home
        if work.share(pool, work.doers(pool, dst), ("assign", dst, call_src),
                      lambda handled: _assign_tiles(dst, src, handled, it), [dst]) is not None:
            return
    _assign_tiles(dst, src, coll, it)
    if coll and sync:
        pool.sync(call)


def set_on_servers(x, idx, value):
    """x[idx] = value (a basic index, a pool value) in a pool on memory servers: a copy the
    servers make (assign), reading value's slabs from each other. False elsewhere: the
    caller copies through this process."""
    if value.ndim > x.ndim or not work.servers(x._a.pool):
        return False
    from ..array import indexing
    d, shape, strides = indexing.basic(x._shape, x._strides, x._dtype, idx)
    assign(ndarray(x._a, x._off + d, shape, strides, x._dtype), value)
    return True


def assign_here(dst, src):
    """A member's part of a plain script's assign(): the tiles of dst it homes."""
    if isinstance(src, ndarray):
        if src.shape != dst.shape:
            src = _view(src, lambda f: np.broadcast_to(f, dst.shape))
        it = max(dst.itemsize, src.itemsize)
    else:
        src = np.broadcast_to(np.asarray(src), dst.shape)
        it = max(dst.itemsize, src.dtype.itemsize)
    _assign_tiles(dst, src, True, it)


def _assign_tiles(dst, src, coll, it):
    pool = dst._a.pool
    src_pool = isinstance(src, ndarray)
    tl = tiles.split(dst.shape, it, tiles.target(pool))
    todo = tiles.mine(dst, tl, coll)
    scratch = tiles.Scratch()
    prefetching = coll is not True
    for i, (s, e) in enumerate(todo):
        if src_pool:
            if prefetching and i + 1 < len(todo):
                tiles.hint(src, *todo[i + 1])
            blk = tiles.read(src, s, e, scratch)
        else:
            blk = src[tuple(slice(a, b) for a, b in zip(s, e))]
        off, shape, strides = tiles.view_of(dst, s, e)
        if blk.dtype != dst.dtype:
            val = np.empty(shape, dst.dtype)
            val[...] = blk                      # numpy's casting, as in x[...] = y
            blk = val
        transfer.write(pool, dst._a, off, shape, strides, dst.dtype, blk)


def copy_c(x):
    """A new C-contiguous pool array holding x's elements (each slab homed with them)."""
    if x._a.heap == "pv":
        out = _create(x.shape, x.dtype, None, "private", "copy result")[0]
    else:
        out = _create(x.shape, x.dtype, tiles.placement_like(x, x.shape, x.dtype),
                      "readwrite", "copy result")[0]
    assign(out, x, fresh=True, what="copy")
    return out


# -- views ---------------------------------------------------------------------------------

def transpose(a, axes=None):
    """The array with its axes permuted (reversed by default): always a view."""
    if not isinstance(a, ndarray):
        return np.transpose(a, axes)
    return _view(a, lambda f: np.transpose(f, axes))


def swapaxes(a, axis1, axis2):
    """Axes axis1 and axis2 interchanged: a view."""
    if not isinstance(a, ndarray):
        return np.swapaxes(a, axis1, axis2)
    return _view(a, lambda f: np.swapaxes(f, axis1, axis2))


def moveaxis(a, source, destination):
    """Axes moved to new positions, the others in their order: a view."""
    if not isinstance(a, ndarray):
        return np.moveaxis(a, source, destination)
    return _view(a, lambda f: np.moveaxis(f, source, destination))


def squeeze(a, axis=None):
    """Length-one axes removed: a view."""
    if not isinstance(a, ndarray):
        return np.squeeze(a, axis)
    return _view(a, lambda f: np.squeeze(f, axis))


def expand_dims(a, axis):
    """Length-one axes inserted at `axis`: a view."""
    if not isinstance(a, ndarray):
        return np.expand_dims(a, axis)
    return _view(a, lambda f: np.expand_dims(f, axis))


def _order(a, order):
    if order not in ("C", "F", "A", "K", None):
        raise ValueError(f"order must be one of 'C', 'F', 'A', or 'K' (got {order!r})")
    if order in ("A", "K"):
        c = layout.contiguous(a.shape, a.strides, a.itemsize)
        f = layout.contiguous(a.shape[::-1], a.strides[::-1], a.itemsize)
        return "F" if f and not c else "C"
    return order or "C"


def reshape(a, shape=None, order="C", *, newshape=None, copy=None):
    """A new shape for the same elements (numpy.reshape): a view when the layout allows,
    else a copy into a new pool array (see the module docstring); one -1 is inferred."""
    if shape is None:
        shape = newshape
    if not isinstance(a, ndarray):
        return np.reshape(a, shape, order=order, copy=copy)
    if isinstance(shape, (int, np.integer)):
        shape = (operator.index(shape),)
    order = _order(a, order)
    _, zero = _stand_in(a, zero=True)
    shape = np.reshape(zero, shape, order=order, copy=False).shape   # numpy's checks and -1
    if copy is not True:
        buf, fake = _stand_in(a)
        try:
            v = np.reshape(fake, shape, order=order, copy=False)
        except ValueError:
            if copy is False:
                raise
        else:
            delta = v.__array_interface__["data"][0] - buf.__array_interface__["data"][0]
            return ndarray(a._a, a._off + delta, v.shape, v.strides, a.dtype)
    if order == "F":
        c = copy_c(transpose(a))                      # x.T in C order is x in F order
        return transpose(reshape(c, shape[::-1], "C"))
    return reshape(copy_c(a), shape, "C")


def ravel(a, order="C"):
    """The elements as a contiguous 1-D array (numpy.ravel): a view when the array already is
    contiguous in that order ('K': in memory order, every stride positive), else a copy."""
    if not isinstance(a, ndarray):
        return np.ravel(a, order)
    return _ravel(a, order, False)


def flatten(a, order="C"):
    """A 1-D copy of the elements (ndarray.flatten)."""
    return _ravel(a, order, True)


def _ravel(a, order, copy):
    if order not in ("C", "F", "A", "K"):
        raise ValueError(f"order must be one of 'C', 'F', 'A', or 'K' (got {order!r})")
    it = a.itemsize
    c = a.size == 0 or layout.contiguous(a.shape, a.strides, it)
    f = a.size == 0 or layout.contiguous(a.shape[::-1], a.strides[::-1], it)
    if order == "A":
        order = "F" if f and not c else "C"
    if order == "K":
        if c:
            order = "C"
        elif f:
            order = "F"
        else:                  # memory order: axes by decreasing |stride| (numpy's sort)
            perm = sorted(range(a.ndim), key=lambda i: -abs(a.strides[i]))
            y = transpose(a, perm)
            if not copy and all(st > 0 for st in a.strides) and \
                    layout.contiguous(y.shape, y.strides, it):
                return reshape(y, (-1,))
            return reshape(copy_c(y), (-1,))
    if order == "F":
        y = transpose(a)
        if f and not copy:
            return reshape(y, (-1,))
        return reshape(copy_c(y), (-1,))
    if c and not copy:
        return reshape(a, (-1,))
    return reshape(copy_c(a), (-1,))


# -- concatenate and stack -------------------------------------------------------------------

def _inputs(arrays):
    if isinstance(arrays, ndarray):
        return [arrays[i] for i in range(len(arrays))]
    return [a if isinstance(a, ndarray) else np.asarray(a) for a in arrays]


def _probe(a, axis):
    """A zero-size numpy stand-in of a for numpy's checks (its axis `axis` emptied)."""
    shape = list(a.shape)
    if axis is None:
        shape = [0]
    elif 0 <= axis < len(shape):
        shape[axis] = 0
    return np.zeros(shape, a.dtype)


def concatenate(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    """Join arrays (pool or numpy) along an existing axis (numpy.concatenate): a new pool
    array (or out=), written blockwise."""
    arrs = _inputs(arrays)
    if not arrs:
        raise ValueError("need at least one array to concatenate")
    pools = [a for a in arrs if isinstance(a, ndarray)]
    if not pools:
        res = np.concatenate(arrs, axis=axis, dtype=dtype, casting=casting)
        if out is not None:
            return _store(out, res)
        return res
    ax = axis
    if axis is not None and arrs[0].ndim > 0:
        ax = _normalize(operator.index(axis), arrs[0].ndim)
    probe = np.concatenate([_probe(a, ax) for a in arrs], axis=axis, dtype=dtype,
                           casting=casting)
    if axis is None:
        shape = (sum(a.size for a in arrs),)
    else:
        shape = list(arrs[0].shape)
        shape[ax] = sum(a.shape[ax] for a in arrs)
        shape = tuple(shape)
    if out is not None:
        if tuple(_shape_of(out)) != shape:
            raise ValueError("Output array is the wrong shape")
        np.concatenate([_probe(a, ax) for a in arrs], axis=axis,
                       out=np.zeros(probe.shape, np.asarray(out).dtype
                                    if not isinstance(out, ndarray) else out.dtype),
                       casting=casting)
        res = out
    else:
        res = _new(shape, probe.dtype, pools, "concatenate result")
    pos = 0
    for a in arrs:
        if axis is None:
            n = a.size
            dst = res[pos:pos + n]
            a = ravel(a) if isinstance(a, ndarray) else np.ravel(a)
        else:
            n = a.shape[ax]
            dst = res[(slice(None),) * ax + (slice(pos, pos + n),)]
        pos += n
        if isinstance(dst, ndarray):
            assign(dst, a, sync=False, fresh=out is None, what="concatenate")
        else:
            dst[...] = a.to_numpy() if isinstance(a, ndarray) else a
    if isinstance(res, ndarray) and tiles.collective(res, *pools):
        res._a.pool.sync(agree.Call(f"concatenate axis {axis}", shape, res.dtype,
                                    targets=(res,), operands=arrs))
    return res


def _store(out, res):
    if isinstance(out, ndarray):
        if out.shape != res.shape:
            raise ValueError("Output array is the wrong shape")
        assign(out, res)
    else:
        out[...] = res
    return out


def stack(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    """Join arrays of one shape along a new axis (numpy.stack): a new pool array (or out=)."""
    arrs = _inputs(arrays)
    if not arrs:
        raise ValueError("need at least one array to stack")
    shapes = {a.shape for a in arrs}
    if len(shapes) != 1:
        raise ValueError("all input arrays must have the same shape")
    ax = _normalize(operator.index(axis), arrs[0].ndim + 1)
    expanded = [expand_dims(a, ax) for a in arrs]
    return concatenate(expanded, axis=ax, out=out, dtype=dtype, casting=casting)


# -- Array API names ---------------------------------------------------------------------------

def concat(arrays, /, *, axis=0):
    """Array API concat: concatenate (axis=None joins the flattened arrays)."""
    return concatenate(arrays, axis=axis)


def permute_dims(x, /, axes):
    """Array API permute_dims: transpose with the given axes (a view)."""
    return transpose(x, axes)


def matrix_transpose(x, /):
    """The last two axes swapped (a view); ValueError below two dimensions."""
    if _ndim_of(x) < 2:
        raise ValueError("matrix_transpose needs an array of at least two dimensions")
    return swapaxes(x, -1, -2)


def _register():
    implements(np.reshape)(reshape)
    implements(np.ravel)(ravel)
    implements(np.transpose)(transpose)
    implements(np.swapaxes)(swapaxes)
    implements(np.moveaxis)(moveaxis)
    implements(np.squeeze)(squeeze)
    implements(np.expand_dims)(expand_dims)
    implements(np.concatenate)(concatenate)      # numpy's concat and permute_dims are these
    implements(np.stack)(stack)
    implements(np.matrix_transpose)(matrix_transpose)


_register()
