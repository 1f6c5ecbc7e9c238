/* kernels_impl.h: the reduction kernels, written once and compiled once per instruction set.
 *
 * A variant file (kernels_scalar.c, kernels_neon.c, kernels_avx2.c, kernels_avx512.c) puts its
 * target in force, defines
 *     PT_KNAME   the table it exports: pt_kernels_<isa>
 *     PT_KISA    the name pt_kernels_isa() reports
 *     PT_KF16    how float16 is converted: PT_KF16_BITS (portable bit manipulation),
 *                PT_KF16_FLOAT16 (the compiler's _Float16: hardware conversions on aarch64) or
 *                PT_KF16_F16C (x86 F16C intrinsics: GCC 12 does not vectorize _Float16
 *                conversions even with f16c enabled, so x86 uses the instructions directly)
 * and includes this file once. Everything here is static except that one table.
 *
 * The loops are plain C that GCC and clang auto-vectorize at -O3 for whatever target is in
 * force (check with -fopt-info-vec). What keeps them so:
 *  - Element pointers have alignment 1 and may_alias: buffers come from Python at any byte
 *    offset, so the compiler must use unaligned vector loads rather than assume (or peel for)
 *    natural alignment, and type-based aliasing never applies to caller memory.
 *  - restrict on every pointer of an inner loop; aliasing between dst and the sources is sorted
 *    out once per call, not per element.
 *  - Selects, not branches, inside loops (no control flow, no trapping float op under a
 *    condition), so the float16 bit conversions vectorize too.
 *
 * Results do not depend on the variant or the machine, bit for bit, NaNs included: every variant
 * performs the same operations in the same order (fixed lane count and leaf size in reduce_all,
 * no FMA since no variant enables it), every float16/bfloat16 conversion rounds to nearest even,
 * and every NaN result is the one NaN (see "one NaN" below). Ranks on machines with different
 * instruction sets, x86-64 and aarch64 alike, therefore agree; native/tests/kernels_check.c
 * checks every variant against scalar bitwise, and its digests compare machines.
 */
#include <stdint.h>
#include <string.h>

#include "kernels/kernels_internal.h"

#define PT_KF16_BITS 1
#define PT_KF16_FLOAT16 2
#define PT_KF16_F16C 3

#if !defined(PT_KNAME) || !defined(PT_KISA) || !defined(PT_KF16)
#error "define PT_KNAME, PT_KISA and PT_KF16 before including kernels_impl.h"
#endif

/* Elements as they lie in caller memory: any byte alignment, any effective type. */
#define PT_KMEM __attribute__((aligned(1), may_alias))
typedef int8_t pt_i8m_t PT_KMEM;
typedef int16_t pt_i16m_t PT_KMEM;
typedef int32_t pt_i32m_t PT_KMEM;
typedef int64_t pt_i64m_t PT_KMEM;
typedef uint8_t pt_u8m_t PT_KMEM;
typedef uint16_t pt_u16m_t PT_KMEM;
typedef uint32_t pt_u32m_t PT_KMEM;
typedef uint64_t pt_u64m_t PT_KMEM;
typedef float pt_f32m_t PT_KMEM;
typedef double pt_f64m_t PT_KMEM;

/* Bytes per block when several sources are combined (the block of dst stays in L1), and
 * float32 values per block for the 16-bit floats. */
#define PT_KBLOCK_BYTES 8192
#define PT_KHALF 1024

/* ---- 16-bit floats <-> float32 ---- */

static inline float pt_k_f32_from_bits(uint32_t u)
{
    union { uint32_t u; float f; } v = {u};
    return v.f;
}

static inline uint32_t pt_k_f32_bits(float f)
{
    union { float f; uint32_t u; } v = {f};
    return v.u;
}

/* c ? a : b for c in {0, 1}, written so that no branch can appear. */
static inline uint32_t pt_k_sel(uint32_t c, uint32_t a, uint32_t b)
{
    uint32_t m = 0u - c;
    return (a & m) | (b & ~m);
}

/* bfloat16 is the top half of a float32. Rounding adds 0x7fff plus the lowest kept bit (ties
 * to even); a NaN is truncated and its quiet bit set so that it cannot round to infinity. */
static inline float pt_k_bf16_to_f32(uint16_t h)
{
    return pt_k_f32_from_bits((uint32_t)h << 16);
}

static inline uint16_t pt_k_f32_to_bf16(float f)
{
    uint32_t u = pt_k_f32_bits(f);
    uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)pt_k_sel((u & 0x7fffffffu) > 0x7f800000u, (u >> 16) | 0x40u, rne);
}

