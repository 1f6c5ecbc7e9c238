"""The tcp transport: one-sided get/put against a plain socket and MPICH's RMA, on loopback and
across network namespaces; allreduce across namespaces against MPI's.

    python bench/tcp.py [--quick] [--out DIR] [--links loopback,netns] [--netmods ucx,ofi]

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
4 KiB .. 256 MiB (x4 steps; --quick: up to 16 MiB). Ours and the socket run in one process,
interleaved (each repeat runs one batch of each in turn), and their ratio is the median of
per-repeat ratios; MPI runs in its own job right after. Across namespaces (tests/netns.py's
ptns0 -> ptns1 over a veth pair; needs root, else skipped with the reason) also float32 sum
allreduce on 2 ranks: collectives.allreduce against Comm.Allreduce, timed in the same MPMD
job (`mpiexec -n 1 ip netns exec ptns0 ... : -n 1 ip netns exec ptns1 ...`).

Prints the tables with ratios (ours/socket, ours/best MPI), and writes DIR/tcp[-quick].json
(every figure, the machine, which MPI netmods worked), .txt and .png.
"""
import argparse
import ctypes
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
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

PEER_C = os.path.join(HERE, "tcp_peer.c")


def peer_lib():
    """The C socket peer (bench/tcp_peer.c), built once per source version (cc -O2) into the
    temp folder."""
    with open(PEER_C, "rb") as f:
        tag = hashlib.sha1(f.read()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"pooltensor-bench-tcp-peer-{tag}.so")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        subprocess.run([os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-pthread",
                        PEER_C, "-o", tmp], check=True, timeout=120)
        os.replace(tmp, path)
    lib = ctypes.CDLL(path)
    for name, args in {"pp_listen": [ctypes.c_char_p, ctypes.c_int], "pp_port": [ctypes.c_int],
                       "pp_serve": [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t],
                       "pp_connect": [ctypes.c_char_p, ctypes.c_int],
                       "pp_get": [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t],
                       "pp_put": [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]}.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    return lib


def pattern(n):
    """Bytes i % 251 (the server fills its segment so; the client checks what it reads)."""
    return np.resize(np.arange(251, dtype=np.uint8), n)


def emit(obj):
    print(RESULT + json.dumps(obj), flush=True)


# ---- the parts, each run in its own process -----------------------------------------------

def part_server(a):
    """Serve one segment both ways (ours and the C peer); print the ports; run until stdin
    closes."""
    from collectives import _native
    seg = _native.Segment(a.max_size)
    arr = np.frombuffer(memoryview(seg), np.uint8)
    arr[:] = pattern(a.max_size)
    ctx = _native.Context(0, 1)
    ctx.set_secret(bytes.fromhex(a.secret))
    ctx.add_segment(seg)
    key = ctx.register(memoryview(seg), 3)
    port = ctx.listen(a.host, 0)
    lib = peer_lib()
    lfd = lib.pp_listen(a.host.encode(), 0)
    if lfd < 0:
        raise SystemExit(f"socket peer: cannot listen on {a.host}")
    threading.Thread(target=lib.pp_serve, args=(lfd, seg.address, a.max_size),
                     daemon=True).start()
    emit({"port": port, "key": key, "socket_port": lib.pp_port(lfd)})
    sys.stdin.read()          # until the orchestrator closes our stdin
    emit({"stats": ctx.tcp_stats()})
    ctx.close()


