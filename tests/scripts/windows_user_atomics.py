"""Atomics, gets and puts on windows over user memory (numpy arrays the ranks expose, not in our
segments), against MPI.Win on the same sequence (run under mpiexec).

1. In lockstep: step i, one rank does one fetch_add or compare_swap on one word of one rank's
   window, ours and MPI's; the old values must agree and so must the windows after each step.
2. Contended: every rank adds 1 to word 0 of every rank, k times, all at once, ours and MPI's:
   totals exact, and the old values each target handed out are 0..size*k-1, each once.
3. Gets and puts of odd lengths at odd offsets of the user buffers, checked against numpy.
"""
import sys

import numpy as np
from mpi4py import MPI

import collectives

world = collectives.init()
comm = MPI.COMM_WORLD
rank, size = world.rank, world.size
assert comm.Get_rank() == rank and comm.Get_size() == size
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 60
k = int(sys.argv[2]) if len(sys.argv) > 2 else 200
words = 8

ours = np.zeros(words, np.int64)                  # a user buffer: outside our segments
win = world.expose(ours)
assert world.describe()["transports"].count("shm") == size - 1
ref = np.zeros(words, np.int64)
mwin = MPI.Win.Create(ref, disp_unit=8, comm=comm)
mwin.Lock_all()


def mpi_fetch_add(t, w, v):
    res = np.zeros(1, np.int64)
    mwin.Fetch_and_op(np.array([v], np.int64), res, t, w, op=MPI.SUM)
    mwin.Flush(t)
    return int(res[0])


def mpi_words():
    """This rank's MPI window as MPI itself reads it (atomically; a plain load may run ahead
    of MPI's own progress)."""
    return np.array([mpi_fetch_add(rank, w, 0) for w in range(words)], np.int64)


def mpi_compare_swap(t, w, expected, new):
    res = np.zeros(1, np.int64)
    mwin.Compare_and_swap(np.array([new], np.int64), np.array([expected], np.int64), res, t, w)
    mwin.Flush(t)
    return int(res[0])


# 1. lockstep
rng = np.random.default_rng(7)                    # the same sequence on every rank
for i in range(steps):
    who, t, w = int(rng.integers(size)), int(rng.integers(size)), int(rng.integers(words))
    v = int(rng.integers(-1000, 1000))
    cas = rng.random() < 0.4
    expected = int(rng.integers(-3, 3)) if rng.random() < 0.5 else None
    if rank == who:
        if cas:
            if expected is None:                  # the current value: a swap that succeeds
                expected = mpi_fetch_add(t, w, 0)
            a = win.compare_swap(t, w * 8, expected, v)
            b = mpi_compare_swap(t, w, expected, v)
        else:
            a = win.fetch_add(t, w * 8, v)
            b = mpi_fetch_add(t, w, v)
        assert a == b, (i, who, t, w, cas, expected, v, a, b)
    comm.Barrier()                                # (MPI's target side progresses in MPI calls)
    world.barrier()
    mine = mpi_words()
    assert np.array_equal(ours, mine), (i, who, t, w, cas, expected, v, ours, mine)
    comm.Barrier()

# 2. contended fetch_add from every rank on every rank's word 0
base = int(ours[0])
assert base == mpi_words()[0]
comm.Barrier()
world.barrier()
olds = {t: [] for t in range(size)}
for j in range(k):
    for t in range(size):
        olds[t].append(win.fetch_add(t, 0, 1))
        mpi_fetch_add(t, 0, 1)
comm.Barrier()
world.barrier()
assert int(ours[0]) - base == size * k == mpi_words()[0] - base, (base, ours[0], mpi_words())
gathered = world.allgather_object([olds[t] for t in range(size)])
seen = sorted(v for per_rank in gathered for v in per_rank[rank])
assert seen == list(range(base, base + size * k)), "an old value handed out twice or skipped"
comm.Barrier()

# 3. gets and puts on user memory: odd lengths, odd offsets
blob = np.zeros(4096 + 3 * rank + 1, np.uint8)
bwin = world.expose(blob)
peer = (rank + 1) % size
prng = np.random.default_rng(100 + rank)
expect = np.zeros(bwin.sizes[peer], np.uint8)
for _ in range(40):                               # only this rank writes the peer's blob
    lo = int(prng.integers(0, expect.size - 1))
    n = int(prng.integers(1, min(700, expect.size - lo) + 1))
    data = prng.integers(0, 256, n, dtype=np.uint8)
    if prng.random() < 0.5:
        bwin.put(peer, lo, data)
    else:
        bwin.put_async(peer, lo, data).wait(10)
    expect[lo:lo + n] = data
    out = np.empty(n, np.uint8)
    bwin.get(peer, lo, out)
    assert np.array_equal(out, data)
whole = np.empty(expect.size, np.uint8)
bwin.get_async(peer, 0, whole).wait(10)
assert np.array_equal(whole, expect)
world.barrier()

mwin.Unlock_all()
mwin.Free()
for w in (win, bwin):
    w.close()
print(f"rank {rank}: user atomics ok ({collectives.native_info()['profile']})")
