/* engine/chat_template.c — the Llama 3 and Qwen3 chat templates, written out in C.
 *
 * Each renderer follows its Jinja template statement by statement (quoted in the comments) so
 * a reader can check one against the other; the Python string methods the templates call
 * (trim, strip, split, startswith) are reproduced with Python's own definitions, since that is
 * what Jinja runs. */
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "common/util.h"
#include "engine/chat_template.h"

/* ---- output buffer ---- */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} s_out_t;

static void s_put(s_out_t *o, const char *s, size_t len)
{
    if (o->oom)
        return;
    if (o->n + len + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->n + len + 1)
            cap *= 2;
        char *p = realloc(o->p, cap);
        if (!p) {
            o->oom = 1;
            return;
        }
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, len);
    o->n += len;
    o->p[o->n] = 0;
}

static void s_puts(s_out_t *o, const char *s) { s_put(o, s, strlen(s)); }

/* ---- Python string methods ---- */

/* Python's str.isspace() for one code point. */
static int s_py_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* Decodes the code point at s[i] (n bytes in all) into *cp and returns its length; an invalid
 * byte counts as one non-space character. */
static size_t s_cp_at(const unsigned char *s, size_t n, size_t i, uint32_t *cp)
{
    unsigned char c = s[i];
    size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || i + len > n) {
        *cp = 0xFFFD;
        return 1;
    }
    uint32_t v = len == 1 ? c : (uint32_t)(c & (0x7F >> len));
    for (size_t k = 1; k < len; k++) {
        if ((s[i + k] & 0xC0) != 0x80) {
            *cp = 0xFFFD;
            return 1;
        }
        v = (v << 6) | (s[i + k] & 0x3F);
    }
    *cp = v;
    return len;
}

/* Jinja's |trim, i.e. Python's str.strip(): [*b, *e) narrowed to drop white space at both ends. */
static void s_trim(const char **b, const char **e)
{
    const unsigned char *s = (const unsigned char *)*b;
    size_t n = (size_t)(*e - *b), i = 0, end = 0;
    while (i < n) {
        uint32_t cp;
        size_t len = s_cp_at(s, n, i, &cp);
        if (!s_py_space(cp))
            break;
        i += len;
    }
    /* the end of the last non-space character */
    for (size_t k = i; k < n;) {
        uint32_t cp;
        size_t len = s_cp_at(s, n, k, &cp);
        k += len;
        if (!s_py_space(cp))
            end = k;
    }
    *b = (const char *)s + i;
    *e = (const char *)s + (end > i ? end : i);
}

/* str.strip/lstrip/rstrip('\n') on [*b, *e). */
static void s_lstrip_nl(const char **b, const char *e) { while (*b < e && **b == '\n') (*b)++; }
static void s_rstrip_nl(const char *b, const char **e) { while (*e > b && (*e)[-1] == '\n') (*e)--; }

/* The first / last occurrence of needle in [b, e), or NULL. */
static const char *s_find(const char *b, const char *e, const char *needle)
{
    size_t k = strlen(needle);
    return (size_t)(e - b) >= k ? memmem(b, (size_t)(e - b), needle, k) : NULL;
}

static const char *s_rfind(const char *b, const char *e, const char *needle)
{
    size_t k = strlen(needle);
    for (const char *p = e - k; (size_t)(e - b) >= k && p >= b; p--)
        if (memcmp(p, needle, k) == 0)
            return p;
    return NULL;
}

static int s_starts(const char *s, const char *pre) { return strncmp(s, pre, strlen(pre)) == 0; }

static int s_ends(const char *s, const char *suf)
{
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && memcmp(s + n - k, suf, k) == 0;
}

/* ---- Llama 3 ---- */

/* {% set loop_messages = messages %}{% for message in loop_messages %}
 *   {% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'
 *                    + message['content'] | trim + '<|eot_id|>' %}
 *   {% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}
 * {% endfor %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
 * (The generation prompt is unconditional in this template.) */
