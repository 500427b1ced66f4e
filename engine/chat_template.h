/* engine/chat_template.h — built-in chat templates, byte for byte what transformers'
 * apply_chat_template(..., tokenize=False) renders with the model's own Jinja template.
 *
 * There is no Jinja engine in C; each supported family's template is written out by hand and
 * tests/unit/test_chat_template.c checks it against renderings made by transformers itself
 * (tests/fixtures/tokenizer/chat.jsonl). Supported, as shipped in the pinned tokenizers:
 *   CHAT_LLAMA3  Meta Llama 3 (the original 8B/70B Instruct template): BOS, then per message
 *                a header with the role, the content stripped of white space (Jinja's trim),
 *                <|eot_id|>; the assistant header is ALWAYS appended (the template ignores
 *                add_generation_prompt). Llama 3.1+ templates (with the "Cutting Knowledge
 *                Date" system block) are a different template and detect as CHAT_NONE.
 *   CHAT_CHATML  Qwen3 without tools: system first, user/system/assistant/tool turns, the
 *                <think> handling of assistant turns after the last user query, and
 *                enable_thinking = 0 appending an empty think block to the generation prompt.
 *                Messages with any other role are dropped, as the template drops them.
 * Tool definitions and tool_calls (structured fields) are not supported; tool results are. */
#ifndef TROUPE_CHAT_TEMPLATE_H
#define TROUPE_CHAT_TEMPLATE_H

#include <stddef.h>

typedef struct {
    const char *role;            /* "system", "user", "assistant", "tool" (UTF-8, NUL-terminated) */
    const char *content;         /* UTF-8, NUL-terminated */
} chat_msg_t;

typedef enum { CHAT_LLAMA3, CHAT_CHATML /* Qwen3 */, CHAT_NONE } chat_family_t;

/* Reads tokenizer_config.json (the file, or the one in a directory) and recognises its
 * chat_template. CHAT_NONE when the file is unreadable, has no template, or has one we do not
 * reproduce exactly (callers must then refuse chat requests rather than guess). */
chat_family_t chat_family_detect(const char *tokenizer_config_json_path_or_dir);
const char *chat_family_name(chat_family_t f);           /* "llama3", "chatml", "none" */

/* Renders n >= 1 messages into *out (malloc'd, NUL-terminated, owned by the caller).
 * enable_thinking matters for CHAT_CHATML only: 1 is the template's default, 0 sets it false.
 * -1 with a message in err for CHAT_NONE, no messages, or a message without role or content. */
int chat_render(chat_family_t f, const chat_msg_t *msgs, size_t n, int add_generation_prompt,
                int enable_thinking, char **out, char *err, size_t errlen);

#endif
