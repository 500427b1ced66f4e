/* tests/gpu/bench_qgemv.cu — the quantized weight-only GEMV (kernels/cuda/cuda_qgemv.cuh) checked
 * against a CPU reference and timed on Llama-3.1-8B's decode shapes; needs only the CUDA runtime.
 *
 *   build/gpu-tests/bench_qgemv [--check-only] [--warps W] [--lk 32]
 *
 * --warps forces the warps sharing a row group's K (2, 4, 8; default: qv_warps), --lk 32 the
 * whole-warp lane layout at M = 1 (default: QV_LK lanes along K per row group).
 * Check: random codes (every code but fp8's NaNs) and positive scales for each format and scale
 * grid (fp8 per tensor, per channel and 128 x 128 blocks; int8 per channel; int4 groups of 128 and
 * 64; nvfp4 groups of 16), M = 1..8, odd N, K on the vector kernel and K it cannot take (the
 * one-code-per-lane kernel), bias or none: y against sum_k x * decode(code) * scale in double, a
 * relative L2 error within 1e-5 (f32 sums) and every element written. One line per format: PASS or
 * FAIL with the worst case.
 * Time: each 8B layer matrix (q 4096, k / v 1024, o 4096 rows x 4096; gate / up 14336 x 4096;
 * down 4096 x 14336) at M = 1 and M = 8, over rotating weight copies (>= 512 MB, so the L2 never
 * holds W), median of 5 repeats of 20 calls after a warm-up; per format the 32 layers' sum (a decode
 * step's quantized matmuls; the bf16 LM head not included) and the bytes it streams per second.
 * Exit status 1 when a check failed. */
#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define BENCH_NAME "bench_qgemv"
#include "tests/gpu/bench_check.h"
#include "kernels/cuda/cuda_qgemv.cuh"

static uint64_t s_rng = 0x9e3779b97f4a7c15ull;
static uint32_t s_rand(void)
{
    s_rng ^= s_rng << 13;
    s_rng ^= s_rng >> 7;
    s_rng ^= s_rng << 17;
    return (uint32_t)(s_rng >> 16);
}
static float s_unif(float a) { return ((float)(s_rand() & 0xffffff) / 16777216.0f * 2.0f - 1.0f) * a; }

/* Independent of the kernels: the code values by their definitions. */
static double s_fp8(uint8_t b)
{
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    return s ? -v : v;
}
static double s_code(int fmt, const uint8_t *row, int64_t c)
{
    if (fmt == BK_Q_FP8)
        return s_fp8(row[c]);
    if (fmt == BK_Q_I8)
        return (double)(int8_t)row[c];
    const unsigned nib = (c & 1) ? row[c >> 1] >> 4 : row[c >> 1] & 15u;
    if (fmt == BK_Q_I4)
        return (double)((int)nib - 8);
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    return (nib & 8) ? -mag[nib & 7] : mag[nib & 7];
}

typedef struct fmt_case { int fmt, gr, gc; const char *name; } fmt_case_t;
static const fmt_case_t s_fmts[] = {
    {BK_Q_FP8, 0, 0, "fp8 per tensor"},   {BK_Q_FP8, 1, 0, "fp8 per channel"}, {BK_Q_FP8, 128, 128, "fp8 128x128"},
    {BK_Q_I8, 1, 0, "int8 per channel"},  {BK_Q_I4, 1, 128, "int4 g128"},      {BK_Q_I4, 1, 64, "int4 g64"},
    {BK_Q_FP4, 1, 16, "nvfp4 g16"},
};

typedef struct dev_w {
    uint8_t *codes;
    float *scale;
    int64_t N, K, ngc;
    int gr, gc;
} dev_w_t;

static void s_effective(const fmt_case_t &f, int64_t N, int64_t K, int *gr, int *gc)
{
    *gr = f.gr == 0 ? (int)N : f.gr;
    *gc = f.gc == 0 ? (int)K : f.gc;
}

static int s_lk = QV_LK;                           /* --lk 32: the whole-warp layout (M = 1 only) */

static void s_launch(int fmt, const dev_w_t &w, const float *x, int M, const float *bias, float *y, int warps, int n_sm,
                     bool *vec_out)
{
    qv_args_t a = {w.codes, w.scale, w.N, w.K, w.ngc, w.gr, w.gc, 0, x, M, bias, y};
    bool rs;
    int gshift;
    qv_kernel_t k = NULL;
    const int lk = M == 1 ? s_lk : QV_LK;
    const int W = warps ? warps : qv_warps(w.N, w.K, fmt, n_sm, lk);
    if (qv_vector_ok(fmt, w.N, w.K, w.gr, w.gc, w.codes, x, &rs, &gshift) && (k = qv_kernel(fmt, M, W, rs, lk))) {
        a.gshift = gshift;
        k<<<qv_blocks(w.N, W, lk), QV_THREADS>>>(a);
    } else {
        k_qgemv_any<<<(unsigned)((w.N + 7) / 8), QV_THREADS>>>(a, fmt);
    }
    if (vec_out)
        *vec_out = k != NULL;
    CK(cudaGetLastError());
}

