/* tests/unit/test_forward_verify.c — verify steps (k + 1 new rows per sequence) through
 * model_forward on the CPU backend, the reference for the GPU's (tests/gpu/test_verify.c):
 *   - a step of sequences with different row counts (1, 3, 8) and every row's logits equals, row
 *     for row and bit for bit, the same tokens computed one at a time (the CPU is batch-invariant);
 *   - n_logits: the last n rows of a sequence's logits only, the rest of the batch by all_logits;
 *   - argmax_out with all_logits: each row's id is the argmax of its logits, need_logits per row
 *     of logits (only marked rows are written);
 *   - a bad n_logits (negative, above n_new) is refused naming the sequence, nothing computed.
 * Dummy f32 weights of the llama-gqa fixture's shape (tests/fixtures/models). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/kvcache.h"
#include "engine/model.h"

typedef struct fx {
    backend_t *be;
    model_config_t cfg;
    ckpt_t *ck;
    model_t *m;
    kvpool_t *pool;
} fx_t;

static int s_setup(void **state)
{
    static fx_t f;
    char err[512], dir[1024];
    const char *root = getenv("TROUPE_MODEL_FIXTURES");
    snprintf(dir, sizeof dir, "%s/llama-gqa-f32", root && *root ? root : "tests/fixtures/models");
    if (!(f.be = backend_cpu_new(0)) || config_load(dir, &f.cfg, err, sizeof err) < 0 || !(f.ck = ckpt_dummy(DT_F32, 3))) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    model_opts_t o = {.max_tokens = 64, .max_seqs = 4, .max_logit_rows = 64, .max_context = 64, .kv_block_size = 4};
    if (!(f.m = model_load(dir, &f.cfg, f.ck, f.be, &o, err, sizeof err)) ||
        !(f.pool = kvpool_new(4 * 17, 4, f.cfg.num_layers, f.cfg.num_kv_heads, f.cfg.head_dim, DT_F32, f.be, err,
                              sizeof err))) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    *state = &f;
    return 0;
}

static int s_teardown(void **state)
{
    fx_t *f = *state;
    kvpool_destroy(&f->pool);
    model_destroy(&f->m);
    ckpt_destroy(&f->ck);
    backend_destroy(&f->be);
    return 0;
}

static int32_t s_id(const fx_t *f, int s, int i) { return (int32_t)((i * 7919 + s * 104729 + 11) % f->cfg.vocab_size); }

/* Three sequences with 5, 9 and 2 tokens prefilled. */
static void s_seqs(fx_t *f, kvseq_t **seqs)
{
    static const int cached[3] = {5, 9, 2};
    char err[512];
    float *lg = malloc((size_t)f->cfg.vocab_size * sizeof(float));
    for (int s = 0; s < 3; s++) {
        seqs[s] = kvseq_new(f->pool, 64, 0);
        assert_non_null(seqs[s]);
        for (int i = 0; i < cached[s]; i++) {
            const int32_t id = s_id(f, s, i);
            assert_int_equal(kvseq_append(seqs[s], &id, 1), 0);
        }
        model_seq_t q = {.kv = seqs[s], .n_new = cached[s]};
        model_batch_t b = {.n_seqs = 1, .seqs = &q};
        if (model_forward(f->m, &b, lg, err, sizeof err) < 0)
            fail_msg("prefill: %s", err);
    }
    free(lg);
}

