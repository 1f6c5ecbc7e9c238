"""A bare tcp target for tests: a server context (rank 0 of 1) serving one segment.

argv: secret_hex nbytes [port [host]]. Prints "port key" once listening, then serves until stdin closes (or
the process is killed, which is what the PeerLost tests do)."""
import sys

import numpy as np

from collectives import _native

secret, nbytes = bytes.fromhex(sys.argv[1]), int(sys.argv[2])
ctx = _native.Context(0, 1, 1)
ctx.set_secret(secret)
port = ctx.listen(sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1",
                  int(sys.argv[3]) if len(sys.argv) > 3 else 0)
seg = _native.Segment(nbytes)
ctx.add_segment(seg)
np.frombuffer(seg, np.uint8)[:] = np.arange(nbytes) % 251
key = ctx.register(seg, 3)
print(port, key, flush=True)
sys.stdin.read()
ctx.close()
