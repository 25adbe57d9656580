/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The in-memory schedule simulator: runs every rank's schedule of one operation in this
 * process, with the library's own reduce/copy step (shim_exec_compute), so an algorithm is
 * proven for any rank count before it touches a network.
 *
 * Messages pair positionally, as the executor's tags make them pair: the k-th send from a to b
 * in a's schedule with the k-th receive from a in b's. Sends have rendezvous semantics (a send
 * completes only once its receive is posted), the strictest a transport may be. Among all
 * actions possible at a moment (start a ready step, complete a matched pair) one is picked at
 * random from a seeded generator, so every run explores a different legal interleaving. No
 * possible action while steps remain is a deadlock.
 */
#ifndef SIM_SIM_H
#define SIM_SIM_H

#include <stdbool.h>
#include <stddef.h>

#include "algorithms/alg.h"
#include "kernels/kernels.h"

struct sim_op {
    alg_builder_t build;
    struct alg_args args; /* rank is filled in per rank */
    const struct kr_redop *redops; /* per rank: PreMulSum scalars differ between ranks */
    void **send; /* per rank */
    void **recv; /* per rank */
    unsigned seed;
};

struct sim_report {
    size_t bytes_sent[64]; /* per rank, for nranks <= 64 */
    int steps;
    char error[512];       /* why it failed, with the seed */
};

/* True if every rank's schedule ran to completion; false with report->error otherwise. */
bool sim_run(const struct sim_op *op, struct sim_report *report);

#endif
