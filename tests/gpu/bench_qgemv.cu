/* tests/gpu/bench_qgemv.cu — the quantized weight-only GEMVs, the CUDA-core one
 * (kernels/cuda/cuda_qgemv.cuh) and the tensor-core one (cuda_qgemv_mma.cuh), checked against a
 * CPU reference and timed side by side on Llama-3.1-8B's decode shapes; needs only the CUDA runtime.
 *
 *   build/gpu-tests/bench_qgemv [--check-only] [--warps W] [--lk 32] [--mma-warps W] [--path old|mma|both]
 *                               [--stage 0] [--grid 0] [--fp8-decode mix] [--depth 2] [--i8-imma] [--layer-only]
 *
 * --warps forces the CUDA-core kernel's warps sharing a row group's K (2, 4, 8; default:
 * qv_warps), --lk 32 its whole-warp lane layout at M = 1 (default: QV_LK lanes along K per row
 * group); --mma-warps the tensor-core kernel's warps per block (4, 8, 16; default: qm_warps, and
 * the checks cycle through all of them); --path which kernels run (default both); --stage 0 makes
 * the tensor-core path run its x pre-pass for every call (default: each block stages x itself
 * where it fits, as the backend does); --grid 0 gives the tensor-core kernel a block per 16 rows
 * (default: as many blocks as the SMs hold at once, each taking row blocks in turn); --fp8-decode
 * mix decodes fp8 (one scale per row) half by the convert, half by integer operations; --depth 2
 * keeps two steps of loads in flight per lane (not four) for 1.5x the blocks per SM; --i8-imma runs
 * int8 W8A8 on the integer tensor cores (x's codes as bytes, exact int32 sums); --layer-only: no checks, only the "mma layer" timing of fp8
 * W8A8, int8 W8A8, int4 and nvfp4 at M = 1 (120 launches of each of its four matrices in turn: for ncu).
 * Check: random codes (every code but fp8's NaNs) and positive scales for each format and scale
 * grid (fp8 per tensor, per channel and 128 x 128 blocks; int8 per channel; int4 groups of 128 and
 * 64; nvfp4 groups of 16; for the tensor-core path also fp8 and int8 W8A8, x quantized per row),
 * M = 1..8, odd N, K on the vector kernels and K they cannot take (the one-code-per-lane kernel),
 * bias or none: y against sum_k x * decode(code) * scale in double, a relative L2 error within 1e-5
 * and every element written. One line per path and format: PASS or FAIL with the worst case and
 * how many cases each kernel ran; the tensor-core path FAILs a format it should take and ran no
 * case of. Then the tensor-core path's row bits at M = 1 against the same row inside M = 2..8
 * ("check mma rows"), which must be identical; and a launch over three parts (q, k, v-like) against
 * each part's own launch and against the pre-pass ("check mma parts"), also bit for bit.
 * Time: each 8B layer matrix (q 4096, k / v 1024, o 4096 rows x 4096; gate / up 14336 x 4096;
 * down 4096 x 14336) at M = 1 and M = 8, over rotating weight copies (>= 512 MB, so the L2 never
 * holds W), median of 5 repeats of 20 calls after a warm-up; per format and path the 32 layers'
 * sum (a decode step's quantized matmuls; the bf16 LM head not included) and the bytes it streams
 * per second. Kernels launch with PDL, as the backend's do; the tensor-core path's time includes
 * its x pre-pass where it runs one (a second launch, overlapped with the weight loads of the GEMV
 * after it). Then per format "mma layer": a layer as the engine runs it, q|k|v and gate|up each in
 * one launch, and the 32 layers' sum.
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
#include "kernels/cuda/cuda_qgemv_mma.cuh"

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

/* act: BK_QA_* (the W8A8 cases run on the tensor-core path only: the CUDA-core kernel is
 * weight-only, cuda_quant.cu quantizes x before it); mma: the tensor-core path must take it. */
