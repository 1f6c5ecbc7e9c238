/* The tcp transport's wire protocol (private to native/; stable: external tools build frames
 * from this description).
 *
 * Every message is a frame: a fixed 64-byte header, little-endian, then `len` payload bytes for
 * the ops marked "payload" below (nothing else follows a header).
 *
 *   offset size field
 *        0    4 magic    0x31545450 ("PTT1" as bytes)
 *        4    2 op       see PT_TCP_OP_*; a reply is the request's op | PT_TCP_REPLY
 *        6    2 flags    0 (reserved; a request with other bits set is a bad frame)
 *        8    4 status   replies: a pt_status_t (0 = ok); requests: 0
 *       12    4 rsvd     0
 *       16    8 id       request id chosen by the client, echoed in the reply
 *       24    8 key      registration key at the target
 *       32    8 off      byte offset inside the registration
 *       40    8 len      bytes the op is about (see below)
 *       48    8 a        operand (int64)
 *       56    8 b        operand (int64)
 *
 * Connection set-up (before it, any other frame closes the connection as unauthenticated):
 *   server -> HELLO    a = protocol version (1), b = the listener's incarnation (random, made
 *                      with the listener; 0: not told): a client that meets a new one knows
 *                      the server restarted and lost what it held; len = 32, payload: server
 *                      nonce Ns
 *   client -> AUTH     a = client rank (-1: none), len = 64, payload: client nonce Nc (32) then
 *                      HMAC-SHA256(secret, "pooltensor-tcp-client" Ns Nc le64(a))
 *   server -> AUTH_OK  status 0, len = 32, payload: HMAC-SHA256(secret, "pooltensor-tcp-server"
 *                      Ns Nc le64(a)); on a wrong MAC: status PT_ERR_AUTH, len 0, and the server
 *                      closes. The client checks the server's MAC too (both sides prove the secret).
 * Requests (client -> server), each answered by one reply with the same id, op | 0x80 and status:
 *   GET          key, off, len: bytes asked for (<= PT_TCP_MAX_PAYLOAD); no payload.
 *                reply: status; on ok len bytes of payload follow (len 0 on an error)
 *   PUT          key, off, len; payload: len bytes (<= PT_TCP_MAX_PAYLOAD). reply: status
 *   FETCH_ADD    key, off, a = value to add.            reply: status, a = old value
 *   CSWAP        key, off, a = expected, b = desired.   reply: status, a = old value
 *   NOTIFY       key, off, a = value to add; wakes waiters at the target. reply: status
 *   PUT_INDEXED  key, off = lowest offset of the whole set, a = span of the whole set in bytes
 *                (highest offset + itemsize - lowest), b = itemsize, len = payload bytes;
 *                payload: n le64 byte offsets then n items (len = n * (8 + itemsize)). The
 *                target checks [off, off + a) for bounds and mode, every offset inside it, then
 *                writes. reply: status
 *   BYE          the client is closing on purpose (not a lost peer). No reply.
 *   PUT_NOTIFY   a put, then a notify once its bytes are in memory: key, off: where the bytes
 *                go; a = notify key, b = notify offset; len = 8 + n; payload: le64 value to
 *                add, then the n bytes (n <= PT_TCP_CHUNK from clients). The target checks the
 *                put range (key, bounds, write mode) and the counter (as NOTIFY: key, bounds,
 *                write mode, a segment, 8-byte aligned) before writing anything; on a refusal
 *                it reads and drops the bytes and changes nothing. reply: status, a = the
 *                counter's old value. A transfer longer than one frame goes as PUT frames of
 *                the same id with PUT_NOTIFY as its last frame: the server serves a connection
 *                in order, so the earlier frames are in memory when the counter moves (a
 *                refused earlier frame shows in the transfer's status; the last frame is
 *                refused too when its range is, bounds and mode being the same for the whole
 *                transfer).
 *   PUT_NOTIFY_QUIET  PUT_NOTIFY in one frame that is never answered (id 0): key, off, a, b,
 *                len = 8 + n and the payload as PUT_NOTIFY's (n <= PT_TCP_CHUNK from clients).
 *                Checked alike before anything is written; a refusal changes nothing and is
 *                only counted at the target (pt_tcp_stats_t.quiet_refused). The sender learns
 *                nothing from the target: its receiver sees the counter move, or not (a
 *                collective's frames, where the receiver's own wait is the check).
 * The target checks key, bounds and mode on every request (atomics, NOTIFY and PUT_NOTIFY's
 * counter: 8-byte aligned int64).
 * A refusal is a reply with status PT_ERR_KEY / BOUNDS / MODE / ALIGN / INVALID; the
 * connection stays open. A malformed frame (bad magic, op, flags, length over the limit,
 * inconsistent PUT_INDEXED sizes, PUT_NOTIFY under 8 bytes, truncated frame, AUTH failure,
 * request before AUTH) closes the connection and is counted in pt_tcp_stats_t.bad_frames
 * (auth_failures for AUTH).
 * A server serves one connection's requests in order; a client may have many in flight and
 * matches replies by id (large transfers are split into frames of PT_TCP_CHUNK bytes, each a
 * request of its own sharing the transfer's id, told apart by off).
 */
