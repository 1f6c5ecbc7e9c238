"""bootstrap() under each way a job starts: mpiexec, environment variables, and alone."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from collectives.errors import BootstrapError
from collectives.rendezvous import HashStore, TCPStore, bootstrap, host_identity
from collectives.rendezvous.bootstrap import mpi_launcher_variable, parse_address

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "boot_allgather.py")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
VARS = ("POOLTENSOR_", "PMI_", "PMIX_", "OMPI_", "MPI_LOCAL", "HYDRA_")


def has_mpi():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return os.path.exists(MPIEXEC) or shutil.which("mpiexec") is not None


needs_mpi = pytest.mark.skipif(not has_mpi(), reason="mpi4py or mpiexec not installed")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(VARS):
            monkeypatch.delenv(k)


def child_env():
    e = {k: v for k, v in os.environ.items() if not k.startswith(VARS)}
    e["PYTHONPATH"] = ROOT
    return e


def mpiexec(tmp_path, n, *args):
    """Run the script under mpiexec; return its rows, read from one file per rank."""
    exe = MPIEXEC if os.path.exists(MPIEXEC) else "mpiexec"
    p = subprocess.run([exe, "-n", str(n), sys.executable, SCRIPT, "--out", str(tmp_path), *args],
                       env=child_env(), capture_output=True, timeout=40)
    assert p.returncode == 0, p.stderr.decode()
    rows = [json.loads(f.read_text()) for f in tmp_path.glob("*.json")]
    return sorted(rows, key=lambda row: row["rank"])


def results(stdout):
    rows = [json.loads(line[line.index("{"):]) for line in stdout.decode().splitlines()
            if "{" in line]
    return sorted(rows, key=lambda row: row["rank"])


def check_world(rows, size, how):
    assert [row["rank"] for row in rows] == list(range(size))
    for row in rows:
        assert (row["size"], row["how"], row["ranks"]) == (size, how, list(range(size)))


def test_single():
    b = bootstrap(timeout=5)
    assert (b.rank, b.size, b.how, b.mpi_comm) == (0, 1, "single", None)
    assert isinstance(b.store, HashStore)
    layout = b.layout()
    assert (layout.local_rank, layout.local_size, layout.host) == (0, 1, host_identity())
    b.close()


@needs_mpi
@pytest.mark.parametrize("n", [1, 2, 3])
def test_under_mpiexec(tmp_path, n):
    rows = mpiexec(tmp_path, n)
    check_world(rows, n, "mpi")
    assert all(row["mpi"] and row["local_size"] == n for row in rows)
    if n > 1:
        assert rows[0]["bind"] == "127.0.0.1"  # one host: the store stays on loopback


@needs_mpi
def test_under_mpiexec_many_hosts_binds_all_interfaces(tmp_path):
    rows = mpiexec(tmp_path, 3, "--fake-hosts", "2")
    check_world(rows, 3, "mpi")
    assert rows[0]["bind"] == "0.0.0.0"
    assert [(row["local_rank"], row["local_size"]) for row in rows] == [(0, 2), (0, 1), (1, 2)]


def test_under_launcher():
    p = subprocess.run([sys.executable, "-m", "collectives.launch", "-n", "3", SCRIPT,
                        "--fake-hosts", "3"], cwd=ROOT, env=child_env(), capture_output=True,
                       timeout=40)
    assert p.returncode == 0, p.stderr.decode()
    rows = results(p.stdout)
    check_world(rows, 3, "env")
    assert all(row["local_size"] == 1 and not row["mpi"] for row in rows)


def test_launcher_ignores_outer_mpi_variables():
    e = child_env()
    e.update(PMI_RANK="0", PMI_SIZE="4")
    p = subprocess.run([sys.executable, "-m", "collectives.launch", "-n", "2", SCRIPT], cwd=ROOT,
                       env=e, capture_output=True, timeout=40)
    assert p.returncode == 0, p.stderr.decode()
    check_world(results(p.stdout), 2, "env")


def test_env_world_of_one_needs_no_coordinator(monkeypatch):
    monkeypatch.setenv("POOLTENSOR_RANK", "0")
    monkeypatch.setenv("POOLTENSOR_WORLD_SIZE", "1")
    b = bootstrap(timeout=5)
    assert (b.rank, b.size, b.how) == (0, 1, "env")
    b.close()


def test_env_rank0_serves_on_coordinator(monkeypatch):
    monkeypatch.setenv("POOLTENSOR_RANK", "0")
    monkeypatch.setenv("POOLTENSOR_WORLD_SIZE", "2")
    monkeypatch.setenv("POOLTENSOR_COORDINATOR", "127.0.0.1:0")
    with pytest.raises(BootstrapError, match="fixed port"):
        bootstrap(timeout=5)
    server = TCPStore("127.0.0.1", 0, is_server=True)
    port = server.port
    server.close()
    monkeypatch.setenv("POOLTENSOR_COORDINATOR", f"127.0.0.1:{port}")
    b = bootstrap(timeout=5)
    assert b.store.server is not None and b.store.port == port
    other = TCPStore("127.0.0.1", port, timeout=5)
    other.set("bootstrap/left/1", b"")
    b.close(timeout=2)


def serve_as_rank0(monkeypatch):
    probe = TCPStore("127.0.0.1", 0, is_server=True)  # finds a free port
    probe.close()
    monkeypatch.setenv("POOLTENSOR_RANK", "0")
    monkeypatch.setenv("POOLTENSOR_WORLD_SIZE", "2")
    monkeypatch.setenv("POOLTENSOR_COORDINATOR", f"127.0.0.1:{probe.port}")
    return bootstrap(timeout=5), probe.port


def test_rank0_close_does_not_wait_for_a_dead_rank(monkeypatch, recwarn):
    b, port = serve_as_rank0(monkeypatch)
    TCPStore("127.0.0.1", port, timeout=5).close()  # rank 1 connects, then vanishes
    t = time.monotonic()
    b.close(timeout=20)
    assert time.monotonic() - t < 3 and not recwarn.list


def test_rank0_close_warns_about_a_hung_rank(monkeypatch):
    b, port = serve_as_rank0(monkeypatch)
    hung = TCPStore("127.0.0.1", port, timeout=5)
    with pytest.warns(RuntimeWarning, match=r"rank\(s\) 1 had not left the rendezvous after 0.3 s"):
        b.close(timeout=0.3)
    hung.close()


@pytest.mark.parametrize("values, message", [
    ({"POOLTENSOR_RANK": "0"}, "POOLTENSOR_WORLD_SIZE is not"),
    ({"POOLTENSOR_WORLD_SIZE": "2"}, "POOLTENSOR_RANK is not"),
    ({"POOLTENSOR_COORDINATOR": "h:1"}, "POOLTENSOR_RANK and POOLTENSOR_WORLD_SIZE"),
    ({"POOLTENSOR_RANK": "x", "POOLTENSOR_WORLD_SIZE": "2"}, "must be an integer"),
    ({"POOLTENSOR_RANK": "2", "POOLTENSOR_WORLD_SIZE": "2"}, "outside 0..1"),
    ({"POOLTENSOR_RANK": "-1", "POOLTENSOR_WORLD_SIZE": "2"}, "outside 0..1"),
    ({"POOLTENSOR_RANK": "0", "POOLTENSOR_WORLD_SIZE": "0"}, ">= 1"),
    ({"POOLTENSOR_RANK": "1", "POOLTENSOR_WORLD_SIZE": "2"}, "POOLTENSOR_COORDINATOR=host:port"),
    ({"POOLTENSOR_RANK": "1", "POOLTENSOR_WORLD_SIZE": "2",
      "POOLTENSOR_COORDINATOR": "nohost"}, "must be host:port"),
    ({"POOLTENSOR_RANK": "1", "POOLTENSOR_WORLD_SIZE": "2",
      "POOLTENSOR_COORDINATOR": "h:99999"}, "must be host:port"),
])
def test_env_errors(monkeypatch, values, message):
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(BootstrapError, match=message):
        bootstrap(timeout=1)


def test_env_rank_without_server_fails_naming_address(monkeypatch):
    server = TCPStore("127.0.0.1", 0, is_server=True)
    port = server.port
    server.close()
    monkeypatch.setenv("POOLTENSOR_RANK", "1")
    monkeypatch.setenv("POOLTENSOR_WORLD_SIZE", "2")
    monkeypatch.setenv("POOLTENSOR_COORDINATOR", f"127.0.0.1:{port}")
    with pytest.raises(BootstrapError, match=f"127.0.0.1:{port}"):
        bootstrap(timeout=0.3)


def test_mpi_detected_without_mpi4py(monkeypatch):
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(BootstrapError, match="mpi4py is not installed"):
        bootstrap(timeout=1)


def test_mpi_launcher_variables():
    assert mpi_launcher_variable({}) is None
    assert mpi_launcher_variable({"PMI_RANK": "0"}) is None  # PMI_SIZE missing: not enough
    assert mpi_launcher_variable({"PMI_RANK": "0", "PMI_SIZE": "2"}) == "PMI_RANK"
    assert mpi_launcher_variable({"OMPI_COMM_WORLD_RANK": "1",
                                  "OMPI_COMM_WORLD_SIZE": "2"}) == "OMPI_COMM_WORLD_RANK"
    assert mpi_launcher_variable({"PMIX_RANK": "3"}) == "PMIX_RANK"
    assert mpi_launcher_variable({"MPI_LOCALRANKID": "0"}) == "MPI_LOCALRANKID"


def test_parse_address():
    assert parse_address("node1:29500") == ("node1", 29500)
    assert parse_address("[::1]:80") == ("::1", 80)
    for bad in ("", ":80", "host:", "host:-1", "host:port"):
        with pytest.raises(BootstrapError):
            parse_address(bad)


def test_host_identity(monkeypatch):
    ident = host_identity()
    assert ident.startswith(os.uname().nodename)
    monkeypatch.setenv("POOLTENSOR_HOST", "pretend")
    assert host_identity() == "pretend"
