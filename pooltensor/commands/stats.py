"""``pooltensor stats HOST:PORT``: what a metrics endpoint (a job's, ``pt.init(metrics=...)``,
or a memory server's, ``pooltensor serve --metrics``) says, once as text or JSON, or live
(``--watch``: a table refreshed in place with rich), or drawn (``--plot PATH``).

Percentiles here are estimated from the endpoint's Prometheus histograms the way Prometheus'
histogram_quantile() does (linear within a bucket); the job itself, pt.stats(), reads them
from the finer native histograms.
"""
import json
import sys
import time
import urllib.error
import urllib.request

INF = float("inf")


def add_parser(sub):
    """Register ``stats``."""
    p = sub.add_parser(
        "stats", help="read a job's or a server's metrics endpoint (once, live, or as a PNG)",
        description="Read the Prometheus endpoint of a job (pooltensor.init(metrics=...), "
                    "$POOLTENSOR_METRICS) or of a memory server (pooltensor serve --metrics) "
                    "and show members, usage, latency percentiles, bandwidth and peer health.")
    p.add_argument("address", metavar="HOST:PORT", help="the endpoint (http://HOST:PORT/metrics)")
    p.add_argument("--json", action="store_true", help="print one JSON object (with --watch: "
                   "one per refresh, a line each)")
    p.add_argument("--watch", action="store_true",
                   help="refresh in place until Ctrl-C (bandwidth: over each interval)")
    p.add_argument("--interval", type=float, default=2.0, metavar="S",
                   help="seconds between refreshes with --watch (default 2)")
    p.add_argument("--count", type=int, default=0, metavar="N",
                   help="with --watch, stop after N refreshes (default: never)")
    p.add_argument("--plot", metavar="PATH", help="also draw usage and latency histograms "
                   "into a PNG at PATH")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="seconds to wait for the endpoint (default 10)")
    p.set_defaults(run=run)
    return p


class EndpointError(Exception):
    """The endpoint could not be read (the message says why and where)."""


