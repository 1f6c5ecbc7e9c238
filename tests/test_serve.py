"""Memory servers on loopback (always run): the `pooltensor serve` command, its secret
handling, the authenticated control channel and its accounting, hostile control frames, and
plain scripts whose pools live on two servers (data over the native tcp transport).
tests/test_netns.py runs the same client scenarios across network namespaces."""
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

import msgpack
import pytest

from servers import (_SERVING, Lines, ServerProc, env, make_secret, scenario_basic,
                     scenario_compute, scenario_killed_client, scenario_server_gone)

from collectives import control as ctl
from collectives import remote
from collectives.errors import BootstrapError

pytestmark = pytest.mark.timeout(120)
MiB = 1 << 20


def run_cli(*args, env_extra=None, timeout=30):
    return subprocess.run([sys.executable, "-m", "pooltensor", *args], env=env(env_extra),
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def secret(tmp_path):
    return make_secret(tmp_path)


@pytest.fixture
def server(secret):
    s = ServerProc("64MiB", secret).ready()
    yield s
    s.stop()


def control(server, secret_file):
    """A raw authenticated control connection (collectives.remote's own)."""
    return remote._Server(1, server.address, ctl.read_secret(secret_file), 10.0)


# -- the command ----------------------------------------------------------------------------

def test_cli_usage_errors(tmp_path, secret):
    p = run_cli()
    assert p.returncode == 2 and "serve" in p.stderr
    p = run_cli("serve", "--memory", "8XB", "--secret-file", secret)
    assert p.returncode == 2 and "--memory" in p.stderr and "not a size" in p.stderr
    p = run_cli("serve", "--memory", "1GiB", "--bogus")
    assert p.returncode == 2 and "unrecognized arguments: --bogus" in p.stderr
    p = run_cli("serve", "--secret-file", secret)
    assert p.returncode == 2 and "--memory" in p.stderr
    p = run_cli("serve", "--memory", "1GiB", "--listen", "nohostport", "--secret-file", secret)
    assert p.returncode == 1 and "--listen must be host:port" in p.stderr
    p = run_cli("serve", "--memory", "1GiB", "--data-port", "70000", "--secret-file", secret)
    assert p.returncode == 2 and "--data-port must be 0..65535" in p.stderr


def test_secret_files_are_checked(tmp_path):
    missing = str(tmp_path / "nope")
    p = run_cli("serve", "--memory", "1GiB", "--secret-file", missing)
    assert p.returncode == 1 and "secret file" in p.stderr and "No such file" in p.stderr
    short = make_secret(tmp_path, "short", "tooshort\n")
    p = run_cli("serve", "--memory", "1GiB", "--secret-file", short)
    assert p.returncode == 1 and "at least 16" in p.stderr
    open_ = make_secret(tmp_path, "open")
    os.chmod(open_, 0o644)
    p = run_cli("serve", "--memory", "1GiB", "--secret-file", open_)
    assert p.returncode == 1 and "chmod 600" in p.stderr
    # $POOLTENSOR_SECRET_FILE is used when --secret-file is not given
    p = run_cli("serve", "--memory", "1GiB", env_extra={"POOLTENSOR_SECRET_FILE": short})
    assert p.returncode == 1 and "at least 16" in p.stderr


def test_default_secret_is_made_private_and_found_by_clients(tmp_path):
    cfg = tmp_path / "cfg"
    s = ServerProc("16MiB", None, env_extra={"XDG_CONFIG_HOME": str(cfg)}).ready()
    try:
        path = cfg / "pooltensor" / "secret"
        assert path.exists() and (path.stat().st_mode & 0o777) == 0o600
        assert (path.parent.stat().st_mode & 0o777) == 0o700
        assert f"made a new secret at {path}" in s.log.text()
        assert len(ctl.read_secret(str(path))) >= 32
        old = os.environ.get("XDG_CONFIG_HOME")
        os.environ["XDG_CONFIG_HOME"] = str(cfg)
        try:
            assert remote.load_secret() == ctl.read_secret(str(path))
        finally:
            os.environ.pop("XDG_CONFIG_HOME") if old is None else \
                os.environ.__setitem__("XDG_CONFIG_HOME", old)
    finally:
        assert s.stop() == 0
    # a second start reuses the file (it does not overwrite it)
    before = path.read_bytes()
    s = ServerProc("16MiB", None, env_extra={"XDG_CONFIG_HOME": str(cfg)}).ready()
    assert s.stop() == 0 and path.read_bytes() == before
    assert "made a new secret" not in s.log.text()


def test_client_without_secret_gets_told_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("POOLTENSOR_SECRET_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(ValueError, match="no secret for the memory servers: pass secret_file="):
        remote.connect(["127.0.0.1:1"])


def test_nothing_listening_is_a_clear_error(secret):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    with pytest.raises(BootstrapError, match=rf"cannot reach memory server 127.0.0.1:{port}"):
        remote.connect([f"127.0.0.1:{port}"], secret_file=secret, timeout=5)


# -- the control channel ------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(secret, sig):
    s = ServerProc("16MiB", secret).ready()
    c = control(s, secret)
    c.request({"op": "alloc", "size": MiB, "access": "rw"})
    s.signal(sig)
    assert s.wait(20) == 0, s.log.text()
    assert f"stopped ({sig.name})" in s.log.text()
    assert "disconnected: server stopping" in s.log.text()
    c.close()


def _listening(pid):
    """The (address, port) pairs process `pid` listens on over tcp, from the tables of its
    own network namespace (/proc/PID/net/tcp and tcp6)."""
    out = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            if state != "0A":                                   # TCP_LISTEN
                continue
            addr, port = local.split(":")
            raw = bytes.fromhex(addr)
            # the kernel prints each 32-bit word of the address in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.add((socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6,
                                      raw), int(port, 16)))
    return out


