"""A memory server under load and abuse, on loopback with real sockets against a real
`pooltensor serve`: a slowloris on the control port, floods of connections that never
authenticate, one authenticated client trying to take every table entry or connection, what
a client is told when it is refused (refused, timed out, wrong protocol), and whole log lines.
Every attack loop is bounded in count and time. The server's limits are set small through
its POOLTENSOR_SERVE_* variables so that the tests run in seconds."""
import re
import socket
import struct
import threading
import time

import pytest

from servers import ServerProc, make_secret

from collectives import control as ctl
from collectives import remote
from collectives.errors import BootstrapError, Timeout

pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20
PAGE = 4096
NATIVE_TUPLE = re.compile(r"\(\d+, -?\d+, '")     # how a raw _native.Error prints


@pytest.fixture
def secret(tmp_path):
    return make_secret(tmp_path)


def start(secret, memory="64MiB", **limits):
    env = {f"POOLTENSOR_SERVE_{k.upper()}": str(v) for k, v in limits.items()}
    return ServerProc(memory, secret, env_extra=env).ready()


def client(server, secret, timeout=10.0):
    return remote._Server(1, server.address, ctl.read_secret(secret), timeout)


def lifetime(sock, limit):
    """Seconds until the server closes `sock` (reads and discards), or None after `limit`."""
    t0 = time.monotonic()
    sock.settimeout(0.2)
    while time.monotonic() - t0 < limit:
        try:
            if not sock.recv(4096):
                return time.monotonic() - t0
        except socket.timeout:
            continue
        except OSError:
            return time.monotonic() - t0
    return None


# -- the control port under a slowloris ------------------------------------------------------

class Slowloris:
    """`n` connections to the control port, each sending a frame header and then one byte
    every `every` s (never a whole frame); a dropped one is opened again. Runs at most
    `duration` s in a thread; records how long the server let each connection live."""

    def __init__(self, port, n=64, every=0.5, duration=8.0):
        self.port, self.n, self.every, self.duration = port, n, every, duration
        self.lived = []                # seconds each dropped connection was kept
        self.opened = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _open(self):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.setblocking(False)
        try:
            s.send(struct.pack("<I", 1000))     # a frame of 1000 bytes, sent a byte at a time
        except OSError:
            pass
        self.opened += 1
        return [s, time.monotonic()]

    def _run(self):
        conns = []
        end = time.monotonic() + self.duration
        try:
            while not self._stop.is_set() and time.monotonic() < end:
                while len(conns) < self.n:
                    conns.append(self._open())
                time.sleep(self.every)
                for c in list(conns):
                    try:
                        c[0].send(b"x")
                        if c[0].recv(4096) == b"":
                            raise ConnectionResetError
                    except BlockingIOError:
                        continue
                    except OSError:
                        self.lived.append(time.monotonic() - c[1])
                        c[0].close()
                        conns.remove(c)
        finally:
            for c in conns:
                c[0].close()

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(self.duration + 10)


def test_slowloris_does_not_lock_out_clients(secret):
    """64 connections that trickle a frame a byte at a time cannot keep legitimate clients
    out: the server drops them at the handshake deadline (a whole-handshake deadline, not a
    per-recv timeout) and they share a budget of their own, the oldest dropped for the
    newest; meanwhile clients connect, authenticate and are served in well under a second."""
    s = start(secret, handshake_timeout=2)
    try:
        with Slowloris(s.port, n=64, every=0.5, duration=8.0) as attack:
            time.sleep(1.0)                        # the attack is fully under way
            waits = []
            for _ in range(5):
                t0 = time.monotonic()
                c = client(s, secret, timeout=10)
                assert c.request({"op": "info"})["ok"]
                waits.append(time.monotonic() - t0)
                c.close()
                time.sleep(0.5)
        assert max(waits) < 2.0, waits
        assert attack.opened > 64 and attack.lived, (attack.opened, attack.lived)
        # a byte every 0.5 s never lets a connection outlive the 2 s deadline by much
        assert max(attack.lived) < 2.0 + 1.5, sorted(attack.lived)[-5:]
        assert s.proc.poll() is None
    finally:
        s.stop()


def test_silent_connection_is_dropped_at_the_deadline(secret):
    """A connection that never sends a byte cannot hold the server: it is closed at the
    handshake deadline (10 s by default; 1.5 here) and the log says why."""
    s = start(secret, handshake_timeout=1.5)
    try:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        assert ctl.recv_frame(sock)["hello"] == ctl.HELLO
        took = lifetime(sock, 15)
        assert took is not None and 1.0 <= took < 1.5 + 3, took
        s.log.wait("did not authenticate within")
    finally:
        s.stop()