static void pt_k_bf16_in(float *restrict out, const pt_u16m_t *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = pt_k_bf16_to_f32(in[i]);
}

static void pt_k_bf16_out(pt_u16m_t *restrict out, const float *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = pt_k_f32_to_bf16(in[i]);
}

#if PT_KF16 == PT_KF16_BITS
/* float16 -> float32 exactly: move exponent and mantissa into place and scale by 2^112, which
 * also normalizes subnormals (as long as the FPU does not flush denormals, its default);
 * infinities and NaNs get the all-ones exponent instead. Both directions were checked against
 * the hardware conversions for every input (all 2^16 halves, all 2^32 floats). */
static inline float pt_k_f16_to_f32(uint16_t h)
{
    uint32_t em = (uint32_t)h & 0x7fffu;
    float mag = pt_k_f32_from_bits(em << 13) * 0x1p112f;
    uint32_t m = pt_k_sel(em >= 0x7c00u, (em << 13) | 0x7f800000u, pt_k_f32_bits(mag));
    return pt_k_f32_from_bits(m | (((uint32_t)h & 0x8000u) << 16));
}

/* float32 -> float16, round to nearest even. Normal results round by integer arithmetic on the
 * bits; subnormal results let the FPU round by adding a magic number whose ulp is the float16
 * subnormal step; too large gives infinity, NaN gives the quiet NaN 0x7e00 (sign kept). */
static inline uint16_t pt_k_f32_to_f16(float f)
{
    uint32_t u = pt_k_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    u &= 0x7fffffffu;
    const float magic = 0x1p-1f; /* exponent 126: float16 subnormals land in its low bits */
    uint32_t sub = pt_k_f32_bits(pt_k_f32_from_bits(u) + magic) - pt_k_f32_bits(magic);
    uint32_t nrm = (u - (112u << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
    uint32_t big = pt_k_sel(u > 0x7f800000u, 0x7e00u, 0x7c00u);
    uint32_t r = pt_k_sel(u >= (143u << 23), big, pt_k_sel(u < (113u << 23), sub, nrm));
    return (uint16_t)(r | sign);
}

static void pt_k_f16_in(float *restrict out, const pt_u16m_t *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = pt_k_f16_to_f32(in[i]);
}

static void pt_k_f16_out(pt_u16m_t *restrict out, const float *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = pt_k_f32_to_f16(in[i]);
}

#elif PT_KF16 == PT_KF16_FLOAT16
typedef _Float16 pt_f16m_t PT_KMEM;

static void pt_k_f16_in(float *restrict out, const pt_u16m_t *restrict in, size_t n)
{
    const pt_f16m_t *restrict h = (const pt_f16m_t *)in;
    for (size_t i = 0; i < n; i++)
        out[i] = (float)h[i];
}

static void pt_k_f16_out(pt_u16m_t *restrict out, const float *restrict in, size_t n)
{
    pt_f16m_t *restrict h = (pt_f16m_t *)out;
    for (size_t i = 0; i < n; i++)
        h[i] = (_Float16)in[i];
}

#elif PT_KF16 == PT_KF16_F16C
/* vcvtph2ps / vcvtps2ph, 8 at a time; the tail goes through a small zeroed buffer. */
static void pt_k_f16_in(float *restrict out, const pt_u16m_t *restrict in, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
    if (i < n) {
        uint16_t h[8] = {0};
        float f[8];
        memcpy(h, (const void *)(in + i), (n - i) * 2);
        _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)));
        memcpy(out + i, f, (n - i) * 4);
    }
}

static void pt_k_f16_out(pt_u16m_t *restrict out, const float *restrict in, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    if (i < n) {
        float f[8] = {0};
        uint16_t h[8];
        memcpy(f, in + i, (n - i) * 4);
        __m128i v = _mm256_cvtps_ph(_mm256_loadu_ps(f), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)h, v);
        memcpy((void *)(out + i), h, (n - i) * 2);
    }
}
#else
#error "PT_KF16 must be PT_KF16_BITS, PT_KF16_FLOAT16 or PT_KF16_F16C"
#endif

