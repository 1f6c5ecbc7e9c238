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


def test_peer_seen_lost_first_is_named_when_two_are_gone_at_once(tmp_path):
    """A rank that left because it saw a peer die is not named as the first lost, even when
    a third rank (stopped meanwhile) finds both gone in the same look."""
    import socket
    import time
    from conftest import SCRIPTS, rank_env
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    go, procs, logs = tmp_path / "go", [], []
    for r in range(3):
        logs.append(open(tmp_path / f"rank{r}.log", "w+"))
        e = rank_env({"POOLTENSOR_RANK": str(r), "POOLTENSOR_WORLD_SIZE": "3",
                      "POOLTENSOR_COORDINATOR": f"127.0.0.1:{port}"})
        procs.append(subprocess.Popen([sys.executable, str(SCRIPTS / "peer_order.py"), str(go)],
                                      env=e, stdout=logs[r], stderr=subprocess.STDOUT))
    read = lambda r: (tmp_path / f"rank{r}.log").read_text()
    try:
        deadline = time.monotonic() + 60
        while not all("ready" in read(r) for r in range(3)):
            assert time.monotonic() < deadline, [read(r) for r in range(3)]
            assert all(p.poll() is None for p in procs), [read(r) for r in range(3)]
            time.sleep(0.05)
        os.kill(procs[1].pid, signal.SIGSTOP)
        time.sleep(0.3)                          # rank 1's monitor is surely stopped
        procs[2].kill()
        procs[2].wait(10)
        assert procs[0].wait(30) == 0, read(0)
        assert "first lost 2" in read(0), read(0)
        go.touch()
        os.kill(procs[1].pid, signal.SIGCONT)
        assert procs[1].wait(30) == 0, read(1)
        assert "first lost 2" in read(1) and "(rank 2" in read(1), read(1)
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait(10)
        for f in logs:
            f.close()


@pytest.mark.skipif(_native.PLATFORM != "posix", reason="linux: memfd segments have no names")
@pytest.mark.parametrize("n", [2, 3])
def test_shm_names_go_once_mapped_and_are_reaped_after_sigkill(n):
    codes, outs = run_env_ranks(n, "shm_names.py")
    assert codes == [-signal.SIGKILL] * n, outs
    assert all("names ok" in o for o in outs), outs
    pids = outs[0].split("names ok ")[1].split()
    left = lambda: [e for e in _shm_entries() if any(e.startswith(f"pt.{p}.") for p in pids)]
    # each rank's untouched window, less those a rank killed later reaped when it saw the
    # earlier ones dead: the last one's at least
    assert 1 <= len(left()) <= n, left()
    subprocess.run([sys.executable, "-c", "import collectives; collectives.init().close()"],
                   check=True, timeout=60, env={**os.environ, "POOLTENSOR_TIMEOUT": "20"})
    assert left() == [], left()


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
