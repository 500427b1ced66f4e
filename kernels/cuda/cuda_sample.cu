/* kernels/cuda/cuda_sample.cu — the `sample` op: a token per row drawn on the device with the
 * host sampler's steps 3-7 (kernels/backend.h; the CPU reference: kernels/cpu/cpu_sample.c).
 * One block of 1024 threads per row; rows with different parameters share one launch (the
 * parameters go up as one small copy into a persistent buffer).
 *
 * A row:
 *   - temperature 0: the argmax op's reduction (the lowest index on ties, NaN never chosen);
 *   - v = l * f32(1/T) (one rounding, as the host), keys = the f32 bits mapped to an unsigned
 *     order (+0 for -0, so equal values tie on the index like the host's comparisons);
 *   - top-k: the k-th largest key by a 4-pass radix select (8-bit digits, integer histograms in
 *     shared memory); ties at the boundary keep the lowest indices (a second radix select on the
 *     index among the boundary key's tokens);
 *   - k <= SAMPLE_CAP (1024): the k candidates go to shared memory, are sorted by (value desc,
 *     index asc), top-p and min-p are taken on that list, the kept ones sorted by index, and one
 *     thread sums and walks them in ascending id: the host's order, so the total and the walk are
 *     bit-identical to the host's given the same masses;
 *   - otherwise (no top-k, or k > SAMPLE_CAP): top-p is a binary search on the key for the largest
 *     threshold whose mass (over the top-k set) reaches top_p * total (block-wide deterministic
 *     sums, up to 32 passes over the row), the boundary key's ties again cut by index; min-p is a
 *     per-token test; the walk is in ascending id over the whole row, 32 warps each owning a
 *     contiguous range (its sum, then a warp scan over 32 tokens at a time in the crossing warp).
 * Every sum is in double and in a fixed order, so a row's token does not depend on the launch.
 *
 * Where the host and the device may differ (rounding only): CUDA's expf and the host's may differ
 * in the last place; the total top-p takes its target from and the top-p prefix sums are added in
 * rank order here (the host: the order its quickselect leaves); without gathered candidates the
 * total and the walk are partial sums per warp.
 *
 * Known limits: the binary-search path reads the row up to ~40 times (expf each time): a request
 * with top-p and no top-k (or top-k > 1024) costs ~1 ms per 256 rows of a 128K vocabulary on an
 * H200-class GPU (estimate, not measured). Rows whose largest scaled logit is not finite, or with
 * NaN logits, are only defined for temperature 0.
 */
#include <math.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"

#include "kernels/sample_rng.h"

#define SAMPLE_THREADS 1024
#define SAMPLE_CAP 1024           /* largest top-k gathered into shared memory */
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)

