/* The peer monitor: one thread blocked in poll() on every peer's watch descriptor
 * (pt_plat_peer_watch: a pidfd on Linux), so a rank that dies (even by SIGKILL) is marked lost
 * at once and every wait on it ends with PT_ERR_PEER_LOST. Where the platform has no such
 * descriptor, the same thread asks after each peer (pt_plat_peer_gone) every 5 ms. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdlib.h>

#include "core/internal.h"

static void mark_lost(pt_ctx_t *ctx, int r)
{
    int was = atomic_load(&ctx->peers[r].lost);
    pt__peer_mark_lost(ctx, r); /* (names first the peer it saw lost, if any: core/ctx.c) */
    if (!was)
        pt_plat_reap(); /* what it left behind (posix: its shm_open names) goes now */
}

static void *monitor_main(void *arg)
{
    pt_ctx_t *ctx = arg;
    struct pollfd *fds = calloc((size_t)ctx->size + 1, sizeof(*fds));
    int *who = calloc((size_t)ctx->size + 1, sizeof(int));
    if (!fds || !who) {
        free(fds);
        free(who);
        return NULL;
    }
    for (;;) {
        int n = 0;
        fds[n].fd = ctx->wake.rfd;
        fds[n].events = POLLIN;
        who[n++] = -1;
        for (int r = 0; r < ctx->size; r++) {
            pt_peer_t *p = &ctx->peers[r];
            if (p->connected && p->watch_fd >= 0 && !atomic_load(&p->lost)) {
                fds[n].fd = p->watch_fd;
                fds[n].events = POLLIN;
                who[n++] = r;
            }
        }
        /* a peer without a watch descriptor is asked after every 5 ms: often enough that of
         * two ranks seen gone, the one that died first is the one named (first_lost) */
        int asked = 0;
        for (int r = 0; r < ctx->size && !asked; r++)
            asked = ctx->peers[r].connected && ctx->peers[r].watch_fd < 0 && r != ctx->rank;
        int rc = poll(fds, (nfds_t)n, asked ? 5 : 100);
        if (rc < 0 && errno != EINTR)
            break;
        if (fds[0].revents & POLLIN) {
            pt_plat_wakefd_drain(&ctx->wake);
            if (atomic_load(&ctx->monitor_stop))
                break;
        }
        for (int i = 1; i < n; i++)
            if (fds[i].revents)
                mark_lost(ctx, who[i]);
        for (int r = 0; r < ctx->size; r++) {
            pt_peer_t *p = &ctx->peers[r];
            if (p->connected && p->watch_fd < 0 && r != ctx->rank && pt_plat_peer_gone(p->pid))
                mark_lost(ctx, r);
        }
    }
    free(fds);
    free(who);
    return NULL;
}

pt_status_t pt__monitor_start(pt_ctx_t *ctx)
{
    pt_status_t st = pt_plat_wakefd_open(&ctx->wake);
    if (st != PT_OK)
        return st;
    if (pthread_create(&ctx->monitor, NULL, monitor_main, ctx) != 0) {
        pt_plat_wakefd_close(&ctx->wake);
        return PT_ERR_SYS;
    }
    ctx->monitor_started = 1;
    return PT_OK;
}

void pt__monitor_poke(pt_ctx_t *ctx) { pt_plat_wakefd_signal(&ctx->wake); }

void pt__monitor_stop(pt_ctx_t *ctx)
{
    if (ctx->monitor_started) {
        atomic_store(&ctx->monitor_stop, 1);
        pt_plat_wakefd_signal(&ctx->wake);
        pthread_join(ctx->monitor, NULL);
        ctx->monitor_started = 0;
    }
    pt_plat_wakefd_close(&ctx->wake);
}
