"""The World: who the ranks are, where they live, and how to reach each one.

Bootstrapped once per process (mpiexec, POOLTENSOR_* variables and a TCP rendezvous, or a world
of one). Endpoint records are exchanged as msgpack through the rendezvous store; same-machine
peers then map each other's control blocks, so barriers and one-sided transfers between them go
through shared memory with no store traffic. Peers on other machines (or every peer, with
POOLTENSOR_TRANSPORT=tcp) are reached over tcp: every rank then listens, publishes host:port in
a second round of records, and connects to each tcp peer at once, so that a peer that dies is
seen even before any transfer to it; connections authenticate with the pool's secret.
"""
import os
import socket
import threading
import time

import msgpack

from . import _native, counters, env, transport
from .log import logger as _log
from . import log as _logging
from .transport import verbs as verbs_py
from .calls import Calls, board_bytes
from .errors import Finalized, PeerLost, Timeout, TransportError
from .rendezvous import store as _store
from .rendezvous.bootstrap import bootstrap, host_identity, machine_identity
from .window import LocalMemory, Window, raise_native

# read once: the algorithm choice is made on every call, a hot path for small messages
FORCED_ALGO = os.environ.get("POOLTENSOR_ALGO", "").strip()   # one algorithm for every kind
STORE_SLICE = 0.2   # seconds between checks for lost peers in a barrier through the store


