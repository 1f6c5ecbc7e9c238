"""Moving elements between pool slabs and numpy arrays, one slab piece at a time.

A view is cut into slab pieces (layout.decompose); each piece is one numpy copy between a
slab's bytes and the matching block of the numpy array, so Python runs per slab, never per
element or byte. A slab's bytes are: a view of this member's own heap (no copy), or the
frame of a cached copy of a remote slab (faulted in with one Window.get when missing), or,
for a member on this machine, a view of its heap mapped here (pool.mapped; no copy, no
cache). A mapped range is populated in one call before it is read or written (populate.py),
never faulted in page by page.

Writes into a mapped member's slab are numpy copies into its memory (pool.mapped_w). Other
writes are write-through: a remote slab is written at its home with Window.put, and a cached
copy, if any, is updated the same way. Writes are element-precise in SPMD: other ranks may be
writing the neighbouring elements of the same slab, so only the bytes of the selected
elements are put (one put per contiguous run). A plain script without computing members
(pool.exclusive) is the pool's only writer, so there a strided write into a remote slab may
update the cached copy and put the whole touched range in one call (read-modify-write is safe
when nobody else writes).

Lost members (pool/replicas.py). A read that gets PeerLost from a member tells the pool, which
repoints the slabs that have another copy (replicas) and marks the others lost; the read is
then retried, at most once per member. A lost slab raises PeerLost naming its member. Every
slab read first applies losses the pool's keeper has seen (pool.pending) on this thread.
"""
import numpy as np

from collectives.errors import PeerLost

from . import prefetch, progress
from .fault import fetch
from .slabs import _failed
from .populate import populate
from .layout import SLAB, contiguous, counterpart, decompose, extent, group_by_slab, normalize


def slab_read(pool, alloc, k, lo=0, hi=None):
    """The bytes of slab k of `alloc` (a uint8 array of slab_size): local, mapped or cached.
    A mapped slab's bytes [lo, hi) (default: all it holds) are populated first; hi=lo: none
    (the caller populated them)."""
    if pool.pending:
        pool.keeper.apply()
    m = alloc.members[k]
    slot = alloc.slots[k]
    S = pool.slab_size
    if m == pool.me:
        return pool.local[alloc.heap][slot * S:(slot + 1) * S]
    mapped = pool.mapped.get((alloc.heap, m)) if pool.mapped else None
    if mapped is not None:
        pool.cache.direct += 1
        base = slot * S
        populate(mapped, base + lo, base + (alloc.slab_len(k) if hi is None else hi))
        return mapped[base:base + S]
    return slab_entry(pool, alloc, k).frame


