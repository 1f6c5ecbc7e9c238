/* The verbs transport's operations (pt_transport_verbs) and the target's side of its messages.
 *
 * Every operation first checks that the peer's verbs connection is up; once it has failed,
 * the operation goes through the tcp table (the liveness channel, connected by the world for
 * every verbs peer), so that the next use after a fault works. The target checks every
 * message like a tcp request (key, bounds, mode, alignment, under serve_lock), and in the rc
 * profile hands out a memory region for exactly one registration, so that the NIC checks
 * the one-sided accesses to it. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "transport/verbs/verbs.h"

/* ---- the target ---- */

/* rc: the memory region of registration key (made at the first resolve, dropped with it). */
static pt_status_t region(pt_ctx_t *ctx, uint64_t key, vb_hdr_t *r)
{
    pt_verbs_t *v = ctx->verbs;
    uint64_t slot = key & 0xffff;
    uint8_t *base;
    pt_status_t st = pt__reg_local(ctx, key, 0, 0, 0, &base, NULL);
    if (st != PT_OK)
        return st;
    const pt_ctrl_reg_t *reg = &ctx->ctrl->regs[slot];
    uint64_t len = reg->len;
    uint32_t access = reg->access;
    pthread_mutex_lock(&v->mr_lock);
    if (v->mrs[slot].mr && v->mrs[slot].key != key) {
        v->dev.lib->dereg_mr(v->mrs[slot].mr); /* a stale one: its key was reused */
        v->mrs[slot].mr = NULL;
    }
    if (!v->mrs[slot].mr && len > 0) {
        int acc = PT_IBV_ACCESS_REMOTE_READ;
        if (access & 2)
            acc |= PT_IBV_ACCESS_LOCAL_WRITE | PT_IBV_ACCESS_REMOTE_WRITE |
                   PT_IBV_ACCESS_REMOTE_ATOMIC;
        v->mrs[slot].mr = v->dev.lib->reg_mr(v->dev.pd, base, len, acc);
        v->mrs[slot].key = key;
    }
    pt_ibv_mr_t *mr = v->mrs[slot].mr;
    pthread_mutex_unlock(&v->mr_lock);
    if (len > 0 && !mr)
        return PT_ERR_NOMEM;
    r->addr = (uint64_t)(uintptr_t)base;
    r->b = (int64_t)len;
    r->rkey = mr ? mr->rkey : 0;
    r->a = access;
    return PT_OK;
}

void pt__verbs_forget(pt_ctx_t *ctx, uint64_t key)
{
    pt_verbs_t *v = ctx->verbs;
    if (!v)
        return;
    uint64_t slot = key & 0xffff;
    if (slot >= PT_MAX_REGS)
        return;
    pthread_mutex_lock(&v->mr_lock);
    if (v->mrs[slot].mr && v->mrs[slot].key == key) {
        v->dev.lib->dereg_mr(v->mrs[slot].mr);
        v->mrs[slot].mr = NULL;
        v->mrs[slot].key = 0;
    }
    pthread_mutex_unlock(&v->mr_lock);
}

