/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host-aware rows (hier.c, hier_allgather.c, hier_reducescatter.c, hier_tree.c,
 * hier_scatter.c, hier_alltoall.c) in the simulator, on ranks spread over hosts: equal hosts
 * (2 x 2, 4 x 1, 2 x 8, 3 x 3), uneven ones (1, 2 and 3 ranks; 3 and 1; five hosts of 2, 1,
 * 2, 1, 3), and ranks dealt to hosts round-robin rather than in blocks; every count class,
 * sum, PreMulSum with a scalar per rank and integer average, in and out of place, tiny chunks
 * and one slot, many interleavings; results against the reference (sim/reference.h), each
 * rank's traffic against the row's textbook figure. Then what crosses between hosts: exactly
 * what must, once (2.0 S for a 2 x 2 all-reduce, where a flat ring puts 3.0 S on the network;
 * a scatter's, gather's or all-to-all's blocks for a host in one message); and a cost alike on
 * every rank. Recursive doubling's cost splits its levels between the host and the network as
 * its schedule sends them. Without hosts the rows run in test_algorithms' sweep of the whole
 * table.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/alg.h"
#include "sim/reference.h"
#include "sim/sim.h"

#define CC_MAX_RANKS SIM_MAX_RANKS

struct layout {
    const char *name;
    int n;
    int host_of[CC_MAX_RANKS];
};

static const struct layout layouts[] = {
    {"2x2", 4, {0, 0, 1, 1}},
    {"2x2 round-robin", 4, {0, 1, 0, 1}},
    {"4x1", 4, {0, 1, 2, 3}},
    {"1+2+3", 6, {0, 1, 1, 2, 2, 2}},
    {"3+2+1 mixed", 6, {0, 1, 0, 2, 1, 0}},
    {"3+1", 4, {0, 0, 1, 0}},
    {"3x3", 9, {0, 0, 0, 1, 1, 1, 2, 2, 2}},
    {"2x8", 16, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}},
    {"2+1+2+1+3", 9, {0, 0, 1, 2, 2, 3, 4, 4, 4}},
};

#define NLAYOUTS ((int)(sizeof(layouts) / sizeof(layouts[0])))

static struct alg_hosts
hosts_of(const struct layout *l)
{
    int size[CC_MAX_RANKS] = {0};
    struct alg_hosts hosts = {.host_of = l->host_of};

    for (int r = 0; r < l->n; r++) {
        size[l->host_of[r]]++;
        hosts.nhosts = l->host_of[r] + 1 > hosts.nhosts ? l->host_of[r] + 1 : hosts.nhosts;
    }
    hosts.widest = 0;
    hosts.narrowest = l->n;
    for (int h = 0; h < hosts.nhosts; h++) {
        hosts.widest = size[h] > hosts.widest ? size[h] : hosts.widest;
        hosts.narrowest = size[h] < hosts.narrowest ? size[h] : hosts.narrowest;
    }
    hosts.block = alg_hosts_block(l->host_of, l->n, hosts.nhosts);
    return hosts;
}

/* The ranks of host h in l. */
static int
hosts_size(const struct layout *l, int h)
{
    int m = 0;

    for (int r = 0; r < l->n; r++) {
        m += l->host_of[r] == h;
    }
    return m;
}

struct row {
    enum alg_coll coll;
    alg_builder_t build;
    size_t (*bytes)(const struct alg_args *args);
    void (*cost)(const struct alg_args *args, struct alg_cost *cost_out);
};

/* The host-aware rows of the unrooted collectives. */
static const struct row rows[] = {
    {ALG_COLL_ALLREDUCE, alg_hier_allreduce, alg_hier_allreduce_bytes, alg_hier_allreduce_cost},
    {ALG_COLL_ALLGATHER, alg_hier_allgather, alg_hier_allgather_bytes, alg_hier_allgather_cost},
    {ALG_COLL_REDUCESCATTER, alg_hier_reducescatter, alg_hier_reducescatter_bytes,
     alg_hier_reducescatter_cost},
    {ALG_COLL_ALLTOALL, alg_hier_alltoall, alg_hier_alltoall_bytes, alg_hier_alltoall_cost},
};

