// The CUDA C path of validator.kernels.cuda (docs/performance.md, "CUDA kernel"), compiled at first
// use with NVRTC (torch.cuda._compile_kernel) for one element type and masking mode at a time:
//
//   DT      1 float32, 2 float16, 3 bfloat16, 4 float8_e4m3fn, 5 float8_e5m2 (both tensors the same)
//   MASKED  0: every element assumed finite (the host reruns with 1 when the sums come out non-finite)
//   NHEAD   window bins counted in shared memory (the rest go to global memory)
//   MINB    __launch_bounds__ minimum resident blocks of vk_main (caps its registers; 0: the compiler's)
//   CUDIAG  timing diagnostics only, never exact (see step())
//
// vk_sample: exact histograms of the distances of a sample (one tile of THREADS * VEC elements in each
//   stretch of SAMPLE_STRIDE whole tiles, at a hashed offset: sample_tile); its last block turns them
//   into the window [lo, lo + wn) that should hold the p99
//   (the rule of validator.kernels._finish.p99_window, with the sample ranks computed on the host).
// vk_main: the one full pass. Float64 sums (explicit fma; built with --fmad=false so that the
//   tolerance test atol + rtol*|a| rounds like the reference), max |d|, pass count, max ULP, the count
//   of distances at or above the window's start and the exact histogram of those inside it. The
//   integer ALU is the busiest pipe (docs/performance.md, "Where the GPU time goes"): the step has no
//   branch per element, measures ULP distances without unpacking, and leaves the window histogram to
//   a rare path per 16-byte vector. Each block writes its totals to its own row; the last block to
//   finish reduces the rows in a fixed order and finds the p99 in the window (or -1 when its rank
//   lies outside: the host then runs the full histograms).
//
// out[16]: 0-4 sums of a^2, b^2, ab, d^2, |d|; 5 max |d|; 6 passed; 7 max ULP; 8 finite in both;
//   9, 10 non-finite in a, in b; 11 mismatches; 12 p99 or -1; 13 rank; 14 count below the window.

#ifndef CUDIAG
#define CUDIAG 0 /* timing diagnostics only (never exact): see step() */
#endif

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define FINE 65536
#define NPART 16
#define NSUP 1024 /* window bins NHEAD.. : their >> 10 totals */
#define THREADS 256

#if DT == 1
#define EB 4
#elif DT == 2 || DT == 3
#define EB 2
#else
#define EB 1
#endif
#define VEC (16 / EB)          /* elements per 16-byte vector */
#define PER_WORD (4 / EB)      /* elements per 32-bit word */
#define EMASK ((EB == 4) ? 0xFFFFFFFFu : ((1u << (8 * EB)) - 1u))

__device__ __forceinline__ double to_f64(u32 bits) {
#if DT == 1
    return (double)__uint_as_float(bits);
#elif DT == 3
    return (double)__uint_as_float(bits << 16);
#elif DT == 2 || DT == 5
    float f;
    unsigned short h = (unsigned short)(DT == 2 ? bits : (bits << 8)); /* e5m2: the top byte of a float16 */
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return (double)f;
#else /* e4m3fn: bias 7, no infinities, S.1111.111 is NaN */
    const u32 e = (bits >> 3) & 0xF, m = bits & 7;
    float f;
    if ((bits & 0x7F) == 0x7F)
        f = __uint_as_float(0x7FC00000u);
    else if (e == 0)
        f = (float)m * 0.001953125f; /* m * 2**-9, exact */
    else
        f = __uint_as_float(((e + 120u) << 23) | (m << 20));
    return (bits & 0x80) ? -(double)f : (double)f;
#endif
}

/* |ord(a) - ord(b)|, ord putting the bit patterns on the monotonic integer line (-0.0 and +0.0 both 0):
 * for equal signs the difference of the raw patterns, for opposite signs the sum of the magnitudes. */
