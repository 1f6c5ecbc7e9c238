"""The tcp transport's frames, seen from outside, for the protocol fuzzer: packing, the
handshake, socket exchange with deadlines, and a model of what the server must answer.

Why a model: every hostile frame has one right outcome (a refusal with a given status, a
reply with given bytes, or the connection closed and counted), so the fuzzer can check each
answer exactly instead of only checking that the server survived. The model follows the wire
description in native/src/transport/tcp/tcp_proto.h; where that text is silent it follows what the server
does today (noted below), so a change there shows up here as a mismatch to look at.
"""
import errno
import hashlib
import hmac
import selectors
import socket
import struct
import time

MAGIC = 0x31545450
HDR = struct.Struct("<IHHIIQQQQQQ")   # a and b travel as int64; packed here as raw 64 bits
HDR_LEN = 64
NONCE = 32
MAC = 32
REPLY = 0x80
VERSION = 1
HELLO, AUTH, AUTH_OK = 1, 2, 3
GET, PUT, FETCH_ADD, CSWAP, NOTIFY, PUT_INDEXED, BYE, PUT_NOTIFY = 16, 17, 18, 19, 20, 21, 22, 23
# valid, never answered: not generated here (no reply to check it by; tests/test_tcp_quiet.py)
PUT_NOTIFY_QUIET = 24
ATOMICS = (FETCH_ADD, CSWAP, NOTIFY)
OP_NAMES = {HELLO: "HELLO", AUTH: "AUTH", AUTH_OK: "AUTH_OK", GET: "GET", PUT: "PUT",
            FETCH_ADD: "FETCH_ADD", CSWAP: "CSWAP", NOTIFY: "NOTIFY",
            PUT_INDEXED: "PUT_INDEXED", BYE: "BYE", PUT_NOTIFY: "PUT_NOTIFY"}
MAX_PAYLOAD = 4 << 20
MAX_REGS = 1024
MAX_CONNS = 256
IO_TIMEOUT = 10.0
M32, M64 = (1 << 32) - 1, (1 << 64) - 1

# pt_status_t values (native/include/pt.h)
OK, E_INVALID, E_KEY, E_BOUNDS, E_MODE, E_ALIGN, E_UNSUPPORTED, E_AUTH = 0, 1, 4, 5, 6, 7, 8, 13
STATUS_NAMES = {OK: "ok", E_INVALID: "invalid", E_KEY: "key", E_BOUNDS: "bounds",
                E_MODE: "mode", E_ALIGN: "align", E_UNSUPPORTED: "unsupported",
                E_AUTH: "auth"}


def s64(v):
    v &= M64
    return v - (1 << 64) if v >> 63 else v


class Frame:
    """One frame as sent: header fields (any values, masked to their width) and payload."""
    __slots__ = ("op", "key", "off", "len", "a", "b", "id", "magic", "flags", "status",
                 "rsvd", "payload")

    def __init__(self, op, key=0, off=0, len=0, a=0, b=0, id=0, magic=MAGIC, flags=0,
                 status=0, rsvd=0, payload=b""):
        self.op, self.key, self.off, self.len, self.a, self.b = op, key, off, len, a, b
        self.id, self.magic, self.flags, self.status, self.rsvd = id, magic, flags, status, rsvd
        self.payload = payload

    def header(self):
        return HDR.pack(self.magic & M32, self.op & 0xFFFF, self.flags & 0xFFFF,
                        self.status & M32, self.rsvd & M32, self.id & M64, self.key & M64,
                        self.off & M64, self.len & M64, self.a & M64, self.b & M64)

    def wire(self):
        return self.header() + self.payload

    def __repr__(self):
        extra = "".join(f" {k}={getattr(self, k):#x}" for k in ("magic", "flags", "status",
                                                                 "rsvd")
                        if getattr(self, k) != (MAGIC if k == "magic" else 0))
        return (f"Frame({OP_NAMES.get(self.op, self.op)} id={self.id} key={self.key:#x} "
                f"off={self.off:#x} len={self.len:#x} a={s64(self.a)} b={s64(self.b)}{extra} "
                f"payload={len(self.payload)}B)")


def unpack(b):
    """Header bytes -> dict of fields (a, b as int64)."""
    m, op, fl, st, rs, id_, key, off, ln, a, bb = HDR.unpack(b)
    return {"magic": m, "op": op, "flags": fl, "status": st, "rsvd": rs, "id": id_,
            "key": key, "off": off, "len": ln, "a": s64(a), "b": s64(bb)}


