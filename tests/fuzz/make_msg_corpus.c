/* tests/fuzz/make_msg_corpus.c — writes the seed corpus for fuzz_msg into a directory:
 * one valid frame of every message type (the unit tests' fixtures), the submit variants,
 * and a few malformed frames that reach the decoder's main rejection paths. With a second
 * argument it also writes a libFuzzer dictionary of every wire key (as msgpack fixstr), taken
 * from the schema tables so it never falls behind them.
 *
 * Build and run: see messages/README.md ("Fuzzing"). */
#include <stdio.h>
#include <string.h>

#include "messages/msg.h"
#include "messages/msg_schema.h"
#include "tests/unit/test_msg_fixtures.h"

static uint8_t g_buf[1 << 20];

static int s_write(const char *dir, const char *name, const uint8_t *p, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "make_msg_corpus: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

static int s_encode(const msg_t *m, size_t *len)
{
    char err[256];
    if (msg_encode(m, g_buf, sizeof g_buf, len, err, sizeof err) != 0) {
        fprintf(stderr, "make_msg_corpus: %s\n", err);
        return -1;
    }
    return 0;
}

/* Each key once, as the fixstr bytes the decoder compares against. */
static void s_dict_schema(FILE *f, const msg_schema_t *s, int depth)
{
    static const char *seen[512];
    static unsigned n_seen;
    for (unsigned i = 0; s && i < s->n_fields; i++) {
        const char *k = s->fields[i].key;
        unsigned j = 0;
        while (j < n_seen && strcmp(seen[j], k) != 0)
            j++;
        if (j < n_seen || n_seen == 512)
            continue;
        seen[n_seen++] = k;
        fprintf(f, "\"\\x%02x%s\"\n", 0xa0 | (unsigned)strlen(k), k);
    }
    for (unsigned i = 0; s && i < s->n_fields; i++)
        if (s->fields[i].sub && depth < 2)
            s_dict_schema(f, s->fields[i].sub, depth + 1);
}

static int s_write_dict(const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "# fuzz_msg dictionary: every wire key (written by make_msg_corpus)\n");
    fprintf(f, "\"\\xa1v\\x01\"\n\"\\xa1t\"\n\"\\xa2id\"\n");
    for (int t = 1; t < MSG_TYPE_COUNT; t++)
        s_dict_schema(f, msg_schema_of((msg_type_t)t), 0);
    return fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s CORPUS_DIR [DICT_FILE]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    char name[64];
    size_t len;
    msg_t m;
    int rc = 0;

    for (int t = 1; t < MSG_TYPE_COUNT; t++) {
        fx_fill(&m, (msg_type_t)t);
        if (s_encode(&m, &len) < 0)
            return 1;
        snprintf(name, sizeof name, "valid-%02d-%s", t, msg_type_name((msg_type_t)t));
        rc |= s_write(dir, name, g_buf, len);
    }
    for (int v = 0; v < 2; v++) {
        fx_fill_submit_variant(&m, v);
        if (s_encode(&m, &len) < 0)
            return 1;
        rc |= s_write(dir, v ? "valid-submit-tokens" : "valid-submit-prompt", g_buf, len);
    }

    /* Malformed, derived from a valid ready frame. */
    fx_fill(&m, MSG_READY);
    if (s_encode(&m, &len) < 0)
        return 1;
    rc |= s_write(dir, "bad-truncated", g_buf, len / 2);
    g_buf[len] = 0xc0;
    rc |= s_write(dir, "bad-trailing", g_buf, len + 1);
    static const uint8_t lying_array[] = {0x84, 0xa1, 'v', 0x01, 0xa1, 't', 0x05, 0xa2, 'i', 'd', 0x01,
                                          0xa6, 't', 'o', 'k', 'e', 'n', 's', 0xdd, 0xff, 0x00, 0x00, 0x00};
    rc |= s_write(dir, "bad-lying-array", lying_array, sizeof lying_array);
    static const uint8_t lying_str[] = {0x84, 0xa1, 'v', 0x01, 0xa1, 't', 0x05, 0xa2, 'i', 'd', 0x01,
                                        0xa6, 'p', 'r', 'o', 'm', 'p', 't', 0xdb, 0xff, 0xff, 0xff, 0xff};
    rc |= s_write(dir, "bad-lying-str", lying_str, sizeof lying_str);
    static const uint8_t deep[] = {0x84, 0xa1, 'v', 0x01, 0xa1, 't', 0x09, 0xa2, 'i', 'd', 0x01,
                                   0xa1, 'x', 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0x91, 0xc0};
    rc |= s_write(dir, "bad-deep", deep, sizeof deep);
    static const uint8_t version[] = {0x83, 0xa1, 'v', 0x02, 0xa1, 't', 0x09, 0xa2, 'i', 'd', 0x01};
    rc |= s_write(dir, "bad-version", version, sizeof version);
    static const uint8_t unknown[] = {0x84, 0xa1, 'v', 0x01, 0xa1, 't', 0x09, 0xa2, 'i', 'd', 0x01,
                                      0xa3, 'x', 'y', 'z', 0xc3};
    rc |= s_write(dir, "bad-unknown-key", unknown, sizeof unknown);
    static const uint8_t top_array[] = {0x93, 0x01, 0x02, 0x03};
    rc |= s_write(dir, "bad-top-array", top_array, sizeof top_array);
    if (argc == 3 && s_write_dict(argv[2]) != 0) {
        fprintf(stderr, "make_msg_corpus: cannot write %s\n", argv[2]);
        rc = 1;
    }
    return rc ? 1 : 0;
}
