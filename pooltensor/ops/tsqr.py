"""Tall-skinny QR (TSQR) of a pool matrix spread by rows, and the SVD built on it.

For an (m, n) matrix with m much larger than n, cut into row chunks (chunks.py; each chunk
factored where its first row lives: SPMD ranks, a plain script's members):

1. each chunk A_i is factored by numpy, A_i = Q_i R_i; Q_i is written into the result Q's
   rows where they live, R_i (at most n x n) is kept;
2. the R_i are exchanged (SPMD: one allgather) and stacked, and that small stack is factored
   once more, [R_1; R_2; ...] = Q2 R (the same on every rank);
3. each chunk's rows of Q become Q_i times its block of Q2, in place.

A = Q R then, with Q's columns orthonormal. Nothing larger than a chunk and the stack of the
R_i (chunks times n x n) is ever held by one process. svd: A = Q R, R = U_r S Vh, so U = Q U_r
(a matmul with a small right operand, computed where Q's rows live); svdvals needs only R.
"""
import numpy as np

from . import chunkjobs, chunks, executor, products


def _row_step(a):
    n = a.shape[1]
    return max(chunks.rows(a), n)


def r_factor(a):
    """R of the reduced QR of pool matrix a (m >= n), without forming Q."""
    parts = chunks.ranges(a.shape[0], _row_step(a))
    rs = chunks.run(chunkjobs.RFactor(), parts, a, [a])
    return np.linalg.qr(np.concatenate(rs, axis=0), mode="r")


def qr(a):
    """(Q, R): the reduced QR of pool matrix a (m >= n); Q a pool array placed with a's
    rows, R numpy (n x n)."""
    m, n = a.shape
    dt = np.linalg.qr(np.zeros((1, 1), a.dtype))[0].dtype
    q = executor.new_like((m, n), dt, like=a if a.dtype == dt else None, what="tsqr Q")
    parts = chunks.ranges(m, _row_step(a))
    rs = chunks.run(chunkjobs.QRRows(), parts, a, [a, q], outs=[q])
    q2, r = np.linalg.qr(np.concatenate(rs, axis=0), mode="reduced")
    q2_at = np.concatenate([[0], np.cumsum([ri.shape[0] for ri in rs])]).astype(np.int64)
    job = chunkjobs.QRRows([r0 for r0, _ in parts], q2, q2_at)
    chunks.run(job, parts, a, [a, q], outs=[q])
    return q, r


def svd(a):
    """(U, S, Vh), the reduced SVD of tall-skinny pool matrix a: U a pool array, S and Vh
    numpy."""
    q, r = qr(a)
    ur, s, vh = np.linalg.svd(r, full_matrices=False)
    return products.matmul(q, ur), s, vh


def svdvals(a):
    """The singular values of tall-skinny pool matrix a (from R alone)."""
    return np.linalg.svd(r_factor(a), compute_uv=False)
