"""A plain script whose pool lives on memory servers (run by tests/test_serve.py and
tests/test_netns.py, on loopback or from another network namespace).

    python serve_client.py MODE SECRET_FILE HOST:PORT [HOST:PORT ...]

MODE:
  basic  create, write, read back against numpy (arrays larger than the cache, strided
         views, readonly arrays, every placement), describe() and stats() show tcp
  hold   create an array of known content, print "ready", then wait for stdin lines:
         "check" -> verify it ("intact"), "quit" -> finalize and exit 0
  lost   create an array, print "ready", wait for "go" on stdin, then read until a
         server is gone: print "peerlost rank R host H" (the error must name the server)
  compute  whole-array work on the servers' slabs against numpy: what the servers computed
         (plans by kind) and the processes map_blocks ran in ("pids P ...")
"""
import os
import sys
import time

import numpy as np

import pooltensor as pt
from collectives.errors import PeerLost, RemoteAccessError, Timeout

mode, secret, servers = sys.argv[1], sys.argv[2], sys.argv[3:]
SLAB = 64 << 10
pool = pt.init(connect=servers, secret_file=secret, slab_size=SLAB, cache_bytes=16 * SLAB,
               memory=24 << 20)
assert pool.role == "client" and pool.size == len(servers) + 1, pool
k = len(servers)


def assert_eq(a, ref):
    got = a.to_numpy() if isinstance(a, pt.ndarray) else np.asarray(a)
    assert got.shape == ref.shape and got.dtype == ref.dtype, (got.shape, got.dtype, ref.shape)
    np.testing.assert_array_equal(got, ref)