typedef struct fmt_case { int fmt, gr, gc, act, mma; const char *name; } fmt_case_t;
static const fmt_case_t s_fmts[] = {
    {BK_Q_FP8, 0, 0, 0, 1, "fp8 per tensor"},  {BK_Q_FP8, 1, 0, 0, 1, "fp8 per channel"},
    {BK_Q_FP8, 128, 128, 0, 1, "fp8 128x128"}, {BK_Q_I8, 1, 0, 0, 1, "int8 per channel"},
    {BK_Q_I4, 1, 128, 0, 1, "int4 g128"},      {BK_Q_I4, 1, 64, 0, 1, "int4 g64"},
    {BK_Q_FP4, 1, 16, 0, 1, "nvfp4 g16"},      {BK_Q_FP8, 1, 0, BK_QA_FP8_TOKEN, 1, "fp8 W8A8"},
    {BK_Q_I8, 1, 0, BK_QA_I8_TOKEN, 1, "int8 W8A8"},
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
static void *s_scratch;                            /* the tensor-core path's xs (qm_scratch_bytes of the largest K) */
static int64_t s_scratch_k;

/* Launches as the backend makes them (cuda.h's cuda_launch): with programmatic dependent launch, so
 * a kernel's weight loads before its PDL wait overlap the previous kernel's end. */
template <typename... KArgs, typename... Args>
static void s_pdl_smem(void (*kernel)(KArgs...), unsigned grid, unsigned block, size_t smem, Args... args)
{
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...));
}
template <typename... KArgs, typename... Args>
static void s_pdl(void (*kernel)(KArgs...), unsigned grid, unsigned block, Args... args)
{
    s_pdl_smem(kernel, grid, block, 0, args...);
}

static int s_stage = 1;                            /* --stage 0: the tensor-core path's pre-pass for every call */
static int s_n_sm;                                 /* --grid 0: a block per row block (0); else the SMs */
static int s_fp8_mix;                              /* --fp8-decode mix: fp8 decoded half by integer ops */
static int s_shallow;                              /* --depth 2: two steps of loads in flight, more blocks */
static int s_i8_imma;                              /* --i8-imma: int8 W8A8 on the integer tensor cores */

/* The tensor-core GEMV over n parts (one x), as cuda_quant.cu launches it; 0 when it does not
 * take them. s_scratch must hold qm_scratch_bytes(K). */
static int s_qm_launch(const fmt_case_t &f, int64_t K, int gc, const float *x, int M, const qm_part_t *parts, int n,
                       int mma_warps)
{
    qm_plan_t pl;
    if (!qm_setup(&pl, f.fmt, K, gc, f.act, x, M, parts, n, s_scratch, mma_warps,
                  (s_stage ? QM_F_STAGE : 0) | (s_fp8_mix ? QM_F_FP8_MIX : 0) | (s_shallow ? QM_F_SHALLOW : 0) |
                      (s_i8_imma ? QM_F_I8_IMMA : 0),
                  s_n_sm))
        return 0;
    if (pl.prep)
        s_pdl(pl.prep, (unsigned)M, QM_PREP_THREADS, x, K, M, f.act, qm_scratch_xs(s_scratch), (float *)s_scratch);
    s_pdl_smem(pl.kernel, pl.blocks, pl.threads, pl.smem, pl.args);
    CK(cudaGetLastError());
    return 1;
}

enum { K_VEC, K_ANY, K_MMA };                      /* which kernel a launch ran */
static const char *const s_kind_name[] = {"vector", "any-shape", "tensor-core"};

/* y = x W^T on the CUDA-core kernels (mma 0) or the tensor-core one where it takes the shape (mma
 * 1; the CUDA-core kernels otherwise, as cuda_quant.cu does). act: x quantized per row (mma only). */
