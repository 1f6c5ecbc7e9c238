"""TCPStore: the rendezvous store served by rank 0 over TCP.

Rank 0 runs the server in a daemon thread; every rank, rank 0 included, is a client. Frames are a
4-byte big-endian length and a msgpack map: requests ``{op, key, value, delta, timeout}``,
replies ``{ok, value}`` or ``{ok: False, error, message}``.

* One ``selectors`` thread serves all ranks. A ``get`` for a missing key is parked at the server
  and answered when the key appears or its timeout passes, so clients never poll.
* The server faces the network and trusts nothing: an oversized frame, bytes that are not
  msgpack, or wrong types close that one connection and count in ``bad_frames``.
* Clients retry connecting until their timeout, since rank 0 may not listen yet; a connection
  lost later means rank 0 is gone: ``PeerLost`` naming rank 0.
"""
import heapq
import math
import selectors
import socket
import threading
import time

import msgpack

from ..errors import BootstrapError, PeerLost, Timeout
from .store import Store, check_key, check_value, resolve_timeout

MAX_FRAME = 64 << 20
OPS = ("set", "get", "wait", "add", "delete")
_REPLY_SLACK = 10.0  # extra seconds a client waits for a reply past the server-side timeout


def _seconds(t):
    return not isinstance(t, bool) and isinstance(t, (int, float)) and t >= 0 and math.isfinite(t)


def _frame(obj):
    body = msgpack.packb(obj, use_bin_type=True)
    return len(body).to_bytes(4, "big") + body


class _Conn:
    """Server-side state of one client connection."""

    __slots__ = ("sock", "inbuf", "outbuf", "parked", "seq", "writing")

    def __init__(self, sock):
        self.sock, self.inbuf, self.outbuf = sock, bytearray(), bytearray()
        self.writing = False  # registered for EVENT_WRITE because outbuf did not drain
        self.parked = None  # (op, key) while a get/wait waits for its key
        self.seq = 0  # bumped whenever a park ends, so stale heap entries are skipped


