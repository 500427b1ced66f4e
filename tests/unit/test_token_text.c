/* tests/unit/test_token_text.c — a streamed token's text (actors/worker/token_text.h) over a real
 * byte-level BPE tokenizer fixture: the pieces add up to the text; a stop string ends the request
 * and neither it nor anything after it is emitted; text that could start a stop string is held
 * back and flushed at the end; without a tokenizer only the sampler decides; a small buffer cuts
 * the text instead of overflowing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "actors/worker/token_text.h"

#define TOKENIZER "tests/fixtures/tokenizer/synth/invert/tokenizer.json"

static tokenizer_t *s_tok;

static int s_setup(void **st)
{
    char err[256];
    s_tok = tok_load(TOKENIZER, err, sizeof err);
    if (!s_tok)
        fprintf(stderr, "%s: %s\n", TOKENIZER, err);
    return s_tok ? 0 : -1;
}

static int s_teardown(void **st)
{
    tok_destroy(&s_tok);
    return 0;
}

static sampler_t *s_sampler(const char *stop, int max_tokens)
{
    sampler_params_t p;
    sampler_params_default(&p);
    p.max_tokens = max_tokens;
    if (stop) {
        p.stops[0] = stop;
        p.n_stops = 1;
    }
    char err[256];
    sampler_t *s = sampler_new(&p, tok_vocab_size(s_tok), NULL, 0, err, sizeof err);
    assert_non_null(s);
    return s;
}

/* Streams the ids of text through token_text with `stop`; the emitted text in out, the finish
 * reason of the last token accepted returned, *n_used the tokens accepted. */
static finish_reason_t s_stream(const char *text, const char *stop, size_t cap, char *out, size_t outcap, int *n_used)
{
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(tok_encode(s_tok, text, strlen(text), 0, &ids, &n), 0);
    sampler_t *smp = s_sampler(stop, (int)n);
    tok_stream_t ts;
    tok_stream_init(&ts, s_tok);
    token_text_t tt;
    assert_int_equal(token_text_init(&tt, cap), 0);
    finish_reason_t fin = FINISH_NONE;
    out[0] = 0;
    int i = 0;
    while (i < (int)n && fin == FINISH_NONE) {
        fin = token_text_accept(&tt, smp, &ts, ids[i++], 0);
        assert_true(tt.len < cap && tt.buf[tt.len] == 0);
        strncat(out, tt.buf, outcap - strlen(out) - 1);
    }
    *n_used = i;
    token_text_free(&tt);
    sampler_destroy(&smp);
    free(ids);
    return fin;
}

/* What the tokenizer makes of text (the fixture's small vocabulary drops some letters). */
static void s_decoded(const char *text, char *out, size_t cap)
{
    int32_t *ids = NULL;
    char *dec = NULL;
    size_t n = 0, len = 0;
    assert_int_equal(tok_encode(s_tok, text, strlen(text), 0, &ids, &n), 0);
    assert_int_equal(tok_decode(s_tok, ids, n, 1, &dec, &len), 0);
    assert_true(len < cap);
    memcpy(out, dec, len);
    out[len] = 0;
    free(dec);
    free(ids);
}

static void test_pieces_add_up(void **st)
{
    char out[256], want[256];
    int used;
    const char *text = "hello world, a longer sentence";
    s_decoded(text, want, sizeof want);
    assert_true(strlen(want) > 10);
    assert_int_equal(s_stream(text, NULL, 256, out, sizeof out, &used), FINISH_LENGTH);
    assert_string_equal(out, want);
}

static void test_stop_string(void **st)
{
    char out[256], want[256], stop[64];
    int used;
    s_decoded("hello world again and more", want, sizeof want);
    char *second = strchr(want, ' ') + 1;   /* the stop string: the second word as decoded */
    snprintf(stop, sizeof stop, "%.*s", (int)(strchr(second, ' ') - second), second);
    assert_true(strlen(stop) >= 2);
    assert_int_equal(s_stream("hello world again and more", stop, 256, out, sizeof out, &used), FINISH_STOP);
    *second = 0;
    assert_string_equal(out, want);   /* the text before it, neither it nor what follows */
}

/* The text's end could start the stop string (the text and then more): held back, then flushed
 * when the request ends by its length. */
static void test_held_back_then_flushed(void **st)
{
    char out[256], want[256], stop[300];
    int used;
    s_decoded("hello wr", want, sizeof want);
    snprintf(stop, sizeof stop, "%s!", strchr(want, ' ') + 1);   /* its last word, then "!" */
    assert_int_equal(s_stream("hello wr", stop, 256, out, sizeof out, &used), FINISH_LENGTH);
    assert_string_equal(out, want);
}

/* A run of tokens streamed as one message (append): the buffer holds the run's text whole, the
 * same bytes as the tokens' texts one by one. */
static void test_append_run(void **st)
{
    const char *text = "hello world, a longer sentence";
    char want[256];
    s_decoded(text, want, sizeof want);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(tok_encode(s_tok, text, strlen(text), 0, &ids, &n), 0);
    assert_true(n >= 3);
    sampler_t *smp = s_sampler(NULL, (int)n);
    tok_stream_t ts;
    tok_stream_init(&ts, s_tok);
    token_text_t tt;
    assert_int_equal(token_text_init(&tt, 256), 0);
    char out[256] = "";
    for (size_t i = 0; i < n; i++) {   /* runs of 3 tokens: the first replaces, the others append */
        token_text_accept(&tt, smp, &ts, ids[i], i % 3 != 0);
        if (i % 3 == 2 || i + 1 == n)
            strncat(out, tt.buf, sizeof out - strlen(out) - 1);
    }
    assert_string_equal(out, want);
    token_text_free(&tt);
    sampler_destroy(&smp);
    free(ids);
}

static void test_no_tokenizer(void **st)
{
    sampler_t *smp = s_sampler(NULL, 2);
    token_text_t tt;
    assert_int_equal(token_text_init(&tt, 16), 0);
    assert_int_equal(token_text_accept(&tt, smp, NULL, 5, 0), FINISH_NONE);
    assert_int_equal(tt.len, 0);
    assert_int_equal(token_text_accept(&tt, smp, NULL, 6, 0), FINISH_LENGTH);
    assert_int_equal(tt.len, 0);
    token_text_free(&tt);
    assert_null(tt.buf);
    sampler_destroy(&smp);
}

static void test_small_buffer_cuts(void **st)
{
    char out[256];
    int used;
    s_stream("abcdefghijklmnopqrstuvwxyz abcdefghijklmnopqrstuvwxyz", NULL, 3, out, sizeof out, &used);
    assert_true(strlen(out) <= (size_t)used * 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_add_up),
        cmocka_unit_test(test_stop_string),
        cmocka_unit_test(test_held_back_then_flushed),
        cmocka_unit_test(test_append_run),
        cmocka_unit_test(test_no_tokenizer),
        cmocka_unit_test(test_small_buffer_cuts),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
