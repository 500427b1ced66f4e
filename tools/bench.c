/* tools/bench.c — troupe-bench: a serving load generator in the style of `vllm bench serve`.
 *
 *   troupe-bench [--endpoint EP | --topology FILE] [--input-len N] [--output-len N]
 *                [--concurrency 1,8,32,64] [--prompts-per-level N] [--warmup N] [--vocab N]
 *                [--generate MODEL_DIR [--generate-args "..."]] [--json FILE] [--seed S]
 *
 * Random token-id prompts of a fixed input length, a fixed output length (EOS ignored), a warm-up,
 * then one run per concurrency level (that many client threads, each with its own connection,
 * each sending its next request when the last one ends). Per level: TTFT, ITL and end-to-end
 * latency (p50, p99), output and total tokens/s, output tokens/s per user. With --generate it
 * first times the one-process troupe-generate on the same lengths (median of 3) and prints the
 * ratio of the cluster's tokens/s per user at concurrency 1 to it. Written in C so that the load
 * generator is never the bottleneck at high concurrency. Exit 1 if any request failed. */
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "tools/lib/client.h"

#define MAX_LEVELS 16

typedef struct req_result {
    double ttft_ms, e2e_ms;
    int n_out;
    int failed;
} req_result_t;

typedef struct level {
    const char *ep;
    int in_len, out_len, n_prompts, concurrency, vocab;
    uint64_t seed;
    _Atomic int next;
    req_result_t *res;          /* [n_prompts] */
    float *itl;                 /* [n_prompts][out_len] ms, -1 unused */
    char first_error[512];
    pthread_mutex_t lock;
} level_t;

static uint64_t s_rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* One streamed request; fills res and its ITL row. */
static void s_one(level_t *L, client_t *c, int idx, uint32_t *prompt)
{
    uint64_t st = L->seed * 1000003u + (uint64_t)idx;
    for (int i = 0; i < L->in_len; i++)
        prompt[i] = 10 + (uint32_t)(s_rng(&st) % (uint64_t)(L->vocab - 10));
    msg_t m;
    msg_init(&m, MSG_SUBMIT, 0);
    m.u.submit.tokens = prompt;
    m.u.submit.n_tokens = (uint32_t)L->in_len;
    m.u.submit.stream = true;
    m.u.submit.sampling.temperature = 0;
    m.u.submit.sampling.ignore_eos = true;
    m.u.submit.sampling.max_tokens = (uint32_t)L->out_len;
    req_result_t *r = &L->res[idx];
    float *itl = L->itl + (size_t)idx * (size_t)L->out_len;
    char err[512];
    uint64_t id;
    int64_t t0 = now_ns(), last = 0;
    if (client_send(c, &m, &id, err, sizeof err) != 0)
        goto fail;
    for (;;) {
        msg_t rep;
        int rc = client_recv(c, &rep, 600000, err, sizeof err);
        if (rc != 0) {
            if (rc == 1)
                snprintf(err, sizeof err, "no reply in 600 s");
            goto fail;
        }
        int64_t now = now_ns();
        if (rep.id != id) {
            msg_free(&rep);
            continue;
        }
        if (rep.type == MSG_TOKEN) {
            if (r->n_out == 0)
                r->ttft_ms = (double)(now - t0) / 1e6;
            else if (r->n_out - 1 < L->out_len)
                itl[r->n_out - 1] = (float)((double)(now - last) / 1e6);
            r->n_out += (int)rep.u.token.n_tokens;
            last = now;
        } else if (rep.type == MSG_DONE || rep.type == MSG_ERROR) {
            if (rep.type == MSG_ERROR)
                snprintf(err, sizeof err, "%s: %s", msg_error_code_name(rep.u.error.code), rep.u.error.message);
            int failed = rep.type == MSG_ERROR;
            msg_free(&rep);
            r->e2e_ms = (double)(now - t0) / 1e6;
            if (failed)
                goto fail;
            return;
        }
        msg_free(&rep);
    }
fail:
    r->failed = 1;
    pthread_mutex_lock(&L->lock);
    if (!L->first_error[0])
        snprintf(L->first_error, sizeof L->first_error, "%s", err);
    pthread_mutex_unlock(&L->lock);
}

