"""Test helpers for memory servers: start ``pooltensor serve`` as a real process (optionally in
a network namespace), follow its log, and run client scripts against it."""
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCRIPTS = HERE / "scripts"
_SERVING = re.compile(r"serving .* on (\S+):(\d+) \(data port (\d+)")


def env(extra=None):
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in e.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    e["PYTHONUNBUFFERED"] = "1"
    e.setdefault("POOLTENSOR_TIMEOUT", "20")
    for k in ("POOLTENSOR_SECRET_FILE", "POOLTENSOR_CONNECT", "POOLTENSOR_RANK",
              "POOLTENSOR_WORLD_SIZE", "POOLTENSOR_COORDINATOR"):
        e.pop(k, None)
    e.update(extra or {})
    return e


def make_secret(folder, name="secret", text=None):
    """A secret file (mode 0600) in `folder`; returns its path."""
    p = Path(folder) / name
    p.write_text(text if text is not None else os.urandom(24).hex() + "\n")
    p.chmod(0o600)
    return str(p)


class Lines:
    """The lines a process writes on one stream, collected by a thread, waited for by regex."""

    def __init__(self, stream):
        self.all = []
        self._q = queue.Queue()
        self._t = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._t.start()

    def _pump(self, stream):
        for line in stream:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait(self, pattern, timeout=30.0):
        """The first new line matching `pattern` (a regex), or AssertionError after timeout."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line matching {pattern!r} within {timeout} s; "
                                     f"lines so far:\n" + "\n".join(self.all))
            try:
                line = self._q.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"stream ended before a line matching {pattern!r}; "
                                     f"lines:\n" + "\n".join(self.all))
            self.all.append(line)
            m = rx.search(line)
            if m:
                return m

    def text(self):
        """Everything read so far, plus what is queued now."""
        while True:
            try:
                line = self._q.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.all.append(line)
        return "\n".join(self.all)


def _popen(cmd, ns, env_extra, **pipes):
    """Start cmd as a text-mode subprocess with the test environment, inside network
    namespace `ns` when given (`ip netns exec` execs it, so the child's pid is cmd's own)."""
    if ns is not None:
        cmd = ["ip", "netns", "exec", ns, *cmd]
    return subprocess.Popen(cmd, env=env(env_extra), text=True, **pipes)


class ServerProc:
    """``python -m pooltensor serve`` in a subprocess (in namespace `ns` when given)."""

    def __init__(self, memory, secret_file, host="127.0.0.1", port=0, ns=None, extra=(),
                 env_extra=None):
        cmd = [sys.executable, "-m", "pooltensor", "serve", "--memory", str(memory),
               "--listen", f"{host}:{port}", *extra]
        if secret_file is not None:
            cmd += ["--secret-file", secret_file]
        self.proc = _popen(cmd, ns, env_extra, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.log = Lines(self.proc.stderr)
        self.host = host
        self.port = self.data_port = None

    def ready(self, timeout=30.0):
        m = self.log.wait(r"serving .* on", timeout)
        m = _SERVING.search(m.string)
        self.port, self.data_port = int(m.group(2)), int(m.group(3))
        return self

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    @property
    def pid(self):
        """The server's own pid (`ip netns exec` execs it, so it is the child's pid)."""
        return self.proc.pid

    def signal(self, sig):
        self.proc.send_signal(sig)

    def wait(self, timeout=20.0):
        return self.proc.wait(timeout)

    def pause(self):
        """SIGSTOP, returned once every thread of the server has stopped (the signal alone
        lets a thread that was running finish what it was doing)."""
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            states = []
            for tid in os.listdir(f"/proc/{self.pid}/task"):
                try:
                    with open(f"/proc/{self.pid}/task/{tid}/stat") as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
                except OSError:
                    pass
            if states and all(s in "tT" for s in states):
                return
            time.sleep(0.005)
        raise AssertionError("the server did not stop")

    def rss_shmem(self):
        """Bytes of shared memory (its memfd segments) the server has resident now."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("RssShmem:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


