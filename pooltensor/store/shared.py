"""Stores of a pool attached to Dask (pooltensor.dask.attach): their registry on the scheduler,
so that a task on any worker opens a store by name.

Why the scheduler: in an attached pool the client process (member 0) allocates and keeps the
registry, and a worker has no way to ask it; the scheduler is what the client and every
worker reach. It keeps, per pool (its token) and store name, the current version's manifest
and where each tensor's slabs are (the Allocation's ids, members, slots and copies, by value),
and which workers' readers hold each version.

Every step is one function run on the scheduler (``run_on_scheduler``), which runs it whole
on its event loop, so the steps never interleave:
- ``publish`` (the client, for a new version) and ``withdraw`` (drop);
- ``acquire`` (a worker's open: the current version, and a reader id holding it) and
  ``release`` (its close); ``_listing`` (a worker's list());
- ``retire`` (the client, when its own readers of a replaced or dropped version are gone):
  answers whether workers still hold it; if so, the last ``release`` of it tells the client
  (an event on TOPIC) and the client frees it then.
A worker that dies holding a version keeps it held until the pool is detached.
"""
import asyncio
import threading
import uuid

from ..array.array import ndarray
from ..cache import layout
from ..pool.allocation import Allocation
from . import files

TOPIC = "pooltensor-store"


def attached(pool):
    """Whether `pool` is a pool attached to Dask (the client's or a worker's)."""
    return getattr(pool, "dask_ranks", None) is not None and getattr(pool, "token", None)


def _client(pool):
    """The Dask client to reach the scheduler with: the attaching one in the client process,
    the worker's own in a task."""
    if pool.me == 0:
        from ..dask.session import attached as session
        got = session(required=False)
        if got is None:
            raise RuntimeError("the pool is no longer attached to a Dask client")
        return got[0]
    from distributed import get_client
    return get_client()


def _off_loop(fn):
    """Run fn now, or in a thread when called on an event loop (a close from a finalizer
    there: a synchronous call to the scheduler from its own loop would wait forever)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return fn()
    threading.Thread(target=fn, name="pooltensor-store", daemon=True).start()


# -- on the scheduler ---------------------------------------------------------------------
def _stores(scheduler, token):
    reg = getattr(scheduler, "_pooltensor_stores", None)
    if reg is None:
        reg = scheduler._pooltensor_stores = {}
    return reg.setdefault(token, {})


def _publish(token, name, version, data, dask_scheduler=None):
    s = _stores(dask_scheduler, token).setdefault(name, {"current": None, "versions": {}})
    s["versions"][version] = {"data": data, "readers": set(), "retired": False}
    s["current"] = version


def _withdraw(token, name, dask_scheduler=None):
    s = _stores(dask_scheduler, token).get(name)
    if s is not None:
        s["current"] = None


def _acquire(token, name, rid, dask_scheduler=None):
    s = _stores(dask_scheduler, token).get(name)
    if s is None or s["current"] is None:
        return None
    v = s["versions"][s["current"]]
    v["readers"].add(rid)
    return s["current"], v["data"]


def _listing(token, dask_scheduler=None):
    return {name: s["versions"][s["current"]]["data"]["summary"]
            for name, s in _stores(dask_scheduler, token).items() if s["current"] is not None}


def _release(token, name, version, rid, dask_scheduler=None):
    s = _stores(dask_scheduler, token).get(name)
    v = s and s["versions"].get(version)
    if not v:
        return
    v["readers"].discard(rid)
    if v["retired"] and not v["readers"]:
        del s["versions"][version]
        dask_scheduler.log_event(TOPIC, {"token": token, "name": name, "version": version})


def _retire(token, name, version, dask_scheduler=None):
    s = _stores(dask_scheduler, token).get(name)
    v = s and s["versions"].get(version)
    if not v:
        return False
    if s["current"] == version:
        s["current"] = None
    if v["readers"]:
        v["retired"] = True
        return True
    del s["versions"][version]
    return False


# -- the client ---------------------------------------------------------------------------
def _ref(arr):
    a = arr._a
    return {"aid": a.id, "heap": a.heap, "nbytes": a.nbytes, "members": [*a.members],
            "slots": [*a.slots], "copies": a.copies and [[[*c] for c in cs] for cs in a.copies]}


def publish(pool, ver, on_free):
    """Make `ver` (a new version, made here) what a worker's open finds. on_free(name,
    version) is called (on the client's event thread) when the last worker reader of a
    retired version let it go."""
    client = _client(pool)
    if not getattr(pool, "_store_events", False):
        def told(event):
            msg = event[1]
            if isinstance(msg, dict) and msg.get("token") == pool.token:
                on_free(msg["name"], msg["version"])
        client.subscribe_topic(TOPIC, told)
        pool._store_events = True
    data = {"manifest": ver.manifest, "tensors": {k: _ref(a) for k, a in ver.arrays.items()},
            "summary": ver.summary()}
    client.run_on_scheduler(_publish, pool.token, ver.name, ver.version, data)


def withdraw(pool, name):
    """A dropped store: workers no longer open it."""
    _client(pool).run_on_scheduler(_withdraw, pool.token, name)


def retire(pool, ver, free):
    """This process's readers of replaced or dropped version `ver` are gone: free() it now
    unless a worker still holds it (then the last worker's close has it freed: publish's
    on_free)."""
    def go():
        try:
            held = _client(pool).run_on_scheduler(_retire, pool.token, ver.name, ver.version)
        except Exception:             # noqa: BLE001 (the cluster gone: nobody holds it)
            held = False
        if not held:
            free()
    _off_loop(go)


# -- a worker ------------------------------------------------------------------------------
def listing(pool):
    """In a task on a worker: the client's stores, {name: summary when published}."""
    return _client(pool).run_on_scheduler(_listing, pool.token)


def acquire(pool, name):
    """In a task on a worker of an attached pool: hold the current version of store `name`:
    (version, manifest, {key: ndarray}, release) or KeyError."""
    client = _client(pool)
    rid = uuid.uuid4().hex
    got = client.run_on_scheduler(_acquire, pool.token, name, rid)
    if got is None:
        raise KeyError(f"no store named {name!r} in this pool")
    version, data = got
    manifest = data["manifest"]
    arrays = {}
    for key, ref in data["tensors"].items():
        t = manifest["tensors"][key]
        dtype = files.parse_dtype(t["dtype"])
        shape = tuple(t["shape"])
        a = Allocation(pool, ref["aid"], ref["nbytes"], ref["heap"], ref["members"],
                       ref["slots"])
        if ref["copies"]:
            a.copies = [[tuple(c) for c in cs] for cs in ref["copies"]]
            pool.keeper.allocs[a] = ((f"tensor {key!r} of store {name!r}", shape, dtype),
                                     len(a.copies[0]))
        arrays[key] = ndarray(a, 0, shape, layout.c_strides(shape, dtype.itemsize), dtype)

    def release():
        def go():
            try:
                client.run_on_scheduler(_release, pool.token, name, version, rid)
            except Exception:         # noqa: BLE001 (the cluster gone: nothing to release)
                pass
        _off_loop(go)
    return version, manifest, arrays, release
