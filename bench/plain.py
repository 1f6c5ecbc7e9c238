"""A plain script computing where its slabs live, against numpy, in the same run.

    python bench/plain.py [--quick] [--size BYTES] [--members 2,3] [--servers 2] [--out DIR]

float32 arrays a, b, c of --size bytes each (default 512 MiB, quick 64 MiB), created seeded in
the pool (so every member holds its share), then:

- ew:    y = a * b + c            (two operations; the sum goes into the temporary a*b)
- ew2:   t = a * b; y = t + c     (the same with a named temporary: two new arrays)
- fused: map_blocks(a*b+c)        (the chain per slab, no temporary in the pool)
- sum:   a.sum()
- sin:   np.sin(a) * 2 + b        (compute-bound)
- shift: a[1:] + b[:-1]           (operands misaligned: each home reads its peers' slabs)
- matmul: a as (n/256, 256) rows [1:] @ a numpy (256, 64)  (result rows homed with a's, up to
          a slab: each home reads the rows at its slabs' edges)
- copy:  a as (n/256, 256) [:, 1:] reshaped to 1-D  (a copy between layouts)

Configurations: a plain script with --members member processes (each computes the slabs it
homes), the same script on --servers memory servers on loopback (each server computes the
slabs it holds, reading the others' one-sided), and SPMD under ``mpiexec -n 2`` for
reference.

Peers in the same run: one numpy process on the whole arrays (this process) and two numpy
processes each on half of them at the same time (what this machine can do for memory-bound
work: the limit our members could reach). Cold = the first run of each operation (fresh pool
memory, and fresh numpy memory: a first touch on this VM costs more than the arithmetic);
warm = the median of --repeats runs, ours, numpy's and the pair's of each op run one after
another in an order rotated from repeat to repeat. Ratio = numpy's time / ours (above 1: ours is
faster), the median of the per-repeat ratios, so that a burst of load spoils both sides alike. Results: DIR/plain[-quick].{json,txt,png}.
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time

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

OPS = ("ew", "ew2", "fused", "sum", "sin", "shift", "matmul", "copy")
COLS = 256                   # the row length of matmul and copy


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="64 MiB arrays, 3 repeats")
    p.add_argument("--size", type=int, default=None, help="bytes per array")
    p.add_argument("--members", default="2,3", help="member counts of the plain script")
    p.add_argument("--servers", type=int, default=2, help="memory servers on loopback (0: none)")
    p.add_argument("--no-spmd", action="store_true", help="skip the mpiexec -n 2 reference")
    p.add_argument("--repeats", type=int, default=None, help="warm repeats (default 5)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    p.add_argument("--spmd-json", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    a.size = a.size or (64 * MiB if a.quick else 512 * MiB)
    a.size -= a.size % (2 * COLS * 4)        # each half (the numpy pair) whole rows of COLS
    a.repeats = a.repeats or (3 if a.quick else 5)
    a.members = [int(m) for m in a.members.split(",") if m]
    return a


def _fma(x, y, z):
    return x * y + z


def _named(a, b, c):
    t = a * b
    return t + c


def _right():
    return np.random.default_rng(5).random((COLS, 64), dtype=np.float32)


def ours_ops(a, b, c):
    a2, B = a.reshape(-1, COLS), _right()
    return {"ew": lambda: a * b + c, "ew2": lambda: _named(a, b, c),
            "fused": lambda: pt.map_blocks(_fma, a, b, c),
            "sum": lambda: a.sum(), "sin": lambda: np.sin(a) * 2 + b,
            "shift": lambda: a[1:] + b[:-1], "matmul": lambda: a2[1:] @ B,
            "copy": lambda: a2[:, 1:].reshape(-1)}


def numpy_ops(a, b, c):
    a2, B = a.reshape(-1, COLS), _right()
    return {"ew": lambda: a * b + c, "ew2": lambda: _named(a, b, c), "fused": lambda: a * b + c,
            "sum": lambda: a.sum(), "sin": lambda: np.sin(a) * 2 + b,
            "shift": lambda: a[1:] + b[:-1], "matmul": lambda: a2[1:] @ B,
            "copy": lambda: a2[:, 1:].reshape(-1)}


def seeded(n, seed):
    """The values of pt.random.random((n,), seed=seed, dtype=np.float32), made by numpy."""
    from pooltensor.array.random import BLOCK
    out = np.empty(n, np.float32)
    for b in range(0, -(-n // BLOCK)):
        lo, hi = b * BLOCK, min(n, (b + 1) * BLOCK)
        out[lo:hi] = np.random.default_rng([seed, b]).random(BLOCK, dtype=np.float32)[:hi - lo]
    return out


# -- two numpy processes, each on half the arrays at once ----------------------------------------

def _half(conn, n, part):
    lo, hi = n * part // 2, n * (part + 1) // 2
    a, b, c = (seeded(n, s)[lo:hi].copy() for s in (1, 2, 3))
    ops = numpy_ops(a, b, c)
    conn.send("ready")
    while True:
        op = conn.recv()
        if op is None:
            return
        t = time.perf_counter()
        ops[op]()
        conn.send(time.perf_counter() - t)


class Pair:
    """Two numpy processes doing half of an operation each, started together; a call's time
    is the slower one's (the job's)."""

    def __init__(self, n):
        ctx = mp.get_context("spawn")
        self.conns, self.procs = [], []
        for part in (0, 1):
            here, there = ctx.Pipe()
            p = ctx.Process(target=_half, args=(there, n, part), daemon=True)
            p.start()
            self.conns.append(here)
            self.procs.append(p)
        for c in self.conns:
            assert c.recv() == "ready"

    def op(self, name):
        def run():
            for c in self.conns:
                c.send(name)
            return max(c.recv() for c in self.conns)
        return run

    def close(self):
        for c in self.conns:
            c.send(None)
        for p in self.procs:
            p.join(10)


# -- one configuration ---------------------------------------------------------------------------

def measure(args, label, ref, pair, init):
    """Cold and warm times of our ops in the pool `init()` makes, with numpy's in between."""
    n = args.size // 4
    pool = init()
    a, b, c = (pt.random.random((n,), seed=s, dtype=np.float32) for s in (1, 2, 3))
    ours = ours_ops(a, b, c)
    rows = []
    cold = {}
    for op in OPS:                                  # first runs: fresh pool memory
        t = time.perf_counter()
        r = ours[op]()
        cold[op] = time.perf_counter() - t
        want = ref["check"][op]
        got = r if op == "sum" else r.reshape(-1)[:1 << 16].to_numpy()
        assert np.allclose(got, want, rtol=1e-4), (label, op)
        del r
    # every repeat runs ours, numpy and the pair of each op in a rotated order; ratios are
    # medians of the per-repeat ratios, so a load burst spoils both sides of a ratio alike
    t = {f"{who} {op}": [] for op in OPS for who in ("ours", "numpy", "pair")}
    for r in range(args.repeats):
        for op in OPS:
            fns = [("ours", ours[op]), ("numpy", ref["ops"][op])]
            if pair:
                fns.append(("pair", pair.op(op)))
            for who, fn in common.rotated(fns, r):
                t0 = time.perf_counter()
                own = fn()
                took = time.perf_counter() - t0
                # the pair's time is its own clock: the slower half, without the pipes
                t[f"{who} {op}"].append(own if who == "pair" else took)
    for op in OPS:
        o, nn, two = t[f"ours {op}"], t[f"numpy {op}"], t[f"pair {op}"]
        rows.append({"config": label, "op": op, "cold_s": cold[op], "numpy_cold_s":
                     ref["cold"][op], "warm_s": statistics.median(o),
                     "numpy_s": statistics.median(nn),
                     "pair_s": statistics.median(two) if two else None,
                     "cold_ratio": ref["cold"][op] / cold[op],
                     "vs_numpy": common.median_ratio(nn, o),
                     "vs_pair": common.median_ratio(two, o) if two else None})
    stats = pool.stats()
    rows[0]["plans"] = stats.get("plans", {})
    del a, b, c, ours
    pt.finalize()
    return rows


