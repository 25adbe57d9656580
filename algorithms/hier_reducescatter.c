/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hierarchical reduce-scatter: what the ranks of a host hold of a block is summed on that
 * host first, and only that sum crosses to the block's rank, once from each host.
 *
 * Block b is rank b's result; b is at place i of its host. On every other host, b's
 * counterpart (the rank at place i mod m there, hosts.h) takes its mates' inputs of block b,
 * reduces them with its own into an accumulator and sends the host's sum to b. On b's own
 * host the mates send their inputs to b itself. b reduces its own input with its mates', then
 * with the other hosts' sums in host order, into RECV; the post-divide comes with the last.
 * Every rank sends n - 1 blocks, as on a ring, but of a buffer of S = n * count elements only
 * (H - 1) S crosses between H hosts in all (a flat ring: about S per host boundary it
 * crosses). Without args->hosts every rank is on one host: each sends every other rank its
 * block directly.
 *
 * Blocks are cut into chunks of at most chunk_bytes and everything runs once per chunk,
 * chunk-major, in rank order of the blocks, so the two sides of every pair agree on the
 * order of their messages. Scratch is three sets of `slots` chunks: received inputs
 * (alg_recv_reduce), a counterpart's accumulators (each busy until its send is done) and,
 * with a pre-multiplying op, our raw inputs scaled before they leave (busy until sent), so
 * raw data never leaves its rank. In place RECV is block `rank` of SEND, which only our own
 * final reductions read, element for element.
 */
#include "alg.h"
#include "hosts.h"

struct hier_rs {
    const struct alg_args *args;
    struct alg_sched *sched;
    struct alg_host_map map;
    struct alg_slots in;     /* inputs received, until reduced */
    struct alg_slots sums;   /* a counterpart's accumulators, until sent */
    struct alg_slots scaled; /* our scaled inputs, until sent */
};

/* Our input `own` to `peer`, scaled first if the op pre-multiplies. */
static void
hier_rs_give(struct hier_rs *h, int peer, struct alg_range own)
{
    if (!h->args->prescale) {
        alg_send(h->sched, peer, own, -1, -1);
        return;
    }
    struct alg_range scaled;
    const int slot = alg_slot_take(&h->scaled, own.len, &scaled);
    int copy = alg_copy(h->sched, scaled, own, ALG_PRE_A, h->scaled.user[slot], -1);
    h->scaled.user[slot] = alg_send(h->sched, peer, scaled, copy, -1);
}

/* As block b's counterpart on our host: our mates' inputs and ours, summed, to b. */
static void
hier_rs_collect(struct hier_rs *h, int b, struct alg_range own)
{
    const int m = alg_host_size(&h->map, h->map.host);

    if (m == 1) {
        hier_rs_give(h, b, own);
        return;
    }
    struct alg_range sum;
    const int slot = alg_slot_take(&h->sums, own.len, &sum);
    struct alg_range a = own;
    unsigned pre = ALG_PRE_A;
    int last = h->sums.user[slot]; /* the accumulator's last send */
    for (int j = 0; j < m; j++) {
        if (j != h->map.local) {
            last = alg_recv_reduce(h->sched, &h->in, alg_host_rank(&h->map, h->map.host, j), sum,
                                   a, pre, last, -1);
            a = sum;
            pre = 0;
        }
    }
    h->sums.user[slot] = alg_send(h->sched, b, sum, last, -1);
}

/* Our own block: our input, our mates', then each other host's sum, into `out`. */
static void
hier_rs_finish(struct hier_rs *h, struct alg_range own, struct alg_range out)
{
    const int m = alg_host_size(&h->map, h->map.host), me = h->args->rank;
    const int sources = m - 1 + h->map.nhosts - 1;
    struct alg_range a = own;
    unsigned pre = ALG_PRE_A;
    int last = -1, seen = 0;

    for (int k = 0; k < m + h->map.nhosts; k++) {
        /* k < m: our mates by place; then the hosts by number. */
        const bool mate = k < m;
        if (mate ? k == h->map.local : k - m == h->map.host) {
            continue;
        }
        const int peer = mate ? alg_host_rank(&h->map, h->map.host, k)
                              : alg_host_counterpart(&h->map, me, k - m);
        seen++;
        last = alg_recv_reduce(h->sched, &h->in, peer, out, a,
                               pre | (seen == sources ? ALG_POST : 0), last, -1);
        a = out;
        pre = 0;
    }
}

ncclResult_t
alg_hier_reducescatter(const struct alg_args *args, struct alg_sched *sched)
{
    struct hier_rs h = {.args = args, .sched = sched};

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    if (args->nranks == 1) {
        return alg_reduce_alone(args, sched);
    }
    if (!alg_host_map_init(&h.map, args, sched)) {
        return alg_sched_finish(sched);
    }
    const int n = args->nranks, me = args->rank, nchunks = alg_nchunks(args, args->count);
    const size_t slot_bytes = alg_bytes(args, (args->count + (size_t)nchunks - 1) /
                                                  (size_t)nchunks);
    if (alg_slots_init(&h.in, sched, args->slots, slot_bytes) &&
        alg_slots_init(&h.sums, sched, args->slots, slot_bytes) &&
        alg_slots_init(&h.scaled, sched, args->slots, slot_bytes)) {
        h.sums.base = slot_bytes * (size_t)h.in.count;
        h.scaled.base = h.sums.base + slot_bytes * (size_t)h.sums.count;
        sched->scratch_bytes = h.scaled.base +
                               (args->prescale ? slot_bytes * (size_t)h.scaled.count : 0);
        for (int c = 0; c < nchunks; c++) {
            size_t first, len;
            alg_block(args->count, nchunks, c, &first, &len);
            for (int b = 0; b < n; b++) {
                const struct alg_range own = alg_range_make(
                    ALG_BUF_SEND, alg_bytes(args, (size_t)b * args->count + first),
                    alg_bytes(args, len));
                const bool here = alg_host_of(&h.map, b) == h.map.host;
                if (b == me) {
                    hier_rs_finish(&h, own, alg_range_make(ALG_BUF_RECV, alg_bytes(args, first),
                                                           alg_bytes(args, len)));
                } else if (here) {
                    hier_rs_give(&h, b, own);
                } else if (alg_host_counterpart(&h.map, b, h.map.host) == me) {
                    hier_rs_collect(&h, b, own);
                } else {
                    hier_rs_give(&h, alg_host_counterpart(&h.map, b, h.map.host), own);
                }
            }
        }
    }
    alg_slots_free(&h.in);
    alg_slots_free(&h.sums);
    alg_slots_free(&h.scaled);
    alg_host_map_free(&h.map);
    return alg_sched_finish(sched);
}

/* Every block but ours, once: to its rank, its counterpart here, or as the host's sum. */
size_t
alg_hier_reducescatter_bytes(const struct alg_args *args)
{
    return alg_bytes(args, (size_t)(args->nranks - 1) * args->count);
}

/* Alike on every rank: a rank of the emptiest host sends the most across ((n - m)/m host sums)
 * and each rank takes H - 1 sums in; the rest of its n - 1 blocks go at home. */
void
alg_hier_reducescatter_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const double n = args->nranks, block = (double)alg_bytes(args, args->count);
    const struct alg_host_shape shape = alg_host_shape(args);

    cost_out->steps = n - 1 - (n - shape.widest) / shape.widest;
    cost_out->bytes = cost_out->steps * block;
    cost_out->net_steps = shape.across;
    cost_out->net_bytes = shape.across * block;
    cost_out->reduce_bytes = (n - 1) * block;
}
