"""pooltensor.dask on real Dask clusters (LocalCluster, worker processes, 1 thread each).

Where each task ran is read from the workers themselves (dask_checks.Recorder, a
WorkerPlugin); the bytes moved between workers from their own transfer counters; values are
checked against numpy.
"""
import os
import pickle
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("distributed")
import dask  # noqa: E402
import dask.array as da  # noqa: E402
from dask.base import tokenize  # noqa: E402
from distributed import Client, LocalCluster, futures_of, wait  # noqa: E402

import pooltensor as pt  # noqa: E402
import pooltensor.dask as ptd  # noqa: E402
from collectives.errors import PeerLost  # noqa: E402

import dask_checks  # noqa: E402
from conftest import mpiexec, mpiexec_cmd, property_settings  # noqa: E402
from hypothesis import given, strategies as st  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.timeout(180)


def _cluster(n=2, **kw):
    return LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                        dashboard_address=None, **kw)


@pytest.fixture(scope="module")
def client():
    with _cluster() as cl, Client(cl) as c:
        c.register_plugin(dask_checks.Recorder())
        ptd.attach(c, memory="128MiB", timeout=30)
        try:
            yield c
        finally:
            ptd.detach()


def _out_bytes(client):
    return sum(client.run(lambda dask_worker: dask_worker.transfer_outgoing_bytes_total)
               .values())


def test_attach_makes_every_worker_a_member(client):
    pool = pt.current()
    ranks = pool.dask_ranks
    assert sorted(ranks.values()) == [1, 2] and pool.size == 3
    got = client.run(lambda dask_worker: (dask_worker.pooltensor_rank,
                                          ptd.process_pool().me))
    assert {w: r for w, (r, _) in got.items()} == ranks
    assert all(r == me for r, me in got.values())
    # their memory limits (the worker's and its nanny's) grew by what they lend
    registered = {w: i["memory_limit"] for w, i in
                  client.scheduler_info(n_workers=-1)["workers"].items()}
    now = client.run(lambda dask_worker: dask_worker.memory_manager.memory_limit)
    nanny = client.run(lambda dask_worker: dask_worker.memory_manager.memory_limit, nanny=True)
    lent = 2 * (128 << 20)
    assert all(now[w] - registered[w] == lent for w in ranks), (now, registered)
    assert sorted(nanny.values()) == sorted(v + lent for v in registered.values())
    x = pt.zeros(1 << 20, dtype=np.float32)          # placed on the workers only
    assert set(x._a.members) == {1, 2}
    with pytest.raises(ValueError, match="already attached"):
        ptd.attach(client)


def test_tasks_touching_slabs_run_on_their_homes_with_fusion(client):
    assert not da.array_expr_enabled()
    got = dask_checks.workloads(client)
    for name, (touched, wrong) in got.items():
        assert touched >= 4, (name, touched)
        assert wrong == [], name


def test_tasks_touching_slabs_run_on_their_homes_with_query_planning():
    env = dict(os.environ, DASK_ARRAY__QUERY_PLANNING="True")
    r = subprocess.run([sys.executable, "dask_checks.py"], cwd=HERE, env=env,
                       capture_output=True, text=True, timeout=150)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "RESULT True" in r.stdout


def test_chunks_are_zero_copy_views_on_their_homes(client):
    x = pt.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)
    d = x.to_dask(chunk_bytes="1MiB")
    assert d.chunks == ((256,) * 4, (1024,))
    homes = ptd.homes(d)
    assert homes == ptd.homes(x, chunk_bytes=1 << 20)

    def probe(dask_worker, keys):
        out = {}
        for k in keys:
            if k in dask_worker.data:
                v = dask_worker.data[k]
                h = ptd.views.locate(v)
                out[k] = (type(v).__name__, h is not None and h[2] == ptd.process_pool().me)
        return out
    wait(futures_of(d))
    keys = [f.key for f in futures_of(d)]
    seen = client.run(probe, keys=keys)
    for f in futures_of(d):
        kind, local = seen[homes[f.key[1:]]][f.key]
        assert kind == "SlabView" and local


