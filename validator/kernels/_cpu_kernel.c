/* One-pass comparison kernel for validator.kernels.cpu (see docs/performance.md).
 *
 * vk_compare() reads n elements of a and b once and adds into *acc (float64 sums, int64 counts)
 * and, when ULP metrics apply, into exact int64 histograms of the ULP distances. The caller
 * (validator/kernels/cpu.py) runs it on disjoint chunks from several threads, each with its own
 * accumulator and histograms, and combines them. Built at first use with -ffp-contract=off, so
 * that the tolerance test atol + rtol*|a| rounds exactly as the float64 reference does; the sums
 * use explicit fma() (single rounding per term; the order of float64 summation is free anyway).
 *
 * Blocks are first read without any masking (the common case: everything finite); a block whose
 * sums come out non-finite is read again with the reference semantics for NaN/Inf (docs/metrics.md,
 * "Which elements count"). force_masked = 1 masks every block (used by the tests).
 */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__) && \
    !defined(VK_NO_AVX512)
#include <immintrin.h>
#define VK_AVX512 1
#endif

enum { DT_F64 = 0, DT_F32 = 1, DT_F16 = 2, DT_BF16 = 3, DT_E4M3 = 4, DT_E5M2 = 5 };

typedef struct {
    double s_aa, s_bb, s_ab, s_dd, s_ad, max_ad;
    int64_t n_both, n_pass, nf_a, nf_b, mismatch, max_ulp;
} vk_acc;

/* a block's totals into the thread's accumulator */
static inline void acc_add(vk_acc *acc, double saa, double sbb, double sab, double sdd, double sad, double mad,
                           int64_t nboth, int64_t npass, int64_t nfa, int64_t nfb, int64_t mism) {
    acc->s_aa += saa;
    acc->s_bb += sbb;
    acc->s_ab += sab;
    acc->s_dd += sdd;
    acc->s_ad += sad;
    acc->max_ad = mad > acc->max_ad ? mad : acc->max_ad;
    acc->n_both += nboth;
    acc->n_pass += npass;
    acc->nf_a += nfa;
    acc->nf_b += nfb;
    acc->mismatch += mism;
}

#define FINE 65536 /* bins 0..65535 exact; bin 65536 counts every larger distance */
#define BLK 2048

static double T_E4M3[256], T_E5M2[256];

void vk_set_fp8_tables(const double *e4m3, const double *e5m2) {
    memcpy(T_E4M3, e4m3, sizeof T_E4M3);
    memcpy(T_E5M2, e5m2, sizeof T_E5M2);
}

static inline double ld_f64(const void *p, int64_t i) { return ((const double *)p)[i]; }
static inline double ld_f32(const void *p, int64_t i) { return (double)((const float *)p)[i]; }
static inline double ld_f16(const void *p, int64_t i) { return (double)((const _Float16 *)p)[i]; }
static inline double ld_bf16(const void *p, int64_t i) {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return (double)f;
}
static inline double ld_e4m3(const void *p, int64_t i) { return T_E4M3[((const uint8_t *)p)[i]]; }
static inline double ld_e5m2(const void *p, int64_t i) { return T_E5M2[((const uint8_t *)p)[i]]; }

/* ordinal on the monotonic integer line: s if the sign bit is clear, else -(magnitude bits) */
static inline int32_t ord8(const void *p, int64_t i) {
    int32_t s = ((const int8_t *)p)[i];
    return s < 0 ? -(s & 0x7F) : s;
}
static inline int32_t ord16(const void *p, int64_t i) {
    int32_t s = ((const int16_t *)p)[i];
    return s < 0 ? -(s & 0x7FFF) : s;
}
static inline int64_t ord32(const void *p, int64_t i) {
    int64_t s = ((const int32_t *)p)[i];
    return s < 0 ? -(s & 0x7FFFFFFF) : s;
}
static inline uint32_t ulp8(const void *a, const void *b, int64_t i) { int32_t d = ord8(a, i) - ord8(b, i); return (uint32_t)(d < 0 ? -d : d); }
static inline uint32_t ulp16(const void *a, const void *b, int64_t i) { int32_t d = ord16(a, i) - ord16(b, i); return (uint32_t)(d < 0 ? -d : d); }
static inline uint32_t ulp32(const void *a, const void *b, int64_t i) { int64_t d = ord32(a, i) - ord32(b, i); return (uint32_t)(d < 0 ? -d : d); }
static inline uint32_t ulp0(const void *a, const void *b, int64_t i) { (void)a; (void)b; (void)i; return 0; }

/* Histogram of one block of distances. Positions not finite in both hold 0 and are taken out of
 * bin 0 by the caller's correction (fine[0] -= excluded). Close tensors pile their distances into a
 * few small bins, and incrementing one counter over and over is a chain of dependent loads and
 * stores; small distances therefore go to NSUB interleaved int32 sub-histograms (folded into `fine`
 * at the end of each call), everything else straight into `fine`. */
#define NSUB 8
#define SMALL 256
static inline void hist_block(const uint32_t *dist, int64_t m, int64_t *fine, int64_t *coarse,
                              uint32_t *sub, uint32_t *mu) {
    uint32_t mx = *mu;
    int64_t j = 0;
    for (; j + NSUB <= m; j += NSUB) {
        for (int k = 0; k < NSUB; k++) {
            const uint32_t d = dist[j + k];
            if (d < SMALL)
                sub[k * SMALL + d]++;
            else
                fine[d < FINE ? d : FINE]++;
            mx = d > mx ? d : mx;
        }
    }
    for (; j < m; j++) {
        const uint32_t d = dist[j];
        if (d < SMALL)
            sub[d]++;
        else
            fine[d < FINE ? d : FINE]++;
        mx = d > mx ? d : mx;
    }
    if (coarse) /* float32: every distance is also binned by its high 16 bits */
        for (j = 0; j < m; j++) coarse[dist[j] >> 16]++;
    *mu = mx;
}

static inline void fold_sub(uint32_t *sub, int64_t *fine) {
    for (int k = 0; k < NSUB; k++)
        for (int d = 0; d < SMALL; d++) fine[d] += sub[k * SMALL + d];
}

/* The unmasked loop over one block; STORE: a statement run per element after the sums (the ULP line) */
#define FAST_LOOP(LA, LB, STORE)                                                                          \
    _Pragma("omp simd reduction(+:saa,sbb,sab,sdd,sad,npass) reduction(max:mad)")                        \
    for (int64_t j = 0; j < m; j++) {                                                                     \
        const int64_t i = s0 + j;                                                                         \
        const double xa = LA(pa, i), xb = LB(pb, i);                                                      \
        const double d = xb - xa, ad = fabs(d);                                                           \
        saa = fma(xa, xa, saa);                                                                           \
        sbb = fma(xb, xb, sbb);                                                                           \
        sab = fma(xa, xb, sab);                                                                           \
        sdd = fma(d, d, sdd);                                                                             \
        sad += ad;                                                                                        \
        npass += ad <= atol + rtol * fabs(xa);                                                            \
        mad = ad > mad ? ad : mad;                                                                        \
        STORE                                                                                             \
    }

/* One element of a masked loop: the reference semantics for NaN/Inf (docs/metrics.md). Leaves `both`
 * for the caller's ULP line. */
