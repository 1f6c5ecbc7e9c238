"""Creates, fills, reads back and writes a 24 MB pool array (over a 1 MB progress threshold
the test sets): the progress bars' cases. Prints "ok" when the values are right."""
import numpy as np

import pooltensor as pt

pt.init(slab_size=1 << 20, memory=128 << 20, cache_bytes=4 << 20)
x = pt.full(3_000_000, 2.0)
y = x.to_numpy()
x[:] = np.ones(3_000_000)
assert y.sum() == 6_000_000 and float(x.sum()) == 3_000_000
print("ok", flush=True)
