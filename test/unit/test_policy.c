/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NCCL_ALGO / NCCLSHIM_ALGO parsing and the cost-model choice (algorithms/policy.c,
 * select.c). Written against whatever rows the table has: each check looks rows up by name
 * and family, so adding algorithms does not break it.
 */
#include <criterion/criterion.h>
#include <math.h>

#include "algorithms/alg.h"

static int
row_of(const char *name, enum alg_coll coll)
{
    int count;
    const struct alg_algorithm *table = alg_table(&count);
    for (int i = 0; i < count; i++) {
        if (strcmp(table[i].name, name) == 0 && table[i].coll == coll) {
            return i;
        }
    }
    return -1;
}

static uint64_t
rows_of_family(const char *family, enum alg_coll coll)
{
    int count;
    const struct alg_algorithm *table = alg_table(&count);
    uint64_t rows = 0;
    for (int i = 0; i < count; i++) {
        if (strcmp(table[i].nccl, family) == 0 && table[i].coll == coll) {
            rows |= 1ull << i;
        }
    }
    return rows;
}

Test(policy, default_allows_every_row_of_each_collective)
{
    struct alg_policy policy;
    int count;
    const struct alg_algorithm *table = alg_table(&count);

    cr_assert_eq(alg_policy_parse(NULL, NULL, &policy), ncclSuccess);
    for (int i = 0; i < count; i++) {
        cr_assert(policy.allowed[table[i].coll] & (1ull << i), "row %s", table[i].name);
    }
}

Test(policy, nccl_families_include_exclude_and_per_collective)
{
    struct alg_policy policy;
    uint64_t ring = rows_of_family("ring", ALG_COLL_ALLREDUCE);
    uint64_t tree = rows_of_family("tree", ALG_COLL_ALLREDUCE);

    cr_assert_eq(alg_policy_parse("Ring", NULL, &policy), ncclSuccess);
    cr_assert_eq(policy.allowed[ALG_COLL_ALLREDUCE], ring);
    cr_assert_eq(alg_policy_parse("^Ring", NULL, &policy), ncclSuccess);
    /* Excluding every row of a collective is dropped for it. */
    cr_assert_eq(policy.allowed[ALG_COLL_ALLREDUCE], tree ? tree : ring);
    cr_assert_eq(alg_policy_parse("allreduce:ring;broadcast:tree", NULL, &policy), ncclSuccess);
    cr_assert_eq(policy.allowed[ALG_COLL_ALLREDUCE], ring);
    cr_assert_eq(alg_policy_parse("NVLS,Ring", NULL, &policy), ncclSuccess, "NVLS ignored");
    cr_assert_eq(policy.allowed[ALG_COLL_ALLREDUCE], ring);
}

Test(policy, shim_names_and_errors)
{
    struct alg_policy policy;
    int ring = row_of("ring", ALG_COLL_ALLREDUCE);

    cr_assert_geq(ring, 0);
    cr_assert_eq(alg_policy_parse(NULL, "allreduce:ring", &policy), ncclSuccess);
    cr_assert_eq(policy.allowed[ALG_COLL_ALLREDUCE], 1ull << ring);
    cr_assert_eq(alg_policy_parse(NULL, "RING", &policy), ncclSuccess, "case-insensitive");
    cr_assert_eq(alg_policy_parse(NULL, "nosuchalgo", &policy), ncclInvalidArgument);
    cr_assert_eq(alg_policy_parse("Tree,Bogus", NULL, &policy), ncclInvalidArgument);
    cr_assert_eq(alg_policy_parse(NULL, "allreduse:ring", &policy), ncclInvalidArgument);
}

