/* tests/gpu/test_kvscale_cuda.c — an fp8 KV cache with scales (bk_kv_t.scale, engine/kvscale.h) on
 * CUDA against the CPU reference (tests/unit/kvscale_harness.h runs the same step on either):
 *   - kv_store: the pool bit-identical to the CPU's (e4m3 of x / s, IEEE division on both), K/V in
 *     +-1000 (past e4m3's 448) with a different scale per layer and kv head; rope_kv_store's pool
 *     bit-identical to rope then kv_store on the device;
 *   - attention: the tensor-core decode kernel (one row per sequence, split-KV and not) and the
 *     prefill kernel (prompt rows, a decode row beside them), D = 64 and 128, G = 1..16, within
 *     B_ATTN_MMA of the CPU over the same scaled pool; and against the f32 cache, scaled fp8 stays
 *     close while scale 1 does not (the reason for the scales).
 * A kernel that ignores the scales fails both: its output is off by the V scale, its scores by
 * the K scale. Prints one line per case. Needs a GPU (tools/gpu-run.sh builds it into
 * build/gpu-tests/). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/backend.h"
#include "tests/unit/kvscale_harness.h"

#define B_ATTN_MMA 5e-3           /* f16 q and p in the tensor-core kernels (tests/gpu/test_backend_cuda.c) */

static backend_t *s_cpu, *s_gpu, *s_gpu1;   /* s_gpu1: one key range per row (TROUPE_CUDA_ATTN_SPLIT=0) */

static int s_setup(void **state)
{
    char err[256];
    s_cpu = backend_cpu_new(0);
    s_gpu = backend_new("cuda", 0, err, sizeof err);
    if (!s_gpu) {
        fprintf(stderr, "no CUDA backend: %s\n", err);
        return -1;
    }
    setenv("TROUPE_CUDA_ATTN_SPLIT", "0", 1);
    s_gpu1 = backend_new("cuda", 0, err, sizeof err);
    unsetenv("TROUPE_CUDA_ATTN_SPLIT");
    return s_gpu1 ? 0 : -1;
}

static int s_teardown(void **state)
{
    backend_destroy(&s_gpu1);
    backend_destroy(&s_gpu);
    backend_destroy(&s_cpu);
    return 0;
}

static const kvs_case_t s_cases[] = {
    {"decode D=128 G=4 3 seqs ctx 1/300/1000", 32, 8, 128, 16, 2, 1, 3, {1, 300, 1000}, {1, 1, 1}},
    {"decode D=64 G=8 2 seqs ctx 65/777 block 5", 16, 2, 64, 5, 3, 2, 2, {65, 777}, {1, 1}},
    {"decode D=128 G=16 1 seq ctx 2000", 16, 1, 128, 16, 1, 0, 1, {2000}, {1}},
    {"prefill D=128 G=4 2 seqs 77 + 129 rows", 32, 8, 128, 16, 2, 1, 2, {77, 429}, {77, 129}},
    {"prefill D=64 G=1 130 rows block 5", 4, 4, 64, 5, 2, 0, 1, {130}, {130}},
    {"mixed D=128 G=4: 1 decode row + 70 prefill rows", 16, 4, 128, 16, 2, 1, 2, {500, 70}, {1, 70}},
};

/* A scale table of amax / 448 per kv head, times a different factor per layer (the kernels must
 * read their own layer's). */
static float *s_scales(const kvs_case_t *c, const float *kx, const float *vx)
{
    float *s = kvs_amax_scales(c, kx, vx);
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < 2 * c->n_kv; i++)
            s[(size_t)l * 2 * c->n_kv + i] *= 1.0f + 0.5f * (float)l;
    return s;
}

