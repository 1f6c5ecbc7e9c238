"""A Dask worker as a pool member: the WorkerPlugin that joins it to the client's pool.

attach() (session.py) gives every worker present a rank 1..N and registers ``Member`` with
this configuration; on each worker its setup joins the world through the same machinery a
plain script's member processes use (pool/spawn.py ``join``: the bootstrap variables for the
call alone, an MPI launcher's hidden, so workers started by dask-mpi join too) and builds the
member's Pool (pool/member.py ``build``): from then on the worker's memory is served
one-sided by the native engine, with no part of Dask or of its Python taking part, and tasks
running on it find the pool with ``process_pool()``.

Memory. The pool's pages count in the worker's RSS, which Dask holds against the worker's
``memory_limit`` (spilling at 60 %, pausing at 80 %, the nanny restarting it at 95 %): the
setup raises the worker's limit (and its nanny's, through ``NannyLimit``) by the bytes it
lends, so lending memory does not make Dask spill or kill the worker. A worker without a
limit is left without one.

A worker that joins the cluster after attach() is not a member (a world's size is fixed
when it is made): its setup marks it so (``pooltensor_rank`` None), work on pool arrays is
never pinned to it, and the client is told (session.py, LateWorkerWarning).
"""
import asyncio
import logging
import threading

from distributed.diagnostics.plugin import NannyPlugin, WorkerPlugin

from ..pool import member as _member
from ..pool import runtime, spawn
from .state import process_pool, set_process_pool  # noqa: F401  (process_pool: re-exported)

log = logging.getLogger("pooltensor.dask")
PLUGIN = "pooltensor-member"
NANNY_PLUGIN = "pooltensor-nanny-limit"

_lock = threading.Lock()


def lent(cfg):
    """Bytes a worker lends: its rw and ro heaps (virtual until touched)."""
    S = int(cfg["slab_size"])
    return 2 * (int(cfg["memory"]) // S * S)


class Member(WorkerPlugin):
    """Makes the worker it runs on member `ranks[address]` of the client's pool."""

    name = PLUGIN
    idempotent = False

    def __init__(self, ranks, size, coord, cfg):
        self.ranks = dict(ranks)       # worker address -> rank
        self.size = size
        self.coord = coord
        self.cfg = dict(cfg)           # slab_size, memory, cache_bytes, timeout, token
        self.rank = None

    async def setup(self, worker):
        """Join the pool (in a thread: the rendezvous waits for every member)."""
        rank = self.ranks.get(worker.address)
        if rank is None:
            log.warning("pooltensor: worker %s joined after attach(): not a pool member",
                        worker.address)
            worker.pooltensor_rank = None
            return
        self.rank = rank
        await asyncio.get_running_loop().run_in_executor(None, self._join, rank)
        add = lent(self.cfg)
        mm = getattr(worker, "memory_manager", None)
        if mm is not None and mm.memory_limit:
            mm.memory_limit = int(mm.memory_limit) + add
        worker.pooltensor_rank = rank

    def _join(self, rank):
        from . import views
        views.register()
        with _lock:
            world = spawn.join(rank, self.size, self.coord, self.cfg.get("timeout"))
            pool = _member.build(world, self.cfg)
            pool.token = self.cfg["token"]
            pool.dask_ranks = dict(self.ranks)
            set_process_pool(pool)
            try:
                runtime.adopt(pool, memory=self.cfg["memory"])
            except ValueError:
                pass              # the process had a pool of its own: tasks use ours by name

    async def teardown(self, worker):
        """Leave the pool (collective with the client's detach(); in a thread). A worker
        that is closing leaves alone: the others see it gone (PeerLost), none waits for it."""
        if self.rank is None:
            return
        from distributed.core import Status
        if worker.status != Status.running:
            set_process_pool(None)
            return
        await asyncio.get_running_loop().run_in_executor(None, leave)


def leave():
    """Close this process's pool and leave its world (every member does it together)."""
    import collectives
    with _lock:
        pool = process_pool(required=False)
        set_process_pool(None)
        if pool is None:
            return
        if runtime.current(required=False) is pool:
            runtime.finalize()
        else:
            pool.close()
        if collectives.world.current() is pool.world:
            collectives.finalize()


class NannyLimit(NannyPlugin):
    """Raises a nanny's memory limit by what its worker lends (the nanny restarts a worker
    whose RSS passes 95 % of its own copy of the limit)."""

    name = NANNY_PLUGIN
    restart = False

    def __init__(self, add):
        self.add = int(add)

    def setup(self, nanny):
        """Add the lent bytes to the nanny's limit (when it has one)."""
        mm = getattr(nanny, "memory_manager", None)
        if mm is not None and mm.memory_limit:
            mm.memory_limit = int(mm.memory_limit) + self.add
