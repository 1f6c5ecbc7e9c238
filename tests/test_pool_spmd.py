"""The pool in SPMD on real ranks, under mpiexec and under our launcher (oversubscribed on 2
cores): tests/scripts/pool_spmd.py runs its checks and ~100 hypothesis examples in one job."""
import pytest

from conftest import PAIRED, check_ranks

pytestmark = pytest.mark.timeout(180)

RUNS = [("launch", 1)] + PAIRED


@pytest.mark.parametrize("launcher,n", RUNS, ids=[f"{la}-{n}" for la, n in RUNS])
def test_spmd_pool(launcher, n):
    p = check_ranks(launcher, n, "pool_spmd.py", "100", timeout=150)
    assert p.stdout.count("pool spmd ok") == n, p.stdout
