"""HashStore: the rendezvous store kept in this process's memory.

A world of one needs a store but no server, and tests that run ranks as threads need one that
all threads share. A dict guarded by one ``threading.Condition`` is enough: writers notify, and
waiting readers sleep on the condition with a deadline instead of polling.
"""
import threading
import time

from ..errors import BootstrapError, Timeout
from .store import Store, check_key, check_value, resolve_timeout


class HashStore(Store):
    """In-process, thread-safe key-value store (Gloo's ``HashStore``)."""

    def __init__(self, timeout=None):
        self.timeout = None if timeout is None else resolve_timeout(timeout)
        self._data = {}
        self._cond = threading.Condition()
        self._closed = False

    def _check_open(self):
        if self._closed:
            raise BootstrapError("the store is closed")

    def set(self, key, value):
        """Store ``value`` under ``key`` and wake every thread waiting for it."""
        key, value = check_key(key), check_value(value)
        with self._cond:
            self._check_open()
            self._data[key] = value
            self._cond.notify_all()

    def get(self, key, timeout=None):
        """Return the value of ``key``, sleeping until it is set or ``timeout`` passes."""
        check_key(key)
        timeout = resolve_timeout(timeout, self.timeout)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._check_open()
                if key in self._data:
                    return self._data[key]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Timeout(f"waited {timeout:g} s for store key {key!r}")
                self._cond.wait(left)

    def add(self, key, delta):
        """Add ``delta`` to the decimal counter at ``key`` under the lock; return the new value."""
        check_key(key)
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise TypeError(f"delta must be int, not {type(delta).__name__}")
        with self._cond:
            self._check_open()
            old = self._data.get(key, b"0")
            try:
                new = int(old) + delta
            except ValueError:
                raise ValueError(f"store key {key!r} does not hold a counter") from None
            self._data[key] = str(new).encode()
            self._cond.notify_all()
            return new

    def delete(self, key):
        """Remove ``key``; return True if it existed."""
        check_key(key)
        with self._cond:
            self._check_open()
            return self._data.pop(key, None) is not None

    def close(self):
        """Drop the keys and wake waiters, which then fail instead of sleeping to their timeout."""
        with self._cond:
            self._closed = True
            self._data.clear()
            self._cond.notify_all()
