"""A world made of this process and memory servers: ``connect(["h1:7000", "h2:7000"])``.

Why: a plain script that pools the memory of other machines needs windows onto that memory,
and nothing else of a World (the servers run no user code, so there are no collectives to
run with them). RemoteWorld offers the part of World that windows and the pool use (rank,
size, hosts, transports, expose, alloc, barrier, describe, close), with:

- rank 0: this process; ranks 1..k: the servers, in the order given;
- one control connection per server (collectives.control: authenticated both ways, msgpack)
  that asks for memory and lasts as long as this world: when it closes (close(), exit, crash,
  SIGKILL) the server frees everything it gave this process;
- the data path: the native engine's tcp transport to each server's data port, with the same
  secret; this process's Python never handles the bytes on the server side.

expose(buffer, access) registers this process's buffer as World.expose does, and gets each
server's part from the server: a new allocation of the size it granted this process, or, when
`buffer` is one this world exposed before, a new key with `access` over that same server
memory (how the pool makes its read-only view of a heap).
"""
import os
import socket
import threading
import time
import weakref

from . import _native, counters, env
from . import control as _ctl
from .errors import BootstrapError, PeerLost, PooltensorError, Timeout
from .rendezvous.bootstrap import parse_address
from .rendezvous.store import default_timeout
from .window import LocalMemory, Window, raise_native

ENV_CONNECT = "POOLTENSOR_CONNECT"


ServerRefused = _ctl.ServerRefused     # a server said no: free memory, or one of its limits


