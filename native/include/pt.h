/* pooltensor native data path: the one public header.
 *
 * C11, libc and pthreads only; knows nothing of Python. Every function returns a pt_status_t and
 * writes its outputs (last arguments) only on success. Names are pt_<object>_<verb>.
 */
#ifndef PT_H
#define PT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    PT_OK = 0,
    PT_ERR_INVALID,       /* bad argument from the caller */
    PT_ERR_NOMEM,
    PT_ERR_SYS,           /* a system call failed; errno kept in pt_last_errno() */
    PT_ERR_KEY,           /* refused at the target: no registration under that key */
    PT_ERR_BOUNDS,        /* refused at the target: range outside the registration */
    PT_ERR_MODE,          /* refused at the target: write into a read-only registration */
    PT_ERR_ALIGN,         /* atomics need 8-byte aligned offsets */
    PT_ERR_UNSUPPORTED,   /* the transport cannot do this operation on this memory */
    PT_ERR_TIMEOUT,
    PT_ERR_PEER_LOST,
    PT_ERR_CLOSED,
    PT_ERR_MISMATCH,      /* ranks called a collective with different arguments */
    PT_ERR_AUTH,          /* tcp: the peer does not know the same secret */
    PT_ERR_INDOUBT,       /* tcp: the connection dropped while this request (not one that is
                             safe to repeat) was in flight: it may or may not have been applied */
    PT_ERR_RESTARTED,     /* tcp: the peer restarted: what it held is gone */
} pt_status_t;

typedef enum {
    PT_I8, PT_I16, PT_I32, PT_I64, PT_U8, PT_U16, PT_U32, PT_U64,
    PT_F16, PT_BF16, PT_F32, PT_F64, PT_NDTYPES
} pt_dtype_t;

typedef enum { PT_SUM, PT_PROD, PT_MIN, PT_MAX, PT_NOPS } pt_op_t;

const char *pt_status_str(pt_status_t st);
/* The platform profile this build was made with: "linux" or "posix". */
const char *pt_platform(void);
/* How long every wait polls before it sleeps (process-wide; default $POOLTENSOR_SPIN_US or 20 us). */
void pt_set_spin(double seconds);
/* The poll time a wait starts with now: pt_set_spin's, or a few microseconds while more threads
 * are runnable on this machine than it has CPUs (Linux). */
double pt_spin(void);
int pt_last_errno(void);

/* ---- segments: page-aligned shared memory (memfd), mappable by same-host peers ---- */

typedef struct pt_segment pt_segment_t;

pt_status_t pt_segment_create(size_t len, pt_segment_t **out);
void pt_segment_destroy(pt_segment_t *seg);
void *pt_segment_base(const pt_segment_t *seg);
size_t pt_segment_len(const pt_segment_t *seg);
int pt_segment_fd(const pt_segment_t *seg);
/* What this process's segments are made of: "memfd", "tmpfs" (a private tmpfs with 2 MiB
 * pages, where shared memory gets none otherwise; $POOLTENSOR_SEGMENTS) or "shm_open". */
const char *pt_segment_kind(void);

/* ---- the endpoint: this process's control block, registrations, peers, progress ---- */

typedef struct pt_ctx pt_ctx_t;
typedef struct pt_req pt_req_t;

enum { PT_ACCESS_R = 1, PT_ACCESS_RW = 3 };

/* Where a peer's control block can be found: enough for a same-host peer to map it. */
typedef struct {
    int32_t pid;
    int32_t ctrl_fd;
    uint64_t ctrl_len;
} pt_addr_t;

pt_status_t pt_ctx_create(int rank, int size, int nthreads, pt_ctx_t **out);
void pt_ctx_destroy(pt_ctx_t *ctx);
void pt_ctx_addr(const pt_ctx_t *ctx, pt_addr_t *out);
/* Map a same-host peer's control block and start watching its process for death. */
pt_status_t pt_ctx_connect(pt_ctx_t *ctx, int rank, const pt_addr_t *addr);
/* Every same-host peer is connected (pt_ctx_connect): from now on, a segment every one of them
 * has mapped loses its name (posix profile: shm_open names leave /dev/shm as soon as they
 * are no longer needed; peers map what exists at connect at once, later segments at first
 * use). */
