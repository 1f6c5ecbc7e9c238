"""Leases (pooltensor/pool/leases.py): the pool takes another lease from a member under
demand and gives leases back when they stay idle, measured in the member process's resident
shared memory (/proc/PID/status RssShmem: its memfd pages) with the periods shortened."""
import gc
import time

import numpy as np
import pytest

import pooltensor as pt
from pooltensor.pool import leases
from pooltensor.pool.alloc import SlabAllocator
from servers import ServerProc, make_secret

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


def rss_shmem(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    return 0


def test_allocator_resize_keeps_the_tail_rule():
    a = SlabAllocator(8)
    assert a.alloc(3) == [(0, 3)]
    assert a.resize(4) and a.nslabs == 4 and a.nfree == 1
    assert not a.resize(2)                  # slot 2 is in use
    assert a.resize(16) and a.nfree == 13 and a.free_runs() == [(3, 13)]
    assert a.alloc(13) == [(3, 13)] and not a.resize(15)
    a.free([(0, 16)])
    assert a.resize(1) and a.free_runs() == [(0, 1)]


def test_settings_are_checked():
    assert leases.check(0, None, None, None, MiB) is None
    assert leases.check(False, None, None, None, MiB) is None
    assert leases.check(True, None, None, None, MiB) == (128 * MiB, 0.25, 0.15, 300.0)
    assert leases.check(None, None, None, None, MiB) == (128 * MiB, 0.25, 0.15, 300.0)
    assert leases.check(None, None, None, None, 3 << 20)[0] == 129 * MiB   # whole slabs
    with pytest.raises(ValueError, match="multiple of the slab size"):
        leases.check("3MiB", None, None, None, 2 * MiB)
    with pytest.raises(ValueError, match="grow_below must be a fraction"):
        leases.check(True, 1.5, None, None, MiB)
    with pytest.raises(ValueError, match="lease=0 turns leases off"):
        leases.check(0, 0.3, None, None, MiB)


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setenv("POOLTENSOR_PREPARE", "0")      # members fault in nothing ahead
    pt.finalize()
    p = pt.init(members=2, slab_size=MiB, memory=64 * MiB, cache_bytes=4 * MiB,
                lease="8MiB", shrink_after=0.5)
    yield p
    pt.finalize()


def test_grow_under_demand_and_give_back_when_idle(pool):
    L = pool.leases
    assert L.stats()["lent"] == [8 * MiB, 8 * MiB]
    pid = pool._procs[0].pid                  # member 1's process
    base = rss_shmem(pid)
    small = pt.ones(2 * MiB // 8)             # 14 of 16 MiB free: no lease taken
    assert L.counters["grown"] == 0
    x = pt.arange(40 * MiB // 8, dtype=np.float64)   # block: about half on each member
    st = L.stats()
    assert st["grown"] >= 4 and sum(st["lent"]) >= 42 * MiB / 0.75, st
    assert pool.stats()["pool"]["free"] >= 0.25 * sum(st["lent"]) - MiB
    assert float(x.sum()) == float(np.arange(40 * MiB // 8, dtype=np.float64).sum())
    grown = rss_shmem(pid)
    assert grown - base >= 16 * MiB, (base, grown)        # member 1 wrote its ~20 MiB
    del x
    gc.collect()
    pt.sync()                                 # a safe point: the frees are applied
    deadline = time.monotonic() + 20
    while L.counters["shrunk"] < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    st = L.stats()
    assert st["shrunk"] >= 2 and st["lent"] == [8 * MiB, 8 * MiB], st
    assert st["punch_failed"] == 0 and st["given_back_bytes"] >= 32 * MiB
    after = rss_shmem(pid)
    assert grown - after >= 12 * MiB, (base, grown, after)  # the pages left the member
    kinds = [e["kind"] for e in st["events"]]
    assert "grow" in kinds and kinds[-1] == "shrink"
    # lent again: slots given back read as zeros, data written there is right
    z = pt.zeros(30 * MiB // 8)
    assert float(z.sum()) == 0.0
    y = pt.full(30 * MiB // 8, 3.0)
    np.testing.assert_array_equal(y[-5:].to_numpy(), np.full(5, 3.0))
    assert float(small.sum()) == 2 * MiB // 8
    assert pool.stats()["leases"]["lent"] == L.stats()["lent"]


@pytest.fixture
def server(tmp_path):
    secret = make_secret(tmp_path)
    s = ServerProc("48MiB", secret).ready()
    yield s, secret
    pt.finalize()
    s.stop()


def test_memory_server_lends_in_leases(server):
    """A client's window may be larger than the server's memory: only what it lends counts,
    and what it gives back leaves the server's RSS."""
    from collectives import control as ctl
    from collectives import remote
    s, secret = server
    pt.finalize()
    pool = pt.init(connect=[s.address], secret_file=secret, memory=128 * MiB, slab_size=MiB,
                   cache_bytes=4 * MiB, lease="8MiB", shrink_after=0.5)
    info = remote._Server(1, s.address, ctl.read_secret(secret), 10.0)
    assert pool.capacity[1] == 128 * MiB and info.request({"op": "info"})["free"] == 40 * MiB
    base = s.rss_shmem()
    x = pt.arange(30 * MiB // 8, dtype=np.float64)
    lent = pool.leases.stats()["lent"][1]
    assert lent >= 40 * MiB and info.request({"op": "info"})["free"] == 48 * MiB - lent
    assert float(x[-1]) == 30 * MiB // 8 - 1
    grown = s.rss_shmem()
    assert grown - base >= 28 * MiB, (base, grown)
    with pytest.raises(pt.PoolOutOfMemory):
        pt.zeros(20 * MiB)                    # the server has only 48 MiB to lend
    del x
    gc.collect()
    pt.sync()
    deadline = time.monotonic() + 20
    while pool.leases.counters["shrunk"] < 1 and time.monotonic() < deadline:
        time.sleep(0.1)                       # (counted once the server took them back)
    assert pool.leases.stats()["lent"][1] == 8 * MiB
    assert info.request({"op": "info"})["free"] == 40 * MiB
    assert grown - s.rss_shmem() >= 20 * MiB      # all but the one lease kept
    y = pt.full(20 * MiB // 8, 2.0)            # lent again: right values
    assert float(y.sum()) == 2.0 * (20 * MiB // 8)
    info.close()


def test_serve_lease_flag_makes_clients_lend_in_leases(tmp_path):
    secret = make_secret(tmp_path)
    s = ServerProc("32MiB", secret, extra=("--lease", "4MiB")).ready()
    try:
        pt.finalize()
        pool = pt.init(connect=[s.address], secret_file=secret, slab_size=MiB,
                       cache_bytes=4 * MiB)
        st = pool.stats()["leases"]
        assert st["lease"] == 4 * MiB and st["lent"] == [0, 4 * MiB]
        x = pt.ones(10 * MiB // 8)
        assert pool.leases.stats()["lent"][1] >= 12 * MiB and float(x.sum()) == 10 * MiB // 8
        del x
        pt.finalize()
        pool = pt.init(connect=[s.address], secret_file=secret, slab_size=MiB,
                       cache_bytes=4 * MiB, memory=24 * MiB, lease=0)   # whatever it says
        assert pool.leases is None and pool.stats()["members"][1]["lent"] == 24 * MiB
        x = pt.ones(20 * MiB // 8)                 # past what one lease would serve
        assert float(x.sum()) == 20 * MiB // 8
    finally:
        pt.finalize()
        s.stop()


def test_server_refuses_pages_past_the_lease(server):
    """The server serves a client only what it lends: a put or get past it is refused
    (RemoteAccessError, nothing written), inside it works, and lending more opens it."""
    from collectives import remote
    from collectives.errors import RemoteAccessError
    s, secret = server
    pt.finalize()
    w = remote.connect([s.address], secret_file=secret, memory=16 * MiB, lend=4 * MiB)
    try:
        win = w.expose(16 * MiB, "rw")
        data = np.arange(MiB // 8, dtype=np.float64)
        win.put(1, 3 * MiB, data)                         # inside the lease
        back = np.empty_like(data)
        assert np.array_equal(win.get(1, 3 * MiB, back), data)
        base = s.rss_shmem()
        for off in (4 * MiB, 12 * MiB, 4 * MiB - 8):      # past it, and straddling its end
            with pytest.raises(RemoteAccessError, match="outside the registration"):
                win.put(1, off, data)
            with pytest.raises(RemoteAccessError, match="outside the registration"):
                win.get(1, off, back)
        assert s.rss_shmem() - base < MiB                 # nothing written out there
        w.lend(1, win.buffer, 16 * MiB)                   # lent: served
        win.put(1, 12 * MiB, data)
        assert np.array_equal(win.get(1, 12 * MiB, np.empty_like(data)), data)
        w.lend(1, win.buffer, 4 * MiB)                    # given back: refused again
        with pytest.raises(RemoteAccessError, match="outside the registration"):
            win.get(1, 12 * MiB, back)
        win.close()
    finally:
        w.close()


def test_leases_are_the_default_and_lease_0_lends_everything(monkeypatch):
    """A plain script's members lend 128 MiB at first (a smaller memory whole); stats keep
    capacity (what a member can give) and free (capacity - used), with lent beside them; an
    allocation placed on a member makes that member lend more, it does not spill."""
    monkeypatch.setenv("POOLTENSOR_PREPARE", "0")
    pt.finalize()
    try:
        pool = pt.init(members=2, slab_size=MiB, memory=512 * MiB, cache_bytes=4 * MiB)
        assert pool.leases.stats()["lease"] == 128 * MiB
        st = pool.stats()
        assert [m["lent"] for m in st["members"]] == [128 * MiB, 128 * MiB]
        assert [m["capacity"] for m in st["members"]] == [512 * MiB, 512 * MiB]
        assert st["pool"]["free"] == 1024 * MiB and st["pool"]["lent"] == 256 * MiB
        x = pt.zeros(200 * MiB // 8, placement=[1])          # all on member 1
        assert set(x._a.members) == {1}
        st = pool.stats()
        m1 = st["members"][1]
        assert m1["lent"] >= 256 * MiB and m1["free"] == 312 * MiB, m1
        assert m1["largest_free_run"]["readwrite"] == 312 * MiB
        assert st["members"][0]["lent"] == 128 * MiB
        x[-1] = 5.0
        assert float(x.sum()) == 5.0
        pt.finalize()
        pool = pt.init(members=2, slab_size=MiB, memory=16 * MiB, cache_bytes=4 * MiB)
        assert pool.leases.stats()["lent"] == [16 * MiB, 16 * MiB]   # under a lease: whole
        pt.finalize()
        pool = pt.init(members=2, slab_size=MiB, memory=512 * MiB, cache_bytes=4 * MiB,
                       lease=0)
        st = pool.stats()
        assert pool.leases is None and st["leases"] is None
        assert [m["lent"] for m in st["members"]] == [512 * MiB, 512 * MiB]
    finally:
        pt.finalize()


def test_spmd_refuses_lease_settings_clearly(monkeypatch):
    from pooltensor.pool import runtime
    monkeypatch.setattr(runtime, "_launched", lambda: True)
    assert runtime._lease_args(None, None, None, None, MiB, None) is None   # off, silently
    assert runtime._lease_args(0, None, None, None, MiB, None) is None
    with pytest.raises(ValueError, match="under mpiexec or the launcher every rank lends"):
        runtime._lease_args("8MiB", None, None, None, MiB, None)
    with pytest.raises(ValueError, match="under mpiexec or the launcher every rank lends"):
        runtime._lease_args(None, None, None, 5.0, MiB, None)


def test_serve_lease_0_gives_clients_their_whole_grant(tmp_path):
    secret = make_secret(tmp_path)
    s = ServerProc("16MiB", secret, extra=("--lease", "0")).ready()
    try:
        pt.finalize()
        pool = pt.init(connect=[s.address], secret_file=secret, slab_size=MiB,
                       cache_bytes=4 * MiB)
        assert pool.leases is None and pool.stats()["members"][1]["lent"] == 16 * MiB
    finally:
        pt.finalize()
        s.stop()
