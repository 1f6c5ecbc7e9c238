"""Stores on memory servers: tensors in named server memory that outlives its loader.

Why: a client's pool memory on a server is freed when the client leaves, but weights are
loaded once for readers that come later (another script, on another machine, connected to
the same servers). So a store version on servers lives in *named* allocations
(pool/names.py): one per server holding part of it, ``store:NAME@V/I``, and a pointer entry
``store:NAME`` (no memory) on every server, whose metadata is the version's manifest
(msgpack), so that the registry outlives any one server. Publishing a version is one
assignment of that metadata on each server: a reader takes the newest version any server
names. The loader then drops the old version's entries; a
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

from collectives.errors import PeerLost
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
    """The servers that keep the pointers, as (rank, control connection): every server this
    client is connected to that answers (a lost one is skipped)."""
    return [(r, world.server(r)) for r in range(1, world.size)
            if not world._ctx.peer_lost(r)]


def _ask(srv, msg):
    """srv.request(msg), or None when the server is gone (PeerLost: it is skipped)."""
    try:
        return srv.request(msg)
    except PeerLost:
        return None


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


def write(pool, name, version, items, servers, metadata, copies=1):
    """Make version `version` of store `name` on `servers` (ranks): items is [(key, numpy
    source)] in order. The version's slabs are cut into one part per server (plan); with
    copies > 1, copy j of part i goes to the server j places after part i's, so the copies
    of a part are on distinct servers. Each server keeps what it holds of every copy in one
    named allocation (one key per server: any mix of copies reads through one window).
    Returns (manifest dict, {key: ndarray} over copy 0, heap, [(rank, entry)] made)."""
    S = pool.slab_size
    world = pool.world
    if not 1 <= copies <= len(servers):
        raise ValueError(f"replicas={copies} needs as many servers, and the store may use "
                         f"{len(servers)}")
    counts = [-(-src.nbytes // S) for _, src in items]
    runs = plan(sum(counts), servers)
    used = {r: 0 for r in servers}
    rows = []                         # per copy, per part: (server rank, first slot, count)
    for j in range(copies):
        homes = servers[j:] + servers[:j]
        row = []
        for i, r0 in enumerate(servers):
            r, n = homes[i], runs[r0][1]
            row.append((r, used[r], n))
            used[r] += n
        rows.append(row)
    made, ents, keys_w, keys_r, sizes = [], [], {}, {}, {}
    try:
        for i, r in enumerate(servers):
            nm = entry(name, version, i)
            rep = world.server(r).request({"op": "name_alloc", "name": nm, "pending": True,
                                           "size": max(1, used[r]) * S})
            made.append((r, nm))
            keys_w[r], keys_r[r], sizes[r] = rep["key"], rep["rkey"], rep["size"]
            ents.append({"server": identity(world.server(r)), "entry": nm,
                         "count": used[r]})
        at = {r: i for i, r in enumerate(servers)}
        wwin = _window(pool, keys_w, sizes, "rw")
        heap = _heap(pool, _window(pool, keys_r, sizes, "r"))
        owners = [[(r, first + s) for r, first, n in row for s in range(n)] for row in rows]
        part_of = [(i, s) for i, (_, _, n) in enumerate(rows[0]) for s in range(n)]
        tensors, arrays, g = {}, {}, 0
        nbytes = sum(src.nbytes for _, src in items) * copies
        with progress.for_bytes(nbytes, f"load {name}") as pb:
            for (key, src), n in zip(items, counts):
                for owner in owners:
                    _put(wwin, S, owner[g:g + n], src, pb)
                tensors[key] = {"dtype": files.dtype_name(src.dtype), "shape": list(src.shape),
                                "slabs": _runs(part_of[g:g + n])}
                arrays[key] = _array(pool, heap, src.dtype, src.shape, owners[0][g:g + n])
                _track(pool, name, key, arrays[key],
                       [[o[x] for o in owners] for x in range(g, g + n)])
                g += n
        layouts = [[{"at": at[r], "first": first, "count": n} for r, first, n in row]
                   for row in rows]
        manifest = {"name": name, "version": version, "slab": S, "entries": ents,
                    "layouts": layouts, "replicas": [], "tensors": tensors,
                    "metadata": metadata, "time": time.time()}
        return manifest, arrays, heap, made
    except BaseException:
        _drop_made(world, made)
        raise


def _drop_made(world, made):
    """Drop the named allocations made so far ((server, name) pairs): a load or a replication
    that fails leaves nothing behind. Best effort: a server that is gone holds nothing more."""
    for r, nm in made:
        try:
            world.server(r).request({"op": "name_drop", "name": nm})
        except Exception:
            pass


def entries(manifest):
    """Every named allocation of a version: what each server holds of it, its replicas."""
    return [*manifest["entries"], *manifest.get("replicas", [])]


def nslabs(manifest):
    return sum(p["count"] for p in manifest["layouts"][0])


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


def _track(pool, name, key, arr, mem):
    """Give the pool's keeper tensor `arr` of store `name`, whose slab k has its copies at
    mem[k] ([(server, slot)], the first read): a server lost while it is read is read
    around (the keeper repoints the slab to its next copy), and a slab left without one
    raises PeerLost naming the tensor and the server. It wants one copy: the keeper
    restores none (a store's copies are the servers' named memory, not the pool's)."""
    a = arr._a
    if any(len(c) > 1 for c in mem):
        a.copies = [[*c] for c in mem]
    pool.keeper.allocs[a] = ((f"tensor {key!r} of store {name!r}", arr.shape, arr.dtype), 1)


def read_manifest(world, name):
    """The manifest of store `name`'s current version (None if there is no such store): the
    newest version any server's pointer names (a publish sets every server's in turn).
    PeerLost when no server answers (the store may be there, unseen)."""
    best = None
    servers = directory(world)
    if not servers and world.size > 1:
        raise PeerLost(f"no memory server answers (lost: {world.hosts[1:]}): cannot look "
                       f"up store {name!r}", rank=1, host=world.hosts[1])
    for r, d in servers:
        try:
            rep = _ask(d, {"op": "name_get", "name": pointer(name)})
        except ServerRefused as e:
            if missing(e):
                continue
            raise
        if rep is None:
            continue
        try:
            d.request({"op": "name_release", "name": pointer(name)})
        except (ServerRefused, PeerLost):
            pass
        if rep["meta"]:
            m = msgpack.unpackb(rep["meta"], raw=False)
            if best is None or m["version"] > best["version"]:
                best = m
    return best


def attach(pool, manifest, replica=None):
    """Hold a version's server allocations and its full replicas and build its arrays here:
    ({key: ndarray}, heap, held), or None when the version went in between (published over
    and dropped). Each part is read from its first copy on a server that answers (from
    `replica`, a full replica, first when given); PeerLost when a part has none. Every
    other copy is known to the arrays (Allocation.copies, the pool's keeper): a server lost
    while they are read is read around (pool/replicas.py), and PeerLost names it only when
    a slab has no copy left."""
    world = pool.world
    by_id = ranks_by_identity(world)
    ents = manifest["entries"]
    reps = [rp for rp in manifest.get("replicas", [])
            if replica is None or rp["entry"] != replica["entry"]]
    todo = ([("r", replica)] if replica is not None else []) + \
        [(i, p) for i, p in enumerate(ents)] + [("r", rp) for rp in reps]
    held, keys, sizes, kind, lost, unknown = [], {}, {}, {}, [], []
    try:
        for what, p in todo:
            r = by_id.get(tuple(p["server"]))
            if r is None:
                unknown.append(p["server"])
                continue
            if r in keys or r in lost:
                continue              # one key per server: another copy there adds nothing
            try:
                rep = world.server(r).request({"op": "name_get", "name": p["entry"]})
            except ServerRefused as e:
                if not missing(e):
                    raise
                if what == "r":
                    continue          # a replica dropped: the other copies still read
                release(world, held)
                return None           # the version is gone
            except PeerLost:
                lost.append(r)
                continue
            held.append((r, p["entry"]))
            keys[r], sizes[r], kind[r] = rep["key"], rep["size"], what
        if manifest.get("slab") != pool.slab_size:
            raise ValueError(f"store {manifest['name']!r} was made with slabs of "
                             f"{manifest.get('slab')} B, this pool's are {pool.slab_size} B: "
                             f"init(slab_size={manifest.get('slab')})")
        at = [by_id.get(tuple(p["server"])) for p in ents]
        whole = [r for r in keys if kind[r] == "r"]      # servers read from a full replica
        first = manifest["layouts"][0]
        starts = np.cumsum([0] + [p["count"] for p in first]).tolist()
        copies = []                   # per part: [(server, first slot)], the first is read
        for i in range(len(first)):
            cs = [(at[row[i]["at"]], row[i]["first"]) for row in manifest["layouts"]
                  if kind.get(at[row[i]["at"]]) == row[i]["at"]]
            full = [(r, starts[i]) for r in whole]
            cs = full + cs if replica is not None else cs + full
            if not cs:
                if unknown and not lost:
                    raise ValueError(f"store {manifest['name']!r} lives partly on server "
                                     f"{unknown[0][0]} (pid {unknown[0][1]}), which this "
                                     f"pool is not connected to")
                raise PeerLost(f"store {manifest['name']!r}: part {i} has no copy on a "
                               f"memory server that answers (lost: "
                               f"{[world.hosts[r] for r in lost]})",
                               rank=lost[0] if lost else None,
                               host=world.hosts[lost[0]] if lost else None)
            copies.append(cs)
        heap = _heap(pool, _window(pool, keys, sizes, "r"))
        arrays = {}
        for key, t in manifest["tensors"].items():
            mem = [[(r, s0 + s + j) for r, s0 in copies[i]] for i, s, n in t["slabs"]
                   for j in range(n)]
            dtype = files.parse_dtype(t["dtype"])
            arrays[key] = _array(pool, heap, dtype, t["shape"], [c[0] for c in mem])
            _track(pool, manifest["name"], key, arrays[key], mem)
        return arrays, heap, held
    except BaseException:
        release(world, held)
        raise


def local_replica(world, manifest):
    """A full replica of the version on a server of this machine, or None."""
    from collectives.rendezvous.bootstrap import machine_identity
    here = machine_identity()
    by_id = ranks_by_identity(world)
    for rp in manifest.get("replicas", []):
        r = by_id.get(tuple(rp["server"]))
        if r is not None and world.server(r).facts.get("machine") == here:
            return rp
    return None


class ReplicationError(RuntimeError):
    """replicate() could not give every member a complete copy (a source lost, no other)."""


def _route(world, by_id, ents, row, S, keys):
    """Copy `row` of a version (per part: entry index, first slot, count) as a pull route;
    keys: entry index -> (server, r key), filled as entries are first held."""
    route, dst = [], 0
    for p in row:
        srv, key = keys[p["at"]]
        n = p["count"] * S
        if n:
            route.append({"ip": srv.ip, "port": srv.data_port, "key": key,
                          "off": p["first"] * S, "len": n, "dst": dst, "prog": None})
        dst += n
    return route


def _hold_all(world, by_id, ents, holds):
    """Hold every entry of `ents` that answers: {index: (server, r key)}."""
    keys = {}
    for i, p in enumerate(ents):
        r = by_id.get(tuple(p["server"]))
        if r is None:
            continue
        try:
            rep = world.server(r).request({"op": "name_get", "name": p["entry"]})
        except (ServerRefused, PeerLost):
            continue
        holds.append((r, p["entry"]))
        keys[i] = (world.server(r), int(rep["key"]))
    return keys


def replicate(pool, manifest, members, timeout):
    """Copy the version to each server of `members` (ranks), in a chain: each member reads
    from the one before it while that one receives (pool/pull.py); when a source fails,
    from the version's own parts or their copies. Returns the manifest with the replicas
    added (not yet published)."""
    world = pool.world
    S = manifest["slab"]
    total = nslabs(manifest) * S
    by_id = ranks_by_identity(world)
    holds, made = [], []
    try:
        keys = _hold_all(world, by_id, manifest["entries"], holds)
        fallback = [_route(world, by_id, manifest["entries"], row, S, keys)
                    for row in manifest["layouts"] if all(p["at"] in keys for p in row)]
        reps = manifest.get("replicas", [])
        rkeys = _hold_all(world, by_id, reps, holds)
        fallback += [_route(world, by_id, reps, [{"at": i, "first": 0, "count": total // S}],
                            S, rkeys) for i in rkeys]
        prev = None
        n0 = len(manifest.get("replicas", []))
        for k, r in enumerate(members):
            srv = world.server(r)
            nm = entry(manifest["name"], manifest["version"], f"full{n0 + k}")
            rep = srv.request({"op": "name_alloc", "name": nm, "size": total + 8,
                               "pending": True})
            made.append((r, nm))
            chain = [[{"ip": prev[0].ip, "port": prev[0].data_port, "key": prev[1], "off": 0,
                       "len": total, "dst": 0, "prog": total}]] if prev else []
            srv.request({"op": "name_pull", "name": nm, "total": total,
                         "routes": chain + fallback, "timeout": float(timeout)})
            prev = (srv, int(rep["rkey"]))
        _wait(world, made, total, timeout * (len(members) + 1))
        out = dict(manifest)
        out["replicas"] = [*manifest.get("replicas", [])] + [
            {"server": identity(world.server(r)), "entry": nm,
             "count": total // S} for r, nm in made]
        return out
    except BaseException:
        _drop_made(world, made)
        raise
    finally:
        release(world, holds)


def _wait(world, made, total, timeout):
    """Until every pull of `made` is complete: ReplicationError naming the first that
    failed, or Timeout."""
    deadline = time.monotonic() + timeout
    left = dict(made)
    while left:
        for r in sorted({r for r in left}):
            got = {n["name"]: n for n in world.server(r).request({"op": "name_list"})["names"]}
            nm = left[r]
            st = got.get(nm)
            if st is None or st["pulled"] == -1:
                why = st["error"] if st else "the entry is gone"
                raise ReplicationError(f"replication to memory server {world.hosts[r]} "
                                       f"failed: {why}")
            if st["pulled"] >= total:
                del left[r]
        if left and time.monotonic() > deadline:
            from collectives.errors import Timeout
            raise Timeout(f"replication not complete within {timeout:.0f} s "
                          f"(waiting for {[world.hosts[r] for r in left]})")
        if left:
            time.sleep(0.01)


def keep(world, made):
    """The entries `made` ([(rank, name)]) outlive this connection from now on."""
    for r, nm in made:
        world.server(r).request({"op": "name_keep", "name": nm})


def release(world, held):
    for r, nm in held:
        try:
            world.server(r).request({"op": "name_release", "name": nm})
        except Exception:
            pass


def publish(world, name, manifest, first):
    """Make `manifest` the current version of `name`: one assignment of each server's
    pointer (so the pointers outlive any one server). first: the pointer must be new (a
    load, not a publish)."""
    meta = msgpack.packb(manifest, use_bin_type=True)
    setting = {"op": "name_set", "name": pointer(name), "meta": meta}
    made, told = [], 0
    for r, d in directory(world):
        if not first:                 # the pointer is there: set it (a gone server: skip)
            try:
                told += _ask(d, setting) is not None
                continue
            except ServerRefused as e:
                if not missing(e):
                    raise             # (missing: a server new to this store: make it)
        try:
            if _ask(d, {"op": "name_alloc", "name": pointer(name), "size": 0}) is None:
                continue
        except ServerRefused as e:
            if "taken" in str(e) and first:
                for d2 in made:
                    _ask(d2, {"op": "name_drop", "name": pointer(name)})
                raise ValueError(f"a store named {name!r} exists on the servers: publish() "
                                 f"replaces it, drop() removes it") from None
            raise
        made.append(d)
        d.request(setting)
        told += 1
    if not told:
        raise PeerLost(f"no memory server answered to publish store {name!r}")


def drop_entries(world, manifest):
    by_id = ranks_by_identity(world)
    for p in entries(manifest):
        r = by_id.get(tuple(p["server"]))
        if r is not None:
            try:
                _ask(world.server(r), {"op": "name_drop", "name": p["entry"]})
            except ServerRefused as e:
                if not missing(e):
                    raise


def listing(world):
    """{name: manifest} of every store, the newest version any server's pointer names."""
    out = {}
    for r, d in directory(world):
        rep = _ask(d, {"op": "name_list"})
        for n in (rep or {}).get("names", []):
            nm = n["name"]
            if nm.startswith(PREFIX) and "@" not in nm and n["meta"]:
                m = msgpack.unpackb(n["meta"], raw=False)
                old = out.get(nm[len(PREFIX):])
                if old is None or m["version"] > old["version"]:
                    out[nm[len(PREFIX):]] = m
    return out


def drop(world, name):
    """Remove store `name` from the servers: False if there was none."""
    m = read_manifest(world, name)
    found = False
    for r, d in directory(world):
        try:
            found = _ask(d, {"op": "name_drop", "name": pointer(name)}) is not None or found
        except ServerRefused as e:
            if not missing(e):
                raise
    if m is not None:
        drop_entries(world, m)
    return found
