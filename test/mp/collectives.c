/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every collective through the real libnccl.so.2, on N ranks started by tools/launcher:
 * ncclAllReduce, ncclReduce, ncclReduceScatter, ncclBroadcast (and ncclBcast), ncclAllGather,
 * ncclAlltoAll, ncclGather, ncclScatter and ncclSend/ncclRecv, each on every datatype, every
 * reduction where it reduces (sum, prod, max, min, avg, PreMulSum with a scalar per rank),
 * counts {0, 1, n-1, 1001, 65537}, in place and out of place as nccl.h defines them, and every
 * root (a sample of four with more than five ranks); then groups mixing several collectives
 * with send/recv pairs, nested groups, send-to-self and in-order matching of several messages
 * per peer; then ncclCommSplit (color by rank parity, keys reversing the order, one rank with
 * NCCL_SPLIT_NOCOLOR) and ncclCommShrink (one rank excluded), each followed by collectives
 * on the new communicators.
 *
 * Reductions use reduce_data.h's exact tables: element i of a case (counted over the whole
 * send buffer, so that reduce-scatter's blocks differ) takes pattern hash(i) mod AR_NPAT;
 * data movement puts in hash(source rank, i) bytes, so a block from the wrong rank or at the
 * wrong offset shows. Checks compare bytes. Out of place, the send buffer must come back
 * unchanged and the receive buffer is poisoned first; 64 guard bytes past every buffer must
 * stay untouched; buffers start 0, 1 or 2 elements past an aligned address. In place means:
 * all-reduce, reduce, broadcast: sendbuff == recvbuff; all-gather: sendbuff == recvbuff +
 * rank * count; reduce-scatter: recvbuff == sendbuff + rank * count; gather: sendbuff ==
 * recvbuff + root * count at the root; scatter: recvbuff == sendbuff + root * count at the
 * root (other ranks pass their own block the same way, as nccl-tests does). Out of place,
 * every other case passes NULL where NCCL allows it: recvbuff on non-roots of reduce and
 * gather, sendbuff on non-roots of scatter. All-to-all runs out of place only: nccl.h does
 * not define it in place.
 *
 * A collective the library refuses (say, "no algorithm implements X yet") is reported once,
 * counted as failed, and skipped from then on: every rank refuses alike, so none is left
 * waiting.
 *
 * Device mode (-D KIND): the same cases on buffers a kernel reaches, of KIND device, memalloc,
 * managed, registered, or mixed (every kind in turn, one per case or group item; device.h).
 * The host buffers above stay the cases' truth: before each call their used bytes (guards
 * included) go to device mirrors at the same offsets, the call takes the mirrors' addresses on
 * a stream (the legacy NULL stream every third case), and after synchronising the stream the
 * bytes come back to be checked as on the host. PreMulSum scalars live in device memory
 * (ncclScalarDevice) every other case. With the driver's test double, the end checks that the
 * library left nothing open: no IPC mapping, registration or stream.
 *
 * Usage: collectives [-q] [-c LIST] [-D KIND] [-v]. -q is the quick subset (five types,
 * counts up to 1001 but one 65537 case per collective, one root per case), for
 * AddressSanitizer and for runs under each forced algorithm; -c runs only the comma-separated
 * parts of LIST: allreduce, reduce, reducescatter, broadcast, allgather, alltoall, gather,
 * scatter, sendrecv, groups, split, shrink (default: all); -v prints every case. Rank 0 prints
 * one summary line; the exit status is 1 on this rank if any of its checks failed.
 */
#include "common.h"

#include <unistd.h>

#include "device.h"
#include "reduce_data.h"

#define CO_GUARD 64      /* bytes past every buffer that must stay untouched */
#define CO_MAX_OFFSET 2  /* buffers start 0..2 elements past malloc's alignment */
#define CO_SHOW 3        /* wrong elements printed per check */
#define CO_LARGE 65537   /* the large count: several pipeline chunks, not a power of two */
#define CO_POISON 0xcd
#define CO_GUARD_BYTE 0xee

enum co_coll {
    CO_ALLREDUCE,
    CO_REDUCE,
    CO_REDUCESCATTER,
    CO_BROADCAST,
    CO_ALLGATHER,
    CO_ALLTOALL,
    CO_GATHER,
    CO_SCATTER,
    CO_SENDRECV,
    CO_GROUPS,
    CO_SPLIT,
    CO_SHRINK,
    CO_NPARTS
};

static const char *const co_names[CO_NPARTS] = {
    "allreduce", "reduce", "reducescatter", "broadcast", "allgather", "alltoall",
    "gather", "scatter", "sendrecv", "groups", "split", "shrink",
};

struct co_run {
    struct mp_world world;
    bool quick;
    bool verbose;
    bool want[CO_NPARTS];
    bool refused[CO_NPARTS]; /* the library refused this collective once: skip the rest */
    uint8_t *send_base;      /* two buffers of buf_bytes, freed by main */
    uint8_t *recv_base;
    size_t buf_bytes;
    int cases;
    int failed_cases;
    /* Device mode. */
    bool device;
    int kind;                           /* enum mp_mem_kind, or -1: each in turn */
    struct mp_cuda cu;
    CUstream stream;
    void *dsend[MP_MEM_KINDS];          /* mirrors of send_base and recv_base, per kind */
    void *drecv[MP_MEM_KINDS];
};

/* One case: what is being run, for messages, and the buffers as the call sees them. */
struct co_case {
    enum co_coll coll;
    ncclDataType_t type;
    size_t size;
    size_t count;
    bool in_place;
    bool null_ok;  /* pass NULL where NCCL allows it (out of place, every other case) */
    int root;
    uint64_t salt;
    char name[128];
};

/* --- data --------------------------------------------------------------------------------- */

static inline int
co_pattern(size_t i, uint64_t salt)
{
    return (int)(mp_hash(i ^ salt) % AR_NPAT);
}

/* Reduction input: elements index0 .. index0 + count - 1 of this rank's send buffer. */
static void
co_fill_red(uint8_t *buf, size_t count, const struct ar_tables *tb, uint64_t salt,
            size_t index0)
{
    for (size_t k = 0; k < count; k++) {
        memcpy(buf + k * tb->size, tb->in + co_pattern(index0 + k, salt) * tb->size, tb->size);
    }
}

/* Data movement: element i of rank src's send buffer, any bits. */
static void
co_fill_move(uint8_t *buf, size_t count, size_t size, uint64_t salt, int src, size_t index0)
{
    for (size_t k = 0; k < count; k++) {
        uint64_t h = mp_hash4(salt, (uint64_t)src, index0 + k, 0x6d6f7665);
        memcpy(buf + k * size, &h, size);
    }
}

