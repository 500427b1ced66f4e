/* topology/diag.h — internal: how the loader collects problems and finds their lines.
 *
 * Both passes (the libyaml pre-pass and the semantic checks in build.c) report into one
 * topo_diag_t. The pre-pass also records the line of every key and list entry under its field
 * path ("actors[2].role"), so a later check that only knows the path still reports a line: a
 * path that was never written (a default) takes the line of its nearest written parent. At the
 * end the problems are sorted by line and copied into the caller's topo_errors_t. */
#ifndef TROUPE_TOPOLOGY_DIAG_H
#define TROUPE_TOPOLOGY_DIAG_H

#include "topology/topology.h"

#define TOPO_FIELD_PATH_MAX 160
/* Problems kept before the rest are only counted: bounds the work a hostile file can cause
 * (each problem looks its line up among all the file's keys). */
#define TOPO_DIAG_PROBLEMS_MAX 1024

typedef struct topo_mark {
    char path[TOPO_FIELD_PATH_MAX];      /* "actors[2].gpus[0]" */
    int line;                            /* 1-based */
} topo_mark_t;

typedef struct topo_problem {
    int line;                            /* 0 = unknown (sorts first) */
    char text[TOPO_ERROR_LEN];
} topo_problem_t;

typedef struct topo_diag {
    const char *file;                    /* name used in messages */
    topo_mark_t *marks;                  /* [n_marks] */
    int n_marks, cap_marks;
    topo_problem_t *problems;            /* [n_problems] */
    int n_problems, cap_problems;
    int dropped;                         /* problems beyond TOPO_DIAG_PROBLEMS_MAX or lost to allocation failure */
} topo_diag_t;

void topo_diag_init(topo_diag_t *d, const char *file);
void topo_diag_fini(topo_diag_t *d);
void topo_diag_mark(topo_diag_t *d, const char *path, int line);
/* Line of path, else of its nearest recorded parent ("a.b[3].c" -> "a.b[3]" -> "a.b" -> "a"), else 0. */
int  topo_diag_line(const topo_diag_t *d, const char *path);
/* "file:line: path: message" with the line looked up from path (path may be ""). */
void topo_diag_err(topo_diag_t *d, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The same with an explicit line. */
void topo_diag_err_at(topo_diag_t *d, int line, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Sorts by line (stable) and copies into errs (which may be NULL: then logged). */
void topo_diag_flush(topo_diag_t *d, topo_errors_t *errs);

/* The libyaml pre-pass: checks the document's shape against raw_schema and records the line
 * of every key. Returns the number of problems it added (0 = libcyaml may load it). */
int topo_prepass(topo_diag_t *d, const unsigned char *buf, size_t len);

#endif
