"""Ordered allreduce over a channel: the deterministic allreduce where no shared-memory team
spans the ranks (ranks on several machines, or POOLTENSOR_TRANSPORT=tcp).

Every rank gathers every rank's input (a ring allgather, window by window so the scratch
memory stays bounded) and reduces the rows in rank order with one kernel call, as the team's
one-shot and two-shot algorithms do: the same bytes as theirs on every rank, whatever the
transport or chunking. It moves (p - 1) times the input to each rank, so it is the choice only
when deterministic=True asks for that order.
"""
import numpy as np

from .. import _native
from . import channel, register, ring

AR = 13            # algorithm id in message headers
WINDOW = 8 << 20   # bytes of each rank's input gathered per round


@register("allreduce", "ordered")
def allreduce(world, x, out, *, code, op, sig):
    """Allgather of the inputs, then a rank-order reduction on every rank."""
    ch, g, call = channel.world_op(world, "ordered", AR, sig, "ordered allreduce")
    with call as o:
        item = x.dtype.itemsize
        src, dst = ring.raw(x), ring.raw(out)
        n, p = src.nbytes, g.size
        win = max(item, WINDOW // item * item)
        tmp = np.empty(p * min(win, n), np.uint8)
        step = ring.step_bytes(ch, item)
        for lo in range(0, n, win) if n else [0]:   # one header-only round for no data
            hi = min(lo + win, n)
            w = hi - lo
            b = [k * w for k in range(p + 1)]
            buf = tmp[:p * w]
            buf[b[g.index]:b[g.index + 1]] = src[lo:hi]
            ring.allgather_v(o, g, buf, b, g.index, step)
            if w:
                _native.reduce(op, code, dst[lo:hi], [buf[b[k]:b[k + 1]] for k in range(p)])
