"""pooltensor.ndarray: a numpy-like array whose elements live in the pool.

An ndarray is (Allocation, byte offset, shape, byte strides, dtype): the same description
numpy uses, over the allocation's bytes instead of one buffer. Basic indexing therefore
returns a view sharing pool memory (a new offset/shape/strides, nothing copied); advanced
indexing and to_numpy() copy. Every access is one-sided: no other process takes part.

Where an element lives: byte b of the array's allocation is in slab b // slab_size, homed on
``slab_members[b // slab_size]``.
"""
import operator
import weakref

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from . import indexing
from ..cache import layout, prefetch, transfer
from ..errors import MaterializeTooLarge

CHUNK = 64 << 20      # bytes moved at a time when one pool array is assigned to another
MEMO_SLABS = 64       # slabs an allocation remembers for x[i] (see ndarray._scalar)
DIRECT_POPULATE = 16 << 20   # x[i] on a mapped array up to this size populates it first
DIRECT_SLABS = 4096          # x[i] keeps views of at most this many slabs per array
_IMPLIED = {np.dtype(np.float64), np.dtype(np.int_), np.dtype(np.bool_),
            np.dtype(np.complex128)}


def _check_dtype(dtype):
    dtype = np.dtype(dtype)
    if dtype.kind not in "biufc" and getattr(dtype.type, "__module__", "") != "ml_dtypes":
        raise TypeError(f"pooltensor arrays hold booleans and numbers; {dtype} is not supported")
    if dtype.itemsize > 16 or dtype.itemsize & (dtype.itemsize - 1):
        raise TypeError(f"pooltensor arrays hold booleans and numbers; {dtype} is not supported")
    return dtype


def _as_index(index):
    idx = indexing.as_tuple(index)
    if any(isinstance(c, ndarray) for c in idx):
        idx = tuple(c.to_numpy() if isinstance(c, ndarray) else c for c in idx)
    return idx


class _Held:
    """Owner of a zero-copy numpy view of pool memory that holds the allocation too, so its
    slabs are neither freed nor reused while the view lives (the pool array may go first)."""

    __slots__ = ("__array_interface__", "_keep", "_alloc")

    def __init__(self, arr, alloc):
        self.__array_interface__ = arr.__array_interface__
        self._keep, self._alloc = arr, alloc


