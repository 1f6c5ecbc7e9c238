"""Named memory on a memory server: allocations that outlive the connection that made them.

Why: a client's memory is freed when its control connection ends, but model weights loaded
once must stay for the readers that come after the loader has left (pooltensor.store). A
named allocation belongs to the server, not to a connection:

- ``name_alloc {name, size, pending}``: a new named allocation (counted against --memory
  like any other), registered twice: an rw key (for whoever fills it) and an r key (for
  readers; the engine refuses puts through it). ``size`` 0 makes an entry with no memory (a
  pointer: its ``meta`` only). ``pending``: it is dropped when the connection that made it
  ends before ``name_keep {name}`` (a loader that dies halfway leaves nothing behind).
- ``name_set {name, meta}``: replace its metadata (bytes, at most META_LIMIT): one assignment
  under the server's lock, so a reader sees the old or the new metadata, never a mix.
- ``name_get {name}``: its r key, size and metadata; the connection now *holds* it.
- ``name_release {name}``: the connection no longer holds it (also when the connection ends).
- ``name_drop {name}``: the name goes at once (a new one may take it); the memory is freed
  when no connection holds it any more, so readers of a dropped entry keep reading it.
- ``name_list``: every name with its size, holders and metadata (and, for one being
  filled, bytes pulled so far, the error if it failed, and the pull's trace: where its time
  went, pull.py).
- ``name_pull {name, total, routes, timeout}``: fill it from other servers (pull.py).

The server keeps at most MAX_NAMES entries; each holds one segment and two keys of the
native tables (a full table is refused with a message saying so).
"""
import threading

META_LIMIT = 16 << 20
MAX_NAMES = 64
NAME_MAX = 255


class _Named:
    __slots__ = ("name", "alloc", "meta", "holders", "dropped", "puller", "owner")

    def __init__(self, name, alloc):
        self.name, self.alloc, self.meta = name, alloc, b""
        self.holders, self.dropped = set(), False
        self.puller = None              # pull.Puller filling it, if one was asked to
        self.owner = None               # the connection that made it, until name_keep


