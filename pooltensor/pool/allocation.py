"""What an allocation is: the slabs holding one array's bytes, the access modes, the sizes
the pool starts from.

A global address is (heap, member, slot): every member keeps one heap per access mode, each
cut into slabs of ``slab_size`` bytes, and an array's bytes are a list of slabs (its
``Allocation``), possibly on several members. Array byte b lives in slab b // slab_size of the
allocation, at b % slab_size inside it. Kept apart from pool.py so that what names an
allocation (views, Dask handles, the tensor store) needs none of the pool's machinery.
"""
import operator
import os

import numpy as np

ACCESS = {"readwrite": "rw", "readonly": "ro", "private": "pv"}
MODE_NAME = {v: k for k, v in ACCESS.items()}

# Default slab size: 1 MiB, from the slab size sweep of `python bench/pool.py` ("(d)": a
# remote array streamed with blocks(), two members on a shared 2-core VM, three runs).
# blocks()+sum against numpy: 64 KiB 0.15-0.29x, 256 KiB 0.22-0.55x, 1 MiB 0.42-0.60x,
# 2 MiB 0.41-0.44x, 4 MiB 0.19-0.40x, 8 MiB 0.35-0.38x. Below 1 MiB the per-slab Python work
# (~15 us: lookup, prefetch issue, pin) is a large share of each slab's copy; above 2 MiB a
# slab no longer fits the CPU caches on its way through (one Window.get: 45 GB/s from 256 KiB
# to 4 MiB, 30 GB/s at 8 MiB) and fewer frames fit the cache budget. A scalar read that
# misses moves one slab: 4 us at 64 KiB, 28 us at 1 MiB, 95 us at 4 MiB. 1 MiB is the
# smallest size at the top of the plateau: the cheapest miss there and the least waste in
# a small array's last slab.
DEFAULT_SLAB = 1 << 20
DEFAULT_MATERIALIZE = 4 << 30     # to_numpy() refuses above this (bytes)
DEFAULT_ADVANCED = 64 << 20       # advanced indexing returns numpy up to this, a pool array above
MAX_BYTES = int(np.iinfo(np.intp).max)    # numpy's own bound on an array's bytes
TOO_BIG = ("array is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum "
           "possible size.")


def physical_memory():
    """Bytes of RAM on this machine."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def check_slab_size(slab_size):
    """slab_size as an int: TypeError if it is not an integer, ValueError unless a positive
    multiple of 64."""
    try:
        s = operator.index(slab_size)
    except TypeError as e:
        raise TypeError(f"slab_size: {e}") from None
    if s < 64 or s % 64:
        raise ValueError(f"slab_size must be a positive multiple of 64 bytes, not {slab_size}")
    return s


class Allocation:
    """The slabs holding one array's bytes; every view of the array shares it."""

    __slots__ = ("pool", "id", "nbytes", "heap", "members", "slots", "pf", "memo", "slab",
                 "version", "copies", "lost", "partition", "__weakref__")

    def __init__(self, pool, aid, nbytes, heap, members, slots):
        self.pool, self.id, self.nbytes, self.heap = pool, aid, nbytes, heap
        self.members, self.slots = members, slots      # per slab, as Python lists
        self.pf = None                                  # the prefetcher's state, made on use
        self.memo = {}                       # x[i]: slab -> typed view and owner (array.py)
        self.slab = pool.slab_size
        self.version = 0        # bumped by every write this process makes or is told of
        self.copies = None      # replicated: per slab, [(member, slot)] of its live copies
        self.lost = None        # slab -> member: slabs whose every copy was lost (replicas.py)
        self.partition = None   # the partition its bytes count against (partitions.py)

    @property
    def access(self):
        return MODE_NAME.get(self.heap, "readonly")     # kept<N>: a store's (store/kept.py)

    def slab_len(self, k):
        """Bytes of slab k that belong to the array (the last slab may be partly used)."""
        return min(self.pool.slab_size, self.nbytes - k * self.pool.slab_size)


class _Export:
    """Owner of a writeable zero-copy numpy view of local rw memory (so sync() can tell
    the other ranks that those slabs may have changed while the view lives)."""

    __slots__ = ("__array_interface__", "_keep", "__weakref__")

    def __init__(self, arr):
        self.__array_interface__ = arr.__array_interface__
        self._keep = arr
