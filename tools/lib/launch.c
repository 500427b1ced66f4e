/* tools/lib/launch.c — building the argv that starts one instance (see launch.h for the shapes).
 *
 * Hazard: an ssh command is run by the remote user's login shell, so everything in it that came
 * from a file (paths, names) is single-quoted; nothing is ever pasted in unquoted. srun and
 * local launches exec directly (no shell), so their arguments need no quoting at all. The
 * remote login shell is assumed to be POSIX (sh, bash, dash, zsh); csh/fish quote differently. */
#include "tools/lib/launch.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"

typedef struct {
    char **v;                            /* [n + 1], NULL-terminated */
    int n, cap;
    int oom;                             /* an allocation failed: the whole build fails */
} s_argv_t;

static void s_push_owned(s_argv_t *a, char *s)
{
    if (!s || a->oom) {
        a->oom = 1;
        free(s);
        return;
    }
    if (a->n + 2 > a->cap) {
        int cap = a->cap ? a->cap * 2 : 16;
        char **v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) {
            a->oom = 1;
            free(s);
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

static void s_push(s_argv_t *a, const char *s) { s_push_owned(a, s ? strdup(s) : NULL); }

static char *s_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *s_fmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

void launch_free_argv(char ***argv_p)
{
    if (!argv_p || !*argv_p)
        return;
    for (char **p = *argv_p; *p; p++)
        free(*p);
    free(*argv_p);
    *argv_p = NULL;
}

char *launch_shell_quote(const char *s)
{
    size_t n = 2;
    for (const char *p = s; *p; p++)
        n += *p == '\'' ? 4 : 1;
    char *out = malloc(n + 1), *o = out;
    if (!out)
        return NULL;
    *o++ = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {                /* close, escaped quote, reopen */
            memcpy(o, "'\\''", 4);
            o += 4;
        } else {
            *o++ = *p;
        }
    }
    *o++ = '\'';
    *o = '\0';
    return out;
}

int launch_split_words(const char *tpl, char ***words_out, char *err, size_t errlen)
{
    *words_out = NULL;
    s_argv_t a = { 0 };
    size_t cap = strlen(tpl) + 1;
    char *word = malloc(cap);
    if (!word)
        return errf(err, errlen, "out of memory");
    const char *p = tpl;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n')
            p++;
        if (!*p)
            break;
        size_t w = 0;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n') {
            if (*p == '\'') {
                const char *close = strchr(p + 1, '\'');
                if (!close) {
                    free(word);
                    launch_free_argv(&a.v);
                    return errf(err, errlen, "unterminated ' in command template \"%s\"", tpl);
                }
                memcpy(word + w, p + 1, (size_t)(close - p - 1));
                w += (size_t)(close - p - 1);
                p = close + 1;
            } else if (*p == '"') {
                p++;
                while (*p && *p != '"') {
                    if (*p == '\\' && p[1] && strchr("\"\\$`", p[1]))
                        p++;
                    word[w++] = *p++;
                }
                if (*p != '"') {
                    free(word);
                    launch_free_argv(&a.v);
                    return errf(err, errlen, "unterminated \" in command template \"%s\"", tpl);
                }
                p++;
            } else if (*p == '\\' && p[1]) {
                word[w++] = p[1];
                p += 2;
            } else {
                word[w++] = *p++;
            }
        }
        word[w] = '\0';
        s_push(&a, word);
    }
    free(word);
    if (a.oom) {
        launch_free_argv(&a.v);
        return errf(err, errlen, "out of memory");
    }
    if (!a.v) {                          /* no words: an empty, NULL-terminated list */
        a.v = calloc(1, sizeof *a.v);
        if (!a.v)
            return errf(err, errlen, "out of memory");
    }
    *words_out = a.v;
    return a.n;
}

/* path joined to the current directory unless absolute (no symlink resolution: the remote
 * node has the same paths, not necessarily the same links). */
static char *s_abs(const char *path)
{
    if (path[0] == '/')
        return strdup(path);
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd))
        return NULL;
    while (path[0] == '.' && path[1] == '/')
        path += 2;
    if (strcmp(path, ".") == 0 || !path[0])
        return strdup(cwd);
    return s_fmt("%s%s%s", cwd, strcmp(cwd, "/") == 0 ? "" : "/", path);
}

