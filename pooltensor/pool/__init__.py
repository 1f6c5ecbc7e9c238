"""The pool room: members, the global address space, the allocator, placement, access modes,
memory servers and their clients, and the runtime of init/finalize.

It knows nothing of arrays: it hands out Allocations (lists of slabs on members) and serves
their bytes through collectives' Windows. Rooms above it (cache users, array, ops) reach it
through ``runtime.current()`` and the Pool's methods.
"""
from .pool import Allocation, Pool

__all__ = ["Allocation", "Pool"]
