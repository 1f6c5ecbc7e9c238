"""Random gets and puts against a reference, then concurrent fetch_add from every rank.

Each rank owns a disjoint set of (target, region) stripes for writing, so the expected content of
every window is known exactly after a barrier.
"""
import sys

import numpy as np

import collectives

world = collectives.init()
rank, size = world.rank, world.size
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
n = 4096 + 8 * rank + 3          # every rank exposes a different, odd size
win = world.expose(n)
mine = win.buffer
seed_of = lambda r: np.random.default_rng(1000 + r).integers(0, 256, win.sizes[r], dtype=np.uint8)
mine[:] = seed_of(rank)
world.barrier()

# reference of every window as this rank expects it
ref = [seed_of(r) for r in range(size)]
rng = np.random.default_rng(rank)
for i in range(rounds):
    t = int(rng.integers(size))
    total = win.sizes[t]
    # writes go only to this rank's stripe of each target: bytes b with b % size == rank
    stripe = np.arange(rank, total, size)
    if rng.random() < 0.5:
        k = int(rng.integers(1, 40))
        lo = int(rng.integers(0, len(stripe) - k))
        # a put of one byte per owned position (offsets unaligned, lengths odd)
        for j in range(lo, lo + k, 7):
            off = int(stripe[j])
            val = rng.integers(0, 256, 1, dtype=np.uint8)
            if rng.random() < 0.5:
                win.put(t, off, val)
            else:
                win.put_async(t, off, val.copy()).wait(10)
            ref[t][off] = val[0]
    else:
        off = int(rng.integers(0, total))
        ln = int(rng.integers(0, total - off + 1))
        out = bytearray(ln)
        win.get(t, off, out)
        # bytes written by others may have changed; check only ours and the untouched seed
        got = np.frombuffer(out, np.uint8)
        idx = np.arange(off, off + ln)
        own = idx % size == rank
        assert np.array_equal(got[own], ref[t][off:off + ln][own]), (rank, t, off, ln)
win.flush()
world.barrier()
# after the barrier every rank's own stripe of every window is exactly its reference
for t in range(size):
    out = np.empty(win.sizes[t], np.uint8)
    req = win.get_async(t, 0, out)
    req.wait(10)
    assert req.test()
    own = np.arange(win.sizes[t]) % size == rank
    assert np.array_equal(out[own], ref[t][own]), (rank, t)
world.barrier()

# concurrent fetch_add on one counter of every rank; compare_swap as a lock-free max
counters = world.expose(64)
counters.buffer[:] = 0
world.barrier()
adds = 300
for i in range(adds):
    counters.fetch_add(i % size, 0, rank + 1)
for t in range(size):
    while True:
        old = counters.compare_swap(t, 8, 0, 0)  # read atomically
        if old >= rank or counters.compare_swap(t, 8, old, rank) == old:
            break
world.barrier()
total = int(counters.buffer[0:8].view(np.int64)[0])
expected = sum((r + 1) * len([i for i in range(adds) if i % size == rank]) for r in range(size))
assert total == expected, (rank, total, expected)
assert int(counters.buffer[8:16].view(np.int64)[0]) == size - 1
counters.close()
win.close()
print(f"rank {rank}: windows ok")
