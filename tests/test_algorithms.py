"""Window-based collective algorithms: ring, recursive doubling, hierarchical, direct.

Real ranks (oversubscribed on 2 cores); one launch runs every case for one configuration
(tests/scripts/algos_check.py): every algorithm x kind x op x dtype x size against numpy, with
results bitwise identical on every rank. Hierarchical runs across pretend hosts
(POOLTENSOR_HOST per rank), with small channel slots so that messages span many chunks and the
credits run out. Mismatched calls must raise CollectiveMismatch on every rank, and the next
call must work; a dead rank must give PeerLost naming it on every other rank.
"""
from types import SimpleNamespace

import pytest

from collectives import algorithms
from collectives.algorithms import channel, direct
from conftest import check_ranks, run_env_ranks

pytestmark = pytest.mark.timeout(120)

SMALL_SLOTS = {"POOLTENSOR_CHANNEL_SLOT_BYTES": "4096", "POOLTENSOR_CHANNEL_SLOTS": "2"}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_one_host_against_numpy(n):
    p = check_ranks("mpiexec", n, "algos_check.py")
    assert p.stdout.count("algos ok") == n


@pytest.mark.parametrize("launcher,n,hosts", [("mpiexec", 3, "div2"), ("mpiexec", 4, "div2"),
                                              ("launch", 4, "mod2")])
def test_hierarchical_across_hosts_small_slots(launcher, n, hosts):
    """div2: hosts {0,1} {2,3} (or {2}); mod2: {0,2} {1,3}, ranks of a host not contiguous."""
    p = check_ranks(launcher, n, "algos_check.py", env={"ALGOS_HOSTS": hosts, **SMALL_SLOTS})
    assert p.stdout.count("algos ok") == n


@pytest.mark.parametrize("n,hosts,odd,team_check,slow", [
    (2, "", 1, "1", -1), (4, "div2", 3, "1", -1), (4, "", 0, "0", 2), (3, "div2", 0, "0", -1),
    (4, "mod2", 1, "0", -1)])
def test_mismatch_raises_on_every_rank(n, hosts, odd, team_check, slow):
    """team_check 1: calls first meet in the world team (how it runs on one machine, and how a
    channel algorithm on one rank meets a team algorithm on another); 0: the channel's own
    checks alone, as between machines. slow: a rank late to every call, so that the others
    give up several calls ahead of it."""
    env = {"ALGOS_HOSTS": hosts, "ALGOS_ODD": str(odd), "POOLTENSOR_TIMEOUT": "20",
           "POOLTENSOR_CHANNEL_TEAM_CHECK": team_check, "ALGOS_SLOW": str(slow)}
    p = check_ranks("mpiexec", n, "algos_check.py", "mismatch", env=env)
    assert p.stdout.count("mismatch ok") == n


def test_registered():
    assert {"ring", "recursive_doubling", "hierarchical"} <= set(algorithms.names("allreduce"))
    assert {"ring", "recursive_doubling", "hierarchical"} <= set(algorithms.names("allgather"))
    for kind in ("reduce_scatter", "broadcast"):
        assert {"ring", "hierarchical"} <= set(algorithms.names(kind))


def _world(size, local_size, shm=True):
    return SimpleNamespace(size=size, local_size=local_size, _shm_world=shm, rank=0, host="h")


def test_select_by_topology_and_size(monkeypatch):
    sel = algorithms.select
    w = _world(4, 4, shm=False)
    # direct is picked only where it is allowed a size (POOLTENSOR_DIRECT_MAX)
    monkeypatch.setattr(direct, "DIRECT_MAX", 0)
    assert sel("allreduce", 1024, w) == "recursive_doubling"
    monkeypatch.setattr(direct, "DIRECT_MAX", 256 * 1024)
    # one host: the native team (the ops layer takes it directly without select)
    assert sel("allreduce", 1024, _world(4, 4)) == "oneshot"
    assert sel("allgather", 1024, _world(4, 4)) == "shm"
    # several hosts: hierarchical for every kind, unless deterministic
    for kind in ("allreduce", "allgather", "reduce_scatter", "broadcast"):
        assert sel(kind, 1 << 20, _world(4, 2)) == "hierarchical"
    assert sel("allreduce", 1024, _world(4, 2), deterministic=True) == "oneshot"
    # no shared-memory team across the ranks: the window algorithms, by size
    w = _world(4, 4, shm=False)
    for kind in ("allreduce", "allgather", "broadcast"):   # small, few ranks: one round trip
        assert sel(kind, 1024, w) == "direct"
        assert sel(kind, 1024, w, deterministic=kind == "allreduce") == "direct"
    assert sel("reduce_scatter", 1024, w) == "ring"
    # by the bytes each rank sends: input x (p - 1)
    big = direct.DIRECT_MAX // 3 + 1024
    assert sel("allreduce", big, w) == "ring"
    assert sel("allreduce", big, _world(2, 2, shm=False)) == "direct"
    assert sel("allreduce", 1 << 20, w) == "ring"
    assert sel("allreduce", 1 << 20, w, deterministic=True) == "ordered"
    assert sel("broadcast", 1 << 20, w) == "ring"
    many = _world(channel.DIRECT_RANKS + 1, channel.DIRECT_RANKS + 1, shm=False)
    assert sel("allreduce", 1024, many) == "recursive_doubling"
    assert sel("broadcast", 1024, many) == "ring"
    assert sel("allreduce", 1024, w, algorithm="ring") == "ring"
    with pytest.raises(ValueError, match="deterministic"):
        sel("allreduce", 1024, w, algorithm="ring", deterministic=True)


@pytest.mark.parametrize("p", range(1, 14))
def test_recursive_doubling_layout(p):
    """The fold pairs and partners are symmetric, and every member is covered once."""
    seen = set()
    for i in range(p):
        p2, rem, new, fold = channel.rd_layout(p, i)
        assert p2 & (p2 - 1) == 0 and p2 + rem == p and p2 <= p < 2 * p2
        if fold is not None:
            assert channel.rd_layout(p, fold)[3] == i
        if new is not None:
            assert channel.rd_member(new, rem) == i
            seen.add(new)
    assert seen == set(range(1 << (p.bit_length() - 1)))
    ranks = list(range(10, 10 + p))
    for r in ranks:     # who r receives from <-> who sends to r
        for s in channel._peers(ranks, r):
            assert s in ranks and s != r


def test_chunks():
    assert channel.chunks(5, 5, 4) == [(5, 5)]
    assert channel.chunks(0, 10, 4) == [(0, 4), (4, 8), (8, 10)]


@pytest.mark.parametrize("algo,n", [("ring", 3), ("recursive_doubling", 4), ("direct", 3)])
def test_dead_rank_gives_peer_lost_everywhere(algo, n):
    """Ranks started straight from POOLTENSOR_* variables (no launcher to stop them early)."""
    codes, outs = run_env_ranks(n, "algos_check.py", "lost", algo,
                                env={"POOLTENSOR_TIMEOUT": "20"})
    for r in range(n - 1):
        assert codes[r] == 0 and "lost ok" in outs[r], f"rank {r}:\n{outs[r]}"
