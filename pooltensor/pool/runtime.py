"""The process's pool: pooltensor.init(), current(), finalize(), sync().

Why a module of its own: which pool a process has, and how it came to be (SPMD under mpiexec
or the launcher; a plain script, alone or with member processes it starts), is decided once
per process, apart from what a Pool is.
"""
import atexit
import logging
import math
import operator
import os
import threading

import numpy as np

import collectives

from . import client, mapping, spawn
from . import placement as _placement
from .pool import DEFAULT_SLAB, Pool, check_slab_size

_log = logging.getLogger("pooltensor")
_pool = None
_made = {}               # what the pool was made with: argument -> value (resolved)
_init_lock = threading.Lock()
# the arguments a second init() must agree on, in the order they are checked
_AGREE = ("members", "slab_size", "cache_bytes", "placement", "memory", "materialize_limit",
          "advanced_limit", "attach", "timeout", "connect", "partition")


def _count(name, v, low):
    """An integer argument, as Python takes one (operator.index: no float, no str), >= low."""
    try:
        n = operator.index(v)
    except TypeError as e:
        raise TypeError(f"{name}: {e}") from None
    if n < low:
        raise ValueError(f"{name} must be >= {low}, not {n}")
    return n


def _check_args(members, slab_size, cache_bytes, placement, memory, materialize_limit,
                advanced_limit, timeout, attach):
    """init()'s arguments checked (TypeError/ValueError naming the bad one); the given ones
    normalized, None kept for the ones not given."""
    out = {"members": None if members is None else _count("members", members, 1),
           "slab_size": None if slab_size is None else check_slab_size(slab_size),
           "placement": placement}
    for name, v, low in (("cache_bytes", cache_bytes, 0), ("memory", memory, 1),
                         ("materialize_limit", materialize_limit, 0),
                         ("advanced_limit", advanced_limit, 0)):
        out[name] = None if v is None else _count(name, v, low)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) and \
                not hasattr(type(timeout), "__float__"):
            raise TypeError(f"timeout must be a number of seconds, not "
                            f"{type(timeout).__name__}")
        timeout = float(timeout)
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout}")
    out["timeout"] = timeout
    if attach is not None and not isinstance(attach, (bool, np.bool_)):
        raise TypeError(f"attach must be True, False or None, not {type(attach).__name__}")
    out["attach"] = None if attach is None else bool(attach)
    return out


def _made_with(pool, given):
    """What `pool` was made with: the arguments given, defaults resolved where the pool
    knows them (None where it does not: memory it was not given)."""
    attach = given["attach"]
    if attach is None:
        attach = mapping.attach_default()
    return {"members": pool.size, "slab_size": pool.slab_size,
            "cache_bytes": pool.cache.capacity, "placement": pool.placement,
            "memory": given["memory"], "materialize_limit": pool.materialize_limit,
            "advanced_limit": pool.advanced_limit, "attach": attach,
            "timeout": float(pool.timeout) if pool.timeout is not None else None,
            "connect": list(pool.world.hosts[1:]) if pool.role == "client" else None,
            "partition": pool.partitions.default}


def _partition_args(name, reserve, limit, connect):
    """init()'s partition=, reserve=, limit= checked: (name, reserve, limit) or None."""
    if name is None:
        if reserve is not None or limit is not None:
            raise ValueError("reserve= and limit= are a partition's: name it with partition=")
        return None
    from .partitions import check_name
    check_name(name)
    if connect is not None and (reserve is not None or limit is not None):
        raise ValueError("with connect=, the memory servers declare the partitions' "
                         "reservations and limits (pooltensor serve --partition "
                         "NAME=RESERVE:LIMIT): name one with partition= only")
    return (name, 0 if reserve is None else reserve, limit)


def _migrate_args(migrate):
    """init()'s migrate= checked: a dict of the Mover's settings, or None."""
    if migrate is None:
        return None
    from .migrate import check
    return check(migrate)


def _lease_args(lease, grow_below, shrink_below, shrink_after, slab, connect):
    """init()'s lease settings checked (leases.check): on by default for a plain script's
    pool; off (None) under SPMD, where asking for them is a ValueError. With connect=, None
    when nothing was given (the servers say: `pooltensor serve --lease`) and False for
    lease=0 (no leases, whatever they say)."""
    from . import leases
    given = any(v is not None for v in (lease, grow_below, shrink_below, shrink_after))
    if connect is None and _launched():
        if given and lease not in (0, False):
            raise ValueError("lease=, grow_below=, shrink_below= and shrink_after= are for "
                             "a plain script's pool: under mpiexec or the launcher every "
                             "rank lends all its memory up front (leave them out, or "
                             "lease=0)")
        return None
    got = leases.check(lease, grow_below, shrink_below, shrink_after, slab)
    if connect is not None and not given:
        return None
    return False if got is None and connect is not None else got


