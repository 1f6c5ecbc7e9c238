"""Every collective x algorithm x dtype x op x size on this world, against numpy.

Run on N ranks (mpiexec or ``python -m collectives.launch``). Each rank regenerates every rank's
input from a seed, computes the expected result with numpy, and checks its own result; at the
end the ranks compare a digest of every result, so results must also be bitwise identical on
every rank. Algorithms are discovered at run time (collectives.algorithms.names), so a newly
registered one is covered without editing this file.

Float results are compared bit for bit with numpy's rank-order accumulation for algorithms in
collectives.algorithms.DETERMINISTIC (float16/bfloat16 accumulated in float32, rounded once),
and within a rounding bound for the others (which may round partial results to the dtype
between steps). Ints, min and max are exact everywhere.

argv: [--quick] (for the runs over other transports, where the dtype only changes the
kernel, which the full run on shared memory checks: fewer sizes, large ones for float32 only,
one integer type per item size, every float type; every op x algorithm still). Prints
"coll ok <cases>" on success; lists every failed case and exits 1 otherwise (the run carries
on after a failed case, so one run reports them all).
"""
import hashlib
import sys
import time
import traceback
import zlib

import numpy as np

import collectives
from collectives import CollectiveMismatch, algorithms

QUICK = "--quick" in sys.argv[1:]

world = collectives.init()
rank, size = world.rank, world.size

try:
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # bfloat16 needs ml_dtypes; the rest is covered without it
    BF16 = None

INTS = [np.dtype(t) for t in ("int8", "int16", "int32", "int64",
                               "uint8", "uint16", "uint32", "uint64")]
FLOATS = [np.dtype(t) for t in ("float16", "float32", "float64")] + ([BF16] if BF16 else [])
DTYPES = INTS + FLOATS
HALF = {np.dtype("float16")} | ({BF16} if BF16 else set())
OPS = ["sum", "prod", "min", "max", "avg"]
DETERMINISTIC = set(getattr(algorithms, "DETERMINISTIC", {"oneshot", "twoshot", "shm"}))

# element counts: empty, one, odd, non-power-of-two, just over the one-shot threshold in
# float32 (64 KiB), and several 256 KiB staging chunks (300k float32 = 1.2 MB)
SMALL = [0, 1, 3, 1023]
MEDIUM = [16411]
LARGE = 300_000
if QUICK:   # every op x algorithm still; fewer sizes and integer types (see the docstring)
    SMALL = [0, 1, 1023]
    DTYPES = [np.dtype(t) for t in ("int8", "uint16", "int32", "uint64")] + FLOATS

failures = []
digests = []          # sha1 of every result, in case order: compared across ranks at the end
names = []            # the case each digest came from
current = [""]        # the case running now
ncases = 0


def fail(name, why):
    failures.append(f"{name}: {why}")


def case(name, fn):
    """Run one case; record (never raise) its failure so the run reports every one."""
    global ncases
    ncases += 1
    current[0] = name
    try:
        fn()
    except Exception:
        fail(name, traceback.format_exc(limit=4))


def is_float(dt):
    return dt in FLOATS


def gen(dt, shape, r, salt, op="sum"):
    """Rank r's input: the same on every rank that asks for it."""
    rng = np.random.default_rng([salt, r])
    count = int(np.prod(shape, dtype=np.int64))
    if dt in INTS:
        info = np.iinfo(dt)
        if op == "prod":
            lo = 0 if info.min == 0 else -3
            v = rng.integers(lo, 4, count).astype(dt)
        else:   # the full range: sums wrap, as numpy's do
            v = rng.integers(info.min, info.max, count, dtype=dt, endpoint=True)
    else:
        if op == "prod":  # magnitudes near 1: no overflow, no underflow
            v = rng.uniform(0.5, 2.0, count) * rng.choice([-1.0, 1.0], count)
        else:
            v = rng.standard_normal(count) * (8.0 if dt in HALF else 1000.0)
            v[v == 0] = 1.0   # no zeros: min/max of +0/-0 is not specified bitwise
        v = v.astype(dt)
    return v.reshape(shape)


