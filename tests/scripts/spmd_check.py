"""What the SPMD test scripts share (pool_spmd.py, ops_*_spmd.py): the pool over every rank,
the hypothesis settings for examples batched in one run, and the checks that the ranks agree.

Every rank draws the same hypothesis examples only if every rank runs the same draws:
derandomized, no database, generation only, and the same modules loaded (hypothesis also draws
constants from the modules loaded so far, and rescans when that set changes), so start() loads
every module of pooltensor and collectives on every rank before any example is drawn.
"""
import hashlib
import importlib
import pkgutil
import sys

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

import collectives
import pooltensor as pt

SLAB = 64     # a few elements a slab: blocks start and end mid-row, operands mid-slab


def examples(default):
    """How many hypothesis examples: the script's first argument, else `default`."""
    return int(sys.argv[1]) if len(sys.argv) > 1 else default


def load_all_modules():
    """Import every module of pooltensor and collectives (see the module's docstring)."""
    for pkg in (pt, collectives):
        for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            if m.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(m.name)
            except ImportError:
                pass


def start(memory):
    """The pool over every rank (slabs of SLAB bytes, a cache of 8 slabs), SPMD, with every
    module loaded; returns (pool, this rank, the rank count, the world)."""
    pool = pt.init(slab_size=SLAB, memory=memory, cache_bytes=8 * SLAB)
    assert pool.role == "spmd", pool.role
    load_all_modules()
    return pool, pool.me, pool.size, pool.world


def batched(examples):
    """hypothesis settings for examples run in one SPMD run: the same examples on every rank,
    no time limits (ranks wait for each other), the first failure reported as it is."""
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                    report_multiple_bugs=False)


def _world():
    return pt.current().world


def agree(what):
    """Every rank is at the same step with the same arguments (else the ranks diverged)."""
    tag = hashlib.sha1(repr(what).encode()).hexdigest()
    tags = _world().allgather_object(tag)
    assert len(set(tags)) == 1, f"ranks diverged at {what!r}: {tags}"


def same_bytes(res, what=""):
    """Every rank holds the same bytes and dtype in `res` (a pool array, numpy array or
    scalar; None: nothing to compare)."""
    if res is None:
        return
    arr = np.ascontiguousarray(res.to_numpy() if hasattr(res, "to_numpy") else np.asarray(res))
    digest = hashlib.sha1(arr.tobytes() + str(arr.dtype).encode()).hexdigest()
    got = _world().allgather_object(digest)
    assert len(set(got)) == 1, f"ranks hold different results for {what!r}: {got}"


def run_cases(examples, strategy, check, key=repr):
    """check(case) for `examples` hypothesis cases of `strategy`, one at a time on every rank:
    the ranks first agree on the case (key(case): a text equal on every rank), then must hold
    the same bytes of what check returns, then sync. Returns how many cases ran."""
    count = [0]

    @batched(examples)
    @given(case=strategy)
    def run(case):
        count[0] += 1
        agree((count[0], key(case)))
        same_bytes(check(case), case)
        pt.sync()

    run()
    return count[0]
