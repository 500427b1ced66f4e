/* tests/gpu/bench_cuda.cu — the GPU's two ceilings and the CUDA backend's decode matmuls.
 *
 *   build/gpu-tests/bench_cuda [--quick | --copy-only | --moe]
 *
 * --copy-only: the device line and 1. only (a second or two), for scripts that need the copy
 * ceiling beside a benchmark of their own (tools/bench-moe.sh). --moe: the device line, 1. and the
 * MoE section at M = 1, 16 and 64 only.
 *
 * 1. Copy bandwidth: cudaMemcpy device to device of 2 GiB, bytes read + written over the median
 *    time of 10 (events, after 2 warm-ups). The HBM ceiling a memory-bound kernel is judged by.
 * 2. bf16 GEMM ceiling: cuBLASLt 8192^3, bf16 in and out, f32 accumulation, TN, random data (never
 *    zeros: they run faster), median of 10 after 3 warm-ups.
 * 3. The backend's matmul at M = 1 with bf16 weights of Llama-3.1-8B's shapes (q, k/v, o, gate/up,
 *    down, lm_head): per call time and achieved bandwidth, for the CUDA-core GEMV with 4 warps per
 *    row and with the default's choice by the matrix's rows, the tensor-core GEMV with 4 and 8 warps
 *    per block, and cuBLASLt (TROUPE_CUDA_GEMV_MAX_M=0); then the step's matmuls at M = 1..8 on
 *    the CUDA-core and the tensor-core GEMV (gemv_rows_M). Each shape rotates over enough
 *    weight copies (>= 256 MB) that the 60 MB L2 cannot serve them. The sum over one Llama-8B
 *    step is the matmul-only decode time.
 * 4. The gate_proj GEMM at M = 128 and 512 through the backend, activations split in two bf16
 *    terms (the default) and rounded once: what the split costs a prefill.
 * 5. Prefill attention of a 1,000-token prompt on Llama-3.1-8B's shape (32 query heads, 8 kv heads,
 *    head_dim 128, bf16 KV in 16-slot blocks, causal from position 0): the 32 layers' attention
 *    calls (each layer its own cache, as in a forward pass), median of 7, with the tensor-core
 *    kernel (TROUPE_CUDA_ATTN_MMA=1, the default) and with the flash kernel (=0); and the two
 *    outputs' relative difference (bf16 q and p: ~2e-3 expected).
 * 6. Decode attention of one step of B = 1, 64, 256 sequences at 1,000 tokens of context on the same
 *    shape (32 layers; 256 x 1,000 x 131 KB = 33.5 GB of K/V at B = 256), with the tensor-core
 *    decode kernel (TROUPE_CUDA_ATTN_MMA_DECODE=1, the default) and the flash kernel (=0):
 *    attn_decode_b<B>_mma_ms / _flash_ms, the K/V bytes (_kv_bytes), the bandwidth each reaches
 *    (_mma_TBps / _flash_TBps, with the fraction of the copy bandwidth) and their difference.
 * MoE: the layer of Qwen3-30B-A3B's shape (moe_route + moe_ffn: hidden 2048, 128 experts of width
 *    768, top 8, bf16) at M = 1, 16, 64, 256, 1024 and 2048 on moe_ffn's FMA device path, its
 *    grouped tensor-core path and its host-sorted path (moe_M<M>_device_ms, _grouped_ms,
 *    _host_ms), with the expert bytes a call reads (moe_M<M>_weight_bytes) and the bandwidth that
 *    makes: 2 copies of the 128 experts (2.4 GB) and 8 routings used in turn, so L2 does not serve
 *    them. The grouped path also prints its TFLOP/s (M x 8 entries x 6 H I flops: gate, up, down;
 *    route, sort, conversion and combine included in the time) and, from M = 256, its time with
 *    each row tile forced (moe_M<M>_grouped_bm<BM>_ms, TROUPE_CUDA_MOE_GROUPED_BM) to check the
 *    default's choice. Then the same layer with quantized experts in each format: fp8 and int8 per
 *    channel with per-token activations of their type (W8A8), int4 in groups of 128 and nvfp4 in
 *    groups of 16, weight-only (moe_<fmt>_M<M>_device_ms / _grouped_ms / _host_ms / _default_ms,
 *    the default being what the engine runs), each with the bytes of its codes and scales the
 *    routed experts hold (moe_<fmt>_M<M>_weight_bytes), the bound they set at the copy bandwidth
 *    and each path's fraction of it.
 * 7. Sampling at M = 256 rows of a 128,256 vocabulary with top-k 50 / top-p 0.9 / temperature 0.8:
 *    the sample op on the device (sample_M256_ms, median of 10 after 2 warm-ups) against bringing
 *    the rows of logits to the host for the host sampler (logits_download_M256_ms, the download
 *    alone; the host's sampling comes on top).
 * Output: one "name value unit" line per figure (tools/gpu-run.sh reads them), then a table.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

extern "C" {
#include "kernels/backend.h"
}

#define BENCH_NAME "bench_cuda"
#include "tests/gpu/bench_check.h"

/* A value in (-1, 1) from a hash of index i (splitmix64). */
__device__ __forceinline__ float dev_hash_unit(size_t i, uint64_t seed)
{
    uint64_t z = (i + 1) * 0x9e3779b97f4a7c15ull + seed;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return ((float)(z >> 40) + 0.5f) * (2.0f / 16777216.0f) - 1.0f;
}

/* Random bf16 in (-1, 1) (and, for 4-byte views, random words). */
__global__ void k_fill_bf16(uint16_t *p, size_t n, uint64_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint16_t)(__float_as_uint(dev_hash_unit(i, seed)) >> 16);
}

