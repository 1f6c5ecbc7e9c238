"""pooltensor.store: safetensors round trips against the safetensors package's own reader,
stores on memory servers opened by other processes (and from another network namespace)
after the loader left, versions published while readers hold the old one, damaged files."""
import hashlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import pooltensor as pt
from netns import ns_cmd, netns  # noqa: F401  (the session fixture)
from servers import SCRIPTS, ServerProc, env, make_secret
from stores import same

pytestmark = pytest.mark.timeout(120)
safetensors = pytest.importorskip("safetensors")

NUMPY_DTYPES = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64",
                "int64", "float16", "float32", "float64"]
SHAPES = [(), (0,), (1, 1, 1), (3, 5, 7), (1031,), (17, 33)]
CACHE = 2 << 20                 # the big tensor is larger than this pool's slab cache


def _tensors(rng):
    t = {}
    for i, dt in enumerate(NUMPY_DTYPES):
        shape = SHAPES[i % len(SHAPES)]
        if dt == "bool":
            t[f"t_{dt}"] = np.asarray(rng.random(shape) > 0.5)
        elif dt.startswith(("int", "uint")):
            info = np.iinfo(dt)
            t[f"t_{dt}"] = rng.integers(info.min, info.max, shape, dtype=dt, endpoint=True)
        else:
            t[f"t_{dt}"] = (rng.standard_normal(shape) * 100).astype(dt)
    t["big"] = rng.standard_normal((700, 1100)).astype(np.float32)       # ~3 MiB
    return t


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """Two safetensors files (a checkpoint in shards): every numpy dtype, odd shapes and one
    tensor bigger than the cache (safetensors' numpy writer); bfloat16 and float8 (its flax
    writer: numpy's knows neither)."""
    import jax.numpy as jnp
    from safetensors.flax import save_file as save_flax
    from safetensors.numpy import save_file
    rng = np.random.default_rng(7)
    t = _tensors(rng)
    d = tmp_path_factory.mktemp("store")
    save_file(t, str(d / "model-1.safetensors"), metadata={"m": "1"})
    t2 = {"bf16": rng.standard_normal((129, 3)).astype(ml_dtypes.bfloat16),
          "f8": rng.standard_normal((5, 9)).astype(ml_dtypes.float8_e4m3fn)}
    save_flax({k: jnp.asarray(v) for k, v in t2.items()}, str(d / "model-2.safetensors"))
    return [str(d / "model-1.safetensors"), str(d / "model-2.safetensors")], dict(t, **t2)


def reference(paths):
    """Every tensor as the safetensors package reads it (numpy; flax for bfloat16, whose
    numpy reader refuses it); the 8-bit float, which neither reads, is left out."""
    from safetensors import safe_open
    out = {}
    with safe_open(paths[0], framework="numpy") as f:
        for k in f.keys():
            out[k] = f.get_tensor(k)
    with safe_open(paths[1], framework="flax") as f:
        out["bf16"] = np.asarray(f.get_tensor("bf16"))
    return out


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    secret = make_secret(tmp_path_factory.mktemp("secret"))
    srv = [ServerProc("96MiB", secret).ready(), ServerProc("96MiB", secret).ready()]
    yield secret, [s.address for s in srv], srv
    for s in srv:
        s.stop()


@pytest.fixture
def client(servers):
    secret, addrs, _ = servers
    pool = pt.init(connect=addrs, secret_file=secret, memory=16 << 20, cache_bytes=CACHE)
    yield pool
    for name in pt.store.list():
        pt.store.drop(name)
    pt.finalize()


def names_on(pool):
    """Every named allocation on every server: {name: holders}."""
    out = {}
    for r in range(1, pool.size):
        for n in pool.world.server(r).request({"op": "name_list"})["names"]:
            out[n["name"]] = n["holders"]
    return out


def check_model(store, path, t):
    ref = reference(path)
    assert sorted(store) == sorted(t)
    for k, v in ref.items():
        same(store[k], v)
        same(store[k], t[k])
    same(store["f8"], t["f8"])
    assert store.metadata == {"m": "1"}
    assert store["big"].access == "readonly"


