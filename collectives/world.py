"""The World: who the ranks are, where they live, and how to reach each one.

Bootstrapped once per process (mpiexec, POOLTENSOR_* variables and a TCP rendezvous, or a world
of one). Endpoint records are exchanged as msgpack through the rendezvous store; same-host peers
then map each other's control blocks, so barriers and one-sided transfers between them go
through shared memory with no store traffic.
"""
import os
import socket
import threading

import msgpack

from . import _native
from .errors import PeerLost, Timeout, TransportError
from .rendezvous import store as _store
from .rendezvous.bootstrap import bootstrap, host_identity
from .window import Window, raise_native

TRANSPORTS = ("shm", "tcp")


def _env_timeout():
    return float(os.environ.get("POOLTENSOR_TIMEOUT", "60"))


class World:
    """The ranks of one job. Made by collectives.init(); do not build one directly."""

    def __init__(self, boot, timeout=None):
        self.timeout = _env_timeout() if timeout is None else float(timeout)
        self.rank, self.size = boot.rank, boot.size
        self.how = boot.how
        self._boot = boot
        self._store = boot.store
        self._seq = 0
        self._lock = threading.Lock()
        self._segments = {}
        threads = int(os.environ.get("POOLTENSOR_PROGRESS_THREADS", "1"))
        self._ctx = _native.Context(self.rank, self.size, threads)
        me = {"rank": self.rank, "host": host_identity(), "hostname": socket.gethostname(),
              "pid": os.getpid(), "ctrl": list(self._ctx.addr())}
        recs = [msgpack.unpackb(b) for b in self._allgather_bytes(msgpack.packb(me), "world")]
        self.hosts = [r["hostname"] for r in recs]
        self.host = self.hosts[self.rank]
        ident = [r["host"] for r in recs]
        self.local_ranks = [r for r in range(self.size) if ident[r] == ident[self.rank]]
        self.local_rank = self.local_ranks.index(self.rank)
        self.local_size = len(self.local_ranks)
        self.pids = [r["pid"] for r in recs]
        forced = os.environ.get("POOLTENSOR_TRANSPORT", "").strip().lower() or None
        if forced and forced not in TRANSPORTS:
            raise ValueError(f"POOLTENSOR_TRANSPORT={forced!r}: choose one of {TRANSPORTS}")
        self.transports = []
        for r in range(self.size):
            local = ident[r] == ident[self.rank]
            self.transports.append("self" if r == self.rank else
                                   forced or ("shm" if local else "tcp"))
            if local and r != self.rank:
                try:
                    self._ctx.connect(r, tuple(recs[r]["ctrl"]))
                except _native.Error as e:
                    raise_native(e, rank=r, host=self.hosts[r], what="connect")
        self._closed = False
        self.barrier()

    # -- collective helpers over the rendezvous store --------------------------------------
    def _next_tag(self, what):
        with self._lock:
            self._seq += 1
            return f"{what}/{self._seq}"

    def _allgather_bytes(self, value, what):
        return _store.allgather(self._store, self._next_tag(what), self.rank, self.size, value,
                                self.timeout)

    def allgather_object(self, obj):
        """Gather one msgpack-able object from every rank (for setup, not for data)."""
        return [msgpack.unpackb(b) for b in self._allgather_bytes(msgpack.packb(obj), "obj")]

    def _route(self, rank):
        t = self.transports[rank]
        if t == "tcp":
            raise TransportError("no transport reaches this peer yet: only shared memory "
                                 "between ranks on one host is built", rank=rank,
                                 host=self.hosts[rank])

    def _lost(self):
        return [r for r in range(self.size) if r != self.rank and self._ctx.peer_lost(r)]

    # -- public -----------------------------------------------------------------------------
    def barrier(self, timeout=None):
        """Return once every rank has called barrier(); PeerLost or Timeout otherwise."""
        timeout = self.timeout if timeout is None else timeout
        if self.size == 1:
            return
        if self.local_size == self.size:
            try:
                self._ctx.barrier(self.local_ranks[0], self.local_ranks, timeout)
            except _native.Error as e:
                lost = self._lost()
                if e.args[0] == _native.ERR_PEER_LOST and lost:
                    raise PeerLost("barrier: a rank is gone", rank=lost[0],
                                   host=self.hosts[lost[0]]) from None
                if e.args[0] == _native.ERR_TIMEOUT:
                    raise Timeout(f"barrier: not every rank arrived within {timeout} s",
                                  rank=self.rank, host=self.host) from None
                raise_native(e, rank=self.rank, host=self.host, what="barrier")
        else:
            _store.barrier(self._store, self._next_tag("barrier"), self.rank, self.size, timeout)

    def alloc(self, nbytes):
        """Shared memory that windows serve directly (atomics included): a uint8 numpy array."""
        import numpy as np
        seg = _native.Segment(max(int(nbytes), 1))
        self._ctx.add_segment(seg)
        self._segments[id(seg)] = seg
        return np.frombuffer(seg, dtype=np.uint8)[:int(nbytes)]

    def _release_segment(self, arr):
        seg = arr.base
        while seg is not None and not isinstance(seg, _native.Segment):
            seg = getattr(seg, "base", None) or getattr(seg, "obj", None)
        if seg is not None and self._segments.pop(id(seg), None) is not None:
            self._ctx.remove_segment(seg)

    def expose(self, buffer, access="rw"):
        """Collective: every rank exposes memory (a buffer, an int number of bytes to allocate,
        or None for nothing); returns the Window over all of them."""
        if access not in ("r", "rw"):
            raise ValueError(f"access must be 'r' or 'rw', not {access!r}")
        owned = None
        if buffer is None:
            buffer = bytearray(0)
        elif isinstance(buffer, int):
            buffer = owned = self.alloc(buffer)
        mv = memoryview(buffer)
        if not mv.c_contiguous:
            raise ValueError("expose needs a C-contiguous buffer")
        if access == "rw" and mv.readonly:
            raise ValueError("a read-only buffer can only be exposed with access='r'")
        key = self._ctx.register(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv,
                                 1 if access == "r" else 3)
        recs = self.allgather_object([key, mv.nbytes, access])
        return Window(self, buffer, access, [r[0] for r in recs], [r[1] for r in recs],
                      [r[2] for r in recs], owned)

    def describe(self):
        """Ranks, hosts and the transport to each peer, as a dict."""
        return {"rank": self.rank, "size": self.size, "local_rank": self.local_rank,
                "local_size": self.local_size, "host": self.host, "hosts": list(self.hosts),
                "bootstrap": self.how, "transports": list(self.transports),
                "kernels": _native.kernels_isa() if hasattr(_native, "kernels_isa") else None}

    def close(self):
        """Leave the world: a last barrier (best effort), then release every native resource."""
        if self._closed:
            return
        self._closed = True
        try:
            self.barrier(timeout=min(self.timeout, 10.0))
        except Exception:
            pass
        self._ctx.close()
        self._boot.close()

    def __repr__(self):
        return (f"<World rank {self.rank}/{self.size} local {self.local_rank}/{self.local_size} "
                f"host {self.host!r} via {self.how}>")


_world = None
_world_lock = threading.Lock()


def init(timeout=None):
    """Join the job and return the World (idempotent: later calls return the same one)."""
    global _world
    with _world_lock:
        if _world is None or _world._closed:
            _world = World(bootstrap(timeout), timeout)
            import atexit
            atexit.register(finalize)
        return _world


def finalize():
    """Close the World, if one was made (called at exit too)."""
    global _world
    with _world_lock:
        w, _world = _world, None
    if w is not None:
        w.close()
