/* SPDX-License-Identifier: Apache-2.0 */
/*
 * direct.c in the simulator: scatter and gather for every n 1..17, count, root, in and out
 * of place (coll_check.h), and send/recv as ncclSend/ncclRecv pairs inside a group: each rank
 * sends to one peer and receives from another (a permutation, self included), with empty
 * messages still matched.
 */
#include "coll_check.h"

Test(direct, scatter_every_rank_count_root_and_count)
{
    int runs = cc_sweep(alg_direct_scatter, alg_direct_scatter_bytes, alg_direct_scatter_cost,
                        ALG_COLL_SCATTER, true, false);
    cr_assert_gt(runs, 0);
}

Test(direct, gather_every_rank_count_root_and_count)
{
    int runs = cc_sweep(alg_direct_gather, alg_direct_gather_bytes, alg_direct_gather_cost,
                        ALG_COLL_GATHER, true, false);
    cr_assert_gt(runs, 0);
}

Test(direct, many_interleavings)
{
    for (unsigned seed = 1; seed <= 100; seed++) {
        struct cc_case c = {.build = alg_direct_scatter, .bytes = alg_direct_scatter_bytes,
                            .cost = alg_direct_scatter_cost, .coll = ALG_COLL_SCATTER, .n = 7,
                            .count = 13, .root = (int)seed % 7, .in_place = seed & 1,
                            .kind = KR_SUM, .seed = seed};
        cc_check(&c);
        c.build = alg_direct_gather;
        c.bytes = alg_direct_gather_bytes;
        c.cost = alg_direct_gather_cost;
        c.coll = ALG_COLL_GATHER;
        cc_check(&c);
    }
}

/* Send/recv: a group in which rank r sends to p2p_to[r] and receives from its inverse. */
static int p2p_to[64], p2p_from[64];
static bool p2p_recv_first;

static ncclResult_t
p2p_group(const struct alg_args *args, struct alg_sched *sched)
{
    struct alg_args s = *args, r = *args;
    s.coll = ALG_COLL_SEND;
    s.root = p2p_to[args->rank];
    r.coll = ALG_COLL_RECV;
    r.root = p2p_from[args->rank];
    ncclResult_t res = p2p_recv_first ? alg_direct_recv(&r, sched) : alg_direct_send(&s, sched);
    if (res != ncclSuccess) {
        return res;
    }
    return p2p_recv_first ? alg_direct_send(&s, sched) : alg_direct_recv(&r, sched);
}

static void
check_p2p(int n, size_t count, unsigned seed)
{
    void *send[64], *recv[64];
    struct kr_redop redops[64];

    for (int r = 0; r < n; r++) {
        redops[r] = (struct kr_redop){.kind = KR_SUM, .type = ncclInt32, .divisor = 1};
        int32_t *in = cc_alloc(count), *out = cc_alloc(count);
        for (size_t i = 0; i < count; i++) {
            in[i] = cc_input(r, i, seed);
        }
        send[r] = in;
        recv[r] = out;
    }
    struct sim_op op = {.build = p2p_group,
                        .args = {.count = count, .elem_size = 4, .nranks = n},
                        .redops = redops, .send = send, .recv = recv, .seed = seed};
    struct sim_report report;
    cr_assert(sim_run(&op, &report), "n=%d count=%zu: %s", n, count, report.error);
    cr_assert_eq(report.steps, 2 * n, "every pair exchanges exactly one message");
    for (int r = 0; r < n; r++) {
        const int32_t *out = recv[r];
        for (size_t i = 0; i < count; i++) {
            cr_assert_eq(out[i], cc_input(p2p_from[r], i, seed), "n=%d rank %d elem %zu", n, r,
                         i);
        }
        cc_guard_check(send[r], count, "send", r);
        cc_guard_check(recv[r], count, "recv", r);
        struct alg_args a = op.args;
        a.rank = r;
        a.root = p2p_to[r];
        cr_assert_eq(report.bytes_sent[r], alg_direct_send_bytes(&a));
        a.root = p2p_from[r];
        cr_assert_eq(alg_direct_recv_bytes(&a), 0);
        free((int32_t *)send[r] - 1);
        free((int32_t *)recv[r] - 1);
    }
}

Test(direct, send_recv_every_shift_self_included)
{
    for (int n = 1; n <= 17; n++) {
        for (int shift = 0; shift < n; shift++) {
            for (int w = 0; w < CC_NCOUNTS; w++) {
                for (int r = 0; r < n; r++) {
                    p2p_to[r] = (r + shift) % n;
                    p2p_from[p2p_to[r]] = r;
                }
                p2p_recv_first = (shift + w) % 2;
                check_p2p(n, cc_count(n, w), (unsigned)(n * 100 + shift * 10 + w + 1));
            }
        }
    }
}

Test(direct, send_recv_random_permutations)
{
    unsigned state = 12345;
    for (int trial = 0; trial < 200; trial++) {
        const int n = 1 + trial % 17;
        for (int r = 0; r < n; r++) {
            p2p_to[r] = r;
        }
        for (int r = n - 1; r > 0; r--) {
            state = state * 1103515245u + 12345u;
            int j = (int)((state >> 8) % (unsigned)(r + 1)), t = p2p_to[r];
            p2p_to[r] = p2p_to[j];
            p2p_to[j] = t;
        }
        for (int r = 0; r < n; r++) {
            p2p_from[p2p_to[r]] = r;
        }
        p2p_recv_first = trial % 2;
        check_p2p(n, (size_t)(trial % 5 == 0 ? 0 : trial * 3 + 1), (unsigned)trial + 1);
    }
}
