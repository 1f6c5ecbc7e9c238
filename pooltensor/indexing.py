"""Index arithmetic: from a numpy index to byte offsets, and from byte offsets to slab pieces.

Nothing here touches pool memory; every function is pure and works on (byte offset, shape,
byte strides) triples, so it is tested on its own.

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

SLAB, RANGE = 0, 1     # the two kinds of pieces decompose() yields

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


def extent(off, shape, strides, itemsize):
    """[lo, hi): the bytes a non-empty view touches (strides of any sign)."""
    lo = hi = off
    for n, s in zip(shape, strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + itemsize


def contiguous(shape, strides, itemsize):
    """C-contiguous with these strides (size-1 axes count, as they must hold the rule)."""
    expect = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def normalize(off, shape, strides):
    """The same elements with positive strides in descending order and size-1 axes dropped.

    Returns (offset, shape, strides, order, flips): `order` lists the original axes kept, in
    their new order; `flips` the original axes that were reversed. counterpart() applies the
    same change to a numpy array of the original shape (as a view), so pieces of the pool
    view and of the numpy array line up index for index."""
    keep = [d for d in range(len(shape)) if shape[d] != 1]
    flips = []
    for d in keep:
        if strides[d] < 0:
            off += (shape[d] - 1) * strides[d]
            flips.append(d)
    order = sorted(keep, key=lambda d: -abs(strides[d]))
    return (off, tuple(shape[d] for d in order), tuple(abs(strides[d]) for d in order), order,
            flips)


def counterpart(arr, shape, order, flips):
    """A view of numpy `arr` (of the view's original shape) in normalize()'s axis order."""
    idx = tuple(0 if shape[d] == 1 else slice(None, None, -1) if d in flips else slice(None)
                for d in range(len(shape)))
    v = arr[idx + (Ellipsis,)]      # a 0-d view, not a scalar, when every axis is dropped
    keep = [d for d in range(len(shape)) if shape[d] != 1]
    perm = [keep.index(d) for d in order]
    return v.transpose(perm) if perm != list(range(len(perm))) else v


def decompose(off, shape, strides, itemsize, slab):
    """Cut a normalized view into pieces that each touch one slab or one contiguous range.

    Pieces, in ascending byte order:
      (SLAB, k, offset_in_slab, shape, strides, sel): a strided block inside slab k
      (RANGE, lo, hi, sel): C-contiguous bytes [lo, hi) spanning several slabs
    where `sel` indexes the matching block of the counterpart numpy array. Rows that cross a
    slab boundary are split along the next axis; rows that fit are grouped per slab, so the
    number of pieces grows with the slabs touched, not with the elements."""
    out = []
    _dec(off, tuple(shape), tuple(strides), itemsize, slab, (), out)
    return out


def _dec(off, shape, strides, itemsize, S, sel, out):
    span = itemsize
    for n, s in zip(shape, strides):
        span += (n - 1) * s
    k0 = off // S
    if (off + span - 1) // S == k0:
        out.append((SLAB, k0, off - k0 * S, shape, strides, sel))
        return
    if contiguous(shape, strides, itemsize):
        out.append((RANGE, off, off + span, sel))
        return
    n0, s0 = shape[0], strides[0]
    rest, rstr = shape[1:], strides[1:]
    inner = span - (n0 - 1) * s0
    if s0 == 0:
        for i in range(n0):
            _dec(off, rest, rstr, itemsize, S, sel + (i,), out)
        return
    i = 0
    while i < n0:
        start = off + i * s0
        ks = start // S
        limit = (ks + 1) * S
        if start + inner > limit:                       # this row crosses a slab boundary
            _dec(start, rest, rstr, itemsize, S, sel + (i,), out)
            i += 1
            continue
        j = min(n0 - 1, (limit - inner - off) // s0)    # the last row that still fits
        out.append((SLAB, ks, start - ks * S, (j - i + 1,) + rest, strides,
                    sel + (slice(i, j + 1),)))
        i = j + 1


def group_by_slab(flat_off, slab):
    """For element byte offsets (1-D int64): yield (slab k, positions, offsets within slab).

    `positions` index flat_off (a slice when every element is in one slab); elements keep
    their relative order inside a group (a stable sort), so duplicate writes land as numpy's."""
    if flat_off.size == 0:
        return
    slabs = flat_off // slab
    k0, k1 = int(slabs.min()), int(slabs.max())
    if k0 == k1:
        yield k0, slice(None), flat_off - k0 * slab
        return
    order = np.argsort(slabs, kind="stable")
    ss = slabs[order]
    cuts = (np.flatnonzero(ss[1:] != ss[:-1]) + 1).tolist()
    bounds = [0] + cuts + [len(ss)]
    for a, b in zip(bounds[:-1], bounds[1:]):
        pos = order[a:b]
        k = int(ss[a])
        yield k, pos, flat_off[pos] - k * slab


def slabs_of(off, shape, strides, itemsize, slab):
    """Sorted list of the slabs a view touches (no data)."""
    if 0 in shape:
        return []
    noff, nshape, nstrides, _, _ = normalize(off, shape, strides)
    ks = []
    for p in decompose(noff, nshape, nstrides, itemsize, slab):
        if p[0] == SLAB:
            ks.append(p[1])
        else:
            ks.extend(range(p[1] // slab, (p[2] - 1) // slab + 1))
    return sorted(set(ks))
