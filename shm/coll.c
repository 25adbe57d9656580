/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Collectives on a shared-memory team (see shm.h for the chunk protocol). This file is the
 * geometry (how a collective walks its buffers in chunks, who reads whose slot) and the
 * per-collective work of each phase.
 *
 * Reductions come in two shapes. Small ones are direct: every rank fills its whole chunk and
 * reduces all n slots itself, in rank order, so all ranks compute bit-identical results with
 * one flag wait. Large ones are two-phase: the chunk is cut in n shares (on 64-byte
 * boundaries), rank j reduces share j out of every slot into its result slot, and every rank
 * copies all shares out; each byte is reduced once, by one rank, so results are identical too.
 * A rank never copies what only it reads (its own share, its own block): it reads that
 * straight from its user buffer.
 */
#include <stdio.h>
#include <string.h>

#include "region.h"

bool
shm_serves(enum alg_coll coll)
{
    return coll <= ALG_COLL_SCATTER;
}

/* A slot holds one piece per destination rank for the collectives that send each rank its
 * own block; one piece otherwise. */
static int
shm_pieces(enum alg_coll coll, int nranks)
{
    switch (coll) {
    case ALG_COLL_REDUCESCATTER:
    case ALG_COLL_ALLTOALL:
    case ALG_COLL_SCATTER:
        return nranks;
    default:
        return 1;
    }
}

void
shm_op_init(struct shm_op *op, const struct shm_team *team, const struct shm_coll_args *args)
{
    const size_t bytes = args->count * args->elem_size;
    const int pieces = shm_pieces(args->coll, team->nranks);
    size_t chunk = (team->slot_bytes / (size_t)pieces) & ~(size_t)63;

    memset(op, 0, sizeof(*op));
    op->args = *args;
    op->block = bytes;
    op->two_phase = (args->coll == ALG_COLL_ALLREDUCE || args->coll == ALG_COLL_REDUCE) &&
                    bytes > team->direct_bytes;
    if (chunk >= bytes) {
        chunk = bytes;
    } else {
        /* Even chunks, so the last one is not a sliver that costs a whole round of flags. */
        size_t nchunks = (bytes + chunk - 1) / chunk;
        chunk = ((bytes + nchunks - 1) / nchunks + 63) & ~(size_t)63;
    }
    op->chunk = chunk;
    op->phase = SHM_PHASE_START;
}

/* Whether rank r reads rank j's data slot in phase 1. */
static bool
shm_reads_data(const struct shm_op *op, int r, int j)
{
    const int root = op->args.root;

    if (j == r) {
        return false;
    }
    switch (op->args.coll) {
    case ALG_COLL_REDUCE:
        return op->two_phase || r == root;
    case ALG_COLL_GATHER:
        return r == root;
    case ALG_COLL_BROADCAST:
    case ALG_COLL_SCATTER:
        return j == root;
    default:
        return true;
    }
}

/* Whether rank r reads rank j's result slot in phase 2 (two-phase reductions). */
static bool
shm_reads_result(const struct shm_op *op, int r, int j)
{
    return j != r && (op->args.coll == ALG_COLL_ALLREDUCE || r == op->args.root);
}

/* Share j of a chunk of len bytes: n near-equal runs of 64-byte units. */
static void
shm_share(size_t len, int n, int j, size_t *start_out, size_t *len_out)
{
    size_t units = (len + 63) / 64, first, count;
    alg_block(units, n, j, &first, &count);
    size_t start = first * 64 < len ? first * 64 : len;
    size_t end = (first + count) * 64 < len ? (first + count) * 64 : len;
    *start_out = start;
    *len_out = end - start;
}

/* Copies a rank's own input into shared memory, scaled by its PreMulSum scalar if any. */
static void
shm_put(const struct shm_op *op, void *dst, const void *src, size_t bytes)
{
    if (op->args.prescale) {
        kr_reduce_host(dst, src, NULL, bytes / op->args.elem_size, &op->args.redop, KR_PRE_A);
    } else {
        kr_copy_host(dst, src, bytes);
    }
}

/* dst = srcs[0] op srcs[1] op ... in order; srcs[0] is raw own input when own_first (scaled
 * here), the others are already scaled. dst may alias srcs[0] exactly. */
static void
shm_reduce(const struct shm_op *op, void *dst, const void *const *srcs, int nsrcs,
           bool own_first, size_t bytes)
{
    const size_t count = bytes / op->args.elem_size;
    unsigned flags = (own_first && op->args.prescale) ? KR_PRE_A : 0;

    for (int k = 1; k < nsrcs; k++) {
        unsigned last = k == nsrcs - 1 ? KR_POST : 0;
        kr_reduce_host(dst, k == 1 ? srcs[0] : dst, srcs[k], count, &op->args.redop,
                       flags | last);
        flags = 0;
    }
}

/* --- the phases, per collective ------------------------------------------------------------- */

