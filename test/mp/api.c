/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The communicator API through the real libnccl.so.2, on N ranks started by tools/launcher:
 * version, error strings, counts and ranks, ncclCommInitRankConfig blocking and non-blocking,
 * ncclCommInitAll with a group of all-reduces driven from one thread, finalize, destroy and
 * abort, bad arguments (each must give ncclInvalidArgument or ncclInvalidUsage and leave a
 * message for ncclGetLastError), a collective the library does not implement yet (an error
 * with a message, after which the communicator still works), and ncclUniqueIds that lead
 * nowhere (an error, not a hang).
 *
 * Communicators made one after another all use the launcher's NCCL_COMM_ID, as an NCCL
 * program started that way does: rank 0 hosts each rendezvous in turn, and a barrier on the
 * first communicator separates one creation from the next.
 *
 * Usage: api [-d SECONDS]. -d also joins a rendezvous whose root never comes, which must fail
 * after NCCLSHIM_BOOTSTRAP_TIMEOUT, here set to SECONDS for the whole program (so that it is
 * worth its wait in a few runs only). The exit status is 1 on this rank if a check failed.
 */
#include "common.h"

#include <unistd.h>

/* The texts NVIDIA's libnccl.so.2 2.28 (2.32 for ncclTimeout) returns, which programs may print or match: ours must
 * say the same up to its advice (" (run with ...", " - please report ..."), which may differ. */
static const char *const api_error_texts[ncclNumResults] = {
    [ncclSuccess] = "no error",
    [ncclUnhandledCudaError] = "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    [ncclSystemError] = "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    [ncclInternalError] = "internal error - please report this issue to the NCCL developers",
    [ncclInvalidArgument] = "invalid argument (run with NCCL_DEBUG=WARN for details)",
    [ncclInvalidUsage] = "invalid usage (run with NCCL_DEBUG=WARN for details)",
    [ncclRemoteError] = "remote process exited or there was a network error",
    [ncclInProgress] = "NCCL operation in progress",
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 32, 0)
    [ncclTimeout] = "timeout",
#endif
};

/* Rank 0 names each step as it starts, so that a run killed by its timeout shows where. */
static void
api_step(const char *what)
{
    if (mp_rank_id == 0) {
        printf("api: %s\n", what);
        fflush(stdout);
    }
}