static void *s_worker(void *arg)
{
    level_t *L = arg;
    char err[256];
    client_t *c = client_connect(L->ep, err, sizeof err);
    uint32_t *prompt = malloc((size_t)L->in_len * sizeof *prompt);
    for (int i; c && (i = atomic_fetch_add(&L->next, 1)) < L->n_prompts;)
        s_one(L, c, i, prompt);
    free(prompt);
    client_destroy(&c);
    return NULL;
}

static int s_cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double s_pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, s_cmpd);
    return v[(size_t)(p * (double)(n - 1) + 0.5)];
}

typedef struct summary {
    int concurrency, requests, errors;
    double wall_s, out_tps, total_tps, per_user, ttft50, ttft99, itl50, itl99, e2e50, e2e99;
} summary_t;

static summary_t s_run_level(level_t *L)
{
    summary_t S = {.concurrency = L->concurrency};
    L->res = calloc((size_t)L->n_prompts, sizeof *L->res);
    L->itl = malloc((size_t)L->n_prompts * (size_t)L->out_len * sizeof *L->itl);
    for (size_t i = 0; i < (size_t)L->n_prompts * (size_t)L->out_len; i++)
        L->itl[i] = -1;
    atomic_store(&L->next, 0);
    pthread_mutex_init(&L->lock, NULL);
    pthread_t *th = calloc((size_t)L->concurrency, sizeof *th);
    int64_t t0 = now_ns();
    for (int i = 0; i < L->concurrency; i++)
        pthread_create(&th[i], NULL, s_worker, L);
    for (int i = 0; i < L->concurrency; i++)
        pthread_join(th[i], NULL);
    S.wall_s = (double)(now_ns() - t0) / 1e9;
    double *ttft = malloc((size_t)L->n_prompts * sizeof *ttft), *e2e = malloc((size_t)L->n_prompts * sizeof *e2e);
    double *itl = malloc((size_t)L->n_prompts * (size_t)L->out_len * sizeof *itl);
    size_t n_ok = 0, n_itl = 0;
    long out_tokens = 0;
    double per_user = 0;
    for (int i = 0; i < L->n_prompts; i++) {
        req_result_t *r = &L->res[i];
        if (r->failed) {
            S.errors++;
            continue;
        }
        ttft[n_ok] = r->ttft_ms;
        e2e[n_ok++] = r->e2e_ms;
        out_tokens += r->n_out;
        if (r->n_out > 1 && r->e2e_ms > r->ttft_ms)
            per_user += (r->n_out - 1) / ((r->e2e_ms - r->ttft_ms) / 1000.0);
        for (int k = 0; k < L->out_len; k++)
            if (L->itl[(size_t)i * (size_t)L->out_len + (size_t)k] >= 0)
                itl[n_itl++] = L->itl[(size_t)i * (size_t)L->out_len + (size_t)k];
    }
    S.requests = (int)n_ok;
    S.out_tps = (double)out_tokens / S.wall_s;
    S.total_tps = (double)(out_tokens + (long)n_ok * L->in_len) / S.wall_s;
    S.per_user = n_ok ? per_user / (double)n_ok : 0;
    S.ttft50 = s_pct(ttft, n_ok, 0.5), S.ttft99 = s_pct(ttft, n_ok, 0.99);
    S.e2e50 = s_pct(e2e, n_ok, 0.5), S.e2e99 = s_pct(e2e, n_ok, 0.99);
    S.itl50 = s_pct(itl, n_itl, 0.5), S.itl99 = s_pct(itl, n_itl, 0.99);
    if (S.errors)
        fprintf(stderr, "troupe-bench: %d requests failed at concurrency %d; first: %s\n", S.errors,
                L->concurrency, L->first_error);
    free(ttft), free(e2e), free(itl), free(th), free(L->res), free(L->itl);
    pthread_mutex_destroy(&L->lock);
    return S;
}

