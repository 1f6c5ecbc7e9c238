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


class Draw:
    """values(e0, e1) of a seeded random array: the blocks [e0, e1) overlaps, each from its
    own generator (a class, not a closure, so a plan can carry it to the members)."""

    PLAN_OK = True

    def __init__(self, seed, method, dtype, args=(), kw=None):
        self.seed, self.method, self.dtype = int(seed), method, np.dtype(dtype)
        self.args, self.kw = tuple(args), dict(kw or {})

    def __getstate__(self):
        return {k: getattr(self, k) for k in ("seed", "method", "dtype", "args", "kw")}

    def __setstate__(self, st):
        self.__dict__.update(st)

    def _block(self, b):
        memo = self.__dict__.setdefault("_memo", {})
        got = memo.get(b)
        if got is None:
            memo.clear()                     # slabs are filled in order: one block is enough
            g = np.random.default_rng([self.seed, b])
            if self.method not in ("random", "standard_normal", "integers"):
                raise ValueError(f"unknown random method {self.method!r}")
            got = memo[b] = getattr(g, self.method)(*self.args, BLOCK, dtype=self.dtype,
                                                    **self.kw)
        return got

    def __call__(self, e0, e1):
        parts = []
        for b in range(e0 // BLOCK, (e1 - 1) // BLOCK + 1):
            lo, hi = max(e0, b * BLOCK), min(e1, (b + 1) * BLOCK)
            parts.append(self._block(b)[lo - b * BLOCK:hi - b * BLOCK])
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _generate(shape, dtype, seed, method, args, kw, placement, access, what, replicas=None):
    x, fresh = _new(shape, dtype, placement, access,
                    what if seed is None else f"{what} seed {int(seed)}", replicas)
    seed = _seed(seed, access)
    return _fill(x, fresh, Draw(seed, method, dtype, args, kw))


def random(shape, *, seed=None, dtype=np.float64, placement=None, access="readwrite",
           replicas=None):
    """Uniform floats in [0, 1) (float32 or float64)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"random() makes float32 or float64, not {dtype}")
    return _generate(shape, dtype, seed, "random", (), {}, placement, access, "random",
                     replicas)


def standard_normal(shape, *, seed=None, dtype=np.float64, placement=None, access="readwrite",
                    replicas=None):
    """Samples of the standard normal distribution (float32 or float64)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"standard_normal() makes float32 or float64, not {dtype}")
    return _generate(shape, dtype, seed, "standard_normal", (), {}, placement, access,
                     "standard_normal", replicas)


def integers(low, high=None, shape=(), *, seed=None, dtype=np.int64, endpoint=False,
             placement=None, access="readwrite", replicas=None):
    """Random integers in [low, high) (or [0, low) when high is None; [low, high] with
    endpoint=True), as numpy's Generator.integers."""
    dtype = np.dtype(dtype)
    np.random.default_rng(0).integers(low, high, 1, dtype=dtype, endpoint=endpoint)  # checks
    return _generate(shape, dtype, seed, "integers", (low, high), {"endpoint": endpoint},
                     placement, access, f"integers {low!r} {high!r} {endpoint}", replicas)
