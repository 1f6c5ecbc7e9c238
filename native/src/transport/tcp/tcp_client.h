/* Private to the tcp initiator (tcp_client.c and tcp_send.c send, tcp_recv.c reads replies
 * and completes requests): a connection's state and the calls its parts share. */
#ifndef PT_TCP_CLIENT_H
#define PT_TCP_CLIENT_H

#include "transport/tcp/tcp_proto.h"

typedef struct pt_tcp_conn {
    pt_ctx_t *ctx;
    int rank, fd;
    _Atomic int abort;          /* set once, when the connection fails */
    _Atomic int dead;
    pt_status_t fail;           /* what its requests failed with */
    pthread_mutex_t lock;       /* slots, queue and the tcp fields of its requests */
    pthread_cond_t cond;        /* queue not empty / dead (the sender waits on it) */
    pthread_cond_t slot_cond;   /* a slot freed / dead (callers at PT_TCP_MAX_INFLIGHT) */
    int slot_waiters;
    pthread_mutex_t send_lock;  /* one frame at a time on the socket */
    pt_req_t *slots[PT_TCP_MAX_INFLIGHT];
    int inflight;
    uint64_t next_id;
    pt_req_t *q_head, *q_tail;  /* requests with frames still to send (sender thread) */
    int reading;                /* who reads replies now: READ_NONE, READ_RECEIVER, READ_WAITER */
    int rx_watching;            /* the receiver only watches for the peer's end */
    int rx_kicked;              /* rx_wake written since the receiver last looked */
    pt_plat_wakefd_t rx_wake;   /* the receiver must look at `reading` again */
    pthread_t sender, receiver;
    struct pt_tcp_conn *older;
} pt_tcp_conn_t;

typedef struct pt_tcp_peer {
    pt_ctx_t *ctx;
    int rank;
    char host[256];
    int port;
    pthread_mutex_t lock;       /* making a connection */
    pt_tcp_conn_t *conn;        /* the current one (may have failed) */
    uint64_t incarnation;       /* (lock) what its listener's HELLO said; 0: not known yet */
    int rejoining;              /* (lock) pt_ctx_tcp_rejoin: take a new incarnation once */
    /* reconnect (tcp_reconnect.c), guarded by rlock (taken after a connection's lock, never
     * before it) */
    pthread_mutex_t rlock;
    pthread_cond_t rcond;       /* work for the reconnect thread, or stop */
    pt_req_t *orphans;          /* requests of a dropped connection waiting for a new one */
    double probe_until;         /* > 0: a connection dropped (or a served one from it): dial
                                   it again until then to tell a drop from a death */
    int rstop, rthread_on;
    pthread_t rthread;
    _Atomic uint64_t reconnects, restarts, retried, indoubt;
    /* (lock) the extra connections large transfers are striped over (tcp_stripe.c): stripe i
     * (1..) carries part i, part 0 goes on conn; each replaced one is kept (older) until
     * destroy, as conn's are */
    pt_tcp_conn_t *stripe[PT_TCP_MAX_STRIPES];
} pt_tcp_peer_t;

/* A connection that dropped (end of stream, reset, failed send) fails its requests with this
 * internal status: the ones safe to repeat wait for a new connection (pt__tcp_orphan), the
 * others complete with PT_ERR_INDOUBT. Never returned to a caller. */
#define PT__TCP_DROPPED ((pt_status_t)1000)

/* Who reads the socket. A synchronous call that finds nobody reading reads its own reply
 * (and any other that comes first) in its own thread: no hand-off, no wake-up. Otherwise the
 * receiver thread reads while requests are in flight; with none, it only watches for the
 * peer's end (POLLRDHUP), so replies to a reading caller never wake it. */
enum { READ_NONE, READ_RECEIVER, READ_WAITER };


/* Make the receiver look at `reading` again (lock held). */
void pt__tcp_kick_locked(pt_tcp_conn_t *c);
/* Decide a request's outcome (lock held): out of the table, published unless a thread is
 * still moving its bytes (that thread publishes when it lets go). */
void pt__tcp_finish_locked(pt_tcp_conn_t *c, pt_req_t *req, pt_status_t st);
/* busy counts the threads moving a request's bytes (sender and receiver may both be). */
void pt__tcp_unbusy_locked(pt_tcp_conn_t *c, pt_req_t *req);
/* The connection fails: every request in it completes with st; no new ones are taken. */
void pt__tcp_fail_locked(pt_tcp_conn_t *c, pt_status_t st);
void pt__tcp_conn_fail(pt_tcp_conn_t *c, pt_status_t st);
/* The receiver thread: reads replies while requests are in flight, else watches for the
 * peer's end. */