/* Median decode tokens/s of 3 troupe-generate runs with the same lengths. */
static double s_generate(const char *bin_dir, const char *model, const char *extra, int in_len, int out_len, int vocab)
{
    double rates[3];
    int n = 0;
    uint64_t st = 77;
    for (int rep = 0; rep < 3; rep++) {
        size_t cap = (size_t)in_len * 8 + 4096;
        char *cmd = malloc(cap);
        int k = snprintf(cmd, cap, "'%s/troupe-generate' '%s' %s --max-tokens %d --temperature 0 --ignore-eos --json --ids ",
                         bin_dir, model, extra ? extra : "", out_len);
        for (int i = 0; i < in_len; i++)
            k += snprintf(cmd + k, cap - (size_t)k, "%s%u", i ? "," : "", 10 + (unsigned)(s_rng(&st) % (uint64_t)(vocab - 10)));
        FILE *p = popen(cmd, "r");
        free(cmd);
        if (!p)
            continue;
        json_error_t je;
        json_t *j = json_loadf(p, JSON_DISABLE_EOF_CHECK, &je);
        pclose(p);
        json_t *tps = j ? json_object_get(json_object_get(j, "timings"), "decode_tokens_per_s") : NULL;
        if (tps)
            rates[n++] = json_number_value(tps);
        json_decref(j);
    }
    if (!n)
        return 0;
    qsort(rates, (size_t)n, sizeof *rates, s_cmpd);
    return rates[n / 2];
}

static void s_usage(FILE *f)
{
    fprintf(f, "usage: troupe-bench [--endpoint EP | --topology FILE] [--input-len N] [--output-len N]\n"
               "       [--concurrency 1,8,32,64] [--prompts-per-level N] [--warmup N] [--vocab N]\n"
               "       [--generate MODEL_DIR [--generate-args \"...\"]] [--json FILE] [--seed S]\n");
}

