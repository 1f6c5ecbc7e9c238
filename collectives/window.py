"""One-sided windows: memory each rank exposes, read and written by any rank without the
target's Python taking part (MPI's names: get, put, fetch_add, compare_swap, flush).

The methods are thin: normalize the arguments, make one native call, and turn a native status
into a typed error that names the rank, host, offset and length.
"""
from . import _native
from .errors import (ConnectionDropped, PeerLost, PeerRestarted, RemoteAccessError, Timeout,
                     TransportError)

_ACCESS = {"r": 1, "rw": 3}


def raise_native(err, rank=None, host=None, offset=None, length=None, what="access"):
    """Re-raise a _native.Error as the collectives error it stands for."""
    status, errno, text = err.args[:3]
    kw = dict(rank=rank, host=host, offset=offset, length=length)
    if status in (_native.ERR_KEY, _native.ERR_BOUNDS, _native.ERR_MODE, _native.ERR_ALIGN):
        raise RemoteAccessError(f"{what} refused at the target: {text}", **kw) from None
    if status == _native.ERR_RESTARTED:
        raise PeerRestarted(f"{what} failed: {text}", **kw) from None
    if status in (_native.ERR_PEER_LOST, _native.ERR_TIMEOUT):
        from .log import logger
        logger.debug("%s of rank %s (%s) at offset %s: %s", what, rank, host, offset, text)
    if status == _native.ERR_PEER_LOST:
        raise PeerLost(f"{what} failed: {text}", **kw) from None
    if status == _native.ERR_INDOUBT:
        raise ConnectionDropped(f"{what} failed: {text}", **kw) from None
    if status == _native.ERR_TIMEOUT:
        raise Timeout(f"{what} timed out", **kw) from None
    if status == _native.ERR_INVALID:
        raise ValueError(f"{what}: {text}") from None
    if status == _native.ERR_SYS:
        import os
        hint = ""
        if errno == 1:
            hint = " (cross-memory attach is not permitted here; expose memory from world.alloc())"
        raise TransportError(f"{what} failed: {os.strerror(errno)}{hint}", **kw) from None
    if status == _native.ERR_UNSUPPORTED and what != "attach":
        text += (" (memory exposed from outside world.alloc() / expose(size) is reached through"
                 " the target's native threads, which this world does not reach)")
    raise TransportError(f"{what} failed: {text}", **kw) from None


def _nbytes(buf):
    return memoryview(buf).nbytes


class LocalMemory:
    """This process's side of windows, the same for World and RemoteWorld: shared segments
    (alloc) and the registration of a buffer with the native engine. Uses self._ctx (the
    native context) and self._segments (id -> segment, kept alive while allocated)."""

    def alloc(self, nbytes):
        """Shared memory that windows serve directly (atomics included): a uint8 numpy array."""
        import numpy as np
        seg = _native.Segment(max(int(nbytes), 1))
        self._ctx.add_segment(seg)
        self._segments[id(seg)] = seg
        return np.frombuffer(seg, dtype=np.uint8)[:int(nbytes)]

    def _release_segment(self, arr):
        seg = arr.base
        while seg is not None and not isinstance(seg, _native.Segment):
            seg = getattr(seg, "base", None) or getattr(seg, "obj", None)
        if seg is not None and self._segments.pop(id(seg), None) is not None:
            self._ctx.remove_segment(seg)

    def _register_local(self, buffer, access):
        """What expose() does with this process's part: `buffer` (or an int number of bytes
        to allocate, or None for nothing) checked and registered with `access` ('r' or 'rw').
        Returns (buffer, owned: the segment allocated here or None, key, nbytes)."""
        if access not in _ACCESS:
            raise ValueError(f"access must be 'r' or 'rw', not {access!r}")
        owned = None
        if buffer is None:
            buffer = bytearray(0)
        elif isinstance(buffer, int):
            buffer = owned = self.alloc(buffer)
        mv = memoryview(buffer)
        if not mv.c_contiguous:
            raise ValueError("expose needs a C-contiguous buffer")
        if access == "rw" and mv.readonly:
            raise ValueError("a read-only buffer can only be exposed with access='r'")
        key = self._ctx.register(mv.cast("B") if mv.ndim != 1 or mv.format != "B" else mv,
                                 _ACCESS[access])
        return buffer, owned, key, mv.nbytes


