"""Tiles: how reductions, matmul and the shape functions cut pool arrays into numpy blocks.

A tile is a rectangular block of an array: single indices on the leading axes, a run along one
axis, and whole trailing axes, about ``target(pool)`` bytes. In C order every tile is a
contiguous range of the array's flat index, so tiles of a C-contiguous array are contiguous
bytes, and a tile's numpy block is reduced by numpy in one call.

Who works on a tile (``owner``): in a collective computation (SPMD, an array shared by the
ranks) the member that homes the tile's lowest byte, so every rank reduces data it holds and
faults in at most the edge of a neighbour's slab; every rank derives the same tile list and
owners from the shape and the slab homes, with no message. Otherwise (a plain script, or a
private array in SPMD) this process does every tile, reading the remote slabs through the
slab cache with the next tile's slabs prefetched.

Reading a tile (``read``): a tile inside a run of this member's slabs whose slots follow each
other (or of a member mapped here with attach) is a read-only numpy view of that memory, no
copy; anything else is copied into a scratch buffer that is reused from tile to tile (a fresh
buffer per tile would page-fault every time).
"""
import numpy as np

import collectives
from collectives.errors import CollectiveMismatch

from ..cache import layout, prefetch, transfer
from ..pool import agree
from ..pool.placement import Explicit

TILE_SLABS = 4          # a tile is about this many slabs (bounded by the cache: see target())
RUN_BYTES = 16 << 20    # longest run of local slabs reduced in one numpy call (flat path)


