"""The tcp transport: one-sided get/put against a plain socket and MPICH's RMA, on loopback and
across network namespaces; allreduce across namespaces against MPI's.

    python bench/tcp.py [--quick] [--out DIR] [--links loopback,netns] [--netmods ucx,ofi]
                        [--max-size N] [--allreduce-sizes 4096,16384,65536]

Contenders, each moving the same bytes between two processes:

  ours       the native transport (collectives._native.Context): a server process serves a
             registered segment with listen(); a client process calls get()/put() (blocking)
             with connect_tcp(). Large transfers are split into 256 KiB frames in flight
             together, served by the server's native threads.
  socket     a plain request/response peer in C (bench/tcp_peer.c, built with cc on first
             use, called through ctypes): the client sends a 16-byte request, the server
             answers get with the bytes straight from the same segment (one send) or
             receives put's bytes into it and acks. No framing, no checks: what the kernel's
             tcp and memcpy allow for one connection.
  mpi-ucx    MPICH (the pip wheel) RMA over tcp: Win.Allocate on the target, Lock(SHARED),
  mpi-ofi    then Get (or Put) + Flush per operation, by rank 0 of `mpiexec -n 2` with
             MPIR_CVAR_NOLOCAL=1 (no shared memory) and UCX_TLS=tcp (ch4:ucx), or
             MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp. The target sits in MPI_Barrier (MPICH
             needs it inside MPI to progress).

For each link: 8-byte get latency (P50/P99 of single timed calls) and get/put bandwidth for
4 KiB .. 256 MiB (x4 steps; --quick: up to 16 MiB). One MPI job per netmod measures all three
contenders in the same calls (bench/tcp_parts.py): rank 0 the client, rank 1 the target that
serves ours, the socket peer and MPI's window; each repeat runs one batch of every contender,
in an order rotated from repeat to repeat, and every ratio (ours/socket, ours/MPI) is the
median of per-repeat ratios within that one job. The target sits inside MPI (a barrier) only
for MPI's batches, which need it there; for ours and the socket's it sleeps, as a memory
server does. When no netmod runs, ours and the socket are measured the same way by two plain
processes. Across namespaces (tests/netns.py's ptns0 -> ptns1 over a veth pair; needs root,
else skipped with the reason) also float32 sum allreduce on 2 ranks: collectives.allreduce
against Comm.Allreduce and a plain socket's allreduce (C code exchanges the whole input both
ways from one thread, then numpy adds), interleaved in one MPMD job per netmod (`mpiexec -n 1
ip netns exec ptns0 ... : -n 1 ip netns exec ptns1 ...`), the ratios again per job from
paired repeats.

Prints the tables with ratios (ours/socket, ours/MPI per netmod), and writes
DIR/tcp[-quick].json (every figure, the machine, which MPI netmods worked), .txt and .png.
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
from common import KiB, MiB, human_size, say  # noqa: E402

sys.path.remove(HERE)
sys.path.append(ROOT)

NETMODS = {"ucx": {"UCX_TLS": "tcp"},
           "ofi": {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}}
NS = ("ptns0", "ptns1")
NS_ADDR = ("10.77.0.1", "10.77.0.2")
RESULT = "RESULT "
LONG = 900   # seconds any helper process may take

# ---- the orchestrator ---------------------------------------------------------------------

def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="sizes up to 16 MiB, short runs")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="results folder")
    p.add_argument("--links", default="loopback,netns", help="loopback and/or netns")
    p.add_argument("--netmods", default="ucx,ofi", help="MPICH netmods to try (ucx, ofi; "
                   "'none': no MPI)")
    p.add_argument("--max-size", type=int, default=None, help="default 256 MiB (quick 16 MiB)")
    p.add_argument("--mpi-max-size", type=int, default=None, help="largest MPI transfer "
                   "(default --max-size)")
    p.add_argument("--iters", type=int, default=None, help="latency samples (default 20000)")
    p.add_argument("--target-ms", type=float, default=None, help="time per batch (default 40)")
    p.add_argument("--repeats", type=int, default=None, help="repeats per size (default 7)")
    p.add_argument("--no-allreduce", action="store_true", help="skip allreduce across netns")
    p.add_argument("--allreduce-sizes", default=None, help="allreduce sizes in bytes, comma "
                   "separated (default 4 KiB, x16 up to --max-size, at most 64 MiB)")
    p.add_argument("--ns-congestion", default=None, help="the namespaces' own tcp congestion "
                   "control for the run, which MPI's sockets follow (ours pick theirs: "
                   "POOLTENSOR_TCP_CONGESTION); default: left as it is")
    p.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    a = p.parse_args(argv)
    q = a.quick
    a.max_size = a.max_size or (16 * MiB if q else 256 * MiB)
    a.mpi_max_size = min(a.mpi_max_size or a.max_size, a.max_size)
    a.iters = a.iters or (3000 if q else 20000)
    a.target_ms = a.target_ms or (20 if q else 40)
    a.repeats = a.repeats or (3 if q else 7)
    return a


def part_args(a, sizes, secret, host):
    """The arguments of a bench/tcp_parts.py part."""
    out = ["--secret", secret, "--host", host, "--sizes", ",".join(map(str, sizes)),
           "--iters", str(a.iters), "--target-ms", str(a.target_ms), "--repeats",
           str(a.repeats), "--max-size", str(max(sizes)), "--mpi-max-size",
           str(a.mpi_max_size)]
    return out + (["-v"] if a.verbose else [])


def env_for(extra=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([ROOT] + [x for x in e.get("PYTHONPATH", "").split(
        os.pathsep) if x])
    e["PYTHONUNBUFFERED"] = "1"
    e.setdefault("OPENBLAS_NUM_THREADS", "1")    # numpy's BLAS threads would spin for nothing
    for k in ("POOLTENSOR_RANK", "POOLTENSOR_WORLD_SIZE", "POOLTENSOR_COORDINATOR",
              "POOLTENSOR_TRANSPORT"):
        e.pop(k, None)
    e.update(extra or {})
    return e


def result_of(text):
    lines = [ln for ln in text.splitlines() if ln.startswith(RESULT)]
    return json.loads(lines[-1][len(RESULT):]) if lines else None


def run_part(cmd, env=None, timeout=LONG):
    """Run a helper to the end; its RESULT, or {'error': why}."""
    try:
        p = subprocess.run(cmd, env=env_for(env), capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    res = result_of(p.stdout)
    if p.returncode != 0 or res is None:
        tail = (p.stdout + p.stderr).strip().splitlines()[-6:]
        return {"error": f"exit {p.returncode}: " + " | ".join(tail)}
    if a_verbose and p.stderr:
        sys.stderr.write(p.stderr)
    return res


a_verbose = False
PARTS = [sys.executable, os.path.join(HERE, "tcp_parts.py")]


def ns_prefix(k):
    return ["ip", "netns", "exec", NS[k]]


def run_link(a, link, sizes):
    """One MPI job per netmod, each measuring ours, the socket peer and MPI RMA together
    (tcp_parts.py); when none runs, ours and the socket peer in two plain processes."""
    far, near = (ns_prefix(1), ns_prefix(0)) if link == "netns" else ([], [])
    host = NS_ADDR[1] if link == "netns" else "127.0.0.1"
    out = {"link": link, "host": host, "jobs": {}}
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    for nm in [m for m in a.netmods.split(",") if m in NETMODS]:
        say(f"{link}: ours, socket and mpi {nm}, one job")
        me = PARTS + ["--part", "mpi"] + part_args(a, sizes, os.urandom(32).hex(), host)
        cmd = [mpiexec, "-n", "2"] + me if link == "loopback" else \
            [mpiexec, "-n", "1"] + near + me + [":", "-n", "1"] + far + me
        out["jobs"][nm] = run_part(cmd, {"MPIR_CVAR_NOLOCAL": "1", **NETMODS[nm]})
    if not any(_ok(r) for r in out["jobs"].values()):
        say(f"{link}: ours and socket, two processes")
        out["pair"] = run_pair(a, sizes, far, near, host)
    return out


def run_pair(a, sizes, far, near, host):
    """Ours against the socket peer without MPI: the target and the client as two processes."""
    args = part_args(a, sizes, os.urandom(32).hex(), host)
    srv = subprocess.Popen(far + PARTS + ["--part", "target"] + args, env=env_for(),
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while not line.startswith(RESULT) and time.monotonic() < deadline:
            line = srv.stdout.readline()
            if not line:
                break
        info = result_of(line)
        if info is None:
            return {"error": f"the target part did not start (exit {srv.poll()})"}
        res = run_part(near + PARTS + ["--part", "client", "--port", str(info["port"]),
                                       "--socket-port", str(info["socket_port"]),
                                       "--control-port", str(info["control_port"]),
                                       "--key", str(info["key"])] + args)
        if _ok(res):
            res["server_stats"] = (result_of(srv.stdout.read()) or {}).get("stats", {})
        srv.wait(30)
        return res
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait(10)


def run_allreduce(a, sizes):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    me = PARTS + ["--part", "allreduce"] + part_args(a, sizes, "00", NS_ADDR[0])
    res = {}
    for nm in [m for m in a.netmods.split(",") if m in NETMODS]:
        say(f"allreduce with mpi {nm}")
        cmd = [mpiexec, "-n", "1", "-env", "POOLTENSOR_LISTEN", NS_ADDR[0]] + ns_prefix(0) + \
            me + [":", "-n", "1", "-env", "POOLTENSOR_LISTEN", NS_ADDR[1]] + ns_prefix(1) + me
        res[nm] = run_part(cmd, {"MPIR_CVAR_NOLOCAL": "1", "POOLTENSOR_BIND": NS_ADDR[0],
                                 "POOLTENSOR_TIMEOUT": "120", **NETMODS[nm]})
    return res


# The kernel's counters that tell a disturbed run: segments sent again, and of those the ones
# the receivers reported back as duplicates (DSACK: the first copy had arrived, the resend was
# needless; the stack then undoes most of its window cut, not all of the time lost). Across
# the namespaces such needless resends come from reordering on the veth link (a sender that
# moves between CPUs queues its packets on two CPUs' backlogs): the stack takes it for loss
# and cuts its window, everyone's window alike, and a size's figures drop 2-5x (bench/tcp.md).
COUNTERS = (("Tcp", "RetransSegs"), ("TcpExt", "TCPDSACKRecvSegs"))


def tcp_counters(spaces=(None,)):
    """{counter: sum over the namespaces} from /proc/net/snmp and netstat (None: this one)."""
    got = dict.fromkeys((n for _, n in COUNTERS), 0)
    for ns in spaces:
        cmd = (["ip", "netns", "exec", ns] if ns else []) + ["cat", "/proc/net/snmp",
                                                             "/proc/net/netstat"]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        if p.returncode != 0:       # no /proc/net (not Linux): nothing to say
            return None
        lines = p.stdout.splitlines()
        for head, vals in zip(lines[::2], lines[1::2]):
            head, vals = head.split(), vals.split()
            for group, name in COUNTERS:
                if head[0] == group + ":" and name in head:
                    got[name] += int(vals[head.index(name)])
    return got


def counted(notes, what, spaces, fn, *args):
    """fn(*args), noting how many segments the kernel resent meanwhile in those namespaces."""
    c0 = tcp_counters(spaces)
    try:
        return fn(*args)
    finally:
        c1 = tcp_counters(spaces)
        if c0 and c1:
            d = {k: c1[k] - c0[k] for k in c0}
            notes.append(f"{what}: the kernel resent {d['RetransSegs']} segments, "
                         f"{d['TCPDSACKRecvSegs']} of them needlessly (reported back as "
                         f"duplicates: reordering, not loss)")


def ns_congestion(name, spaces=NS):
    """Set each namespace's default tcp congestion control to name (None: leave it); returns
    {namespace: what it was} for those changed."""
    was = {}
    if not name:
        return was
    key = "net.ipv4.tcp_congestion_control"
    for ns in spaces:
        old = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-n", key],
                             capture_output=True, text=True).stdout.strip()
        r = subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={name}"],
                           capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"cannot set {key}={name} in {ns}: {r.stderr.strip()}")
        was[ns] = old
    return was


def netns_ready():
    """(True, created) when the namespaces are up (made here if need be), else (False, why)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    try:
        import netns
    except ImportError as e:
        return False, f"tests/netns.py cannot be imported: {e}"
    finally:
        sys.path.pop(0)
    why = netns.unavailable()
    if why:
        return False, why
    try:
        return True, netns.up()
    except RuntimeError as e:
        return False, str(e)