pt_status_t pt_ctx_connected_all(pt_ctx_t *ctx);
/* 1 when the peer is known to be gone. */
int pt_ctx_peer_lost(pt_ctx_t *ctx, int rank);
/* The first peer seen dead (the likely cause when several are gone), or -1. */
int pt_ctx_first_lost(pt_ctx_t *ctx);
/* Barrier over all ranks that share rank `root`'s control block (same host). */
pt_status_t pt_ctx_barrier(pt_ctx_t *ctx, int root, const int *ranks, int n, double timeout);

/* Registration: expose [base, base+len) under a fresh key. The range is served straight from
 * a segment when it lies in one of this context's segments, otherwise by cross-memory
 * attach (get/put only). */
pt_status_t pt_ctx_register(pt_ctx_t *ctx, void *base, size_t len, int access, uint64_t *key_out);
pt_status_t pt_ctx_deregister(pt_ctx_t *ctx, uint64_t key);
/* Serve only the first `len` bytes of a registration from now on (a memory server's client
 * lends that much: leases). Up to the end of its segment; an access past it is
 * PT_ERR_BOUNDS. Returns once no tcp request is inside the part cut off. */
pt_status_t pt_ctx_limit(pt_ctx_t *ctx, uint64_t key, size_t len);
/* Track a segment made by pt_segment_create so registrations inside it go direct. */
pt_status_t pt_ctx_add_segment(pt_ctx_t *ctx, pt_segment_t *seg);
pt_status_t pt_ctx_remove_segment(pt_ctx_t *ctx, pt_segment_t *seg);

/* One-sided operations. Checked against the target's registration table (key, bounds, mode). */
pt_status_t pt_get(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst, size_t len);
pt_status_t pt_put(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src, size_t len);
pt_status_t pt_fetch_add(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                         int64_t *old_out);
pt_status_t pt_compare_swap(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t expected,
                            int64_t desired, int64_t *old_out);

/* Direct access to [off, off+len) of rank's registration where the transport can map it
 * (shared memory, segment-backed registrations): *ptr stays valid until pt_ctx_destroy.
 * Checked like a get (or a put, when write). PT_ERR_UNSUPPORTED where it cannot be mapped. */
pt_status_t pt_attach(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, size_t len, int write,
                      void **ptr);
/* n items of itemsize bytes from src to the byte offsets offs[i] of rank's registration: an
 * element-precise scatter in one call (bounds and mode checked for the whole set first). */
pt_status_t pt_put_indexed(pt_ctx_t *ctx, int rank, uint64_t key, const uint64_t *offs, size_t n,
                           size_t itemsize, const void *src);

/* Asynchronous get/put: completed by the context's progress threads, never the caller. */
pt_status_t pt_get_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, void *dst, size_t len,
                         pt_req_t **out);
pt_status_t pt_put_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                         size_t len, pt_req_t **out);
/* PT_OK when done, PT_ERR_TIMEOUT when not done in time (request still live), or the
 * operation's own error. timeout < 0 waits for ever. */
pt_status_t pt_req_wait(pt_req_t *req, double timeout);
/* 1 when complete (status in *st), 0 otherwise. */
int pt_req_test(pt_req_t *req, pt_status_t *st);
/* Drop the caller's reference; the request is freed once complete. */
void pt_req_release(pt_req_t *req);