void pt__verbs_serve(pt_ctx_t *ctx, vb_peer_t *p, int rail, const vb_hdr_t *h,
                     const uint8_t *payload)
{
    vb_hdr_t r = *h;
    uint8_t out[VB_PAYLOAD];
    size_t olen = 0;
    uint8_t *ptr = NULL;
    pt_status_t st = PT_OK;
    pthread_rwlock_rdlock(&ctx->serve_lock);
    switch (h->op) {
    case VB_RESOLVE: /* a: write wanted; b: 1 = check [off, off+len) only, no region;
                        2 = check it as an atomic's target (aligned too) */
        st = pt__reg_local(ctx, h->key, h->off, (size_t)h->len, (int)h->a, &ptr, NULL);
        if (st == PT_OK && h->b == 2 && ((uintptr_t)ptr & 7))
            st = PT_ERR_ALIGN;
        if (st == PT_OK && !h->b)
            st = ctx->verbs->dev.profile == VB_RC ? region(ctx, h->key, &r)
                                                  : PT_ERR_UNSUPPORTED;
        break;
    case VB_GET:
        if (h->len > VB_PAYLOAD) {
            st = PT_ERR_INVALID;
            break;
        }
        st = pt__reg_local(ctx, h->key, h->off, (size_t)h->len, 0, &ptr, NULL);
        if (st == PT_OK) {
            memcpy(out, ptr, (size_t)h->len);
            olen = (size_t)h->len;
        }
        break;
    case VB_PUT:
        st = pt__reg_local(ctx, h->key, h->off, (size_t)h->len, 1, &ptr, NULL);
        if (st == PT_OK)
            memcpy(ptr, payload, (size_t)h->len);
        break;
    case VB_FADD:
    case VB_CSWAP:
    case VB_NOTIFY:
        st = pt__reg_local(ctx, h->key, h->off, 8, 1, &ptr, NULL);
        if (st == PT_OK && ((uintptr_t)ptr & 7))
            st = PT_ERR_ALIGN;
        if (st != PT_OK)
            break;
        _Atomic int64_t *a = (_Atomic int64_t *)(uintptr_t)ptr;
        if (h->op == VB_CSWAP) {
            int64_t e = h->a;
            atomic_compare_exchange_strong(a, &e, h->b);
            r.a = e;
        } else {
            r.a = atomic_fetch_add(a, h->a);
        }
        if (h->op == VB_NOTIFY)
            pt_plat_wake(pt__low_word(ptr), 1);
        break;
    default:
        st = PT_ERR_INVALID;
    }
    pthread_rwlock_unlock(&ctx->serve_lock);
    r.status = (uint32_t)st;
    r.len = h->op == VB_GET && st == PT_OK ? olen : 0;
    pt__verbs_reply(ctx, p, rail, &r, out, h->op == VB_GET ? olen : 0); /* on its rail */
}

/* ---- the initiator ---- */

static vb_peer_t *peer(pt_ctx_t *ctx, int rank)
{
    if (rank < 0 || rank >= ctx->size || !ctx->verbs)
        return NULL;
    vb_peer_t *p = &ctx->verbs->peers[rank];
    return p->qp && atomic_load(&p->up) ? p : NULL;
}

#define FALLBACK(op, ...)                                                                \
    vb_peer_t *p = peer(ctx, rank);                                                      \
    if (!p) {                                                                            \
        if (rank < 0 || rank >= ctx->size || !ctx->peers[rank].tcp)                      \
            return PT_ERR_INVALID;                                                       \
        return pt_transport_tcp.op(ctx, rank, __VA_ARGS__);                              \
    }

/* rc: the target's region for key (asked once per key, then cached). */
static pt_status_t remote(pt_ctx_t *ctx, vb_peer_t *p, uint64_t key, vb_remote_t *out)
{
    vb_remote_t *c = &p->cache[(key ^ (key >> 16)) & 63];
    pthread_mutex_lock(&p->lock);
    int hit = c->key == key;
    vb_remote_t copy = *c;
    pthread_mutex_unlock(&p->lock);
    if (hit) {
        *out = copy;
        return PT_OK;
    }
    vb_hdr_t h = {.op = VB_RESOLVE, .key = key};
    vb_wait_t w;
    memset(&w, 0, sizeof(w));
    pt_status_t st = pt__verbs_call(ctx, p, &h, NULL, 0, &w);
    if (st != PT_OK)
        return st;
    vb_remote_t r = {.key = key, .addr = w.reply.addr, .len = (uint64_t)w.reply.b,
                     .rkey = w.reply.rkey, .access = (uint32_t)w.reply.a};
    pthread_mutex_lock(&p->lock);
    *c = r;
    pthread_mutex_unlock(&p->lock);
    *out = r;
    return PT_OK;
}

/* Bounds and mode against the resolved region (the NIC checks them again). */
static pt_status_t check(const vb_remote_t *r, uint64_t off, size_t len, int write)
{
    if (off > r->len || len > r->len - off)
        return PT_ERR_BOUNDS;
    if (write && !(r->access & 2))
        return PT_ERR_MODE;
    return PT_OK;
}

