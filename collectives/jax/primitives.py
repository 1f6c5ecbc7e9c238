"""The JAX primitives behind collectives.jax: one per collective kind, lowered to the XLA FFI
handler of collectives._jaxffi, with their shape, batching and differentiation rules.

Order. Every call carries an *ordered effect* of its own (CollectiveEffect). JAX threads one
XLA token through every call with an ordered effect of one kind, in program order: each call
takes the token the previous one returned (its first operand and first result here), and a jitted
program takes the token of the previous program and returns it to the next (JAX's runtime tokens).
XLA never reorders two operations one of which consumes the other's output, so the calls run in
program order on every rank, whatever the scheduler would do with independent side-effecting
calls (it does reorder those: tests/test_jax.py shows it for three calls with
has_side_effect=True), and an ordered call is never removed as dead code. This is the mechanism
io_callback(ordered=True) uses; its hooks (jax._src.effects, the lowering context's tokens) are
JAX internals, used here in this one module and pinned by the tests, so a JAX release that
changes them fails here first.

Differentiation. allreduce(sum) is linear; its transpose is allreduce(sum) of the cotangent: the
program is read as a function of every rank's input whose loss is the *sum* of the ranks'
losses, so the gradient with respect to rank r's input is the sum over ranks of their
cotangents. (mpi4jax's transpose is the identity instead, which is right when every rank
computes the same loss from the reduced value and the loss is counted once; summing the
ranks' losses is what data-parallel training means by a global loss, and the identity would
give each rank only its own share.) allgather and reduce_scatter(sum) transpose into each
other, broadcast into an allreduce kept on the root, avg into avg; min, max and prod have no
derivative here (NotImplementedError).

Batching. vmap of allreduce or broadcast is one call on the stacked batch; of allgather, one
call whose result has the batch axis second (the ranks' axis comes first); of reduce_scatter,
one call on the input with the batch axis moved after the ranks' axis.
"""
import dataclasses
import types

import numpy as np

import jax
import jax.numpy as jnp
from jax._src import core, dispatch, effects
from jax._src.interpreters import ad, batching, mlir

from .. import algorithms
from ..dtypes import ReduceOp, dtype_code, is_floating, reduce_op
from ..ops import BARRIER_SIG, _sig

TARGET = "pooltensor_collective"
CODES = {"allreduce": 1, "allgather": 2, "reduce_scatter": 3, "broadcast": 4, "barrier": 5}


class CollectiveEffect(effects.Effect):
    """The ordered effect of every pooltensor collective inside a JAX program."""

    def __str__(self):
        return "PooltensorCollective"


EFFECT = CollectiveEffect()
for _kind in (effects.ordered_effects, effects.lowerable_effects,
              effects.control_flow_allowed_effects, effects.custom_derivatives_allowed_effects,
              effects.remat_allowed_effects):
    _kind.add_type(CollectiveEffect)

collective_p = core.Primitive("pooltensor_collective")
barrier_p = core.Primitive("pooltensor_barrier")
barrier_p.multiple_results = True


# ---- parameters -------------------------------------------------------------------------

def params(world, kind, shape, dtype, op=None, root=0, divide=False):
    """The primitive's parameters for a call of `kind` on an array of shape and dtype: what the
    eager collective computes per call (dtype code, native op, digests, algorithm). op 'avg'
    (or divide=True: a float32 sum standing in for a 16-bit avg, as the eager collective
    does it) divides the sum by the number of ranks in the handler."""
    dtype = np.dtype(dtype)
    arr = types.SimpleNamespace(shape=tuple(shape), dtype=dtype)
    rop = reduce_op(op) if op is not None else ReduceOp.SUM
    if op is not None:
        code = dtype_code(dtype)
        if rop is ReduceOp.AVG and not is_floating(dtype):
            raise TypeError(f"op 'avg' needs a floating dtype, not {dtype}")
    else:
        code = dtype_code(dtype) if dtype.name in _DT else 0
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    sig = BARRIER_SIG if kind == "barrier" else _sig(kind, arr, rop, root)
    algo = 0
    tsig = sig
    if kind == "allreduce":
        algo = 1 if nbytes <= algorithms.ONESHOT_MAX else 2
        tsig = sig ^ algo
    elif kind == "allgather":
        tsig = sig ^ algorithms.digest("shm")
    base = ReduceOp.SUM if rop is ReduceOp.AVG else rop
    avg = world.size if (rop is ReduceOp.AVG or divide) else 0
    return dict(kind=kind, op=int(base), sigop=int(rop), dtype=code, root=int(root), algo=algo,
                sig=_s64(sig), tsig=_s64(tsig), isroot=int(world.rank == root),
                size=world.size, avg=avg)


