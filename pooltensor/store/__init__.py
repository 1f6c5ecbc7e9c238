"""Named sets of read-only tensors in the pool: load a checkpoint once, open it everywhere.

    import pooltensor as pt
    pt.init(connect=["h1:7000", "h2:7000"])
    pt.store.load_safetensors(["model-00001.safetensors", ...], name="llama-8b")
    # later, in any process connected to the same servers (the loader may have left):
    w = pt.store.open("llama-8b")           # key -> read-only pool array
    np.asarray(w["lm_head.weight"]); w["embed"].to_jax()
    pt.store.publish("llama-8b", new_weights)   # readers of the old version keep it
    w.close()                                # ... until they close it

Why a store and not just arrays: weights are written once and read by many processes that
did not make them; they need a name, a version that changes atomically, and memory that
outlives the process that loaded it.

Where a store lives:
- a pool on memory servers (``init(connect=...)``): in named server memory (kept.py), with
  its manifest (msgpack) on the first server: any client of the same servers opens it, on
  any machine, after the loader has gone; memory is freed when the store is dropped or
  published over and the last reader has closed it.
- any other pool (a plain script and its members, SPMD ranks, a Dask client): in the pool's
  read-only heap (``access="readonly"``, ``placement=``, ``replicas=`` as any creation), the
  registry kept by the process that allocates (in SPMD every rank: loading is collective, so
  every rank can open). A version's arrays are freed when it was replaced or dropped and
  the last reader closed it (or dropped its arrays).
- a pool attached to Dask: as any other pool in the client, which also hands each version
  to the scheduler (shared.py), so that a task on any worker opens it by name; the
  version is freed when the client's readers and the workers' have all closed it.
"""
import builtins
import os
import threading
from collections.abc import Mapping

import msgpack
import numpy as np

from . import files, inpool, kept, shared
from .files import SafetensorsError
from .kept import PeerLost, ReplicationError

_lock = threading.Lock()


class _Version:
    """One version of a store in this process: its arrays and manifest, and the readers
    holding it (when it is on servers, the named parts it holds there)."""

    def __init__(self, name, version, arrays, manifest, heap=None, held=()):
        self.name, self.version, self.arrays = name, version, arrays
        self.manifest, self.heap, self.held = manifest, heap, [*held]
        self.readers = 0
        self.key, self.replica = (name, version), None
        self.release = None     # a Dask worker's: lets the client's version go (shared.py)
        self.whole = self.backing = self.local = None     # whole copies (inpool.py)

    def summary(self):
        nbytes = sum(a.nbytes for a in self.arrays.values())
        if self.heap is not None:
            return _summary(self.manifest)
        reps = {len(c) for a in self.arrays.values() if a._a.copies
                for c in a._a.copies} or {1}
        return {"version": self.version, "tensors": len(self.arrays), "bytes": int(nbytes),
                "replicas": min(reps), "full_replicas": len(self.whole or ()),
                "where": "pool"}


def _summary(m):
    """What list() and stats() say of a version on servers, from its manifest."""
    nbytes = 0
    for t in m["tensors"].values():
        n = files.parse_dtype(t["dtype"]).itemsize
        for d in t["shape"]:
            n *= d
        nbytes += n
    return {"version": m["version"], "tensors": len(m["tensors"]), "bytes": nbytes,
            "replicas": len(m["layouts"]),
            "full_replicas": len(m.get("replicas", [])), "where": "servers"}


class Store(Mapping):
    """An open version of a store: a read-only mapping of key -> pool array (each
    ``np.asarray``-able, ``.to_jax()``-able, sliceable). Keeps its version alive until
    close() (also on ``with`` exit)."""

    def __init__(self, pool, ver, local=False):
        self._pool, self._ver = pool, ver
        self.name, self.version = ver.name, ver.version
        self.metadata = dict(ver.manifest.get("metadata") or {})
        ver.readers += 1
        self._arrays = (local and ver.local) or ver.arrays

    def __getitem__(self, key):
        if self._arrays is None:
            raise ValueError(f"store {self.name!r} (version {self.version}) is closed")
        return self._arrays[key]

    def __iter__(self):
        return iter(self._arrays or ())

    def __len__(self):
        return len(self._arrays or ())

    @property
    def nbytes(self):
        return sum(a.nbytes for a in (self._arrays or {}).values())

    def to_numpy(self):
        """Every tensor as a numpy array (copies), by key."""
        return {k: a.to_numpy() for k, a in self.items()}

    def to_jax(self):
        """Every tensor as a jax.Array (zero-copy where its slabs are here), by key."""
        return {k: a.to_jax() for k, a in self.items()}

    def close(self):
        """Let the version go: when it was replaced or dropped and no other reader holds it,
        its memory is freed."""
        if self._arrays is None:
            return
        self._arrays = None
        _unref(self._pool, self._ver)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        state = "closed" if self._arrays is None else f"{len(self)} tensors"
        return f"<pooltensor.store.Store {self.name!r} version {self.version}: {state}>"


