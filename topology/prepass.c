/* topology/prepass.c — a libyaml walk over the topology file before libcyaml loads it.
 *
 * Duties: report YAML syntax errors with their line; check the document's shape against
 * raw_schema (the same tables libcyaml loads with) and report EVERY unknown key, duplicate key,
 * missing required key, wrong kind of value (a list where one value belongs, ...) and list
 * length out of bounds, each with its line; record the line of every key and list entry for the
 * semantic checks that follow. libcyaml alone would stop at the first such problem.
 *
 * Recursion follows the schema (at most four levels deep); subtrees that do not match the
 * schema are skipped iteratively, so a hostile file cannot make this recurse deeply. */
#include "topology/diag.h"
#include "topology/raw.h"

#include <string.h>
#include <yaml.h>

typedef struct {
    yaml_parser_t parser;
    topo_diag_t *d;
    int problems;                        /* problems this pass added */
    int fatal;                           /* a syntax error: stop walking */
} s_pass_t;

static int s_line(const yaml_event_t *ev) { return (int)ev->start_mark.line + 1; }

static void s_problem(s_pass_t *p, int line, const char *path, const char *what, const char *arg)
{
    topo_diag_err_at(p->d, line, path, what, arg);
    p->problems++;
}

/* Next event; on a parser error reports it (once) and returns -1. */
static int s_next(s_pass_t *p, yaml_event_t *ev)
{
    if (p->fatal)
        return -1;
    if (!yaml_parser_parse(&p->parser, ev)) {
        const char *prob = p->parser.problem ? p->parser.problem : "malformed YAML";
        int line = (int)p->parser.problem_mark.line + 1;
        if (p->parser.context)
            topo_diag_err_at(p->d, line, "", "YAML syntax error: %s (%s started on line %d)", prob,
                             p->parser.context, (int)p->parser.context_mark.line + 1);
        else
            topo_diag_err_at(p->d, line, "", "YAML syntax error: %s", prob);
        p->problems++;
        p->fatal = 1;
        return -1;
    }
    return 0;
}

/* Consumes the rest of the value whose first event is ev (already read, deleted here).
 * libyaml's scanner costs O(depth) per token, so "[[[[..." a megabyte deep would take minutes:
 * nesting beyond SKIP_DEPTH_MAX (no topology comes close) stops the pass. */
#define SKIP_DEPTH_MAX 64
static int s_skip(s_pass_t *p, yaml_event_t *ev)
{
    int depth = 0;
    for (;;) {
        yaml_event_type_t t = ev->type;
        int line = s_line(ev);
        yaml_event_delete(ev);
        if (t == YAML_MAPPING_START_EVENT || t == YAML_SEQUENCE_START_EVENT)
            depth++;
        else if (t == YAML_MAPPING_END_EVENT || t == YAML_SEQUENCE_END_EVENT)
            depth--;
        if (depth > SKIP_DEPTH_MAX) {
            s_problem(p, line, "", "%s", "nesting deeper than 64 levels: not a topology");
            p->fatal = 1;
            return -1;
        }
        if (depth <= 0)
            return 0;
        if (s_next(p, ev) < 0)
            return -1;
    }
}

static const char *s_kind(yaml_event_type_t t)
{
    switch (t) {
    case YAML_MAPPING_START_EVENT: return "a mapping (keys)";
    case YAML_SEQUENCE_START_EVENT: return "a list";
    case YAML_ALIAS_EVENT: return "an alias";
    default: return "a single value";
    }
}

static const char *s_wanted(const cyaml_schema_value_t *s)
{
    switch (s->type) {
    case CYAML_MAPPING: return "a mapping (indented keys)";
    case CYAML_SEQUENCE: return "a list";
    default: return "a single value";
    }
}

static void s_join(char *out, size_t n, const char *path, const char *key)
{
    if (path[0])
        snprintf(out, n, "%s.%s", path, key);
    else
        snprintf(out, n, "%s", key);
}

static int s_value(s_pass_t *p, const cyaml_schema_value_t *s, const char *path, yaml_event_t *ev);

