"""POOLTENSOR_* numbers: an empty value counts as unset (a launcher's `-env NAME ""` once made
every rank of a job fail on import with a bare int() error), a wrong one is named."""
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
             "POOLTENSOR_CHANNEL_SLOT_BYTES"]
    code = ("import collectives.algorithms as a, collectives.algorithms.direct as d, "
            "collectives.algorithms.channel as c; print(d.DIRECT_MAX, c.NET_SLOT_BYTES)")
    base = {k: v for k, v in __import__("os").environ.items() if k not in names}
    p = subprocess.run([sys.executable, "-c", code], env={**base, **{n: "" for n in names}},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["1048576", "1048576"]
    p = subprocess.run([sys.executable, "-c", code],
                       env={**base, "POOLTENSOR_DIRECT_MAX": "1M"},
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "POOLTENSOR_DIRECT_MAX='1M' is not an integer" in p.stderr
