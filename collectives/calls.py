"""The collective calls of a world: numbered in program order, and given up together.

Each collective call (allreduce, allgather, reduce_scatter, broadcast, barrier) is numbered
(epoch, n), n counting the calls of the epoch: the same numbers on every rank of a program that
calls the same collectives in the same order. An epoch is named by the call that ended the one
before it (its count: the calls this rank began before it, that one included), so the count of
a call is epoch + n, and ranks that gave up the same call are in the same epoch whatever else
each gave up or heard: a record lost on its way (a partition) cannot leave two ranks one epoch
apart for good, since the next call they both give up puts them in the same one.

Every rank has a small *board*, memory that its peers write into (made with the World, its key
exchanged in the World's first round)::

    word 0    marks: how many records peers have written here (each record's put_notify)
    word 1    at: (epoch << 32 | n) of this rank's latest call, read by a peer that gives up
    records   for each writer rank, its last KEEP records: call (epoch << 32 | n, its count
              epoch + n compared with the reader's),
              reason | kind << 8 | (culprit + 1) << 16, the writer's timeout in ms, 0

A rank that cannot finish a call (Timeout, PeerLost, a transport error) *gives it up*: it reads
every peer's `at` (which ranks have not come to the call, which do not answer) to name the rank
at fault, writes its record into every peer's board (over tcp written again until it lands: a
partition may drop it, see below), and starts a new epoch. A rank that comes to that call
later finds the record before it waits for anything and fails the call at once,
naming the operation and the rank that gave up (Timeout; CollectiveMismatch when its own call
is of another kind); a rank that was waiting inside the call fails at its own deadline and
reports the record then; a rank that finished the call finds the record before returning and
fails it too. So every rank fails a call that one rank gave up.

A new epoch is the same fresh start everywhere: the shared-memory teams and the channel of the
window algorithms are dropped, each made again at the next call that needs it from store rounds
tagged by the epoch (the store rounds that collectives make restart their tags), and the old
memory is freed once every rank has made a new team or channel, so that nothing a rank had
started of the failed call (a put still on its way to a stopped peer) can reach the new ones.
A rank that skipped a call altogether (so never failed it) joins the others' epoch at the next
successful World.barrier(): every record written before the barrier is on every board after it.

Mismatched calls (CollectiveMismatch) are found by every rank through the call's own check, so
no record is written for them, but they start a new epoch all the same: a failure met by some
ranks of a call can reach the others as a mismatch (the hierarchical algorithms pass it on so).
A lost peer ends collectives for good: every later call raises PeerLost at once.

What no timeout can promise: a rank that completes a call in the very instant its peer's deadline
passes may return before the peer's record arrives; so may a stopped rank that resumes with its
peers' data already delivered; and over tcp the channel's messages are not answered (one
message each way per call), so a partition that lets one rank's last message through and not
its peer's, or a rank stopped right after its peers' data reached it, leaves a rank done with
a call its peer gives up. The rank that completed finds the record at its next call (or
World.barrier()), says so (RuntimeWarning), and the epochs meet there. Where the record comes
later still (a partition held it), that next call fails on both ranks (neither finds the other
in it) and, being the same call, puts both in the same epoch: the call after it works.

Records to a peer over tcp are written by a thread of that peer (a *herald*), so that a peer
that does not answer (a stopped process) delays no one: the others are told at once, and the
failing call returns within its timeout.
"""
import collections
import functools
import threading
import time
import warnings

import numpy as np

from .errors import CollectiveMismatch, ConnectionDropped, PeerLost, PooltensorError, Timeout

KINDS = {"allreduce": 1, "allgather": 2, "reduce_scatter": 3, "broadcast": 4, "barrier": 5}
_NAMES = {v: k for k, v in KINDS.items()}
KEEP = 8          # records kept per writer on each board
HEAD = 8          # int64 words before the records
REC = 4           # int64 words per record
LOST, TIMEOUT, FAILED = 1, 2, 3     # reasons
PROBE = 0.25      # seconds a rank that gives up waits for its tcp peers' positions
RESEND = (0.05, 0.5)   # first and longest pause before a record that did not land goes again
_LOW = (1 << 32) - 1


def board_bytes(size):
    """Bytes of one rank's board in a world of `size` ranks."""
    return 8 * (HEAD + size * KEEP * REC)


