"""The team's single-copy allgather and allreduce (native/src/team/team.c): real ranks, results against
numpy around the size where it starts, the team's agreement when a member refuses it, and
ranks that would take different paths (tests/scripts/team_single_copy.py)."""
import importlib.util

import pytest

from conftest import check_ranks

pytestmark = pytest.mark.timeout(90)


def _cma_allowed():
    """Whether sibling processes may read each other: the linux profile (the posix one has no
    cross-memory attach) and Yama's ptrace_scope 0, or no Yama."""
    from collectives import _native
    if _native.PLATFORM != "linux":
        return False
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return f.read().strip() == "0"
    except OSError:
        return True


@pytest.mark.parametrize("launcher,n", [("launch", 2), ("mpiexec", 2), ("launch", 3)])
def test_sizes_around_the_threshold(launcher, n):
    args = ["expect"] if _cma_allowed() else []
    p = check_ranks(launcher, n, "team_single_copy.py", "sizes", *args, timeout=80)
    assert p.stdout.count("sizes ok") == n, p.stdout


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_inside_jit():
    p = check_ranks("mpiexec", 2, "team_single_copy.py", "jit", timeout=80)
    assert p.stdout.count("jit ok") == 2, p.stdout


def test_a_member_that_refuses_keeps_the_team_on_the_slots():
    p = check_ranks("launch", 2, "team_single_copy.py", "fallback", timeout=80)
    assert p.stdout.count("fallback ok") == 2, p.stdout


def test_members_on_different_paths_mismatch():
    p = check_ranks("launch", 2, "team_single_copy.py", "mismatch",
                    env={"POOLTENSOR_TIMEOUT": "20"}, timeout=80)
    assert p.stdout.count("mismatch ok") == 2, p.stdout
