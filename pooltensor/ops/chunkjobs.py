"""The per-chunk steps of the chunked passes (chunks.py), as small classes a plain script can
send its members in a plan (``PLAN_OK``: part of the vocabulary pool/work.py admits; they hold
only names, dtypes, scalars and small numpy arrays).

A job is called as job(r0, r1, arrays): it works on rows r0:r1 (along axis 0) of the pool
arrays it is given, reading them where they live and writing its outputs one-sided, and
returns a small summary (a total, counts, an R factor) or None. Whoever homes the chunk's
first row runs it (chunks.run).
"""
import numpy as np


def _read(x):
    from .chunks import read
    return read(x)


class ScanTotals:
    """The sum or product over axis 0 of rows r0:r1 of arrays[0] (pass 1 of a scan)."""

    PLAN_OK = True

    def __init__(self, kind, dtype):
        self.kind, self.dtype = kind, np.dtype(dtype)

    def __call__(self, r0, r1, arrays):
        red = np.sum if self.kind == "sum" else np.prod
        return red(_read(arrays[0][r0:r1]), axis=0, dtype=self.dtype)


class ScanWrite:
    """arrays[1][r0:r1] = the running sum/product of arrays[0][r0:r1] along axis 0, combined
    with the chunk's carry-in (pass 2 of a scan); carries: (first row of each chunk, its
    carry), a stack of them."""

    PLAN_OK = True

    def __init__(self, kind, dtype, starts, carries):
        self.kind, self.dtype = kind, np.dtype(dtype)
        self.starts, self.carries = np.asarray(starts), np.asarray(carries)

    def __call__(self, r0, r1, arrays):
        x, out = arrays
        c = self.carries[int(np.searchsorted(self.starts, r0))]
        acc = np.cumsum if self.kind == "sum" else np.cumprod
        block = acc(_read(x[r0:r1]), axis=0, dtype=self.dtype)
        out[r0:r1] = block + c if self.kind == "sum" else block * c
        return None


class RowSort:
    """arrays[1][r0:r1] = sort (or stable argsort) of arrays[0][r0:r1] along the last axis."""

    PLAN_OK = True

    def __init__(self, want_index):
        self.want_index = bool(want_index)

    def __call__(self, r0, r1, arrays):
        a = _read(arrays[0][r0:r1])
        arrays[1][r0:r1] = np.argsort(a, axis=-1, kind="stable") if self.want_index else \
            np.sort(a, axis=-1, kind="stable")
        return None


class BucketCount:
    """How many elements of 1-D chunk arrays[0][r0:r1] fall in each bucket of the splitters
    (pass 1 of a sample sort)."""

    PLAN_OK = True

    def __init__(self, splitters):
        self.spl = np.asarray(splitters)

    def __call__(self, r0, r1, arrays):
        b = np.searchsorted(self.spl, _read(arrays[0][r0:r1]), side="right")
        return np.bincount(b, minlength=self.spl.size + 1).astype(np.int64)


class Partition:
    """The elements of chunk arrays[0][r0:r1] (and their indices) written to their buckets'
    places in arrays[1] (values) and arrays[2] (indices), in input order (pass 2 of a sample
    sort). place[c, b]: where chunk c's share of bucket b starts; starts: each chunk's first
    row. With a fourth array, its rows r0:r1 travel in place of the indices (a payload moved
    with its keys: the inverse of a permutation)."""

    PLAN_OK = True

    def __init__(self, splitters, starts, place):
        self.spl, self.starts, self.place = (np.asarray(splitters), np.asarray(starts),
                                             np.asarray(place))

    def __call__(self, r0, r1, arrays):
        x, tmp, tmpi = arrays[:3]
        c = int(np.searchsorted(self.starts, r0))
        v = _read(x[r0:r1])
        b = np.searchsorted(self.spl, v, side="right")
        order = np.argsort(b, kind="stable")
        vs, bs = v[order], b[order]
        carried = _read(arrays[3][r0:r1])[order] if len(arrays) > 3 else order + r0
        edges = np.concatenate([[0], np.cumsum(np.bincount(bs, minlength=self.spl.size + 1))])
        for k in np.nonzero(edges[1:] - edges[:-1])[0]:
            s, e = edges[k], edges[k + 1]
            at = int(self.place[c, k])
            tmp[at:at + e - s] = vs[s:e]
            tmpi[at:at + e - s] = carried[s:e]
        return None


class BucketSort:
    """One group of buckets, rows r0:r1 of the partitioned arrays[1] (values) and arrays[2]
    (indices), sorted stably into arrays[0] (the values, or the indices when want_index;
    with a fourth array the values into arrays[0] and the indices into arrays[3]) (pass 3 of
    a sample sort)."""

    PLAN_OK = True

    def __init__(self, want_index):
        self.want_index = bool(want_index)

    def __call__(self, r0, r1, arrays):
        out, tmp, tmpi = arrays[:3]
        v = _read(tmp[r0:r1])
        order = np.argsort(v, kind="stable")
        if len(arrays) > 3:
            out[r0:r1] = v[order]
            arrays[3][r0:r1] = _read(tmpi[r0:r1])[order]
        else:
            out[r0:r1] = _read(tmpi[r0:r1])[order] if self.want_index else v[order]
        return None


class Unpermute:
    """arrays[2][r0:r1] from the (destination, value) pairs of rows r0:r1 of arrays[0] and
    arrays[1], partitioned so that these rows hold exactly the destinations r0..r1-1: the
    last pass of out[p[j]] = value[j] for a permutation p (a unique's inverse indices)."""

    PLAN_OK = True

    def __call__(self, r0, r1, arrays):
        dest, vals, out = arrays
        d = _read(dest[r0:r1])
        v = _read(vals[r0:r1])
        res = np.empty(r1 - r0, v.dtype)
        res[d - r0] = v
        out[r0:r1] = res
        return None