static void test_verify_rows(void **state)
{
    fx_t *f = *state;
    const int V = f->cfg.vocab_size, rows[3] = {1, 3, 8}, R = 12;
    char err[512];
    kvseq_t *a[3], *b[3];
    s_seqs(f, a);
    s_seqs(f, b);
    /* One verify step over a: every row's logits, device argmax, need_logits on rows 0, 2, 3, 11. */
    model_seq_t q[3];
    for (int s = 0; s < 3; s++) {
        for (int j = 0; j < rows[s]; j++) {
            const int32_t id = s_id(f, s, 100 + j);
            assert_int_equal(kvseq_append(a[s], &id, 1), 0);
        }
        q[s] = (model_seq_t){.kv = a[s], .n_new = rows[s]};
    }
    float *all = malloc((size_t)R * V * sizeof(float)), *one = malloc((size_t)V * sizeof(float));
    model_batch_t mb = {.n_seqs = 3, .seqs = q, .all_logits = 1};
    assert_int_equal(model_forward(f->m, &mb, all, err, sizeof err), 0);
    /* The same tokens one at a time over b. */
    for (int s = 0, r = 0; s < 3; s++)
        for (int j = 0; j < rows[s]; j++, r++) {
            const int32_t id = s_id(f, s, 100 + j);
            assert_int_equal(kvseq_append(b[s], &id, 1), 0);
            model_seq_t q1 = {.kv = b[s], .n_new = 1};
            model_batch_t b1 = {.n_seqs = 1, .seqs = &q1};
            assert_int_equal(model_forward(f->m, &b1, one, err, sizeof err), 0);
            if (memcmp(one, all + (size_t)r * V, (size_t)V * sizeof(float)) != 0)
                fail_msg("sequence %d row %d: the verify step's logits differ from one token at a time", s, j);
        }
    /* n_logits: sequence 2's last 3 rows, the others by all_logits (1 and 3 rows). */
    for (int s = 0; s < 3; s++)
        assert_int_equal(kvseq_truncate(a[s], kvseq_len(a[s]) - rows[s]), 0);
    for (int s = 0; s < 3; s++)
        for (int j = 0; j < rows[s]; j++) {
            const int32_t id = s_id(f, s, 100 + j);
            assert_int_equal(kvseq_append(a[s], &id, 1), 0);
        }
    q[2].n_logits = 3;
    float *part = malloc((size_t)7 * V * sizeof(float));
    assert_int_equal(model_forward(f->m, &mb, part, err, sizeof err), 0);
    assert_memory_equal(part, all, (size_t)4 * V * sizeof(float));
    assert_memory_equal(part + (size_t)4 * V, all + (size_t)9 * V, (size_t)3 * V * sizeof(float));
    /* argmax_out per row of logits; need_logits picks the rows written. */
    for (int s = 0; s < 3; s++) {
        assert_int_equal(kvseq_truncate(a[s], kvseq_len(a[s]) - rows[s]), 0);
        for (int j = 0; j < rows[s]; j++) {
            const int32_t id = s_id(f, s, 100 + j);
            assert_int_equal(kvseq_append(a[s], &id, 1), 0);
        }
    }
    q[2].n_logits = 0;
    int32_t ids[12];
    uint8_t need[12] = {0};
    need[0] = need[2] = need[3] = need[11] = 1;
    float *got = malloc((size_t)R * V * sizeof(float));
    for (size_t i = 0; i < (size_t)R * V; i++)
        got[i] = NAN;
    mb.argmax_out = ids;
    mb.need_logits = need;
    assert_int_equal(model_forward(f->m, &mb, got, err, sizeof err), 0);
    for (int r = 0; r < R; r++) {
        const float *x = all + (size_t)r * V;
        int best = 0;
        for (int i = 1; i < V; i++)
            if (x[i] > x[best])
                best = i;
        assert_int_equal(ids[r], best);
        if (need[r])
            assert_memory_equal(got + (size_t)r * V, x, (size_t)V * sizeof(float));
        else if (!isnan(got[(size_t)r * V]))
            fail_msg("row %d was not asked for, yet written", r);
    }
    /* Bad n_logits: refused, naming the sequence. */
    mb = (model_batch_t){.n_seqs = 3, .seqs = q};
    q[1].n_logits = 4;
    assert_int_equal(model_forward(f->m, &mb, got, err, sizeof err), -1);
    assert_non_null(strstr(err, "sequence 1"));
    q[1].n_logits = -1;
    assert_int_equal(model_forward(f->m, &mb, got, err, sizeof err), -1);
    assert_non_null(strstr(err, "rows of logits"));
    free(all), free(one), free(part), free(got);
    for (int s = 0; s < 3; s++) {
        kvseq_destroy(&a[s]);
        kvseq_destroy(&b[s]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_rows),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
