"""Small helpers shared by the benchmarks: timing, percentiles, machine info, tables, JSON, plots.

Nothing here knows about windows, collectives or the pool: a benchmark hands in a callable and
a byte count and gets figures back.
"""
import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

now_ns = time.perf_counter_ns

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def built(name, sources, flags, libs=(), shared=False, deps=()):
    """The C helper `name` built with cc from `sources`: its path. Built once per content of the
    sources, `deps` (headers they include) and flags, into the temp folder, so a second run (a
    test that runs a benchmark twice, a repeat) does not pay for it again; the sources compile
    in parallel, one cc per file, then link. CalledProcessError (its stderr kept) if cc fails."""
    h = hashlib.sha1(" ".join([*flags, *libs, str(shared)]).encode())
    for p in sorted(set(sources) | set(deps)):
        with open(p, "rb") as f:
            h.update(p.encode() + b"\0" + f.read())
    path = os.path.join(tempfile.gettempdir(), f"pooltensor-bench-{name}-{h.hexdigest()[:12]}"
                        + (".so" if shared else ""))
    if os.path.exists(path):
        return path
    cc = os.environ.get("CC", "cc")
    link = ["-shared"] if shared else []
    work = tempfile.mkdtemp(prefix=f"pooltensor-bench-{name}-")
    try:
        objs = [os.path.join(work, f"{i}.o") for i in range(len(sources))]

        def compile_one(src_obj):
            subprocess.run([cc, *flags, "-c", src_obj[0], "-o", src_obj[1]], check=True,
                           timeout=300, capture_output=True)
        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            list(pool.map(compile_one, zip(sources, objs)))
        tmp = f"{path}.{os.getpid()}"
        subprocess.run([cc, *flags, *link, "-o", tmp, *objs, *libs], check=True, timeout=300,
                       capture_output=True)
        os.replace(tmp, path)       # atomic: a concurrent run sees the whole file or none
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return path