/* ---- tcp: one-sided operations between machines, served at the target by native threads ----
 *
 * Every context can serve its registrations over tcp (pt_ctx_listen) and reach peers over tcp
 * (pt_ctx_connect_tcp); both ends must hold the same secret (HMAC-SHA256 challenge-response in
 * both directions before any request). Once a rank has a tcp address, get/put/atomics/notify/
 * put_indexed and the async requests to it go over tcp (attach: PT_ERR_UNSUPPORTED). A request
 * not answered within the context's timeout fails with PT_ERR_TIMEOUT. A context made as
 * pt_ctx_create(0, 1, ...) serves any authenticated client (a memory server).
 *
 * Reconnect: a connection that drops (end of stream, reset) is dialed again with backoff until
 * the deadline of the requests it carried (an idle one: for the context's timeout). Requests
 * that are safe to repeat (get, put, put_indexed, and any request not sent yet) go again on the
 * new connection; fetch_add, compare_swap, notify and put_notify that were sent fail with
 * PT_ERR_INDOUBT. A dial refused (nothing listens there: the process is gone) marks the peer
 * lost (PT_ERR_PEER_LOST); one that cannot be reached until the deadline fails what waited
 * with PT_ERR_TIMEOUT and is not marked lost (the next call dials again). A peer that answers
 * with another incarnation (its listener was made anew: it restarted) fails what was in flight
 * with PT_ERR_RESTARTED, counts a restart (pt_ctx_tcp_peer_stats) and marks the peer lost
 * (what it held is gone) until the caller rejoins it (pt_ctx_tcp_rejoin): then new requests
 * go to the new incarnation. */

/* The shared secret: at least 16 bytes. Needed before listen or the first tcp connection. */
pt_status_t pt_ctx_set_secret(pt_ctx_t *ctx, const void *secret, size_t len);
/* Seconds a tcp operation (and a connection attempt) may take before PT_ERR_TIMEOUT; default
 * $POOLTENSOR_TIMEOUT or 60. */
pt_status_t pt_ctx_set_timeout(pt_ctx_t *ctx, double seconds);
/* Serve this ctx's registrations on host:port (port 0: any; host NULL or "": 127.0.0.1);
 * *port_out: the bound port. One listener per context. */
pt_status_t pt_ctx_listen(pt_ctx_t *ctx, const char *host, int port, int *port_out);
/* Reach `rank` over tcp at host:port; the connection is made on first use. */
pt_status_t pt_ctx_connect_tcp(pt_ctx_t *ctx, int rank, const char *host, int port);
/* A same-machine peer (reached over shared memory) also listens at host:port: what shared
 * memory cannot reach of its memory (atomics and notifies on registrations outside its
 * segments; gets and puts there too where the system has no cross-memory attach) is sent
 * there and served by its native threads, checked there like any tcp request. The rest still
 * goes through shared memory. The connection is made on first use. */
pt_status_t pt_ctx_connect_tcp_served(pt_ctx_t *ctx, int rank, const char *host, int port);
/* Make the connection to rank now rather than on first use (so that its loss is seen even
 * before any request); PT_OK once it is up and authenticated. */
pt_status_t pt_ctx_tcp_open(pt_ctx_t *ctx, int rank);
/* Server-side counters of this context's listener: connections accepted and open now,
 * handshakes failed, frames refused as malformed (each closed its connection), requests
 * served, bytes received and sent on served connections (headers included), and connections
 * turned away (closed at accept while the authenticated ones were at their cap, or the oldest
 * still in its handshake closed to make room for a new one), and pt_put_notify_quiet frames
 * refused (key, bounds, mode or alignment: nothing was written, nobody was told). */
typedef struct {
    uint64_t accepted, active, auth_failures, bad_frames, requests, bytes_in, bytes_out;
    uint64_t refused, quiet_refused;
    uint64_t helped; /* of those frames, the ones a waiting rank read itself (Linux) */
} pt_tcp_stats_t;
void pt_ctx_tcp_stats(pt_ctx_t *ctx, pt_tcp_stats_t *out);
/* What reconnect saw of one tcp peer: connections re-established after a drop, restarts seen
 * (a new incarnation answered), requests repeated on a new connection, requests failed with
 * PT_ERR_INDOUBT. */
