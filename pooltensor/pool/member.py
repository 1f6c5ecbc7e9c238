"""Member processes of a plain script's pool: ``python -m pooltensor.pool.member CONFIG``.

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
import sys

import collectives
from collectives.errors import PeerLost, Timeout

from .pool import Pool
from .spawn import ENV_PARENT


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
        sys.stderr.write("usage: python -m pooltensor.pool.member CONFIG (started by "
                         "pooltensor.init(members=N), not by hand)\n")
        return 2
    cfg = json.loads(argv[0])
    parent = int(os.environ.get(ENV_PARENT, "0"))
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the script's: it stops us
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
