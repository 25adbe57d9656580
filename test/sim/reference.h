/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reference data for simulated collectives: every rank's buffers laid out as the NCCL call
 * would pass them (alg.h's layouts; in place as one allocation with SEND and RECV inside it;
 * NULL for a buffer the rank does not use), filled with int32 data that names its (rank,
 * index), and the exact bytes every allocation must hold afterwards, computed directly.
 *
 * Every allocation has guard bytes on both sides and is compared whole after the run: the
 * output region against the reference result, input regions against their input (a collective
 * does not modify its input, in place or not), guards intact. A RECV region starts poisoned,
 * so an element the algorithm never writes shows.
 *
 * Reductions use small values, and wrap-around int32 arithmetic is order independent, so
 * every kind is exact: SUM, PROD (odd values, so products never vanish), MAX, MIN, PREMULSUM
 * (rank r's scalar is r + 2, applied by r to its own input only) and SUMPOSTDIV (integer
 * Avg: the sum divided by nranks, truncated toward zero as C does).
 *
 * ALG_COLL_SEND (or RECV) as a case means the ring exchange: rank r sends count elements to
 * r + 1 and receives count from r - 1, in one group of a SEND operation (sim part 0, root =
 * the peer) and a RECV operation (part 1). ALG_COLL_BARRIER has no buffers.
 */
#ifndef SIM_REFERENCE_H
#define SIM_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/alg.h"
#include "kernels/kernels.h"
#include "sim.h"

#define REF_GUARD_BYTES 64

struct ref_case {
    enum alg_coll coll;
    int nranks;
    size_t count;  /* as the NCCL call counts it */
    int root;      /* rooted collectives only */
    bool in_place; /* honoured where the collective has an in-place form, at the ranks it has */
    enum kr_op_kind kind; /* reductions only */
};

/* One allocation: REF_GUARD_BYTES, bytes, REF_GUARD_BYTES. */
struct ref_alloc {
    uint8_t *raw;
    uint8_t *base;   /* raw + REF_GUARD_BYTES */
    size_t bytes;
    uint8_t *expect; /* what base[0..bytes) must hold afterwards */
    const char *what; /* "SEND", "RECV" or "in-place SEND/RECV" */
    size_t send_off, recv_off; /* in place: where SEND and RECV start, in bytes */
};

struct ref_rank {
    struct ref_alloc alloc[2];
    int nalloc;
};

/* The buffers of one case, in the form sim_op and sim_part take. */
struct ref_data {
    struct ref_case c;
    struct ref_rank ranks[SIM_MAX_RANKS];
    struct kr_redop redops[SIM_MAX_RANKS];
    void *send[SIM_MAX_RANKS];
    void *recv[SIM_MAX_RANKS];
    size_t send_bytes[SIM_MAX_RANKS];
    size_t recv_bytes[SIM_MAX_RANKS];
    bool in_place[SIM_MAX_RANKS]; /* as the executor decides it from the pointers */
    /* The ring exchange (SEND/RECV): part 0 sends from send[r], part 1 receives in recv[r]. */
};

const char *ref_coll_name(enum alg_coll coll);
const char *ref_kind_name(enum kr_op_kind kind);
bool ref_coll_reduces(enum alg_coll coll);
bool ref_coll_rooted(enum alg_coll coll);
bool ref_coll_has_in_place(enum alg_coll coll);

/* Allocates and fills every rank's buffers and the expected contents. False only when out of
 * memory (nothing is left allocated then). Release with ref_free. */
bool ref_setup(const struct ref_case *c, struct ref_data *d);
/* True if every allocation holds what it must and its guards are intact; otherwise false with
 * the first difference found, and how many elements differ, in err. */
bool ref_check(const struct ref_data *d, char *err, size_t errlen);
void ref_free(struct ref_data *d);

#endif