# ---- the report ---------------------------------------------------------------------------

def _gbps(r):
    return r["gbps"] if isinstance(r, dict) and "gbps" in r else float("nan")


def _ok(r):
    return isinstance(r, dict) and "error" not in r


def _base(L):
    """(name, result) of the run whose ours and socket figures a link's tables show: the
    first MPI job that ran, else the two plain processes."""
    for nm, r in L["jobs"].items():
        if _ok(r):
            return f"mpi-{nm} job", r
    r = L.get("pair")
    return ("plain processes", r) if _ok(r) else (None, r)


def report(links, allreduce, sizes, notes):
    """The tables, and a summary dict of the headline ratios. Every ratio is the median of
    per-repeat ratios between contenders measured in the same job."""
    out, summary = [], {}
    for L in links:
        link = L["link"]
        for nm, r in L["jobs"].items():
            if not _ok(r):
                out.append(f"[{link}] the job with MPI {nm} did not run: {r.get('error')}")
        base_name, base = _base(L)
        if not _ok(base):
            out.append(f"[{link}] ours/socket did not run: {(L.get('pair') or {}).get('error')}")
            continue
        jobs = {nm: r for nm, r in L["jobs"].items() if _ok(r)}
        for op in ("get", "put"):
            head = ["size", f"ours {op}", f"socket {op}", "ours/socket"]
            for nm in jobs:
                head += [f"mpi-{nm} {op}", f"ours/mpi-{nm}"]
            rows, r_sock, r_mpi, r_best = [], [], {nm: [] for nm in jobs}, []
            for s in sizes:
                b = base["bandwidth"][str(s)]
                row = [human_size(s), _gbps(b[f"ours {op}"]), _gbps(b[f"socket {op}"]),
                       b[f"ours/socket {op}"]]
                best = None
                for nm, r in jobs.items():
                    m = r["bandwidth"][str(s)]
                    if f"mpi {op}" in m:
                        row += [_gbps(m[f"mpi {op}"]), m[f"ours/mpi {op}"]]
                        r_mpi[nm].append((s, m[f"ours/mpi {op}"]))
                        if best is None or _gbps(m[f"mpi {op}"]) > best[0]:
                            best = (_gbps(m[f"mpi {op}"]), m[f"ours/mpi {op}"])
                    else:
                        row += [float("nan"), float("nan")]
                if best is not None:
                    r_best.append((s, best[1]))
                if s >= MiB:
                    r_sock.append(b[f"ours/socket {op}"])
                rows.append(row)
            out.append(f"\n[{link}] {op} bandwidth, GB/s; ratios > 1: ours faster (each from "
                       f"paired repeats in one job; ours and socket shown from the {base_name})")
            out.append(common.format_table(head, rows))
            summary[f"{link} {op}: ours/socket, geomean >= 1 MiB"] = common.geomean(r_sock)
            for nm, rs in r_mpi.items():
                if rs:
                    summary[f"{link} {op}: ours/mpi-{nm} (same job), geomean"] = \
                        common.geomean(r for _, r in rs)
            if r_best:
                summary[f"{link} {op}: ours/best MPI RMA, geomean"] = common.geomean(
                    r for _, r in r_best)
                summary[f"{link} {op}: ours/best MPI RMA, geomean >= 1 MiB"] = common.geomean(
                    r for s, r in r_best if s >= MiB)
        lat = [[f"{w} ({base_name})", base["latency_ns"][f"{w} get"]] for w in ("ours", "socket")]
        for nm, r in jobs.items():
            if r is not base:
                lat.append([f"ours (mpi-{nm} job)", r["latency_ns"]["ours get"]])
            lat.append([f"mpi-{nm} Get+Flush", r["latency_ns"]["mpi get"]])
        out.append(f"\n[{link}] 8-byte get latency, microseconds")
        out.append(common.format_table(["who", "P50", "P99", "mean (loop)"], [
            [w, x["p50"] / 1e3, x["p99"] / 1e3, x["loop_mean"] / 1e3] for w, x in lat]))
        summary[f"{link} 8 B get P50 us: ours, socket"] = [
            round(base["latency_ns"]["ours get"]["p50"] / 1e3, 2),
            round(base["latency_ns"]["socket get"]["p50"] / 1e3, 2)]
    if allreduce:
        ok = {nm: r for nm, r in allreduce.items() if _ok(r)}
        for nm, r in allreduce.items():
            if not _ok(r):
                out.append(f"[netns] allreduce with MPI {nm} did not run: {r.get('error')}")
        if ok:
            first = next(iter(ok.values()))["allreduce"]
            head = ["size"]
            for nm in ok:
                head += [f"ours ms ({nm} job)", f"mpi-{nm} ms", f"ours/mpi-{nm}"]
            rows = []
            for s in sorted(first, key=int):
                row = [human_size(int(s))]
                for r in ok.values():
                    x = r["allreduce"][s]
                    row += [x["ours"]["seconds"] * 1e3, x["mpi"]["seconds"] * 1e3,
                            x["ours/mpi time"]]
                rows.append(row)
            out.append("\n[netns] float32 sum allreduce, 2 ranks (ptns0, ptns1), ms per call "
                       "(time ratio from paired repeats in one job: < 1 is ours faster)")
            out.append(common.format_table(head, rows))
            for j, nm in enumerate(ok):
                summary[f"netns allreduce: ours/mpi-{nm} time, geomean"] = common.geomean(
                    row[3 + 3 * j] for row in rows)
            if all("socket" in x for r in ok.values() for x in r["allreduce"].values()):
                out.append(socket_table(ok, first, summary))
    out.append("")
    out += notes
    out.append("\nsummary (aims at >= 1 MiB: get/put ours/socket >= 1.0 on loopback, ours/MPI "
               "RMA >= 1.5; allreduce ours/the better MPI time <= 1.0 at every size, <= 0.7 "
               "from 1 MiB):")
    out += [f"  {k}: {v:.2f}" if isinstance(v, float) else f"  {k}: {v}"
            for k, v in summary.items()]
    return "\n".join(out), summary


