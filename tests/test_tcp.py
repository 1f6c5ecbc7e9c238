"""The tcp transport: its HMAC against Python's, one-sided operations between a server context
and a client context in this process, hostile peers on raw sockets, lost and unreachable peers,
and windows and collectives on real ranks with POOLTENSOR_TRANSPORT=tcp."""
import hashlib
import hmac
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from collectives import _native
from conftest import PAIRED_RUNS, SCRIPTS, check_ranks, run_env_ranks

SECRET = b"tcp-test-secret-0123456789abcdef"
CHUNK = _native.TCP_FRAME        # a large transfer's frames (PT_TCP_CHUNK)
HDR = struct.Struct("<IHHIIQQQQqq")          # the frame header of native/src/transport/tcp/tcp_proto.h
MAGIC, HELLO, AUTH, AUTH_OK, GET, PUT, FADD, CSWAP, NOTIFY, PUTIDX, BYE = (
    0x31545450, 1, 2, 3, 16, 17, 18, 19, 20, 21, 22)
TCP = {"POOLTENSOR_TRANSPORT": "tcp"}


def err(excinfo):
    return excinfo.value.args[0]


# ---- HMAC ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 55, 56, 63, 64, 65, 119, 120, 1000, 100_000])
def test_sha256_and_hmac_match_python(n):
    rng = np.random.default_rng(n)
    msg = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    assert _native.sha256(msg) == hashlib.sha256(msg).digest()
    for klen in (0, 16, 32, 64, 65, 200):
        key = rng.integers(0, 256, klen, dtype=np.uint8).tobytes()
        assert _native.hmac_sha256(key, msg) == hmac.new(key, msg, "sha256").digest(), klen


# ---- one server context, one client context, in this process --------------------------------

def _registrations(ctx):
    """Give ctx a filled 8 MiB segment and register it three ways.

    Returns (segment, its bytes as uint8 array, read-write key of the whole segment, read-only
    key of its first 4096 bytes, a plain 64-byte array outside the segment, its read-write key).
    The caller keeps the segment and the plain array alive while the keys are in use.
    """
    seg = _native.Segment(8 << 20)
    ctx.add_segment(seg)
    mem = np.frombuffer(seg, np.uint8)
    mem[:] = np.arange(mem.size) % 251
    key = ctx.register(mem, 3)
    ro = ctx.register(mem[:4096], 1)
    plain = np.zeros(64, np.uint8)
    pkey = ctx.register(plain, 3)
    return seg, mem, key, ro, plain, pkey


@pytest.fixture
def pair():
    """(server ctx, its segment as uint8 array, key, client ctx, read-only key, plain key)."""
    srv = _native.Context(0, 1, 1)
    srv.set_secret(SECRET)
    port = srv.listen("127.0.0.1", 0)
    seg, mem, key, ro, plain, pkey = _registrations(srv)
    cli = _native.Context(0, 2, 1)
    cli.set_secret(SECRET)
    cli.set_timeout(10)
    cli.connect_tcp(1, "127.0.0.1", port)
    yield srv, mem, key, cli, ro, pkey, port
    cli.close()
    srv.close()


@pytest.mark.parametrize("n", [0, 1, 7, 4096, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5,
                               8 << 20])
def test_get_put_sizes(pair, n):
    srv, mem, key, cli, *_ = pair
    assert cli.transport(1) == "tcp"
    off = (mem.size - n) // 3
    out = np.empty(n, np.uint8)
    cli.get(1, key, off, out)
    assert np.array_equal(out, mem[off:off + n])
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    cli.put(1, key, off, data)
    assert np.array_equal(mem[off:off + n], data)


