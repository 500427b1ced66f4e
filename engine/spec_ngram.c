/* engine/spec_ngram.c — the n-gram (prompt lookup) proposer: the sequence's own tokens, prompt and
 * generated, are the draft. Semantics: engine/spec.h.
 *
 * Why it pays: generated text often repeats its prompt (quotes, code edits, retrieval answers) or
 * itself; where it does, the tokens that followed the last occurrence of the current suffix are
 * likely to follow again, and guessing costs a scan of the sequence, not a model. */
#include "engine/spec.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int min_n, max_n;              /* suffix lengths tried, longest first */
} s_ngram_t;

/* The start of the most recent earlier occurrence of tokens[n-len..n), or -1. */
static int s_find(const int32_t *tokens, int n, int len)
{
    const int32_t *suffix = tokens + n - len;
    for (int j = n - len - 1; j >= 0; j--)
        if (tokens[j] == suffix[0] && memcmp(tokens + j, suffix, (size_t)len * sizeof(int32_t)) == 0)
            return j;
    return -1;
}

int spec_ngram_propose(const int32_t *tokens, int n, int min_n, int max_n, int k, int32_t *drafts)
{
    if (k > SPEC_MAX_K)
        k = SPEC_MAX_K;
    for (int len = max_n < n - 1 ? max_n : n - 1; len >= min_n && k > 0; len--) {
        int j = s_find(tokens, n, len);
        if (j < 0)
            continue;
        /* Continuation from j + len; past the end of the sequence it copies the drafts already
         * written (src - n < i), so "a b a b" proposes "a b a b ...". */
        for (int i = 0; i < k; i++) {
            int src = j + len + i;
            drafts[i] = src < n ? tokens[src] : drafts[src - n];
        }
        return k;
    }
    return 0;
}

static int s_propose(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n, int k, int32_t *drafts,
                     float *probs)
{
    (void)id;
    const s_ngram_t *g = p->impl;
    int r = spec_ngram_propose(tokens, n, g->min_n, g->max_n, k, drafts);
    for (int i = 0; probs && i < r; i++)
        probs[i] = 1.0f;                            /* a point mass */
    return r;
}

static void s_destroy(spec_proposer_t *p)
{
    free(p->impl);
    free(p);
}

static const spec_proposer_ops_t s_ops = {
    .name = "ngram", .propose = s_propose, .accepted = NULL, .forget = NULL, .destroy = s_destroy,
};

spec_proposer_t *spec_ngram_new(int min_n, int max_n)
{
    if (min_n < 1 || max_n < min_n || max_n > 64)
        return NULL;
    spec_proposer_t *p = calloc(1, sizeof(*p));
    s_ngram_t *g = calloc(1, sizeof(*g));
    if (!p || !g) {
        free(p);
        free(g);
        return NULL;
    }
    g->min_n = min_n;
    g->max_n = max_n;
    p->ops = &s_ops;
    p->impl = g;
    return p;
}
