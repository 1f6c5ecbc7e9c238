"""A plain script's pool on memory servers: ``pooltensor.init(connect=["h1:7000", ...])``.

The script is member 0 and contributes no memory; members 1..k are the servers (started with
``pooltensor serve``), each giving this process the memory it asked for (collectives.remote).
Every slab lives on a server and is faulted in over tcp through the slab cache, with the
prefetcher ahead, exactly as a remote member's slab is in any pool: the Pool is the usual one
with role "client" (one heap per server seen through an rw and an r key; placement over the
servers only). When the pool is finalized, or the script ends in any way, the control
connections close and the servers free the memory.
"""
import os

from collectives import remote

from . import placement as _placement


def plan(policy, nslabs, free):
    """Per-slab homes for a client pool: the policy applied to the servers (members 1..k);
    member 0, this process, holds nothing."""
    if isinstance(policy, getattr(_placement, "Explicit", ())):   # lined up with an operand
        return _placement.plan(policy, nslabs, free, 0)
    if isinstance(policy, tuple):
        if 0 in policy:
            raise ValueError("member 0 is this process, which contributes no memory to a pool "
                             "on memory servers: name servers (members 1.."
                             f"{len(free) - 1})")
        return _placement.plan(policy, nslabs, free, 0)
    if policy == "local":
        raise ValueError("placement='local' means this process, which contributes no memory "
                         "to a pool on memory servers: use 'block', 'interleave', 'balanced' "
                         "or a list of servers (members 1..{})".format(len(free) - 1))
    return [m + 1 for m in _placement.plan(policy, nslabs, free[1:], 0)]


def connect_from_env():
    """The servers named by $POOLTENSOR_CONNECT (comma-separated host:port), or None."""
    v = os.environ.get(remote.ENV_CONNECT, "").strip()
    return v or None


def start(connect, *, secret_file=None, memory=None, timeout=None, **kw):
    """Connect to the servers and build the client Pool on them."""
    from .pool import Pool
    world = remote.connect(connect, secret_file=secret_file, memory=memory, timeout=timeout)
    try:
        return Pool(world, role="client", memory=0, owns_world=True, **kw)
    except BaseException:
        world.close()
        raise
