"""One-sided get/put over verbs against tcp to the same peer, in one run (the tables of
bench/rma.py).

    POOLTENSOR_TRANSPORT=verbs python -m collectives.launch -n 2 bench/verbs.py [--quick]
    (or two machines with RDMA: any bootstrap, 2 ranks, POOLTENSOR_TRANSPORT=verbs)

Rank 0 reads and writes rank 1's memory; rank 1 takes no part (it sleeps in a barrier).
Contenders, interleaved in every repeat so that a change of load hits all alike:

  verbs    Window.get / put on memory rank 1 exposed, over the world's verbs transport
  tcp      the same memory, registered with a second native context that rank 1 serves over
           tcp (authenticated as the world's own tcp): what pooltensor uses without verbs
  memcpy   np.copyto between two local arrays of the size

8-byte latency (P50/P99 of single timed calls) and bandwidth per size; ratios are medians of
per-repeat ratios. Beside the results: what hardware should give (Thunderbolt 5 UC SEND about
4 us at 64 B and 3.5-7.6 GB/s, MLX JACCL and torch TCCL figures; RC WRITE on 100 GbE RoCE near
11 GB/s). On the simulated provider of the tests (tests/fakeverbs) the run only shows that it
works: its figures say nothing about hardware, and the output says so. Writes
DIR/verbs[-quick].{json,txt,png}.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import KiB, MiB, human_size, say  # noqa: E402

sys.path.remove(HERE)
sys.path.append(os.path.dirname(HERE))

LONG = 3600.0
TARGETS = ("hardware targets: Thunderbolt 5 UC SEND ~4 us at 64 B, 3.5-7.6 GB/s (MLX JACCL, "
           "torch TCCL); RC WRITE on 100 GbE RoCE ~11 GB/s")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer sizes and shorter runs")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    p.add_argument("--min-size", type=int, default=4 * KiB)
    p.add_argument("--max-size", type=int, default=None, help="default 64 MiB (quick: 4 MiB)")
    p.add_argument("--iters", type=int, default=None, help="latency samples (default 20000)")
    p.add_argument("--repeats", type=int, default=None, help="repeats per size (default 11)")
    p.add_argument("-v", "--verbose", action="store_true", help="say what is measured")
    a = p.parse_args()
    a.max_size = a.max_size or (4 * MiB if a.quick else 64 * MiB)
    a.iters = a.iters or (2000 if a.quick else 20000)
    a.repeats = a.repeats or (3 if a.quick else 11)
    a.target_ms = 20 if a.quick else 40
    a.factor = 4 if a.quick else 2
    return a


def tcp_side(w, buf):
    """A second native context reaching rank 1's `buf` over tcp: (ctx, key on rank 1)."""
    from collectives import _native
    ctx = _native.Context(w.rank, w.size, 1)
    ctx.set_secret(w._boot.secret(w.timeout))
    ctx.set_timeout(w.timeout)
    port = ctx.listen("127.0.0.1", 0)
    key = ctx.register(buf, 3) if w.rank == 1 else 0
    eps = w.allgather_object([port, key])
    peer = 1 - w.rank
    ctx.connect_tcp(peer, "127.0.0.1", eps[peer][0])
    ctx.tcp_open(peer)
    return ctx, eps[1][1]


