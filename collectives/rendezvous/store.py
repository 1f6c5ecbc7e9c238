"""The rendezvous store: a small key-value interface that every bootstrap path shares.

Ranks find each other by writing and reading keys, the way Gloo's ``rendezvous::Store`` does.
Code above this module sees only ``Store``; whether the keys live in this process
(``HashStore``) or on rank 0's TCP server (``TCPStore``) is decided once, at bootstrap.

``allgather`` and ``barrier`` are built on the five store operations. Each call takes a tag that
the caller makes unique (a sequence number, a collective id), so that two rounds in flight never
read each other's keys; the last rank to leave a round deletes its keys so that a long job does
not grow the store without bound.
"""
import abc
import math
import os
import time

from ..errors import Timeout

TIMEOUT_ENV = "POOLTENSOR_TIMEOUT"
DEFAULT_TIMEOUT = 60.0


def default_timeout():
    """Seconds a store operation waits when given no timeout: ``$POOLTENSOR_TIMEOUT`` or 60.

    Read at each call so that a job (or a test) can change it without rebuilding its stores.
    """
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{TIMEOUT_ENV} must be a positive number of seconds, not {raw!r}")
    return value


def resolve_timeout(timeout, fallback=None):
    """Turn ``None`` into the default and check the rest, so every wait has a finite bound."""
    if timeout is None:
        timeout = default_timeout() if fallback is None else fallback
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    if not (timeout >= 0 and math.isfinite(timeout)):
        raise ValueError(f"timeout must be finite and >= 0, not {timeout!r}")
    return float(timeout)


def check_key(key):
    """Keys are text; refusing anything else early gives a clear error where the mistake is."""
    if not isinstance(key, str):
        raise TypeError(f"store keys must be str, not {type(key).__name__}")
    return key


def check_value(value):
    """Values are bytes; a str would need an encoding the reader cannot guess."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"store values must be bytes, not {type(value).__name__}")
    return bytes(value)


class Store(abc.ABC):
    """Abstract key-value store used for rendezvous (Gloo's ``rendezvous::Store``).

    Every blocking call takes ``timeout`` in seconds (``None``: the store's default) and raises
    ``collectives.errors.Timeout`` naming the key it waited for; nothing waits forever.
    """

    timeout = None  # per-store default; None means default_timeout() at each call

    @abc.abstractmethod
    def set(self, key, value):
        """Store ``value`` (bytes) under ``key``, replacing any previous value, and wake waiters."""

    @abc.abstractmethod
    def get(self, key, timeout=None):
        """Return the value of ``key``, waiting until some rank sets it or ``timeout`` passes."""

    @abc.abstractmethod
    def add(self, key, delta):
        """Atomically add ``delta`` to the integer counter at ``key`` (absent: 0); return the sum.

        Counters are stored as ASCII decimal bytes, so ``get`` on a counter reads e.g. ``b"3"``.
        """

    @abc.abstractmethod
    def delete(self, key):
        """Remove ``key``; return True if it existed."""

    def wait(self, keys, timeout=None):
        """Wait until every key in ``keys`` exists; one deadline covers them all."""
        deadline = time.monotonic() + resolve_timeout(timeout, self.timeout)
        for key in [keys] if isinstance(keys, str) else list(keys):
            self._wait_one(key, max(0.0, deadline - time.monotonic()))

    def _wait_one(self, key, timeout):
        """Wait for one key; stores that can wait without fetching the value override this."""
        self.get(key, timeout)

    def close(self):
        """Release connections and threads; further calls fail."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PrefixStore(Store):
    """A view of ``store`` where every key is ``prefix + "/" + key``.

    Lets independent users (two worlds, a subgroup) share one store without agreeing on names.
    It does not own the underlying store: ``close`` leaves it open.
    """

    def __init__(self, prefix, store):
        self.prefix = check_key(prefix)
        self.store = store
        self.timeout = store.timeout

    def _k(self, key):
        return f"{self.prefix}/{check_key(key)}"

    def set(self, key, value):
        """Set ``prefix/key``."""
        self.store.set(self._k(key), value)

    def get(self, key, timeout=None):
        """Get ``prefix/key``."""
        return self.store.get(self._k(key), timeout)

    def add(self, key, delta):
        """Add to the counter ``prefix/key``."""
        return self.store.add(self._k(key), delta)

    def delete(self, key):
        """Delete ``prefix/key``."""
        return self.store.delete(self._k(key))

    def wait(self, keys, timeout=None):
        """Wait for ``prefix/key`` for each key."""
        keys = [keys] if isinstance(keys, str) else list(keys)
        self.store.wait([self._k(k) for k in keys], timeout)

    def close(self):
        """Nothing to release: the underlying store belongs to whoever made it."""


def _check_rank(rank, size):
    if not (isinstance(size, int) and size >= 1 and isinstance(rank, int) and 0 <= rank < size):
        raise ValueError(f"need 0 <= rank < size, got rank={rank!r} size={size!r}")


def allgather(store, tag, rank, size, value, timeout=None):
    """Every rank contributes ``value`` (bytes); every rank returns the list of all values by rank.

    ``tag`` must be the same on every rank and different from every other round still in flight.
    The last rank to finish reading deletes the round's keys.
    """
    _check_rank(rank, size)
    base = f"ag/{check_key(tag)}"
    deadline = time.monotonic() + resolve_timeout(timeout, store.timeout)
    store.set(f"{base}/{rank}", check_value(value))
    out = []
    for r in range(size):
        try:
            out.append(store.get(f"{base}/{r}", max(0.0, deadline - time.monotonic())))
        except Timeout:
            raise Timeout(f"allgather {tag!r}: rank {r} did not contribute in time", rank=r) from None
    if store.add(f"{base}/done", 1) == size:
        for r in range(size):
            store.delete(f"{base}/{r}")
        store.delete(f"{base}/done")
    return out


def barrier(store, tag, rank, size, timeout=None):
    """Return once all ``size`` ranks have entered the barrier named ``tag``.

    Arrival is a counter; the last to arrive sets a release key everyone waits for; the last to
    leave deletes the keys.
    """
    _check_rank(rank, size)
    base = f"bar/{check_key(tag)}"
    deadline = time.monotonic() + resolve_timeout(timeout, store.timeout)
    if store.add(f"{base}/in", 1) == size:
        store.set(f"{base}/go", b"1")
    try:
        store.get(f"{base}/go", max(0.0, deadline - time.monotonic()))
    except Timeout:
        try:
            arrived = int(store.get(f"{base}/in", 0))
        except Timeout:
            arrived = "?"
        raise Timeout(f"barrier {tag!r}: only {arrived} of {size} ranks arrived in time",
                      rank=rank) from None
    if store.add(f"{base}/out", 1) == size:
        for name in ("in", "go", "out"):
            store.delete(f"{base}/{name}")
