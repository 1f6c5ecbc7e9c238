"""The rendezvous store: one set of semantics, checked against every store kind.

TCPStore's server faces the network, so it is also fed hostile frames on raw sockets: each one
must close only its own connection while the server keeps serving everyone else.
"""
import math
import socket
import struct
import threading
import time

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from collectives.errors import BootstrapError, PeerLost, Timeout
from collectives.rendezvous import (HashStore, PrefixStore, TCPStore, allgather, barrier,
                                    default_timeout)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(params=["hash", "tcp"])
def kind(request):
    return request.param


@pytest.fixture
def store(kind):
    s = HashStore(timeout=5) if kind == "hash" else TCPStore("127.0.0.1", 0, True, timeout=5)
    yield s
    s.close()


def client_of(store):
    """Another handle on the same keys: a new TCP client, or the same in-process store."""
    return TCPStore("127.0.0.1", store.port, timeout=5) if isinstance(store, TCPStore) else store


def keys_left(store):
    return store.server._data if isinstance(store, TCPStore) else store._data


def test_set_get_overwrite_delete(store):
    store.set("a", b"1")
    assert store.get("a") == b"1"
    store.set("a", bytearray(b"22"))
    assert store.get("a") == b"22"
    store.set("empty", b"")
    assert store.get("empty") == b""
    assert store.delete("a") is True
    assert store.delete("a") is False
    with pytest.raises(Timeout):
        store.get("a", timeout=0)


def test_get_waits_for_a_later_set(store):
    other = client_of(store)
    threading.Timer(0.2, other.set, ("late", b"v")).start()
    t = time.monotonic()
    assert store.get("late", timeout=5) == b"v"
    assert 0.1 < time.monotonic() - t < 3


def test_wait_many_keys(store):
    other = client_of(store)

    def later():
        for k in ("k1", "k2", "k3"):
            time.sleep(0.05)
            other.set(k, b"x")

    threading.Thread(target=later).start()
    store.wait(["k1", "k2", "k3"], timeout=5)
    store.wait("k1", timeout=0)


def test_get_timeout_names_key(store):
    t = time.monotonic()
    with pytest.raises(Timeout, match="missing-key"):
        store.get("missing-key", timeout=0.2)
    assert 0.15 < time.monotonic() - t < 2
    with pytest.raises(TimeoutError):  # Timeout is also the builtin TimeoutError
        store.wait(["missing-key"], timeout=0.1)


def test_add_counter(store):
    assert store.add("c", 1) == 1
    assert store.add("c", 5) == 6
    assert store.add("c", -10) == -4
    assert store.get("c") == b"-4"
    store.set("notnum", b"abc")
    with pytest.raises(ValueError):
        store.add("notnum", 1)
    with pytest.raises(TypeError):
        store.add("c", 1.5)


def test_bad_arguments(store):
    with pytest.raises(TypeError):
        store.set("k", "text")
    with pytest.raises(TypeError):
        store.set(b"k", b"v")
    with pytest.raises(ValueError):
        store.get("k", timeout=-1)
    with pytest.raises(ValueError):
        store.get("k", timeout=math.inf)


def test_prefix_store_isolates(store):
    a, b = PrefixStore("a", store), PrefixStore("b", store)
    a.set("k", b"A")
    b.set("k", b"B")
    assert (a.get("k"), b.get("k"), store.get("a/k")) == (b"A", b"B", b"A")
    assert a.add("n", 2) == 2 and b.add("n", 3) == 3
    a.wait(["k"], timeout=1)
    assert a.delete("k") and store.get("b/k") == b"B"
    a.close()
    store.set("still", b"open")


def test_many_concurrent_adders_exact_total(store):
    clients = [client_of(store) for _ in range(8)]

    def work(c):
        for _ in range(100):
            c.add("total", 1)

    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get("total") == b"800"