def scrape(address, timeout=10.0):
    """{family name: Metric} of http://address/metrics, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families
    url = address if "://" in address else f"http://{address}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            text = r.read().decode()
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise EndpointError(f"cannot read {url}: {reason}") from None
    try:
        return {f.name: f for f in text_string_to_metric_families(text)}
    except ValueError as e:
        raise EndpointError(f"{url} is not a Prometheus endpoint: {e}") from None


def quantile(q, buckets, count):
    """histogram_quantile(): buckets [(le, cumulative)] ascending, +Inf last."""
    if not count:
        return 0.0
    want = q * count
    prev_le, prev_n = 0.0, 0
    for le, n in buckets:
        if n >= want:
            if le == INF:
                return prev_le
            if n == prev_n:
                return le
            return prev_le + (le - prev_le) * (want - prev_n) / (n - prev_n)
        prev_le, prev_n = le, n
    return prev_le


def _key(labels):
    return (labels.get("member", ""), labels.get("peer", ""), labels.get("transport", ""),
            labels.get("op", ""))


def _values(fams, name, sample=None):
    f = fams.get(name)
    out = {}
    for s in f.samples if f else ():
        if sample is None or s.name == sample:
            out[_key(s.labels)] = s.value
    return out


def summarize(fams, before=None, dt=None):
    """The endpoint's state as a dict: members, operations (with bandwidth over dt since
    `before`, an earlier summarize()), peers, cache, server."""
    hist = {}
    f = fams.get("pooltensor_op_latency_seconds")
    for s in f.samples if f else ():
        k = _key(s.labels)
        h = hist.setdefault(k, {"buckets": [], "count": 0, "sum": 0.0})
        if s.name.endswith("_bucket"):
            le = s.labels["le"]
            h["buckets"].append((INF if le == "+Inf" else float(le), s.value))
        elif s.name.endswith("_count"):
            h["count"] = s.value
        elif s.name.endswith("_sum"):
            h["sum"] = s.value
    ops = _values(fams, "pooltensor_ops", "pooltensor_ops_total")
    nbytes = _values(fams, "pooltensor_bytes", "pooltensor_bytes_total")
    errs = _values(fams, "pooltensor_errors", "pooltensor_errors_total")
    touts = _values(fams, "pooltensor_timeouts", "pooltensor_timeouts_total")
    slowest = _values(fams, "pooltensor_op_latency_max_seconds")
    prev = {(o["member"], o["peer"], o["transport"], o["op"]): o
            for o in (before or {}).get("operations", [])}
    operations = []
    for k in sorted(set(ops) | set(hist)):
        h = hist.get(k, {"buckets": [], "count": 0, "sum": 0.0})
        b = sorted(h["buckets"])
        row = {"member": k[0], "peer": k[1], "transport": k[2], "op": k[3],
               "ops": int(ops.get(k, 0)), "bytes": int(nbytes.get(k, 0)),
               "errors": int(errs.get(k, 0)), "timeouts": int(touts.get(k, 0)),
               "p50_us": quantile(0.5, b, h["count"]) * 1e6,
               "p90_us": quantile(0.9, b, h["count"]) * 1e6,
               "p99_us": quantile(0.99, b, h["count"]) * 1e6,
               "max_us": slowest.get(k, 0.0) * 1e6,
               "mean_us": h["sum"] / h["count"] * 1e6 if h["count"] else 0.0,
               "buckets": b}
        if row["max_us"]:          # (interpolation can pass the slowest one: never report that)
            for q in ("p50_us", "p90_us", "p99_us"):
                row[q] = min(row[q], row["max_us"])
        if before is not None and dt:
            row["bandwidth"] = max(0, row["bytes"] - prev.get(k, {}).get("bytes", 0)) / dt
        operations.append(row)
    members = {}
    for name, field in (("pooltensor_member_capacity_bytes", "capacity"),
                        ("pooltensor_member_used_bytes", "used"),
                        ("pooltensor_member_free_bytes", "free"),
                        ("pooltensor_member_fragmentation_ratio", "fragmentation"),
                        ("pooltensor_member_share_ratio", "share")):
        f = fams.get(name)
        for s in f.samples if f else ():
            m = members.setdefault(s.labels["member"], {"member": s.labels["member"],
                                                        "host": s.labels.get("host")})
            m[field] = s.value
    peers = {}
    for name, field in (("pooltensor_peer_up", "up"), ("pooltensor_peer_lost", "lost")):
        f = fams.get(name)
        for s in f.samples if f else ():
            p = peers.setdefault((s.labels["member"], s.labels["peer"]),
                                 {"member": s.labels["member"], "peer": s.labels["peer"],
                                  "events": {}})
            p[field] = bool(s.value)
            if "transport" in s.labels:
                p["transport"] = s.labels["transport"]
    f = fams.get("pooltensor_link_events")
    for s in f.samples if f else ():
        if s.name.endswith("_total"):
            p = peers.get((s.labels["member"], s.labels["peer"]))
            if p is not None:
                p["events"][s.labels["event"]] = int(s.value)
    for p in peers.values():
        p["health"] = "lost" if p.get("lost") else "up" if p.get("up") else "unreached"
    out = {"operations": operations, "members": list(members.values()),
           "peers": list(peers.values())}
    cache = {}
    for name, field in (("pooltensor_cache_hit_ratio", "hit_rate"),
                        ("pooltensor_prefetch_accuracy_ratio", "prefetch_accuracy"),
                        ("pooltensor_cache_bytes", "cached_bytes")):
        f = fams.get(name)
        for s in f.samples if f else ():
            cache.setdefault(s.labels["member"], {})[field] = s.value
    if cache:
        out["cache"] = cache
    server = {}
    for name, f in fams.items():
        if name.startswith("pooltensor_server_"):
            for s in f.samples:
                server[s.name[len("pooltensor_server_"):]] = s.value
    if server:
        out["server"] = server
    return out


def _human(n):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _us(v):
    return f"{v / 1e6:.2f} s" if v >= 1e6 else f"{v / 1e3:.2f} ms" if v >= 1e3 else f"{v:.1f} us"


def tables(summary, address):
    """The summary as rich renderables (members, operations, peers, server)."""
    from rich.table import Table
    from rich.text import Text
    out = []
    if summary["members"]:
        t = Table(title=f"members of {address}", title_justify="left")
        for c in ("member", "host", "used", "of", "usage", "frag", "share"):
            t.add_column(c, justify="left" if c in ("host", "usage") else "right")
        for m in summary["members"]:
            cap, used = m.get("capacity", 0), m.get("used", 0)
            frac = used / cap if cap else 0.0
            bar = Text("█" * round(20 * frac) + "·" * (20 - round(20 * frac)),
                       style="green" if frac < 0.8 else "red")
            bar.append(f" {100 * frac:.0f}%")
            t.add_row(m["member"], m.get("host") or "", _human(used), _human(cap), bar,
                      f"{m.get('fragmentation', 0):.2f}", f"{100 * m.get('share', 0):.0f}%")
        out.append(t)
    t = Table(title="operations (latency of those that succeeded)", title_justify="left")
    for c in ("member", "peer", "transport", "op", "ops", "bytes", "P50", "P90", "P99", "max",
              "bandwidth", "errors"):
        t.add_column(c, justify="left" if c in ("transport", "op") else "right")
    for o in summary["operations"]:
        bw = o.get("bandwidth")
        t.add_row(o["member"], o["peer"], o["transport"], o["op"], str(o["ops"]),
                  _human(o["bytes"]), _us(o["p50_us"]), _us(o["p90_us"]), _us(o["p99_us"]),
                  _us(o["max_us"]), "-" if bw is None else _human(bw) + "/s",
                  Text(str(o["errors"]), style="red" if o["errors"] else ""))
    out.append(t)
    if summary["peers"]:
        t = Table(title="peers", title_justify="left")
        for c in ("member", "peer", "transport", "health", "errors", "timeouts", "retries",
                  "reconnects"):
            t.add_column(c)
        for p in summary["peers"]:
            ev = p["events"]
            t.add_row(p["member"], p["peer"], p.get("transport", ""),
                      Text(p["health"], style={"up": "green", "lost": "red"}.get(
                          p["health"], "yellow")),
                      str(ev.get("errors", 0)), str(ev.get("timeouts", 0)),
                      str(ev.get("retries", 0)), str(ev.get("reconnects", 0)))
        out.append(t)
    if "server" in summary:
        s = summary["server"]
        out.append(Text(f"server: {_human(s.get('memory_bytes', 0))} lent, "
                        f"{_human(s.get('free_bytes', 0))} free, "
                        f"{int(s.get('clients', 0))} client(s), "
                        f"{int(s.get('tcp_requests_total', 0))} requests served"))
    if "cache" in summary:
        for m, c in summary["cache"].items():
            out.append(Text(f"cache of member {m}: hit rate {100 * c.get('hit_rate', 0):.1f}%, "
                            f"prefetch accuracy {100 * c.get('prefetch_accuracy', 0):.1f}%, "
                            f"{_human(c.get('cached_bytes', 0))} held"))
    return out


def _for_json(summary):
    return {**summary, "operations": [{k: v for k, v in o.items() if k != "buckets"}
                                      for o in summary["operations"]]}


def plot(summary, path, address):
    """Draw the summary (usage per member, histograms per transport and op) into path."""
    from .. import report
    members = [(f"{m['member']} ({m.get('host')})", m.get("used", 0), m.get("capacity", 0))
               for m in summary["members"]]
    hists = {}
    for o in summary["operations"]:
        acc = hists.setdefault(f"{o['transport']} {o['op']}", {})
        prev_le, prev_n = 0.0, 0
        for le, n in o["buckets"]:
            if le != INF and n > prev_n:
                acc[(prev_le, le)] = acc.get((prev_le, le), 0) + n - prev_n
            prev_le, prev_n = le, n
    series = {k: [(lo * 1e9, hi * 1e9, n) for (lo, hi), n in sorted(v.items())]
              for k, v in hists.items() if v}
    return report.draw(path, members, series, f"pooltensor: {address}")


def run(args):
    """Show the endpoint once, or live with --watch; 1 when it cannot be read."""
    from rich.console import Console
    if args.interval <= 0:
        print("pooltensor stats: --interval must be positive", file=sys.stderr)
        return 2
    console = Console()
    try:
        before = summary = summarize(scrape(args.address, args.timeout))
        t_before = time.monotonic()
        if not args.watch:
            if args.json:
                print(json.dumps(_for_json(summary)))
            else:
                for r in tables(summary, args.address):
                    console.print(r)
            if args.plot:
                plot(summary, args.plot, args.address)
            return 0
        return _watch(args, console, before, t_before)
    except EndpointError as e:
        print(f"pooltensor stats: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


def _watch(args, console, before, t_before):
    from rich.console import Group
    from rich.live import Live
    n = 0
    summary = before

    def view(s):
        stamp = time.strftime("%H:%M:%S")
        return Group(*tables(s, args.address),
                     f"[dim]{stamp}, every {args.interval:g} s; Ctrl-C stops[/dim]")
    live = None if args.json else Live(view(summary), console=console, auto_refresh=False,
                                       transient=False)
    try:
        if live:
            live.start(refresh=True)
        while not args.count or n < args.count:
            time.sleep(args.interval)
            now = time.monotonic()
            summary = summarize(scrape(args.address, args.timeout), before, now - t_before)
            before, t_before = summary, now
            n += 1
            if live:
                live.update(view(summary), refresh=True)
            else:
                print(json.dumps(_for_json(summary)), flush=True)
    finally:
        if live:
            live.stop()
        if args.plot:
            plot(summary, args.plot, args.address)
    return 0