#if EB == 4
#define SIGN 0x80000000u
#elif EB == 2
#define SIGN 0x8000u
#else
#define SIGN 0x80u
#endif
__device__ __forceinline__ u32 ulp_dist(u32 a, u32 b) {
    return ((a ^ b) & SIGN) ? a + b - SIGN : (a > b ? a - b : b - a);
}

struct Acc {
    double aa, bb, ab, dd, ad, mad;
    u32 pass, mulp, above, both, nfa, nfb, mis;
};

/* The window [lo, lo + wn), and the same bounds on the step's distance scale (lo_k, wn_k: key_dist). */
struct Win {
    u32 lo, wn, lo_k, wn_k;
};

__device__ __forceinline__ void window_add(u32 *sh, u32 *wbig, u32 *wsup, u32 u) {
    if (u < NHEAD)
        atomicAdd(sh + u, 1u);
    else {
        atomicAdd(wbig + u, 1u);
        atomicAdd(wsup + (u >> 10), 1u);
    }
}

/* c += x <= y, and m = x when |x| > |m| ignoring NaN (unmasked passes rerun masked when a sum is not
 * finite; the caller takes |m| at the end): a compare and a predicated add or move, where the C forms
 * compile to selects and register moves. max_abs_into keeps the signed value, so that |x| is never
 * materialised: ptxas folds both abs into the compare's operands (one float64 add less per element). */
__device__ __forceinline__ void count_le(u32 &c, double x, double y) {
    asm("{\n .reg .pred p;\n setp.le.f64 p, %1, %2;\n @p add.u32 %0, %0, 1;\n}" : "+r"(c) : "d"(x), "d"(y));
}
__device__ __forceinline__ void max_abs_into(double &m, double x) {
    asm("{\n .reg .pred p;\n .reg .f64 t, u;\n abs.f64 t, %1;\n abs.f64 u, %0;\n setp.gt.f64 p, t, u;\n"
        " @p mov.f64 %0, %1;\n}"
        : "+d"(m)
        : "d"(x));
}

/* The step's ULP distance, on a scale where the comparisons need no unpacking: 16- and 8-bit patterns
 * are shifted to the top of a word (KSH bits; for bfloat16 that word is the float32 the conversion
 * makes anyway) and put on the monotonic line by key ^ (sign ? 0x7FFFFFFF : 0), which maps -x to
 * -(x << KSH) - 1. A distance comes out as d << KSH, plus 1 for opposite signs, below 2**32: exact
 * as the unsigned |oa - ob| (one VABSDIFF). The max ULP is that >> KSH; the window's bounds are
 * shifted the same way (vk_main's prologue). float32 keeps ulp_dist (KSH 0). */
#define KSH (EB < 4 ? 32 - 8 * EB : 0)
__device__ __forceinline__ u32 key_dist(u32 a, u32 b) {
#if KSH == 0
    return ulp_dist(a, b);
#else
    const int ka = (int)(a << KSH), kb = (int)(b << KSH);
    const int oa = ka ^ ((ka >> 31) & 0x7FFFFFFF), ob = kb ^ ((kb >> 31) & 0x7FFFFFFF);
    return __sad(oa, ob, 0u);
#endif
}

/* One element pair, given by its bits: everything but the window histogram. ``hit`` is set when the
 * distance falls in the window; the caller then runs rare_one over the flagged vector. */
