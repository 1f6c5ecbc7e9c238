"""The processes bench/tcp.py runs, one part each (``python bench/tcp_parts.py --part NAME``).

  mpi        an MPI job of two ranks (``mpiexec -n 2``, or one rank in each network namespace):
             rank 1 is the target (part_target), rank 0 the client (part_client), and every
             contender (ours, the C socket peer, MPI RMA) is measured by rank 0 in the same
             calls of common.latencies / common.bandwidths: interleaved batch by batch, in an
             order rotated from repeat to repeat, against the same target process.
  target,    the same two roles as two plain processes, with no MPI (when no MPI netmod runs):
  client     ours against the socket peer only.
  allreduce  an MPMD job across namespaces: collectives.allreduce, Comm.Allreduce and a plain
             socket's allreduce.

How the target takes part. Ours and the socket peer are served by threads of the target
process (our native server threads; the C peer's thread), its Python asleep meanwhile in a
blocking read of a control socket, as a memory server would be. MPI RMA over tcp needs the
target inside MPI to progress, so for each stretch of MPI's calls (warmup, calibration, each
batch; common's `around` hook) rank 0 asks rank 1 over the control socket to enter an
MPI_Barrier, waits for its word that it is going in, runs the stretch, and leaves the barrier
with it. Each contender thus sees the target as it needs it, and no more: a target spinning
inside MPI while ours is timed would take a core from our server threads.
"""
import argparse
import contextlib
import ctypes
import json
import os
import socket
import sys
import threading
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

RESULT = "RESULT "
PEER_C = os.path.join(HERE, "tcp_peer.c")


def peer_lib():
    """The C socket peer (bench/tcp_peer.c), built once per source version (cc -O2)."""
    path = common.built("tcp-peer", [PEER_C], ["-O2", "-fPIC", "-pthread"], shared=True)
    lib = ctypes.CDLL(path)
    for name, args in {"pp_listen": [ctypes.c_char_p, ctypes.c_int], "pp_port": [ctypes.c_int],
                       "pp_serve": [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t],
                       "pp_connect": [ctypes.c_char_p, ctypes.c_int],
                       "pp_get": [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t],
                       "pp_put": [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t],
                       "pp_accept": [ctypes.c_int],
                       "pp_exchange": [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                       ctypes.c_size_t]}.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    return lib


def pattern(n):
    """Bytes i % 251 (the target fills its memory so; the client checks what it reads)."""
    return np.resize(np.arange(251, dtype=np.uint8), n)


def emit(obj):
    print(RESULT + json.dumps(obj), flush=True)


# ---- the target ------------------------------------------------------------------------------

def part_target(a, comm=None, win=None):
    """Serve one segment over ours and the socket peer (and MPI's window `win`); publish the
    ports (MPI: to rank 0; else on stdout); then follow the client's words on the control
    socket: b"m" enter an MPI_Barrier (MPI's stretch), b"q" or its close: done."""
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
    ls = socket.create_server((a.host, 0))
    info = {"port": port, "key": key, "socket_port": lib.pp_port(lfd),
            "control_port": ls.getsockname()[1]}
    if comm is not None:
        comm.bcast(info, root=1)
    else:
        emit(info)
    ls.settimeout(120)
    conn, _ = ls.accept()
    conn.settimeout(None)
    while True:
        word = conn.recv(1)
        if word != b"m":
            break
        conn.sendall(b"k")
        comm.Barrier()                  # inside MPI until rank 0's stretch of MPI calls ends
    conn.close()
    stats = ctx.tcp_stats()
    if comm is not None:
        comm.send(stats, dest=0)
        win.Free()
    else:
        emit({"stats": stats})
    ctx.close()


# ---- the client ------------------------------------------------------------------------------

