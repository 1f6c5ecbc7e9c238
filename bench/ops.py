"""Array operations on pool arrays against numpy, in the same run.

    python bench/ops.py [--quick] [--members 2,3] [--size BYTES] [--out DIR]
    mpiexec -n 2 python bench/ops.py [--quick]
    python bench/ops.py --scalar [--quick]

Two operations over float64 arrays of --size bytes each (default 128 MiB, quick 32 MiB), with
a slab cache of an eighth of that (so the arrays never fit in it):

- ew:  y = a * b + c    (4 arrays' bytes move: a, b, c read, y written)
- sum: a.sum()          (one array's bytes read)

Plain script (no mpiexec): for each member count in --members, two placements: 'local' (every
slab homed by this process: the elementwise work runs on local slabs, the aim is >= 0.8x
numpy) and 'block' (the slabs spread over the members: the script faults the remote ones in
through the cache). The peer is numpy on arrays with the same values in this process.

SPMD (under mpiexec or the launcher): the arrays are spread over the ranks ('block'); every
rank computes the slabs it homes. Measured barrier to barrier: the job (the slowest rank), and
each rank's share of the bytes over that time. Peers: one numpy process on the whole arrays
(rank 0, the other ranks waiting in a barrier), and numpy on each rank's share on every rank
at once (the same contention for memory bandwidth as ours). Ratios: the job against one numpy
process (aim > 1: two ranks beat one process), each rank against numpy on its share (aim
>= 0.8).

Throughput = bytes moved / seconds; ratio = numpy's time / ours. Every timing interleaves ours
and numpy's (each repeat runs every contender once, in an order rotated from repeat to repeat:
common.interleaved), medians of --repeats. Results: DIR/ops[-quick]
(.json, .txt, .png) for the plain script, DIR/ops-spmdN[-quick].* under SPMD.

--scalar: random scalar reads x[i] over a 4 MiB float64 array against numpy's a[i] on the
same values, in the same run (interleaved), members=2: slabs homed by this process, by a
member on this machine (mapped in place), spread over both ('block'), and by a member read
through the slab cache (attach=False: the member stands in for another machine; the cache
holds the whole array). Cost = our time per read / numpy's (aims: <= 3 on this process's or
mapped slabs, <= 5 on cached ones). DIR/ops-scalar[-quick].*
"""
import argparse
import os
import statistics
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import MiB, human_size  # noqa: E402

sys.path.remove(HERE)
sys.path.append(os.path.dirname(HERE))

import pooltensor as pt  # noqa: E402
from pooltensor.pool.runtime import _launched  # noqa: E402

OPS = {"ew": 4, "sum": 1}      # arrays' worth of bytes each operation moves


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="32 MiB arrays, 3 repeats (< 30 s)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    p.add_argument("--members", default="2,3", help="plain script: member counts (e.g. 2,3)")
    p.add_argument("--size", type=int, default=None, help="bytes per array")
    p.add_argument("--repeats", type=int, default=None, help="repeats (default 7, quick 3)")
    p.add_argument("--scalar", action="store_true",
                   help="only random x[i] over a 4 MiB array, against numpy's a[i]")
    a = p.parse_args()
    a.size = a.size or (32 * MiB if a.quick else 128 * MiB)
    a.repeats = a.repeats or (3 if a.quick else 7)
    a.members = [int(m) for m in a.members.split(",")]
    return a


def arrays(n, placement):
    a = pt.random.random(n, seed=1, placement=placement)
    b = pt.random.random(n, seed=2, placement=placement)
    c = pt.random.random(n, seed=3, placement=placement)
    return a, b, c


def ops_for(a, b, c):
    return {"ew": lambda: a * b + c, "sum": lambda: a.sum()}


# -- plain script ------------------------------------------------------------------------------

