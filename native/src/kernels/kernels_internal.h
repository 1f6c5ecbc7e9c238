/* Private to the kernels: the table each instruction-set variant of kernels_impl.h fills in,
 * and the variants that kernels.c dispatches between. */
#ifndef PT_KERNELS_INTERNAL_H
#define PT_KERNELS_INTERNAL_H

#include <stddef.h>

#include "pt.h"

/* Arguments are checked by kernels.c before a table entry is called: count > 0 and the sizes
 * fit in size_t, nsrc >= 1, min/max never see count == 0, and dst either coincides with a
 * source or overlaps none. */
typedef void (*pt_kreduce_fn)(void *dst, const void *const *srcs, int nsrc, size_t count);
typedef void (*pt_kreduce_all_fn)(const void *src, size_t count, void *out);

typedef struct {
    const char *name; /* what pt_kernels_isa() reports */
    pt_kreduce_fn reduce[PT_NOPS][PT_NDTYPES];
    pt_kreduce_all_fn reduce_all[PT_NOPS][PT_NDTYPES];
} pt_kernels_t;

/* The portable build: no ISA-specific code, float16 by bit manipulation. Always present. */
extern const pt_kernels_t pt_kernels_scalar;
#if defined(__aarch64__)
extern const pt_kernels_t pt_kernels_neon;
#endif
#if defined(__x86_64__)
extern const pt_kernels_t pt_kernels_avx2;
extern const pt_kernels_t pt_kernels_avx512;
#endif

#endif
