/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bad input to every exported function of nccl.h that takes arguments, through the real
 * libnccl.so.2 on N ranks started by tools/launcher. One table: each row names a case, the
 * function that makes one bad call on the fixture, and the result NCCL gives for it
 * (ncclInvalidArgument or ncclInvalidUsage; ncclSuccess for the few calls NCCL defines as
 * harmless, such as destroying NULL or naming an unknown error code).
 *
 * After each row: the refused call must have left a message for ncclGetLastError, and the
 * fixture's communicator must still work (a checked all-reduce and a ring of send/recv, the
 * latter proving a refused point-to-point call took no place in the per-peer order). Every
 * rank runs the same rows in the same order, so a call that is wrongly accepted still meets
 * its peers' calls rather than hanging.
 *
 * The fixture: the world communicator; "other", a live split of it holding a PreMulSum op
 * (an op of the wrong communicator); "dead", a split that was destroyed (a stale handle); and
 * "fin", a split that was finalized.
 *
 * Usage: badinput [-v]. -v prints every case on every rank, not only rank 0's table. Exit
 * status 1 if any case failed on any rank.
 */
#include "common.h"

#include <limits.h>

#define BAD_COUNT 4 /* elements per rank in a bad collective call */

struct bad_fixture {
    const struct mp_world *world;
    ncclComm_t comm;  /* the world communicator: every row must leave it working */
    ncclComm_t other; /* a live split of comm */
    ncclComm_t dead;  /* a split of comm, destroyed */
    ncclComm_t fin;   /* a split of comm, finalized */
    ncclRedOp_t other_op; /* PreMulSum on other */
    ncclRedOp_t twin_op;  /* PreMulSum on comm, made while a row runs */
    ncclUniqueId id;      /* the world's (NCCL_COMM_ID's): init rows pass it */
    float send[8 * BAD_COUNT * 8];
    float recv[8 * BAD_COUNT * 8];
    char message[1024]; /* ncclGetLastError right after the bad call */
};

/* What one row gets wrong, for the collective rows that share one caller. */
enum bad_fault {
    BAD_NULL_COMM,
    BAD_DEAD_COMM,
    BAD_FIN_COMM,
    BAD_NULL_SEND,
    BAD_NULL_RECV,
    BAD_TYPE_NUM,  /* ncclNumTypes */
    BAD_TYPE_NEG,  /* -1 */
    BAD_OP_NUM,    /* ncclNumOps: a dynamic op never created */
    BAD_OP_MAX,    /* ncclMaxRedOp */
    BAD_OP_OTHER,  /* a PreMulSum op of another communicator */
    BAD_OP_TWIN,   /* the same, while comm has an op of its own at the same index */
    BAD_OP_GONE,   /* a PreMulSum op created on comm, then destroyed */
    BAD_OP_TYPE,   /* a PreMulSum op created for another datatype */
    BAD_ROOT_NEG,  /* root or peer -1 */
    BAD_ROOT_N,    /* root or peer nranks */
};

/* Valid arguments of a collective with one fault applied. */
struct bad_coll_args {
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    int root;
    ncclComm_t comm;
};

/* Keeps the message of the call just made (later calls clear it), and passes its result. */
static ncclResult_t
bad_note(struct bad_fixture *fx, ncclResult_t res)
{
    const char *text = ncclGetLastError(NULL);

    snprintf(fx->message, sizeof(fx->message), "%s", text != NULL ? text : "");
    return res;
}

/* The fault's arguments; ops that need creating and destroying are made here, and
 * bad_coll_done undoes them. */
static struct bad_coll_args
bad_coll_args(struct bad_fixture *fx, enum bad_fault fault)
{
    struct bad_coll_args a = {fx->send, fx->recv, BAD_COUNT, ncclFloat32, ncclSum,
                              (fx->world->rank + 1) % fx->world->nranks, fx->comm};
    float scalar = 2.0f;
    int n = fx->world->nranks;

    switch (fault) {
    case BAD_NULL_COMM: a.comm = NULL; break;
    case BAD_DEAD_COMM: a.comm = fx->dead; break;
    case BAD_FIN_COMM: a.comm = fx->fin; break;
    case BAD_NULL_SEND: a.send = NULL; break;
    case BAD_NULL_RECV: a.recv = NULL; break;
    case BAD_TYPE_NUM: a.type = ncclNumTypes; break;
    case BAD_TYPE_NEG: a.type = (ncclDataType_t)-1; break;
    case BAD_OP_NUM: a.op = ncclNumOps; break;
    case BAD_OP_MAX: a.op = ncclMaxRedOp; break;
    case BAD_OP_OTHER: a.op = fx->other_op; break;
    case BAD_OP_TWIN:
        MP_CHECK_COMM(fx->comm, ncclRedOpCreatePreMulSum(&fx->twin_op, &scalar, ncclFloat32,
                                                         ncclScalarHostImmediate, fx->comm));
        a.op = fx->other_op;
        break;
    case BAD_OP_GONE:
        MP_CHECK_COMM(fx->comm, ncclRedOpCreatePreMulSum(&a.op, &scalar, ncclFloat32,
                                                         ncclScalarHostImmediate, fx->comm));
        MP_CHECK_COMM(fx->comm, ncclRedOpDestroy(a.op, fx->comm));
        break;
    case BAD_OP_TYPE:
        MP_CHECK_COMM(fx->comm, ncclRedOpCreatePreMulSum(&a.op, &scalar, ncclFloat32,
                                                         ncclScalarHostImmediate, fx->comm));
        a.type = ncclInt32;
        break;
    case BAD_ROOT_NEG: a.root = -1; break;
    case BAD_ROOT_N: a.root = n; break;
    }
    return a;
}