def plain(args):
    rows, raw = [], {}
    n = args.size // 8
    for members in args.members:
        pool = pt.init(members=members, cache_bytes=args.size // 8)
        for placement in ("local", "block"):
            a, b, c = arrays(n, [0] if placement == "local" else "block")
            an, bn, cn = a.to_numpy(), b.to_numpy(), c.to_numpy()
            ours, ref = ops_for(a, b, c), ops_for(an, bn, cn)
            y = ours["ew"]()
            assert np.allclose(y.to_numpy(), ref["ew"]()), "a * b + c differs from numpy"
            assert np.isclose(ours["sum"](), ref["sum"](), rtol=1e-12)
            del y
            for op, k in OPS.items():
                t = common.interleaved({"ours": ours[op], "numpy": ref[op]}, args.repeats)
                to, tn = statistics.median(t["ours"]), statistics.median(t["numpy"])
                nbytes = k * args.size
                rows.append({"members": members, "placement": placement, "op": op,
                             "bytes": nbytes, "ours_s": to, "numpy_s": tn,
                             "ours_gbps": nbytes / to / 1e9, "numpy_gbps": nbytes / tn / 1e9,
                             "ratio": tn / to})
                raw[f"{members}/{placement}/{op}"] = t
            del a, b, c
        pt.finalize()
    headers = ["members", "placement", "op", "ours GB/s", "numpy GB/s", "numpy/ours time"]
    table = common.format_table(headers, [[r["members"], r["placement"], r["op"],
                                           r["ours_gbps"], r["numpy_gbps"], r["ratio"]]
                                          for r in rows])
    title = (f"plain script, arrays of {human_size(args.size)} float64, cache "
             f"{human_size(args.size // 8)}; ratio = numpy time / ours (aim >= 0.8 on local "
             f"slabs)")
    labels = [f"{r['members']}m {r['placement']}\n{r['op']}" for r in rows]
    return title, table, rows, raw, labels


# -- scalar reads --------------------------------------------------------------------------------

SCALAR_BYTES = 4 * MiB
# (case, attach, placement, aim: the most our time per read may be against numpy's)
SCALAR_CASES = [("local", True, [0], 3.0), ("mapped", True, [1], 3.0),
                ("local+mapped", True, "block", 3.0), ("cached", False, [1], 5.0)]


def scalar(args):
    """Random x[i] against numpy's a[i], per case of SCALAR_CASES (members=2)."""
    rows, raw = [], {}
    n = SCALAR_BYTES // 8
    count = 20000 if args.quick else 100000
    idx = np.random.default_rng(0).integers(0, n, count).tolist()

    def reads(arr):
        def run():
            for i in idx:
                arr[i]
        return run
    for case, attach, placement, aim in SCALAR_CASES:
        pt.init(members=2, attach=attach)
        x = pt.random.random(n, seed=1, placement=placement)
        a = x.to_numpy()
        assert all(x[i] == a[i] for i in idx[:2000]), "x[i] differs from numpy"
        t = common.interleaved({"ours": reads(x), "numpy": reads(a)}, args.repeats)
        to, tn = statistics.median(t["ours"]) / count, statistics.median(t["numpy"]) / count
        rows.append({"case": case, "attach": attach, "where": {str(k): v for k, v in
                                                               x.where().items()},
                     "ours_ns": to * 1e9, "numpy_ns": tn * 1e9, "cost": to / tn, "aim": aim})
        raw[case] = t
        del x
        pt.finalize()
    headers = ["case", "ours ns/read", "numpy ns/read", "ours/numpy time", "aim <="]
    table = common.format_table(headers, [[r["case"], r["ours_ns"], r["numpy_ns"], r["cost"],
                                           r["aim"]] for r in rows])
    title = (f"random x[i] over {human_size(SCALAR_BYTES)} float64, members=2, {count} reads "
             f"a repeat; cost = our time per read / numpy's a[i]")
    return title, table, rows, raw


def plot_scalar(path, title, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = np.arange(len(rows))
    for off, key, name in ((-0.2, "ours_ns", "ours"), (0.2, "numpy_ns", "numpy a[i]")):
        ax.bar(xs + off, [r[key] for r in rows], 0.4, label=name)
    for x, r in zip(xs, rows):
        ax.annotate(f"{r['cost']:.2f}x (aim <= {r['aim']:g})", (x, max(r["ours_ns"],
                    r["numpy_ns"])), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs)
    ax.set_xticklabels([r["case"] for r in rows], fontsize=8)
    ax.set_ylabel("ns per read")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=8, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main_scalar(args):
    title, table, rows, raw = scalar(args)
    print(title)
    print(table)
    name = "ops-scalar" + ("-quick" if args.quick else "")
    os.makedirs(args.out, exist_ok=True)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    common.write_json(os.path.join(args.out, name + ".json"), {
        "machine": common.machine_info(size=SCALAR_BYTES, repeats=args.repeats, load=load),
        "title": title, "rows": rows, "raw_seconds": raw})
    with open(os.path.join(args.out, name + ".txt"), "w") as f:
        f.write(title + "\n" + table + "\n")
    plot_scalar(os.path.join(args.out, name + ".png"), title, rows)
    print(f"load average {load}; results in {args.out}/{name}.*")


# -- SPMD ----------------------------------------------------------------------------------------

def spmd(args):
    pool = pt.init(cache_bytes=args.size // 8)
    world, me, size = pool.world, pool.me, pool.size
    n = args.size // 8
    a, b, c = arrays(n, "block")
    lo, hi = n * me // size, n * (me + 1) // size          # the block placement's share (about)
    share = a[lo:hi].nbytes
    ours = ops_for(a, b, c)
    mine = [v[lo:hi].to_numpy(copy=True) for v in (a, b, c)]
    whole = [v.to_numpy(copy=True) for v in (a, b, c)] if me == 0 else None
    ref_share = ops_for(*mine)
    ref_whole = ops_for(*whole) if me == 0 else None
    y = ours["ew"]()
    if me == 0:
        assert np.allclose(y.to_numpy(), ref_whole["ew"]())
        assert np.isclose(ours["sum"](), ref_whole["sum"](), rtol=1e-12)
    else:
        ours["sum"]()
    del y

    def job(fn):
        def run():
            world.barrier()
            fn()
            world.barrier()
        return run

    def alone(fn):                 # numpy on rank 0; the other ranks wait in the barrier
        def run():
            world.barrier()
            if me == 0:
                fn()
            world.barrier()
        return run

    rows, raw = [], {}
    for op, k in OPS.items():
        fns = {"ours": job(ours[op]), "numpy_share": job(ref_share[op]),
               "numpy_one": alone(ref_whole[op] if me == 0 else None)}
        t = common.interleaved(fns, args.repeats)
        med = {name: statistics.median(v) for name, v in t.items()}
        everyone = world.allgather_object(med)
        job_s = max(m["ours"] for m in everyone)
        one_s = everyone[0]["numpy_one"]
        nbytes = k * args.size
        per_rank = [{"rank": r, "ours_gbps": k * share / m["ours"] / 1e9,
                     "numpy_share_gbps": k * share / m["numpy_share"] / 1e9,
                     "ratio": m["numpy_share"] / m["ours"]} for r, m in enumerate(everyone)]
        rows.append({"op": op, "ranks": size, "bytes": nbytes, "job_s": job_s,
                     "job_gbps": nbytes / job_s / 1e9, "numpy_one_s": one_s,
                     "numpy_one_gbps": nbytes / one_s / 1e9, "job_vs_one": one_s / job_s,
                     "per_rank": per_rank})
        raw[op] = world.allgather_object(t)
    small = small_calls(world, 50 if args.quick else 200, args.repeats)
    raw["small_calls_us"] = small
    if me != 0:
        pt.finalize()
        return None
    headers = ["op", "job GB/s", "1 numpy GB/s", "job/1 numpy", "rank", "rank GB/s",
               "numpy share GB/s", "rank/numpy"]
    out = []
    for r in rows:
        for p in r["per_rank"]:
            out.append([r["op"], r["job_gbps"], r["numpy_one_gbps"], r["job_vs_one"], p["rank"],
                        p["ours_gbps"], p["numpy_share_gbps"], p["ratio"]])
    table = common.format_table(headers, out)
    table += ("\n\nsmall collective calls on 8-element arrays, microseconds per call (the slowest "
              "rank; median of repeats): creation, elementwise into a new array and in place, "
              "a reduction; each checked across ranks\n" +
              common.format_table(["call", "us per call"], [[k, v] for k, v in small.items()]))
    title = (f"SPMD, {size} ranks, arrays of {human_size(args.size)} float64 spread over them, "
             f"cache {human_size(args.size // 8)}; job vs one numpy process (aim > 1), "
             f"each rank vs numpy on its share at once (aim >= 0.8)")
    pt.finalize()
    return title, table, rows, raw, None


def small_calls(world, calls, repeats):
    """SPMD: microseconds per call of small collective calls (the slowest rank's batch of
    `calls`, median over repeats, the calls interleaved in rotating order): what a call costs
    beyond its data (placement, the ranks' agreement, sync, frees)."""
    x = pt.zeros(8)
    ops = {"zeros(8)": lambda: pt.zeros(8), "x + 1": lambda: x + 1,
           "x += 1": lambda: x.__iadd__(1), "x.sum()": lambda: x.sum()}

    def batch(fn):
        def run():
            world.barrier()
            for _ in range(calls):
                fn()
            world.barrier()
        return run
    t = common.interleaved({k: batch(fn) for k, fn in ops.items()}, repeats, warmup=2)
    everyone = world.allgather_object({k: statistics.median(v) for k, v in t.items()})
    return {k: round(max(m[k] for m in everyone) / calls * 1e6, 1) for k in ops}


def plot(path, title, rows, is_spmd):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(rows) + 3), 4.8))
    if is_spmd:
        labels = [f"{r['op']}" for r in rows]
        series = {"ours (job)": [r["job_gbps"] for r in rows],
                  "numpy, one process": [r["numpy_one_gbps"] for r in rows]}
        for p in range(len(rows[0]["per_rank"])):
            series[f"ours rank {p}"] = [r["per_rank"][p]["ours_gbps"] for r in rows]
            series[f"numpy share rank {p}"] = [r["per_rank"][p]["numpy_share_gbps"] for r in rows]
    else:
        labels = [f"{r['members']}m {r['placement']}\n{r['op']}" for r in rows]
        series = {"ours": [r["ours_gbps"] for r in rows],
                  "numpy": [r["numpy_gbps"] for r in rows]}
    w = 0.8 / len(series)
    for i, (name, ys) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * w for j in range(len(labels))]
        bars = ax.bar(xs, ys, w, label=name)
        for bar in bars:
            ax.annotate(f"{bar.get_height():.1f}", (bar.get_x() + bar.get_width() / 2,
                        bar.get_height()), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("GB/s (bytes moved / time)")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=8, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    args = parse()
    if args.scalar:
        return main_scalar(args)
    is_spmd = _launched()
    res = spmd(args) if is_spmd else plain(args)
    if res is None:
        return
    title, table, rows, raw, _ = res
    print(title)
    print(table)
    name = "ops" + (f"-spmd{rows[0]['ranks']}" if is_spmd else "") + ("-quick" if args.quick
                                                                      else "")
    os.makedirs(args.out, exist_ok=True)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    common.write_json(os.path.join(args.out, name + ".json"), {
        "machine": common.machine_info(size=args.size, repeats=args.repeats, load=load),
        "title": title, "rows": rows, "raw_seconds": raw})
    with open(os.path.join(args.out, name + ".txt"), "w") as f:
        f.write(title + "\n" + table + "\n")
    plot(os.path.join(args.out, name + ".png"), title, rows, is_spmd)
    print(f"load average {load}; results in {args.out}/{name}.*")


if __name__ == "__main__":
    main()
