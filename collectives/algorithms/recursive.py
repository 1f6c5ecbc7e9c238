"""Recursive doubling over a channel: log2(p) exchange rounds with partner index ^ 2^k, for small
messages at higher rank counts (latency log2(p) hops instead of the ring's 2 (p-1)).

allreduce: with p not a power of two, the first 2 * rem members fold in pairs (the even one
hands its data to the odd one, which takes part, and gets the result back at the end). Every
combination is (lower-index data) op (higher-index data), so both partners of a round compute
the same bytes, and after the last round every member holds the same bytes.

allgather: power-of-two groups exchange the contiguous run of blocks they hold, doubling each
round; other sizes use the ring.
"""
from .. import _native
from . import channel, register, ring

AR, AG = 5, 6      # algorithm ids in message headers


def allreduce_group(o, g, x, out, opc, code, itemsize):
    """Recursive-doubling allreduce of flat uint8 buffers x into out (out may be x)."""
    if out is not x:
        out[:] = x
    p, i = g.size, g.index
    if p == 1:
        return
    R = g.ranks
    parts = channel.chunks(0, out.nbytes, ring.step_bytes(o.ch, itemsize))
    p2, rem, new, fold = channel.rd_layout(p, i)
    if new is None:                      # even member of a fold pair: hand over, wait
        for lo, hi in parts:
            o.send(R[fold], out[lo:hi])
        for lo, hi in parts:
            o.recv_into(R[fold], out[lo:hi])
        return
    if fold is not None:                 # odd member: take in the even (lower) one's data
        for lo, hi in parts:
            v = o.recv(R[fold], hi - lo)
            if hi > lo:
                _native.reduce(opc, code, out[lo:hi], [v, out[lo:hi]])
            o.release(R[fold])
    mask = 1
    while mask < p2:
        j = new ^ mask
        peer = R[channel.rd_member(j, rem)]
        lower = j < new
        for lo, hi in parts:
            o.send(peer, out[lo:hi])
            v = o.recv(peer, hi - lo)
            if hi > lo:
                mine = out[lo:hi]
                _native.reduce(opc, code, mine, [v, mine] if lower else [mine, v])
            o.release(peer)
        mask <<= 1
    if fold is not None:
        for lo, hi in parts:
            o.send(R[fold], out[lo:hi])


def allgather_group(o, g, buf, blk):
    """Recursive-doubling allgather in place (p a power of two): buf holds this member's
    block of blk bytes at its index; afterwards every block."""
    p, i = g.size, g.index
    R = g.ranks
    step = o.ch.slot_bytes
    mask = 1
    while mask < p:
        j = i ^ mask
        mine = (i & ~(mask - 1)) * blk
        theirs = (j & ~(mask - 1)) * blk
        span = mask * blk
        sends = channel.chunks(mine, mine + span, step)
        recvs = channel.chunks(theirs, theirs + span, step)
        for (slo, shi), (rlo, rhi) in zip(sends, recvs):
            o.send(R[j], buf[slo:shi])
            o.recv_into(R[j], buf[rlo:rhi])
        mask <<= 1


@register("allreduce", "recursive_doubling")
def allreduce(world, x, out, *, code, op, sig):
    """Recursive-doubling allreduce over every rank (any number of ranks)."""
    ch, g, call = channel.world_op(world, "recursive_doubling", AR, sig,
                                   "recursive-doubling allreduce")
    with call as o:
        allreduce_group(o, g, ring.raw(x), ring.raw(out), op, code, x.dtype.itemsize)


@register("allgather", "recursive_doubling")
def allgather(world, x, out, *, sig):
    """Recursive-doubling allgather over every rank (the ring when not a power of two)."""
    if world.size & (world.size - 1):
        return ring.allgather(world, x, out, sig=sig)
    ch, g, call = channel.world_op(world, "recursive_doubling", AG, sig,
                                   "recursive-doubling allgather")
    with call as o:
        buf = ring.raw(out)
        n = x.nbytes
        if n:
            buf[g.index * n:(g.index + 1) * n] = ring.raw(x)
        allgather_group(o, g, buf, n)
