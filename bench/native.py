"""The posix profile of the native layer against the linux profile, on this machine.

    python bench/native.py rma|collectives [--rounds N] [--ranks N] [--out DIR]
    python bench/rma.py --native posix          (the same, for rma)
    python bench/collectives.py --native posix  (the same, for collectives)

Runs the benchmark's --quick form under mpiexec once per round with each build, the order
alternating between rounds so that a change in machine load hits both alike: the linux build
in place, the posix build from build/posix/pkg (`make build/posix/pkg/.built`). Reports the
medians over rounds of posix/linux for the 8-byte P50 latency (rma: ours get; collectives: the
smallest size of each kind) and for bandwidth at >= 1 MiB (aim: <= 1.3 and about 1.0).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
POSIX = os.path.join(ROOT, "build", "posix", "pkg")
MiB = 1 << 20


def _run(bench, profile, out, ranks):
    env = dict(os.environ)
    if profile == "posix":
        env["PYTHONPATH"] = POSIX + os.pathsep + env.get("PYTHONPATH", "")
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec, "-n", str(ranks), sys.executable, os.path.join(HERE, bench + ".py"),
           "--quick", "--out", out]
    if bench == "collectives":
        cmd.append("--no-gloo")
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, timeout=900)
    name = f"{bench}-n{ranks}-quick.json" if bench == "collectives" else f"{bench}-quick.json"
    with open(os.path.join(out, name)) as f:
        return json.load(f)


def _figures(bench, res):
    """{name: (value, 'lat' or 'bw')} of one run."""
    out = {}
    if bench == "rma":
        for op in ("get", "put"):
            out[f"8 B {op} P50"] = (res["latency_ns"][f"ours {op}"]["p50"], "lat")
            for s, v in res["bandwidth"][f"ours {op}"].items():
                if int(s) >= MiB:
                    out[f"{int(s) // MiB} MiB {op} GB/s"] = (v["gbps"], "bw")
    else:
        for kind, by_size in res["results"].items():
            sizes = sorted(by_size, key=int)
            out[f"{kind} {sizes[0]} B P50"] = (by_size[sizes[0]]["ours"]["p50"], "lat")
            for s in sizes:
                if int(s) >= MiB:
                    out[f"{kind} {int(s) // MiB} MiB busbw"] = (by_size[s]["ours"]["busbw"],
                                                               "bw")
    return out


def compare(bench, rounds=3, ranks=2, out=None):
    """Run `bench` in both profiles, interleaved; print and return the posix/linux ratios."""
    out = out or os.path.join(HERE, "results", "native")
    if not os.path.isdir(POSIX):
        raise SystemExit(f"no posix build in {POSIX}: make build/posix/pkg/.built")
    ratios = {}
    for i in range(rounds):
        figs = {}
        for p in (("linux", "posix") if i % 2 == 0 else ("posix", "linux")):
            figs[p] = _figures(bench, _run(bench, p, os.path.join(out, f"{p}-{i}"), ranks))
        for k, (v, _) in figs["linux"].items():
            if k in figs["posix"] and v:
                ratios.setdefault(k, []).append(figs["posix"][k][0] / v)
    med = {k: statistics.median(v) for k, v in ratios.items()}
    print(f"{bench}: posix/linux, median of {rounds} interleaved rounds "
          f"(latency aim <= 1.3, bandwidth aim ~1.0)")
    for k, v in med.items():
        print(f"  {k:<32} {v:6.2f}")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, bench + "-native.json"), "w") as f:
        json.dump({"bench": bench, "rounds": rounds, "ratios": ratios, "median": med}, f,
                  indent=1)
    return med


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench", choices=("rma", "collectives"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    compare(a.bench, a.rounds, a.ranks, a.out)


if __name__ == "__main__":
    main()