def socket_table(ok, first, summary):
    """The allreduce against a plain socket's (the whole input exchanged by C code, then
    numpy's add): what ours and MPI's add to, or save on, the simplest exchange of the same
    bytes (two ranks: no algorithm moves fewer)."""
    head = ["size"]
    for nm in ok:
        head += [f"socket ms ({nm} job)", "ours/socket", f"mpi-{nm}/socket"]
    rows = []
    for s in sorted(first, key=int):
        row = [human_size(int(s))]
        for r in ok.values():
            x = r["allreduce"][s]
            row += [x["socket"]["seconds"] * 1e3, x["ours/socket time"], x["mpi/socket time"]]
        rows.append(row)
    big = [i for i, s in enumerate(sorted(first, key=int)) if int(s) >= 1 << 20]
    for j, nm in enumerate(ok):
        if big:
            summary[f"netns allreduce >= 1 MiB: mpi-{nm}/socket time, geomean"] = \
                common.geomean(rows[i][3 + 3 * j] for i in big)
    return ("\n[netns] the same allreduce by a plain socket (C code exchanges the whole input "
            "both ways at once from one thread, then numpy adds), ms per call, and time "
            "ratios to it from paired repeats (< 1: faster than the plain socket)\n" +
            common.format_table(head, rows))