def _pool():
    from ..pool.runtime import current
    return current()


def _on_servers(pool):
    return pool.role == "client"


def _registry(pool):
    reg = getattr(pool, "_stores", None)
    if reg is None:
        reg = pool._stores = {"current": {}, "versions": {}}
    return reg


def _unref(pool, ver):
    with _lock:
        ver.readers -= 1
        if ver.readers > 0:
            return
        if _registry(pool)["current"].get(ver.name) is ver:
            return                          # still the current version: stays
    if ver.heap is None and pool.me == 0 and shared.attached(pool):
        # a Dask client's: freed once no worker holds it either (shared.py)
        shared.retire(pool, ver, lambda: _free(pool, ver))
        return
    _free(pool, ver)
    if ver.release is not None:
        ver.release()


def _free(pool, ver):
    """The version's memory goes (its named server parts released, or its arrays dropped:
    the pool frees their slabs), unless a reader opened it again meanwhile."""
    with _lock:
        if ver.readers > 0:
            return
        _registry(pool)["versions"].pop(ver.key, None)
    if ver.heap is not None and not pool.closed:
        kept.release(pool.world, ver.held)
        kept.forget(pool, ver.heap)
    ver.arrays, ver.whole, ver.backing, ver.local = {}, None, None, None


def _check_name(name):
    if not isinstance(name, str) or not name or "@" in name or len(name) > 200:
        raise ValueError(f"a store name is a non-empty string of at most 200 characters "
                         f"without '@', not {name!r}")
    return name


def _items_from(tensors):
    """[(key, numpy)] of a mapping of arrays (numpy, jax, pool arrays, anything numpy takes)."""
    from ..array.array import _check_dtype, ndarray
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name -> array, not "
                        f"{type(tensors).__name__}")
    out = []
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise TypeError(f"tensor names are strings, not {type(k).__name__}")
        arr = v.to_numpy() if isinstance(v, ndarray) else np.asarray(v)
        _check_dtype(arr.dtype)
        out.append((k, arr))
    return out


def _make(pool, name, items, metadata, placement, replicas, first):
    """Write a new version of `name` and make it current; returns its open Store."""
    reg = _registry(pool)
    with _lock:
        cur = reg["current"].get(name)
    if _on_servers(pool):
        old = kept.read_manifest(pool.world, name)    # the servers' word, not ours
        if first and old is not None:
            raise ValueError(f"a store named {name!r} exists on the servers: publish() "
                             f"replaces it, drop() removes it")
        version = old["version"] + 1 if old else 1
        servers = _servers(pool, placement)
        manifest, arrays, heap, made = kept.write(pool, name, version, items, servers,
                                                  metadata, _copies(replicas))
        try:
            for r, nm in made:           # this process reads it: hold it like a reader
                pool.world.server(r).request({"op": "name_get", "name": nm})
            kept.keep(pool.world, made)  # (until now, they went if this process died)
            kept.publish(pool.world, name, manifest, first=old is None)
        except BaseException:
            kept.release(pool.world, made)
            kept.drop_entries(pool.world, manifest)
            kept.forget(pool, heap)
            raise
        if old is not None:
            kept.drop_entries(pool.world, old)
        ver = _Version(name, version, arrays, manifest, heap, made)
    else:
        if first and cur is not None:
            raise ValueError(f"a store named {name!r} exists: publish() replaces it, drop() "
                             f"removes it")
        version = cur.version + 1 if cur is not None else 1
        from ..array.creation import from_numpy
        from ..cache import progress
        arrays = {}
        total = sum(a.nbytes for _, a in items)
        with progress.for_bytes(total, f"load {name}") as pb:
            for k, a in items:
                arrays[k] = from_numpy(a, placement=placement, access="readonly",
                                       replicas=replicas)
                pb.update(a.nbytes)
        manifest = {"name": name, "version": version, "metadata": metadata,
                    "tensors": {k: {"dtype": files.dtype_name(a.dtype),
                                    "shape": [*a.shape]} for k, a in arrays.items()}}
        ver = _Version(name, version, arrays, manifest)
        # the manifest in the pool too, beside the tensors it names
        ver.packed = from_numpy(np.frombuffer(msgpack.packb(manifest, use_bin_type=True),
                                              np.uint8), access="readonly")
    with _lock:
        old_ver = reg["current"].get(name)
        reg["current"][name] = ver
        reg["versions"][(name, version)] = ver
    if ver.heap is None and shared.attached(pool):    # its workers open it too
        shared.publish(pool, ver, lambda n, v: _freed_by_workers(pool, n, v))
    store = Store(pool, ver)
    if old_ver is not None and old_ver.readers == 0:
        old_ver.readers = 1
        _unref(pool, old_ver)
    return store


