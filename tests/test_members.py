"""A plain script's members compute the slabs they home (pool/work.py, ops/members.py).

Pinned against numpy (values, dtypes, errors) and against the processes themselves: a block
computed by map_blocks says which process computed it, so "the home computes" is observed,
not assumed. The suite's conftest sends every operation to the members; one test here pins the
default threshold that keeps small work in the script.
"""
import os
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pooltensor as pt
from pooltensor.pool import work
from conftest import SLAB, pool_fixture, property_settings

pool = pool_fixture(1, 2, 3, memory=32 << 20)
PROPS = property_settings("POOLTENSOR_MEMBERS_EXAMPLES", 20, "POOLTENSOR_MEMBERS_DERANDOMIZE")
E = SLAB // 8                      # float64 elements a slab


def _pid_of(p, m):
    return os.getpid() if m == 0 else p._procs[m - 1].pid


def _homes(x):
    """Per element of a fresh C-contiguous array: the member that homes it."""
    S = x._a.pool.slab_size
    k = (np.arange(x.size) * x.itemsize) // S
    return np.asarray(x._a.members)[k]


def test_each_home_computes_its_slabs(pool):
    x = pt.arange(40 * E, dtype=np.float64)
    got = pt.map_blocks(lambda b: np.full(b.shape, os.getpid(), np.int64), x)
    want = np.array([_pid_of(pool, m) for m in _homes(got)], np.int64)
    np.testing.assert_array_equal(got.to_numpy(), want)
    if pool.size > 1:
        assert pool.stats()["plans"].get("run", 0) > 0


_BLAS_SCRIPT = """
import numpy as np
import pooltensor as pt
from threadpoolctl import threadpool_info

def blas_threads(b):
    return np.full(b.shape, max(i["num_threads"] for i in threadpool_info()
                                if i["user_api"] == "blas"), np.int64)

before = int(blas_threads(np.zeros(1))[0])
pool = pt.init(members=3)
x = pt.arange(60 * (pool.slab_size // 8), dtype=np.float64)
homes = sorted(set(np.asarray(x._a.members).tolist()))
got = sorted(set(pt.map_blocks(blas_threads, x).to_numpy().tolist()))
after = int(blas_threads(np.zeros(1))[0])
pt.finalize()
print("blas", before, after, homes, got)
"""


