"""The pool: one global address space over the memory its members contribute.

Address space: allocation.py (what an Allocation is).

Access modes are enforced where the memory lives, by what each heap is exposed as:
- ``readwrite``: the rw heap, exposed as an rw Window; anyone may get and put.
- ``readonly``: the ro heap, exposed with access "r": the target refuses every put into it.
  In a plain script the members also expose it once more as rw, for the script alone (the
  members run no user code), so the script can initialize arrays it creates; in SPMD each rank
  writes the readonly slabs it homes straight into its own memory while creating the array.
- ``private``: a heap that is never exposed (an anonymous mapping); private arrays live on
  the calling member only, and no other process can name their memory.

Allocation. Every process that creates arrays runs the same deterministic allocator over
every member's heaps (alloc.SlabAllocator, placement policies): in SPMD, creation is a
collective call, so all ranks reach the same placement with no messages. In a plain script
the script is the only allocator (member processes only serve memory).

Frees. An Allocation is freed when its last array (or view) dies: frees.py.

Agreement (SPMD): creation and sync are collective pool operations, checked across ranks
(agree.py) before they change anything: creation's row (the digest of its operation, shape,
dtype, placement, access and next allocation id) is the allreduce that also counts the queued
frees; sync's (or that of the operation it ends) is the allreduce that is sync's barrier.

Coherence (SPMD only; a plain script is the only writer so its cache is always right): each
rw slab has an int64 version at its home, bumped with fetch_add after every write into it.
A cached copy remembers the version it was fetched at; sync() = flush + barrier + revalidate
(one get of the version range per member) drops the copies whose version moved.
"""
import mmap
import sys
import threading
import weakref

import numpy as np

import collectives
from collectives.rendezvous.bootstrap import host_identity

from . import agree
from . import frees
from . import leases as leases_
from . import migrate as migrate_
from . import locks as locks_
from . import versions as versions_
from . import partitions as partitions_
from . import mapping
from . import replicas as replicas_
from . import placement as _placement
from . import rejoin
from . import spawn
from .alloc import SlabAllocator
from .allocation import (ACCESS, DEFAULT_SLAB, DEFAULT_MATERIALIZE,  # noqa: F401
                         DEFAULT_ADVANCED, MAX_BYTES, TOO_BIG, physical_memory,
                         check_slab_size, Allocation)
from ..cache import SlabCache
from ..errors import PoolClosed, PoolOutOfMemory

SYNC = frees.SYNC                 # a plain pt.sync(), as the ranks compare it


