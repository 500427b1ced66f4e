/* tools/bench_disk.c — troupe-bench-disk: the disk tier's store (actors/cache/) on this machine's
 * disk: write N blocks of a model's KV block size through the I/O threads, drop them from the page
 * cache, read them back (checksums verified) and print the bandwidths and per-block read times.
 *
 *   troupe-bench-disk --dir DIR [--block-bytes B] [--blocks N] [--jobs J] [--threads T]
 *
 * --threads (default 4, the cache-manager's) is how many I/O threads read at once: writes run one
 * at a time whatever it is, so --threads 1 against 4 shows what parallel reads give on this disk.
 *
 * --block-bytes defaults to 2097152: one 16-token block of a Llama-3.1-8B-shaped model in bf16
 * (32 layers x 2 x 8 KV heads x 128 x 16 x 2 bytes). The file (DIR/blocks.kvd) is removed after. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "actors/cache/disk_io.h"
#include "actors/cache/disk_store.h"
#include "common/util.h"

static int s_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Waits for one finished job. */
static dio_job_t *s_wait(dio_t *d)
{
    zmq_pollitem_t it = {.socket = dio_socket(d), .events = ZMQ_POLLIN};
    for (;;) {
        dio_job_t *j = dio_next_done(d);
        if (j)
            return j;
        zmq_poll(&it, 1, 100);
    }
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    long long bb = 2097152, n = 256, jobs = 16, threads = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--block-bytes") && i + 1 < argc) bb = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--blocks") && i + 1 < argc) n = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--jobs") && i + 1 < argc) jobs = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoll(argv[++i]);
        else {
            fprintf(stderr, "usage: troupe-bench-disk --dir DIR [--block-bytes B] [--blocks N] [--jobs J] [--threads T]\n");
            return 2;
        }
    }
    if (!dir || bb < 1 || bb > (1LL << 30) || n < 1 || n > 1000000 || jobs < 1 || jobs > 1024 || threads < 1 ||
        threads > DIO_MAX_THREADS) {
        fprintf(stderr, "troupe-bench-disk: --dir is required; --block-bytes 1..2^30, --blocks 1..10^6, --jobs 1..1024, "
                        "--threads 1..%d\n", DIO_MAX_THREADS);
        return 2;
    }
    char err[512];
    const uint64_t bytes = DF_FILE_HDR_BYTES + (uint64_t)n * df_slot_bytes((uint64_t)bb);
    dstore_t *s = dstore_open(dir, bytes, 0x5eed, err, sizeof err);
    if (!s || dstore_format(s, DT_BF16, 32, 16, 8, 128, (uint64_t)bb, err, sizeof err) != 0) {
        fprintf(stderr, "troupe-bench-disk: %s\n", err);
        return 1;
    }
    void *ctx = zmq_ctx_new();
    dio_t *d = dio_new(s, ctx, (int)jobs, (int)threads, (size_t)bb, err, sizeof err);
    if (!d) {
        fprintf(stderr, "troupe-bench-disk: %s\n", err);
        return 1;
    }
    dio_job_t *j = dio_get(d);
    j->kind = DIO_FILE_HDR;
    dio_submit(d, j);
    dio_put(d, s_wait(d));
    double *ms = calloc((size_t)n, sizeof *ms);
    for (int pass = 0; pass < 2; pass++) {
        int64_t t0 = now_ns();
        long long sent = 0, done = 0, bad = 0;
        while (done < n) {
            while (sent < n && (j = dio_get(d)) != NULL) {
                uint64_t victim;
                const uint64_t h = (uint64_t)sent + 1;
                j->hash = h;
                if (pass == 0) {
                    j->kind = DIO_WRITE;
                    j->slot = dstore_alloc(s, h, 0, &victim);
                    dstore_rec(s, j->slot, &j->rec);
                    memset(j->buf, (int)(h * 37), (size_t)bb);
                } else {
                    j->kind = DIO_READ;
                    j->slot = dstore_find(s, h);
                }
                dio_submit(d, j);
                sent++;
            }
            j = s_wait(d);
            if (pass == 0)
                dstore_written(s, j->slot, j->err == 0, j->rec.payload_crc);
            else
                bad += j->read != DSTORE_READ_OK;
            bad += pass == 0 && j->err != 0;
            ms[done++] = j->ms;
            dio_put(d, j);
        }
        if (pass == 0) {
            fdatasync(s->fd);
            posix_fadvise(s->fd, 0, 0, POSIX_FADV_DONTNEED);   /* the reads come from the disk */
        }
        const double secs = (double)(now_ns() - t0) / 1e9;
        qsort(ms, (size_t)n, sizeof *ms, s_cmp);
        printf("%s %lld blocks of %lld bytes: %.2f s, %.0f MiB/s; per block p50 %.2f ms, p99 %.2f ms%s\n",
               pass == 0 ? "write" : "read ", n, bb, secs, (double)n * (double)bb / secs / (1 << 20), ms[n / 2],
               ms[(size_t)((double)(n - 1) * 0.99)], bad ? " (SOME FAILED)" : "");
        if (pass == 1)
            printf("reads: %lld I/O threads, at most %d reads at once\n", threads, dio_reads_parallel_max(d));
        if (bad)
            return 1;
    }
    free(ms);
    dio_destroy(&d);
    char path[1200];
    snprintf(path, sizeof path, "%s", s->path);
    dstore_destroy(&s);
    unlink(path);
    zmq_ctx_term(ctx);
    return 0;
}
