/* Collectives among the ranks of one host, through shared staging memory.
 *
 * Each member registers a staging area: a header of counters, then `nslots` input slots and
 * `nslots` result slots. A message is cut into slot-sized chunks, numbered by a sequence that
 * every member advances in step; a member copies its chunk into its input slot and publishes
 * `ready`, reads peers' slots in place, and publishes `done` once it no longer needs chunk s,
 * which frees slot s % nslots for chunk s + nslots. Slots are reused, so they stay in cache.
 * Reductions take members in rank order (pt_reduce over all sources at once), so one-shot and
 * two-shot give the same bytes on every member. Waits poll briefly, then sleep on the
 * publisher's bell (pt_plat_wait); each checks the deadline and whether the peer died.
 *
 * Mid-sized allgathers and two-shot allreduces are single-copy instead (allgather_cma,
 * allreduce_cma): members publish their input's and output's addresses with the call's digest,
 * and read what they need of their peers' straight from there with cross-memory attach
 * (pt_plat_copy_from_peer), once the team has checked, at its first such call, that every
 * member can read every other (cma_probe).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "core/transport.h"

#define PT_STAGE_HDR 4096
#define PT_TEAM_MAX 512
/* Allgather outputs (all members' bytes) that go single-copy: from 32 KiB, where one system
 * call per peer already costs less than a second copy through the slots and its flags (2 ranks:
 * 32 KiB 2.7 against 5.0 us, 512 KiB 16 against 33 us; 8 KiB ties), up to 16 MiB; past it the
 * slots' streaming stores into the output win (the kernel's copy goes through the caches). */
#define CMA_MIN ((size_t)32 << 10)
#define CMA_MAX ((size_t)16 << 20)
/* Two-shot allreduces from this size read their peers' inputs and parts in place (2 ranks:
 * 256 KiB 35 against 41 us through the slots; 128 KiB 25 against 20). */
#define CMA_AR_MIN ((size_t)256 << 10)

typedef struct {
    _Alignas(PT_CACHELINE) _Atomic uint64_t ready;
    _Alignas(PT_CACHELINE) _Atomic uint64_t reduced;
    _Alignas(PT_CACHELINE) _Atomic uint64_t done;
    _Alignas(PT_CACHELINE) _Atomic uint64_t called;
    uint64_t sig[2];
    uint64_t src[2], dst[2];      /* the call's input and output addresses (single-copy) */
    _Alignas(PT_CACHELINE) _Atomic uint64_t part;  /* single-copy allreduce: our part reduced */
    _Alignas(PT_CACHELINE) _Atomic uint64_t fin;   /* single-copy calls finished reading */
    _Alignas(PT_CACHELINE) _Atomic uint64_t probed;
    uint64_t self;                /* this header's address in its owner's memory */
    uint64_t nonce;               /* what a peer's cross-memory read of it must find */
    uint32_t cma_ok;              /* its owner can read every member's memory */
    _Alignas(PT_CACHELINE) _Atomic uint32_t bell;
    _Atomic uint32_t sleepers;
} stage_hdr_t;

_Static_assert(sizeof(stage_hdr_t) <= PT_STAGE_HDR, "staging header too large");

