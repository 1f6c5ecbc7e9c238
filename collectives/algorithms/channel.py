"""Point-to-point channels for window-based algorithms (ring, recursive doubling, hierarchical).

Gloo's pairs, written only against Window operations (put, notify, wait_local), so that the same
code runs over shared memory today and over tcp later.

One Window per world, made collectively on first use and cached as ``world._channels``. Each
rank's window holds::

    counters   arrived[size]  int64   chunks that rank s has put into my slots for s
               credit[size]   int64   chunks of mine that rank d has consumed
               abort[size][KEEP][4]   rank s's last KEEP aborts: group, op seq, reason, ranks
    slots      for each rank s that may send to me (ring neighbour, recursive-doubling
               partners, in the world group and the host-leaders group; every rank in worlds
               of up to DIRECT_RANKS, for direct.py): nslots slots of
               64-byte header + slot_bytes payload

send(d, chunk): wait until credit[d] > sent[d] - nslots (a free slot), put header and payload
into slot sent[d] % nslots of my area in d's window with a notify of d's arrived[me] that lands
after the bytes (Window.put_notify). recv(s): wait until arrived[s] > recvd[s], check the
header, read the payload in place, release() gives the slot back.
Over shared memory the release notifies credit[me] in s's window at once (a store). Over tcp it
costs nothing on the spot: the next chunk this rank sends to s carries how many of s's chunks it
has consumed (the header's ack, read by s when it receives that chunk), and the releases still
owed are notified in one unanswered frame (value = their count) once half the slots of s are
owed, and before this rank sleeps in a wait (after a short spin, FLUSH_AFTER seconds): a rank
never sleeps while owing a slot, so no sender waits on credit that is not coming. Every
operation needs every member, so a release still owed when an operation ends is carried by
the next one (its first chunk's ack, or its first wait's flush).
Over tcp every chunk goes with its header in frames that nobody answers
(Window.put_notify_quiet, the header and the payload gathered by the native call: no copy
here), written by the calling thread: the send returns once the socket took them, and the
receiver's wait for the counter is the only check, so a small collective costs one message
each way and no round trip, and a large one keeps the wire busy while the receiver reduces
(the socket holds what the peer has not read yet). What that gives up: a rank no longer learns
that its last chunk landed, so a partition that lets one rank's chunks through and not its
peer's leaves the first done with an operation the second gives up; collectives/calls.py
brings the two back in step (the record of the given-up call is written until it lands).
The counters only grow, so consecutive collectives continue one stream per pair; the header
(op sequence number of the group, digest of the call, algorithm and group, payload length,
ack) gives every operation in flight its own tag and catches calls that do
not match, naming the other rank.

A rank that fails inside an operation (mismatch, timeout, lost peer) writes its abort record
(group, op sequence number, reason, the two ranks that disagree) into every member of the group
and adds POISON to their arrived/credit counters for it: the low 40 bits of a counter count
chunks, the bits above count poisons, so the counters stay exact and any wait on the failing
rank wakes. A woken rank whose current operation is the aborted one (or an earlier one than
the peer's latest aborts: the peer left it) fails too, with the same kind of error, and poisons
in turn. Chunks of an abandoned operation still waiting in a slot are recognised by their header
(an earlier sequence number) and released unread, so the next operation starts clean on every
pair. When the world gives a call up and starts a new epoch (collectives/calls.py), the channel
is retired on every rank and the next channel operation makes a new one: a put that timed out
waiting for a stopped peer's answer still lands when the peer resumes, so the counters of that
pair can no longer be trusted to agree. Over tcp the abort records
go through the peer's herald thread, so that a peer that does not answer (a stopped process)
does not hold the failing rank for another timeout. Every operation's result depends on every
member (the broadcast chain ends with an acknowledgement to the root and a commit back down the
chain), so no member can return before a failure anywhere reaches it: every rank of the
operation raises.

On one machine a rank running a channel algorithm could meet one that chose a shared-memory
team algorithm for the same call; meet() compares the call through the world team first so
that both raise CollectiveMismatch at once.
"""
import os
import struct
import zlib
from array import array

