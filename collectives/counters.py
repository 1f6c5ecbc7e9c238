"""What the native counters say, as plain dicts: latency percentiles per transport and
operation (and per peer), bandwidth over the last interval, and each peer's health.

The counting itself is native (native/src/core/stats.c, one cell per thread, no Python per
operation); this module only reads a snapshot (Context.stats()) and summarizes it. Percentiles
come from the native histograms through _native.hist_percentiles, so there is one definition
of them; histograms of several peers are merged bucket by bucket before a percentile is taken
(never averaged).
"""
import collections
import time

from . import _native

QUANTILES = (0.5, 0.9, 0.99)
# a (transport, op) cell's summary: what each field means is in README.md ("Stats")
_FIELDS = ("ops", "bytes", "errors", "timeouts", "timed", "count", "sum_ns")


def merge(cells):
    """One histogram-and-counters dict from several native entries (same transport and op)."""
    out = {k: 0 for k in _FIELDS}
    buckets = collections.Counter()
    lo, hi = None, 0
    for c in cells:
        for k in _FIELDS:
            out[k] += c[k]
        if c["count"]:
            lo = c["min_ns"] if lo is None else min(lo, c["min_ns"])
            hi = max(hi, c["max_ns"])
        for i, n in c["buckets"]:
            buckets[i] += n
    out["min_ns"], out["max_ns"] = lo or 0, hi
    out["buckets"] = sorted(buckets.items())
    return out


def summary(cell):
    """ops, bytes, errors, timeouts and latency P50/P90/P99/max/mean in microseconds of a
    merged cell (latency of the operations that succeeded)."""
    p = _native.hist_percentiles(cell["buckets"], cell["min_ns"], cell["max_ns"], QUANTILES)
    n = cell["count"]
    return {"ops": cell["ops"], "bytes": cell["bytes"], "errors": cell["errors"],
            "timeouts": cell["timeouts"],
            "p50_us": p[0] / 1e3, "p90_us": p[1] / 1e3, "p99_us": p[2] / 1e3,
            "max_us": cell["max_ns"] / 1e3, "mean_us": cell["sum_ns"] / n / 1e3 if n else 0.0}


def _by(entries, key):
    groups = collections.defaultdict(list)
    for e in entries:
        groups[key(e)].append(e)
    return groups


def _nested(groups):
    """{(transport, op): [entries]} -> {transport: {op: summary}}."""
    out = {}
    for (tr, op), cells in sorted(groups.items()):
        out.setdefault(tr, {})[op] = summary(merge(cells))
    return out


class Tracker:
    """Summaries of one native context, with the bytes of the previous call kept so that each
    call reports the bandwidth of the interval since the one before (the first: since the
    context was made)."""

    def __init__(self, ctx, hosts=None):
        self._ctx = ctx
        self._hosts = hosts
        self._last = (time.monotonic(), {}, {})
        self.started = self._last[0]

    def raw(self):
        """The native snapshot: (entries, links), as Context.stats() gives them."""
        return self._ctx.stats()

    def __call__(self, per_peer=False):
        entries, links = self.raw()
        now = time.monotonic()
        t_prev, bytes_prev, events_prev = self._last
        interval = max(now - t_prev, 1e-9)
        by_op = _by(entries, lambda e: (e["transport"], e["op"]))
        bandwidth = {}
        moved = {}
        for (tr, op), cells in by_op.items():
            b = sum(c["bytes"] for c in cells)
            moved[(tr, op)] = b
            bandwidth.setdefault(tr, {})[op] = (b - bytes_prev.get((tr, op), 0)) / interval
        per = _by(entries, lambda e: e["peer"])
        peers = []
        events_now = {}
        for link in links:
            r = link["peer"]
            ev = link["events"]
            events_now[r] = dict(ev)
            before = events_prev.get(r, {})
            fresh = {k: v - before.get(k, 0) for k, v in ev.items()}
            if link["state"] == "lost":
                health = "lost"
            elif link["state"] == "unreached":
                health = "unreached"
            elif any(fresh[k] for k in ("errors", "timeouts", "retries", "reconnects")):
                health = "degraded"
            else:
                health = "ok"
            peer = {"peer": r, "host": self._hosts[r] if self._hosts else None,
                    "state": link["state"], "health": health, "transport": link["transport"],
                    "events": dict(ev), "events_interval": fresh,
                    "last_error": link["last_error"], "last_error_op": link["last_error_op"],
                    "last_error_age_s": (time.time() - link["last_error_time"]
                                         if link["last_error"] else None)}
            if per_peer:
                cells = per.get(r, [])
                peer["latency"] = _nested(_by(cells, lambda e: (e["transport"], e["op"])))
            peers.append(peer)
        self._last = (now, moved, events_now)
        out = {"latency": _nested(by_op), "bandwidth": bandwidth, "interval_s": interval,
               "peers": peers}
        if per_peer and per.get(-1):
            out["group"] = _nested(_by(per[-1], lambda e: (e["transport"], e["op"])))
        return out


class Counted:
    """stats() and counters() for a world (World, RemoteWorld): what its native context
    (self._ctx) counted. Needs rank, size, host, hosts and _closed."""

    _tracker = None

    def _check_open(self, what):
        if self._closed:
            from .errors import Finalized
            raise Finalized(f"{what}() of a closed world", rank=self.rank, host=self.host)
        if self._tracker is None:
            self._tracker = Tracker(self._ctx, self.hosts)
        return self._tracker

    def stats(self, per_peer=False):
        """What this rank's transfers did, from the native counters (collectives/counters.py):
        {"latency": {transport: {op: {ops, bytes, errors, timeouts, p50_us, p90_us, p99_us,
        max_us, mean_us}}}, "bandwidth": {transport: {op: bytes/s since the previous call}},
        "interval_s", "peers": [{peer, host, state, health, transport, events, ...}]}; with
        per_peer=True each peer also gets its own "latency" (and collectives of the group,
        "group"). README.md, "Stats", says what each field means."""
        out = self._check_open("stats")(per_peer)
        out.update(rank=self.rank, host=self.host, size=self.size)
        return out

    def counters(self):
        """The native counters as they are: (entries, links), lists of dicts, each entry
        with its sparse latency histogram ("buckets": (index, count) pairs of
        _native.hist_bounds()); what stats() summarizes and the metrics endpoint exports."""
        return self._check_open("counters").raw()


def status_of(exc):
    """The native status a failed collective is counted with (errors; Timeout also as a
    timeout)."""
    if exc is None:
        return _native.OK
    from .errors import PeerLost, Timeout
    if isinstance(exc, Timeout):
        return _native.ERR_TIMEOUT
    if isinstance(exc, PeerLost):
        return _native.ERR_PEER_LOST
    return _native.ERR_SYS