static int s_launch(const fmt_case_t &f, const dev_w_t &w, const float *x, int M, const float *bias, float *y, int warps,
                    int n_sm, int mma, int mma_warps)
{
    if (mma) {
        if (w.K > s_scratch_k) {
            if (s_scratch)
                CK(cudaFree(s_scratch));
            CK(cudaMalloc(&s_scratch, qm_scratch_bytes(w.K)));
            s_scratch_k = w.K;
        }
        const qm_part_t part = {w.codes, w.scale, bias, y, w.N, w.gr, 0};
        if (s_qm_launch(f, w.K, w.gc, x, M, &part, 1, mma_warps))
            return K_MMA;
    }
    qv_args_t a = {w.codes, w.scale, w.N, w.K, w.ngc, w.gr, w.gc, 0, x, M, bias, y};
    bool rs;
    int gshift;
    qv_kernel_t k = NULL;
    const int lk = M == 1 ? s_lk : QV_LK;
    const int W = warps ? warps : qv_warps(w.N, w.K, f.fmt, n_sm, lk);
    if (qv_vector_ok(f.fmt, w.N, w.K, w.gr, w.gc, w.codes, x, &rs, &gshift) && (k = qv_kernel(f.fmt, M, W, rs, lk))) {
        a.gshift = gshift;
        s_pdl(k, qv_blocks(w.N, W, lk), QV_THREADS, a);
    } else {
        s_pdl(k_qgemv_any, (unsigned)((w.N + 7) / 8), QV_THREADS, a, f.fmt);
    }
    CK(cudaGetLastError());
    return k ? K_VEC : K_ANY;
}

/* x as the kernels see it: weight-only x itself; W8A8 q * s per row, q = quant(x / s), s = amax /
 * 448 or / 127 in f32 (cpu_quant_act_row's arithmetic; the fp8 rounding is CUDA's host function). */
static void s_act_x(int act, const float *x, int M, int64_t K, std::vector<double> &out)
{
    out.assign((size_t)M * K, 0.0);
    for (int m = 0; m < M; m++) {
        const float *r = x + (size_t)m * K;
        float amax = 0.0f;
        for (int64_t k = 0; k < K; k++)
            amax = fmaxf(amax, fabsf(r[k]));
        const float sc = act == BK_QA_FP8_TOKEN ? amax / 448.0f : amax / 127.0f;
        for (int64_t k = 0; k < K; k++) {
            double v = r[k];
            if (act != BK_QA_NONE && amax != 0.0f) {
                float q = r[k] / sc;
                if (act == BK_QA_FP8_TOKEN) {
                    __nv_fp8_e4m3 c;
                    c.__x = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
                    q = (float)c;
                } else {
                    q = rintf(fminf(fmaxf(q, -127.0f), 127.0f));
                }
                v = (double)q * sc;
            }
            out[(size_t)m * K + k] = v;
        }
    }
}

/* One check; returns the relative error (or 1e30 for an unwritten element); *kind: the kernel.
 * rows_out (M floats x N, optional): y as computed. */
static double s_check(const fmt_case_t &f, int M, int64_t N, int64_t K, bool with_bias, int warps, int n_sm, int mma,
                      int mma_warps, int *kind, std::vector<float> *y_out = NULL, const std::vector<float> *x_in = NULL,
                      float xmag = 1.0f)
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
        v = s_unif(xmag);
    if (x_in)
        x = *x_in;
    for (auto &v : bias)
        v = s_unif(1.0f);
    std::vector<double> xa;
    s_act_x(f.act, x.data(), M, K, xa);
    /* W8A8 where the tensor-core kernel does not run: the CUDA-core kernels are weight-only, and
     * cuda_quant.cu gives them x fake-quantized first; so does this */
    if (f.act && !(mma && qm_ok(f.fmt, N, K, w.gc, f.act, (const void *)16, (const float *)16)))
        for (size_t i = 0; i < x.size(); i++)
            x[i] = (float)xa[i];
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
    *kind = s_launch(f, w, dx, M, with_bias ? db : NULL, dy, warps, n_sm, mma, mma_warps);
    CK(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double ref = with_bias ? bias[n] : 0.0;
            const uint8_t *row = codes.data() + n * rowb;
            for (int64_t k = 0; k < K; k++)
                ref += xa[(size_t)m * K + k] * s_code(f.fmt, row, k) * sc[(size_t)((n / w.gr) * w.ngc + k / w.gc)];
            const double got = y[(size_t)m * N + n];
            if (!isfinite(got))
                num = 1e300;
            num += (got - ref) * (got - ref);
            den += ref * ref;
        }
    if (y_out)
        *y_out = y;
    cudaFree(w.codes), cudaFree(w.scale), cudaFree(dx), cudaFree(db), cudaFree(dy);
    return num >= 1e300 ? 1e30 : sqrt(num / (den > 0 ? den : 1));
}

