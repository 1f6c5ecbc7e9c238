"""Stores on memory servers: tensors in named server memory that outlives its loader.

Why: a client's pool memory on a server is freed when the client leaves, but weights are
loaded once for readers that come later (another script, on another machine, connected to
the same servers). So a store version on servers lives in *named* allocations
(pool/names.py): one per server holding part of it, ``store:NAME@V/I``, and a pointer entry
``store:NAME`` (no memory) on the first server whose metadata is the version's manifest
(msgpack). Publishing a version is one assignment of that metadata on the server: a reader
sees the old manifest or the new one. The loader then drops the old version's entries; a
reader that opened it holds them (the server frees them when the last holder releases them
or disconnects).

In every process the version's tensors are ordinary pool arrays over a heap of their own
(``kept<N>``): per slab, the server and the slot in its named allocation, read through the
slab cache and the prefetcher like any other remote slab, over a Window made of the
servers' read-only keys (the server refuses every put through them).
"""
import itertools
import time

import msgpack
import numpy as np

from collectives.remote import ServerRefused
from collectives.window import Window

from ..array.array import ndarray
from ..cache import layout, progress
from ..pool.pool import Allocation
from . import files

PREFIX = "store:"
_heaps = itertools.count(1)
_aids = itertools.count(1 << 40)     # allocation ids of kept tensors: never the pool's own
PUT_RUN = 64 << 20                    # bytes per put while loading


def pointer(name):
    return PREFIX + name


def entry(name, version, i):
    return f"{PREFIX}{name}@{version}/{i}"


def identity(srv):
    """A server as every client names it: (host, pid, data port) from its greeting."""
    f = srv.facts
    return [str(f.get("host")), int(f.get("pid", 0)), int(f.get("data_port", 0))]


def ranks_by_identity(world):
    return {tuple(identity(world.server(r))): r for r in range(1, world.size)}


def directory(world):
    """The server that keeps the pointers: the first one this client connected to."""
    return world.server(1)


def missing(e):
    return isinstance(e, ServerRefused) and "no name" in str(e)


def _window(pool, keys, sizes, access):
    w = pool.world
    ks, ss = [0] * w.size, [0] * w.size
    for r, k in keys.items():
        ks[r], ss[r] = int(k), int(sizes[r])
    return Window(w, None, access, ks, ss, [access] * w.size)


def _heap(pool, rwin, wwin=None):
    h = f"kept{next(_heaps)}"
    pool.read_win[h] = rwin
    pool.write_win[h] = wwin
    pool.local[h] = None
    return h


def forget(pool, heap):
    """The heap of a closed version: its windows and cached slabs go."""
    for d in (pool.read_win, pool.write_win, pool.local):
        d.pop(heap, None)
    pool.cache.discard_keys([k for k in list(pool.cache.entries) if k[0] == heap])


def plan(nslabs, servers):
    """Contiguous runs of the version's slabs, in order, one run per server (as even as can
    be): per server rank, its first global slab and count."""
    k = len(servers)
    out, start = {}, 0
    for i, r in enumerate(servers):
        n = nslabs * (i + 1) // k - nslabs * i // k
        out[r] = (start, n)
        start += n
    return out


