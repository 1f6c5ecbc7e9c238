"""The pool over time: reads before and after hot slabs migrate, and leases growing and
shrinking.

    python bench/policy.py [--quick] [--size BYTES] [--passes P] [--attach] [--out DIR]

(a) migration. A plain script with 2 members (attach off by default: member 1's slabs go
through the slab cache, as from another machine; --attach maps them in place). An array of
--size bytes (default 256 MiB, quick 64 MiB) lives on member 1; the script reads 90% of it
(the first 90% of its slabs, a slab at a time, summed with numpy) --passes times (default 5)
with a slab cache of an eighth of it, so every pass faults. Then pt.sync(), a safe point:
the slabs the script faulted in often enough move to it (migration, sampled fault counts).
(min_faults=3: a slab faulted in 3 times.) The same passes again. Peer in the same run: the same reads of a numpy array in this
process (the floor). Ratio: median pass before / median pass after (aim: >= 2); the first
pass of each side is reported as cold, the rest as warm.

(b) leases. A fresh pool with leases of 16 MiB (shrink_after 1 s): arrays are made one after
the other up to about 60% of the members' memory, then dropped; every 50 ms the memory each
member lends and its resident shared memory (RssShmem, /proc) are sampled. The timeline is
drawn (pool size and RSS per member against time).

Results: DIR/policy[-quick].{json,txt,png}.
"""
import argparse
import gc
import os
import statistics
import sys
import threading
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
    p.add_argument("--quick", action="store_true", help="64 MiB array, fewer passes")
    p.add_argument("--size", type=int, default=None, help="bytes of the array")
    p.add_argument("--passes", type=int, default=None, help="read passes before and after")
    p.add_argument("--attach", action="store_true", help="map same-machine members")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    a = p.parse_args()
    if a.size is None:
        a.size = (64 if a.quick else 256) * MiB
    if a.passes is None:
        a.passes = 4 if a.quick else 6
    return a