/* mma 0: the CUDA-core kernels on the weight-only cases; mma 1: the tensor-core path on every case
 * (warps per block: mma_warps, or cycling 0 (qm_warps), 4, 8, 16 over the cases). */
static int s_checks(int warps, int n_sm, int mma, int mma_warps)
{
    /* N, K: the vector kernels' shapes (K a multiple of 128; 1,056 = 8 x 132: int4 g64 and fp8's
     * 128-blocks end on a partial group, the tensor-core kernel on a partial step), a tall one
     * (qm_warps gives 16 warps at 1,024 rows of K 4,096... or fewer), and shapes only the any-shape
     * kernel takes (1,000 and 136 are no multiple of 16; 1,040 of 32). */
    static const int64_t shapes[][2] = {{257, 1024}, {37, 4096}, {130, 1056}, {100, 1000}, {64, 1040}, {33, 136},
                                        {1024, 512}, {16, 2048}};
    static const int cycle[4] = {0, 4, 8, 16};
    /* activations' magnitude, cycling: beyond f16's range and far below its normal numbers (the
     * tensor-core path scales each row by a power of two) */
    static const float mags[3] = {1.0f, 3e6f, 1e-7f};
    int failed = 0, ci = 0;
    for (const fmt_case_t &f : s_fmts) {
        if (!mma && f.act)
            continue;
        double worst = 0;
        char worst_what[128] = "";
        int n_kind[3] = {0, 0, 0};
        for (const auto &sh : shapes) {
            const bool nib = f.fmt == BK_Q_I4 || f.fmt == BK_Q_FP4;
            if (nib && sh[1] % 2)
                continue;
            if (f.fmt == BK_Q_FP4 && sh[1] % 16)
                continue;                          /* nvfp4's blocks of 16 */
            for (int M = 1; M <= 8; M++) {
                int kind = K_ANY;
                const bool bias = (M + sh[0]) % 2;
                const int mw = mma_warps ? mma_warps : cycle[ci % 4];
                const float mag = mags[ci++ % 3];
                const double e = s_check(f, M, sh[0], sh[1], bias, warps, n_sm, mma, mw, &kind, NULL, NULL, mag);
                n_kind[kind]++;
                if (!(e <= worst)) {
                    worst = e;
                    snprintf(worst_what, sizeof worst_what, "M=%d N=%lld K=%lld%s |x| <= %g (%s kernel%s)", M,
                             (long long)sh[0], (long long)sh[1], bias ? " bias" : "", mag, s_kind_name[kind],
                             kind == K_MMA ? (mw == 0 ? ", qm_warps" : mw == 4 ? ", 4 warps" : mw == 8 ? ", 8 warps"
                                                                                              : ", 16 warps")
                                           : "");
                }
            }
        }
        const bool used = !mma || !f.mma || n_kind[K_MMA] > 0;
        const bool ok = worst <= 1e-5 && used;
        failed += !ok;
        printf("check %s %-18s %s  worst rel err %.2e at %s; %d tensor-core, %d vector, %d any-shape cases%s\n",
               mma ? "mma" : "old", f.name, ok ? "PASS" : "FAIL", worst, worst_what, n_kind[K_MMA], n_kind[K_VEC],
               n_kind[K_ANY], used ? "" : " (the tensor-core kernel should have taken it)");
    }
    return failed;
}

/* The tensor-core path's row m of an M-row call equals its row 0 of a 1-row call, bit for bit (a
 * row's sum does not depend on the other rows), for each format it takes. */
static int s_check_rows(int n_sm, int mma_warps)
{
    int failed = 0, cases = 0;
    for (const fmt_case_t &f : s_fmts) {
        if (!f.mma)
            continue;
        const int64_t N = 130, K = 1024;
        for (int M = 2; M <= 8; M++) {
            std::vector<float> x((size_t)M * K), y, y1;
            for (auto &v : x)
                v = s_unif(1.0f);
            const uint64_t rng = s_rng;
            int kind, kind1;
            s_check(f, M, N, K, false, 0, n_sm, 1, mma_warps, &kind, &y, &x);
            for (int m = 0; m < M; m++) {
                s_rng = rng;                       /* the same weights */
                std::vector<float> xm(x.begin() + (size_t)m * K, x.begin() + (size_t)(m + 1) * K);
                s_check(f, 1, N, K, false, 0, n_sm, 1, mma_warps, &kind1, &y1, &xm);
                cases++;
                if (kind != K_MMA || kind1 != K_MMA || memcmp(y.data() + (size_t)m * N, y1.data(), (size_t)N * 4)) {
                    if (!failed)
                        printf("check mma rows: %s M=%d row %d differs from the 1-row call (or not the tensor-core kernel)\n",
                               f.name, M, m);
                    failed = 1;
                }
            }
        }
    }
    printf("check mma rows %s  %d rows of M = 2..8 against M = 1, every tensor-core format\n", failed ? "FAIL" : "PASS",
           cases);
    return failed;
}

