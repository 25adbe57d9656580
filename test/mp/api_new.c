/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The functions NCCL 2.29-2.32 added, through the real libnccl.so.2 on N ranks, host memory:
 *   - the per-collective variants (ncclAllReduceConfig ...): a NULL config and an initialized
 *     one give the plain call's results; a bad magic, minCTAs above maxCTAs, a forced
 *     algSelection (not supported yet) and a launchCompletionEvent inside a group are refused
 *     with a message; an unforced algSelection falls back to the automatic choice;
 *   - the parameter API over ncclshim's environment table: a variable set for this program
 *     reads back through every typed getter that holds it, and is refused by those that do
 *     not; keys with and without the NCCL_ prefix; unknown keys, short buffers and non-numbers
 *     are refused;
 *   - ncclSetEncryption: NONE accepted, a pre-shared key refused (nothing would be encrypted);
 *   - ncclCommSuspend / ncclCommResume / ncclCommMemStats: a collective while suspended is
 *     refused with a message, the statistics say so, resumed it works again;
 *   - ncclConfig_t of 2.32 (120 bytes) and of older, shorter sizes: a struct the size of
 *     2.14's, with garbage past its end, is read as 2.14's; values NCCL refuses are refused
 *     with a message; commName and the fields without effect are accepted;
 *   - ncclCommGetUniqueId / ncclCommGrow: all ranks but the last split off, rank 0 makes an
 *     id (a second one while the first is unused is refused) and hands it to the last rank,
 *     which joins: the grown communicator keeps the old ranks' numbers and is right; the used
 *     id is refused, and a new id may then be made;
 *   - windows on host memory and one-sided operations: a registration one rank refuses fails
 *     on every rank without a hang; every rank puts a block into every rank's window (itself
 *     too) and waits for each signal, twice; signals alone, counted in twos; a 1 MiB put
 *     around the ring; a 1 MiB put whose target sits in a host all-reduce meanwhile (its wait
 *     must serve the put); a signal before any window, bad peers, indices, windows, a put
 *     past the peer's part, and the device pointer queries of a host window, refused with a
 *     message; a clique of two communicators driven by one thread registers and deregisters a
 *     window on each inside a group.
 * Built against an older nccl.h (2.28), it has nothing to test and says so.
 */
#include "common.h"

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 32, 0)

#define AN_COUNT 1031

/* From nccl_device/host.h, which is C++ only. */
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer,
                                      void **outPtr);
ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **outPtr);

