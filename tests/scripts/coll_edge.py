"""Single promises of the collectives API, one per mode (argv[1]); prints "<mode> ok".

Several were bugs when written; tests/test_collectives.py runs the ones still open as strict
xfails, so a fix shows up as XPASS (then drop the marker).

  zero_dim                 a 0-d array keeps its shape: allreduce -> (), allgather -> (size,),
                           broadcast -> (); reduce_scatter of a 0-d array is a ValueError
  algo_mismatch [cold] K:A0:A1 ...
                           for each triple, rank 0 calls collective K with algorithm A0, the
                           others with A1: CollectiveMismatch on every rank, at once (not a
                           Timeout that says a rank "did not arrive"); then a correct call
                           works. Without 'cold' both algorithms run once first (channels set
                           up); with it, the mismatched call is the first of either (give one
                           triple)
  dtype_alias              np.longlong and np.int64 (one dtype on LP64) are the same call
  jax_bfloat16             a JAX bfloat16 array in gives a JAX bfloat16 array out
  avg_half K               float16 'avg' of collective K is computed in float32 and rounded
                           once: no overflow through a float16 sum, same bytes as numpy's
                           float32 mean rounded to float16
"""
import sys
import time

import numpy as np

import collectives

mode = sys.argv[1]
world = collectives.init()
rank, size = world.rank, world.size

if mode == "zero_dim":
    x = np.array(rank + 1.0)
    r = collectives.allreduce(x)
    assert r.shape == (), f"allreduce of a 0-d array has shape {r.shape}"
    assert r == size * (size + 1) / 2
    g = collectives.allgather(x)
    assert g.shape == (size,), f"allgather of a 0-d array has shape {g.shape}"
    assert np.array_equal(g, np.arange(1, size + 1))
    b = collectives.broadcast(x)
    assert b.shape == () and b == 1.0, f"broadcast of a 0-d array: {b!r}"
    o = np.empty(())
    assert collectives.allreduce(x, out=o) is o
    try:
        collectives.reduce_scatter(np.float32(1.0))
    except ValueError:
        pass
    else:
        raise AssertionError("reduce_scatter of a 0-d array did not raise ValueError")

elif mode == "algo_mismatch":
    cold = sys.argv[2] == "cold"
    for triple in sys.argv[3 if cold else 2:]:
        kind, a0, a1 = triple.split(":")
        fn = getattr(collectives, kind)
        x = np.ones((size, 25_000), np.float32)     # 100 kB per rank: not a one-shot size
        if not cold:
            for a in (a0, a1):                       # whatever each algorithm sets up, on all
                fn(x, algorithm=a)
        mine = a0 if rank == 0 else a1
        t0 = time.monotonic()
        try:
            fn(x, algorithm=mine)
        except collectives.CollectiveMismatch:
            took = time.monotonic() - t0
            assert took < world.timeout / 2, f"{triple}: CollectiveMismatch after {took:.1f} s"
        except collectives.Timeout as e:
            raise AssertionError(f"rank {rank} asked for {kind} {mine!r}: Timeout after "
                                 f"{time.monotonic() - t0:.1f} s, not CollectiveMismatch: {e}")
        else:
            raise AssertionError(f"{kind} with {a0!r} on rank 0 and {a1!r} elsewhere went "
                                 f"unnoticed")
        r = collectives.allreduce(np.full(3, rank, np.int32))
        assert np.array_equal(r, np.full(3, size * (size - 1) // 2)), r

elif mode == "barrier_vs_allreduce":
    collectives.allreduce(np.ones(3))         # collectives have run: barriers are checked too
    try:
        if rank == 0:
            collectives.barrier()
        else:
            collectives.allreduce(np.ones(3))
        raise AssertionError("a barrier met by an allreduce went unnoticed")
    except collectives.CollectiveMismatch:
        pass
    world.barrier()                            # and the world is still usable
    assert collectives.allreduce(np.ones(2))[0] == size

elif mode == "dtype_alias":
    x = np.arange(5, dtype=np.longlong if rank == 0 else np.int64)
    r = collectives.allreduce(x)
    assert np.array_equal(r, np.arange(5) * size), r

elif mode == "jax_bfloat16":
    import jax
    import jax.numpy as jnp
    h = collectives.allreduce(jnp.full(9, 1.5, jnp.bfloat16))
    assert isinstance(h, jax.Array) and h.dtype == jnp.bfloat16, (type(h), h.dtype)
    assert np.array_equal(np.asarray(h, np.float32), np.full(9, 1.5 * size, np.float32))

elif mode == "avg_half":
    kind = sys.argv[2]
    rng = np.random.default_rng(5)
    xs = [np.r_[np.full(3, 40000.0), rng.standard_normal(1000) * 8].astype(np.float16)
          for _ in range(size)]            # 40000 averages to 40000; its sum is > 65504
    acc = xs[0].astype(np.float32)
    for x in xs[1:]:                       # rank order, in float32
        acc += x.astype(np.float32)
    want = (acc / np.float32(size)).astype(np.float16)
    algos = ["auto"] + collectives.algorithms.names(kind)
    for algo in algos:
        if kind == "allreduce":
            got = collectives.allreduce(xs[rank], "avg", algorithm=algo)
        else:
            got = collectives.reduce_scatter(np.stack([xs[rank]] * size), "avg",
                                             algorithm=algo)
        exp = want
        assert np.all(np.isfinite(got[:3])), f"{kind} {algo}: avg of 40000 gave {got[:3]}"
        if algo in collectives.algorithms.DETERMINISTIC or algo == "auto":
            bad = np.flatnonzero(got != exp)
            assert bad.size == 0, (f"{kind} {algo}: {bad.size} elements differ from the "
                                   f"float32 mean, e.g. {got[bad[0]]} vs {exp[bad[0]]}")

else:
    raise SystemExit(f"unknown mode {mode!r}")
print(f"{mode} ok", flush=True)
