/* The window channel's one-exchange allreduce in C: the hot path of collectives/algorithms/
 * direct.py over tcp, where a small collective's Python (a few microseconds a peer, more than
 * the frame's own cost) was most of its time. The protocol is channel.py's, unchanged: slots
 * and counters in one window per rank, a 64-byte header in front of each chunk (group, op
 * sequence, algorithm, digest of the call, payload bytes, the ack of the receiver's chunks
 * consumed), unanswered frames, releases carried by the next chunk's ack or, once half the
 * slots of a peer are owed, by one unanswered notify. Only the case with nothing unusual is
 * done here: a slot not yet free, a counter a failure poisoned, a header that is not this
 * operation's, or a peer that takes longer than `wait` hand the rest back to the caller, which
 * goes on in Python exactly where this stopped. */
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "pt.h"

#define POISON ((int64_t)1 << 40) /* channel.POISON: a failure's wake-up */
#define COUNT (POISON - 1)        /* the chunk count in a counter's low bits */

/* header words are little-endian whatever the host (channel.py packs them with "<6Q") */
static void le64_put(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t le64_get(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

struct pt_chan {
    pt_ctx_t *ctx;
    int me, n, nslots;
    uint64_t stride;
    uint8_t *win;
    size_t win_len;
    uint64_t *keys, *base_out, *base_in;
    int64_t *sent, *recvd, *acked, *notified, *shown;
    const void **rows;
    uint64_t counts[3]; /* calls that ended PT_CHAN_DONE, _SENT, _UNSENT */
};

pt_status_t pt_chan_create(pt_ctx_t *ctx, int me, int n, void *win, size_t win_len,
                           const uint64_t *keys, const uint64_t *base_out,
                           const uint64_t *base_in, int nslots, uint64_t stride,
                           int64_t *const state[5], pt_chan_t **out)
{
    if (!ctx || !out || n < 1 || me < 0 || me >= n || !win || nslots < 1 ||
        stride <= PT_CHAN_HDR || win_len < (size_t)16 * (size_t)n)
        return PT_ERR_INVALID;
    for (int r = 0; r < n; r++)
        if (r != me && base_in[r] + (uint64_t)nslots * stride > win_len)
            return PT_ERR_INVALID;
    pt_chan_t *ch = malloc(sizeof(*ch));
    if (!ch)
        return PT_ERR_NOMEM;
    *ch = (pt_chan_t){.ctx = ctx, .me = me, .n = n, .nslots = nslots, .stride = stride,
                      .win = win, .win_len = win_len, .sent = state[0], .recvd = state[1],
                      .acked = state[2], .notified = state[3], .shown = state[4],
                      .keys = malloc(3 * sizeof(uint64_t) * (size_t)n),
                      .rows = malloc(sizeof(void *) * (size_t)n)};
    if (!ch->keys || !ch->rows) {
        pt_chan_destroy(ch);
        return PT_ERR_NOMEM;
    }
    /* keys, then the offsets out and in, in one block */
    ch->base_out = ch->keys + n;
    ch->base_in = ch->keys + 2 * n;
    memcpy(ch->keys, keys, sizeof(uint64_t) * (size_t)n);
    memcpy(ch->base_out, base_out, sizeof(uint64_t) * (size_t)n);
    memcpy(ch->base_in, base_in, sizeof(uint64_t) * (size_t)n);
    *out = ch;
    return PT_OK;
}

void pt_chan_destroy(pt_chan_t *ch)
{
    if (!ch)
        return;
    free(ch->keys);
    free(ch->rows);
    free(ch);
}

/* The header of the next chunk from rank s in this window (6 little-endian words). */
static const uint8_t *slot_in(const pt_chan_t *ch, int s)
{
    return ch->win + ch->base_in[s] + (uint64_t)(ch->recvd[s] % ch->nslots) * ch->stride;
}

static _Atomic int64_t *arrived(const pt_chan_t *ch, int s)
{
    return (_Atomic int64_t *)(uintptr_t)(ch->win + 8 * (size_t)s);
}

/* Whether rank d has consumed enough of this rank's chunks for the next to have a free slot:
 * by the ack of its last chunk here, or by the releases it notified (its credit counter). */
static int slot_free(const pt_chan_t *ch, int d)
{
    int64_t need = ch->sent[d] - ch->nslots + 1;
    if (need <= 0 || ch->acked[d] >= need)
        return 1;
    int64_t c = atomic_load_explicit(arrived(ch, ch->n + d), memory_order_acquire);
    return c < POISON && c >= need;
}

/* The next chunk from s is here, unpoisoned, within the deadline: 1; else 0. */
static int await_chunk(pt_chan_t *ch, int s, double deadline)
{
    _Atomic int64_t *c = arrived(ch, s);
    int64_t need = ch->recvd[s] + 1;
    for (;;) {
        int64_t x = atomic_load_explicit(c, memory_order_acquire);
        if (x >= POISON)
            return 0; /* a failure somewhere: the caller reads the abort records */
        if ((x & COUNT) >= need)
            return 1;
        double left = deadline - pt__now();
        if (left <= 0)
            return 0;
        if (pt_wait_local(ch->ctx, (const int64_t *)(uintptr_t)c, (x & ~COUNT) + need, s,
                          left) != PT_OK)
            return 0; /* timeout or a lost peer: the caller's wait says which */
    }
}

static int chan_allreduce(pt_chan_t *ch, const uint64_t tag[4], pt_op_t op, pt_dtype_t dt,
                          const void *src, void *dst, size_t nbytes, double wait, int *peer)
{
    int n = ch->n, me = ch->me, k = ch->nslots;
    size_t isz = pt_dtype_size(dt);
    if (!isz || nbytes % isz || nbytes > ch->stride - PT_CHAN_HDR || (nbytes && (!src || !dst)))
        return -PT_ERR_INVALID;
    /* every peer's next slot must be free before anything is sent: else the caller's way */
    for (int j = 1; j < n; j++)
        if (!slot_free(ch, (me + j) % n))
            return PT_CHAN_UNSENT;
    double deadline = pt__now() + wait;
    for (int j = 1; j < n; j++) { /* the peers after this rank first, as direct.py sends */
        int d = (me + j) % n;
        uint8_t hdr[PT_CHAN_HDR] = {0};
        uint64_t words[6] = {tag[0], tag[1], tag[2], tag[3], nbytes, (uint64_t)ch->recvd[d]};
        for (int w = 0; w < 6; w++)
            le64_put(hdr + 8 * w, words[w]);
        uint64_t off = ch->base_out[d] + (uint64_t)(ch->sent[d] % k) * ch->stride;
        pt_status_t st = pt_put_notify_quiet_head(ch->ctx, d, ch->keys[d], off, hdr,
                                                  PT_CHAN_HDR, src, nbytes, ch->keys[d],
                                                  8 * (uint64_t)me, 1);
        if (st != PT_OK) {
            *peer = d;
            return -(int)st;
        }
        ch->sent[d] += 1;
        ch->shown[d] = ch->recvd[d];
    }
    for (int j = 1; j < n; j++) {
        int s = (me + j) % n;
        if (!await_chunk(ch, s, deadline))
            return PT_CHAN_SENT;
        const uint8_t *h = slot_in(ch, s);
        uint64_t got[5];
        for (int w = 0; w < 5; w++)
            got[w] = le64_get(h + 8 * w);
        if (got[0] != tag[0] || got[1] != tag[1] || got[2] != tag[2] || got[3] != tag[3] ||
            got[4] != nbytes)
            return PT_CHAN_SENT; /* a leftover or a mismatch: the caller's checks name it */
    }
    /* every input here: reduced in rank order, the same bytes on every rank */
    for (int r = 0; r < n; r++)
        ch->rows[r] = r == me ? src : slot_in(ch, r) + PT_CHAN_HDR;
    if (nbytes) {
        pt_status_t st = pt_reduce(op, dt, dst, ch->rows, n, nbytes / isz);
        if (st != PT_OK)
            return -(int)st;
    }
    for (int j = 1; j < n; j++) {
        int s = (me + j) % n;
        int64_t ack = (int64_t)le64_get(slot_in(ch, s) + 40);
        if (ack > ch->acked[s])
            ch->acked[s] = ack;
        int64_t got = ++ch->recvd[s];
        int64_t told = ch->notified[s] > ch->shown[s] ? ch->notified[s] : ch->shown[s];
        int64_t owed = got - ch->notified[s];
        if (got - told >= k / 2 && owed > 0) {
            ch->notified[s] = got;
            uint64_t off = 8 * (uint64_t)(n + me);
            pt_status_t st = pt_put_notify_quiet(ch->ctx, s, ch->keys[s], off, NULL, 0,
                                                 ch->keys[s], off, owed);
            if (st != PT_OK) {
                *peer = s;
                return -(int)st;
            }
        }
    }
    return PT_CHAN_DONE;
}

int pt_chan_allreduce(pt_chan_t *ch, const uint64_t tag[4], pt_op_t op, pt_dtype_t dt,
                      const void *src, void *dst, size_t nbytes, double wait, int *peer)
{
    int rc = chan_allreduce(ch, tag, op, dt, src, dst, nbytes, wait, peer);
    if (rc >= 0 && rc < 3)
        ch->counts[rc]++;
    return rc;
}

void pt_chan_counts(const pt_chan_t *ch, uint64_t out[3])
{
    memcpy(out, ch->counts, sizeof(ch->counts));
}
