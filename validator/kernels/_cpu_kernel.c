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
#include <stdint.h>
#include <string.h>

enum { DT_F64 = 0, DT_F32 = 1, DT_F16 = 2, DT_BF16 = 3, DT_E4M3 = 4, DT_E5M2 = 5 };

typedef struct {
    double s_aa, s_bb, s_ab, s_dd, s_ad, max_ad;
    int64_t n_both, n_pass, nf_a, nf_b, mismatch, max_ulp;
} vk_acc;

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

#define FAST_LOOP(LA, LB, ULP, HAS_ULP)                                                                   \
    _Pragma("omp simd reduction(+:saa,sbb,sab,sdd,sad,npass) reduction(max:mad)")                                  \
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
        if (HAS_ULP) {                                                                                    \
            const uint32_t u = ULP(pa, pb, i);                                                            \
            dist[j] = u;                                                                                  \
                    }                                                                                                 \
    }

#define MASKED_LOOP(LA, LB, ULP, HAS_ULP)                                                                 \
    _Pragma("omp simd reduction(+:saa,sbb,sab,sdd,sad,npass,nboth,nfa,nfb,mism) reduction(max:mad)")             \
    for (int64_t j = 0; j < m; j++) {                                                                     \
        const int64_t i = s0 + j;                                                                         \
        const double xa = LA(pa, i), xb = LB(pb, i);                                                      \
        const int fa = (xa - xa) == 0.0, fb = (xb - xb) == 0.0;                                           \
        const int both = fa & fb;                                                                         \
        const int same = (!fa) & (!fb) & ((xa == xb) | ((xa != xa) & (xb != xb)));                        \
        const double za = both ? xa : 0.0, zb = both ? xb : 0.0;                                          \
        const double d = zb - za, ad = fabs(d);                                                           \
        saa = fma(za, za, saa);                                                                           \
        sbb = fma(zb, zb, sbb);                                                                           \
        sab = fma(za, zb, sab);                                                                           \
        sdd = fma(d, d, sdd);                                                                             \
        sad += ad;                                                                                        \
        npass += (both & (ad <= atol + rtol * fabs(za))) + same;                                          \
        mad = ad > mad ? ad : mad;                                                                        \
        nboth += both;                                                                                    \
        nfa += !fa;                                                                                       \
        nfb += !fb;                                                                                       \
        mism += (!both) & (!same);                                                                        \
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
                FAST_LOOP(LA, LB, ULP, HAS_ULP)                                                           \
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
            acc->s_aa += saa;                                                                             \
            acc->s_bb += sbb;                                                                             \
            acc->s_ab += sab;                                                                             \
            acc->s_dd += sdd;                                                                             \
            acc->s_ad += sad;                                                                             \
            acc->max_ad = mad > acc->max_ad ? mad : acc->max_ad;                                          \
            acc->n_both += nboth;                                                                         \
            acc->n_pass += npass;                                                                         \
            acc->nf_a += nfa;                                                                             \
            acc->nf_b += nfb;                                                                             \
            acc->mismatch += mism;                                                                        \
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

/* float32 second pass: bins the low 16 bits of the distances (finite in both) whose high bits equal
 * `bucket`. */
void vk_refine_f32(const void *a, const void *b, int64_t n, int64_t bucket, int64_t *low) {
    const float *fa = (const float *)a, *fb = (const float *)b;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(fa[i]) || !isfinite(fb[i])) continue;
        uint32_t d = ulp32(a, b, i);
        if ((int64_t)(d >> 16) == bucket) low[d & 0xFFFF]++;
    }
}

/* dst[i] += src[i]: combining the threads' histograms without torch's intra-op thread pool */
void vk_add_i64(int64_t *dst, const int64_t *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}