def finfo(dt):
    return ml_dtypes.finfo(dt) if BF16 is not None and dt == BF16 else np.finfo(dt)


_CACHE = {}


def inputs(dt, shape, salt, op="sum", ref_rows=None):
    """Every rank's input and the reference reduction, kept for the next call with the same
    key (the algorithms of one case run back to back, so each input is made once)."""
    key = (dt, shape, salt, op, ref_rows)
    hit = _CACHE.get(key)
    if hit is None:
        xs = [gen(dt, shape, r, salt, op) for r in range(size)]
        parts = xs if ref_rows is None else [v[ref_rows] for v in xs]
        hit = (xs, parts, reduce_ref(op, dt, parts) if op else None)
        _CACHE.clear()
        _CACHE[key] = hit
    return hit


def acc_dtype(dt):
    return np.dtype(np.float32) if dt in HALF else dt


def reduce_ref(op, dt, xs):
    """numpy's rank-order reduction, the way the kernels do it: 16-bit floats accumulate in
    float32 and round once (avg too: float32 sum / n, then rounded); float32 and float64
    accumulate in their own type (avg: the rounded sum / n)."""
    ad = acc_dtype(dt)
    acc = np.array(xs[0], dtype=ad, copy=True)
    f = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
         "max": np.maximum}[op]
    with np.errstate(all="ignore"):
        for x in xs[1:]:
            acc = f(acc, x.astype(ad))
        if op == "avg":
            np.divide(acc, len(xs), out=acc, casting="unsafe")
        return acc.astype(dt)


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a


def check_reduced(name, got, ref, op, dt, xs, exact):
    if not isinstance(got, np.ndarray):
        raise AssertionError(f"result is a {type(got).__name__}, not an ndarray")
    if got.shape != ref.shape or got.dtype != ref.dtype:
        raise AssertionError(f"shape/dtype {got.shape} {got.dtype}, expected {ref.shape} {dt}")
    if dt in INTS or op in ("min", "max"):
        ok = np.array_equal(got, ref, equal_nan=is_float(dt))
    elif exact:
        ok = np.array_equal(bits(got), bits(ref))
    else:  # another order of the same operations: within a rounding bound
        ad = acc_dtype(dt)
        g, r = got.astype(np.float64), ref.astype(np.float64)
        mags = [np.abs(x.astype(np.float64)) for x in xs]
        big = np.prod(mags, axis=0) if op == "prod" else np.sum(mags, axis=0)
        if op == "avg":
            big = big / len(xs)
        # partial results may be rounded to dt between steps (ring, recursive doubling send
        # float16 partials), so allow a rounding in dt per rank on top of the accumulation
        tol = 4 * (len(xs) + 1) * (finfo(ad).eps + finfo(dt).eps) * big \
            + 2 * finfo(dt).eps * np.abs(r) + float(finfo(dt).smallest_subnormal)
        ok = bool(np.all(np.abs(g - r) <= tol))
    if not ok:
        bad = np.flatnonzero(~np.isclose(got.astype(np.float64), ref.astype(np.float64),
                                         rtol=0, atol=0, equal_nan=True).ravel())
        i = int(bad[0]) if bad.size else 0
        raise AssertionError(f"{bad.size} wrong elements; first at {i}: got "
                             f"{got.ravel()[i]!r} expected {ref.ravel()[i]!r}")


def unchanged(x, y):
    if not np.array_equal(bits(x), bits(y)):
        raise AssertionError("the input was modified")


def record(arr, what=None):
    """Keep a digest of a result that every rank must hold bit for bit."""
    digests.append(hashlib.sha1(np.ascontiguousarray(arr).tobytes()).digest())
    names.append(what or current[0])


def resolved(kind, algo, nbytes):
    """The algorithm 'auto' stands for here (to know whether the float check is exact)."""
    if algo != "auto":
        return algo
    try:
        return algorithms.select(kind, nbytes, world, "auto", False)
    except Exception:
        return "?"


