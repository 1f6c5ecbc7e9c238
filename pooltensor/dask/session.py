"""attach(client): the client and its Dask workers become one pool; detach() ends it.

The client process is member 0 and holds the allocator, as a plain script does; every worker
present at attach() is a member 1..N lending ``memory`` bytes (member.py). The client lends
one slab only (under dask-mpi the ranks that run the scheduler and the client lend nothing of
use): new arrays are placed on the workers (``block`` over members 1..N by default).

Workers that join later (``cluster.scale(...)``, a restarted worker under a new address) are
not members: a world's size is fixed when it is made, and the pool's arrays live in it. The
rule: pool work is never pinned to them, and while they are in the cluster Watch keeps every
new task that takes pool chunks (directly or through other tasks) on the members, so they
never hold slab views; Dask still runs other work there. Watch reports each one (a log line on the scheduler, and a
``LateWorkerWarning`` at the client's next pool call); to make it a member, detach() and
attach() again (the pool's arrays end with detach()).

Homes (``Watch``): a task that takes chunks homed on two workers gets one of them as a copy
(a handle: the bytes are read in place). Dask keeps such copies and counts each as the whole
chunk, so later work on the chunk, and that work's other inputs, would be drawn to the copy's
worker; Watch drops a copy once the task that took it is done.

Faults (``Watch``, a SchedulerPlugin): a task pinned to a worker's slabs can only run there;
when that worker is gone, Dask would leave the task waiting for it forever ("no-worker").
Watch fails such tasks at once with ``PeerLost`` naming the member and the worker, when the
worker is removed and for any task pinned to it later. The other members keep working.
"""
import atexit
import secrets
import threading

from collectives.errors import PeerLost

from ..pool import runtime, spawn
from ..pool.pool import DEFAULT_SLAB, Pool, check_slab_size
from . import member, views

WATCH = "pooltensor-watch"
TOPIC = "pooltensor"     # the scheduler's events to the client (late workers)


class LateWorkerWarning(UserWarning):
    """A Dask worker joined the cluster after attach(): it is not a pool member."""


_attached = {}           # the client side: "client", "pool", "ranks" (address -> rank)


def _bytes(v, what):
    if isinstance(v, str):
        from dask.utils import parse_bytes
        try:
            return int(parse_bytes(v))
        except (ValueError, TypeError):
            raise ValueError(f"{what} must be a number of bytes or a size like '8GiB', "
                             f"not {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{what} must be a number of bytes or a size like '8GiB', not "
                        f"{type(v).__name__}")
    return int(v)


def _coordinator(addresses):
    """host:port the workers reach the client's rendezvous at (loopback when every worker
    is on this machine's loopback, else the address this host reaches them from)."""
    from collectives.launch import free_port
    from distributed.comm import get_address_host
    from distributed.utils import get_ip
    hosts = {get_address_host(a) for a in addresses}
    local = {"127.0.0.1", "localhost", "::1"}
    host = "127.0.0.1" if hosts <= local else get_ip(sorted(hosts - local)[0])
    return f"{host}:{free_port()}"


