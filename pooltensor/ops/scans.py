"""Cumulative sums and products along an axis (cumulative_sum, cumulative_prod; numpy's
cumsum and cumprod on pool arrays).

Up to the materialize limit: numpy on a gathered copy. Above it, a local scan plus carried
offsets (chunks.py): the array, seen with the scanned axis first, is cut into chunks along
that axis; pass 1 reduces each chunk to its total (a sum or product over the axis), the
totals are exchanged (SPMD: one allgather) and scanned into each chunk's carry-in; pass 2
scans each chunk with numpy, combines the carry and writes the chunk of the result where it
lives. Two reads of the input, one write of the result, no gather; each chunk is scanned
where its first row lives (chunks.run: the members of a plain script do theirs).
"""
import operator

import numpy as np

from ..array.array import ndarray
from . import chunkjobs, chunks, coerce, executor
from .dispatch import implements

_norm = np.lib.array_utils.normalize_axis_index


def _dtype(x, dtype):
    """The standard's result dtype: the default integer for smaller integers (numpy's sum
    dtype rule), the input's otherwise."""
    if dtype is not None:
        return np.dtype(dtype)
    return np.cumsum(np.empty(0, x.dtype)).dtype


def cumulative(x, kind, axis, dtype, include_initial):
    """The Array API's cumulative_sum / cumulative_prod (kind 'sum' / 'prod')."""
    if axis is None:
        if x.ndim > 1:
            raise ValueError("axis must be given for arrays of more than one dimension")
        axis = 0
    if x.ndim == 0:
        raise ValueError("cumulative functions need an array of at least one dimension")
    axis = _norm(operator.index(axis), x.ndim)
    dt = _dtype(x, dtype)
    n = x.shape[axis]
    shp = x.shape[:axis] + (n + int(bool(include_initial)),) + x.shape[axis + 1:]
    if not chunks.big(x):
        a = x.to_numpy()
        fn = np.cumsum if kind == "sum" else np.cumprod
        res = fn(a, axis=axis, dtype=dt)
        if include_initial:
            first = np.full(a.shape[:axis] + (1,) + a.shape[axis + 1:],
                            0 if kind == "sum" else 1, dt)
            res = np.concatenate([first, res], axis=axis)
        return coerce.own(res)
    out = executor.new_like(shp, dt, what=f"cumulative_{kind}")
    pre = (slice(None),) * axis
    if include_initial:
        out[pre + (slice(0, 1),)] = 0 if kind == "sum" else 1
    target = out[pre + (slice(int(bool(include_initial)), None),)]
    scan(x, target, kind, axis)
    return out


def scan(x, out, kind, axis):
    """out = cumsum/cumprod of pool array x along `axis`, in chunks (see the module)."""
    xv = x if axis == 0 else x.swapaxes(0, axis)
    ov = out if axis == 0 else out.swapaxes(0, axis)
    dt = out.dtype
    parts = chunks.ranges(xv.shape[0], chunks.rows(xv))
    totals = chunks.run(chunkjobs.ScanTotals(kind, dt), parts, xv, [xv])
    carry = np.zeros(xv.shape[1:], dt) if kind == "sum" else np.ones(xv.shape[1:], dt)
    carries = []
    for t in totals:
        carries.append(carry)
        carry = carry + t if kind == "sum" else carry * t
    job = chunkjobs.ScanWrite(kind, dt, [r0 for r0, _ in parts], np.stack(carries))
    chunks.run(job, parts, xv, [xv, ov], outs=[out])


def _np_cum(kind):
    def impl(a, axis=None, dtype=None, out=None):
        x = a if isinstance(a, ndarray) else coerce.array(a)
        if axis is None:
            x = x.reshape(-1)
            axis = 0
        res = cumulative(x, kind, axis, dtype, False)
        if out is not None:
            out[...] = res
            return out
        return res
    impl.__name__ = f"cum{kind}"
    impl.__doc__ = f"numpy.cum{kind} of a pool array (see pooltensor.ops.scans)."
    return impl


implements(np.cumsum)(_np_cum("sum"))
implements(np.cumprod)(_np_cum("prod"))
