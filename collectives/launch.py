"""Start N local ranks without MPI: ``python -m collectives.launch -n N script.py [args...]``.

Usage::

    python -m collectives.launch -n 4 [--timeout S] [--grace S] [--stopped S] [--env K=V ...]
                                 script.py [args]
    python -m collectives.launch -n 4 -m package.module [args]

Each rank runs ``sys.executable`` with ``POOLTENSOR_RANK``, ``POOLTENSOR_WORLD_SIZE``,
``POOLTENSOR_LOCAL_RANK``, ``POOLTENSOR_LOCAL_SIZE`` and ``POOLTENSOR_COORDINATOR`` set, so that
``bootstrap()`` finds the world through rank 0's TCPStore.

What it promises, and why:

* Every output line is prefixed with ``[rank] `` (stdout to stdout, stderr to stderr), so the
  interleaved output of many ranks can be read and grepped.
* One failing rank fails the job (as mpi4py's ``run.py`` aborts every rank): the others are
  given ``--grace`` seconds, then SIGTERM, then SIGKILL, because a rank waiting on a dead peer
  would otherwise sit out its whole timeout. The launcher exits with the first failing rank's
  code (128 + signal if it was killed), 124 on ``--timeout``, 128 + signal if it was itself
  interrupted or terminated.
* A rank stopped by a signal (SIGSTOP, SIGTSTP: state T) while no other rank is running can
  never finish, since nothing of the job is left to continue it: after ``--stopped`` seconds
  (default 10) the launcher says which rank, stops it (SIGTERM and SIGCONT, then SIGKILL) and
  exits with 128 + SIGSTOP. Without this, a job whose other ranks all exited 0 would wait
  forever. There is no default ``--timeout`` (a job may rightly run for days; mpiexec has
  none either): a rank that is stopped while the others still run is left to them, whose
  collectives time out on it (POOLTENSOR_TIMEOUT) and fail the job. A rank stopped by a
  debugger (tracing stop, state t) is never counted as stopped.
* Nothing is orphaned: each rank leads its own process group, so a signal reaches whatever the
  rank started too; on Linux each rank also dies if the launcher itself is killed.
* Unknown options are an error, not silently passed on or ignored.
"""
import argparse
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time

KILL_AFTER = 3.0  # seconds between SIGTERM and SIGKILL
POLL = 0.05  # seconds between checks on the ranks
STOPPED = 10.0  # default --stopped: seconds a stopped rank may wait with no other rank running
# Variables of an outer MPI launcher: a rank that inherited them would bootstrap through MPI.
MPI_VARS = ("PMI_", "OMPI_", "PMIX_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "HYDRA_")
_OPTS_WITH_VALUE = ("-n", "--np", "--timeout", "--grace", "--stopped", "--env")


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m collectives.launch",
        description="Run N local ranks of a Python script or module (no MPI needed).",
        usage="%(prog)s -n N [--timeout S] [--grace S] [--stopped S] [--env K=V ...] "
              "(script.py | -m module) [args ...]")
    p.add_argument("-n", "--np", dest="n", type=int, required=True, help="number of ranks")
    p.add_argument("--timeout", type=float, default=None,
                   help="stop every rank after this many seconds and fail with 124 (default: "
                        "no limit, as mpiexec; a stopped rank is caught by --stopped)")
    p.add_argument("--grace", type=float, default=0.0,
                   help="seconds the other ranks may keep running after one fails (default 0)")
    p.add_argument("--stopped", type=float, default=STOPPED, metavar="S",
                   help="a rank stopped by a signal (SIGSTOP, SIGTSTP) while no other rank "
                        "runs can never finish: after S seconds it is named, stopped, and the "
                        f"launcher fails with 128 + SIGSTOP (default {STOPPED:g})")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="set an environment variable in every rank (repeatable)")
    return p