/* One check; returns the relative error (or 1e30 for an unwritten element). */
static double s_check(const fmt_case_t &f, int M, int64_t N, int64_t K, bool with_bias, int warps, int n_sm, bool *vec)
{
    const bool nib = f.fmt == BK_Q_I4 || f.fmt == BK_Q_FP4;
    const int64_t rowb = nib ? K / 2 : K;
    dev_w_t w = {};
    w.N = N, w.K = K;
    s_effective(f, N, K, &w.gr, &w.gc);
    w.ngc = (K + w.gc - 1) / w.gc;
    const int64_t ngr = (N + w.gr - 1) / w.gr;
    std::vector<uint8_t> codes((size_t)(N * rowb));
    for (auto &c : codes) {
        c = (uint8_t)s_rand();
        if (f.fmt == BK_Q_FP8 && (c & 0x7f) == 0x7f)
            c ^= 1;                                /* no NaN codes */
    }
    std::vector<float> sc((size_t)(ngr * w.ngc)), x((size_t)M * K), bias((size_t)N), y((size_t)M * N);
    for (auto &s : sc)
        s = (0.25f + fabsf(s_unif(1.0f))) * (f.fmt == BK_Q_I8 ? 0.01f : 0.1f);
    for (auto &v : x)
        v = s_unif(1.0f);
    for (auto &v : bias)
        v = s_unif(1.0f);
    float *dx, *db, *dy;
    CK(cudaMalloc(&w.codes, codes.size() + 16));
    CK(cudaMalloc(&w.scale, sc.size() * 4));
    CK(cudaMalloc(&dx, x.size() * 4));
    CK(cudaMalloc(&db, bias.size() * 4));
    CK(cudaMalloc(&dy, y.size() * 4));
    CK(cudaMemcpy(w.codes, codes.data(), codes.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(w.scale, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(dy, 0xff, y.size() * 4));        /* NaN: an unwritten element shows */
    s_launch(f.fmt, w, dx, M, with_bias ? db : NULL, dy, warps, n_sm, vec);
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double ref = with_bias ? bias[n] : 0.0;
            const uint8_t *row = codes.data() + n * rowb;
            for (int64_t k = 0; k < K; k++)
                ref += (double)x[(size_t)m * K + k] * s_code(f.fmt, row, k) * sc[(size_t)((n / w.gr) * w.ngc + k / w.gc)];
            const double got = y[(size_t)m * N + n];
            if (!isfinite(got))
                num = 1e300;
            num += (got - ref) * (got - ref);
            den += ref * ref;
        }
    cudaFree(w.codes), cudaFree(w.scale), cudaFree(dx), cudaFree(db), cudaFree(dy);
    return num >= 1e300 ? 1e30 : sqrt(num / (den > 0 ? den : 1));
}

static int s_checks(int warps, int n_sm)
{
    /* N, K: the vector kernel's shapes (K a multiple of 128; 1,056 = 8 x 132: int4 g64 and fp8's
     * 128-blocks end on a partial group), and shapes only the any-shape kernel takes. */
    static const int64_t shapes[][2] = {{257, 1024}, {37, 4096}, {130, 1056}, {100, 1000}, {64, 1040}, {33, 136}};
    int failed = 0;
    for (const fmt_case_t &f : s_fmts) {
        double worst = 0;
        char worst_what[96] = "";
        int n_vec = 0, n_any = 0;
        for (const auto &sh : shapes) {
            const bool nib = f.fmt == BK_Q_I4 || f.fmt == BK_Q_FP4;
            if (nib && sh[1] % 2)
                continue;
            if (f.fmt == BK_Q_FP4 && sh[1] % 16)
                continue;                          /* nvfp4's blocks of 16 */
            for (int M = 1; M <= 8; M++) {
                bool vec = false;
                const bool bias = (M + sh[0]) % 2;
                const double e = s_check(f, M, sh[0], sh[1], bias, warps, n_sm, &vec);
                (vec ? n_vec : n_any)++;
                if (!(e <= worst)) {
                    worst = e;
                    snprintf(worst_what, sizeof worst_what, "M=%d N=%lld K=%lld%s (%s kernel)", M, (long long)sh[0],
                             (long long)sh[1], bias ? " bias" : "", vec ? "vector" : "any-shape");
                }
            }
        }
        const bool ok = worst <= 1e-5;
        failed += !ok;
        printf("check %-18s %s  worst rel err %.2e at %s; %d vector, %d any-shape cases\n", f.name, ok ? "PASS" : "FAIL",
               worst, worst_what, n_vec, n_any);
    }
    return failed;
}

/* ---- timing ------------------------------------------------------------------------------------ */

static double s_time_shape(const fmt_case_t &f, int M, int64_t N, int64_t K, int warps, int n_sm)
{
    const bool nib = f.fmt == BK_Q_I4 || f.fmt == BK_Q_FP4;
    const size_t wbytes = (size_t)(N * (nib ? K / 2 : K));
    const int copies = (int)std::max<size_t>(2, ((size_t)512 << 20) / wbytes + 1);
    dev_w_t w = {};
    w.N = N, w.K = K;
    s_effective(f, N, K, &w.gr, &w.gc);
    w.ngc = (K + w.gc - 1) / w.gc;
    const size_t nsc = (size_t)((N + w.gr - 1) / w.gr * w.ngc);
    uint8_t *codes;
    float *scale, *x, *y;
    CK(cudaMalloc(&codes, wbytes * copies));
    CK(cudaMalloc(&scale, nsc * 4 * copies));
    CK(cudaMalloc(&x, (size_t)M * K * 4));
    CK(cudaMalloc(&y, (size_t)M * N * 4));
    CK(cudaMemset(codes, 0x31, wbytes * copies));
    CK(cudaMemset(scale, 0, nsc * 4 * copies));
    CK(cudaMemset(x, 0, (size_t)M * K * 4));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> reps;
    for (int rep = -1; rep < 5; rep++) {
        CK(cudaEventRecord(e0));
        for (int i = 0; i < 20; i++) {
            const int c = (rep * 20 + i + 20) % copies;
            dev_w_t wc = w;
            wc.codes = codes + wbytes * c;
            wc.scale = scale + nsc * c;
            s_launch(f.fmt, wc, x, M, NULL, y, warps, n_sm, NULL);
        }
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 0)
            reps.push_back(ms * 1000.0f / 20.0f);
    }
    std::sort(reps.begin(), reps.end());
    cudaFree(codes), cudaFree(scale), cudaFree(x), cudaFree(y);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return reps[2];
}