#define AN_EXPECT_REFUSED(comm, want, call)                                                   \
    an_expect_refused(__FILE__, __LINE__, #call, (call), (want), (comm))

/* call gave `want` (ncclInvalidArgument or ncclInvalidUsage) and left a message. */
static void
an_expect_refused(const char *file, int line, const char *expr, ncclResult_t res,
                  ncclResult_t want, ncclComm_t comm)
{
    const char *text = ncclGetLastError(comm);

    if (res != want) {
        mp_report(file, line, "%s gave %s (%d), expected %s", expr, ncclGetErrorString(res),
                  (int)res, ncclGetErrorString(want));
        mp_failures++;
    } else if (text == NULL || text[0] == '\0') {
        mp_report(file, line, "%s gave %s but ncclGetLastError is empty", expr,
                  ncclGetErrorString(res));
        mp_failures++;
    }
}

/* Rank r's input element i; the sum over n ranks is an_sum(i, n). */
static float
an_input(int rank, size_t i)
{
    return (float)((rank + 1) * (int)(i % 7));
}

static float
an_sum(size_t i, int n)
{
    return (float)(n * (n + 1) / 2 * (int)(i % 7));
}

static long
an_allreduce_wrong(const float *x, int n)
{
    long wrong = 0;
    for (size_t i = 0; i < AN_COUNT; i++) {
        wrong += x[i] != an_sum(i, n);
    }
    return wrong;
}

static void
an_test_coll_config(const struct mp_world *w)
{
    float *x = malloc(AN_COUNT * sizeof(float)), *y = malloc(AN_COUNT * sizeof(float));
    float *all = malloc((size_t)w->nranks * AN_COUNT * sizeof(float));
    ncclCollConfig_t config = NCCL_COLLCONFIG_INITIALIZER;

    MP_ASSERT(x != NULL && y != NULL && all != NULL, "out of memory");
    for (int round = 0; round < 2; round++) {
        const ncclCollConfig_t *c = round == 0 ? NULL : &config;
        for (size_t i = 0; i < AN_COUNT; i++) {
            x[i] = an_input(w->rank, i);
        }
        MP_CHECK_COMM(w->comm, ncclAllReduceConfig(x, y, AN_COUNT, ncclFloat32, ncclSum,
                                                   w->comm, NULL, c));
        MP_EXPECT(an_allreduce_wrong(y, w->nranks) == 0, "ncclAllReduceConfig (%s config): "
                  "wrong result", c == NULL ? "NULL" : "an initialized");
        MP_CHECK_COMM(w->comm, ncclAllGatherConfig(x, all, AN_COUNT, ncclFloat32, w->comm, NULL,
                                                   c));
        long wrong = 0;
        for (int r = 0; r < w->nranks; r++) {
            for (size_t i = 0; i < AN_COUNT; i++) {
                wrong += all[(size_t)r * AN_COUNT + i] != an_input(r, i);
            }
        }
        MP_EXPECT(wrong == 0, "ncclAllGatherConfig: %ld wrong elements", wrong);
        float root_value = (float)(w->rank == w->nranks - 1 ? 42 : -1);
        MP_CHECK_COMM(w->comm, ncclBroadcastConfig(&root_value, &root_value, 1, ncclFloat32,
                                                   w->nranks - 1, w->comm, NULL, c));
        MP_EXPECT(root_value == 42, "ncclBroadcastConfig gave %g", root_value);
    }
    /* A forced selection that cannot be honoured must not run as if it were. */
    config.algSelection = "ring";
    AN_EXPECT_REFUSED(w->comm, ncclInvalidUsage,
                      ncclAllReduceConfig(x, y, AN_COUNT, ncclFloat32, ncclSum, w->comm, NULL,
                                          &config));
    MP_EXPECT(strstr(ncclGetLastError(w->comm), "algSelection") != NULL,
              "no clear message: \"%s\"", ncclGetLastError(w->comm));
    config.forceAlgSelection = 0;
    MP_CHECK_COMM(w->comm, ncclAllReduceConfig(x, y, AN_COUNT, ncclFloat32, ncclSum, w->comm,
                                               NULL, &config));
    MP_EXPECT(an_allreduce_wrong(y, w->nranks) == 0, "unforced algSelection: wrong result");
    ncclCollConfig_t bad = NCCL_COLLCONFIG_INITIALIZER;
    bad.magic = 0x1234;
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument,
                      ncclAllReduceConfig(x, y, AN_COUNT, ncclFloat32, ncclSum, w->comm, NULL,
                                          &bad));
    ncclCollConfig_t ctas = NCCL_COLLCONFIG_INITIALIZER;
    ctas.minCTAs = 8;
    ctas.maxCTAs = 2;
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument,
                      ncclReduceConfig(x, y, AN_COUNT, ncclFloat32, ncclSum, 0, w->comm, NULL,
                                       &ctas));
    ncclCollConfig_t event = NCCL_COLLCONFIG_INITIALIZER;
    event.launchCompletionEvent = (cudaEvent_t)(uintptr_t)0x1; /* refused before it is used */
    MP_CHECK(ncclGroupStart());
    AN_EXPECT_REFUSED(w->comm, ncclInvalidUsage,
                      ncclAllReduceConfig(x, y, AN_COUNT, ncclFloat32, ncclSum, w->comm, NULL,
                                          &event));
    MP_EXPECT(ncclGroupEnd() != ncclSuccess, "a group with a refused call ended well");
    free(x);
    free(y);
    free(all);
}