static long
co_report_wrong(const struct co_case *cs, const char *what, size_t k, const void *got,
                const void *want, long wrong)
{
    if (wrong < CO_SHOW) {
        uint64_t g = 0, w = 0;
        memcpy(&g, got, cs->size);
        memcpy(&w, want, cs->size);
        mp_report(__FILE__, __LINE__, "%s: %s element %zu: got 0x%llx (%.9g), expected 0x%llx "
                  "(%.9g)", cs->name, what, k, (unsigned long long)g, mp_load(cs->type, got),
                  (unsigned long long)w, mp_load(cs->type, want));
    }
    return 1;
}

/* Elements of buf that differ from the table's `table` entries for index0 + k. */
static long
co_check_red(const struct co_case *cs, const uint8_t *buf, size_t count, const uint8_t *table,
             size_t index0, const char *what)
{
    long wrong = 0;

    for (size_t k = 0; k < count; k++) {
        const uint8_t *want = table + co_pattern(index0 + k, cs->salt) * cs->size;
        if (memcmp(buf + k * cs->size, want, cs->size) != 0) {
            wrong += co_report_wrong(cs, what, k, buf + k * cs->size, want, wrong);
        }
    }
    return wrong;
}

/* Elements of buf that differ from rank src's elements index0.. of data movement. */
static long
co_check_move(const struct co_case *cs, const uint8_t *buf, size_t count, int src,
              size_t index0, const char *what)
{
    long wrong = 0;

    for (size_t k = 0; k < count; k++) {
        uint8_t want[8];
        co_fill_move(want, 1, cs->size, cs->salt, src, index0 + k);
        if (memcmp(buf + k * cs->size, want, cs->size) != 0) {
            wrong += co_report_wrong(cs, what, k, buf + k * cs->size, want, wrong);
        }
    }
    return wrong;
}

static void
co_guard_set(uint8_t *end)
{
    memset(end, CO_GUARD_BYTE, CO_GUARD);
}

static long
co_guard_check(const struct co_case *cs, const uint8_t *end, const char *what)
{
    for (int i = 0; i < CO_GUARD; i++) {
        if (end[i] != CO_GUARD_BYTE) {
            mp_report(__FILE__, __LINE__, "%s: %s written past its end (byte %d is 0x%02x)",
                      cs->name, what, i, end[i]);
            return 1;
        }
    }
    return 0;
}

/* --- device mode ------------------------------------------------------------------------- */

/* The memory kind of case (or group item) number n. */
static enum mp_mem_kind
co_kind(const struct co_run *run, int n)
{
    return run->kind >= 0 ? (enum mp_mem_kind)run->kind : (enum mp_mem_kind)(n % MP_MEM_KINDS);
}

/* The stream of case n: the legacy default one every third case. */
static CUstream
co_stream(const struct co_run *run, int n)
{
    return n % 3 == 2 ? NULL : run->stream;
}

/* p, in base's mirror (NULL stays NULL). */
static void *
co_mirror(const uint8_t *base, void *mirror, const void *p)
{
    return p != NULL ? (uint8_t *)mirror + ((const uint8_t *)p - base) : NULL;
}

/* A PreMulSum scalar in device memory (ncclScalarDevice), in the case's kind; the caller
 * frees it with mp_cuda_free after the call is done. */
static void *
co_device_scalar(struct co_run *run, enum mp_mem_kind kind, const uint8_t scalar[8],
                 CUstream stream)
{
    void *dev = mp_cuda_alloc(&run->cu, kind, 8);
    mp_cuda_copy(&run->cu, dev, scalar, 8, stream);
    return dev;
}

/* --- one collective call ------------------------------------------------------------------ */

/*
 * Runs one case. The buffers: send (send_elems) and recv (recv_elems), each followed by a
 * guard, or one buffer of max(...) elements in place, laid out as NCCL defines. Returns the
 * number of wrong elements, or -1 if the library refused the call.
 */
