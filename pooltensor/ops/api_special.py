"""Where the Array API's special cases and numpy's differ, the namespace follows the standard.

- floor_divide of floats (and the ``//`` operators of pool arrays): 2024.12 asks that an
  infinite dividend over a finite nonzero divisor give the signed infinity, and a finite one
  over an infinite divisor the signed zero, where numpy gives NaN and -1 or 0 (Python's
  float rules). numpy's result is computed blockwise, then those elements are replaced in
  a second blockwise pass.
- expm1 of complex numbers with an infinite or NaN part: numpy's expm1 gives NaN + NaN j;
  the standard's values are those of exp(z) - 1, used for those elements.

``np.floor_divide(x, y)`` and ``np.expm1(x)`` on pool arrays (NEP-13) keep numpy's results.
"""
import numpy as np

from . import blocks, coerce, ufuncs


class _FloorFix:
    """r with the standard's special cases of floor division a // b put in (floats)."""

    def __call__(self, r, a, b):
        r = np.array(r, copy=True)
        a, b = np.broadcast_to(a, r.shape), np.broadcast_to(b, r.shape)
        with np.errstate(all="ignore"):
            m = (np.isinf(a) & np.isfinite(b) & (b != 0)) | (np.isfinite(a) & np.isinf(b))
            if m.any():
                r[m] = (a[m] / b[m]).astype(r.dtype)
        return r


class _Expm1Fix:
    """r with exp(z) - 1 where z has an infinite or NaN part (complex)."""

    def __call__(self, r, z):
        r = np.array(r, copy=True)
        z = np.broadcast_to(z, r.shape)
        m = ~np.isfinite(z)
        if m.any():
            with np.errstate(all="ignore"):
                r[m] = np.exp(z[m]) - 1
        return r


def floor_divide(x1, x2, /):
    """x1 // x2 elementwise, rounding towards negative infinity, with the standard's special
    cases for infinite operands (see the module)."""
    x1, x2 = coerce.arg(x1), coerce.arg(x2)
    r = ufuncs.apply(np.floor_divide, [x1, x2])
    if r.dtype.kind == "f" and r.size:
        blocks.map_into(_FloorFix(), r, r, x1, x2)
    return r


def expm1(x, /):
    """exp(x) - 1 elementwise, accurate near zero; the standard's values for complex inputs
    with infinite or NaN parts."""
    x = coerce.array(x)
    r = ufuncs.apply(np.expm1, [x])
    if r.dtype.kind == "c" and r.size:
        blocks.map_into(_Expm1Fix(), r, r, x)
    return r


class FloorOperators:
    """The ``//`` operators of pool arrays, by the standard's floor_divide."""

    def __floordiv__(self, other):
        return floor_divide(self, other)

    def __rfloordiv__(self, other):
        return floor_divide(other, self)

    def __ifloordiv__(self, other):
        r = floor_divide(self, other)
        if r.dtype != self.dtype and not np.can_cast(r.dtype, self.dtype, "same_kind"):
            raise TypeError(f"Cannot cast floor_divide output from {r.dtype} to {self.dtype}")
        self[...] = r
        return self