#ifndef PT_TCP_PROTO_H
#define PT_TCP_PROTO_H

#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#include "core/internal.h"
#include "transport/tcp/sha256.h"

#define PT_TCP_MAGIC 0x31545450u
#define PT_TCP_VERSION 1
#define PT_TCP_HDR 64
#define PT_TCP_NONCE 32
#define PT_TCP_MAC 32
#define PT_TCP_REPLY 0x80

enum {
    PT_TCP_OP_HELLO = 1,
    PT_TCP_OP_AUTH = 2,
    PT_TCP_OP_AUTH_OK = 3,
    PT_TCP_OP_GET = 16,
    PT_TCP_OP_PUT = 17,
    PT_TCP_OP_FETCH_ADD = 18,
    PT_TCP_OP_CSWAP = 19,
    PT_TCP_OP_NOTIFY = 20,
    PT_TCP_OP_PUT_INDEXED = 21,
    PT_TCP_OP_BYE = 22,
    PT_TCP_OP_PUT_NOTIFY = 23,
    PT_TCP_OP_PUT_NOTIFY_QUIET = 24,
};

/* Frame size for large transfers: big enough that per-frame costs (a header, a reply, a
 * system call or two each side) stay small, small enough that a small request queued behind
 * a 64 MiB transfer waits for one chunk at most (~0.1 ms at 10 GB/s, 0.85 ms on 10 GbE).
 * Measured across two namespaces on 2 cores (bench/tcp.py, two runs each): gets of 1-4 MiB
 * 9.8-12.3 GB/s in 1 MiB frames, 8.8-10.5 in 512 KiB ones, 7.5-9.3 in 256 KiB ones (MPICH
 * ofi's RMA get 10-12 in the same runs). */
#define PT_TCP_CHUNK (1024 * 1024)
/* Frame size of unanswered puts (PUT_NOTIFY_QUIET: a collective's chunks). Smaller than
 * PT_TCP_CHUNK: both ranks of an exchange write at once, and a frame the socket cannot take
 * whole blocks its writer until the other side reads (the rank, once its own write is
 * through, or the connection's thread). A 1 MiB allreduce across namespaces, 2 ranks: in
 * 1 MiB frames 0.47-1.2 ms in most runs (0.2 in some), in 256 KiB ones 0.20-0.29. */
#define PT_TCP_QUIET_FRAME (256 * 1024)
/* Largest payload a server accepts in one frame: bounds what one request can make it read or
 * send before it looks at the next one (clients send at most PT_TCP_CHUNK). */
#define PT_TCP_MAX_PAYLOAD (4 * 1024 * 1024)
/* Requests one client connection keeps in flight: enough to cover the bandwidth-delay product
 * of a fast link with whole frames several times over; bounds the client's request table. */
#define PT_TCP_MAX_INFLIGHT 256
/* Payloads up to this size (one chunk; a put_notify's 8-byte value on top) are written by the
 * calling thread when nothing is queued ahead of them (one hand-off less); larger ones go
 * through the sender thread. A request queued meanwhile waits for at most one chunk, as it
 * would behind the sender thread. */
#define PT_TCP_INLINE_MAX (PT_TCP_CHUNK + 8)
/* A request of up to this many frames is written by the calling thread when nothing is
 * queued ahead of it: a get whole (its frames are 64-byte headers: one system call), a
 * synchronous put frame by frame (its caller waits for it anyway; a hand-off to the sender
 * thread cost 2.5x a 1 MiB put's time on loopback with 2 cores). */
#define PT_TCP_INLINE_FRAMES 16
/* Connections per peer a large get/put may be striped over (POOLTENSOR_TCP_STRIPES, 1..this)
 * and, by default, the smallest part worth a connection of its own (POOLTENSOR_TCP_STRIPE_PART);
 * defaults measured with bench/tcp_stripes.py (see tcp_stripe.c). */
#define PT_TCP_MAX_STRIPES 16
#define PT_TCP_DEFAULT_STRIPES 4
#define PT_TCP_STRIPE_PART (4 * 1024 * 1024)
/* Authenticated connections one server serves at once; more are closed (bounds server
 * threads). */
#define PT_TCP_MAX_CONNS 256
/* Connections still in the handshake, a budget of their own: when it is full a new connection
 * closes the OLDEST of them, so that a crowd of silent connections (no secret needed to open
 * one) delays a legitimate client by a handshake at most instead of locking it out. Large
 * enough for a whole job's ranks dialing one server at the same moment. */
#define PT_TCP_MAX_PENDING 128
/* Seconds a helper whose frame came leaves a connection's socket to the next wait of its rank
 * before the connection's thread takes it back (tcp_server.c). */
