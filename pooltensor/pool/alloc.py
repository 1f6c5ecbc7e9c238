"""The slab allocator of one heap: which slabs are free, with reuse after free.

State is a sorted list of free runs ``(start, length)``; freeing inserts a run and coalesces
it with its neighbours, so the heap never fragments by more than what is still allocated.
Touched memory first. Slabs below the high-water mark ``hwm`` were handed out before: their
pages are backed already, while a never-used slab costs a page fault per page on its first
write (256 for a 1 MiB slab, several times the cost of the write itself). So the free slabs
fall in two classes, touched (below hwm) and fresh (the tail from hwm on), and an allocation
takes touched slabs whenever enough are free:

1. the shortest touched run that is long enough (best fit), the first of equals;
2. else, when the touched runs hold enough in all, the largest touched runs first;
3. else every touched slab, and the rest from the fresh tail (contiguous with the touched
   slabs just below hwm, when those are free).

Within a class an allocation prefers one contiguous run, because consecutive slabs of one
member can then move in one transfer; it only fails when the heap has too few free slabs in
total. Everything is deterministic: the same calls in the same order give the same slabs on
every process, which is what lets SPMD ranks agree on placement without messages.
"""
import bisect


class SlabAllocator:
    """Free-run bookkeeping for a heap of ``nslabs`` slabs (no memory is touched here)."""

    __slots__ = ("nslabs", "_starts", "_lens", "nfree", "hwm")

    def __init__(self, nslabs):
        self.nslabs = int(nslabs)
        self._starts = [0] if nslabs else []
        self._lens = [self.nslabs] if nslabs else []
        self.nfree = self.nslabs
        self.hwm = 0          # slabs at or above this index were never handed out: still zero

    def alloc(self, n):
        """``n`` slabs as a list of runs ``[(start, length), ...]``; None if fewer are free."""
        n = int(n)
        if n <= 0:
            return []
        if n > self.nfree:
            return None
        hwm = self.hwm
        touched = [min(st + ln, hwm) - st if st < hwm else 0
                   for st, ln in zip(self._starts, self._lens)]
        best = -1
        for i, ln in enumerate(touched):         # best fit: the shortest run that is enough
            if ln >= n and (best < 0 or ln < touched[best]):
                best = i
                if ln == n:
                    break
        if best >= 0:
            return [self._take(best, n)]
        have = sum(touched)
        if have >= n:                            # largest touched runs first
            order = sorted(range(len(touched)), key=lambda i: (-touched[i], i))
            picks, left = [], n
            for i in order:
                take = min(left, touched[i])
                picks.append((self._starts[i], take))
                left -= take
                if not left:
                    break
        else:                                    # every touched slab, then the fresh tail
            picks = [(st, ln) for st, ln in zip(self._starts, touched) if ln]
            tail = self._starts[-1]              # the last run reaches the end of the heap
            extra = n - have
            if picks and picks[-1][0] == tail:
                picks[-1] = (tail, picks[-1][1] + extra)
            else:
                picks.append((tail, extra))
        runs = [self._take(bisect.bisect_left(self._starts, st), ln) for st, ln in picks]
        runs.sort()
        return runs

    def _take(self, i, n):
        start = self._starts[i]
        if self._lens[i] == n:
            del self._starts[i], self._lens[i]
        else:
            self._starts[i] += n
            self._lens[i] -= n
        self.nfree -= n
        self.hwm = max(self.hwm, start + n)
        return (start, n)

    def free(self, runs):
        """Give back runs from alloc(); neighbours coalesce. Double frees raise ValueError."""
        for start, n in runs:
            if n <= 0:
                continue
            if start < 0 or start + n > self.nslabs:
                raise ValueError(f"run {start}+{n} outside a heap of {self.nslabs} slabs")
            i = bisect.bisect_left(self._starts, start)
            if (i < len(self._starts) and self._starts[i] < start + n) or \
                    (i > 0 and self._starts[i - 1] + self._lens[i - 1] > start):
                raise ValueError(f"run {start}+{n} is already free")
            merge_prev = i > 0 and self._starts[i - 1] + self._lens[i - 1] == start
            merge_next = i < len(self._starts) and self._starts[i] == start + n
            if merge_prev and merge_next:
                self._lens[i - 1] += n + self._lens[i]
                del self._starts[i], self._lens[i]
            elif merge_prev:
                self._lens[i - 1] += n
            elif merge_next:
                self._starts[i] = start
                self._lens[i] += n
            else:
                self._starts.insert(i, start)
                self._lens.insert(i, n)
            self.nfree += n

    def resize(self, n):
        """Make the heap `n` slabs long (leases.py: growing lends more of the member's memory,
        shrinking gives the tail back). Shrinking needs slabs [n, nslabs) free; returns
        whether it was done. The last free run still ends at the heap's end afterwards."""
        n = int(n)
        if n >= self.nslabs:
            if n > self.nslabs:
                grow, self.nslabs = n - self.nslabs, n
                self.free([(n - grow, grow)])
            return True
        if not self._starts or self._starts[-1] + self._lens[-1] != self.nslabs or \
                self._starts[-1] > n:
            return False
        cut = self.nslabs - n
        self._lens[-1] -= cut
        if not self._lens[-1]:
            del self._starts[-1], self._lens[-1]
        self.nfree -= cut
        self.nslabs = n
        return True

    def state(self):
        """Everything this allocator knows, as plain values (from_state() rebuilds it)."""
        return (self.nslabs, list(self._starts), list(self._lens), self.nfree, self.hwm)

    @classmethod
    def from_state(cls, state):
        """The allocator that state() described."""
        nslabs, starts, lens, nfree, hwm = state
        a = cls(nslabs)
        a._starts, a._lens, a.nfree, a.hwm = list(starts), list(lens), int(nfree), int(hwm)
        return a

    def free_runs(self):
        """The free runs, ascending: [(start, length), ...]."""
        return list(zip(self._starts, self._lens))

    @property
    def largest(self):
        """Length of the longest free run (the biggest contiguous allocation possible)."""
        return max(self._lens, default=0)

    def largest_grown(self, more):
        """The longest free run once the heap is `more` slabs longer (leases.py: what a
        member has yet to lend joins its last free run when it is lent)."""
        end = self._starts[-1] + self._lens[-1] == self.nslabs if self._starts else False
        return max(self.largest, (self._lens[-1] if end else 0) + more)

    def fragmentation(self):
        """0 when the free slabs form one run, towards 1 as they scatter: 1 - largest/free."""
        return 0.0 if self.nfree == 0 else 1.0 - self.largest / self.nfree


def pool_state(pool):
    """A pool's allocation state for its shared heaps, as plain values: what another member
    takes (take_pool_state) to allocate in step with this one from then on, as SPMD ranks
    do. Queued frees are given back first."""
    with pool._lock:
        pool.collect_frees()
        return {"alloc": {h: [a.state() for a in pool._alloc[h]] for h in ("rw", "ro")},
                "heap_used": {h: list(pool._heap_used[h]) for h in ("rw", "ro")},
                "used": list(pool._used), "next_id": pool._next_id,
                "placement": pool.placement}


def take_pool_state(pool, state):
    """Make `pool` allocate as the pool whose pool_state() `state` is (its own queued
    frees are dropped: that pool's are the ones that count)."""
    with pool._lock:
        for h in ("rw", "ro"):
            pool._alloc[h] = [SlabAllocator.from_state(t) for t in state["alloc"][h]]
        pool._heap_used = {h: list(state["heap_used"][h]) for h in ("rw", "ro")}
        pool._used = list(state["used"])
        pool._next_id = state["next_id"]
        pool.placement = state["placement"]
        pool._pending = []
