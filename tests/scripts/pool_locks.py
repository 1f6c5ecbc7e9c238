"""Pool locks across real ranks (tests/test_pool_locks.py).

    pool_locks.py count N     every rank adds 1 to a shared counter array N times with
                              pool.update (read-modify-write under the array's lock); then a
                              holder that keeps beating is not robbed, a waiter times out,
                              and a partition's limit refuses on every rank alike
    pool_locks.py kill        rank 1 takes a lock and is SIGKILLed holding it; the others
                              take it once its lease runs out

Prints ``rank R ...`` lines the test reads; survivors of `kill` leave with os._exit (a dead
rank cannot join a collective finalize).
"""
import os
import signal
import sys
import time

import numpy as np

import collectives
import pooltensor as pt
from collectives.errors import Timeout
from pooltensor.pool import locks


def wait_holder(pool, name, rank, timeout=20.0):
    """Until lock `name` is held by `rank` (read from the lock words themselves)."""
    off = locks.slot_of(name) + locks.HOLDER
    deadline = time.monotonic() + timeout
    while pool.locks.read(off) != rank + 1:
        if time.monotonic() > deadline:
            raise AssertionError(f"rank {rank} never held {name}")
        time.sleep(0.01)


def count(pool, n):
    me = pool.me
    c = pt.zeros(600, dtype=np.int64)        # several slabs on every member
    pt.sync()
    v0 = pool.version(c)
    for _ in range(n):
        pool.update(c, lambda a: a + 1, timeout=60)
    pt.sync()
    got = c.to_numpy()
    want = np.full(600, n * pool.size, np.int64)
    assert np.array_equal(got, want), (got[:8], want[:8])
    assert pool.version(c) > v0
    # compare_and_bump: exactly one rank wins from the same version
    pt.sync()
    v = pool.version(c)
    pt.sync()
    won = pool.compare_and_bump(c, v, timeout=30)
    pt.sync()
    wins = collectives.allgather(np.array([int(won)], np.int64), world=pool.world)
    assert int(wins.sum()) == 1, wins
    print(f"rank {me} won {int(won)} version {v} -> {pool.version(c)}", flush=True)
    # a holder that outlives its lease keeps the lock by beating; a waiter times out
    pt.sync()
    if me == 0:
        with pool.lock("hold", lease=0.4):
            time.sleep(1.5)
        print(f"rank {me} held past lease ok", flush=True)
    else:
        wait_holder(pool, "hold", 0)
        t0 = time.monotonic()
        try:
            with pool.lock("hold", timeout=0.3, lease=0.4):
                raise AssertionError("acquired a held lock")
        except Timeout as e:
            assert "held by rank 0" in str(e), e
            print(f"rank {me} timeout ok {time.monotonic() - t0:.2f}", flush=True)
        with pool.lock("hold", timeout=20, lease=0.4):
            pass
    pt.sync()
    st = pool.stats()["locks"]
    assert st["lease_lost"] == 0 and st["held"] == [], st
    # a partition in SPMD: every rank refuses the same creation, and the pool goes on
    with pool.partition("job", limit=64 << 10):
        a = pt.zeros(4096, dtype=np.int64)          # 32 KiB of the 64
        try:
            pt.zeros(8192, dtype=np.int64)
            raise AssertionError("over the partition's limit")
        except pt.PoolOutOfMemory as e:
            assert e.partition == "job", e
    pt.sync()
    assert pool.stats()["partitions"]["job"]["used"] == 32 << 10
    del a
    print(f"rank {me} count ok {st['acquired']}", flush=True)


def kill(pool):
    me = pool.me
    pt.sync()
    if me == 1:
        pool.lock("dead", lease=1.0).acquire()
        print("rank 1 holding", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    wait_holder(pool, "dead", 1)
    t0 = time.monotonic()
    with pool.lock("dead", timeout=20, lease=1.0):
        waited = time.monotonic() - t0
        time.sleep(0.1)
    st = pool.locks.stats()
    print(f"rank {me} took dead lock after {waited:.2f} s expired_taken "
          f"{st['expired_taken']}", flush=True)
    if me == 0:      # the lock words live here: stay until every ticket was served
        base = locks.slot_of("dead")
        deadline = time.monotonic() + 20
        while pool.locks.read(base + locks.SERVING) != pool.locks.read(base + locks.NEXT):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    sys.stdout.flush()
    os._exit(0)


def main():
    pool = pt.init(slab_size=1024, memory=1 << 20, cache_bytes=64 << 10)
    if sys.argv[1] == "count":
        count(pool, int(sys.argv[2]))
    else:
        kill(pool)


if __name__ == "__main__":
    main()
