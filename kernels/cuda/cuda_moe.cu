/* kernels/cuda/cuda_moe.cu — mixture-of-experts routing and the routed experts' SwiGLU FFNs.
 *
 * Routing: one warp per token (k <= 32, E <= 1024; otherwise the older one-thread-per-token kernel)
 * with the CPU reference's arithmetic: the running max (a NaN at r[0] stays, as in the CPU's
 * scan), the sum of expf(r[e] - max) in ascending e (the lanes' values broadcast one by one into a
 * sequential f32 sum: the CPU's rounding, not a tree's), p = expf(r[e] - max) / sum, then k
 * selections of the largest p not yet taken, ties to the lower index, and the optional division
 * by the sequential sum of the k weights. Ids agree with the CPU unless expf's last bit decides a
 * near-tie (CUDA's expf is not glibc's).
 *
 * The FFN has three paths, chosen on the host by M (moe_ffn_as: by its as_m, so an expert-parallel
 * rank rounds a peer's entries as the peer's own call over its rows would) and the experts' dtype
 * and shape alone (the host never sees the routing there):
 *   bf16/f16 weights, H and I multiples of 8, 16-byte       -> the grouped path (decode batches,
 *     aligned, M >= TROUPE_CUDA_MOE_GROUPED_MIN_M (default 9)    prefill chunks)
 *   otherwise M <= TROUPE_CUDA_MOE_DEVICE_MAX_M (default 64) -> the FMA device path (small decode
 *                                                               batches; f32 experts)
 *   otherwise (f32 weights above the threshold, an odd shape,-> the host path
 *     TROUPE_CUDA_MOE_DEVICE=0, E > 1024, k > 32, experts of mixed dtype or shape)
 * The two device paths queue device work only (cuda_moe_graphable says 1 for them).
 * Quantized experts (fp8, int8, int4 or fp4 codes with f32 block scales, one format, activation
 * rule and scale grid per kind of matrix; cuda_moe_quant.cu): the grouped path where cuda_moe_gemm_takes_q
 * says so (its GEMMs decode the codes into shared memory), else the FMA device path at every M
 * (its expert kernels decode in registers): no dequantized copy of the experts is ever made.
 *
 * FMA device path (TROUPE_CUDA_MOE_DEVICE=1, the default, and M <= TROUPE_CUDA_MOE_DEVICE_MAX_M,
 * default 64: measured faster than the host path up to 64 tokens and slower at 256, README.md):
 * no host round trip, no sync, no allocation, so the step can be captured in a CUDA
 * graph. Per chunk of at most BK_MOE_DEVICE_CHUNK tokens (kernels/backend.h: it bounds the
 * scratch), four kernels:
 *   1. k_moe_sort (one block): counts per expert, exclusive scans giving each expert's first
 *      entry (off[E+1]) and the list of experts that have tokens (active[], n_active), then a
 *      stable scatter of the (token, slot) pairs by expert (one warp, __match_any_sync ranks).
 *   2. k_moe_experts<GU> (cuda_moe_fma.cuh, one kernel for every weight format, the row's decode
 *      a type parameter): grid (tile of 8 rows of I, active expert); each warp owns row n of
 *      gate and of up, streams both once per group of up to MT of the expert's tokens (MT = 1 at
 *      batch 1, 4 up to 32 tokens, 8 above; more entries take more passes, the rows then coming
 *      from L2), with 16-byte loads, f32 FMA against the f32 activations, lane sums by a
 *      butterfly, and writes silu(g) * u (cuda_swiglu's arithmetic) into act[sorted position][I].
 *      Blocks past n_active leave at once: at batch 1 the grid's second dimension is k (8), not
 *      E (128).
 *   3. k_moe_experts<down>: the same over down's rows (two per warp, sharing the activation
 *      loads), writing each (token, slot)'s expert output to y[token * k + slot][H].
 *   4. k_moe_combine: per token, the k slots' outputs summed in ascending expert id (ties in slot
 *      order), each a rounded product then a rounded add from 0: exactly the host path's (and the
 *      CPU's) index_add_ order given the same expert outputs.
 *   Numerics: f32 products of the stored weights and the f32 activations, f32 accumulation in
 *   another order than the CPU's (~1e-6 relative, the GEMV path's grade) for every weight dtype
 *   and every M: no bf16 activations. A token's bits depend on K, the dtype and the alignment only
 *   — not on M, the batch's other tokens or their routing — and are the same run to run.
 *   The expert kernels are CUDA-core FMA: meant for decode (1-16 rows per expert); at 256 tokens
 *   they lose to the host path (README.md), which is where the grouped path takes over.
 *   The experts' weight pointers live in a device table per experts array, made the
 *   first time the array is seen (that one call copies it up; later calls compare the host
 *   array's descriptors with the copy's and reuse it); the grouped path uses the same table.
 *
 * Grouped path (TROUPE_CUDA_MOE_GROUPED=1, the default, above TROUPE_CUDA_MOE_DEVICE_MAX_M tokens;
 * TROUPE_CUDA_MOE_DEVICE_MAX_M=0 sends every M there): the experts' FFNs as grouped GEMMs on the
 * tensor cores, still no host round trip, no sync, no allocation. Per chunk of at most
 * BK_MOE_GROUPED_CHUNK tokens, four steps:
 *   1. k_moe_sort_tiles (one block of 1024 threads): counts, scans and a scatter by expert with
 *      shared-memory atomics (every thread works; the order within an expert is not fixed, which
 *      moves an entry to another tile row but never changes its result), then the tile list: for
 *      each expert with entries ceil(n_e / BM) row tiles {expert, first entry, rows}, and their
 *      count, which the GEMMs read (their grids are an upper bound; surplus blocks leave at once).
 *   2-3. cuda_moe_gemm (cuda_moe_gemm.cu): x converted once to the weights' 16-bit type, then
 *      gate|up with the SwiGLU epilogue into act[sorted entry][I] (16-bit) and down into
 *      y[token * k + slot][H] (f32): mma.sync m16n8k16, ldmatrix, a 3-stage cp.async pipeline,
 *      BM = 32, 64 or 128 rows per tile by the average entries per expert
 *      (TROUPE_CUDA_MOE_GROUPED_BM forces one).
 *   4. k_moe_combine, as above: HF's order of the sum.
 *   Numerics: x and the SwiGLU activations rounded to the weights' 16-bit type (round to nearest
 *   even; f16 saturated at +-65504), f32 accumulation: the host path's cuBLASLt rounding above
 *   TROUPE_CUDA_GEMM_SPLIT rows (~3e-3 relative per expert output for bf16, ~4e-4 for f16 on
 *   random inputs). Batch-invariant and the same bits run to run, like the FMA device path (each
 *   output element sees the same mma sequence whatever its tile).
 *
 * Host path (TROUPE_CUDA_MOE_DEVICE=0, or what neither device path takes: above the threshold
 * with f32 weights, an odd shape or TROUPE_CUDA_MOE_GROUPED=0): the routing comes back to
 * the host (one stream sync per MoE layer), is counting-sorted by expert there, and the sorted
 * token lists go up into the scratch. Then, for each expert that has tokens, in ascending expert
 * order: gather its rows, gate and up matmuls (cuda_matmul: GEMV for a few rows, cuBLASLt for
 * many), SwiGLU, down, and a scatter that adds weight * row into out. One launch per expert,
 * queued in expert order, so every token's sum is accumulated in ascending expert order with a
 * rounded product then a rounded add: HF's index_add_ order, as the CPU. A token appears at most
 * once per expert, so a scatter has no write conflicts. Its matmuls follow cuda_matmul's numerics
 * (bf16 activations above TROUPE_CUDA_GEMM_SPLIT rows per expert).
 *
 * Known limits: the device paths need every expert in one dtype and shape, E <= 1024 and k <= 32
 * (else the host path runs); on the FMA device path an expert holding most of a large batch's
 * tokens is worked by its own CTAs alone (a long tail; the grouped path gives each of its row tiles
 * its own blocks); f32 weights above the threshold still take the host path; an out-of-range
 * expert id (our bug: moe_route writes them) traps the kernel, which makes the next checked call
 * exit the process.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_dev.cuh"
#include "kernels/cuda/cuda_moe_fma.cuh"
#include "kernels/cuda/cuda_moe_quant.cuh"

#define MOE_THREADS 256                 /* route kernel: 8 warps */
#define MOE_WARPS (MOE_THREADS / 32)
#define MOE_SORT_THREADS 1024           /* the sort's one block: one expert per thread */
#define MOE_MAX_E MOE_SORT_THREADS      /* experts the device path (and the warp router) handles */
#define MOE_MAX_K 32                    /* top-k the warp router and the combine handle */
#define MOE_SORT_SMEM_ROWS 4096         /* routing entries the sort keeps in shared memory */

