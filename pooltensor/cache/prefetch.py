"""The prefetcher: guess the next remote slabs of an array and start fetching them early.

Detection works like the kernel's readahead, per array (per Allocation, so all views of one
array share it), on the sequence of slabs its reads touch:

- a step d between two consecutive distinct slabs that equals the previous step confirms a
  stream (sequential when d = 1, strided otherwise, backwards when d < 0);
- while confirmed, the window of slabs kept in flight ahead doubles (1, 2, 4, ... up to
  limit(): ``pool.max_prefetch``, a quarter of the cache's frames, ~8 MiB in flight);
- a step that breaks the pattern halves the window and issues nothing, so random access
  costs a few wasted fetches at most and then none.

Issued prefetches are Window.get_async calls into cache frames; the native progress thread
completes them while Python goes on. A read that finds an entry still in flight waits for it
(counted as a hit and as a prefetch used); an entry evicted before anyone read it counts as
wasted. Explicit hints (``x.prefetch(index)``, ``x.blocks()``) go through issue() directly.
"""

from collectives.errors import PeerLost

from .fault import fetch


class Stream:
    """Per-array detector state."""

    __slots__ = ("last", "stride", "window", "ahead")

    def __init__(self):
        self.last = None      # the last slab read
        self.stride = 0       # the step that is being confirmed
        self.window = 0       # slabs to keep in flight ahead
        self.ahead = None     # the furthest slab issued along the current stride


IN_FLIGHT_BYTES = 8 << 20   # a stream's frames then stay in the CPU's last-level cache


def limit(pool):
    """Most slabs kept in flight for one array: pool.max_prefetch, at most a quarter of the
    cache's frames and about IN_FLIGHT_BYTES (at least one)."""
    return max(0, min(pool.max_prefetch, pool.cache.max_frames // 4,
                      max(1, IN_FLIGHT_BYTES // pool.slab_size)))


def observe(pool, alloc, k):
    """Record a read of slab k of `alloc`; prefetch along a confirmed stride."""
    st = alloc.pf
    if st is None:
        st = alloc.pf = Stream()
    last = st.last
    if last == k:
        return
    st.last = k
    if last is None:
        return
    d = k - last
    if d != st.stride:
        st.stride = d
        st.window //= 2
        st.ahead = None
        return
    st.window = min(max(1, 2 * st.window), limit(pool))
    if st.window == 0:
        return
    end = k + d * st.window
    start = k + d if st.ahead is None or (st.ahead - k) * d <= 0 else st.ahead + d
    n = len(alloc.members)
    t = start
    while (t - end) * d <= 0:
        if not 0 <= t < n:
            break
        issue(pool, alloc, t)
        t += d
    st.ahead = t - d


def issue(pool, alloc, k):
    """Start fetching slab k of `alloc` into the cache if it is remote and not there yet."""
    m = alloc.members[k]
    if m == pool.me or (pool.mapped and (alloc.heap, m) in pool.mapped) or \
            (alloc.lost and k in alloc.lost):
        return False
    key = (alloc.heap, m, alloc.slots[k])
    if key in pool.cache.entries:
        return False
    try:
        fetch(pool, alloc.heap, m, alloc.slots[k], alloc.slab_len(k), asynchronous=True)
    except PeerLost:
        return False         # a hint: the read of that slab fails over (transfer.py)
    pool.cache.prefetch_issued += 1
    return True


def issue_many(pool, alloc, ks):
    """Explicit hint: prefetch slabs `ks` (in order), at most half the cache's frames."""
    budget = max(0, pool.cache.max_frames // 2)
    done = 0
    for k in ks:
        if done >= budget:
            break
        if issue(pool, alloc, k):
            done += 1
    return done
