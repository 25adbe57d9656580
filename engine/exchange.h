/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Management exchanges: every member of a communicator sends a blob of its own to every other
 * and receives theirs, over the communicator's transport with management tags (one round,
 * n - 1 messages each way). For rare, small exchanges: split, shrink and grow agreeing on a
 * new communicator, windows trading their remote keys. Collective over the members.
 */
#ifndef SHIM_EXCHANGE_H
#define SHIM_EXCHANGE_H

#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

struct ncclComm;

/* A blob of a few hundred bytes is the rule; anything far beyond is a broken peer. */
#define SHIM_EXCHANGE_MAX_BLOB (1u << 20)

/* What an exchange returns: member i's blob is data + offsets[i], lens[i] bytes long. */
struct shim_blobs {
    uint8_t *data;
    size_t *offsets;
    size_t *lens;
};

void shim_blobs_free(struct shim_blobs *blobs);

/* Every rank of comm, in order: the members of an exchange among all of them. */
ncclResult_t shim_everyone(const struct ncclComm *comm, int **members_out);

/* Sends `blob` (len bytes) to every other member and receives theirs; members are ranks of
 * comm, ours is members[me]. Lengths travel first, so blobs may differ in size. Device
 * operations still running on comm's thread finish first (their failure does not stop it). */
ncclResult_t shim_exchange_blobs(struct ncclComm *comm, const int *members, int nmembers,
                                 int me, const void *blob, size_t len,
                                 struct shim_blobs *blobs_out);

#endif