__device__ __forceinline__ void step(Acc &s, u32 ab_, u32 bb_, double atol, double rtol, const Win &w, bool &hit) {
    double xa = to_f64(ab_), xb = to_f64(bb_);
#if MASKED
    const bool fa = fabs(xa) <= 1.7976931348623157e308, fb = fabs(xb) <= 1.7976931348623157e308;
    const bool both = fa && fb;
    const bool same = !fa && !fb && (xa == xb || (xa != xa && xb != xb));
    if (!both) {
        xa = 0.0;
        xb = 0.0;
    }
    s.both += both;
    s.nfa += !fa;
    s.nfb += !fb;
    s.mis += !both && !same;
#endif
#if CUDIAG == 4 /* timing only: the loads alone */
    s.pass += (ab_ ^ bb_) & 1;
    return;
#endif
#if CUDIAG != 10 /* 10, timing only: no float64 work */
    const double d = xb - xa, ad = fabs(d);
#if CUDIAG != 11 /* 11, timing only: no sums of products */
    s.aa = fma(xa, xa, s.aa);
    s.bb = fma(xb, xb, s.bb);
    s.ab = fma(xa, xb, s.ab);
    s.dd = fma(d, d, s.dd);
#endif
    s.ad += ad;
#if CUDIAG != 7 /* 7, timing only: no max |d| */
    max_abs_into(s.mad, d); /* |s.mad| is the max |d| */
#endif
#if MASKED
    s.pass += (both && ad <= atol + rtol * fabs(xa)) || same;
    if (!both) return;
#elif CUDIAG != 6 /* 6, timing only: no tolerance test */
    count_le(s.pass, ad, atol + rtol * fabs(xa));
#endif
#endif
#if CUDIAG != 9 /* 9, timing only: no ULP work */
    const u32 dist = key_dist(ab_, bb_);
    s.mulp = max(s.mulp, dist);
    /* u = dist - lo_k, and s.above += dist >= lo_k from the same subtraction's carry flag. PTX
     * describes sub.cc's flag as a borrow; ptxas (NVRTC of CUDA 13, the H200 runs) leaves the
     * adder's carry there, which addc adds: "no borrow". Were that to flip, the count would be the
     * below-count and every call would fall back to the full pass (exact, slow):
     * tests/validator/test_cuda_window.py asserts that 16- and 8-bit pairs take no fallback. */
    u32 u;
    asm("sub.cc.u32 %0, %2, %3;\n addc.u32 %1, %1, 0;" : "=r"(u), "+r"(s.above) : "r"(dist), "r"(w.lo_k));
    hit |= u < w.wn_k; /* u wraps past wn_k when dist < lo_k */
#endif
}

/* the rare path of one element pair: its distance added to the window histogram when it lies there */
__device__ __forceinline__ void rare_one(u32 x, u32 y, const Win &w, u32 *sh, u32 *wbig, u32 *wsup) {
    const u32 dist = key_dist(x, y);
    if (dist - w.lo_k >= w.wn_k) return;
#if MASKED /* a non-finite pair has no distance */
    if (!(fabs(to_f64(x)) <= 1.7976931348623157e308 && fabs(to_f64(y)) <= 1.7976931348623157e308)) return;
#endif
    window_add(sh, wbig, wsup, (dist >> KSH) - w.lo);
}

/* one 16-byte vector pair: every element's step, then, when one was flagged (rare), the window adds */
__device__ __forceinline__ void step_vec(Acc &s, const uint4 &ra, const uint4 &rb, double atol, double rtol,
                                         const Win &w, u32 *sh, u32 *wbig, u32 *wsup) {
    const u32 wa[4] = {ra.x, ra.y, ra.z, ra.w}, wb[4] = {rb.x, rb.y, rb.z, rb.w};
    bool hit = false;
#pragma unroll
    for (int q = 0; q < 4; q++)
#pragma unroll
        for (int k = 0; k < PER_WORD; k++)
            step(s, (wa[q] >> (8 * EB * k)) & EMASK, (wb[q] >> (8 * EB * k)) & EMASK, atol, rtol, w, hit);
    if (__builtin_expect(hit, 0))
        for (int q = 0; q < 4; q++)
            for (int k = 0; k < PER_WORD; k++)
                rare_one((wa[q] >> (8 * EB * k)) & EMASK, (wb[q] >> (8 * EB * k)) & EMASK, w, sh, wbig, wsup);
}

__device__ __forceinline__ u32 load_bits(const unsigned char *p, i64 i) {
#if EB == 4
    return ((const u32 *)p)[i];
#elif EB == 2
    return ((const unsigned short *)p)[i];
#else
    return p[i];
#endif
}