typedef struct {
    uint64_t reconnects, restarts, retried, indoubt;
} pt_tcp_peer_stats_t;
void pt_ctx_tcp_peer_stats(pt_ctx_t *ctx, int rank, pt_tcp_peer_stats_t *out);
/* A tcp peer marked lost is reachable again (a memory server that restarted, which the caller
 * has rejoined): clear its loss so that requests go to it again. PT_ERR_INVALID for a peer
 * without a tcp address. */
pt_status_t pt_ctx_tcp_rejoin(pt_ctx_t *ctx, int rank);
/* How rank is reached: 0 not at all, 1 this process or shared memory, 2 tcp, 3 verbs. */
int pt_ctx_transport(pt_ctx_t *ctx, int rank);

/* SHA-256 and HMAC-SHA256 (the transport's own, exposed for tests and tools). */
void pt_sha256(const void *msg, size_t len, uint8_t out[32]);
void pt_hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]);

/* ---- verbs: RDMA (InfiniBand, RoCE, Thunderbolt) through libibverbs, loaded at run time ----
 *
 * The library is opened with dlopen at first use (libibverbs.so.1; macOS
 * /usr/lib/librdma.dylib; $POOLTENSOR_VERBS_LIB), never linked. A peer is reached over verbs
 * once both ends made a queue pair for each other (pt_ctx_verbs_local, its bytes given to the
 * peer through the bootstrap) and connected it (pt_ctx_connect_verbs); its tcp address should
 * be set first: tcp stays the liveness channel, and reaches the peer once its queue pair
 * fails (the operation that saw it fail returns PT_ERR_PEER_LOST, or PT_ERR_TIMEOUT when the
 * peer went silent). */
/* What the library and devices offer, as lines of text (pooltensor doctor). */
pt_status_t pt_verbs_probe(char *buf, size_t len);
/* A queue pair for rank (the device opened at the first call): *len bytes of info (in: room,
 * at least 64) to hand to rank. PT_ERR_UNSUPPORTED when no device is usable. */
pt_status_t pt_ctx_verbs_local(pt_ctx_t *ctx, int rank, void *info, size_t *len);
/* Connect rank's queue pair to what rank published; from now on rank is reached over verbs. */
pt_status_t pt_ctx_connect_verbs(pt_ctx_t *ctx, int rank, const void *info, size_t len);
/* "rc" or "uc-send" once the device is open, else NULL. */
const char *pt_ctx_verbs_profile(pt_ctx_t *ctx);
/* The device, port and GID index this context uses, the rails connected to some peer and
 * the transfers striped over two, as "name port gid rails=N striped=M"; NULL before. */
const char *pt_ctx_verbs_device(pt_ctx_t *ctx);

/* ---- signals: one-sided notification, for algorithms built on windows ---- */

/* Atomically add v to the int64 at off of rank's registration and wake whoever waits on it. */
pt_status_t pt_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v);
/* Put len bytes from src at off of rank's registration `key`, then (once they are all in the
 * target's memory) add v to the int64 at noff of registration nkey and wake its waiters, as
 * pt_notify: whoever sees the counter move sees the bytes. Over tcp one round trip (the
 * notify rides on the transfer's last frame). The counter is checked like a notify target;
 * a refusal of the counter, or of a put that fits one frame (PT_TCP_CHUNK, 256 KiB), leaves
 * the target unchanged (a longer put refused past its start may have written its first
 * frames, as pt_put does); the counter never moves unless every byte was written. */
pt_status_t pt_put_notify(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, const void *src,
                          size_t len, uint64_t nkey, uint64_t noff, int64_t v);
/* pt_put_notify without waiting for the answer: *out completes with the target's status. src
 * must stay unchanged until then. Over tcp the put and its notify travel as pt_put_notify's
 * do (the guarantee is the same); transports without an asynchronous form complete it here. */
pt_status_t pt_put_notify_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                const void *src, size_t len, uint64_t nkey, uint64_t noff,
                                int64_t v, pt_req_t **out);
