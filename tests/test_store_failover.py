"""A store opened on memory servers reads on from another copy when the server its tensors
come from dies mid-read (whole replicas from replicate(), parts' copies from replicas=),
checked against the safetensors package's own reader; with no copy left, PeerLost names
the server. The servers are real `pooltensor serve` processes, killed in the tests' order."""
import signal
import threading
import time

import numpy as np
import pytest

import pooltensor as pt
from servers import ServerProc, make_secret
from stores import same

pytestmark = pytest.mark.timeout(120)
safetensors = pytest.importorskip("safetensors")
CACHE = 2 << 20


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(11)
    t = {"w": rng.standard_normal((3000, 2500)).astype(np.float32),     # ~29 MiB
         "h": rng.standard_normal((1031, 17)).astype(np.float16),
         "i": rng.integers(-9, 9, (4097,), dtype=np.int64)}
    path = tmp_path_factory.mktemp("failover") / "m.safetensors"
    save_file(t, str(path))
    return str(path)


def reference(path):
    from safetensors import safe_open
    with safe_open(path, framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    """Three memory servers and a client pool; the tests below kill 1, 2, then 3."""
    secret = make_secret(tmp_path_factory.mktemp("secret"))
    srv = [ServerProc("96MiB", secret) for _ in range(3)]
    try:
        for s in srv:
            s.ready()
        pool = pt.init(connect=[s.address for s in srv], secret_file=secret,
                       memory=4 << 20, cache_bytes=CACHE)
        yield pool, srv
        pt.finalize()
    finally:
        for s in srv:
            s.stop()


def serving(arr):
    return {m for m in arr._a.members}


def seen_lost(pool, rank):
    for _ in range(400):
        if rank in pool.world.lost():
            return
        time.sleep(0.025)
    raise AssertionError(f"server {rank} not seen lost")


def kill_mid_read(pool, proc, arr):
    """Read `arr` whole in a thread; stop the server `proc` once the read has fetched its
    first bytes (SIGSTOP: it serves nothing more), check the read is still going, then
    SIGKILL it. Returns what the read returned (or raised)."""
    got = {}

    def run():
        try:
            got["value"] = np.asarray(arr)
        except Exception as e:        # noqa: BLE001 (what the test checks)
            got["error"] = e
    base = pool.cache.bytes_fetched + pool.cache.misses
    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    while pool.cache.bytes_fetched + pool.cache.misses == base and t.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0)
    proc.signal(signal.SIGSTOP)
    midway = t.is_alive()
    proc.signal(signal.SIGKILL)
    proc.wait()
    t.join(60)
    assert not t.is_alive()
    assert midway, "the read was over before the server stopped"
    return got


def test_replicated_store_reads_on_after_its_server_dies(three, model):
    pool, srv = three
    ref = reference(model)
    pt.store.load_safetensors(model, name="m", placement=[1])
    pt.store.replicate("m", [2, 3])
    pt.store.put("r", ref, placement=[1, 2], replicas=2).close()    # parts' copies
    r = pt.store.open("r")
    s = pt.store.open("m")
    local = pt.store.open("m", local=True)       # from replica 2 (all on this machine)
    assert serving(s["w"]) == {1} and serving(local["w"]) == {2}
    got = kill_mid_read(pool, srv[0], s["w"])    # server 1 dies while "w" is read
    assert "error" not in got, got
    same(got["value"], ref["w"])
    assert 1 not in serving(s["w"])
    for k in ref:
        same(s[k], ref[k])
        same(r[k], ref[k])                       # its parts on 1 read from 2
    assert serving(r["w"]) == {2}
    r.close()
    pt.store.drop("r")
    got = kill_mid_read(pool, srv[1], local["w"])   # then server 2, under the local copy
    assert "error" not in got, got
    same(got["value"], ref["w"])
    for k in ref:
        same(s[k], ref[k])
        same(local[k], ref[k])
    assert serving(s["w"]) == serving(local["w"]) == {3}
    with pt.store.open("m") as again:            # a new open reads the copy left
        same(again["h"], ref["h"])
    s.close()
    local.close()


def test_no_copy_left_is_peer_lost_naming_the_server(three, model):
    pool, srv = three                            # (servers 1 and 2 were killed before)
    s = pt.store.open("m")                       # its last copy, on server 3
    got = kill_mid_read(pool, srv[2], s["w"])
    e = got.get("error")
    assert isinstance(e, pt.store.PeerLost), got
    assert e.rank == 3 and srv[2].address in str(e), str(e)
    assert "tensor 'w' of store 'm'" in str(e) and "memory server 3" in str(e), str(e)
    seen_lost(pool, 3)
    with pytest.raises(pt.store.PeerLost, match=srv[2].address.replace(".", r"\.")):
        np.asarray(s["h"])
    with pytest.raises(pt.store.PeerLost):
        pt.store.open("m")