def target(pool):
    """Bytes per tile: TILE_SLABS slabs, at most a quarter of the slab cache (so a tile and the
    next one's prefetched slabs fit in it), at least one slab."""
    S = pool.slab_size
    return max(S, min(TILE_SLABS * S, pool.cache.capacity // 4))


def collective(*arrays):
    """True when every rank takes part: SPMD with several ranks, and no operand private (a
    private array exists on one rank only, so the work on it is that rank's alone)."""
    pools = [a._a.pool for a in arrays]
    return bool(pools) and pools[0].coherent and all(a._a.heap != "pv" for a in arrays)


def shape_of(v):
    """Shape of a pool array, numpy array or scalar (np.shape would dispatch on pool arrays)."""
    return tuple(v.shape) if hasattr(v, "shape") else np.shape(v)


def ndim_of(v):
    """Number of dimensions of a pool array, numpy array or scalar."""
    return len(shape_of(v))


def split(shape, itemsize, nbytes):
    """The tiles of an array of `shape`: a list of (starts, stops) in C order, each about
    `nbytes` (one element at least). Empty for an empty array; one tile for a 0-d array."""
    nd = len(shape)
    if 0 in shape:
        return []
    if nd == 0:
        return [((), ())]
    d, row = 0, itemsize
    for n in shape[1:]:
        row *= n
    while d < nd - 1 and row > nbytes:
        d += 1
        row //= shape[d]
    c = max(1, nbytes // row)
    tail0, tail1 = (0,) * (nd - d - 1), tuple(shape[d + 1:])
    out = []
    for prefix in np.ndindex(*shape[:d]):
        stop_prefix = tuple(p + 1 for p in prefix)
        for j in range(0, shape[d], c):
            out.append((prefix + (j,) + tail0,
                        stop_prefix + (min(j + c, shape[d]),) + tail1))
    return out


def view_of(x, starts, stops):
    """(byte offset, shape, strides) of tile [starts, stops) of pool array x."""
    off = x._off
    for s, st in zip(starts, x._strides):
        off += s * st
    return off, tuple(b - a for a, b in zip(starts, stops)), x._strides


def owner(x, starts, stops):
    """The member that homes the lowest byte of the tile."""
    off, shape, strides = view_of(x, starts, stops)
    lo = layout.extent(off, shape, strides, x.itemsize)[0]
    return x._a.members[lo // x._a.pool.slab_size]


def handles(pool, m, coll):
    """Does this process work on what member m homes? coll: False (on everything), True (on
    its own: SPMD, or a member), or the set of homes it works for (a plain script whose
    members compute their own)."""
    if coll is True:
        return m == pool.me
    return not coll or m in coll


def mine(x, tiles, coll):
    """The tiles this process works on (see handles(); by the home of a tile's lowest byte)."""
    if not coll:
        return list(tiles)
    pool = x._a.pool
    return [t for t in tiles if handles(pool, owner(x, *t), coll)]


def placement_like(x, shape, dtype, to_x=None):
    """An explicit placement for a new C-contiguous array of `shape`: each slab homed where
    pool array x holds the element the slab's first element corresponds to (to_x maps index
    arrays of the new array to x's; default: the same index), so whoever computes a slab of
    the result finds its input at home. None where there is nothing to line up."""
    pool = x._a.pool
    n = 1
    for d in shape:
        n *= d
    if pool.size == 1 or x._a.heap == "pv" or x.size == 0 or n == 0:
        return None
    it = np.dtype(dtype).itemsize
    S = pool.slab_size
    nslabs = -(-n * it // S)
    first = np.arange(nslabs, dtype=np.int64) * (S // it)
    idx = np.unravel_index(first, shape) if shape else ()
    xi = to_x(idx) if to_x is not None else idx
    b = np.full(nslabs, x._off, np.int64)
    for i, st in zip(xi, x._strides):
        b += np.asarray(i, np.int64) * st
    return Explicit(np.asarray(x._a.members, np.int64)[b // S].tolist())


class Scratch:
    """A reusable buffer for tiles that must be copied."""

    def __init__(self):
        self.buf = np.empty(0, np.uint8)

    def get(self, shape, dtype):
        n = dtype.itemsize
        for d in shape:
            n *= d
        if n > self.buf.size:
            self.buf = np.empty(max(n, 2 * self.buf.size), np.uint8)
        return self.buf[:n].view(dtype).reshape(shape)


def local_view(a, off, shape, strides, dtype):
    """A read-only numpy view of view (off, shape, strides) of allocation `a` when its bytes
    lie in one run of consecutive slots of this member (or of a member mapped here); else None."""
    pool = a.pool
    S = pool.slab_size
    lo, hi = layout.extent(off, shape, strides, dtype.itemsize)
    k0, k1 = lo // S, (hi - 1) // S
    m = a.members[k0]
    if m == pool.me:
        buf = pool.local[a.heap]
    elif pool.mapped:
        buf = pool.mapped.get((a.heap, m))
        if buf is None:
            return None
    else:
        return None
    s0 = a.slots[k0]
    members, slots = a.members, a.slots
    for k in range(k0 + 1, k1 + 1):
        if members[k] != m or slots[k] != s0 + (k - k0):
            return None
    arr = np.ndarray(shape, dtype, buffer=buf, offset=s0 * S + (off - k0 * S), strides=strides)
    arr.flags.writeable = False
    return arr


def read(x, starts, stops, scratch):
    """Tile [starts, stops) of pool array x as numpy (a view when local, else a copy)."""
    off, shape, strides = view_of(x, starts, stops)
    a = x._a
    v = local_view(a, off, shape, strides, x.dtype)
    if v is not None:
        return v
    out = scratch.get(shape, x.dtype)
    return transfer.read(a.pool, a, off, shape, strides, x.dtype, out)


def hint(x, starts, stops):
    """Start fetching the remote slabs of a tile (the one after the current)."""
    off, shape, strides = view_of(x, starts, stops)
    a = x._a
    ks = layout.slabs_of(off, shape, strides, x.itemsize, a.pool.slab_size)
    prefetch.issue_many(a.pool, a, ks)


def blocks(x, tiles, scratch, prefetching=True):
    """(tile, numpy block) for each of `tiles` of x, the next tile's slabs prefetched."""
    for i, t in enumerate(tiles):
        if prefetching and i + 1 < len(tiles):
            hint(x, *tiles[i + 1])
        yield t, read(x, t[0], t[1], scratch)


def flat_blocks(x, coll):
    """A C-contiguous pool array as 1-D numpy blocks: (first flat index, block).

    Runs of this member's slabs (consecutive slots, up to RUN_BYTES) come as one zero-copy
    block each; a remote slab comes as a view of its cache frame, pinned while the block is
    alive, the next remote slabs already in flight. coll: as handles() says."""
    a = x._a
    pool = a.pool
    S = pool.slab_size
    it = x.itemsize
    if x.size == 0:
        return
    lo, hi = x._off, x._off + x.nbytes
    k0, k1 = lo // S, (hi - 1) // S
    members, slots = a.members, a.slots
    me = pool.me
    depth = prefetch.limit(pool)
    issued = k0
    cache = pool.cache
    k = k0
    while k <= k1:
        m = members[k]
        buf = pool.local[a.heap] if m == me else (pool.mapped.get((a.heap, m))
                                                  if pool.mapped else None)
        if buf is not None:
            if coll and not handles(pool, m, coll):
                k += 1
                continue
            j = k
            while (j < k1 and members[j + 1] == m and slots[j + 1] == slots[j] + 1
                   and (j + 2 - k) * S <= RUN_BYTES):
                j += 1
            b0, b1 = max(lo, k * S), min(hi, (j + 1) * S)
            base = slots[k] * S - k * S
            blk = buf[base + b0:base + b1].view(x.dtype)
            blk.flags.writeable = False
            yield (b0 - lo) // it, blk
            k = j + 1
            continue
        if coll and not handles(pool, m, coll):
            k += 1
            continue
        if depth:
            stop = min(k1, k + depth)
            issued = max(issued, k)
            while issued < stop:
                issued += 1
                prefetch.issue(pool, a, issued)
        if a.pf is None:
            a.pf = prefetch.Stream()
        a.pf.last = k                   # explicit streaming: the detector stays out
        b0, b1 = max(lo, k * S), min(hi, (k + 1) * S)
        e = transfer.slab_entry(pool, a, k)
        blk = cache.export(e, e.frame[b0 - k * S:b1 - k * S].view(x.dtype))
        yield (b0 - lo) // it, blk
        del blk
        if e.attached and e.pins == 0:
            cache.entries.move_to_end(e.key, last=False)     # drop-behind: recycle it first
        k += 1


def exchange(world, mine_parts, specs, call=None):
    """Allgather lists of numpy arrays whose shapes every rank knows in advance.

    mine_parts: this rank's arrays; specs[r]: [(shape, dtype), ...] of rank r's arrays.
    Returns one list of arrays per rank, in rank order (the same bytes on every rank).
    call: the collective pool operation this is part of (pool/agree.py): its agreement row
    leads the bytes, and the ranks' calls are compared before the parts are used
    (CollectiveMismatch on every rank when they differ)."""
    sizes = []
    for sp in specs:
        n = 0
        for shape, dt in sp:
            n += int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        sizes.append(n)
    width = max(sizes) if sizes else 0
    lead = 0 if call is None else 8 * agree.ROW
    if width + lead == 0:
        return [[np.empty(shape, dt) for shape, dt in sp] for sp in specs]
    buf = np.zeros(lead + width, np.uint8)
    if lead:
        buf[:lead] = call.row().view(np.uint8)
    pos = lead
    for p in mine_parts:
        b = np.ascontiguousarray(p).reshape(-1).view(np.uint8)
        buf[pos:pos + b.size] = b
        pos += b.size
    try:
        allb = collectives.allgather(buf, world=world)
    except CollectiveMismatch:
        if call is None:
            raise
        # the ranks' buffers differ in length, so their calls differ: name what (the rows
        # alone, in a second allgather every rank of this one makes), else raise as it came
        agree.follow_up(world, call)
        raise
    if lead:
        agree.verify_rows(world, np.ascontiguousarray(allb[:, :lead]).view(np.int64), call)
    out = []
    for r, sp in enumerate(specs):
        row, pos, parts = allb[r], lead, []
        for shape, dt in sp:
            dt = np.dtype(dt)
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            parts.append(row[pos:pos + n].view(dt).reshape(shape))
            pos += n
        out.append(parts)
    return out
