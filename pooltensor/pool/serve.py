"""Memory servers: ``pooltensor serve --memory 8GiB --listen HOST:PORT``.

A server contributes memory to the pools of the processes that connect to it
(``pooltensor.init(connect=["host:port", ...])``) until it is stopped (SIGTERM or SIGINT: a
clean exit, status 0).

Two channels, one port each:

- control (this module, Python): a TCP listener on --listen. A client authenticates (HMAC
  challenge-response both ways, see collectives.control), then asks for memory: each request
  gets its own memfd segment, registered with the native engine with the access asked for
  ("r" or "rw"), and the reply carries its key, size and the data port. The connection is the
  client's lifetime: when it closes (exit, crash, SIGKILL, host gone: keepalive) everything
  the client was given is deregistered and freed. Requests count against --memory; one that
  does not fit is refused with the free bytes in the message.
- data (native): the engine listens on the data port and serves get/put/atomics into the
  registrations in its own threads, checking key, bounds and access on every request and
  accepting only connections that prove the same secret. This Python never sees those bytes.

Limits, so that no peer can take the server from the others (each can be set through
$POOLTENSOR_SERVE_<NAME>, see limits_from_env):

- a connection has handshake_timeout seconds for its whole handshake (a deadline, not a
  timeout per recv: trickling bytes does not extend it);
- connections still authenticating have a budget of their own (max_pending); past it the
  oldest of them is dropped for the newest, so a flood of them never locks clients out;
- authenticated connections: max_clients at once, at most max_per_host from one address;
- each client may hold NATIVE_SEGMENTS // max_clients allocations and NATIVE_KEYS //
  max_clients registrations: its share of the native tables, so that every client can
  always get its own whatever the others do; bytes are bounded by --memory.
A client at a limit is told which one; the others are not affected.

A malformed or hostile control frame closes that connection only; the server stays up.
One line per connect and disconnect goes to stderr (the logging module, one handler: each
line is written whole, whatever the threads do).
"""
import logging
import math
import os
import selectors
import signal
import socket
import sys
import threading
import time

from collectives import _native
from collectives import control as _ctl
from collectives.rendezvous.bootstrap import machine_identity, parse_address

from . import partitions as _partitions
from .serve_work import _Hostile, close_views, run_plan
from .sizes import parse_bytes  # noqa: F401  (the command's, and the tests')

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
NATIVE_SEGMENTS = 256    # the native engine's tables: segments and registrations (keys)
NATIVE_KEYS = 1024
AUTH_TIMEOUT = 10.0      # seconds a new connection has for its whole handshake
MAX_CLIENTS = 32         # authenticated control connections at once
MAX_PER_HOST = 16        # ... of which from one address
MAX_PENDING = 128        # connections still authenticating (then the oldest is dropped)
ENV_LIMIT = "POOLTENSOR_SERVE_"
_LIMITS = {"handshake_timeout": AUTH_TIMEOUT, "max_clients": MAX_CLIENTS,
           "max_per_host": MAX_PER_HOST, "max_pending": MAX_PENDING}
_ACCESS = {"r": 1, "rw": 3}