def test_many_requests_in_flight_and_small_ones_beside_a_large_one(pair, monkeypatch):
    srv, mem, key, cli, *_ = pair
    monkeypatch.setenv("POOLTENSOR_TCP_STRIPES", "3")    # read at the first large transfer
    monkeypatch.setenv("POOLTENSOR_TCP_STRIPE_PART", str(1 << 20))
    rng = np.random.default_rng(1)
    big = rng.integers(0, 256, 6 << 20, dtype=np.uint8)
    breq = cli.put_async(1, key, 0, big)
    reqs = []
    for i in range(700):          # more than a connection keeps in flight at once
        n = int(rng.integers(0, 2000))
        off = int(rng.integers(7 << 20, (8 << 20) - n))
        out = np.empty(n, np.uint8)
        reqs.append((cli.get_async(1, key, off, out), off, out))
    for r, off, out in reqs:
        r.wait(10)
        assert np.array_equal(out, np.arange(off, off + out.size) % 251)
    breq.wait(10)
    assert np.array_equal(mem[:6 << 20], big)
    s = srv.tcp_stats()
    # the large put went over 3 connections, the small ones over the first
    assert s["requests"] >= 700 + (6 << 20) // CHUNK and s["bad_frames"] == 0 \
        and s["active"] == 3


def test_atomics_notify_and_put_indexed(pair):
    srv, mem, key, cli, ro, pkey, _ = pair
    words = mem[:64].view(np.int64)
    words[:] = 0
    assert cli.fetch_add(1, key, 8, 5) == 0
    assert cli.fetch_add(1, key, 8, -2) == 5
    assert cli.compare_swap(1, key, 8, 3, 11) == 3
    assert cli.compare_swap(1, key, 8, 3, 12) == 11
    assert words[1] == 11
    got = []
    t = threading.Thread(target=lambda: got.append(srv.wait_local(mem, 16, 3, -1, 10)))
    t.start()
    for _ in range(3):
        cli.notify(1, key, 16, 1)
    t.join(15)
    assert got == [None] and words[2] == 3
    offs = np.array([100, 4000, 200, (1 << 20) - 1], np.uint64) * 8
    cli.put_indexed(1, key, offs, 8, np.array([1, 2, 3, 4], np.int64))
    assert [int(mem[o:o + 8].view(np.int64)[0]) for o in offs] == [1, 2, 3, 4]
    many = np.arange(0, 200_000, 5, dtype=np.uint64) + 65536   # several frames
    cli.put_indexed(1, key, many, 1, np.full(many.size, 77, np.uint8))
    assert (mem[many.astype(np.int64)] == 77).all()


def test_refusals_leave_the_target_unchanged(pair):
    srv, mem, key, cli, ro, pkey, _ = pair
    before = mem.copy()
    cases = [
        (lambda: cli.get(1, key, mem.size - 4, bytearray(8)), _native.ERR_BOUNDS),
        (lambda: cli.put(1, key, mem.size, b"x"), _native.ERR_BOUNDS),
        (lambda: cli.put(1, key, 2 ** 63, b"x"), _native.ERR_BOUNDS),
        (lambda: cli.put(1, ro, 0, b"xyz"), _native.ERR_MODE),
        (lambda: cli.put_async(1, ro, 0, b"abc").wait(5), _native.ERR_MODE),
        (lambda: cli.fetch_add(1, key, 3, 1), _native.ERR_ALIGN),
        (lambda: cli.fetch_add(1, ro, 0, 1), _native.ERR_MODE),
        (lambda: cli.get(1, key ^ (1 << 40), 0, bytearray(8)), _native.ERR_KEY),
        (lambda: cli.put(1, (key & ~0xFFFF) | 0xFFFF, 0, b"x"), _native.ERR_KEY),
        (lambda: cli.put(1, key ^ (1 << 20), 0, np.ones(3 * CHUNK, np.uint8)), _native.ERR_KEY),
        (lambda: cli.put_indexed(1, key, np.array([0, mem.size], np.uint64), 1, b"ab"),
         _native.ERR_BOUNDS),
        (lambda: cli.attach(1, key, 0, 8, False), _native.ERR_UNSUPPORTED),
    ]
    for fn, status in cases:
        with pytest.raises(_native.Error) as e:
            fn()
        assert err(e) == status, (e.value, status)
    assert np.array_equal(mem, before)
    # the connection survived every refusal
    out = bytearray(4)
    cli.get(1, ro, 10, out)
    assert bytes(out) == bytes([10, 11, 12, 13])
    assert srv.tcp_stats()["bad_frames"] == 0


