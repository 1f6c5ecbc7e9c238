"""Placement policies: which member homes each slab of a new array.

A policy only proposes; the pool then checks each member's free slabs and spills what does
not fit (see ``spill``). Every function is a pure function of its arguments, so SPMD ranks that
call it with the same pool state get the same answer without exchanging a message.

- ``block`` (default): the array is cut into one contiguous run of slabs per member, in member
  order, so a scan moves from one member to the next and each member's part is one transfer.
- ``interleave``: slab k on member k % n (round robin): spreads any access pattern evenly.
- ``local``: the calling member, until it is full (then the rest spills to the others).
- ``balanced``: water-filling on free memory: the members with most free memory take slabs
  until every member has about as much left, laid out in blocks (most free first).
- a list of members, e.g. ``[1, 2]``: ``block`` over just those members (no spill outside).
- ``Explicit(homes)``: one member per slab, decided by the caller (a result array lined up
  with an operand, so each owner computes on local data).
"""
POLICIES = ("block", "interleave", "local", "balanced")


class Explicit:
    """A home member for every slab of one allocation (spills like any policy when full)."""

    __slots__ = ("homes",)

    def __init__(self, homes):
        self.homes = [int(m) for m in homes]

    def __repr__(self):
        return f"Explicit({len(self.homes)} slabs on members {sorted(set(self.homes))})"


def check(policy, nmembers):
    """Validate a placement argument; returns it normalized (str or tuple of members)."""
    if isinstance(policy, Explicit):
        if any(not 0 <= m < nmembers for m in policy.homes):
            raise ValueError(f"placement names a member outside 0..{nmembers - 1}")
        return policy
    if isinstance(policy, str):
        if policy not in POLICIES:
            raise ValueError(f"placement must be one of {POLICIES} or a list of members, "
                             f"not {policy!r}")
        return policy
    try:
        members = tuple(int(m) for m in policy)
    except TypeError:
        raise TypeError(f"placement must be a string or a list of members, not "
                        f"{type(policy).__name__}") from None
    if not members:
        raise ValueError("placement list is empty")
    for m in members:
        if not 0 <= m < nmembers:
            raise ValueError(f"member {m} out of range: the pool has members 0..{nmembers - 1}")
    if len(set(members)) != len(members):
        raise ValueError(f"placement list names a member twice: {list(members)}")
    return members


def _blocks(nslabs, members):
    """Contiguous near-equal blocks over `members`, in their order: per-slab member list."""
    n = len(members)
    base, extra = divmod(nslabs, n)
    out = []
    for i, m in enumerate(members):
        out += [m] * (base + (1 if i < extra else 0))
    return out


def plan(policy, nslabs, free, me):
    """Per-slab home members (a list of length nslabs), before spilling.

    free: free slabs of each member (list); me: the calling member."""
    n = len(free)
    if isinstance(policy, Explicit):
        if len(policy.homes) != nslabs:
            raise ValueError(f"explicit placement of {len(policy.homes)} slabs for an "
                             f"allocation of {nslabs}")
        return list(policy.homes)
    if isinstance(policy, tuple):
        return _blocks(nslabs, policy)
    if policy == "block":
        return _blocks(nslabs, list(range(n)))
    if policy == "interleave":
        return [k % n for k in range(nslabs)]
    if policy == "local":
        return [me] * nslabs
    if policy == "balanced":
        counts = water_fill(nslabs, free)
        order = sorted(range(n), key=lambda m: (-free[m], m))
        out = []
        for m in order:
            out += [m] * counts[m]
        return out
    raise ValueError(f"unknown placement {policy!r}")


def water_fill(nslabs, free):
    """Counts per member that leave the free slabs as even as possible (most free first)."""
    n = len(free)
    counts = [0] * n
    left = [int(f) for f in free]
    remaining = min(nslabs, sum(left))
    order = sorted(range(n), key=lambda m: (-left[m], m))
    while remaining > 0:
        top = left[order[0]]
        group = [m for m in order if left[m] == top]
        nxt = max((left[m] for m in order if left[m] < top), default=0)
        room = (top - nxt) * len(group)
        take = min(room, remaining)
        each, extra = divmod(take, len(group))
        for i, m in enumerate(group):
            t = each + (1 if i < extra else 0)
            counts[m] += t
            left[m] -= t
        remaining -= take
        order = sorted(range(n), key=lambda m: (-left[m], m))
    counts[order[0]] += nslabs - sum(counts)   # more than fits: let the caller report it
    return counts


def spill(homes, free, allowed):
    """Move slabs whose member lacks room onto `allowed` members with the most room left.

    The last slabs of an over-full member move (its first ones stay where planned), so runs
    stay contiguous. Returns the new per-slab list, or None if the allowed members cannot take
    the excess."""
    need = {}
    for m in homes:
        need[m] = need.get(m, 0) + 1
    over = {m: c - int(free[m]) for m, c in need.items() if c > free[m]}
    if not over:
        return homes
    spare = {m: int(free[m]) - min(need.get(m, 0), int(free[m])) for m in sorted(allowed)}
    if sum(over.values()) > sum(spare.values()):
        return None
    out = list(homes)
    for k in range(len(out) - 1, -1, -1):
        m = out[k]
        if over.get(m, 0) > 0:
            dest = max(spare, key=spare.__getitem__)   # ties: the lowest member
            out[k] = dest
            spare[dest] -= 1
            over[m] -= 1
    return out


def plan_servers(policy, nslabs, free):
    """Per-slab homes for a client pool: the policy applied to the servers (members 1..k);
    member 0, this process, holds nothing."""
    if isinstance(policy, Explicit):   # lined up with an operand
        return plan(policy, nslabs, free, 0)
    if isinstance(policy, tuple):
        if 0 in policy:
            raise ValueError("member 0 is this process, which contributes no memory to a pool "
                             "on memory servers: name servers (members 1.."
                             f"{len(free) - 1})")
        return plan(policy, nslabs, free, 0)
    if policy == "local":
        raise ValueError("placement='local' means this process, which contributes no memory "
                         "to a pool on memory servers: use 'block', 'interleave', 'balanced' "
                         "or a list of servers (members 1..{})".format(len(free) - 1))
    return [m + 1 for m in plan(policy, nslabs, free[1:], 0)]
