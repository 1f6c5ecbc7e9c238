"""Memory servers compute work whose inputs live on other servers: each server computes the
output slabs it holds and reads the input slabs it does not hold from the server that holds
them (pooltensor/pool/serve_work.py), so the script sends plans and moves almost no bytes.

Two real `pooltensor serve` processes on loopback; the script is this process. Results are
compared with numpy, and the script's own transfers (pool.stats()) show that the bytes went
server to server. A server lost in the middle of such an operation is PeerLost naming it,
one that stopped answering is Timeout naming it (before the script's own wait runs out); a
server that restarted is sent no plan (its memory is new). The netns case is
test_netns.py's compute scenario (tests/scripts/serve_client.py)."""
import os
import signal
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pooltensor as pt
from collectives.errors import PeerLost, Timeout
from servers import ServerProc, make_secret

pytestmark = pytest.mark.timeout(180)
SLAB = 1 << 16
PLACES = ["block", "interleave", [1], [2], [2, 1]]


def _until(cond, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    secret = make_secret(tmp_path_factory.mktemp("peers"))
    servers = [ServerProc("64MiB", secret).ready() for _ in range(2)]
    yield servers, secret
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def pool(two):
    servers, secret = two
    old = os.environ.get("POOLTENSOR_MEMBER_WORK_MIN")
    os.environ["POOLTENSOR_MEMBER_WORK_MIN"] = "0"       # small arrays: servers work too
    pt.finalize()
    p = pt.init(connect=[s.address for s in servers], secret_file=secret, slab_size=SLAB,
                cache_bytes=8 * SLAB, memory=48 << 20)
    try:
        assert all(ch.reach for ch in p.chans.values())
        pt.zeros(4) + 0     # a process's first operator calibrates ops/elide.py (plans of its own)
        yield p
    finally:
        pt.finalize()
        if old is None:
            os.environ.pop("POOLTENSOR_MEMBER_WORK_MIN")
        else:
            os.environ["POOLTENSOR_MEMBER_WORK_MIN"] = old


def _moved(pool):
    """Bytes this process got and put over tcp so far."""
    lat = pool.stats()["transfers"]["latency"].get("tcp", {})
    return sum(v["bytes"] for op, v in lat.items() if op in ("get", "put"))


def _plans(pool, kind):
    return pool.stats()["plans"].get(kind, 0)


def _on(pool, ref, placement):
    return pt.asarray(ref, placement=placement)


def test_misaligned_operands_are_computed_by_the_servers(pool):
    n = 12 * SLAB // 4 + 5
    rx = np.arange(n, dtype=np.float32) * 0.25
    ry = np.cos(np.arange(n, dtype=np.float32))
    x = _on(pool, rx, [1])
    y = _on(pool, ry, [2])
    runs, moved = _plans(pool, "run"), _moved(pool)
    z = x[3:] * 2 + y[:-3]                      # z on server 1, y's slabs on server 2
    assert _plans(pool, "run") > runs
    assert _moved(pool) - moved < SLAB, "the script moved the operands itself"
    np.testing.assert_array_equal(z.to_numpy(), rx[3:] * 2 + ry[:-3])


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 6 * SLAB // 4), a=st.integers(0, 3000), b=st.integers(0, 3000),
       px=st.sampled_from(PLACES), py=st.sampled_from(PLACES), pz=st.sampled_from(PLACES),
       op=st.sampled_from([np.add, np.subtract, np.multiply, np.maximum, np.arctan2]),
       dtype=st.sampled_from([np.float32, np.float64, np.int32]), use_out=st.booleans())
