"""POOLTENSOR_* numbers and switches: an empty value counts as unset (a launcher's
`-env NAME ""` once made every rank of a job fail on import with a bare int() error), a wrong
number is named."""
import os
import subprocess
import sys

import pytest

from collectives import env


def test_unset_and_empty_give_the_default(monkeypatch):
    monkeypatch.delenv("POOLTENSOR_TEST_NUMBER", raising=False)
    assert env.number("POOLTENSOR_TEST_NUMBER", 7) == 7
    for blank in ("", "  "):
        monkeypatch.setenv("POOLTENSOR_TEST_NUMBER", blank)
        assert env.number("POOLTENSOR_TEST_NUMBER", 7) == 7
    monkeypatch.setenv("POOLTENSOR_TEST_NUMBER", " 12 ")
    assert env.number("POOLTENSOR_TEST_NUMBER", 7) == 12
    monkeypatch.setenv("POOLTENSOR_TEST_NUMBER", "2.5")
    assert env.number("POOLTENSOR_TEST_NUMBER", 1.0, float) == 2.5


@pytest.mark.parametrize("raw,kind", [("1M", int), ("2.5", int), ("soon", float)])
def test_a_wrong_value_is_named(monkeypatch, raw, kind):
    monkeypatch.setenv("POOLTENSOR_TEST_NUMBER", raw)
    with pytest.raises(ValueError, match=f"POOLTENSOR_TEST_NUMBER='{raw}'"):
        env.number("POOLTENSOR_TEST_NUMBER", 1, kind)


@pytest.mark.timeout(60)
def test_the_collectives_import_with_every_number_empty_and_name_a_wrong_one():
    names = ["POOLTENSOR_TIMEOUT", "POOLTENSOR_PROGRESS_THREADS", "POOLTENSOR_SLOT_BYTES",
             "POOLTENSOR_SLOTS", "POOLTENSOR_ONESHOT_MAX", "POOLTENSOR_CHANNEL_SLOTS",
             "POOLTENSOR_DIRECT_RANKS", "POOLTENSOR_DIRECT_MAX", "POOLTENSOR_RING_PIECES",
             "POOLTENSOR_CHANNEL_SLOT_BYTES", *env.NATIVE]
    code = ("import collectives.algorithms as a, collectives.algorithms.direct as d, "
            "collectives.algorithms.channel as c; print(d.DIRECT_MAX, c.NET_SLOT_BYTES)")
    base = {k: v for k, v in os.environ.items() if k not in names}
    p = subprocess.run([sys.executable, "-c", code], env={**base, **{n: "" for n in names}},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["1048576", "1048576"]
    p = subprocess.run([sys.executable, "-c", code],
                       env={**base, "POOLTENSOR_DIRECT_MAX": "1M"},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "POOLTENSOR_DIRECT_MAX='1M' is not an integer" in p.stderr
    # the native layer's own (atol would have read "4M" as 4, "fast" as 0)
    for name, raw, what in (("POOLTENSOR_TCP_SOCKBUF", "4M", "an integer"),
                            ("POOLTENSOR_SPIN_US", "fast", "a number")):
        p = subprocess.run([sys.executable, "-c", "import collectives"],
                           env={**base, name: raw}, capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and f"{name}='{raw}' is not {what}" in p.stderr, p.stderr


def test_the_pools_numbers_are_read_alike(monkeypatch):
    """The array layer's own numbers: empty is unset, a wrong one is named where it is used (it
    used to fall back to the default without a word)."""
    from pooltensor.cache import progress
    from pooltensor.pool import spawn, work
    for name, read, default in (("POOLTENSOR_PROGRESS_MIN", progress.threshold,
                                 progress.DEFAULT_MIN),
                                ("POOLTENSOR_MEMBER_WORK_MIN", work.work_min, work.WORK_MIN),
                                ("POOLTENSOR_PREPARE", spawn.prepare_bytes, spawn.PREPARE)):
        monkeypatch.setenv(name, "")
        assert read() == default
        monkeypatch.setenv(name, "4096")
        assert read() == 4096
        monkeypatch.setenv(name, "4k")
        with pytest.raises(ValueError, match=f"{name}='4k' is not an integer"):
            read()


@pytest.mark.timeout(60)
def test_a_wrong_prepare_is_named_before_members_start():
    code = ("import pooltensor as pt\n"
            "try:\n    pt.init(members=2)\nexcept ValueError as e:\n    print('ERR', e)\n"
            "pool = pt.init(members=1)\nprint('AFTER', pool.size)\n")
    environ = {**os.environ, "POOLTENSOR_PREPARE": "lots"}
    p = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "ERR environment variable POOLTENSOR_PREPARE='lots' is not an integer" in p.stdout
    assert "AFTER 1" in p.stdout, p.stdout


def test_an_empty_switch_is_unset(monkeypatch):
    """POOLTENSOR_ATTACH read empty as off; now as unset (on), as the numbers are read."""
    from pooltensor.pool import mapping
    for raw, on in (("", True), (" ", True), ("1", True), ("0", False)):
        monkeypatch.setenv("POOLTENSOR_ATTACH", raw)
        assert mapping.attach_default() is on, raw


@pytest.mark.timeout(60)
def test_an_empty_spin_is_the_default_not_zero():
    """The native layer read an empty POOLTENSOR_SPIN_US as 0 us (no polling at all). What
    spin() gives for the default depends on the machine's load right then (5 us while it is
    crowded), so the default only has to be above 0; 3 us is below that cap."""
    code = "from collectives import _native; print(_native.spin())"
    base = {k: v for k, v in os.environ.items() if k != "POOLTENSOR_SPIN_US"}
    got = [subprocess.run([sys.executable, "-c", code], env={**base, **extra},
                          capture_output=True, text=True, timeout=60).stdout.strip()
           for extra in ({}, {"POOLTENSOR_SPIN_US": ""}, {"POOLTENSOR_SPIN_US": "3"})]
    assert float(got[0]) > 0 and float(got[1]) > 0 and float(got[2]) == 3.0, got