def part_client(a, comm=None, win=None, info=None):
    """Rank 0's measurements: 8-byte get latency and get/put bandwidth per size, every
    contender in the same interleaved calls (see the module docstring)."""
    from collectives import _native
    info = info or {"port": a.port, "key": a.key, "socket_port": a.socket_port,
                    "control_port": a.control_port}
    ctx = _native.Context(1, 2)
    ctx.set_secret(bytes.fromhex(a.secret))
    ctx.set_timeout(120)
    ctx.connect_tcp(0, a.host, info["port"])
    ctx.tcp_open(0)
    lib = peer_lib()
    fd = lib.pp_connect(a.host.encode(), info["socket_port"])
    if fd < 0:
        raise SystemExit(f"socket peer: cannot connect to {a.host}:{info['socket_port']}")
    ctl = socket.create_connection((a.host, info["control_port"]), timeout=120)

    @contextlib.contextmanager
    def around(name):
        """MPI's stretches run with the target inside MPI_Barrier, the others without."""
        if not name.startswith("mpi"):
            yield
            return
        ctl.sendall(b"m")
        if ctl.recv(1) != b"k":
            raise SystemExit("the target did not answer on the control socket")
        try:
            yield
        finally:
            comm.Barrier()

    sizes = [int(s) for s in a.sizes.split(",")]
    big = max(sizes)
    dst = common.touch(np.empty(big, np.uint8), 0)
    src = common.touch(np.empty(big, np.uint8), 7)
    ref = pattern(big)
    key, dptr, sptr = info["key"], dst.ctypes.data, src.ctypes.data
    mpi = {}
    if win is not None:
        from mpi4py import MPI

        def flushed(op, buf, n):
            """op (Get or Put) of n bytes at offset 0, then Flush(1): one completed call."""
            local, target = [buf, n, MPI.BYTE], [0, n, MPI.BYTE]

            def call():
                op(local, 1, target)
                win.Flush(1)
            return call
        with around("mpi lock"):           # taking the lock needs the target inside MPI
            win.Lock(1, MPI.LOCK_SHARED)
            flushed(win.Get, dst, big)()
            if not np.array_equal(dst, ref):
                raise SystemExit("MPI Get read wrong bytes")
        mpi = {"get": lambda n: flushed(win.Get, dst, n), "put": lambda n: flushed(win.Put, src, n),
               "max": a.mpi_max_size or big}
    for n in sizes:     # ours and the socket read the right bytes (before any put)
        dst[:n] = 0
        ctx.get(0, key, 0, dst[:n])
        ok1 = np.array_equal(dst[:n], ref[:n])
        dst[:n] = 0
        lib.pp_get(fd, dptr, n)
        if not (ok1 and np.array_equal(dst[:n], ref[:n])):
            raise SystemExit(f"wrong bytes read at {n} B (ours ok: {ok1})")
    d8 = dst[:8]
    say("latency")
    ops8 = {"ours get": lambda: ctx.get(0, key, 0, d8),
            "socket get": lambda: lib.pp_get(fd, dptr, 8)}
    if mpi:
        ops8["mpi get"] = mpi["get"](8)
    lat = common.latencies(ops8, a.iters, warmup=min(1000, a.iters), around=around)
    bw = {}
    for n in sizes:
        say("bandwidth", human_size(n))
        dn, sn = dst[:n], src[:n]
        ops = {"ours get": lambda: ctx.get(0, key, 0, dn),
               "socket get": lambda: lib.pp_get(fd, dptr, n),
               "ours put": lambda: ctx.put(0, key, 0, sn),
               "socket put": lambda: lib.pp_put(fd, sptr, n)}
        if mpi and n <= mpi["max"]:
            ops.update({"mpi get": mpi["get"](n), "mpi put": mpi["put"](n)})
        bw[n] = common.bandwidths(ops, n, target_s=a.target_ms / 1e3, repeats=a.repeats,
                                  around=around)
        for op in ("get", "put"):
            for other in ("socket", "mpi"):
                if f"{other} {op}" in bw[n]:
                    bw[n][f"ours/{other} {op}"] = common.paired_ratio(bw[n][f"ours {op}"],
                                                                     bw[n][f"{other} {op}"])
    res = {"latency_ns": lat, "bandwidth": {str(n): v for n, v in bw.items()}}
    if win is not None:
        from mpi4py import MPI
        with around("mpi unlock"):
            win.Unlock(1)
        res["library"] = MPI.Get_library_version().splitlines()[0].strip()
    ctl.sendall(b"q")
    ctl.close()
    ctx.close()
    if comm is not None:
        res["server_stats"] = comm.recv(source=1)
        win.Free()
    emit(res)


