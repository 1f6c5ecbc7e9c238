/* Private to native/: how the core (and a transport that has events to report) counts what
 * the data path does. The public half (snapshot, names, histogram arithmetic) is in pt.h.
 *
 * The entry points of pt.h time an operation with pt__stats_t0() before calling through the
 * transport's ops table and hand the outcome to pt__stats_op(); an async operation carries its
 * start time in its request (pt__stats_req_start) and is counted once, when its caller sees it
 * complete (pt__stats_req_end, from pt_req_wait / pt_req_test / pt_req_release). */
#ifndef PT_CORE_STATS_H
#define PT_CORE_STATS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "pt.h"

typedef struct pt_stats pt_stats_t;

/* The counters of a context of `size` ranks (one reference, the context's). */
pt_status_t pt__stats_create(int size, pt_stats_t **out);
/* Drop a reference: the context's at destroy, an async request's once it is counted. */
void pt__stats_unref(pt_stats_t *s);

extern _Atomic int pt__stats_on;
/* The clock the entry points read (pt__stats_ticks): the CPU's own counter where it is
 * invariant (x86-64 TSC, aarch64 CNTVCT: ~10 ns a read, against ~30 ns for clock_gettime in a
 * VM), calibrated against CLOCK_MONOTONIC once per process; else CLOCK_MONOTONIC itself.
 * pt__stats_ns_per_tick is 1 for the latter. */
extern int pt__stats_tsc;
extern double pt__stats_ns_per_tick;

static inline uint64_t pt__stats_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The CPU's counter itself (where there is one; else the clock). */
static inline uint64_t pt__stats_counter(void)
{
#if defined(__x86_64__)
    return __builtin_ia32_rdtsc();
#elif defined(__aarch64__)
    uint64_t v;
    __asm__ volatile("mrs %0, cntvct_el0" : "=r"(v));
    return v;
#else
    return pt__stats_clock();
#endif
}

static inline uint64_t pt__stats_ticks(void)
{
    return pt__stats_tsc ? pt__stats_counter() : pt__stats_clock();
}

/* The start of a timed operation, in ticks: 0 when counting is off (then nothing is
 * counted). */
static inline uint64_t pt__stats_t0(void)
{
    return atomic_load_explicit(&pt__stats_on, memory_order_relaxed) ? pt__stats_ticks() | 1 : 0;
}

/* ---- the one-sided entry points' path (core/rma.c): a cell found inline, most operations
 * counted untimed ----
 *
 * Two reads of the clock cost more than all the rest of the counting (an 8-byte get over
 * shared memory takes ~10 ns in C and ~200 ns from Python; two TSC reads in a VM ~15 ns): so
 * a cell of a one-sided operation times 1 operation in PT_STAT_SAMPLE (and its first), and
 * every operation once its last timed one took PT_STAT_SLOW_NS or more (then the clock's cost
 * is under 1%: tcp, verbs, a stalled peer). A timed operation stands in the histogram for the
 * untimed ones since the one before it (its weight), and the snapshot adds those since the
 * last one to the last one's bucket: the histogram's count stays the operations' count. ops,
 * bytes and errors are exact; so is every error. */
#define PT_STAT_SLOW_NS 2000

typedef struct pt__stat_cell {
    /* written only by the owning thread (relaxed load + store), read by snapshots */
    _Atomic uint64_t ops, bytes, errors, timeouts, sum_ns, min_ns, max_ns;
    _Atomic uint64_t timed;               /* the operations the buckets stand for */
    _Atomic uint64_t timed_ops;           /* the operations measured */
    _Atomic uint64_t last_ns;             /* the last timed operation's latency */
    _Atomic int last_bucket;
    uint64_t mask;                        /* time when (ops & mask) == 0: 0 times every one */
    uint64_t sample_mask;                 /* the mask while operations are quick */
    _Atomic uint64_t buckets[PT_HIST_BUCKETS];
} pt__stat_cell_t;

typedef struct pt__stat_shard {
    struct pt__stat_shard *next;
    uintptr_t owner;
    _Atomic(_Atomic(pt__stat_cell_t *) *) *peers;   /* [size + 1]: slot 0 is rank -1 */
} pt__stat_shard_t;

#define PT_STAT_SLOTS 64                 /* threads found without the lock (a power of 2) */
#define PT_STAT_PROBES 4

struct pt_stats {
    struct {
        _Atomic uintptr_t owner;          /* a thread id, 0: free */
        _Atomic(pt__stat_shard_t *) shard;
    } slots[PT_STAT_SLOTS];
    int size;
    _Atomic int refs;
    pthread_mutex_t lock;                 /* guards the list of shards */
    pt__stat_shard_t *shards;
    struct pt__stat_link *links;          /* [size] */
};

/* This thread's id: on Linux its thread pointer, read inline (what pthread_self returns on
 * glibc, without the call; unique per live thread there, not on every system: macOS keeps
 * it elsewhere), else pthread_self. Reused only once its thread is gone. */
