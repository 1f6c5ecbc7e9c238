/* kernels_check: every kernel of native/src/kernels through every instruction-set variant this
 * CPU runs, against the scalar variant, bit for bit; and one digest line per case, so that the
 * output of one machine can be compared with another's (x86-64 natively, aarch64 under qemu).
 *
 * Build (from the repository root; the harness needs native/ only):
 *     cc -std=gnu11 -O3 -Inative/include -Inative/src native/tests/kernels_check.c \
 *        native/src/kernels/kernels*.c -o kernels_check
 * Output on stdout, one line per case, in the same order on every machine:
 *     <case> <digest> <nan-digest>
 * <digest> is a 64-bit FNV-1a style hash of the result bytes (and status); <nan-digest> the
 * same after every NaN in a floating result is replaced by one NaN: the digest "NaN payloads
 * aside", which tells a difference in NaN bits from any other. The last line starts with
 * "# summary". Mismatches between variants go to stderr as
 *     MISMATCH <case> <variant> <exact|nan-payload>
 * With --quick, fewer cases (fewer lengths, the long ones in fewer layouts): seconds under qemu.
 * Cumulative CPU time per section goes to stderr as "# cpu seconds after ...".
 * Exit status: 0 when every variant agreed with scalar bit for bit (NaNs included), 1 when
 * any differed, 2 on a harness error. Inputs come from a fixed generator: the same everywhere.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels_internal.h"
#include "pt.h"

void pt__copy_stream(void *dst, const void *src, size_t len); /* kernels.c, internal */

/* ---- variants this CPU runs (kernels.c's own test is static; this mirrors it) ---- */

typedef struct {
    const char *name;
    const pt_kernels_t *k; /* NULL: the public entry points (dispatched) */
} variant_t;

static variant_t variants[8];
static int nvariants;

static void find_variants(void)
{
    variants[nvariants++] = (variant_t){"scalar", &pt_kernels_scalar};
#if defined(__x86_64__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2");
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    avx2 = avx2 && (c & (1u << 29)); /* F16C */
    if (avx2)
        variants[nvariants++] = (variant_t){"avx2", &pt_kernels_avx2};
    if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        variants[nvariants++] = (variant_t){"avx512", &pt_kernels_avx512};
#endif
#if defined(__aarch64__)
    variants[nvariants++] = (variant_t){"neon", &pt_kernels_neon};
#endif
    variants[nvariants++] = (variant_t){"dispatch", NULL};
}

/* ---- deterministic inputs ---- */

static uint64_t rng_state;

static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void seed(const char *name)
{
    uint64_t h = 1469598103934665603ull;
    for (; *name; name++)
        h = (h ^ (unsigned char)*name) * 1099511628211ull;
    rng_state = h;
}

static const char *const dt_names[PT_NDTYPES] = {"i8",  "i16", "i32", "i64", "u8",   "u16",
                                                 "u32", "u64", "f16", "bf16", "f32", "f64"};
static const char *const op_names[PT_NOPS] = {"sum", "prod", "min", "max"};

static int is_float(pt_dtype_t dt)
{
    return dt >= PT_F16;
}

/* Layout of a float format: exponent bits, mantissa bits. */
static void fmt(pt_dtype_t dt, int *ebits, int *mbits)
{
    switch (dt) {
    case PT_F16: *ebits = 5, *mbits = 10; break;
    case PT_BF16: *ebits = 8, *mbits = 7; break;
    case PT_F32: *ebits = 8, *mbits = 23; break;
    default: *ebits = 11, *mbits = 52; break;
    }
}

static uint64_t fbits(pt_dtype_t dt, int sign, int exp, uint64_t mant)
{
    int e, m;
    fmt(dt, &e, &m);
    return ((uint64_t)sign << (e + m)) | ((uint64_t)exp << m) | (mant & ((1ull << m) - 1));
}

/* A special value of the format: NaNs (quiet, negative, signalling with payload), infinities,
 * zeros, subnormals, the extremes, and values near 1 whose sums tie when rounded. */
