"""Byte arithmetic of views: from (byte offset, shape, byte strides) to slab pieces.

Nothing here touches pool memory; every function is pure and works on (byte offset, shape,
byte strides) triples, so it is tested on its own. The cache moves bytes piece by piece with
it (transfer.py); the array room parses numpy indexes into such triples (array/indexing.py).
"""
import numpy as np

SLAB, RANGE = 0, 1     # the two kinds of pieces decompose() yields


def c_strides(shape, itemsize):
    """C-contiguous byte strides for `shape`."""
    out, s = [], itemsize
    for n in reversed(shape):
        out.append(s)
        s *= max(n, 1)
    return tuple(reversed(out))


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