static void
bad_coll_done(struct bad_fixture *fx, enum bad_fault fault, const struct bad_coll_args *a)
{
    if (fault == BAD_OP_TYPE) {
        MP_CHECK_COMM(fx->comm, ncclRedOpDestroy(a->op, fx->comm));
    } else if (fault == BAD_OP_TWIN) {
        MP_CHECK_COMM(fx->comm, ncclRedOpDestroy(fx->twin_op, fx->comm));
    }
}

/* One caller per collective: make the call with fault applied, note its message, undo. */
#define BAD_COLL_CALLER(name, call)                                                           \
    static ncclResult_t                                                                       \
    bad_##name(struct bad_fixture *fx, int fault)                                             \
    {                                                                                         \
        struct bad_coll_args a = bad_coll_args(fx, (enum bad_fault)fault);                    \
        ncclResult_t res = bad_note(fx, (call));                                              \
        bad_coll_done(fx, (enum bad_fault)fault, &a);                                         \
        return res;                                                                           \
    }

BAD_COLL_CALLER(allreduce, ncclAllReduce(a.send, a.recv, a.count, a.type, a.op, a.comm, NULL))
BAD_COLL_CALLER(reduce, ncclReduce(a.send, a.recv, a.count, a.type, a.op, a.root, a.comm, NULL))
BAD_COLL_CALLER(reducescatter,
                ncclReduceScatter(a.send, a.recv, a.count, a.type, a.op, a.comm, NULL))
BAD_COLL_CALLER(broadcast,
                ncclBroadcast(a.send, a.recv, a.count, a.type, a.root, a.comm, NULL))
BAD_COLL_CALLER(bcast, ncclBcast(a.recv, a.count, a.type, a.root, a.comm, NULL))
BAD_COLL_CALLER(allgather, ncclAllGather(a.send, a.recv, a.count, a.type, a.comm, NULL))
BAD_COLL_CALLER(alltoall, ncclAlltoAll(a.send, a.recv, a.count, a.type, a.comm, NULL))
BAD_COLL_CALLER(gather, ncclGather(a.send, a.recv, a.count, a.type, a.root, a.comm, NULL))
BAD_COLL_CALLER(scatter, ncclScatter(a.send, a.recv, a.count, a.type, a.root, a.comm, NULL))
BAD_COLL_CALLER(send, ncclSend(a.send, a.count, a.type, a.root, a.comm, NULL))
BAD_COLL_CALLER(recv, ncclRecv(a.recv, a.count, a.type, a.root, a.comm, NULL))

/* --- groups ------------------------------------------------------------------------------- */

static ncclResult_t
bad_group_end_alone(struct bad_fixture *fx, int arg)
{
    (void)arg;
    return bad_note(fx, ncclGroupEnd());
}

/* A bad call inside a group: it is refused, and so is the group at ncclGroupEnd (with a
 * valid all-reduce in it, which then runs on no rank). The row's result is ncclGroupEnd's. */
static ncclResult_t
bad_group_member(struct bad_fixture *fx, int arg)
{
    ncclResult_t call, end;
    char message[sizeof(fx->message)];

    (void)arg;
    MP_CHECK(ncclGroupStart());
    MP_CHECK_COMM(fx->comm, ncclAllReduce(fx->send, fx->recv, BAD_COUNT, ncclFloat32, ncclSum,
                                          fx->comm, NULL));
    call = bad_note(fx, ncclAllReduce(fx->send, fx->recv, BAD_COUNT, (ncclDataType_t)-1,
                                      ncclSum, fx->comm, NULL));
    memcpy(message, fx->message, sizeof(message));
    end = bad_note(fx, ncclGroupEnd());
    if (call != ncclInvalidArgument) {
        mp_report(__FILE__, __LINE__, "the bad call inside the group gave %s",
                  ncclGetErrorString(call));
        mp_failures++;
    }
    if (message[0] == '\0') {
        mp_report(__FILE__, __LINE__, "the bad call inside the group left no message");
        mp_failures++;
    }
    return end;
}

static ncclResult_t
bad_group_simulate_null(struct bad_fixture *fx, int arg)
{
    (void)arg;
    return bad_note(fx, ncclGroupSimulateEnd(NULL));
}

/* --- ids, versions, errors ---------------------------------------------------------------- */

static ncclResult_t
bad_get_version(struct bad_fixture *fx, int arg)
{
    (void)arg;
    return bad_note(fx, ncclGetVersion(NULL));
}

static ncclResult_t
bad_get_unique_id(struct bad_fixture *fx, int arg)
{
    (void)arg;
    return bad_note(fx, ncclGetUniqueId(NULL));
}

/* Unknown codes must give some text, not crash: a harmless row. */
static ncclResult_t
bad_error_string(struct bad_fixture *fx, int code)
{
    const char *text = ncclGetErrorString((ncclResult_t)code);

    (void)fx;
    return text != NULL && text[0] != '\0' ? ncclSuccess : ncclInternalError;
}

/* A stale or NULL handle given to ncclGetLastError: some text (maybe empty), no crash. */
static ncclResult_t
bad_last_error_dead(struct bad_fixture *fx, int arg)
{
    (void)arg;
    return ncclGetLastError(fx->dead) != NULL ? ncclSuccess : ncclInternalError;
}

/* --- communicator creation ---------------------------------------------------------------- */

/* Every init row passes the world's real id, so that arguments accepted by mistake make a
 * communicator (the row fails, and its communicator is destroyed) rather than an unrelated
 * bootstrap error hiding the mistake. */
enum bad_init {
    BAD_INIT_NULL_COMM,
    BAD_INIT_NRANKS_0,
    BAD_INIT_NRANKS_NEG,
    BAD_INIT_RANK_NEG,
    BAD_INIT_RANK_N,
};

