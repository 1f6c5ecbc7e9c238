"""replicate() in a pool without memory servers (a plain script and its members): a whole copy
of a store's version on each member named, in a chain.

How. Each member's copy is one read-only pool array per tensor, placed on that member alone
(``placement=[member]``), and written slab by slab from the copy made before it in the chain
(member i's from member i-1's, the first from the version's own slabs), so the chain is the
same as between memory servers. The script moves the bytes, as the pool's keeper does when
it restores a copy (Keeper._copy): the members of a plain script are processes of its own
machine whose heaps it maps, so a slab is one memcpy from mapped memory to mapped memory,
and a member process could not do it faster (one memory bus; a member runs a fixed
vocabulary of array operations, not copies between other members). A source lost midway is
replaced by another copy of the slab (the version's own, its ``replicas=`` copies, an
earlier member's); with none left, ReplicationError names the lost member, and the copies
made so far are freed.

What readers see. The version's arrays are replaced (for opens from then on) by views of
the same slabs whose Allocation also lists every whole copy (Allocation.copies, known to the
keeper: a member lost is read around); ``open(name, local=True)`` puts this process's own
copy (member 0's) first, read in place. The copies belong to the version and are freed with
it. The version's own allocations are kept from migrating (pool/migrate.py moves only slabs
without copies): a view must not point at a slot that moved.
"""
from collectives.errors import PeerLost

from ..array.array import ndarray
from ..pool.allocation import Allocation
from .kept import ReplicationError, _aids


def check_members(pool, members):
    """The members to copy to (ranks lending memory, in the order given)."""
    bad = [m for m in members if not isinstance(m, int) or isinstance(m, bool)
           or not 0 <= m < pool.size or pool.nslabs[m] <= 0]
    if bad or not members or len(set(members)) != len(members):
        raise ValueError(f"members names distinct pool members that lend memory (0.."
                         f"{pool.size - 1}), not {[*members]}")
    return [*members]


def replicate(pool, ver, members, what):
    """A whole copy of version `ver` on each of `members`, in a chain; then the version's
    arrays know them. what: the store's name, for messages. Returns the members' hosts."""
    made = []                         # per member: {key: the copy's ndarray}
    err = None
    for m in members:
        try:
            made.append(_whole(pool, ver, m, made, what))
        except PeerLost as e:
            err = ReplicationError(f"replication of store {what!r} to member {m} failed: "
                                   f"{e}")
            break
    if err is not None:               # (raised here: no frame keeps a copy made so far)
        made.clear()
        raise err
    ver.whole = (ver.whole or []) + list(zip(members, made))
    ver.backing = ver.backing or ver.arrays
    ver.arrays = _views(pool, ver, what, first=None)
    ver.local = _views(pool, ver, what, first=pool.me)
    return [pool.world.hosts[m] for m, _ in ver.whole]


def _whole(pool, ver, m, made, what):
    """Member m's copy of every tensor of the version: {key: ndarray}."""
    from ..array.creation import empty
    if m in pool.keeper.gone:
        raise PeerLost(f"member {m} is lost", rank=m, host=pool.world.hosts[m])
    got = {}
    for key, x in ver.arrays.items():
        if not x.nbytes:
            continue
        y = empty(x.shape, x.dtype, placement=[m], access="readonly")
        pool.keeper.allocs.pop(y._a, None)        # one copy among others (the views')
        got[key] = y
        _copy(pool, x._a, y._a, [c[key]._a for c in made[::-1]], what, key)
    return got


def _sources(a, k, before):
    """The copies of slab k to read from, best first: the chain's predecessor, then the
    version's own slab and its copies, then earlier whole copies."""
    out = [(b.members[k], b.slots[k]) for b in before]
    out += [*a.copies[k]] if a.copies is not None else [(a.members[k], a.slots[k])]
    return out


def _copy(pool, a, dst, before, what, key):
    keeper = pool.keeper
    for k in range(len(a.members)):
        n = a.slab_len(k)
        lost = None
        for src in _sources(a, k, before):
            if src[0] in keeper.gone:
                lost = lost if lost is not None else src[0]
                continue
            try:
                keeper._copy(dst.heap, src, (dst.members[k], dst.slots[k]), n)
                break
            except PeerLost as e:
                if e.rank == dst.members[k]:
                    raise
                keeper.notice([e.rank] if e.rank is not None else [])
                lost = lost if lost is not None else e.rank
        else:
            raise PeerLost(f"slab {k} of tensor {key!r} of store {what!r} has no copy left "
                           f"to read (member {lost} was lost)", rank=lost,
                           host=None if lost is None else pool.world.hosts[lost])


def _views(pool, ver, what, first):
    """The version's tensors over Allocations listing every copy of each slab (the own
    ones, then the whole copies; `first`'s whole copy first when it has one)."""
    whole = sorted(ver.whole, key=lambda p: p[0] != first)
    out = {}
    for key, x in ver.backing.items():
        a = x._a
        if a.copies is None:
            a.copies = [[(m, s)] for m, s in zip(a.members, a.slots)]    # (pins it)
        own = [[*cs] for cs in a.copies]
        cs = [[(c[key]._a.members[k], c[key]._a.slots[k]) for _, c in whole if key in c]
              for k in range(len(a.members))]
        copies = [(w + o) if first is not None and any(m == first for m, _ in whole)
                  else (o + w) for o, w in zip(own, cs)]
        v = Allocation(pool, next(_aids), a.nbytes, a.heap, [c[0][0] for c in copies],
                       [c[0][1] for c in copies])
        v.copies = copies
        pool.keeper.allocs[v] = ((f"tensor {key!r} of store {what!r}", x.shape, x.dtype), 1)
        out[key] = ndarray(v, x._off, x._shape, x._strides, x._dtype)
    return out
