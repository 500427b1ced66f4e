/* actors/gateway/gw_limit.h — per-key rate limits: token buckets that refill continuously.
 *
 * A bucket holds up to `per_minute` units and refills at per_minute / 60 s. Requests take one
 * unit up front (gw_bucket_take). Tokens are not known until a request ends (the router counts
 * them), so a request is admitted while the token bucket is positive (gw_bucket_check) and its
 * prompt + completion tokens are debited when it ends (gw_bucket_debit), which may drive the
 * level below zero: the key then waits until the refill brings it back above zero. Times are
 * passed in (monotonic ms) so the arithmetic is testable without clocks. */
#ifndef TROUPE_GW_LIMIT_H
#define TROUPE_GW_LIMIT_H

#include <stdint.h>

typedef struct gw_bucket {
    double level;                /* units available now (negative: in debt) */
    double cap;                  /* per_minute; 0 = unlimited */
    double rate;                 /* units per ms */
    int64_t t_ms;                /* when level was last brought up to date */
} gw_bucket_t;

/* per_minute 0: unlimited (every call succeeds). */
void gw_bucket_init(gw_bucket_t *b, int per_minute, int64_t now_ms);
/* Takes `cost` units if they are there: 0. Else -1 and *retry_after_s (whole seconds, >= 1)
 * until they will be. */
int gw_bucket_take(gw_bucket_t *b, double cost, int64_t now_ms, int *retry_after_s);
/* 0 while the level is above zero; else -1 and *retry_after_s until it is. */
int gw_bucket_check(gw_bucket_t *b, int64_t now_ms, int *retry_after_s);
/* Removes cost units, going into debt if needed. */
void gw_bucket_debit(gw_bucket_t *b, double cost, int64_t now_ms);

#endif
