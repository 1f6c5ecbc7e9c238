"""One-sided get/put: our windows against MPI RMA (mpi4py) and a local memcpy.

    mpiexec -n 2 python bench/rma.py [--quick] [--out DIR]

Rank 0 reads and writes rank 1's memory; rank 1 takes no part in the transfers (it sleeps in
a barrier while rank 0 measures). Three things are measured in one run:

  ours     collectives Window.get / put (blocking), and get_async in chunks, on memory that
           rank 1 exposed with world.expose(nbytes)
  mpi      MPI.Win.Allocate + Lock_all; Get (or Put) + Flush(1) per operation; Unlock_all
  memcpy   np.copyto between two local arrays of the same size (both touched beforehand)

and, as a reference for reading the large sizes, "shm memcpy": np.copyto from a local
shared-memory segment (world.alloc, the kind of memory a window serves) into a local array.
numpy asks for transparent huge pages for big arrays; shared memory gets them only where
/sys/kernel/mm/transparent_hugepage/shmem_enabled allows, so past the caches this shows what
the page size alone costs any same-host transport (ours and MPI's alike).

For each: 8-byte latency (P50/P99 of single timed calls, after a warmup) and bandwidth for each
size, once re-copying the same range (cache-hot where it fits) and once streaming (a call
sweeps the whole window in pieces of the size, so the data comes from memory, as when the
pool faults slabs in). Calls per batch are calibrated to about --target-ms; the median of
--repeats repeats is reported. The contenders are interleaved (each repeat runs one batch of
each, in a rotating order) so that a change in machine load hits all of them alike, and
ratios are medians of per-repeat ratios. Prints the tables, and writes DIR/rma[-quick].json
(every figure plus the machine), .txt (the tables) and .png (bandwidth against size, latency
bars).

How rank 1 stays passive under MPI too: with the MPICH wheel, Get/Put/Flush on a window from
Win.Allocate complete without the target, but taking the lock (Lock_all, then the first
operation) and Unlock_all wait for the target to make MPI progress; a target asleep outside
MPI hangs them. So rank 0 locks and does one Get+Flush while rank 1 is still in an
MPI_Barrier, rank 1 then sleeps in our barrier while rank 0 measures, and goes back into
MPI_Barrier only when rank 0 is done, so the unlock can finish.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
# bench/ is sys.path[0] when this runs as a script; take it off the path once common is
# imported, so that a module in bench/ (bench/collectives.py) cannot shadow the package.
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import KiB, MiB, human_size, say  # noqa: E402

sys.path.remove(HERE)
sys.path.append(os.path.dirname(HERE))  # the repo, if collectives is neither installed nor on PYTHONPATH

LONG = 3600.0  # the passive rank waits at most this long in a barrier


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--native", choices=("posix",), default=None,
                   help="run without mpiexec: the posix build against the linux build, "
                        "interleaved (bench/native.py)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and shorter runs (< 20 s)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    p.add_argument("--min-size", type=int, default=4 * KiB)
    p.add_argument("--max-size", type=int, default=None, help="default 64 MiB (quick: 16 MiB)")
    p.add_argument("--iters", type=int, default=None, help="latency samples (default 20000)")
    p.add_argument("--target-ms", type=float, default=None, help="time per batch (default 40)")
    p.add_argument("--repeats", type=int, default=None, help="repeats per size (default 11)")
    p.add_argument("--chunk", type=int, default=1 * MiB, help="get_async chunk size")
    p.add_argument("-v", "--verbose", action="store_true", help="say what is measured, on stderr")
    a = p.parse_args()
    if a.native:
        sys.path.insert(0, HERE)
        import native
        native.compare("rma")
        raise SystemExit(0)
    if a.quick:
        a.max_size = a.max_size or 16 * MiB
        a.iters = a.iters or 4000
        a.target_ms = a.target_ms or 25
        a.repeats = a.repeats or 5
        a.factor = 4
    else:
        a.max_size = a.max_size or 64 * MiB
        a.iters = a.iters or 20000
        a.target_ms = a.target_ms or 40
        a.repeats = a.repeats or 11
        a.factor = 2
    return a


def pattern(n):
    return (np.arange(n, dtype=np.uint32) % 251).astype(np.uint8)


def measure(a, MPI, win, mwin, shm, sizes, expect):
    """Rank 0's part: latency, then bandwidth per size, ours / MPI / memcpy interleaved."""
    B = MPI.BYTE
    get, put = win.get, win.put
    Get, Put, Flush = mwin.Get, mwin.Put, mwin.Flush
    last = a.max_size - 64  # 8-byte puts go here, out of the way of the bytes checked

    def flushed(op, buf, target):
        """op(buf, 1, target) then Flush(1): one MPI RMA call completed at rank 1, the unit
        timed against ours."""
        def call():
            op(buf, 1, target)
            Flush(1)
        return call

    out8, src8 = np.zeros(8, np.uint8), np.full(8, 5, np.uint8)
    o8, s8, t8g, t8p = [out8, B], [src8, B], (0, 8, B), (last, 8, B)
    mpi_get8, mpi_put8 = flushed(Get, o8, t8g), flushed(Put, s8, t8p)
    say("latency")
    lat = common.latencies({
        "ours get": lambda: get(1, 0, out8), "mpi get": mpi_get8,
        "ours put": lambda: put(1, last, src8), "mpi put": mpi_put8}, a.iters)

    dst = common.touch(np.empty(a.max_size, np.uint8), 0)
    get(1, 0, dst)
    if not np.array_equal(dst[:last], expect[:last]):
        raise SystemExit("ours: get returned wrong bytes")
    dst.fill(0)
    Get([dst, B], 1, (0, a.max_size, B))
    Flush(1)
    if not np.array_equal(dst[:last], expect[:last]):
        raise SystemExit("mpi: Get returned wrong bytes")
    src = common.touch(np.empty(a.max_size, np.uint8), 7)

    bw = {}
    for s in sizes:
        say("bandwidth", human_size(s))
        d, sv = dst[:s], src[:s]
        md, ms, mt = [d, B], [sv, B], (0, s, B)
        msrc = common.touch(np.empty(s, np.uint8), 3)   # memcpy: fresh buffers of this size
        mdst = common.touch(np.empty(s, np.uint8), 0)
        c = min(s, a.chunk)
        parts = [(o, d[o:o + c]) for o in range(0, s, c)]
        mpi_get, mpi_put = flushed(Get, md, mt), flushed(Put, ms, mt)

        def ours_async():
            reqs = [win.get_async(1, o, v) for o, v in parts]
            for r in reqs:
                r.wait()
        bw[s] = common.bandwidths({
            "memcpy": lambda: np.copyto(mdst, msrc),
            "shm memcpy": lambda: np.copyto(mdst, shm[:s]),
            "ours get": lambda: get(1, 0, d), "mpi get": mpi_get,
            "ours put": lambda: put(1, 0, sv), "mpi put": mpi_put,
            "ours get_async": ours_async}, s, a.target_ms / 1e3, a.repeats)
        bw[s]["ours get_async"]["chunk"] = c
        del msrc, mdst

    # Streaming: one call sweeps the whole window in pieces of the size, so the data comes
    # from memory rather than the caches (how the pool faults slabs in); memcpy sweeps a local
    # array of the same length the same way.
    st = {}
    for s in sizes:
        say("streaming", human_size(s))
        pieces = [(o, dst[o:o + s], src[o:o + s]) for o in range(0, a.max_size - s + 1, s)]
        swept = len(pieces) * s

        def ours_stream():
            for o, d, _ in pieces:
                get(1, o, d)

        def mpi_stream():
            for o, d, _ in pieces:
                Get([d, B], 1, (o, s, B))
                Flush(1)

        def memcpy_stream():
            for _, d, sv in pieces:
                np.copyto(d, sv)
        st[s] = common.bandwidths({"memcpy": memcpy_stream, "ours get": ours_stream,
                                   "mpi get": mpi_stream}, swept, a.target_ms / 1e3, a.repeats)
    return lat, bw, st