/* The device copy of one experts array (a layer's). */
typedef struct cuda_moe_table {
    const bk_expert_t *key;             /* the caller's host array */
    bk_expert_t *copy;                  /* host: [cap] its contents when the device table was written */
    moe_dev_expert_t *host_ptrs;        /* host: [cap] what was copied up (kept: the copy is async) */
    moe_dev_expert_t *dev;              /* device: [cap] */
    int n, cap;                         /* experts in use; capacity of the three arrays */
    int ok;                             /* 1: one dtype (f32/bf16/f16, or one quantized format), one shape, one
                                           scale grid per kind of matrix: the device paths can run */
    dtype_t dt;                         /* the weights' (quantized: the codes', DT_F8E4M3, DT_I8 or DT_U8) */
    int64_t H, I;
    int aligned;                        /* every weight pointer 16-byte aligned */
    int qfmt, qact;                     /* quantized experts: BK_Q_* and BK_QA_*; 0 for plain ones */
    moe_qgrid_t qgu, qdn;               /* quantized: the scale blocks of gate and up (the same), of down */
} cuda_moe_table_t;

/* ---- routing -------------------------------------------------------------------------------------- */

/* One thread per token: the fallback for k > 32 or E > 1024. */
__global__ void k_moe_route(const float *logits, int M, int E, int k, int renorm, int32_t *ids, float *weights)
{
    DEV_PDL_ENTER();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= M)
        return;
    const float *r = logits + (size_t)t * E;
    int32_t *id = ids + (size_t)t * k;
    float *w = weights + (size_t)t * k;
    float mx = r[0], sum = 0.0f;
    for (int e = 1; e < E; e++)
        mx = r[e] > mx ? r[e] : mx;
    for (int e = 0; e < E; e++)
        sum += expf(r[e] - mx);
    for (int j = 0; j < k; j++) {
        int best = -1;
        float bp = 0.0f;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++)
                taken |= id[i] == e;
            if (taken)
                continue;
            const float p = expf(r[e] - mx) / sum;
            if (best < 0 || p > bp) {
                best = e;
                bp = p;
            }
        }
        id[j] = best;
        w[j] = bp;
    }
    if (renorm) {
        float s = 0.0f;
        for (int j = 0; j < k; j++)
            s += w[j];
        for (int j = 0; j < k; j++)
            w[j] /= s;
    }
}

/* One warp per token; lane i holds experts i, i + 32, ... (taken: one bit each, E <= 1024) and, for
 * j < k, lane j holds the j-th selection. */
