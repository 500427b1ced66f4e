/* tests/unit/test_chat_template.c — built-in chat templates against transformers.
 *
 * tests/fixtures/tokenizer/chat.jsonl holds apply_chat_template(..., tokenize=False) renderings
 * made by transformers 5.17 with the real Llama 3 and Qwen3 tokenizer_config.json templates, for
 * conversations covering system/user/assistant/tool turns, white space the Llama template trims,
 * <think> blocks before and after the last query, add_generation_prompt and enable_thinking.
 * Every rendering must match byte for byte, and (when the real tokenizers are present) encode to
 * the ids HF produced for it. Run from the repository root. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "engine/chat_template.h"
#include "engine/tokenizer.h"

#define FIX "tests/fixtures/tokenizer/chat.jsonl"
#define REAL "third_party/tokenizers"

static char s_tmp[256];

static int s_setup(void **state)
{
    snprintf(s_tmp, sizeof s_tmp, "/tmp/troupe-chat-XXXXXX");
    return mkdtemp(s_tmp) ? 0 : -1;
}

static int s_teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static void s_show_diff(const char *want, const char *got)
{
    size_t i = 0;
    while (want[i] && want[i] == got[i])
        i++;
    print_message("  differs at byte %zu: want \"%.40s\" got \"%.40s\"\n", i, want + i, got + i);
}

static void test_fixture_renderings(void **state)
{
    FILE *f = fopen(FIX, "r");
    if (!f)
        fail_msg("%s: cannot open (made by tests/fixtures/make_tokenizer_fixtures.py)", FIX);
    char err[512];
    tokenizer_t *toks[2] = {NULL, NULL};
    struct stat st;
    if (stat(REAL "/llama3", &st) == 0 && stat(REAL "/qwen3", &st) == 0) {
        toks[0] = tok_load(REAL "/llama3", err, sizeof err);
        toks[1] = tok_load(REAL "/qwen3", err, sizeof err);
        assert_non_null(toks[0]);
        assert_non_null(toks[1]);
    } else {
        print_message("note: %s missing, renderings checked without their token ids\n", REAL);
    }
    char *line = NULL;
    size_t cap = 0, lineno = 0, bad = 0, n_llama = 0, n_qwen = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 0) {
        lineno++;
        json_error_t e;
        json_t *c = json_loadb(line, (size_t)len, JSON_ALLOW_NUL, &e);
        if (!c)
            fail_msg("%s:%zu: %s", FIX, lineno, e.text);
        const char *fam = json_string_value(json_object_get(c, "family"));
        int is_llama = strcmp(fam, "llama3") == 0;
        n_llama += is_llama;
        n_qwen += !is_llama;
        json_t *msgs = json_object_get(c, "messages");
        size_t n = json_array_size(msgs);
        chat_msg_t *m = calloc(n, sizeof *m);
        for (size_t i = 0; i < n; i++) {
            m[i].role = json_string_value(json_object_get(json_array_get(msgs, i), "role"));
            m[i].content = json_string_value(json_object_get(json_array_get(msgs, i), "content"));
        }
        json_t *think = json_object_get(c, "enable_thinking");
        int enable_thinking = json_is_false(think) ? 0 : 1;
        int agp = json_is_true(json_object_get(c, "add_generation_prompt"));
        const char *want = json_string_value(json_object_get(c, "text"));
        char *got = NULL;
        if (chat_render(is_llama ? CHAT_LLAMA3 : CHAT_CHATML, m, n, agp, enable_thinking, &got, err, sizeof err) < 0)
            fail_msg("%s:%zu: chat_render: %s", FIX, lineno, err);
        if (strcmp(want, got) != 0) {
            if (bad++ < 8) {
                print_message("%s:%zu (%s, add_generation_prompt %d, enable_thinking %d): rendering differs\n",
                              FIX, lineno, fam, agp, enable_thinking);
                s_show_diff(want, got);
            }
        } else if (toks[0]) {
            /* the rendered prompt through the tokenizer: HF's ids */
            json_t *ids = json_object_get(c, "ids");
            int32_t *gi;
            size_t gn;
            assert_int_equal(tok_encode(toks[is_llama ? 0 : 1], got, strlen(got), 0, &gi, &gn), 0);
            int same = gn == json_array_size(ids);
            for (size_t i = 0; same && i < gn; i++)
                same = gi[i] == json_integer_value(json_array_get(ids, i));
            if (!same && bad++ < 8)
                print_message("%s:%zu: token ids of the rendering differ\n", FIX, lineno);
            free(gi);
        }
        free(got);
        free(m);
        json_decref(c);
    }
    free(line);
    fclose(f);
    tok_destroy(&toks[0]);
    tok_destroy(&toks[1]);
    print_message("chat fixtures: %zu llama3, %zu qwen3 renderings, %zu mismatches\n", n_llama, n_qwen, bad);
    assert_true(n_llama >= 20 && n_qwen >= 60);
    assert_int_equal(bad, 0);
}