def report(a, sizes, lat, bw, st, timer_ns):
    g = lambda s, k: bw[s][k]["gbps"]  # noqa: E731
    r = lambda s, x, y: common.paired_ratio(bw[s][x], bw[s][y])  # noqa: E731
    rows = []
    for s in sizes:
        rows.append([human_size(s), g(s, "ours get"), g(s, "mpi get"), g(s, "memcpy"),
                     r(s, "ours get", "memcpy"), r(s, "ours get", "mpi get"),
                     g(s, "ours put"), g(s, "mpi put"),
                     r(s, "ours put", "memcpy"), r(s, "ours put", "mpi put"),
                     g(s, "ours get_async"), g(s, "shm memcpy")])
    lines = ["bandwidth, GB/s (1e9 bytes/s), median of repeats; ratios (ours/memcpy, ours/MPI) "
             "are medians of the per-repeat ratios; 'shm mcpy' = np.copyto from a local "
             "shared-memory segment",
             common.format_table(["size", "get", "MPI get", "memcpy", "get/mcpy", "get/MPI",
                                  "put", "MPI put", "put/mcpy", "put/MPI", "get_async",
                                  "shm mcpy"], rows),
             ""]
    rows = []
    for s in sizes:
        x = st[s]
        rows.append([human_size(s), x["ours get"]["gbps"], x["mpi get"]["gbps"],
                     x["memcpy"]["gbps"], common.paired_ratio(x["ours get"], x["memcpy"]),
                     common.paired_ratio(x["ours get"], x["mpi get"])])
    lines += [f"streaming get, GB/s: each call sweeps {human_size(a.max_size)} in pieces of the "
              f"size (data from memory, not cache); memcpy sweeps a local array alike",
              common.format_table(["piece", "get", "MPI get", "memcpy", "get/mcpy", "get/MPI"],
                                  rows), ""]
    rows = []
    for op in ("get", "put"):
        o, m = lat[f"ours {op}"], lat[f"mpi {op}"]
        rows.append([f"8 B {op}", o["p50"] / 1e3, m["p50"] / 1e3, o["p50"] / m["p50"],
                     o["p99"] / 1e3, m["p99"] / 1e3, o["p99"] / m["p99"],
                     o["loop_mean"] / 1e3, m["loop_mean"] / 1e3])
    lines.append(f"latency, microseconds: {a.iters} single timed calls after warmup (a timer "
                 f"pair costs {timer_ns:.0f} ns, included); 'loop' = mean of an untimed loop; "
                 f"ratio = ours/MPI, lower is better")
    lines.append(common.format_table(["op", "ours P50", "MPI P50", "ratio", "ours P99",
                                      "MPI P99", "ratio", "ours loop", "MPI loop"], rows))
    big = [s for s in sizes if s >= MiB]
    if big:
        pairs = (("get", "memcpy"), ("get", "mpi get"), ("put", "memcpy"), ("put", "mpi put"))
        worst = {k: min(r(s, f"ours {k[0]}", k[1]) for s in big) for k in pairs}
        mean = {k: common.geomean(r(s, f"ours {k[0]}", k[1]) for s in big) for k in pairs}
        name = lambda k: f"{k[0]}/{k[1].split()[0]}"  # noqa: E731
        lines += ["", "at >= 1 MiB, ratios (aims: >= 0.90 of memcpy, >= 1.00 of MPI):",
                  "  worst size: " + "  ".join(f"{name(k)} {v:.2f}" for k, v in worst.items()),
                  "  geo. mean:  " + "  ".join(f"{name(k)} {v:.2f}" for k, v in mean.items())]
    lines.append(f"8-byte get ours/MPI: P50 {lat['ours get']['p50'] / lat['mpi get']['p50']:.2f}"
                 f", P99 {lat['ours get']['p99'] / lat['mpi get']['p99']:.2f} (aim: <= 1.00)")
    return "\n".join(lines)


