"""Elementwise operations in SPMD (every rank a member), run by tests/test_ops_elementwise.py
under mpiexec and the launcher: ufuncs, operators, in-place operators on views, out=/where=,
astype/where/clip against numpy, every rank holding the same bytes afterwards; the executor's
collectives; then hypothesis cases batched in this one run (derandomized, so every rank draws
the same examples; each example first checks that the ranks agree on it).

    python -m collectives.launch -n 3 tests/scripts/ops_elementwise_spmd.py [EXAMPLES]
"""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import ops_elementwise_cases as oc
import pooltensor as pt
from pooltensor.ops import blocks, executor
from spmd_check import agree, batched, examples, same_bytes, start

EXAMPLES = examples(40)
pool, me, n, _ = start(memory=4 << 20)
assert executor.spmd(pool)


def check(got, want, approx=False, what=""):
    oc.assert_close(got, want, approx, what)
    same_bytes(got, what)
    pt.sync()                 # everyone has read before anyone writes again


# -- fixed cases ---------------------------------------------------------------------------------
a = oc.values((37, 23), np.float64, 1)
b = oc.values((23,), np.int8, 2)
x = pt.from_numpy(a, placement="interleave")
y = pt.from_numpy(b, placement="block")
check(x * y + 1, a * b + 1, what="x*y+1")
check(np.sin(x[3:, 5:]) - y[5:], np.sin(a[3:, 5:]) - b[5:], True, "mid-slab views")
check(3 - y, 3 - b, what="reflected")
try:
    2 ** y                          # negative powers: numpy's error, on every rank
    raise AssertionError("negative integer powers accepted")
except ValueError:
    pass
check((x > 0) & (y < 3), (a > 0) & (b < 3), what="comparisons")
assert (x * y).slab_members.tolist() == x.slab_members.tolist()

z = pt.from_numpy(a)
ref = a.copy()
z[1:] += z[:-1]                     # overlapping operand: copied first, numpy's result
ref[1:] += ref[:-1].copy()
check(z, ref, what="aliased +=")
z[:, ::2] *= y[::2]                 # in place on a strided view
ref[:, ::2] *= b[::2]
check(z, ref, what="strided *=")
try:
    y += 1.5
    raise AssertionError("int8 += float accepted")
except TypeError:
    pass
pt.sync()

o = pt.zeros((37, 23), np.float32)
mask = a > 0
np.add(x, 1, out=o, where=pt.from_numpy(mask))
check(o, np.where(mask, a + 1, 0).astype(np.float32), what="out= where=")
check(np.where(x > 0, x, y), np.where(a > 0, a, b), what="np.where")
check(np.clip(x, -1, 1), np.clip(a, -1, 1), what="clip")
check(x.astype(np.int16), a.astype(np.int16), what="astype")
q, r = np.divmod(x, 3)
check(r, np.divmod(a, 3)[1], what="divmod")

private = pt.from_numpy(a * (me + 1), access="private")    # one rank's own: no collective
p2 = private * 2
assert p2.access == "private" and set(p2.slab_members) == {me}
oc.assert_close(p2, a * (me + 1) * 2)

# the executor's collectives
assert executor.allreduce(np.float64(me + 1)) == n * (n + 1) / 2
got = executor.allgather({"rank": me})
assert got == [{"rank": r} for r in range(n)], got
got = executor.allgather(np.full(3, me, np.int32))
assert [g.tolist() for g in got] == [[r] * 3 for r in range(n)]
total = 0.0
count = 0
for index, blk in blocks.local_blocks(x[:, 1:]):
    total += float(blk.sum())
    count += blk.size
assert executor.allreduce(np.int64(count)) == a[:, 1:].size     # each element on one rank
assert np.isclose(executor.allreduce(np.float64(total)), a[:, 1:].sum())
pt.sync()

# -- property tests --------------------------------------------------------------------------------
counter = [0]


@batched(EXAMPLES)
@given(case=oc.ufunc_case(), inplace=st.booleans())
def prop(case, inplace):
    uf, specs = case
    counter[0] += 1
    agree((counter[0], uf.__name__, specs, inplace))
    got, want = oc.run_case(uf, specs, pt)
    if got is not None:
        same_bytes(got, (uf.__name__, specs))
    pt.sync()


prop()
agree("done")
print(f"rank {me}: ops elementwise spmd ok ({counter[0]} examples)", flush=True)
pt.finalize()