__global__ void __launch_bounds__(MOE_THREADS)
    k_moe_route_warp(const float *logits, int M, int E, int k, int renorm, int32_t *ids, float *weights)
{
    DEV_PDL_ENTER();
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, t = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
    if (t >= M)
        return;                                    /* the whole warp: no shuffle is left waiting */
    const float *r = logits + (size_t)t * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) {
        const float v = r[e];
        mx = v > mx ? v : mx;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(full, mx, o);
        mx = v > mx ? v : mx;
    }
    if (isnan(r[0]))                               /* the CPU's scan starts at r[0]: a NaN there stays */
        mx = r[0];
    float sum = 0.0f;                              /* sequential, ascending e: the CPU's rounding */
    for (int base = 0; base < E; base += 32) {
        const int e = base + lane, n = E - base < 32 ? E - base : 32;
        const float ex = e < E ? expf(r[e] - mx) : 0.0f;
        for (int i = 0; i < n; i++)
            sum += __shfl_sync(full, ex, i);
    }
    uint32_t taken = 0;
    int my_id = -1;
    float my_w = 0.0f;
    for (int j = 0; j < k; j++) {
        int best = -1;
        float bp = 0.0f;
        for (int i = 0, e = lane; e < E; i++, e += 32) {
            if (taken >> i & 1u)
                continue;
            const float p = expf(r[e] - mx) / sum;
            if (best < 0 || p > bp) {                /* ascending e: the lane's first maximum */
                best = e;
                bp = p;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {           /* larger p wins; equal (or unordered) p: lower e */
            const int ob = __shfl_xor_sync(full, best, o);
            const float op = __shfl_xor_sync(full, bp, o);
            if (ob >= 0 && (best < 0 || op > bp || (!(bp > op) && ob < best))) {
                best = ob;
                bp = op;
            }
        }
        best = __shfl_sync(full, best, 0);           /* lane 0's answer for all (NaN makes the order partial) */
        bp = __shfl_sync(full, bp, 0);
        if (best >= 0 && (best & 31) == lane)
            taken |= 1u << (best >> 5);
        if (lane == j) {
            my_id = best;
            my_w = bp;
        }
    }
    float s = 0.0f;
    if (renorm)
        for (int j = 0; j < k; j++)
            s += __shfl_sync(full, my_w, j);
    if (lane < k) {
        ids[(size_t)t * k + lane] = my_id;
        weights[(size_t)t * k + lane] = renorm ? my_w / s : my_w;
    }
}

void cuda_moe_route(backend_t *be, const float *logits, int M, int E, int k, int renorm, int32_t *ids, float *weights)
{
    if (M <= 0)
        return;
    const cuda_state_t *st = cuda_st(be);
    if (k <= MOE_MAX_K && E <= MOE_MAX_E)
        cuda_launch(st, k_moe_route_warp, (M + MOE_WARPS - 1) / MOE_WARPS, MOE_THREADS, logits, M, E, k, renorm, ids,
                    weights);
    else
        cuda_launch(st, k_moe_route, (M + 63) / 64, 64, logits, M, E, k, renorm, ids, weights);
}

/* The expert-balancer's load counts: one atomic add per (token, slot). Unsigned wrap-around is
 * harmless: the reader takes differences of one window at a time and clears them. */
__global__ void k_moe_count(const int32_t *ids, int n, uint32_t *counts)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        atomicAdd(&counts[ids[i]], 1u);
}

void cuda_moe_count(backend_t *be, const int32_t *ids, int n, uint32_t *counts)
{
    if (n <= 0)
        return;
    cuda_launch(cuda_st(be), k_moe_count, (n + 255) / 256, 256, ids, n, counts);
}

/* ---- device paths: sorts ------------------------------------------------------------------------ */

/* Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, <= 1024); *total gets the
 * sum. Every thread must call it; wsum is [32] shared. */
__device__ int dev_block_excl_scan(int v, int *wsum, int *total)
{
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(full, incl, o);
        if (lane >= o)
            incl += u;
    }
    if (lane == 31)
        wsum[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int s = lane < nw ? wsum[lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(full, s, o);
            if (lane >= o)
                s += u;
        }
        if (lane < nw)
            wsum[lane] = s;                        /* inclusive warp totals */
    }
    __syncthreads();
    const int excl = incl - v + (warp > 0 ? wsum[warp - 1] : 0);
    *total = wsum[nw - 1];
    __syncthreads();                               /* wsum is free for the next scan */
    return excl;
}

/* The counting sort of one chunk's rows = M * k routing entries by expert: off[E + 1] (expert e's
 * entries are off[e] .. off[e + 1] - 1), active[n_active] (experts with entries, ascending),
 * tok[rows] (the entry's token) and slot[rows] (its index t * k + j), stable: an expert's entries
 * in ascending (token, slot). One block of a multiple of 32 threads, E <= blockDim.x <=
 * MOE_SORT_THREADS (k_moe_sort, or block 0 of k_moe_sort_qact). */
__device__ __forceinline__ void dev_moe_sort(const int32_t *ids, int rows, int k, int E, int32_t *off, int32_t *active,
                                             int32_t *n_active, int32_t *tok, int32_t *slot)
{
    __shared__ int cnt[MOE_SORT_THREADS];          /* [blockDim.x] counts, then each expert's next free place */
    __shared__ int wsum[32];
    __shared__ int32_t sid[MOE_SORT_SMEM_ROWS];    /* the first routing entries, for the scatter */
    const int tid = threadIdx.x;
    cnt[tid] = 0;
    __syncthreads();
    for (int r = tid; r < rows; r += blockDim.x) {
        const int e = ids[r];
        if (e < 0 || e >= E) {                     /* moe_route writes these: a bad one is our bug */
            printf("troupe cuda: moe_ffn: routing entry %d is expert %d of %d (%s:%d)\n", r, e, E, __FILE__, __LINE__);
            __trap();
        }
        if (r < MOE_SORT_SMEM_ROWS)
            sid[r] = e;
        atomicAdd(&cnt[e], 1);                     /* counts: order-free, so deterministic */
    }
    __syncthreads();
    const int v = tid < E ? cnt[tid] : 0;
    int total, n_act;
    const int start = dev_block_excl_scan(v, wsum, &total);
    const int at = dev_block_excl_scan(v > 0, wsum, &n_act);
    if (tid < E) {
        off[tid] = start;
        if (v > 0)
            active[at] = tid;
    }
    if (tid == 0) {
        off[E] = total;
        *n_active = n_act;
    }
    cnt[tid] = start;                              /* every thread read its count before the scans' barriers */
    __syncthreads();
    if (tid >= 32)
        return;
    /* One warp, 32 entries at a time in order: lanes with the same expert get consecutive places
     * by lane rank, so the scatter is stable. */
    const unsigned full = 0xffffffffu;
    for (int base = 0; base < rows; base += 32) {
        const int r = base + tid;
        const int e = r >= rows ? -1 : r < MOE_SORT_SMEM_ROWS ? sid[r] : ids[r];
        const unsigned same = __match_any_sync(full, e);
        const int rank = __popc(same & ((1u << tid) - 1u));
        const int pos = e >= 0 ? cnt[e] + rank : 0;
        __syncwarp();
        if (e >= 0 && rank == 0)
            cnt[e] += __popc(same);
        __syncwarp();
        if (e >= 0) {
            tok[pos] = r / k;
            slot[pos] = r;
        }
    }
}

