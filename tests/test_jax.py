"""collectives.jax: collectives inside jax.jit (XLA FFI handler in C, ordered by an effect token).

Multi-rank cases run tests/scripts/coll_jax_jit.py, every case of it in one launch per (launcher,
ranks): every collective x dtype x shape against the eager collectives, program order, divergent
order -> CollectiveMismatch on every rank, grad and vmap against references, jit of jit,
donation, barrier. One launch over tcp takes the path through Python. The single-process tests
pin the facts about XLA that the design rests on, and the failure paths (Timeout, PeerLost).
"""
import importlib.util
import signal

import numpy as np
import pytest

from conftest import check_ranks, run_env_ranks

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                                 reason="jax is not installed")]


def _handler_built():
    return importlib.util.find_spec("collectives._jaxffi") is not None


needs_handler = pytest.mark.skipif(not _handler_built(),
                                   reason="collectives._jaxffi was not built (no jaxlib headers)")


# every dtype on 2 ranks under the launcher; four of them (int8, uint64, bfloat16, float32)
# on the other runs: 1 and 2 ranks under mpiexec (the world made by MPI), 1 and 3 under the
# launcher (3: a count that is not a power of two; 4 ranks run the same handler and
# algorithms, and the eager matrix of test_collectives.py covers them)
RUNS = [("launch", 1, True), ("launch", 2, False), ("launch", 3, True),
        ("mpiexec", 1, True), ("mpiexec", 2, True)]


@needs_handler
@pytest.mark.parametrize("launcher,n,quick", RUNS)
def test_jit_collectives_against_eager(launcher, n, quick):
    env = {"POOLTENSOR_JAX_QUICK": "1"} if quick else None
    p = check_ranks(launcher, n, "coll_jax_jit.py", env=env, timeout=230)
    assert p.stdout.count("jax jit ok") == n, p.stdout
    assert p.stdout.count("bound': True") == n, p.stdout     # the handler's own path


@needs_handler
def test_jit_collectives_over_tcp_go_through_python():
    p = check_ranks("launch", 2, "coll_jax_jit.py", env={"POOLTENSOR_TRANSPORT": "tcp",
                                                         "POOLTENSOR_JAX_QUICK": "1"},
                    timeout=230)
    assert p.stdout.count("jax jit ok") == 2, p.stdout
    assert p.stdout.count("'fast': 0") == 2, p.stdout


def _recording():
    """Every call of the handler sent to a recorder of its 'algo' attribute."""
    import jax
    from collectives import _jaxffi
    from collectives.jax import bridge
    bridge.setup()
    seen = []
    _jaxffi.set_slow(lambda path, kind, op, dt, root, algo, *rest: seen.append(algo))
    _jaxffi.bind(0, 0, 0, 0.0)
    return jax, seen


def _plain_call(jax, x, tag, side_effect=True):
    return jax.ffi.ffi_call("pooltensor_collective", jax.ShapeDtypeStruct(x.shape, x.dtype),
                            has_side_effect=side_effect)(
        x, kind=np.int64(1), op=np.int64(0), dtype=np.int64(10), root=np.int64(0),
        algo=np.int64(tag), sig=np.int64(0), tsig=np.int64(0), isroot=np.int64(0))


@needs_handler
def test_order_holds_where_side_effects_alone_do_not(tmp_path):
    """Three calls whose first input is computed last: XLA runs plain side-effecting custom
    calls as their inputs become ready (2, 3, 1), our token-ordered calls in program order."""
    jax, seen = _recording()
    import jax.numpy as jnp
    from collectives import _jaxffi
    from collectives.jax import primitives, bridge

    class W:
        rank, size = 0, 1
    a, b, c = jnp.ones((400, 400), jnp.float32), jnp.ones(16, jnp.float32), jnp.ones(4)

    def plain(a, b, c):
        a = (a @ a @ a)[0]
        return _plain_call(jax, a, 1), _plain_call(jax, b * 2, 2), _plain_call(jax, c * 3, 3)

    def ordered(a, b, c):
        a = (a @ a @ a)[0]
        outs = []
        for tag, v in ((1, a), (2, b * 2), (3, c * 3)):
            p = primitives.params(W, "allreduce", v.shape, v.dtype, "sum")
            p["algo"] = tag
            outs.append(primitives.collective_p.bind(v, **p))
        return outs

    try:
        runs = []
        for fn in (plain, ordered):
            f = jax.jit(fn)
            order = []
            for _ in range(3):
                seen.clear()
                jax.block_until_ready(f(a, b, c))
                order.append(list(seen))
            runs.append(order)
    finally:
        _jaxffi.set_slow(bridge._slow)
    assert runs[1] == [[1, 2, 3]] * 3, runs
    if all(o == [1, 2, 3] for o in runs[0]):
        pytest.skip("this XLA kept plain side-effecting calls in order too: the token is "
                    "still what guarantees it")
    assert sorted(runs[0][0]) == [1, 2, 3]