static uint64_t special(pt_dtype_t dt)
{
    int e, m;
    fmt(dt, &e, &m);
    int emax = (1 << e) - 1, bias = emax / 2;
    /* one draw each, in this order: argument evaluation order differs between compilers */
    uint64_t which = rnd() % 14, r1 = rnd(), r2 = rnd(), r3 = rnd();
    int sign = (int)(r1 & 1);
    switch (which) {
    case 0: return fbits(dt, 0, emax, 1ull << (m - 1));          /* qNaN */
    case 1: return fbits(dt, 1, emax, 1ull << (m - 1));          /* -qNaN */
    case 2: return fbits(dt, sign, emax, 1 + r2 % ((1ull << (m - 1)) - 1)); /* sNaN */
    case 3: return fbits(dt, 0, emax, 0);                        /* inf */
    case 4: return fbits(dt, 1, emax, 0);                        /* -inf */
    case 5: return fbits(dt, 0, 0, 0);                           /* 0 */
    case 6: return fbits(dt, 1, 0, 0);                           /* -0 */
    case 7: return fbits(dt, sign, 0, 1);                        /* smallest subnormal */
    case 8: return fbits(dt, sign, 0, r2);                       /* subnormal */
    case 9: return fbits(dt, sign, 1, 0);                        /* smallest normal */
    case 10: return fbits(dt, sign, emax - 1, ~0ull);            /* largest finite */
    case 11: return fbits(dt, sign, bias, 1);                    /* 1 + ulp */
    case 12: return fbits(dt, sign, bias - m - 1, 0);            /* half an ulp of 1 */
    default: return fbits(dt, sign, bias + (int)(r2 % 3) - 1, r3);
    }
}

enum { K_NORM, K_NEAR1, K_SPECIAL, K_BITS, K_NKINDS };
static const char *const kind_names[K_NKINDS] = {"norm", "near1", "special", "bits"};

/* One element of dtype dt, kind k, as its bits. Integers: norm and bits are random bits (sums
 * and products wrap), near1 is -3..3 (products stay nonzero a while), special the extremes. */
static uint64_t element(pt_dtype_t dt, int k)
{
    uint64_t r = rnd();
    if (!is_float(dt)) {
        static const uint64_t ext[] = {0, 1, ~0ull, 0x7f, 0x80, 0x7fff, 0x8000, 0x7fffffff,
                                       0x80000000, 0x7fffffffffffffff, 0x8000000000000000};
        if (k == K_NEAR1)
            return (uint64_t)((int64_t)(r % 7) - 3);
        if (k == K_SPECIAL && r % 3 == 0)
            return ext[(r >> 8) % (sizeof ext / sizeof ext[0])];
        return rnd();
    }
    int e, m;
    fmt(dt, &e, &m);
    int bias = (1 << (e - 1)) - 1;
    switch (k) {
    case K_NORM: return fbits(dt, r & 1, bias - 2 + (int)((r >> 1) % 4), rnd());
    case K_NEAR1: /* 0.9375, or 1 and a little: products stay finite a while */
        return fbits(dt, 0, bias - (int)(r & 1), (r & 1) ? ~0ull << (m - 3) : rnd() >> 40);
    case K_SPECIAL:
        if (r % 4 == 0)
            return special(dt);
        return fbits(dt, r & 1, bias - 1 + (int)((r >> 1) % 3), rnd());
    default: return r;
    }
}

/* Inputs are slices of one pool per dtype and kind, generated once (generating every case's
 * own would take most of the run under qemu); each case starts at its own place in it. */
#define POOL 131072
static unsigned char *pools[PT_NDTYPES][K_NKINDS];

static void *xmalloc(size_t n);

static void fill(pt_dtype_t dt, int k, unsigned char *p, size_t n)
{
    size_t sz = pt_dtype_size(dt);
    if (!pools[dt][k]) {
        uint64_t saved = rng_state;
        rng_state = 0x243f6a8885a308d3ull * (uint64_t)(dt * K_NKINDS + k + 1);
        pools[dt][k] = xmalloc(POOL * sz);
        for (size_t i = 0; i < POOL; i++) {
            uint64_t v = element(dt, k);
            memcpy(pools[dt][k] + i * sz, &v, sz); /* little-endian on both targets */
        }
        rng_state = saved;
    }
    for (size_t done = 0; done < n;) {
        size_t at = rnd() % POOL, m = POOL - at < n - done ? POOL - at : n - done;
        memcpy(p + done * sz, pools[dt][k] + at * sz, m * sz);
        done += m;
    }
}

