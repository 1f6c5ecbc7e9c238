"""Transports: how bytes reach a peer. Every transport serves the same one-sided operations
(get, put, fetch_add, compare_swap, notify) behind the native context; this module only chooses
one per peer.

- ``shm``: same machine; the peer's segments are mapped and copied directly (native/src/rma.c).
- ``tcp``: between machines; not built yet, so such peers are refused with a clear error.
"""
import os

TRANSPORTS = ("shm", "tcp")


def forced():
    """The transport named by POOLTENSOR_TRANSPORT, or None; ValueError for an unknown name."""
    name = os.environ.get("POOLTENSOR_TRANSPORT", "").strip().lower() or None
    if name and name not in TRANSPORTS:
        raise ValueError(f"POOLTENSOR_TRANSPORT={name!r}: choose one of {TRANSPORTS}")
    return name


def choose(machines, rank):
    """The transport to each rank: 'self', 'shm' on this machine, 'tcp' elsewhere, or forced."""
    force = forced()
    out = []
    for r, m in enumerate(machines):
        if r == rank:
            out.append("self")
        else:
            out.append(force or ("shm" if m == machines[rank] else "tcp"))
    return out
