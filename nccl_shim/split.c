/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclCommSplit and ncclCommShrink without a bootstrap root: the ranks that take part trade
 * small blobs over the parent communicator's transport, each straight to every other
 * (one round, n - 1 messages each way; these are rare, small exchanges), first what decides
 * the new communicator (split: color and key), then the new transport workers' addresses.
 * Every member then connects its new worker to the others'. The child's identity mixes the
 * parent's with the parent's sequence number and the color, so it is equal on its members
 * and differs from every other communicator's. The sequence number is the members' highest,
 * sent with the addresses: ranks whose communicator failed may have given up in different
 * operations (one told of the failure before a message already on its way arrived), and a
 * shrink of theirs must still agree.
 *
 * ncclCommGrow is the other way round: new ranks have no parent to talk through, so every rank
 * joins a bootstrap root, as ncclCommInitRank does. One parent rank starts it
 * (ncclCommGetUniqueId) and hands its id to the new ranks itself; the parent's other ranks
 * learn it in one exchange over the parent, and keep their ranks.
 */
#include "split.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "bootstrap/bootstrap.h"
#include "comm.h"
#include "engine/connect.h"
#include "engine/exec.h"
#include "engine/exchange.h"
#include "engine/exec_device.h"


/* splitmix64's finalizer: spreads a few changed bits over the whole identity. */
static uint64_t
shim_split_mix(uint64_t x)
{
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Creates the child, trades worker addresses among `members` (parent ranks) and connects the
 * child to the ones in `group` (parent ranks in new-rank order; NULL: we take no part). */
static ncclResult_t
shim_split_build(struct ncclComm *parent, const int *members, int nmembers, int me,
                 const int *group, int ngroup, int new_rank, uint64_t salt, bool blocking,
                 struct ncclComm **newcomm_out)
{
    struct ncclComm *child = NULL;
    struct shim_blobs blobs;
    const void *addr = NULL, **addrs = NULL;
    size_t len = 0, *lens = NULL;
    uint64_t seq = parent->seq;
    uint8_t *hello = NULL;
    ncclResult_t res;

    if (group != NULL) {
        SHIM_CHECK(shim_comm_child_create(parent, new_rank, ngroup, blocking, &child));
        SHIM_CHECK_GOTO(shim_connect_address(child, &addr, &len), res, err_child);
    }
    /* Everyone takes part in the exchange with its sequence number, those without a new
     * communicator with nothing after it. */
    SHIM_CHECK_GOTO(shim_calloc(&hello, sizeof(seq) + len), res, err_child);
    memcpy(hello, &seq, sizeof(seq));
    if (len > 0) {
        memcpy(hello + sizeof(seq), addr, len);
    }
    res = shim_exchange_blobs(parent, members, nmembers, me, hello, sizeof(seq) + len, &blobs);
    free(hello);
    if (res != ncclSuccess) {
        goto err_child;
    }
    for (int m = 0; m < nmembers; m++) {
        uint64_t theirs;
        if (blobs.lens[m] < sizeof(theirs)) {
            WARN("rank %d: rank %d sent %zu bytes to make a communicator from, too few",
                 parent->rank, members[m], blobs.lens[m]);
            res = ncclRemoteError;
            goto err_blobs;
        }
        memcpy(&theirs, blobs.data + blobs.offsets[m], sizeof(theirs));
        seq = theirs > seq ? theirs : seq;
    }
    if (group == NULL) {
        shim_blobs_free(&blobs);
        *newcomm_out = NULL;
        return ncclSuccess;
    }
    SHIM_CHECK_GOTO(shim_calloc(&addrs, (size_t)ngroup), res, err_blobs);
    SHIM_CHECK_GOTO(shim_calloc(&lens, (size_t)ngroup), res, err_blobs);
    for (int r = 0; r < ngroup; r++) {
        int m = 0;
        while (members[m] != group[r]) { /* group is a subset of members */
            m++;
        }
        addrs[r] = blobs.data + blobs.offsets[m] + sizeof(seq);
        lens[r] = blobs.lens[m] - sizeof(seq);
    }
    uint64_t id_hash = shim_split_mix(parent->id_hash ^ shim_split_mix(seq + salt));
    SHIM_CHECK_GOTO(shim_comm_child_connect(child, id_hash, addrs, lens), res, err_blobs);
    free(addrs);
    free(lens);
    shim_blobs_free(&blobs);
    *newcomm_out = child;
    return ncclSuccess;

err_blobs:
    free(addrs);
    free(lens);
    shim_blobs_free(&blobs);
err_child:
    if (child != NULL) {
        shim_comm_child_discard(child);
    }
    return res;
}

struct shim_split_entry {
    int32_t color;
    int32_t key;
};

ncclResult_t
shim_comm_split(struct ncclComm *parent, int color, int key, bool blocking,
                struct ncclComm **newcomm_out)
{
    const int n = parent->nranks;
    struct shim_split_entry mine = {color, key};
    struct shim_blobs blobs;
    int *members = NULL, *group = NULL, ngroup = 0, new_rank = -1;
    ncclResult_t res;

    SHIM_CHECK(shim_everyone(parent, &members));
    SHIM_CHECK_GOTO(shim_exchange_blobs(parent, members, n, parent->rank, &mine, sizeof(mine),
                                        &blobs),
                    res, out);
    const struct shim_split_entry *all = (const void *)blobs.data;
    if (color != NCCL_SPLIT_NOCOLOR) {
        /* Our color's ranks by (key, parent rank): insertion keeps it stable and simple. */
        SHIM_CHECK_GOTO(shim_calloc(&group, (size_t)n), res, out_blobs);
        for (int r = 0; r < n; r++) {
            if (all[r].color != color) {
                continue;
            }
            int at = ngroup++;
            while (at > 0 && all[group[at - 1]].key > all[r].key) {
                group[at] = group[at - 1];
                at--;
            }
            group[at] = r;
        }
        for (int i = 0; i < ngroup; i++) {
            new_rank = group[i] == parent->rank ? i : new_rank;
        }
    }
    res = shim_split_build(parent, members, n, parent->rank, group, ngroup, new_rank,
                           (uint64_t)(uint32_t)color << 1, blocking, newcomm_out);
    if (res == ncclSuccess && *newcomm_out != NULL) {
        INFO(SHIM_INIT, "comm %p rank %d: split color %d key %d -> comm %p rank %d of %d",
             (void *)parent, parent->rank, color, key, (void *)*newcomm_out, new_rank, ngroup);
    }
out_blobs:
    shim_blobs_free(&blobs);
out:
    free(group);
    free(members);
    return res;
}

ncclResult_t
shim_comm_shrink(struct ncclComm *parent, const int *exclude, int nexclude, bool blocking,
                 struct ncclComm **newcomm_out)
{
    const int n = parent->nranks;
    bool *gone;
    int *members, nmembers = 0, me = -1;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&gone, (size_t)n));
    for (int i = 0; i < nexclude; i++) {
        if (exclude[i] < 0 || exclude[i] >= n || exclude[i] == parent->rank) {
            WARN("ncclCommShrink: rank %d cannot exclude %d from %d ranks%s", parent->rank,
                 exclude[i], n, exclude[i] == parent->rank ? " (itself)" : "");
            free(gone);
            return ncclInvalidArgument;
        }
        gone[exclude[i]] = true;
    }
    SHIM_CHECK_GOTO(shim_calloc(&members, (size_t)n), res, out_gone);
    for (int r = 0; r < n; r++) {
        if (!gone[r]) {
            me = r == parent->rank ? nmembers : me;
            members[nmembers++] = r;
        }
    }
    res = shim_split_build(parent, members, nmembers, me, members, nmembers, me,
                           0x5348524bULL << 1 | 1, blocking, newcomm_out);
    if (res == ncclSuccess) {
        INFO(SHIM_INIT, "comm %p rank %d: shrink by %d ranks -> comm %p rank %d of %d",
             (void *)parent, parent->rank, nexclude, (void *)*newcomm_out, me, nmembers);
    }
    free(members);