def _put_notify_ordering(put_notify, notify_async, wait_local, mem, key, peer):
    """A reader thread that sees the counter reach i sees put i's bytes: the counter never
    runs ahead of the data. Then notify_async: every request completes and the counter adds
    up."""
    words = mem[:64].view(np.int64)
    words[:] = 0
    base, n_puts = 4096, 40
    seen = []

    def reader():
        for i in range(1, n_puts + 1):
            wait_local(mem, 8, i, -1, 20)
            size = 1 + (i * 7919) % (3 * CHUNK)
            seen.append(bool((mem[base:base + size] == i % 251).all()))
            words[2] = i                           # checked: the writer may go on

    th = threading.Thread(target=reader)
    th.start()
    for i in range(1, n_puts + 1):
        size = 1 + (i * 7919) % (3 * CHUNK)       # one frame and several
        put_notify(peer, key, base, np.full(size, i % 251, np.uint8), key, 8, 1)
        wait_local(mem, 16, i, -1, 20)             # the reader has checked put i
    th.join(30)
    assert seen == [True] * n_puts
    reqs = [notify_async(peer, key, 24, 2) for _ in range(300)]
    for r in reqs:
        r.wait(10)
    assert words[3] == 600


def _put_notify_refusals(put_notify, notify_async, mem, key, ro, pkey, checks):
    words = mem[:64].view(np.int64)
    words[:] = 0
    before = mem.copy()
    data = np.full(100, 9, np.uint8)
    cases = [
        (lambda: put_notify(1, key, mem.size - 50, data, key, 8, 1), _native.ERR_BOUNDS),
        (lambda: put_notify(1, ro, 0, data, key, 8, 1), _native.ERR_MODE),
        (lambda: put_notify(1, key, 4096, data, key, 9, 1), _native.ERR_ALIGN),
        (lambda: put_notify(1, key, 4096, data, ro, 8, 1), _native.ERR_MODE),
        (lambda: put_notify(1, key, 4096, data, key, mem.size, 1), _native.ERR_BOUNDS),
        (lambda: put_notify(1, key, 4096, data, key ^ (1 << 40), 8, 1), _native.ERR_KEY),
        (lambda: notify_async(1, key, 3, 1).wait(5), _native.ERR_ALIGN),
        (lambda: notify_async(1, ro, 0, 1).wait(5), _native.ERR_MODE),
    ]
    for fn, status in cases:
        with pytest.raises(_native.Error) as e:
            fn()
        assert err(e) == status, (e.value, status)
    assert np.array_equal(mem, before)               # nothing written
    # a put of several frames refused for its counter: the counter does not move (its
    # first frames, plain puts, may be in memory, as for a put refused past its start)
    with pytest.raises(_native.Error) as e:
        put_notify(1, key, 4096, np.ones(2 * CHUNK, np.uint8), key, 3, 1)
    assert err(e) == _native.ERR_ALIGN and not words.any()
    put_notify(1, key, 4096, b"", key, 8, 5)      # zero bytes still notify
    assert words[1] == 5
    checks()


def _waited(ctx, mode):
    """put_notify itself, or put_notify_async started and waited for (the same contract)."""
    if mode == "sync":
        return ctx.put_notify

    def put_notify(*args):
        ctx.put_notify_async(*args).wait(20)
    return put_notify


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_put_notify_orders_data_before_the_counter_over_tcp(pair, mode):
    srv, mem, key, cli, *_ = pair
    _put_notify_ordering(_waited(cli, mode), cli.notify_async, srv.wait_local, mem, key, 1)
    assert srv.tcp_stats()["bad_frames"] == 0


