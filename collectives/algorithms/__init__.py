"""Collective algorithms behind one selection function.

An algorithm is a function (world, input array, output array, **options) registered for a kind
of collective under a name. select() chooses one from the message size and the topology;
`algorithm=` or POOLTENSOR_ALGO override the choice. The thresholds come from bench/collectives.py
runs (see bench/README.md).
"""

from .. import env
from ..errors import TransportError
from ..world import FORCED_ALGO, current

_REGISTRY = {}   # (kind, name) -> function

# Thresholds measured with bench/collectives.py (float32 sum, 2 and 4 ranks on one host).
ONESHOT_MAX = env.number("POOLTENSOR_ONESHOT_MAX", 64 * 1024)
# Recursive doubling wins over the ring for small messages once there are several hops.
RECURSIVE_MAX = 32 * 1024
# POOLTENSOR_ALGO, read once by the world (which needs it too, to let the team decide alone)
ENV_ALGO = FORCED_ALGO


def digest(name):
    """A per-algorithm number mixed into a call's digest, so ranks that chose different
    algorithms are told so instead of waiting for each other. 1 and 2 are one-shot and
    two-shot, as the native team numbers them."""
    d = _DIGESTS.get(name)
    if d is None:
        d = _DIGESTS[name] = {"oneshot": 1, "twoshot": 2}.get(name) or (sum(map(ord, name)) << 8)
    return d


_DIGESTS = {}


def register(kind, name):
    """Decorator: make `fn` the algorithm `name` for collectives of `kind`."""
    def deco(fn):
        _REGISTRY[(kind, name)] = fn
        return fn
    return deco


# algorithms whose reduction order is rank order whatever the chunking or placement
DETERMINISTIC = {"oneshot", "twoshot", "shm", "ordered", "direct"}
# algorithms of the native shared-memory team: they need one team over every rank
TEAM = {"oneshot", "twoshot", "shm"}
# stands in for the team's rank-order algorithms where no team spans the ranks
NO_TEAM = {"ordered"}


def usable(name, world):
    """Whether algorithm `name` runs in `world` (the team's need shared memory between all)."""
    shm = world is None or world._shm_world
    return (name not in TEAM or shm) and (name not in NO_TEAM or not shm or world is None)


def names(kind, world=None):
    """The algorithms for `kind` that run in `world` (default: the open World, if any; with
    none, every registered one)."""
    if world is None:
        world = current()
    return sorted(n for k, n in _REGISTRY if k == kind and usable(n, world))


def select(kind, nbytes, world, algorithm="auto", deterministic=False):
    """The algorithm to run: explicit argument, else POOLTENSOR_ALGO, else by size and topology."""
    algorithm = algorithm or "auto"
    if algorithm == "auto":
        # the variable names one algorithm for every kind; kinds without it choose for themselves
        if ENV_ALGO and (kind, ENV_ALGO) in _REGISTRY:
            algorithm = ENV_ALGO
        elif ENV_ALGO and not any(n == ENV_ALGO for _, n in _REGISTRY):
            raise ValueError(f"POOLTENSOR_ALGO={ENV_ALGO!r} names no algorithm; known: "
                             f"{sorted({n for _, n in _REGISTRY})}")
    if algorithm != "auto":
        if (kind, algorithm) not in _REGISTRY:
            raise ValueError(f"unknown {kind} algorithm {algorithm!r}: choose 'auto' or one of "
                             f"{names(kind)}")
        if deterministic and algorithm not in DETERMINISTIC:
            raise ValueError(f"deterministic=True needs a fixed reduction order; algorithm "
                             f"{algorithm!r} does not have one (use 'auto', 'oneshot', "
                             f"'twoshot', 'ordered' or 'direct')")
        if algorithm in TEAM and not world._shm_world:
            raise ValueError(f"{kind} algorithm {algorithm!r} needs every rank to share memory "
                             f"(one machine, no POOLTENSOR_TRANSPORT=tcp); here choose 'auto' "
                             f"or one of {names(kind, world)}")
        return algorithm
    # several topology hosts (a global property: every rank decides alike): within each host
    # over shared memory, between the host leaders over windows
    if world.local_size < world.size and not deterministic and (kind, "hierarchical") in _REGISTRY:
        # unless every host has one rank: nothing to do within hosts, the window algorithms
        # below run over every rank (the channel's host list is the same on every rank; it is
        # made here on first use)
        if not (world.local_size == 1 and len(channel.get(world).hosts) == world.size):
            return "hierarchical"
    if not world._shm_world:
        # no shared-memory team spans the ranks: the algorithms written over windows, which
        # run over whatever transport reaches each peer; small messages among few ranks in
        # one round trip, every input straight to every rank (direct.py)
        if (kind, "direct") in _REGISTRY and direct.size_ok(world, nbytes):
            return "direct"
        if deterministic and (kind, "ordered") in _REGISTRY:
            return "ordered"
        if not deterministic:
            if kind in ("allreduce", "allgather") and nbytes <= RECURSIVE_MAX \
                    and (kind, "recursive_doubling") in _REGISTRY:
                return "recursive_doubling"
            if (kind, "ring") in _REGISTRY:
                return "ring"
        raise TransportError(f"no {kind} algorithm for ranks that do not share memory",
                             rank=world.rank, host=world.host)
    if kind != "allreduce":
        return "shm"
    return "oneshot" if nbytes <= ONESHOT_MAX else "twoshot"


def run(kind, name, world, x, out, **opts):
    """Run algorithm `name` for `kind` on this rank's input x into out."""
    return _REGISTRY[(kind, name)](world, x, out, **opts)


from . import shm  # noqa: E402,F401  (registers the shared-memory algorithms)
from . import channel, ring, recursive, hierarchical, ordered, direct  # noqa: E402,F401
