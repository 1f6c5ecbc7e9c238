"""Where segments come from on Linux: a memfd, or a nameless file of a private tmpfs mounted
with huge pages (where shmem huge pages are off, so that pool memory gets 2 MiB pages as
numpy's does). Checked against the kernel's own account: /proc/<pid>/smaps of the mapping,
/proc/meminfo, peers opening /proc/<pid>/fd/<fd> and mmap-ing it with Python's mmap."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from collectives import _native
from pooltensor.pool import mapping

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(_native.PLATFORM != "linux", reason="the linux profile's")]

MiB = 1 << 20

# A child that makes a segment (kind from $POOLTENSOR_SEGMENTS), fills it, and prints what
# the kernel says of its mapping.
SEGMENT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from collectives import _native
    from pooltensor.cache import populate
    n = int(sys.argv[1])
    seg = _native.Segment(n)
    a = np.frombuffer(memoryview(seg), np.uint8)
    populate.populate(a, 0, n, write=True)
    a[:] = np.arange(n, dtype=np.uint64).astype(np.uint8)
    info = {}
    inside = False
    for line in open("/proc/self/smaps"):
        f = line.split()
        if "-" in f[0] and not f[0].endswith(":"):
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            inside = lo <= seg.address < hi
        elif inside and f[0].endswith(":") and len(f) > 1 and f[1].isdigit():
            info[f[0][:-1]] = int(f[1]) * 1024
    print(json.dumps({"kind": _native.segment_kind(), "pid": os.getpid(), "fd": seg.fd,
                      "smaps": info, "link": os.readlink(f"/proc/self/fd/{seg.fd}")}),
          flush=True)
    if len(sys.argv) > 2:
        sys.stdin.readline()
""")


