"""The slab allocator of one heap: which slabs are free, with reuse after free.

State is a sorted list of free runs ``(start, length)``; freeing inserts a run and coalesces
it with its neighbours, so the heap never fragments by more than what is still allocated.
An allocation prefers one contiguous run (best fit: the smallest run that is long enough),
because consecutive slabs of one member can then move in one transfer; when no run is long
enough it takes the largest runs first, so it only fails when the heap has too few free slabs
in total. Everything is deterministic: the same calls in the same order give the same slabs on
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
        best = -1
        for i, ln in enumerate(self._lens):      # best fit: the shortest run that is enough
            if ln >= n and (best < 0 or ln < self._lens[best]):
                best = i
                if ln == n:
                    break
        if best >= 0:
            return [self._take(best, n)]
        runs, left = [], n
        while left:                              # no run is enough: largest runs first
            i = max(range(len(self._lens)), key=self._lens.__getitem__)
            take = min(left, self._lens[i])
            runs.append(self._take(i, take))
            left -= take
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

    def free_runs(self):
        """The free runs, ascending: [(start, length), ...]."""
        return list(zip(self._starts, self._lens))

    @property
    def largest(self):
        """Length of the longest free run (the biggest contiguous allocation possible)."""
        return max(self._lens, default=0)

    def fragmentation(self):
        """0 when the free slabs form one run, towards 1 as they scatter: 1 - largest/free."""
        return 0.0 if self.nfree == 0 else 1.0 - self.largest / self.nfree