/* pt_put_notify with no answer at all: over tcp one frame (header, value and the bytes; more
 * than 256 KiB go in several frames back to back, the notify with the last), written by the
 * calling thread; the call returns once the socket took it. Nothing stays in flight and no
 * reply comes back (no receiver-thread hand-off, no round trip): the receiver's wait on the
 * counter is the only check. A refusal at the target changes nothing there and is counted
 * (pt_tcp_stats_t.quiet_refused), nobody is told (each frame of a longer put is checked
 * alone). These frames to one rank land in the order they were written, after every request
 * to it that completed before. Errors are what the sending met: PT_ERR_TIMEOUT when the socket
 * did not take the frame within the context's timeout (a peer that stopped reading; the
 * connection is then closed: a part of the frame may have gone), PT_ERR_PEER_LOST when the
 * peer is gone, PT_ERR_INDOUBT when the connection dropped while writing (the frame may or may
 * not land). Other transports: pt_put_notify. */
pt_status_t pt_put_notify_quiet(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                const void *src, size_t len, uint64_t nkey, uint64_t noff,
                                int64_t v);
/* pt_put_notify_quiet of head's hlen bytes followed by src's len bytes (at off + hlen), of any
 * length: the caller need not copy a message's header and its payload together. Over tcp the
 * bytes go in frames of at most 256 KiB written back to back, the notify with the last (the
 * earlier ones add nothing), so the counter still moves once, after every byte; errors as
 * pt_put_notify_quiet's (a put cut short by an error may have landed in part). Other
 * transports: pt_put of src, then pt_put_notify of head. */
pt_status_t pt_put_notify_quiet_head(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off,
                                     const void *head, size_t hlen, const void *src,
                                     size_t len, uint64_t nkey, uint64_t noff, int64_t v);
/* ---- the window channel's one-exchange allreduce (collectives/algorithms/direct.py) ----
 * A channel is one window per rank: n int64 arrival counters (one per sender), n credit
 * counters, abort records, then each sender's nslots slots of a PT_CHAN_HDR-byte header and
 * stride - PT_CHAN_HDR payload bytes. keys[r]: rank r's window key; base_out[r]: the offset of
 * this rank's slots in rank r's window; base_in[r]: rank r's slots in this one. state: five
 * arrays of n int64 the caller shares (chunks sent to, received from, acknowledged by, release
 * notified to, release shown to each rank) and keeps alive, as it does win. */
#define PT_CHAN_HDR 64
#define PT_CHAN_DONE 0   /* done: dst holds the reduction */
#define PT_CHAN_SENT 1   /* sent to every peer; receiving, reducing and releasing are the
                            caller's (a peer slower than wait, a failure's poison, a header that
                            is not this operation's) */
#define PT_CHAN_UNSENT 2 /* nothing done: a peer's next slot is not free yet */
typedef struct pt_chan pt_chan_t;
pt_status_t pt_chan_create(pt_ctx_t *ctx, int me, int n, void *win, size_t win_len,
                           const uint64_t *keys, const uint64_t *base_out,
                           const uint64_t *base_in, int nslots, uint64_t stride,
                           int64_t *const state[5], pt_chan_t **out);
void pt_chan_destroy(pt_chan_t *ch);
/* One allreduce of nbytes from src into dst among all n ranks in one exchange: each peer's
 * next slot gets this rank's header (tag: group, op sequence, algorithm, digest) and src in
 * unanswered frames, then every peer's chunk is awaited (up to wait seconds in all), checked
 * against tag and nbytes, reduced with src in rank order, and released. Returns a PT_CHAN_*
 * code, or -status when a send or a release's notify to rank *peer failed, or -PT_ERR_INVALID
 * for bad arguments. */
int pt_chan_allreduce(pt_chan_t *ch, const uint64_t tag[4], pt_op_t op, pt_dtype_t dt,
                      const void *src, void *dst, size_t nbytes, double wait, int *peer);
