/* The disk tier's store (actors/cache/): its format, checksums, fingerprints, eviction, the index
 * read back after a restart, and what it refuses: torn writes, flipped bits, another model's or
 * dtype's blocks, a full disk. The I/O threads at the end: jobs in order, reads in parallel. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/cache/disk_format.h"
#include "actors/cache/disk_io.h"
#include "actors/cache/disk_store.h"

#define BB     1000u                  /* block bytes: one 4 KiB slot each */
#define MIB    (1u << 20)
#define FP     0x1234abcd5678ef01ULL
#define NOW    1700000000000LL        /* a wall clock for pins */

static char s_dir[256];

static int s_setup(void **st)
{
    snprintf(s_dir, sizeof s_dir, "/tmp/troupe-disk-test.XXXXXX");
    assert_non_null(mkdtemp(s_dir));
    return 0;
}

static int s_teardown(void **st)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", s_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void s_block(uint8_t *b, uint64_t seed)
{
    for (unsigned i = 0; i < BB; i++)
        b[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 3));
}

static dstore_t *s_open(uint64_t fp, uint64_t bytes)
{
    char err[256];
    dstore_t *s = dstore_open(s_dir, bytes, fp, err, sizeof err);
    if (!s)
        fail_msg("dstore_open: %s", err);
    return s;
}

static void s_format(dstore_t *s, dtype_t dt)
{
    char err[256];
    if (!s->formatted) {
        assert_int_equal(dstore_format(s, dt, 2, 16, 2, 8, BB, err, sizeof err), 0);
        assert_int_equal(dstore_write_file_hdr(s), 0);
    }
}

/* Writes block `seed` under hash through the store's two halves, as the actor does. */
static int64_t s_put(dstore_t *s, uint64_t hash, uint64_t seed, int64_t pin)
{
    uint8_t b[BB];
    s_block(b, seed);
    uint64_t victim;
    int64_t slot = dstore_alloc(s, hash, NOW, &victim);
    if (slot < 0)
        return -1;
    dstore_pin(s, slot, pin, pin ? 77 : 0);
    df_rec_t r;
    dstore_rec(s, slot, &r);
    assert_int_equal(dstore_write_slot(s, slot, &r, b), 0);
    dstore_written(s, slot, 1, r.payload_crc);
    return slot;
}

static dstore_read_t s_get(dstore_t *s, uint64_t hash, uint64_t seed)
{
    uint8_t b[BB], want[BB];
    char why[160] = "";
    int64_t slot = dstore_find(s, hash);
    assert_true(slot >= 0);
    dstore_read_t r = dstore_read_slot(s, slot, hash, b, why, sizeof why);
    if (r == DSTORE_READ_OK) {
        s_block(want, seed);
        assert_memory_equal(b, want, BB);
    }
    return r;
}

static void s_flip(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t c;
    assert_int_equal(pread(fd, &c, 1, off), 1);
    c ^= 0x10;
    assert_int_equal(pwrite(fd, &c, 1, off), 1);
    close(fd);
}

static off_t s_slot_off(int64_t slot)
{
    return (off_t)(DF_FILE_HDR_BYTES + (uint64_t)slot * df_slot_bytes(BB));
}

static void test_crc32c_known_value(void **st)
{
    /* The standard check value of CRC-32C. */
    assert_int_equal(df_crc32c(0, "123456789", 9), 0xe3069283u);
    assert_int_equal(df_crc32c(df_crc32c(0, "1234", 4), "56789", 5), 0xe3069283u);
}

static void test_record_roundtrip_and_refusals(void **st)
{
    df_rec_t r = {.hash = 42, .tenant = 7, .fingerprint = FP, .dtype = DT_BF16, .payload_crc = 9, .block_bytes = BB,
                  .seq = 3, .pin_until_ms = NOW, .written_ms = NOW - 5};
    uint8_t buf[DF_REC_HDR_BYTES];
    df_rec_encode(&r, buf);
    df_rec_t back;
    char why[128];
    assert_int_equal(df_rec_decode(buf, sizeof buf, &back, why, sizeof why), DF_OK);
    assert_memory_equal(&back, &r, sizeof r);
    /* Every byte of the encoded header is covered: any flip is refused. */
    for (unsigned i = 0; i < 76; i++) {
        buf[i] ^= 1;
        assert_int_equal(df_rec_decode(buf, sizeof buf, &back, why, sizeof why), DF_CORRUPT);
        buf[i] ^= 1;
    }
    assert_int_equal(df_rec_decode(buf, 40, &back, why, sizeof why), DF_CORRUPT);
    memset(buf, 0, sizeof buf);
    assert_int_equal(df_rec_decode(buf, sizeof buf, &back, why, sizeof why), DF_EMPTY);
    r.hash = 0;   /* encodes with a valid CRC, still refused */
    df_rec_encode(&r, buf);
    assert_int_equal(df_rec_decode(buf, sizeof buf, &back, why, sizeof why), DF_CORRUPT);
    assert_non_null(strstr(why, "hash"));
}

