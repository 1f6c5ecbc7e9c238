"""Blocks of pool arrays for code the user writes: map_blocks (a function on each block,
where the block lives) and local_blocks (the blocks this process is responsible for).

map_blocks runs through the executor like any elementwise operation, with the function as
the kernel (kernels.Func): in SPMD each rank runs it on the blocks it homes; in a plain script
the member processes run it on theirs (the function travels by value, cloudpickle), and
memory servers only when started with --allow-code.
"""
import numpy as np

from ..array.array import ndarray
from ..cache import prefetch
from ..cache.layout import contiguous
from . import executor, kernels


def _first(v):
    """A one-element-per-axis numpy sample of an operand (for map_blocks' result dtype)."""
    if isinstance(v, ndarray):
        if v.size == 0:
            return np.empty((0,) * max(1, v.ndim), v.dtype)
        return v[(slice(0, 1),) * v.ndim].to_numpy() if v.ndim else np.asarray(v.to_numpy())
    if isinstance(v, np.ndarray) and v.ndim:
        return v[(slice(0, 1),) * v.ndim]
    return v


def map_blocks(fn, x, *args, dtype=None):
    """pooltensor.map_blocks(fn, x, *args, dtype=None): a new pool array, fn applied to each
    slab-aligned block of x where the block lives, with the matching parts of args (pool
    arrays and numpy arrays broadcast with x, scalars as they are).

    In a plain script, the member processes run fn on the blocks they home (fn travels by
    value: lambdas and closures work; whatever it captures is copied to each member). fn must
    work elementwise-alike: its result for a block is broadcast to the block's shape and cast
    to the result's dtype. The result's shape is numpy's broadcast of x and args; its dtype is
    `dtype`, else that of fn applied to one element of each."""
    if not isinstance(x, ndarray):
        raise TypeError(f"map_blocks takes a pool array, not {type(x).__name__}")
    vals = [np.asarray(v) if isinstance(v, (list, tuple)) else v for v in args]
    shape = np.broadcast_shapes(x.shape, *[tuple(v.shape) for v in vals
                                           if isinstance(v, (ndarray, np.ndarray))])
    if dtype is None:
        dtype = np.asarray(fn(_first(x), *[_first(v) for v in vals])).dtype
    out = executor.new_like(shape, dtype, like=x if tuple(x.shape) == shape else None,
                   what=f"map_blocks {getattr(fn, '__qualname__', type(fn).__name__)} result")
    return map_into(fn, out, x, *vals)


def map_into(fn, out, *operands):
    """out = fn(*operands), computed blockwise where out's slabs live.

    For each block of `out` this process handles (SPMD: the ones it homes; a plain script:
    its own, while its member processes do theirs), fn is called on numpy arrays: the
    matching part of every operand (pool arrays and numpy arrays broadcast to the block's
    shape, scalars as they are), and its result is cast into the block (numpy's broadcasting,
    'unsafe' casting as numpy's assignment). Returns once the writes are visible everywhere
    (SPMD: the pool's sync)."""
    executor.run(kernels.Func(fn), [out],
                 [np.asarray(v) if isinstance(v, (list, tuple)) else v for v in operands],
                 what=f"map_blocks {getattr(fn, '__qualname__', type(fn).__name__)}")
    return out


def local_blocks(x):
    """The blocks of pool array x this process is responsible for, as (index, numpy array).

    index: a tuple of slices (step 1, one per axis) into x; the array holds x[index] (read-only
    when it is a view of pool memory or of a cache frame; keep it only as long as needed).
    SPMD (for a shared array): the blocks of the units this rank homes (executor.units()), so
    every element is yielded on exactly one rank, mostly from local memory; a plain script (or a
    private array): every block, streamed through the cache with the next blocks prefetched.
    In C order. Not collective: combine per-rank results with allreduce/allgather."""
    pool = x._a.pool
    pool.check_open()
    coll = executor.collective(x)
    mine = [u for u in executor.units(x) if executor._mine(pool, u[2], coll)]
    if not mine:
        return
    scratch = executor._Scratch()
    op = executor._Op(x, x.ndim)
    contig = contiguous(x._shape, x._strides, x.itemsize)
    it = x.itemsize
    depth = prefetch.limit(pool)
    a = x._a
    for i, (e0, e1, _) in enumerate(mine):
        for nxt in mine[i + 1:i + 2]:
            lo = x._off + nxt[0] * it if contig else None
            if lo is not None:
                S = pool.slab_size
                k0, k1 = lo // S, (x._off + nxt[1] * it - 1) // S
                for k in range(k0, min(k1, k0 + depth) + 1):
                    if a.members[k] != pool.me:
                        prefetch.issue(pool, a, k)
        bx = executor.boxes(x._shape, e0, e1)
        if contig:
            flat = executor.read_part(x, x._off + e0 * it, (e1 - e0,), (it,), scratch, "flat")
            pos = 0
            for box, cnt in bx:
                yield box, flat[pos:pos + cnt].reshape(executor._box_shape(box))
                pos += cnt
        else:
            for box, _ in bx:
                yield box, op.part(box, scratch, "box")
