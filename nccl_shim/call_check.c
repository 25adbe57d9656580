/* SPDX-License-Identifier: Apache-2.0 */
/*
 * NCCLSHIM_CHECK=1: before a group's collectives run, every rank sends every other rank what
 * it is about to call (collective, sequence number, count, datatype, op, root), over the
 * management tag space, all ops' exchanges together in one run. Every rank compares the same
 * table, so all of them refuse the same calls with ncclInvalidUsage and the same message,
 * instead of hanging or mixing up data. ncclSend/ncclRecv pair per peer and are not checked.
 */
#include "call_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/debug.h"
#include "comm.h"
#include "engine/exec.h"

struct shim_call_desc {
    uint32_t seq;
    int32_t coll;
    uint64_t count;
    int32_t datatype;
    int32_t op;   /* the resolved kind: Avg on a float type is PreMulSum on every rank */
    int32_t root;
    int32_t pad;
};

static bool
shim_call_checked(const struct shim_op *op)
{
    return op->coll != SHIM_COLL_SEND && op->coll != SHIM_COLL_RECV;
}

static struct shim_call_desc
shim_call_describe(const struct shim_exec *exec)
{
    const struct shim_op *op = shim_exec_op(exec);
    return (struct shim_call_desc){.seq = shim_exec_seq(exec), .coll = (int32_t)op->coll,
                                   .count = op->count, .datatype = (int32_t)op->datatype,
                                   .op = (int32_t)op->redop.kind, .root = op->root};
}

static int
shim_call_format(const struct shim_call_desc *d, char *buf, size_t len)
{
    static const char *const ops[] = {"sum", "prod", "max", "min", "premulsum", "avg"};
    return snprintf(buf, len, "%s #%u (count %llu, %s%s%s, root %d)",
                    shim_coll_name((enum shim_coll)d->coll), d->seq,
                    (unsigned long long)d->count, kr_type_name((ncclDataType_t)d->datatype),
                    shim_coll_reduces((enum shim_coll)d->coll) ? ", " : "",
                    !shim_coll_reduces((enum shim_coll)d->coll) ? ""
                    : d->op >= 0 && d->op < 6   ? ops[d->op]
                                                : "?",
                    d->root);
}

/* Appends name to a comma-separated list in buf. */
static void
shim_call_add(char *buf, size_t len, bool differs, const char *name)
{
    size_t used = strlen(buf);
    if (differs && used < len) {
        snprintf(buf + used, len - used, "%s%s", used ? ", " : "", name);
    }
}

/* ncclInvalidUsage with one WARN if any rank's call differs from rank 0's. */
static ncclResult_t
shim_call_compare(const struct ncclComm *comm, const struct shim_call_desc *all)
{
    for (int r = 1; r < comm->nranks; r++) {
        const struct shim_call_desc *a = &all[0], *b = &all[r];
        char first[160], other[160], fields[96] = "";
        shim_call_add(fields, sizeof(fields), a->coll != b->coll, "collective");
        shim_call_add(fields, sizeof(fields), a->seq != b->seq, "sequence");
        shim_call_add(fields, sizeof(fields), a->count != b->count, "count");
        shim_call_add(fields, sizeof(fields), a->datatype != b->datatype, "datatype");
        shim_call_add(fields, sizeof(fields), a->op != b->op, "op");
        shim_call_add(fields, sizeof(fields), a->root != b->root, "root");
        if (fields[0] == '\0') {
            continue;
        }
        shim_call_format(a, first, sizeof(first));
        shim_call_format(b, other, sizeof(other));
        WARN("NCCLSHIM_CHECK: ranks disagree on a call of comm %p: rank 0 calls %s, rank %d "
             "calls %s (%s differ)", (const void *)comm, first, r, other, fields);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

ncclResult_t
shim_call_check(struct shim_exec *const *execs, int nexecs)
{
    struct shim_exec **checks;
    struct shim_call_desc *mine, *all;
    size_t total = 0;
    int nchecks = 0;
    ncclResult_t res = ncclSuccess;

    for (int i = 0; i < nexecs; i++) {
        total += (size_t)shim_exec_op(execs[i])->comm->nranks;
    }
    SHIM_CHECK(shim_calloc(&checks, (size_t)nexecs));
    SHIM_CHECK_GOTO(shim_calloc(&mine, (size_t)nexecs), res, out_checks);
    SHIM_CHECK_GOTO(shim_calloc(&all, total), res, out_mine);

    size_t at = 0;
    for (int i = 0; i < nexecs; i++) {
        const struct shim_op *op = shim_exec_op(execs[i]);
        struct ncclComm *comm = op->comm;
        struct alg_sched sched;
        if (!shim_call_checked(op) || comm->nranks < 2) {
            continue;
        }
        mine[i] = shim_call_describe(execs[i]);
        all[at + (size_t)comm->rank] = mine[i];
        alg_sched_init(&sched);
        alg_exchange_all(&sched, NULL, comm->nranks, comm->rank,
                         sizeof(struct shim_call_desc));
        res = alg_sched_finish(&sched);
        if (res == ncclSuccess) {
            res = shim_exec_create_schedule(comm, &sched, &mine[i], &all[at], &checks[nchecks]);
        }
        alg_sched_free(&sched);
        if (res != ncclSuccess) {
            goto out;
        }
        nchecks++;
        at += (size_t)comm->nranks;
    }
    SHIM_CHECK_GOTO(shim_exec_run(checks, nchecks), res, out);

    at = 0;
    for (int i = 0; i < nexecs && res == ncclSuccess; i++) {
        const struct shim_op *op = shim_exec_op(execs[i]);
        if (shim_call_checked(op) && op->comm->nranks >= 2) {
            res = shim_call_compare(op->comm, &all[at]);
            at += (size_t)op->comm->nranks;
        }
    }
out:
    for (int i = 0; i < nchecks; i++) {
        shim_exec_destroy(checks[i]);
    }
    free(all);
out_mine:
    free(mine);
out_checks:
    free(checks);
    return res;
}