int main(int argc, char **argv)
{
    const char *ep = NULL, *topology = NULL, *gen_model = NULL, *gen_args = "", *json_path = NULL;
    int in_len = 64, out_len = 64, per_level = 0, warmup = 2, vocab = 500, levels[MAX_LEVELS], n_levels = 0;
    uint64_t seed = 1;
    char conc[256] = "1,8,32,64";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { s_usage(stdout); return 0; }
        if (!v) { fprintf(stderr, "troupe-bench: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--endpoint")) ep = v;
        else if (!strcmp(a, "--topology")) topology = v;
        else if (!strcmp(a, "--input-len")) in_len = atoi(v);
        else if (!strcmp(a, "--output-len")) out_len = atoi(v);
        else if (!strcmp(a, "--concurrency")) snprintf(conc, sizeof conc, "%s", v);
        else if (!strcmp(a, "--prompts-per-level")) per_level = atoi(v);
        else if (!strcmp(a, "--warmup")) warmup = atoi(v);
        else if (!strcmp(a, "--vocab")) vocab = atoi(v);
        else if (!strcmp(a, "--generate")) gen_model = v;
        else if (!strcmp(a, "--generate-args")) gen_args = v;
        else if (!strcmp(a, "--json")) json_path = v;
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else { fprintf(stderr, "troupe-bench: unknown option '%s'\n", a); s_usage(stderr); return 2; }
    }
    if (in_len < 1 || out_len < 1 || vocab < 11 || warmup < 0) {
        fprintf(stderr, "troupe-bench: lengths must be >= 1 and --vocab >= 11\n");
        return 2;
    }
    for (char *save = NULL, *t = strtok_r(conc, ",", &save); t && n_levels < MAX_LEVELS; t = strtok_r(NULL, ",", &save))
        if ((levels[n_levels++] = atoi(t)) < 1) {
            fprintf(stderr, "troupe-bench: bad concurrency '%s'\n", t);
            return 2;
        }
    char epbuf[256], err[512];
    if (!ep) {
        if (client_endpoints_from_topology(topology, epbuf, NULL, sizeof epbuf, err, sizeof err) != 0) {
            fprintf(stderr, "troupe-bench: %s\n", err);
            return 2;
        }
        ep = epbuf;
    }
    char self[1024], bin_dir[1024] = ".";
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    if (sl > 0) {
        self[sl] = 0;
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = 0;
            snprintf(bin_dir, sizeof bin_dir, "%s", self);
        }
    }
    double gen_tps = gen_model ? s_generate(bin_dir, gen_model, gen_args, in_len, out_len, vocab) : 0;
    if (warmup) {
        level_t W = {.ep = ep, .in_len = in_len, .out_len = out_len < 8 ? out_len : 8, .n_prompts = warmup,
                     .concurrency = 1, .vocab = vocab, .seed = seed + 999};
        summary_t ws = s_run_level(&W);
        if (ws.errors) {
            fprintf(stderr, "troupe-bench: warm-up failed (is the cluster at %s running?)\n", ep);
            return 1;
        }
    }
    summary_t S[MAX_LEVELS];
    int errors = 0;
    for (int l = 0; l < n_levels; l++) {
        level_t L = {.ep = ep, .in_len = in_len, .out_len = out_len, .concurrency = levels[l], .vocab = vocab,
                     .seed = seed + (uint64_t)levels[l],
                     .n_prompts = per_level > 0 ? per_level : (4 * levels[l] > 8 ? 4 * levels[l] : 8)};
        S[l] = s_run_level(&L);
        errors += S[l].errors;
        fprintf(stderr, "  concurrency %4d: %9.1f out tok/s, %7.1f tok/s/user, TTFT p50 %8.1f ms, ITL p50 %6.2f ms\n",
                S[l].concurrency, S[l].out_tps, S[l].per_user, S[l].ttft50, S[l].itl50);
    }
    printf("\ninput %d / output %d tokens, endpoint %s\n", in_len, out_len, ep);
    printf("%5s %5s %10s %11s %10s %9s %9s %8s %8s %9s %9s %4s\n", "conc", "reqs", "out tok/s", "total tok/s",
           "tok/s/user", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "E2E p50", "E2E p99", "err");
    for (int l = 0; l < n_levels; l++)
        printf("%5d %5d %10.1f %11.1f %10.1f %9.1f %9.1f %8.2f %8.2f %9.1f %9.1f %4d\n", S[l].concurrency,
               S[l].requests, S[l].out_tps, S[l].total_tps, S[l].per_user, S[l].ttft50, S[l].ttft99, S[l].itl50,
               S[l].itl99, S[l].e2e50, S[l].e2e99, S[l].errors);
    double ratio = 0;
    if (gen_model) {
        printf("troupe-generate (one process): %.1f decode tok/s", gen_tps);
        for (int l = 0; l < n_levels; l++)
            if (S[l].concurrency == 1 && gen_tps > 0) {
                ratio = S[l].per_user / gen_tps;
                printf("; cluster at concurrency 1: %.1f tok/s/user = %.1f%% of it", S[l].per_user, 100 * ratio);
            }
        printf("\n");
    }
    if (json_path) {
        json_t *j = json_pack("{s:i, s:i, s:s}", "input_len", in_len, "output_len", out_len, "endpoint", ep);
        json_t *arr = json_array();
        for (int l = 0; l < n_levels; l++)
            json_array_append_new(arr, json_pack("{s:i,s:i,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f,s:f}",
                "concurrency", S[l].concurrency, "requests", S[l].requests, "errors", S[l].errors,
                "wall_s", S[l].wall_s, "output_tokens_per_s", S[l].out_tps, "total_tokens_per_s", S[l].total_tps,
                "tokens_per_s_per_user", S[l].per_user, "ttft_ms_p50", S[l].ttft50, "ttft_ms_p99", S[l].ttft99,
                "itl_ms_p50", S[l].itl50, "itl_ms_p99", S[l].itl99, "e2e_ms_p50", S[l].e2e50, "e2e_ms_p99", S[l].e2e99));
        json_object_set_new(j, "levels", arr);
        if (gen_model) {
            json_object_set_new(j, "generate_decode_tokens_per_s", json_real(gen_tps));
            json_object_set_new(j, "cluster_c1_over_generate", json_real(ratio));
        }
        if (json_dump_file(j, json_path, JSON_INDENT(1)) != 0)
            fprintf(stderr, "troupe-bench: cannot write %s\n", json_path);
        json_decref(j);
    }
    return errors ? 1 : 0;
}
