"""collectives.jax inside jax.jit, on every rank of a real world, against the eager collectives.

One launch runs every case (compiling is the cost, so each dtype is one jitted program):
- every collective (allreduce sum/max/avg, allgather, broadcast, reduce_scatter) x every dtype
  x shapes 0-d, empty, odd, 2-d: the jitted result has the eager one's shape, dtype and bytes;
- program order: three calls of different shapes whose inputs are ready in a different order
  on each rank (XLA runs independent side-effecting calls as their inputs become ready);
- ranks that issue two collectives in different orders: CollectiveMismatch on every rank,
  then the world is usable;
- jax.grad through allreduce (sum, avg), allgather, reduce_scatter and broadcast against
  central differences of the loss summed over ranks; vmap against the unbatched calls;
- jit of jit, donated arguments, barrier inside jit, *_async requests in flight around a
  jitted call, the fast path taken: on a one-machine world every kind, at one slot's worth
  and at 2 MiB, runs in the handler alone (no call comes to Python).

Prints "jax jit ok" on success.
"""
import os

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import collectives  # noqa: E402
import collectives.jax as cj  # noqa: E402

w = collectives.init()
rank, size = w.rank, w.size
DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
          "bfloat16", "float32", "float64"]
if os.environ.get("POOLTENSOR_JAX_QUICK"):      # runs that repeat the full one on another path
    DTYPES = ["int8", "uint64", "bfloat16", "float32"]
SHAPES = [(), (0,), (7,), (3, 5)]


def same(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, a.dtype, b.shape, b.dtype)
    assert a.tobytes() == b.tobytes(), (what, a, b)


def data(shape, dtype, salt):
    rng = np.random.default_rng(1000 * rank + salt)
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    if dt.kind in "iu":
        return jnp.asarray(rng.integers(0, 20, shape).astype(dt))
    return jnp.asarray((rng.standard_normal(shape) * 4).astype(dt))


# ---- every collective x dtype x shape: jit against eager ----------------------------------
for dtype in DTYPES:
    floating = dtype.startswith(("float", "bfloat"))
    xs = [data(s, dtype, i) for i, s in enumerate(SHAPES)]
    stacks = [data((size,) + s, dtype, 10 + i) for i, s in enumerate(SHAPES)]

    def program(xs, stacks):
        out = []
        for x, st in zip(xs, stacks):
            out += [cj.allreduce(x), cj.allreduce(x, "max"), cj.allgather(x),
                    cj.broadcast(x, root=size - 1), cj.reduce_scatter(st)]
            if floating:
                out += [cj.allreduce(x, "avg"), cj.reduce_scatter(st, "avg")]
        return out

    got = jax.jit(program)(xs, stacks)
    want = []
    for x, st in zip(xs, stacks):
        want += [collectives.allreduce(x), collectives.allreduce(x, "max"),
                 collectives.allgather(x), collectives.broadcast(x, root=size - 1),
                 collectives.reduce_scatter(st)]
        if floating:
            want += [collectives.allreduce(x, "avg"), collectives.reduce_scatter(st, "avg")]
    assert len(got) == len(want)
    for i, (g, e) in enumerate(zip(got, want)):
        same(g, e, f"{dtype} result {i}")
    # outside jit: the same functions give the eager results too
    same(cj.allreduce(xs[2]), collectives.allreduce(xs[2]), f"{dtype} eager")
print(f"rank {rank}: every collective x dtype x shape ok", flush=True)

# ---- program order: three calls, inputs ready in a different order on each rank ------------
a = jnp.ones((300, 300), jnp.float32)
b = jnp.ones(16, jnp.float32)
c = jnp.ones(5, jnp.float32)


@jax.jit
def three(a, b, c):
    slow = lambda v: (v @ v @ v)[0, :v.shape[0]] if v.ndim == 2 else v  # noqa: E731
    if rank % 2 == 0:
        return cj.allreduce(slow(a)), cj.allreduce(b * 2), cj.allreduce(c * 3)
    return cj.allreduce(a[0] * 0 + 300.0 ** 2), cj.allreduce(b * 2), \
        cj.allreduce(slow(jnp.ones((300, 300), jnp.float32))[:5] * 0 + c * 3)


