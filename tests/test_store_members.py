"""replicate() in a plain script's pool (init(members=N): member processes on this machine):
whole copies on the members named, in a chain, read back against the safetensors package's
reader after the members holding the version's own slabs are SIGKILLed; the script's own
copy read in place with open(local=True); a source lost before: its replicas= copies are
read; with no copy left, ReplicationError names the member and leaves nothing behind."""
import gc
import signal
import time

import numpy as np
import pytest

import pooltensor as pt
from stores import same

pytestmark = pytest.mark.timeout(120)
safetensors = pytest.importorskip("safetensors")


@pytest.fixture
def model(tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import save_file
    rng = np.random.default_rng(2)
    t = {"w": rng.standard_normal((1200, 1100)).astype(np.float32),       # ~5 MiB
         "h": rng.standard_normal((33, 17)).astype(np.float16),
         "e": np.zeros((0, 4), np.int32)}
    path = str(tmp_path / "m.safetensors")
    save_file(t, path)
    with safe_open(path, framework="numpy") as f:
        return path, {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture
def pool():
    p = pt.init(members=4, memory=48 << 20, cache_bytes=2 << 20, timeout=20)
    yield p
    pt.finalize()


def kill(pool, m):
    pool._procs[m - 1].send_signal(signal.SIGKILL)
    pool._procs[m - 1].wait(20)
    for _ in range(400):
        if m in pool.keeper.gone:          # the pool's keeper saw it go
            return
        time.sleep(0.025)
    raise AssertionError(f"member {m} not seen lost")


def homes(s):
    return {m for a in s.values() for m in a._a.members}


def test_replicate_to_members_then_lose_the_source(pool, model):
    path, ref = model
    pt.store.load_safetensors(path, name="m", placement=[1]).close()
    where = pt.store.replicate("m", [2, 3, 0])
    assert where == [pool.world.hosts[m] for m in (2, 3, 0)]
    info = pt.store.list()["m"]
    assert info["full_replicas"] == 3 and info["replicas"] == 4
    with pt.store.open("m", local=True) as s:         # the script's own copy, in place
        assert homes(s) == {0}
        for k in ref:
            same(s[k], ref[k])
    pt.store.load_safetensors(path, name="k", placement=[1, 2], replicas=2).close()
    s = pt.store.open("m")
    assert homes(s) == {1}
    kill(pool, 1)                                     # the version's own slabs
    pt.store.replicate("k", [3, 0])                   # from the replicas= copies on 2
    with pt.store.open("k", local=True) as k:
        assert homes(k) == {0}
        for key in ref:
            same(k[key], ref[key])
    for k in ref:
        same(s[k], ref[k])
    assert homes(s) == {2}                            # the chain's first copy
    kill(pool, 2)
    with pt.store.open("m") as again:
        for k in ref:
            same(again[k], ref[k])
            same(s[k], ref[k])
    assert homes(s) == {3}
    s.close()


def test_no_copy_left_is_a_replication_error(pool, model):
    path, ref = model
    pt.store.load_safetensors(path, name="g", placement=[1]).close()
    gc.collect()
    pool.collect_frees()
    used = list(pool._used)
    kill(pool, 1)
    with pytest.raises(pt.store.ReplicationError, match=r"member 2 failed.*no copy left.*"
                       r"member 1 was lost") as e:
        pt.store.replicate("g", [2, 3])
    assert "of store 'g' has no copy left" in str(e.value) and e.value.__cause__ is None
    gc.collect()
    pool.collect_frees()
    assert pool._used == used                         # nothing left on 2 or 3
    assert pt.store.list()["g"]["full_replicas"] == 0
    with pytest.raises(ValueError, match="members"):
        pt.store.replicate("g", [7])
    with pytest.raises(KeyError):
        pt.store.replicate("nope", [2])