def test_elementwise_across_servers_matches_numpy(pool, n, a, b, px, py, pz, op, dtype,
                                                  use_out):
    if op is np.arctan2 and dtype == np.int32:
        dtype = np.float64
    rng = np.random.default_rng(n + 7 * a + 13 * b)
    m = n + max(a, b)
    rx = (rng.standard_normal(m) * 100).astype(dtype)
    ry = (rng.standard_normal(m) * 100).astype(dtype)
    x, y = _on(pool, rx, px), _on(pool, ry, py)
    want = op(rx[a:a + n], ry[b:b + n])
    moved = _moved(pool)
    if use_out:
        z = pt.empty(n, dtype=want.dtype, placement=pz)
        got = op(x[a:a + n], y[b:b + n], out=z)
        assert got is z
    else:
        got = op(x[a:a + n], y[b:b + n])
    assert _moved(pool) - moved < SLAB
    np.testing.assert_array_equal(got.to_numpy(), want)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 300), cols=st.integers(1, 200), r0=st.integers(0, 5),
       c0=st.integers(0, 5), step=st.sampled_from([1, 2, 3]), px=st.sampled_from(PLACES),
       axis=st.sampled_from([None, 0, 1]), red=st.sampled_from(["sum", "max", "min"]))
def test_reductions_across_servers_match_numpy(pool, rows, cols, r0, c0, step, px, axis, red):
    rng = np.random.default_rng(rows * 1000 + cols)
    ref = rng.integers(-1000, 1000, (rows + r0, cols + c0), dtype=np.int64)
    x = _on(pool, ref, px)
    v, rv = x[r0:, c0::step], ref[r0:, c0::step]
    moved = _moved(pool)
    got = getattr(v, red)(axis=axis)
    assert _moved(pool) - moved < SLAB, "the script read the slabs itself"
    np.testing.assert_array_equal(np.asarray(got), getattr(rv, red)(axis=axis))


def test_a_server_reads_its_peer_for_a_2d_shift(pool):
    ref = np.arange(400 * 300, dtype=np.float64).reshape(400, 300)
    x, y = _on(pool, ref, "interleave"), _on(pool, -ref, [2, 1])
    runs, moved = _plans(pool, "run"), _moved(pool)
    z = x[1:, :-1] + y[:-1, 1:]
    assert _plans(pool, "run") > runs and _moved(pool) - moved < SLAB
    np.testing.assert_array_equal(z.to_numpy(), ref[1:, :-1] - ref[:-1, 1:])
    assert float(z.sum()) == float((ref[1:, :-1] - ref[:-1, 1:]).sum())


# -- matmul and shape copies ------------------------------------------------------------------

def _ints(rng, shape, dtype):
    """Small integers as floats: every product and sum below is exact in float32 too, so the
    blocked products equal numpy's bit for bit."""
    return rng.integers(-8, 9, shape).astype(dtype)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(1, 700), k=st.integers(1, 97), m=st.sampled_from([0, 1, 3, 17]),
       r0=st.integers(0, 3), c0=st.integers(0, 2), stack=st.booleans(),
       pa=st.sampled_from(PLACES), pb=st.sampled_from(PLACES + ["numpy"]),
       dtype=st.sampled_from([np.float32, np.float64]))
def test_matmul_across_servers_matches_numpy(pool, rows, k, m, r0, c0, stack, pa, pb, dtype):
    # m == 0: a vector right operand; c0: a's rows are a strided view; pa/pb: where a and b
    # live (b as a pool array travels by reference, never through the script)
    rng = np.random.default_rng(rows * 131 + k * 7 + m)
    lead = (2, rows) if stack else (rows,)
    ra = _ints(rng, lead[:-1] + (lead[-1] + r0, k + c0), dtype)
    rb = _ints(rng, (k,) if m == 0 else (k, m), dtype)
    a = _on(pool, ra, pa)[..., r0:, c0:]
    va = ra[..., r0:, c0:]
    b = rb if pb == "numpy" else _on(pool, rb, pb)
    plans, moved = _plans(pool, "rows"), _moved(pool)
    got = a @ b
    assert _plans(pool, "rows") > plans
    assert _moved(pool) - moved < SLAB, "the script moved the operands itself"
    assert got.dtype == (va @ rb).dtype and got.shape == (va @ rb).shape
    np.testing.assert_array_equal(got.to_numpy(), va @ rb)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(2, 300), cols=st.integers(1, 150), r0=st.integers(0, 4),
       c0=st.integers(0, 4), px=st.sampled_from(PLACES), py=st.sampled_from(PLACES),
       op=st.sampled_from(["reshape", "transpose", "ravel_f", "concatenate", "concat_flat",
                           "stack", "astype", "setitem"]),
       dtype=st.sampled_from([np.float32, np.float64, np.int32]))