/* A call that must be refused as a bad argument, with a message. */
#define API_EXPECT_REFUSED(comm, call)                                                        \
    api_expect_refused(__FILE__, __LINE__, #call, (call), (comm))

static void
api_expect_refused(const char *file, int line, const char *expr, ncclResult_t res,
                   ncclComm_t comm)
{
    const char *text = ncclGetLastError(comm);

    if (res != ncclInvalidArgument && res != ncclInvalidUsage) {
        mp_report(file, line, "%s gave %s (%d), expected ncclInvalidArgument or "
                  "ncclInvalidUsage", expr, ncclGetErrorString(res), (int)res);
        mp_failures++;
    } else if (text == NULL || text[0] == '\0') {
        mp_report(file, line, "%s gave %s but ncclGetLastError is empty", expr,
                  ncclGetErrorString(res));
        mp_failures++;
    }
}

static void
api_check_works(ncclComm_t comm, const struct mp_world *world, const char *when)
{
    long wrong = mp_allreduce_check(comm, world->rank, world->nranks, ncclFloat32, 1000,
                                    false, 17);

    MP_EXPECT(wrong == 0, "%s: the all-reduce check failed (%ld)", when, wrong);
    wrong = mp_allreduce_check(comm, world->rank, world->nranks, ncclInt32, world->nranks + 1,
                               true, 18);
    MP_EXPECT(wrong == 0, "%s: the in-place all-reduce check failed (%ld)", when, wrong);
}

static void
api_check_identity(ncclComm_t comm, int nranks, int rank, const char *what)
{
    int count = -1;
    int user_rank = -1;
    ncclResult_t state = ncclInternalError;

    MP_CHECK_COMM(comm, ncclCommCount(comm, &count));
    MP_CHECK_COMM(comm, ncclCommUserRank(comm, &user_rank));
    MP_CHECK_COMM(comm, ncclCommGetAsyncError(comm, &state));
    MP_EXPECT(count == nranks, "%s: ncclCommCount gave %d, expected %d", what, count, nranks);
    MP_EXPECT(user_rank == rank, "%s: ncclCommUserRank gave %d, expected %d", what, user_rank,
              rank);
    MP_EXPECT(state == ncclSuccess, "%s: ncclCommGetAsyncError gave %s", what,
              ncclGetErrorString(state));
}

/* --- no communicator needed --------------------------------------------------------------- */

static void
api_test_version(void)
{
    int version = -1;

    MP_CHECK(ncclGetVersion(&version));
    MP_EXPECT(version == NCCL_VERSION_CODE, "ncclGetVersion gave %d, nccl.h says %d", version,
              NCCL_VERSION_CODE);
    API_EXPECT_REFUSED(NULL, ncclGetVersion(NULL));
}

static void
api_test_error_strings(void)
{
    for (int code = 0; code < ncclNumResults; code++) {
        const char *text = ncclGetErrorString((ncclResult_t)code);
        MP_EXPECT(text != NULL && text[0] != '\0', "ncclGetErrorString(%d) is empty", code);
        if (text != NULL) {
            const char *nccl = api_error_texts[code];
            size_t head = strcspn(nccl, "(-");
            while (head > 0 && nccl[head - 1] == ' ') {
                head--;
            }
            MP_EXPECT(strncmp(text, nccl, head) == 0 && strcspn(text, "(-") >= head,
                      "ncclGetErrorString(%d) is \"%s\"; NCCL says \"%s\"", code, text, nccl);
        }
    }
    const char *unknown = ncclGetErrorString((ncclResult_t)99);
    MP_EXPECT(unknown != NULL && unknown[0] != '\0', "ncclGetErrorString(99) is empty");
}

static void
api_test_bad_init(const struct mp_world *world)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    int n = world->nranks;

    API_EXPECT_REFUSED(NULL, ncclGetUniqueId(NULL));
    MP_CHECK(ncclGetUniqueId(&id));
    API_EXPECT_REFUSED(NULL, ncclCommInitRank(&comm, 0, id, 0));
    API_EXPECT_REFUSED(NULL, ncclCommInitRank(&comm, -1, id, 0));
    API_EXPECT_REFUSED(NULL, ncclCommInitRank(&comm, n, id, n));
    API_EXPECT_REFUSED(NULL, ncclCommInitRank(&comm, n, id, -1));
    API_EXPECT_REFUSED(NULL, ncclCommInitRank(NULL, n, id, world->rank));
    API_EXPECT_REFUSED(NULL, ncclCommInitAll(NULL, 2, NULL));
    API_EXPECT_REFUSED(NULL, ncclCommInitAll(&comm, 0, NULL));

    float x = 1.0f;
    API_EXPECT_REFUSED(NULL, ncclAllReduce(&x, &x, 1, ncclFloat32, ncclSum, NULL, NULL));
    API_EXPECT_REFUSED(NULL, ncclCommCount(NULL, &n));
    API_EXPECT_REFUSED(NULL, ncclCommUserRank(NULL, &n));
    /* As in NCCL, destroying or aborting no communicator is nothing to do. */
    MP_EXPECT(ncclCommDestroy(NULL) == ncclSuccess, "ncclCommDestroy(NULL) failed");
    MP_EXPECT(ncclCommAbort(NULL) == ncclSuccess, "ncclCommAbort(NULL) failed");
}

/* --- on the world communicator ------------------------------------------------------------ */

