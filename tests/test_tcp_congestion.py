"""The congestion control of the tcp transport's sockets (POOLTENSOR_TCP_CONGESTION), read back
from the kernel with getsockopt on both ends of a real connection: by default reno (not a
pacing one such as BBR, whose timer per burst halves throughput in a virtual machine, nor
cubic, which leaves slow start early on short round trips), the system's own for "system",
or the name given."""
import os
import socket
import sys

import numpy as np
import pytest

from collectives import _native
from test_tcp import SECRET, tcp_client

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not hasattr(socket, "TCP_CONGESTION"),
                                 reason="no per-socket congestion control on this platform")]


def settable(name):
    """Whether this process may give a socket the congestion control `name`."""
    with socket.socket() as s:
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
            return True
        except OSError:
            return False


def system_default():
    with socket.socket() as s:
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


def congestion_of_connection(port):
    """The congestion control of each of this process's tcp sockets whose local or remote port
    is `port` (the listener's accepted end and the client's end)."""
    seen = []
    for fd in map(int, os.listdir("/proc/self/fd")):
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with s:
            try:
                if s.type != socket.SOCK_STREAM or s.family != socket.AF_INET:
                    continue
                ends = (s.getsockname()[1], s.getpeername()[1])
            except OSError:
                continue
            if port in ends:
                cc = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
                seen.append(cc.rstrip(b"\0").decode())
    return seen


def connected_pair_congestion():
    srv = _native.Context(0, 1, 1)
    srv.set_secret(SECRET)
    port = srv.listen("127.0.0.1", 0)
    cli = tcp_client(port, 10)
    try:
        seg = np.zeros(4096, np.uint8)
        key = srv.register(seg, 3)
        cli.put(1, key, 0, np.ones(8, np.uint8))  # the server end is served (tuned) by now
        assert (seg[:8] == 1).all()
        return congestion_of_connection(port)
    finally:
        cli.close()
        srv.close()


@pytest.mark.parametrize("setting", [None, "system", "reno", "no-such-control,reno"])
def test_sockets_get_the_congestion_control_asked_for(monkeypatch, setting):
    if setting is None:
        monkeypatch.delenv("POOLTENSOR_TCP_CONGESTION", raising=False)
        want = "reno"
    else:
        monkeypatch.setenv("POOLTENSOR_TCP_CONGESTION", setting)
        want = system_default() if setting == "system" else "reno"
    if want == "reno" and not settable("reno"):
        pytest.skip("reno is not available to this process")
    seen = connected_pair_congestion()
    assert len(seen) == 2, seen           # the client's end and the server's
    assert seen == [want, want], (setting, seen)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))
