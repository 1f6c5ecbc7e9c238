"""Every rank of an SPMD job serves its metrics ($POOLTENSOR_METRICS) on port + local rank;
rank 0 scrapes both endpoints and finds each rank's own counters there. argv: the base port."""
import sys
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

import pooltensor as pt

base = int(sys.argv[1])
pool = pt.init(slab_size=4096, memory=8 << 20)
w = pool.world
assert pool.metrics_exporter.port == base + w.local_rank, (pool.metrics_exporter.port, base)
x = pt.arange(100_000, dtype=np.float64)
assert float(x.sum()) == float(np.arange(100_000).sum())
pt.sync()
if w.rank == 0:
    for r in range(w.size):
        with urllib.request.urlopen(f"http://127.0.0.1:{base + r}/metrics", timeout=20) as f:
            fams = {m.name: m for m in text_string_to_metric_families(f.read().decode())}
        members = {s.labels["member"] for s in fams["pooltensor_ops"].samples}
        assert members == {str(r)}, members
        peers = {s.labels["peer"] for s in fams["pooltensor_peer_up"].samples}
        assert peers == {"0", "1"}
        kinds = {s.labels["op"] for s in fams["pooltensor_ops"].samples}
        assert "allreduce" in kinds or "allgather" in kinds, kinds
pt.sync()
print("ok")
