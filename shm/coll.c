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
#include <sys/mman.h>

#include "base/clock.h"
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
    const size_t pieces = (size_t)shm_pieces(args->coll, team->nranks);
    size_t chunk;

    memset(op, 0, sizeof(*op));
    op->args = *args;
    op->elem_shift = (unsigned)__builtin_ctzl(args->elem_size); /* a power of two */
    op->block = bytes;
    op->two_phase = (args->coll == ALG_COLL_ALLREDUCE || args->coll == ALG_COLL_REDUCE) &&
                    bytes > team->direct_bytes;
    if (bytes <= SHM_MIN_CHUNK_BYTES && (bytes + 64) * pieces <= team->slot_bytes) {
        /* One chunk, what the general case below gives too, without its divisions: small
         * calls are latency-bound, and a division costs tens of cycles. */
        chunk = bytes;
    } else {
        chunk = (team->slot_bytes / pieces) & ~(size_t)63;
        /* A message that fits one slot is still cut in SHM_MIN_CHUNKS when that leaves chunks
         * of SHM_MIN_CHUNK_BYTES or more: one rank's fill of a chunk then overlaps another's
         * reading of the one before, instead of every rank waiting for a whole message. */
        size_t pipelined = ((bytes + SHM_MIN_CHUNKS - 1) / SHM_MIN_CHUNKS + 63) & ~(size_t)63;
        if (pipelined < SHM_MIN_CHUNK_BYTES) {
            pipelined = SHM_MIN_CHUNK_BYTES;
        }
        if (chunk > pipelined) {
            chunk = pipelined;
        }
        if (chunk >= bytes) {
            chunk = bytes;
        } else {
            /* Even chunks, so the last one is not a sliver that costs a whole round of flags. */
            size_t nchunks = (bytes + chunk - 1) / chunk;
            chunk = ((bytes + nchunks - 1) / nchunks + 63) & ~(size_t)63;
        }
    }
    op->chunk = chunk;
    op->nchunks = chunk == 0 ? 0 : chunk == bytes ? 1 : (uint32_t)((bytes + chunk - 1) / chunk);
    op->small = op->nchunks == 1 && !op->two_phase &&
                (size_t)pieces * chunk <= SHM_SMALL_BYTES;
    op->phase = SHM_PHASE_START;
    /* A large output is not read back soon: write it around the caches. In place too: by
     * the time a chunk's output is written, a chunk's worth of slots has pushed its input
     * lines out of L2 (measured: 3.4 against 2.9 GB/s at 2 and 16 MiB, 2 ranks). */
    size_t out_bytes = bytes * (size_t)(args->coll == ALG_COLL_ALLGATHER ||
                                                args->coll == ALG_COLL_GATHER ||
                                                args->coll == ALG_COLL_ALLTOALL
                                            ? team->nranks
                                            : 1);
    op->stream_out = out_bytes >= KR_STREAM_MIN_BYTES;
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
        kr_reduce_host(dst, src, NULL, bytes >> op->elem_shift, &op->args.redop, KR_PRE_A);
    } else {
        kr_copy_host(dst, src, bytes);
    }
}

/* dst = srcs[0] op srcs[1] op ... in order, each source read from byte src_off on; srcs[0]
 * is raw own input when own_first (scaled here), the others are already scaled. dst may alias
 * srcs[0] exactly. */
static void
shm_reduce(const struct shm_op *op, void *dst, const void *const *srcs, int nsrcs,
           bool own_first, size_t src_off, size_t bytes)
{
    const size_t count = bytes >> op->elem_shift;
    unsigned flags = (own_first && op->args.prescale) ? KR_PRE_A : 0;

    for (int k = 1; k < nsrcs; k++) {
        unsigned last = k == nsrcs - 1 ? KR_POST : 0;
        const uint8_t *a = k == 1 ? (const uint8_t *)srcs[0] + src_off : dst;
        kr_reduce_host(dst, a, (const uint8_t *)srcs[k] + src_off, count, &op->args.redop,
                       flags | last);
        flags = 0;
    }
}

/* Copies into the user's output buffer. */
static void
shm_out(const struct shm_op *op, void *dst, const void *src, size_t bytes)
{
    if (op->stream_out) {
        kr_copy_host_stream(dst, src, bytes);
    } else {
        kr_copy_host(dst, src, bytes);
    }
}

/* --- the phases, per collective ------------------------------------------------------------- */