/* How many pt_chan_allreduce calls ended PT_CHAN_DONE, PT_CHAN_SENT and PT_CHAN_UNSENT. */
void pt_chan_counts(const pt_chan_t *ch, uint64_t out[3]);
/* pt_notify without waiting for the answer: *out completes with the target's status (over
 * shared memory it is done already). Errors found at once (unknown rank, lost peer, and over
 * shared memory any refusal) are returned here instead. Notifies to one rank are applied in
 * the order they were started, after every operation to it that completed before. */
pt_status_t pt_notify_async(pt_ctx_t *ctx, int rank, uint64_t key, uint64_t off, int64_t v,
                            pt_req_t **out);
/* Wait until the local int64 at addr is >= value; polls briefly, then blocks. While waiting,
 * PT_ERR_PEER_LOST if rank `watch` (>= 0) dies, PT_ERR_TIMEOUT past timeout. */
pt_status_t pt_wait_local(pt_ctx_t *ctx, const int64_t *addr, int64_t value, int watch,
                          double timeout);

/* ---- team: collectives among the ranks of one host, through shared staging memory ---- */

typedef struct pt_team pt_team_t;

enum { PT_ALGO_AUTO = 0, PT_ALGO_ONESHOT = 1, PT_ALGO_TWOSHOT = 2 };

/* Bytes of staging memory each member registers for a team with these slots. */
size_t pt_team_stage_bytes(size_t slot_bytes, int nslots);
/* ranks: the members in rank order (this process among them); keys: each member's staging
 * registration. Collective calls on a team must be made in the same order by every member. */
pt_status_t pt_team_create(pt_ctx_t *ctx, const int *ranks, int n, const uint64_t *keys,
                           size_t slot_bytes, int nslots, pt_team_t **out);
void pt_team_destroy(pt_team_t *team);

/* Every call first compares `sig` (a digest of kind, dtype, shape, op, root) across members:
 * PT_ERR_MISMATCH on every member when they differ. On PT_ERR_TIMEOUT, PT_ERR_PEER_LOST and
 * PT_ERR_MISMATCH, *who is the index (in ranks) of the member at fault. Reductions run over
 * members in rank order, so every algorithm gives the same bytes on every member. */
pt_status_t pt_team_barrier(pt_team_t *t, double timeout, int *who);
pt_status_t pt_team_allreduce(pt_team_t *t, pt_op_t op, pt_dtype_t dt, const void *in, void *out,
                              size_t count, int algo, uint64_t sig, double timeout, int *who);
pt_status_t pt_team_allgather(pt_team_t *t, const void *in, void *out, size_t nbytes,
                              uint64_t sig, double timeout, int *who);
pt_status_t pt_team_reduce_scatter(pt_team_t *t, pt_op_t op, pt_dtype_t dt, const void *in,
                                   void *out, size_t count, uint64_t sig, double timeout,
                                   int *who);
pt_status_t pt_team_broadcast(pt_team_t *t, int root, void *buf, size_t nbytes, uint64_t sig,
                              double timeout, int *who);
/* Whether the team's members read each other's memory directly (cross-memory attach) for
 * mid-sized allgathers: 1 yes, 0 no, -1 not known until its first call of such a size. */
int pt_team_single_copy(const pt_team_t *t);