static long
co_case_run(struct co_run *run, struct co_case *cs, const struct ar_tables *tb)
{
    ncclComm_t comm = run->world.comm;
    int n = run->world.nranks, me = run->world.rank, root = cs->root;
    size_t c = cs->count, sz = cs->size, nc = (size_t)n * c;
    bool is_root = me == root;
    size_t send_elems, recv_elems;
    uint8_t *send, *recv, *sendp, *recvp;
    ncclRedOp_t op = ncclSum;
    ncclResult_t res = ncclSuccess;
    long wrong = 0;

    switch (cs->coll) {
    case CO_REDUCESCATTER: case CO_ALLTOALL: send_elems = nc; break;
    case CO_SCATTER: send_elems = nc; break;
    default: send_elems = c; break;
    }
    switch (cs->coll) {
    case CO_ALLGATHER: case CO_ALLTOALL: case CO_GATHER: recv_elems = nc; break;
    default: recv_elems = c; break;
    }
    send = run->send_base + (size_t)(run->cases % (CO_MAX_OFFSET + 1)) * sz;
    recv = run->recv_base + (size_t)((run->cases + 1) % (CO_MAX_OFFSET + 1)) * sz;

    /* Inputs and pointers. In place, `recv` is the one buffer and sendp/recvp alias into it. */
    if (cs->in_place) {
        size_t total = send_elems > recv_elems ? send_elems : recv_elems;
        memset(recv, CO_POISON, total * sz);
        co_guard_set(recv + total * sz);
        sendp = recvp = recv;
        switch (cs->coll) {
        case CO_ALLGATHER: sendp = recv + (size_t)me * c * sz; break;
        case CO_GATHER: sendp = recv + (size_t)me * c * sz; break;
        case CO_REDUCESCATTER: recvp = recv + (size_t)me * c * sz; break;
        case CO_SCATTER: recvp = recv + (size_t)me * c * sz; break;
        default: break;
        }
    } else {
        memset(recv, CO_POISON, recv_elems * sz);
        co_guard_set(recv + recv_elems * sz);
        co_guard_set(send + send_elems * sz);
        sendp = send;
        recvp = recv;
    }
    switch (cs->coll) {
    case CO_ALLREDUCE: case CO_REDUCE: case CO_REDUCESCATTER:
        co_fill_red(sendp, send_elems, tb, cs->salt, 0);
        break;
    case CO_BROADCAST:
        if (is_root) {
            co_fill_move(sendp, c, sz, cs->salt, root, 0);
        }
        break;
    case CO_SCATTER:
        if (is_root) {
            for (int r = 0; r < n; r++) {
                co_fill_move(sendp + (size_t)r * c * sz, c, sz, cs->salt, r, 0);
            }
        }
        break;
    default: /* allgather, alltoall, gather: this rank's data */
        co_fill_move(sendp, send_elems, sz, cs->salt, me, 0);
        break;
    }
    if (!cs->in_place && cs->null_ok && !is_root) {
        if (cs->coll == CO_REDUCE || cs->coll == CO_GATHER) {
            recvp = NULL;
        } else if (cs->coll == CO_SCATTER) {
            sendp = NULL;
        }
    }

    /* Device mode: the calls see mirrors, loaded with the bytes just prepared. */
    enum mp_mem_kind kind = co_kind(run, run->cases);
    CUstream stream = run->device ? co_stream(run, run->cases) : NULL;
    size_t send_bytes = (cs->in_place ? 0 : send_elems * sz) + CO_GUARD;
    size_t recv_bytes = (cs->in_place && send_elems > recv_elems ? send_elems : recv_elems) * sz +
                        CO_GUARD;
    uint8_t *host_send = sendp, *host_recv = recvp;
    void *dscalar = NULL;
    if (run->device) {
        void *dsend = run->dsend[kind], *drecv = run->drecv[kind];
        mp_cuda_copy(&run->cu, co_mirror(run->send_base, dsend, send), send, send_bytes, stream);
        mp_cuda_copy(&run->cu, co_mirror(run->recv_base, drecv, recv), recv, recv_bytes, stream);
        sendp = cs->in_place ? co_mirror(run->recv_base, drecv, sendp)
                             : co_mirror(run->send_base, dsend, sendp);
        recvp = co_mirror(run->recv_base, drecv, recvp);
    }

    if (tb != NULL && tb->op == AR_PREMULSUM) {
        uint8_t scalar[8];
        memcpy(scalar, tb->scalar, sizeof(scalar));
        if (run->device && run->cases % 2 == 0) {
            dscalar = co_device_scalar(run, kind, scalar, stream);
            MP_CHECK_COMM(comm, ncclRedOpCreatePreMulSum(&op, dscalar, cs->type,
                                                         ncclScalarDevice, comm));
        } else {
            MP_CHECK_COMM(comm, ncclRedOpCreatePreMulSum(&op, scalar, cs->type,
                                                         ncclScalarHostImmediate, comm));
        }
        memset(scalar, 0x5a, sizeof(scalar)); /* host-immediate: read at creation */
    } else if (tb != NULL) {
        op = ar_builtin_ops[tb->op];
    }
    switch (cs->coll) {
    case CO_ALLREDUCE:
        res = ncclAllReduce(sendp, recvp, c, cs->type, op, comm, stream);
        break;
    case CO_REDUCE:
        res = ncclReduce(sendp, recvp, c, cs->type, op, root, comm, stream);
        break;
    case CO_REDUCESCATTER:
        res = ncclReduceScatter(sendp, recvp, c, cs->type, op, comm, stream);
        break;
    case CO_BROADCAST:
        /* Every other case through the legacy in-place ncclBcast. */
        if (cs->in_place && run->cases % 2) {
            res = ncclBcast(recvp, c, cs->type, root, comm, stream);
        } else {
            res = ncclBroadcast(sendp, recvp, c, cs->type, root, comm, stream);
        }
        break;
    case CO_ALLGATHER:
        res = ncclAllGather(sendp, recvp, c, cs->type, comm, stream);
        break;
    case CO_ALLTOALL:
        res = ncclAlltoAll(sendp, recvp, c, cs->type, comm, stream);
        break;
    case CO_GATHER:
        res = ncclGather(sendp, recvp, c, cs->type, root, comm, stream);
        break;
    case CO_SCATTER:
        res = ncclScatter(sendp, recvp, c, cs->type, root, comm, stream);
        break;
    default:
        MP_ASSERT(false, "co_case_run: part %d is not a collective", (int)cs->coll);
    }
    if (run->device) {
        /* The results, back where the checks look; the stream's work is done after this. */
        mp_cuda_copy(&run->cu, send, co_mirror(run->send_base, run->dsend[kind], send),
                     send_bytes, stream);
        mp_cuda_copy(&run->cu, recv, co_mirror(run->recv_base, run->drecv[kind], recv),
                     recv_bytes, stream);
        sendp = host_send;
        recvp = host_recv;
        if (dscalar != NULL) {
            mp_cuda_free(&run->cu, kind, dscalar);
        }
    }
    if (tb != NULL && tb->op == AR_PREMULSUM) {
        MP_CHECK_COMM(comm, ncclRedOpDestroy(op, comm));
    }
    if (res != ncclSuccess) {
        mp_report(__FILE__, __LINE__, "%s: failed: %s (%d); last error: \"%s\"; skipping %s "
                  "from now on", cs->name, ncclGetErrorString(res), (int)res,
                  mp_last_error(comm), co_names[cs->coll]);
        return -1;
    }

    /* Outputs. */
    switch (cs->coll) {
    case CO_ALLREDUCE:
        wrong += co_check_red(cs, recvp, c, tb->ref, 0, "result");
        break;
    case CO_REDUCE:
        if (is_root) {
            wrong += co_check_red(cs, recvp, c, tb->ref, 0, "result");
        }
        break;
    case CO_REDUCESCATTER:
        wrong += co_check_red(cs, recvp, c, tb->ref, (size_t)me * c, "result");
        break;
    case CO_BROADCAST:
        wrong += co_check_move(cs, recvp, c, root, 0, "result");
        break;
    case CO_ALLGATHER:
        for (int r = 0; r < n; r++) {
            wrong += co_check_move(cs, recvp + (size_t)r * c * sz, c, r, 0, "block");
        }
        break;
    case CO_ALLTOALL:
        for (int r = 0; r < n; r++) {
            wrong += co_check_move(cs, recvp + (size_t)r * c * sz, c, r, (size_t)me * c,
                                   "block");
        }
        break;
    case CO_GATHER:
        if (is_root) {
            for (int r = 0; r < n; r++) {
                wrong += co_check_move(cs, recvp + (size_t)r * c * sz, c, r, 0, "block");
            }
        }
        break;
    case CO_SCATTER:
        wrong += co_check_move(cs, recvp, c, me, 0, "result");
        break;
    default:
        break;
    }
    if (cs->in_place) {
        size_t total = send_elems > recv_elems ? send_elems : recv_elems;
        wrong += co_guard_check(cs, recv + total * sz, "the buffer");
    } else {
        wrong += co_guard_check(cs, recv + recv_elems * sz, "the receive buffer");
        wrong += co_guard_check(cs, send + send_elems * sz, "the send buffer");
        /* The send buffer must come back as it went in, where this rank filled it. */
        if (cs->coll == CO_ALLREDUCE || cs->coll == CO_REDUCE ||
            cs->coll == CO_REDUCESCATTER) {
            wrong += co_check_red(cs, send, send_elems, tb->in, 0, "send buffer changed:");
        } else if (cs->coll == CO_BROADCAST || cs->coll == CO_SCATTER) {
            if (is_root && cs->coll == CO_BROADCAST) {
                wrong += co_check_move(cs, send, c, root, 0, "send buffer changed:");
            } else if (is_root) {
                for (int r = 0; r < n; r++) {
                    wrong += co_check_move(cs, send + (size_t)r * c * sz, c, r, 0,
                                           "send buffer changed:");
                }
            }
        } else {
            wrong += co_check_move(cs, send, send_elems, me, 0, "send buffer changed:");
        }
    }
    return wrong;
}