def part_client(a):
    """Ours against the socket peer: latency, then bandwidth per size (interleaved)."""
    from collectives import _native
    ctx = _native.Context(1, 2)
    ctx.set_secret(bytes.fromhex(a.secret))
    ctx.set_timeout(120)
    ctx.connect_tcp(0, a.host, a.port)
    ctx.tcp_open(0)
    lib = peer_lib()
    fd = lib.pp_connect(a.host.encode(), a.socket_port)
    if fd < 0:
        raise SystemExit(f"socket peer: cannot connect to {a.host}:{a.socket_port}")
    sizes = [int(s) for s in a.sizes.split(",")]
    dst = common.touch(np.empty(max(sizes), np.uint8), 0)
    src = common.touch(np.empty(max(sizes), np.uint8), 7)
    ref = pattern(max(sizes))
    key, dptr, sptr = a.key, dst.ctypes.data, src.ctypes.data
    for n in sizes:     # both read the right bytes (before any put changes them)
        dst[:n] = 0
        ctx.get(0, key, 0, dst[:n])
        ok1 = np.array_equal(dst[:n], ref[:n])
        dst[:n] = 0
        lib.pp_get(fd, dptr, n)
        if not (ok1 and np.array_equal(dst[:n], ref[:n])):
            raise SystemExit(f"wrong bytes read at {n} B (ours ok: {ok1})")
    d8 = dst[:8]
    say("latency")
    lat = common.latencies({"ours get": lambda: ctx.get(0, key, 0, d8),
                            "socket get": lambda: lib.pp_get(fd, dptr, 8)}, a.iters,
                           warmup=min(1000, a.iters))
    bw = {}
    for n in sizes:
        say("bandwidth", human_size(n))
        dn, sn = dst[:n], src[:n]
        bw[n] = common.bandwidths({
            "ours get": lambda: ctx.get(0, key, 0, dn),
            "socket get": lambda: lib.pp_get(fd, dptr, n),
            "ours put": lambda: ctx.put(0, key, 0, sn),
            "socket put": lambda: lib.pp_put(fd, sptr, n)},
            n, target_s=a.target_ms / 1e3, repeats=a.repeats)
        for op in ("get", "put"):
            bw[n][f"ratio {op}"] = common.paired_ratio(bw[n][f"ours {op}"],
                                                       bw[n][f"socket {op}"])
    ctx.close()
    emit({"latency_ns": lat, "bandwidth": {str(n): v for n, v in bw.items()}})