/* ---- one NaN ----
 *
 * Every NaN a floating reduction computes is written as the positive quiet NaN with no payload
 * (float32 0x7fc00000, float64 0x7ff8000000000000, float16 0x7e00, bfloat16 0x7fc0). Left
 * alone, the bits of a NaN depend on the machine, not on the data: an invalid operation
 * (inf - inf, 0 * inf) gives a negative NaN on x86 and a positive one on aarch64, which of two
 * NaN operands propagates depends on the operand order the compiler picked for each variant,
 * and the float16 conversions keep payloads in hardware but not in bit manipulation. A select
 * after the operation (compare and blend, vectorized like the rest) makes results bitwise the
 * same on every machine, NaNs included. */
static inline float pt_k_canon_f32(float x)
{
    return x != x ? pt_k_f32_from_bits(0x7fc00000u) : x;
}

static inline double pt_k_canon_f64(double x)
{
    union { uint64_t u; double d; } nan = {0x7ff8000000000000ull};
    return x != x ? nan.d : x;
}

#define PT_KCANON(x) _Generic((x), float: pt_k_canon_f32, double: pt_k_canon_f64)(x)

/* ---- the four operations ---- */

#define PT_KSUM(a, b) ((a) + (b))
#define PT_KPROD(a, b) ((a) * (b))
#define PT_KIMIN(a, b) ((a) < (b) ? (a) : (b))
#define PT_KIMAX(a, b) ((a) > (b) ? (a) : (b))
/* np.minimum / np.maximum: a NaN on either side gives NaN. */
#define PT_KFMIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define PT_KFMAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))

/* ---- pt_reduce: dst = srcs[0] op srcs[1] op ... elementwise (nsrc >= 2 here) ---- */

/* 1 when dst is one of srcs[1..]: then each block is combined in scratch and copied out, so
 * that no source is overwritten before it is read. */
static int pt_k_later_alias(const void *dst, const void *const *srcs, int nsrc)
{
    for (int k = 1; k < nsrc; k++)
        if (srcs[k] == dst)
            return 1;
    return 0;
}

/* Types computed as they are stored (integers, float32, float64). With no aliasing and two
 * sources this is one pass; with more, dst is built a block at a time while it sits in L1. */
#define PT_KDEF_REDUCE(NAME, M, OP)                                                                \
    static void NAME##_two(M *restrict d, const M *restrict a, const M *restrict b, size_t n)      \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = OP(a[i], b[i]);                                                                 \
    }                                                                                              \
    static void NAME##_acc(M *restrict d, const M *restrict s, size_t n)                           \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            d[i] = OP(d[i], s[i]);                                                                 \
    }                                                                                              \
    static void NAME(void *dst, const void *const *srcs, int nsrc, size_t n)                       \
    {                                                                                              \
        _Alignas(64) unsigned char tmp[PT_KBLOCK_BYTES];                                           \
        int later = pt_k_later_alias(dst, srcs, nsrc);                                             \
        size_t blk = nsrc == 2 && !later ? n : PT_KBLOCK_BYTES / sizeof(M);                        \
        for (size_t b = 0; b < n; b += blk) {                                                      \
            size_t m = n - b < blk ? n - b : blk;                                                  \
            M *d = later ? (M *)tmp : (M *)dst + b;                                                \
            const M *s0 = (const M *)srcs[0] + b;                                                  \
            if (d == s0)                                                                           \
                NAME##_acc(d, (const M *)srcs[1] + b, m);                                          \
            else                                                                                   \
                NAME##_two(d, s0, (const M *)srcs[1] + b, m);                                      \
            for (int k = 2; k < nsrc; k++)                                                         \
                NAME##_acc(d, (const M *)srcs[k] + b, m);                                          \
            if (later)                                                                             \
                memcpy((M *)dst + b, tmp, m * sizeof(M));                                          \
        }                                                                                          \
    }

/* 16-bit floats: every block of every source is widened to float32, combined there, and
 * rounded once into dst. dst is written only after all sources of the block are read. */
#define PT_KDEF_REDUCE_HALF(NAME, IN, OUT, OP)                                                     \
    static void NAME##_acc(float *restrict acc, const float *restrict t, size_t n)                 \
    {                                                                                              \
        for (size_t i = 0; i < n; i++)                                                             \
            acc[i] = OP(acc[i], t[i]);                                                             \
    }                                                                                              \
    static void NAME(void *dst, const void *const *srcs, int nsrc, size_t n)                       \
    {                                                                                              \
        _Alignas(64) float acc[PT_KHALF];                                                          \
        _Alignas(64) float t[PT_KHALF];                                                            \
        for (size_t b = 0; b < n; b += PT_KHALF) {                                                 \
            size_t m = n - b < PT_KHALF ? n - b : PT_KHALF;                                        \
            IN(acc, (const pt_u16m_t *)srcs[0] + b, m);                                            \
            for (int k = 1; k < nsrc; k++) {                                                       \
                IN(t, (const pt_u16m_t *)srcs[k] + b, m);                                          \
                NAME##_acc(acc, t, m);                                                             \
            }                                                                                      \
            for (size_t i = 0; i < m; i++)                                                         \
                acc[i] = pt_k_canon_f32(acc[i]);                                                   \
            OUT((pt_u16m_t *)dst + b, acc, m);                                                     \
        }                                                                                          \
    }

