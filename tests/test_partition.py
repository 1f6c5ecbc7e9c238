"""Partitions made for real: nft (or iptables) rules drop every packet between two network
namespaces of the test's own (tests/netns.py Pair; never the shared ptns0..2), then are lifted.

Three workloads run across the partition (tests/scripts/fault_worker.py, every result checked
against a reference): one-sided gets and puts to a tcp target, allreduce between two ranks, a
pool on a memory server. Each partition ends one of two ways, and nothing else:
- shorter than the timeout: every operation succeeds once it heals (tcp retransmits, a dropped
  connection is dialed again);
- longer: the operations caught in it fail with a typed error (Timeout, PeerLost,
  ConnectionDropped) within the timeout (plus scheduling slack), and once it heals the world is
  usable again (``final ok``).
Never a wrong result, never a hang.
"""
import os
import random
import re
import subprocess
import sys
import time

import pytest

from conftest import SCRIPTS, rank_env
from netns import netns_pair  # noqa: F401  (the fixture)
from servers import Lines, ServerProc, env, make_secret

pytestmark = pytest.mark.timeout(240)

SECRET = b"partition-test-secret-0123456789"
TYPED = {"Timeout", "PeerLost", "ConnectionDropped"}
SLACK = 4.0          # seconds past the timeout an error may take on a loaded 2-core machine
TIMEOUT = 5.0        # POOLTENSOR_TIMEOUT of the workers
SHORT, LONG = 2.0, 7.0   # a partition under half the timeout, and one past it