#define MASKED_ELEMENT(LA, LB)                                                                          \
        const int64_t i = s0 + j;                                                                       \
        const double xa = LA(pa, i), xb = LB(pb, i);                                                    \
        const int fa = (xa - xa) == 0.0, fb = (xb - xb) == 0.0;                                         \
        const int both = fa & fb;                                                                       \
        const int same = (!fa) & (!fb) & ((xa == xb) | ((xa != xa) & (xb != xb)));                      \
        const double za = both ? xa : 0.0, zb = both ? xb : 0.0;                                        \
        const double d = zb - za, ad = fabs(d);                                                         \
        saa = fma(za, za, saa);                                                                         \
        sbb = fma(zb, zb, sbb);                                                                         \
        sab = fma(za, zb, sab);                                                                         \
        sdd = fma(d, d, sdd);                                                                           \
        sad += ad;                                                                                      \
        npass += (both & (ad <= atol + rtol * fabs(za))) + same;                                        \
        mad = ad > mad ? ad : mad;                                                                      \
        nboth += both;                                                                                  \
        nfa += !fa;                                                                                     \
        nfb += !fb;                                                                                     \
        mism += (!both) & (!same);

#define MASKED_LOOP(LA, LB, ULP, HAS_ULP)                                                                 \
    _Pragma("omp simd reduction(+:saa,sbb,sab,sdd,sad,npass,nboth,nfa,nfb,mism) reduction(max:mad)")             \
    for (int64_t j = 0; j < m; j++) {                                                                     \
        MASKED_ELEMENT(LA, LB)                                                                          \
        if (HAS_ULP) {                                                                                    \
            const uint32_t u = both ? ULP(pa, pb, i) : 0u;                                                \
            dist[j] = u;                                                                                  \
                    }                                                                                                 \
    }

/* Each block of BLK elements runs the unmasked loop first; when its sums come out non-finite (a NaN
 * or Inf was read, or float64 overflowed) the block is run again with masking, before anything of
 * it reaches the totals or the histograms. */
#define DEFINE_KERNEL(NAME, LA, LB, ULP, HAS_ULP)                                                         \
    static void NAME(const void *pa, const void *pb, int64_t n, double atol, double rtol, vk_acc *acc,    \
                     int64_t *fine, int64_t *coarse, int force_masked) {                                  \
        uint32_t mu = (uint32_t)acc->max_ulp;                                                             \
        uint32_t dist[BLK];                                                                               \
        uint32_t sub[HAS_ULP ? NSUB * SMALL : 1];                                                         \
        if (HAS_ULP) memset(sub, 0, sizeof sub);                                                          \
        for (int64_t s0 = 0; s0 < n; s0 += BLK) {                                                         \
            const int64_t m = n - s0 < BLK ? n - s0 : BLK;                                                \
            double saa = 0, sbb = 0, sab = 0, sdd = 0, sad = 0, mad = 0;                                  \
            int64_t nboth = m, npass = 0, nfa = 0, nfb = 0, mism = 0;                                     \
            if (!force_masked) {                                                                          \
                FAST_LOOP(LA, LB, if (HAS_ULP) dist[j] = ULP(pa, pb, i);)                                 \
            }                                                                                             \
            if (force_masked || !isfinite(saa) || !isfinite(sbb)) {                                       \
                saa = sbb = sab = sdd = sad = mad = 0;                                                    \
                nboth = npass = nfa = nfb = mism = 0;                                                     \
                MASKED_LOOP(LA, LB, ULP, HAS_ULP)                                                         \
                if (HAS_ULP) { /* excluded positions were binned at distance 0 */                         \
                    fine[0] -= m - nboth;                                                                 \
                    if (coarse) coarse[0] -= m - nboth;                                                   \
                }                                                                                         \
            }                                                                                             \
            if (HAS_ULP) hist_block(dist, m, fine, coarse, sub, &mu);                                          \
            acc_add(acc, saa, sbb, sab, sdd, sad, mad, nboth, npass, nfa, nfb, mism);                     \
        }                                                                                                 \
        if (HAS_ULP) fold_sub(sub, fine);                                                                 \
        acc->max_ulp = (int64_t)mu;                                                                       \
    }

typedef void (*kernel_fn)(const void *, const void *, int64_t, double, double, vk_acc *, int64_t *, int64_t *, int);

/* same-dtype kernels with ULP histograms */
DEFINE_KERNEL(k_u_f32, ld_f32, ld_f32, ulp32, 1)
DEFINE_KERNEL(k_u_f16, ld_f16, ld_f16, ulp16, 1)
DEFINE_KERNEL(k_u_bf16, ld_bf16, ld_bf16, ulp16, 1)
DEFINE_KERNEL(k_u_e4m3, ld_e4m3, ld_e4m3, ulp8, 1)
DEFINE_KERNEL(k_u_e5m2, ld_e5m2, ld_e5m2, ulp8, 1)