static ncclResult_t
bad_init_rank(struct bad_fixture *fx, int which)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclComm_t *comm_ptr = which == BAD_INIT_NULL_COMM ? NULL : &comm;
    int n = fx->world->nranks, rank = fx->world->rank;

    id = fx->id;
    switch (which) {
    case BAD_INIT_NRANKS_0: n = 0; rank = 0; break;
    case BAD_INIT_NRANKS_NEG: n = -1; rank = 0; break;
    case BAD_INIT_RANK_NEG: rank = -1; break;
    case BAD_INIT_RANK_N: rank = n; break;
    default: break;
    }
    ncclResult_t res = bad_note(fx, ncclCommInitRank(comm_ptr, n, id, rank));
    if (res == ncclSuccess) {
        ncclCommDestroy(comm);
    }
    return res;
}

enum bad_config {
    BAD_CONFIG_MAGIC,
    BAD_CONFIG_VERSION,
    BAD_CONFIG_SIZE,
    BAD_CONFIG_BLOCKING,
    BAD_CONFIG_NULL_COMM, /* a good config, NULL for the communicator */
};

static void
bad_config_make(ncclConfig_t *config, int which)
{
    ncclConfig_t init = NCCL_CONFIG_INITIALIZER;

    *config = init;
    switch (which) {
    case BAD_CONFIG_MAGIC: config->magic = 0; break;         /* never initialized */
    case BAD_CONFIG_VERSION: config->version = 0; break;
    case BAD_CONFIG_SIZE: config->size = 0; break;
    case BAD_CONFIG_BLOCKING: config->blocking = 7; break;   /* neither 0 nor 1 */
    default: break;
    }
}

static ncclResult_t
bad_init_config(struct bad_fixture *fx, int which)
{
    ncclUniqueId id;
    ncclConfig_t config;
    ncclComm_t comm = NULL;

    id = fx->id;
    bad_config_make(&config, which);
    ncclResult_t res = bad_note(fx, ncclCommInitRankConfig(
        which == BAD_CONFIG_NULL_COMM ? NULL : &comm, fx->world->nranks, id, fx->world->rank,
        &config));
    if (res == ncclSuccess) {
        ncclCommDestroy(comm);
    }
    return res;
}

enum bad_scalable { BAD_SCALABLE_NID_0, BAD_SCALABLE_NULL_IDS, BAD_SCALABLE_CONFIG,
                    BAD_SCALABLE_RANK_N };

static ncclResult_t
bad_init_scalable(struct bad_fixture *fx, int which)
{
    ncclUniqueId id;
    ncclConfig_t config;
    ncclComm_t comm = NULL;
    int n = fx->world->nranks;

    id = fx->id;
    bad_config_make(&config, which == BAD_SCALABLE_CONFIG ? BAD_CONFIG_MAGIC : -1);
    ncclResult_t res = bad_note(fx, ncclCommInitRankScalable(
        &comm, n, which == BAD_SCALABLE_RANK_N ? n : fx->world->rank,
        which == BAD_SCALABLE_NID_0 ? 0 : 1, which == BAD_SCALABLE_NULL_IDS ? NULL : &id,
        &config));
    if (res == ncclSuccess) {
        ncclCommDestroy(comm);
    }
    return res;
}

enum bad_init_all { BAD_ALL_NULL_COMMS, BAD_ALL_NDEV_NEG, BAD_ALL_NDEV_HUGE, BAD_ALL_DEV_NEG,
                    BAD_ALL_DEV_DUP };

static ncclResult_t
bad_init_all(struct bad_fixture *fx, int which)
{
    ncclComm_t comms[2] = {NULL, NULL};
    int devs[2] = {0, 1};
    int ndev = 2;

    switch (which) {
    case BAD_ALL_NDEV_NEG: ndev = -1; break;
    case BAD_ALL_NDEV_HUGE: ndev = INT_MAX; break;
    case BAD_ALL_DEV_NEG: devs[1] = -1; break;
    case BAD_ALL_DEV_DUP: devs[1] = 0; break;
    default: break;
    }
    ncclResult_t res = bad_note(fx, ncclCommInitAll(which == BAD_ALL_NULL_COMMS ? NULL : comms,
                                                    ndev, devs));
    if (res == ncclSuccess && ndev == 2) {
        ncclCommDestroy(comms[0]);
        ncclCommDestroy(comms[1]);
    }
    return res;
}

enum bad_split { BAD_SPLIT_NULL_COMM, BAD_SPLIT_DEAD, BAD_SPLIT_NULL_NEW, BAD_SPLIT_COLOR,
                 BAD_SPLIT_CONFIG };

static ncclResult_t
bad_split(struct bad_fixture *fx, int which)
{
    ncclComm_t comm = which == BAD_SPLIT_NULL_COMM ? NULL
                      : which == BAD_SPLIT_DEAD    ? fx->dead : fx->comm;
    ncclComm_t child = NULL;
    ncclConfig_t config;

    bad_config_make(&config, which == BAD_SPLIT_CONFIG ? BAD_CONFIG_VERSION : -1);
    ncclResult_t res = bad_note(fx, ncclCommSplit(comm, which == BAD_SPLIT_COLOR ? -2 : 0,
                                                  fx->world->rank,
                                                  which == BAD_SPLIT_NULL_NEW ? NULL : &child,
                                                  &config));
    if (res == ncclSuccess) {
        ncclCommDestroy(child);
    }
    return res;
}

enum bad_shrink { BAD_SHRINK_NULL_COMM, BAD_SHRINK_NULL_NEW, BAD_SHRINK_COUNT_NEG,
                  BAD_SHRINK_NULL_LIST, BAD_SHRINK_RANK_N, BAD_SHRINK_RANK_NEG, BAD_SHRINK_SELF,
                  BAD_SHRINK_FLAGS, BAD_SHRINK_CONFIG };

