"""Replicated read-only regions, and what the pool does when a member is lost.

Why: the pool's main tenant is model weights spread over a few boxes. Losing one box must not
lose the model, so ``access="readonly", replicas=k`` keeps k copies of every slab, each on a
member of its own, and reads carry on from a surviving copy.

Placement (Keeper.place). The placement policy picks each slab's first home, as for any array;
the k-1 other copies go to members that hold no copy of that slab yet, on a machine that holds
none first (a machine is the member's host identity: hostname, boot id, network namespace, or
$POOLTENSOR_HOST), then the next member after the first home in member order that has room, so
the copies of one member's block land together as a block on the next one. Deterministic:
SPMD ranks reach the same homes without a message. k larger than the members that can hold a
copy is a ValueError; k > 1 with an access other than readonly too (a read-write slab would
need every write on every copy, in step: not offered).

Writes. A read-only array is written only while it is created: every copy then
(transfer.put_bytes writes each; in SPMD each rank writes the copies it homes), then frozen
where the memory lives (the read-only key refuses puts).

Losses. A member is lost when the native monitor says so (World.lost(), polled by the keeper's
thread every POLL seconds: a killed process is seen within milliseconds) or when a read gets
PeerLost from it (notice()). Then, under the pool's lock:
- every copy on it is dropped; a slab with no copy left is lost: Allocation.lost records it
  (slab -> member), and a read of it raises PeerLost naming the member, while the allocation's
  other slabs and every other array keep working; ``pool.lost()`` lists them;
- no new slab is placed on it.
Readers take an Allocation's (members[k], slots[k]) pair without a lock, so the pair is
repointed to the first surviving copy on the reading thread, at its next slab (apply(), run
when pool.pending is set), never under a reader's feet. apply() also drops what this process
holds of the lost member: its mapping, cached copies, x[i] views, its plan channel. A read
that got PeerLost is then retried (transfer.py), bounded by the number of members.

Restore. The keeper's thread then copies each under-replicated slab from a surviving copy to a
new home (chosen as above, among the members alive), a batch of BATCH bytes per round, taking
the pool's lock only to allocate the slot and to publish the copy, never during a transfer:
no read waits for it. The copy becomes visible to readers only once written. The script moves
the bytes (get from the survivor, put through the key that lets it write read-only heaps: a
plain script's init window, a memory server's rw key). Not in SPMD: a lost rank stops every
collective there, so the ranks could not agree on new homes; reads still fail over.
``pool.stats()["replicas"]`` shows lost members, under-replicated slabs and bytes (and how
many of them want more copies than there are live members: those wait, and are looked at
again every RETRY seconds, as are slabs that found no room), and the slabs restored so far.
"""
import operator
import threading
import time
import weakref

import numpy as np

from collectives.errors import PeerLost, PeerRestarted

POLL = 0.05              # seconds between the keeper's looks at the world's lost peers
BATCH = 64 << 20         # bytes restored per round of the keeper's thread
RETRY = 2.0              # seconds between scans for copies that could not be placed


def check(replicas, access, eligible):
    """The number of copies asked for (1 when None): TypeError unless an integer;
    ValueError when below 1, above `eligible` (members that can hold a copy), or above 1
    with an access other than readonly."""
    if replicas is None:
        return 1
    if isinstance(replicas, bool):
        raise TypeError("replicas must be an integer, not bool")
    try:
        k = operator.index(replicas)
    except TypeError as e:
        raise TypeError(f"replicas: {e}") from None
    if k < 1:
        raise ValueError(f"replicas must be >= 1, not {k}")
    if k > 1 and access != "readonly":
        raise ValueError(f"replicas={k} needs access='readonly', not {access!r}: a read-only "
                         f"array is written once, while it is created, so its copies stay "
                         f"the same; read-write copies would need every write on every copy")
    if k > eligible:
        raise ValueError(f"replicas={k}, but only {eligible} member(s) of this pool can hold "
                         f"a copy: each copy of a slab needs a member of its own")
    return k


