"""pooltensor.dask: Dask as a way into the pool. Workers are pool members; tasks run where
their slabs live, and nothing moves that need not.

    from distributed import Client, LocalCluster
    import pooltensor as pt, pooltensor.dask as ptd
    client = Client(LocalCluster(n_workers=2, threads_per_worker=1))
    ptd.attach(client, memory="4GiB")      # every worker a member; this process member 0
    x = pt.random.default_rng(0).random((4096, 4096), dtype="float32")   # on the workers
    d = x.to_dask()                         # chunks pinned to their homes, zero-copy views
    (d * 2 + 1).sum().compute()             # each chunk's work on the worker that homes it
    y = pt.from_dask(d * 2, like=x)         # back into the pool, written where computed
    ptd.detach()

Rooms: member.py (the WorkerPlugin that makes a worker a member), session.py (attach,
detach, the SchedulerPlugin that turns a lost worker into PeerLost), views.py (slab views
and how they travel and spill), arrays.py (to_dask, from_dask, homes, map_blocks), spmd.py
(run_spmd). Workers started by hand elsewhere load it with ``dask worker ... --preload
pooltensor.dask`` (dask_setup below), so their serializers are ready before attach().
"""
from .arrays import from_dask, homes, map_blocks, row_bounds, to_dask
from . import session  # noqa: F401  (the module, apart from its attach())
from .session import LateWorkerWarning, attach, attached, detach
from .state import process_pool
from .spmd import local_part, run_spmd
from .views import SlabView

__all__ = ["attach", "detach", "attached", "LateWorkerWarning", "to_dask", "from_dask", "homes", "map_blocks",
           "run_spmd", "local_part", "process_pool", "row_bounds", "SlabView", "dask_setup"]


def dask_setup(worker):
    """``--preload pooltensor.dask``: ready a worker to become a pool member when a client
    calls attach() (slab views' serializers registered; the worker marked as ready)."""
    from .views import register
    register()
    worker.pooltensor_ready = True
