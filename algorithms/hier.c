/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hierarchical all-reduce: the ranks of each host combine through their host's own links,
 * only each host's sum crosses between hosts, once, and every rank of a host carries its own
 * share of it across, so a host's links to the network run in parallel (as NCCL gives each
 * GPU its own NIC).
 *
 * L, the lanes, is the most ranks one host has; the buffer is cut into L shares (alg_block).
 * On a host of m ranks, share k belongs to the rank at place k mod m: with equal hosts each
 * rank owns one share, on a smaller host some rank owns several. Hosts are ordered by number.
 *   A, inside each host: every rank sends its part of each share to the share's owner, which
 *      reduces them into RECV, its own input first, then the others in place order.
 *   B, between hosts: the owners of share k, one per host, all-reduce it. Two hosts swap
 *      their sums and each reduces the pair (a + b == b + a, so both get the same bits); more
 *      hosts run a ring over the share cut into H blocks, as ring.c does.
 *   C, inside each host: the owner sends the finished share to every other rank of its host,
 *      a block as soon as B finishes it.
 * Of S bytes, with m ranks on every host a rank sends (m-1)/m S in A and in C, and between
 * hosts S/m (two hosts) or 2(H-1)/H * S/m (a ring): a 2 x 2 all-reduce puts 2.0 S on the
 * network, a flat ring 3.0 S. Without args->hosts every rank is on one host: A and C alone, a
 * direct reduce-scatter and all-gather.
 *
 * Shares are cut into the same number of chunks (pieces of at most chunk_bytes) and the three
 * phases run once per piece, chunk-major, so one piece crosses the network while the next is
 * reduced on its host; received data lands in `slots` scratch pieces. With a pre-multiplying
 * op a rank scales its raw part of a share into RECV before it sends it (C fills that space
 * only later); the post-divide goes with the last reduction of B (of A on one host). Since C
 * writes RECV where A may have read it (in place, or scaled there), C's receives wait for the
 * send of A.
 */
#include "alg.h"
#include "hosts.h"

#include <stdlib.h>

struct hier {
    const struct alg_args *args;
    struct alg_sched *sched;
    struct alg_host_map map;
    struct alg_slots slots;
    int lanes;
    int nchunks;
    int *rs_send; /* per ring step of B: its reduce-scatter send */
    int *final;   /* per block of B: the step after which it is final */
};

/* The piece (share, chunk) as elements [*first_out, *first_out + *len_out). */
static void
hier_piece(const struct hier *h, int share, int chunk, size_t *first_out, size_t *len_out)
{
    size_t share_first, share_len, first;

    alg_block(h->args->count, h->lanes, share, &share_first, &share_len);
    alg_block(share_len, h->nchunks, chunk, &first, len_out);
    *first_out = share_first + first;
}

/* The blocks B cuts a piece into: a ring's H, else the whole piece. */
static int
hier_nblocks(int nhosts)
{
    return nhosts > 2 ? nhosts : 1;
}

/* Block b of the piece at element `first` of `len` elements, as a range of buf. */
static struct alg_range
hier_block(const struct hier *h, enum alg_buf buf, size_t first, size_t len, int b)
{
    size_t block_first, block_len;

    alg_block(len, hier_nblocks(h->map.nhosts), b, &block_first, &block_len);
    return alg_range_make(buf, alg_bytes(h->args, first + block_first),
                          alg_bytes(h->args, block_len));
}

/* The owner of `share` on `host`. */
static int
hier_owner(const struct hier *h, int host, int share)
{
    return alg_host_rank(&h->map, host, share % alg_host_size(&h->map, host));
}

/* A, on a rank that does not own the piece: our part of it, scaled if the op asks, to its
 * owner. Returns the send. */
static int
hier_give(struct hier *h, int owner, size_t first, size_t len)
{
    struct alg_range src = alg_range_make(ALG_BUF_SEND, alg_bytes(h->args, first),
                                          alg_bytes(h->args, len));
    int scaled = -1;

    if (h->args->prescale) {
        struct alg_range mine = src;
        mine.buf = ALG_BUF_RECV;
        scaled = alg_copy(h->sched, mine, src, ALG_PRE_A, -1, -1);
        src = mine;
    }
    return alg_send(h->sched, owner, src, scaled, -1);
}

