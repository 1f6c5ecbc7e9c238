"""The blockwise kernels of the executor, as small classes members can be sent.

A kernel is called as kernel(parts, dsts): numpy parts of the operands for one box (numpy
arrays broadcastable to the box, or scalars) and one writable numpy array per target, which it
fills. These are plain classes, not closures, so that a plain script can send them to its
member processes as part of a plan (pool/work.py): each is marked ``PLAN_OK`` and holds only
names, dtypes and scalars. The vocabulary is closed: numpy ufuncs and np.clip by name, casts,
where, fills; user code only through ``Func`` (map_blocks), whose callable travels apart.
"""
import numpy as np


FUNCS = ("clip", "round", "around")     # elementwise numpy functions with out=, not ufuncs


def plannable(func):
    """Can a Ufunc kernel name `func` (numpy's own ufunc, or one of FUNCS)?"""
    name = getattr(func, "__name__", None)
    return bool(name) and getattr(np, name, None) is func and (
        isinstance(func, np.ufunc) or name in FUNCS)


def _numpy_func(name):
    """A numpy ufunc (or one of FUNCS) by name; ValueError for anything else."""
    f = getattr(np, name, None)
    if isinstance(f, np.ufunc) or name in FUNCS:
        return f
    raise ValueError(f"{name!r} is not a numpy ufunc")


class Ufunc:
    """numpy function `name` (a ufunc, or one of FUNCS) with out= into the targets; nin inputs,
    then the where= mask when has_where; kw: dtype=, casting=, ... as numpy takes them."""

    PLAN_OK = True

    def __init__(self, name, nin, has_where, kw, ufunc=True):
        self.name, self.nin, self.has_where, self.kw, self.ufunc = (
            name, nin, has_where, dict(kw), ufunc)
        self._f = None

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_f"}

    def __setstate__(self, state):
        self.__dict__.update(state, _f=None)

    def __call__(self, parts, dsts):
        f = self._f
        if f is None:
            f = self._f = _numpy_func(self.name)
        out = tuple(dsts) if self.ufunc else dsts[0]
        if self.has_where:
            f(*parts[:self.nin], out=out, where=parts[self.nin], **self.kw)
        else:
            f(*parts, out=out, **self.kw)


class Assign:
    """dst = src, cast as numpy's assignment does (unsafe)."""

    PLAN_OK = True

    def __call__(self, parts, dsts):
        np.copyto(dsts[0], parts[0], casting="unsafe")


class AssignWhere:
    """dst = src where the mask (the second part) is true (np.copyto with where=)."""

    PLAN_OK = True

    def __call__(self, parts, dsts):
        np.copyto(dsts[0], parts[0], casting="unsafe", where=parts[1])


class Where:
    """np.where(c, a, b) into the target (parts: condition, a, b)."""

    PLAN_OK = True

    def __call__(self, parts, dsts):
        c = np.asarray(parts[0])
        out = dsts[0]
        np.copyto(out, parts[2], casting="unsafe")
        np.copyto(out, parts[1], casting="unsafe",
                  where=c if c.dtype == np.bool_ else c.astype(bool))


class Fill:
    """dst[...] = the one operand (a value of the target's dtype)."""

    PLAN_OK = True

    def __call__(self, parts, dsts):
        dsts[0][...] = parts[0]


class Part:
    """np.real / np.imag of the operand, cast into the target."""

    PLAN_OK = True

    def __init__(self, which):
        if which not in ("real", "imag"):
            raise ValueError(which)
        self.which = which

    def __call__(self, parts, dsts):
        np.copyto(dsts[0], getattr(np, self.which)(parts[0]), casting="unsafe")


class Func:
    """dst = fn(*parts) (map_blocks): the parts broadcast to the block, the result cast in.
    fn is user code: it is not pickled with the plan but sent beside it (pool/work.py), and
    only the script's own member processes accept it."""

    PLAN_OK = True

    def __init__(self, fn):
        self.fn = fn

    def __getstate__(self):
        return {}                          # the callable travels apart (Round's code blob)

    def __setstate__(self, state):
        self.fn = None

    def __call__(self, parts, dsts):
        d = dsts[0]
        parts = [np.broadcast_to(p, d.shape) if isinstance(p, np.ndarray) else p
                 for p in parts]
        d[...] = self.fn(*parts)
