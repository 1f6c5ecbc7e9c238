"""Member processes of a plain script's pool: ``python -m pooltensor.member CONFIG``.

``pooltensor.init(members=N)`` in a plain script starts N-1 of these. They join a world with
the script through the usual bootstrap (POOLTENSOR_RANK / WORLD_SIZE / COORDINATOR, the
script being rank 0 and serving the rendezvous), expose their heaps exactly as the script's
Pool does, and then only wait: the native engine serves every get and put into their memory
without their Python. Their one job after start-up is lifecycle:

- the script's finalize() (also run at its exit) signals each member through a one-sided
  notify on a small control window; the member leaves the world and exits;
- if the script dies instead (crash, SIGKILL), the member's wait fails with PeerLost (the
  native monitor watches the script's process), its parent-death signal fires, and a periodic
  parent check catches the rest: nothing is left running. Their memory is memfd-backed, so
  nothing is left in /dev/shm either.
"""
import json
import os
import signal
import subprocess
import sys
import time

import collectives
from collectives.errors import PeerLost, Timeout

ENV_PARENT = "POOLTENSOR_MEMBER_PARENT"
_BOOT_VARS = ("POOLTENSOR_RANK", "POOLTENSOR_WORLD_SIZE", "POOLTENSOR_COORDINATOR",
              "POOLTENSOR_LOCAL_RANK", "POOLTENSOR_LOCAL_SIZE")
_MPI_VARS = ("PMI_", "OMPI_", "PMIX_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "HYDRA_")


def _import_path():
    """Folders that make pooltensor and collectives importable in a child process."""
    import pooltensor
    here = [os.path.dirname(os.path.dirname(os.path.abspath(p)))
            for p in (pooltensor.__file__, collectives.__file__)]
    old = os.environ.get("PYTHONPATH", "")
    parts = []
    for p in here + (old.split(os.pathsep) if old else []):
        if p and p not in parts:
            parts.append(p)
    return os.pathsep.join(parts)


def start(n, *, slab_size, memory, timeout=None):
    """Start members 1..n-1 and join them as rank 0: returns (processes, World)."""
    from collectives.launch import free_port
    port = free_port()
    coord = f"127.0.0.1:{port}"
    cfg = json.dumps({"slab_size": int(slab_size), "memory": memory, "timeout": timeout})
    env = {k: v for k, v in os.environ.items() if not k.startswith(_MPI_VARS)
           and k not in _BOOT_VARS}
    env.update(PYTHONPATH=_import_path(), POOLTENSOR_WORLD_SIZE=str(n),
               POOLTENSOR_COORDINATOR=coord, **{ENV_PARENT: str(os.getpid())})
    procs = []
    try:
        for r in range(1, n):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "pooltensor.member", cfg], stdin=subprocess.DEVNULL,
                env=dict(env, POOLTENSOR_RANK=str(r), POOLTENSOR_LOCAL_RANK=str(r),
                         POOLTENSOR_LOCAL_SIZE=str(n))))
        w = collectives.world.current()
        if w is not None and w.size == 1:
            collectives.finalize()         # a world of one made earlier: replace it
        saved = {k: os.environ.get(k) for k in _BOOT_VARS}
        os.environ.update(POOLTENSOR_RANK="0", POOLTENSOR_WORLD_SIZE=str(n),
                          POOLTENSOR_COORDINATOR=coord, POOLTENSOR_LOCAL_RANK="0",
                          POOLTENSOR_LOCAL_SIZE=str(n))
        try:
            world = collectives.init(timeout)
        except BaseException as e:
            dead = [(r, p.poll()) for r, p in enumerate(procs, 1) if p.poll() is not None]
            if dead:
                r, code = dead[0]
                raise RuntimeError(f"pooltensor member {r} exited with code {code} while "
                                   f"starting (its error is above)") from e
            raise
        finally:
            for k, v in saved.items():      # children of the script must not inherit them
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    except BaseException:
        kill(procs)
        raise
    return procs, world


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


def _die_with_parent(parent):
    """Linux: SIGKILL this process when its parent (the script) dies."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass
    if parent and os.getppid() != parent:
        os._exit(0)                           # the script is already gone


def main(argv=None):
    """Entry point of a member process (started by pooltensor.init(members=N))."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m pooltensor.member CONFIG (started by "
                         "pooltensor.init(members=N), not by hand)\n")
        return 2
    cfg = json.loads(argv[0])
    parent = int(os.environ.get(ENV_PARENT, "0"))
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the script's: it stops us
    from .pool import Pool
    world = collectives.init(cfg.get("timeout"))
    pool = Pool(world, role="member", slab_size=cfg["slab_size"], memory=cfg["memory"],
                cache_bytes=1 << 20)
    while True:
        try:
            pool.win_ctl.wait_local(0, 1, watch=0, timeout=1.0)
            break                             # the script said stop
        except Timeout:
            if parent and os.getppid() != parent:
                os._exit(0)
        except PeerLost:
            os._exit(0)
    pool.closed = True
    collectives.finalize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
