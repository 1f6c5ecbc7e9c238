"""Native kernels for numpy arrays: copy, strided gather/scatter, elementwise and full reductions.

The work happens in C (``native/src/kernels/``), vectorized for the CPU at hand and run
without the GIL; this module only maps numpy dtypes and op names to the native codes and checks
shapes, so that a mistake is reported in numpy's terms before any pointer reaches C.

Supported dtypes: int8..int64, uint8..uint64, float16, bfloat16, float32, float64. numpy has
no bfloat16: pass ``ml_dtypes.bfloat16`` arrays (when ml_dtypes is installed), or uint16
arrays holding bfloat16 bit patterns together with ``dtype="bfloat16"``.

Rounding: float16 and bfloat16 are combined in float32 and rounded once, to nearest even.
NaN propagates through min and max as with ``np.minimum``/``np.maximum``; integer sums and
products wrap as numpy's do.
"""
import os

import numpy as np

from collectives import _native
from collectives.dtypes import DTYPES, ReduceOp

__all__ = ["OPS", "DTYPES", "isa", "dtype_code", "copy", "gather", "scatter", "reduce",
           "reduce_all"]

#: op name -> pt_op_t code (order of the enum in pt.h); avg is not a kernel op
OPS = {o.name.lower(): int(o) for o in ReduceOp if o is not ReduceOp.AVG}

# What pt_reduce_all writes for each dtype, as a numpy scalar type.
_ACCUMULATOR = [np.int64] * 4 + [np.uint64] * 4 + [np.float32] * 3 + [np.float64]

_ISAS = ("avx512", "avx2", "neon", "scalar")

try:  # optional: numpy itself has no bfloat16
    import ml_dtypes
    _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    _BFLOAT16 = None

_env = os.environ.get("POOLTENSOR_KERNELS", "")
if _env not in ("", "auto") + _ISAS:
    raise ValueError(f"POOLTENSOR_KERNELS={_env!r}: expected one of auto, {', '.join(_ISAS)}")


def isa():
    """Instruction set the kernels run on: 'avx512', 'avx2', 'neon' or 'scalar'.

    Chosen once per process from what the CPU supports; ``POOLTENSOR_KERNELS`` set before the
    first kernel call can only ask for a lesser one (e.g. ``scalar`` to compare against).
    """
    return _native.kernels_isa()


def dtype_code(dtype):
    """The pt_dtype_t code of a numpy dtype, ``ml_dtypes.bfloat16`` or the name "bfloat16".

    Raises TypeError for a dtype the kernels do not handle (bool, complex, object, ...) and
    ValueError for non-native byte order, which the kernels would silently misread.
    """
    if isinstance(dtype, str) and dtype == "bfloat16":
        return DTYPES["bfloat16"]
    dt = np.dtype(dtype)
    if _BFLOAT16 is not None and dt == _BFLOAT16:
        return DTYPES["bfloat16"]
    code = DTYPES.get(dt.name) if dt.kind in "iuf" else None
    if code is None:
        raise TypeError(f"kernels do not support dtype {dt}")
    if not dt.isnative:
        raise ValueError(f"kernels need native byte order, not {dt.str}")
    return code


def _code_of(array, dtype):
    """The dtype code for ``array``, read as ``dtype`` when one is given (same item size)."""
    code = dtype_code(array.dtype if dtype is None else dtype)
    if _native.dtype_size(code) != array.dtype.itemsize:
        raise ValueError(f"dtype {dtype} has {_native.dtype_size(code)}-byte elements, "
                         f"the array {array.dtype.itemsize}-byte ones")
    return code


def _raw(array):
    """``array`` as a plain unsigned-integer view of the same layout.

    The kernels move bytes and take the dtype as a code; numpy cannot export a buffer for
    extension dtypes such as ml_dtypes.bfloat16, and must not for object arrays.
    """
    if array.dtype.hasobject:
        raise TypeError("kernels cannot move arrays of Python objects")
    if array.dtype.kind in "iuf" and array.dtype.isbuiltin:
        return array
    size = array.dtype.itemsize
    return array.view(f"u{size}" if size in (1, 2, 4, 8) else f"V{size}")