static void test_write_read_and_reload(void **st)
{
    dstore_t *s = s_open(FP, MIB);
    assert_int_equal(s->formatted, 0);
    s_format(s, DT_BF16);
    assert_int_equal(s->fh.n_slots, (MIB - DF_FILE_HDR_BYTES) / 4096);
    for (uint64_t h = 1; h <= 20; h++)
        assert_true(s_put(s, h * 1000003, h, h <= 5 ? NOW + 86400000 : 0) >= 0);
    for (uint64_t h = 1; h <= 20; h++)
        assert_int_equal(s_get(s, h * 1000003, h), DSTORE_READ_OK);
    dstore_destroy(&s);
    assert_null(s);

    /* A restart: the slot headers are the index. */
    s = s_open(FP, MIB);
    assert_int_equal(s->formatted, 1);
    assert_int_equal(s->loaded, 20);
    assert_int_equal(s->dropped_corrupt + s->dropped_foreign, 0);
    for (uint64_t h = 1; h <= 20; h++) {
        assert_int_equal(s_get(s, h * 1000003, h), DSTORE_READ_OK);
        const dslot_t *d = &s->slots[dstore_find(s, h * 1000003)];
        assert_int_equal(d->pin_until_ms, h <= 5 ? NOW + 86400000 : 0);
        assert_int_equal(d->tenant, h <= 5 ? 77 : 0);
    }
    uint64_t used, pinned, bytes;
    dstore_usage(s, NOW, &used, &pinned, &bytes);
    assert_int_equal(used, 20);
    assert_int_equal(pinned, 5);
    assert_int_equal(bytes, 20 * 4096);
    /* New writes after a reload take free slots, not the reloaded ones. */
    int64_t slot = s_put(s, 999, 999, 0);
    for (uint64_t h = 1; h <= 20; h++)
        assert_int_not_equal(slot, dstore_find(s, h * 1000003));
    dstore_destroy(&s);
}

static void test_pin_rewrite_survives_reload(void **st)
{
    dstore_t *s = s_open(FP, MIB);
    s_format(s, DT_F32);
    int64_t slot = s_put(s, 555, 5, 0);
    dstore_pin(s, slot, NOW + 3600000, 9);
    assert_int_equal(dstore_take_dirty(s), slot);
    assert_int_equal(dstore_take_dirty(s), -1);
    df_rec_t r;
    dstore_rec(s, slot, &r);
    assert_int_equal(dstore_write_rec(s, slot, &r), 0);
    dstore_destroy(&s);
    s = s_open(FP, MIB);
    assert_int_equal(s->slots[dstore_find(s, 555)].pin_until_ms, NOW + 3600000);
    assert_int_equal(s_get(s, 555, 5), DSTORE_READ_OK);   /* the payload CRC was kept */
    dstore_destroy(&s);
}

static void test_bit_flips_are_refused(void **st)
{
    dstore_t *s = s_open(FP, MIB);
    s_format(s, DT_BF16);
    int64_t a = s_put(s, 11, 1, 0), b = s_put(s, 22, 2, 0), c = s_put(s, 33, 3, 0);
    char path[1100];
    snprintf(path, sizeof path, "%s", s->path);
    s_flip(path, s_slot_off(a) + DF_REC_HDR_BYTES + 500);   /* a's payload */
    assert_int_equal(s_get(s, 11, 1), DSTORE_READ_CORRUPT);
    assert_int_equal(s_get(s, 22, 2), DSTORE_READ_OK);
    dstore_destroy(&s);
    s_flip(path, s_slot_off(b) + 9);                         /* b's header (its hash) */
    s = s_open(FP, MIB);
    assert_int_equal(s->loaded, 2);                          /* a's header is intact: refused on read */
    assert_int_equal(s->dropped_corrupt, 1);
    assert_int_equal(dstore_find(s, 22), -1);
    assert_int_equal(s_get(s, 11, 1), DSTORE_READ_CORRUPT);
    assert_int_equal(s_get(s, 33, 3), DSTORE_READ_OK);
    (void)c;
    dstore_destroy(&s);
    /* The refused header was cleared: not counted again at the next start. */
    s = s_open(FP, MIB);
    assert_int_equal(s->dropped_corrupt, 0);
    dstore_destroy(&s);
}