static void
an_test_params(void)
{
    ncclParamHandle_t h = NULL, other = NULL;
    int8_t i8;
    int32_t i32;
    int64_t i64;
    uint8_t u8;
    uint64_t u64;
    const char *text = NULL;
    char buf[64];
    int len = 0;

    /* NCCLSHIM_TIMEOUT=300 is set by main, before the library read anything. */
    MP_CHECK(ncclParamBind(&h, "NCCLSHIM_TIMEOUT"));
    MP_CHECK(ncclParamGetI32(h, &i32));
    MP_EXPECT(i32 == 300, "ncclParamGetI32 gave %d, the environment says 300", (int)i32);
    MP_CHECK(ncclParamGetI64(h, &i64));
    MP_CHECK(ncclParamGetU64(h, &u64));
    MP_EXPECT(i64 == 300 && u64 == 300, "64-bit getters gave %lld and %llu", (long long)i64,
              (unsigned long long)u64);
    AN_EXPECT_REFUSED(NULL, ncclInvalidArgument, ncclParamGetI8(h, &i8));
    AN_EXPECT_REFUSED(NULL, ncclInvalidArgument, ncclParamGetU8(h, &u8));
    MP_CHECK(ncclParamGetStr(h, &text));
    MP_EXPECT(text != NULL && strcmp(text, "300") == 0, "ncclParamGetStr gave \"%s\"", text);
    MP_CHECK(ncclParamGet(h, buf, (int)sizeof(buf), &len));
    MP_EXPECT(len == 4 && strcmp(buf, "300") == 0, "ncclParamGet gave %d bytes, \"%s\"", len,
              buf);
    AN_EXPECT_REFUSED(NULL, ncclInvalidArgument, ncclParamGet(h, buf, 2, &len));
    /* NCCL's keys may leave out the NCCL_ prefix. */
    MP_CHECK(ncclParamBind(&other, "DEBUG_SUBSYS"));
    MP_CHECK(ncclParamGetStr(other, &text));
    MP_EXPECT(text != NULL && text[0] != '\0', "NCCL_DEBUG_SUBSYS has no default");
    AN_EXPECT_REFUSED(NULL, ncclInvalidArgument, ncclParamGetI32(other, &i32));
    AN_EXPECT_REFUSED(NULL, ncclInvalidArgument, ncclParamBind(&other, "NO_SUCH_PARAMETER"));
    AN_EXPECT_REFUSED(NULL, ncclInvalidArgument, ncclParamGetI32(NULL, &i32));
    int valueLen = -1;
    MP_CHECK(ncclParamGetParameter("NCCLSHIM_TIMEOUT", &text, &valueLen));
    MP_EXPECT(valueLen == 3 && strcmp(text, "300") == 0, "ncclParamGetParameter gave \"%s\"",
              text);
    const char **keys = NULL;
    int nkeys = 0;
    bool found = false;
    MP_CHECK(ncclParamGetAllParameterKeys(&keys, &nkeys));
    for (int i = 0; i < nkeys; i++) {
        found |= strcmp(keys[i], "NCCLSHIM_TIMEOUT") == 0;
    }
    MP_EXPECT(nkeys > 10 && found, "ncclParamGetAllParameterKeys: %d keys, ours %s", nkeys,
              found ? "among them" : "missing");
    ncclParamDumpAll();
}

static void
an_test_encryption(void)
{
    ncclEncryptionConfig_t config = NCCL_ENCRYPTION_CONFIG_INITIALIZER;

    MP_CHECK(ncclSetEncryption(&config));
    config.mode = NCCL_ENCRYPTION_MODE_PSK;
    config.psk = "a key nobody would use";
    AN_EXPECT_REFUSED(NULL, ncclInvalidUsage, ncclSetEncryption(&config));
    MP_EXPECT(strstr(ncclGetLastError(NULL), "encrypted") != NULL, "no clear message: \"%s\"",
              ncclGetLastError(NULL));
    AN_EXPECT_REFUSED(NULL, ncclInvalidArgument, ncclSetEncryption(NULL));
}