def test_roundtrip_local_pool(model):
    path, t = model
    pt.init(cache_bytes=CACHE)
    try:
        s = pt.store.load_safetensors(path, name="m")
        check_model(s, path, t)
        assert pt.store.list()["m"]["tensors"] == len(t)
        assert pt.stats()["stores"]["m"]["bytes"] == sum(v.nbytes for v in t.values())
        with pytest.raises(ValueError, match="read-only"):
            s["big"][0, 0] = 1
        with pytest.raises(ValueError, match="exists"):
            pt.store.put("m", {"x": np.zeros(3)})
        s2 = pt.store.publish("m", {"x": np.arange(5.0)})
        assert s2.version == 2 and sorted(pt.store.open("m")) == ["x"]
        check_model(s, path, t)                  # the old version, still held
        pt.store.drop("m")
        with pytest.raises(KeyError):
            pt.store.open("m")
    finally:
        pt.finalize()


def test_roundtrip_on_servers(client, model):
    path, t = model
    s = pt.store.load_safetensors(path, name="m")
    check_model(s, path, t)
    assert sorted({m for a in s.values() for m in a._a.members}) == [1, 2]   # spread
    with pytest.raises(ValueError, match="read-only"):
        s["t_float32"][...] = 0
    info = pt.store.list()["m"]
    assert info["version"] == 1 and info["bytes"] == sum(v.nbytes for v in t.values())
    same(np.asarray(s["big"].to_jax()), t["big"])            # .to_jax() per tensor
    same(np.asarray(s.to_jax()["bf16"]), t["bf16"])


def run_client(secret, addrs, *args, ns=None, timeout=60):
    cmd = [sys.executable, str(SCRIPTS / "store_client.py"), secret, ",".join(addrs), *args]
    if ns is not None:
        cmd = ns_cmd(ns, cmd)
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def digests(out):
    return {ln.split()[1]: ln.split()[-1] for ln in out.splitlines() if ln.startswith("tensor")}


def expected(t):
    return {k: hashlib.sha256(np.ascontiguousarray(v).view(np.uint8).tobytes()).hexdigest()
            for k, v in t.items()}


def test_open_after_loader_left(servers, model):
    """One process loads and exits; another (its own pool on the same servers) opens it."""
    secret, addrs, srv = servers
    path, t = model
    run_client(secret, addrs, "load", ",".join(path), "shared")
    assert digests(run_client(secret, addrs, "open", "shared")) == expected(t)
    pt.init(connect=addrs, secret_file=secret, memory=16 << 20)
    try:
        free = [pt.current().world.server_info(r)["free"] for r in (1, 2)]
        pt.store.drop("shared")
        after = [pt.current().world.server_info(r)["free"] for r in (1, 2)]
        assert sum(after) - sum(free) >= sum(v.nbytes for v in t.values())
        assert pt.store.list() == {}
    finally:
        pt.finalize()


def test_publish_while_readers_hold_the_old(client, servers):
    secret, addrs, _ = servers
    v1 = {"w": np.arange(300_000, dtype=np.float32)}
    pt.store.put("rl", v1)
    reader = pt.store.open("rl")
    same(reader["w"], v1["w"])
    v2 = {"w": -np.arange(300_000, dtype=np.float32)}
    pt.store.publish("rl", v2)
    assert pt.store.list()["rl"]["version"] == 2
    # another process sees version 2 at once
    assert digests(run_client(secret, addrs, "open", "rl")) == expected(v2)
    same(reader["w"], v1["w"])                    # the old version, held here
    assert reader.version == 1
    assert pt.stats()["stores"]["rl"]["version"] == 2
    held = names_on(client)
    assert "store:rl@1/0" not in held               # dropped: no new reader finds it
    free = [client.world.server_info(r)["free"] for r in (1, 2)]
    reader.close()                  # the last holder of version 1: the servers free it
    after = [client.world.server_info(r)["free"] for r in (1, 2)]
    assert sum(after) - sum(free) >= v1["w"].nbytes
    same(pt.store.open("rl")["w"], v2["w"])


