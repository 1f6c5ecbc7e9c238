"""The live side of the tcp protocol fuzzer: the target process (fuzz_server.py) with its
command pipe, and the legitimate client that keeps working while the fuzzer attacks."""
import json
import os
import random
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SERVER = HERE / "fuzz_server.py"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))       # the legitimate client is a native Context


class FuzzError(AssertionError):
    """A server behaviour that differs from the protocol (message says how to replay it)."""


# ---- the target process --------------------------------------------------------------------

class Target:
    """The fuzz server process and its command pipe."""

    def __init__(self, secret, seed, host="127.0.0.1", timeout=30.0, env_extra=None):
        env = dict(os.environ, **(env_extra or {}))
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get(
            "PYTHONPATH", "").split(os.pathsep) if p])
        self.errlog = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, str(SERVER), secret.hex(), str(seed),
                                      host], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errlog, text=True, env=env)
        self.host = host
        self.info = self._line(timeout)
        self.port, self.pid = self.info["port"], self.info["pid"]

    def _line(self, timeout):
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if r else ""
        if not line:
            raise FuzzError(f"the fuzz server did not answer within {timeout} s "
                            f"(exit {self.proc.poll()}):\n{self.stderr()}")
        return json.loads(line)

    def ask(self, cmd, timeout=30.0):
        self.check_alive()
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._line(timeout)

    def stderr(self):
        self.errlog.seek(0)
        return self.errlog.read()[-4000:]

    def check_alive(self):
        rc = self.proc.poll()
        if rc is not None:
            raise FuzzError(f"the server process {self.pid} died (exit {rc}):\n{self.stderr()}")

    def stop(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
                self.proc.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


# ---- the legitimate client -----------------------------------------------------------------

class Legit(threading.Thread):
    """A real client (native Context over tcp) that keeps writing and reading back its own
    registration and bumping a counter in it; any error or wrong byte stops it with the
    reason in .error. .frames counts the requests it made (each fits in one frame)."""

    def __init__(self, target, secret, region, seed, pace=0.001):
        super().__init__(daemon=True)
        from collectives import _native
        self.ctx = _native.Context(1, 2)
        self.ctx.set_secret(secret)
        self.ctx.set_timeout(30)
        self.ctx.connect_tcp(0, target.host, target.port)
        self.key, self.len = region.key, region.len
        self.rng = random.Random(seed)
        self.pace = pace
        self.stop_ev = threading.Event()
        self.error = None
        self.frames = 0
        self.mirror = bytearray(self.len)

    def run(self):
        try:
            self.ctx.get(0, self.key, 0, self.mirror)
            self.frames += 1
            count = int.from_bytes(self.mirror[:8], "little", signed=True)
            while not self.stop_ev.is_set():
                r = self.rng.random()
                if r < 0.3:
                    old = self.ctx.fetch_add(0, self.key, 0, 1)
                    self.frames += 1
                    if old != count:
                        raise AssertionError(f"counter read {old}, expected {count}")
                    count += 1
                    self.mirror[:8] = count.to_bytes(8, "little", signed=True)
                else:
                    n = self.rng.randint(1, 16384)
                    off = self.rng.randint(8, self.len - n)
                    data = self.rng.randbytes(n)
                    self.ctx.put(0, self.key, off, data)
                    self.mirror[off:off + n] = data
                    back = bytearray(n)
                    self.ctx.get(0, self.key, off, back)
                    self.frames += 2
                    if back != data:
                        raise AssertionError(f"read back {n} bytes at {off}: they differ")
                if self.pace:
                    time.sleep(self.pace)
            whole = bytearray(self.len)
            self.ctx.get(0, self.key, 0, whole)
            self.frames += 1
            if whole != self.mirror:
                raise AssertionError("the registration differs from what this client wrote")
        except BaseException as e:   # noqa: BLE001 (reported by the fuzzer)
            self.error = f"{type(e).__name__}: {e}"

    def finish(self, timeout=30.0):
        self.stop_ev.set()
        self.join(timeout)
        if self.is_alive():
            self.error = self.error or f"did not stop within {timeout} s"
        self.ctx.close()
