"""The ``pooltensor`` command's info, stats (once, --json, --plot, --watch under a
pseudo-terminal) and bench subcommands, each with --json parsed and its text checked, and the
progress bars: drawn on a terminal, silent off one, configurable."""
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import time

import pytest

from collectives import _native
from conftest import SCRIPTS
from servers import env as _env

CMD = [sys.executable, "-m", "pooltensor"]


def pooltensor(*args, env=None, timeout=120):
    return subprocess.run(CMD + list(args), capture_output=True, text=True, timeout=timeout,
                          env=_env({"POOLTENSOR_THP_WARNING": "0", **(env or {})}))


def on_terminal(argv, env=None, timeout=60):
    """Run argv on a pseudo-terminal (120 x 40); returns (exit status, everything written)."""
    pid, fd = pty.fork()
    if pid == 0:                                  # the child: a terminal of a real size
        import fcntl
        import termios
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        os.environ.update(_env({"POOLTENSOR_THP_WARNING": "0", **(env or {})}))
        os.execv(argv[0], argv)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 1)
        if r:
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            out += data
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


# ---- info ------------------------------------------------------------------------------------

def test_info_json_and_text(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("x" * 32)
    secret.chmod(0o644)
    e = {"POOLTENSOR_SECRET_FILE": str(secret)}
    p = pooltensor("info", "--json", env=e)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["kernels"] == _native.kernels_isa()
    assert {"shm", "tcp"} <= set(info["transports"])
    assert info["native"]["profile"] == _native.PLATFORM
    assert info["secret_file"] == {"path": str(secret), "source": "$POOLTENSOR_SECRET_FILE",
                                   "exists": True, "mode": "0644", "private": False}
    import pooltensor as pt
    assert info["version"] == pt.__version__
    shmem = info["huge_pages"]["shmem_enabled"]
    if os.path.exists("/sys/kernel/mm/transparent_hugepage/shmem_enabled"):
        text = open("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read()
        assert f"[{shmem}]" in text
    kind = info["native"]["segments"]
    assert kind in ("memfd", "tmpfs", "shm_open"), kind
    if kind == "tmpfs":                 # the private huge tmpfs stands in for the setting
        assert info["huge_pages"]["pool_memory_gets_them"] is True
    t = pooltensor("info", env=e)
    assert t.returncode == 0 and t.stderr == ""
    assert f"kernels          {_native.kernels_isa()}" in t.stdout
    assert f"segments {kind}," in t.stdout
    assert ("from a private tmpfs" in t.stdout) == (kind == "tmpfs")
    assert f"chmod 600 {secret}" in t.stdout          # the fix for a readable secret
    secret.chmod(0o600)
    assert "chmod" not in pooltensor("info", env=e).stdout


def test_help_reads_well_and_unknown_options_fail():
    p = pooltensor("--help")
    assert p.returncode == 0
    for sub in ("serve", "info", "stats", "bench"):
        assert sub in p.stdout
        h = pooltensor(sub, "--help")
        assert h.returncode == 0 and "--json" in h.stdout or sub == "serve", sub
    bad = pooltensor("info", "--bogus")
    assert bad.returncode == 2 and "unrecognized arguments: --bogus" in bad.stderr


# ---- stats -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def job():
    p = subprocess.Popen([sys.executable, str(SCRIPTS / "metrics_job.py")], text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=_env({"POOLTENSOR_THP_WARNING": "0"}))
    line = p.stdout.readline()
    assert line.startswith("port"), line
    yield f"127.0.0.1:{line.split()[1]}"
    p.stdin.close()
    assert p.wait(30) == 0


def test_stats_json_text_and_plot(job, tmp_path):
    p = pooltensor("stats", job, "--json")
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    get = [o for o in s["operations"] if o["op"] == "get" and o["transport"] == "shm"
           and o["peer"] == "1"][0]
    assert get["ops"] > 0 and get["bytes"] > 0 and get["member"] == "0"
    assert 0 < get["p50_us"] <= get["p90_us"] <= get["p99_us"] <= get["max_us"]
    assert {m["member"] for m in s["members"]} == {"0", "1"}
    assert all(m["capacity"] == 8 << 20 for m in s["members"])
    assert {(x["peer"], x["health"]) for x in s["peers"]} == {("0", "up"), ("1", "up")}
    assert 0 <= s["cache"]["0"]["hit_rate"] <= 1
    png = tmp_path / "stats.png"
    t = pooltensor("stats", job, "--plot", str(png))
    assert t.returncode == 0, t.stderr
    for text in ("members of " + job, "operations", "peers", "get", "shm", "hit rate"):
        assert text in t.stdout, text
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_stats_of_nothing_is_a_clear_error():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = pooltensor("stats", f"127.0.0.1:{port}", "--timeout", "5")
    assert p.returncode == 1
    assert p.stderr.startswith(f"pooltensor stats: cannot read http://127.0.0.1:{port}/metrics")


def test_watch_json_prints_one_object_per_refresh(job):
    p = pooltensor("stats", job, "--watch", "--json", "--interval", "0.3", "--count", "3")
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert len(lines) == 3
    assert all("bandwidth" in o for o in lines[-1]["operations"])


def test_watch_refreshes_in_place_on_a_terminal(job):
    code, out = on_terminal(CMD + ["stats", job, "--watch", "--interval", "0.3", "--count",
                                   "3"])
    assert code == 0, out
    assert out.count("members of " + job) >= 4       # the first view and 3 refreshes
    assert "\x1b[2K" in out and "\x1b[1A" in out     # each erased and redrawn in place
    assert "Ctrl-C stops" in out


# ---- bench -----------------------------------------------------------------------------------

def test_bench_runs_with_json_and_png(tmp_path):
    p = pooltensor("bench", "stats", "--quick", "--out", str(tmp_path), "--json", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads(p.stdout)
    r = s["benchmarks"]["stats"]
    assert r["status"] == "ok"
    assert sorted(os.path.basename(f) for f in r["results"]) == \
        ["stats-quick.json", "stats-quick.png", "stats-quick.txt"]
    data = json.loads((tmp_path / "stats-quick.json").read_text())
    assert "Window.get" in data["ratio_on_off"]
    assert json.loads((tmp_path / "bench.json").read_text())["benchmarks"]["stats"] == r
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert p.stderr == ""                                # no bar off a terminal
    lst = pooltensor("bench", "--list")
    assert lst.returncode == 0 and "rma" in lst.stdout and "mpiexec x2" in lst.stdout
    bad = pooltensor("bench", "nosuch")
    assert bad.returncode == 2 and "unknown benchmark(s) nosuch" in bad.stderr


def test_bench_shows_a_progress_bar_on_a_terminal(tmp_path):
    code, out = on_terminal(CMD + ["bench", "stats", "--quick", "--out", str(tmp_path)],
                            timeout=300)
    assert code == 0, out
    assert "bench:" in out and "1/1" in out and "stats" in out


# ---- progress bars in the library ------------------------------------------------------------

SMALL = {"POOLTENSOR_PROGRESS_MIN": str(1 << 20)}


def test_progress_bars_on_a_terminal():
    code, out = on_terminal([sys.executable, str(SCRIPTS / "progress_case.py")], env=SMALL)
    assert code == 0, out
    for desc in ("fill:", "to_numpy:", "write:"):
        assert desc in out, desc
    assert "0.00/22.9M" in out and "%|" in out      # tqdm's bar, counting bytes
    code, out = on_terminal([sys.executable, str(SCRIPTS / "progress_case.py")],
                            env={**SMALL, "POOLTENSOR_PROGRESS": "never"})
    assert code == 0 and "ok" in out and "%|" not in out


def test_progress_bars_are_silent_off_a_terminal_unless_asked():
    p = subprocess.run([sys.executable, str(SCRIPTS / "progress_case.py")], capture_output=True,
                       text=True, timeout=120, env=_env({**SMALL,
                                                             "POOLTENSOR_THP_WARNING": "0"}))
    assert p.returncode == 0 and p.stdout == "ok\n" and p.stderr == ""
    p = subprocess.run([sys.executable, str(SCRIPTS / "progress_case.py")], capture_output=True,
                       text=True, timeout=120,
                       env=_env({**SMALL, "POOLTENSOR_THP_WARNING": "0",
                                     "POOLTENSOR_PROGRESS": "always"}))
    assert p.returncode == 0 and "to_numpy:" in p.stderr