/* One chunk being worked on. */
struct shm_ctx {
    struct shm_team *team;
    const struct shm_op *op;
    uint32_t s;          /* its sequence number */
    size_t off;          /* its start within the walk */
    size_t len;          /* its bytes */
    const uint8_t *send;
    uint8_t *recv;
};

static uint8_t *
shm_data(const struct shm_ctx *c, int j)
{
    return c->op->small ? shm_region_small(c->team->regions[j], c->s)
                        : shm_region_data(c->team->regions[j], c->team->slot_bytes, c->s);
}

static uint8_t *
shm_result(const struct shm_ctx *c, int j)
{
    return shm_region_result(c->team->regions[j], c->team->slot_bytes, c->s);
}

static void
shm_fill(const struct shm_ctx *c)
{
    const struct shm_op *op = c->op;
    const int r = c->team->rank, n = c->team->nranks, root = op->args.root;
    const size_t off = c->off, len = c->len, block = op->block, piece = op->chunk;
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

/* Reduction of [slot_off, slot_off + bytes) of every rank's slot into dst, in rank order,
 * or with own input first from the user's buffer when own is not NULL. Into a large output
 * (to_output and stream_out) it goes through a small buffer in cache, block by block, and
 * out with non-temporal stores, which spares memory the read of every output line (2 ranks,
 * reduce-scatter of 256 MiB: 4.5 GB/s against 2.5). */
static void
shm_reduce_slots(const struct shm_ctx *c, void *dst, size_t slot_off, const uint8_t *own,
                 size_t bytes, bool to_output)
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
    /* In place, dst is the own input just read: plain stores hit the cache there. */
    if (!to_output || !c->op->stream_out || (const void *)own == dst) {
        shm_reduce(c->op, dst, srcs, k, own != NULL, 0, bytes);
        return;
    }
    for (size_t done = 0; done < bytes; done += SHM_STAGE_BYTES) {
        size_t piece = bytes - done < SHM_STAGE_BYTES ? bytes - done : SHM_STAGE_BYTES;
        shm_reduce(c->op, c->team->stage, srcs, k, own != NULL, done, piece);
        kr_copy_host_stream((uint8_t *)dst + done, c->team->stage, piece);
    }
}