def human_size(n):
    """1024 -> '1 KiB', 3 << 20 -> '3 MiB' (exact multiples only get the short form)."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def sizes(lo, hi, factor=2):
    """lo, lo*factor, ... up to and including hi."""
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= factor
    return out


def timer_overhead_ns(iters=20000):
    """Median cost of one back-to-back pair of perf_counter_ns() calls (to read latencies by)."""
    t = now_ns
    d = []
    for _ in range(iters):
        a = t()
        b = t()
        d.append(b - a)
    return statistics.median(d)


def percentile(sorted_values, p):
    """The p-th percentile (0..100) of an already sorted list, by linear interpolation."""
    if not sorted_values:
        return float("nan")
    k = (len(sorted_values) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def summarize_ns(samples):
    """P50/P90/P99/P99.9/min/max/mean (ns) of a list of per-operation times."""
    s = sorted(samples)
    return {"n": len(s), "min": s[0], "p50": percentile(s, 50), "p90": percentile(s, 90),
            "p99": percentile(s, 99), "p999": percentile(s, 99.9), "max": s[-1],
            "mean": sum(s) / len(s)}


def latency(op, iters, warmup=1000):
    """Time `op()` one call at a time; returns summarize_ns() of the per-call times (ns) plus
    'loop_mean', the mean per call of an untimed tight loop of the same length (no timer cost)."""
    t = now_ns
    for _ in range(warmup):
        op()
    samples = [0] * iters
    for i in range(iters):
        a = t()
        op()
        samples[i] = t() - a
    out = summarize_ns(samples)
    a = t()
    for _ in range(iters):
        op()
    out["loop_mean"] = (t() - a) / iters
    return out


def rotated(items, r):
    """items (a sequence) in the order of repeat r: rotated left by r, so that across repeats
    every contender runs first, last and after each of the others, not always after the same
    one (whose cache footprint, page faults or load it would inherit)."""
    items = list(items)
    k = r % len(items) if items else 0
    return items[k:] + items[:k]


def interleaved(fns, repeats, setup=None, warmup=1):
    """{name: [seconds of each repeat]}: every fn once per repeat, the order rotated from
    repeat to repeat (rotated()); setup() runs untimed before every call; `warmup` untimed
    calls of each first. For whole operations timed one call at a time (a benchmark whose
    contenders each take milliseconds or more)."""
    for fn in fns.values():
        for _ in range(warmup):
            if setup:
                setup()
            fn()
    times = {k: [] for k in fns}
    t = time.perf_counter
    for r in range(repeats):
        for k, fn in rotated(fns.items(), r):
            if setup:
                setup()
            a = t()
            fn()
            times[k].append(t() - a)
    return times


def _calibrate(op, target_s):
    """How many calls of op() take about target_s."""
    t = now_ns
    n = 1
    while True:  # double until one batch takes >= target_s / 8
        a = t()
        for _ in range(n):
            op()
        el = t() - a
        if el >= target_s * 1e9 / 8 or n >= 1 << 24:
            break
        n *= 2
    return max(1, int(n * target_s * 1e9 / max(el, 1)))


def _stretch(around, name):
    return around(name) if around is not None else contextlib.nullcontext()


def bandwidths(ops, nbytes, target_s=0.1, repeats=5, warmup=1, around=None):
    """bandwidth() for several ops moving the same `nbytes`, interleaved: each repeat runs one
    batch of every op in turn, so a change in machine load hits all of them alike and the
    ratios between them stay fair. The order rotates from repeat to repeat (rotated()), so no
    op always runs right after the same other one (whose cache footprint it would inherit).
    `ops` is {name: callable}; returns {name: result}. around(name), if given, is a context
    manager entered before every stretch of calls of op `name` (warmup and calibration, each
    batch) and left after it, untimed: a peer that must take part only in some contenders'
    calls (an MPI target inside MPI for MPI's batches only)."""
    calls = {}
    for name, op in ops.items():
        with _stretch(around, name):
            for _ in range(warmup):
                op()
            calls[name] = _calibrate(op, target_s)
    rates = {name: [] for name in ops}
    t = now_ns
    for r in range(repeats):
        for name, op in rotated(ops.items(), r):
            n = calls[name]
            with _stretch(around, name):
                a = t()
                for _ in range(n):
                    op()
                el = t() - a
            rates[name].append(nbytes * n / (el * 1e-9))
    return {name: {"bytes": nbytes, "calls": calls[name],
                   "gbps": statistics.median(r) / 1e9, "gbps_repeats": [x / 1e9 for x in r],
                   "gbps_max": max(r) / 1e9} for name, r in rates.items()}


def paired_ratio(a, b):
    """Median over repeats of a's rate / b's rate in the same repeat, for two results of one
    bandwidths() call: the two batches of a repeat ran back to back, so a load burst that
    spoils a repeat spoils both sides and cancels out of the ratio."""
    return median_ratio(a["gbps_repeats"], b["gbps_repeats"])


def median_ratio(xs, ys):
    """Median over repeats of x / y, for two lists of per-repeat figures (seconds, or rates)
    taken in the same repeats: what a load burst spoils, it spoils on both sides."""
    return statistics.median(x / y for x, y in zip(xs, ys))


def median_diff(xs, ys):
    """Median over repeats of x - y, pairing the repeats as median_ratio does."""
    return statistics.median(x - y for x, y in zip(xs, ys))


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def latencies(ops, iters, warmup=1000, blocks=10, around=None):
    """latency() for several ops, interleaved in `blocks` blocks in rotating order (same
    reason as bandwidths(); `around` too). `ops` is {name: callable}; returns {name: summary};
    'loop_mean' here is the median over blocks of the mean per call of an untimed loop (one
    preemption then spoils one block only)."""
    t = now_ns
    for name, op in ops.items():
        with _stretch(around, name):
            for _ in range(warmup):
                op()
    per = max(1, iters // blocks)
    samples = {name: [] for name in ops}
    loop = {name: [] for name in ops}
    for b in range(blocks):
        for name, op in rotated(ops.items(), b):
            s = samples[name]
            with _stretch(around, name):
                for _ in range(per):
                    a = t()
                    op()
                    s.append(t() - a)
                a = t()
                for _ in range(per):
                    op()
                loop[name].append((t() - a) / per)
    out = {}
    for name in ops:
        out[name] = summarize_ns(samples[name])
        out[name]["loop_mean"] = statistics.median(loop[name])  # median over blocks
    return out


def bandwidth(op, nbytes, target_s=0.1, repeats=5, warmup=1):
    """Bytes per second of `op()`, which moves `nbytes` per call.

    The call count per repeat is calibrated so one repeat takes about `target_s`; the median
    of `repeats` repeats is reported (plus every repeat, for the JSON)."""
    for _ in range(warmup):
        op()
    t = now_ns
    n = _calibrate(op, target_s)
    rates = []
    for _ in range(repeats):
        a = t()
        for _ in range(n):
            op()
        el = t() - a
        rates.append(nbytes * n / (el * 1e-9))
    return {"bytes": nbytes, "calls": n, "gbps": statistics.median(rates) / 1e9,
            "gbps_repeats": [r / 1e9 for r in rates], "gbps_max": max(rates) / 1e9}


def touch(arr, value=1):
    """Write every page of a numpy array so timing sees no first-touch page faults."""
    arr.fill(value)
    return arr


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _caches():
    out = {}
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for d in sorted(os.listdir(base)):
            if d.startswith("index"):
                lvl = _read(f"{base}/{d}/level")
                typ = _read(f"{base}/{d}/type")
                out[f"L{lvl}{'d' if typ == 'Data' else 'i' if typ == 'Instruction' else ''}"] = \
                    _read(f"{base}/{d}/size")
    except OSError:
        pass
    return out


def _segment_kind():
    """What pool segments are made of in this process (memfd, tmpfs with huge pages, ...)."""
    try:
        from collectives.native import segment_kind
        return segment_kind()
    except ImportError:     # a bench of other things runs without the native module
        return None


def machine_info(**extra):
    """CPU, cores, OS, Python and numpy versions, THP settings, plus whatever the caller adds."""
    import numpy as np
    info = {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "caches": _caches(),
        "machine": platform.machine(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "thp": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "thp_shmem": _read("/sys/kernel/mm/transparent_hugepage/shmem_enabled"),
        "segments": _segment_kind(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
    }
    info.update(extra)
    return info


def format_table(headers, rows):
    """A plain fixed-width text table (right-aligned; floats with 2 decimals)."""
    def cell(v):
        if isinstance(v, float):
            return f"{v:.2f}"
        return str(v)
    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h)
              for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def write_json(path, obj):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=str)
        f.write("\n")
    return path


def plot_bandwidth_and_latency(path, title, series, latencies=None):
    """One PNG: bandwidth (GB/s) against size, log-log, one line per series; and, if given,
    latency bars ({label: {"p50": ns, "p99": ns}}). `series` is {label: (sizes, gbps)} for one
    panel, or a list of (panel title, {label: (sizes, gbps)}) for several side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("bandwidth", series)] if isinstance(series, dict) else list(series)
    ncols = len(panels) + (1 if latencies else 0)
    fig, axes = plt.subplots(1, ncols, figsize=(7 * ncols, 4.8), squeeze=False)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {}  # one color per label, the same in every panel
    for _, lines in panels:
        for label in lines:
            colors.setdefault(label, palette[len(colors) % len(palette)])
    for k, (ptitle, lines) in enumerate(panels):
        ax = axes[0][k]
        for label, (xs, ys) in lines.items():
            ax.plot(xs, ys, marker="o", markersize=3, label=label, color=colors[label],
                    linestyle="--" if "memcpy" in label else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("transfer size (bytes)")
        ax.set_ylabel("GB/s")
        ax.set_title(ptitle, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if latencies:
        ax = axes[0][-1]
        labels = list(latencies)
        xs = range(len(labels))
        w = 0.38
        p50 = [latencies[k]["p50"] / 1000 for k in labels]
        p99 = [latencies[k]["p99"] / 1000 for k in labels]
        b1 = ax.bar([x - w / 2 for x in xs], p50, w, label="P50")
        b2 = ax.bar([x + w / 2 for x in xs], p99, w, label="P99")
        for bars in (b1, b2):
            for b in bars:
                ax.annotate(f"{b.get_height():.2f}", (b.get_x() + b.get_width() / 2,
                            b.get_height()), ha="center", va="bottom", fontsize=7)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("microseconds")
        ax.set_title("8-byte latency")
        ax.legend(fontsize=8)
    return save_figure(fig, path, title)


def plot_lines(path, title, panels, ncols=2):
    """One PNG of several log-log line panels sharing nothing but the figure.

    `panels` is a list of (panel title, y label, {label: (xs, ys)}); x is a size in bytes (log2
    axis). A label containing 'ours' is drawn solid, the others dashed, so ours stand out."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(7 * ncols, 4.6 * nrows), squeeze=False)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {}   # one color per label across every panel
    for k, (ptitle, ylabel, series) in enumerate(panels):
        line_panel(axes[k // ncols][k % ncols], ptitle, ylabel, series, colors, cycle)
    for k in range(len(panels), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    return save_figure(fig, path, title)


def line_panel(ax, ptitle, ylabel, series, colors, cycle, xlabel="message size (bytes)"):
    """Draw one log-log panel of {label: (sizes, ys)} on ax: size on a log2 x axis, a label
    containing 'ours' solid and the others dashed. `colors` ({label: color}, filled from
    `cycle` as new labels come) is shared by the panels of a figure so a label keeps its color."""
    for label, (xs, ys) in series.items():
        color = colors.setdefault(label, cycle[len(colors) % len(cycle)])
        ax.plot(xs, ys, marker="o", markersize=3, label=label, color=color,
                linestyle="-" if "ours" in label else "--")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(ptitle, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def save_figure(fig, path, title, dpi=110):
    """Title, lay out and write fig to path (making its folder), then free it; returns path."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


VERBOSE = False   # set by a benchmark's --verbose


def say(*what):
    """Progress on stderr, tagged with the MPI rank, when the benchmark runs with --verbose."""
    if VERBOSE:
        print(f"[rank {os.environ.get('PMI_RANK', '?')}]", *what, file=sys.stderr, flush=True)
