"""Pool.check() and ``pooltensor check HOST:PORT`` (pooltensor/pool/check.py): a consistent
pool reports ok; a replica copy changed behind the pool's back, or allocator books that do
not match the directory, are found and named (through the job's metrics endpoint, by the
command in a process of its own)."""
import subprocess
import sys

import numpy as np
import pytest

import pooltensor as pt
from servers import env

pytestmark = pytest.mark.timeout(60)
SLAB = 64 << 10


def cli(port):
    p = subprocess.run([sys.executable, "-m", "pooltensor", "check", f"127.0.0.1:{port}"],
                       env=env(), capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout + p.stderr


@pytest.fixture
def pool():
    pt.finalize()
    p = pt.init(members=3, slab_size=SLAB, memory=4 << 20, cache_bytes=4 * SLAB,
                metrics="127.0.0.1:0", partition="a", limit="8MiB")
    yield p
    pt.finalize()


def test_check_finds_injected_differences(pool):
    port = pool.metrics_exporter.port
    ref = np.random.default_rng(2).random(6 * SLAB // 8)
    x = pt.asarray(ref, access="readonly", replicas=2)
    y = pt.arange(10 * SLAB // 8, dtype=np.int64)
    rep = pool.check()
    assert rep["ok"], rep
    assert rep["checked"]["arrays"] == 2 and rep["checked"]["replica_slabs"] == 12
    rc, out = cli(port)
    assert rc == 0 and "checked 2 arrays" in out and out.strip().endswith("ok"), out
    # one replica's bytes changed where it lives (a write the pool never made)
    m, s = x._a.copies[4][1]
    pool.win_ro_init.put(m, s * SLAB + 100, np.full(8, 0xEE, np.uint8))
    pool.win_ro_init.flush()
    rc, out = cli(port)
    assert rc == 1 and f"array {x._a.id} slab 4: the copy on member {m} differs" in out, out
    assert "first at byte 100" in out
    # the allocator's books no longer match the directory
    pool._used[2] += 1
    rep = pool.check()
    assert any("member 2: the allocator counts" in d for d in rep["differences"]), rep
    pool._used[2] -= 1
    assert float(y[-1]) == 10 * SLAB // 8 - 1


def test_command_without_a_job():
    rc, out = cli(9)
    assert rc == 2 and "cannot read" in out, out
