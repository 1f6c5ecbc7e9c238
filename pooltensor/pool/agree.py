"""The ranks agree on every collective pool operation, or every rank raises CollectiveMismatch.

In SPMD each rank keeps its own copy of the pool's state (the allocator, the allocation ids,
the queued frees) and computes the part of each operation it homes. That stays right only if
every rank makes the same collective pool calls with the same arguments: one rank-dependent
line (``pt.zeros(8 + 8 * rank)``, ``v = x[rank::n]; v += 1``) would otherwise diverge the
allocators or write a different view's elements on each rank, silently.

So a collective pool operation (creation of any kind, a whole-array operation, a reduction, a
copy, sync and the frees it applies) is described by a ``Call``: a text per field (FIELDS:
the operation and its arguments, shape, dtype, placement, access, and the views of its
targets and operands: allocation id, offset, shape, strides, dtype), digested into one 63-bit
word. The ranks compare the digests before the operation changes anything, as collectives
compare (kind, shape, dtype, op, root) before moving a byte (collectives.ops).

Cheap: the digest rides in a collective the operation runs anyway. A *row* of WORDS int64,
the operation's own payload (queued frees, an error flag) and then the digest, is what it
allgathers in place of the allreduce and barrier it used to run (an allgather is a barrier
too: nobody leaves it before everyone came), or the first words of the partials a reduction
allgathers. Every rank then holds every rank's row, so a mismatch is seen alike on every rank
and every rank raises; only then, on the error path, do the ranks exchange the fields' texts
to name what differs and on which ranks.
"""
import zlib

import numpy as np

import collectives
from collectives.errors import CollectiveMismatch, PooltensorError

FIELDS = ("operation", "shape", "dtype", "placement", "access", "targets", "operands")
PAYLOAD = 2                       # words an operation carries for itself, ahead of the digest
WORDS = PAYLOAD + 1
_MASK = (1 << 63) - 1
_SHOW = 160                       # characters of one field's text shown in a message


def word(text):
    """A 63-bit digest of a text, the same in every process (not Python's hash(): strings
    hash differently in each process)."""
    b = text.encode()
    return ((zlib.crc32(b) << 31) ^ zlib.adler32(b)) & _MASK


def view(v):
    """One target or operand as text: a pool array's view (allocation id, offset, shape,
    strides, dtype), a numpy array's shape and dtype (and values when it has at most 16), a
    scalar's type and value; a text as it is."""
    if isinstance(v, str):
        return v
    a = getattr(v, "_a", None)
    if a is not None:
        return (f"pool[allocation {a.id}, offset {v._off}, shape {v._shape}, "
                f"strides {v._strides}, {v._dtype.str}]")
    if isinstance(v, np.ndarray):
        if v.size <= 16:
            return f"numpy[shape {v.shape}, {v.dtype.str}, {v.tolist()!r}]"
        return f"numpy[shape {v.shape}, {v.dtype.str}]"
    return f"{type(v).__name__} {v!r}"


def _text(v):
    """A field's value as text: None empty, a dtype by its str, a list item by item."""
    t = type(v)
    if t is str:
        return v
    if t is tuple:
        return repr(v)
    if v is None:
        return ""
    if isinstance(v, np.dtype):
        return v.str
    if t is list:
        return ", ".join(map(_text, v))
    return repr(v)


class Call:
    """One collective pool operation as the ranks compare it: a text per field, one digest."""

    __slots__ = ("texts", "digest")

    def __init__(self, operation, shape=None, dtype=None, placement=None, access=None,
                 targets=(), operands=()):
        self.texts = (operation, _text(shape), _text(dtype), _text(placement), _text(access),
                      _views(targets), _views(operands))
        self.digest = word("\x1f".join(self.texts))

    @property
    def name(self):
        """The operation's text (its first field)."""
        return self.texts[0]

    def row(self, a=0, b=0):
        """This rank's row: the payload (two ints), then the digest."""
        return np.array((a, b, self.digest), np.int64)


