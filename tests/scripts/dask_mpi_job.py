"""Under ``mpiexec -n 4``: dask-mpi makes rank 0 the scheduler, rank 1 the client (this
script's body) and ranks 2-3 the workers; the client attaches a pool to them. The ranks
running the scheduler and the client lend no slabs. Prints DASK-MPI OK from the client."""
import sys

import numpy as np
from dask_mpi import initialize
from distributed import Client

import pooltensor as pt
import pooltensor.dask as ptd

initialize(dashboard=False, nthreads=1, memory_limit=None, interface=None)

with Client() as client:
    client.wait_for_workers(2, timeout=60)
    pool = ptd.attach(client, memory="64MiB", timeout=30)
    try:
        assert pool.size == 3 and sorted(pool.dask_ranks.values()) == [1, 2]
        h = np.random.default_rng(0).random((2048, 256), dtype=np.float32)
        x = pt.asarray(h)
        assert set(x._a.members) == {1, 2}          # the client's rank lends none
        d = x.to_dask(chunk_bytes="512KiB")
        got = float((d * 2).sum().compute())
        assert abs(got - 2 * h.sum(dtype=np.float64)) < 1e-3 * abs(got), got
        y = pt.from_dask(d + 1, like=x)
        np.testing.assert_allclose(y.to_numpy(), h + 1, rtol=1e-6)
        mpi = client.run(lambda: __import__("mpi4py.MPI").MPI.COMM_WORLD.Get_rank())
        print("worker MPI ranks", sorted(mpi.values()))
    finally:
        ptd.detach()
print("DASK-MPI OK", flush=True)
sys.stdout.flush()
