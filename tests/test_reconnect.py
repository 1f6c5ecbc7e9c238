"""Reconnect over tcp: a connection that drops is not a dead peer.

A real forwarder between client and server (tests/proxy.py) ends the connection while both
processes live; a real server process is killed (refused: lost at once) or restarted on the
same port (a new incarnation: what it held is gone, the client says so and can rejoin). Results
are compared with the server's own bytes (numpy), the counters with what was done.
"""
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from collectives import _native
from collectives.errors import ConnectionDropped, PeerLost, PeerRestarted
from collectives.window import raise_native
from conftest import SCRIPTS
from proxy import Proxy

pytestmark = pytest.mark.timeout(120)

SECRET = b"reconnect-test-secret-0123456789"


def _server(nbytes=1 << 20, port=0):
    p = subprocess.Popen([sys.executable, str(SCRIPTS / "tcp_server.py"), SECRET.hex(),
                          str(nbytes), str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    port, key = p.stdout.readline().split()
    return p, int(port), int(key)


def _stop(p):
    if p.poll() is None:
        p.stdin.close()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _client(port, timeout=10.0):
    cli = _native.Context(0, 2, 1)
    cli.set_secret(SECRET)
    cli.set_timeout(timeout)
    cli.connect_tcp(1, "127.0.0.1", port)
    return cli


def _expect(nbytes, off=0):
    return (np.arange(off, off + nbytes) % 251).astype(np.uint8)


def _until(cond, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.01)
    return cond()


@pytest.fixture
def relayed():
    """(server process, key, proxy, client ctx reaching the server through the proxy)."""
    p, port, key = _server(64 << 20)
    px = Proxy("127.0.0.1", port)
    cli = _client(px.port)
    yield p, key, px, cli
    cli.close()
    px.close()
    _stop(p)


def test_gets_in_flight_go_again_after_a_drop(relayed):
    p, key, px, cli = relayed
    out = bytearray(8)
    cli.get(1, key, 0, out)
    assert bytes(out) == _expect(8).tobytes()
    outs = [np.zeros(16 << 20, np.uint8) for _ in range(4)]
    reqs = [cli.get_async(1, key, i << 20, o) for i, o in enumerate(outs)]
    assert px.cut() >= 1                    # the connection ends under the transfers
    for r in reqs:
        r.wait(20)
    for i, o in enumerate(outs):
        np.testing.assert_array_equal(o, _expect(16 << 20, i << 20))
    st = cli.tcp_peer_stats(1)
    assert st["reconnects"] >= 1 and not cli.peer_lost(1)
    assert px.accepted >= 2                 # the client dialed again through the proxy
    # and the world is usable: plain calls work on the new connection
    cli.get(1, key, 100, out)
    assert bytes(out) == _expect(8, 100).tobytes()


def test_puts_in_flight_go_again_and_land_once(relayed):
    p, key, px, cli = relayed
    data = [np.full(8 << 20, i + 1, np.uint8) for i in range(3)]
    errors = []

    def put(i):
        try:
            cli.put(1, key, i * (8 << 20), data[i])
        except _native.Error as e:
            errors.append(e)

    ts = [threading.Thread(target=put, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    time.sleep(0.02)
    px.cut()
    for t in ts:
        t.join(30)
    assert not errors
    back = np.zeros(24 << 20, np.uint8)
    cli.get(1, key, 0, back)
    np.testing.assert_array_equal(back, np.concatenate(data))


def test_fetch_add_in_doubt_is_a_typed_error_and_the_next_one_works(relayed):
    p, key, px, cli = relayed
    word = 1 << 20                          # an aligned int64 of the server's segment
    start = cli.fetch_add(1, key, word, 0)
    px.hold()                               # the server applies it; its answer never comes
    got = {}

    def add():
        try:
            got["old"] = cli.fetch_add(1, key, word, 5)
        except _native.Error as e:
            got["err"] = e

    t = threading.Thread(target=add)
    t.start()
    time.sleep(0.3)
    px.cut()
    t.join(20)
    assert "err" in got, got
    with pytest.raises(ConnectionDropped, match="may or may not have been applied"):
        raise_native(got["err"], rank=1, host="server", what="fetch_add")
    assert not cli.peer_lost(1)
    # it was applied (the answer was lost): that is why it is not repeated
    assert cli.fetch_add(1, key, word, 0) == start + 5
    st = cli.tcp_peer_stats(1)
    assert st["indoubt"] == 1 and st["reconnects"] >= 1


def test_version_bump_in_doubt_is_made_again(relayed):
    """The pool's rw-slab versions (pool/rejoin.py): a fetch_add lost with its connection is
    added again (a version must move after a write; twice is as good as once) and reported as
    in doubt (None: the writer's cached copy is then not trusted)."""
    from types import SimpleNamespace
    from collectives.window import Window
    from pooltensor.pool import rejoin
    p, key, px, cli = relayed
    world = SimpleNamespace(_ctx=cli, size=2, hosts=["here", "server"])
    win = Window(world, None, "rw", [0, key], [0, 64 << 20], ["rw", "rw"])
    slot = (2 << 20) // 8                  # version word at byte 2 MiB
    before = rejoin.read_version(win, 1, slot)
    assert rejoin.bump_version(win, 1, slot) == before       # a plain bump: the old value
    px.hold()
    got = {}
    t = threading.Thread(target=lambda: got.update(old=rejoin.bump_version(win, 1, slot)))
    t.start()
    time.sleep(0.3)
    px.cut()
    t.join(20)
    assert got == {"old": None}            # in doubt, and added again
    assert rejoin.read_version(win, 1, slot) == before + 3    # moved twice for that write


def test_idle_drop_is_not_a_lost_peer(relayed):
    p, key, px, cli = relayed
    cli.tcp_open(1)
    px.cut()
    assert _until(lambda: cli.tcp_peer_stats(1)["reconnects"] >= 1)
    assert not cli.peer_lost(1)
    out = bytearray(16)
    cli.get(1, key, 8, out)
    assert bytes(out) == _expect(16, 8).tobytes()


def test_new_process_behind_the_same_address_is_a_restart(relayed):
    """The dial after a drop reaches another process (a new incarnation): the peer counts as
    restarted and lost (our keys mean nothing there) until the caller rejoins it."""
    p, key, px, cli = relayed
    p2, port2, key2 = _server()
    try:
        cli.tcp_open(1)
        px.target = ("127.0.0.1", port2)
        px.cut()
        assert _until(lambda: cli.peer_lost(1), 5)
        assert cli.tcp_peer_stats(1)["restarts"] == 1
        with pytest.raises(_native.Error) as e:
            cli.get(1, key, 0, bytearray(8))
        assert e.value.args[0] in (_native.ERR_RESTARTED, _native.ERR_PEER_LOST)
        cli.tcp_rejoin(1)
        out = bytearray(8)
        cli.get(1, key2, 16, out)
        assert bytes(out) == _expect(8, 16).tobytes()
        assert cli.tcp_peer_stats(1)["restarts"] == 1 and not cli.peer_lost(1)
    finally:
        _stop(p2)


def test_killed_server_is_lost_at_once_not_after_the_timeout():
    p, port, key = _server()
    cli = _client(port, timeout=30)
    cli.tcp_open(1)
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert _until(lambda: cli.peer_lost(1), 5)
    assert time.monotonic() - t0 < 3        # a refused dial, not 30 s of trying
    with pytest.raises(_native.Error) as e:
        cli.get(1, key, 0, bytearray(8))
    assert e.value.args[0] == _native.ERR_PEER_LOST
    cli.close()


def test_restarted_server_is_rejoined_and_its_old_data_is_gone():
    p, port, key = _server()
    cli = _client(port)
    out = bytearray(8)
    cli.get(1, key, 0, out)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert _until(lambda: cli.peer_lost(1), 5)
    p2, port2, key2 = _server(port=port)    # the same address, a new process
    assert port2 == port
    try:
        with pytest.raises(_native.Error):
            cli.get(1, key2, 0, out)        # lost stays lost until the caller rejoins
        cli.tcp_rejoin(1)
        assert not cli.peer_lost(1)
        cli.get(1, key2, 8, out)
        assert bytes(out) == _expect(8, 8).tobytes()
        assert cli.tcp_peer_stats(1)["restarts"] == 1
        with pytest.raises(_native.Error) as e:
            cli.get(1, key, 0, out)         # the old registration died with the old process
        assert e.value.args[0] == _native.ERR_KEY
    finally:
        cli.close()
        _stop(p2)


def test_unreachable_after_a_drop_is_a_timeout_within_the_timeout():
    """A dropped connection whose peer cannot be reached again (the forwarder accepts and
    never answers: a black hole) fails what was in flight with Timeout within the timeout,
    then works again once the peer is reachable."""
    p, port, key = _server(64 << 20)
    px = Proxy("127.0.0.1", port)
    cli = _client(px.port, timeout=2.0)
    try:
        cli.get(1, key, 0, bytearray(8))
        px.hold()
        out = np.zeros(32 << 20, np.uint8)
        req = cli.get_async(1, key, 0, out)
        time.sleep(0.1)
        px.mute()
        t0 = time.monotonic()
        px.cut()
        with pytest.raises(_native.Error) as e:
            req.wait(10)
        assert e.value.args[0] == _native.ERR_TIMEOUT
        assert time.monotonic() - t0 < 3.5
        time.sleep(max(0.0, t0 + 2.5 - time.monotonic()))
        assert not cli.peer_lost(1)         # out of reach for the whole timeout: not dead
        px.mute(False)
        cli.get(1, key, 0, out)             # reachable again: usable again
        np.testing.assert_array_equal(out, _expect(32 << 20))
    finally:
        cli.close()
        px.close()
        _stop(p)


def test_error_types():
    assert issubclass(PeerRestarted, PeerLost)
    e = _native.Error(_native.ERR_RESTARTED, 0, "the peer restarted: what it held is gone")
    with pytest.raises(PeerRestarted, match="restarted"):
        raise_native(e, rank=1, host="h", what="get")
