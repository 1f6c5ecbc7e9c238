"""After a connection drops or a memory server restarts: what the pool does about it.

The tcp transport dials a dropped connection again by itself and repeats what is safe to
repeat (collectives: ConnectionDropped for the rest). Two things are left to the pool:

- Versions of read-write slabs (SPMD coherence, pool.py) are moved by fetch_add, which is not
  repeated when its connection drops: the writer cannot know whether the home's version moved.
  A version only has to move after a write (twice is as good as once) and must never stay, so
  an add in doubt is made again, and the writer's own cached copy is then treated as stale
  (revalidated away) instead of trusted. The read of a version (compare_swap 0 -> 0) changes
  nothing and is simply asked again.
- A memory server that restarted lost what it held. Its client notices the loss (the data
  connection's dial is refused: PeerLost), and a watcher (pool/client.py) rejoins it as soon
  as it answers again: the world asks it for the memory once more (RemoteWorld.rejoin), every
  slab that was in use there is fenced (an access raises PeerRestarted naming the server: the
  arrays on it are lost, and say so), the cache forgets its copies of them, and new
  allocations work on the new memory. A fenced slab is unfenced when its array is freed.
  Work is no longer sent to that server as plans (its plan would run on the new memory
  without knowing which slabs were lost): it runs in this process, through the fenced windows.
"""
import logging

from collectives.errors import ConnectionDropped

log = logging.getLogger("pooltensor")


def read_version(win, m, slot):
    """The version of rw slab (m, slot): compare_swap 0 -> 0, asked again if in doubt."""
    for attempt in range(3):
        try:
            return win.compare_swap(m, slot * 8, 0, 0)
        except ConnectionDropped:
            if attempt == 2:
                raise


def bump_version(win, m, slot):
    """Add one to the version of rw slab (m, slot); the old value, or None when the first add
    was in doubt (then it was made again: the version moved at least once)."""
    try:
        return win.fetch_add(m, slot * 8, 1)
    except ConnectionDropped:
        win.fetch_add(m, slot * 8, 1)
        return None


def lost_slots(pool, rank):
    """The slots of server `rank` in use now (the client's one allocator for its heap)."""
    a = pool._alloc["rw"][rank]
    free = set()
    for st, ln in a.free_runs():
        free.update(range(st, st + ln))
    return [s for s in range(a.nslabs) if s not in free]


def rejoin(pool, rank):
    """Rejoin memory server `rank` after it restarted (see the module docstring). Returns the
    number of slabs lost. BootstrapError (from the world) when it is not back yet."""
    with pool._lock:                  # (no allocation meanwhile)
        world = pool.world
        slots = lost_slots(pool, rank)
        msg = (f"memory server {world.hosts[rank]} restarted: the arrays that were on it are "
               f"lost (new arrays work)")
        # fenced before the world reaches the new memory: no read in between can see it
        for w in {id(w): w for w in (pool.win_rw, pool.win_ro)}.values():
            w.fence(rank, pool.slab_size, slots, msg)
        pool.cache.discard_keys([(h, rank, s) for h in ("rw", "ro") for s in slots])
        pool.chans.pop(rank, None)
        world.rejoin(rank)
        keeper = getattr(pool, "keeper", None)
        if keeper is not None:          # its arrays are lost there (replicas: read elsewhere)
            keeper.rejoined(rank, msg)
        log.warning("pooltensor: %s (%d slab(s) lost)", msg, len(slots))
        return len(slots)


def given_back(pool, m, slots):
    """Slots of member m were freed: a fence on them (lost data) is lifted."""
    if pool.role == "client":
        for w in (pool.win_rw, pool.win_ro):
            w.unfence(m, slots)