class _Server:
    """The control connection to one server."""

    def __init__(self, rank, address, secret, timeout):
        self.rank, self.address = rank, address
        host, port = parse_address(address, "server address")
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except socket.timeout:
            raise BootstrapError(f"memory server {address} did not answer within {timeout} s",
                                 rank=rank, host=address) from None
        except OSError as e:
            raise BootstrapError(f"cannot reach memory server {address}: "
                                 f"{e.strerror or e} (is `pooltensor serve` running there?)",
                                 rank=rank, host=address) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _ctl.keepalive(sock)
        self.sock = sock
        self.lock = threading.Lock()
        try:
            self.facts = _ctl.client_handshake(sock, secret, f"memory server {address}",
                                               timeout)
        except PooltensorError as e:        # each says what happened; add where
            sock.close()
            raise type(e)(str(e), rank=rank, host=address) from None
        except (OSError, ValueError) as e:
            sock.close()
            raise BootstrapError(f"memory server {address}: handshake failed: {e}",
                                 rank=rank, host=address) from None
        sock.settimeout(timeout)             # each request: the handshake left its deadline
        self.timeout = timeout
        self.ip = sock.getpeername()[0]      # the data path goes where this connection went
        self.data_port = int(self.facts["data_port"])
        self.reader = _ctl.FrameReader(sock)
        self.owed = 0                        # replies to requests whose callers gave up

    def reply(self, timeout, max_frame=_ctl.MAX_FRAME):
        """The reply to the request just sent on this connection (self.lock held), None if
        the server closed it. The server answers in order, so the replies owed to requests
        whose callers stopped waiting (a partition, a slow plan) come first: they are read
        and dropped. When this one does not come within `timeout` (None: no limit) it is owed
        in turn (socket.timeout): the connection stays in step, and a late answer is never
        taken for the next request's."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if timeout is None:
            self.sock.settimeout(None)
        try:
            while self.owed:
                if self.reader.recv(deadline, _ctl.REPLY_FRAME) is None:
                    return None
                self.owed -= 1
            return self.reader.recv(deadline, max_frame)
        except socket.timeout:
            self.owed += 1
            raise
        finally:
            if timeout is None:
                self.sock.settimeout(self.timeout)

    def request(self, msg):
        """One request, its reply (a dict); PeerLost if the server is gone, ServerRefused if
        it says no, Timeout if it does not answer within the timeout (the connection stays
        usable: that answer is dropped when it comes)."""
        with self.lock:
            try:
                _ctl.send_frame(self.sock, msg)
                reply = self.reply(self.timeout)
            except socket.timeout:
                raise Timeout(f"memory server did not answer its control request "
                              f"({msg.get('op')}) within {self.timeout:g} s",
                              rank=self.rank, host=self.address) from None
            except (OSError, _ctl.ProtocolError) as e:
                raise PeerLost(f"memory server's control connection failed: {e}",
                               rank=self.rank, host=self.address) from None
        if reply is None:
            raise PeerLost("memory server closed its control connection", rank=self.rank,
                           host=self.address)
        if not reply.get("ok"):
            raise ServerRefused(f"memory server refused {msg.get('op')}: "
                                f"{reply.get('error', 'no reason given')}",
                                rank=self.rank, host=self.address)
        return reply

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def addresses(connect):
    """A list of "host:port" from a list or a comma-separated string."""
    if isinstance(connect, str):
        connect = [a for a in connect.split(",") if a.strip()]
    out = [str(a).strip() for a in connect]
    if not out:
        raise ValueError("connect= names no memory server")
    for a in out:
        parse_address(a, "server address")
    return out


def load_secret(secret_file=None):
    """The secret for servers: `secret_file`, else $POOLTENSOR_SECRET_FILE, else the file
    `pooltensor serve` makes by default (when it exists). ValueError saying what to do."""
    path = _ctl.secret_path(secret_file)
    if path is None:
        path = _ctl.default_secret_path()
        if not os.path.exists(path):
            raise ValueError(
                f"no secret for the memory servers: pass secret_file=, or set "
                f"{_ctl.ENV_SECRET}, to a copy of the server's secret file (`pooltensor serve` "
                f"prints where its secret is; by default {path})")
    return _ctl.read_secret(path)


class RemoteWorld(counters.Counted, LocalMemory):
    """This process (rank 0) and memory servers (ranks 1..k); made by connect()."""

    how = "connect"

    def __init__(self, servers, ctx, grants, timeout, secret=None, partition=None,
                 lend=None):
        self.timeout = timeout
        self.lent = {} if lend is None else {r: int(lend) for r in range(1, len(servers) + 1)}
        self.partition = partition            # what the servers count this process against
        self._secret = secret
        self._windows = []                    # (weakref to a Window, id(buffer), access, fresh)
        self.restarts = [0] * (len(servers) + 1)   # rejoins after a restart, per rank
        self.size = len(servers) + 1
        self.rank, self.local_rank, self.local_size, self.local_ranks = 0, 0, 1, [0]
        self._servers = {s.rank: s for s in servers}
        self._ctx = ctx
        self.grants = [0] + list(grants)      # bytes each server gives this process
        self.host = os.environ.get("POOLTENSOR_HOST") or socket.gethostname()
        self.hosts = [self.host] + [s.address for s in servers]
        self.transports = ["self"] + ["tcp"] * len(servers)
        self._tracker = counters.Tracker(ctx, self.hosts)   # (bandwidth: since now)
        self._segments = {}
        self._exposed = {}                    # id(buffer) -> (buffer, server ids per rank)
        self._closed = False

    # -- what windows and the pool use ---------------------------------------------------------
    def _lost(self):
        first = self._ctx.first_lost()
        rest = [r for r in range(1, self.size) if r != first and self._ctx.peer_lost(r)]
        return ([first] if first >= 0 else []) + rest

    def lost(self):
        """The ranks seen dead so far (by the native monitor or a failed transfer), the first
        one seen first; none once the world is closed."""
        return [] if self._closed else self._lost()

    def barrier(self, timeout=None):
        """Nothing to wait for: the servers run no user code (kept for World's interface)."""
        if self._closed:
            raise ValueError("the world is closed")

    def allgather_object(self, obj):
        """This process's object, then each server's description (role, host, memory it
        granted this process): the servers run no user code, so that is what they 'say'."""
        return [obj] + [{"role": "server", "host": self.hosts[r], "memory": self.grants[r]}
                        for r in range(1, self.size)]

    def expose(self, buffer, access="rw", remote=None):
        """This process's `buffer` (or int bytes, or None) plus memory on every server, as a
        Window. Each server's part: `remote` bytes (default: what it granted this process),
        freshly allocated; or, for a buffer exposed before, that same memory with `access`."""
        if self._closed:
            raise ValueError("the world is closed")
        again = self._exposed.get(id(buffer)) if buffer is not None else None
        if again is not None and again[0] is not buffer:
            again = None
        buffer, owned, key, nbytes = self._register_local(buffer, access)
        keys, sizes, ids = [key], [nbytes], [None]
        try:
            for r in range(1, self.size):
                srv = self._servers[r]
                if again is not None:
                    rep = srv.request({"op": "register", "id": again[1][r], "access": access})
                    size, aid = again[2][r], again[1][r]
                else:
                    want = self.grants[r] if remote is None else (
                        remote[r] if isinstance(remote, (list, tuple)) else int(remote))
                    msg = {"op": "alloc", "size": int(want), "access": access}
                    if remote is None and r in self.lent:
                        msg["lent"] = self.lent[r]     # the rest is lent later, if at all
                    rep = srv.request(msg)
                    size, aid = int(rep["size"]), rep["id"]
                keys.append(int(rep["key"]))
                sizes.append(size)
                ids.append(aid)
        except BaseException:
            for r in range(1, len(ids)):
                if again is None:
                    try:
                        self._servers[r].request({"op": "free", "id": ids[r]})
                    except PooltensorError:
                        pass
            self._ctx.deregister(key)
            raise
        if again is None:
            self._exposed[id(buffer)] = (buffer, ids, sizes)
        win = Window(self, buffer, access, keys, sizes, [access] * self.size, owned)
        self._windows.append((weakref.ref(win), id(buffer), access, again is None))
        return win

    def rejoin(self, rank):
        """Server `rank` restarted (or dropped this client, which frees what it gave): connect
        to it again and ask it for the memory it held for this process, so that new requests
        reach it. What the old memory held is gone: the windows keep working over the new
        memory, and it is for the caller to fence what was lost (Window.fence; the pool does,
        pooltensor.pool.rejoin). BootstrapError when the server is not back."""
        if self._closed:
            raise ValueError("the world is closed")
        old = self._servers[rank]
        srv = _Server(rank, old.address, self._secret, self.timeout)
        try:
            if self.partition is not None:
                srv.request({"op": "partition", "name": self.partition})
            fresh = {}                        # id(buffer) -> (allocation id, key)
            for bid, (buffer, ids, sizes) in self._exposed.items():
                acc = next((a for ref, b, a, first in self._windows if b == bid and first),
                           "rw")
                msg = {"op": "alloc", "size": int(sizes[rank]), "access": acc}
                if rank in self.lent:
                    msg["lent"] = self.lent[rank]
                rep = srv.request(msg)
                ids[rank] = rep["id"]
                fresh[bid] = int(rep["key"])
            for ref, bid, acc, first in self._windows:
                win = ref()
                if win is None or bid not in fresh:
                    continue
                key = fresh[bid] if first else int(srv.request(
                    {"op": "register", "id": self._exposed[bid][1][rank], "access": acc})["key"])
                win._keys[rank] = key
        except BaseException:
            srv.close()
            raise
        old.close()
        self._servers[rank] = srv
        try:
            self._ctx.connect_tcp(rank, srv.ip, srv.data_port)
            self._ctx.tcp_rejoin(rank)
        except _native.Error as e:
            raise_native(e, rank=rank, host=srv.address, what="rejoin")
        self.restarts[rank] += 1

    def lend(self, rank, buffer, nbytes):
        """Tell server `rank` that `nbytes` of the memory exposed with `buffer` are lent to
        this process now (it counts those; less than before, it frees the rest). True, or
        ServerRefused when it has not that much to lend."""
        aid = self._exposed[id(buffer)][1][rank]
        self._servers[rank].request({"op": "lend", "id": aid, "bytes": int(nbytes)})
        self.lent[rank] = int(nbytes)
        return True

    def allocation_ids(self, buffer):
        """Per rank, the server's id of the memory exposed with `buffer` (None for rank 0)."""
        got = self._exposed.get(id(buffer))
        if got is None or got[0] is not buffer:
            raise KeyError("that buffer was not exposed on this world")
        return list(got[1])

    def server(self, rank):
        """The control connection to the server at `rank` (its socket and lock)."""
        return self._servers[rank]

    def describe(self):
        """Ranks, hosts and the transport to each, plus each server's addresses and grant."""
        servers = []
        for r in range(1, self.size):
            s = self._servers[r]
            servers.append({"rank": r, "control": s.address, "data": f"{s.ip}:{s.data_port}",
                            "granted": self.grants[r], "server_host": s.facts.get("host"),
                            "server_pid": s.facts.get("pid"),
                            "lost": bool(self._ctx.peer_lost(r)) if not self._closed else None})
        out = {"rank": 0, "size": self.size, "local_rank": 0, "local_size": 1,
               "host": self.host, "hosts": list(self.hosts), "bootstrap": self.how,
               "transports": list(self.transports), "servers": servers}
        return out

    def server_info(self, rank):
        """What server `rank` reports now: its memory, free bytes, clients, tcp counters."""
        return self._servers[rank].request({"op": "info"})

    def close(self):
        """Close every control connection (the servers free what they gave this process),
        then the native engine."""
        if self._closed:
            return
        self._closed = True
        for s in self._servers.values():
            s.close()
        self._exposed.clear()
        self._ctx.close()

    def __repr__(self):
        return f"<RemoteWorld this process + {self.size - 1} memory server(s): " \
               f"{', '.join(self.hosts[1:])}>"


def connect(servers, *, secret_file=None, memory=None, timeout=None, threads=None,
            partition=None, lend=None):
    """A RemoteWorld over memory servers ("host:port" each, or one comma-separated string).

    memory: bytes to ask each server for (default: all it has free now); a server with less
    free is an error naming it. secret_file: the servers' secret (default
    $POOLTENSOR_SECRET_FILE, else `pooltensor serve`'s default file). partition: the
    partition of the servers (`pooltensor serve --partition`) this process's memory counts
    against; "free" is then what is free to it (ServerRefused naming it, with .free set,
    when that is less than asked). lend: bytes of each grant the servers count at first
    (the rest is lent later with RemoteWorld.lend; `memory` may then exceed what is free);
    None: what the servers ask (`pooltensor serve --lease`), 0: the whole grant."""
    addrs = addresses(servers)
    if len(set(addrs)) != len(addrs):
        raise ValueError(f"connect= names a server twice: {addrs}")
    secret = load_secret(secret_file)
    timeout = default_timeout() if timeout is None else float(timeout)
    if threads is None:
        threads = env.progress_threads()
    conns = []
    ctx = None
    try:
        for i, a in enumerate(addrs, 1):
            conns.append(_Server(i, a, secret, timeout))
        grants = []
        for s in conns:
            free = int(s.facts.get("free", 0))
            where = ""
            if partition is not None:
                free = int(s.request({"op": "partition", "name": partition})["free"])
                where = f" to partition {partition!r}"
            want = free if memory is None else int(memory)
            if lend is None and s.facts.get("lease"):
                lend = int(s.facts["lease"])     # the server asks its clients to lend so
            if lend is not None and 0 < int(lend) <= free and want > 0:
                grants.append(want)           # counted: only the lease lent at first
                continue
            if want <= 0 or want > free:
                e = ServerRefused(f"memory server {s.address} has {free} bytes free{where}; "
                                  f"{'asked for ' + str(want) if memory else 'none left'}",
                                  rank=s.rank, host=s.address)
                e.free, e.wanted = free, want
                raise e
            grants.append(want)
        ctx = _native.Context(0, len(addrs) + 1, threads)
        ctx.set_secret(secret)
        ctx.set_timeout(timeout)
        for s in conns:
            try:
                ctx.connect_tcp(s.rank, s.ip, s.data_port)
            except _native.Error as e:
                raise_native(e, rank=s.rank, host=s.address, what="connect")
        return RemoteWorld(conns, ctx, grants, timeout, secret, partition, lend or None)
    except BaseException:
        for s in conns:
            s.close()
        if ctx is not None:
            ctx.close()
        raise


__all__ = ["connect", "RemoteWorld", "ServerRefused", "addresses", "load_secret", "ENV_CONNECT"]
