"""Collective operations for numpy arrays, JAX arrays and any buffer: allreduce, allgather,
reduce_scatter, broadcast, barrier, and their *_async forms.

Each call normalizes its arguments, builds a digest of them (kind, dtype, shape, op, root) that
every rank compares before moving a byte, picks an algorithm, and runs it. Non-contiguous inputs
are copied to a contiguous array first (documented, not an error). Every call is numbered and,
when a rank cannot finish it, given up on every rank (collectives/calls.py).
"""
import concurrent.futures
import threading
import time

import numpy as np

from . import algorithms, counters
from .algorithms import direct, shm
from .calls import KINDS
from .dtypes import ReduceOp, dtype_code, is_floating, reduce_op
from .errors import Finalized
from .world import current as _current, finalized as _finalized, init

_KIND = {"allreduce": 1, "allgather": 2, "reduce_scatter": 3, "broadcast": 4}
BARRIER_SIG = 0xBA771E5C0FFEE      # the digest of a barrier run as a zero-byte allreduce
_DIRECT = algorithms.digest("direct")


# A callable run before every eager collective, or None: collectives.jax sets it to
# jax.effects_barrier, so that a call made here never overtakes a jitted program still running
# its collectives on the same team (JAX dispatches asynchronously).
FENCE = None


def _world(world):
    if FENCE is not None:
        FENCE()
    if world is not None:
        if world._closed:
            raise Finalized("collective on a finalized world (collectives.finalize() or "
                            "World.close()); collectives.init() starts a new one",
                            rank=world.rank, host=world.host)
        return world
    w = _current()
    if w is not None:
        return w
    if _finalized():
        raise Finalized("collective after collectives.finalize(); collectives.init() starts "
                        "a new world")
    return init()


def _call(w, kind, fn, *args, timeout=None):
    """fn(*args) as collective call number n of the world (KINDS[kind]): given up on every
    rank when it fails on one (collectives/calls.py)."""
    calls = w._calls
    calls.begin(KINDS[kind], timeout)
    t0 = time.perf_counter()
    try:
        res = fn(*args)
    except BaseException as e:
        _count(w, kind, args, t0, e)
        _failed(calls, e)
    calls.end()
    _count(w, kind, args, t0, None)
    return res


def _count(w, kind, args, t0, exc):
    """Count the whole call as the caller saw it (the "world" transport of the native
    counters: one native call per collective; its transfers are counted natively as well)."""
    nbytes = getattr(args[1], "nbytes", 0) if len(args) > 1 else 0
    try:
        w._ctx.stats_record(-1, "world", kind, int(nbytes), counters.status_of(exc),
                            time.perf_counter() - t0)
    except ValueError:           # the context closed under us (finalize in another thread)
        pass


def _failed(calls, e):
    err = calls.failed(e)
    if err is e:
        raise e
    raise err from None


def _aligned_empty(shape, dtype):
    """An empty array whose data is 64-byte aligned (SIMD, zero-copy DLPack into JAX)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(n + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + n].view(dtype).reshape(shape)


def _as_array(x):
    """(numpy array, function turning a numpy result back into x's kind)."""
    if isinstance(x, np.ndarray):
        return (x if x.flags.c_contiguous else np.ascontiguousarray(x)), None
    if type(x).__module__.startswith(("jax", "jaxlib")):
        arr = np.asarray(x)
        return (arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)), _to_jax
    try:
        arr = np.asarray(memoryview(x))
        return (arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)), None
    except TypeError:
        raise TypeError(f"expected a numpy array, a JAX array or a buffer, not "
                        f"{type(x).__name__}") from None


def _to_jax(out):
    """Zero-copy through DLPack where numpy can export the dtype (not ml_dtypes' bfloat16)."""
    import jax.numpy as jnp
    try:
        return jnp.from_dlpack(out)
    except (TypeError, ValueError, RuntimeError, BufferError):
        return jnp.asarray(out)


def _output(out, shape, dtype, like_jax):
    if out is None:
        return _aligned_empty(shape, dtype) if like_jax else np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError("out must be a numpy array")
    if out.shape != tuple(shape) or out.dtype != dtype:
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; expected "
                         f"{tuple(shape)} and {dtype}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be C-contiguous and writeable")
    return out


def _sig(kind, arr, op=0, root=0, extra=()):
    """A digest equal on two ranks exactly when their calls agree (ints only: process-stable)."""
    dt = arr.dtype
    # kind and size, not dtype.num: np.longlong and np.int64 are one dtype with two numbers
    return hash((_KIND[kind], ord(dt.kind), dt.itemsize, len(dt.descr), int(op), root,
                 arr.shape, extra)) & 0xFFFFFFFFFFFFFFFF


def _finish(out, back):
    return back(out) if back is not None else out


# ---- synchronous -------------------------------------------------------------------------

_PLANS = {}   # (kind, dtype, shape, op, root) -> checked plan; a dict hit per call, not a check


