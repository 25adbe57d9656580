/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ring all-reduce and the dissemination barrier, run for every rank count 1..17 in the
 * in-memory simulator (test/sim): results against a reference, bytes sent against the
 * textbook figure, every interleaving legal (random order, rendezvous sends, no deadlock).
 * Int32 data keeps results exact, so a misplaced pre-multiply or post-divide shows.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "algorithms/alg.h"
#include "sim/sim.h"

static const size_t counts[] = {0, 1, 2, 3, 7, 16, 17, 100, 1001, 4099};

/* Runs one all-reduce of int32 on n ranks in the simulator and checks every rank's result. */
static void
check_allreduce(int n, size_t count, bool in_place, enum kr_op_kind kind, size_t chunk_bytes,
                int slots, unsigned seed)
{
    void *send[64], *recv[64];
    int32_t *expect = calloc(count + 1, sizeof(int32_t));
    struct kr_redop redops[64];

    for (int r = 0; r < n; r++) {
        /* Each rank its own PreMulSum scalar, as ranks may create different ones. */
        int32_t scalar = r + 2;
        redops[r] = (struct kr_redop){.kind = kind, .type = ncclInt32, .divisor = (uint64_t)n};
        memcpy(redops[r].scalar, &scalar, sizeof(scalar));
        int32_t *in = malloc((count + 1) * sizeof(int32_t));
        for (size_t i = 0; i < count; i++) {
            in[i] = (int32_t)((i * 7 + (size_t)r * 13) % 101) - 50;
            expect[i] += kind == KR_PREMULSUM ? scalar * in[i] : in[i];
        }
        send[r] = in;
        recv[r] = in_place ? in : calloc(count + 1, sizeof(int32_t));
    }
    for (size_t i = 0; kind == KR_SUMPOSTDIV && i < count; i++) {
        expect[i] /= n;
    }

    struct sim_op op = {
        .build = alg_ring_allreduce,
        .args = {.coll = ALG_COLL_ALLREDUCE, .count = count, .elem_size = 4, .nranks = n,
                 .in_place = in_place, .chunk_bytes = chunk_bytes, .slots = slots,
                 .prescale = kind == KR_PREMULSUM},
        .redops = redops, .send = send, .recv = recv, .seed = seed};
    struct sim_report report;
    bool ok = sim_run(&op, &report);
    cr_assert(ok, "n=%d count=%zu in_place=%d kind=%d: %s", n, count, in_place, kind,
              report.error);

    for (int r = 0; r < n; r++) {
        const int32_t *out = recv[r];
        for (size_t i = 0; i < count; i++) {
            cr_assert_eq(out[i], expect[i], "n=%d count=%zu rank %d elem %zu: %d != %d", n,
                         count, r, i, out[i], expect[i]);
        }
        /* Textbook traffic: reduce-scatter sends every block but r+1, all-gather every block
         * but r+2, so 2(n-1)/n of the buffer when blocks are even. */
        size_t first, len1 = 0, len2 = 0;
        if (n > 1) {
            alg_block(count, n, alg_mod(r + 1, n), &first, &len1);
            alg_block(count, n, alg_mod(r + 2, n), &first, &len2);
        }
        size_t expect_bytes = n > 1 ? (2 * count - len1 - len2) * 4 : 0;
        cr_assert_eq(report.bytes_sent[r], expect_bytes, "n=%d count=%zu rank %d sent %zu",
                     n, count, r, report.bytes_sent[r]);
    }
    for (int r = 0; r < n; r++) {
        if (!in_place) {
            free(recv[r]);
        }
        free(send[r]);
    }
    free(expect);
}

Test(ring_allreduce, every_rank_count_and_count)
{
    for (int n = 1; n <= 17; n++) {
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            check_allreduce(n, counts[c], false, KR_SUM, 64, 2, (unsigned)(n * 1000 + c));
            check_allreduce(n, counts[c], true, KR_SUM, 64, 2, (unsigned)(n * 1000 + c + 7));
        }
    }
}

Test(ring_allreduce, premul_and_postdiv_apply_once)
{
    for (int n = 1; n <= 9; n++) {
        check_allreduce(n, 1001, false, KR_PREMULSUM, 128, 3, (unsigned)n);
        check_allreduce(n, 1001, true, KR_PREMULSUM, 128, 3, (unsigned)n + 50);
        check_allreduce(n, 1001, false, KR_SUMPOSTDIV, 128, 3, (unsigned)n + 100);
        check_allreduce(n, 1001, true, KR_SUMPOSTDIV, 128, 3, (unsigned)n + 150);
    }
}

Test(ring_allreduce, one_slot_and_one_element_chunks_still_progress)
{
    for (int n = 2; n <= 6; n++) {
        check_allreduce(n, 37, true, KR_SUM, 4, 1, (unsigned)n);
        check_allreduce(n, 37, false, KR_SUM, 1, 1, (unsigned)n + 9); /* chunk < element */
    }
}

Test(ring_allreduce, many_interleavings)
{
    for (unsigned seed = 1; seed <= 200; seed++) {
        check_allreduce(5, 203, seed & 1, KR_SUM, 32, 2, seed);
    }
}

Test(barrier, completes_for_every_rank_count)
{
    for (int n = 1; n <= 17; n++) {
        void *bufs[64] = {0};
        struct kr_redop redops[64] = {{.kind = KR_SUM, .type = ncclInt8}};
        struct sim_op op = {.build = alg_dissemination_barrier,
                            .args = {.coll = ALG_COLL_BARRIER, .elem_size = 1, .nranks = n},
                            .redops = redops,
                            .send = bufs, .recv = bufs, .seed = (unsigned)n};
        struct sim_report report;
        cr_assert(sim_run(&op, &report), "n=%d: %s", n, report.error);
        int rounds = 0;
        while ((1 << rounds) < n) {
            rounds++;
        }
        cr_assert_eq(report.steps, 2 * rounds * n, "n=%d: %d steps", n, report.steps);
    }
}