def test_shape_copies_across_servers_match_numpy(pool, rows, cols, r0, c0, px, py, op, dtype):
    rng = np.random.default_rng(rows * 1000 + cols)
    rx = rng.integers(-1000, 1000, (rows + r0, cols + c0)).astype(dtype)
    ry = rng.integers(-1000, 1000, (rows + r0, cols + c0)).astype(dtype)
    x, y = _on(pool, rx, px), _on(pool, ry, py)
    v, w, rv, rw = x[r0:, c0:], y[:rows, :cols], rx[r0:, c0:], ry[:rows, :cols]
    cases = {
        "reshape": (lambda: v.reshape(-1), lambda: rv.reshape(-1)),          # a copy: v strided
        "transpose": (lambda: pt.reshape(v.T, (cols, rows)), lambda: rv.T.reshape(cols, rows)),
        "ravel_f": (lambda: pt.ravel(v, order="F"), lambda: np.ravel(rv, order="F")),
        "concatenate": (lambda: pt.concatenate([v, w[1:]]), lambda: np.concatenate([rv, rw[1:]])),
        "concat_flat": (lambda: pt.concatenate([w, v], axis=None),
                        lambda: np.concatenate([rw, rv], axis=None)),
        "stack": (lambda: pt.stack([v[:, 0], w[:, -1]]), lambda: np.stack([rv[:, 0], rw[:, -1]])),
        "astype": (lambda: x[r0 + 1:].reshape(-1)[c0:].astype(np.float64),
                   lambda: rx[r0 + 1:].reshape(-1)[c0:].astype(np.float64))}
    if op == "setitem":
        z, rz = pt.zeros((rows + 1, cols), dtype, placement=py), np.zeros((rows + 1, cols), dtype)
        rz[1:] = rv
        cases[op] = (lambda: z.__setitem__(slice(1, None), v) or z, lambda: rz)
    ours, theirs = cases[op]
    want = theirs()
    runs, moved = _plans(pool, "run"), _moved(pool)
    got = ours()
    if want.size and got._a is not x._a and got._a is not y._a:     # (not a view)
        assert _plans(pool, "run") > runs
    assert _moved(pool) - moved < SLAB, "the script copied the slabs itself"
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got.to_numpy(), want)


def test_a_big_numpy_right_operand_is_put_in_the_pool_once(pool):
    # 160 KiB of numpy is not sent in every plan (products.PLAN_NUMPY)
    ra = np.arange(500 * 128, dtype=np.float64).reshape(500, 128) % 11
    rb = np.arange(128 * 160, dtype=np.float64).reshape(128, 160) % 5
    a = _on(pool, ra, "interleave")
    plans, moved = _plans(pool, "rows"), _moved(pool)
    got = a[1:] @ rb
    assert _plans(pool, "rows") > plans
    assert _moved(pool) - moved < rb.nbytes + SLAB, "the script moved a's rows"
    np.testing.assert_array_equal(got.to_numpy(), ra[1:] @ rb)


def test_a_plan_too_big_for_a_control_frame_runs_in_the_script(pool):
    # an authenticated plan may be up to control.PLAN_FRAME (4 MiB; 64 KiB before
    # authentication): 720 KB of numpy operand travels in the plan, 5 MB does not
    ref = np.arange(300 * 300, dtype=np.float64).reshape(300, 300)
    x = _on(pool, ref, "interleave")
    mid = np.cos(ref)
    runs = _plans(pool, "run")
    np.testing.assert_array_equal((x + mid).to_numpy(), ref + mid)
    assert _plans(pool, "run") > runs
    ref = np.arange(800 * 800, dtype=np.float64).reshape(800, 800)
    x = _on(pool, ref, "interleave")
    big = np.cos(ref)
    runs = _plans(pool, "run")
    np.testing.assert_array_equal((x + big).to_numpy(), ref + big)
    assert _plans(pool, "run") == runs
    z = x[1:] * 2                             # the servers' connections are intact
    assert _plans(pool, "run") > runs
    np.testing.assert_array_equal(z.to_numpy(), ref[1:] * 2)


