"""Collectives inside jax.jit: collectives.jax against mpi4jax, our eager path and mpi4py.

    mpiexec -n 2 python bench/jax.py [--quick] [--out DIR] [--repeats N] [--target-ms MS]
                                     [--min-bytes N]

float32 sum allreduce and allgather, 8 B .. 64 MiB (8 B times powers of 4, plus 1 MiB and
64 MiB; --quick stops at 4 MiB). Contenders, each one call at a time:

  jit       jax.jit(lambda x: collectives.jax.allreduce(x))(x).block_until_ready()
            (allgather alike): the XLA FFI handler, native team, no Python on the call
  jit x16   one program of 16 such calls, time / 16: the cost of a collective inside a
            program, without the cost of dispatching a program (JAX dispatches programs with
            ordered effects through Python: a few hundred us each on a loaded 2-core VM)
  mpi4jax   jax.jit(lambda x: mpi4jax.allreduce(x, op=MPI.SUM))(x).block_until_ready()
            (allgather alike), when `import mpi4jax` works (pip install mpi4jax; its build
            needs an MPI compiler: MPI4JAX_BUILD_MPICC=.venv/bin/mpicc)
  mpi4jax x16  the same 16 in a program: its "in program" time is compared with ours
            (busbw ratio), the two collectives without JAX's per-program dispatch
  eager     collectives.allreduce(x, out=y) on numpy arrays (allgather alike)
  mpi4py    Comm.Allreduce / Comm.Allgather on the same numpy arrays

Every jitted call runs one compiled program, so its time includes JAX's dispatch; the
difference jit - eager is what running inside jit costs over our eager path. A program with
an ordered effect (ours and mpi4jax's alike) is dispatched by JAX in Python, which costs far
more than the collective at small sizes, so "jit x16" (time / 16) still carries a sixteenth of
it. The column "in program" takes it out: per round, (16 * t(jit x16) - t(jit)) / 15, the
cost of one more collective inside a compiled program; "in-prog - eager" is what the handler
and XLA's custom call add over the eager path (aim <= 10 us).

Which path each call took: collectives.jax.stats() is read before and after each size's timed
rounds; "path" says "native" when every call finished in the C handler, else how many
went through Python. Sizes follow
nccl-tests (allreduce: bytes of x; allgather: bytes of the gathered result). For each size:
the programs are compiled; each contender's first call is timed alone ("cold": fresh output
memory, whose first touch is costly on this VM); then, after a warmup, the call count is
calibrated on rank 0 for about --target-ms per batch and shared, and --repeats rounds run one
batch of every contender in an order rotated from round to round, each batch after a barrier.
A batch's time is the maximum over ranks; per-call time = median over rounds of batch / calls.

  latency   per-call time (warm)             algbw   size / per-call time
  busbw     allreduce algbw * 2(n-1)/n, allgather algbw * (n-1)/n

Every contender's result is checked against the exact answer first. Prints the tables with
the ratios jit/mpi4jax (latency: < 1 is better; busbw: > 1 is better), jit - eager and
jit x16 - eager (us),
and writes DIR/jax-n<N>[-quick].{json,txt,png} (bench/common.py). The load average at start
and end is printed: the figures mean little on a machine other jobs are using.

Large messages: XLA allocates a program's output (and temporary) buffers afresh at each run,
so one big collective per program pays the first touch of fresh memory every call (64 MiB,
one rank: 140 ms a call against 35 ms with the setting below, here), and so does mpi4jax.
glibc serves allocations over its mmap threshold (adjusted up to 32 MiB by default) from
fresh mappings and returns freed heap memory over its trim threshold to the system; raising
both keeps XLA's buffers in the heap, warm:

    mpiexec -n 2 env MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824 \
        python bench/jax.py

The setting is printed with the figures and written to the JSON.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import MiB, human_size  # noqa: E402

# This file is itself named jax.py: take its folder off the path again, so that `import jax`
# finds JAX and not us.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.modules.pop("jax", None)
sys.path.append(os.path.dirname(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from mpi4py import MPI  # noqa: E402

import collectives  # noqa: E402
import collectives.jax as cj  # noqa: E402

KINDS = ("allreduce", "allgather")
LABEL = {"jit": "ours jit", "jit x16": "ours jit, 16 in a program", "eager": "ours eager",
         "mpi4jax": "mpi4jax", "mpi4jax x16": "mpi4jax, 16 in a program", "mpi4py": "mpi4py"}
IN_PROGRAM = 16


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="sizes up to 4 MiB only")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    p.add_argument("--repeats", type=int, default=7, help="rounds of batches per size")
    p.add_argument("--target-ms", type=float, default=60.0, help="time of one batch")
    p.add_argument("--min-bytes", type=int, default=0, help="skip sizes under this")
    p.add_argument("--verbose", action="store_true", help="progress on stderr")
    return p.parse_args()


def size_list(quick):
    out = sorted(set([8 * 4 ** k for k in range(13) if 8 * 4 ** k <= 64 * MiB]
                     + [1 * MiB, 64 * MiB]))
    return [s for s in out if not quick or s <= 4 * MiB]


def load():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def malloc_setting():
    """glibc's thresholds as set in the environment: with the defaults, every XLA buffer over
    32 MiB is a fresh mapping, and one collective per program pays its first touch each call."""
    keys = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    got = [f"{k}={os.environ[k]}" for k in keys if k in os.environ]
    return " ".join(got) or "glibc defaults"


class Bench:
    """The contenders of one kind and size, on one set of buffers."""

    def __init__(self, kind, nbytes, comm, mpi4jax):
        self.kind, self.comm = kind, comm
        n = comm.Get_size()
        r = comm.Get_rank()
        count = max(1, nbytes // 4 // (n if kind == "allgather" else 1))
        self.x = (np.arange(count, dtype=np.float32) % 64 / 8 + r).astype(np.float32)
        self.xj = jnp.asarray(self.x)
        out_shape = (n, count) if kind == "allgather" else (count,)
        self.y = np.empty(out_shape, np.float32)
        self.nbytes = count * 4 * (n if kind == "allgather" else 1)
        if kind == "allreduce":
            self.want = sum((np.arange(count, dtype=np.float32) % 64 / 8 + q) for q in range(n))
            f = jax.jit(lambda x: cj.allreduce(x))
            self.ops = {"jit": lambda: f(self.xj).block_until_ready(),
                        "eager": lambda: collectives.allreduce(self.x, out=self.y),
                        "mpi4py": lambda: comm.Allreduce(self.x, self.y, MPI.SUM)}
            if mpi4jax is not None:
                g = jax.jit(lambda x: mpi4jax.allreduce(x, op=MPI.SUM, comm=comm))
                self.ops["mpi4jax"] = lambda: _first(g(self.xj)).block_until_ready()
        else:
            self.want = np.stack([np.arange(count, dtype=np.float32) % 64 / 8 + q
                                  for q in range(n)])
            f = jax.jit(lambda x: cj.allgather(x))
            self.ops = {"jit": lambda: f(self.xj).block_until_ready(),
                        "eager": lambda: collectives.allgather(self.x, out=self.y),
                        "mpi4py": lambda: comm.Allgather(self.x, self.y)}
            if mpi4jax is not None:
                g = jax.jit(lambda x: mpi4jax.allgather(x, comm=comm))
                self.ops["mpi4jax"] = lambda: _first(g(self.xj)).block_until_ready()
        # the same collective 16 times in one program: the per-collective cost without the
        # per-program dispatch (JAX dispatches programs with ordered effects in Python)
        one = cj.allreduce if kind == "allreduce" else cj.allgather
        f16 = jax.jit(lambda x: [one(x) for _ in range(IN_PROGRAM)][-1])
        self.ops["jit x16"] = lambda: f16(self.xj).block_until_ready()
        self.results = {"jit": lambda: f(self.xj), "jit x16": lambda: f16(self.xj),
                        "eager": lambda: self.y,
                        "mpi4py": lambda: self.y}
        if mpi4jax is not None:
            self.results["mpi4jax"] = lambda: _first(g(self.xj))
            # mpi4jax's 16 in a program too, so that "in program" compares like with like
            if kind == "allreduce":
                def m1(x):
                    return mpi4jax.allreduce(x, op=MPI.SUM, comm=comm)
            else:
                def m1(x):
                    return mpi4jax.allgather(x, comm=comm)
            g16 = jax.jit(lambda x: [_first(m1(x)) for _ in range(IN_PROGRAM)][-1])
            self.ops["mpi4jax x16"] = lambda: g16(self.xj).block_until_ready()
            self.results["mpi4jax x16"] = lambda: g16(self.xj)

    def check_and_cold(self):
        """Time each contender's first call on fresh buffers (programs compiled beforehand on
        scratch buffers of the same shape), then check its result."""
        x, y = self.x, self.y
        self.x, self.xj, self.y = x.copy(), jnp.asarray(x.copy()), np.empty_like(y)
        for op in self.ops.values():       # compiles
            op()
        self.x, self.xj, self.y = x, jnp.asarray(x), y     # fresh: y never touched yet
        cold = {}
        for name, op in self.ops.items():
            self.comm.Barrier()
            t = time.perf_counter()
            op()
            cold[name] = self.comm.allreduce(time.perf_counter() - t, MPI.MAX) / (
                IN_PROGRAM if name == "jit x16" else 1)
            got = np.asarray(self.results[name]())
            if got.shape != self.want.shape or not np.array_equal(got, self.want):
                raise SystemExit(f"{name} {self.kind} of {self.nbytes} B: wrong result")
        return cold

    def timed(self, repeats, target_s):
        comm = self.comm
        for op in self.ops.values():
            for _ in range(3):
                op()
        calls = {}
        for name, op in self.ops.items():      # every rank calls; the slowest decides
            comm.Barrier()
            t = time.perf_counter()
            for _ in range(3):
                op()
            one = comm.allreduce(max(time.perf_counter() - t, 1e-7) / 3, MPI.MAX)
            calls[name] = int(min(max(3, target_s / one), 20000))
        per = {name: [] for name in self.ops}
        before = cj.stats()
        for r in range(repeats):
            for name, op in common.rotated(self.ops.items(), r):
                n = calls[name]
                comm.Barrier()
                t = time.perf_counter()
                for _ in range(n):
                    op()
                el = comm.allreduce(time.perf_counter() - t, MPI.MAX)
                per[name].append(el / n / (IN_PROGRAM if name.endswith("x16") else 1))
        after = cj.stats()
        per["in program"] = [(IN_PROGRAM * m - o) / (IN_PROGRAM - 1)
                             for m, o in zip(per["jit x16"], per["jit"])]
        if "mpi4jax x16" in per:
            per["mpi4jax in program"] = [(IN_PROGRAM * m - o) / (IN_PROGRAM - 1)
                                         for m, o in zip(per["mpi4jax x16"], per["mpi4jax"])]
        path = {"fast": after["fast"] - before["fast"], "slow": after["slow"] - before["slow"]}
        return {name: statistics.median(v) for name, v in per.items()}, per, path


def _first(res):
    return res[0] if isinstance(res, (tuple, list)) else res


def main():
    args = parse()
    comm = MPI.COMM_WORLD
    world = collectives.init()
    n, rank = world.size, world.rank
    try:
        import mpi4jax
    except Exception as e:           # not installed, or built against another JAX
        mpi4jax = None
        if rank == 0:
            print(f"mpi4jax not usable here ({type(e).__name__}: {e}); comparing with our "
                  f"eager path and mpi4py only", file=sys.stderr, flush=True)
    load0 = load()
    rows = {kind: [] for kind in KINDS}
    for kind in KINDS:
        for nbytes in [s for s in size_list(args.quick) if s >= args.min_bytes]:
            b = Bench(kind, nbytes, comm, mpi4jax)
            cold = b.check_and_cold()
            warm, per, path = b.timed(args.repeats, args.target_ms / 1e3)
            busf = 2 * (n - 1) / n if kind == "allreduce" else (n - 1) / n
            row = {"bytes": b.nbytes, "cold_s": cold, "per_call_s": warm, "repeats_s": per,
                   "path": path,
                   "busbw_gbps": {k: b.nbytes / v * busf / 1e9 if n > 1 else float("nan")
                                  for k, v in warm.items()}}
            rows[kind].append(row)
            if rank == 0 and args.verbose:
                print(f"{kind} {human_size(b.nbytes)}: " + ", ".join(
                    f"{k} {v * 1e6:.1f} us" for k, v in warm.items()), file=sys.stderr,
                    flush=True)
    load1 = load()
    if rank == 0:
        report(args, rows, n, mpi4jax is not None, load0, load1)
    collectives.finalize()


def report(args, rows, n, have_mpi4jax, load0, load1):
    names = ["jit", "jit x16", "mpi4jax", "mpi4jax x16", "eager", "mpi4py"] if have_mpi4jax else \
        ["jit", "jit x16", "eager", "mpi4py"]
    lines = [f"collectives inside jax.jit, float32 sum, {n} ranks, one host; load average "
             f"{load0:.2f} at start, {load1:.2f} at end; malloc: {malloc_setting()}"]
    for kind in KINDS:
        head = ["size"] + [f"{k} us" for k in names] + [f"{k} busbw GB/s" for k in names]
        head += (["jit/mpi4jax lat", "jit/mpi4jax busbw", "mpi4jax in program us",
                  "in program busbw ours/mpi4jax"] if have_mpi4jax else []) + \
            ["jit-eager us", "x16-eager us", "in program us", "in-prog - eager us",
             "jit cold us", "path"]
        table = []
        for row in rows[kind]:
            w, bw = row["per_call_s"], row["busbw_gbps"]
            line = [human_size(row["bytes"])] + [f"{w[k] * 1e6:.1f}" for k in names]
            line += [f"{bw[k]:.2f}" for k in names]
            if have_mpi4jax:
                rs = row['repeats_s']
                line += [f"{common.median_ratio(rs['jit'], rs['mpi4jax']):.2f}",
                         f"{common.median_ratio(rs['mpi4jax'], rs['jit']):.2f}",
                         f"{w['mpi4jax in program'] * 1e6:.1f}",
                         f"{common.median_ratio(rs['mpi4jax in program'], rs['in program']):.2f}"]
            line += [f"{(w['jit'] - w['eager']) * 1e6:.1f}",
                     f"{(w['jit x16'] - w['eager']) * 1e6:.1f}",
                     f"{w['in program'] * 1e6:.1f}",
                     f"{common.median_diff(row['repeats_s']['in program'], row['repeats_s']['eager']) * 1e6:.1f}",
                     f"{row['cold_s']['jit'] * 1e6:.0f}",
                     "native" if not row["path"]["slow"] else f"python {row['path']['slow']}"]
            table.append(line)
        lines += ["", kind, common.format_table(head, table)]
    text = "\n".join(lines)
    print(text, flush=True)
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"jax-n{n}" + ("-quick" if args.quick else ""))
    with open(base + ".txt", "w") as f:
        f.write(text + "\n")
    common.write_json(base + ".json", {"machine": common.machine_info(ranks=n),
                                       "load": [load0, load1], "malloc": malloc_setting(),
                                       "results": rows})
    panels = []
    for kind in KINDS:
        xs = [r["bytes"] for r in rows[kind]]
        panels.append((f"{kind}: per-call time", "us",
                       {LABEL[k]: (xs, [r["per_call_s"][k] * 1e6 for r in rows[kind]])
                        for k in names}))
        if n > 1:          # one rank moves no bytes between ranks: no busbw
            panels.append((f"{kind}: busbw", "GB/s",
                           {LABEL[k]: (xs, [r["busbw_gbps"][k] for r in rows[kind]])
                            for k in names}))
    common.plot_lines(base + ".png", f"collectives inside jax.jit, {n} ranks", panels)
    print(f"wrote {base}.json, .txt and .png", flush=True)


if __name__ == "__main__":
    main()
