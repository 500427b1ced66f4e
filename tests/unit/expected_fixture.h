/* tests/unit/expected_fixture.h — reads a transformers fixture's expected.json (prompts, greedy
 * continuations, last-position logits) for the model tests of every backend. Included by
 * tests/unit/test_model.c and tests/gpu/test_backend_cuda.c; needs jansson and cmocka. */
#ifndef TROUPE_EXPECTED_FIXTURE_H
#define TROUPE_EXPECTED_FIXTURE_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    int n;                        /* prompts */
    int32_t *ids[8];
    int n_ids[8];
    int32_t *greedy[8];
    int n_greedy[8];
    double *last[8];
    int vocab;
} expected_t;

static inline int32_t *s_int_array(json_t *a, int *n)
{
    *n = (int)json_array_size(a);
    int32_t *v = malloc((size_t)(*n ? *n : 1) * sizeof(int32_t));
    for (int i = 0; i < *n; i++)
        v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

static inline void s_load_expected(const char *path, expected_t *e)
{
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root)
        fail_msg("%s: %s (line %d)", path, je.text, je.line);
    json_t *prompts = json_object_get(root, "prompts");
    assert_true(json_is_array(prompts));
    e->n = (int)json_array_size(prompts);
    assert_true(e->n >= 1 && e->n <= 8);
    for (int i = 0; i < e->n; i++) {
        json_t *p = json_array_get(prompts, (size_t)i);
        e->ids[i] = s_int_array(json_object_get(p, "ids"), &e->n_ids[i]);
        e->greedy[i] = s_int_array(json_object_get(p, "greedy"), &e->n_greedy[i]);
        json_t *ll = json_object_get(p, "last_logits");
        e->vocab = (int)json_array_size(ll);
        e->last[i] = malloc((size_t)e->vocab * sizeof(double));
        for (int v = 0; v < e->vocab; v++)
            e->last[i][v] = json_number_value(json_array_get(ll, (size_t)v));
    }
    json_decref(root);
}

static inline void s_free_expected(expected_t *e)
{
    for (int i = 0; i < e->n; i++) {
        free(e->ids[i]);
        free(e->greedy[i]);
        free(e->last[i]);
    }
}

/* ||a - b|| / ||b||, with b the float64 reference; a NaN anywhere never passes. */
static inline double fixture_relerr(const float *a, const double *b, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(a[i]))
            return INFINITY;
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return sqrt(num / den);
}

/* Greedy choice as transformers makes it: the largest logit, the lowest index on ties. */
static inline int32_t fixture_argmax(const float *x, int n)
{
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

#endif