struct pt_team {
    pt_ctx_t *ctx;
    int n, me;
    int *ranks;
    stage_hdr_t **hdr;
    uint8_t **in, **res;
    size_t slot;
    int nslots;
    uint64_t seq, calls;
    size_t oneshot_max;
    int cma;                      /* single-copy allgather: -1 not probed yet, 0 no, 1 yes */
    int cma_allowed;              /* POOLTENSOR_TEAM_CMA=0 says no */
    size_t cma_min, cma_max;      /* the allgather outputs it serves (and allreduces to max) */
    size_t cma_ar_min;            /* the smallest allreduce it serves (two-shot sizes) */
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

size_t pt_team_stage_bytes(size_t slot_bytes, int nslots)
{
    return PT_STAGE_HDR + 2 * (size_t)nslots * slot_bytes;
}

/* a size from the environment (pt__env_long: unset or empty is dflt) */
#define team_env(name, dflt) ((size_t)pt__env_long((name), (long)(dflt), 0, LONG_MAX))

pt_status_t pt_team_create(pt_ctx_t *ctx, const int *ranks, int n, const uint64_t *keys,
                           size_t slot_bytes, int nslots, pt_team_t **out)
{
    if (!ctx || !ranks || !keys || !out || n <= 0 || n > PT_TEAM_MAX || nslots < 1 ||
        slot_bytes < 4096 || slot_bytes % 64)
        return PT_ERR_INVALID;
    pt_team_t *t = calloc(1, sizeof(*t));
    if (!t)
        return PT_ERR_NOMEM;
    pt_status_t st = PT_ERR_NOMEM;
    t->ranks = calloc((size_t)n, sizeof(int));
    t->hdr = calloc((size_t)n, sizeof(*t->hdr));
    t->in = calloc((size_t)n, sizeof(*t->in));
    t->res = calloc((size_t)n, sizeof(*t->res));
    if (!t->ranks || !t->hdr || !t->in || !t->res)
        goto err;
    t->ctx = ctx;
    t->n = n;
    t->me = -1;
    t->slot = slot_bytes;
    t->nslots = nslots;
    t->oneshot_max = team_env("POOLTENSOR_ONESHOT_MAX", 64 * 1024);
    t->cma = -1;
    const char *env = getenv("POOLTENSOR_TEAM_CMA");
    t->cma_allowed = !(env && strcmp(env, "0") == 0);
    t->cma_min = team_env("POOLTENSOR_TEAM_CMA_MIN", CMA_MIN);
    t->cma_ar_min = team_env("POOLTENSOR_TEAM_CMA_ALLREDUCE_MIN", CMA_AR_MIN);
    t->cma_max = team_env("POOLTENSOR_TEAM_CMA_MAX", CMA_MAX);
    size_t len = pt_team_stage_bytes(slot_bytes, nslots);
    for (int i = 0; i < n; i++) {
        uint8_t *p;
        st = pt__resolve(ctx, ranks[i], keys[i], 0, len, &p);
        if (st != PT_OK)
            goto err;
        t->ranks[i] = ranks[i];
        t->hdr[i] = (stage_hdr_t *)p;
        t->in[i] = p + PT_STAGE_HDR;
        t->res[i] = p + PT_STAGE_HDR + (size_t)nslots * slot_bytes;
        if (ranks[i] == ctx->rank)
            t->me = i;
        if (i && ranks[i] <= ranks[i - 1]) {
            st = PT_ERR_INVALID;
            goto err;
        }
    }
    if (t->me < 0) {
        st = PT_ERR_INVALID;
        goto err;
    }
    stage_hdr_t *mine = t->hdr[t->me];
    mine->self = (uint64_t)(uintptr_t)mine;
    if (pt_plat_random(&mine->nonce, sizeof(mine->nonce)) != PT_OK)
        mine->nonce = (uint64_t)(uintptr_t)mine ^ (uint64_t)(pt__now() * 1e9);
    *out = t;
    return PT_OK;
err:
    pt_team_destroy(t);
    return st;
}

int pt_team_single_copy(const pt_team_t *t) { return t->cma; }

void pt_team_destroy(pt_team_t *t)
{
    if (!t)
        return;
    free(t->ranks);
    free(t->hdr);
    free(t->in);
    free(t->res);
    free(t);
}

static void publish(pt_team_t *t, _Atomic uint64_t *ctr, uint64_t v)
{
    stage_hdr_t *h = t->hdr[t->me];
    atomic_store(ctr, v);
    if (atomic_load(&h->sleepers)) {
        atomic_fetch_add(&h->bell, 1);
        pt_plat_wake(&h->bell, 1);
    }
}

static pt_status_t wait_for(pt_team_t *t, int i, _Atomic uint64_t *ctr, uint64_t v,
                            double deadline, int *who)
{
    if (atomic_load_explicit(ctr, memory_order_acquire) >= v)
        return PT_OK;
    stage_hdr_t *h = t->hdr[i];
    double start = pt__now(), spin = pt__spin_seconds();
    for (unsigned k = 0;; k++) {
        if (atomic_load_explicit(ctr, memory_order_acquire) >= v)
            return PT_OK;
        if ((k & 63) != 63) {
            cpu_relax();
            continue;
        }
        double now = pt__now();
        if (now - start < spin) {
            pt__relax(now - start);
            continue;
        }
        if (pt_ctx_peer_lost(t->ctx, t->ranks[i])) {
            /* name the first member that died: the others may have left because of it */
            int first = pt_ctx_first_lost(t->ctx);
            *who = i;
            for (int j = 0; j < t->n; j++)
                if (t->ranks[j] == first)
                    *who = j;
            return PT_ERR_PEER_LOST;
        }
        if (deadline >= 0 && now > deadline) {
            *who = i;
            return PT_ERR_TIMEOUT;
        }
        atomic_fetch_add(&h->sleepers, 1);
        uint32_t bell = atomic_load(&h->bell);
        if (atomic_load(ctr) < v)
            pt_plat_wait(&h->bell, bell, 0.01, 1);
        atomic_fetch_sub(&h->sleepers, 1);
    }
}

#define HDR_CTR(t, i, field) (&(t)->hdr[i]->field)

static pt_status_t wait_all(pt_team_t *t, size_t field_off, uint64_t v, double deadline,
                            int *who)
{
    for (int j = 1; j < t->n; j++) {
        int i = (t->me + j) % t->n;
        _Atomic uint64_t *ctr = (_Atomic uint64_t *)((uint8_t *)t->hdr[i] + field_off);
        pt_status_t st = wait_for(t, i, ctr, v, deadline, who);
        if (st != PT_OK)
            return st;
    }
    return PT_OK;
}

#define READY offsetof(stage_hdr_t, ready)
#define REDUCED offsetof(stage_hdr_t, reduced)
#define DONE offsetof(stage_hdr_t, done)
#define CALLED offsetof(stage_hdr_t, called)
#define FIN offsetof(stage_hdr_t, fin)
#define PART offsetof(stage_hdr_t, part)
#define PROBED offsetof(stage_hdr_t, probed)

/* Every member publishes its call's digest; all compare. A member can be at most one call
 * ahead (it cannot pass the next check without us), so two digest slots suffice. */
static pt_status_t announce_io(pt_team_t *t, uint64_t sig, const void *src, const void *dst,
                               double deadline, int *who)
{
    uint64_t c = ++t->calls;
    stage_hdr_t *me = t->hdr[t->me];
    me->sig[c & 1] = sig;
    me->src[c & 1] = (uint64_t)(uintptr_t)src;
    me->dst[c & 1] = (uint64_t)(uintptr_t)dst;
    publish(t, &me->called, c);
    pt_status_t st = wait_all(t, CALLED, c, deadline, who);
    if (st != PT_OK)
        return st;
    for (int j = 1; j < t->n; j++) {
        int i = (t->me + j) % t->n;
        if (t->hdr[i]->sig[c & 1] != sig) {
            *who = i;
            return PT_ERR_MISMATCH;
        }
    }
    return PT_OK;
}

static pt_status_t announce(pt_team_t *t, uint64_t sig, double deadline, int *who)
{
    return announce_io(t, sig, NULL, NULL, deadline, who);
}

/* Chunk s reuses the slots of chunk s - nslots: wait until every member is done with it. */
static pt_status_t slot_free(pt_team_t *t, uint64_t s, double deadline, int *who)
{
    if (s < (uint64_t)t->nslots)
        return PT_OK;
    return wait_all(t, DONE, s + 1 - (uint64_t)t->nslots, deadline, who);
}

void pt__copy_stream(void *dst, const void *src, size_t len);

/* Into the caller's output: past the caches' reach, bypass them (the output is not read back
 * by us, and streaming stores skip reading every destination line first). */
static void copy_out(void *dst, const void *src, size_t len, size_t total)
{
    if (total >= ((size_t)8 << 20))
        pt__copy_stream(dst, src, len);
    else
        pt_copy(dst, src, len);
}

static double deadline_of(double timeout) { return timeout < 0 ? -1 : pt__now() + timeout; }

static pt_status_t team_barrier(pt_team_t *t, double timeout, int *who)
{
    int w = -1;
    pt_status_t st = announce(t, 0xba771e5ULL, deadline_of(timeout), &w);
    if (st != PT_OK && who)
        *who = w;
    return st;
}

#define FAIL(st_)                                                                            \
    do {                                                                                     \
        if (who)                                                                             \
            *who = w;                                                                        \
        return (st_);                                                                        \
    } while (0)

#define CHECK(expr)                                                                          \
    do {                                                                                     \
        pt_status_t st__ = (expr);                                                           \
        if (st__ != PT_OK)                                                                   \
            FAIL(st__);                                                                      \
    } while (0)

/* Mixed into a single-copy call's digest: members that would take different paths (their
 * POOLTENSOR_TEAM_CMA_* differ) fail with a mismatch instead of waiting for each other. */
#define CMA_SIG 0x5c0b1e0c0f1e5ULL

static int32_t pid_of(pt_team_t *t, int i) { return t->ctx->peers[t->ranks[i]].pid; }

/* Whether every member can read every other's memory, decided once per team at its first
 * single-copy call (all members reach it at the same call): each reads its peers' nonces
 * through cross-memory attach and publishes whether all matched (a pid that names another
 * process, in another pid namespace, reads something else or nothing; a system that forbids
 * it fails the read); the team goes single-copy only if every member could. */
static pt_status_t cma_probe(pt_team_t *t, double dl, int *who)
{
    stage_hdr_t *me = t->hdr[t->me];
    uint32_t ok = (uint32_t)t->cma_allowed;
    for (int j = 1; ok && j < t->n; j++) {
        int i = (t->me + j) % t->n;
        stage_hdr_t *h = t->hdr[i];
        uint64_t v = 0;
        if (pt_plat_copy_from_peer(pid_of(t, i), &v,
                                   h->self + offsetof(stage_hdr_t, nonce), sizeof(v)) != PT_OK ||
            v != h->nonce)
            ok = 0;
    }
    me->cma_ok = ok;
    publish(t, &me->probed, 1);
    pt_status_t st = wait_all(t, PROBED, 1, dl, who);
    if (st != PT_OK)
        return st;
    int all = 1;
    for (int i = 0; i < t->n; i++)
        all &= t->hdr[i]->cma_ok != 0;
    t->cma = all;
    return PT_OK;
}

/* Single-copy allgather, after announce_io published our input's address: read every peer's
 * input into its place in our output, say so (fin: our peers may then reuse their inputs),
 * copy our own part, and wait until every peer has read ours. One copy of each byte instead of
 * two through the slots, and no chunk-by-chunk lockstep. */
static pt_status_t allgather_cma(pt_team_t *t, const uint8_t *src, uint8_t *dst, size_t nbytes,
                                 double dl, int *who)
{
    uint64_t c = t->calls;
    pt_status_t st = PT_OK;
    for (int j = 1; j < t->n && st == PT_OK; j++) {
        int i = (t->me + j) % t->n;
        st = pt_plat_copy_from_peer(pid_of(t, i), dst + (size_t)i * nbytes,
                                    t->hdr[i]->src[c & 1], nbytes);
        if (st != PT_OK)
            *who = i;
    }
    publish(t, HDR_CTR(t, t->me, fin), c);
    if (st != PT_OK)
        return st;
    uint8_t *mine = dst + (size_t)t->me * nbytes;
    if (mine != src)
        memmove(mine, src, nbytes);
    return wait_all(t, FIN, c, dl, who);
}


/* Single-copy two-shot allreduce, after announce_io published our input's and output's
 * addresses. Each member reduces its 1/n of the elements (the slots' two-shot split) from its
 * own input and its peers' inputs, read with cross-memory attach into its staging slots (free:
 * every member has finished its earlier calls, or it would not be in this one), over members
 * in rank order as the slots' two-shot does (the same bytes), straight into its output; then it
 * reads the others' reduced parts from their outputs. In place (in == out) works: a member
 * overwrites another's part of its input only after that member said it reduced its part. */
static pt_status_t allreduce_cma(pt_team_t *t, pt_op_t op, pt_dtype_t dt, const uint8_t *src,
                                 uint8_t *dst, size_t count, double dl, int *who)
{
    uint64_t c = t->calls;
    int n = t->n, me = t->me;
    size_t es = pt_dtype_size(dt);
    size_t lo = count * (size_t)me / (size_t)n, hi = count * (size_t)(me + 1) / (size_t)n;
    size_t per = 2 * (size_t)t->nslots * t->slot / (size_t)(n - 1) / es;
    uint8_t *tmp = t->in[me];   /* input and result slots, one block */
    const void *srcs[PT_TEAM_MAX];
    for (size_t a = lo; a < hi; a += per) {
        size_t m = hi - a < per ? hi - a : per;
        for (int i = 0, k = 0; i < n; i++) {
            if (i == me) {
                srcs[i] = src + a * es;
                continue;
            }
            uint8_t *p = tmp + (size_t)k++ * per * es;
            pt_status_t st = pt_plat_copy_from_peer(pid_of(t, i), p, t->hdr[i]->src[c & 1] + a * es,
                                                    m * es);
            if (st != PT_OK) {
                *who = i;
                return st;
            }
            srcs[i] = p;
        }
        pt_status_t st = pt_reduce(op, dt, dst + a * es, srcs, n, m);
        if (st != PT_OK)
            return st;
    }
    publish(t, HDR_CTR(t, me, part), c);
    for (int j = 1; j < n; j++) {
        int i = (me + j) % n;
        size_t a = count * (size_t)i / (size_t)n, b = count * (size_t)(i + 1) / (size_t)n;
        pt_status_t st = wait_for(t, i, HDR_CTR(t, i, part), c, dl, who);
        if (st == PT_OK && b > a)
            st = pt_plat_copy_from_peer(pid_of(t, i), dst + a * es, t->hdr[i]->dst[c & 1] + a * es,
                                        (b - a) * es);
        if (st != PT_OK) {
            if (*who < 0)
                *who = i;
            return st;
        }
    }
    publish(t, HDR_CTR(t, me, fin), c);
    return wait_all(t, FIN, c, dl, who);
}

static pt_status_t team_allreduce(pt_team_t *t, pt_op_t op, pt_dtype_t dt, const void *in, void *out,
                              size_t count, int algo, uint64_t sig, double timeout, int *who)
{
    if ((unsigned)op >= PT_NOPS || (unsigned)dt >= PT_NDTYPES || (count && (!in || !out)))
        return PT_ERR_INVALID;
    int w = -1;
    double dl = deadline_of(timeout);
    size_t es = pt_dtype_size(dt), per = t->slot / es;
    if (algo == PT_ALGO_AUTO)
        algo = count * es <= t->oneshot_max ? PT_ALGO_ONESHOT : PT_ALGO_TWOSHOT;
    int single = t->n > 1 && algo == PT_ALGO_TWOSHOT && t->cma != 0 &&
                 count * es >= t->cma_ar_min && count * es <= t->cma_max;
    CHECK(announce_io(t, single ? sig ^ CMA_SIG : sig, in, out, dl, &w));
    if (single && t->cma < 0)
        CHECK(cma_probe(t, dl, &w));
    if (single && t->cma == 1) {
        CHECK(allreduce_cma(t, op, dt, in, out, count, dl, &w));
        return PT_OK;
    }
    const uint8_t *src = in;
    uint8_t *dst = out;
    if (t->n == 1) {
        if (dst != src)
            memmove(dst, src, count * es);
        return PT_OK;
    }
    const void *srcs[PT_TEAM_MAX];
    for (size_t e0 = 0; e0 < count; e0 += per) {
        size_t m = count - e0 < per ? count - e0 : per;
        uint64_t s = t->seq++;
        size_t so = (size_t)(s % (uint64_t)t->nslots) * t->slot;
        CHECK(slot_free(t, s, dl, &w));
        pt_copy(t->in[t->me] + so, src + e0 * es, m * es);
        publish(t, HDR_CTR(t, t->me, ready), s + 1);
        CHECK(wait_all(t, READY, s + 1, dl, &w));
        if (algo == PT_ALGO_ONESHOT) {
            for (int i = 0; i < t->n; i++)
                srcs[i] = t->in[i] + so;
            CHECK(pt_reduce(op, dt, dst + e0 * es, srcs, t->n, m));
        } else {
            size_t lo = m * (size_t)t->me / (size_t)t->n;
            size_t hi = m * (size_t)(t->me + 1) / (size_t)t->n;
            for (int i = 0; i < t->n; i++)
                srcs[i] = t->in[i] + so + lo * es;
            if (hi > lo)
                CHECK(pt_reduce(op, dt, t->res[t->me] + so + lo * es, srcs, t->n, hi - lo));
            publish(t, HDR_CTR(t, t->me, reduced), s + 1);
            for (int j = 0; j < t->n; j++) {
                int i = (t->me + j) % t->n;
                size_t a = m * (size_t)i / (size_t)t->n, b = m * (size_t)(i + 1) / (size_t)t->n;
                if (i != t->me)
                    CHECK(wait_for(t, i, HDR_CTR(t, i, reduced), s + 1, dl, &w));
                copy_out(dst + (e0 + a) * es, t->res[i] + so + a * es, (b - a) * es, count * es);
            }
        }
        publish(t, HDR_CTR(t, t->me, done), s + 1);
    }
    return PT_OK;
}

static pt_status_t team_allgather(pt_team_t *t, const void *in, void *out, size_t nbytes,
                              uint64_t sig, double timeout, int *who)
{
    if (nbytes && (!in || !out))
        return PT_ERR_INVALID;
    int w = -1;
    double dl = deadline_of(timeout);
    size_t total = nbytes * (size_t)t->n;
    int single = t->n > 1 && t->cma != 0 && total >= t->cma_min && total <= t->cma_max;
    CHECK(announce_io(t, single ? sig ^ CMA_SIG : sig, in, out, dl, &w));
    if (single && t->cma < 0)
        CHECK(cma_probe(t, dl, &w));
    if (single && t->cma == 1) {
        CHECK(allgather_cma(t, in, out, nbytes, dl, &w));
        return PT_OK;
    }
    const uint8_t *src = in;
    uint8_t *dst = out;
    /* A large output goes out with streaming stores, our own part too, from the slot it was
     * just copied into (2 ranks, 64 MiB: 12.3 -> 7.9 ms a call); below 16 MiB it stays in the
     * caches and plain copies win (8 MiB: 0.79 against 0.86 ms streamed). */
    int stream = t->n > 1 && nbytes * (size_t)t->n >= ((size_t)16 << 20);
    for (size_t o = 0; o < nbytes; o += t->slot) {
        size_t m = nbytes - o < t->slot ? nbytes - o : t->slot;
        uint64_t s = t->seq++;
        size_t so = (size_t)(s % (uint64_t)t->nslots) * t->slot;
        if (t->n > 1) {
            CHECK(slot_free(t, s, dl, &w));
            pt_copy(t->in[t->me] + so, src + o, m);
            publish(t, HDR_CTR(t, t->me, ready), s + 1);
        }
        for (int j = 0; j < t->n; j++) {
            int i = (t->me + j) % t->n;
            uint8_t *d = dst + (size_t)i * nbytes + o;
            if (i == t->me) {
                if (d == src + o)
                    continue;
                if (stream)
                    pt__copy_stream(d, t->in[t->me] + so, m);
                else
                    memmove(d, src + o, m);
                continue;
            }
            CHECK(wait_for(t, i, HDR_CTR(t, i, ready), s + 1, dl, &w));
            if (stream)
                pt__copy_stream(d, t->in[i] + so, m);
            else
                pt_copy(d, t->in[i] + so, m);
        }
        publish(t, HDR_CTR(t, t->me, done), s + 1);
    }
    return PT_OK;
}

static pt_status_t team_reduce_scatter(pt_team_t *t, pt_op_t op, pt_dtype_t dt, const void *in,
                                   void *out, size_t count, uint64_t sig, double timeout,
                                   int *who)
{
    if ((unsigned)op >= PT_NOPS || (unsigned)dt >= PT_NDTYPES || (count && (!in || !out)))
        return PT_ERR_INVALID;
    int w = -1;
    double dl = deadline_of(timeout);
    CHECK(announce(t, sig, dl, &w));
    size_t es = pt_dtype_size(dt), per = t->slot / (size_t)t->n / es;
    const uint8_t *src = in;
    uint8_t *dst = out;
    if (t->n == 1) {
        if (dst != src)
            memmove(dst, src, count * es);
        return PT_OK;
    }
    if (per == 0)
        return PT_ERR_INVALID;
    const void *srcs[PT_TEAM_MAX];
    for (size_t e0 = 0; e0 < count; e0 += per) {
        size_t m = count - e0 < per ? count - e0 : per;
        uint64_t s = t->seq++;
        size_t so = (size_t)(s % (uint64_t)t->nslots) * t->slot;
        CHECK(slot_free(t, s, dl, &w));
        for (int d = 0; d < t->n; d++)
            pt_copy(t->in[t->me] + so + (size_t)d * per * es, src + ((size_t)d * count + e0) * es,
                    m * es);
        publish(t, HDR_CTR(t, t->me, ready), s + 1);
        CHECK(wait_all(t, READY, s + 1, dl, &w));
        for (int i = 0; i < t->n; i++)
            srcs[i] = t->in[i] + so + (size_t)t->me * per * es;
        CHECK(pt_reduce(op, dt, dst + e0 * es, srcs, t->n, m));
        publish(t, HDR_CTR(t, t->me, done), s + 1);
    }
    return PT_OK;
}

static pt_status_t team_broadcast(pt_team_t *t, int root, void *buf, size_t nbytes, uint64_t sig,
                              double timeout, int *who)
{
    if (root < 0 || root >= t->n || (nbytes && !buf))
        return PT_ERR_INVALID;
    int w = -1;
    double dl = deadline_of(timeout);
    CHECK(announce(t, sig, dl, &w));
    if (t->n == 1)
        return PT_OK;
    uint8_t *b = buf;
    for (size_t o = 0; o < nbytes; o += t->slot) {
        size_t m = nbytes - o < t->slot ? nbytes - o : t->slot;
        uint64_t s = t->seq++;
        size_t so = (size_t)(s % (uint64_t)t->nslots) * t->slot;
        if (t->me == root) {
            CHECK(slot_free(t, s, dl, &w));
            pt_copy(t->in[root] + so, b + o, m);
            publish(t, HDR_CTR(t, root, ready), s + 1);
        } else {
            CHECK(wait_for(t, root, HDR_CTR(t, root, ready), s + 1, dl, &w));
            pt_copy(b + o, t->in[root] + so, m);
        }
        publish(t, HDR_CTR(t, t->me, done), s + 1);
    }
    return PT_OK;
}

/* The entry points, counted (core/stats.c) as collectives of the group (rank -1) over shared
 * memory; bytes: what this member contributes. */
#define TEAM_COUNTED(op, bytes, call)                                                        \
    do {                                                                                     \
        uint64_t t0_ = pt__stats_t0();                                                       \
        pt_status_t st_ = call;                                                              \
        if (t0_)                                                                             \
            pt__stats_op(t->ctx->stats, -1, pt_transport_shm.id, (op), (bytes), st_, t0_);   \
        return st_;                                                                          \
    } while (0)

pt_status_t pt_team_barrier(pt_team_t *t, double timeout, int *who)
{
    TEAM_COUNTED(PT_STAT_OP_BARRIER, 0, team_barrier(t, timeout, who));
}

pt_status_t pt_team_allreduce(pt_team_t *t, pt_op_t op, pt_dtype_t dt, const void *in, void *out,
                              size_t count, int algo, uint64_t sig, double timeout, int *who)
{
    size_t bytes = (unsigned)dt < PT_NDTYPES ? count * pt_dtype_size(dt) : 0;
    TEAM_COUNTED(PT_STAT_OP_ALLREDUCE, bytes,
                 team_allreduce(t, op, dt, in, out, count, algo, sig, timeout, who));
}

pt_status_t pt_team_allgather(pt_team_t *t, const void *in, void *out, size_t nbytes,
                              uint64_t sig, double timeout, int *who)
{
    TEAM_COUNTED(PT_STAT_OP_ALLGATHER, nbytes, team_allgather(t, in, out, nbytes, sig, timeout, who));
}

pt_status_t pt_team_reduce_scatter(pt_team_t *t, pt_op_t op, pt_dtype_t dt, const void *in,
                                   void *out, size_t count, uint64_t sig, double timeout,
                                   int *who)
{
    size_t bytes = (unsigned)dt < PT_NDTYPES ? count * pt_dtype_size(dt) : 0;
    TEAM_COUNTED(PT_STAT_OP_REDUCE_SCATTER, bytes,
                 team_reduce_scatter(t, op, dt, in, out, count, sig, timeout, who));
}

pt_status_t pt_team_broadcast(pt_team_t *t, int root, void *buf, size_t nbytes, uint64_t sig,
                              double timeout, int *who)
{
    TEAM_COUNTED(PT_STAT_OP_BROADCAST, nbytes, team_broadcast(t, root, buf, nbytes, sig, timeout, who));
}
