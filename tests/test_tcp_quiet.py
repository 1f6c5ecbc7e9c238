"""put_notify_quiet over tcp: a put with its notify in one frame that nobody answers, or
several back to back past a frame (what the channel sends its chunks with: one message each way,
no round trip), with the message's header gathered in front of its bytes.

Checked against the target's memory and against a raw-socket target that never answers (the
frame's bytes as tcp_proto.h describes them); its refusals (nothing written, counted at the
target, the connection kept), and the sender's errors when the target is gone (PeerLost) or
has stopped reading (Timeout within the timeout), never a hang."""
import os
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest

from collectives import _native
from test_tcp import (HDR, SECRET, _registrations, _server_process, accept_authenticated, err,
                      frame, raw_client, recv_exact, tcp_client)
from test_tcp import pair  # noqa: F401  (the fixture)

QUIET = 24          # PT_TCP_OP_PUT_NOTIFY_QUIET
NOTIFY = 20         # PT_TCP_OP_NOTIFY
CHUNK = _native.TCP_QUIET_FRAME      # an unanswered frame's most bytes

pytestmark = pytest.mark.timeout(60)


def test_quiet_frames_land_in_order_with_their_counter(pair):
    """Every frame's bytes are there when its counter moves; frames land in the order sent;
    zero bytes still notify; the target served them without answering (requests counted)."""
    srv, mem, key, cli, *_ = pair
    words = mem[:64].view(np.int64)
    words[:] = 0
    before = srv.tcp_stats()["requests"]
    sizes = [0, 1, 7, 4096, CHUNK - 64, CHUNK, 100]
    for i, n in enumerate(sizes, 1):
        cli.put_notify_quiet(1, key, 4096, np.full(n, i, np.uint8), key, 8, 1)
        srv.wait_local(mem, 8, i, -1, 10)
        assert (mem[4096:4096 + n] == i).all(), i
    # many at once, each to its own place: the counter's last value means all are in
    for i in range(200):
        cli.put_notify_quiet(1, key, 8192 + 64 * i, np.full(64, i % 251, np.uint8), key, 16, 1)
    srv.wait_local(mem, 16, 200, -1, 10)
    assert all((mem[8192 + 64 * i:8192 + 64 * (i + 1)] == i % 251).all() for i in range(200))
    assert words[1] == len(sizes) and words[2] == 200
    assert srv.tcp_stats()["requests"] - before == len(sizes) + 200
    assert srv.tcp_stats()["bad_frames"] == 0


def _head_and_bytes(put, wait, mem, key):
    """put(offset, data, notify_offset, value, head) lands head at offset and data right after
    it, and moves the counter once, by value, with every byte in place: sizes that fit one tcp
    frame and sizes that take several (a head or payload across a frame's end)."""
    words = mem[:64].view(np.int64)
    words[3] = 0
    rng = np.random.default_rng(5)
    cases = [(64, 0), (64, 100), (0, CHUNK + 1), (64, CHUNK - 64), (64, CHUNK - 63),
             (64, 3 * CHUNK + 5), (CHUNK + 10, 7)]
    for i, (h, n) in enumerate(cases, 1):
        head = rng.integers(0, 256, h, dtype=np.uint8)
        data = rng.integers(0, 256, n, dtype=np.uint8)
        put(4096, data, 24, 2, head)
        wait(mem, 24, 2 * i, -1, 10)
        assert words[3] == 2 * i, (h, n)            # once per put, whatever its frames
        assert np.array_equal(mem[4096:4096 + h], head), (h, n)
        assert np.array_equal(mem[4096 + h:4096 + h + n], data), (h, n)