static inline uintptr_t pt__stats_thread(void)
{
#if defined(__has_builtin) && defined(__linux__) && (defined(__x86_64__) || defined(__aarch64__))
#if __has_builtin(__builtin_thread_pointer)
    return (uintptr_t)__builtin_thread_pointer();
#define PT__STATS_THREAD_DONE
#endif
#endif
#ifndef PT__STATS_THREAD_DONE
    return (uintptr_t)pthread_self();
#endif
}

static inline unsigned pt__stats_slot(uintptr_t me)
{
    return (unsigned)((me >> 12) ^ (me >> 21)) & (PT_STAT_SLOTS - 1);
}

/* This thread's cell of (rank, transport, op) made the first time (NULL when out of memory
 * or the arguments are out of range). */
pt__stat_cell_t *pt__stats_cell_slow(pt_stats_t *s, int rank, int transport, int op);

/* The cell the entry point counts in, or NULL when counting is off. Found without a lock or a
 * call: this thread's place in s's small table, then two loads. */
static inline pt__stat_cell_t *pt__stats_cell(pt_stats_t *s, int rank, int transport, int op)
{
    if (!atomic_load_explicit(&pt__stats_on, memory_order_relaxed) || !s)
        return NULL;
    uintptr_t me = pt__stats_thread();
    unsigned j = pt__stats_slot(me);
    if (atomic_load_explicit(&s->slots[j].owner, memory_order_acquire) == me &&
        (unsigned)(rank + 1) <= (unsigned)s->size && (unsigned)op < PT_STAT_NOPS &&
        (unsigned)transport < PT_STAT_NTRANSPORTS) {
        pt__stat_shard_t *sh = atomic_load_explicit(&s->slots[j].shard, memory_order_relaxed);
        _Atomic(pt__stat_cell_t *) *cells =
            atomic_load_explicit(&sh->peers[rank + 1], memory_order_relaxed);
        if (cells) {
            pt__stat_cell_t *c = atomic_load_explicit(
                &cells[transport * PT_STAT_NOPS + op], memory_order_relaxed);
            if (c)
                return c;
        }
    }
    return pt__stats_cell_slow(s, rank, transport, op);
}

/* Only the owning thread writes a cell: a relaxed load and store, no atomic add. */
static inline void pt__stats_bump(_Atomic uint64_t *p, uint64_t v)
{
    atomic_store_explicit(p, atomic_load_explicit(p, memory_order_relaxed) + v,
                          memory_order_relaxed);
}

/* Before the operation: its start in ticks when this one is timed, else 0. */
static inline uint64_t pt__stats_start(pt__stat_cell_t *c)
{
    uint64_t ops = atomic_load_explicit(&c->ops, memory_order_relaxed);
    if ((ops & c->mask) == 0 || atomic_load_explicit(&c->timed, memory_order_relaxed) == 0)
        return pt__stats_ticks() | 1;
    return 0;
}

/* A timed operation of latency ns (and the untimed ones before it) into c's histogram. */
void pt__stats_time(pt__stat_cell_t *c, uint64_t ns);
/* A failed operation: its error, its timeout, the link's last error. */
void pt__stats_fail(pt_stats_t *s, pt__stat_cell_t *c, int rank, int op, pt_status_t st);

/* After the operation (started with pt__stats_start's t0), with its status. */
static inline void pt__stats_end(pt_stats_t *s, pt__stat_cell_t *c, int rank, int op,
                                 uint64_t bytes, pt_status_t st, uint64_t t0)
{
    pt__stats_bump(&c->ops, 1);
    if (st != PT_OK) {
        pt__stats_fail(s, c, rank, op, st);
        return;
    }
    pt__stats_bump(&c->bytes, bytes);
    if (t0) {
        uint64_t ticks = (pt__stats_ticks() | 1) - t0;
        pt__stats_time(c, pt__stats_tsc ? (uint64_t)((double)ticks * pt__stats_ns_per_tick)
                                         : ticks);
    }
}

/* Count one operation started at t0 (pt__stats_t0, ticks) that ended now with status st. */
void pt__stats_op(pt_stats_t *s, int rank, int transport, int op, uint64_t bytes,
                  pt_status_t st, uint64_t t0);
/* As pt__stats_op, for a known latency. */
void pt__stats_add(pt_stats_t *s, int rank, int transport, int op, uint64_t bytes,
                   pt_status_t st, uint64_t ns);
/* Count one event of rank's link; an error status (st != PT_OK) is kept as its last error. */
void pt__stats_event(pt_stats_t *s, int rank, pt_stat_event_t ev, pt_status_t st, int op);

struct pt_req;
/* An async operation req started at t0: it takes a reference to s until it is counted. */
void pt__stats_req_start(pt_stats_t *s, struct pt_req *req, int rank, int transport, int op,
                         uint64_t bytes, uint64_t t0);
/* req has completed (or is being released): count it once, with its status when done. */
void pt__stats_req_end(struct pt_req *req);

#endif