def test_loader_dying_halfway_leaves_nothing(client, servers):
    secret, addrs, _ = servers
    cmd = [sys.executable, str(SCRIPTS / "store_client.py"), secret, ",".join(addrs), "half",
           "half"]
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 3 and "written" in p.stdout, p.stdout + p.stderr
    import time
    for _ in range(100):              # the servers see the connection end
        left = [n for n in names_on(client) if n.startswith("store:half")]
        if not left:
            break
        time.sleep(0.05)
    assert not left
    assert "half" not in pt.store.list()


@pytest.mark.parametrize("damage", ["truncated", "header", "offsets"])
def test_damaged_file_registers_nothing(client, model, tmp_path, damage):
    path, _ = model
    raw = bytearray(open(path[0], "rb").read())
    bad = tmp_path / "bad.safetensors"
    if damage == "truncated":
        raw = raw[:len(raw) - 1000]
    elif damage == "header":
        raw[10:30] = b"\xff" * 20
    else:
        raw = raw.replace(b'"data_offsets":[0,', b'"data_offsets":[8,', 1)
    bad.write_bytes(bytes(raw))
    before = names_on(client)
    with pytest.raises(pt.store.SafetensorsError, match="bad.safetensors"):
        pt.store.load_safetensors([path[1], str(bad)], name="bad")
    assert names_on(client) == before and "bad" not in pt.store.list()
    with pytest.raises(KeyError):
        pt.store.open("bad")


def test_open_from_another_namespace(netns, model, tmp_path):
    """Servers in two namespaces; the loader in a third; a reader in the first namespace
    (another machine as far as the pool can tell) after the loader left."""
    path, t = model
    secret = make_secret(tmp_path)
    a = ServerProc("64MiB", secret, host=netns["addrs"][1], port=7011, ns=netns["names"][1])
    b = ServerProc("64MiB", secret, host=netns["addrs"][2], port=7011, ns=netns["names"][2])
    try:
        a.ready(), b.ready()
        addrs = [a.address, b.address]
        run_client(secret, addrs, "load", ",".join(path), "nsmodel", ns=0)
        assert digests(run_client(secret, addrs, "open", "nsmodel", ns=1)) == expected(t)
    finally:
        a.stop(), b.stop()


def test_command_load_ls_drop(servers, model, capsys, monkeypatch):
    """The subcommands, run in this process (their parser and run(); the entry point itself
    is the one test_command.py runs)."""
    import json

    from pooltensor.cli import main
    secret, addrs, _ = servers
    path, t = model
    opts = ["--connect", ",".join(addrs), "--secret-file", secret]

    def cmd(*args):
        code = main(["store", *args, *opts])
        out = capsys.readouterr()
        return code, out.out, out.err
    code, out, err = cmd("load", "cli", *path)
    assert code == 0 and "cli  version 1" in out, err
    assert cmd("load", "cli", *path)[0] == 1          # exists: --publish replaces it
    assert "version 2" in cmd("load", "cli", path[1], "--publish")[1]
    code, out, err = cmd("ls", "--json")
    assert code == 0, err
    ls = json.loads(out)
    assert ls["cli"]["version"] == 2 and ls["cli"]["tensors"] == 2
    assert cmd("drop", "cli")[0] == 0
    code, out, err = cmd("drop", "cli")
    assert code == 1 and "no store named 'cli'" in err
    assert json.loads(cmd("ls", "--json")[1]) == {}
    monkeypatch.delenv("POOLTENSOR_CONNECT", raising=False)
    assert main(["store", "ls"]) == 2                 # no servers named
    assert "--connect" in capsys.readouterr().err


def _open_in_worker(secret, addrs, name):
    """A Dask task: this worker connects to the servers and reads every tensor of `name`."""
    import hashlib

    import numpy as np

    import pooltensor as pt
    pt.init(connect=addrs, secret_file=secret, memory=1 << 20)
    try:
        with pt.store.open(name) as s:
            return {k: hashlib.sha256(np.ascontiguousarray(np.asarray(a)).view(np.uint8)
                                      .tobytes()).hexdigest() for k, a in s.items()}
    finally:
        pt.finalize()