/* ---------------------------------------------------------------- block-wide helpers */

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
    return v;
}
__device__ __forceinline__ double warp_max(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_down_sync(0xFFFFFFFFu, v, o));
    return v;
}

/* Sum (or max, for the columns in max_mask) of NPART values over the block, in a fixed order; the
 * result is valid in thread 0. red: shared scratch of THREADS/32 * NPART doubles. */
__device__ void block_reduce(double *v, double *red, u32 max_mask) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < NPART; j++) {
        const double r = ((max_mask >> j) & 1) ? warp_max(v[j]) : warp_sum(v[j]);
        if (lane == 0) red[warp * NPART + j] = r;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int j = 0; j < NPART; j++) {
            double r = red[j];
            for (int w = 1; w < THREADS / 32; w++)
                r = ((max_mask >> j) & 1) ? fmax(r, red[w * NPART + j]) : r + red[w * NPART + j];
            v[j] = r;
        }
    }
    __syncthreads();
}

/* Where two ranks fall in two histograms (or twice in one), in one pass: for j = 0, 1 the smallest
 * index i < nbins with prior[j] + cum(hist[j][0..i]) >= rank[j], or nbins when not reached; total[j]
 * gets the histogram's sum and before[j] prior[j] plus the sum of the bins before the one found.
 * nbins is a multiple of THREADS and at most FIND_PER * THREADS. Each bin is read once, into
 * registers: the thread whose stretch holds a rank walks its registers, so the latency of the last
 * block's search is one read and one scan (vk_sample's window needs two ranks; vk_main's p99 one).
 * tmp: 2 * THREADS / 32 shared int64. Every thread gets the results. */
#define FIND_PER 4
struct Found {
    i64 idx, total, before;
};
/* The thread whose bins (v, starting at bin `base`, with `run` counted before them and `inc` through
 * them) hold rank r writes the bin and the count before it to f[0], f[1]. */
__device__ __forceinline__ void find_walk(const u32 (&v)[FIND_PER], i64 run, i64 inc, i64 r, int base, i64 *f) {
    if (run < r && inc >= r) {
#pragma unroll
        for (int k = 0; k < FIND_PER; k++) {
            if (run + v[k] >= r) {
                f[0] = base + k;
                f[1] = run;
                break;
            }
            run += v[k];
        }
    }
}

__device__ void block_find2(const u32 *h0, const u32 *h1, int nbins, i64 r0, i64 r1, i64 p0, i64 p1, i64 *tmp,
                            Found *out) {
    const int per = nbins / THREADS, base = threadIdx.x * per;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 v0[FIND_PER], v1[FIND_PER];
    i64 m0 = 0, m1 = 0;
#pragma unroll
    for (int k = 0; k < FIND_PER; k++) {
        v0[k] = k < per ? __ldcg(h0 + base + k) : 0u;
        v1[k] = k < per ? __ldcg(h1 + base + k) : 0u;
        m0 += v0[k];
        m1 += v1[k];
    }
    i64 x0 = m0, x1 = m1; /* inclusive prefix sums: within the warp by shuffles, then over the warps */
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const i64 y0 = __shfl_up_sync(0xFFFFFFFFu, x0, o), y1 = __shfl_up_sync(0xFFFFFFFFu, x1, o);
        if (lane >= o) {
            x0 += y0;
            x1 += y1;
        }
    }
    if (lane == 31) {
        tmp[warp] = x0;
        tmp[THREADS / 32 + warp] = x1;
    }
    __syncthreads();
    for (int w = 0; w < warp; w++) {
        x0 += tmp[w];
        x1 += tmp[THREADS / 32 + w];
    }
    const i64 inc0 = x0 + p0, inc1 = x1 + p1;
    __shared__ i64 sf[6]; /* per rank: found, before, total */
    if (threadIdx.x == THREADS - 1) {
        sf[0] = nbins;
        sf[1] = inc0; /* not reached: every bin is before */
        sf[2] = inc0 - p0;
        sf[3] = nbins;
        sf[4] = inc1;
        sf[5] = inc1 - p1;
    }
    __syncthreads();
    find_walk(v0, inc0 - m0, inc0, r0, base, sf);
    find_walk(v1, inc1 - m1, inc1, r1, base, sf + 3);
    __syncthreads();
    out[0] = Found{sf[0], sf[2], sf[1]};
    out[1] = Found{sf[3], sf[5], sf[4]};
    __syncthreads();
}

