/* tests/fuzz/fuzz_tokenizer.c — the real Qwen3 tokenizer on arbitrary bytes.
 *
 * Loaded once (third_party/tokenizers/qwen3, or $TROUPE_TOKENIZER_DIR). For each input:
 *   - invalid UTF-8 must be refused (-1, no ids);
 *   - valid UTF-8 must encode, and decode(encode(x)) must be NFC(x) (Qwen3 normalizes to NFC;
 *     its added tokens start with '<' and end with '>', so normalizing around them is the same
 *     as normalizing the whole), and the stream must give exactly the one-shot decode, in
 *     complete UTF-8 chunks;
 *   - the input read as int32 ids (any values) must decode and stream identically.
 * Seeds: tests/fuzz/corpus/tokenizer/. Run from the repository root. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/tokenizer.h"
#include "engine/tokenizer_internal.h"

static tokenizer_t *s_tok;
static char *s_chunk;
static size_t s_chunk_cap;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *dir = getenv("TROUPE_TOKENIZER_DIR");
    char err[512];
    s_tok = tok_load(dir ? dir : "third_party/tokenizers/qwen3", err, sizeof err);
    if (!s_tok) {
        fprintf(stderr, "fuzz_tokenizer: %s (run tools/fetch-tokenizers.sh from the repository root)\n", err);
        exit(1);
    }
    s_chunk_cap = 3 * tok_max_token_bytes(s_tok) + 3;
    s_chunk = malloc(s_chunk_cap);
    return 0;
}

/* Streams ids and checks the result equals want; aborts otherwise. */
static void s_check_stream(const int32_t *ids, size_t n, int skip_special, const char *want, size_t wlen)
{
    tok_stream_t st;
    tok_stream_init(&st, s_tok);
    st.skip_special = skip_special;
    size_t w = 0, got;
    for (size_t i = 0; i < n; i++) {
        if (tok_stream_feed(&st, ids[i], s_chunk, s_chunk_cap, &got) != 0)
            abort();
        if (!tok_utf8_valid((const uint8_t *)s_chunk, got, NULL) || w + got > wlen ||
            memcmp(want + w, s_chunk, got) != 0)
            abort();
        w += got;
    }
    if (tok_stream_flush(&st, s_chunk, s_chunk_cap, &got) != 0 || w + got != wlen ||
        memcmp(want + w, s_chunk, got) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int32_t *ids = NULL;
    size_t n = 99;
    int valid = tok_utf8_valid(data, size, NULL);
    int rc = tok_encode(s_tok, (const char *)data, size, size & 1, &ids, &n);
    if (!valid) {
        if (rc != -1 || ids || n != 0)
            abort();
    } else {
        if (rc != 0 || !ids)
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= tok_vocab_size(s_tok))
                abort();
        char *text;
        size_t len;
        if (tok_decode(s_tok, ids, n, 0, &text, &len) != 0)
            abort();
        tok_buf_t nfc = {0};
        if (tok_nfc_append(data, size, &nfc) != 0)
            abort();
        if (len != nfc.n || (len && memcmp(text, nfc.p, len) != 0))
            abort();
        s_check_stream(ids, n, 0, text, len);
        free(nfc.p);
        free(text);
        free(ids);
    }

    /* The same bytes as raw ids: anything goes, nothing may crash or disagree. */
    size_t m = size / 4;
    int32_t *raw = malloc((m ? m : 1) * sizeof *raw);
    memcpy(raw, data, m * 4);
    for (int skip = 0; skip <= 1; skip++) {
        char *text;
        size_t len;
        if (tok_decode(s_tok, raw, m, skip, &text, &len) != 0 || !tok_utf8_valid((const uint8_t *)text, len, NULL))
            abort();
        s_check_stream(raw, m, skip, text, len);
        free(text);
    }
    free(raw);
    return 0;
}