def test_put_notify_async_many_in_flight_over_tcp(pair):
    """Puts of one and several frames in flight together, each with its own counter: every
    counter moves once its bytes are all there; the requests complete with the answers."""
    srv, mem, key, cli, *_ = pair
    words = mem[:64].view(np.int64)
    words[:] = 0
    sizes = [100, CHUNK - 64, CHUNK + 1, 3 * CHUNK, 7]
    base, datas, reqs = 4096, [], []
    for i, n in enumerate(sizes):
        datas.append(np.full(n, 11 + i, np.uint8))
        reqs.append(cli.put_notify_async(1, key, base, datas[-1], key, 8 * (i + 1), i + 1))
        base += n
    for r in reqs:
        r.wait(20)
    base = 4096
    for i, n in enumerate(sizes):
        assert words[i + 1] == i + 1
        assert (mem[base:base + n] == 11 + i).all()
        base += n
    with pytest.raises(_native.Error) as e:     # a refusal comes back through the request
        cli.put_notify_async(1, key, mem.size - 50, np.ones(100, np.uint8), key, 8, 1).wait(5)
    assert err(e) == _native.ERR_BOUNDS and words[1] == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_put_notify_refusals_over_tcp(pair, mode):
    srv, mem, key, cli, ro, pkey, _ = pair

    def checks():
        out = bytearray(4)
        cli.get(1, ro, 100, out)      # the connection survived every refusal
        assert bytes(out) == bytes([100, 101, 102, 103])
        assert srv.tcp_stats()["bad_frames"] == 0

    _put_notify_refusals(_waited(cli, mode), cli.notify_async, mem, key, ro, pkey, checks)


def _plain_atomics(fetch_add, compare_swap, put_notify, get, peer, key, pkey):
    """Atomics and a notify counter on memory outside the target's segments (a plain array it
    registered) are served like those in a segment: the same old values, checked alike."""
    words = np.zeros(8, np.int64)
    out = np.empty(8, np.int64)
    get(peer, pkey, 0, out)
    assert not out.any()
    assert fetch_add(peer, pkey, 8, 5) == 0
    assert fetch_add(peer, pkey, 8, -2) == 5
    words[1] += 3
    assert compare_swap(peer, pkey, 16, 1, 9) == 0          # no swap
    assert compare_swap(peer, pkey, 16, 0, 9) == 0
    words[2] = 9
    put_notify(peer, key, 4096, b"abc", pkey, 24, 4)
    words[3] += 4
    get(peer, pkey, 0, out)
    assert np.array_equal(out, words)
    for off, status in ((3, _native.ERR_ALIGN), (64, _native.ERR_BOUNDS),
                        (60, _native.ERR_BOUNDS)):
        with pytest.raises(_native.Error) as e:
            fetch_add(peer, pkey, off, 1)
        assert err(e) == status, (off, e.value)
    get(peer, pkey, 0, out)
    assert np.array_equal(out, words)                         # the refusals changed nothing


def test_atomics_on_memory_outside_segments_over_tcp(pair):
    srv, mem, key, cli, ro, pkey, _ = pair
    _plain_atomics(cli.fetch_add, cli.compare_swap, cli.put_notify, cli.get, 1, key, pkey)
    assert srv.tcp_stats()["bad_frames"] == 0


@pytest.fixture
def shm_self():
    """A context of one rank reaching its own registrations (the shared-memory path)."""
    ctx = _native.Context(0, 1, 1)
    seg, mem, key, ro, plain, pkey = _registrations(ctx)
    yield ctx, mem, key, ro, pkey
    ctx.close()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_put_notify_and_notify_async_over_shared_memory(shm_self, mode):
    ctx, mem, key, ro, pkey = shm_self
    put_notify = _waited(ctx, mode)
    _put_notify_ordering(put_notify, ctx.notify_async, ctx.wait_local, mem, key, 0)
    # refusals: at once (shared memory answers in the call), target unchanged
    fwd = (lambda r, *a: put_notify(0, *a)), (lambda r, *a: ctx.notify_async(0, *a))
    _put_notify_refusals(*fwd, mem, key, ro, pkey, lambda: None)