#define NROWS ((int)(sizeof(rows) / sizeof(rows[0])))

/* The host-aware rows of scatter and gather, whose schedules depend on the root. */
static const struct row rooted[] = {
    {ALG_COLL_SCATTER, alg_hier_scatter, alg_hier_scatter_bytes, alg_hier_scatter_cost},
    {ALG_COLL_GATHER, alg_hier_gather, alg_hier_gather_bytes, alg_hier_gather_cost},
};

/* The chains, which run in host order. */
static const struct row chains[] = {
    {ALG_COLL_BROADCAST, alg_chain_broadcast, alg_chain_broadcast_bytes, alg_chain_broadcast_cost},
    {ALG_COLL_REDUCE, alg_chain_reduce, alg_chain_reduce_bytes, alg_chain_reduce_cost},
};

/* One case of row `row` on layout l in the simulator: the reference result everywhere, guards
 * and inputs intact, each rank's traffic as bytes() says. */
static void
check_row(const struct row *row, const struct layout *l, int root, size_t count,
          enum kr_op_kind kind, bool in_place, size_t chunk_bytes, int slots, unsigned seed)
{
    const struct alg_hosts hosts = hosts_of(l);
    const struct ref_case c = {.coll = row->coll, .nranks = l->n, .count = count, .root = root,
                               .in_place = in_place, .kind = kind};
    struct ref_data *d = malloc(sizeof(*d));
    struct sim_report report;
    char why[1024];

    cr_assert(d != NULL && ref_setup(&c, d), "out of memory");
    struct sim_op op = {
        .build = row->build, .redops = d->redops, .send = d->send, .recv = d->recv,
        .send_bytes = d->send_bytes, .recv_bytes = d->recv_bytes, .seed = seed,
        .args = {.coll = c.coll, .count = count, .elem_size = 4, .nranks = l->n,
                 .root = root, .chunk_bytes = chunk_bytes, .slots = slots,
                 .prescale = ref_coll_reduces(c.coll) && kind == KR_PREMULSUM,
                 .hosts = &hosts}};
    /* In place is per rank, as the executor decides it from the pointers: for a rooted
     * collective at the root only, so it runs as a group of one part per rank. */
    struct sim_part parts[SIM_MAX_RANKS];
    const struct sim_part *pp[SIM_MAX_RANKS];
    int np[SIM_MAX_RANKS];
    for (int r = 0; r < l->n; r++) {
        struct alg_args args = op.args;
        args.rank = r;
        args.in_place = d->in_place[r];
        parts[r] = (struct sim_part){row->build, args, d->send[r], d->recv[r], d->send_bytes[r],
                                     d->recv_bytes[r]};
        pp[r] = &parts[r];
        np[r] = 1;
    }
    op.nparts = np;
    op.parts = pp;
    bool ran = sim_run(&op, &report);
    cr_assert(ran, "%s on %s, count %zu, %s, in place %d, chunk %zu, slots %d, seed %u: %s",
              ref_coll_name(c.coll), l->name, count, ref_kind_name(kind), in_place, chunk_bytes,
              slots, seed, report.error);
    cr_assert(ref_check(d, why, sizeof(why)), "%s on %s, count %zu, %s, in place %d: %s",
              ref_coll_name(c.coll), l->name, count, ref_kind_name(kind), in_place, why);
    for (int r = 0; r < l->n; r++) {
        struct alg_args args = op.args;
        args.rank = r;
        cr_assert_eq(report.bytes_sent[r], row->bytes(&args),
                     "%s on %s, count %zu: rank %d sent %zu, bytes() says %zu",
                     ref_coll_name(c.coll), l->name, count, r, report.bytes_sent[r],
                     row->bytes(&args));
    }
    ref_free(d);
    free(d);
}

