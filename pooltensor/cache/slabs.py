"""The slab cache: copies of remote slabs in this process, bounded in bytes, LRU.

Why a cache: a remote slab is fetched whole (one Window.get per slab is what makes one-sided
transfers fast), then every read of it is a local numpy copy until it is evicted.

- Bounded: at most ``capacity // slab_size`` frames (numpy buffers of one slab). Frames are
  recycled through a free list, so a scan does not page-fault a fresh buffer per slab.
- LRU: an OrderedDict keyed by the slab's global address (heap, member, slot); a hit moves the
  entry to the end, eviction takes from the front.
- Pinned entries are never evicted: a numpy array handed out over a frame (blocks(), exported
  buffers) holds a pin until the last array derived from it dies (a finalizer on the owner
  object that numpy keeps as the base of every view). If every frame is pinned, a new frame is
  allocated past the budget and counted in ``overcommit``, rather than failing.
- Entries in flight (a prefetch whose Window.get_async has not completed) carry the request;
  whoever needs the bytes waits on it (with a timeout), eviction skips them.
- Versions: an entry of a read-write slab keeps the version the home had when the bytes were
  fetched; revalidation (after sync) drops entries whose home version moved. An entry that is
  pinned when it goes stale or its slab is freed is detached: it leaves the table, its frame
  stays with the arrays that use it and is not recycled.

This module is only the data structure and its counters; the pool does the transfers.
"""
import collections

import numpy as np


def _done(req):
    """A transfer that has completed (a failed one stays until someone waits and sees it)."""
    try:
        return req.test()
    except Exception:
        return False


def _failed(req):
    """A transfer that has failed already (its error not yet seen by a wait)."""
    try:
        req.test()
    except Exception:                   # noqa: BLE001  (whatever it was, it is not the bytes)
        return True
    return False


class Entry:
    """One cached slab: its frame, the home version it was fetched at, and its state."""

    __slots__ = ("key", "frame", "version", "req", "pins", "prefetched", "attached",
                 "__weakref__")

    def __init__(self, key, frame, version, req, prefetched):
        self.key, self.frame, self.version = key, frame, version
        self.req, self.pins, self.prefetched, self.attached = req, 0, prefetched, True


class Pin:
    """Owner object of a numpy array exported over a cache frame: unpins when it dies."""

    __slots__ = ("__array_interface__", "_cache", "_entry", "_keep", "__weakref__")

    def __init__(self, cache, entry, arr):
        self.__array_interface__ = arr.__array_interface__
        self._cache, self._entry, self._keep = cache, entry, arr   # _keep: the frame's memory
        entry.pins += 1

    def __del__(self):
        try:
            self._cache._unpin(self._entry)
        except Exception:
            pass