def test_atomics_on_own_memory_outside_segments(shm_self):
    ctx, mem, key, ro, pkey = shm_self
    _plain_atomics(ctx.fetch_add, ctx.compare_swap, ctx.put_notify, ctx.get, 0, key, pkey)


def test_deregistered_key_is_refused(pair):
    srv, mem, key, cli, *_ = pair
    k2 = srv.register(mem[:100], 3)
    cli.get(1, k2, 0, bytearray(10))
    srv.deregister(k2)
    with pytest.raises(_native.Error) as e:
        cli.get(1, k2, 0, bytearray(10))
    assert err(e) == _native.ERR_KEY


def test_keys_have_random_high_bits(pair):
    srv, mem, *_ = pair
    keys = [srv.register(mem[:8], 1) for _ in range(8)]
    highs = {k >> 16 for k in keys}
    assert len(highs) == 8 and all(h >= 1 << 16 for h in highs)


def test_long_secret_is_used_whole():
    srv = _native.Context(0, 1, 1)
    srv.set_secret(SECRET * 5)
    port = srv.listen("127.0.0.1", 0)
    buf = bytearray(b"0123456789abcdef")
    key = srv.register(buf, 1)
    for secret, ok in ((SECRET * 5, True), (SECRET * 4 + SECRET[:-1] + b"!", False)):
        cli = _native.Context(0, 2, 1)
        cli.set_secret(secret)
        cli.connect_tcp(1, "127.0.0.1", port)
        out = bytearray(4)
        if ok:
            cli.get(1, key, 4, out)
            assert out == b"4567"
        else:
            with pytest.raises(_native.Error) as e:
                cli.get(1, key, 4, out)
            assert err(e) == _native.ERR_AUTH
        cli.close()
    srv.close()


def test_secrets_are_required_and_checked():
    srv = _native.Context(0, 1, 1)
    with pytest.raises(_native.Error):
        srv.listen("127.0.0.1", 0)          # no secret: no server
    with pytest.raises(ValueError):
        srv.set_secret(b"short")
    srv.set_secret(SECRET)
    port = srv.listen("127.0.0.1", 0)
    buf = bytearray(16)
    key = srv.register(buf, 3)
    bad = _native.Context(0, 2, 1)
    bad.set_secret(b"another secret, same length ok!")
    bad.connect_tcp(1, "127.0.0.1", port)
    with pytest.raises(_native.Error) as e:
        bad.get(1, key, 0, bytearray(4))
    assert err(e) == _native.ERR_AUTH
    assert not bad.peer_lost(1)
    longer = _native.Context(0, 2, 1)
    longer.set_secret(SECRET * 3)           # longer than a SHA-256 block: another secret
    longer.connect_tcp(1, "127.0.0.1", port)
    with pytest.raises(_native.Error) as e:
        longer.get(1, key, 0, bytearray(4))
    assert err(e) == _native.ERR_AUTH
    ok = _native.Context(0, 2, 1)
    ok.set_secret(SECRET)
    ok.connect_tcp(1, "127.0.0.1", port)
    ok.get(1, key, 0, bytearray(4))
    s = srv.tcp_stats()
    assert s["auth_failures"] == 2 and s["accepted"] == 3 and s["active"] == 1
    for c in (bad, longer, ok, srv):
        c.close()


# ---- hostile peers on raw sockets ------------------------------------------------------------

def frame(op, id=0, key=0, off=0, ln=0, a=0, b=0, status=0, flags=0, magic=MAGIC):
    return HDR.pack(magic, op, flags, status, 0, id, key, off, ln, a, b)


def accept_authenticated(lsock):
    """Accept one client on lsock and answer its handshake as a server holding SECRET would
    (HELLO with a nonce, AUTH_OK with the server's proof): the connected socket."""
    c, _ = lsock.accept()
    ns = os.urandom(32)
    c.sendall(frame(HELLO, ln=32, a=1) + ns)
    h = HDR.unpack(recv_exact(c, 64))
    body = recv_exact(c, 64)
    r = struct.pack("<q", h[9])
    c.sendall(frame(AUTH_OK, ln=32) + hmac.new(
        SECRET, b"pooltensor-tcp-server" + ns + body[:32] + r, "sha256").digest())
    return c


