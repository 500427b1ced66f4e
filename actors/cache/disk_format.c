#include "actors/cache/disk_format.h"

#include <stdio.h>
#include <string.h>

#define FILE_MAGIC "TRKVDSK1"
#define REC_MAGIC  0x42564b54u        /* "TKVB" little-endian */
#define FILE_FIELDS 68u               /* encoded bytes of the file header, its CRC last */
#define REC_FIELDS  76u               /* encoded bytes of a record header, its CRC last */

/* ---- CRC32C ---------------------------------------------------------------------------------- */

static uint32_t s_table[256];
static int s_table_ready;

static void s_table_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        s_table[i] = c;
    }
    s_table_ready = 1;
}

static uint32_t s_crc_table(uint32_t crc, const uint8_t *p, size_t n)
{
    if (!s_table_ready)
        s_table_init();   /* idempotent: two threads racing here write the same values */
    while (n--)
        crc = s_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t s_crc_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8, n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

uint32_t df_crc32c(uint32_t crc, const void *data, size_t n)
{
    crc = ~crc;
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        return ~s_crc_hw(crc, data, n);
#endif
    return ~s_crc_table(crc, data, n);
}

/* ---- little-endian fields -------------------------------------------------------------------- */

static void s_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void s_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t s_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t s_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static df_status_t s_bad(char *why, size_t whylen, const char *what)
{
    if (why && whylen)
        snprintf(why, whylen, "%s", what);
    return DF_CORRUPT;
}

uint64_t df_slot_bytes(uint64_t block_bytes)
{
    return (DF_REC_HDR_BYTES + block_bytes + DF_SLOT_ALIGN - 1) / DF_SLOT_ALIGN * DF_SLOT_ALIGN;
}

/* ---- file header ----------------------------------------------------------------------------- */

void df_file_hdr_encode(const df_file_hdr_t *h, uint8_t *buf)
{
    memset(buf, 0, DF_FILE_HDR_BYTES);
    memcpy(buf, FILE_MAGIC, 8);
    s_put32(buf + 8, DF_VERSION);
    s_put32(buf + 12, (uint32_t)h->dtype);
    s_put64(buf + 16, h->fingerprint);
    s_put32(buf + 24, h->n_layers);
    s_put32(buf + 28, h->block_size);
    s_put32(buf + 32, h->n_kv_heads);
    s_put32(buf + 36, h->head_dim);
    s_put64(buf + 40, h->block_bytes);
    s_put64(buf + 48, h->slot_bytes);
    s_put64(buf + 56, h->n_slots);
    s_put32(buf + 64, df_crc32c(0, buf, 64));
}

df_status_t df_file_hdr_decode(const uint8_t *buf, size_t n, df_file_hdr_t *h, char *why, size_t whylen)
{
    memset(h, 0, sizeof *h);
    if (n < FILE_FIELDS)
        return s_bad(why, whylen, "file header: too short");
    if (memcmp(buf, FILE_MAGIC, 8) != 0)
        return s_bad(why, whylen, "file header: not a Troupe disk-tier file (magic)");
    if (s_get32(buf + 64) != df_crc32c(0, buf, 64))
        return s_bad(why, whylen, "file header: checksum mismatch");
    if (s_get32(buf + 8) != DF_VERSION)
        return s_bad(why, whylen, "file header: unknown version");
    uint32_t dt = s_get32(buf + 12);
    if (dt >= DT_COUNT)
        return s_bad(why, whylen, "file header: KV dtype out of range");
    h->dtype = (dtype_t)dt;
    h->fingerprint = s_get64(buf + 16);
    h->n_layers = s_get32(buf + 24);
    h->block_size = s_get32(buf + 28);
    h->n_kv_heads = s_get32(buf + 32);
    h->head_dim = s_get32(buf + 36);
    h->block_bytes = s_get64(buf + 40);
    h->slot_bytes = s_get64(buf + 48);
    h->n_slots = s_get64(buf + 56);
    if (!h->fingerprint)
        return s_bad(why, whylen, "file header: fingerprint 0");
    if (!h->n_layers || !h->block_size || !h->n_kv_heads || !h->head_dim)
        return s_bad(why, whylen, "file header: a block dimension is 0");
    if (!h->block_bytes || h->block_bytes > DF_MAX_BLOCK_BYTES)
        return s_bad(why, whylen, "file header: block_bytes out of range");
    if (h->slot_bytes != df_slot_bytes(h->block_bytes))
        return s_bad(why, whylen, "file header: slot_bytes does not fit block_bytes");
    if (h->n_slots > (UINT64_MAX - DF_FILE_HDR_BYTES) / h->slot_bytes)
        return s_bad(why, whylen, "file header: n_slots out of range");
    return DF_OK;
}

/* ---- record header --------------------------------------------------------------------------- */

void df_rec_encode(const df_rec_t *r, uint8_t *buf)
{
    memset(buf, 0, DF_REC_HDR_BYTES);
    s_put32(buf, REC_MAGIC);
    buf[4] = (uint8_t)DF_VERSION;     /* u16 version, u16 flags (0) */
    s_put64(buf + 8, r->hash);
    s_put64(buf + 16, r->tenant);
    s_put64(buf + 24, r->fingerprint);
    s_put32(buf + 32, (uint32_t)r->dtype);
    s_put32(buf + 36, r->payload_crc);
    s_put64(buf + 40, r->block_bytes);
    s_put64(buf + 48, r->seq);
    s_put64(buf + 56, (uint64_t)r->pin_until_ms);
    s_put64(buf + 64, (uint64_t)r->written_ms);
    s_put32(buf + 72, df_crc32c(0, buf, 72));
}

df_status_t df_rec_decode(const uint8_t *buf, size_t n, df_rec_t *r, char *why, size_t whylen)
{
    memset(r, 0, sizeof *r);
    if (n < REC_FIELDS)
        return s_bad(why, whylen, "record header: too short");
    int zero = 1;
    for (size_t i = 0; i < REC_FIELDS && zero; i++)
        zero = buf[i] == 0;
    if (zero)
        return DF_EMPTY;
    if (s_get32(buf) != REC_MAGIC)
        return s_bad(why, whylen, "record header: bad magic");
    if (s_get32(buf + 72) != df_crc32c(0, buf, 72))
        return s_bad(why, whylen, "record header: checksum mismatch");
    if (buf[4] != DF_VERSION || buf[5] || buf[6] || buf[7])
        return s_bad(why, whylen, "record header: unknown version or flags");
    uint32_t dt = s_get32(buf + 32);
    if (dt >= DT_COUNT)
        return s_bad(why, whylen, "record header: KV dtype out of range");
    r->hash = s_get64(buf + 8);
    r->tenant = s_get64(buf + 16);
    r->fingerprint = s_get64(buf + 24);
    r->dtype = (dtype_t)dt;
    r->payload_crc = s_get32(buf + 36);
    r->block_bytes = s_get64(buf + 40);
    r->seq = s_get64(buf + 48);
    r->pin_until_ms = (int64_t)s_get64(buf + 56);
    r->written_ms = (int64_t)s_get64(buf + 64);
    if (!r->hash)
        return s_bad(why, whylen, "record header: block hash 0");
    if (!r->block_bytes || r->block_bytes > DF_MAX_BLOCK_BYTES)
        return s_bad(why, whylen, "record header: block_bytes out of range");
    if (r->pin_until_ms < 0 || r->written_ms < 0)
        return s_bad(why, whylen, "record header: negative time");
    return DF_OK;
}