/* every (a, b) dtype pair without ULP metrics */
#define PAIR_ROW(A, LA)                                          \
    DEFINE_KERNEL(k_##A##_f64, LA, ld_f64, ulp0, 0)              \
    DEFINE_KERNEL(k_##A##_f32, LA, ld_f32, ulp0, 0)              \
    DEFINE_KERNEL(k_##A##_f16, LA, ld_f16, ulp0, 0)              \
    DEFINE_KERNEL(k_##A##_bf16, LA, ld_bf16, ulp0, 0)            \
    DEFINE_KERNEL(k_##A##_e4m3, LA, ld_e4m3, ulp0, 0)            \
    DEFINE_KERNEL(k_##A##_e5m2, LA, ld_e5m2, ulp0, 0)
PAIR_ROW(f64, ld_f64)
PAIR_ROW(f32, ld_f32)
PAIR_ROW(f16, ld_f16)
PAIR_ROW(bf16, ld_bf16)
PAIR_ROW(e4m3, ld_e4m3)
PAIR_ROW(e5m2, ld_e5m2)

#define ROW(A) {k_##A##_f64, k_##A##_f32, k_##A##_f16, k_##A##_bf16, k_##A##_e4m3, k_##A##_e5m2}
static const kernel_fn PLAIN[6][6] = {ROW(f64), ROW(f32), ROW(f16), ROW(bf16), ROW(e4m3), ROW(e5m2)};
static const kernel_fn WITH_ULP[6] = {0, k_u_f32, k_u_f16, k_u_bf16, k_u_e4m3, k_u_e5m2};

/* Returns 0, or -1 for an unsupported dtype combination. fine/coarse: NULL when no ULP metrics. */
int vk_compare(const void *a, int dta, const void *b, int dtb, int64_t n, double atol, double rtol, vk_acc *acc,
               int64_t *fine, int64_t *coarse, int force_masked) {
    if (dta < 0 || dta > 5 || dtb < 0 || dtb > 5) return -1;
    kernel_fn k;
    if (fine) {
        if (dta != dtb || !WITH_ULP[dta]) return -1;
        k = WITH_ULP[dta];
    } else {
        k = PLAIN[dta][dtb];
    }
    k(a, b, n, atol, rtol, acc, fine, coarse, force_masked);
    return 0;
}

/* ---------------------------------------------------------------- speculative exact p99 window
 *
 * docs/performance.md, "CPU kernel". A sample pass (vk_sample) histograms the ULP distances of short
 * runs spread over the whole pair; validator.kernels._finish.p99_window turns that into a window
 * [lo, hi) of keys (key = distance >> shift; shift is 0, or 16 for a float32 window of 65536-wide
 * buckets) that should hold the p99. The main pass (vk_compare_win) then does the same arithmetic and,
 * for the ULP metrics, only vectorisable work per element: the max distance and the exact count of
 * keys below lo. With AVX-512 the distances of 32 (16- and 8-bit types) or 16 (float32) elements are
 * made and tested in registers, otherwise they go through a one-block buffer (win_scan, groups of WG);
 * a group is looked at lane by lane only when one of its keys falls inside the window (rare: about
 * 0.1-0.3% of elements), and then its keys go to an exact int64 histogram of key - lo (and, for a
 * bucket window, the exact distances to a list). Positions not finite in both (blocks read again with
 * masking, as in vk_compare) are neither below nor in the window. */

typedef struct {
    uint32_t lo, width; /* window [lo, lo + width) of keys */
    int32_t shift, pad;
    int64_t *window;    /* width int64 bins, bin i counts key lo + i */
    uint32_t *list;     /* NULL, or room for cap exact distances of in-window elements */
    int64_t cap;
    int64_t nlist;      /* out: in-window elements seen while listing (> cap: the list is incomplete) */
    int64_t below;      /* out: elements (finite in both) with key < lo */
} vk_win;

#define WG 16
/* placeholder of a position not finite in both (no finite pair is that far apart): never counted */
#define NOT_A_DIST 0xFFFFFFFFu

static inline void win_one(uint32_t u, vk_win *w) {
    const uint32_t off = (u >> w->shift) - w->lo;
    if (off < w->width && u != NOT_A_DIST) {
        w->window[off]++;
        if (w->list) {
            if (w->nlist < w->cap) w->list[w->nlist] = u;
            w->nlist++;
        }
    }
}

static inline void win_scan(const uint32_t *dist, int64_t m, vk_win *w) {
    const uint32_t lo = w->lo, width = w->width;
    const int shift = w->shift;
    int64_t j = 0;
    for (; j + WG <= m; j += WG) {
        uint32_t any = 0;
        _Pragma("omp simd reduction(|:any)")
        for (int k = 0; k < WG; k++) any |= (uint32_t)(((dist[j + k] >> shift) - lo) < width);
        if (__builtin_expect(any != 0, 0))
            for (int k = 0; k < WG; k++) win_one(dist[j + k], w);
    }
    for (; j < m; j++) win_one(dist[j], w);
}

/* One block of the windowed pass read without masking: its sums and, for the ULP metrics, the count of
 * keys below lo, the max distance and the in-window distances not yet binned (binned by wblk_commit
 * once the sums show the block finite; a block read again with masking drops them). */
typedef struct {
    double saa, sbb, sab, sdd, sad, mad;
    int64_t npass, below;
    uint32_t mx;
    int32_t npend, npend16;
    uint32_t pend[BLK + 16];   /* 16 of slack: the AVX-512 code stores whole vectors */
    uint16_t pend16[BLK + 32]; /* the 16-bit distances of the AVX-512 code for 16- and 8-bit types */
} vk_blk;

/* The window [lo, lo + width) of keys (key = distance >> shift) as distances: distance >= *dlo iff
 * key >= lo, distance < *dhi iff key < hi. Clipped at `top`, which no distance of a finite pair
 * reaches (0xFFFF for the 16- and 8-bit types, 0xFFFFFFFF for float32), so that both fit the lanes. */
static inline void win_bounds(const vk_win *w, uint32_t top, uint32_t *dlo, uint32_t *dhi) {
    const uint64_t lo = (uint64_t)w->lo << w->shift, hi = ((uint64_t)w->lo + w->width) << w->shift;
    *dlo = lo < top ? (uint32_t)lo : top;
    *dhi = hi < top ? (uint32_t)hi : top;
}

/* a block's sums and count below, without ULP work pending */
static inline void blk_set(vk_blk *blk, double saa, double sbb, double sab, double sdd, double sad, double mad,
                           int64_t npass, int64_t below) {
    blk->saa = saa;
    blk->sbb = sbb;
    blk->sab = sab;
    blk->sdd = sdd;
    blk->sad = sad;
    blk->mad = mad;
    blk->npass = npass;
    blk->below = below;
    blk->mx = 0;
    blk->npend = blk->npend16 = 0;
}

static inline void wblk_commit(const vk_blk *blk, vk_win *w) {
    for (int32_t k = 0; k < blk->npend; k++) win_one(blk->pend[k], w);
    for (int32_t k = 0; k < blk->npend16; k++) win_one(blk->pend16[k], w);
}

/* The ULP part of a block whose sums came out finite (so every element is finite in both): the max
 * distance, the count of keys below lo and the in-window elements, for elements s0 .. s0 + m - 1.
 * Portable version: distances to a buffer in one vectorised loop, then win_scan. */
#define DEFINE_ULPW_GENERIC(NAME, ULP)                                                                    \
    static inline void NAME(const void *pa, const void *pb, int64_t s0, int64_t m, vk_win *w, vk_blk *blk) { \
        uint32_t dist[BLK];                                                                               \
        uint32_t mx = 0, nb = 0;                                                                          \
        const uint32_t lo = w->lo;                                                                        \
        const int shift = w->shift;                                                                       \
        for (int64_t j = 0; j < m; j++) dist[j] = ULP(pa, pb, s0 + j);                                    \
        for (int64_t j = 0; j < m; j++) {                                                                 \
            mx = dist[j] > mx ? dist[j] : mx;                                                             \
            nb += (dist[j] >> shift) < lo;                                                                \
        }                                                                                                 \
        win_scan(dist, m, w);                                                                             \
        blk->mx = mx;                                                                                     \
        blk->below = nb;                                                                                  \
    }
DEFINE_ULPW_GENERIC(ulpw32_generic, ulp32)
DEFINE_ULPW_GENERIC(ulpw16_generic, ulp16)
DEFINE_ULPW_GENERIC(ulpw8_generic, ulp8)

/* The unmasked read of a block as two loops: the sums, then (when they are finite) the ULP part */
#define DEFINE_FASTW(NAME, LA, ULPW)                                                                      \
    static inline void NAME(const void *pa, const void *pb, int64_t s0, int64_t m, double atol, double rtol, \
                            vk_win *w, vk_blk *blk) {                                                     \
        double saa = 0, sbb = 0, sab = 0, sdd = 0, sad = 0, mad = 0;                                      \
        int64_t npass = 0;                                                                                \
        FAST_LOOP(LA, LA, )                                                                               \
        blk_set(blk, saa, sbb, sab, sdd, sad, mad, npass, 0);                                             \
        if (isfinite(saa) && isfinite(sbb)) ULPW(pa, pb, s0, m, w, blk);                                  \
    }

#ifdef VK_AVX512
/* AVX-512: float32, float16 and bfloat16 blocks are read once, the float64 sums and the ULP work of
 * every group of 16 or 32 elements made in registers together (fastw_*); float8 (table decoding) keeps
 * the two loops, its ULP part in registers too (ulpw8_avx).
 *
 * ULP lanes: 16 bits for the 16- and 8-bit types (distances < 2**16), 32 for float32. A lane's ordinal
 * is s, or -(s & mag) when its sign bit is set, which in wrapping arithmetic is MIN - s (MIN: the lane
 * type's most negative value, -128 for sign-extended 8-bit codes); the distance is
 * max(oa, ob) - min(oa, ob), exact in unsigned arithmetic of the lane's width. The count below the
 * window is the block's m less the popcounts of "at or above its start", a mask that also selects the
 * lanes tested against its end; only a group with an in-window lane leaves the vector code, to the
 * block's list. */
typedef struct {
    __m512d aa, bb, ab, dd, ad, mad;
    int64_t pass; /* counted from the compare masks by popcount: scalar work, off the vector pipes */
} vk_vsums;

typedef struct {
    __m512i mx, dlo, dhi; /* per lane: max distance; the window as distances */
} vk_vulp;

/* Software prefetch VK_PF bytes ahead of the 64-byte group being read (0: none). On the H200's host
 * (16 threads of an Intel Xeon under KVM) the hardware prefetchers alone left the main pass short of
 * the memory: 1024 bytes ahead took it from 48 to 62 GB/s (bf16) and from 65 to 81 (fp32)
 * (benchmarks/cpu_roofline.py, docs/results/stop14/roofline2). */
#ifndef VK_PF
#define VK_PF 1024
#endif
static inline void prefetch2(const void *a, const void *b) {
    if (VK_PF > 0) {
        __builtin_prefetch((const char *)a + VK_PF, 0, 3);
        __builtin_prefetch((const char *)b + VK_PF, 0, 3);
    }
}

static inline vk_vsums vsums_zero(void) {
    const __m512d z = _mm512_setzero_pd();
    return (vk_vsums){z, z, z, z, z, z, 0};
}

/* FAST_LOOP's arithmetic on 8 elements; lanes outside `valid` hold 0 in both, so only the pass count
 * needs masking */
static inline void sums8(__m512d xa, __m512d xb, __mmask8 valid, __m512d atol, __m512d rtol, vk_vsums *s) {
    const __m512d d = _mm512_sub_pd(xb, xa), ad = _mm512_abs_pd(d);
    s->aa = _mm512_fmadd_pd(xa, xa, s->aa);
    s->bb = _mm512_fmadd_pd(xb, xb, s->bb);
    s->ab = _mm512_fmadd_pd(xa, xb, s->ab);
    s->dd = _mm512_fmadd_pd(d, d, s->dd);
    s->ad = _mm512_add_pd(s->ad, ad);
    s->mad = _mm512_max_pd(s->mad, ad);
    const __m512d tol = _mm512_add_pd(atol, _mm512_mul_pd(rtol, _mm512_abs_pd(xa)));
    const __mmask8 pass = _mm512_mask_cmp_pd_mask(valid, ad, tol, _CMP_LE_OQ);
    s->pass += __builtin_popcount(pass);
}

static inline __mmask8 first8(int k) { return k >= 8 ? 0xFF : k <= 0 ? 0 : (__mmask8)((1u << k) - 1); }

/* 16 float32 values of each, the first n valid */
static inline void sums16(__m512 xa, __m512 xb, int n, __m512d atol, __m512d rtol, vk_vsums *s) {
    sums8(_mm512_cvtps_pd(_mm512_castps512_ps256(xa)), _mm512_cvtps_pd(_mm512_castps512_ps256(xb)), first8(n), atol,
          rtol, s);
    sums8(_mm512_cvtps_pd(_mm512_extractf32x8_ps(xa, 1)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(xb, 1)),
          first8(n - 8), atol, rtol, s);
}

static inline void vsums_to_blk(const vk_vsums *s, vk_blk *blk) {
    blk->saa = _mm512_reduce_add_pd(s->aa);
    blk->sbb = _mm512_reduce_add_pd(s->bb);
    blk->sab = _mm512_reduce_add_pd(s->ab);
    blk->sdd = _mm512_reduce_add_pd(s->dd);
    blk->sad = _mm512_reduce_add_pd(s->ad);
    blk->mad = _mm512_reduce_max_pd(s->mad);
    blk->npass = s->pass;
}

/* The in-window lanes `in` of a group of distances, to the block's list. With AVX512-VBMI2 every group
 * does this without a branch, compressing the lanes into a vector stored whole (about 1% of lanes are
 * in the window: a branch on "any" is taken by a third of the groups and mispredicted often); else
 * only groups with an in-window lane, a lane at a time (defer). VK_COMPRESS=0 forces the second way. */
#ifndef VK_COMPRESS
#ifdef __AVX512VBMI2__
#define VK_COMPRESS 1
#else
#define VK_COMPRESS 0
#endif
#endif
#if VK_COMPRESS
static inline void defer16(vk_blk *blk, __m512i u, __mmask32 in) {
    _mm512_storeu_si512(blk->pend16 + blk->npend16, _mm512_maskz_compress_epi16(in, u));
    blk->npend16 += __builtin_popcount(in);
}

static inline void defer32(vk_blk *blk, __m512i u, __mmask16 in) {
    _mm512_storeu_si512(blk->pend + blk->npend, _mm512_maskz_compress_epi32(in, u));
    blk->npend += __builtin_popcount(in);
}
#endif

/* the in-window lanes `in` of a group of 16- (eb = 2) or 32-bit (eb = 4) distances, to the block's list */
static inline void defer(vk_blk *blk, __m512i u, uint32_t in, int eb) {
    uint32_t t[16];
    _mm512_storeu_si512(t, u);
    for (; in; in &= in - 1) {
        const int k = __builtin_ctz(in);
        blk->pend[blk->npend++] = eb == 2 ? ((const uint16_t *)t)[k] : t[k];
    }
}

static inline __m512i ord_epi16(__m512i s, __m512i vmin) {
    return _mm512_mask_sub_epi16(s, _mm512_movepi16_mask(s), vmin, s);
}

static inline void ulp_lanes16(__m512i ca, __m512i cb, __mmask32 valid, __m512i vmin, vk_vulp *v, vk_blk *blk) {
    const __m512i oa = ord_epi16(ca, vmin), ob = ord_epi16(cb, vmin);
    const __m512i u = _mm512_sub_epi16(_mm512_max_epi16(oa, ob), _mm512_min_epi16(oa, ob));
    v->mx = _mm512_max_epu16(v->mx, u);
    const __mmask32 ge = _mm512_mask_cmpge_epu16_mask(valid, u, v->dlo);
    blk->below -= __builtin_popcount(ge); /* the block starts it at m */
    const __mmask32 in = _mm512_mask_cmplt_epu16_mask(ge, u, v->dhi);
#if VK_COMPRESS
    defer16(blk, u, in);
#else
    if (__builtin_expect(in != 0, 0)) defer(blk, u, in, 2);
#endif
}

static inline vk_vulp vulp16(const vk_win *w) {
    uint32_t dlo, dhi;
    win_bounds(w, 0xFFFF, &dlo, &dhi);
    return (vk_vulp){_mm512_setzero_si512(), _mm512_set1_epi16((short)dlo), _mm512_set1_epi16((short)dhi)};
}

static inline uint32_t hmax16(__m512i v) {
    const __m256i a = _mm256_max_epu16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i b = _mm_max_epu16(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    b = _mm_max_epu16(b, _mm_srli_si128(b, 8));
    b = _mm_max_epu16(b, _mm_srli_si128(b, 4));
    b = _mm_max_epu16(b, _mm_srli_si128(b, 2));
    return (uint32_t)(_mm_cvtsi128_si32(b) & 0xFFFF);
}

/* 16 16-bit codes (the first t valid) as two vectors of 8 float32 values, x0 holding n0 valid ones
 * and x1 n1. bfloat16: the even elements, then the odd ones (a code << 16 is its float32); float16:
 * elements 0-7, then 8-15. The sums do not mind the order. */
static inline void decode16(const int16_t *p, int bf16, int t, __m256 *x0, __m256 *x1, int *n0, int *n1) {
    const __mmask16 valid = t >= 16 ? 0xFFFF : t <= 0 ? 0 : (__mmask16)((1u << t) - 1);
    const __m256i c = t >= 16 ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi16(valid, p);
    if (bf16) {
        *x0 = _mm256_castsi256_ps(_mm256_slli_epi32(c, 16));
        *x1 = _mm256_castsi256_ps(_mm256_and_si256(c, _mm256_set1_epi32((int)0xFFFF0000u)));
        *n0 = (t + 1) >> 1;
        *n1 = t >> 1;
    } else {
        *x0 = _mm256_cvtph_ps(_mm256_castsi256_si128(c));
        *x1 = _mm256_cvtph_ps(_mm256_extracti128_si256(c, 1));
        *n0 = t;
        *n1 = t - 8;
    }
}

/* one group of 32 float16 or bfloat16 elements, the first t (1..32) valid */
static inline void fastw16_group(const int16_t *a, const int16_t *b, int t, int bf16, __m512d atol, __m512d rtol,
                                 vk_vsums *s, vk_vulp *v, vk_blk *blk) {
    for (int h = 0; h < 32; h += 16) {
        __m256 xa0, xa1, xb0, xb1;
        int n0, n1;
        decode16(a + h, bf16, t - h, &xa0, &xa1, &n0, &n1);
        decode16(b + h, bf16, t - h, &xb0, &xb1, &n0, &n1);
        sums8(_mm512_cvtps_pd(xa0), _mm512_cvtps_pd(xb0), first8(n0), atol, rtol, s);
        sums8(_mm512_cvtps_pd(xa1), _mm512_cvtps_pd(xb1), first8(n1), atol, rtol, s);
    }
    const __mmask32 valid = t >= 32 ? 0xFFFFFFFFu : (1u << t) - 1;
    const __m512i ca = t >= 32 ? _mm512_loadu_si512(a) : _mm512_maskz_loadu_epi16(valid, a);
    const __m512i cb = t >= 32 ? _mm512_loadu_si512(b) : _mm512_maskz_loadu_epi16(valid, b);
    ulp_lanes16(ca, cb, valid, _mm512_set1_epi16(-0x8000), v, blk);
}

static inline void fastw16(const void *pa, const void *pb, int64_t s0, int64_t m, double atol, double rtol,
                           vk_win *w, vk_blk *blk, int bf16) {
    const int16_t *a = (const int16_t *)pa + s0, *b = (const int16_t *)pb + s0;
    const __m512d vatol = _mm512_set1_pd(atol), vrtol = _mm512_set1_pd(rtol);
    vk_vsums s = vsums_zero();
    vk_vulp v = vulp16(w);
    blk->npend = blk->npend16 = 0;
    blk->below = m;
    int64_t j = 0;
    for (; j + 32 <= m; j += 32) {
        prefetch2(a + j, b + j);
        fastw16_group(a + j, b + j, 32, bf16, vatol, vrtol, &s, &v, blk);
    }
    if (j < m) fastw16_group(a + j, b + j, (int)(m - j), bf16, vatol, vrtol, &s, &v, blk);
    vsums_to_blk(&s, blk);
    blk->mx = hmax16(v.mx);
}

static void fastw_f16(const void *pa, const void *pb, int64_t s0, int64_t m, double atol, double rtol, vk_win *w,
                      vk_blk *blk) {
    fastw16(pa, pb, s0, m, atol, rtol, w, blk, 0);
}

static void fastw_bf16(const void *pa, const void *pb, int64_t s0, int64_t m, double atol, double rtol, vk_win *w,
                       vk_blk *blk) {
    fastw16(pa, pb, s0, m, atol, rtol, w, blk, 1);
}

static inline __m512i ord_epi32(__m512i s) {
    return _mm512_mask_sub_epi32(s, _mm512_movepi32_mask(s), _mm512_set1_epi32(INT32_MIN), s);
}

/* one group of 16 float32 elements, the first t (1..16) valid */
static inline void fastw32_group(const float *a, const float *b, int t, __m512d atol, __m512d rtol, vk_vsums *s,
                                 vk_vulp *v, vk_blk *blk) {
    const __mmask16 valid = t >= 16 ? 0xFFFF : (__mmask16)((1u << t) - 1);
    const __m512i ca = t >= 16 ? _mm512_loadu_si512(a) : _mm512_maskz_loadu_epi32(valid, a);
    const __m512i cb = t >= 16 ? _mm512_loadu_si512(b) : _mm512_maskz_loadu_epi32(valid, b);
    sums16(_mm512_castsi512_ps(ca), _mm512_castsi512_ps(cb), t, atol, rtol, s);
    const __m512i oa = ord_epi32(ca), ob = ord_epi32(cb);
    const __m512i u = _mm512_sub_epi32(_mm512_max_epi32(oa, ob), _mm512_min_epi32(oa, ob));
    v->mx = _mm512_max_epu32(v->mx, u);
    const __mmask16 ge = _mm512_mask_cmpge_epu32_mask(valid, u, v->dlo);
    blk->below -= __builtin_popcount(ge);
    const __mmask16 in = _mm512_mask_cmplt_epu32_mask(ge, u, v->dhi);
#if VK_COMPRESS
    defer32(blk, u, in);
#else
    if (__builtin_expect(in != 0, 0)) defer(blk, u, in, 4);
#endif
}

static void fastw_f32(const void *pa, const void *pb, int64_t s0, int64_t m, double atol, double rtol, vk_win *w,
                      vk_blk *blk) {
    const float *a = (const float *)pa + s0, *b = (const float *)pb + s0;
    const __m512d vatol = _mm512_set1_pd(atol), vrtol = _mm512_set1_pd(rtol);
    uint32_t dlo, dhi;
    win_bounds(w, 0xFFFFFFFFu, &dlo, &dhi);
    vk_vsums s = vsums_zero();
    vk_vulp v = {_mm512_setzero_si512(), _mm512_set1_epi32((int)dlo), _mm512_set1_epi32((int)dhi)};
    blk->npend = blk->npend16 = 0;
    blk->below = m;
    int64_t j = 0;
    for (; j + 16 <= m; j += 16) {
        prefetch2(a + j, b + j);
        fastw32_group(a + j, b + j, 16, vatol, vrtol, &s, &v, blk);
    }
    if (j < m) fastw32_group(a + j, b + j, (int)(m - j), vatol, vrtol, &s, &v, blk);
    vsums_to_blk(&s, blk);
    blk->mx = _mm512_reduce_max_epu32(v.mx);
}

/* float8: the ULP part after the sums, 32 sign-extended codes at a time */
static inline void ulpw8_avx(const void *pa, const void *pb, int64_t s0, int64_t m, vk_win *w, vk_blk *blk) {
    const int8_t *a = (const int8_t *)pa + s0, *b = (const int8_t *)pb + s0;
    const __m512i vmin = _mm512_set1_epi16(-0x80);
    vk_vulp v = vulp16(w);
    blk->below = m;
    int64_t j = 0;
    for (; j + 32 <= m; j += 32)
        ulp_lanes16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(a + j))),
                    _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(b + j))), 0xFFFFFFFFu, vmin, &v, blk);
    if (j < m) {
        const __mmask32 valid = (__mmask32)((1ull << (m - j)) - 1);
        ulp_lanes16(_mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(valid, a + j)),
                    _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(valid, b + j)), valid, vmin, &v, blk);
    }
    blk->mx = hmax16(v.mx);
}
DEFINE_FASTW(fastw_e4m3, ld_e4m3, ulpw8_avx)
DEFINE_FASTW(fastw_e5m2, ld_e5m2, ulpw8_avx)
#else
DEFINE_FASTW(fastw_f32, ld_f32, ulpw32_generic)
DEFINE_FASTW(fastw_f16, ld_f16, ulpw16_generic)
DEFINE_FASTW(fastw_bf16, ld_bf16, ulpw16_generic)
DEFINE_FASTW(fastw_e4m3, ld_e4m3, ulpw8_generic)
DEFINE_FASTW(fastw_e5m2, ld_e5m2, ulpw8_generic)
#endif