def _views(vs):
    if not vs:
        return ""
    return "(" + ", ".join(view(v) for v in vs) + ")"


def placement_text(policy):
    """A placement argument as text: a policy name, a member tuple, or one home per slab."""
    homes = getattr(policy, "homes", None)
    if homes is not None:
        return f"explicit {homes}"
    if policy is None or isinstance(policy, str):
        return _text(policy)
    try:
        return repr(tuple(int(m) for m in policy))
    except (TypeError, ValueError):
        return repr(policy)


def gather(world, call, *payload):
    """Every rank's row as a (ranks, WORDS) int64 array: one allgather, also a barrier.

    When another rank is in a checked collective of another shape (a reduction's allgather
    led by its row), the allgather itself fails on both sides with collectives' own
    CollectiveMismatch; then both sides run one allgather of their rows alone (follow_up)
    to name what differs."""
    row = call.row(*payload)
    try:
        return collectives.allgather(row, world=world)
    except CollectiveMismatch:
        follow_up(world, call)
        raise


def follow_up(world, call):
    """After a checked collective failed because the ranks' buffers differ: one allgather of
    the rows alone (every rank of the failed one makes it), raising the mismatch that names
    the fields; returns if the rows agree (the caller re-raises what it had)."""
    verify(world, collectives.allgather(call.row(), world=world), call)


def verify(world, rows, call):
    """Nothing when every rank's digests match; else CollectiveMismatch (raised on every rank
    alike, since every rank holds the same rows), naming the fields that differ and the ranks."""
    digests = rows[:, PAYLOAD].tolist()
    if digests.count(digests[0]) != len(digests):
        raise mismatch(world, digests, call)


def check(world, call, *payload):
    """gather() then verify(): the ranks agree on `call` before it changes anything."""
    rows = gather(world, call, *payload)
    verify(world, rows, call)
    return rows


def _ranks(rs):
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def _groups(column):
    """[(value, [ranks with it])] in the order of the first rank with each value."""
    out = {}
    for r, v in enumerate(column):
        out.setdefault(v, []).append(r)
    return list(out.items())


def _show(text):
    text = text or "(none)"
    return text if len(text) <= _SHOW else text[:_SHOW - 3] + "..."


def mismatch(world, digests, call):
    """The CollectiveMismatch for ranks whose digests differ: which fields, each rank's value.

    The texts are exchanged over the world's store (every rank is on this path: each saw the
    same digests); if that exchange fails, the message groups the ranks by digest only."""
    me = world.rank
    other = next(r for r, d in enumerate(digests) if d != digests[me]) \
        if digests.count(digests[me]) < len(digests) else None
    try:
        texts = [tuple(t) for t in world.allgather_object(list(call.texts))]
    except PooltensorError:
        texts = None
    if texts is None:
        shown = " / ".join(_ranks(rs) for _, rs in _groups(digests))
        body = f"the calls of {shown} differ (here: {_show(call.name)})"
        head = f"ranks called the collective pool operation {call.name!r} differently"
    else:
        fields = [i for i in range(len(FIELDS)) if len({t[i] for t in texts}) > 1]
        if 0 in fields:
            fields = [0]      # different operations: their other fields mean other things
        body = "; ".join(FIELDS[i] + ": " + "; ".join(
            f"{_show(v)} on {_ranks(rs)}" for v, rs in _groups([t[i] for t in texts]))
            for i in fields)
        head = ("ranks are in different collective pool operations" if fields == [0] else
                f"ranks called the collective pool operation {texts[0][0]!r} differently")
    if other is None:
        other = next(r for r, d in enumerate(digests) if d != digests[0])
    return CollectiveMismatch(
        f"{head}: {body}. In SPMD every rank makes the same collective pool calls (creation, "
        f"whole-array operations, reductions, copies, sync) with the same arguments and views, "
        f"in the same order; no array was changed", rank=other, host=world.hosts[other])