def machines(world, cfg):
    """The machine of every member (equal strings: one machine)."""
    out = []
    for r, c in enumerate(cfg):
        m = c.get("machine")
        if r and hasattr(world, "server"):        # a memory server says where it runs
            facts = world.server(r).facts
            m = facts.get("machine") or world.hosts[r].rsplit(":", 1)[0]
        out.append(m or world.hosts[r])
    return out


class Keeper:
    """One pool's replicas: placement of copies, lost members, failover and restore."""

    def __init__(self, pool, cfg):
        self.pool = pool
        self.machines = machines(pool.world, cfg)
        self.gone = {}                             # lost member -> time it was seen lost
        self.restarted = {}                        # rejoined server -> what its loss says
        self.allocs = weakref.WeakKeyDictionary()  # live shared Allocation -> (what, k)
        self.restored = self.restored_bytes = 0
        self.error = None                          # the restore's last failure, if any
        self.first_restore = self.last_restore = None
        self._dirty = False                        # a loss since the last restore scan
        self._scanned = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = None
        self._buf = None

    # -- placement ----------------------------------------------------------------------------
    def holders(self):
        """Members that can hold slabs: alive, with memory (a client's member 0 has none)."""
        pool = self.pool
        return [m for m in range(pool.size) if pool.nslabs[m] > 0 and m not in self.gone]

    def eligible(self):
        """How many members can hold a copy of a slab."""
        return len(self.holders())

    def room(self, policy):
        """(free slabs per member, members the policy allows): lost members have no room."""
        pool = self.pool
        free = [0 if m in self.gone else pool.room(m)
                for m in range(pool.size)]
        allowed = policy if isinstance(policy, tuple) else range(pool.size)
        return free, allowed

    def short_of_lost(self, n, nbytes, allowed):
        """An allocation of `n` slabs does not fit: when it would fit with the lost members'
        memory, the cause is the loss, not a full pool, and PeerLost says so (a memory server
        that was killed is lent again once it is back and rejoined: pool/rejoin.py)."""
        pool = self.pool
        lost = sorted(m for m in allowed if m in self.gone)
        if not lost or n > sum(pool.room(m) for m in allowed):
            return
        m = lost[0]
        who = "memory server" if pool.role == "client" else "member"
        raise PeerLost(
            f"cannot place {nbytes} bytes: {who} {m} is lost (for "
            f"{time.monotonic() - self.gone[m]:.1f} s) and the members left have room for "
            f"{sum(pool.room(k) for k in allowed if k not in self.gone) * pool.slab_size} "
            f"bytes; new arrays fit again once it is back", rank=m, host=pool.world.hosts[m])

    def place(self, homes, k, free, allowed):
        """The homes of copies 2..k of every slab (k-1 lists, one member per slab), given the
        first homes; None when the allowed members lack the room. ValueError when fewer than
        k allowed members can hold a copy."""
        if k <= 1:
            return []
        can = set(self.holders())
        ring = [m for m in sorted(allowed) if m in can]
        if len(ring) < k:
            raise ValueError(f"replicas={k} needs {k} members to place copies on, but the "
                             f"placement allows {len(ring)}: {ring}")
        left = list(free)
        for m in homes:
            left[m] -= 1
        pos = {m: i for i, m in enumerate(ring)}
        out = [[0] * len(homes) for _ in range(k - 1)]
        n = len(ring)
        mach = self.machines
        for i, h in enumerate(homes):
            got, seen = [h], {mach[h]}
            at = pos.get(h, -1)
            for j in range(k - 1):
                best = None
                for step in range(1, n + 1):
                    m = ring[(at + step) % n]
                    if m in got or left[m] <= 0:
                        continue
                    if mach[m] not in seen:
                        best = m
                        break
                    if best is None:
                        best = m
                if best is None:
                    return None
                got.append(best)
                seen.add(mach[best])
                left[best] -= 1
                out[j][i] = best
        return out

    def track(self, alloc, what, k, extra, fresh):
        """Register a new shared allocation (and its copies: extra = [(members, slots, fresh)]
        of copies 2..k). Returns fresh per slab: every copy of it fresh."""
        if extra:
            alloc.copies = [[(m, s)] for m, s in zip(alloc.members, alloc.slots)]
            fresh = list(fresh)
            for ms, ss, fs in extra:
                for i, (m, s, f) in enumerate(zip(ms, ss, fs)):
                    alloc.copies[i].append((m, s))
                    fresh[i] = fresh[i] and f
        if self.pool.size > 1:
            self.allocs[alloc] = (what, k)
        return fresh

    # -- losses ----------------------------------------------------------------------------
    def notice(self, ranks):
        """Members `ranks` are lost: drop their copies, record slabs left without one. Returns
        whether any of them is news."""
        pool = self.pool
        new = [r for r in ranks if r not in self.gone and r != pool.me and 0 <= r < pool.size]
        if not new:
            return False
        with pool._lock:
            now = time.monotonic()
            for r in new:
                self.gone.setdefault(r, now)
            gone = self.gone
            for a in list(self.allocs.keys()):
                lost = a.lost or {}
                if a.copies is not None:
                    for k, cs in enumerate(a.copies):
                        if any(m in gone for m, _ in cs):
                            live = [c for c in cs if c[0] not in gone]
                            if not live and k not in lost:
                                lost[k] = next(m for m, _ in cs if m in gone)
                            a.copies[k] = live
                else:
                    for k, m in enumerate(a.members):
                        if m in gone and k not in lost:
                            lost[k] = m
                if lost:
                    a.lost = lost
            pool.pending = True
            self._dirty = True
        self._wake.set()
        return True

    def apply(self):
        """On the reading thread: repoint slabs away from lost members, and drop what this
        process holds of them (mapping, cached copies, x[i] views, plan channel)."""
        pool = self.pool
        with pool._lock:
            pool.pending = False
            gone = set(self.gone)
            touched = set()
            for a in list(self.allocs.keys()):
                if not gone.intersection(a.members):
                    continue
                touched.add(a)
                a.memo.clear()
                if a.copies is not None:
                    for k, m in enumerate(a.members):
                        if m in gone and a.copies[k]:
                            a.members[k], a.slots[k] = a.copies[k][0]
            for r in gone:
                for heap in ("rw", "ro"):
                    pool.mapped.pop((heap, r), None)
                    pool.mapped_w.pop((heap, r), None)
                if pool.chans:
                    pool.chans.pop(r, None)
            cache = pool.cache
            cache.discard_keys([key for key in list(cache.entries) if key[1] in gone])
            cache.gen += 1
            for ref in list(pool.views.values()):
                v = ref()
                if v is not None and v._a in touched:
                    v._np = v._parts = None
                    v._tried = False

    def recover(self, err):
        """A read got PeerLost `err`: when it names another member, that member is lost
        (noticed, applied) and the read may be retried; else False."""
        r = getattr(err, "rank", None)
        pool = self.pool
        if r is None or r == pool.me or not 0 <= r < pool.size:
            return False
        if isinstance(err, PeerRestarted):
            # a rejoined server's old slot (a read that began before rejoined() repointed
            # it): read again, from the new place or with the loss's own error
            return r in self.restarted and r not in self.gone
        self.notice([r])
        self.apply()
        return True

    def lost_error(self, alloc, k):
        """The PeerLost a read of lost slab k of `alloc` raises."""
        r = alloc.lost[k]
        what = self.allocs.get(alloc, (None, 1))[0]
        desc = ""
        if what is not None and what[1] is not None:
            desc = f", the {what[0]} of shape {tuple(what[1])} and dtype {what[2]}"
        if r in self.restarted:
            return PeerRestarted(
                f"{self.restarted[r]}: slab {k} of allocation {alloc.id}{desc} was there",
                rank=r, host=self.pool.world.hosts[r])
        who = "memory server" if self.pool.role == "client" else "member"
        return PeerLost(
            f"slab {k} of allocation {alloc.id}{desc} lived on {who} {r}, which was lost, "
            f"and no other copy of it is left (pool.lost() lists what was lost; "
            f"access='readonly', replicas=2 keeps a copy on another member)",
            rank=r, host=self.pool.world.hosts[r])

    def rejoined(self, rank, msg):
        """Memory server `rank` restarted and was rejoined (pool/rejoin.py): every slab it held
        is lost as in a loss (copies elsewhere are read instead; slabs without one raise
        PeerRestarted saying `msg`), then it is a member again and new slabs may go there."""
        self.notice([rank])
        self.apply()
        with self.pool._lock:
            self.gone.pop(rank, None)
            self.restarted[rank] = msg

    # -- reporting --------------------------------------------------------------------------
    def lost(self):
        """One dict per live allocation with lost slabs: its id, shape, dtype and access (when
        known), the lost members, and how many of its slabs and bytes are gone."""
        out = []
        for a, (what, k) in sorted(list(self.allocs.items()), key=lambda p: p[0].id):
            if not a.lost:
                continue
            per = {}
            for s, m in a.lost.items():
                per[m] = per.get(m, 0) + 1
            shape, dtype = (tuple(what[1]), str(what[2])) if what and what[1] is not None \
                else (None, None)
            out.append({"allocation": a.id, "shape": shape, "dtype": dtype,
                        "access": a.access, "replicas": k,
                        "members": {m: {"host": self.pool.world.hosts[m], "slabs": c}
                                    for m, c in sorted(per.items())},
                        "slabs": len(a.lost), "of_slabs": len(a.members),
                        "bytes": sum(a.slab_len(s) for s in a.lost)})
        return out

    def under(self):
        """[(allocation, slab)] of copies to restore: slabs with fewer live copies than asked
        for (and at least one)."""
        out = []
        for a, (what, k) in list(self.allocs.items()):
            if a.copies is not None:
                out += [(a, s) for s, cs in enumerate(a.copies) if 0 < len(cs) < k]
        return out

    def stats(self):
        """Lost members, replicated and under-replicated slabs (count, bytes; of those, the
        ones wanting more copies than there are live members), restore progress and what
        was lost, as a dict."""
        pool = self.pool
        replicated = lost_slabs = lost_bytes = lost_allocs = 0
        under = self.under()
        alive = self.eligible()
        short = [(a, s) for a, s in under if self.allocs.get(a, (None, 0))[1] > alive]
        for a in list(self.allocs.keys()):
            if a.copies is not None:
                replicated += len(a.copies)
            if a.lost:
                lost_allocs += 1
                lost_slabs += len(a.lost)
                lost_bytes += sum(a.slab_len(s) for s in a.lost)
        return {"lost_members": [{"member": r, "host": pool.world.hosts[r]}
                                 for r in sorted(self.gone)],
                "replicated_slabs": replicated,
                "under_replicated": {"slabs": len(under),
                                     "bytes": sum(a.slab_len(s) for a, s in under)},
                "restoring": len(under) > len(short) and self.restores(),
                "too_few_members": {"slabs": len(short),
                                    "bytes": sum(a.slab_len(s) for a, s in short)},
                "restored": {"slabs": self.restored, "bytes": self.restored_bytes,
                             "seconds": (round(self.last_restore - self.first_restore, 4)
                                         if self.first_restore is not None else None)},
                "restore_error": None if self.error is None else str(self.error),
                "lost": {"allocations": lost_allocs, "slabs": lost_slabs, "bytes": lost_bytes}}

    # -- restore ----------------------------------------------------------------------------
    def restores(self):
        """Whether this pool restores copies (not in SPMD, not in a member process)."""
        return self.pool.role in ("plain", "client") and self._thread is not None

    def start(self):
        """The keeper's thread: watches for lost members, restores copies."""
        pool = self.pool
        if pool.size > 1 and pool.role in ("plain", "client", "spmd") and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pooltensor-keeper",
                                            daemon=True)
            self._thread.start()

    def close(self):
        """Stop the thread (before the pool's windows close)."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(max(1.0, float(self.pool.timeout or 10)))

    def _run(self):
        world = self.pool.world
        while not self._stop.is_set():
            self._wake.wait(POLL)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                lost = world.lost()
                if lost:
                    self.notice(lost)
                now = time.monotonic()
                if self.gone and self.pool.role in ("plain", "client") and (
                        self._dirty or now - self._scanned > RETRY):
                    self._dirty, self._scanned = False, now
                    while self.restore_some(BATCH) and not self._stop.is_set():
                        pass
            except Exception as e:          # noqa: BLE001  (kept for stats; tried again)
                self.error = e
                self._stop.wait(1.0)

    def _pick(self, cs):
        """A new home for a slab whose live copies are `cs`: alive, holding none of them,
        with room, on a machine without a copy first, then most free; None if none."""
        pool = self.pool
        have = {m for m, _ in cs}
        seen = {self.machines[m] for m in have}
        best = None
        for m in self.holders():
            free = pool.nslabs[m] - pool._used[m]
            if m in have or free <= 0:
                continue
            key = (self.machines[m] in seen, -free, m)
            if best is None or key < best:
                best = key
        return None if best is None else best[2]

    def restore_some(self, budget):
        """Restore copies of under-replicated slabs, up to `budget` bytes; returns whether
        there may be more to do (something was restored)."""
        pool = self.pool
        S = pool.slab_size
        done = 0
        for a, k in self.under():
            if done >= budget or self._stop.is_set() or pool.closed:
                break
            with pool._lock:
                cs = list(a.copies[k])
                want = self.allocs.get(a, (None, 0))[1]
                if not cs or len(cs) >= want:
                    continue
                m = self._pick(cs)
                if m is None:
                    continue
                slot = pool.take(a.heap, [m])[0][0]
            src, n = cs[0], a.slab_len(k)
            try:
                self._copy(a.heap, src, (m, slot), n)
                ok = True
            except PeerLost as e:
                self.notice([e.rank] if e.rank is not None else [])
                ok = False
            with pool._lock:
                if ok and m not in self.gone and a.copies[k] and a in self.allocs:
                    a.copies[k].append((m, slot))
                    self.restored += 1
                    self.restored_bytes += n
                    self.last_restore = time.monotonic()
                    if self.first_restore is None:
                        self.first_restore = min(self.gone.values())
                    done += n
                else:
                    pool._alloc[a.heap][m].free([(slot, 1)])
                    pool._used[m] -= 1
                    pool._heap_used[a.heap][m] -= 1
        return done > 0

    def _copy(self, heap, src, dst, n):
        """Bytes [0, n) of slab copy src -> slot dst (member, slot each), through this
        process: the mapped memory of a member on this machine, else a get and a put."""
        pool = self.pool
        S = pool.slab_size
        (sm, ss), (dm, ds) = src, dst
        if sm == pool.me:
            data = pool.local[heap][ss * S:ss * S + n]
        else:
            mp = pool.mapped.get((heap, sm))
            if mp is not None:
                data = mp[ss * S:ss * S + n]
            else:
                if self._buf is None:
                    self._buf = np.empty(S, np.uint8)
                data = pool.read_win[heap].get(sm, ss * S, self._buf[:n])
        if dm == pool.me:
            pool.local[heap][ds * S:ds * S + n] = data
            return
        mw = pool.mapped_w.get((heap, dm))
        if mw is not None:
            mw[ds * S:ds * S + n] = data
        else:
            pool.write_win[heap].put(dm, ds * S, data)
