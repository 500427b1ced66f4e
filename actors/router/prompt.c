/* actors/router/prompt.c — see prompt.h. */
#include "actors/router/prompt.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

int prompt_ids(const prompt_model_t *pm, const msg_submit_t *s, int32_t **ids, size_t *n, char *err, size_t errlen,
               const char **field)
{
    *ids = NULL;
    *n = 0;
    if (s->n_tokens) {
        *field = "tokens";
        *ids = malloc(s->n_tokens * sizeof **ids);
        if (!*ids)
            return errf(err, errlen, "out of memory");
        for (uint32_t i = 0; i < s->n_tokens; i++) {
            if (s->tokens[i] >= (uint32_t)pm->vocab_size) {
                free(*ids);
                *ids = NULL;
                return errf(err, errlen, "token id %u at position %u is outside the vocabulary (%d)",
                            s->tokens[i], i, pm->vocab_size);
            }
            (*ids)[i] = (int32_t)s->tokens[i];
        }
        *n = s->n_tokens;
        return 0;
    }
    if (!pm->tok) {
        *field = s->prompt ? "prompt" : "messages";
        return errf(err, errlen, "this model has no tokenizer: send token ids");
    }
    if (s->prompt) {
        *field = "prompt";
        /* Bounded before tokenizing (what one request costs a tokenizer thread): no token is longer than
         * tok_max_token_bytes, so a longer text cannot fit in max_model_len tokens. */
        size_t bytes = strlen(s->prompt), cap = (size_t)pm->max_model_len * tok_max_token_bytes(pm->tok);
        if (bytes > cap)
            return errf(err, errlen, "prompt of %zu bytes cannot fit in max_model_len (%d tokens of at most %zu "
                        "bytes: %zu bytes)", bytes, pm->max_model_len, tok_max_token_bytes(pm->tok), cap);
        if (tok_encode(pm->tok, s->prompt, strlen(s->prompt), 1, ids, n) != 0)
            return errf(err, errlen, "prompt is not valid UTF-8");
        return 0;
    }
    *field = "messages";
    if (pm->chat == CHAT_NONE)
        return errf(err, errlen, "this model has no supported chat template: send a prompt or token ids");
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    chat_msg_t *cm = malloc(s->n_messages * sizeof *cm);
    if (!cm)
        return errf(err, errlen, "out of memory");
    for (uint32_t i = 0; i < s->n_messages; i++)
        cm[i] = (chat_msg_t){.role = roles[s->messages[i].role], .content = s->messages[i].content};
    char *text = NULL;
    int rc = chat_render(pm->chat, cm, s->n_messages, 1, 1, &text, err, errlen);
    free(cm);
    if (rc != 0)
        return -1;
    /* The rendered template carries its own special tokens (BOS included): no post-processor. */
    rc = tok_encode(pm->tok, text, strlen(text), 0, ids, n);
    free(text);
    return rc == 0 ? 0 : errf(err, errlen, "chat messages are not valid UTF-8");
}