def _plan(kind, arr, op=None, root=0):
    """Validate once per (kind, dtype, shape, op, root): (dtype code, native op, sig, avg)."""
    key = (kind, arr.dtype, arr.shape, op, root)
    plan = _PLANS.get(key)
    if plan is None:
        code = dtype_code(arr.dtype) if op is not None else 0
        rop = reduce_op(op) if op is not None else ReduceOp.SUM
        if rop is ReduceOp.AVG and not is_floating(arr.dtype):
            raise TypeError(f"op 'avg' needs a floating dtype, not {arr.dtype}")
        base = ReduceOp.SUM if rop is ReduceOp.AVG else rop
        plan = (code, int(base), _sig(kind, arr, rop, root), rop is ReduceOp.AVG)
        if len(_PLANS) > 4096:
            _PLANS.clear()
        _PLANS[key] = plan
    return plan


def allreduce(x, op="sum", *, out=None, world=None, algorithm="auto", deterministic=False):
    """Reduce x elementwise over every rank; every rank gets the same bytes.

    op: 'sum', 'prod', 'min', 'max', 'avg' (floating dtypes only) or a ReduceOp. float16 and
    bfloat16 are reduced in float32. deterministic=True fixes the reduction order (rank order),
    so the result does not depend on the algorithm, chunking or placement.
    """
    w = _world(world)
    if w._coll_pending:
        return w._serial(_call, w, "allreduce", _allreduce, w, x, op, out, algorithm,
                         deterministic)
    # the common case, a few operations: a contiguous numpy array seen before, with no
    # layers in between (each call's Python is a good part of a small message's time)
    if type(x) is np.ndarray and algorithm == "auto" and x.flags.c_contiguous:
        plan = _PLANS.get(("allreduce", x.dtype, x.shape, op, 0))
        if plan is not None and not plan[3]:
            team = w._teams.get("world")
            if out is None and w._direct and team is not None:      # one host
                res = np.empty_like(x)
                algo = 1 if x.nbytes <= algorithms.ONESHOT_MAX else 2
                calls = w._calls
                calls.begin(1)
                try:
                    shm.call(w, team, team.native.allreduce, plan[1], plan[0], x, res, x.size,
                             algo, plan[2] ^ algo)
                except BaseException as e:
                    _failed(calls, e)
                calls.end()
                return res
            # between machines: a size select() sent to the direct algorithm before
            if not deterministic and w._allreduce_algo.get(x.nbytes) == "direct":
                res = np.empty_like(x) if out is None else _output(out, x.shape, x.dtype, False)
                _call(w, "allreduce", _direct_allreduce, w, x, res, plan)
                return res
    return _call(w, "allreduce", _allreduce, w, x, op, out, algorithm, deterministic)


def _direct_allreduce(w, x, res, plan):
    code, opc, sig, _ = plan
    direct.allreduce(w, x, res, code=code, op=opc, sig=sig ^ _DIRECT)


def _allreduce(w, x, op, out, algorithm, deterministic):
    arr, back = _as_array(x)
    code, opc, sig, avg = _plan("allreduce", arr, op)
    res = _output(out, arr.shape, arr.dtype, back is not None)
    if avg and arr.dtype.itemsize == 2:
        # 16-bit floats: sum and divide in float32, round once (a float16 sum may overflow)
        wide = _allreduce(w, arr.astype(np.float32), "sum", None, algorithm, deterministic)
        np.divide(wide, w.size, out=wide)
        res[...] = wide.astype(arr.dtype)
        return _finish(res, back)
    if algorithm == "auto" and w._direct:
        # one host, no override: one-shot or two-shot by size (the choice is in the digest)
        algo = 1 if arr.nbytes <= algorithms.ONESHOT_MAX else 2
        team = w._teams.get("world") or w._get_team("world")
        shm.call(w, team, team.native.allreduce, opc, code, arr, res, arr.size, algo,
                 sig ^ algo)
    else:
        algo = algorithms.select("allreduce", arr.nbytes, w, algorithm, deterministic)
        if algorithm == "auto" and not deterministic:
            memo = w._allreduce_algo
            if len(memo) > 4096:
                memo.clear()
            memo[arr.nbytes] = algo
        algorithms.run("allreduce", algo, w, arr, res, code=code, op=opc,
                       sig=sig ^ algorithms.digest(algo))
    if avg:
        np.divide(res, w.size, out=res, casting="unsafe")
    return _finish(res, back)


def allgather(x, *, out=None, world=None, algorithm="auto"):
    """Concatenate x from every rank along a new leading axis: shape (size, *x.shape)."""
    w = _world(world)
    return w._serial(_call, w, "allgather", _allgather, w, x, out, algorithm)


def _allgather(w, x, out, algorithm):
    arr, back = _as_array(x)
    res = _output(out, (w.size,) + arr.shape, arr.dtype, back is not None)
    sig = _plan("allgather", arr)[2]
    if algorithm == "auto" and w._direct:
        team = w._teams.get("world") or w._get_team("world")
        shm.call(w, team, team.native.allgather, arr, res, arr.nbytes,
                 sig ^ algorithms.digest("shm"))
    else:
        algo = algorithms.select("allgather", arr.nbytes, w, algorithm, False)
        algorithms.run("allgather", algo, w, arr, res, sig=sig ^ algorithms.digest(algo))
    return _finish(res, back)


