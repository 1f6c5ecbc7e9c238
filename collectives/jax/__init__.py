"""Collectives on jax.Array, inside and outside jax.jit.

    import jax, jax.numpy as jnp
    import collectives.jax as cj

    @jax.jit
    def step(params, batch):
        grads = jax.grad(loss)(params, batch)
        return jax.tree.map(lambda g: cj.allreduce(g, "avg"), grads)

allreduce, allgather, reduce_scatter, broadcast and barrier have the eager collectives'
semantics, checks and bytes (collectives.allreduce and the rest): the same digests are compared
across ranks, so a jitted call meets an eager one of another rank as it would meet itself.

Inside jit each call is an XLA FFI custom call (collectives._jaxffi, C). Which path it takes:
- every rank on one machine, no forced algorithm (the shared-memory team spans the world):
  the handler calls the native team engine itself, no Python, no GIL, once the world's team
  exists (the first call, which creates it, runs through Python);
- other worlds (tcp between machines, hierarchical, POOLTENSOR_ALGO set): the handler calls
  back into Python, which runs the eager algorithm, in the same program order.
Calls run in program order on every rank (an ordered effect threads an XLA token through
them: collectives/jax/primitives.py), are never removed as dead code, and ranks that issue
collectives in different orders fail with CollectiveMismatch on every rank.

Outside jit (a concrete array) each function runs the eager collective and returns a jax.Array.

Errors inside jit reach the caller as jax.errors.JaxRuntimeError (XLA's error for a failed
custom call) when the result is used; its message starts with the pooltensor error's class
name (CollectiveMismatch, Timeout, PeerLost) and last_error() returns that typed error.

Transforms: jax.grad (allreduce(sum)'s transpose allreduces the cotangent: the ranks' losses
are summed; see primitives.py for why, and how that differs from mpi4jax), vmap (one call on
the stacked batch), jit of jit, donated arguments, float16 and bfloat16 (reduced in float32).
Not supported: min/max/prod under grad; pmap or shard_map over several devices of one process
(a rank is a process here, with one CPU device).

collectives.finalize() first waits for every jitted collective still running
(jax.effects_barrier()), then closes the world.
"""
import jax
import jax.numpy as jnp
import numpy as np

from .. import ops
from ..dtypes import ReduceOp, reduce_op
from . import bridge, primitives

__all__ = ["allreduce", "allgather", "reduce_scatter", "broadcast", "barrier", "last_error",
           "stats", "available"]

available = bridge.available
last_error = bridge.last_error
stats = bridge.stats


def _traced(x):
    return isinstance(x, jax.core.Tracer)


def _world(world):
    bridge.setup()
    w = ops._world(None) if world is None else world
    cur = ops._world(None)
    if w is not cur:
        raise ValueError("collectives.jax runs in the current world only (world=None)")
    return w


def _check_jax(x, what):
    if not isinstance(x, (jax.Array, np.ndarray, np.generic)) and not _traced(x):
        raise TypeError(f"{what} expects a jax.Array (or a numpy array), not {type(x).__name__}")


def allreduce(x, op="sum", *, world=None):
    """Reduce x elementwise over every rank; every rank gets the same bytes.

    op: 'sum', 'prod', 'min', 'max', 'avg' (floating dtypes) or a ReduceOp. Inside jit the
    gradient of 'sum' and 'avg' is defined (the cotangent is allreduced)."""
    _check_jax(x, "allreduce")
    w = _world(world)
    if not _traced(x):
        return ops.allreduce(_as_jax(x), op, world=w)
    rop = reduce_op(op)
    if rop is ReduceOp.AVG:
        dt = np.dtype(x.dtype)
        primitives.params(w, "allreduce", x.shape, dt, "avg")   # the avg dtype check
        if dt.itemsize == 2:
            # 16-bit floats: sum and divide in float32, round once (as the eager collective)
            wide = primitives.bind(w, "allreduce", x.astype(jnp.float32), "sum", divide=True)
            return wide.astype(x.dtype)
        return primitives.bind(w, "allreduce", x, "avg")
    return primitives.bind(w, "allreduce", x, rop.name.lower())


def allgather(x, *, world=None):
    """Concatenate x from every rank along a new leading axis: shape (size, *x.shape)."""
    _check_jax(x, "allgather")
    w = _world(world)
    if not _traced(x):
        return ops.allgather(_as_jax(x), world=w)
    return primitives.bind(w, "allgather", x)


def reduce_scatter(x, op="sum", *, world=None):
    """Reduce x over every rank and keep this rank's block: x has shape (size, *block)."""
    _check_jax(x, "reduce_scatter")
    w = _world(world)
    if not _traced(x):
        return ops.reduce_scatter(_as_jax(x), op, world=w)
    if x.ndim == 0 or x.shape[0] != w.size:
        raise ValueError(f"reduce_scatter needs an input of shape ({w.size}, ...), one block "
                         f"per rank; got {tuple(x.shape)}")
    rop = reduce_op(op)
    if rop is ReduceOp.AVG:
        dt = np.dtype(x.dtype)
        primitives.params(w, "reduce_scatter", x.shape, dt, "avg")
        if dt.itemsize == 2:
            wide = primitives.bind(w, "reduce_scatter", x.astype(jnp.float32), "sum", divide=True)
            return wide.astype(x.dtype)
        return primitives.bind(w, "reduce_scatter", x, "avg")
    return primitives.bind(w, "reduce_scatter", x, rop.name.lower())


def broadcast(x, root=0, *, world=None):
    """Every rank gets root's x; the others pass an array of the same shape and dtype."""
    _check_jax(x, "broadcast")
    w = _world(world)
    if not isinstance(root, (int, np.integer)) or not 0 <= root < w.size:
        raise ValueError(f"root {root!r} out of range for a world of {w.size}")
    if not _traced(x):
        return ops.broadcast(_as_jax(x), int(root), world=w)
    return primitives.bind(w, "broadcast", x, None, int(root))


def barrier(*, world=None):
    """Return once every rank has called barrier(). Inside jit it takes its place in the
    program order of the collectives (nothing else of the program waits for it)."""
    w = _world(world)
    if _tracing():
        primitives.bind_barrier(w)
        return None
    return ops.barrier(world=w)


def _tracing():
    """Whether a JAX trace (jit, grad, vmap...) is being built on this thread."""
    return not jax.core.trace_state_clean() if hasattr(jax.core, "trace_state_clean") else \
        _probe_tracing()


def _probe_tracing():
    return _traced(jnp.zeros(()) + 0)


def _as_jax(x):
    return x if isinstance(x, jax.Array) else jnp.asarray(x)