/* ---- digests ---- */

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) { /* FNV-1a over 8-byte words (little-endian on both) */
        uint64_t w;
        memcpy(&w, c + i, 8);
        h = (h ^ w) * 1099511628211ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

/* The same bytes with every NaN of format dt (elements of esize bytes) made one NaN. */
static void canon(pt_dtype_t dt, size_t esize, unsigned char *p, size_t n)
{
    if (!is_float(dt))
        return;
    pt_dtype_t f = esize == 8 ? PT_F64 : esize == 4 ? PT_F32 : dt;
    int e, m;
    fmt(f, &e, &m);
    uint64_t expmask = ((1ull << e) - 1) << m, mmask = (1ull << m) - 1;
    uint64_t nan = fbits(f, 0, (1 << e) - 1, 1ull << (m - 1));
    for (size_t i = 0; i < n; i++) {
        uint64_t v = 0;
        memcpy(&v, p + i * esize, esize);
        if ((v & expmask) == expmask && (v & mmask))
            memcpy(p + i * esize, &nan, esize);
    }
}

static long ncases, nexact, npayload;
static char case_name[160];

static void emit(uint64_t h, uint64_t hc)
{
    printf("%s %016llx %016llx\n", case_name, (unsigned long long)h, (unsigned long long)hc);
    ncases++;
}

/* Compare a variant's result (res, len bytes, status st) with the reference's; the result
 * proper, nres elements of esize bytes, starts roff bytes in. */
static void compare(const char *vname, const unsigned char *ref, const unsigned char *res,
                    size_t len, size_t roff, size_t nres, int rst, int st, pt_dtype_t dt,
                    size_t esize, unsigned char *tmp)
{
    if (rst == st && memcmp(ref, res, len) == 0)
        return;
    int payload = 0;
    if (rst == st) {
        memcpy(tmp, ref, len);
        memcpy(tmp + len, res, len);
        canon(dt, esize, tmp + roff, nres);
        canon(dt, esize, tmp + len + roff, nres);
        payload = memcmp(tmp, tmp + len, len) == 0;
    }
    fprintf(stderr, "MISMATCH %s %s %s\n", case_name, vname, payload ? "nan-payload" : "exact");
    if (payload)
        npayload++;
    else
        nexact++;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "kernels_check: out of memory\n");
        exit(2);
    }
    return p;
}

/* ---- pt_reduce ---- */

#define GUARD 64

/* mode: how dst relates to the sources. 0: its own buffer; 1: dst is srcs[0]; 2: dst is a
 * later source (srcs[nsrc / 2]). */
static void check_reduce(pt_op_t op, pt_dtype_t dt, size_t n, int nsrc, int mode, size_t off,
                         int kind)
{
    snprintf(case_name, sizeof case_name, "reduce %s %s n=%zu nsrc=%d alias=%d off=%zu %s",
             op_names[op], dt_names[dt], n, nsrc, mode, off, kind_names[kind]);
    seed(case_name);
    size_t sz = pt_dtype_size(dt), bytes = n * sz, span = bytes + 2 * GUARD + off;
    unsigned char *in = xmalloc(span * nsrc), *work = xmalloc(span * (nsrc + 1));
    unsigned char *ref = xmalloc(span), *tmp = xmalloc(2 * span + 16);
    memset(in, 0x5a, span * nsrc);
    for (int s = 0; s < nsrc; s++)
        fill(dt, kind, in + s * span + GUARD + off + (size_t)s % 3, n);
    int rst = 0, first = 1;
    size_t roff = 0;
    for (int v = 0; v < nvariants; v++) {
        if (variants[v].k && (n == 0 || nsrc < 2))
            continue; /* the tables' preconditions: kernels.c answers these itself */
        memcpy(work, in, span * nsrc);
        memset(work + span * nsrc, 0xa5, span);
        const void *srcs[8];
        for (int s = 0; s < nsrc; s++)
            srcs[s] = work + s * span + GUARD + off + (size_t)s % 3;
        int di = mode == 0 ? nsrc : mode == 1 ? 0 : nsrc / 2;
        roff = GUARD + off + (mode ? (size_t)di % 3 : 0);
        unsigned char *dbuf = work + di * span;
        void *dst = mode == 0 ? dbuf + GUARD + off : (void *)srcs[di];
        int st = 0;
        if (variants[v].k)
            variants[v].k->reduce[op][dt](dst, srcs, nsrc, n);
        else
            st = pt_reduce(op, dt, dst, srcs, nsrc, n);
        /* the whole buffer around dst: the guard bytes must not change either */
        if (first) {
            memcpy(ref, dbuf, span);
            rst = st;
            first = 0;
        } else {
            compare(variants[v].name, ref, dbuf, span, roff, n, rst, st, dt, sz, tmp);
        }
    }
    uint64_t h = fnv(fnv(1469598103934665603ull, &rst, sizeof rst), ref, span);
    canon(dt, sz, ref + roff, n);
    emit(h, fnv(fnv(1469598103934665603ull, &rst, sizeof rst), ref, span));
    free(in), free(work), free(ref), free(tmp);
}

