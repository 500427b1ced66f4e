/* topology/diag.c — collecting a load's problems with their lines, and the public topo_errors_t. */
#include "topology/diag.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

void topo_errors_clear(topo_errors_t *e)
{
    if (e) {
        e->count = 0;
        e->dropped = 0;
    }
}

void topo_errors_print(const topo_errors_t *e, FILE *f)
{
    if (!e)
        return;
    for (int i = 0; i < e->count; i++)
        fprintf(f, "%s\n", e->msg[i]);
    if (e->dropped)
        fprintf(f, "... and %d more problem%s\n", e->dropped, e->dropped == 1 ? "" : "s");
}

int topo_errors_contain(const topo_errors_t *e, const char *needle)
{
    if (!e || !needle)
        return 0;
    for (int i = 0; i < e->count; i++)
        if (strstr(e->msg[i], needle))
            return 1;
    return 0;
}

void topo_diag_init(topo_diag_t *d, const char *file)
{
    memset(d, 0, sizeof *d);
    d->file = file ? file : "<topology>";
}

void topo_diag_fini(topo_diag_t *d)
{
    free(d->marks);
    free(d->problems);
    d->marks = NULL;
    d->problems = NULL;
    d->n_marks = d->cap_marks = d->n_problems = d->cap_problems = 0;
}

void topo_diag_mark(topo_diag_t *d, const char *path, int line)
{
    if (d->n_marks == d->cap_marks) {
        int cap = d->cap_marks ? d->cap_marks * 2 : 64;
        topo_mark_t *m = realloc(d->marks, (size_t)cap * sizeof *m);
        if (!m)
            return;                      /* only costs a line number in a message */
        d->marks = m;
        d->cap_marks = cap;
    }
    topo_mark_t *m = &d->marks[d->n_marks++];
    snprintf(m->path, sizeof m->path, "%s", path);
    m->line = line;
}

static int s_exact_line(const topo_diag_t *d, const char *path, size_t len)
{
    for (int i = 0; i < d->n_marks; i++)
        if (strlen(d->marks[i].path) == len && memcmp(d->marks[i].path, path, len) == 0)
            return d->marks[i].line;
    return 0;
}

int topo_diag_line(const topo_diag_t *d, const char *path)
{
    size_t len = strlen(path);
    while (len > 0) {
        int line = s_exact_line(d, path, len);
        if (line)
            return line;
        /* Drop the last component: ".key" or "[i]". */
        while (len > 0 && path[len - 1] != '.' && path[len - 1] != '[')
            len--;
        if (len > 0)
            len--;
    }
    return 0;
}

static void s_vadd(topo_diag_t *d, int line, const char *path, const char *fmt, va_list ap)
{
    if (d->n_problems >= TOPO_DIAG_PROBLEMS_MAX) {
        d->dropped++;
        return;
    }
    if (d->n_problems == d->cap_problems) {
        int cap = d->cap_problems ? d->cap_problems * 2 : 16;
        topo_problem_t *p = realloc(d->problems, (size_t)cap * sizeof *p);
        if (!p) {
            d->dropped++;
            return;
        }
        d->problems = p;
        d->cap_problems = cap;
    }
    topo_problem_t *p = &d->problems[d->n_problems++];
    p->line = line;
    int n;
    if (line > 0)
        n = snprintf(p->text, sizeof p->text, "%s:%d: ", d->file, line);
    else
        n = snprintf(p->text, sizeof p->text, "%s: ", d->file);
    if (n >= 0 && (size_t)n < sizeof p->text && path && path[0]) {
        int m = snprintf(p->text + n, sizeof p->text - (size_t)n, "%s: ", path);
        n = m < 0 ? n : n + m;
    }
    if (n >= 0 && (size_t)n < sizeof p->text)
        vsnprintf(p->text + n, sizeof p->text - (size_t)n, fmt, ap);
}

void topo_diag_err(topo_diag_t *d, const char *path, const char *fmt, ...)
{
    if (d->n_problems >= TOPO_DIAG_PROBLEMS_MAX) {
        d->dropped++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    /* A field that is nowhere in the file (a whole section left out) is reported on line 1,
     * so every message keeps the file:line: shape editors jump to. */
    int line = topo_diag_line(d, path ? path : "");
    s_vadd(d, line ? line : 1, path, fmt, ap);
    va_end(ap);
}

void topo_diag_err_at(topo_diag_t *d, int line, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    s_vadd(d, line, path, fmt, ap);
    va_end(ap);
}

void topo_diag_flush(topo_diag_t *d, topo_errors_t *errs)
{
    /* Insertion sort: stable, and a file has few problems. */
    for (int i = 1; i < d->n_problems; i++) {
        topo_problem_t tmp = d->problems[i];
        int j = i - 1;
        while (j >= 0 && d->problems[j].line > tmp.line) {
            d->problems[j + 1] = d->problems[j];
            j--;
        }
        d->problems[j + 1] = tmp;
    }
    if (!errs) {
        for (int i = 0; i < d->n_problems; i++)
            LOG_E("%s", d->problems[i].text);
        if (d->dropped)
            LOG_E("... and %d more problems", d->dropped);
        return;
    }
    for (int i = 0; i < d->n_problems; i++) {
        if (errs->count < TOPO_ERRORS_MAX)
            memcpy(errs->msg[errs->count++], d->problems[i].text, TOPO_ERROR_LEN);
        else
            errs->dropped++;
    }
    errs->dropped += d->dropped;
}