/* Random fp8 e4m3 of values in (-1, 1), rounded as the cache's store rounds. */
__global__ void k_fill_f8(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint8_t)__nv_cvt_float_to_fp8(dev_hash_unit(i, seed), __NV_SATFINITE, __NV_E4M3);
}

static void s_fill(void *p, size_t bytes, uint64_t seed)
{
    k_fill_bf16<<<4096, 256>>>((uint16_t *)p, bytes / 2, seed);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
}

static float s_median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static double s_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One step's attention calls over `layers` layers (head_dim 128: scale 1/sqrt(128)), median ms of 7
 * after 2 warm-ups; the output is kept in host (nq floats) and the step's device buffers are freed. */
static float s_time_attention_step(backend_t *be, bk_kv_t *kv, int layers, float *q, int heads, float *out,
                                   const bk_attn_meta_t *meta, int32_t *meta_d, size_t nq, std::vector<float> &host)
{
    std::vector<float> t_ms;
    for (int rep = 0; rep < 9; rep++) {
        be->ops->sync(be);
        const double t0 = s_now();
        for (int l = 0; l < layers; l++)
            be->ops->attention(be, kv, l, q, heads, 0.08838834764831845f, meta, out);
        if (be->ops->sync(be) != 0)
            exit(1);
        if (rep >= 2)
            t_ms.push_back((float)((s_now() - t0) * 1e3));
    }
    host.resize(nq);
    if (be->ops->download(be, host.data(), out, nq * 4) != 0)
        exit(1);
    be->ops->free(be, kv->base);
    be->ops->free(be, q);
    be->ops->free(be, out);
    be->ops->free(be, meta_d);
    return s_median(t_ms);
}

static double s_copy_bandwidth(void)
{
    const size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    s_fill(a, bytes, 1);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 12; i++) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (i >= 2)
            ms.push_back(t);
    }
    CK(cudaFree(a));
    CK(cudaFree(b));
    return 2.0 * bytes / (s_median(ms) * 1e-3) / 1e12;   /* TB/s, read + write */
}

static double s_gemm_tflops(int n)
{
    const size_t elems = (size_t)n * n;
    void *A, *B, *D, *ws;
    const size_t ws_bytes = (size_t)64 << 20;
    CK(cudaMalloc(&A, elems * 2));
    CK(cudaMalloc(&B, elems * 2));
    CK(cudaMalloc(&D, elems * 2));
    CK(cudaMalloc(&ws, ws_bytes));
    s_fill(A, elems * 2, 2);
    s_fill(B, elems * 2, 3);
    cublasLtHandle_t lt;
    CKB(cublasLtCreate(&lt));
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    CKB(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
    CKB(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
    CKB(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, n, n));
    CKB(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, n, n));
    CKB(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n));
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t wsb = ws_bytes;
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, ld, ld, pref, 1, &res, &found));
    if (!found) {
        fprintf(stderr, "bench_cuda: cuBLASLt offers no bf16 %d^3 algorithm\n", n);
        exit(1);
    }
    const float alpha = 1.0f, beta = 0.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ms;
    for (int i = 0; i < 13; i++) {
        CK(cudaEventRecord(e0));
        CKB(cublasLtMatmul(lt, desc, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &res.algo, ws, ws_bytes, 0));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float t;
        CK(cudaEventElapsedTime(&t, e0, e1));
        if (i >= 3)
            ms.push_back(t);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(lt);
    CK(cudaFree(A));
    CK(cudaFree(B));
    CK(cudaFree(D));
    CK(cudaFree(ws));
    return 2.0 * n * (double)n * n / (s_median(ms) * 1e-3) / 1e12;
}

/* Median microseconds of one backend matmul at M rows, bf16 W [N][K], over rotating copies. */
static double s_backend_matmul_us(backend_t *be, int M, int64_t N, int64_t K)
{
    const size_t wbytes = (size_t)N * K * 2;
    int copies = (int)(((size_t)256 << 20) / wbytes) + 1;
    copies = copies > 64 ? 64 : copies;
    std::vector<void *> w(copies);
    for (int c = 0; c < copies; c++) {
        w[c] = be->ops->alloc(be, wbytes);
        if (!w[c]) {
            fprintf(stderr, "bench_cuda: out of device memory\n");
            exit(1);
        }
        s_fill(w[c], wbytes, 10 + c);
    }
    float *x = (float *)be->ops->alloc(be, (size_t)M * K * 4), *y = (float *)be->ops->alloc(be, (size_t)M * N * 4);
    std::vector<float> hx((size_t)M * K);
    for (size_t i = 0; i < hx.size(); i++)
        hx[i] = (float)((i * 2654435761u) % 2000) / 1000.0f - 0.999f;
    be->ops->upload(be, x, hx.data(), hx.size() * 4);
    std::vector<float> us;
    for (int rep = 0; rep < 7; rep++) {
        const int calls = 40;
        be->ops->sync(be);
        double t0 = s_now();
        for (int i = 0; i < calls; i++) {
            bk_mat_t W = {w[i % copies], DT_BF16, N, K};
            be->ops->matmul(be, x, M, &W, NULL, y);
        }
        if (be->ops->sync(be) != 0)
            exit(1);
        if (rep >= 2)
            us.push_back((float)((s_now() - t0) / calls * 1e6));
    }
    for (int c = 0; c < copies; c++)
        be->ops->free(be, w[c]);
    be->ops->free(be, x);
    be->ops->free(be, y);
    return s_median(us);
}

/* A bf16 or fp8 KV pool of Llama-3.1-8B's attention shape (32 layers, 8 kv heads, head_dim 128,
 * 16-slot blocks) of n_blocks blocks on be, filled from seed; exits when device memory runs out. */