/* Runs one case, counts it, and marks its collective refused if the library refused it. */
static void
co_case(struct co_run *run, enum co_coll coll, ncclDataType_t type, const struct ar_tables *tb,
        size_t count, bool in_place, int root)
{
    struct co_case cs = {
        .coll = coll,
        .type = type,
        .size = mp_type_size(type),
        .count = count,
        .in_place = in_place,
        .null_ok = !in_place && run->cases % 2 == 1,
        .root = root,
    };
    long wrong;

    if (run->refused[coll]) {
        return;
    }
    cs.salt = mp_hash4((uint64_t)coll, (uint64_t)type, count, (uint64_t)in_place << 8 |
                       (uint64_t)(root + 1));
    snprintf(cs.name, sizeof(cs.name), "%s %s %s count %zu %s%s root %d",
             co_names[coll], mp_type_name(type), tb != NULL ? ar_op_names[tb->op] : "-",
             count, in_place ? "in place" : "out of place", cs.null_ok ? " (NULLs)" : "",
             root);
    wrong = co_case_run(run, &cs, tb);
    run->cases++;
    if (wrong < 0) {
        run->refused[coll] = true;
        run->failed_cases++;
    } else if (wrong > 0) {
        mp_report(__FILE__, __LINE__, "FAIL %s: %ld wrong", cs.name, wrong);
        run->failed_cases++;
    } else if (run->verbose && run->world.rank == 0) {
        printf("ok %s\n", cs.name);
    }
}

/* --- the collective matrix ---------------------------------------------------------------- */

static bool
co_reduces(enum co_coll coll)
{
    return coll == CO_ALLREDUCE || coll == CO_REDUCE || coll == CO_REDUCESCATTER;
}

static bool
co_rooted(enum co_coll coll)
{
    return coll == CO_REDUCE || coll == CO_BROADCAST || coll == CO_GATHER ||
           coll == CO_SCATTER;
}

/* The roots a full run tries: every rank up to 5, else 0, 1, n/2 and n-1. */
static int
co_roots(int n, int *roots)
{
    if (n <= 5) {
        for (int r = 0; r < n; r++) {
            roots[r] = r;
        }
        return n;
    }
    roots[0] = 0;
    roots[1] = 1;
    roots[2] = n / 2;
    roots[3] = n - 1;
    return 4;
}

static void
co_matrix(struct co_run *run, enum co_coll coll)
{
    static const ncclDataType_t quick_types[] = {ncclUint8, ncclInt64, ncclFloat16, ncclFloat32,
                                                 ncclFloat8e4m3};
    int n = run->world.nranks;
    size_t all_counts[] = {0, 1, (size_t)n - 1, 1001, CO_LARGE};
    size_t counts[8];
    int ncounts = 0, roots[8], nroots = co_roots(n, roots);
    int ntypes = run->quick ? (int)(sizeof(quick_types) / sizeof(quick_types[0])) : MP_NTYPES;
    int nops = co_reduces(coll) ? AR_NOPS : 1;
    int spin = 0;

    /* Counts without repeats; quick runs leave the large count to one case below. */
    for (size_t k = 0; k < sizeof(all_counts) / sizeof(all_counts[0]); k++) {
        bool seen = false;
        for (int m = 0; m < ncounts; m++) {
            seen = seen || counts[m] == all_counts[k];
        }
        if (!seen && !(run->quick && all_counts[k] == CO_LARGE)) {
            counts[ncounts++] = all_counts[k];
        }
    }
    for (int t = 0; t < ntypes; t++) {
        ncclDataType_t type = run->quick ? quick_types[t] : mp_all_types[t];
        for (int op = 0; op < nops; op++) {
            struct ar_tables tb;
            if (co_reduces(coll)) {
                ar_tables_build(&tb, n, run->world.rank, type, (enum ar_op)op, false);
            }
            for (int ci = 0; ci < ncounts; ci++) {
                for (int place = 0; place < 2; place++) {
                    if (coll == CO_ALLTOALL && place == 1) {
                        continue;
                    }
                    if (!co_rooted(coll)) {
                        co_case(run, coll, type, co_reduces(coll) ? &tb : NULL, counts[ci],
                                place == 1, -1);
                        continue;
                    }
                    /* Every root in full runs at the small counts; one root, in turn, else. */
                    bool all_roots = !run->quick && counts[ci] <= 1001;
                    for (int ri = 0; ri < (all_roots ? nroots : 1); ri++) {
                        int root = all_roots ? roots[ri] : roots[spin++ % nroots];
                        co_case(run, coll, type, co_reduces(coll) ? &tb : NULL, counts[ci],
                                place == 1, root);
                    }
                }
            }
        }
    }
    if (run->quick) {
        /* One large case each way, float sum, the last root. */
        struct ar_tables tb;
        ar_tables_build(&tb, n, run->world.rank, ncclFloat32, AR_SUM, false);
        for (int place = 0; place < (coll == CO_ALLTOALL ? 1 : 2); place++) {
            co_case(run, coll, ncclFloat32, co_reduces(coll) ? &tb : NULL, CO_LARGE,
                    place == 1, co_rooted(coll) ? n - 1 : -1);
        }
    }
}

/* --- point to point and groups ------------------------------------------------------------ */

/*
 * A batch of operations for one group: collectives and sends/receives described by what they
 * move, posted in order inside ncclGroupStart/End (nested `depth` deep around parts of the
 * list), then checked. Keeping the description lets one checker serve every group test.
 */
enum co_item_kind { CO_ITEM_SEND, CO_ITEM_RECV, CO_ITEM_ALLREDUCE, CO_ITEM_BROADCAST,
                    CO_ITEM_ALLGATHER, CO_ITEM_REDUCESCATTER, CO_ITEM_ALLTOALL,
                    CO_ITEM_REDUCE };

struct co_item {
    enum co_item_kind kind;
    ncclDataType_t type;
    size_t count;
    int peer;        /* send/recv: the peer; broadcast/reduce: the root */
    int group_open;  /* ncclGroupStart calls just before this item */
    int group_close; /* ncclGroupEnd calls just after it */
    uint64_t salt;   /* send: the salt of the data; recv: the salt the sender used */
    int tag;         /* k-th message between a pair: part of the salt */
    uint8_t *send, *recv;
    size_t send_elems, recv_elems;
    struct ar_tables tb; /* sum tables for the reducing items */
    /* Device mode: the mirrors the calls take, their kind, and the item's stream. */
    void *dsend, *drecv;
    enum mp_mem_kind mem;
    CUstream stream;
};

/* The salt of the k-th message from src to dst in test `test`: both sides compute it. */
static uint64_t
co_p2p_salt(int test, int src, int dst, int k)
{
    return mp_hash4(0x703270ull + (uint64_t)test, (uint64_t)src, (uint64_t)dst, (uint64_t)k);
}

