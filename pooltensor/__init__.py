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
from .array.creation import (arange, asarray, empty, from_numpy, full, linspace, ones,  # noqa: E402
                       zeros)
from .errors import (FallbackWarning, MaterializeTooLarge, PerformanceWarning,  # noqa: E402
                     PoolClosed, PoolOutOfMemory)
from .pool import Pool, placement  # noqa: E402
from .pool.runtime import current, finalize, init, sync  # noqa: E402

# -- the Array API namespace (x.__array_namespace__() is this module) ---------------------------
from .ops import namespace as _ns  # noqa: E402
from .ops.namespace import API_VERSIONS, __array_api_version__  # noqa: E402

for _name in _ns.DTYPES + _ns.CONSTANTS + _ns.ELEMENTWISE + _ns.DTYPE_FUNCTIONS + _ns.CREATION:
    globals()[_name] = getattr(_ns, _name)

# -- reductions, linear algebra and shape functions (ops/reductions.py, linalg.py, shape.py) ----
from .ops.blocks import map_blocks  # noqa: E402
from .ops.linalg import dot, matmul  # noqa: E402
from .ops.reductions import (all, any, argmax, argmin, max, mean, min, prod, std, sum,  # noqa: E402
                         var)
from .ops.shape import (concat, concatenate, expand_dims, matrix_transpose, moveaxis,  # noqa: E402
                    permute_dims, ravel, reshape, squeeze, stack, swapaxes, transpose)

_OPS = ["sum", "prod", "mean", "std", "var", "min", "max", "argmin", "argmax", "any", "all",
        "matmul", "dot", "reshape", "ravel", "transpose", "permute_dims", "matrix_transpose",
        "swapaxes", "moveaxis", "squeeze", "expand_dims", "concatenate", "concat", "stack",
        "map_blocks"]

# -- the ndarray's methods that compute, and its __array_namespace__ (this module) -------------
from .ops import methods as _methods  # noqa: E402

_methods.bind(ndarray, _sys.modules[__name__])


def stats():
    """The pool's usage per member, fragmentation and cache counters (see Pool.stats)."""
    return current().stats()


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


__all__ = ["init", "finalize", "sync", "current", "stats", "Pool", "ndarray", "zeros", "ones",
           "empty", "full", "arange", "linspace", "asarray", "from_numpy", "from_jax", "random",
           "PoolOutOfMemory", "PoolClosed", "MaterializeTooLarge", "FallbackWarning",
           "PerformanceWarning", "__array_api_version__"]
__all__ += _ns.DTYPES + _ns.CONSTANTS + _ns.ELEMENTWISE + _ns.DTYPE_FUNCTIONS + _ns.CREATION
__all__ += _OPS

# Module paths users wrote before the package was cut into rooms keep importing.
_sys.modules.setdefault(__name__ + ".placement", placement)
_sys.modules.setdefault(__name__ + ".random", random)