if mode == "basic":
    d = pool.world.describe()
    assert d["transports"] == ["self"] + ["tcp"] * k, d
    assert [s["control"] for s in d["servers"]] == servers, d
    st = pool.stats()
    assert [m["transport"] for m in st["members"]] == ["self"] + ["tcp"] * k, st
    assert st["members"][0]["capacity"] == 0
    assert all(m["capacity"] == 24 << 20 for m in st["members"][1:]), st
    # an array 8x the cache: every slab on a server, streamed through the cache
    n = 16 * 16 * SLAB // 8
    ref = np.arange(n, dtype=np.float64) * 0.5
    x = pt.asarray(ref)
    assert set(x.slab_members) == set(range(1, k + 1)), x.slab_members
    assert_eq(x, ref)
    x[100:5000:7] = -1.0
    ref[100:5000:7] = -1.0
    x[n // 2:n // 2 + 3 * SLAB] = 2.5
    ref[n // 2:n // 2 + 3 * SLAB] = 2.5
    assert_eq(x, ref)
    total = sum(float(b.sum()) for b in x.blocks())
    assert total == float(ref.sum()), (total, float(ref.sum()))
    cs = pool.stats()["cache"]
    assert cs["misses"] > 0 and cs["bytes_fetched"] > 16 * SLAB, cs
    assert cs["prefetch_issued"] > 0, cs
    # 2-D views, every placement, dtypes
    for placement in ["block", "interleave", "balanced", list(range(1, k + 1))[::-1]]:
        for dt in (np.int8, np.int32, np.float32, np.complex128):
            r2 = (np.arange(300 * 170) % 97).astype(dt).reshape(300, 170)
            y = pt.asarray(r2, placement=placement)
            assert 0 not in y.slab_members
            y[::3, 5:100:2] = 7
            r2[::3, 5:100:2] = 7
            assert_eq(y[10:290, ::-3], r2[10:290, ::-3])
            del y
    try:
        pt.zeros(10, placement="local")
        raise AssertionError("placement='local' accepted in a client pool")
    except ValueError as e:
        assert "no memory" in str(e)
    try:
        pt.zeros(10, access="private")
        raise AssertionError("access='private' accepted in a client pool")
    except ValueError as e:
        assert "lends none" in str(e)
    # readonly: readable, and the r key refuses puts at the server
    ro = pt.asarray(np.arange(1000, dtype=np.int64), access="readonly")
    assert_eq(ro, np.arange(1000, dtype=np.int64))
    try:
        pool.win_ro.put(ro.slab_members[0], 0, np.zeros(8, np.uint8))
        raise AssertionError("a put through the read-only key was accepted")
    except RemoteAccessError:
        pass
    # frees give the slabs back (the server memory stays with this process)
    before = pool.free_bytes()
    z = pt.zeros(2 << 20)
    assert sum(pool.free_bytes()) < sum(before)
    del z
    assert pool.free_bytes() == before
    pt.finalize()
    print("serve client ok", flush=True)

elif mode in ("hold", "lost"):
    n = 8 * 16 * SLAB // 8
    ref = np.arange(n, dtype=np.int64) * 3 + 1
    x = pt.asarray(ref)
    assert_eq(x, ref)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "check":
            pool.cache.clear()
            assert_eq(x, ref)
            print("intact", flush=True)
        elif cmd == "quit":
            pt.finalize()
            print("bye", flush=True)
            sys.exit(0)
        elif cmd == "go":
            t0 = time.monotonic()
            try:
                while time.monotonic() - t0 < 60:
                    pool.cache.clear()
                    x.to_numpy()
                    time.sleep(0.05)
                print("no error within 60 s", flush=True)
                sys.exit(1)
            except PeerLost as e:
                print(f"peerlost rank {e.rank} host {e.host} after "
                      f"{time.monotonic() - t0:.1f} s: {e}", flush=True)
                sys.exit(0)
            except Timeout as e:
                print(f"timeout instead of PeerLost: {e}", flush=True)
                sys.exit(1)
elif mode == "compute":
    n = 40 * SLAB // 4 + 3
    st0 = dict(pool.stats()["plans"])
    a = pt.random.random((n,), seed=1, dtype=np.float32)
    b = pt.linspace(-2, 2, n, dtype=np.float32)
    ra, rb = a.to_numpy(), np.linspace(-2, 2, n, dtype=np.float32)
    assert_eq(a * b + 3, ra * rb + 3)
    assert_eq(np.sin(a) * 2 + b, np.sin(ra) * 2 + rb)
    assert_eq(pt.where(a > 0.5, a, b), np.where(ra > 0.5, ra, rb))
    s = float(a.sum())
    assert abs(s - float(ra.sum(dtype=np.float64))) < 1e-3 * n, s
    assert int(a.argmax()) == int(ra.argmax())

    def moved():
        lat = pool.stats()["transfers"]["latency"].get("tcp", {})
        return sum(v["bytes"] for op, v in lat.items() if op in ("get", "put"))
    before = moved()
    c = a[1:] - b[:-1]             # misaligned: each server reads its peer's slabs itself
    assert moved() - before < SLAB, moved() - before
    assert_eq(c, ra[1:] - rb[:-1])
    a2, ra2 = a[:n - 3].reshape(-1, 64), ra[:n - 3].reshape(-1, 64)
    w = (np.arange(64 * 8) % 5).astype(np.float32).reshape(64, 8)
    before = moved()
    d = a2[1:] @ w                 # result rows misaligned with a's: the servers read rows
    e = a2[:, 1:].reshape(-1)      # a copy between layouts, on the servers as well
    assert moved() - before < SLAB, moved() - before
    assert np.allclose(d.to_numpy(), ra2[1:] @ w, rtol=1e-5)
    assert_eq(e, ra2[:, 1:].reshape(-1))
    plans = {k: v - st0.get(k, 0) for k, v in pool.stats()["plans"].items()}
    assert plans.get("run", 0) > 0 and plans.get("fill", 0) > 0 and plans.get("reduce", 0) > 0
    assert plans.get("rows", 0) > 0, plans
    pids = pt.map_blocks(lambda x: np.full(x.shape, os.getpid()), a, dtype=np.float32)
    print("pids", *sorted({int(p) for p in pids.to_numpy().tolist()}), "me", os.getpid())
    print("serve client ok", plans)
    pt.finalize()
else:
    sys.exit(f"unknown mode {mode!r}")

