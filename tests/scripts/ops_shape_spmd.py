"""Shape functions in SPMD (every rank a member), run by tests/test_ops_shape.py under mpiexec
and the launcher: the cases of ops_shape_cases.py (derandomized, so every rank draws the same
ones; each first checks that the ranks agree on it) against numpy on every rank, reshape
copies and concatenate/stack written by every rank's own tiles, and every rank must read the
same result bytes.

    python -m collectives.launch -n 3 tests/scripts/ops_shape_spmd.py [EXAMPLES]
"""
import hashlib
import importlib
import os
import pkgutil
import sys

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ops_shape_cases as sc  # noqa: E402

import collectives  # noqa: E402
import pooltensor as pt  # noqa: E402

EXAMPLES = int(sys.argv[1]) if len(sys.argv) > 1 else 40
SLAB = 64
pool = pt.init(slab_size=SLAB, memory=8 << 20, cache_bytes=8 * SLAB)
me, n, world = pool.me, pool.size, pool.world
assert pool.role == "spmd"


def agree(what):
    tag = hashlib.sha1(repr(what).encode()).hexdigest()
    tags = world.allgather_object(tag)
    assert len(set(tags)) == 1, f"ranks diverged at {what!r}: {tags}"


def same_bytes(res, what):
    if res is None:
        return
    arr = np.ascontiguousarray(res)
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
@given(case=sc.view_case())
def views(case):
    count[0] += 1
    agree((count[0], repr(case)))
    same_bytes(sc.check_view(case, pt), case)
    pt.sync()


@SETTINGS
@given(case=sc.join_case())
def joins(case):
    count[0] += 1
    agree((count[0], repr(case)))
    same_bytes(sc.check_join(case, pt), case)
    pt.sync()


views()
joins()

# a big concatenation: each rank writes the tiles it homes, everyone reads all of it
ref = np.arange(4000, dtype=np.float64).reshape(100, 40)
x = pt.from_numpy(ref, placement="interleave")
y = np.concatenate([x, ref[:, :7], x.T.reshape(40, 100).T], axis=1)
want = np.concatenate([ref, ref[:, :7], ref], axis=1)
np.testing.assert_array_equal(y.to_numpy(), want)
homes = set(y.slab_members.tolist())
assert homes == set(range(n)), homes
agree("done")
print(f"rank {me}: ops shape spmd ok ({count[0]} examples)", flush=True)
pt.finalize()
