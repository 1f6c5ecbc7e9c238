/* The AVX2 variant of the kernels (x86-64 with AVX2 and F16C: Haswell, Zen and later). Chosen
 * at run time by kernels.c; the target applies to this file only. FMA is deliberately left out:
 * a contracted multiply-add would make results differ from the other variants. */
#if defined(__x86_64__)
/* System headers first, so that the target below applies to our functions only. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "kernels/kernels_internal.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif

#define PT_KNAME pt_kernels_avx2
#define PT_KISA "avx2"
#define PT_KF16 PT_KF16_F16C
#include "kernels/kernels_impl.h"

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#else
typedef int pt_kernels_avx2_unused_t; /* ISO C wants a translation unit to declare something */
#endif
