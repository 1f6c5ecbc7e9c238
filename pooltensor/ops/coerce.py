"""What the Array API namespace takes and gives: any array in, pool arrays out.

Why: a namespace whose functions return numpy arrays or numpy scalars for small results, and
then refuse them as arguments, breaks ``xp.f(xp.g(x))``. So every namespace function
(pooltensor's Array API names) goes through ``api``:

- in: pool arrays as they are; numpy arrays and numpy scalars become pool arrays (``small``);
  Python scalars stay Python scalars (the standard's weak scalars), and so do dtypes, axes
  and other non-array arguments;
- out: a numpy array or numpy scalar result becomes a pool array too, so the namespace of
  every result is pooltensor.

How small results are held: as pool arrays in this process's own memory. In a plain script
that is member 0's memory (``placement="local"``, readable and writable by the members like
any pool memory); under SPMD each rank holds its own private copy (``access="private"``: no
collective call, no agreement round), which is the same bytes on every rank since the results
that come back small (reductions, small gathers) are computed alike everywhere. A private
array used in a whole-array operation with shared ones is read by each rank from its own copy.
"""
import functools

import numpy as np

from ..array.array import ndarray
from ..array.creation import empty, from_numpy
from ..pool.runtime import current


def small(arr, dtype=None):
    """numpy data (array, scalar, anything np.asarray takes) as a pool array held by this
    process (see the module's docstring)."""
    arr = np.asarray(arr, dtype=dtype)
    pool = current()
    if pool.spmd:
        return from_numpy(arr, access="private")
    return from_numpy(arr, placement="local")


def empty_small(shape, dtype):
    """A new uninitialized pool array held by this process, as small() holds its copies."""
    if current().spmd:
        return empty(shape, dtype, access="private")
    return empty(shape, dtype, placement="local")


def arg(v):
    """An argument as the namespace takes it: numpy arrays and numpy scalars become pool
    arrays; pool arrays, Python scalars and everything else as they are."""
    if isinstance(v, (np.ndarray, np.generic)) and not isinstance(v, np.dtype):
        return small(v)
    return v


def array(v, dtype=None):
    """An argument that must be an array: pool arrays as they are, anything else (numpy
    arrays and scalars, Python scalars, nested sequences) copied into a small pool array."""
    if isinstance(v, ndarray):
        return v
    return small(v, dtype)


def own(v):
    """A result as the namespace gives it: numpy arrays and scalars become pool arrays, in
    tuples and lists too; everything else as it is."""
    if isinstance(v, ndarray):
        return v
    if isinstance(v, (np.ndarray, np.generic)):
        return small(v)
    if isinstance(v, tuple) and type(v) is not tuple:          # namedtuple results
        return type(v)(*[own(e) for e in v])
    if isinstance(v, (tuple, list)):
        return type(v)(own(e) for e in v)
    return v


def api(fn):
    """Decorator for a namespace function: arguments through arg() (sequences of arrays too),
    the result through own()."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args = [[arg(e) for e in a] if isinstance(a, (list, tuple)) and a and
                isinstance(a[0], (np.ndarray, np.generic, ndarray)) else arg(a) for a in args]
        kwargs = {k: arg(v) for k, v in kwargs.items()}
        return own(fn(*args, **kwargs))
    return wrapper
