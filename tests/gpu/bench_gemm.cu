/* tests/gpu/bench_gemm.cu — how far cuBLASLt's first heuristic choice is from its best candidate on
 * the GEMMs of a served Llama-3.1-8B step, and what the f32 output costs.
 *
 *   build/gpu-tests/bench_gemm [--quick]
 *
 * For each weight shape of the 8B model (q|k|v, o, gate|up, down, lm_head) and each row count M of
 * a serving step (256: a full decode batch; 2,048 and 2,304: a prefill chunk, alone and beside 256
 * decode rows), the backend's layout — y[M][N] f32 = x[M][K] bf16 . W[N][K]^T bf16, f32 accumulation
 * (cuda_matmul.cu) — is timed with:
 *   top1   the heuristic's first algorithm (what the backend runs today);
 *   best   the fastest of the heuristic's first CANDIDATES algorithms, each timed;
 *   bf16   the heuristic's first algorithm with a bf16 output instead of f32.
 * Each time is the median of 5 repeats of 20 calls over rotating weight copies (>= 256 MB, so the
 * 60 MB L2 does not serve W), after a warm-up. Output: one line per shape and M with TFLOP/s, then
 * the sum over one step (32 layers + the LM head) for each variant: the GEMM time of a step.
 */
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define BENCH_NAME "bench_gemm"
#include "tests/gpu/bench_check.h"

enum { CANDIDATES = 16 };
static const size_t WS_BYTES = (size_t)64 << 20;

__global__ void k_fill(uint16_t *p, size_t n, uint32_t seed)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed * 40503u;
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        const float v = ((float)(h & 0xffff) / 65536.0f - 0.5f) * 0.25f;   /* never zero runs */
        uint32_t b;
        memcpy(&b, &v, 4);
        p[i] = (uint16_t)(b >> 16);
    }
}

typedef struct gemm {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
} gemm_t;

/* The backend's plan shape: C[N][M] column-major = W^T-as-stored . x^T (cuda_matmul.cu s_plan). */
static gemm_t s_gemm(int M, int N, int K, cudaDataType_t ctype)
{
    gemm_t g;
    const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
    CKB(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CKB(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof op_t));
    CKB(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof op_n));
    CKB(cublasLtMatrixLayoutCreate(&g.la, CUDA_R_16BF, K, N, K));
    CKB(cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_16BF, K, M, K));
    CKB(cublasLtMatrixLayoutCreate(&g.lc, ctype, N, M, N));
    return g;
}

static void s_gemm_free(gemm_t *g)
{
    cublasLtMatrixLayoutDestroy(g->la);
    cublasLtMatrixLayoutDestroy(g->lb);
    cublasLtMatrixLayoutDestroy(g->lc);
    cublasLtMatmulDescDestroy(g->desc);
}

