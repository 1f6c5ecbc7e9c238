"""Peers that stall: a tcp target that takes requests and stops answering, or stops in the
middle of a reply (a partition cutting a get's payload off). Every request in flight fails
with Timeout at its own deadline, never later, and the stalled peer is not taken for lost
(slow is not gone)."""
import socket
import threading
import time

import pytest

from collectives import _native
from test_tcp import GET, HDR, accept_authenticated, err, frame, recv_exact, tcp_client


def _stalled_target(answer=None):
    """A listening socket whose one client completes the handshake and then gets no answer,
    or for its first request only what answer(header) returns (then nothing more). Returns
    (port, stop): set stop to let the target go."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    stop = threading.Event()

    def serve():
        c = accept_authenticated(lsock)
        c.settimeout(0.2)
        if answer is not None:
            c.sendall(answer(HDR.unpack(recv_exact(c, 64))))
        while not stop.is_set():
            try:
                c.recv(65536)
            except socket.timeout:
                pass
            except OSError:
                break
        c.close()
        lsock.close()

    threading.Thread(target=serve, daemon=True).start()
    return lsock.getsockname()[1], stop


def test_stalled_server_times_out_requests_in_flight():
    """A server that completes the handshake, then reads requests and never answers."""
    port, stop = _stalled_target()
    cli = tcp_client(port, 1.5)
    t0 = time.monotonic()
    req = cli.get_async(1, 5, 0, bytearray(100))
    with pytest.raises(_native.Error) as e:
        cli.fetch_add(1, 5, 0, 1)
    assert err(e) == _native.ERR_TIMEOUT and 1.0 < time.monotonic() - t0 < 5
    with pytest.raises(_native.Error) as e:
        req.wait(5)
    assert err(e) == _native.ERR_TIMEOUT
    assert not cli.peer_lost(1)             # slow is not gone
    stop.set()
    cli.close()


def _half_reply(n):
    """An answer to a get of n bytes cut off in its payload (n // 2 of them sent)."""
    def answer(h):
        assert h[1] == GET
        return frame(GET | 0x80, id=h[5], key=h[6], off=h[7], ln=h[8]) + bytes(h[8] // 2)
    return answer


def _part_header(h):
    """An answer to a request cut off inside its header."""
    return frame(h[1] | 0x80, id=h[5], key=h[6], off=h[7], ln=h[8])[:20]


@pytest.mark.parametrize("cut", ["payload", "header"])
def test_reply_cut_off_midway_times_out_at_the_deadline(cut):
    """The reader of a reply cut off midway (by a partition) gave up only after its own limit
    for a stalled read (10 s), whatever the requests' deadlines: a get past the timeout."""
    n = 64 << 10
    port, stop = _stalled_target(_half_reply(n) if cut == "payload" else _part_header)
    cli = tcp_client(port, 1.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(_native.Error) as e:
            cli.get(1, 5, 0, bytearray(n))
        took = time.monotonic() - t0
        assert err(e) == _native.ERR_TIMEOUT, e.value
        assert 0.9 < took < 3.0, took
        assert not cli.peer_lost(1)
    finally:
        stop.set()
        cli.close()
