"""What the native counters cost: the 8-byte get with the counters on and off, interleaved.

    python -m collectives.launch -n 2 bench/stats.py [--quick] [--out DIR]
    mpiexec -n 2 python bench/stats.py

Rank 0 reads 8 bytes of rank 1's window (shared memory, the fastest path, so the one where
the counters weigh most) while rank 1 sleeps in a barrier. Two paths are timed, each with the
counters on and off (collectives._native.stats_enable, a process-wide switch that the entry
points read before they read the clock): `Window.get` (what the pool's faults use) and the
bare `Context.get` of the binding (less Python around it, so a stricter ratio). Per-call
times (P50/P99) and the mean of an untimed loop come from common.latencies(), in blocks whose
order rotates, so machine load hits on and off alike; the ratio on/off is what to read.
A cold pass (the first calls after the window is made, counters on: the first count of a
(peer, operation) allocates its histogram) is reported apart. Last, with nothing around the
counting: bench/stats_native.c, built here with cc against native/'s sources, times pt_get of
8 bytes from its own segment in C (the shortest path there is; skipped without a compiler),
as the counters run by default (1 quick operation in 16 timed) and with every operation
timed (POOLTENSOR_STATS_SAMPLE=1: what two clock reads per operation cost).
Writes DIR/stats[-quick].json, .txt and .png.
"""
import argparse
import contextlib
import glob
import os
import platform
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, HERE)
import common  # noqa: E402

sys.path.remove(HERE)
sys.path.append(os.path.dirname(HERE))

LONG = 3600.0


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    p.add_argument("--iters", type=int, default=None, help="timed calls per contender")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="where results go")
    p.add_argument("--verbose", action="store_true")
    return p.parse_args()


def measure(a, win, ctx, key):
    from collectives import _native
    out8 = np.zeros(8, np.uint8)
    iters = a.iters or (20000 if a.quick else 200000)
    cold = []
    for _ in range(100):        # counters on, first calls: allocation of the cells included
        t = common.now_ns()
        win.get(1, 0, out8)
        cold.append(common.now_ns() - t)

    @contextlib.contextmanager
    def counters(name):
        was = _native.stats_enable(name.endswith("on"))
        try:
            yield
        finally:
            _native.stats_enable(was)

    ops = {"Window.get on": lambda: win.get(1, 0, out8),
           "Window.get off": lambda: win.get(1, 0, out8),
           "Context.get on": lambda: ctx.get(1, key, 0, out8),
           "Context.get off": lambda: ctx.get(1, key, 0, out8)}
    lat = common.latencies(ops, iters, warmup=2000, blocks=20, around=counters)
    return common.summarize_ns(sorted(cold)), lat


def build_native():
    """bench/stats_native.c built against native/'s sources (once per their content): its path,
    or None without a C compiler."""
    root = os.path.dirname(HERE)
    profile = "linux" if sys.platform.startswith("linux") else "posix"
    srcs = [p for p in sorted(glob.glob(os.path.join(root, "native/src/**/*.c"), recursive=True))
            if not p.endswith(("platform/linux.c", "platform/posix.c"))]
    srcs.append(os.path.join(root, f"native/src/platform/{profile}.c"))
    flags = ["-std=gnu11", "-O3", f"-DPT_PLATFORM_{profile.upper()}=1",
             "-I" + os.path.join(root, "native/include"), "-I" + os.path.join(root, "native/src")]
    if platform.machine() in ("x86_64", "AMD64"):
        flags.append("-DPT_X86=1")
    try:
        return common.built("stats-native", [os.path.join(HERE, "stats_native.c"), *srcs],
                            flags, libs=["-lpthread"],
                            deps=glob.glob(os.path.join(root, "native/**/*.h"), recursive=True))
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return None