def client_mac(secret, ns, nc, rank, server=False):
    """HMAC-SHA256(secret, label Ns Nc le64(rank)), as both sides compute it."""
    label = b"pooltensor-tcp-server" if server else b"pooltensor-tcp-client"
    return hmac.new(secret, label + ns + nc + struct.pack("<q", rank), hashlib.sha256).digest()


class Closed(Exception):
    """The peer closed (or reset) the connection."""


class Conn:
    """A raw client socket with deadline-bounded reads."""

    def __init__(self, host, port, timeout=20.0, rst=False):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if rst:   # close() then sends RST instead of FIN
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.timeout = timeout
        self.pending = bytearray()

    def recv_exact(self, n):
        deadline = time.monotonic() + self.timeout
        while len(self.pending) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"waited {self.timeout} s for {n} bytes, have "
                                   f"{len(self.pending)}")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(max(65536, n - len(self.pending)))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Closed(f"closed after {len(self.pending)} of {n} bytes")
            self.pending += chunk
        out = bytes(self.pending[:n])
        del self.pending[:n]
        return out

    def hello(self):
        """The server's HELLO: (header dict, nonce)."""
        h = unpack(self.recv_exact(HDR_LEN))
        if h["magic"] != MAGIC or h["op"] != HELLO or h["len"] != NONCE or h["a"] != VERSION:
            raise AssertionError(f"bad HELLO from the server: {h}")
        return h, self.recv_exact(NONCE)

    def auth_frame(self, secret, ns, nc, rank=-1):
        mac = client_mac(secret, ns, nc, rank)
        return Frame(AUTH, len=NONCE + MAC, a=rank, payload=nc + mac)

    def handshake(self, secret, nc, rank=-1):
        """Authenticate; checks the server's proof. Returns the AUTH frame sent (to replay)."""
        _, ns = self.hello()
        f = self.auth_frame(secret, ns, nc, rank)
        self.sock.sendall(f.wire())
        h = unpack(self.recv_exact(HDR_LEN))
        if h["op"] != AUTH_OK or h["status"] != OK or h["len"] != MAC:
            raise AssertionError(f"handshake refused with the right secret: {h}")
        if self.recv_exact(MAC) != client_mac(secret, ns, nc, rank, server=True):
            raise AssertionError("the server's MAC does not prove the secret")
        return f

    def exchange(self, out, need, until_eof, timeout=None, half_close=False):
        """Send `out` while reading; stop after `need` bytes (or, with until_eof, at EOF).
        Returns (received bytes, eof seen). Reading while sending keeps a server that
        answers while we still write from filling both socket buffers. half_close: shut
        down the sending side once everything is out."""
        timeout = self.timeout if timeout is None else timeout
        s = self.sock
        s.setblocking(False)
        got = self.pending
        view = memoryview(out)
        sent, eof = 0, False
        sel = selectors.DefaultSelector()
        sel.register(s, selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0))
        if half_close and not out:
            self.shut_wr()
        deadline = time.monotonic() + timeout
        try:
            while True:
                if not until_eof and len(got) >= need and sent == len(out):
                    break
                if eof and (sent == len(out) or until_eof):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"exchange: sent {sent}/{len(out)}, received "
                                       f"{len(got)}/{need}{' +eof' if until_eof else ''} "
                                       f"after {timeout} s")
                for key, ev in sel.select(min(left, 1.0)):
                    if ev & selectors.EVENT_READ and not eof:
                        try:
                            chunk = s.recv(1 << 20)
                        except (BlockingIOError, InterruptedError):
                            chunk = None
                        except ConnectionResetError:
                            chunk = b""
                        if chunk == b"":
                            eof = True
                            sel.modify(s, selectors.EVENT_WRITE) if sent < len(out) else \
                                sel.unregister(s)
                        elif chunk:
                            got += chunk
                    if ev & selectors.EVENT_WRITE and sent < len(out):
                        try:
                            sent += s.send(view[sent:sent + (1 << 20)])
                        except (BlockingIOError, InterruptedError):
                            pass
                        except (BrokenPipeError, ConnectionResetError):
                            sent = len(out)     # the server is gone: nothing more will go
                        if sent == len(out):
                            if half_close:
                                self.shut_wr()
                            if eof:
                                break
                            sel.modify(s, selectors.EVENT_READ)
                if eof and not sel.get_map():
                    break
        finally:
            sel.close()
            s.setblocking(True)
        data = bytes(got)
        self.pending = bytearray()
        return data, eof

    def wait_eof(self, timeout=None):
        """Read until the server closes; returns what came before (should be nothing)."""
        data, eof = self.exchange(b"", 0, True, timeout)
        return data

    def shut_wr(self):
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            if e.errno not in (errno.ENOTCONN, errno.EPIPE):
                raise

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# ---- the model ---------------------------------------------------------------------------

