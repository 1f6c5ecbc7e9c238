"""A fault: one remote slab copied into a frame of the slab cache.

Both the readers (transfer.py) and the prefetcher (prefetch.py) fill the cache this way, so
it lives apart from both; the cache itself (slabs.py) is only the data structure.
"""


def fetch(pool, heap, m, slot, nbytes, asynchronous=False):
    """Copy remote slab (heap, m, slot) into a new cache entry (started only, if asynchronous).

    For a read-write slab the home's version is read first, then the bytes: a write that
    lands in between makes the copy look older than it is, never newer."""
    cache = pool.cache
    frame = cache.frame()
    version = pool.slab_version(m, slot) if (pool.coherent and heap == "rw") else 0
    mover = getattr(pool, "mover", None)
    if mover is not None:
        mover.note(heap, m, slot)        # the access counts migration samples (pool/migrate.py)
    win = pool.read_win[heap]
    off = slot * pool.slab_size
    try:
        if asynchronous:
            req = win.get_async(m, off, frame[:nbytes])
        else:
            win.get(m, off, frame[:nbytes])
            req = None
    except BaseException:
        cache._free.append(frame)
        raise
    cache.bytes_fetched += nbytes
    return cache.insert((heap, m, slot), frame, version, req, asynchronous)
