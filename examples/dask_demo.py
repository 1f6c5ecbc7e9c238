"""Dask as a way into the pool: the workers of a LocalCluster lend their memory to one pool and
run the tasks that touch their slabs, and nothing moves between them that need not.

    python examples/dask_demo.py

What it shows: a pool across the workers (this process is member 0 and lends none), a pool
array seen as a dask array whose chunks are zero-copy views on the workers that home them, a
computation on it next to plain dask.array on the same values, how many tasks each worker ran
and how many bytes the workers sent each other, and the result written back into the pool.
"""
import time

import numpy as np
from distributed import Client, LocalCluster, WorkerPlugin, futures_of, wait

import pooltensor as pt
import pooltensor.dask as ptd


class CountTasks(WorkerPlugin):
    """Counts the tasks each worker runs."""

    name = "demo-count"

    def setup(self, worker):
        """Start counting at 0."""
        self.worker = worker
        worker.demo_tasks = 0

    def transition(self, key, start, finish, **kw):
        """One more task done."""
        if start == "executing" and finish == "memory":
            self.worker.demo_tasks += 1


def counters(client):
    """worker -> (tasks run, bytes sent to other workers), since the cluster started."""
    return client.run(lambda dask_worker: (dask_worker.demo_tasks,
                                           dask_worker.transfer_outgoing_bytes_total))


def main():
    import dask.array as da
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.register_plugin(CountTasks())
        pool = ptd.attach(client, memory="512MiB")
        print(f"pool: {pool.size} members: this process (member 0, lends nothing) and the "
              f"workers {pool.dask_ranks}")
        try:
            rows, cols = 16384, 1024                     # 64 MiB of float32 per array
            plain = [da.random.default_rng(s).random((rows, cols), dtype=np.float32,
                                                      chunks=(2048, cols)) for s in (1, 2, 3)]
            plain = client.persist(plain)
            wait(plain)
            a = pt.from_dask(plain[0])                   # written where each chunk was made
            b, c = (pt.from_dask(p, like=a) for p in plain[1:])
            print(f"a, b, c: {a.shape} {a.dtype} each, slabs on members "
                  f"{sorted(set(a._a.members))}, lined up")
            da_, db, dc = (x.to_dask() for x in (a, b, c))
            wait(futures_of(da_) + futures_of(db) + futures_of(dc))   # the chunk views made
            print(f"a as a dask array: {da_.numblocks[0]} chunks, homes {ptd.homes(da_)}")

            before = counters(client)
            t0 = time.perf_counter()
            got = float((da_ * db + dc).sum().compute())
            t_pool = time.perf_counter() - t0
            mid = counters(client)
            t0 = time.perf_counter()
            want = float((plain[0] * plain[1] + plain[2]).sum().compute())
            t_plain = time.perf_counter() - t0
            after = counters(client)
            print(f"(a * b + c).sum(): {got:.6g} on pool arrays in {t_pool:.3f} s, "
                  f"{want:.6g} with plain dask.array in {t_plain:.3f} s")
            for w in sorted(before):
                print(f"  {w}: pool run {mid[w][0] - before[w][0]} tasks, sent "
                      f"{mid[w][1] - before[w][1]} B to other workers; plain run "
                      f"{after[w][0] - mid[w][0]} tasks, sent {after[w][1] - mid[w][1]} B")

            y = pt.from_dask(np.sqrt(da_) * 2 + db, like=a)   # back into the pool, in place
            check = np.sqrt(a[:4, :4].to_numpy()) * 2 + b[:4, :4].to_numpy()
            assert np.allclose(y[:4, :4].to_numpy(), check)
            print(f"y = sqrt(a) * 2 + b written into the pool where it was computed: "
                  f"y[0, :3] = {y[0, :3].to_numpy()}")
        finally:
            ptd.detach()


if __name__ == "__main__":
    main()
