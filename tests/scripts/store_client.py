"""A plain script on memory servers for tests/test_store.py: `load PATH NAME` loads a
safetensors file as store NAME and leaves; `open NAME` opens it and prints each tensor's
key, dtype, shape and the sha256 of its bytes; `half NAME` writes a version's parts and
dies before publishing it."""
import hashlib
import sys

import numpy as np

import pooltensor as pt

secret, servers, cmd = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
pt.init(connect=servers, secret_file=secret, memory=16 << 20)
if cmd == "load":
    s = pt.store.load_safetensors(sys.argv[4].split(","), name=sys.argv[5])
    print("loaded", s.name, s.version, len(s), flush=True)
elif cmd == "half":              # dies after writing every part, before publishing
    import os

    from pooltensor.store import kept
    w = {"w": np.arange(1 << 20, dtype=np.float32)}
    kept.write(pt.current(), sys.argv[4], 1, list(w.items()), [1, 2], {}, copies=2)
    print("written", flush=True)
    os._exit(3)
elif cmd == "open":
    with pt.store.open(sys.argv[4]) as s:
        for k in sorted(s):
            a = np.asarray(s[k])
            print("tensor", k, a.dtype.name, a.shape,
                  hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).tobytes()).hexdigest(),
                  flush=True)
pt.finalize()
print("done", flush=True)
