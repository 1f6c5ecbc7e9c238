"""Replicated read-only regions (pool/replicas.py): placement of the copies, every copy written
at creation, reads that survive a SIGKILLed member (local members with and without mapping,
memory servers on loopback and in other network namespaces, SPMD ranks), the restore back to
k copies seen in stats(), PeerLost naming the member for arrays without a replica, pool.lost().
"""
import gc
import json
import subprocess
import sys
import types

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pooltensor as pt
from pooltensor.pool import replicas
from conftest import SCRIPTS, SLAB, pool_fixture, property_settings, run_env_ranks
from servers import ClientProc, ServerProc, env as server_env, make_secret
from netns import netns  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.timeout(180)
pool = pool_fixture(3)
SETTINGS = property_settings("POOLTENSOR_REPLICA_EXAMPLES", 40, "POOLTENSOR_DERANDOMIZE")


def copies_hold(p, x, ref):
    """Every copy of every slab of x holds the bytes of numpy `ref` (read at its member)."""
    a = x._a
    flat = np.ascontiguousarray(ref).reshape(-1).view(np.uint8)
    buf = np.empty(p.slab_size, np.uint8)
    for s, cs in enumerate(a.copies):
        n = a.slab_len(s)
        for m, slot in cs:
            if m == p.me:
                buf[:n] = p.local["ro"][slot * p.slab_size:slot * p.slab_size + n]
            else:
                p.win_ro.get(m, slot * p.slab_size, buf[:n])
            assert (buf[:n] == flat[s * p.slab_size:s * p.slab_size + n]).all(), (s, m, slot)


@SETTINGS
@given(n=st.integers(1, 700), k=st.integers(2, 3),
       policy=st.sampled_from(["block", "interleave", "balanced", "local", (0, 1, 2), (1, 2)]),
       dtype=st.sampled_from([np.float64, np.int32, np.uint8, np.complex64]),
       make=st.sampled_from(["from_numpy", "arange", "full", "zeros"]), data=st.data())
def test_copies_on_distinct_members_written_at_creation(pool, n, k, policy, dtype, make, data):
    ref = {"from_numpy": lambda: (np.arange(n) * 3 + 1).astype(dtype),
           "arange": lambda: np.arange(n, dtype=dtype), "full": lambda: np.full(n, 7, dtype),
           "zeros": lambda: np.zeros(n, dtype)}[make]()
    kw = dict(access="readonly", replicas=k, placement=list(policy) if isinstance(
        policy, tuple) else policy)
    if isinstance(policy, tuple) and len(policy) < k:
        with pytest.raises(ValueError, match=f"replicas={k}"):
            pt.from_numpy(ref, **kw)
        return
    x = {"from_numpy": lambda: pt.from_numpy(ref, **kw),
         "arange": lambda: pt.arange(n, dtype=dtype, **kw),
         "full": lambda: pt.full(n, 7, dtype=dtype, **kw),
         "zeros": lambda: pt.zeros(n, dtype=dtype, **kw)}[make]()
    a = x._a
    assert len(a.copies) == len(a.members)
    for s, cs in enumerate(a.copies):
        ms = [m for m, _ in cs]
        assert len(set(ms)) == k and cs[0] == (a.members[s], a.slots[s]), cs
        if isinstance(policy, tuple):
            assert set(ms) <= set(policy), (ms, policy)
    copies_hold(pool, x, ref)
    np.testing.assert_array_equal(x.to_numpy(), ref)
    i = data.draw(st.integers(0, n - 1))
    j = data.draw(st.integers(i, n))
    np.testing.assert_array_equal(x[i:j:2].to_numpy(), ref[i:j:2])
    assert x[i] == ref[i]
    with pytest.raises(ValueError, match="read-only"):
        x[i] = 1


