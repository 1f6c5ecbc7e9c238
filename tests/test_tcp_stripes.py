"""Large gets and puts over tcp striped over several connections (POOLTENSOR_TCP_STRIPES).

The server's own counters say how many connections a transfer used; the bytes are compared with
numpy at odd sizes and offsets, parts refused by the target fail the whole call, and a stripe
connection cut under a transfer (a real forwarder, tests/proxy.py) is a dropped connection:
its parts go again and land once.
"""
import threading

import numpy as np
import pytest

from collectives import _native
from proxy import Proxy

pytestmark = pytest.mark.timeout(60)

SECRET = b"stripe-test-secret-0123456789abc"
PART = 1 << 20          # the smallest part with a connection of its own, here (default 4 MiB)
CHUNK = _native.TCP_FRAME


def _pair(monkeypatch, stripes, nbytes=32 << 20, via_proxy=False):
    if stripes:
        monkeypatch.setenv("POOLTENSOR_TCP_STRIPES", str(stripes))
        monkeypatch.setenv("POOLTENSOR_TCP_STRIPE_PART", str(PART))
    else:                                       # the defaults
        monkeypatch.delenv("POOLTENSOR_TCP_STRIPES", raising=False)
        monkeypatch.delenv("POOLTENSOR_TCP_STRIPE_PART", raising=False)
    srv = _native.Context(0, 1, 1)
    srv.set_secret(SECRET)
    port = srv.listen("127.0.0.1", 0)
    seg = _native.Segment(nbytes)
    srv.add_segment(seg)
    mem = np.frombuffer(seg, np.uint8)
    mem[:] = np.arange(mem.size) % 251
    key = srv.register(mem, 3)
    ro = srv.register(mem, 1)
    px = Proxy("127.0.0.1", port) if via_proxy else None
    cli = _native.Context(0, 2, 1)
    cli.set_secret(SECRET)
    cli.set_timeout(10)
    cli.connect_tcp(1, "127.0.0.1", px.port if px else port)
    return srv, seg, mem, key, ro, cli, px


def _close(srv, cli, px=None):
    cli.close()
    if px:
        px.close()
    srv.close()


@pytest.mark.parametrize("stripes", [1, 3, 5])
def test_large_transfers_use_that_many_connections_and_bytes_are_exact(monkeypatch, stripes):
    srv, seg, mem, key, ro, cli, _ = _pair(monkeypatch, stripes, nbytes=12 << 20)
    try:
        rng = np.random.default_rng(stripes)
        # (size, offset): odd sizes, offsets off any chunk or page, parts of unequal length
        cases = [(2 * PART + 1, 3), (3 * PART + 12345, 4097), (5 * PART - 7, 1),
                 (7 * PART + CHUNK + 17, (1 << 20) + 5), (PART - 1, 11)]
        for n, off in cases:
            out = np.empty(n + 2, np.uint8)
            out[0] = out[-1] = 0xAB                      # nothing around the buffer is written
            cli.get(1, key, off, out[1:-1])
            np.testing.assert_array_equal(out[1:-1], mem[off:off + n])
            assert out[0] == out[-1] == 0xAB
            before = mem.copy()
            data = rng.integers(0, 256, n, dtype=np.uint8)
            cli.put(1, key, off, data)
            np.testing.assert_array_equal(mem[off:off + n], data)
            np.testing.assert_array_equal(mem[:off], before[:off])
            np.testing.assert_array_equal(mem[off + n:], before[off + n:])
        s = srv.tcp_stats()
        # the largest case has 7 parts: min(stripes, 7) connections, each authenticated once
        assert s["active"] == stripes and s["accepted"] == stripes
        assert s["bad_frames"] == 0 and s["auth_failures"] == 0
        # many striped transfers in flight at once share those connections
        outs = [np.empty(3 * PART + i, np.uint8) for i in range(6)]
        reqs = [cli.get_async(1, key, 1000 * i + 1, o) for i, o in enumerate(outs)]
        for i, (r, o) in enumerate(zip(reqs, outs)):
            r.wait(10)
            np.testing.assert_array_equal(o, mem[1000 * i + 1:1000 * i + 1 + o.size])
        assert srv.tcp_stats()["accepted"] == stripes
    finally:
        _close(srv, cli)


