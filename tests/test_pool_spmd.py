"""The pool in SPMD on real ranks, under mpiexec and under our launcher (oversubscribed on 2
cores): tests/scripts/pool_spmd.py runs its checks and ~100 hypothesis examples in one job."""
import pytest

from conftest import check_ranks

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_spmd_pool(launcher, n):
    if launcher == "mpiexec" and n == 1:
        pytest.skip("one rank: the launcher case covers it")
    p = check_ranks(launcher, n, "pool_spmd.py", "100", timeout=150)
    assert p.stdout.count("pool spmd ok") == n, p.stdout
