"""The ranks agree on every collective pool operation, or every rank raises CollectiveMismatch.

In SPMD each rank keeps its own copy of the pool's state (the allocator, the allocation ids,
the queued frees) and computes the part of each operation it homes. That stays right only if
every rank makes the same collective pool calls with the same arguments: one rank-dependent
line (``pt.zeros(8 + 8 * rank)``, ``v = x[rank::n]; v += 1``) would otherwise diverge the
allocators or write a different view's elements on each rank, silently.

So a collective pool operation (creation of any kind, a whole-array operation, a reduction, a
copy, sync and the frees it applies) is described by a ``Call``: its fields (FIELDS: the
operation and its arguments, shape, dtype, placement, access, and the views of its targets
and operands: allocation id, offset, shape, strides, dtype) digested into one 63-bit word. The
ranks compare the digests before the operation changes anything, as collectives compare
(kind, shape, dtype, op, root) before moving a byte (collectives.ops).

Cheap: the digest rides in a collective the operation runs anyway. A *row* of ROW int64, the
operation's own payload (queued frees, an error flag), the digest and its negation, is what
the operation allreduces with "max" in place of the allreduce it used to run (an allreduce is
a barrier too: nobody leaves it before everyone came): every rank gets the largest and,
negated, the smallest digest, equal exactly when every rank's is the same. A reduction puts
the row ahead of the partials it allgathers. Either way a mismatch is seen alike on every rank
and every rank raises; only then, on the error path, do the ranks exchange their fields as
text to name what differs and on which ranks.
"""
import zlib

import numpy as np

import collectives
from collectives.errors import CollectiveMismatch, PooltensorError

FIELDS = ("operation", "shape", "dtype", "placement", "access", "targets", "operands")
ROW = 4                           # payload a, payload b, digest, -digest
_MASK = (1 << 62) - 1             # digests below 2**62: their negations fit in an int64 too
_SHOW = 160                       # characters of one field's text shown in a message


def word(text):
    """A 62-bit digest of a text, the same in every process (not Python's hash(): strings
    hash differently in each process)."""
    b = text.encode()
    return ((zlib.crc32(b) << 30) ^ zlib.adler32(b)) & _MASK


_WORDS = {}                       # text -> word(text): operation names, dtypes, modes recur


def _w(text):
    w = _WORDS.get(text)
    if w is None:
        if len(_WORDS) > 4096:
            _WORDS.clear()
        w = _WORDS[text] = word(text)
    return w


def slabs_word(heap, members, slots):
    """The digest of an allocation's slabs (heap, home and slot of each), as ranks compare
    them before freeing it."""
    return hash((_w(heap), tuple(members), tuple(slots))) & _MASK


_POOL_TYPES = set()               # the types found to be pool arrays (they have ._a)
_NAN = word("nan")


def _dt(d):
    """A dtype as an int the same for aliases (np.longlong and np.int64 alike)."""
    return ord(d.kind) << 8 | d.itemsize


def _key(v):
    """One target or operand as the ranks compare it, as ints (Python's hash of ints and of
    tuples of them is the same in every process, unlike a string's): a pool array's view
    (allocation id, offset, shape, strides, dtype), a numpy array's shape and dtype (and bytes
    when it has at most 16 elements), a scalar's type and value; (label, ints...) tuples and
    texts as they are."""
    t = type(v)
    if t in _POOL_TYPES:
        return (v._a.id, v._off, v._shape, v._strides, _dt(v._dtype))
    if t is int or t is bool:
        return (2, t is bool, v)
    if t is float:
        return (3, v if v == v else _NAN)          # hash(nan) differs from process to process
    if t is str:
        return _w(v)
    if t is tuple:
        return (_w(v[0]),) + v[1:]
    if isinstance(v, np.ndarray):
        return (1, v.shape, _dt(v.dtype), zlib.crc32(v.tobytes()) if v.size <= 16 else 0)
    if getattr(v, "_a", None) is not None:
        _POOL_TYPES.add(t)
        return _key(v)
    return (4, _w(t.__name__), _w(repr(v)))


def _show(v):
    """A target or operand as text, for a message."""
    a = getattr(v, "_a", None)
    if a is not None:
        return (f"pool[allocation {a.id}, offset {v._off}, shape {v._shape}, "
                f"strides {v._strides}, {v._dtype.str}]")
    if isinstance(v, str):
        return v
    if isinstance(v, tuple):
        return f"{v[0]} " + ", ".join(map(str, v[1:]))
    if isinstance(v, np.ndarray):
        return f"numpy[shape {v.shape}, {v.dtype.str}" + (
            f", {v.tolist()!r}]" if v.size <= 16 else "]")
    return f"{type(v).__name__} {v!r}"


def _dtype_key(d):
    if d is None:
        return 0
    if isinstance(d, np.dtype):
        return _dt(d)
    return tuple(map(_dt, d))


def _plain_key(v):
    """A field that is None, an int, a text, or a tuple of ints (shape, placement list)."""
    if v is None:
        return 0
    t = type(v)
    if t is str:
        return _w(v)
    if t is tuple and v and type(v[0]) is str:
        return (_w(v[0]),) + v[1:]
    return v


_HEADS = {}     # (operation, shape, dtype, placement, access) -> their ints' hash: calls recur