class Calls:
    """Numbering, giving up and recovery of one world's collective calls (module docstring)."""

    __slots__ = ("world", "win", "me", "size", "ctr", "epoch", "n", "base", "kind",
                 "t", "seen", "marks", "lost", "alert", "told", "store_n", "scope", "retired",
                 "on_epoch", "_heralds", "_lock", "_stale")

    def __init__(self, world, board):
        self.world, self.win = world, board
        self.me, self.size = world.rank, world.size
        self.ctr = memoryview(board.buffer).cast("q")
        self.epoch = self.n = self.base = 0     # base: epoch << 32; epoch: calls before it
        self.kind = 0             # KINDS of the call in progress; 0 between calls
        self.t = None             # its timeout (None: the world's)
        self.seen = 0             # word 0 when the board was last read
        self.marks = {}           # count of a call a peer gave up -> (writer, info, ms)
        self.lost = None          # (rank, what) once a peer is gone
        self.alert = False        # marks or lost: begin() looks closer
        self.told = [0] * self.size
        self.store_n = 0          # store rounds made by collectives in this epoch
        self.scope = None         # ident of the thread making a collective's store rounds
        self.retired = []         # (epoch, drop) of teams and channels that epoch used
        self.on_epoch = []        # callables(epoch) run when a new epoch starts
        self._heralds = {}
        self._lock = threading.Lock()
        self._stale = []          # probe threads still waiting for an answer

    # -- the call in progress -----------------------------------------------------------------
    @property
    def pos(self):
        """(epoch << 32 | n) of the current (or last) call."""
        return self.base | self.n

    @property
    def count(self):
        """Collective calls begun on this rank so far, the current one included (the same on
        every rank at the same call: what records are compared by)."""
        return self.epoch + self.n

    @property
    def timeout(self):
        """The current call's timeout in seconds."""
        return self.world.timeout if self.t is None else self.t

    def name(self, kind=None, count=None):
        """The call as messages name it: 'allreduce (collective call 7)'."""
        kind = _NAMES.get(self.kind if kind is None else kind, "collective")
        return f"{kind} (collective call {self.count if count is None else count})"

    def begin(self, kind, timeout=None):
        """A call of `kind` (KINDS) starts: number it, publish it, and fail it at once if a
        peer gave it up already."""
        # word 1 is the number of this rank's latest call; the FFI handler of collectives.jax
        # numbers the calls it runs there without Python, so count on from it
        self.n = (self.ctr[1] & _LOW) + 1
        self.kind, self.t = kind, timeout
        self.ctr[1] = self.base | self.n
        if self.ctr[0] != self.seen or self.alert:
            self._heard_at_start()

    def end(self):
        """The call succeeded here: fail it still if a peer gave it up meanwhile."""
        if self.ctr[0] != self.seen:
            self._scan()
            m = self.marks.get(self.count)
            if m is not None:
                self._fail_now(self._heard(m))
        self.kind = 0

    def _fail_now(self, err):
        self._new_epoch()
        self.kind = 0
        raise err

    def failed(self, e):
        """The call raised `e`: returns the error to raise (e itself, or one naming the call),
        having told the peers and started a new epoch where the call is given up."""
        try:
            return self._failed(e)
        finally:
            self.kind = 0

    def _failed(self, e):
        if not isinstance(e, PooltensorError):
            # raised here before (or instead of) meeting the peers, e.g. bad arguments: the
            # call did not happen; peers that met it without us give it up, and we hear it
            self.n -= 1
            self.ctr[1] = self.pos
            return e
        if getattr(e, "_given_up", False):
            return e          # begin() or end() made it, and started the new epoch already
        self._scan()
        m = self.marks.get(self.count)
        if isinstance(e, CollectiveMismatch):
            # every rank finds it through the call's own check (a rank that met a failure
            # elsewhere in the call is told so as a mismatch): all start the new epoch
            e.args = (f"{self.name()}: {e.args[0]}",) + e.args[1:]
            err = e
        elif m is not None and (getattr(e, "_pair", None) is not None
                                or not isinstance(e, (Timeout, PeerLost))
                                or (isinstance(e, PeerLost) and e.rank == m[0])):
            # failed because a peer gave the call up; also when the rank found gone is the one
            # that gave it up: it did so for a cause of its own (named in its record) and then
            # left, so its record names the rank at fault, not its own leaving
            err = self._heard(m)
        else:
            err = self._give_up(e, told=m is not None)
        from .log import logger
        logger.debug("%s given up: %s", self.name(), err)
        self._new_epoch()
        err._given_up = True
        return err

    # -- reading the board --------------------------------------------------------------------
    def _scan(self):
        """Read the records of calls after this rank's epoch began (the earlier ones it gave
        up itself, or joined its peers past them)."""
        c = self.ctr
        self.seen = c[0]
        for w in range(self.size):
            if w == self.me:
                continue
            for k in range(KEEP):
                i = HEAD + REC * (w * KEEP + k)
                pos = c[i]
                at = (pos >> 32) + (pos & _LOW)
                if at > self.epoch and at not in self.marks:
                    self.marks[at] = (w, c[i + 1], c[i + 2])
        self.alert = bool(self.marks) or self.lost is not None

    def _heard_at_start(self):
        if self.lost is not None:
            rank, what = self.lost
            e = PeerLost(f"{self.name()}: rank {rank} is gone (found in {what}); this world "
                         f"runs no more collectives", rank=rank, host=self.world.hosts[rank])
            e._given_up = True
            self.kind = 0
            raise e
        if self.ctr[0] != self.seen:
            self._scan()
        count = self.count
        m = self.marks.get(count)
        if m is not None:
            self._fail_now(self._heard(m))
        past = [p for p in self.marks if p < count]
        if past:
            # a peer gave up a call that this rank completed (its deadline passed in the very
            # instant the call completed here, or a partition dropped the answers to this
            # rank's last message): that peer is in the epoch that call began, so is this call
            p = max(past)
            warnings.warn(f"collectives: rank {self.marks[p][0]} gave up collective call "
                          f"{p}, which rank {self.me} had completed; the ranks are in step "
                          f"again from call {count}", RuntimeWarning, stacklevel=4)
            self._new_epoch(p)
            self.n = count - p        # the current call moves into the new epoch
            self.ctr[1] = self.pos

    def _heard(self, m):
        """The error for the current call, given up by a peer (record m)."""
        writer, info, ms = m
        reason, kind, culprit = info & 0xFF, (info >> 8) & 0xFF, (info >> 16) - 1
        hosts, mine = self.world.hosts, self.name()
        who = "this rank" if culprit == self.me else f"rank {culprit}"
        if kind != self.kind:
            e = CollectiveMismatch(
                f"{mine}: rank {writer} gave up its {_NAMES.get(kind, 'collective')} at this "
                f"point of the program, a different collective (after waiting {ms / 1000:g} s "
                f"for {who})", rank=writer, host=hosts[writer])
        elif reason == LOST and 0 <= culprit < self.size:
            e = PeerLost(f"{mine}: rank {writer} gave up this call: rank {culprit} is gone",
                         rank=culprit, host=hosts[culprit])
            self.lost = (culprit, mine)
            self.alert = True
        elif reason == TIMEOUT:
            # the rank at fault, unless that is this rank: then the one that gave up
            r = culprit if 0 <= culprit < self.size and culprit != self.me else writer
            e = Timeout(f"{mine}: rank {writer} gave up this call after waiting {ms / 1000:g} s "
                        f"for {who}; every rank fails it", rank=r, host=hosts[r])
        else:
            e = PooltensorError(f"{mine}: rank {writer} failed in this call, so every rank "
                                f"gives it up", rank=writer, host=hosts[writer])
        e._given_up = True
        return e

    # -- giving up ----------------------------------------------------------------------------
    def _give_up(self, e, told=False):
        """This rank gives the call up because of `e`: name the rank at fault, tell every peer
        (unless one told us already: `told`)."""
        hosts, mine = self.world.hosts, self.name()
        rank = e.rank if isinstance(e.rank, int) and 0 <= e.rank < self.size else -1
        pair = getattr(e, "_pair", None)      # a channel peer's abort heard inside the call
        if isinstance(e, PeerLost):
            if rank >= 0:
                self.lost, self.alert = (rank, mine), True
            err = PeerLost(f"{mine}: rank {rank} is gone", rank=rank,
                           host=hosts[rank] if rank >= 0 else None) if rank >= 0 else e
            reason = LOST
        elif isinstance(e, Timeout) and pair is None:
            late, silent = self._probe()
            if late:
                rank = rank if rank in late else late[0]
                how = "did not arrive"
            elif silent:
                rank = rank if rank in silent else silent[0]
                how = "does not answer"
            else:
                how = "did not answer"
            err = Timeout(f"{mine}: rank {rank} {how} within {self.timeout:g} s; rank {self.me} "
                          f"gives the call up, and every rank fails it", rank=rank,
                          host=hosts[rank] if rank >= 0 else None)
            reason = TIMEOUT
        elif pair is not None and pair[0] >= 0 and isinstance(e, (Timeout, PeerLost)):
            # a channel peer's abort, heard inside the call: that peer gives the call up
            reason = LOST if isinstance(e, PeerLost) else TIMEOUT
            info = reason | (self.kind << 8) | ((pair[1] + 1) << 16)
            return self._heard((pair[0], info, int(self.timeout * 1000)))
        else:
            err, reason = e, TIMEOUT if isinstance(e, Timeout) else FAILED
            e.args = (f"{mine}: {e.args[0]}",) + e.args[1:]
            if pair is not None and pair[1] >= 0:
                rank = pair[1]
        if not told:
            self._tell(reason, rank)
        return err

    def _probe(self):
        """(peers that have not come to this call, peers that did not answer the question).

        Over tcp each peer is asked from a thread of its own, waited for PROBE s at most: a
        question to a stopped peer may wait for a reconnection, or for the whole timeout."""
        w, count = self.world, self.count
        got = {}

        def ask(r):
            buf = np.zeros(1, np.int64)
            try:
                self.win.get(r, 8, buf)
                at = int(buf[0])
                got[r] = (at >> 32) + (at & _LOW)
            except Exception:
                got[r] = None

        threads = []
        for r in range(self.size):
            if r == self.me:
                continue
            if w.transports[r] in ("tcp", "verbs"):
                t = threading.Thread(target=ask, args=(r,), name=f"collectives-probe-{r}",
                                     daemon=True)
                t.start()
                threads.append(t)
            else:
                ask(r)
        deadline = time.monotonic() + PROBE
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._stale = [t for t in self._stale + threads if t.is_alive()]
        peers = [r for r in range(self.size) if r != self.me]
        late = [r for r in peers if got.get(r) is not None and got[r] < count]
        silent = [r for r in peers if got.get(r) is None]
        return late, silent

    def _tell(self, reason, culprit):
        """Write this rank's record of the current call into every peer's board."""
        info = reason | (self.kind << 8) | ((culprit + 1) << 16)
        rec = np.array([self.pos, info, int(self.timeout * 1000), 0], np.int64)
        for r in range(self.size):
            if r == self.me:
                continue
            off = 8 * (HEAD + REC * (self.me * KEEP + self.told[r] % KEEP))
            self.told[r] += 1
            self.send(r, self.win.put_notify, r, off, rec, 0, 1, again=True)

    def send(self, rank, fn, *args, again=False):
        """fn(*args), a write to `rank`: at once over shared memory, through the rank's herald
        over tcp (in order, never blocking the caller). Errors are dropped: a peer that
        cannot be told is gone or stuck, and is found so by its own waits; but with `again`
        (a record, the same bytes at the same place: writing it twice changes nothing) a
        write over tcp that timed out or lost its connection goes again until it lands, the
        peer is lost or the world closes, so that a partition cannot lose a record of a call
        that the peer completed: the peer would stay a call ahead until their next failure."""
        if self.world.transports[rank] not in ("tcp", "verbs"):
            try:
                fn(*args)
            except Exception:
                pass
            return
        with self._lock:
            h = self._heralds.get(rank)
            if h is None:
                h = self._heralds[rank] = _Herald(rank)
                h.start()
        h.post(fn, args, again)

    def flush(self, timeout):
        """Wait up to `timeout` s for the heralds' writes; True when none is left."""
        deadline = time.monotonic() + max(0.0, timeout)
        return all(h.idle(max(0.0, deadline - time.monotonic()))
                   for h in list(self._heralds.values()))

    # -- epochs -------------------------------------------------------------------------------
    def _new_epoch(self, at=None):
        """Start the epoch that call `at` (a count; the current call by default) ends the
        one before: the same epoch on every rank that gave up or heard of that call."""
        w = self.world
        self.epoch = max(self.count if at is None else at, self.epoch + 1)
        self.base = self.epoch << 32
        self.n = self.store_n = 0
        self.ctr[1] = self.base
        self.marks = {p: m for p, m in self.marks.items() if p > self.epoch}
        self.alert = bool(self.marks) or self.lost is not None
        for team in w._teams.values():
            self.retire(self.epoch - 1, functools.partial(w._drop_team, team))
        w._teams.clear()
        for fn in list(self.on_epoch):
            fn(self.epoch)

    def tag(self, what):
        """The tag of a store round made inside a collective call (the same on every rank)."""
        self.store_n += 1
        return f"{what}/e{self.epoch}.{self.store_n}"

    def rounds(self):
        """Context manager around the store rounds a collective call makes (setting up a team
        or a channel): their tags come from tag(), so that they match on every rank however
        the world's own rounds went."""
        return _Rounds(self)

    def in_rounds(self):
        """Whether the calling thread is making a collective call's store rounds."""
        return self.scope is not None and self.scope == threading.get_ident()

    def retire(self, epoch, drop):
        """Something used in `epoch` (a team, a channel) is not used again: drop() frees it
        once no rank can touch it any more (release())."""
        self.retired.append((epoch, drop))

    def release(self, epoch):
        """Every rank has made a team or a channel in `epoch` (a store round with all of them):
        none is still in an earlier epoch, so what those used can be freed."""
        keep = []
        for ep, drop in self.retired:
            if ep < epoch:
                drop()
            else:
                keep.append((ep, drop))
        self.retired = keep

    def after_barrier(self):
        """A World.barrier() succeeded: every record written before it is here now. A peer's
        record of a call in this rank's epoch means this rank skipped that call: join the
        peers' epoch."""
        if self.ctr[0] != self.seen:
            self._scan()
        if self.marks:
            done = [p for p in self.marks if p <= self.count]
            if done:
                p = min(done)
                warnings.warn(f"collectives: rank {self.marks[p][0]} gave up collective call "
                              f"{p}, which rank {self.me} had completed; the ranks are in step "
                              f"again from the next call", RuntimeWarning, stacklevel=3)
            self._new_epoch(max(self.marks))

    def close(self, timeout):
        """Stop the heralds; True when none of them and no probe is still inside the native
        context (which may then be closed)."""
        deadline = time.monotonic() + max(0.0, timeout)
        done = self.flush(timeout)
        for h in self._heralds.values():
            h.stop()
        for t in self._stale:
            t.join(max(0.0, deadline - time.monotonic()))
        return done and not any(t.is_alive() for t in self._stale)