/* A, on the owner: the host's parts of the piece reduced into RECV. Returns the last step. */
static int
hier_combine(struct hier *h, size_t first, size_t len, unsigned post)
{
    const int host = h->map.host, m = alg_host_size(&h->map, host);
    const struct alg_range out = alg_range_make(ALG_BUF_RECV, alg_bytes(h->args, first),
                                                alg_bytes(h->args, len));
    struct alg_range own = out;
    unsigned pre = ALG_PRE_A;
    int last = -1;

    own.buf = ALG_BUF_SEND;
    if (m == 1) {
        return alg_copy(h->sched, out, own, ALG_PRE_A | post, -1, -1);
    }
    for (int j = 0, seen = 0; j < m; j++) {
        if (j == h->map.local) {
            continue;
        }
        seen++;
        last = alg_recv_reduce(h->sched, &h->slots, alg_host_rank(&h->map, host, j), out, own,
                               pre | (seen == m - 1 ? post : 0), last, -1);
        own = out;
        pre = 0;
    }
    return last;
}

/* B on a ring of H >= 3 owners; ready: the step after which RECV holds our host's sum. */
static void
hier_ring(struct hier *h, int share, size_t first, size_t len, int ready)
{
    const int nh = h->map.nhosts, p = h->map.host;
    const int next = hier_owner(h, alg_mod(p + 1, nh), share);
    const int prev = hier_owner(h, alg_mod(p - 1, nh), share);
    int last = ready;

    for (int s = 0; s < nh - 1; s++) {
        struct alg_range in = hier_block(h, ALG_BUF_RECV, first, len, alg_mod(p - s - 1, nh));
        h->rs_send[s] = alg_send(h->sched, next,
                                 hier_block(h, ALG_BUF_RECV, first, len, alg_mod(p - s, nh)),
                                 last, -1);
        last = alg_recv_reduce(h->sched, &h->slots, prev, in, in, s == nh - 2 ? ALG_POST : 0,
                               ready, -1);
    }
    h->final[alg_mod(p + 1, nh)] = last;
    for (int t = 0; t < nh - 1; t++) {
        const int in = alg_mod(p - t, nh);
        alg_send(h->sched, next, hier_block(h, ALG_BUF_RECV, first, len, alg_mod(p + 1 - t, nh)),
                 last, -1);
        last = alg_recv(h->sched, prev, hier_block(h, ALG_BUF_RECV, first, len, in),
                        h->rs_send[t], -1);
        h->final[in] = last;
    }
}

/* B: the hosts' sums of the piece reduced across hosts; h->final gets when each block is. */
static void
hier_across(struct hier *h, int share, size_t first, size_t len, int ready)
{
    if (h->map.nhosts == 1) {
        h->final[0] = ready;
    } else if (h->map.nhosts == 2) {
        const int partner = hier_owner(h, 1 - h->map.host, share);
        const struct alg_range sum = hier_block(h, ALG_BUF_RECV, first, len, 0);
        int sent = alg_send(h->sched, partner, sum, ready, -1);
        /* The reduction overwrites what the send reads. */
        h->final[0] = alg_recv_reduce(h->sched, &h->slots, partner, sum, sum, ALG_POST, ready,
                                      sent);
    } else {
        hier_ring(h, share, first, len, ready);
    }
}

/* Sets up h for args; false (the schedule, if any, marked out of memory) if it cannot. */
static bool
hier_init(struct hier *h, const struct alg_args *args, struct alg_sched *sched)
{
    *h = (struct hier){.args = args, .sched = sched};
    if (!alg_host_map_init(&h->map, args, sched)) {
        return false;
    }
    h->lanes = args->hosts != NULL ? args->hosts->widest : args->nranks;
    h->nchunks = alg_nchunks(args, (args->count + (size_t)h->lanes - 1) / (size_t)h->lanes);
    h->rs_send = malloc((size_t)h->map.nhosts * sizeof(int));
    h->final = malloc((size_t)h->map.nhosts * sizeof(int));
    if (h->rs_send == NULL || h->final == NULL) {
        if (sched != NULL) {
            sched->out_of_memory = true;
        }
        return false;
    }
    return true;
}

static void
hier_free(struct hier *h)
{
    alg_host_map_free(&h->map);
    alg_slots_free(&h->slots);
    free(h->rs_send);
    free(h->final);
}

