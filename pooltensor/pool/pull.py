"""A memory server fills a named allocation from other servers, forwarding while it receives.

Why: copying a model to N machines one after the other costs N transfers; in a chain where
each receiver reads from the one before it while that one is still receiving, it costs
about one transfer plus the time to fill the pipeline. The servers do it themselves, so
the bytes go server to server, never through the client that asked.

``name_pull {name, total, routes, timeout}`` (names.py made ``name`` with at least
total + 8 bytes): a thread of this server reads the `total` bytes into it, a CHUNK at a
time and DEPTH chunks asked for at once (so the link does not idle between chunks), through
its own native engine connected to each source's data port with the server's secret
(one-sided gets, checked at the source like every other read). A route is a list of pieces
``{ip, port, key, off, len, dst, prog}`` that tile [0, total); ``prog`` is the offset, in
that source, of the source's own progress word when the source is itself being filled (it
is read again whenever what the source had is asked for, so a receiver never reads past
what its source has), else None. The progress word of this allocation is the int64 at offset `total`:
bytes received so far, or -1 once it failed. When a source fails (gone, refusing, failed
itself, or not moving for `timeout` seconds) it is not asked again: each later chunk comes
from the first route whose source for it is still good; with none left the allocation is
marked failed, and its error is kept for ``name_list``, with the pull's trace (seconds
connecting, in gets, waiting for a source with nothing new, the slowest get, when the first
chunk landed and the last): bench/store.py reads it to say where a replication's time went.
"""
import collections
import threading
import time

import numpy as np

from collectives import _native

CHUNK = 4 << 20
DEPTH = 2               # chunks asked for at once: the next one is asked for while one arrives
FAILED = -1


class PullError(Exception):
    """A source cannot give what a pull needs."""


def check_routes(routes, total):
    """The routes of a name_pull message, checked (ValueError says what is wrong)."""
    if not isinstance(routes, list) or not routes:
        raise ValueError("name_pull needs a non-empty list of routes")
    for route in routes:
        at = 0
        for p in sorted(route, key=lambda p: p.get("dst", -1)):
            if not all(isinstance(p.get(k), int) for k in ("port", "key", "off", "len", "dst")) \
                    or not isinstance(p.get("ip"), str) or p["dst"] != at or p["len"] <= 0 or \
                    not (p.get("prog") is None or isinstance(p.get("prog"), int)):
                raise ValueError("a route's pieces must tile the bytes in order: ip, port, key, "
                                 "off, len, dst (and prog: None or an offset)")
            at += p["len"]
        if at != total:
            raise ValueError(f"a route covers {at} bytes, not {total}")
    return routes