class Names:
    """The server's named allocations (see the module docstring). `server` gives memory
    (_segment, _register, _release)."""

    def __init__(self, server):
        self.server = server
        self.lock = threading.Lock()
        self.live = {}          # name -> _Named
        self.gone = []          # dropped entries still held by a connection

    def request(self, c, msg):
        op, name = msg.get("op"), msg.get("name")
        if op == "name_list":
            with self.lock:
                return {"ok": True, "names": [
                    {"name": n.name, "size": n.alloc.size if n.alloc else 0,
                     "holders": len(n.holders), "meta": n.meta,
                     "pulled": int(n.puller.progress[0]) if n.puller else None,
                     "error": n.puller.error if n.puller else None,
                     "trace": dict(n.puller.trace) if n.puller else None}
                    for n in self.live.values()]}
        if not isinstance(name, str) or not 0 < len(name) <= NAME_MAX:
            return {"ok": False, "error": f"a name is a string of 1..{NAME_MAX} characters"}
        if op == "name_alloc":
            reply = self._alloc(name, msg.get("size"))
            if reply["ok"] and msg.get("pending"):
                with self.lock:
                    n = self.live[name]
                    n.owner = c.seq
                    c.holds.add(n)
            return reply
        if op == "name_keep":
            with self.lock:
                n = self.live.get(name)
                if n is None:
                    return self._missing(name)
                n.owner = None
            return {"ok": True}
        if op == "name_set":
            meta = msg.get("meta")
            if not isinstance(meta, bytes) or len(meta) > META_LIMIT:
                return {"ok": False, "error": f"meta must be bytes, at most {META_LIMIT}"}
            with self.lock:
                n = self.live.get(name)
                if n is None:
                    return self._missing(name)
                n.meta = meta
            return {"ok": True}
        if op == "name_pull":
            return self._pull(name, msg)
        if op == "name_get":
            with self.lock:
                n = self.live.get(name)
                if n is None:
                    return self._missing(name)
                n.holders.add(c.seq)
                c.holds.add(n)
                a = n.alloc
                return {"ok": True, "size": a.size if a else 0, "meta": n.meta,
                        "key": a.keys[1] if a else None, "data_port": self.server.data_port}
        if op == "name_release":
            with self.lock:
                n = self.live.get(name) or next((g for g in self.gone if g.name == name
                                                 and c.seq in g.holders), None)
                if n is None:
                    return self._missing(name)
            self._unhold(c, n)
            return {"ok": True}
        if op == "name_drop":
            with self.lock:
                n = self.live.pop(name, None)
                if n is None:
                    return self._missing(name)
                n.dropped = True
                free_now = not n.holders
                if not free_now:
                    self.gone.append(n)
            if free_now:
                self._free(n)
            return {"ok": True, "held": not free_now}
        return None

    def _missing(self, name):
        return {"ok": False, "error": f"no name {name!r} on this server", "missing": True}

    def _alloc(self, name, size):
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            return {"ok": False, "error": "name_alloc needs a size >= 0"}
        with self.lock:
            if name in self.live:
                return {"ok": False, "error": f"the name {name!r} is taken", "taken": True}
            if len(self.live) + len(self.gone) >= MAX_NAMES:
                return {"ok": False, "error": f"at most {MAX_NAMES} named allocations"}
            n = self.live[name] = _Named(name, None)
        if size:
            a = self._segment(size)
            if isinstance(a, dict):             # refused: the reason
                with self.lock:
                    self.live.pop(name, None)
                return a
            n.alloc = a
        return {"ok": True, "size": n.alloc.size if n.alloc else 0,
                "key": n.alloc.keys[0] if n.alloc else None,
                "rkey": n.alloc.keys[1] if n.alloc else None,
                "data_port": self.server.data_port}

    def _segment(self, size):
        """A segment of `size` bytes owned by the server (counted against its memory) with
        an rw and an r key, or the refusal (a dict)."""
        srv = self.server
        a = srv._segment(size)
        if isinstance(a, dict):
            return a
        for access in ("rw", "r"):
            reply = srv._register(a, access)
            if not reply["ok"]:
                srv._release(a)
                return reply
        return a

    def _unhold(self, c, n):
        with self.lock:
            n.holders.discard(c.seq)
            c.holds.discard(n)
            free_now = n.dropped and not n.holders and n in self.gone
            if free_now:
                self.gone.remove(n)
        if free_now:
            self._free(n)

    def _free(self, n):
        if n.puller is not None:            # it writes into the memory: stop it first
            n.puller.stopped = True
            n.puller.join(10)
        if n.alloc is not None:
            self.server._release(n.alloc)

    def _pull(self, name, msg):
        from . import pull
        total, timeout = msg.get("total"), msg.get("timeout", 30.0)
        with self.lock:
            n = self.live.get(name)
            if n is None:
                return self._missing(name)
            if n.puller is not None:
                return {"ok": False, "error": f"{name!r} is being filled already"}
            if not isinstance(total, int) or total <= 0 or n.alloc is None or \
                    n.alloc.size < total + 8 or not isinstance(timeout, (int, float)):
                return {"ok": False, "error": "name_pull needs total > 0 with room for it "
                                              "and its progress word, and a timeout"}
            try:
                routes = pull.check_routes(msg.get("routes"), total)
            except ValueError as e:
                return {"ok": False, "error": str(e)}
            import numpy as np
            buf = np.frombuffer(memoryview(n.alloc.seg), np.uint8)
            n.puller = pull.Puller(buf, total, routes, self.server._secret, float(timeout),
                                   self.server._log)
        n.puller.start()
        return {"ok": True}

    def ended(self, c):
        """Connection c is gone: it holds nothing any more, and what it made pending (not
        kept yet) is dropped."""
        for n in list(c.holds):
            if n.owner == c.seq and not n.dropped:
                with self.lock:
                    if self.live.get(n.name) is n:
                        del self.live[n.name]
                        n.dropped = True
                        self.gone.append(n)
            self._unhold(c, n)

    def release_all(self):
        """The server stops: every named allocation goes."""
        with self.lock:
            every = list(self.live.values()) + self.gone
            self.live, self.gone = {}, []
        for n in every:
            self._free(n)
