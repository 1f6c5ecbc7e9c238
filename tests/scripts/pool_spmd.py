"""The pool in SPMD (every rank a member), run by tests/test_pool_spmd.py under mpiexec and
the launcher: same placement everywhere, one-sided indexing, element-precise concurrent
writes, sync() visibility and revalidation, access modes, collective frees, and hypothesis
property tests batched in this one run (derandomized, so every rank draws the same examples;
each example first checks that the ranks agree on it).

    python -m collectives.launch -n 3 tests/scripts/pool_spmd.py [EXAMPLES]
"""
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import pool_strategies as ps
import pooltensor as pt
from collectives.errors import RemoteAccessError
from spmd_check import SLAB, agree, batched, examples, start

EXAMPLES = examples(60)
pool, me, n, world = start(memory=4 << 20)
assert pool.coherent == (n > 1)


# -- placement: the same on every rank, without messages --------------------------------------
for policy in ["block", "interleave", "balanced", [n - 1]]:
    x = pt.zeros(50 * SLAB // 8, placement=policy)
    homes = world.allgather_object(list(map(int, x.slab_members)))
    assert all(h == homes[0] for h in homes), (policy, homes)
del x
if n > 1:
    try:
        pt.zeros(10, placement="local")    # the calling member: a different one on each rank
        raise AssertionError("placement='local' accepted in SPMD")
    except ValueError as e:
        assert "collective" in str(e)

# -- concurrent element-precise writes into shared slabs ----------------------------------------
for dtype in (np.int8, np.float64, np.complex64):
    x = pt.zeros((37, 23), dtype, placement="interleave")
    ref = np.zeros((37, 23), dtype)
    for r in range(n):
        ref[:, r::n] = r + 1          # columns: neighbouring elements of one slab
    x[:, me::n] = me + 1
    pt.sync()
    np.testing.assert_array_equal(x.to_numpy(), ref)
    pt.sync()
    for r in range(n):
        ref[r::n, 5] = -(r + 1)       # rows of one column: one element per row
    x[me::n, 5] = -(me + 1)
    pt.sync()
    np.testing.assert_array_equal(x.to_numpy(), ref)
    pt.sync()                         # everyone has read before anyone writes again
    v = x.T[::-2]                     # writes through a view, concurrently again
    v[me::n] = 10 * (me + 1)
    rv = ref.T[::-2]
    for r in range(n):
        rv[r::n] = 10 * (r + 1)
    pt.sync()
    np.testing.assert_array_equal(x.to_numpy(), ref)
    pt.sync()

# -- sync makes writes visible and drops stale cached copies ----------------------------------
x = pt.arange(40 * SLAB // 8, dtype=np.int64, placement="block")
before = x.to_numpy()                 # every rank caches the slabs it does not home
pt.sync()                             # (everyone has read before rank 0 writes)
if me == 0:
    x[...] = -x.to_numpy()            # one rank rewrites everything (homes elsewhere too)
pt.sync()
np.testing.assert_array_equal(x.to_numpy(), -before)
pt.sync()

# -- writes through a zero-copy numpy view of local memory are seen after sync -------------------
E = SLAB // 8
x = pt.zeros(n * E, dtype=np.int64, placement="block")      # one slab per rank
x.to_numpy()                                                 # everyone caches the others' slabs
pt.sync()
v = x[me * E:(me + 1) * E].to_numpy()                        # my slab: a numpy view, no copy
assert v.flags.writeable
v[:] = me + 100                                              # plain numpy writes
pt.sync()
np.testing.assert_array_equal(x.to_numpy(), np.repeat(np.arange(n) + 100, E))
del v
pt.sync()

# -- access modes ----------------------------------------------------------------------------------
ref = np.arange(30 * SLAB // 8, dtype=np.float64)
r = pt.from_numpy(ref, access="readonly", placement="interleave")
np.testing.assert_array_equal(r.to_numpy(), ref)
try:
    r[0] = 1
    raise AssertionError("readonly accepted a write")
except ValueError:
    pass
assert pool.win_ro_init is None                 # SPMD: no writable window onto readonly heaps
if n > 1:
    other = (me + 1) % n
    k = list(r._a.members).index(other)
    try:
        pool.win_ro.put(other, r._a.slots[k] * SLAB, np.zeros(8, np.uint8))
        raise AssertionError("the target accepted a write into readonly memory")
    except RemoteAccessError:
        pass
pt.sync()
np.testing.assert_array_equal(r.to_numpy(), ref)
if me == n - 1:                                  # private: not collective, lives here only
    p = pt.from_numpy(ref, access="private")
    assert set(p.slab_members) == {me}
    p[3] = 7
    assert p[3] == 7
    del p
pt.sync()

# -- random numbers do not depend on the member count ----------------------------------------------
from pooltensor.random import BLOCK  # noqa: E402
y = pt.random.random(BLOCK + 99, seed=3, placement="interleave")
want = np.concatenate([np.random.default_rng([3, 0]).random(BLOCK),
                       np.random.default_rng([3, 1]).random(99)])
np.testing.assert_array_equal(y.to_numpy()[BLOCK:], np.random.default_rng([3, 1]).random(BLOCK)[:99])
np.testing.assert_array_equal(y.to_numpy()[:BLOCK], want[:BLOCK])
del y

# -- frees are agreed, and out of memory is raised on every rank -------------------------------
pt.sync()
free0 = pool.free_bytes()
for i in range(5):
    t = pt.ones(100 * SLAB // 8)
    del t
pt.sync()
assert pool.free_bytes() == free0, (pool.free_bytes(), free0)
try:
    pt.zeros(sum(free0) // 8 + 1)
    raise AssertionError("no PoolOutOfMemory")
except pt.PoolOutOfMemory as e:
    assert set(e.free) == set(range(n))
pt.sync()

# -- property tests: indexing and assignment against numpy ---------------------------------------
count = [0]


@batched(EXAMPLES)
@given(c=ps.case(), placement=st.sampled_from(["block", "interleave", "balanced"]),
       data=st.data())
def check(c, placement, data):
    shape, dtype, index = c
    count[0] += 1
    agree((count[0], shape, str(dtype), repr(index), placement))
    ref = ps.reference(shape, dtype)
    x = pt.from_numpy(ref, placement=placement)
    want, werr = ps.outcome(lambda: ref[index])
    got, gerr = ps.outcome(lambda: x[index])
    assert gerr == werr, (index, gerr, werr)
    if werr is None:
        ps.assert_same(got, want, index)
        pt.sync()                     # everyone has read before the writer writes
        value = data.draw(ps.value_for(np.shape(want), dtype))
        writer = count[0] % n
        ref[index] = value
        if me == writer:
            x[index] = value
        pt.sync()
        ps.assert_same(x.to_numpy(), ref, (index, writer))
    pt.sync()


check()
agree("done")
print(f"rank {me}: pool spmd ok ({count[0]} examples)", flush=True)
pt.finalize()
