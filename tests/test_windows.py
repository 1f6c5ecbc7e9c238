"""One-sided windows on real ranks (mpiexec and our launcher, oversubscribed on 2 cores)."""
import os
import signal
import subprocess
import sys

import pytest

from conftest import SCRIPTS, check_ranks, rank_env


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_random_gets_puts_and_atomics(launcher, n):
    p = check_ranks(launcher, n, "windows_random.py", "120")
    assert p.stdout.count("windows ok") == n


@pytest.mark.parametrize("n", [2, 3])
def test_refusals_leave_target_unchanged(launcher, n):
    p = check_ranks(launcher, n, "windows_errors.py")
    assert p.stdout.count("refusals ok") == n


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
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    before = _shm_entries()
    procs = []
    for r in range(n):
        env = rank_env({"POOLTENSOR_RANK": str(r), "POOLTENSOR_WORLD_SIZE": str(n),
                        "POOLTENSOR_COORDINATOR": f"127.0.0.1:{port}"})
        procs.append(subprocess.Popen([sys.executable, str(SCRIPTS / "peer_killed.py")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=60)[0])
    finally:
        for p in procs:
            p.kill()
    assert procs[-1].returncode == -signal.SIGKILL, outs[-1]
    for r in range(n - 1):
        assert procs[r].returncode == 0, f"rank {r}:\n{outs[r]}"
        assert "PeerLost after" in outs[r], outs[r]
    leftover = _shm_entries() - before
    assert not leftover, f"left behind in /dev/shm: {leftover}"
