"""Between the FFI handler (collectives._jaxffi, C) and the world: registering the handler with
XLA, keeping its fast-path state bound to the world's team, and the Python side of every call
the handler does not finish alone.

The handler finishes a call alone when the world's collectives are the shared-memory team's
(every rank on one machine, no forced algorithm): it numbers the call on the world's board,
runs the team collective and checks the board. Everything else comes here, under the GIL:
- WHOLE: the call as the eager collective runs it (numbered, checked, given up on every rank
  on failure): the first call, before the world has a team; every call of a world whose
  collectives run over windows (tcp between machines, hierarchical, POOLTENSOR_ALGO); a call
  made while a peer's record of a given-up call waits on the board; a call made while
  collectives of *_async requests are queued (it runs after them, on their thread).
- FAILED: the team call failed in the handler: the error the eager collective would raise
  (CollectiveMismatch, Timeout, PeerLost naming the rank), the call given up on every rank.
- END: the call completed but a record arrived meanwhile: fail it if a peer gave it up.
The error reaches JAX as the handler's failure (jax.errors.JaxRuntimeError, whose message
starts with the error's class name); last_error() keeps the typed exception.
"""
import ctypes
import threading

import numpy as np

import jax

from .. import _native, algorithms, ops, world as _worldmod
from ..algorithms import shm
from ..dtypes import DTYPES
from ..errors import Finalized
from .primitives import TARGET

try:
    from .. import _jaxffi
except ImportError:                     # built without jaxlib's headers
    _jaxffi = None

NAMES = {1: "allreduce", 2: "allgather", 3: "reduce_scatter", 4: "broadcast", 5: "barrier"}
_BY_CODE = {v: k for k, v in DTYPES.items()}
_ERR_NAMES = {getattr(_native, n): n for n in dir(_native) if n.startswith("ERR_")}
WHOLE, END, FAILED = 0, 1, 2

_lock = threading.Lock()
_state = {"ready": False, "team": None, "world": None, "error": None, "closing": None}


def available():
    """Whether the FFI handler was built (jaxlib's headers were there at build time)."""
    return _jaxffi is not None


def setup():
    """Register the handler with XLA once; idempotent."""
    if _state["ready"]:
        return
    with _lock:
        if _state["ready"]:
            return
        if _jaxffi is None:
            raise ImportError("collectives._jaxffi was not built (jaxlib was not installed when "
                              "the package was built): reinstall with jax present")
        _jaxffi.set_api(_native.team_api)
        _jaxffi.set_slow(_slow)
        jax.ffi.register_ffi_target(TARGET, _jaxffi.handler(), platform="cpu")
        ops.FENCE = jax.effects_barrier
        _worldmod.CLOSING.append(_on_close)
        _worldmod.SUBMITTING.append(_unbind)
        _state["ready"] = True


def current_world():
    """The world jitted collectives run in (the current one; made if there is none)."""
    return ops._world(None)


def last_error():
    """The pooltensor error behind the latest failed jitted collective of this process."""
    return _state["error"]


def stats():
    """{'fast': calls the handler finished alone, 'slow': calls that came to Python,
    'bound': whether the fast path is on now}."""
    return _jaxffi.stats() if _jaxffi is not None else {"fast": 0, "slow": 0, "bound": False}


# ---- the fast path's state ----------------------------------------------------------------

def _unbind(*_):
    _state["team"] = None
    _jaxffi.bind(0, 0, 0, 0.0)


def _rebind(w):
    """Point the handler at the world's team and board, or at nothing (every call to Python)
    when the world has no team spanning every rank or a peer's record is unread."""
    calls = w._calls
    team = w._teams.get("world") if w._direct else None
    if team is None or team.native is None or calls.alert or calls.lost is not None \
            or w._coll_pending:
        _unbind()
        return
    if _state["world"] is not w:
        _state["world"] = w
        calls.on_epoch.append(_unbind)
    board = np.frombuffer(calls.ctr, np.int64).ctypes.data
    _state["team"] = team
    _jaxffi.bind(team.native.handle(), board, calls.seen, float(w.timeout))


