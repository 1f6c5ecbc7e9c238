"""Hierarchical algorithms: within each host over the shared-memory team, between host leaders
(local rank 0 of each host) over a channel, i.e. over whatever transport joins the hosts.

allreduce:      local team allreduce -> leaders allreduce (recursive doubling for small
                messages, ring for large) -> local team broadcast
allgather:      local team allgather -> leaders ring allgatherv of whole hosts -> local broadcast
reduce_scatter: local team allreduce (blocks in host order) -> leaders ring reduce_scatterv of
                whole hosts -> local broadcast of the host's blocks
broadcast:      team broadcast on the root's host (a check elsewhere) -> leaders chain ->
                team broadcast on the other hosts (a check on the root's)

The result comes from the leaders' phase, identical on every leader, and is copied within each
host, so it is bitwise identical on every rank (with a single host: the team's own result). A
mismatch found in one phase is carried into the next with a spoiled digest, so that every rank
raises: the leaders the error they met, the other ranks CollectiveMismatch naming their leader.
"""
import numpy as np

from ..errors import CollectiveMismatch, PooltensorError
from . import RECURSIVE_MAX, channel, recursive, register, ring, shm

AR, AG, RS, BC = 9, 10, 11, 12     # algorithm ids in message headers
SPOIL = 0x5BD1E995A5A5A5A5         # xor-ed into a digest to pass a failure on


class _Run:
    """The phases of one hierarchical call: remembers the first mismatch and carries it on."""

    def __init__(self, world, sig):
        self.world, self.sig, self.err = world, sig, None
        channel.meet(world, "hierarchical", sig)
        self.ch = channel.get(world)
        self.leaders = self.ch.groups[channel.LEADERS]
        self.is_leader = world.rank == world.local_ranks[0]
        team = world._get_team("local")     # collective over the world: every rank makes it
        self.team = team if world.local_size > 1 else None

    def vsig(self):
        return self.sig if self.err is None else self.sig ^ SPOIL

    def team_call(self, fn, *args):
        """fn(*args, sig) on the local team, keeping the first mismatch."""
        try:
            shm.call(self.world, self.team, fn, *args, self.vsig())
        except CollectiveMismatch as e:
            self.err = self.err or e

    def leaders_op(self, algo, what, body):
        """body(op) among the leaders, keeping the first mismatch."""
        if not self.is_leader or self.leaders.size < 2:
            return
        try:
            with self.ch.op(self.leaders, algo, self.vsig(), what) as o:
                body(o)
        except PooltensorError as e:
            # any failure here (mismatch between hosts, timeout, lost peer) reaches this
            # host's other ranks as a mismatch in the team call that follows
            self.err = self.err or e

    def finish(self):
        if self.err is not None:
            raise self.err


def _run(world, sig, body):
    r = _Run(world, sig)
    body(r)
    r.finish()


@register("allreduce", "hierarchical")
def allreduce(world, x, out, *, code, op, sig):
    """Team allreduce in each host, leaders allreduce, team broadcast."""
    def body(r):
        if r.team is not None:
            r.team_call(r.team.native.allreduce, op, code, x, out, x.size, 0)
        else:
            np.copyto(out, x)
        inner = recursive if x.nbytes <= RECURSIVE_MAX else ring
        buf = ring.raw(out)
        r.leaders_op(AR, "hierarchical allreduce (leaders)",
                     lambda o: inner.allreduce_group(o, r.leaders, buf, buf, op, code,
                                                     x.dtype.itemsize))
        if r.team is not None and r.leaders.size > 1:
            r.team_call(r.team.native.broadcast, 0, out, out.nbytes)
    _run(world, sig, body)


def _host_order(ch):
    return [q for h in ch.hosts for q in h]


def _host_bounds(ch, blk):
    b = [0]
    for h in ch.hosts:
        b.append(b[-1] + len(h) * blk)
    return b


@register("allgather", "hierarchical")
def allgather(world, x, out, *, sig):
    """Team allgather in each host, leaders allgather of whole hosts, team broadcast."""
    def body(r):
        ch, blk = r.ch, x.nbytes
        order = _host_order(ch)
        inplace = order == list(range(world.size))
        flat = ring.raw(out)
        allb = flat if inplace else np.empty(flat.nbytes, np.uint8)
        b = _host_bounds(ch, blk)
        h = ch.host_of[world.rank]
        mine = allb[b[h]:b[h + 1]]
        if r.team is not None:
            r.team_call(r.team.native.allgather, x, mine, blk)
        elif blk:
            mine[:] = ring.raw(x)
        r.leaders_op(AG, "hierarchical allgather (leaders)",
                     lambda o: ring.allgather_v(o, r.leaders, allb, b, h, ch.slot_bytes))
        if not inplace and r.is_leader and blk:
            for k, q in enumerate(order):
                flat[q * blk:(q + 1) * blk] = allb[k * blk:(k + 1) * blk]
        if r.team is not None:
            r.team_call(r.team.native.broadcast, 0, out, out.nbytes)
    _run(world, sig, body)


@register("reduce_scatter", "hierarchical")
def reduce_scatter(world, x, out, *, code, op, sig):
    """Team allreduce in each host, leaders reduce-scatter by host, team broadcast."""
    def body(r):
        ch, blk = r.ch, out.nbytes
        order = _host_order(ch)
        xs = x if order == list(range(world.size)) else np.ascontiguousarray(x[order])
        tmp = np.empty(x.shape, x.dtype)
        if r.team is not None:
            r.team_call(r.team.native.allreduce, op, code, xs, tmp, xs.size, 0)
        else:
            np.copyto(tmp, xs)
        flat = ring.raw(tmp)
        b = _host_bounds(ch, blk)
        h = ch.host_of[world.rank]
        step = ring.step_bytes(ch, x.dtype.itemsize)
        r.leaders_op(RS, "hierarchical reduce_scatter (leaders)",
                     lambda o: ring.reduce_scatter_v(o, r.leaders, flat, flat, b, op, code, step))
        mine = flat[b[h]:b[h + 1]]
        if r.team is not None and r.leaders.size > 1:
            r.team_call(r.team.native.broadcast, 0, mine, mine.nbytes)
        if blk:
            k = world.local_rank * blk
            ring.raw(out)[:] = mine[k:k + blk]
    _run(world, sig, body)


@register("broadcast", "hierarchical")
def broadcast(world, x, out, *, root, sig):
    """Team broadcast on the root's host, leaders chain, team broadcast elsewhere."""
    def body(r):
        ch = r.ch
        rh = ch.host_of[root]
        here = ch.host_of[world.rank] == rh
        buf = ring.raw(out)
        root_leads = ch.hosts[rh][0] == root
        first = here and not root_leads     # the root's data must reach its leader first
        if r.team is not None:
            # every host checks its call before the leaders' phase (a zero-byte broadcast when
            # there is nothing to move yet), so a mismatch anywhere reaches every rank
            if first:
                r.team_call(r.team.native.broadcast, ch.hosts[rh].index(root), out, out.nbytes)
            else:
                r.team_call(r.team.native.broadcast, 0, buf[:0], 0)
        r.leaders_op(BC, "hierarchical broadcast (leaders)",
                     lambda o: ring.broadcast_group(o, r.leaders, buf, rh))
        if r.team is not None:
            if first:                           # data already here: only pass on the verdict
                r.team_call(r.team.native.broadcast, 0, buf[:0], 0)
            else:
                r.team_call(r.team.native.broadcast, 0, out, out.nbytes)
    _run(world, sig, body)