_DT = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
       "bfloat16", "float32", "float64"}


def _s64(v):
    v &= 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >> 63 else v


# ---- abstract evaluation ----------------------------------------------------------------

def _shape_out(kind, shape, size):
    if kind == "allgather":
        return (size,) + tuple(shape)
    if kind == "reduce_scatter":
        return tuple(shape[1:])
    return tuple(shape)


def _abstract(x, *, kind, size, **_):
    return core.ShapedArray(_shape_out(kind, x.shape, size), x.dtype), {EFFECT}


collective_p.def_effectful_abstract_eval(_abstract)
barrier_p.def_effectful_abstract_eval(lambda **_: ([], {EFFECT}))
collective_p.def_impl(lambda *a, **p: dispatch.apply_primitive(collective_p, *a, **p))
barrier_p.def_impl(lambda *a, **p: dispatch.apply_primitive(barrier_p, *a, **p))


# ---- lowering ---------------------------------------------------------------------------

def _lower(ctx, *args, kind, op, sigop, dtype, root, algo, sig, tsig, isroot, size, avg):
    token = ctx.tokens_in.get(EFFECT)
    sub = dataclasses.replace(ctx, avals_in=[core.abstract_token, *ctx.avals_in],
                              avals_out=[core.abstract_token, *ctx.avals_out])
    rule = jax.ffi.ffi_lowering(TARGET, has_side_effect=True)
    attrs = dict(kind=CODES[kind], op=op, dtype=dtype, root=root, algo=algo, sig=sig,
                 tsig=tsig, isroot=isroot, avg=avg)
    outs = rule(sub, token, *args, **{k: np.int64(v) for k, v in attrs.items()})
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({EFFECT: outs[0]})))
    return outs[1:]


mlir.register_lowering(collective_p, _lower, platform="cpu")
mlir.register_lowering(barrier_p, _lower, platform="cpu")


# ---- binding ----------------------------------------------------------------------------

def bind(world, kind, x, op=None, root=0, divide=False):
    """Bind the primitive for one call on x (any JAX value; a tracer inside jit)."""
    p = params(world, kind, x.shape, x.dtype, op, root, divide)
    return collective_p.bind(x, **p)


def bind_barrier(world):
    """Bind the barrier primitive."""
    barrier_p.bind(**params(world, "barrier", (), np.uint8))


# ---- batching ---------------------------------------------------------------------------

def _batch(args, dims, *, kind, sigop, root, avg, **_):
    (x,), (d,) = args, dims
    from .bridge import current_world
    w = current_world()
    opname = ReduceOp(sigop).name.lower() if kind in ("allreduce", "reduce_scatter") else None
    divide = bool(avg)
    if kind in ("allreduce", "broadcast"):
        return bind(w, kind, x, opname, root, divide), d
    if kind == "allgather":
        x = jnp.moveaxis(x, d, 0)
        return bind(w, kind, x), 1
    x = jnp.moveaxis(x, d, 1)              # reduce_scatter: (ranks, batch, ...)
    return bind(w, kind, x, opname, 0, divide), 0


batching.primitive_batchers[collective_p] = _batch


# ---- differentiation --------------------------------------------------------------------

def _linear(kind, op):
    return kind in ("allgather", "broadcast") or op == int(ReduceOp.SUM)


def _jvp(primals, tangents, **p):
    (x,), (t,) = primals, tangents
    if not _linear(p["kind"], p["op"]):
        raise NotImplementedError(
            f"collectives.jax: {p['kind']} with op {ReduceOp(p['op']).name.lower()} has no "
            f"derivative here; sum and avg have one")
    y = collective_p.bind(x, **p)
    if type(t) is ad.Zero:
        return y, ad.Zero.from_primal_value(y)
    return y, collective_p.bind(t, **p)


def _transpose(ct, x, **p):
    from .bridge import current_world
    w = current_world()
    kind = p["kind"]
    if type(ct) is ad.Zero:
        return [ad.Zero(x.aval)]
    if kind == "allreduce":
        return [collective_p.bind(ct, **p)]
    if kind == "allgather":
        return [bind(w, "reduce_scatter", ct, "sum")]
    if kind == "reduce_scatter":
        y = bind(w, "allgather", ct)
        return [y / w.size if p["avg"] else y]
    total = bind(w, "allreduce", ct, "sum")      # broadcast: the root's input reaches all
    return [total if p["isroot"] else jnp.zeros_like(total)]


ad.primitive_jvps[collective_p] = _jvp
ad.primitive_transposes[collective_p] = _transpose