Test(policy, choice_follows_the_policy_and_the_cost)
{
    struct alg_policy policy;
    struct alg_cost_params params = {.alpha = 1.5e-6, .beta = 1 / 4e9, .gamma = 1 / 3.4e9};
    struct alg_args args = {.coll = ALG_COLL_ALLREDUCE, .count = 1 << 20, .elem_size = 4,
                            .rank = 0, .nranks = 4, .chunk_bytes = 131072, .slots = 4};
    double estimate;

    cr_assert_eq(alg_policy_parse(NULL, "allreduce:ring", &policy), ncclSuccess);
    const struct alg_algorithm *alg = alg_select(&args, &policy, &params, &estimate);
    cr_assert(alg != NULL && strcmp(alg->name, "ring") == 0);
    cr_assert(isfinite(estimate) && estimate > 0);

    /* Unforced, the choice is the cheapest allowed row. */
    cr_assert_eq(alg_policy_parse(NULL, NULL, &policy), ncclSuccess);
    alg = alg_select(&args, &policy, &params, &estimate);
    int count;
    const struct alg_algorithm *table = alg_table(&count);
    for (int i = 0; i < count; i++) {
        if (table[i].coll == ALG_COLL_ALLREDUCE) {
            struct alg_cost cost;
            table[i].cost(&args, &cost);
            double t = cost.steps * params.alpha + cost.bytes * params.beta +
                       cost.reduce_bytes * params.gamma;
            cr_assert_geq(t, estimate, "%s is cheaper than the chosen %s", table[i].name,
                          alg->name);
        }
    }
    size_t chunk = alg_select_chunk(alg, &args, &params);
    cr_assert(chunk >= 4096 && chunk <= 131072, "chunk %zu", chunk);
}

/* Across two hosts of two ranks, recursive doubling's first level stays inside each host: one
 * message on the network against the hierarchical all-reduce's one plus two inside, so a
 * tiny all-reduce takes it; a large one takes the hierarchy, which carries half as much
 * across. (The defaults of nccl_shim/comm.c: shared memory 1.5 us and 4 GB/s, the network
 * 15 us and 1 GB/s.) */
Test(policy, two_hosts_choose_by_what_crosses)
{
    const int host_of[] = {0, 0, 1, 1};
    const struct alg_hosts hosts = {.nhosts = 2, .widest = 2, .narrowest = 2,
                                    .block = alg_hosts_block(host_of, 4, 2), .host_of = host_of};
    struct alg_cost_params params = {.alpha = 1.5e-6, .beta = 1 / 4e9, .gamma = 1 / 3.4e9,
                                     .alpha_net = 15e-6, .beta_net = 1 / 1e9};
    struct alg_args args = {.coll = ALG_COLL_ALLREDUCE, .count = 2, .elem_size = 4, .rank = 0,
                            .nranks = 4, .chunk_bytes = 131072, .slots = 4, .hosts = &hosts};
    struct alg_policy policy;

    cr_assert_eq(hosts.block, 2);
    cr_assert_eq(alg_policy_parse(NULL, NULL, &policy), ncclSuccess);
    const struct alg_algorithm *alg = alg_select(&args, &policy, &params, NULL);
    cr_assert(alg != NULL && strcmp(alg->name, "recdbl") == 0, "8 B: %s", alg->name);
    args.count = 4 << 20;
    alg = alg_select(&args, &policy, &params, NULL);
    cr_assert(alg != NULL && strcmp(alg->name, "hier") == 0, "16 MiB: %s", alg->name);
}

/* A tree's interior rank sends to its two children in turn, a message each: a tiny broadcast
 * over 4 ranks (tree: 2 levels of 2 messages; chain: 3) takes the chain, over 16 ranks (4
 * levels against 15 hops) the tree. Counting a level once took the tree at 4 ranks, whose
 * middle rank was measured slower than the chain across hosts. */
Test(policy, tree_counts_a_message_per_child)
{
    struct alg_cost_params params = {.alpha = 1.5e-6, .beta = 1 / 4e9, .gamma = 1 / 3.4e9};
    struct alg_args args = {.coll = ALG_COLL_BROADCAST, .count = 2, .elem_size = 4, .rank = 0,
                            .nranks = 4, .chunk_bytes = 131072, .slots = 4};
    struct alg_policy policy;

    cr_assert_eq(alg_policy_parse(NULL, NULL, &policy), ncclSuccess);
    const struct alg_algorithm *alg = alg_select(&args, &policy, &params, NULL);
    cr_assert(alg != NULL && strcmp(alg->name, "chain") == 0, "4 ranks: %s", alg->name);
    args.nranks = 16;
    alg = alg_select(&args, &policy, &params, NULL);
    cr_assert(alg != NULL && strcmp(alg->name, "tree") == 0, "16 ranks: %s", alg->name);
}

