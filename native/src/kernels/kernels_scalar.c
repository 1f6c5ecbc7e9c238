/* The portable variant of the kernels: plain C for the baseline target, float16 by bit
 * manipulation. Always built; dispatched to when nothing better is supported, or forced with
 * POOLTENSOR_KERNELS=scalar as a reference for the others. The compiler may still vectorize it
 * for the baseline (SSE2 on x86-64); "scalar" means no instruction-set-specific code. */
#include "kernels/kernels_internal.h"

#define PT_KNAME pt_kernels_scalar
#define PT_KISA "scalar"
#define PT_KF16 PT_KF16_BITS
#include "kernels/kernels_impl.h"