def test_a_reply_bigger_than_a_plan_frame_comes_back(pool):
    # a reduction's partials may be far bigger than any plan: x.sum(axis=0) of a wide array
    # sends each server's whole row of partial sums back (5.6 MB here, over PLAN_FRAME)
    ref = (np.arange(3 * 700_000, dtype=np.float64) % 97).reshape(3, 700_000)
    x = _on(pool, ref, "interleave")
    reduces = _plans(pool, "reduce")
    np.testing.assert_array_equal(np.asarray(x.sum(axis=0)), ref.sum(axis=0))
    assert _plans(pool, "reduce") > reduces                 # the servers computed them
    np.testing.assert_array_equal((x * 2).to_numpy(), ref * 2)   # and are still connected



def test_a_matmul_with_a_small_result_runs_on_the_servers(pool, monkeypatch):
    # (N, 256) @ (256, 1): each server writes 16 KiB of result from 4 MiB of rows; the work
    # threshold counts the rows read, not the bytes written (the script read all of `a` before)
    monkeypatch.setenv("POOLTENSOR_MEMBER_WORK_MIN", str(256 << 10))
    ref = (np.arange(8192 * 256, dtype=np.float32) % 13).reshape(8192, 256)
    x = _on(pool, ref, "interleave")
    b = (np.arange(256, dtype=np.float32) % 5).reshape(256, 1)
    rows, moved = _plans(pool, "rows"), _moved(pool)
    got = x @ b
    np.testing.assert_array_equal(got.to_numpy(), ref @ b)
    assert _plans(pool, "rows") > rows
    assert _moved(pool) - moved < ref.nbytes // 4, _moved(pool) - moved

def test_a_copy_into_a_strided_output_runs_in_the_script(pool):
    # concatenate along axis 1 writes column blocks: a server's unit of them would cross into
    # the other server's slab, so the script writes them (numpy's result all the same)
    ref = np.arange(300 * 70, dtype=np.float64).reshape(300, 70)
    x, y = _on(pool, ref, "interleave"), _on(pool, -ref, [2, 1])
    got = pt.concatenate([x[1:], y[:-1]], axis=1)
    np.testing.assert_array_equal(got.to_numpy(), np.concatenate([ref[1:], -ref[:-1]], axis=1))
    z = pt.zeros((299, 70))
    z[:, ::2] = x[1:, ::2]
    want = np.zeros((299, 70))
    want[:, ::2] = ref[1:, ::2]
    np.testing.assert_array_equal(z.to_numpy(), want)


# -- faults --------------------------------------------------------------------------------

def _private_pool(tmp_path, monkeypatch, memory, timeout):
    """Two servers of this test's own and a pool on them (servers of the test get killed)."""
    monkeypatch.setenv("POOLTENSOR_MEMBER_WORK_MIN", "0")
    secret = make_secret(tmp_path)
    servers = [ServerProc("64MiB", secret).ready() for _ in range(2)]
    pt.finalize()
    try:
        pool = pt.init(connect=[s.address for s in servers], secret_file=secret,
                       slab_size=SLAB, cache_bytes=8 * SLAB, memory=memory, timeout=timeout)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers, secret, pool


def _lost_during(servers, fn):
    """Stop server 2, run fn() in a thread (it must then wait on the stopped server), kill
    server 2: fn's error, which came without a hang or a result, is PeerLost naming server 2
    (rank 2) and the member that found it (member 1)."""
    os.kill(servers[1].pid, signal.SIGSTOP)
    got = {}

    def op():
        try:
            got["z"] = fn()
        except BaseException as e:                  # noqa: BLE001
            got["err"] = e
    t = threading.Thread(target=op)
    t0 = time.monotonic()
    t.start()
    time.sleep(1.0)
    assert t.is_alive(), got                       # waiting on the stopped server
    os.kill(servers[1].pid, signal.SIGKILL)
    servers[1].wait()
    t.join(30)
    assert not t.is_alive(), "hung after the peer died"
    assert time.monotonic() - t0 < 15
    assert "z" not in got, "a result was returned"
    e = got["err"]
    assert isinstance(e, PeerLost), repr(e)
    assert e.rank == 2 and e.host == servers[1].address, (e.rank, e.host, str(e))
    assert "member 1" in " ".join(getattr(e, "__notes__", [])), e.__notes__