def _writable_contiguous(dst, what="dst"):
    if not isinstance(dst, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, not {type(dst).__name__}")
    if not dst.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    if not dst.flags.writeable:
        raise ValueError(f"{what} is read-only")


def copy(dst, src):
    """Copy ``src`` into ``dst`` (same dtype and shape, dst C-contiguous); returns dst.

    A non-contiguous src is gathered on the way. Overlapping memory is allowed.
    """
    src = np.asarray(src)
    _writable_contiguous(dst)
    if src.dtype != dst.dtype or src.shape != dst.shape:
        raise ValueError(f"copy: src is {src.dtype}{list(src.shape)}, "
                         f"dst {dst.dtype}{list(dst.shape)}")
    if src.flags.c_contiguous:
        _native.copy(_raw(dst), _raw(src))
    else:
        _native.gather(_raw(dst), _raw(src))
    return dst


def gather(view):
    """A C-contiguous copy of an N-d strided view (any strides, negative or zero included)."""
    view = np.asarray(view)
    out = np.empty(view.shape, view.dtype)
    _native.gather(_raw(out), _raw(view))
    return out


def scatter(dst, src):
    """Write the elements of ``src`` into the strided view ``dst``, in C order; returns dst.

    ``src`` must have dst's dtype and number of elements; it is copied first when it may share
    memory with dst, so that an overlap cannot corrupt the result.
    """
    if not isinstance(dst, np.ndarray):
        raise TypeError(f"dst must be a numpy array, not {type(dst).__name__}")
    if not dst.flags.writeable:
        raise ValueError("dst is read-only")
    src = np.asarray(src)
    if src.dtype != dst.dtype or src.size != dst.size:
        raise ValueError(f"scatter: src is {src.dtype}{list(src.shape)}, "
                         f"dst {dst.dtype}{list(dst.shape)}")
    if not src.flags.c_contiguous or np.may_share_memory(src, dst):
        src = gather(src)
    _native.scatter(_raw(dst), _raw(src))
    return dst


def reduce(op, dst, srcs, *, dtype=None):
    """``dst[...] = srcs[0] op srcs[1] op ...`` elementwise, left to right; returns dst.

    op is "sum", "prod", "min" or "max". Every source has dst's dtype and shape; dst is
    C-contiguous and may be one of the sources (in-place), non-contiguous sources are gathered
    first. ``dtype`` overrides how the bytes are read, e.g. "bfloat16" for uint16 arrays.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, not {op!r}")
    _writable_contiguous(dst)
    srcs = [np.asarray(s) for s in srcs]
    if not srcs:
        raise ValueError("reduce: srcs is empty")
    code = _code_of(dst, dtype)
    for i, s in enumerate(srcs):
        if s.dtype != dst.dtype or s.shape != dst.shape:
            raise ValueError(f"reduce: srcs[{i}] is {s.dtype}{list(s.shape)}, "
                             f"dst {dst.dtype}{list(dst.shape)}")
    srcs = [s if s.flags.c_contiguous else gather(s) for s in srcs]
    _native.reduce(OPS[op], code, _raw(dst), [_raw(s) for s in srcs])
    return dst


def reduce_all(op, array, *, dtype=None):
    """Reduce a whole array to one numpy scalar of the accumulator type.

    int64 for signed integers, uint64 for unsigned (wrapping like numpy's sum and prod),
    float32 for float16, bfloat16 and float32, float64 for float64. Floats are summed in many
    lanes combined pairwise, so the result is as accurate as numpy's but may differ from it in
    the last bits. min/max of an empty array raise ValueError, as numpy does.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, not {op!r}")
    array = np.asarray(array)
    code = _code_of(array, dtype)
    if not array.flags.c_contiguous:
        array = gather(array)
    return _ACCUMULATOR[code](_native.reduce_all(OPS[op], code, _raw(array)))
