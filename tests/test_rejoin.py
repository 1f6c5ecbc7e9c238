"""A memory server that restarts is rejoined by its client's pool (pooltensor/pool/rejoin.py):
its data is lost and says so (PeerRestarted on the arrays that were on it), new arrays work,
and a freed lost array gives its slabs back. The same when only the control connection drops
(the server frees what that connection held): a real forwarder (tests/proxy.py) carries it.
Real `pooltensor serve` processes; values compared with numpy."""
import os
import signal
import time

import numpy as np
import pytest

import pooltensor as pt
from collectives.errors import PeerLost, PeerRestarted
from proxy import Proxy
from servers import ServerProc, make_secret

pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20


def _until(cond, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def _exercise_after_loss(pool, x, old_len):
    """x was on the lost server: it raises; new arrays work; freeing x gives its slabs back."""
    with pytest.raises(PeerRestarted, match="restarted: the arrays that were on it are lost"):
        x.to_numpy()
    with pytest.raises(PeerRestarted):
        x[5:9] = 1.0
    ref = np.arange(old_len, dtype=np.float64) * 3
    y = pt.asarray(ref)
    np.testing.assert_array_equal(y.to_numpy(), ref)
    assert float(y.sum()) == float(ref.sum())
    free_before = pool.free_bytes()
    del x
    import gc
    gc.collect()
    z = pt.asarray(ref + 1)            # may take the lost array's slabs: not fenced any more
    np.testing.assert_array_equal(z.to_numpy(), ref + 1)
    return free_before


def test_restarted_server_is_rejoined_old_arrays_raise_new_ones_work(tmp_path):
    secret = make_secret(tmp_path)
    srv = ServerProc("16MiB", secret, port=0).ready()
    port = srv.port
    pt.finalize()
    pool = pt.init(connect=[srv.address], secret_file=secret, slab_size=1 << 16,
                   cache_bytes=1 << 18, timeout=10)
    srv2 = None
    try:
        n = (2 * MiB) // 8
        x = pt.asarray(np.arange(n, dtype=np.float64))
        np.testing.assert_array_equal(x[100:200].to_numpy(), np.arange(100, 200))
        os.kill(srv.pid, signal.SIGKILL)
        srv.wait()
        assert _until(lambda: pool.world._ctx.peer_lost(1), 10)
        with pytest.raises(PeerLost):
            x.to_numpy()
        # while it is down, a new array has nowhere to go: the loss is the cause, not a full
        # pool (a MemoryError here sent users looking for a leak)
        with pytest.raises(PeerLost, match="memory server 1 is lost") as e:
            pt.asarray(np.ones(1000))
        assert not isinstance(e.value, MemoryError)
        srv2 = ServerProc("16MiB", secret, port=port).ready()
        assert _until(lambda: pool.world.restarts[1] == 1, 20), "not rejoined"
        assert not pool.world._ctx.peer_lost(1)
        _exercise_after_loss(pool, x, n)
        del x
    finally:
        pt.finalize()
        srv.stop()
        if srv2 is not None:
            srv2.stop()


def test_dropped_control_connection_is_rejoined_the_same_way(tmp_path):
    secret = make_secret(tmp_path)
    srv = ServerProc("16MiB", secret, port=0).ready()
    px = Proxy("127.0.0.1", srv.port)          # the control connection goes through it
    pt.finalize()
    pool = pt.init(connect=[f"127.0.0.1:{px.port}"], secret_file=secret, slab_size=1 << 16,
                   cache_bytes=1 << 18, timeout=10)
    try:
        n = MiB // 8
        x = pt.asarray(np.arange(n, dtype=np.float64))
        assert float(x.sum()) == float(np.arange(n).sum())
        px.cut()                                # the server frees what it gave us
        srv.log.wait("disconnected", 10)
        assert _until(lambda: pool.world.restarts[1] == 1, 20), "not rejoined"
        _exercise_after_loss(pool, x, n)
        del x
    finally:
        pt.finalize()
        px.close()
        srv.stop()