def main():
    a = parse()
    common.VERBOSE = a.verbose
    import collectives
    from collectives.transport import verbs as vb
    w = collectives.init()
    if w.size != 2:
        raise SystemExit("run with exactly 2 ranks")
    if w.describe()["transports"][1 - w.rank] != "verbs":
        raise SystemExit(f"rank {1 - w.rank} is not reached over verbs "
                         f"(POOLTENSOR_TRANSPORT=verbs?): {w.describe()['verbs']}")
    info = vb.probe()
    simulated = any(str(d.get("fw", "")).startswith("fakeverbs") for d in info["devices"])
    sizes = common.sizes(a.min_size, a.max_size, a.factor)
    win = w.expose(a.max_size if w.rank == 1 else 64)
    if w.rank == 1:
        win.buffer[:] = (np.arange(a.max_size) % 251).astype(np.uint8)
    ctx, key = tcp_side(w, win.buffer if w.rank == 1 else np.zeros(64, np.uint8))
    w.barrier()
    if w.rank == 0:
        out8, src8, last = np.zeros(8, np.uint8), np.full(8, 5, np.uint8), a.max_size - 64
        say("latency")
        lat = common.latencies({
            "verbs get": lambda: win.get(1, 0, out8), "tcp get": lambda: ctx.get(1, key, 0, out8),
            "verbs put": lambda: win.put(1, last, src8),
            "tcp put": lambda: ctx.put(1, key, last, src8)}, a.iters, warmup=200)
        dst = common.touch(np.empty(a.max_size, np.uint8), 0)
        src = common.touch(np.empty(a.max_size, np.uint8), 7)
        bw = {}
        for s in sizes:
            say("bandwidth", human_size(s))
            d, sv = dst[:s], src[:s]
            m1, m2 = common.touch(np.empty(s, np.uint8), 3), common.touch(np.empty(s, np.uint8), 0)
            bw[s] = common.bandwidths({
                "memcpy": lambda: np.copyto(m2, m1),
                "verbs get": lambda: win.get(1, 0, d), "tcp get": lambda: ctx.get(1, key, 0, d),
                "verbs put": lambda: win.put(1, 0, sv),
                "tcp put": lambda: ctx.put(1, key, 0, sv)}, s, a.target_ms / 1e3, a.repeats)
        w.barrier(timeout=LONG)
        report(a, w, sizes, lat, bw, info, simulated)
    else:
        w.barrier(timeout=LONG)
    w.barrier(timeout=LONG)
    ctx.close()


def report(a, w, sizes, lat, bw, info, simulated):
    r = lambda s, x, y: common.paired_ratio(bw[s][x], bw[s][y])  # noqa: E731
    rows = [[human_size(s), bw[s]["verbs get"]["gbps"], bw[s]["tcp get"]["gbps"],
             r(s, "verbs get", "tcp get"), bw[s]["verbs put"]["gbps"], bw[s]["tcp put"]["gbps"],
             r(s, "verbs put", "tcp put"), bw[s]["memcpy"]["gbps"]] for s in sizes]
    lines = []
    if simulated:
        lines += ["SIMULATED PROVIDER (tests/fakeverbs): these figures say nothing about RDMA "
                  "hardware; this run only shows that the benchmark works.", ""]
    lines += [f"verbs: {w.describe()['verbs']}",
              "bandwidth, GB/s, median of repeats; ratios verbs/tcp are medians of per-repeat "
              "ratios",
              common.format_table(["size", "verbs get", "tcp get", "ratio", "verbs put",
                                   "tcp put", "ratio", "memcpy"], rows), ""]
    rows = [[f"8 B {op}", lat[f"verbs {op}"]["p50"] / 1e3, lat[f"tcp {op}"]["p50"] / 1e3,
             lat[f"verbs {op}"]["p50"] / lat[f"tcp {op}"]["p50"], lat[f"verbs {op}"]["p99"] / 1e3,
             lat[f"tcp {op}"]["p99"] / 1e3] for op in ("get", "put")]
    lines += [f"latency, microseconds ({a.iters} timed calls); ratio = verbs/tcp, lower is better",
              common.format_table(["op", "verbs P50", "tcp P50", "ratio", "verbs P99",
                                   "tcp P99"], rows), "", TARGETS]
    text = "\n".join(lines)
    print(text, flush=True)
    name = "verbs-quick" if a.quick else "verbs"
    os.makedirs(a.out, exist_ok=True)
    machine = common.machine_info(verbs=info, simulated=simulated,
                                  transports=w.describe()["transports"])
    common.write_json(os.path.join(a.out, name + ".json"), {
        "benchmark": "verbs", "config": {k: v for k, v in vars(a).items() if k != "out"},
        "machine": machine, "sizes": sizes, "latency_ns": lat,
        "bandwidth": {k: {str(s): bw[s][k] for s in sizes} for k in bw[sizes[0]]},
        "table": text})
    with open(os.path.join(a.out, name + ".txt"), "w") as f:
        f.write(text + "\n")
    title = "one-sided get/put over verbs and tcp" + (" (SIMULATED provider)" if simulated else "")
    common.plot_bandwidth_and_latency(
        os.path.join(a.out, name + ".png"), title,
        [("bandwidth", {k: (sizes, [bw[s][k]["gbps"] for s in sizes]) for k in bw[sizes[0]]})],
        {k: lat[k] for k in lat})
    print(f"\nwrote {os.path.join(a.out, name)}.{{json,txt,png}}", flush=True)


if __name__ == "__main__":
    main()