static bk_kv_t s_bench_kv(backend_t *be, int n_blocks, int seed, dtype_t dt)
{
    enum { LAYERS = 32, KV = 8, D = 128, BS = 16 };
    bk_kv_t kv = {};
    kv.dtype = dt;
    kv.n_blocks = n_blocks;
    kv.block_size = BS;
    kv.n_layers = LAYERS;
    kv.n_kv_heads = KV;
    kv.head_dim = D;
    kv.block_bytes = (size_t)LAYERS * 2 * BS * KV * D * dtype_size(dt);
    kv.base = be->ops->alloc(be, kv.block_bytes * n_blocks);
    if (!kv.base) {
        fprintf(stderr, "bench_cuda: out of device memory\n");
        exit(1);
    }
    if (dt == DT_F8E4M3) {
        k_fill_f8<<<4096, 256>>>((uint8_t *)kv.base, kv.block_bytes * n_blocks, seed);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
    } else {
        s_fill(kv.base, kv.block_bytes * n_blocks, seed);
    }
    return kv;
}

/* One 1,000-token prefill's attention over 32 layers on Llama-3.1-8B's shape: median ms of the 32
 * calls on each of two backends (n = 2), outputs of the last call in out_host[b]. */
static void s_attn_prefill_ms(backend_t *const *bes, int n, double *ms, std::vector<float> *out_host, dtype_t dt)
{
    enum { T = 1000, LAYERS = 32, HEADS = 32, KV = 8, D = 128, BS = 16 };
    const int n_blocks = (T + BS - 1) / BS;
    for (int b = 0; b < n; b++) {
        backend_t *be = bes[b];
        bk_kv_t kv = s_bench_kv(be, n_blocks, 100, dt);
        const size_t nq = (size_t)T * HEADS * D;
        float *q = (float *)be->ops->alloc(be, nq * 4), *out = (float *)be->ops->alloc(be, nq * 4);
        int32_t *meta_d = (int32_t *)be->ops->alloc(be, (size_t)(2 * T + 1 + n_blocks) * 4);
        if (!q || !out || !meta_d) {
            fprintf(stderr, "bench_cuda: out of device memory\n");
            exit(1);
        }
        std::vector<float> hq(nq);
        for (size_t i = 0; i < nq; i++)
            hq[i] = (float)((i * 2654435761u) % 2000) / 1000.0f - 0.999f;
        std::vector<int32_t> hm(2 * T + 1 + n_blocks);
        for (int t = 0; t < T; t++) {
            hm[t] = 0;                             /* tok_seq */
            hm[T + t] = t;                         /* tok_pos */
        }
        hm[2 * T] = 0;                             /* seq_bt_start */
        for (int i = 0; i < n_blocks; i++)
            hm[2 * T + 1 + i] = i;                 /* block_table */
        if (be->ops->upload(be, q, hq.data(), nq * 4) != 0 ||
            be->ops->upload(be, meta_d, hm.data(), hm.size() * 4) != 0)
            exit(1);
        bk_attn_meta_t meta = {};
        meta.n_tokens = T;
        meta.n_seqs = 1;
        meta.tok_seq = meta_d;
        meta.tok_pos = meta_d + T;
        meta.seq_bt_start = meta_d + 2 * T;
        meta.block_table = meta_d + 2 * T + 1;
        ms[b] = s_time_attention_step(be, &kv, LAYERS, q, HEADS, out, &meta, meta_d, nq, out_host[b]);
    }
}

/* Decode attention of B sequences with 1,000 tokens of context each on Llama-3.1-8B's shape (32
 * query heads, 8 kv heads, head_dim 128, bf16 KV in 16-slot blocks): the 32 layers' calls of one
 * step (one row per sequence at position 999), median ms of 7 on each of two backends (n = 2),
 * outputs of the last call in out_host[b]. *kv_bytes: the K and V bytes the 32 calls read (B x
 * 1,000 x 32 layers x 4 KB). Each sequence owns its blocks, interleaved over the pool as an engine's
 * allocator would leave them; at B = 256 the pool is 33.8 GB (the H200 holds it). */
static void s_attn_decode_ms(backend_t *const *bes, int n, int B, double *ms, std::vector<float> *out_host,
                             double *kv_bytes, dtype_t dt)
{
    enum { CTX = 1000, LAYERS = 32, HEADS = 32, KV = 8, D = 128, BS = 16 };
    const int per_seq = (CTX + BS - 1) / BS, n_blocks = B * per_seq;
    *kv_bytes = (double)B * CTX * LAYERS * 2.0 * KV * D * (double)dtype_size(dt);
    for (int b = 0; b < n; b++) {
        backend_t *be = bes[b];
        bk_kv_t kv = s_bench_kv(be, n_blocks, 300, dt);
        const size_t nq = (size_t)B * HEADS * D;
        float *q = (float *)be->ops->alloc(be, nq * 4), *out = (float *)be->ops->alloc(be, nq * 4);
        int32_t *meta_d = (int32_t *)be->ops->alloc(be, (size_t)(3 * B + n_blocks) * 4);
        if (!q || !out || !meta_d) {
            fprintf(stderr, "bench_cuda: out of device memory\n");
            exit(1);
        }
        std::vector<float> hq(nq);
        for (size_t i = 0; i < nq; i++)
            hq[i] = (float)((i * 2654435761u) % 2000) / 1000.0f - 0.999f;
        std::vector<int32_t> hm(3 * B + n_blocks);
        for (int s = 0; s < B; s++) {
            hm[s] = s;                             /* tok_seq */
            hm[B + s] = CTX - 1;                   /* tok_pos */
            hm[2 * B + s] = s * per_seq;           /* seq_bt_start */
            for (int i = 0; i < per_seq; i++)
                hm[3 * B + s * per_seq + i] = i * B + s;   /* block_table: sequences interleaved */
        }
        if (be->ops->upload(be, q, hq.data(), nq * 4) != 0 ||
            be->ops->upload(be, meta_d, hm.data(), hm.size() * 4) != 0)
            exit(1);
        bk_attn_meta_t meta = {};
        meta.n_tokens = B;
        meta.n_seqs = B;
        meta.tok_seq = meta_d;
        meta.tok_pos = meta_d + B;
        meta.seq_bt_start = meta_d + 2 * B;
        meta.block_table = meta_d + 3 * B;
        ms[b] = s_time_attention_step(be, &kv, LAYERS, q, HEADS, out, &meta, meta_d, nq, out_host[b]);
    }
}