class ndarray(NDArrayOperatorsMixin):
    """An n-dimensional array in the pool. Made by the creation functions, never directly.

    Python's operators (+ - * / // % ** & | ^ << >> ~ -x +x abs() and comparisons, and their
    in-place forms) are numpy's ufuncs (NDArrayOperatorsMixin), which come back to
    __array_ufunc__: numpy's semantics, computed blockwise where the slabs live."""

    __slots__ = ("_a", "_off", "_shape", "_strides", "_dtype", "_np", "_parts", "_tried",
                 "__weakref__")

    def __init__(self, alloc, off, shape, strides, dtype):
        self._a, self._off = alloc, off
        self._shape, self._strides, self._dtype = tuple(shape), tuple(strides), dtype
        self._np = None          # x[i]: a numpy view of the whole array, where one can be
        self._parts = None       # made, else one per slab (see _direct); tried once
        self._tried = False

    # -- description ---------------------------------------------------------------------
    @property
    def shape(self):
        """Tuple of dimensions."""
        return self._shape

    @property
    def dtype(self):
        """numpy dtype of the elements."""
        return self._dtype

    @property
    def ndim(self):
        """Number of dimensions."""
        return len(self._shape)

    @property
    def size(self):
        """Number of elements."""
        n = 1
        for d in self._shape:
            n *= d
        return n

    @property
    def itemsize(self):
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def nbytes(self):
        """Bytes of the elements (not of the slabs that hold them)."""
        return self.size * self._dtype.itemsize

    @property
    def strides(self):
        """Byte steps per dimension, in the allocation's address space (as numpy's)."""
        return self._strides

    @property
    def T(self):
        """The transposed view (axes reversed), sharing pool memory."""
        return ndarray(self._a, self._off, self._shape[::-1], self._strides[::-1], self._dtype)

    @property
    def access(self):
        """'readwrite', 'readonly' or 'private'."""
        return self._a.access

    @property
    def pool(self):
        """The Pool this array lives in."""
        return self._a.pool

    @property
    def slab_members(self):
        """Home member of every slab of the array's allocation (numpy int array)."""
        return np.array(self._a.members, dtype=np.int64)

    def slabs(self):
        """Indices of the allocation's slabs this view touches (sorted list)."""
        return layout.slabs_of(self._off, self._shape, self._strides, self.itemsize,
                                 self._a.pool.slab_size)

    def where(self):
        """{member: bytes of this view's slabs homed there}: where the view's data lives."""
        out = {}
        a = self._a
        for k in self.slabs():
            m = a.members[k]
            out[m] = out.get(m, 0) + a.slab_len(k)
        return dict(sorted(out.items()))

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of unsized object")
        return self._shape[0]

    def _check(self):
        if self._a.pool.closed:
            self._a.pool.check_open()

    # -- reading ---------------------------------------------------------------------------
    def __getitem__(self, index):
        if type(index) is int:                                  # the hot path: x[i]
            v = self._np
            if v is not None:
                return v[index]
            p = self._parts      # (first element, step, slab views, shift, mask), elements
            if p is not None:
                n = self._shape[0]
                if index < 0:
                    index += n
                if 0 <= index < n:
                    e = p[0] + index * p[1]
                    return p[2][e >> p[3]][e & p[4]]
        if type(index) is int and len(self._shape) == 1:
            if not self._tried:
                self._direct()
                if self._np is not None:
                    return self._np[index]
            n = self._shape[0]
            if index < 0:
                index += n
            if 0 <= index < n:
                b = self._off + index * self._strides[0]
                a = self._a
                v = a.memo.get(b // a.slab)   # (typed slab, owner, cache or None, lo, shift)
                if v is not None and v[1].attached:
                    if v[2] is not None:
                        v[2].hits += 1
                    return v[0][(b - v[3]) >> v[4]]
                return self._scalar(b)
        if type(index) is tuple and len(index) == len(self._shape):    # x[i, j, ...]
            b = self._off
            for i, n, st in zip(index, self._shape, self._strides):
                if type(i) is not int:
                    break
                if i < 0:
                    i += n
                if not 0 <= i < n:
                    break                    # the general path raises numpy's IndexError
                b += i * st
            else:
                return self._scalar(b)
        self._check()
        idx = _as_index(index)
        a = self._a
        if indexing.is_basic(idx):
            d, shape, strides = indexing.basic(self._shape, self._strides, self._dtype, idx)
            if indexing.is_scalar_index(idx, len(self._shape)):
                return self._scalar(self._off + d)
            return ndarray(a, self._off + d, shape, strides, self._dtype)
        offs = indexing.advanced(self._shape, self._strides, idx)
        if isinstance(offs, int):
            return self._scalar(self._off + offs)
        return self._gather(offs + self._off)

    def _direct(self):
        """Make self._np, a numpy view of this 1-D array, when all its bytes lie in one run
        of consecutive slots of this process's memory or of a member's mapped here: x[i] is
        then numpy's own indexing (its bounds, its errors). Else, when every slab it touches
        is in such memory (but in several runs), self._parts: a numpy view per slab, and
        x[i] picks one with a shift and a mask. This memory stays put until the pool closes,
        which drops these views (Pool.views); writes land in the same memory."""
        self._tried = True
        a = self._a
        pool = a.pool
        if pool.closed or self.size == 0:
            return
        if pool.pending:
            pool.keeper.apply()
        lo, hi = layout.extent(self._off, self._shape, self._strides, self.itemsize)
        S = a.slab
        k0, k1 = lo // S, (hi - 1) // S
        if k1 - k0 >= DIRECT_SLABS:
            return
        bufs = []
        for k in range(k0, k1 + 1):
            m = a.members[k]
            buf = pool.local[a.heap] if m == pool.me else (pool.mapped.get((a.heap, m))
                                                           if pool.mapped else None)
            if buf is None:
                return
            bufs.append(buf)
        if hi - lo <= DIRECT_POPULATE:          # (more would commit a member's memory for
            transfer.populate_range(pool, a, lo, hi)    # a few reads)
        s0 = a.slots[k0]
        it = self.itemsize
        if all(b is bufs[0] and a.slots[k] == s0 + k - k0
               for b, k in zip(bufs, range(k0, k1 + 1))):
            base = s0 * S - k0 * S             # allocation byte b is heap byte b + base
            v = np.ndarray(self._shape, self._dtype, buffer=bufs[0], offset=self._off + base,
                           strides=self._strides)
            v.flags.writeable = False
            self._np = v
        elif (S // it) & (S // it - 1) == 0:   # elements per slab: a power of two
            views = [buf[a.slots[k] * S:(a.slots[k] + 1) * S].view(self._dtype)
                     for buf, k in zip(bufs, range(k0, k1 + 1))]
            self._parts = ((self._off - k0 * S) // it, self._strides[0] // it, views,
                           (S // it).bit_length() - 1, S // it - 1)
        else:
            return
        views = pool.views
        if len(views) % 4096 == 4095:          # now and then: forget the dead
            for key in [key for key, r in views.items() if r() is None]:
                del views[key]
        views[id(self)] = weakref.ref(self)

    def _scalar(self, b):
        """The element at byte b of the allocation, as a numpy scalar.

        The slabs read this way are remembered (Allocation.memo: slab -> a typed view of its
        bytes and their owner), so the next x[i] in any of them is a few operations. The
        owner says whether the view is still right: a cache entry (its frame holds a remote
        slab's bytes until the entry leaves the cache: evicted, stale, freed, replaced) or
        cache.live for this process's own memory and mapped members' (right until the pool
        closes). Writes update those bytes in place, so a view stays right while its owner
        is attached."""
        a = self._a
        S = a.slab
        k = b // S
        v = a.memo.get(k)
        if v is not None and v[1].attached:
            if v[2] is not None:
                v[2].hits += 1
            return v[0][(b - v[3]) >> v[4]]
        pool = a.pool
        if pool.closed or pool.pending:
            pool.check_open()          # (and applies members lost meanwhile)
        cache = pool.cache
        m, slot = a.members[k], a.slots[k]
        counter = None
        owner = cache.live
        if m == pool.me:
            buf = pool.local[a.heap][slot * S:(slot + 1) * S]
        elif pool.mapped and (a.heap, m) in pool.mapped:
            buf = transfer.slab_read(pool, a, k)          # populated, all it holds
        else:
            owner = transfer.slab_entry(pool, a, k)
            buf, counter = owner.frame, cache
        typed = buf.view(self._dtype)
        shift = self._dtype.itemsize.bit_length() - 1
        memo = a.memo
        if len(memo) >= MEMO_SLABS:
            for key in [key for key, w in memo.items() if not w[1].attached]:
                del memo[key]
            if len(memo) >= MEMO_SLABS:
                memo.clear()
        memo[k] = (typed, owner, counter, k * S, shift)
        return typed[(b - k * S) >> shift]

    @classmethod
    def _allocate(cls, pool, shape, dtype, access="readwrite", placement=None):
        """A new uninitialized C-ordered array in `pool` and, per slab, whether it is fresh
        (still all zeros); `shape` and `dtype` already checked."""
        n = 1
        for d in shape:
            n *= d
        alloc, fresh = pool.allocate(n * dtype.itemsize, access, placement)
        return cls(alloc, 0, shape, layout.c_strides(shape, dtype.itemsize), dtype), fresh

    def _gather(self, offs):
        pool = self._a.pool
        nbytes = offs.size * self.itemsize
        if nbytes <= pool.advanced_limit:
            out = np.empty(offs.shape, self._dtype)
            return transfer.gather(pool, self._a, offs, self._dtype, out)
        # too big for one numpy copy: a new pool array (private in SPMD: creation is
        # collective there, and indexing must stay one-sided), filled chunk by chunk
        res = self._allocate(pool, offs.shape, self._dtype,
                             access="private" if pool.spmd else "readwrite")[0]
        flat_off = offs.reshape(-1)
        step = max(1, pool.slab_size // self.itemsize)
        tmp = np.empty(min(step, flat_off.size), self._dtype)
        flat = res.reshape_flat()
        for s in range(0, flat_off.size, step):
            part = flat_off[s:s + step]
            vals = transfer.gather(pool, self._a, part, self._dtype, tmp[:part.size])
            flat[s:s + part.size] = vals
        return res

    def reshape_flat(self):
        """A 1-D view of a C-contiguous array (ValueError otherwise)."""
        if not layout.contiguous(self._shape, self._strides, self.itemsize):
            raise ValueError("reshape_flat needs a C-contiguous array")
        return ndarray(self._a, self._off, (self.size,), (self.itemsize,), self._dtype)

    def __dask_tokenize__(self):
        """What Dask's tokenize() sees of this array: its pool, allocation, view and the
        allocation's write count, so a computation over an array written since gets a new
        token (never a stale cached result), and nothing is read."""
        a = self._a
        return ("pooltensor.ndarray", getattr(a.pool, "token", id(a.pool)), a.id, a.version,
                self._off, self._shape, self._strides, self._dtype.str)

    def migrate(self, placement):
        """Move this array's slabs to the homes `placement` gives them (a placement policy
        or member list, as at creation); returns the slabs moved (pooltensor/pool/migrate.py).
        Not under SPMD."""
        self._check()
        return self._a.pool.mover.migrate(self, placement)

    def to_numpy(self, copy=None):
        """The elements as a numpy array.

        A view inside one slab of this member's own memory comes back without a copy (a
        numpy view of pool memory, read-only when the array is) unless copy=True; anything
        else is copied. copy=False raises ValueError when a copy cannot be avoided.
        MaterializeTooLarge above the pool's materialize_limit."""
        self._check()
        pool = self._a.pool
        if self.nbytes > pool.materialize_limit:
            raise MaterializeTooLarge(
                f"to_numpy() of {self.nbytes} bytes is over the limit of "
                f"{pool.materialize_limit} bytes (pooltensor.init(materialize_limit=...)); "
                f"index a smaller part, or iterate with x.blocks()")
        if copy is not True:
            view = self._local_view()
            if view is not None:
                return view
            if copy is False:
                raise ValueError("Unable to avoid copy while creating an array as requested: "
                                 "the selection is not inside one local slab")
        out = np.empty(self._shape, self._dtype)
        return transfer.read(pool, self._a, self._off, self._shape, self._strides,
                             self._dtype, out)

    def _local_view(self, mapped=False):
        """A zero-copy numpy view when this view lies inside one slab homed here (with
        mapped: or homed by a member on this machine whose memory a plain script has
        mapped, attach=True), else None."""
        a = self._a
        pool = a.pool
        if self.size == 0:
            return None
        S = pool.slab_size
        lo, hi = layout.extent(self._off, self._shape, self._strides, self.itemsize)
        k = lo // S
        if (hi - 1) // S != k:
            return None
        if a.members[k] == pool.me:
            base = pool.local[a.heap]
        elif mapped and pool.mapped and not pool.coherent:
            key = (a.heap, a.members[k])
            base = pool.mapped.get(key) if a.heap == "ro" else pool.mapped_w.get(key)
            if base is None:
                return None
        else:
            return None
        off = a.slots[k] * S + (self._off - k * S)
        arr = np.ndarray(self._shape, self._dtype, buffer=base, offset=off,
                         strides=self._strides)
        if a.access == "readonly":
            arr.flags.writeable = False
        elif a.heap == "rw" and pool.coherent and a.members[k] == pool.me:
            from ..pool.allocation import _Export
            owner = _Export(arr)
            pool.note_export(a.slots[k], owner)
            arr = np.asarray(owner)
        out = np.asarray(_Held(arr, a))
        # the array interface spells ml_dtypes' types (bfloat16, ...) as raw bytes ('<V2')
        return out if out.dtype == self._dtype else out.view(self._dtype)

    def __array__(self, dtype=None, copy=None):
        arr = self.to_numpy(copy=copy)
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError("Unable to avoid copy while creating an array as requested.")
            arr = arr.astype(dtype)
        return arr

    def tolist(self):
        """The elements as nested Python lists (like numpy's tolist)."""
        return self.to_numpy().tolist()

    def item(self, *args):
        """One element as a Python scalar: item() for size 1, item(flat_index), item(i, j)."""
        if not args:
            if self.size != 1:
                raise ValueError("can only convert an array of size 1 to a Python scalar")
            return self[(0,) * self.ndim].item()
        if len(args) == 1 and not isinstance(args[0], tuple):
            i = int(args[0])
            if not -self.size <= i < self.size:
                raise IndexError(f"index {i} is out of bounds for size {self.size}")
            return self[np.unravel_index(i % self.size, self._shape)].item()
        idx = args[0] if len(args) == 1 else args
        if len(idx) != self.ndim:
            raise ValueError("incorrect number of indices for array")
        return self[tuple(int(i) for i in idx)].item()

    def __iter__(self):
        if not self._shape:
            raise TypeError("iteration over a 0-d array")
        for i in range(self._shape[0]):
            yield self[i]

    # -- writing ---------------------------------------------------------------------------
    @staticmethod
    def _copy_on_servers(target, idx, value):
        """x[idx] = y (y a pool array) made by the memory servers that hold x's slabs: True
        when they did it. The ops room binds the real one (ops/methods.py); this room cannot
        import it."""
        return False

    def __setitem__(self, index, value):
        self._check()
        a = self._a
        if a.access == "readonly":
            raise ValueError("assignment destination is read-only")
        idx = _as_index(index)
        if isinstance(value, ndarray):
            if value._a is a and indexing.is_basic(idx):
                d, shape, strides = indexing.basic(self._shape, self._strides, self._dtype,
                                                   idx)
                if (value._off, value._shape, value._strides) == (self._off + d, shape,
                                                                  strides):
                    return      # x[i] += y: the in-place result is already there
            if indexing.is_basic(idx) and self._copy_on_servers(self, idx, value):
                return          # memory servers copied it, slab by slab (ops/shape.py)
            if value.nbytes > CHUNK and indexing.is_basic(idx):
                return self._assign_chunked(idx, value)
            value = value.to_numpy()
        if indexing.is_basic(idx):
            d, shape, strides = indexing.basic(self._shape, self._strides, self._dtype, idx)
            if isinstance(value, np.ndarray) and value.shape == shape and \
                    value.dtype == self._dtype:
                val = value
            else:
                val = np.empty(shape, self._dtype)
                val[...] = value                       # numpy's broadcasting and casting
            transfer.write(a.pool, a, self._off + d, shape, strides, self._dtype, val)
            return
        offs = indexing.advanced(self._shape, self._strides, idx)
        offs = np.asarray(offs, np.int64)
        vals = np.empty(offs.shape, self._dtype)
        vals[...] = value
        transfer.scatter(a.pool, a, offs + self._off, self._dtype, vals)

    def _assign_chunked(self, idx, value):
        """x[idx] = y for a big pool array y: copied a chunk of rows at a time (never the
        whole of y in this process's memory)."""
        d, shape, strides = indexing.basic(self._shape, self._strides, self._dtype, idx)
        dst = ndarray(self._a, self._off + d, shape, strides, self._dtype)
        if value.shape != shape or not shape:
            dst[...] = value.to_numpy()       # broadcasting: numpy's rules on a numpy value
            return
        rows = max(1, CHUNK // max(1, value.nbytes // shape[0]))
        for i in range(0, shape[0], rows):
            dst[i:i + rows] = value[i:i + rows].to_numpy()

    def fill(self, value):
        """Set every element to `value`."""
        self[...] = value

    # -- access hints and streaming ---------------------------------------------------------
    def prefetch(self, index=Ellipsis):
        """Start fetching the remote slabs x[index] touches; returns the number issued."""
        self._check()
        a = self._a
        pool = a.pool
        idx = _as_index(index)
        if indexing.is_basic(idx):
            d, shape, strides = indexing.basic(self._shape, self._strides, self._dtype, idx)
            ks = layout.slabs_of(self._off + d, shape, strides, self.itemsize,
                                   pool.slab_size)
        else:
            offs = np.asarray(indexing.advanced(self._shape, self._strides, idx)) + self._off
            ks = np.unique(offs // pool.slab_size).tolist()
        return prefetch.issue_many(pool, a, ks)

    def blocks(self, with_index=False, depth=None):
        """Iterate over slab-aligned blocks of the elements, in C order, as read-only numpy
        arrays, with the next blocks' slabs already in flight.

        A C-contiguous array yields one 1-D block per slab (zero-copy: a view of local
        memory or of the pinned cache frame, valid as long as you keep it); other views are
        copied in chunks of about a slab. with_index=True yields (first flat index, block).
        depth: slabs kept in flight ahead (default: the prefetcher's limit)."""
        self._check()
        pool = self._a.pool
        depth = prefetch.limit(pool) if depth is None else int(depth)
        if layout.contiguous(self._shape, self._strides, self.itemsize):
            gen = self._contig_blocks(depth)
        else:
            gen = self._chunk_blocks(depth)
        for start, blk in gen:
            yield (start, blk) if with_index else blk

    def _contig_blocks(self, depth):
        """One block per slab. A remote block is a pinned view of its cache frame; once the
        loop moves on, that entry goes to the front of the LRU (drop-behind), so a long scan
        recycles a few frames that stay in the CPU caches instead of sweeping all of them."""
        a = self._a
        pool = a.pool
        S = pool.slab_size
        it = self.itemsize
        if self.size == 0:
            return
        lo, hi = self._off, self._off + self.nbytes
        k0, k1 = lo // S, (hi - 1) // S
        cache = pool.cache
        issued = k0
        behind = None
        for k in range(k0, k1 + 1):
            if pool.pending:                    # a member was lost: repoint first
                pool.keeper.apply()
            if depth:
                stop = min(k1, k + depth)
                while issued < stop:
                    issued += 1
                    prefetch.issue(pool, a, issued)
            b0, b1 = max(lo, k * S), min(hi, (k + 1) * S)
            mapped = pool.mapped.get((a.heap, a.members[k])) if pool.mapped else None
            if a.members[k] == pool.me or mapped is not None:
                if mapped is None:
                    buf = pool.local[a.heap][a.slots[k] * S:(a.slots[k] + 1) * S]
                else:
                    buf = mapped[a.slots[k] * S:(a.slots[k] + 1) * S]
                    cache.direct += 1
                blk = buf[b0 - k * S:b1 - k * S].view(self._dtype)
                blk.flags.writeable = False
                e = None
            else:
                if a.pf is None:
                    a.pf = prefetch.Stream()
                a.pf.last = k                   # explicit streaming: the detector stays out
                e = transfer.slab_entry(pool, a, k)
                blk = cache.export(e, e.frame[b0 - k * S:b1 - k * S].view(self._dtype))
            if behind is not None and behind.attached:
                cache.entries.move_to_end(behind.key, last=False)
            behind = e
            yield (b0 - lo) // it, blk

    def _chunk_blocks(self, depth):
        """Blocks of a non-contiguous view: copies of about a slab of elements each, taken
        along the first axis (recursing into a row when one row is bigger than a slab)."""
        if self.size == 0:
            return
        if self.ndim == 0:
            yield 0, np.asarray(self.to_numpy(copy=True)).reshape(1)
            return
        pool = self._a.pool
        n0 = self._shape[0]
        per_row = self.size // n0
        row = per_row * self.itemsize
        if row > pool.slab_size and self.ndim > 1:
            for i in range(n0):
                for s, blk in self[i].blocks(True, depth):
                    yield i * per_row + s, blk
            return
        rows = max(1, pool.slab_size // max(1, row))
        for i in range(0, n0, rows):
            if depth and i + rows < n0:
                self.prefetch(slice(i + rows, i + 2 * rows))    # the next chunk's slabs
            part = self[i:i + rows].to_numpy(copy=True).reshape(-1)
            part.flags.writeable = False
            yield i * per_row, part

    # -- numpy protocols; the operations on arrays are bound by the ops room (ops/methods.py)
    def __pow__(self, other):
        # numpy's ndarray ** 2 is np.square (bool ** 2 is then int8, not power's int64)
        if type(other) is int and other == 2:
            return np.square(self)
        return NDArrayOperatorsMixin.__pow__(self, other)

    # -- printing --------------------------------------------------------------------------
    def _summary(self):
        """A small numpy array that prints like this array (fetches only what is printed).

        An axis longer than 2*edgeitems is cut to its first and last edgeitems plus one
        dummy in the middle: numpy then summarizes it and never prints the dummy."""
        opts = np.get_printoptions()
        if self.size <= opts["threshold"]:
            return self.to_numpy(copy=True), opts["threshold"]
        e = opts["edgeitems"]
        lists = []
        for n in self._shape:
            if n > 2 * e:
                lists.append(list(range(e)) + [e - 1] + list(range(n - e, n)))
            else:
                lists.append(list(range(n)))
        small = self[np.ix_(*lists)] if self.ndim else self.to_numpy(copy=True)
        return np.asarray(small), 0

    def __repr__(self):
        if self._a.pool.closed:
            return f"<pooltensor.ndarray shape={self._shape} dtype={self._dtype} (pool closed)>"
        prefix = "pooltensor.ndarray("
        extras = []
        if self.size == 0:
            body = "[]"
            if self._shape != (0,):
                extras.append(f"shape={self._shape}")
        else:
            arr, threshold = self._summary()
            body = np.array2string(arr, separator=", ", prefix=prefix, threshold=threshold)
            if self.size > np.get_printoptions()["threshold"]:
                extras.append(f"shape={self._shape}")          # as numpy >= 2.2 does
        if self._dtype not in _IMPLIED or self.size == 0:
            extras.append(f"dtype={self._dtype.name}")
        return prefix + body + "".join(", " + e for e in extras) + ")"

    def __str__(self):
        if self._a.pool.closed:
            return repr(self)
        arr, threshold = self._summary()
        return np.array2string(arr, threshold=threshold)

    def __bool__(self):
        return bool(self._as_numpy_scalar())

    def _as_numpy_scalar(self):
        """A numpy array standing in for this one in a conversion to a Python scalar: the
        same dtype, ndim and size class (0, 1 or more elements) and, when it has one
        element, that element; so float(), int(), complex() and operator.index() raise,
        warn or convert exactly as the installed numpy does (numpy 2: only 0-d arrays), and
        bool() too (an empty array, more than one element)."""
        if self.size == 1:
            return np.full(self._shape, self.item(), self._dtype)
        if self.size == 0:
            return np.empty(self._shape, self._dtype)
        return np.zeros((2,) + (1,) * (self.ndim - 1), self._dtype)

    def __float__(self):
        return float(self._as_numpy_scalar())

    def __int__(self):
        return int(self._as_numpy_scalar())

    def __complex__(self):
        return complex(self._as_numpy_scalar())

    def __index__(self):
        if self.ndim or self._dtype.kind not in "iub":    # refused before any read
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return operator.index(self._as_numpy_scalar())