class World(counters.Counted, LocalMemory):
    """The ranks of one job. Made by collectives.init(); do not build one directly."""

    def __init__(self, boot, timeout=None):
        self.timeout = _store.default_timeout() if timeout is None else float(timeout)
        self.rank, self.size = boot.rank, boot.size
        self.how = boot.how
        self._boot = boot
        self._store = boot.store
        self._seq = 0
        self._lock = threading.Lock()
        self._segments = {}
        threads = env.progress_threads()
        self._ctx = _native.Context(self.rank, self.size, threads)
        self._ctx.set_timeout(self.timeout)
        self._calls = None
        self._closed = self._closing = False
        # the board of the collective calls (collectives/calls.py): its key rides in this round
        board, _, board_key, board_len = self._register_local(board_bytes(self.size), "rw")
        me = {"rank": self.rank, "topo": host_identity(), "machine": machine_identity(),
              "host": os.environ.get("POOLTENSOR_HOST") or socket.gethostname(),
              "pid": os.getpid(), "ctrl": list(self._ctx.addr()), "force": transport.forced(),
              "board": board_key}
        recs = [msgpack.unpackb(b) for b in self._allgather_bytes(msgpack.packb(me), "world")]
        self.hosts = [r["host"] for r in recs]
        self.host = self.hosts[self.rank]
        self._tracker = counters.Tracker(self._ctx, self.hosts)   # (bandwidth: since now)
        # the topology (which ranks count as one host for hierarchical algorithms) may be
        # overridden by POOLTENSOR_HOST; reachability over shared memory is the real machine's
        topo = [r["topo"] for r in recs]
        ident = [r["machine"] for r in recs]
        self.pids = [r["pid"] for r in recs]
        self.transports = transport.choose(ident, self.rank)
        _logging.set_where(self.rank, self.host)
        _log.debug("joined a world of %d (%s); transports to each rank: %s", self.size,
                   self.how, " ".join(f"{r}:{t}" for r, t in enumerate(self.transports)))
        # a host, for the algorithms, is the ranks of one topology host that share memory:
        # with POOLTENSOR_TRANSPORT=tcp every rank is a host of its own
        self.local_ranks = [r for r in range(self.size) if topo[r] == topo[self.rank]
                            and self.transports[r] in ("self", "shm")]
        self.local_rank = self.local_ranks.index(self.rank)
        self.local_size = len(self.local_ranks)
        for r in range(self.size):
            if self.transports[r] == "shm":
                try:
                    self._ctx.connect(r, tuple(recs[r]["ctrl"]))
                except _native.Error as e:
                    raise_native(e, rank=r, host=self.hosts[r], what="connect")
        self._ctx.connected_all()
        self.listen_address = None
        self._ident = ident
        self._endpoints = None      # every rank's [host, port] once the tcp listeners are up
        self._served = False        # same-machine peers reach memory outside segments by tcp
        # every rank's choice of transport to every rank (each rank decides alike from these)
        self._choices = [transport.choose(ident, r, recs[r]["force"]) for r in range(self.size)]
        self.verbs = None           # this rank's verbs, in one line (describe())
        if transport.wants_verbs(ident, [r["force"] for r in recs]):
            self._choose_verbs(ident, recs)
        # tcp anywhere in the world (verbs peers too: the liveness channel and the fallback)
        if any(t in c for c in self._choices for t in transport.REMOTE):
            self._setup_tcp(ident)
        if any("verbs" in c for c in self._choices):
            self._setup_verbs()
        if env.number("POOLTENSOR_SPIN_US", None, float) is None:    # unset or empty
            # a peer with a core of its own answers within microseconds: poll for a while;
            # with more ranks than cores the peer needs our core, so sleep almost at once
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
            on_machine = sum(1 for m in ident if m == ident[self.rank])
            _native.set_spin(1000.0 if on_machine <= cores else 20.0)
        self._shm_world = all(t in ("self", "shm") for t in self.transports)
        self._barrier_ranks = list(range(self.size))
        self._teams = {}
        # every rank on this machine and one topology host: the native team decides alone
        self._direct = self._shm_world and self.local_size == self.size and not FORCED_ALGO
        # nbytes -> the algorithm select() chose for an allreduce of that size (the same on
        # every rank: select() reads only the size and the world), for ops.allreduce's short way
        self._allreduce_algo = {}
        self._coll_exec = None
        self._coll_pending = 0
        self._coll_thread = None
        self._calls = Calls(self, Window(self, board, "rw", [r["board"] for r in recs],
                                         [board_len] * self.size, ["rw"] * self.size, board))
        self.barrier()
        self._watch_stop = None
        self._watcher = _logging.watch_links(self)

    # -- collective helpers over the rendezvous store --------------------------------------
    def _next_tag(self, what):
        calls = self._calls
        if calls is not None and calls.in_rounds():
            return calls.tag(what)    # a round inside a collective: numbered by its epoch
        with self._lock:
            self._seq += 1
            return f"{what}/{self._seq}"

    def _allgather_bytes(self, value, what):
        """The store's allgather, waited for in slices so that a peer seen lost ends it with
        PeerLost rather than a Timeout."""
        tag = self._next_tag(what)
        if self._calls is None:     # bootstrapping: no peer is connected yet
            return _store.allgather(self._store, tag, self.rank, self.size, value, self.timeout)
        store, base = self._store, f"ag/{tag}"
        deadline = time.monotonic() + self.timeout
        store.set(f"{base}/{self.rank}", bytes(value))
        out = []
        for r in range(self.size):
            while True:
                left = deadline - time.monotonic()
                try:
                    out.append(store.get(f"{base}/{r}", max(0.0, min(STORE_SLICE, left))))
                    break
                except Timeout:
                    pass
                if r != self.rank and self._ctx.peer_lost(r):
                    raise PeerLost(f"allgather {tag!r}: rank {r} is gone", rank=r,
                                   host=self.hosts[r]) from None
                if left <= 0:
                    raise Timeout(f"allgather {tag!r}: rank {r} did not contribute within "
                                  f"{self.timeout:g} s", rank=r, host=self.hosts[r]) from None
        if store.add(f"{base}/done", 1) == self.size:
            for r in range(self.size):
                store.delete(f"{base}/{r}")
            store.delete(f"{base}/done")
        return out

    def allgather_object(self, obj):
        """Gather one msgpack-able object from every rank (for setup, not for data)."""
        return [msgpack.unpackb(b) for b in self._allgather_bytes(msgpack.packb(obj), "obj")]

    def _listen(self, all_local):
        """Collective: this rank's tcp listener (loopback when every rank is on this machine),
        its secret set; returns every rank's [host, port] (also kept as self._endpoints)."""
        try:
            bind, port, publish = transport.listen_address(all_local, self._boot.coordinator)
        except ValueError as e:
            raise TransportError(str(e), rank=self.rank, host=self.host) from None
        self._ctx.set_secret(self._boot.secret(self.timeout))
        try:
            port = self._ctx.listen(bind, port)
        except _native.Error as e:
            raise_native(e, rank=self.rank, host=self.host, what=f"listen on {bind}:{port}")
        self.listen_address = f"{publish}:{port}"
        self._endpoints = self.allgather_object([publish, port])
        return self._endpoints

    def _setup_tcp(self, ident):
        """Collective: listen, publish host:port, connect to every tcp peer (and check it)."""
        eps = self._listen(all(m == ident[self.rank] for m in ident))
        peers = [r for r in range(self.size) if self.transports[r] in transport.REMOTE]
        _log.debug("tcp listener at %s:%s", *eps[self.rank])
        for r in peers:
            _log.debug("connecting to rank %d (%s) over tcp at %s:%s", r, self.hosts[r],
                       *eps[r])
            self._ctx.connect_tcp(r, eps[r][0], int(eps[r][1]))
        for r in peers:
            try:
                self._ctx.tcp_open(r)
            except _native.Error as e:
                raise_native(e, rank=r, host=self.hosts[r],
                             what=f"tcp connection to {eps[r][0]}:{eps[r][1]}")

    def _choose_verbs(self, ident, recs):
        """Collective: every rank says whether it has verbs and on which fabric; peers on
        other machines on one fabric use verbs. POOLTENSOR_TRANSPORT=verbs where a rank has
        none is a TransportError on every rank, naming it and why."""
        mine = verbs_py.summary()
        self.verbs = mine["why"]
        every = self.allgather_object(mine)
        fabrics = [v["fabric"] for v in every]
        if "verbs" in [r["force"] for r in recs]:
            bad = [r for r in range(self.size) if not fabrics[r]]
            if bad:
                r = bad[0]
                # every rank has read the records before rank 0 (the store) raises and leaves
                key, deadline = "verbs/refused", time.monotonic() + min(self.timeout, 10.0)
                n = self._store.add(key, 1)
                while self.rank == 0 and n < self.size and time.monotonic() < deadline:
                    time.sleep(0.01)
                    n = self._store.add(key, 0)
                raise TransportError(f"POOLTENSOR_TRANSPORT=verbs, but rank {r} "
                                     f"({self.hosts[r]}) cannot use verbs: {every[r]['why']}",
                                     rank=r, host=self.hosts[r])
        self._choices = [transport.choose(ident, r, recs[r]["force"], fabrics)
                         for r in range(self.size)]
        self.transports = list(self._choices[self.rank])

    def _setup_verbs(self):
        """Collective: a queue pair for each verbs peer, published and connected; a peer
        whose pair cannot be made or connected on either side is reached over tcp."""
        peers = [r for r in range(self.size) if self.transports[r] == "verbs"]
        infos = {}
        for r in peers:
            try:
                infos[str(r)] = self._ctx.verbs_local(r)
            except _native.Error:
                infos[str(r)] = None
        every = self.allgather_object(infos)
        for r in peers:
            theirs = every[r].get(str(self.rank))
            try:
                if not (theirs and infos[str(r)]):
                    raise ValueError
                self._ctx.connect_verbs(r, theirs)
            except (ValueError, _native.Error):
                self.transports[r] = "tcp"
        # every rank's receives are posted before anything is sent to it
        self.allgather_object(True)
        info = self._ctx.verbs_info()
        if info and "rails=2" in info[1]:
            self.verbs += (", 2 rails (transfers from 512 KiB striped over both)"
                           if info[0] == "rc" else ", 2 rails (messages alternate over both)")

    def _lost(self):
        """Dead peers, the first one seen first (the likely cause of the others' exits)."""
        first = self._ctx.first_lost()
        rest = [r for r in range(self.size) if r not in (self.rank, first) and self._ctx.peer_lost(r)]
        return ([first] if first >= 0 else []) + rest

    # -- public -----------------------------------------------------------------------------
    def lost(self):
        """The ranks seen dead so far (by the native monitor or a failed transfer), the first
        one seen first; none once the world is closed."""
        return [] if self._closed else self._lost()

    def barrier(self, timeout=None):
        """Return once every rank has called barrier(); PeerLost or Timeout otherwise.

        The plain barrier: no collective call, usable after one failed. A rank that skipped a
        collective call which the others gave up joins them here, so that their next
        collective calls are in step again."""
        if self._closed:
            raise Finalized("barrier on a finalized world; collectives.init() starts a new one",
                            rank=self.rank, host=self.host)
        timeout = self.timeout if timeout is None else timeout
        if self.size == 1:
            return
        calls = self._calls
        between = calls is not None and calls.kind == 0 and self._coll_pending == 0
        if between:
            # records of calls this rank gave up leave before it (the peers read them after)
            t0 = time.monotonic()
            calls.flush(timeout)
            timeout = max(0.0, timeout - (time.monotonic() - t0))
        self._plain_barrier(timeout)
        if between:
            calls.after_barrier()

    def _plain_barrier(self, timeout):
        if self._shm_world:
            try:
                self._ctx.barrier(0, self._barrier_ranks, timeout)
            except _native.Error as e:
                lost = self._lost()
                if e.args[0] == _native.ERR_PEER_LOST and lost:
                    raise PeerLost("barrier: a rank is gone", rank=lost[0],
                                   host=self.hosts[lost[0]]) from None
                if e.args[0] == _native.ERR_TIMEOUT:
                    raise Timeout(f"barrier: not every rank arrived within {timeout} s",
                                  rank=self.rank, host=self.host) from None
                raise_native(e, rank=self.rank, host=self.host, what="barrier")
        else:
            self._store_barrier(self._next_tag("barrier"), timeout)

    def _store_barrier(self, tag, timeout):
        """The rendezvous store's barrier, waited for in slices so that a peer seen lost
        (its tcp connection dropped) ends it with PeerLost rather than a Timeout."""
        base = f"bar/{tag}"
        store = self._store
        deadline = time.monotonic() + timeout
        if store.add(f"{base}/in", 1) == self.size:
            store.set(f"{base}/go", b"1")
        while True:
            left = deadline - time.monotonic()
            try:
                store.get(f"{base}/go", max(0.0, min(STORE_SLICE, left)))
                break
            except Timeout:
                pass
            except PeerLost:
                # rank 0 (the store) left: most likely because it saw the same lost peer;
                # give our own view of the peers a moment to catch up (the dead peer's
                # connection drop may still be on its way to this process's receiver)
                grace = time.monotonic() + min(1.0, max(0.0, left))
                lost = self._lost()
                while not lost and time.monotonic() < grace:
                    time.sleep(0.02)
                    lost = self._lost()
                if lost:
                    raise PeerLost("barrier: a rank is gone", rank=lost[0],
                                   host=self.hosts[lost[0]]) from None
                raise
            lost = self._lost()
            if lost:
                try:
                    after = _has(store, f"{base}/go")     # gone after the barrier: fine
                except PeerLost:
                    after = False       # the store (rank 0) left too, most likely for this
                if not after:
                    raise PeerLost("barrier: a rank is gone", rank=lost[0],
                                   host=self.hosts[lost[0]]) from None
            if left <= 0:
                raise Timeout(f"barrier: not every rank arrived within {timeout} s",
                              rank=self.rank, host=self.host) from None
        if store.add(f"{base}/out", 1) == self.size:
            for name in ("in", "go", "out"):
                store.delete(f"{base}/{name}")

    def expose(self, buffer, access="rw"):
        """Collective: every rank exposes memory (a buffer, an int number of bytes to allocate,
        or None for nothing); returns the Window over all of them."""
        buffer, owned, key, nbytes = self._register_local(buffer, access)
        outside = nbytes > 0 and not self._in_segment(key)
        recs = self.allgather_object([key, nbytes, access, outside])
        if any(r[3] for r in recs):
            try:
                self._serve_outside([r[3] for r in recs])
            except BaseException:
                self._ctx.deregister(key)
                if owned is not None:
                    self._release_segment(owned)
                raise
        return Window(self, buffer, access, [r[0] for r in recs], [r[1] for r in recs],
                      [r[2] for r in recs], owned)

    def _in_segment(self, key):
        """Whether this rank's registration `key` lies in one of its shareable segments."""
        try:
            self._ctx.attach(self.rank, key, 0, 0, False)
            return True
        except _native.Error as e:
            if e.args[0] == _native.ERR_UNSUPPORTED:
                return False
            raise

    def _serve_outside(self, outside):
        """Collective (every rank decides alike): let same-machine peers reach memory that
        some rank exposed outside its segments (outside[r]), which shared memory cannot map.
        Its native threads serve those requests over its tcp listener (loopback when the
        world has none yet); shared memory keeps carrying everything else."""
        need = any(outside[r] and any(self._choices[r][s] == "shm" for s in range(self.size))
                   for r in range(self.size))
        if not need or self._served:
            return
        if self._endpoints is None:
            self._listen(True)
        for r in range(self.size):
            if self.transports[r] == "shm":
                host, port = self._endpoints[r]
                self._ctx.connect_tcp_served(r, host, int(port))
        self._served = True

    # -- collectives plumbing ----------------------------------------------------------------
    def _get_team(self, which="world"):
        """The shared-memory team over every rank ("world") or this host's ranks ("local").

        Made on first use; collective, like the first collective call that needs it."""
        team = self._teams.get(which)
        if team is None:
            ranks = list(range(self.size)) if which == "world" else list(self.local_ranks)
            slot = env.number("POOLTENSOR_SLOT_BYTES", 256 * 1024)
            nslots = env.number("POOLTENSOR_SLOTS", 4)
            stage = self.alloc(_native.stage_bytes(slot, nslots))
            key = self._ctx.register(stage, 3)
            epoch = self._calls.epoch
            try:
                with self._calls.rounds():
                    keys = self.allgather_object(key)
                native = _native.Team(self._ctx, ranks, [keys[r] for r in ranks], slot, nslots)
            except _native.Error as e:
                self._drop_team(_Team(None, ranks, stage, key))
                raise_native(e, rank=self.rank, host=self.host, what="team setup")
            except BaseException:
                self._drop_team(_Team(None, ranks, stage, key))
                raise
            team = _Team(native, ranks, stage, key)
            self._teams[which] = team
            # every rank made it in this epoch: no rank uses the teams of earlier ones
            self._calls.release(epoch)
        return team

    def _drop_team(self, team):
        """Free a team that no rank uses any more (its staging memory included)."""
        team.native = None
        try:
            self._ctx.deregister(team.key)
        except _native.Error:
            pass
        self._release_segment(team.stage)

    def _serial(self, fn, *args):
        """Run a collective in program order: inline, unless async ones are still queued."""
        if self._coll_pending == 0 or threading.current_thread() is self._coll_thread:
            return fn(*args)
        return self._submit(lambda *a, world=None: fn(*a), *args).result()

    def _submit(self, fn, *args, **kw):
        """Queue a collective on the world's one collective thread (keeps the order)."""
        import concurrent.futures
        with self._lock:
            if self._coll_exec is None:
                self._coll_exec = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="collectives")
            self._coll_pending += 1
        for hook in list(SUBMITTING):
            hook(self)
        return self._coll_exec.submit(self._run_queued, fn, args, kw)

    def _run_queued(self, fn, args, kw):
        self._coll_thread = threading.current_thread()
        try:
            return fn(*args, **kw)
        finally:
            with self._lock:
                self._coll_pending -= 1

    def describe(self):
        """Ranks, hosts and the transport to each peer, as a dict."""
        return {"rank": self.rank, "size": self.size, "local_rank": self.local_rank,
                "local_size": self.local_size, "host": self.host, "hosts": list(self.hosts),
                "bootstrap": self.how,
                # a verbs peer whose queue pair failed is reached over tcp since
                "transports": [self._ctx.transport(r) if t in transport.REMOTE
                               and not self._closed else t
                               for r, t in enumerate(self.transports)],
                "verbs": self.verbs,
                "listen": self.listen_address,
                "kernels": _native.kernels_isa() if hasattr(_native, "kernels_isa") else None,
                "native": getattr(_native, "PLATFORM", "linux")}

    def close(self):
        """Leave the world: a last barrier (best effort), then release every native resource."""
        if self._closed or self._closing:
            return
        self._closing = True
        for hook in list(CLOSING):
            hook(self)
        if self._coll_exec is not None:
            self._coll_exec.shutdown(wait=True)
        if self._watch_stop is not None:      # (it reads the native context: stop it first)
            self._watch_stop.set()
            self._watcher.join()
        self._closed = True
        if not _failed:
            # a rank leaving on an uncaught exception skips this: its barrier would pair with
            # an unrelated one of its peers, who should see it gone (PeerLost) instead
            try:
                self._plain_barrier(timeout=min(self.timeout, 10.0))
            except Exception:
                pass
        # a herald still writing to a peer that does not answer is inside the context: leave
        # the context to the process's exit rather than close it under the herald
        quiet = self._calls is None or self._calls.close(min(self.timeout, 10.0))
        self._teams.clear()
        # a peer known dead will never leave the rendezvous: rank 0 then waits for no one
        try:
            lost = bool(self._lost()) if not _failed else True
        except Exception:
            lost = False
        if quiet:
            self._ctx.close()
        self._boot.close(failed=_failed or lost)

    def __repr__(self):
        return (f"<World rank {self.rank}/{self.size} local {self.local_rank}/{self.local_size} "
                f"host {self.host!r} via {self.how}>")