def tcp_client(port, timeout):
    """A client context (rank 0 of 2) whose rank 1 is a tcp target on loopback `port`."""
    cli = _native.Context(0, 2, 1)
    cli.set_secret(SECRET)
    cli.set_timeout(timeout)
    cli.connect_tcp(1, "127.0.0.1", port)
    return cli


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        part = s.recv(n - len(buf))
        if not part:
            raise ConnectionError("closed")
        buf += part
    return buf


def raw_client(port, secret=SECRET, rank=-1):
    """A connection that went through the handshake in Python (the protocol as documented)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    h = HDR.unpack(recv_exact(s, 64))
    assert h[0] == MAGIC and h[1] == HELLO and h[8] == 32 and h[9] == 1
    ns, nc = recv_exact(s, 32), os.urandom(32)
    r = struct.pack("<q", rank)
    mac = hmac.new(secret, b"pooltensor-tcp-client" + ns + nc + r, "sha256").digest()
    s.sendall(frame(AUTH, ln=64, a=rank) + nc + mac)
    h = HDR.unpack(recv_exact(s, 64))
    assert h[1] == AUTH_OK
    if h[3] != 0:
        return s, None
    smac = recv_exact(s, 32)
    assert smac == hmac.new(secret, b"pooltensor-tcp-server" + ns + nc + r, "sha256").digest()
    return s, True


def closed(s):
    """True when the server closed this connection (within a few seconds)."""
    s.settimeout(5)
    try:
        while True:
            if not s.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_raw_protocol_get_and_put(pair):
    srv, mem, key, cli, *_ = pair
    port = pair[-1]
    s, ok = raw_client(port)
    assert ok
    s.sendall(frame(GET, id=7, key=key, off=1000, ln=16))
    h = HDR.unpack(recv_exact(s, 64))
    assert (h[1], h[3], h[5], h[8]) == (GET | 0x80, 0, 7, 16)
    assert recv_exact(s, 16) == (np.arange(1000, 1016) % 251).astype(np.uint8).tobytes()
    s.sendall(frame(PUT, id=8, key=key, off=2000, ln=3) + b"abc")
    h = HDR.unpack(recv_exact(s, 64))
    assert (h[1], h[3], h[5]) == (PUT | 0x80, 0, 8) and bytes(mem[2000:2003]) == b"abc"
    s.sendall(frame(GET, id=9, key=key ^ (1 << 33), ln=16))
    h = HDR.unpack(recv_exact(s, 64))
    assert (h[3], h[8]) == (_native.ERR_KEY, 0)
    s.sendall(frame(BYE))
    assert closed(s)


@pytest.mark.parametrize("what", ["magic", "op", "flags", "len", "put_indexed", "truncated",
                                  "before_auth", "garbage"])
def test_malformed_frames_close_only_that_connection(pair, what):
    srv, mem, key, cli, *_ = pair
    port = pair[-1]
    before = mem.copy()
    cli.get(1, key, 0, bytearray(8))        # a good client, connected before
    base = srv.tcp_stats()["bad_frames"]
    if what == "before_auth":
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        recv_exact(s, 64 + 32)
        s.sendall(frame(GET, key=key, ln=8))
    elif what == "garbage":
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        recv_exact(s, 64 + 32)
        s.sendall(os.urandom(200))
    else:
        s, ok = raw_client(port)
        assert ok
        bad = {"magic": frame(GET, key=key, ln=8, magic=0x12345678),
               "op": frame(99, key=key),
               "flags": frame(GET, key=key, ln=8, flags=1),
               "len": frame(PUT, key=key, ln=1 << 40),
               "put_indexed": frame(PUTIDX, key=key, ln=17, a=8, b=8) + bytes(17),
               "truncated": frame(PUT, key=key, ln=1000) + b"x" * 10}[what]
        s.sendall(bad)
        if what == "truncated":
            s.shutdown(socket.SHUT_WR)
    assert closed(s)
    s.close()
    deadline = time.monotonic() + 5
    while srv.tcp_stats()["bad_frames"] == base and time.monotonic() < deadline:
        time.sleep(0.01)
    assert srv.tcp_stats()["bad_frames"] == base + 1
    assert np.array_equal(mem[1000:], before[1000:]) if what == "truncated" else \
        np.array_equal(mem, before)
    out = np.empty(100, np.uint8)          # the other client is served as before
    cli.get(1, key, 5000, out)
    assert np.array_equal(out, before[5000:5100])
    assert not cli.peer_lost(1)


def test_many_connections_that_go_away(pair):
    srv, mem, key, cli, *_ = pair
    port = pair[-1]
    for _ in range(50):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.close()
    deadline = time.monotonic() + 10
    # (the listener may not have accepted them all yet while none is active)
    while ((s := srv.tcp_stats())["active"] > 0 or s["accepted"] < 50) and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    s = srv.tcp_stats()
    assert s["active"] == 0 and s["accepted"] >= 50 and s["bad_frames"] == 0
    cli.get(1, key, 0, bytearray(4))


# ---- lost, unreachable and silent peers ------------------------------------------------------

def _server_process(nbytes=1 << 20):
    p = subprocess.Popen([sys.executable, str(SCRIPTS / "tcp_server.py"), SECRET.hex(),
                          str(nbytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    port, key = p.stdout.readline().split()
    return p, int(port), int(key)


def test_killed_server_is_peer_lost_and_fails_requests_in_flight():
    p, port, key = _server_process(64 << 20)
    cli = _native.Context(0, 2, 1)
    cli.set_secret(SECRET)
    cli.set_timeout(20)
    cli.connect_tcp(1, "127.0.0.1", port)
    cli.get(1, key, 0, bytearray(8))
    outs = [np.empty(64 << 20, np.uint8) for _ in range(4)]
    reqs = [cli.get_async(1, key, 0, o) for o in outs]
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    t0 = time.monotonic()
    codes = set()
    for r in reqs:
        try:
            r.wait(20)
        except _native.Error as e:
            codes.add(e.args[0])
    assert codes <= {_native.ERR_PEER_LOST} and time.monotonic() - t0 < 5
    with pytest.raises(_native.Error) as e:
        cli.get(1, key, 0, bytearray(8))
    assert err(e) == _native.ERR_PEER_LOST
    assert cli.peer_lost(1) and cli.first_lost() == 1
    cli.close()


def _rank_pair():
    """Two world-like contexts (ranks 0 and 1 of 2) that listen and know each other."""
    ctxs = [_native.Context(r, 2, 1) for r in range(2)]
    ports = []
    for c in ctxs:
        c.set_secret(SECRET)
        ports.append(c.listen("127.0.0.1", 0))
    for r, c in enumerate(ctxs):
        c.connect_tcp(1 - r, "127.0.0.1", ports[1 - r])
    return ctxs, ports


def test_client_leaving_cleanly_is_not_lost_but_dropping_is():
    (a, b), ports = _rank_pair()
    a.tcp_open(1)                           # rank 0 -> rank 1: b serves it, knows it is rank 0
    deadline = time.monotonic() + 5
    while b.tcp_stats()["active"] != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    a.close()                               # says BYE
    while b.tcp_stats()["active"] != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.tcp_stats()["active"] == 0 and not b.peer_lost(0)
    # a client that proved it is rank 0, then vanished without a word: rank 0 is lost
    s, ok = raw_client(ports[1], rank=0)
    assert ok
    s.close()
    while not b.peer_lost(0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.peer_lost(0) and b.first_lost() == 0
    b.close()


def test_closed_port_fails_the_call_but_is_retried_and_silent_peer_times_out():
    """A connection that fails before its handshake is over fails that call (PeerLost) without
    marking the peer lost: the next call dials again (a server may be restarting)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                               # nobody listens there now
    cli = _native.Context(0, 3, 1)
    cli.set_secret(SECRET)
    cli.set_timeout(1.5)
    cli.connect_tcp(1, "127.0.0.1", port)
    with pytest.raises(_native.Error) as e:
        cli.get(1, 1, 0, bytearray(8))
    assert err(e) == _native.ERR_PEER_LOST and not cli.peer_lost(1)
    srv = _native.Context(1, 3, 1)
    srv.set_secret(SECRET)
    mem = bytearray(range(8))
    key = srv.register(mem, 3)
    assert srv.listen("127.0.0.1", port) == port
    out = bytearray(8)
    cli.get(1, key, 0, out)
    assert out == mem and not cli.peer_lost(1)
    srv.close()
    # a listener that accepts and never says a word
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(4)
    cli.connect_tcp(2, "127.0.0.1", mute.getsockname()[1])
    t0 = time.monotonic()
    with pytest.raises(_native.Error) as e:
        cli.get(2, 1, 0, bytearray(8))
    assert err(e) in (_native.ERR_TIMEOUT, _native.ERR_PEER_LOST)
    assert time.monotonic() - t0 < 5
    mute.close()
    cli.close()