/* Allocates and fills an item's buffers (each with a guard); nothing is posted. */
static void
co_item_prepare(struct co_run *run, struct co_item *it)
{
    int n = run->world.nranks, me = run->world.rank;
    size_t sz = mp_type_size(it->type), c = it->count, nc = (size_t)n * c;

    switch (it->kind) {
    case CO_ITEM_SEND: it->send_elems = c; it->recv_elems = 0; break;
    case CO_ITEM_RECV: it->send_elems = 0; it->recv_elems = c; break;
    case CO_ITEM_ALLGATHER: it->send_elems = c; it->recv_elems = nc; break;
    case CO_ITEM_REDUCESCATTER: it->send_elems = nc; it->recv_elems = c; break;
    case CO_ITEM_ALLTOALL: it->send_elems = nc; it->recv_elems = nc; break;
    default: it->send_elems = c; it->recv_elems = c; break;
    }
    it->send = malloc(it->send_elems * sz + CO_GUARD);
    it->recv = malloc(it->recv_elems * sz + CO_GUARD);
    MP_ASSERT(it->send != NULL && it->recv != NULL, "out of memory for a group item");
    memset(it->recv, CO_POISON, it->recv_elems * sz);
    co_guard_set(it->send + it->send_elems * sz);
    co_guard_set(it->recv + it->recv_elems * sz);
    if (it->kind == CO_ITEM_ALLREDUCE || it->kind == CO_ITEM_REDUCESCATTER ||
        it->kind == CO_ITEM_REDUCE) {
        ar_tables_build(&it->tb, n, me, it->type, AR_SUM, false);
        co_fill_red(it->send, it->send_elems, &it->tb, it->salt, 0);
    } else if (it->kind != CO_ITEM_RECV) {
        co_fill_move(it->send, it->send_elems, sz, it->salt, me, 0);
    }
}

static ncclResult_t
co_item_post(struct co_run *run, struct co_item *it)
{
    ncclComm_t comm = run->world.comm;
    size_t c = it->count;
    void *send = run->device ? it->dsend : it->send, *recv = run->device ? it->drecv : it->recv;
    CUstream s = it->stream;

    switch (it->kind) {
    case CO_ITEM_SEND: return ncclSend(send, c, it->type, it->peer, comm, s);
    case CO_ITEM_RECV: return ncclRecv(recv, c, it->type, it->peer, comm, s);
    case CO_ITEM_ALLREDUCE:
        return ncclAllReduce(send, recv, c, it->type, ncclSum, comm, s);
    case CO_ITEM_REDUCE:
        return ncclReduce(send, recv, c, it->type, ncclSum, it->peer, comm, s);
    case CO_ITEM_BROADCAST:
        return ncclBroadcast(send, recv, c, it->type, it->peer, comm, s);
    case CO_ITEM_ALLGATHER: return ncclAllGather(send, recv, c, it->type, comm, s);
    case CO_ITEM_REDUCESCATTER:
        return ncclReduceScatter(send, recv, c, it->type, ncclSum, comm, s);
    case CO_ITEM_ALLTOALL: return ncclAlltoAll(send, recv, c, it->type, comm, s);
    }
    return ncclInternalError;
}

/* Device mode: an item's mirrors, loaded; every other item on the other stream, so that
 * groups synchronise several streams. */
static void
co_item_upload(struct co_run *run, struct co_item *it, int index)
{
    size_t sz = mp_type_size(it->type);
    size_t send_bytes = it->send_elems * sz + CO_GUARD, recv_bytes = it->recv_elems * sz +
                                                                      CO_GUARD;

    it->mem = co_kind(run, run->cases + index);
    it->stream = index % 2 ? NULL : run->stream;
    it->dsend = mp_cuda_alloc(&run->cu, it->mem, send_bytes);
    it->drecv = mp_cuda_alloc(&run->cu, it->mem, recv_bytes);
    mp_cuda_copy(&run->cu, it->dsend, it->send, send_bytes, run->stream);
    mp_cuda_copy(&run->cu, it->drecv, it->recv, recv_bytes, run->stream);
}

/* Device mode: the results back into the host buffers, and the mirrors freed. */
static void
co_item_download(struct co_run *run, struct co_item *it)
{
    size_t sz = mp_type_size(it->type);

    mp_cuda_copy(&run->cu, it->send, it->dsend, it->send_elems * sz + CO_GUARD, it->stream);
    mp_cuda_copy(&run->cu, it->recv, it->drecv, it->recv_elems * sz + CO_GUARD, it->stream);
    mp_cuda_free(&run->cu, it->mem, it->dsend);
    mp_cuda_free(&run->cu, it->mem, it->drecv);
}

static long
co_item_check(struct co_run *run, struct co_item *it, const char *test, int index)
{
    int n = run->world.nranks, me = run->world.rank;
    size_t sz = mp_type_size(it->type), c = it->count;
    struct co_case cs = {.type = it->type, .size = sz, .count = c, .salt = it->salt};
    long wrong = 0;

    snprintf(cs.name, sizeof(cs.name), "%s item %d (kind %d, %s x %zu, peer/root %d)", test,
             index, (int)it->kind, mp_type_name(it->type), c, it->peer);
    switch (it->kind) {
    case CO_ITEM_SEND: break;
    case CO_ITEM_RECV: wrong += co_check_move(&cs, it->recv, c, it->peer, 0, "message"); break;
    case CO_ITEM_ALLREDUCE: wrong += co_check_red(&cs, it->recv, c, it->tb.ref, 0, "result");
        break;
    case CO_ITEM_REDUCE:
        if (me == it->peer) {
            wrong += co_check_red(&cs, it->recv, c, it->tb.ref, 0, "result");
        }
        break;
    case CO_ITEM_REDUCESCATTER:
        wrong += co_check_red(&cs, it->recv, c, it->tb.ref, (size_t)me * c, "result");
        break;
    case CO_ITEM_BROADCAST: wrong += co_check_move(&cs, it->recv, c, it->peer, 0, "result");
        break;
    case CO_ITEM_ALLGATHER:
        for (int r = 0; r < n; r++) {
            wrong += co_check_move(&cs, it->recv + (size_t)r * c * sz, c, r, 0, "block");
        }
        break;
    case CO_ITEM_ALLTOALL:
        for (int r = 0; r < n; r++) {
            wrong += co_check_move(&cs, it->recv + (size_t)r * c * sz, c, r, (size_t)me * c,
                                   "block");
        }
        break;
    }
    if (it->kind != CO_ITEM_REDUCE || me == it->peer) {
        wrong += co_guard_check(&cs, it->recv + it->recv_elems * sz, "the receive buffer");
    }
    wrong += co_guard_check(&cs, it->send + it->send_elems * sz, "the send buffer");
    return wrong;
}

