"""A store made in a pool attached to Dask (pooltensor.dask.attach, worker processes) opened
by name in the workers' tasks: its values against the safetensors package's reader, a new
version published while a worker holds the old one, which is freed once that worker closes
it, and a dropped store a worker can no longer open."""
import hashlib
import time
import weakref

import numpy as np
import pytest

pytest.importorskip("distributed")
safetensors = pytest.importorskip("safetensors")
from distributed import Client, LocalCluster, get_worker  # noqa: E402

import pooltensor as pt  # noqa: E402
import pooltensor.dask as ptd  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def digest(a):
    return hashlib.sha256(np.ascontiguousarray(np.asarray(a)).view(np.uint8).tobytes()) \
        .hexdigest()


def _open(name, hold=False):
    """A task: open store `name` in this worker's pool and read every tensor; hold: keep it
    open (on the worker) for _read_held/_close_held."""
    s = pt.store.open(name)
    out = {"version": s.version, "me": ptd.process_pool().me,
           "tensors": {k: digest(a) for k, a in s.items()}, "list": pt.store.list()}
    if hold:
        get_worker().pooltensor_held = s
    else:
        s.close()
    return out


def _read_held():
    s = get_worker().pooltensor_held
    return {"version": s.version, "tensors": {k: digest(a) for k, a in s.items()}}


def _close_held():
    get_worker().pooltensor_held.close()
    del get_worker().pooltensor_held


def _missing(name):
    try:
        pt.store.open(name)
    except KeyError as e:
        return str(e)
    return None


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cl, Client(cl) as c:
        ptd.attach(c, memory="64MiB", timeout=30)
        try:
            yield c
        finally:
            ptd.detach()


def test_a_worker_opens_the_clients_store(client, tmp_path):
    from safetensors import safe_open
    from safetensors.numpy import save_file
    rng = np.random.default_rng(5)
    t = {"w": rng.standard_normal((700, 1500)).astype(np.float32),
         "b": rng.integers(0, 255, (3, 1000), dtype=np.uint8),
         "h": rng.standard_normal((17,)).astype(np.float16)}
    path = str(tmp_path / "m.safetensors")
    save_file(t, path)
    with safe_open(path, framework="numpy") as f:
        ref = {k: digest(f.get_tensor(k)) for k in f.keys()}
    workers = sorted(ptd.attached()[2], key=ptd.attached()[2].get)
    pt.store.load_safetensors(path, name="m", replicas=2).close()
    for w in workers:                  # each worker reads it (its own slabs in place)
        got = client.submit(_open, "m", hold=w == workers[0], workers=[w],
                            pure=False).result(timeout=60)
        assert got["tensors"] == ref and got["version"] == 1
        assert got["list"] == {"m": pt.store.list()["m"]}
    v1 = weakref.ref(pt.store.open("m")["w"]._a)       # (closed at once: a temporary)

    new = {k: np.asarray(v) + 1 for k, v in t.items()}
    pt.store.publish("m", new).close()
    got = client.submit(_open, "m", workers=[workers[1]], pure=False).result(timeout=60)
    assert got["version"] == 2 and got["tensors"] == {k: digest(v) for k, v in new.items()}
    assert got["list"]["m"]["version"] == 2
    import gc
    gc.collect()
    assert v1() is not None            # worker 1 still holds version 1: kept
    held = client.submit(_read_held, workers=[workers[0]], pure=False).result(timeout=60)
    assert held == {"version": 1, "tensors": ref}
    client.submit(_close_held, workers=[workers[0]], pure=False).result(timeout=60)
    for _ in range(400):               # the scheduler tells this process: freed
        gc.collect()
        if v1() is None:
            break
        time.sleep(0.025)
    assert v1() is None

    pt.store.drop("m")
    err = client.submit(_missing, "m", workers=[workers[1]], pure=False).result(timeout=60)
    assert err is not None and "no store named 'm'" in err
