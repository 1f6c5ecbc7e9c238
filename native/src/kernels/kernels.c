/* Kernels: copy, strided gather/scatter, and the entry points of the reductions.
 *
 * The reductions themselves live in kernels_impl.h, compiled once per instruction set
 * (kernels_scalar.c, kernels_neon.c, kernels_avx2.c, kernels_avx512.c). This file checks the
 * arguments and dispatches, once per process, to the best variant the CPU supports, unless
 * POOLTENSOR_KERNELS (read at the first call) names a lesser one: "scalar", "neon", "avx2" or
 * "avx512". A name the CPU cannot run falls back to the best variant below it; anything else
 * ("auto", empty) means the best.
 *
 * Gather and scatter move whole elements with memcpy and need no vector code: rows that are
 * contiguous go through memcpy at full speed, and the rest is bound by the strided accesses.
 */
#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_internal.h"
#include "pt.h"

#define PT_KMAXDIM 64 /* as Python's buffer protocol and numpy */

size_t pt_dtype_size(pt_dtype_t dt)
{
    static const unsigned char sizes[PT_NDTYPES] = {
        [PT_I8] = 1,  [PT_I16] = 2, [PT_I32] = 4,  [PT_I64] = 8,  [PT_U8] = 1,  [PT_U16] = 2,
        [PT_U32] = 4, [PT_U64] = 8, [PT_F16] = 2, [PT_BF16] = 2, [PT_F32] = 4, [PT_F64] = 8,
    };
    return (unsigned)dt < PT_NDTYPES ? sizes[dt] : 0;
}

/* ---- dispatch ---- */

static const pt_kernels_t *const pt_kernels_variants[] = {
#if defined(__x86_64__)
    &pt_kernels_avx512,
    &pt_kernels_avx2,
#endif
#if defined(__aarch64__)
    &pt_kernels_neon,
#endif
    &pt_kernels_scalar,
};
#define PT_KNVARIANTS (sizeof pt_kernels_variants / sizeof pt_kernels_variants[0])

static int pt_kernels_runs(const pt_kernels_t *k)
{
#if defined(__x86_64__)
    /* avx2 (which includes the OS saving the ymm state) and F16C, CPUID.1:ECX bit 29, which
     * not every compiler's __builtin_cpu_supports knows. */
    unsigned a, b, c, d;
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
    if (k == &pt_kernels_avx512)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    if (k == &pt_kernels_avx2)
        return avx2;
#endif
    return 1;
}

static const pt_kernels_t *pt_kernels_pick(void)
{
    const char *want = getenv("POOLTENSOR_KERNELS");
    size_t first = 0;
    for (size_t i = 0; want && i < PT_KNVARIANTS; i++)
        if (strcmp(want, pt_kernels_variants[i]->name) == 0)
            first = i;
    for (size_t i = first; i < PT_KNVARIANTS; i++)
        if (pt_kernels_runs(pt_kernels_variants[i]))
            return pt_kernels_variants[i];
    return &pt_kernels_scalar;
}

/* Chosen at the first call; threads racing on it all pick the same table. */
static const pt_kernels_t *pt_kernels(void)
{
    static _Atomic(const pt_kernels_t *) chosen;
    const pt_kernels_t *k = atomic_load_explicit(&chosen, memory_order_acquire);
    if (!k) {
        k = pt_kernels_pick();
        atomic_store_explicit(&chosen, k, memory_order_release);
    }
    return k;
}

const char *pt_kernels_isa(void)
{
    return pt_kernels()->name;
}

/* ---- copy, gather, scatter ---- */

#if defined(__x86_64__)
#include <immintrin.h>

/* Plain 32-byte vector moves, for 2 KiB .. 1 MiB. glibc's memmove switches to `rep movsb`
 * in that range on many x86 CPUs, which runs at half speed from memory on 4 KiB pages, the pages
 * shared segments have (shmem gets no transparent huge pages by default): exactly the
 * slab and chunk sizes the transports copy. With `stream`, non-temporal stores: for
 * destinations not read again soon (a large collective's output), which saves reading every
 * destination line before writing it. */