def test_one_client_shared_by_threads(store):
    """A get blocked in one thread must not hold up a set from another thread on the same handle."""
    threading.Timer(0.1, store.set, ("x", b"1")).start()
    assert store.get("x", timeout=5) == b"1"
    out = []
    ts = [threading.Thread(target=lambda i=i: out.append(store.add("n", i))) for i in range(10)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert store.get("n") == b"45" and max(out) == 45


def test_default_timeout_from_env(monkeypatch):
    monkeypatch.setenv("POOLTENSOR_TIMEOUT", "0.2")
    assert default_timeout() == 0.2
    with pytest.raises(Timeout):
        HashStore().get("nothing")
    monkeypatch.setenv("POOLTENSOR_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="POOLTENSOR_TIMEOUT"):
        default_timeout()


def test_closed_store_fails(store):
    store.close()
    with pytest.raises(BootstrapError):
        store.set("k", b"v")


# -- allgather / barrier -------------------------------------------------------------------------
def run_ranks(size, fn):
    """Run fn(rank) in ``size`` threads; return results by rank, re-raising the first error."""
    results, errors = [None] * size, []

    def body(r):
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    if errors:
        raise errors[0]
    return results


def test_allgather_and_barrier_rounds_clean_up(store):
    size = 4
    clients = [client_of(store) for _ in range(size)]

    def rank(r):
        got = []
        for i in range(15):
            got.append(allgather(clients[r], f"round{i}", r, size, f"{r}:{i}".encode(), 10))
            barrier(clients[r], f"bar{i}", r, size, 10)
        return got

    for r, rounds in enumerate(run_ranks(size, rank)):
        for i, vals in enumerate(rounds):
            assert vals == [f"{q}:{i}".encode() for q in range(size)]
    assert not keys_left(store)


def test_concurrent_tags_do_not_mix(store):
    size = 3
    clients = [client_of(store) for _ in range(2 * size)]

    def rank(i):
        group, r = divmod(i, size)
        return allgather(clients[i], f"group{group}", r, size, f"g{group}r{r}".encode(), 10)

    out = run_ranks(2 * size, rank)
    for i, vals in enumerate(out):
        g = i // size
        assert vals == [f"g{g}r{r}".encode() for r in range(size)]


def test_barrier_waits_for_last(store):
    size, arrived, left = 3, [], []
    clients = [client_of(store) for _ in range(size)]

    def rank(r):
        time.sleep(0.1 * r)
        arrived.append(time.monotonic())
        barrier(clients[r], "b", r, size, 10)
        left.append(time.monotonic())

    run_ranks(size, rank)
    assert min(left) >= max(arrived)


def test_allgather_timeout_names_missing_rank(store):
    with pytest.raises(Timeout, match="rank 1"):
        allgather(store, "lonely", 0, 2, b"x", timeout=0.2)
    with pytest.raises(Timeout, match="1 of 2"):
        barrier(store, "lonely", 0, 2, timeout=0.2)
    with pytest.raises(ValueError):
        allgather(store, "bad", 2, 2, b"x")


# -- TCP specifics -------------------------------------------------------------------------------
@pytest.fixture
def tcp():
    s = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    yield s
    s.close()


def raw_conn(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s


def closed_by_server(sock):
    """True when the server closes the connection (EOF or reset) rather than answering."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def frame(obj):
    body = msgpack.packb(obj, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


HOSTILE = {
    "garbage": struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1",
    "incomplete_msgpack": struct.pack(">I", 2) + b"\x92\x01",  # array of 2 holding 1
    "oversized": struct.pack(">I", 0xFFFFFFFF) + b"xx",
    "array_not_map": frame([1, 2, 3]),
    "unknown_op": frame({"op": "explode", "key": "k"}),
    "op_int": frame({"op": 3, "key": "k"}),
    "key_bytes": frame({"op": "get", "key": b"k", "timeout": 1}),
    "value_str": frame({"op": "set", "key": "k", "value": "text"}),
    "timeout_str": frame({"op": "get", "key": "k", "timeout": "1"}),
    "timeout_nan": frame({"op": "get", "key": "k", "timeout": float("nan")}),
    "timeout_negative": frame({"op": "wait", "key": "k", "timeout": -1}),
    "delta_float": frame({"op": "add", "key": "k", "delta": 1.0}),
    "delta_bool": frame({"op": "add", "key": "k", "delta": True}),
    "int_map_key": struct.pack(">I", 3) + b"\x81\x01\x01",
    "bad_utf8": frame({"op": "get", "key": "k"})[:-1] + b"\xff",
    "ext_type": frame({"op": "set", "key": "k", "value": msgpack.ExtType(5, b"x")}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_frame_closes_only_that_connection(tcp, name):
    good = TCPStore("127.0.0.1", tcp.port, timeout=5)
    bystander = raw_conn(tcp.port)
    bad = raw_conn(tcp.port)
    bad.sendall(HOSTILE[name])
    assert closed_by_server(bad)
    assert tcp.server.bad_frames == 1
    good.set("after", b"ok")
    assert tcp.get("after") == b"ok"
    bystander.sendall(frame({"op": "get", "key": "after", "timeout": 1}))
    n = struct.unpack(">I", bystander.recv(4))[0]
    assert msgpack.unpackb(bystander.recv(n)) == {"ok": True, "value": b"ok"}
    for s in (bad, bystander):
        s.close()
    good.close()


def test_truncated_frame_counted(tcp):
    s = raw_conn(tcp.port)
    s.sendall(struct.pack(">I", 100) + b"0123456789")
    s.close()
    deadline = time.monotonic() + 5
    while tcp.server.bad_frames == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tcp.server.bad_frames == 1
    assert tcp.add("alive", 1) == 1


def test_frame_limit():
    s = TCPStore("127.0.0.1", 0, is_server=True, timeout=5, max_frame=4096)
    try:
        with pytest.raises(ValueError, match="frame limit"):
            s.set("big", b"x" * 5000)
        sock = raw_conn(s.port)
        sock.sendall(frame({"op": "set", "key": "big", "value": b"x" * 5000}))
        assert closed_by_server(sock) and s.server.bad_frames == 1
        s.set("small", b"y")
    finally:
        s.close()


def test_large_value_roundtrip(tcp):
    value = bytes(range(256)) * (20 << 12)  # 20 MiB: many partial sends and receives
    tcp.set("big", value)
    assert TCPStore("127.0.0.1", tcp.port, timeout=5).get("big") == value


def test_pipelined_frames_answered_in_order(tcp):
    s = raw_conn(tcp.port)
    s.sendall(b"".join(frame({"op": "add", "key": "p", "delta": 1}) for _ in range(500)))
    f = s.makefile("rb")
    got = []
    for _ in range(500):
        n = struct.unpack(">I", f.read(4))[0]
        got.append(msgpack.unpackb(f.read(n))["value"])
    assert got == list(range(1, 501))
    s.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=64))
def test_fuzz_random_bytes_never_kill_server(tcp, data):
    s = raw_conn(tcp.port)
    s.sendall(struct.pack(">I", len(data)) + data)
    s.close()
    assert tcp.add("fuzz", 1) >= 1


def test_client_waits_for_late_server():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    servers = []
    threading.Timer(0.3, lambda: servers.append(TCPStore("127.0.0.1", port, True))).start()
    client = TCPStore("127.0.0.1", port, timeout=5)
    client.set("k", b"v")
    assert servers[0].get("k") == b"v"
    client.close()
    servers[0].close()


def test_no_server_is_bootstrap_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(BootstrapError, match=f"127.0.0.1:{port}"):
        TCPStore("127.0.0.1", port, timeout=0.3)
    assert time.monotonic() - t < 3


def test_server_gone_is_peer_lost():
    server = TCPStore("127.0.0.1", 0, is_server=True, timeout=5)
    client = TCPStore("127.0.0.1", server.port, timeout=5)
    threading.Timer(0.2, server.close).start()
    with pytest.raises(PeerLost, match="rank 0"):
        client.get("never", timeout=5)
    with pytest.raises(PeerLost):
        client.set("k", b"v")
    client.close()


def test_server_thread_stops_on_close():
    s = TCPStore("127.0.0.1", 0, is_server=True)
    thread = s.server._thread
    s.close()
    assert not thread.is_alive()
    with pytest.raises(BootstrapError):
        TCPStore("127.0.0.1", s.port, timeout=0.2)
