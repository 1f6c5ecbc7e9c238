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

from .pool import Pool

def connect_from_env():
    """The servers named by $POOLTENSOR_CONNECT (comma-separated host:port), or None."""
    v = os.environ.get(remote.ENV_CONNECT, "").strip()
    return v or None


def start(connect, *, secret_file=None, memory=None, timeout=None, **kw):
    """Connect to the servers and build the client Pool on them."""
    world = remote.connect(connect, secret_file=secret_file, memory=memory, timeout=timeout)
    try:
        return Pool(world, role="client", memory=0, owns_world=True, **kw)
    except BaseException:
        world.close()
        raise
