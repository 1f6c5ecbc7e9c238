"""Rendezvous: how ranks find each other before any transport exists.

An abstract key-value ``Store`` (in-process ``HashStore``, rank 0's ``TCPStore``, and
``PrefixStore`` views), ``allgather``/``barrier`` built on it, and ``bootstrap()``, which picks
MPI, environment variables or a world of one and returns rank, size and a store.
"""
from .bootstrap import Bootstrap, HostLayout, bootstrap, host_identity, host_layout
from .hash import HashStore
from .store import PrefixStore, Store, allgather, barrier, default_timeout
from .tcp import StoreServer, TCPStore

__all__ = [
    "Bootstrap", "HashStore", "HostLayout", "PrefixStore", "Store", "StoreServer", "TCPStore",
    "allgather", "barrier", "bootstrap", "default_timeout", "host_identity", "host_layout",
]