def test_handshake_deadline_is_for_the_whole_handshake(secret):
    s = start(secret, handshake_timeout=1.5)
    try:
        sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
        assert ctl.recv_frame(sock)["hello"] == ctl.HELLO
        sock.sendall(struct.pack("<I", 1000))
        t0 = time.monotonic()
        closed = None
        for _ in range(40):                      # a byte every 0.2 s, for 8 s at most
            try:
                sock.sendall(b"x")
            except OSError:
                closed = time.monotonic() - t0
                break
            if lifetime_now(sock):
                closed = time.monotonic() - t0
                break
            time.sleep(0.2)
        sock.close()
        assert closed is not None and 1.0 < closed < 1.5 + 1.5, closed
        s.log.wait(r"did not authenticate within 1.5 s", 10)
    finally:
        s.stop()


def lifetime_now(sock):
    """True when the server has closed `sock` (checked without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def test_unauthenticated_connections_have_their_own_budget(secret):
    """Past max_pending connections still authenticating, each new one displaces the oldest
    (closed at once, long before its deadline); a client still gets in."""
    s = start(secret, handshake_timeout=60, max_pending=4, max_clients=2)
    socks = []
    try:
        for _ in range(6):
            socks.append(socket.create_connection(("127.0.0.1", s.port), timeout=5))
            time.sleep(0.05)
        assert lifetime(socks[0], 5) is not None and lifetime(socks[1], 5) is not None
        assert lifetime(socks[5], 0.5) is None        # the newest are kept
        c = client(s, secret)                          # displaces the oldest again
        info = c.request({"op": "info"})
        assert info["control"]["dropped"] >= 3, info
        s.log.wait(r"dropped: the oldest of 4 connections still authenticating", 10)
        c.close()
    finally:
        for x in socks:
            x.close()
        s.stop()


# -- what a refused client is told ---------------------------------------------------------

def fake_server(behaviour):
    """A listener on loopback whose one connection gets `behaviour(sock)`; returns
    (address, thread)."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)

    def serve():
        try:
            ls.settimeout(10)
            c, _ = ls.accept()
            behaviour(c)
            c.close()
        except OSError:
            pass
        finally:
            ls.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"127.0.0.1:{ls.getsockname()[1]}", t


def test_client_errors_say_refused_timed_out_or_wrong_protocol(secret):
    # a real server at its limit of clients: refused, saying why
    s = start(secret, max_clients=1)
    try:
        first = client(s, secret)
        with pytest.raises(remote.ServerRefused, match=r"at most 1 client"):
            client(s, secret)
        s.log.wait(r"refused: at most 1 client", 10)
        first.close()
    finally:
        s.stop()
    # closed at once: not "not a memory server"
    addr, t = fake_server(lambda c: None)
    with pytest.raises(BootstrapError, match="closed the connection before greeting"):
        remote.connect([addr], secret_file=secret, timeout=5)
    t.join(5)
    # silent: a Timeout, within the deadline
    addr, t = fake_server(lambda c: time.sleep(4))
    t0 = time.monotonic()
    with pytest.raises(Timeout, match=r"did not greet within 1(\.0)? s"):
        remote.connect([addr], secret_file=secret, timeout=1)
    assert time.monotonic() - t0 < 3
    t.join(10)
    # something else that answers: a wrong protocol, said as such
    addr, t = fake_server(lambda c: (c.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n"),
                                     time.sleep(0.5)))
    with pytest.raises(ctl.AuthenticationError, match="is not a pooltensor memory server"):
        remote.connect([addr], secret_file=secret, timeout=5)
    t.join(5)


def raw_client(server, secret, source="127.0.0.1"):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10,
                                    source_address=(source, 0))
    ctl.client_handshake(sock, ctl.read_secret(secret), "server")
    return sock


def test_connections_per_address_are_limited(secret):
    s = start(secret, max_clients=8, max_per_host=2)
    socks = []
    try:
        socks += [raw_client(s, secret), raw_client(s, secret)]
        with pytest.raises(ctl.ServerRefused, match=r"at most 2 connections from 127\.0\.0\.1"):
            raw_client(s, secret)
        socks.append(raw_client(s, secret, "127.0.0.2"))    # another address is not affected
        ctl.send_frame(socks[-1], {"op": "info"})
        assert ctl.recv_frame(socks[-1])["clients"] == 3
    finally:
        for x in socks:
            x.close()
        s.stop()


# -- what one client can make a server hold --------------------------------------------------

def fill(c, msg, limit=5000):
    """Send `msg` until refused; returns (how many succeeded, the refusal)."""
    for n in range(limit):
        try:
            c.request(msg)
        except remote.ServerRefused as e:
            return n, str(e)
    raise AssertionError(f"{msg} never refused after {limit}")


