"""The ndarray's methods that compute, bound to the class in one place.

Why: an ndarray (array room) is data and addressing; everything that computes on it lives in
this room, above it. The class therefore defines no method that needs an op, and the package's
namespace (``pooltensor/__init__.py``) calls ``bind(ndarray, namespace)`` once at import time:
the methods below become the ndarray's, and ``x.__array_namespace__()`` returns the namespace.
So no module of the array room imports an op, and no op needs a lazy import of the ndarray.
"""
import numpy as np

from . import api_info, api_special, dispatch, namespace, products, reductions, ufuncs
from . import shape as _shape
from .api_info import API_VERSIONS

_bound = {}


class Methods:
    """The methods bind() gives the ndarray (numpy's names and signatures)."""

    # -- numpy protocols and elementwise operations (ufuncs.py, dispatch.py) ------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return ufuncs.array_ufunc(self, ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return dispatch.array_function(self, func, types, args, kwargs)

    _copy_on_servers = staticmethod(_shape.set_on_servers)    # x[...] = y on servers

    def __array_namespace__(self, *, api_version=None):
        """The Array API namespace of pool arrays: the pooltensor module."""
        if api_version is not None and api_version not in API_VERSIONS:
            raise ValueError(f"unsupported Array API version {api_version!r}; supported: "
                             f"{', '.join(API_VERSIONS)}")
        return _bound["namespace"]

    def astype(self, dtype, order="K", casting="unsafe", subok=True, copy=True):
        """The values cast to `dtype` as a new pool array (self if copy=False and the dtype
        matches); numpy's casting rules."""
        return ufuncs.astype(self, dtype, casting=casting, copy=copy)

    def copy(self, order="K"):
        """A new pool array with the same values (placed like this one)."""
        return ufuncs.copy(self)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    def clip(self, min=None, max=None, out=None, **kwargs):
        """Values limited to [min, max] (np.clip)."""
        return ufuncs.clip(self, min, max, out=out, **kwargs)

    def conj(self):
        """Complex conjugate, elementwise."""
        return np.conjugate(self)

    conjugate = conj

    @property
    def real(self):
        """The real part (a new pool array; the values themselves for real dtypes)."""
        return namespace.real(self)

    @property
    def imag(self):
        """The imaginary part (a new pool array; zeros for real dtypes)."""
        return namespace.imag(self)

    # -- reductions, linear algebra and shape (see reductions.py, products.py, shape.py) -------
    def sum(self, axis=None, dtype=None, out=None, keepdims=False, **kw):
        """Sum over the given axes (numpy.sum); numpy result when small, see reductions."""
        return reductions.sum(self, axis, dtype, out, keepdims, **kw)

    def prod(self, axis=None, dtype=None, out=None, keepdims=False, **kw):
        """Product over the given axes (numpy.prod)."""
        return reductions.prod(self, axis, dtype, out, keepdims, **kw)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False, **kw):
        """Arithmetic mean over the given axes (numpy.mean)."""
        return reductions.mean(self, axis, dtype, out, keepdims, **kw)

    def var(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kw):
        """Variance over the given axes (numpy.var)."""
        return reductions.var(self, axis, dtype, out, ddof, keepdims, **kw)

    def std(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False, **kw):
        """Standard deviation over the given axes (numpy.std)."""
        return reductions.std(self, axis, dtype, out, ddof, keepdims, **kw)

    def min(self, axis=None, out=None, keepdims=False, **kw):
        """Minimum over the given axes (numpy.min)."""
        return reductions.min(self, axis, out, keepdims, **kw)

    def max(self, axis=None, out=None, keepdims=False, **kw):
        """Maximum over the given axes (numpy.max)."""
        return reductions.max(self, axis, out, keepdims, **kw)

    def argmin(self, axis=None, out=None, *, keepdims=False):
        """Index of the first minimum (numpy.argmin)."""
        return reductions.argmin(self, axis, out, keepdims=keepdims)

    def argmax(self, axis=None, out=None, *, keepdims=False):
        """Index of the first maximum (numpy.argmax)."""
        return reductions.argmax(self, axis, out, keepdims=keepdims)

    def any(self, axis=None, out=None, keepdims=False, **kw):
        """Whether any element is true over the given axes (numpy.any)."""
        return reductions.any(self, axis, out, keepdims, **kw)

    def all(self, axis=None, out=None, keepdims=False, **kw):
        """Whether every element is true over the given axes (numpy.all)."""
        return reductions.all(self, axis, out, keepdims, **kw)

    def reshape(self, *shape, order="C", copy=None):
        """The elements in a new shape: a view when the layout allows, else a copy."""
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        return _shape.reshape(self, shape, order=order, copy=copy)

    def ravel(self, order="C"):
        """The elements as a 1-D array (a view when possible)."""
        return _shape.ravel(self, order)

    def flatten(self, order="C"):
        """A 1-D copy of the elements."""
        return _shape.flatten(self, order)

    def transpose(self, *axes):
        """The axes permuted (reversed when none are given): a view."""
        if len(axes) == 1 and (axes[0] is None or not isinstance(axes[0], (int, np.integer))):
            axes = axes[0]
        return _shape.transpose(self, axes or None)

    def swapaxes(self, axis1, axis2):
        """Two axes interchanged: a view."""
        return _shape.swapaxes(self, axis1, axis2)

    def squeeze(self, axis=None):
        """Length-one axes removed: a view."""
        return _shape.squeeze(self, axis)

    def dot(self, b, out=None):
        """Matrix product with b (numpy.dot)."""
        return products.dot(self, b, out=out)

    def __matmul__(self, other):
        return products.matmul(self, other)

    def __rmatmul__(self, other):
        return products.matmul(other, self)


def bind(cls, namespace_module):
    """Give `cls` (the pool ndarray) the methods above; its Array API namespace is
    `namespace_module` (the pooltensor package)."""
    _bound["namespace"] = namespace_module
    for methods in (Methods, api_info.ArrayMethods, api_special.FloorOperators):
        for name, value in vars(methods).items():
            if name not in ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__"):
                setattr(cls, name, value)