def plot(path, links, allreduce, sizes, title):
    """A grid: get and put bandwidth per link, allreduce across namespaces, latency bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels, lat = [], {}
    tag = {"loopback": "lo", "netns": "ns"}
    for L in links:
        _, base = _base(L)
        if base is None:
            continue
        bw = base["bandwidth"]
        jobs = {nm: r for nm, r in L["jobs"].items() if _ok(r)}
        for op in ("get", "put"):
            lines = {"ours": (sizes, [_gbps(bw[str(s)][f"ours {op}"]) for s in sizes]),
                     "socket (C)": (sizes, [_gbps(bw[str(s)][f"socket {op}"]) for s in sizes])}
            for nm, r in jobs.items():
                ss = [s for s in sizes if f"mpi {op}" in r["bandwidth"][str(s)]]
                lines[f"MPI RMA {nm}"] = (ss, [_gbps(r["bandwidth"][str(s)][f"mpi {op}"])
                                               for s in ss])
            panels.append((f"{L['link']}: {op} bandwidth", "GB/s", lines))
        t = tag[L["link"]]
        lat[f"ours {t}"] = base["latency_ns"]["ours get"]
        lat[f"socket {t}"] = base["latency_ns"]["socket get"]
        for nm, r in jobs.items():
            lat[f"{nm} {t}"] = r["latency_ns"]["mpi get"]
    if allreduce and any(_ok(r) for r in allreduce.values()):
        lines = {}
        for nm, r in allreduce.items():
            if _ok(r):
                ss = sorted(r["allreduce"], key=int)
                lines[f"ours (mpi-{nm} job)"] = ([int(s) for s in ss], [
                    r["allreduce"][s]["ours"]["algbw_gbps"] for s in ss])
                lines[f"MPI {nm} Allreduce"] = ([int(s) for s in ss], [
                    r["allreduce"][s]["mpi"]["algbw_gbps"] for s in ss])
                if all("socket" in r["allreduce"][s] for s in ss):
                    lines[f"plain socket ({nm} job)"] = ([int(s) for s in ss], [
                        r["allreduce"][s]["socket"]["algbw_gbps"] for s in ss])
        panels.append(("netns: allreduce, 2 ranks", "algbw GB/s", lines))
    if not panels:
        return
    n = len(panels) + (1 if lat else 0)
    fig, axes = plt.subplots((n + 1) // 2, 2, figsize=(13, 4.2 * ((n + 1) // 2)),
                             squeeze=False)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {}
    for k, (ptitle, ylabel, series) in enumerate(panels):
        # every label with "ours" in it starts with it, so common's solid/dashed rule holds
        common.line_panel(axes[k // 2][k % 2], ptitle, ylabel, series, colors, cycle,
                          xlabel="bytes")
    k = len(panels)
    if lat:
        ax = axes[k // 2][k % 2]
        labels = list(lat)
        xs = np.arange(len(labels))
        for j, (q, name) in enumerate((("p50", "P50"), ("p99", "P99"))):
            ax.bar(xs + (j - 0.5) * 0.38, [lat[x][q] / 1e3 for x in labels], 0.38, label=name)
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("microseconds")
        ax.set_title("8-byte get latency (lo: loopback, ns: namespaces)", fontsize=10)
        ax.legend(fontsize=7)
        k += 1
    for j in range(k, axes.size):
        axes[j // 2][j % 2].axis("off")
    common.save_figure(fig, path, title, dpi=100)


def main(argv=None):
    global a_verbose
    a = parse(argv)
    common.VERBOSE = a_verbose = a.verbose
    t0 = time.monotonic()
    load0 = os.getloadavg()
    sizes = common.sizes(4 * KiB, a.max_size, 4)
    ar_sizes = ([int(x) for x in a.allreduce_sizes.split(",") if x] if a.allreduce_sizes
                else common.sizes(4 * KiB, min(a.max_size, 64 * MiB), 16))
    notes, links = [], []
    want = [x for x in a.links.split(",") if x]
    netns_ok = False
    if "netns" in want:
        netns_ok, why = netns_ready()
        if not netns_ok:
            notes.append(f"netns: skipped ({why})")
            print(notes[-1], flush=True)
            want.remove("netns")
    before = ns_congestion(a.ns_congestion) if netns_ok else {}
    try:
        if before:
            notes.append("namespaces' congestion control (MPI's sockets): "
                         f"{a.ns_congestion}, was {', '.join(sorted(set(before.values())))}")
        for link in want:
            print(f"measuring {link} ...", flush=True)
            spaces = NS if link == "netns" else (None,)
            links.append(counted(notes, link, spaces, run_link, a, link, sizes))
        allreduce = None
        if netns_ok and not a.no_allreduce and a.netmods != "none":
            print("measuring allreduce across namespaces ...", flush=True)
            allreduce = counted(notes, "allreduce across namespaces", NS, run_allreduce,
                                a, ar_sizes)
    finally:
        for ns, cc in before.items():
            ns_congestion(cc, [ns])
    text, summary = report(links, allreduce, sizes, notes)
    load1 = os.getloadavg()
    text += (f"\n\nmeasuring took {time.monotonic() - t0:.0f} s; load average {load0[0]:.2f} at "
             f"start, {load1[0]:.2f} at end, on {os.cpu_count()} CPUs")
    print(text, flush=True)
    name = "tcp-quick" if a.quick else "tcp"
    info = common.machine_info(loadavg_start=load0, loadavg_end=load1, env={
        k: v for k, v in os.environ.items() if k.startswith(("POOLTENSOR_", "UCX_", "FI_"))})
    config = {k: v for k, v in vars(a).items() if k not in ("out", "verbose")}
    base = os.path.join(a.out, name)
    common.write_json(base + ".json", {"benchmark": "tcp", "config": config, "machine": info,
                                       "sizes": sizes, "links": links,
                                       "allreduce_netns": allreduce, "summary": summary,
                                       "notes": notes, "table": text})
    with open(base + ".txt", "w") as f:
        f.write(text + "\n")
    plot(base + ".png", links, allreduce, sizes,
         f"tcp transport ({info['cpu_model']}, {info['cpu_count']} CPUs)")
    print(f"\nwrote {base}.{{json,txt,png}}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
