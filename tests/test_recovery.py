"""After a collective fails on one rank: every rank fails it, and the world recovers.

Real ranks under our launcher and under mpiexec, over shared memory and over tcp
(POOLTENSOR_TRANSPORT=tcp, and between network namespaces), with a short POOLTENSOR_TIMEOUT.
The scripts are tests/scripts/coll_recover.py (phases: a late, skipping, stopped or mismatched
last rank, each followed by a World.barrier() and a correct call of every collective, checked
against numpy), coll_finalize.py and coll_leave.py.
"""
import time

import pytest

from conftest import check_ranks, run_env_ranks, run_ranks
from netns import netns  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.timeout(150)

T = "2"     # POOLTENSOR_TIMEOUT of these tests, in seconds

CASES = [
    ("launch", 2, "shm", ["first:allreduce", "late:barrier", "mismatch", "skip:allgather"]),
    ("launch", 3, "shm", ["late:allgather", "late:reduce_scatter", "late:broadcast",
                          "stop:allreduce"]),
    ("mpiexec", 2, "shm", ["first:barrier", "late:allreduce", "skip:broadcast"]),
    ("mpiexec", 3, "tcp", ["late:allreduce", "stop:allgather"]),
    ("launch", 2, "tcp", ["first:allreduce", "late:broadcast", "mismatch", "stop:allreduce"]),
    ("launch", 3, "tcp", ["late:allgather", "late:barrier", "skip:reduce_scatter"]),
]


@pytest.mark.parametrize("launcher,n,transport,phases", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_given_up_call_fails_everywhere_and_the_world_recovers(launcher, n, transport, phases):
    """The ranks on time get Timeout naming the odd rank within the timeout (plus a small
    margin: over tcp it used to be twice the timeout for a stopped peer); a rank that comes
    later fails at once, naming the call and the rank that gave up (not an internal store
    tag); every rank reports the same outcome; a World.barrier() later every collective works
    again (it used to time out on every later call)."""
    env = {"POOLTENSOR_TIMEOUT": T}
    if transport == "tcp":
        env["POOLTENSOR_TRANSPORT"] = "tcp"
    p = check_ranks(launcher, n, "coll_recover.py", *phases, env=env, timeout=140)
    for ph in phases:
        assert p.stdout.count(f"{ph} ok") == n, p.stdout
    assert p.stdout.count("recover ok") == n, p.stdout


def test_across_network_namespaces(netns):
    """Two hosts (tcp between namespaces): the same promises."""
    from test_netns import check_ns_ranks
    outs = check_ns_ranks([0, 1], "coll_recover.py", "late:allreduce", "stop:allgather",
                          "late:barrier", env={"POOLTENSOR_TIMEOUT": T}, timeout=120)
    assert all("recover ok" in o for o in outs), outs


@pytest.mark.parametrize("cut,pause,sound", [("0", "0", "4"), ("3", "0", "4"),
                                             ("0.3", "1", "6")])
def test_record_lost_in_a_partition_leaves_the_world_usable(cut, pause, sound):
    """A rank gives up a call its peer completed (a partition starting right after its own
    data left) and its record of it is dropped for `cut` s (longer than the timeout: a
    partition). The ranks used to stay one call apart for good: the next calls met the wrong
    call of the other rank (a wrong sum, or a mismatch every time). Now one more call fails
    on both (typed, within the timeout) and every call after it is right; none fails where
    the record, written again after the partition, comes before rank 0's next call
    (`pause`)."""
    codes, outs = run_env_ranks(2, "coll_lost_record.py", cut, "8", sound, pause,
                                env={"POOLTENSOR_TIMEOUT": T, "POOLTENSOR_TRANSPORT": "tcp"},
                                timeout=100)
    assert codes == [0, 0], outs
    assert "rank 0: call 2 ok" in outs[0] and "rank 1: call 2 Timeout" in outs[1], outs
    if pause != "0":
        assert "gave up collective call 2, which rank 0 had completed" in outs[0], outs


@pytest.mark.parametrize("launcher", ["launch", "mpiexec"])
def test_collectives_after_finalize_raise_and_init_starts_again(launcher):
    """They used to make a new world behind the user's back (racing, then out of step), and
    collectives.barrier() returned after its timeout with no error."""
    p = check_ranks(launcher, 2, "coll_finalize.py", env={"POOLTENSOR_TIMEOUT": "5"},
                    timeout=60)
    assert p.stdout.count("finalize ok") == 2, p.stdout


def test_no_rendezvous_warning_when_leaving_on_an_error():
    """A rank whose Timeout goes uncaught leaves at once: it used to wait out the store's
    timeout for its peers and then warn that it 'waited 0.05 s for store key ...'."""
    p = run_ranks("launch", 2, "coll_leave.py", "uncaught", env={"POOLTENSOR_TIMEOUT": T},
                  timeout=60)
    assert p.returncode == 1, p.stderr
    assert "Timeout" in p.stderr, p.stderr
    assert "rendezvous" not in p.stderr and "store key" not in p.stderr, p.stderr


def test_rendezvous_warning_names_the_rank_still_there():
    """Rank 0 finished while rank 1 stays past the timeout: one warning, naming rank 1 and the
    time really waited (not the last slice of the wait), and no noise from rank 1."""
    t0 = time.monotonic()
    codes, outs = run_env_ranks(2, "coll_leave.py", "linger", env={"POOLTENSOR_TIMEOUT": T})
    assert codes == [0, 0], outs
    assert "rank(s) 1 had not left the rendezvous after 2 s" in outs[0], outs[0]
    assert "waited 0." not in outs[0] and outs[0].count("RuntimeWarning") == 1, outs[0]
    assert "RuntimeWarning" not in outs[1] and "rendezvous" not in outs[1], outs[1]
    assert time.monotonic() - t0 < 30
