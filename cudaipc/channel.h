/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The team's Unix socket (channel.c): the leader listens on an abstract name (nothing in the
 * file system to leave behind), the others connect on their first need and send it file
 * descriptors with SCM_RIGHTS: a cuMem allocation exported as a POSIX file descriptor, or a
 * staging segment; and, without one, word that the leader may let a mapping go (exports.c).
 * SOCK_SEQPACKET keeps each message and its descriptor together, and the messages in order.
 */
#ifndef CIPC_CHANNEL_H
#define CIPC_CHANNEL_H

#include <nccl.h>
#include <stdint.h>

#define CIPC_CHANNEL_NAME_MAX 100

enum cipc_msg_kind {
    CIPC_FD_CUMEM = 1,   /* key: the allocation's id in its owner */
    CIPC_FD_STAGING = 2, /* key: the staging segment's generation */
    CIPC_FORGET = 3      /* no descriptor: the sender's (how, key) is no longer in use */
};

/* A staging segment that is a cuMem allocation of pinned host memory (gpu_host_cumem_alloc),
 * mapped by import; without the flag, shared memory to register (gpu_host_import). */
#define CIPC_STAGING_CUMEM 1u

struct cipc_channel_msg {
    uint32_t kind;  /* enum cipc_msg_kind */
    int32_t rank;   /* the sender */
    uint32_t how;   /* FORGET: the enum cipc_buf_how the key is of */
    uint32_t flags; /* STAGING: CIPC_STAGING_CUMEM */
    uint64_t key;
    uint64_t size;  /* bytes behind the descriptor */
};

/* A listening socket under a fresh abstract name (written to name_out, NUL-terminated). */
ncclResult_t cipc_channel_listen(char name_out[CIPC_CHANNEL_NAME_MAX], int *fd_out);
/* One attempt: 0, or the errno value (ECONNREFUSED while nobody listens under name). */
int cipc_channel_connect(const char *name, int *fd_out);
/* Sends msg with passed_fd attached (none if -1); ncclSystemError or ncclRemoteError (with a
 * WARN) if the socket refuses. */
ncclResult_t cipc_channel_send(int fd, const struct cipc_channel_msg *msg, int passed_fd);
/* One pending connection accepted into *conn_out: 0, or EAGAIN when none is pending. */
int cipc_channel_accept(int listen_fd, int *conn_out);
/* One message and its descriptor (-1 if it came without one): 0; EAGAIN when none is
 * waiting; another errno value when the connection failed or closed (ENOTCONN for an orderly
 * close). */
int cipc_channel_recv(int fd, struct cipc_channel_msg *msg_out, int *passed_fd_out);

#endif