def ops_for(dt):
    """The reduction ops a sweep runs for dt: every op but avg for integers (it refuses them,
    which sweep_errors checks)."""
    return [op for op in OPS if not (op == "avg" and dt in INTS)]


def salt_of(*key):
    return zlib.crc32(repr(key).encode())


# ---- allreduce ------------------------------------------------------------------------------

def allreduce_case(algo, dt, op, count, inplace=False, deterministic=False):
    name = f"allreduce {algo} {dt} {op} count={count}{' inplace' if inplace else ''}" \
           f"{' deterministic' if deterministic else ''}"
    salt = salt_of("ar", dt.name, op, count)

    def run():
        xs, _, ref = inputs(dt, (count,), salt, op)
        x = xs[rank].copy()
        res = collectives.allreduce(x, op, out=x if inplace else None, algorithm=algo,
                                    deterministic=deterministic)
        if inplace:
            assert res is x, "out=x did not return x"
        else:
            unchanged(x, xs[rank])
        exact = deterministic or resolved("allreduce", algo, x.nbytes) in DETERMINISTIC
        check_reduced(name, res, ref, op, dt, xs, exact)
        record(res)
    case(name, run)


def sweep_allreduce():
    algos = ["auto"] + algorithms.names("allreduce")
    for dt in DTYPES:
        for op in ops_for(dt):
            counts = [c for c in SMALL + MEDIUM
                      if not (c in MEDIUM and QUICK and dt != np.dtype("float32"))]
            # several staging chunks: every dtype for sum and max, every op for float32/int64
            if op in ("sum", "max") or dt in (np.dtype("float32"), np.dtype("int64")):
                if not QUICK or dt == np.dtype("float32"):
                    counts.append(LARGE)
            for count in counts:
                for algo in algos:
                    allreduce_case(algo, dt, op, count)
        for algo in algos:
            allreduce_case(algo, dt, "sum", 1023, inplace=True)
        for algo in algos:
            allreduce_case(algo, dt, "max", MEDIUM[0], inplace=True)
    for algo in algos:
        allreduce_case(algo, np.dtype("float32"), "sum", LARGE, inplace=True)
    # past 8 MiB the direct algorithms write their output with streaming stores
    for algo in ["auto"] + [a for a in ["twoshot"] if a in algorithms.names("allreduce")]:
        allreduce_case(algo, np.dtype("float32"), "sum", 2_500_007)


def sweep_deterministic():
    """deterministic=True: the same bytes whatever the algorithm (those that accept it)."""
    algos = ["auto"] + algorithms.names("allreduce")
    for dt in FLOATS + [np.dtype("int32")]:
        for op in ("sum", "prod", "avg") if is_float(dt) else ("sum",):
            for count in (7, MEDIUM[0], LARGE):
                name = f"deterministic allreduce {dt} {op} count={count}"
                salt = salt_of("det", dt.name, op, count)

                def run(dt=dt, op=op, count=count, salt=salt, name=name):
                    xs, _, ref = inputs(dt, (count,), salt, op)
                    for algo in algos:
                        try:
                            res = collectives.allreduce(xs[rank], op, algorithm=algo,
                                                        deterministic=True)
                        except ValueError:
                            if algo == "auto" or algo in DETERMINISTIC:
                                raise
                            continue
                        if not np.array_equal(bits(res), bits(ref)):
                            raise AssertionError(f"algorithm {algo}: bytes differ from the "
                                                 f"rank-order reduction")
                        record(res)
                case(name, run)


# ---- reduce_scatter -------------------------------------------------------------------------

def reduce_scatter_case(algo, dt, op, block, inplace=False):
    name = f"reduce_scatter {algo} {dt} {op} block={block}{' inplace' if inplace else ''}"
    salt = salt_of("rs", dt.name, op, block)

    def run():
        xs, parts, ref = inputs(dt, (size,) + block, salt, op, ref_rows=rank)
        x = xs[rank].copy()
        out = x[rank] if inplace else None
        res = collectives.reduce_scatter(x, op, out=out, algorithm=algo)
        if inplace:
            assert res is out, "out= was not returned"
        else:
            unchanged(x, xs[rank])
        exact = resolved("reduce_scatter", algo, x.nbytes) in DETERMINISTIC
        check_reduced(name, res, ref, op, dt, parts, exact)
        # no record(): each rank's block is its own
    case(name, run)