def _on_close(w):
    """A world closes (collectives.finalize(), World.close(), exit): first let every jitted
    program still running collectives finish (they may need this world), then let go."""
    _state["closing"] = w              # the programs still running call into it meanwhile
    try:
        jax.effects_barrier()
    finally:
        _state["closing"] = None
        _unbind()
        _state["world"] = None


# ---- the Python side of a call ------------------------------------------------------------

def _view(addr, count, dtype, shape):
    dtype = np.dtype(dtype)
    if count == 0:
        return np.empty(shape, dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(addr)
    return np.frombuffer(raw, dtype).reshape(shape)


def _dtype(code):
    name = _BY_CODE.get(code, "uint8")
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _slow(path, kind, op, dt, root, algo, sig, in_addr, in_count, out_addr, out_count, shape,
          status, who, avg=0):
    """Called by the handler with the GIL: None when the call is done, else the error text."""
    name, w = NAMES[kind], None
    try:
        w = _world_now()
        calls = w._calls
        if path == WHOLE:
            dtype = _dtype(dt)
            x = _view(in_addr, in_count, dtype, shape) if name != "barrier" else None
            out = _view(out_addr, out_count, dtype, _out_shape(name, shape, w.size)) \
                if name != "barrier" else None
            # behind the collectives queued by *_async calls, if any (their thread's order)
            w._serial(ops._call, w, name, _body, w, name, op, dt, root, algo, sig, x, out)
            if avg:
                np.divide(out, avg, out=out, casting="unsafe")
        else:
            calls.ctr[1] -= 1          # the handler numbered it: _call numbers it again
            if path == FAILED:
                team = _state["team"] or w._teams.get("world")
                ops._call(w, name, shm.call, w, team, _raise_status, status, who)
            else:
                ops._call(w, name, _nothing)
        _rebind(w)
        return None
    except BaseException as e:         # noqa: B902 (handed to XLA as text, kept typed)
        _state["error"] = e
        try:
            _rebind(w) if w is not None else _unbind()
        except Exception:
            _unbind()
        return f"{type(e).__name__}: {e}"


def _world_now():
    w = _worldmod.current() or _state.get("closing")
    if w is None:
        raise Finalized("jitted collective after collectives.finalize(); collectives.init() "
                        "starts a new world")
    return w


def _out_shape(name, shape, size):
    if name == "allgather":
        return (size,) + tuple(shape)
    if name == "reduce_scatter":
        return tuple(shape[1:])
    return tuple(shape)


def _nothing():
    return None


def _raise_status(status, who, timeout):
    raise _native.Error(status, 0, _ERR_NAMES.get(status, "error"), who)


def _body(w, name, op, code, root, algo, sig, x, out):
    """One call as the eager collective runs it, with the digest the handler was given."""
    u = sig & 0xFFFFFFFFFFFFFFFF
    if name == "barrier":
        return ops._barrier(w, None)
    if name == "allreduce":
        if w._direct:
            team = w._teams.get("world") or w._get_team("world")
            shm.call(w, team, team.native.allreduce, op, code, x, out, x.size, algo, u ^ algo)
        else:
            a = algorithms.select("allreduce", x.nbytes, w)
            algorithms.run("allreduce", a, w, x, out, code=code, op=op,
                           sig=u ^ algorithms.digest(a))
        return None
    if name == "allgather":
        if w._direct:
            team = w._teams.get("world") or w._get_team("world")
            shm.call(w, team, team.native.allgather, x, out, x.nbytes,
                     u ^ algorithms.digest("shm"))
        else:
            a = algorithms.select("allgather", x.nbytes, w)
            algorithms.run("allgather", a, w, x, out, sig=u ^ algorithms.digest(a))
        return None
    if name == "reduce_scatter":
        a = algorithms.select("reduce_scatter", x.nbytes, w)
        algorithms.run("reduce_scatter", a, w, x, out, code=code, op=op, sig=u)
        return None
    if w.rank == root:
        np.copyto(out, x)
    a = algorithms.select("broadcast", x.nbytes, w)
    algorithms.run("broadcast", a, w, out, out, root=root, sig=u)
    return None