def parse_args(argv):
    """Split ``argv`` into launcher options and the rank command, as python's own CLI does.

    Everything after the script name (or after ``-m module``) belongs to the rank, even if it
    looks like an option; everything before must be a launcher option, or it is an error.
    """
    parser = _parser()
    i, command = 0, None
    while i < len(argv):
        a = argv[i]
        if a in _OPTS_WITH_VALUE:
            i += 2
            continue
        if a == "-m" or (a.startswith("-m") and not a.startswith("--")):
            module = argv[i + 1] if a == "-m" and i + 1 < len(argv) else a[2:]
            if not module:
                parser.error("-m needs a module name")
            rest = argv[i + 2:] if a == "-m" else argv[i + 1:]
            command = ["-m", module] + rest
            break
        if a == "--":
            if i + 1 >= len(argv):
                parser.error("a script is needed after --")
            command = argv[i + 1:]
            break
        if not a.startswith("-") or a == "-":
            command = argv[i:]
            break
        i += 1  # an --opt=value or an unknown option: argparse judges it below
    args = parser.parse_args(argv[:i])
    if command is None:
        parser.error("a script or -m module to run is needed")
    if args.n < 1:
        parser.error(f"-n must be >= 1, not {args.n}")
    if args.timeout is not None and not args.timeout > 0:
        parser.error("--timeout must be > 0")
    if not args.grace >= 0:
        parser.error("--grace must be >= 0")
    if not args.stopped > 0:
        parser.error("--stopped must be > 0")
    for kv in args.env:
        if "=" not in kv or kv.startswith("="):
            parser.error(f"--env expects K=V, not {kv!r}")
    args.command = command
    return args


def free_port(host="127.0.0.1"):
    """A port nobody listens on right now, for rank 0's store (it binds with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _child_setup(parent):
    """In the child before exec: own process group, and (Linux) SIGKILL when the launcher dies."""
    os.setpgid(0, 0)
    if sys.platform.startswith("linux"):
        try:
            import ctypes
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except Exception:
            pass
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)


class _Relay(threading.Thread):
    """Copies one rank pipe to our stdout or stderr, prefixing each line with ``[rank] ``.

    Works on bytes so binary garbage passes through; reads at most 64 KiB at a time so a huge
    line without newline cannot exhaust memory; a missing final newline is added.
    """

    def __init__(self, rank, pipe, out, lock):
        super().__init__(name=f"relay-{rank}", daemon=True)
        self.prefix, self.pipe, self.out, self.lock = f"[{rank}] ".encode(), pipe, out, lock

    def run(self):
        at_start = True
        for chunk in iter(lambda: self.pipe.readline(65536), b""):
            with self.lock:
                self.out.write((self.prefix if at_start else b"") + chunk)
                self.out.flush()
            at_start = chunk.endswith(b"\n")
        if not at_start:
            with self.lock:
                self.out.write(b"\n")
                self.out.flush()
        self.pipe.close()


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _say(message):
    sys.stderr.write(f"[launch] {message}\n")
    sys.stderr.flush()


def _rank_env(args, rank, port):
    env = {k: v for k, v in os.environ.items() if not k.startswith(MPI_VARS)}
    env.update(PYTHONUNBUFFERED="1", POOLTENSOR_RANK=str(rank), POOLTENSOR_WORLD_SIZE=str(args.n),
               POOLTENSOR_LOCAL_RANK=str(rank), POOLTENSOR_LOCAL_SIZE=str(args.n),
               POOLTENSOR_COORDINATOR=f"127.0.0.1:{port}")
    env.update(kv.split("=", 1) for kv in args.env)
    return env


def run(args):
    """Start the ranks, relay their output, and stop them all as soon as one fails."""
    port = free_port()
    stopping = []  # the signal received by the launcher, if any

    def on_signal(signum, frame):
        stopping.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    procs, relays = [], []
    out = (getattr(sys.stdout, "buffer", sys.stdout), getattr(sys.stderr, "buffer", sys.stderr))
    locks = (threading.Lock(), threading.Lock())
    try:
        for rank in range(args.n):  # all children before any thread: preexec_fn wants no threads
            procs.append(subprocess.Popen(
                [sys.executable] + args.command, env=_rank_env(args, rank, port),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                preexec_fn=functools.partial(_child_setup, os.getpid())))
        for rank, p in enumerate(procs):
            relays += [_Relay(rank, p.stdout, out[0], locks[0]),
                       _Relay(rank, p.stderr, out[1], locks[1])]
        for r in relays:
            r.start()
        code = _supervise(args, procs, stopping)
    finally:
        for p in procs:
            if p.poll() is None:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        for r in relays:
            r.join(2.0)
        for s, h in old.items():
            signal.signal(s, h)
    return code


def _state(pid):
    """The process state letter of pid ('R', 'S', 'T' stopped, 't' traced...), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        pass
    if sys.platform.startswith("linux"):
        return None
    try:   # no /proc (macOS): ps says it
        out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        return out[:1] or None
    except (OSError, subprocess.SubprocessError):
        return None