/* Scatter and gather across two hosts of four ranks, measured (2 x 4, six rounds of 500
 * calls): with 32 B - 8 KiB blocks the hierarchy's one message between hosts (three more
 * inside) made a scatter 1.8-2.7x as fast as direct sends, a gather 0.9-1.5x; with 128 KiB
 * blocks and up direct scatter was 10% faster (its sends inside the root's host run beside
 * those across, where an entry hands blocks on after they arrived). Across four hosts of
 * one rank the hierarchy saves nothing. */
Test(policy, rooted_across_hosts_take_a_message_per_host_while_small)
{
    static const enum alg_coll colls[] = {ALG_COLL_SCATTER, ALG_COLL_GATHER};
    const int two_by_four[] = {0, 0, 0, 0, 1, 1, 1, 1}, four_by_one[] = {0, 1, 2, 3};
    const struct alg_hosts wide = {.nhosts = 2, .widest = 4, .narrowest = 4, .block = 4,
                                   .host_of = two_by_four};
    const struct alg_hosts flat = {.nhosts = 4, .widest = 1, .narrowest = 1, .block = 1,
                                   .host_of = four_by_one};
    struct alg_cost_params params = {.alpha = 1.5e-6, .beta = 1 / 4e9, .gamma = 1 / 3.4e9,
                                     .alpha_net = 15e-6, .beta_net = 1 / 1e9};
    struct alg_policy policy;

    cr_assert_eq(alg_policy_parse(NULL, NULL, &policy), ncclSuccess);
    for (int c = 0; c < 2; c++) {
        struct alg_args args = {.coll = colls[c], .count = 256, .elem_size = 4, .rank = 5,
                                .nranks = 8, .root = 6, .chunk_bytes = 131072, .slots = 4,
                                .hosts = &wide};
        const struct alg_algorithm *alg = alg_select(&args, &policy, &params, NULL);
        cr_assert(alg != NULL && strcmp(alg->name, "hier") == 0, "2 x 4, 1 KiB: %s", alg->name);
        args.count = 32768;
        alg = alg_select(&args, &policy, &params, NULL);
        cr_assert(alg != NULL && strcmp(alg->name, "direct") == 0, "2 x 4, 128 KiB: %s",
                  alg->name);
        args.hosts = &flat;
        args.nranks = 4;
        args.rank = 1;
        args.root = 2;
        for (args.count = 2; args.count <= (1 << 20); args.count *= 64) {
            alg = alg_select(&args, &policy, &params, NULL);
            cr_assert(alg != NULL && strcmp(alg->name, "hier") != 0, "4 x 1, %zu B: %s",
                      args.count * 4, alg->name);
        }
    }
}

/* All-to-all across two hosts of two and of four ranks, measured (six rounds of 500 calls):
 * with 256 B - 2 KiB blocks the hierarchy's bundles (one message per rank to the other host,
 * handed on at home) went 1.2-1.5x (2 x 2) and 1.7-1.9x (2 x 4) as fast as pairwise; with
 * 256 KiB blocks and up pairwise was 1.3-1.4x as fast (four rounds of 20). A host of one rank
 * has nothing to hand on: pairwise. */
