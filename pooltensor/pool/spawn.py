"""Starting and stopping a plain script's member processes (the script's side).

``pooltensor.init(members=N)`` starts N-1 processes running ``python -m pooltensor.pool.member``
(see member.py for their side of the lifecycle). They join a world with the script through the
usual bootstrap (POOLTENSOR_RANK / WORLD_SIZE / COORDINATOR, the script being rank 0 and serving
the rendezvous). This module knows nothing of the Pool, so the Pool can stop its members
without importing the module that builds a Pool in the member.
"""
import json
import os
import subprocess
import sys
import threading
import time

import collectives
from collectives import env

from . import blas, channel

ENV_PARENT = "POOLTENSOR_MEMBER_PARENT"
ENV_PREPARE = "POOLTENSOR_PREPARE"
PREPARE = 256 << 20         # fresh memory a member keeps ready past what plans have used
_BOOT_VARS = ("POOLTENSOR_RANK", "POOLTENSOR_WORLD_SIZE", "POOLTENSOR_COORDINATOR",
              "POOLTENSOR_LOCAL_RANK", "POOLTENSOR_LOCAL_SIZE")
_MPI_VARS = ("PMI_", "OMPI_", "PMIX_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "HYDRA_")


def prepare_bytes():
    """$POOLTENSOR_PREPARE, or PREPARE: what a member faults in ahead (member.py's Preparer).
    ValueError naming it when it is not a number; start() checks it before any member starts,
    as a member that failed on it would only be a member that did not come."""
    return env.number(ENV_PREPARE, PREPARE)


def _import_path():
    """Folders that make pooltensor and collectives importable in a child process."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # pooltensor/
    here = [os.path.dirname(package),
            os.path.dirname(os.path.dirname(os.path.abspath(collectives.__file__)))]
    old = os.environ.get("PYTHONPATH", "")
    parts = []
    for p in here + (old.split(os.pathsep) if old else []):
        if p and p not in parts:
            parts.append(p)
    return os.pathsep.join(parts)


_ENV_LOCK = threading.Lock()
MEMBER_MAIN = "pooltensor.ops.members"      # the member's entry point (it runs operations)


def start(n, *, slab_size, memory, timeout=None, cache_bytes=None):
    """Start members 1..n-1 and join them as rank 0: returns (processes, World, channels),
    channels a dict member -> channel.Channel (the plans' socket pair to that member)."""
    from collectives.launch import free_port
    prepare_bytes()             # a wrong value named here, before any member starts
    port = free_port()
    coord = f"127.0.0.1:{port}"
    cfg = {"slab_size": int(slab_size), "memory": memory, "timeout": timeout,
           "cache_bytes": cache_bytes}
    env = {k: v for k, v in os.environ.items() if not k.startswith(_MPI_VARS)
           and k not in _BOOT_VARS}
    env.update(PYTHONPATH=_import_path(), POOLTENSOR_WORLD_SIZE=str(n),
               POOLTENSOR_COORDINATOR=coord, **{ENV_PARENT: str(os.getpid())})
    env.update(blas.member_env(n))     # each process its share of the cores (blas.py)
    procs, chans = [], {}
    try:
        for r in range(1, n):
            chans[r], theirs = channel.pair(r)
            try:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", MEMBER_MAIN, json.dumps(dict(cfg, chan=theirs.fileno()))],
                    stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),),
                    env=dict(env, POOLTENSOR_RANK=str(r), POOLTENSOR_LOCAL_RANK=str(r),
                             POOLTENSOR_LOCAL_SIZE=str(n))))
            finally:
                theirs.close()
        try:
            world = join(0, n, coord, timeout)
        except BaseException as e:
            dead = [(r, p.poll()) for r, p in enumerate(procs, 1) if p.poll() is not None]
            if dead:
                r, code = dead[0]
                raise RuntimeError(f"pooltensor member {r} exited with code {code} while "
                                   f"starting (its error is above)") from e
            raise
    except BaseException:
        kill(procs)
        for ch in chans.values():
            ch.close()
        raise
    return procs, world, chans


def join(rank, size, coord, timeout=None):
    """collectives.init() as `rank` of a world of `size` whose rendezvous rank 0 serves at
    `coord` (host:port), whatever started this process: the bootstrap variables are set for
    the call alone and an MPI launcher's are hidden meanwhile (a plain script's members, and
    Dask workers started by mpiexec, join a world of their own). A world of one made
    earlier is replaced."""
    with _ENV_LOCK:
        w = collectives.world.current()
        if w is not None and w.size == 1:
            collectives.finalize()
        saved = {k: v for k, v in os.environ.items()
                 if k in _BOOT_VARS or k.startswith(_MPI_VARS)}
        for k in saved:
            del os.environ[k]
        os.environ.update(POOLTENSOR_RANK=str(rank), POOLTENSOR_WORLD_SIZE=str(size),
                          POOLTENSOR_COORDINATOR=coord, POOLTENSOR_LOCAL_RANK=str(rank),
                          POOLTENSOR_LOCAL_SIZE=str(size))
        try:
            return collectives.init(timeout)
        finally:
            for k in _BOOT_VARS:          # children of this process must not inherit them
                os.environ.pop(k, None)
            os.environ.update(saved)


def stop(procs, world, grace=10.0):
    """After the members were told to stop: leave the world, then reap them (kill if late)."""
    try:
        collectives.finalize() if collectives.world.current() is world else world.close()
    except Exception:
        pass
    deadline = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    kill(procs)


def kill(procs):
    """SIGKILL whatever is still running and reap it."""
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in procs:
        try:
            p.wait(5.0)
        except subprocess.TimeoutExpired:
            pass