def sweep_reduce_scatter():
    algos = ["auto"] + algorithms.names("reduce_scatter")
    for dt in DTYPES:
        for op in ops_for(dt):
            blocks = [(b,) for b in SMALL]
            if op in ("sum", "min") and (not QUICK or dt == np.dtype("float32")):
                blocks.append((70_001,))   # several staging chunks per block
            for b in blocks:
                for algo in algos:
                    reduce_scatter_case(algo, dt, op, b)
        for algo in algos:
            reduce_scatter_case(algo, dt, "sum", (3, 5))
        for algo in algos:
            reduce_scatter_case(algo, dt, "max", (1023,), inplace=True)
    for algo in algos:
        reduce_scatter_case(algo, np.dtype("float32"), "sum", (70_001,), inplace=True)


# ---- allgather ------------------------------------------------------------------------------

def allgather_case(algo, dt, shape, inplace=False):
    name = f"allgather {algo} {dt} shape={shape}{' inplace' if inplace else ''}"
    salt = salt_of("ag", dt.name, shape)

    def run():
        xs = inputs(dt, shape, salt, None)[0]
        expect = np.stack(xs)
        if inplace:  # this rank's input is already in its row of out (MPI_IN_PLACE)
            out = np.zeros((size,) + shape, dt)
            out[rank] = xs[rank]
            res = collectives.allgather(out[rank], out=out, algorithm=algo)
            assert res is out, "out= was not returned"
        else:
            x = xs[rank].copy()
            res = collectives.allgather(x, algorithm=algo)
            unchanged(x, xs[rank])
        if res.shape != expect.shape or res.dtype != dt:
            raise AssertionError(f"shape/dtype {res.shape} {res.dtype}, expected "
                                 f"{expect.shape} {dt}")
        if not np.array_equal(bits(res), bits(expect)):
            raise AssertionError("gathered bytes differ")
        record(res)
    case(name, run)


def sweep_allgather():
    algos = ["auto"] + algorithms.names("allgather")
    shapes = [(dt, (c,)) for dt in DTYPES for c in SMALL + MEDIUM]
    shapes += [(dt, (3, 5)) for dt in DTYPES]
    shapes += [(np.dtype(dt), (LARGE + 1,)) for dt in ("int8", "float32", "float64")]
    for dt, shape in shapes:
        for algo in algos:
            allgather_case(algo, dt, shape)
    for algo in algos:
        allgather_case(algo, np.dtype("float32"), (1023,), inplace=True)
        allgather_case(algo, np.dtype("float32"), (LARGE,), inplace=True)
    # from 16 MiB of output (2 ranks) the team writes it with streaming stores; an odd length
    # puts every row but the first at an unaligned address
    allgather_case("auto", np.dtype("int8"), (8_388_617,))
    allgather_case("auto", np.dtype("float64"), (1_048_579,), inplace=True)


# ---- broadcast ------------------------------------------------------------------------------

def broadcast_case(algo, dt, shape, root, inplace=False):
    name = f"broadcast {algo} {dt} shape={shape} root={root}{' inplace' if inplace else ''}"
    salt = salt_of("bc", dt.name, shape)

    def run():
        want = gen(dt, shape, root, salt)
        mine = want.copy() if rank == root else gen(dt, shape, 1000 + rank, salt)
        before = mine.copy()
        res = collectives.broadcast(mine, root, out=mine if inplace else None, algorithm=algo)
        if inplace:
            assert res is mine, "out=x did not return x"
        else:
            unchanged(mine, before)
        if res.shape != shape or res.dtype != dt:
            raise AssertionError(f"shape/dtype {res.shape} {res.dtype}, expected {shape} {dt}")
        if not np.array_equal(bits(res), bits(want)):
            raise AssertionError("bytes differ from the root's")
        record(res)
    case(name, run)