def main():
    a = parse()
    common.VERBOSE = a.verbose
    import collectives
    from mpi4py import MPI

    w = collectives.init()
    comm = MPI.COMM_WORLD
    if w.size != 2 or comm.Get_size() != 2:
        raise SystemExit("run with exactly 2 ranks: mpiexec -n 2 python bench/rma.py")
    rank = w.rank
    sizes = common.sizes(a.min_size, a.max_size, a.factor)
    expect = pattern(a.max_size)
    load_start, t_start = os.getloadavg(), common.now_ns()

    # Both windows at once (collective calls in the same order on both ranks).
    say("expose + Win.Allocate")
    win = w.expose(a.max_size if rank == 1 else 64)
    mwin = MPI.Win.Allocate(a.max_size if rank == 1 else 64, 1, comm=comm)
    if rank == 1:
        win.buffer[:] = expect
        np.frombuffer(mwin.tomemory(), np.uint8)[:] = expect
    comm.Barrier()
    w.barrier()
    lat = bw = st = None
    if rank == 0:
        mwin.Lock_all()
        probe = np.zeros(8, np.uint8)
        mwin.Get([probe, MPI.BYTE], 1, (0, 8, MPI.BYTE))  # the lock is really taken here,
        mwin.Flush(1)                                      # while rank 1 still runs MPI
        comm.Barrier()
        shm = common.touch(w.alloc(a.max_size), 3)  # local shared memory, 4 KiB pages or not
        lat, bw, st = measure(a, MPI, win, mwin, shm, sizes, expect)
        w.barrier(timeout=LONG)  # rank 1 goes back into MPI, which Unlock_all needs
        mwin.Unlock_all()
    else:
        comm.Barrier()
        w.barrier(timeout=LONG)  # passive: asleep while rank 0 measures
    comm.Barrier()
    say("Free + close")
    mwin.Free()
    win.close()

    if rank == 0:
        timer_ns = common.timer_overhead_ns()
        load_end = os.getloadavg()
        text = report(a, sizes, lat, bw, st, timer_ns)
        text += (f"\n\nmeasuring took {(common.now_ns() - t_start) / 1e9:.1f} s; load average "
                 f"{load_start[0]:.2f} at start, {load_end[0]:.2f} at end, on "
                 f"{os.cpu_count()} CPUs")
        print(text, flush=True)
        desc = w.describe()
        info = common.machine_info(
            mpi_library=MPI.Get_library_version().splitlines()[0].strip(),
            mpi4py=__import__("mpi4py").__version__,
            kernels_isa=desc.get("kernels"), transports=desc.get("transports"),
            bootstrap=desc.get("bootstrap"), collectives_path=collectives.__file__,
            timer_pair_ns=timer_ns, loadavg_start=load_start, loadavg_end=load_end,
            env={k: v for k, v in os.environ.items()
                 if k.startswith(("POOLTENSOR_", "MPIR_CVAR_", "UCX_", "FI_"))})
        name = "rma-quick" if a.quick else "rma"
        os.makedirs(a.out, exist_ok=True)
        config = {k: v for k, v in vars(a).items() if k not in ("out", "verbose")}
        series = {k: {str(s): bw[s][k] for s in sizes} for k in bw[sizes[0]]}
        common.write_json(os.path.join(a.out, name + ".json"), {
            "benchmark": "rma", "config": config, "machine": info, "sizes": sizes,
            "latency_ns": lat, "bandwidth": series,
            "streaming": {k: {str(s): st[s][k] for s in sizes} for k in st[sizes[0]]},
            "table": text})
        with open(os.path.join(a.out, name + ".txt"), "w") as f:
            f.write(text + "\n")
        label = {"ours get": "ours get", "ours put": "ours put",
                 "ours get_async": f"ours get_async ({human_size(a.chunk)} chunks)",
                 "mpi get": "MPI Get+Flush", "mpi put": "MPI Put+Flush",
                 "memcpy": "memcpy (np.copyto)",
                 "shm memcpy": "memcpy from a shm segment"}
        common.plot_bandwidth_and_latency(
            os.path.join(a.out, name + ".png"),
            f"one-sided get/put, rank 0 -> rank 1, same host ({info['cpu_model']}, "
            f"{info['cpu_count']} CPUs)",
            [("bandwidth, same range again and again (cache-hot where it fits)",
              {label[k]: (sizes, [bw[s][k]["gbps"] for s in sizes]) for k in label}),
             (f"streaming get: {human_size(a.max_size)} swept in pieces of the size",
              {label[k]: (sizes, [st[s][k]["gbps"] for s in sizes])
               for k in ("ours get", "mpi get", "memcpy")})],
            {"ours get": lat["ours get"], "MPI get": lat["mpi get"],
             "ours put": lat["ours put"], "MPI put": lat["mpi put"]})
        print(f"\nwrote {os.path.join(a.out, name)}.{{json,txt,png}}", flush=True)
    w.barrier(timeout=LONG)


if __name__ == "__main__":
    main()
