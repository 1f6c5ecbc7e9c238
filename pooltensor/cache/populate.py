"""Populating memory before it is read or written: one system call for a whole range.

Memory mapped from a member on this machine (and fresh pool memory) is backed page by page
on first touch; a copy of a 1 MiB slab over unbacked pages takes 256 page faults. Linux 5.14+
backs a range in one call instead: madvise(MADV_POPULATE_READ) maps the pages already there
(and allocates missing ones) without writing them, MADV_POPULATE_WRITE prepares them for
writing. Only the range about to be read or written is populated, never a whole heap (that
would commit all of a peer's memory).

Where the kernel refuses (EINVAL before 5.14, or another system) populate() does nothing from
then on, quietly: the pages are then faulted in on first touch, as before. It is a speed
matter only, never a correctness one; the bytes of the range are never changed.

Calling it again on a range it populated is cheap: a walk over a populated 1 MiB still costs
tens of microseconds in the kernel, so the ranges populated are remembered (one sorted list of
address intervals per advice, merged as they grow) and a range inside them returns at once.
forget() drops what is remembered of a buffer that is about to be unmapped (its addresses
may be mapped again, unpopulated).
"""
import ctypes
import bisect
import ctypes.util
import mmap
import sys
import threading
import weakref

import numpy as np

PAGE = mmap.PAGESIZE
MADV_POPULATE_READ, MADV_POPULATE_WRITE = 22, 23     # linux/mman.h (5.14)
_EINVAL = 22

_madvise = None
_refused = {MADV_POPULATE_READ: not sys.platform.startswith("linux"),
            MADV_POPULATE_WRITE: not sys.platform.startswith("linux")}
_calls = [0]            # system calls made (for tests and benchmarks)
_done = {MADV_POPULATE_READ: ([], []), MADV_POPULATE_WRITE: ([], [])}   # starts, ends
_lock = threading.Lock()


def _libc():
    global _madvise
    if _madvise is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            f = libc.madvise
            f.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            f.restype = ctypes.c_int
        except (OSError, AttributeError):
            f = False
        _madvise = f
    return _madvise


_addr = {}              # id(numpy array) -> (weak reference, address): asking numpy is slow


def address(buf):
    """The address of the first byte of a numpy array or of any object with the buffer
    protocol."""
    if not isinstance(buf, np.ndarray):
        return np.frombuffer(buf, np.uint8).__array_interface__["data"][0]
    got = _addr.get(id(buf))
    if got is not None and got[0]() is buf:
        return got[1]
    a = buf.__array_interface__["data"][0]
    if len(_addr) >= 4096:
        _addr.clear()
    _addr[id(buf)] = (weakref.ref(buf), a)
    return a


def populate(buf, lo=0, hi=None, write=False):
    """Back bytes [lo, hi) of `buf` (a numpy array or buffer; byte offsets) with pages in one
    system call, before they are read (write=False) or written (write=True).

    The range is widened to whole pages (it may start and end anywhere). A range inside one
    page costs nothing (its single fault is as cheap as the call). Returns True when the
    kernel populated it, False when nothing was done (refused, empty, one page)."""
    nbytes = buf.nbytes if isinstance(buf, np.ndarray) else memoryview(buf).nbytes
    hi = nbytes if hi is None else min(int(hi), nbytes)
    lo = max(0, int(lo))
    advice = MADV_POPULATE_WRITE if write else MADV_POPULATE_READ
    if hi <= lo or _refused[advice]:
        return False
    base = address(buf)
    a = (base + lo) & ~(PAGE - 1)
    b = (base + hi + PAGE - 1) & ~(PAGE - 1)
    if b - a <= PAGE:
        return False
    starts, ends = _done[advice]
    i = bisect.bisect_right(starts, a) - 1
    if i >= 0 and ends[i] >= b:
        return True                       # populated before
    f = _madvise if _madvise is not None else _libc()
    if not f:
        _refused[MADV_POPULATE_READ] = _refused[MADV_POPULATE_WRITE] = True
        return False
    _calls[0] += 1
    if f(a, b - a, advice) == 0:
        with _lock:
            _remember(advice, a, b)
            if write:
                _remember(MADV_POPULATE_READ, a, b)
        return True
    if ctypes.get_errno() == _EINVAL:     # the kernel has no such advice: never ask again
        _refused[advice] = True
    return False                          # EFAULT, ENOMEM, EPERM...: this range only


def _remember(advice, a, b):
    starts, ends = _done[advice]
    i = bisect.bisect_left(ends, a)            # the first interval that ends at or after a
    j = bisect.bisect_right(starts, b)         # past the last that starts at or before b
    if i < j:
        a, b = min(a, starts[i]), max(b, ends[j - 1])
    starts[i:j] = [a]
    ends[i:j] = [b]


def forget(buf):
    """Drop what is remembered as populated inside `buf` (before it is unmapped)."""
    nbytes = buf.nbytes if isinstance(buf, np.ndarray) else memoryview(buf).nbytes
    lo = address(buf)
    hi = lo + nbytes
    with _lock:
        for starts, ends in _done.values():
            i = bisect.bisect_right(ends, lo)
            j = bisect.bisect_left(starts, hi)
            keep = []
            for s, e in zip(starts[i:j], ends[i:j]):
                if s < lo:
                    keep.append((s, lo))
                if e > hi:
                    keep.append((hi, e))
            starts[i:j] = [s for s, _ in keep]
            ends[i:j] = [e for _, e in keep]


def calls():
    """System calls populate() made so far in this process."""
    return _calls[0]


def available(write=False):
    """Whether the kernel has not refused this advice (so far)."""
    return not _refused[MADV_POPULATE_WRITE if write else MADV_POPULATE_READ]


__all__ = ["populate", "forget", "address", "calls", "available", "PAGE"]