static int s_mapping(s_pass_t *p, const cyaml_schema_value_t *s, const char *path, int line)
{
    const cyaml_schema_field_t *fields = s->mapping.fields;
    unsigned long long seen = 0;         /* one bit per schema field; our mappings have < 64 */
    char expected[TOPO_ERROR_LEN / 2] = "";
    size_t used = 0;
    for (int i = 0; fields[i].key; i++) {
        int n = snprintf(expected + used, sizeof expected - used, "%s%s", i ? ", " : "", fields[i].key);
        if (n > 0 && (size_t)n < sizeof expected - used)
            used += (size_t)n;
    }
    for (;;) {
        yaml_event_t key;
        if (s_next(p, &key) < 0)
            return -1;
        if (key.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&key);
            break;
        }
        int kline = s_line(&key);
        if (key.type != YAML_SCALAR_EVENT) {
            s_problem(p, kline, path, "keys must be plain names, found %s", s_kind(key.type));
            if (s_skip(p, &key) < 0)
                return -1;
            yaml_event_t val;
            if (s_next(p, &val) < 0 || s_skip(p, &val) < 0)
                return -1;
            continue;
        }
        char name[96];
        snprintf(name, sizeof name, "%.*s", (int)(key.data.scalar.length < 95 ? key.data.scalar.length : 95),
                 (const char *)key.data.scalar.value);
        yaml_event_delete(&key);
        char child[TOPO_FIELD_PATH_MAX];
        s_join(child, sizeof child, path, name);
        int f = -1;
        for (int i = 0; fields[i].key; i++)
            if (strcmp(fields[i].key, name) == 0)
                f = i;
        yaml_event_t val;
        if (s_next(p, &val) < 0)
            return -1;
        if (f < 0) {
            char msg[TOPO_ERROR_LEN];
            snprintf(msg, sizeof msg, "unknown field '%s' (expected one of %s)", name, expected);
            s_problem(p, kline, path[0] ? path : "", "%s", msg);
            if (s_skip(p, &val) < 0)
                return -1;
            continue;
        }
        if (seen & (1ULL << f)) {
            s_problem(p, kline, child, "%s", "given twice");
            if (s_skip(p, &val) < 0)
                return -1;
            continue;
        }
        seen |= 1ULL << f;
        topo_diag_mark(p->d, child, kline);
        if (s_value(p, &fields[f].value, child, &val) < 0)
            return -1;
    }
    for (int i = 0; fields[i].key; i++) {
        if ((fields[i].value.flags & CYAML_FLAG_OPTIONAL) || (seen & (1ULL << i)))
            continue;
        char child[TOPO_FIELD_PATH_MAX];
        s_join(child, sizeof child, path, fields[i].key);
        s_problem(p, line, child, "%s", "missing (required)");
    }
    return 0;
}

static int s_sequence(s_pass_t *p, const cyaml_schema_value_t *s, const char *path, int line)
{
    unsigned n = 0;
    for (;;) {
        yaml_event_t ev;
        if (s_next(p, &ev) < 0)
            return -1;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        char child[TOPO_FIELD_PATH_MAX];
        snprintf(child, sizeof child, "%s[%u]", path, n);
        if (n >= s->sequence.max) {
            if (n == s->sequence.max) {
                char msg[96];
                snprintf(msg, sizeof msg, "too many entries (at most %u)", s->sequence.max);
                s_problem(p, s_line(&ev), path, "%s", msg);
            }
            if (s_skip(p, &ev) < 0)
                return -1;
        } else {
            topo_diag_mark(p->d, child, s_line(&ev));
            if (s_value(p, s->sequence.entry, child, &ev) < 0)
                return -1;
        }
        n++;
    }
    if (n < s->sequence.min) {
        char msg[96];
        snprintf(msg, sizeof msg, "needs at least %u entr%s", s->sequence.min,
                 s->sequence.min == 1 ? "y" : "ies");
        s_problem(p, line, path, "%s", msg);
    }
    return 0;
}

/* Checks one value against its schema; ev is its first event (consumed). */
static int s_value(s_pass_t *p, const cyaml_schema_value_t *s, const char *path, yaml_event_t *ev)
{
    int line = s_line(ev);
    yaml_event_type_t t = ev->type;
    if (t == YAML_ALIAS_EVENT) {
        s_problem(p, line, path, "%s", "YAML aliases (*name) are not supported: write the value out");
        yaml_event_delete(ev);
        return 0;
    }
    int want = s->type == CYAML_MAPPING ? YAML_MAPPING_START_EVENT
             : s->type == CYAML_SEQUENCE ? YAML_SEQUENCE_START_EVENT : YAML_SCALAR_EVENT;
    if ((int)t != want) {
        char msg[160];
        if (t == YAML_SCALAR_EVENT && ev->data.scalar.length == 0)
            snprintf(msg, sizeof msg, "expected %s, found an empty value", s_wanted(s));
        else
            snprintf(msg, sizeof msg, "expected %s, found %s", s_wanted(s), s_kind(t));
        s_problem(p, line, path, "%s", msg);
        return s_skip(p, ev);
    }
    yaml_event_delete(ev);
    if (t == YAML_MAPPING_START_EVENT)
        return s_mapping(p, s, path, line);
    if (t == YAML_SEQUENCE_START_EVENT)
        return s_sequence(p, s, path, line);
    return 0;
}

int topo_prepass(topo_diag_t *d, const unsigned char *buf, size_t len)
{
    s_pass_t p = { .d = d };
    if (!yaml_parser_initialize(&p.parser)) {
        topo_diag_err_at(d, 0, "", "out of memory starting the YAML parser");
        return 1;
    }
    yaml_parser_set_input_string(&p.parser, buf, len);
    yaml_event_t ev;
    int docs = 0;
    while (!p.fatal && s_next(&p, &ev) == 0) {
        yaml_event_type_t t = ev.type;
        int line = s_line(&ev);
        yaml_event_delete(&ev);
        if (t == YAML_STREAM_END_EVENT)
            break;
        if (t != YAML_DOCUMENT_START_EVENT)
            continue;                    /* STREAM_START, DOCUMENT_END */
        if (++docs > 1) {
            s_problem(&p, line, "", "%s", "more than one YAML document ('---'): a topology is one document");
            break;
        }
        if (s_next(&p, &ev) < 0)
            break;
        if (ev.type == YAML_DOCUMENT_END_EVENT) {
            yaml_event_delete(&ev);
            docs--;                      /* an empty document: reported below */
            continue;
        }
        if (s_value(&p, &raw_schema, "", &ev) < 0)
            break;
    }
    if (!p.fatal && docs == 0)
        s_problem(&p, 1, "", "%s", "the file is empty: a topology needs at least an actors: list");
    yaml_parser_delete(&p.parser);
    return p.problems;
}
