"""What tests/test_dask.py checks on a Dask cluster attached to a pool, in a module of its own
so that a subprocess with other Dask settings (array.query-planning) runs the same checks.

``Recorder`` is a WorkerPlugin that logs, for every task a worker finishes, its key and the
keys of its inputs; ``ran_on_homes`` then says, for every task whose inputs include a chunk
of a to_dask() array, whether it ran on the worker that homes that chunk.
"""
import numpy as np
from distributed import WorkerPlugin, futures_of

import pooltensor as pt
import pooltensor.dask as ptd


class Recorder(WorkerPlugin):
    """Logs (key, input keys) of each task this worker executes."""

    name = "test-recorder"

    def setup(self, worker):
        """Start an empty log on the worker."""
        worker.test_log = []
        self.worker = worker

    def transition(self, key, start, finish, **kw):
        """A task that finished executing: log it with its inputs."""
        if start == "executing" and finish == "memory":
            ts = self.worker.state.tasks.get(key)
            deps = [d.key for d in ts.dependencies] if ts is not None else []
            self.worker.test_log.append((key, deps))


def take_log(client):
    """worker -> [(key, deps)] since the last call (the logs are emptied)."""
    def take(dask_worker):
        out, dask_worker.test_log = list(dask_worker.test_log), []
        return out
    return client.run(take)


def ran_on_homes(log, homes_by_name):
    """(tasks that touched a slab chunk, [(key, chunk, ran on, home)] of those that ran
    elsewhere). homes_by_name: dask array name -> {block index: worker}."""
    touched, wrong = 0, []
    for worker, rows in log.items():
        for key, deps in rows:
            hit = False
            for dep in deps:
                if isinstance(dep, tuple) and dep and dep[0] in homes_by_name:
                    hit = True
                    home = homes_by_name[dep[0]][tuple(dep[1:])]
                    if home != worker:
                        wrong.append((key, dep, worker, home))
            touched += hit
    return touched, wrong


def workloads(client, n=3, rows=4096, cols=256, seed=0, chunk_bytes=1 << 20):
    """Run persist, elementwise, map_blocks and sum on pool arrays through Dask, checking
    every value against numpy and where each task touching a slab ran. Returns
    {workload: (tasks touching slabs, misplaced)}."""
    rng = np.random.default_rng(seed)
    host = [rng.random((rows, cols), dtype=np.float32) for _ in range(n)]
    xs = [pt.asarray(h) for h in host]
    ds = [x.to_dask(chunk_bytes=chunk_bytes) for x in xs]
    names = {}
    for d in ds:                # the collection's name and its futures' (query planning)
        names[d.name] = ptd.homes(d)
        for f in futures_of(d):
            names[f.key[0]] = ptd.homes(d)
    a, b, c = ds
    A, B, C = host
    take_log(client)
    out = {}
    p = (a * b + c).persist()
    np.testing.assert_allclose(p.compute(), A * B + C, rtol=1e-6)
    out["persist"] = ran_on_homes(take_log(client), names)
    e = (np.sin(a) * 2 + b).compute()
    np.testing.assert_allclose(e, np.sin(A) * 2 + B, rtol=1e-5)
    out["elementwise"] = ran_on_homes(take_log(client), names)
    m = a.map_blocks(lambda blk: blk * 3 - 1, dtype=np.float32).compute()
    np.testing.assert_allclose(m, A * 3 - 1, rtol=1e-6)
    out["map_blocks"] = ran_on_homes(take_log(client), names)
    s = (a + b).sum().compute()
    np.testing.assert_allclose(s, (A.astype(np.float64) + B).sum(), rtol=1e-4)
    out["sum"] = ran_on_homes(take_log(client), names)
    del p
    return out


def main():
    """Under array.query-planning (run by test_dask.py in a subprocess): the workloads on a
    fresh cluster, one line of results, exit status 0 when every check held."""
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster
    assert da.array_expr_enabled() == bool(dask.config.get("array.query-planning"))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cl, Client(cl) as client:
        client.register_plugin(Recorder())
        ptd.attach(client, memory="128MiB", timeout=30)
        try:
            got = workloads(client)
        finally:
            ptd.detach()
    print("RESULT", da.array_expr_enabled(), got)
    bad = {k: v for k, v in got.items() if v[0] == 0 or v[1]}
    return 1 if bad else 0


if __name__ == "__main__":
    import sys
    sys.exit(main())