def _port_free(port):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def test_binds_loopback_by_default(secret):
    """Without --listen the server binds 127.0.0.1:7000 (this machine only), and its data port
    is on loopback too. Run in a private network namespace (unshare -n, as root) so that port
    7000 is free whatever else runs here; without one, only when 7000 is free here."""
    cmd = [sys.executable, "-m", "pooltensor", "serve", "--memory", "1MiB", "--secret-file",
           secret]
    private = os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip")
    if private:
        cmd = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *cmd]
    elif not _port_free(7000):
        pytest.skip("port 7000 is taken on this machine and no private network namespace can "
                    "be made (unshare -n needs root)")
    p = subprocess.Popen(cmd, env=env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        log = Lines(p.stderr)
        m = _SERVING.search(log.wait(r"serving .* on", 30).string)
        assert m, log.all
        assert (m.group(1), m.group(2)) == ("127.0.0.1", "7000"), log.all
        bound = _listening(p.pid)            # sh exec'ed the server: p.pid is the server's
        data = int(m.group(3))
        assert {("127.0.0.1", 7000), ("127.0.0.1", data)} <= bound, bound
        assert all(addr == "127.0.0.1" for addr, _ in bound), \
            f"the server listens beyond loopback: {sorted(bound)}"
    finally:
        p.terminate()
        p.wait(10)


def test_wrong_secret_refused_server_stays_up(tmp_path, server, secret):
    other = make_secret(tmp_path, "other")
    with pytest.raises(ctl.AuthenticationError, match="refused this process: authentication"):
        control(server, other)
    server.log.wait("refused: authentication failed")
    c = control(server, secret)            # the right secret still works
    assert c.request({"op": "info"})["free"] == 64 * MiB
    c.close()


def test_a_server_that_does_not_know_the_secret_is_refused(secret):
    """The client checks the server's proof too: a fake server that answers the greeting
    without the secret is refused by the client."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    port = ls.getsockname()[1]
    import threading

    def fake():
        c, _ = ls.accept()
        ctl.send_frame(c, {"hello": ctl.HELLO, "version": ctl.VERSION, "nonce": b"n" * 32})
        ctl.recv_frame(c)
        ctl.send_frame(c, {"mac": b"x" * 32, "memory": 1 << 40, "free": 1 << 40,
                           "data_port": 1})
        time.sleep(1)
        c.close()
    t = threading.Thread(target=fake, daemon=True)
    t.start()
    with pytest.raises(ctl.AuthenticationError, match="failed to prove it knows the secret"):
        remote.connect([f"127.0.0.1:{port}"], secret_file=secret, timeout=5)
    t.join(5)
    ls.close()


def test_accounting_refusal_names_free_bytes_and_disconnect_frees(server, secret):
    a = control(server, secret)
    b = control(server, secret)
    server.log.wait("connected")
    ra = a.request({"op": "alloc", "size": 40 * MiB, "access": "rw"})
    assert ra["size"] == 40 * MiB and ra["data_port"] == server.data_port
    assert a.request({"op": "register", "id": ra["id"], "access": "r"})["key"] != ra["key"]
    with pytest.raises(remote.ServerRefused, match=rf"{24 * MiB} bytes free"):
        b.request({"op": "alloc", "size": 32 * MiB, "access": "rw"})
    rb = b.request({"op": "alloc", "size": 20 * MiB, "access": "r"})
    # allocations are per connection: b cannot name a's
    with pytest.raises(remote.ServerRefused, match="no allocation"):
        b.request({"op": "free", "id": ra["id"] + 100})
    assert b.request({"op": "info"})["free"] == 4 * MiB
    a.close()                                      # a's memory goes with its connection
    server.log.wait(r"disconnected: closed the connection; freed 1 allocation\(s\), 40.0 MiB")
    assert b.request({"op": "info"})["free"] == 44 * MiB
    assert b.request({"op": "free", "id": rb["id"]})["free"] == 64 * MiB
    b.close()


def test_client_killed_frees_its_memory(server, secret):
    code = ("import sys; sys.path.insert(0, %r); from collectives import remote, control as c;"
            "s = remote._Server(1, %r, c.read_secret(%r), 10);"
            "s.request({'op': 'alloc', 'size': 48 << 20, 'access': 'rw'});"
            "print('held', flush=True); import time; time.sleep(60)"
            % (str(os.path.dirname(os.path.dirname(ctl.__file__))), server.address, secret))
    p = subprocess.Popen([sys.executable, "-c", code], env=env(), stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        c = control(server, secret)
        assert c.request({"op": "info"})["free"] == 16 * MiB
        p.kill()
        p.wait(10)
        server.log.wait(r"freed 1 allocation\(s\), 48.0 MiB")
        assert c.request({"op": "info"})["free"] == 64 * MiB
        c.close()
    finally:
        p.kill()
        p.wait(10)


def _raw(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    hello = ctl.recv_frame(s)
    assert hello["hello"] == ctl.HELLO
    return s, hello


def _closed(s, timeout=10.0):
    """True once the server closed this connection."""
    s.settimeout(timeout)
    try:
        while True:
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    finally:
        s.close()


def _authed(server, secret):
    c = control(server, secret)
    return c.sock


def _frame(body):
    return struct.pack("<I", len(body)) + body


HOSTILE_BEFORE_AUTH = [
    struct.pack("<I", 0xFFFFFFFF),                         # a huge length
    struct.pack("<I", ctl.MAX_FRAME + 1) + b"x" * 100,
    _frame(b"\xc1\xc1\xc1\xc1\xc1"),                        # not msgpack
    _frame(msgpack.packb([1, 2])),                         # a list, not a map
    _frame(b"\x81\xa1"),                                    # a map cut short
    _frame(msgpack.packb({1: 2})),                         # a key that is not a string
    _frame(msgpack.packb({"op": "alloc", "size": 1, "access": "rw"})),   # before the proof
    _frame(msgpack.packb({"nonce": b"x" * 31, "mac": b"y" * 32})),       # short nonce
    _frame(b"\x91" * 5000 + b"\x00"),                       # nesting too deep
    _frame(msgpack.packb({"a": 1}) + b"extra"),            # trailing bytes
    struct.pack("<I", 100) + b"x" * 10,                    # truncated, then closed below
]


def test_hostile_frames_close_that_connection_only(server, secret):
    keep = control(server, secret)
    r = keep.request({"op": "alloc", "size": MiB, "access": "rw"})
    for frame in HOSTILE_BEFORE_AUTH:
        s, _ = _raw(server)
        s.sendall(frame)
        if frame.startswith(struct.pack("<I", 100)):
            s.shutdown(socket.SHUT_WR)
        assert _closed(s), frame[:20]
    after_auth = [
        {"op": "nope"}, {"op": "alloc", "size": "big", "access": "rw"},
        {"op": "alloc", "size": 10, "access": "rwx"}, {"op": "alloc", "size": True,
                                                       "access": "r"},
        {"op": "register", "id": "1", "access": "r"}, {"op": "free"}, {"no": "op"},
        {"op": ["alloc"]},
    ]
    for msg in after_auth:
        s = _authed(server, secret)
        ctl.send_frame(s, msg)
        assert _closed(s), msg
    for raw in (struct.pack("<I", 1 << 30), struct.pack("<I", ctl.PLAN_FRAME + 1),
                struct.pack("<I", 2) + b"\x92\x01"):
        s = _authed(server, secret)
        s.sendall(raw)
        assert _closed(s), raw
    # value errors are answered, not punished
    with pytest.raises(remote.ServerRefused, match="size must be positive"):
        keep.request({"op": "alloc", "size": -5, "access": "rw"})
    with pytest.raises(remote.ServerRefused, match="bytes free"):
        keep.request({"op": "alloc", "size": 1 << 62, "access": "rw"})
    info = keep.request({"op": "info"})
    assert info["free"] == 63 * MiB and info["allocations"] == 1
    bad = len(HOSTILE_BEFORE_AUTH) + len(after_auth) + 3
    deadline = time.monotonic() + 10       # the last connections may still be closing
    while info["control"]["bad_frames"] < bad and time.monotonic() < deadline:
        time.sleep(0.05)
        info = keep.request({"op": "info"})
    assert info["control"]["bad_frames"] == bad, info
    assert info["control"]["auth_failures"] == 0, info
    assert keep.request({"op": "free", "id": r["id"]})["ok"]
    keep.close()
    assert server.proc.poll() is None


# -- plain scripts on servers (data over tcp) ------------------------------------------------

@pytest.fixture
def two(secret):
    a = ServerProc("64MiB", secret).ready()
    b = ServerProc("64MiB", secret).ready()
    yield a, b
    a.stop()
    b.stop()


def test_script_on_two_servers(two, secret):
    scenario_basic(two, secret)


def test_servers_compute_what_they_hold_and_run_no_code_unless_allowed(two, secret):
    pids, me = scenario_compute(two, secret)
    assert pids == {me}                       # no --allow-code: map_blocks ran in the client
    allowed = [ServerProc("64MiB", secret, extra=["--allow-code"]).ready() for _ in range(2)]
    try:
        pids, me = scenario_compute(allowed, secret)
        assert pids == {s.pid for s in allowed}, (pids, [s.pid for s in allowed])
    finally:
        for s in allowed:
            s.stop()


def test_server_refuses_code_and_names_outside_the_vocabulary(two, secret):
    import numpy as np
    import pooltensor as pt
    from pooltensor.ops import kernels
    from pooltensor.pool import work
    pt.finalize()
    pool = pt.init(connect=[s.address for s in two], secret_file=secret, slab_size=1 << 16)
    try:
        x = pt.zeros(1 << 16, dtype=np.float32)
        code = __import__("cloudpickle").dumps(lambda b: b)
        with pytest.raises(work.MemberError, match="runs no code from clients"):
            work.Round(pool, [1], ("run", kernels.Func(None), [x], [x], False, False),
                       code).wait()
        with pytest.raises(work.MemberError, match="may not name"):
            work.Round(pool, [2], ("run", os.system, [x], [], False, False)).wait()
        np.testing.assert_array_equal((x + 1).to_numpy(), np.ones(1 << 16, np.float32))
    finally:
        pt.finalize()


def test_killed_client_frees_memory_and_other_client_is_intact(two, secret):
    scenario_killed_client(two, secret)


@pytest.mark.parametrize("how", ["kill", "term"])
def test_server_gone_is_peer_lost_naming_it(two, secret, how):
    scenario_server_gone(two, secret, how)


def test_grants_default_to_everything_free_and_the_next_client_is_told(server, secret):
    """memory=None asks each server for all it has free; a pool takes it at once, so the next
    client learns there is nothing left (the server's page-rounded budget is all usable)."""
    from pooltensor.pool import Pool
    first = remote.connect([server.address], secret_file=secret, timeout=10)
    assert first.grants == [0, 64 * MiB]
    pool = Pool(first, role="client", memory=0, slab_size=MiB, cache_bytes=4 * MiB)
    try:
        assert pool.capacity == [0, 64 * MiB] and pool.nslabs == [0, 64]
        with pytest.raises(remote.ServerRefused, match="has 0 bytes free; none left"):
            remote.connect([server.address], secret_file=secret, timeout=10)
        with pytest.raises(remote.ServerRefused, match="has 0 bytes free; asked for 1048576"):
            remote.connect([server.address], secret_file=secret, timeout=10, memory=MiB)
    finally:
        pool.close()
    server.log.wait(r"freed 1 allocation\(s\), 64.0 MiB")
    second = remote.connect([server.address], secret_file=secret, timeout=10, memory=MiB)
    assert second.grants == [0, MiB]
    second.close()


def test_connect_argument_errors(secret):
    import pooltensor as pt
    with pytest.raises(ValueError, match="exclude each other"):
        pt.init(connect=["127.0.0.1:1"], members=2)
    with pytest.raises(ValueError, match="names a server twice"):
        remote.connect(["127.0.0.1:7000", "127.0.0.1:7000"], secret_file=secret)
    with pytest.raises(BootstrapError, match="server address must be host:port"):
        remote.connect(["localhost"], secret_file=secret)
    with pytest.raises(ValueError, match="names no memory server"):
        remote.connect("", secret_file=secret)


def test_environment_names_the_servers(server, secret):
    """POOLTENSOR_CONNECT + POOLTENSOR_SECRET_FILE: an unchanged script's pt.init() connects."""
    code = ("import numpy as np, pooltensor as pt\n"
            "p = pt.init()\n"
            "assert p.role == 'client' and p.world.hosts[1] == %r, p.world.hosts\n"
            "x = pt.arange(100000)\n"
            "assert (x[::-7].to_numpy() == np.arange(100000)[::-7]).all()\n"
            "print('env client ok', pt.stats()['members'][1]['transport'])\n" % server.address)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=env({"POOLTENSOR_CONNECT": server.address,
                                "POOLTENSOR_SECRET_FILE": secret}))
    assert p.returncode == 0 and "env client ok tcp" in p.stdout, p.stdout + p.stderr


def test_init_again_on_servers_must_name_the_same_servers(server, secret):
    import pooltensor as pt
    pt.finalize()
    pool = pt.init(connect=[server.address], secret_file=secret, memory=4 * MiB,
                   slab_size=64 << 10, cache_bytes=1 << 20)
    try:
        assert pt.init() is pool and pt.init(connect=server.address) is pool
        with pytest.raises(ValueError, match=r"already initialized with connect=\['127"):
            pt.init(connect=["127.0.0.1:1"])
        with pytest.raises(ValueError, match=r"members=2 \(this process and 1 memory server"):
            pt.init(members=3)
        with pytest.raises(ValueError, match=r"already initialized with memory=4194304"):
            pt.init(memory=8 * MiB)
    finally:
        pt.finalize()