static void s_llama3(s_out_t *o, const chat_msg_t *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (i == 0)
            s_puts(o, "<|begin_of_text|>");
        s_puts(o, "<|start_header_id|>");
        s_puts(o, m[i].role);
        s_puts(o, "<|end_header_id|>\n\n");
        const char *b = m[i].content, *e = b + strlen(b);
        s_trim(&b, &e);
        s_put(o, b, (size_t)(e - b));
        s_puts(o, "<|eot_id|>");
    }
    s_puts(o, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* ---- Qwen3 (ChatML with thinking) ---- */

static int s_is(const chat_msg_t *m, const char *role) { return strcmp(m->role, role) == 0; }

/* An assistant turn:
 *   content = message.content; reasoning_content = ''
 *   if '</think>' in content:
 *       content = content.split('</think>')[-1].lstrip('\n')
 *       reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n')
 *   if loop.index0 > ns.last_query_index and (loop.last or reasoning_content):
 *       '<|im_start|>' + role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n')
 *   else:
 *       '<|im_start|>' + role + '\n' + content
 *   '<|im_end|>\n' */
static void s_qwen3_assistant(s_out_t *o, const chat_msg_t *m, int after_last_query, int last)
{
    const char *all = m->content, *all_end = all + strlen(all);
    const char *cb = all, *ce = all_end;         /* content */
    const char *rb = all, *re = all;             /* reasoning_content, empty */
    const char *close = s_find(all, all_end, "</think>");
    if (close) {
        cb = s_rfind(all, all_end, "</think>") + strlen("</think>");
        s_lstrip_nl(&cb, ce);
        rb = all;
        re = close;
        s_rstrip_nl(rb, &re);
        const char *open = s_rfind(rb, re, "<think>");
        if (open)
            rb = open + strlen("<think>");
        s_lstrip_nl(&rb, re);
    }
    s_puts(o, "<|im_start|>");
    s_puts(o, m->role);
    if (after_last_query && (last || re > rb)) {
        s_lstrip_nl(&rb, re);
        s_rstrip_nl(rb, &re);
        s_puts(o, "\n<think>\n");
        s_put(o, rb, (size_t)(re - rb));
        s_puts(o, "\n</think>\n\n");
        s_lstrip_nl(&cb, ce);
    } else {
        s_puts(o, "\n");
    }
    s_put(o, cb, (size_t)(ce - cb));
    s_puts(o, "<|im_end|>\n");
}

static void s_qwen3(s_out_t *o, const chat_msg_t *m, size_t n, int add_generation_prompt,
                    int enable_thinking)
{
    /* {%- if messages[0].role == 'system' %}
     *     {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }} */
    if (s_is(&m[0], "system")) {
        s_puts(o, "<|im_start|>system\n");
        s_puts(o, m[0].content);
        s_puts(o, "<|im_end|>\n");
    }
    /* The last user message that is not a bare tool response, scanning from the end. */
    size_t last_query = n - 1;
    for (size_t k = n; k-- > 0;) {
        if (s_is(&m[k], "user") && !(s_starts(m[k].content, "<tool_response>") &&
                                      s_ends(m[k].content, "</tool_response>"))) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (s_is(&m[i], "user") || (s_is(&m[i], "system") && i > 0)) {
            s_puts(o, "<|im_start|>");
            s_puts(o, m[i].role);
            s_puts(o, "\n");
            s_puts(o, m[i].content);
            s_puts(o, "<|im_end|>\n");
        } else if (s_is(&m[i], "assistant")) {
            s_qwen3_assistant(o, &m[i], i > last_query, i == n - 1);
        } else if (s_is(&m[i], "tool")) {
            /* consecutive tool results share one user turn */
            if (i == 0 || !s_is(&m[i - 1], "tool"))
                s_puts(o, "<|im_start|>user");
            s_puts(o, "\n<tool_response>\n");
            s_puts(o, m[i].content);
            s_puts(o, "\n</tool_response>");
            if (i == n - 1 || !s_is(&m[i + 1], "tool"))
                s_puts(o, "<|im_end|>\n");
        }
    }
    if (add_generation_prompt) {
        s_puts(o, "<|im_start|>assistant\n");
        if (!enable_thinking)
            s_puts(o, "<think>\n\n</think>\n\n");
    }
}

int chat_render(chat_family_t f, const chat_msg_t *msgs, size_t n, int add_generation_prompt,
                int enable_thinking, char **out, char *err, size_t errlen)
{
    *out = NULL;
    if (f != CHAT_LLAMA3 && f != CHAT_CHATML)
        return errf(err, errlen, "chat_render: no built-in chat template for this model");
    if (n == 0 || !msgs)
        return errf(err, errlen, "chat_render: no messages");
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role)
            return errf(err, errlen, "chat_render: messages[%zu].role is missing", i);
        if (!msgs[i].content)
            return errf(err, errlen, "chat_render: messages[%zu].content is missing", i);
    }
    s_out_t o = {0};
    s_put(&o, "", 0);
    if (f == CHAT_LLAMA3)
        s_llama3(&o, msgs, n);
    else
        s_qwen3(&o, msgs, n, add_generation_prompt, enable_thinking);
    if (o.oom) {
        free(o.p);
        return errf(err, errlen, "chat_render: out of memory");
    }
    *out = o.p;
    return 0;
}