Test(hier, every_row_on_every_layout)
{
    static const enum kr_op_kind kinds[] = {KR_SUM, KR_PREMULSUM, KR_SUMPOSTDIV};
    static const size_t chunks[] = {1 << 20, 12, 64, 4};

    for (int row = 0; row < NROWS; row++) {
        const bool reduces = ref_coll_reduces(rows[row].coll);
        for (int li = 0; li < NLAYOUTS; li++) {
            const struct layout *l = &layouts[li];
            const size_t counts[] = {0, 1, (size_t)l->n - 1, (size_t)l->n + 1, 37, 1001};
            for (int w = 0; w < 6; w++) {
                for (int k = 0; k < (reduces ? 3 : 1); k++) {
                    for (int ip = 0; ip < 2; ip++) {
                        /* One-element chunks on the small counts only: the big ones
                         * would take the simulator minutes. */
                        const size_t chunk = counts[w] > 100 ? ((k + ip) % 2 ? 256 : 1 << 20)
                                                             : chunks[(w + k + ip) % 4];
                        check_row(&rows[row], l, 0, counts[w], kinds[k], ip, chunk,
                              1 + (w + ip) % 3, (unsigned)(li * 7919 + w * 131 + k * 3 + ip));
                    }
                }
            }
        }
    }
}

Test(hier, many_interleavings)
{
    for (int row = 0; row < NROWS; row++) {
        for (int li = 0; li < NLAYOUTS; li++) {
            for (unsigned seed = 1; seed <= 25; seed++) {
                check_row(&rows[row], &layouts[li], 0, 40 + seed % 7,
                      seed % 3 == 0 ? KR_PREMULSUM : KR_SUMPOSTDIV, seed & 1, 32,
                      1 + (int)seed % 2, seed);
            }
        }
    }
}

/* Bytes every rank's schedule of `row` sends to ranks of other hosts, all ranks together; and
 * in *messages_out (unless NULL) how many sends carry them. */
static size_t
bytes_between_hosts(const struct row *row, const struct layout *l, const struct alg_hosts *hosts,
                    int root, size_t count, size_t chunk_bytes, int *messages_out)
{
    size_t total = 0;
    int messages = 0;

    for (int r = 0; r < l->n; r++) {
        struct alg_args args = {.coll = row->coll, .count = count, .elem_size = 4, .rank = r,
                                .nranks = l->n, .root = root, .chunk_bytes = chunk_bytes,
                                .slots = 4, .hosts = hosts};
        struct alg_sched sched;
        alg_sched_init(&sched);
        cr_assert_eq(row->build(&args, &sched), ncclSuccess);
        for (int i = 0; i < sched.nsteps; i++) {
            const struct alg_step *step = &sched.steps[i];
            if (step->kind == ALG_STEP_SEND && l->host_of[step->peer] != l->host_of[r]) {
                total += step->src[0].len;
                messages++;
            }
        }
        alg_sched_free(&sched);
    }
    if (messages_out != NULL) {
        *messages_out = messages;
    }
    return total;
}

/* Between H hosts: all-reduce, each host's sum of each share crosses to the H - 1 others
 * (two hosts: each way once; a ring: 2(H-1)/H of the buffer per host); all-gather and
 * reduce-scatter, each block once to (or from) each other host; all-to-all, each rank's block
 * for each rank away, once. */
