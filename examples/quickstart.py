"""pooltensor in a plain script: a pool over three local members, an array bigger than this
process's slab cache, and what happens when it is read sequentially, strided and at random.

    python examples/quickstart.py            (what `make demo` runs)

`pooltensor.init(members=3)` starts two member processes next to this one; together they hold
one global address space, cut into slabs. This script is member 0. Members on the same machine
are mapped in place by default; here `attach=False` makes them stand in for other machines, so
their slabs are faulted in one-sided (Window.get, their Python takes no part) into a bounded LRU
cache, and the prefetcher fetches the next slabs of a sequential or strided scan ahead of use.
Whole-array operations run on the members that hold the slabs.
"""
import time

import numpy as np

import pooltensor as pt

MiB = 1 << 20
pool = pt.init(members=3, slab_size=1 * MiB, cache_bytes=32 * MiB, attach=False)
print(f"{pool}: members 0..{pool.size - 1} (this script is member 0)")

# -- an array larger than the cache, spread over the members --------------------------------
n = 24 * MiB                                    # float32: 96 MiB, 3x the cache
t = time.perf_counter()
x = pt.random.standard_normal(n, seed=42, dtype=np.float32)   # "block" placement
t_fill = time.perf_counter() - t
where = x.where()
print(f"\nx: {x.shape} {x.dtype}, {x.nbytes / MiB:.0f} MiB in {len(x.slab_members)} slabs of "
      f"{pool.slab_size // MiB} MiB, filled in {t_fill:.2f} s")
for m, nbytes in where.items():
    print(f"  member {m}: {nbytes / MiB:5.1f} MiB  (slabs "
          f"{np.flatnonzero(x.slab_members == m)[[0, -1]].tolist()})")

# -- numpy semantics: views, writes, advanced indexing ----------------------------------------
v = x[1000:2000:10]                             # a view: nothing copied
x[1000:1010] = 7.0                              # one-sided, element-precise writes
assert v[0] == 7.0 and isinstance(v, pt.ndarray)
print(f"\nx[1000:2000:10] is a {type(v).__name__} view; x[[3, 2, 1]] = {x[[3, 2, 1]]}")
print("x =", x)                                 # fetches only what it prints


def scan(label, fn):
    pool.cache.clear()
    pool.cache.reset_counters()
    t = time.perf_counter()
    result = fn()
    dt = time.perf_counter() - t
    c = pool.cache.stats()
    print(f"  {label:<28} {dt * 1e3:8.1f} ms   hit rate {c['hit_rate']:6.1%}   prefetch "
          f"accuracy {c['prefetch_accuracy']:6.1%} ({c['prefetch_used']}/{c['prefetch_issued']})"
          f"   moved {c['bytes_fetched'] / MiB:6.1f} MiB")
    return result


E = pool.slab_size // x.itemsize
nslab = len(x.slab_members)
rng = np.random.default_rng(0)
order = rng.permutation(nslab)
print(f"\nscans (cache {pool.cache.capacity // MiB} MiB = {pool.cache.max_frames} slabs):")
total = scan("sequential, blocks()", lambda: sum(float(b.sum()) for b in x.blocks()))
scan("sequential, x[a:b]", lambda: [x[k * E:(k + 1) * E].to_numpy() for k in range(nslab)])
scan("strided, every 4th slab", lambda: [x[k * E:(k + 1) * E].to_numpy()
                                         for k in range(0, nslab, 4)])
scan("random slabs", lambda: [x[int(k) * E:(int(k) + 1) * E].to_numpy() for k in order])
scan("x[i], 1 in 4096 elements", lambda: [x[i] for i in range(0, n, 4096)])

ref = np.random.default_rng([42, 0]).standard_normal(1 << 16, dtype=np.float32)
assert np.array_equal(x[2000:1 << 16].to_numpy(), ref[2000:])   # same numbers, any layout
print(f"\nsum of x: {total:.3f}")

# -- scalar reads: a local slab and a cached remote slab, next to numpy ------------------------
a = np.arange(E, dtype=np.float32)
local, remote = pt.from_numpy(a, placement=[0]), pt.from_numpy(a, placement=[2])
remote[0]


def per_call(f, k=100000):
    t = time.perf_counter()
    for _ in range(k):
        f()
    return (time.perf_counter() - t) / k * 1e9


t_np, t_loc, t_rem = (per_call(lambda: a[123]), per_call(lambda: local[123]),
                      per_call(lambda: remote[123]))
print(f"x[i]: numpy {t_np:.0f} ns, pool local slab {t_loc:.0f} ns ({t_loc / t_np:.1f}x), "
      f"cached remote slab {t_rem:.0f} ns ({t_rem / t_np:.1f}x)")

# -- computing where the slabs live: ufuncs, operators, reductions, matmul ----------------------
m2 = x[6 * MiB: 10 * MiB].reshape(4096, 1024)  # a view over members 0 and 1: no copy
t = time.perf_counter()
y = np.sin(m2) * 2 + 1                          # pool arrays, streamed slab by slab
col = y.mean(axis=0)                            # numpy (small result)
w = np.ones((1024, 8), np.float32)
z = m2 @ w                                      # rows of m2 stay where they are
t_ops = time.perf_counter() - t
ref = np.sin(m2.to_numpy()) * 2 + 1
assert np.allclose(col, ref.mean(axis=0), rtol=1e-5, atol=1e-5)
assert np.allclose(z.to_numpy(), m2.to_numpy() @ w, rtol=1e-4, atol=1e-3)
print(f"\ny = sin(x) * 2 + 1, y.mean(axis=0), x @ w on {m2.shape}: {t_ops * 1e3:.0f} ms "
      f"(y: {type(y).__module__}.ndarray on members {sorted(y.where())}, "
      f"mean: {type(col).__module__}.ndarray)")

st = pool.stats()
print("\npool:", ", ".join(f"member {m['member']} uses {m['used'] / MiB:.0f} of "
                           f"{m['capacity'] / MiB:.0f} MiB" for m in st["members"]))
pt.finalize()                                   # stops the members (also done at exit)
print("done")