def test_quiet_put_with_a_head_of_any_length(pair):
    srv, mem, key, cli, *_ = pair
    before = srv.tcp_stats()["requests"]
    _head_and_bytes(lambda off, d, noff, v, h: cli.put_notify_quiet(1, key, off, d, key, noff,
                                                                     v, h),
                    srv.wait_local, mem, key)
    frames = sum(-(-(h + n) // CHUNK) or 1 for h, n in
                 [(64, 0), (64, 100), (0, CHUNK + 1), (64, CHUNK - 64), (64, CHUNK - 63),
                  (64, 3 * CHUNK + 5), (CHUNK + 10, 7)])
    assert srv.tcp_stats()["requests"] - before == frames     # one frame per CHUNK
    assert srv.tcp_stats()["bad_frames"] == 0


def test_quiet_put_with_a_head_over_shared_memory():
    """Where the transport has no unanswered frame (shared memory here): the bytes with put,
    then the head with put_notify, so the counter still moves after every byte."""
    from test_tcp import _registrations
    ctx = _native.Context(0, 1, 1)
    try:
        seg, mem, key, *_ = _registrations(ctx)
        _head_and_bytes(lambda off, d, noff, v, h: ctx.put_notify_quiet(0, key, off, d, key,
                                                                         noff, v, h),
                        ctx.wait_local, mem, key)
    finally:
        ctx.close()


def test_quiet_refusals_change_nothing_and_are_counted(pair):
    srv, mem, key, cli, ro, pkey, _ = pair
    mem[:64] = 0
    before = mem.copy()
    data = np.full(100, 9, np.uint8)
    bad = [(key, mem.size - 50, key, 8), (ro, 0, key, 8), (key, 4096, key, 9),
           (key, 4096, ro, 8), (key, 4096, key ^ (1 << 40), 8)]
    for k, off, nk, noff in bad:
        cli.put_notify_quiet(1, k, off, data, nk, noff, 1)     # nobody says no
    cli.put_notify_quiet(1, key, 64, b"", key, 8, 3)          # lands after the refused ones
    srv.wait_local(mem, 8, 3, -1, 10)
    after = mem.copy()
    after[8:16] = before[8:16]
    assert np.array_equal(after, before)                       # the refused wrote nothing
    assert srv.tcp_stats()["quiet_refused"] == len(bad)
    assert srv.tcp_stats()["bad_frames"] == 0
    out = bytearray(4)
    cli.get(1, ro, 100, out)                                   # the connection is fine
    assert bytes(out) == bytes([100, 101, 102, 103])


def _mute_target():
    """A target that completes the handshake, then only reads: (port, bytes read so far, stop)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    got, stop = bytearray(), threading.Event()

    def serve():
        c = accept_authenticated(lsock)
        c.settimeout(0.1)
        while not stop.is_set():
            try:
                part = c.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not part:
                break
            got.extend(part)
        c.close()
        lsock.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return lsock.getsockname()[1], got, stop, t


def test_quiet_frame_is_one_unanswered_frame_on_the_wire():
    """Against a target that never answers: the call returns at once (a put_notify would wait
    out the timeout), and the bytes are exactly header, value, payload."""
    port, got, stop, t = _mute_target()
    cli = tcp_client(port, 3)
    try:
        payload = bytes(range(200))
        t0 = time.monotonic()
        cli.put_notify_quiet(1, 77, 1000, payload, 78, 16, -5)
        cli.put_notify_quiet(1, 77, 0, b"", 78, 24, 2)
        assert time.monotonic() - t0 < 1.0
        want = 64 + 8 + len(payload) + 64 + 8
        deadline = time.monotonic() + 5
        while len(got) < want and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(got) == want
        h = HDR.unpack(bytes(got[:64]))
        # magic, op, flags, status, rsvd, id, key, off, len, a, b
        assert h == (0x31545450, QUIET, 0, 0, 0, 0, 77, 1000, 8 + len(payload), 78, 16)
        assert struct.unpack("<q", bytes(got[64:72]))[0] == -5
        assert bytes(got[72:272]) == payload
        h2 = HDR.unpack(bytes(got[272:336]))
        assert h2[1] == QUIET and h2[8] == 8 and h2[9:] == (78, 24)
        assert struct.unpack("<q", bytes(got[336:344]))[0] == 2
    finally:
        stop.set()
        t.join(5)
        cli.close()


def test_quiet_to_a_killed_target_is_peer_lost():
    """The first frames after the kill may still be taken by the socket; within seconds the
    sender is told PeerLost (the connection's end is seen, the dial refused), never a hang,
    and never ConnectionDropped (a collective would name no rank at fault)."""
    p, port, key = _server_process(1 << 20)
    cli = tcp_client(port, 5)
    try:
        cli.put_notify_quiet(1, key, 0, b"abcdefgh", key, 8, 1)
        p.kill()
        p.wait()
        t0, codes = time.monotonic(), []
        while time.monotonic() - t0 < 5:
            try:
                cli.put_notify_quiet(1, key, 0, b"abcdefgh", key, 8, 1)
            except _native.Error as e:
                codes.append(e.args[0])
                if e.args[0] == _native.ERR_PEER_LOST:
                    break
            time.sleep(0.01)
        # never ConnectionDropped: a frame cut off by the peer's end asks the peer's address
        # again before it answers, and a refusal there means gone, not "may have landed"
        assert codes == [_native.ERR_PEER_LOST], codes
        while not cli.peer_lost(1) and time.monotonic() - t0 < 5:   # the drop looked into
            time.sleep(0.01)
        assert cli.peer_lost(1)
    finally:
        cli.close()


def test_quiet_frame_cut_off_by_a_peer_that_goes_is_peer_lost(monkeypatch):
    """The peer's process ends while a frame is half written (its kernel resets the connection
    and nothing listens any more): PeerLost, not ConnectionDropped. A collective rank that
    took the cut-off frame for "may have landed" gave the call up naming itself, and its
    peers then failed with a plain error instead of PeerLost naming the rank that went."""
    monkeypatch.setenv("POOLTENSOR_TCP_SOCKBUF", "4096")   # the frame cannot all be buffered
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)

    def serve():
        c = accept_authenticated(lsock)
        time.sleep(0.3)                          # the sender is blocked in the frame now
        c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        lsock.close()
        c.close()                                # reset, as a killed process's kernel does

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    cli = tcp_client(lsock.getsockname()[1], 5)
    try:
        t0 = time.monotonic()                    # (the call dials: the handshake is first)
        with pytest.raises(_native.Error) as e:
            cli.put_notify_quiet(1, 77, 0, np.zeros(CHUNK - 72, np.uint8), 78, 0, 1)
        assert err(e) == _native.ERR_PEER_LOST, e.value
        assert time.monotonic() - t0 < 3
    finally:
        t.join(5)
        cli.close()


def test_quiet_to_a_stopped_target_times_out():
    """A target that stopped reading fills the socket: the send that finds no room fails with
    Timeout within the timeout, and the peer is not taken for lost (slow is not gone)."""
    p, port, key = _server_process(1 << 20)
    cli = tcp_client(port, 1.5)
    data = np.zeros(CHUNK, np.uint8)
    try:
        cli.put_notify_quiet(1, key, 0, data, key, 0, 1)
        os.kill(p.pid, signal.SIGSTOP)
        t0 = t1 = time.monotonic()
        with pytest.raises(_native.Error) as e:
            for _ in range(2000):                    # far more than the socket buffers hold
                t1 = time.monotonic()
                cli.put_notify_quiet(1, key, 0, data, key, 0, 1)
        took = time.monotonic() - t1
        assert err(e) == _native.ERR_TIMEOUT
        assert 1.0 < took < 1.5 + 2.0, took
        assert time.monotonic() - t0 < 30 and not cli.peer_lost(1)
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()
        cli.close()


def test_direct_collectives_around_the_largest_unanswered_chunk():
    """2 ranks over tcp, the direct allreduce, allgather and broadcast at sizes on both sides
    of channel.QUIET_MAX (a chunk of exactly a frame once went to the native call 64 bytes
    over its limit: ValueError)."""
    from conftest import check_ranks
    p = check_ranks("launch", 2, "coll_quiet_sizes.py",
                    env={"POOLTENSOR_TRANSPORT": "tcp", "POOLTENSOR_TIMEOUT": "20"}, timeout=120)
    assert p.stdout.count("quiet sizes ok") == 2, p.stdout[-3000:]


def test_a_waiting_rank_reads_its_peers_frames_itself():
    """Direct collectives over tcp (3 ranks, odd sizes): right on every rank, and with the
    linux profile a rank waiting for its peers' unanswered frames read some of them itself
    rather than be woken by its tcp server's thread (one wake-up instead of two); with
    POOLTENSOR_TCP_HELP=0 the threads read every frame, with the same results."""
    from conftest import run_env_ranks
    for help_on in (True, False):
        env = {"POOLTENSOR_TRANSPORT": "tcp", "POOLTENSOR_TIMEOUT": "20"}
        if not help_on:
            env["POOLTENSOR_TCP_HELP"] = "0"
        codes, outs = run_env_ranks(3, "tcp_help.py", "150", env=env)
        assert codes == [0, 0, 0], outs
        said = [o.split("help ok ")[1].split() for o in outs]
        helped = [int(h) for h, _ in said]
        assert all(int(n) >= 600 for _, n in said), said     # every frame was served
        if help_on and getattr(_native, "PLATFORM", "linux") == "linux":
            assert sum(helped) > 0, said
        else:
            assert sum(helped) == 0, said


def test_a_peers_get_is_served_soon_after_the_waiting_rank_read_its_frames():
    """A rank that read its peer's frames itself leaves the socket to its next wait for a
    moment (PT_TCP_LINGER) rather than hand it back to the connection's thread: that thread
    would be woken by the next frame for nothing. When no wait comes (the rank sleeps), the
    sleeper's alarm gives the socket back: the peer's get right after a run of collectives
    is served within milliseconds, not after the thread's long sleep (0.5 s)."""
    from conftest import check_ranks
    p = check_ranks("launch", 2, "tcp_linger.py", "5",
                    env={"POOLTENSOR_TRANSPORT": "tcp", "POOLTENSOR_TIMEOUT": "20"}, timeout=120)
    said = [ln.split("linger ok ")[1].split() for ln in p.stdout.splitlines() if "linger ok" in ln]
    assert len(said) == 2, p.stdout
    longest = max(float(ms) for ms, _ in said)
    assert longest < 100, said
    if getattr(_native, "PLATFORM", "linux") == "linux":
        assert sum(int(h) for _, h in said) > 0, said       # the waiting ranks read frames


@pytest.mark.skipif(getattr(_native, "PLATFORM", "linux") != "linux",
                    reason="waiting ranks read their peers' sockets only with the linux profile")
def test_a_frame_cut_off_halfway_holds_its_waiting_rank_no_longer_than_its_timeout():
    """A world peer's frame stops halfway (a partition, a stopped peer) while this rank waits
    for it and reads the socket itself: the wait fails at its own timeout, not at the
    socket's (PT_TCP_IO_TIMEOUT, 10 s; a partition test's allreduce once took that long).
    The rest of the frame, once it comes, lands with its counter moved once, and the frames
    behind it are read in order: the stream stays in step."""
    ctx = _native.Context(0, 2, 1)
    ctx.set_secret(SECRET)
    ctx.set_timeout(10)
    port = ctx.listen("127.0.0.1", 0)
    seg, mem, key, *_ = _registrations(ctx)
    ctx.connect_tcp(1, "127.0.0.1", port)        # rank 1 is over tcp (never dialed here)
    s, ok = raw_client(port, rank=1)
    try:
        assert ok
        words = mem[:64].view(np.int64)
        words[:] = 0
        data = np.random.default_rng(3).integers(0, 256, 200_000, np.uint8)
        skey = key - (1 << 64) if key >= 1 << 63 else key     # (a is signed on the wire)
        wire = frame(QUIET, key=key, off=4096, ln=8 + data.size, a=skey, b=8) + \
            struct.pack("<q", 1) + data.tobytes()
        half = 64 + 8 + data.size // 2
        for part, wait in ((wire[:half], 1.0), (b"", 0.2)):
            # the rank waits (and reads) before the part comes: it is its reader then
            got = []

            def waiter():
                t0 = time.monotonic()
                try:
                    ctx.wait_local(mem, 8, 1, 1, wait)
                    got.append(("ok", time.monotonic() - t0))
                except _native.Error as e:
                    got.append((e.args[0], time.monotonic() - t0))

            t = threading.Thread(target=waiter)
            t.start()
            time.sleep(0.1)
            s.sendall(part)
            t.join(30)
            assert got and got[0][0] == _native.ERR_TIMEOUT, got
            assert got[0][1] < wait + 1.0, got
            assert words[1] == 0
        s.sendall(wire[half:] + frame(QUIET, key=key, off=0, ln=8, a=skey, b=8) +
                  struct.pack("<q", 2))
        ctx.wait_local(mem, 8, 3, 1, 10)
        assert np.array_equal(mem[4096:4096 + data.size], data)
        assert words[1] == 3
        assert ctx.tcp_stats()["bad_frames"] == 0
        # deregistered between two parts: the rest is read and dropped, the counter stays,
        # the refusal is counted, and the next frame lands
        place = mem[65536:65536 + data.size]
        place[:] = 0
        k2 = ctx.register(place, 3)
        wire = frame(QUIET, key=k2, off=0, ln=8 + data.size, a=skey, b=16) + \
            struct.pack("<q", 1) + data.tobytes()
        refused = ctx.tcp_stats()["quiet_refused"]
        t = threading.Thread(target=lambda: pytest.raises(_native.Error, ctx.wait_local,
                                                          mem, 16, 1, 1, 0.5))
        t.start()
        time.sleep(0.1)
        s.sendall(wire[:half])
        t.join(30)
        ctx.deregister(k2)
        s.sendall(wire[half:] + frame(QUIET, key=key, off=0, ln=8, a=skey, b=8) +
                  struct.pack("<q", 1))
        ctx.wait_local(mem, 8, 4, 1, 10)
        assert words[2] == 0
        assert ctx.tcp_stats()["quiet_refused"] == refused + 1
        assert not place[half:].any()            # (what came before the cut may have landed)
        assert ctx.tcp_stats()["bad_frames"] == 0
    finally:
        s.close()
        ctx.close()


def _unacked(s):
    """Bytes this socket sent that its peer has not acknowledged (struct tcp_info's
    tcpi_unacked, in segments)."""
    return struct.unpack_from("<I", s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104), 24)[0]