class _Rounds:
    __slots__ = ("calls", "outer")

    def __init__(self, calls):
        self.calls = calls

    def __enter__(self):
        self.outer, self.calls.scope = self.calls.scope, threading.get_ident()

    def __exit__(self, *exc):
        self.calls.scope = self.outer


class _Herald(threading.Thread):
    """Writes to one tcp peer, in order, off the caller's thread."""

    def __init__(self, rank):
        super().__init__(name=f"collectives-herald-{rank}", daemon=True)
        self.q = collections.deque()
        self.cv = threading.Condition()
        self.busy = self.closed = False

    def post(self, fn, args, again=False):
        with self.cv:
            self.q.append((fn, args, again))
            self.cv.notify_all()

    def run(self):
        pause = RESEND[0]
        while True:
            with self.cv:
                while not self.q and not self.closed:
                    self.cv.wait()
                if not self.q:
                    return
                fn, args, again = self.q.popleft()
                self.busy = True
            retry = False
            try:
                fn(*args)
                pause = RESEND[0]
            except (Timeout, ConnectionDropped):
                retry = again and not self.closed   # not lost: unreachable for now
            except Exception:   # a peer that cannot be told: its own waits find it
                pass
            with self.cv:
                if retry:
                    # first in line again (the writes to a peer stay in order), after a pause
                    # that a close cuts short
                    self.q.appendleft((fn, args, again))
                    self.cv.wait_for(lambda: self.closed, pause)
                    pause = min(2 * pause, RESEND[1])
                    if self.closed:
                        self.q.clear()
                self.busy = False
                self.cv.notify_all()

    def idle(self, timeout):
        with self.cv:
            return self.cv.wait_for(lambda: not self.q and not self.busy, timeout)

    def stop(self):
        with self.cv:
            self.closed = True
            self.cv.notify_all()
