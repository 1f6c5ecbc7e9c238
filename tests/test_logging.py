"""Logs: POOLTENSOR_LOG=debug shows, on the collectives and pooltensor loggers, each line
with its rank and host, the transport chosen for each peer, tcp listeners and connects, a
timed-out operation and the link events the native counters saw; without it the library
prints nothing; a level logging lacks is a clear error."""
import re

from conftest import run_ranks

TCP = {"POOLTENSOR_TRANSPORT": "tcp"}


def test_debug_shows_transports_connects_timeouts_and_link_events():
    p = run_ranks("launch", 2, "log_case.py", env={**TCP, "POOLTENSOR_LOG": "debug"})
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout + p.stderr
    line = r"\[%d\] \S+ \S+ collectives \[rank %d \S+\] DEBUG: "
    for r, other in ((0, 1), (1, 0)):
        assert re.search(line % (r, r) + r"joined a world of 2 \(env\); transports to each "
                         r"rank: .*%d:tcp" % other, out), out
        assert re.search(line % (r, r) + r"tcp listener at 127\.0\.0\.1:\d+", out)
        assert re.search(line % (r, r) + r"connecting to rank %d \(\S+\) over tcp at "
                         r"127\.0\.0\.1:\d+" % other, out)
    assert re.search(line % (0, 0) + r"get of rank 1 \(\S+\) at offset 0: timed out", out)
    assert re.search(line % (0, 0) + r"link to rank 1 \(\S+, tcp\): timeouts 0 -> 1; last "
                     r"error: timed out in get", out)


def test_nothing_is_printed_without_it_and_a_bad_level_is_named():
    p = run_ranks("launch", 2, "log_case.py", env=TCP)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [x for x in (p.stdout + p.stderr).splitlines() if not x.startswith("[launch]")]
    assert sorted(lines) == ["[0] ok", "[1] ok"]
    p = run_ranks("launch", 1, "log_case.py", env={"POOLTENSOR_LOG": "loud"})
    assert p.returncode != 0
    assert "POOLTENSOR_LOG='loud': use debug, info, warning or error" in p.stdout + p.stderr
