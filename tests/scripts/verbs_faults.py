"""One injected fault of the simulated verbs provider, on two ranks over verbs (its tests check
our verbs logic, not hardware). argv[1]: fail (our next work request completes in error),
flush (our queue pair to ERR, receives flushed), silent (the peer's queue pairs stop
answering), qperr (the peer's queue pairs drop to ERR). Rank 0 meets the fault: the operation
ends in a typed error (PeerLost or Timeout) within the timeout, or, where the fault was seen
before any operation (flush), not at all; either way the peer is reached over tcp from then
on and the next operations work. Rank 1 then uses the link the other way: at most one typed
error, then it works too."""
import ctypes
import os
import sys
import time

import numpy as np

import collectives
from collectives import PeerLost, Timeout

FAIL, FLUSH, SILENT, QPERR = 1, 2, 3, 4
kind = sys.argv[1]
LIMIT = 3.0     # the native timeout of operations here (the world's own stays long: start-up)
world = collectives.init()
world._ctx.set_timeout(LIMIT)
rank, size = world.rank, world.size
peer = 1 - rank
fake = ctypes.CDLL(os.environ["POOLTENSOR_VERBS_LIB"])
win = world.expose(1 << 20)
win.buffer[:] = (np.arange(win.buffer.size) + rank) % 251
world.barrier(timeout=30)
want = ((np.arange(win.buffer.size) + peer) % 251).astype(np.uint8)


def works():
    out = np.empty(win.buffer.size // 2, np.uint8)
    win.get(peer, 0, out)
    assert np.array_equal(out, want[:out.size])
    win.put(peer, out.size + 8, np.full(10, 7, np.uint8))
    return win.fetch_add(peer, out.size + 64, 0)


def once_typed():
    """The first operation: a typed error within the timeout, or success; then it works."""
    t0 = time.monotonic()
    seen = None
    try:
        works()
    except (PeerLost, Timeout) as e:
        seen = type(e).__name__
        took = time.monotonic() - t0
        assert took < LIMIT + 2.0, f"{seen} after {took:.1f} s"
    works()
    return seen


if rank == 0:
    assert works() is not None and world.describe()["transports"][peer] == "verbs"
    if kind == "fail":
        fake.fakeverbs_fault(FAIL, os.getpid(), 1)
    elif kind == "flush":
        fake.fakeverbs_fault(FLUSH, os.getpid(), 0)
    elif kind == "silent":
        fake.fakeverbs_fault(SILENT, world.pids[peer], 1)
    elif kind == "qperr":
        fake.fakeverbs_fault(QPERR, world.pids[peer], 0)
    seen = once_typed()
    if kind != "flush":
        assert seen, f"{kind}: no error from the first operation after the fault"
    if kind == "silent":
        fake.fakeverbs_fault(SILENT, world.pids[peer], 0)
    d = world.describe()
    assert d["transports"][peer] == "tcp", d
    print(f"rank 0: {kind} -> {seen or 'seen before use'}, then tcp", flush=True)
world.barrier(timeout=30)
if rank == 1:
    seen = once_typed()
    print(f"rank 1: {seen or 'no error'}, then {world.describe()['transports'][peer]}",
          flush=True)
world.barrier(timeout=30)
print(f"rank {rank}: fault ok", flush=True)
