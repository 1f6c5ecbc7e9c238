"""``pooltensor doctor``'s general checks (pooltensor/commands/checks.py), each passing and
failing for real: shared-memory huge pages (the machine's own setting, and set states in a
copy of the sysfs folder), the secret file (a good one; world-readable, missing, short, in a
folder others can write: each a fail or warn whose fix, applied, makes it pass), the ports of
a running memory server and of its metrics endpoint (and a closed port, a wrong secret), and
the transport of each peer pair of a running 2-rank job, read from its ranks' endpoints."""
import json
import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import check_ranks
from servers import ServerProc, env as server_env, make_secret
from pooltensor.commands import checks, info


def doctor(*args, env=None, timeout=60):
    """(exit status, the JSON report) of `pooltensor doctor --json ARGS`."""
    p = subprocess.run([sys.executable, "-m", "pooltensor", "doctor", "--json", *args],
                       env=server_env(env), capture_output=True, text=True, timeout=timeout)
    assert p.stderr == "" or p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


def of(report, check):
    return [f for f in report["findings"] if f["check"] == check]


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# ---- huge pages ---------------------------------------------------------------------------

def test_huge_pages_as_this_machine_has_them():
    path = os.path.join(info.THP, "shmem_enabled")
    _, report = doctor()
    [f] = of(report, "huge pages")
    if not os.path.exists(path):
        assert f["level"] == "info"
        return
    state = re.search(r"\[(\w+)\]", open(path).read()).group(1)
    assert f"shmem_enabled={state}" in f["text"]
    if state in ("never", "deny"):
        assert f["level"] == "warn" and f"echo advise > {path}" in f["fix"]
    else:
        assert f["level"] == "pass" and f["fix"] is None


@pytest.mark.parametrize("text,level", [("always within_size [advise] never deny force", "pass"),
                                        ("always within_size advise [never] deny force", "warn"),
                                        ("always within_size advise never [deny] force", "warn"),
                                        (None, "info")])
def test_huge_pages_states(tmp_path, monkeypatch, text, level):
    if text is not None:
        (tmp_path / "shmem_enabled").write_text(text + "\n")
    monkeypatch.setattr(info, "THP", str(tmp_path))
    [(got, text, *fix)] = checks.check_huge_pages({})
    assert got == level and "huge pages" in text
    assert bool(fix and fix[0]) == (level == "warn")


# ---- the secret file ----------------------------------------------------------------------

def secret_findings(monkeypatch, path):
    """The secret file check in this process, $POOLTENSOR_SECRET_FILE set to path."""
    monkeypatch.setenv("POOLTENSOR_SECRET_FILE", str(path))
    return [dict(zip(("level", "text", "fix"), tuple(f) + (None,)))
            for f in checks.check_secret_file({})]


def test_a_private_secret_file_passes(tmp_path, monkeypatch):
    path = make_secret(tmp_path)
    [f] = secret_findings(monkeypatch, path)
    assert f["level"] == "pass" and "mode 0600" in f["text"] and "48 bytes" in f["text"]


def test_a_world_readable_secret_file_fails_and_its_fix_fixes_it(tmp_path):
    path = make_secret(tmp_path)
    os.chmod(path, 0o644)
    code, report = doctor(env={"POOLTENSOR_SECRET_FILE": path})
    [f] = of(report, "secret file")
    assert code == 1 and report["status"] == "fail" and f["level"] == "fail"
    assert "mode 0644" in f["text"] and "other users can read it" in f["text"]
    assert f["fix"] == f"chmod 600 {path}"
    subprocess.run(f["fix"], shell=True, check=True)
    code, report = doctor(env={"POOLTENSOR_SECRET_FILE": path})
    [f] = of(report, "secret file")
    assert f["level"] == "pass"