/* ---- pt_reduce_all for floats: lanes and a pairwise cascade ----
 *
 * A leaf of 16 * L elements is reduced in L independent lanes (L = 128 bytes of accumulators:
 * 32 float32 or 16 float64, i.e. several vector registers, so the adds do not wait on each
 * other); leaves are combined pairwise by a binary-counter cascade, lane by lane, and the
 * lanes pairwise at the end. Rounding error grows like numpy's pairwise sum: O(16 + log n). */
#define PT_KLANES(ACC) (128 / sizeof(ACC))
#define PT_KLEAF(ACC) (16 * PT_KLANES(ACC))

#define PT_KDEF_LEAF(NAME, ACC, M, OP, IDENT)                                                      \
    static void NAME(ACC *restrict part, const M *restrict x, size_t n)                            \
    {                                                                                              \
        ACC acc[PT_KLANES(ACC)];                                                                   \
        for (size_t l = 0; l < PT_KLANES(ACC); l++)                                                \
            acc[l] = IDENT;                                                                        \
        size_t i = 0;                                                                              \
        for (; i + PT_KLANES(ACC) <= n; i += PT_KLANES(ACC))                                       \
            for (size_t l = 0; l < PT_KLANES(ACC); l++)                                            \
                acc[l] = OP(acc[l], x[i + l]);                                                     \
        for (size_t l = 0; i + l < n; l++)                                                         \
            acc[l] = OP(acc[l], x[i + l]);                                                         \
        memcpy(part, acc, sizeof acc);                                                             \
    }

/* LEAF(part, src, first, m) reduces elements [first, first + m) of src into part's lanes. */
#define PT_KDEF_ALL_FLOAT(NAME, ACC, LEAF, OP, IDENT)                                              \
    static void NAME(const void *src, size_t n, void *out)                                         \
    {                                                                                              \
        ACC stack[64][PT_KLANES(ACC)], part[PT_KLANES(ACC)];                                       \
        int top = 0;                                                                               \
        size_t leaf = 0;                                                                           \
        for (size_t b = 0; b < n; b += PT_KLEAF(ACC), leaf++) {                                    \
            LEAF(part, src, b, n - b < PT_KLEAF(ACC) ? n - b : PT_KLEAF(ACC));                     \
            for (size_t c = leaf; c & 1; c >>= 1) {                                                \
                top--;                                                                             \
                for (size_t l = 0; l < PT_KLANES(ACC); l++)                                        \
                    part[l] = OP(stack[top][l], part[l]);                                          \
            }                                                                                      \
            memcpy(stack[top++], part, sizeof part);                                               \
        }                                                                                          \
        for (size_t l = 0; l < PT_KLANES(ACC); l++)                                                \
            part[l] = top ? stack[top - 1][l] : IDENT;                                             \
        for (int t = top - 2; t >= 0; t--)                                                         \
            for (size_t l = 0; l < PT_KLANES(ACC); l++)                                            \
                part[l] = OP(stack[t][l], part[l]);                                                \
        for (size_t w = PT_KLANES(ACC) / 2; w > 0; w /= 2)                                         \
            for (size_t l = 0; l < w; l++)                                                         \
                part[l] = OP(part[l], part[l + w]);                                                \
        part[0] = PT_KCANON(part[0]);                                                              \
        memcpy(out, &part[0], sizeof(ACC));                                                        \
    }

/* Leaves straight from caller memory (float32, float64) and through a widened block (the
 * 16-bit floats). */