/* Replaces every {address} and {node} in word. */
static char *s_substitute(const char *word, const topo_node_t *node)
{
    size_t cap = strlen(word) + 1;
    for (const char *p = word; (p = strchr(p, '{')); p++)
        cap += strlen(node->address) + strlen(node->name);
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    for (const char *p = word; *p;) {
        if (strncmp(p, "{address}", 9) == 0) {
            o = stpcpy(o, node->address);
            p += 9;
        } else if (strncmp(p, "{node}", 6) == 0) {
            o = stpcpy(o, node->name);
            p += 6;
        } else {
            *o++ = *p++;
        }
    }
    *o = '\0';
    return out;
}

int launch_build_argv(const topo_t *t, const topo_instance_t *inst, const char *bin_dir,
                      const char *topology_path, char ***argv_out, char *err, size_t errlen)
{
    *argv_out = NULL;
    if (!t || !inst || inst->node < 0 || inst->node >= t->n_nodes)
        return errf(err, errlen, "launch: no such instance or node");
    if (!bin_dir || !bin_dir[0])
        return errf(err, errlen, "launch %s: no binary directory given", inst->name);
    const topo_node_t *node = &t->nodes[inst->node];
    char *dir = s_abs(bin_dir);
    char *topo = topology_path ? s_abs(topology_path) : NULL;
    char *bin = dir ? s_fmt("%s/troupe-%s", strcmp(dir, "/") == 0 ? "" : dir, topo_role_name(inst->role))
                    : NULL;
    char cwd[4096];
    const char *workdir = node->workdir[0] ? node->workdir : getcwd(cwd, sizeof cwd);
    s_argv_t a = { 0 };
    int rc = 0;
    if (!dir || !bin || (topology_path && !topo) || !workdir) {
        rc = errf(err, errlen, "launch %s: cannot build absolute paths: %s", inst->name,
                  strerror(errno ? errno : ENOMEM));
        goto done;
    }
    switch (node->launch) {
    case TOPO_LAUNCH_LOCAL:
        s_push(&a, bin);
        if (topo) {
            s_push(&a, "--topology");
            s_push(&a, topo);
        }
        s_push(&a, "--name");
        s_push(&a, inst->name);
        break;

    case TOPO_LAUNCH_SSH: {
        char **words = NULL;
        int nw = launch_split_words(node->ssh, &words, err, errlen);
        if (nw < 0) {
            rc = -1;
            goto done;
        }
        if (nw == 0) {
            launch_free_argv(&words);
            rc = errf(err, errlen, "launch %s: node '%s' has an empty ssh template", inst->name, node->name);
            goto done;
        }
        for (int i = 0; i < nw; i++)
            s_push_owned(&a, s_substitute(words[i], node));
        launch_free_argv(&words);
        s_push(&a, "--");
        char *qw = launch_shell_quote(workdir), *qb = launch_shell_quote(bin);
        char *qt = topo ? launch_shell_quote(topo) : strdup("");
        char *qn = launch_shell_quote(inst->name);
        if (qw && qb && qt && qn)
            s_push_owned(&a, s_fmt("cd %s && exec %s%s%s --name %s", qw, qb, topo ? " --topology " : "",
                                   qt, qn));
        else
            a.oom = 1;
        free(qw);
        free(qb);
        free(qt);
        free(qn);
        break;
    }

    case TOPO_LAUNCH_SRUN:
        s_push(&a, "srun");
        s_push(&a, "--nodes=1");
        s_push(&a, "--ntasks=1");
        s_push(&a, "--overlap");         /* concurrent steps share the allocation's resources */
        s_push_owned(&a, s_fmt("--nodelist=%s", node->name));
        s_push_owned(&a, s_fmt("--job-name=troupe-%s", inst->name));
        s_push_owned(&a, s_fmt("--chdir=%s", workdir));
        s_push(&a, bin);
        if (topo) {
            s_push(&a, "--topology");
            s_push(&a, topo);
        }
        s_push(&a, "--name");
        s_push(&a, inst->name);
        break;

    default:
        rc = errf(err, errlen, "launch %s: node '%s' has an unknown launch method %d", inst->name,
                  node->name, (int)node->launch);
        goto done;
    }
    if (a.oom)
        rc = errf(err, errlen, "launch %s: out of memory", inst->name);

done:
    if (rc == 0)
        *argv_out = a.v;
    else
        launch_free_argv(&a.v);
    free(dir);
    free(topo);
    free(bin);
    return rc;
}
