/* engine/router_skew.c — the router bias that makes dummy MoE weights route with a named skew
 * (engine/router_skew.h says how it is fitted), and its application at model load.
 *
 * Known limits: the fit assumes a token's router logits are independent and normal given its
 * hidden state, which holds for random router rows (each logit a sum of H independent terms); it
 * says nothing of trained routers, and it is refused for real weights. DeepSeek's sigmoid,
 * group-limited routing is not covered (its groups would need a fit of their own). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "engine/kvcache.h"
#include "engine/model_internal.h"
#include "engine/router_skew.h"

#define FIT_ITERS 60
#define CAP_BELOW_ONE 0.995       /* a capped expert is picked by this fraction of tokens, not all:
                                     the normal fit cannot reach probability 1 */

void router_skew_free(router_skew_t *s)
{
    if (!s)
        return;
    free(s->table);
    s->table = NULL;
}

/* "layer L tokens c0 c1 ..." lines of a troupe-expert-load output. */
static int s_read_table(const char *path, router_skew_t *s, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return errf(err, errlen, "router skew table %s: %s", path, strerror(errno));
    char line[65536];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        int layer, off = 0;
        if (sscanf(line, "layer %d tokens%n", &layer, &off) != 1 || off == 0)
            continue;
        if (layer != s->n_layers) {
            rc = errf(err, errlen, "router skew table %s:%d: layer %d where layer %d was expected (layers in order "
                      "from 0)",
                      path, lineno, layer, s->n_layers);
            break;
        }
        if (s->n_layers == ROUTER_SKEW_MAX_LAYERS) {
            rc = errf(err, errlen, "router skew table %s:%d: more than %d layers", path, lineno,
                      ROUTER_SKEW_MAX_LAYERS);
            break;
        }
        double row[ROUTER_SKEW_MAX_EXPERTS];
        int n = 0;
        double sum = 0;
        for (char *p = line + off;;) {
            while (*p == ' ' || *p == '\t')
                p++;
            if (!*p || *p == '\n' || *p == '\r')
                break;
            char *end;
            errno = 0;
            const double v = strtod(p, &end);
            if (end == p || errno || !(v >= 0) || !isfinite(v) || n == ROUTER_SKEW_MAX_EXPERTS) {
                rc = errf(err, errlen, "router skew table %s:%d: layer %d: count %d is not a number >= 0 (or more "
                          "than %d)",
                          path, lineno, layer, n, ROUTER_SKEW_MAX_EXPERTS);
                break;
            }
            row[n++] = v;
            sum += v;
            p = end;
        }
        if (rc < 0)
            break;
        if (n < 2 || (s->n_layers > 0 && n != s->n_experts) || !(sum > 0)) {
            rc = errf(err, errlen, "router skew table %s:%d: layer %d has %d counts summing to %g (expected %s, a "
                      "positive sum)",
                      path, lineno, layer, n, sum, s->n_layers > 0 ? "as many as layer 0" : "at least 2");
            break;
        }
        double *t = realloc(s->table, (size_t)(s->n_layers + 1) * (size_t)n * sizeof(double));
        if (!t) {
            rc = errf(err, errlen, "router skew table %s: out of memory", path);
            break;
        }
        s->table = t;
        memcpy(t + (size_t)s->n_layers * n, row, (size_t)n * sizeof(double));
        s->n_experts = n;
        s->n_layers++;
    }
    fclose(f);
    if (rc == 0 && s->n_layers == 0)
        rc = errf(err, errlen, "router skew table %s: no 'layer L tokens c0 c1 ...' line (troupe-expert-load's "
                  "output)", path);
    return rc;
}