static void
an_test_suspend(const struct mp_world *w)
{
    float x[AN_COUNT];
    uint64_t value = 99;

    MP_CHECK_COMM(w->comm, ncclCommMemStats(w->comm, ncclStatGpuMemSuspended, &value));
    MP_EXPECT(value == 0, "ncclStatGpuMemSuspended is %llu before suspension",
              (unsigned long long)value);
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument, ncclCommSuspend(w->comm, 0x4));
    MP_CHECK_COMM(w->comm, ncclCommSuspend(w->comm, NCCL_SUSPEND_MEM));
    MP_CHECK_COMM(w->comm, ncclCommMemStats(w->comm, ncclStatGpuMemSuspended, &value));
    MP_EXPECT(value == 1, "ncclStatGpuMemSuspended is %llu while suspended",
              (unsigned long long)value);
    MP_CHECK_COMM(w->comm, ncclCommMemStats(w->comm, ncclStatGpuMemTotal, &value));
    MP_EXPECT(value == 0, "a host-memory communicator holds %llu bytes of GPU memory",
              (unsigned long long)value);
    for (size_t i = 0; i < AN_COUNT; i++) {
        x[i] = an_input(w->rank, i);
    }
    AN_EXPECT_REFUSED(w->comm, ncclInvalidUsage,
                      ncclAllReduce(x, x, AN_COUNT, ncclFloat32, ncclSum, w->comm, NULL));
    MP_EXPECT(strstr(ncclGetLastError(w->comm), "suspended") != NULL, "no clear message: \"%s\"",
              ncclGetLastError(w->comm));
    MP_CHECK_COMM(w->comm, ncclCommResume(w->comm));
    AN_EXPECT_REFUSED(w->comm, ncclInvalidUsage, ncclCommResume(w->comm));
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, AN_COUNT, ncclFloat32, ncclSum, w->comm, NULL));
    MP_EXPECT(an_allreduce_wrong(x, w->nranks) == 0, "wrong all-reduce after ncclCommResume");
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument,
                      ncclCommMemStats(w->comm, (ncclCommMemStat_t)17, &value));
}

/* Every rank puts its block into every rank's window (itself too), twice, then signals its
 * right neighbour alone; a large put goes round the ring (past UCX's eager size). */
#define AN_BLOCK 257
#define AN_LARGE ((size_t)1 << 20)

