"""The Prometheus endpoint: a job's (``pooltensor.init(metrics=":9464")``,
$POOLTENSOR_METRICS) or a memory server's (``pooltensor serve --metrics HOST:PORT``) counters,
served over HTTP by prometheus_client in a thread of its own.

Nothing is counted here: each scrape reads the native counters (World.counters()) and the
pool's usage at that moment (collector pattern), so an endpoint nobody scrapes costs nothing.
The native latency histograms (1/32-wide buckets, collectives/counters.py) are folded into
Prometheus histograms with fixed ``le`` bounds (1-2-5 steps from 100 ns to 100 s; a native
bucket counts under the first bound at or above its top, so a quantile Prometheus estimates
from them errs slow, by at most the width of one of its own buckets).

Labels: ``member`` (who exports: this rank or member), ``peer`` (the other side; "group" for
a collective), ``transport`` (shm, tcp, ..., or world for a collective as a whole) and ``op``.
README.md, "Metrics", lists the metric names.
"""
import bisect
import os

from collectives import _native
from collectives.rendezvous.bootstrap import parse_address

ENV = "POOLTENSOR_METRICS"
LE = [m * 10.0 ** e for e in range(-7, 2) for m in (1, 2, 5)] + [100.0]   # seconds
_fold = None


def _folding():
    """For each native bucket, the index in LE it counts under (len(LE): +Inf)."""
    global _fold
    if _fold is None:
        _, hi = _native.hist_bounds()
        le_ns = [round(b * 1e9) for b in LE]
        _fold = [bisect.bisect_left(le_ns, h) for h in hi]
    return _fold


def histogram_buckets(entry):
    """[(le, cumulative count)] of one native entry, +Inf last (what add_metric takes)."""
    fold = _folding()
    counts = [0] * (len(LE) + 1)
    for i, n in entry["buckets"]:
        counts[fold[i]] += n
    out, acc = [], 0
    for le, n in zip(LE + [float("inf")], counts):
        acc += n
        out.append(("+Inf" if le == float("inf") else repr(le), acc))
    return out


def families(member, entries, links, usage=None, server=None, listen=None):
    """The metric families of one scrape (prometheus_client.core *MetricFamily objects).
    listen: {kind: "host:port"} of the ports this member listens on (what `pooltensor doctor
    --endpoint` tries to reach)."""
    from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                        HistogramMetricFamily)
    L = ["member", "peer", "transport", "op"]
    lat = HistogramMetricFamily("pooltensor_op_latency_seconds",
                                "latency of the operations that succeeded", labels=L)
    ops = CounterMetricFamily("pooltensor_ops", "operations started", labels=L)
    nbytes = CounterMetricFamily("pooltensor_bytes", "bytes moved by operations that "
                                 "succeeded", labels=L)
    errs = CounterMetricFamily("pooltensor_errors", "operations that failed", labels=L)
    touts = CounterMetricFamily("pooltensor_timeouts", "operations that timed out", labels=L)
    slowest = GaugeMetricFamily("pooltensor_op_latency_max_seconds", "the slowest operation "
                                "that succeeded", labels=L)
    for e in entries:
        lab = [member, "group" if e["peer"] < 0 else str(e["peer"]), e["transport"] or "?",
               e["op"]]
        lat.add_metric(lab, histogram_buckets(e), e["sum_ns"] / 1e9)
        ops.add_metric(lab, e["ops"])
        nbytes.add_metric(lab, e["bytes"])
        errs.add_metric(lab, e["errors"])
        touts.add_metric(lab, e["timeouts"])
        slowest.add_metric(lab, e["max_ns"] / 1e9)
    yield from (lat, ops, nbytes, errs, touts, slowest)
    events = CounterMetricFamily("pooltensor_link_events", "events of the link to a peer "
                                 "(connects, reconnects, retries, timeouts, errors, lost)",
                                 labels=["member", "peer", "event"])
    up = GaugeMetricFamily("pooltensor_peer_up", "1 when the peer is reached and not lost",
                           labels=["member", "peer", "transport"])
    lost = GaugeMetricFamily("pooltensor_peer_lost", "1 once the peer is known gone",
                             labels=["member", "peer"])
    for link in links:
        p = str(link["peer"])
        for ev, n in link["events"].items():
            events.add_metric([member, p, ev], n)
        up.add_metric([member, p, link["transport"] or "none"], int(link["state"] == "up"))
        lost.add_metric([member, p], int(link["state"] == "lost"))
    yield from (events, up, lost)
    if listen:
        f = GaugeMetricFamily("pooltensor_listen_info", "a port this member listens on "
                              "(tcp: the data path; control, data: a memory server's)",
                              labels=["member", "kind", "address"])
        for kind, address in sorted(listen.items()):
            f.add_metric([member, kind, address], 1)
        yield f
    if usage is not None:
        yield from _usage(member, usage)
    if server is not None:
        yield from _server(member, server)


