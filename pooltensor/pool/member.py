"""The life of a plain script's member process (its entry point is ``pooltensor.ops.members``).

``pooltensor.init(members=N)`` in a plain script starts N-1 of these. They join a world with
the script through the usual bootstrap (POOLTENSOR_RANK / WORLD_SIZE / COORDINATOR, the
script being rank 0 and serving the rendezvous) and expose their heaps exactly as the script's
Pool does: the native engine serves every get and put into their memory without their Python.
Their Python waits for plans on the socket pair to the script (pool/channel.py) and runs each
with the handler the entry point gives (the operations live above this room), replying once
per plan. Lifecycle:

- the script's finalize() (also run at its exit) signals each member through a one-sided
  notify on a small control window and closes the channel; the member leaves the world and
  exits;
- if the script dies instead (crash, SIGKILL), the member's wait fails with PeerLost (the
  native monitor watches the script's process), its parent-death signal fires, and a periodic
  parent check catches the rest: nothing is left running. Their memory is memfd-backed, so
  nothing is left in /dev/shm either.
"""
import json
import os
import select
import signal
import socket
import sys
import time

import collectives
from collectives.errors import PeerLost, Timeout

from ..cache.populate import populate
from .channel import Channel
from .pool import Pool

MEMBER_CACHE = 64 << 20     # a member's slab cache: misaligned inputs faulted from its peers
IDLE = 0.02                 # seconds without a plan before a member prepares memory
from .spawn import ENV_PARENT, prepare_bytes


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


def main(argv=None, handle=None):
    """Run a member process (started by pooltensor.init(members=N)): handle(pool, frame) ->
    reply frame, for each plan the script sends."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m pooltensor.ops.members CONFIG (started by "
                         "pooltensor.init(members=N), not by hand)\n")
        return 2
    cfg = json.loads(argv[0])
    parent = int(os.environ.get(ENV_PARENT, "0"))
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the script's: it stops us
    pool = build(collectives.init(cfg.get("timeout")), cfg)
    chan = None
    if cfg.get("chan") is not None and handle is not None:
        chan = Channel(socket.socket(fileno=int(cfg["chan"])), 0)
    _serve(pool, chan, handle, parent)
    pool.closed = True
    collectives.finalize()
    return 0


def build(world, cfg):
    """This member's Pool in `world` (collective with every other process of the pool), as
    cfg says: slab_size, memory (bytes per heap), cache_bytes (at most MEMBER_CACHE). Also
    how a Dask worker becomes a member (pooltensor.dask)."""
    cache = cfg.get("cache_bytes")
    return Pool(world, role="member", slab_size=cfg["slab_size"], memory=cfg["memory"],
                cache_bytes=MEMBER_CACHE if cache is None else min(int(cache), MEMBER_CACHE),
                versions=bool(cfg.get("versions")))


class Ahead:
    """Fresh memory made ready on the member's own time: once no plan has come for IDLE
    seconds, the pages just past the highest slot any plan has used here are faulted in
    (populate(), a chunk at a time, so a plan that arrives waits for one chunk at most: on a
    virtual machine without huge pages for shared memory a page costs microseconds, 16 MiB
    tens of milliseconds, so a chunk is 1 MiB). Why wait for IDLE: a chunk in a 2 MiB huge
    page faults the whole page in, 5-6 ms on this kind of VM, and a script issuing operations
    back to back would wait that long for every plan (a 512 MiB sum over 2 members: 28 ms
    against 22.6 without preparing); a script that sends plans that often is busy, and its
    members are better left to compute. The allocator hands out touched
    slots first and grows upwards, so the next new array's slabs here are most likely ready
    when its first write comes. At most $POOLTENSOR_PREPARE bytes (default 256 MiB, 0: off)
    ahead, and never more than a quarter of the heap."""

    CHUNK = 1 << 20

    def __init__(self, pool):
        self.pool = pool
        want = prepare_bytes()
        S = pool.slab_size
        cap = pool.capacity[pool.me]
        self.ahead = max(0, min(want, cap // 4)) // S
        self.ready = {"rw": 0, "ro": 0}          # slots [0, ready) were prepared or used

    def pending(self):
        used = self.pool.used_hi
        return self.ahead and any(self.ready[h] < self._goal(h, used.get(h, 0))
                                  for h in self.ready)

    def _goal(self, heap, used):
        return min(self.pool.nslabs[self.pool.me], used + self.ahead) if used else 0

    def step(self):
        """Prepare one chunk; False when there is nothing left to do."""
        pool, S = self.pool, self.pool.slab_size
        for heap in self.ready:
            used = pool.used_hi.get(heap, 0)
            lo = max(self.ready[heap], used)
            goal = self._goal(heap, used)
            if lo >= goal:
                self.ready[heap] = max(self.ready[heap], lo)
                continue
            hi = min(goal, lo + max(1, self.CHUNK // S))
            populate(pool.local[heap], lo * S, hi * S, write=True)
            self.ready[heap] = hi
            return True
        return False


def _serve(pool, chan, handle, parent):
    """Run plans until the script says stop (notify, or its end of the channel closes)."""
    ahead = Ahead(pool)
    last = 0.0                               # when the last plan was answered
    while True:
        if chan is not None:
            busy = ahead.pending()
            wait = max(0.0, last + IDLE - time.monotonic()) if busy else 1.0
            ready, _, _ = select.select([chan.sock], [], [], wait)
            if not ready and busy:
                if time.monotonic() - last >= IDLE:
                    ahead.step()
                continue
            if ready:
                try:
                    frame = chan.recv(pool.timeout)
                except (PeerLost, Timeout, OSError):
                    break                    # the script closed its end: stopping, or gone
                try:
                    chan.send(handle(pool, frame))
                except PeerLost:
                    break
                last = time.monotonic()
                continue
        else:
            try:
                pool.win_ctl.wait_local(0, 1, watch=0, timeout=1.0)
                return                        # the script said stop
            except Timeout:
                pass
            except PeerLost:
                os._exit(0)
        if parent and os.getppid() != parent:
            os._exit(0)
    # end of file on the channel: a stopping script notified first; a dead one did not
    try:
        pool.win_ctl.wait_local(0, 1, watch=0, timeout=2.0)
    except (Timeout, PeerLost):
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