#define WMASKED_LOOP(LA, LB, ULP)                                                                         \
    _Pragma("omp simd reduction(+:saa,sbb,sab,sdd,sad,npass,nboth,nfa,nfb,mism) reduction(max:mad)") \
    for (int64_t j = 0; j < m; j++) {                                                                     \
        MASKED_ELEMENT(LA, LB)                                                                          \
        dist[j] = both ? ULP(pa, pb, i) : NOT_A_DIST;                                                     \
    }                                                                                                     \
    /* the max and the count below apart: gcc 12 miscompiled them as reductions of the loop above */     \
    for (int64_t j = 0; j < m; j++) {                                                                     \
        const uint32_t v = dist[j] == NOT_A_DIST ? 0u : dist[j];                                          \
        mx = v > mx ? v : mx;                                                                             \
        nbelow += (dist[j] != NOT_A_DIST) & ((v >> shift) < lo);                                          \
    }

/* Each block is read without masking first (FASTW); when its sums come out non-finite it is read
 * again with masking (WMASKED_LOOP, win_scan) and what FASTW found is dropped. */
#define DEFINE_WKERNEL(NAME, LA, ULP, FASTW)                                                              \
    static void NAME(const void *pa, const void *pb, int64_t n, double atol, double rtol, vk_acc *acc,    \
                     vk_win *w, int force_masked) {                                                       \
        uint32_t mx = (uint32_t)acc->max_ulp;                                                             \
        const uint32_t lo = w->lo;                                                                        \
        const int shift = w->shift;                                                                       \
        uint32_t dist[BLK];                                                                               \
        vk_blk blk;                                                                                       \
        for (int64_t s0 = 0; s0 < n; s0 += BLK) {                                                         \
            const int64_t m = n - s0 < BLK ? n - s0 : BLK;                                                \
            int64_t nboth = m, nfa = 0, nfb = 0, mism = 0;                                                \
            if (!force_masked) FASTW(pa, pb, s0, m, atol, rtol, w, &blk);                                 \
            if (force_masked || !isfinite(blk.saa) || !isfinite(blk.sbb)) {                               \
                double saa = 0, sbb = 0, sab = 0, sdd = 0, sad = 0, mad = 0;                              \
                int64_t npass = 0, nbelow = 0;                                                            \
                nboth = 0;                                                                                \
                WMASKED_LOOP(LA, LA, ULP)                                                                 \
                win_scan(dist, m, w);                                                                     \
                blk_set(&blk, saa, sbb, sab, sdd, sad, mad, npass, nbelow);                               \
            } else {                                                                                      \
                wblk_commit(&blk, w);                                                                     \
                mx = blk.mx > mx ? blk.mx : mx;                                                           \
            }                                                                                             \
            w->below += blk.below;                                                                        \
            acc_add(acc, blk.saa, blk.sbb, blk.sab, blk.sdd, blk.sad, blk.mad, nboth, blk.npass, nfa, nfb, mism); \
        }                                                                                                 \
        acc->max_ulp = (int64_t)mx;                                                                       \
    }

