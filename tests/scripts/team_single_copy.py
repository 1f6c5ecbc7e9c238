"""The shared-memory team's single-copy allgather and two-shot allreduce (members read each
other's inputs, and parts, with cross-memory attach; allgather from 32 KiB of output, allreduce
from 256 KiB): sizes around where each starts, against numpy.

  sizes      allgather: odd byte counts just under, at and over the threshold (int8), wider
             dtypes, 2-D, in place, empty and a large odd one; every rank's result equals the
             stacked inputs; allreduce: element counts around it (int32, float32 sum in rank
             order bit for bit, float64 max, in place, more parts than slots hold); then the team says whether it went single-copy (expected where the
             system allows reading a sibling process, argv[2] == "expect")
  fallback   rank 1 sets POOLTENSOR_TEAM_CMA=0: the whole team stays on the staging slots
             (single_copy() == 0 on every rank) and the results are the same
  jit        allgather at the same sizes, and an allreduce, inside jax.jit (the XLA handler calls the team itself): equal
             to numpy, and the calls after the first finished in the handler
  mismatch   rank 0 starts single-copy at 1 MiB, the others at 32 KiB: a 512 KiB call is a
             CollectiveMismatch on every rank (not a hang), and the world works after
Prints "<mode> ok".
"""
import os
import sys

import numpy as np

import collectives
from collectives.errors import CollectiveMismatch

mode = sys.argv[1]
world = collectives.init()
rank, size = world.rank, world.size
THRESHOLD = 32 << 10          # allgather output
AR_THRESHOLD = 256 << 10      # allreduce
if mode == "fallback" and rank == 1:
    os.environ["POOLTENSOR_TEAM_CMA"] = "0"
if mode == "mismatch" and rank == 0:
    os.environ["POOLTENSOR_TEAM_CMA_MIN"] = str(1 << 20)


def data(r, dtype, shape):
    rng = np.random.default_rng(1000 + r)
    return rng.integers(-100, 100, size=shape).astype(dtype)


def check(dtype, shape, inplace=False):
    mine = data(rank, dtype, shape)
    want = np.stack([data(r, dtype, shape) for r in range(size)])
    if inplace:
        out = np.full((size,) + tuple(shape), 7, dtype)
        out[rank] = mine
        res = collectives.allgather(out[rank], out=out)
        assert res is out
    else:
        res = collectives.allgather(mine)
    assert res.shape == want.shape and res.dtype == want.dtype, (res.shape, res.dtype)
    assert np.array_equal(res, want), f"allgather {dtype} {shape} inplace={inplace} differs"


def check_sum(dtype, n, op="sum", inplace=False):
    rows = [data(r, dtype, (n,)) for r in range(size)]
    if np.dtype(dtype).kind == "f":
        rows = [r_ + np.asarray(0.37 * (i + 1), dtype) for i, r_ in enumerate(rows)]
    want = rows[0].copy()
    for r_ in rows[1:]:                  # rank order, one rounding per step: the engine's order
        want = want + r_ if op == "sum" else np.maximum(want, r_)
    x = rows[rank].copy()
    res = collectives.allreduce(x, op, out=x if inplace else None)
    assert (res is x) == inplace
    assert res.dtype == want.dtype and np.array_equal(res.view(np.uint8), want.view(np.uint8)), \
        f"allreduce {op} {dtype} n={n} inplace={inplace} differs"


def sweep():
    at = -(-THRESHOLD // size)            # the smallest input whose output reaches it
    for b in (at - 3, at - 1, at, at + 1, at + 5, 2 * at + 7):
        check(np.int8, (b,))
    check(np.int8, (at,), inplace=True)
    check(np.float32, (at // 4 + 1,))
    check(np.float64, (3, at // 24 + 1))
    check(np.float64, (at // 8 + 3,), inplace=True)
    check(np.int16, (0,))
    check(np.int8, (3_000_017,))
    check(np.int8, (5,))
    for n in (AR_THRESHOLD // 4 - 1, AR_THRESHOLD // 4, AR_THRESHOLD // 4 + 3 * size + 1):
        check_sum(np.int32, n)
    check_sum(np.float32, AR_THRESHOLD // 4 + 5)
    check_sum(np.float32, 700_001, inplace=True)
    check_sum(np.float64, AR_THRESHOLD // 8 + 1, op="max")
    check_sum(np.float32, 1_500_003)              # each part larger than the slots


team = None
if mode in ("sizes", "fallback"):
    sweep()
    team = world._get_team("world").native
    got = team.single_copy()
    if mode == "fallback":
        assert got == 0, f"rank {rank}: single_copy() {got} with a member that refuses it"
    elif len(sys.argv) > 2 and sys.argv[2] == "expect":
        assert got == 1, f"rank {rank}: single_copy() {got} where the system allows it"
    else:
        assert got in (0, 1), got
elif mode == "jit":
    import jax
    import jax.numpy as jnp

    import collectives.jax as cj

    gather = jax.jit(cj.allgather)
    at = -(-THRESHOLD // size)
    cases = [(np.int8, (at - 1,)), (np.int8, (at,)), (np.int8, (at + 3,)),
             (np.float32, (3, at // 12 + 1)), (np.int8, (1_500_007,))]
    gather(jnp.zeros(4, jnp.int8)).block_until_ready()       # the team, the fast path
    before = cj.stats()["fast"]
    for dtype, shape in cases:
        want = np.stack([data(r, dtype, shape) for r in range(size)])
        got = np.asarray(gather(jnp.asarray(data(rank, dtype, shape))))
        assert np.array_equal(got, want), f"jit allgather {dtype} {shape} differs"
    x = data(rank, np.float32, (300_001,)) + np.float32(0.25)
    want = data(0, np.float32, (300_001,)) + np.float32(0.25)
    for r in range(1, size):
        want = want + (data(r, np.float32, (300_001,)) + np.float32(0.25))
    got = np.asarray(jax.jit(cj.allreduce)(jnp.asarray(x)))
    assert np.array_equal(got, want), "jit allreduce differs"
    assert cj.stats()["fast"] - before == len(cases) + 1, cj.stats()
elif mode == "mismatch":
    x = np.ones((512 << 10) // size, np.int8)
    try:
        collectives.allgather(x)
    except CollectiveMismatch:
        pass
    else:
        raise AssertionError(f"rank {rank}: no CollectiveMismatch")
    check(np.int8, (1000,))
    check(np.int8, (2 << 20,))
print(f"{mode} ok", flush=True)
collectives.finalize()