class StoreServer:
    """The key-value server: one thread, non-blocking sockets, parked waits with deadlines."""

    def __init__(self, host="127.0.0.1", port=0, max_frame=MAX_FRAME):
        self.max_frame = max_frame
        self.bad_frames = 0
        self._data = {}
        self._waiters = {}  # key -> set of parked _Conn
        self._deadlines = []  # heap of (deadline, seq, id, conn)
        self._conns = set()
        self._ready = []  # connections whose park ended: their next frames can be handled
        self._stop = False
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._lsock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._lsock.bind((host, port))
            self._lsock.listen(1024)
        except OSError as e:
            self._lsock.close()
            raise BootstrapError(f"rendezvous server cannot listen on {host}:{port}: {e}",
                                 rank=0, host=f"{host}:{port}") from None
        self._lsock.setblocking(False)
        self.host, self.port = host, self._lsock.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._lsock, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"store-server:{self.port}",
                                        daemon=True)
        self._thread.start()

    @property
    def connections(self):
        """Number of client connections open now (a rank that exits or dies drops its own)."""
        return len(self._conns)

    def close(self):
        """Stop the server thread and close every connection; clients then see PeerLost."""
        if not self._stop:
            self._stop = True
            try:
                self._wake_w.send(b"x")
            except OSError:  # the loop already ended and closed it
                pass
            self._thread.join(5.0)

    # -- event loop -------------------------------------------------------------------------
    def _run(self):
        try:
            while not self._stop:
                wait = None
                while self._deadlines:
                    deadline, seq, _, conn = self._deadlines[0]
                    if conn.seq != seq or conn.parked is None:
                        heapq.heappop(self._deadlines)
                        continue
                    wait = max(0.0, deadline - time.monotonic())
                    break
                for skey, mask in self._sel.select(wait):
                    if skey.data == "listen":
                        self._accept()
                    elif skey.data == "wake":
                        self._wake_r.recv(4096)
                    else:
                        self._guard(self._io, skey.data, mask)
                self._expire()
                while self._ready:  # a loop, not recursion: a wake may ready more connections
                    self._guard(self._process, self._ready.pop())
        finally:
            # the listener first: a client that sees its connection end and dials again
            # (a new world at this address) must find this server gone, not its backlog
            self._lsock.close()
            for conn in list(self._conns):
                self._drop(conn)
            for s in (self._wake_r, self._wake_w):
                s.close()
            self._sel.close()

    def _guard(self, fn, conn, *args):
        """Run one connection's work; an unexpected error drops that connection, not the server."""
        try:
            fn(conn, *args)
        except Exception:
            self._drop(conn, bad=True)

    def _accept(self):
        while True:
            try:
                sock, _ = self._lsock.accept()
            except OSError:  # nothing pending, or out of descriptors: keep serving
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock)
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _io(self, conn, mask):
        if mask & selectors.EVENT_WRITE:
            self._flush(conn)
            if not conn.outbuf:
                self._process(conn)
        if conn in self._conns and mask & selectors.EVENT_READ:
            try:
                data = conn.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:
                self._drop(conn, bad=bool(conn.inbuf))  # EOF inside a frame: truncated
                return
            conn.inbuf += data
            self._process(conn)

    def _process(self, conn):
        """Handle complete frames, one at a time: a parked or unflushed request holds the rest."""
        while conn in self._conns and conn.parked is None and not conn.outbuf:
            if len(conn.inbuf) < 4:
                return
            n = int.from_bytes(conn.inbuf[:4], "big")
            if n > self.max_frame:
                return self._drop(conn, bad=True)
            if len(conn.inbuf) < 4 + n:
                return
            body = bytes(conn.inbuf[4:4 + n])
            del conn.inbuf[:4 + n]
            self._handle(conn, body)
        if conn in self._conns and len(conn.inbuf) > self.max_frame + 8:
            self._drop(conn, bad=True)  # pipelining more than one frame's worth while busy

    def _handle(self, conn, body):
        try:
            req = msgpack.unpackb(body, raw=False, strict_map_key=True)
        except Exception:  # any decoding failure is the client's fault, never the server's
            return self._drop(conn, bad=True)
        if not isinstance(req, dict):
            return self._drop(conn, bad=True)
        op, key = req.get("op"), req.get("key")
        if op not in OPS or not isinstance(key, str):
            return self._drop(conn, bad=True)
        value, timeout, delta = req.get("value"), req.get("timeout"), req.get("delta")
        if (op == "set" and not isinstance(value, bytes)
                or op in ("get", "wait") and not _seconds(timeout)
                or op == "add" and (isinstance(delta, bool) or not isinstance(delta, int))):
            return self._drop(conn, bad=True)
        if op == "set":
            self._data[key] = value
            self._reply(conn, {"ok": True})
            self._wake(key)
        elif op in ("get", "wait"):
            if key in self._data:
                self._answer(conn, op, key)
            elif timeout == 0:
                self._reply(conn, {"ok": False, "error": "timeout", "message": key})
            else:
                conn.parked = (op, key)
                self._waiters.setdefault(key, set()).add(conn)
                heapq.heappush(self._deadlines,
                               (time.monotonic() + timeout, conn.seq, id(conn), conn))
        elif op == "add":
            try:
                new = int(self._data.get(key, b"0")) + delta
            except ValueError:
                new = None
            if new is None or not -(1 << 63) <= new < (1 << 63):
                return self._reply(conn, {"ok": False, "error": "value",
                                          "message": f"store key {key!r} is not a 64-bit counter"})
            self._data[key] = str(new).encode()
            self._reply(conn, {"ok": True, "value": new})
            self._wake(key)
        else:  # delete
            self._reply(conn, {"ok": True, "value": self._data.pop(key, None) is not None})

    def _answer(self, conn, op, key):
        self._reply(conn, {"ok": True, "value": self._data[key] if op == "get" else None})

    def _unpark(self, conn):
        (op, key), conn.parked = conn.parked, None
        conn.seq += 1
        waiters = self._waiters[key]
        waiters.discard(conn)
        if not waiters:
            del self._waiters[key]
        return op, key

    def _wake(self, key):
        for conn in list(self._waiters.get(key, ())):
            op, _ = self._unpark(conn)
            self._answer(conn, op, key)
            self._ready.append(conn)

    def _expire(self):
        now = time.monotonic()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, seq, _, conn = heapq.heappop(self._deadlines)
            if conn.seq == seq and conn.parked is not None and conn in self._conns:
                _, key = self._unpark(conn)
                self._reply(conn, {"ok": False, "error": "timeout", "message": key})
                self._ready.append(conn)

    def _reply(self, conn, obj):
        conn.outbuf += _frame(obj)
        self._flush(conn)

    def _flush(self, conn):
        try:
            while conn.outbuf:
                sent = conn.sock.send(conn.outbuf)
                del conn.outbuf[:sent]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return self._drop(conn)
        if conn.writing != bool(conn.outbuf):
            conn.writing = bool(conn.outbuf)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.writing else 0)
            self._sel.modify(conn.sock, events, conn)

    def _drop(self, conn, bad=False):
        if conn not in self._conns:
            return
        if bad:
            self.bad_frames += 1
        if conn.parked is not None:
            self._unpark(conn)
        self._conns.discard(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


class TCPStore(Store):
    """Store client for rank 0's server; with ``is_server=True`` it also runs that server.

    ``port=0`` with ``is_server=True`` picks a free port; ``.port`` tells which. Thread-safe:
    each call borrows an idle connection from a small pool (opening one if none is idle), so a
    thread blocked in ``get`` never holds up another thread's ``set``.
    """

    def __init__(self, host, port, is_server=False, timeout=None, max_frame=MAX_FRAME):
        self.timeout = None if timeout is None else resolve_timeout(timeout)
        self.max_frame = max_frame
        self.server = StoreServer(host, port, max_frame) if is_server else None
        self.host = host
        self.port = self.server.port if self.server else int(port)
        wildcard = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}
        self._addr = (wildcard.get(host, host), self.port)
        self._idle = []
        self._lock = threading.Lock()
        self._closed = False
        self._connected_once = False
        try:
            self._idle.append(self._connect(resolve_timeout(None, self.timeout)))
        except BaseException:
            self.close()
            raise

    @property
    def address(self):
        """``host:port`` of the server, as used in error messages."""
        return f"{self._addr[0]}:{self._addr[1]}"

    def _connect(self, timeout):
        """Open a connection, retrying with backoff while rank 0 may still be starting."""
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                sock = socket.create_connection(
                    self._addr, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._connected_once = True
                return sock
            except OSError as e:
                if self._connected_once:
                    raise PeerLost(f"rendezvous server refused a new connection: {e}",
                                   rank=0, host=self.address) from None
                if time.monotonic() + delay > deadline:
                    raise BootstrapError(
                        f"no rendezvous server at {self.address} after {timeout:g} s: {e}",
                        rank=0, host=self.address) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _request(self, req, wait=0.0):
        if self._closed:
            raise BootstrapError("the store is closed", host=self.address)
        data = _frame(req)
        if len(data) - 4 > self.max_frame:
            raise ValueError(f"{req['op']} {req['key']!r}: request of {len(data) - 4} bytes "
                             f"exceeds the frame limit of {self.max_frame}")
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        if sock is None:
            sock = self._connect(resolve_timeout(None, self.timeout))
        try:
            sock.settimeout(wait + _REPLY_SLACK)
            sock.sendall(data)
            n = int.from_bytes(self._recv(sock, 4), "big")
            if n > self.max_frame + 1024:
                raise OSError(f"reply of {n} bytes exceeds the frame limit")
            reply = msgpack.unpackb(self._recv(sock, n), raw=False)
        except socket.timeout:
            sock.close()
            raise Timeout(f"rendezvous server did not answer {req['op']} {req['key']!r}",
                          rank=0, host=self.address) from None
        except (OSError, ValueError) as e:
            sock.close()
            raise PeerLost(f"lost the connection to the rendezvous server: {e}",
                           rank=0, host=self.address) from None
        with self._lock:
            if self._closed:
                sock.close()
            else:
                self._idle.append(sock)
        if not reply.get("ok"):
            if reply.get("error") == "timeout":
                raise Timeout(f"waited {wait:g} s for store key {req['key']!r}",
                              host=self.address)
            raise ValueError(reply.get("message", "store request failed"))
        return reply.get("value")

    @staticmethod
    def _recv(sock, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise OSError("connection closed by the server")
            buf += chunk
        return bytes(buf)

    def set(self, key, value):
        """Store ``value`` under ``key`` on the server."""
        self._request({"op": "set", "key": check_key(key), "value": check_value(value)})

    def get(self, key, timeout=None):
        """Return the value of ``key``; the server parks the request until the key is set."""
        timeout = resolve_timeout(timeout, self.timeout)
        return self._request({"op": "get", "key": check_key(key), "timeout": timeout}, timeout)

    def _wait_one(self, key, timeout):
        self._request({"op": "wait", "key": check_key(key), "timeout": timeout}, timeout)

    def add(self, key, delta):
        """Atomically add ``delta`` to the counter at ``key`` on the server; return the sum."""
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise TypeError(f"delta must be int, not {type(delta).__name__}")
        if not -(1 << 63) <= delta < (1 << 63):
            raise ValueError(f"delta must fit in 64 bits, not {delta}")
        return self._request({"op": "add", "key": check_key(key), "delta": delta})

    def delete(self, key):
        """Remove ``key`` on the server; return True if it existed."""
        return self._request({"op": "delete", "key": check_key(key)})

    def close(self):
        """Close this client's connections and, on the serving rank, stop the server."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()
        if self.server is not None:
            self.server.close()
