"""Partitions (pooltensor/pool/partitions.py): a partition at its limit is refused with a
PoolOutOfMemory that names it and what is free to it, while another partition's reservation
stays usable; in a pool of this process and on a real memory server (``pooltensor serve
--partition``), whose accounting is checked through its own info request."""
import gc
import subprocess
import sys

import numpy as np
import pytest

import pooltensor as pt
from pooltensor.pool import partitions
from servers import ServerProc, env, make_secret

pytestmark = pytest.mark.timeout(60)
MiB = 1 << 20


@pytest.fixture
def fresh():
    pt.finalize()
    yield
    pt.finalize()


def test_spec_and_ledger_rules():
    assert partitions.parse_spec("prod=64GiB:128GiB") == ("prod", 64 << 30, 128 << 30)
    assert partitions.parse_spec("dev=0:") == ("dev", 0, None)
    for bad in ("prod", "=1:2", "a b=1:2", "x=lots:2"):
        with pytest.raises(ValueError):
            partitions.parse_spec(bad)
    led = partitions.Ledger(100)
    led.declare("a", 60, 80)
    with pytest.raises(ValueError, match="reservations would sum to 110"):
        led.declare("b", 50, None)
    with pytest.raises(ValueError, match="above its limit"):
        led.declare("c", 10, 5)
    with pytest.raises(ValueError, match="declared with reserve 60"):
        led.declare("a", 10, 80)
    led.declare("b", 0, 70)
    assert led.free_to("b", 100) == 40            # 60 held for a
    led.take("a", 50)
    assert led.free_to("b", 50) == 40 and led.free_to("a", 50) == 30
    assert "partition 'b' cannot take 41 bytes: 40 bytes are free" in led.refusal("b", 41, 50)


def test_local_partition_at_limit_fails_and_reservation_stays_usable(fresh):
    pool = pt.init(memory=64 * MiB, cache_bytes=8 * MiB, partition="prod", reserve="24MiB",
                   limit="48MiB")
    with pool.partition("dev", limit=40 * MiB):
        a = pt.arange(30 * MiB // 8, dtype=np.int64)
        with pytest.raises(pt.PoolOutOfMemory) as e:
            pt.zeros(12 * MiB, dtype=np.uint8)      # the memory has 34 MiB free, dev 10
        assert e.value.partition == "dev"
        assert f"{10 * MiB} bytes are free to it" in str(e.value)
        assert isinstance(e.value, MemoryError)
    # dev holds 30 of 64 MiB; prod's reservation (24 MiB) is still there, and usable
    x = pt.ones(24 * MiB // 8, dtype=np.float64)
    assert float(x.sum()) == 24 * MiB // 8
    st = pool.stats()["partitions"]
    assert st["prod"] == {"reserved": 24 * MiB, "used": 24 * MiB, "limit": 48 * MiB,
                          "refused": 0}
    assert st["dev"]["used"] == 30 * MiB and st["dev"]["refused"] == 1
    np.testing.assert_array_equal(a[:5].to_numpy(), np.arange(5))
    # prod above its reservation competes for the rest; dev's freed bytes go back to dev
    del a
    gc.collect()
    assert pool.stats()["partitions"]["dev"]["used"] == 0
    y = pt.zeros(24 * MiB, dtype=np.uint8)          # prod: 48 MiB = its limit
    with pytest.raises(pt.PoolOutOfMemory, match="partition 'prod' cannot take"):
        pt.zeros(MiB, dtype=np.uint8)
    with pool.partition("dev"):
        z = pt.zeros(16 * MiB, dtype=np.uint8)      # what is left of the memory
    assert y.shape == (24 * MiB,) and z.shape == (16 * MiB,)
    with pytest.raises(ValueError, match="already initialized with partition='prod'"):
        pt.init(partition="dev")
    with pytest.raises(ValueError, match="reserve= and limit= are a partition's"):
        pt.finalize() or pt.init(limit=MiB)


@pytest.fixture
def server(tmp_path):
    secret = make_secret(tmp_path)
    s = ServerProc("48MiB", secret, extra=("--partition", "prod=16MiB:32MiB",
                                           "--partition", "dev=0:40MiB")).ready()
    yield s, secret
    s.stop()


def test_server_partitions(server, fresh):
    from collectives import control as ctl
    from collectives import remote
    s, secret = server
    dev = remote._Server(1, s.address, ctl.read_secret(secret), 10.0)
    assert dev.request({"op": "partition", "name": "dev"})["free"] == 32 * MiB
    dev.request({"op": "alloc", "size": 32 * MiB, "access": "rw"})
    with pytest.raises(remote.ServerRefused, match="partition 'dev' cannot take"):
        dev.request({"op": "alloc", "size": MiB, "access": "rw"})
    with pytest.raises(remote.ServerRefused, match="unknown partition 'qa'"):
        dev.request({"op": "partition", "name": "qa"})
    # a client of dev asking for more than is free to dev: PoolOutOfMemory naming it
    with pytest.raises(pt.PoolOutOfMemory, match="partition 'dev'") as e:
        pt.init(connect=[s.address], secret_file=secret, partition="dev", memory=MiB)
    assert e.value.partition == "dev" and e.value.free == {1: 0}
    # prod's reservation was held while dev filled the rest: a pool in prod gets it all
    pool = pt.init(connect=[s.address], secret_file=secret, partition="prod", slab_size=MiB,
                   cache_bytes=4 * MiB)
    assert pool.capacity[1] == 16 * MiB
    ref = np.random.default_rng(1).random(2 * MiB // 8)
    x = pt.asarray(ref)
    np.testing.assert_array_equal(x.to_numpy(), ref)
    info = dev.request({"op": "info"})
    assert info["partitions"]["prod"]["used"] == 16 * MiB       # rw and r keys: one heap
    assert info["partitions"]["dev"]["used"] == 32 * MiB
    del x
    pt.finalize()
    dev.close()
    s.log.wait(r"disconnected")
    with pytest.raises(ValueError, match="servers declare"):
        pt.init(connect=[s.address], secret_file=secret, partition="prod", reserve=MiB)


def test_serve_partition_flag_errors(tmp_path):
    secret = make_secret(tmp_path)
    for spec, what in (("prod", "NAME=RESERVE:LIMIT"), ("a=64MiB:1MiB", "above its limit")):
        p = subprocess.run([sys.executable, "-m", "pooltensor", "serve", "--memory", "8MiB",
                            "--secret-file", secret, "--partition", spec, "--listen",
                            "127.0.0.1:0"], env=env(), capture_output=True, text=True,
                           timeout=30)
        assert p.returncode in (1, 2) and what in p.stderr, p.stderr