def test_memory_counts_every_copy(pool):
    gc.collect()                                  # earlier tests' garbage freed now, not below
    before = pool.free_bytes()
    x = pt.zeros(30 * SLAB // 8, access="readonly", replicas=3)
    used = [b - a for a, b in zip(pool.free_bytes(), before)]
    assert used == [30 * SLAB] * 3, used          # each of 3 members holds all 30 slabs
    assert pool.stats()["replicas"]["replicated_slabs"] >= 30
    del x
    assert pool.free_bytes() == before            # every copy given back


def test_replicas_argument_errors(pool):
    with pytest.raises(ValueError, match=r"replicas=4, but only 3 member"):
        pt.zeros(10, access="readonly", replicas=4)
    for access in ("readwrite", "private"):
        with pytest.raises(ValueError, match="needs access='readonly'"):
            pt.zeros(10, access=access, replicas=2)
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        pt.ones(10, access="readonly", replicas=0)
    for bad in (2.5, "2", True):
        with pytest.raises(TypeError, match="replicas"):
            pt.ones(10, access="readonly", replicas=bad)
    with pytest.raises(ValueError, match="placement allows 1"):
        pt.ones(10, access="readonly", replicas=2, placement=[1])
    x = pt.ones(10, access="readwrite", replicas=1)         # one copy: any access
    assert x._a.copies is None and float(x.sum()) == 10
    big = pool.capacity[0] // 8                              # elements in one heap
    with pytest.raises(pt.PoolOutOfMemory, match="3 copies each"):
        pt.empty(2 * big, access="readonly", replicas=3)
    np.testing.assert_array_equal(pt.asarray(np.arange(5), access="readonly",
                                             replicas=2).to_numpy(), np.arange(5))


def test_one_member_pool_refuses_replicas():
    code = ("import pooltensor as pt\n"
            "pt.init(slab_size=4096, memory=1 << 20)\n"
            "try:\n    pt.zeros(10, access='readonly', replicas=2)\n"
            "except ValueError as e:\n    print('refused', 'only 1 member' in str(e))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=server_env())
    assert "refused True" in out.stdout, out.stdout + out.stderr


def _keeper(machines, free):
    """A Keeper over a stand-in pool of len(machines) members (placement is a pure function
    of the members' machines and free slabs)."""
    k = replicas.Keeper.__new__(replicas.Keeper)
    k.pool = types.SimpleNamespace(size=len(machines), nslabs=[max(free)] * len(machines),
                                   _used=[0] * len(machines), me=0)
    k.machines, k.gone = list(machines), {}
    return k


@SETTINGS
@given(machines=st.lists(st.sampled_from("ABC"), min_size=2, max_size=6),
       nslabs=st.integers(1, 40), k=st.integers(2, 4), data=st.data())
def test_other_machines_first(machines, nslabs, k, data):
    n = len(machines)
    if k > n:
        return
    keeper = _keeper(machines, [100] * n)
    homes = data.draw(st.lists(st.integers(0, n - 1), min_size=nslabs, max_size=nslabs))
    extra = keeper.place(homes, k, [100] * n, range(n))
    spread = len(set(machines))
    for s, h in enumerate(homes):
        ms = [h] + [e[s] for e in extra]
        assert len(set(ms)) == k, ms
        assert len({machines[m] for m in ms}) == min(k, spread), (ms, machines)
    # block placement: a member's block goes to one next member (one transfer per member)
    keeper = _keeper("AAA", [100] * 3)
    assert keeper.place([0, 0, 1, 1, 2, 2], 2, [100] * 3, range(3)) == [[1, 1, 2, 2, 0, 0]]
    assert keeper.place([0, 0], 2, [2, 0, 1], range(3)) is None      # room for one copy
    assert keeper.place([0, 0], 2, [2, 0, 2], range(3)) == [[2, 2]]


def _loss(args, timeout=150):
    out = subprocess.run([sys.executable, str(SCRIPTS / "replicas_loss.py"), *args],
                         capture_output=True, text=True, timeout=timeout, env=server_env())
    assert out.returncode == 0 and "replicas ok" in out.stdout, out.stdout + out.stderr[-4000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("figures "))
    return json.loads(line[8:])


@pytest.mark.parametrize("attach", ["1", "0"], ids=["mapped", "cached"])
def test_member_killed_during_reads_fails_over_and_restores(attach):
    fig = _loss(["local", "3", attach])
    print("figures", fig)
    assert fig["restored_slabs"] > 0 and fig["first_read_after_kill_ms"] is not None


def _servers_loss(servers, secret, ns=None):
    c = ClientProc("replicas_loss.py", "servers", secret, *[s.address for s in servers],
                   ns=ns)
    try:
        ready = json.loads(c.out.wait(r"^ready (.*)", 120).group(1))
        c.out.wait("^reading", 30)
        servers[-1].proc.kill()
        servers[-1].wait(20)
        rc, out = c.finish(150)
        assert rc == 0 and "replicas ok" in out, out
        line = next(ln for ln in out.splitlines() if ln.startswith("figures "))
        return ready, json.loads(line[8:])
    finally:
        c.kill()


def test_server_killed_during_reads_fails_over_and_restores(tmp_path):
    secret = make_secret(tmp_path)
    servers = [ServerProc("64MiB", secret).ready() for _ in range(3)]
    try:
        ready, fig = _servers_loss(servers, secret)
        print("figures", fig)
        assert ready["machines"] == 1                # one machine: distinct processes only
    finally:
        for s in servers:
            s.stop()


def test_server_on_another_machine_killed(netns, tmp_path):
    """Servers in two namespaces (two on ptns1, one on ptns2), the script in ptns0: each
    slab's two copies are on different machines; the lone server of ptns2 is killed."""
    secret = make_secret(tmp_path)
    names, addrs = netns["names"], netns["addrs"]
    servers = [ServerProc("64MiB", secret, host=addrs[1], ns=names[1]),
               ServerProc("64MiB", secret, host=addrs[1], ns=names[1]),
               ServerProc("64MiB", secret, host=addrs[2], ns=names[2])]
    try:
        for s in servers:
            s.ready()
        ready, fig = _servers_loss(servers, secret, ns=names[0])
        print("figures", fig)
        assert ready["machines"] == 2
    finally:
        for s in servers:
            s.stop()


def test_spmd_rank_killed_reads_fail_over():
    codes, outs = run_env_ranks(3, "replicas_spmd.py", timeout=90)
    assert codes[:2] == [0, 0] and codes[2] == -9, (codes, outs)
    for r in (0, 1):
        assert f"rank {r} spmd replicas ok" in outs[r], outs[r]


def test_two_members_lost_one_after_the_other():
    out = subprocess.run([sys.executable, str(SCRIPTS / "replicas_twice.py")],
                         capture_output=True, text=True, timeout=150, env=server_env())
    assert out.returncode == 0 and "twice ok" in out.stdout, out.stdout + out.stderr[-4000:]


def test_restore_without_room_waits_for_freed_memory():
    out = subprocess.run([sys.executable, str(SCRIPTS / "replicas_full.py")],
                         capture_output=True, text=True, timeout=150, env=server_env())
    assert out.returncode == 0 and "full ok" in out.stdout, out.stdout + out.stderr[-4000:]
