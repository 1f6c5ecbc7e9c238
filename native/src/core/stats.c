/* Counters of the data path (pt.h, "stats"): per (peer, transport, operation) operations,
 * bytes, errors, timeouts and a log-linear latency histogram; per peer the link's events and
 * its last error.
 *
 * Why per-thread: an 8-byte get over shared memory takes well under a microsecond, so its
 * counters must cost a few nanoseconds and no cache line may bounce between threads. Each
 * thread that counts gets a shard of its own (found by its thread id in a small table, made
 * under the lock the first time), and writes its counters with plain relaxed loads and stores:
 * no lock, no read-modify-write. A snapshot sums the shards under the lock, which only guards
 * the list of shards. Cells (one histogram and its counters) are made the first time a thread
 * counts a (peer, transport, operation), so a big world costs only what it uses. Link events
 * are rare (connects, retries, errors) and are atomic adds on one array. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/transport.h"

#define NTR PT_STAT_NTRANSPORTS
#define NCELLS (NTR * PT_STAT_NOPS)

typedef pt__stat_cell_t cell_t;
typedef pt__stat_shard_t shard_t;

typedef struct pt__stat_link {
    _Atomic uint64_t events[PT_STAT_NEVENTS];
    _Atomic int last_status, last_op;
    _Atomic uint64_t last_time_ns;        /* CLOCK_REALTIME */
} link_t;

_Atomic int pt__stats_on = -1;            /* -1: not yet read from $POOLTENSOR_STATS */
int pt__stats_tsc;
double pt__stats_ns_per_tick = 1.0;
static pthread_once_t clock_once = PTHREAD_ONCE_INIT;
static uint64_t sample_mask = 15;         /* $POOLTENSOR_STATS_SAMPLE - 1 (a power of 2) */

/* Whether the CPU's counter runs at one rate whatever the core's frequency or sleep state. */
static int counter_invariant(void)
{
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000000u), "c"(0));
    if (a < 0x80000007u)
        return 0;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0x80000007u), "c"(0));
    return (d >> 8) & 1;
#elif defined(__aarch64__)
    return 1;   /* the generic timer's virtual count: a fixed frequency by architecture */
#else
    return 0;
#endif
}

/* A (clock, counter) pair read close together: the counter between two clock reads less
 * than 2 us apart (retried when the thread was preempted in between). */
static void pair(uint64_t *ns, uint64_t *ticks)
{
    for (int i = 0; i < 100; i++) {
        uint64_t a = pt__stats_clock();
        uint64_t t = pt__stats_counter();
        uint64_t b = pt__stats_clock();
        *ns = a + (b - a) / 2;
        *ticks = t;
        if (b - a < 2000)
            return;
    }
}

static void clock_init(void)
{
    const char *n = getenv("POOLTENSOR_STATS_SAMPLE");   /* time 1 operation in n */
    if (n && *n) {
        long v = strtol(n, NULL, 10);
        uint64_t p = 1;
        while (v > 0 && p < (uint64_t)v && p < (1u << 20))
            p <<= 1;
        sample_mask = p - 1;
    }
    const char *e = getenv("POOLTENSOR_STATS_CLOCK");   /* "monotonic": never the counter */
    if ((e && strcmp(e, "monotonic") == 0) || !counter_invariant())
        return;
    uint64_t n0, t0, n1, t1;
    pair(&n0, &t0);
    do    /* 2 ms: the pairs' error (< 1 us each) is then below 0.05% of the rate */
        pair(&n1, &t1);
    while (n1 - n0 < 2000000);
    if (t1 <= t0)
        return;
    pt__stats_ns_per_tick = (double)(n1 - n0) / (double)(t1 - t0);
    pt__stats_tsc = 1;
}