def populate_range(pool, alloc, lo, hi, write=False, only=None):
    """Populate the mapped (or, for writes, local) memory behind bytes [lo, hi) of the
    allocation: one call per run of consecutive slots of one member (only: of that member
    alone). Returns whether any slab of the range is mapped or local (else nothing was done)."""
    S = pool.slab_size
    maps = pool.mapped_w if write else pool.mapped
    heap, me = alloc.heap, pool.me
    run = None                 # (buffer, first byte, end byte) of the run being extended
    any_ = False
    for k in range(lo // S, (hi - 1) // S + 1):
        m = alloc.members[k]
        if only is not None and m != only:
            continue
        buf = (pool.local[heap] if write else None) if m == me else maps.get((heap, m))
        if buf is None:
            continue
        any_ = True
        a = alloc.slots[k] * S + max(lo - k * S, 0)
        b = alloc.slots[k] * S + min(hi - k * S, S)
        if run is not None and run[0] is buf and run[2] == a:
            run[2] = b
            continue
        if run is not None:
            populate(run[0], run[1], run[2], write)
        run = [buf, a, b]
    if run is not None:
        populate(run[0], run[1], run[2], write)
    return any_


def recover(pool, err, tries):
    """After PeerLost `err` in a read: let the pool fail over (keeper.recover), or raise
    `err` when it cannot or the read was already retried `tries` times."""
    keeper = getattr(pool, "keeper", None)
    if tries >= pool.size or keeper is None or not keeper.recover(err):
        raise err


def slab_entry(pool, alloc, k):
    """Like slab_read for a remote slab, but returns the cache entry (to pin its frame).
    A member lost on the way: the slab is read from another copy (or PeerLost if none)."""
    for tries in range(pool.size + 1):
        if pool.pending:
            pool.keeper.apply()
        if alloc.lost and k in alloc.lost:
            raise pool.keeper.lost_error(alloc, k)
        try:
            return _entry(pool, alloc, k)
        except PeerLost as e:
            recover(pool, e, tries)


def _entry(pool, alloc, k):
    m, slot = alloc.members[k], alloc.slots[k]
    prefetch.observe(pool, alloc, k)
    cache = pool.cache
    key = (alloc.heap, m, slot)
    e = cache.entries.get(key)
    if e is not None and e.prefetched and e.req is not None and _failed(e.req):
        # a prefetch that failed before anyone wanted the slab (a partition since healed,
        # say): this read fetches it anew within its own timeout, instead of reporting the
        # failure of an earlier moment
        cache.discard(e)
        cache.prefetch_wasted += 1
        e = None
    if e is not None:
        cache.entries.move_to_end(key)
        cache.hits += 1
        if e.prefetched:
            cache.prefetch_used += 1
            e.prefetched = False
        cache.ready(e)
        return e
    cache.misses += 1
    return fetch(pool, alloc.heap, m, slot, alloc.slab_len(k))


# -- reads ---------------------------------------------------------------------------------

def read(pool, alloc, off, shape, strides, dtype, out):
    """Copy the elements of the view (off, shape, strides) into numpy `out` (same shape)."""
    if out.size == 0:
        return out
    for tries in range(pool.size + 1):
        try:
            return _read(pool, alloc, off, shape, strides, dtype, out)
        except PeerLost as e:
            recover(pool, e, tries)


def _read(pool, alloc, off, shape, strides, dtype, out):
    S = pool.slab_size
    it = dtype.itemsize
    noff, nshape, nstrides, order, flips = normalize(off, shape, strides)
    cn = counterpart(out, shape, order, flips)
    lo, hi = extent(off, shape, strides, it)
    big = hi - lo > pool.cache.capacity // 2     # would flush the cache: bypass it
    with progress.for_bytes(hi - lo, "to_numpy") as pb:
        for p in decompose(noff, nshape, nstrides, it, S):
            if p[0] == SLAB:
                _, k, o, sh, st, sel = p
                plo, phi = extent(o, sh, st, it)
                buf = slab_read(pool, alloc, k, plo, phi)
                src = np.ndarray(sh, dtype, buffer=buf, offset=o, strides=st)
                if sel:
                    cn[sel] = src
                else:
                    cn[...] = src
                pb.update(phi - plo)
            else:
                _read_range(pool, alloc, p[1], p[2], cn[p[3]] if p[3] else cn, dtype, big, pb)
    return out


def _read_range(pool, alloc, lo, hi, blk, dtype, big, pb=progress.SILENT):
    """Contiguous bytes [lo, hi) of the allocation into numpy block `blk` (C order); pb: a
    progress bar (progress.bar), told of each slab."""
    S = pool.slab_size
    it = dtype.itemsize
    flat = blk.reshape(-1).view(np.uint8) if blk.flags.c_contiguous else None
    if pool.pending:
        pool.keeper.apply()
    filled = bool(pool.mapped) and populate_range(pool, alloc, lo, hi)
    inflight = []
    try:
        for k in range(lo // S, (hi - 1) // S + 1):
            a, b = max(lo, k * S), min(hi, (k + 1) * S)
            m = alloc.members[k]
            if (big and flat is not None and m != pool.me and b - a == S and
                    not (alloc.lost and k in alloc.lost) and
                    (alloc.heap, m, alloc.slots[k]) not in pool.cache.entries and
                    not (filled and (alloc.heap, m) in pool.mapped)):
                # a read bigger than the cache: full slabs go straight into the destination
                _direct(pool, alloc, k, flat[a - lo:b - lo], inflight)
                pb.update(b - a)
                continue
            buf = slab_read(pool, alloc, k, 0, 0) if filled else slab_read(pool, alloc, k)
            if flat is not None:
                flat[a - lo:b - lo] = buf[a - k * S:b - k * S]
            else:
                blk.flat[(a - lo) // it:(b - lo) // it] = buf[a - k * S:b - k * S].view(dtype)
            pb.update(b - a)
    except BaseException:
        _settle(inflight)
        raise
    _settle(inflight, True)


def _settle(inflight, check=False):
    """Wait for every direct read in flight (none may land later); with check, raise the
    first failure once all are done."""
    first = None
    for req in inflight:
        try:
            req.wait()
        except Exception as e:          # noqa: BLE001
            first = first or e
    if check and first is not None:
        raise first


# Direct slab reads kept in flight at once over tcp: enough to cover a round trip and keep
# the peer's sender busy; the transport splits each into chunks, so this bounds buffering.
DIRECT_INFLIGHT = 8


def _direct(pool, alloc, k, dst, inflight):
    """Slab k straight into dst: over tcp several are kept in flight (a synchronous get per
    slab would pay a round trip each); over shared memory the caller copies it at once."""
    m, S = alloc.members[k], pool.slab_size
    win = pool.read_win[alloc.heap]
    if pool.world.transports[m] in ("tcp", "verbs"):
        if len(inflight) >= DIRECT_INFLIGHT:
            inflight.pop(0).wait()
        inflight.append(win.get_async(m, alloc.slots[k] * S, dst))
    else:
        win.get(m, alloc.slots[k] * S, dst)
    pool.cache.misses += 1
    pool.cache.bytes_fetched += S
    prefetch.observe(pool, alloc, k)


def gather(pool, alloc, offsets, dtype, out):
    """out.flat[i] = element at byte offsets.flat[i] (advanced indexing reads)."""
    for tries in range(pool.size + 1):
        try:
            return _gather(pool, alloc, offsets, dtype, out)
        except PeerLost as e:
            recover(pool, e, tries)


def _gather(pool, alloc, offsets, dtype, out):
    flat_off = offsets.reshape(-1)
    res = out.reshape(-1)
    S = pool.slab_size
    for k, pos, within in group_by_slab(flat_off, S):
        if pool.mapped:
            buf = slab_read(pool, alloc, k, int(within.min()), int(within.max()) + dtype.itemsize)
        else:
            buf = slab_read(pool, alloc, k)
        res[pos] = buf.view(dtype)[within // dtype.itemsize]
    return out


# -- writes --------------------------------------------------------------------------------

def write(pool, alloc, off, shape, strides, dtype, val, local_only=False):
    """Write numpy `val` (the view's shape and dtype) into the view (off, shape, strides).

    local_only: write just the slabs this member homes (SPMD creation: each rank fills its
    own). Read-only heaps are written only here, during creation."""
    if val.size == 0:
        return
    if pool.pending:             # a member was lost: its mapping goes before a write lands
        pool.keeper.apply()
    S = pool.slab_size
    it = dtype.itemsize
    heap = alloc.heap
    noff, nshape, nstrides, order, flips = normalize(off, shape, strides)
    cn = counterpart(val, shape, order, flips)
    touched = set()
    lo_all, hi_all = extent(noff, nshape, nstrides, it)
    with progress.for_bytes(hi_all - lo_all, "write") as pb:
        for p in decompose(noff, nshape, nstrides, it, S):
            if p[0] == SLAB:
                _, k, o, sh, st, sel = p
                m = alloc.members[k]
                if local_only and m != pool.me:
                    continue
                v = cn[sel] if sel else cn
                _write_piece(pool, alloc, k, o, sh, st, dtype, v)
                touched.add(k)
                pb.update(v.nbytes)
            else:
                _, lo, hi, sel = p
                blk = cn[sel] if sel else cn
                data = np.ascontiguousarray(blk).reshape(-1).view(np.uint8)
                for k in range(lo // S, (hi - 1) // S + 1):
                    m = alloc.members[k]
                    a, b = max(lo, k * S), min(hi, (k + 1) * S)
                    pb.update(b - a)
                    if local_only and m != pool.me:
                        continue
                    put_bytes(pool, alloc, k, a - k * S, data[a - lo:b - lo])
                    touched.add(k)
    bump(pool, alloc, touched)


def bump(pool, alloc, ks):
    """After writing slabs `ks` of a read-write array: bump their versions (SPMD only), and
    the allocation's own write count (what a Dask token of the array includes)."""
    alloc.version += 1
    if pool.coherent and alloc.heap == "rw":
        for k in sorted(ks):
            pool.bump(alloc.members[k], alloc.slots[k])


def put_bytes(pool, alloc, k, o, data):
    """Contiguous bytes into slab k at offset o: local copy, or put + cached copy updated.
    A replicated slab (creation only): every copy (in SPMD, the copies this rank homes)."""
    if alloc.copies is None:
        _put_at(pool, alloc.heap, alloc.members[k], alloc.slots[k], o, data)
        return
    for m, slot in alloc.copies[k]:
        if m == pool.me or not pool.spmd:
            _put_at(pool, alloc.heap, m, slot, o, data)


def _put_at(pool, heap, m, slot, o, data):
    S = pool.slab_size
    at = slot * S + o
    if m == pool.me:
        buf = pool.local[heap]
    else:
        buf = pool.mapped_w.get((heap, m)) if pool.mapped_w else None
        if buf is None:
            _put(pool, heap, m, slot, lambda: pool.write_win[heap].put(m, at, data))
    if buf is not None:
        populate(buf, at, at + len(data), write=True)
        buf[at:at + len(data)] = data
        if m == pool.me:
            return
    e = pool.cache.entries.get((heap, m, slot))
    if e is not None:
        pool.cache.ready(e)[o:o + len(data)] = data


def _write_piece(pool, alloc, k, o, sh, st, dtype, v):
    """A strided block inside one slab."""
    m, slot = alloc.members[k], alloc.slots[k]
    S = pool.slab_size
    heap = alloc.heap
    it = dtype.itemsize
    buf = pool.local[heap] if m == pool.me else (pool.mapped_w.get((heap, m))
                                                 if pool.mapped_w else None)
    lo, hi = extent(o, sh, st, it)
    cache = pool.cache
    if buf is not None:        # this member's memory, or a member's mapped here
        populate(buf, slot * S + lo, slot * S + hi, write=True)
        np.ndarray(sh, dtype, buffer=buf, offset=slot * S + o, strides=st)[...] = v
        e = cache.entries.get((heap, m, slot)) if m != pool.me else None
        if e is not None:      # (a copy made before: kept right)
            np.ndarray(sh, dtype, buffer=cache.ready(e), offset=o, strides=st)[...] = v
        return
    e = cache.entries.get((heap, m, slot))
    if contiguous(sh, st, it):
        put_bytes(pool, alloc, k, o, np.ascontiguousarray(v, dtype).reshape(-1).view(np.uint8))
        return
    if pool.exclusive:
        # the only writer: update the cached copy, then put the touched range in one call
        if e is None:
            cache.misses += 1
            e = fetch(pool, heap, m, slot, alloc.slab_len(k))
        frame = cache.ready(e)
        np.ndarray(sh, dtype, buffer=frame, offset=o, strides=st)[...] = v
        _put(pool, heap, m, slot,
             lambda: pool.write_win[heap].put(m, slot * S + lo, frame[lo:hi]))
        return
    if e is not None:
        np.ndarray(sh, dtype, buffer=cache.ready(e), offset=o, strides=st)[...] = v
    _put(pool, heap, m, slot,
         lambda: _put_runs(pool.write_win[heap], m, slot * S + o, sh, st, it, v))


def _put(pool, heap, m, slot, put):
    """A put to a remote slab; when it fails (a timeout, a dropped connection) the home may or
    may not hold the bytes, so a cached copy of that slab is dropped, never kept to disagree
    with the home: the next read asks the home."""
    try:
        put()
    except Exception:
        e = pool.cache.entries.get((heap, m, slot))
        if e is not None:
            pool.cache.discard(e)
        raise


def _put_runs(win, m, base, sh, st, it, v):
    """Element-precise: one put per contiguous run of the block (never a wider range)."""
    r, d = it, len(sh)
    while d > 0 and (st[d - 1] == r or sh[d - 1] == 1):
        r *= sh[d - 1]
        d -= 1
    offs = np.zeros((), np.int64)
    for n, s in zip(sh[:d], st[:d]):
        offs = offs[..., None] + np.arange(n, dtype=np.int64) * s
    data = np.ascontiguousarray(v).reshape(-1).view(np.uint8)
    offs = offs.reshape(-1)
    if offs.size == 1:
        win.put(m, base + int(offs[0]), data[:r])
    else:
        win.put_indexed(m, base + offs, r, data)


def scatter(pool, alloc, offsets, dtype, vals):
    """Element at byte offsets.flat[i] = vals.flat[i] (advanced indexing writes)."""
    if pool.pending:
        pool.keeper.apply()
    S = pool.slab_size
    it = dtype.itemsize
    heap = alloc.heap
    flat_off = offsets.reshape(-1)
    flat_val = vals.reshape(-1)
    touched = set()
    cache = pool.cache
    for k, pos, within in group_by_slab(flat_off, S):
        m, slot = alloc.members[k], alloc.slots[k]
        v = flat_val[pos]
        idx = within // it
        touched.add(k)
        buf = pool.local[heap] if m == pool.me else (pool.mapped_w.get((heap, m))
                                                     if pool.mapped_w else None)
        if buf is not None:
            np.ndarray(S // it, dtype, buffer=buf, offset=slot * S)[idx] = v
            e = cache.entries.get((heap, m, slot)) if m != pool.me else None
            if e is not None:
                cache.ready(e).view(dtype)[idx] = v
            continue
        e = cache.entries.get((heap, m, slot))
        if pool.exclusive:
            if e is None:
                cache.misses += 1
                e = fetch(pool, heap, m, slot, alloc.slab_len(k))
            frame = cache.ready(e)
            frame.view(dtype)[idx] = v
            lo, hi = int(within.min()), int(within.max()) + it
            _put(pool, heap, m, slot, lambda: pool.write_win[heap].put(m, slot * S + lo,
                                                                       frame[lo:hi]))
            continue
        if e is not None:
            cache.ready(e).view(dtype)[idx] = v
        vb = np.ascontiguousarray(v).view(np.uint8)
        _put(pool, heap, m, slot, lambda: pool.write_win[heap].put_indexed(
            m, slot * S + within.astype(np.int64), it, vb))
    bump(pool, alloc, touched)
