"""pooltensor.linalg: the Array API's linear algebra extension for pool arrays.

Distributed (each home computes on the slabs it holds; see pooltensor/ops):
matmul (rows of the left operand stay where they live), tensordot (a matmul after moving the
contracted axes together), vecdot, outer, cross (elementwise on views), matrix_transpose and
diagonal (views, diagonal copied), trace, vector_norm and matrix_norm ('fro', 1, -1, inf,
-inf: reductions).

Factorizations and solves (cholesky qr solve inv det slogdet eigh eigvalsh svd svdvals pinv
matrix_rank matrix_power, and the 'nuc', 2, -2 matrix norms) run numpy on a gathered copy
for matrices up to the pool's materialize_limit and raise MaterializeTooLarge above it,
except for a tall-skinny matrix (one 2-D matrix, rows >= 4 x columns): qr, svd and svdvals
take the TSQR path (pooltensor/ops/tsqr.py) there, without gathering the matrix, and lstsq
solves through it.
"""
import collections
import operator

import numpy as np

from .array.array import ndarray
from .errors import MaterializeTooLarge
from .ops import chunks, coerce, products, reductions, tsqr
from .ops import shape as _shape
from .ops.api_stats import sum as _sum

EighResult = collections.namedtuple("EighResult", "eigenvalues eigenvectors")
QRResult = collections.namedtuple("QRResult", "Q R")
SlogdetResult = collections.namedtuple("SlogdetResult", "sign logabsdet")
SVDResult = collections.namedtuple("SVDResult", "U S Vh")

_norm = np.lib.array_utils.normalize_axis_index


def matmul(x1, x2, /):
    """Matrix product (numpy's matmul semantics; the left operand's rows stay where they
    live)."""
    return coerce.own(products.matmul(coerce.array(x1), coerce.array(x2)))


def matrix_transpose(x, /):
    """The last two axes swapped (a view)."""
    return _shape.matrix_transpose(coerce.array(x))


def tensordot(x1, x2, /, *, axes=2):
    """Sum of products over the given axes (numpy.tensordot), as a matmul of x1 with its
    contracted axes moved last and x2 with its contracted axes moved first."""
    x1, x2 = coerce.array(x1), coerce.array(x2)
    if isinstance(axes, int):
        if axes < 0:
            raise ValueError("axes must be non-negative")
        a1 = list(range(x1.ndim - axes, x1.ndim))
        a2 = list(range(axes))
    else:
        a1, a2 = axes
        a1 = [a1] if isinstance(a1, int) else list(a1)
        a2 = [a2] if isinstance(a2, int) else list(a2)
    if len(a1) != len(a2):
        raise ValueError("axes of x1 and x2 must have the same length")
    a1 = [_norm(a, x1.ndim) for a in a1]
    a2 = [_norm(a, x2.ndim) for a in a2]
    for i, j in zip(a1, a2):
        if x1.shape[i] != x2.shape[j]:
            raise ValueError(f"shape mismatch for the contracted axes: {x1.shape[i]} and "
                             f"{x2.shape[j]}")
    free1 = [i for i in range(x1.ndim) if i not in a1]
    free2 = [i for i in range(x2.ndim) if i not in a2]
    k = int(np.prod([x1.shape[i] for i in a1], dtype=np.int64))
    s1 = tuple(x1.shape[i] for i in free1)
    s2 = tuple(x2.shape[i] for i in free2)
    m1 = _shape.transpose(x1, free1 + a1) if x1.ndim else x1
    m2 = _shape.transpose(x2, a2 + free2) if x2.ndim else x2
    m1 = _shape.reshape(m1, (int(np.prod(s1, dtype=np.int64)), k))
    m2 = _shape.reshape(m2, (k, int(np.prod(s2, dtype=np.int64))))
    res = coerce.array(coerce.own(products.matmul(m1, m2)))
    return _shape.reshape(res, s1 + s2)