# ---- real ranks over tcp ---------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3])
def test_windows_over_tcp(launcher, n):
    p = check_ranks(launcher, n, "remote_window.py", "tcp", env=TCP, timeout=150)
    assert p.stdout.count("tcp window ok") == n


@pytest.mark.parametrize("n", [2, 3])
def test_random_windows_and_refusals_over_tcp(launcher, n):
    p = check_ranks(launcher, n, "windows_random.py", "120", env=TCP)
    assert p.stdout.count("windows ok") == n
    p = check_ranks(launcher, n, "windows_errors.py", env=TCP)
    assert p.stdout.count("refusals ok") == n


@pytest.mark.parametrize("n", [2, 3])
def test_killed_rank_is_peer_lost_over_tcp(n):
    codes, outs = run_env_ranks(n, "peer_killed.py", env=TCP)
    assert codes[-1] == -signal.SIGKILL, outs[-1]
    for r in range(n - 1):
        assert codes[r] == 0, f"rank {r}:\n{outs[r]}"
        assert "PeerLost after" in outs[r], outs[r]


@pytest.mark.parametrize("algo,n", [("ring", 3), ("recursive_doubling", 4), ("direct", 3)])
def test_dead_rank_in_a_collective_is_peer_lost_over_tcp(algo, n):
    codes, outs = run_env_ranks(n, "algos_check.py", "lost", algo,
                                env={**TCP, "POOLTENSOR_TIMEOUT": "20"})
    for r in range(n - 1):
        assert codes[r] == 0 and "lost ok" in outs[r], "\n".join(outs)


@PAIRED_RUNS
def test_collectives_over_tcp(launcher, n):
    p = check_ranks(launcher, n, "coll_correct.py", "--quick",
                    env={**TCP, "POOLTENSOR_TIMEOUT": "20"}, timeout=600)
    assert p.stdout.count("coll ok") == n, p.stdout[-3000:]


def test_secret_file_and_listen_address(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"a secret every rank reads from one file\n")
    path.chmod(0o600)
    env = {**TCP, "POOLTENSOR_SECRET_FILE": str(path), "POOLTENSOR_LISTEN": "127.0.0.1"}
    p = check_ranks("launch", 2, "remote_window.py", "tcp", env=env, timeout=150)
    assert p.stdout.count("tcp window ok") == 2
    path.chmod(0o644)
    p = subprocess.run([sys.executable, "-m", "collectives.launch", "-n", "2",
                        str(SCRIPTS / "remote_window.py"), "tcp"], capture_output=True, text=True,
                       timeout=60, env={**os.environ, **env})
    assert p.returncode != 0 and "POOLTENSOR_SECRET_FILE" in p.stdout + p.stderr
