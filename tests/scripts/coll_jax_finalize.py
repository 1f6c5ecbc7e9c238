"""collectives.finalize() right after dispatching a jitted collective (JAX returns before the
program has run): finalize waits for the program (jax.effects_barrier())
before closing the world, so the result is whole on every rank and nothing hangs.

Prints "jax finalize ok".
"""
import time

import jax
import jax.numpy as jnp
import numpy as np

import collectives
import collectives.jax as cj

w = collectives.init()
m = jnp.ones((1200, 1200), jnp.float32) / 1200


@jax.jit
def f(x, m):
    m = m @ m @ m                     # a second or so of work before the collectives
    return cj.allgather(cj.allreduce(x * m[0, :1000]) * 2)


jax.block_until_ready(f(jnp.ones(1000, jnp.float32), m))    # compiled, team made
t0 = time.perf_counter()
y = f(jnp.full(1000, w.rank + 1.0, jnp.float32), m)         # dispatched, not waited for
dispatched = time.perf_counter() - t0
size = w.size
collectives.finalize()
want = np.full((size, 1000), size * (size + 1) / 1200, np.float32)     # m @ m @ m == m
assert np.allclose(np.asarray(y), want, rtol=1e-5), np.asarray(y)[:, :3]
print(f"jax finalize ok (dispatch returned after {dispatched * 1e3:.0f} ms)", flush=True)
