/* The tcp initiator's frames: how many a request takes, writing its next one (or a whole get's
 * headers at once), and the connection's sender thread, which takes one frame from each queued
 * request in turn so that a small request never waits behind more than one chunk of a large
 * one. The calling thread writes small requests, and those of a few frames, itself
 * (tcp_client.c: submit_on). */
#define _GNU_SOURCE
#include "transport/tcp/tcp_client.h"

uint32_t pt__tcp_frame_count(const pt_req_t *r)
{
    if (r->op == PT_TCP_OP_GET || r->op == PT_TCP_OP_PUT || r->op == PT_TCP_OP_PUT_NOTIFY)
        return r->len ? (uint32_t)((r->len + PT_TCP_CHUNK - 1) / PT_TCP_CHUNK) : 1;
    if (r->op == PT_TCP_OP_PUT_INDEXED) {
        size_t per = PT_TCP_CHUNK / (8 + r->itemsize);
        per = per ? per : 1;
        return (uint32_t)((r->n + per - 1) / per);
    }
    return 1;
}

/* Write the request's next frame (send_lock held; the caller marked it busy). */
int pt__tcp_send_next(pt_tcp_conn_t *c, pt_req_t *r)
{
    pt_tcp_hdr_t h = {.magic = PT_TCP_MAGIC, .op = (uint16_t)r->op, .id = r->id, .key = r->key,
                      .off = r->off, .a = r->a, .b = r->b};
    uint8_t hb[PT_TCP_HDR];
    struct iovec iov[3] = {{hb, PT_TCP_HDR}};
    int n = 1;
    size_t step = 0;
    if (r->op == PT_TCP_OP_GET || r->op == PT_TCP_OP_PUT || r->op == PT_TCP_OP_PUT_NOTIFY) {
        step = r->len - r->sent < PT_TCP_CHUNK ? r->len - r->sent : PT_TCP_CHUNK;
        h.off = r->off + r->sent;
        h.len = step;
        if (r->op == PT_TCP_OP_PUT_NOTIFY && r->sent + step < r->len) {
            /* not the last frame: a plain put. Frames of one request leave in order (only one
             * thread at a time moves it, busy, taking frames in sequence: sent), and the
             * server serves them in order, so these are in memory before the last one's
             * notify */
            h.op = PT_TCP_OP_PUT;
            h.a = h.b = 0;
        } else if (r->op == PT_TCP_OP_PUT_NOTIFY) {
            h.len = 8 + step;
            iov[n++] = (struct iovec){r->value, 8};
        }
        if (r->op != PT_TCP_OP_GET && step)
            iov[n++] = (struct iovec){(uint8_t *)r->buf + r->sent, step};
    } else if (r->op == PT_TCP_OP_PUT_INDEXED) {
        size_t per = PT_TCP_CHUNK / (8 + r->itemsize);
        per = per ? per : 1;
        step = r->n - r->sent < per ? r->n - r->sent : per;
        h.off = r->lo;
        h.a = (int64_t)r->span;
        h.b = (int64_t)r->itemsize;
        h.len = step * (8 + r->itemsize);
        iov[n++] = (struct iovec){(void *)(uintptr_t)(r->offs + r->sent), 8 * step};
        iov[n++] = (struct iovec){(uint8_t *)r->buf + r->sent * r->itemsize, step * r->itemsize};
    }
    pt__hdr_pack(&h, hb);
    if (pt__tcp_sendv(c->fd, iov, n, -1, &c->abort) < 0)
        return -1;
    r->sent += step;
    return 0;
}

/* Write every frame of a get of at most PT_TCP_INLINE_FRAMES frames in one system call
 * (send_lock held; the caller marked it busy). Get frames are headers only. */
int pt__tcp_send_get_all(pt_tcp_conn_t *c, pt_req_t *r)
{
    uint8_t hb[PT_TCP_INLINE_FRAMES][PT_TCP_HDR];
    struct iovec iov[PT_TCP_INLINE_FRAMES];
    int n = 0;
    while (r->sent < r->len && n < PT_TCP_INLINE_FRAMES) {
        size_t step = r->len - r->sent < PT_TCP_CHUNK ? r->len - r->sent : PT_TCP_CHUNK;
        pt_tcp_hdr_t h = {.magic = PT_TCP_MAGIC, .op = PT_TCP_OP_GET, .id = r->id,
                          .key = r->key, .off = r->off + r->sent, .len = step};
        pt__hdr_pack(&h, hb[n]);
        iov[n] = (struct iovec){hb[n], PT_TCP_HDR};
        n++;
        r->sent += step;
    }
    return pt__tcp_sendv(c->fd, iov, n, -1, &c->abort);
}

void *pt__tcp_sender_main(void *arg)
{
    pt_tcp_conn_t *c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (!c->q_head && !atomic_load(&c->dead))
            pthread_cond_wait(&c->cond, &c->lock);
        if (atomic_load(&c->dead))
            break;
        pt_req_t *r = c->q_head;
        c->q_head = r->next;
        if (!c->q_head)
            c->q_tail = NULL;
        r->next = NULL;
        r->busy++;
        r->frames_sent++; /* counted before it goes: its reply may beat us back to the lock */
        atomic_fetch_add(&r->refs, 1);
        pthread_mutex_unlock(&c->lock);
        pthread_mutex_lock(&c->send_lock);
        int rc = pt__tcp_send_next(c, r);
        pthread_mutex_unlock(&c->send_lock);
        pthread_mutex_lock(&c->lock);
        if (rc < 0 && !atomic_load(&c->dead))
            pt__tcp_fail_locked(c, PT_ERR_PEER_LOST);
        if (rc == 0 && !r->finished && r->frames_sent < r->frames) {
            /* round robin: its next frame after one of every other queued request */
            if (c->q_tail)
                c->q_tail->next = r;
            else
                c->q_head = r;
            c->q_tail = r;
        }
        pt__tcp_unbusy_locked(c, r);
        pt_req_release(r);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}