/* ---- pt_reduce_all ---- */

static void check_reduce_all(pt_op_t op, pt_dtype_t dt, size_t n, size_t off, int kind)
{
    snprintf(case_name, sizeof case_name, "reduce_all %s %s n=%zu off=%zu %s", op_names[op],
             dt_names[dt], n, off, kind_names[kind]);
    seed(case_name);
    size_t sz = pt_dtype_size(dt);
    unsigned char *in = xmalloc(n * sz + off + 16), tmp[32];
    fill(dt, kind, in + off, n);
    size_t esize = dt == PT_F64 || !is_float(dt) ? 8 : 4;
    unsigned char ref[16], out[16];
    int rst = 0, first = 1;
    for (int v = 0; v < nvariants; v++) {
        if (variants[v].k && n == 0 && (op == PT_MIN || op == PT_MAX))
            continue;
        memset(out, 0xa5, sizeof out);
        int st = 0;
        if (variants[v].k)
            variants[v].k->reduce_all[op][dt](in + off, n, out);
        else
            st = pt_reduce_all(op, dt, in + off, n, out);
        if (first) {
            memcpy(ref, out, sizeof ref);
            rst = st;
            first = 0;
        } else {
            compare(variants[v].name, ref, out, sizeof out, 0, 1, rst, st, dt, esize, tmp);
        }
    }
    uint64_t h = fnv(fnv(1469598103934665603ull, &rst, sizeof rst), ref, sizeof ref);
    canon(dt, esize, ref, 1);
    emit(h, fnv(fnv(1469598103934665603ull, &rst, sizeof rst), ref, sizeof ref));
    free(in);
}

/* ---- copy ---- */

/* len bytes from src offset so to dst offset do of one buffer (they overlap when close). */
static void check_copy(size_t len, size_t so, size_t dofs, int stream)
{
    snprintf(case_name, sizeof case_name, "copy%s n=%zu src=%zu dst=%zu",
             stream ? "_stream" : "", len, so, dofs);
    seed(case_name);
    size_t span = len + (so > dofs ? so : dofs) + GUARD;
    unsigned char *buf = xmalloc(span), *ref = xmalloc(span), *orig = xmalloc(span);
    for (size_t i = 0; i < span; i++)
        orig[i] = (unsigned char)rnd();
    memcpy(buf, orig, span);
    memcpy(ref, orig, span);
    for (size_t i = 0; i < len; i++) /* the reference: memmove by hand, through a copy */
        ref[dofs + i] = orig[so + i];
    if (stream)
        pt__copy_stream(buf + dofs, buf + so, len);
    else
        pt_copy(buf + dofs, buf + so, len);
    if (memcmp(buf, ref, span) != 0) {
        fprintf(stderr, "MISMATCH %s memmove exact\n", case_name);
        nexact++;
    }
    uint64_t h = fnv(1469598103934665603ull, buf, span);
    emit(h, h);
    free(buf), free(ref), free(orig);
}

/* ---- gather / scatter ---- */

/* A layout over a base buffer: element [0..] at byte offset `start`, strides in bytes. The
 * reference walks it with an index vector in C order. */