class ClientProc:
    """tests/scripts/<script> as a plain script (in namespace `ns` when given), with a pipe to
    its stdin for step-by-step scenarios and its output followed line by line."""

    def __init__(self, script, *args, ns=None, env_extra=None):
        cmd = [sys.executable, str(SCRIPTS / script), *map(str, args)]
        self.proc = _popen(cmd, ns, env_extra, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.out = Lines(self.proc.stdout)

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout=60.0):
        """Wait for the exit; returns (status, all output)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"client did not finish within {timeout} s:\n"
                                 + self.out.text())
        self.out._t.join(5)
        return self.proc.returncode, self.out.text()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


# -- client scenarios, run on loopback (test_serve.py) and across namespaces (test_netns.py) --
MiB = 1 << 20


def scenario_basic(servers, secret, ns=None):
    """A plain script on the servers: create, write, read back against numpy."""
    c = ClientProc("serve_client.py", "basic", secret, *[s.address for s in servers], ns=ns)
    rc, out = c.finish(120)
    assert rc == 0 and "serve client ok" in out, out
    for s in servers:
        s.log.wait("connected")
        s.log.wait(r"disconnected: closed the connection; freed 1 allocation")


def scenario_compute(servers, secret, ns=None):
    """Servers compute the work whose inputs they hold (numpy's results), the client the rest;
    map_blocks runs on the servers only when they were started with --allow-code. Returns
    the pids map_blocks ran in."""
    c = ClientProc("serve_client.py", "compute", secret, *[s.address for s in servers], ns=ns,
                   env_extra={"POOLTENSOR_MEMBER_WORK_MIN": "0"})
    rc, out = c.finish(120)
    assert rc == 0 and "serve client ok" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith("pids "))
    pids, me = line[5:].split(" me ")
    return {int(p) for p in pids.split()}, int(me)


def scenario_killed_client(servers, secret, ns=None):
    """A client SIGKILLed: its memory is freed on every server (resident pages too), and a
    second client's data is intact."""
    addrs = [s.address for s in servers]
    first = ClientProc("serve_client.py", "hold", secret, *addrs, ns=ns)
    second = ClientProc("serve_client.py", "hold", secret, *addrs, ns=ns)
    try:
        first.out.wait("ready", 90)
        second.out.wait("ready", 90)
        resident = servers[0].rss_shmem()
        assert resident >= 4 * MiB, resident     # both clients' arrays live in its memory
        first.kill()
        for s in servers:
            s.log.wait(r"disconnected: .*freed 1 allocation\(s\), 24.0 MiB", 30)
        deadline = time.monotonic() + 10          # the kernel may account a moment late
        while servers[0].rss_shmem() > resident - 3 * MiB and time.monotonic() < deadline:
            time.sleep(0.1)
        assert servers[0].rss_shmem() <= resident - 3 * MiB, (resident, servers[0].rss_shmem())
        second.send("check")
        second.out.wait("intact", 60)
        second.send("quit")
        rc, out = second.finish(60)
        assert rc == 0 and "bye" in out, out
    finally:
        first.kill()
        second.kill()


def scenario_server_gone(servers, secret, how, ns=None):
    """The last server is killed (or stopped with SIGTERM: exit 0): the client's next read
    of its memory is PeerLost naming that server, not a hang."""
    c = ClientProc("serve_client.py", "lost", secret, *[s.address for s in servers], ns=ns)
    victim = servers[-1]
    try:
        c.out.wait("ready", 90)
        if how == "kill":
            victim.proc.kill()
            victim.wait(20)
        else:
            victim.signal(signal.SIGTERM)
            assert victim.wait(20) == 0, victim.log.text()
            assert "stopped (SIGTERM)" in victim.log.text()
        c.send("go")
        m = c.out.wait(r"peerlost rank (\d+) host (\S+)", 90)
        assert m.group(1) == str(len(servers)) and m.group(2) == victim.address, m.string
        rc, out = c.finish(30)
        assert rc == 0, out
    finally:
        c.kill()
