"""The platform profile the native engine was built with (collectives.native_info), and the
symbols that prove it: the posix profile (what macOS builds) imports none of Linux's own calls.
Run in both profiles: `make test` runs the linux build in place, then `make test-posix` runs the
posix build of build/posix/pkg (POOLTENSOR_EXPECT_NATIVE=posix)."""
import os
import shutil
import subprocess

import pytest

import collectives
from collectives import _native

LINUX_ONLY = ("memfd_create", "process_vm_readv", "process_vm_writev", "eventfd", "pidfd_open",
              "syscall")  # futex (and pidfd_open on old glibc) can only be reached by syscall()


def _imports(path):
    out = subprocess.run(["nm", "-D", "--undefined-only", path], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def test_native_info_names_the_profile_it_was_built_with():
    info = collectives.native_info()
    expected = os.environ.get("POOLTENSOR_EXPECT_NATIVE", "linux")
    assert info["profile"] == expected == _native.PLATFORM, (info, _native.__file__)
    assert set(info) >= {"segments", "waits", "wakeups", "peer_death", "private_memory"}


@pytest.mark.skipif(shutil.which("nm") is None, reason="no nm (binutils) here")
def test_symbols_prove_the_profile():
    """nm -D of the loaded extension: the posix build imports no Linux-only call; the linux
    build imports them (so the check itself is seen to find what it looks for)."""
    imported = _imports(_native.__file__)
    assert "mmap" in imported, imported
    found = sorted(set(LINUX_ONLY) & imported)
    if _native.PLATFORM == "posix":
        assert not found, f"the posix build imports Linux-only {found} ({_native.__file__})"
        assert {"shm_open", "shm_unlink", "pipe"} <= imported, imported
    else:
        assert {"memfd_create", "eventfd", "process_vm_readv", "syscall"} <= set(found), found


def test_waits_time_out_and_wake():
    """A wait on a word that never changes ends at its timeout (not before, not long after);
    one that is notified ends at once. Both profiles, one rank (the segment is our own)."""
    import time

    import numpy as np
    world = collectives.init()
    try:
        win = world.expose(64)
        t0 = time.monotonic()
        with pytest.raises(collectives.Timeout):
            win.wait_local(0, 1, timeout=0.3)
        took = time.monotonic() - t0
        assert 0.25 <= took < 2.0, took
        win.notify(world.rank, 0, 1)
        t0 = time.monotonic()
        win.wait_local(0, 1, timeout=5)
        assert time.monotonic() - t0 < 1.0
        assert np.frombuffer(win.buffer, np.int64)[0] == 1
    finally:
        world.close()
