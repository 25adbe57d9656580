/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The in-memory schedule simulator: runs every rank's schedule of one operation (or one group
 * of operations per rank, as ncclGroupStart/End would) in this process, with the library's
 * own reduce/copy step (shim_exec_compute), so an algorithm is proven for any rank count
 * before it touches a network.
 *
 * Messages pair positionally, as the executor's tags make them pair: the k-th send from a to b
 * in a's schedule with the k-th receive from a in b's (in a group, over the group's steps in
 * order). Sends have rendezvous semantics (a send completes only once its receive is posted),
 * the strictest a transport may be. Among all actions possible at a moment (start a ready
 * step, complete a matched pair) one is picked at random from a seeded generator, so every run
 * explores a different legal interleaving. No possible action while steps remain is a
 * deadlock.
 *
 * Before anything runs, every schedule is checked: dependencies point backwards, peers exist,
 * message counts and lengths agree on both sides, reduce/copy operands have equal lengths in
 * whole, aligned elements and overlap exactly or not at all, and every non-empty range lies in
 * a buffer the rank has (a NULL buffer is a buffer the rank must not touch) and, where the
 * caller gives buffer sizes, inside it. While running, a step that writes bytes an in-flight
 * send or receive of the same rank reads or writes (or reads bytes an in-flight receive
 * writes) is a race: a real transport may touch a posted buffer at any time until completion.
 * Scratch starts filled with garbage.
 */
#ifndef SIM_SIM_H
#define SIM_SIM_H

#include <stdbool.h>
#include <stddef.h>

#include "algorithms/alg.h"
#include "kernels/kernels.h"

#define SIM_MAX_RANKS 64
#define SIM_MAX_PARTS 4

/* One operation of a rank's group. */
struct sim_part {
    alg_builder_t build;
    struct alg_args args; /* complete, rank included */
    void *send;
    void *recv;
    size_t send_bytes; /* sizes for range checks; SIM_UNCHECKED to skip */
    size_t recv_bytes;
};

#define SIM_UNCHECKED ((size_t)-1)

struct sim_op {
    alg_builder_t build;
    struct alg_args args;          /* rank is filled in per rank */
    const struct kr_redop *redops; /* per rank: PreMulSum scalars differ between ranks */
    void **send;                   /* per rank */
    void **recv;                   /* per rank */
    unsigned seed;
    /* Optional: per-rank buffer sizes in bytes, for range checks; NULL leaves them unchecked. */
    const size_t *send_bytes;
    const size_t *recv_bytes;
    /* Optional groups: when parts is non-NULL, rank r runs the nparts[r] operations
     * parts[r][0..nparts[r]-1] (at most SIM_MAX_PARTS), each with its own builder, args and
     * buffers, and build, send, recv, send_bytes and recv_bytes above are ignored; args.nranks
     * still gives the rank count. */
    const int *nparts;
    const struct sim_part *const *parts;
};

struct sim_report {
    size_t bytes_sent[SIM_MAX_RANKS]; /* per rank, all its parts together */
    int steps;
    char error[1024]; /* why it failed, with the seed */
};

/* True if every rank's schedule ran to completion; false with report->error otherwise. */
bool sim_run(const struct sim_op *op, struct sim_report *report);

#endif
