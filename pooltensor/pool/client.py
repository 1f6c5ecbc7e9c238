"""A plain script's pool on memory servers: ``pooltensor.init(connect=["h1:7000", ...])``.

The script is member 0 and contributes no memory; members 1..k are the servers (started with
``pooltensor serve``), each giving this process the memory it asked for (collectives.remote).
Every slab lives on a server and is faulted in over tcp through the slab cache, with the
prefetcher ahead, exactly as a remote member's slab is in any pool; whole-array work runs
on the servers that hold its output (a plan on each one's control connection:
ServerChannel), each reading the input slabs it does not hold from the other servers
(pool/serve_work.py); what they cannot do (a strided output, a server that restarted) runs
in this process. The Pool is the usual one
with role "client" (one heap per server seen through an rw and an r key; placement over the
servers only). When the pool is finalized, or the script ends in any way, the control
connections close and the servers free the memory.
"""
import logging
import os
import select
import socket
import threading

from collectives import control as _ctl
from collectives import remote
from collectives.errors import PeerLost, PooltensorError, Timeout

from . import rejoin
from ..errors import PoolOutOfMemory
from .pool import DEFAULT_SLAB, Pool

log = logging.getLogger("pooltensor")


class ServerChannel:
    """Plans to one memory server, on its control connection (pool/work.py's Round speaks to
    it as to a member's socket pair). A server reads the input slabs it does not hold from
    the other servers that take plans (reach: pool/serve_work.py), or, an older one, computes
    only work whose inputs all live on it (aligned_only). It runs no user code unless started
    with --allow-code."""

    aligned_only = True
    in_step_after_timeout = True   # a late reply is dropped when it comes (remote._Server)

    def __init__(self, srv, heap_id, rank, world_size, slab, pool):
        self.srv, self.peer, self.pool = srv, rank, pool
        self.allow_code = bool(srv.facts.get("code", False))     # --allow-code
        self.reach = bool(srv.facts.get("peers", False))
        self.head = {"op": "plan", "id": heap_id, "rank": rank, "world": world_size,
                     "slab": slab}

    def peers(self):
        """The other servers this one may read from: those that still take plans (a server
        that restarted holds none of the slabs a plan names: pool/rejoin.py)."""
        pool, world = self.pool, self.pool.world
        keys = pool.win_ro._keys
        return [[r, world.server(r).ip, world.server(r).data_port, int(keys[r]),
                 world.hosts[r]] for r, ch in sorted(pool.chans.items())
                if r != self.peer and getattr(ch, "reach", False)]

    def _head(self):
        head = self.head
        if self.reach:       # a read from a peer gives up a little before this process
            head = dict(head, peers=self.peers(),      # does: PeerLost naming it, no Timeout
                        timeout=max(1.0, 0.8 * float(self.pool.timeout)))
        return head

    def fits(self, data):
        """Does a plan of these bytes fit in one control frame? (A server ends a connection
        that sends a bigger one: such work stays in this process, pool/work.py.)"""
        if len(data) + 4096 <= _ctl.PLAN_FRAME:
            return True
        import msgpack
        return len(msgpack.packb(dict(self._head(), data=data),
                                 use_bin_type=True)) <= _ctl.PLAN_FRAME

    def send(self, data):
        head = self._head()
        self.srv.lock.acquire()            # held until the reply is read (recv)
        try:
            _ctl.send_frame(self.srv.sock, dict(head, data=data))
        except (OSError, _ctl.ProtocolError) as e:
            self.srv.lock.release()
            raise PeerLost(f"memory server's control connection failed: {e}",
                           rank=self.peer, host=self.srv.address) from None

    def recv(self, timeout=None, alive=None):
        try:
            reply = self.srv.reply(timeout, max_frame=_ctl.REPLY_FRAME)
        except socket.timeout:
            raise Timeout(f"memory server did not finish its part within {timeout:g} s",
                          rank=self.peer, host=self.srv.address) from None
        except (OSError, _ctl.ProtocolError) as e:
            raise PeerLost(f"memory server's control connection failed: {e}",
                           rank=self.peer, host=self.srv.address) from None
        finally:
            self.srv.lock.release()
        if reply is None:
            raise PeerLost("memory server closed its control connection", rank=self.peer,
                           host=self.srv.address)
        if not reply.get("ok") or not isinstance(reply.get("data"), bytes):
            from .work import refusal
            return refusal(f"memory server {self.srv.address}: "
                           f"{reply.get('error', 'no reason given')}")
        return reply["data"]

    def close(self):
        pass