/* Runs the items as one group (with the nesting they ask for) and checks them; one case. */
static void
co_group_run(struct co_run *run, const char *test, struct co_item *items, int nitems)
{
    ncclResult_t res = ncclSuccess, end = ncclSuccess;
    int open = 0;
    long wrong = 0;

    for (int i = 0; i < nitems; i++) {
        co_item_prepare(run, &items[i]);
        if (run->device) {
            co_item_upload(run, &items[i], i);
        }
    }
    MP_CHECK(ncclGroupStart());
    for (int i = 0; i < nitems && res == ncclSuccess; i++) {
        for (int g = 0; g < items[i].group_open; g++, open++) {
            MP_CHECK(ncclGroupStart());
        }
        res = co_item_post(run, &items[i]);
        if (res != ncclSuccess) {
            mp_report(__FILE__, __LINE__, "%s: posting item %d (kind %d) failed: %s; last "
                      "error: \"%s\"", test, i, (int)items[i].kind, ncclGetErrorString(res),
                      mp_last_error(run->world.comm));
        }
        for (int g = 0; g < items[i].group_close && open > 0; g++, open--) {
            end = ncclGroupEnd();
            if (end != ncclSuccess && res == ncclSuccess) {
                res = end;
            }
        }
    }
    /* Close whatever is open, so that later calls do not land in this group. */
    for (; open > 0; open--) {
        ncclGroupEnd();
    }
    end = ncclGroupEnd();
    if (res == ncclSuccess && end != ncclSuccess) {
        res = end;
        mp_report(__FILE__, __LINE__, "%s: ncclGroupEnd failed: %s; last error: \"%s\"", test,
                  ncclGetErrorString(res), mp_last_error(run->world.comm));
    }
    for (int i = 0; run->device && i < nitems; i++) {
        co_item_download(run, &items[i]);
    }
    if (res == ncclSuccess) {
        for (int i = 0; i < nitems; i++) {
            wrong += co_item_check(run, &items[i], test, i);
        }
    } else {
        wrong = 1;
    }
    for (int i = 0; i < nitems; i++) {
        free(items[i].send);
        free(items[i].recv);
    }
    run->cases++;
    if (wrong > 0) {
        mp_report(__FILE__, __LINE__, "FAIL %s: %ld wrong", test, wrong);
        run->failed_cases++;
    } else if (run->verbose && run->world.rank == 0) {
        printf("ok %s\n", test);
    }
}

/* A send of the k-th message of test `test` to peer, and the matching receive from src. */
static struct co_item
co_send_item(int test, int me, int peer, int k, ncclDataType_t type, size_t count)
{
    struct co_item it = {.kind = CO_ITEM_SEND, .type = type, .count = count, .peer = peer,
                         .salt = co_p2p_salt(test, me, peer, k)};
    return it;
}

static struct co_item
co_recv_item(int test, int me, int src, int k, ncclDataType_t type, size_t count)
{
    struct co_item it = {.kind = CO_ITEM_RECV, .type = type, .count = count, .peer = src,
                         .salt = co_p2p_salt(test, src, me, k)};
    return it;
}

/* Send/recv: a ring each way at several counts and types, recv posted before send half the
 * time; several messages per peer pair matched in order; an all-pairs exchange; send-to-self
 * alone. */
static void
co_sendrecv(struct co_run *run)
{
    int n = run->world.nranks, me = run->world.rank;
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    size_t counts[] = {0, 1, 1001, CO_LARGE};
    struct co_item items[64];
    int test = 0;

    for (int t = 0; t < MP_NTYPES; t += run->quick ? 3 : 1) {
        for (size_t ci = 0; ci < sizeof(counts) / sizeof(counts[0]); ci++) {
            char name[96];
            snprintf(name, sizeof(name), "sendrecv ring %s x %zu", mp_type_name(mp_all_types[t]),
                     counts[ci]);
            test++;
            items[ci % 2] = co_send_item(test, me, next, 0, mp_all_types[t], counts[ci]);
            items[1 - ci % 2] = co_recv_item(test, me, prev, 0, mp_all_types[t], counts[ci]);
            co_group_run(run, name, items, 2);
        }
    }
    /* Three messages each way per neighbour, of different sizes: matched in order. */
    {
        static const size_t sizes[3] = {5, 70000, 1};
        int k = 0;
        test++;
        for (int m = 0; m < 3; m++) {
            items[k++] = co_send_item(test, me, next, m, ncclInt32, sizes[m]);
            items[k++] = co_send_item(test + 1000, me, prev, m, ncclInt32, sizes[m]);
        }
        for (int m = 0; m < 3; m++) {
            items[k++] = co_recv_item(test, me, prev, m, ncclInt32, sizes[m]);
            items[k++] = co_recv_item(test + 1000, me, next, m, ncclInt32, sizes[m]);
        }
        co_group_run(run, "sendrecv three messages per pair, both directions", items, k);
    }
    /* All pairs, self included, counts differing per pair. */
    if (n <= 16) {
        int k = 0;
        test++;
        for (int p = 0; p < n; p++) {
            items[k++] = co_recv_item(test, me, p, 0, ncclFloat64, 10 + (size_t)(p * 7 + me) % 13);
            items[k++] = co_send_item(test, me, p, 0, ncclFloat64, 10 + (size_t)(me * 7 + p) % 13);
        }
        co_group_run(run, "sendrecv all pairs with self", items, k);
    }
    /* Send to self alone, in a group. */
    test++;
    items[0] = co_send_item(test, me, me, 0, ncclUint8, 777);
    items[1] = co_recv_item(test, me, me, 0, ncclUint8, 777);
    co_group_run(run, "sendrecv to self", items, 2);
}

/* Several collectives and send/recv pairs in one group; nested groups. */
static void
co_groups(struct co_run *run)
{
    int n = run->world.nranks, me = run->world.rank;
    int next = (me + 1) % n, prev = (me + n - 1) % n;
    struct co_item items[16];
    int k = 0;

    items[k++] = (struct co_item){.kind = CO_ITEM_ALLREDUCE, .type = ncclFloat32, .count = 1001,
                                  .salt = 11};
    items[k++] = co_send_item(201, me, next, 0, ncclFloat64, 300);
    items[k++] = (struct co_item){.kind = CO_ITEM_BROADCAST, .type = ncclInt32, .count = 777,
                                  .peer = 1 % n, .salt = 12};
    items[k++] = co_recv_item(201, me, prev, 0, ncclFloat64, 300);
    items[k++] = (struct co_item){.kind = CO_ITEM_ALLGATHER, .type = ncclUint8, .count = 513,
                                  .salt = 13};
    items[k++] = co_recv_item(202, me, me, 0, ncclInt32, 50);
    items[k++] = co_send_item(202, me, me, 0, ncclInt32, 50);
    items[k++] = (struct co_item){.kind = CO_ITEM_REDUCESCATTER, .type = ncclInt64,
                                  .count = 100, .salt = 14};
    items[k++] = (struct co_item){.kind = CO_ITEM_ALLTOALL, .type = ncclInt32, .count = 7,
                                  .salt = 15};
    items[k++] = (struct co_item){.kind = CO_ITEM_REDUCE, .type = ncclFloat16, .count = 65,
                                  .peer = n - 1, .salt = 16};
    co_group_run(run, "group of six collectives, a ring exchange and a send to self", items, k);

    /* Start( Start( allreduce ) Start( send recv ) reduce ): nested two deep. */
    k = 0;
    items[k++] = (struct co_item){.kind = CO_ITEM_ALLREDUCE, .type = ncclInt32, .count = 4097,
                                  .salt = 21, .group_open = 1, .group_close = 1};
    items[k++] = co_send_item(203, me, next, 0, ncclBfloat16, 129);
    items[k - 1].group_open = 1;
    items[k++] = co_recv_item(203, me, prev, 0, ncclBfloat16, 129);
    items[k - 1].group_close = 1;
    items[k++] = (struct co_item){.kind = CO_ITEM_REDUCE, .type = ncclFloat64, .count = 33,
                                  .peer = 0, .salt = 22};
    co_group_run(run, "nested groups", items, k);

    /* The same collective twice in one group, on different buffers. */
    k = 0;
    items[k++] = (struct co_item){.kind = CO_ITEM_ALLGATHER, .type = ncclFloat32, .count = 3,
                                  .salt = 31};
    items[k++] = (struct co_item){.kind = CO_ITEM_ALLGATHER, .type = ncclFloat32, .count = 1000,
                                  .salt = 32};
    items[k++] = (struct co_item){.kind = CO_ITEM_BROADCAST, .type = ncclUint64, .count = 10,
                                  .peer = 0, .salt = 33};
    items[k++] = (struct co_item){.kind = CO_ITEM_BROADCAST, .type = ncclUint64, .count = 10,
                                  .peer = n - 1, .salt = 34};
    co_group_run(run, "repeated collectives in one group", items, k);
}

