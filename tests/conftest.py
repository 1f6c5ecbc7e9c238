"""Shared test helpers: run a script on N real ranks under mpiexec or under our launcher;
pools built in the test process, and the hypothesis settings of the property tests on them."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
BIN = Path(sys.executable).parent
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))      # the case modules the tests share with the scripts

SLAB = 64     # a few elements a slab: selections cross slab boundaries and members

# A plain script's members compute their part of every operation, however small, so the
# tests' small arrays take the members' path (the default leaves work under 4 MiB a member
# to the script: test_members.py pins that threshold).
os.environ.setdefault("POOLTENSOR_MEMBER_WORK_MIN", "0")

# the huge-page warning says something of this machine, not of the code under test (its own
# test turns it back on): off here and in every process the tests start
os.environ.setdefault("POOLTENSOR_THP_WARNING", "0")


def pool_fixture(*pools, **init):
    """A module-scoped `pool` fixture: a pool built in this process (a plain script as far as
    pooltensor knows) for each of `pools`, finalized afterwards. pools: member counts, or
    (id, pt.init keyword arguments). Slabs of SLAB bytes, 8 MiB a member and a cache of 8
    slabs (eviction all the time) unless `init` says otherwise.

        pool = pool_fixture(1, 3)"""
    params = [p if isinstance(p, tuple) else (f"{p}member{'s' if p > 1 else ''}", {"members": p})
              for p in pools]

    @pytest.fixture(scope="module", params=[kw for _, kw in params], ids=[i for i, _ in params])
    def pool(request):
        import pooltensor as pt
        kw = {"slab_size": SLAB, "memory": 8 << 20, "cache_bytes": 8 * SLAB, **init,
              **request.param}
        pt.finalize()
        p = pt.init(**kw)
        yield p
        pt.finalize()
    return pool


def property_settings(examples_var, default, derandomize_var):
    """hypothesis settings of property tests on pools: $examples_var examples (else
    `default`), derandomized unless $derandomize_var is not 1, no deadline (a pool operation
    may wait on member processes)."""
    return settings(max_examples=int(os.environ.get(examples_var, default)), deadline=None,
                    derandomize=os.environ.get(derandomize_var, "1") == "1",
                    suppress_health_check=list(HealthCheck))


def mpiexec():
    exe = BIN / "mpiexec"
    return str(exe) if exe.exists() else shutil.which("mpiexec")


_OPENMPI = {}


def mpiexec_cmd(n):
    """mpiexec -n N, with what Open MPI needs to run N ranks on fewer cores (and as root)."""
    exe = mpiexec()
    if exe not in _OPENMPI:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        _OPENMPI[exe] = "Open MPI" in out.stdout + out.stderr
    return [exe, "--oversubscribe", "-n", str(n)] if _OPENMPI[exe] else [exe, "-n", str(n)]


def rank_env(extra=None):
    env = dict(os.environ)
    env.setdefault("POOLTENSOR_TIMEOUT", "30")
    # Open MPI refuses to start as root unless told twice (CI runs as root)
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def run_ranks(launcher, n, script, *args, env=None, timeout=90):
    """Run tests/scripts/<script> on n ranks; returns the CompletedProcess (never hangs)."""
    path = str(SCRIPTS / script)
    if launcher == "mpiexec":
        exe = mpiexec()
        if exe is None:
            pytest.skip("mpiexec not found (pip install mpich mpi4py)")
        cmd = [*mpiexec_cmd(n), sys.executable, path, *args]
    else:
        cmd = [sys.executable, "-m", "collectives.launch", "-n", str(n), path, *args]
    return subprocess.run(cmd, env=rank_env(env), capture_output=True, text=True,
                          timeout=timeout)


def check_ranks(launcher, n, script, *args, env=None, timeout=90):
    """Run and require success; shows every rank's output on failure."""
    p = run_ranks(launcher, n, script, *args, env=env, timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def run_env_ranks(n, script, *args, env=None, timeout=60):
    """Start n ranks straight from POOLTENSOR_* variables (no launcher to stop the survivors
    when one dies); returns (return codes, outputs) once all have ended."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = []
    for r in range(n):
        e = rank_env({"POOLTENSOR_RANK": str(r), "POOLTENSOR_WORLD_SIZE": str(n),
                      "POOLTENSOR_COORDINATOR": f"127.0.0.1:{port}", **(env or {})})
        procs.append(subprocess.Popen([sys.executable, str(SCRIPTS / script), *args], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            p.kill()
    return [p.returncode for p in procs], outs


@pytest.fixture(params=["mpiexec", "launch"])
def launcher(request):
    return request.param


# (launcher, ranks) for multi-rank checks whose subject is not how ranks start (array
# operations, the pool, collectives over forced tcp): each launcher once and 2 and 3 ranks once,
# not all four pairs. How ranks start is the launcher's tests' and the collectives matrix's
# concern (test_collectives.py), and the hypothesis checks draw fresh examples every run.
PAIRED = [("launch", 3), ("mpiexec", 2)]


def launch_runs(runs):
    """Parametrize a test over (launcher, ranks) pairs, named as the launcher fixture's are
    ("launch-3"): the posix profile's -k selection in the Makefile goes by these names."""
    return pytest.mark.parametrize("launcher,n", runs, ids=[f"{la}-{n}" for la, n in runs])


PAIRED_RUNS = launch_runs(PAIRED)