static void test_torn_writes_are_refused(void **st)
{
    dstore_t *s = s_open(FP, MIB);
    s_format(s, DT_BF16);
    int64_t a = s_put(s, 11, 1, 0);
    int64_t b = s_put(s, 22, 2, 0);
    /* A new header landed over a's slot, its payload did not (kill -9 between the pages). */
    df_rec_t r;
    dstore_rec(s, a, &r);
    r.hash = 44;
    r.payload_crc ^= 0x5555;
    assert_int_equal(dstore_write_rec(s, a, &r), 0);
    /* b's write stopped half-way through its payload at the end of the file. */
    char path[1100];
    snprintf(path, sizeof path, "%s", s->path);
    dstore_destroy(&s);
    assert_int_equal(truncate(path, s_slot_off(b) + DF_REC_HDR_BYTES + BB / 2), 0);
    s = s_open(FP, MIB);
    assert_int_equal(s->loaded, 2);
    assert_int_equal(s_get(s, 44, 1), DSTORE_READ_CORRUPT);
    assert_int_equal(s_get(s, 22, 2), DSTORE_READ_CORRUPT);
    assert_int_equal(dstore_find(s, 11), -1);
    dstore_destroy(&s);
}

static void test_other_model_or_dtype_is_refused(void **st)
{
    dstore_t *s = s_open(FP, MIB);
    s_format(s, DT_BF16);
    for (uint64_t h = 1; h <= 6; h++)
        s_put(s, h, h, 0);
    /* One record claims another dtype (a file pieced together): refused when read back. */
    int64_t slot = dstore_find(s, 6);
    df_rec_t r;
    dstore_rec(s, slot, &r);
    r.dtype = DT_F16;
    uint8_t b[BB];
    s_block(b, 6);
    assert_int_equal(dstore_write_slot(s, slot, &r, b), 0);
    dstore_destroy(&s);
    s = s_open(FP, MIB);
    assert_int_equal(s->loaded, 5);
    assert_int_equal(s->dropped_foreign, 1);
    dstore_destroy(&s);
    /* Another model: nothing is indexed, everything counted, the file starts over. */
    s = s_open(FP ^ 1, MIB);
    assert_int_equal(s->formatted, 0);
    assert_int_equal(s->loaded, 0);
    assert_int_equal(s->dropped_foreign, 5);
    assert_int_equal(dstore_find(s, 1), -1);
    dstore_destroy(&s);
    s = s_open(FP, MIB);   /* and the first model's blocks are gone for good */
    assert_int_equal(s->formatted, 0);
    assert_int_equal(s->loaded, 0);
    dstore_destroy(&s);
}

static void test_eviction_lru_pinned_last(void **st)
{
    const uint64_t bytes = DF_FILE_HDR_BYTES + 8 * 4096;   /* 8 slots: below the topology's minimum, fine here */
    dstore_t *s = s_open(FP, bytes);
    s_format(s, DT_BF16);
    assert_int_equal(s->fh.n_slots, 8);
    for (uint64_t h = 1; h <= 8; h++)
        assert_true(s_put(s, h, h, h <= 3 ? NOW + 1000 : 0) >= 0);
    dstore_touch(s, dstore_find(s, 4));   /* 4 is now the most recent: 5 is the oldest unpinned */
    uint64_t victim;
    int64_t slot = dstore_alloc(s, 100, NOW, &victim);
    assert_true(slot >= 0);
    assert_int_equal(victim, 5);
    assert_int_equal(dstore_find(s, 5), -1);
    dstore_written(s, slot, 1, 0);
    /* A slot being read is not taken either. */
    s->slots[dstore_find(s, 6)].readers = 1;
    assert_true((slot = dstore_alloc(s, 101, NOW, &victim)) >= 0);
    assert_int_equal(victim, 7);
    dstore_written(s, slot, 0, 0);   /* a failed write frees its slot */
    assert_int_equal(dstore_find(s, 101), -1);
    /* Pinned ones only go once their pin expired (wall clock). */
    for (uint64_t h = 200; h < 210; h++) {
        slot = dstore_alloc(s, h, NOW, &victim);
        if (slot < 0)
            break;
        assert_true(victim == 0 || victim > 3);   /* left writing: busy */
    }
    assert_true(dstore_alloc(s, 300, NOW, &victim) < 0);           /* 1..3 pinned, 6 busy, the rest writing */
    s->slots[dstore_find(s, 6)].readers = 0;
    assert_true(dstore_alloc(s, 301, NOW + 2000, &victim) >= 0);   /* pins expired */
    dstore_destroy(&s);
}

