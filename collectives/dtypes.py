"""The dtypes and reduction ops the native kernels know, and how numpy names them.

bfloat16 has no numpy dtype of its own; ml_dtypes (which JAX brings) provides one, recognised
here by name so that importing this module never needs ml_dtypes.
"""
import enum

import numpy as np

#: dtype name -> pt_dtype_t code, in native/include/pt.h order
DTYPES = _CODES = {"int8": 0, "int16": 1, "int32": 2, "int64": 3, "uint8": 4, "uint16": 5,
          "uint32": 6, "uint64": 7, "float16": 8, "bfloat16": 9, "float32": 10, "float64": 11}


class ReduceOp(enum.IntEnum):
    """Reduction operations (pt_op_t codes; AVG is SUM followed by a division)."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4


_BY_DTYPE = {}   # np.dtype -> code, filled on first sight (collectives call this per call)


def dtype_code(dtype):
    """pt_dtype_t code of a numpy dtype; TypeError for one the kernels do not support."""
    code = _BY_DTYPE.get(dtype)
    if code is not None:
        return code
    dt = np.dtype(dtype)
    code = _CODES.get(dt.name) if dt.isnative or dt.itemsize == 1 else None
    if code is None:
        raise TypeError(f"dtype {dt} is not supported: use one of {', '.join(_CODES)}")
    _BY_DTYPE[dt] = code
    return code


def is_floating(dtype):
    return np.dtype(dtype).name in ("float16", "bfloat16", "float32", "float64")


_OPS = {**{o: o for o in ReduceOp}, **{o.name.lower(): o for o in ReduceOp}}


def reduce_op(op):
    """ReduceOp from a name ('sum', 'prod', 'min', 'max', 'avg') or a ReduceOp."""
    hit = _OPS.get(op) if isinstance(op, (str, ReduceOp)) else None
    if hit is not None:
        return hit
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            pass
    raise ValueError(f"unknown reduction op {op!r}: use one of "
                     f"{', '.join(o.name.lower() for o in ReduceOp)}")