static void
an_test_windows(const struct mp_world *w)
{
    const int n = w->nranks, right = (w->rank + 1) % n, left = (w->rank + n - 1) % n;
    float *part = calloc((size_t)n * AN_BLOCK, sizeof(float));
    float mine[AN_BLOCK];
    char *large = malloc(AN_LARGE), *landing = calloc(1, AN_LARGE);
    ncclWindow_t win = NULL, big = NULL;
    ncclWaitSignalDesc_t *descs = calloc((size_t)n, sizeof(*descs));
    void *ptr = NULL;

    MP_ASSERT(part != NULL && large != NULL && landing != NULL && descs != NULL, "out of memory");
    /* Signals travel once the first window traded the signal words. */
    AN_EXPECT_REFUSED(w->comm, ncclInvalidUsage, ncclSignal(right, 0, 0, 0, w->comm, NULL));
    /* A wait for no signal waits for nothing, windows or not. */
    MP_CHECK_COMM(w->comm, ncclWaitSignal(0, NULL, w->comm, NULL));
    /* Registration is collective: one rank's bad part fails it on every rank, none hangs. */
    AN_EXPECT_REFUSED(w->comm, w->rank == 0 ? ncclInvalidArgument : ncclInvalidUsage,
                      ncclCommWindowRegister(w->comm, w->rank == 0 ? NULL : part, 64, &win,
                                             NCCL_WIN_DEFAULT));
    MP_CHECK_COMM(w->comm, ncclCommWindowRegister(w->comm, part, (size_t)n * AN_BLOCK *
                                                  sizeof(float), &win, NCCL_WIN_DEFAULT));
    MP_CHECK_COMM(w->comm, ncclCommWindowRegister(w->comm, landing, AN_LARGE, &big,
                                                  NCCL_WIN_DEFAULT));
    MP_CHECK_COMM(w->comm, ncclWinGetUserPtr(w->comm, win, &ptr));
    MP_EXPECT(ptr == part, "ncclWinGetUserPtr gave %p, registered %p", ptr, (void *)part);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < AN_BLOCK; i++) {
            mine[i] = (float)(round * 100000 + w->rank * 1000 + i);
        }
        for (int p = 0; p < n; p++) {
            MP_CHECK_COMM(w->comm, ncclPutSignal(mine, AN_BLOCK, ncclFloat32, p, win,
                                                 (size_t)w->rank * AN_BLOCK * sizeof(float), 0,
                                                 0, 0, w->comm, NULL));
        }
        memset(mine, 0, sizeof(mine)); /* the puts' data left with the calls */
        for (int p = 0; p < n; p++) {
            descs[p] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = p, .sigIdx = 0, .ctx = 0};
        }
        MP_CHECK_COMM(w->comm, ncclWaitSignal(n, descs, w->comm, NULL));
        long wrong = 0;
        for (int p = 0; p < n; p++) {
            for (int i = 0; i < AN_BLOCK; i++) {
                wrong += part[p * AN_BLOCK + i] != (float)(round * 100000 + p * 1000 + i);
            }
        }
        MP_EXPECT(wrong == 0, "round %d: %ld wrong elements in the window after the waits",
                  round, wrong);
        /* Puts are one-sided: the next round's would land while a peer still checks this. */
        mp_barrier(w->comm, n);
    }
    /* A signal alone, on another index and context, and two at once. */
    MP_CHECK_COMM(w->comm, ncclSignal(right, 5, 3, 0, w->comm, NULL));
    MP_CHECK_COMM(w->comm, ncclSignal(right, 5, 3, 0, w->comm, NULL));
    ncclWaitSignalDesc_t two = {.opCnt = 2, .peer = left, .sigIdx = 5, .ctx = 3};
    MP_CHECK_COMM(w->comm, ncclWaitSignal(1, &two, w->comm, NULL));
    for (size_t i = 0; i < AN_LARGE; i++) {
        large[i] = (char)(w->rank * 7 + (int)(i % 251));
    }
    MP_CHECK_COMM(w->comm, ncclPutSignal(large, AN_LARGE, ncclUint8, right, big, 0, 1, 0, 0,
                                         w->comm, NULL));
    ncclWaitSignalDesc_t one = {.opCnt = 1, .peer = left, .sigIdx = 1, .ctx = 0};
    MP_CHECK_COMM(w->comm, ncclWaitSignal(1, &one, w->comm, NULL));
    long wrong = 0;
    for (size_t i = 0; i < AN_LARGE; i++) {
        wrong += landing[i] != (char)(left * 7 + (int)(i % 251));
    }
    MP_EXPECT(wrong == 0, "the large put from the left: %ld wrong bytes", wrong);
    /* Nobody waits on a put with no call to progress it: rank 0 puts 1 MiB to rank 1 and
     * goes into a barrier, rank 1 into the barrier first (on one host a shared-memory
     * all-reduce, which must serve the put while it waits), then waits for the signal. */
    if (n > 1) {
        mp_barrier(w->comm, n);
        if (w->rank == 0) {
            MP_CHECK_COMM(w->comm, ncclPutSignal(large, AN_LARGE, ncclUint8, 1, big, 0, 2, 0, 0,
                                                 w->comm, NULL));
        }
        mp_barrier(w->comm, n);
        if (w->rank == 1) {
            ncclWaitSignalDesc_t from0 = {.opCnt = 1, .peer = 0, .sigIdx = 2, .ctx = 0};
            MP_CHECK_COMM(w->comm, ncclWaitSignal(1, &from0, w->comm, NULL));
            wrong = 0;
            for (size_t i = 0; i < AN_LARGE; i++) {
                wrong += landing[i] != (char)(0 * 7 + (int)(i % 251));
            }
            MP_EXPECT(wrong == 0, "the large put from rank 0: %ld wrong bytes", wrong);
        }
        mp_barrier(w->comm, n);
    }
    /* Refusals, each with a message. */
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument,
                      ncclSignal(n, 0, 0, 0, w->comm, NULL));
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument,
                      ncclSignal(right, 1 << 20, 0, 0, w->comm, NULL));
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument,
                      ncclPutSignal(mine, 1, ncclFloat32, right, NULL, 0, 0, 0, 0, w->comm,
                                    NULL));
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument,
                      ncclPutSignal(mine, 2, ncclFloat32, right, win,
                                    ((size_t)n * AN_BLOCK - 1) * sizeof(float), 0, 0, 0,
                                    w->comm, NULL));
    AN_EXPECT_REFUSED(w->comm, ncclInvalidUsage, ncclGetPeerDevicePointer(win, 0, right, &ptr));
    AN_EXPECT_REFUSED(w->comm, ncclInvalidUsage,
                      ncclGetLsaMultimemDevicePointer(win, 0, &ptr));
    ncclWaitSignalDesc_t never = {.opCnt = 1, .peer = w->rank, .sigIdx = 9, .ctx = 0};
    AN_EXPECT_REFUSED(w->comm, ncclInvalidUsage, ncclWaitSignal(1, &never, w->comm, NULL));
    mp_barrier(w->comm, n); /* every wait done before the windows go */
    MP_CHECK_COMM(w->comm, ncclCommWindowDeregister(w->comm, big));
    MP_CHECK_COMM(w->comm, ncclCommWindowDeregister(w->comm, win));
    free(descs);
    free(landing);
    free(large);
    free(part);
}

