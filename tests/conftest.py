"""Shared test helpers: run a script on N real ranks under mpiexec or under our launcher."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
BIN = Path(sys.executable).parent


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