typedef void (*wkernel_fn)(const void *, const void *, int64_t, double, double, vk_acc *, vk_win *, int);
DEFINE_WKERNEL(w_f32, ld_f32, ulp32, fastw_f32)
DEFINE_WKERNEL(w_f16, ld_f16, ulp16, fastw_f16)
DEFINE_WKERNEL(w_bf16, ld_bf16, ulp16, fastw_bf16)
DEFINE_WKERNEL(w_e4m3, ld_e4m3, ulp8, fastw_e4m3)
DEFINE_WKERNEL(w_e5m2, ld_e5m2, ulp8, fastw_e5m2)
static const wkernel_fn WINDOWED[6] = {0, w_f32, w_f16, w_bf16, w_e4m3, w_e5m2};

static const int64_t DT_SIZE[6] = {8, 4, 2, 2, 1, 1};

/* Takes the next job of `job` elements from the shared counter *next (a thread's share of a pass:
 * every thread calls the entry point once and takes jobs until none is left). Returns its start, or
 * n when none is left. */
static inline int64_t next_job(int64_t *next, int64_t job, int64_t n) {
    const int64_t s = __atomic_fetch_add(next, job, __ATOMIC_RELAXED);
    return s < n ? s : n;
}

/* The main pass with the window instead of the full histograms (same dtype, ULP metrics), over the
 * jobs this thread takes from *next. Returns 0, or -1 for a dtype without ULP metrics or a bad window. */