Test(hier, only_what_must_cross_crosses_once)
{
    const size_t count = 3 * 5 * 7 * 8 * 64, bytes = count * 4;

    for (int row = 0; row < NROWS; row++) {
        for (int li = 0; li < NLAYOUTS; li++) {
            const struct layout *l = &layouts[li];
            const struct alg_hosts hosts = hosts_of(l);
            const size_t nh = (size_t)hosts.nhosts;
            size_t want = rows[row].coll != ALG_COLL_ALLREDUCE ? (nh - 1) * l->n * bytes
                          : nh == 2                           ? 2 * bytes
                                                              : 2 * (nh - 1) * bytes;
            if (rows[row].coll == ALG_COLL_ALLTOALL) { /* each rank's block for each rank away */
                want = 0;
                for (int r = 0; r < l->n; r++) {
                    want += (size_t)(l->n - hosts_size(l, l->host_of[r])) * bytes;
                }
            }
            for (size_t chunk = 4096; chunk <= (1u << 20); chunk *= 16) {
                size_t crossed =
                    bytes_between_hosts(&rows[row], l, &hosts, 0, count, chunk, NULL);
                cr_assert_eq(crossed, want,
                             "%s on %s, chunk %zu: %zu bytes between hosts, want %zu",
                             ref_coll_name(rows[row].coll), l->name, chunk, crossed, want);
            }
        }
    }
    /* Issue 33's bound: a 2 x 2 all-reduce of S bytes puts 2.0 S between the hosts. */
    const struct alg_hosts two = hosts_of(&layouts[0]);
    cr_assert_eq(bytes_between_hosts(&rows[0], &layouts[0], &two, 0, count, 131072, NULL),
                 2 * bytes);
}

/* The chains run in host order from the root: right on every layout and root, and they cross
 * between H hosts H - 1 times, S bytes each, wherever the root is. */
Test(hier, chains_cross_each_host_boundary_once)
{
    const size_t count = 4096, bytes = count * 4;

    for (int ci = 0; ci < 2; ci++) {
        for (int li = 0; li < NLAYOUTS; li++) {
            const struct layout *l = &layouts[li];
            const struct alg_hosts hosts = hosts_of(l);
            for (int root = 0; root < l->n; root++) {
                const enum kr_op_kind kind = root % 2 ? KR_PREMULSUM : KR_SUMPOSTDIV;
                check_row(&chains[ci], l, root, 37 + (size_t)root, kind, root % 3 == 0, 12,
                          1 + root % 2, (unsigned)(li * 31 + root));
                size_t crossed =
                    bytes_between_hosts(&chains[ci], l, &hosts, root, count, 4096, NULL);
                cr_assert_eq(crossed, (size_t)(hosts.nhosts - 1) * bytes,
                             "%s on %s, root %d: %zu bytes between hosts",
                             ref_coll_name(chains[ci].coll), l->name, root, crossed);
            }
        }
    }
}

/* The hierarchical broadcast: right on every layout and root, and exactly (H - 1) S between
 * the hosts, one crossing per edge of the tree of hosts. */
Test(hier, broadcast_crosses_each_tree_edge_once)
{
    static const struct row bcast = {ALG_COLL_BROADCAST, alg_hier_broadcast,
                                     alg_hier_broadcast_bytes, alg_hier_broadcast_cost};
    const size_t count = 4096, bytes = count * 4;

    for (int li = 0; li < NLAYOUTS; li++) {
        const struct layout *l = &layouts[li];
        const struct alg_hosts hosts = hosts_of(l);
        for (int root = 0; root < l->n; root++) {
            check_row(&bcast, l, root, 37 + (size_t)root, KR_SUM, root % 3 == 0,
                      root % 2 ? 12 : 1 << 20, 1, (unsigned)(li * 41 + root));
            size_t crossed = bytes_between_hosts(&bcast, l, &hosts, root, count, 4096, NULL);
            cr_assert_eq(crossed, (size_t)(hosts.nhosts - 1) * bytes,
                         "broadcast on %s, root %d: %zu bytes between hosts", l->name, root,
                         crossed);
        }
    }
}

/* The hierarchical reduce, the broadcast's tree upward: right on every layout and root for
 * every kind of reduction, chunk and slot count, and (H - 1) S between the hosts. */