def _budget(addrs, mem, S):
    """Warn when the workers on this machine would lend more than its RAM (each lends two
    heaps of `mem`, virtual until touched: the pool could not be filled without swapping)."""
    import socket
    import warnings
    from distributed.comm import get_address_host
    from ..pool.allocation import physical_memory
    mine = {"127.0.0.1", "localhost", "::1", socket.gethostname()}
    try:
        mine.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    here = sum(1 for a in addrs if get_address_host(a) in mine)
    lent = here * 2 * (mem // S * S)
    ram = physical_memory()
    if lent > ram:
        warnings.warn(f"the {here} Dask workers on this machine would lend {lent} bytes to "
                      f"the pool (2 heaps of memory={mem} each), more than its {ram} bytes "
                      f"of RAM: lower memory= unless most of it stays unused",
                      ResourceWarning, stacklevel=3)


def attach(client, memory="8GiB", *, slab_size=None, cache_bytes=None, timeout=None,
           attach=None, workers=None):
    """Make `client`'s process and its Dask workers one pool and return it (the process's
    pool from then on: pooltensor.zeros() and friends place arrays on the workers).

    memory: bytes each worker lends to each of its two heaps (read-write and read-only;
    virtual until touched), a number or a size such as ``"8GiB"``. Each worker's Dask
    memory limit (and its nanny's) is raised by what it lends, so pool pages do not count
    against the memory Dask manages. slab_size, cache_bytes, timeout, attach: as for
    pooltensor.init(). workers: the worker addresses to make members (default: all present).

    Call pooltensor.dask.detach() (or pooltensor.finalize()) before closing the cluster.
    """
    if _attached:
        raise ValueError("a pool is already attached to a Dask client; call "
                         "pooltensor.dask.detach() first")
    mem = _bytes(memory, "memory")
    S = check_slab_size(DEFAULT_SLAB if slab_size is None else slab_size)
    if mem < S:
        raise ValueError(f"memory ({mem} B) is less than one slab ({S} B)")
    present = sorted(client.scheduler_info(n_workers=-1)["workers"])
    addrs = present if workers is None else [str(w) for w in workers]
    missing = sorted(set(addrs) - set(present))
    if missing:
        raise ValueError(f"workers not in the cluster: {missing}")
    if not addrs:
        raise ValueError("the Dask cluster has no workers to make pool members")
    if runtime.current(required=False) is not None:
        raise ValueError("pooltensor is already initialized in this process; call "
                         "pooltensor.finalize() first")
    _budget(addrs, mem, S)
    ranks = {a: r for r, a in enumerate(addrs, 1)}
    n = len(addrs) + 1
    coord = _coordinator(addrs)
    token = secrets.token_hex(8)
    cfg = {"slab_size": S, "memory": mem, "cache_bytes": cache_bytes, "timeout": timeout,
           "token": token, "versions": True}
    views.register()
    made, failed = [], []

    def join():
        try:
            world = spawn.join(0, n, coord, timeout)
            made.append(Pool(world, role="plain", slab_size=S, memory=S,
                             cache_bytes=cache_bytes, placement=tuple(range(1, n)),
                             attach=attach, versions=True))
        except BaseException as e:        # noqa: BLE001  (raised in attach below)
            failed.append(e)

    t = threading.Thread(target=join, name="pooltensor-attach", daemon=True)
    t.start()
    try:
        try:
            client.register_plugin(member.NannyLimit(member.lent(cfg)))
        except Exception:                 # noqa: BLE001  (workers without nannies)
            pass
        client.register_plugin(member.Member(ranks, n, coord, cfg))
    finally:
        t.join()
    if failed:
        raise failed[0]
    pool = made[0]
    pool.exclusive = False                # the workers write next to this process
    pool.token = token
    pool.dask_ranks = ranks
    runtime.adopt(pool, memory=mem)
    atexit.unregister(_at_exit)       # at exit: detach before the pool's own finalize
    atexit.register(_at_exit)
    member.set_process_pool(pool)
    _attached.update(client=client, pool=pool, ranks=ranks, late=[], warned=set())
    client.subscribe_topic(TOPIC, _on_event)
    client.register_plugin(Watch(ranks), name=WATCH)
    return pool


def _on_event(event):
    """(On the client's event thread.) The scheduler saw a worker that is not a member."""
    _, msg = event
    if isinstance(msg, dict) and msg.get("late") and "late" in _attached:
        _attached["late"].append(msg["late"])


def late_workers():
    """Workers that joined the cluster after attach() (not pool members), as reported."""
    return sorted(set(_attached.get("late", ())))


def _warn_late():
    import warnings
    new = [w for w in late_workers() if w not in _attached["warned"]]
    if new:
        _attached["warned"].update(new)
        warnings.warn(f"Dask worker(s) {new} joined the cluster after "
                      f"pooltensor.dask.attach(): they are not pool members (a pool's world "
                      f"cannot grow), so no pool work runs there; detach() and attach() "
                      f"again to make them members", LateWorkerWarning, stacklevel=3)


def attached(required=True):
    """(client, pool, ranks) of the attached pool; RuntimeError when there is none."""
    pool = _attached.get("pool")
    if pool is None or pool.closed:
        if required:
            raise RuntimeError("no pool is attached to a Dask client: call "
                               "pooltensor.dask.attach(client) first")
        return None
    _warn_late()
    return _attached["client"], pool, _attached["ranks"]


def detach():
    """End the pool made by attach(): the workers and this process leave it together (its
    arrays are gone; the cluster keeps running)."""
    got = attached(required=False)
    _attached.clear()
    if got is None:
        return
    client = got[0]
    try:
        client.unsubscribe_topic(TOPIC)
    except Exception:                     # noqa: BLE001
        pass
    t = threading.Thread(target=member.leave, name="pooltensor-detach", daemon=True)
    t.start()
    try:
        client.unregister_worker_plugin(member.PLUGIN)
    except Exception:                     # noqa: BLE001  (workers already gone)
        pass
    t.join()
    for name in (WATCH, member.NANNY_PLUGIN):
        try:
            if name == WATCH:
                client.run_on_scheduler(_drop_watch)
            else:
                client.unregister_worker_plugin(name, nanny=True)
        except Exception:                 # noqa: BLE001
            pass


async def _drop_watch(dask_scheduler=None):
    plugin = dask_scheduler.plugins.get(WATCH)
    if plugin is not None:
        await plugin.close()
    dask_scheduler.remove_plugin(name=WATCH)


async def keep_local(scheduler, saved=None):
    """Make the scheduler place every task that has inputs by where its inputs are, or (with
    `saved`) undo it; returns what to pass to undo it. Two of Dask's heuristics move work
    away from its data, which costs whole chunks here: work stealing (an idle worker takes
    tasks, fetching their inputs) and queuing of "root-ish" tasks (a large task group whose
    inputs are a few tasks, such as the chunks of a small pool array, is placed ignoring
    where the inputs are). While a pool is attached, stealing is stopped and only tasks
    without inputs count as root-ish."""
    steal = scheduler.extensions.get("stealing")
    if saved is None:
        saved = {"threshold": scheduler.rootish_tg_dependencies_threshold,
                 "stealing": steal is not None and "stealing" in scheduler.periodic_callbacks}
        scheduler.rootish_tg_dependencies_threshold = 1
        if saved["stealing"]:
            await steal.stop()
        return saved
    scheduler.rootish_tg_dependencies_threshold = saved["threshold"]
    if saved["stealing"] and steal is not None:
        await steal.start()
    return saved


def _at_exit():
    if _attached:
        try:
            detach()
        except Exception:                 # noqa: BLE001  (the cluster is going too)
            pass


CHUNKS = "pooltensor-"      # the name of every to_dask() chunk's key (arrays.py)


def key_name(key):
    """The name part of a Dask key (a string, or the first item of a tuple key)."""
    while isinstance(key, tuple) and key:
        key = key[0]
    return key if isinstance(key, str) else str(key)


def lost_error(rank, worker, key):
    """The PeerLost a task pinned to a lost member's slabs fails with."""
    return PeerLost(f"pool member {rank} (Dask worker {worker}) was lost: the slabs it homed "
                    f"are gone, so task {key!r}, pinned to them, cannot run", rank=rank)


try:
    from distributed.diagnostics.plugin import SchedulerPlugin
except ImportError:                       # pragma: no cover  (distributed is a dependency)
    SchedulerPlugin = object


class Watch(SchedulerPlugin):
    """On the scheduler: fails tasks pinned to a lost member's worker with PeerLost instead
    of leaving them to wait for it, keeps pool work off workers that are not members, and
    drops copies of pool chunks held away from their homes (see the module docstring)."""

    name = WATCH

    def __init__(self, ranks):
        self.ranks = dict(ranks)
        self.lost = set()
        self.late = set()

    def update_graph(self, scheduler, *, tasks=(), **kwargs):
        """While workers that are not members are in the cluster: keep every new task that
        takes pool chunks (to_dask()'s, or views made of them), directly or through other
        tasks, on the members, so no slab view reaches a process outside the pool."""
        if not self.late:
            return
        members = (set(self.ranks) - self.lost) or set(self.ranks)  # all lost: PeerLost
        memo = {}

        def pooled(ts):
            stack = [ts]
            while stack:
                t = stack[-1]
                if t.key in memo:
                    stack.pop()
                    continue
                if key_name(t.key).startswith(CHUNKS):
                    memo[t.key] = True
                    stack.pop()
                    continue
                todo = [d for d in t.dependencies if d.key not in memo]
                if todo:
                    stack.extend(todo)
                    continue
                memo[t.key] = any(memo[d.key] for d in t.dependencies)
                stack.pop()
            return memo[ts.key]

        for key in tasks:
            ts = scheduler.tasks.get(key)
            if (ts is None or ts.state not in ("released", "waiting") or ts.worker_restrictions
                    or not pooled(ts)):
                continue
            ts.worker_restrictions = set(members)
            ts.loose_restrictions = False

    async def start(self, scheduler):
        """Remember the scheduler (to fail tasks pinned later) and make it place by data
        (see keep_local)."""
        self.scheduler = scheduler
        self.saved = await keep_local(scheduler)

    async def close(self):
        """Give the scheduler back its own placement settings."""
        s, saved = getattr(self, "scheduler", None), getattr(self, "saved", None)
        if s is not None and saved is not None:
            await keep_local(s, saved)

    def add_worker(self, scheduler, worker):
        """A worker joined after attach(): not a member (see the module docstring)."""
        if worker not in self.ranks:
            self.late.add(worker)
            import logging
            logging.getLogger("pooltensor.dask").warning(
                "pooltensor: Dask worker %s joined after attach(): not a pool member", worker)
            scheduler.log_event(TOPIC, {"late": worker})

    def remove_worker(self, scheduler, worker, *, stimulus_id, **kwargs):
        """A member's worker is gone: fail what is pinned to it."""
        if worker not in self.ranks:
            return
        self.lost.add(worker)
        self._fail(scheduler, [ts.key for ts in list(scheduler.unrunnable)], stimulus_id)

    def transition(self, key, start, finish, *args, stimulus_id=None, **kwargs):
        """A task pinned to a lost member became unrunnable: fail it; a task that took a
        pool chunk on another worker than its home finished: drop that copy (both after
        this transition)."""
        s = getattr(self, "scheduler", None)
        if s is None:
            return
        if finish == "no-worker" and self.lost:
            s.loop.add_callback(self._fail, s, [key], f"pooltensor-lost-{key}")
        elif start == "processing" and finish == "memory":
            ts = s.tasks.get(key)
            if ts is not None and any(len(d.who_has) > 1 and d.worker_restrictions
                                      and key_name(d.key).startswith(CHUNKS)
                                      for d in ts.dependencies):
                s.loop.add_callback(self._drop_copies, s, key)

    def _drop_copies(self, scheduler, key):
        """Forget the copies of `key`'s pool-chunk inputs held away from their homes once
        no task waiting there needs them. A copy is a handle (reading it costs nothing
        more), but the scheduler counts it as the chunk: left there, it would draw later
        tasks on the chunk away from the worker that homes the chunk's slabs, and their
        other inputs after them."""
        ts = scheduler.tasks.get(key)
        if ts is None:
            return
        for d in ts.dependencies:
            if not (key_name(d.key).startswith(CHUNKS) and d.worker_restrictions
                    and len(d.who_has) > 1 and d.state == "memory"):
                continue
            busy = {w.processing_on for w in d.waiters if w.processing_on is not None}
            for ws in list(d.who_has):
                if (len(d.who_has) > 1 and ws.address not in d.worker_restrictions
                        and ws not in busy and ws.address in scheduler.workers):
                    scheduler.request_remove_replicas(ws.address, [d.key],
                                                      stimulus_id=f"pooltensor-home-{key}")

    def _fail(self, scheduler, keys, stimulus_id):
        recs = {}
        for key in keys:
            ts = scheduler.tasks.get(key)
            if ts is None or ts.state != "no-worker" or ts.loose_restrictions:
                continue
            hosts = ts.worker_restrictions or set()
            if not hosts or not hosts <= self.lost:
                continue
            worker = sorted(hosts)[0]
            from distributed.protocol import pickle
            exc = lost_error(self.ranks[worker], worker, key)
            recs.update(scheduler.transition(key, "erred", exception=pickle.dumps(exc),
                                             exception_text=str(exc), traceback=None,
                                             cause=key, stimulus_id=stimulus_id))
        if recs:
            scheduler.transitions(recs, stimulus_id)