/* ---- stats: what the data path did, counted in native code ----
 *
 * Every one-sided operation started through this header (get, put, atomics, notify,
 * put_notify, put_indexed and their async forms) and every team collective is counted where it
 * enters the core, whatever transport carries it: operations, bytes, errors, timeouts and a
 * latency histogram, per (peer, transport, operation). Writers touch only counters of their own
 * thread (no lock, no read-modify-write); pt_ctx_stats sums the threads. An async operation's
 * latency runs from its start to the moment its caller sees it complete (pt_req_wait,
 * pt_req_test) or releases it. Per peer the core also keeps link events (connects,
 * reconnects, retries, timeouts, errors, losses: transports report theirs with
 * pt_stats_count) and the last error.
 *
 * The histogram is log-linear (HDR-style): values below 64 ns have a bucket each, then every
 * power of two is cut in 32 equal buckets, up to 2^38 ns (about 275 s; longer values land in
 * the last bucket). A bucket spans at most 1/32 of its values (3.1%), so a percentile read at
 * a bucket's middle is within 1.6% of the true value from 64 ns to 275 s.
 *
 * The clock is read around 1 one-sided operation in 16 (POOLTENSOR_STATS_SAMPLE) of a thread's
 * (peer, transport, operation), its first, and every one once the last timed one took 2 us or
 * more (tcp, verbs, a stalled peer): two clock reads cost more than an 8-byte get over shared
 * memory. A timed operation stands for the untimed ones before it, so the histogram's count is
 * still every operation that succeeded; `timed` says how many were measured. Collectives are
 * timed every one. */

typedef enum {
    PT_STAT_OP_GET, PT_STAT_OP_PUT, PT_STAT_OP_ATOMIC, PT_STAT_OP_NOTIFY, PT_STAT_OP_PUT_NOTIFY,
    PT_STAT_OP_PUT_INDEXED,
    /* collectives: the team engine's, and those the layers above run and record themselves */
    PT_STAT_OP_BARRIER, PT_STAT_OP_ALLREDUCE, PT_STAT_OP_ALLGATHER, PT_STAT_OP_REDUCE_SCATTER,
    PT_STAT_OP_BROADCAST, PT_STAT_OP_REDUCE, PT_STAT_OP_GATHER, PT_STAT_OP_SCATTER,
    PT_STAT_OP_ALLTOALL,
    PT_STAT_NOPS
} pt_stat_op_t;

typedef enum {
    PT_STAT_CONNECT, PT_STAT_RECONNECT, PT_STAT_RETRY, PT_STAT_TIMEOUT, PT_STAT_ERROR,
    PT_STAT_LOST, PT_STAT_NEVENTS
} pt_stat_event_t;

/* Transport slots: 0 is "world" (a collective that spans transports, recorded from above);
 * the others are the transports' ids (pt_ctx_transport). */
#define PT_STAT_NTRANSPORTS 8
#define PT_HIST_BUCKETS 1088

typedef struct {
    uint64_t count, sum_ns, min_ns, max_ns;
    uint64_t buckets[PT_HIST_BUCKETS];
} pt_hist_t;

/* One (peer, transport, operation) that was used. rank -1: the group (collectives). */
typedef struct {
    int rank, transport, op;
    uint64_t ops, bytes, errors, timeouts;
    uint64_t timed;                       /* the operations whose latency was measured */
    pt_hist_t hist;
} pt_stat_entry_t;

enum { PT_LINK_UNREACHED = 0, PT_LINK_UP = 1, PT_LINK_LOST = 2 };

/* One peer's link: state (PT_LINK_*), the transport that reaches it (0: none yet), the events
 * counted, and the last error (status, the operation, CLOCK_REALTIME seconds; 0 when none). */
typedef struct {
    int rank, state, transport;
    uint64_t events[PT_STAT_NEVENTS];
    int last_status, last_op;
    double last_time;
} pt_stat_link_t;

const char *pt_stat_op_name(int op);
const char *pt_stat_event_name(int ev);
/* "world", "shm", "tcp", ... (the transport's own name); NULL for an unused slot. */
const char *pt_stat_transport_name(int transport);
/* Process-wide switch (default on; $POOLTENSOR_STATS=0 starts it off): off, the entry points
 * read no clock and count nothing. Returns the previous setting. */
int pt_stats_enable(int on);
/* Count one operation from outside the entry points (a collective the layer above runs, a
 * synthetic value in a test): as the core counts its own. */
void pt_stats_record(pt_ctx_t *ctx, int rank, int transport, pt_stat_op_t op, uint64_t bytes,
                     pt_status_t st, uint64_t ns);