@pytest.mark.parametrize("shape,dtype", [((1000, 333), np.float64), ((4096,), np.int32),
                                         ((7, 300, 129), np.float32), ((), np.float64),
                                         ((0, 5), np.float32)])
def test_from_dask_of_to_dask_is_x(client, shape, dtype):
    host = (np.random.default_rng(1).random(shape) * 100).astype(dtype)
    x = pt.asarray(host)
    y = pt.from_dask(x.to_dask(chunk_bytes="256KiB"))
    assert y.shape == x.shape and y.dtype == x.dtype
    np.testing.assert_array_equal(y.to_numpy(), host)
    z = pt.from_dask(x.to_dask() * 2, like=x)
    np.testing.assert_array_equal(z.to_numpy(), host * 2)
    if x.size:
        assert z._a.members == x._a.members


@st.composite
def _views(draw):
    """A pool array's shape and dtype, a view of it (basic indexing) and a chunk size."""
    nd = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 40 if nd > 1 else 5000)) for _ in range(nd))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int16, np.uint8, np.complex64]))
    index = []
    for n in shape:
        a = draw(st.integers(0, n - 1))
        b = draw(st.integers(a + 1, n))
        index.append(slice(a, b, draw(st.sampled_from([1, 1, 2, 3]))))
    if draw(st.booleans()):
        index = [slice(None)] * nd             # the whole array (zero-copy chunks)
    return shape, dtype, tuple(index), draw(st.sampled_from([4096, 65536, 1 << 20]))


@property_settings("POOLTENSOR_DASK_EXAMPLES", 12, "POOLTENSOR_DERANDOMIZE")
@given(_views())
def test_round_trip_of_any_view_matches_numpy(client, case):
    shape, dtype, index, chunk = case
    host = (np.random.default_rng(11).random(shape) * 200).astype(dtype)
    x = pt.asarray(host)[index]
    d = x.to_dask(chunk_bytes=chunk)
    np.testing.assert_array_equal(d.compute(), host[index])
    np.testing.assert_array_equal(pt.from_dask(d).to_numpy(), host[index])
    np.testing.assert_array_equal(pt.from_dask(d * 2, like=x).to_numpy(), host[index] * 2)


def test_from_dask_places_slabs_where_chunks_were_computed(client):
    d = da.random.default_rng(3).random((2048, 512), chunks=(512, 512)).astype(np.float32)
    p = client.persist(d)
    wait(p)
    who = client.who_has(p)
    ranks = pt.current().dask_ranks
    y = pt.from_dask(p)
    np.testing.assert_array_equal(y.to_numpy(), p.compute())
    S = pt.current().slab_size
    for f in futures_of(p):
        i = f.key[1]
        k = i * 512 * 512 * 4 // S              # the chunk's first slab
        assert y._a.members[k] == ranks[who[f.key][0]]
    w = pt.from_dask(p, placement=[1])
    assert set(w._a.members) == {1}
    with pytest.raises(ValueError, match="like has shape"):
        pt.from_dask(p, like=pt.zeros((3, 3)))


