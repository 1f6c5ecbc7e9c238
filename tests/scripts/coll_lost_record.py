"""A partition that drops a rank's record of a call its peer completed: the world is usable
again after it (it used to stay one call apart for good, every later call failing).

Two ranks over tcp (POOLTENSOR_TRANSPORT=tcp), the direct allreduce. In call 2 the last rank's
data reaches rank 0, then "the partition starts": the last rank's send raises Timeout (as its
wait for rank 0's data would), so it gives the call up, and for CUT seconds every write and read
of the last rank to rank 0 through its windows fails with Timeout, as they do in a partition
(its record of the call and the channel's abort among them). Rank 0 completes the call. Both
then call allreduce until CALLS calls have been made: the failures are typed and within the
timeout, and from some call on every call succeeds, with the numpy result; at least SOUND calls
in a row at the end.

argv: CUT (seconds), CALLS, SOUND, and PAUSE: seconds rank 0 waits before call 3 (0 by
default). A pause longer than the partition (and shorter than the timeout) lets the record,
written again once the partition is over, reach rank 0 first: it then joins the last rank's
call 3 and no call after call 2 fails.
"""
import sys
import time

import numpy as np

import collectives
from collectives import PooltensorError, Timeout
from collectives.algorithms import channel

# the partition is simulated by replacing the window's calls, which the native one-exchange
# path does not go through: the channel's Python sends here (tests/test_partition.py cuts the
# native path's real frames with firewall rules)
channel.NATIVE = False

CUT, CALLS, SOUND = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
PAUSE = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
world = collectives.init()
rank, size = world.rank, world.size
odd = size - 1
T = world.timeout
MARGIN = 1.5
until = [0.0]          # the partition lasts until this monotonic time (0: no partition)


def x(i, r=None):
    return np.arange(1000, dtype=np.float64) * ((rank if r is None else r) + 1) + i


def want(i):
    return sum(x(i, r) for r in range(size))


def cut(fn):
    """fn, failing as in a partition while one lasts."""
    def call(*a, **k):
        if time.monotonic() < until[0]:
            time.sleep(0.01)
            raise Timeout("partitioned (test)", rank=0)
        return fn(*a, **k)
    return call


assert np.array_equal(collectives.allreduce(x(1), algorithm="direct"), want(1))
if rank == odd:
    ch, board = world._channels, world._calls.win
    real = ch.win.put_notify_quiet      # how the channel sends a small chunk over tcp

    def lost_answer(*a, **k):
        """The data lands; then the partition starts: nothing of rank 0's comes through (its
        data for this call, which this rank's wait gives up on, stands in as a Timeout here)."""
        real(*a, **k)
        until[0] = time.monotonic() + CUT
        ch.win.put_notify_quiet = cut(real)
        raise Timeout("the partition started after this rank's data left (test)", rank=0)

    ch.win.put_notify_quiet = lost_answer
    ch.win.put, ch.win.notify = cut(ch.win.put), cut(ch.win.notify)
    ch.win.put_notify = cut(ch.win.put_notify)
    board.put_notify, board.get = cut(board.put_notify), cut(board.get)
try:
    got = collectives.allreduce(x(2), algorithm="direct")
    assert np.array_equal(got, want(2))
    print(f"rank {rank}: call 2 ok", flush=True)
except PooltensorError as e:
    print(f"rank {rank}: call 2 {type(e).__name__}", flush=True)
    assert rank == odd, e
if rank == 0:
    time.sleep(PAUSE)

outcomes = []
for i in range(3, CALLS + 1):
    t0 = time.monotonic()
    try:
        got = collectives.allreduce(x(i), algorithm="direct")
        assert np.array_equal(got, want(i)), f"call {i}: wrong result"
        outcomes.append("ok")
    except (Timeout, collectives.CollectiveMismatch) as e:
        took = time.monotonic() - t0
        assert took < T + MARGIN, f"call {i}: {type(e).__name__} after {took:.1f} s"
        outcomes.append(type(e).__name__)
    print(f"rank {rank}: call {i} {outcomes[-1]}", flush=True)
sound = len(outcomes) - max((k + 1 for k, o in enumerate(outcomes) if o != "ok"), default=0)
assert sound >= SOUND, f"rank {rank}: only the last {sound} calls succeeded: {outcomes}"
print(f"rank {rank}: usable again after {len(outcomes) - sound} failed calls", flush=True)