def test_defaults_stripe_from_two_4_mib_parts_over_4_connections(monkeypatch):
    srv, seg, mem, key, ro, cli, _ = _pair(monkeypatch, 0)
    try:
        out = np.empty((8 << 20) - 1, np.uint8)         # under two parts: not striped
        cli.get(1, key, 0, out)
        cli.put(1, key, 0, out)
        assert srv.tcp_stats()["accepted"] == 1
        out = np.empty(8 << 20, np.uint8)               # two parts
        cli.get(1, key, 5, out)
        np.testing.assert_array_equal(out, mem[5:5 + out.size])
        assert srv.tcp_stats()["accepted"] == 2
        out = np.empty(24 << 20, np.uint8)              # six parts, four connections
        cli.put(1, key, 1, out)
        np.testing.assert_array_equal(out, mem[1:1 + out.size])
        assert srv.tcp_stats()["accepted"] == 4
    finally:
        _close(srv, cli)


def test_refused_parts_fail_the_whole_and_the_world_stays_usable(monkeypatch):
    srv, seg, mem, key, ro, cli, _ = _pair(monkeypatch, 4, nbytes=8 << 20)
    try:
        before = mem.copy()
        with pytest.raises(_native.Error) as e:         # the last parts run past the end
            cli.get(1, key, (4 << 20) + 1, np.empty(4 << 20, np.uint8))
        assert e.value.args[0] == _native.ERR_BOUNDS
        with pytest.raises(_native.Error) as e:         # read-only: every part is refused
            cli.put(1, ro, 0, np.zeros(6 << 20, np.uint8))
        assert e.value.args[0] == _native.ERR_MODE
        np.testing.assert_array_equal(mem, before)
        out = np.empty(6 << 20, np.uint8)
        cli.get(1, key, 7, out)
        np.testing.assert_array_equal(out, mem[7:7 + out.size])
        assert srv.tcp_stats()["bad_frames"] == 0
    finally:
        _close(srv, cli)


@pytest.mark.parametrize("put", [False, True])
def test_a_cut_stripe_is_a_dropped_connection(monkeypatch, put):
    srv, seg, mem, key, ro, cli, px = _pair(monkeypatch, 3, nbytes=64 << 20, via_proxy=True)
    try:
        warm = np.empty(3 * max(PART, CHUNK), np.uint8)
        cli.get(1, key, 0, warm)                        # three connections, three relays
        assert px.accepted == 3
        n = 20 << 20
        rng = np.random.default_rng(5)
        datas = [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(3)]
        outs = [np.zeros(n, np.uint8) for _ in range(3)]
        reqs = [(cli.put_async if put else cli.get_async)(1, key, i * n + 3,
                                                          datas[i] if put else outs[i])
                for i in range(3)]
        cut = px.cut(2)                                  # one stripe ends under the transfers
        for r in reqs:
            r.wait(20)
        for i in range(3):
            if put:
                np.testing.assert_array_equal(mem[i * n + 3:(i + 1) * n + 3], datas[i])
            else:
                np.testing.assert_array_equal(outs[i], mem[i * n + 3:(i + 1) * n + 3])
        assert cut == 1 and not cli.peer_lost(1)
        st = cli.tcp_peer_stats(1)
        assert st["retried"] >= 1 and st["indoubt"] == 0     # its parts went again, once
        # the world is usable: the next large transfer dials the stripe again
        cli.get(1, key, 1, warm)
        np.testing.assert_array_equal(warm, mem[1:1 + warm.size])
        assert px.accepted >= 4
    finally:
        _close(srv, cli, px)


def test_striped_transfers_from_many_threads(monkeypatch):
    srv, seg, mem, key, ro, cli, _ = _pair(monkeypatch, 4)
    try:
        errors = []
        n = 4 * max(PART, CHUNK)    # four parts of whole frames

        def work(i):
            try:
                data = np.full(n, i + 1, np.uint8)
                cli.put(1, key, i * (5 << 20) + i, data)
                out = np.empty(n, np.uint8)
                cli.get(1, key, i * (5 << 20) + i, out)
                np.testing.assert_array_equal(out, data)
            except Exception as e:                       # noqa: BLE001 - reported below
                errors.append(e)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(6)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert not errors
        assert srv.tcp_stats()["accepted"] == 4
    finally:
        _close(srv, cli)