for _ in range(3):
    r1, r2, r3 = three(a, b, c)
    same(r1, np.full(300, 90000.0 * size, np.float32), "order 1")
    same(r2, np.full(16, 2.0 * size, np.float32), "order 2")
    same(r3, np.full(5, 3.0 * size, np.float32), "order 3")
print(f"rank {rank}: program order ok", flush=True)

# ---- rank-divergent order: CollectiveMismatch on every rank, never a hang -----------------
if size > 1:
    def diverge(x):
        if rank == 0:
            return cj.allreduce(x), cj.allgather(x)
        g = cj.allgather(x)
        return cj.allreduce(x), g
    try:
        jax.block_until_ready(jax.jit(diverge)(jnp.ones(4, jnp.float32)))
        raise AssertionError("ranks in different orders did not fail")
    except jax.errors.JaxRuntimeError as e:
        assert "CollectiveMismatch" in str(e), e
        assert isinstance(cj.last_error(), collectives.CollectiveMismatch), cj.last_error()
    same(jax.jit(cj.allreduce)(jnp.ones(3, jnp.float32)), np.full(3, size, np.float32), "after")
    print(f"rank {rank}: divergent order ok", flush=True)

# ---- grad against central differences of the loss summed over ranks ------------------------
wts = jnp.asarray(np.random.default_rng(7 + rank).standard_normal((size, 3)))


def losses():
    return {
        "allreduce": lambda x: jnp.sum(jnp.sin(cj.allreduce(x)) * wts),
        "avg": lambda x: jnp.sum(cj.allreduce(x, "avg") ** 2 * wts),
        "allgather": lambda x: jnp.sum(jnp.cos(cj.allgather(x))[:, 0] * wts),
        "reduce_scatter": lambda x: jnp.sum(cj.reduce_scatter(x) ** 3 * wts[0]),
        "broadcast": lambda x: jnp.sum(jnp.tanh(cj.broadcast(x, root=size - 1)) * wts),
    }


x0 = jnp.asarray(np.random.default_rng(3 + rank).standard_normal((size, 3)))
eps = 1e-6
for name, f in losses().items():
    g = jax.jit(jax.grad(f))(x0)
    total = jax.jit(lambda x: cj.allreduce(f(x)))      # the loss summed over ranks
    num = np.zeros((size, 3))
    for s in range(size):                               # perturb rank s's element (i, j)
        for i in range(size):
            for j in range(3):
                d = np.zeros((size, 3))
                if rank == s:
                    d[i, j] = eps
                up, down = float(total(x0 + d)), float(total(x0 - d))
                if rank == s:
                    num[i, j] = (up - down) / (2 * eps)
    assert np.allclose(np.asarray(g), num, rtol=1e-5, atol=1e-6), (name, np.asarray(g), num)
try:
    jax.grad(lambda x: jnp.sum(cj.allreduce(x, "max")))(x0)
    raise AssertionError("grad of max allreduce did not refuse")
except NotImplementedError:
    pass
print(f"rank {rank}: grad ok", flush=True)

# ---- vmap: one call on the stacked batch ------------------------------------------------
xb = jnp.asarray(np.random.default_rng(rank).standard_normal((4, size, 3)))
same(jax.jit(jax.vmap(cj.allreduce))(xb), collectives.allreduce(xb), "vmap allreduce")
same(jax.vmap(cj.allgather)(xb), np.moveaxis(np.asarray(collectives.allgather(xb)), 0, 1),
     "vmap allgather")
same(jax.jit(jax.vmap(cj.allgather, in_axes=1, out_axes=1))(xb),
     collectives.allgather(np.moveaxis(np.asarray(xb), 1, 0)),
     "vmap allgather axis 1")
