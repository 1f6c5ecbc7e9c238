"""JAX in, JAX out: every collective takes a jax.Array and returns one with the right values.

Prints "jax ok" on success.
"""
import jax
import jax.numpy as jnp
import numpy as np

import collectives

world = collectives.init()
rank, size = world.rank, world.size


def is_jax(a):
    return isinstance(a, jax.Array)


x = jnp.arange(1000, dtype=jnp.float32) + rank
r = collectives.allreduce(x)
assert is_jax(r), type(r)
want = np.arange(1000, dtype=np.float32) * size + size * (size - 1) / 2
assert np.array_equal(np.asarray(r), want)

r = collectives.allreduce(jnp.full(7, rank + 1, jnp.int32), "max")
assert is_jax(r) and np.array_equal(np.asarray(r), np.full(7, size))

g = collectives.allgather(jnp.full((2, 3), rank, jnp.float32))
assert is_jax(g) and g.shape == (size, 2, 3)
assert np.array_equal(np.asarray(g)[:, 0, 0], np.arange(size))

b = collectives.broadcast(jnp.full(5, rank, jnp.float32), root=size - 1)
assert is_jax(b) and np.array_equal(np.asarray(b), np.full(5, size - 1))

s = collectives.reduce_scatter(jnp.ones((size, 4), jnp.float32) * (rank + 1))
assert is_jax(s) and np.array_equal(np.asarray(s), np.full(4, size * (size + 1) / 2))

a = collectives.allreduce_async(jnp.ones(300_000, jnp.float32)).wait(60)
assert is_jax(a) and float(a[-1]) == size

print("jax ok", flush=True)
