"""Protocol fuzzer for the native tcp transport's server.

A live target process (tests/scripts/fuzz_server.py: a native Context serving registrations of
known content behind canaries) is hit with hostile traffic while a legitimate client keeps
reading and writing its own registration. Every answer is checked against a model of the
protocol (tests/scripts/fuzz_wire.py), and at checkpoints: the target still runs (same pid),
its counters (tcp_stats) match what was sent, the registrations hold exactly the bytes the
model predicts, the canaries around them are untouched, and the legitimate client's data is
intact.

Cases (drawn from a seeded generator; case i is the same for a given seed on every run):
  batch   many frames on one authenticated connection: well-formed requests and requests with
          hostile fields (wrong, stale or foreign keys, offsets near 2^64, huge lengths, ops out
          of range, writes into read-only memory, misaligned atomics, bad PUT_INDEXED sets),
          possibly ending in a malformed, truncated or BYE frame that must close it
  preauth random bytes, requests before the handshake, malformed AUTH frames, wrong secrets,
          replayed handshakes, tampered ranks, connections closed early
  rst     a frame cut short and the connection reset
  slow    frames delivered a few bytes at a time
  crowd   many connections open at once, each doing something different
  stall   (once per run) connections that stop mid-frame must be dropped after the server's
          I/O timeout; an idle authenticated one must not be

Long runs: ``python tests/fuzz_tcp.py --cases 1000000 --seed N`` (see --help); the test suite
(tests/test_fuzz_tcp.py) runs the same engine with POOLTENSOR_FUZZ_CASES / POOLTENSOR_FUZZ_SEED.
A failure names its seed and case index; ``--seed N --first I --cases 1`` replays that case.

Against an AddressSanitizer build of the server (catches out-of-bounds accesses that do not
crash), with the tree's own build untouched:

    mkdir -p /tmp/asan/root && cp -r native setup.py pyproject.toml /tmp/asan/
    mkdir -p /tmp/asan/collectives && cp collectives/__init__.py /tmp/asan/collectives/
    (cd /tmp/asan && CFLAGS="-fsanitize=address -g -O1" LDFLAGS=-fsanitize=address \
        python setup.py -q build_ext --inplace)
    cp -r collectives /tmp/asan/root/ && cp /tmp/asan/collectives/_native*.so /tmp/asan/root/collectives/
    python tests/fuzz_tcp.py --cases 300000 --server-root /tmp/asan/root \
        --server-preload $(gcc -print-file-name=libasan.so)
"""
import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from fuzz_cases import Fuzzer, FuzzError  # noqa: E402,F401


# ---- command line --------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=10000, help="cases to run (default 10000)")
    ap.add_argument("--seed", type=int, default=None, help="seed (default: random, printed)")
    ap.add_argument("--first", type=int, default=0, help="index of the first case (to replay "
                    "a failure: --first I --cases 1)")
    ap.add_argument("--checkpoint", type=int, default=2000,
                    help="cases between full checks of counters and memory (default 2000)")
    ap.add_argument("--no-legit", action="store_true", help="no legitimate client")
    ap.add_argument("--no-stall", action="store_true", help="skip the 10-second stall cases")
    ap.add_argument("--server-root", metavar="DIR", help="the server imports collectives "
                    "from DIR (e.g. a build with -fsanitize=address)")
    ap.add_argument("--server-preload", metavar="LIB", help="LD_PRELOAD for the server only "
                    "(e.g. $(gcc -print-file-name=libasan.so)); sanitizers then abort on the "
                    "first error, which the fuzzer reports with the server's stderr")
    ap.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    a = ap.parse_args(argv)
    server_env = {}
    if a.server_root:
        server_env["POOLTENSOR_FUZZ_ROOT"] = a.server_root
    if a.server_preload:
        server_env["LD_PRELOAD"] = a.server_preload
        server_env.setdefault("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1")
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    print(f"fuzz_tcp: seed {seed}, cases {a.first}..{a.first + a.cases - 1}", flush=True)
    fz = Fuzzer(seed, legit=not a.no_legit, stalls=not a.no_stall, server_env=server_env,
                log=(lambda s: print(s, file=sys.stderr, flush=True)) if a.verbose else None)
    try:
        summary = fz.run(a.cases, first=a.first, checkpoint_every=a.checkpoint)
    except FuzzError as e:
        print(f"FAILED (seed {seed}): {e}", flush=True)
        return 1
    finally:
        fz.close()
    print(json.dumps(summary, indent=1), flush=True)
    print("fuzz_tcp: ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
