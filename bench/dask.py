"""Dask on pool arrays against plain dask.array, on one LocalCluster, in the same run.

    python bench/dask.py [--quick] [--size BYTES] [--chunk BYTES] [--repeats N] [--out DIR]

One LocalCluster (2 worker processes x 1 thread) serves both sides. Three float32 arrays a, b,
c of --size bytes each (default 256 MiB; quick 32 MiB) with the same random values on both:

- plain: ``dask.array`` made on the workers (seeded random, chunks of --chunk bytes along the
  first axis) and persisted: each chunk lives where the scheduler put it;
- pool: the same values written into a pool attached to the cluster (``from_dask`` of the
  plain arrays, placed alike: chunk i of a, b and c on the same worker) and seen through
  ``x.to_dask(chunk_bytes=--chunk)``: chunks pinned to their homes, zero-copy views.

Operations, each run once per repeat with the order rotated (cold = the first repeat: fresh
result memory, a first touch on this VM costs more than the arithmetic; warm = the median of
the others):

- ``sum``:     (a * b + c).sum().compute()
- ``mean0``:   a.mean(axis=0).compute()
- ``blocks``:  a.map_blocks(lambda x: np.sqrt(x) * 2 + 1).sum().compute()
- ``persist``: (a * b + c).persist(), waited for, then dropped
- ``flip``:    (a + a[::-1]).sum().compute(): chunk i meets chunk n-1-i, half of them on the
  other worker (plain dask sends those chunks' bytes; the pool sends handles and the
  receiver reads the other worker's slabs in place)

Each side runs under its own scheduling: plain dask under Dask's defaults (work stealing,
queuing of root-ish tasks), the pool's under what attach() sets (tasks go to their inputs).

Bytes moved between workers, per operation: what the workers wrote to each other's
connections (the ``compressed`` size of every entry of their ``transfer_outgoing_log``: the
bytes on the wire), and Dask's own count (``transfer_outgoing_bytes_total``, which counts
each value's ``sizeof``: a slab view's handle counts as its slab's size). Ratio = plain's time / pool's (above 1:
the pool is faster). Results: DIR/dask[-quick].{json,txt,png}.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# this file's name is dask's, and bench/collectives.py's is the package's: the folder stays
# off sys.path so that `import dask` and `import collectives` find the packages
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]


def _common():
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_common", os.path.join(HERE, "common.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


common = _common()

OPS = ("sum", "mean0", "blocks", "persist", "flip")


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="32 MiB arrays, 2 repeats")
    p.add_argument("--size", type=int, default=None, help="bytes per array (256 MiB)")
    p.add_argument("--chunk", type=int, default=16 << 20, help="bytes per chunk (16 MiB)")
    p.add_argument("--repeats", type=int, default=None, help="runs per operation (4)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    a = p.parse_args(argv)
    a.size = a.size or ((32 << 20) if a.quick else (256 << 20))
    a.repeats = a.repeats or (2 if a.quick else 4)
    return a


def _ops(a, b, c):
    from distributed import wait

    def op_sum():
        return float((a * b + c).sum().compute())

    def op_mean0():
        return a.mean(axis=0).compute()

    def op_blocks():
        return float(a.map_blocks(lambda x: np.sqrt(x) * 2 + 1).sum().compute())

    def op_persist():
        p = (a * b + c).persist()
        wait(p)
        del p

    def op_flip():
        return float((a + a[::-1]).sum().compute())
    return {"sum": op_sum, "mean0": op_mean0, "blocks": op_blocks, "persist": op_persist,
            "flip": op_flip}


async def _scheduling(local, dask_scheduler=None):
    """Dask's own placement (local=False: work stealing, root-ish queuing) for plain dask's
    turns, the pool's (attach(): tasks go to their inputs) for the pool's."""
    from pooltensor.dask.session import WATCH, keep_local
    w = dask_scheduler.plugins[WATCH]
    if local and w.saved is None:
        w.saved = await keep_local(dask_scheduler)
    elif not local and w.saved is not None:
        await keep_local(dask_scheduler, w.saved)
        w.saved = None


def _sent(client):
    """(bytes on the wire, bytes by sizeof) the workers sent each other so far."""
    def count(dask_worker):
        log = dask_worker.transfer_outgoing_log
        wire = getattr(dask_worker, "bench_wire", 0) + sum(e["compressed"] for e in log)
        log.clear()
        dask_worker.bench_wire = wire
        return wire, dask_worker.transfer_outgoing_bytes_total
    got = client.run(count).values()
    return sum(w for w, _ in got), sum(n for _, n in got)


def run(args):
    """Both sides on one cluster; returns the rows of the table."""
    import dask.array as da
    from distributed import Client, LocalCluster, wait

    import pooltensor as pt
    import pooltensor.dask as ptd

    cols = 1024
    rows_ = args.size // (cols * 4)
    crow = max(1, args.chunk // (cols * 4))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cl, Client(cl) as client:
        ptd.attach(client, memory=2 * args.size, timeout=120)
        try:
            client.run_on_scheduler(_scheduling, False)    # plain dask as Dask places it
            rng = da.random.default_rng(42)
            plain = [rng.random((rows_, cols), dtype=np.float32, chunks=(crow, cols))
                     for _ in range(3)]
            plain = client.persist(plain)
            wait(plain)
            client.run_on_scheduler(_scheduling, True)
            t0 = time.perf_counter()
            first = pt.from_dask(plain[0])
            pool_arrays = [first] + [pt.from_dask(p, like=first) for p in plain[1:]]
            load_s = time.perf_counter() - t0
            pooled = [x.to_dask(chunk_bytes=args.chunk) for x in pool_arrays]
            wait([f for d in pooled for f in __import__("distributed").futures_of(d)])
            sides = {"plain": _ops(*plain), "pool": _ops(*pooled)}
            for o in ("sum", "flip"):          # the same values on both sides
                check = (sides["plain"][o](), sides["pool"][o]())
                assert abs(check[0] - check[1]) <= 1e-4 * abs(check[0]), (o, check)
            times = {(s, o): [] for s in sides for o in OPS}
            moved = {(s, o): [] for s in sides for o in OPS}
            counted = {(s, o): [] for s in sides for o in OPS}
            for r in range(args.repeats):
                for s, o in common.rotated([(s, o) for o in OPS for s in sides], r):
                    client.run_on_scheduler(_scheduling, s == "pool")
                    b0 = _sent(client)
                    t0 = time.perf_counter()
                    sides[s][o]()
                    times[(s, o)].append(time.perf_counter() - t0)
                    b1 = _sent(client)
                    moved[(s, o)].append(b1[0] - b0[0])
                    counted[(s, o)].append(b1[1] - b0[1])
        finally:
            ptd.detach()
    out = []
    for o in OPS:
        row = {"op": o}
        for s in ("plain", "pool"):
            t = times[(s, o)]
            row[s + "_cold_s"] = t[0]
            row[s + "_warm_s"] = statistics.median(t[1:]) if len(t) > 1 else t[0]
            row[s + "_moved"] = int(statistics.median(moved[(s, o)]))
            row[s + "_counted"] = int(statistics.median(counted[(s, o)]))
        row["ratio_cold"] = row["plain_cold_s"] / row["pool_cold_s"]
        row["ratio_warm"] = row["plain_warm_s"] / row["pool_warm_s"]
        row["GBps_pool_warm"] = (3 if o in ("sum", "persist") else 2 if o == "flip" else 1) \
            * args.size / row["pool_warm_s"] / 1e9
        out.append(row)
    return out, load_s


def plot(path, title, rows):
    """Warm and cold time per operation, plain dask vs pool, and the bytes each moved."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    x = np.arange(len(rows))
    w = 0.2
    for i, (key, label) in enumerate([("plain_cold_s", "plain cold"), ("pool_cold_s", "pool cold"),
                                      ("plain_warm_s", "plain warm"), ("pool_warm_s", "pool warm")]):
        ax.bar(x + (i - 1.5) * w, [r[key] for r in rows], w, label=label)
    ax.set_xticks(x, [r["op"] for r in rows])
    ax.set_ylabel("seconds")
    ax.set_title("time per operation (lower is better)")
    ax.legend()
    bx.bar(x - 0.2, [r["plain_moved"] / 2**20 for r in rows], 0.4, label="plain dask")
    bx.bar(x + 0.2, [r["pool_moved"] / 2**20 for r in rows], 0.4, label="pool")
    bx.set_xticks(x, [r["op"] for r in rows])
    bx.set_ylabel("MiB sent between workers (on the wire)")
    bx.set_title("bytes moved between workers")
    bx.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    """Run, print the table, write JSON, text and PNG."""
    args = _args(argv)
    load0 = os.getloadavg()
    rows, load_s = run(args)
    headers = ["op", "plain cold s", "pool cold s", "plain warm s", "pool warm s",
               "ratio cold", "ratio warm", "plain MiB wire", "pool MiB wire",
               "plain MiB sizeof", "pool MiB sizeof"]
    table = common.format_table(headers, [
        [r["op"], r["plain_cold_s"], r["pool_cold_s"], r["plain_warm_s"], r["pool_warm_s"],
         r["ratio_cold"], r["ratio_warm"], r["plain_moved"] / 2**20, r["pool_moved"] / 2**20,
         r["plain_counted"] / 2**20, r["pool_counted"] / 2**20]
        for r in rows])
    title = (f"dask on pool arrays vs plain dask.array: 3 x {common.human_size(args.size)} "
             f"float32, chunks {common.human_size(args.chunk)}, LocalCluster 2 workers x 1 "
             f"thread")
    text = f"{title}\nload before {load0[0]:.1f}, after {os.getloadavg()[0]:.1f}; pool " \
           f"arrays written from the plain ones in {load_s:.2f} s\n{table}\n" \
           f"ratio = plain dask's time / pool's (above 1: the pool is faster)"
    print(text)
    name = "dask-quick" if args.quick else "dask"
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name + ".txt"), "w") as f:
        f.write(text + "\n")
    common.write_json(os.path.join(args.out, name + ".json"),
                      {"machine": common.machine_info(load=os.getloadavg()), "size": args.size,
                       "chunk": args.chunk, "repeats": args.repeats, "rows": rows})
    plot(os.path.join(args.out, name + ".png"), title, rows)


if __name__ == "__main__":
    main()