class SlabCache:
    """Frames for remote slabs of one process, LRU with pinning; see the module docstring."""

    def __init__(self, slab_size, capacity):
        self.slab_size = int(slab_size)
        self.capacity = int(capacity)
        self.max_frames = max(2, self.capacity // self.slab_size)
        self.entries = collections.OrderedDict()
        self._free = []
        self.nframes = 0          # frames allocated and not discarded (in use + free list)
        self.gen = 0              # bumped whenever an entry leaves (memo checks use it)
        # stands for the memory of this process and of mapped members in x[i] memos: valid
        # (attached) until the pool closes, as a cache entry is until it leaves the table
        self.live = Entry(None, None, 0, None, False)
        self.hits = self.misses = self.evictions = 0
        self.bytes_fetched = 0
        self.direct = 0           # reads served from a same-machine member's mapped memory
        self.prefetch_issued = self.prefetch_used = self.prefetch_wasted = 0
        self.overcommit = 0
        self.timeout = 60.0

    # -- lookups ---------------------------------------------------------------------------
    def get(self, key):
        """The entry for `key` (moved to the LRU end), or None. Counts nothing."""
        e = self.entries.get(key)
        if e is not None:
            self.entries.move_to_end(key)
        return e

    def ready(self, e):
        """Wait for an entry's transfer if one is in flight; returns its frame."""
        req = e.req
        if req is not None:
            try:
                req.wait(self.timeout)
            except BaseException:
                self.discard(e)
                raise
            e.req = None
        return e.frame

    # -- frames ------------------------------------------------------------------------------
    def frame(self):
        """A frame to fill: recycled, new (within budget), or taken from the LRU entry."""
        if self._free:
            return self._free.pop()
        if self.nframes < self.max_frames:
            self.nframes += 1
            return np.empty(self.slab_size, np.uint8)
        for key, e in self.entries.items():
            if e.pins == 0 and (e.req is None or _done(e.req)):
                self._remove(e)
                self.evictions += 1
                if e.prefetched:
                    self.prefetch_wasted += 1
                return e.frame
        self.overcommit += 1          # everything is pinned or in flight: go past the budget
        self.nframes += 1
        return np.empty(self.slab_size, np.uint8)

    def insert(self, key, frame, version=0, req=None, prefetched=False):
        """Add a filled (or filling, with `req`) frame under `key`; returns the entry."""
        old = self.entries.get(key)
        if old is not None:
            self.discard(old)
        e = Entry(key, frame, version, req, prefetched)
        self.entries[key] = e
        return e

    def _remove(self, e):
        if e.attached:
            del self.entries[e.key]
            e.attached = False
            self.gen += 1

    def discard(self, e):
        """Take an entry out of the table (freed or stale slab); recycle its frame if free."""
        self._remove(e)
        if e.pins == 0:
            if e.req is not None:
                try:
                    e.req.wait(self.timeout)
                except Exception:
                    e.frame = None      # a failed transfer: do not reuse a frame it may write
                e.req = None
            self._recycle(e)

    def _recycle(self, e):
        if e.frame is None:
            self.nframes -= 1
            return
        if self.nframes > self.max_frames:
            self.nframes -= 1           # shrink back after an overcommit
        else:
            self._free.append(e.frame)
        e.frame = None

    def discard_keys(self, keys):
        for key in keys:
            e = self.entries.get(key)
            if e is not None:
                self.discard(e)

    # -- pins ------------------------------------------------------------------------------
    def export(self, e, arr):
        """A numpy array over `arr` (a view of e's frame) that pins e while it lives."""
        pin = Pin(self, e, arr)
        out = np.asarray(pin)
        out.flags.writeable = False
        return out

    def _unpin(self, e):
        e.pins -= 1
        if e.pins == 0 and not e.attached:
            self._recycle(e)

    # -- bookkeeping -------------------------------------------------------------------------
    def resize(self, capacity):
        """Change the budget (bytes); extra frames go as entries are evicted or recycled."""
        self.capacity = int(capacity)
        self.max_frames = max(2, self.capacity // self.slab_size)
        while self._free and self.nframes > self.max_frames:
            self._free.pop()
            self.nframes -= 1
        while len(self.entries) > self.max_frames:
            for e in self.entries.values():
                if e.pins == 0 and (e.req is None or _done(e.req)):
                    self.discard(e)
                    self.evictions += 1
                    break
            else:
                break

    def clear(self, release=False):
        """Drop every entry (waits for transfers in flight). The frames stay allocated for
        reuse (their pages are already faulted in) unless release=True."""
        for e in list(self.entries.values()):
            self.discard(e)
        if release:
            self.nframes -= len(self._free)
            self._free.clear()

    def stats(self):
        """Counters and occupancy as a dict."""
        looks = self.hits + self.misses
        return {"capacity": self.capacity, "slab_size": self.slab_size,
                "frames": self.max_frames, "cached_slabs": len(self.entries),
                "cached_bytes": len(self.entries) * self.slab_size,
                "pinned": sum(1 for e in self.entries.values() if e.pins),
                "hits": self.hits, "misses": self.misses,
                "hit_rate": self.hits / looks if looks else 0.0,
                "evictions": self.evictions, "bytes_fetched": self.bytes_fetched,
                "prefetch_issued": self.prefetch_issued, "prefetch_used": self.prefetch_used,
                "prefetch_wasted": self.prefetch_wasted,
                "prefetch_accuracy": (self.prefetch_used / self.prefetch_issued
                                      if self.prefetch_issued else 0.0),
                "overcommit": self.overcommit, "direct_reads": self.direct}

    def reset_counters(self):
        self.hits = self.misses = self.evictions = self.bytes_fetched = self.direct = 0
        self.prefetch_issued = self.prefetch_used = self.prefetch_wasted = 0
        self.overcommit = 0
