"""The pool in SPMD on real ranks, under mpiexec and under our launcher (oversubscribed on 2
cores): tests/scripts/pool_spmd.py runs its checks and ~100 hypothesis examples in one job."""
import pytest

from conftest import PAIRED, check_ranks, launch_runs

pytestmark = pytest.mark.timeout(180)


@launch_runs([("launch", 1)] + PAIRED)
def test_spmd_pool(launcher, n):
    p = check_ranks(launcher, n, "pool_spmd.py", "100", timeout=150)
    assert p.stdout.count("pool spmd ok") == n, p.stdout