/* The MoE layer of Qwen3-30B-A3B's shape (hidden 2048, 128 experts of width 768, top 8, bf16
 * weights): moe_route + moe_ffn of M tokens, on each backend of bes (the device path and the host
 * path), median ms per layer. LAYERS copies of the 128 experts (2.4 GB) are used in turn and
 * ROUTINGS sets of random router logits, so what one call reads is not in the 60 MB L2 from the
 * call before. *bytes: the expert weight bytes one call reads (distinct experts routed to x 9.4 MB),
 * the mean over the routings. */
static void s_moe_layer_ms(backend_t *const *bes, int n, const bk_expert_t (*ex)[128], int M, double *ms,
                           double *bytes)
{
    enum { H = 2048, I = 768, E = 128, K = 8, LAYERS = 2, ROUTINGS = 8 };
    backend_t *be0 = bes[0];
    const size_t rk = (size_t)M * K;
    float *x = (float *)be0->ops->alloc(be0, (size_t)M * H * 4);
    float *out = (float *)be0->ops->alloc(be0, (size_t)M * H * 4);
    float *logits = (float *)be0->ops->alloc(be0, (size_t)ROUTINGS * M * E * 4);
    float *w = (float *)be0->ops->alloc(be0, ROUTINGS * rk * 4);
    int32_t *ids = (int32_t *)be0->ops->alloc(be0, ROUTINGS * rk * 4);
    void *scratch = be0->ops->alloc(be0, moe_scratch_bytes(M, K, H, I, E));
    if (!x || !out || !logits || !w || !ids || !scratch) {
        fprintf(stderr, "bench_cuda: out of device memory\n");
        exit(1);
    }
    std::vector<float> hx((size_t)M * H), hl((size_t)ROUTINGS * M * E);
    for (size_t i = 0; i < hx.size(); i++)
        hx[i] = (float)((i * 2654435761u) % 2000) / 1000.0f - 0.999f;
    for (size_t i = 0; i < hl.size(); i++)
        hl[i] = (float)((i * 2246822519u + 7) % 4001) / 1000.0f - 2.0f;
    if (be0->ops->upload(be0, x, hx.data(), hx.size() * 4) != 0 ||
        be0->ops->upload(be0, logits, hl.data(), hl.size() * 4) != 0)
        exit(1);
    /* The bytes: each routing's distinct experts. */
    std::vector<int32_t> hid(ROUTINGS * rk);
    for (int r = 0; r < ROUTINGS; r++)
        be0->ops->moe_route(be0, logits + (size_t)r * M * E, M, E, K, 1, ids + r * rk, w + r * rk);
    if (be0->ops->download(be0, hid.data(), ids, hid.size() * 4) != 0)
        exit(1);
    double distinct = 0;
    for (int r = 0; r < ROUTINGS; r++) {
        std::vector<char> seen(E, 0);
        for (size_t i = 0; i < rk; i++)
            seen[hid[r * rk + i] & (E - 1)] = 1;
        for (int e = 0; e < E; e++)
            distinct += seen[e];
    }
    *bytes = distinct / ROUTINGS * 3.0 * H * I * 2;
    for (int b = 0; b < n; b++) {                  /* one process, one device: the buffers serve both */
        backend_t *be = bes[b];
        std::vector<float> t_ms;
        const int calls = 16;
        for (int rep = 0; rep < 7; rep++) {
            be->ops->sync(be);
            const double t0 = s_now();
            for (int i = 0; i < calls; i++) {
                const int r = i % ROUTINGS, l = (i / ROUTINGS) % LAYERS;
                be->ops->moe_route(be, logits + (size_t)r * M * E, M, E, K, 1, ids + r * rk, w + r * rk);
                be->ops->moe_ffn(be, x, M, H, ids + r * rk, w + r * rk, K, ex[l], E, scratch, out);
            }
            if (be->ops->sync(be) != 0) {
                fprintf(stderr, "bench_cuda: moe_ffn failed on backend %d of %d at M = %d (experts' qfmt %d)\n", b, n,
                        M, ex[0][0].gate.qfmt);
                exit(1);
            }
            if (rep >= 2)
                t_ms.push_back((float)((s_now() - t0) / calls * 1e3));
        }
        ms[b] = s_median(t_ms);
    }
    be0->ops->free(be0, x);
    be0->ops->free(be0, out);
    be0->ops->free(be0, logits);
    be0->ops->free(be0, w);
    be0->ops->free(be0, ids);
    be0->ops->free(be0, scratch);
}

/* A CUDA backend made with up to two `name=value` settings in the environment (NULL: none). */
static backend_t *s_backend2(const char *env_name, const char *value, const char *env2, const char *value2)
{
    char err[256];
    if (env_name)
        setenv(env_name, value, 1);
    if (env2)
        setenv(env2, value2, 1);
    backend_t *be = backend_new("cuda", 0, err, sizeof err);
    if (env_name)
        unsetenv(env_name);
    if (env2)
        unsetenv(env2);
    if (!be) {
        fprintf(stderr, "bench_cuda: %s\n", err);
        exit(1);
    }
    return be;
}