static pt_status_t rc_transfer(pt_ctx_t *ctx, vb_peer_t *p, uint64_t key, uint64_t off,
                               uint8_t *buf, size_t len, int write)
{
    vb_remote_t r;
    pt_status_t st = remote(ctx, p, key, &r);
    if (st == PT_OK)
        st = check(&r, off, len, write);
    if (st != PT_OK || len == 0)
        return st;
    pt_verbs_t *v = ctx->verbs;
    if (write && (int)len <= v->inline_max) { /* small: inline, from the caller's bytes */
        pt_ibv_sge_t sge = {.addr = (uint64_t)(uintptr_t)buf, .length = (uint32_t)len};
        pt_ibv_send_wr_t wr = {.sg_list = &sge, .num_sge = 1, .opcode = PT_IBV_WR_RDMA_WRITE,
                               .send_flags = PT_IBV_SEND_INLINE};
        wr.wr.rdma.remote_addr = r.addr + off;
        wr.wr.rdma.rkey = (uint32_t)r.rkey;
        return pt__verbs_rdma(ctx, p, &wr, 1);
    }
    pthread_mutex_lock(&p->op_lock);
    for (size_t done = 0; done < len && st == PT_OK;) {
        size_t part = len - done < VB_BOUNCE ? len - done : VB_BOUNCE;
        if (write)
            memcpy(p->bounce, buf + done, part);
        pt_ibv_sge_t sge[VB_BOUNCE / VB_CHUNK];
        pt_ibv_send_wr_t wr[VB_BOUNCE / VB_CHUNK];
        int n = 0;
        for (size_t k = 0; k < part; k += VB_CHUNK, n++) {
            size_t c = part - k < VB_CHUNK ? part - k : VB_CHUNK;
            sge[n] = (pt_ibv_sge_t){.addr = (uint64_t)(uintptr_t)(p->bounce + k),
                                    .length = (uint32_t)c, .lkey = v->stage_mr->lkey};
            memset(&wr[n], 0, sizeof(wr[n]));
            wr[n].sg_list = &sge[n];
            wr[n].num_sge = 1;
            wr[n].opcode = write ? PT_IBV_WR_RDMA_WRITE : PT_IBV_WR_RDMA_READ;
            wr[n].wr.rdma.remote_addr = r.addr + off + done + k;
            wr[n].wr.rdma.rkey = (uint32_t)r.rkey;
        }
        if (p->qp2_up && part >= VB_STRIPE) {
            /* two rails: the first half of the chunks on one, the rest on the other */
            vb_wait_t w0, w1;
            int h = n / 2;
            st = pt__verbs_rdma_start(ctx, p, 0, wr, h, &w0);
            pt_status_t s1 = pt__verbs_rdma_start(ctx, p, 1, wr + h, n - h, &w1);
            if (st == PT_OK)
                st = pt__verbs_wait(ctx, p, &w0);
            if (s1 == PT_OK)
                s1 = pt__verbs_wait(ctx, p, &w1);
            st = st != PT_OK ? st : s1;
            p->striped++;
        } else {
            st = pt__verbs_rdma(ctx, p, wr, n);
        }
        if (st == PT_OK && !write)
            memcpy(buf + done, p->bounce, part);
        done += part;
    }
    pthread_mutex_unlock(&p->op_lock);
    return st;
}

/* uc: a transfer as messages of up to VB_PAYLOAD bytes, VB_WINDOW in flight. */
static pt_status_t msg_transfer(pt_ctx_t *ctx, vb_peer_t *p, uint64_t key, uint64_t off,
                                uint8_t *buf, size_t len, int write)
{
    vb_wait_t w[VB_WINDOW];
    size_t nparts = len ? (len + VB_PAYLOAD - 1) / VB_PAYLOAD : 1;
    pt_status_t st = PT_OK, first = PT_OK;
    size_t started = 0, waited = 0;
    while (waited < nparts) {
        while (st == PT_OK && started < nparts && started - waited < VB_WINDOW) {
            size_t at = started * VB_PAYLOAD;
            size_t part = len - at < VB_PAYLOAD ? len - at : VB_PAYLOAD;
            vb_wait_t *x = &w[started % VB_WINDOW];
            memset(x, 0, sizeof(*x));
            vb_hdr_t h = {.op = write ? VB_PUT : VB_GET, .key = key, .off = off + at,
                          .len = part};
            x->dst = write ? NULL : buf + at;
            x->dst_len = part;
            st = pt__verbs_start(ctx, p, &h, write ? buf + at : NULL, write ? part : 0, x);
            if (st == PT_OK)
                started++;
            else if (first == PT_OK)
                first = st;
        }
        if (waited == started)
            break;
        pt_status_t s = pt__verbs_wait(ctx, p, &w[waited % VB_WINDOW]);
        if (s != PT_OK && first == PT_OK)
            first = s;
        waited++;
    }
    return first;
}