static ncclResult_t
bad_shrink(struct bad_fixture *fx, int which)
{
    int exclude[1] = {fx->world->nranks};
    int count = 0, flags = NCCL_SHRINK_DEFAULT;
    ncclComm_t child = NULL;
    ncclConfig_t config;

    bad_config_make(&config, which == BAD_SHRINK_CONFIG ? BAD_CONFIG_MAGIC : -1);
    switch (which) {
    case BAD_SHRINK_COUNT_NEG: count = -1; break;
    case BAD_SHRINK_NULL_LIST: count = 1; break;
    case BAD_SHRINK_RANK_N: count = 1; break;
    case BAD_SHRINK_RANK_NEG: count = 1; exclude[0] = -1; break;
    case BAD_SHRINK_SELF: count = 1; exclude[0] = fx->world->rank; break;
    case BAD_SHRINK_FLAGS: flags = 0x40; break;
    default: break;
    }
    ncclResult_t res = bad_note(fx, ncclCommShrink(
        which == BAD_SHRINK_NULL_COMM ? NULL : fx->comm,
        which == BAD_SHRINK_NULL_LIST ? NULL : exclude, count,
        which == BAD_SHRINK_NULL_NEW ? NULL : &child, &config, flags));
    if (res == ncclSuccess) {
        ncclCommDestroy(child);
    }
    return res;
}

/* --- communicator queries and lifetime ---------------------------------------------------- */

enum bad_query { BAD_QUERY_NULL_OUT, BAD_QUERY_NULL_COMM, BAD_QUERY_DEAD };

static ncclComm_t
bad_query_comm(struct bad_fixture *fx, int which)
{
    return which == BAD_QUERY_NULL_COMM ? NULL : which == BAD_QUERY_DEAD ? fx->dead : fx->comm;
}

static ncclResult_t
bad_count(struct bad_fixture *fx, int which)
{
    int out;
    return bad_note(fx, ncclCommCount(bad_query_comm(fx, which),
                                      which == BAD_QUERY_NULL_OUT ? NULL : &out));
}

static ncclResult_t
bad_cu_device(struct bad_fixture *fx, int which)
{
    int out;
    return bad_note(fx, ncclCommCuDevice(bad_query_comm(fx, which),
                                         which == BAD_QUERY_NULL_OUT ? NULL : &out));
}

static ncclResult_t
bad_user_rank(struct bad_fixture *fx, int which)
{
    int out;
    return bad_note(fx, ncclCommUserRank(bad_query_comm(fx, which),
                                         which == BAD_QUERY_NULL_OUT ? NULL : &out));
}

static ncclResult_t
bad_async_error(struct bad_fixture *fx, int which)
{
    ncclResult_t out;
    return bad_note(fx, ncclCommGetAsyncError(bad_query_comm(fx, which),
                                              which == BAD_QUERY_NULL_OUT ? NULL : &out));
}

static ncclResult_t
bad_finalize(struct bad_fixture *fx, int which)
{
    return bad_note(fx, ncclCommFinalize(which == 0 ? NULL : which == 1 ? fx->dead : fx->fin));
}

static ncclResult_t
bad_destroy(struct bad_fixture *fx, int which)
{
    return bad_note(fx, ncclCommDestroy(which == 0 ? NULL : fx->dead));
}

static ncclResult_t
bad_abort(struct bad_fixture *fx, int which)
{
    return bad_note(fx, ncclCommAbort(which == 0 ? NULL : fx->dead));
}

static ncclResult_t
bad_revoke(struct bad_fixture *fx, int which)
{
    return bad_note(fx, ncclCommRevoke(which == 0 ? NULL : fx->dead, 0));
}

/* --- reduction operators ------------------------------------------------------------------ */

enum bad_premulsum { BAD_PMS_NULL_OP, BAD_PMS_NULL_SCALAR, BAD_PMS_TYPE_NUM, BAD_PMS_TYPE_NEG,
                     BAD_PMS_RESIDENCE, BAD_PMS_RESIDENCE_NEG, BAD_PMS_NULL_COMM,
                     BAD_PMS_DEAD };

static ncclResult_t
bad_premulsum(struct bad_fixture *fx, int which)
{
    ncclRedOp_t op = ncclSum;
    double scalar = 2.0;
    ncclDataType_t type = ncclFloat64;
    int residence = ncclScalarHostImmediate;
    ncclComm_t comm = fx->comm;

    switch (which) {
    case BAD_PMS_TYPE_NUM: type = ncclNumTypes; break;
    case BAD_PMS_TYPE_NEG: type = (ncclDataType_t)-1; break;
    case BAD_PMS_RESIDENCE: residence = 2; break;
    case BAD_PMS_RESIDENCE_NEG: residence = -1; break;
    case BAD_PMS_NULL_COMM: comm = NULL; break;
    case BAD_PMS_DEAD: comm = fx->dead; break;
    default: break;
    }
    ncclResult_t res = bad_note(fx, ncclRedOpCreatePreMulSum(
        which == BAD_PMS_NULL_OP ? NULL : &op, which == BAD_PMS_NULL_SCALAR ? NULL : &scalar,
        type, (ncclScalarResidence_t)residence, comm));
    if (res == ncclSuccess) {
        ncclRedOpDestroy(op, comm);
    }
    return res;
}

enum bad_redop_destroy { BAD_RD_BUILTIN, BAD_RD_NEG, BAD_RD_UNCREATED, BAD_RD_OTHER,
                         BAD_RD_TWICE, BAD_RD_NULL_COMM, BAD_RD_DEAD };

