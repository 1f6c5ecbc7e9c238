"""Ranks and memory servers on different hosts: three network namespaces on this machine
(tests/netns.py; skipped with the reason when they cannot be made: not root, no `ip`).

Ranks are started with ``ip netns exec ptnsK python script`` and the POOLTENSOR_RANK /
WORLD_SIZE / COORDINATOR variables (rank 0's namespace serves the rendezvous), one or two per
namespace: ranks in one namespace reach each other over shared memory, the others over tcp."""
import random
import subprocess
import sys

import pytest

from conftest import SCRIPTS, rank_env
from netns import ns_cmd, netns  # noqa: F401  (the session fixture)
from servers import (ServerProc, make_secret, scenario_basic, scenario_compute,
                     scenario_killed_client, scenario_server_gone)

pytestmark = pytest.mark.timeout(240)


def run_ns_ranks(layout, script, *args, env=None, timeout=150):
    """Rank r runs in namespace layout[r]; returns (return codes, outputs), killing every
    rank still running at the timeout."""
    from netns import ADDRS
    n = len(layout)
    port = random.randrange(20000, 60000)
    coord = f"{ADDRS[layout[0]]}:{port}"
    procs = []
    for r, k in enumerate(layout):
        e = rank_env({"POOLTENSOR_RANK": str(r), "POOLTENSOR_WORLD_SIZE": str(n),
                      "POOLTENSOR_COORDINATOR": coord, **(env or {})})
        for v in ("POOLTENSOR_TRANSPORT", "POOLTENSOR_HOST", "POOLTENSOR_LISTEN"):
            if v not in (env or {}):
                e.pop(v, None)
        procs.append(subprocess.Popen(ns_cmd(k, [sys.executable, str(SCRIPTS / script),
                                                 *map(str, args)]),
                                      env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    try:
        for p in procs:
            try:
                outs.append(p.communicate(timeout=timeout)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                outs.append(p.communicate()[0] + f"\n[killed after {timeout} s]")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    return [p.returncode for p in procs], outs


def check_ns_ranks(layout, script, *args, env=None, timeout=150):
    codes, outs = run_ns_ranks(layout, script, *args, env=env, timeout=timeout)
    text = "\n".join(f"--- rank {r} (ptns{layout[r]}), exit {c}:\n{o}"
                     for r, (c, o) in enumerate(zip(codes, outs)))
    assert all(c == 0 for c in codes), text
    return outs


LAYOUTS = {"2 hosts": [0, 1], "3 hosts": [0, 1, 2], "3 hosts, 2+1+1": [0, 1, 2, 0]}


@pytest.mark.parametrize("layout", list(LAYOUTS.values()), ids=list(LAYOUTS))
def test_windows_across_hosts(netns, layout):
    outs = check_ns_ranks(layout, "netns_windows.py", ",".join(map(str, layout)))
    assert all("netns windows ok" in o for o in outs), outs


@pytest.mark.parametrize("layout", [[0, 1], [0, 1, 2]], ids=["2 hosts", "3 hosts"])
def test_collectives_across_hosts(netns, layout):
    outs = check_ns_ranks(layout, "coll_correct.py", "--quick", timeout=200)
    assert all("coll ok" in o for o in outs), outs


def test_collectives_two_ranks_per_host(netns):
    """Hierarchical: shared memory inside each namespace, tcp between them."""
    outs = check_ns_ranks([0, 0, 1, 1], "coll_correct.py", "--quick", timeout=220)
    assert all("coll ok" in o for o in outs), outs


@pytest.mark.parametrize("layout", [[0, 1], [0, 1, 2]], ids=["2 hosts", "3 hosts"])
def test_pool_spmd_across_hosts(netns, layout):
    outs = check_ns_ranks(layout, "pool_spmd.py", "40", timeout=220)
    assert all("pool spmd ok" in o for o in outs), outs


# -- memory servers in ptns1 and ptns2, a plain script in ptns0 ------------------------------

@pytest.fixture
def ns_servers(netns, tmp_path):
    secret = make_secret(tmp_path)
    a = ServerProc("64MiB", secret, host=netns["addrs"][1], port=7000, ns=netns["names"][1])
    b = ServerProc("64MiB", secret, host=netns["addrs"][2], port=7000, ns=netns["names"][2])
    try:                    # (one that did not start must not leave the other holding 7000)
        a.ready()
        b.ready()
        yield (a, b), secret
    finally:
        a.stop()
        b.stop()


def test_servers_across_hosts(ns_servers):
    servers, secret = ns_servers
    scenario_basic(servers, secret, ns="ptns0")


def test_servers_across_hosts_compute(ns_servers):
    servers, secret = ns_servers
    pids, me = scenario_compute(servers, secret, ns="ptns0")
    assert len(pids) == 1                 # map_blocks in the client: no --allow-code there


def test_servers_across_hosts_killed_client(ns_servers):
    servers, secret = ns_servers
    scenario_killed_client(servers, secret, ns="ptns0")


@pytest.mark.parametrize("how", ["kill", "term"])
def test_servers_across_hosts_server_gone(ns_servers, how):
    servers, secret = ns_servers
    scenario_server_gone(servers, secret, how, ns="ptns0")
