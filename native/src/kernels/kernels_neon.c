/* The aarch64 variant of the kernels: the baseline aarch64 target is NEON (Advanced SIMD is
 * mandatory there), so no target pragma is needed; float16 converts in hardware via _Float16. */
#if defined(__aarch64__)
#include "kernels/kernels_internal.h"

#define PT_KNAME pt_kernels_neon
#define PT_KISA "neon"
#if defined(__FLT16_MAX__)
#define PT_KF16 PT_KF16_FLOAT16
#else
#define PT_KF16 PT_KF16_BITS
#endif
#include "kernels/kernels_impl.h"
#else
typedef int pt_kernels_neon_unused_t; /* ISO C wants a translation unit to declare something */
#endif
