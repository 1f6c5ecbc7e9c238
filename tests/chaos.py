"""Chaos soak: mixed work across two hosts while faults are injected at random.

    python tests/chaos.py                 # a short run (about 40 s; what `make test` runs)
    python tests/chaos.py --minutes 10    # a long one
    python tests/chaos.py --seconds 90 --seed 7 --timeout 4

Two network namespaces of its own (tests/netns.py Pair: never the shared ptns0..2) stand in for
two hosts, a and b. On b: a memory server (``pooltensor serve``) and a bare tcp target. On a:
a pool client of the server (slices read, written, summed: fault_worker.py server), a
one-sided client of the target (gets and puts: fault_worker.py rma); across a and b: a world of
two ranks running allreduce (fault_worker.py allreduce). Every result is checked against a
reference by the workers (numpy; the target's bytes are a known pattern).

Faults, one at a time at random intervals: a partition (nft/iptables drop rules between a and
b, shorter or longer than the timeout, then lifted), a stop (SIGSTOP, then SIGCONT) of the
memory server or the target, a kill of the memory server (restarted on the same port: its
clients rejoin it, its arrays are lost and say so), a kill of one world rank (the survivor
must fail with a typed error; a new world is started).

Counted and checked at the end (exit status 1 when one fails):
- operations done, faults injected, typed errors by class;
- corruptions: results that differ from the reference — must be 0;
- hangs: a worker silent for longer than an operation may take (3 x timeout + slack), or an
  error of an unexpected type — must be 0;
- fds and RSS of the long-lived clients, sampled: the growth must stay bounded (fds <= 64,
  RSS <= 256 MiB over the first sample after warm-up).
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from netns import Pair, partition_unavailable  # noqa: E402
from servers import Lines, ServerProc, env, make_secret  # noqa: E402

SCRIPTS = HERE / "scripts"
SECRET = b"chaos-soak-secret-0123456789abcdef"
TYPED = {"Timeout", "PeerLost", "PeerRestarted", "ConnectionDropped", "CollectiveMismatch",
         "PooltensorError", "BootstrapError"}
SLACK = 6.0
OP = re.compile(r"^op \d+ (ok|err) ?(\w+)? ?([\d.]+)?")


class Worker:
    """One fault_worker.py process; its lines parsed as they come."""

    def __init__(self, name, argv, extra_env=None):
        self.name = name
        self.proc = subprocess.Popen(argv, env=env(extra_env), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines = Lines(self.proc.stdout)
        self.last = time.monotonic()
        self.seen = 0
        self.ops = self.corrupt = 0
        self.errors = {}
        self.untyped = []
        self.final = False

    def poll(self):
        """Read what came; returns the lines."""
        text = self.lines.text().splitlines()
        new = text[self.seen:]
        self.seen = len(text)
        if new:
            self.last = time.monotonic()
        for line in new:
            m = OP.match(line)
            if m:
                self.ops += 1
                if m.group(1) == "err":
                    cls = m.group(2)
                    self.errors[cls] = self.errors.get(cls, 0) + 1
                    if cls not in TYPED:
                        self.untyped.append(line)
            elif line.startswith("corrupt"):
                self.corrupt += 1
                self.untyped.append(line)
            elif line.startswith("final ok"):
                self.final = True
        return new

    def alive(self):
        return self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM):
        if self.alive():
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.poll()

    def sample(self):
        """(open fds, RSS bytes) of the process now, or None."""
        try:
            fds = len(os.listdir(f"/proc/{self.proc.pid}/fd"))
            with open(f"/proc/{self.proc.pid}/status") as f:
                rss = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmRSS:"))
            return fds, rss
        except (OSError, StopIteration):
            return None


class Soak:
    def __init__(self, seconds, timeout, seed, verbose):
        self.seconds, self.timeout, self.verbose = seconds, timeout, verbose
        self.rng = random.Random(seed)
        self.faults = {}
        self.hangs = []
        self.samples = {}
        self.done = []                     # finished workers (worlds replaced after a kill)
        self.tmp = tempfile.mkdtemp(prefix="pt-chaos-")
        self.secret = make_secret(self.tmp)
        self.envx = {"POOLTENSOR_TIMEOUT": str(timeout), "FAULT_WORKER_FINAL": "60",
                     "POOLTENSOR_SECRET_FILE": self.secret}

    def say(self, text):
        if self.verbose:
            print(f"[chaos {time.monotonic() - self.t0:6.1f}s] {text}", flush=True)

    def fault(self, kind):
        self.faults[kind] = self.faults.get(kind, 0) + 1

    # -- the processes ----------------------------------------------------------------------
    def start_server(self):
        self.server = ServerProc("64MiB", self.secret, host=self.pair.addrs[1], port=7000,
                                 ns=self.pair.names[1]).ready(60)

    def start_target(self):
        self.target = subprocess.Popen(
            self.pair.cmd(1, [sys.executable, str(SCRIPTS / "tcp_server.py"), SECRET.hex(),
                              str(8 << 20), "0", self.pair.addrs[1]]),
            env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.tport, self.tkey = self.target.stdout.readline().split()

    def worker(self, name, k, *args, extra=None):
        argv = self.pair.cmd(k, [sys.executable, str(SCRIPTS / "fault_worker.py"),
                                 *map(str, args)])
        return Worker(name, argv, {**self.envx, **(extra or {})})

    def left(self):
        return max(1.0, self.end - time.monotonic())

    def start_world(self):
        port = self.rng.randrange(20000, 60000)
        ws = []
        for r in range(2):
            e = {"POOLTENSOR_RANK": str(r), "POOLTENSOR_WORLD_SIZE": "2",
                 "POOLTENSOR_COORDINATOR": f"{self.pair.addrs[0]}:{port}"}
            ws.append(self.worker(f"world rank {r}", r, "allreduce", 4096, self.timeout,
                                  self.left(), extra=e))
        self.world = ws

    # -- faults -----------------------------------------------------------------------------
    def partition(self):
        d = self.rng.choice([0.5, 1.0, 2.0, self.timeout * 1.3])
        self.say(f"partition for {d:g} s")
        self.fault("partition")
        self.pair.cut()
        try:
            self.wait(d)
        finally:
            self.pair.heal()

    def stop_one(self):
        which = self.rng.choice(["server", "target"])
        pid = self.server.pid if which == "server" else self.target.pid
        d = self.rng.choice([0.3, 1.0, self.timeout * 0.8])
        self.say(f"SIGSTOP {which} for {d:g} s")
        self.fault(f"stop {which}")
        os.kill(pid, signal.SIGSTOP)
        try:
            self.wait(d)
        finally:
            os.kill(pid, signal.SIGCONT)

    def kill_server(self):
        self.say("SIGKILL the memory server, then restart it")
        self.fault("kill server")
        self.server.signal(signal.SIGKILL)
        self.server.wait(10)
        self.wait(self.rng.choice([0.2, 1.0]))
        self.start_server()

    def kill_rank(self):
        r = self.rng.randrange(2)
        self.say(f"SIGKILL world rank {r}; a new world")
        self.fault("kill rank")
        victim, other = self.world[r], self.world[1 - r]
        victim.proc.kill()
        victim.proc.wait()
        # the survivor must say so with a typed error, within an operation's time
        deadline = time.monotonic() + 2 * self.timeout + SLACK
        before = sum(other.errors.values())
        while time.monotonic() < deadline and sum(other.errors.values()) == before \
                and other.alive():
            other.poll()
            time.sleep(0.05)
        if sum(other.errors.values()) == before and other.alive():
            self.hangs.append(f"{other.name}: no error within {2 * self.timeout + SLACK:g} s "
                              f"after its peer was killed")
        other.stop()
        victim.poll()
        self.done += [victim, other]
        self.start_world()

    # -- watching -----------------------------------------------------------------------------
    def workers(self):
        return [self.pool, self.rma] + self.world

    def wait(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.check()
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))

    def check(self):
        now = time.monotonic()
        for w in self.workers():
            w.poll()
            if w.alive() and now - w.last > 3 * self.timeout + SLACK:
                self.hangs.append(f"{w.name}: silent for {now - w.last:.1f} s")
                w.last = now
        if now - getattr(self, "_sampled", 0) > 1.0:
            self._sampled = now
            for w in (self.pool, self.rma):
                s = w.sample()
                if s is not None:
                    self.samples.setdefault(w.name, []).append((now, *s))

    def run(self):
        self.t0 = time.monotonic()
        self.end = self.t0 + self.seconds
        self.pair = Pair()
        try:
            self.start_server()
            self.start_target()
            self.pool = self.worker("pool client", 0, "server", self.server.address, 8,
                                    self.timeout, self.seconds)
            self.rma = self.worker("one-sided client", 0, "rma", SECRET.hex(),
                                   self.pair.addrs[1], self.tport, self.tkey, 2, self.timeout,
                                   self.seconds)
            self.start_world()
            self.wait(3.0)
            faults = [self.partition, self.stop_one, self.kill_server, self.kill_rank]
            weights = [4, 3, 1, 1]
            while time.monotonic() < self.end - self.timeout:
                self.rng.choices(faults, weights)[0]()
                self.wait(self.rng.uniform(1.0, 3.0))
            self.say("faults over: waiting for every worker's final check")
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and any(w.alive() for w in self.workers()):
                self.wait(0.5)
            for w in self.workers():
                if w.alive():
                    self.hangs.append(f"{w.name}: still running 90 s after the end")
                w.stop()
                if not w.final:
                    self.hangs.append(f"{w.name}: no successful operation after the faults "
                                      f"(world not usable again)")
        finally:
            for w in getattr(self, "world", []) + [getattr(self, "pool", None),
                                                   getattr(self, "rma", None)]:
                if w is not None:
                    w.stop(signal.SIGKILL)
            if getattr(self, "server", None) is not None:
                self.server.stop()
            if getattr(self, "target", None) is not None and self.target.poll() is None:
                self.target.kill()
                self.target.wait()
            self.pair.close()
        return self.report()

    def report(self):
        everyone = self.workers() + self.done
        ops = sum(w.ops for w in everyone)
        errors = {}
        for w in everyone:
            for k, v in w.errors.items():
                errors[k] = errors.get(k, 0) + v
        corrupt = sum(w.corrupt for w in everyone)
        untyped = [f"{w.name}: {ln}" for w in everyone for ln in w.untyped
                   if not ln.startswith("corrupt")]
        bounded, ranges = True, []
        for name, ss in self.samples.items():
            warm = ss[min(3, len(ss) - 1)]
            fds = [s[1] for s in ss]
            rss = [s[2] for s in ss]
            grow_fd = max(fds) - warm[1]
            grow_rss = max(rss) - warm[2]
            ranges.append(f"{name}: fds {min(fds)}-{max(fds)}, RSS {min(rss) >> 20}-"
                          f"{max(rss) >> 20} MiB")
            bounded &= grow_fd <= 64 and grow_rss <= 256 << 20
        hangs = len(self.hangs) + len(untyped)
        ok = corrupt == 0 and hangs == 0 and bounded
        print(f"chaos: {self.seconds:.0f} s, operations={ops}, faults="
              f"{sum(self.faults.values())} {dict(sorted(self.faults.items()))}, typed errors="
              f"{sum(errors.values())} {dict(sorted(errors.items()))}, corruptions={corrupt}, "
              f"hangs={hangs}")
        print("chaos: " + "; ".join(ranges) + (" (bounded)" if bounded else " (GREW)"))
        for h in self.hangs + untyped:
            print(f"chaos: HANG/UNEXPECTED {h}")
        for i, w in enumerate(everyone):
            Path(self.tmp, f"{i}-{w.name.replace(' ', '-')}.log").write_text(w.lines.text())
        print(f"chaos: every worker's output is in {self.tmp}")
        for w in everyone:
            if w.untyped or not w.final and w in self.workers():
                tail = "\n    ".join(w.lines.text().splitlines()[-12:])
                print(f"chaos: last lines of {w.name}:\n    {tail}")
        print("chaos: ok" if ok else "chaos: FAILED", flush=True)
        return 0 if ok else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, help="run this long (a long soak)")
    ap.add_argument("--seconds", type=float, default=40.0,
                    help="run this long when --minutes is not given (default 40)")
    ap.add_argument("--timeout", type=float, default=4.0,
                    help="POOLTENSOR_TIMEOUT of every process (default 4)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: time)")
    ap.add_argument("--quiet", action="store_true", help="only the summary")
    a = ap.parse_args(argv)
    why = partition_unavailable()
    if why:
        print(f"chaos: cannot run here: {why}", file=sys.stderr)
        return 2
    seed = a.seed if a.seed is not None else int(time.time())
    seconds = a.minutes * 60 if a.minutes else a.seconds
    print(f"chaos: seed {seed}, {seconds:.0f} s, timeout {a.timeout:g} s", flush=True)
    return Soak(seconds, a.timeout, seed, not a.quiet).run()


if __name__ == "__main__":
    sys.exit(main())