def test_a_peer_lost_mid_operation_is_peerlost_naming_it(tmp_path, monkeypatch):
    servers, _, pool = _private_pool(tmp_path, monkeypatch, 48 << 20, 20)
    try:
        n = (8 << 20) // 4
        rx = np.arange(n, dtype=np.float32)
        x = _on(pool, rx, [1])
        y = _on(pool, rx * 2, [2])
        # server 2 stopped: server 1 is waiting for its slabs when it dies
        _lost_during(servers, lambda: x[1:] + y[:-1])     # only server 1 homes the result
        # what server 1 holds is intact and readable
        np.testing.assert_array_equal(x[:1000].to_numpy(), rx[:1000])
    finally:
        pt.finalize()
        for s in servers:
            s.stop()


def test_a_peer_lost_during_a_matmul_is_peerlost_naming_it(tmp_path, monkeypatch):
    servers, _, pool = _private_pool(tmp_path, monkeypatch, 48 << 20, 20)
    try:
        ra = np.ones((4096, 256), np.float32)
        a = _on(pool, ra, [1])                       # the result's rows: server 1's
        b = _on(pool, np.ones((256, 64), np.float32), [2])  # read by server 1 from server 2
        _lost_during(servers, lambda: a @ b)
        np.testing.assert_array_equal((a[:8] @ np.ones((256, 2), np.float32)).to_numpy(),
                                      np.full((8, 2), 256, np.float32))   # server 1 works on
    finally:
        pt.finalize()
        for s in servers:
            s.stop()


def test_a_restarted_server_gets_no_plans_and_is_not_read_by_its_peers(tmp_path, monkeypatch):
    servers, secret, pool = _private_pool(tmp_path, monkeypatch, 24 << 20, 10)
    new = None
    try:
        port = servers[1].port
        os.kill(servers[1].pid, signal.SIGKILL)
        servers[1].wait()
        new = ServerProc("64MiB", secret, port=port).ready()
        assert _until(lambda: pool.world.restarts[2] == 1, 20), "not rejoined"
        assert 2 not in pool.chans
        assert all(2 not in [p[0] for p in ch.peers()] for ch in pool.chans.values())
        n = 4 * SLAB // 8
        rx = np.arange(n, dtype=np.float64)
        x, y = _on(pool, rx, [1]), _on(pool, -rx, [2])
        x + 0         # a process's first operator calibrates ops/elide.py with plans of its own
        runs = _plans(pool, "run")
        z = x[1:] + y[:-1]
        assert _plans(pool, "run") == runs          # computed here: server 2 is not trusted
        np.testing.assert_array_equal(z.to_numpy(), rx[1:] - rx[:-1])
        # so are a matmul and a copy that read server 2's slabs
        ra = np.arange(64 * 48, dtype=np.float64).reshape(64, 48)
        rb = np.arange(48 * 5, dtype=np.float64).reshape(48, 5) % 7
        a2, b2 = _on(pool, ra, [1]), _on(pool, rb, [2])
        rows = _plans(pool, "rows")
        np.testing.assert_array_equal((a2 @ b2).to_numpy(), ra @ rb)
        c = pt.empty(n - 1, placement=[1])
        c[...] = y[1:]                              # server 1 may not read server 2
        assert _plans(pool, "rows") == rows and _plans(pool, "run") == runs
        np.testing.assert_array_equal(c.to_numpy(), -rx[1:])
    finally:
        pt.finalize()
        for s in servers:
            s.stop()
        if new is not None:
            new.stop()