static void
api_test_bad_calls(ncclComm_t comm, const struct mp_world *world)
{
    float buf[4] = {1, 2, 3, 4};

    API_EXPECT_REFUSED(comm, ncclAllReduce(NULL, buf, 4, ncclFloat32, ncclSum, comm, NULL));
    API_EXPECT_REFUSED(comm, ncclAllReduce(buf, NULL, 4, ncclFloat32, ncclSum, comm, NULL));
    API_EXPECT_REFUSED(comm, ncclAllReduce(buf, buf, 4, (ncclDataType_t)99, ncclSum, comm,
                                           NULL));
    API_EXPECT_REFUSED(comm, ncclAllReduce(buf, buf, 4, (ncclDataType_t)-1, ncclSum, comm,
                                           NULL));
    API_EXPECT_REFUSED(comm, ncclAllReduce(buf, buf, 4, ncclFloat32, (ncclRedOp_t)99, comm,
                                           NULL));
    API_EXPECT_REFUSED(comm, ncclAllReduce(buf, buf, 4, ncclFloat32, ncclNumOps, comm, NULL));
    API_EXPECT_REFUSED(comm, ncclRedOpDestroy(ncclSum, comm));
    API_EXPECT_REFUSED(comm, ncclRedOpCreatePreMulSum(NULL, buf, ncclFloat32,
                                                      ncclScalarHostImmediate, comm));
    API_EXPECT_REFUSED(comm, ncclCommCount(comm, NULL));
    API_EXPECT_REFUSED(comm, ncclCommUserRank(comm, NULL));
    API_EXPECT_REFUSED(comm, ncclCommGetAsyncError(comm, NULL));
    api_check_works(comm, world, "after refused calls");
}

/*
 * A collective outside this milestone must be refused with ncclInvalidUsage and a message,
 * and leave the communicator working. Once the library implements it, it must be right.
 */
static void
api_test_unimplemented(ncclComm_t comm, const struct mp_world *world)
{
    enum { COUNT = 1000 };
    float *send = malloc(COUNT * sizeof(float));
    float *recv = malloc(COUNT * sizeof(float));
    int root = world->nranks - 1;
    ncclResult_t res;

    MP_ASSERT(send != NULL && recv != NULL, "out of memory");
    for (int i = 0; i < COUNT; i++) {
        send[i] = (float)(world->rank * 1000 + i);
        recv[i] = -1.0f;
    }
    res = ncclBroadcast(send, recv, COUNT, ncclFloat32, root, comm, NULL);
    if (res == ncclSuccess) {
        int wrong = 0;
        for (int i = 0; i < COUNT; i++) {
            wrong += recv[i] != (float)(root * 1000 + i);
        }
        MP_EXPECT(wrong == 0, "ncclBroadcast succeeded, but %d elements are wrong", wrong);
        if (world->rank == 0) {
            printf("api: ncclBroadcast is implemented now; its result was checked\n");
        }
    } else {
        const char *text = ncclGetLastError(comm);
        MP_EXPECT(res == ncclInvalidUsage, "ncclBroadcast gave %s (%d), expected "
                  "ncclInvalidUsage", ncclGetErrorString(res), (int)res);
        MP_EXPECT(text != NULL && text[0] != '\0', "ncclBroadcast was refused without a "
                  "message for ncclGetLastError");
    }
    free(send);
    free(recv);
    api_check_works(comm, world, "after ncclBroadcast");
}

/* ncclCommInitRankConfig with blocking = 1: then an all-reduce, finalize and destroy. */
static void
api_test_config_blocking(const struct mp_world *world)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclResult_t state = ncclInternalError;

    config.blocking = 1;
    MP_CHECK(ncclGetUniqueId(&id));
    MP_CHECK(ncclCommInitRankConfig(&comm, world->nranks, id, world->rank, &config));
    api_check_identity(comm, world->nranks, world->rank, "blocking config");
    api_check_works(comm, world, "blocking config");
    MP_CHECK_COMM(comm, ncclCommFinalize(comm));
    MP_CHECK_COMM(comm, ncclCommGetAsyncError(comm, &state));
    MP_EXPECT(state == ncclSuccess, "after ncclCommFinalize (blocking) the state is %s",
              ncclGetErrorString(state));
    MP_CHECK(ncclCommDestroy(comm));
}

/* blocking = 0: init may answer ncclInProgress; poll until the communicator is ready, use it,
 * then abort it. */
