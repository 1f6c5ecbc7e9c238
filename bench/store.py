"""Cold start of model consumers on separate machines: each reading the checkpoint from shared
storage, against one load into the pool that every consumer opens, against replication to
every consumer's machine.

    python bench/store.py [--quick] [--size BYTES] [--consumers 1,2,3] [--link-rate RATE]
                          [--storage-rate RATE] [--out DIR]
    (root: the machines are network namespaces, tests/netns.py's Lan)

The scenario is the one ModelExpress answers: many nodes that each need the whole model,
and the weights on shared storage (a file server, NFS, an object store) that every node
would otherwise read by itself. The machines, each a network namespace of its own with one
network card (a veth) on one switch (a bridge), made for this run and removed on exit:

- storage: the shared storage, a file server (sendfile of the safetensors file, from this
  box's disk: its page cache is dropped with posix_fadvise(DONTNEED) before a cold run);
- source: the machine that loads the model into the pool: its memory server holds it;
- c1..cN: the consumers, each with a memory server of its own (for (c)).

--link-rate (e.g. 1gbit) shapes every card, both ways (tc htb on the card for what a machine
sends, on its switch port for what it receives), so that the network, not this box's memory
bus and cores, bounds every transfer, as between real machines; --storage-rate the storage's
card (default: the link rate). Without a rate the links are plain veths (memory speed: every
machine shares this box's cores and memory bus, and that bounds the figures).

A generated safetensors file of --size bytes (default 1 GiB, quick 128 MiB; 64 float32
tensors). For N consumers at once, the time from the start until the last consumer has read
every tensor (process start and imports included):

- (a) shared storage: every consumer fetches the whole file from storage and parses it
  (safetensors.numpy.load);
- (b) pool: the source fetches the file from storage once and loads it
  (pt.store.load_safetensors) into its server, then every consumer opens the store and
  reads every tensor (np.asarray) over tcp from the source's server;
- (c) replicate: the same load, then pt.store.replicate to the consumers' own servers (a
  chain, each forwarding while it receives), then every consumer opens it with local=True
  and reads every tensor from the server on its own machine.

Cold: fresh memory servers (memory never touched by them) and the page cache dropped;
warm: the same servers again (memory just freed by the run before) and the file cached.
Ratios: (a)/(c) at each N (aim >= 3 at N = 3), also with the model already in the pool
((c) less the load: a trainer published it, a serving instance holds it); replication to N
servers against one replication to one server (same cold or warm state: fresh servers for a
cold one) and against one plain transfer of the file over one link (a socket, sendfile to
recv_into). The receiving servers' own account of each replication (pull.py's trace: when
the first chunk landed, seconds in gets, in waiting for the source, in mapping the memory
ahead) goes with the figures.

Results: DIR/store[-quick][-RATE][-storageRATE].{json,txt,png}.
"""
import argparse
import json
import os
import socket
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
FILE = "model.safetensors"
MEM_PORT, FILE_PORT = 7100, 7200


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a 128 MiB model, N = 1 and 3")
    p.add_argument("--size", type=int, default=None, help="bytes of the model")
    p.add_argument("--consumers", default=None, help="N values (default 1,2,3)")
    p.add_argument("--link-rate", default=None,
                   help="every machine's card, both ways (tc rate: 1gbit, 500mbit...)")
    p.add_argument("--storage-rate", default=None,
                   help="the shared storage's card (default: the link rate)")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    p.add_argument("--role", nargs=2, metavar=("ROLE", "SPEC"),
                   help=argparse.SUPPRESS)           # a process on one machine (this script)
    a = p.parse_args()
    if a.size is None:
        a.size = (128 if a.quick else 1024) * MiB
    a.consumers = [int(n) for n in (a.consumers or ("1,3" if a.quick else "1,2,3")).split(",")]
    a.storage_rate = a.storage_rate or a.link_rate
    return a


# -- what runs on one machine ------------------------------------------------------------------

