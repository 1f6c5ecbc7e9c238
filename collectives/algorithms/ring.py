"""Ring algorithms over a channel: pipelined chunk by chunk, one neighbour each way.

allreduce = reduce-scatter then allgather around the ring (each member sends and receives
2 (p-1)/p of the data); the allgather phase hands every member the same reduced bytes, so the
result is bitwise identical everywhere.
Blocks may differ in size (allgatherv / reduce_scatterv), which hierarchical.py uses.
Broadcast is a chain from the root, forwarded chunk by chunk, opened by a check of each
member's call with its neighbour and closed by an acknowledgement from the last member to the
root and a commit from the root down the chain.
"""
from itertools import zip_longest

import numpy as np

from .. import _native, env
from . import channel, register

AR, AG, RS, BC = 1, 2, 3, 4      # algorithm ids in message headers


def raw(a):
    """A flat uint8 view of a C-contiguous array."""
    return a.reshape(-1).view(np.uint8)


def block_bounds(count, p, itemsize):
    """Byte offsets of p blocks of count elements, the first count % p one element longer."""
    base, extra = divmod(count, p)
    b = [0]
    for k in range(p):
        b.append(b[-1] + (base + (k < extra)) * itemsize)
    return b


# Over the network a block goes in about NET_PIECES chunks of at least NET_CHUNK_MIN bytes (at
# most a slot): the next chunk's send is in flight while one is reduced, and a large message
# pays few per-chunk costs (each a message and a wake-up on both sides). Measured with 2 ranks
# across namespaces on 2 loaded cores, chunk sizes interleaved in one job: 1 MiB fastest in
# 128-256 KiB chunks, 4 and 16 MiB in 512 KiB-1 MiB ones; 64 KiB chunks cost 1.6-4x. With
# every chunk an unanswered frame (no round trip), 512 KiB too: 0.19-0.22 ms in 128 KiB chunks
# against 0.30-0.42 in 64 KiB ones (bench/tcp.py, three runs alternating). Sending each chunk
# one ahead of the receive was slower (2 MiB 1.1-1.2x MPICH's time against 0.6-0.85x), so a
# chunk goes once the one before it was received and used.
NET_PIECES = env.number("POOLTENSOR_RING_PIECES", 4)
NET_CHUNK_MIN = 128 * 1024