def vecdot(x1, x2, /, *, axis=-1):
    """Dot products of vectors along `axis` (the first argument conjugated), broadcasting the
    other axes: an elementwise product and a sum where the slabs live."""
    x1, x2 = coerce.array(x1), coerce.array(x2)
    nd = max(x1.ndim, x2.ndim)
    if x1.ndim == 0 or x2.ndim == 0:
        raise ValueError("vecdot needs arrays of at least one dimension")
    ax = _norm(operator.index(axis), nd)
    ax1, ax2 = ax - (nd - x1.ndim), ax - (nd - x2.ndim)
    if ax1 < 0 or ax2 < 0 or x1.shape[ax1] != x2.shape[ax2]:
        raise ValueError("x1 and x2 must have the same size along the axis")
    prod = (np.conjugate(x1) if x1.dtype.kind == "c" else x1) * x2
    return _sum(prod, axis=ax - nd, dtype=prod.dtype)


def outer(x1, x2, /):
    """The outer product of two vectors (elementwise on broadcast views)."""
    x1, x2 = coerce.array(x1), coerce.array(x2)
    if x1.ndim != 1 or x2.ndim != 1:
        raise ValueError("outer takes one-dimensional arrays")
    return coerce.own(x1.reshape(x1.shape[0], 1) * x2.reshape(1, x2.shape[0]))


