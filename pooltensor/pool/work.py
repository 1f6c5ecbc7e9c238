"""Work members do for a plain script: the plans, how they are checked, the script's side.

A plain script's member processes (``pooltensor.init(members=N)``) do not only lend memory:
they compute the part of each whole-array operation whose output slabs they home, reading
their own memory in place and faulting in any misaligned input from their peers one-sided, as
SPMD ranks do. The script sends one *plan* per operation and member, computes its own slabs
meanwhile, and gets back only small results (a reduction's partials, an error).

Plans travel on the socket pair spawn.py made for each member (pool/channel.py).

A plan is a tuple of plain values (operation names, dtypes, slices, scalars, small numpy
operands) and pool arrays. Pool arrays travel as their view and slab map (persistent ids),
never as bytes. The member's unpickler admits only numpy's own reconstructors, numpy ufuncs,
a few builtins and pooltensor classes marked as part of the vocabulary (``PLAN_OK``): a plan
cannot name any other callable. Code the user wrote (map_blocks) comes as a separate blob
that only the script's own children load.
"""
import builtins
import io
import pickle
import warnings

import numpy as np

from collectives import env
from collectives.errors import PeerLost, Timeout

from ..cache.layout import contiguous, extent
from . import blas
from .channel import MemberError
from .allocation import Allocation

ENV_MIN = "POOLTENSOR_MEMBER_WORK_MIN"
WORK_MIN = 4 << 20                   # output bytes a member must home to be sent its part


# -- plans: pickling with pool arrays by reference, and a closed vocabulary ----------------------

def _is_array(obj):
    return isinstance(getattr(obj, "_a", None), Allocation) and hasattr(obj, "_strides")


class _Pickler(pickle.Pickler):
    allocs = ()

    def persistent_id(self, obj):
        if _is_array(obj):
            a = obj._a
            self.allocs.append(a)
            return ("A", a.id, a.heap, a.nbytes, tuple(a.members), tuple(a.slots),
                    obj._off, tuple(obj._shape), tuple(obj._strides), obj._dtype.str)
        return None


def dumps(obj, allocs=None):
    """A plan as bytes (pool arrays by reference; their Allocations appended to `allocs`)."""
    f = io.BytesIO()
    p = _Pickler(f, protocol=5)
    p.allocs = [] if allocs is None else allocs
    p.dump(obj)
    return f.getvalue()


_BUILTINS = {"slice", "complex", "set", "frozenset", "range", "bytearray"}
_NUMPY = {("numpy", "dtype"), ("numpy", "any"), ("numpy", "all"), ("numpy", "argmin"),
          ("numpy", "argmax"), ("numpy", "ndarray"), ("numpy", "clip"),
          ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer"),
          ("numpy._core.multiarray", "scalar"), ("numpy.core.multiarray", "scalar"),
          ("numpy._core.multiarray", "_reconstruct"),
          ("numpy.core.multiarray", "_reconstruct"), ("numpy._globals", "_NoValueType")}


def _numpy_value(name):
    """numpy.<name> is a ufunc or a scalar type (np.float64 as a dtype= argument)."""
    obj = getattr(np, name, None)
    return isinstance(obj, np.ufunc) or (isinstance(obj, type) and issubclass(obj, np.generic))


class _Unpickler(pickle.Unpickler):
    """Loads a plan in a member: pool arrays rebuilt on this member's pool; globals only from
    the vocabulary (MemberError for anything else, so a plan cannot run arbitrary code)."""

    def __init__(self, data, pool, make_array):
        super().__init__(io.BytesIO(data))
        self.pool = pool
        self.make_array = make_array
        self.allocs = {}

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 10 and pid[0] == "A"):
            raise MemberError(f"bad array reference in a plan: {pid!r}")
        _, aid, heap, nbytes, members, slots, off, shape, strides, dt = pid
        a = self.allocs.get(aid)
        if a is None:
            a = self.allocs[aid] = Allocation(self.pool, aid, nbytes, heap, list(members),
                                              list(slots))
            me, hi = self.pool.me, 0
            for m, s in zip(members, slots):
                if m == me and s >= hi:
                    hi = s + 1
            used = self.pool.used_hi
            if hi > used.get(heap, 0):
                used[heap] = hi
        return self.make_array(a, off, tuple(shape), tuple(strides), np.dtype(dt))

    def find_class(self, module, name):
        if module == "builtins" and name in _BUILTINS:
            return super().find_class(module, name)
        if (module, name) in _NUMPY or (module == "numpy" and _numpy_value(name)):
            return super().find_class(module, name)
        if module.startswith("pooltensor.") and "." not in name:
            obj = super().find_class(module, name)
            if isinstance(obj, type) and getattr(obj, "PLAN_OK", False) is True:
                return obj
        raise MemberError(f"a plan may not name {module}.{name}: it is not an operation "
                          f"members execute")


