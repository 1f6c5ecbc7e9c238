"""A job of 2 ranks serving metrics ($POOLTENSOR_METRICS: port + local rank) that rank 0 runs
`pooltensor doctor --json` against, naming both endpoints, while rank 1 waits; rank 0 prints
the doctor's exit status and JSON on one line. argv: the base port."""
import json
import subprocess
import sys

import numpy as np

import pooltensor as pt

base = int(sys.argv[1])
pool = pt.init(slab_size=4096, memory=8 << 20)
w = pool.world
x = pt.arange(100_000, dtype=np.float64)
assert float(x.sum()) == float(np.arange(100_000).sum())
pt.sync()
if w.rank == 0:
    args = [a for r in range(w.size) for a in ("--endpoint", f"127.0.0.1:{base + r}")]
    p = subprocess.run([sys.executable, "-m", "pooltensor", "doctor", "--json", *args],
                       capture_output=True, text=True, timeout=60)
    print("DOCTOR", p.returncode, json.dumps(json.loads(p.stdout)), flush=True)
pt.sync()
