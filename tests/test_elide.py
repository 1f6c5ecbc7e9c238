"""Temporary elision (ops/elide.py): a chain of operators writes into its own temporaries,
never into anything a name, a container or a view can still see. Pinned against numpy's
values and against the pool's allocation counter."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import pooltensor as pt
from pooltensor.ops import elide
from conftest import pool_fixture, property_settings

pool = pool_fixture(1, 2)
PROPS = property_settings("POOLTENSOR_ELIDE_EXAMPLES", 30, "POOLTENSOR_ELIDE_DERANDOMIZE")
N = 100


def allocations(pool, fn):
    pt.ones(1) + 1                     # the one-time measurement of temporaries is done
    n0 = pool._next_id
    out = fn()
    return pool._next_id - n0, out


def test_a_chain_makes_one_array(pool):
    a, b, c = (pt.from_numpy(np.arange(N, dtype=np.float64) + k) for k in range(3))
    ra, rb, rc = (np.arange(N, dtype=np.float64) + k for k in range(3))
    made, y = allocations(pool, lambda: a * b + c - c / 2)
    assert made == 2, elide._TEMP               # a * b and c / 2; the rest in place
    np.testing.assert_array_equal(y.to_numpy(), ra * rb + rc - rc / 2)
    made, y = allocations(pool, lambda: -(np.sin(a) * 2 + b))
    assert made == 1
    np.testing.assert_array_equal(y.to_numpy(), -(np.sin(ra) * 2 + rb))
    made, y = allocations(pool, lambda: c + a * b)       # the temporary on the right
    assert made == 1
    np.testing.assert_array_equal(y.to_numpy(), rc + ra * rb)


def test_what_others_can_see_is_never_written(pool):
    a, b = pt.from_numpy(np.arange(N, dtype=np.float64)), pt.ones(N)
    ref = np.arange(N, dtype=np.float64)
    t = a * b
    made, u = allocations(pool, lambda: t + 1)                     # a name
    assert made == 1 and u is not t
    kept = [a * b]
    made, _ = allocations(pool, lambda: kept[0] + 1)             # a container
    assert made == 1
    v = a * b
    w = v[3:]                                                   # a view
    made, _ = allocations(pool, lambda: v + 1)
    assert made == 1
    made, _ = allocations(pool, lambda: (a * b).__add__(1))     # not an operator: no elision
    assert made == 2
    made, _ = allocations(pool, lambda: (a * b) * 2.5j)         # another dtype
    assert made == 2
    for x in (t, kept[0], v):
        np.testing.assert_array_equal(x.to_numpy(), ref)
    np.testing.assert_array_equal(w.to_numpy(), ref[3:])


@PROPS
@given(ops=st.lists(st.tuples(st.sampled_from(["+", "-", "*", "/", "neg"]),
                              st.sampled_from(["a", "b", "2", "0.5"]),
                              st.booleans()), min_size=1, max_size=6),
       dt=st.sampled_from([np.float32, np.float64, np.int64]))
def test_random_chains_match_numpy_and_leave_operands_alone(pool, ops, dt):
    ra, rb = np.arange(1, N + 1).astype(dt), (np.arange(N) % 7 + 1).astype(dt)
    env = {"a": pt.from_numpy(ra), "b": pt.from_numpy(rb), "np": np}
    ref = {"a": ra, "b": rb, "np": np}
    expr = "a"
    for op, other, right in ops:
        expr = f"(-{expr})" if op == "neg" else (
            f"({other} {op} {expr})" if right else f"({expr} {op} {other})")
    with np.errstate(all="ignore"):
        want = eval(expr, {}, ref)                              # noqa: S307  (built above)
        got = eval(expr, {}, env)                               # noqa: S307
    got = got.to_numpy() if hasattr(got, "to_numpy") else got
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(env["a"].to_numpy(), ra)
    np.testing.assert_array_equal(env["b"].to_numpy(), rb)
