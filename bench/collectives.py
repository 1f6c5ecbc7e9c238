"""Collectives: ours against MPI (mpi4py) and torch.distributed's gloo backend.

    mpiexec -n 2 python bench/collectives.py [--quick] [--out DIR] [--gloo | --no-gloo]
    mpiexec -n 4 python bench/collectives.py --quick

float32 sum allreduce and allgather, for message sizes 8 B .. 256 MiB (8 B times powers of 4,
plus 1 MiB, 16 MiB and 256 MiB; --quick stops at 16 MiB). Contenders, on the same buffers:

  ours         collectives.allreduce(x, out=y) / allgather(x, out=Y), algorithm "auto"
  ours <algo>  the same with each algorithm in collectives.algorithms.names(kind)
  mpi          Comm.Allreduce([x, FLOAT], [y, FLOAT], SUM) / Comm.Allgather
  gloo         torch.distributed.all_reduce(tensor over y) (in place: gloo's API) /
               all_gather_into_tensor; used when torch is importable (--gloo: required,
               --no-gloo: skipped). Started with init_method env://, MASTER_ADDR=127.0.0.1
               and a free port that rank 0 picks and broadcasts over MPI.

Sizes follow nccl-tests: for allreduce, the bytes of x; for allgather, the bytes of the
gathered output (each rank sends size / n, at least one element). For each size, every
contender gets a warmup and a call count calibrated (together: the slowest rank decides) so one
repeat takes about --target-ms; then --repeats rounds run one batch of every contender in turn,
in an order rotated from round to round, each batch after a barrier, so that load changes hit
all contenders alike. Every call is timed
on every rank; a call's time is the maximum over ranks.

  P50 latency  median over every call of every repeat
  algbw        size / time per call, where time per call = median over repeats of the
               repeat's (max over ranks) elapsed time / calls
  busbw        nccl-tests: allreduce algbw * 2(n-1)/n, allgather algbw * (n-1)/n

Before timing, every contender's result is checked once against the exact answer. The input
is a pattern of multiples of 1/8 (exact float32 sums); gloo's in-place buffer is zeroed before
each of its timed batches, so that repeated in-place sums neither overflow nor turn denormal.

Prints the tables (ratios ours/MPI and ours/gloo: > 1 is better for busbw, < 1 is better for
latency), and writes DIR/collectives-n<N>[-quick].{json,txt,png}. The load average at start and
end is printed too: the numbers mean little on a machine that other jobs are using.
"""
import argparse
import os
import socket
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import KiB, MiB, human_size, now_ns, say  # noqa: E402

# This file is itself named collectives.py: take its folder off the path again, so that
# `import collectives` finds the package (installed, on PYTHONPATH, or the repo) and not us.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.append(os.path.dirname(HERE))

KINDS = ("allreduce", "allgather")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--native", choices=("posix",), default=None,
                   help="run without mpiexec: the posix build against the linux build, "
                        "interleaved (bench/native.py)")
    p.add_argument("--quick", action="store_true", help="sizes up to 16 MiB, shorter repeats")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--gloo", dest="gloo", action="store_true", default=None,
                   help="require torch.distributed gloo (error if torch is missing)")
    g.add_argument("--no-gloo", dest="gloo", action="store_false", help="skip gloo")
    p.add_argument("--max-size", type=int, default=None, help="default 256 MiB (quick: 16 MiB)")
    p.add_argument("--target-ms", type=float, default=None, help="time per repeat (100; quick 30)")
    p.add_argument("--repeats", type=int, default=None, help="repeats per size (7; quick 5)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls before calibrating")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated: allreduce,allgather")
    p.add_argument("--no-algorithms", action="store_true",
                   help="only 'auto' of ours, not every named algorithm")
    p.add_argument("-v", "--verbose", action="store_true", help="say what is measured, on stderr")
    a = p.parse_args()
    if a.native:
        sys.path.insert(0, HERE)
        import native
        native.compare("collectives")
        raise SystemExit(0)
    a.max_size = a.max_size or (16 * MiB if a.quick else 256 * MiB)
    a.target_ms = a.target_ms or (30.0 if a.quick else 100.0)
    a.repeats = a.repeats or (5 if a.quick else 7)
    a.kinds = [k for k in a.kinds.split(",") if k]
    for k in a.kinds:
        if k not in KINDS:
            p.error(f"unknown kind {k!r}: choose from {KINDS}")
    return a


def message_sizes(max_size):
    """8 B * 4^k, plus 1 MiB, 16 MiB and 256 MiB, up to max_size."""
    out = set(common.sizes(8, max_size, 4))
    out |= {s for s in (1 * MiB, 16 * MiB, 256 * MiB) if s <= max_size}
    return sorted(out)