class Puller(threading.Thread):
    """Fills buffer `buf` (a numpy uint8 view of the named allocation) from `routes`."""

    def __init__(self, buf, total, routes, secret, timeout, log):
        super().__init__(daemon=True, name="pooltensor pull")
        self.buf, self.total, self.routes = buf, total, routes
        self.secret, self.timeout, self.log = secret, timeout, log
        self.progress = buf[total:total + 8].view(np.int64)
        self.progress[0] = 0
        self.error = None
        self.stopped = False
        self.done = 0
        self._ctx = {}
        # gets in flight, oldest first: ("chunk", request, at, n) or ("prog", request, word)
        self._inflight = collections.deque()
        self._piece, self._issued, self._have = None, 0, None
        # where the pull's time went, for name_list (a benchmark's account of a replication):
        # seconds connecting, in gets (reading the progress word and the chunks), waiting for
        # a source that had nothing new, the slowest get, the most chunks in flight at once,
        # and when the first chunk landed and the last (from the start of the pull)
        self.trace = {"connect": 0.0, "get": 0.0, "wait": 0.0, "slowest": 0.0, "chunks": 0,
                      "in_flight": 0, "first": None, "elapsed": None}
        self._t0 = time.perf_counter()

    def _conn(self, p):
        where = (p["ip"], p["port"])
        ctx = self._ctx.get(where)
        if ctx is None:
            t = time.perf_counter()
            ctx = _native.Context(0, 2, 1)
            ctx.set_secret(self.secret)
            ctx.set_timeout(self.timeout)
            try:
                ctx.connect_tcp(1, p["ip"], p["port"])
            except _native.Error as e:
                ctx.close()
                raise PullError(f"cannot reach {p['ip']}:{p['port']}: {e}") from None
            self._ctx[where] = ctx
            self.trace["connect"] += time.perf_counter() - t
        return ctx

    def _drain(self):
        """Wait out every get still in flight (their bytes land in the buffer, or their
        source failed): none may write into the buffer after this pull moves on or stops."""
        while self._inflight:
            op = self._inflight.popleft()
            try:
                op[1].wait()
            except _native.Error:
                pass

    def _step(self, p):
        """Keep up to DEPTH chunks of piece p in flight (and, when its source is itself being
        filled, a read of its progress word whenever what it had is used up), then land the
        oldest; a short wait when the source has nothing new. PullError when the source
        cannot give it. Why more than one in flight: one get at a time leaves the link idle
        for a round trip and a wake-up between chunks (on a busy machine, a sixth of a
        1 Gbit/s link's time)."""
        if self._piece is not p:                # a new piece or a new source: start afresh
            self._drain()
            self._piece, self._issued = p, self.done
            self._have = p["dst"] + p["len"] if p["prog"] is None else None
        ctx = self._conn(p)
        tr, q, where = self.trace, self._inflight, f"{p['ip']}:{p['port']}"
        try:
            t = time.perf_counter()
            if p["prog"] is not None and (self._have is None or self._issued >= self._have) \
                    and not any(op[0] == "prog" for op in q):
                word = np.zeros(1, np.int64)
                q.append(("prog", ctx.get_async(1, p["key"], p["prog"], word.view(np.uint8)),
                          word))
            while self._have is not None and self._issued < self._have and \
                    sum(op[0] == "chunk" for op in q) < DEPTH:
                at = self._issued
                n = min(CHUNK, self._have - at)
                q.append(("chunk", ctx.get_async(1, p["key"], p["off"] + at - p["dst"],
                                                 self.buf[at:at + n]), at, n))
                self._issued = at + n
            tr["in_flight"] = max(tr["in_flight"], sum(op[0] == "chunk" for op in q))
            op = q.popleft()
            op[1].wait()
        except _native.Error as e:
            raise PullError(f"the source {where}: {e}") from None
        if op[0] == "prog":
            word = op[2]
            if word[0] == FAILED:
                raise PullError(f"the source {where} failed to fill itself")
            self._have = p["dst"] + min(p["len"], max(0, int(word[0]) - p["off"]))
            if self._have <= self._issued and not q:        # nothing new there yet
                if time.monotonic() - self.still > self.timeout:
                    raise PullError(f"the source {where} sent nothing for {self.timeout:g} s")
                time.sleep(0.002)
                tr["wait"] += time.perf_counter() - t
            else:
                tr["get"] += time.perf_counter() - t
            return
        _, _, at, n = op
        t1 = time.perf_counter()
        tr["get"] += t1 - t
        tr["slowest"] = max(tr["slowest"], t1 - t)
        tr["chunks"] += 1
        if tr["first"] is None:
            tr["first"] = t1 - self._t0
        self.done = at + n
        self.progress[0] = self.done
        self.still = time.monotonic()

    def run(self):
        """Each chunk from the first route whose source for it is still good: a failed
        source is never asked again, and its bytes come from the next route that has them."""
        dead = {}
        self.still = time.monotonic()
        try:
            while self.done < self.total and not self.stopped:
                at = self.done
                p = next((q for route in self.routes for q in route
                          if q["dst"] <= at < q["dst"] + q["len"] and
                          (q["ip"], q["port"]) not in dead), None)
                if p is None:
                    self.error = "; ".join(dead.values()) or "no source"
                    self.progress[0] = FAILED
                    self.log(f"pull failed: {self.error}")
                    return
                try:
                    self._step(p)
                except PullError as e:
                    self._drain()
                    self._piece = None
                    dead[p["ip"], p["port"]] = str(e)
                    self.still = time.monotonic()
        finally:
            self._drain()
            self.trace["elapsed"] = time.perf_counter() - self._t0
            for ctx in self._ctx.values():
                try:
                    ctx.close()
                except Exception:
                    pass