static backend_t *s_backend(const char *env_name, const char *value)
{
    return s_backend2(env_name, value, NULL, NULL);
}

/* 7. The sample op against downloading the logits it replaces. */
static void s_sample_bench(void)
{
    enum { M = 256, N = 128256 };
    backend_t *be = s_backend(NULL, NULL);
    std::vector<float> h((size_t)M * N);
    uint64_t x = 7;
    for (auto &v : h) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        v = (float)((x >> 40) % 20000) * 1e-3f - 10.0f;
    }
    float *d = (float *)be->ops->alloc(be, h.size() * 4);
    int32_t *ids = (int32_t *)be->ops->alloc(be, M * 4);
    if (!d || !ids || be->ops->upload(be, d, h.data(), h.size() * 4) != 0) {
        fprintf(stderr, "bench_cuda: sample: no memory\n");
        exit(1);
    }
    std::vector<bk_sample_t> sp(M);
    for (int m = 0; m < M; m++)
        sp[m] = bk_sample_t{0.8, 50, 0.9, 0.0, (uint64_t)m, 0};
    std::vector<float> t_s, t_d;
    for (int it = 0; it < 12; it++) {
        for (int m = 0; m < M; m++)
            sp[m].step = (uint64_t)it;
        be->ops->sync(be);
        double t0 = s_now();
        be->ops->sample(be, d, M, N, sp.data(), ids);
        be->ops->sync(be);
        double t1 = s_now();
        be->ops->download(be, h.data(), d, h.size() * 4);
        double t2 = s_now();
        if (it >= 2) {
            t_s.push_back((float)((t1 - t0) * 1e3));
            t_d.push_back((float)((t2 - t1) * 1e3));
        }
    }
    printf("sample_M256_ms %.4f ms (top-k 50, top-p 0.9, vocab 128256)\n", s_median(t_s));
    printf("logits_download_M256_ms %.4f ms (%zu MB)\n", s_median(t_d), h.size() * 4 >> 20);
    be->ops->free(be, d);
    be->ops->free(be, ids);
    backend_destroy(&be);
}

/* The MoE layer with quantized experts of format fmt (activations act, column groups of gc, 0: per
 * channel), on the device, host, grouped and default backends of bes: the bf16 buffers' bytes of wl
 * taken as codes (speed only: the values mean nothing), every scale 0.01, written into ex. Lines
 * moe_<name>_M<M>_{device,grouped,host,default}_ms, each with the bandwidth its bytes (codes and
 * scales of the experts routed to) reach and its fraction of the bound (those bytes at the copy
 * bandwidth bw). */
static void s_moe_quant_bench(backend_t *const *bes, bk_expert_t (*ex)[128], void *const *wl, int fmt, int act, int gc,
                              const char *name, double bw, const int *Ms, int n_m)
{
    enum { H = 2048, I = 768, E = 128, LAYERS = 2 };
    const size_t per = (size_t)3 * I * H;         /* values of one expert */
    const int nib = fmt == BK_Q_I4 || fmt == BK_Q_FP4;
    const dtype_t dt = fmt == BK_Q_FP8 ? DT_F8E4M3 : fmt == BK_Q_I8 ? DT_I8 : DT_U8;
    const int gcu = gc ? gc : H, gcd = gc ? gc : I;      /* gate|up's and down's column groups */
    const size_t ns = (size_t)2 * I * ((H + gcu - 1) / gcu) + (size_t)H * ((I + gcd - 1) / gcd);
    float *sc;
    CK(cudaMalloc(&sc, (size_t)LAYERS * E * ns * 4));
    std::vector<float> hs((size_t)LAYERS * E * ns, 0.01f);
    CK(cudaMemcpy(sc, hs.data(), hs.size() * 4, cudaMemcpyHostToDevice));
    for (int l = 0; l < LAYERS; l++)
        for (int e = 0; e < E; e++) {
            const uint8_t *p = (const uint8_t *)wl[l] + per * e;   /* nibbles use half of it */
            const size_t cu = (size_t)I * H / (nib ? 2 : 1);       /* code bytes of gate (and of up) */
            const float *s0 = sc + ((size_t)l * E + e) * ns, *s1 = s0 + (size_t)I * ((H + gcu - 1) / gcu);
            const bk_mat_t g = {.data = p, .dtype = dt, .rows = I, .cols = H, .qfmt = (int8_t)fmt, .qact = (int8_t)act,
                                .qgr = 1, .qgc = gcu, .qscale = s0};
            ex[l][e].gate = g;
            ex[l][e].up = g;
            ex[l][e].up.data = p + cu;
            ex[l][e].up.qscale = s1;
            ex[l][e].down = (bk_mat_t){.data = p + 2 * cu, .dtype = dt, .rows = H, .cols = I, .qfmt = (int8_t)fmt,
                                       .qact = (int8_t)act, .qgr = 1, .qgc = gcd,
                                       .qscale = s1 + (size_t)I * ((H + gcu - 1) / gcu)};
        }
    const double expert_bytes =
        (double)(bk_mat_bytes(&ex[0][0].gate) + bk_mat_bytes(&ex[0][0].up) + bk_mat_bytes(&ex[0][0].down));
    const char *path[4] = {"device", "host", "grouped", "default"};
    for (int i = 0; i < n_m; i++) {
        const int M = Ms[i];
        double ms[4], bytes;
        s_moe_layer_ms(bes, 4, ex, M, ms, &bytes);
        bytes *= expert_bytes / (3.0 * H * I * 2);   /* the routed experts' bytes in this format */
        const double bound_ms = bytes / (bw * 1e12) * 1e3, flop = (double)M * 8 * 6 * H * I;
        printf("moe_%s_M%d_weight_bytes %.0f bytes (%.2f MB per expert; bound %.4f ms at the copy bandwidth)\n", name,
               M, bytes, expert_bytes / 1e6, bound_ms);
        for (int b = 0; b < 4; b++)
            printf("moe_%s_M%d_%s_ms %.4f ms (%.3f TB/s, %.0f%% of the bound, %.1f TFLOP/s)\n", name, M, path[b], ms[b],
                   bytes / (ms[b] * 1e-3) / 1e12, 100.0 * bound_ms / ms[b], flop / (ms[b] * 1e-3) / 1e12);
    }
    CK(cudaFree(sc));
}


