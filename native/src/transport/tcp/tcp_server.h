/* The tcp target's connections and serving state, shared by the server (tcp_server.c) and
 * the waiting ranks that read in its threads' place (tcp_help.c). Internal. */
#ifndef PT_TCP_SERVER_H
#define PT_TCP_SERVER_H

#include "transport/tcp/tcp_proto.h"

struct serve;

typedef struct pt_tcp_sconn {
    struct pt_tcp_server *srv;
    int fd;                     /* (srv->lock) -1 once its thread closed it */
    pthread_mutex_t rd;         /* the reader token: whoever holds it reads the socket */
    int ep;                     /* the sleeper its thread sleeps on (-1: it reads alone) */
    int alarm;                  /* the sleeper's alarm (-1: none) */
    _Atomic int linger;         /* a helper left the interest off and set the alarm */
    _Atomic int64_t linger_ns;  /* until when (pt__now, ns): a helper back in time moves
                                 * this, not the alarm; the alarm's thread sleeps on */
    _Atomic int rank;           /* (srv->lock) the world rank served once others may read in
                                 * its thread's place, else -1 */
    struct serve *s;            /* the thread's serving state, for a helper holding rd */
    pthread_t thread;
    _Atomic int done;
    uint64_t seq;               /* accept order: the oldest handshake is closed first */
    int authed;                 /* (srv->lock) past the handshake, counted in srv->authed */
    _Atomic int evicted;        /* closed by the listener while still in the handshake */
    struct pt_tcp_sconn *next;
} pt_tcp_sconn_t;

typedef struct pt_tcp_server {
    pt_ctx_t *ctx;
    int lfd;
    pt_plat_wakefd_t wake;      /* brings the listener out of poll() to stop */
    pthread_t thread;
    pthread_mutex_t lock;       /* the connection list, pending, authed, seq */
    pt_tcp_sconn_t *conns;
    int pending, authed;        /* connections in the handshake (not evicted), and past it */
    uint64_t seq;
    _Atomic int stopping;
    _Atomic uint64_t accepted, active, auth_failures, bad_frames, requests, bytes_in, bytes_out;
    _Atomic uint64_t refused, quiet_refused, helped;
    int help;                   /* waiting ranks may read (POOLTENSOR_TCP_HELP, default on) */
    uint64_t incarnation;       /* random, told in every HELLO: a restarted server differs */
} pt_tcp_server_t;

/* A PUT_NOTIFY or PUT_NOTIFY_QUIET being read, in parts where a helper began it: a helper
 * reads only what has come (its rank waits with a deadline of its own, and a frame cut off by
 * a partition would otherwise hold it for the socket's PT_TCP_IO_TIMEOUT); whoever holds rd
 * next reads on, the helper's next wait or the thread. The thread reads its own in one go. */
typedef struct {
    pt_tcp_hdr_t h;
    int64_t v;                  /* its value, added to its counter once all of it is in */
    int64_t old;                /* the counter before that (a PUT_NOTIFY's answer) */
    uint64_t done;              /* payload bytes in */
    uint32_t head;              /* bytes of header and value (peeked) still in the socket */
    pt_status_t st;             /* PT_OK, or the refusal: the rest is read and dropped */
    int on;
} pt_tcp_part_t;

/* One served connection's state while its thread runs. */
typedef struct serve {
    pt_tcp_server_t *srv;
    pt_tcp_sconn_t *conn;
    pt_ctx_t *ctx;
    int fd;
    int rank;                   /* the client's claimed (and authenticated) rank, or -1 */
    int from;                   /* that rank when it is one of the world's others, else -1
                                 * (rank is set only for peers this process dials too) */
    uint8_t *scratch;           /* put_indexed payloads, grown up to PT_TCP_MAX_PAYLOAD */
    size_t scratch_len;
    double hs_deadline;         /* > 0 during the handshake: when it must be over */
    pt_tcp_part_t part;         /* (rd) a helper's frame not all read yet */
} serve_t;

/* Begin s->part: the frame whose header is h and value v, `head` bytes of them (a helper's
 * peek) still in the socket. */
void pt__tcp_part_begin(serve_t *s, const pt_tcp_hdr_t *h, int64_t v, uint32_t head);
/* Read on in s->part: all of it (until < 0: as the thread reads) or what comes before
 * `until` (pt__now; a helper). 1: all of it is in and its counter moved; 0: some is still to
 * come; -1: the stream broke. */
int pt__tcp_part_read(serve_t *s, double until);
/* Whether a request header is well formed (magic, op, a length that op allows). */
int pt__tcp_valid_request(const pt_tcp_hdr_t *h);

/* tcp_help.c */
int pt__tcp_readable(int fd);
/* A connection from a world rank, past the handshake: let waiters read it. 1: c->ep is open
 * and this thread holds rd (published: others may take it while the thread sleeps). */
int pt__tcp_helpable(pt_tcp_sconn_t *c, serve_t *s);
/* Sleep until input comes (or 0.5 s, to look at stopping) with the token given up; rd is
 * held again on return. */
void pt__tcp_sleep_unlocked(pt_tcp_sconn_t *c);

#endif
