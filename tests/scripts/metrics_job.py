"""A plain script with two members whose metrics endpoint the command-line tests read:
prints "port N" once its pool is made and some slabs have moved, keeps moving them while
stdin is open, and ends when it closes."""
import sys
import threading

import numpy as np

import pooltensor as pt

pool = pt.init(members=2, slab_size=4096, memory=8 << 20, cache_bytes=4 * 4096, attach=False,
               metrics="127.0.0.1:0")
x = pt.arange(200_000, dtype=np.float64)
assert np.array_equal(x.to_numpy(), np.arange(200_000))
print("port", pool.metrics_exporter.port, flush=True)
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.wait(0.1):
    x[1000:3000].to_numpy()
pt.finalize()
