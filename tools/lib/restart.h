/* tools/lib/restart.h — the supervisor's restart decisions, as pure functions (unit-tested).
 *
 * OTP semantics: a permanent child is always restarted, a transient one only after an abnormal
 * exit (non-zero status or a signal), a temporary one never. Restart intensity: at most
 * max_restarts restarts within period_ms; one more and the supervisor gives up and stops the
 * whole cluster with a report (a crash loop must not spin forever). */
#ifndef TROUPE_RESTART_H
#define TROUPE_RESTART_H

#include <stdint.h>

#include "topology/topology.h"

#define RESTART_WINDOW_MAX 10000

typedef struct restart_window {
    int max_restarts;               /* allowed within period_ms */
    int64_t period_ms;
    int64_t *times;                 /* [max_restarts + 1] ring of recent restart times */
    int head, n;
} restart_window_t;

int  restart_window_init(restart_window_t *w, int max_restarts, int64_t period_ms);
void restart_window_free(restart_window_t *w);
/* Records a restart at now_ms. Returns 1 if it is within the intensity limit, 0 if this restart
 * would be one too many (the caller gives up). */
int  restart_window_allow(restart_window_t *w, int64_t now_ms);

/* 1 if a child of this kind that exited with wait status `status` is to be restarted. */
int  restart_wanted(topo_restart_t kind, int status);

/* Which children restart with child `failed` (indices in start order, 0..n-1). Writes them to
 * out in start order and returns how many: one_for_one -> just `failed`; rest_for_one -> failed
 * and every child started after it. */
int  restart_affected(topo_strategy_t strategy, int failed, int n, int *out);

/* "exit 1", "killed by signal 9 (Killed)", "exit 0" — for reports. */
const char *restart_describe_status(int status, char *buf, int cap);

#endif
