/* tests/fuzz/fuzz_http_request.c — the gateway's request parser on arbitrary bytes: an OpenAI
 * request body (chat or completions, by the first byte) and an Authorization header value. Either
 * an error in OpenAI's shape (an HTTP status, a message, a type) or a request whose submit passes
 * the router protocol's own validation (msg_validate): whatever the parser accepts, the wire
 * accepts. The error and a reply built from the request must be valid JSON, and so must a
 * logprobs listing whose token is those bytes.
 * Seeds: tests/fuzz/corpus/http_request/ (one body each; first byte 'c' chat, else completions). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "actors/gateway/gw_keys.h"
#include "actors/gateway/gw_reply.h"
#include "actors/gateway/gw_request.h"

static void s_valid_json_as(char *s, size_t flags)
{
    if (!s)
        abort();
    json_t *j = json_loads(s, flags, NULL);
    if (!j)
        abort();
    json_decref(j);
    free(s);
}

static void s_valid_json(char *s) { s_valid_json_as(s, 0); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    gw_kind_t kind = data[0] == 'c' ? GW_CHAT : GW_COMPLETION;
    static const gw_parse_opts_t opts = {.model = "m", .can_retain = 1, .max_retention_s = 604800,
                                         .default_retention_s = 300};
    gw_request_t r;
    gw_error_t e;
    if (gw_request_parse(kind, (const char *)data + 1, size - 1, &opts, &r, &e) != 0) {
        if (e.status < 400 || e.status > 599 || !e.message[0] || !e.type || r.root)
            abort();
        s_valid_json(gw_error_json(&e));
    } else {
        msg_t m;
        msg_init(&m, MSG_SUBMIT, 1);
        m.u.submit = r.submit;
        char err[512];
        if (msg_validate(&m, err, sizeof err) != 0)
            abort();
        gw_reply_ctx_t c = {.kind = kind, .id = "x", .created = 1, .model = "m"};
        gw_usage_t u = {1, 0, 1};
        s_valid_json(gw_completion_json(&c, r.submit.prompt ? r.submit.prompt : "", "stop", &u, NULL, 0));
        gw_request_free(&r);
    }
    /* The same bytes as a token's in a logprobs listing (any bytes: part of a character, invalid
     * UTF-8, NUL), chosen and as an alternative: its text is always valid JSON (a NUL byte is the
     * character U+0000, "\u0000" in a JSON string: legal, though jansson asks to be told, and
     * refuses it in an object key, where the completions' map puts a token's text: that check
     * gets the bytes with NUL as 0x01). */
    uint8_t *tb = malloc(size);
    memcpy(tb, data + 1, size - 1);
    gw_logprob_t alt[] = {{.logprob = -1.0f, .bytes = tb, .n_bytes = (uint32_t)(size - 1), .id = 1},
                          {.logprob = -2.0f, .id = 2}};
    const gw_logprob_t lp = {.logprob = -1.0f, .bytes = tb, .n_bytes = (uint32_t)(size - 1), .top = alt, .n_top = 2};
    gw_reply_ctx_t lc = {.kind = GW_CHAT, .id = "x", .created = 1, .model = "m"};
    gw_usage_t lu = {1, 0, 1};
    s_valid_json_as(gw_completion_json(&lc, "", "stop", &lu, &lp, 1), JSON_ALLOW_NUL);
    for (size_t i = 0; i + 1 < size; i++)
        tb[i] = tb[i] ? tb[i] : 1;
    lc.kind = GW_COMPLETION;
    s_valid_json_as(gw_chunk_json(&lc, "", NULL, 0, 0, &lp, 1), JSON_ALLOW_NUL);
    /* The same bytes (NUL-free now) as a streamed token's text: the chunk written directly is
     * byte for byte the one jansson builds, for both kinds, first or not. */
    char *text = malloc(size);
    memcpy(text, tb, size - 1);
    text[size - 1] = '\0';
    for (int k = 0; k < 4; k++) {
        lc.kind = k & 1 ? GW_CHAT : GW_COMPLETION;
        char *direct = gw_chunk_json(&lc, text, NULL, k >> 1, k >> 1, NULL, 0);
        char *tree = gw_chunk_json_tree(&lc, text, NULL, k >> 1, k >> 1, NULL, 0);
        if (!direct || !tree || strcmp(direct, tree) != 0)
            abort();
        free(direct);
        free(tree);
    }
    free(text);
    free(tb);
    /* The same bytes as an Authorization header value. */
    char *h = malloc(size);
    memcpy(h, data + 1, size - 1);
    h[size - 1] = '\0';
    size_t n = 0;
    const char *t = gw_bearer(h, &n);
    if (t && (n == 0 || t < h || t + n > h + strlen(h)))
        abort();
    free(h);
    return 0;
}
