"""pooltensor: the global pool and the distributed array (built on collectives).

    import pooltensor as pt
    pool = pt.init(members=3)            # a plain script: 2 member processes + this one
    x = pt.zeros((1000, 1000))           # slabs spread over the members ("block" placement)
    x[10:20, ::3] = 1.0                  # one-sided writes, element-precise
    y = x[5:15].to_numpy()               # faulted in through the slab cache
    for block in x.blocks(): ...         # streamed, next slabs prefetched
    pt.finalize()                        # also at exit

Under mpiexec or ``python -m collectives.launch`` every rank is a member (SPMD): creation is
collective, indexing is one-sided, and ``pt.sync()`` makes every write visible everywhere.
"""
__version__ = "0.1.0"

from . import random  # noqa: E402
from .array import ndarray  # noqa: E402
from .creation import (arange, asarray, empty, from_numpy, full, linspace, ones,  # noqa: E402
                       zeros)
from .errors import MaterializeTooLarge, PoolClosed, PoolOutOfMemory  # noqa: E402
from .pool import Pool  # noqa: E402
from .runtime import current, finalize, init, sync  # noqa: E402


def stats():
    """The pool's usage per member, fragmentation and cache counters (see Pool.stats)."""
    return current().stats()


__all__ = ["init", "finalize", "sync", "current", "stats", "Pool", "ndarray", "zeros", "ones",
           "empty", "full", "arange", "linspace", "asarray", "from_numpy", "random",
           "PoolOutOfMemory", "PoolClosed", "MaterializeTooLarge"]
