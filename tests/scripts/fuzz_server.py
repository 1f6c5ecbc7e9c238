"""The target of the tcp protocol fuzzer: one process with a native Context serving
registrations of known content over tcp, surrounded by canaries.

Why a process of its own: the fuzzer must see the server survive (same pid, still serving),
and a crash in the native server must not take the fuzzer down with it.

    python tests/scripts/fuzz_server.py SECRET_HEX SEED [HOST]

Prints one JSON line when it serves: {"port", "pid", "regs": {name: {key, len, access,
seg, align}}, "stale_key"}. Then reads commands, one a line, answering each with one JSON line:

    stats     the listener's tcp_stats()
    digest    sha256 (hex) of every registration and of all canary bytes together
    dump NAME the registration's bytes (hex)
    quit      stop serving and exit 0

Layout: a 1 MiB segment filled with seeded random bytes, registrations cut out of it with
gaps between them (the gaps are the canaries), and two registrations over a numpy buffer
outside any segment (served by pointer, atomics refused), with canaries on both sides.
"""
import hashlib
import json
import os
import random
import sys

import numpy as np

# POOLTENSOR_FUZZ_ROOT: serve with the collectives package found there (a sanitizer build)
sys.path.insert(0, os.environ.get("POOLTENSOR_FUZZ_ROOT") or
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from collectives import _native  # noqa: E402

SEG_BYTES = 1 << 20
# name: (offset in the segment, length, access); offsets leave canary gaps of >= 4 KiB,
# "odd" starts 4 bytes past an 8-byte boundary (every atomic on it is misaligned)
SEG_REGS = {
    "ro": (4096, 65536, 1),
    "rw": (4096 * 18, 65536, 3),
    "legit": (4096 * 36, 65536, 3),
    "atom": (4096 * 54, 4096, 3),
    "odd": (4096 * 56 + 4, 4096, 3),
    "tiny": (4096 * 58, 8, 3),
    "empty": (4096 * 59, 0, 3),
    "small_ro": (4096 * 60, 64, 1),
}
HEAP_CANARY = 4096
HEAP_REGS = {"heap_rw": (16384, 3), "heap_ro": (16384, 1)}


def build(seed):
    """The context, the memory it serves, and the description printed for the fuzzer."""
    rng = random.Random(seed)
    ctx = _native.Context(0, 1)
    seg = _native.Segment(SEG_BYTES)
    view = np.frombuffer(memoryview(seg), np.uint8)
    view[:] = np.frombuffer(rng.randbytes(SEG_BYTES), np.uint8)
    ctx.add_segment(seg)
    mv = memoryview(seg)
    regs, spans = {}, {}
    for name, (off, n, access) in SEG_REGS.items():
        key = ctx.register(mv[off:off + n], access)
        regs[name] = {"key": key, "len": n, "access": access, "seg": True,
                      "align": (seg.address + off) % 8}
        spans[name] = (view, off, n)
    heap = {}
    for name, (n, access) in HEAP_REGS.items():
        buf = np.frombuffer(bytearray(rng.randbytes(n + 2 * HEAP_CANARY)), np.uint8)
        key = ctx.register(buf[HEAP_CANARY:HEAP_CANARY + n], access)
        addr = buf.ctypes.data + HEAP_CANARY
        regs[name] = {"key": key, "len": n, "access": access, "seg": False, "align": addr % 8}
        spans[name] = (buf, HEAP_CANARY, n)
        heap[name] = buf
    # a key that was valid once: its slot is reused by nothing (registered last, then freed)
    stale = ctx.register(mv[4096 * 62:4096 * 63], 3)
    ctx.deregister(stale)
    return ctx, seg, view, heap, regs, spans, stale


def canary_digest(view, heap, spans):
    """One sha256 over every byte of the segment and heap buffers that no registration covers."""
    h = hashlib.sha256()
    for arr in [view] + [heap[k] for k in sorted(heap)]:
        covered = sorted((off, n) for a, off, n in spans.values() if a is arr)
        at = 0
        for off, n in covered:
            h.update(arr[at:off].tobytes())
            at = max(at, off + n)
        h.update(arr[at:].tobytes())
    return h.hexdigest()


def main(argv):
    secret = bytes.fromhex(argv[0])
    seed = int(argv[1])
    host = argv[2] if len(argv) > 2 else "127.0.0.1"
    ctx, seg, view, heap, regs, spans, stale = build(seed)
    ctx.set_secret(secret)
    port = ctx.listen(host, 0)
    print(json.dumps({"port": port, "pid": os.getpid(), "regs": regs, "stale_key": stale}),
          flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "stats":
            out = ctx.tcp_stats()
        elif cmd[0] == "digest":
            out = {name: hashlib.sha256(a[off:off + n].tobytes()).hexdigest()
                   for name, (a, off, n) in spans.items()}
            out["canaries"] = canary_digest(view, heap, spans)
        elif cmd[0] == "dump":
            a, off, n = spans[cmd[1]]
            out = {"hex": a[off:off + n].tobytes().hex()}
        elif cmd[0] == "quit":
            break
        else:
            out = {"error": f"unknown command {cmd[0]!r}"}
        print(json.dumps(out), flush=True)
    ctx.close()
    del view
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