static void
api_test_config_nonblocking(const struct mp_world *world)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    ncclResult_t res;

    config.blocking = 0;
    MP_CHECK(ncclGetUniqueId(&id));
    res = ncclCommInitRankConfig(&comm, world->nranks, id, world->rank, &config);
    MP_ASSERT(res == ncclSuccess || res == ncclInProgress, "non-blocking "
              "ncclCommInitRankConfig gave %s; last error: \"%s\"", ncclGetErrorString(res),
              mp_last_error(NULL));
    MP_ASSERT(comm != NULL, "non-blocking ncclCommInitRankConfig gave no communicator");
    res = mp_comm_wait(comm, 120.0);
    MP_ASSERT(res == ncclSuccess, "non-blocking init ended in %s; last error: \"%s\"",
              ncclGetErrorString(res), mp_last_error(comm));
    api_check_identity(comm, world->nranks, world->rank, "non-blocking config");
    api_check_works(comm, world, "non-blocking config");
    MP_CHECK(ncclCommAbort(comm));
}

/* Four communicators in this one process, driven from one thread through a group. Every
 * rank does this on its own: ncclCommInitAll must not need the launcher's NCCL_COMM_ID. */
static void
api_test_init_all(void)
{
    enum { NDEV = 4, COUNT = 4099 };
    ncclComm_t comms[NDEV] = {NULL};
    float *send[NDEV];
    int32_t *recv_max[NDEV];

    MP_CHECK(ncclCommInitAll(comms, NDEV, NULL));
    for (int d = 0; d < NDEV; d++) {
        MP_ASSERT(comms[d] != NULL, "ncclCommInitAll left comm %d NULL", d);
        api_check_identity(comms[d], NDEV, d, "ncclCommInitAll");
        send[d] = malloc(COUNT * sizeof(float));
        recv_max[d] = malloc(COUNT * sizeof(int32_t));
        MP_ASSERT(send[d] != NULL && recv_max[d] != NULL, "out of memory");
        for (int i = 0; i < COUNT; i++) {
            send[d][i] = (float)((d + 1) * (i % 7));
            recv_max[d][i] = (int32_t)((i * 31 + d * 17) % 101) - 50;
        }
    }

    /* In place, both: a float sum and an int32 max per communicator, eight calls in one
     * group. */
    MP_CHECK(ncclGroupStart());
    for (int d = 0; d < NDEV; d++) {
        MP_CHECK_COMM(comms[d], ncclAllReduce(send[d], send[d], COUNT, ncclFloat32, ncclSum,
                                              comms[d], NULL));
        MP_CHECK_COMM(comms[d], ncclAllReduce(recv_max[d], recv_max[d], COUNT, ncclInt32,
                                              ncclMax, comms[d], NULL));
    }
    MP_CHECK(ncclGroupEnd());

    long wrong = 0;
    for (int d = 0; d < NDEV; d++) {
        for (int i = 0; i < COUNT; i++) {
            int32_t max = INT32_MIN;
            for (int e = 0; e < NDEV; e++) {
                int32_t v = (int32_t)((i * 31 + e * 17) % 101) - 50;
                max = v > max ? v : max;
            }
            bool bad = send[d][i] != (float)(10 * (i % 7)) || recv_max[d][i] != max;
            if (bad && wrong++ < 5) {
                mp_report(__FILE__, __LINE__, "ncclCommInitAll comm %d element %d: sum %g "
                          "(expected %d), max %d (expected %d)", d, i, send[d][i],
                          10 * (i % 7), recv_max[d][i], max);
            }
        }
    }
    MP_EXPECT(wrong == 0, "grouped all-reduces over ncclCommInitAll: %ld wrong", wrong);
    for (int d = 0; d < NDEV; d++) {
        MP_CHECK_COMM(comms[d], ncclCommDestroy(comms[d]));
        free(send[d]);
        free(recv_max[d]);
    }
}

/*
 * An id that is not one: the library must refuse it, not hang. Every byte is 0x7f, so whatever
 * layout a library reads an address from, it finds 127.127.127.127 (loopback) and port 0x7f7f
 * (and an invalid address family): nothing here may ever send a packet off this machine.
 */