static const char *const op_names[PT_STAT_NOPS] = {
    "get", "put", "atomic", "notify", "put_notify", "put_indexed", "barrier", "allreduce",
    "allgather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "alltoall"};
static const char *const event_names[PT_STAT_NEVENTS] = {
    "connects", "reconnects", "retries", "timeouts", "errors", "lost"};

const char *pt_stat_op_name(int op)
{
    return op >= 0 && op < PT_STAT_NOPS ? op_names[op] : NULL;
}

const char *pt_stat_event_name(int ev)
{
    return ev >= 0 && ev < PT_STAT_NEVENTS ? event_names[ev] : NULL;
}

const char *pt_stat_transport_name(int transport)
{
    if (transport == 0)
        return "world";
    for (const pt_transport_ops_t *const *t = pt_transports; *t; t++)
        if ((*t)->id == transport)
            return (*t)->name;
    return NULL;
}

int pt_stats_enable(int on)
{
    int was = atomic_exchange(&pt__stats_on, on ? 1 : 0);
    if (was < 0) {
        const char *e = getenv("POOLTENSOR_STATS");
        was = !(e && e[0] == '0' && e[1] == 0);
    }
    return was;
}

pt_status_t pt__stats_create(int size, pt_stats_t **out)
{
    if (atomic_load(&pt__stats_on) < 0) {
        const char *e = getenv("POOLTENSOR_STATS");
        int off = e && e[0] == '0' && e[1] == 0;
        int unset = -1;
        atomic_compare_exchange_strong(&pt__stats_on, &unset, off ? 0 : 1);
    }
    pthread_once(&clock_once, clock_init);
    pt_stats_t *s = calloc(1, sizeof(*s));
    if (!s)
        return PT_ERR_NOMEM;
    s->links = calloc((size_t)size, sizeof(link_t));
    if (!s->links) {
        free(s);
        return PT_ERR_NOMEM;
    }
    s->size = size;
    atomic_store(&s->refs, 1);
    pthread_mutex_init(&s->lock, NULL);
    *out = s;
    return PT_OK;
}

void pt__stats_unref(pt_stats_t *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    for (shard_t *sh = s->shards, *next; sh; sh = next) {
        next = sh->next;
        for (int r = 0; r <= s->size; r++) {
            _Atomic(cell_t *) *cells = atomic_load(&sh->peers[r]);
            if (!cells)
                continue;
            for (int c = 0; c < NCELLS; c++)
                free(atomic_load(&cells[c]));
            free(cells);
        }
        free(sh->peers);
        free(sh);
    }
    pthread_mutex_destroy(&s->lock);
    free(s->links);
    free(s);
}

/* This thread's shard of s. Found without thread-local storage (an extension module's TLS
 * goes through __tls_get_addr, which costs more here than all the counting; the initial-exec
 * model would take glibc's small static TLS reserve that other extensions may need): the
 * thread's id (pt__stats_thread) hashed into a small open-addressed table of s, read without a
 * lock; a thread not placed there is found under the lock. A thread id is reused only once its
 * thread is gone, so the new thread may take the old one's shard. */
static shard_t *shard_of(pt_stats_t *s)
{
    uintptr_t me = pt__stats_thread();
    unsigned h = pt__stats_slot(me);
    for (unsigned i = 0; i < PT_STAT_PROBES; i++) {
        unsigned j = (h + i) & (PT_STAT_SLOTS - 1);
        if (atomic_load_explicit(&s->slots[j].owner, memory_order_acquire) == me)
            return atomic_load_explicit(&s->slots[j].shard, memory_order_relaxed);
    }
    pthread_mutex_lock(&s->lock);
    shard_t *sh = s->shards;
    while (sh && sh->owner != me)
        sh = sh->next;
    if (!sh && (sh = calloc(1, sizeof(*sh)))) {
        sh->peers = calloc((size_t)s->size + 1, sizeof(*sh->peers));
        if (!sh->peers) {
            free(sh);
            sh = NULL;
        } else {
            sh->owner = me;
            sh->next = s->shards;
            s->shards = sh;
        }
    }
    for (unsigned i = 0; sh && i < PT_STAT_PROBES; i++) {
        unsigned j = (h + i) & (PT_STAT_SLOTS - 1);
        if (atomic_load(&s->slots[j].owner) == 0) {   /* a free place: publish shard, then id */
            atomic_store_explicit(&s->slots[j].shard, sh, memory_order_relaxed);
            atomic_store_explicit(&s->slots[j].owner, me, memory_order_release);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return sh;
}

pt__stat_cell_t *pt__stats_cell_slow(pt_stats_t *s, int rank, int transport, int op)
{
    if (rank < -1 || rank >= s->size || transport < 0 || transport >= NTR || op < 0 ||
        op >= PT_STAT_NOPS)
        return NULL;
    shard_t *sh = shard_of(s);
    if (!sh)
        return NULL;
    _Atomic(cell_t *) *cells = atomic_load_explicit(&sh->peers[rank + 1], memory_order_relaxed);
    if (!cells) {
        if (!(cells = calloc(NCELLS, sizeof(*cells))))
            return NULL;
        atomic_store_explicit(&sh->peers[rank + 1], cells, memory_order_release);
    }
    int i = transport * PT_STAT_NOPS + op;
    cell_t *c = atomic_load_explicit(&cells[i], memory_order_relaxed);
    if (!c) {
        if (!(c = calloc(1, sizeof(*c))))
            return NULL;
        /* one-sided operations are sampled while quick; collectives, which wait on their
         * peers, are timed every one */
        c->sample_mask = op < PT_STAT_OP_BARRIER ? sample_mask : 0;
        c->mask = c->sample_mask;
        atomic_store_explicit(&cells[i], c, memory_order_release);
    }
    return c;
}

#define bump pt__stats_bump

static uint64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void pt__stats_event(pt_stats_t *s, int rank, pt_stat_event_t ev, pt_status_t st, int op)
{
    if (!s || rank < 0 || rank >= s->size || (int)ev < 0 || ev >= PT_STAT_NEVENTS)
        return;
    link_t *l = &s->links[rank];
    atomic_fetch_add_explicit(&l->events[ev], 1, memory_order_relaxed);
    if (st != PT_OK) {
        atomic_store(&l->last_status, (int)st);
        atomic_store(&l->last_op, op);
        atomic_store(&l->last_time_ns, realtime_ns());
    }
}

void pt__stats_fail(pt_stats_t *s, pt__stat_cell_t *c, int rank, int op, pt_status_t st)
{
    bump(&c->errors, 1);
    if (st == PT_ERR_TIMEOUT) {
        bump(&c->timeouts, 1);
        pt__stats_event(s, rank, PT_STAT_TIMEOUT, st, op);
    }
    pt__stats_event(s, rank, PT_STAT_ERROR, st, op);
}

void pt__stats_time(pt__stat_cell_t *c, uint64_t ns)
{
    /* this operation and the untimed ones since the last timed one (ops counts this one) */
    uint64_t done = atomic_load_explicit(&c->ops, memory_order_relaxed) -
                    atomic_load_explicit(&c->errors, memory_order_relaxed);
    uint64_t timed = atomic_load_explicit(&c->timed, memory_order_relaxed);
    uint64_t w = done > timed ? done - timed : 1;
    int b = pt_hist_bucket(ns);
    /* (no count: the snapshot adds the buckets up; min 0 means none yet) */
    uint64_t lo = atomic_load_explicit(&c->min_ns, memory_order_relaxed);
    if (lo == 0 || ns < lo)
        atomic_store_explicit(&c->min_ns, ns, memory_order_relaxed);
    if (ns > atomic_load_explicit(&c->max_ns, memory_order_relaxed))
        atomic_store_explicit(&c->max_ns, ns, memory_order_relaxed);
    bump(&c->sum_ns, ns * w);
    atomic_store_explicit(&c->last_ns, ns, memory_order_relaxed);
    atomic_store_explicit(&c->last_bucket, b, memory_order_relaxed);
    bump(&c->buckets[b], w);
    bump(&c->timed_ops, 1);
    atomic_store_explicit(&c->timed, timed + w, memory_order_release);
    c->mask = ns >= PT_STAT_SLOW_NS ? 0 : c->sample_mask;
}

void pt__stats_add(pt_stats_t *s, int rank, int transport, int op, uint64_t bytes,
                   pt_status_t st, uint64_t ns)
{
    cell_t *c = s ? pt__stats_cell_slow(s, rank, transport, op) : NULL;
    if (!c)
        return;
    bump(&c->ops, 1);
    if (st != PT_OK) {
        pt__stats_fail(s, c, rank, op, st);
        return;
    }
    bump(&c->bytes, bytes);
    pt__stats_time(c, ns);
}

void pt__stats_op(pt_stats_t *s, int rank, int transport, int op, uint64_t bytes,
                  pt_status_t st, uint64_t t0)
{
    if (t0) {
        uint64_t ticks = (pt__stats_ticks() | 1) - t0;
        pt__stats_add(s, rank, transport, op, bytes, st,
                      pt__stats_tsc ? (uint64_t)((double)ticks * pt__stats_ns_per_tick) : ticks);
    }
}

void pt_stats_record(pt_ctx_t *ctx, int rank, int transport, pt_stat_op_t op, uint64_t bytes,
                     pt_status_t st, uint64_t ns)
{
    if (ctx && atomic_load_explicit(&pt__stats_on, memory_order_relaxed))
        pt__stats_add(ctx->stats, rank, transport, (int)op, bytes, st, ns);
}

void pt_stats_count(pt_ctx_t *ctx, int rank, pt_stat_event_t ev)
{
    if (ctx)
        pt__stats_event(ctx->stats, rank, ev, PT_OK, -1);
}

void pt__stats_req_start(pt_stats_t *s, pt_req_t *req, int rank, int transport, int op,
                         uint64_t bytes, uint64_t t0)
{
    if (!t0 || !s)
        return;
    req->stat_t0 = t0;
    req->stat_bytes = bytes;
    req->stat_rank = rank;
    req->stat_transport = transport;
    req->stat_op = op;
    atomic_fetch_add(&s->refs, 1);
    atomic_store_explicit(&req->stat, s, memory_order_release);
}

void pt__stats_req_end(pt_req_t *req)
{
    if (!atomic_load_explicit(&req->stat, memory_order_relaxed))
        return;
    pt_stats_t *s = atomic_exchange(&req->stat, NULL);
    if (!s)
        return;
    if (atomic_load_explicit(&req->done, memory_order_acquire))
        pt__stats_op(s, req->stat_rank, req->stat_transport, req->stat_op, req->stat_bytes,
                     req->status, req->stat_t0);
    pt__stats_unref(s);
}

/* ---- the histogram's arithmetic ---- */

int pt_hist_bucket(uint64_t ns)
{
    if (ns < 64)
        return (int)ns;
    int e = 63 - __builtin_clzll(ns);
    if (e > 37)
        return PT_HIST_BUCKETS - 1;
    return 64 + (e - 6) * 32 + (int)((ns >> (e - 5)) & 31);
}

uint64_t pt_hist_low(int i)
{
    if (i < 64)
        return i < 0 ? 0 : (uint64_t)i;
    int e = 6 + (i - 64) / 32, sub = (i - 64) % 32;
    return (uint64_t)(32 + sub) << (e - 5);
}

uint64_t pt_hist_high(int i)
{
    if (i < 64)
        return i < 0 ? 0 : (uint64_t)i;
    int e = 6 + (i - 64) / 32;
    return pt_hist_low(i) + ((uint64_t)1 << (e - 5)) - 1;
}

void pt_hist_add(pt_hist_t *h, uint64_t ns)
{
    if (h->count == 0 || ns < h->min_ns)
        h->min_ns = ns;
    if (ns > h->max_ns)
        h->max_ns = ns;
    h->count++;
    h->sum_ns += ns;
    h->buckets[pt_hist_bucket(ns)]++;
}

double pt_hist_percentile(const pt_hist_t *h, double q)
{
    if (!h || h->count == 0)
        return 0;
    if (q >= 1)
        return (double)h->max_ns;
    if (q < 0)
        q = 0;
    /* the smallest value v with at least q of the values <= v: its rank, 1-based */
    uint64_t want = (uint64_t)(q * (double)h->count);
    if ((double)want < q * (double)h->count || want == 0)
        want++;
    uint64_t seen = 0;
    for (int i = 0; i < PT_HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= want) {
            double v = ((double)pt_hist_low(i) + (double)pt_hist_high(i)) / 2;
            if (v < (double)h->min_ns)
                v = (double)h->min_ns;
            if (v > (double)h->max_ns)
                v = (double)h->max_ns;
            return v;
        }
    }
    return (double)h->max_ns;
}

/* ---- the snapshot ---- */

static void cell_into(const cell_t *c, pt_stat_entry_t *e)
{
    e->ops += atomic_load_explicit(&c->ops, memory_order_relaxed);
    e->bytes += atomic_load_explicit(&c->bytes, memory_order_relaxed);
    e->errors += atomic_load_explicit(&c->errors, memory_order_relaxed);
    e->timeouts += atomic_load_explicit(&c->timeouts, memory_order_relaxed);
    e->timed += atomic_load_explicit(&c->timed_ops, memory_order_relaxed);
    /* the count is the sum of the buckets read, so percentiles add up even mid-write; the
     * untimed operations since the last timed one go to its bucket (pt__stats_time) */
    uint64_t timed = atomic_load_explicit(&c->timed, memory_order_acquire);
    uint64_t done = atomic_load_explicit(&c->ops, memory_order_relaxed) -
                    atomic_load_explicit(&c->errors, memory_order_relaxed);
    uint64_t pending = timed && done > timed ? done - timed : 0;
    uint64_t n = 0;
    for (int i = 0; i < PT_HIST_BUCKETS; i++)
        n += atomic_load_explicit(&c->buckets[i], memory_order_relaxed);
    if (n == 0)
        return;
    int last = atomic_load_explicit(&c->last_bucket, memory_order_relaxed);
    uint64_t lo = atomic_load_explicit(&c->min_ns, memory_order_relaxed);
    uint64_t hi = atomic_load_explicit(&c->max_ns, memory_order_relaxed);
    if (e->hist.count == 0 || lo < e->hist.min_ns)
        e->hist.min_ns = lo;
    if (hi > e->hist.max_ns)
        e->hist.max_ns = hi;
    e->hist.sum_ns += atomic_load_explicit(&c->sum_ns, memory_order_relaxed) +
                      pending * atomic_load_explicit(&c->last_ns, memory_order_relaxed);
    for (int i = 0; i < PT_HIST_BUCKETS; i++) {
        uint64_t b = atomic_load_explicit(&c->buckets[i], memory_order_relaxed) +
                     (i == last ? pending : 0);
        e->hist.buckets[i] += b;
        e->hist.count += b;
    }
}

pt_status_t pt_ctx_stats(pt_ctx_t *ctx, pt_stat_entry_t **entries, size_t *n,
                         pt_stat_link_t **links, size_t *nlinks)
{
    if (!ctx || !entries || !n || !links || !nlinks)
        return PT_ERR_INVALID;
    pt_stats_t *s = ctx->stats;
    size_t slots = ((size_t)s->size + 1) * NCELLS;
    int *where = malloc(slots * sizeof(int));
    pt_stat_link_t *ls = calloc((size_t)s->size, sizeof(*ls));
    if (!where || !ls) {
        free(where);
        free(ls);
        return PT_ERR_NOMEM;
    }
    memset(where, 0xff, slots * sizeof(int));
    pthread_mutex_lock(&s->lock);
    size_t used = 0;
    for (shard_t *sh = s->shards; sh; sh = sh->next)
        for (int r = 0; r <= s->size; r++) {
            _Atomic(cell_t *) *cells = atomic_load_explicit(&sh->peers[r], memory_order_acquire);
            for (int c = 0; cells && c < NCELLS; c++)
                if (atomic_load_explicit(&cells[c], memory_order_acquire) &&
                    where[(size_t)r * NCELLS + c] < 0)
                    where[(size_t)r * NCELLS + c] = (int)used++;
        }
    pt_stat_entry_t *es = calloc(used ? used : 1, sizeof(*es));
    if (!es) {
        pthread_mutex_unlock(&s->lock);
        free(where);
        free(ls);
        return PT_ERR_NOMEM;
    }
    for (size_t k = 0; k < slots; k++)
        if (where[k] >= 0) {
            pt_stat_entry_t *e = &es[where[k]];
            e->rank = (int)(k / NCELLS) - 1;
            e->transport = (int)(k % NCELLS) / PT_STAT_NOPS;
            e->op = (int)(k % NCELLS) % PT_STAT_NOPS;
        }
    for (shard_t *sh = s->shards; sh; sh = sh->next)
        for (int r = 0; r <= s->size; r++) {
            _Atomic(cell_t *) *cells = atomic_load_explicit(&sh->peers[r], memory_order_acquire);
            for (int c = 0; cells && c < NCELLS; c++) {
                cell_t *cl = atomic_load_explicit(&cells[c], memory_order_acquire);
                if (cl)
                    cell_into(cl, &es[where[(size_t)r * NCELLS + c]]);
            }
        }
    pthread_mutex_unlock(&s->lock);
    free(where);
    for (int r = 0; r < s->size; r++) {
        pt_stat_link_t *l = &ls[r];
        link_t *src = &s->links[r];
        const pt_peer_t *p = &ctx->peers[r];
        l->rank = r;
        l->transport = p->ops ? p->ops->id : 0;
        l->state = atomic_load(&p->lost) ? PT_LINK_LOST : p->ops ? PT_LINK_UP : PT_LINK_UNREACHED;
        for (int ev = 0; ev < PT_STAT_NEVENTS; ev++)
            l->events[ev] = atomic_load_explicit(&src->events[ev], memory_order_relaxed);
        l->last_status = atomic_load(&src->last_status);
        l->last_op = atomic_load(&src->last_op);
        l->last_time = (double)atomic_load(&src->last_time_ns) / 1e9;
    }
    *entries = es;
    *n = used;
    *links = ls;
    *nlinks = (size_t)s->size;
    return PT_OK;
}
