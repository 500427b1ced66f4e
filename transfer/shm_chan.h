/* transfer/shm_chan.h — the shared-memory channel: how KV blocks move between processes of one node.
 *
 * Control and data are separate (DESIGN.md): a transfer description (a kv_announce, or inside a
 * handoff) says what is coming (transfer id, blocks, shapes, dtype, channel kind, a handle), the
 * bytes move here, the receiver answers with kv_ack. This file is the shared-memory channel (CPU
 * backend, same node; it cannot cross machines): the
 * sender creates one POSIX shm segment per transfer, named from the cluster and transfer id,
 * writes the blocks into it and passes the name as the announce's handle; the receiver maps it
 * read-only, copies into its own pool and acks; the sender then unlinks it. A transfer that is
 * not acked by its deadline is unlinked by the sender all the same, so no segment outlives its
 * transfer (and tchan_shm_sweep removes any left by a killed process at start-up).
 *
 * CUDA IPC (same GPU: kv_blocks.h), NCCL (two GPUs: nccl_chan.h, the links in kv_link.h) and tcp
 * (two nodes: tcp_chan.h) implement the same protocol; kv_chan.h puts them behind one interface. */
#ifndef TROUPE_SHM_CHAN_H
#define TROUPE_SHM_CHAN_H

#include <stddef.h>
#include <stdint.h>

#define TCHAN_HANDLE_MAX 96

typedef struct tchan_seg {
    char name[TCHAN_HANDLE_MAX];  /* "/troupe-<cluster>-<creator pid>-<transfer id>" */
    void *ptr;                    /* the mapping */
    size_t bytes;
    int owner;                    /* 1: we created it and unlink it on close */
} tchan_seg_t;

/* Sender: creates and maps a segment of `bytes` for transfer `id`. */
int  tchan_shm_create(tchan_seg_t *seg, const char *cluster, uint64_t id, size_t bytes,
                      char *err, size_t errlen);
/* Receiver: maps an announced segment read-only; checks its size is exactly `bytes` (a peer
 * cannot make us read past the mapping). */
int  tchan_shm_open(tchan_seg_t *seg, const uint8_t *handle, size_t handle_len, size_t bytes,
                    char *err, size_t errlen);
/* Unmaps; the owner also unlinks. Idempotent. */
void tchan_shm_close(tchan_seg_t *seg);
/* Removes segments of this cluster whose creator process is gone (after a kill -9). Returns how
 * many were removed. */
int  tchan_shm_sweep(const char *cluster);

#endif
