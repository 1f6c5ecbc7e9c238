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


def test_large_collectives_across_hosts(netns):
    """Chunks larger than a tcp frame go in several unanswered frames back to back, the
    message's header gathered in front of them."""
    outs = check_ns_ranks([0, 1], "coll_large.py", timeout=200)
    assert all("coll large ok" in o for o in outs), outs


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


_RECEIVE = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7300)); s.listen(1); print("listening", flush=True)
c, _ = s.accept(); t = time.perf_counter(); n = 0
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
print(n, time.perf_counter() - t, flush=True)
"""
_SEND = """
import socket, sys
with socket.create_connection((sys.argv[1], 7300), timeout=30) as s:
    s.sendall(bytes(int(sys.argv[2])))
"""


def _transfer(lan, src, dst, nbytes):
    """Seconds for nbytes from host src to host dst (timed by the receiver)."""
    rx = subprocess.Popen(lan.cmd(dst, [sys.executable, "-c", _RECEIVE, lan.addr(dst)]),
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout.readline().strip() == "listening"
        subprocess.run(lan.cmd(src, [sys.executable, "-c", _SEND, lan.addr(dst),
                                     str(nbytes)]), check=True, timeout=60)
        n, dt = rx.communicate(timeout=60)[0].split()
    finally:
        if rx.poll() is None:
            rx.kill()
    assert int(n) == nbytes
    return float(dt)


def test_lan_shapes_each_card_both_ways_and_goes(netns):
    """tests/netns.py's Lan (bench/store.py's machines): a host's card is shaped for what it
    sends and for what it receives, the others are not; close() removes every namespace, and
    a layout whose owner died is removed by the next Lan."""
    from netns import Lan
    lan = Lan(["a", "b", "c"], rates={"b": "40mbit"})
    names = [lan.sw, *lan.names.values()]
    try:
        nbytes = 2 << 20                          # 0.42 s at 40 Mbit/s, less the bursts
        assert _transfer(lan, "a", "b", nbytes) > 0.25       # b receives at its rate
        assert _transfer(lan, "b", "c", nbytes) > 0.25       # b sends at its rate
        assert _transfer(lan, "a", "c", nbytes) < 0.25       # a to c: unshaped
        assert "rate 40Mbit" in lan.shaping()["b"][0] and not lan.shaping()["a"][0]
    finally:
        lan.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in listed.split() for n in names), listed
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = Lan(["x"])                             # its owner "dies" without close()
    with open(Lan.OWNERS.format(left.n), "w") as f:
        f.write(f"{dead.pid}\n")
    Lan(["y"]).close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert left.names["x"] not in listed.split(), listed
