#include "actors/cache/fingerprint.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME  0x100000001b3ULL
#define DATA_SAMPLE 4096
#define MAX_HEADER (100u << 20)        /* safetensors' own limit on its JSON header */

static uint64_t s_fnv(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n--)
        h = (h ^ *b++) * FNV_PRIME;
    return h;
}

static uint64_t s_u64(uint64_t h, uint64_t v)
{
    return s_fnv(h, &v, sizeof v);
}

/* Folds up to max bytes of f from its current offset into h. */
static uint64_t s_fold_file(uint64_t h, FILE *f, uint64_t max)
{
    uint8_t buf[8192];
    while (max > 0) {
        size_t n = fread(buf, 1, max < sizeof buf ? (size_t)max : sizeof buf, f);
        if (n == 0)
            break;
        h = s_fnv(h, buf, n);
        max -= n;
    }
    return h;
}

static uint64_t s_safetensors(uint64_t h, const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return s_u64(h, 1);
    uint8_t len8[8];
    if (fseek(f, 0, SEEK_END) == 0) {
        h = s_u64(h, (uint64_t)ftell(f));
        rewind(f);
    }
    if (fread(len8, 1, 8, f) == 8) {
        uint64_t n = 0;
        for (int i = 0; i < 8; i++)
            n |= (uint64_t)len8[i] << (8 * i);
        h = s_u64(h, n);
        if (n <= MAX_HEADER) {
            h = s_fold_file(h, f, n);
            h = s_fold_file(h, f, DATA_SAMPLE);
        }
    }
    fclose(f);
    return h;
}

static int s_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

uint64_t kv_fingerprint(const topo_t *t)
{
    uint64_t h = s_fnv(FNV_OFFSET, "troupe-kv-1", 11);
    h = s_u64(h, (uint64_t)t->model.dtype);
    h = s_u64(h, (uint64_t)t->model.kv_dtype);
    h = s_u64(h, (uint64_t)t->model.load_format);
    if (t->model.quantization)                    /* other weights, other KV (0 keeps the older prints) */
        h = s_u64(h, (uint64_t)t->model.quantization);
    if (t->model.kv_scales)                       /* an fp8 cache's codes under other scales (0 keeps the older prints) */
        h = s_u64(h, 0x6b7300 + (uint64_t)t->model.kv_scales);
    h = s_u64(h, (uint64_t)t->cache.block_size);
    char path[TOPO_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.json", t->model.path);
    FILE *f = fopen(path, "rb");
    if (f) {
        h = s_fold_file(h, f, 1 << 20);
        fclose(f);
    }
    DIR *dir = opendir(t->model.path);
    char *names[256];
    int n = 0;
    for (struct dirent *e; dir && (e = readdir(dir)) != NULL && n < 256;) {
        size_t l = strlen(e->d_name);
        if (l > 12 && strcmp(e->d_name + l - 12, ".safetensors") == 0 && (names[n] = strdup(e->d_name)))
            n++;
    }
    if (dir)
        closedir(dir);
    qsort(names, (size_t)n, sizeof *names, s_cmp);
    for (int i = 0; i < n; i++) {
        h = s_fnv(h, names[i], strlen(names[i]) + 1);
        snprintf(path, sizeof path, "%s/%s", t->model.path, names[i]);
        if (t->model.load_format != TOPO_LOAD_DUMMY)
            h = s_safetensors(h, path);
        free(names[i]);
    }
    return h ? h : 1;
}