def serve_files(folder, addr, port):
    """A file server: a line with the file's name in, its length (8 bytes) and bytes out."""
    import socketserver

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            line = b""
            while not line.endswith(b"\n"):
                got = self.request.recv(256)
                if not got:
                    return
                line += got
            path = os.path.join(folder, os.path.basename(line.strip().decode()))
            with open(path, "rb") as f:
                self.request.sendall(os.fstat(f.fileno()).st_size.to_bytes(8, "little"))
                self.request.sendfile(f)

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    with Server((addr, port), Handler) as s:
        print("serving files", flush=True)
        s.serve_forever()


def fetch(addr, port):
    """The model file from a file server: a bytearray."""
    with socket.create_connection((addr, port), timeout=600) as s:
        s.sendall(FILE.encode() + b"\n")
        head = b""
        while len(head) < 8:
            got = s.recv(8 - len(head))
            if not got:
                raise ConnectionError("the file server closed the connection")
            head += got
        n = int.from_bytes(head, "little")
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = s.recv_into(view[got:], min(n - got, 16 << 20))
            if k == 0:
                raise ConnectionError(f"the file ended at {got} of {n} bytes")
            got += k
    return buf


def _pool(spec):
    import pooltensor as pt
    pool = pt.init(connect=spec["servers"], secret_file=spec["secret"], memory=1 << 20,
                   cache_bytes=64 * MiB)
    return pt, pool


def role(name, spec):
    """One process on one machine; prints RESULT and a JSON object."""
    spec = json.loads(spec)
    if name == "files":
        return serve_files(spec["folder"], spec["addr"], spec["port"])
    t0 = time.perf_counter()
    out = {}
    if name == "consumer":
        mode = spec["mode"]
        if mode == "file":
            from safetensors.numpy import load
            ts = load(bytes(fetch(*spec["storage"])))
        else:
            pt, _ = _pool(spec)
            with pt.store.open(NAME, local=mode == "replicate") as s:
                ts = {k: np.asarray(a) for k, a in s.items()}
            pt.finalize()
        out["bytes"] = sum(a.nbytes for a in ts.values())
        out["check"] = f"{sum(float(a.reshape(-1)[::4096].sum()) for a in ts.values()):.6e}"
    elif name == "link":
        out["bytes"] = len(fetch(*spec["source"]))
    elif name == "load":
        buf = fetch(*spec["storage"])
        out["fetch"] = time.perf_counter() - t0
        folder = tempfile.mkdtemp(prefix="pt-bench-source-", dir="/dev/shm")
        path = os.path.join(folder, FILE)        # the source machine's own copy
        try:
            with open(path, "wb") as f:
                f.write(buf)
            del buf
            pt, _ = _pool(spec)
            t = time.perf_counter()
            pt.store.load_safetensors(path, name=NAME, placement=[1])
            out["load"] = time.perf_counter() - t
            pt.finalize()
        finally:
            os.unlink(path)
            os.rmdir(folder)
    elif name == "replicate":
        pt, pool = _pool(spec)
        v = vmstat()
        t = time.perf_counter()
        pt.store.replicate(NAME, spec["members"])
        out["replicate"] = time.perf_counter() - t
        out["vmstat"] = {k: n - v.get(k, 0) for k, n in vmstat().items()}
        out["traces"] = traces(pool.world, spec["members"])
        pt.finalize()
    elif name == "drop":
        pt, _ = _pool(spec)
        pt.store.drop(NAME)
        pt.finalize()
    out["seconds"] = time.perf_counter() - t0
    print("RESULT " + json.dumps(out), flush=True)


def vmstat():
    """The kernel's counters of huge-page allocation and compaction (this box's, all of it):
    a stall in fresh server memory shows here."""
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k in ("compact_stall", "compact_fail", "thp_file_alloc", "thp_file_fallback"):
                out[k] = int(v)
    return out


def traces(world, members):
    """The receiving servers' trace of their pull (pull.py), in member order."""
    out = []
    for r in members:
        got = [n["trace"] for n in world.server(r).request({"op": "name_list"})["names"]
               if n.get("trace") and "/full" in n["name"]]
        out.append(got[-1] if got else None)
    return out


# -- the machines ------------------------------------------------------------------------------