def test_a_stopped_peer_is_timeout_naming_it_before_the_script_gives_up(tmp_path, monkeypatch):
    servers, _, pool = _private_pool(tmp_path, monkeypatch, 24 << 20, 5)
    try:
        n = 4 * SLAB // 8
        rx = np.arange(n, dtype=np.float64)
        x, y = _on(pool, rx, [1]), _on(pool, -rx, [2])
        os.kill(servers[1].pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            with pytest.raises(Timeout) as e:
                x[1:] + y[:-1]
            # server 1 gave up on its peer first (0.8 of the script's timeout): its error,
            # not the script's own wait, and the channel is in step for the next operation
            assert time.monotonic() - t0 < 5, time.monotonic() - t0
            assert e.value.rank == 2 and e.value.host == servers[1].address, str(e.value)
            t0 = time.monotonic()           # work of server 1 alone does not wait for it
            np.testing.assert_array_equal((x * 2).to_numpy(), rx * 2)
            assert time.monotonic() - t0 < 2, time.monotonic() - t0
        finally:
            os.kill(servers[1].pid, signal.SIGCONT)
        z = x[1:] + y[:-1]
        np.testing.assert_array_equal(z.to_numpy(), rx[1:] - rx[:-1])
    finally:
        pt.finalize()
        for s in servers:
            s.stop()


def test_a_stopped_server_is_timeout_and_the_pool_goes_on_once_it_answers(tmp_path,
                                                                          monkeypatch):
    """A server that answers late (stopped; or a partition longer than the timeout) fails the
    plan and the control request waiting on it with Timeout; once it answers again, its late
    replies are dropped and the pool goes on: it was taken for broken for good ("finalize
    and init again"), and a late reply would have been read as the next request's."""
    servers, _, pool = _private_pool(tmp_path, monkeypatch, 24 << 20, 1.5)
    try:
        rx = np.arange(4 * SLAB // 8, dtype=np.float64)
        x = _on(pool, rx, [1])
        srv = pool.world.server(1)
        servers[0].pause()
        try:
            t0 = time.monotonic()
            with pytest.raises(Timeout) as e:
                x * 2
            assert e.value.rank == 1 and time.monotonic() - t0 < 4, str(e.value)
            with pytest.raises(Timeout):
                srv.request({"op": "name_list"})
            assert srv.owed >= 2          # (each waits for its own, then gives up)
        finally:
            os.kill(servers[0].pid, signal.SIGCONT)
        np.testing.assert_array_equal((x * 3).to_numpy(), rx * 3)
        assert srv.owed == 0
        assert srv.request({"op": "name_list"})["names"] == []
        assert float(x.sum()) == float(rx.sum())
    finally:
        pt.finalize()
        for s in servers:
            s.stop()


def test_a_prefetch_that_failed_earlier_is_fetched_again_by_the_read(tmp_path, monkeypatch):
    """A prefetch issued while the server was stopped fails at its deadline, before anyone
    reads its slab; the read that comes after the server is back fetches the slab anew
    rather than reporting the old failure (a Timeout in 0.002 s, long after the cause)."""
    servers, _, pool = _private_pool(tmp_path, monkeypatch, 24 << 20, 1.0)
    try:
        per = SLAB // 8
        rx = np.arange(8 * per, dtype=np.float64)
        x = _on(pool, rx, [1])
        for k in (2, 0, 1):                  # slab 2 cached, then a stream of step 1 begun
            np.testing.assert_array_equal(x[k * per:(k + 1) * per].to_numpy(),
                                          rx[k * per:(k + 1) * per])
        issued = pool.cache.prefetch_issued
        servers[0].pause()
        try:
            x[2 * per:3 * per].to_numpy()      # a hit, which prefetches slab 3 (stopped)
            assert pool.cache.prefetch_issued == issued + 1
            time.sleep(2.0)                    # past its deadline: it failed
        finally:
            os.kill(servers[0].pid, signal.SIGCONT)
        np.testing.assert_array_equal(x[3 * per:4 * per].to_numpy(), rx[3 * per:4 * per])
    finally:
        pt.finalize()
        for s in servers:
            s.stop()


def test_a_strided_output_is_written_by_the_script_not_across_servers(pool):
    # a strided view's work units cross slab boundaries: a server would have to write
    # another server's slab, so the script does that work (and the result is numpy's)
    ref = np.arange(8 * SLAB // 8, dtype=np.float64)
    x = _on(pool, ref, "interleave")
    v = x[::2]
    np.add(v, x[1::2], out=v)
    ref[::2] += ref[1::2]
    np.testing.assert_array_equal(x.to_numpy(), ref)
    np.multiply(v, 3, out=v)
    ref[::2] *= 3
    np.testing.assert_array_equal(x.to_numpy(), ref)