/* block_find2 for one rank */
__device__ i64 block_find(const u32 *hist, int nbins, i64 rank, i64 prior, i64 *tmp, i64 *total, i64 *before) {
    Found f[2];
    block_find2(hist, hist, nbins, rank, rank, prior, prior, tmp, f);
    *total = f[0].total;
    *before = f[0].before;
    return f[0].idx;
}

/* ---------------------------------------------------------------- sample + window */

#define SMALLS 1024
#define LOWC 8 /* copies of the sample's bins below SMALLS, one per (block % LOWC) */
#define WHC 8  /* copies of vk_main's window bins below NHEAD, one per (block % WHC) */

// The sample: one tile of THREADS * VEC elements (one 16-byte vector per thread) in each stretch of
// `stride` whole tiles, at an offset hashed from the stretch's number. Tiles a fixed power-of-two
// distance apart all fell on a few memory channels: the sample read at about 1 TB/s.
// validator.kernels.cuda.sample_tiles computes the same tiles (the tests use it).
// fine: FINE + 1 bins (the last: FINE or more; allocated to 66 * 1024), sup: fine's >> 10 totals;
// coarse / csup: float32 only, distance >> 16 for distances of FINE or more, and its >> 10 totals.
// win: [lo, wn] (int64) and done: a zeroed counter.
/* Close tensors pile their distances into the lowest bins: distances 0..3 are counted in registers
 * (16-bit fields of `few`, per thread), the rest with shared or global atomics. (A warp-wide match
 * before every add, to add equal distances once, kept the memory-instruction pipe busy: Nsight
 * Compute, docs/results/stop13/ncu.) Distances of 4 or more that many lanes share (a pair whose
 * every element is off by the same few ULPs) serialise on one shared bin: slower, still exact. */
__device__ __forceinline__ void sample_add(u32 *sh, u32 *fine, u32 *sup, u32 *coarse, u32 *csup, u64 &few, u32 d) {
    if (d < 4) {
        few += 1ull << (16 * d);
    } else if (d < SMALLS) {
        atomicAdd(sh + d, 1u);
    } else {
        const u32 f = d < FINE ? d : FINE;
        atomicAdd(fine + f, 1u);
        atomicAdd(sup + (f >> 10), 1u);
#if EB == 4
        if (d >= FINE) {
            atomicAdd(coarse + (d >> 16), 1u);
            atomicAdd(csup + (d >> 26), 1u);
        }
#endif
    }
}

__device__ __forceinline__ u32 sample_tile(u32 g, u32 stride, u32 n_full) {
    u32 h = g * 0x9E3779B1u;
    h ^= h >> 16;
    return g * stride + h % min(stride, n_full - g * stride); /* the last stretch may be short */
}

