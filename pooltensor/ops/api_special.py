"""Where the Array API's special cases and numpy's differ, the namespace follows the standard.

- floor_divide of floats (and the ``//`` operators of pool arrays): 2024.12 asks that an
  infinite dividend over a finite nonzero divisor give the signed infinity, and a finite one
  over an infinite divisor the signed zero, where numpy gives NaN and -1 or 0 (Python's
  float rules). numpy's result is computed blockwise, then those elements are replaced in
  a second blockwise pass.
- expm1 of complex numbers with an infinite or NaN part: numpy's expm1 gives NaN + NaN j;
  the standard's values are those of exp(z) - 1, used for those elements; and -0 + 0j
  gives 0 + 0j.
- tanh of complex numbers with an infinite real part and a finite imaginary one: the
  standard says +-1 + 0j with the zero signed as the imaginary part (tanh(conj z) = conj
  tanh z); numpy signs it as sin(2y).

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
    """r with exp(z) - 1 where z has an infinite or NaN part, and 0 + 0j at -0 + 0j
    (complex)."""

    def __call__(self, r, z):
        r = np.array(r, copy=True)
        z = np.broadcast_to(z, r.shape)
        m = ~np.isfinite(z)
        if m.any():
            with np.errstate(all="ignore"):
                r[m] = np.exp(z[m]) - 1
        zero = (z.real == 0) & (z.imag == 0) & ~np.signbit(z.imag)
        if zero.any():
            r[zero] = 0
        return r


class _TanhFix:
    """r with +-1 + (+-0)j where z = +-inf + yj, y finite (complex)."""

    def __call__(self, r, z):
        r = np.array(r, copy=True)
        z = np.broadcast_to(z, r.shape)
        m = np.isinf(z.real) & np.isfinite(z.imag)
        if m.any():
            r.real[m], r.imag[m] = np.sign(z.real[m]), np.copysign(0.0, z.imag[m])
        return r


def tanh(x, /):
    """The hyperbolic tangent elementwise; the standard's signed zero for complex inputs
    with an infinite real part."""
    x = coerce.array(x)
    r = ufuncs.apply(np.tanh, [x])
    if r.dtype.kind == "c" and r.size:
        blocks.map_into(_TanhFix(), r, r, x)
    return r


def floor_divide(x1, x2, /):
    """x1 // x2 elementwise, rounding towards negative infinity, with the standard's special
    cases for infinite operands (see the module)."""
    x1, x2 = coerce.arg(x1), coerce.arg(x2)
    floats = np.result_type(*[getattr(v, "dtype", v) for v in (x1, x2)]).kind in "fc"
    with np.errstate(invalid="ignore") if floats else np.errstate():
        r = ufuncs.apply(np.floor_divide, [x1, x2])   # the NaNs of inf // y are replaced
    if r.dtype.kind == "f" and r.size:
        blocks.map_into(_FloorFix(), r, r, x1, x2)
    return r


def expm1(x, /):
    """exp(x) - 1 elementwise, accurate near zero; the standard's values for complex inputs
    with infinite or NaN parts."""
    x = coerce.array(x)
    with np.errstate(invalid="ignore") if x.dtype.kind == "c" else np.errstate():
        r = ufuncs.apply(np.expm1, [x])      # the NaNs of non-finite inputs are replaced
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
        other = coerce.arg(other)
        shape = np.broadcast_shapes(self.shape, getattr(other, "shape", ()))
        if shape != self.shape:
            raise ValueError(f"non-broadcastable output operand with shape {self.shape} "
                             f"doesn't match the broadcast shape {shape}")
        sample = np.empty(0, self.dtype)           # numpy's casting check (and its error)
        np.floor_divide(sample, ufuncs._sample(other), out=sample)
        self[...] = floor_divide(self, other)
        return self
