"""Sizes as people write them: '8GiB', '512MiB', '1.5GB', '4096'.

Why a module of its own: the server's --memory, the partitions' reservations and limits and
the leases all take them, and none of those should import the others.
"""
import re

_SIZE = re.compile(r"^([0-9]*\.?[0-9]+(?:e[0-9]+)?)([kmgt]?)(i?)(b?)$")


def parse_bytes(text):
    """'8GiB', '8G', '512MiB', '1.5GB', '4096' -> bytes. K/M/G/T and KiB/MiB/GiB/TiB are
    powers of 1024; KB/MB/GB/TB powers of 1000; 'B' alone is bytes."""
    m = _SIZE.match(str(text).strip().lower().replace(" ", ""))
    if m is None or (m.group(3) and not m.group(2)):
        raise ValueError(f"not a size: {text!r} (e.g. 8GiB, 512MiB, 1000000)")
    num, unit, binary, b = m.groups()
    power = "kmgt".index(unit) + 1 if unit else 0
    base = 1000 if (unit and b and not binary) else 1024
    n = int(float(num) * base ** power)
    if n <= 0:
        raise ValueError(f"size must be positive, not {text!r}")
    return n