def numpy_reference(args):
    n = args.size // 4
    a, b, c = (seeded(n, s) for s in (1, 2, 3))
    ops = numpy_ops(a, b, c)
    cold, check = {}, {}
    for op in OPS:
        t = time.perf_counter()
        r = ops[op]()
        cold[op] = time.perf_counter() - t
        check[op] = r if op == "sum" else r.reshape(-1)[:1 << 16].copy()
        del r
    return {"ops": ops, "cold": cold, "check": check}


def servers(k, size):
    """k memory servers on loopback: (processes, addresses, secret file)."""
    folder = tempfile.mkdtemp(prefix="pt-bench-")
    secret = os.path.join(folder, "secret")
    with open(os.open(secret, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(os.urandom(16).hex())
    procs, addrs = [], []
    for _ in range(k):
        from collectives.launch import free_port
        port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "pooltensor", "serve", "--memory", str(8 * size // k + size),
             "--listen", f"127.0.0.1:{port}", "--secret-file", secret],
            stderr=subprocess.DEVNULL))
        addrs.append(f"127.0.0.1:{port}")
    import socket
    for addr in addrs:                       # each listening before anyone connects
        host, port = addr.rsplit(":", 1)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"memory server {addr} did not start")
                time.sleep(0.1)
    return procs, addrs, secret


def spmd_child(args):
    """Under mpiexec: the SPMD reference (every rank computes what it homes)."""
    pool = pt.init()
    n = args.size // 4
    a, b, c = (pt.random.random((n,), seed=s, dtype=np.float32) for s in (1, 2, 3))
    ours = ours_ops(a, b, c)
    out = {}
    for op in OPS:
        pool.world.barrier()
        t = time.perf_counter()
        ours[op]()
        pool.world.barrier()
        cold = time.perf_counter() - t
        ts = []
        for _ in range(args.repeats):
            pool.world.barrier()
            t = time.perf_counter()
            ours[op]()
            pool.world.barrier()
            ts.append(time.perf_counter() - t)
        out[op] = {"cold_s": cold, "warm_s": statistics.median(ts)}
    if pool.me == 0 and args.spmd_json:
        with open(args.spmd_json, "w") as f:
            json.dump(out, f)
    pt.finalize()


