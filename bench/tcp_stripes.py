"""Striped tcp gets and puts: bandwidth by stripe count and socket buffer size.

    python bench/tcp_stripes.py [--links loopback,netns] [--stripes 1,2,3,4,6,8]
                                [--sockbufs 0,4194304] [--sizes 4194304,67108864] [--repeats 5]

What POOLTENSOR_TCP_STRIPES' default and POOLTENSOR_TCP_SOCKBUF's were picked from. A server
process (in namespace ptns1 for the netns link, tests/netns.py) serves a 64 MiB segment; one
client process (ptns0) holds one context per stripe count, each with connections of its own
to that server, and times blocking get()/put() of each size with every stripe count in turn,
in an order rotated from repeat to repeat; figures are medians over repeats, and the ratio is
against one stripe (one connection: no striping) in the same run. Socket buffer sizes are set
on both ends (0: the kernel's autotuning), one server per value. Writes
DIR/tcp_stripes.json and .png.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
sys.path.insert(0, HERE)
import common  # noqa: E402
from common import human_size, say  # noqa: E402

sys.path.remove(HERE)
sys.path.append(ROOT)

SECRET = "73747269706573" * 4   # (16 bytes at least)
NS = {"loopback": (None, None, "127.0.0.1"), "netns": ("ptns0", "ptns1", "10.77.0.2")}
SEG = 64 << 20


def serve(host):
    from collectives import _native
    srv = _native.Context(0, 1, 1)
    srv.set_secret(bytes.fromhex(SECRET))
    port = srv.listen(host, 0)
    seg = _native.Segment(SEG)
    srv.add_segment(seg)
    mem = np.frombuffer(seg, np.uint8)
    mem[:] = 1
    key = srv.register(mem, 3)
    print(port, key, flush=True)
    sys.stdin.read()            # until the client is done
    srv.close()


def client(host, port, key, stripes, sizes, repeats):
    from collectives import _native
    ctxs = {}
    for s in stripes:
        os.environ["POOLTENSOR_TCP_STRIPES"] = str(s)    # read at a context's first transfer
        c = _native.Context(0, 2, 1)
        c.set_secret(bytes.fromhex(SECRET))
        c.set_timeout(60)
        c.connect_tcp(1, host, port)
        c.get(1, key, 0, np.empty(SEG, np.uint8))
        ctxs[s] = c
    res = {}
    for n in sizes:
        buf = np.ones(n, np.uint8)
        for op in ("get", "put"):
            fn = {s: (lambda c=c: getattr(c, op)(1, key, 0, buf)) for s, c in ctxs.items()}
            k = max(2, int(0.15 * 1e9 / n))            # ~0.15 s a batch at 1 GB/s
            runs = {s: [] for s in stripes}
            for r in range(repeats):
                for s in common.rotated(stripes, r):
                    fn[s]()
                    t = time.perf_counter()
                    for _ in range(k):
                        fn[s]()
                    runs[s].append(k * n / (time.perf_counter() - t) / 1e9)
            res[f"{op} {n}"] = {s: float(np.median(v)) for s, v in runs.items()}
    for c in ctxs.values():
        c.close()
    print("RESULT " + json.dumps(res), flush=True)


def env(extra):
    e = dict(os.environ, PYTHONPATH=ROOT, **extra)
    e.pop("POOLTENSOR_TRANSPORT", None)
    return e


def run(link, sockbuf, a):
    near, far, host = NS[link]   # the client in the first, the server in the second
    pre = (lambda ns: ["ip", "netns", "exec", ns] if ns else [])
    e = env({"POOLTENSOR_TCP_SOCKBUF": str(sockbuf)})
    srv = subprocess.Popen(pre(far) + [sys.executable, __file__, "--serve", host], env=e,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port, key = srv.stdout.readline().split()
        out = subprocess.run(pre(near) + [sys.executable, __file__, "--client", host, port, key,
                                          "--stripes", a.stripes, "--sizes", a.sizes,
                                          "--repeats", str(a.repeats)],
                             env=e, capture_output=True, text=True, timeout=900)
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            raise RuntimeError(out.stdout[-2000:] + out.stderr[-2000:])
        return json.loads(line[-1][7:])
    finally:
        srv.stdin.close()
        srv.wait(30)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--links", default="loopback,netns")
    p.add_argument("--stripes", default="1,2,3,4,6,8")
    p.add_argument("--sockbufs", default="0,4194304")
    p.add_argument("--sizes", default=f"{4 << 20},{64 << 20}")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    p.add_argument("--client", nargs=3, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve:
        return serve(a.serve)
    stripes = [int(x) for x in a.stripes.split(",")]
    sizes = [int(x) for x in a.sizes.split(",")]
    if a.client:
        host, port, key = a.client
        return client(host, int(port), int(key), stripes, sizes, a.repeats)
    load = os.getloadavg()
    results, rows, series = {}, [], {}
    for link in a.links.split(","):
        for sb in [int(x) for x in a.sockbufs.split(",")]:
            say(f"{link}, socket buffers {sb or 'autotuned'}")
            r = run(link, sb, a)
            results[f"{link} sockbuf={sb}"] = r
            for what, by in r.items():
                op, n = what.split()
                base = by["1"]
                rows.append([link, sb or "auto", op, human_size(int(n))] +
                            [f"{by[str(s)]:.2f} ({by[str(s)] / base:.2f}x)" for s in stripes])
                series.setdefault(f"{link} {op} {human_size(int(n))} buf={sb or 'auto'}",
                                  [by[str(s)] for s in stripes])
    print(common.format_table(["link", "sockbuf", "op", "size"] +
                              [f"{s} stripes GB/s" for s in stripes], rows))
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "tcp_stripes")
    common.write_json(path + ".json", {"machine": common.machine_info(load=list(load)),
                                       "stripes": stripes, "results": results})
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 5))
    for name, ys in series.items():
        ax.plot(stripes, ys, marker="o", label=name)
    ax.set_xlabel("stripes (connections per peer)")
    ax.set_ylabel("GB/s")
    ax.legend(fontsize=6)
    common.save_figure(fig, path + ".png", "striped tcp get/put")
    say(f"wrote {path}.json, .png")


if __name__ == "__main__":
    main()