static void check_strided(const char *label, int ndim, const int64_t *shape,
                          const int64_t *strides, size_t itemsize, size_t start, size_t base)
{
    for (int scatter = 0; scatter < 2; scatter++) {
        snprintf(case_name, sizeof case_name, "%s %s item=%zu", scatter ? "scatter" : "gather",
                 label, itemsize);
        seed(case_name);
        size_t items = 1;
        for (int d = 0; d < ndim; d++)
            items *= (size_t)shape[d];
        size_t cbytes = items * itemsize + GUARD;
        unsigned char *strided = xmalloc(base), *contig = xmalloc(cbytes);
        unsigned char *rs = xmalloc(base), *rc = xmalloc(cbytes);
        for (size_t i = 0; i < base; i++)
            strided[i] = (unsigned char)rnd();
        for (size_t i = 0; i < cbytes; i++)
            contig[i] = (unsigned char)rnd();
        memcpy(rs, strided, base);
        memcpy(rc, contig, cbytes);
        int64_t idx[8] = {0};
        for (size_t e = 0; e < items; e++) {
            int64_t at = (int64_t)start;
            for (int d = 0; d < ndim; d++)
                at += idx[d] * strides[d];
            if (scatter)
                memcpy(rs + at, rc + e * itemsize, itemsize);
            else
                memcpy(rc + e * itemsize, rs + at, itemsize);
            for (int d = ndim - 1; d >= 0 && ++idx[d] == shape[d]; d--)
                idx[d] = 0;
        }
        int st = scatter ? pt_scatter(strided + start, contig, ndim, shape, strides, itemsize)
                         : pt_gather(contig, strided + start, ndim, shape, strides, itemsize);
        if (st != PT_OK || memcmp(strided, rs, base) || memcmp(contig, rc, cbytes)) {
            fprintf(stderr, "MISMATCH %s reference exact\n", case_name);
            nexact++;
        }
        uint64_t h = fnv(fnv(fnv(1469598103934665603ull, &st, sizeof st), strided, base),
                         contig, cbytes);
        emit(h, h);
        free(strided), free(contig), free(rs), free(rc);
    }
}

static void strided_cases(void)
{
    static const size_t items[] = {1, 2, 3, 4, 8, 16};
    for (size_t k = 0; k < sizeof items / sizeof items[0]; k++) {
        int64_t s = (int64_t)items[k];
        /* 1-d: every other element; reversed; a zero stride (broadcast, gather only makes sense
         * for that, scatter writes the last one) */
        int64_t sh1[] = {37}, st_a[] = {2 * s}, st_b[] = {-s}, st_c[] = {0};
        check_strided("1d-step2", 1, sh1, st_a, items[k], 0, 80 * items[k]);
        check_strided("1d-reversed", 1, sh1, st_b, items[k], 36 * items[k], 40 * items[k]);
        check_strided("1d-zero", 1, sh1, st_c, items[k], 5, 40 * items[k]);
        /* 2-d: rows of a 9x13 array, columns 2..11 (contiguous rows); its transpose */
        int64_t sh2[] = {9, 10}, st2[] = {13 * s, s}, sh2t[] = {10, 9}, st2t[] = {s, 13 * s};
        check_strided("2d-slice", 2, sh2, st2, items[k], 2 * items[k], 9 * 13 * items[k]);
        check_strided("2d-transposed", 2, sh2t, st2t, items[k], 2 * items[k], 9 * 13 * items[k]);
        /* 3-d: [::2, 1:, ::-3] of a 6x5x10 array, unaligned start; contiguous 3-d; 0-d */
        int64_t sh3[] = {3, 4, 4}, st3[] = {100 * s, 10 * s, -3 * s};
        check_strided("3d-mixed", 3, sh3, st3, items[k], 1 + 19 * items[k], 1 + 600 * items[k]);
        int64_t sh3c[] = {2, 3, 5}, st3c[] = {15 * s, 5 * s, s};
        check_strided("3d-contiguous", 3, sh3c, st3c, items[k], 3, 3 + 30 * items[k]);
        check_strided("0d", 0, NULL, NULL, items[k], 7, 8 + items[k]);
        int64_t sh0[] = {4, 0}, st0[] = {s, s};
        check_strided("empty", 2, sh0, st0, items[k], 0, 8 * items[k]);
    }
}