def step_bytes(ch, itemsize, block=0):
    """Chunk size in bytes for blocks of up to `block` bytes: the most whole elements that fit
    in one slot; over the network (ch.net, the same on every rank) about a NET_PIECES-th of the
    block, at least NET_CHUNK_MIN."""
    s = ch.slot_bytes
    if ch.net and block > 0:
        s = min(s, max(NET_CHUNK_MIN, block // max(1, NET_PIECES)))
    return max(1, s // itemsize) * itemsize


def _exchange(o, right, left, send_buf, sb, recv_blk, step, consume):
    """Send block sb of send_buf to the right while receiving recv_blk from the left, chunk by
    chunk; consume(view, lo, hi) uses each received chunk before its slot is released."""
    sends = channel.chunks(sb[0], sb[1], step)
    recvs = channel.chunks(recv_blk[0], recv_blk[1], step)
    for sc, rc in zip_longest(sends, recvs):
        if sc is not None:
            o.send(right, send_buf[sc[0]:sc[1]])
        if rc is not None:
            lo, hi = rc
            v = o.recv(left, hi - lo)
            if hi > lo:
                consume(v, lo, hi)
            o.release(left)


def reduce_scatter_v(o, g, src, dst, b, opc, code, step):
    """Ring reduce-scatter: dst[b[i]:b[i+1]] = reduction over members of src's block i, where
    i is this member's index. dst receives the partial blocks on the way; src may be dst."""
    p, i = g.size, g.index
    if p == 1:
        if dst is not src:
            dst[b[0]:b[1]] = src[b[0]:b[1]]
        return
    right, left = g.ranks[(i + 1) % p], g.ranks[(i - 1) % p]

    def consume(v, lo, hi):
        _native.reduce(opc, code, dst[lo:hi], [v, src[lo:hi]])

    for s in range(p - 1):
        sb, rb = (i - s - 1) % p, (i - s - 2) % p
        _exchange(o, right, left, src if s == 0 else dst, (b[sb], b[sb + 1]),
                  (b[rb], b[rb + 1]), step, consume)


def allgather_v(o, g, buf, b, own, step):
    """Ring allgather in place: buf holds block `own` of this member; afterwards all blocks."""
    p, i = g.size, g.index
    if p == 1:
        return
    right, left = g.ranks[(i + 1) % p], g.ranks[(i - 1) % p]

    def consume(v, lo, hi):
        buf[lo:hi] = v

    for s in range(p - 1):
        sb, rb = (own - s) % p, (own - s - 1) % p
        _exchange(o, right, left, buf, (b[sb], b[sb + 1]), (b[rb], b[rb + 1]), step, consume)


def allreduce_group(o, g, x, out, opc, code, itemsize):
    """Ring allreduce of flat uint8 buffers x into out (out may be x)."""
    if g.size == 1:
        if out is not x:
            out[:] = x
        return
    b = block_bounds(x.nbytes // itemsize, g.size, itemsize)
    step = step_bytes(o.ch, itemsize, b[1] - b[0])
    reduce_scatter_v(o, g, x, out, b, opc, code, step)
    allgather_v(o, g, out, b, g.index, step)


def broadcast_group(o, g, buf, root):
    """Chain broadcast of flat uint8 buf from member index root, pipelined by chunk.

    It opens with a header-only message to the right neighbour (a check of the call) and
    closes with an acknowledgement from the last member to the root and a commit from the root
    down the chain: every member returns only once every member has checked its call."""
    p, i = g.size, g.index
    if p == 1:
        return
    step = o.ch.slot_bytes
    pos = (i - root) % p
    right, left = g.ranks[(i + 1) % p], g.ranks[(i - 1) % p]
    parts = channel.chunks(0, buf.nbytes, step)
    empty = buf[:0]
    # every member first checks its left neighbour's call: members that disagree on the root
    # would otherwise all wait to be sent to
    o.send(right, empty)
    o.recv_into(left, empty)
    if pos == 0:
        for lo, hi in parts:
            o.send(right, buf[lo:hi])
        o.recv_into(left, empty)        # the acknowledgement from the last member
        if p > 2:
            o.send(right, empty)        # commit
        return
    for lo, hi in parts:
        o.recv_into(left, buf[lo:hi])
        if pos < p - 1:
            o.send(right, buf[lo:hi])
    if pos == p - 1:
        o.send(right, empty)
    else:
        o.recv_into(left, empty)
        if pos < p - 2:
            o.send(right, empty)


# ---- registered algorithms (the world group) ------------------------------------------------

@register("allreduce", "ring")
def allreduce(world, x, out, *, code, op, sig):
    """Ring allreduce over every rank: reduce-scatter, then allgather, pipelined by chunk."""
    ch, g, o = channel.world_op(world, "ring", AR, sig, "ring allreduce")
    with o:
        allreduce_group(o, g, raw(x), raw(out), op, code, x.dtype.itemsize)


@register("allgather", "ring")
def allgather(world, x, out, *, sig):
    """Ring allgather over every rank: p - 1 steps, each passing one block on."""
    ch, g, o = channel.world_op(world, "ring", AG, sig, "ring allgather")
    with o:
        buf = raw(out)
        n = x.nbytes
        b = [k * n for k in range(g.size + 1)]
        if n:
            buf[b[g.index]:b[g.index + 1]] = raw(x)
        allgather_v(o, g, buf, b, g.index, step_bytes(ch, 1, n))


@register("reduce_scatter", "ring")
def reduce_scatter(world, x, out, *, code, op, sig):
    """Ring reduce-scatter over every rank: each block reduced on its way round the ring."""
    ch, g, o = channel.world_op(world, "ring", RS, sig, "ring reduce_scatter")
    with o:
        n = out.nbytes
        b = [k * n for k in range(g.size + 1)]
        tmp = np.empty(x.nbytes, np.uint8)
        reduce_scatter_v(o, g, raw(x), tmp, b, op, code,
                         step_bytes(ch, x.dtype.itemsize, n))
        if n:
            raw(out)[:] = tmp[b[g.index]:b[g.index + 1]]


@register("broadcast", "ring")
def broadcast(world, x, out, *, root, sig):
    """Chain broadcast from root over every rank, pipelined by chunk."""
    ch, g, o = channel.world_op(world, "ring", BC, sig, "ring broadcast")
    with o:
        broadcast_group(o, g, raw(out), root)