def reduce_scatter(x, op="sum", *, out=None, world=None, algorithm="auto"):
    """Reduce x over every rank and keep this rank's block: x has shape (size, *block)."""
    w = _world(world)
    return w._serial(_call, w, "reduce_scatter", _reduce_scatter, w, x, op, out, algorithm)


def _reduce_scatter(w, x, op, out, algorithm):
    arr, back = _as_array(x)
    if arr.ndim == 0 or arr.shape[0] != w.size:
        raise ValueError(f"reduce_scatter needs an input of shape ({w.size}, ...), one block "
                         f"per rank; got {arr.shape}")
    code, opc, sig, avg = _plan("reduce_scatter", arr, op)
    res = _output(out, arr.shape[1:], arr.dtype, back is not None)
    if avg and arr.dtype.itemsize == 2:
        # 16-bit floats: sum and divide in float32, round once (a float16 sum may overflow)
        wide = _reduce_scatter(w, arr.astype(np.float32), "sum", None, algorithm)
        np.divide(wide, w.size, out=wide)
        res[...] = wide.astype(arr.dtype)
        return _finish(res, back)
    algo = algorithms.select("reduce_scatter", arr.nbytes, w, algorithm, False)
    algorithms.run("reduce_scatter", algo, w, arr, res, code=code, op=opc, sig=sig)
    if avg:
        np.divide(res, w.size, out=res, casting="unsafe")
    return _finish(res, back)


def broadcast(x, root=0, *, out=None, world=None, algorithm="auto"):
    """Every rank gets root's x. Non-root ranks pass an array of the same shape and dtype."""
    w = _world(world)
    return w._serial(_call, w, "broadcast", _broadcast, w, x, root, out, algorithm)


def _broadcast(w, x, root, out, algorithm):
    if not isinstance(root, (int, np.integer)) or not 0 <= root < w.size:
        raise ValueError(f"root {root!r} out of range for a world of {w.size}")
    arr, back = _as_array(x)
    res = _output(out, arr.shape, arr.dtype, back is not None)
    if w.rank == int(root) and res is not arr:
        np.copyto(res, arr)
    algo = algorithms.select("broadcast", arr.nbytes, w, algorithm, False)
    algorithms.run("broadcast", algo, w, res, res, root=int(root),
                   sig=_plan("broadcast", arr, None, int(root))[2])
    return _finish(res, back)


def barrier(world=None, timeout=None):
    """Return once every rank has called barrier().

    A collective call like the others: checked against the other ranks' calls, so a barrier met
    by an allreduce is a CollectiveMismatch, not a hang, and given up on every rank when one
    rank gives it up. `timeout` bounds it where every rank shares memory; across machines the
    world's timeout bounds each wait. (World.barrier() stays the plain barrier, usable even
    after a collective failed.)"""
    w = _world(world)
    return w._serial(_barrier_call, w, timeout)


def _barrier_call(w, timeout):
    return _call(w, "barrier", _barrier, w, timeout, timeout=timeout)


def _barrier(w, timeout):
    if w.size == 1:
        return
    if w._shm_world:
        team = w._teams.get("world") or w._get_team("world")
        shm.call(w, team, team.native.barrier, timeout=timeout)
        return
    # no team spans the ranks: a zero-byte allreduce, whose result depends on every rank
    x = np.zeros(0, np.int8)
    algo = algorithms.select("allreduce", 0, w)
    algorithms.run("allreduce", algo, w, x, x, code=dtype_code(x.dtype), op=int(ReduceOp.SUM),
                   sig=BARRIER_SIG ^ algorithms.digest(algo))


# ---- asynchronous ------------------------------------------------------------------------

class CollectiveRequest:
    """A collective in flight on the world's collective thread; wait() returns its result."""

    def __init__(self, future):
        self._future = future

    def wait(self, timeout=None):
        """The result (or the collective's error); Timeout if not done within `timeout`."""
        from .errors import Timeout
        done, _ = concurrent.futures.wait([self._future], timeout)
        if not done:
            raise Timeout(f"collective not complete within {timeout} s")
        return self._future.result()

    def test(self):
        """True once done."""
        return self._future.done()


def _async(fn, x, *args, world=None, **kw):
    w = _world(world)
    return CollectiveRequest(w._submit(fn, x, *args, world=w, **kw))


def allreduce_async(x, op="sum", **kw):
    """allreduce() in the background: returns a CollectiveRequest. Keep x unchanged until done."""
    return _async(allreduce, x, op, **kw)


def allgather_async(x, **kw):
    """allgather() in the background: returns a CollectiveRequest."""
    return _async(allgather, x, **kw)


def reduce_scatter_async(x, op="sum", **kw):
    """reduce_scatter() in the background: returns a CollectiveRequest."""
    return _async(reduce_scatter, x, op, **kw)


def broadcast_async(x, root=0, **kw):
    """broadcast() in the background: returns a CollectiveRequest."""
    return _async(broadcast, x, root, **kw)
