/* tests/fuzz/fuzz_safetensors.c — st_parse on arbitrary bytes must either refuse them with an
 * error message or return tensors that lie wholly inside the buffer, tile the data region exactly,
 * and match their declared shape. Buffers are exactly as long as the image, so ASan catches any
 * read past it. Seeds: tests/fuzz/corpus/safetensors/.
 *
 * Each input is parsed twice: as raw bytes, and — so that mutations of the JSON are not all stopped
 * by a now-wrong length prefix — as "header text, newline, data", with the length prefix computed. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/safetensors.h"

static void s_check(const uint8_t *data, size_t size)
{
    char err[512];
    err[0] = '\0';
    st_file_t *f = st_parse(data, size, "fuzz", err, sizeof err);
    if (!f) {
        if (strncmp(err, "fuzz: ", 6) != 0)      /* every refusal explains itself, naming the input */
            abort();
        return;
    }
    uint64_t covered = 0;
    const uint8_t *end = data + size;
    for (int i = 0; i < st_count(f); i++) {
        const st_tensor_t *t = st_at(f, i);
        const uint8_t *p = t->data;
        if (p < data || p > end || t->nbytes > (size_t)(end - p))
            abort();
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            numel *= (uint64_t)t->shape[d];
        if (numel * dtype_size(t->dtype) != t->nbytes || t->end - t->begin != t->nbytes)
            abort();
        if (st_find(f, t->name) != t)
            abort();
        if (i > 0 && strcmp(st_at(f, i - 1)->name, t->name) >= 0)
            abort();
        volatile uint8_t sink = 0;               /* touch the first and last byte */
        if (t->nbytes)
            sink ^= p[0] ^ p[t->nbytes - 1];
        (void)sink;
        covered += t->nbytes;
    }
    /* The tensors tile the data region exactly, so their sizes add up to it. */
    if (st_count(f) > 0) {
        const uint8_t *data_start = (const uint8_t *)st_at(f, 0)->data - st_at(f, 0)->begin;
        if (covered != (uint64_t)(end - data_start))
            abort();
    }
    st_destroy(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    s_check(data, size);
    const uint8_t *nl = memchr(data, '\n', size);
    if (nl) {
        size_t hl = (size_t)(nl - data), dl = size - hl - 1;
        uint8_t *img = malloc(8 + hl + dl + 1);
        for (int i = 0; i < 8; i++)
            img[i] = (uint8_t)((uint64_t)hl >> (8 * i));
        memcpy(img + 8, data, hl);
        memcpy(img + 8 + hl, nl + 1, dl);
        s_check(img, 8 + hl + dl);
        free(img);
    }
    return 0;
}
