"""pooltensor.dask under memory pressure and faults, each on a cluster of its own (a process
holds one attached pool at a time, so apart from test_dask.py's): spilling writes handles,
not slab bytes; a killed worker is PeerLost, never a wait for it."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("distributed")
import dask  # noqa: E402
from distributed import Client, LocalCluster, futures_of, wait  # noqa: E402

import pooltensor as pt  # noqa: E402
import pooltensor.dask as ptd  # noqa: E402
import collectives  # noqa: E402
from collectives.errors import PeerLost  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def _cluster(n=2, **kw):
    return LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                        dashboard_address=None, **kw)


def test_spilling_writes_handles_not_slab_bytes(tmp_path):
    cfg = {"distributed.worker.memory.target": 0.001, "distributed.worker.memory.spill": False,
           "distributed.worker.memory.pause": False,
           "distributed.worker.memory.terminate": False}
    with dask.config.set(cfg), _cluster(1, memory_limit="512MiB",
                                        local_directory=str(tmp_path)) as cl, Client(cl) as c:
        ptd.attach(c, memory="64MiB", timeout=30)
        try:
            h = np.random.default_rng(7).random((4096, 512), dtype=np.float32)
            x = pt.asarray(h)
            d = x.to_dask(chunk_bytes="1MiB")
            wait(client_futures := futures_of(d))
            got = c.run(lambda dask_worker: (len(dask_worker.data.slow),
                                             tuple(dask_worker.data.spilled_total)))
            (nslow, (mem, disk)), = got.values()
            assert nslow >= 6 and mem >= 6 << 20, got
            assert disk < 1024 * nslow, got                 # handles, not 8 MiB of slabs
            np.testing.assert_array_equal(d.compute(), h)   # unspilled: the slabs again
            assert len(client_futures) == 8
        finally:
            ptd.detach()


def test_killed_worker_is_peer_lost_not_a_wait():
    with _cluster(2) as cl, Client(cl) as c:
        ptd.attach(c, memory="64MiB", timeout=20)
        try:
            x = pt.asarray(np.ones((2048, 512), np.float32))
            d = x.to_dask(chunk_bytes="1MiB")
            wait(futures_of(d))
            ranks = pt.current().dask_ranks
            victim = [w for w, r in ranks.items() if r == 2][0]
            pid = c.run(os.getpid, workers=[victim])[victim]
            os.kill(pid, signal.SIGKILL)
            t0 = time.monotonic()
            with pytest.raises(PeerLost, match=r"member 2 \(Dask worker"):
                (d + 1).sum().compute(timeout=60)
            assert time.monotonic() - t0 < 30
            t0 = time.monotonic()              # work pinned to the lost member later
            with pytest.raises(PeerLost, match=r"member 2 \(Dask worker"):
                x.to_dask(chunk_bytes="1MiB").sum().compute(timeout=60)
            assert time.monotonic() - t0 < 30
            t0 = time.monotonic()              # SPMD over a world with a lost member
            with pytest.raises(PeerLost):
                ptd.run_spmd(lambda: collectives.allreduce(np.ones(1)))
            assert time.monotonic() - t0 < 30 and not pt.current().spmd
            y = pt.asarray(np.arange(4096.0), placement=[1])  # the rest keeps working
            assert float(y.to_dask().sum().compute(timeout=30)) == float(np.arange(4096.0).sum())
        finally:
            ptd.detach()


def test_worker_joining_after_attach_is_reported_and_left_out():
    """A pool's world cannot grow: a worker added by scale() is no member; the client is
    warned once, pool work keeps to the members, and pool calls on it say why they fail."""
    import warnings
    with _cluster(1) as cl, Client(cl) as c:
        ptd.attach(c, memory="64MiB", timeout=30)
        try:
            (member,) = pt.current().dask_ranks
            cl.scale(2)
            c.wait_for_workers(2, timeout=60)
            deadline = time.monotonic() + 20
            while not ptd.session.late_workers() and time.monotonic() < deadline:
                time.sleep(0.1)
            (late,) = ptd.session.late_workers()
            assert late != member
            assert c.run(lambda dask_worker: dask_worker.pooltensor_rank) == {member: 1,
                                                                               late: None}
            h = np.arange(1 << 16, dtype=np.float64).reshape(256, 256)
            with pytest.warns(ptd.LateWorkerWarning, match="not pool members"):
                x = pt.asarray(h)
                d = x.to_dask(chunk_bytes="64KiB")
            with warnings.catch_warnings():
                warnings.simplefilter("error", ptd.LateWorkerWarning)   # once per worker
                assert float((d + 1).sum().compute()) == float((h + 1).sum())
                assert set(ptd.homes(d).values()) == {member}
            # a graph joining pool chunks with bigger data on the late worker: the tasks
            # taking chunks stay on the member (else the slab views would travel there)
            import dask.array as da
            big = c.scatter(np.ones((256, 256, 4)), workers=[late])
            db = da.from_delayed(dask.delayed(big), (256, 256, 4), dtype=np.float64)
            got = (d[:, :, None] + db).persist()
            wait(got)
            assert {w for ws in c.who_has(got).values() for w in ws} == {member}
            np.testing.assert_array_equal(got.compute(), h[:, :, None] + np.ones((1, 1, 4)))
            with pytest.raises(RuntimeError, match="joined the cluster after attach"):
                c.submit(ptd.process_pool, workers=[late], pure=False).result(timeout=30)
        finally:
            ptd.detach()


def test_workers_started_by_hand_with_preload(tmp_path):
    """`dask worker ADDRESS --preload pooltensor.dask`, as on other machines: readied at start,
    made members by attach()."""
    with LocalCluster(n_workers=0, dashboard_address=None) as cl, Client(cl) as c:
        exe = os.path.join(os.path.dirname(sys.executable), "dask")
        procs = [subprocess.Popen([exe, "worker", cl.scheduler_address, "--nthreads", "1",
                                   "--no-nanny", "--preload", "pooltensor.dask",
                                   "--local-directory", str(tmp_path / str(i))],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for i in range(2)]
        try:
            c.wait_for_workers(2, timeout=60)
            ready = c.run(lambda dask_worker: getattr(dask_worker, "pooltensor_ready", False))
            assert list(ready.values()) == [True, True]
            ptd.attach(c, memory="64MiB", timeout=30)
            try:
                h = np.arange(1 << 18, dtype=np.float64).reshape(512, 512)
                x = pt.asarray(h)
                assert float(x.to_dask(chunk_bytes="256KiB").sum().compute()) == h.sum()
            finally:
                ptd.detach()
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()


def test_handles_read_one_sided_when_nothing_is_mapped():
    """attach=False: no process maps another's heap (as across machines), so a slab view that
    reaches another worker, or the client, is read with a one-sided get from its home."""
    with _cluster(2) as cl, Client(cl) as c:
        ptd.attach(c, memory="64MiB", timeout=30, attach=False)
        try:
            assert not pt.current().mapped
            h = np.random.default_rng(9).random((2048, 128), dtype=np.float32)
            d = pt.asarray(h).to_dask(chunk_bytes="256KiB")
            q = (d[1:] + d[:-1]).persist()              # boundary rows cross workers
            np.testing.assert_allclose(q.compute(), h[1:] + h[:-1], rtol=1e-6)
            np.testing.assert_array_equal(d.compute(), h)   # gathered by the client
        finally:
            ptd.detach()