def _usage(member, s):
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    g = {k: GaugeMetricFamily(f"pooltensor_member_{k}", doc, labels=["member", "host"])
         for k, doc in (("capacity_bytes", "bytes a member can lend to each heap"),
                        ("lent_bytes", "bytes a member lends to each heap now (leases)"),
                        ("used_bytes", "bytes allocated in a member's heaps"),
                        ("free_bytes", "bytes free in a member's heaps (capacity - used)"),
                        ("fragmentation_ratio", "1 - largest free run / free, read-write "
                                                "heap"),
                        ("share_ratio", "a member's part of the pool's capacity"))}
    for m in s["members"]:
        lab = [str(m["member"]), m["host"]]
        g["capacity_bytes"].add_metric(lab, m["capacity"])
        g["lent_bytes"].add_metric(lab, m.get("lent", m["capacity"]))
        g["used_bytes"].add_metric(lab, m["used"])
        g["free_bytes"].add_metric(lab, m["free"])
        g["fragmentation_ratio"].add_metric(lab, m["fragmentation"]["readwrite"])
        g["share_ratio"].add_metric(lab, m["share"])
    yield from g.values()
    c = s["cache"]
    for name, doc in (("hits", "slab cache hits"), ("misses", "slab cache misses"),
                      ("evictions", "slabs evicted"), ("bytes_fetched", "bytes faulted in"),
                      ("prefetch_issued", "slabs prefetched"),
                      ("prefetch_used", "prefetched slabs that were used")):
        f = CounterMetricFamily(f"pooltensor_cache_{name}", doc, labels=["member"])
        f.add_metric([member], c[name])
        yield f
    for name, value, doc in (
            ("pooltensor_cache_hit_ratio", c["hit_rate"], "hits / (hits + misses)"),
            ("pooltensor_prefetch_accuracy_ratio", c["prefetch_accuracy"],
             "prefetched slabs used / prefetched"),
            ("pooltensor_cache_bytes", c["cached_bytes"], "bytes held in the slab cache"),
            ("pooltensor_arrays", s["arrays"], "live pool arrays")):
        f = GaugeMetricFamily(name, doc, labels=["member"])
        f.add_metric([member], value)
        yield f


def _server(member, s):
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    for name, value, doc in (("memory_bytes", s["memory"], "bytes the server lends"),
                             ("free_bytes", s["free"], "bytes not given to a client"),
                             ("clients", s["clients"], "authenticated clients now")):
        f = GaugeMetricFamily(f"pooltensor_server_{name}", doc, labels=["member"])
        f.add_metric([member], value)
        yield f
    for group in ("control", "tcp"):
        for k, v in s[group].items():
            if k == "active":
                f = GaugeMetricFamily(f"pooltensor_server_{group}_active", "data connections "
                                      "open now", labels=["member"])
            else:
                f = CounterMetricFamily(f"pooltensor_server_{group}_{k}", f"{group}: {k}",
                                        labels=["member"])
            f.add_metric([member], v)
            yield f


class _Collector:
    def __init__(self, scrape):
        self._scrape = scrape

    def collect(self):
        yield from families(**self._scrape())


class Exporter:
    """An HTTP endpoint serving /metrics from scrape(), a callable that returns the keyword
    arguments of families(). host "" or "0.0.0.0": every interface; port 0: any free one
    (self.port says which)."""

    def __init__(self, scrape, host, port, routes=None):
        from prometheus_client import CollectorRegistry, start_http_server
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(scrape))
        self._server, self._thread = start_http_server(port, host or "0.0.0.0",
                                                       registry=self.registry)
        if routes:          # more paths, each answered with the JSON its callable returns
            self._server.set_app(_with_routes(self._server.get_app(), routes))
        self.host, self.port = host or "0.0.0.0", self._server.server_port

    def close(self):
        """Stop serving and free the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __repr__(self):
        return f"<pooltensor metrics on http://{self.host}:{self.port}/metrics>"


def _with_routes(app, routes):
    """A WSGI app answering `routes` (path -> callable returning a JSON-able value), the
    rest by `app`."""
    import json

    def routed(environ, start_response):
        fn = routes.get(environ.get("PATH_INFO"))
        if fn is None:
            return app(environ, start_response)
        try:
            body, status = json.dumps(fn()).encode(), "200 OK"
        except Exception as e:            # noqa: BLE001 (said to the caller)
            body = json.dumps({"error": f"{type(e).__name__}: {e}"}).encode()
            status = "500 Internal Server Error"
        start_response(status, [("Content-Type", "application/json"),
                                ("Content-Length", str(len(body)))])
        return [body]
    return routed


def parse(text, offset=0, what="metrics"):
    """"HOST:PORT" or ":PORT" (every interface) -> (host, port + offset). ValueError naming
    `what` otherwise."""
    text = str(text).strip()
    if text.startswith(":"):
        text = "0.0.0.0" + text
    try:
        host, port = parse_address(text, what)
    except Exception as e:
        raise ValueError(str(e)) from None
    if port and not 0 < port + offset <= 65535:
        raise ValueError(f"{what}: port {port} + local rank {offset} is past 65535")
    return host, port + offset if port else 0


def for_pool(pool, address):
    """Start the endpoint of a job's pool at address (SPMD: port + the rank's local rank, so
    ranks of one machine do not collide)."""
    from . import report
    world = pool.world
    # the rank's place among the ranks of its host (its local rank, unless
    # POOLTENSOR_TRANSPORT=tcp makes every rank a host of its own for the algorithms: the
    # ports are still the one machine's)
    offset = ([r for r in range(world.size) if world.hosts[r] == world.host].index(world.rank)
              if pool.role == "spmd" else 0)
    host, port = parse(address, offset, ENV if os.environ.get(ENV) == address else "metrics")

    last = [None]

    def scrape():
        entries, links = world.counters()
        # the pool's lock is held through collective calls (sync): a scrape must not wait on
        # one, so it serves the last usage it read when the lock is busy
        use = report.usage(pool, wait=0.2)
        last[0] = use = use if use is not None else last[0]
        return {"member": str(pool.me), "entries": entries, "links": links, "usage": use,
                "listen": {"tcp": world.listen_address} if world.listen_address else None}
    return Exporter(scrape, host, port, routes={"/check": pool.check})
