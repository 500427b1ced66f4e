/* engine/spec_ngram.c — the n-gram (prompt lookup) proposer: the sequence's own tokens, prompt and
 * generated, are the draft. Semantics: engine/spec.h.
 *
 * Why it pays: generated text often repeats its prompt (quotes, code edits, retrieval answers) or
 * itself; where it does, the tokens that followed the last occurrence of the current suffix are
 * likely to follow again, and guessing costs a scan of the sequence, not a model.
 *
 * Calibrated confidence (spec_ngram_new's calibrated): a draft is a point mass, but how often the
 * target keeps it depends on how long a suffix matched and how far into the continuation it lies
 * (a one-token match proposes noise; a three-token match in a quoted verse, the verse). The
 * proposer counts, per (match length, draft position), how often a verified draft was reached
 * (every draft before it kept) and kept, and reports (kept + 1) / (reached + 2) as its confidence
 * in each draft: a probability of acceptance given the drafts before it, which is what the
 * draft-scheduler's prefix survival multiplies (a draft model's softmax probability stands for
 * the same). Counts halve past NG_HALF reached so the estimate follows the text. The verify rule
 * does not read it: output stays exact whatever the confidence says. */
#include "engine/spec.h"

#include <stdlib.h>
#include <string.h>

#define NG_LENS 8                  /* match-length buckets: 1..7 and 8 or more */
#define NG_SLOTS 4096              /* sequences whose last proposal is remembered (direct-mapped by id) */
#define NG_HALF 2048.0             /* counts halve past this many reached at a cell */

typedef struct {
    uint64_t id;                   /* 0: empty */
    int8_t len;                    /* the last proposal's match-length bucket */
} ng_slot_t;

typedef struct {
    int min_n, max_n;              /* suffix lengths tried, longest first */
    int calibrated;                /* confidences from the counts below (else 1.0) */
    float reached[NG_LENS][SPEC_MAX_K], kept[NG_LENS][SPEC_MAX_K];
    ng_slot_t *slots;              /* [NG_SLOTS] when calibrated */
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

/* The search; *match gets the suffix length that matched (0: none). */
static int s_search(const int32_t *tokens, int n, int min_n, int max_n, int k, int32_t *drafts, int *match)
{
    *match = 0;
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
        *match = len;
        return k;
    }
    return 0;
}

int spec_ngram_propose(const int32_t *tokens, int n, int min_n, int max_n, int k, int32_t *drafts)
{
    int match;
    return s_search(tokens, n, min_n, max_n, k, drafts, &match);
}

static ng_slot_t *s_slot(const s_ngram_t *g, uint64_t id)
{
    return g->slots + (id * 0x9e3779b97f4a7c15ull >> 52) % NG_SLOTS;
}

static int s_propose(spec_proposer_t *p, uint64_t id, const int32_t *tokens, int n, int k, int32_t *drafts,
                     float *probs)
{
    s_ngram_t *g = p->impl;
    int match;
    const int r = s_search(tokens, n, g->min_n, g->max_n, k, drafts, &match);
    const int b = (match < NG_LENS ? match : NG_LENS) - 1;
    if (g->calibrated && r > 0)   /* a slot taken by another id loses that one's count, nothing else */
        *s_slot(g, id) = (ng_slot_t){.id = id, .len = (int8_t)b};
    for (int i = 0; probs && i < r; i++)
        probs[i] = g->calibrated ? (g->kept[b][i] + 1.0f) / (g->reached[b][i] + 2.0f) : 1.0f;
    return r;
}

/* The target verified n_verified of id's last proposal and kept n_accepted: drafts 0..n_accepted
 * were reached (the one after the kept ones only when verified), the first n_accepted kept. */
static void s_accepted(spec_proposer_t *p, uint64_t id, int n_verified, int n_accepted)
{
    s_ngram_t *g = p->impl;
    if (!g->calibrated || n_verified <= 0 || n_accepted < 0 || n_accepted > n_verified)
        return;
    ng_slot_t *s = s_slot(g, id);
    if (s->id != id)
        return;
    const int b = s->len;
    s->id = 0;                     /* one report per proposal */
    const int reached = n_accepted < n_verified ? n_accepted + 1 : n_verified;
    for (int i = 0; i < reached && i < SPEC_MAX_K; i++) {
        g->reached[b][i] += 1.0f;
        g->kept[b][i] += i < n_accepted;
        if (g->reached[b][i] > NG_HALF) {
            g->reached[b][i] *= 0.5f;
            g->kept[b][i] *= 0.5f;
        }
    }
}

static void s_forget(spec_proposer_t *p, uint64_t id)
{
    s_ngram_t *g = p->impl;
    if (g->calibrated && s_slot(g, id)->id == id)
        s_slot(g, id)->id = 0;
}

static void s_destroy(spec_proposer_t *p)
{
    s_ngram_t *g = p->impl;
    free(g->slots);
    free(g);
    free(p);
}

static const spec_proposer_ops_t s_ops = {
    .name = "ngram", .propose = s_propose, .accepted = s_accepted, .forget = s_forget, .destroy = s_destroy,
};

spec_proposer_t *spec_ngram_new(int min_n, int max_n, int calibrated)
{
    if (min_n < 1 || max_n < min_n || max_n > 64)
        return NULL;
    spec_proposer_t *p = calloc(1, sizeof(*p));
    s_ngram_t *g = calloc(1, sizeof(*g));
    ng_slot_t *slots = calibrated ? calloc(NG_SLOTS, sizeof *slots) : NULL;
    if (!p || !g || (calibrated && !slots)) {
        free(p);
        free(g);
        free(slots);
        return NULL;
    }
    g->min_n = min_n;
    g->max_n = max_n;
    g->calibrated = calibrated != 0;
    g->slots = slots;
    p->ops = &s_ops;
    p->impl = g;
    return p;
}
