"""Direct algorithms over a channel: every rank sends its whole input to every other rank at
once, so a small collective is one exchange (one message to each peer: over tcp an unanswered
frame, channel.py), where the ring pays 2 (p - 1) steps and recursive doubling log2(p) (plus a
fold when p is not a power of two).

allreduce: each rank reduces every rank's input in rank order with one kernel call (the order
of the shared-memory team's one-shot and of ordered.py): the same bytes on every rank and the
same bytes as those algorithms, whatever the transport. allgather: each rank's input lands in
every other rank's slot and is copied to its row. broadcast: the root sends its data to every
rank while every other rank sends an empty message to every rank, so each rank checks every
other's call (a rank that disagrees on the root or the size is found by all of them) and no
rank returns before hearing from all.

Inputs larger than a slot go in slot-sized chunks, one exchange per chunk. Each rank moves
(p - 1) times its input, so select() picks these only for small messages and few ranks
(DIRECT_MAX bytes sent per rank, channel.DIRECT_RANKS); an explicit algorithm="direct" runs at any size.
"""

from .. import _native, env
from . import channel, register, ring

AR, AG, BC = 14, 15, 16      # algorithm ids in message headers

# The most bytes one rank sends in a direct call that select() picks (its input times p - 1):
# the ring moves about twice the input whatever p, in 2 (p - 1) steps, so the direct way wins
# while the data is small against the steps it saves. Measured with 2 ranks across two network
# namespaces on 2 cores (tests/netns.py; MPI's sockets on the same congestion control as ours),
# ring against direct in alternating jobs: 768 KiB 0.23 against 0.18 ms, 1 MiB 0.29-0.36
# against 0.20 (one native exchange: a net slot holds 1 MiB), 2 MiB 0.57-0.62 against
# 0.56-0.58 (two chunks), 3 MiB 0.65-0.69 against 0.66-0.74; bench/tcp.md.
# A partition inside a direct call can let one rank complete it while its peer gives it up;
# collectives/calls.py brings the two back in step (tests/test_recovery.py,
# tests/test_partition.py).
DIRECT_MAX = env.number("POOLTENSOR_DIRECT_MAX", 1024 * 1024)


def _others(g):
    """The other members' ranks, starting after this one (so that not every rank sends to
    rank 0 first)."""
    p, i = g.size, g.index
    return [g.ranks[(i + k) % p] for k in range(1, p)]


def _parts(nbytes, step):
    return channel.chunks(0, nbytes, step)


@register("allreduce", "direct")
def allreduce(world, x, out, *, code, op, sig):
    """Every input to every rank, reduced in rank order on each."""
    ch, g, o = channel.world_op(world, "direct", AR, sig, "direct allreduce")
    with o:
        if g.size == 1:
            if out is not x and x.nbytes:
                ring.raw(out)[:] = ring.raw(x)
            return
        step = ring.step_bytes(ch, x.dtype.itemsize)
        sent = False
        fast = ch.fast() if channel.NATIVE and x.nbytes <= step else None
        if fast is not None:
            # the whole exchange in native code (one chunk); what it hands back goes on below.
            # It waits for its peers as long as a Python wait spins before it notifies the
            # releases owed
            gid, seq, algo, sig = o.key
            try:
                r = fast.allreduce(gid, seq, algo, sig, op, code, x, out, channel.FLUSH_AFTER)
            except _native.Error as e:
                ch.native_error(e, x.nbytes)
            if r == 0:
                return
            sent = r == 1
        src, dst = ring.raw(x), ring.raw(out)
        parts = _parts(src.nbytes, step)
        others = _others(g)
        for lo, hi in parts:
            mine = src[lo:hi]
            if not sent:
                for d in others:
                    o.send(d, mine)
            rows = [None] * g.size
            rows[g.index] = mine
            for s in others:
                rows[g.ranks.index(s)] = o.recv(s, hi - lo)
            if hi > lo:
                _native.reduce(op, code, dst[lo:hi], rows)
            for s in others:
                o.release(s)


@register("allgather", "direct")
def allgather(world, x, out, *, sig):
    """Every input to every rank, copied to its row."""
    ch, g, o = channel.world_op(world, "direct", AG, sig, "direct allgather")
    with o:
        src, buf = ring.raw(x), ring.raw(out)
        n = src.nbytes
        if n:
            buf[g.index * n:(g.index + 1) * n] = src
        others = _others(g)
        for lo, hi in _parts(n, ch.slot_bytes):
            for d in others:
                o.send(d, src[lo:hi])
            for s in others:
                j = g.ranks.index(s)
                o.recv_into(s, buf[j * n + lo:j * n + hi])


@register("broadcast", "direct")
def broadcast(world, x, out, *, root, sig):
    """The root's data to every rank, with every rank's call checked by every other."""
    ch, g, o = channel.world_op(world, "direct", BC, sig, "direct broadcast")
    with o:
        buf = ring.raw(out)
        others = _others(g)
        parts = _parts(buf.nbytes, ch.slot_bytes)
        empty = buf[:0]
        R = g.ranks
        if R[g.index] == root:
            for k, (lo, hi) in enumerate(parts):
                for d in others:
                    o.send(d, buf[lo:hi])
                if k == 0:
                    for s in others:
                        o.recv_into(s, empty)
            return
        for d in others:
            o.send(d, empty)
        for k, (lo, hi) in enumerate(parts):
            for s in (others if k == 0 else [R[root]]):
                o.recv_into(s, buf[lo:hi] if s == R[root] else empty)


def size_ok(world, nbytes):
    """Whether select() may pick a direct algorithm for a message of nbytes per rank."""
    p = world.size
    return 1 < p <= channel.DIRECT_RANKS and nbytes * (p - 1) <= DIRECT_MAX