#define PT_TCP_LINGER 0.002
/* A quiet put's last frame of at least this many bytes is acknowledged as soon as it is read
 * (TCP_QUICKACK), not with the reader's next data. Both ranks of a collective send, so the
 * kernel delays its acknowledgements to ride on data (its "pingpong" mode); the last frame
 * before a pause (a training step's compute) was then acknowledged only after the pause, the
 * sender took the pause for a round trip, and its smoothed round-trip time (22 us across
 * tests/netns.py's namespaces) went to 0.4-0.8 ms. Cubic and reno size their sends by it:
 * the next 30 or so calls of 64 KiB took 2-5x as long. Smaller frames showed no such slowdown
 * and pay for the extra acknowledgement (4 KiB: 14-19 us a call against 12-14). */
#define PT_TCP_QUICKACK_MIN (32 * 1024)
/* The congestion controls a socket asks for, in order (tcp_common.c's congestion) */
#define PT_TCP_CONGESTION "reno"
/* The whole handshake (HELLO, AUTH, AUTH_OK) must be over within this many seconds. */
#define PT_TCP_HANDSHAKE_TIMEOUT 2.0
/* Once a frame has started, the rest of it must arrive within this many
 * seconds, else the connection is dropped: a stalled or hostile peer cannot hold a server
 * thread, or a registration it is writing, for long. */
#define PT_TCP_IO_TIMEOUT 10.0

typedef struct {
    uint32_t magic;
    uint16_t op, flags;
    uint32_t status, rsvd;
    uint64_t id, key, off, len;
    int64_t a, b;
} pt_tcp_hdr_t;

static inline void pt__le_put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t pt__le_get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static inline void pt__hdr_pack(const pt_tcp_hdr_t *h, uint8_t out[PT_TCP_HDR])
{
    pt__le_put(out, h->magic, 4);
    pt__le_put(out + 4, h->op, 2);
    pt__le_put(out + 6, h->flags, 2);
    pt__le_put(out + 8, h->status, 4);
    pt__le_put(out + 12, h->rsvd, 4);
    pt__le_put(out + 16, h->id, 8);
    pt__le_put(out + 24, h->key, 8);
    pt__le_put(out + 32, h->off, 8);
    pt__le_put(out + 40, h->len, 8);
    pt__le_put(out + 48, (uint64_t)h->a, 8);
    pt__le_put(out + 56, (uint64_t)h->b, 8);
}

static inline void pt__hdr_unpack(const uint8_t in[PT_TCP_HDR], pt_tcp_hdr_t *h)
{
    h->magic = (uint32_t)pt__le_get(in, 4);
    h->op = (uint16_t)pt__le_get(in + 4, 2);
    h->flags = (uint16_t)pt__le_get(in + 6, 2);
    h->status = (uint32_t)pt__le_get(in + 8, 4);
    h->rsvd = (uint32_t)pt__le_get(in + 12, 4);
    h->id = pt__le_get(in + 16, 8);
    h->key = pt__le_get(in + 24, 8);
    h->off = pt__le_get(in + 32, 8);
    h->len = pt__le_get(in + 40, 8);
    h->a = (int64_t)pt__le_get(in + 48, 8);
    h->b = (int64_t)pt__le_get(in + 56, 8);
}

/* The MAC each side proves the secret with: HMAC(secret, label Ns Nc le64(rank)). */
void pt__tcp_mac(const pt_ctx_t *ctx, int server, const uint8_t *ns, const uint8_t *nc,
                 int64_t rank, uint8_t out[PT_TCP_MAC]);

/* Blocking socket I/O with a deadline (absolute, pt__now() clock; < 0: none). The sockets
 * have a short SO_RCVTIMEO/SO_SNDTIMEO so these loops get to look at the deadline and at
 * *abort (may be NULL). Return 0 when everything moved, -1 otherwise (errno: EPIPE for a
 * closed peer, ETIMEDOUT past the deadline, ECANCELED when *abort was set). *got (may be NULL)
 * counts the bytes read before a failure: 0 tells an idle end of stream from a truncated one. */
int pt__tcp_recv(int fd, void *buf, size_t len, double deadline, _Atomic int *abort,
                 size_t *got);
/* pt__tcp_recv for a large payload: polls with non-blocking reads while bytes keep coming
 * within the spin time (pt__spin_seconds), since one that arrives as many segments costs a
 * sleep and wake-up for each otherwise; past the spin time without a byte it blocks. */
int pt__tcp_recv_spin(int fd, void *buf, size_t len, double deadline, _Atomic int *abort);
int pt__tcp_sendv(int fd, struct iovec *iov, int n, double deadline, _Atomic int *abort);
/* Short send/receive timeouts on a connected socket, TCP_NODELAY, close-on-exec. */
int pt__tcp_tune(int fd, double slice);

/* A connection world rank `rank` made to our listener ended without a BYE: dropped, or the
 * rank is gone; tcp_reconnect.c dials it to find out (a rank we cannot dial is marked lost). */
void pt__tcp_peer_dropped(pt_ctx_t *ctx, int rank);

/* Stop the listener and every served connection (tcp_server.c), at pt_ctx_destroy. */
void pt__tcp_server_stop(pt_ctx_t *ctx);

#endif