/* f32 -> an unsigned key in the same order (-0 as +0; NaN never asked). */
__device__ __forceinline__ uint32_t dev_fkey(float f)
{
    if (f == 0.0f)
        f = 0.0f;
    const uint32_t b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float dev_fkey_value(uint32_t k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* Shared state of one row's block. */
struct sample_smem {
    uint32_t ckey[SAMPLE_CAP];    /* candidates: key (value), then index order */
    int32_t cidx[SAMPLE_CAP];
    float cmass[SAMPLE_CAP];
    uint32_t hist[256];
    double dsum[SAMPLE_WARPS];
    uint32_t usum[SAMPLE_WARPS];
    uint32_t bcast[4];
    int ncand;
    double dbcast;
    int ibcast[4];
};

/* Block-wide sums in a fixed order (thread's strided partial, warp xor tree, warps 0..31 in
 * order): deterministic. Every thread gets the total. */
__device__ double dev_bsum_d(sample_smem &s, double v)
{
    v = dev_warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        s.dsum[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0;
    for (int w = 0; w < SAMPLE_WARPS; w++)
        t += s.dsum[w];
    return t;
}
__device__ uint32_t dev_bsum_u(sample_smem &s, uint32_t v)
{
    v = dev_warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        s.usum[threadIdx.x >> 5] = v;
    __syncthreads();
    uint32_t t = 0;
    for (int w = 0; w < SAMPLE_WARPS; w++)
        t += s.usum[w];
    return t;
}
__device__ float dev_bmax(sample_smem &s, float v)
{
    v = dev_warp_max(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        s.dsum[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int w = 0; w < SAMPLE_WARPS; w++)
        t = fmaxf(t, (float)s.dsum[w]);
    return t;
}

/* The rank-th largest (rank >= 1) key among the row's tokens: mode 0 the value keys of every
 * token; mode 1 the key ~i of the tokens whose value key is eqkey (the rank-th smallest index).
 * Four passes of 8-bit digits; integer histograms, so the result is exact. */
__device__ uint32_t dev_radix_select(sample_smem &s, const float *r, int N, float inv_t, int mode, uint32_t eqkey,
                                     uint32_t rank)
{
    uint32_t prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x)
            s.hist[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < N; i += blockDim.x) {
            const uint32_t vk = dev_fkey(__fmul_rn(r[i], inv_t));
            uint32_t key;
            if (mode == 0)
                key = vk;
            else if (vk == eqkey)
                key = ~(uint32_t)i;
            else
                continue;
            if ((key & mask) == prefix)
                atomicAdd(&s.hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint32_t acc = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (acc + s.hist[b] >= rank)
                    break;
                acc += s.hist[b];
            }
            s.bcast[0] = prefix | ((uint32_t)b << shift);
            s.bcast[1] = rank - acc;
        }
        __syncthreads();
        prefix = s.bcast[0];
        rank = s.bcast[1];
        mask |= 255u << shift;
        __syncthreads();
    }
    return prefix;
}

/* Bitonic sort of the first P (a power of two <= SAMPLE_CAP) candidates: by (key desc, index asc)
 * when by_rank, else by index ascending. cmass travels with its entry. */
__device__ void dev_bitonic(sample_smem &s, int P, int by_rank)
{
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            __syncthreads();
            const int i = threadIdx.x, j = i ^ stride;
            if (i < P && j > i) {
                const int up = (i & size) == 0;
                const uint32_t ki = s.ckey[i], kj = s.ckey[j];
                const int32_t ii = s.cidx[i], ij = s.cidx[j];
                const int j_first = by_rank ? (kj > ki || (kj == ki && ij < ii)) : (ij < ii);
                if (j_first == up) {
                    s.ckey[i] = kj, s.ckey[j] = ki;
                    s.cidx[i] = ij, s.cidx[j] = ii;
                    const float m = s.cmass[i];
                    s.cmass[i] = s.cmass[j], s.cmass[j] = m;
                }
            }
        }
    __syncthreads();
}

__device__ void dev_row_argmax(sample_smem &s, const float *r, int N, int32_t *out)
{
    float bv = -INFINITY;
    int bi = 0, found = 0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) {   /* ascending i: strict > keeps the lowest index */
        const float v = r[i];
        if (v != v)
            continue;
        if (!found || v > bv) {
            bv = v;
            bi = i;
            found = 1;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        const float ov = __shfl_down_sync(0xffffffffu, bv, off);
        const int oi = __shfl_down_sync(0xffffffffu, bi, off), of = __shfl_down_sync(0xffffffffu, found, off);
        if (of && (!found || ov > bv || (ov == bv && oi < bi))) {
            bv = ov;
            bi = oi;
            found = 1;
        }
    }
    if ((threadIdx.x & 31) == 0) {
        s.cmass[threadIdx.x >> 5] = bv;
        s.cidx[threadIdx.x >> 5] = bi;
        s.ckey[threadIdx.x >> 5] = (uint32_t)found;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float tv = -INFINITY;
        int ti = 0, tf = 0;
        for (int w = 0; w < SAMPLE_WARPS; w++) {
            const float ov = s.cmass[w];
            const int oi = s.cidx[w], of = (int)s.ckey[w];
            if (of && (!tf || ov > tv || (ov == tv && oi < ti))) {
                tv = ov;
                ti = oi;
                tf = 1;
            }
        }
        *out = tf ? ti : 0;                        /* an all-NaN row gives 0 */
    }
}

__global__ void __launch_bounds__(SAMPLE_THREADS) k_sample(const float *logits, int N, const bk_sample_t *params, int32_t *out)
{
    DEV_PDL_ENTER();
    __shared__ sample_smem s;
    const float *r = logits + (int64_t)blockIdx.x * N;
    const bk_sample_t p = params[blockIdx.x];
    const int tid = threadIdx.x;
    if (p.temperature == 0) {
        dev_row_argmax(s, r, N, out + blockIdx.x);
        return;
    }
    const float inv_t = (float)(1.0 / p.temperature);
    float lmax = -INFINITY;
    for (int i = tid; i < N; i += blockDim.x)
        lmax = fmaxf(lmax, __fmul_rn(r[i], inv_t));
    const float mx = dev_bmax(s, lmax);
    const float floor_mass = (float)p.min_p;
    const double u = sample_rng_uniform(p.seed, p.step);

    /* Top-k: in the set when key > kkey, or key == kkey and i <= kcut. */
    const int k = p.top_k > 0 && p.top_k < N ? p.top_k : N;
    uint32_t kkey = 0;
    int kcut = 0x7fffffff;
    if (k < N) {
        kkey = dev_radix_select(s, r, N, inv_t, 0, 0, (uint32_t)k);
        uint32_t gt = 0, eq = 0;
        for (int i = tid; i < N; i += blockDim.x) {
            const uint32_t vk = dev_fkey(__fmul_rn(r[i], inv_t));
            gt += vk > kkey;
            eq += vk == kkey;
        }
        gt = dev_bsum_u(s, gt);
        eq = dev_bsum_u(s, eq);
        if (eq > (uint32_t)k - gt)
            kcut = (int)~dev_radix_select(s, r, N, inv_t, 1, kkey, (uint32_t)k - gt);
    }

    if (k <= SAMPLE_CAP) {
        /* ---- the candidates in shared memory ---- */
        if (tid == 0)
            s.ncand = 0;
        __syncthreads();
        for (int i = tid; i < N; i += blockDim.x) {
            const uint32_t vk = dev_fkey(__fmul_rn(r[i], inv_t));
            if (vk > kkey || (vk == kkey && i <= kcut)) {
                const int at = atomicAdd(&s.ncand, 1);
                s.ckey[at] = vk;
                s.cidx[at] = i;
            }
        }
        __syncthreads();
        int P = 1;
        while (P < k)
            P <<= 1;
        for (int j = k + tid; j < P; j += blockDim.x) {
            s.ckey[j] = 0;                         /* below every value's key: last in rank order */
            s.cidx[j] = 0x7fffffff;
        }
        dev_bitonic(s, P, 1);
        for (int j = tid; j < k; j += blockDim.x)
            s.cmass[j] = expf(__fsub_rn(dev_fkey_value(s.ckey[j]), mx));
        __syncthreads();
        if (tid == 0) {
            int c = k;
            if (p.top_p < 1.0 && k > 1) {
                double total = 0;
                for (int j = 0; j < k; j++)
                    total += s.cmass[j];
                const double target = p.top_p * total;
                double acc = 0;
                for (int j = 0; j < k; j++) {
                    acc += s.cmass[j];
                    if (acc >= target) {
                        c = j + 1;
                        break;
                    }
                }
            }
            s.ibcast[0] = c;
        }
        __syncthreads();
        const int c = s.ibcast[0];
        /* min-p, then the kept entries first in index order (the others sort last). */
        for (int j = tid; j < P; j += blockDim.x)
            if (!(j < c && s.cmass[j] >= floor_mass))
                s.cidx[j] = 0x7fffffff;
        dev_bitonic(s, P, 0);
        if (tid == 0) {
            double total = 0;
            int n = 0;
            for (; n < P && s.cidx[n] != 0x7fffffff; n++)
                total += s.cmass[n];
            const double target = u * total;
            double acc = 0;
            int tok = -1, last = s.cidx[0];
            for (int j = 0; j < n; j++) {
                if (s.cmass[j] > 0)
                    last = s.cidx[j];
                acc += s.cmass[j];
                if (acc > target) {
                    tok = s.cidx[j];
                    break;
                }
            }
            out[blockIdx.x] = tok >= 0 ? tok : last;
        }
        return;
    }

    /* ---- the whole row: top-p by a threshold search on the key ---- */
    uint32_t pkey = 0;
    int pcut = 0x7fffffff;
    if (p.top_p < 1.0 && k > 1) {
        double part = 0;
        for (int i = tid; i < N; i += blockDim.x) {
            const float v = __fmul_rn(r[i], inv_t);
            const uint32_t vk = dev_fkey(v);
            if (vk > kkey || (vk == kkey && i <= kcut))
                part += expf(__fsub_rn(v, mx));
        }
        const double target = p.top_p * dev_bsum_d(s, part);
        /* The largest key T with mass(top-k set, key >= T) >= target: S(lo) >= target always
         * (S(0) = the total), S(hi) < target (hi above the largest key: empty). */
        uint64_t lo = 0, hi = (uint64_t)dev_fkey(mx) + 1;
        double s_hi = 0;                           /* S(hi) */
        while (hi - lo > 1) {
            const uint32_t mid = (uint32_t)((lo + hi) / 2);
            double sp = 0;
            for (int i = tid; i < N; i += blockDim.x) {
                const float v = __fmul_rn(r[i], inv_t);
                const uint32_t vk = dev_fkey(v);
                if (vk >= mid && (vk > kkey || (vk == kkey && i <= kcut)))
                    sp += expf(__fsub_rn(v, mx));
            }
            sp = dev_bsum_d(s, sp);
            if (sp >= target)
                lo = mid;
            else
                hi = mid, s_hi = sp;
        }
        pkey = (uint32_t)lo;
        /* S(hi) is the mass above pkey only when hi == pkey + 1, which the loop ends with. */
        uint32_t eq = 0;
        for (int i = tid; i < N; i += blockDim.x) {
            const uint32_t vk = dev_fkey(__fmul_rn(r[i], inv_t));
            eq += vk == pkey && (vk > kkey || (vk == kkey && i <= kcut));
        }
        eq = dev_bsum_u(s, eq);
        if (eq > 1) {
            /* Equal values have equal masses: the boundary group keeps its lowest indices, as many
             * as the running sum needs. */
            const double m = expf(__fsub_rn(dev_fkey_value(pkey), mx));
            double acc = s_hi;
            uint32_t j = 0;
            while (j < eq && acc < target) {
                acc += m;
                j++;
            }
            if (j == 0)
                j = 1;
            if (j < eq)
                pcut = (int)~dev_radix_select(s, r, N, inv_t, 1, pkey, j);
        }
    }

    /* ---- the walk in ascending id: warp w owns [w*C, (w+1)*C) ---- */
    const int lane = tid & 31, warp = tid >> 5, C = (N + SAMPLE_WARPS - 1) / SAMPLE_WARPS;
    const int lo_i = warp * C, hi_i = min(N, lo_i + C);
    double ws = 0;
    for (int i = lo_i + lane; i < hi_i; i += 32) {
        const float v = __fmul_rn(r[i], inv_t);
        const uint32_t vk = dev_fkey(v);
        const float mass = expf(__fsub_rn(v, mx));
        if ((vk > kkey || (vk == kkey && i <= kcut)) && (vk > pkey || (vk == pkey && i <= pcut)) && mass >= floor_mass)
            ws += mass;
    }
    ws = dev_warp_sum(ws);
    if (lane == 0)
        s.dsum[warp] = ws;
    __syncthreads();
    if (tid == 0) {
        double total = 0;
        for (int w = 0; w < SAMPLE_WARPS; w++)
            total += s.dsum[w];
        const double target = u * total;
        double acc = 0;
        int cw = -1, lastw = 0;
        for (int w = 0; w < SAMPLE_WARPS; w++) {
            if (s.dsum[w] > 0)
                lastw = w;
            if (cw < 0 && acc + s.dsum[w] > target) {
                cw = w;
                break;
            }
            acc += s.dsum[w];
        }
        if (cw < 0) {
            cw = lastw;
            acc = 0;
            for (int w = 0; w < cw; w++)
                acc += s.dsum[w];
        }
        s.ibcast[0] = cw;
        s.dbcast = acc;
        s.bcast[0] = 0;
        s.ibcast[1] = 0;
        s.dsum[0] = target;                        /* read below, after the barrier */
    }
    __syncthreads();
    if (warp != s.ibcast[0])
        return;
    const double target = s.dsum[0];
    double base = s.dbcast;
    int last = -1, tok = -1;
    for (int t0 = lo_i; t0 < hi_i && tok < 0; t0 += 32) {
        const int i = t0 + lane;
        double m = 0;
        if (i < hi_i) {
            const float v = __fmul_rn(r[i], inv_t);
            const uint32_t vk = dev_fkey(v);
            const float mass = expf(__fsub_rn(v, mx));
            if ((vk > kkey || (vk == kkey && i <= kcut)) && (vk > pkey || (vk == pkey && i <= pcut)) && mass >= floor_mass)
                m = mass;
        }
        double incl = m;                           /* inclusive scan over the lanes */
        for (int off = 1; off < 32; off <<= 1) {
            const double o = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off)
                incl += o;
        }
        const unsigned cross = __ballot_sync(0xffffffffu, m > 0 && base + incl > target);
        const unsigned pos = __ballot_sync(0xffffffffu, m > 0);
        if (cross)
            tok = t0 + __ffs(cross) - 1;
        else if (pos)
            last = t0 + 31 - __clz(pos);
        base += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0)
        out[blockIdx.x] = tok >= 0 ? tok : last >= 0 ? last : lo_i;
}

void cuda_sample(backend_t *be, const float *logits, int M, int N, const bk_sample_t *params, int32_t *out)
{
    if (M <= 0)
        return;
    cuda_state_t *st = cuda_st(be);
    const size_t bytes = (size_t)M * sizeof(bk_sample_t);
    /* Stream-ordered: a kernel still reading the previous call's parameters runs before this copy.
     * From pageable memory the driver stages the bytes before returning (no sync). */
    bk_sample_t *d = (bk_sample_t *)cuda_scratch(be, &st->sample_params, &st->sample_params_bytes, bytes);
    CUDA_CHECK(cudaMemcpyAsync(d, params, bytes, cudaMemcpyHostToDevice, st->stream));
    cuda_launch(st, k_sample, M, SAMPLE_THREADS, logits, N, (const bk_sample_t *)d, out);
}
