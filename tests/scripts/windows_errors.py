"""Refusals at the target: out of bounds, a wrong key, a put into an 'r' window, unaligned atomics,
on shared segments and on memory outside them (served by the target's native threads). Each
raises RemoteAccessError at the caller and leaves the target's memory unchanged."""
import numpy as np

import collectives
from collectives import RemoteAccessError

world = collectives.init()
rank, size = world.rank, world.size
peer = (rank + 1) % size
n = 256
rw = world.expose(n)
ro = world.expose(n, access="r")
plain = world.expose(np.zeros(8, np.int64))       # memory outside our segments
for w in (rw, ro):
    w.buffer[:] = np.arange(n) % 256
world.barrier()
before = [bytes(w.buffer) for w in (rw, ro)]


def refused(fn, *args, cls=RemoteAccessError, text=None):
    try:
        fn(*args)
    except cls as e:
        msg = str(e)
        assert f"rank {peer}" in msg and "offset" in msg and "length" in msg, msg
        assert text is None or text in msg, msg
        return
    raise AssertionError(f"{fn.__name__}{args[:2]} was not refused")


refused(rw.get, peer, n - 4, bytearray(8), text="outside")
refused(rw.put, peer, n, b"x", text="outside")
refused(rw.put, peer, 2**40, b"x", text="outside")
refused(ro.put, peer, 0, b"xyz", text="read-only")
refused(ro.put_async(peer, 0, b"abc").wait, 5, text="read-only")
refused(rw.fetch_add, peer, 3, 1, text="aligned")
refused(rw.fetch_add, peer, n, 1, text="outside")
refused(plain.fetch_add, peer, 3, 1, text="aligned")
refused(plain.compare_swap, peer, 60, 0, 1, text="outside")
refused(plain.fetch_add, peer, 64, 1, text="outside")
refused(plain.put_notify, peer, 0, b"x", 5, text="aligned")
assert plain.fetch_add(peer, 8, 1) == 0                 # served: atomics on any exposed memory


def beyond(fn, *args, text="2**64"):
    """Offsets are never taken modulo 2**64 (2**64 + 8 is not offset 8), over shm and tcp."""
    try:
        fn(*args)
    except RemoteAccessError as e:
        assert f"rank {peer}" in str(e) and text in str(e), str(e)
        return
    raise AssertionError(f"{fn.__name__}{args[:2]} was not refused")


for off in (2**64, 2**64 + 8, 2**65 + 16):
    beyond(rw.get, peer, off, bytearray(8))
    beyond(rw.put, peer, off, b"x")
    beyond(rw.get_async, peer, off, bytearray(8))
    beyond(rw.fetch_add, peer, off, 1)
    beyond(rw.compare_swap, peer, off, 0, 1)
    beyond(rw.notify, peer, off)
    beyond(rw.put_notify, peer, 0, b"x", off)
beyond(rw.put_indexed, peer, np.array([8, -8]), 1, b"ab", text="negative")
try:
    world._ctx.get(peer, rw._keys[peer], 2**64 + 8, bytearray(8))   # the binding, too
    raise AssertionError("the binding took 2**64 + 8 as offset 8")
except OverflowError:
    pass
# a wrong key: what a stale or forged window handle would send
good = rw._keys[peer]
rw._keys[peer] = good ^ (1 << 20)
refused(rw.get, peer, 0, bytearray(8), text="key")
refused(rw.put, peer, 0, b"x", text="key")
rw._keys[peer] = (good & ~0xFFFF) | 0xFFFF
refused(rw.get, peer, 0, bytearray(8), text="key")
rw._keys[peer] = good
# reading an 'r' window is fine
out = bytearray(4)
ro.get(peer, 10, out)
assert bytes(out) == bytes([10, 11, 12, 13])
try:
    rw.get(size, 0, bytearray(1))
    raise AssertionError("rank out of range accepted")
except ValueError:
    pass
world.barrier()
assert [bytes(w.buffer) for w in (rw, ro)] == before, "target memory changed"
assert plain.buffer.tolist() == [0, 1, 0, 0, 0, 0, 0, 0], plain.buffer
for w in (rw, ro, plain):
    w.close()
print(f"rank {rank}: refusals ok")
