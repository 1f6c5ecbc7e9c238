"""Same-machine memory: the heaps of members on this machine mapped in place, and the one
warning about how this machine backs shared memory.

Mapping. A member on this machine (transport "shm") exposes its heaps as shared-memory
segments; Window.attach maps them into this process once, checked where the memory lives like
a get (read-only mapping) or a put (writable mapping, rw keys only). Reads of such a slab are
then a numpy copy from the member's memory, with no request and no cache frame; writes are a
numpy copy into it. The cache keeps serving members on other machines. On by default;
``POOLTENSOR_ATTACH=0`` (or ``init(attach=False)``) keeps the copying path: every slab of
another process goes through Window.get/put and the slab cache, as it does across machines.

- ``pool.mapped[(heap, m)]``: member m's heap `heap` ('rw', 'ro'), read-only.
- ``pool.mapped_w[(heap, m)]``: the same memory, writable: the rw heaps (every process), and
  in a plain script's own process the ro heaps too, through the rw key the members give the
  script alone to initialize readonly arrays.

A member of a plain script follows the script's choice (member 0's), so that with
attach=False the members stand in for other machines too.

Huge pages. Pool memory is shared memory; with shmem transparent huge pages off, a memfd gets
4 KiB pages, every one a fault of its own, and a stream over pool memory runs well below
numpy's speed. The native layer then makes segments in a private tmpfs mounted with huge
pages instead (collectives.native.segment_kind() == 'tmpfs'); where it cannot (user
namespaces off), check_huge_pages() says so once per process, with what to set.
"""
import os
import sys
import warnings

from collectives.native import segment_kind

from ..cache import populate
from ..errors import HugePageWarning

THP_SHMEM = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
THP_ON = ("always", "within_size", "advise", "force")
_warned = [False]


def attach_default():
    """Whether same-machine heaps are mapped when init() is not told: $POOLTENSOR_ATTACH,
    on unless it is '0' (empty is unset, as for every variable)."""
    return os.environ.get("POOLTENSOR_ATTACH", "").strip() != "0"


def map_peers(pool, world, writes_ro):
    """Fill pool.mapped and pool.mapped_w with the heaps of the members on this machine.
    writes_ro: also map the ro heaps writable, through pool.win_ro_init."""
    for m in range(pool.size):
        if m == pool.me or world.transports[m] != "shm":
            continue
        n = pool.capacity[m]
        for heap, win in (("rw", pool.win_rw), ("ro", pool.win_ro)):
            view = win.attach(m, 0, n)
            if view is not None:
                pool.mapped[(heap, m)] = view
        for heap, win in (("rw", pool.win_rw), ("ro", pool.win_ro_init if writes_ro else None)):
            if win is not None and (heap, m) in pool.mapped:
                view = win.attach(m, 0, n, writable=True)
                if view is not None:
                    pool.mapped_w[(heap, m)] = view


def release(pool):
    """Forget the mappings of a pool being closed (and what populate() remembers of them:
    their addresses may be mapped again)."""
    for view in list(pool.mapped.values()) + list(pool.mapped_w.values()):
        populate.forget(view)
    for heap in ("rw", "ro"):
        buf = pool.local.get(heap)
        if buf is not None:
            populate.forget(buf)
    pool.mapped, pool.mapped_w = {}, {}


def thp_setting(path=THP_SHMEM):
    """The selected value of the shmem transparent huge page setting ('never', 'advise',
    ...), or None where there is none (not Linux, no such file)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return text.strip() or None


def check_huge_pages(path=THP_SHMEM, kind=None):
    """Warn (HugePageWarning, once per process) when shmem transparent huge pages are off and
    this process's segments are not in the huge tmpfs either (kind: what they are made of,
    default collectives.native.segment_kind()). Returns whether it warned now."""
    if _warned[0] or not sys.platform.startswith("linux"):
        return False
    if os.environ.get("POOLTENSOR_THP_WARNING", "").strip() == "0":
        return False
    value = thp_setting(path)
    if value is None or value in THP_ON:
        return False
    if (kind or segment_kind()) == "tmpfs":
        return False
    _warned[0] = True
    why = ("$POOLTENSOR_SEGMENTS=memfd keeps pool memory out of a private tmpfs with huge pages"
           if os.environ.get("POOLTENSOR_SEGMENTS") == "memfd" else
           "nor could a private tmpfs with huge pages be mounted (user namespaces off?)")
    warnings.warn(
        f"shared memory gets no transparent huge pages on this machine ({path} is "
        f"'{value}'), and {why}: pool memory is backed 4 KiB at a time, which makes first "
        f"touches and streams slower. This is only a speed matter; to fix it (as root): "
        f"echo advise > {path}  (POOLTENSOR_THP_WARNING=0 silences this)",
        HugePageWarning, stacklevel=3)
    return True