def _freed_by_workers(pool, name, version):
    """(On the Dask client's event thread.) The last worker holding a retired version of
    `name` closed it: it goes, unless this process reads it again."""
    with _lock:
        ver = _registry(pool)["versions"].get((name, version))
        if ver is None or ver.readers or _registry(pool)["current"].get(name) is ver:
            return
    _free(pool, ver)


def _copies(replicas):
    if replicas is None:
        return 1
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise ValueError(f"replicas must be a positive integer, not {replicas!r}")
    return replicas


def _servers(pool, placement):
    every = [*range(1, pool.size)]
    if placement is None or placement == "block":
        return every
    if isinstance(placement, (builtins.list, tuple)):
        bad = [r for r in placement if r not in every]
        if bad or not placement:
            raise ValueError(f"placement names servers by rank (1..{pool.size - 1}), not "
                             f"{[*placement]}")
        return sorted(set(int(r) for r in placement))
    raise ValueError(f"a store on memory servers takes placement 'block' or a list of "
                     f"server ranks, not {placement!r}")


def load_safetensors(paths, name, *, placement=None, replicas=None):
    """Read safetensors file(s) into a new store `name` (one read-only pool array per tensor,
    its dtype and shape as in the file, bfloat16 and float16 included); returns it open.

    Every file is checked (by the safetensors package) before anything is written; a
    truncated or corrupted file raises SafetensorsError (a ValueError) and registers
    nothing. The tensors' bytes go from the memory-mapped file straight into pool slabs
    (a progress bar for big loads: $POOLTENSOR_PROGRESS). placement/replicas: as for any
    pool array (on servers: 'block' or a list of server ranks)."""
    _check_name(name)
    fs = files.open_all(paths)
    try:
        items, meta = [], {}
        for f in fs:
            meta.update(f.metadata)
            items += [(k, f.view(k)) for k in f.tensors]
        store = _make(_pool(), name, items, meta, placement, replicas, first=True)
        del items
    finally:
        for f in fs:
            f.close()
    return store


def put(name, tensors, *, placement=None, replicas=None, metadata=None):
    """A new store `name` holding copies of `tensors` ({key: array}); returns it open."""
    _check_name(name)
    return _make(_pool(), name, _items_from(tensors), dict(metadata or {}), placement,
                 replicas, first=True)


def publish(name, tensors, *, placement=None, replicas=None, metadata=None):
    """A new version of store `name` (made if missing) from {key: array} or safetensors
    path(s), made current at once: open() gives it from now on, while readers of the old
    version keep theirs until they close it (then it is freed). Returns it open."""
    _check_name(name)
    if isinstance(tensors, (str, os.PathLike, builtins.list, tuple)):
        fs = files.open_all(tensors)
        try:
            meta = dict(metadata or {})
            items = []
            for f in fs:
                meta.update(f.metadata)
                items += [(k, f.view(k)) for k in f.tensors]
            return _make(_pool(), name, items, meta, placement, replicas, first=False)
        finally:
            for f in fs:
                f.close()
    return _make(_pool(), name, _items_from(tensors), dict(metadata or {}), placement,
                 replicas, first=False)


def open(name, *, local=False):
    """The current version of store `name` as a read-only mapping key -> pool array (a
    Store; close it when done). KeyError if there is no such store. local=True: read from a
    full replica on a memory server of this machine when replicate() made one (else from
    where the version's parts are); in a plain script's pool, from the script's own whole
    copy when it has one. The arrays know every copy of their slabs: a server or member
    lost while they are read is read around. In a task on a worker of a pool attached to
    Dask: the client's store (shared.py)."""
    _check_name(name)
    pool = _pool()
    reg = _registry(pool)
    if _on_servers(pool):
        for _ in range(10):
            manifest = kept.read_manifest(pool.world, name)
            if manifest is None:
                raise KeyError(f"no store named {name!r} on the servers")
            replica = kept.local_replica(pool.world, manifest) if local else None
            # the arrays of a version know the copies its manifest names: once replicate()
            # added whole replicas, an open makes new ones (a loader's own have the parts)
            reps = tuple(rp["entry"] for rp in manifest.get("replicas", []))
            vkey = (name, manifest["version"]) + (
                (reps, replica and replica["entry"]) if reps else ())
            with _lock:
                ver = reg["versions"].get(vkey)
            lost = set(pool.world.lost())
            if ver is not None and ver.arrays and not (lost and lost & {
                    m for a in ver.arrays.values() for m in a._a.members}):
                return Store(pool, ver)           # (not when one of its servers is gone)
            got = kept.attach(pool, manifest, replica)
            if got is not None:
                arrays, heap, held = got
                ver = _Version(name, manifest["version"], arrays, manifest, heap, held)
                ver.key, ver.replica = vkey, replica
                with _lock:
                    reg["versions"][vkey] = ver
                return Store(pool, ver)
        raise RuntimeError(f"store {name!r} kept changing version while being opened")
    with _lock:
        ver = reg["current"].get(name)
        if ver is not None:
            return Store(pool, ver, local)
    if pool.me != 0 and shared.attached(pool):    # a Dask worker: the client's store
        version, manifest, arrays, release = shared.acquire(pool, name)
        ver = _Version(name, version, arrays, manifest)
        ver.key, ver.release = (name, version, object()), release
        with _lock:
            reg["versions"][ver.key] = ver
        return Store(pool, ver)
    raise KeyError(f"no store named {name!r} in this pool")