out_gone:
    free(gone);
    return res;
}

/* --- grow ----------------------------------------------------------------------------------- */

ncclResult_t
shim_comm_grow_id(struct ncclComm *parent, ncclUniqueId *id_out)
{
    if (parent->grow_id_pending) {
        WARN("ncclCommGetUniqueId: the id this rank made before has not grown the communicator "
             "yet (one id at a time)");
        return ncclInvalidUsage;
    }
    SHIM_CHECK(shim_bootstrap_fresh_id(&parent->grow_id));
    parent->grow_id_pending = true;
    *id_out = parent->grow_id;
    return ncclSuccess;
}

/* What each parent rank says before growing: whether it holds the id, and the id. */
struct shim_grow_entry {
    uint8_t has_id;
    ncclUniqueId id;
};

ncclResult_t
shim_comm_grow(struct ncclComm *parent, int nranks, const ncclUniqueId *id, bool blocking,
               struct ncclComm **newcomm_out)
{
    const int n = parent->nranks;
    struct shim_grow_entry mine = {0};
    struct shim_blobs blobs;
    int *members = NULL, holder = -1, holders = 0;
    ncclResult_t res;

    if (id != NULL && (!parent->grow_id_pending ||
                       memcmp(id, &parent->grow_id, sizeof(*id)) != 0)) {
        WARN("ncclCommGrow: the id is not the one ncclCommGetUniqueId gave this rank last, or "
             "it grew the communicator already (each id serves one grow)");
        return ncclInvalidUsage;
    }
    if (id != NULL) {
        mine.has_id = 1;
        mine.id = *id;
    }
    SHIM_CHECK(shim_everyone(parent, &members));
    SHIM_CHECK_GOTO(shim_exchange_blobs(parent, members, n, parent->rank, &mine, sizeof(mine),
                                        &blobs),
                    res, out);
    for (int r = 0; r < n; r++) {
        const struct shim_grow_entry *e = (const void *)(blobs.data + blobs.offsets[r]);
        if (blobs.lens[r] == sizeof(*e) && e->has_id) {
            holder = holders++ == 0 ? r : holder;
        }
    }
    if (holders != 1) {
        WARN("ncclCommGrow: %d ranks of the communicator passed a unique id; exactly one must "
             "(the one that called ncclCommGetUniqueId)", holders);
        res = ncclInvalidUsage;
        goto out_blobs;
    }
    const struct shim_grow_entry *chosen = (const void *)(blobs.data + blobs.offsets[holder]);
    struct shim_comm_args args = {.nranks = nranks, .rank = parent->rank, .id = chosen->id,
                                  .blocking = blocking, .cuda_dev = parent->cuda_dev,
                                  .cuda_dev_chosen = parent->cuda_dev_chosen};
    res = shim_comm_init(&args, newcomm_out);
    if (res == ncclSuccess || res == ncclInProgress) {
        if (id != NULL) {
            parent->grow_id_pending = false; /* consumed */
        }
        INFO(SHIM_INIT, "comm %p rank %d: grown from %d to %d ranks -> comm %p", (void *)parent,
             parent->rank, n, nranks, (void *)*newcomm_out);
    }
out_blobs:
    shim_blobs_free(&blobs);
out:
    free(members);
    return res;
}