def _run(kind, n=8 * MiB, env=None, wait=False):
    e = dict(os.environ, **(env or {}))
    if kind is None:
        e.pop("POOLTENSOR_SEGMENTS", None)
    else:
        e["POOLTENSOR_SEGMENTS"] = kind
    args = [sys.executable, "-c", SEGMENT, str(n)] + (["wait"] if wait else [])
    return subprocess.Popen(args, env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(p):
    import json
    line = p.stdout.readline()
    if not line:
        out, err = p.communicate(timeout=30)
        raise AssertionError(err)
    return json.loads(line)


def _done(p):
    out, err = p.communicate("\n", timeout=30)
    assert p.returncode == 0, err


@pytest.fixture(scope="module")
def tmpfs_works():
    """Whether this machine lets a process have the huge tmpfs (user namespaces on)."""
    p = _run("tmpfs", n=MiB)
    got = _result(p)
    _done(p)
    if got["kind"] != "tmpfs":
        pytest.skip("no user namespaces here: segments are memfds")
    return True


def test_kind_follows_the_setting_and_the_environment(tmpfs_works):
    p = _run("memfd")
    got = _result(p)
    _done(p)
    assert got["kind"] == "memfd" and got["link"].startswith("/memfd:pooltensor"), got
    p = _run(None)
    got = _result(p)
    _done(p)
    off = mapping.thp_setting() == "never"
    assert got["kind"] == ("tmpfs" if off else "memfd"), (got, mapping.thp_setting())


def test_tmpfs_segment_gets_huge_pages_and_peers_map_the_same_bytes(tmpfs_works):
    n = 16 * MiB
    p = _run("tmpfs", n=n, wait=True)
    try:
        got = _result(p)
        assert got["kind"] == "tmpfs" and got["link"].endswith("(deleted)"), got
        sm = got["smaps"]
        assert sm["Rss"] == n, sm
        # 2 MiB pages (the kernel may fall short where free memory is fragmented: not none)
        assert sm.get("ShmemPmdMapped", 0) + sm.get("FilePmdMapped", 0) >= 2 * MiB, sm
        # a peer opens it as peers do (/proc/<pid>/fd/<fd>), maps it, sees the same bytes
        import mmap

        import numpy as np
        fd = os.open(f"/proc/{got['pid']}/fd/{got['fd']}", os.O_RDWR)
        try:
            m = mmap.mmap(fd, n)
            want = np.arange(n, dtype=np.uint64).astype(np.uint8)
            assert np.array_equal(np.frombuffer(m, np.uint8), want)
            m[5] = 77                                            # and writes go both ways
            m.close()
        finally:
            os.close(fd)
    finally:
        _done(p)
    if mapping.thp_setting() == "never":              # the contrast: a memfd gets none
        p = _run("memfd", n=n)
        sm = _result(p)["smaps"]
        _done(p)
        assert sm.get("ShmemPmdMapped", 0) == 0 and sm["Rss"] == n, sm


def _meminfo(key):
    for line in open("/proc/meminfo"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def test_nothing_is_left_after_sigkill(tmpfs_works):
    """The mount has no mount point and its files no names: a killed process leaves no
    mount, no helper process and no memory behind."""
    n = 64 * MiB
    mounts = open("/proc/self/mountinfo").read()
    before = _meminfo("ShmemHugePages")
    p = _run("tmpfs", n=n, wait=True)
    got = _result(p)
    assert got["kind"] == "tmpfs"
    held = _meminfo("ShmemHugePages")
    huge = got["smaps"].get("ShmemPmdMapped", 0)
    assert held - before >= huge // 2, (before, held, huge)
    # the helper that made the mount has gone: no child of the segment's process remains
    kids = [d for d in os.listdir("/proc") if d.isdigit() and _ppid(d) == got["pid"]]
    assert not kids, kids
    assert open("/proc/self/mountinfo").read() == mounts   # nothing mounted where we are
    os.kill(got["pid"], signal.SIGKILL)
    p.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _meminfo("ShmemHugePages") > held - huge // 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _meminfo("ShmemHugePages") <= held - huge // 2, (before, held, huge)


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


THREADED = textwrap.dedent("""
    import os, signal, sys, threading, time
    import numpy as np
    stop = threading.Event()
    lock = threading.Lock()
    def busy():
        while not stop.is_set():
            with lock:
                np.ones(1 << 16).sum()
    ts = [threading.Thread(target=busy) for _ in range(8)]
    for t in ts:
        t.start()
    signal.signal(signal.SIGUSR1, lambda *a: None)
    def poke():
        while not stop.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.001)
    threading.Thread(target=poke).start()
    from collectives import _native
    kind = _native.segment_kind()          # the first call makes the tmpfs
    segs = [_native.Segment(4 << 20) for _ in range(4)]
    stop.set()
    print(kind, flush=True)
""")


def test_made_in_a_threaded_process_under_signals(tmpfs_works):
    """The helper is cloned while eight threads hold and take a lock and signals arrive: it
    makes system calls only, so nothing deadlocks, and the signals reach only us."""
    env = dict(os.environ, POOLTENSOR_SEGMENTS="tmpfs")
    p = subprocess.run([sys.executable, "-c", THREADED], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["tmpfs"]


@pytest.mark.skipif(subprocess.run(["unshare", "-Ur", "true"], capture_output=True).returncode
                    if os.path.exists("/usr/bin/unshare") else True,
                    reason="no unshare(1) or no user namespaces")
def test_falls_back_to_memfd_where_user_namespaces_are_off():
    """In a user namespace whose own limit of namespaces is 0 (a sysctl private to it) the
    helper cannot make its namespace: segments are memfds, silently, and the warning (the
    machine's shmem huge pages being off) comes once."""
    code = ("import warnings, pooltensor as pt\n"
            "from collectives import _native\n"
            "warnings.simplefilter('always')\n"
            "pt.init(members=2, memory=1 << 22)\n"
            "print(_native.segment_kind())\n"
            "pt.finalize()\n")
    env = dict(os.environ, POOLTENSOR_SEGMENTS="tmpfs", POOLTENSOR_THP_WARNING="1",
               POOLTENSOR_TIMEOUT="30")
    p = subprocess.run(["unshare", "-Ur", "sh", "-c",
                        'echo 0 > /proc/sys/user/max_user_namespaces && exec "$0" -c "$1"',
                        sys.executable, code], env=env, capture_output=True, text=True,
                       timeout=90)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["memfd"], p.stdout
    off = mapping.thp_setting() not in mapping.THP_ON + (None,)
    assert p.stderr.count("HugePageWarning") == (1 if off else 0), p.stderr


def test_making_the_tmpfs_leaves_our_memory_alone(tmpfs_works):
    """The helper shares our memory instead of copying it (a fork would make every page of
    ours copy-on-write: the next write to each would fault), and leaves one descriptor."""
    code = textwrap.dedent("""
        import os, resource
        import numpy as np
        a = np.ones(64 << 20, np.float32)            # 256 MiB, touched
        fds = len(os.listdir("/proc/self/fd"))
        from collectives import _native
        kind = _native.segment_kind()
        left = len(os.listdir("/proc/self/fd")) - fds
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a += 1
        print(kind, left, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    """)
    env = dict(os.environ, POOLTENSOR_SEGMENTS="tmpfs")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    kind, left, faults = p.stdout.split()
    assert kind == "tmpfs" and int(left) == 1, p.stdout
    assert int(faults) < 16, p.stdout        # hundreds after a fork (measured: 742)