#define PT_KDEF_FLOAT_OP(OPNAME, OP, IDENT32, IDENT64)                                             \
    PT_KDEF_LEAF(pt_k_leaf_##OPNAME##_f32, float, pt_f32m_t, OP, IDENT32)                          \
    PT_KDEF_LEAF(pt_k_leaf_##OPNAME##_f64, double, pt_f64m_t, OP, IDENT64)                         \
    static void pt_k_lf_##OPNAME##_f32(float *part, const void *src, size_t first, size_t m)       \
    {                                                                                              \
        pt_k_leaf_##OPNAME##_f32(part, (const pt_f32m_t *)src + first, m);                         \
    }                                                                                              \
    static void pt_k_lf_##OPNAME##_f64(double *part, const void *src, size_t first, size_t m)      \
    {                                                                                              \
        pt_k_leaf_##OPNAME##_f64(part, (const pt_f64m_t *)src + first, m);                         \
    }                                                                                              \
    static void pt_k_lf_##OPNAME##_f16(float *part, const void *src, size_t first, size_t m)       \
    {                                                                                              \
        _Alignas(64) float buf[PT_KLEAF(float)];                                                   \
        pt_k_f16_in(buf, (const pt_u16m_t *)src + first, m);                                       \
        pt_k_leaf_##OPNAME##_f32(part, buf, m);                                                    \
    }                                                                                              \
    static void pt_k_lf_##OPNAME##_bf16(float *part, const void *src, size_t first, size_t m)      \
    {                                                                                              \
        _Alignas(64) float buf[PT_KLEAF(float)];                                                   \
        pt_k_bf16_in(buf, (const pt_u16m_t *)src + first, m);                                      \
        pt_k_leaf_##OPNAME##_f32(part, buf, m);                                                    \
    }                                                                                              \
    PT_KDEF_ALL_FLOAT(pt_k_all_##OPNAME##_f32, float, pt_k_lf_##OPNAME##_f32, OP, IDENT32)         \
    PT_KDEF_ALL_FLOAT(pt_k_all_##OPNAME##_f64, double, pt_k_lf_##OPNAME##_f64, OP, IDENT64)        \
    PT_KDEF_ALL_FLOAT(pt_k_all_##OPNAME##_f16, float, pt_k_lf_##OPNAME##_f16, OP, IDENT32)         \
    PT_KDEF_ALL_FLOAT(pt_k_all_##OPNAME##_bf16, float, pt_k_lf_##OPNAME##_bf16, OP, IDENT32)       \
    static inline float pt_k_##OPNAME##_c32(float a, float b)                                      \
    {                                                                                              \
        return pt_k_canon_f32(OP(a, b));                                                           \
    }                                                                                              \
    static inline double pt_k_##OPNAME##_c64(double a, double b)                                   \
    {                                                                                              \
        return pt_k_canon_f64(OP(a, b));                                                           \
    }                                                                                              \
    PT_KDEF_REDUCE(pt_k_reduce_##OPNAME##_f32, pt_f32m_t, pt_k_##OPNAME##_c32)                     \
    PT_KDEF_REDUCE(pt_k_reduce_##OPNAME##_f64, pt_f64m_t, pt_k_##OPNAME##_c64)                     \
    PT_KDEF_REDUCE_HALF(pt_k_reduce_##OPNAME##_f16, pt_k_f16_in, pt_k_f16_out, OP)                 \
    PT_KDEF_REDUCE_HALF(pt_k_reduce_##OPNAME##_bf16, pt_k_bf16_in, pt_k_bf16_out, OP)

PT_KDEF_FLOAT_OP(sum, PT_KSUM, 0.0f, 0.0)
PT_KDEF_FLOAT_OP(prod, PT_KPROD, 1.0f, 1.0)
PT_KDEF_FLOAT_OP(min, PT_KFMIN, __builtin_inff(), __builtin_inf())
PT_KDEF_FLOAT_OP(max, PT_KFMAX, -__builtin_inff(), -__builtin_inf())

/* ---- integers ----
 *
 * Sums and products are done in unsigned arithmetic of at least int's width (no signed
 * overflow, no promotion of uint16 to a signed int that could overflow in a product) and
 * wrap modulo 2^bits as numpy's do. reduce_all accumulates in 64 bits (int64 for signed,
 * uint64 for unsigned, numpy's default), sign-extending signed elements. */
#define PT_KDEF_INT(SFX, T, UT, WT, ACC)                                                           \
    static inline T pt_k_sum_##SFX(T a, T b)                                                       \
    {                                                                                              \
        return (T)(UT)((WT)(UT)a + (WT)(UT)b);                                                     \
    }                                                                                              \
    static inline T pt_k_prod_##SFX(T a, T b)                                                      \
    {                                                                                              \
        return (T)(UT)((WT)(UT)a * (WT)(UT)b);                                                     \
    }                                                                                              \
    PT_KDEF_REDUCE(pt_k_reduce_sum_##SFX, pt_##SFX##m_t, pt_k_sum_##SFX)                           \
    PT_KDEF_REDUCE(pt_k_reduce_prod_##SFX, pt_##SFX##m_t, pt_k_prod_##SFX)                         \
    PT_KDEF_REDUCE(pt_k_reduce_min_##SFX, pt_##SFX##m_t, PT_KIMIN)                                 \
    PT_KDEF_REDUCE(pt_k_reduce_max_##SFX, pt_##SFX##m_t, PT_KIMAX)                                 \
    static void pt_k_all_sum_##SFX(const void *src, size_t n, void *out)                           \
    {                                                                                              \
        const pt_##SFX##m_t *restrict x = src;                                                     \
        uint64_t s = 0;                                                                            \
        for (size_t i = 0; i < n; i++)                                                             \
            s += (uint64_t)(ACC)x[i];                                                              \
        memcpy(out, &s, 8);                                                                        \
    }                                                                                              \
    static void pt_k_all_prod_##SFX(const void *src, size_t n, void *out)                          \
    {                                                                                              \
        const pt_##SFX##m_t *restrict x = src;                                                     \
        uint64_t p = 1;                                                                            \
        for (size_t i = 0; i < n; i++)                                                             \
            p *= (uint64_t)(ACC)x[i];                                                              \
        memcpy(out, &p, 8);                                                                        \
    }                                                                                              \
    static void pt_k_all_min_##SFX(const void *src, size_t n, void *out)                           \
    {                                                                                              \
        const pt_##SFX##m_t *restrict x = src;                                                     \
        T m = x[0];                                                                                \
        for (size_t i = 1; i < n; i++)                                                             \
            m = PT_KIMIN(x[i], m);                                                                 \
        ACC v = m;                                                                                 \
        memcpy(out, &v, 8);                                                                        \
    }                                                                                              \
    static void pt_k_all_max_##SFX(const void *src, size_t n, void *out)                           \
    {                                                                                              \
        const pt_##SFX##m_t *restrict x = src;                                                     \
        T m = x[0];                                                                                \
        for (size_t i = 1; i < n; i++)                                                             \
            m = PT_KIMAX(x[i], m);                                                                 \
        ACC v = m;                                                                                 \
        memcpy(out, &v, 8);                                                                        \
    }

PT_KDEF_INT(i8, int8_t, uint8_t, unsigned, int64_t)
PT_KDEF_INT(i16, int16_t, uint16_t, unsigned, int64_t)
PT_KDEF_INT(i32, int32_t, uint32_t, uint32_t, int64_t)
PT_KDEF_INT(i64, int64_t, uint64_t, uint64_t, int64_t)
PT_KDEF_INT(u8, uint8_t, uint8_t, unsigned, uint64_t)
PT_KDEF_INT(u16, uint16_t, uint16_t, unsigned, uint64_t)
PT_KDEF_INT(u32, uint32_t, uint32_t, uint32_t, uint64_t)
PT_KDEF_INT(u64, uint64_t, uint64_t, uint64_t, uint64_t)

/* ---- the table ---- */

#define PT_KROW(PFX, OP)                                                                           \
    {                                                                                              \
        [PT_I8] = PFX##OP##_i8, [PT_I16] = PFX##OP##_i16, [PT_I32] = PFX##OP##_i32,                \
        [PT_I64] = PFX##OP##_i64, [PT_U8] = PFX##OP##_u8, [PT_U16] = PFX##OP##_u16,                \
        [PT_U32] = PFX##OP##_u32, [PT_U64] = PFX##OP##_u64, [PT_F16] = PFX##OP##_f16,              \
        [PT_BF16] = PFX##OP##_bf16, [PT_F32] = PFX##OP##_f32, [PT_F64] = PFX##OP##_f64,            \
    }

const pt_kernels_t PT_KNAME = {
    .name = PT_KISA,
    .reduce =
        {
            [PT_SUM] = PT_KROW(pt_k_reduce_, sum),
            [PT_PROD] = PT_KROW(pt_k_reduce_, prod),
            [PT_MIN] = PT_KROW(pt_k_reduce_, min),
            [PT_MAX] = PT_KROW(pt_k_reduce_, max),
        },
    .reduce_all =
        {
            [PT_SUM] = PT_KROW(pt_k_all_, sum),
            [PT_PROD] = PT_KROW(pt_k_all_, prod),
            [PT_MIN] = PT_KROW(pt_k_all_, min),
            [PT_MAX] = PT_KROW(pt_k_all_, max),
        },
};