/* ---- detection ---- */

const char *chat_family_name(chat_family_t f)
{
    return f == CHAT_LLAMA3 ? "llama3" : f == CHAT_CHATML ? "chatml" : "none";
}

/* What identifies each template. Markers rather than a hash of the text, so harmless edits in
 * fine-tunes (white space, a changed default system prompt elsewhere) still match; templates
 * that differ in what they render carry a marker that excludes them. */
static chat_family_t s_classify(const char *tpl)
{
    if (strstr(tpl, "<|start_header_id|>") && strstr(tpl, "<|eot_id|>")) {
        if (strstr(tpl, "Cutting Knowledge Date") || strstr(tpl, "date_string"))
            return CHAT_NONE;                     /* Llama 3.1+: another template */
        if (strstr(tpl, "bos_token") && strstr(tpl, "| trim"))
            return CHAT_LLAMA3;
        return CHAT_NONE;
    }
    if (strstr(tpl, "<|im_start|>") && strstr(tpl, "enable_thinking") &&
        strstr(tpl, "reasoning_content") && strstr(tpl, "last_query_index"))
        return CHAT_CHATML;
    return CHAT_NONE;
}

chat_family_t chat_family_detect(const char *path)
{
    if (!path)
        return CHAT_NONE;
    char file[1024];
    struct stat st;
    if (stat(path, &st) != 0) {
        LOG_D("chat_family_detect: %s: cannot stat", path);
        return CHAT_NONE;
    }
    if (S_ISDIR(st.st_mode))
        snprintf(file, sizeof file, "%s/tokenizer_config.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    json_error_t e;
    json_t *cfg = json_load_file(file, JSON_DECODE_INT_AS_REAL, &e);
    if (!cfg) {
        LOG_D("chat_family_detect: %s: %s", file, e.text);   /* e.line is -1 when it cannot be opened */
        return CHAT_NONE;
    }
    chat_family_t f = CHAT_NONE;
    json_t *t = json_object_get(cfg, "chat_template");
    if (json_is_array(t)) {
        /* [{"name": "default", "template": ...}, {"name": "tool_use", ...}] */
        json_t *pick = NULL, *item;
        size_t i;
        json_array_foreach(t, i, item)
            if (json_is_string(json_object_get(item, "name")) &&
                strcmp(json_string_value(json_object_get(item, "name")), "default") == 0)
                pick = json_object_get(item, "template");
        t = pick;
    }
    if (json_is_string(t))
        f = s_classify(json_string_value(t));
    json_decref(cfg);
    return f;
}
