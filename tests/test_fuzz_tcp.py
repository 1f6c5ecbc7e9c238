"""Protocol fuzzing of the native tcp transport's server (always run where it is built).

A live server process (tests/scripts/fuzz_server.py) is hit with random and hostile traffic
while a legitimate client keeps using it; every answer is checked against a model of the
protocol, and so are the server's counters and memory (tests/fuzz_tcp.py says what the cases
are). POOLTENSOR_FUZZ_CASES (default 10000) and POOLTENSOR_FUZZ_SEED (default fixed) size and
seed the run; POOLTENSOR_FUZZ_EXAMPLES the hypothesis tests. The same engine runs for as long
as wanted from the command line: ``python tests/fuzz_tcp.py --cases 1000000 --seed N``.
"""
import os
import socket
import time

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from fuzz_tcp import Fuzzer
import fuzz_wire as w

CASES = int(os.environ.get("POOLTENSOR_FUZZ_CASES", "10000"))
SEED = int(os.environ.get("POOLTENSOR_FUZZ_SEED", "20240611"))
EXAMPLES = int(os.environ.get("POOLTENSOR_FUZZ_EXAMPLES", "300"))


def _native_tcp():
    from collectives import _native
    return hasattr(_native.Context, "listen")


pytestmark = [pytest.mark.skipif(not _native_tcp(), reason="the native tcp transport is not "
                                 "built"),
              pytest.mark.timeout(120 + CASES // 100)]


@pytest.fixture
def fuzzer(request):
    fz = Fuzzer(SEED, stalls=getattr(request, "param", False))
    yield fz
    pid = fz.target.pid
    rc = fz.close()
    # the server was asked to quit: it must have been alive to hear it, and exit 0 (a crash
    # during the test, a hang on quit, or an error on the way out all show here)
    assert rc == 0, f"the fuzz server {pid} exited {rc}:\n{fz.target.stderr()}"


@pytest.mark.parametrize("fuzzer", [True], indirect=True, ids=["with-stalls"])
def test_random_cases(fuzzer):
    """CASES seeded cases (batches of hostile frames, pre-authentication traffic, wrong and
    replayed handshakes, cut and reset connections, slow frames, crowds of connections, and
    connections stalled mid-frame), with a legitimate client working throughout; at the end
    the server still runs (same pid), every counter is exact, the memory matches the model,
    the canaries are intact and the legitimate client's data is what it wrote."""
    pid = fuzzer.target.pid
    summary = fuzzer.run(CASES, checkpoint_every=2500)
    assert summary["cases"] >= CASES
    assert summary["legit_requests"] > 10, summary
    out = summary["outcomes"]
    if CASES < 5000:          # too few for every path to be taken by chance
        return
    for op in ("GET", "PUT", "FETCH_ADD", "CSWAP", "PUT_INDEXED"):   # every path was taken
        assert out.get(f"{op} ok") and out.get(f"{op} key") and out.get(f"{op} bounds"), out
        if op != "GET":
            assert out.get(f"{op} mode"), out
    assert out.get("FETCH_ADD align"), out       # (atomics are served on any registration)
    assert out["closed (bad frame)"] > 50 and summary["server"]["auth_failures"] > 50, summary
    assert fuzzer.target.pid == pid and fuzzer.target.proc.poll() is None


# -- hypothesis: header fields drawn field by field ----------------------------------------

def _frames(model, stale):
    """A strategy of one request frame whose every field may be hostile."""
    names = sorted(model.regions)
    big = st.sampled_from([w.M64, w.M64 - 7, 1 << 63, (1 << 63) - 1, 1 << 32, w.MAX_PAYLOAD,
                           w.MAX_PAYLOAD + 1])
    u64 = st.one_of(st.integers(0, 70000), big, st.integers(0, w.M64))
    i64 = st.integers(-(1 << 63), (1 << 63) - 1)
    reserved = st.one_of(st.just(0), st.just(0), st.just(0), st.integers(1, w.M32))

    @st.composite
    def frame(draw):
        op = draw(st.one_of(st.sampled_from([w.GET, w.PUT, w.FETCH_ADD, w.CSWAP, w.NOTIFY,
                                             w.PUT_INDEXED, w.GET, w.PUT, w.BYE]),
                            st.integers(0, 0xFFFF)))
        r = model.regions[draw(st.sampled_from(names))]
        key = draw(st.one_of(st.just(r.key), st.just(r.key),
                             st.sampled_from([stale, 0] + [x.key for x in model.regions.values()]),
                             st.integers(0, w.M64)))
        f = w.Frame(op, key=key, off=draw(st.one_of(st.integers(0, r.len + 8), u64)),
                    len=draw(st.one_of(st.integers(0, r.len + 8), u64)), a=draw(i64),
                    b=draw(i64), id=draw(st.integers(0, w.M64)))
        if op in w.ATOMICS or op == w.BYE:
            f.len = draw(st.one_of(st.just(0), st.just(0), u64))
        if op == w.PUT_INDEXED:
            isz = draw(st.one_of(st.integers(1, 16), i64))
            offs = draw(st.lists(st.one_of(st.integers(0, r.len), u64), min_size=0,
                                 max_size=24))
            f.b = isz
            good = 0 < isz <= 64
            lo = min(offs) if offs else 0
            f.a = draw(st.one_of(st.just(max(offs) - lo + isz if offs and good else 0), i64))
            f.off = draw(st.one_of(st.just(lo), u64))
            body = b"".join(o.to_bytes(8, "little") for o in offs) + \
                bytes(len(offs) * isz if good else 0)
            f.len = draw(st.one_of(st.just(len(body)), u64))
            f.payload = (body + bytes(max(0, min(f.len, 1 << 16) - len(body))))[:f.len]
        elif op == w.PUT:
            f.payload = bytes([draw(st.integers(0, 255))]) * f.len \
                if f.len <= min(w.MAX_PAYLOAD, 1 << 16) else b""
        if op in (w.PUT, w.PUT_INDEXED) and w.well_formed(f) and len(f.payload) != f.len:
            f.len = w.MAX_PAYLOAD + 1        # no payload that big: make it too big instead
        f.magic = draw(st.one_of(st.just(w.MAGIC), st.just(w.MAGIC), st.just(w.MAGIC),
                                 st.integers(0, w.M32)))
        f.flags = draw(st.one_of(st.just(0), st.just(0), st.integers(0, 0xFFFF)))
        f.status, f.rsvd = draw(reserved), draw(reserved)
        if model.is_protected_write(f):
            f.off = w.M64                    # never the legitimate client's memory
        return f

    return frame()


_settings = settings(max_examples=EXAMPLES, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.function_scoped_fixture])


def test_header_fields_one_by_one(fuzzer):
    """Single frames with every header field drawn by hypothesis, each answered as the model
    says (a refusal, a reply, or a counted close), the legitimate client unharmed."""
    @_settings
    @seed(SEED)
    @given(st.data())
    def one(data):
        f = data.draw(_frames(fuzzer.model, fuzzer.gen.stale))
        fuzzer.run_frames([f])

    one()
    fuzzer.checkpoint()
    fuzzer.run(0)


def test_header_field_sequences(fuzzer):
    """Sequences of such frames pipelined on one connection (answers must come in order,
    a close must come exactly at the first malformed frame)."""
    @_settings
    @seed(SEED + 1)
    @given(st.data())
    def seq(data):
        frames = data.draw(st.lists(_frames(fuzzer.model, fuzzer.gen.stale), min_size=1,
                                    max_size=12))
        fuzzer.run_frames(frames)

    seq()
    fuzzer.run(0)


# -- found by fuzzing -----------------------------------------------------------------------

def test_unauthenticated_connections_cannot_lock_out_clients(fuzzer):
    """256 connections that never authenticate (no secret needed to open them) must not
    keep a legitimate client out: unauthenticated connections have a budget of their own,
    and the newest displaces the oldest. (Found by fuzzing: they used to fill the server's
    connection cap, and the refused client then took the server for lost.)"""
    from collectives import _native
    silent = []
    try:
        for _ in range(w.MAX_CONNS):
            silent.append(socket.create_connection((fuzzer.host, fuzzer.port), timeout=5))
        time.sleep(0.2)
        ctx = _native.Context(1, 2)
        ctx.set_secret(fuzzer.secret)
        ctx.set_timeout(5)
        ctx.connect_tcp(0, fuzzer.host, fuzzer.port)
        try:
            r = fuzzer.model.regions["ro"]
            out = bytearray(64)
            ctx.get(0, r.key, 0, out)
            assert bytes(out) == bytes(r.data[:64])
        finally:
            ctx.close()
    finally:
        for s in silent:
            s.close()


def _buffer_max(which):
    """The largest tcp socket buffer the kernel may grow to (bytes)."""
    try:
        with open(f"/proc/sys/net/ipv4/tcp_{which}") as f:
            return int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return 64 << 20


def test_dropped_connection_is_closed_at_once(fuzzer):
    """A peer dropped for a bad frame while it is still sending must see the connection end
    (reset, or all its bytes taken) within seconds, even when nobody else connects; and it
    is the server that ended it: still running, the bad frame and the connection counted
    (a server that crashed on the frame resets the connection too)."""
    pid = fuzzer.target.pid
    s = socket.create_connection((fuzzer.host, fuzzer.port), timeout=5)
    fuzzer.count(accepted=1)
    try:
        hello = s.recv(w.HDR_LEN + w.NONCE)                      # HELLO
        assert len(hello) > 0, "the server closed before its HELLO"
        bad = w.Frame(w.PUT, key=1, len=w.MAX_PAYLOAD).header()  # a request before AUTH
        try:      # more than both socket buffers can hold, so that it cannot just all go
            s.sendall(bad + bytes(2 * (_buffer_max("rmem") + _buffer_max("wmem")) + (16 << 20)))
        except (BrokenPipeError, ConnectionResetError):
            pass
        except socket.timeout:
            pytest.fail("still blocked in send 5 s after the server dropped the connection")
    finally:
        s.close()
    fuzzer.count(bad_frames=1)
    fuzzer.target.check_alive()
    assert fuzzer.target.pid == pid
    stats = fuzzer.checkpoint()          # counters as sent: accepted, bad frames, auth
    assert stats["bad_frames"] == fuzzer.exp["bad_frames"] == 1, stats
    assert stats["accepted"] == fuzzer.exp["accepted"], stats