def part_mpi_rma(a):
    """Under mpiexec -n 2: rank 0 gets/puts rank 1's window (passive target)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    sizes = [int(s) for s in a.sizes.split(",")]
    big = max(sizes)
    win = MPI.Win.Allocate(big if comm.rank == 1 else 0, 1, comm=comm)
    if comm.rank == 1:
        np.frombuffer(win.tomemory(), np.uint8)[:] = pattern(big)
    comm.Barrier()
    if comm.rank == 0:
        buf = common.touch(np.empty(big, np.uint8), 0)

        def get(n):
            win.Get([buf, n, MPI.BYTE], 1, [0, n, MPI.BYTE])
            win.Flush(1)

        def put(n):
            win.Put([buf, n, MPI.BYTE], 1, [0, n, MPI.BYTE])
            win.Flush(1)

        win.Lock(1, MPI.LOCK_SHARED)
        get(big)
        if not np.array_equal(buf, pattern(big)):
            raise SystemExit("MPI Get read wrong bytes")
        lat = common.latency(lambda: get(8), a.iters, warmup=min(1000, a.iters))
        bw = {}
        for n in sizes:
            say("mpi bandwidth", human_size(n))
            bw[str(n)] = common.bandwidths({"get": lambda: get(n), "put": lambda: put(n)}, n,
                                           target_s=a.target_ms / 1e3, repeats=a.repeats)
        win.Unlock(1)
        emit({"latency_ns": lat, "bandwidth": bw,
              "library": MPI.Get_library_version().splitlines()[0].strip()})
    comm.Barrier()      # rank 1 waits here, inside MPI, the whole time
    win.Free()


def part_allreduce(a):
    """Under an MPMD mpiexec across namespaces: collectives.allreduce and Comm.Allreduce,
    interleaved, each batch after a barrier; a call's time is the slowest rank's."""
    from mpi4py import MPI
    import collectives
    comm = MPI.COMM_WORLD
    world = collectives.init()
    sizes = [int(s) for s in a.sizes.split(",")]
    x = np.ones(max(sizes) // 4, np.float32)
    y = np.empty_like(x)
    res = {}
    for nbytes in sizes:
        n = nbytes // 4
        xs, ys = x[:n], y[:n]
        ops = {"ours": lambda: collectives.allreduce(xs, out=ys),
               "mpi": lambda: comm.Allreduce(xs, ys)}
        for name, op in ops.items():
            ys[:] = 0
            op()
            if not (ys == world.size).all():
                raise SystemExit(f"{name} allreduce of {nbytes} B gave wrong values")
        calls = {}
        for name, op in ops.items():     # calls per batch: about target_ms, slowest rank
            comm.Barrier()
            t0 = time.perf_counter()
            op()
            one = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            calls[name] = max(1, min(10000, int(a.target_ms / 1e3 / max(one, 1e-7))))
        per = {name: [] for name in ops}
        for r in range(a.repeats):
            for name, op in (list(ops.items())[r % 2:] + list(ops.items())[:r % 2]):
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(calls[name]):
                    op()
                el = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                per[name].append(el / calls[name])
        res[str(nbytes)] = {name: {"seconds": float(np.median(v)), "repeats": v,
                                   "calls": calls[name],
                                   "algbw_gbps": nbytes / float(np.median(v)) / 1e9}
                            for name, v in per.items()}
        say("allreduce", human_size(nbytes), res[str(nbytes)]["ours"]["seconds"])
    if comm.rank == 0:
        emit({"allreduce": res, "transports": world.transports})
    world.barrier()


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
    p.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)
    for k in ("secret", "host", "sizes"):
        p.add_argument("--" + k, default=None, help=argparse.SUPPRESS)
    for k in ("port", "socket_port", "key"):
        p.add_argument("--" + k.replace("_", "-"), type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    q = a.quick
    a.max_size = a.max_size or (16 * MiB if q else 256 * MiB)
    a.mpi_max_size = min(a.mpi_max_size or a.max_size, a.max_size)
    a.iters = a.iters or (3000 if q else 20000)
    a.target_ms = a.target_ms or (20 if q else 40)
    a.repeats = a.repeats or (3 if q else 7)
    return a


def part_args(a, sizes):
    out = ["--sizes", ",".join(map(str, sizes)), "--iters", str(a.iters),
           "--target-ms", str(a.target_ms), "--repeats", str(a.repeats),
           "--max-size", str(max(sizes))]
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
ME = [sys.executable, os.path.abspath(__file__)]


def ns_prefix(k):
    return ["ip", "netns", "exec", NS[k]]


def run_link(a, link, sizes, mpi_sizes):
    """Ours and the socket peer (client in one process, server in another), then MPI RMA."""
    secret = os.urandom(32).hex()
    far, near = (ns_prefix(1), ns_prefix(0)) if link == "netns" else ([], [])
    host = NS_ADDR[1] if link == "netns" else "127.0.0.1"
    out = {"link": link, "host": host}
    srv = subprocess.Popen(far + ME + ["--part", "server", "--secret", secret, "--host", host,
                                       "--max-size", str(max(sizes))],
                           env=env_for(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
    try:
        line = ""
        deadline = time.monotonic() + 60
        while not line.startswith(RESULT) and time.monotonic() < deadline:
            line = srv.stdout.readline()
            if not line:
                break
        info = result_of(line)
        if info is None:
            raise SystemExit(f"{link}: the server part did not start (exit {srv.poll()})")
        say(f"{link}: ours and socket")
        out["ours_socket"] = run_part(near + ME + [
            "--part", "client", "--secret", secret, "--host", host, "--port", str(info["port"]),
            "--socket-port", str(info["socket_port"]), "--key", str(info["key"])]
            + part_args(a, sizes))
        srv.stdin.close()
        out["server_stats"] = result_of(srv.stdout.read()) or {}
        srv.wait(30)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.wait(10)
    out["mpi"] = {}
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    for nm in [m for m in a.netmods.split(",") if m in NETMODS]:
        say(f"{link}: mpi {nm}")
        me = ME + ["--part", "mpi-rma"] + part_args(a, mpi_sizes)
        cmd = [mpiexec, "-n", "2"] + me if link == "loopback" else \
            [mpiexec, "-n", "1"] + ns_prefix(0) + me + [":", "-n", "1"] + ns_prefix(1) + me
        out["mpi"][nm] = run_part(cmd, {"MPIR_CVAR_NOLOCAL": "1", **NETMODS[nm]})
    return out


def run_allreduce(a, sizes):
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    me = ME + ["--part", "allreduce"] + part_args(a, sizes)
    res = {}
    for nm in [m for m in a.netmods.split(",") if m in NETMODS]:
        say(f"allreduce with mpi {nm}")
        cmd = [mpiexec, "-n", "1", "-env", "POOLTENSOR_LISTEN", NS_ADDR[0]] + ns_prefix(0) + \
            me + [":", "-n", "1", "-env", "POOLTENSOR_LISTEN", NS_ADDR[1]] + ns_prefix(1) + me
        res[nm] = run_part(cmd, {"MPIR_CVAR_NOLOCAL": "1", "POOLTENSOR_BIND": NS_ADDR[0],
                                 "POOLTENSOR_TIMEOUT": "120", **NETMODS[nm]})
    return res


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


def report(links, allreduce, sizes, notes):
    """The tables, and a summary dict of the headline ratios."""
    out, summary = [], {}
    for L in links:
        link, os_ = L["link"], L["ours_socket"]
        if not _ok(os_):
            out.append(f"[{link}] ours/socket did not run: {os_.get('error')}")
            continue
        mpi = {nm: r for nm, r in L["mpi"].items() if _ok(r)}
        for nm, r in L["mpi"].items():
            if not _ok(r):
                out.append(f"[{link}] MPI {nm} did not run: {r.get('error')}")
        bw = os_["bandwidth"]
        for op in ("get", "put"):
            head = ["size", f"ours {op}", f"socket {op}", "ours/socket"] + \
                [f"mpi-{nm} {op}" for nm in mpi] + (["ours/best MPI"] if mpi else [])
            rows, r_sock, r_mpi = [], [], []
            for s in sizes:
                b = bw[str(s)]
                row = [human_size(s), _gbps(b[f"ours {op}"]), _gbps(b[f"socket {op}"]),
                       b[f"ratio {op}"]]
                best = max([_gbps(m["bandwidth"].get(str(s), {}).get(op)) for m in
                            mpi.values()] or [float("nan")])
                row += [_gbps(m["bandwidth"].get(str(s), {}).get(op)) for m in mpi.values()]
                if mpi:
                    row.append(_gbps(b[f"ours {op}"]) / best if best == best else float("nan"))
                    if best == best:
                        r_mpi.append((s, row[-1]))
                if s >= MiB:
                    r_sock.append(b[f"ratio {op}"])
                rows.append(row)
            out.append(f"\n[{link}] {op} bandwidth, GB/s (ratio: > 1 is ours faster)")
            out.append(common.format_table(head, rows))
            summary[f"{link} {op}: ours/socket, geomean >= 1 MiB"] = common.geomean(r_sock)
            if r_mpi:
                summary[f"{link} {op}: ours/best MPI RMA, geomean"] = common.geomean(
                    r for _, r in r_mpi)
                summary[f"{link} {op}: ours/best MPI RMA, geomean >= 1 MiB"] = common.geomean(
                    r for s, r in r_mpi if s >= MiB)
        lat = [["ours get", os_["latency_ns"]["ours get"]],
               ["socket get", os_["latency_ns"]["socket get"]]] + \
            [[f"mpi-{nm} Get+Flush", r["latency_ns"]] for nm, r in mpi.items()]
        out.append(f"\n[{link}] 8-byte get latency, microseconds")
        out.append(common.format_table(["who", "P50", "P99", "mean (loop)"], [
            [w, x["p50"] / 1e3, x["p99"] / 1e3, x["loop_mean"] / 1e3] for w, x in lat]))
        summary[f"{link} 8 B get P50 us: ours, socket"] = [
            round(os_["latency_ns"]["ours get"]["p50"] / 1e3, 2),
            round(os_["latency_ns"]["socket get"]["p50"] / 1e3, 2)]
    if allreduce:
        ok = {nm: r for nm, r in allreduce.items() if _ok(r)}
        for nm, r in allreduce.items():
            if not _ok(r):
                out.append(f"[netns] allreduce with MPI {nm} did not run: {r.get('error')}")
        if ok:
            first = next(iter(ok.values()))["allreduce"]
            head = ["size", "ours ms"] + [f"mpi-{nm} ms" for nm in ok] + \
                [f"ours/mpi-{nm} (time)" for nm in ok]
            rows = []
            for s in sorted(first, key=int):
                ours = min(r["allreduce"][s]["ours"]["seconds"] for r in ok.values())
                m = [r["allreduce"][s]["mpi"]["seconds"] for r in ok.values()]
                rows.append([human_size(int(s)), ours * 1e3] + [x * 1e3 for x in m] +
                            [ours / x for x in m])
            out.append("\n[netns] float32 sum allreduce, 2 ranks (ptns0, ptns1), ms per call "
                       "(time ratio: < 1 is ours faster)")
            out.append(common.format_table(head, rows))
            for j, nm in enumerate(ok):
                summary[f"netns allreduce: ours/mpi-{nm} time, geomean"] = common.geomean(
                    row[2 + len(ok) + j] for row in rows)
    out.append("")
    out += notes
    out.append("\nsummary (aims: ours/socket >= 0.8, ours/MPI RMA >= 1.5):")
    out += [f"  {k}: {v:.2f}" if isinstance(v, float) else f"  {k}: {v}"
            for k, v in summary.items()]
    return "\n".join(out), summary


def plot(path, links, allreduce, sizes, title):
    """A grid: get and put bandwidth per link, allreduce across namespaces, latency bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels, lat = [], {}
    tag = {"loopback": "lo", "netns": "ns"}
    for L in links:
        if not _ok(L["ours_socket"]):
            continue
        bw = L["ours_socket"]["bandwidth"]
        for op in ("get", "put"):
            lines = {"ours": (sizes, [_gbps(bw[str(s)][f"ours {op}"]) for s in sizes]),
                     "socket (C)": (sizes, [_gbps(bw[str(s)][f"socket {op}"]) for s in sizes])}
            for nm, r in L["mpi"].items():
                if _ok(r):
                    ss = [s for s in sizes if str(s) in r["bandwidth"]]
                    lines[f"MPI RMA {nm}"] = (ss, [_gbps(r["bandwidth"][str(s)][op])
                                                   for s in ss])
            panels.append((f"{L['link']}: {op} bandwidth", "GB/s", lines))
        t = tag[L["link"]]
        lat[f"ours {t}"] = L["ours_socket"]["latency_ns"]["ours get"]
        lat[f"socket {t}"] = L["ours_socket"]["latency_ns"]["socket get"]
        for nm, r in L["mpi"].items():
            if _ok(r):
                lat[f"{nm} {t}"] = r["latency_ns"]
    if allreduce and any(_ok(r) for r in allreduce.values()):
        lines = {}
        for nm, r in allreduce.items():
            if _ok(r):
                ss = sorted(r["allreduce"], key=int)
                lines[f"ours (run with {nm})"] = ([int(s) for s in ss], [
                    r["allreduce"][s]["ours"]["algbw_gbps"] for s in ss])
                lines[f"MPI {nm} Allreduce"] = ([int(s) for s in ss], [
                    r["allreduce"][s]["mpi"]["algbw_gbps"] for s in ss])
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
    if a.part:
        return {"server": part_server, "client": part_client, "mpi-rma": part_mpi_rma,
                "allreduce": part_allreduce}[a.part](a)
    t0 = time.monotonic()
    load0 = os.getloadavg()
    sizes = common.sizes(4 * KiB, a.max_size, 4)
    mpi_sizes = [s for s in sizes if s <= a.mpi_max_size]
    ar_sizes = [s for s in common.sizes(4 * KiB, min(a.max_size, 64 * MiB), 16)]
    notes, links = [], []
    want = [x for x in a.links.split(",") if x]
    netns_ok = False
    if "netns" in want:
        netns_ok, why = netns_ready()
        if not netns_ok:
            notes.append(f"netns: skipped ({why})")
            print(notes[-1], flush=True)
            want.remove("netns")
    for link in want:
        print(f"measuring {link} ...", flush=True)
        links.append(run_link(a, link, sizes, mpi_sizes))
    allreduce = None
    if netns_ok and not a.no_allreduce and a.netmods != "none":
        print("measuring allreduce across namespaces ...", flush=True)
        allreduce = run_allreduce(a, ar_sizes)
    text, summary = report(links, allreduce, sizes, notes)
    load1 = os.getloadavg()
    text += (f"\n\nmeasuring took {time.monotonic() - t0:.0f} s; load average {load0[0]:.2f} at "
             f"start, {load1[0]:.2f} at end, on {os.cpu_count()} CPUs")
    print(text, flush=True)
    name = "tcp-quick" if a.quick else "tcp"
    info = common.machine_info(loadavg_start=load0, loadavg_end=load1, env={
        k: v for k, v in os.environ.items() if k.startswith(("POOLTENSOR_", "UCX_", "FI_"))})
    config = {k: v for k, v in vars(a).items() if k not in ("out", "verbose", "part", "secret",
                                                            "host", "sizes", "port", "key",
                                                            "socket_port")}
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
