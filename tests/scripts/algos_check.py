"""Window-based algorithms (ring, recursive doubling, hierarchical, direct) against numpy, on real ranks.

    algos_check.py [cases | mismatch | lost ALGORITHM]

ALGOS_ODD=r makes rank r the one that disagrees in mismatch mode (default: the last rank);
ALGOS_SLOW=r makes rank r late to each of those calls.
ALGOS_HOSTS=div2 or mod2 pretends rank // 2 or rank % 2 is the host (POOLTENSOR_HOST), so the
hierarchical algorithms have several hosts to join. Inputs are small integers, so that every
reduction is exact in every dtype and the result can be compared bit for bit with numpy; a few
cases with random floats check closeness instead. Every result must also be bitwise identical
on every rank. One line per rank at the end: "algos ok <cases>", "mismatch ok" or "lost ok".
"""
import hashlib
import os
import sys
import traceback
import zlib

import numpy as np


def _rank():
    for var in ("POOLTENSOR_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


HOSTS = os.environ.get("ALGOS_HOSTS", "")
if HOSTS == "div2":
    os.environ["POOLTENSOR_HOST"] = f"fake{_rank() // 2}"
elif HOSTS == "mod2":
    os.environ["POOLTENSOR_HOST"] = f"fake{_rank() % 2}"

import collectives  # noqa: E402
from collectives import CollectiveMismatch, algorithms  # noqa: E402

world = collectives.init()
rank, size = world.rank, world.size
DTYPES = [np.dtype(d) for d in ("int8", "int32", "uint64", "float16", "float32", "float64")]
COUNTS = [0, 1, 7, 1001]
digests = []
failures = []
ncases = 0


def gen(dt, shape, r, salt, op):
    rng = np.random.default_rng([salt, r])
    if op == "prod":
        lo, hi = (1, 3) if dt.kind == "u" else (-2, 3)
    else:
        lo, hi = (0, 9) if dt.kind == "u" else (-8, 9)
    return rng.integers(lo, hi, size=shape).astype(dt)


def reference(op, dt, xs):
    fn = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
          "max": np.maximum}[op]
    acc = xs[0].copy()
    for x in xs[1:]:
        fn(acc, x, out=acc, casting="unsafe")
    if op == "avg":
        np.divide(acc, size, out=acc, casting="unsafe")
    return acc


def case(name, fn, same=True):
    """Run one case; same: its result must be identical on every rank."""
    global ncases
    ncases += 1
    try:
        res = fn()
        if same:
            digests.append((name, hashlib.sha1(np.ascontiguousarray(res).tobytes()).hexdigest()))
    except Exception:
        failures.append(f"rank {rank}: {name}:\n{traceback.format_exc()}")


def exact(name, got, ref):
    assert got.dtype == ref.dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    if not np.array_equal(got.view(np.uint8), ref.view(np.uint8)):
        bad = np.flatnonzero(got.ravel() != ref.ravel())
        i = int(bad[0]) if bad.size else 0
        raise AssertionError(f"{name}: {bad.size} wrong; first at {i}: got {got.ravel()[i]!r} "
                             f"expected {ref.ravel()[i]!r}")


def ops_for(dt):
    return ["sum", "prod", "min", "max"] + (["avg"] if dt.kind == "f" else [])


def allreduce_cases(algo):
    for dt in DTYPES:
        for op in ops_for(dt):
            for count in COUNTS:
                name = f"allreduce {algo} {dt} {op} {count}"
                salt = zlib.crc32(repr((1, dt.name, op, count)).encode())

                def run(dt=dt, op=op, count=count, salt=salt, name=name):
                    xs = [gen(dt, (count,), r, salt, op) for r in range(size)]
                    x = xs[rank].copy()
                    res = collectives.allreduce(x, op, algorithm=algo)
                    exact(name, x, xs[rank])          # the input is left alone
                    exact(name, res, reference(op, dt, xs))
                    return res
                case(name, run)
    # larger, in place, and random floats (close, not exact; identical on every rank)
    for dt, count in (("float32", 70001), ("int32", 12345), ("float64", 3)):
        dt = np.dtype(dt)
        name = f"allreduce {algo} {dt} sum {count} inplace"

        def run(dt=dt, count=count, name=name):
            xs = [gen(dt, (count,), r, 7, "sum") for r in range(size)]
            x = xs[rank].copy()
            res = collectives.allreduce(x, "sum", out=x, algorithm=algo)
            assert res is x
            exact(name, res, reference("sum", dt, xs))
            return res
        case(name, run)
    for dt in ("float16", "float32", "float64"):
        dt = np.dtype(dt)
        name = f"allreduce {algo} {dt} random"

        def run(dt=dt, name=name):
            xs = [np.random.default_rng([9, r]).standard_normal(5003).astype(dt)
                  for r in range(size)]
            res = collectives.allreduce(xs[rank], "sum", algorithm=algo)
            ref = sum(x.astype(np.float64) for x in xs)
            tol = {2: 2e-2, 4: 1e-5, 8: 1e-12}[dt.itemsize] * (size + 1) * (np.abs(ref) + 1)
            assert np.all(np.abs(res.astype(np.float64) - ref) <= tol), name
            return res
        case(name, run)
    # a 2-d array keeps its shape
    name = f"allreduce {algo} 2d"

    def run2d():
        xs = [gen(np.dtype("int32"), (5, 3), r, 11, "sum") for r in range(size)]
        res = collectives.allreduce(xs[rank], algorithm=algo)
        exact(name, res, reference("sum", np.dtype("int32"), xs))
        return res
    case(name, run2d)