class Pool:
    """The pool of one process. Made by pooltensor.init(); see the module docstring."""

    def __init__(self, world, *, role, slab_size=None, memory=None, cache_bytes=None,
                 placement="block", materialize_limit=None, advanced_limit=None, procs=(),
                 owns_world=False, attach=None, partition=None, leases=None, migrate=None,
                 versions=False):
        self.world = world
        self.role = role                       # "spmd", "plain", "member" or "client"
        client = role == "client"              # memory servers hold every slab (client.py)
        self.me, self.size = world.rank, world.size
        self.spmd = role == "spmd"
        self.coherent = self.spmd and self.size > 1     # other processes cache and write too
        # the only writer: may rewrite whole ranges around what it writes (not a member: the
        # script and the other members write next to it; runtime clears it for a script
        # whose members compute)
        self.exclusive = not self.coherent and role != "member"
        self.slab_size = check_slab_size(slab_size if slab_size is not None else DEFAULT_SLAB)
        S = self.slab_size
        if memory is None:
            memory = physical_memory() // max(1, world.local_size)
        memory = int(memory)
        if memory < S and not client:
            raise ValueError(f"memory per member ({memory} B) is less than one slab ({S} B)")
        self.placement = _placement.check(placement, self.size)
        self.materialize_limit = int(materialize_limit if materialize_limit is not None
                                     else DEFAULT_MATERIALIZE)
        self.advanced_limit = int(advanced_limit if advanced_limit is not None
                                  else DEFAULT_ADVANCED)
        self.timeout = world.timeout
        self._procs = list(procs)
        self._owns_world = owns_world
        self.closed = False
        self.chans = {}          # member -> work.Channel: members that compute (plain script)
        self.broken = None       # the error that cut a member's channel, if one did
        self.plans = {}          # plans sent to members, by kind (run, reduce, fill, ...)
        self.round = None        # the work.Round whose replies are still to be read
        self.used_hi = {}        # a member: heap -> 1 + the highest of its slots a plan used
        # -- collective setup: the same calls in the same order on every process ----------
        if attach is None:
            attach = mapping.attach_default()
        cfg = world.allgather_object({"slab": S, "memory": memory // S * S, "role": role,
                                      "attach": bool(attach), "machine": host_identity()})
        if role == "member":              # a plain script's member maps as the script does
            attach = cfg[0]["attach"]
        if client:        # the servers say what they granted; any slab size suits them
            cfg = [dict(cfg[0], memory=0)] + [dict(c, slab=S, memory=c["memory"] // S * S)
                                             for c in cfg[1:]]
        if len({c["slab"] for c in cfg}) != 1:
            raise ValueError(f"members disagree on slab_size: {[c['slab'] for c in cfg]}")
        self.capacity = [c["memory"] for c in cfg]       # bytes per heap, per member
        self.nslabs = [c // S for c in self.capacity]
        cap = self.capacity[self.me]
        self.win_rw = world.expose(cap, "rw")
        if client:
            # one heap per server, seen through an rw and an r key: the two modes share its
            # slabs (one allocator below), so the server's memory is counted once
            self.win_ro = world.expose(self.win_rw.buffer, "r")
            self.win_ro_init = self.win_rw
        else:
            self.win_ro = world.expose(cap, "r")
            self.win_ro_init = None
            if not self.spmd and self.size > 1:
                self.win_ro_init = world.expose(self.win_ro.buffer, "rw")
        # versions: kept also for a pool whose members turn SPMD together for a while
        self.win_ver = (world.expose(8 * self.nslabs[self.me], "rw")
                        if self.coherent or versions else None)
        self.win_ctl = world.expose(64, "rw") if (not self.spmd and self.size > 1
                                                  and not client) else None
        # pool locks (locks.py): a page on every member, used on member 0's; a client of memory
        # servers is the only process of its pool and keeps the words in its own memory
        self.win_lock = None if client else world.expose(locks_.BYTES, "rw")
        self.locks = locks_.Locks(self, self.win_lock)
        self._private = None
        self.local = {"rw": self.win_rw.buffer, "ro": self.win_ro.buffer, "pv": None}
        self.read_win = {"rw": self.win_rw, "ro": self.win_ro}
        # same-machine heaps mapped in place (mapping.py): (heap, member) -> numpy uint8
        self.mapped, self.mapped_w = {}, {}
        if attach and not client:
            mapping.map_peers(self, world, writes_ro=role == "plain")
        if role in ("plain", "spmd"):
            mapping.check_huge_pages()
        self.write_win = {"rw": self.win_rw, "ro": self.win_ro_init}
        # -- allocation state (every process but a plain script's members) ---------------------
        self._lock = threading.RLock()
        self._alloc = {"rw": [SlabAllocator(n) for n in self.nslabs]}
        self._alloc["ro"] = (self._alloc["rw"] if client
                             else [SlabAllocator(n) for n in self.nslabs])
        self._heap_used = {"rw": [0] * self.size, "ro": [0] * self.size}   # slabs
        self._alloc_pv = SlabAllocator(self.nslabs[self.me])
        self._used = [0] * self.size                      # slabs used in rw + ro, per member
        self._next_id = 0                                  # shared allocations: 1, 2, ...
        self._next_pv = 0                                  # private ones: -1, -2, ...
        self._live = 0
        self._pending = []                                 # queued frees (shared heaps)
        self._pending_pv = []                              # queued frees (private heap)
        self._exports = {}                 # local rw slot -> WeakSet of writable exported views
        if cache_bytes is None:
            cache_bytes = physical_memory() // 8
        self.views = {}          # id -> weak reference: arrays with a numpy view for x[i]
        self.cache = SlabCache(S, int(cache_bytes))
        self.cache.timeout = self.timeout
        self.max_prefetch = 16
        self.pending = False     # a member was lost: reads repoint at their next slab
        self.keeper = replicas_.Keeper(self, cfg)
        # leases=(lease, grow_below, shrink_below, shrink_after): lend a lease at a time
        self.leases = leases_.Leases(self, *leases) if leases else None
        self.mover = migrate_.Mover(self, **(migrate or {}))    # access counts, moves
        # partition=(name, reserve, limit): the partition this pool's allocations count against
        self.partitions = partitions_.Ledger(sum(self.nslabs) * S)
        if partition is not None:
            self.partitions.declare(*partition)
            self.partitions.default = partition[0]
        world.barrier()
        self.keeper.start()

    # -- state --------------------------------------------------------------------------------
    def check_open(self):
        """PoolClosed if the pool was finalized."""
        if self.closed:
            raise PoolClosed("the pool is finalized; call pooltensor.init() again")
        if self.pending:
            self.keeper.apply()

    def lost(self):
        """What was lost with members that are gone: one dict per allocation that had a
        slab with no surviving copy (see replicas.Keeper.lost)."""
        return self.keeper.lost()

    @property
    def members(self):
        """Number of members (processes contributing memory)."""
        return self.size

    def partition(self, name, reserve=None, limit=None):
        """Allocations made inside ``with pool.partition(name):`` count against partition
        `name` (declared here when reserve or limit is given; see partitions.py). In SPMD
        every rank must use the same partitions, like placement (checked at creation)."""
        if reserve is not None or limit is not None or name not in self.partitions.parts:
            self.partitions.declare(name, reserve or 0, limit)
        return self.partitions.using(name)

    def private_heap(self):
        """This member's private heap (made on first use, never exposed)."""
        if self._private is None:
            mm = mmap.mmap(-1, self.capacity[self.me])
            self._private = np.frombuffer(mm, np.uint8)
            self.local["pv"] = self._private
        return self._private

    # -- allocation ------------------------------------------------------------------------
    def allocate(self, nbytes, access="readwrite", placement=None, what=None, replicas=None):
        """Slabs for an array of `nbytes`: (Allocation, fresh) where fresh[k] says slab k was
        never used before (so it still holds zeros). Collective in SPMD unless private: the
        ranks first agree on the call (what: (operation, shape, dtype) of the creation, for
        the check and its message) or every rank raises CollectiveMismatch. replicas:
        copies of each slab on as many members (readonly only; see replicas.py)."""
        self.check_open()
        S = self.slab_size
        nbytes = int(nbytes)
        n = -(-nbytes // S)
        if self.coherent and access != "private":
            op, shape, dtype = what if what is not None else ("allocate", nbytes, None)
            call = agree.Call(op, shape, dtype,
                              agree.placement_key(self.placement if placement is None
                                                   else placement),
                              (access if replicas is None or replicas == 1
                               else f"{access} replicas={replicas}")
                              + partitions_.tag(self.partitions.current()),
                              targets=(("new allocation id, slabs", self._next_id + 1, n),))
        else:
            call = None
        if access not in ACCESS:
            bad = ValueError(f"access must be one of {tuple(ACCESS)}, not {access!r}")
        elif nbytes > MAX_BYTES:           # what numpy says of an array it could never make
            bad = ValueError(TOO_BIG)
        else:
            bad = None
            try:
                copies = replicas_.check(replicas, access, self.keeper.eligible())
            except (TypeError, ValueError) as e:
                bad = e
        if bad is None and self.role == "member" and access != "private":
            bad = ValueError("this process is a member of a pool whose allocator is another "
                             "process (a plain script's, or a Dask client's after "
                             "pooltensor.dask.attach()): create shared arrays there and pass "
                             "them in; access='private' arrays may be made here")
        if bad is not None:
            if call is not None:           # every rank got here: raise together, or not at all
                self.collect_frees(call)
            raise bad
        heap = ACCESS[access]
        with self._lock:
            if heap == "pv":
                if self.role == "client":
                    raise ValueError("access='private' means memory of this process, which "
                                     "lends none to a pool on memory servers: use "
                                     "'readwrite' or 'readonly'")
                self._apply(self._pending_pv)
                self._pending_pv = []
                a = self._alloc_pv
                if n > a.nslabs:
                    raise PoolOutOfMemory(
                        f"private heap of member {self.me} cannot hold {nbytes} bytes: more "
                        f"than it could ever hold ({a.nslabs * S} bytes)",
                        free={self.me: a.nfree * S}, needed=nbytes)
                hwm = a.hwm
                runs = a.alloc(n)
                if runs is None:
                    raise PoolOutOfMemory(
                        f"private heap of member {self.me} cannot hold {nbytes} bytes",
                        free={self.me: a.nfree * S}, needed=int(nbytes))
                slots = [s for st, ln in runs for s in range(st, st + ln)]
                members = [self.me] * n
                fresh = [s >= hwm for s in slots]
                self.private_heap()
            else:
                self.collect_frees(call)
                policy = self.placement if placement is None else _placement.check(
                    placement, self.size)
                if policy == "local" and self.coherent:
                    raise ValueError(
                        "placement='local' means the calling member, but in SPMD every rank "
                        "calls (creation is collective): use 'block' (a contiguous part on "
                        "each rank), a member list, or access='private' for this rank alone")
                free, allowed = self.keeper.room(policy)
                if self.role == "client" and not isinstance(policy, _placement.Explicit):
                    _placement.plan_servers(policy, 0, free)     # policy errors come first
                # before any per-slab list is made: a request the allowed members could never
                # hold, or cannot hold now, costs nothing in proportion to its size
                cap = sum(self.nslabs[m] for m in allowed)
                many = f", {copies} copies each" if copies > 1 else ""
                if n * copies > cap or n * copies > sum(free[m] for m in allowed):
                    self.keeper.short_of_lost(n * copies, nbytes, allowed)
                    who = f"members {list(policy)}" if isinstance(policy, tuple) else "the pool"
                    ever = f": more than {who} could ever hold ({cap * S} bytes)" \
                        if n > cap else ""
                    raise PoolOutOfMemory(
                        f"cannot place {nbytes} bytes ({n} slabs of {S} B{many}) with "
                        f"placement {policy!r}{ever}",
                        free={m: free[m] * S for m in range(self.size)},
                        needed=nbytes)
                part = self.partitions.current()
                why = self.partitions.refusal(part, n * copies * S, S * sum(   # lendable too
                    self.nslabs[m] - self._used[m] for m in allowed
                    if m not in self.keeper.gone))
                if why is not None:
                    raise PoolOutOfMemory(why, free={m: free[m] * S for m in range(self.size)},
                                          needed=int(nbytes), partition=part)
                if self.role == "client":
                    homes = _placement.plan_servers(policy, n, free)
                else:
                    homes = _placement.plan(policy, n, free, self.me)
                homes = _placement.spill(homes, free, allowed)
                extra = homes and self.keeper.place(homes, copies, free, allowed)
                if homes is None or extra is None:
                    raise PoolOutOfMemory(
                        f"cannot place {nbytes} bytes ({n} slabs of {S} B{many}) with "
                        f"placement {policy!r}", free={m: free[m] * S for m in range(self.size)},
                        needed=int(nbytes))
                members = homes
                if self.leases is not None:    # the members placed on lend what it needs
                    self.leases.cover(homes + [m for ms in extra for m in ms])
                slots, fresh = self.take(heap, homes)
                extra = [(ms, *self.take(heap, ms)) for ms in extra]
                if self.leases is not None:
                    self.leases.headroom()
            if heap == "pv":         # private ids are this rank's own: shared ids stay in step
                self._next_pv -= 1
                aid = self._next_pv
            else:
                self._next_id += 1
                aid = self._next_id
            alloc = Allocation(self, aid, int(nbytes), heap, members, slots)
            if heap != "pv":
                fresh = self.keeper.track(alloc, what, copies, extra, fresh)
                self.mover.track(alloc)
                alloc.partition = part
                self.partitions.take(part, n * copies * S, owner=aid)
            self._live += 1
            f = weakref.finalize(alloc, self._queue_free, alloc.id, heap, members, slots,
                                 alloc.copies)
            f.atexit = False
        return alloc, fresh

    def take(self, heap, homes):
        """A free slot of `heap` on each member of `homes` (room checked by the caller):
        (slots, fresh), fresh[i] when that slot was never used before (still zero)."""
        slots, fresh = [0] * len(homes), [False] * len(homes)
        idx = {}
        for k, m in enumerate(homes):
            idx.setdefault(m, []).append(k)
        for m in sorted(idx):
            a = self._alloc[heap][m]
            hwm = a.hwm
            runs = a.alloc(len(idx[m]))
            got = [s for st, ln in runs for s in range(st, st + ln)]
            for k, s in zip(idx[m], got):
                slots[k] = s
                fresh[k] = s >= hwm
            self._used[m] += len(got)
            self._heap_used[heap][m] += len(got)
        return slots, fresh

    def _queue_free(self, aid, heap, members, slots, copies=None):
        (self._pending_pv if heap == "pv" else self._pending).append(
            (aid, heap, members, slots, copies))

    def _apply(self, pend):
        frees.apply(self, pend)

    def collect_frees(self, call=None, failed=False):
        """Give back the slabs of dropped arrays (collective in SPMD; see frees.collect).
        Returns whether any rank passed failed=True."""
        return frees.collect(self, call, failed)

    # -- versions (SPMD coherence) -------------------------------------------------------------
    def slab_version(self, m, slot):
        """The home's version of rw slab (m, slot): an atomic read (compare_swap 0 -> 0)."""
        return rejoin.read_version(self.win_ver, m, slot)

    def bump(self, m, slot):
        """Count one more write into rw slab (m, slot); keeps our cached copy current when
        nobody else wrote since we fetched it."""
        old = rejoin.bump_version(self.win_ver, m, slot)     # None: in doubt, moved again
        if m != self.me:
            e = self.cache.entries.get(("rw", m, slot))
            if e is not None:
                if old is not None and e.version == old:
                    e.version = old + 1
                else:
                    self.cache.discard(e)

    # -- locks and versions of whole arrays (locks.py, versions.py) ---------------------------
    def lock(self, name, timeout=None, lease=locks_.DEFAULT_LEASE):
        """``with pool.lock(name, timeout=):`` a fair lock across the pool's processes that a
        dead holder loses after `lease` seconds (locks.py)."""
        self.check_open()
        return self.locks.lock(name, timeout, lease)

    def version(self, x):
        """The version of array x: moves with every write to it (versions.py)."""
        return versions_.version(self, x)

    def compare_and_bump(self, x, expected, timeout=None):
        """Bump x's version if it is still `expected`; whether it did (versions.py)."""
        return versions_.compare_and_bump(self, x, expected, timeout)

    def update(self, x, fn, timeout=None):
        """x[...] = fn(x as numpy), atomically under x's lock; the new value (versions.py)."""
        return versions_.update(self, x, fn, timeout)

    def check(self):
        """{"ok", "checked", "differences"}: do directory, books, versions agree? (check.py)"""
        from . import check
        self.check_open()
        return check.run(self)

    def rebalance(self):
        """Hot slabs to their reader, then even use out; slabs moved (migrate.py)."""
        self.check_open()
        return self.mover.rebalance()

    def note_export(self, slot, owner):
        """A writeable view of local rw slab `slot` was handed out (see sync())."""
        if self.coherent:
            ws = self._exports.get(slot)
            if ws is None:
                ws = self._exports[slot] = weakref.WeakSet()
            ws.add(owner)

    def revalidate(self):
        """Drop cached rw slabs whose home version moved (one get per member)."""
        by = {}
        for (heap, m, slot), e in list(self.cache.entries.items()):
            if heap == "rw":
                by.setdefault(m, []).append((slot, e))
        for m, items in by.items():
            lo = min(s for s, _ in items)
            hi = max(s for s, _ in items) + 1
            vers = np.empty(hi - lo, np.int64)
            self.win_ver.get(m, lo * 8, vers)
            for slot, e in items:
                if int(vers[slot - lo]) != e.version:
                    self.cache.discard(e)

    # -- sync -------------------------------------------------------------------------------
    def sync(self, call=None, failed=False):
        """Flush, barrier and revalidate: afterwards every rank sees every write made before.

        SPMD: collective, and checked: `call` is the operation this sync ends (default a
        plain sync), compared across ranks in the allreduce that is the barrier
        (CollectiveMismatch on every rank when the calls differ, after revalidating, before
        any free). Returns whether any rank passed failed=True (its part of the operation
        raised: the caller then raises on every rank)."""
        self.check_open()
        for w in (self.win_rw, self.win_ro, self.win_ro_init, self.win_ver):
            if w is not None:
                w.flush()
        if not self.coherent:
            self.mover.migrate_hot()       # a safe point: slabs read most here move here
            self.collect_frees()
            return failed
        for slot, ws in list(self._exports.items()):   # writes through exported views
            self.win_ver.fetch_add(self.me, slot * 8, 1)
            if not ws:
                del self._exports[slot]     # no view left: nothing more can change unseen
        call = SYNC if call is None else call
        with self._lock:
            if self._pending_pv:
                self._apply(self._pending_pv)
                self._pending_pv = []
            pend = list(self._pending)
            red = agree.reduce(self.world, call, len(pend), int(failed))
            self.revalidate()
            return frees.agreed(self, red, call, pend)

    # -- reporting -----------------------------------------------------------------------------
    def free_bytes(self):
        """Free bytes per member (readwrite + readonly heaps share each member's budget)."""
        with self._lock:
            if not self.coherent:
                self.collect_frees()
            return [self.room(m) * self.slab_size for m in range(self.size)]

    def lent(self, m):
        """Slabs member m lends the pool now (all of its heap, unless leases.py lends less)."""
        return self._alloc["rw"][m].nslabs

    def room(self, m):
        """Slabs member m can still take: what it lends and has free, and (leases.py) what
        it has yet to lend, which it lends when an allocation is placed there."""
        return self.nslabs[m] - self._used[m]

    def stats(self, per_peer=False):
        """Usage per member, shares, fragmentation, cache counters and the transfers'
        latency, bandwidth and health, as a dict (pool/report.py; README.md, "Stats")."""
        from . import report
        return report.stats(self, per_peer)

    def __repr__(self):
        state = "closed" if self.closed else f"{self.size} member(s)"
        return (f"<pooltensor.Pool {state}, member {self.me}, slab {self.slab_size} B, "
                f"{self.role}>")

    # -- shutdown ------------------------------------------------------------------------------
    def close(self):
        """Release everything this process holds (collective in SPMD)."""
        if self.closed:
            return
        self.closed = True
        self.keeper.close()
        if self.leases is not None:
            self.leases.close()
        self.cache.gen += 1              # memos of x[i] fast paths stop matching
        self.cache.live.attached = False
        for r in list(self.views.values()):
            v = r()
            if v is not None:
                v._np = v._parts = None
        mapping.release(self)
        try:
            self.cache.clear(release=True)
        except Exception:
            pass
        world = self.world
        if self.role == "client":
            world.close()                # the servers free this process's memory
            return
        if collectives.world.current() is not world:
            return                       # the world was closed already (or replaced)
        if self._procs:                  # a plain script with member processes
            for m in range(1, self.size):
                try:
                    self.win_ctl.notify(m, 0, 1)
                except Exception:
                    pass
            for ch in self.chans.values():
                ch.close()                   # end of file: the member leaves at once
            spawn.stop(self._procs, world)
            return
        if getattr(sys, "last_value", None) is not None and self.spmd and self.size > 1:
            return     # exiting on an uncaught error: the other ranks may not be closing
        for w in (self.win_lock, self.win_ctl, self.win_ver, self.win_ro_init, self.win_ro,
                  self.win_rw):
            if w is not None:
                try:
                    w.close()
                except Exception:
                    pass