static void test_kv_store(void **state)
{
    for (size_t ci = 0; ci < sizeof s_cases / sizeof s_cases[0]; ci++) {
        const kvs_case_t *c = &s_cases[ci];
        const int P = kvs_positions(c), T = kvs_rows(c);
        const size_t kvn = (size_t)P * c->n_kv * c->D, qn = (size_t)T * c->n_heads * c->D;
        float *kx = kvs_rand(kvn, 1000.0), *vx = kvs_rand(kvn, 1000.0), *q = kvs_rand(qn, 0.003);
        float *sc = s_scales(c, kx, vx);
        uint8_t *pc, *pg, *pr, *pf;
        size_t bytes;
        free(kvs_run(s_cpu, c, DT_F8E4M3, sc, kx, vx, q, NULL, &pc, &bytes));
        free(kvs_run(s_gpu, c, DT_F8E4M3, sc, kx, vx, q, NULL, &pg, &bytes));
        if (memcmp(pc, pg, bytes) != 0)
            fail_msg("kv_store %s: the CUDA pool differs from the CPU's", c->name);
        float inv_freq[64];
        for (int i = 0; i < c->D / 2; i++)
            inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)c->D);
        kvs_fused = 1;
        free(kvs_run(s_gpu, c, DT_F8E4M3, sc, kx, vx, q, inv_freq, &pf, &bytes));
        kvs_fused = 0;
        free(kvs_run(s_gpu, c, DT_F8E4M3, sc, kx, vx, q, inv_freq, &pr, &bytes));
        kvs_fused = 1;
        if (memcmp(pf, pr, bytes) != 0)
            fail_msg("rope_kv_store %s: the pool differs from rope + kv_store's", c->name);
        if (memcmp(pf, pg, bytes) == 0)
            fail_msg("rope_kv_store %s: RoPE changed nothing", c->name);
        print_message("  kv_store / rope_kv_store %-52s bit-identical\n", c->name);
        free(pc);
        free(pg);
        free(pr);
        free(pf);
        free(sc);
        free(kx);
        free(vx);
        free(q);
    }
}

static void s_attention(backend_t *gpu, const kvs_case_t *c, const char *tag)
{
    const int P = kvs_positions(c), T = kvs_rows(c);
    const size_t kvn = (size_t)P * c->n_kv * c->D, qn = (size_t)T * c->n_heads * c->D;
    float *kx = kvs_rand(kvn, 1000.0), *vx = kvs_rand(kvn, 1000.0), *q = kvs_rand(qn, 0.003);
    float *sc = s_scales(c, kx, vx);
    float *cpu = kvs_run(s_cpu, c, DT_F8E4M3, sc, kx, vx, q, NULL, NULL, NULL);
    float *ref = kvs_run(s_cpu, c, DT_F32, NULL, kx, vx, q, NULL, NULL, NULL);
    float *gs = kvs_run(gpu, c, DT_F8E4M3, sc, kx, vx, q, NULL, NULL, NULL);
    float *g1 = kvs_run(gpu, c, DT_F8E4M3, NULL, kx, vx, q, NULL, NULL, NULL);
    const double e = kvs_rel_err(gs, cpu, qn), es = kvs_rel_err(gs, ref, qn), e1 = kvs_rel_err(g1, ref, qn);
    print_message("  attention %-56s%s vs CPU %.2e (bound %.0e); vs f32 cache: scaled %.3g, scale 1 %.3g\n", c->name,
                  tag, e, B_ATTN_MMA, es, e1);
    if (!(e <= B_ATTN_MMA))
        fail_msg("attention %s%s: relative error %.3g against the CPU exceeds %.0e", c->name, tag, e, B_ATTN_MMA);
    if (!(es < 0.05) || !(e1 > 4 * es))
        fail_msg("attention %s%s: against the f32 cache scaled fp8 is %.3g off, scale 1 %.3g", c->name, tag, es, e1);
    free(cpu);
    free(ref);
    free(gs);
    free(g1);
    free(sc);
    free(kx);
    free(vx);
    free(q);
}

static void test_attention(void **state)
{
    for (size_t ci = 0; ci < sizeof s_cases / sizeof s_cases[0]; ci++)
        s_attention(s_gpu, &s_cases[ci], "");
    for (size_t ci = 0; ci < 3; ci++)              /* the decode cases with one key range per row */
        s_attention(s_gpu1, &s_cases[ci], " [split off]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kv_store),
        cmocka_unit_test(test_attention),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