def allgather_cases(algo):
    for dt in DTYPES:
        for shape in [(0,), (1,), (7,), (1001,), (3, 5)]:
            name = f"allgather {algo} {dt} {shape}"

            def run(dt=dt, shape=shape, name=name):
                xs = [gen(dt, shape, r, 21, "sum") for r in range(size)]
                res = collectives.allgather(xs[rank], algorithm=algo)
                exact(name, res, np.stack(xs))
                return res
            case(name, run)


def reduce_scatter_cases(algo):
    for dt in DTYPES:
        for op in ops_for(dt):
            for blk in [0, 1, 7, 333]:
                name = f"reduce_scatter {algo} {dt} {op} {blk}"

                def run(dt=dt, op=op, blk=blk, name=name):
                    xs = [gen(dt, (size, blk), r, 31 + blk, op) for r in range(size)]
                    res = collectives.reduce_scatter(xs[rank], op, algorithm=algo)
                    exact(name, res, reference(op, dt, xs)[rank])
                    return res
                case(name, run, same=False)


def broadcast_cases(algo):
    for dt in DTYPES:
        for count in COUNTS + [70001]:
            for root in range(size):
                if count == 70001 and dt.itemsize < 4:
                    continue
                name = f"broadcast {algo} {dt} {count} root={root}"

                def run(dt=dt, count=count, root=root, name=name):
                    src = gen(dt, (count,), root, 41, "sum")
                    x = src.copy() if rank == root else np.zeros(count, dt)
                    res = collectives.broadcast(x, root, algorithm=algo)
                    exact(name, res, src)
                    return res
                case(name, run)


def cross_check():
    """Every result identical bit for bit on every rank."""
    alld = world.allgather_object([d for _, d in digests])
    for r, ds in enumerate(alld):
        if len(ds) != len(digests):
            failures.append(f"rank {rank}: rank {r} has {len(ds)} results, we {len(digests)}")
            return
        for (name, mine), theirs in zip(digests, ds):
            if mine != theirs:
                failures.append(f"rank {rank}: {name}: rank {r} got different bytes")