/* --- new communicators -------------------------------------------------------------------- */

/*
 * Collectives on a communicator made by split or shrink: `members` lists the world ranks in
 * the new communicator's rank order. Checks the size and rank it reports, then an all-reduce,
 * an all-gather of world ranks (which proves the order), a broadcast from the last rank and a
 * ring of sends; then destroys it.
 */
static void
co_subcomm_check(struct co_run *run, ncclComm_t sub, const int *members, int nsub,
                 const char *what)
{
    int me = run->world.rank, sub_rank = -1, count = -1, got_rank = -1;
    long wrong = 0;

    for (int i = 0; i < nsub; i++) {
        if (members[i] == me) {
            sub_rank = i;
        }
    }
    MP_CHECK_COMM(sub, ncclCommCount(sub, &count));
    MP_CHECK_COMM(sub, ncclCommUserRank(sub, &got_rank));
    if (count != nsub || got_rank != sub_rank) {
        mp_report(__FILE__, __LINE__, "%s: ncclCommCount %d, ncclCommUserRank %d; expected %d "
                  "and %d", what, count, got_rank, nsub, sub_rank);
        wrong++;
    } else {
        int32_t world_ranks[64], mine = me, value = me + 1, sum = 0, from_last = -1;
        ncclResult_t res;

        for (int i = 0; i < nsub; i++) {
            sum += members[i] + 1;
        }
        res = ncclAllReduce(&value, &value, 1, ncclInt32, ncclSum, sub, NULL);
        if (res == ncclSuccess) {
            res = ncclAllGather(&mine, world_ranks, 1, ncclInt32, sub, NULL);
        }
        if (res == ncclSuccess) {
            from_last = me;
            res = ncclBroadcast(&from_last, &from_last, 1, ncclInt32, nsub - 1, sub, NULL);
        }
        if (res != ncclSuccess) {
            mp_report(__FILE__, __LINE__, "%s: a collective failed: %s; last error: \"%s\"",
                      what, ncclGetErrorString(res), mp_last_error(sub));
            wrong++;
        } else {
            MP_EXPECT(value == sum, "%s: all-reduce gave %d, expected %d", what, value, sum);
            wrong += value != sum;
            for (int i = 0; i < nsub; i++) {
                MP_EXPECT(world_ranks[i] == members[i], "%s: all-gather block %d holds world "
                          "rank %d, expected %d", what, i, world_ranks[i], members[i]);
                wrong += world_ranks[i] != members[i];
            }
            MP_EXPECT(from_last == members[nsub - 1], "%s: broadcast from the last rank gave "
                      "%d, expected %d", what, from_last, members[nsub - 1]);
            wrong += from_last != members[nsub - 1];
        }
        if (res == ncclSuccess) {
            int32_t out = me, in = -1;
            MP_CHECK_COMM(sub, ncclGroupStart());
            res = ncclSend(&out, 1, ncclInt32, (sub_rank + 1) % nsub, sub, NULL);
            if (res == ncclSuccess) {
                res = ncclRecv(&in, 1, ncclInt32, (sub_rank + nsub - 1) % nsub, sub, NULL);
            }
            ncclResult_t end = ncclGroupEnd();
            res = res != ncclSuccess ? res : end;
            int want = members[(sub_rank + nsub - 1) % nsub];
            if (res != ncclSuccess || in != want) {
                mp_report(__FILE__, __LINE__, "%s: ring send/recv: %s, got %d, expected %d",
                          what, ncclGetErrorString(res), in, want);
                wrong++;
            }
        }
        if (wrong == 0) {
            wrong += mp_allreduce_check(sub, sub_rank, nsub, ncclFloat32, 1001, false, 77) != 0;
        }
    }
    MP_CHECK_COMM(sub, ncclCommDestroy(sub));
    run->cases++;
    if (wrong > 0) {
        mp_report(__FILE__, __LINE__, "FAIL %s", what);
        run->failed_cases++;
    } else if (run->verbose && sub_rank == 0) {
        printf("ok %s\n", what);
    }
}

/* Colors by parity, keys reversing the order, the last rank (with 3 or more) opting out. */
static void
co_split(struct co_run *run)
{
    int n = run->world.nranks, me = run->world.rank;
    int out = n >= 3 ? n - 1 : -1;
    int color = me == out ? NCCL_SPLIT_NOCOLOR : me % 2;
    int members[64], nsub = 0;
    ncclComm_t sub = (ncclComm_t)(uintptr_t)1; /* must be overwritten */
    ncclResult_t res = ncclCommSplit(run->world.comm, color, n - me, &sub, NULL);

    if (res != ncclSuccess) {
        mp_report(__FILE__, __LINE__, "ncclCommSplit(color %d, key %d) failed: %s; last error: "
                  "\"%s\"", color, n - me, ncclGetErrorString(res),
                  mp_last_error(run->world.comm));
        run->cases++;
        run->failed_cases++;
        return;
    }
    if (color == NCCL_SPLIT_NOCOLOR) {
        run->cases++;
        if (sub != NULL) {
            mp_report(__FILE__, __LINE__, "ncclCommSplit with NCCL_SPLIT_NOCOLOR gave a "
                      "communicator, not NULL");
            run->failed_cases++;
        }
        return;
    }
    /* Higher key, later rank: the members of my color from the highest world rank down. */
    for (int r = n - 1; r >= 0; r--) {
        if (r != out && r % 2 == color) {
            members[nsub++] = r;
        }
    }
    MP_ASSERT(sub != NULL, "ncclCommSplit(color %d) gave a NULL communicator", color);
    co_subcomm_check(run, sub, members, nsub, color ? "split, odd ranks" : "split, even ranks");
}

