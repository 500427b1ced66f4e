#include "tools/lib/restart.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

int restart_window_init(restart_window_t *w, int max_restarts, int64_t period_ms)
{
    memset(w, 0, sizeof *w);
    if (max_restarts < 0 || max_restarts > RESTART_WINDOW_MAX || period_ms <= 0)
        return -1;
    w->max_restarts = max_restarts;
    w->period_ms = period_ms;
    w->times = calloc((size_t)max_restarts + 1, sizeof *w->times);
    return w->times ? 0 : -1;
}

void restart_window_free(restart_window_t *w)
{
    free(w->times);
    w->times = NULL;
}

int restart_window_allow(restart_window_t *w, int64_t now_ms)
{
    int cap = w->max_restarts + 1;
    /* Forget restarts that left the window. */
    while (w->n > 0 && now_ms - w->times[w->head] >= w->period_ms) {
        w->head = (w->head + 1) % cap;
        w->n--;
    }
    if (w->n >= w->max_restarts)
        return 0;
    w->times[(w->head + w->n) % cap] = now_ms;
    w->n++;
    return 1;
}

int restart_wanted(topo_restart_t kind, int status)
{
    switch (kind) {
    case TOPO_RESTART_PERMANENT: return 1;
    case TOPO_RESTART_TRANSIENT: return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    default: return 0;
    }
}

int restart_affected(topo_strategy_t strategy, int failed, int n, int *out)
{
    if (failed < 0 || failed >= n)
        return 0;
    if (strategy == TOPO_STRATEGY_REST_FOR_ONE) {
        for (int i = failed; i < n; i++)
            out[i - failed] = i;
        return n - failed;
    }
    out[0] = failed;
    return 1;
}

const char *restart_describe_status(int status, char *buf, int cap)
{
    if (WIFEXITED(status))
        snprintf(buf, (size_t)cap, "exit %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, (size_t)cap, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(buf, (size_t)cap, "status 0x%x", status);
    return buf;
}
