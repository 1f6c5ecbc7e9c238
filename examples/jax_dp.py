"""Data-parallel training of a small MLP with JAX: the gradient allreduce is inside the jitted
step (collectives.jax), so each step is one compiled program per rank.

    mpiexec -n 2 python examples/jax_dp.py                 # or: python -m collectives.launch -n 2
    mpiexec -n 2 python examples/jax_dp.py --steps 300 --batch 256

Every rank starts from the same parameters (one seed), draws its own batches of synthetic data
(a fixed random "teacher" network plus noise, seeded by rank), computes its gradient, and the
ranks average the gradients with one allreduce per step (the parameters flattened into one
vector). Since every rank applies the same averaged gradient, the parameters stay bit for bit
the same on every rank; the script checks that at the end (allgather of the parameters) and
that the loss fell, and exits non-zero otherwise.
"""
import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import collectives
import collectives.jax as cj


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    p.add_argument("--batch", type=int, default=128, help="examples per rank per step")
    p.add_argument("--hidden", type=int, default=64, help="hidden units per layer")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate (plain SGD)")
    p.add_argument("--seed", type=int, default=0, help="seed of the parameters and data")
    return p.parse_args()


def init_mlp(key, sizes):
    params = []
    for k, (m, n) in zip(jax.random.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:])):
        params.append({"w": jax.random.normal(k, (m, n), jnp.float32) / np.sqrt(m),
                       "b": jnp.zeros(n, jnp.float32)})
    return params


def mlp(params, x):
    for layer in params[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, y):
    return jnp.mean((mlp(params, x) - y) ** 2)


def main():
    args = parse()
    world = collectives.init()
    rank, size = world.rank, world.size
    sizes = [16, args.hidden, args.hidden, 1]
    params = init_mlp(jax.random.PRNGKey(args.seed), sizes)            # same on every rank
    teacher = init_mlp(jax.random.PRNGKey(args.seed + 1000), [16, 32, 1])
    flat, unravel = ravel_pytree(params)

    @jax.jit
    def step(flat, key):
        kx, kn = jax.random.split(key)
        x = jax.random.normal(kx, (args.batch, 16), jnp.float32)
        y = mlp(teacher, x) + 0.01 * jax.random.normal(kn, (args.batch, 1), jnp.float32)
        loss, grads = jax.value_and_grad(loss_fn)(unravel(flat), x, y)
        g, _ = ravel_pytree(grads)
        g = cj.allreduce(g, "avg")                   # the ranks' mean gradient, in the step
        return flat - args.lr * g, cj.allreduce(loss, "avg")

    key = jax.random.fold_in(jax.random.PRNGKey(args.seed + 1), rank)  # each rank its data
    losses = []
    t0 = time.perf_counter()
    for i in range(args.steps):
        key, sub = jax.random.split(key)
        flat, loss = step(flat, sub)
        if i == 0:
            jax.block_until_ready(flat)
            t0 = time.perf_counter()                 # compiling is not training
        if i % max(1, args.steps // 10) == 0 or i == args.steps - 1:
            losses.append(float(loss))
            if rank == 0:
                print(f"step {i:4d}  loss {losses[-1]:.5f}", flush=True)
    jax.block_until_ready(flat)
    took = time.perf_counter() - t0

    every = np.asarray(collectives.allgather(np.asarray(flat)))
    same = all(every[r].tobytes() == every[0].tobytes() for r in range(size))
    fell = losses[-1] < 0.5 * losses[0]
    if rank == 0:
        per = took / max(1, args.steps - 1) * 1e3
        print(f"{size} ranks, {flat.size} parameters, {args.steps} steps: {per:.2f} ms a step "
              f"(after compiling); jitted collectives: {cj.stats()}")
        print(f"parameters bit-identical on every rank: {same}; loss {losses[0]:.4f} -> "
              f"{losses[-1]:.4f} ({'fell' if fell else 'did NOT fall'})", flush=True)
    collectives.finalize()
    if not (same and fell):
        sys.exit(1)


if __name__ == "__main__":
    main()