/* One launch over three parts (q, k, v-like heights) gives each part the bits of its own launch,
 * a block's own xs the bits of the pre-pass's (--stage 0 for every call: the shapes stage at
 * M = 1 and fall back to the pre-pass at M = 8 (K = 4,096 weight-only) or M >= 3 (K = 8,192)), and
 * a grid of one SM's blocks (each taking several of the 16 row blocks in turn) the same bits. */
static int s_check_parts(int mma_warps)
{
    int failed = 0, cases = 0;
    static const int64_t Ks[3] = {1024, 4096, 8192};
    for (const fmt_case_t &f : s_fmts) {
        if (!f.mma)
            continue;
        for (int64_t K : Ks) {
            const bool nib = f.fmt == BK_Q_I4 || f.fmt == BK_Q_FP4;
            const int64_t Ns[3] = {130, 37, 64}, rowb = nib ? K / 2 : K;
            qm_part_t parts[3];
            std::vector<void *> bufs;
            for (int i = 0; i < 3; i++) {
                int gr, gc;
                s_effective(f, Ns[i], K, &gr, &gc);
                const int64_t ngc = (K + gc - 1) / gc, ngr = (Ns[i] + gr - 1) / gr;
                std::vector<uint8_t> codes((size_t)(Ns[i] * rowb));
                for (auto &c : codes) {
                    c = (uint8_t)s_rand();
                    if (f.fmt == BK_Q_FP8 && (c & 0x7f) == 0x7f)
                        c ^= 1;
                }
                std::vector<float> sc((size_t)(ngr * ngc)), bias((size_t)Ns[i]);
                for (auto &v : sc)
                    v = (0.25f + fabsf(s_unif(1.0f))) * 0.1f;
                for (auto &v : bias)
                    v = s_unif(1.0f);
                uint8_t *dc;
                float *ds, *db, *dy;
                CK(cudaMalloc(&dc, codes.size()));
                CK(cudaMalloc(&ds, sc.size() * 4));
                CK(cudaMalloc(&db, bias.size() * 4));
                CK(cudaMalloc(&dy, (size_t)8 * Ns[i] * 4));
                CK(cudaMemcpy(dc, codes.data(), codes.size(), cudaMemcpyHostToDevice));
                CK(cudaMemcpy(ds, sc.data(), sc.size() * 4, cudaMemcpyHostToDevice));
                CK(cudaMemcpy(db, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice));
                bufs.push_back(dc), bufs.push_back(ds), bufs.push_back(db), bufs.push_back(dy);
                parts[i] = qm_part_t{dc, ds, i == 1 ? NULL : db, dy, Ns[i], gr, 0};
            }
            int gr0, gc;
            s_effective(f, Ns[0], K, &gr0, &gc);
            if (K > s_scratch_k) {
                if (s_scratch)
                    CK(cudaFree(s_scratch));
                CK(cudaMalloc(&s_scratch, qm_scratch_bytes(K)));
                s_scratch_k = K;
            }
            float *dx;
            CK(cudaMalloc(&dx, (size_t)8 * K * 4));
            for (int M = 1; M <= 8; M++) {
                std::vector<float> x((size_t)M * K);
                for (auto &v : x)
                    v = s_unif(M % 3 == 0 ? 3e6f : 1.0f);
                CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
                /* [run][part]: fused, separate, fused with the pre-pass, fused on a grid of one SM's
                 * blocks (each taking several row blocks, across the parts' boundaries) */
                std::vector<float> got[4][3];
                for (int run = 0; run < 4; run++) {
                    const int keep = s_stage, keep_sm = s_n_sm;
                    s_stage = run == 2 ? 0 : keep;
                    s_n_sm = run == 3 ? 1 : keep_sm;
                    int ok = 1;
                    for (int i = 0; i < 3; i++)
                        CK(cudaMemset(parts[i].y, 0xff, (size_t)M * Ns[i] * 4));
                    if (run == 1) {
                        for (int i = 0; i < 3; i++)
                            ok &= s_qm_launch(f, K, gc, dx, M, &parts[i], 1, mma_warps);
                    } else {
                        ok = s_qm_launch(f, K, gc, dx, M, parts, 3, mma_warps);
                    }
                    s_stage = keep;
                    s_n_sm = keep_sm;
                    CK(cudaDeviceSynchronize());
                    if (!ok) {
                        printf("check mma parts: %s K=%lld M=%d not taken\n", f.name, (long long)K, M);
                        failed = 1;
                        continue;
                    }
                    for (int i = 0; i < 3; i++) {
                        got[run][i].resize((size_t)M * Ns[i]);
                        CK(cudaMemcpy(got[run][i].data(), parts[i].y, got[run][i].size() * 4, cudaMemcpyDeviceToHost));
                    }
                }
                for (int i = 0; i < 3; i++) {
                    cases++;
                    bool nan = false;
                    for (float v : got[0][i])
                        nan |= !isfinite(v);
                    if (nan || got[0][i] != got[1][i] || got[0][i] != got[2][i] || got[0][i] != got[3][i]) {
                        if (!failed)
                            printf("check mma parts: %s K=%lld M=%d part %d: %s\n", f.name, (long long)K, M, i,
                                   nan                        ? "an element not written"
                                   : got[0][i] != got[1][i] ? "differs from its own launch"
                                   : got[0][i] != got[2][i] ? "differs from the pre-pass's"
                                                            : "differs on a one-SM grid");
                        failed = 1;
                    }
                }
            }
            cudaFree(dx);
            for (void *b : bufs)
                cudaFree(b);
        }
    }
    printf("check mma parts %s  %d parts of a 3-part launch against their own launches, the pre-pass and a one-SM grid, "
           "M = 1..8\n",
           failed ? "FAIL" : "PASS", cases);
    return failed;
}

