"""A workload that faults are injected under (tests/test_partition.py, tests/chaos.py).

Runs one kind of operation in a loop for DURATION seconds, checks every result against a
reference, and prints one line per operation:

    op <i> ok <seconds>
    op <i> err <ErrorClass> <seconds> <message>
    corrupt <i> <what>                 (a result that differs from the reference)

then ``final ok`` once an operation succeeded after the last fault was lifted (it retries for
up to FINAL seconds: the world must be usable again), and ``summary ok=.. err=.. corrupt=..``.

    fault_worker.py rma SECRET_HEX HOST PORT KEY MIB TIMEOUT DURATION
        gets of MIB MiB (and puts of the same bytes back) from a tcp_server.py target
    fault_worker.py allreduce N TIMEOUT DURATION            (a rank of a world: POOLTENSOR_*)
        allreduce of N float64, checked against the sum every rank can compute
    fault_worker.py server ADDRESS MIB TIMEOUT DURATION     ($POOLTENSOR_SECRET_FILE)
        a pool on one memory server: an array of MIB MiB, slices read, written and summed;
        an array lost with a restarted server (PeerRestarted) is made again from the reference;
        an element whose write failed (Timeout, ConnectionDropped) may hold either value until
        it is written again: a failed write may or may not have landed, it never lands wrong

The line ``hold`` on stdin (optional) makes the loop wait until ``go``: the controller lines
up its fault with an operation.
"""
import os
import sys
import threading
import time

import numpy as np

FINAL = float(os.environ.get("FAULT_WORKER_FINAL", "30"))
counts = {"ok": 0, "err": 0, "corrupt": 0}
go = threading.Event()
go.set()


def _stdin():
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "hold":
            go.clear()
            print("held", flush=True)
        elif cmd == "go":
            go.set()
    go.set()


def run(i, fn):
    """One operation: fn() returns None when its result matches the reference, else a text."""
    from collectives.errors import PooltensorError
    go.wait()
    t0 = time.monotonic()
    try:
        bad = fn(i)
    except PooltensorError as e:
        counts["err"] += 1
        msg = str(e).replace("\n", " ")[:300]
        print(f"op {i} err {type(e).__name__} {time.monotonic() - t0:.3f} {msg}", flush=True)
        return False
    if bad:
        counts["corrupt"] += 1
        print(f"corrupt {i} {bad}", flush=True)
        return False
    counts["ok"] += 1
    print(f"op {i} ok {time.monotonic() - t0:.3f}", flush=True)
    return True


def loop(fn, duration, over=None):
    """Operations until `duration` is over (over(up): whether every process is done, for
    processes that must stop together: a collective on the flag)."""
    i = 0
    end = time.monotonic() + duration
    while True:
        up = time.monotonic() >= end
        if over is None and up:
            break
        run(i, fn)
        i += 1
        if over is not None:
            from collectives.errors import PooltensorError
            t0 = time.monotonic()
            try:
                if over(up):
                    break
            except PooltensorError as e:    # every rank fails it alike: asked again, but
                counts["err"] += 1          # counted as an operation (a partition may land here)
                msg = str(e).replace("\n", " ")[:300]
                print(f"op {i} err {type(e).__name__} {time.monotonic() - t0:.3f} "
                      f"(agreeing to stop) {msg}", flush=True)
        time.sleep(0.02)
    deadline = time.monotonic() + FINAL
    while time.monotonic() < deadline:
        if run(i, fn):
            print("final ok", flush=True)
            break
        i += 1
        time.sleep(0.2)
    print("summary " + " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)


def rma(secret, host, port, key, mib, timeout, duration):
    from collectives import _native
    from collectives.window import raise_native
    ctx = _native.Context(0, 2, 1)
    ctx.set_secret(bytes.fromhex(secret))
    ctx.set_timeout(float(timeout))
    ctx.connect_tcp(1, host, int(port))
    key, n = int(key), int(float(mib) * (1 << 20))
    want = (np.arange(n) % 251).astype(np.uint8)     # tcp_server.py's bytes
    out = np.empty(n, np.uint8)

    def op(i):
        out[:] = 0
        try:
            ctx.get(1, key, 0, out)
            if not np.array_equal(out, want):
                return f"get of {n} bytes differs at {int(np.argmax(out != want))}"
            ctx.put(1, key, 0, want)                # the same bytes back: stays checkable
        except _native.Error as e:
            raise_native(e, rank=1, host=host, what="get/put")
        return None

    print("ready", flush=True)
    loop(op, float(duration))
    ctx.close()


def allreduce(n, timeout, duration):
    os.environ["POOLTENSOR_TIMEOUT"] = str(timeout)
    import collectives
    world = collectives.init()
    me, size = world.rank, world.size
    n = int(n)

    def op(i):
        x = np.arange(n, dtype=np.float64) * (me + 1) + i
        got = collectives.allreduce(x)
        want = np.arange(n, dtype=np.float64) * (size * (size + 1) / 2) + i * size
        if not np.array_equal(got, want):
            return f"allreduce {i} differs at {int(np.argmax(got != want))}"
        return None

    def over(up):                           # the ranks stop at the same operation
        return collectives.allreduce(np.array([float(up)]))[0] > 0

    print("ready", flush=True)
    loop(op, float(duration), over)
    collectives.finalize()


def server(address, mib, timeout, duration):
    import pooltensor as pt
    pt.init(connect=[address], timeout=float(timeout), cache_bytes=4 << 20)
    from collectives.errors import PeerRestarted
    n = int(float(mib) * (1 << 20)) // 8
    ref = np.arange(n, dtype=np.float64)
    state = {"x": pt.asarray(ref)}
    rng = np.random.default_rng(0)

    def op(i):
        try:
            if state["x"] is None:          # lost with a restarted server: a new array
                state["x"] = pt.asarray(ref)    # (its data from the reference)
            return checked(i, state["x"])
        except PeerRestarted:
            state["x"] = None
            raise

    doubt = {}                              # element -> the value a failed write may have left

    def checked(i, x):
        a = int(rng.integers(0, n - 1))
        b = int(rng.integers(a + 1, n + 1))
        got = np.asarray(x[a:b])
        bad = np.flatnonzero(got != ref[a:b])
        for j in bad:                       # a write that failed may or may not have landed
            if doubt.get(a + int(j)) != got[j]:
                return f"x[{a}:{b}] differs at {a + int(j)}: {got[j]!r}, not {ref[a + j]!r}"
        v = float(i % 7)
        try:
            x[a:a + 1] = v                  # a write, then the reference follows
        except Exception:
            doubt[a] = v                    # failed: the old value or v, until rewritten
            raise
        ref[a] = v
        doubt.pop(a, None)
        if float(x[a:a + 1].sum()) != v:
            return f"x[{a}] after a write"
        return None

    print("ready", flush=True)
    loop(op, float(duration))
    pt.finalize()


if __name__ == "__main__":
    threading.Thread(target=_stdin, daemon=True).start()
    mode, args = sys.argv[1], sys.argv[2:]
    {"rma": rma, "allreduce": allreduce, "server": server}[mode](*args)
