/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cudaipc/tasks.c: how the GPUs of a device team split an operation. The parts of an
 * all-reduce (reduce, broadcast) cover every element once, start on 256-byte boundaries, and
 * come out alike on every rank (ranks compute their own GPU's part to leave it out of their
 * staging, leaders to compute it); a GPU that serves every rank does the whole operation.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "cudaipc/tasks.h"

Test(tasks, parts_cover_every_element_once_on_granule_boundaries)
{
    const size_t sizes[] = {1, 2, 4, 8};
    const size_t counts[] = {0, 1, 7, 63, 64, 65, 255, 256, 257, 1000, 4096, 12345, 1u << 20};

    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            for (int nparts = 1; nparts <= 9; nparts++) {
                size_t next = 0;
                for (int p = 0; p < nparts; p++) {
                    size_t lo, hi;
                    cipc_part_range(counts[c], sizes[s], p, nparts, &lo, &hi);
                    cr_assert_eq(lo, next, "count %zu, %zu-byte elements: part %d of %d starts "
                                 "at %zu, not %zu", counts[c], sizes[s], p, nparts, lo, next);
                    cr_assert(hi >= lo && hi <= counts[c]);
                    cr_assert(lo == counts[c] || lo * sizes[s] % 256 == 0,
                              "part %d of %d starts at byte %zu", p, nparts, lo * sizes[s]);
                    next = hi;
                }
                cr_assert_eq(next, counts[c], "count %zu, %zu-byte elements, %d parts: the "
                             "parts end at %zu", counts[c], sizes[s], nparts, next);
            }
        }
    }
}

Test(tasks, parts_are_even_to_a_granule)
{
    /* 8 parts of 64 MiB of floats: 8 MiB each. */
    size_t count = (size_t)16 << 20, lo, hi;

    for (int p = 0; p < 8; p++) {
        cipc_part_range(count, 4, p, 8, &lo, &hi);
        cr_assert_eq(hi - lo, count / 8);
    }
}

Test(tasks, whole_work_owns_every_rank)
{
    struct cipc_work *w = calloc(1, sizeof(*w));

    cr_assert_not_null(w);
    w->nranks = 5;
    cipc_work_whole(w);
    for (int r = 0; r < w->nranks; r++) {
        cr_assert(w->owns[r] && w->on_root_gpu[r]);
    }
    cr_assert_eq(w->part, 0);
    cr_assert_eq(w->nparts, 1);
    free(w);
}