static ncclResult_t
bad_redop_destroy(struct bad_fixture *fx, int which)
{
    ncclRedOp_t op = ncclSum;
    ncclComm_t comm = fx->comm;
    float scalar = 0.5f;

    switch (which) {
    case BAD_RD_NEG: op = (ncclRedOp_t)-1; break;
    case BAD_RD_UNCREATED: op = ncclNumOps; break;
    case BAD_RD_OTHER: op = fx->other_op; break;
    case BAD_RD_TWICE:
        MP_CHECK_COMM(comm, ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32,
                                                     ncclScalarHostImmediate, comm));
        MP_CHECK_COMM(comm, ncclRedOpDestroy(op, comm));
        break;
    case BAD_RD_NULL_COMM: op = fx->other_op; comm = NULL; break;
    case BAD_RD_DEAD: op = fx->other_op; comm = fx->dead; break;
    default: break;
    }
    return bad_note(fx, ncclRedOpDestroy(op, comm));
}

/* --- memory ------------------------------------------------------------------------------- */

enum bad_mem { BAD_MEM_ALLOC_NULL, BAD_MEM_FREE_NULL, BAD_MEM_FREE_FOREIGN, BAD_MEM_FREE_TWICE };

static ncclResult_t
bad_mem(struct bad_fixture *fx, int which)
{
    void *ptr = NULL;

    switch (which) {
    case BAD_MEM_ALLOC_NULL:
        return bad_note(fx, ncclMemAlloc(NULL, 64));
    case BAD_MEM_FREE_NULL:
        return bad_note(fx, ncclMemFree(NULL)); /* as cudaFree(NULL): nothing to do */
    case BAD_MEM_FREE_FOREIGN:
        return bad_note(fx, ncclMemFree(fx->send)); /* not from ncclMemAlloc */
    default:
        MP_CHECK(ncclMemAlloc(&ptr, 64));
        MP_CHECK(ncclMemFree(ptr));
        return bad_note(fx, ncclMemFree(ptr));
    }
}

enum bad_reg { BAD_REG_NULL_COMM, BAD_REG_DEAD, BAD_REG_NULL_HANDLE, BAD_REG_NULL_BUFF,
               BAD_DEREG_NULL_COMM, BAD_DEREG_DEAD, BAD_DEREG_NULL, BAD_DEREG_OTHER,
               BAD_DEREG_TWICE,
               BAD_WIN_NULL_COMM, BAD_WINDEREG_NULL_COMM };

static ncclResult_t
bad_register(struct bad_fixture *fx, int which)
{
    void *handle = NULL, *other_handle = NULL;
    ncclResult_t res;
    ncclWindow_t win;

    switch (which) {
    case BAD_REG_NULL_COMM:
        return bad_note(fx, ncclCommRegister(NULL, fx->send, sizeof(fx->send), &handle));
    case BAD_REG_DEAD:
        return bad_note(fx, ncclCommRegister(fx->dead, fx->send, sizeof(fx->send), &handle));
    case BAD_REG_NULL_HANDLE:
        return bad_note(fx, ncclCommRegister(fx->comm, fx->send, sizeof(fx->send), NULL));
    case BAD_REG_NULL_BUFF:
        res = bad_note(fx, ncclCommRegister(fx->comm, NULL, 64, &handle));
        if (res == ncclSuccess) {
            ncclCommDeregister(fx->comm, handle);
        }
        return res;
    case BAD_DEREG_NULL_COMM:
    case BAD_DEREG_DEAD:
        MP_CHECK_COMM(fx->comm, ncclCommRegister(fx->comm, fx->send, sizeof(fx->send),
                                                 &handle));
        res = bad_note(fx, ncclCommDeregister(which == BAD_DEREG_DEAD ? fx->dead : NULL,
                                              handle));
        MP_CHECK_COMM(fx->comm, ncclCommDeregister(fx->comm, handle));
        return res;
    case BAD_DEREG_NULL:
        return bad_note(fx, ncclCommDeregister(fx->comm, NULL));
    case BAD_DEREG_TWICE:
        MP_CHECK_COMM(fx->comm, ncclCommRegister(fx->comm, fx->send, sizeof(fx->send),
                                                 &handle));
        MP_CHECK_COMM(fx->comm, ncclCommDeregister(fx->comm, handle));
        return bad_note(fx, ncclCommDeregister(fx->comm, handle));
    case BAD_DEREG_OTHER: /* a handle of another communicator */
        MP_CHECK_COMM(fx->other, ncclCommRegister(fx->other, fx->send, sizeof(fx->send),
                                                  &other_handle));
        res = bad_note(fx, ncclCommDeregister(fx->comm, other_handle));
        MP_CHECK_COMM(fx->other, ncclCommDeregister(fx->other, other_handle));
        return res;
    case BAD_WIN_NULL_COMM:
        return bad_note(fx, ncclCommWindowRegister(NULL, fx->send, sizeof(fx->send), &win, 0));
    default:
        memset(&win, 0, sizeof(win));
        return bad_note(fx, ncclCommWindowDeregister(NULL, win));
    }
}

/* --- the table ---------------------------------------------------------------------------- */

struct bad_case {
    const char *name;
    ncclResult_t (*call)(struct bad_fixture *fx, int arg);
    int arg;
    ncclResult_t expect;
};

#define ARG ncclInvalidArgument
#define USE ncclInvalidUsage
#define OK ncclSuccess