static void s_write_cfg(const char *json_text)
{
    char path[400];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", s_tmp);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(json_text, f);
    fclose(f);
}

static void test_detect(void **state)
{
    struct stat st;
    if (stat(REAL "/llama3", &st) == 0) {
        assert_int_equal(chat_family_detect(REAL "/llama3"), CHAT_LLAMA3);
        assert_int_equal(chat_family_detect(REAL "/llama3/tokenizer_config.json"), CHAT_LLAMA3);
        assert_int_equal(chat_family_detect(REAL "/qwen3"), CHAT_CHATML);
    } else {
        print_message("note: %s missing, detection checked on synthetic configs only\n", REAL);
    }
    assert_int_equal(chat_family_detect("/nonexistent"), CHAT_NONE);
    assert_int_equal(chat_family_detect(NULL), CHAT_NONE);
    s_write_cfg("{\"eos_token\": \"x\"}");
    assert_int_equal(chat_family_detect(s_tmp), CHAT_NONE);                 /* no template */
    s_write_cfg("{\"chat_template\": ");
    assert_int_equal(chat_family_detect(s_tmp), CHAT_NONE);                 /* not JSON */
    /* A Llama 3.1-style template renders a dated system block: not ours. */
    s_write_cfg("{\"chat_template\": \"{{- bos_token }}{%- if not date_string is defined %}{%- set date_string = "
                "\\\"26 Jul 2024\\\" %}{%- endif %}<|start_header_id|>system<|end_header_id|>Cutting Knowledge Date"
                "{{ message['content'] | trim }}<|eot_id|>\"}");
    assert_int_equal(chat_family_detect(s_tmp), CHAT_NONE);
    /* Qwen2.5's ChatML template has no thinking logic: not ours either. */
    s_write_cfg("{\"chat_template\": \"{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\\\n' + "
                "message.content + '<|im_end|>' + '\\\\n' }}{%- endfor %}\"}");
    assert_int_equal(chat_family_detect(s_tmp), CHAT_NONE);
    /* The list form: the template named "default" counts. */
    s_write_cfg("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}, {\"name\": \"default\", \"template\": "
                "\"{{ bos_token }}<|start_header_id|>{{ message['content'] | trim }}<|eot_id|>\"}], "
                "\"model_max_length\": 1000000000000000019884624838656}");
    assert_int_equal(chat_family_detect(s_tmp), CHAT_LLAMA3);
    assert_string_equal(chat_family_name(CHAT_LLAMA3), "llama3");
    assert_string_equal(chat_family_name(CHAT_CHATML), "chatml");
    assert_string_equal(chat_family_name(CHAT_NONE), "none");
}

static void test_errors(void **state)
{
    char err[256], *out = (char *)1;
    chat_msg_t ok = {"user", "hi"};
    assert_int_equal(chat_render(CHAT_NONE, &ok, 1, 1, 1, &out, err, sizeof err), -1);
    assert_null(out);
    assert_non_null(strstr(err, "no built-in chat template"));
    assert_int_equal(chat_render(CHAT_CHATML, &ok, 0, 1, 1, &out, err, sizeof err), -1);
    assert_non_null(strstr(err, "no messages"));
    chat_msg_t bad[2] = {{"user", "hi"}, {"assistant", NULL}};
    assert_int_equal(chat_render(CHAT_LLAMA3, bad, 2, 1, 1, &out, err, sizeof err), -1);
    assert_non_null(strstr(err, "messages[1].content"));
    bad[1] = (chat_msg_t){NULL, "x"};
    assert_int_equal(chat_render(CHAT_CHATML, bad, 2, 1, 1, &out, err, sizeof err), -1);
    assert_non_null(strstr(err, "messages[1].role"));
}

/* Cases the fixture does not spell out, reasoned from the templates. */
static void test_direct(void **state)
{
    char err[256], *out;
    /* Llama 3 trims Python's white space, which includes U+3000 and U+001C..U+001F but not ZWSP. */
    chat_msg_t m1[] = {{"user", "\xe3\x80\x80\x1c hi \xe2\x80\x8b\n"}};
    assert_int_equal(chat_render(CHAT_LLAMA3, m1, 1, 0, 1, &out, err, sizeof err), 0);
    assert_string_equal(out, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi \xe2\x80\x8b"
                             "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    /* Qwen3 drops roles it does not know, and a leading non-system turn has no system block. */
    chat_msg_t m2[] = {{"user", "a"}, {"narrator", "ignored"}, {"assistant", "b"}};
    assert_int_equal(chat_render(CHAT_CHATML, m2, 3, 0, 1, &out, err, sizeof err), 0);
    assert_string_equal(out, "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n");
    free(out);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_renderings),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_direct),
    };
    return cmocka_run_group_tests(tests, s_setup, s_teardown);
}
