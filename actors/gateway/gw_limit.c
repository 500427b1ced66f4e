#include "actors/gateway/gw_limit.h"

#include <math.h>

void gw_bucket_init(gw_bucket_t *b, int per_minute, int64_t now_ms)
{
    b->cap = per_minute > 0 ? per_minute : 0;
    b->level = b->cap;
    b->rate = b->cap / 60000.0;
    b->t_ms = now_ms;
}

static void s_refill(gw_bucket_t *b, int64_t now_ms)
{
    if (now_ms > b->t_ms) {
        b->level += (double)(now_ms - b->t_ms) * b->rate;
        if (b->level > b->cap)
            b->level = b->cap;
    }
    b->t_ms = now_ms > b->t_ms ? now_ms : b->t_ms;
}

/* Seconds until the level reaches `need`, rounded up, at least 1. */
static int s_wait_s(const gw_bucket_t *b, double need)
{
    double ms = (need - b->level) / b->rate;
    double s = ceil(ms / 1000.0);
    return s < 1 ? 1 : s > 86400 ? 86400 : (int)s;
}

int gw_bucket_take(gw_bucket_t *b, double cost, int64_t now_ms, int *retry_after_s)
{
    if (b->cap == 0)
        return 0;
    s_refill(b, now_ms);
    if (b->level >= cost) {
        b->level -= cost;
        return 0;
    }
    *retry_after_s = s_wait_s(b, cost);
    return -1;
}

int gw_bucket_check(gw_bucket_t *b, int64_t now_ms, int *retry_after_s)
{
    if (b->cap == 0)
        return 0;
    s_refill(b, now_ms);
    if (b->level > 0)
        return 0;
    /* Strictly above zero: a hair more than the debt. */
    *retry_after_s = s_wait_s(b, 1e-6);
    return -1;
}

void gw_bucket_debit(gw_bucket_t *b, double cost, int64_t now_ms)
{
    if (b->cap == 0)
        return;
    s_refill(b, now_ms);
    b->level -= cost;
}