def main():
    args = parse()
    if _launched():
        return spmd_child(args)
    ref = numpy_reference(args)
    pair = Pair(args.size // 4)
    rows = []
    try:
        for m in args.members:
            rows += measure(args, f"members={m}", ref, pair,
                            lambda m=m: pt.init(members=m, cache_bytes=args.size // 4))
        if args.servers:
            procs, addrs, secret = servers(args.servers, args.size)
            try:
                rows += measure(args, f"servers={args.servers}", ref, pair,
                                lambda: pt.init(connect=addrs, secret_file=secret,
                                                memory=8 * args.size // args.servers,
                                                cache_bytes=args.size // 4))
            finally:
                for p in procs:
                    p.terminate()
                    p.wait(10)
    finally:
        pair.close()
    if not args.no_spmd:
        path = tempfile.mktemp(suffix=".json")
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        cmd = [mpiexec, "-n", "2", sys.executable, os.path.abspath(__file__), "--size",
               str(args.size), "--repeats", str(args.repeats), "--spmd-json", path]
        if subprocess.run(cmd, timeout=1200).returncode == 0 and os.path.exists(path):
            sp = json.load(open(path))
            for op in OPS:
                nn = statistics.median([r["numpy_s"] for r in rows if r["op"] == op])
                two = [r["pair_s"] for r in rows if r["op"] == op and r["pair_s"]]
                two = statistics.median(two) if two else None
                rows.append({"config": "spmd n=2", "op": op, "cold_s": sp[op]["cold_s"],
                             "numpy_cold_s": ref["cold"][op], "warm_s": sp[op]["warm_s"],
                             "numpy_s": nn, "pair_s": two,
                             "cold_ratio": ref["cold"][op] / sp[op]["cold_s"],
                             "vs_numpy": nn / sp[op]["warm_s"],
                             "vs_pair": two / sp[op]["warm_s"] if two else None})
    report(args, rows)


def report(args, rows):
    headers = ["config", "op", "cold s", "numpy cold s", "cold ratio", "warm s", "numpy s",
               "2 numpy s", "vs numpy", "vs 2 numpy"]
    table = common.format_table(headers, [[r["config"], r["op"], r["cold_s"], r["numpy_cold_s"],
                                           r["cold_ratio"], r["warm_s"], r["numpy_s"],
                                           r["pair_s"] or 0.0, r["vs_numpy"],
                                           r["vs_pair"] or 0.0] for r in rows])
    title = (f"plain script computing where its slabs live: float32 arrays of "
             f"{human_size(args.size)}; ratio = numpy time / ours (aims: ew, sum >= 1.0 vs one "
             f"numpy and >= 0.85 vs two; sin >= 1.6 vs one)")
    print(title)
    print(table)
    by = {(r["config"], r["op"]): r for r in rows}
    for cfg in dict.fromkeys(r["config"] for r in rows):
        ew, ew2, fu = (by.get((cfg, k)) for k in ("ew", "ew2", "fused"))
        if ew and ew2 and fu:
            print(f"{cfg}: a*b+c into its temporary: {ew2['warm_s'] / ew['warm_s']:.2f}x warm, "
                  f"{ew2['cold_s'] / ew['cold_s']:.2f}x cold, against two new arrays; fused "
                  f"per slab (map_blocks): {ew['warm_s'] / fu['warm_s']:.2f}x warm")
    name = "plain-quick" if args.quick else "plain"
    os.makedirs(args.out, exist_ok=True)
    common.write_json(os.path.join(args.out, name + ".json"),
                      {"machine": common.machine_info(load=os.getloadavg()), "rows": rows,
                       "size": args.size})
    with open(os.path.join(args.out, name + ".txt"), "w") as f:
        f.write(title + "\n" + table + "\n")
    plot(os.path.join(args.out, name + ".png"), title, rows)


def plot(path, title, rows):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    for ax, key, what in ((axes[0], "vs_numpy", "warm: numpy time / ours"),
                          (axes[1], "cold_ratio", "cold (first run): numpy time / ours")):
        w = 0.8 / len(configs)
        for i, cfg in enumerate(configs):
            ys = [next((r[key] for r in rows if r["config"] == cfg and r["op"] == op), 0)
                  for op in OPS]
            ax.bar([j + i * w for j in range(len(OPS))], ys, w, label=cfg)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(OPS))], OPS)
        ax.set_title(what, fontsize=10)
        ax.legend(fontsize=7)
    common.save_figure(fig, path, title)


if __name__ == "__main__":
    main()
