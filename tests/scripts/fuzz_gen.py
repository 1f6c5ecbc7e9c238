"""Frame generator of the tcp protocol fuzzer: requests drawn from a seeded Random, mostly
hostile (wrong keys, offsets near 2^64, huge lengths, bad ops and reserved fields, bad
PUT_INDEXED sets), never writing what the model marks protected."""
import fuzz_wire as w


def _u64(rng):
    return rng.getrandbits(64)


def _interesting_int(rng):
    return rng.choice([0, 1, -1, 2, 7, 8, (1 << 63) - 1, -(1 << 63), 1 << 32, -(1 << 32),
                       rng.randint(-1000, 1000), w.s64(_u64(rng))])


class Gen:
    """Draws frames, mostly hostile, against the regions of a model."""

    def __init__(self, model, stale_key):
        self.m = model
        self.stale = stale_key
        self.names = sorted(model.regions)

    def region(self, rng):
        return self.m.regions[rng.choice(self.names)]

    def key(self, rng, r):
        """Usually r's key; sometimes a wrong one."""
        k = rng.random()
        if k < 0.78:
            return r.key
        return rng.choice([
            self.region(rng).key,                                   # another registration's
            self.stale,                                             # deregistered
            0,
            _u64(rng),
            r.key ^ (rng.getrandbits(48) << 16) or 1 << 16,          # right slot, wrong nonce
            (r.key & ~0xFFFF) | rng.randint(w.MAX_REGS, 0xFFFF),     # slot out of range
            (r.key & ~0xFFFF) | rng.randint(100, w.MAX_REGS - 1),    # a slot nobody uses
        ])

    def offset(self, rng, r, n, align=1):
        k = rng.random()
        if k < 0.7 and r.len >= n:
            o = rng.randint(0, r.len - n)
            return o - o % align
        return rng.choice([0, 1, 4, 7, r.len - n, r.len - 1, r.len, r.len + 1, r.len + 8,
                           1 << 31, 1 << 32, (1 << 63) - 1, 1 << 63, w.M64, w.M64 - 7,
                           w.M64 - r.len + 1, (1 << 64) - n, _u64(rng)]) & w.M64

    def length(self, rng, r):
        k = rng.random()
        if k < 0.75:
            return rng.choice([0, 1, 8, rng.randint(0, 64), rng.randint(0, max(r.len, 1)),
                               r.len])
        if k < 0.995:
            return rng.choice([r.len + 1, 65537, 1 << 20, w.MAX_PAYLOAD, w.MAX_PAYLOAD + 1,
                               1 << 32, 1 << 63, w.M64, _u64(rng), w.M64 - 63])
        return w.MAX_PAYLOAD    # a full-size payload now and then

    def frame(self, rng, id_):
        """One request frame, hostile or not (the model decides what it must give)."""
        op = rng.choices([w.GET, w.PUT, w.FETCH_ADD, w.CSWAP, w.NOTIFY, w.PUT_INDEXED,
                          w.PUT_NOTIFY, "bad"], [24, 22, 12, 10, 5, 14, 8, 3])[0]
        r = self.region(rng)
        f = w.Frame(w.GET, key=self.key(rng, r), id=id_ if rng.random() < 0.9 else _u64(rng))
        if op in (w.GET, w.PUT):
            f.op = op
            f.len = self.length(rng, r)
            if f.len > 128 * 1024 and f.len <= w.MAX_PAYLOAD and rng.random() < 0.9:
                f.len = rng.randint(0, 4096)      # keep most payloads small
            f.off = self.offset(rng, r, min(f.len, r.len))
            if op == w.PUT and f.len <= w.MAX_PAYLOAD:
                f.payload = rng.randbytes(f.len)
        elif op in w.ATOMICS:
            f.op = op
            f.off = self.offset(rng, r, 8, align=8 if rng.random() < 0.85 else 1)
            f.a, f.b = _interesting_int(rng), _interesting_int(rng)
        elif op == w.PUT_INDEXED:
            self.indexed(rng, r, f)
        elif op == w.PUT_NOTIFY:
            f.op = op
            n = rng.randint(0, 512) if rng.random() < 0.9 else self.length(rng, r)
            f.off = self.offset(rng, r, min(n, r.len))
            c = self.region(rng)
            f.a = self.key(rng, c)
            f.b = self.offset(rng, c, 8, align=8 if rng.random() < 0.85 else 1)
            if n + 8 <= w.MAX_PAYLOAD:
                f.payload = _interesting_int(rng).to_bytes(8, "little", signed=True) + \
                    rng.randbytes(n)
            f.len = n + 8 if rng.random() < 0.95 else rng.choice([0, 7])
        else:
            f.op = rng.choice([0, w.HELLO, w.AUTH, w.AUTH_OK, w.GET | w.REPLY, w.PUT | w.REPLY,
                               w.PUT_NOTIFY_QUIET + 1, 0x7F, 0xFF, 0xFFFF,
                               rng.getrandbits(16) | 0x100])   # (never a valid op)
            f.len = rng.choice([0, 32, 64])
        if rng.random() < 0.04:
            self.corrupt(rng, f)
        if self.m.is_protected_write(f):
            # move it past the end of the region its key names (never write the legit one's)
            f.off = self.m.by_key[f.key & w.M64].len + 1 + rng.randint(0, 64)
            if f.op == w.PUT_INDEXED:
                f.off |= 1 << 63                     # its set now starts past the end
        assert not self.m.is_protected_write(f), f
        return f

    def indexed(self, rng, r, f):
        """A PUT_INDEXED set: usually consistent, sometimes not."""
        f.op = w.PUT_INDEXED
        isz = rng.choice([1, 2, 4, 8, 8, 16, 3, rng.randint(1, 64)])
        n = rng.randint(1, 40)
        room = max(r.len - isz, 0)
        offs = [rng.randint(0, room) for _ in range(n)]
        k = rng.random()
        if k < 0.1:
            offs[rng.randrange(n)] = rng.choice([r.len, r.len - isz + 1, w.M64, 1 << 63,
                                                 _u64(rng)])
        lo, hi = min(offs), max(offs)
        f.off = lo
        span = hi - lo + isz
        if 0.1 <= k < 0.2:
            f.off = lo + rng.randint(1, 8)                   # some offsets below the set
        if 0.2 <= k < 0.3:
            span = rng.choice([0, -1, isz - 1, hi - lo, 1 << 62, w.s64(_u64(rng))])
        f.a, f.b = span, isz
        if 0.3 <= k < 0.35:
            f.b = rng.choice([0, -1, -(1 << 63), w.MAX_PAYLOAD + 1, 1 << 40])
        payload = b"".join((o & w.M64).to_bytes(8, "little") for o in offs) + \
            rng.randbytes(n * isz)
        f.len = len(payload)
        if 0.35 <= k < 0.4:
            f.len = rng.choice([0, len(payload) - 1, len(payload) + 1, w.M64])
        if f.len <= w.MAX_PAYLOAD:
            payload = (payload + bytes(max(0, f.len - len(payload))))[:f.len]
        f.payload = payload
        f.key = f.key if rng.random() < 0.9 else self.key(rng, r)

    def corrupt(self, rng, f):
        """A reserved field or the magic set: a malformed frame."""
        what = rng.choice(["magic", "flags", "status", "rsvd", "len"])
        if what == "magic":
            f.magic = w.MAGIC ^ (1 << rng.randrange(32)) if rng.random() < 0.7 else \
                rng.getrandbits(32)
        elif what == "flags":
            f.flags = rng.randint(1, 0xFFFF)
        elif what == "status":
            f.status = rng.randint(1, w.M32)
        elif what == "rsvd":
            f.rsvd = rng.randint(1, w.M32)
        elif f.op in w.ATOMICS:
            f.len = rng.choice([1, 8, w.M64])
        else:
            f.len = w.MAX_PAYLOAD + rng.randint(1, 1 << 20)
