/* The native counters' cost with nothing around them: pt_get of 8 bytes from this process's
 * own segment (the shortest path the core has) in a loop, counters on and off in alternating
 * batches; prints "off_ns on_ns" (the best batch of each). Built by bench/stats.py with the
 * sources of native/ (cc -O3), run in a process of its own. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "pt.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000000, reps = argc > 2 ? atoi(argv[2]) : 20;
    pt_ctx_t *c;
    pt_segment_t *s;
    uint64_t key;
    if (pt_ctx_create(0, 1, 1, &c) != PT_OK || pt_segment_create(1 << 20, &s) != PT_OK ||
        pt_ctx_add_segment(c, s) != PT_OK ||
        pt_ctx_register(c, pt_segment_base(s), 1 << 20, PT_ACCESS_RW, &key) != PT_OK)
        return 1;
    char buf[8];
    double best[2] = {1e9, 1e9};
    for (int r = 0; r < reps; r++)
        for (int k = 0; k < 2; k++) {
            int on = (r + k) & 1; /* the order alternates from batch to batch */
            pt_stats_enable(on);
            double t = now();
            for (int i = 0; i < n; i++)
                if (pt_get(c, 0, key, 0, buf, 8) != PT_OK)
                    return 1;
            t = (now() - t) / n * 1e9;
            if (t < best[on])
                best[on] = t;
        }
    printf("%.2f %.2f\n", best[0], best[1]);
    pt_ctx_destroy(c);
    pt_segment_destroy(s);
    return 0;
}
