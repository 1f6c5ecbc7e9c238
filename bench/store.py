"""Cold start of model consumers: each reading the checkpoint itself, against one load into
the pool that every consumer opens, against replication to every consumer's machine.

    python bench/store.py [--quick] [--size BYTES] [--consumers 1,2,3] [--out DIR]
    (root: the consumers run in the network namespaces of tests/netns.py)

A generated safetensors file of --size bytes (default 1 GiB, quick 128 MiB; 64 float32
tensors, written by the safetensors package). Consumer k runs in namespace ptns<k> (a
machine of its own: the pool reaches it over tcp on veth links), with a memory server of its
own there; the source memory server is in ptns0. Before each cold run the file's pages are
dropped from the page cache (os.posix_fadvise DONTNEED); a warm run follows without. For N
consumers at once, time from the start until the last has read every tensor:

- (a) file: every consumer reads the whole file itself (safetensors.numpy.load_file);
- (b) pool: one process loads the file into the source server (pt.store.load_safetensors),
  then every consumer opens the store and reads every tensor (np.asarray) over tcp;
- (c) replicate: the same load, then pt.store.replicate to the consumers' own servers (a
  chain, each forwarding while it receives), then every consumer opens it with local=True
  and reads every tensor from the server on its machine.

Ratios: (a)/(c) at each N (aim >= 3 at N = 3), and replication to N servers against one
transfer (replicate to one server) of the same model (aim <= 1.5). On one box the consumers
of (a) share the page cache and the disk, and every namespace shares the 2..16 cores, so (a)
is flattered beyond N = 1 and (c) is held back; the figures say so next to the load average.

Results: DIR/store[-quick].{json,txt,png}.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import MiB, human_size  # noqa: E402

sys.path.remove(HERE)
sys.path.append(ROOT)
sys.path.append(os.path.join(ROOT, "tests"))

NAME = "bench-model"


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a 128 MiB model, N = 1 and 3")
    p.add_argument("--size", type=int, default=None, help="bytes of the model")
    p.add_argument("--consumers", default=None, help="N values (default 1,2,3)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    p.add_argument("--consumer", nargs=4, metavar=("MODE", "PATH", "SECRET", "SERVERS"),
                   help=argparse.SUPPRESS)           # one consumer (run by this script)
    a = p.parse_args()
    if a.size is None:
        a.size = (128 if a.quick else 1024) * MiB
    a.consumers = [int(n) for n in (a.consumers or ("1,3" if a.quick else "1,2,3")).split(",")]
    return a


def consumer(mode, path, secret, servers):
    """One consumer: read the whole model as `mode` says; prints its bytes and checksum."""
    if mode == "file":
        from safetensors.numpy import load_file
        ts = load_file(path)
    else:
        import pooltensor as pt
        pt.init(connect=servers.split(","), secret_file=secret, memory=1 << 20,
                cache_bytes=64 * MiB)
        with pt.store.open(NAME, local=mode == "replicate") as s:
            ts = {k: np.asarray(a) for k, a in s.items()}
        pt.finalize()
    total = sum(a.nbytes for a in ts.values())
    check = sum(float(a.reshape(-1)[::4096].sum()) for a in ts.values())
    print(f"read {total} {check:.6e}", flush=True)


def make_model(path, size):
    from safetensors.numpy import save_file
    n = 64
    per = size // n // 4
    rng = np.random.default_rng(1)
    base = rng.standard_normal(per, dtype=np.float32)
    save_file({f"layer{k}.weight": base + k for k in range(n)}, path)
    return os.path.getsize(path)


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_consumers(netns, n, mode, path, secret, servers):
    """N consumers at once, consumer k in namespace k: seconds until the last is done."""
    t0 = time.perf_counter()
    procs = []
    for k in range(n):
        addrs = servers(k)
        cmd = netns.ns_cmd(k, [sys.executable, os.path.abspath(__file__), "--consumer", mode,
                               path, secret, ",".join(addrs)])
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=_env()))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    dt = time.perf_counter() - t0
    for p, o in zip(procs, outs):
        if p.returncode != 0 or "read " not in o:
            raise RuntimeError(f"a {mode} consumer failed:\n{o}")
    sums = {o.split("read ")[1].split()[1] for o in outs}
    if len(sums) != 1:
        raise RuntimeError(f"consumers read different bytes: {sums}")
    return dt


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT
    e.pop("POOLTENSOR_CONNECT", None)
    return e


def in_ns(netns, k, code, secret, servers):
    """Run a short pooltensor script in namespace k (connected to `servers`); returns what
    it prints last (a number of seconds)."""
    pre = (f"import time, pooltensor as pt\npt.init(connect={servers!r}, "
           f"secret_file={secret!r}, memory=1 << 20)\n")
    p = subprocess.run(netns.ns_cmd(k, [sys.executable, "-c", pre + code + "\npt.finalize()"]),
                       capture_output=True, text=True, env=_env(), timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"namespace {k}: {p.stdout}{p.stderr}")
    return float(p.stdout.split()[-1])


def measure(args, netns, path, nbytes):
    from servers import ServerProc, make_secret
    folder = tempfile.mkdtemp(prefix="pt-bench-store-")
    secret = make_secret(folder)
    mem = f"{(nbytes * 5 // 4 + 64 * MiB) // MiB}MiB"
    nmax = max(args.consumers)
    src = ServerProc(mem, secret, host=netns.ADDRS[0], port=7100, ns=netns.NAMES[0])
    own = [ServerProc(mem, secret, host=netns.ADDRS[k], port=7101, ns=netns.NAMES[k])
           for k in range(nmax)]
    rows, runs = [], {}
    try:
        src.ready()
        for s in own:
            s.ready()
        every = [src.address] + [s.address for s in own]
        load = (f"t = time.perf_counter()\npt.store.load_safetensors({path!r}, name={NAME!r}, "
                f"placement=[1])\nprint(time.perf_counter() - t)")
        drop = f"pt.store.drop({NAME!r})\nprint(0)"
        for n in args.consumers:
            for warm in (False, True):
                tag = f"N={n} {'warm' if warm else 'cold'}"
                r = runs[tag] = {}
                if not warm:
                    drop_cache(path)
                r["file"] = run_consumers(netns, n, "file", path, secret, lambda k: [src.address])
                if not warm:
                    drop_cache(path)
                t_load = in_ns(netns, 0, load, secret, [src.address])
                r["pool"] = t_load + run_consumers(netns, n, "pool", path, secret,
                                                   lambda k: [src.address])
                members = [2 + k for k in range(n)]
                rep = (f"t = time.perf_counter()\npt.store.replicate({NAME!r}, {members!r})\n"
                       f"print(time.perf_counter() - t)")
                t_rep = in_ns(netns, 0, rep, secret, every)
                r["replicate"] = t_load + t_rep + run_consumers(
                    netns, n, "replicate", path, secret, lambda k: [src.address, own[k].address])
                in_ns(netns, 0, drop, secret, every)
                # one transfer of the model, for the pipeline's cost: replicate to one server
                if not warm:
                    drop_cache(path)
                in_ns(netns, 0, load, secret, [src.address])
                r["one transfer"] = in_ns(netns, 0, rep.replace(repr(members), "[2]"), secret,
                                          every)
                r["replication"] = t_rep
                in_ns(netns, 0, drop, secret, every)
                r.update(load=t_load)
                rows.append([tag, f"{r['file']:.2f}", f"{r['pool']:.2f}",
                             f"{r['replicate']:.2f}", f"{r['file'] / r['replicate']:.2f}x",
                             f"{r['replication']:.2f}", f"{r['one transfer']:.2f}",
                             f"{r['replication'] / r['one transfer']:.2f}x"])
                common.say(" | ".join(rows[-1]))
    finally:
        src.stop()
        for s in own:
            s.stop()
    return rows, runs


def main():
    args = parse()
    if args.consumer:
        return consumer(*args.consumer)
    import netns
    why = netns.unavailable()
    if why:
        print(f"bench/store.py needs network namespaces: {why}")
        return 1
    netns.up()
    if max(args.consumers) > len(netns.NAMES):
        print(f"at most {len(netns.NAMES)} consumers (one per namespace)")
        return 2
    name = "store-quick" if args.quick else "store"
    with tempfile.TemporaryDirectory(prefix="pt-bench-model-", dir="/var/tmp") as d:
        path = os.path.join(d, "model.safetensors")
        nbytes = make_model(path, args.size)
        print(f"model: {human_size(nbytes)} in 64 tensors, consumers {args.consumers}, "
              f"load {os.getloadavg()[0]:.2f}")
        rows, runs = measure(args, netns, path, nbytes)
    table = common.format_table(["run", "(a) file s", "(b) pool s", "(c) replicate s",
                                 "(a)/(c)", "replication s", "one transfer s",
                                 "replication/one"], rows)
    load = os.getloadavg()
    text = (f"bench/store.py: {human_size(nbytes)}, load average {load[0]:.2f} "
            f"{load[1]:.2f} {load[2]:.2f}\n{table}\n"
            "(a) every consumer reads the file; (b) one load into the pool, then open + read "
            "over tcp; (c) load, replicate to every consumer's server, open(local=True) + "
            "read. Times include the consumers' start (python, imports).")
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name + ".txt"), "w") as f:
        f.write(text + "\n")
    common.write_json(os.path.join(args.out, name + ".json"),
                      {"machine": common.machine_info(load=load), "model_bytes": nbytes,
                       "runs": runs})
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for warm, ax in zip((False, True), axes):
        ns = args.consumers
        for key, label in (("file", "(a) every consumer reads the file"),
                           ("pool", "(b) one load, open over tcp"),
                           ("replicate", "(c) load + replicate (ours)")):
            ys = [runs[f"N={n} {'warm' if warm else 'cold'}"][key] for n in ns]
            ax.plot(ns, ys, marker="o", label=label,
                    linestyle="-" if "ours" in label else "--")
        ax.set_xlabel("consumers (one per namespace)")
        ax.set_ylabel("seconds until every consumer has the model")
        ax.set_title("warm page cache" if warm else "cold (page cache dropped)", fontsize=10)
        ax.set_xticks(ns)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    common.save_figure(fig, os.path.join(args.out, name + ".png"),
                       f"store cold start, {human_size(nbytes)} model, load {load[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
