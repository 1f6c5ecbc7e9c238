"""pooltensor's errors: a few subclasses of the one hierarchy collectives defines.

Every pooltensor error is a ``collectives.PooltensorError`` (so one ``except`` catches anything
that went wrong between processes) and also the builtin exception a numpy user would expect
(``MemoryError``, ``ValueError``, ``RuntimeError``), so existing handlers keep working.
"""
from collectives.errors import PooltensorError


class PoolOutOfMemory(PooltensorError, MemoryError):
    """The pool has too few free slabs for an allocation. ``free`` maps member -> free bytes;
    ``partition`` names the partition that refused it (None: the memory itself)."""

    def __init__(self, message, *, free=None, needed=None, partition=None, **kw):
        self.free = dict(free or {})
        self.needed = needed
        self.partition = partition
        if free is not None:
            parts = ", ".join(f"member {m}: {b} B" for m, b in sorted(self.free.items()))
            message = f"{message}; free per member: {parts}"
        super().__init__(message, **kw)


class PoolClosed(PooltensorError, RuntimeError):
    """The pool was finalized (or never initialized) and the operation needs it."""


class MaterializeTooLarge(PooltensorError, ValueError):
    """to_numpy()/__array__ refused: the selection is larger than the configured limit."""


class FallbackWarning(UserWarning):
    """A numpy function or ufunc method with no pooltensor implementation ran on numpy copies
    of the pool arrays (materialized in this process: slow, and bounded by materialize_limit)."""


PerformanceWarning = FallbackWarning


class HugePageWarning(UserWarning):
    """Shared memory on this machine gets no transparent huge pages (shmem_enabled is off):
    pool memory is backed 4 KiB at a time, which is slower (never wrong). Said once per
    process; silenced by POOLTENSOR_THP_WARNING=0 or a warnings filter."""
