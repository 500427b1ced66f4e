/* engine/router_skew.h — realistic routing for dummy MoE weights: a bias on each MoE layer's router
 * logits so that expert choice follows a named load distribution instead of whatever random routers
 * happen to favour (docs/experts.md, "Routing skew for dummy weights").
 *
 * A spec is one of
 *     uniform            no bias: random routers as they come, which are not even either
 *                        (docs/experts.md)
 *     zipf:S             the expert of rank r (1-based) takes a share proportional to r^-S, S in [0, 8];
 *                        zipf:0 is an even load, fitted: it cancels random routers' own skew
 *     table:FILE         per-layer tokens per expert as troupe-expert-load prints them
 *                        ("layer L tokens c0 c1 ..."; other lines are ignored)
 * mapped onto the model's experts: a table of as many experts as the model is used as measured (each
 * expert keeps its id), else its sorted shares are stretched onto the model's expert count (the
 * cumulative share curve resampled, which keeps the busiest/average ratio) and, like zipf's ranks,
 * dealt to experts by a fixed per-layer shuffle, so the hot expert differs from layer to layer as it
 * does in trained models. Table layers are stretched over the model's MoE layers in order.
 *
 * An expert cannot be picked by more than every token: a share above 1/k (top-k) is capped just
 * under it and the rest spread over the others in proportion; the target is the capped distribution.
 *
 * The bias. With random router rows w_e, a token's logits z_e = w_e . x are, given x, independent
 * across experts and close to normal with one spread sigma = sqrt(sum_i g_i^2 var_e(w_ei)) (x is
 * the RMS-normed hidden state times the norm weight g, so sum_i x_i^2 / g_i^2 is about H). The bias
 * b_e (in units of sigma) is fitted so that top-k of N(0, 1) + b picks expert e with probability
 * k * share_e: Newton steps in probit space, each on fresh draws, the later iterates averaged
 * (deterministic: the same spec gives the same bias). The bias is added to the router logits (the
 * router matmul's bias), so the softmax routing weights move with it too: for dummy weights that
 * only changes numbers nobody reads. The load-time fit is then refined on
 * the model itself (model_router_skew_calibrate, engine/router_skew.c says why). */
#ifndef TROUPE_ENGINE_ROUTER_SKEW_H
#define TROUPE_ENGINE_ROUTER_SKEW_H

#include <stddef.h>

#define ROUTER_SKEW_MAX_EXPERTS 1024
#define ROUTER_SKEW_MAX_LAYERS 256    /* table layers */

typedef enum { ROUTER_SKEW_UNIFORM = 0, ROUTER_SKEW_ZIPF, ROUTER_SKEW_TABLE } router_skew_kind_t;

typedef struct router_skew {
    router_skew_kind_t kind;
    double exponent;              /* zipf */
    int n_layers, n_experts;      /* table: layers and experts per layer */
    double *table;                /* table: [n_layers][n_experts] tokens per expert (owned) */
    char name[160];               /* the spec as given: printed by troupe-bench-engine */
} router_skew_t;

/* Parses spec (NULL or "" is uniform); table files are read here. 0, or -1 with err naming the spec
 * (and the file and line of a bad table). */
int router_skew_parse(const char *spec, router_skew_t *out, char *err, size_t errlen);
void router_skew_free(router_skew_t *s);

/* The target share of each of the model's E experts (summing to 1) for MoE layer moe_index of n_moe,
 * top-k routing: mapped and capped as the header says. 0, or -1 with err. */
int router_skew_target(const router_skew_t *s, int moe_index, int n_moe, int E, int k, double *share, char *err,
                       size_t errlen);

/* The bias, in units of the logits' spread, under which top-k of independent N(0, 1) logits picks
 * expert e with probability k * share[e]. Returns the largest |log(target / picked)| left (the
 * last iteration's error on its own draws: 0.05 is 5%), or -1 when out of memory. */
double router_skew_fit(const double *share, int E, int k, float *bias);

/* The busiest expert's share over the average's: E * max share. */
double router_skew_busiest_over_avg(const double *share, int E);

#endif
