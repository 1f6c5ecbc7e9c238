/* Private to native/: how the core (and a transport that has events to report) counts what
 * the data path does. The public half (snapshot, names, histogram arithmetic) is in pt.h.
 *
 * The entry points of pt.h time an operation with pt__stats_t0() before calling through the
 * transport's ops table and hand the outcome to pt__stats_op(); an async operation carries its
 * start time in its request (pt__stats_req_start) and is counted once, when its caller sees it
 * complete (pt__stats_req_end, from pt_req_wait / pt_req_test / pt_req_release). */
#ifndef PT_CORE_STATS_H
#define PT_CORE_STATS_H

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
