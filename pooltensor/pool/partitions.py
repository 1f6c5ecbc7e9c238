"""Partitions: several jobs share one pool (or one memory server), each with a guaranteed
reservation and a limit.

Why: a pool shared by production and development work must not let one starve the other.
Every allocation counts against the partition it was made in. A partition may hold at most
its ``limit``; the part of every other partition's ``reserve`` that partition has not used yet
is held back for it, so what is free to a partition is

    min(limit - used, free memory - what other partitions still have reserved)

The same ledger serves two places: a pool (``pooltensor.init(partition=, reserve=, limit=)``,
``pool.partition(name, ...)``; bytes of the shared heaps, counted per allocation and given
back with its free) and a memory server (``pooltensor serve --partition NAME=RESERVE:LIMIT``;
bytes granted to clients, given back when they disconnect). Unnamed work goes to the partition
``"default"``: no reservation, no limit beyond the memory itself.
"""
import contextlib
import threading

DEFAULT = "default"


def _size(name, v):
    """A size argument: an int (bytes) or a string such as '64GiB' (serve.parse_bytes)."""
    if isinstance(v, str):
        from .sizes import parse_bytes
        return parse_bytes(v) if v.strip() != "0" else 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be bytes (an int, or a size such as '64GiB'), not "
                        f"{type(v).__name__}")
    if v < 0:
        raise ValueError(f"{name} must be >= 0, not {v}")
    return int(v)


def check_name(name):
    """A partition name: a non-empty str of letters, digits and '-_.'."""
    if not isinstance(name, str):
        raise TypeError(f"partition must be a str, not {type(name).__name__}")
    if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"partition name must be 1-64 letters, digits, '-', '_' or '.', "
                         f"not {name!r}")
    return name


def tag(name):
    """What a creation's agreement row says of its partition (nothing for the default)."""
    return "" if name == DEFAULT else f" partition={name}"


def parse_spec(text):
    """'NAME=RESERVE:LIMIT' (sizes as 64GiB; LIMIT may be omitted: no limit) -> (name,
    reserve, limit or None)."""
    name, eq, sizes = str(text).partition("=")
    if not eq:
        raise ValueError(f"--partition wants NAME=RESERVE:LIMIT (e.g. prod=64GiB:128GiB), "
                         f"not {text!r}")
    reserve, _, limit = sizes.partition(":")
    return (check_name(name.strip()), _size("reserve", reserve.strip()),
            _size("limit", limit.strip()) if limit.strip() else None)


class Partition:
    __slots__ = ("name", "reserve", "limit", "used", "refused")

    def __init__(self, name, reserve, limit):
        self.name, self.reserve, self.limit = name, reserve, limit
        self.used = 0
        self.refused = 0

    def unmet(self):
        """Bytes of the reservation not used yet: held back from the other partitions."""
        return max(0, self.reserve - self.used)


class Ledger:
    """The partitions of one pool or server over `capacity` bytes (thread-safe)."""

    def __init__(self, capacity, specs=()):
        self.capacity = int(capacity)
        self._lock = threading.Lock()
        self.parts = {DEFAULT: Partition(DEFAULT, 0, None)}
        self.owners = {}                   # allocation id -> (partition, bytes)
        self._current = threading.local()
        self.default = DEFAULT
        for name, reserve, limit in specs:
            self.declare(name, reserve, limit)

    def declare(self, name, reserve=0, limit=None):
        """Add partition `name` (reserve and limit in bytes, or sizes such as '64GiB'; limit
        None: the whole memory). Declaring it again with the same sizes is a no-op; other
        sizes, a reserve above the limit, or reservations summing past the capacity are a
        ValueError."""
        check_name(name)
        reserve = _size("reserve", reserve if reserve is not None else 0)
        limit = None if limit is None else _size("limit", limit)
        if limit is not None and reserve > limit:
            raise ValueError(f"partition {name!r}: reserve {reserve} B is above its limit "
                             f"{limit} B")
        with self._lock:
            have = self.parts.get(name)
            if have is not None:
                if name != DEFAULT and (have.reserve, have.limit) != (reserve, limit):
                    raise ValueError(f"partition {name!r} is declared with reserve "
                                     f"{have.reserve} B and limit {have.limit} B, not "
                                     f"{reserve} B and {limit} B")
                return have
            total = sum(p.reserve for p in self.parts.values()) + reserve
            if total > self.capacity:
                raise ValueError(f"partition {name!r}: reservations would sum to {total} B, "
                                 f"more than the {self.capacity} B there is")
            p = self.parts[name] = Partition(name, reserve, limit)
            return p

    def get(self, name):
        p = self.parts.get(name)
        if p is None:
            raise ValueError(f"unknown partition {name!r}; declared: {sorted(self.parts)}")
        return p

    # -- which partition this thread allocates in --------------------------------------------
    def current(self):
        return getattr(self._current, "name", None) or self.default

    @contextlib.contextmanager
    def using(self, name):
        """Allocations of this thread inside the block count against partition `name`."""
        self.get(name)
        old = getattr(self._current, "name", None)
        self._current.name = name
        try:
            yield self.parts[name]
        finally:
            self._current.name = old

    # -- accounting ---------------------------------------------------------------------------
    def free_to(self, name, free):
        """Bytes partition `name` may take now, when the memory has `free` bytes free."""
        p = self.get(name)
        held = sum(o.unmet() for o in self.parts.values() if o is not p)
        room = free - held
        if p.limit is not None:
            room = min(room, p.limit - p.used)
        return max(0, room)

    def refusal(self, name, nbytes, free):
        """Why partition `name` cannot take `nbytes` now (a sentence naming it and what is
        free to it), or None when it can."""
        with self._lock:
            p = self.get(name)
            room = self.free_to(name, free)
            if nbytes <= room:
                return None
            p.refused += 1
            held = sum(o.unmet() for o in self.parts.values() if o is not p)
            lim = "no limit" if p.limit is None else f"limit {p.limit} B"
            return (f"partition {name!r} cannot take {nbytes} bytes: {room} bytes are free "
                    f"to it (it uses {p.used} B, {lim}; {held} B of free memory is "
                    f"reserved for other partitions)")

    def take(self, name, nbytes, owner=None):
        with self._lock:
            self.get(name).used += int(nbytes)
            if owner is not None:
                self.owners[owner] = (name, int(nbytes))

    def give_back(self, name, nbytes):
        with self._lock:
            p = self.parts.get(name)
            if p is not None:
                p.used = max(0, p.used - int(nbytes))

    def forget(self, owner):
        """The allocation `owner` was freed: its bytes go back to its partition."""
        got = self.owners.pop(owner, None)
        if got is not None:
            self.give_back(*got)

    def stats(self):
        """{name: {reserved, used, limit, refused}} (what pt.stats() shows)."""
        with self._lock:
            return {p.name: {"reserved": p.reserve, "used": p.used, "limit": p.limit,
                             "refused": p.refused} for p in self.parts.values()}


def join(server, client, name):
    """A memory server's answer to a client naming its partition (before it allocates):
    the client's allocations count against it from then on."""
    try:
        p = server.ledger.get(check_name(name))
    except (TypeError, ValueError) as e:
        return {"ok": False, "error": str(e)}
    if client.allocs and client.partition != name:
        return {"ok": False, "error": f"this connection allocated in partition "
                                      f"{client.partition!r} already"}
    client.partition = name
    free = server.ledger.free_to(name, server.free)
    return {"ok": True, "free": free, "reserve": p.reserve, "limit": p.limit}
