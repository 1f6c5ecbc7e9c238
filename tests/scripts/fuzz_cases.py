"""The engine of the tcp protocol fuzzer (tests/fuzz_tcp.py is its command line and says what
the cases are): the case runners, and the checkpoints that compare the server's counters and
memory with the model (fuzz_wire.py) while the legitimate client (fuzz_target.py) works."""
import collections
import hashlib
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import fuzz_wire as w
from fuzz_gen import Gen
from fuzz_target import FuzzError, Legit, Target


# ---- the engine ----------------------------------------------------------------------------

class Fuzzer:
    """Runs cases against one target; every mismatch raises FuzzError naming the seed and the
    case index (``python tests/fuzz_tcp.py --seed S --first I --cases 1`` replays it)."""

    KINDS = ("batch", "preauth", "rst", "slow", "crowd")
    WEIGHTS = (40, 46, 5, 6, 1)

    def __init__(self, seed, host="127.0.0.1", legit=True, stalls=True, log=None,
                 server_env=None):
        self.seed = seed
        self.log = log or (lambda s: None)
        rng = random.Random(seed)
        self.secret = rng.randbytes(32)
        self.target = Target(self.secret, seed, host, env_extra=server_env)
        self.host, self.port = host, self.target.port
        regions = []
        for name, d in self.target.info["regs"].items():
            data = None if name == "legit" else \
                bytearray.fromhex(self.target.ask(f"dump {name}")["hex"])
            regions.append(w.Region(name, d["key"], d["len"], d["access"], d["seg"],
                                    d["align"], data, protected=name == "legit"))
        self.model = w.Model(regions)
        self.gen = Gen(self.model, self.target.info["stale_key"])
        self.digest0 = self.target.ask("digest")
        self.exp = collections.Counter()        # what tcp_stats() must say
        self.lock = threading.Lock()            # exp, from the crowd's threads
        self.kinds = collections.Counter()
        self.outcomes = collections.Counter()   # replies checked, by op and status
        self.cases = 0
        self.conn = None                        # the authenticated connection batches use
        self.last_auth = None                   # an AUTH frame that worked once (to replay)
        self.next_id = 1
        self.case_index = self.variant = None
        self.stalls, self.stall_t0, self.idle = [], None, None
        self.legit = None
        if legit:
            self.legit = Legit(self.target, self.secret, self.model.regions["legit"], seed)
            self.exp["accepted"] += 1
            self.legit.start()
        if stalls:
            self._start_stalls(random.Random(seed ^ 0x5A5A))

    # -- helpers --

    def fail(self, what, frames=(), outs=()):
        lines = [f"case {self.case_index} (seed {self.seed}, {self.variant}): {what}"]
        for f, o in list(zip(frames, outs))[-12:]:
            lines.append(f"  {f!r} -> expected {o!r}")
        raise FuzzError("\n".join(lines))

    def count(self, **kw):
        with self.lock:
            self.exp.update(kw)

    def connect(self, rst=False):
        c = w.Conn(self.host, self.port, rst=rst)
        self.count(accepted=1)
        return c

    def authed(self, rng, rank=-1):
        c = self.connect()
        f = c.handshake(self.secret, rng.randbytes(w.NONCE), rank)
        self.last_auth = f.wire()
        return c

    def _id(self):
        self.next_id += 1
        return self.next_id

    def sent_bytes(self, f, o):
        """What goes on the wire for frame f: a frame the server closes on at its header is
        sent without its payload (the server stops reading there)."""
        if o.close and (not w.well_formed(f) or f.op in (w.BYE, w.PUT_INDEXED)):
            return f.header()
        return f.wire()

    def check_replies(self, data, frames, outs, eof, closing):
        """Walk the replies in data against the predicted outcomes."""
        at = 0
        for f, o in zip(frames, outs):
            if o.close:
                with self.lock:
                    self.outcomes["closed (bad frame)" if o.bad else "closed (BYE/EOF)"] += 1
                break
            if len(data) - at < w.HDR_LEN:
                self.fail(f"the server {'closed' if eof else 'stopped'} after {at} bytes "
                          f"where a reply to {f!r} was due", frames, outs)
            h = w.unpack(data[at:at + w.HDR_LEN])
            at += w.HDR_LEN
            payload = b""
            if f.op == w.GET and h["status"] == w.OK and o.status == w.OK:
                if h["len"] != f.len:
                    self.fail(f"GET reply len {h['len']} for {f!r}", frames, outs)
                payload = data[at:at + f.len]
                at += f.len
            bad = w.check_reply(f, o, h, payload)
            with self.lock:
                self.outcomes[f"{w.OP_NAMES[f.op]} {w.STATUS_NAMES.get(o.status)}"] += 1
            if bad:
                self.fail(f"reply to {f!r}: " + "; ".join(bad), frames, outs)
        if closing:
            if not eof:
                self.fail("the connection stayed open after a frame that must close it",
                          frames, outs)
            if at != len(data):
                self.fail(f"{len(data) - at} unexpected bytes before the close", frames, outs)
        elif eof:
            self.fail("the server closed a connection after well-formed frames", frames, outs)

    # -- cases --

    def run_frames(self, frames, cut=None, half_close=False, rng=None):
        """Send frames on the authenticated connection (made first if there is none) and
        check every answer. Stops at the first frame that must close it. cut: the last frame
        is cut after that many bytes and the connection half-closed (a truncated frame);
        half_close: half-close after the last frame (a clean end of stream). Returns the
        number of frames that went."""
        if self.conn is None:
            self.conn = self.authed(rng or random.Random(self.next_id))
        sent, outs, out = [], [], bytearray()
        closing = False
        for j, f in enumerate(frames):
            if cut is not None and j == len(frames) - 1:
                if cut < w.HDR_LEN:
                    o = w.Outcome(close=True, bad=True, request=False)
                else:
                    o = self.model.predict(f, sent_payload=f.payload[:cut - w.HDR_LEN])
                    o.close = o.bad = True
                sent.append(f)
                outs.append(o)
                out += f.wire()[:cut]
                closing = half_close = True
                break
            o = self.model.predict(f)
            sent.append(f)
            outs.append(o)
            out += self.sent_bytes(f, o)
            if o.close:
                closing = True
                half_close = False
                break
        need = sum(w.reply_len(f, o) for f, o in zip(sent, outs))
        c = self.conn
        try:
            data, eof = c.exchange(bytes(out), need, closing or half_close,
                                   half_close=half_close)
            self.check_replies(data, sent, outs, eof, closing or half_close)
        except BaseException:
            c.close()                   # out of step with the model: start afresh
            self.conn = None
            raise
        if closing or half_close:
            c.close()
            self.conn = None
        self.count(bad_frames=sum(o.bad for o in outs), requests=sum(o.request for o in outs))
        return len(sent)

    def case_batch(self, rng):
        """Up to 32 frames on one connection; it may end with BYE, a cut frame or a
        half-close."""
        frames = [self.gen.frame(rng, self._id()) for _ in range(rng.randint(1, 32))]
        ending = rng.random()
        cut = None
        if ending < 0.04:
            frames.append(w.Frame(w.BYE, id=self._id()))
        elif ending < 0.10:
            f = frames[-1]
            body = len(f.payload) if f.op in (w.PUT, w.PUT_INDEXED, w.PUT_NOTIFY) and \
                w.well_formed(f) and (f.op != w.PUT_INDEXED or w.indexed_sizes_ok(f)) else 0
            cut = rng.randint(1, w.HDR_LEN + body - 1)
        return self.run_frames(frames, cut=cut, half_close=ending > 0.97, rng=rng)

    def case_preauth(self, rng):
        v = rng.choice(["blind", "garbage", "request", "bad_auth", "cut_auth", "wrong_secret",
                        "wrong_secret", "replay", "rank", "rank_ok", "silent", "silent_hello"])
        self.kinds["preauth." + v] += 1
        self.variant = v
        c = self.connect()
        try:
            if v == "blind":          # bytes sent without waiting for HELLO
                junk = bytearray(rng.randbytes(rng.randint(1, 300)))
                junk[0] ^= 0x80 if junk[0] == 0x50 else 0
                c.sock.sendall(junk)
                c.shut_wr()
                data = c.wait_eof()
                if len(data) != w.HDR_LEN + w.NONCE or w.unpack(data[:64])["op"] != w.HELLO:
                    self.fail(f"blind junk: expected only HELLO then close, got {len(data)} B")
                self.count(bad_frames=1)
                return 1
            if v in ("silent", "silent_hello"):
                if v == "silent_hello":
                    c.hello()
                return 1
            _, ns = c.hello()
            expect_auth_fail = False
            if v == "garbage":
                junk = bytearray(rng.randbytes(rng.randint(1, 200)))
                junk[0] ^= 0x80 if junk[0] == 0x50 else 0
                c.sock.sendall(junk)
                c.shut_wr()
            elif v == "request":      # a request before authenticating
                f = self.gen.frame(rng, self._id())
                if f.op == w.AUTH:
                    f.op = w.GET
                # the server stops reading at the header: send while watching for its close
                # (it half-closes, so a plain sendall of a big payload would just stall)
                data, eof = c.exchange(f.wire() if len(f.payload) == f.len else f.header(),
                                       0, True)
                if data or not eof:
                    self.fail(f"request before AUTH: {len(data)} bytes answered, "
                              f"{'closed' if eof else 'not closed'}")
                self.count(bad_frames=1)
                return 1
            elif v == "bad_auth":
                f = c.auth_frame(self.secret, ns, rng.randbytes(w.NONCE))
                what = rng.choice(["len", "flags", "magic", "op"])
                if what == "len":
                    f.len = rng.choice([0, 32, 63, 65, 96, w.M64, 1 << 32])
                elif what == "flags":
                    f.flags = rng.randint(1, 0xFFFF)
                elif what == "magic":
                    f.magic = w.MAGIC ^ (1 << rng.randrange(32))
                else:
                    f.op = rng.choice([w.HELLO, w.AUTH_OK, w.GET, w.BYE, 0, w.AUTH | w.REPLY])
                c.sock.sendall(f.header())
            elif v == "cut_auth":
                f = c.auth_frame(self.secret, ns, rng.randbytes(w.NONCE))
                c.sock.sendall(f.wire()[:rng.randint(1, w.HDR_LEN + 63)])
                c.shut_wr()
            elif v in ("wrong_secret", "replay", "rank"):
                nc = rng.randbytes(w.NONCE)
                f = c.auth_frame(self.secret, ns, nc)
                if v == "replay" and self.last_auth:
                    wire = self.last_auth
                elif v == "rank":      # the MAC covers the claimed rank
                    f.a = rng.choice([0, 1, 2, -2, (1 << 63) - 1])
                    wire = f.wire()
                else:
                    how = rng.choice(["random", "flip", "short", "long", "mac", "nonce"])
                    key = {"random": rng.randbytes(32),
                           "flip": bytes([self.secret[0] ^ 1]) + self.secret[1:],
                           "short": self.secret[:16], "long": self.secret + b"\1",
                           }.get(how, self.secret)
                    mac = w.client_mac(key, ns, nc, -1)
                    if how == "mac":
                        mac = rng.randbytes(w.MAC)
                    if how == "nonce":
                        nc = rng.randbytes(w.NONCE)
                    f.payload = nc + mac
                    wire = f.wire()
                c.sock.sendall(wire)
                expect_auth_fail = True
            elif v == "rank_ok":      # any claimed rank, proved: served like any client
                nc = rng.randbytes(w.NONCE)
                rank = rng.choice([0, 1, 5, -7, (1 << 63) - 1])
                c.sock.sendall(c.auth_frame(self.secret, ns, nc, rank).wire())
                h = w.unpack(c.recv_exact(w.HDR_LEN))
                if h["status"] != w.OK or c.recv_exact(w.MAC) != w.client_mac(
                        self.secret, ns, nc, rank, server=True):
                    self.fail(f"handshake claiming rank {rank} refused: {h}")
                r = self.model.regions["small_ro"]
                f = w.Frame(w.GET, key=r.key, off=0, len=r.len, id=self._id())
                o = self.model.predict(f)
                data, eof = c.exchange(f.wire() + w.Frame(w.BYE).wire(), w.reply_len(f, o),
                                       True)
                self.check_replies(data, [f, w.Frame(w.BYE)],
                                   [o, w.Outcome(close=True, request=False)], eof, True)
                self.count(requests=1)
                return 1
            data = c.wait_eof()
            if expect_auth_fail:
                h = w.unpack(data[:64]) if len(data) >= 64 else None
                if not h or h["op"] != w.AUTH_OK or h["status"] != w.E_AUTH or h["len"] != 0 \
                        or len(data) != 64:
                    self.fail(f"{v}: expected AUTH_OK with status {w.E_AUTH} and a close, got "
                              f"{h} and {len(data)} bytes")
                self.count(auth_failures=1)
            else:
                if data:
                    self.fail(f"{v}: {len(data)} bytes answered before authentication")
                self.count(bad_frames=1)
            return 1
        finally:
            c.close()

    def case_rst(self, rng):
        """A frame cut short, then a reset (seen only through the counters)."""
        c = self.connect(rst=True)
        if rng.random() < 0.5:
            _, ns = c.hello()
            f = c.auth_frame(self.secret, ns, rng.randbytes(w.NONCE))
            c.sock.sendall(f.wire()[:rng.randint(1, w.HDR_LEN + 63)])
        else:
            c.handshake(self.secret, rng.randbytes(w.NONCE))
            f = self.gen.frame(rng, self._id())
            c.sock.sendall(f.header()[:rng.randint(1, w.HDR_LEN - 1)])
        time.sleep(0.001)
        c.close()
        self.count(bad_frames=1)
        return 1

    def case_slow(self, rng):
        """Well-formed frames delivered in small pieces with pauses."""
        if self.conn is None:
            self.conn = self.authed(rng)
        frames, outs = [], []
        while len(frames) < rng.randint(1, 6):
            f = self.gen.frame(rng, self._id())
            if not w.well_formed(f) or f.op == w.BYE or \
                    (f.op == w.PUT_INDEXED and not w.indexed_sizes_ok(f)) or f.len > 65536:
                continue
            frames.append(f)
            outs.append(self.model.predict(f))
        out = b"".join(f.wire() for f in frames)
        at = 0
        while at < len(out):
            n = rng.randint(1, 80)
            self.conn.sock.sendall(out[at:at + n])
            at += n
            time.sleep(rng.choice([0, 0, 0.0002, 0.001]))
        need = sum(w.reply_len(f, o) for f, o in zip(frames, outs))
        data, eof = self.conn.exchange(b"", need, False)
        self.check_replies(data, frames, outs, eof, False)
        self.count(requests=len(frames))
        return len(frames)

    def _crowd_reader(self, seed, frames_each):
        """One of the crowd's threads: its own connection, gets with hostile fields (reads
        only: their answers do not depend on the order the threads run in)."""
        rng = random.Random(seed)
        c = self.authed(rng)
        try:
            frames, outs = [], []
            for _ in range(frames_each):
                r = self.gen.region(rng)
                f = w.Frame(w.GET, key=self.gen.key(rng, r), id=rng.getrandbits(64))
                f.len = min(self.gen.length(rng, r), r.len + 1)
                f.off = self.gen.offset(rng, r, min(f.len, r.len))
                frames.append(f)
                outs.append(self.model.predict(f))
            frames.append(w.Frame(w.BYE))
            outs.append(w.Outcome(close=True, request=False))
            need = sum(w.reply_len(f, o) for f, o in zip(frames, outs))
            data, eof = c.exchange(b"".join(f.wire() for f in frames), need, True)
            self.check_replies(data, frames, outs, eof, True)
            self.count(requests=frames_each)
        finally:
            c.close()

    def case_crowd(self, rng):
        """Many connections open at once, then each does something different; and a few
        threads reading in parallel."""
        # at most 64 at once: all must finish their handshake within the server's handshake
        # timeout (2 s) while they are served one after the other, and stay under its budget
        # of connections still in the handshake (128)
        conns = [self.connect() for _ in range(rng.randint(16, 64))]
        n = len(conns)
        try:
            for c in rng.sample(conns, n):
                v = rng.choice(["get", "garbage", "wrong", "silent"])
                if v == "silent":
                    c.close()
                    continue
                _, ns = c.hello()
                if v == "garbage":
                    c.sock.sendall(b"\0" * rng.randint(1, 100))
                    c.shut_wr()
                    if c.wait_eof():
                        self.fail("crowd: bytes answered to junk")
                    self.count(bad_frames=1)
                elif v == "wrong":
                    nc = rng.randbytes(w.NONCE)
                    c.sock.sendall(w.Frame(w.AUTH, len=64, a=-1,
                                           payload=nc + rng.randbytes(w.MAC)).wire())
                    data = c.wait_eof()
                    if len(data) != 64 or w.unpack(data)["status"] != w.E_AUTH:
                        self.fail(f"crowd: wrong MAC answered with {len(data)} bytes")
                    self.count(auth_failures=1)
                else:
                    nc = rng.randbytes(w.NONCE)
                    c.sock.sendall(c.auth_frame(self.secret, ns, nc).wire())
                    h = w.unpack(c.recv_exact(64))
                    c.recv_exact(w.MAC)
                    if h["status"] != w.OK:
                        self.fail(f"crowd: handshake refused {h}")
                    r = self.model.regions["ro"]
                    f = w.Frame(w.GET, key=r.key, off=rng.randint(0, 1000), len=4096, id=7)
                    o = self.model.predict(f)
                    data, eof = c.exchange(f.wire() + w.Frame(w.BYE).wire(), 64 + 4096, True)
                    self.check_replies(data, [f, w.Frame(w.BYE)],
                                       [o, w.Outcome(close=True, request=False)], eof, True)
                    self.count(requests=1)
        finally:
            for c in conns:
                c.close()
        k = rng.randint(2, 8)
        with ThreadPoolExecutor(k) as ex:
            list(ex.map(self._crowd_reader, [rng.getrandbits(32) for _ in range(k)],
                        [rng.randint(5, 40)] * k))
        return n + k

    # -- stalls --

    def _start_stalls(self, rng):
        """Connections that stop mid-frame: the server must drop each after its I/O timeout
        (and count the cut frames); an idle authenticated one must stay."""
        self.stall_t0 = time.monotonic()
        s1 = self.connect()
        s1.hello()                                            # silent after HELLO
        s2 = self.connect()
        _, ns = s2.hello()
        s2.sock.sendall(s2.auth_frame(self.secret, ns, rng.randbytes(32)).wire()[:10])
        s3 = self.authed(rng)
        s3.sock.sendall(w.Frame(w.GET, key=1, len=8).header()[:30])
        s4 = self.authed(rng)
        r = self.model.regions["rw"]
        s4.sock.sendall(w.Frame(w.PUT, key=r.key, off=r.len, len=1000).header() + bytes(100))
        self.stalls = [(s1, 0), (s2, 1), (s3, 1), (s4, 1)]
        self.count(requests=1)                                # s4's header was a request
        self.idle = self.authed(rng)

    def _finish_stalls(self):
        if not self.stalls:
            return
        left = self.stall_t0 + w.IO_TIMEOUT + 1.0 - time.monotonic()
        if left > 0:
            self.log(f"waiting {left:.1f} s for the stalled connections to be dropped")
            time.sleep(left)
        for k, (s, bad) in enumerate(self.stalls):
            try:
                data = s.wait_eof(timeout=15)
            except TimeoutError:
                self.fail(f"stalled connection {k + 1} was not dropped after "
                          f"{w.IO_TIMEOUT + 16:.0f} s")
            if data:
                self.fail(f"stalled connection {k + 1} got {len(data)} bytes")
            s.close()
            self.count(bad_frames=bad)
        self.stalls = []
        r = self.model.regions["small_ro"]          # the idle one still works
        f = w.Frame(w.GET, key=r.key, len=r.len, id=1)
        o = self.model.predict(f)
        data, eof = self.idle.exchange(f.wire() + w.Frame(w.BYE).wire(), 64 + r.len, True)
        self.check_replies(data, [f, w.Frame(w.BYE)], [o, w.Outcome(close=True)], eof, True)
        self.idle.close()
        self.idle = None
        self.count(requests=1)

    # -- checkpoints --

    def settle(self, exact=False, timeout=20.0):
        """Wait until the server's counters match what was sent (connections still closing
        are given time); FuzzError if they do not."""
        pending = sum(b for _, b in self.stalls)
        base = (self.conn is not None) + (self.idle is not None) + \
            (1 if self.legit is not None and self.legit.is_alive() else 0)
        deadline = time.monotonic() + timeout
        while True:
            s = self.target.ask("stats")
            with self.lock:
                e = dict(self.exp)
            ok = (base <= s["active"] <= base + len(self.stalls) and
                  e.get("bad_frames", 0) <= s["bad_frames"] <= e.get("bad_frames", 0) + pending
                  and s["auth_failures"] == e.get("auth_failures", 0) and
                  s["accepted"] == e.get("accepted", 0))
            if exact:
                legit = self.legit.frames if self.legit else 0
                ok = ok and s["requests"] == e.get("requests", 0) + legit
            if ok:
                return s
            if time.monotonic() > deadline:
                self.fail(f"server counters {s} do not match: expected {e}, {base} active "
                          f"(+{len(self.stalls)} stalled), "
                          f"legit requests {self.legit.frames if self.legit else 0}")
            time.sleep(0.02)

    def checkpoint(self, exact=False):
        self.target.check_alive()
        if self.legit is not None and self.legit.error:
            self.fail(f"the legitimate client failed: {self.legit.error}")
        stats = self.settle(exact)
        d = self.target.ask("digest")
        if d["canaries"] != self.digest0["canaries"]:
            self.fail("memory outside the registrations changed (canaries)")
        for name, r in self.model.regions.items():
            if r.data is not None and hashlib.sha256(r.data).hexdigest() != d[name]:
                diff = self.target.ask(f"dump {name}")["hex"]
                have = bytes.fromhex(diff)
                at = next(i for i in range(len(have)) if have[i] != r.data[i])
                self.fail(f"registration {name} differs from the model at byte {at}")
        if self.legit is not None and not self.legit.is_alive() and exact:
            if hashlib.sha256(self.legit.mirror).hexdigest() != d["legit"]:
                self.fail("the legitimate client's registration differs from what it wrote")
        return stats

    # -- running --

    def run(self, cases, first=0, checkpoint_every=2000):
        t0 = time.monotonic()
        i = first
        done = 0
        next_check = checkpoint_every
        legit0 = 0
        while done < cases:
            self.case_index = i
            rng = random.Random(self.seed * 1000003 + i)
            kind = self.variant = rng.choices(self.KINDS, self.WEIGHTS)[0]
            self.kinds[kind] += 1
            try:
                done += getattr(self, "case_" + kind)(rng)
            except (TimeoutError, w.Closed, OSError) as e:
                self.fail(f"{kind}: {type(e).__name__}: {e}")
            i += 1
            if done >= next_check:
                self.checkpoint()
                next_check = done + checkpoint_every
                if self.legit is not None:
                    if self.legit.frames == legit0 and self.legit.is_alive():
                        self.fail("the legitimate client made no progress")
                    legit0 = self.legit.frames
                self.log(f"{done} cases in {time.monotonic() - t0:.1f} s; "
                         f"{dict(self.kinds)}")
        self.case_index = "end"
        if self.conn is not None:
            data = self.conn.exchange(w.Frame(w.BYE).wire(), 0, True)[0]
            self.conn.close()
            self.conn = None
            if data:
                self.fail("bytes answered to BYE")
        self._finish_stalls()
        if self.legit is not None:
            self.legit.finish()
            if self.legit.error:
                self.fail(f"the legitimate client failed: {self.legit.error}")
        stats = self.checkpoint(exact=True)
        if stats["active"] != 0:
            self.fail(f"{stats['active']} connections still open at the end")
        self.target.check_alive()
        return {"seed": self.seed, "cases": done, "first": first, "last": i - 1,
                "seconds": round(time.monotonic() - t0, 2), "kinds": dict(self.kinds),
                "outcomes": dict(sorted(self.outcomes.items())),
                "server": stats, "legit_requests": self.legit.frames if self.legit else 0,
                "server_pid": self.target.pid}

    def close(self):
        for s, _ in self.stalls:
            s.close()
        if self.idle:
            self.idle.close()
        if self.conn:
            self.conn.close()
        if self.legit is not None and self.legit.is_alive():
            self.legit.finish(5)
        return self.target.stop()
