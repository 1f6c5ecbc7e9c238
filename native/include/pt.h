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
int pt_last_errno(void);

/* ---- segments: page-aligned shared memory (memfd), mappable by same-host peers ---- */

typedef struct pt_segment pt_segment_t;

pt_status_t pt_segment_create(size_t len, pt_segment_t **out);
void pt_segment_destroy(pt_segment_t *seg);
void *pt_segment_base(const pt_segment_t *seg);
size_t pt_segment_len(const pt_segment_t *seg);
int pt_segment_fd(const pt_segment_t *seg);

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
 * still in its handshake closed to make room for a new one). */
typedef struct {
    uint64_t accepted, active, auth_failures, bad_frames, requests, bytes_in, bytes_out;
    uint64_t refused;
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
/* How rank is reached: 0 not at all, 1 this process or shared memory, 2 tcp. */
int pt_ctx_transport(pt_ctx_t *ctx, int rank);

/* SHA-256 and HMAC-SHA256 (the transport's own, exposed for tests and tools). */
void pt_sha256(const void *msg, size_t len, uint8_t out[32]);
void pt_hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]);

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
