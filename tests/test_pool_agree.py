"""Collective pool operations are checked across ranks (DESIGN rule 7): real SPMD runs in which
the ranks disagree on shapes, dtypes, placements, access, creation kinds, views in elementwise
operations, reductions and frees; every rank must raise CollectiveMismatch naming what differs
and which ranks, nothing may diverge, and the pool stays usable (tests/scripts/pool_agree.py)."""
import pytest

from conftest import check_ranks

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("launcher,n", [("mpiexec", 2), ("launch", 3)])
def test_ranks_that_disagree_all_raise(launcher, n):
    p = check_ranks(launcher, n, "pool_agree.py", timeout=220)
    assert p.stdout.count("pool agree ok") == n, p.stdout