def test_one_client_cannot_take_the_tables_from_the_others(secret):
    """A client that registers or allocates until refused hits its own limit, told so
    plainly; every other client (up to max_clients) still gets its whole share."""
    s = start(secret, memory="4MiB", max_clients=4)
    conns = []
    try:
        greedy = client(s, secret)
        conns.append(greedy)
        n_allocs, why = fill(greedy, {"op": "alloc", "size": 1, "access": "r"})
        assert "allocations per client" in why and not NATIVE_TUPLE.search(why), why
        n_regs, why = fill(greedy, {"op": "register", "id": 1, "access": "rw"})
        assert "registrations per client" in why and not NATIVE_TUPLE.search(why), why
        limits = greedy.request({"op": "info"})["limits"]
        assert (n_allocs, n_allocs + n_regs) == (limits["allocations"],
                                                 limits["registrations"]), limits
        # the others: each takes its whole share of allocations and registrations
        for _ in range(3):
            c = client(s, secret)
            conns.append(c)
            ids = [c.request({"op": "alloc", "size": PAGE, "access": "rw"})["id"]
                   for _ in range(limits["allocations"])]
            for k in range(limits["registrations"] - len(ids)):
                c.request({"op": "register", "id": ids[k % len(ids)], "access": "r"})
            _, why = fill(c, {"op": "register", "id": ids[0], "access": "r"})
            assert "registrations per client" in why, why
        assert limits["allocations"] * 4 <= 256 and limits["registrations"] * 4 <= 1024
    finally:
        for c in conns:
            c.close()
        s.stop()


def test_allocations_per_client_then_freed(secret):
    s = start(secret, memory="8MiB", max_clients=4)
    try:
        c = client(s, secret)
        n, why = fill(c, {"op": "alloc", "size": PAGE, "access": "rw"})
        assert n == c.request({"op": "info"})["limits"]["allocations"] == 64, (n, why)
        assert f"at most {n} allocations per client" in why and not NATIVE_TUPLE.search(why)
        c.request({"op": "free", "id": 1})
        assert c.request({"op": "alloc", "size": PAGE, "access": "rw"})["ok"]
        other = client(s, secret)
        assert other.request({"op": "alloc", "size": PAGE, "access": "rw"})["ok"]
        other.close()
        c.close()
    finally:
        s.stop()


# -- the log ---------------------------------------------------------------------------------

LINE = re.compile(
    r"^pooltensor serve: ("
    r"serving .*|"
    r"127\.0\.0\.1:\d+ connected \(.* free\)|"
    r"127\.0\.0\.1:\d+ disconnected: [^:]*(: [^;]*)?; freed \d+ allocation\(s\), [\d.]+ \w+ "
    r"\([\d.]+ \w+ free\)|"
    r"127\.0\.0\.1:\d+ (refused|dropped): .*|"
    r"stopped \(SIGTERM\))$")


def test_log_lines_are_whole(secret):
    """Many clients connecting and leaving at once: every line of the server's log is one
    whole line (no line cut into by another)."""
    s = start(secret, max_clients=64, max_per_host=64)
    errors = []

    def churn():
        try:
            for _ in range(6):
                c = client(s, secret, timeout=20)
                c.request({"op": "alloc", "size": PAGE, "access": "rw"})
                c.close()
        except Exception as e:          # reported below
            errors.append(e)
    threads = [threading.Thread(target=churn) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert s.stop() == 0
    text = s.log.text()
    assert not errors, errors[:3]
    lines = text.splitlines()
    assert len(lines) >= 2 * 24 * 6, len(lines)
    bad = [ln for ln in lines if not LINE.match(ln)]
    assert not bad, bad[:5]


@pytest.mark.parametrize("var,value,says", [
    ("MAX_CLIENTS", "0", "POOLTENSOR_SERVE_MAX_CLIENTS must be 1..256"),
    ("MAX_CLIENTS", "2.5", "POOLTENSOR_SERVE_MAX_CLIENTS='2.5' is not a whole number"),
    ("MAX_PENDING", "-1", "POOLTENSOR_SERVE_MAX_PENDING must be >= 1"),
    ("HANDSHAKE_TIMEOUT", "nan", "POOLTENSOR_SERVE_HANDSHAKE_TIMEOUT must be a positive"),
    ("HANDSHAKE_TIMEOUT", "soon", "POOLTENSOR_SERVE_HANDSHAKE_TIMEOUT='soon' is not a number"),
])
def test_bad_limits_are_refused_at_start(secret, var, value, says):
    import subprocess
    import sys
    from servers import env
    p = subprocess.run([sys.executable, "-m", "pooltensor", "serve", "--memory", "1MiB",
                        "--listen", "127.0.0.1:0", "--secret-file", secret],
                       env=env({f"POOLTENSOR_SERVE_{var}": value}), capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 1 and says in p.stderr, p.stderr
