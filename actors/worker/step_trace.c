/* actors/worker/step_trace.c — the decode worker's per-step trace (step_trace.h). */
#include "actors/worker/step_trace.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

/* 64 KiB: about 400 step lines between writes, so a busy worker pays a write() every few hundred
 * steps, not one per step. */
#define TRACE_BUF_BYTES (64 * 1024)

static long long s_us(int64_t ns) { return (long long)(ns / 1000); }

int step_trace_open(step_trace_t *t, const char *path, int max_rows, char *err, size_t errlen)
{
    *t = (step_trace_t){0};
    if (!path || !*path)
        return 0;
    /* "%p" -> our pid: one file per worker where several share the environment. */
    char name[4096];
    size_t o = 0;
    for (const char *p = path; *p && o + 24 < sizeof name; p++) {
        if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(name + o, sizeof name - o, "%ld", (long)getpid());
            p++;
        } else {
            name[o++] = *p;
        }
    }
    name[o] = 0;
    t->cap = max_rows > 0 ? max_rows : 1;
    t->chunk_id = malloc((size_t)t->cap * sizeof *t->chunk_id);
    t->chunk_n = malloc((size_t)t->cap * sizeof *t->chunk_n);
    if (!t->chunk_id || !t->chunk_n) {
        step_trace_close(t);
        return errf(err, errlen, "TROUPE_STEP_TRACE: out of memory");
    }
    if (!(t->f = fopen(name, "w"))) {
        int e = errno;
        step_trace_close(t);
        return errf(err, errlen, "TROUPE_STEP_TRACE=%s: %s", name, strerror(e));
    }
    setvbuf(t->f, NULL, _IOFBF, TRACE_BUF_BYTES);
    fprintf(t->f, "# troupe step trace v2 pid=%ld\n", (long)getpid());
    t->dirty = 1;
    return 0;
}

void step_trace_close(step_trace_t *t)
{
    if (t->f)
        fclose(t->f);
    free(t->chunk_id);
    free(t->chunk_n);
    *t = (step_trace_t){0};
}

void step_trace_arrive(step_trace_t *t, uint64_t id, int n_tokens, int handoff)
{
    if (!t->f)
        return;
    fprintf(t->f, "arrive t=%lld id=%llu ntok=%d src=%c\n", s_us(now_ns()), (unsigned long long)id, n_tokens,
            handoff ? 'h' : 'p');
    t->dirty = 1;
}

void step_trace_end(step_trace_t *t, uint64_t id)
{
    if (!t->f)
        return;
    fprintf(t->f, "end t=%lld id=%llu\n", s_us(now_ns()), (unsigned long long)id);
    t->dirty = 1;
}

void step_trace_chunk(step_trace_t *t, uint64_t id, int n_tokens)
{
    if (!t->f || t->n_chunks >= t->cap)
        return;
    t->chunk_id[t->n_chunks] = id;
    t->chunk_n[t->n_chunks++] = n_tokens;
}

void step_trace_step(step_trace_t *t, const step_trace_step_t *s)
{
    if (!t->f)
        return;
    fprintf(t->f, "step t=%lld gap=%lld sched=%lld fwd=%lld post=%lld dec=%d prm=%d ptok=%d rtok=%d wait=%d "
            "prompting=%d pre=%d holds=%d pos=%d graph=%c chunks=", s_us(s->begin_ns),
            t->last_end_ns ? s_us(s->begin_ns - t->last_end_ns) : -1LL, s_us(s->fwd_begin_ns - s->begin_ns),
            s_us(s->fwd_end_ns - s->fwd_begin_ns), s_us(s->end_ns - s->fwd_end_ns), s->dec, s->prm, s->ptok, s->rtok,
            s->waiting, s->prompting, s->preempted, t->holds, s->pos, s->graph ? s->graph : 'e');
    for (int i = 0; i < t->n_chunks; i++)
        fprintf(t->f, "%s%llu:%d", i ? "," : "", (unsigned long long)t->chunk_id[i], t->chunk_n[i]);
    fputs(t->n_chunks ? "\n" : "-\n", t->f);
    t->n_chunks = 0;
    t->holds = 0;
    t->last_end_ns = s->end_ns;
    t->dirty = 1;
}

void step_trace_begin(step_trace_t *t)
{
    if (t->f)
        t->cur = (step_trace_step_t){.begin_ns = now_ns()};
}

void step_trace_scheduled(step_trace_t *t, const sched_t *s)
{
    if (!t->f)
        return;
    t->cur.waiting = sched_count(s, SCHED_WAITING);
    t->cur.prompting = sched_count(s, SCHED_PROMPTING);
    t->cur.preempted = sched_count(s, SCHED_PREEMPTED);
}

void step_trace_forward(step_trace_t *t, const sched_batch_t *b, int64_t begin_ns, int64_t end_ns, int ptok, int rtok,
                        int pos, char graph)
{
    if (!t->f)
        return;
    t->cur.fwd_begin_ns = begin_ns;
    t->cur.fwd_end_ns = end_ns;
    t->cur.dec = b->n_decode;
    t->cur.prm = b->n - b->n_decode;
    t->cur.ptok = ptok;
    t->cur.rtok = rtok;
    t->cur.pos = pos;
    t->cur.graph = graph;
    for (int i = b->n_decode; i < b->n; i++)
        step_trace_chunk(t, b->rows[i].req->id, b->rows[i].n_new);
}

void step_trace_done(step_trace_t *t)
{
    if (!t->f)
        return;
    t->cur.end_ns = now_ns();
    step_trace_step(t, &t->cur);
}

void step_trace_idle(step_trace_t *t)
{
    if (!t->f || !t->dirty)
        return;
    fflush(t->f);
    t->dirty = 0;
}