def part_mpi(a):
    """Under mpiexec with 2 ranks: rank 1 the target, rank 0 the client, one MPI window."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        raise SystemExit("the mpi part runs on exactly 2 ranks")
    win = MPI.Win.Allocate(a.max_size if comm.rank == 1 else 0, 1, comm=comm)
    if comm.rank == 1:
        np.frombuffer(win.tomemory(), np.uint8)[:] = pattern(a.max_size)
        part_target(a, comm, win)
    else:
        part_client(a, comm, win, comm.bcast(None, root=1))


# ---- allreduce across namespaces -------------------------------------------------------------

def socket_pair(comm):
    """A plain tcp connection between the two ranks (rank 0 listens at its POOLTENSOR_LISTEN
    address), through the C peer's calls: the allreduce part's plain contender."""
    lib = peer_lib()
    host = comm.bcast(os.environ.get("POOLTENSOR_LISTEN", "127.0.0.1"))
    if comm.rank == 0:
        lfd = lib.pp_listen(host.encode(), 0)
        comm.bcast(lib.pp_port(lfd))
        fd = lib.pp_accept(lfd)
        os.close(lfd)
    else:
        fd = lib.pp_connect(host.encode(), comm.bcast(None))
    if fd < 0:
        raise SystemExit("the plain socket between the ranks could not be made")
    return lib, fd


def part_allreduce(a):
    """Under an MPMD mpiexec across namespaces: collectives.allreduce, Comm.Allreduce and a
    plain socket's allreduce (the whole input exchanged in C, then numpy's add: the simplest
    exchange of the fewest bytes two ranks can move), interleaved (the order rotated
    from repeat to repeat), each batch after a barrier; a batch's time is the slowest rank's."""
    from mpi4py import MPI
    import collectives
    comm = MPI.COMM_WORLD
    world = collectives.init()
    lib, fd = socket_pair(comm) if comm.size == 2 else (None, -1)
    sizes = [int(s) for s in a.sizes.split(",")]
    x = np.ones(max(sizes) // 4, np.float32)
    y = np.empty_like(x)
    z = np.empty_like(x)
    res = {}
    for nbytes in sizes:
        n = nbytes // 4
        xs, ys, zs = x[:n], y[:n], z[:n]

        def plain():
            if lib.pp_exchange(fd, xs.ctypes.data, zs.ctypes.data, nbytes):
                raise SystemExit("the plain socket's exchange failed")
            np.add(xs, zs, out=ys)
        ops = {"ours": lambda: collectives.allreduce(xs, out=ys),
               "mpi": lambda: comm.Allreduce(xs, ys)}
        if fd >= 0:
            ops["socket"] = plain
        for name, op in ops.items():
            ys[:] = 0
            op()
            if not (ys == world.size).all():
                raise SystemExit(f"{name} allreduce of {nbytes} B gave wrong values")
        calls = {}
        for name, op in ops.items():     # calls per batch: about target_ms, slowest rank
            ones = []                    # (the least of three: a first call is cold, and
            for _ in range(3):           # batches sized by it would be short)
                comm.Barrier()
                t0 = time.perf_counter()
                op()
                ones.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
            calls[name] = max(1, min(10000, int(a.target_ms / 1e3 / max(min(ones), 1e-7))))
        per = {name: [] for name in ops}
        for r in range(a.repeats):
            for name, op in common.rotated(ops.items(), r):
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
        res[str(nbytes)]["ours/mpi time"] = common.median_ratio(per["ours"], per["mpi"])
        if "socket" in per:
            for name in ("ours", "mpi"):
                res[str(nbytes)][f"{name}/socket time"] = common.median_ratio(
                    per[name], per["socket"])
        say("allreduce", human_size(nbytes), res[str(nbytes)]["ours"]["seconds"])
    if comm.rank == 0:
        emit({"allreduce": res, "transports": world.transports})
    if fd >= 0:
        os.close(fd)
    world.barrier()


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", required=True, choices=("mpi", "target", "client", "allreduce"))
    p.add_argument("--secret", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--sizes", required=True)
    p.add_argument("--max-size", type=int, required=True)
    p.add_argument("--mpi-max-size", type=int, default=None)
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--target-ms", type=float, default=40)
    p.add_argument("--repeats", type=int, default=7)
    for k in ("port", "socket-port", "control-port", "key"):
        p.add_argument("--" + k, type=int, default=None)
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    a = parse(argv)
    common.VERBOSE = a.verbose
    run = {"mpi": part_mpi, "target": part_target, "client": part_client,
           "allreduce": part_allreduce}[a.part]
    if a.part not in ("mpi", "allreduce"):
        return run(a)
    try:
        run(a)
    except BaseException:
        # a rank that fails ends the job now: its peer would otherwise wait inside MPI for
        # it (a broadcast, a barrier) until the bench's own timeout, 15 minutes
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)


if __name__ == "__main__":
    main()
