"""The Prometheus endpoint (pooltensor/pool/metrics.py), scraped over real HTTP and parsed with
prometheus_client's own parser: a plain script's pool (pt.init(metrics=...)), every rank of an
SPMD job on port + local rank (POOLTENSOR_METRICS), and ``pooltensor serve --metrics``."""
import re
import socket
import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import pooltensor as pt
from conftest import check_ranks
from servers import ServerProc, make_secret


def scrape(host, port):
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=20) as r:
        assert r.status == 200
        text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fam, name=None, **labels):
    return [s for s in fam.samples if (name is None or s.name == name) and
            all(s.labels.get(k) == v for k, v in labels.items())]


def test_a_jobs_endpoint_matches_its_native_counters():
    pt.finalize()
    pool = pt.init(members=2, slab_size=4096, memory=8 << 20, cache_bytes=8 * 4096,
                   attach=False, metrics="127.0.0.1:0")
    try:
        x = pt.arange(50_000, dtype=np.float64)
        assert np.array_equal(x.to_numpy(), np.arange(50_000))
        port = pool.metrics_exporter.port
        fams = scrape("127.0.0.1", port)
        entries, _ = pool.world.counters()
        get = [e for e in entries if e["op"] == "get" and e["transport"] == "shm"
               and e["peer"] == 1][0]
        h = fams["pooltensor_op_latency_seconds"]
        assert h.type == "histogram"
        lab = dict(member="0", peer="1", transport="shm", op="get")
        count = samples(h, "pooltensor_op_latency_seconds_count", **lab)[0].value
        inf = samples(h, "pooltensor_op_latency_seconds_bucket", le="+Inf", **lab)[0].value
        assert count == inf >= get["count"] > 0        # (the scrape came a moment later)
        buckets = [s.value for s in samples(h, "pooltensor_op_latency_seconds_bucket", **lab)]
        assert buckets == sorted(buckets) and len(buckets) == 29      # cumulative; 28 + +Inf
        ops = samples(fams["pooltensor_ops"], "pooltensor_ops_total", **lab)[0].value
        assert ops >= get["ops"]
        assert samples(fams["pooltensor_bytes"], "pooltensor_bytes_total", **lab)[0].value \
            >= get["bytes"] > 0
        assert samples(fams["pooltensor_peer_up"], member="0", peer="1")[0].value == 1
        used = {s.labels["member"]: s.value for s in fams["pooltensor_member_used_bytes"].samples}
        assert used["0"] + used["1"] >= x.nbytes
        assert fams["pooltensor_cache_misses"].samples[0].value > 0
        assert fams["pooltensor_cache_hit_ratio"].type == "gauge"
        # a second init() asking for another address is refused; the same one is fine
        assert pt.init(metrics="127.0.0.1:0") is pool
        with pytest.raises(ValueError, match="already serves metrics"):
            pt.init(metrics="127.0.0.1:1")
    finally:
        pt.finalize()
    with pytest.raises(OSError):                         # the port is free again: closed
        scrape("127.0.0.1", port)


def test_bad_addresses_are_clear_errors():
    from pooltensor.pool import metrics
    assert metrics.parse(":9464") == ("0.0.0.0", 9464)
    assert metrics.parse("127.0.0.1:9464", 3) == ("127.0.0.1", 9467)
    for bad in ("9464", "host:", "host:99999", "a:b"):
        with pytest.raises(ValueError, match="HOST:PORT|host:port"):
            metrics.parse(bad)
    with pytest.raises(ValueError, match="past 65535"):
        metrics.parse(":65535", 1)


def _free_port_pair():
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
            return p
    pytest.skip("no two consecutive free ports")


def test_spmd_ranks_serve_on_port_plus_local_rank():
    port = _free_port_pair()
    p = check_ranks("launch", 2, "metrics_spmd.py", str(port),
                    env={"POOLTENSOR_METRICS": f"127.0.0.1:{port}"})
    assert "ok" in p.stdout


def test_memory_server_endpoint(tmp_path):
    secret = make_secret(tmp_path)
    srv = ServerProc("64MiB", secret, extra=["--metrics", "127.0.0.1:0"])
    try:
        m = srv.log.wait(r"metrics on http://", 30)
        mport = int(re.search(r":(\d+)/metrics", m.string).group(1))
        srv.ready()
        fams = scrape("127.0.0.1", mport)
        assert fams["pooltensor_server_memory_bytes"].samples[0].value == 64 << 20
        assert fams["pooltensor_server_clients"].samples[0].value == 0
        pt.finalize()
        pt.init(connect=[srv.address], secret_file=secret, memory=8 << 20, slab_size=4096)
        try:
            x = pt.ones(10_000)
            assert float(x.sum()) == 10_000
            assert np.array_equal(x.to_numpy(), np.ones(10_000))     # over the data port
            fams = scrape("127.0.0.1", mport)
            assert fams["pooltensor_server_clients"].samples[0].value == 1
            assert fams["pooltensor_server_free_bytes"].samples[0].value <= (64 - 8) << 20
            req = samples(fams["pooltensor_server_tcp_requests"],
                          "pooltensor_server_tcp_requests_total")[0].value
            assert req > 0
            # the command reads the same endpoint
            import json
            import subprocess
            import sys
            p = subprocess.run([sys.executable, "-m", "pooltensor", "stats",
                                f"127.0.0.1:{mport}", "--json"], capture_output=True,
                               text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            srv_stats = json.loads(p.stdout)["server"]
            assert srv_stats["clients"] == 1 and srv_stats["memory_bytes"] == 64 << 20
            assert srv_stats["tcp_requests_total"] == req
            t = subprocess.run([sys.executable, "-m", "pooltensor", "stats",
                                f"127.0.0.1:{mport}"], capture_output=True, text=True,
                               timeout=60)
            assert "server: 64.0 MiB lent" in t.stdout and "1 client(s)" in t.stdout
        finally:
            pt.finalize()
    finally:
        assert srv.stop() == 0


def test_native_buckets_fold_into_prometheus_buckets():
    """Values recorded through the native API land under the right `le`: the first bound at
    or above their native bucket's top (never below the value itself)."""
    from collectives import _native
    from pooltensor.pool import metrics
    ctx = _native.Context(0, 2, 1)
    try:
        values = [150e-9] * 3 + [1.5e-6] * 4 + [3e-4] * 2 + [7.0] + [500.0]
        for v in values:
            ctx.stats_record(1, "tcp", "put", 8, 0, v)
        entry = ctx.stats()[0][0]
        cum = dict(metrics.histogram_buckets(entry))
        assert cum["2e-07"] == 3 and cum["1e-07"] == 0
        assert cum["1e-06"] == 3 and cum["2e-06"] == 7
        assert cum["0.0002"] == 7 and cum["0.0005"] == 9
        assert cum["5.0"] == 9 and cum["10.0"] == 10
        assert cum["100.0"] == 10 and cum["+Inf"] == 11
        fams = {f.name: f for f in metrics.families("0", [entry], [])}
        h = fams["pooltensor_op_latency_seconds"]
        s = {x.name: x.value for x in h.samples if not x.name.endswith("_bucket")}
        assert s["pooltensor_op_latency_seconds_count"] == 11
        assert s["pooltensor_op_latency_seconds_sum"] == pytest.approx(sum(values), rel=1e-6)
    finally:
        ctx.close()