same(jax.jit(jax.vmap(cj.reduce_scatter))(xb),
     collectives.reduce_scatter(np.moveaxis(np.asarray(xb), 0, 1)), "vmap reduce_scatter")
before = cj.stats()["fast"] + cj.stats()["slow"]
jax.block_until_ready(jax.jit(jax.vmap(cj.allreduce))(xb))
assert cj.stats()["fast"] + cj.stats()["slow"] == before + 1, "vmap made more than one call"
print(f"rank {rank}: vmap ok", flush=True)

# ---- jit of jit, donated arguments, barrier inside jit, the fast path ---------------------
inner = jax.jit(lambda x: cj.allreduce(x) + 1)
outer = jax.jit(lambda x: inner(x) * 2 + cj.allreduce(x))
same(outer(jnp.ones(5)), np.full(5, (size + 1) * 2 + size, np.float64), "jit of jit")
donate = jax.jit(lambda x: cj.allreduce(x) * 2, donate_argnums=0)
same(donate(jnp.full(9, 2.0, jnp.float32)), np.full(9, 4.0 * size, np.float32), "donated")


@jax.jit
def with_barrier(x):
    y = cj.allreduce(x)
    cj.barrier()
    return cj.allgather(y)


same(with_barrier(jnp.ones(2, jnp.int32)), np.full((size, 2), size, np.int32), "barrier")
# *_async requests in flight: a jitted call runs after them (through Python, on their thread)
for i in range(5):
    reqs = [collectives.allreduce_async(np.full(70000, rank + i, np.float32)) for _ in range(2)]
    got = jax.jit(cj.allreduce)(jnp.full(3, float(i), jnp.float32))
    for r in reqs:
        same(r.wait(60), np.full(70000, sum(q + i for q in range(size)), np.float32), "async")
    same(got, np.full(3, float(i * size), np.float32), "jit after async")
same(jax.jit(cj.allreduce)(jnp.ones(3, jnp.float32)), np.full(3, size, np.float32), "rebound")

# every kind, one slot's worth and several (2 MiB: two-shot, slots reused), in one program:
# on a one-machine world every call is the handler's alone, none comes to Python
total = sum(q + 1 for q in range(size))


def every_kind(small, big):
    out = []
    for v in (small, big):
        out += [cj.allreduce(v), cj.allreduce(v, "avg"), cj.allreduce(v.astype(jnp.float16)),
                cj.allgather(v), cj.reduce_scatter(v.reshape(size, -1)), cj.broadcast(v, size - 1)]
    cj.barrier()
    return out


kinds = jax.jit(every_kind)
args = [jnp.full(n, rank + 1, jnp.float32) for n in (256 * size, (1 << 19) * size)]
jax.block_until_ready(kinds(*args))                  # compiled, the team bound
before = cj.stats()
jax.block_until_ready(kinds(*args))
got = kinds(*args)
for i, v in enumerate(args):
    ar, avg, f16, ag, rs, bc = got[6 * i:6 * i + 6]
    n = v.shape[0]
    same(ar, np.full(n, total, np.float32), "allreduce, every kind")
    same(avg, np.full(n, total / size, np.float32), "avg, every kind")
    same(f16, np.full(n, total, np.float16), "float16, every kind")
    same(ag, np.repeat(np.arange(1, size + 1, dtype=np.float32)[:, None], n, 1), "allgather")
    same(rs, np.full(n // size, total, np.float32), "reduce_scatter, every kind")
    same(bc, np.full(n, size, np.float32), "broadcast, every kind")
after = cj.stats()
if w._direct:
    assert after["slow"] == before["slow"], (before, after)
    assert after["fast"] - before["fast"] == 2 * 13, (before, after)   # 2 runs x 13 calls

st = cj.stats()
if w._direct:
    assert st["bound"] and st["fast"] > 0, st
print(f"rank {rank}: paths {st}", flush=True)
collectives.finalize()
print("jax jit ok", flush=True)