def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def make_model(path, size):
    from safetensors.numpy import save_file
    n = 64
    per = size // n // 4
    base = np.random.default_rng(1).standard_normal(per, dtype=np.float32)
    save_file({f"layer{k}.weight": base + k for k in range(n)}, path)
    return os.path.getsize(path)


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT
    e["PYTHONUNBUFFERED"] = "1"
    for k in ("POOLTENSOR_CONNECT", "POOLTENSOR_SECRET_FILE"):
        e.pop(k, None)
    return e


class Machines:
    """The Lan, a file server on storage and source, a memory server on source and each
    consumer; restart() gives fresh memory servers."""

    def __init__(self, args, folder, nbytes):
        import netns
        from servers import make_secret
        self.hosts = ["storage", "source"] + [f"c{k + 1}" for k in range(max(args.consumers))]
        self.lan = netns.Lan(self.hosts, rates={
            h: args.storage_rate if h == "storage" else args.link_rate for h in self.hosts})
        self.procs, self.mem = [], {}
        self.secret = make_secret(tempfile.mkdtemp(prefix="pt-bench-store-"))
        self.size = f"{(nbytes * 5 // 4 + 64 * MiB) // MiB}MiB"
        try:
            for h in ("storage", "source"):
                p = subprocess.Popen(self.lan.cmd(h, [
                    sys.executable, os.path.abspath(__file__), "--role", "files", json.dumps(
                        {"folder": folder, "addr": self.lan.addr(h), "port": FILE_PORT})]),
                    stdout=subprocess.PIPE, text=True, env=_env())
                self.procs.append(p)
                if "serving" not in p.stdout.readline():
                    raise RuntimeError(f"the file server on {h} did not start")
            self.restart()
        except BaseException:
            self.close()
            raise

    def restart(self, hosts=None):
        from servers import ServerProc
        hosts = hosts or [h for h in self.hosts if h != "storage"]
        for h in hosts:
            if h in self.mem:
                self.mem.pop(h).stop()
        for h in hosts:
            self.mem[h] = ServerProc(self.size, self.secret, host=self.lan.addr(h),
                                     port=MEM_PORT, ns=self.lan.names[h])
        for h in hosts:
            self.mem[h].ready()

    def where(self, h):
        return [self.lan.addr(h), FILE_PORT]

    def servers(self, hosts):
        return [self.mem[h].address for h in hosts]

    def run(self, hosts, name, specs):
        """Role `name` on each host at once; (seconds until the last ended, [results])."""
        t0 = time.perf_counter()
        procs = [subprocess.Popen(self.lan.cmd(h, [
            sys.executable, os.path.abspath(__file__), "--role", name,
            json.dumps(dict(spec, secret=self.secret))]), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=_env()) for h, spec in zip(hosts, specs)]
        try:
            outs = [p.communicate(timeout=900)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:        # interrupted: none outlives the machines
                    p.kill()
                    p.wait(10)
        dt = time.perf_counter() - t0
        res = []
        for h, p, o in zip(hosts, procs, outs):
            line = next((ln for ln in o.splitlines() if ln.startswith("RESULT ")), None)
            if p.returncode != 0 or line is None:
                raise RuntimeError(f"{name} on {h} failed:\n{o}")
            res.append(json.loads(line[7:]))
        return dt, res

    def close(self):
        try:
            for s in self.mem.values():
                s.stop()
            for p in self.procs:
                p.terminate()
                p.wait(10)
        finally:
            self.lan.close()


def measure(args, m, path, nbytes):
    rows, runs = [], {}
    src = ["source"]
    every = src + [h for h in m.hosts if h.startswith("c")]
    checks = set()

    def load():
        _, (r,) = m.run(src, "load", [{"servers": m.servers(src), "storage": m.where("storage")}])
        return r["fetch"] + r["load"], r

    def replicate(members):
        _, (r,) = m.run(src, "replicate", [{"servers": m.servers(every), "members": members}])
        return r

    def drop():
        m.run(src, "drop", [{"servers": m.servers(every)}])

    def consumers(n, mode):
        cs = [f"c{k + 1}" for k in range(n)]
        dt, res = m.run(cs, "consumer", [
            {"mode": mode, "storage": m.where("storage"),
             "servers": m.servers(src + ([c] if mode == "replicate" else []))} for c in cs])
        for r in res:
            if r["bytes"] != res[0]["bytes"]:
                raise RuntimeError(f"consumers read different byte counts: {res}")
            checks.add(r["check"])
        if len(checks) != 1:
            raise RuntimeError(f"consumers read different bytes: {checks}")
        return dt, max(r["seconds"] for r in res)

    for n in args.consumers:
        members = [2 + k for k in range(n)]
        for warm in (False, True):
            tag = f"N={n} {'warm' if warm else 'cold'}"
            r = runs[tag] = {"load_avg": os.getloadavg()[0]}
            if not warm:
                m.restart()
                drop_cache(path)
            r["file"], r["file_in"] = consumers(n, "file")
            if not warm:
                drop_cache(path)
            r["load"], r["load_parts"] = load()
            dt, r["pool_in"] = consumers(n, "pool")
            r["pool"] = r["load"] + dt
            drop()
            if not warm:
                drop_cache(path)
            t_load, _ = load()
            rep = replicate(members)
            dt, r["replicate_in"] = consumers(n, "replicate")
            r["replicate"] = t_load + rep["replicate"] + dt
            r["in_pool"] = rep["replicate"] + dt
            r["replication"], r["traces"] = rep["replicate"], rep["traces"]
            r["vmstat"] = rep["vmstat"]
            drop()
            if not warm:
                m.restart(["c1"])
            load()
            one = replicate([2])
            r["one"], r["one_trace"] = one["replicate"], one["traces"][0]
            drop()
            _, (lk,) = m.run(["c1"], "link", [{"source": m.where("source")}])
            r["link"] = lk["seconds"]
            rows.append([tag, f"{r['load']:.2f}", f"{r['file']:.2f}", f"{r['pool']:.2f}",
                         f"{r['replicate']:.2f}", f"{r['file'] / r['replicate']:.2f}x",
                         f"{r['file'] / r['in_pool']:.2f}x", f"{r['replication']:.2f}",
                         f"{r['one']:.2f}", f"{r['replication'] / r['one']:.2f}x",
                         f"{r['link']:.2f}", f"{r['replication'] / r['link']:.2f}x",
                         f"{r['load_avg']:.2f}"])
            print(" | ".join(rows[-1]), flush=True)
            print("   " + trace_line(r) + "\n   " + own_line(r), flush=True)
    return rows, runs


def own_line(r):
    """The consumers' own seconds (from their start of work, python and numpy started, to
    their last tensor), the slowest of the N; and the load's two steps."""
    return (f"consumers' own time: (a) {r['file_in']:.2f} (b) {r['pool_in']:.2f} "
            f"(c) {r['replicate_in']:.2f}; load: fetch {r['load_parts']['fetch']:.2f} + "
            f"load_safetensors {r['load_parts']['load']:.2f}")


def trace_line(r):
    """The receiving servers' account of the replication (and of the one transfer)."""
    def one(t):
        if not t:
            return "-"
        return (f"first {t['first']:.2f} gets {t['get']:.2f} (slowest {t['slowest']:.3f}) "
                f"waits {t['wait']:.2f} all {t['elapsed']:.2f}")
    v = r.get("vmstat", {})
    return ("pulls: " + "; ".join(f"c{k + 1} {one(t)}" for k, t in enumerate(r["traces"]))
            + f" || one: {one(r['one_trace'])} || huge pages {v.get('thp_file_alloc', 0)} "
            f"(fallbacks {v.get('thp_file_fallback', 0)}), compaction stalls "
            f"{v.get('compact_stall', 0)}")


EXPLAIN = """\
Columns: load: the source fetches the file from storage and loads it into its server; (a)
every consumer fetches the file from shared storage; (b) load, then every consumer opens the
store and reads it over tcp from the source's server; (c) load, replicate to every
consumer's server, open(local=True) + read on each consumer's machine; times until the last
consumer has every tensor, process start included. (a)/(c) in pool: against (c) less the
load (the model already in the pool). replication: pt.store.replicate to the N consumers'
servers; one repl: replicate to one server (cold: fresh servers, like replication's); one
link: the file sent once over one link (socket), the transfer the network allows.
"""


def emulation_note(args):
    if not args.link_rate:
        return ("Not emulated: unshaped veth links; every machine shares this box's cores, "
                "memory bus and page cache, which bound every figure (not a network).")
    return (f"Emulated: separate machines on one switch, each card shaped to {args.link_rate} "
            f"both ways (tc htb), the shared storage's card to {args.storage_rate}; what is not "
            "emulated: every machine still shares this box's cores, memory and disk (storage's "
            "file and every page cache are this box's).")


def main():
    args = parse()
    if args.role:
        return role(*args.role)
    import netns
    why = netns.unavailable()
    if why:
        print(f"bench/store.py needs network namespaces: {why}")
        return 1
    import signal
    # SIGTERM (a timeout, a kill) unwinds like Ctrl-C, so the machines' namespaces, links
    # and shaping go (after SIGKILL the next Lan removes them: tests/netns.py)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    name = "store-quick" if args.quick else "store"
    if args.link_rate:
        name += f"-{args.link_rate}"
    if args.storage_rate != args.link_rate:
        name += f"-storage{args.storage_rate}"
    with tempfile.TemporaryDirectory(prefix="pt-bench-model-", dir="/var/tmp") as d:
        path = os.path.join(d, FILE)
        nbytes = make_model(path, args.size)
        print(f"model: {human_size(nbytes)} in 64 tensors, consumers {args.consumers}, "
              f"load {os.getloadavg()[0]:.2f}\n{emulation_note(args)}", flush=True)
        m = Machines(args, d, nbytes)
        try:
            shaping = m.lan.shaping()
            rows, runs = measure(args, m, path, nbytes)
        finally:
            m.close()
    table = common.format_table(["run", "load s", "(a) storage s", "(b) pool s",
                                 "(c) replicate s", "(a)/(c)", "(a)/(c) in pool",
                                 "replication s", "one repl s", "repl/one", "one link s",
                                 "repl/link", "load avg"], rows)
    load = os.getloadavg()
    text = (f"bench/store.py: {human_size(nbytes)}, link {args.link_rate or 'unshaped'}, "
            f"storage {args.storage_rate or 'unshaped'}, load average {load[0]:.2f} "
            f"{load[1]:.2f} {load[2]:.2f}\n{table}\n"
            + "\n".join(f"{tag}: {trace_line(r)}\n    {own_line(r)}" for tag, r in runs.items())
            + "\n" + EXPLAIN + emulation_note(args))
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name + ".txt"), "w") as f:
        f.write(text + "\n")
    common.write_json(os.path.join(args.out, name + ".json"), {
        "machine": common.machine_info(load=load), "model_bytes": nbytes,
        "link_rate": args.link_rate, "storage_rate": args.storage_rate, "shaping": shaping,
        "emulation": emulation_note(args), "runs": runs})
    plot(args, runs, nbytes, load, os.path.join(args.out, name + ".png"))
    return 0


def plot(args, runs, nbytes, load, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for warm, ax in zip((False, True), axes):
        ns = args.consumers
        for key, label in (("file", "(a) every consumer reads shared storage"),
                           ("pool", "(b) one load, open over tcp"),
                           ("replicate", "(c) load + replicate (ours)"),
                           ("in_pool", "(c) replicate, model already in the pool")):
            ys = [runs[f"N={n} {'warm' if warm else 'cold'}"][key] for n in ns]
            ax.plot(ns, ys, marker="o", label=label,
                    linestyle="-" if "(c)" in label else "--")
        ax.set_xlabel("consumers (one machine each)")
        ax.set_ylabel("seconds until every consumer has the model")
        ax.set_title("warm" if warm else "cold (fresh servers, page cache dropped)", fontsize=10)
        ax.set_xticks(ns)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    common.save_figure(fig, path, f"store cold start, {human_size(nbytes)} model, link "
                       f"{args.link_rate or 'unshaped'}, storage "
                       f"{args.storage_rate or 'unshaped'}, load {load[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