__global__ void __launch_bounds__(MOE_SORT_THREADS)
    k_moe_sort(const int32_t *ids, int rows, int k, int E, int32_t *off, int32_t *active, int32_t *n_active,
               int32_t *tok, int32_t *slot)
{
    DEV_PDL_ENTER();
    dev_moe_sort(ids, rows, k, E, off, active, n_active, tok, slot);
}

/* The sort (block 0) and, independent of it, the per-token activation fake-quantization of the
 * chunk's x [mc][K] into xq (block 1 + t: token t, cpu_quant_act_row as k_moe_qrow): one launch
 * instead of two on the quantized FMA path. blockDim.x as the sort needs (>= E). */
__global__ void __launch_bounds__(MOE_SORT_THREADS)
    k_moe_sort_qact(const int32_t *ids, int rows, int k, int E, int32_t *off, int32_t *active, int32_t *n_active,
                    int32_t *tok, int32_t *slot, const float *x, int64_t K, int act, float *xq)
{
    DEV_PDL_ENTER();
    if (blockIdx.x == 0)
        dev_moe_sort(ids, rows, k, E, off, active, n_active, tok, slot);
    else
        mq_qrow<false>(x, K, act, blockIdx.x - 1, xq, NULL, NULL);
}

/* The grouped path's counting sort of one chunk's rows = M * k routing entries by expert, and its
 * tile list: the n_e entries of expert e get consecutive places first[e] .. first[e] + n_e - 1
 * (experts in ascending order) of tok[rows] (the entry's token) and slot[rows] (its index
 * t * k + j), in no fixed order within the expert (shared-memory atomics: the order changes which
 * tile row an entry lands in, never its result, cuda_moe_gemm.cu); then tiles[*n_tiles]: for each
 * expert with entries, ascending, ceil(n_e / bm) tiles {e, first place, rows (1..bm)}. One block of
 * MOE_SORT_THREADS threads, E <= MOE_SORT_THREADS; every loop over the entries or the tiles is
 * spread over all threads. */
__global__ void __launch_bounds__(MOE_SORT_THREADS)
    k_moe_sort_tiles(const int32_t *ids, int rows, int k, int E, int bm, int32_t *tok, int32_t *slot, int4 *tiles,
                     int32_t *n_tiles)
{
    __shared__ int cnt[MOE_SORT_THREADS];          /* counts, then each expert's next free place */
    __shared__ int first[MOE_SORT_THREADS];        /* expert e's first place */
    __shared__ int tfirst[MOE_SORT_THREADS];       /* expert e's first tile */
    __shared__ int wsum[32];
    DEV_PDL_ENTER();
    const int tid = threadIdx.x;
    cnt[tid] = 0;
    __syncthreads();
#pragma unroll 4
    for (int r = tid; r < rows; r += blockDim.x) {
        const int e = ids[r];
        if (e < 0 || e >= E) {                     /* moe_route writes these: a bad one is our bug */
            printf("troupe cuda: moe_ffn: routing entry %d is expert %d of %d (%s:%d)\n", r, e, E, __FILE__, __LINE__);
            __trap();
        }
        atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    const int v = tid < E ? cnt[tid] : 0;
    int total, ntiles;
    const int start = dev_block_excl_scan(v, wsum, &total);
    const int tstart = dev_block_excl_scan((v + bm - 1) / bm, wsum, &ntiles);
    first[tid] = start;
    tfirst[tid] = tstart;
    cnt[tid] = start;                              /* every thread read its count before the scans' barriers */
    if (tid == 0)
        *n_tiles = ntiles;
    __syncthreads();
#pragma unroll 4
    for (int r = tid; r < rows; r += blockDim.x) {
        const int p = atomicAdd(&cnt[ids[r]], 1);
        tok[p] = r / k;
        slot[p] = r;
    }
    /* Tile t belongs to the largest e with tfirst[e] <= t (an expert without entries has the same
     * tfirst as the next, so the largest such e has tiles, and t is one of them). */
    for (int t = tid; t < ntiles; t += blockDim.x) {
        int lo = 0, hi = E - 1;
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (tfirst[mid] <= t)
                lo = mid;
            else
                hi = mid - 1;
        }
        const int r0 = first[lo] + (t - tfirst[lo]) * bm, end = lo + 1 < E ? first[lo + 1] : total;
        tiles[t] = make_int4(lo, r0, end - r0 < bm ? end - r0 : bm, 0);
    }
}

/* ---- device paths: the combine --------------------------------------------------------------- */

/* out[t] = sum over t's k slots in ascending expert id (ties: slot order) of weight * y[t * k + j],
 * a rounded product then a rounded add, from 0. One block per token. */
__global__ void k_moe_combine(const float *y, const int32_t *ids, const float *weights, int k, int H, float *out)
{
    __shared__ int order[MOE_MAX_K];
    DEV_PDL_ENTER();
    const int64_t t = blockIdx.x;
    const int32_t *id = ids + t * k;
    if (threadIdx.x == 0) {                        /* insertion sort: stable */
        for (int j = 0; j < k; j++) {
            const int e = id[j];
            int i = j;
            while (i > 0 && id[order[i - 1]] > e) {
                order[i] = order[i - 1];
                i--;
            }
            order[i] = j;
        }
    }
    __syncthreads();
    const float *yt = y + t * k * H, *w = weights + t * k;
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < k; i++) {
            const int j = order[i];
            acc = __fadd_rn(acc, __fmul_rn(yt[(int64_t)j * H + h], w[j]));
        }
        out[t * H + h] = acc;
    }
}