static pt_status_t vb_get(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst,
                          size_t len)
{
    FALLBACK(get, key, off, dst, len);
    if (ctx->verbs->dev.profile == VB_RC)
        return rc_transfer(ctx, p, key, off, dst, len, 0);
    return msg_transfer(ctx, p, key, off, dst, len, 0);
}

static pt_status_t vb_put(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                          size_t len)
{
    FALLBACK(put, key, off, src, len);
    uint8_t *b = (uint8_t *)(uintptr_t)src;
    if (ctx->verbs->dev.profile == VB_RC)
        return rc_transfer(ctx, p, key, off, b, len, 1);
    return msg_transfer(ctx, p, key, off, b, len, 1);
}

/* An atomic or a notify: a verbs atomic where the device's are coherent with the CPU's,
 * else a message served at the target. */
static pt_status_t atomic_op(pt_ctx_t *ctx, vb_peer_t *p, int op, uint64_t key, uint64_t off,
                             int64_t a, int64_t b, int64_t *old)
{
    pt_verbs_t *v = ctx->verbs;
    if (op != VB_NOTIFY && v->dev.profile == VB_RC && v->dev.attr.atomic_cap == PT_IBV_ATOMIC_GLOB) {
        vb_remote_t r;
        pt_status_t st = remote(ctx, p, key, &r);
        if (st == PT_OK)
            st = check(&r, off, 8, 1);
        if (st == PT_OK && ((r.addr + off) & 7))
            st = PT_ERR_ALIGN;
        if (st != PT_OK)
            return st;
        pthread_mutex_lock(&p->op_lock);
        pt_ibv_sge_t sge = {.addr = (uint64_t)(uintptr_t)p->bounce, .length = 8,
                            .lkey = v->stage_mr->lkey};
        pt_ibv_send_wr_t wr = {.sg_list = &sge, .num_sge = 1,
                               .opcode = op == VB_FADD ? PT_IBV_WR_ATOMIC_FETCH_AND_ADD
                                                       : PT_IBV_WR_ATOMIC_CMP_AND_SWP};
        wr.wr.atomic.remote_addr = r.addr + off;
        wr.wr.atomic.rkey = (uint32_t)r.rkey;
        wr.wr.atomic.compare_add = (uint64_t)a;
        wr.wr.atomic.swap = (uint64_t)b;
        st = pt__verbs_rdma(ctx, p, &wr, 1);
        if (st == PT_OK)
            memcpy(old, p->bounce, 8);
        pthread_mutex_unlock(&p->op_lock);
        return st;
    }
    vb_hdr_t h = {.op = (uint32_t)op, .key = key, .off = off, .a = a, .b = b};
    vb_wait_t w;
    memset(&w, 0, sizeof(w));
    pt_status_t st = pt__verbs_call(ctx, p, &h, NULL, 0, &w);
    if (st == PT_OK && old)
        *old = w.reply.a;
    return st;
}

static pt_status_t vb_fetch_add(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                                int64_t *old_out)
{
    FALLBACK(fetch_add, key, off, v, old_out);
    return atomic_op(ctx, p, VB_FADD, key, off, v, 0, old_out);
}

static pt_status_t vb_compare_swap(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                   int64_t expected, int64_t desired, int64_t *old_out)
{
    FALLBACK(compare_swap, key, off, expected, desired, old_out);
    return atomic_op(ctx, p, VB_CSWAP, key, off, expected, desired, old_out);
}