@pytest.mark.skipif(not hasattr(socket, "TCP_INFO") or not hasattr(socket, "TCP_QUICKACK"),
                    reason="TCP_INFO and TCP_QUICKACK are Linux's")
def test_a_large_quiet_frame_is_acknowledged_when_read_not_after_the_pause_behind_it():
    """A connection that carried answers (the handshake, a notify) is one the kernel treats as
    interactive: it holds acknowledgements back for the next answer to carry them, up to its
    delayed-ack timer (40 ms at least). A quiet frame gets no answer, so the last one before a
    pause was acknowledged only after it, and the sender's round-trip time took in the pause
    (0.4-0.8 ms instead of 22 us between the namespaces): cubic's next calls of 64 KiB ran
    2-5x slower. A frame of TCP_QUICKACK_MIN bytes or more is acknowledged once read."""
    ctx = _native.Context(0, 2, 1)
    ctx.set_secret(SECRET)
    ctx.set_timeout(10)
    port = ctx.listen("127.0.0.1", 0)
    seg, mem, key, *_ = _registrations(ctx)
    ctx.connect_tcp(1, "127.0.0.1", port)
    s, ok = raw_client(port, rank=1)
    try:
        assert ok
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        words = mem[:64].view(np.int64)
        words[:] = 0
        skey = key - (1 << 64) if key >= 1 << 63 else key
        waited = []
        for n in (_native.TCP_QUICKACK_MIN, 256 << 10) * 3:
            s.sendall(frame(NOTIFY, id=7, key=key, off=16, a=1))     # an answered request
            assert HDR.unpack(recv_exact(s, 64))[3] == 0
            before = int(words[1])
            s.sendall(frame(QUIET, key=key, off=4096, ln=8 + n, a=skey, b=8) +
                      struct.pack("<q", 1) + bytes(n))
            ctx.wait_local(mem, 8, before + 1, 1, 5)
            t0 = time.monotonic()
            while _unacked(s) and time.monotonic() - t0 < 1:
                time.sleep(0.0002)
            waited.append(time.monotonic() - t0)
        assert max(waited) < 0.02, [round(w * 1e3, 1) for w in waited]
    finally:
        s.close()
        ctx.close()