import numpy as np

from .. import _native, env
from ..errors import CollectiveMismatch, PeerLost, PooltensorError, Timeout
from ..window import raise_native

HDR = 64                      # header bytes in front of each slot's payload
POISON = 1 << 40              # added to a counter to wake whoever waits on it
COUNT = POISON - 1            # the chunk count in a counter's low bits
STAGE_MAX = 16 * 1024         # payloads up to this go with their header in one put
# slot payload bytes: over shared memory 256 KiB; where some pair of ranks talks over the
# network, larger (a chunk costs a message and a wake-up on each side, so large messages want
# few of them; ring.step picks smaller chunks for smaller messages); the variable sets both
_SLOT_ENV = env.number("POOLTENSOR_CHANNEL_SLOT_BYTES", None)
SLOT_BYTES = _SLOT_ENV or 256 * 1024
NET_SLOT_BYTES = _SLOT_ENV or 1024 * 1024
NSLOTS = env.number("POOLTENSOR_CHANNEL_SLOTS", 4)
# every rank gets slots at every other rank (direct.py's all-to-all) in worlds up to this size
DIRECT_RANKS = env.number("POOLTENSOR_DIRECT_RANKS", 8)
FLUSH_AFTER = 0.0005          # seconds a wait spins before the releases owed are notified
# chunks up to this many bytes go over tcp in one frame with their header (the native limit
# of an unanswered frame, _native.TCP_QUIET_FRAME); larger ones in several, back to back
# (put_notify_quiet)
QUIET_MAX = _native.TCP_QUIET_FRAME - HDR
# a direct allreduce over tcp in one chunk runs in native code (_native.Channel: the same
# protocol, no Python per peer); 0: always here, in Python (read at each call: tests compare
# the two)
NATIVE = os.environ.get("POOLTENSOR_CHANNEL_NATIVE", "1") != "0"
# compare each call through the world team first when every rank is on this machine (0: off,
# for tests of the channel's own checks)
TEAM_CHECK = os.environ.get("POOLTENSOR_CHANNEL_TEAM_CHECK", "1") != "0"

KEEP = 8                      # abort records kept per peer (the latest, by poison count)
MISMATCH, FAILED, LOST, TIMEOUT = 1, 2, 3, 4    # abort reasons
WORLD, LEADERS = 0, 1         # group ids
_U64 = (1 << 64) - 1
_EMPTY = np.zeros(0, np.uint8)
# group, op seq, algorithm, digest of the call, payload bytes, and the ack: chunks of the
# receiver's that the sender has consumed (a release without a round trip)
_HEADER = struct.Struct("<6Q")


def get(world):
    """The world's channel, made on first use (collective: every rank calls it at one point)."""
    ch = getattr(world, "_channels", None)
    if ch is None:
        calls = world._calls
        epoch = calls.epoch
        with calls.rounds():
            ch = Channel(world)
        world._channels = ch
        calls.release(epoch)    # every rank made it in this epoch: none uses older ones
    return ch


def meet(world, name, sig):
    """Where every rank is on this machine, some may have chosen a shared-memory team
    algorithm for this call instead: compare the call (digest and algorithm name) through the
    world team first, a zero-byte broadcast, so that both sides get CollectiveMismatch at once
    rather than wait for each other until the timeout. Elsewhere (ranks on several machines)
    only channel algorithms can run and their message headers carry the check."""
    if not TEAM_CHECK or world.size < 2 or not world._shm_world:
        return
    from . import shm
    team = world._teams.get("world") or world._get_team("world")
    mark = (zlib.crc32(name.encode()) << 24) ^ 0xC4A1
    shm.call(world, team, team.native.broadcast, 0, _EMPTY, 0, (int(sig) ^ mark) & _U64)