def skewed_pass(read, n):
    """Read the first 90% of n slabs, one at a time; seconds taken."""
    per = SLAB // 8
    t = time.perf_counter()
    total = 0.0
    for k in range(n * 9 // 10):
        total += float(read(k * per, (k + 1) * per).sum())
    return time.perf_counter() - t, total


def migration(a):
    n = a.size // SLAB
    pool = pt.init(members=2, slab_size=SLAB, memory=2 * a.size + 64 * MiB,
                   cache_bytes=max(4 * SLAB, a.size // 8), attach=a.attach,
                   migrate={"min_faults": 3})
    try:
        ref = np.random.default_rng(0).random(a.size // 8)
        x = pt.asarray(ref, placement=[1])
        want = float(ref[: (n * 9 // 10) * (SLAB // 8)].sum())
        order = ["numpy", "pool"]
        before = {"pool": [], "numpy": []}
        reads = {"pool": lambda i, j: x[i:j].to_numpy(), "numpy": lambda i, j: ref[i:j]}
        for p in range(a.passes):
            for name in common.rotated(order, p):
                s, tot = skewed_pass(reads[name], n)
                assert abs(tot - want) <= 1e-6 * abs(want), (name, tot, want)
                before[name].append(s)
        t0 = time.perf_counter()
        pt.sync()                          # a safe point: hot slabs move here
        moved_s = time.perf_counter() - t0
        mig = pool.stats()["migrations"]
        here = x._a.members.count(0)
        after = {"pool": [], "numpy": []}
        for p in range(a.passes):
            for name in common.rotated(order, p):
                s, tot = skewed_pass(reads[name], n)
                assert abs(tot - want) <= 1e-6 * abs(want), (name, tot, want)
                after[name].append(s)
        np.testing.assert_array_equal(x.to_numpy(), ref)
    finally:
        pt.finalize()
    med = lambda v: statistics.median(v[1:]) if len(v) > 1 else v[0]   # noqa: E731
    read_bytes = (n * 9 // 10) * SLAB
    return {
        "slabs": n, "slabs_moved_here": here, "migrations": mig["migrations"],
        "moved_bytes": mig["bytes"], "migration_s": moved_s,
        "before_s": before["pool"], "after_s": after["pool"],
        "numpy_s": before["numpy"] + after["numpy"],
        "cold_before_s": before["pool"][0], "cold_after_s": after["pool"][0],
        "warm_before_s": med(before["pool"]), "warm_after_s": med(after["pool"]),
        "warm_numpy_s": med(before["numpy"] + after["numpy"]),
        "ratio_before_over_after": med(before["pool"]) / med(after["pool"]),
        "ratio_after_over_numpy": med(after["pool"]) / med(before["numpy"] + after["numpy"]),
        "read_gbps_before": read_bytes / med(before["pool"]) / 1e9,
        "read_gbps_after": read_bytes / med(after["pool"]) / 1e9,
    }


def rss_shmem(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssShmem:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def leases(a):
    os.environ["POOLTENSOR_PREPARE"] = "0"      # members fault nothing in ahead of use
    memory = max(128 * MiB, a.size)
    lease = 16 * MiB
    pool = pt.init(members=3, slab_size=SLAB, memory=memory, cache_bytes=8 * SLAB,
                   lease=lease, shrink_after=1.0)
    pids = [os.getpid()] + [p.pid for p in pool._procs]
    samples, stop = [], threading.Event()
    t0 = time.monotonic()

    def sample():
        while not stop.wait(0.05):
            lent = pool.leases.stats()["lent"]
            samples.append((time.monotonic() - t0, lent, [rss_shmem(p) for p in pids[1:]]))
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        arrays = []
        step = 24 * MiB
        for _ in range(int(0.6 * 3 * memory) // step):
            arrays.append(pt.ones(step // 8))
            time.sleep(0.15)
        peak = pool.leases.stats()
        time.sleep(0.5)
        while arrays:
            arrays.pop()
            gc.collect()
            time.sleep(0.1)
        pt.sync()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(
                b > lease for b in pool.leases.stats()["lent"]):
            time.sleep(0.1)
        time.sleep(0.5)
        end = pool.leases.stats()
    finally:
        stop.set()
        th.join(5)
        pt.finalize()
    return {"lease": lease, "memory_per_member": memory, "grown": end["grown"],
            "shrunk": end["shrunk"], "given_back_bytes": end["given_back_bytes"],
            "peak_lent": peak["lent"], "end_lent": end["lent"],
            "peak_rss": [max(s[2][i] for s in samples) for i in range(len(pids) - 1)],
            "end_rss": samples[-1][2] if samples else None,
            "timeline": [{"t": round(t, 3), "lent": lent, "rss": rss}
                         for t, lent, rss in samples]}


def plot(path, title, mig, lea):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    ax = axes[0]
    labels = ["before (remote)", "after (migrated)", "numpy (floor)"]
    vals = [mig["warm_before_s"], mig["warm_after_s"], mig["warm_numpy_s"]]
    ax.bar(labels, [v * 1e3 for v in vals], color=["tab:red", "tab:green", "tab:gray"])
    ax.set_ylabel("ms per pass (90% of the array)")
    ax.set_title(f"skewed reads: {mig['ratio_before_over_after']:.2f}x faster after "
                 f"migration", fontsize=10)
    ax = axes[1]
    tl = lea["timeline"]
    ts = [s["t"] for s in tl]
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for m in range(len(tl[0]["lent"]) if tl else 0):
        c = cycle[m % len(cycle)]
        ax.plot(ts, [s["lent"][m] / MiB for s in tl], color=c, label=f"member {m} lends")
        if m >= 1:
            ax.plot(ts, [s["rss"][m - 1] / MiB for s in tl], color=c, linestyle="--",
                    label=f"member {m} RSS (shmem)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title("leases: pool size and member RSS over time", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return common.save_figure(fig, path, title)


def main():
    a = parse()
    load = os.getloadavg()
    mig = migration(a)
    lea = leases(a)
    name = "policy-quick" if a.quick else "policy"
    info = common.machine_info(load=load, size=a.size, passes=a.passes, attach=a.attach)
    common.write_json(os.path.join(a.out, name + ".json"),
                      {"machine": info, "migration": mig, "leases": lea})
    rows = [["cold pass", mig["cold_before_s"] * 1e3, mig["cold_after_s"] * 1e3, "", ""],
            ["warm pass (median)", mig["warm_before_s"] * 1e3, mig["warm_after_s"] * 1e3,
             mig["warm_numpy_s"] * 1e3, mig["ratio_before_over_after"]]]
    text = [f"skewed reads of {human_size(a.size)} on member 1 (90% of it, {a.passes} passes "
            f"each side, attach {'on' if a.attach else 'off'}), load {load[0]:.2f}",
            common.format_table(["", "before ms", "after ms", "numpy ms", "before/after"],
                                rows),
            f"migrated {mig['migrations']} slabs ({human_size(mig['moved_bytes'])}) in "
            f"{mig['migration_s'] * 1e3:.0f} ms; {mig['slabs_moved_here']} of {mig['slabs']} "
            f"slabs now here",
            f"leases of {human_size(lea['lease'])}: grown {lea['grown']}, shrunk "
            f"{lea['shrunk']}, given back {human_size(lea['given_back_bytes'])}; lent at "
            f"peak {[human_size(b) for b in lea['peak_lent']]}, at the end "
            f"{[human_size(b) for b in lea['end_lent']]}; member RSS peak "
            f"{[human_size(b) for b in lea['peak_rss']]}, end "
            f"{[human_size(b) for b in (lea['end_rss'] or [])]}"]
    out = "\n".join(text)
    print(out)
    with open(os.path.join(a.out, name + ".txt"), "w") as f:
        f.write(out + "\n")
    plot(os.path.join(a.out, name + ".png"),
         f"pooltensor policy: migration and leases ({human_size(a.size)})", mig, lea)


if __name__ == "__main__":
    main()
