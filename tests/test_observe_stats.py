"""pt.stats() and World.stats(): the pool's usage, shares and fragmentation, the cache's hit
rate and prefetch accuracy, and the transfers' latency, bandwidth and health from the native
counters; the numbers checked against what the test itself did; and the PNG of plot=."""
import numpy as np
import pytest

import collectives
import pooltensor as pt
from conftest import SLAB


@pytest.fixture(scope="module")
def pool():
    pt.finalize()
    p = pt.init(members=2, slab_size=SLAB * 64, memory=8 << 20, cache_bytes=4 * SLAB * 64,
                attach=False)
    yield p
    pt.finalize()


def test_stats_fields_and_what_they_count(pool):
    x = pt.arange(100_000, dtype=np.float64)
    before = pt.stats()["transfers"]
    assert float(x.sum()) == float(np.arange(100_000).sum())
    y = x.to_numpy()
    assert np.array_equal(y, np.arange(100_000))
    s = pt.stats(per_peer=True)
    # usage and shares
    m = s["members"]
    assert sum(k["share"] for k in m) == pytest.approx(1.0)
    assert sum(k["used"] for k in m) == s["pool"]["used"] >= x.nbytes
    assert s["pool"]["capacity"] == sum(k["capacity"] for k in m)
    assert s["pool"]["free"] == s["pool"]["capacity"] - s["pool"]["used"]
    assert 0 <= s["pool"]["fragmentation"] <= 1
    assert sum(k["used_share"] for k in m) == pytest.approx(1.0)
    # the cache
    c = s["cache"]
    assert 0 <= c["hit_rate"] <= 1 and 0 <= c["prefetch_accuracy"] <= 1
    # the transfers: member 1's slabs came over shared memory into the cache
    t = s["transfers"]
    get = t["latency"]["shm"]["get"]
    assert get["ops"] > before["latency"].get("shm", {}).get("get", {}).get("ops", 0)
    assert get["bytes"] >= c["bytes_fetched"] > 0
    assert 0 < get["p50_us"] <= get["p90_us"] <= get["p99_us"] <= get["max_us"]
    assert t["bandwidth"]["shm"]["get"] > 0 and t["interval_s"] > 0
    peers = {p["peer"]: p for p in t["peers"]}
    assert peers[1]["health"] == "ok" and peers[1]["state"] == "up"
    assert peers[1]["transport"] == "shm" and peers[1]["last_error"] is None
    assert peers[1]["latency"]["shm"]["get"]["ops"] == get["ops"] - \
        peers[0].get("latency", {}).get("shm", {}).get("get", {}).get("ops", 0)
    # an interval with nothing moved: no bandwidth
    again = pt.stats()["transfers"]
    assert again["bandwidth"]["shm"]["get"] == 0


def test_plot_writes_a_png(pool, tmp_path):
    x = pt.ones(50_000)
    assert float(x.sum()) == 50_000
    path = tmp_path / "pool.png"
    s = pt.stats(plot=str(path))
    assert "members" in s
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_world_stats_counts_collectives():
    pt.finalize()                   # (the pool's world has member processes in it)
    w = collectives.init()
    collectives.allreduce(np.ones(1000))
    win = w.expose(64)
    win.get(0, 0, np.zeros(8, np.uint8))
    s = w.stats(per_peer=True)
    ar = s["latency"]["world"]["allreduce"]
    assert ar["ops"] >= 1 and ar["bytes"] >= 8000 and ar["p50_us"] > 0
    assert s["rank"] == w.rank and s["size"] == w.size
    ents, links = w.counters()
    assert any(e["op"] == "allreduce" for e in ents)
    assert any(e["op"] == "get" and e["peer"] == w.rank for e in ents)
    assert len(links) == w.size
    win.close()


def test_sections_other_parts_add(pool):
    """report.add_section: how partitions (built elsewhere) put their usage into stats()."""
    from pooltensor.pool import report
    seen = []

    def parts(p):
        import threading       # read under the pool's lock: another thread cannot take it
        t = threading.Thread(target=lambda: seen.append(not p._lock.acquire(blocking=False)))
        t.start()
        t.join()
        return {"all": {"members": list(range(p.size))}}
    report.add_section("partitions", parts)
    report.add_section("absent", lambda p: None)
    try:
        s = pt.stats()
        want = list(range(len(s["members"])))
        assert s["partitions"] == {"all": {"members": want}} and "absent" not in s
        assert seen == [True]
        with pytest.raises(ValueError, match="already has a section 'partitions'"):
            report.add_section("partitions", parts)
        with pytest.raises(ValueError, match="'members'"):
            report.add_section("members", parts)
    finally:
        report.SECTIONS.pop("partitions", None)
        report.SECTIONS.pop("absent", None)
