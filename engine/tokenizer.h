/* engine/tokenizer.h — Hugging Face byte-level BPE tokenizers (tokenizer.json), in C.
 *
 * Reproduces what the `tokenizers` library does with the tokenizer.json of Llama 3 and Qwen3,
 * id for id (tests/unit/test_tokenizer.c checks a corpus of thousands of strings against
 * expectations written by `tokenizers` itself):
 *   added tokens   matched first, leftmost-longest, honouring special / lstrip / rstrip /
 *                  single_word / normalized
 *   normalizer     NFC (Unicode 15.0 tables), or none; Sequence of those
 *   pre_tokenizer  Split (Oniguruma regex or literal string; all five behaviours; invert) and
 *                  ByteLevel (add_prefix_space, use_regex), alone or in a Sequence
 *   model          BPE by merge rank (merges as "a b" or ["a","b"]), ignore_merges,
 *                  continuing_subword_prefix / end_of_word_suffix, no dropout, no byte_fallback
 *   post_processor TemplateProcessing (single sequence), ByteLevel, Sequence of those
 *   decoder        ByteLevel, then invalid UTF-8 replaced by U+FFFD as Rust's from_utf8_lossy does
 * Anything else in the file is rejected at load time with an error naming the file and field,
 * so a tokenizer we would get wrong never loads. `truncation` and `padding` are ignored: the
 * engine never truncates or pads a prompt behind the caller's back.
 *
 * Decoding is what `Tokenizer.decode` returns: transformers' clean_up_tokenization_spaces is a
 * separate text post-pass that is not applied here.
 *
 * A loaded tokenizer is immutable: encode and decode may run from several threads at once.
 * tok_load and tok_destroy must not run concurrently with one another (Oniguruma's regex
 * compiler keeps shared state); load at start-up. */
#ifndef TROUPE_TOKENIZER_H
#define TROUPE_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct tokenizer tokenizer_t;

/* Loads dir/tokenizer.json (and dir/tokenizer_config.json when present) or, given a file, that
 * file and the tokenizer_config.json beside it. NULL on error with the reason in err. */
tokenizer_t *tok_load(const char *dir_or_tokenizer_json, char *err, size_t errlen);
void tok_destroy(tokenizer_t **self_p);

/* Encodes len bytes of UTF-8 text. add_special applies the post-processor (Llama 3's
 * TemplateProcessing adds <|begin_of_text|>). *ids is malloc'd and owned by the caller (it is
 * non-NULL even when *n is 0). -1 if text is not valid UTF-8 or memory runs out. */
int tok_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
               int32_t **ids, size_t *n);

/* Decodes ids into malloc'd, NUL-terminated UTF-8 (*len excludes the NUL). Ids that name no
 * token are skipped, as `tokenizers` does; skip_special drops added tokens marked special.
 * Invalid byte sequences become U+FFFD. -1 only when memory runs out. */
int tok_decode(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
               char **text, size_t *len);

/* Number of ids, added tokens included: the largest id + 1. */
int tok_vocab_size(const tokenizer_t *t);
/* The id of a token as spelled in the file ("<|im_end|>", or byte-level "Ġthe"); -1 if absent. */
int tok_token_id(const tokenizer_t *t, const char *token);
/* The token's spelling (NUL-terminated, owned by the tokenizer); NULL if id names no token. */
const char *tok_token_str(const tokenizer_t *t, int32_t id);
/* The raw bytes id decodes to (not NUL-terminated); NULL (and *len 0) if id names no token. */
const uint8_t *tok_token_bytes(const tokenizer_t *t, int32_t id, size_t *len);
/* bos_token / eos_token of tokenizer_config.json, else the special tokens the post-processor's
 * template puts before / after the text; -1 if none. */
int tok_bos_id(const tokenizer_t *t);
int tok_eos_id(const tokenizer_t *t);
/* 1 if id is an added token marked special (skipped by decode with skip_special). */
int tok_is_special(const tokenizer_t *t, int32_t id);
/* Longest byte string one token decodes to (sizes tok_stream_feed's output buffer). */
size_t tok_max_token_bytes(const tokenizer_t *t);

/* Streaming detokenizer: feed ids one at a time, get back only complete UTF-8 text.
 * The concatenation of everything fed and flushed equals tok_decode of the same ids, byte for
 * byte; no output ever ends inside a UTF-8 sequence. No allocation: a token's bytes that end
 * in an unfinished sequence wait (at most 3 bytes) for the next id. */
typedef struct tok_stream {
    const tokenizer_t *tok;  /* the tokenizer ids are looked up in */
    int skip_special;        /* 0 after init; set to 1 to drop special tokens like tok_decode */
    uint8_t pend[4];         /* the unfinished UTF-8 sequence held back, pend[0] its lead byte */
    uint8_t npend;           /* bytes in pend */
} tok_stream_t;

void tok_stream_init(tok_stream_t *s, const tokenizer_t *t);
/* Appends the text that id completes to out (at most cap bytes; *out_len gets the count, no
 * NUL). -1 if cap is too small, with the stream unchanged; cap >= 3 * tok_max_token_bytes(t) + 3
 * always suffices. Unknown ids produce nothing, as in tok_decode. */
int tok_stream_feed(tok_stream_t *s, int32_t id, char *out, size_t cap, size_t *out_len);
/* At the end: emits any held bytes (an unfinished sequence becomes one U+FFFD, as HF does with
 * errors='replace'), and resets the stream. -1 if cap < 3. */
int tok_stream_flush(tok_stream_t *s, char *out, size_t cap, size_t *out_len);

#endif