int vk_compare_win(const void *a, const void *b, int dt, int64_t n, int64_t job, int64_t *next, double atol,
                   double rtol, vk_acc *acc, vk_win *w, int force_masked) {
    if (dt < 1 || dt > 5 || job < 1 || w->width < 1 || w->shift < 0 || w->shift > 16 || !w->window) return -1;
    const int64_t size = DT_SIZE[dt];
    for (int64_t s; (s = next_job(next, job, n)) < n;) {
        const int64_t m = n - s < job ? n - s : job;
        WINDOWED[dt]((const char *)a + s * size, (const char *)b + s * size, m, atol, rtol, acc, w, force_masked);
    }
    return 0;
}

/* The sample pass: for every run r (global index base/gap + r of the pair), the elements
 * [r*gap + off(r), r*gap + off(r) + run) with a pseudo-random offset 0 <= off(r) <= gap - run, so that
 * the runs do not line up with the columns of power-of-two-wide rows. Adds their distances (finite in
 * both) into the exact histograms fine/coarse (coarse: NULL unless float32) and returns how many were
 * added. base must be a multiple of gap; run <= BLK. */
static inline int64_t sample_off(int64_t r, int64_t span) {
    uint64_t h = (uint64_t)r * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    return (int64_t)((h >> 16) % (uint64_t)span);
}

/* The cache lines of the run VK_SPF runs ahead are prefetched while a run is read: runs are far apart,
 * so the hardware prefetchers cannot see them coming, and each would otherwise start with a full
 * memory latency (0: no prefetch). */
#ifndef VK_SPF
#define VK_SPF 2
#endif
static inline void prefetch_run(const void *pa, const void *pb, int64_t s, int64_t m, int64_t size) {
    for (int64_t k = 0; k < m * size; k += 64) {
        __builtin_prefetch((const char *)pa + s * size + k, 0, 3);
        __builtin_prefetch((const char *)pb + s * size + k, 0, 3);
    }
}

#define DEFINE_SAMPLER(NAME, LA, ULP, SIZE)                                                               \
    static int64_t NAME(const void *pa, const void *pb, int64_t n, int64_t base, int64_t run, int64_t gap, \
                        int64_t *fine, int64_t *coarse, uint32_t *maxd) {                                 \
        uint32_t dist[BLK], sub[NSUB * SMALL], mu = *maxd;                                                \
        memset(sub, 0, sizeof sub);                                                                       \
        int64_t total = 0;                                                                                \
        int64_t s0 = sample_off(base / gap, gap - run + 1);                                               \
        for (int64_t r0 = 0; r0 < n && s0 < n; r0 += gap) {                                               \
            const int64_t m = n - s0 < run ? n - s0 : run;                                                \
            const int64_t s1 = r0 + gap + sample_off((base + r0) / gap + 1, gap - run + 1); /* the next */ \
            const int64_t sp = r0 + VK_SPF * gap + sample_off((base + r0) / gap + VK_SPF, gap - run + 1); \
            if (VK_SPF && sp < n) prefetch_run(pa, pb, sp, n - sp < run ? n - sp : run, SIZE);            \
            int64_t nboth = 0;                                                                            \
            _Pragma("omp simd reduction(+:nboth)")                                                        \
            for (int64_t j = 0; j < m; j++) {                                                             \
                const int64_t i = s0 + j;                                                                 \
                const double xa = LA(pa, i), xb = LA(pb, i);                                              \
                const int both = ((xa - xa) == 0.0) & ((xb - xb) == 0.0);                                 \
                dist[j] = both ? ULP(pa, pb, i) : 0u;                                                     \
                nboth += both;                                                                            \
            }                                                                                             \
            hist_block(dist, m, fine, coarse, sub, &mu);                                                  \
            fine[0] -= m - nboth; /* excluded positions were binned at distance 0 */                      \
            if (coarse) coarse[0] -= m - nboth;                                                           \
            total += nboth;                                                                               \
            s0 = s1;                                                                                      \
        }                                                                                                 \
        fold_sub(sub, fine);                                                                              \
        *maxd = mu;                                                                                       \
        return total;                                                                                     \
    }

