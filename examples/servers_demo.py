"""Memory servers: a plain script whose arrays live in other processes' memory, reached over tcp.

    python examples/servers_demo.py          (what `make demo` runs after the quickstart)

Two `pooltensor serve` processes are started on loopback (on real machines: one per machine,
`--listen 0.0.0.0:7000`), sharing a secret file with this script. The script connects with
`pooltensor.init(connect=[...])`: it lends no memory itself; every slab of its arrays lives on
a server, is written there with one-sided puts and faulted back through the slab cache with
the prefetcher ahead. The servers' Python takes no part in any transfer: their native threads
serve them, after both ends proved they hold the secret.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

import pooltensor as pt

MiB = 1 << 20
here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
env = dict(os.environ, PYTHONPATH=os.pathsep.join(
    p for p in (here, os.environ.get("PYTHONPATH", "")) if p))


def start_server(secret, memory="256MiB"):
    """A `pooltensor serve` process on a free loopback port; returns (process, "host:port")."""
    p = subprocess.Popen([sys.executable, "-m", "pooltensor", "serve", "--memory", memory,
                          "--listen", "127.0.0.1:0", "--secret-file", secret],
                         stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = p.stderr.readline()
        print("  " + line.rstrip())
        m = re.search(r"serving .* on (\S+):(\d+)", line)
        if m:
            return p, f"{m.group(1)}:{m.group(2)}"
        if not line and p.poll() is not None:
            break
    p.kill()
    raise SystemExit("a memory server did not start")


with tempfile.TemporaryDirectory() as tmp:
    secret = os.path.join(tmp, "secret")
    with open(secret, "w") as f:
        f.write(os.urandom(24).hex())
    os.chmod(secret, 0o600)
    servers = [start_server(secret) for _ in range(2)]
    try:
        pool = pt.init(connect=[addr for _, addr in servers], secret_file=secret,
                       cache_bytes=16 * MiB)
        print(f"\n{pool}: transports {pool.world.transports} (member 0 is this script)")
        t = time.perf_counter()
        x = pt.random.standard_normal(16 * MiB, seed=7, dtype=np.float32)   # 64 MiB, 4x cache
        t_fill = time.perf_counter() - t
        print(f"x: {x.nbytes // MiB} MiB on servers {sorted(x.where())}, written in "
              f"{t_fill:.2f} s")
        t = time.perf_counter()
        total = x.sum(dtype=np.float64)
        y = x * 2 + 1
        mx = y.max()
        t_ops = time.perf_counter() - t
        ref = np.random.default_rng([7, 0]).standard_normal(1 << 16, dtype=np.float32)
        assert np.array_equal(x[: 1 << 16].to_numpy(), ref)      # same numbers, any pool
        st = pool.stats()
        print(f"x.sum() = {total:.3f}, (x * 2 + 1).max() = {mx:.3f} in {t_ops:.2f} s; cache hit "
              f"rate {st['cache']['hit_rate']:.1%}")
        pt.finalize()                       # the servers free this script's memory
    finally:
        for p, _ in servers:
            p.send_signal(signal.SIGTERM)
        for p, _ in servers:
            rest = p.communicate(timeout=30)[1]
            for line in rest.splitlines():
                print("  " + line)
print("done")
