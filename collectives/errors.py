"""One small hierarchy for everything that can go wrong between ranks.

Each error carries the rank, host, offset and length involved (when known) so that a message
read in a log of many ranks says where to look.
"""


class PooltensorError(Exception):
    """Base of every error raised by collectives and pooltensor."""

    def __init__(self, message, *, rank=None, host=None, offset=None, length=None):
        self.rank, self.host, self.offset, self.length = rank, host, offset, length
        where = []
        if rank is not None:
            where.append(f"rank {rank}")
        if host is not None:
            where.append(f"host {host}")
        if offset is not None:
            where.append(f"offset {offset}")
        if length is not None:
            where.append(f"length {length}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)


class TransportError(PooltensorError):
    """A transport failed to move bytes (system call failed, operation not supported)."""


class RemoteAccessError(TransportError):
    """Refused where the memory lives: unknown key, out of bounds, or a write to a read-only range."""


class PeerLost(TransportError):
    """The peer process is gone; nothing more can be read from or written to it."""


class PeerRestarted(PeerLost):
    """The peer (a memory server) restarted: what it held is gone. New requests reach the new
    process; memory given by the old one is not there any more."""


class ConnectionDropped(TransportError):
    """A tcp connection dropped while a request that is not safe to repeat (fetch_add,
    compare_swap, notify, put_notify) was in flight: the target may or may not have applied it.
    The connection itself is made again (gets and puts in flight went again on their own)."""


class Timeout(PooltensorError, TimeoutError):
    """A wait ran past its timeout."""


class BootstrapError(PooltensorError):
    """The ranks could not find each other (rendezvous, launcher or MPI bootstrap failed)."""


class CollectiveMismatch(PooltensorError, ValueError):
    """Ranks called a collective with different shapes, dtypes, ops or roots."""


class Finalized(PooltensorError, RuntimeError):
    """The world was finalized (collectives.finalize()); collectives.init() starts a new one."""