/* A communicator split off the world with config (every rank the same color): it works. */
static void
an_split_works(const struct mp_world *w, ncclConfig_t *config, const char *what)
{
    ncclComm_t child = NULL;

    MP_CHECK_COMM(w->comm, ncclCommSplit(w->comm, 0, w->rank, &child, config));
    long wrong = mp_allreduce_check(child, w->rank, w->nranks, ncclInt32, 513, true, 31);
    MP_EXPECT(wrong == 0, "%s: the all-reduce check failed (%ld)", what, wrong);
    MP_CHECK(ncclCommDestroy(child));
}

static void
an_test_config(const struct mp_world *w)
{
    ncclComm_t child = NULL;

    /* A program built against NCCL 2.14's nccl.h: its struct ends after blocking. */
    ncclConfig_t old = NCCL_CONFIG_INITIALIZER;
    old.size = offsetof(ncclConfig_t, blocking) + sizeof(int);
    old.version = NCCL_VERSION(2, 14, 3);
    old.cgaClusterSize = 12345;                 /* past its end: never read */
    old.commName = (const char *)(uintptr_t)1;  /* would crash if read */
    old.hostCftMode = 77;
    an_split_works(w, &old, "a 2.14-sized config");

    ncclConfig_t named = NCCL_CONFIG_INITIALIZER;
    named.commName = "api_new's child";
    named.minCTAs = 2;
    named.maxCTAs = 16;
    named.netName = "Socket";
    named.launchOrderImplicit = 1;
    an_split_works(w, &named, "a 2.32 config with commName and tuning fields");

    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.cgaClusterSize = 99;
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument,
                      ncclCommSplit(w->comm, 0, w->rank, &child, &bad));
    MP_EXPECT(strstr(ncclGetLastError(w->comm), "cgaClusterSize") != NULL,
              "no clear message: \"%s\"", ncclGetLastError(w->comm));
    ncclConfig_t cft = NCCL_CONFIG_INITIALIZER;
    cft.hostCftMode = 77;
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument,
                      ncclCommSplit(w->comm, 0, w->rank, &child, &cft));
    ncclConfig_t ctas = NCCL_CONFIG_INITIALIZER;
    ctas.minCTAs = 8;
    ctas.maxCTAs = 2;
    AN_EXPECT_REFUSED(w->comm, ncclInvalidArgument,
                      ncclCommSplit(w->comm, 0, w->rank, &child, &ctas));
}

static void
an_test_grow(const struct mp_world *w)
{
    const int n = w->nranks, newcomer = n - 1;
    ncclComm_t old = NULL, grown = NULL;
    ncclUniqueId id, again;
    int count = 0, rank = -1;

    MP_CHECK_COMM(w->comm, ncclCommSplit(w->comm, w->rank < newcomer ? 0 : NCCL_SPLIT_NOCOLOR,
                                         w->rank, &old, NULL));
    memset(&id, 0, sizeof(id));
    if (w->rank == 0) {
        MP_CHECK_COMM(old, ncclCommGetUniqueId(old, &id));
        AN_EXPECT_REFUSED(old, ncclInvalidUsage, ncclCommGetUniqueId(old, &again));
    }
    MP_CHECK_COMM(w->comm, ncclBroadcast(&id, &id, sizeof(id), ncclUint8, 0, w->comm, NULL));
    if (w->rank == newcomer) {
        MP_EXPECT(old == NULL, "the newcomer is in the old communicator");
        MP_CHECK(ncclCommGrow(NULL, n, &id, newcomer, &grown, NULL));
    } else {
        AN_EXPECT_REFUSED(old, ncclInvalidArgument, ncclCommGrow(old, n, NULL, 0, &grown, NULL));
        MP_CHECK_COMM(old, ncclCommGrow(old, n, w->rank == 0 ? &id : NULL, -1, &grown, NULL));
    }
    MP_CHECK_COMM(grown, ncclCommCount(grown, &count));
    MP_CHECK_COMM(grown, ncclCommUserRank(grown, &rank));
    MP_EXPECT(count == n && rank == w->rank, "grown communicator: rank %d of %d", rank, count);
    long wrong = mp_allreduce_check(grown, w->rank, n, ncclFloat32, 4099, false, 23);
    MP_EXPECT(wrong == 0, "all-reduce on the grown communicator: %ld wrong", wrong);
    if (w->rank == 0) {
        AN_EXPECT_REFUSED(old, ncclInvalidUsage, ncclCommGrow(old, n, &id, -1, &grown, NULL));
        MP_CHECK_COMM(old, ncclCommGetUniqueId(old, &again)); /* the last one was used */
    }
    MP_CHECK(ncclCommDestroy(grown));
    if (old != NULL) {
        MP_CHECK(ncclCommDestroy(old));
    }
}