def test_no_bytes_move_for_aligned_work_and_only_boundaries_for_misaligned(client):
    rows, cols = 4096, 256
    h = np.random.default_rng(2).random((3, rows, cols), dtype=np.float32)
    a, b, c = (pt.asarray(v).to_dask(chunk_bytes="1MiB") for v in h)
    b0 = _out_bytes(client)
    p = (a * b + c).persist()
    m = a.map_blocks(np.sin).persist()
    wait([p, m])
    assert _out_bytes(client) - b0 == 0
    np.testing.assert_allclose(p.compute(), h[0] * h[1] + h[2], rtol=1e-6)
    b1 = _out_bytes(client)
    q = (a[1:] + a[:-1]).persist()
    wait(q)
    moved = _out_bytes(client) - b1
    crossings = sum(1 for i, j in zip(ptd.homes(a).values(), list(ptd.homes(a).values())[1:])
                    if i != j)
    assert 0 < moved <= 2 * crossings * cols * 4, moved
    np.testing.assert_allclose(q.compute(), h[0][1:] + h[0][:-1], rtol=1e-6)
    f = (a + a[::-1]).persist()           # chunks meet across workers: their handles travel
    wait(f)
    np.testing.assert_allclose(f.compute(), h[0] + h[0][::-1], rtol=1e-6)
    chunks = futures_of(a)                # the copies are dropped: aligned work goes home
    deadline = time.monotonic() + 10
    while True:
        who = client.who_has(chunks)
        if all(len(who[f.key]) == 1 for f in chunks) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert {f.key: tuple(who[f.key]) for f in chunks} == \
        {f.key: (ptd.homes(a)[f.key[1:]],) for f in chunks}
    b2 = _out_bytes(client)
    p2 = (a * b + c).persist()
    wait(p2)
    assert _out_bytes(client) - b2 == 0


def test_slab_views_travel_as_handles_with_their_real_size(client):
    from dask.sizeof import sizeof
    from distributed.protocol import deserialize, serialize
    x = pt.arange(1 << 18, dtype=np.float64)
    pool = pt.current()
    v = ptd.views.slab_view(pool, x[:1000])      # the client maps the workers' heaps
    assert isinstance(v, ptd.SlabView)
    header, frames = serialize(v, serializers=("dask", "pickle"))
    assert header["serializer"] == "dask" and sum(len(f) for f in frames) < 512
    back = deserialize(header, frames)
    np.testing.assert_array_equal(back, np.arange(1000, dtype=np.float64))
    assert sizeof(v) == 8000
    copy = v + 1                                  # arithmetic: plain numpy, bytes travel
    assert type(copy) is np.ndarray
    header, frames = serialize(np.sort(v)[::-1].view(ptd.SlabView), serializers=("dask",))
    assert sum(len(memoryview(f).cast("B")) for f in frames) >= 8000
    assert pickle.loads(pickle.dumps(v)).sum() == v.sum()


def test_tokens_change_when_the_array_is_written(client):
    x = pt.zeros((512, 512), dtype=np.float32)
    t0, d0 = tokenize(x), x.to_dask().name
    assert tokenize(x) == t0
    x[3, 4] = 1
    assert tokenize(x) != t0
    d1 = x.to_dask()
    assert d1.name != d0 and float(d1.sum().compute()) == 1.0
    t1 = tokenize(x)
    x += 1
    assert tokenize(x) != t1


def test_map_blocks_and_run_spmd(client):
    import collectives
    h = np.random.default_rng(5).random((2048, 256), dtype=np.float32)
    x = pt.asarray(h)
    y = ptd.map_blocks(lambda b: np.sqrt(b) + 1, x)
    np.testing.assert_allclose(y.to_numpy(), np.sqrt(h) + 1, rtol=1e-6)
    assert y._a.members == x._a.members

    def part_sum(x):
        start, mine = ptd.local_part(x)
        return float(collectives.allreduce(np.array([mine.sum(dtype=np.float64)]))[0])
    got = ptd.run_spmd(part_sum, x)
    assert len(got) == 3 and len(set(got)) == 1
    np.testing.assert_allclose(got[0], h.sum(dtype=np.float64), rtol=1e-6)

    def make():                           # a worker never allocates shared slabs itself
        pt.zeros(10)
    with pytest.raises(ValueError, match="allocator is another process"):
        client.submit(make, pure=False).result()


