"""Shared-memory direct algorithms: every rank reads its peers' staging slots in place
(native/src/team/team.c). One-shot: each rank reduces whole chunks; two-shot: each reduces 1/n of
every chunk, then all gather the pieces. Both reduce in rank order, so they agree bit for bit.
"""
from .. import _native
from ..errors import CollectiveMismatch, PeerLost, Timeout
from ..window import raise_native
from . import register

ALGO = {"oneshot": 1, "twoshot": 2}


def call(world, team, fn, *args, timeout=None):
    """Run a team call; turn its failure into the error naming the rank at fault."""
    timeout = world.timeout if timeout is None else timeout
    try:
        fn(*args, timeout)
    except _native.Error as e:
        status, who = e.args[0], e.args[3]
        rank = team.ranks[who] if 0 <= who < len(team.ranks) else None
        host = world.hosts[rank] if rank is not None else None
        if status == _native.ERR_MISMATCH:
            raise CollectiveMismatch(
                f"rank {world.rank} and rank {rank} called this collective with different "
                f"arguments (kind, shape, dtype, op or root)", rank=rank, host=host) from None
        if status == _native.ERR_TIMEOUT:
            raise Timeout(f"collective: rank {rank} did not arrive within {timeout} s",
                          rank=rank, host=host) from None
        if status == _native.ERR_PEER_LOST:
            raise PeerLost("collective: a rank is gone", rank=rank, host=host) from None
        raise_native(e, rank=rank, host=host, what="collective")


def _allreduce(name):
    def run(world, x, out, *, code, op, sig):
        team = world._get_team("world")
        call(world, team, team.native.allreduce, op, code, x, out, x.size, ALGO[name], sig)
    return run


for _name in ALGO:
    register("allreduce", _name)(_allreduce(_name))


@register("allgather", "shm")
def allgather(world, x, out, *, sig):
    team = world._get_team("world")
    call(world, team, team.native.allgather, x, out, x.nbytes, sig)


@register("reduce_scatter", "shm")
def reduce_scatter(world, x, out, *, code, op, sig):
    team = world._get_team("world")
    call(world, team, team.native.reduce_scatter, op, code, x, out, out.size, sig)


@register("broadcast", "shm")
def broadcast(world, x, out, *, root, sig):
    team = world._get_team("world")
    call(world, team, team.native.broadcast, team.ranks.index(root), out, out.nbytes, sig)
