"""Replicated read-only arrays: what a second copy costs, and how fast a loss is repaired.

    python bench/replicas.py [--quick] [--size BYTES] [--repeats R] [--attach] [--out DIR]

A plain script with 3 members (attach off by default: every other member's slab goes through
the slab cache, as from another machine; --attach maps them in place). Each repeat builds a
fresh pool, then, with the contenders in rotated order:

- create: from_numpy of a float32 array of --size bytes (default 256 MiB, quick 64 MiB) with
  access='readonly', replicas=1 against replicas=2 (ratio: time with 2 copies / with 1; the
  script writes every copy, so about 2 is the expectation);
- scan: a blocks() sum over each (ratio: 1 copy's time / 2 copies': reads touch one copy, so
  about 1);
- restore: member 2 is SIGKILLed; the keeper copies every slab that had a copy there to a
  member left. Peer in the same run: the floor of a copy through this process, the same
  number of slabs moved by Window.get + put between the same members, before the kill
  (ratio: restore throughput / peer throughput). Restore time counts from the kill (the
  keeper looks for losses every 50 ms) to the last copy made;
- failover: the first full scan of the replicated array after the kill against a warm scan
  before it (ratio: after / before).

Results: DIR/replicas[-quick].{json,txt,png}; medians over --repeats (default 3).
"""
import argparse
import os
import signal
import statistics
import sys
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

SLAB = 1 << 20


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="64 MiB arrays")
    p.add_argument("--size", type=int, default=None, help="bytes of the array")
    p.add_argument("--repeats", type=int, default=3, help="fresh pools, one kill each")
    p.add_argument("--attach", action="store_true", help="map same-machine members")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    a = p.parse_args()
    if a.size is None:
        a.size = (64 if a.quick else 256) * MiB
    return a


def scan(x):
    t = time.perf_counter()
    s = 0.0
    for b in x.blocks():
        s += float(b.sum())
    return time.perf_counter() - t, s


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def one_repeat(args, src, r):
    pool = pt.init(members=3, slab_size=SLAB, memory=3 * args.size + (64 << 20),
                   cache_bytes=32 * SLAB, attach=args.attach, timeout=30)
    made = {}
    for k in common.rotated([1, 2], r):
        made[k] = timed(lambda: pt.from_numpy(src, access="readonly", replicas=k))
    one, two = made[1][1], made[2][1]
    scans = {1: [], 2: []}
    for rep in range(3):
        for k in common.rotated([1, 2], r + rep):
            scans[k].append(scan(one if k == 1 else two)[0])
    # the peer: as many slabs as the restore will move, by get + put through this process
    victim = 2
    moved = sum(1 for cs in two._a.copies if any(m == victim for m, _ in cs))
    dst = pt.empty(moved * SLAB // 4, np.float32, access="readonly", placement=[1])
    srcs = [cs for cs in two._a.copies if cs[0][0] == 0][:moved]
    buf = np.empty(SLAB, np.uint8)
    t = time.perf_counter()
    for i in range(moved):
        m, s = srcs[i % len(srcs)][0]
        data = pool.local["ro"][s * SLAB:(s + 1) * SLAB] if m == 0 else \
            pool.read_win["ro"].get(m, s * SLAB, buf)
        dm, ds = dst._a.members[i], dst._a.slots[i]
        mw = pool.mapped_w.get(("ro", dm))
        if mw is not None:
            mw[ds * SLAB:(ds + 1) * SLAB] = data
        else:
            pool.write_win["ro"].put(dm, ds * SLAB, data)
    peer_s = time.perf_counter() - t
    warm = min(scans[2])
    ref = scan(two)[1]
    pool._procs[victim - 1].send_signal(signal.SIGKILL)
    after, total = scan(two)
    assert total == ref, "wrong bytes after the kill"
    deadline = time.monotonic() + 120
    while True:
        st = pool.stats()["replicas"]
        if st["under_replicated"]["slabs"] == 0 and st["restored"]["slabs"]:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"restore did not finish: {st}")
        time.sleep(0.02)
    rst = st["restored"]
    assert rst["slabs"] == moved, (rst, moved)
    pt.finalize()
    return {"create_1_s": made[1][0], "create_2_s": made[2][0],
            "scan_1_s": min(scans[1]), "scan_2_s": warm, "restore_s": rst["seconds"],
            "restore_bytes": rst["bytes"], "peer_s": peer_s, "scan_after_kill_s": after}


def main():
    args = parse()
    src = np.random.default_rng(0).standard_normal(args.size // 4, dtype=np.float32)
    runs = [one_repeat(args, src, r) for r in range(args.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    gbs = lambda b, s: b / s / 1e9     # noqa: E731
    rows = [
        ["create s, 2 copies / 1", med["create_2_s"], med["create_1_s"],
         med["create_2_s"] / med["create_1_s"]],
        ["scan s, 1 copy / 2", med["scan_1_s"], med["scan_2_s"], med["scan_1_s"] / med["scan_2_s"]],
        ["restore GB/s / get+put GB/s", gbs(med["restore_bytes"], med["restore_s"]),
         gbs(med["restore_bytes"], med["peer_s"]), med["peer_s"] / med["restore_s"]],
        ["scan s, first after kill / warm", med["scan_after_kill_s"], med["scan_2_s"],
         med["scan_after_kill_s"] / med["scan_2_s"]]]
    table = common.format_table(["figure", "ours", "peer", "ratio"], rows)
    title = (f"replicas: float32 array of {human_size(args.size)}, 3 members "
             f"({'mapped' if args.attach else 'through the cache'}), medians of "
             f"{args.repeats} fresh pools; restore moved {human_size(med['restore_bytes'])}")
    print(title)
    print(table)
    name = "replicas-quick" if args.quick else "replicas"
    common.write_json(os.path.join(args.out, name + ".json"),
                      {"machine": common.machine_info(load=os.getloadavg()), "runs": runs,
                       "median": med, "size": args.size, "attach": args.attach})
    with open(os.path.join(args.out, name + ".txt"), "w") as f:
        f.write(title + "\n" + table + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(range(len(rows)), [r[3] for r in rows])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
    ax.set_ylabel("ratio")
    common.save_figure(fig, os.path.join(args.out, name + ".png"), title)


if __name__ == "__main__":
    main()