Test(policy, alltoall_across_hosts_bundles_while_small)
{
    const int two_by_two[] = {0, 0, 1, 1}, four_by_one[] = {0, 1, 2, 3};
    const struct alg_hosts pairs = {.nhosts = 2, .widest = 2, .narrowest = 2, .block = 2,
                                    .host_of = two_by_two};
    const struct alg_hosts flat = {.nhosts = 4, .widest = 1, .narrowest = 1, .block = 1,
                                   .host_of = four_by_one};
    struct alg_cost_params params = {.alpha = 1.5e-6, .beta = 1 / 4e9, .gamma = 1 / 3.4e9,
                                     .alpha_net = 15e-6, .beta_net = 1 / 1e9};
    struct alg_args args = {.coll = ALG_COLL_ALLTOALL, .count = 64, .elem_size = 4, .rank = 2,
                            .nranks = 4, .chunk_bytes = 131072, .slots = 4, .hosts = &pairs};
    struct alg_policy policy;

    cr_assert_eq(alg_policy_parse(NULL, NULL, &policy), ncclSuccess);
    const struct alg_algorithm *alg = alg_select(&args, &policy, &params, NULL);
    cr_assert(alg != NULL && strcmp(alg->name, "hier") == 0, "2 x 2, 256 B: %s", alg->name);
    args.count = 65536;
    alg = alg_select(&args, &policy, &params, NULL);
    cr_assert(alg != NULL && strcmp(alg->name, "pairwise") == 0, "2 x 2, 256 KiB: %s",
              alg->name);
    args.hosts = &flat;
    for (args.count = 2; args.count <= (1 << 20); args.count *= 64) {
        alg = alg_select(&args, &policy, &params, NULL);
        cr_assert(alg != NULL && strcmp(alg->name, "pairwise") == 0, "4 x 1, %zu B: %s",
                  args.count * 4, alg->name);
    }
}

/* A tree scatter stores and forwards: its middle ranks send on their subtrees' blocks once
 * all of them arrived. Over 4 ranks that is 5 blocks and 3 messages on the longest path
 * against direct's 3 and 3 (across 2 x 2 hosts direct sends were 1.15-1.3x as fast with
 * 64 B blocks; across 2 x 2 and 2 x 4, 1.2-2.5x from 128 KiB); over 16, 7 messages against
 * 15, which a tiny scatter takes and a large one not (37 blocks against 15). Charged as the
 * root's n - 1 blocks alone, the tree took every size. */
Test(policy, tree_scatter_pays_for_forwarding)
{
    static const enum alg_coll colls[] = {ALG_COLL_SCATTER, ALG_COLL_GATHER};
    struct alg_cost_params params = {.alpha = 1.5e-6, .beta = 1 / 4e9, .gamma = 1 / 3.4e9};
    struct alg_policy policy;

    cr_assert_eq(alg_policy_parse(NULL, NULL, &policy), ncclSuccess);
    for (int c = 0; c < 2; c++) {
        struct alg_args args = {.coll = colls[c], .count = 2, .elem_size = 4, .rank = 1,
                                .nranks = 4, .root = 3, .chunk_bytes = 131072, .slots = 4};
        const struct alg_algorithm *alg = alg_select(&args, &policy, &params, NULL);
        cr_assert(alg != NULL && strcmp(alg->name, "direct") == 0, "4 ranks: %s", alg->name);
        args.nranks = 16;
        alg = alg_select(&args, &policy, &params, NULL);
        cr_assert(alg != NULL && strcmp(alg->name, "tree") == 0, "16 ranks, 8 B: %s", alg->name);
        args.count = 1 << 20;
        alg = alg_select(&args, &policy, &params, NULL);
        cr_assert(alg != NULL && strcmp(alg->name, "direct") == 0, "16 ranks, 4 MiB: %s",
                  alg->name);
    }
}

static const char *
coll_name(enum alg_coll coll)
{
    return coll == ALG_COLL_BROADCAST ? "broadcast" : coll == ALG_COLL_REDUCE ? "reduce"
                                                                              : "all-reduce";
}

/* The model's time for row `alg` on args (as select.c weighs it, on one host). */
static double
model_time(const struct alg_algorithm *alg, const struct alg_args *args,
           const struct alg_cost_params *params)
{
    struct alg_cost cost = {0};

    alg->cost(args, &cost);
    return cost.steps * params->alpha + cost.bytes * params->beta +
           cost.reduce_bytes * params->gamma;
}

