"""A memory server runs a client's plan: the view of the client's pool it computes in, and
the one-sided reads it makes from the client's other servers.

Why: an operation whose inputs are not laid out like its output (``x[1:] + y[:-1]``, operands
placed on different servers) would otherwise run in the client, every byte travelling to it
and back. Instead each server computes the output slabs it holds and faults in the input
slabs it does not hold straight from the server that holds them, as SPMD ranks do: the
client sends plans and gets back only small results.

- ``plan {id, rank, world, slab, data, peers, timeout}`` on the control connection: `id` is
  the client's allocation here (its heap), `rank` the server's member number in the client's
  pool; `peers` lists the client's other servers this one may read from, each
  ``[rank, ip, data_port, key, name]`` (`key`: the client's read key there; `name`: the
  address the client knows it by, for errors). Everything is checked before use.
- Reads from a peer go through the server's own native engine (a connection per peer,
  authenticated with the server's secret: the servers of one pool share the client's) into
  the view's slab cache, with the prefetcher ahead; the peer checks key and bounds as for any
  client. Nothing is ever written to a peer: a plan that would is refused.
- The cache is emptied before every plan (pool/work.py's members do the same): between two
  plans the client and the other servers write.
- A peer that is gone, or does not answer within the plan's timeout (a little less than the
  client's own, so the client hears the server's answer first), fails the plan with PeerLost
  (or Timeout) naming that peer; the client raises it. Its connection is made again for the
  next plan.
"""

import numpy as np

from collectives import _native
from collectives.window import Request, raise_native

from .channel import MemberError

PEER_CACHE = 64 << 20        # bytes of peers' slabs a plan keeps in its cache at most
PEER_PREFETCH = 8            # slabs in flight ahead per input stream


class _Hostile(Exception):
    """A control message that breaks the protocol: the connection is closed."""


def _int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_peers(peers, size, me):
    """The `peers` of a plan message, checked: {rank: (ip, port, key, name)}."""
    if peers is None:
        return {}
    if not isinstance(peers, list) or len(peers) > size:
        raise _Hostile("a plan's peers must be a list of at most world entries")
    out = {}
    for p in peers:
        if not (isinstance(p, list) and len(p) == 5 and _int(p[0]) and isinstance(p[1], str)
                and _int(p[2]) and _int(p[3]) and isinstance(p[4], str)):
            raise _Hostile("a plan's peer is [rank, ip, data port, key, name]")
        rank, ip, port, key, name = p
        if not 0 < rank < size or rank == me or not 0 < port < 65536 or key < 0:
            raise _Hostile(f"bad peer in a plan: rank {rank}, port {port}, key {key}")
        out[rank] = (ip, port, key, name)
    return out


class _Link:
    """One native connection to a peer server's data port (rank 1 of a world of two)."""

    __slots__ = ("where", "ctx")

    def __init__(self, ip, port, secret, timeout):
        self.where = (ip, port)
        self.ctx = _native.Context(0, 2, 1)
        try:
            self.ctx.set_secret(secret)
            self.ctx.set_timeout(timeout)
            self.ctx.connect_tcp(1, ip, port)
        except BaseException:
            self.ctx.close()
            raise

    def close(self):
        try:
            self.ctx.close()
        except Exception:             # noqa: BLE001  (closing: nothing left to tell)
            pass


class PeerWindow:
    """Reads of the client's other servers' memory for a HeapView (Window.get's interface:
    rank, offset, out). Writes are refused: a server writes only the slabs it holds."""

    def __init__(self, view):
        self.view = view

    def _link(self, rank, offset, nbytes):
        v = self.view
        peer = v.peers.get(rank)
        if peer is None:
            raise MemberError(f"this plan needs member {rank}'s slabs, and the client did not "
                              f"say where that member is")
        ip, port, key, name = peer
        link = v.links.get(rank)
        if link is not None and (link.where != (ip, port) or link.ctx.peer_lost(1)):
            v.links.pop(rank).close()
            link = None
        if link is None:
            try:
                link = v.links[rank] = _Link(ip, port, v.secret, v.timeout)
            except _native.Error as e:
                raise_native(e, rank, name, offset, nbytes, what="connect")
        return link, key, (rank, name, offset, nbytes)

    def get(self, rank, offset, out):
        link, key, where = self._link(rank, offset, out.nbytes)
        try:
            link.ctx.get(1, key, offset, out)
        except _native.Error as e:
            raise_native(e, *where, what="get")
        return out

    def get_async(self, rank, offset, out):
        link, key, where = self._link(rank, offset, out.nbytes)
        try:
            req = Request(link.ctx.get_async(1, key, offset, out), where, "get")
        except _native.Error as e:
            raise_native(e, *where, what="get")
        return req

    def put(self, rank, *args):
        raise MemberError(f"a memory server writes only the slabs it holds; this plan would "
                          f"write member {rank}'s")

    put_async = put_indexed = put