def native_cost(exe, quick, sample=None):
    """(off ns, on ns) of the built bench/stats_native.c; sample: the POOLTENSOR_STATS_SAMPLE
    it runs with (None: the default)."""
    env = dict(os.environ)
    env.pop("POOLTENSOR_STATS_SAMPLE", None)
    if sample:
        env["POOLTENSOR_STATS_SAMPLE"] = str(sample)
    out = subprocess.run([exe, "200000" if quick else "1000000", "20"], capture_output=True,
                         text=True, timeout=600, env=env)
    off, on = map(float, out.stdout.split())
    return off, on


def main():
    a = parse()
    common.VERBOSE = a.verbose
    import collectives
    w = collectives.init()
    if w.size != 2:
        raise SystemExit("run with exactly 2 ranks: python -m collectives.launch -n 2 "
                         "python bench/stats.py")
    load_start, t_start = os.getloadavg(), common.now_ns()
    win = w.expose(4096 if w.rank == 1 else 64)
    w.barrier()
    if w.rank == 0:
        cold, lat = measure(a, win, win._ctx, win._keys[1])
        w.barrier(timeout=LONG)
    else:
        w.barrier(timeout=LONG)
    if w.rank == 0:
        rows, ratios = [], {}
        for path in ("Window.get", "Context.get"):
            on, off = lat[path + " on"], lat[path + " off"]
            ratios[path] = {k: on[k] / off[k] for k in ("p50", "p99", "loop_mean")}
            for state, r in (("on", on), ("off", off)):
                rows.append([f"{path} {state}", r["p50"], r["p99"], r["loop_mean"]])
            rows.append([f"{path} on/off", ratios[path]["p50"], ratios[path]["p99"],
                         ratios[path]["loop_mean"]])
        exe = build_native()
        native = native_cost(exe, a.quick) if exe else None
        every = native_cost(exe, a.quick, sample=1) if exe else None
        if native is not None:
            rows.append(["C pt_get (own segment) on", native[1], "", ""])
            rows.append(["C pt_get (own segment) off", native[0], "", ""])
            rows.append(["C pt_get on/off", native[1] / native[0], "", ""])
            ratios["C pt_get"] = {"best_batch": native[1] / native[0],
                                  "added_ns": native[1] - native[0]}
        if every is not None:
            rows.append(["C pt_get on, every op timed", every[1], "", ""])
            rows.append(["C pt_get every op timed/off", every[1] / every[0], "", ""])
            ratios["C pt_get every op timed"] = {"best_batch": every[1] / every[0],
                                                 "added_ns": every[1] - every[0]}
        text = ("8-byte get, rank 0 -> rank 1 (shared memory), counters on and off\n" +
                common.format_table(["", "P50 ns", "P99 ns", "loop mean ns"], rows) +
                f"\n\ncold (first 100 calls, counters on): P50 {cold['p50']:.0f} ns, "
                f"max {cold['max']:.0f} ns" +
                f"\nload average {load_start[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end, "
                f"{(common.now_ns() - t_start) / 1e9:.1f} s")
        print(text, flush=True)
        name = "stats-quick" if a.quick else "stats"
        os.makedirs(a.out, exist_ok=True)
        base = os.path.join(a.out, name)
        common.write_json(base + ".json", {
            "benchmark": "stats", "machine": common.machine_info(loadavg_start=load_start),
            "latency_ns": lat, "cold_ns": cold, "ratio_on_off": ratios, "table": text})
        with open(base + ".txt", "w") as f:
            f.write(text + "\n")
        plot(base + ".png", lat)
        print(f"\nwrote {base}.{{json,txt,png}}", flush=True)
    w.barrier(timeout=LONG)
    win.close()


def plot(path, lat):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    names = list(lat)
    x = np.arange(len(names))
    ax.bar(x - 0.2, [lat[n]["p50"] for n in names], 0.4, label="P50")
    ax.bar(x + 0.2, [lat[n]["loop_mean"] for n in names], 0.4, label="loop mean")
    ax.set_xticks(x, names, rotation=15)
    ax.set_ylabel("ns per 8-byte get")
    ax.set_title("native counters on / off")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
