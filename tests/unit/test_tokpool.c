/* tests/unit/test_tokpool.c — the router's tokenizer threads (actors/router/tokpool.h): every job
 * comes back exactly once with the ids (or the error and field) prompt_ids gives on the caller's
 * thread, and the pool stops and joins with jobs still queued. Uses the real Qwen3 tokenizer
 * (third_party/tokenizers/qwen3); run from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include <cmocka.h>

#include "actors/router/prompt.h"
#include "actors/router/tokpool.h"

#define N_JOBS 24

static tokjob_t *s_job(int i, char *text)
{
    tokjob_t *j = calloc(1, sizeof *j);
    assert_non_null(j);
    msg_init(&j->submit, MSG_SUBMIT, (uint64_t)i);
    j->submit.u.submit.prompt = text;   /* not owned: no arena, msg_free leaves it */
    return j;
}

static void test_jobs_come_back(void **state)
{
    (void)state;
    char err[512];
    tokenizer_t *tok = tok_load("third_party/tokenizers/qwen3", err, sizeof err);
    if (!tok)
        fail_msg("tok_load: %s", err);
    prompt_model_t pm = {.tok = tok, .chat = CHAT_NONE, .vocab_size = 151936, .max_model_len = 4096};
    void *ctx = zmq_ctx_new();
    tokpool_t *p = tokpool_new(ctx, "test", &pm, 2, err, sizeof err);
    assert_non_null(p);
    char *texts[N_JOBS];
    tokjob_t *jobs[N_JOBS];
    for (int i = 0; i < N_JOBS; i++) {
        size_t len = 100 + (size_t)i * 3000;
        texts[i] = malloc(len + 1);
        for (size_t k = 0; k < len; k++)
            texts[i][k] = "In the beginning God created the heaven and the earth. "[(k + (size_t)i) % 56];
        texts[i][len] = 0;
        jobs[i] = s_job(i, texts[i]);
        if (i == 5) {   /* chat messages on a model without a template: prompt_ids' error */
            jobs[i]->submit.u.submit.prompt = NULL;
            jobs[i]->submit.u.submit.n_messages = 1;
            static msg_chat_t one = {.role = MSG_CHAT_USER, .content = "hi"};
            jobs[i]->submit.u.submit.messages = &one;
        }
        tokpool_submit(p, jobs[i]);
    }
    int back[N_JOBS] = {0}, n_back = 0;
    zmq_pollitem_t it = {tokpool_socket(p), 0, ZMQ_POLLIN, 0};
    while (n_back < N_JOBS) {
        assert_true(zmq_poll(&it, 1, 10000) > 0);   /* never stuck */
        tokjob_t *j;
        while ((j = tokpool_recv(p)) != NULL) {
            int i = (int)j->submit.id;
            assert_ptr_equal(j, jobs[i]);
            assert_int_equal(back[i], 0);   /* exactly once */
            back[i] = 1;
            n_back++;
            int32_t *ids;
            size_t n;
            char err2[512];
            const char *field;
            int rc = prompt_ids(&pm, &j->submit.u.submit, &ids, &n, err2, sizeof err2, &field);
            assert_int_equal(j->rc, rc);
            if (rc == 0) {
                assert_true(n > 0 && j->n == n);
                assert_memory_equal(j->ids, ids, n * sizeof *ids);
            } else {
                assert_int_equal(i, 5);
                assert_string_equal(j->err, err2);
                assert_string_equal(j->field, "messages");
            }
            free(ids);
        }
    }
    assert_null(tokpool_recv(p));
    /* Stopped with jobs queued: joined, nothing sent for the ones never started. */
    for (int i = 0; i < N_JOBS; i++) {
        free(jobs[i]->ids);
        jobs[i]->ids = NULL;
        tokpool_submit(p, jobs[i]);
    }
    void *pull = tokpool_socket(p);
    tokpool_destroy(&p);
    assert_null(p);
    tokpool_destroy(&p);   /* idempotent */
    zmq_close(pull);
    zmq_ctx_term(ctx);
    for (int i = 0; i < N_JOBS; i++) {
        jobs[i]->submit.u.submit.prompt = NULL;
        jobs[i]->submit.u.submit.messages = NULL;
        tokjob_free(&jobs[i]);
        free(texts[i]);
    }
    tok_destroy(&tok);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_jobs_come_back)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