class Region:
    """One registration at the target, as the fuzzer knows it. `data` is the fuzzer's copy
    of its bytes (None: someone else writes it, its bytes are not predicted); `protected`:
    the fuzzer must never write it (the legitimate client's)."""

    def __init__(self, name, key, length, access, seg, align, data, protected=False):
        self.name, self.key, self.len, self.access = name, key, length, access
        self.seg, self.align, self.data, self.protected = seg, align, data, protected


class Outcome:
    """What the server must do with one frame: close (counted as bad or not), or reply with
    `status`; `a` the old value of an atomic (None: not checked); `payload` a get's bytes
    (None: not checked); `request`: whether it counts in tcp_stats()['requests']."""
    __slots__ = ("close", "bad", "status", "a", "payload", "request", "write")

    def __init__(self, close=False, bad=False, status=OK, a=None, payload=b"", request=True,
                 write=None):
        self.close, self.bad, self.status, self.a = close, bad, status, a
        self.payload, self.request, self.write = payload, request, write

    def __repr__(self):
        if self.close:
            return f"close({'bad frame' if self.bad else 'clean'})"
        return f"reply(status={self.status}, a={self.a}, payload={None if self.payload is None else len(self.payload)})"


def norm(f):
    """Fields as the server reads them: unsigned 64-bit (a generator may hand in -1)."""
    f.off &= M64
    f.len &= M64
    f.key &= M64
    f.id &= M64
    return f


def well_formed(f):
    """The server's first check on a request header (tcp_proto.h: bad magic, op, flags, length
    over the limit close the connection; status and rsvd must be 0 in requests, and the
    atomics and BYE carry no payload: as the server checks today)."""
    norm(f)
    if f.magic != MAGIC or f.flags or f.status or f.rsvd:
        return False
    if f.op in (GET, PUT, PUT_INDEXED):
        return f.len <= MAX_PAYLOAD
    if f.op in ATOMICS or f.op == BYE:
        return f.len == 0
    if f.op == PUT_NOTIFY:
        return 8 <= f.len <= MAX_PAYLOAD   # le64 value, then the bytes
    return False


def indexed_sizes_ok(f):
    """PUT_INDEXED's size checks, made before its payload is read (a failure closes)."""
    isz, span = s64(f.b), s64(f.a)
    return not (isz <= 0 or isz > MAX_PAYLOAD or f.len == 0 or f.len % (8 + isz) or
                span <= 0 or span < isz)


