"""The pool and its slab cache against plain numpy.

    python bench/pool.py [--quick] [--out DIR] [--members N] [--size BYTES]

A plain script with `--members` members (default 2: this process and one member process).
Four parts, each printed as a table and kept in DIR/pool[-quick].json (+ .txt, .png):

(a) streaming: an array whose slabs all live on member 1, read block by block (one block per
    slab; the cache holds a quarter of the array, so frames are recycled as in a real scan),
    next to the same loop over a local numpy array. Three ways of reading: `sum` (each block
    reduced: for b in x.blocks(): b.sum()), `copy` (each block copied into a numpy buffer),
    and `to_numpy` (the whole array materialized into a new array, against ref.copy(); full
    slabs go straight from the member into the result).
    Ratio = numpy time / ours (>= 0.8 is the aim).
(b) scalar reads: x[i] from a slab homed here and from a cached remote slab, next to a[i] on
    a numpy array: P50 of single timed calls and the mean of an untimed loop; ratio = ours /
    numpy (<= 5 is the aim).
(c) cache behaviour on scans of a remote array 4x bigger than the cache: sequential, strided
    (every 3rd slab), random (a permutation), element by element (x[i] every 64 elements),
    and blocks(): hit rate, prefetch accuracy (used / issued), bytes fetched, time.
(d) slab size sweep, 64 KiB .. 8 MiB: Window.get bandwidth of one slab, the streaming `sum`
    and `copy` of (a) (a quarter of --size, at least 64 slabs; the cache holds a quarter of
    that, at least 16 slabs), and the latency of a scalar read that misses (one slab fetched).
    This is the measurement behind pooltensor's default slab size.

All timings interleave ours and numpy's (each repeat runs both, in an order rotated from repeat to
repeat: common.interleaved), medians of --repeats.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import KiB, MiB, human_size  # noqa: E402

sys.path.remove(HERE)
sys.path.append(os.path.dirname(HERE))

import pooltensor as pt  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smaller arrays, fewer sizes (< 30 s)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    p.add_argument("--members", type=int, default=2, help="pool members (>= 2)")
    p.add_argument("--size", type=int, default=None,
                   help="bytes of the streamed array (default 256 MiB, quick 32 MiB)")
    p.add_argument("--repeats", type=int, default=None, help="repeats (default 7, quick 3)")
    p.add_argument("--slab", type=int, default=None, help="slab size for (a)-(c) (default: "
                   "pooltensor's)")
    a = p.parse_args()
    if a.members < 2:
        p.error("--members must be >= 2 (the array must live on another member)")
    a.size = a.size or (32 * MiB if a.quick else 256 * MiB)
    a.repeats = a.repeats or (3 if a.quick else 7)
    return a


def interleaved(fns, repeats, setup=None):
    """({name: median seconds}, {name: [seconds per repeat]}): each fn once per repeat, the
    order rotated from repeat to repeat (common.interleaved), after one warm-up call each
    (faults frames, fills caches)."""
    times = common.interleaved(fns, repeats, setup=setup)
    return {k: statistics.median(v) for k, v in times.items()}, times


def streaming(pool, size, repeats):
    """(a): blocks of a remote array against the same loop over local numpy."""
    S = pool.slab_size
    E = S // 8
    x = pt.random.random(size // 8, seed=1, placement=[1])
    ref = x.to_numpy()
    buf = np.empty(E)
    pool.cache.resize(max(size // 4, 16 * S))    # a quarter of the array, >= 16 frames

    def ours_sum():
        s = 0.0
        for b in x.blocks():
            s += b.sum()

    def np_sum():
        s = 0.0
        for i in range(0, ref.size, E):
            s += ref[i:i + E].sum()

    def ours_copy():
        for b in x.blocks():
            np.copyto(buf[:b.size], b)

    def np_copy():
        for i in range(0, ref.size, E):
            blk = ref[i:i + E]
            np.copyto(buf[:blk.size], blk)

    def ours_all():
        x.to_numpy()

    def np_all():
        ref.copy()                               # both allocate the result

    def drop():
        pool.cache.clear()                       # nothing cached: every slab moves again

    rows, raw = [], {}
    for name, o, n in [("sum", ours_sum, np_sum), ("copy", ours_copy, np_copy),
                       ("to_numpy", ours_all, np_all)]:
        med, all_t = interleaved({"ours": o, "numpy": n}, repeats, setup=drop)
        raw[name] = {k: v for k, v in all_t.items()}
        rows.append({"read": name, "bytes": size, "ours_s": med["ours"],
                     "numpy_s": med["numpy"], "ours_gbps": size / med["ours"] / 1e9,
                     "numpy_gbps": size / med["numpy"] / 1e9,
                     "ratio": med["numpy"] / med["ours"]})
    return rows, raw


def scalars(pool, iters):
    """(b): x[i] from a local slab and a cached remote slab, against numpy."""
    n = pool.slab_size // 8
    ref = np.arange(n, dtype=np.float64)
    xl = pt.from_numpy(ref, placement=[0])
    xr = pt.from_numpy(ref, placement=[1])
    pool.cache.resize(max(pool.cache.capacity, 4 * pool.slab_size))
    i = n // 2 + 3
    assert xl[i] == ref[i] and xr[i] == ref[i]
    res = common.latencies({"numpy a[i]": lambda: ref[i], "ours x[i] local": lambda: xl[i],
                            "ours x[i] cached": lambda: xr[i]}, iters)
    base = res["numpy a[i]"]
    rows = []
    for k, v in res.items():
        rows.append({"op": k, "p50_ns": v["p50"], "p99_ns": v["p99"],
                     "loop_ns": v["loop_mean"], "ratio_p50": v["p50"] / base["p50"],
                     "ratio_loop": v["loop_mean"] / base["loop_mean"]})
    return rows


def scans(pool, size):
    """(c): hit rate and prefetch accuracy for several access patterns."""
    S = pool.slab_size
    E = S // 8
    x = pt.arange(size // 8, dtype=np.float64, placement=[1])
    nslab = size // S
    pool.cache.resize(size // 4)
    rng = np.random.default_rng(7)
    perm = rng.permutation(nslab)

    def seq():
        for k in range(nslab):
            x[k * E:(k + 1) * E].to_numpy()

    def strided():
        for k in range(0, nslab, 3):
            x[k * E:(k + 1) * E].to_numpy()

    def rand():
        for k in perm:
            x[int(k) * E:(int(k) + 1) * E].to_numpy()

    def elements():
        for i in range(0, x.size, 64):
            x[i]

    def blocks():
        for b in x.blocks():
            pass

    rows = []
    for name, fn in [("sequential", seq), ("strided (every 3rd slab)", strided),
                     ("random", rand), ("x[i], every 64th element", elements),
                     ("blocks()", blocks)]:
        pool.cache.clear()
        x._a.pf = None
        pool.cache.reset_counters()
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        c = pool.cache.stats()
        rows.append({"scan": name, "hits": c["hits"], "misses": c["misses"],
                     "hit_rate": c["hit_rate"], "prefetch_issued": c["prefetch_issued"],
                     "prefetch_used": c["prefetch_used"],
                     "prefetch_accuracy": c["prefetch_accuracy"],
                     "bytes_fetched": c["bytes_fetched"], "seconds": t})
    return rows


def sweep(args, sizes):
    """(d): one pool per slab size."""
    rows = []
    for S in sizes:
        pt.finalize()
        pool = pt.init(members=args.members, slab_size=S)
        total = max(64 * S, args.size // 4)
        st, _ = streaming(pool, total, args.repeats)
        win, a = pool.win_rw, None
        x = pt.zeros(4 * S // 8, placement=[1])
        a = x._a
        frame = np.ones(S, np.uint8)
        get = common.bandwidth(lambda: win.get(1, a.slots[0] * S, frame), S, target_s=0.05,
                               repeats=3)
        miss = []
        for _ in range(30):
            pool.cache.clear()
            t = time.perf_counter_ns()
            x[5]
            miss.append(time.perf_counter_ns() - t)
        rows.append({"slab": S, "get_gbps": get["gbps"],
                     "sum_ratio": st[0]["ratio"], "sum_gbps": st[0]["ours_gbps"],
                     "copy_ratio": st[1]["ratio"], "copy_gbps": st[1]["ours_gbps"],
                     "numpy_sum_gbps": st[0]["numpy_gbps"],
                     "miss_us": statistics.median(miss) / 1e3})
        print(f"  slab {human_size(S):>8}: get {get['gbps']:.1f} GB/s, sum {st[0]['ratio']:.2f}x,"
              f" copy {st[1]['ratio']:.2f}x, miss {statistics.median(miss) / 1e3:.0f} us",
              flush=True)
    pt.finalize()
    return rows


def main():
    args = parse()
    load0 = os.getloadavg()[0]
    t0 = time.time()
    pool = pt.init(members=args.members, slab_size=args.slab)
    S = pool.slab_size
    print(f"pool: {pool.size} members, slab {human_size(S)}, streamed array "
          f"{human_size(args.size)}, cache a quarter of it", flush=True)
    a_rows, a_raw = streaming(pool, args.size, args.repeats)
    b_rows = scalars(pool, 20000 if args.quick else 100000)
    c_rows = scans(pool, args.size)
    sizes = [256 * KiB, 1 * MiB, 4 * MiB] if args.quick else \
        [64 * KiB, 256 * KiB, 1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB]
    print("(d) slab size sweep", flush=True)
    d_rows = sweep(args, sizes)
    took = time.time() - t0

    text = []
    text.append(f"(a) streaming {human_size(args.size)} from member 1 block by block, slab "
                f"{human_size(S)}; ratio = numpy time / ours (aim >= 0.8)")
    text.append(common.format_table(
        ["read", "ours GB/s", "numpy GB/s", "ratio"],
        [[r["read"], r["ours_gbps"], r["numpy_gbps"], r["ratio"]] for r in a_rows]))
    text.append("\n(b) one scalar read, ns; ratio = ours / numpy (aim <= 5)")
    text.append(common.format_table(
        ["op", "P50", "P99", "loop", "ratio P50", "ratio loop"],
        [[r["op"], r["p50_ns"], r["p99_ns"], r["loop_ns"], r["ratio_p50"], r["ratio_loop"]]
         for r in b_rows]))
    text.append(f"\n(c) scans of a remote {human_size(args.size)} array, cache a quarter of it")
    text.append(common.format_table(
        ["scan", "hit rate", "prefetch acc.", "issued", "used", "MB fetched", "s"],
        [[r["scan"], r["hit_rate"], r["prefetch_accuracy"], r["prefetch_issued"],
          r["prefetch_used"], r["bytes_fetched"] / 1e6, r["seconds"]] for r in c_rows]))
    text.append("\n(d) slab size sweep (one pool per size)")
    text.append(common.format_table(
        ["slab", "get GB/s", "sum GB/s", "sum ratio", "copy GB/s", "copy ratio", "miss us"],
        [[human_size(r["slab"]), r["get_gbps"], r["sum_gbps"], r["sum_ratio"],
          r["copy_gbps"], r["copy_ratio"], r["miss_us"]] for r in d_rows]))
    text.append(f"\nmeasuring took {took:.1f} s; load average {load0:.2f} at start, "
                f"{os.getloadavg()[0]:.2f} at end, on {os.cpu_count()} CPUs")
    report = "\n".join(text)
    print(report)

    name = "pool-quick" if args.quick else "pool"
    common.write_json(os.path.join(args.out, name + ".json"), {
        "machine": common.machine_info(members=args.members, slab=S, size=args.size),
        "streaming": a_rows, "streaming_raw_s": a_raw, "scalar": b_rows, "scans": c_rows,
        "sweep": d_rows})
    with open(os.path.join(args.out, name + ".txt"), "w") as f:
        f.write(report + "\n")
    xs = [r["slab"] for r in d_rows]
    common.plot_lines(os.path.join(args.out, name + ".png"),
                      f"pooltensor pool: {pool.size} members, streamed {human_size(args.size)}",
                      [("(d) bandwidth vs slab size", "GB/s",
                        {"ours Window.get of one slab": (xs, [r["get_gbps"] for r in d_rows]),
                         "ours blocks() + sum": (xs, [r["sum_gbps"] for r in d_rows]),
                         "ours blocks() + copy": (xs, [r["copy_gbps"] for r in d_rows]),
                         "numpy sum (local)": (xs, [r["numpy_sum_gbps"] for r in d_rows])}),
                       ("(d) scalar read that misses", "microseconds",
                        {"ours x[i], slab fetched": (xs, [r["miss_us"] for r in d_rows])})])


if __name__ == "__main__":
    main()
