"""What the native engine (collectives._native) was built with: its platform profile."""
from . import _native, env

env.check_native()      # the numbers it reads for itself, named here when wrong

_PROFILES = {
    "linux": {"segments": "memfd", "waits": "futex", "wakeups": "eventfd",
              "peer_death": "pidfd",
              "private_memory": "cross-memory attach (gets, puts); atomics served by the "
              "target's native threads"},
    "posix": {"segments": "shm_open", "waits": "condition variables (private), "
              "os_sync_wait_on_address or naps (shared)", "wakeups": "pipe",
              "peer_death": "kqueue (macOS) or kill(pid, 0)",
              "private_memory": "served by the target's native threads (gets, puts, atomics)"},
}


def segment_kind():
    """What this process's shared-memory segments are made of: 'memfd', 'tmpfs' (Linux: a
    private tmpfs mounted with huge pages, used where shared memory gets none otherwise;
    $POOLTENSOR_SEGMENTS) or 'shm_open' (posix). Decided once per process."""
    return _native.segment_kind()


def native_info():
    """The native layer's build: {'profile': 'linux' or 'posix', and what it uses for
    segments (in this process), waits, wake-ups, peer death and a peer's private memory}."""
    profile = getattr(_native, "PLATFORM", "linux")
    return {"profile": profile, **_PROFILES.get(profile, {}), "segments": segment_kind()}