class Model:
    """The target's registrations and the fuzzer's copy of their bytes."""

    def __init__(self, regions):
        self.regions = {r.name: r for r in regions}
        self.by_key = {r.key: r for r in regions}

    def lookup(self, key, off, n, write):
        """(status, region) as the target's registration table answers (core/rma.c, pt__reg_lookup)."""
        key &= M64
        if (key & 0xFFFF) >= MAX_REGS or key == 0 or key not in self.by_key:
            return E_KEY, None
        r = self.by_key[key]
        if off > r.len or n > r.len - off:
            return E_BOUNDS, r
        if write and not (r.access & 2):
            return E_MODE, r
        return OK, r

    def counter(self, key, off):
        """(status, region) for the int64 an atomic or a notify changes (in a segment or
        not: the server serves atomics on any registration)."""
        st, r = self.lookup(key, off & M64, 8, True)
        if st == OK and (r.align + (off & M64)) % 8:
            st = E_ALIGN
        return st, r

    def is_protected_write(self, f):
        """True when f would change the memory of a protected region (the generator then
        moves it out of bounds)."""
        if not well_formed(f) or f.op not in (PUT, PUT_INDEXED, PUT_NOTIFY) + ATOMICS:
            return False
        if f.op == PUT_NOTIFY:
            # nothing is written unless both the put and the counter pass their checks
            st, r = self.lookup(f.key, f.off, f.len - 8, True)
            st2, r2 = self.counter(f.a, f.b)
            return st == OK and st2 == OK and (r.protected or r2.protected)
        if f.op == PUT_INDEXED:
            if not indexed_sizes_ok(f):
                return False
            st, r = self.lookup(f.key, f.off, s64(f.a), True)
        else:
            st, r = self.lookup(f.key, f.off, 8 if f.op in ATOMICS else f.len, True)
        return st == OK and r.protected

    def predict(self, f, sent_payload=None):
        """The outcome of frame f on an authenticated connection; applies its writes to the
        copy. sent_payload: the payload bytes that actually reach the server when the frame
        is cut short (None: all of it)."""
        if not well_formed(f):
            return Outcome(close=True, bad=True, request=False)
        if f.op == BYE:
            return Outcome(close=True, bad=False, request=False)
        truncated = sent_payload is not None and len(sent_payload) < f.len
        if f.op == GET:
            st, r = self.lookup(f.key, f.off, f.len, False)
            pl = b""
            if st == OK:
                pl = None if r.data is None else bytes(r.data[f.off:f.off + f.len])
            return Outcome(status=st, payload=pl)
        if f.op == PUT:
            st, r = self.lookup(f.key, f.off, f.len, True)
            body = f.payload if sent_payload is None else sent_payload
            if st == OK and r.data is not None:
                r.data[f.off:f.off + len(body)] = body   # bytes go straight to memory
            if truncated:
                return Outcome(close=True, bad=True)
            return Outcome(status=st)
        if f.op == PUT_NOTIFY:
            body = f.payload if sent_payload is None else sent_payload
            if len(body) < 8:
                return Outcome(close=True, bad=True)
            st, r = self.lookup(f.key, f.off, f.len - 8, True)
            if st == OK:
                st, c = self.counter(f.a, f.b)
            if st != OK:
                return Outcome(close=True, bad=True) if truncated else Outcome(status=st, a=0)
            if r.data is not None:
                r.data[f.off:f.off + len(body) - 8] = body[8:]
            if truncated:
                return Outcome(close=True, bad=True)    # the counter does not move
            if c.data is None:
                return Outcome(status=OK, a=None)
            o = f.b & M64
            old = s64(int.from_bytes(c.data[o:o + 8], "little"))
            new = s64(old + s64(int.from_bytes(body[:8], "little")))
            c.data[o:o + 8] = (new & M64).to_bytes(8, "little")
            return Outcome(status=OK, a=old)
        if f.op in ATOMICS:
            st, r = self.lookup(f.key, f.off, 8, True)
            if st == OK and (r.align + f.off) % 8:
                st = E_ALIGN
            if st != OK:
                return Outcome(status=st, a=0)
            if r.data is None:
                return Outcome(status=OK, a=None)
            old = s64(int.from_bytes(r.data[f.off:f.off + 8], "little"))
            new = old
            if f.op == CSWAP:
                new = s64(f.b) if old == s64(f.a) else old
            else:
                new = s64(old + s64(f.a))
            r.data[f.off:f.off + 8] = (new & M64).to_bytes(8, "little")
            return Outcome(status=OK, a=None if f.op == NOTIFY else old)
        if f.op == PUT_INDEXED:
            if not indexed_sizes_ok(f) or truncated:
                return Outcome(close=True, bad=True)
            isz, span = s64(f.b), s64(f.a)
            n = f.len // (8 + isz)
            st, r = self.lookup(f.key, f.off, span, True)
            offs = [int.from_bytes(f.payload[8 * i:8 * i + 8], "little") for i in range(n)]
            if st == OK:
                for o in offs:
                    if o < f.off or o - f.off > span - isz:
                        st = E_BOUNDS
                        break
            if st == OK and r.data is not None:
                items = f.payload[8 * n:]
                for i, o in enumerate(offs):
                    r.data[o:o + isz] = items[i * isz:(i + 1) * isz]
            return Outcome(status=st)
        raise AssertionError(f"unreachable: {f}")


def check_reply(f, out, h, payload):
    """Compare one reply (header dict, payload) with the predicted outcome; returns a list
    of differences (empty when it matches)."""
    bad = []
    if h["magic"] != MAGIC:
        bad.append(f"magic {h['magic']:#x}")
    if h["op"] != (f.op | REPLY) & 0xFFFF:
        bad.append(f"op {h['op']:#x}, expected {(f.op | REPLY):#x}")
    if h["id"] != f.id & M64:
        bad.append(f"id {h['id']}, expected {f.id}")
    if h["flags"]:
        bad.append(f"flags {h['flags']:#x}")
    if h["status"] != out.status:
        bad.append(f"status {h['status']}, expected {out.status}")
    if out.a is not None and f.op in ATOMICS + (PUT_NOTIFY,) and h["a"] != out.a:
        bad.append(f"old value {h['a']}, expected {out.a}")
    if out.payload is not None and payload != out.payload:
        bad.append(f"payload of {len(payload)} bytes differs from the expected "
                   f"{len(out.payload)} bytes")
    return bad


def reply_len(f, out):
    """Bytes the reply to f takes on the wire, as predicted."""
    if out.close:
        return 0
    if f.op == GET and out.status == OK:
        return HDR_LEN + f.len
    return HDR_LEN