def cross(x1, x2, /, *, axis=-1):
    """The cross product of 3-vectors along `axis` (broadcasting the other axes)."""
    x1, x2 = coerce.array(x1), coerce.array(x2)
    nd = max(x1.ndim, x2.ndim)
    if x1.ndim == 0 or x2.ndim == 0:
        raise ValueError("cross needs arrays of at least one dimension")
    if not -nd <= axis < nd or not -x1.ndim <= axis < 0 or not -x2.ndim <= axis < 0:
        if not (-min(x1.ndim, x2.ndim) <= axis < 0):
            raise ValueError("axis out of range for cross")
    if x1.shape[axis] != 3 or x2.shape[axis] != 3:
        raise ValueError("cross needs vectors of size 3 along the axis")
    np.broadcast_shapes(x1.shape, x2.shape)

    def comp(x, i):
        idx = [slice(None)] * x.ndim
        idx[axis] = slice(i, i + 1)
        return x[tuple(idx)]
    a = [comp(x1, i) for i in range(3)]
    b = [comp(x2, i) for i in range(3)]
    c = [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
    return _shape.concatenate(c, axis=axis)


def diagonal(x, /, *, offset=0):
    """Diagonal `offset` of the last two axes (a new pool array copied from a strided
    view)."""
    x = coerce.array(x)
    if x.ndim < 2:
        raise ValueError("diagonal needs an array of at least two dimensions")
    n, m = x.shape[-2:]
    s0, s1 = x.strides[-2:]
    k = operator.index(offset)
    i0, j0 = (0, k) if k >= 0 else (-k, 0)
    count = max(0, min(n - i0, m - j0))
    off = x._off + (i0 * s0 + j0 * s1 if count else 0)
    view = ndarray(x._a, off, x.shape[:-2] + (count,), x.strides[:-2] + (s0 + s1,), x.dtype)
    return view.copy()


def trace(x, /, *, offset=0, dtype=None):
    """Sum of diagonal `offset` of the last two axes (integers in the default integer)."""
    return _sum(diagonal(x, offset=offset), axis=-1, dtype=dtype)


def _real_dtype(dt):
    return np.empty(0, dt).real.dtype


def vector_norm(x, /, *, axis=None, keepdims=False, ord=2):    # noqa: A002
    """The vector norm over `axis` (every axis when None): ord 2 (default), 1, inf, -inf, 0,
    or any real p; computed with reductions where the slabs live."""
    x = coerce.array(x)
    a = abs(x)
    if a.dtype.kind in "iub":
        a = a.astype(np.float64)
    ax = axis
    if isinstance(ax, list):
        ax = tuple(ax)
    if ord == 2:
        res = np.sqrt(coerce.array(reductions.sum(a * a, ax, None, None, keepdims)))
    elif ord == 1:
        res = reductions.sum(a, ax, None, None, keepdims)
    elif ord == np.inf:
        res = reductions.max(a, ax, None, keepdims) if a.size else \
            np.zeros(_keep(a.shape, ax, keepdims), a.dtype)
    elif ord == -np.inf:
        res = reductions.min(a, ax, None, keepdims)
    elif ord == 0:
        res = reductions.sum((a != 0).astype(a.dtype), ax, None, None, keepdims)
    else:
        p = float(ord)
        s = coerce.array(reductions.sum(a ** p, ax, None, None, keepdims))
        res = s ** (1.0 / p)
    res = coerce.array(coerce.own(res))
    rd = _real_dtype(x.dtype) if x.dtype.kind in "fc" else np.dtype(np.float64)
    return res if res.dtype == rd else res.astype(rd)


def _keep(shape, axis, keepdims):
    axes = range(len(shape)) if axis is None else \
        [_norm(a, len(shape)) for a in (axis if isinstance(axis, tuple) else (axis,))]
    if keepdims:
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def matrix_norm(x, /, *, keepdims=False, ord="fro"):    # noqa: A002
    """The matrix norm of the last two axes: 'fro', 1, -1, inf, -inf with reductions where the
    slabs live; 'nuc', 2, -2 from singular values (a gathered copy)."""
    x = coerce.array(x)
    if x.ndim < 2:
        raise ValueError("matrix_norm needs an array of at least two dimensions")
    if ord == "fro":
        return vector_norm(x, axis=(-2, -1), keepdims=keepdims, ord=2)
    if ord in (1, -1, np.inf, -np.inf):
        a = abs(x)
        red_ax = -2 if ord in (1, -1) else -1
        s = coerce.array(reductions.sum(a, red_ax, None, None, True))
        pick = reductions.max if ord > 0 else reductions.min
        other = -1 if red_ax == -2 else -2
        res = coerce.array(coerce.own(pick(s, other, None, True)))
        if not keepdims:
            res = res.reshape(x.shape[:-2])
        rd = _real_dtype(x.dtype) if x.dtype.kind in "fc" else np.dtype(np.float64)
        return res if res.dtype == rd else res.astype(rd)
    if ord in ("nuc", 2, -2):
        a = _gather(x, "matrix_norm")
        return coerce.own(np.linalg.matrix_norm(a, keepdims=keepdims, ord=ord))
    raise ValueError(f"invalid ord {ord!r} for matrix_norm")


# -- factorizations and solves: a gathered copy below the limit, TSQR for tall-skinny ---------

def _gather(x, what):
    x = coerce.array(x)
    if chunks.big(x):
        raise MaterializeTooLarge(
            f"linalg.{what} of {x.nbytes} bytes: above the pool's materialize_limit "
            f"({x._a.pool.materialize_limit} bytes) this runs only for one tall-skinny matrix "
            f"(qr, svd, svdvals, lstsq); raise the limit with "
            f"pooltensor.init(materialize_limit=...)")
    return x.to_numpy()


def _tall(x):
    x = coerce.array(x)
    return x.ndim == 2 and x.shape[0] >= 4 * max(1, x.shape[1]) and chunks.big(x)


def _np(fn, *arrays, what, **kw):
    return coerce.own(fn(*[_gather(a, what) for a in arrays], **kw))


def cholesky(x, /, *, upper=False):
    """The Cholesky factor (lower, or upper when asked) of Hermitian positive-definite
    matrices."""
    res = np.linalg.cholesky(_gather(x, "cholesky"), upper=upper)
    return coerce.own(res)


def qr(x, /, *, mode="reduced"):
    """(Q, R) of matrices ('reduced' or 'complete'); TSQR for one tall-skinny matrix above the
    materialize limit (reduced)."""
    if mode not in ("reduced", "complete"):
        raise ValueError(f"mode must be 'reduced' or 'complete', not {mode!r}")
    if mode == "reduced" and _tall(x):
        q, r = tsqr.qr(coerce.array(x))
        return QRResult(q, coerce.own(r))
    q, r = np.linalg.qr(_gather(x, "qr"), mode=mode)
    return QRResult(coerce.own(q), coerce.own(r))


def svd(x, /, *, full_matrices=True):
    """(U, S, Vh) of matrices; TSQR-based for one tall-skinny matrix above the limit
    (full_matrices=False)."""
    if not full_matrices and _tall(x):
        u, s, vh = tsqr.svd(coerce.array(x))
        return SVDResult(coerce.own(u), coerce.own(s), coerce.own(vh))
    u, s, vh = np.linalg.svd(_gather(x, "svd"), full_matrices=full_matrices)
    return SVDResult(coerce.own(u), coerce.own(s), coerce.own(vh))


def svdvals(x, /):
    """The singular values of matrices, descending; from TSQR's R for one tall-skinny matrix
    above the limit."""
    if _tall(x):
        return coerce.own(tsqr.svdvals(coerce.array(x)))
    return _np(np.linalg.svdvals, x, what="svdvals")


def lstsq(a, b, /):
    """The least-squares solution of a @ x = b (pooltensor's own, not the standard's): for
    one tall-skinny `a` above the limit through TSQR (x = R^-1 Q^H b, Q^H b reduced where
    Q's rows live), else numpy.linalg.lstsq on gathered copies."""
    if _tall(a):
        q, r = tsqr.qr(coerce.array(a))
        b = coerce.array(b)
        qc = np.conjugate(q) if q.dtype.kind == "c" else q
        if b.ndim == 1:            # Q^H b: products and a sum over the rows, where they live
            qtb = reductions.sum(qc * b.reshape(b.shape[0], 1), 0)
        else:
            qtb = reductions.sum(qc.reshape(qc.shape + (1,)) *
                                 b.reshape(b.shape[0], 1, b.shape[1]), 0)
        return coerce.own(np.linalg.solve(r, np.asarray(coerce.array(qtb).to_numpy())))
    return coerce.own(np.linalg.lstsq(_gather(a, "lstsq"), _gather(b, "lstsq"))[0])


def solve(x1, x2, /):
    """The solution of x1 @ x = x2 (x2 a vector only when 1-D, as the standard says)."""
    a, b = _gather(x1, "solve"), _gather(x2, "solve")
    if b.ndim == 1:
        return coerce.own(np.linalg.solve(a, b[..., None])[..., 0] if a.ndim == 2 else
                          np.linalg.solve(a, np.broadcast_to(b, a.shape[:-1])[..., None])
                          [..., 0])
    return coerce.own(np.linalg.solve(a, b))


def inv(x, /):
    """The inverses of square matrices."""
    return _np(np.linalg.inv, x, what="inv")


def det(x, /):
    """The determinants of square matrices."""
    return _np(np.linalg.det, x, what="det")


def slogdet(x, /):
    """(sign, logabsdet) of square matrices."""
    s, l = np.linalg.slogdet(_gather(x, "slogdet"))
    return SlogdetResult(coerce.own(s), coerce.own(l))


def eigh(x, /):
    """(eigenvalues, eigenvectors) of Hermitian matrices, eigenvalues ascending."""
    w, v = np.linalg.eigh(_gather(x, "eigh"))
    return EighResult(coerce.own(w), coerce.own(v))


def eigvalsh(x, /):
    """The eigenvalues of Hermitian matrices, ascending."""
    return _np(np.linalg.eigvalsh, x, what="eigvalsh")


def pinv(x, /, *, rtol=None):
    """The Moore-Penrose pseudo-inverse (singular values below rtol times the largest are
    treated as zero; default max(M, N) * eps)."""
    a = _gather(x, "pinv")
    if rtol is None:
        rtol = max(a.shape[-2:]) * np.finfo(a.dtype).eps if a.dtype.kind in "fc" else 1e-15
    if isinstance(rtol, ndarray):
        rtol = rtol.to_numpy()
    return coerce.own(np.linalg.pinv(a, rcond=rtol))


def matrix_rank(x, /, *, rtol=None):
    """The number of singular values above rtol times the largest (default max(M, N) *
    eps)."""
    a = _gather(x, "matrix_rank")
    s = np.linalg.svd(a, compute_uv=False)
    if rtol is None:
        rtol = max(a.shape[-2:]) * np.finfo(s.dtype).eps
    elif isinstance(rtol, ndarray):
        rtol = rtol.to_numpy()[..., None]
    tol = s.max(axis=-1, keepdims=True) * np.asarray(rtol) if s.size else 0
    return coerce.own(np.count_nonzero(s > tol, axis=-1).astype(np.int64))


def matrix_power(x, n, /):
    """x raised to the integer power n (inverse first for negative n)."""
    return coerce.own(np.linalg.matrix_power(_gather(x, "matrix_power"), operator.index(n)))


__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul",
           "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer", "pinv",
           "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace", "vecdot",
           "vector_norm", "lstsq"]