/* ---- timing ------------------------------------------------------------------------------------ */

static double s_time_shape(const fmt_case_t &f, int M, int64_t N, int64_t K, int warps, int n_sm, int mma,
                           int mma_warps, int *kind)
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
            *kind = s_launch(f, wc, x, M, NULL, y, warps, n_sm, mma, mma_warps);
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

/* The tensor-core path over n parts of heights Ns (one x, ONE launch, as matmul_n runs q|k|v and
 * gate|up), rotating weight copies as s_time_shape; the median per call in us. */
static double s_time_parts(const fmt_case_t &f, int M, int n, const int64_t *Ns, int64_t K, int mma_warps)
{
    const bool nib = f.fmt == BK_Q_I4 || f.fmt == BK_Q_FP4;
    size_t wbytes = 0;
    for (int i = 0; i < n; i++)
        wbytes += (size_t)(Ns[i] * (nib ? K / 2 : K));
    const int copies = (int)std::max<size_t>(2, ((size_t)512 << 20) / wbytes + 1);
    std::vector<qm_part_t> parts((size_t)copies * n);
    std::vector<void *> bufs;
    int gc = 0;
    for (int c = 0; c < copies; c++)
        for (int i = 0; i < n; i++) {
            int gr;
            s_effective(f, Ns[i], K, &gr, &gc);
            const size_t cb = (size_t)(Ns[i] * (nib ? K / 2 : K)), ns = (size_t)((Ns[i] + gr - 1) / gr * ((K + gc - 1) / gc));
            uint8_t *codes;
            float *scale, *y;
            CK(cudaMalloc(&codes, cb));
            CK(cudaMalloc(&scale, ns * 4));
            CK(cudaMalloc(&y, (size_t)M * Ns[i] * 4));
            CK(cudaMemset(codes, 0x31, cb));
            CK(cudaMemset(scale, 0, ns * 4));
            bufs.push_back(codes), bufs.push_back(scale), bufs.push_back(y);
            parts[(size_t)c * n + i] = qm_part_t{codes, scale, NULL, y, Ns[i], gr, 0};
        }
    float *x;
    CK(cudaMalloc(&x, (size_t)M * K * 4));
    CK(cudaMemset(x, 0, (size_t)M * K * 4));
    if (K > s_scratch_k) {
        if (s_scratch)
            CK(cudaFree(s_scratch));
        CK(cudaMalloc(&s_scratch, qm_scratch_bytes(K)));
        s_scratch_k = K;
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> reps;
    for (int rep = -1; rep < 5; rep++) {
        CK(cudaEventRecord(e0));
        for (int i = 0; i < 20; i++)
            s_qm_launch(f, K, gc, x, M, &parts[(size_t)((rep * 20 + i + 20) % copies) * n], n, mma_warps);
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (rep >= 0)
            reps.push_back(ms * 1000.0f / 20.0f);
    }
    std::sort(reps.begin(), reps.end());
    for (void *b : bufs)
        cudaFree(b);
    cudaFree(x);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    return reps[2];
}

/* A layer's quantized matmuls as the engine runs them on the tensor-core path: q|k|v in one launch,
 * o, gate|up in one launch, down; the 32 layers' sum and its bytes per second. */
static void s_time_layer(const fmt_case_t &f, int M, int mma_warps)
{
    static const int64_t qkv[3] = {4096, 1024, 1024}, o[1] = {4096}, gu[2] = {14336, 14336}, dn[1] = {4096};
    const double t_qkv = s_time_parts(f, M, 3, qkv, 4096, mma_warps), t_o = s_time_parts(f, M, 1, o, 4096, mma_warps),
                 t_gu = s_time_parts(f, M, 2, gu, 4096, mma_warps), t_dn = s_time_parts(f, M, 1, dn, 14336, mma_warps);
    const bool nib = f.fmt == BK_Q_I4 || f.fmt == BK_Q_FP4;
    const double bytes = 32.0 * (6144.0 * 4096 + 4096.0 * 4096 + 28672.0 * 4096 + 4096.0 * 14336) * (nib ? 0.5 : 1.0);
    const double step = 32 * (t_qkv + t_o + t_gu + t_dn);
    printf("time M=%d %-16s mma layer: q|k|v 6144x4096 %.1fus o %.1fus gate|up 28672x4096 %.1fus down %.1fus | 32 layers "
           "%.3f ms, %.0f GB/s (codes only)\n",
           M, f.name, t_qkv, t_o, t_gu, t_dn, step / 1e3, bytes / step / 1e3);
}

/* One line per M, format and path: "time M=1 fp8 per channel old ..." and "... mma ...". */
static void s_times(int warps, int n_sm, int paths, int mma_warps)
{
    /* rows, cols, matrices of the shape per layer: q and o, k and v, gate and up, down */
    static const int64_t shapes[][3] = {{4096, 4096, 2}, {1024, 4096, 2}, {14336, 4096, 2}, {4096, 14336, 1}};
    static const int fmts[] = {1, 3, 4, 6, 7};     /* fp8 per channel, int8, int4 g128, nvfp4, fp8 W8A8 */
    for (int M : {1, 8}) {
        for (int fi : fmts) {
            const fmt_case_t &f = s_fmts[fi];
            double total[2] = {0, 0};
            for (int mma = 0; mma < 2; mma++) {
                if (!(paths & (1 << mma)) || (!mma && f.act))
                    continue;
                double step = 0, bytes = 0;
                char line[320];
                int used = snprintf(line, sizeof line, "time M=%d %-16s %s", M, f.name, mma ? "mma" : "old");
                for (const auto &sh : shapes) {
                    int kind = K_ANY;
                    const double us = s_time_shape(f, M, sh[0], sh[1], warps, n_sm, mma, mma_warps, &kind);
                    const bool nib = f.fmt == BK_Q_I4 || f.fmt == BK_Q_FP4;
                    const int gr = f.gr ? f.gr : (int)sh[0], gc = f.gc ? f.gc : (int)sh[1];
                    const double b = (double)sh[0] * sh[1] * (nib ? 0.5 : 1.0) +
                                     4.0 * (double)((sh[0] + gr - 1) / gr) * (double)((sh[1] + gc - 1) / gc);   /* codes + f32 scales */
                    step += us * sh[2] * 32;
                    bytes += b * sh[2] * 32;
                    used += snprintf(line + used, sizeof line - used, " %lldx%lld %.1fus%s (%.0f GB/s)", (long long)sh[0],
                                     (long long)sh[1], us, kind == K_MMA || !mma ? "" : " [fallback]", b / us / 1e3);
                }
                total[mma] = step;
                printf("%s | 32 layers %.3f ms, %.0f GB/s\n", line, step / 1e3, bytes / step / 1e3);
            }
            if (total[0] > 0 && total[1] > 0)
                printf("time M=%d %-16s mma vs old: %.2fx (32 layers %.3f -> %.3f ms)\n", M, f.name, total[0] / total[1],
                       total[0] / 1e3, total[1] / 1e3);
            if (paths & 2)
                s_time_layer(f, M, mma_warps);
        }
    }
}

int main(int argc, char **argv)
{
    int warps = 0, check_only = 0, mma_warps = 0, paths = 3, layer_only = 0, grid_all = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--warps") == 0 && i + 1 < argc)
            warps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--lk") == 0 && i + 1 < argc)
            s_lk = atoi(argv[++i]) == 32 ? 32 : QV_LK;
        else if (strcmp(argv[i], "--mma-warps") == 0 && i + 1 < argc)
            mma_warps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--path") == 0 && i + 1 < argc) {
            const char *p = argv[++i];
            paths = strcmp(p, "old") == 0 ? 1 : strcmp(p, "mma") == 0 ? 2 : 3;
        } else if (strcmp(argv[i], "--stage") == 0 && i + 1 < argc)
            s_stage = atoi(argv[++i]) != 0;
        else if (strcmp(argv[i], "--layer-only") == 0)
            layer_only = 1;
        else if (strcmp(argv[i], "--grid") == 0 && i + 1 < argc)
            grid_all = atoi(argv[++i]) == 0;
        else if (strcmp(argv[i], "--fp8-decode") == 0 && i + 1 < argc)
            s_fp8_mix = strcmp(argv[++i], "mix") == 0;
        else if (strcmp(argv[i], "--depth") == 0 && i + 1 < argc)
            s_shallow = atoi(argv[++i]) == 2;
        else if (strcmp(argv[i], "--i8-imma") == 0)
            s_i8_imma = 1;
        else if (strcmp(argv[i], "--check-only") == 0)
            check_only = 1;
        else {
            fprintf(stderr, "usage: bench_qgemv [--check-only] [--warps 2|4|8] [--lk 8|32] [--mma-warps 4|8|16] "
                            "[--path old|mma|both] [--stage 0|1] [--grid 0] [--fp8-decode cvt|mix] [--depth 2|4] "
                            "[--i8-imma] [--layer-only]\n");
            return 2;
        }
    }
    if (mma_warps && mma_warps != 4 && mma_warps != 8 && mma_warps != 16) {
        fprintf(stderr, "bench_qgemv: --mma-warps %d (expected 4, 8 or 16)\n", mma_warps);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);              /* a failed check's exit shows after the lines before it */
    int n_sm = 0;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    s_n_sm = grid_all ? 0 : n_sm;
    int failed = 0;
    if (layer_only) {                              /* no checks: fp8 and int8 W8A8, int4, nvfp4 at M = 1 (for ncu) */
        for (int fi : {7, 8, 4, 6})
            s_time_layer(s_fmts[fi], 1, mma_warps);
        return 0;
    }
    if (paths & 1)
        failed += s_checks(warps, n_sm, 0, 0);
    if (paths & 2) {
        failed += s_checks(warps, n_sm, 1, mma_warps);
        failed += s_check_rows(n_sm, mma_warps);
        failed += s_check_parts(mma_warps);
    }
    if (!check_only)
        s_times(warps, n_sm, paths, mma_warps);
    printf("bench_qgemv: %s\n", failed ? "FAILED" : "all checks PASSED");
    return failed ? 1 : 0;
}