static void test_full_disk_is_an_error_not_a_crash(void **st)
{
    dstore_t *s = s_open(FP, MIB);
    s_format(s, DT_BF16);
    assert_true(s_put(s, 1, 1, 0) >= 0);
    /* The file may not grow past its current end: the next slot's write fails as a full disk does. */
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = (rlim_t)s_slot_off(2);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    uint64_t victim;
    int64_t slot;
    for (int k = 0; k < 3; k++)
        slot = dstore_alloc(s, 10 + (uint64_t)k, NOW, &victim);   /* slots 1, 2, 3 */
    uint8_t b[BB];
    s_block(b, 12);
    df_rec_t r;
    dstore_rec(s, slot, &r);
    int err = dstore_write_slot(s, slot, &r, b);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, prev);
    assert_true(err < 0);
    assert_true(dstore_errno_full(-err));
    dstore_written(s, slot, 0, 0);
    assert_int_equal(dstore_find(s, 12), -1);
    assert_int_equal(s_get(s, 1, 1), DSTORE_READ_OK);
    dstore_destroy(&s);
    /* A disk tier too small for one block is refused with a reason. */
    char why[256];
    s = s_open(FP, DF_FILE_HDR_BYTES + 100);
    assert_int_equal(dstore_format(s, DT_BF16, 2, 16, 2, 8, BB, why, sizeof why), -1);
    assert_non_null(strstr(why, "disk_bytes"));
    dstore_destroy(&s);
}

static void test_second_opener_is_refused(void **st)
{
    char err[256];
    dstore_t *s = s_open(FP, MIB);
    assert_null(dstore_open(s_dir, MIB, FP, err, sizeof err));
    assert_non_null(strstr(err, "in use"));
    dstore_destroy(&s);
}

static dio_job_t *s_wait_done(dio_t *d)
{
    zmq_pollitem_t it = {.socket = dio_socket(d), .events = ZMQ_POLLIN};
    for (int i = 0; i < 500; i++) {
        dio_job_t *j = dio_next_done(d);
        if (j)
            return j;
        zmq_poll(&it, 1, 10);
    }
    fail_msg("no completion from the disk thread");
    return NULL;
}

/* Holds each read until `want` reads are held at once (or 10 s passed, so a build that ran reads
 * one at a time fails the test instead of hanging it). */
typedef struct barrier {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived, want;
} barrier_t;

static void s_hold_read(void *arg, const dio_job_t *j)
{
    barrier_t *b = arg;
    pthread_mutex_lock(&b->mu);
    b->arrived++;
    pthread_cond_broadcast(&b->cv);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    while (b->arrived < b->want && pthread_cond_timedwait(&b->cv, &b->mu, &until) == 0)
        ;
    pthread_mutex_unlock(&b->mu);
}

static dio_job_t *s_submit(dio_t *d, dstore_t *s, dio_kind_t kind, uint64_t h)
{
    dio_job_t *j = dio_get(d);
    assert_non_null(j);
    j->kind = kind;
    j->hash = h;
    if (kind == DIO_WRITE) {
        uint64_t victim;
        j->slot = dstore_alloc(s, h, NOW, &victim);
        dstore_rec(s, j->slot, &j->rec);
        s_block(j->buf, h);
    } else {
        j->slot = dstore_find(s, h);
    }
    dio_submit(d, j);
    return j;
}

/* Four threads: a run of reads overlaps (a long prefix's fetch is not read one block after
 * another), while a write queued after them waits until they are over, and a read queued after the
 * write sees its block. */
