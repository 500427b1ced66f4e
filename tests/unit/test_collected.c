/* tests/unit/test_collected.c — the router's collection of a request that does not stream
 * (actors/router/collected.h): token messages in, one done out that encodes, decodes and carries
 * every token, its text and logprobs in order; logprobs dropped whole when a message lacks them;
 * the text limit refused (not truncated), which keeps the done inside one frame. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/router/collected.h"

static msg_token_t s_tok(const uint32_t *ids, uint32_t n, const char *text, const float *lp)
{
    return (msg_token_t){.tokens = ids, .n_tokens = n, .text = text, .logprobs = lp, .n_logprobs = lp ? n : 0};
}

static void test_done_carries_all(void **state)
{
    (void)state;
    collected_t c;
    collected_init(&c, 1);
    const char *why = NULL;
    int over = -1;
    /* enough messages to grow past the first allocation (64 ids, 256 bytes) */
    for (uint32_t i = 0; i < 100; i++) {
        const uint32_t ids[2] = {2 * i, 2 * i + 1};
        const float lp[2] = {-(float)i, -0.5f};
        msg_token_t t = s_tok(ids, 2, i % 3 ? "ab" : NULL, lp);
        assert_int_equal(collected_add(&c, &t, &why, &over), 0);
    }
    msg_t d, back;
    msg_init(&d, MSG_DONE, 7);
    d.u.done.finish = MSG_FINISH_LENGTH;
    collected_fill(&c, &d.u.done);
    uint8_t buf[1 << 14];
    size_t len;
    char err[256];
    assert_int_equal(msg_encode(&d, buf, sizeof buf, &len, err, sizeof err), 0);
    assert_int_equal(msg_decode(buf, len, &back, err, sizeof err), 0);
    const msg_done_t *b = &back.u.done;
    assert_int_equal(b->n_tokens, 200);
    assert_int_equal(b->n_logprobs, 200);
    for (uint32_t i = 0; i < 200; i++)
        assert_int_equal(b->tokens[i], i);
    assert_true(b->logprobs[198] == -99.0f && b->logprobs[199] == -0.5f);
    assert_int_equal(strlen(b->text), 66 * 2);   /* 66 of the 100 messages had text */
    msg_free(&back);
    collected_free(&c);
    assert_null(c.ids);
    collected_free(&c);   /* idempotent */
}

static void test_logprobs_whole_or_none(void **state)
{
    (void)state;
    collected_t c;
    collected_init(&c, 1);
    const char *why;
    int over;
    const uint32_t ids[1] = {5};
    const float lp[1] = {-1.0f};
    msg_token_t with = s_tok(ids, 1, "x", lp), without = s_tok(ids, 1, "y", NULL);
    assert_int_equal(collected_add(&c, &with, &why, &over), 0);
    assert_int_equal(collected_add(&c, &without, &why, &over), 0);
    assert_int_equal(collected_add(&c, &with, &why, &over), 0);
    msg_done_t d = {0};
    collected_fill(&c, &d);
    assert_int_equal(d.n_tokens, 3);
    assert_int_equal(d.n_logprobs, 0);   /* not a list with a gap in it */
    assert_null(d.logprobs);
    assert_string_equal(d.text, "xyx");
    collected_free(&c);

    collected_init(&c, 0);   /* not asked for: none kept */
    assert_int_equal(collected_add(&c, &with, &why, &over), 0);
    collected_fill(&c, &d);
    assert_int_equal(d.n_logprobs, 0);
    collected_free(&c);

    collected_init(&c, 0);   /* nothing made (a cancel before the first token): no fields */
    collected_fill(&c, &d);
    assert_int_equal(d.n_tokens, 0);
    assert_null(d.text);
    collected_free(&c);
}

static void test_text_limit(void **state)
{
    (void)state;
    const size_t piece = MSG_MAX_PIECE - 1;
    char *text = malloc(piece + 1);
    assert_non_null(text);
    memset(text, 'a', piece);
    text[piece] = 0;
    collected_t c;
    collected_init(&c, 0);
    const char *why = NULL;
    int over = -1;
    const uint32_t ids[1] = {1};
    msg_token_t t = s_tok(ids, 1, text, NULL);
    uint32_t fit = MSG_MAX_COMPLETION_TEXT / piece;
    for (uint32_t i = 0; i < fit; i++)
        assert_int_equal(collected_add(&c, &t, &why, &over), 0);
    assert_int_equal(collected_add(&c, &t, &why, &over), -1);   /* one more passes 8 MiB */
    assert_int_equal(over, 0);
    assert_non_null(strstr(why, "stream it"));
    assert_int_equal(c.n, fit);   /* nothing of the refused message kept */
    assert_int_equal(c.text_len, (size_t)fit * piece);
    collected_free(&c);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_done_carries_all),
        cmocka_unit_test(test_logprobs_whole_or_none),
        cmocka_unit_test(test_text_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