int router_skew_parse(const char *spec, router_skew_t *out, char *err, size_t errlen)
{
    *out = (router_skew_t){.kind = ROUTER_SKEW_UNIFORM};
    if (!spec || !*spec || !strcmp(spec, "uniform")) {
        snprintf(out->name, sizeof out->name, "uniform");
        return 0;
    }
    snprintf(out->name, sizeof out->name, "%s", spec);
    if (!strncmp(spec, "zipf:", 5)) {
        char *end;
        errno = 0;
        const double s = strtod(spec + 5, &end);
        if (end == spec + 5 || *end || errno || !(s >= 0 && s <= 8))
            return errf(err, errlen, "router skew '%s': the zipf exponent must be a number in [0, 8]", spec);
        out->kind = ROUTER_SKEW_ZIPF;
        out->exponent = s;
        return 0;
    }
    if (!strncmp(spec, "table:", 6) && spec[6]) {
        out->kind = ROUTER_SKEW_TABLE;
        if (s_read_table(spec + 6, out, err, errlen) < 0) {
            router_skew_free(out);
            return -1;
        }
        return 0;
    }
    return errf(err, errlen, "router skew '%s': expected uniform, zipf:S or table:FILE", spec);
}

static uint64_t s_next(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double s_unit(uint64_t *x) { return ((double)(s_next(x) >> 11) + 0.5) / 9007199254740992.0; }   /* (0, 1) */

/* Standard normals by the ziggurat (Marsaglia and Tsang, in Doornik's ZIGNOR layout: 128 layers of
 * equal area V, the base layer's tail beyond R drawn exactly): the fit draws ~3e7 of them per call,
 * and Box-Muller's log, sqrt and sincos per pair took most of a fit's time; this takes one 64-bit
 * draw and a compare for 98.8% of them. Exact, as Box-Muller is (tests/unit/test_router_skew.c
 * checks a fit against Box-Muller draws). */
#define ZIG_C 128
#define ZIG_R 3.442619855899
#define ZIG_V 9.91256303526217e-3

typedef struct zig {
    double x[ZIG_C + 1];          /* layer i: width x[i], between heights f(x[i]) and f(x[i + 1]);
                                     x[0] = V / f(R) (the base with its tail), x[1] = R, x[128] = 0 */
    double r[ZIG_C];              /* x[i + 1] / x[i]: the part of layer i wholly under the curve */
} zig_t;

static void s_zig_init(zig_t *t)
{
    double f = exp(-0.5 * ZIG_R * ZIG_R);
    t->x[0] = ZIG_V / f;
    t->x[1] = ZIG_R;
    t->x[ZIG_C] = 0;
    for (int i = 2; i < ZIG_C; i++) {
        t->x[i] = sqrt(-2 * log(ZIG_V / t->x[i - 1] + f));
        f = exp(-0.5 * t->x[i] * t->x[i]);
    }
    for (int i = 0; i < ZIG_C; i++)
        t->r[i] = t->x[i + 1] / t->x[i];
}

static double s_normal(const zig_t *t, uint64_t *rng)
{
    for (;;) {
        const uint64_t v = s_next(rng);   /* the layer from the low 7 bits, u from the top 53 */
        const int i = (int)(v & (ZIG_C - 1));
        const double u = 2 * (((double)(v >> 11) + 0.5) / 9007199254740992.0) - 1;
        if (fabs(u) < t->r[i])
            return u * t->x[i];
        if (i == 0) {             /* the tail beyond R (Marsaglia's exponential rejection) */
            double a, c;
            do {
                a = log(s_unit(rng)) / ZIG_R;
                c = log(s_unit(rng));
            } while (-2 * c < a * a);
            return u < 0 ? a - ZIG_R : ZIG_R - a;
        }
        const double x = u * t->x[i];   /* the wedge: under the curve with probability f(x) there */
        const double f0 = exp(-0.5 * (t->x[i] * t->x[i] - x * x));
        const double f1 = exp(-0.5 * (t->x[i + 1] * t->x[i + 1] - x * x));
        if (f1 + s_unit(rng) * (f0 - f1) < 1.0)
            return x;
    }
}

static int s_cmp_desc(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* No share above cap: the excess spread over the uncapped experts in proportion (water-filling). */
static void s_cap(double *share, int E, double cap)
{
    for (int round = 0; round < E; round++) {
        double excess = 0, free_sum = 0;
        for (int e = 0; e < E; e++) {
            if (share[e] > cap) {
                excess += share[e] - cap;
                share[e] = cap;
            } else if (share[e] < cap) {
                free_sum += share[e];
            }
        }
        if (excess <= 1e-15 || free_sum <= 0)
            return;
        for (int e = 0; e < E; e++)
            if (share[e] < cap)
                share[e] += excess * share[e] / free_sum;
    }
}

int router_skew_target(const router_skew_t *s, int moe_index, int n_moe, int E, int k, double *share, char *err,
                       size_t errlen)
{
    if (E < 2 || E > ROUTER_SKEW_MAX_EXPERTS || k < 1 || k >= E || n_moe < 1 || moe_index < 0 || moe_index >= n_moe)
        return errf(err, errlen, "router skew '%s': %d experts top-%d (MoE layer %d of %d) cannot be skewed", s->name,
                    E,
                    k, moe_index, n_moe);
    int shuffle = 1;
    if (s->kind == ROUTER_SKEW_UNIFORM) {
        for (int e = 0; e < E; e++)
            share[e] = 1.0 / E;
        return 0;
    } else if (s->kind == ROUTER_SKEW_ZIPF) {
        for (int r = 0; r < E; r++)
            share[r] = pow(r + 1.0, -s->exponent);
    } else {
        const int Et = s->n_experts;
        const double *row = s->table + (size_t)(moe_index * s->n_layers / n_moe) * Et;
        if (Et == E) {            /* as measured, expert ids kept; a never-routed expert still gets a trickle */
            for (int e = 0; e < E; e++)
                share[e] = row[e] > 0.5 ? row[e] : 0.5;
            shuffle = 0;
        } else {                  /* sorted, the cumulative share curve resampled at E points */
            double *sorted = malloc((size_t)(Et + 1) * sizeof(double));
            if (!sorted)
                return errf(err, errlen, "router skew: out of memory");
            double sum = 0;
            for (int e = 0; e < Et; e++)
                sorted[e] = row[e], sum += row[e];
            qsort(sorted, (size_t)Et, sizeof(double), s_cmp_desc);
            double prev = 0;
            for (int j = 1; j <= E; j++) {
                const double x = (double)j * Et / E;      /* F at x / Et of the experts */
                const int i = (int)x < Et ? (int)x : Et - 1;
                double F = 0;
                for (int q = 0; q < i; q++)
                    F += sorted[q];
                F = (F + (x - i) * sorted[i]) / sum;
                share[j - 1] = F - prev > 1e-9 ? F - prev : 1e-9;
                prev = F;
            }
            free(sorted);
        }
    }
    double sum = 0;
    for (int e = 0; e < E; e++)
        sum += share[e];
    for (int e = 0; e < E; e++)
        share[e] /= sum;
    s_cap(share, E, CAP_BELOW_ONE / k);
    if (shuffle) {                /* ranks dealt to experts by a fixed shuffle per layer */
        uint64_t rng = 0x5eedull + (uint64_t)moe_index * 0x9e3779b97f4a7c15ull;
        for (int i = E - 1; i > 0; i--) {
            const int j = (int)(s_next(&rng) % (uint64_t)(i + 1));
            const double t = share[i];
            share[i] = share[j];
            share[j] = t;
        }
    }
    return 0;
}

double router_skew_busiest_over_avg(const double *share, int E)
{
    double mx = 0;
    for (int e = 0; e < E; e++)
        mx = share[e] > mx ? share[e] : mx;
    return mx * E;
}

/* The standard normal's quantile by bisection on erfc (called E times per fit iteration). */
static double s_probit(double p)
{
    double lo = -12, hi = 12;
    for (int i = 0; i < 64; i++) {
        const double mid = (lo + hi) / 2;
        if (0.5 * erfc(-mid / sqrt(2.0)) < p)
            lo = mid;
        else
            hi = mid;
    }
    return (lo + hi) / 2;
}

double router_skew_fit(const double *share, int E, int k, float *bias)
{
    int N = 1 << 19;              /* draws per iteration: about 2^19 logits */
    N = N / E > 1024 ? N / E : 1024;
    float *z = malloc((size_t)N * (size_t)E * sizeof(float));
    double *b = calloc((size_t)E, sizeof(double)), *avg = calloc((size_t)E, sizeof(double));
    long *picked = malloc((size_t)E * sizeof(long));
    int *top = malloc((size_t)k * sizeof(int));
    double *topv = malloc((size_t)k * sizeof(double));
    if (!z || !b || !avg || !picked || !top || !topv) {
        free(z), free(b), free(avg), free(picked), free(top), free(topv);
        return -1;
    }
    uint64_t rng = 0x70c1e5eedull;
    zig_t zig;
    s_zig_init(&zig);
    const double lo = 0.5 / N, hi = 1 - 0.5 / N;
    double worst = 0;
    int n_avg = 0;
    for (int it = 0; it < FIT_ITERS; it++) {
        /* Fresh draws every iteration, so the sampling noise averages out instead of being fitted. */
        for (size_t i = 0; i < (size_t)N * E; i++)
            z[i] = (float)s_normal(&zig, &rng);
        memset(picked, 0, (size_t)E * sizeof(long));
        for (int n = 0; n < N; n++) {     /* top-k of z + b: a sorted insertion list of k */
            const float *zn = z + (size_t)n * E;
            int have = 0;
            for (int e = 0; e < E; e++) {
                const double v = zn[e] + b[e];
                if (have == k && v <= topv[k - 1])
                    continue;
                int at = have < k ? have++ : k - 1;
                while (at > 0 && topv[at - 1] < v) {
                    topv[at] = topv[at - 1];
                    top[at] = top[at - 1];
                    at--;
                }
                topv[at] = v;
                top[at] = e;
            }
            for (int j = 0; j < k; j++)
                picked[top[j]]++;
        }
        worst = 0;
        /* Newton in probit space (exact if the others' k-th logit were a fixed threshold), full
         * steps first, then half steps whose iterates are averaged (Polyak-Ruppert). */
        const double step = it < FIT_ITERS / 4 ? 1.0 : 0.5;
        for (int e = 0; e < E; e++) {
            const double want = k * share[e], got = (double)picked[e] / N;
            const double w = want < lo ? lo : want > hi ? hi : want, g = got < lo ? lo : got > hi ? hi : got;
            const double d = fabs(log(w / g));
            worst = d > worst ? d : worst;
            b[e] += step * (s_probit(w) - s_probit(g));
        }
        if (it >= FIT_ITERS / 3) {
            for (int e = 0; e < E; e++)
                avg[e] += b[e];
            n_avg++;
        }
    }
    double mean = 0;
    for (int e = 0; e < E; e++)
        mean += avg[e] / n_avg / E;
    for (int e = 0; e < E; e++)
        bias[e] = (float)(avg[e] / n_avg - mean);   /* top-k and softmax ignore a common shift */
    free(z), free(b), free(avg), free(picked), free(top), free(topv);
    return worst;
}

/* ---- at model load ------------------------------------------------------------------------ */

/* The spread of layer L's router logits for one token: sqrt(sum_i g_i^2 var_e(w_ei)), from the
 * router rows and the norm weight as placed. -1 with err when they cannot be read back. */
static double s_sigma(model_t *m, const model_layer_t *L, char *err, size_t errlen)
{
    const int E = m->cfg.num_experts, H = m->cfg.hidden_size;
    const dtype_t dt = L->router.dtype;
    const size_t es = dtype_size(dt);
    void *raw = malloc((size_t)E * H * es);
    float *w = malloc((size_t)E * H * sizeof(float)), *g = malloc((size_t)H * sizeof(float));
    double sigma = -1;
    if (!raw || !w || !g || L->router.qfmt) {
        errf(err, errlen, "%s: router skew: %s", m->where,
             L->router.qfmt ? "the router is quantized" : "out of memory");
    } else if (m->be->ops->download(m->be, raw, L->router.data, (size_t)E * H * es) < 0 ||
               m->be->ops->download(m->be, g, L->mlp_norm, (size_t)H * sizeof(float)) < 0) {
        errf(err, errlen, "%s: router skew: cannot read the router back from the %s backend", m->where,
             m->be->ops->name);
    } else {
        dtype_to_f32(dt, raw, w, (size_t)E * H);
        double s2 = 0;
        for (int i = 0; i < H; i++) {
            double mean = 0, var = 0;
            for (int e = 0; e < E; e++)
                mean += w[(size_t)e * H + i] / E;
            for (int e = 0; e < E; e++) {
                const double d = w[(size_t)e * H + i] - mean;
                var += d * d / E;
            }
            s2 += (double)g[i] * g[i] * var;
        }
        sigma = sqrt(s2);
    }
    free(raw), free(w), free(g);
    return sigma;
}

int model_router_skew_apply(model_t *m, ckpt_t *ck, char *err, size_t errlen)
{
    const char *spec = m->opts.router_skew;
    const model_config_t *c = &m->cfg;
    snprintf(m->router_skew, sizeof m->router_skew, "uniform-random");
    if (!spec || !*spec || !strcmp(spec, "uniform") || c->num_experts <= 0)
        return 0;
    if (!ckpt_is_dummy(ck))
        return errf(err, errlen, "%s: router skew '%s' is for dummy weights (load format dummy) only: a checkpoint's "
                    "routers route as they were trained", m->where, spec);
    if (c->mla.on)
        return errf(err, errlen, "%s: router skew '%s': DeepSeek's sigmoid group-limited routing is not covered "
                    "(softmax top-k routers only)", m->where, spec);
    if (m->opts.expert_keep)
        return errf(err, errlen, "%s: router skew '%s': not with an expert-parallel group (the fit on the model "
                    "needs every expert in one process)", m->where, spec);
    router_skew_t s;
    if (router_skew_parse(spec, &s, err, errlen) < 0)
        return -1;
    const int E = c->num_experts, k = c->num_experts_per_tok;
    int n_moe = 0;
    for (int l = 0; l < c->num_layers; l++)
        n_moe += m->layers[l].is_moe;
    double *share = malloc((size_t)E * sizeof(double)), *sorted = malloc((size_t)E * sizeof(double));
    double *fitted = malloc((size_t)E * sizeof(double));
    float *bias = malloc((size_t)E * sizeof(float)), *bias_sorted = malloc((size_t)E * sizeof(float));
    int *order = malloc((size_t)E * sizeof(int)), have_fit = 0, rc = 0, moe_i = 0;
    m->skew_share = calloc((size_t)c->num_layers * E, sizeof(double));
    m->skew_bias = calloc((size_t)c->num_layers * E, sizeof(float));
    if (!share || !sorted || !fitted || !bias || !bias_sorted || !order || !m->skew_share || !m->skew_bias)
        rc = errf(err, errlen, "%s: router skew: out of memory", m->where);
    for (int l = 0; rc == 0 && l < c->num_layers; l++) {
        model_layer_t *L = &m->layers[l];
        if (!L->is_moe)
            continue;
        if (router_skew_target(&s, moe_i++, n_moe, E, k, share, err, errlen) < 0) {
            rc = -1;
            break;
        }
        /* Fit the sorted shares (zipf: one fit for every layer), then deal the biases back. */
        for (int e = 0; e < E; e++)
            order[e] = e;
        for (int i = 1; i < E; i++)        /* insertion sort of the ids by share, descending */
            for (int j = i; j > 0 && share[order[j]] > share[order[j - 1]]; j--) {
                const int t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        for (int e = 0; e < E; e++)
            sorted[e] = share[order[e]];
        if (!have_fit || memcmp(sorted, fitted, (size_t)E * sizeof(double))) {
            const double left = router_skew_fit(sorted, E, k, bias_sorted);
            if (left < 0) {
                rc = errf(err, errlen, "%s: router skew: out of memory", m->where);
                break;
            }
            memcpy(fitted, sorted, (size_t)E * sizeof(double));
            have_fit = 1;
        }
        const double sigma = s_sigma(m, L, err, errlen);
        if (sigma < 0) {
            rc = -1;
            break;
        }
        for (int e = 0; e < E; e++)
            bias[order[e]] = (float)(sigma * bias_sorted[e]);
        L->skew_sigma = sigma;
        memcpy(m->skew_share + (size_t)l * E, share, (size_t)E * sizeof(double));
        memcpy(m->skew_bias + (size_t)l * E, bias, (size_t)E * sizeof(float));
        if (!(L->router_bias = model_alloc(m, (size_t)E * sizeof(float), "router skew bias", err, errlen)) ||
            m->be->ops->upload(m->be, L->router_bias, bias, (size_t)E * sizeof(float)) < 0) {
            rc = L->router_bias ? errf(err, errlen, "%s: router skew: cannot upload the bias", m->where) : -1;
            break;
        }
        L->skew_target = router_skew_busiest_over_avg(share, E);
    }
    if (rc == 0)
        snprintf(m->router_skew, sizeof m->router_skew, "%s", s.name);
    free(share), free(sorted), free(fitted), free(bias), free(bias_sorted), free(order);
    router_skew_free(&s);
    return rc;
}

/* ---- on the model itself ------------------------------------------------------------------ */

/* Random-token prompts share a hidden-state component (the attention over random contexts tends to
 * one mean vector, which dummy weights do not make small), and each router row's product with it
 * is a fixed bias of its own: random routers are not uniform, and the load-time fit, which assumes
 * centred logits, lands off target by that much. So the bias is refined on the model: rounds of
 * prefills of random tokens, counted by the MoE counters, each moving every expert's bias by the
 * probit gap between its target and measured pick rates (in units of the layer's sigma, the step
 * halved when the gap changes sign), the last iterates averaged. The counters are
 * cleared after. */
#define CAL_ROUNDS 12
#define CAL_AVG_FROM 9            /* the first round whose iterate is averaged (the last 3) */
#define CAL_PAIRS_PER_EXPERT 512  /* routed (token, expert) pairs per expert and round, on average */
#define CAL_SEQ_LEN 32            /* tokens per prompt: short, so that many prompts' own shared parts average out */

int model_router_skew_calibrate(model_t *m, kvpool_t *pool, char *err, size_t errlen)
{
    const model_config_t *c = &m->cfg;
    if (!m->skew_share)
        return 0;
    const char *count = getenv("TROUPE_MOE_COUNT");
    if (!m->be->ops->moe_count || (count && !strcmp(count, "0")))
        return errf(err, errlen, "%s: router skew '%s' is fitted with the MoE load counters, which are off "
                    "(TROUPE_MOE_COUNT=0, or the %s backend does not count)", m->where, m->router_skew,
                    m->be->ops->name);
    const int E = c->num_experts, k = c->num_experts_per_tok, bs = kvpool_block_size(pool);
    int len = CAL_SEQ_LEN < m->opts.max_tokens ? CAL_SEQ_LEN : m->opts.max_tokens;
    const int free_blocks = kvpool_free_count(pool);
    if (len > free_blocks * bs)
        len = free_blocks * bs;
    int n_seq = m->opts.max_tokens / len;
    n_seq = n_seq < m->opts.max_seqs ? n_seq : m->opts.max_seqs;
    n_seq = n_seq < free_blocks / ((len + bs - 1) / bs) ? n_seq : free_blocks / ((len + bs - 1) / bs);
    n_seq = n_seq < 64 ? n_seq : 64;
    if (len < 1 || n_seq < 1)
        return errf(err, errlen, "%s: router skew: no room to fit it (a KV pool of %d free blocks)", m->where,
                    free_blocks);
    const long per_round = ((long)CAL_PAIRS_PER_EXPERT * E / k + (long)n_seq * len - 1) / ((long)n_seq * len);
    const size_t LE = (size_t)c->num_layers * E;
    uint64_t *cnt = calloc(LE, sizeof(uint64_t));
    double *b = malloc(LE * sizeof(double)), *avg = calloc(LE, sizeof(double));
    double *rate = malloc(LE * sizeof(double)), *last_gap = calloc(LE, sizeof(double));
    float *up = malloc((size_t)E * sizeof(float));
    int32_t *ids = malloc((size_t)len * sizeof(int32_t));
    kvseq_t **seqs = calloc((size_t)n_seq, sizeof(kvseq_t *));
    model_seq_t *ms = calloc((size_t)n_seq, sizeof(model_seq_t));
    float *logits = malloc((size_t)n_seq * c->vocab_size * sizeof(float));
    int rc = 0, n_avg = 0;
    if (!cnt || !b || !avg || !rate || !last_gap || !up || !ids || !seqs || !ms || !logits)
        rc = errf(err, errlen, "%s: router skew: out of memory", m->where);
    for (size_t i = 0; rc == 0 && i < LE; i++)
        b[i] = m->skew_bias[i], rate[i] = 1;
    uint64_t rng = 0xca11b4a7eull;
    if (rc == 0)
        rc = model_expert_load(m, cnt, err, errlen);   /* restarts the count */
    for (int round = 0; rc == 0 && round < CAL_ROUNDS; round++) {
        memset(cnt, 0, LE * sizeof(uint64_t));
        for (long f = 0; rc == 0 && f < per_round; f++) {
            for (int q = 0; q < n_seq; q++) {
                for (int i = 0; i < len; i++)
                    ids[i] = (int32_t)(s_next(&rng) % (uint64_t)c->vocab_size);
                if (!(seqs[q] = kvseq_new(pool, len, s_next(&rng))) || kvseq_append(seqs[q], ids, len) < 0) {
                    rc = errf(err, errlen, "%s: router skew: the KV pool cannot hold %d prompts of %d", m->where,
                              n_seq, len);
                    break;
                }
                ms[q] = (model_seq_t){.kv = seqs[q], .n_new = len};
            }
            model_batch_t batch = {.n_seqs = n_seq, .seqs = ms};
            if (rc == 0 && model_forward(m, &batch, logits, err, errlen) < 0)
                rc = -1;
            for (int q = 0; q < n_seq; q++)
                kvseq_destroy(&seqs[q]);
        }
        if (rc == 0)
            rc = model_expert_load(m, cnt, err, errlen);
        const double tokens = (double)per_round * n_seq * len, lo = 0.5 / tokens, hi = 1 - 0.5 / tokens;
        for (int l = 0; rc == 0 && l < c->num_layers; l++) {
            model_layer_t *L = &m->layers[l];
            if (!L->router_bias)
                continue;
            double mx = 0;
            for (int e = 0; e < E; e++) {
                const size_t i = (size_t)l * E + e;
                const double want = k * m->skew_share[i], got = (double)cnt[i] / tokens;
                const double w = want < lo ? lo : want > hi ? hi : want, g = got < lo ? lo : got > hi ? hi : got;
                const double gap = s_probit(w) - s_probit(g);
                /* sigma counts the logits' spread over all of the hidden state, but a part of it is
                 * shared by every token (the reason for this refinement) and moves no choice: the
                 * real spread is smaller and a full step can overshoot. An expert whose gap changes
                 * sign halves its step (Rprop-like); one that keeps it grows it back. */
                if (round > 0)
                    rate[i] = gap * last_gap[i] < 0 ? rate[i] / 2 : rate[i] * 1.2 < 1 ? rate[i] * 1.2 : 1;
                last_gap[i] = gap;
                b[i] += rate[i] * L->skew_sigma * gap;
                mx = got > mx ? got : mx;
                if (round >= CAL_AVG_FROM)
                    avg[i] += b[i];
                up[e] = (float)b[i];
            }
            L->skew_measured = mx / k * E;   /* this round's busiest/average, before its update */
            if (m->be->ops->upload(m->be, L->router_bias, up, (size_t)E * sizeof(float)) < 0)
                rc = errf(err, errlen, "%s: router skew: cannot upload the bias", m->where);
        }
        n_avg += round >= CAL_AVG_FROM;
    }
    for (int l = 0; rc == 0 && l < c->num_layers; l++) {
        model_layer_t *L = &m->layers[l];
        if (!L->router_bias)
            continue;
        for (int e = 0; e < E; e++)
            up[e] = (float)(avg[(size_t)l * E + e] / n_avg);
        memcpy(m->skew_bias + (size_t)l * E, up, (size_t)E * sizeof(float));
        if (m->be->ops->upload(m->be, L->router_bias, up, (size_t)E * sizeof(float)) < 0)
            rc = errf(err, errlen, "%s: router skew: cannot upload the bias", m->where);
    }
    if (rc == 0)
        rc = model_expert_load(m, cnt, err, errlen);   /* the fit's tokens are nobody's load */
    m->skew_tokens = rc == 0 ? (long)CAL_ROUNDS * per_round * n_seq * len : 0;
    free(cnt), free(b), free(avg), free(rate), free(last_gap), free(up), free(ids), free(seqs), free(ms), free(logits);
    return rc;
}

long model_router_skew_fit_tokens(const model_t *m) { return m->skew_tokens; }

const char *model_router_skew(const model_t *m) { return m->router_skew; }

double model_router_skew_target(const model_t *m, int layer)
{
    return layer >= 0 && layer < m->cfg.num_layers ? m->layers[layer].skew_target : 0;
}