static int s_heuristics(cublasLtHandle_t lt, const gemm_t *g, cublasLtMatmulHeuristicResult_t *res, int want)
{
    cublasLtMatmulPreference_t pref;
    CKB(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = WS_BYTES;
    CKB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    int found = 0;
    CKB(cublasLtMatmulAlgoGetHeuristic(lt, g->desc, g->la, g->lb, g->lc, g->lc, pref, want, res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    int n = 0;
    for (int i = 0; i < found; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS)
            res[n++] = res[i];
    return n;
}

/* Median microseconds of one call of algo over the rotating weight copies. */
static double s_time(cublasLtHandle_t lt, const gemm_t *g, const cublasLtMatmulAlgo_t *algo,
                     const std::vector<void *> &w, const void *x, void *y, void *ws)
{
    const float alpha = 1.0f, beta = 0.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> us;
    const int calls = 20;
    for (int rep = 0; rep < 6; rep++) {
        CK(cudaEventRecord(e0));
        for (int i = 0; i < calls; i++)
            CKB(cublasLtMatmul(lt, g->desc, &alpha, w[i % w.size()], g->la, x, g->lb, &beta, y, g->lc, y, g->lc, algo,
                               ws, WS_BYTES, 0));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep > 0)
            us.push_back(ms * 1e3f / calls);
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    std::sort(us.begin(), us.end());
    return us[us.size() / 2];
}

int main(int argc, char **argv)
{
    const int quick = argc > 1 && !strcmp(argv[1], "--quick");
    struct { const char *name; int N, K, per_layer; } shapes[] = {
        {"qkv", 6144, 4096, 1}, {"o", 4096, 4096, 1}, {"gate_up", 28672, 4096, 1}, {"down", 4096, 14336, 1},
        {"lm_head", 128256, 4096, 0},
    };
    const int Ms[] = {256, 2048, 2304};
    const int n_shapes = quick ? 2 : 5, n_m = quick ? 1 : 3;
    cublasLtHandle_t lt;
    CKB(cublasLtCreate(&lt));
    void *ws, *x, *y;
    CK(cudaMalloc(&ws, WS_BYTES));
    CK(cudaMalloc(&x, (size_t)2304 * 14336 * 2));
    CK(cudaMalloc(&y, (size_t)2304 * 128256 * 4));
    k_fill<<<1024, 256>>>((uint16_t *)x, (size_t)2304 * 14336, 7);
    printf("%-8s %5s %10s %8s %10s %8s %10s %8s  %s\n", "shape", "M", "top1 us", "TFLOP/s", "best us", "TFLOP/s",
           "bf16 us", "TFLOP/s", "best of");
    for (int mi = 0; mi < n_m; mi++) {
        const int M = Ms[mi];
        double step[3] = {0, 0, 0}, flop_step = 0;
        for (int s = 0; s < n_shapes; s++) {
            const int N = shapes[s].N, K = shapes[s].K;
            if (!shapes[s].per_layer && M != 256)
                continue;                          /* a prefill chunk runs the LM head on its last rows only */
            const size_t wbytes = (size_t)N * K * 2;
            const int copies = std::min(64, (int)(((size_t)256 << 20) / wbytes) + 1);
            std::vector<void *> w(copies);
            for (int c = 0; c < copies; c++) {
                CK(cudaMalloc(&w[c], wbytes));
                k_fill<<<1024, 256>>>((uint16_t *)w[c], wbytes / 2, 100 + c);
            }
            CK(cudaDeviceSynchronize());
            gemm_t g32 = s_gemm(M, N, K, CUDA_R_32F), g16 = s_gemm(M, N, K, CUDA_R_16BF);
            cublasLtMatmulHeuristicResult_t res[CANDIDATES], r16[1];
            const int n = s_heuristics(lt, &g32, res, CANDIDATES);
            if (n == 0 || s_heuristics(lt, &g16, r16, 1) == 0) {
                fprintf(stderr, "bench_gemm: no algorithm for %s M=%d\n", shapes[s].name, M);
                exit(1);
            }
            const double t1 = s_time(lt, &g32, &res[0].algo, w, x, y, ws);
            double tb = t1;
            int ib = 0;
            for (int i = 1; i < n; i++) {
                const double t = s_time(lt, &g32, &res[i].algo, w, x, y, ws);
                if (t < tb) {
                    tb = t;
                    ib = i;
                }
            }
            const double t16 = s_time(lt, &g16, &r16[0].algo, w, x, y, ws);
            const double flop = 2.0 * M * (double)N * K;
            printf("%-8s %5d %10.1f %8.1f %10.1f %8.1f %10.1f %8.1f  #%d of %d\n", shapes[s].name, M, t1,
                   flop / t1 / 1e6, tb, flop / tb / 1e6, t16, flop / t16 / 1e6, ib, n);
            const double times = shapes[s].per_layer ? 32.0 : 1.0;
            step[0] += times * t1;
            step[1] += times * tb;
            step[2] += times * t16;
            flop_step += times * flop;
            s_gemm_free(&g32);
            s_gemm_free(&g16);
            for (int c = 0; c < copies; c++)
                CK(cudaFree(w[c]));
        }
        printf("gemm_step_M%d_top1_ms %.3f ms (%.0f TFLOP/s)\n", M, step[0] / 1e3, flop_step / step[0] / 1e6);
        printf("gemm_step_M%d_best_ms %.3f ms (%.0f TFLOP/s)\n", M, step[1] / 1e3, flop_step / step[1] / 1e6);
        printf("gemm_step_M%d_bf16out_ms %.3f ms (%.0f TFLOP/s)\n", M, step[2] / 1e3, flop_step / step[2] / 1e6);
    }
    CK(cudaFree(ws));
    CK(cudaFree(x));
    CK(cudaFree(y));
    cublasLtDestroy(lt);
    return 0;
}
