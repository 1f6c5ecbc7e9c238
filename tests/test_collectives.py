"""Collectives on real ranks (mpiexec and our launcher, 1 to 4 ranks oversubscribed on 2 cores).

One process launch per (launcher, n) runs every collective x algorithm x dtype x op x size in
tests/scripts/coll_correct.py (algorithms discovered at run time, so new ones are covered);
the error paths that need a rank to misbehave (timeout, peer killed) get launches of their own.
"""
import importlib.util
import signal

import pytest

from conftest import check_ranks, launch_runs, run_env_ranks, run_ranks

pytestmark = pytest.mark.timeout(150)

# every rank count under our launcher, and 1 and 2 under mpiexec (how ranks start is settled by
# then; the 3- and 4-rank runs take 10-16 s each on 2 cores)
RUNS = [("launch", n) for n in (1, 2, 3, 4)] + [("mpiexec", n) for n in (1, 2)]


@launch_runs(RUNS)
def test_every_collective_against_numpy(launcher, n):
    """allreduce, reduce_scatter, allgather, broadcast: every algorithm, dtype, op and size
    (empty, one element, odd, several staging chunks, in place) equal numpy's, bitwise
    identical on every rank; deterministic=True equal across algorithms; NaN/inf; local errors
    (TypeError/ValueError); mismatched calls give CollectiveMismatch on every rank and leave
    the world usable; async requests overlap compute and equal the sync results."""
    p = check_ranks(launcher, n, "coll_correct.py", env={"POOLTENSOR_TIMEOUT": "20"},
                    timeout=140)
    assert p.stdout.count("coll ok") == n, p.stdout


TIMEOUT_CASES = [
    ("mpiexec", 2, "allreduce"), ("mpiexec", 3, "broadcast"), ("launch", 2, "allgather"),
    ("launch", 3, "reduce_scatter"), ("mpiexec", 3, "allreduce_async"),
]


@pytest.mark.parametrize("launcher,n,kind", TIMEOUT_CASES)
def test_skipped_collective_times_out_naming_the_rank(launcher, n, kind):
    p = check_ranks(launcher, n, "coll_timeout.py", kind, env={"POOLTENSOR_TIMEOUT": "2"},
                    timeout=60)
    assert p.stdout.count("timeout ok") == n - 1, p.stdout
    assert p.stdout.count("skipped ok") == 1, p.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_killed_rank_gives_peer_lost(n, tmp_path):
    """Ranks started from POOLTENSOR_* variables: no launcher stops the survivors early."""
    codes, outs = run_env_ranks(n, "coll_peer_lost.py",
                                env={"POOLTENSOR_TIMEOUT": "30", "MEET_DIR": str(tmp_path)})
    assert codes[-1] == -signal.SIGKILL, outs[-1]
    for r in range(n - 1):
        assert codes[r] == 0, f"rank {r}:\n{outs[r]}"
        assert "allreduce PeerLost after" in outs[r] and "allgather PeerLost" in outs[r], outs[r]


@pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                    reason="jax is not installed: the JAX-in/JAX-out path is untested here")
@pytest.mark.parametrize("n", [1, 3])
def test_jax_in_jax_out(launcher, n):
    p = check_ranks(launcher, n, "coll_jax.py")
    assert p.stdout.count("jax ok") == n


def _edge(mode, *args, n=2, **env):
    p = run_ranks("launch", n, "coll_edge.py", mode, *args, env=env, timeout=60)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    assert p.stdout.count(f"{mode} ok") == n


def test_barrier_met_by_another_collective_is_a_mismatch():
    _edge("barrier_vs_allreduce", n=3)


def test_zero_dim_arrays_keep_their_shape():
    _edge("zero_dim")


def test_dtype_aliases_are_the_same_call():
    _edge("dtype_alias")


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_jax_bfloat16_in_jax_bfloat16_out():
    _edge("jax_bfloat16")


def test_float16_allreduce_average_in_float32():
    _edge("avg_half", "allreduce", n=3)


def test_float16_reduce_scatter_average_in_float32():
    _edge("avg_half", "reduce_scatter", n=3)


# ranks asking for different algorithms: found at once as a mismatch, not after a timeout,
# whether or not the algorithms have run (and set up their channels) before
ALGO_MISMATCH = [("allreduce", "oneshot", "twoshot"), ("allreduce", "ring", "oneshot"),
                 ("allreduce", "hierarchical", "twoshot"), ("allgather", "ring", "shm"),
                 ("reduce_scatter", "ring", "shm"), ("broadcast", "ring", "shm")]


def _pairs(triples):
    from collectives import algorithms
    return [":".join(t) for t in triples
            if {t[1], t[2]} <= set(algorithms.names(t[0]))]


def test_different_algorithms_on_different_ranks_is_a_mismatch():
    """Every pair after both algorithms have run once (one launch)."""
    pairs = _pairs(ALGO_MISMATCH)
    _edge("algo_mismatch", *pairs, n=3, POOLTENSOR_TIMEOUT="3")


@pytest.mark.parametrize("kind,a0,a1", [ALGO_MISMATCH[1], ALGO_MISMATCH[2], ALGO_MISMATCH[3]])
def test_different_algorithms_on_the_first_call_is_a_mismatch(kind, a0, a1):
    """The mismatched call is the first of either algorithm: nothing is set up yet."""
    pairs = _pairs([(kind, a0, a1)])
    if not pairs:
        pytest.skip(f"{kind} lacks {a0} or {a1}")
    _edge("algo_mismatch", "cold", *pairs, POOLTENSOR_TIMEOUT="3")
