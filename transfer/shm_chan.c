#include "transfer/shm_chan.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"

int tchan_shm_create(tchan_seg_t *seg, const char *cluster, uint64_t id, size_t bytes, char *err,
                     size_t errlen)
{
    memset(seg, 0, sizeof *seg);
    if (bytes == 0)
        return errf(err, errlen, "shm transfer %llu: zero bytes", (unsigned long long)id);
    snprintf(seg->name, sizeof seg->name, "/troupe-%s-%d-%llu", cluster, (int)getpid(),
             (unsigned long long)id);
    int fd = shm_open(seg->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return errf(err, errlen, "shm_open %s: %s", seg->name, strerror(errno));
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        shm_unlink(seg->name);
        return errf(err, errlen, "ftruncate %s to %zu bytes: %s", seg->name, bytes, strerror(e));
    }
    seg->ptr = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (seg->ptr == MAP_FAILED) {
        seg->ptr = NULL;
        shm_unlink(seg->name);
        return errf(err, errlen, "mmap %s: %s", seg->name, strerror(errno));
    }
    seg->bytes = bytes;
    seg->owner = 1;
    return 0;
}

int tchan_shm_open(tchan_seg_t *seg, const uint8_t *handle, size_t handle_len, size_t bytes,
                   char *err, size_t errlen)
{
    memset(seg, 0, sizeof *seg);
    if (handle_len < 2 || handle_len >= sizeof seg->name || handle[0] != '/' ||
        memchr(handle + 1, '/', handle_len - 1) || memchr(handle, 0, handle_len))
        return errf(err, errlen, "shm handle is not a segment name");
    memcpy(seg->name, handle, handle_len);
    seg->name[handle_len] = 0;
    if (strncmp(seg->name, "/troupe-", 8) != 0)
        return errf(err, errlen, "shm handle %s is not a troupe segment", seg->name);
    int fd = shm_open(seg->name, O_RDONLY, 0);
    if (fd < 0)
        return errf(err, errlen, "shm_open %s: %s", seg->name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || (size_t)st.st_size != bytes) {
        close(fd);
        return errf(err, errlen, "shm %s holds %lld bytes, the announce says %zu", seg->name,
                    (long long)st.st_size, bytes);
    }
    seg->ptr = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (seg->ptr == MAP_FAILED) {
        seg->ptr = NULL;
        return errf(err, errlen, "mmap %s: %s", seg->name, strerror(errno));
    }
    seg->bytes = bytes;
    return 0;
}

void tchan_shm_close(tchan_seg_t *seg)
{
    if (seg->ptr)
        munmap(seg->ptr, seg->bytes);
    if (seg->owner && seg->name[0])
        shm_unlink(seg->name);
    memset(seg, 0, sizeof *seg);
}

int tchan_shm_sweep(const char *cluster)
{
    char prefix[128];
    int plen = snprintf(prefix, sizeof prefix, "troupe-%s-", cluster);
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0)
            continue;
        int pid = atoi(e->d_name + plen);
        if (pid > 0 && (kill(pid, 0) == 0 || errno == EPERM))
            continue;   /* its creator lives: the transfer may still be in flight */
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}
