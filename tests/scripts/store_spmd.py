"""SPMD ranks share a store (tests/test_store.py): every rank loads the same safetensors file
(collective), reads every tensor (slabs on both ranks, each with a copy on the other) and
compares it with the safetensors package's reader; a published version is seen by every
rank while the old one stays readable until it is closed."""
import sys

import numpy as np
from safetensors import safe_open

import pooltensor as pt

path = sys.argv[1]
pool = pt.init()
me = pool.me
s = pt.store.load_safetensors(path, name="m", replicas=2)
with safe_open(path, framework="numpy") as f:
    ref = {k: f.get_tensor(k) for k in f.keys()}
assert sorted(s) == sorted(ref)
for k, v in ref.items():
    got = np.asarray(s[k])
    assert got.dtype == v.dtype and got.shape == v.shape and got.tobytes() == v.tobytes(), k
big = s["big"]._a
assert set(big.members) == set(range(pool.size)), big.members     # spread over the ranks
assert all(len(c) == 2 for c in big.copies)
new = pt.store.publish("m", {"x": np.arange(10.0)})
assert pt.store.open("m").version == 2 and new.version == 2
assert np.asarray(s["big"]).tobytes() == ref["big"].tobytes()      # the old version, held
assert pt.store.list()["m"]["version"] == 2
s.close()
pt.sync()
print(f"store spmd ok {me}", flush=True)
pt.finalize()