typedef int64_t (*sampler_fn)(const void *, const void *, int64_t, int64_t, int64_t, int64_t, int64_t *, int64_t *,
                              uint32_t *);
DEFINE_SAMPLER(s_f32, ld_f32, ulp32, 4)
DEFINE_SAMPLER(s_f16, ld_f16, ulp16, 2)
DEFINE_SAMPLER(s_bf16, ld_bf16, ulp16, 2)
DEFINE_SAMPLER(s_e4m3, ld_e4m3, ulp8, 1)
DEFINE_SAMPLER(s_e5m2, ld_e5m2, ulp8, 1)
static const sampler_fn SAMPLERS[6] = {0, s_f32, s_f16, s_bf16, s_e4m3, s_e5m2};

/* The first element of every sampled run of an n-element pair (ceil(n / gap) of them; a start may lie
 * past the end): for tests and diagnostics. */
void vk_sample_starts(int64_t n, int64_t run, int64_t gap, int64_t *out) {
    for (int64_t r = 0; r * gap < n; r++) out[r] = r * gap + sample_off(r, gap - run + 1);
}

/* The sample pass over the jobs this thread takes from *next (job: a multiple of gap). Returns the
 * number of sampled distances added, or -1 for bad arguments; *maxd: the largest distance it saw
 * (so that the caller adds up only the bins in use). */
int64_t vk_sample(const void *a, const void *b, int dt, int64_t n, int64_t job, int64_t *next, int64_t run,
                  int64_t gap, int64_t *fine, int64_t *coarse, int64_t *maxd) {
    if (dt < 1 || dt > 5 || run < 1 || run > BLK || gap < run || job < gap || job % gap != 0) return -1;
    const int64_t size = DT_SIZE[dt];
    int64_t total = 0;
    uint32_t mu = (uint32_t)*maxd;
    for (int64_t s; (s = next_job(next, job, n)) < n;) {
        const int64_t m = n - s < job ? n - s : job;
        total += SAMPLERS[dt]((const char *)a + s * size, (const char *)b + s * size, m, s, run, gap, fine, coarse, &mu);
    }
    *maxd = mu;
    return total;
}

/* ---------------------------------------------------------------- a pool of threads kept between calls
 *
 * Both passes of the windowed method run on these threads, each started by one call from Python
 * (vk_sample_par, vk_compare_win_par), which releases the GIL once. On the H200's host (16 vCPUs of a
 * KVM guest) waking 15 Python workers took 627 us, creating and joining 15 POSIX threads 925 us,
 * waking 15 threads asleep on a condition variable 159 us and 15 spinning ones 4 us
 * (benchmarks/thread_costs.py); a 2**26-element bf16 pair takes about 5 ms. So the threads are kept,
 * and after a round each spins for VK_SPIN_US before it sleeps: the sample pass and the main pass of
 * one comparison follow each other closely. A spinning worker yields its core every few dozen
 * checks, so that other runnable threads (torch's intra-op threads, the caller) are not held up.
 *
 * A round runs fn(arg, t) for t = 0 .. n-1, t = 0 in the caller (and any t past MAX_POOL). Tasks take
 * their work from shared counters and never wait for each other, so a round is correct whatever ran
 * it; one round runs at a time (callers queue on a mutex). A child process after fork() starts a pool
 * of its own. */
#ifndef VK_SPIN_US
#define VK_SPIN_US 2000
#endif
#define MAX_POOL 256

typedef void (*vk_task)(void *arg, int t);

static struct {
    pthread_mutex_t run;   /* one round at a time */
    pthread_mutex_t mu;    /* with wake: the sleeping workers */
    pthread_cond_t wake;
    int started;           /* workers 1 .. started exist */
    int64_t gen;           /* (rounds begun << 16) | the workers 1 .. that take part in the latest round:
                            * one word, so that a worker never pairs a round with another's count */
    vk_task fn;
    void *arg;
    int64_t born[MAX_POOL];  /* gen when worker t was started: it takes part in the later rounds only */
    int64_t claim[MAX_POOL]; /* task t of round R: 4R open, 4R+1 taken by worker t, 4R+2 taken by the
                              * caller, 4R+3 done by worker t */
} POOL = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, {0}, {0}};