def sweep_broadcast():
    for algo in ["auto"] + algorithms.names("broadcast"):
        for dt in DTYPES:
            for count in SMALL:
                broadcast_case(algo, dt, (count,), count % size)
        for root in range(size):
            broadcast_case(algo, np.dtype("float32"), (LARGE,), root)
            broadcast_case(algo, np.dtype("int16"), (3, 5), root, inplace=True)
        broadcast_case(algo, np.dtype("float64"), (LARGE + 3,), size - 1, inplace=True)


# ---- NaN and inf ----------------------------------------------------------------------------

def sweep_specials():
    """NaN and inf propagate through min and max (and sum) as numpy's do."""
    vals = np.array([np.nan, np.inf, -np.inf, 1.5, -2.0, 3.0], np.float64)
    for dt in FLOATS:
        for op in ("min", "max", "sum"):
            for algo in ["auto"] + algorithms.names("allreduce"):
                name = f"specials allreduce {algo} {dt} {op}"

                def run(dt=dt, op=op, algo=algo):
                    rng = np.random.default_rng([7, 0])
                    # every (value on rank 0, value on rank 1, ...) combination over 40 slots
                    xs = [vals[rng.integers(0, len(vals), 40)].astype(dt) for _ in range(size)]
                    for r, x in enumerate(xs):
                        x[r] = np.nan     # a NaN that only one rank holds
                        x[size + r] = np.inf
                    res = collectives.allreduce(xs[rank].copy(), op, algorithm=algo)
                    ref = reduce_ref(op, dt, xs)
                    if not np.array_equal(np.isnan(res), np.isnan(ref)):
                        raise AssertionError(f"NaN positions differ: {res} vs {ref}")
                    if not np.array_equal(res, ref, equal_nan=True):
                        raise AssertionError(f"values differ: {res} vs {ref}")
                    record(res)
                case(name, run)
            if op != "sum":
                name = f"specials reduce_scatter {dt} {op}"

                def run_rs(dt=dt, op=op):
                    xs = [np.full((size, 4), float(r), dt) for r in range(size)]
                    xs[0][:, 0] = np.nan
                    xs[-1][:, 1] = np.inf if op == "max" else -np.inf
                    res = collectives.reduce_scatter(xs[rank].copy(), op)
                    ref = reduce_ref(op, dt, [v[rank] for v in xs])
                    if not np.array_equal(res, ref, equal_nan=True):
                        raise AssertionError(f"{res} vs {ref}")
                case(name, run_rs)


# ---- errors raised alike on every rank ------------------------------------------------------

def expect_raise(name, exc, fn):
    def run():
        try:
            fn()
        except exc:
            return
        except Exception as e:
            raise AssertionError(f"raised {type(e).__name__}: {e}, expected {exc.__name__}")
        raise AssertionError(f"did not raise {exc.__name__}")
    case(name, run)