class Call:
    """One collective pool operation as the ranks compare it: its fields and their digest.

    The digest is Python's hash of the fields turned into ints (texts through a cached
    process-independent word, NaNs through their repr), so a call costs a few tuple
    operations; the fields' text, for a message, is made only when one is needed. (Ranks
    must run one Python version: the hash of tuples is the interpreter's.)"""

    __slots__ = ("fields", "digest")

    def __init__(self, operation, shape=None, dtype=None, placement=None, access=None,
                 targets=(), operands=()):
        if type(dtype) is list:
            dtype = tuple(dtype)
        head = (operation, shape, dtype, placement, access)
        h = _HEADS.get(head)               # each field hashable: None, int, text, tuple, dtype
        if h is None:
            h = hash((_w(operation), _plain_key(shape), _dtype_key(dtype),
                      _plain_key(placement), _plain_key(access)))
            if len(_HEADS) > 4096:
                _HEADS.clear()
            _HEADS[head] = h
        self.fields = head + (targets, operands)
        self.digest = hash((h, tuple(map(_key, targets)), tuple(map(_key, operands)))) & _MASK

    @property
    def name(self):
        """The operation (its first field)."""
        return self.fields[0]

    def texts(self):
        """Every field as text (for a message)."""
        out = []
        for i, f in enumerate(self.fields):
            if f is None or (i >= 5 and not f):
                out.append("")
            elif i >= 5:
                out.append("(" + ", ".join(map(_show, f)) + ")")
            elif i == 2:
                out.append(f.str if isinstance(f, np.dtype) else ", ".join(d.str for d in f))
            else:
                out.append(f if type(f) is str else repr(f))
        return out

    def row(self, a=0, b=0):
        """This rank's row: the payload (two ints), the digest and its negation."""
        return np.array((a, b, self.digest, -self.digest), np.int64)


def placement_key(policy):
    """A placement argument as the ranks compare it: a policy name, a member tuple, or one
    home per slab."""
    homes = getattr(policy, "homes", None)
    if homes is not None:
        return ("explicit", tuple(homes))
    if policy is None or isinstance(policy, str):
        return policy
    try:
        return tuple(int(m) for m in policy)
    except (TypeError, ValueError):
        return repr(policy)


def reduce(world, call, a=0, b=0):
    """The ranks' rows combined by one allreduce ("max"), also a barrier: (largest a, largest b,
    largest digest, minus the smallest digest). verify() it.

    When another rank is in a checked collective of another shape (a reduction's allgather
    led by its row), the allreduce itself fails on both sides with collectives' own
    CollectiveMismatch; then both sides make one allreduce of their rows alone (follow_up)
    to name what differs."""
    try:
        return collectives.allreduce(call.row(a, b), "max", world=world)
    except CollectiveMismatch:
        follow_up(world, call)
        raise


def follow_up(world, call):
    """After a checked collective failed because the ranks' buffers differ: one allreduce of
    the rows alone (every rank of the failed one makes it), raising the mismatch that names
    the fields; returns if the calls agree (the caller re-raises what it had)."""
    verify(world, collectives.allreduce(call.row(), "max", world=world), call)


def verify(world, red, call):
    """Nothing when every rank's digest was the same; else CollectiveMismatch, raised on every
    rank alike (each holds the same reduced row), naming the fields that differ and the ranks."""
    if int(red[2]) != -int(red[3]):
        raise mismatch(world, call)


def verify_rows(world, rows, call):
    """verify() for rows gathered one per rank (a reduction's allgather)."""
    d = rows[:, 2].tolist()
    if d.count(d[0]) != len(d):
        raise mismatch(world, call)


def check(world, call, a=0, b=0):
    """reduce() then verify(): the ranks agree on `call` before it changes anything."""
    red = reduce(world, call, a, b)
    verify(world, red, call)
    return red


def _ranks(rs):
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def _groups(column):
    """[(value, [ranks with it])] in the order of the first rank with each value."""
    out = {}
    for r, v in enumerate(column):
        out.setdefault(v, []).append(r)
    return list(out.items())


def _cut(text):
    text = text or "(none)"
    return text if len(text) <= _SHOW else text[:_SHOW - 3] + "..."


def mismatch(world, call):
    """The CollectiveMismatch for ranks whose calls differ: which fields, each rank's value.

    The fields' texts are exchanged over the world's store (every rank is on this path: each
    saw the same rows); if that exchange fails, the message shows this rank's call only."""
    me = world.rank
    mine = call.texts()
    try:
        texts = [tuple(t) for t in world.allgather_object(mine)]
    except PooltensorError:
        texts = None
    if texts is None:
        return CollectiveMismatch(
            f"ranks called collective pool operations differently (their digests differ; "
            f"here: {_cut(repr(call.texts()))}). In SPMD every rank makes the same collective "
            f"pool calls with the same arguments and views, in the same order; no array was "
            f"changed", rank=me, host=world.hosts[me])
    other = next((r for r, t in enumerate(texts) if t != texts[me]), None)
    if other is None:      # the same texts, another digest: name the ranks by digest at least
        other = next(r for r in range(len(texts)) if r != me)
    fields = [i for i in range(len(FIELDS)) if len({t[i] for t in texts}) > 1]
    if 0 in fields:
        fields = [0]          # different operations: their other fields mean other things
    body = "; ".join(FIELDS[i] + ": " + "; ".join(
        f"{_cut(v)} on {_ranks(rs)}" for v, rs in _groups([t[i] for t in texts]))
        for i in fields) or "(the texts agree)"
    head = ("ranks are in different collective pool operations" if fields == [0] else
            f"ranks called the collective pool operation {texts[0][0]!r} differently")
    return CollectiveMismatch(
        f"{head}: {body}. In SPMD every rank makes the same collective pool calls (creation, "
        f"whole-array operations, reductions, copies, sync) with the same arguments and views, "
        f"in the same order; no array was changed", rank=other, host=world.hosts[other])