def loads(data, pool, make_array):
    """A plan from bytes, in a member (see _Unpickler)."""
    return _Unpickler(data, pool, make_array).load()


class _ReplyUnpickler(pickle.Unpickler):
    """Loads a member's or server's reply in the script: numbers, numpy arrays, slices and
    exceptions (builtin, numpy's and pooltensor's), nothing that could run code."""

    def find_class(self, module, name):
        obj = None
        if module == "builtins":
            obj = getattr(builtins, name, None)
            if name in _BUILTINS or (isinstance(obj, type) and issubclass(obj, BaseException)):
                return obj
        elif (module, name) in _NUMPY or (module == "numpy" and _numpy_value(name)):
            return super().find_class(module, name)
        elif module in ("numpy.exceptions", "numpy._core._exceptions") or \
                module.startswith(("collectives.", "pooltensor.")):
            obj = super().find_class(module, name)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                return obj
        raise pickle.UnpicklingError(f"a reply may not name {module}.{name}")


def loads_reply(data):
    """A reply (or a pickled exception in one) from bytes, in the script."""
    return _ReplyUnpickler(io.BytesIO(data)).load()


def refusal(text):
    """The reply bytes of a member that refused a plan (MemberError with `text`)."""
    return pickle.dumps(("err", (None, text)), protocol=5)


# -- the script's side ---------------------------------------------------------------------------

def work_min():
    """Output bytes a member must home in an operation for it to compute them itself (below
    that the script does it: a round trip costs more than the work)."""
    return max(0, env.number(ENV_MIN, WORK_MIN))