static int64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *pool_worker(void *p) {
    const int t = (int)(intptr_t)p;
    int64_t seen = POOL.born[t]; /* not the current count: the round it was started for may have begun */
    for (;;) {
        int64_t g = __atomic_load_n(&POOL.gen, __ATOMIC_ACQUIRE);
        if (g == seen) { /* spin a while, then sleep until the next round */
            const int64_t until = now_us() + VK_SPIN_US;
            for (int k = 0; (g = __atomic_load_n(&POOL.gen, __ATOMIC_ACQUIRE)) == seen; k++) {
                cpu_relax();
                if ((k & 63) == 63) sched_yield(); /* a runnable thread (torch's, the caller's) gets the core */
                if ((k & 1023) == 1023 && now_us() > until) {
                    pthread_mutex_lock(&POOL.mu);
                    while ((g = __atomic_load_n(&POOL.gen, __ATOMIC_ACQUIRE)) == seen)
                        pthread_cond_wait(&POOL.wake, &POOL.mu);
                    pthread_mutex_unlock(&POOL.mu);
                    break;
                }
            }
        }
        seen = g;
        int64_t open = 4 * (g >> 16);
        /* its task, unless the caller took it first: then the round cannot end, nor fn and arg change,
         * before it is done */
        if (t <= (g & 0xFFFF) &&
            __atomic_compare_exchange_n(&POOL.claim[t], &open, open + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            POOL.fn(POOL.arg, t);
            __atomic_store_n(&POOL.claim[t], open + 3, __ATOMIC_RELEASE);
        }
    }
    return NULL;
}

/* in a child after fork(): no worker exists there; locks may have been held by threads that did not
 * come along */
static void pool_after_fork(void) {
    pthread_mutex_init(&POOL.run, NULL);
    pthread_mutex_init(&POOL.mu, NULL);
    pthread_cond_init(&POOL.wake, NULL);
    POOL.started = 0;
}

/* Runs fn(arg, t) for t = 0 .. n-1 on the pool (t = 0 here); returns when all are done. Workers that
 * cannot be started leave their t to the caller. */
static void pool_run(vk_task fn, void *arg, int n) {
    if (n <= 1) { /* nothing to share: the sleeping workers are left asleep */
        if (n == 1) fn(arg, 0);
        return;
    }
    pthread_mutex_lock(&POOL.run);
    static int registered = 0;
    if (!registered) {
        pthread_atfork(NULL, NULL, pool_after_fork);
        registered = 1;
    }
    while (POOL.started < n - 1 && POOL.started < MAX_POOL - 1) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 20);
        POOL.born[POOL.started + 1] = POOL.gen;
        const int ok = pthread_create(&th, &attr, pool_worker, (void *)(intptr_t)(POOL.started + 1)) == 0;
        pthread_attr_destroy(&attr);
        if (!ok) break;
        POOL.started++;
    }
    const int helpers = POOL.started < n - 1 ? POOL.started : n - 1;
    const int64_t round = (POOL.gen >> 16) + 1, open = 4 * round;
    POOL.fn = fn;
    POOL.arg = arg;
    for (int t = 1; t <= helpers; t++) __atomic_store_n(&POOL.claim[t], open, __ATOMIC_RELAXED);
    pthread_mutex_lock(&POOL.mu);
    __atomic_store_n(&POOL.gen, round << 16 | helpers, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&POOL.wake);
    pthread_mutex_unlock(&POOL.mu);
    fn(arg, 0);
    for (int t = helpers + 1; t < n; t++) fn(arg, t); /* workers that could not be started, or past MAX_POOL */
    /* The work is done (tasks drain shared counters). A worker still waking up is not waited for: the
     * caller takes its task, which then only zeroes that task's outputs (on a virtual machine a wake-up
     * took milliseconds now and then). Then the tasks workers took are waited for. */
    for (int t = 1; t <= helpers; t++) {
        int64_t expect = open;
        if (__atomic_compare_exchange_n(&POOL.claim[t], &expect, open + 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            fn(arg, t);
    }
    for (int t = 1; t <= helpers; t++)
        for (int k = 0; __atomic_load_n(&POOL.claim[t], __ATOMIC_ACQUIRE) == open + 1; k++) {
            cpu_relax();
            if ((k & 63) == 63) sched_yield(); /* a worker that was preempted may need this core */
        }
    pthread_mutex_unlock(&POOL.run);
}

/* ---------------------------------------------------------------- the sample pass on the pool
 *
 * vk_sample_par: the sample pass on n threads of the pool, then their histograms added together, all
 * in one call. A sample is a few milliseconds of work or less. */

/* One sampling thread's histograms, what to zero in them first, and its results. */
typedef struct {
    int64_t *fine, *coarse;            /* FINE + 1 bins each; coarse NULL unless float32 */
    int64_t clear_fine, clear_coarse;  /* leading bins to zero first (fine's overflow bin always is) */
    int64_t maxd, total;               /* out: the largest distance, the distances added */
} vk_sampler;

#define MERGE_RANGE 4096 /* bins per merge job */

typedef struct {
    const void *a, *b;
    int dt, nthreads;
    int64_t n, job, run, gap;
    int64_t next, mnext, rc, bins; /* job counters; a refused argument; bins to merge */
    vk_sampler *s;
} vk_sample_team;

static void sample_task(void *p, int t) {
    vk_sample_team *m = (vk_sample_team *)p;
    vk_sampler *s = &m->s[t];
    memset(s->fine, 0, (size_t)s->clear_fine * 8);
    s->fine[FINE] = 0;
    if (s->coarse) memset(s->coarse, 0, (size_t)s->clear_coarse * 8);
    s->maxd = 0;
    s->total = vk_sample(m->a, m->b, m->dt, m->n, m->job, &m->next, m->run, m->gap, s->fine, s->coarse, &s->maxd);
    if (s->total < 0) __atomic_store_n(&m->rc, -1, __ATOMIC_RELAXED);
}

/* bins [lo, hi) of every other sampler's histograms into sampler 0's, each only up to its bins in use
 * (coarse bins, distance >> 16, never pass the fine range's end: distances are below 2**32) */
static void merge_bins(vk_sample_team *m, int64_t lo, int64_t hi) {
    for (int t = 1; t < m->nthreads; t++) {
        const vk_sampler *u = &m->s[t];
        const int64_t fe = (u->maxd < FINE - 1 ? u->maxd : FINE - 1) + 1, ce = (u->maxd >> 16) + 1;
        for (int64_t i = lo; i < hi && i < fe; i++) m->s[0].fine[i] += u->fine[i];
        if (u->coarse)
            for (int64_t i = lo; i < hi && i < ce; i++) m->s[0].coarse[i] += u->coarse[i];
    }
}

static void merge_task(void *p, int t) {
    vk_sample_team *m = (vk_sample_team *)p;
    (void)t;
    for (int64_t lo; (lo = __atomic_fetch_add(&m->mnext, MERGE_RANGE, __ATOMIC_RELAXED)) < m->bins;)
        merge_bins(m, lo, lo + MERGE_RANGE);
}

/* The sample pass (vk_sample's arguments) on nthreads threads of the pool. Afterwards s[0] holds the
 * sum of every thread's histograms, s[0].maxd the largest distance and s[0].total the number of
 * sampled distances, which is also returned (-1: bad arguments). */
int64_t vk_sample_par(const void *a, const void *b, int dt, int64_t n, int64_t job, int64_t run, int64_t gap,
                      vk_sampler *s, int nthreads) {
    if (nthreads < 1) return -1;
    vk_sample_team m = {a, b, dt, nthreads, n, job, run, gap, 0, 0, 0, 0, s};
    pool_run(sample_task, &m, nthreads);
    if (m.rc < 0) return -1;
    int64_t top = 0, total = 0;
    for (int t = 0; t < nthreads; t++) {
        top = s[t].maxd > top ? s[t].maxd : top;
        total += s[t].total;
        if (t > 0) s[0].fine[FINE] += s[t].fine[FINE];
    }
    m.bins = (top < FINE - 1 ? top : FINE - 1) + 1;
    if (nthreads > 1) { /* a few bins (close pairs): added here; float32's spread: by the pool, a range each */
        if (m.bins * (nthreads - 1) < 4 * MERGE_RANGE)
            merge_bins(&m, 0, m.bins);
        else
            pool_run(merge_task, &m, nthreads);
    }
    s[0].maxd = top;
    s[0].total = total;
    return total;
}

/* ---------------------------------------------------------------- the windowed main pass on the pool */

typedef struct {
    const void *a, *b;
    int dt, force_masked;
    int64_t n, job, next, rc;
    double atol, rtol;
    vk_acc *acc;
    vk_win *win;
} vk_win_team;

static void win_task(void *p, int t) {
    vk_win_team *m = (vk_win_team *)p;
    if (m->win[t].window) memset(m->win[t].window, 0, (size_t)m->win[t].width * 8);
    if (vk_compare_win(m->a, m->b, m->dt, m->n, m->job, &m->next, m->atol, m->rtol, &m->acc[t], &m->win[t],
                       m->force_masked) != 0)
        __atomic_store_n(&m->rc, -1, __ATOMIC_RELAXED);
}

/* vk_compare_win on nthreads threads of the pool, thread t adding into acc[t] and win[t] (acc zeroed,
 * win set up by the caller; its window histogram is zeroed here, by its thread). Returns 0, or -1 for
 * bad arguments. */
int vk_compare_win_par(const void *a, const void *b, int dt, int64_t n, int64_t job, double atol, double rtol,
                       vk_acc *acc, vk_win *win, int nthreads, int force_masked) {
    if (nthreads < 1) return -1;
    vk_win_team m = {a, b, dt, force_masked, n, job, 0, 0, atol, rtol, acc, win};
    pool_run(win_task, &m, nthreads);
    return (int)m.rc;
}

/* float32 second pass: bins the low 16 bits of the distances (finite in both) whose high bits equal
 * `bucket`. */
void vk_refine_f32(const void *a, const void *b, int64_t n, int64_t bucket, int64_t *low) {
    vk_win w = {(uint32_t)bucket << 16, 1u << 16, 0, 0, low, 0, 0, 0, 0};
    uint32_t dist[BLK];
    for (int64_t s0 = 0; s0 < n; s0 += BLK) {
        const int64_t m = n - s0 < BLK ? n - s0 : BLK;
        _Pragma("omp simd")
        for (int64_t j = 0; j < m; j++) {
            const int64_t i = s0 + j;
            const double xa = ld_f32(a, i), xb = ld_f32(b, i);
            const int both = ((xa - xa) == 0.0) & ((xb - xb) == 0.0);
            dist[j] = both ? ulp32(a, b, i) : NOT_A_DIST;
        }
        win_scan(dist, m, &w);
    }
}

/* The same for a list of exact distances (the in-window elements of a float32 bucket window). */
void vk_list_low(const uint32_t *list, int64_t n, int64_t bucket, int64_t *low) {
    for (int64_t i = 0; i < n; i++)
        if ((int64_t)(list[i] >> 16) == bucket) low[list[i] & 0xFFFF]++;
}

/* dst[i] += src[i]: combining the threads' histograms without torch's intra-op thread pool */
void vk_add_i64(int64_t *dst, const int64_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}