def world_op(world, name, algo, sig, what):
    """The start of a channel algorithm over every rank: meet() under `name`, then the
    channel, its world group and the operation context (ch.op) for algorithm id `algo`.
    Returns (ch, g, the context manager of the operation)."""
    meet(world, name, sig)
    ch = get(world)
    g = ch.groups[WORLD]
    return ch, g, ch.op(g, algo, sig, what)


def chunks(lo, hi, step):
    """(start, stop) byte ranges covering [lo, hi) in steps; one empty range for an empty span,
    so that every message pattern has at least one (header-only) message to check."""
    if hi <= lo:
        return [(lo, lo)]
    return [(a, min(a + step, hi)) for a in range(lo, hi, step)]


def rd_layout(p, i):
    """Recursive doubling over p members: (p2, rem, new index of member i or None if it folds
    into its odd neighbour, fold partner index or None)."""
    p2 = 1 << (p.bit_length() - 1)
    rem = p - p2
    if i < 2 * rem:
        return p2, rem, (i // 2 if i % 2 else None), i ^ 1
    return p2, rem, i - rem, None


def rd_member(j, rem):
    """Index among the p members of the one holding new index j after the fold."""
    return 2 * j + 1 if j < rem else j + rem


def _peers(ranks, r):
    """Ranks that r receives from in a group: the ring's left neighbour (ring algorithms and
    the broadcast chain) and the recursive-doubling partners."""
    p = len(ranks)
    if p < 2 or r not in ranks:
        return set()
    i = ranks.index(r)
    out = {ranks[(i - 1) % p]}
    p2, rem, new, fold = rd_layout(p, i)
    if fold is not None:
        out.add(ranks[fold])
    if new is not None:
        mask = 1
        while mask < p2:
            out.add(ranks[rd_member(new ^ mask, rem)])
            mask <<= 1
    out.discard(r)
    return out


class Group:
    """An ordered set of world ranks that run operations together."""

    __slots__ = ("gid", "ranks", "index", "size")

    def __init__(self, gid, ranks, me):
        self.gid, self.ranks, self.size = gid, list(ranks), len(ranks)
        self.index = self.ranks.index(me) if me in self.ranks else -1


class Channel:
    """Slots and counters in one window over every rank of a world; see the module docstring."""

    def __init__(self, world):
        self.world = world
        self.me, self.n = me, n = world.rank, world.size
        # topology: the hosts (as lists of ranks, ordered by first rank) and their leaders
        # with the topology, whether any rank reaches a peer over the network (tcp, verbs):
        # every rank must lay out its slots alike
        net = any(t in ("tcp", "verbs") for t in world.transports)
        lists = world.allgather_object([list(world.local_ranks), net])
        self.hosts = [list(h) for h in sorted({tuple(x[0]) for x in lists})]
        self.net = any(x[1] for x in lists)
        self.host_of = {r: h for h, ranks in enumerate(self.hosts) for r in ranks}
        self.groups = [Group(WORLD, range(n), me), Group(LEADERS, [h[0] for h in self.hosts], me)]
        self.slot_bytes = max(64, (NET_SLOT_BYTES if self.net else SLOT_BYTES) // 64 * 64)
        self.nslots = max(1, NSLOTS)
        self.stride = HDR + self.slot_bytes
        nctr = (2 + 4 * KEEP) * n
        self.ctr_bytes = (8 * nctr + 63) // 64 * 64
        self._senders = {}
        self._slot_base = {}
        nbytes = self.ctr_bytes + len(self._senders_of(me)) * self.nslots * self.stride
        self.win = world.expose(nbytes)
        self.buf = self.win.buffer
        self.ctr = memoryview(self.buf[:8 * nctr]).cast("q")   # aligned 8-byte loads
        self.mv = memoryview(self.buf)
        self.poisons = [0] * n
        self.seq = [0] * len(self.groups)   # op sequence number of each group, last started
        self.cur = None                     # (gid, seq) of the operation in progress
        self.dirty = False                  # an operation failed here: slots may hold leftovers
        # per-rank state in int64 arrays: native code (fast()) reads and moves them too
        self.sent = array("q", bytes(8 * n))
        self.recvd = array("q", bytes(8 * n))
        raw = np.zeros(HDR + STAGE_MAX + 64, np.uint8)
        off = (-raw.ctypes.data) % 64
        self.stage = raw[off:off + HDR + STAGE_MAX]
        # over the network every chunk goes with its header in one put_notify_quiet: over tcp
        # the native call gathers the two (gather), over verbs they are copied together (a
        # copy here is cheaper than a second operation); over shared memory only small ones
        # are staged (there a put is a copy)
        self.tcp = [t in ("tcp", "verbs") for t in world.transports]
        self.gather = [t == "tcp" for t in world.transports]
        self.any_tcp = any(self.tcp)
        if any(t and not g for t, g in zip(self.tcp, self.gather)):
            raw = np.zeros(HDR + self.slot_bytes + 64, np.uint8)
            off = (-raw.ctypes.data) % 64
            self.stage = raw[off:off + HDR + self.slot_bytes]
        self.notified = array("q", bytes(8 * n))   # releases notified to each sender (<= recvd)
        self.acked = array("q", bytes(8 * n))      # chunks of mine each rank consumed (its ack)
        self.shown = array("q", bytes(8 * n))      # the ack last sent to each rank
        self._fast = None                   # the native Channel, False where none applies
        self.stage_mv = memoryview(self.stage)
        self.hdr = np.zeros(HDR, np.uint8)
        world._calls.on_epoch.append(self._retire)

    def _retire(self, epoch):
        """The world gave a call up and starts epoch `epoch` (collectives/calls.py): this
        channel is not used again (the next channel operation makes a new one on every rank).
        What each rank had sent of the failed call may still land in it, late: a put that timed
        out waiting for a stopped peer's answer is delivered when the peer resumes, so the
        pair's counters can no longer be trusted to agree."""
        calls = self.world._calls
        calls.on_epoch.remove(self._retire)
        if getattr(self.world, "_channels", None) is self:
            self.world._channels = None
        calls.retire(epoch - 1, self.drop)

    def drop(self):
        """Stop exposing this channel's memory, here only (no rank uses it any more)."""
        w = self.world
        try:
            w._ctx.deregister(self.win._keys[self.me])
        except Exception:
            pass
        self.win._closed = True
        if self.win._owned is not None:
            w._release_segment(self.win._owned)

    def fast(self):
        """The native one-exchange allreduce over this channel (_native.Channel), or None
        where it does not apply: every other rank reached over tcp and given slots here (the
        worlds direct.py runs in)."""
        f = self._fast
        if f is None:
            n, me = self.n, self.me
            f = False
            if 1 < n <= DIRECT_RANKS and all(self.gather[r] for r in range(n) if r != me):
                out = [0 if r == me else self._base(r, me) for r in range(n)]
                into = [0 if r == me else self._base(me, r) for r in range(n)]
                f = _native.Channel(self.win._ctx, me, n, self.buf, self.win._keys, out, into,
                                    self.nslots, self.stride,
                                    [self.sent, self.recvd, self.acked, self.notified,
                                     self.shown])
            self._fast = f
        return f or None

    def native_error(self, e, nbytes):
        """Raise the collectives error for a _native.Error of fast(): a send or a release
        to the rank it names."""
        peer = e.args[3] if len(e.args) > 3 else -1
        raise_native(e, *self.win._where(peer, 0, nbytes), what="put_notify")

    # -- layout ------------------------------------------------------------------------------
    def _senders_of(self, r):
        s = self._senders.get(r)
        if s is None:
            peers = set(range(self.n)) if self.n <= DIRECT_RANKS else set()
            peers.discard(r)
            for g in self.groups:
                peers |= _peers(g.ranks, r)
            s = self._senders[r] = sorted(peers)
        return s

    def _base(self, dst, src):
        """Offset of src's slots in dst's window."""
        b = self._slot_base.get((dst, src))
        if b is None:
            senders = self._senders_of(dst)
            if src not in senders:
                raise RuntimeError(f"channel: rank {src} has no slots at rank {dst}")
            b = self.ctr_bytes + senders.index(src) * self.nslots * self.stride
            self._slot_base[(dst, src)] = b
        return b

    def _slot(self, src, k):
        """Offset of the k-th chunk from src in this rank's window."""
        return self._base(self.me, src) + (k % self.nslots) * self.stride

    # -- waiting -----------------------------------------------------------------------------
    def _wait(self, idx, peer, v, op):
        """Until the chunk count of counter idx (this rank's window) is >= v; fails if peer
        aborted the operation in progress. Releases still owed are notified before sleeping."""
        c = self.ctr
        spun = not self.any_tcp
        while True:
            x = c[idx]
            if x & COUNT >= v:
                return
            if x >= POISON:
                self._check_aborts(peer, x >> 40)
            try:
                if not spun:
                    spun = True
                    try:
                        self.win.wait_local(8 * idx, (x & ~COUNT) + v, watch=peer,
                                            timeout=FLUSH_AFTER)
                        continue
                    except Timeout:
                        self._flush()
                        continue
                self.win.wait_local(8 * idx, (x & ~COUNT) + v, watch=peer)
            except Timeout:
                raise Timeout(f"{op.what}: waited {self.world.timeout} s for rank {peer}",
                              rank=peer, host=self.world.hosts[peer]) from None

    def _flush(self, src=None, net=True):
        """Notify the releases owed (to src, or to every sender; net=False: only those over
        shared memory): one call each, value = the count; over tcp an unanswered frame (the
        frames to a rank land in order, and a sender that waits for credit waits with a
        timeout)."""
        for s in (self._senders_of(self.me) if src is None else (src,)):
            owed = self.recvd[s] - self.notified[s]
            if owed > 0:
                if self.tcp[s]:
                    if not net:
                        continue
                    self.notified[s] = self.recvd[s]
                    off = 8 * (self.n + self.me)
                    self.win.put_notify_quiet(s, off, _EMPTY, off, owed)
                else:
                    self.notified[s] = self.recvd[s]
                    self.win.notify(s, 8 * (self.n + self.me), owed)

    def _check_aborts(self, peer, count):
        """Raise if peer gave up our operation, or a later one (so it left ours too: while this
        rank is slow, the others can give up several operations that fail at once without
        it). Its latest aborts are in records (count - 1) % KEEP, (count - 2) % KEEP, ..."""
        c = self.ctr
        left = None
        for k in range(count - 1, max(count - 1 - KEEP, -1), -1):
            a = 2 * self.n + 4 * (peer * KEEP + k % KEEP)
            gid, seq, info = c[a], c[a + 1], c[a + 2]
            if (gid, seq) == self.cur:
                raise _aborted(self.world, peer, info)
            if not self._past(gid, seq):
                left = info          # the oldest abort past ours seen so far
        if left is not None:
            # our operation's own record is overwritten: report the nearest one after it
            raise _aborted(self.world, peer, left)

    def _past(self, gid, seq):
        """Whether (gid, seq) names an operation this rank has finished or given up."""
        if (gid, seq) == self.cur:
            return False
        return 0 < seq <= self.seq[gid] if gid < len(self.seq) else False

    def _drain(self):
        """Release chunks of operations that are over, left in our slots by a failure."""
        c = self.ctr
        for src in self._senders_of(self.me):
            while c[src] & COUNT > self.recvd[src]:
                off = self._slot(src, self.recvd[src])
                gid, seq = _HEADER.unpack_from(self.mv, off)[:2]
                if not self._past(gid, seq):
                    break
                self.recvd[src] += 1
        self._flush()

    # -- failure -----------------------------------------------------------------------------
    def _abort(self, op, reason, pair):
        """Wake every member of op's group with this rank's abort record."""
        n, me = self.n, self.me
        a, b = pair
        info = reason | ((a + 1) << 8) | ((b + 1) << 32)
        rec = np.array([op.group.gid, op.seq, info, 0], np.int64)
        for r in op.group.ranks:
            if r == me:
                continue
            k = self.poisons[r] % KEEP
            self.poisons[r] += 1
            # over tcp through the peer's herald: a peer that does not answer (stopped) would
            # hold this rank for a whole timeout more; a lost peer has nothing to wake
            self.world._calls.send(r, self._wake, r, 8 * (2 * n + 4 * (me * KEEP + k)), rec)

    def _wake(self, r, off, rec):
        self.win.put(r, off, rec)
        self.win.notify(r, 8 * self.me, POISON)
        self.win.notify(r, 8 * (self.n + self.me), POISON)

    # -- operations --------------------------------------------------------------------------
    def op(self, group, algo, sig, what="collective"):
        """Start an operation of `group` (every member calls this in the same order)."""
        return Op(self, group, algo, sig, what)


def _aborted(world, peer, info):
    """The error for an abort record heard from peer: the same kind as the original, naming
    the rank at fault."""
    reason = info & 0xFF
    a, b = ((info >> 8) & 0xFFFFFF) - 1, ((info >> 32) & 0xFFFFFF) - 1
    me = world.rank
    heard = f"rank {me} heard from rank {peer}"
    if reason == MISMATCH and a >= 0 and b >= 0:
        other = a if b == me else b
        e = CollectiveMismatch(f"rank {a} and rank {b} called this collective with different "
                               f"arguments ({heard})", rank=other, host=world.hosts[other])
    elif reason in (LOST, TIMEOUT) and a >= 0 and b >= 0:
        cls, what = (PeerLost, "is gone") if reason == LOST else (Timeout, "did not answer")
        e = cls(f"collective given up: rank {b} {what} (found by rank {a}; {heard})", rank=b,
                host=world.hosts[b])
    else:
        who = a if a >= 0 else peer
        e = PooltensorError(f"rank {who} failed in this collective, so rank {me} gives it up "
                            f"too ({heard})", rank=who, host=world.hosts[who])
        b = -1
    e._pair = (a if a >= 0 else peer, b)
    return e


def _reason(e, me):
    """(abort reason, (reporting rank, rank at fault)) for an exception leaving an operation."""
    pair = getattr(e, "_pair", None)
    for cls, code in ((CollectiveMismatch, MISMATCH), (PeerLost, LOST), (Timeout, TIMEOUT)):
        if isinstance(e, cls):
            rank = getattr(e, "rank", None)
            return code, pair or (me, rank if rank is not None else -1)
    return FAILED, pair or (me, -1)


class Op:
    """One operation in flight on a channel: its own tag, sends and receives to group members.

    Use as a context manager: an exception inside aborts the operation on every member."""

    __slots__ = ("ch", "group", "seq", "key", "what")

    def __init__(self, ch, group, algo, sig, what):
        ch.seq[group.gid] += 1
        self.ch, self.group, self.what = ch, group, what
        self.seq = ch.seq[group.gid]
        self.key = (group.gid, self.seq, algo, int(sig) & _U64)

    def __enter__(self):
        ch = self.ch
        ch.cur = (self.group.gid, self.seq)
        if ch.dirty:
            ch._drain()
        return self

    def __exit__(self, et, e, tb):
        ch = self.ch
        if e is None:
            try:
                # the releases still owed over shared memory (a store each); over tcp the next
                # operation carries them (module docstring)
                ch._flush(net=False)
            except Exception as late:
                ch.dirty = True
                ch._abort(self, *_reason(late, ch.me))
                ch.cur = None
                raise
            ch.dirty = False
        else:
            ch.dirty = True
            ch._abort(self, *_reason(e, ch.me))
        ch.cur = None
        return False

    def send(self, dst, data):
        """Put one chunk (a uint8 array of at most slot_bytes) into dst's next slot for us."""
        ch = self.ch
        k = ch.sent[dst]
        if k >= ch.nslots and ch.acked[dst] < k - ch.nslots + 1:
            ch._wait(ch.n + dst, dst, k - ch.nslots + 1, self)
        off = ch._base(dst, ch.me) + (k % ch.nslots) * ch.stride
        n = data.nbytes
        gid, seq, algo, sig = self.key
        if ch.gather[dst] and n > STAGE_MAX:
            _HEADER.pack_into(ch.hdr, 0, gid, seq, algo, sig, n, ch.recvd[dst])
            ch.win.put_notify_quiet(dst, off, data, 8 * ch.me, 1, ch.hdr)
        elif ch.tcp[dst]:
            st = ch.stage_mv
            _HEADER.pack_into(st, 0, gid, seq, algo, sig, n, ch.recvd[dst])
            if n:
                st[HDR:HDR + n] = data
            ch.win.put_notify_quiet(dst, off, st[:HDR + n], 8 * ch.me, 1)
        elif n <= STAGE_MAX:
            st = ch.stage_mv
            _HEADER.pack_into(st, 0, gid, seq, algo, sig, n, ch.recvd[dst])
            if n:
                st[HDR:HDR + n] = data
            ch.win.put_notify(dst, off, ch.stage[:HDR + n], 8 * ch.me, 1)
        else:
            ch.win.put(dst, off + HDR, data)
            _HEADER.pack_into(ch.hdr, 0, gid, seq, algo, sig, n, ch.recvd[dst])
            ch.win.put_notify(dst, off, ch.hdr, 8 * ch.me, 1)
        ch.sent[dst] = k + 1
        ch.shown[dst] = ch.recvd[dst]

    def recv(self, src, nbytes):
        """The next chunk from src (a view of our slot, valid until release(src)).

        Chunks left over from an operation that failed are released unread."""
        ch = self.ch
        while True:
            k = ch.recvd[src]
            ch._wait(src, src, k + 1, self)
            off = ch._slot(src, k)
            got = _HEADER.unpack_from(ch.mv, off)
            if got[:2] == self.key[:2]:
                break
            if not ch._past(got[0], got[1]):
                self._mismatch(src, got, nbytes)
            self.release(src)
        if got[2:5] != self.key[2:] + (nbytes,):
            self._mismatch(src, got, nbytes)
        if got[5] > ch.acked[src]:
            ch.acked[src] = got[5]
        return ch.buf[off + HDR:off + HDR + nbytes]

    def release(self, src):
        """Done with the chunk from src: give its slot back."""
        ch = self.ch
        k = ch.recvd[src] = ch.recvd[src] + 1
        if not ch.tcp[src] or k - max(ch.notified[src], ch.shown[src]) >= ch.nslots // 2:
            ch._flush(src)

    def recv_into(self, src, out):
        """Receive the next chunk from src into the uint8 array out."""
        v = self.recv(src, out.nbytes)
        if out.nbytes:
            out[:] = v
        self.release(src)

    def _mismatch(self, src, got, nbytes):
        w = self.ch.world
        if got[:2] != self.key[:2]:
            what = "is not in this collective (it called a different sequence of collectives)"
        elif got[2] != self.key[2]:
            what = "runs this collective with a different algorithm"
        elif got[3] != self.key[3]:
            what = "called this collective with different arguments"
        else:
            what = f"sent {got[4]} bytes where {nbytes} were expected"
        raise CollectiveMismatch(f"{self.what}: rank {w.rank} and rank {src} disagree: rank "
                                 f"{src} {what}", rank=src, host=w.hosts[src])
