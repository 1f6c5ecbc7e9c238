"""The verbs transport against the simulated provider tests/fakeverbs (built here with the C
compiler, on rdma-core's headers where libibverbs-dev is installed, else on ours), in both
profiles: rc (InfiniBand / RoCE: one-sided READ/WRITE) and apple (Thunderbolt RDMA: UC,
SEND/RECV only, 4 KiB frames, 32 WRs a queue, 100 memory regions). These tests check our verbs
logic (queue pair setup, the message protocol, selective signalling, the fallback to tcp,
every completion's status), not hardware: the provider moves bytes between processes with
process_vm_readv/writev. Windows and collectives run on real ranks with
POOLTENSOR_TRANSPORT=verbs against the same references as shm and tcp; every injected fault
ends in a typed error within the timeout and the next operation works; the degraded paths
(library absent, library present without devices) are real."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from collectives import transport
from conftest import check_ranks, run_env_ranks, run_ranks
from netns import netns  # noqa: F401  (the session fixture: skips without namespaces)

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fakeverbs"
RDMA_CORE = Path("/usr/include/infiniband/verbs.h")
REAL_LIB = next((p for p in ("/usr/lib/x86_64-linux-gnu/libibverbs.so.1",
                             "/usr/lib/aarch64-linux-gnu/libibverbs.so.1",
                             "/usr/lib64/libibverbs.so.1") if os.path.exists(p)), None)
CC = shutil.which("cc") or shutil.which("gcc")
PROFILES = {"rc": "rc", "apple": "uc-send"}

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not CC,
    reason="the simulated verbs provider needs Linux (process_vm_readv) and a C compiler")


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory):
    """tests/fakeverbs built into a shared library (on rdma-core's headers where present)."""
    out = tmp_path_factory.mktemp("fakeverbs") / "libfakeverbs.so"
    flags = ["-DFV_RDMA_CORE"] if RDMA_CORE.exists() else [f"-I{ROOT / 'native' / 'src'}"]
    res = subprocess.run([CC, "-std=gnu11", "-O2", "-Wall", "-shared", "-fPIC", *flags,
                          f"-I{FAKE}", str(FAKE / "fakeverbs.c"), "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return str(out)


def verbs_env(lib, profile, tmp_path, **extra):
    return {"POOLTENSOR_TRANSPORT": "verbs", "POOLTENSOR_VERBS_LIB": lib,
            "POOLTENSOR_FAKEVERBS_PROFILE": profile,
            "POOLTENSOR_FAKEVERBS_FABRIC": str(tmp_path / "fabric"),
            "POOLTENSOR_TIMEOUT": "20", **extra}


def probe_in(env):
    """What a fresh process's probe says under env (the library is loaded once a process)."""
    code = ("from collectives.transport import verbs; import json; "
            "i = verbs.probe(); i['summary'] = verbs.summary(); print(json.dumps(i))")
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    import json
    return json.loads(res.stdout)


# ---- loading, the probe, the profile -------------------------------------------------------

@pytest.mark.parametrize("profile", ["rc", "apple"])
def test_probe_sees_the_simulated_device_and_picks_the_profile(fake_lib, profile, tmp_path):
    info = probe_in({"POOLTENSOR_VERBS_LIB": fake_lib, "POOLTENSOR_FAKEVERBS_PROFILE": profile,
                     "POOLTENSOR_FAKEVERBS_FABRIC": str(tmp_path / "fabric")})
    assert info["error"] is None and info["library"] == fake_lib
    chosen = info["chosen"]
    # the profile comes from what the device accepts: apple refuses RC at RTR
    assert chosen["profile"] == PROFILES[profile]
    # apple: port 1 is down, the link is on port 2; the IPv4-mapped GID (index 1) wins
    assert chosen["port"] == (2 if profile == "apple" else 1) and chosen["gid"] == 1
    gid = next(g for g in info["gids"] if g["port"] == chosen["port"] and g["index"] == 1)
    assert gid["gid"].startswith("::ffff:10.") and gid["type"] == 2
    assert info["summary"]["fabric"] == "ethernet"
    assert info["summary"]["why"].startswith(PROFILES[profile] + " on ")


def test_no_ipv4_gid_on_thunderbolt_is_refused(fake_lib, tmp_path):
    """Without an IPv4 address on the interface there is no IPv4-mapped GID; the link-local
    one does not route on Thunderbolt RDMA (the provider refuses it at RTR)."""
    info = probe_in({"POOLTENSOR_VERBS_LIB": fake_lib, "POOLTENSOR_FAKEVERBS_PROFILE": "apple",
                     "POOLTENSOR_FAKEVERBS_IPV4": "0",
                     "POOLTENSOR_FAKEVERBS_FABRIC": str(tmp_path / "fabric")})
    assert info["chosen"] is None and "IPv4" in info["error"], info["error"]
    assert not any(g["gid"].startswith("::ffff:") for g in info["gids"])
    assert info["summary"]["fabric"] is None


def test_device_and_gid_overrides(fake_lib, tmp_path):
    base = {"POOLTENSOR_VERBS_LIB": fake_lib, "POOLTENSOR_FAKEVERBS_FABRIC": str(tmp_path / "f"),
            "POOLTENSOR_FAKEVERBS_PORTS": "2"}
    info = probe_in({**base, "POOLTENSOR_VERBS_GID": "0"})        # link-local, asked for
    assert info["chosen"]["gid"] == 0 and info["chosen"]["profile"] == "rc"
    info = probe_in({**base, "POOLTENSOR_VERBS_DEVICE": "fakerc0:2"})
    assert info["chosen"]["port"] == 2 and info["chosen"]["rails"] == 1
    info = probe_in(base)
    assert info["chosen"]["port"] == 1 and info["chosen"]["rails"] == 2
    info = probe_in({**base, "POOLTENSOR_VERBS_DEVICE": "mlx5_9"})
    assert info["chosen"] is None and "no active port" in info["error"]


def test_library_absent_is_one_clear_line():
    info = probe_in({"POOLTENSOR_VERBS_LIB": "/nonexistent/libibverbs.so.1"})
    assert info["chosen"] is None and info["error"].startswith("no verbs library")
    s = info["summary"]
    assert s["fabric"] is None and "no verbs library" in s["why"] and "tcp" in s["why"]


@pytest.mark.skipif(REAL_LIB is None, reason="Debian's libibverbs1 is not installed here "
                    "(.ci/run installs it where apt-get exists)")
def test_real_library_without_devices_is_one_clear_line():
    """Debian's libibverbs1 on a kernel without RDMA: ibv_get_device_list fails (ENOSYS)."""
    info = probe_in({"POOLTENSOR_VERBS_LIB": REAL_LIB})
    assert info["chosen"] is None and info["summary"]["fabric"] is None
    assert "no RDMA devices" in info["error"], info["error"]


def test_no_devices_in_the_simulated_provider(fake_lib, tmp_path):
    info = probe_in({"POOLTENSOR_VERBS_LIB": fake_lib, "POOLTENSOR_FAKEVERBS_DEVICES": "0",
                     "POOLTENSOR_FAKEVERBS_FABRIC": str(tmp_path / "fabric")})
    assert info["chosen"] is None and "no RDMA devices" in info["error"]


# ---- pooltensor doctor --------------------------------------------------------------------

def doctor(env):
    return subprocess.run([sys.executable, "-m", "pooltensor", "doctor"],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("profile", ["rc", "apple"])
def test_doctor_reports_devices_ports_gids_caps_and_profile(fake_lib, tmp_path, profile):
    p = doctor({"POOLTENSOR_VERBS_LIB": fake_lib, "POOLTENSOR_FAKEVERBS_PROFILE": profile,
                "POOLTENSOR_FAKEVERBS_FABRIC": str(tmp_path / "fabric")})
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "max WRs/queue " + ("32" if profile == "apple" else "1024") in out
    assert "GID 1: ::ffff:10." in out and "(RoCE v2)" in out and "MTU" in out
    assert f"profile {PROFILES[profile]}" in out
    if profile == "apple":
        assert "port 1: down" in out and "check the cable" in out


@pytest.mark.parametrize("env,text", [
    ({"POOLTENSOR_VERBS_LIB": "/nonexistent/libibverbs.so.1"}, "install rdma-core's libibverbs1"),
    ({"POOLTENSOR_VERBS_LIB": REAL_LIB or ""}, "this kernel has no RDMA support"),
])
def test_doctor_plain_messages_for_the_known_failures(env, text):
    if not env["POOLTENSOR_VERBS_LIB"]:
        pytest.skip("Debian's libibverbs1 is not installed here")
    p = doctor(env)
    assert p.returncode == 0 and text in p.stdout and "pooltensor uses tcp" in p.stdout, p.stdout


def test_doctor_no_ipv4_on_thunderbolt(fake_lib, tmp_path):
    p = doctor({"POOLTENSOR_VERBS_LIB": fake_lib, "POOLTENSOR_FAKEVERBS_PROFILE": "apple",
                "POOLTENSOR_FAKEVERBS_IPV4": "0",
                "POOLTENSOR_FAKEVERBS_FABRIC": str(tmp_path / "fabric")})
    assert p.returncode == 1, p.stdout
    assert "give its interface an IPv4 address" in p.stdout and "[fail]" in p.stdout


def _pair(env, port):
    listen = subprocess.Popen([sys.executable, "-m", "pooltensor", "doctor", "--listen",
                               f"127.0.0.1:{port}"], env={**os.environ, **env},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        peer = subprocess.run([sys.executable, "-m", "pooltensor", "doctor", "--peer",
                               f"127.0.0.1:{port}", "--quick"], env={**os.environ, **env},
                              capture_output=True, text=True, timeout=120)
        out, _ = listen.communicate(timeout=60)
    finally:
        listen.kill()
    return listen.returncode, out, peer


def _free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_doctor_pair_self_test(fake_lib, tmp_path):
    env = {"POOLTENSOR_VERBS_LIB": fake_lib, "POOLTENSOR_FAKEVERBS_FABRIC": str(tmp_path / "f"),
           "POOLTENSOR_TIMEOUT": "20"}
    code, out, peer = _pair(env, _free_port())
    assert code == 0 and peer.returncode == 0, out + peer.stdout + peer.stderr
    assert "8 B get latency: P50" in peer.stdout and "1024 KiB: get" in peer.stdout
    assert "say nothing about hardware" in peer.stdout


def test_doctor_pair_self_test_without_verbs_fails_clearly():
    env = {"POOLTENSOR_VERBS_LIB": "/nonexistent/libibverbs.so.1", "POOLTENSOR_TIMEOUT": "20"}
    code, out, peer = _pair(env, _free_port())
    assert code == 1 and peer.returncode == 1
    for text in (out, peer.stdout):
        assert "[fail] pair test" in text and "cannot use verbs" in text, text


# ---- the choice per peer -------------------------------------------------------------------

def test_choice_per_peer():
    machines = ["a", "a", "b", "c"]
    eth, ib = "ethernet", "ib:fe80:0000:0000:0000"
    got = transport.choose(machines, 0, None, [eth, eth, eth, None])
    assert got == ["self", "shm", "verbs", "tcp"]          # c has no verbs: tcp
    got = transport.choose(machines, 2, None, [ib, ib, eth, eth])
    assert got == ["tcp", "tcp", "self", "verbs"]          # no common fabric with a: tcp
    assert transport.choose(machines, 0, "verbs", [None] * 4)[1:] == ["verbs"] * 3
    assert transport.choose(machines, 0, "tcp", [eth] * 4)[1:] == ["tcp"] * 3
    assert not transport.wants_verbs([("a",), ("a",)], [None, None])
    assert transport.wants_verbs([("a",), ("b",)], [None, None])
    assert not transport.wants_verbs([("a",), ("b",)], ["tcp", "tcp"])
    assert transport.wants_verbs([("a",), ("a",)], ["verbs", "verbs"])


@pytest.mark.parametrize("lib,text", [("/nonexistent/libibverbs.so.1", "no verbs library"),
                                      (REAL_LIB, "no RDMA devices")])
def test_forced_verbs_without_it_fails_clearly(lib, text):
    if lib is None:
        pytest.skip("Debian's libibverbs1 is not installed here")
    p = run_ranks("launch", 2, "remote_window.py", "rc",
                  env={"POOLTENSOR_TRANSPORT": "verbs", "POOLTENSOR_VERBS_LIB": lib,
                       "POOLTENSOR_TIMEOUT": "20"}, timeout=60)
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert "TransportError" in out and "POOLTENSOR_TRANSPORT=verbs" in out and text in out, out


# ---- windows and collectives on real ranks -------------------------------------------------

@pytest.mark.parametrize("profile,n", [("rc", 2), ("rc", 3), ("apple", 2), ("apple", 4)])
def test_windows_over_verbs(fake_lib, tmp_path, profile, n):
    env = verbs_env(fake_lib, profile, tmp_path)
    p = check_ranks("launch", n, "remote_window.py", PROFILES[profile], env=env, timeout=150)
    assert p.stdout.count("verbs window ok") == n
    p = check_ranks("launch", n, "windows_random.py", "120", env=env)
    assert p.stdout.count("windows ok") == n
    p = check_ranks("launch", n, "windows_errors.py", env=env)
    assert p.stdout.count("refusals ok") == n


def test_verbs_atomics_where_the_device_has_coherent_ones(fake_lib, tmp_path):
    """atomic_cap GLOB: fetch_add / compare_swap as RDMA atomics (the provider counts them);
    with HCA (the default above) they are served at the target."""
    env = verbs_env(fake_lib, "rc", tmp_path, POOLTENSOR_FAKEVERBS_ATOMICS="glob")
    p = check_ranks("launch", 3, "remote_window.py", "rc", env=env, timeout=150)
    assert p.stdout.count("verbs window ok") == 3


def test_infiniband_routes_by_lid(fake_lib, tmp_path):
    """InfiniBand link layer: the GID is the port's fe80:: one (type IB), the queue pairs are
    routed by the peer's LID (the provider refuses RTR to any other)."""
    info = probe_in({"POOLTENSOR_VERBS_LIB": fake_lib, "POOLTENSOR_FAKEVERBS_LINK": "ib",
                     "POOLTENSOR_FAKEVERBS_FABRIC": str(tmp_path / "fabric")})
    assert info["ports"][0]["link"] == 1 and info["chosen"]["gid"] == 0
    assert info["summary"]["fabric"] == "ib:fe80:0000:0000:0000"
    env = verbs_env(fake_lib, "rc", tmp_path, POOLTENSOR_FAKEVERBS_LINK="ib")
    p = check_ranks("launch", 2, "remote_window.py", "rc", env=env, timeout=150)
    assert p.stdout.count("verbs window ok") == 2


def test_uc_messages_alternate_over_two_rails(fake_lib, tmp_path):
    """Two Thunderbolt cables: messages go over the rail with fewer in flight."""
    env = verbs_env(fake_lib, "apple", tmp_path, POOLTENSOR_FAKEVERBS_PORTS="2")
    p = check_ranks("launch", 3, "remote_window.py", "uc-send", env=env, timeout=150)
    assert p.stdout.count("verbs window ok") == 3
    import re
    on_second = [int(x) for x in re.findall(r"rails=2 striped=(\d+)", p.stdout)]
    assert len(on_second) == 3 and all(x > 100 for x in on_second), p.stdout


def test_two_rails_stripe_large_transfers(fake_lib, tmp_path):
    """Two active ports (two cables): large transfers go half over each rail."""
    env = verbs_env(fake_lib, "rc", tmp_path, POOLTENSOR_FAKEVERBS_PORTS="2")
    p = check_ranks("launch", 2, "remote_window.py", "rc", env=env, timeout=150)
    assert p.stdout.count("verbs window ok") == 2
    import re
    striped = [int(x) for x in re.findall(r"rails=2 striped=(\d+)", p.stdout)]
    assert len(striped) == 2 and all(x > 0 for x in striped), p.stdout
    env["POOLTENSOR_VERBS_RAILS"] = "1"
    p = check_ranks("launch", 2, "remote_window.py", "rc", env=env, timeout=150)
    assert p.stdout.count("rails=1 striped=0") == 2, p.stdout


@pytest.mark.parametrize("profile,n", [("rc", 3), ("apple", 2)])
def test_collectives_over_verbs(fake_lib, tmp_path, profile, n):
    p = check_ranks("launch", n, "coll_correct.py", "--quick",
                    env=verbs_env(fake_lib, profile, tmp_path), timeout=600)
    assert p.stdout.count("coll ok") == n, p.stdout[-3000:]


def test_pool_over_verbs(fake_lib, tmp_path):
    """The pool's SPMD checks (hypothesis against numpy) with every member reached over verbs."""
    p = check_ranks("launch", 3, "pool_spmd.py", "40",
                    env=verbs_env(fake_lib, "apple", tmp_path, POOLTENSOR_TIMEOUT="30"),
                    timeout=200)
    assert p.stdout.count("pool spmd ok") == 3, p.stdout


@pytest.mark.parametrize("profile", ["rc", "apple"])
def test_killed_rank_is_peer_lost_over_verbs(fake_lib, tmp_path, profile):
    """tcp stays the liveness channel: a SIGKILLed peer is PeerLost, from the barrier and from
    a get over verbs, within the timeout."""
    import signal
    codes, outs = run_env_ranks(3, "peer_killed.py", env=verbs_env(fake_lib, profile, tmp_path))
    assert codes[-1] == -signal.SIGKILL, outs[-1]
    for r in range(2):
        assert codes[r] == 0 and "PeerLost after" in outs[r], f"rank {r}:\n{outs[r]}"


# ---- faults --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fail", "flush", "silent", "qperr"])
@pytest.mark.parametrize("profile", ["rc", "apple"])
def test_fault_is_a_typed_error_and_the_next_operation_works(fake_lib, tmp_path, profile,
                                                              kind):
    env = verbs_env(fake_lib, profile, tmp_path)     # (the script's operations: 3 s)
    p = check_ranks("launch", 2, "verbs_faults.py", kind, env=env, timeout=90)
    assert p.stdout.count("fault ok") == 2, p.stdout
    assert f"rank 0: {kind} -> " in p.stdout and "then tcp" in p.stdout


# ---- across hosts (network namespaces): the choice per peer for real ---------------------

@pytest.mark.timeout(240)
@pytest.mark.parametrize("lib", ["fake", "absent"])
def test_choice_across_hosts(netns, fake_lib, tmp_path, lib):
    """Two ranks on one host, one on another: shared memory inside, and between the hosts
    verbs where both have it, else tcp with describe()'s one line saying why."""
    from test_netns import check_ns_ranks
    env = {"POOLTENSOR_VERBS_LIB": fake_lib if lib == "fake" else "/nonexistent/libibverbs.so.1",
           "POOLTENSOR_FAKEVERBS_FABRIC": str(tmp_path / "fabric"), "POOLTENSOR_TIMEOUT": "30"}
    outs = check_ns_ranks([0, 0, 1], "verbs_hosts.py", "0,0,1",
                          "verbs" if lib == "fake" else "tcp", env=env)
    assert all("hosts ok" in o for o in outs), outs