__attribute__((target("avx2"))) static void copy_avx2(uint8_t *d, const uint8_t *s, size_t n,
                                                      int stream)
{
    size_t i = 0;
    if (stream) {
        i = (32 - ((uintptr_t)d & 31)) & 31;   /* streaming stores need aligned addresses */
        i = i > n ? n : i;
        memcpy(d, s, i);
    }
    for (; i + 128 <= n; i += 128) {
        __m256i v[4];
        for (int k = 0; k < 4; k++)
            v[k] = _mm256_loadu_si256((const __m256i *)(s + i + 32 * k));
        for (int k = 0; k < 4; k++) {
            if (stream)
                _mm256_stream_si256((__m256i *)(d + i + 32 * k), v[k]);
            else
                _mm256_storeu_si256((__m256i *)(d + i + 32 * k), v[k]);
        }
    }
    if (stream)
        _mm_sfence();
    memcpy(d + i, s + i, n - i);
}

/* 1 when the vector copy may run here (and the kernels were not forced below AVX2). */
static int copy_vec(void)
{
    static int vec = -1;
    if (vec < 0) {
        const char *isa = pt_kernels_isa();
        vec = strcmp(isa, "avx2") == 0 || strcmp(isa, "avx512") == 0;
    }
    return vec;
}
#endif

void pt__copy_stream(void *dst, const void *src, size_t len)
{
#if defined(__x86_64__)
    const uint8_t *s = src;
    uint8_t *d = dst;
    if (len >= 4096 && copy_vec() && (d + len <= s || s + len <= d)) {
        copy_avx2(d, s, len, 1);
        return;
    }
#endif
    pt_copy(dst, src, len);
}

void pt_copy(void *dst, const void *src, size_t len)
{
    if (!len)
        return;
#if defined(__x86_64__)
    const uint8_t *s = src;
    uint8_t *d = dst;
    /* glibc's own vector loop (with non-temporal stores for large sizes) wins from 1 MiB */
    if (len >= 2048 && len < (1u << 20) && copy_vec() && (d + len <= s || s + len <= d)) {
        copy_avx2(d, s, len, 0);
        return;
    }
#endif
    memmove(dst, src, len);
}

typedef struct {
    int ndim;
    int64_t shape[PT_KMAXDIM];
    int64_t strides[PT_KMAXDIM];
} pt_klayout_t;

/* Check a layout and simplify it: drop length-1 dimensions and merge neighbours that step
 * through memory as one (stride[i] == stride[i+1] * shape[i+1]), so that a contiguous or
 * row-contiguous slice becomes a few long memcpy calls. *items is 0 when there is nothing to
 * move. */
static pt_status_t pt_klayout_make(int ndim, const int64_t *shape, const int64_t *strides,
                                   size_t itemsize, pt_klayout_t *out, size_t *items)
{
    if (ndim < 0 || ndim > PT_KMAXDIM || itemsize == 0 || (ndim > 0 && (!shape || !strides)))
        return PT_ERR_INVALID;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return PT_ERR_INVALID;
        if (shape[i] == 0)
            n = 0;
        else if (n && (uint64_t)shape[i] > SIZE_MAX / itemsize / n)
            return PT_ERR_INVALID;
        else
            n *= (size_t)shape[i];
    }
    int nd = 0;
    for (int i = 0; n && i < ndim; i++) {
        if (shape[i] == 1)
            continue;
        int64_t span;
        if (nd > 0 && !__builtin_mul_overflow(strides[i], shape[i], &span) &&
            out->strides[nd - 1] == span) {
            out->shape[nd - 1] *= shape[i];
            out->strides[nd - 1] = strides[i];
        } else {
            out->shape[nd] = shape[i];
            out->strides[nd] = strides[i];
            nd++;
        }
    }
    out->ndim = nd;
    *items = n;
    return PT_OK;
}

/* One row of n elements, stride bytes apart on the strided side. */
#define PT_KROW_LOOP(SIZE)                                                                     \
    for (int64_t i = 0; i < n; i++)                                                            \
        if (gather)                                                                            \
            memcpy(contig + i * (SIZE), strided + i * stride, (SIZE));                         \
        else                                                                                   \
            memcpy(strided + i * stride, contig + i * (SIZE), (SIZE));

