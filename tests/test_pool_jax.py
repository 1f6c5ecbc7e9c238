"""Pool arrays to JAX without copies (pooltensor/jax.py): x.to_jax() shards at the slabs'
addresses (unsafe_buffer_pointer), the copied cases counted, a later write showing through,
the allocation pinned while the jax.Array lives, from_jax/asarray copying back; under SPMD
with a multi-process JAX, each rank's shard is its own slabs. Each runs in a process of its
own (JAX's device count is fixed when its backend starts).
"""
import importlib.util
import subprocess
import sys

import pytest

from conftest import SCRIPTS, check_ranks, rank_env

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                 reason="jax is not installed")]


def test_to_jax_zero_copy_aliasing_pinning_and_copies_counted():
    p = subprocess.run([sys.executable, str(SCRIPTS / "pool_jax.py")], env=rank_env(None),
                       capture_output=True, text=True, timeout=170)
    assert p.returncode == 0 and "pool jax ok" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("launcher", ["launch", "mpiexec"])
def test_spmd_ranks_contribute_their_slabs_as_shards(launcher):
    p = check_ranks(launcher, 2, "pool_jax_spmd.py", timeout=170)
    assert p.stdout.count("pool jax spmd ok") == 2, p.stdout