def _supervise(args, procs, stopping):
    """Poll the ranks until all exit, or until one fails / a signal / the timeout / a rank
    stopped for good stops them."""
    start = time.monotonic()
    failed = stop_at = reason = None
    timed_out = False
    stopped_since, next_look = None, 0.0   # since when only stopped ranks are left
    look_every = POLL if os.path.exists("/proc/self/stat") else 1.0
    while True:
        codes = [p.poll() for p in procs]
        if failed is None:
            for rank, c in enumerate(codes):
                if c:  # first failure decides the exit code
                    failed = c if c > 0 else 128 - c
                    how = f"exited with code {c}" if c > 0 else f"was killed by signal {-c}"
                    reason, stop_at = f"rank {rank} {how}", time.monotonic() + args.grace
                    break
        if all(c is not None for c in codes):
            break
        now = time.monotonic()
        if stop_at is None and not stopping and now >= next_look:
            # only stopped ranks left: nothing of the job can continue them
            next_look = now + look_every
            left = [r for r, c in enumerate(codes) if c is None]
            if all(_state(procs[r].pid) == "T" for r in left):
                stopped_since = stopped_since or now
                if now - stopped_since >= args.stopped:
                    names = ", ".join(map(str, left))
                    reason = (f"rank {names} stopped by a signal (SIGSTOP or SIGTSTP) for "
                              f"{args.stopped:g} s with no other rank running (--stopped)")
                    failed, stop_at = 128 + signal.SIGSTOP, now
            else:
                stopped_since = None
        if stopping and (stop_at is None or stop_at > now):
            reason = reason or f"received {signal.Signals(stopping[0]).name}"
            stop_at = now
        elif stop_at is None and args.timeout is not None and now - start > args.timeout:
            timed_out, stop_at = True, now
            reason = f"timeout: ranks still running after {args.timeout:g} s"
        if stop_at is not None and now >= stop_at:
            left = [p for p in procs if p.poll() is None]
            _say(f"{reason}; stopping {len(left)} rank(s)")
            _stop(left, signal.SIGINT if stopping[:1] == [signal.SIGINT] else signal.SIGTERM)
            break
        time.sleep(POLL)
    if failed is not None:
        return failed
    if stopping:
        return 128 + stopping[0]
    return 124 if timed_out else 0


def _stop(procs, sig):
    """Signal each rank's group (and continue it, should it be stopped: else the signal waits),
    wait KILL_AFTER seconds, then SIGKILL what is left."""
    for p in procs:
        _signal_group(p, sig)
        _signal_group(p, signal.SIGCONT)
    deadline = time.monotonic() + KILL_AFTER
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(POLL)
    for p in procs:
        if p.poll() is None:
            _signal_group(p, signal.SIGKILL)
        p.wait()


def main(argv=None):
    """Entry point of ``python -m collectives.launch``; returns the exit code."""
    args = parse_args(sys.argv[1:] if argv is None else list(argv))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
