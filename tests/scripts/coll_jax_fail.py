"""Failures inside a jitted collective (2 ranks started from POOLTENSOR_* variables, with a
short POOLTENSOR_TIMEOUT):
1. rank 1 skips a jitted allreduce: rank 0's fails with Timeout naming rank 1 within the
   world's timeout (jax.errors.JaxRuntimeError whose text names it; last_error() is the typed
   Timeout); after World.barrier() both ranks run jitted collectives again;
2. rank 1 SIGKILLs itself instead of a jitted call: rank 0 gets PeerLost naming it, well before
   the timeout.
"""
import os
import signal
import time

import jax
import jax.numpy as jnp

import collectives
import collectives.jax as cj

w = collectives.init()
f = jax.jit(lambda x: cj.allreduce(x))
x = jnp.ones(4, jnp.float32)
jax.block_until_ready(f(x))                 # the team exists, the fast path is bound
if w.rank == 0:
    t0 = time.monotonic()
    try:
        jax.block_until_ready(f(x))
        raise SystemExit("rank 0: the allreduce rank 1 skipped returned")
    except jax.errors.JaxRuntimeError as e:
        err = cj.last_error()
        assert "Timeout" in str(e) and isinstance(err, collectives.Timeout), (str(e), err)
        assert err.rank == 1, err
    took = time.monotonic() - t0
    assert took < w.timeout + 3, took
    print(f"timeout ok after {took:.1f} s", flush=True)
else:
    time.sleep(w.timeout + 1)
    print("skipped ok", flush=True)
w.barrier()                                  # rank 1 joins the epoch rank 0 started
assert float(f(x)[0]) == 2.0
if w.rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)
t0 = time.monotonic()
try:
    jax.block_until_ready(f(x))
    raise SystemExit("rank 0: an allreduce with a dead peer returned")
except jax.errors.JaxRuntimeError as e:
    err = cj.last_error()
    assert "PeerLost" in str(e) and isinstance(err, collectives.PeerLost), (str(e), err)
    assert err.rank == 1, err
took = time.monotonic() - t0
assert took < w.timeout, took
print(f"peer lost ok after {took:.2f} s", flush=True)
os._exit(0)  # the world is broken; skip the closing barrier