static void test_io_threads_overlap_reads(void **st)
{
    void *ctx = zmq_ctx_new();
    char err[256];
    dstore_t *s = s_open(FP, MIB);
    assert_int_equal(dstore_format(s, DT_BF16, 2, 16, 2, 8, BB, err, sizeof err), 0);
    assert_null(dio_new(s, ctx, 16, 0, BB, err, sizeof err));
    assert_non_null(strstr(err, "I/O threads"));
    dio_t *d = dio_new(s, ctx, 16, 4, BB, err, sizeof err);
    assert_non_null(d);
    dio_job_t *j = dio_get(d);
    j->kind = DIO_FILE_HDR;
    dio_submit(d, j);
    for (uint64_t h = 1; h <= 8; h++)
        s_submit(d, s, DIO_WRITE, h);
    for (int k = 0; k < 9; k++) {
        j = s_wait_done(d);
        assert_int_equal(j->err, 0);
        if (j->kind == DIO_WRITE)
            dstore_written(s, j->slot, 1, j->rec.payload_crc);
        dio_put(d, j);
    }
    assert_int_equal(dio_reads_parallel_max(d), 0);

    barrier_t b = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER, .want = 4};
    dio_set_read_hook(d, s_hold_read, &b);
    for (uint64_t h = 1; h <= 8; h++)
        s_submit(d, s, DIO_READ, h);
    dio_job_t *w = s_submit(d, s, DIO_WRITE, 9);
    dio_job_t *r9 = s_submit(d, s, DIO_READ, 9);
    int reads_before_write = 0, saw_write = 0;
    for (int k = 0; k < 10; k++) {
        j = s_wait_done(d);
        if (j == w) {
            assert_int_equal(j->err, 0);
            assert_int_equal(reads_before_write, 8);   /* every earlier read was over */
            saw_write = 1;
            dstore_written(s, j->slot, 1, j->rec.payload_crc);
        } else {
            assert_int_equal(j->read, DSTORE_READ_OK);
            uint8_t want[BB];
            s_block(want, j->hash);
            assert_memory_equal(j->buf, want, BB);
            if (j == r9)
                assert_true(saw_write);   /* it started after the write ended */
            else
                reads_before_write++;
        }
        dio_put(d, j);
    }
    assert_int_equal(dio_reads_parallel_max(d), 4);
    dio_destroy(&d);
    dstore_destroy(&s);
    s = s_open(FP, MIB);
    assert_int_equal(s->loaded, 9);
    dstore_destroy(&s);
    zmq_ctx_term(ctx);
}

static void test_io_thread(void **st)
{
    void *ctx = zmq_ctx_new();
    char err[256];
    dstore_t *s = s_open(FP, MIB);
    assert_int_equal(dstore_format(s, DT_BF16, 2, 16, 2, 8, BB, err, sizeof err), 0);
    dio_t *d = dio_new(s, ctx, 4, 1, BB, err, sizeof err);
    assert_non_null(d);
    dio_job_t *j = dio_get(d);
    j->kind = DIO_FILE_HDR;
    dio_submit(d, j);
    for (uint64_t h = 1; h <= 3; h++) {
        j = dio_get(d);
        assert_non_null(j);
        uint64_t victim;
        j->kind = DIO_WRITE;
        j->hash = h;
        j->slot = dstore_alloc(s, h, NOW, &victim);
        dstore_rec(s, j->slot, &j->rec);
        s_block(j->buf, h);
        dio_submit(d, j);
    }
    assert_null(dio_get(d));   /* four jobs, all in flight: the caller sheds */
    assert_int_equal(dio_in_flight(d), 4);
    for (int k = 0; k < 4; k++) {
        j = s_wait_done(d);
        assert_int_equal(j->err, 0);
        if (j->kind == DIO_WRITE)
            dstore_written(s, j->slot, 1, j->rec.payload_crc);
        dio_put(d, j);
    }
    assert_int_equal(dio_in_flight(d), 0);
    for (uint64_t h = 1; h <= 3; h++) {
        j = dio_get(d);
        j->kind = DIO_READ;
        j->hash = h;
        j->slot = dstore_find(s, h);
        dio_submit(d, j);
        j = s_wait_done(d);
        assert_int_equal(j->read, DSTORE_READ_OK);
        uint8_t want[BB];
        s_block(want, h);
        assert_memory_equal(j->buf, want, BB);
        assert_true(j->ms >= 0);
        dio_put(d, j);
    }
    dio_destroy(&d);
    assert_null(d);
    dstore_destroy(&s);
    s = s_open(FP, MIB);
    assert_int_equal(s->loaded, 3);
    dstore_destroy(&s);
    zmq_ctx_term(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c_known_value),
        cmocka_unit_test(test_record_roundtrip_and_refusals),
        cmocka_unit_test_setup_teardown(test_write_read_and_reload, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_pin_rewrite_survives_reload, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_bit_flips_are_refused, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_torn_writes_are_refused, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_other_model_or_dtype_is_refused, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_eviction_lru_pinned_last, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_full_disk_is_an_error_not_a_crash, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_second_opener_is_refused, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_io_thread, s_setup, s_teardown),
        cmocka_unit_test_setup_teardown(test_io_threads_overlap_reads, s_setup, s_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
