"""Progress bars for long waits (tqdm): to_numpy() and writes of big arrays, creating and
filling them, benchmarks. Shown only when stderr is a terminal, silent otherwise, and
configurable: $POOLTENSOR_PROGRESS = auto (default) | always | never, and
$POOLTENSOR_PROGRESS_MIN = bytes below which array work shows none (default 256 MiB)."""
import contextlib
import os
import sys

from collectives import env

ENV = "POOLTENSOR_PROGRESS"
ENV_MIN = "POOLTENSOR_PROGRESS_MIN"
DEFAULT_MIN = 256 << 20


def enabled(mode=None):
    """Whether a bar shows: mode (or $POOLTENSOR_PROGRESS) 'always', 'never', or 'auto' =
    stderr is a terminal."""
    mode = (mode or os.environ.get(ENV) or "auto").lower()
    if mode in ("always", "1", "on", "yes"):
        return True
    if mode in ("never", "0", "off", "no"):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def threshold():
    """Bytes of array work from which a bar may show ($POOLTENSOR_PROGRESS_MIN)."""
    return env.number(ENV_MIN, DEFAULT_MIN)


class _Silent:
    """What bar() gives when no bar shows: the same calls, doing nothing."""

    def update(self, n=1):
        pass

    def set_postfix_str(self, s):
        pass


SILENT = _Silent()


@contextlib.contextmanager
def bar(total, desc, unit="it", mode=None, **kw):
    """A tqdm bar on stderr when enabled(mode), else a silent stand-in."""
    if not enabled(mode):
        yield SILENT
        return
    from tqdm import tqdm
    with tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
              leave=False, **kw) as b:
        yield b


def for_bytes(nbytes, desc):
    """A bar counting bytes for array work of nbytes, or the silent one below the
    threshold."""
    if nbytes < threshold():
        return bar(0, desc, mode="never")
    return bar(nbytes, desc, unit="B", unit_scale=True, unit_divisor=1024)