ncclResult_t
alg_hier_allreduce(const struct alg_args *args, struct alg_sched *sched)
{
    struct hier h;

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    if (args->nranks == 1) {
        return alg_reduce_alone(args, sched);
    }
    if (!hier_init(&h, args, sched)) {
        hier_free(&h);
        return alg_sched_finish(sched);
    }
    const size_t max_share = (args->count + (size_t)h.lanes - 1) / (size_t)h.lanes;
    const size_t slot_bytes = alg_bytes(args, (max_share + (size_t)h.nchunks - 1) /
                                                  (size_t)h.nchunks);
    const int nblocks = hier_nblocks(h.map.nhosts);
    const unsigned post_a = h.map.nhosts == 1 ? ALG_POST : 0;

    if (alg_slots_init(&h.slots, sched, args->slots, slot_bytes)) {
        sched->scratch_bytes = slot_bytes * (size_t)h.slots.count;
        for (int c = 0; c < h.nchunks; c++) {
            for (int k = 0; k < h.lanes; k++) {
                size_t first, len;
                hier_piece(&h, k, c, &first, &len);
                const int owner = hier_owner(&h, h.map.host, k);
                if (len == 0) {
                    continue;
                }
                if (owner != args->rank) {
                    int gave = hier_give(&h, owner, first, len);
                    for (int b = 0; b < nblocks; b++) {
                        struct alg_range in = hier_block(&h, ALG_BUF_RECV, first, len, b);
                        if (in.len > 0) {
                            alg_recv(sched, owner, in, gave, -1);
                        }
                    }
                    continue;
                }
                hier_across(&h, k, first, len, hier_combine(&h, first, len, post_a));
                for (int b = 0; b < nblocks; b++) {
                    struct alg_range out = hier_block(&h, ALG_BUF_RECV, first, len, b);
                    if (out.len > 0) {
                        alg_host_send_to_mates(sched, &h.map, out, h.final[b]);
                    }
                }
            }
        }
    }
    hier_free(&h);
    return alg_sched_finish(sched);
}

/* Per piece: A sends it whole unless we own it; an owner sends it to its m - 1 host mates in
 * C and across in B, whole between two hosts, on a ring every block but two. */
size_t
alg_hier_allreduce_bytes(const struct alg_args *args)
{
    struct hier h;
    size_t elems = 0;

    if (args->nranks == 1) {
        return 0;
    }
    if (!hier_init(&h, args, NULL)) {
        hier_free(&h);
        return 0;
    }
    const int nh = h.map.nhosts, m = alg_host_size(&h.map, h.map.host);
    for (int c = 0; c < h.nchunks; c++) {
        for (int k = 0; k < h.lanes; k++) {
            size_t first, len, skip_rs, skip_ag;
            hier_piece(&h, k, c, &first, &len);
            if (hier_owner(&h, h.map.host, k) != args->rank) {
                elems += len;
                continue;
            }
            elems += (size_t)(m - 1) * len;
            if (nh == 2) {
                elems += len;
            } else if (nh > 2) {
                alg_block(len, nh, alg_mod(h.map.host + 1, nh), &first, &skip_rs);
                alg_block(len, nh, alg_mod(h.map.host + 2, nh), &first, &skip_ag);
                elems += 2 * len - skip_rs - skip_ag;
            }
        }
    }
    hier_free(&h);
    return alg_bytes(args, elems);
}

/* The same on every rank, so every rank chooses alike: the fullest host's ranks move the
 * most inside a host, the emptiest host's ranks carry the most across. */
void
alg_hier_allreduce_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const struct alg_host_shape shape = alg_host_shape(args);
    const double nh = shape.nhosts, lanes = shape.widest, narrowest = shape.narrowest;
    const double bytes = (double)alg_bytes(args, args->count);
    /* What one rank of the emptiest host carries across: its shares of the L. */
    const double carried = bytes * ((double)(int)((lanes + narrowest - 1) / narrowest)) / lanes;

    cost_out->steps = 2 * (lanes - 1);
    cost_out->bytes = 2 * (lanes - 1) / lanes * bytes;
    cost_out->net_steps = nh == 1 ? 0 : nh == 2 ? 1 : 2 * (nh - 1);
    cost_out->net_bytes = nh == 1 ? 0 : nh == 2 ? carried : 2 * (nh - 1) / nh * carried;
    /* Two hosts swap whole pieces, each reducing all it carries; a ring reduces (H-1)/H. */
    cost_out->reduce_bytes = (lanes - 1) / lanes * bytes +
                             (nh == 2 ? carried : (nh - 1) / nh * carried);
}
