"""One-sided windows on real ranks (mpiexec and our launcher, oversubscribed on 2 cores)."""
import os
import signal
import subprocess
import sys

import pytest

from collectives import _native
from conftest import check_ranks, run_env_ranks


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_random_gets_puts_and_atomics(launcher, n):
    p = check_ranks(launcher, n, "windows_random.py", "120")
    assert p.stdout.count("windows ok") == n


@pytest.mark.parametrize("n", [2, 3])
def test_refusals_leave_target_unchanged(launcher, n):
    p = check_ranks(launcher, n, "windows_errors.py")
    assert p.stdout.count("refusals ok") == n


@pytest.mark.parametrize("n", [2, 3])
def test_atomics_on_user_memory_match_mpi(n):
    """fetch_add / compare_swap / get / put on windows over numpy arrays (outside our segments:
    served by the target's native threads) give what MPI.Win gives on the same sequence."""
    p = check_ranks("mpiexec", n, "windows_user_atomics.py", "60", "200")
    assert p.stdout.count("user atomics ok") == n


# other MPI jobs on the machine (not ours: these ranks run without MPI) come and go meanwhile
FOREIGN = ("mpich_", "vader", "ompi", "psm", "sem.mpich", "cma")


def _shm_entries():
    try:
        return {e for e in os.listdir("/dev/shm") if not e.startswith(FOREIGN)}
    except FileNotFoundError:
        return set()


@pytest.mark.parametrize("n", [2, 3])
def test_sigkilled_rank_gives_peer_lost_and_leaves_nothing(n, tmp_path):
    """Ranks started straight from POOLTENSOR_* variables (no launcher to stop them early)."""
    before = _shm_entries()
    codes, outs = run_env_ranks(n, "peer_killed.py")
    assert codes[-1] == -signal.SIGKILL, outs[-1]
    for r in range(n - 1):
        assert codes[r] == 0, f"rank {r}:\n{outs[r]}"
        assert "PeerLost after" in outs[r], outs[r]
    if _native.PLATFORM == "posix":
        # shm_open names outlive a process that exits without closing (the survivors leave by
        # os._exit, the victim by SIGKILL): the next context made on the machine reaps them
        assert any(e.startswith("pt.") for e in _shm_entries() - before)
        subprocess.run([sys.executable, "-c", "import collectives; collectives.init().close()"],
                       check=True, timeout=60, env={**os.environ, "POOLTENSOR_TIMEOUT": "20"})
    leftover = _shm_entries() - before
    assert not leftover, f"left behind in /dev/shm: {leftover}"