def cases():
    for algo in algorithms.names("allreduce"):
        if algo in ("ring", "recursive_doubling", "hierarchical", "direct"):
            allreduce_cases(algo)
    for algo in ("ring", "recursive_doubling", "hierarchical", "direct"):
        allgather_cases(algo)
    for algo in ("ring", "hierarchical", "direct"):
        if algo != "direct":
            reduce_scatter_cases(algo)
        broadcast_cases(algo)
    # auto picks hierarchical across fake hosts; the one-host path stays the native team
    x = np.full(10, rank + 1, np.int64)
    res = collectives.allreduce(x)
    exact("auto", res, np.full(10, size * (size + 1) // 2, np.int64))
    cross_check()


SLOW = int(os.environ.get("ALGOS_SLOW", -1))


def expect_mismatch(name, fn):
    """fn must raise CollectiveMismatch on this rank (every rank runs this). ALGOS_SLOW=r:
    rank r comes late to each call, so that the others give up calls ahead of it."""
    global ncases
    ncases += 1
    if rank == SLOW:
        import time
        time.sleep(0.05)
    try:
        fn()
    except CollectiveMismatch as e:
        if e.rank is None or not 0 <= e.rank < size:
            failures.append(f"rank {rank}: {name}: mismatch names no rank: {e}")
        return
    except Exception:
        failures.append(f"rank {rank}: {name}: wrong error:\n{traceback.format_exc()}")
        return
    failures.append(f"rank {rank}: {name}: no CollectiveMismatch")


def mismatch():
    """Every rank raises CollectiveMismatch; then a matching call works. Ranks that chose a
    channel algorithm and ranks that chose a team one meet in the world team first
    (channel.meet); with POOLTENSOR_CHANNEL_TEAM_CHECK=0 the channel's own checks (message
    headers, abort records) must find every mismatch between channel algorithms alone."""
    from collectives.algorithms import channel
    odd = rank == int(os.environ.get("ALGOS_ODD", size - 1)) % size
    count = 9 if odd else 8
    big = 70001 if odd else 70000
    for algo in ("ring", "recursive_doubling", "hierarchical", "direct"):
        expect_mismatch(f"allreduce {algo} count",
                        lambda: collectives.allreduce(np.ones(count, np.float32), algorithm=algo))
        expect_mismatch(f"allreduce {algo} big",
                        lambda: collectives.allreduce(np.ones(big, np.float32), algorithm=algo))
        expect_mismatch(f"allreduce {algo} dtype", lambda: collectives.allreduce(
            np.ones(8, np.float64 if odd else np.float32), algorithm=algo))
        expect_mismatch(f"allreduce {algo} op", lambda: collectives.allreduce(
            np.ones(8, np.float32), "max" if odd else "sum", algorithm=algo))
        expect_mismatch(f"allgather {algo}",
                        lambda: collectives.allgather(np.ones(count, np.int32), algorithm=algo))
        # after a mismatch the next matching call works
        res = collectives.allreduce(np.full(5, rank, np.int64), algorithm=algo)
        if not np.array_equal(res, np.full(5, size * (size - 1) // 2)):
            failures.append(f"rank {rank}: {algo}: wrong result after a mismatch: {res}")
    for algo in ("ring", "hierarchical", "direct"):
        if algo != "direct":
            expect_mismatch(f"reduce_scatter {algo}", lambda: collectives.reduce_scatter(
                np.ones((size, count), np.int32), algorithm=algo))
        expect_mismatch(f"broadcast {algo} root 0", lambda: collectives.broadcast(
            np.ones(count, np.int32), 0, algorithm=algo))
        expect_mismatch(f"broadcast {algo} root last", lambda: collectives.broadcast(
            np.ones(count, np.int32), size - 1, algorithm=algo))
    # ranks that chose different algorithms
    expect_mismatch("allreduce ring/recursive_doubling", lambda: collectives.allreduce(
        np.ones(8, np.float32), algorithm="ring" if odd else "recursive_doubling"))
    expect_mismatch("allreduce direct/ring", lambda: collectives.allreduce(
        np.ones(8, np.float32), algorithm="direct" if odd else "ring"))
    expect_mismatch("broadcast direct/ring", lambda: collectives.broadcast(
        np.ones(8, np.float32), algorithm="direct" if odd else "ring"))
    if channel.TEAM_CHECK:  # a team algorithm never reads the channel: only the team meets
        expect_mismatch("allreduce ring/oneshot", lambda: collectives.allreduce(
            np.ones(8, np.float32), algorithm="ring" if odd else "oneshot"))
        expect_mismatch("allgather hierarchical/ring", lambda: collectives.allgather(
            np.ones(8, np.float32), algorithm="hierarchical" if odd else "ring"))
    res = collectives.allgather(np.int64(rank), algorithm="ring")
    if not np.array_equal(res.ravel(), np.arange(size)):
        failures.append(f"rank {rank}: wrong allgather after mismatches: {res}")


def lost(algo):
    """The last rank dies between two collectives: every other rank raises PeerLost naming it
    (not a Timeout) well before the timeout."""
    global ncases
    ncases += 1
    collectives.allreduce(np.ones(1000, np.float32), algorithm=algo)
    world.barrier()
    if rank == size - 1:
        os._exit(0)
    import time
    t0 = time.monotonic()
    try:
        collectives.allreduce(np.ones(1000, np.float32), algorithm=algo)
    except collectives.PeerLost as e:
        if e.rank != size - 1:
            failures.append(f"rank {rank}: PeerLost names rank {e.rank}, not {size - 1}: {e}")
        took = time.monotonic() - t0
        if took > 0.5 * world.timeout:
            failures.append(f"rank {rank}: PeerLost only after {took:.1f} s")
    except Exception:
        failures.append(f"rank {rank}: wrong error:\n{traceback.format_exc()}")
    else:
        failures.append(f"rank {rank}: no PeerLost")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "cases"
    if mode == "mismatch":
        mismatch()
    elif mode == "lost":
        lost(sys.argv[2])
    else:
        cases()
    if failures:
        print("\n".join(failures[:10]), file=sys.stderr)
        print(f"rank {rank}: {len(failures)} of {ncases} cases failed", file=sys.stderr)
        sys.exit(1)
    print(f"{mode} ok {ncases}" if mode in ("mismatch", "lost") else f"algos ok {ncases}")
    collectives.finalize()
