"""The local launcher: prefixed output, exit codes, and no rank left running after a failure."""
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANK = os.path.join(ROOT, "tests", "scripts", "rank_behaviour.py")


def env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("POOLTENSOR_", "PMI_"))}
    e["PYTHONPATH"] = ROOT
    e.update(extra)
    return e


def launch(*args, timeout=30, **extra):
    return subprocess.run([sys.executable, "-m", "collectives.launch", *args], cwd=ROOT,
                          env=env(**extra), capture_output=True, timeout=timeout)


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_output_is_prefixed_per_stream():
    p = launch("-n", "3", RANK, "talk")
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    for r in range(3):
        assert f"[{r}] out line of {r}".encode() in out
        assert f"[{r}] err line of {r}".encode() in p.stderr.splitlines()
        assert f"[{r}] bin ".encode() + b"\xff\xfe\x00 end" in out
        assert f"[{r}] no newline".encode() in out
    assert all(line[:1] == b"[" for line in out)
    assert len(out) == 9 and p.stdout.endswith(b"\n")


def test_rank_environment_and_args_pass_through():
    p = launch("-n", "2", "--env", "EXTRA=yes", RANK, "env", "--flag", "-n", "9", PMI_RANK="7")
    assert p.returncode == 0, p.stderr
    lines = sorted(p.stdout.decode().splitlines())
    port = lines[0].split()[5].rsplit(":", 1)[1]
    assert lines[0] == f"[0] 0 2 0 2 127.0.0.1:{port} yes - ['--flag', '-n', '9']"
    assert lines[1] == f"[1] 1 2 1 2 127.0.0.1:{port} yes - ['--flag', '-n', '9']"


def test_module_form(tmp_path):
    (tmp_path / "hello_mod.py").write_text(
        "import os, sys\nprint('mod', os.environ['POOLTENSOR_RANK'], sys.argv[1:])\n")
    p = launch("-n", "2", "--env", f"PYTHONPATH={tmp_path}", "-m", "hello_mod", "a", "--b")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.decode().splitlines()) == [
        "[0] mod 0 ['a', '--b']", "[1] mod 1 ['a', '--b']"]


def test_exit_code_propagates_and_others_are_stopped_fast():
    t = time.monotonic()
    p = launch("-n", "3", RANK, "exit", "1", "7")
    assert time.monotonic() - t < 10
    assert p.returncode == 7
    assert b"rank 1 exited with code 7" in p.stderr
    pids = [int(line.split()[2]) for line in p.stdout.splitlines() if b"sleeping" in line]
    assert len(pids) == 2 and all(gone(pid) for pid in pids)


def test_stubborn_rank_and_its_children_are_killed():
    t = time.monotonic()
    p = launch("-n", "2", RANK, "stubborn")
    assert time.monotonic() - t < 15
    assert p.returncode == 1
    pids = [int(x) for line in p.stdout.splitlines() if b"pids" in line for x in line.split()[2:]]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # the grandchild is reaped by init, a moment after SIGKILL
    assert all(gone(pid) for pid in pids)


def test_killed_rank_gives_128_plus_signal():
    p = launch("-n", "2", RANK, "kill")
    assert p.returncode == 128 + signal.SIGKILL
    assert b"killed by signal 9" in p.stderr


def test_grace_lets_others_finish():
    p = launch("-n", "2", "--grace", "5", RANK, "slowok")
    assert p.returncode == 5
    assert b"[0] finished" in p.stdout


def test_timeout_stops_everything():
    t = time.monotonic()
    p = launch("-n", "2", "--timeout", "1", RANK, "sleep")
    assert time.monotonic() - t < 10
    assert p.returncode == 124
    assert b"timeout" in p.stderr


def _stopped_run(*opts, bound):
    t = time.monotonic()
    p = launch("-n", "3", *opts, RANK, "selfstop", "1", timeout=bound + 20)
    took = time.monotonic() - t
    pids = [int(line.split()[2]) for line in p.stdout.splitlines() if b" pid " in line]
    assert p.returncode == 128 + signal.SIGSTOP, (p.returncode, p.stderr)
    assert b"rank 1 stopped by a signal" in p.stderr, p.stderr
    assert len(pids) == 3 and all(gone(pid) for pid in pids)
    return took


def test_stopped_rank_with_no_one_left_to_continue_it_is_named_and_stopped():
    """Rank 1 stops itself (SIGSTOP), the others exit 0: mpiexec (hydra) waits for it forever,
    even through SIGTERM; the launcher names it after --stopped seconds and fails."""
    took = _stopped_run("--stopped", "1", bound=1)
    assert took < 1 + 8, f"the launcher took {took:.1f} s"


def test_stopped_rank_is_caught_by_default():
    """With no option the launcher watches for stopped ranks (STOPPED s), and says so in its
    help; the watch itself is the test above (a run of STOPPED s would only wait longer)."""
    from collectives.launch import STOPPED, parse_args
    args = parse_args(["-n", "3", RANK, "selfstop", "1"])
    assert args.stopped == STOPPED and 0 < STOPPED <= 60 and args.command[0] == RANK
    assert f"default {STOPPED:g}".encode() in launch("--help").stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_stops_ranks(sig):
    proc = subprocess.Popen([sys.executable, "-m", "collectives.launch", "-n", "2", RANK, "sleep"],
                            cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pids = [int(proc.stdout.readline().split()[2]) for _ in range(2)]
    proc.send_signal(sig)
    proc.communicate(timeout=15)
    assert proc.returncode == 128 + sig
    assert all(gone(pid) for pid in pids)


@pytest.mark.parametrize("args, message", [
    (["-n", "2", "--bogus", RANK], b"unrecognized arguments: --bogus"),
    (["-n", "2"], b"a script or -m module"),
    (["-n", "0", RANK], b"-n must be >= 1"),
    (["-n", "x", RANK], b"invalid int value"),
    (["--env", "NOEQUALS", "-n", "1", RANK], b"K=V"),
    ([RANK], b"required: -n"),
    (["-n", "2", "--stopped", "0", RANK], b"--stopped must be > 0"),
])
def test_bad_command_lines(args, message):
    p = launch(*args)
    assert p.returncode == 2
    assert message in p.stderr
