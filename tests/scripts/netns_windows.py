"""One-sided windows between ranks on different hosts (network namespaces), run by
tests/test_netns.py: transports chosen per peer, get/put of many sizes in both directions,
atomics from every rank, asynchronous requests, refusals checked at the target, barriers.

    ip netns exec ptnsK python netns_windows.py LAYOUT      (LAYOUT: namespace of each rank)
"""
import sys

import numpy as np

import collectives
from collectives.errors import RemoteAccessError

layout = [int(x) for x in sys.argv[1].split(",")]
world = collectives.init()
me, n = world.rank, world.size
assert n == len(layout), (n, layout)

# -- transports: shared memory inside a namespace, tcp between them -------------------------
want = ["self" if r == me else ("shm" if layout[r] == layout[me] else "tcp") for r in range(n)]
assert world.transports == want, (world.transports, want, world.describe())

SIZE = 24 << 20
win = world.expose(SIZE)
buf = np.frombuffer(win.buffer, np.uint8)
rng = np.random.default_rng(1234)


def pattern(r, nbytes, salt=0):
    """Bytes (i * (r + 3) + salt) % 251: rank- and salt-specific, periodic (made by tiling)."""
    period = ((np.arange(251, dtype=np.int64) * (r + 3) + salt) % 251).astype(np.uint8)
    return np.resize(period, nbytes)


# every rank puts a rank-specific pattern into every other rank's memory, at its own offset
sizes = [0, 1, 7, 64, 4096, 65537, 256 << 10, (1 << 20) + 3]
slot = max(sizes) + 64
for peer in range(n):
    if peer != me:
        win.put(peer, me * slot, pattern(me, slot - 64, salt=peer))
world.barrier()
for src in range(n):
    if src == me:
        continue
    got = buf[src * slot:src * slot + slot - 64]
    assert np.array_equal(got, pattern(src, slot - 64, salt=me)), f"bytes from rank {src}"
world.barrier()

# gets of many sizes at odd offsets, from every peer
buf[:] = pattern(me, SIZE, salt=7)
world.barrier()
for peer in range(n):
    ref = pattern(peer, SIZE, salt=7)
    for s in sizes + [8 << 20, SIZE - 5]:
        off = int(rng.integers(0, SIZE - s + 1))
        out = np.empty(s, np.uint8)
        win.get(peer, off, out)
        assert np.array_equal(out, ref[off:off + s]), (peer, s, off)
world.barrier()

# puts of many sizes, read back with a get by the writer
target = (me + 1) % n
base = (SIZE // n) * me
for s in sizes + [4 << 20]:
    data = rng.integers(0, 256, s, dtype=np.uint8)
    off = base + int(rng.integers(0, SIZE // n - s)) if SIZE // n > s else base
    win.put(target, off, data)
    back = np.empty(s, np.uint8)
    win.get(target, off, back)
    assert np.array_equal(back, data), (target, s)
world.barrier()

# atomics: every rank adds to rank 0's counter; compare_swap elects one winner
if me == 0:
    buf[:64] = 0
world.barrier()
for _ in range(50):
    win.fetch_add(0, 0, 1)
old = win.compare_swap(0, 8, 0, me + 1)
world.barrier()
if me == 0:
    counter = int(buf[:8].view(np.int64)[0])
    winner = int(buf[8:16].view(np.int64)[0])
    assert counter == 50 * n, counter
    assert 1 <= winner <= n, winner
world.barrier()

# asynchronous gets from every peer at once, overlapping
reqs, outs = [], []
for peer in range(n):
    out = np.empty(2 << 20, np.uint8)
    reqs.append(win.get_async(peer, 1 << 20, out))
    outs.append((peer, out))
for r in reqs:
    r.wait(timeout=60)
world.barrier()
buf[:] = pattern(me, SIZE, salt=9)
world.barrier()
for peer, out in outs:
    win.get(peer, 1 << 20, out)
    assert np.array_equal(out, pattern(peer, SIZE, salt=9)[1 << 20:3 << 20]), peer

# refusals are decided at the target and leave it unchanged
for peer in range(n):
    if peer == me:
        continue
    for off, s in ((SIZE - 4, 8), (SIZE + 100, 1)):
        try:
            win.put(peer, off, np.ones(s, np.uint8))
            raise AssertionError(f"out-of-bounds put to rank {peer} accepted")
        except RemoteAccessError as e:
            assert e.rank == peer, e
world.barrier()
assert np.array_equal(buf[SIZE - 64:], pattern(me, SIZE, salt=9)[SIZE - 64:])
world.barrier()
win.close()
print(f"rank {me}: netns windows ok ({world.describe()['transports']})", flush=True)
collectives.finalize()
