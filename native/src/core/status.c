/* Status strings, the clock and the poll-then-block policy shared by the whole data path. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "core/internal.h"

long pt__env_long(const char *name, long dflt, long lo, long hi)
{
    const char *e = getenv(name);
    long v = e && *e ? atol(e) : dflt;
    return v < lo ? lo : v > hi ? hi : v;
}

const char *pt_status_str(pt_status_t st)
{
    switch (st) {
    case PT_OK: return "ok";
    case PT_ERR_INVALID: return "invalid argument";
    case PT_ERR_NOMEM: return "out of memory";
    case PT_ERR_SYS: return "system call failed";
    case PT_ERR_KEY: return "no registration under that key";
    case PT_ERR_BOUNDS: return "range outside the registration";
    case PT_ERR_MODE: return "write into a read-only registration";
    case PT_ERR_ALIGN: return "atomic operations need an 8-byte aligned offset";
    case PT_ERR_UNSUPPORTED: return "operation not supported on this memory";
    case PT_ERR_TIMEOUT: return "timed out";
    case PT_ERR_PEER_LOST: return "peer process is gone";
    case PT_ERR_CLOSED: return "closed";
    case PT_ERR_MISMATCH: return "ranks called the collective with different arguments";
    case PT_ERR_AUTH: return "authentication failed: the peer holds a different secret";
    case PT_ERR_INDOUBT:
        return "the connection dropped with the request in flight: it may or may not have been "
               "applied (not repeated: not safe to repeat)";
    case PT_ERR_RESTARTED: return "the peer restarted: what it held is gone";
    }
    return "unknown status";
}

const char *pt_platform(void) { return pt_plat_name(); }

#ifdef __APPLE__
#include <mach/mach_time.h>

/* macOS: the monotonic tick counter, scaled once (clock_gettime costs more there). */
double pt__now(void)
{
    static double scale;
    if (scale == 0) {
        mach_timebase_info_data_t tb;
        mach_timebase_info(&tb);
        scale = (double)tb.numer / (double)tb.denom * 1e-9;
    }
    return (double)mach_absolute_time() * scale;
}
#else
double pt__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
#endif

static _Atomic double spin_seconds = -1;

/* Spin allowed while the machine is crowded (more threads runnable than CPUs): a few polls. */
#define CROWDED_SPIN 5e-6
/* How often the machine's runnable count is read again (seconds). */
#define CROWD_PERIOD 0.005

#ifdef __linux__
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

static _Atomic int64_t crowd_checked_ns; /* when /proc/loadavg was last read */
static _Atomic int crowded;              /* what it said: runnable threads > CPUs */
static int ncpu;

/* Whether more threads are runnable on this machine than it has CPUs. A poller then holds a
 * core that the thread it waits for (a peer's, or this process's tcp server thread) may need,
 * and yielding does not hand it over when the two sit in different scheduling groups (ranks
 * that an MPI launcher starts each in a session of its own: sched_yield only reorders the
 * poller's own group), so the other runs only once the poll ends; a 1 ms poll then costs 1 ms
 * per hand-off. Read from /proc/loadavg's running count, by one thread at most every
 * CROWD_PERIOD. */
static int machine_crowded(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    int64_t last = atomic_load_explicit(&crowd_checked_ns, memory_order_relaxed);
    if (now - last < (int64_t)(CROWD_PERIOD * 1e9) ||
        !atomic_compare_exchange_strong(&crowd_checked_ns, &last, now))
        return atomic_load_explicit(&crowded, memory_order_relaxed);
    if (ncpu <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        ncpu = n > 0 ? (int)n : 1;
    }
    char buf[128];
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC), busy = 0;
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        int running = 0, total = 0;
        double a, b, c;
        if (n > 0) {
            buf[n] = 0;
            if (sscanf(buf, "%lf %lf %lf %d/%d", &a, &b, &c, &running, &total) == 5)
                busy = running > ncpu;
        }
    }
    atomic_store_explicit(&crowded, busy, memory_order_relaxed);
    return busy;
}
#else
static int machine_crowded(void) { return 0; }
#endif

/* How long a waiter polls before it blocks. Long enough to catch a peer running on another
 * core (a wake-up from pt_plat_wait costs tens of microseconds), short when ranks outnumber
 * cores, and a few polls only while the machine is crowded right now (machine_crowded). */
double pt__spin_seconds(void)
{
    double s = atomic_load_explicit(&spin_seconds, memory_order_relaxed);
    if (s < 0) {
        const char *env = getenv("POOLTENSOR_SPIN_US");
        double us = env && *env ? atof(env) : 20.0;     /* empty: unset, as everywhere */
        s = (us < 0 ? 0 : us) * 1e-6;
        atomic_store(&spin_seconds, s);
    }
    if (s > CROWDED_SPIN && machine_crowded())
        return CROWDED_SPIN;
    return s;
}

void pt__relax(double elapsed)
{
    if (elapsed > 5e-6)
        sched_yield();
}

double pt_spin(void) { return pt__spin_seconds(); }

void pt_set_spin(double seconds) { atomic_store(&spin_seconds, seconds < 0 ? 0 : seconds); }