def write(pool, name, version, items, servers, metadata):
    """Make version `version` of store `name` on `servers` (ranks): items is [(key, numpy
    source)] in order. Returns (manifest dict, {key: ndarray}, heap, entries)."""
    S = pool.slab_size
    world = pool.world
    counts = [-(-src.nbytes // S) for _, src in items]
    total = sum(counts)
    runs = plan(total, servers)
    made, keys_w, keys_r, sizes = [], {}, {}, {}
    try:
        for i, r in enumerate(servers):
            nm = entry(name, version, i)
            rep = world.server(r).request({"op": "name_alloc", "name": nm,
                                           "size": max(1, runs[r][1]) * S})
            made.append((r, nm))
            keys_w[r], keys_r[r], sizes[r] = rep["key"], rep["rkey"], rep["size"]
        wwin = _window(pool, keys_w, sizes, "rw")
        rwin = _window(pool, keys_r, sizes, "r")
        heap = _heap(pool, rwin, wwin)
        part = {r: i for i, r in enumerate(servers)}
        owner = []                      # global slab -> (server rank, slot)
        for r in servers:
            first, n = runs[r]
            owner += [(r, s) for s in range(n)]
        tensors, arrays, g = {}, {}, 0
        with progress.for_bytes(sum(src.nbytes for _, src in items), f"load {name}") as pb:
            for (key, src), n in zip(items, counts):
                mem = owner[g:g + n]
                _put(wwin, S, mem, src, pb)
                tensors[key] = {"dtype": files.dtype_name(src.dtype), "shape": list(src.shape),
                                "slabs": _runs([(part[r], s) for r, s in mem])}
                arrays[key] = _array(pool, heap, src.dtype, src.shape, mem)
                g += n
        pool.write_win[heap] = None
        parts = [{"server": identity(world.server(r)), "entry": nm} for r, nm in made]
        manifest = {"name": name, "version": version, "slab": S, "parts": parts,
                    "tensors": tensors, "metadata": metadata, "time": time.time()}
        return manifest, arrays, heap, made
    except BaseException:
        for r, nm in made:
            try:
                world.server(r).request({"op": "name_drop", "name": nm})
            except Exception:
                pass
        raise


def _put(win, S, mem, src, pb):
    """src's bytes into its slabs, a run of consecutive slots on one server per put."""
    flat = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
    k = 0
    while k < len(mem):
        r, s = mem[k]
        j = k + 1
        while j < len(mem) and mem[j] == (r, s + j - k) and (j - k) * S < PUT_RUN:
            j += 1
        chunk = flat[k * S:j * S]
        if chunk.nbytes:
            win.put(r, s * S, np.ascontiguousarray(chunk))
            pb.update(chunk.nbytes)
        k = j


def _runs(mem):
    out = []
    for r, s in mem:
        if out and out[-1][0] == r and out[-1][1] + out[-1][2] == s:
            out[-1][2] += 1
        else:
            out.append([r, s, 1])
    return out


def _array(pool, heap, dtype, shape, mem):
    n = 1
    for d in shape:
        n *= d
    members = [r for r, _ in mem]
    slots = [s for _, s in mem]
    a = Allocation(pool, next(_aids), n * dtype.itemsize, heap, members, slots)
    return ndarray(a, 0, tuple(shape), layout.c_strides(tuple(shape), dtype.itemsize), dtype)


def read_manifest(world, name):
    """The manifest of store `name`'s current version (None if there is no such store)."""
    d = directory(world)
    try:
        rep = d.request({"op": "name_get", "name": pointer(name)})
    except ServerRefused as e:
        if missing(e):
            return None
        raise
    try:
        d.request({"op": "name_release", "name": pointer(name)})
    except ServerRefused:
        pass
    return msgpack.unpackb(rep["meta"], raw=False) if rep["meta"] else None


def attach(pool, manifest):
    """Hold the parts of a manifest's version and build its arrays here: ({key: ndarray},
    heap, held) or None when the version went in between (published over and dropped)."""
    world = pool.world
    by_id = ranks_by_identity(world)
    held, keys, sizes = [], {}, {}
    rank_of = {}
    try:
        for i, p in enumerate(manifest["parts"]):
            r = by_id.get(tuple(p["server"]))
            if r is None:
                raise ValueError(f"store {manifest['name']!r} lives partly on server "
                                 f"{p['server'][0]} (pid {p['server'][1]}), which this "
                                 f"pool is not connected to")
            try:
                rep = world.server(r).request({"op": "name_get", "name": p["entry"]})
            except ServerRefused as e:
                if missing(e):
                    release(world, held)
                    return None
                raise
            held.append((r, p["entry"]))
            keys[r], sizes[r], rank_of[i] = rep["key"], rep["size"], r
        if manifest.get("slab") != pool.slab_size:
            raise ValueError(f"store {manifest['name']!r} was made with slabs of "
                             f"{manifest.get('slab')} B, this pool's are {pool.slab_size} B: "
                             f"init(slab_size={manifest.get('slab')})")
        heap = _heap(pool, _window(pool, keys, sizes, "r"))
        arrays = {}
        for key, t in manifest["tensors"].items():
            mem = [(rank_of[i], s + j) for i, s, n in t["slabs"] for j in range(n)]
            arrays[key] = _array(pool, heap, files.parse_dtype(t["dtype"]), t["shape"], mem)
        return arrays, heap, held
    except BaseException:
        release(world, held)
        raise


def release(world, held):
    for r, nm in held:
        try:
            world.server(r).request({"op": "name_release", "name": nm})
        except Exception:
            pass


def publish(world, name, manifest, first):
    """Make `manifest` the current version of `name` (one assignment on the directory
    server). first: the pointer must be new (a load, not a publish)."""
    d = directory(world)
    if first:
        try:
            d.request({"op": "name_alloc", "name": pointer(name), "size": 0})
        except ServerRefused as e:
            if "taken" in str(e):
                raise ValueError(f"a store named {name!r} exists on the servers: publish() "
                                 f"replaces it, drop() removes it") from None
            raise
    d.request({"op": "name_set", "name": pointer(name),
               "meta": msgpack.packb(manifest, use_bin_type=True)})


def drop_entries(world, manifest):
    by_id = ranks_by_identity(world)
    for p in manifest["parts"]:
        r = by_id.get(tuple(p["server"]))
        if r is not None:
            try:
                world.server(r).request({"op": "name_drop", "name": p["entry"]})
            except ServerRefused as e:
                if not missing(e):
                    raise


def listing(world):
    """{name: manifest} of every store on the directory server."""
    rep = directory(world).request({"op": "name_list"})
    out = {}
    for n in rep["names"]:
        nm = n["name"]
        if nm.startswith(PREFIX) and "@" not in nm and n["meta"]:
            out[nm[len(PREFIX):]] = msgpack.unpackb(n["meta"], raw=False)
    return out


def drop(world, name):
    """Remove store `name` from the servers: False if there was none."""
    m = read_manifest(world, name)
    try:
        directory(world).request({"op": "name_drop", "name": pointer(name)})
    except ServerRefused as e:
        if missing(e):
            return False
        raise
    if m is not None:
        drop_entries(world, m)
    return True