extern "C" __global__ void __launch_bounds__(THREADS)
    vk_sample(const unsigned char *a, const unsigned char *b, int n_tiles, int stride, int n_full, u32 *fine, u32 *sup,
              u32 *coarse, u32 *csup, u32 *lowc, i64 *win, u32 *done, int r_lo, int r_hi, int wmax) {
    __shared__ u32 sh[SMALLS];
    __shared__ i64 tmp[2 * THREADS / 32];
    __shared__ bool last;
    for (int i = threadIdx.x; i < SMALLS; i += THREADS) sh[i] = 0;
    __syncthreads();
    const uint4 *va = (const uint4 *)a, *vb = (const uint4 *)b;
    /* a field counts at most VEC elements per tile: below 2**16 with 4 blocks or more (2**31 elements) */
    u64 few = 0;
    for (int t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const i64 v = (i64)sample_tile(t, stride, n_full) * THREADS + threadIdx.x;
        const uint4 ra = __ldcs(va + v), rb = __ldcs(vb + v);
        const u32 wa[4] = {ra.x, ra.y, ra.z, ra.w}, wb[4] = {rb.x, rb.y, rb.z, rb.w};
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int k = 0; k < PER_WORD; k++)
                sample_add(sh, fine, sup, coarse, csup, few,
                           ulp_dist((wa[q] >> (8 * EB * k)) & EMASK, (wb[q] >> (8 * EB * k)) & EMASK));
    }
#pragma unroll
    for (int j = 0; j < 4; j++) { /* the register counts: summed over the warp, one add per bin */
        u32 c = (u32)(few >> (16 * j)) & 0xFFFFu;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) c += __shfl_down_sync(0xFFFFFFFFu, c, o);
        if ((threadIdx.x & 31) == 0 && c) atomicAdd(sh + j, c);
    }
    __syncthreads();
    /* The block's bins below SMALLS go to one of LOWC copies: every block adding into the same few hot
     * bins of one histogram serialised the sample on those addresses. The last block merges them. */
    u32 *mine = lowc + (blockIdx.x % LOWC) * SMALLS;
    for (int i = threadIdx.x; i < SMALLS; i += THREADS)
        if (sh[i]) atomicAdd(mine + i, sh[i]);
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* the merge: fine's bins below SMALLS (no block adds there) and their total, sup[0] */
    i64 low = 0;
    for (int i = threadIdx.x; i < SMALLS; i += THREADS) {
        u32 c = 0;
#pragma unroll
        for (int k = 0; k < LOWC; k++) c += __ldcg(lowc + k * SMALLS + i);
        fine[i] = c;
        low += c;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) low += __shfl_down_sync(0xFFFFFFFFu, low, o);
    if ((threadIdx.x & 31) == 0) tmp[threadIdx.x >> 5] = low;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < THREADS / 32; w++) low += tmp[w];
        sup[0] = (u32)low;
    }
    __threadfence();
    __syncthreads();
    /* the window: sampled distances of ranks r_lo and r_hi (beyond the fine range: bucket edges),
     * both searched at once: the >> 10 totals (256 >= the 65 used), then the two fine stretches */
    i64 bound[2];
    Found fs[2], ff[2];
    block_find2(sup, sup, 256, r_lo, r_hi, 0, 0, tmp, fs);
    const i64 k0 = fs[0].idx < 65 ? fs[0].idx : 0, k1 = fs[1].idx < 65 ? fs[1].idx : 0;
    block_find2(fine + k0 * 1024, fine + k1 * 1024, 1024, r_lo, r_hi, fs[0].before, fs[1].before, tmp, ff);
    for (int w = 0; w < 2; w++) {
        const i64 rank = w == 0 ? r_lo : r_hi;
        const i64 k = fs[w].idx;
        i64 v = 0;
        if (rank >= 1 && k < 65) v = k * 1024 + ff[w].idx;
#if EB == 4
        if (rank >= 1 && v >= FINE) {
            const i64 total = fs[w].total;
            i64 cbefore, t2, b2;
            const i64 ck = block_find(csup, 256, rank, total - __ldcg(fine + FINE), tmp, &t2, &cbefore);
            const i64 bucket = ck * 1024 + block_find(coarse + ck * 1024, 1024, rank, cbefore, tmp, &t2, &b2);
            v = w == 0 ? (bucket << 16) : ((bucket + 1) << 16);
        }
#endif
        bound[w] = v;
    }
    if (threadIdx.x == 0) {
        const i64 wn = bound[1] + 1 - bound[0];
        win[0] = bound[0];
        win[1] = wn <= wmax ? wn : 0;
    }
}

