"""collectives: ranks, transports, one-sided windows and collective operations.

    import collectives
    world = collectives.init()          # mpiexec, POOLTENSOR_* variables, or a world of one
    win = world.expose(1 << 20)         # every rank exposes 1 MiB
    win.put((world.rank + 1) % world.size, 0, b"hello")
    world.barrier()
"""
from .native import native_info
from .errors import (BootstrapError, CollectiveMismatch, ConnectionDropped, Finalized, PeerLost,
                     PeerRestarted, PooltensorError, RemoteAccessError, Timeout, TransportError)
from .window import Request, Window
from .world import World, finalize, init

__all__ = ["native_info", "init", "finalize", "World", "Window", "Request", "PooltensorError",
           "TransportError", "RemoteAccessError", "PeerLost", "Timeout", "BootstrapError",
           "CollectiveMismatch", "Finalized", "PeerRestarted", "ConnectionDropped"]
from .dtypes import ReduceOp  # noqa: E402
from .ops import (CollectiveRequest, allgather, allgather_async, allreduce,  # noqa: E402
                  allreduce_async, barrier, broadcast, broadcast_async, reduce_scatter,
                  reduce_scatter_async)

__all__ += ["ReduceOp", "CollectiveRequest", "allreduce", "allgather", "reduce_scatter",
            "broadcast", "barrier", "allreduce_async", "allgather_async",
            "reduce_scatter_async", "broadcast_async"]