def _agree(pool, given):
    """ValueError naming the first argument of a second init() that is not what the pool was
    made with (an argument not given agrees with anything)."""
    for name in _AGREE:
        v = given[name]
        if v is None:
            continue
        if name == "placement":
            v = _placement.check(v, pool.size)
        elif name == "partition":
            v = v[0]
        elif name == "connect":
            if pool.role != "client":
                raise ValueError("pooltensor is already initialized without memory servers; "
                                 "call pooltensor.finalize() first to start over with them")
            from collectives import remote
            v = remote.addresses(v)
        if v != _made.get(name):
            was = _made.get(name)
            was = f"the default {name}" if was is None else f"{name}={was!r}"
            if name == "members" and pool.role == "client":
                was += f" (this process and {pool.size - 1} memory server(s))"
            raise ValueError(f"pooltensor is already initialized with {was}, not {name}="
                             f"{v!r}; call pooltensor.finalize() first to start over with "
                             f"other arguments")


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


def init(*, members=None, slab_size=None, cache_bytes=None, placement=None, memory=None,
         materialize_limit=None, advanced_limit=None, timeout=None, attach=None,
         connect=None, secret_file=None, metrics=None, partition=None, reserve=None,
         limit=None, lease=None, grow_below=None, shrink_below=None, shrink_after=None,
         migrate=None):
    """Join or build the pool and return it.

    A later call returns the same pool; an argument it gives that is not what the pool was
    made with is a ValueError naming it (``pooltensor.finalize()`` first starts over).
    Sizes are integers (TypeError for a float or a str, ValueError when negative).

    Under mpiexec or ``python -m collectives.launch`` every rank is a member (SPMD) and this
    call is collective. In a plain ``python script.py`` the pool has one member, this
    process, unless ``members=N``: then N-1 local member processes are started that
    contribute memory and serve it one-sided; the script is member 0.

    slab_size: bytes per slab (multiple of 64; default 1 MiB). memory: bytes each member
    contributes to each of its heaps (virtual until touched; default RAM / members on the
    host). cache_bytes: this process's slab cache budget (default RAM / 8). placement: the
    default policy (see pooltensor.placement; default 'block'). materialize_limit: largest to_numpy() in bytes.
    advanced_limit: largest advanced-indexing result returned as numpy (above: a pool array).
    attach: map the memory of members on this machine and read and write their slabs in
    place instead of copying them through the cache (default $POOLTENSOR_ATTACH, on unless
    it is 0; off, every other process's slab goes through the cache and the prefetcher, as
    across machines).

    connect: memory servers (``pooltensor serve``), e.g. ``["h1:7000", "h2:7000"]`` (default
    $POOLTENSOR_CONNECT, comma-separated): a plain script's pool whose slabs all live on the
    servers; ``memory`` is then the bytes asked of each server (default: all it has free) and
    ``secret_file`` the servers' secret (default $POOLTENSOR_SECRET_FILE, else the file
    ``pooltensor serve`` makes by default). See pooltensor.pool.client.

    metrics: ``"HOST:PORT"`` or ``":PORT"`` (every interface) to serve this process's
    counters to Prometheus at http://HOST:PORT/metrics (default $POOLTENSOR_METRICS; off
    when neither is set). Under SPMD each rank serves on PORT + its local rank. See
    pooltensor.pool.metrics.

    partition, reserve, limit: the partition this process's arrays count against, with the
    bytes reserved for it and its limit (ints or sizes such as "64GiB"; see
    pooltensor.pool.partitions). With connect=, the servers declare their partitions
    (``pooltensor serve --partition NAME=RESERVE:LIMIT``) and the client only names one.
    More partitions in one pool: ``with pool.partition(name, reserve=, limit=): ...``.

    lease: members lend their memory a lease at a time (default 128 MiB, or bytes / a size;
    0: all of it up front); grow_below (0.25), shrink_below (0.15), shrink_after (300 s):
    when the pool takes another lease and when a member gets leases back (pages punched out:
    see pooltensor.pool.leases). A plain script's pool (with connect=: as the servers say
    unless given); under SPMD every rank lends all its memory and these are a ValueError.

    migrate: how slabs move to their readers (pooltensor.pool.migrate), a dict of budget
    (bytes/s, default 1 GiB/s), ratio (4) and min_faults (8).
    """
    global _pool, _made
    from collectives import log
    log.configure()
    with _init_lock:
        given = _check_args(members, slab_size, cache_bytes, placement, memory,
                            materialize_limit, advanced_limit, timeout, attach)
        if connect is None and members is None and not _launched():
            connect = client.connect_from_env()
        given["connect"] = connect
        given["partition"] = _partition_args(partition, reserve, limit, connect)
        if _pool is not None and not _pool.closed:
            _agree(_pool, given)
            _start_metrics(_pool, metrics)
            return _pool
        members, slab_size, memory = given["members"], given["slab_size"], given["memory"]
        timeout = given["timeout"]
        kw = {k: given[k] for k in ("slab_size", "cache_bytes", "memory", "materialize_limit",
                                    "advanced_limit", "attach")}
        kw["placement"] = "block" if placement is None else placement
        part = given["partition"]
        kw["migrate"] = _migrate_args(migrate)
        kw["leases"] = _lease_args(lease, grow_below, shrink_below, shrink_after,
                                   slab_size or DEFAULT_SLAB, connect)
        if connect is not None:
            if _launched():
                raise ValueError("connect= is for a plain script; under mpiexec or the "
                                 "launcher every rank is a member")
            if members is not None:
                raise ValueError("connect= and members= exclude each other: with memory "
                                 "servers, the servers are the members")
            kw.pop("memory")
            pool = client.start(connect, secret_file=secret_file, memory=memory,
                                timeout=timeout, partition=part and part[0], **kw)
        elif _launched():
            world = collectives.init(timeout)
            if members is not None and members != world.size:
                raise ValueError(f"members={members}, but this SPMD job has {world.size} "
                                 f"ranks (under mpiexec or the launcher every rank is a "
                                 f"member)")
            pool = Pool(world, role="spmd", partition=part, **kw)
        else:
            n = 1 if members is None else members
            if n == 1:
                pool = Pool(collectives.init(timeout), role="plain", partition=part, **kw)
            else:
                procs, world, chans = spawn.start(
                    n, slab_size=slab_size or DEFAULT_SLAB, memory=memory, timeout=timeout,
                    cache_bytes=kw.get("cache_bytes"))
                try:
                    pool = Pool(world, role="plain", procs=procs, owns_world=True,
                                partition=part, **kw)
                except BaseException:
                    spawn.kill(procs)
                    for ch in chans.values():
                        ch.close()
                    raise
                pool.chans = chans          # the members compute their slabs (pool/work.py)
                pool.exclusive = False      # ... so they write next to this process
        _pool = pool
        _made = _made_with(pool, given)
        _log.debug("pool made: %s, member %d of %d, slab %d B, transports %s", pool.role,
                   pool.me, pool.size, pool.slab_size, list(pool.world.transports))
        try:
            _start_metrics(pool, metrics)
        except BaseException:
            _pool = None
            pool.close()
            raise
        atexit.unregister(finalize)
        atexit.register(finalize)      # after collectives' own exit hook: runs before it
        return pool