/* ---- device path: tables and launches --------------------------------------------------------- */

static void *s_xrealloc(void *p, size_t bytes, const char *what)
{
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q)
        cuda_die(what, "out of memory", __FILE__, __LINE__);
    return q;
}

static bool s_same_mat(const bk_mat_t *a, const bk_mat_t *b)
{
    return a->data == b->data && a->dtype == b->dtype && a->rows == b->rows && a->cols == b->cols &&
           a->qfmt == b->qfmt && a->qact == b->qact && a->qgr == b->qgr && a->qgc == b->qgc && a->qscale == b->qscale;
}

/* The descriptors' fields (not their bytes: padding may differ). */
static bool s_same_experts(const bk_expert_t *a, const bk_expert_t *b, int n)
{
    for (int e = 0; e < n; e++)
        if (!s_same_mat(&a[e].gate, &b[e].gate) || !s_same_mat(&a[e].up, &b[e].up) ||
            !s_same_mat(&a[e].down, &b[e].down))
            return false;
    return true;
}

/* The device table for this experts array: found by the array's address and checked against its
 * contents (a caller may reuse an address for other weights), written (asynchronously, on the
 * stream: kernels queued before still see the old contents) when new or changed. Writing it is the
 * only host-device traffic of the device path, and happens once per experts array: it must happen
 * before a CUDA graph capture (a warm-up step), as cuBLASLt's plans must. */
static const cuda_moe_table_t *s_table(cuda_state_t *st, const bk_expert_t *experts, int n)
{
    cuda_moe_table_t *t = NULL;
    for (int i = 0; i < st->n_moe_tables && !t; i++)
        if (st->moe_tables[i].key == experts)
            t = &st->moe_tables[i];
    if (t && t->n == n && s_same_experts(t->copy, experts, n))
        return t;
    if (!t) {
        if (st->n_moe_tables == st->cap_moe_tables) {
            const int cap = st->cap_moe_tables ? 2 * st->cap_moe_tables : 64;
            st->moe_tables = (cuda_moe_table_t *)s_xrealloc(st->moe_tables, (size_t)cap * sizeof(cuda_moe_table_t),
                                                          "realloc(moe tables)");
            st->cap_moe_tables = cap;
        }
        t = &st->moe_tables[st->n_moe_tables++];
        memset(t, 0, sizeof(*t));
        t->key = experts;
    }
    if (n > t->cap) {
        if (t->dev) {
            CUDA_CHECK(cudaStreamSynchronize(st->stream));   /* a queued kernel may still read it */
            CUDA_CHECK(cudaFree(t->dev));
            t->dev = NULL;
        }
        t->copy = (bk_expert_t *)s_xrealloc(t->copy, (size_t)n * sizeof(bk_expert_t), "realloc(moe table)");
        t->host_ptrs = (moe_dev_expert_t *)s_xrealloc(t->host_ptrs, (size_t)n * sizeof(moe_dev_expert_t),
                                                      "realloc(moe table)");
        CUDA_CHECK(cudaMalloc(&t->dev, (size_t)n * sizeof(moe_dev_expert_t)));
        t->cap = n;
    }
    memcpy(t->copy, experts, (size_t)n * sizeof(*experts));
    t->n = n;
    const bk_expert_t *x0 = &experts[0];
    t->dt = x0->gate.dtype;
    t->I = x0->gate.rows;
    t->H = x0->gate.cols;
    t->qfmt = x0->gate.qfmt;
    t->qact = x0->gate.qact;
    t->qgu = (moe_qgrid_t){t->qfmt, x0->gate.qgr, x0->gate.qgc};
    t->qdn = (moe_qgrid_t){t->qfmt, x0->down.qgr, x0->down.qgc};
    t->ok = t->qfmt ? cuda_moe_quant_takes(t->qfmt) : t->dt == DT_F32 || t->dt == DT_BF16 || t->dt == DT_F16;
    t->aligned = 1;
    for (int e = 0; e < n; e++) {
        const bk_expert_t *x = &experts[e];
        const bk_mat_t *m[3] = {&x->gate, &x->up, &x->down};
        for (int i = 0; i < 3; i++) {
            const int64_t rows = i < 2 ? t->I : t->H, cols = i < 2 ? t->H : t->I;
            const moe_qgrid_t *g = i < 2 ? &t->qgu : &t->qdn;
            t->ok &= m[i]->dtype == t->dt && m[i]->rows == rows && m[i]->cols == cols && m[i]->data != NULL;
            t->ok &= m[i]->qfmt == t->qfmt && m[i]->qact == t->qact;   /* one format, one activation rule */
            if (t->qfmt)                        /* one grid per kind of matrix, every scale present */
                t->ok &= m[i]->qgr == g->gr && m[i]->qgc == g->gc && g->gr > 0 && g->gc > 0 && m[i]->qscale != NULL;
            t->aligned &= (uintptr_t)m[i]->data % 16 == 0;
        }
        t->host_ptrs[e] = (moe_dev_expert_t){x->gate.data, x->up.data, x->down.data, x->gate.qscale, x->up.qscale,
                                             x->down.qscale};
    }
    t->ok &= t->I > 0 && t->H > 0;
    /* From pageable memory the copy is staged before it returns; host_ptrs is kept regardless. */
    CUDA_CHECK(cudaMemcpyAsync(t->dev, t->host_ptrs, (size_t)n * sizeof(moe_dev_expert_t), cudaMemcpyHostToDevice,
                               st->stream));
    return t;
}

void cuda_moe_destroy(cuda_state_t *st)
{
    for (int i = 0; i < st->n_moe_tables; i++) {
        cuda_moe_table_t *t = &st->moe_tables[i];
        if (t->dev)
            cudaFree(t->dev);
        free(t->copy);
        free(t->host_ptrs);
    }
    free(st->moe_tables);
    st->moe_tables = NULL;
    st->n_moe_tables = st->cap_moe_tables = 0;
}

