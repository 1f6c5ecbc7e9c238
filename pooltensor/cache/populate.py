"""Fault in a range of memory in one call: madvise(MADV_POPULATE_WRITE / _READ).

Why: on a virtual machine every first touch of a page is a trap into the hypervisor; numpy
writing a fresh 512 MiB result faults 131072 pages one at a time inside its loop. The kernel
can populate a whole range in one call (Linux 5.14+), which is several times cheaper and can
run on a member's own time. Where the call is not available (older kernels, macOS, memory the
kernel refuses to populate) this does nothing: the pages are faulted on first touch as before.
"""
import ctypes
import mmap
import sys

import numpy as np

MADV_POPULATE_READ = 22
MADV_POPULATE_WRITE = 23
PAGE = mmap.PAGESIZE
_state = {"libc": None, "ok": sys.platform.startswith("linux")}


def _madvise():
    libc = _state["libc"]
    if libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        libc.madvise.restype = ctypes.c_int
        _state["libc"] = libc
    return libc.madvise


def populate(buf, lo, hi, write=False):
    """Fault in bytes [lo, hi) of numpy buffer `buf` (page-aligned outward) in one call;
    write=True prepares them for writing (private zero pages replaced). Returns True when the
    kernel did it, False when it is not available (nothing changes then)."""
    if hi <= lo or not _state["ok"]:
        return False
    base = np.asarray(buf).__array_interface__["data"][0]
    start = (base + lo) // PAGE * PAGE
    end = -(-(base + hi) // PAGE) * PAGE
    try:
        rc = _madvise()(start, end - start,
                        MADV_POPULATE_WRITE if write else MADV_POPULATE_READ)
    except (OSError, AttributeError):
        _state["ok"] = False
        return False
    if rc != 0:
        if ctypes.get_errno() == 22:         # EINVAL: a kernel without the advice
            _state["ok"] = False
        return False
    return True