void *pt__tcp_receiver_main(void *arg);
/* A synchronous call's wait when it took the reading (READ_WAITER). */
pt_status_t pt__tcp_wait_reading(pt_tcp_conn_t *c, pt_req_t *r);

/* ---- reconnect (tcp_reconnect.c) ---- */

/* A request of connection c (lock held) completed with PT__TCP_DROPPED: 1 when it waits for
 * the reconnect's outcome (it keeps the connection's reference), 0 when it must complete now
 * (its status is then set: PT_ERR_TIMEOUT past its deadline, PT_ERR_CLOSED at the end). */
int pt__tcp_orphan(pt_tcp_conn_t *c, pt_req_t *req);
/* rank's connection dropped (ours, or one it made to us): dial it again until the timeout to
 * tell a dropped connection (dialed again) from a dead peer (refused: marked lost). */
void pt__tcp_probe(pt_ctx_t *ctx, int rank);
/* Stop rank's reconnect thread; what waits for it fails with PT_ERR_CLOSED. */
void pt__tcp_reconnect_stop(pt_tcp_peer_t *p);

/* ---- striping (tcp_stripe.c) ---- */

/* A request's outcome is published: when it is a part of a striped transfer, its status joins
 * the whole's and the last part completes the whole. */
void pt__tcp_part_done(pt_req_t *r);
/* Stripes to use for a transfer of len bytes (1: not striped; POOLTENSOR_TCP_STRIPES is read
 * at a context's first large transfer). */
int pt__tcp_stripes_for(pt_ctx_t *ctx, size_t len);
/* A get or put of a whole transfer r, split in parts over rank's connections (see
 * pt__tcp_stripes_for); as issue() in tcp_client.c. */
pt_status_t pt__tcp_issue_striped(pt_ctx_t *ctx, int rank, pt_req_t *r, int nparts,
                                  pt_req_t **async_out);
/* Open a connection to rank (dial within `timeout`, authenticate) not yet anybody's; *inc:
 * the listener's incarnation. */
pt_status_t pt__tcp_conn_open(pt_ctx_t *ctx, int rank, double timeout, pt_tcp_conn_t **out,
                              uint64_t *inc);
void pt__tcp_conn_close(pt_tcp_conn_t *c);
/* Put r in flight on rank's main connection (dialed until r's deadline) or, c given, on c
 * (PT__TCP_DROPPED when c is dead). The connection then holds a reference. */
/* tcp_send.c: frames of a request, writing its next frame (send_lock held, the request marked
 * busy; 0 or -1), a get's frames (up to PT_TCP_INLINE_FRAMES) in one call, the sender thread */
uint32_t pt__tcp_frame_count(const pt_req_t *r);
int pt__tcp_send_next(pt_tcp_conn_t *c, pt_req_t *r);
int pt__tcp_send_get_all(pt_tcp_conn_t *c, pt_req_t *r);
void *pt__tcp_sender_main(void *arg);
pt_status_t pt__tcp_submit_async(pt_ctx_t *ctx, int rank, pt_tcp_conn_t *c, pt_req_t *r);

/* ---- tcp_dial.c ---- */

/* A connected socket to p within `timeout` (blocking again once connected); *refused set when
 * the peer's machine answered that nothing listens there. */
pt_status_t pt__tcp_dial(pt_tcp_peer_t *p, double timeout, int *fd_out, int *refused);
/* The client half of the handshake by `deadline`; *inc: the listener's incarnation. */
pt_status_t pt__tcp_authenticate(pt_ctx_t *ctx, int fd, double deadline, uint64_t *inc);

/* ---- tcp_client.c, for reconnect ---- */

/* Dial rank now (dial timeout `timeout`) unless its current connection is live. *refused: the
 * dial was refused (nothing listens there). *restarted: the new connection's incarnation
 * differs from the one seen before. */
pt_status_t pt__tcp_redial(pt_ctx_t *ctx, int rank, double timeout, int *refused,
                           int *restarted);
/* Put an orphan in flight again on rank's current connection (the receiver reads it). */
pt_status_t pt__tcp_resubmit(pt_ctx_t *ctx, int rank, pt_req_t *r);

#endif
