"""Seeded random arrays whose numbers do not depend on the member count or the slab size.

The element range is cut into fixed blocks of BLOCK elements, and block b is drawn from its
own generator, ``numpy.random.default_rng([seed, b])``. Whoever fills a slab (the script, or in
SPMD the rank that homes it) draws just the blocks that slab overlaps, so the array is the same
whatever the placement, member count or slab size, and ranks never exchange numbers.
``seed=None`` draws a fresh seed (in SPMD, rank 0's, shared with the others; a private
array's own).
"""
import numpy as np

from .creation import _fill, _new
from ..pool.runtime import current

BLOCK = 1 << 16      # elements per generator block: part of the numbers' definition, keep it


def _seed(seed, access):
    if seed is not None:
        return int(seed)
    pool = current()
    s = int(np.random.SeedSequence().entropy % (1 << 63))
    if pool.spmd and pool.size > 1 and access != "private":   # private: not collective
        s = pool.world.allgather_object(s)[0]
    return s


def _generate(shape, dtype, seed, draw, placement, access, what):
    x, fresh = _new(shape, dtype, placement, access,
                    what if seed is None else f"{what} seed {int(seed)}")
    seed = _seed(seed, access)
    memo = {}

    def block(b):
        got = memo.get(b)
        if got is None:
            memo.clear()                     # slabs are filled in order: one block is enough
            got = memo[b] = draw(np.random.default_rng([seed, b]), BLOCK)
        return got

    def values(e0, e1):
        parts = []
        for b in range(e0 // BLOCK, (e1 - 1) // BLOCK + 1):
            lo, hi = max(e0, b * BLOCK), min(e1, (b + 1) * BLOCK)
            parts.append(block(b)[lo - b * BLOCK:hi - b * BLOCK])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
    return _fill(x, fresh, values)


def random(shape, *, seed=None, dtype=np.float64, placement=None, access="readwrite"):
    """Uniform floats in [0, 1) (float32 or float64)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"random() makes float32 or float64, not {dtype}")
    return _generate(shape, dtype, seed, lambda g, n: g.random(n, dtype=dtype), placement,
                     access, "random")


def standard_normal(shape, *, seed=None, dtype=np.float64, placement=None, access="readwrite"):
    """Samples of the standard normal distribution (float32 or float64)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"standard_normal() makes float32 or float64, not {dtype}")
    return _generate(shape, dtype, seed, lambda g, n: g.standard_normal(n, dtype=dtype),
                     placement, access, "standard_normal")


def integers(low, high=None, shape=(), *, seed=None, dtype=np.int64, endpoint=False,
             placement=None, access="readwrite"):
    """Random integers in [low, high) (or [0, low) when high is None; [low, high] with
    endpoint=True), as numpy's Generator.integers."""
    dtype = np.dtype(dtype)
    np.random.default_rng(0).integers(low, high, 1, dtype=dtype, endpoint=endpoint)  # checks
    return _generate(shape, dtype, seed,
                     lambda g, n: g.integers(low, high, n, dtype=dtype, endpoint=endpoint),
                     placement, access, f"integers {low!r} {high!r} {endpoint}")