/* The pipelined rows count chunk times in their steps; the chunk alg_select_chunk picks must
 * still be near the best the model sees over every chunk size it allows (not cut small
 * because a large message makes many chunk times): a chain of two ranks, which has nothing to
 * pipeline, takes the largest. */
Test(policy, pipeline_chunk_is_near_the_models_best)
{
    const struct alg_cost_params params = {.alpha = 1.5e-6, .beta = 1 / 4e9,
                                           .gamma = 1 / 3.4e9};
    const size_t max_chunk = 1 << 20;
    int count;
    const struct alg_algorithm *table = alg_table(&count);

    for (int i = 0; i < count; i++) {
        const struct alg_algorithm *alg = &table[i];
        const bool pipelined = strcmp(alg->name, "chain") == 0 || strcmp(alg->name, "tree") == 0
                               || strcmp(alg->name, "dbtree") == 0;
        if (!pipelined || (alg->coll != ALG_COLL_BROADCAST && alg->coll != ALG_COLL_ALLREDUCE &&
                           alg->coll != ALG_COLL_REDUCE)) {
            continue;
        }
        for (int n = 2; n <= 16; n *= 2) {
            for (size_t count_elems = 1 << 14; count_elems <= (1u << 24); count_elems <<= 5) {
                struct alg_args args = {.coll = alg->coll, .count = count_elems, .elem_size = 4,
                                        .rank = 0, .nranks = n, .chunk_bytes = max_chunk,
                                        .slots = 4};
                args.chunk_bytes = alg_select_chunk(alg, &args, &params);
                const double chosen = model_time(alg, &args, &params);
                double best = chosen;
                for (size_t c = 4096; c <= max_chunk; c *= 2) {
                    args.chunk_bytes = c;
                    double t = model_time(alg, &args, &params);
                    best = t < best ? t : best;
                }
                cr_assert_leq(chosen, best * 1.05, "%s %s, %d ranks, %zu elements: the chosen "
                              "chunk's time %.1f us, the best %.1f us", alg->name,
                              coll_name(alg->coll), n, count_elems, chosen * 1e6,
                              best * 1e6);
            }
        }
    }
}

/* The smallest chunk the communicator allows (across hosts, 32 KiB) bounds every row's choice
 * from below, and a message smaller than it goes whole; without one, the model's optimum may
 * be smaller (a 2 x 2 all-gather of 16 KiB blocks: two chunks of about 11 KB). */
Test(policy, pipeline_chunk_keeps_to_the_floor)
{
    const struct alg_cost_params params = {.alpha = 1.5e-6, .beta = 1 / 4e9, .gamma = 1 / 3.4e9,
                                           .alpha_net = 15e-6, .beta_net = 1 / 1e9};
    static const int host_of[4] = {0, 0, 1, 1};
    const struct alg_hosts hosts = {.nhosts = 2, .widest = 2, .narrowest = 2,
                                    .host_of = host_of, .block = 2};
    const size_t floor = 32 << 10;
    int count;
    const struct alg_algorithm *table = alg_table(&count);
    bool smaller_without = false;

    for (int i = 0; i < count; i++) {
        const struct alg_algorithm *alg = &table[i];
        for (size_t elems = 1 << 10; elems <= (1u << 22); elems <<= 3) {
            struct alg_args args = {.coll = alg->coll, .count = elems, .elem_size = 4,
                                    .rank = 0, .nranks = 4, .chunk_bytes = 512 << 10,
                                    .chunk_min_bytes = floor, .slots = 4, .hosts = &hosts};
            const size_t chosen = alg_select_chunk(alg, &args, &params);
            cr_assert_geq(chosen, floor, "%s %s, %zu elements: chunk %zu under the floor",
                          alg->name, coll_name(alg->coll), elems, chosen);
            args.chunk_min_bytes = 0;
            smaller_without |= alg_select_chunk(alg, &args, &params) < floor;
        }
    }
    cr_assert(smaller_without, "no row chose a chunk under 32 KiB without the floor: the test "
                               "shows nothing");
}