def test_missing_short_and_exposed_secret_files(tmp_path, monkeypatch):
    [f] = secret_findings(monkeypatch, tmp_path / "nothing-here")
    assert f["level"] == "fail" and "does not exist" in f["text"] and "token_hex" in f["fix"]
    [f] = secret_findings(monkeypatch, make_secret(tmp_path, "short", "tooshort\n"))
    assert f["level"] == "fail" and "at least 16" in f["text"]
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    found = secret_findings(monkeypatch, make_secret(shared))
    assert [f["level"] for f in found] == ["pass", "warn"]
    assert "other users can replace the file" in found[1]["text"]
    assert found[1]["fix"] == f"chmod go-w {shared}"
    # the default path, not made yet: nothing is wrong
    monkeypatch.delenv("POOLTENSOR_SECRET_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    [f] = [dict(zip(("level", "text"), f)) for f in checks.check_secret_file({})]
    assert f["level"] == "info" and "not there yet" in f["text"]


# ---- ports: a memory server ----------------------------------------------------------------

def test_a_servers_ports_and_its_endpoint(tmp_path):
    secret = make_secret(tmp_path)
    srv = ServerProc("16MiB", secret, extra=["--metrics", "127.0.0.1:0"])
    try:
        m = srv.log.wait(r"metrics on http://", 30)
        mport = int(re.search(r":(\d+)/metrics", m.string).group(1))
        srv.ready()
        data = srv.log.all and re.search(r"data port (\d+)", "\n".join(srv.log.all)).group(1)
        code, report = doctor("--server", srv.address, "--endpoint", f"127.0.0.1:{mport}",
                              env={"POOLTENSOR_SECRET_FILE": secret})
        ports = of(report, "ports")
        texts = [f["text"] for f in ports]
        assert all(f["level"] == "pass" for f in ports), ports
        assert f"endpoint 127.0.0.1:{mport}: its metrics answer" in texts
        assert f"member server: control port {srv.address} answers" in texts
        assert f"member server: data port 127.0.0.1:{data} answers" in texts
        assert f"server {srv.address}: its control port answers" in texts
        assert any(t.startswith(f"server {srv.address}: data port {data} answers")
                   for t in texts)
        [t] = of(report, "transports")
        assert t["level"] == "info" and "no peers" in t["text"]
        # another secret: the handshake fails, and says what to do
        other = make_secret(tmp_path, "other")
        code, report = doctor("--server", srv.address, env={"POOLTENSOR_SECRET_FILE": other})
        bad = [f for f in of(report, "ports") if f["level"] == "fail"]
        assert code == 1 and len(bad) == 1 and "handshake failed" in bad[0]["text"]
        assert "copy of the server's secret file" in bad[0]["fix"]
        # the metrics port is no memory server
        code, report = doctor("--server", f"127.0.0.1:{mport}", "--timeout", "1",
                              env={"POOLTENSOR_SECRET_FILE": secret})
        [f] = of(report, "ports")
        assert code == 1 and "not a pooltensor server" in f["text"]
    finally:
        assert srv.stop() == 0


def test_closed_ports_fail_with_their_fix():
    port = closed_port()
    code, report = doctor("--server", f"127.0.0.1:{port}", "--endpoint",
                          f"127.0.0.1:{port}", "--timeout", "2")
    found = of(report, "ports")
    assert code == 1 and report["status"] == "fail"
    assert [f["level"] for f in found] == ["fail", "fail"]
    assert "Connection refused" in found[0]["text"] and "POOLTENSOR_METRICS" in found[0]["fix"]
    assert "nothing listens there" in found[1]["text"]
    assert "pooltensor serve" in found[1]["fix"]
    p = subprocess.run([sys.executable, "-m", "pooltensor", "doctor", "--server",
                        f"127.0.0.1:{port}", "--timeout", "2"], env=server_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    lines = p.stdout.splitlines()
    i = next(i for i, l in enumerate(lines) if l.startswith("[fail] server 127.0.0.1:"))
    assert lines[i + 1].startswith("       fix: is `pooltensor serve` running there?")
    for bad in (["--server", "nowhere"], ["--timeout", "0"]):
        p = subprocess.run([sys.executable, "-m", "pooltensor", "doctor", *bad],
                           env=server_env(), capture_output=True, text=True, timeout=60)
        assert p.returncode in (1, 2) and ("HOST:PORT" in p.stdout + p.stderr
                                           or "--timeout" in p.stderr)


# ---- transports per peer pair: a running job -----------------------------------------------

def _free_port_pair():
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
            return p
    pytest.skip("no two consecutive free ports")


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_a_running_jobs_ports_and_transports(transport):
    port = _free_port_pair()
    env = {"POOLTENSOR_METRICS": f"127.0.0.1:{port}"}
    if transport == "tcp":
        env["POOLTENSOR_TRANSPORT"] = "tcp"
    p = check_ranks("launch", 2, "doctor_job.py", str(port), env=env)
    line = next(l for l in p.stdout.splitlines() if "DOCTOR" in l)
    code, report = line.split("DOCTOR ", 1)[1].split(" ", 1)
    report = json.loads(report)
    pairs = {f["text"]: f["level"] for f in of(report, "transports")}
    assert pairs == {f"member 0 -> peer 1: {transport}, up": "pass",
                     f"member 1 -> peer 0: {transport}, up": "pass"}, pairs
    ports = {f["text"]: f["level"] for f in of(report, "ports")}
    assert ports[f"endpoint 127.0.0.1:{port}: its metrics answer"] == "pass"
    assert ports[f"endpoint 127.0.0.1:{port + 1}: its metrics answer"] == "pass"
    listeners = [t for t in ports if re.match(r"member \d: tcp port 127.0.0.1:\d+ answers", t)]
    assert len(listeners) == (2 if transport == "tcp" else 0), ports
    assert set(ports.values()) == {"pass"}


def test_a_lost_member_fails_with_its_fix():
    """A plain script's member SIGKILLed: its link is lost, and the doctor, reading the
    script's endpoint, fails that pair and says what to do."""
    import signal
    import time

    import pooltensor as pt
    pt.finalize()
    pool = pt.init(members=2, slab_size=4096, memory=8 << 20, metrics="127.0.0.1:0",
                   timeout=20)
    try:
        port = pool.metrics_exporter.port
        os.kill(pool._procs[0].pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if pool.world.stats()["peers"][1]["state"] == "lost":
                break
            time.sleep(0.05)
        code, report = doctor("--endpoint", f"127.0.0.1:{port}")
        [f] = of(report, "transports")
        assert code == 1 and f["level"] == "fail", report
        assert f["text"] == "member 0 -> peer 1: lost (was shm)"
        assert "peer 1 is gone" in f["fix"] and "pool.lost()" in f["fix"]
    finally:
        pt.finalize()
