"""The poll-then-block policy: waits poll for the set time while a core is free, and only a
few microseconds while more threads are runnable than the machine has CPUs (a poller would
hold a core that the thread it waits for needs; across scheduling groups a yield does not hand
it over)."""
import os
import subprocess
import sys
import time

import pytest

from collectives import _native

pytestmark = pytest.mark.timeout(60)

CROWDED_US = 5.0


@pytest.fixture
def spin_restored():
    before = _native.spin()
    yield
    _native.set_spin(before if before > CROWDED_US else 20.0)


def test_short_spin_is_kept_as_set(spin_restored):
    _native.set_spin(3.0)
    assert _native.spin() == pytest.approx(3.0)
    _native.set_spin(0)
    assert _native.spin() == 0


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="reads /proc/loadavg (Linux)")
def test_spin_shortens_while_the_machine_is_crowded(spin_restored):
    _native.set_spin(1000.0)
    n = 2 * (os.cpu_count() or 1) + 2
    busy = [subprocess.Popen([sys.executable, "-c", "import os\nos.nice(19)\nwhile True: pass"])
            for _ in range(n)]
    try:
        seen, deadline = [], time.monotonic() + 10
        while time.monotonic() < deadline:
            seen.append(_native.spin())
            if seen[-1] <= CROWDED_US:
                break
            time.sleep(0.01)
        assert seen[-1] == pytest.approx(CROWDED_US), (
            f"{n} busy processes on {os.cpu_count()} CPUs, spin stayed {sorted(set(seen))} us")
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait(10)
    # never above what was set
    _native.set_spin(2.0)
    assert _native.spin() <= 2.0