/* Faults every collective shares, then those of reducing, rooted and p2p calls. */
#define BAD_COMMON(coll, send_fault)                                                          \
    {#coll ": NULL comm", bad_##coll, BAD_NULL_COMM, ARG},                                    \
    {#coll ": destroyed comm", bad_##coll, BAD_DEAD_COMM, ARG},                               \
    {#coll ": finalized comm", bad_##coll, BAD_FIN_COMM, USE},                                \
    {#coll ": NULL buffer", bad_##coll, send_fault, ARG},                                     \
    {#coll ": type ncclNumTypes", bad_##coll, BAD_TYPE_NUM, ARG},                             \
    {#coll ": type -1", bad_##coll, BAD_TYPE_NEG, ARG}
#define BAD_REDUCING(coll)                                                                    \
    {#coll ": op ncclNumOps", bad_##coll, BAD_OP_NUM, ARG},                                   \
    {#coll ": op ncclMaxRedOp", bad_##coll, BAD_OP_MAX, ARG},                                 \
    {#coll ": PreMulSum of other comm", bad_##coll, BAD_OP_OTHER, ARG},                       \
    {#coll ": other comm's twin PreMulSum", bad_##coll, BAD_OP_TWIN, ARG},                    \
    {#coll ": destroyed PreMulSum", bad_##coll, BAD_OP_GONE, ARG},                            \
    {#coll ": PreMulSum of other type", bad_##coll, BAD_OP_TYPE, ARG}
#define BAD_ROOTED(coll, what)                                                                \
    {#coll ": " what " -1", bad_##coll, BAD_ROOT_NEG, ARG},                                   \
    {#coll ": " what " nranks", bad_##coll, BAD_ROOT_N, ARG}

/* NULL buffers are chosen as ones every rank uses, so that every rank refuses the call. */
static const struct bad_case bad_cases[] = {
    BAD_COMMON(allreduce, BAD_NULL_RECV), BAD_REDUCING(allreduce),
    {"allreduce: NULL sendbuff", bad_allreduce, BAD_NULL_SEND, ARG},
    BAD_COMMON(reduce, BAD_NULL_SEND), BAD_REDUCING(reduce), BAD_ROOTED(reduce, "root"),
    BAD_COMMON(reducescatter, BAD_NULL_RECV), BAD_REDUCING(reducescatter),
    {"reducescatter: NULL sendbuff", bad_reducescatter, BAD_NULL_SEND, ARG},
    BAD_COMMON(broadcast, BAD_NULL_RECV), BAD_ROOTED(broadcast, "root"),
    BAD_COMMON(bcast, BAD_NULL_RECV), BAD_ROOTED(bcast, "root"),
    BAD_COMMON(allgather, BAD_NULL_SEND),
    {"allgather: NULL recvbuff", bad_allgather, BAD_NULL_RECV, ARG},
    BAD_COMMON(alltoall, BAD_NULL_SEND),
    {"alltoall: NULL recvbuff", bad_alltoall, BAD_NULL_RECV, ARG},
    BAD_COMMON(gather, BAD_NULL_SEND), BAD_ROOTED(gather, "root"),
    BAD_COMMON(scatter, BAD_NULL_RECV), BAD_ROOTED(scatter, "root"),
    BAD_COMMON(send, BAD_NULL_SEND), BAD_ROOTED(send, "peer"),
    BAD_COMMON(recv, BAD_NULL_RECV), BAD_ROOTED(recv, "peer"),

    {"group: ncclGroupEnd without start", bad_group_end_alone, 0, USE},
    {"group: bad call inside a group", bad_group_member, 0, ARG},
    {"group: ncclGroupSimulateEnd(NULL)", bad_group_simulate_null, 0, ARG},

    {"ncclGetVersion(NULL)", bad_get_version, 0, ARG},
    {"ncclGetUniqueId(NULL)", bad_get_unique_id, 0, ARG},
    {"ncclGetErrorString(-1)", bad_error_string, -1, OK},
    {"ncclGetErrorString(ncclNumResults)", bad_error_string, ncclNumResults, OK},
    {"ncclGetErrorString(INT_MAX)", bad_error_string, INT_MAX, OK},
    {"ncclGetLastError(destroyed comm)", bad_last_error_dead, 0, OK},

    {"init rank: NULL comm", bad_init_rank, BAD_INIT_NULL_COMM, ARG},
    {"init rank: nranks 0", bad_init_rank, BAD_INIT_NRANKS_0, ARG},
    {"init rank: nranks -1", bad_init_rank, BAD_INIT_NRANKS_NEG, ARG},
    {"init rank: rank -1", bad_init_rank, BAD_INIT_RANK_NEG, ARG},
    {"init rank: rank nranks", bad_init_rank, BAD_INIT_RANK_N, ARG},
    {"init config: bad magic", bad_init_config, BAD_CONFIG_MAGIC, ARG},
    {"init config: version 0", bad_init_config, BAD_CONFIG_VERSION, ARG},
    {"init config: size 0", bad_init_config, BAD_CONFIG_SIZE, ARG},
    {"init config: blocking 7", bad_init_config, BAD_CONFIG_BLOCKING, ARG},
    {"init config: NULL comm", bad_init_config, BAD_CONFIG_NULL_COMM, ARG},
    {"init scalable: nId 0", bad_init_scalable, BAD_SCALABLE_NID_0, ARG},
    {"init scalable: NULL commIds", bad_init_scalable, BAD_SCALABLE_NULL_IDS, ARG},
    {"init scalable: bad config", bad_init_scalable, BAD_SCALABLE_CONFIG, ARG},
    {"init scalable: rank nranks", bad_init_scalable, BAD_SCALABLE_RANK_N, ARG},
    {"init all: NULL comms", bad_init_all, BAD_ALL_NULL_COMMS, ARG},
    {"init all: ndev -1", bad_init_all, BAD_ALL_NDEV_NEG, ARG},
    {"init all: ndev INT_MAX", bad_init_all, BAD_ALL_NDEV_HUGE, ARG},
    {"init all: device -1", bad_init_all, BAD_ALL_DEV_NEG, ARG},
    {"init all: duplicate device", bad_init_all, BAD_ALL_DEV_DUP, USE},

    {"split: NULL comm", bad_split, BAD_SPLIT_NULL_COMM, ARG},
    {"split: destroyed comm", bad_split, BAD_SPLIT_DEAD, ARG},
    {"split: NULL newcomm", bad_split, BAD_SPLIT_NULL_NEW, ARG},
    {"split: color -2", bad_split, BAD_SPLIT_COLOR, ARG},
    {"split: config version 0", bad_split, BAD_SPLIT_CONFIG, ARG},
    {"shrink: NULL comm", bad_shrink, BAD_SHRINK_NULL_COMM, ARG},
    {"shrink: NULL newcomm", bad_shrink, BAD_SHRINK_NULL_NEW, ARG},
    {"shrink: count -1", bad_shrink, BAD_SHRINK_COUNT_NEG, ARG},
    {"shrink: NULL list, count 1", bad_shrink, BAD_SHRINK_NULL_LIST, ARG},
    {"shrink: exclude nranks", bad_shrink, BAD_SHRINK_RANK_N, ARG},
    {"shrink: exclude -1", bad_shrink, BAD_SHRINK_RANK_NEG, ARG},
    {"shrink: exclude itself", bad_shrink, BAD_SHRINK_SELF, ARG},
    {"shrink: unknown flags", bad_shrink, BAD_SHRINK_FLAGS, ARG},
    {"shrink: bad config magic", bad_shrink, BAD_SHRINK_CONFIG, ARG},

    {"count: NULL out", bad_count, BAD_QUERY_NULL_OUT, ARG},
    {"count: NULL comm", bad_count, BAD_QUERY_NULL_COMM, ARG},
    {"count: destroyed comm", bad_count, BAD_QUERY_DEAD, ARG},
    {"cuDevice: NULL out", bad_cu_device, BAD_QUERY_NULL_OUT, ARG},
    {"cuDevice: NULL comm", bad_cu_device, BAD_QUERY_NULL_COMM, ARG},
    {"cuDevice: destroyed comm", bad_cu_device, BAD_QUERY_DEAD, ARG},
    {"userRank: NULL out", bad_user_rank, BAD_QUERY_NULL_OUT, ARG},
    {"userRank: NULL comm", bad_user_rank, BAD_QUERY_NULL_COMM, ARG},
    {"userRank: destroyed comm", bad_user_rank, BAD_QUERY_DEAD, ARG},
    {"asyncError: NULL out", bad_async_error, BAD_QUERY_NULL_OUT, ARG},
    {"asyncError: NULL comm", bad_async_error, BAD_QUERY_NULL_COMM, ARG},
    {"asyncError: destroyed comm", bad_async_error, BAD_QUERY_DEAD, ARG},
    {"finalize: NULL comm", bad_finalize, 0, ARG},
    {"finalize: destroyed comm", bad_finalize, 1, ARG},
    {"finalize: twice", bad_finalize, 2, USE},
    {"destroy: NULL (a no-op)", bad_destroy, 0, OK},
    {"destroy: destroyed comm", bad_destroy, 1, ARG},
    {"abort: NULL (a no-op)", bad_abort, 0, OK},
    {"abort: destroyed comm", bad_abort, 1, ARG},
    {"revoke: NULL comm", bad_revoke, 0, ARG},
    {"revoke: destroyed comm", bad_revoke, 1, ARG},

    {"premulsum: NULL op", bad_premulsum, BAD_PMS_NULL_OP, ARG},
    {"premulsum: NULL scalar", bad_premulsum, BAD_PMS_NULL_SCALAR, ARG},
    {"premulsum: type ncclNumTypes", bad_premulsum, BAD_PMS_TYPE_NUM, ARG},
    {"premulsum: type -1", bad_premulsum, BAD_PMS_TYPE_NEG, ARG},
    {"premulsum: residence 2", bad_premulsum, BAD_PMS_RESIDENCE, ARG},
    {"premulsum: residence -1", bad_premulsum, BAD_PMS_RESIDENCE_NEG, ARG},
    {"premulsum: NULL comm", bad_premulsum, BAD_PMS_NULL_COMM, ARG},
    {"premulsum: destroyed comm", bad_premulsum, BAD_PMS_DEAD, ARG},
    {"redop destroy: ncclSum", bad_redop_destroy, BAD_RD_BUILTIN, ARG},
    {"redop destroy: op -1", bad_redop_destroy, BAD_RD_NEG, ARG},
    {"redop destroy: never created", bad_redop_destroy, BAD_RD_UNCREATED, ARG},
    {"redop destroy: op of other comm", bad_redop_destroy, BAD_RD_OTHER, ARG},
    {"redop destroy: twice", bad_redop_destroy, BAD_RD_TWICE, ARG},
    {"redop destroy: NULL comm", bad_redop_destroy, BAD_RD_NULL_COMM, ARG},
    {"redop destroy: destroyed comm", bad_redop_destroy, BAD_RD_DEAD, ARG},

    {"memAlloc: NULL ptr", bad_mem, BAD_MEM_ALLOC_NULL, ARG},
    {"memFree: NULL (a no-op)", bad_mem, BAD_MEM_FREE_NULL, OK},
    {"memFree: not from ncclMemAlloc", bad_mem, BAD_MEM_FREE_FOREIGN, ARG},
    {"memFree: twice", bad_mem, BAD_MEM_FREE_TWICE, ARG},
    {"register: NULL comm", bad_register, BAD_REG_NULL_COMM, ARG},
    {"register: destroyed comm", bad_register, BAD_REG_DEAD, ARG},
    {"register: NULL handle", bad_register, BAD_REG_NULL_HANDLE, ARG},
    {"register: NULL buff, size 64", bad_register, BAD_REG_NULL_BUFF, ARG},
    {"deregister: NULL comm", bad_register, BAD_DEREG_NULL_COMM, ARG},
    {"deregister: destroyed comm", bad_register, BAD_DEREG_DEAD, ARG},
    {"deregister: NULL handle", bad_register, BAD_DEREG_NULL, ARG},
    {"deregister: handle of other comm", bad_register, BAD_DEREG_OTHER, ARG},
    {"deregister: the same handle twice", bad_register, BAD_DEREG_TWICE, ARG},
    {"windowRegister: NULL comm", bad_register, BAD_WIN_NULL_COMM, ARG},
    {"windowDeregister: NULL comm", bad_register, BAD_WINDEREG_NULL_COMM, ARG},
};
#define BAD_NCASES ((int)(sizeof(bad_cases) / sizeof(bad_cases[0])))

/* --- running it --------------------------------------------------------------------------- */

/* Each rank sends its rank to the next and receives the previous one's, in one group. */
static bool
bad_ring_works(ncclComm_t comm, int rank, int nranks)
{
    int out = rank, in = -1;
    int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;

    MP_CHECK_COMM(comm, ncclGroupStart());
    MP_CHECK_COMM(comm, ncclSend(&out, 1, ncclInt32, next, comm, NULL));
    MP_CHECK_COMM(comm, ncclRecv(&in, 1, ncclInt32, prev, comm, NULL));
    MP_CHECK_COMM(comm, ncclGroupEnd());
    return in == prev;
}

/* Runs row i; returns whether it passed on this rank. */
static bool
bad_run_case(struct bad_fixture *fx, int i, bool verbose)
{
    const struct bad_case *c = &bad_cases[i];
    const struct mp_world *world = fx->world;
    bool ok = true;

    fx->message[0] = '\0';
    ncclResult_t res = c->call(fx, c->arg);
    if (res != c->expect) {
        mp_report(__FILE__, __LINE__, "%s: gave %s (%d), expected %s (%d); last error \"%s\"",
                  c->name, ncclGetErrorString(res), (int)res, ncclGetErrorString(c->expect),
                  (int)c->expect, fx->message);
        ok = false;
    } else if (c->expect != ncclSuccess && fx->message[0] == '\0') {
        mp_report(__FILE__, __LINE__, "%s: gave %s but ncclGetLastError is empty", c->name,
                  ncclGetErrorString(res));
        ok = false;
    }
    if (mp_allreduce_check(fx->comm, world->rank, world->nranks, ncclFloat32, 7, false,
                           (uint64_t)i) != 0) {
        mp_report(__FILE__, __LINE__, "%s: the communicator no longer all-reduces", c->name);
        ok = false;
    }
    if (!bad_ring_works(fx->comm, world->rank, world->nranks)) {
        mp_report(__FILE__, __LINE__, "%s: send/recv on the communicator went wrong", c->name);
        ok = false;
    }
    if (verbose || world->rank == 0) {
        printf("%s %3d %-40s %-22s \"%.60s\"\n", ok ? "ok  " : "FAIL", i, c->name,
               ncclGetErrorString(res), fx->message);
        fflush(stdout);
    }
    return ok;
}

static void
bad_fixture_init(struct bad_fixture *fx, const struct mp_world *world)
{
    float scalar = 3.0f;

    memset(fx, 0, sizeof(*fx));
    fx->world = world;
    fx->comm = world->comm;
    MP_CHECK(ncclGetUniqueId(&fx->id));
    for (size_t i = 0; i < sizeof(fx->send) / sizeof(fx->send[0]); i++) {
        fx->send[i] = (float)i;
    }
    MP_CHECK_COMM(fx->comm, ncclCommSplit(fx->comm, 0, world->rank, &fx->other, NULL));
    MP_CHECK_COMM(fx->comm, ncclCommSplit(fx->comm, 0, world->rank, &fx->dead, NULL));
    MP_CHECK_COMM(fx->comm, ncclCommSplit(fx->comm, 0, world->rank, &fx->fin, NULL));
    MP_CHECK_COMM(fx->other, ncclRedOpCreatePreMulSum(&fx->other_op, &scalar, ncclFloat32,
                                                      ncclScalarHostImmediate, fx->other));
    MP_CHECK_COMM(fx->dead, ncclCommDestroy(fx->dead));
    MP_CHECK_COMM(fx->fin, ncclCommFinalize(fx->fin));
}

static void
bad_fixture_fini(struct bad_fixture *fx)
{
    MP_CHECK_COMM(fx->other, ncclRedOpDestroy(fx->other_op, fx->other));
    MP_CHECK_COMM(fx->other, ncclCommDestroy(fx->other));
    MP_CHECK_COMM(fx->fin, ncclCommDestroy(fx->fin));
}

int
main(int argc, char **argv)
{
    struct mp_world world;
    struct bad_fixture fx;
    bool verbose = argc > 1 && strcmp(argv[1], "-v") == 0;
    int failed = 0;

    mp_world_init(&world);
    bad_fixture_init(&fx, &world);
    for (int i = 0; i < BAD_NCASES; i++) {
        failed += !bad_run_case(&fx, i, verbose);
    }
    bad_fixture_fini(&fx);

    /* Every rank's count, so that rank 0's summary covers them all. */
    int total = failed + mp_failures;
    MP_CHECK_COMM(world.comm, ncclAllReduce(&total, &total, 1, ncclInt32, ncclSum, world.comm,
                                            NULL));
    if (world.rank == 0) {
        printf("badinput: %d cases on %d ranks, %d failures on all ranks\n", BAD_NCASES,
               world.nranks, total);
    }
    MP_CHECK_COMM(world.comm, ncclCommDestroy(world.comm));
    return failed + mp_failures > 0 || total > 0 ? 1 : 0;
}