static void s_times(int warps, int n_sm)
{
    /* rows, cols, matrices of the shape per layer: q and o, k and v, gate and up, down */
    static const int64_t shapes[][3] = {{4096, 4096, 2}, {1024, 4096, 2}, {14336, 4096, 2}, {4096, 14336, 1}};
    static const int fmts[] = {1, 3, 4, 6};        /* fp8 per channel, int8, int4 g128, nvfp4 */
    for (int M : {1, 8}) {
        for (int fi : fmts) {
            const fmt_case_t &f = s_fmts[fi];
            double step = 0, bytes = 0;
            char line[256];
            int used = snprintf(line, sizeof line, "time M=%d %-16s", M, f.name);
            for (const auto &sh : shapes) {
                const double us = s_time_shape(f, M, sh[0], sh[1], warps, n_sm);
                const bool nib = f.fmt == BK_Q_I4 || f.fmt == BK_Q_FP4;
                const int gr = f.gr ? f.gr : (int)sh[0], gc = f.gc ? f.gc : (int)sh[1];
                const double b = (double)sh[0] * sh[1] * (nib ? 0.5 : 1.0) +
                                 4.0 * (double)((sh[0] + gr - 1) / gr) * (double)((sh[1] + gc - 1) / gc);   /* codes + f32 scales */
                step += us * sh[2] * 32;
                bytes += b * sh[2] * 32;
                used += snprintf(line + used, sizeof line - used, " %lldx%lld %.1fus (%.0f GB/s)", (long long)sh[0],
                                 (long long)sh[1], us, b / us / 1e3);
            }
            printf("%s | 32 layers %.3f ms, %.0f GB/s\n", line, step / 1e3, bytes / step / 1e3);
        }
    }
}

int main(int argc, char **argv)
{
    int warps = 0, check_only = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--warps") == 0 && i + 1 < argc)
            warps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--lk") == 0 && i + 1 < argc)
            s_lk = atoi(argv[++i]) == 32 ? 32 : QV_LK;
        else if (strcmp(argv[i], "--check-only") == 0)
            check_only = 1;
        else {
            fprintf(stderr, "usage: bench_qgemv [--check-only] [--warps 2|4|8] [--lk 8|32]\n");
            return 2;
        }
    }
    int n_sm = 0;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    const int failed = s_checks(warps, n_sm);
    if (!check_only)
        s_times(warps, n_sm);
    printf("bench_qgemv: %s\n", failed ? "FAILED" : "all checks PASSED");
    return failed ? 1 : 0;
}
