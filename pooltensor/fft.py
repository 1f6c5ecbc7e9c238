"""pooltensor.fft: the Array API's FFT extension for pool arrays.

A transform along some axes needs each whole line along those axes. Up to the pool's
materialize_limit the array is gathered and numpy.fft does the work. Above it, the transformed
axes are moved last and the array is cut along its leading (untransformed) axis into chunks of
whole lines (pooltensor/ops/chunks.py): each chunk is read, transformed by numpy and written
into the result's rows where the chunk's first row lives (SPMD ranks, a plain script's members;
the script streams the rest through its cache). A transform over every axis of a big array (no
untransformed axis to cut along) is refused with MaterializeTooLarge. Result dtypes are numpy's
(complex64 from float32/complex64, complex128 otherwise).
"""
import operator

import numpy as np

from .errors import MaterializeTooLarge
from .ops import chunkjobs, chunks, coerce, executor
from .ops.api_info import check_device

_norm = np.lib.array_utils.normalize_axis_index


def _run(name, x, n, axes, norm, shape_kw):
    """numpy.fft.<name>(x, <n or s>, <axis or axes>, norm) over pool array x."""
    x = coerce.array(x)
    fn = getattr(np.fft, name)
    many = name.endswith("n")
    if norm not in ("backward", "ortho", "forward"):
        raise ValueError(f"norm must be 'backward', 'ortho' or 'forward', not {norm!r}")
    if x.ndim == 0:
        raise ValueError(f"fft.{name} needs an array of at least one dimension")
    if many:
        ax = list(range(x.ndim)) if axes is None else [_norm(a, x.ndim) for a in axes]
        if axes is None and n is not None:
            ax = list(range(x.ndim - len(n), x.ndim))
        kw = {"s": n, "axes": ax}
    else:
        ax = [_norm(operator.index(axes), x.ndim)]
        kw = {"n": n, "axis": ax[0]}
    if not chunks.big(x):
        return coerce.own(fn(x.to_numpy(), norm=norm, **kw))
    rest = [i for i in range(x.ndim) if i not in ax]
    if not rest:
        raise MaterializeTooLarge(
            f"fft.{name} over every axis of {x.nbytes} bytes: above the pool's "
            f"materialize_limit a transform needs an untransformed axis to cut along")
    order = rest + ax
    xv = _perm(x, order)
    nax = list(range(len(rest), x.ndim))
    kw = {"s": n, "axes": nax} if many else {"n": n, "axis": nax[0]}
    probe = fn(np.zeros((1,) * len(rest) + tuple(xv.shape[len(rest):]), x.dtype), norm=norm,
               **kw)
    shp_v = tuple(xv.shape[:len(rest)]) + probe.shape[len(rest):]
    out_v = executor.new_like(shp_v, probe.dtype, what=f"fft.{name}")
    parts = chunks.ranges(xv.shape[0], chunks.rows(xv))
    chunks.run(chunkjobs.FftRows(name, dict(kw, norm=norm)), parts, xv, [xv, out_v],
               outs=[out_v])
    inv = list(np.argsort(order))
    return _perm(out_v, inv)


def _perm(x, order):
    from .ops.shape import transpose
    return transpose(x, order)


def fft(x, /, *, n=None, axis=-1, norm="backward"):
    """The one-dimensional discrete Fourier transform along `axis`."""
    return _run("fft", x, n, axis, norm, None)


def ifft(x, /, *, n=None, axis=-1, norm="backward"):
    """The one-dimensional inverse discrete Fourier transform along `axis`."""
    return _run("ifft", x, n, axis, norm, None)


def fftn(x, /, *, s=None, axes=None, norm="backward"):
    """The n-dimensional discrete Fourier transform over `axes`."""
    return _run("fftn", x, s, axes, norm, None)


def ifftn(x, /, *, s=None, axes=None, norm="backward"):
    """The n-dimensional inverse discrete Fourier transform over `axes`."""
    return _run("ifftn", x, s, axes, norm, None)


def rfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The one-dimensional transform of real input (the non-negative frequencies)."""
    return _run("rfft", x, n, axis, norm, None)


def irfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The inverse of rfft (a real result)."""
    return _run("irfft", x, n, axis, norm, None)


def rfftn(x, /, *, s=None, axes=None, norm="backward"):
    """The n-dimensional transform of real input."""
    return _run("rfftn", x, s, axes, norm, None)


def irfftn(x, /, *, s=None, axes=None, norm="backward"):
    """The inverse of rfftn (a real result)."""
    return _run("irfftn", x, s, axes, norm, None)


def hfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The transform of a Hermitian-symmetric signal (a real spectrum)."""
    return _run("hfft", x, n, axis, norm, None)


def ihfft(x, /, *, n=None, axis=-1, norm="backward"):
    """The inverse of hfft."""
    return _run("ihfft", x, n, axis, norm, None)


def fftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The sample frequencies of an n-point transform with sample spacing d."""
    check_device(device)
    res = np.fft.fftfreq(operator.index(n), d)
    return coerce.own(res if dtype is None else res.astype(dtype))


def rfftfreq(n, /, *, d=1.0, dtype=None, device=None):
    """The non-negative sample frequencies of an n-point real transform."""
    check_device(device)
    res = np.fft.rfftfreq(operator.index(n), d)
    return coerce.own(res if dtype is None else res.astype(dtype))


def fftshift(x, /, *, axes=None):
    """The zero frequency moved to the middle (a roll along `axes`, blockwise copies)."""
    return _shift(x, axes, 1)


def ifftshift(x, /, *, axes=None):
    """The inverse of fftshift."""
    return _shift(x, axes, -1)


def _shift(x, axes, sign):
    from .ops.api_manip import roll
    x = coerce.array(x)
    if axes is None:
        axes = tuple(range(x.ndim))
    elif isinstance(axes, int):
        axes = (axes,)
    shifts = [(x.shape[a] // 2) if sign > 0 else -(x.shape[a] // 2) for a in axes]
    if not axes:
        return x.copy()
    return roll(x, tuple(shifts), axis=tuple(axes))


__all__ = ["fft", "ifft", "fftn", "ifftn", "rfft", "irfft", "rfftn", "irfftn", "hfft",
           "ihfft", "fftfreq", "rfftfreq", "fftshift", "ifftshift"]
