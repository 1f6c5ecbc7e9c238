"""Windows to peers in other processes over tcp or verbs, on real ranks: every size both ways,
unaligned offsets, many requests in flight, atomics, notify/wait, put_notify, put_indexed, and
what describe() says. argv[1]: `tcp` (run with POOLTENSOR_TRANSPORT=tcp: sizes up to 64 MiB,
and the listen address) or a verbs profile, `rc` or `uc-send` (run with
POOLTENSOR_TRANSPORT=verbs, POOLTENSOR_VERBS_LIB=tests/fakeverbs' library: sizes up to 8 MiB;
against the simulated provider it checks our verbs logic, not hardware)."""
import ctypes
import os
import sys

import numpy as np

import collectives
from collectives import _native

world = collectives.init()
rank, size = world.rank, world.size
right, left = (rank + 1) % size, (rank - 1) % size
d = world.describe()
KIND = "tcp" if sys.argv[1] == "tcp" else "verbs"
assert all(t == KIND for r, t in enumerate(d["transports"]) if r != rank), d
if KIND == "tcp":
    assert d["listen"] and d["listen"].rsplit(":", 1)[1].isdigit(), d
else:
    assert d["verbs"] and d["verbs"].startswith(sys.argv[1] + " on "), d

BIG = (64 if KIND == "tcp" else 8) << 20
win = world.expose(BIG + 4096)
mine = win.buffer
mine[:] = (np.arange(mine.size) + 7 * rank) % 253
world.barrier()


def expect(r, lo, hi):
    return ((np.arange(lo, hi) + 7 * r) % 253).astype(np.uint8)


# gets of every size class from the right neighbour: empty, tiny, chunk edges, 64 MiB
CHUNK = _native.TCP_FRAME
for n in (0, 1, 7, 4095, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5, BIG):
    off = 4096 - (n % 4096) if n < BIG else 0
    out = np.empty(n, np.uint8)
    win.get(right, off, out)
    assert np.array_equal(out, expect(right, off, off + n)), n
# many requests in flight at once (more than one connection keeps in flight)
rng = np.random.default_rng(rank)
reqs = []
for i in range(600 if KIND == "tcp" else 200):
    n = int(rng.integers(0, 3 * CHUNK)) if i % 50 == 0 else int(rng.integers(0, 300))
    off = int(rng.integers(0, BIG - n))
    out = np.empty(n, np.uint8)
    reqs.append((win.get_async(right, off, out), off, out))
for req, off, out in reqs:
    req.wait(30)
    assert np.array_equal(out, expect(right, off, off + out.size)), (off, out.size)
world.barrier()

# puts into the left neighbour's window, 64 MiB included, then read back by the owner
data = (np.arange(BIG) * 3 + rank).astype(np.uint8)
win.put(left, 0, data)
small = np.frombuffer(KIND.encode()[:3] * 100, np.uint8)
req = win.put_async(left, BIG, small)
req.wait(30)
world.barrier()
assert np.array_equal(mine[:BIG], (np.arange(BIG) * 3 + right).astype(np.uint8))
assert bytes(mine[BIG:BIG + 300]) == KIND.encode()[:3] * 100

# atomics and notify/wait on a counter window: every rank adds to every other rank
ctr = world.expose(64)
ctr.buffer[:] = 0
world.barrier()
for t in range(size):
    if t != rank:
        for _ in range(50):
            ctr.fetch_add(t, 0, rank + 1)
        ctr.notify(t, 8, 1)
ctr.wait_local(8, size - 1, timeout=30)
world.barrier()
want = sum(r + 1 for r in range(size) if r != rank) * 50
assert int(ctr.buffer[:8].view(np.int64)[0]) == want
old = ctr.compare_swap(right, 16, 0, 42)
world.barrier()
assert old == 0 and int(ctr.buffer[16:24].view(np.int64)[0]) == 42

# put_notify: the bytes are in before the counter moves
payload = np.full(5000, rank + 1, np.uint8)
mine[BIG + 1024:BIG + 1032] = 0
world.barrier()
win.put_notify(right, 3, payload, BIG + 1024, 1)
win.wait_local(BIG + 1024, 1, timeout=30)
assert np.all(mine[3:5003] == left + 1)
world.barrier()

# put_indexed: an element-precise scatter
offs = np.arange(0, 8000, 8, dtype=np.uint64) + 64
vals = np.arange(offs.size, dtype=np.int64) * (rank + 1)
win.put_indexed(right, offs, 8, vals)
world.barrier()
got = mine[64:64 + 8000].view(np.int64)
assert np.array_equal(got, np.arange(1000, dtype=np.int64) * (left + 1))

assert win.attach(right, 0, 16) is None, f"attach over {KIND} must not map anything"
world.barrier()
ctr.close()
win.close()
if KIND == "tcp":
    print(f"rank {rank}: tcp window ok", flush=True)
    sys.exit(0)
fake = ctypes.CDLL(os.environ["POOLTENSOR_VERBS_LIB"])
fake.fakeverbs_write_imm.restype = ctypes.c_ulonglong
if sys.argv[1] == "rc":   # notify and put_notify's counter went as WRITE_WITH_IMM
    assert fake.fakeverbs_write_imm() >= size * (size - 1), fake.fakeverbs_write_imm()
else:                     # Thunderbolt RDMA: SEND/RECV only
    assert fake.fakeverbs_write_imm() == 0, fake.fakeverbs_write_imm()
if os.environ.get("POOLTENSOR_FAKEVERBS_ATOMICS") == "glob":
    # the device's atomics are coherent (GLOB): fetch_add and compare_swap went as verbs atomics
    fake.fakeverbs_atomics.restype = ctypes.c_ulonglong
    assert fake.fakeverbs_atomics() >= 50 * (size - 1), fake.fakeverbs_atomics()
print(f"rank {rank}: device {world._ctx.verbs_info()[1]}", flush=True)
print(f"rank {rank}: verbs window ok", flush=True)