def test_open_from_a_dask_worker(servers, model):
    """A Dask worker (a process of its own) opens a store a script loaded and left."""
    from distributed import Client, LocalCluster
    secret, addrs, _ = servers
    path, t = model
    run_client(secret, addrs, "load", ",".join(path), "dasked")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as c:
        got = c.submit(_open_in_worker, secret, addrs, "dasked").result(timeout=60)
    assert got == expected(t)
    pt.init(connect=addrs, secret_file=secret, memory=1 << 20)
    try:
        pt.store.drop("dasked")
    finally:
        pt.finalize()


# -- replication ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def five_servers(tmp_path_factory):
    """Five memory servers (two to load on, three to replicate to) and a client pool, for
    the tests below in their order: the last two each kill a server (1, then 2)."""
    secret = make_secret(tmp_path_factory.mktemp("five"))
    srv = [ServerProc("48MiB", secret) for _ in range(5)]
    try:
        for s in srv:
            s.ready()
        pool = pt.init(connect=[s.address for s in srv], secret_file=secret, memory=4 << 20)
        yield pool, srv
        pt.finalize()
    finally:
        for s in srv:
            s.stop()


@pytest.fixture
def five(five_servers):
    yield five_servers
    for name in pt.store.list():
        pt.store.drop(name)


def replica_bytes(pool, name):
    """Each full replica of store `name`, read back on its own: [{key: numpy}]."""
    from pooltensor.store import kept
    m = kept.read_manifest(pool.world, name)
    out = []
    for rp in m["replicas"]:
        arrays, heap, held = kept.attach(pool, m, rp)
        assert {a._a.members[0] for a in arrays.values() if a.size} == \
            {kept.ranks_by_identity(pool.world)[tuple(rp["server"])]}
        out.append({k: a.to_numpy() for k, a in arrays.items()})
        kept.release(pool.world, held)
        kept.forget(pool, heap)
    return out


MODEL = {"w": np.arange(5_000_000, dtype=np.float32), "v": np.ones((333, 77), np.int16)}


def test_replicate_to_three(five):
    pool, srv = five
    pt.store.put("m", MODEL, placement=[1, 2])
    where = pt.store.replicate("m", [3, 4, 5])
    assert where == [srv[k].address for k in (2, 3, 4)]
    reps = replica_bytes(pool, "m")
    assert len(reps) == 3
    for r in reps:
        for k in MODEL:
            same(r[k], MODEL[k])
    info = pt.store.list()["m"]
    assert info["full_replicas"] == 3 and info["version"] == 1
    with pt.store.open("m", local=True) as s:           # every server is on this machine
        assert {m for a in s.values() for m in a._a.members} == {3}
        same(s["w"], MODEL["w"])