Test(hier, reduce_crosses_each_tree_edge_once)
{
    static const struct row reduce = {ALG_COLL_REDUCE, alg_hier_reduce, alg_hier_reduce_bytes,
                                      alg_hier_reduce_cost};
    static const enum kr_op_kind kinds[] = {KR_SUM, KR_PREMULSUM, KR_SUMPOSTDIV};
    const size_t count = 4096, bytes = count * 4;

    for (int li = 0; li < NLAYOUTS; li++) {
        const struct layout *l = &layouts[li];
        const struct alg_hosts hosts = hosts_of(l);
        for (int root = 0; root < l->n; root++) {
            for (int k = 0; k < 3; k++) {
                check_row(&reduce, l, root, 37 + (size_t)root * 5 + (size_t)k, kinds[k],
                          (root + k) % 3 == 0, (root + k) % 2 ? 12 : 1 << 20, 1 + (root + k) % 3,
                          (unsigned)(li * 43 + root * 3 + k));
            }
            size_t crossed = bytes_between_hosts(&reduce, l, &hosts, root, count, 4096, NULL);
            cr_assert_eq(crossed, (size_t)(hosts.nhosts - 1) * bytes,
                         "reduce on %s, root %d: %zu bytes between hosts", l->name, root,
                         crossed);
        }
    }
}

/* The hierarchical scatter and gather: right on every layout and root, in and out of place;
 * each block of another host than the root's crosses once, and a host's blocks together:
 * H - 1 messages between hosts. */
Test(hier, scatter_and_gather_cross_once_a_message_per_host)
{
    const size_t count = 4096, bytes = count * 4;

    for (int ri = 0; ri < 2; ri++) {
        for (int li = 0; li < NLAYOUTS; li++) {
            const struct layout *l = &layouts[li];
            const struct alg_hosts hosts = hosts_of(l);
            for (int root = 0; root < l->n; root++) {
                for (int w = 0; w < 3; w++) {
                    const size_t counts[] = {0, 1, 37 + (size_t)root};
                    check_row(&rooted[ri], l, root, counts[w], KR_SUM, (root + w) % 2, 1 << 20,
                              1, (unsigned)(li * 47 + root * 3 + w));
                }
                const int home = hosts_size(l, l->host_of[root]);
                int messages;
                size_t crossed =
                    bytes_between_hosts(&rooted[ri], l, &hosts, root, count, 4096, &messages);
                cr_assert_eq(crossed, (size_t)(l->n - home) * bytes,
                             "%s on %s, root %d: %zu bytes between hosts",
                             ref_coll_name(rooted[ri].coll), l->name, root, crossed);
                cr_assert_eq(messages, hosts.nhosts - 1, "%s on %s, root %d: %d messages",
                             ref_coll_name(rooted[ri].coll), l->name, root, messages);
            }
        }
    }
}

/* The hierarchical all-to-all sends a rank's blocks for a host in one message: n (H - 1)
 * between hosts, where pairwise sends one a block away. */
Test(hier, alltoall_sends_a_message_per_host)
{
    const struct row *alltoall = &rows[NROWS - 1];

    cr_assert_eq(alltoall->coll, ALG_COLL_ALLTOALL);
    for (int li = 0; li < NLAYOUTS; li++) {
        const struct layout *l = &layouts[li];
        const struct alg_hosts hosts = hosts_of(l);
        int messages;
        bytes_between_hosts(alltoall, l, &hosts, 0, 37, 131072, &messages);
        cr_assert_eq(messages, l->n * (hosts.nhosts - 1), "all-to-all on %s: %d messages",
                     l->name, messages);
    }
}

/* Every rank ranks the row alike: its cost depends on the layout, not on the rank. */
Test(hier, cost_is_the_same_on_every_rank)
{
    for (int k = 0; k < (NROWS + 2) * NLAYOUTS; k++) {
        const struct row *row = k / NLAYOUTS < NROWS ? &rows[k / NLAYOUTS]
                                                     : &rooted[k / NLAYOUTS - NROWS];
        const struct layout *l = &layouts[k % NLAYOUTS];
        const struct alg_hosts hosts = hosts_of(l);
        struct alg_cost first = {0};
        for (int r = 0; r < l->n; r++) {
            struct alg_args args = {.coll = row->coll, .count = 1 << 20, .elem_size = 4,
                                    .rank = r, .nranks = l->n, .root = l->n - 1,
                                    .chunk_bytes = 131072, .slots = 4, .hosts = &hosts};
            struct alg_cost cost = {0};
            row->cost(&args, &cost);
            if (r == 0) {
                first = cost;
            }
            cr_assert(memcmp(&cost, &first, sizeof(cost)) == 0, "%s on %s: rank %d's cost differs",
                      ref_coll_name(row->coll), l->name, r);
            cr_assert(cost.net_bytes > 0 && cost.net_steps > 0, "%s on %s: nothing crosses?",
                      ref_coll_name(row->coll), l->name);
        }
    }
}