template <typename WT>
static void s_moe_device(const cuda_state_t *st, const cuda_moe_table_t *tb, const float *x, int M, int H,
                         const int32_t *ids, const float *weights, int k, int E, void *scratch, float *out)
{
    constexpr int VE = 16 / (int)sizeof(WT);
    const int64_t I = tb->I;
    const bool vec_gu = tb->aligned && H % VE == 0 && (uintptr_t)x % 16 == 0;
    const bool vec_dn = tb->aligned && I % VE == 0;
    /* Scratch (moe_scratch_bytes' device layout), for a chunk of at most BK_MOE_DEVICE_CHUNK tokens,
     * R = chunk * k entries: off [E+1] | active [E] | n_active [1] | tok [R] | slot [R] ints, then
     * (64-byte aligned) act [R][I] and y [R][H] floats. */
    const int mc_max = M < BK_MOE_DEVICE_CHUNK ? M : BK_MOE_DEVICE_CHUNK;
    const size_t R = (size_t)mc_max * k;
    int32_t *off = (int32_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int32_t *active = off + E + 1, *n_active = active + E, *tok = n_active + 1, *slot = tok + R;
    float *act = (float *)(((uintptr_t)(slot + R) + 63) & ~(uintptr_t)63), *y = act + R * I;
    const moe_dev_expert_t *tab = tb->dev;
    const int sort_threads = E <= 32 ? 32 : (E + 31) / 32 * 32;   /* one expert per thread */
    for (int t0 = 0; t0 < M; t0 += BK_MOE_DEVICE_CHUNK) {   /* chunks reuse the scratch: stream order */
        const int mc = M - t0 < BK_MOE_DEVICE_CHUNK ? M - t0 : BK_MOE_DEVICE_CHUNK, rows = mc * k;
        const float *xc = x + (size_t)t0 * H, *wc = weights + (size_t)t0 * k;
        const int32_t *ic = ids + (size_t)t0 * k;
        float *oc = out + (size_t)t0 * H;
        const unsigned gy = (unsigned)(rows < E ? rows : E);
        cuda_launch(st, k_moe_sort, 1, sort_threads, ic, rows, k, E, off, active, n_active, tok, slot);
        moe_fma_experts<moe_row_plain<WT>, true>(st, mc, vec_gu, gy, tab, off, active, n_active, tok, slot, xc, I,
                                                 (int64_t)H, 0, 0, act);
        moe_fma_experts<moe_row_plain<WT>, false>(st, mc, vec_dn, gy, tab, off, active, n_active, tok, slot, act,
                                                  (int64_t)H, I, 0, 0, y);
        cuda_launch(st, k_moe_combine, mc, H >= 1024 ? 256 : 128, (const float *)y, ic, wc, k, H, oc);
    }
}

/* The FMA device path over quantized experts (cuda_moe_quant.cu's rows), in the same scratch
 * layout and chunks as s_moe_device. With qact, x is fake-quantized per token into y's space first
 * (y is written only by the down kernel, which runs after the gate|up kernel has read it), and each
 * entry's SwiGLU output in place before down: what the CPU's per-expert quantized matmuls do. */
static void s_moe_device_q(const cuda_state_t *st, const cuda_moe_table_t *tb, const float *x, int M, int H,
                           const int32_t *ids, const float *weights, int k, int E, void *scratch, float *out)
{
    const int64_t I = tb->I;
    const int mc_max = M < BK_MOE_DEVICE_CHUNK ? M : BK_MOE_DEVICE_CHUNK;
    const size_t R = (size_t)mc_max * k;
    int32_t *off = (int32_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int32_t *active = off + E + 1, *n_active = active + E, *tok = n_active + 1, *slot = tok + R;
    float *act = (float *)(((uintptr_t)(slot + R) + 63) & ~(uintptr_t)63), *y = act + R * I;
    const moe_dev_expert_t *tab = tb->dev;
    const int sort_threads = E <= 32 ? 32 : (E + 31) / 32 * 32;
    for (int t0 = 0; t0 < M; t0 += BK_MOE_DEVICE_CHUNK) {   /* chunks reuse the scratch: stream order */
        const int mc = M - t0 < BK_MOE_DEVICE_CHUNK ? M - t0 : BK_MOE_DEVICE_CHUNK, rows = mc * k;
        const float *xc = x + (size_t)t0 * H, *wc = weights + (size_t)t0 * k;
        const int32_t *ic = ids + (size_t)t0 * k;
        float *oc = out + (size_t)t0 * H;
        const unsigned gy = (unsigned)(rows < E ? rows : E);
        const float *xin = xc;
        if (tb->qact) {                            /* x's fake-quantization into y's space, with the sort */
            const int bd = sort_threads > 256 ? sort_threads : 256;
            cuda_launch(st, k_moe_sort_qact, 1 + mc, bd, ic, rows, k, E, off, active, n_active, tok, slot, xc,
                        (int64_t)H, (int)tb->qact, y);
            xin = y;
        } else {
            cuda_launch(st, k_moe_sort, 1, sort_threads, ic, rows, k, E, off, active, n_active, tok, slot);
        }
        const bool vec_gu = tb->aligned && (uintptr_t)xin % 16 == 0;
        cuda_moe_qexperts(st, tb->qgu, true, mc, vec_gu, gy, tab, off, active, n_active, tok, slot, xin, I, H, act);
        cuda_moe_qact(st, act, rows, I, tb->qact, act);   /* nothing without qact */
        cuda_moe_qexperts(st, tb->qdn, false, mc, tb->aligned != 0, gy, tab, off, active, n_active, tok, slot, act, H,
                          I, y);
        cuda_launch(st, k_moe_combine, mc, H >= 1024 ? 256 : 128, (const float *)y, ic, wc, k, H, oc);
    }
}

/* ---- host path ----------------------------------------------------------------------------------- */

/* out[tok[i]] += weights[slot[i]] * y[i] for the c rows of one expert. */
__global__ void k_moe_scatter(const float *y, const int32_t *tok, const int32_t *slot, const float *weights, int H,
                              float *out)
{
    DEV_PDL_ENTER();
    const int i = blockIdx.x;
    const float w = weights[slot[i]];
    const float *yr = y + (size_t)i * H;
    float *o = out + (size_t)tok[i] * H;
    for (int h = threadIdx.x; h < H; h += blockDim.x)
        o[h] = __fadd_rn(o[h], __fmul_rn(yr[h], w));   /* rounded product, then the add: HF's order */
}

static void s_moe_host(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                       const bk_expert_t *experts, int n_experts, void *scratch, float *out)
{
    cuda_state_t *st = cuda_st(be);
    cudaStream_t s = st->stream;
    int I = 0;
    for (int e = 0; e < n_experts; e++)
        I = experts[e].gate.rows > I ? (int)experts[e].gate.rows : I;
    const size_t rows = (size_t)M * (size_t)k;

    /* Host lists: ids [rows] | start [E+1] | tok [rows] | slot [rows]. */
    const size_t need = rows * 3 + (size_t)n_experts + 1;
    if (need > st->h_ids_cap) {
        int32_t *p = (int32_t *)realloc(st->h_ids, need * sizeof(int32_t));
        if (!p)
            cuda_die("realloc(moe routing lists)", "out of memory", __FILE__, __LINE__);
        st->h_ids = p;
        st->h_ids_cap = need;
    }
    int32_t *h_ids = st->h_ids, *start = h_ids + rows, *tok = start + n_experts + 1, *slot = tok + rows;
    CUDA_CHECK(cudaMemcpyAsync(h_ids, ids, rows * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    memset(start, 0, (size_t)(n_experts + 1) * sizeof(int32_t));
    for (size_t r = 0; r < rows; r++) {
        if (h_ids[r] < 0 || h_ids[r] >= n_experts) {   /* moe_route writes these: a bad one is our bug */
            fprintf(stderr, "troupe cuda: moe_ffn: routing entry %zu is expert %d of %d (%s:%d)\n", r, h_ids[r],
                    n_experts, __FILE__, __LINE__);
            exit(1);
        }
        start[h_ids[r] + 1]++;
    }
    for (int e = 0; e < n_experts; e++)
        start[e + 1] += start[e];
    for (size_t r = 0; r < rows; r++) {            /* stable: tokens stay in ascending order */
        const int at = start[h_ids[r]]++;
        tok[at] = (int32_t)(r / (size_t)k);
        slot[at] = (int32_t)r;
    }
    for (int e = n_experts; e > 0; e--)            /* undo the ++: start[e] is expert e's first entry again */
        start[e] = start[e - 1];
    start[0] = 0;

    /* Device scratch (moe_scratch_bytes' host layout): xg [M][H], yd [M][H], g [M][I], u [M][I]
     * floats, then tok [rows], slot [rows]. */
    float *xg = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    float *yd = xg + (size_t)M * H, *g = yd + (size_t)M * H, *u = g + (size_t)M * I;
    int32_t *d_tok = (int32_t *)(u + (size_t)M * I), *d_slot = d_tok + rows;
    /* From pageable memory the copy is staged before it returns: h_ids may be reused at once. */
    CUDA_CHECK(cudaMemcpyAsync(d_tok, tok, rows * 2 * sizeof(int32_t), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)M * H * sizeof(float), s));
    for (int e = 0; e < n_experts; e++) {
        const int c = start[e + 1] - start[e];
        if (c == 0)
            continue;
        const bk_expert_t *ex = &experts[e];
        cuda_launch_gather(st, x, d_tok + start[e], c, H, xg);
        cuda_matmul(be, xg, c, &ex->gate, NULL, g);
        cuda_matmul(be, xg, c, &ex->up, NULL, u);
        cuda_swiglu(be, g, u, c * (int)ex->gate.rows, g);
        cuda_matmul(be, g, c, &ex->down, NULL, yd);
        cuda_launch(st, k_moe_scatter, c, H >= 1024 ? 256 : 128, (const float *)yd, (const int32_t *)d_tok + start[e],
                    (const int32_t *)d_slot + start[e], weights, H, out);
    }
}

/* ---- grouped path (its GEMMs: cuda_moe_gemm.cu) ------------------------------------------------- */

/* Chunks of at most BK_MOE_GROUPED_CHUNK tokens, each: k_moe_sort_tiles, cuda_moe_gemm (x to 16
 * bits, gate|up + SwiGLU, down), k_moe_combine. Scratch (moe_scratch_bytes' grouped layout), for
 * R = chunk * k entries: n_tiles [4 ints] | tiles [R + E] int4 | tok [R] | slot [R], then (each
 * 64-byte aligned) xh [chunk][H] and act [R][I] 16-bit, y [R][H] f32, and for quantized experts with
 * qact the activation scales qsx [chunk] | qsa [R] f32. */
static void s_moe_grouped(const cuda_state_t *st, const cuda_moe_table_t *tb, const float *x, int M, int H,
                          const int32_t *ids, const float *weights, int k, int E, void *scratch, float *out)
{
    const int I = (int)tb->I;
    const int mc_max = M < BK_MOE_GROUPED_CHUNK ? M : BK_MOE_GROUPED_CHUNK;
    const size_t R = (size_t)mc_max * k;
    int32_t *n_tiles = (int32_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int4 *tiles = (int4 *)(n_tiles + 4);
    int32_t *tok = (int32_t *)(tiles + R + E), *slot = tok + R;
    uint16_t *xh = (uint16_t *)(((uintptr_t)(slot + R) + 63) & ~(uintptr_t)63);
    uint16_t *act = (uint16_t *)(((uintptr_t)(xh + (size_t)mc_max * H) + 63) & ~(uintptr_t)63);
    float *y = (float *)(((uintptr_t)(act + R * I) + 63) & ~(uintptr_t)63);
    float *qsx = (float *)(((uintptr_t)(y + R * H) + 63) & ~(uintptr_t)63), *qsa = qsx + mc_max;
    for (int t0 = 0; t0 < M; t0 += BK_MOE_GROUPED_CHUNK) {   /* chunks reuse the scratch: stream order */
        const int mc = M - t0 < BK_MOE_GROUPED_CHUNK ? M - t0 : BK_MOE_GROUPED_CHUNK, rows = mc * k;
        const int32_t *ic = ids + (size_t)t0 * k;
        moe_grouped_chunk_t c = {};
        c.tab = tb->dev;
        c.dt = tb->qfmt ? DT_BF16 : tb->dt;       /* quantized: decoded to bf16 operands (W8A8: f16) */
        c.qfmt = tb->qfmt;
        c.qact = tb->qact;
        c.qgu = tb->qgu;
        c.qdn = tb->qdn;
        c.bm = cuda_moe_gemm_bm(st, rows, E);
        c.H = H;
        c.I = I;
        c.E = E;
        c.x = x + (size_t)t0 * H;
        c.qsx = qsx;
        c.qsa = qsa;
        c.mc = mc;
        c.rows = rows;
        c.tiles = tiles;
        c.n_tiles = n_tiles;
        c.tok = tok;
        c.slot = slot;
        c.xh = xh;
        c.act = act;
        c.y = y;
        cuda_launch(st, k_moe_sort_tiles, 1, MOE_SORT_THREADS, ic, rows, k, E, c.bm, tok, slot, tiles, n_tiles);
        cuda_moe_gemm(st, &c);
        cuda_launch(st, k_moe_combine, mc, H >= 1024 ? 256 : 128, (const float *)y, ic, weights + (size_t)t0 * k, k,
                    H, out + (size_t)t0 * H);
    }
}

/* ---- the op -------------------------------------------------------------------------------------- */

typedef enum { MOE_PATH_HOST, MOE_PATH_DEVICE, MOE_PATH_GROUPED } moe_path_t;

/* The path that takes M tokens over these experts; *tb the device table for the device paths. For
 * experts the grouped path takes (bf16/f16 weights, H and I multiples of 8, 16-byte aligned): the
 * grouped path from moe_grouped_min_m tokens, the FMA device path below; for others, the FMA
 * device path up to moe_device_max_m tokens, the host path above. */
static moe_path_t s_path(cuda_state_t *st, int M, int H, int k, const bk_expert_t *experts, int n_experts,
                         const cuda_moe_table_t **tb)
{
    *tb = NULL;
    if (!st->moe_device || n_experts <= 0 || n_experts > MOE_MAX_E || k <= 0 || k > MOE_MAX_K ||
        (M > st->moe_device_max_m && !st->moe_grouped))
        return MOE_PATH_HOST;
    const cuda_moe_table_t *t = s_table(st, experts, n_experts);
    if (!t->ok || t->H != H)
        return MOE_PATH_HOST;
    *tb = t;
    const bool grouped = st->moe_grouped && t->aligned &&
                         (t->qfmt ? cuda_moe_gemm_takes_q(t->qfmt, t->qact, t->qgu, t->qdn, t->H, t->I)
                                  : cuda_moe_gemm_takes(t->dt, t->H, t->I));
    if (grouped && M >= st->moe_grouped_min_m)
        return MOE_PATH_GROUPED;
    if (M <= st->moe_device_max_m || (t->qfmt && !grouped))   /* quantized: the host path has no benefit */
        return MOE_PATH_DEVICE;
    if (grouped)
        return MOE_PATH_GROUPED;
    *tb = NULL;
    return MOE_PATH_HOST;
}

/* The device paths allocate and upload only in s_table, for experts arrays they have not seen (or
 * that changed): a graph recorded after an uncaptured step with them replays device work only. */
int cuda_moe_graphable(backend_t *be, int M, int H, int k, const bk_expert_t *experts, int n_experts)
{
    const cuda_moe_table_t *tb;
    return M > 0 && s_path(cuda_st(be), M, H, k, experts, n_experts, &tb) != MOE_PATH_HOST;
}

/* moe_ffn over M rows with the path s_path picks for path_m tokens (moe_ffn: M itself). */
static void s_ffn(backend_t *be, int path_m, const float *x, int M, int H, const int32_t *ids, const float *weights,
                  int k, const bk_expert_t *experts, int n_experts, void *scratch, float *out)
{
    if (M <= 0)
        return;
    cuda_state_t *st = cuda_st(be);
    const cuda_moe_table_t *tb;
    switch (s_path(st, path_m, H, k, experts, n_experts, &tb)) {
    case MOE_PATH_HOST: s_moe_host(be, x, M, H, ids, weights, k, experts, n_experts, scratch, out); return;
    case MOE_PATH_GROUPED: s_moe_grouped(st, tb, x, M, H, ids, weights, k, n_experts, scratch, out); return;
    case MOE_PATH_DEVICE: break;
    }
    if (tb->qfmt) {
        s_moe_device_q(st, tb, x, M, H, ids, weights, k, n_experts, scratch, out);
        return;
    }
    switch (tb->dt) {
    case DT_F32: s_moe_device<float>(st, tb, x, M, H, ids, weights, k, n_experts, scratch, out); break;
    case DT_BF16: s_moe_device<__nv_bfloat16>(st, tb, x, M, H, ids, weights, k, n_experts, scratch, out); break;
    default: s_moe_device<__half>(st, tb, x, M, H, ids, weights, k, n_experts, scratch, out); break;
    }
}

void cuda_moe_ffn(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                  const bk_expert_t *experts, int n_experts, void *scratch, float *out)
{
    s_ffn(be, M, x, M, H, ids, weights, k, experts, n_experts, scratch, out);
}

/* The path of as_m tokens over M entries: every path's result for a row depends on its own inputs
 * only (the FMA and grouped paths are batch-invariant, see the header), so each entry gets the
 * bits the as_m-token call would give it; the host path's matmuls also depend on rows per expert,
 * which an expert-parallel rank's entries match only when an expert has one replica. */
void cuda_moe_ffn_as(backend_t *be, const float *x, int M, int H, const int32_t *ids, const float *weights, int k,
                     const bk_expert_t *experts, int n_experts, void *scratch, float *out, int as_m)
{
    s_ffn(be, as_m > 0 ? as_m : M, x, M, H, ids, weights, k, experts, n_experts, scratch, out);
}
