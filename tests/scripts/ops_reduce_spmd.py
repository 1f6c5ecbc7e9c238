"""Reductions and matrix products in SPMD (every rank a member), run by
tests/test_ops_reductions.py under mpiexec and the launcher: the cases of ops_reduce_cases.py
(derandomized, so every rank draws the same ones; each first checks that the ranks agree on
it), compared with numpy on every rank, and every rank must hold the same result bytes. The
first half runs with numpy results, the second with advanced_limit=64 so that nearly every
reduced array is a pool array (the output-driven path). Then a private array's reduction on
one rank alone (no collective), and a float32 sum over many slabs.

    python -m collectives.launch -n 3 tests/scripts/ops_reduce_spmd.py [EXAMPLES]
"""
import hashlib
import importlib
import os
import pkgutil
import sys

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops_reduce_cases as rc  # noqa: E402

import collectives  # noqa: E402
import pooltensor as pt  # noqa: E402

EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 40
SLAB = 64
pool = pt.init(slab_size=SLAB, memory=8 << 20, cache_bytes=8 * SLAB)
me, n, world = pool.me, pool.size, pool.world
assert pool.role == "spmd"


def agree(what):
    """Every rank is at the same step with the same arguments (else the ranks diverged)."""
    tag = hashlib.sha1(repr(what).encode()).hexdigest()
    tags = world.allgather_object(tag)
    assert len(set(tags)) == 1, f"ranks diverged at {what!r}: {tags}"


def same_bytes(res, what):
    """Every rank computed the same bytes."""
    if res is None:
        return
    arr = np.ascontiguousarray(np.asarray(res))
    digest = hashlib.sha1(arr.tobytes() + str(arr.dtype).encode()).hexdigest()
    got = world.allgather_object(digest)
    assert len(set(got)) == 1, f"ranks hold different results for {what!r}: {got}"


# hypothesis also draws constants from the modules loaded so far (and rescans when that set
# changes): load every module on every rank now, so a module one rank imports lazily later
# cannot make the ranks draw different examples
for _pkg in (pt, collectives):
    for _m in pkgutil.walk_packages(_pkg.__path__, _pkg.__name__ + "."):
        if not _m.name.endswith("__main__"):
            try:
                importlib.import_module(_m.name)
            except ImportError:
                pass

SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck),
                    report_multiple_bugs=False)
count = [0]


@SETTINGS
@given(case=rc.reduction_case())
def reductions(case):
    count[0] += 1
    agree((count[0], repr(sorted(case.items()))))
    res = rc.check_reduction(case, pt, pool.advanced_limit)
    same_bytes(res, case)
    pt.sync()


@SETTINGS
@given(case=rc.matmul_case())
def products(case):
    count[0] += 1
    agree((count[0], repr(sorted(case.items()))))
    res = rc.check_matmul(case, pt, pool.advanced_limit)
    same_bytes(res, case)
    pt.sync()


reductions()
products()
pool.advanced_limit = 64            # large results: pool arrays, each rank its own tiles
reductions()
products()
pool.advanced_limit = 64 << 20

# a private array is its rank's own: no collective, the other ranks go on
if me == n - 1:
    ref = np.arange(300, dtype=np.float64).reshape(30, 10)
    p = pt.from_numpy(ref, access="private")
    assert p.sum() == ref.sum()
    np.testing.assert_array_equal(p.max(axis=1), ref.max(axis=1))
    np.testing.assert_array_equal((p @ np.ones(10)).to_numpy(), ref.sum(axis=1))
    del p
pt.sync()

# a float32 sum over many slabs on every rank: partials combined in float64, same bytes
rng = np.random.default_rng(5)
ref = rng.uniform(0, 1, 30000).astype(np.float32)
x = pt.from_numpy(ref)
s = x.sum()
exact = ref.astype(np.float64).sum()
assert s.dtype == np.float32 and abs(float(s) - exact) <= 4 * np.finfo(np.float32).eps * exact
same_bytes(s, "float32 sum")
same_bytes(x.argmax(), "argmax")
assert x.argmax() == ref.argmax() and x.argmin() == ref.argmin()
agree("done")
print(f"rank {me}: ops reduce spmd ok ({count[0]} examples)", flush=True)
pt.finalize()
