"""Shape functions of pool arrays against numpy: reshape/ravel/flatten (a view exactly when
numpy gives one, else a copy), transpose, swapaxes, moveaxis, squeeze, expand_dims (views),
concatenate and stack (new pool arrays, pool and numpy inputs, mixed dtypes, out=).

Property tests (tests/scripts/ops_shape_cases.py) on pools of 1 and 3 members in this process
(slabs of 64 bytes, a cache of 8 slabs); the SPMD script runs the same cases on 2 and 3 ranks
under mpiexec and the launcher.
"""
import numpy as np
import pytest
from hypothesis import given

import ops_shape_cases as sc
import pooltensor as pt
from conftest import PAIRED_RUNS, check_ranks, pool_fixture, property_settings

PROPS = property_settings("OPS_EXAMPLES", 150, "OPS_DERANDOMIZE")

pytestmark = pytest.mark.timeout(300)

pool = pool_fixture(1, 3)


@PROPS
@given(case=sc.view_case())
def test_views_and_reshape_match_numpy(pool, case):
    sc.check_view(case, pt)


@PROPS
@given(case=sc.join_case())
def test_concatenate_and_stack_match_numpy(pool, case):
    sc.check_join(case, pt)


def test_reshape_view_writes_through(pool):
    x = pt.zeros((4, 6), np.int32)
    v = x.reshape(3, 8)
    assert v._a is x._a
    v[1, 2] = 7                                    # element 10 of the flat array
    assert x[1, 4] == 7
    t = x.T                                        # not C-contiguous: reshape copies
    c = t.reshape(-1)
    assert c._a is not x._a
    np.testing.assert_array_equal(c.to_numpy(), x.to_numpy().T.reshape(-1))
    with pytest.raises(ValueError):
        t.reshape(-1, copy=False)
    with pytest.raises(ValueError):
        x.reshape(5, 5)
    with pytest.raises(ValueError):
        x.reshape(-1, -1)
    assert x.ravel()._a is x._a and x.flatten()._a is not x._a
    assert x.T.ravel(order="K")._a is x._a         # memory order: no copy


def test_shape_errors_are_numpy_s(pool):
    x = pt.zeros((2, 3))
    with pytest.raises(np.exceptions.AxisError):
        x.transpose(0, 2)
    with pytest.raises(ValueError):
        x.transpose(0, 0)
    with pytest.raises(ValueError):
        np.concatenate([x, np.zeros((2, 4))], axis=0)
    with pytest.raises(np.exceptions.AxisError):
        np.concatenate([x, x], axis=2)
    with pytest.raises(ValueError):
        np.concatenate([x, np.zeros((2, 3, 1))])
    with pytest.raises(ValueError):
        np.stack([x, pt.zeros((3, 2))])
    with pytest.raises(ValueError):
        np.stack([])
    with pytest.raises(ValueError):
        np.concatenate([pt.zeros(()), x])
    with pytest.raises(ValueError):
        x.squeeze(axis=0)
    with pytest.raises(ValueError):
        pt.matrix_transpose(pt.zeros(3))


def test_array_api_names(pool):
    x = pt.arange(6).reshape(2, 3)
    assert pt.permute_dims(x, (1, 0)).shape == (3, 2)
    assert pt.matrix_transpose(x).shape == (3, 2)
    np.testing.assert_array_equal(pt.concat([x, x], axis=None).to_numpy(),
                                  np.concatenate([np.arange(6)] * 2))
    assert pt.expand_dims(x, 1).shape == (2, 1, 3)


@pytest.mark.timeout(400)
@PAIRED_RUNS
def test_spmd_shapes(launcher, n):
    p = check_ranks(launcher, n, "ops_shape_spmd.py", "60", timeout=360)
    assert p.stdout.count("ops shape spmd ok") == n, p.stdout
