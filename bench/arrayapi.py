"""The Array API's data-dependent functions on pool arrays, against numpy in the same run.

    python bench/arrayapi.py [--quick] [--elements N] [--repeats R] [--out DIR]

float64 data of N elements (default 2**23 = 64 MiB; quick 2**20), a plain script with 2
members, in three configurations:

- fits:    the default materialize_limit: arrays that fit one process are gathered and numpy
           does the work (what the functions do for arrays that fit);
- chunked: materialize_limit lowered to an eighth of the array: the chunked passes
           (ops/chunks.py), each chunk where its first row lives (the members run theirs);
- 4x-cache: the chunked passes with the slab cache a quarter of the array and the members'
           slabs copied through it (attach=False), as across machines: the array is 4x
           larger than the cache and is never gathered.

Operations: sort, argsort (stable), unique_values and unique_all (integers with repeats),
cumulative_sum,
searchsorted (N/8 needles), nonzero, flip (numpy: a view, so copied), roll, repeat(2), tile(2),
take (N/8 indices),
fft along the rows of an (N/64, 64) array, qr of an (N/4, 4) matrix (TSQR when chunked).
numpy runs each on the same data held as numpy arrays. Time = median of --repeats, run
interleaved with numpy's (common.interleaved); cold = the first call. Ratio = ours / numpy's
(the aim: <= 2 where the array fits). Results: DIR/arrayapi[-quick].{json,txt,png}.
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

sys.path.remove(HERE)                  # bench/collectives.py is not the package
sys.path.append(os.path.dirname(HERE))
import pooltensor as pt  # noqa: E402

CONFIGS = {
    "fits": lambda nb: {"members": 2},
    "chunked": lambda nb: {"members": 2, "materialize_limit": nb // 8},
    "4x-cache": lambda nb: {"members": 2, "materialize_limit": nb // 8, "attach": False,
                            "cache_bytes": nb // 4},
}


def data(n, seed=0):
    """The inputs as numpy arrays (the same every configuration)."""
    rng = np.random.default_rng(seed)
    return {"x": rng.random(n), "ints": rng.integers(0, n // 16, n).astype(np.int64),
            "needles": rng.random(n // 8), "idx": rng.integers(0, n, n // 8),
            "rows": rng.random((n // 64, 64)), "tall": rng.random((n // 4, 4))}


def operations(xp, d, sorted_x):
    """name -> a call of namespace xp (pooltensor or numpy) on the inputs d."""
    stable = {"stable": True} if xp is pt else {"kind": "stable"}
    return {
        "sort": lambda: xp.sort(d["x"], **stable),
        "argsort": lambda: xp.argsort(d["x"], **stable),
        "unique_values": lambda: xp.unique_values(d["ints"]) if xp is pt else
        np.unique(d["ints"]),
        "unique_all": lambda: xp.unique_all(d["ints"]) if xp is pt else
        np.unique(d["ints"], return_index=True, return_inverse=True, return_counts=True),
        "cumulative_sum": lambda: xp.cumulative_sum(d["x"]) if xp is pt else np.cumsum(d["x"]),
        "searchsorted": lambda: xp.searchsorted(sorted_x, d["needles"]),
        "nonzero": lambda: xp.nonzero(d["ints"]),
        "flip": lambda: xp.flip(d["x"]) if xp is pt else np.flip(d["x"]).copy(),
        "roll": lambda: xp.roll(d["x"], 12345),
        "repeat": lambda: xp.repeat(d["x"], 2),
        "tile": lambda: xp.tile(d["x"], (2,)),
        "take": lambda: xp.take(d["x"], d["idx"]),
        "fft rows": lambda: xp.fft.fft(d["rows"], axis=1),
        "qr tall": lambda: xp.linalg.qr(d["tall"]),
    }


def run(config, n, repeats, ref):
    nb = n * 8
    pt.finalize()
    pt.init(**CONFIGS[config](nb))
    d = {k: pt.asarray(v) for k, v in ref.items()}
    ours = operations(pt, d, pt.sort(d["x"]))
    theirs = operations(np, ref, np.sort(ref["x"]))
    rows = []
    for name in ours:
        t0 = time.perf_counter()
        ours[name]()
        cold = time.perf_counter() - t0
        times = common.interleaved({"ours": ours[name], "numpy": theirs[name]}, repeats,
                                   warmup=0)
        o, w = statistics.median(times["ours"]), statistics.median(times["numpy"])
        rows.append({"config": config, "op": name, "cold_s": cold, "ours_s": o,
                     "numpy_s": w, "ratio": o / w})
        print(f"{config:9s} {name:15s} ours {o * 1e3:9.1f} ms  numpy {w * 1e3:9.1f} ms  "
              f"ratio {o / w:6.2f}  (cold {cold * 1e3:.1f} ms)", flush=True)
    pt.finalize()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2**20 elements, 2 repeats")
    ap.add_argument("--elements", type=int, default=None, help="N (default 2**23)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats (default 3)")
    ap.add_argument("--configs", default="fits,chunked,4x-cache")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    n = args.elements or (1 << 20 if args.quick else 1 << 23)
    repeats = args.repeats or (2 if args.quick else 3)
    ref = data(n)
    rows = []
    for config in args.configs.split(","):
        rows += run(config, n, repeats, ref)
    name = "arrayapi-quick" if args.quick else "arrayapi"
    table = common.format_table(["config", "op", "ours ms", "numpy ms", "ours/numpy", "cold ms"],
                                [[r["config"], r["op"], r["ours_s"] * 1e3, r["numpy_s"] * 1e3,
                                  r["ratio"], r["cold_s"] * 1e3] for r in rows])
    print(table)
    common.write_json(os.path.join(args.out, name + ".json"),
                      {"machine": common.machine_info(load=os.getloadavg(), elements=n),
                       "rows": rows})
    with open(os.path.join(args.out, name + ".txt"), "w") as f:
        f.write(table + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4))
    ops = list(dict.fromkeys(r["op"] for r in rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    w = 0.8 / max(1, len(configs))
    for i, c in enumerate(configs):
        vals = [next((r["ratio"] for r in rows if r["op"] == o and r["config"] == c), 0)
                for o in ops]
        ax.bar(np.arange(len(ops)) + i * w, vals, w, label=c)
    ax.axhline(2, color="grey", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(ops)) + w * (len(configs) - 1) / 2, ops, rotation=30,
                  ha="right", fontsize=8)
    ax.set_ylabel("ours / numpy (time)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    common.save_figure(fig, os.path.join(args.out, name + ".png"),
                       f"Array API functions on {common.human_size(n * 8)} vs numpy")


if __name__ == "__main__":
    main()