/* The MoE layer of Qwen3-30B-A3B's shape (s_moe_layer_ms) at the first n_m of M = 1, 16, 64 (decode
 * batches), 256, 1024, 2048 (prefill chunks): bf16 experts on the FMA device path, the grouped path
 * (its default row tile, then each forced from M = 256) and the host-sorted path; then quantized
 * experts in each format (s_moe_quant_bench). bw: the copy bandwidth (TB/s), the bound's rate. */
static void s_moe_bench(double bw, int n_m)
{
    enum { H = 2048, I = 768, E = 128, LAYERS = 2, NMB = 6 };
    backend_t *mbe[NMB + 1] = {NULL, s_backend("TROUPE_CUDA_MOE_DEVICE", "0"),
                               s_backend("TROUPE_CUDA_MOE_DEVICE_MAX_M", "0"), NULL, NULL, NULL, s_backend(NULL, NULL)};
    setenv("TROUPE_CUDA_MOE_GROUPED_MIN_M", "1000000", 1);   /* with the next: the FMA path for every M */
    mbe[0] = s_backend("TROUPE_CUDA_MOE_DEVICE_MAX_M", "1000000");
    unsetenv("TROUPE_CUDA_MOE_GROUPED_MIN_M");
    const int bms[3] = {32, 64, 128};
    setenv("TROUPE_CUDA_MOE_DEVICE_MAX_M", "0", 1);
    for (int i = 0; i < 3; i++) {
        char v[8];
        snprintf(v, sizeof v, "%d", bms[i]);
        mbe[3 + i] = s_backend("TROUPE_CUDA_MOE_GROUPED_BM", v);
    }
    unsetenv("TROUPE_CUDA_MOE_DEVICE_MAX_M");
    static bk_expert_t ex[LAYERS][E];
    const size_t per = (size_t)3 * I * H;     /* bf16 elements of one expert: gate, up, down */
    void *wl[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        CK(cudaMalloc(&wl[l], per * E * 2));
        s_fill(wl[l], per * E * 2, 200 + l);
        for (int e = 0; e < E; e++) {
            const uint16_t *p = (const uint16_t *)wl[l] + per * e;
            ex[l][e].gate = (bk_mat_t){.data = p, .dtype = DT_BF16, .rows = I, .cols = H};
            ex[l][e].up = (bk_mat_t){.data = p + (size_t)I * H, .dtype = DT_BF16, .rows = I, .cols = H};
            ex[l][e].down = (bk_mat_t){.data = p + (size_t)2 * I * H, .dtype = DT_BF16, .rows = H, .cols = I};
        }
    }
    const int Ms[6] = {1, 16, 64, 256, 1024, 2048};    /* 1024, 2048: prefill chunks */
    for (int i = 0; i < n_m; i++) {
        const int M = Ms[i];
        double ms[NMB], bytes;
        s_moe_layer_ms(mbe, M >= 256 ? NMB : 3, ex, M, ms, &bytes);
        const double flop = (double)M * 8 * 6 * H * I;
        printf("moe_M%d_weight_bytes %.0f bytes (%.1f experts of 9.4 MB)\n", M, bytes, bytes / (3.0 * H * I * 2));
        printf("moe_M%d_device_ms %.4f ms (%.3f TB/s, %.0f%% of the bound %.4f ms)\n", M, ms[0],
               bytes / (ms[0] * 1e-3) / 1e12, 100.0 * bytes / (bw * 1e12) * 1e3 / ms[0], bytes / (bw * 1e12) * 1e3);
        printf("moe_M%d_grouped_ms %.4f ms (%.3f TB/s, %.1f TFLOP/s)\n", M, ms[2], bytes / (ms[2] * 1e-3) / 1e12,
               flop / (ms[2] * 1e-3) / 1e12);
        printf("moe_M%d_host_ms %.4f ms (%.3f TB/s)\n", M, ms[1], bytes / (ms[1] * 1e-3) / 1e12);
        for (int b = 3; M >= 256 && b < NMB; b++)
            printf("moe_M%d_grouped_bm%d_ms %.4f ms (%.1f TFLOP/s)\n", M, bms[b - 3], ms[b],
                   flop / (ms[b] * 1e-3) / 1e12);
    }
    /* Quantized experts: the device, host, grouped and default backends. */
    backend_t *qbe[4] = {mbe[0], mbe[1], mbe[2], mbe[NMB]};
    static const struct { int fmt, act, gc; const char *name; } fmts[4] = {
        {BK_Q_FP8, BK_QA_FP8_TOKEN, 0, "fp8"},     /* per channel, fp8 per-token activations */
        {BK_Q_I8, BK_QA_I8_TOKEN, 0, "int8"},      /* per channel, int8 per-token activations (W8A8) */
        {BK_Q_I4, BK_QA_NONE, 128, "int4"},        /* groups of 128, weight-only */
        {BK_Q_FP4, BK_QA_NONE, 16, "nvfp4"},       /* groups of 16, weight-only */
    };
    for (int f = 0; f < 4; f++)
        s_moe_quant_bench(qbe, ex, wl, fmts[f].fmt, fmts[f].act, fmts[f].gc, fmts[f].name, bw, Ms, n_m);
    for (int l = 0; l < LAYERS; l++)
        CK(cudaFree(wl[l]));
    for (int b = 0; b <= NMB; b++)
        backend_destroy(&mbe[b]);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);              /* lines in order with stderr's messages */
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    const int copy_only = argc > 1 && !strcmp(argv[1], "--copy-only");
    const int moe_only = argc > 1 && !strcmp(argv[1], "--moe");
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
    const double bw = s_copy_bandwidth();
    printf("copy_bandwidth %.3f TB/s\n", bw);
    if (copy_only)
        return 0;
    if (moe_only) {                                /* the decode batches only */
        s_moe_bench(bw, 3);
        return 0;
    }
    const double tf = s_gemm_tflops(8192);
    printf("gemm_bf16_8192 %.1f TFLOP/s\n", tf);

    /* The bf16 GEMV on CUDA cores with 4 warps per row and by the matrix (TROUPE_CUDA_GEMV_MMA=0:
     * what one-row steps take by default), on tensor cores with 4 and 8 warps per block (8: the
     * default from 2 rows; here for every M), and cuBLASLt at M = 1 (activations rounded once). */
    enum { NV = 6, V_CC = 1, V_MMA = 3, V_K128 = 4 };
    const char *vname[NV] = {"GEMV cc w4", "GEMV cc", "tensor w4", "tensor w8", "tensor k128", "cuBLASLt"};
    const char *vkey[NV] = {"gemv_cc_w4", "gemv_cc", "gemv_mma4", "gemv_mma8", "gemv_mma_k128", "cublaslt"};
    backend_t *bes[NV] = {s_backend2("TROUPE_CUDA_GEMV_MMA", "0", "TROUPE_CUDA_GEMV_WARPS", "4"),
                          s_backend("TROUPE_CUDA_GEMV_MMA", "0"),
                          s_backend2("TROUPE_CUDA_GEMV_MMA", "4", "TROUPE_CUDA_GEMV_MMA_MIN_M", "1"),
                          s_backend("TROUPE_CUDA_GEMV_MMA_MIN_M", "1"),
                          s_backend2("TROUPE_CUDA_GEMV_MMA_MIN_M", "1", "TROUPE_CUDA_GEMV_MMA_KSTEP", "128"), NULL};
    bes[5] = s_backend2("TROUPE_CUDA_GEMV_MAX_M", "0", "TROUPE_CUDA_GEMM_SPLIT", "0");
    /* Llama-3.1-8B: one layer's matmuls (count per layer), then the LM head once per step. */
    struct { const char *name; int64_t N, K; int per_layer; } shapes[] = {
        {"q_proj/o_proj", 4096, 4096, 2}, {"k_proj/v_proj", 1024, 4096, 2}, {"gate/up_proj", 14336, 4096, 2},
        {"down_proj", 4096, 14336, 1},    {"lm_head", 128256, 4096, 0},
    };
    const int n_shapes = quick ? 2 : 5;
    double step[NV] = {0}, bytes_step = 0;
    printf("%-14s %8s", "M=1 bf16", "MB");
    for (int v = 0; v < NV; v++)
        printf(" %9s us %6s", vname[v], "GB/s");
    printf("\n");
    for (int i = 0; i < n_shapes; i++) {
        const double mb = shapes[i].N * shapes[i].K * 2 / 1e6;
        const double times = shapes[i].per_layer ? 32.0 * shapes[i].per_layer : 1.0;
        printf("%-14s %8.1f", shapes[i].name, mb);
        for (int v = 0; v < NV; v++) {
            const double t = s_backend_matmul_us(bes[v], 1, shapes[i].N, shapes[i].K);
            printf(" %12.1f %6.0f", t, mb * 1e3 / t);
            step[v] += times * t;
        }
        printf("\n");
        bytes_step += times * mb * 1e6;
    }
    if (!quick) {
        printf("weight_bytes_step %.0f bytes\n", bytes_step);
        for (int v = 0; v < NV; v++) {
            printf("%s_step_ms %.3f ms\n", vkey[v], step[v] / 1e3);
            printf("%s_bandwidth %.3f TB/s\n", vkey[v], bytes_step / (step[v] * 1e-6) / 1e12);
        }
        /* The 8B step's matmuls at M = 1..8 rows (a speculative verify step of k + 1 rows at batch
         * 1): CUDA cores against tensor cores, the time per step and what M rows add to one. */
        printf("%-6s %12s %12s %12s %8s\n", "rows", "cc ms", "tensor ms", "k128 ms", "cc/tensor");
        for (int M = 1; M <= 8; M++) {
            double t[3] = {0, 0, 0};
            const int vs[3] = {V_CC, V_MMA, V_K128};
            for (int i = 0; i < 5; i++)
                for (int v = 0; v < 3; v++) {
                    const double times = shapes[i].per_layer ? 32.0 * shapes[i].per_layer : 1.0;
                    t[v] += times * s_backend_matmul_us(bes[vs[v]], M, shapes[i].N, shapes[i].K);
                }
            printf("%-6d %12.3f %12.3f %12.3f %8.2f\n", M, t[0] / 1e3, t[1] / 1e3, t[2] / 1e3, t[0] / t[1]);
            printf("gemv_rows_%d cc %.3f ms tensor %.3f ms k128 %.3f ms\n", M, t[0] / 1e3, t[1] / 1e3, t[2] / 1e3);
        }
        /* Prefill-sized GEMMs through the backend: activations split (forced for every M) and
         * rounded once (what the default does above TROUPE_CUDA_GEMM_SPLIT rows). */
        backend_t *split = s_backend("TROUPE_CUDA_GEMM_SPLIT", "1000000");
        const int Ms[2] = {128, 512};
        for (int i = 0; i < 2; i++) {
            const double flop = 2.0 * Ms[i] * 14336.0 * 4096.0;
            const double ts = s_backend_matmul_us(split, Ms[i], 14336, 4096);
            const double t1 = s_backend_matmul_us(bes[NV - 1], Ms[i], 14336, 4096);   /* cuBLASLt, rounded once */
            printf("gemm_M%d_split %.1f TFLOP/s (%.1f us)\n", Ms[i], flop / ts / 1e6, ts);
            printf("gemm_M%d_single %.1f TFLOP/s (%.1f us)\n", Ms[i], flop / t1 / 1e6, t1);
        }
        backend_destroy(&split);
    }
    for (int v = 0; v < NV; v++)
        backend_destroy(&bes[v]);

    s_moe_bench(bw, quick ? 1 : 6);

    /* Prefill attention, 1,000 tokens x 32 layers: tensor cores vs the flash kernel. */
    {
        backend_t *abe[2] = {s_backend("TROUPE_CUDA_ATTN_MMA", "1"), s_backend("TROUPE_CUDA_ATTN_MMA", "0")};
        double ams[2];
        std::vector<float> aout[2];
        s_attn_prefill_ms(abe, 2, ams, aout, DT_BF16);
        const double flop = 32.0 * 32.0 * 4.0 * 128.0 * (1000.0 * 1001.0 / 2.0);   /* layers x heads x 4 D x keys seen */
        printf("attn_prefill_mma_ms %.3f ms (1,000 tokens x 32 layers, %.0f TFLOP/s)\n", ams[0], flop / (ams[0] * 1e-3) / 1e12);
        printf("attn_prefill_flash_ms %.3f ms (1,000 tokens x 32 layers, %.0f TFLOP/s)\n", ams[1], flop / (ams[1] * 1e-3) / 1e12);
        double num = 0, den = 0;
        for (size_t i = 0; i < aout[1].size(); i++) {
            const double d = (double)aout[0][i] - aout[1][i];
            num += d * d;
            den += (double)aout[1][i] * aout[1][i];
        }
        printf("attn_prefill_mma_vs_flash %.2e rel\n", den > 0 ? sqrt(num / den) : sqrt(num));
        double fms;                                /* the same over an fp8 cache (other values: timing only) */
        std::vector<float> fout[1];
        s_attn_prefill_ms(abe, 1, &fms, fout, DT_F8E4M3);
        printf("attn_prefill_fp8_ms %.3f ms (1,000 tokens x 32 layers, %.0f TFLOP/s, %.2fx the bf16 cache)\n", fms,
               flop / (fms * 1e-3) / 1e12, ams[0] / fms);
        backend_destroy(&abe[0]);
        backend_destroy(&abe[1]);
    }
    /* Decode attention, one step of B sequences at 1,000 tokens x 32 layers: tensor cores vs the
     * flash kernel, and the fraction of the copy bandwidth the K/V reads reach. */
    {
        backend_t *dbe[2] = {s_backend("TROUPE_CUDA_ATTN_MMA_DECODE", "1"), s_backend("TROUPE_CUDA_ATTN_MMA_DECODE", "0")};
        const int Bs[3] = {1, 64, 256};
        for (int i = quick ? 2 : 0; i < 3; i++) {
            double dms[2], bytes;
            std::vector<float> dout[2];
            s_attn_decode_ms(dbe, 2, Bs[i], dms, dout, &bytes, DT_BF16);
            const double tb0 = bytes / (dms[0] * 1e-3) / 1e12, tb1 = bytes / (dms[1] * 1e-3) / 1e12;
            printf("attn_decode_b%d_kv_bytes %.0f bytes (1,000 tokens x 32 layers)\n", Bs[i], bytes);
            printf("attn_decode_b%d_mma_ms %.3f ms\n", Bs[i], dms[0]);
            printf("attn_decode_b%d_flash_ms %.3f ms\n", Bs[i], dms[1]);
            printf("attn_decode_b%d_mma_TBps %.3f TB/s (%.0f%% of the copy bandwidth)\n", Bs[i], tb0, 100.0 * tb0 / bw);
            printf("attn_decode_b%d_flash_TBps %.3f TB/s (%.0f%% of the copy bandwidth)\n", Bs[i], tb1, 100.0 * tb1 / bw);
            double num = 0, den = 0;
            for (size_t j = 0; j < dout[1].size(); j++) {
                const double d = (double)dout[0][j] - dout[1][j];
                num += d * d;
                den += (double)dout[1][j] * dout[1][j];
            }
            printf("attn_decode_b%d_mma_vs_flash %.2e rel\n", Bs[i], den > 0 ? sqrt(num / den) : sqrt(num));
            /* The same step over an fp8 cache (half the bytes; its own random values, timing only). */
            double fms, fbytes;
            std::vector<float> fout[1];
            s_attn_decode_ms(dbe, 1, Bs[i], &fms, fout, &fbytes, DT_F8E4M3);
            const double tbf = fbytes / (fms * 1e-3) / 1e12;
            printf("attn_decode_b%d_fp8_ms %.3f ms (%.3f TB/s, %.0f%% of the copy bandwidth; %.2fx the bf16 cache)\n",
                   Bs[i], fms, tbf, 100.0 * tbf / bw, dms[0] / fms);
        }
        backend_destroy(&dbe[0]);
        backend_destroy(&dbe[1]);
    }
    s_sample_bench();
    return 0;
}