/* ---------------------------------------------------------------- the full pass */

// part: gridDim.x rows of NPART doubles; whead: NHEAD window bins; wbig (window bins NHEAD and up),
// wsup (their >> 10 totals, NSUP bins); done: a zeroed counter; out: NPART doubles.
__device__ __forceinline__ void main_loop(Acc &s, const unsigned char *a, const unsigned char *b, int n, double atol,
                                          double rtol, const Win &w, u32 *sh, u32 *wbig, u32 *wsup) {
    const uint4 *va = (const uint4 *)a, *vb = (const uint4 *)b;
    const u32 nvec = (u32)(n / VEC), stride = gridDim.x * THREADS; /* 32-bit indices: fewer instructions */
    for (u32 v = blockIdx.x * THREADS + threadIdx.x; v < nvec; v += stride)
        step_vec(s, __ldcs(va + v), __ldcs(vb + v), atol, rtol, w, sh, wbig, wsup);
    if (blockIdx.x == gridDim.x - 1) /* the last n % VEC elements */
        for (i64 i = (i64)nvec * VEC + threadIdx.x; i < n; i += THREADS) {
            bool hit = false;
            const u32 x = load_bits(a, i), y = load_bits(b, i);
            step(s, x, y, atol, rtol, w, hit);
            if (hit) rare_one(x, y, w, sh, wbig, wsup);
        }
}