class RunStarts:
    """Where in sorted 1-D chunk arrays[0][r0:r1] a new value starts (one differing from its
    predecessor; NaN differs from everything): their count, or with offsets (pass 2) the
    values and start positions written to arrays[1] and arrays[2]. With three more arrays
    (unique_all: arrays[3] the stable sorting permutation), each start's original index
    goes to arrays[4] and every element's value number to arrays[5][r0:r1]."""

    PLAN_OK = True

    def __init__(self, starts=None, offsets=None):
        self.starts = None if starts is None else np.asarray(starts)
        self.offsets = None if offsets is None else np.asarray(offsets)

    def __call__(self, r0, r1, arrays):
        s = arrays[0]
        v = _read(s[r0:r1])
        keep = np.ones(v.shape, bool)
        if v.size:
            keep[1:] = v[1:] != v[:-1]
            if r0:
                keep[0] = bool(v[0] != _read(s[r0 - 1:r0])[0])
        if self.offsets is None:
            return int(keep.sum())
        at = int(self.offsets[int(np.searchsorted(self.starts, r0))])
        uv = v[keep]
        arrays[1][at:at + uv.size] = uv
        arrays[2][at:at + uv.size] = np.nonzero(keep)[0] + r0
        if len(arrays) > 3:
            arrays[4][at:at + uv.size] = _read(arrays[3][r0:r1])[keep]
            arrays[5][r0:r1] = np.cumsum(keep, dtype=np.int64) + (at - 1)
        return None


class NonzeroRows:
    """The nonzero elements of 1-D chunk arrays[0][r0:r1] of the flattened input: their count,
    or with offsets (pass 2) their indices unravelled into `shape`, written as columns of
    arrays[1] (ndim x count)."""

    PLAN_OK = True

    def __init__(self, shape, starts=None, offsets=None):
        self.shape = tuple(shape)
        self.starts = None if starts is None else np.asarray(starts)
        self.offsets = None if offsets is None else np.asarray(offsets)

    def __call__(self, r0, r1, arrays):
        f = np.flatnonzero(_read(arrays[0][r0:r1])) + r0
        if self.offsets is None:
            return int(f.size)
        if f.size:
            at = int(self.offsets[int(np.searchsorted(self.starts, r0))])
            arrays[1][:, at:at + f.size] = np.stack(np.unravel_index(f, self.shape))
        return None


class Search:
    """arrays[1][r0:r1] = where the needles arrays[0][r0:r1] go in sorted 1-D arrays[2]: in
    `whole` (arrays[2] read whole, small) or through `bounds`, the first element of each
    `step` elements of it (arrays[2] read in pieces)."""

    PLAN_OK = True

    def __init__(self, side, whole=None, bounds=None, step=0):
        self.side, self.whole, self.bounds, self.step = side, whole, bounds, int(step)

    def __call__(self, r0, r1, arrays):
        needles, out, x1 = arrays
        v = _read(needles[r0:r1])
        if self.whole is not None:
            out[r0:r1] = np.searchsorted(self.whole, v, side=self.side)
            return None
        res = np.zeros(v.shape, np.int64)
        k = np.searchsorted(self.bounds, v, side=self.side)
        for c in np.unique(k):
            if c == 0:
                continue
            sel = k == c
            lo = (int(c) - 1) * self.step
            part = _read(x1[lo:lo + self.step + 1])
            res[sel] = lo + np.searchsorted(part, v[sel], side=self.side)
        out[r0:r1] = res
        return None


class TakeRows:
    """arrays[2][r0:r1] = arrays[1][i] for the indices i = arrays[0][r0:r1] (take with a big
    index array: only the selected rows of arrays[1] are read)."""

    PLAN_OK = True

    def __call__(self, r0, r1, arrays):
        ind, x, out = arrays
        out[r0:r1] = x[_read(ind[r0:r1])]
        return None


class FftRows:
    """arrays[1][r0:r1] = numpy.fft.<name> of arrays[0][r0:r1] over its trailing axes (kw:
    n/s, axis/axes, norm)."""

    PLAN_OK = True

    def __init__(self, name, kw):
        self.name, self.kw = name, dict(kw)

    def __call__(self, r0, r1, arrays):
        fn = getattr(np.fft, self.name)
        arrays[1][r0:r1] = fn(_read(arrays[0][r0:r1]), **self.kw)
        return None


class QRRows:
    """TSQR step 1: Q_i R_i = arrays[0][r0:r1]; Q_i written to arrays[1][r0:r1]; R_i returned.
    With q2 (step 3): arrays[1][r0:r1] = Q_i @ its block of q2 (blocks start at q2_at[c])."""

    PLAN_OK = True

    def __init__(self, starts=None, q2=None, q2_at=None):
        self.starts = None if starts is None else np.asarray(starts)
        self.q2 = None if q2 is None else np.asarray(q2)
        self.q2_at = None if q2_at is None else np.asarray(q2_at)

    def __call__(self, r0, r1, arrays):
        a, q = arrays
        if self.q2 is None:
            qi, ri = np.linalg.qr(_read(a[r0:r1]), mode="reduced")
            q[r0:r1, :qi.shape[1]] = qi
            return ri
        c = int(np.searchsorted(self.starts, r0))
        blk = self.q2[self.q2_at[c]:self.q2_at[c + 1]]
        q[r0:r1] = _read(q[r0:r1, :blk.shape[0]]) @ blk
        return None


class RFactor:
    """R of rows r0:r1 of arrays[0] (svdvals' TSQR: no Q)."""

    PLAN_OK = True

    def __call__(self, r0, r1, arrays):
        return np.linalg.qr(_read(arrays[0][r0:r1]), mode="r")