@needs_handler
def test_unused_results_are_kept_only_with_side_effects():
    jax, seen = _recording()
    import jax.numpy as jnp
    from collectives import _jaxffi
    from collectives.jax import bridge, primitives

    class W:
        rank, size = 0, 1
    x = jnp.ones(8, jnp.float32)
    try:
        jax.block_until_ready(jax.jit(lambda x: (_plain_call(jax, x, 7, False), x + 1)[1])(x))
        dropped = list(seen)
        seen.clear()

        def kept(x):
            primitives.collective_p.bind(x, **primitives.params(W, "allreduce", (8,),
                                                                np.float32, "sum"))
            return x + 1
        jax.block_until_ready(jax.jit(kept)(x))
    finally:
        _jaxffi.set_slow(bridge._slow)
    assert dropped == [] and len(seen) == 1, (dropped, seen)


@needs_handler
def test_jit_timeout_and_peer_lost_name_the_rank():
    """Rank 1 skips a jitted allreduce: rank 0's fails with Timeout naming rank 1 within the
    world's timeout, then both go on; then rank 1 is killed inside a jitted call: PeerLost."""
    codes, outs = run_env_ranks(2, "coll_jax_fail.py", env={"POOLTENSOR_TIMEOUT": "3"},
                                timeout=120)
    assert codes[1] == -signal.SIGKILL, outs[1]
    assert codes[0] == 0, outs[0]
    assert "timeout ok" in outs[0] and "skipped ok" in outs[1], outs
    assert "peer lost ok" in outs[0], outs[0]


def test_main_extension_builds_without_jax(tmp_path):
    """setup.py leaves the FFI handler out where jaxlib is absent ($POOLTENSOR_NO_JAX stands in
    for that): the list of extensions then names only collectives._native."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    code = ("import sys, setuptools; setuptools.setup = lambda **kw: print([e.name for e in "
            "kw['ext_modules']]); sys.argv = ['setup.py']; exec(open('setup.py').read())")
    for env, want in (({"POOLTENSOR_NO_JAX": "1"}, ["collectives._native"]),
                      ({}, ["collectives._native", "collectives._jaxffi"])):
        import os
        p = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                           text=True, env={**os.environ, **env}, timeout=60)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == str(want), p.stdout


@needs_handler
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_finalize_waits_for_dispatched_jitted_collectives(transport):
    """JAX returns from a jitted call before its program ran; finalize() right after must
    let the program's collectives finish first (with the wait taken out, rank 0's program
    meets a finalized world: seen failing so)."""
    env = {"POOLTENSOR_TRANSPORT": "tcp"} if transport == "tcp" else None
    p = check_ranks("launch", 2, "coll_jax_finalize.py", env=env, timeout=120)
    assert p.stdout.count("jax finalize ok") == 2, p.stdout


@needs_handler
def test_data_parallel_example_trains_and_stays_identical():
    """examples/jax_dp.py under mpiexec -n 2: the loss falls and the parameters end bit for
    bit the same on both ranks (the script exits non-zero otherwise)."""
    import sys
    from pathlib import Path
    from conftest import mpiexec, mpiexec_cmd, rank_env
    import subprocess
    if mpiexec() is None:
        pytest.skip("mpiexec not found (pip install mpich mpi4py)")
    example = Path(__file__).resolve().parent.parent / "examples" / "jax_dp.py"
    p = subprocess.run([*mpiexec_cmd(2), sys.executable, str(example), "--steps", "40"],
                       env=rank_env(None), capture_output=True, text=True, timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "bit-identical on every rank: True" in p.stdout and "(fell)" in p.stdout, p.stdout
