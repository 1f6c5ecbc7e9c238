"""Ranks on different hosts (network namespaces), run by tests/test_verbs.py: the transport
to each peer is chosen per peer, shared memory inside a namespace and, between namespaces,
verbs where both ends have it (here the simulated provider, whose fabric every namespace
sees) or tcp where they do not, with describe() saying why in one line; then gets from every
peer and a hierarchical allreduce (the hosts' leaders talk over the chosen transport) against
numpy. Checks our verbs logic, not hardware.

    ip netns exec ptnsK python verbs_hosts.py LAYOUT REMOTE   (REMOTE: verbs or tcp)
"""
import sys

import numpy as np

import collectives

layout = [int(x) for x in sys.argv[1].split(",")]
remote = sys.argv[2]
world = collectives.init()
me, n = world.rank, world.size
d = world.describe()
want = ["self" if r == me else ("shm" if layout[r] == layout[me] else remote) for r in range(n)]
assert d["transports"] == want, (d["transports"], want, d)
if remote == "tcp":
    assert d["verbs"].startswith("verbs not available: ") and "tcp" in d["verbs"], d["verbs"]
else:
    assert d["verbs"].startswith("rc on "), d["verbs"]
win = world.expose(1 << 20)
win.buffer[:] = (np.arange(win.buffer.size) * (me + 1)) % 251
world.barrier()
for r in range(n):
    out = np.empty(win.buffer.size, np.uint8)
    win.get(r, 0, out)
    assert np.array_equal(out, ((np.arange(out.size) * (r + 1)) % 251).astype(np.uint8)), r
x = np.arange(100_000, dtype=np.float64) * (me + 1)
got = collectives.allreduce(x, algorithm="hierarchical")
assert np.array_equal(got, np.arange(100_000, dtype=np.float64) * sum(range(1, n + 1)))
world.barrier()
print(f"rank {me}: hosts ok {d['transports']} | {d['verbs']}", flush=True)
