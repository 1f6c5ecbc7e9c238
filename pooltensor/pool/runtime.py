"""The process's pool: pooltensor.init(), current(), finalize(), sync().

Why a module of its own: which pool a process has, and how it came to be (SPMD under mpiexec
or the launcher; a plain script, alone or with member processes it starts), is decided once
per process, apart from what a Pool is.
"""
import atexit
import os
import threading

import collectives

from . import client, spawn
from .pool import DEFAULT_SLAB, Pool, check_slab_size

_pool = None
_init_lock = threading.Lock()


def _launched():
    """True under mpiexec or collectives.launch (every rank is then a member: SPMD)."""
    from collectives.rendezvous.bootstrap import ENV_COORD, ENV_RANK, ENV_SIZE, \
        mpi_launcher_variable
    if mpi_launcher_variable() is not None:
        return True
    if any(v in os.environ for v in (ENV_RANK, ENV_SIZE, ENV_COORD)):
        return True
    w = collectives.world.current()
    return w is not None and w.size > 1


def init(*, members=None, slab_size=None, cache_bytes=None, placement="block", memory=None,
         materialize_limit=None, advanced_limit=None, timeout=None, attach=None,
         connect=None, secret_file=None):
    """Join or build the pool and return it (later calls return the same pool).

    Under mpiexec or ``python -m collectives.launch`` every rank is a member (SPMD) and this
    call is collective. In a plain ``python script.py`` the pool has one member, this
    process, unless ``members=N``: then N-1 local member processes are started that
    contribute memory and serve it one-sided; the script is member 0.

    slab_size: bytes per slab (multiple of 64; default 1 MiB). memory: bytes each member
    contributes to each of its heaps (virtual until touched; default RAM / members on the
    host). cache_bytes: this process's slab cache budget (default RAM / 8). placement: the
    default policy (see pooltensor.placement). materialize_limit: largest to_numpy() in bytes.
    advanced_limit: largest advanced-indexing result returned as numpy (above: a pool array).
    attach: map the memory of members on this machine and read their slabs in place instead
    of copying them through the cache (default $POOLTENSOR_ATTACH, off: the cache and the
    prefetcher are what a pool spanning hosts runs on, and what this keeps exercised).

    connect: memory servers (``pooltensor serve``), e.g. ``["h1:7000", "h2:7000"]`` (default
    $POOLTENSOR_CONNECT, comma-separated): a plain script's pool whose slabs all live on the
    servers; ``memory`` is then the bytes asked of each server (default: all it has free) and
    ``secret_file`` the servers' secret (default $POOLTENSOR_SECRET_FILE, else the file
    ``pooltensor serve`` makes by default). See pooltensor.pool.client.
    """
    global _pool
    with _init_lock:
        args = dict(members=members, slab_size=slab_size, cache_bytes=cache_bytes,
                    memory=memory, materialize_limit=materialize_limit,
                    advanced_limit=advanced_limit, attach=attach)
        if connect is None and members is None and not _launched():
            connect = client.connect_from_env()
        if _pool is not None and not _pool.closed:
            if connect is not None and _pool.role != "client":
                raise ValueError("pooltensor is already initialized without memory servers; "
                                 "call pooltensor.finalize() first")
            if members is not None and members != _pool.size:
                raise ValueError(f"pooltensor is already initialized with {_pool.size} "
                                 f"member(s); call pooltensor.finalize() first")
            if slab_size is not None and slab_size != _pool.slab_size:
                raise ValueError(f"pooltensor is already initialized with slab_size "
                                 f"{_pool.slab_size}; call pooltensor.finalize() first")
            return _pool
        if slab_size is not None:
            check_slab_size(slab_size)
        kw = {k: v for k, v in args.items() if k != "members"}
        kw["placement"] = placement
        if connect is not None:
            if _launched():
                raise ValueError("connect= is for a plain script; under mpiexec or the "
                                 "launcher every rank is a member")
            if members is not None:
                raise ValueError("connect= and members= exclude each other: with memory "
                                 "servers, the servers are the members")
            kw.pop("memory")
            pool = client.start(connect, secret_file=secret_file, memory=memory,
                                timeout=timeout, **kw)
        elif _launched():
            world = collectives.init(timeout)
            if members is not None and int(members) != world.size:
                raise ValueError(f"members={members}, but this SPMD job has {world.size} "
                                 f"ranks (under mpiexec or the launcher every rank is a "
                                 f"member)")
            pool = Pool(world, role="spmd", **kw)
        else:
            n = 1 if members is None else int(members)
            if n < 1:
                raise ValueError(f"members must be >= 1, not {members}")
            if n == 1:
                pool = Pool(collectives.init(timeout), role="plain", **kw)
            else:
                procs, world = spawn.start(n, slab_size=slab_size or DEFAULT_SLAB,
                                            memory=memory, timeout=timeout)
                try:
                    pool = Pool(world, role="plain", procs=procs, owns_world=True, **kw)
                except BaseException:
                    spawn.kill(procs)
                    raise
        _pool = pool
        atexit.unregister(finalize)
        atexit.register(finalize)      # after collectives' own exit hook: runs before it
        return pool


def current(required=True):
    """The pool, initializing the embedded default (one member) if there is none."""
    p = _pool
    if p is not None and not p.closed:
        return p
    if not required:
        return None
    return init()


def finalize():
    """Release the pool: stop member processes, close windows, drop the cache."""
    global _pool
    with _init_lock:
        p, _pool = _pool, None
    if p is not None:
        p.close()


def sync():
    """Flush + barrier + revalidate (SPMD: collective): afterwards every rank sees every write."""
    current().sync()