/* ---- the cases ---- */

static const size_t lengths[] = {0,   1,   2,   3,   5,    7,    8,    9,    15,   16,  17,
                                 31,  32,  33,  63,  64,   65,   127,  128,  129,  255, 256,
                                 257, 511, 513, 1023, 1024, 1025, 2049, 4095, 4097, 8193};
#define NLEN (sizeof lengths / sizeof lengths[0])

/* --quick keeps these: the vector widths' neighbourhoods and one length past each block */
static int quick_length(size_t n)
{
    return n != 5 && n != 256 && n != 511 && n != 1023 && n != 1024 && n != 2049 && n != 4095;
}

int main(int argc, char **argv)
{
    int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
    find_variants();
    for (int op = 0; op < PT_NOPS; op++)
        for (int dt = 0; dt < PT_NDTYPES; dt++)
            for (size_t li = 0; li < NLEN; li++) {
                size_t n = lengths[li];
                for (int kind = 0; kind < K_NKINDS; kind++) {
                    if (kind == K_NEAR1 && op != PT_PROD)
                        continue;
                    /* --quick: the long lengths in two modes only (unaligned; aliased
                     * with several sources, which crosses blocks) */
                    if (quick && !quick_length(n))
                        continue;
                    int all = !quick || n < 2000;
                    if (all)
                        check_reduce(op, dt, n, 2, 0, 0, kind);
                    check_reduce(op, dt, n, 2, 0, 1, kind);
                    if (all)
                        check_reduce(op, dt, n, 3, 1, 1, kind);
                    check_reduce(op, dt, n, 5, 2, 0, kind);
                    if (all)
                        check_reduce(op, dt, n, 1, 0, 3, kind);
                }
            }
    fprintf(stderr, "# cpu seconds after reduce: %.2f\n", (double)clock() / CLOCKS_PER_SEC);
    /* reduce_all: the lengths above plus many leaves (f32 leaves are 512, f64 256 elements) */
    static const size_t more[] = {100003, 16 * 512 + 511};
    for (int op = 0; op < PT_NOPS; op++)
        for (int dt = 0; dt < PT_NDTYPES; dt++)
            for (size_t li = 0; li < NLEN + 2; li++) {
                size_t n = li < NLEN ? lengths[li] : more[li - NLEN];
                if (li >= NLEN && !is_float(dt))
                    continue; /* only the float sums have leaves and a cascade */
                if (quick && !quick_length(n))
                    continue;
                if (quick && n == 100003)
                    n = 40009;
                for (int kind = 0; kind < K_NKINDS; kind++) {
                    if (kind == K_NEAR1 && op != PT_PROD)
                        continue;
                    if (!quick || n < 2000 || (n > 10000 && op == PT_SUM))
                        check_reduce_all(op, dt, n, 0, kind);
                    check_reduce_all(op, dt, n, 3, kind);
                }
            }
    fprintf(stderr, "# cpu seconds after reduce_all: %.2f\n", (double)clock() / CLOCKS_PER_SEC);
    static const size_t clen[] = {0, 1, 7, 31, 32, 33, 127, 128, 129, 2047, 2048, 2049,
                                  4095, 4096, 4097, 65539, (1u << 20) + 5};
    for (size_t i = 0; i < sizeof clen / sizeof clen[0]; i++)
        for (int stream = 0; stream < 2; stream++) {
            check_copy(clen[i], 0, 64 + 3, stream);   /* apart: src before dst */
            check_copy(clen[i], clen[i] + 5, 1, stream);
            check_copy(clen[i], 0, 17, stream);       /* overlapping, forward */
            check_copy(clen[i], 33, 0, stream);       /* overlapping, backward */
        }
    fprintf(stderr, "# cpu seconds after copy: %.2f\n", (double)clock() / CLOCKS_PER_SEC);
    strided_cases();
    printf("# summary isa=%s variants=", pt_kernels_isa());
    for (int v = 0; v < nvariants; v++)
        printf("%s%s", v ? "," : "", variants[v].name);
    printf(" cases=%ld mismatches=%ld nan-payload-only=%ld\n", ncases, nexact, npayload);
    return nexact || npayload ? 1 : 0;
}