static pt_status_t vb_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v)
{
    FALLBACK(notify, key, off, v);
    return atomic_op(ctx, p, VB_NOTIFY, key, off, v, 0, NULL);
}

static pt_status_t vb_notify_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                   int64_t v, pt_req_t **out)
{
    FALLBACK(notify_async, key, off, v, out);
    pt_req_t *r = calloc(1, sizeof(*r)); /* done here, handed back complete */
    if (!r)
        return PT_ERR_NOMEM;
    pt_status_t st = atomic_op(ctx, p, VB_NOTIFY, key, off, v, 0, NULL);
    if (st != PT_OK) {
        free(r);
        return st;
    }
    atomic_store(&r->refs, 1);
    r->rank = rank;
    atomic_store_explicit(&r->done, 1, memory_order_release);
    *out = r;
    return PT_OK;
}

/* The range [off, off+len) of key checked at the target, nothing moved. */
static pt_status_t check_remote(pt_ctx_t *ctx, vb_peer_t *p, uint64_t key, uint64_t off,
                                uint64_t len, int write, int atomic)
{
    vb_hdr_t h = {.op = VB_RESOLVE, .key = key, .off = off, .len = len, .a = write,
                  .b = atomic ? 2 : 1};
    vb_wait_t w;
    memset(&w, 0, sizeof(w));
    return pt__verbs_call(ctx, p, &h, NULL, 0, &w);
}

static pt_status_t vb_put_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                 const void *src, size_t len, uint64_t nkey, uint64_t noff,
                                 int64_t v)
{
    FALLBACK(put_notify, key, off, src, len, nkey, noff, v);
    /* both checked first: a refusal of either leaves the target unchanged */
    pt_status_t st = check_remote(ctx, p, nkey, noff, 8, 1, 1);
    if (st == PT_OK)
        st = check_remote(ctx, p, key, off, len, 1, 0);
    if (st == PT_OK)
        st = vb_put(ctx, rank, key, off, src, len);
    if (st == PT_OK) /* after every byte is in (the put completed) */
        st = atomic_op(ctx, p, VB_NOTIFY, nkey, noff, v, 0, NULL);
    return st;
}

static pt_status_t vb_put_indexed(pt_ctx_t *ctx, int rank, uint64_t key, const uint64_t *offs,
                                  size_t n, size_t itemsize, const void *src)
{
    FALLBACK(put_indexed, key, offs, n, itemsize, src);
    uint64_t lo = offs[0], hi = offs[0];
    for (size_t i = 1; i < n; i++) {
        lo = offs[i] < lo ? offs[i] : lo;
        hi = offs[i] > hi ? offs[i] : hi;
    }
    if (hi > UINT64_MAX - itemsize)
        return PT_ERR_BOUNDS;
    pt_status_t st = check_remote(ctx, p, key, lo, hi + itemsize - lo, 1, 0);
    const uint8_t *s = src;
    for (size_t i = 0; i < n && st == PT_OK; i++)
        st = vb_put(ctx, rank, key, offs[i], s + i * itemsize, itemsize);
    return st;
}

const pt_transport_ops_t pt_transport_verbs = {
    .name = "verbs",
    .id = 3,
    .caps = PT_CAP_GET | PT_CAP_PUT | PT_CAP_ASYNC | PT_CAP_FETCH_ADD | PT_CAP_COMPARE_SWAP |
            PT_CAP_NOTIFY | PT_CAP_PUT_NOTIFY | PT_CAP_PUT_INDEXED,
    .get = vb_get,
    .put = vb_put,
    .get_async = pt_transport_queued_get_async,
    .put_async = pt_transport_queued_put_async,
    .fetch_add = vb_fetch_add,
    .compare_swap = vb_compare_swap,
    .notify = vb_notify,
    .notify_async = vb_notify_async,
    .put_notify = vb_put_notify,
    .put_indexed = vb_put_indexed,
    .map = pt_transport_unsupported_map,
    .stop = pt__verbs_stop,
    .release = pt__verbs_release,
    .forget = pt__verbs_forget,
};