static void
api_test_garbage_id(void)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    double start = mp_now();
    ncclResult_t res;

    memset(&id, 0x7f, sizeof(id));
    res = ncclCommInitRank(&comm, 2, id, 1);
    if (res == ncclInProgress && comm != NULL) {
        res = mp_comm_wait(comm, 300.0);
    }
    MP_EXPECT(res != ncclSuccess && res != ncclInProgress, "ncclCommInitRank with a garbage "
              "id gave %s", ncclGetErrorString(res));
    MP_EXPECT(mp_last_error(NULL)[0] != '\0', "garbage id refused without a message");
    if (mp_rank_id == 0) {
        printf("api: a garbage ncclUniqueId gave %s after %.2f s: \"%s\"\n",
               ncclGetErrorString(res), mp_now() - start, mp_last_error(NULL));
    }
    if (res == ncclSuccess) {
        ncclCommAbort(comm);
    }
}

/* A well-formed id (the launcher's NCCL_COMM_ID) whose root never comes: rank 1 of 2 waits
 * NCCLSHIM_BOOTSTRAP_TIMEOUT seconds for it, then fails. */
static void
api_test_dead_root(void)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;
    double start = mp_now();
    ncclResult_t res;

    MP_CHECK(ncclGetUniqueId(&id));
    res = ncclCommInitRank(&comm, 2, id, 1);
    MP_EXPECT(res != ncclSuccess && res != ncclInProgress, "ncclCommInitRank with no root "
              "gave %s", ncclGetErrorString(res));
    MP_EXPECT(mp_last_error(NULL)[0] != '\0', "a missing root failed without a message");
    if (mp_rank_id == 0) {
        printf("api: a rendezvous without its root gave %s after %.2f s: \"%s\"\n",
               ncclGetErrorString(res), mp_now() - start, mp_last_error(NULL));
    }
    if (res == ncclSuccess) {
        ncclCommAbort(comm);
    }
}

int
main(int argc, char **argv)
{
    struct mp_world world;
    const char *dead_root_seconds = NULL;
    int opt, total;

    while ((opt = getopt(argc, argv, "d:")) != -1) {
        if (opt != 'd') {
            fprintf(stderr, "usage: %s [-d SECONDS]\n", argv[0]);
            return 2;
        }
        dead_root_seconds = optarg;
    }
    /* Before the first library call: the library reads its environment once. */
    if (dead_root_seconds != NULL) {
        setenv("NCCLSHIM_BOOTSTRAP_TIMEOUT", dead_root_seconds, 1);
    }

    mp_world_env(&world);
    api_step("version, error strings, bad arguments without a communicator");
    api_test_version();
    api_test_error_strings();
    api_test_bad_init(&world);

    api_step("world communicator, bad calls on it");
    world.comm = mp_comm_create(&world);
    api_check_identity(world.comm, world.nranks, world.rank, "world");
    api_test_bad_calls(world.comm, &world);
    api_step("a collective not implemented yet");
    api_test_unimplemented(world.comm, &world);

    mp_barrier(world.comm, world.nranks);
    api_step("ncclCommInitRankConfig blocking, ncclCommFinalize, ncclCommDestroy");
    api_test_config_blocking(&world);
    mp_barrier(world.comm, world.nranks);
    api_step("ncclCommInitRankConfig non-blocking, ncclCommAbort");
    api_test_config_nonblocking(&world);
    mp_barrier(world.comm, world.nranks);
    api_step("ncclCommInitAll, grouped all-reduces, ncclCommDestroy of each");
    api_test_init_all();
    mp_barrier(world.comm, world.nranks);
    api_step("a garbage ncclUniqueId");
    api_test_garbage_id();
    if (dead_root_seconds != NULL) {
        mp_barrier(world.comm, world.nranks);
        api_step("a rendezvous whose root never comes");
        api_test_dead_root();
    }
    api_step("the world communicator at the end");
    api_check_works(world.comm, &world, "at the end");

    total = mp_failures;
    MP_CHECK_COMM(world.comm, ncclAllReduce(&total, &total, 1, ncclInt32, ncclSum, world.comm,
                                            NULL));
    MP_CHECK_COMM(world.comm, ncclCommFinalize(world.comm));
    MP_CHECK(ncclCommDestroy(world.comm));
    if (world.rank == 0) {
        printf("api: %d ranks, %d failed checks on all ranks\n", world.nranks, total);
    }
    return mp_failures == 0 && total == 0 ? 0 : 1;
}
