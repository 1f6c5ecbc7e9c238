"""Shape functions in SPMD (every rank a member), run by tests/test_ops_shape.py under mpiexec
and the launcher: the cases of ops_shape_cases.py (derandomized, so every rank draws the same
ones; each first checks that the ranks agree on it) against numpy on every rank, reshape
copies and concatenate/stack written by every rank's own tiles, and every rank must read the
same result bytes.

    python -m collectives.launch -n 3 tests/scripts/ops_shape_spmd.py [EXAMPLES]
"""
import numpy as np

import ops_shape_cases as sc
import pooltensor as pt
from spmd_check import agree, examples, run_cases, start

EXAMPLES = examples(40)
pool, me, n, _ = start(memory=8 << 20)
count = (run_cases(EXAMPLES, sc.view_case(), lambda c: sc.check_view(c, pt))
         + run_cases(EXAMPLES, sc.join_case(), lambda c: sc.check_join(c, pt)))

# a big concatenation: each rank writes the tiles it homes, everyone reads all of it
ref = np.arange(4000, dtype=np.float64).reshape(100, 40)
x = pt.from_numpy(ref, placement="interleave")
y = np.concatenate([x, ref[:, :7], x.T.reshape(40, 100).T], axis=1)
want = np.concatenate([ref, ref[:, :7], ref], axis=1)
np.testing.assert_array_equal(y.to_numpy(), want)
homes = set(y.slab_members.tolist())
assert homes == set(range(n)), homes
agree("done")
print(f"rank {me}: ops shape spmd ok ({count} examples)", flush=True)
pt.finalize()