struct shm_ctx {
    struct shm_team *team;
    struct shm_op *op;
    size_t len;          /* bytes in this chunk */
    const uint8_t *send;
    uint8_t *recv;
};

static uint8_t *
shm_data(const struct shm_ctx *c, int j)
{
    return shm_region_data(c->team->regions[j], c->team->slot_bytes, c->op->s);
}

static uint8_t *
shm_result(const struct shm_ctx *c, int j)
{
    return shm_region_result(c->team->regions[j], c->team->slot_bytes, c->op->s);
}

static void
shm_fill(const struct shm_ctx *c)
{
    const struct shm_op *op = c->op;
    const int r = c->team->rank, n = c->team->nranks, root = op->args.root;
    const size_t off = op->off, len = c->len, block = op->block, piece = op->chunk;
    uint8_t *slot = shm_data(c, r);

    switch (op->args.coll) {
    case ALG_COLL_ALLREDUCE:
    case ALG_COLL_REDUCE:
        if (!op->two_phase) {
            shm_put(op, slot, c->send + off, len);
        } else {
            /* Everything but my own share, which only I read. */
            size_t start, share;
            shm_share(len, n, r, &start, &share);
            shm_put(op, slot, c->send + off, start);
            shm_put(op, slot + start + share, c->send + off + start + share,
                    len - start - share);
        }
        break;
    case ALG_COLL_BROADCAST:
        if (r == root) {
            kr_copy_host(slot, c->send + off, len);
        }
        break;
    case ALG_COLL_ALLGATHER:
        kr_copy_host(slot, c->send + off, len);
        break;
    case ALG_COLL_GATHER:
        if (r != root) {
            kr_copy_host(slot, c->send + off, len);
        }
        break;
    case ALG_COLL_REDUCESCATTER:
    case ALG_COLL_ALLTOALL:
    case ALG_COLL_SCATTER:
        if (op->args.coll == ALG_COLL_SCATTER && r != root) {
            break;
        }
        for (int j = 0; j < n; j++) {
            if (j != r) {
                const uint8_t *src = c->send + (size_t)j * block + off;
                if (op->args.coll == ALG_COLL_REDUCESCATTER) {
                    shm_put(op, slot + (size_t)j * piece, src, len);
                } else {
                    kr_copy_host(slot + (size_t)j * piece, src, len);
                }
            }
        }
        break;
    default:
        break;
    }
}

/* Reduction of share (or whole chunk) [start, start + bytes) out of every rank's slot, own
 * input first from the user's buffer when own_from_send. */
static void
shm_reduce_slots(const struct shm_ctx *c, void *dst, size_t slot_off, const uint8_t *own,
                 size_t bytes)
{
    const int r = c->team->rank, n = c->team->nranks;
    const void **srcs = c->team->srcs;
    int k = 0;

    if (own != NULL) {
        srcs[k++] = own;
    }
    for (int j = 0; j < n; j++) {
        if (own == NULL || j != r) {
            srcs[k++] = shm_data(c, j) + slot_off;
        }
    }
    shm_reduce(c->op, dst, srcs, k, own != NULL, bytes);
}

static void
shm_phase1(const struct shm_ctx *c)
{
    const struct shm_op *op = c->op;
    const int r = c->team->rank, n = c->team->nranks, root = op->args.root;
    const size_t off = op->off, len = c->len, block = op->block, piece = op->chunk;

    switch (op->args.coll) {
    case ALG_COLL_ALLREDUCE:
    case ALG_COLL_REDUCE:
        if (op->two_phase) {
            size_t start, share;
            shm_share(len, n, r, &start, &share);
            shm_reduce_slots(c, shm_result(c, r) + start, start, c->send + off + start, share);
        } else if (op->args.coll == ALG_COLL_ALLREDUCE || r == root) {
            /* All from the slots, in rank order: identical on every rank, and safe in place. */
            shm_reduce_slots(c, c->recv + off, 0, NULL, len);
        }
        break;
    case ALG_COLL_BROADCAST:
        kr_copy_host(c->recv + off, r == root ? c->send + off : shm_data(c, root), len);
        break;
    case ALG_COLL_ALLGATHER:
    case ALG_COLL_GATHER:
        if (op->args.coll == ALG_COLL_GATHER && r != root) {
            break;
        }
        for (int j = 0; j < n; j++) {
            kr_copy_host(c->recv + (size_t)j * block + off,
                         j == r ? c->send + off : shm_data(c, j), len);
        }
        break;
    case ALG_COLL_REDUCESCATTER:
        shm_reduce_slots(c, c->recv + off, (size_t)r * piece, c->send + (size_t)r * block + off,
                         len);
        break;
    case ALG_COLL_ALLTOALL:
        for (int j = 0; j < n; j++) {
            kr_copy_host(c->recv + (size_t)j * block + off,
                         j == r ? c->send + (size_t)r * block + off
                                : shm_data(c, j) + (size_t)r * piece,
                         len);
        }
        break;
    case ALG_COLL_SCATTER:
        kr_copy_host(c->recv + off,
                     r == root ? c->send + (size_t)r * block + off
                               : shm_data(c, root) + (size_t)r * piece,
                     len);
        break;
    default:
        break;
    }
}