def replicate(name, members, *, timeout=60.0):
    """Copy the current version of store `name` whole to each memory server of `members`
    (ranks of this pool's servers), in a pipeline: the servers form a chain in the order
    given and each reads from the one before it while that one is still receiving (so N
    members cost about one transfer, not N). A member whose source fails reads on from the
    version's own parts or their copies (replicas=); with none left, ReplicationError
    names the source and nothing is added. Readers then get a copy on their own machine
    with open(name, local=True). Returns the servers' addresses that hold a replica.

    In a plain script's pool (init(members=N)): a whole copy on each member of `members`
    (ranks lending memory, the script 0 included), in the same chain, copied by the script
    through the members' mapped memory (inpool.py); open() from then on knows every copy,
    and open(local=True) reads the script's own. Returns the hosts of the members holding
    a whole copy."""
    _check_name(name)
    pool = _pool()
    if not _on_servers(pool):
        if pool.role != "plain" or pool.me != 0:
            raise ValueError("replicate() copies a store between memory servers "
                             "(init(connect=...)) or to a plain script's members, not in "
                             "SPMD or from a member")
        members = inpool.check_members(pool, [*members])
        with _lock:
            ver = _registry(pool)["current"].get(name)
        if ver is None:
            raise KeyError(f"no store named {name!r} in this pool")
        return inpool.replicate(pool, ver, members, name)
    members = _servers(pool, [*members])
    for _ in range(5):
        manifest = kept.read_manifest(pool.world, name)
        if manifest is None:
            raise KeyError(f"no store named {name!r} on the servers")
        out = kept.replicate(pool, manifest, members, timeout)
        now = kept.read_manifest(pool.world, name)
        if now is not None and now["version"] == manifest["version"]:
            added = out["replicas"][len(manifest.get("replicas", [])):]
            by_id = kept.ranks_by_identity(pool.world)
            kept.keep(pool.world, [(by_id[tuple(rp["server"])], rp["entry"]) for rp in added])
            kept.publish(pool.world, name, out, first=False)
            return [pool.world.hosts[by_id[tuple(rp["server"])]] for rp in out["replicas"]
                    if tuple(rp["server"]) in by_id]
        kept.drop_entries(pool.world, {"entries": out["replicas"][len(manifest["replicas"]):]})
    raise RuntimeError(f"store {name!r} kept changing version while being replicated")


def list():
    """Every store: {name: {version, tensors, bytes, replicas, where}}."""
    pool = _pool()
    if _on_servers(pool):
        return {name: _summary(m) for name, m in kept.listing(pool.world).items()}
    if pool.me != 0 and shared.attached(pool):    # a Dask worker: the client's stores
        return shared.listing(pool)
    with _lock:
        return {n: v.summary() for n, v in _registry(pool)["current"].items()}


def drop(name):
    """Remove store `name`: open() no longer finds it; its memory is freed once every
    reader closed it. KeyError if there is no such store."""
    _check_name(name)
    pool = _pool()
    reg = _registry(pool)
    with _lock:
        ver = reg["current"].pop(name, None)
    if _on_servers(pool):
        if not kept.drop(pool.world, name) and ver is None:
            raise KeyError(f"no store named {name!r} on the servers")
    elif ver is None:
        raise KeyError(f"no store named {name!r} in this pool")
    elif pool.me == 0 and shared.attached(pool):
        shared.withdraw(pool, name)
    if ver is not None and ver.readers == 0:
        ver.readers = 1
        _unref(pool, ver)


def stats(pool=None):
    """The stores this process made or has open, for pt.stats(): {name: summary of the
    newest version it holds, with its readers here}."""
    pool = pool or _pool()
    with _lock:
        reg = _registry(pool)
        out = {}
        for v in sorted(reg["versions"].values(), key=lambda v: v.version):
            out[v.name] = dict(v.summary(), readers=v.readers)     # the newest held here
        return out


__all__ = ["load_safetensors", "put", "publish", "open", "list", "drop", "replicate", "Store",
           "SafetensorsError", "ReplicationError", "PeerLost", "stats"]