static void pt_krow(char *contig, char *strided, int64_t n, int64_t stride, size_t itemsize,
                    int gather)
{
    if (stride == (int64_t)itemsize) {
        if (gather)
            memcpy(contig, strided, (size_t)n * itemsize);
        else
            memcpy(strided, contig, (size_t)n * itemsize);
        return;
    }
    switch (itemsize) {
    case 1: PT_KROW_LOOP(1) break;
    case 2: PT_KROW_LOOP(2) break;
    case 4: PT_KROW_LOOP(4) break;
    case 8: PT_KROW_LOOP(8) break;
    case 16: PT_KROW_LOOP(16) break;
    default: PT_KROW_LOOP(itemsize) break;
    }
}

/* Walk the strided side in C order, one innermost row at a time; the contiguous side advances
 * by a row each step. */
static pt_status_t pt_kstrided(char *contig, char *strided, int ndim, const int64_t *shape,
                               const int64_t *strides, size_t itemsize, int gather)
{
    pt_klayout_t l;
    size_t items;
    pt_status_t st = pt_klayout_make(ndim, shape, strides, itemsize, &l, &items);
    if (st != PT_OK || items == 0)
        return st;
    if (!contig || !strided)
        return PT_ERR_INVALID;
    if (l.ndim == 0) { /* a single element */
        pt_krow(contig, strided, 1, (int64_t)itemsize, itemsize, gather);
        return PT_OK;
    }
    int inner = l.ndim - 1;
    int64_t n = l.shape[inner], stride = l.strides[inner];
    size_t row = (size_t)n * itemsize;
    int64_t idx[PT_KMAXDIM] = {0};
    for (;;) {
        pt_krow(contig, strided, n, stride, itemsize, gather);
        contig += row;
        int d = inner - 1;
        for (; d >= 0; d--) {
            strided += l.strides[d];
            if (++idx[d] < l.shape[d])
                break;
            strided -= l.strides[d] * l.shape[d];
            idx[d] = 0;
        }
        if (d < 0)
            return PT_OK;
    }
}

pt_status_t pt_gather(void *dst, const void *src, int ndim, const int64_t *shape,
                      const int64_t *strides, size_t itemsize)
{
    return pt_kstrided(dst, (char *)(uintptr_t)src, ndim, shape, strides, itemsize, 1);
}

pt_status_t pt_scatter(void *dst, const void *src, int ndim, const int64_t *shape,
                       const int64_t *strides, size_t itemsize)
{
    return pt_kstrided((char *)(uintptr_t)src, dst, ndim, shape, strides, itemsize, 0);
}

/* ---- reductions ---- */

pt_status_t pt_reduce(pt_op_t op, pt_dtype_t dt, void *dst, const void *const *srcs, int nsrc,
                      size_t count)
{
    if ((unsigned)op >= PT_NOPS || (unsigned)dt >= PT_NDTYPES || nsrc < 1 || !srcs)
        return PT_ERR_INVALID;
    size_t size = pt_dtype_size(dt);
    if (count > SIZE_MAX / size)
        return PT_ERR_INVALID;
    if (count == 0)
        return PT_OK;
    size_t bytes = count * size;
    uintptr_t d = (uintptr_t)dst;
    if (!dst || d > UINTPTR_MAX - bytes)
        return PT_ERR_INVALID;
    /* dst may be any of the sources, but must not overlap one partially. */
    for (int k = 0; k < nsrc; k++) {
        uintptr_t s = (uintptr_t)srcs[k];
        if (!srcs[k] || s > UINTPTR_MAX - bytes || (s != d && s < d + bytes && d < s + bytes))
            return PT_ERR_INVALID;
    }
    if (nsrc == 1) {
        if (dst != srcs[0])
            memcpy(dst, srcs[0], bytes);
        return PT_OK;
    }
    pt_kernels()->reduce[op][dt](dst, srcs, nsrc, count);
    return PT_OK;
}

pt_status_t pt_reduce_all(pt_op_t op, pt_dtype_t dt, const void *src, size_t count, void *out)
{
    if ((unsigned)op >= PT_NOPS || (unsigned)dt >= PT_NDTYPES || !out)
        return PT_ERR_INVALID;
    if (count > SIZE_MAX / pt_dtype_size(dt) || (count && !src))
        return PT_ERR_INVALID;
    if (count == 0 && (op == PT_MIN || op == PT_MAX))
        return PT_ERR_INVALID;
    pt_kernels()->reduce_all[op][dt](src, count, out);
    return PT_OK;
}