class Worker:
    """fault_worker.py in a namespace, its lines followed."""

    def __init__(self, pair, k, *args, env_extra=None):
        self.proc = subprocess.Popen(
            pair.cmd(k, [sys.executable, str(SCRIPTS / "fault_worker.py"), *map(str, args)]),
            env=env(env_extra), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        self.lines = Lines(self.proc.stdout)

    def finish(self, timeout=90):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("worker hung:\n" + self.lines.text())
        time.sleep(0.2)
        return self.proc.returncode, self.lines.text()


def check(text, code, timeout, healed_all_ok):
    """The outcome rules above, on one worker's output."""
    assert code == 0, text
    assert not re.search(r"^corrupt", text, re.M), text
    assert "summary ok=" in text and " corrupt=0" in text, text
    assert "final ok" in text, text
    errs = re.findall(r"^op \d+ err (\w+) ([\d.]+)", text, re.M)
    for cls, secs in errs:
        assert cls in TYPED, text
        assert float(secs) <= timeout + SLACK, text
    oks = [float(s) for s in re.findall(r"^op \d+ ok ([\d.]+)", text, re.M)]
    assert oks and max(oks) <= timeout + SLACK, text
    if healed_all_ok:
        assert not errs, text
    print(f"[partition] ok={len(oks)} slowest ok={max(oks):.2f}s errors={len(errs)} "
          f"{sorted({c for c, _ in errs})} slowest error="
          f"{max((float(s) for _, s in errs), default=0):.2f}s")
    return len(oks), len(errs)


def run_for(seconds, timeout):
    """How long a worker runs (the cut comes 1 s in): a short partition heals at 3 s and 4 s of
    operations after it must all succeed; a long one heals at 8 s and 2 s more precede the
    final check (which retries for up to FAULT_WORKER_FINAL s)."""
    return 7 if seconds < timeout / 2 else 10


def partition(pair, after, seconds):
    time.sleep(after)
    pair.cut()
    try:
        time.sleep(seconds)
    finally:
        pair.heal()


@pytest.mark.parametrize("seconds", [SHORT, LONG])
def test_partition_during_one_sided_transfers(netns_pair, seconds):
    pair, timeout = netns_pair, TIMEOUT
    srv = subprocess.Popen(pair.cmd(1, [sys.executable, str(SCRIPTS / "tcp_server.py"),
                                        SECRET.hex(), str(8 << 20), "0", pair.addrs[1]]),
                           env=env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port, key = srv.stdout.readline().split()
        pair.throttle("200mbit")            # each 8 MiB get lasts ~0.3 s: cut mid-transfer
        w = Worker(pair, 0, "rma", SECRET.hex(), pair.addrs[1], port, key, 8, timeout,
                   run_for(seconds, timeout))
        w.lines.wait("^ready", 60)
        partition(pair, 1.0, seconds)
        code, text = w.finish()
        ok, err = check(text, code, timeout, healed_all_ok=seconds < timeout / 2)
        if seconds > timeout:
            assert err >= 1, text           # something was caught in it, and said so
    finally:
        srv.stdin.close()
        srv.wait(20)


@pytest.mark.parametrize("seconds,count", [(SHORT, 1 << 16), (LONG, 1 << 16), (LONG, 1 << 12)])
def test_partition_during_allreduce(netns_pair, seconds, count):
    """count float64: 512 KiB goes by the ring (direct collectives kept below it here), 32 KiB
    by the direct algorithm."""
    pair, timeout = netns_pair, TIMEOUT
    port = random.randrange(20000, 60000)
    ws = []
    for r in range(2):
        e = rank_env({"POOLTENSOR_RANK": str(r), "POOLTENSOR_WORLD_SIZE": "2",
                      "POOLTENSOR_COORDINATOR": f"{pair.addrs[0]}:{port}",
                      "POOLTENSOR_DIRECT_MAX": str(256 * 1024)})
        for v in ("POOLTENSOR_TRANSPORT", "POOLTENSOR_HOST", "POOLTENSOR_LISTEN"):
            e.pop(v, None)
        ws.append(Worker(pair, r, "allreduce", count, timeout, run_for(seconds, timeout),
                         env_extra=e))
    for w in ws:
        w.lines.wait("^ready", 60)
    partition(pair, 1.0, seconds)
    errs = 0
    try:
        for w in ws:
            code, text = w.finish()
            errs += check(text, code, timeout, healed_all_ok=seconds < timeout / 2)[1]
    finally:
        for w in ws:                        # a failed check leaves no worker running
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
    if seconds > timeout:
        assert errs >= 2                    # both ranks were caught in it, and said so


@pytest.mark.parametrize("seconds", [SHORT, LONG])
def test_partition_during_memory_server_reads(netns_pair, tmp_path, seconds):
    pair, timeout = netns_pair, TIMEOUT
    secret = make_secret(tmp_path)
    srv = ServerProc("64MiB", secret, host=pair.addrs[1], port=7000, ns=pair.names[1]).ready()
    try:
        w = Worker(pair, 0, "server", srv.address, 16, timeout, run_for(seconds, timeout),
                   env_extra={"POOLTENSOR_SECRET_FILE": secret})
        w.lines.wait("^ready", 60)
        partition(pair, 1.0, seconds)
        code, text = w.finish()
        ok, err = check(text, code, timeout, healed_all_ok=seconds < timeout / 2)
        if seconds > timeout:
            assert err >= 1, text
    finally:
        srv.stop()


def test_rules_are_lifted_and_namespaces_go(netns_pair):
    pair = netns_pair
    pair.cut()
    listed = subprocess.run(pair.cmd(0, ["nft", "list", "ruleset"]) if pair.nft else
                            pair.cmd(0, ["iptables", "-S"]), capture_output=True, text=True)
    assert pair.addrs[1] in listed.stdout
    pair.heal()
    listed = subprocess.run(pair.cmd(0, ["nft", "list", "ruleset"]) if pair.nft else
                            pair.cmd(0, ["iptables", "-S"]), capture_output=True, text=True)
    assert pair.addrs[1] not in listed.stdout
    names = pair.names
    pair.close()
    have = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(n in have for n in names)
    assert not os.path.exists(f"/run/netns/{names[0]}")