#if MINB > 0 /* a promise of resident blocks caps the registers; 0: the compiler's choice */
#define MAIN_BOUNDS __launch_bounds__(THREADS, MINB)
#else
#define MAIN_BOUNDS __launch_bounds__(THREADS)
#endif
// The workspace cleans up after itself, so that a comparison needs no memset: vk_main zeroes the
// sample's histograms (szero: nzero words; the window is in win by then) and the sample's counter
// (done[0]); its last block zeroes the window histograms and its own counter (done[1]) once it has
// read them. The host zeroes everything only for a new workspace or after a failed call.
extern "C" __global__ void MAIN_BOUNDS
    vk_main(const unsigned char *a, const unsigned char *b, int n, const double *tol, const i64 *win, double *part,
            u32 *whead, u32 *wbig, u32 *wsup, u32 *done, double *out, u32 *szero, int nzero) {
    __shared__ u32 sh[NHEAD];
    __shared__ double red[THREADS / 32 * NPART];
    __shared__ i64 tmp[2 * THREADS / 32];
    __shared__ bool last;
    for (int i = threadIdx.x; i < NHEAD; i += THREADS) sh[i] = 0;
    for (int i = blockIdx.x * THREADS + threadIdx.x; i < nzero; i += gridDim.x * THREADS) szero[i] = 0;
    if (blockIdx.x == 0 && threadIdx.x == 0) done[0] = 0;
    __syncthreads();
    const double atol = tol[0], rtol = tol[1];
    const i64 lo64 = win[0], wn64 = win[1];
    /* distances are below 2**32; a window starting there or empty holds nothing */
    const u32 lo = lo64 > 0xFFFFFFFFll ? 0xFFFFFFFFu : (u32)lo64;
    const u32 wn = (u32)(wn64 > 0 ? wn64 : 0);
    Win w = {lo, wn, lo, wn};
#if KSH > 0 /* the step's scale (key_dist): distances are below lim, so the window is clipped there */
    const u32 lim = 1u << (8 * EB);
    if (lo >= lim) {
        w.lo_k = 0xFFFFFFFFu;
        w.wn_k = 0;
    } else {
        const u32 wc = min(wn, lim - lo);
        w.lo_k = lo << KSH;
        w.wn_k = wc >= lim ? 0xFFFFFFFFu : wc << KSH;
    }
#endif
    Acc s = {};
    main_loop(s, a, b, n, atol, rtol, w, sh, wbig, wsup);
    /* column 12: distances at or above the window's start (the p99 search wants those below) */
    double v[NPART] = {s.aa,           s.bb,          s.ab,          s.dd,           s.ad,          fabs(s.mad),
                       (double)s.pass, (double)(s.mulp >> KSH), (double)s.both, (double)s.nfa, (double)s.nfb,
                       (double)s.mis,  (double)s.above, 0,          0,              0};
    const u32 max_cols = (1u << 5) | (1u << 7);
    block_reduce(v, red, max_cols);
    if (threadIdx.x == 0)
        for (int j = 0; j < NPART; j++) part[(i64)blockIdx.x * NPART + j] = v[j];
    for (int i = threadIdx.x; i < NHEAD; i += THREADS)
        if (sh[i]) atomicAdd(whead + (blockIdx.x % WHC) * NHEAD + i, sh[i]); /* WHC copies: see below */
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(done + 1, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* the last block: every row, in a fixed order whichever block this is */
    double t[NPART];
    for (int j = 0; j < NPART; j++) t[j] = 0.0;
    for (int r = threadIdx.x; r < (int)gridDim.x; r += THREADS) {
        double2 row[NPART / 2];
#pragma unroll
        for (int j = 0; j < NPART / 2; j++) row[j] = __ldcg((const double2 *)(part + (i64)r * NPART) + j);
#pragma unroll
        for (int j = 0; j < NPART; j++) {
            const double x = (j & 1) ? row[j / 2].y : row[j / 2].x;
            t[j] = ((max_cols >> j) & 1) ? fmax(t[j], x) : t[j] + x;
        }
    }
    block_reduce(t, red, max_cols);
    __shared__ double tot[NPART];
    if (threadIdx.x == 0)
        for (int j = 0; j < NPART; j++) tot[j] = t[j];
    __syncthreads();
    const i64 n_both = MASKED ? (i64)tot[8] : (i64)n;
    const i64 below = n_both - (i64)tot[12];
    const i64 rank = (99 * n_both + 99) / 100;
    const i64 inside = rank - below;
    i64 h_tot, s_tot, b_tot, unused, before;
    /* The blocks added their window bins into WHC copies (by block % WHC): every block adding into the
     * same few hot bins of one histogram serialised on those addresses. Merged here into copy 0. */
    for (int i = threadIdx.x; i < NHEAD; i += THREADS) {
        u32 c = 0;
#pragma unroll
        for (int k = 0; k < WHC; k++) c += __ldcg(whead + k * NHEAD + i);
        whead[i] = c;
    }
    __threadfence();
    __syncthreads();
    const i64 ih = block_find(whead, NHEAD, inside, 0, tmp, &h_tot, &unused);
    i64 p99 = -1;
    if (n_both > 0 && inside >= 1) {
        if (inside <= h_tot)
            p99 = (i64)lo + ih;
        else {
            const i64 k = block_find(wsup, NSUP, inside, h_tot, tmp, &s_tot, &before);
            if (k < NSUP) {
                const i64 ib = block_find(wbig + k * 1024, 1024, inside, before, tmp, &b_tot, &unused);
                if (ib < 1024) p99 = (i64)lo + k * 1024 + ib;
            }
        }
    }
    if (threadIdx.x == 0) {
        for (int j = 0; j < 12; j++) out[j] = tot[j];
        if (!MASKED) out[8] = (double)n;
        out[12] = (double)p99;
        out[13] = (double)rank;
        out[14] = (double)below;
        out[15] = 0.0;
        done[1] = 0;
    }
    /* clean up for the next call: the window histograms (wbig only where a wide window used it) */
    for (int i = threadIdx.x; i < WHC * NHEAD; i += THREADS) whead[i] = 0;
    for (int i = threadIdx.x; i < NSUP; i += THREADS) wsup[i] = 0;
    for (u32 i = NHEAD + threadIdx.x; i < wn; i += THREADS) wbig[i] = 0;
}
