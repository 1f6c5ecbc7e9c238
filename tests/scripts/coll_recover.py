"""A collective given up by the ranks on time fails on every rank, and the world recovers.

argv: phases, run in order, each followed by a World.barrier() and one correct call of every
collective (checked against numpy) on every rank. The last rank is the odd one out:

  late:K    it comes to collective K (allreduce, allgather, reduce_scatter, broadcast,
            barrier) well after the others gave it up: they get Timeout naming it within the
            timeout (plus a small margin); it gets Timeout at once, naming the call and the
            rank that gave up (no internal tag); every rank reports the call failed
  first:K   as late:K, with K the very first collective of the program (nothing set up yet)
  skip:K    it never calls K: the others get Timeout naming it; after the World.barrier() the
            world is in step again
  stop:K    it stops itself (SIGSTOP) instead of calling K: the others get Timeout within the
            timeout (plus a small margin), then rank 0 continues it (SIGCONT) and it calls K
  mismatch  it calls allgather where the others call allreduce, late: the others get Timeout,
            it gets CollectiveMismatch at once, naming the rank that gave up
Prints "recover ok" on every rank at the end.
"""
import faulthandler
import os
import signal
import sys
import time

import numpy as np

import collectives

world = collectives.init()
rank, size = world.rank, world.size
odd = size - 1
T = world.timeout
MARGIN = 1.5            # seconds past the timeout a Timeout may take (2 cores, shared)
LATE = T * 1.3 + 0.5    # how late the odd rank comes
x = np.arange(size * 6, dtype=np.float32).reshape(size, 6) + rank


def call(kind, arg=None):
    arg = x if arg is None else arg
    if kind == "barrier":
        return collectives.barrier()
    if kind == "broadcast":
        return collectives.broadcast(arg, root=0)
    return getattr(collectives, kind)(arg)


def check_all(tag):
    """Every collective, correct on every rank (the world is usable again)."""
    rows = [np.arange(size * 6, dtype=np.float32).reshape(size, 6) + r for r in range(size)]
    assert np.array_equal(collectives.allreduce(x), sum(rows)), tag
    assert np.array_equal(collectives.allgather(x), np.stack(rows)), tag
    assert np.array_equal(collectives.reduce_scatter(x), sum(rows)[rank]), tag
    assert np.array_equal(collectives.broadcast(x, root=0), rows[0]), tag
    collectives.barrier()
    big = np.full(300_000, rank + 1, np.float32)          # several staging chunks
    assert np.array_equal(collectives.allreduce(big), np.full(300_000, size * (size + 1) / 2,
                                                              np.float32)), tag


def on_time(kind, tag):
    t0 = time.monotonic()
    try:
        call(kind)
    except collectives.Timeout as e:
        took = time.monotonic() - t0
        assert e.rank == odd and f"rank {odd}" in str(e), f"{tag}: names rank {e.rank}: {e}"
        assert kind in str(e), f"{tag}: the message does not name the call: {e}"
        assert T * 0.9 <= took <= T + MARGIN, f"{tag}: Timeout after {took:.2f} s, timeout {T}"
        return "failed"
    raise AssertionError(f"{tag}: returned although rank {odd} did not come in time")


def comes_late(kind, tag, expect=collectives.Timeout):
    t0 = time.monotonic()
    try:
        call(kind)
    except expect as e:
        took = time.monotonic() - t0
        assert took < 1.0, f"{tag}: the late rank failed only after {took:.2f} s: {e}"
        text = str(e)
        assert kind in text and "collective call" in text, f"{tag}: call not named: {text}"
        assert "gave up" in text and 0 <= e.rank < odd and f"rank {e.rank}" in text, text
        assert "obj/" not in text and "team/" not in text and "ag/" not in text, text
        return "failed"
    except collectives.PooltensorError as e:
        raise AssertionError(f"{tag}: the late rank got {type(e).__name__}: {e}") from None
    raise AssertionError(f"{tag}: the late rank's call succeeded although it was given up")


def agree(tag, outcome, allowed=("failed",)):
    outs = world.allgather_object(outcome)
    assert all(o in allowed for o in outs), f"{tag}: outcomes differ between ranks: {outs}"


for phase in sys.argv[1:]:
    mode, _, kind = phase.partition(":")
    # a rank stuck in a phase shows where (the others fail within a few timeouts)
    faulthandler.dump_traceback_later(T * 6 + 10, exit=False)
    if mode != "first":
        collectives.allreduce(np.ones(4))      # things set up (and warm) on every rank
    if mode in ("late", "first"):
        if rank == odd:
            time.sleep(LATE)
            outcome = comes_late(kind, phase)
        else:
            outcome = on_time(kind, phase)
    elif mode == "mismatch":
        kind = "allreduce"
        if rank == odd:
            time.sleep(LATE)
            outcome = comes_late("allgather", phase, collectives.CollectiveMismatch)
        else:
            outcome = on_time(kind, phase)
    elif mode == "skip":
        outcome = "skipped" if rank == odd else on_time(kind, phase)
    elif mode == "stop":
        # every rank past the warm-up first: stopped right after a call, a peer can fail the
        # others' last acknowledgement of it over tcp (a race this test does not time)
        world.barrier(timeout=T * 4 + 20)
        if rank == odd:
            os.kill(os.getpid(), signal.SIGSTOP)
            try:
                call(kind)
                outcome = "completed"     # data that reached it before it was given up
            except collectives.PooltensorError as e:
                assert "gave up" in str(e) or "within" in str(e), f"{phase}: {e}"
                outcome = "failed"
        else:
            outcome = on_time(kind, phase)
            if rank == 0:
                os.kill(world.pids[odd], signal.SIGCONT)
    else:
        raise SystemExit(f"unknown phase {phase!r}")
    world.barrier(timeout=T * 4 + 20)
    if mode == "stop":
        agree(phase, outcome, ("failed", "completed"))
    elif mode != "skip":
        agree(phase, outcome)
    check_all(phase)
    faulthandler.cancel_dump_traceback_later()
    print(f"{phase} ok", flush=True)

world.barrier(timeout=T * 4 + 20)
print("recover ok", flush=True)