def doers(pool, target, local_ok=False, inputs=None, written=True, weight=1.0):
    """The members that compute their own part of an operation whose output is `target` (a
    pool array): a plain script's member processes, and memory servers when local_ok (every
    input of the work a server would do lives on it) or when the servers can read the
    inputs from each other (see servers_reach; inputs: the operation's pool arrays, None
    when a server could not do its part that way; written: False when the operation only
    reads the target, a reduction), that home at least work_min() bytes of it, counted
    `weight` times (the input bytes behind each output byte: a matmul's K over its M). Empty
    outside such pools."""
    chans = getattr(pool, "chans", None)
    if not chans or pool.closed:
        return ()
    a = target._a
    if a.heap == "pv" or target.size == 0:
        return ()
    if written and not contiguous(target._shape, target._strides, target.itemsize):
        local_ok = False              # a server's unit of it may cross into another's slab
    elif not local_ok and inputs is not None:
        local_ok = servers_reach(pool, target, inputs)
    S = pool.slab_size
    lo, hi = extent(target._off, target._shape, target._strides, target.itemsize)
    per = {}
    for k in range(lo // S, (hi - 1) // S + 1):
        m = a.members[k]
        ch = chans.get(m)
        if ch is not None and (local_ok or not getattr(ch, "aligned_only", False)):
            per[m] = per.get(m, 0) + S * weight
    least = work_min()
    return tuple(sorted(m for m, b in per.items() if b >= least))


def servers(pool):
    """Does this pool compute on memory servers (whose plans must cut work by the output's
    slabs, since a server writes only the slabs it holds)?"""
    chans = getattr(pool, "chans", None)
    return bool(chans) and any(getattr(ch, "aligned_only", False) for ch in chans.values())


def _homes(x):
    """The members that home the slabs of pool array x's view."""
    if x.size == 0:
        return set()
    S = x._a.pool.slab_size
    lo, hi = extent(x._off, x._shape, x._strides, x.itemsize)
    return set(x._a.members[lo // S:(hi - 1) // S + 1])


def servers_reach(pool, target, inputs):
    """Can the memory servers that home the target's slabs compute them, reading the input
    slabs they do not hold from the servers that do (pool/serve_work.py)? Yes when every home
    of the target and of every input is a server that reads its peers, and no slab of them
    was lost (a lost slab's error is raised where it is read: here). (A written target must
    also be contiguous, so that each server writes only the slabs it holds: doers.)"""
    chans = pool.chans
    reach = {m for m, ch in chans.items() if getattr(ch, "reach", False)}
    for x in [target, *inputs]:
        if not _is_array(x):
            continue
        if x._a.lost or not _homes(x) <= reach:
            return False
    return True


class PlanTooLarge(ValueError):
    """A plan (its numpy operands, the slab maps of its arrays) too big for a memory server's
    control frame: the script does that work itself (start())."""


class Round:
    """One operation's plans out to some members and their replies back.

    Usage: r = Round(pool, members, plan); ... the script's own work ...; results = r.wait()
    (a dict member -> reply value). wait() always drains every member's reply, so the channels
    stay in step even when the script's own part or one member failed; it then raises the
    first failure (the script's own error first, then in member order)."""

    def __init__(self, pool, members, plan, code=None):
        self.pool = pool
        self.members = tuple(members)
        self.sent = []
        self.chans = {m: pool.chans[m] for m in self.members}   # (a lost one leaves pool.chans)
        allocs = []
        msg = dumps((plan, code, np.geterr()), allocs)   # before anything is sent (start())
        for m in self.members:
            fits = getattr(self.chans[m], "fits", None)
            if fits is not None and not fits(msg):
                raise PlanTooLarge(f"a plan of {len(msg)} bytes does not fit in a memory "
                                   f"server's control frame")
        for m in self.members:
            ch = self.chans[m]
            try:
                ch.send(msg)
            except PeerLost as e:
                _lost(pool, m, e)
                self._drain()
                raise
            self.sent.append(m)
        pool.round = self
        mover = getattr(pool, "mover", None)
        if mover is not None:
            mover.note_homes(allocs, self.members)   # the homes work on their slabs
        pool.plans[plan[0]] = pool.plans.get(plan[0], 0) + len(self.members)

    def _drain(self):
        out, first = {}, None
        for m in self.sent:
            ch = self.chans[m]
            try:
                raw = ch.recv(self.pool.timeout, alive=_alive(self.pool, m))
                status, value = loads_reply(raw)
            except PeerLost as e:
                _lost(self.pool, m, e)
                first = first or e
                continue
            except Timeout as e:
                if not getattr(ch, "in_step_after_timeout", False):
                    self.pool.broken = e      # its late reply would answer the next plan
                first = first or e
                continue
            except Exception as e:         # noqa: BLE001  (a reply that does not decode)
                first = first or MemberError(f"member {m}: unreadable reply ({e})")
                continue
            if status == "ok":
                out[m], said = value
                for category, text in said:
                    _rewarn(category, text)
            elif first is None:
                first = _member_exception(m, value)
        self.sent = []
        if getattr(self.pool, "round", None) is self:
            self.pool.round = None
        return out, first

    def wait(self, own_error=None):
        """The members' replies (member -> value); raises own_error, or a member's error."""
        out, first = self._drain()
        if own_error is not None:
            raise own_error
        if first is not None:
            raise first
        return out


def aligned(target, operands):
    """Every pool operand is laid out as `target` is (same shape, strides, offset, itemsize
    and slab homes): whoever homes a unit of the target holds its inputs too."""
    for v in operands:
        if not _is_array(v):
            continue
        if (v._shape != target._shape or v._strides != target._strides or
                v._off != target._off or v.itemsize != target.itemsize or
                v._a.members != target._a.members):
            return False
    return True


def start(pool, members, plan, code=None):
    """A Round of `plan` to `members`, or None when there is nobody to send it to or the plan
    cannot travel (an operand that does not pickle, a plan bigger than a memory server's
    control frame): the caller then does all the work."""
    if not members:
        return None
    check(pool)
    late = getattr(pool, "round", None)
    if late is not None:                 # one left unread (interrupted): drain its replies
        late._drain()
    try:
        return Round(pool, members, plan, code)
    except (pickle.PicklingError, TypeError, AttributeError, PlanTooLarge):
        return None


def share(pool, members, plan, here, outs=(), code=None):
    """An operation split between this process and `members`: they run `plan` on the slabs
    they home while here(handled) does this process's share (handled: the homes it computes
    for, every one but `members`). Returns (here's value, {member: reply}), or None when no
    member took the plan (here did not run: the caller does the whole work its usual way).
    Raises here's error, else the first member's, once every member answered; outs: the
    arrays the members wrote (this process's cached copies of their slabs are dropped)."""
    rnd = start(pool, members, plan, code)
    if rnd is None:
        return None
    handled = frozenset(range(pool.size)) - frozenset(members)
    err, value = None, None
    try:
        with blas.limited(len(members) + 1 if getattr(pool, "_procs", ()) else 1):
            value = here(handled)
    except Exception as e:              # noqa: BLE001  (raised once the members answered)
        err = e
    try:
        got = rnd.wait(err)
    finally:
        if outs:
            written(pool, outs, members)
    return value, got


def written(pool, outs, members):
    """After `members` wrote their slabs of outs: this process's cached copies of those slabs
    are stale (mapped and local memory are not)."""
    S = pool.slab_size
    keys = []
    for o in outs:
        a = o._a
        a.version += 1
        if o.size == 0:
            continue
        lo, hi = extent(o._off, o._shape, o._strides, o.itemsize)
        for k in range(lo // S, (hi - 1) // S + 1):
            if a.members[k] in members:
                keys.append((a.heap, a.members[k], a.slots[k]))
    pool.cache.discard_keys(keys)
    pool.cache.gen += 1


def _lost(pool, m, err):
    """Member m's channel failed with PeerLost: the pool's keeper takes the member as lost
    (its slabs fail over or are lost: pool/replicas.py) and the other members go on; a pool
    without one is broken (check())."""
    keeper = getattr(pool, "keeper", None)
    if keeper is None:
        pool.broken = err
    else:
        keeper.notice([m])


def _alive(pool, m):
    procs = getattr(pool, "_procs", ())

    def alive():
        p = procs[m - 1] if 0 < m <= len(procs) else None
        return p is None or p.poll() is None
    return alive


def _rewarn(category, text):
    """A warning a member's numpy gave (RuntimeWarning: overflow ...), issued here once per
    place, as the script's own numpy would have."""
    cls = getattr(builtins, category, None) or getattr(np.exceptions, category, None)
    if not (isinstance(cls, type) and issubclass(cls, Warning)):
        cls = RuntimeWarning
    warnings.warn(text, cls, stacklevel=5)


def _member_exception(m, value):
    """The exception a member sent (pickled), re-raised here with the member named."""
    blob, text = value
    try:
        exc = loads_reply(blob) if blob is not None else None
    except Exception:                      # noqa: BLE001  (not an exception we may rebuild)
        exc = None
    if not isinstance(exc, BaseException):
        return MemberError(f"member {m}: {text}")
    try:
        exc.add_note(f"raised by member {m} while computing the slabs it homes")
    except AttributeError:
        pass
    return exc


def check(pool):
    """Raise the error that broke the members' channels, if one did (a member process that
    did not answer in time leaves its channel out of step: finalize and init again; a memory
    server's control connection drops the late reply instead, and stays usable). A lost
    member does not break the pool: it gets no more plans (pool/replicas.py)."""
    err = getattr(pool, "broken", None)
    if err is not None:
        raise PeerLost(f"a member of this pool was lost earlier ({err}); call "
                       f"pooltensor.finalize() and pooltensor.init() again") from err