def busbw_factor(kind, n):
    return 2 * (n - 1) / n if kind == "allreduce" else (n - 1) / n


def fill_pattern(arr):
    """arr[i] = (i % 7) / 8, built by doubling copies (no temporaries of arr's size)."""
    n = arr.size
    k = min(7, n)
    arr[:k] = np.arange(k, dtype=np.float32) / 8
    while k < n:
        m = min(k, n - k)
        arr[k:k + m] = arr[:m]
        k += m
    return arr


def sample_idx(n):
    return np.unique(np.r_[np.arange(0, n, max(1, n // 4096)), n - 1]) if n else np.zeros(0, int)


# ---- timing across ranks ---------------------------------------------------------------------

def _calibrate(comm, MPI, op, target):
    """Calls per repeat so that one repeat takes about `target` seconds. The slowest rank's
    time decides (an allreduce of it), so every rank computes the same count."""
    n = 1
    while True:
        comm.Barrier()
        t0 = now_ns()
        for _ in range(n):
            op()
        el = comm.allreduce(now_ns() - t0, op=MPI.MAX)
        if el >= target * 1e9 / 8 or n >= 1 << 20:
            break
        n *= 2
    return max(1, int(n * target * 1e9 / max(el, 1)))


def timed(comm, MPI, ops, a):
    """Time several contenders on every rank together, interleaved: each repeat runs one batch
    of every contender in turn (a barrier before each), in an order rotated from repeat to
    repeat (common.rotated, the same on every rank), so a change in machine load hits all of
    them alike and none always runs after the same other one. `ops` is {name: (op, before)}: before() readies the buffers ahead of each
    batch, untimed. Returns {name: figures (seconds)}."""
    target = a.target_ms / 1e3
    calls, per_call, batch = {}, {}, {}
    for name, (op, before) in ops.items():
        if before:
            before()
        for _ in range(a.warmup):
            op()
        calls[name] = _calibrate(comm, MPI, op, target)
        per_call[name] = np.empty((a.repeats, calls[name]), np.int64)
        batch[name] = np.empty(a.repeats, np.int64)
    t = now_ns
    for r in range(a.repeats):
        for name, (op, before) in common.rotated(ops.items(), r):
            if before:
                before()
            row, n = per_call[name][r], calls[name]
            comm.Barrier()
            t0 = t()
            for i in range(n):
                s = t()
                op()
                row[i] = t() - s
            batch[name][r] = t() - t0
    out = {}
    for name in ops:
        n = calls[name]
        comm.Allreduce(MPI.IN_PLACE, per_call[name], op=MPI.MAX)
        comm.Allreduce(MPI.IN_PLACE, batch[name], op=MPI.MAX)
        lat = np.sort(per_call[name].ravel()) / 1e9
        out[name] = {"calls": n, "repeats": a.repeats,
                     "p50": float(np.percentile(lat, 50)), "p90": float(np.percentile(lat, 90)),
                     "p99": float(np.percentile(lat, 99)), "min": float(lat[0]),
                     "time_per_call": float(np.median(batch[name] / n)) / 1e9,
                     "time_per_call_repeats": [float(b) / n / 1e9 for b in batch[name]]}
    return out


# ---- contenders ------------------------------------------------------------------------------

class Gloo:
    """torch.distributed with the gloo backend on loopback; None if torch is not importable."""

    def __init__(self, comm, rank, size):
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        port = None
        if rank == 0:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            s.close()
        port = comm.bcast(port, root=0)
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=size)
        self.torch, self.dist = torch, dist
        self.version = torch.__version__
        t = torch.zeros(size * 2)
        try:
            dist.all_gather_into_tensor(t, torch.ones(2))
            self.into_tensor = True
        except (RuntimeError, AttributeError, NotImplementedError):
            self.into_tensor = False

    def allreduce(self, y):
        t = self.torch.from_numpy(y)
        return lambda: self.dist.all_reduce(t)

    def allgather(self, x, Y):
        tx, tY = self.torch.from_numpy(x), self.torch.from_numpy(Y)
        if self.into_tensor:
            return lambda: self.dist.all_gather_into_tensor(tY.view(-1), tx)
        rows = list(tY.unbind(0))
        return lambda: self.dist.all_gather(rows, tx)

    def close(self):
        self.dist.destroy_process_group()


def contenders(kind, a, collectives, comm, MPI, gloo, x, y, expect):
    """{name: (op, prepare)}: prepare() readies the buffers and returns a check() callable."""
    out = {}
    algos = [] if a.no_algorithms else collectives.algorithms.names(kind)
    if kind == "allreduce":
        sb, rb = [x, MPI.FLOAT], [y, MPI.FLOAT]
        for algo in ["auto"] + algos:
            name = "ours" if algo == "auto" else f"ours {algo}"
            out[name] = (lambda algo=algo: collectives.allreduce(x, out=y, algorithm=algo),
                         None)
        out["mpi"] = (lambda: comm.Allreduce(sb, rb, op=MPI.SUM), None)
        if gloo:
            def prep():
                np.copyto(y, x)       # in place: y holds this rank's input once
            out["gloo"] = (gloo.allreduce(y), prep)
    else:
        sb, rb = [x, MPI.FLOAT], [y, MPI.FLOAT]
        for algo in ["auto"] + algos:
            name = "ours" if algo == "auto" else f"ours {algo}"
            out[name] = (lambda algo=algo: collectives.allgather(x, out=y, algorithm=algo),
                         None)
        out["mpi"] = (lambda: comm.Allgather(sb, rb), None)
        if gloo:
            out["gloo"] = (gloo.allgather(x, y), None)
    return out


def check(kind, name, y, expect, size_):
    """The result against the exact answer, on a sample of positions."""
    if kind == "allreduce":
        idx = sample_idx(y.size)
        ok = np.array_equal(y[idx], expect(idx))
    else:
        idx = sample_idx(y.shape[1])
        ok = all(np.array_equal(y[r][idx], expect(idx) + r) for r in range(size_))
    if not ok:
        raise SystemExit(f"{kind} {name}: wrong result")


def run_kind(kind, a, collectives, comm, MPI, gloo, xfull, yfull, rank, size):
    res = {}
    for s in message_sizes(a.max_size):
        if kind == "allreduce":
            count = max(1, s // 4)
            x, y = xfull[:count], yfull[:count]
            fill_pattern(x)
            x *= rank + 1
            tot = size * (size + 1) / 2
            expect = lambda idx, tot=tot: ((idx % 7) / 8 * tot).astype(np.float32)  # noqa: E731
            nbytes = count * 4
        else:
            count = max(1, s // 4 // size)
            x, y = xfull[:count], yfull[:count * size].reshape(size, count)
            fill_pattern(x)
            x += rank
            expect = lambda idx: ((idx % 7) / 8).astype(np.float32)  # noqa: E731
            nbytes = count * 4 * size
        ops = contenders(kind, a, collectives, comm, MPI, gloo, x, y, expect)
        timing = {}
        for name, (op, prep) in ops.items():
            say(kind, human_size(s), name, "check")
            comm.Barrier()
            y.fill(-1)
            if prep:
                prep()
            op()
            check(kind, name, y, expect, size)
            # gloo sums in place: start each batch from zeros, whose repeated sums stay zero
            zero = (lambda: y.fill(0)) if name == "gloo" and kind == "allreduce" else None
            timing[name] = (op, zero)
        say(kind, human_size(s), "timing")
        res[s] = timed(comm, MPI, timing, a)
        for r in res[s].values():
            r["bytes"] = nbytes
            r["algbw"] = nbytes / r["time_per_call"] / 1e9
            r["busbw"] = r["algbw"] * busbw_factor(kind, size)
        comm.Barrier()
    return res


# ---- report ----------------------------------------------------------------------------------

def ratio(a, b):
    return a / b if b else float("nan")


def fmt(v):
    """3 significant digits, no exponent for the usual range."""
    if v != v:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}" if v >= 0.001 else f"{v:.1e}"


def report(kind, res, size):
    """Two tables (P50 latency, busbw), one column per contender, then ours/MPI and
    ours/gloo, and a summary of those ratios at >= 1 MiB (busbw) and <= 4 KiB (latency)."""
    sizes = sorted(res)
    names = list(res[sizes[0]])
    others = ["mpi"] + (["gloo"] if "gloo" in names else [])
    short = {k: k[5:] if k.startswith("ours ") else k for k in names}
    lines = [f"{kind}, float32 sum, {size} ranks"]
    for what, key, scale, unit, better in (
            ("P50 latency", "p50", 1e6, "us", "< 1 is better"),
            ("busbw (nccl-tests)", "busbw", 1.0, "GB/s", "> 1 is better")):
        rows = []
        for s in sizes:
            r = res[s]
            row = [human_size(s), r["ours"]["bytes"]] + [fmt(r[k][key] * scale) for k in names]
            row += [fmt(ratio(r["ours"][key], r[o][key])) for o in others]
            rows.append(row)
        heads = ["size", "bytes"] + [short[k] for k in names] + [f"ours/{o}" for o in others]
        lines += ["", f"{what}, {unit}; ratios {better}", common.format_table(heads, rows)]
    big = [s for s in sizes if s >= MiB]
    small = [s for s in sizes if s <= 4 * KiB]
    lines.append("")
    for other in others:
        if big:
            rs = [ratio(res[s]["ours"]["busbw"], res[s][other]["busbw"]) for s in big]
            lines.append(f"  >= 1 MiB, busbw ours/{other}: min {min(rs):.2f}, median "
                         f"{float(np.median(rs)):.2f}, max {max(rs):.2f}")
        if small:
            rs = [ratio(res[s]["ours"]["p50"], res[s][other]["p50"]) for s in small]
            lines.append(f"  <= 4 KiB, P50 latency ours/{other}: min {min(rs):.2f}, median "
                         f"{float(np.median(rs)):.2f}, max {max(rs):.2f}")
    return "\n".join(lines)


def main():
    a = parse()
    common.VERBOSE = a.verbose
    from mpi4py import MPI
    import collectives

    comm = MPI.COMM_WORLD
    w = collectives.init()
    rank, size = w.rank, w.size
    if comm.Get_size() != size or comm.Get_rank() != rank:
        raise SystemExit("run under mpiexec: mpiexec -n N python bench/collectives.py")
    gloo = None
    if a.gloo is not False:
        try:
            gloo = Gloo(comm, rank, size)
        except ImportError as e:
            if a.gloo:
                raise SystemExit(f"--gloo needs torch: {e}")
            if rank == 0:
                print(f"(gloo skipped: {e})", flush=True)
    load_start, t_start = os.getloadavg(), now_ns()
    # one pair of buffers for everything: every contender and size use views of them
    nmax = max(1, a.max_size // 4)
    xfull = common.touch(np.empty(nmax, np.float32), 0)
    yfull = common.touch(np.empty(nmax, np.float32), 0)
    results = {}
    for kind in a.kinds:
        results[kind] = run_kind(kind, a, collectives, comm, MPI, gloo, xfull, yfull, rank,
                                 size)
    load_end = os.getloadavg()
    if rank == 0:
        text = "\n\n".join(report(kind, results[kind], size) for kind in a.kinds)
        text += (f"\n\nmeasuring took {(now_ns() - t_start) / 1e9:.1f} s; load average "
                 f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at end, on "
                 f"{os.cpu_count()} CPUs; {size} ranks; repeats {a.repeats} of about "
                 f"{a.target_ms:.0f} ms")
        print(text, flush=True)
        desc = w.describe()
        info = common.machine_info(
            ranks=size, mpi_library=MPI.Get_library_version().splitlines()[0].strip(),
            mpi4py=__import__("mpi4py").__version__, torch=gloo.version if gloo else None,
            gloo_all_gather_into_tensor=gloo.into_tensor if gloo else None,
            kernels_isa=desc.get("kernels"), transports=desc.get("transports"),
            algorithms={k: collectives.algorithms.names(k) for k in a.kinds},
            loadavg_start=load_start, loadavg_end=load_end,
            env={k: v for k, v in os.environ.items()
                 if k.startswith(("POOLTENSOR_", "MPIR_CVAR_", "GLOO_", "OMP_"))})
        name = f"collectives-n{size}" + ("-quick" if a.quick else "")
        base = os.path.join(a.out, name)
        config = {k: v for k, v in vars(a).items() if k not in ("out", "verbose")}
        common.write_json(base + ".json", {
            "benchmark": "collectives", "config": config, "machine": info,
            "definitions": {"busbw": "nccl-tests: allreduce algbw*2(n-1)/n, allgather "
                                     "algbw*(n-1)/n", "bytes": "allreduce: input bytes; "
                                     "allgather: output bytes", "times": "seconds"},
            "results": {k: {str(s): v for s, v in results[k].items()} for k in a.kinds},
            "table": text})
        with open(base + ".txt", "w") as f:
            f.write(text + "\n")
        panels = []
        for kind in a.kinds:
            res = results[kind]
            sizes = sorted(res)
            names = list(res[sizes[0]])
            bytes_ = [res[s]["ours"]["bytes"] for s in sizes]
            panels.append((f"{kind} busbw ({size} ranks)", "busbw GB/s",
                           {k: (bytes_, [res[s][k]["busbw"] for s in sizes]) for k in names}))
            panels.append((f"{kind} P50 latency ({size} ranks)", "microseconds",
                           {k: (bytes_, [res[s][k]["p50"] * 1e6 for s in sizes])
                            for k in names}))
        common.plot_lines(base + ".png", f"float32 sum collectives, {size} ranks, one host "
                          f"({info['cpu_model']}, {info['cpu_count']} CPUs, load "
                          f"{load_start[0]:.1f})", panels)
        print(f"\nwrote {base}.{{json,txt,png}}", flush=True)
    comm.Barrier()
    if gloo:
        gloo.close()


if __name__ == "__main__":
    main()