def test_replicate_reports_each_pull(five):
    """name_list gives each member's pull trace (what bench/store.py reports): every chunk
    counted once, the time in gets and waits inside the pull's own time, the slowest get
    within the gets; the first member, whose source holds everything, asks for DEPTH chunks
    at once (the next while one arrives: the link does not idle between chunks)."""
    from pooltensor.pool.pull import CHUNK, DEPTH
    from pooltensor.store import kept
    pool, _ = five
    big = {"w": np.arange(3 * CHUNK // 4 + 5, dtype=np.float32), "v": MODEL["v"]}
    pt.store.put("m", big, placement=[1])
    pt.store.replicate("m", [3, 4])
    m = kept.read_manifest(pool.world, "m")
    total = kept.nslabs(m) * m["slab"]
    for r in (3, 4):
        (n,) = [n for n in pool.world.server(r).request({"op": "name_list"})["names"]
                if "/full" in n["name"]]
        t = n["trace"]
        assert n["pulled"] == total and t["chunks"] == -(-total // CHUNK), (total, t)
        assert 0 < t["first"] <= t["elapsed"] and t["connect"] >= 0, t
        assert 0 < t["slowest"] <= t["get"] and t["get"] + t["wait"] <= t["elapsed"], t
        assert 1 <= t["in_flight"] <= DEPTH and (r == 4 or t["in_flight"] == DEPTH), t
    for r in replica_bytes(pool, "m"):
        for k in big:
            same(r[k], big[k])
    for n in pool.world.server(1).request({"op": "name_list"})["names"]:
        assert n["trace"] is None                 # filled by its loader, not pulled


def _kill_source_midway(pool, srv, source, members):
    """Replicate in a thread; stop the source once the first member has part of the model
    (SIGSTOP: it serves nothing more), check the copy is partial, then SIGKILL it."""
    import signal
    import threading
    got = {}

    def run():
        try:
            got["where"] = pt.store.replicate("m", members, timeout=5)
        except Exception as e:        # noqa: BLE001 (what the test checks)
            got["error"] = e
    t = threading.Thread(target=run)
    t.start()
    first = pool.world.server(members[0])
    total = sum(v.nbytes for v in MODEL.values())
    pulled = None
    for _ in range(20000):
        names = {n["name"]: n for n in first.request({"op": "name_list"})["names"]}
        full = [n for nm, n in names.items() if "/full" in nm]
        if full and full[0]["pulled"] and full[0]["pulled"] > 0:
            srv[source - 1].signal(signal.SIGSTOP)
            pulled = full[0]["pulled"]
            break
    assert pulled is not None and 0 < pulled < total, pulled
    srv[source - 1].signal(signal.SIGKILL)
    t.join(60)
    assert not t.is_alive()
    return got


def test_replicate_source_killed_with_replicas(five):
    pool, srv = five
    pt.store.put("m", MODEL, placement=[1, 2], replicas=2)   # every part on 1 and on 2
    got = _kill_source_midway(pool, srv, 1, [3, 4, 5])
    assert "error" not in got, got
    for r in replica_bytes(pool, "m"):
        for k in MODEL:
            same(r[k], MODEL[k])


def test_replicate_source_killed_without_replicas(five):
    pool, srv = five                  # (server 1 was killed by the test before)
    pt.store.put("m", MODEL, placement=[2])
    got = _kill_source_midway(pool, srv, 2, [3, 4, 5])
    e = got.get("error")
    assert isinstance(e, pt.store.ReplicationError), got
    assert "failed" in str(e) and f":{srv[1].data_port}" in str(e)
    for r in (3, 4, 5):              # nothing left behind on the members
        names = pool.world.server(r).request({"op": "name_list"})["names"]
        assert not [n for n in names if "/full" in n["name"]]


def test_spmd_ranks_share_a_store(tmp_path):
    from conftest import check_ranks
    from safetensors.numpy import save_file
    rng = np.random.default_rng(3)
    t = _tensors(rng)
    path = tmp_path / "spmd.safetensors"
    save_file(t, str(path))
    p = check_ranks("launch", 2, "store_spmd.py", str(path))
    assert p.stdout.count("store spmd ok") == 2, p.stdout


def test_open_reads_copies_of_a_lost_server(five):
    """replicas=2 on servers: with a server gone, open() reads its parts from their copies;
    with every copy of a part gone, PeerLost names the lost servers."""
    import signal
    pool, srv = five                  # (servers 1 and 2 were killed by the tests before)
    pt.store.put("f", MODEL, placement=[3, 4, 5], replicas=2)
    pt.store.put("g", MODEL, placement=[3, 4])
    srv[3].signal(signal.SIGKILL)     # server 4
    srv[3].wait()
    import time
    for _ in range(200):              # the native monitor sees it go
        if 4 in pool.world.lost():
            break
        time.sleep(0.025)
    with pt.store.open("f") as s:
        assert 4 not in {m for a in s.values() for m in a._a.members}
        for k in MODEL:
            same(s[k], MODEL[k])
    with pytest.raises(pt.store.PeerLost, match="no copy"):
        pt.store.open("g")