/* Excludes the middle rank; the others are renumbered to close the gap. */
static void
co_shrink(struct co_run *run)
{
    int n = run->world.nranks, me = run->world.rank;
    int excluded = n / 2, members[64], nsub = 0;
    ncclComm_t sub = NULL;
    ncclResult_t res;

    if (n < 2) {
        return;
    }
    if (me == excluded) {
        run->cases++; /* NCCL: excluded ranks do not take part */
        return;
    }
    res = ncclCommShrink(run->world.comm, &excluded, 1, &sub, NULL, NCCL_SHRINK_DEFAULT);
    if (res != ncclSuccess || sub == NULL) {
        mp_report(__FILE__, __LINE__, "ncclCommShrink(exclude %d) failed: %s (comm %p); last "
                  "error: \"%s\"", excluded, ncclGetErrorString(res), (void *)sub,
                  mp_last_error(run->world.comm));
        run->cases++;
        run->failed_cases++;
        return;
    }
    for (int r = 0; r < n; r++) {
        if (r != excluded) {
            members[nsub++] = r;
        }
    }
    co_subcomm_check(run, sub, members, nsub, "shrink");
}

/* Device mode, after the world communicator is destroyed: the mirrors and the stream go, and
 * with the driver's double nothing the library opened may be left (an IPC mapping, a
 * registration, a stream, a module is kept per process and not counted). */
static void
co_device_end(struct co_run *run)
{
    struct mp_fake_stats stats;

    for (int k = 0; k < MP_MEM_KINDS; k++) {
        if (run->dsend[k] != NULL) {
            mp_cuda_free(&run->cu, (enum mp_mem_kind)k, run->dsend[k]);
            mp_cuda_free(&run->cu, (enum mp_mem_kind)k, run->drecv[k]);
        }
    }
    MP_CU(&run->cu, stream_destroy(run->stream));
    if (run->cu.fake_stats == NULL) {
        return;
    }
    run->cu.fake_stats(&stats);
    MP_EXPECT(stats.ipc_mappings == 0 && stats.registrations == 0 && stats.streams == 0,
              "after ncclCommDestroy the library left open: %d IPC mappings, %d registrations, "
              "%d streams", stats.ipc_mappings, stats.registrations, stats.streams);
    run->failed_cases += stats.ipc_mappings != 0 || stats.registrations != 0 ||
                         stats.streams != 0;
}

/* --- main --------------------------------------------------------------------------------- */

static void
co_usage(const char *prog)
{
    fprintf(stderr, "usage: %s [-q] [-c allreduce,reduce,reducescatter,broadcast,allgather,"
            "alltoall,gather,scatter,sendrecv,groups,split,shrink] "
            "[-D device|memalloc|managed|registered|mixed] [-v]\n", prog);
    exit(2);
}

static void
co_parse_parts(struct co_run *run, char *list, const char *prog)
{
    for (char *part = strtok(list, ","); part != NULL; part = strtok(NULL, ",")) {
        bool found = false;
        for (int p = 0; p < CO_NPARTS; p++) {
            if (strcmp(part, co_names[p]) == 0) {
                run->want[p] = found = true;
            }
        }
        if (!found) {
            fprintf(stderr, "%s: unknown part '%s'\n", prog, part);
            co_usage(prog);
        }
    }
}

int
main(int argc, char **argv)
{
    static struct co_run run;
    int opt, total_failed, nparts = 0;
    double start = mp_now();
    bool chosen = false;

    setlinebuf(stdout); /* a run killed by its timeout still shows how far it got */
    while ((opt = getopt(argc, argv, "qc:D:v")) != -1) {
        switch (opt) {
        case 'q':
            run.quick = true;
            break;
        case 'D':
            run.device = true;
            run.kind = mp_mem_kind_parse(optarg);
            break;
        case 'c':
            co_parse_parts(&run, optarg, argv[0]);
            chosen = true;
            break;
        case 'v':
            run.verbose = true;
            break;
        default:
            co_usage(argv[0]);
        }
    }
    if (optind != argc) {
        co_usage(argv[0]);
    }
    for (int p = 0; p < CO_NPARTS; p++) {
        run.want[p] = run.want[p] || !chosen;
        nparts += run.want[p];
    }
    if (run.device) {
        mp_cuda_init(&run.cu); /* the device current before the communicator is made */
    }
    mp_world_init(&run.world);
    MP_ASSERT(run.world.nranks <= 64, "at most 64 ranks, not %d", run.world.nranks);

    run.buf_bytes = ((size_t)run.world.nranks * CO_LARGE + CO_MAX_OFFSET) * 8 + CO_GUARD;
    run.send_base = malloc(run.buf_bytes);
    run.recv_base = malloc(run.buf_bytes);
    MP_ASSERT(run.send_base != NULL && run.recv_base != NULL, "out of memory: 2 x %zu bytes",
              run.buf_bytes);
    if (run.device) {
        MP_CU(&run.cu, stream_create(&run.stream, CU_STREAM_NON_BLOCKING));
        for (int k = 0; k < MP_MEM_KINDS; k++) {
            if (run.kind < 0 || run.kind == k) {
                run.dsend[k] = mp_cuda_alloc(&run.cu, (enum mp_mem_kind)k, run.buf_bytes);
                run.drecv[k] = mp_cuda_alloc(&run.cu, (enum mp_mem_kind)k, run.buf_bytes);
            }
        }
    }

    for (int p = 0; p <= CO_SCATTER; p++) {
        if (run.want[p]) {
            co_matrix(&run, (enum co_coll)p);
        }
    }
    if (run.want[CO_SENDRECV]) {
        co_sendrecv(&run);
    }
    if (run.want[CO_GROUPS]) {
        co_groups(&run);
    }
    if (run.want[CO_SPLIT]) {
        co_split(&run);
    }
    if (run.want[CO_SHRINK]) {
        co_shrink(&run);
    }

    /* Every rank's verdict, so that rank 0's line speaks for the whole run. */
    total_failed = run.failed_cases;
    MP_CHECK_COMM(run.world.comm, ncclAllReduce(&total_failed, &total_failed, 1, ncclInt32,
                                                ncclSum, run.world.comm, NULL));
    MP_CHECK_COMM(run.world.comm, ncclCommDestroy(run.world.comm));
    if (run.device) {
        co_device_end(&run);
    }
    free(run.send_base);
    free(run.recv_base);
    if (run.world.rank == 0) {
        const char *algo = getenv("NCCLSHIM_ALGO"), *nccl_algo = getenv("NCCL_ALGO");
        printf("collectives: %d ranks, %d parts, %d cases on rank 0, %d failed on all ranks "
               "(NCCLSHIM_ALGO=%s NCCL_ALGO=%s), %.1f s\n", run.world.nranks, nparts, run.cases,
               total_failed, algo ? algo : "", nccl_algo ? nccl_algo : "", mp_now() - start);
    }
    return run.failed_cases == 0 && total_failed == 0 ? 0 : 1;
}