class Request:
    """An asynchronous get, put or notify in flight; wait() or test() to complete it."""

    __slots__ = ("_req", "_where", "_what", "_done")

    def __init__(self, req, where, what):
        self._req, self._where, self._what, self._done = req, where, what, False

    def wait(self, timeout=None):
        """Block until the transfer is done or `timeout` seconds pass (Timeout)."""
        try:
            self._req.wait(timeout)
        except _native.Error as e:
            # the operation's own failure is reported once, here; a timeout may be retried
            self._done = e.args[0] != _native.ERR_TIMEOUT
            raise_native(e, *self._where, what=self._what)
        self._done = True

    def _settled(self):
        """Done and nothing left to report (a failure stays pending until someone waits)."""
        if not self._done:
            try:
                self._done = self._req.test()
            except _native.Error:
                return False
        return self._done

    def test(self):
        """True once the transfer is done (raises its error if it failed)."""
        try:
            self._done = self._req.test()
        except _native.Error as e:
            self._done = True
            raise_native(e, *self._where, what=self._what)
        return self._done


class Window:
    """Memory exposed by every rank of a world; made by World.expose (a collective call)."""

    def __init__(self, world, buffer, access, keys, sizes, accesses, owned=None):
        self.world = world
        self.buffer = buffer
        self.access = access
        self.sizes = sizes            # bytes exposed by each rank
        self.accesses = accesses      # "r" or "rw" for each rank
        self._keys = keys
        self._owned = owned           # segment allocated for this window, if any
        self._ctx = world._ctx
        self._pending = []
        self._closed = False
        self._fence = None            # rank -> (unit, lost units, message): see fence()

    def fence(self, rank, unit, units, message):
        """Units (`unit` bytes each, by index) of rank's memory that were lost (a memory server
        that restarted): from now on an access starting in one raises PeerRestarted(message)
        instead of reaching the new memory there. unfence() lifts them (given back)."""
        if self._fence is None:
            self._fence = {}
        old = self._fence.get(rank)
        lost = set(units) | (old[1] if old else set())
        self._fence[rank] = (int(unit), lost, message)

    def unfence(self, rank, units):
        """Lift the fence from these units of rank's memory (their lost data was given back)."""
        got = (self._fence or {}).get(rank)
        if got is not None:
            got[1].difference_update(units)

    def _where(self, rank, offset, length):
        return (rank, self.world.hosts[rank] if 0 <= rank < self.world.size else None,
                offset, length)

    def _check(self, rank, offset):
        if self._closed:
            raise ValueError("window is closed")
        if not 0 <= rank < self.world.size:
            raise ValueError(f"rank {rank} out of range for a world of {self.world.size}")
        if offset < 0 or offset >= 1 << 64:   # never taken modulo 2**64: no memory is there
            raise RemoteAccessError("negative offset" if offset < 0 else "offset beyond 2**64",
                                    rank=rank, host=self.world.hosts[rank], offset=offset)
        if self._fence and rank in self._fence:
            unit, lost, message = self._fence[rank]
            if offset // unit in lost:
                raise PeerRestarted(message, rank=rank, host=self.world.hosts[rank],
                                    offset=offset)

    def get(self, rank, offset, out):
        """Read len(out) bytes at `offset` of rank's memory into `out`; returns `out`."""
        self._check(rank, offset)
        try:
            self._ctx.get(rank, self._keys[rank], offset, out)
        except _native.Error as e:
            raise_native(e, *self._where(rank, offset, _nbytes(out)), what="get")
        return out

    def put(self, rank, offset, data):
        """Write the bytes of `data` at `offset` of rank's memory."""
        self._check(rank, offset)
        try:
            self._ctx.put(rank, self._keys[rank], offset, data)
        except _native.Error as e:
            raise_native(e, *self._where(rank, offset, _nbytes(data)), what="put")

    def _async(self, fn, rank, offset, buf, what):
        self._check(rank, offset)
        where = self._where(rank, offset, _nbytes(buf))
        try:
            req = Request(fn(rank, self._keys[rank], offset, buf), where, what)
        except _native.Error as e:
            raise_native(e, *where, what=what)
        if len(self._pending) > 64:
            self._pending = [r for r in self._pending if not r._settled()]
        self._pending.append(req)
        return req

    def get_async(self, rank, offset, out):
        """Start a get; the returned Request completes off the calling thread."""
        return self._async(self._ctx.get_async, rank, offset, out, "get")

    def put_async(self, rank, offset, data):
        """Start a put; `data` must stay unchanged until the Request completes."""
        return self._async(self._ctx.put_async, rank, offset, data, "put")

    def fetch_add(self, rank, offset, value):
        """Atomically add `value` to the int64 at `offset` of rank's memory; return the old value."""
        self._check(rank, offset)
        try:
            return self._ctx.fetch_add(rank, self._keys[rank], offset, value)
        except _native.Error as e:
            raise_native(e, *self._where(rank, offset, 8), what="fetch_add")

    def compare_swap(self, rank, offset, expected, new):
        """Atomically replace the int64 at `offset` by `new` if it equals `expected`; return the old value."""
        self._check(rank, offset)
        try:
            return self._ctx.compare_swap(rank, self._keys[rank], offset, expected, new)
        except _native.Error as e:
            raise_native(e, *self._where(rank, offset, 8), what="compare_swap")

    def attach(self, rank, offset, nbytes, writable=False):
        """rank's bytes [offset, offset+nbytes) as a numpy uint8 array mapped into this process,
        where the transport can map them (a peer on this machine); None where it cannot.
        Loads and stores go straight to the peer's memory: no copy, no request."""
        self._check(rank, offset)
        try:
            buf = self._ctx.attach(rank, self._keys[rank], offset, nbytes, writable)
        except _native.Error as e:
            if e.args[0] == _native.ERR_UNSUPPORTED:
                return None
            raise_native(e, *self._where(rank, offset, nbytes), what="attach")
        import numpy as np
        return np.frombuffer(buf, np.uint8)

    def put_indexed(self, rank, offsets, itemsize, data):
        """Write item i of `data` (itemsize bytes each) at byte offsets[i] of rank's memory:
        an element-precise scatter in one call."""
        import numpy as np
        self._check(rank, 0)
        offs = np.asarray(offsets)
        if offs.size and offs.dtype.kind not in "iu":
            raise TypeError(f"offsets must be integers, not {offs.dtype}")
        if offs.size and offs.dtype.kind == "i" and int(offs.min()) < 0:
            raise RemoteAccessError("negative offset", rank=rank, host=self.world.hosts[rank],
                                    offset=int(offs.min()))
        offs = np.ascontiguousarray(offs, np.uint64)
        try:
            self._ctx.put_indexed(rank, self._keys[rank], offs, itemsize, data)
        except _native.Error as e:
            lo = int(offs.min()) if offs.size else 0
            raise_native(e, *self._where(rank, lo, offs.size * itemsize), what="put_indexed")

    def notify(self, rank, offset, value=1):
        """Atomically add `value` to the int64 at `offset` of rank's memory and wake its waiters:
        the signal half of put-with-notification, for algorithms built on windows."""
        self._check(rank, offset)
        try:
            self._ctx.notify(rank, self._keys[rank], offset, value)
        except _native.Error as e:
            raise_native(e, *self._where(rank, offset, 8), what="notify")

    def put_notify(self, rank, offset, data, notify_offset, value=1):
        """Put `data` at `offset` of rank's memory, then add `value` to the int64 at
        `notify_offset` and wake its waiters, with the guarantee a receiver needs: whoever sees
        the counter move sees every byte. One round trip over tcp (the notify rides on the
        transfer's last frame) where put() then notify() takes two. The counter is checked
        like notify()'s; a refusal (of the counter, or of a put of at most 256 KiB) changes
        nothing at the target, and the counter never moves unless all the bytes were written."""
        self._notified(self._ctx.put_notify, rank, offset, data, notify_offset, value)

    def put_notify_quiet(self, rank, offset, data, notify_offset, value=1, head=None):
        """put_notify() that nobody answers: over tcp one frame per 256 KiB of data, and the
        call returns once the socket took them (no round trip, nothing left in flight). `head`
        (bytes-like), when given, lands at `offset` and `data` right after it: a message's
        header goes with its payload without copying the two together. Only the receiver
        knows whether it landed: for a protocol where the receiver waits on the counter anyway
        (a collective's channel). A refusal at the target changes nothing there and is counted
        in its tcp_stats()['quiet_refused']; the errors raised are the sending's (Timeout: the
        socket took nothing within the timeout; PeerLost; ConnectionDropped: the frames may or
        may not land). Elsewhere it is put() of data, then put_notify() of head."""
        self._notified(self._ctx.put_notify_quiet, rank, offset, data, notify_offset, value,
                       head)

    def _notified(self, call, rank, offset, data, notify_offset, value, head=None):
        """put_notify's checks and errors around the native call that does it (head: the
        bytes put_notify_quiet gathers in front of data)."""
        self._check(rank, offset)
        self._check(rank, notify_offset)
        key = self._keys[rank]
        more = () if head is None else (head,)
        try:
            call(rank, key, offset, data, key, notify_offset, value, *more)
        except _native.Error as e:
            n = _nbytes(data) + sum(_nbytes(h) for h in more)
            raise_native(e, *self._where(rank, offset, n), what="put_notify")

    def put_notify_async(self, rank, offset, data, notify_offset, value=1):
        """put_notify() without waiting for the target's answer: returns a Request (its wait()
        raises the put_notify's error; flush() waits for every one still open). `data` must
        stay unchanged until it completes. Two put_notifies to one rank may land in either
        order unless the first completed before the second started. Over shared memory it is
        done at once."""
        self._check(rank, offset)
        self._check(rank, notify_offset)
        key = self._keys[rank]
        where = self._where(rank, offset, _nbytes(data))
        try:
            req = Request(self._ctx.put_notify_async(rank, key, offset, data, key,
                                                     notify_offset, value), where, "put_notify")
        except _native.Error as e:
            raise_native(e, *where, what="put_notify")
        if len(self._pending) > 64:
            self._pending = [r for r in self._pending if not r._settled()]
        self._pending.append(req)
        return req

    def notify_async(self, rank, offset, value=1):
        """notify() without waiting for the target's answer (over tcp a round trip saved on
        the caller's path). Returns a Request: its wait() raises the notify's error, and
        flush() waits for every one still open, so a failure is never lost. Notifies to one
        rank apply in the order they were started. Over shared memory it is done at once."""
        self._check(rank, offset)
        where = self._where(rank, offset, 8)
        try:
            req = Request(self._ctx.notify_async(rank, self._keys[rank], offset, value), where,
                          "notify")
        except _native.Error as e:
            raise_native(e, *where, what="notify")
        if len(self._pending) > 64:
            self._pending = [r for r in self._pending if not r._settled()]
        self._pending.append(req)
        return req

    def wait_local(self, offset, value, watch=None, timeout=None):
        """Block until the int64 at `offset` of this rank's own memory is >= `value` (polls
        briefly, then sleeps). PeerLost if rank `watch` dies first, Timeout past `timeout`."""
        timeout = self.world.timeout if timeout is None else timeout
        try:
            self._ctx.wait_local(self.buffer, offset, value, -1 if watch is None else watch,
                                 timeout)
        except _native.Error as e:
            who = self.world.rank if watch is None else watch
            raise_native(e, *self._where(who, offset, 8), what="wait")

    def flush(self, rank=None, timeout=None):
        """Complete every asynchronous operation this process started (to `rank`, if given)."""
        timeout = self.world.timeout if timeout is None else timeout
        keep = []
        for req in self._pending:
            if req._done:
                continue
            if rank is None or req._where[0] == rank:
                req.wait(timeout)
            else:
                keep.append(req)
        self._pending = keep

    def close(self):
        """Collective: wait for every rank, then stop exposing this memory."""
        if self._closed:
            return
        self.flush()
        self.world.barrier()
        self._closed = True
        try:
            self._ctx.deregister(self._keys[self.world.rank])
        except _native.Error:
            pass
        if self._owned is not None:
            self.world._release_segment(self._owned)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            # leaving on an error: a collective close would pair with an unrelated barrier of
            # the peers; keep the memory exposed so they see this rank gone, not a bad key
            self._closed = True

    def __repr__(self):
        return (f"<Window rank {self.world.rank}/{self.world.size} {self.sizes[self.world.rank]} "
                f"bytes {self.access}>")