def test_run_spmd_makes_pool_operations_collective_across_members(client):
    """Inside run_spmd every member's pool is SPMD: creation, elementwise work, reductions,
    indexing writes and collectives run as one world; the client keeps rank 0's arrays."""
    import collectives
    h = np.random.default_rng(8).random((1024, 512), dtype=np.float32)
    x = pt.asarray(h)
    before = pt.current().free_bytes()

    def step(x):
        pool = pt.current()
        assert pool.spmd and pool.role == "spmd"
        y = x * 2 + 1                               # each member computes what it homes
        z = pt.zeros((64, 8), dtype=np.float64)
        z[pool.me] = pool.me + 1                    # every member writes one row
        pt.sync()
        ranks_seen = float(z.sum())
        total = float(y.sum(dtype=np.float64))
        n = float(collectives.allreduce(np.array([1.0]))[0])
        scratch = pt.ones(1 << 18)                  # dropped by every member: freed
        del scratch
        return total, ranks_seen, n, (y, z) if pool.me == 0 else None

    got = ptd.run_spmd(step, x)
    want = float((h.astype(np.float64) * 2 + 1).sum())
    assert [g[1:3] for g in got] == [(6.0 * 8, 3.0)] * 3
    for g in got:
        np.testing.assert_allclose(g[0], want, rtol=1e-5)
    y, z = got[0][3]
    assert not pt.current().spmd and pt.current().role == "plain"
    np.testing.assert_allclose(y.to_numpy(), h * 2 + 1, rtol=1e-6)
    np.testing.assert_array_equal(z.to_numpy()[:3], np.repeat([[1.0], [2.0], [3.0]], 8, 1))
    w = pt.full((1024, 512), 7, dtype=np.float32)   # the client allocates after: no overlap
    np.testing.assert_allclose(y.to_numpy(), h * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(float(y.to_dask().sum().compute()), want, rtol=1e-5)
    del y, z, w, got
    assert pt.current().free_bytes() == before

    def fails_on_one(x):                            # an error on one member: raised here,
        if pt.current().me == 1:                    # the others are not left waiting
            raise ArithmeticError("member 1 failed")
        return float((x + 1).sum())
    t0 = time.monotonic()
    with pytest.raises(ArithmeticError, match="member 1 failed"):
        ptd.run_spmd(fails_on_one, x)
    assert time.monotonic() - t0 < 25
    token = tokenize(x)

    def bump(x):                                    # each member adds 1 to its own part
        start, mine = ptd.local_part(x)
        mine += 1
        pt.sync()                                   # every member's writes seen by all
        return float(x[5, 5])
    assert ptd.run_spmd(bump, x) == [float(h[5, 5]) + 1] * 3
    assert tokenize(x) != token                     # written by the members: a new token
    np.testing.assert_array_equal(x.to_dask().compute(), h + 1)


def test_attach_errors_are_clear(client):
    with pytest.raises(ValueError, match="already attached"):
        ptd.attach(client, memory="1GiB")
    with pytest.warns(ResourceWarning, match="more than its"):
        ptd.session._budget(list(pt.current().dask_ranks), 1 << 50, 1 << 20)
    with pytest.raises(ValueError, match="8GiB"):
        ptd.session._bytes("lots", "memory")
    with pytest.raises(ValueError, match="both"):
        pt.from_dask(pt.zeros(4).to_dask(), placement=[1], like=pt.zeros(4))
    with pytest.raises(ValueError, match="private"):
        pt.zeros(4, access="private").to_dask()
    with pytest.raises(TypeError):
        ptd.homes(object())


@pytest.mark.timeout(240)
def test_dask_mpi_under_mpiexec_4(tmp_path):
    pytest.importorskip("dask_mpi")
    if mpiexec() is None:
        pytest.skip("no mpiexec")
    script = os.path.join(HERE, "scripts", "dask_mpi_job.py")
    r = subprocess.run(mpiexec_cmd(4) + [sys.executable, script], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "DASK-MPI OK" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