def connect_from_env():
    """The servers named by $POOLTENSOR_CONNECT (comma-separated host:port), or None."""
    v = os.environ.get(remote.ENV_CONNECT, "").strip()
    return v or None


def start(connect, *, secret_file=None, memory=None, timeout=None, partition=None, leases=None,
          **kw):
    """Connect to the servers and build the client Pool on them. partition: the servers'
    partition this process counts against (PoolOutOfMemory naming it when a server has
    less free to it than asked)."""
    try:
        world = remote.connect(connect, secret_file=secret_file, memory=memory,
                               timeout=timeout, partition=partition,
                               lend=leases[0] if leases else (0 if leases is False else None))
    except remote.ServerRefused as e:
        if partition is None or getattr(e, "free", None) is None:
            raise
        raise PoolOutOfMemory(str(e), free={e.rank: e.free}, needed=e.wanted,
                              partition=partition) from None
    if leases is False:
        leases = None                        # lease=0: the whole grant, lent up front
    elif leases is None and world.lent:      # the servers asked for leases (serve --lease)
        from .leases import PAGE, _gcd, check
        slab = kw.get("slab_size") or DEFAULT_SLAB
        unit = slab * PAGE // _gcd(slab, PAGE)          # whole slabs and pages
        leases = check(-(-max(world.lent.values()) // unit) * unit, None, None, None, slab)
    try:
        pool = Pool(world, role="client", memory=0, owns_world=True, leases=leases,
                    partition=None if partition is None else (partition, 0, None), **kw)
    except BaseException:
        world.close()
        raise
    ids = world.allocation_ids(pool.win_rw.buffer)
    pool.chans = {r: ServerChannel(world.server(r), ids[r], r, world.size, pool.slab_size, pool)
                  for r in range(1, world.size) if world.server(r).facts.get("plans")}
    pool.exclusive = False              # the servers write the slabs they compute
    Rejoiner(pool).start()
    return pool


class Rejoiner(threading.Thread):
    """Watches a client pool's servers and rejoins one that lost what it held (pool/rejoin.py):
    its data connection refused or answered by a new process (it restarted: PeerLost), or its
    control connection ended
    (the server frees what a client's control connection held when it closes). Tries every
    `every` seconds until the server answers again; stops with the pool."""

    def __init__(self, pool, every=0.5):
        super().__init__(daemon=True, name="pooltensor rejoin")
        self.pool, self.every = pool, every
        self.rejoined = 0

    def _dropped(self, srv):
        """The idle control connection ended (readable with nothing to read: its end)."""
        if not srv.lock.acquire(blocking=False):
            return False                # in use: a request in flight says it itself
        try:
            if not select.select([srv.sock], [], [], 0)[0]:
                return False
            try:
                return srv.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
            except BlockingIOError:
                return False
            except OSError:
                return True
        finally:
            srv.lock.release()

    def run(self):
        pool, world = self.pool, self.pool.world
        told = set()
        while not pool.closed:
            for r in range(1, world.size):
                if pool.closed:
                    return
                try:
                    if not (world._ctx.peer_lost(r) or self._dropped(world.server(r))):
                        continue
                    rejoin.rejoin(pool, r)
                    self.rejoined += 1
                    told.discard(r)
                except (PooltensorError, OSError, ValueError) as e:
                    if r not in told and not pool.closed:
                        told.add(r)
                        log.warning("pooltensor: memory server %s is gone; rejoining it when "
                                    "it answers again (%s)", world.hosts[r], e)
            threading.Event().wait(self.every)