def adopt(pool, memory=None):
    """Make `pool` (built by an integration above this room, e.g. pooltensor.dask) the
    process's pool: current() returns it and finalize() closes it. ValueError if the process
    already has an open pool."""
    global _pool, _made
    with _init_lock:
        if _pool is not None and not _pool.closed:
            raise ValueError("pooltensor is already initialized in this process; call "
                             "pooltensor.finalize() first")
        _pool = pool
        _made = _made_with(pool, {"memory": memory, "attach": None})
        atexit.unregister(finalize)
        atexit.register(finalize)


def _start_metrics(pool, address):
    """The Prometheus endpoint of this process (pool/metrics.py), once; a second init()
    asking for another address is a ValueError."""
    from . import metrics
    address = address if address is not None else os.environ.get(metrics.ENV) or None
    have = getattr(pool, "metrics_exporter", None)
    if address is None:
        return
    if have is not None:
        if address != pool.metrics_address:
            raise ValueError(f"pooltensor already serves metrics at {pool.metrics_address!r}, "
                             f"not {address!r}; call pooltensor.finalize() first")
        return
    pool.metrics_exporter = metrics.for_pool(pool, address)
    pool.metrics_address = address


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
        exporter = getattr(p, "metrics_exporter", None)
        p.close()
        if exporter is not None:
            exporter.close()


def sync():
    """Flush + barrier + revalidate (SPMD: collective): afterwards every rank sees every write."""
    current().sync()