/* Two-phase reductions: copy every rank's reduced share out of its result slot. */
static void
shm_phase2(const struct shm_ctx *c)
{
    const struct shm_op *op = c->op;
    const int r = c->team->rank, n = c->team->nranks;

    if (op->args.coll == ALG_COLL_REDUCE && r != op->args.root) {
        return;
    }
    for (int j = 0; j < n; j++) {
        size_t start, share;
        shm_share(c->len, n, j, &start, &share);
        kr_copy_host(c->recv + op->off + start, shm_result(c, j) + start, share);
    }
}

/* --- the state machine ---------------------------------------------------------------------- */

/* Whether every rank j for which reads(op, j, me) / reads(op, me, j) holds posted seq on the
 * chosen flag; else *wait names the first that has not. */
static bool
shm_all_reached(struct shm_team *team, const struct shm_op *op, size_t flag_offset,
                bool (*reads)(const struct shm_op *, int, int), uint32_t seq,
                struct shm_wait *wait)
{
    for (int j = 0; j < team->nranks; j++) {
        if (reads != NULL && !reads(op, team->rank, j)) {
            continue;
        }
        struct shm_flag *flag = (struct shm_flag *)((uint8_t *)team->regions[j] + flag_offset);
        if (!shm_flag_reached(flag, seq, j, wait)) {
            return false;
        }
    }
    return true;
}

static void
shm_post(struct shm_team *team, size_t flag_offset, uint32_t seq)
{
    shm_flag_post((struct shm_flag *)((uint8_t *)team->regions[team->rank] + flag_offset), seq);
}

#define SHM_FLAG(name) offsetof(struct shm_region, name)

enum shm_status
shm_op_progress(struct shm_op *op, struct shm_team *team, struct shm_wait *wait_out)
{
    struct shm_ctx c = {.team = team, .op = op, .send = op->args.send, .recv = op->args.recv};
    enum shm_status status = SHM_BLOCKED;

    for (;;) {
        c.len = op->block - op->off < op->chunk ? op->block - op->off : op->chunk;
        switch (op->phase) {
        case SHM_PHASE_START:
            if (op->block == 0) {
                op->phase = SHM_PHASE_DONE;
                return SHM_DONE;
            }
            if (team->owner != NULL && team->owner != op) {
                /* An earlier op of the same group still has the slots. */
                wait_out->addr = NULL;
                return status;
            }
            team->owner = op;
            op->s = ++team->seq;
            op->phase = SHM_PHASE_FILL;
            break;
        case SHM_PHASE_FILL:
            /* Slot s % 2 is free once every rank is done with chunk s - 2. */
            if (!shm_all_reached(team, op, SHM_FLAG(consumed), NULL, op->s - 2, wait_out)) {
                return status;
            }
            shm_fill(&c);
            shm_post(team, SHM_FLAG(ready), op->s);
            op->phase = SHM_PHASE_READ;
            break;
        case SHM_PHASE_READ:
            if (!shm_all_reached(team, op, SHM_FLAG(ready), shm_reads_data, op->s, wait_out)) {
                return status;
            }
            shm_phase1(&c);
            shm_post(team, SHM_FLAG(reduced), op->s);
            op->phase = SHM_PHASE_GATHER;
            break;
        case SHM_PHASE_GATHER:
            if (op->two_phase) {
                if (!shm_all_reached(team, op, SHM_FLAG(reduced), shm_reads_result, op->s,
                                     wait_out)) {
                    return status;
                }
                shm_phase2(&c);
            }
            shm_post(team, SHM_FLAG(consumed), op->s);
            op->off += c.len;
            if (op->off >= op->block) {
                team->owner = NULL;
                op->phase = SHM_PHASE_DONE;
                return SHM_DONE;
            }
            op->s = ++team->seq;
            op->phase = SHM_PHASE_FILL;
            break;
        case SHM_PHASE_DONE:
            return SHM_DONE;
        }
        status = SHM_MOVED;
    }
}

int
shm_op_describe(const struct shm_op *op, const struct shm_wait *wait, char *buf, size_t len)
{
    static const char *const phase_names[] = {"start", "fill", "read", "gather", "done"};
    const char *flag = "another op's turn";

    if (wait != NULL && wait->addr != NULL) {
        flag = "a flag";
    }
    return snprintf(buf, len, "shared memory, chunk %zu/%zu (sequence %u), phase %s, waiting "
                    "for %s of rank %d (seen %u)", op->chunk ? op->off / op->chunk : 0,
                    op->chunk ? (op->block + op->chunk - 1) / op->chunk : 0, op->s,
                    phase_names[op->phase], flag, wait != NULL ? wait->peer : -1,
                    wait != NULL ? wait->seen : 0);
}
