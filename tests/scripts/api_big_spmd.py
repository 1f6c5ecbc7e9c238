"""The chunked passes of sort, argsort, unique, cumulative_sum, nonzero, searchsorted, fft and
TSQR in SPMD (every rank a member, the chunks dealt out among the ranks), run by
tests/test_api_big.py under mpiexec and the launcher: each result against numpy, and the same
bytes on every rank. The materialize limit is a few hundred bytes, so a few hundred elements
take the chunked passes.

    python -m collectives.launch -n 2 tests/scripts/api_big_spmd.py
"""
import numpy as np

import pooltensor as pt
from pooltensor.ops import chunks
from spmd_check import SLAB, load_all_modules
from spmd_check import same_bytes as _same_bytes

pool = pt.init(slab_size=SLAB, memory=4 << 20, cache_bytes=8 * SLAB, materialize_limit=2048)
assert pool.role == "spmd", pool.role
load_all_modules()


def same_bytes(res, what):
    """Every rank holds the same bytes (read past the materialize limit)."""
    _same_bytes(chunks.read(res), what)


def check(got, want, what, atol=0.0):
    got_np = chunks.read(got)
    assert got_np.dtype == np.asarray(want).dtype, (what, got_np.dtype)
    np.testing.assert_allclose(got_np, want, atol=atol, err_msg=what)
    same_bytes(got, what)
    pt.sync()


rng = np.random.default_rng(3)
a = rng.integers(-20, 20, 600).astype(np.float64)
a[::29] = np.nan
x = pt.asarray(a)
check(pt.sort(x), np.sort(a), "sort")
check(pt.argsort(x), np.argsort(a, kind="stable"), "argsort")
check(pt.argsort(x, descending=True), np.flip(599 - np.argsort(np.flip(a), kind="stable")),
      "argsort descending")
check(pt.unique_values(x), np.unique(a, equal_nan=False), "unique_values")
check(pt.unique_counts(x).counts, np.unique(a, return_counts=True, equal_nan=False)[1],
      "unique_counts")
want = np.unique(a, return_index=True, return_inverse=True, return_counts=True,
                 equal_nan=False)
for got, w, what in zip(pt.unique_all(x), want, ("values", "indices", "inverse", "counts")):
    check(got, w.astype(np.int64) if what != "values" else w, "unique_all " + what)
ti = rng.integers(-600, 600, 400)
check(pt.take(x, pt.asarray(ti)), np.take(a, ti), "take with a big index array")
b = rng.integers(-3, 4, (90, 7)).astype(np.int32)
y = pt.asarray(b)
check(pt.cumulative_sum(y, axis=0), np.cumsum(b, axis=0), "cumulative_sum axis 0")
check(pt.cumulative_sum(y, axis=1, include_initial=True),
      np.concatenate([np.zeros((90, 1), np.int64), np.cumsum(b, axis=1)], axis=1),
      "cumulative_sum axis 1")
check(pt.sort(y, axis=0), np.sort(b, axis=0), "sort axis 0")
for got, want in zip(pt.nonzero(y), np.nonzero(b)):
    check(got, want.astype(np.int64), "nonzero")
for got, want in zip(pt.nonzero(y[:9]), np.nonzero(b[:9])):     # fits: each rank's own copy
    check(got, want.astype(np.int64), "nonzero of a small array")
s = np.sort(rng.random(400))
nd = rng.random(100)
check(pt.searchsorted(pt.asarray(s), pt.asarray(nd)), np.searchsorted(s, nd), "searchsorted")
c = rng.random((60, 8))
check(pt.fft.fft(pt.asarray(c), axis=1), np.fft.fft(c, axis=1), "fft", atol=1e-12)
t = rng.random((200, 3))
q, r = pt.linalg.qr(pt.asarray(t))
same_bytes(q, "tsqr Q")
np.testing.assert_allclose(chunks.read(q) @ r.to_numpy(), t, atol=1e-12)
check(pt.linalg.svdvals(pt.asarray(t)), np.linalg.svd(t, compute_uv=False), "svdvals",
      atol=1e-12)
# small results are private copies on each rank; they mix with shared arrays
m = pt.mean(y, axis=0)
assert m.access == "private", m.access
check(y - m, b - b.mean(axis=0), "shared minus a private small result", atol=1e-12)
check(pt.sqrt(pt.sum(y * y)), np.sqrt((b * b).sum()), "xp.f(xp.g(x))", atol=1e-12)
pt.finalize()
print("api_big_spmd ok")