/* One thread drives a clique of two communicators (ncclCommInitAll) and registers and
 * deregisters a window on each inside a group: each registration is collective, so the first
 * must not wait for the second's rank inline (it would, for good). */
static void
an_test_window_group(void)
{
    ncclComm_t comms[2] = {NULL, NULL};
    float a[64], b[64];
    ncclWindow_t wa = NULL, wb = NULL;

    MP_CHECK(ncclCommInitAll(comms, 2, NULL));
    MP_CHECK(ncclGroupStart());
    MP_CHECK_COMM(comms[0], ncclCommWindowRegister(comms[0], a, sizeof(a), &wa,
                                                   NCCL_WIN_DEFAULT));
    MP_CHECK_COMM(comms[1], ncclCommWindowRegister(comms[1], b, sizeof(b), &wb,
                                                   NCCL_WIN_DEFAULT));
    MP_CHECK(ncclGroupEnd());
    MP_EXPECT(wa != NULL && wb != NULL, "windows registered in a group: %p, %p", (void *)wa,
              (void *)wb);
    void *ptr = NULL;
    MP_CHECK_COMM(comms[1], ncclWinGetUserPtr(comms[1], wb, &ptr));
    MP_EXPECT(ptr == b, "the grouped window's user pointer is %p, registered %p", ptr,
              (void *)b);
    MP_CHECK(ncclGroupStart());
    MP_CHECK_COMM(comms[0], ncclCommWindowDeregister(comms[0], wa));
    MP_CHECK_COMM(comms[1], ncclCommWindowDeregister(comms[1], wb));
    MP_CHECK(ncclGroupEnd());
    MP_CHECK(ncclCommDestroy(comms[0]));
    MP_CHECK(ncclCommDestroy(comms[1]));
}

int
main(void)
{
    struct mp_world world;
    int total;

    setenv("NCCLSHIM_TIMEOUT", "300", 1); /* read back through the parameter API */
    mp_world_init(&world);
    an_test_coll_config(&world);
    an_test_config(&world);
    an_test_params();
    an_test_encryption();
    an_test_suspend(&world);
    an_test_windows(&world);
    if (world.nranks > 1) {
        an_test_grow(&world);
    } else {
        an_test_window_group();
    }
    long wrong = mp_allreduce_check(world.comm, world.rank, world.nranks, ncclFloat32, 1000,
                                    false, 21);
    MP_EXPECT(wrong == 0, "the communicator no longer works at the end (%ld)", wrong);

    total = mp_failures;
    MP_CHECK_COMM(world.comm, ncclAllReduce(&total, &total, 1, ncclInt32, ncclSum, world.comm,
                                            NULL));
    MP_CHECK(ncclCommDestroy(world.comm));
    if (world.rank == 0) {
        printf("api_new: %d ranks, %d failed checks on all ranks\n", world.nranks, total);
    }
    return mp_failures == 0 && total == 0 ? 0 : 1;
}

#else

int
main(void)
{
    printf("api_new: built against NCCL %d's nccl.h, which has none of these functions\n",
           NCCL_VERSION_CODE);
    return 0;
}

#endif