@pytest.mark.parametrize("user", [None, "1"])
def test_each_process_computes_on_its_share_of_the_cores(user):
    """Every process of a script computes at once, so each one's BLAS gets cores // processes
    threads while it does (members from the start, the script for its share of a plan), and
    the script's BLAS is back to what it was after; a user's OMP_NUM_THREADS (or any of the
    BLAS variables) is what every process keeps. With a BLAS on every core in every process,
    a matmul over 3 members on 2 cores took 3x as long."""
    from pooltensor.pool import blas
    env = {k: v for k, v in os.environ.items() if k not in blas._VARS}
    if user:
        env["OMP_NUM_THREADS"] = user
    p = subprocess.run([sys.executable, "-c", _BLAS_SCRIPT], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("blas ")][-1]
    before, after, rest = line.split(" ", 3)[1:]
    homes, got = rest.split("] [")
    assert homes == "[0, 1, 2", line                       # every process took part
    share = max(1, os.cpu_count() // 3)
    want = int(user) if user else share
    assert got == f"{want}]", line
    assert after == before, line


def test_blas_share_leaves_the_users_variables_alone(monkeypatch):
    from pooltensor.pool import blas
    for v in blas._VARS:
        monkeypatch.delenv(v, raising=False)
    env = blas.member_env(2)
    assert env["OPENBLAS_NUM_THREADS"] == env["OMP_NUM_THREADS"] == str(max(1, os.cpu_count() // 2))
    assert blas.share(10 ** 6) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert blas.member_env(2) == {}


@PROPS
@given(n=st.integers(0, 30 * E), dt=st.sampled_from([np.float32, np.float64, np.int32,
                                                     np.int64, np.uint8, np.complex64]),
       seed=st.integers(0, 3))
def test_chains_match_numpy(pool, n, dt, seed):
    rng = np.random.default_rng(seed)
    ra, rb = [(rng.random(n) * 50).astype(dt) for _ in range(2)]
    a, b = pt.from_numpy(ra), pt.from_numpy(rb)
    with np.errstate(all="ignore"):
        cases = [(a * b + 3, ra * rb + 3), (np.sin(a) * 2 + b, np.sin(ra) * 2 + rb),
                 (pt.where(a > b, a, b), np.where(ra > rb, ra, rb)),
                 (a.astype(np.float32), ra.astype(np.float32)),
                 (np.add(a, b, where=ra > 10), None)]
        for got, want in cases[:-1]:
            g = got.to_numpy()
            assert g.dtype == want.dtype
            np.testing.assert_array_equal(g, want)
        out = pt.zeros(n, dtype=np.result_type(ra, rb))
        ref = np.zeros(n, dtype=out.dtype)
        np.add(a, b, out=out, where=pt.from_numpy(ra > 10))
        np.add(ra, rb, out=ref, where=ra > 10)
        np.testing.assert_array_equal(out.to_numpy(), ref)
        if dt not in (np.complex64,):
            np.testing.assert_array_equal(np.clip(a, 5, 20).to_numpy(), np.clip(ra, 5, 20))


@PROPS
@given(shape=st.sampled_from([(37,), (9, 13), (4, 5, 11), (0, 3)]), seed=st.integers(0, 5))
def test_reductions_match_numpy_and_repeat(pool, shape, seed):
    ra = np.random.default_rng(seed).standard_normal(shape)
    a = pt.from_numpy(ra)
    for axis in (None, 0, -1):
        for fn in ("sum", "mean", "max", "min", "argmax", "std"):
            if ra.size == 0 and fn in ("max", "min", "argmax"):
                continue
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = getattr(a, fn)(axis=axis)
                want = getattr(ra, fn)(axis=axis)
                again = getattr(a, fn)(axis=axis)
            got, again = np.asarray(got), np.asarray(again)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
            assert got.tobytes() == again.tobytes()      # the same combine order every time


def test_matmul_and_layout_copies(pool):
    ra = np.random.default_rng(1).random((23, 17))
    rb = np.random.default_rng(2).random((17, 5))
    a = pt.from_numpy(ra)
    np.testing.assert_allclose((a @ rb).to_numpy(), ra @ rb, rtol=1e-13)
    np.testing.assert_array_equal(pt.reshape(a.T, (-1,)).to_numpy(), ra.T.reshape(-1))
    a[3:9, ::2] = -1.0
    ra[3:9, ::2] = -1.0
    np.testing.assert_array_equal(a.to_numpy(), ra)
    a[...] = ra[::-1]
    np.testing.assert_array_equal(a.to_numpy(), ra[::-1])


def test_creation_and_random_do_not_depend_on_members(pool):
    n = 50 * E + 3
    cases = {
        "random": lambda: pt.random.random((n,), seed=7),
        "normal": lambda: pt.random.standard_normal((n,), seed=8, dtype=np.float32),
        "integers": lambda: pt.random.integers(-5, 9, (n,), seed=9, dtype=np.int16),
        "arange": lambda: pt.arange(0.5, n, 1.25),
        "linspace": lambda: pt.linspace(-1, 3, n),
        "full": lambda: pt.full((n,), 2.5, dtype=np.float32),
        "zeros": lambda: pt.zeros((n,), dtype=np.int8)}
    want = {
        "arange": np.arange(0.5, n, 1.25), "linspace": np.linspace(-1, 3, n),
        "full": np.full(n, 2.5, np.float32), "zeros": np.zeros(n, np.int8)}
    for name, make in cases.items():
        got = make().to_numpy()
        if name in want:
            np.testing.assert_array_equal(got, want[name])
        else:          # the numbers' definition: generator block b from default_rng([seed, b])
            seed = {"random": 7, "normal": 8, "integers": 9}[name]
            g = np.random.default_rng([seed, 0])
            first = {"random": lambda: g.random(n, dtype=np.float64),
                     "normal": lambda: g.standard_normal(n, dtype=np.float32),
                     "integers": lambda: g.integers(-5, 9, n, dtype=np.int16)}[name]()
            np.testing.assert_array_equal(got, first)


def test_fresh_and_reused_memory_give_the_same_bytes(pool):
    a = pt.random.random((60 * E,), seed=3, dtype=np.float32)
    b = pt.random.random((60 * E,), seed=4, dtype=np.float32)
    first = (a * b + a).to_numpy()
    for _ in range(3):
        y = a * b + a
        assert y.to_numpy().tobytes() == first.tobytes()
        del y


def test_map_blocks(pool):
    ra = np.arange(30 * E, dtype=np.float64)
    x = pt.from_numpy(ra)
    k = 3

    def f(b, c):
        return b * k + c

    y = pt.map_blocks(f, x, 0.5)
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y.to_numpy(), ra * 3 + 0.5)
    z = pt.map_blocks(lambda b, c: b < c, x, pt.from_numpy(ra[::-1].copy()))
    assert z.dtype == np.bool_
    np.testing.assert_array_equal(z.to_numpy(), ra < ra[::-1])
    w = pt.map_blocks(lambda b: b, x, dtype=np.int32)
    np.testing.assert_array_equal(w.to_numpy(), ra.astype(np.int32))

    def bad(b):
        raise ZeroDivisionError("no blocks today")
    with pytest.raises(ZeroDivisionError, match="no blocks today"):
        pt.map_blocks(bad, x, dtype=np.float64)
    np.testing.assert_array_equal((x + 1).to_numpy(), ra + 1)     # still usable


def _member_slab_array(pool, value_elsewhere, value_there):
    """A float64 array: value_there on the slabs member 1 homes, value_elsewhere elsewhere."""
    x = pt.full((40 * E,), value_elsewhere)
    homes = _homes(x)
    ref = np.where(homes == 1, value_there, value_elsewhere)
    x[...] = ref
    return x, ref


def test_member_errors_name_the_member(pool):
    if pool.size == 1:
        pytest.skip("one member: the script does all the work")
    x, ref = _member_slab_array(pool, 1.0, 0.0)
    with np.errstate(divide="raise"):
        with pytest.raises(FloatingPointError) as info:
            _ = 1.0 / x
    assert "member 1" in " ".join(getattr(info.value, "__notes__", []))
    with pytest.warns(RuntimeWarning, match="divide by zero"):
        y = 1.0 / x
    np.testing.assert_array_equal(y.to_numpy(), 1.0 / ref)


def test_plans_outside_the_vocabulary_are_refused(pool):
    if pool.size == 1:
        pytest.skip("no member processes")
    x = pt.zeros(10)
    with pytest.raises(work.MemberError, match=r"may not name posix\.system|os\.system"):
        work.Round(pool, [1], ("run", os.system, [x], [], False, False)).wait()
    with pytest.raises(work.MemberError, match="unknown plan"):
        work.Round(pool, [1], ("format_disk", x)).wait()
    np.testing.assert_array_equal((x + 2).to_numpy(), np.full(10, 2.0))   # still serving


def test_small_work_stays_in_the_script(pool, monkeypatch):
    if pool.size == 1:
        pytest.skip("no member processes")
    monkeypatch.delenv(work.ENV_MIN, raising=False)
    x = pt.ones(40 * E)
    before = dict(pool.stats()["plans"])
    y = x * 2
    assert pool.stats()["plans"] == before          # 4 MiB a member by default
    np.testing.assert_array_equal(y.to_numpy(), np.full(40 * E, 2.0))
    monkeypatch.setenv(work.ENV_MIN, "not a size")
    with pytest.raises(ValueError, match="POOLTENSOR_MEMBER_WORK_MIN"):
        x * 3


KILL = textwrap.dedent("""
    import os, signal, sys, threading, time
    import numpy as np
    import pooltensor as pt
    from collectives.errors import PeerLost
    pool = pt.init(members=3, slab_size=1 << 16, timeout=20)
    big = pt.ones((1 << 22,), dtype=np.float32)
    victim = pool._procs[1]
    threading.Timer(0.5, lambda: os.kill(victim.pid, signal.SIGKILL)).start()
    t = time.monotonic()
    try:
        for _ in range(400):
            big = np.sin(big) * 0.5 + 0.5
        print("NO ERROR")
    except PeerLost as e:
        print("LOST", round(time.monotonic() - t, 2), "rank 2" in str(e) or "member 2" in str(e))
    try:
        big + 1
        print("AFTER OK")
    except PeerLost as e:
        print("AFTER LOST", "member 2" in str(e))
    small = pt.ones(1 << 12, dtype=np.float32)     # placed on the members alive
    print("OTHERS", float((small + 1).sum()), 2 not in small.slab_members)
    print("LISTED", big._a.id in [d["allocation"] for d in pool.lost()])
    pt.finalize()
    pt.init(members=2, slab_size=1 << 16)
    print("NEW", float((pt.ones(100) + 1).sum()))
""")


def test_member_killed_mid_operation_is_peer_lost():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    t = time.monotonic()
    out = subprocess.run([sys.executable, "-c", KILL], capture_output=True, text=True,
                         timeout=100, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split("\n")
    lost = [ln for ln in lines if ln.startswith("LOST")]
    assert lost and lost[0].endswith("True"), out.stdout + out.stderr[-2000:]
    assert float(lost[0].split()[1]) < 20
    assert "AFTER LOST True" in out.stdout        # the arrays on the lost member say so
    assert "OTHERS 8192.0 True" in out.stdout      # the pool goes on without it
    assert "LISTED True" in out.stdout
    assert "NEW 200.0" in out.stdout
    assert time.monotonic() - t < 90


MEMBER_RSS = textwrap.dedent("""
    import sys, time
    import numpy as np
    import pooltensor as pt
    pool = pt.init(members=2, slab_size=1 << 20, memory=256 << 20)
    pid = pool._procs[0].pid

    def shmem_kib():
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("RssShmem:"):
                return int(line.split()[1])
        return 0
""")

AHEAD = MEMBER_RSS + textwrap.dedent("""
    before = shmem_kib()
    x = pt.full((1 << 20,), 1.0, dtype=np.float32, placement=[1])      # 4 MiB on member 1
    t0 = time.monotonic()
    deadline = t0 + float(sys.argv[1])
    while time.monotonic() < deadline and shmem_kib() - before < 60 * 1024:
        time.sleep(0.05)
    print("GREW", (shmem_kib() - before) // 1024, "IN", round(time.monotonic() - t0, 2))
    y = x * 2                          # lands on prepared pages: the same bytes as numpy
    print("SAME", bool(np.array_equal(y.to_numpy(), np.full(1 << 20, 2.0, np.float32))))
""")


BUSY = MEMBER_RSS + textwrap.dedent("""
    x = pt.full((1 << 20,), 1.0, dtype=np.float32, placement=[1])      # 4 MiB on member 1
    before, n = shmem_kib(), 0
    end = time.monotonic() + 1.0
    while time.monotonic() < end:      # plans back to back: the member computes, nothing else
        assert x.sum() == 1 << 20
        n += 1
    print("BUSY", (shmem_kib() - before) // 1024, n)
    deadline = time.monotonic() + 20   # then idle: it prepares
    while time.monotonic() < deadline and shmem_kib() - before < 60 * 1024:
        time.sleep(0.05)
    print("IDLE", (shmem_kib() - before) // 1024)
""")


def test_a_busy_member_prepares_nothing_until_idle():
    # preparing a chunk faults in a whole huge page (5-6 ms on this kind of VM): a member
    # that did it between back-to-back plans made every plan wait for it
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), POOLTENSOR_MEMBER_WORK_MIN="0")
    env.pop("POOLTENSOR_PREPARE", None)
    out = subprocess.run([sys.executable, "-c", BUSY], capture_output=True, text=True,
                         timeout=100, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    busy, plans = (int(v) for v in out.stdout.split("BUSY")[1].split()[:2])
    idle = int(out.stdout.split("IDLE")[1].split()[0])
    assert plans >= 20, out.stdout
    assert busy <= 16, out.stdout          # a stray gap of over member.IDLE may prepare a chunk
    assert idle >= 60, out.stdout


@pytest.mark.parametrize("prepare", [None, "0"])
def test_members_prepare_fresh_memory_ahead(prepare):
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("POOLTENSOR_PREPARE", None)
    if prepare is not None:
        env["POOLTENSOR_PREPARE"] = prepare
    # with preparing off, 5 s of nothing is the proof: with it on, the 60 MiB came within 0.05-0.2 s
    out = subprocess.run([sys.executable, "-c", AHEAD, "20" if prepare is None else "5"],
                         capture_output=True, text=True, timeout=100, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    grew = int(out.stdout.split("GREW")[1].split()[0])
    assert "SAME True" in out.stdout
    if prepare is None:
        assert grew >= 60, out.stdout          # a quarter of the 256 MiB heap, past the 4 MiB
    else:
        assert grew <= 8, out.stdout           # only what the array itself touched


STOPPED = textwrap.dedent("""
    import os, signal, time
    import numpy as np
    import pooltensor as pt
    from collectives.errors import Timeout
    pool = pt.init(members=2, slab_size=1 << 16, timeout=3)
    x = pt.ones((1 << 20,), dtype=np.float32)
    os.kill(pool._procs[0].pid, signal.SIGSTOP)
    t = time.monotonic()
    try:
        x * 2
        print("NO ERROR")
    except Timeout as e:
        print("TIMEOUT", round(time.monotonic() - t, 1), "member 1" in str(e))
    os.kill(pool._procs[0].pid, signal.SIGCONT)
    t = time.monotonic()
    pt.finalize()
    print("FINALIZED", round(time.monotonic() - t, 1))
""")


def test_stopped_member_is_a_timeout_naming_it():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", STOPPED], capture_output=True, text=True,
                         timeout=100, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("TIMEOUT"))
    _, waited, named = line.split()
    assert named == "True" and 2.5 <= float(waited) < 15, out.stdout
    assert "FINALIZED" in out.stdout