/* One link event of rank (a transport's reconnects and retries; rank -1: none in particular,
 * ignored). Thread-safe, lock-free. */
void pt_stats_count(pt_ctx_t *ctx, int rank, pt_stat_event_t ev);
/* A snapshot: every (peer, transport, operation) used so far, and every peer's link. Arrays
 * allocated with malloc; the caller frees both. */
pt_status_t pt_ctx_stats(pt_ctx_t *ctx, pt_stat_entry_t **entries, size_t *n,
                         pt_stat_link_t **links, size_t *nlinks);
/* The bucket of a value, and the smallest and largest value (ns) in bucket i. */
int pt_hist_bucket(uint64_t ns);
uint64_t pt_hist_low(int i);
uint64_t pt_hist_high(int i);
/* Add ns to h (count, sum, min, max, bucket). */
void pt_hist_add(pt_hist_t *h, uint64_t ns);
/* The q-th quantile (0 <= q <= 1) in ns: the middle of the bucket that holds it, clamped to
 * [min, max]; q = 1 is the max itself. 0 for an empty histogram. */
double pt_hist_percentile(const pt_hist_t *h, double q);

/* ---- kernels ---- */


size_t pt_dtype_size(pt_dtype_t dt);
/* Name of the instruction set the kernels dispatched to: "avx512", "avx2", "neon", "scalar".
 * Chosen at the first kernel call from what the CPU supports; POOLTENSOR_KERNELS set to one of
 * these names asks for a lesser one (the best the CPU runs at or below it). The results of
 * every kernel are bitwise the same on all of them and on every machine, x86-64 or aarch64: a NaN
 * a reduction computes is always the positive quiet NaN without payload. */
const char *pt_kernels_isa(void);

/* memmove: dst and src may overlap. */
void pt_copy(void *dst, const void *src, size_t len);
/* Map the pages of [p, p + n) for writing now, where n >= PT_PREFAULT_MIN, so that a
 * collective writing a fresh result there does not take its page faults in lockstep with its
 * peers; the bytes are left as they are. Smaller buffers: nothing. */
#define PT_PREFAULT_MIN ((size_t)1 << 20)
void pt_prefault(void *p, size_t n);
/* Strided N-d gather into contiguous dst / scatter from contiguous src, in C order. The strided
 * side points at element [0, ..., 0]; strides in bytes, may be negative or zero; ndim 0..64
 * (0: one element). The caller vouches that every element lies in its memory. PT_ERR_INVALID
 * for a negative extent, itemsize 0 or a size that overflows. */
pt_status_t pt_gather(void *dst, const void *src, int ndim, const int64_t *shape,
                      const int64_t *strides, size_t itemsize);
pt_status_t pt_scatter(void *dst, const void *src, int ndim, const int64_t *shape,
                       const int64_t *strides, size_t itemsize);
/* dst[i] = srcs[0][i] op srcs[1][i] op ... srcs[nsrc-1][i], left to right; 16-bit floats are
 * accumulated in float32 and rounded once (to nearest even). NaN propagates through min and max
 * as in np.minimum/np.maximum; integers wrap. Buffers may have any byte alignment. dst may be
 * any of the sources (in place); a partial overlap with one is PT_ERR_INVALID. */
pt_status_t pt_reduce(pt_op_t op, pt_dtype_t dt, void *dst, const void *const *srcs, int nsrc,
                      size_t count);
/* Reduce a whole buffer to one value, written in the accumulator type: int64 for signed
 * integers, uint64 for unsigned, float32 for float16/bfloat16/float32, float64 for float64.
 * Integer sums and products wrap as numpy's do; NaN propagates through min and max.
 * count == 0 gives the op's identity (min/max of nothing: PT_ERR_INVALID). */
pt_status_t pt_reduce_all(pt_op_t op, pt_dtype_t dt, const void *src, size_t count, void *out);

#ifdef __cplusplus
}
#endif
#endif