class _PeerWorld:
    """What the cache's readers ask of a world: each member's transport and name."""

    def __init__(self, size, me):
        self.transports = ["tcp"] * size
        self.transports[me] = "self"
        self.hosts = [None] * size


class HeapView:
    """What the executors see of a pool when a server runs a client's plan: one allocation of
    this server (the client's heap here, both its rw and r keys) as the member `me` of the
    client's pool; the client's other servers' slabs are read one-sided (PeerWindow)."""

    role = "server"
    spmd = coherent = exclusive = closed = False
    pending = ()
    keeper = mover = None

    def __init__(self, alloc, me, size, slab, allow_code, secret=b""):
        from ..cache.slabs import SlabCache
        buf = np.frombuffer(memoryview(alloc.seg), np.uint8)
        self.me, self.size, self.slab_size = me, size, slab
        self.local = {"rw": buf, "ro": buf, "pv": None}
        self.mapped, self.mapped_w, self.chans, self.plans, self.used_hi = {}, {}, {}, {}, {}
        self.views = {}
        self.capacity = [0] * size
        self.capacity[me] = alloc.size
        self.nslabs = [c // slab for c in self.capacity]
        self.cache = SlabCache(slab, max(4 * slab, PEER_CACHE // slab * slab))
        self.max_prefetch = PEER_PREFETCH
        self.timeout = 60.0
        self.allow_code = allow_code
        self.secret = secret
        self.peers, self.links = {}, {}
        self.world = _PeerWorld(size, me)
        win = PeerWindow(self)
        self.read_win = {"rw": win, "ro": win}
        self.write_win = {"rw": win, "ro": win}

    def check_open(self):
        pass

    def slab_version(self, m, slot):
        return 0

    def plan(self, peers, timeout):
        """Before a plan: where the peers are now, and how long a read from one may take.
        A read still in flight from the last plan (a peer that stopped answering) is given
        up at once: its connection closes (the read fails, its frame is never reused), so
        emptying the cache does not wait it out."""
        from ..cache.slabs import _done
        if any(e.req is not None and not _done(e.req) for e in self.cache.entries.values()):
            self.close_links()
        self.peers = peers
        self.timeout = timeout
        self.cache.timeout = timeout
        for r, p in peers.items():
            self.world.hosts[r] = p[3]

    def close_links(self):
        for link in self.links.values():
            link.close()
        self.links.clear()

    def close(self):
        """The client is gone: its connections to the peers go too."""
        self.close_links()
        self.cache.clear()


def run_plan(server, c, msg):
    """Run a client's plan on the memory it was given here (work.py's vocabulary; user code
    only with --allow-code). The client says which allocation holds its heap, its rank for
    this server, the world size, the slab size and where its other servers are; all are
    checked."""
    aid, rank, size, slab = (msg.get(k) for k in ("id", "rank", "world", "slab"))
    data = msg.get("data")
    if not all(_int(v) for v in (aid, rank, size, slab)) or not isinstance(data, bytes):
        raise _Hostile("plan needs integer id, rank, world and slab, and bytes data")
    timeout = msg.get("timeout", 60.0)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or \
            not 0 < timeout <= 86400:
        raise _Hostile("a plan's timeout is a number of seconds, at most a day")
    if server._handle is None:
        return {"ok": False, "error": "this server runs no plans"}
    a = c.allocs.get(aid)
    if a is None:
        return {"ok": False, "error": f"no allocation {aid} on this connection"}
    if slab <= 0 or slab & (slab - 1) or a.size % slab or not 0 < rank < size <= 4096:
        return {"ok": False, "error": "bad slab size, rank or world size in a plan"}
    peers = check_peers(msg.get("peers"), size, rank)
    view = c.views.get(aid)
    if view is None or view.slab_size != slab or view.me != rank or view.size != size:
        if view is not None:
            view.close()
        view = c.views[aid] = HeapView(a, rank, size, slab, server.allow_code, server._secret)
    view.plan(peers, float(timeout))
    return {"ok": True, "data": server._handle(view, data)}


def close_views(c):
    """A client's connection ended: its views' peer connections close."""
    for v in c.views.values():
        v.close()
    c.views.clear()


__all__ = ["HeapView", "PeerWindow", "run_plan", "close_views", "check_peers"]
