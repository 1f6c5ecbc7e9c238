"""``pooltensor bench``: run the benchmarks of bench/ (the source tree's) one after the other,
each with the launcher it needs, behind a progress bar; each writes its own JSON, text and PNG
into --out, and this command adds bench.json (what ran, how long, where the results are) and
bench.png (the time each took)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# name -> (launcher, ranks): how `make bench` runs each (None: a plain process)
BENCHMARKS = {"stats": ("launch", 2), "rma": ("mpiexec", 2), "collectives": ("mpiexec", 2),
              "pool": (None, 1), "ops": (None, 1), "plain": (None, 1), "tcp": (None, 1)}


def add_parser(sub):
    """Register ``bench``."""
    p = sub.add_parser(
        "bench", help="run the benchmarks of bench/ with a progress bar (JSON + PNG)",
        description="Run the benchmarks in bench/ (from a source checkout), each against its "
                    "peers in the same run; results go to --out as JSON, text and PNG.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help=f"which ones (default: all): {', '.join(BENCHMARKS)}")
    p.add_argument("--quick", action="store_true", help="short runs (a smoke test of each)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="where results go (default: bench/results)")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--progress", choices=("auto", "always", "never"), default="auto",
                   help="progress bar on stderr: auto (when it is a terminal), always, never")
    p.set_defaults(run=run)
    return p


def bench_dir():
    """bench/ of the source tree this package runs from, or None (an installed wheel)."""
    d = Path(__file__).resolve().parent.parent.parent / "bench"
    return d if (d / "common.py").is_file() else None


def command(name, folder, quick, out):
    """The argv that runs one benchmark."""
    launcher, n = BENCHMARKS[name]
    script = [str(folder / f"{name}.py")] + (["--quick"] if quick else []) + ["--out", out]
    if launcher == "mpiexec":
        exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or \
            shutil.which("mpiexec")
        if exe is None:
            return None
        return [exe, "-n", str(n), sys.executable] + script
    if launcher == "launch":
        return [sys.executable, "-m", "collectives.launch", "-n", str(n)] + script
    return [sys.executable] + script


def run(args):
    """Run the benchmarks; exit status 1 when any failed, 2 for unknown names."""
    from ..cache.progress import bar
    if args.list:
        for name, (launcher, n) in BENCHMARKS.items():
            print(f"{name:12s} {launcher or 'plain'} x{n}")
        return 0
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        print(f"pooltensor bench: unknown benchmark(s) {', '.join(unknown)}; there are "
              f"{', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    folder = bench_dir()
    if folder is None:
        print("pooltensor bench: the benchmarks ship with the source tree (bench/), not with "
              "the installed package; run it from a checkout", file=sys.stderr)
        return 1
    out = os.path.abspath(args.out or folder / "results")
    os.makedirs(out, exist_ok=True)
    names = args.names or list(BENCHMARKS)
    results = {}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(folder.parent)] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    with bar(total=len(names), desc="bench", unit="benchmark", mode=args.progress) as pb:
        for name in names:
            pb.set_postfix_str(name)
            cmd = command(name, folder, args.quick, out)
            t0 = time.monotonic()
            if cmd is None:
                results[name] = {"status": "skipped", "why": "mpiexec not found"}
            else:
                log = os.path.join(out, f"{name}.log")
                with open(log, "w") as f:
                    rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
                stem = os.path.join(out, name + ("-quick" if args.quick else ""))
                results[name] = {
                    "status": "ok" if rc == 0 else f"failed (exit {rc})",
                    "seconds": round(time.monotonic() - t0, 2), "log": log,
                    "results": [stem + ext for ext in (".json", ".txt", ".png")
                                if os.path.exists(stem + ext)]}
            pb.update(1)
    summary = {"out": out, "quick": args.quick, "benchmarks": results}
    with open(os.path.join(out, "bench.json"), "w") as f:
        json.dump(summary, f, indent=1)
    _plot(results, os.path.join(out, "bench.png"))
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for name, r in results.items():
            extra = f"{r['seconds']:.1f} s, {len(r['results'])} file(s)" if "seconds" in r \
                else r.get("why", "")
            print(f"{name:12s} {r['status']:20s} {extra}")
        print(f"results in {out} (bench.json, bench.png; each benchmark's .json/.txt/.png/.log)")
    return 0 if all(r["status"] in ("ok", "skipped") for r in results.values()) else 1


def _plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(results)
    secs = [results[n].get("seconds", 0) for n in names]
    colors = ["C2" if results[n]["status"] == "ok" else "C3" for n in names]
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(names)), 3.6))
    ax.bar(names, secs, color=colors)
    ax.set_ylabel("seconds")
    ax.set_title("pooltensor bench: time per benchmark (red: failed)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