def sweep_errors():
    f32 = np.ones((size, 6), np.float32)
    i32 = np.ones(6, np.int32)
    for dt in INTS:
        expect_raise(f"allreduce avg {dt}", TypeError,
                     lambda dt=dt: collectives.allreduce(np.ones(4, dt), "avg"))
        expect_raise(f"reduce_scatter avg {dt}", TypeError,
                     lambda dt=dt: collectives.reduce_scatter(np.ones((size, 2), dt), "avg"))
    expect_raise("allreduce bool", TypeError,
                 lambda: collectives.allreduce(np.ones(3, bool)))
    expect_raise("allreduce complex64", TypeError,
                 lambda: collectives.allreduce(np.ones(3, np.complex64)))
    expect_raise("allreduce unknown op", ValueError,
                 lambda: collectives.allreduce(i32, "median"))
    expect_raise("allreduce unknown algorithm", ValueError,
                 lambda: collectives.allreduce(i32, algorithm="no-such-algorithm"))
    for kind in ("allgather", "reduce_scatter", "broadcast"):
        fn = getattr(collectives, kind)
        expect_raise(f"{kind} unknown algorithm", ValueError,
                     lambda fn=fn: fn(f32, algorithm="no-such-algorithm"))
    for algo in algorithms.names("allreduce"):
        if algo not in DETERMINISTIC:
            expect_raise(f"allreduce deterministic with {algo}", ValueError,
                         lambda algo=algo: collectives.allreduce(i32, algorithm=algo,
                                                                 deterministic=True))
    expect_raise("reduce_scatter leading dim size+1", ValueError,
                 lambda: collectives.reduce_scatter(np.ones((size + 1, 4), np.float32)))
    expect_raise("reduce_scatter 1-d of wrong length", ValueError,
                 lambda: collectives.reduce_scatter(np.ones(size + 2, np.float32)))
    # out of the wrong shape, the wrong dtype, or not C-contiguous
    x = np.ones(6, np.float32)
    expect_raise("allreduce out shape", ValueError,
                 lambda: collectives.allreduce(x, out=np.empty(5, np.float32)))
    expect_raise("allreduce out dtype", ValueError,
                 lambda: collectives.allreduce(x, out=np.empty(6, np.float64)))
    expect_raise("allreduce out strided", ValueError,
                 lambda: collectives.allreduce(x, out=np.empty(12, np.float32)[::2]))
    expect_raise("allgather out shape", ValueError,
                 lambda: collectives.allgather(x, out=np.empty((size + 1, 6), np.float32)))
    expect_raise("allgather out missing axis", ValueError,
                 lambda: collectives.allgather(x, out=np.empty(6 * size, np.float32)))
    expect_raise("reduce_scatter out shape", ValueError,
                 lambda: collectives.reduce_scatter(f32, out=np.empty(7, np.float32)))
    expect_raise("broadcast out shape", ValueError,
                 lambda: collectives.broadcast(x, out=np.empty((2, 3), np.float32)))
    expect_raise("broadcast root == size", ValueError,
                 lambda: collectives.broadcast(x, root=size))
    expect_raise("broadcast root -1", ValueError, lambda: collectives.broadcast(x, root=-1))
    # none of that touched the team: a correct call still works
    case("after local errors", lambda: check_reduced(
        "after", collectives.allreduce(np.full(5, rank + 1, np.int64)),
        np.full(5, size * (size + 1) // 2, np.int64), "sum", np.dtype("int64"), [], True))

    # non-contiguous input: copied first (documented), same answer
    def strided():
        base = np.arange(40, dtype=np.float64).reshape(8, 5) * (rank + 1)
        res = collectives.allreduce(base[:, 1::2])
        ref = np.arange(40, dtype=np.float64).reshape(8, 5)[:, 1::2] * (size * (size + 1) // 2)
        assert np.array_equal(res, ref), (res, ref)
        record(res)
    case("allreduce strided input", strided)


# ---- mismatched calls -----------------------------------------------------------------------

def correct_call(kind, algo):
    """A call every rank makes alike, checked: the world still works."""
    v = np.full(3, rank, np.int32)
    tri = size * (size - 1) // 2
    if kind == "allreduce":
        res, want = collectives.allreduce(v, algorithm=algo), np.full(3, tri)
    elif kind == "allgather":
        res, want = collectives.allgather(v, algorithm=algo), np.repeat(np.arange(size), 3)
        res = res.ravel()
    elif kind == "reduce_scatter":
        res = collectives.reduce_scatter(np.tile(v, (size, 1)), algorithm=algo)
        want = np.full(3, tri)
    else:
        res, want = collectives.broadcast(v, size - 1, algorithm=algo), np.full(3, size - 1)
    assert np.array_equal(res, want), (kind, algo, res, want)


def sweep_mismatch():
    """Ranks disagree on shape, dtype, op, root or kind: CollectiveMismatch on every rank, with
    every algorithm, and the next correct call works."""
    if size < 2:
        return
    odd = rank == 0   # rank 0 is the odd one out
    f = np.ones(10, np.float32)
    ar, ag = collectives.allreduce, collectives.allgather
    rs, bc = collectives.reduce_scatter, collectives.broadcast
    # (kind, what, call(algorithm)); kind None: the ranks call different kinds (auto only)
    cases = [
        ("allreduce", "shape", lambda a: ar(np.ones(11 if odd else 10, np.float32),
                                            algorithm=a)),
        ("allreduce", "shape, same bytes", lambda a: ar(
            np.ones((2, 5) if odd else (5, 2), np.float32), algorithm=a)),
        ("allreduce", "dtype, same bytes", lambda a: ar(
            np.ones(10, np.int32 if odd else np.float32), algorithm=a)),
        ("allreduce", "op", lambda a: ar(f, "max" if odd else "sum", algorithm=a)),
        ("allreduce", "op avg/sum", lambda a: ar(f, "avg" if odd else "sum", algorithm=a)),
        ("allreduce", "large shape", lambda a: ar(np.ones(LARGE + (1 if odd else 0),
                                                          np.float32), algorithm=a)),
        ("allreduce", "small vs large", lambda a: ar(np.ones(100 if odd else 100_000,
                                                             np.float32), algorithm=a)),
        ("allgather", "shape", lambda a: ag(np.ones(3 if odd else 4, np.int8), algorithm=a)),
        ("allgather", "dtype", lambda a: ag(np.ones(4, np.int16 if odd else np.float16),
                                            algorithm=a)),
        ("allgather", "small vs large", lambda a: ag(np.ones(5 if odd else LARGE, np.float32),
                                                     algorithm=a)),
        ("reduce_scatter", "block", lambda a: rs(np.ones((size, 5 if odd else 6)),
                                                 algorithm=a)),
        ("reduce_scatter", "op", lambda a: rs(np.ones((size, 6)), "min" if odd else "max",
                                              algorithm=a)),
        ("broadcast", "root", lambda a: bc(f, root=1 if odd else 0, algorithm=a)),
        ("broadcast", "shape", lambda a: bc(np.ones(9 if odd else 10), algorithm=a)),
        ("broadcast", "dtype", lambda a: bc(np.ones(10, np.float32 if odd else np.int32),
                                            algorithm=a)),
        (None, "kind allreduce/allgather", lambda a: ar(f) if odd else ag(f)),
        (None, "kind broadcast/allreduce", lambda a: bc(f) if odd else ar(f)),
        (None, "kind reduce_scatter/allreduce", lambda a: (
            rs(np.ones((size, 5))) if odd else ar(np.ones((size, 5))))),
        (None, "async allreduce shape", lambda a: collectives.allreduce_async(
            np.ones(4 if odd else 5)).wait(60)),
    ]
    for kind, what, fn in cases:
        for algo in ["auto"] + (algorithms.names(kind) if kind else []):
            name = f"mismatch: {kind or ''} {what} {algo}"

            def run(fn=fn, algo=algo):
                t0 = time.monotonic()
                try:
                    fn(algo)
                except CollectiveMismatch as e:
                    if e.rank is None or not 0 <= e.rank < size or e.rank == rank:
                        raise AssertionError(f"CollectiveMismatch names rank {e.rank}: {e}")
                    if time.monotonic() - t0 > 0.5 * world.timeout:
                        raise AssertionError("mismatch found only after waiting "
                                             f"{time.monotonic() - t0:.1f} s")
                else:
                    raise AssertionError("no CollectiveMismatch")
            case(name, run)
            case(f"correct call after {name}",
                 lambda kind=kind, algo=algo: correct_call(kind or "allreduce", algo))


# ---- asynchronous ---------------------------------------------------------------------------

def sweep_async():
    def same_as_sync():
        salt = salt_of("async")
        x = gen(np.dtype("float32"), (LARGE,), rank, salt)
        blocks = gen(np.dtype("int32"), (size, 1001), rank, salt + 1)
        b = gen(np.dtype("float64"), (777,), 0, salt + 2) if rank == 0 else np.zeros(777)
        reqs = [collectives.allreduce_async(x),
                collectives.allgather_async(x[:1001]),
                collectives.reduce_scatter_async(blocks, "max"),
                collectives.broadcast_async(b, 0),
                collectives.allreduce_async(x[:5], "min")]
        # compute while they run
        m = np.random.default_rng(rank).standard_normal((160, 160))
        for _ in range(10):
            m = np.tanh(m @ m.T / 160)
        sync_mid = collectives.allreduce(np.full(4, rank, np.int64))  # queued behind them
        got = [r.wait(60) for r in reqs]
        assert all(r.test() for r in reqs)
        assert np.array_equal(sync_mid, np.full(4, size * (size - 1) // 2)), sync_mid
        want = [collectives.allreduce(x), collectives.allgather(x[:1001]),
                collectives.reduce_scatter(blocks, "max"), collectives.broadcast(b, 0),
                collectives.allreduce(x[:5], "min")]
        for i, (g, w) in enumerate(zip(got, want)):
            assert np.array_equal(bits(g), bits(w)), f"async result {i} differs from sync"
            if i != 2:   # reduce_scatter's block is rank-specific
                record(g, f"async result {i}")
    case("async results equal sync results", same_as_sync)

    def overlaps():
        # rank 0 arrives late: the others' requests are issued at once and are not done
        x = np.full(1000, rank + 1.0)
        world.barrier()
        if rank == 0:
            time.sleep(0.6)
        t0 = time.monotonic()
        req = collectives.allreduce_async(x)
        issued = time.monotonic() - t0
        assert issued < 0.3, f"allreduce_async took {issued:.2f} s to return"
        if rank != 0 and size > 1:
            assert not req.test(), "done before rank 0 arrived"
            try:
                req.wait(0.05)
            except collectives.Timeout:
                pass
            else:
                raise AssertionError("wait(0.05) returned before rank 0 arrived")
        s = 0.0
        for i in range(2000):   # compute while the collective waits
            s += i * 0.5
        res = req.wait(60)
        assert req.test()
        assert np.array_equal(res, np.full(1000, size * (size + 1) / 2)), res[:4]
    case("async overlaps compute", overlaps)

    def inplace_async():
        x = np.full(100, rank + 1, np.int32)
        res = collectives.allreduce_async(x, "prod", out=x).wait(60)
        import math
        assert res is x and np.all(x == math.factorial(size)), x[:3]
    case("async in-place", inplace_async)


# ---- run ------------------------------------------------------------------------------------

t_start = time.monotonic()
timings = {}
for part in (sweep_allreduce, sweep_deterministic, sweep_reduce_scatter, sweep_allgather,
             sweep_broadcast, sweep_specials, sweep_errors, sweep_mismatch, sweep_async):
    t0 = time.monotonic()
    part()
    timings[part.__name__[6:]] = round(time.monotonic() - t0, 2)

# every rank ran the same cases in the same order: their result digests must agree
ok_local = not failures
mine = np.frombuffer(b"".join(digests), np.uint8) if digests else np.zeros(0, np.uint8)
lens = collectives.allgather(np.array([mine.size, ok_local], np.int64))
if np.all(lens[:, 0] == mine.size):
    every = collectives.allgather(mine)
    for r in range(size):
        if not np.array_equal(every[r], every[0]):
            d = every[r].reshape(-1, 20) != every[0].reshape(-1, 20)
            first = int(np.flatnonzero(d.any(axis=1))[0])
            fail("bitwise identical results", f"rank {r} differs from rank 0 first at result "
                                              f"#{first} ({names[first]})")
    if world.how == "mpi":  # and once more through MPI itself
        from mpi4py import MPI
        hashes = MPI.COMM_WORLD.allgather(hashlib.sha1(mine.tobytes()).hexdigest())
        if len(set(hashes)) != 1:
            fail("bitwise identical results (mpi4py)", f"{hashes}")
else:
    fail("bitwise identical results", f"ranks recorded different numbers of results: "
                                      f"{lens[:, 0] // 20}")

if failures:
    print(f"rank {rank}: {len(failures)} of {ncases} cases failed:", file=sys.stderr)
    for f in failures:
        print(f"  FAIL {f}", file=sys.stderr)
    sys.stderr.flush()
    sys.exit(1)
print(f"coll ok {ncases} cases in {time.monotonic() - t_start:.1f} s {timings}", flush=True)