static void
shm_phase1(const struct shm_ctx *c)
{
    const struct shm_op *op = c->op;
    const int r = c->team->rank, n = c->team->nranks, root = op->args.root;
    const size_t off = c->off, len = c->len, block = op->block, piece = op->chunk;

    switch (op->args.coll) {
    case ALG_COLL_ALLREDUCE:
    case ALG_COLL_REDUCE:
        if (op->two_phase) {
            size_t start, share;
            shm_share(len, n, r, &start, &share);
            shm_reduce_slots(c, shm_result(c, r) + start, start, c->send + off + start, share,
                             false);
        } else if (op->args.coll == ALG_COLL_ALLREDUCE || r == root) {
            /* All from the slots, in rank order: identical on every rank, and safe in place. */
            shm_reduce_slots(c, c->recv + off, 0, NULL, len, true);
        }
        break;
    case ALG_COLL_BROADCAST:
        /* The root's own copy too comes out of its slot, still in cache from the fill. */
        if (!op->args.in_place || r != root) {
            shm_out(op, c->recv + off, shm_data(c, root), len);
        }
        break;
    case ALG_COLL_ALLGATHER:
    case ALG_COLL_GATHER:
        if (op->args.coll == ALG_COLL_GATHER && r != root) {
            break;
        }
        for (int j = 0; j < n; j++) {
            const uint8_t *src = shm_data(c, j);
            if (j == r) {
                /* All-gather filled my slot (in cache); gather's root did not fill. */
                if (op->args.in_place) {
                    continue;
                }
                src = op->args.coll == ALG_COLL_ALLGATHER ? src : c->send + off;
            }
            shm_out(op, c->recv + (size_t)j * block + off, src, len);
        }
        break;
    case ALG_COLL_REDUCESCATTER:
        shm_reduce_slots(c, c->recv + off, (size_t)r * piece, c->send + (size_t)r * block + off,
                         len, true);
        break;
    case ALG_COLL_ALLTOALL:
        for (int j = 0; j < n; j++) {
            shm_out(op, c->recv + (size_t)j * block + off,
                    j == r ? c->send + (size_t)r * block + off
                           : shm_data(c, j) + (size_t)r * piece,
                    len);
        }
        break;
    case ALG_COLL_SCATTER:
        shm_out(op, c->recv + off,
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
        shm_out(op, c->recv + c->off + start, shm_result(c, j) + start, share);
    }
}

/* --- the state machine ---------------------------------------------------------------------- */

/* Whether every rank j that this rank reads (reads(op, me, j)) has posted seq on the chosen
 * flag; else *wait names the first that has not. */
static bool
shm_all_reached(struct shm_team *team, const struct shm_op *op, size_t flag_offset,
                bool (*reads)(const struct shm_op *, int, int), uint32_t seq,
                struct shm_wait *wait)
{
    for (int j = 0; j < team->nranks; j++) {
        if (!reads(op, team->rank, j)) {
            continue;
        }
        struct shm_flag *flag = (struct shm_flag *)((uint8_t *)team->regions[j] + flag_offset);
        if (!shm_flag_reached(flag, seq, j, wait)) {
            return false;
        }
    }
    return true;
}

/* Whether every rank has consumed chunk seq. The oldest chunk all had consumed at the last
 * look is kept in the team: a run of small ops then reads its peers' consumed flags once every
 * few ops, not once an op, and each such read moves a cache line a peer has just written. */
static bool
shm_all_consumed(struct shm_team *team, uint32_t seq, struct shm_wait *wait)
{
    if ((int32_t)(team->consumed_by_all - seq) >= 0) {
        return true;
    }
    uint32_t least = 0;
    for (int j = 0; j < team->nranks; j++) {
        struct shm_flag *flag = &team->regions[j]->consumed;
        uint32_t value = shm_flag_load(flag);
        if ((int32_t)(value - seq) < 0) {
            if (!shm_flag_reached(flag, seq, j, wait)) { /* fills *wait */
                return false;
            }
            value = seq; /* it moved since: seq is a lower bound */
        }
        least = j == 0 || (int32_t)(value - least) < 0 ? value : least;
    }
    team->consumed_by_all = least;
    return true;
}

static void
shm_post(struct shm_team *team, size_t flag_offset, uint32_t seq)
{
    shm_flag_post((struct shm_flag *)((uint8_t *)team->regions[team->rank] + flag_offset), seq);
}

#define SHM_FLAG(name) offsetof(struct shm_region, name)

/* Chunk i of the op's walk. */
static struct shm_ctx
shm_chunk(struct shm_team *team, const struct shm_op *op, uint32_t i)
{
    size_t off = (size_t)i * op->chunk;
    return (struct shm_ctx){.team = team, .op = op, .s = op->s0 + i, .off = off,
                            .len = op->block - off < op->chunk ? op->block - off : op->chunk,
                            .send = op->args.send, .recv = op->args.recv};
}

/* Fills the next chunk if its slot is free, at most one chunk ahead of the reading: a rank
 * that waits for a peer's flags has its next contribution out already. */
static bool
shm_try_fill(struct shm_team *team, struct shm_op *op, struct shm_wait *wait)
{
    if (op->filled == op->nchunks || op->filled > op->read + 1) {
        return false;
    }
    struct shm_ctx c = shm_chunk(team, op, op->filled);
    /* Slot s % 2 is free once every rank is done with chunk s - 2 (the small ring's slot,
     * with s - SHM_SMALL_SLOTS). */
    uint32_t depth = op->small ? SHM_SMALL_SLOTS : 2;
    if (!shm_all_consumed(team, c.s - depth, wait)) {
        return false;
    }
    shm_fill(&c);
    shm_post(team, SHM_FLAG(ready), c.s);
    op->filled++;
    return true;
}

/* Asks for the first line of every slot this rank is about to read, before it reads the flags
 * that say the slots are ready: when they are, both misses are under way at once, rather
 * than the flag's and then the data's. */
static void
shm_prefetch_small(const struct shm_ctx *c)
{
    const int r = c->team->rank, n = c->team->nranks;
    /* Where a slot holds a piece per rank, ours is piece r. */
    const size_t mine = shm_pieces(c->op->args.coll, n) > 1 ? (size_t)r * c->op->chunk : 0;
    for (int j = 0; j < n; j++) {
        if (shm_reads_data(c->op, r, j)) {
            __builtin_prefetch(shm_data(c, j) + mine);
        }
    }
}

/* Phase 1, then phase 2, of the oldest chunk not yet consumed. */
static bool
shm_try_read(struct shm_team *team, struct shm_op *op, struct shm_wait *wait)
{
    if (op->read == op->filled) {
        return false;
    }
    struct shm_ctx c = shm_chunk(team, op, op->read);
    bool moved = false;
    if (op->phase == SHM_PHASE_READ) {
        if (op->small) {
            shm_prefetch_small(&c);
        }
        if (!shm_all_reached(team, op, SHM_FLAG(ready), shm_reads_data, c.s, wait)) {
            return false;
        }
        shm_phase1(&c);
        if (op->two_phase) {
            shm_post(team, SHM_FLAG(reduced), c.s);
        }
        op->phase = SHM_PHASE_GATHER;
        moved = true;
    }
    if (op->two_phase) {
        if (!shm_all_reached(team, op, SHM_FLAG(reduced), shm_reads_result, c.s, wait)) {
            return moved;
        }
        shm_phase2(&c);
    }
    shm_post(team, SHM_FLAG(consumed), c.s);
    op->read++;
    op->phase = SHM_PHASE_READ;
    return true;
}

bool
shm_op_needs(const struct shm_op *op, struct shm_team *team, int rank)
{
    if (op->phase == SHM_PHASE_START || op->phase == SHM_PHASE_DONE) {
        return op->phase == SHM_PHASE_START; /* not numbered yet: it needs everyone */
    }
    uint32_t last = op->s0 + op->nchunks - 1;
    return (int32_t)(shm_flag_load(&team->regions[rank]->consumed) - last) < 0;
}

bool
shm_op_peer_arrived(const struct shm_op *op, const struct shm_wait *wait)
{
    if (op->phase == SHM_PHASE_START || wait->addr == NULL) {
        return false;
    }
    return (int32_t)(wait->seen - op->s0) >= 0;
}

enum shm_status
shm_op_progress(struct shm_op *op, struct shm_team *team, struct shm_wait *wait_out)
{
    enum shm_status status = SHM_BLOCKED;

    if (op->phase == SHM_PHASE_START) {
        if (op->nchunks == 0) {
            op->phase = SHM_PHASE_DONE;
        } else if (team->owner != NULL && team->owner != op) {
            /* An earlier op of the same group still has the slots. */
            wait_out->addr = NULL;
            return status;
        } else {
            team->owner = op;
            op->s0 = team->seq + 1;
            team->seq += op->nchunks;
            op->phase = SHM_PHASE_READ;
        }
    }
    while (op->phase != SHM_PHASE_DONE) {
        struct shm_wait fill_wait = {0};
        bool filled = shm_try_fill(team, op, &fill_wait);
        /* The reading's wait is the one to sleep on: it never depends on our own filling. */
        bool read = shm_try_read(team, op, wait_out);
        if (op->read == op->nchunks) {
            team->owner = NULL;
            op->phase = SHM_PHASE_DONE;
        } else if (!filled && !read) {
            if (op->read == op->filled) {
                *wait_out = fill_wait;
            }
            return status;
        }
        status = SHM_MOVED;
    }
    return SHM_DONE;
}

int
shm_op_describe(const struct shm_op *op, const struct shm_wait *wait, char *buf, size_t len)
{
    static const char *const phase_names[] = {"waiting for its turn", "reading", "gathering",
                                              "done"};
    if (wait == NULL || wait->addr == NULL) {
        return snprintf(buf, len, "shared memory, %u/%u chunks filled, %u consumed, %s",
                        op->filled, op->nchunks, op->read, phase_names[op->phase]);
    }
    return snprintf(buf, len, "shared memory, %u/%u chunks filled, %u consumed, %s chunk "
                    "sequence %u, waiting for rank %d (its flag is at %u)", op->filled,
                    op->nchunks, op->read, phase_names[op->phase], op->s0 + op->read,
                    wait->peer, wait->seen);
}

bool
shm_team_release_slots(struct shm_team *team, int budget_ms)
{
    int64_t until = shim_clock_ms() + budget_ms;
    struct shm_wait wait;

    while (!shm_all_consumed(team, team->seq, &wait)) {
        if (shim_clock_ms() >= until) {
            return false;
        }
        shm_wait_sleep(&wait, 1);
    }
    /* The small ring and the data and result slots are contiguous and page aligned; the
     * pages go from the shared file itself, so peers' mappings see zeros too. */
    uint8_t *first = shm_region_small(team->regions[team->rank], 0);
    return madvise(first, SHM_SMALL_AREA + 4 * team->slot_bytes, MADV_REMOVE) == 0;
}