def human(n):
    """Bytes for a log line: 1.5 GiB, 64.0 MiB, 512 B."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def check_limits(handshake_timeout=AUTH_TIMEOUT, max_clients=MAX_CLIENTS,
                 max_per_host=MAX_PER_HOST, max_pending=MAX_PENDING, *, names=None):
    """The server's limits, checked (ValueError/TypeError naming the bad one, by its name in
    `names` when given), as a dict."""
    def name(n):
        return (names or {}).get(n, n)
    out = {}
    for n, v in (("max_clients", max_clients), ("max_per_host", max_per_host),
                 ("max_pending", max_pending)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name(n)} must be an integer, not {type(v).__name__}")
        out[n] = v
    if not 1 <= max_clients <= NATIVE_SEGMENTS:
        raise ValueError(f"{name('max_clients')} must be 1..{NATIVE_SEGMENTS} (each client "
                         f"needs an entry of the native segment table), not {max_clients}")
    for n in ("max_per_host", "max_pending"):
        if out[n] < 1:
            raise ValueError(f"{name(n)} must be >= 1, not {out[n]}")
    if isinstance(handshake_timeout, bool) or not isinstance(handshake_timeout, (int, float)):
        raise TypeError(f"{name('handshake_timeout')} must be a number of seconds, not "
                        f"{type(handshake_timeout).__name__}")
    if not (math.isfinite(handshake_timeout) and handshake_timeout > 0):
        raise ValueError(f"{name('handshake_timeout')} must be a positive number of seconds, "
                         f"not {handshake_timeout}")
    out["handshake_timeout"] = float(handshake_timeout)
    return out


def limits_from_env(environ=None):
    """The limits, each taken from $POOLTENSOR_SERVE_<NAME> when set (HANDSHAKE_TIMEOUT
    seconds; MAX_CLIENTS, MAX_PER_HOST, MAX_PENDING counts), else its default; ValueError
    naming the variable for a value that is not one."""
    environ = os.environ if environ is None else environ
    kw = {}
    for name, default in _LIMITS.items():
        var = ENV_LIMIT + name.upper()
        text = environ.get(var, "").strip()
        if not text:
            continue
        try:
            kw[name] = float(text) if isinstance(default, float) else int(text)
        except ValueError:
            raise ValueError(f"{var}={text!r} is not a "
                             f"{'number' if isinstance(default, float) else 'whole number'}"
                             ) from None
    return check_limits(**kw, names={n: ENV_LIMIT + n.upper() for n in _LIMITS})


def _native_text(e):
    """What a native error (or MemoryError) says, without the status tuple."""
    if isinstance(e, _native.Error) and len(e.args) >= 3:
        return str(e.args[2])
    return str(e) or type(e).__name__


_logger = logging.getLogger("pooltensor.serve")


def stderr_log():
    """The server's log function: one line per call on stderr, each written whole (one
    logging handler, which holds its lock around each write), prefixed 'pooltensor serve: '."""
    if not any(getattr(h, "pooltensor_serve", False) for h in _logger.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("pooltensor serve: %(message)s"))
        h.pooltensor_serve = True
        _logger.addHandler(h)
        _logger.setLevel(logging.INFO)
        _logger.propagate = False
    return _logger.info


class _Alloc:
    __slots__ = ("id", "seg", "size", "keys", "released", "partition", "lent")

    def __init__(self, aid, seg, size, partition, lent):
        self.id, self.seg, self.size, self.keys = aid, seg, size, []
        self.partition = partition
        self.lent = lent            # bytes counted against --memory (leases.py: lend)
        self.released = False


class _Client:
    """One control connection and what it was given."""

    def __init__(self, sock, addr, seq):
        self.sock, self.host, self.addr = sock, addr[0], f"{addr[0]}:{addr[1]}"
        self.seq = seq
        self.allocs = {}
        self.views = {}                # allocation id -> HeapView (plans run on it)
        self.next_id = 1
        self.holds = set()             # named allocations it holds (names.py)
        self.state = "pending"         # -> "authed", or "dropped" (evicted while pending)
        self.partition = _partitions.DEFAULT     # what its bytes count against

    @property
    def authenticated(self):
        return self.state == "authed"

    def nkeys(self):
        return sum(len(a.keys) for a in self.allocs.values())


class Server:
    """A memory server: Server(memory, host, port, secret).start(), then stop(). The limits
    (keywords of check_limits) are described in the module docstring."""

    def __init__(self, memory, host="127.0.0.1", port=7000, secret=b"", data_port=0,
                 log=None, handle=None, allow_code=False, partitions=(), lease=None,
                 **limits):
        if len(secret) < _ctl.MIN_SECRET:
            raise ValueError(f"the secret must be at least {_ctl.MIN_SECRET} bytes")
        self.memory = max(PAGE, int(memory) // PAGE * PAGE)   # whole pages: what segments hold
        self.host, self.port, self.data_port = host, int(port), int(data_port)
        self.limits = check_limits(**limits)
        n = self.limits["max_clients"]
        self.limits["allocations"] = NATIVE_SEGMENTS // n     # each client's share
        self.limits["registrations"] = NATIVE_KEYS // n
        self._secret = bytes(secret)
        from .names import Names
        self.names = Names(self)       # allocations that outlive their connection
        self._handle = handle          # runs a client's plan (pool/work.py) on its memory
        self.allow_code = bool(allow_code)
        self._log = log or stderr_log()
        self._lock = threading.Lock()
        self._used = 0
        self.ledger = _partitions.Ledger(self.memory, partitions)   # --partition
        self.lease = lease                                          # --lease
        self._clients = set()
        self._seq = 0
        self._stop = threading.Event()
        self._ctx = None
        self._listener = None
        self.counters = {"connections": 0, "auth_failures": 0, "bad_frames": 0,
                         "allocations": 0, "refused": 0, "dropped": 0, "timed_out": 0,
                         "over_limit": 0}

    # -- lifecycle ------------------------------------------------------------------------
    def start(self):
        """Bind both ports (OSError if taken) and start serving data; returns self."""
        try:
            info = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror as e:
            raise OSError(f"cannot resolve {self.host!r}: {e}") from None
        fam, numeric = info[0][0], info[0][4][0]
        ctx = _native.Context(0, 1, 1)       # the engine serves each connection in a thread
        try:
            ctx.set_secret(self._secret)
            self.data_port = ctx.listen(numeric, self.data_port)
            ls = socket.socket(fam, socket.SOCK_STREAM)
            ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                ls.bind((numeric, self.port))
                ls.listen(max(64, self.limits['max_pending']))
            except BaseException:
                ls.close()
                raise
        except BaseException:
            ctx.close()
            raise
        self._ctx, self._listener = ctx, ls
        self.port = ls.getsockname()[1]
        return self

    def snapshot(self):
        """What the metrics endpoint exports of this server: memory, free, authenticated
        clients, the control port's counters and the native data port's (tcp_stats)."""
        with self._lock:
            clients = sum(1 for x in self._clients if x.authenticated)
            counters = dict(self.counters)
        return {"memory": self.memory, "free": self.free, "clients": clients,
                "control": counters,
                "tcp": self._ctx.tcp_stats() if self._ctx is not None else {}}

    @property
    def free(self):
        with self._lock:
            return self.memory - self._used

    def serve_forever(self, poll=0.5):
        """Accept control connections until stop(); each one is served by a thread."""
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                ready = sel.select(poll)
                if not ready:
                    continue
                try:
                    sock, addr = self._listener.accept()
                except OSError:
                    continue
                self._accepted(sock, addr)
        finally:
            sel.close()

    def _accepted(self, sock, addr):
        """Start serving a new connection. Connections still authenticating have a budget
        of their own: when it is full, the oldest of them is dropped for this one."""
        victim = None
        with self._lock:
            pending = [c for c in self._clients if c.state == "pending"]
            if len(pending) >= self.limits["max_pending"]:
                victim = min(pending, key=lambda c: c.seq)
                victim.state = "dropped"
                self.counters["dropped"] += 1
            self._seq += 1
            client = _Client(sock, addr, self._seq)
            self._clients.add(client)
            self.counters["connections"] += 1
        if victim is not None:
            try:
                victim.sock.shutdown(socket.SHUT_RDWR)    # its thread sees the end and leaves
            except OSError:
                pass
        try:
            threading.Thread(target=self._serve_client, args=(client,), daemon=True,
                             name=f"client {client.addr}").start()
        except RuntimeError:                      # no thread to be had: refuse this one
            with self._lock:
                self._clients.discard(client)
            sock.close()

    def _admit(self, c):
        """The client proved the secret: take it, or ServerRefused naming the limit."""
        lim = self.limits
        with self._lock:
            if c.state != "pending":
                raise _ctl.ServerRefused("dropped while authenticating")
            authed = [x for x in self._clients if x.state == "authed"]
            if len(authed) >= lim["max_clients"]:
                self.counters["over_limit"] += 1
                raise _ctl.ServerRefused(f"at most {lim['max_clients']} client(s) at once, "
                                         f"and {len(authed)} are connected")
            if sum(1 for x in authed if x.host == c.host) >= lim["max_per_host"]:
                self.counters["over_limit"] += 1
                raise _ctl.ServerRefused(f"at most {lim['max_per_host']} connections from "
                                         f"{c.host} at once")
            c.state = "authed"

    def stop(self):
        """Stop accepting, drop every client (freeing what they hold), stop the engine."""
        self._stop.set()
        with self._lock:
            clients = list(self._clients)
        for c in clients:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            with self._lock:
                if not self._clients:
                    break
            time.sleep(0.02)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            left = [a for c in self._clients for a in list(c.allocs.values())]
        for a in left:
            self._release(a)
        self.names.release_all()
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None

    # -- one client -----------------------------------------------------------------------------
    def _serve_client(self, c):
        why = "closed the connection"
        timeout = self.limits["handshake_timeout"]
        try:
            _ctl.keepalive(c.sock)
            deadline = time.monotonic() + timeout
            facts = {"memory": self.memory, "free": self.free, "data_port": self.data_port,
                     "pid": os.getpid(), "host": socket.gethostname(),
                     "machine": machine_identity(),      # where replicas go (pool/replicas.py)
                     "plans": self._handle is not None, "code": self.allow_code,
                     "peers": self._handle is not None,   # plans read other servers (serve_work)
                     "lease": self.lease}     # clients lend in leases of this (leases.py)
            if not _ctl.server_handshake(c.sock, self._secret, facts, deadline,
                                         lambda: self._admit(c)):
                with self._lock:
                    self.counters["auth_failures"] += 1
                self._log(f"{c.addr} refused: authentication failed (wrong secret)")
                return
            c.sock.settimeout(None)
            self._log(f"{c.addr} connected ({human(self.free)} free)")
            while not self._stop.is_set():
                msg = _ctl.recv_frame(c.sock, max_frame=_ctl.PLAN_FRAME)   # authenticated
                if msg is None:
                    break
                _ctl.send_frame(c.sock, self._request(c, msg))
            if self._stop.is_set():
                why = "server stopping"
        except Exception as e:
            why = self._ended(c, e, timeout)
        finally:
            try:
                c.sock.close()
            except OSError:
                pass
            close_views(c)
            self.names.ended(c)
            freed = sum(a.size for a in c.allocs.values())
            n = len(c.allocs)
            for a in list(c.allocs.values()):
                self._release(a)
            c.allocs.clear()
            with self._lock:
                self._clients.discard(c)
            if c.authenticated:
                self._log(f"{c.addr} disconnected: {why}; freed {n} allocation(s), "
                          f"{human(freed)} ({human(self.free)} free)")

    def _ended(self, c, e, timeout):
        """Count and log why connection `c` ended with `e`; returns the reason."""
        if c.state == "dropped":
            self._log(f"{c.addr} dropped: the oldest of {self.limits['max_pending']} "
                      f"connections still authenticating, for a newer one")
            return "dropped"
        if isinstance(e, _ctl.ServerRefused):
            self._log(f"{c.addr} refused: {e}")
            return "refused"
        if isinstance(e, (_ctl.ProtocolError, _Hostile)):
            with self._lock:
                self.counters["bad_frames"] += 1
            if not c.authenticated:
                self._log(f"{c.addr} refused: bad frame: {e}")
            return f"bad frame: {e}"
        if isinstance(e, socket.timeout):
            if not c.authenticated:
                with self._lock:
                    self.counters["timed_out"] += 1
                self._log(f"{c.addr} refused: did not authenticate within {timeout:g} s")
            return "timed out"
        if isinstance(e, OSError):
            return f"connection lost ({e.strerror or e})"
        raise e

    def _request(self, c, msg):
        op = msg.get("op")
        if op == "alloc":
            size, access = msg.get("size"), msg.get("access")
            if not isinstance(size, int) or isinstance(size, bool) or access not in _ACCESS:
                raise _Hostile("alloc needs an integer size and access 'r' or 'rw'")
            lent = msg.get("lent")
            if lent is not None and (not isinstance(lent, int) or isinstance(lent, bool)):
                raise _Hostile("alloc's lent must be an integer")
            return self._alloc(c, size, access, lent)
        if op == "register":
            aid, access = msg.get("id"), msg.get("access")
            if not isinstance(aid, int) or access not in _ACCESS:
                raise _Hostile("register needs an integer id and access 'r' or 'rw'")
            a = c.allocs.get(aid)
            if a is None:
                return {"ok": False, "error": f"no allocation {aid} on this connection"}
            full = self._key_limit(c)
            return full or self._register(a, access)
        if op == "free":
            aid = msg.get("id")
            if not isinstance(aid, int):
                raise _Hostile("free needs an integer id")
            a = c.allocs.pop(aid, None)
            if a is None:
                return {"ok": False, "error": f"no allocation {aid} on this connection"}
            self._release(a)
            return {"ok": True, "free": self.free}
        if op == "plan":
            return run_plan(self, c, msg)
        if op == "partition":
            return _partitions.join(self, c, msg.get("name"))
        if op == "lend":
            from .leases import server_lend
            return server_lend(self, c, msg)
        if isinstance(op, str) and op.startswith("name_"):
            reply = self.names.request(c, msg)
            if reply is not None:
                return reply
        if op == "info":
            with self._lock:
                clients = sum(1 for x in self._clients if x.authenticated)
                counters = dict(self.counters)
            return {"ok": True, "memory": self.memory, "free": self.free, "clients": clients,
                    "control": counters,
                    "allocations": len(c.allocs), "registrations": c.nkeys(),
                    "limits": dict(self.limits), "data_port": self.data_port,
                    "partitions": self.ledger.stats(), "partition": c.partition,
                    "tcp": self._ctx.tcp_stats() if self._ctx is not None else {}}
        raise _Hostile(f"unknown op {op!r}")

    def _alloc(self, c, size, access, lent=None):
        if size <= 0:
            return {"ok": False, "error": f"size must be positive, not {size}"}
        limit = self.limits["allocations"]
        if len(c.allocs) >= limit:
            with self._lock:
                self.counters["over_limit"] += 1
            return {"ok": False, "error": f"at most {limit} allocations per client, and this "
                                          f"connection holds {len(c.allocs)}: free one first"}
        full = self._key_limit(c)
        if full:
            return full
        a = self._segment(size, c.next_id, c.partition, lent)
        if isinstance(a, dict):
            return a
        c.next_id += 1
        reply = self._register(a, access)
        if not reply["ok"]:
            self._release(a)
            return reply
        c.allocs[a.id] = a
        with self._lock:
            self.counters["allocations"] += 1
        reply.update(id=a.id, size=size, data_port=self.data_port)
        return reply

    def _segment(self, size, aid=0, partition=_partitions.DEFAULT, lent=None):
        """A new segment of `size` bytes (whole pages) counted against --memory and
        `partition` (only its first `lent` bytes when it is lent in leases: leases.py), as an
        _Alloc with no key yet; or the refusal (a dict)."""
        rounded = -(-size // PAGE) * PAGE
        whole, rounded = rounded, rounded if lent is None else \
            min(rounded, max(0, -(-lent // PAGE) * PAGE))     # what counts: what is lent
        with self._lock:
            free = self.memory - self._used
            why = self.ledger.refusal(partition, rounded, free) if rounded <= free else \
                f"cannot allocate {size} bytes: {free} bytes free ({human(free)} of " \
                f"{human(self.memory)})"
            if why is not None:
                self.counters["refused"] += 1
                return {"ok": False, "free": self.ledger.free_to(partition, free),
                        "error": why}
            self._used += rounded
            self.ledger.take(partition, rounded)
        try:
            seg = _native.Segment(whole)
            self._ctx.add_segment(seg)
        except (MemoryError, _native.Error) as e:
            with self._lock:
                self._used -= rounded
            self.ledger.give_back(partition, rounded)
            return {"ok": False, "free": self.free,
                    "error": f"cannot allocate {size} bytes: the server's memory or segment "
                             f"table is exhausted ({_native_text(e)})"}
        return _Alloc(aid, seg, whole, partition, rounded)

    def _key_limit(self, c):
        """The refusal for a client that holds its share of registrations, else None."""
        limit, held = self.limits["registrations"], c.nkeys()
        if held < limit:
            return None
        with self._lock:
            self.counters["over_limit"] += 1
        return {"ok": False, "error": f"at most {limit} registrations per client (keys: one "
                                      f"per allocation and one per register), and this "
                                      f"connection holds {held}"}

    def _register(self, a, access):
        try:
            key = self._ctx.register(memoryview(a.seg), _ACCESS[access])
        except _native.Error as e:
            return {"ok": False, "error": f"the server's registration table is full "
                                          f"({_native_text(e)})"}
        a.keys.append(key)
        if a.lent < a.size:            # the client lends less: serve only that (leases.py)
            self._ctx.limit(key, a.lent)
        return {"ok": True, "key": key}

    def _release(self, a):
        """Deregister and unmap: the engine waits for data requests already inside the
        segment, so once this returns no request can touch it and the pages go at once."""
        with self._lock:
            if a.released:
                return
            a.released = True
        ctx = self._ctx
        if ctx is not None:
            for k in a.keys:
                try:
                    ctx.deregister(k)
                except (_native.Error, ValueError):     # ValueError: engine already closed
                    pass
            try:
                ctx.remove_segment(a.seg)
            except (_native.Error, ValueError):
                pass
        a.keys = []
        a.seg = None               # the last reference: the memfd is unmapped and closed
        with self._lock:
            self._used -= a.lent
        self.ledger.give_back(a.partition, a.lent)


def serve(memory, listen="127.0.0.1:7000", secret_file=None, data_port=0, handle=None,
          allow_code=False, metrics=None, partitions=(), lease=None, **limits):
    """Run a memory server until SIGTERM/SIGINT; returns the exit status (0 on a clean stop).

    Secret: `secret_file`, else $POOLTENSOR_SECRET_FILE, else the default path
    (collectives.control.default_secret_path()), made there (mode 0600) if missing.
    Limits: `limits` (keywords of check_limits), else limits_from_env(). handle(view, data):
    runs a client's plan (the command passes the operations' handler); allow_code: also
    user code (map_blocks) from authenticated clients. metrics: "HOST:PORT" (or ":PORT") of
    a Prometheus endpoint for this server (pool/metrics.py)."""
    log = stderr_log()
    host, port = parse_address(listen, "--listen")
    limits = dict(limits_from_env(), **limits)
    path = _ctl.secret_path(secret_file)
    if path is None:
        path = _ctl.default_secret_path()
        if not os.path.exists(path):
            _ctl.create_secret(path)
            log(f"made a new secret at {path} (mode 0600): give clients a copy "
                f"(init(connect=..., secret_file=...) or {_ctl.ENV_SECRET})")
    secret = _ctl.read_secret(path)
    if metrics is not None:
        from . import metrics as _metrics
        mhost, mport = _metrics.parse(metrics, what="--metrics")
    server = Server(memory, host, port, secret, data_port, log, handle, allow_code,
                    partitions, lease, **limits).start()
    exporter = None
    if metrics is not None:
        ctx = server._ctx

        def scrape():
            entries, links = ctx.stats()
            # (its context is a world of one, itself: no link to a peer to show)
            return {"member": "server", "entries": entries, "links": [],
                    "server": server.snapshot(),
                    "listen": {"control": f"{host}:{server.port}",
                               "data": f"{host}:{server.data_port}"}}
        try:
            exporter = _metrics.Exporter(scrape, mhost, mport)
        except BaseException:
            server.stop()
            raise
        log(f"metrics on http://{exporter.host}:{exporter.port}/metrics")
    stopping = []

    def on_signal(signum, frame):
        stopping.append(signum)
        server._stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        log(f"serving {human(memory)} on {host}:{server.port} (data port {server.data_port}, "
            f"secret {path}{'; runs client code' if allow_code else ''})")
        server.serve_forever()
    finally:
        server.stop()
        if exporter is not None:
            exporter.close()
        for s, h in old.items():
            signal.signal(s, h)
    if stopping:
        log(f"stopped ({signal.Signals(stopping[0]).name})")
    return 0
