"""pooltensor: the global pool and the distributed array (built on collectives).

    import pooltensor as pt
    pool = pt.init(members=3)            # a plain script: 2 member processes + this one
    x = pt.zeros((1000, 1000))           # slabs spread over the members ("block" placement)
    x[10:20, ::3] = 1.0                  # one-sided writes, element-precise
    y = x[5:15].to_numpy()               # faulted in through the slab cache
    for block in x.blocks(): ...         # streamed, next slabs prefetched
    z = np.sin(x) * 2 + x                # numpy's ufuncs and operators: pool arrays, blockwise
    pt.finalize()                        # also at exit

Under mpiexec or ``python -m collectives.launch`` every rank is a member (SPMD): creation is
collective, indexing is one-sided, and ``pt.sync()`` makes every write visible everywhere.
Operations on pool arrays are collective too: each rank computes the slabs it homes.
This module is also the Array API namespace of pool arrays (``x.__array_namespace__()``).
"""
__version__ = "0.1.0"

import sys as _sys  # noqa: E402

from .array import random  # noqa: E402
from .array.array import ndarray  # noqa: E402
from .array.creation import from_numpy  # noqa: E402
from .errors import (FallbackWarning, MaterializeTooLarge, PerformanceWarning,  # noqa: E402
                     PoolClosed, PoolOutOfMemory)
from .pool import Pool, placement  # noqa: E402
from .pool.runtime import current, finalize, init, sync  # noqa: E402

# -- the Array API namespace (x.__array_namespace__() is this module) ---------------------------
from .ops import namespace as _ns  # noqa: E402
from .ops.namespace import API_VERSIONS, __array_api_version__  # noqa: E402

for _name in _ns.DTYPES + _ns.CONSTANTS + _ns.ELEMENTWISE + _ns.DTYPE_FUNCTIONS:
    globals()[_name] = getattr(_ns, _name)

# creation with the standard's signatures (device=, copy=, default dtypes), inspection
from .ops.api_creation import (arange, asarray, empty, empty_like, eye, from_dlpack,  # noqa: E402
                               full, full_like, linspace, meshgrid, ones, ones_like, tril,
                               triu, zeros, zeros_like)
from .ops.api_info import POOL, __array_namespace_info__  # noqa: E402

_CREATION = ["arange", "asarray", "empty", "empty_like", "eye", "from_dlpack", "full",
             "full_like", "linspace", "meshgrid", "ones", "ones_like", "tril", "triu", "zeros",
             "zeros_like"]

# -- statistics, searching, sorting, sets (ops/api_stats.py, sorting.py, scans.py) ------------
from .ops.api_stats import (all, any, argmax, argmin, argsort, count_nonzero,  # noqa: E402
                            cumulative_prod, cumulative_sum, diff, max, mean, min, nonzero,
                            prod, searchsorted, sort, std, sum, unique_all, unique_counts,
                            unique_inverse, unique_values, var)
# -- manipulation and indexing (ops/api_manip.py), shape functions (ops/shape.py) -------------
from .ops.api_manip import (broadcast_arrays, broadcast_to, concat, expand_dims,  # noqa: E402
                            flip, moveaxis, permute_dims, repeat, reshape, roll, squeeze,
                            stack, take, take_along_axis, tile, unstack)
from .ops.blocks import map_blocks  # noqa: E402
from .ops.products import dot  # noqa: E402
from .ops.shape import concatenate, ravel, swapaxes, transpose  # noqa: E402
# -- the extensions: pooltensor.linalg and pooltensor.fft ------------------------------------
from . import fft, linalg  # noqa: E402
from .linalg import matmul, matrix_transpose, tensordot, vecdot  # noqa: E402

_OPS = ["sum", "prod", "mean", "std", "var", "min", "max", "argmin", "argmax", "any", "all",
        "count_nonzero", "cumulative_sum", "cumulative_prod", "diff", "sort", "argsort",
        "unique_all", "unique_counts", "unique_inverse", "unique_values", "searchsorted",
        "nonzero", "matmul", "dot", "tensordot", "vecdot", "reshape", "ravel", "transpose",
        "permute_dims", "matrix_transpose", "swapaxes", "moveaxis", "squeeze", "expand_dims",
        "concatenate", "concat", "stack", "broadcast_arrays", "broadcast_to", "flip",
        "repeat", "roll", "take", "take_along_axis", "tile", "unstack", "map_blocks",
        "linalg", "fft"]

# -- the ndarray's methods that compute, and its __array_namespace__ (this module) -------------
from .ops import methods as _methods  # noqa: E402

_methods.bind(ndarray, _sys.modules[__name__])


def from_dask(d, placement=None, like=None):
    """A pool array with the values of dask array `d`, each chunk written by the Dask worker
    that computed it (see pooltensor.dask.from_dask; needs pooltensor.dask.attach())."""
    from .dask import from_dask as _from_dask
    return _from_dask(d, placement=placement, like=like)


def _to_dask(self, chunk_bytes=None):
    """This array as a dask.array.Array whose chunks are pinned to the Dask workers homing
    their slabs (see pooltensor.dask.to_dask; needs pooltensor.dask.attach())."""
    from .dask import to_dask
    return to_dask(self, chunk_bytes)


ndarray.to_dask = _to_dask


def stats(per_peer=False, plot=None):
    """The pool at a glance, as a dict: usage and share of each member, fragmentation, the
    cache's hit rate and prefetch accuracy, the replicas (lost members, under-replicated
    slabs, restore progress), and the transfers' latency percentiles per
    transport and operation, bandwidth over the last interval and each peer's health (with
    per_peer=True, latency per peer too). README.md, "Stats", describes every field.
    plot: a path; the pool is also drawn there as a PNG (members' usage, latency
    histograms; matplotlib)."""
    s = current().stats(per_peer=per_peer)
    s["stores"] = store.stats(current())
    if plot is not None:
        from . import report
        report.plot_stats(s, current().world.counters()[0], plot)
    return s


def lost():
    """What went with members that were lost: one dict per array (allocation) that had a slab
    with no surviving copy (see Pool.lost)."""
    return current().lost()


# -- the tensor store (pooltensor/store/) ---------------------------------------------------
from . import store  # noqa: E402

# -- JAX (pooltensor/jax.py; jax is imported on first use, not with pooltensor) ----------------
def _to_jax(self, sharding=None):
    """This array as a jax.Array whose shards are zero-copy views of its slabs where possible;
    a later write to this array shows through it (see pooltensor.jax)."""
    from . import jax as _jax
    return _jax.to_jax(self, sharding)


ndarray.to_jax = _to_jax


def from_jax(a, *, placement=None, access=None):
    """A new pool array holding a copy of the jax.Array a (pooltensor.asarray does the same)."""
    from . import jax as _jax
    return _jax.from_jax(a, placement=placement, access=access)


__all__ = ["init", "finalize", "sync", "current", "stats", "lost", "store", "from_dask", "Pool", "ndarray",
           "from_numpy", "from_jax", "random", "PoolOutOfMemory", "PoolClosed",
           "MaterializeTooLarge", "FallbackWarning", "PerformanceWarning", "__array_api_version__",
           "__array_namespace_info__", "POOL"]
__all__ += _ns.DTYPES + _ns.CONSTANTS + _ns.ELEMENTWISE + _ns.DTYPE_FUNCTIONS + _CREATION
__all__ += _OPS

# Module paths users wrote before the package was cut into rooms keep importing.
_sys.modules.setdefault(__name__ + ".placement", placement)
_sys.modules.setdefault(__name__ + ".random", random)