def _has(store, key):
    try:
        store.get(key, 0.0)
        return True
    except Timeout:
        return False


class _Team:
    """A native team and the ranks (in order) it spans; keeps its staging memory alive."""

    __slots__ = ("native", "ranks", "stage", "key")

    def __init__(self, native, ranks, stage, key):
        self.native, self.ranks, self.stage, self.key = native, ranks, stage, key


_world = None
_world_lock = threading.Lock()
# callables(world) run first when a world closes: collectives.jax waits there for the jitted
# programs still running collectives (jax.effects_barrier()) and lets go of the team
CLOSING = []
# callables(world) run when a collective is queued on the world's collective thread:
# collectives.jax sends its calls through Python (and that queue) while any is queued
SUBMITTING = []
_failed = False
_finalized = False     # finalize() ended the world: collectives refuse until init()


def _note_failure(hook):
    def excepthook(*exc):
        global _failed
        _failed = True
        hook(*exc)
    return excepthook


def init(timeout=None):
    """Join the job and return the World (idempotent: later calls return the same one)."""
    global _world, _finalized
    with _world_lock:
        _finalized = False
        _logging.configure()
        if _world is None or _world._closed:
            _world = World(bootstrap(timeout), timeout)
            import atexit
            import sys
            atexit.register(finalize)
            sys.excepthook = _note_failure(sys.excepthook)
        return _world


def current():
    """The World if one is open, else None (no lock: a hot path)."""
    w = _world
    return w if w is not None and not w._closed else None


def finalized():
    """Whether finalize() ended the world and no init() has made a new one since."""
    return _finalized


def finalize():
    """Close the World, if one was made (called at exit too). Collectives called afterwards
    raise Finalized; collectives.init() starts a new world."""
    global _world, _finalized
    with _world_lock:
        w, _world = _world, None
        if w is not None:
            _finalized = True
    if w is not None:
        w.close()
