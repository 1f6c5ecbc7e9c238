"""Reductions and matrix products in SPMD (every rank a member), run by
tests/test_ops_reductions.py under mpiexec and the launcher: the cases of ops_reduce_cases.py
(derandomized, so every rank draws the same ones; each first checks that the ranks agree on
it), compared with numpy on every rank, and every rank must hold the same result bytes. The
first half runs with numpy results, the second with advanced_limit=64 so that nearly every
reduced array is a pool array (the output-driven path). Then a private array's reduction on
one rank alone (no collective), and a float32 sum over many slabs.

    python -m collectives.launch -n 3 tests/scripts/ops_reduce_spmd.py [EXAMPLES]
"""
import numpy as np

import ops_reduce_cases as rc
import pooltensor as pt
from spmd_check import agree, examples, run_cases, same_bytes, start

EXAMPLES = examples(40)
pool, me, n, _ = start(memory=8 << 20)


def by_items(case):
    return repr(sorted(case.items()))


def both():
    """The reduction and matrix product cases; how many ran."""
    return (run_cases(EXAMPLES, rc.reduction_case(),
                      lambda c: rc.check_reduction(c, pt, pool.advanced_limit), by_items)
            + run_cases(EXAMPLES, rc.matmul_case(),
                        lambda c: rc.check_matmul(c, pt, pool.advanced_limit), by_items))


count = both()
pool.advanced_limit = 64            # large results: pool arrays, each rank its own tiles
count += both()
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
print(f"rank {me}: ops reduce spmd ok ({count} examples)", flush=True)
pt.finalize()