/* Recursive doubling's rows charge the levels that pair ranks of one host to the host: where
 * hosts are equal runs of ranks and no rank folds away, a rank sends, unchunked, exactly
 * cost.bytes to its own host and cost.net_bytes to others (steps as many); elsewhere the cost
 * may count a message as crossing that stays (never the reverse), and the total is the same. */
Test(hier, recdbl_cost_splits_levels_as_the_schedule_sends)
{
    static const struct row recdbl[] = {
        {ALG_COLL_ALLREDUCE, alg_recdbl_allreduce, alg_recdbl_allreduce_bytes,
         alg_recdbl_allreduce_cost},
        {ALG_COLL_ALLGATHER, alg_recdbl_allgather, alg_recdbl_allgather_bytes,
         alg_recdbl_allgather_cost},
    };
    const size_t count = 1024;

    for (int row = 0; row < 2; row++) {
        for (int li = 0; li < NLAYOUTS; li++) {
            const struct layout *l = &layouts[li];
            const struct alg_hosts hosts = hosts_of(l);
            const bool exact = hosts.block > 0 && (l->n & (l->n - 1)) == 0;
            struct alg_cost cost = {0};
            double most_inside = 0;
            for (int r = 0; r < l->n; r++) {
                struct alg_args args = {.coll = recdbl[row].coll, .count = count,
                                        .elem_size = 4, .rank = r, .nranks = l->n,
                                        .chunk_bytes = 1 << 30, .slots = 4, .hosts = &hosts};
                struct alg_args blind = args;
                struct alg_cost flat = {0};
                struct alg_sched sched;
                double inside = 0, across = 0;
                int inside_sends = 0, across_sends = 0;

                blind.hosts = NULL;
                recdbl[row].cost(&args, &cost);
                recdbl[row].cost(&blind, &flat);
                alg_sched_init(&sched);
                cr_assert_eq(recdbl[row].build(&args, &sched), ncclSuccess);
                for (int i = 0; i < sched.nsteps; i++) {
                    const struct alg_step *step = &sched.steps[i];
                    if (step->kind != ALG_STEP_SEND) {
                        continue;
                    }
                    if (l->host_of[step->peer] != l->host_of[r]) {
                        across += (double)step->src[0].len;
                        across_sends++;
                    } else {
                        inside += (double)step->src[0].len;
                        inside_sends++;
                    }
                }
                alg_sched_free(&sched);
                most_inside = inside > most_inside ? inside : most_inside;
                const char *name = ref_coll_name(recdbl[row].coll);
                cr_assert_eq(cost.steps + cost.net_steps, flat.steps, "%s on %s", name, l->name);
                cr_assert_eq(cost.bytes + cost.net_bytes, flat.bytes, "%s on %s", name, l->name);
                cr_assert(!exact || (cost.bytes == inside && cost.net_bytes == across &&
                          cost.steps == inside_sends && cost.net_steps == across_sends),
                          "%s on %s, rank %d: cost %g B in %g steps inside, %g B in %g "
                          "across; the schedule sends %g B in %d inside, %g B in %d across",
                          name, l->name, r, cost.bytes, cost.steps, cost.net_bytes,
                          cost.net_steps, inside, inside_sends, across, across_sends);
            }
            cr_assert_leq(cost.bytes, most_inside, "%s on %s: cost %g B inside, no rank sends "
                          "as much inside (%g B)", ref_coll_name(recdbl[row].coll), l->name,
                          cost.bytes, most_inside);
        }
    }
}
