/* SPDX-License-Identifier: Apache-2.0 */
/*
 * streams: device calls keep NCCL's stream semantics. Parts (-p), each at the rank counts
 * test/mp/run.sh gives it, on whatever CUDA driver the process finds (its test double in CI):
 *   returns   a call returns at once though a peer comes 1 s late (but where it may wait
 *             for the others: mp_device_call_may_wait); its stream waits (busy) until then,
 *             and the result is right;
 *   order     calls on two streams and the NULL stream, with no synchronisation between them,
 *             run in issue order (each all-reduce in place feeds the next);
 *   group     a group with an all-reduce on one stream and an all-gather on another: after
 *             ncclGroupEnd, the second stream sees the first's result (NCCL's join);
 *   grouporder  ranks group the same operations differently (a receive and an all-reduce in
 *             one group on rank 0, the all-reduce and then the send on rank 1);
 *   ppsend    pipeline parallelism's pattern: an all-reduce on every rank, then a send from
 *             rank 1 to rank 2 that the others take no part in, each rank synchronising its
 *             stream and checking, many times, with short sleeps of varying length between
 *             steps; with a GPU per rank, a GPU's leader takes the send with no work of its
 *             own while its stream's signal kernel of the all-reduce may still be writing the
 *             ranks' done words (a done word the host wrote newer that the kernel's older
 *             store moved back would leave a stream waiting for good);
 *   devices   one process, ncclCommInitAll on devices 0 and 1, one thread: a group with a
 *             call on each communicator's stream and a send/receive between them, the device
 *             never set between calls (FAKE_CUDA_DEVICES=2 with the double); then both ranks
 *             capture an all-reduce, each on its own stream, and both graphs launch; with
 *             -k expandable, on cuMem memory
 *             that only its own device may touch (PyTorch's expandable segments);
 *   unsupported  a GPU or driver the kernels cannot run on (FAKE_CUDA_CC=70 or
 *             FAKE_CUDA_DRIVER_VERSION=12040 with the double): ncclInvalidUsage at the first
 *             device call, naming driver, GPU and what the library holds; host memory works;
 *   hostonly  a communicator made with no current device serves host memory without a CUDA
 *             context, registration, stream or module (counted by the double); its first
 *             device call then works, and so does one from a thread with no current context;
 *   clique    one process, -n ranks on device 0 made in one group, one thread (run with
 *             NCCLSHIM_RANK_LEADERS=1: each rank's share waits for the others' arrive, which
 *             the same context enqueues): groups of all-reduces and a ring of sends on -k
 *             buffers of growing sizes are right, and a group of every rank's all-reduce
 *             captured into one graph runs twice (review B6: every arrival of a group is
 *             enqueued before any share that waits for it, and nothing in between
 *             synchronizes the context);
 *   nodevice  one process, one device, ncclCommInitAll on devices 0 and 1: host memory
 *             works on both, a device buffer on the missing device's communicator is a
 *             clear error (ncclshim keeps such communicators for host memory);
 *   refuse    a device send buffer with a host receive buffer; a stream being captured into a
 *             CUDA graph without a device team (NCCL_SHM_DISABLE=1); ncclMemFree of a pointer
 *             it did not give out:
 *             each a clear error, after which the communicator still works;
 *   memapi    an ncclMemAlloc'd buffer registered (ncclCommRegister) in three all-reduces;
 *             deregistered, the leader unmaps it (counted by the double), a second
 *             deregistration is refused, and the buffer still works unregistered;
 *   register  cudaMalloc memory (legacy IPC), whose owner may free it at any time unless it
 *             registered it: unregistered, the leader maps nothing of it (a staging copy on
 *             the owner's device instead), and freeing it after the call is no fault (the
 *             double complains where another process still maps memory freed); registered,
 *             the leader maps it (counted by the double), and ncclCommDeregister returns
 *             only once the leader closed that mapping, so the buffer is freed at once
 *             (-g: after every rank captured an all-reduce into a CUDA graph and launched it,
 *             so that its later calls, too, are posted from its stream);
 *   suspend   ncclCommSuspend(NCCL_SUSPEND_MEM) after device all-reduces on cudaMalloc memory:
 *             the staging memory on the device (ncclCommMemStats, which counts it as
 *             suspendable, beside a rank alone on its GPU's work areas, persistent) is freed
 *             and the leader lets its mappings go (counted by the double); a collective
 *             while suspended is refused; resumed, all-reduces are right again (-X: the
 *             network path's pinned staging is unregistered, counted by the double);
 *   grow      all ranks but the last split off and grow back to all through ncclCommGrow;
 *             all-reduces on device buffers of the grown communicator are right;
 *   window    windows on ncclMemAlloc memory: a part in cudaMalloc memory refused on every
 *             rank; every rank puts a block into every rank's part on its stream and waits
 *             for all the signals there (rank 0 late): the parts are right; a peer's part
 *             read through ncclGetPeerDevicePointer; two signals alone, awaited on a stream;
 *             a host window beside the device one refused; the registration, puts and waits
 *             made while this thread captures another stream in global mode leave the
 *             capture valid (-X, ranks that do not share a host: through the proxies;
 *             cudaMalloc parts serve, device pointers are refused);
 *   windowgroup  device windows on ncclMemAlloc memory registered inside a group by one thread
 *             that drives two communicators (on one rank, a clique of one communicator per
 *             device, ncclCommInitAll; on several, the world and a split of it): every rank of
 *             each puts a block into every rank's part with a signal and waits for all, the
 *             parts are right; deregistered inside a group, the peers' parts are unmapped
 *             (counted by the double);
 *   churn     40 rounds of fresh buffers (cudaMalloc and ncclMemAlloc in turn, each freed
 *             after its all-reduce, so addresses come back as new allocations): every result
 *             is right, and the leader (rank 0) lets its mappings of freed memory go (counted
 *             by the double);
 *   graph     an all-reduce (PreMulSum by 2, in place), a broadcast and a send/receive around
 *             the ring captured into a CUDA graph run only when it is launched, as often as it
 *             is (5 launches, with an uncaptured all-reduce after each), and later calls
 *             still run;
 *   graphfree unregistered cudaMalloc memory captured into a graph may be freed once the
 *             graph went and a call was made after (no leader maps it any more);
 *   twographs two communicators of the same ranks, each captured on its own stream, the
 *             graphs launched in opposite orders by even and odd ranks, three times: both
 *             finish (no host function waits for GPU work) and are right;
 *   globalcapture  while a stream is captured in global mode (PyTorch's default), an
 *             all-reduce on fresh buffers on another stream of the capturing thread: right,
 *             and the capture is not invalidated by what the library and its threads do;
 *             ncclMemAlloc, ncclCommRegister, an all-reduce into that buffer (kept by a
 *             copy), ncclCommDeregister and ncclMemFree meanwhile: they succeed, the result
 *             is right and the capture stays valid;
 *   capturelife  while this thread captures a blocking stream in global mode (PyTorch's
 *             default), the lifecycle: a non-blocking init (the library's init thread), a
 *             split, an all-reduce on the child with rank 0 late (the
 *             device team's thread looks at its device meanwhile, and may not touch the legacy
 *             stream, which the capture makes unusable), a communicator of one rank drained by
 *             a host call after a device one, destroys, and an abort from another thread (a
 *             watchdog's): each succeeds, results are right, and the capture stays valid;
 *   torchp2p  PyTorch's point-to-point, which hung on the H200 with a leader per rank: 64
 *             streams in the process (PyTorch's pools), an all-reduce on the legacy stream,
 *             then all-reduces and blocking sends and receives, ungrouped, on one pool stream
 *             joined to the legacy stream by events (PyTorch's eager mode): rank 0 to the last
 *             rank and back on fresh buffers each round, the receiver copying its data to the
 *             host before it sends back;
 *   abort     rank 0 posts an all-reduce the others never join (a poster whose call may
 *             wait for them, mp_device_call_may_wait, gets its call back once they aborted,
 *             its stream still blocked); ncclCommAbort returns at once and releases its
 *             stream, and later work on it runs (-r: the poster rank;
 *             -g: every rank captures the all-reduce into a CUDA graph, the poster launches
 *             it, and the abort ends its host function's wait);
 *   abortblocked  rank 0's all-reduce, which the others never join, waits in its call (the
 *             device team leader's process, or the network path; -H: on host memory, which
 *             always runs inside the call): ncclCommAbort from another thread, as a
 *             watchdog's, makes it return and frees nothing under it (-R: ncclCommRevoke
 *             makes it return, then abort);
 *   onequeuegraph  every rank captures an all-reduce (run with CUDA_DEVICE_MAX_CONNECTIONS=1
 *             and without; -S N: on each of N streams in turn, made after the communicator):
 *             the process of a device team leader that shares its GPU (rank 0 of ranks on one
 *             device) is refused with a message naming NCCLSHIM_RANK_LEADERS rather than hang
 *             when the graph runs, whatever the queues (with 9 streams and the default 8
 *             queues, one shares the leader's stream's queue, where the graph would hang: see
 *             review B3); the others capture; with a GPU per rank, or every rank leading its
 *             own share (NCCLSHIM_RANK_LEADERS=1), every rank captures, and each graph,
 *             launched twice, sums twice;
 *   staging   all-reduces of growing sizes on -k buffers (staged for leaders of other
 *             processes) made first, called back to back with no wait between them: right,
 *             and (run with FAKE_CUDA_SYNC_STRICT=1) nothing synchronizes the context while a
 *             call's wait is queued, though staging areas grow and leaders map them meanwhile
 *             (review B6);
 *   overtake  an all-reduce on a stream held back by a word the test writes, then one captured
 *             on another stream and launched, then the first stream released (rank 0 last):
 *             both right, nothing hangs (review B7: the host function's arrive must not run
 *             ahead of the eager call's);
 *   fp8       an fp8 all-reduce is right from compute capability 9.0 on and refused with a
 *             message before (FAKE_CUDA_CC=80 with the double); an fp8 broadcast runs;
 *   fault     rank 0 (its GPU's leader) all-reduces from cuMem memory no device may touch, so
 *             its kernel faults and its context is unusable for good (a sticky error): every
 *             rank learns the failure from ncclCommGetAsyncError, none hangs; rank 0's next call
 *             is ncclUnhandledCudaError naming the driver's error; abort returns everywhere and
 *             releases the others' streams (FAKE_CUDA_EXPECT_FAULTS=1 with the double);
 *   leaderleft  every rank registers cudaMalloc memory and all-reduces on it; rank 0, the
 *             leader, destroys its communicator first; the others' ncclCommDeregister then
 *             returns at once, and their memory may be freed.
 */
#include <getopt.h>
#include <pthread.h>

#include "common.h"
#include "device.h"

#define ST_COUNT 4099 /* odd, past a few kernel vectors */

static struct mp_cuda st_cu;
/* -X: the ranks do not share a host (or act as if: NCCL_SHM_DISABLE=1). */
static bool st_across;
/* The memory kind of st_buffer's buffers (-k; device memory by default). */
static enum mp_mem_kind st_kind = MP_MEM_DEVICE;

/* A device buffer of count floats set to value + i * step. */
static float *
st_buffer(size_t count, float value, float step, CUstream stream)
{
    float *host = malloc(count * sizeof(float));
    MP_ASSERT(host != NULL, "out of memory");
    for (size_t i = 0; i < count; i++) {
        host[i] = value + (float)i * step;
    }
    float *dev = mp_cuda_alloc(&st_cu, st_kind, count * sizeof(float));
    mp_cuda_copy(&st_cu, dev, host, count * sizeof(float), stream);
    free(host);
    return dev;
}

/* Wrong elements of dev against value + i * step (the stream is synchronised first). */
static long
st_check(const float *dev, size_t count, float value, float step, CUstream stream,
         const char *what)
{
    float *host = malloc(count * sizeof(float));
    long wrong = 0;

    MP_ASSERT(host != NULL, "out of memory");
    mp_cuda_copy(&st_cu, host, dev, count * sizeof(float), stream);
    for (size_t i = 0; i < count; i++) {
        float want = value + (float)i * step;
        if (host[i] != want && wrong++ < 3) {
            mp_report(__FILE__, __LINE__, "%s: element %zu is %g, expected %g", what, i,
                      host[i], want);
        }
    }
    free(host);
    return wrong;
}

static CUstream
st_stream(void)
{
    CUstream s;
    MP_CU(&st_cu, stream_create(&s, CU_STREAM_NON_BLOCKING));
    return s;
}

static void
part_returns(const struct mp_world *w)
{
    CUstream s = st_stream();
    float *x = st_buffer(ST_COUNT, (float)w->rank, 1, s);
    const int late = w->nranks - 1;

    if (w->rank == late) {
        sleep(1);
    }
    double t0 = mp_now();
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    double call = mp_now() - t0;
    if (w->rank != late && !mp_device_call_may_wait(w->rank, w->nranks)) {
        MP_EXPECT(call < 0.5, "the call took %.2f s while rank %d was late", call, late);
        MP_EXPECT(st_cu.stream_query(s) == CUDA_ERROR_NOT_READY,
                  "the stream was done before rank %d called", late);
    }
    float sum = (float)(w->nranks * (w->nranks - 1) / 2);
    MP_EXPECT(st_check(x, ST_COUNT, sum, (float)w->nranks, s, "late all-reduce") == 0,
              "wrong all-reduce with a late rank");
}

static void
part_order(const struct mp_world *w)
{
    CUstream a = st_stream(), b = st_stream();
    float *x = st_buffer(ST_COUNT, 1, 0, a);
    const float n = (float)w->nranks;

    /* x = 1 everywhere; each in-place sum multiplies it by n, in issue order only. */
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, a));
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, b));
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, NULL));
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, a));
    MP_CU(&st_cu, stream_synchronize(b));
    MP_CU(&st_cu, stream_synchronize(NULL));
    MP_EXPECT(st_check(x, ST_COUNT, n * n * n * n, 0, a, "four all-reduces on three streams") ==
                  0,
              "calls on several streams ran out of issue order");
}

static void
part_group(const struct mp_world *w)
{
    CUstream a = st_stream(), b = st_stream();
    float *x = st_buffer(ST_COUNT, 1, 0, a);
    float *g = st_buffer(1, (float)w->rank, 0, a);
    float *all = st_buffer((size_t)w->nranks, -1, 0, a);

    MP_CHECK(ncclGroupStart());
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, a));
    MP_CHECK_COMM(w->comm, ncclAllGather(g, all, 1, ncclFloat, w->comm, b));
    MP_CHECK(ncclGroupEnd());
    /* Read on stream b only: the join makes it wait for the all-reduce on a too. */
    MP_EXPECT(st_check(x, ST_COUNT, (float)w->nranks, 0, b, "all-reduce, read on the other "
                                                              "stream") == 0,
              "ncclGroupEnd did not make every stream of the group wait for all of it");
    MP_EXPECT(st_check(all, (size_t)w->nranks, 0, 1, b, "all-gather in the group") == 0,
              "wrong all-gather in a group of two streams");
}

/* Ranks that group the same operations differently: rank 0 receives from rank 1 and
 * all-reduces in one group, while rank 1 all-reduces first and sends after (and the others
 * all-reduce alone). Each rank's operations run in its stream's order, and rank 1 sends only
 * once the all-reduce is done, so rank 0's GPU must run its group's all-reduce first, whatever
 * its order in the group. Five times, each checked. */
static void
part_grouporder(const struct mp_world *w)
{
    CUstream s = st_stream();
    float *x = st_buffer(ST_COUNT, 1, 0, s);
    float *msg = st_buffer(ST_COUNT, 7, 0, s);

    for (int i = 0; i < 5; i++) {
        float want = 1;
        for (int k = 0; k <= i; k++) {
            want *= (float)w->nranks;
        }
        if (w->rank == 0) {
            MP_CHECK(ncclGroupStart());
            MP_CHECK_COMM(w->comm, ncclRecv(msg, ST_COUNT, ncclFloat, 1, w->comm, s));
            MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
            MP_CHECK(ncclGroupEnd());
            MP_EXPECT(st_check(msg, ST_COUNT, 7 + (float)i, 0, s, "received in a group") == 0,
                      "the message received in a group with an all-reduce is wrong");
        } else if (w->rank == 1) {
            MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
            float *sent = st_buffer(ST_COUNT, 7 + (float)i, 0, s);
            MP_CHECK_COMM(w->comm, ncclSend(sent, ST_COUNT, ncclFloat, 0, w->comm, s));
        } else {
            MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
        }
        MP_EXPECT(st_check(x, ST_COUNT, want, 0, s, "all-reduce grouped differently") == 0,
                  "an all-reduce the ranks grouped differently is wrong");
    }
}

/* Pipeline parallelism's step, ST_PP_ROUNDS times: every rank all-reduces, then rank 1 sends
 * the result's successor to rank 2 alone. The sleeps, of lengths that vary by round and rank,
 * move each leader's view of the send against its stream's signal kernel of the all-reduce. */
#define ST_PP_ROUNDS 300
#define ST_PP_COUNT 1031

static void
part_ppsend(const struct mp_world *w)
{
    CUstream s = st_stream();
    float *x = st_buffer(ST_PP_COUNT, 1, 0, s);
    float *msg = st_buffer(ST_PP_COUNT, -1, 0, s);
    float *host = malloc(ST_PP_COUNT * sizeof(float));
    const float n = (float)w->nranks;

    MP_ASSERT(w->nranks >= 3, "ppsend needs 3 ranks or more, not %d", w->nranks);
    MP_ASSERT(host != NULL, "out of memory");
    for (int i = 0; i < ST_PP_ROUNDS && mp_failures == 0; i++) {
        /* x = 1 + i on every rank, which the all-reduce makes n (1 + i); rank 1's message,
         * i + e, is ready before. */
        for (size_t e = 0; e < ST_PP_COUNT; e++) {
            host[e] = (float)(1 + i);
        }
        mp_cuda_copy(&st_cu, x, host, ST_PP_COUNT * sizeof(float), s);
        if (w->rank == 1) {
            for (size_t e = 0; e < ST_PP_COUNT; e++) {
                host[e] = (float)i + (float)e;
            }
            mp_cuda_copy(&st_cu, msg, host, ST_PP_COUNT * sizeof(float), s);
        }
        usleep((useconds_t)((i * 37 + w->rank * 53) % 150));
        MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_PP_COUNT, ncclFloat, ncclSum, w->comm, s));
        usleep((useconds_t)((i * 71 + w->rank * 29) % 120));
        if (w->rank == 1) {
            MP_CHECK_COMM(w->comm, ncclSend(msg, ST_PP_COUNT, ncclFloat, 2, w->comm, s));
        } else if (w->rank == 2) {
            MP_CHECK_COMM(w->comm, ncclRecv(msg, ST_PP_COUNT, ncclFloat, 1, w->comm, s));
        }
        MP_CU(&st_cu, stream_synchronize(s));
        MP_EXPECT(st_check(x, ST_PP_COUNT, n * (float)(1 + i), 0, s, "all-reduce") == 0,
                  "round %d: the all-reduce is wrong", i);
        if (w->rank == 2) {
            MP_EXPECT(st_check(msg, ST_PP_COUNT, (float)i, 1, s, "received") == 0,
                      "round %d: the message from rank 1 is wrong", i);
        }
    }
    free(host);
    mp_cuda_free(&st_cu, st_kind, x);
    mp_cuda_free(&st_cu, st_kind, msg);
}

static void
part_devices(void)
{
    const int devlist[2] = {0, 1};
    ncclComm_t comms[2];
    CUstream s[2];
    float *x[2], *peer_in[2];
    CUcontext ctx[2];
    CUdevice dev;

    for (int d = 0; d < 2; d++) {
        MP_CU(&st_cu, device_get(&dev, d));
        MP_CU(&st_cu, primary_ctx_retain(&ctx[d], dev));
        MP_CU(&st_cu, ctx_set_current(ctx[d]));
        s[d] = st_stream();
        x[d] = st_buffer(ST_COUNT, (float)(d + 1), 0, s[d]);
        peer_in[d] = st_buffer(ST_COUNT, -1, 0, s[d]);
    }
    MP_CU(&st_cu, ctx_set_current(ctx[0])); /* and never changed while the group runs */
    MP_CHECK(ncclCommInitAll(comms, 2, devlist));
    MP_CHECK(ncclGroupStart());
    for (int d = 0; d < 2; d++) {
        MP_CHECK_COMM(comms[d], ncclAllReduce(x[d], x[d], ST_COUNT, ncclFloat, ncclSum,
                                              comms[d], s[d]));
        MP_CHECK_COMM(comms[d], ncclSend(x[d], ST_COUNT, ncclFloat, 1 - d, comms[d], s[d]));
        MP_CHECK_COMM(comms[d], ncclRecv(peer_in[d], ST_COUNT, ncclFloat, 1 - d, comms[d],
                                         s[d]));
    }
    MP_CHECK(ncclGroupEnd());
    /* Both ranks of the process capture, each on its own stream, and both graphs launch:
     * their host functions only post, in whatever order the driver runs them. Where one
     * device's memory reaches the other device's leader only through staging (no peer
     * access, or cuMem memory without access), each GPU's leader needing every rank's
     * buffers, both captures are refused with a message instead. */
    const char *no_peer = getenv("FAKE_CUDA_NO_PEER");
    bool staged = st_kind == MP_MEM_EXPANDABLE || (no_peer != NULL && strcmp(no_peer, "1") == 0);
    CUgraph graphs[2] = {NULL, NULL};
    CUgraphExec execs[2] = {NULL, NULL};
    for (int d = 0; d < 2; d++) {
        MP_CU(&st_cu, stream_synchronize(s[d]));
        MP_CU(&st_cu, stream_begin_capture(s[d], CU_STREAM_CAPTURE_MODE_GLOBAL));
        ncclResult_t res = ncclAllReduce(x[d], x[d], ST_COUNT, ncclFloat, ncclSum, comms[d],
                                         s[d]);
        (void)st_cu.stream_end_capture(s[d], &graphs[d]);
        if (staged) {
            MP_EXPECT(res == ncclInvalidUsage && strstr(mp_last_error(comms[d]), "staging"),
                      "capturing a buffer only staging reaches gave %s: \"%s\"",
                      ncclGetErrorString(res), mp_last_error(comms[d]));
        } else {
            MP_EXPECT(res == ncclSuccess, "a captured all-reduce of rank %d gave %s", d,
                      ncclGetErrorString(res));
            MP_CU(&st_cu, graph_instantiate(&execs[d], graphs[d], 0));
        }
    }
    for (int d = 0; d < 2 && !staged; d++) {
        MP_CU(&st_cu, graph_launch(execs[d], s[d]));
    }
    for (int d = 0; d < 2; d++) {
        MP_CU(&st_cu, ctx_set_current(ctx[d]));
        MP_EXPECT(st_check(x[d], ST_COUNT, staged ? 3 : 6, 0, s[d],
                           "a two-device clique's graphs") == 0,
                  "wrong all-reduce on device %d", d);
        if (execs[d] != NULL) {
            MP_CU(&st_cu, graph_exec_destroy(execs[d]));
        }
        if (graphs[d] != NULL) {
            MP_CU(&st_cu, graph_destroy(graphs[d]));
        }
        MP_CHECK(ncclCommDestroy(comms[d]));
    }
}

/* One process, n ranks on one device, made by ncclCommInitRank in one group (ncclCommInitAll
 * refuses a device twice), each leading its own share of it under
 * NCCLSHIM_RANK_LEADERS=1: streams of one context whose waits other ranks' later work, in the
 * same context, releases), one thread: groups of all-reduces over every rank and sends around
 * the ring, on buffers of the -k kind that grow call after call, each group's results right;
 * then a group of every rank's all-reduce captured into one graph, launched twice. */
#define ST_CLIQUE_MAX 8

static void
part_clique(int n)
{
    ncclUniqueId id;
    ncclComm_t comms[ST_CLIQUE_MAX];
    CUstream s[ST_CLIQUE_MAX];
    float *x[ST_CLIQUE_MAX], *y[ST_CLIQUE_MAX], *in[ST_CLIQUE_MAX];

    MP_ASSERT(n >= 2 && n <= ST_CLIQUE_MAX, "-n: 2 to %d ranks", ST_CLIQUE_MAX);
    MP_CHECK(ncclGetUniqueId(&id));
    MP_CHECK(ncclGroupStart());
    for (int r = 0; r < n; r++) {
        MP_CHECK(ncclCommInitRank(&comms[r], n, id, r));
    }
    MP_CHECK(ncclGroupEnd());
    for (int r = 0; r < n; r++) {
        s[r] = st_stream();
    }
    for (size_t count = 1000; count <= 64000; count *= 4) {
        for (int r = 0; r < n; r++) {
            x[r] = st_buffer(count, (float)(r + 1), 0, s[r]);
            y[r] = st_buffer(count, (float)(r + 1), 0, s[r]);
            in[r] = st_buffer(count, -1, 0, s[r]);
        }
        MP_CHECK(ncclGroupStart());
        for (int r = 0; r < n; r++) {
            MP_CHECK_COMM(comms[r], ncclAllReduce(x[r], x[r], count, ncclFloat, ncclSum,
                                                  comms[r], s[r]));
            /* Not x: a group's operations may run in any order. */
            MP_CHECK_COMM(comms[r], ncclSend(y[r], count, ncclFloat, (r + 1) % n, comms[r],
                                             s[r]));
            MP_CHECK_COMM(comms[r], ncclRecv(in[r], count, ncclFloat, (r + n - 1) % n,
                                             comms[r], s[r]));
        }
        MP_CHECK(ncclGroupEnd());
        const float sum = (float)(n * (n + 1) / 2);
        for (int r = 0; r < n; r++) {
            MP_EXPECT(st_check(x[r], count, sum, 0, s[r], "a clique's all-reduce") == 0,
                      "rank %d's all-reduce of %zu floats in a clique of %d is wrong", r, count,
                      n);
            MP_EXPECT(st_check(in[r], count, (float)((r + n - 1) % n + 1), 0, s[r],
                               "a clique's ring of sends") == 0,
                      "rank %d received wrong data in a clique of %d", r, n);
        }
        for (int r = 0; r < n; r++) {
            mp_cuda_free(&st_cu, st_kind, x[r]);
            mp_cuda_free(&st_cu, st_kind, y[r]);
            mp_cuda_free(&st_cu, st_kind, in[r]);
        }
    }
    /* One graph holds the whole group (one stream: the double's graphs hold one stream's
     * work), launched twice: every rank's arrival first, then their shares, then their
     * waits, as the calls enqueued them. */
    for (int r = 0; r < n; r++) {
        x[r] = st_buffer(ST_COUNT, 1, 0, s[r]);
    }
    CUgraph graph;
    CUgraphExec exec;
    MP_CU(&st_cu, stream_begin_capture(s[0], CU_STREAM_CAPTURE_MODE_GLOBAL));
    MP_CHECK(ncclGroupStart());
    for (int r = 0; r < n; r++) {
        MP_CHECK_COMM(comms[r], ncclAllReduce(x[r], x[r], ST_COUNT, ncclFloat, ncclSum,
                                              comms[r], s[0]));
    }
    MP_CHECK(ncclGroupEnd());
    MP_CU(&st_cu, stream_end_capture(s[0], &graph));
    MP_CU(&st_cu, graph_instantiate(&exec, graph, 0));
    for (int k = 0; k < 2; k++) {
        MP_CU(&st_cu, graph_launch(exec, s[0]));
    }
    for (int r = 0; r < n; r++) {
        MP_EXPECT(st_check(x[r], ST_COUNT, (float)(n * n), 0, s[0], "a clique's graph") == 0,
                  "rank %d's all-reduce in a clique's graph, launched twice, is wrong", r);
    }
    MP_CU(&st_cu, graph_exec_destroy(exec));
    MP_CU(&st_cu, graph_destroy(graph));
    for (int r = 0; r < n; r++) {
        MP_CHECK(ncclCommDestroy(comms[r]));
        mp_cuda_free(&st_cu, st_kind, x[r]);
        MP_CU(&st_cu, stream_destroy(s[r]));
    }
}

/* One process, one device visible, ncclCommInitAll over devices 0 and 1: the communicators
 * serve host memory (ncclshim's, not NCCL's, which refuses them), and device memory on the
 * device that does not exist is a clear error at the call, never a crash. */
static void
part_nodevice(void)
{
    const int devlist[2] = {0, 1};
    ncclComm_t comms[2];
    float host[2][64];
    int count = 0;

    MP_CU(&st_cu, device_get_count(&count));
    MP_ASSERT(count == 1, "this part needs exactly one device (FAKE_CUDA_DEVICES=1), not %d",
              count);
    CUstream s = st_stream();
    float *x = st_buffer(64, 1, 0, s);
    MP_CHECK(ncclCommInitAll(comms, 2, devlist));
    MP_CHECK(ncclGroupStart());
    for (int d = 0; d < 2; d++) {
        for (int i = 0; i < 64; i++) {
            host[d][i] = (float)(d + 1);
        }
        MP_CHECK_COMM(comms[d], ncclAllReduce(host[d], host[d], 64, ncclFloat, ncclSum,
                                              comms[d], NULL));
    }
    MP_CHECK(ncclGroupEnd());
    MP_EXPECT(host[0][63] == 3 && host[1][0] == 3, "wrong host all-reduce: %g %g",
              host[0][63], host[1][0]);
    ncclResult_t res = ncclAllReduce(x, x, 64, ncclFloat, ncclSum, comms[1], s);
    MP_EXPECT(res == ncclInvalidArgument || res == ncclInvalidUsage,
              "a device buffer on the communicator of a missing device gave %s",
              ncclGetErrorString(res));
    MP_EXPECT(strstr(mp_last_error(comms[1]), "device 1") != NULL,
              "no clear message: \"%s\"", mp_last_error(comms[1]));
    /* The same in a group with the other communicator's call: nothing of it is left waiting. */
    MP_CHECK(ncclGroupStart());
    for (int d = 0; d < 2; d++) {
        ncclAllReduce(x, x, 64, ncclFloat, ncclSum, comms[d], s);
    }
    res = ncclGroupEnd();
    MP_EXPECT(res == ncclInvalidArgument || res == ncclInvalidUsage,
              "a group with the missing device's communicator gave %s",
              ncclGetErrorString(res));
    for (int d = 0; d < 2; d++) {
        MP_CHECK(ncclCommDestroy(comms[d]));
    }
    MP_EXPECT(st_check(x, 64, 1, 0, s, "a buffer no call was made on") == 0,
              "a refused call touched its buffer");
}

/* A host all-reduce of ones on comm, right (the communicator still serves host memory). */
static void
st_host_allreduce_works(ncclComm_t comm, int nranks, const char *what)
{
    float host[64];

    for (int i = 0; i < 64; i++) {
        host[i] = 1;
    }
    MP_CHECK_COMM(comm, ncclAllReduce(host, host, 64, ncclFloat, ncclSum, comm, NULL));
    MP_EXPECT(host[0] == (float)nranks, "%s: host all-reduce gave %g", what, host[0]);
}

/* A GPU or driver the kernels cannot run on (FAKE_CUDA_CC=70, FAKE_CUDA_DRIVER_VERSION=12040
 * with the double): the first device call fails at once with a message naming the driver,
 * the GPU and what the library holds; host memory still works. */
static void
part_unsupported(const struct mp_world *w)
{
    CUstream s = st_stream();
    float *dev = st_buffer(64, 1, 0, s);

    ncclResult_t res = ncclAllReduce(dev, dev, 64, ncclFloat, ncclSum, w->comm, s);
    MP_EXPECT(res == ncclInvalidUsage, "a device call the kernels cannot serve gave %s",
              ncclGetErrorString(res));
    const char *text = mp_last_error(w->comm);
    MP_EXPECT(strstr(text, "cannot run on device 0 (compute capability") != NULL &&
                  strstr(text, "CUDA driver") != NULL && strstr(text, "sm_") != NULL,
              "no clear message: \"%s\"", text);
    st_host_allreduce_works(w->comm, w->nranks, "after the refusal");
}

/* A communicator made with no current device (a program of host memory, likely) makes no
 * CUDA context, registers nothing and creates no stream until its first device call, which
 * then works (on device 0, as the runtime's default). */
static void
part_hostonly(const struct mp_world *w)
{
    struct mp_fake_stats stats = {0};

    st_host_allreduce_works(w->comm, w->nranks, "without a device");
    if (st_cu.fake_stats != NULL) {
        st_cu.fake_stats(&stats);
        MP_EXPECT(stats.registrations == 0 && stats.streams == 0 && stats.modules == 0,
                  "a communicator serving host memory registered %d ranges, made %d streams "
                  "and loaded %d modules", stats.registrations, stats.streams, stats.modules);
    }
    /* No rank's device call before every rank looked: a leader's thread readies at the first
     * one posted. */
    mp_barrier(w->comm, w->nranks);
    MP_CU(&st_cu, ctx_set_current(st_cu.ctx));
    CUstream s = st_stream();
    float *dev = st_buffer(64, 1, 0, s);
    MP_CHECK_COMM(w->comm, ncclAllReduce(dev, dev, 64, ncclFloat, ncclSum, w->comm, s));
    MP_EXPECT(st_check(dev, 64, (float)w->nranks, 0, s, "the first device call") == 0,
              "the first device call of a communicator made without a device went wrong");
    /* A call from a thread with no current context, as NCCL allows (it sets the device
     * itself): whatever the library asks the driver happens in the device's context. Past the
     * 10 ms between looks at whether exported allocations still exist, so it looks. */
    usleep(20 * 1000);
    MP_CU(&st_cu, ctx_set_current(NULL));
    MP_CHECK_COMM(w->comm, ncclAllReduce(dev, dev, 64, ncclFloat, ncclSum, w->comm, s));
    MP_CU(&st_cu, ctx_set_current(st_cu.ctx));
    MP_EXPECT(st_check(dev, 64, (float)(w->nranks * w->nranks), 0, s, "no current context") ==
                  0, "a device call from a thread without a current context went wrong");
}

static void
part_refuse(const struct mp_world *w)
{
    CUstream s = st_stream();
    float *dev = st_buffer(64, 1, 0, s);
    float host[64];
    int not_ours;

    ncclResult_t res = ncclAllReduce(dev, host, 64, ncclFloat, ncclSum, w->comm, s);
    MP_EXPECT(res == ncclInvalidArgument, "device send with host receive gave %s",
              ncclGetErrorString(res));
    MP_EXPECT(strstr(mp_last_error(w->comm), "host memory") != NULL,
              "no clear message: \"%s\"", mp_last_error(w->comm));
    /* Device teams (ranks of one host) capture; the network path does not yet. */
    const char *no_shm = getenv("NCCL_SHM_DISABLE");
    if (no_shm != NULL && strcmp(no_shm, "1") == 0 && mp_cuda_capture(&st_cu, s, 1)) {
        res = ncclAllReduce(dev, dev, 64, ncclFloat, ncclSum, w->comm, s);
        mp_cuda_capture(&st_cu, s, 0);
        MP_EXPECT(res == ncclInvalidUsage, "a call on a capturing stream gave %s",
                  ncclGetErrorString(res));
        MP_EXPECT(strstr(mp_last_error(w->comm), "captured") != NULL,
                  "no clear message: \"%s\"", mp_last_error(w->comm));
    }
    res = ncclMemFree(&not_ours);
    MP_EXPECT(res == ncclInvalidArgument, "ncclMemFree of a stack address gave %s",
              ncclGetErrorString(res));
    /* Refusals left the communicator as it was. */
    MP_CHECK_COMM(w->comm, ncclAllReduce(dev, dev, 64, ncclFloat, ncclSum, w->comm, s));
    MP_EXPECT(st_check(dev, 64, (float)w->nranks, 0, s, "all-reduce after refusals") == 0,
              "the communicator no longer works after refused calls");
}

/* With the double, on rank 0 (the leader): waits up to 5 s for its mappings of other ranks'
 * memory to be at most `most`; false if they never are (true on a real driver, which does not
 * count them). */
static bool
st_leader_maps_at_most(const struct mp_world *w, int most, int *seen_out)
{
    struct mp_fake_stats stats = {0};
    double t0 = mp_now();

    if (w->rank != 0 || st_cu.fake_stats == NULL) {
        return true;
    }
    for (;;) {
        st_cu.fake_stats(&stats);
        *seen_out = stats.ipc_mappings;
        if (stats.ipc_mappings <= most || mp_now() - t0 > 5) {
            return stats.ipc_mappings <= most;
        }
        usleep(10 * 1000);
    }
}

static void
part_memapi(const struct mp_world *w)
{
    CUstream s = st_stream();
    const float sum = (float)(w->nranks * (w->nranks - 1) / 2);
    float *x = NULL;
    void *handle = NULL;
    int seen = 0;

    MP_CHECK(ncclMemAlloc((void **)&x, ST_COUNT * sizeof(float)));
    MP_CHECK_COMM(w->comm, ncclCommRegister(w->comm, x, ST_COUNT * sizeof(float), &handle));
    float *init = st_buffer(ST_COUNT, (float)w->rank, 2, s);
    for (int round = 0; round < 3; round++) {
        mp_cuda_copy(&st_cu, x, init, ST_COUNT * sizeof(float), s);
        MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
        MP_EXPECT(st_check(x, ST_COUNT, sum, 2 * (float)w->nranks, s, "registered buffer") == 0,
                  "round %d: wrong all-reduce on a registered ncclMemAlloc buffer", round);
    }
    /* Deregistration lets the leader unmap it: nothing else of the others is mapped. */
    MP_CHECK_COMM(w->comm, ncclCommDeregister(w->comm, handle));
    MP_EXPECT(st_leader_maps_at_most(w, 0, &seen),
              "the leader still maps %d allocations after every rank deregistered its buffer",
              seen);
    MP_EXPECT(ncclCommDeregister(w->comm, handle) == ncclInvalidArgument,
              "a second ncclCommDeregister of one handle was not refused");
    MP_EXPECT(strstr(mp_last_error(w->comm), "not a registration") != NULL,
              "no clear message: \"%s\"", mp_last_error(w->comm));
    /* Used again after deregistration: exported again, still right. */
    mp_cuda_copy(&st_cu, x, init, ST_COUNT * sizeof(float), s);
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    MP_EXPECT(st_check(x, ST_COUNT, sum, 2 * (float)w->nranks, s, "deregistered buffer") == 0,
              "wrong all-reduce on a buffer used again after deregistration");
    MP_CHECK(ncclMemFree(x));
}

/* The leader's mappings of other ranks' memory (the double's count; rank 0 only, -1 else). */
static int
st_leader_maps(const struct mp_world *w)
{
    struct mp_fake_stats stats = {0};

    if (w->rank != 0 || st_cu.fake_stats == NULL) {
        return -1;
    }
    st_cu.fake_stats(&stats);
    return stats.ipc_mappings;
}

static void
part_register(const struct mp_world *w, bool graph)
{
    const int n = w->nranks;
    const float sum = (float)(n * (n - 1) / 2);
    const size_t bytes = ST_COUNT * sizeof(float);
    CUstream s = st_stream();
    void *handle = NULL;

    if (graph) {
        /* Its buffer stays mapped while the team lives: the graph may run at any time. */
        float *g = st_buffer(ST_COUNT, 1, 0, s);
        CUgraph captured = NULL;
        CUgraphExec exec = NULL;
        MP_ASSERT(st_cu.graph_instantiate != NULL, "the CUDA driver has no graphs");
        MP_CU(&st_cu, stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        MP_CHECK_COMM(w->comm, ncclAllReduce(g, g, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
        MP_CU(&st_cu, stream_end_capture(s, &captured));
        MP_CU(&st_cu, graph_instantiate(&exec, captured, 0));
        MP_CU(&st_cu, graph_launch(exec, s));
        MP_EXPECT(st_check(g, ST_COUNT, (float)n, 0, s, "the graph") == 0,
                  "the captured all-reduce went wrong");
        MP_CU(&st_cu, graph_exec_destroy(exec));
        MP_CU(&st_cu, graph_destroy(captured));
    }

    for (int round = 0; round < 3; round++) {
        float *u = st_buffer(ST_COUNT, (float)w->rank, 1, s);
        MP_CHECK_COMM(w->comm, ncclAllReduce(u, u, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
        MP_EXPECT(st_check(u, ST_COUNT, sum, (float)n, s, "unregistered cudaMalloc") == 0,
                  "round %d: wrong all-reduce on unregistered cudaMalloc memory", round);
        mp_cuda_free(&st_cu, st_kind, u); /* at once: nothing of it may be mapped */
    }
    int staged = st_leader_maps(w);
    float *y = mp_cuda_alloc(&st_cu, MP_MEM_DEVICE, bytes);
    MP_CHECK_COMM(w->comm, ncclCommRegister(w->comm, y, bytes, &handle));
    float *init = st_buffer(ST_COUNT, (float)w->rank, 2, s);
    for (int round = 0; round < 3; round++) {
        mp_cuda_copy(&st_cu, y, init, bytes, s);
        MP_CHECK_COMM(w->comm, ncclAllReduce(y, y, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
        MP_EXPECT(st_check(y, ST_COUNT, sum, 2 * (float)n, s, "registered cudaMalloc") == 0,
                  "round %d: wrong all-reduce on registered cudaMalloc memory", round);
    }
    /* Each other rank's registered buffer, mapped beside its staging memory (counted before
     * any rank deregisters). */
    int mapped = st_leader_maps(w);
    MP_EXPECT(mapped == (staged < 0 ? -1 : staged + n - 1),
              "the leader maps %d allocations with the others' buffers registered, %d without",
              mapped, staged);
    mp_barrier(w->comm, n);
    MP_CHECK_COMM(w->comm, ncclCommDeregister(w->comm, handle));
    mp_cuda_free(&st_cu, MP_MEM_DEVICE, y); /* at once: deregistration closed the mapping */
    int seen = 0;
    MP_EXPECT(st_leader_maps_at_most(w, staged, &seen), /* once the others deregistered */
              "the leader maps %d allocations once every buffer was deregistered", seen);
    MP_CHECK_COMM(w->comm, ncclAllReduce(init, init, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    MP_EXPECT(st_check(init, ST_COUNT, sum, 2 * (float)n, s, "after deregistration") == 0,
              "wrong all-reduce after deregistration");
}

/* A leader that destroyed its communicator first: the others' later ncclCommDeregister (a
 * local call, as in NCCL) still returns at once, and their memory may be freed after it, since
 * the leader's mappings went with its side of the team. */
static void
part_leaderleft(const struct mp_world *w)
{
    const size_t bytes = ST_COUNT * sizeof(float);
    CUstream s = st_stream();
    void *handle = NULL;

    float *y = mp_cuda_alloc(&st_cu, MP_MEM_DEVICE, bytes);
    MP_CHECK_COMM(w->comm, ncclCommRegister(w->comm, y, bytes, &handle));
    float *init = st_buffer(ST_COUNT, (float)w->rank, 2, s);
    mp_cuda_copy(&st_cu, y, init, bytes, s);
    MP_CHECK_COMM(w->comm, ncclAllReduce(y, y, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    MP_CU(&st_cu, stream_synchronize(s));
    mp_barrier(w->comm, w->nranks);
    if (w->rank == 0) {
        MP_CHECK_COMM(w->comm, ncclCommDeregister(w->comm, handle));
        MP_CHECK(ncclCommDestroy(w->comm));
    } else {
        usleep(500 * 1000); /* rank 0, the leader, has gone by now */
        double started = mp_now();
        MP_CHECK_COMM(w->comm, ncclCommDeregister(w->comm, handle));
        MP_EXPECT(mp_now() - started < 5.0, "ncclCommDeregister took %.1f s after the leader "
                  "left", mp_now() - started);
        MP_CHECK(ncclCommDestroy(w->comm));
    }
    mp_cuda_free(&st_cu, MP_MEM_DEVICE, y); /* nothing maps it any more */
}

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 32, 0)
static void
part_suspend(const struct mp_world *w)
{
    const int n = w->nranks;
    const float sum = (float)(n * (n - 1) / 2);
    CUstream s = st_stream();
    float *x = st_buffer(ST_COUNT, (float)w->rank, 1, s);
    uint64_t held = 0, suspendable = 0, persistent = 0;
    int seen = 0;

    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    MP_EXPECT(st_check(x, ST_COUNT, sum, (float)n, s, "before suspension") == 0,
              "wrong all-reduce before suspension");
    if (st_across) {
        /* The network path stages through pinned host memory: suspension unregisters it (the
         * double counts registrations), resumption pins it again at the next call. */
        struct mp_fake_stats before = {0}, after = {0};
        MP_ASSERT(st_cu.fake_stats != NULL, "-X suspend counts the double's registrations");
        mp_barrier(w->comm, n);
        st_cu.fake_stats(&before);
        MP_CHECK_COMM(w->comm, ncclCommSuspend(w->comm, NCCL_SUSPEND_MEM));
        st_cu.fake_stats(&after);
        MP_EXPECT(after.registrations < before.registrations,
                  "suspension left the network path's staging registered (%d, then %d)",
                  before.registrations, after.registrations);
        MP_EXPECT(ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s) ==
                      ncclInvalidUsage, "an all-reduce while suspended was not refused");
        MP_CHECK_COMM(w->comm, ncclCommResume(w->comm));
        float *z = st_buffer(ST_COUNT, (float)w->rank, 1, s);
        MP_CHECK_COMM(w->comm, ncclAllReduce(z, z, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
        MP_EXPECT(st_check(z, ST_COUNT, sum, (float)n, s, "after resumption") == 0,
                  "wrong all-reduce after ncclCommResume");
        return;
    }
    MP_CHECK_COMM(w->comm, ncclCommMemStats(w->comm, ncclStatGpuMemSuspend, &suspendable));
    MP_CHECK_COMM(w->comm, ncclCommMemStats(w->comm, ncclStatGpuMemPersist, &persistent));
    MP_CHECK_COMM(w->comm, ncclCommMemStats(w->comm, ncclStatGpuMemTotal, &held));
    /* Rank 0, the only leader on one device, uses its own buffers as they are; the others,
     * and every rank where other GPUs' leaders are in other processes, stage on the device.
     * A rank alone on its GPU keeps its device's work areas (persistent), the others none. */
    const bool all_leaders_here = w->rank == 0 && mp_device_spread() == 1 && !mp_rank_leaders();
    const bool alone = mp_device_spread() >= n || mp_rank_leaders();
    MP_EXPECT((all_leaders_here ? suspendable == 0 : suspendable > 0) &&
                  (alone ? persistent > 0 : persistent == 0) && held == suspendable + persistent,
              "ncclCommMemStats: %llu bytes held, %llu suspendable, %llu persistent",
              (unsigned long long)held, (unsigned long long)suspendable,
              (unsigned long long)persistent);
    mp_barrier(w->comm, n);
    MP_CHECK_COMM(w->comm, ncclCommSuspend(w->comm, NCCL_SUSPEND_MEM));
    MP_CHECK_COMM(w->comm, ncclCommMemStats(w->comm, ncclStatGpuMemTotal, &held));
    MP_EXPECT(held == persistent, "%llu bytes of GPU memory held while suspended, not the %llu "
              "persistent", (unsigned long long)held, (unsigned long long)persistent);
    MP_EXPECT(st_leader_maps_at_most(w, 0, &seen),
              "the leader still maps %d allocations once every rank suspended", seen);
    MP_EXPECT(ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s) == ncclInvalidUsage,
              "an all-reduce while suspended was not refused");
    MP_CHECK_COMM(w->comm, ncclCommResume(w->comm));
    float *y = st_buffer(ST_COUNT, (float)w->rank, 1, s);
    MP_CHECK_COMM(w->comm, ncclAllReduce(y, y, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    MP_EXPECT(st_check(y, ST_COUNT, sum, (float)n, s, "after resumption") == 0,
              "wrong all-reduce after ncclCommResume");
    MP_CHECK_COMM(w->comm, ncclCommMemStats(w->comm, ncclStatGpuMemSuspend, &suspendable));
    MP_EXPECT(all_leaders_here ? suspendable == 0 : suspendable > 0,
              "staging not made again after resumption");
}

static void
part_grow(const struct mp_world *w)
{
    const int n = w->nranks, newcomer = n - 1;
    CUstream s = st_stream();
    ncclComm_t old = NULL, grown = NULL;
    ncclUniqueId id;

    MP_CHECK_COMM(w->comm, ncclCommSplit(w->comm, w->rank < newcomer ? 0 : NCCL_SPLIT_NOCOLOR,
                                         w->rank, &old, NULL));
    memset(&id, 0, sizeof(id));
    if (w->rank == 0) {
        MP_CHECK_COMM(old, ncclCommGetUniqueId(old, &id));
    }
    MP_CHECK_COMM(w->comm, ncclBroadcast(&id, &id, sizeof(id), ncclUint8, 0, w->comm, NULL));
    if (w->rank == newcomer) {
        MP_CHECK(ncclCommGrow(NULL, n, &id, newcomer, &grown, NULL));
    } else {
        MP_CHECK_COMM(old, ncclCommGrow(old, n, w->rank == 0 ? &id : NULL, -1, &grown, NULL));
    }
    for (int round = 0; round < 2; round++) {
        float *x = st_buffer(ST_COUNT, (float)w->rank, 1, s);
        MP_CHECK_COMM(grown, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, grown, s));
        MP_EXPECT(st_check(x, ST_COUNT, (float)(n * (n - 1) / 2), (float)n, s, "grown") == 0,
                  "round %d: wrong all-reduce on the grown communicator", round);
    }
    MP_CHECK(ncclCommDestroy(grown));
    if (old != NULL) {
        MP_CHECK(ncclCommDestroy(old));
    }
}

/* From nccl_device/host.h, which is C++ only. */
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer,
                                      void **outPtr);
ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsaRank,
                                     void **outPtr);

#define ST_WIN_BLOCK 1031 /* floats: odd, past a vector */

static void
part_window(const struct mp_world *w)
{
    const int n = w->nranks, right = (w->rank + 1) % n, left = (w->rank + n - 1) % n;
    const size_t part_bytes = (size_t)n * ST_WIN_BLOCK * sizeof(float);
    CUstream s = st_stream();
    ncclWindow_t win = NULL, refused = NULL;
    float *part = NULL;
    void *ptr = NULL;
    char host[64];

    /* On one host, cudaMalloc memory is not a window part (peers map parts, and NCCL's are
     * ncclMemAlloc's): refused on every rank, none left waiting. Across hosts (no host
     * team) nothing is mapped, and any device memory serves. */
    const bool across = st_across && n > 1;
    float *legacy = mp_cuda_alloc(&st_cu, MP_MEM_DEVICE, 4096);
    /* One rank's bad part fails the registration on every rank; the next one still works
     * (what the others prepared for it, a proxy across hosts, serves again). */
    ncclResult_t bad = ncclCommWindowRegister(w->comm, w->rank == 0 ? NULL : legacy, 4096,
                                              &refused, NCCL_WIN_DEFAULT);
    MP_EXPECT(bad == (w->rank == 0 ? ncclInvalidArgument : ncclInvalidUsage),
              "a registration with rank 0's part NULL gave %s", ncclGetErrorString(bad));
    ncclResult_t res = ncclCommWindowRegister(w->comm, legacy, 4096, &refused,
                                              NCCL_WIN_DEFAULT);
    if (across) {
        MP_CHECK_COMM(w->comm, res);
        mp_barrier(w->comm, n);
        MP_CHECK_COMM(w->comm, ncclCommWindowDeregister(w->comm, refused));
    } else {
        MP_EXPECT(res == ncclInvalidUsage, "a window on cudaMalloc memory was not refused");
        MP_EXPECT(strstr(mp_last_error(w->comm), "ncclMemAlloc") != NULL,
                  "no clear message: \"%s\"", mp_last_error(w->comm));
    }
    mp_cuda_free(&st_cu, MP_MEM_DEVICE, legacy);

    /* Registered, put and awaited while this thread captures another stream in global mode
     * (PyTorch's default): what the library does on the way must not break the capture. */
    float *mine = st_buffer(ST_WIN_BLOCK, (float)(w->rank * 10000), 1, s);
    MP_CHECK_COMM(w->comm, ncclMemAlloc((void **)&part, part_bytes));
    CUstream captured;
    CUgraph graph = NULL;
    MP_CU(&st_cu, stream_create(&captured, CU_STREAM_NON_BLOCKING));
    MP_ASSERT(st_cu.stream_begin_capture != NULL, "the CUDA driver has no graphs");
    MP_CU(&st_cu, stream_begin_capture(captured, CU_STREAM_CAPTURE_MODE_GLOBAL));
    MP_CHECK_COMM(w->comm, ncclCommWindowRegister(w->comm, part, part_bytes, &win,
                                                  NCCL_WIN_DEFAULT));
    /* Every rank puts its block into every rank's part (its own too), then waits for all;
     * rank 0 comes late, so only the waits make the others' parts right. */
    if (w->rank == 0) {
        usleep(300 * 1000);
    }
    for (int p = 0; p < n; p++) {
        MP_CHECK_COMM(w->comm, ncclPutSignal(mine, ST_WIN_BLOCK, ncclFloat32, p, win,
                                             (size_t)w->rank * ST_WIN_BLOCK * sizeof(float), 0,
                                             0, 0, w->comm, s));
    }
    ncclWaitSignalDesc_t *descs = calloc((size_t)n, sizeof(*descs));
    MP_ASSERT(descs != NULL, "out of memory");
    for (int p = 0; p < n; p++) {
        descs[p] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = p, .sigIdx = 0, .ctx = 0};
    }
    MP_CHECK_COMM(w->comm, ncclWaitSignal(n, descs, w->comm, s));
    /* Not cuStreamSynchronize: the capture forbids it on this thread. */
    MP_EXPECT(mp_cuda_wait(&st_cu, s, w->comm, 30) == ncclSuccess,
              "the puts did not finish while another stream was captured");
    CUresult end = st_cu.stream_end_capture(captured, &graph);
    MP_EXPECT(end == CUDA_SUCCESS && graph != NULL,
              "the capture was invalidated (cuStreamEndCapture: %d)", (int)end);
    if (graph != NULL) {
        MP_CU(&st_cu, graph_destroy(graph));
    }
    MP_CU(&st_cu, stream_destroy(captured));
    for (int p = 0; p < n; p++) {
        MP_EXPECT(st_check(part + (size_t)p * ST_WIN_BLOCK, ST_WIN_BLOCK, (float)(p * 10000), 1,
                           s, "window") == 0,
                  "rank %d's block in this rank's part is wrong after the wait", p);
    }
    /* The right neighbour's part, read through its pointer here: rank 0's block. Across
     * hosts there is no such pointer: refused. */
    mp_barrier(w->comm, n);
    if (across) {
        MP_EXPECT(ncclGetPeerDevicePointer(win, 0, right, &ptr) == ncclInvalidUsage,
                  "a device pointer into another host's part was not refused");
    } else {
        MP_CHECK_COMM(w->comm, ncclGetPeerDevicePointer(win, 0, right, &ptr));
        MP_EXPECT(st_check(ptr, ST_WIN_BLOCK, 0, 1, s, "peer pointer") == 0,
                  "rank %d's part read through ncclGetPeerDevicePointer is wrong", right);
        MP_CHECK_COMM(w->comm, ncclGetLsaDevicePointer(win, 0, w->rank, &ptr));
        MP_EXPECT(ptr == part, "this rank's own LSA pointer is %p, its part %p", ptr,
                  (void *)part);
    }
    /* Signals alone, twice, on another index and context: the stream waits for both. */
    MP_CHECK_COMM(w->comm, ncclSignal(right, 3, 1, 0, w->comm, s));
    MP_CHECK_COMM(w->comm, ncclSignal(right, 3, 1, 0, w->comm, s));
    ncclWaitSignalDesc_t two = {.opCnt = 2, .peer = left, .sigIdx = 3, .ctx = 1};
    MP_CHECK_COMM(w->comm, ncclWaitSignal(1, &two, w->comm, s));
    MP_EXPECT(mp_cuda_wait(&st_cu, s, w->comm, 20) == ncclSuccess,
              "the stream did not pass the wait for two signals");
    /* The windows of a communicator are of one kind: a host window now is refused. */
    MP_EXPECT(ncclCommWindowRegister(w->comm, host, sizeof(host), &refused,
                                     NCCL_WIN_DEFAULT) == ncclInvalidUsage,
              "a host window beside a device window was not refused");
    mp_barrier(w->comm, n);
    MP_CHECK_COMM(w->comm, ncclCommWindowDeregister(w->comm, win));
    MP_CHECK_COMM(w->comm, ncclMemFree(part));
    free(descs);
}

/* One communicator of part_windowgroup, as this thread drives it. */
struct st_wg {
    ncclComm_t comm;
    int tag;          /* which communicator: its ranks' blocks say so */
    int rank, n;
    CUcontext ctx;    /* of its device */
    CUstream s;
    float *part;      /* ncclMemAlloc'd: n blocks */
    float *mine;      /* what this rank puts into every rank's part */
    ncclWindow_t win;
};

/* What rank r of communicator `tag` puts: its block's first element; each next one is 1 more. */
static float
st_wg_value(int tag, int r)
{
    return (float)(tag * 100000 + r * 10000);
}

/* Device windows registered and deregistered inside a group by one thread that drives
 * several communicators. Each registration is collective, so inside a group it runs on a
 * thread of its own until ncclGroupEnd, a thread with no current context. */
static void
part_windowgroup(struct mp_world *w)
{
    const int devlist[2] = {0, 1};
    struct st_wg c[2];
    const int nc = 2;
    struct mp_fake_stats before = {0}, after = {0};

    memset(c, 0, sizeof(c));
    if (w->nranks == 1) {
        /* A clique of one process, a communicator per device (FAKE_CUDA_DEVICES=2). */
        ncclComm_t comms[2];
        MP_CHECK(ncclCommInitAll(comms, 2, devlist));
        for (int k = 0; k < nc; k++) {
            CUdevice dev;
            MP_CU(&st_cu, device_get(&dev, devlist[k]));
            MP_CU(&st_cu, primary_ctx_retain(&c[k].ctx, dev));
            c[k].comm = comms[k];
            c[k].tag = 0;
        }
    } else {
        /* Every rank: the world and a split of it, on the rank's device. */
        c[0] = (struct st_wg){.comm = w->comm, .tag = 0, .ctx = st_cu.ctx};
        c[1] = (struct st_wg){.tag = 1, .ctx = st_cu.ctx};
        MP_CHECK_COMM(w->comm, ncclCommSplit(w->comm, 0, w->rank, &c[1].comm, NULL));
    }
    for (int k = 0; k < nc; k++) {
        MP_CHECK_COMM(c[k].comm, ncclCommUserRank(c[k].comm, &c[k].rank));
        MP_CHECK_COMM(c[k].comm, ncclCommCount(c[k].comm, &c[k].n));
        MP_CU(&st_cu, ctx_set_current(c[k].ctx)); /* ncclMemAlloc's device */
        c[k].s = st_stream();
        c[k].mine = st_buffer(ST_WIN_BLOCK, st_wg_value(c[k].tag, c[k].rank), 1, c[k].s);
        MP_CHECK_COMM(c[k].comm, ncclMemAlloc((void **)&c[k].part, (size_t)c[k].n *
                                                  ST_WIN_BLOCK * sizeof(float)));
    }
    MP_CU(&st_cu, ctx_set_current(c[0].ctx)); /* and never changed while the groups run */
    if (st_cu.fake_stats != NULL) {
        st_cu.fake_stats(&before);
    }
    MP_CHECK(ncclGroupStart());
    for (int k = 0; k < nc; k++) {
        MP_CHECK_COMM(c[k].comm, ncclCommWindowRegister(c[k].comm, c[k].part,
                                                        (size_t)c[k].n * ST_WIN_BLOCK *
                                                            sizeof(float),
                                                        &c[k].win, NCCL_WIN_DEFAULT));
    }
    MP_CHECK(ncclGroupEnd());
    /* Each rank of each communicator puts its block into every rank's part (its own too),
     * each with a signal, and waits for all of them on its stream. */
    for (int k = 0; k < nc; k++) {
        MP_ASSERT(c[k].win != NULL, "no window after ncclGroupEnd (communicator %d)", k);
        for (int p = 0; p < c[k].n; p++) {
            MP_CHECK_COMM(c[k].comm, ncclPutSignal(c[k].mine, ST_WIN_BLOCK, ncclFloat32, p,
                                                   c[k].win, (size_t)c[k].rank * ST_WIN_BLOCK *
                                                                 sizeof(float),
                                                   0, 0, 0, c[k].comm, c[k].s));
        }
    }
    for (int k = 0; k < nc; k++) {
        ncclWaitSignalDesc_t descs[8];
        MP_ASSERT(c[k].n <= 8, "windowgroup: at most 8 ranks");
        for (int p = 0; p < c[k].n; p++) {
            descs[p] = (ncclWaitSignalDesc_t){.opCnt = 1, .peer = p, .sigIdx = 0, .ctx = 0};
        }
        MP_CHECK_COMM(c[k].comm, ncclWaitSignal(c[k].n, descs, c[k].comm, c[k].s));
    }
    for (int k = 0; k < nc; k++) {
        MP_CU(&st_cu, ctx_set_current(c[k].ctx));
        for (int p = 0; p < c[k].n; p++) {
            MP_EXPECT(st_check(c[k].part + (size_t)p * ST_WIN_BLOCK, ST_WIN_BLOCK,
                               st_wg_value(c[k].tag, p), 1, c[k].s, "grouped window") == 0,
                      "communicator %d: rank %d's block in rank %d's part is wrong", k, p,
                      c[k].rank);
        }
    }
    MP_CU(&st_cu, ctx_set_current(c[0].ctx));
    MP_CHECK(ncclGroupStart());
    for (int k = 0; k < nc; k++) {
        MP_CHECK_COMM(c[k].comm, ncclCommWindowDeregister(c[k].comm, c[k].win));
    }
    MP_CHECK(ncclGroupEnd());
    /* The peers' parts and signal words this process mapped went with the windows. */
    if (st_cu.fake_stats != NULL) {
        st_cu.fake_stats(&after);
        MP_EXPECT(after.ipc_mappings == before.ipc_mappings,
                  "%d imported mappings before the grouped registrations, %d after the grouped "
                  "deregistrations", before.ipc_mappings, after.ipc_mappings);
    }
    for (int k = 0; k < nc; k++) {
        MP_CU(&st_cu, ctx_set_current(c[k].ctx));
        MP_CHECK_COMM(c[k].comm, ncclMemFree(c[k].part));
        mp_cuda_free(&st_cu, MP_MEM_DEVICE, c[k].mine);
        MP_CU(&st_cu, stream_destroy(c[k].s));
        if (c[k].comm != w->comm) {
            MP_CHECK(ncclCommDestroy(c[k].comm));
        }
    }
    MP_CU(&st_cu, ctx_set_current(st_cu.ctx));
}
#endif

static void
part_churn(const struct mp_world *w)
{
    const int rounds = 40;
    const float n = (float)w->nranks;
    CUstream s = st_stream();

    for (int round = 0; round < rounds; round++) {
        enum mp_mem_kind kind = round % 2 ? MP_MEM_MEMALLOC : MP_MEM_DEVICE;
        size_t count = ST_COUNT + (size_t)(round % 5) * 1024;
        float *host = malloc(count * sizeof(float));
        MP_ASSERT(host != NULL, "out of memory");
        for (size_t i = 0; i < count; i++) {
            host[i] = (float)(w->rank + round) + (float)i;
        }
        float *x = mp_cuda_alloc(&st_cu, kind, count * sizeof(float));
        mp_cuda_copy(&st_cu, x, host, count * sizeof(float), s);
        free(host);
        MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, count, ncclFloat, ncclSum, w->comm, s));
        MP_EXPECT(st_check(x, count, n * (float)round + n * (n - 1) / 2, n, s, "churn") == 0,
                  "round %d (%s memory at %p): wrong all-reduce", round,
                  mp_mem_kind_names[kind], (void *)x);
        mp_cuda_free(&st_cu, kind, x);
    }
    /* Ranks look for freed allocations when they post, at most every 10 ms. */
    usleep(30 * 1000);
    float *keep = st_buffer(ST_COUNT, 1, 0, s);
    MP_CHECK_COMM(w->comm, ncclAllReduce(keep, keep, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    MP_EXPECT(st_check(keep, ST_COUNT, n, 0, s, "after the churn") == 0,
              "wrong all-reduce after the churn");
    /* Each other rank's `keep`, and at most one freed buffer whose forget is on its way. */
    int seen = 0;
    MP_EXPECT(st_leader_maps_at_most(w, 2 * (w->nranks - 1), &seen),
              "the leader still maps %d allocations after %d rounds of freed ones", seen,
              rounds);
}

/* While this thread captures another stream in global mode (PyTorch's default), an
 * all-reduce on fresh buffers, whose exports and mappings the library and the leader's thread
 * make then, runs right, and the capture survives it. So do ncclMemAlloc, ncclCommRegister,
 * ncclCommDeregister and ncclMemFree meanwhile (allocating, mapping and exporting are among
 * what such a capture forbids a thread whose mode is not relaxed; NCCL relaxes them): a
 * buffer allocated and registered under the capture takes an all-reduce's result, which a
 * copy on the stream keeps, and is deregistered and freed before the capture ends. */
static void
part_globalcapture(struct mp_world *w)
{
    const int n = w->nranks;
    CUstream s, captured;
    float *m = NULL;
    void *handle = NULL;

    MP_CU(&st_cu, stream_create(&s, CU_STREAM_NON_BLOCKING));
    MP_CU(&st_cu, stream_create(&captured, CU_STREAM_NON_BLOCKING));
    float *x = st_buffer(ST_COUNT, (float)w->rank, 1, s);
    float *kept = st_buffer(ST_COUNT, -1, 0, s);
    CUgraph graph = NULL;

    MP_ASSERT(st_cu.stream_begin_capture != NULL, "the CUDA driver has no graphs");
    MP_CU(&st_cu, stream_synchronize(s));
    MP_CU(&st_cu, stream_begin_capture(captured, CU_STREAM_CAPTURE_MODE_GLOBAL));
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    MP_CHECK_COMM(w->comm, ncclMemAlloc((void **)&m, ST_COUNT * sizeof(float)));
    MP_CHECK_COMM(w->comm, ncclCommRegister(w->comm, m, ST_COUNT * sizeof(float), &handle));
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, m, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    MP_CU(&st_cu, memcpy_async((CUdeviceptr)(uintptr_t)kept, (CUdeviceptr)(uintptr_t)m,
                               ST_COUNT * sizeof(float), s));
    /* Not cuStreamSynchronize: the capture forbids it on this thread. */
    MP_EXPECT(mp_cuda_wait(&st_cu, s, w->comm, 30) == ncclSuccess,
              "the all-reduces did not finish while another stream was captured");
    MP_CHECK_COMM(w->comm, ncclCommDeregister(w->comm, handle));
    MP_CHECK_COMM(w->comm, ncclMemFree(m));
    CUresult end = st_cu.stream_end_capture(captured, &graph);
    MP_EXPECT(end == CUDA_SUCCESS && graph != NULL,
              "the capture was invalidated (cuStreamEndCapture: %d)", (int)end);
    if (graph != NULL) {
        MP_CU(&st_cu, graph_destroy(graph));
    }
    MP_EXPECT(st_check(x, ST_COUNT, (float)(n * (n - 1)) / 2, (float)n, s,
                       "all-reduce beside a capture") == 0,
              "the all-reduce beside a global-mode capture went wrong");
    MP_EXPECT(st_check(kept, ST_COUNT, (float)(n * n * (n - 1)) / 2, (float)(n * n), s,
                       "all-reduce into memory allocated and registered beside a capture") == 0,
              "the all-reduce into an ncclMemAlloc buffer registered beside a global-mode "
              "capture went wrong");
    mp_cuda_free(&st_cu, MP_MEM_DEVICE, x);
    mp_cuda_free(&st_cu, MP_MEM_DEVICE, kept);
    MP_CU(&st_cu, stream_destroy(captured));
    MP_CU(&st_cu, stream_destroy(s));
}

static void *
st_abort_thread(void *comm)
{
    return (void *)(intptr_t)ncclCommAbort((ncclComm_t)comm);
}

static void
part_capturelife(struct mp_world *w)
{
    const int n = w->nranks;
    CUstream s = st_stream(), captured;
    ncclComm_t doomed = NULL, child = NULL, alone = NULL;
    float h[64];
    CUgraph graph = NULL;
    pthread_t watchdog;
    void *aborted;

    /* Blocking: while it is captured, the legacy stream is unusable to every thread. */
    MP_CU(&st_cu, stream_create(&captured, CU_STREAM_DEFAULT));
    float *x = st_buffer(ST_COUNT, (float)w->rank, 1, s);
    ncclConfig_t nonblocking = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId id;
    nonblocking.blocking = 0;
    MP_CHECK(ncclGetUniqueId(&id));
    MP_CU(&st_cu, stream_begin_capture(captured, CU_STREAM_CAPTURE_MODE_GLOBAL));
    /* Made by the library's init thread, then by this thread. */
    ncclResult_t made = ncclCommInitRankConfig(&doomed, n, id, w->rank, &nonblocking);
    MP_ASSERT(made == ncclSuccess || made == ncclInProgress, "a non-blocking init under a "
              "global capture gave %s", ncclGetErrorString(made));
    MP_EXPECT(mp_comm_wait(doomed, 30) == ncclSuccess, "a non-blocking init under a global "
              "capture failed: \"%s\"", mp_last_error(doomed));
    MP_CHECK_COMM(w->comm, ncclCommSplit(w->comm, 0, w->rank, &child, NULL));
    if (w->rank == 0) {
        usleep(300 * 1000); /* the others' operations wait, and their threads look around */
    }
    MP_CHECK_COMM(child, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, child, s));
    MP_EXPECT(mp_cuda_wait(&st_cu, s, child, 30) == ncclSuccess,
              "an all-reduce on a communicator split under a global capture did not finish");
    MP_CHECK_COMM(w->comm, ncclCommSplit(w->comm, w->rank, 0, &alone, NULL));
    MP_CHECK_COMM(alone, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, alone, s));
    for (int i = 0; i < 64; i++) {
        h[i] = (float)i;
    }
    /* Host memory: the device operation before it is drained first, on this thread. */
    MP_CHECK_COMM(alone, ncclAllReduce(h, h, 64, ncclFloat, ncclSum, alone, s));
    MP_EXPECT(h[63] == 63, "a one-rank host all-reduce changed its data: %g", h[63]);
    MP_CHECK_COMM(alone, ncclCommDestroy(alone));
    MP_CHECK_COMM(child, ncclCommDestroy(child));
    MP_ASSERT(pthread_create(&watchdog, NULL, st_abort_thread, doomed) == 0, "pthread_create");
    pthread_join(watchdog, &aborted);
    MP_EXPECT((ncclResult_t)(intptr_t)aborted == ncclSuccess,
              "ncclCommAbort from another thread under a global capture gave %s",
              ncclGetErrorString((ncclResult_t)(intptr_t)aborted));
    CUresult end = st_cu.stream_end_capture(captured, &graph);
    MP_EXPECT(end == CUDA_SUCCESS && graph != NULL,
              "the capture was invalidated by the lifecycle's calls (cuStreamEndCapture: %d)",
              (int)end);
    if (graph != NULL) {
        MP_CU(&st_cu, graph_destroy(graph));
    }
    MP_EXPECT(st_check(x, ST_COUNT, (float)(n * (n - 1)) / 2, (float)n, s,
                       "all-reduce under a global capture") == 0,
              "an all-reduce on a communicator split under a global capture went wrong");
    mp_cuda_free(&st_cu, MP_MEM_DEVICE, x);
    MP_CU(&st_cu, stream_destroy(captured));
    MP_CU(&st_cu, stream_destroy(s));
}

/* stream waits for what `after` holds now, as PyTorch joins its streams: an event. */
static void
st_join(CUstream stream, CUstream after, CUevent event)
{
    MP_CU(&st_cu, event_record(event, after));
    MP_CU(&st_cu, stream_wait_event(stream, event, 0));
}

static void
part_torchp2p(const struct mp_world *w)
{
    enum { POOL = 32, ROUNDS = 4 };
    const CUstream legacy = NULL; /* PyTorch's default stream: the user's work */
    const float n = (float)w->nranks;
    const int last = w->nranks - 1;
    CUstream pool[2 * POOL];
    CUevent before, after;

    /* PyTorch's stream pools, made at once at their first use: two priorities, 32 each. */
    for (int i = 0; i < 2 * POOL; i++) {
        pool[i] = st_stream();
    }
    CUstream nccl = pool[POOL + 1]; /* the process group's stream, one of the pool's */
    MP_CU(&st_cu, event_create(&before, CU_EVENT_DISABLE_TIMING));
    MP_CU(&st_cu, event_create(&after, CU_EVENT_DISABLE_TIMING));
    float *x = st_buffer(ST_COUNT, (float)w->rank, 1, legacy);
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, legacy));
    for (int k = 0; k < 2; k++) {
        st_join(nccl, legacy, before);
        MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, nccl));
        st_join(legacy, nccl, after);
    }
    /* Blocking send and receive, ungrouped, on the same communicator and stream (PyTorch's
     * eager mode): rank 0 to the last rank and back, the receiver copying its data to the host
     * on the legacy stream before it sends. Fresh buffers each round. */
    for (int r = 0; r < ROUNDS && (w->rank == 0 || w->rank == last); r++) {
        float *out = st_buffer(ST_COUNT, (float)(w->rank == 0 ? 100 + r : 200 + r), 1, legacy);
        float *in = st_buffer(ST_COUNT, -1, 0, legacy);
        int peer = w->rank == 0 ? last : 0;
        if (w->rank == 0) {
            st_join(nccl, legacy, before);
            MP_CHECK_COMM(w->comm, ncclSend(out, ST_COUNT, ncclFloat, peer, w->comm, nccl));
            st_join(legacy, nccl, after);
        }
        st_join(nccl, legacy, before);
        MP_CHECK_COMM(w->comm, ncclRecv(in, ST_COUNT, ncclFloat, peer, w->comm, nccl));
        st_join(legacy, nccl, after);
        MP_EXPECT(st_check(in, ST_COUNT, (float)(w->rank == 0 ? 200 + r : 100 + r), 1, legacy,
                           "point-to-point") == 0,
                  "round %d: rank %d received wrong data", r, w->rank);
        if (w->rank == last) {
            st_join(nccl, legacy, before);
            MP_CHECK_COMM(w->comm, ncclSend(out, ST_COUNT, ncclFloat, peer, w->comm, nccl));
            st_join(legacy, nccl, after);
        }
        MP_CU(&st_cu, stream_synchronize(legacy));
        mp_cuda_free(&st_cu, st_kind, out);
        mp_cuda_free(&st_cu, st_kind, in);
    }
    st_join(nccl, legacy, before);
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, nccl));
    st_join(legacy, nccl, after);
    MP_EXPECT(st_check(x, ST_COUNT, n * n * n * n * (n - 1) / 2, n * n * n * n, legacy,
                       "all-reduces around point-to-point") == 0,
              "all-reduces on the legacy and the process group's streams went wrong");
    mp_cuda_free(&st_cu, st_kind, x);
    MP_CU(&st_cu, event_destroy(before));
    MP_CU(&st_cu, event_destroy(after));
    for (int i = 0; i < 2 * POOL; i++) {
        MP_CU(&st_cu, stream_destroy(pool[i]));
    }
}

static void
part_graph(struct mp_world *w)
{
    const int n = w->nranks, next = (w->rank + 1) % n, prev = (w->rank + n - 1) % n;
    const float grow = 2 * (float)n; /* PreMulSum by 2 summed over n ranks */
    CUstream s = st_stream();
    float *x = st_buffer(ST_COUNT, 1, 0, s);
    float *y = st_buffer(ST_COUNT, 0, 0, s);
    float *z = st_buffer(ST_COUNT, 1, 0, s);
    float *mine = st_buffer(ST_COUNT, (float)w->rank, 1, s);
    float *from_prev = st_buffer(ST_COUNT, -1, 0, s);
    float two = 2;
    ncclRedOp_t times2;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;

    MP_ASSERT(st_cu.graph_instantiate != NULL && st_cu.graph_launch != NULL,
              "the CUDA driver has no graphs");
    MP_CHECK_COMM(w->comm, ncclRedOpCreatePreMulSum(&times2, &two, ncclFloat,
                                                    ncclScalarHostImmediate, w->comm));
    /* Warm up outside the capture, as PyTorch does; it captures in global mode, as here. */
    MP_CHECK_COMM(w->comm, ncclAllReduce(y, y, ST_COUNT, ncclFloat, times2, w->comm, s));
    MP_CU(&st_cu, stream_synchronize(s));
    MP_CU(&st_cu, stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, times2, w->comm, s));
    MP_CHECK_COMM(w->comm, ncclBroadcast(x, y, ST_COUNT, ncclFloat, n - 1, w->comm, s));
    MP_CHECK(ncclGroupStart());
    MP_CHECK_COMM(w->comm, ncclSend(mine, ST_COUNT, ncclFloat, next, w->comm, s));
    MP_CHECK_COMM(w->comm, ncclRecv(from_prev, ST_COUNT, ncclFloat, prev, w->comm, s));
    MP_CHECK(ncclGroupEnd());
    MP_CU(&st_cu, stream_end_capture(s, &graph));
    MP_CU(&st_cu, graph_instantiate(&exec, graph, 0));
    MP_EXPECT(st_check(x, ST_COUNT, 1, 0, s, "captured, not launched") == 0,
              "a captured all-reduce ran before its graph was launched");
    /* Launches, with a call outside the capture between them on the same stream. */
    for (int i = 0; i < 5; i++) {
        MP_CU(&st_cu, graph_launch(exec, s));
        MP_CHECK_COMM(w->comm, ncclAllReduce(z, z, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    }
    const float launched = grow * grow * grow * grow * grow;
    MP_EXPECT(st_check(x, ST_COUNT, launched, 0, s, "five launches") == 0,
              "five launches of a captured all-reduce did not multiply by (2n)^5");
    MP_EXPECT(st_check(y, ST_COUNT, launched, 0, s, "the captured broadcast") == 0,
              "the captured broadcast did not copy the all-reduce's result");
    MP_EXPECT(st_check(from_prev, ST_COUNT, (float)prev, 1, s, "the captured receive") == 0,
              "the captured send and receive around the ring went wrong");
    MP_EXPECT(st_check(z, ST_COUNT, (float)(n * n * n * n * n), 0, s, "calls between") == 0,
              "the all-reduces between the launches went wrong");
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, times2, w->comm, s));
    MP_EXPECT(st_check(x, ST_COUNT, launched * grow, 0, s, "after the graph") == 0,
              "an all-reduce after the graph's launches went wrong");
    MP_CHECK_COMM(w->comm, ncclRedOpDestroy(times2, w->comm));
    /* Launched after its communicator went, the graph must not crash or hang (its results are
     * undefined, as NCCL's). */
    MP_CHECK(ncclCommDestroy(w->comm));
    w->comm = NULL;
    MP_CU(&st_cu, graph_launch(exec, s));
    MP_EXPECT(mp_cuda_wait(&st_cu, s, NULL, 10) == ncclSuccess,
              "a graph launched after ncclCommDestroy did not finish");
    MP_CU(&st_cu, graph_exec_destroy(exec));
    MP_CU(&st_cu, graph_destroy(graph));
}

/* A graph's buffers are their owner's again once the graph went, as with NCCL's graph
 * registration: unregistered cudaMalloc memory captured into a graph (which a leader of
 * another process maps) may be freed once the graph and its exec were destroyed and a call
 * made after that (the call unpins it, and returns once every leader closed its mapping: the
 * double complains at a free of memory a leader still maps). Before, it stayed mapped while
 * the communicator lived. */
static void
part_graphfree(const struct mp_world *w)
{
    CUstream s = st_stream();
    float *x = st_buffer(ST_COUNT, 1, 0, s);
    float *y = st_buffer(ST_COUNT, 1, 0, s);
    const float n = (float)w->nranks;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;

    MP_CU(&st_cu, stream_synchronize(s));
    MP_CU(&st_cu, stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    MP_CU(&st_cu, stream_end_capture(s, &graph));
    MP_CU(&st_cu, graph_instantiate(&exec, graph, 0));
    MP_CU(&st_cu, graph_launch(exec, s));
    MP_EXPECT(st_check(x, ST_COUNT, n, 0, s, "the captured all-reduce") == 0,
              "a captured all-reduce went wrong");
    MP_CU(&st_cu, graph_exec_destroy(exec));
    MP_CU(&st_cu, graph_destroy(graph));
    usleep(200 * 1000); /* the graph's user object goes on a driver thread of its own */
    MP_CHECK_COMM(w->comm, ncclAllReduce(y, y, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
    MP_EXPECT(st_check(y, ST_COUNT, n, 0, s, "a call after the graph went") == 0,
              "an all-reduce after the graph went went wrong");
    MP_CU(&st_cu, mem_free((CUdeviceptr)(uintptr_t)x));
}

/* Two communicators of the same ranks (a data- and a tensor-parallel group), each captured
 * on its own stream, and their graphs launched in opposite orders by even and odd ranks: a
 * host function that waited for GPU work could stall every other host function of its process
 * (the double runs them one at a time, as the driver may), and the ranks would wait for each
 * other forever. Both graphs finish, three times, with the right results. */
static void
part_twographs(struct mp_world *w)
{
    const int n = w->nranks;
    ncclComm_t comms[2] = {w->comm, NULL};
    CUstream s[2] = {st_stream(), st_stream()};
    float *x[2];
    CUgraph graph[2];
    CUgraphExec exec[2];

    MP_CHECK_COMM(w->comm, ncclCommSplit(w->comm, 0, w->rank, &comms[1], NULL));
    for (int c = 0; c < 2; c++) {
        x[c] = st_buffer(ST_COUNT, 1, 0, s[c]);
        /* Warm up outside the capture, as PyTorch does. */
        MP_CHECK_COMM(comms[c], ncclAllReduce(x[c], x[c], ST_COUNT, ncclFloat, ncclProd,
                                              comms[c], s[c]));
        MP_CU(&st_cu, stream_synchronize(s[c]));
    }
    for (int c = 0; c < 2; c++) {
        MP_CU(&st_cu, stream_begin_capture(s[c], CU_STREAM_CAPTURE_MODE_GLOBAL));
        MP_CHECK_COMM(comms[c], ncclAllReduce(x[c], x[c], ST_COUNT, ncclFloat, ncclSum,
                                              comms[c], s[c]));
        MP_CU(&st_cu, stream_end_capture(s[c], &graph[c]));
        MP_CU(&st_cu, graph_instantiate(&exec[c], graph[c], 0));
    }
    float want = 1;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 2; i++) {
            int c = w->rank % 2 == 0 ? i : 1 - i;
            MP_CU(&st_cu, graph_launch(exec[c], s[c]));
        }
        want *= (float)n;
        for (int c = 0; c < 2; c++) {
            ncclResult_t res = mp_cuda_wait(&st_cu, s[c], comms[c], 20);
            MP_ASSERT(res == ncclSuccess, "graph %d of round %d did not finish: %s", c, round,
                      ncclGetErrorString(res));
        }
    }
    for (int c = 0; c < 2; c++) {
        MP_EXPECT(st_check(x[c], ST_COUNT, want, 0, s[c], "two graphs in opposite orders") == 0,
                  "communicator %d's graph went wrong", c);
        MP_CU(&st_cu, graph_exec_destroy(exec[c]));
        MP_CU(&st_cu, graph_destroy(graph[c]));
    }
    MP_CHECK(ncclCommDestroy(comms[1]));
}

static void
part_abort(const struct mp_world *w, int poster, bool graph)
{
    CUstream s = st_stream();
    float *x = st_buffer(ST_COUNT, 1, 0, s);
    CUgraph captured = NULL;
    CUgraphExec exec = NULL;

    if (graph) {
        /* Every rank captures; only the poster launches, so its host function waits. */
        MP_CU(&st_cu, stream_synchronize(s));
        MP_CU(&st_cu, stream_begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
        MP_CU(&st_cu, stream_end_capture(s, &captured));
        MP_CU(&st_cu, graph_instantiate(&exec, captured, 0));
    }
    if (w->rank == poster) {
        if (graph) {
            MP_CU(&st_cu, graph_launch(exec, s));
        } else {
            MP_CHECK_COMM(w->comm,
                          ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s));
        }
        usleep(300 * 1000);
        MP_EXPECT(st_cu.stream_query(s) == CUDA_ERROR_NOT_READY,
                  "the stream finished an all-reduce the others never joined");
        double t0 = mp_now();
        MP_CHECK(ncclCommAbort(w->comm));
        MP_EXPECT(mp_now() - t0 < 5, "ncclCommAbort took %.2f s", mp_now() - t0);
        MP_EXPECT(mp_cuda_wait(&st_cu, s, NULL, 5) == ncclSuccess,
                  "the stream still waits after ncclCommAbort");
        float probe = -1;
        mp_cuda_copy(&st_cu, &probe, x, sizeof(probe), s);
        MP_EXPECT(probe != -1, "work enqueued after the abort did not run");
    } else {
        usleep(1000 * 1000); /* never joins; aborts after the poster did */
        MP_CHECK(ncclCommAbort(w->comm));
    }
    if (graph) {
        MP_CU(&st_cu, graph_exec_destroy(exec));
        MP_CU(&st_cu, graph_destroy(captured));
    }
}

static void
part_fault(const struct mp_world *w)
{
    CUstream s = st_stream();
    float *y = st_buffer(ST_COUNT, 0, 0, s);
    float *x = w->rank == 0 ? mp_cuda_alloc_cumem(&st_cu, ST_COUNT * sizeof(float), true)
                            : st_buffer(ST_COUNT, 1, 0, s);
    ncclResult_t res = ncclAllReduce(x, y, ST_COUNT, ncclFloat, ncclSum, w->comm, s);
    ncclResult_t async = ncclSuccess;
    double deadline = mp_now() + 40;

    /* A call of a device team's leader may wait for the others and see the fault itself. */
    while (res == ncclSuccess && mp_now() < deadline &&
           (ncclCommGetAsyncError(w->comm, &async) != ncclSuccess || async == ncclSuccess ||
            async == ncclInProgress)) {
        usleep(1000);
    }
    ncclResult_t seen = res != ncclSuccess ? res : async;
    MP_EXPECT(seen != ncclSuccess && seen != ncclInProgress,
              "rank %d: no failure reported 40 s after rank 0's kernel faulted", w->rank);
    if (w->rank == 0) {
        MP_EXPECT(seen == ncclUnhandledCudaError, "the faulted rank reported %s",
                  ncclGetErrorString(seen));
        CUresult q = st_cu.stream_query(s);
        MP_EXPECT(q == CUDA_ERROR_ILLEGAL_ADDRESS, "the faulted stream answers %d", (int)q);
        res = ncclAllReduce(y, y, ST_COUNT, ncclFloat, ncclSum, w->comm, s);
        MP_EXPECT(res == ncclUnhandledCudaError || res == seen,
                  "a call after the fault gave %s", ncclGetErrorString(res));
        MP_EXPECT(strstr(mp_last_error(w->comm), "CUDA_ERROR_ILLEGAL_ADDRESS") != NULL,
                  "no clear message: \"%s\"", mp_last_error(w->comm));
    }
    double t0 = mp_now();
    MP_CHECK(ncclCommAbort(w->comm));
    MP_EXPECT(mp_now() - t0 < 10, "ncclCommAbort took %.2f s", mp_now() - t0);
    if (w->rank != 0) {
        MP_EXPECT(mp_cuda_wait(&st_cu, s, NULL, 10) == ncclSuccess,
                  "rank %d's stream still waits after ncclCommAbort", w->rank);
    }
}

/* A call made on a thread of its own, for abortblocked. */
struct st_blocked {
    ncclComm_t comm;
    float *x;
    CUstream stream;
    ncclResult_t res;
    int returned; /* atomic */
};

static void *
st_blocked_call(void *arg)
{
    struct st_blocked *b = arg;
    b->res = ncclAllReduce(b->x, b->x, ST_COUNT, ncclFloat, ncclSum, b->comm, b->stream);
    __atomic_store_n(&b->returned, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void
part_abortblocked(const struct mp_world *w, bool host, bool revoke)
{
    if (w->rank != 0) {
        usleep(1500 * 1000); /* never joins; aborts after rank 0 did */
        MP_CHECK(ncclCommAbort(w->comm));
        return;
    }
    struct st_blocked b = {.comm = w->comm};
    pthread_t thread;
    if (host) {
        b.x = calloc(ST_COUNT, sizeof(float));
        MP_ASSERT(b.x != NULL, "out of memory");
    } else {
        MP_ASSERT(mp_device_call_may_wait(w->rank, w->nranks), "abortblocked: rank 0's call must wait");
        b.stream = st_stream();
        b.x = st_buffer(ST_COUNT, 1, 0, b.stream);
        MP_CU(&st_cu, stream_synchronize(b.stream));
    }
    MP_ASSERT(pthread_create(&thread, NULL, st_blocked_call, &b) == 0, "pthread_create");
    usleep(300 * 1000);
    MP_EXPECT(!__atomic_load_n(&b.returned, __ATOMIC_ACQUIRE),
              "the call returned before the others joined (%s)", ncclGetErrorString(b.res));
    double t0 = mp_now();
    if (revoke) {
        MP_CHECK_COMM(w->comm, ncclCommRevoke(w->comm, NCCL_REVOKE_DEFAULT));
        while (!__atomic_load_n(&b.returned, __ATOMIC_ACQUIRE) && mp_now() - t0 < 10) {
            usleep(1000);
        }
        MP_EXPECT(__atomic_load_n(&b.returned, __ATOMIC_ACQUIRE),
                  "the call still waits %.2f s after ncclCommRevoke", mp_now() - t0);
        pthread_join(thread, NULL);
        MP_CHECK(ncclCommAbort(w->comm));
        MP_EXPECT(mp_now() - t0 < 5, "revoke and abort took %.2f s", mp_now() - t0);
    } else {
        MP_CHECK(ncclCommAbort(w->comm));
        MP_EXPECT(mp_now() - t0 < 5, "ncclCommAbort took %.2f s", mp_now() - t0);
        MP_EXPECT(__atomic_load_n(&b.returned, __ATOMIC_ACQUIRE),
                  "ncclCommAbort returned while the call it ended was still inside the library");
        pthread_join(thread, NULL);
    }
    if (host) {
        free(b.x);
    }
}

#define ST_MAX_STREAMS 16

/* Every rank captures an all-reduce on each of nstreams streams of its own, made after its
 * communicator (so that, with more than 8, one of them shares a hardware queue with a stream
 * the library made first: a leader's); where every rank captured all, each graph is launched
 * twice and sums twice. */
static void
part_onequeuegraph(const struct mp_world *w, int nstreams)
{
    CUstream s[ST_MAX_STREAMS];
    CUgraph graphs[ST_MAX_STREAMS] = {NULL};
    int captured = 1;

    MP_ASSERT(nstreams >= 1 && nstreams <= ST_MAX_STREAMS, "-S: 1 to %d streams",
              ST_MAX_STREAMS);
    for (int i = 0; i < nstreams; i++) {
        s[i] = st_stream();
    }
    float *x = st_buffer(ST_COUNT, 1, 0, s[0]);
    MP_CU(&st_cu, stream_synchronize(s[0]));
    /* Refused in the process of a leader that shares its GPU (the graph's wait would come
     * before its leader's work, which may share its hardware queue); a leader alone on its GPU
     * (or leading its own share of it) runs the share on its own stream. */
    bool refused = mp_leader_shares_gpu(w->rank, w->nranks);
    for (int i = 0; i < nstreams; i++) {
        MP_CU(&st_cu, stream_begin_capture(s[i], CU_STREAM_CAPTURE_MODE_GLOBAL));
        ncclResult_t res = ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, s[i]);
        MP_CU(&st_cu, stream_end_capture(s[i], &graphs[i]));
        captured &= res == ncclSuccess;
        if (refused) {
            MP_EXPECT(res == ncclInvalidUsage, "a capture in the process of a leader that "
                      "shares its GPU gave %s", ncclGetErrorString(res));
            MP_EXPECT(strstr(mp_last_error(w->comm), "NCCLSHIM_RANK_LEADERS") != NULL,
                      "no clear message: \"%s\"", mp_last_error(w->comm));
        } else {
            MP_EXPECT(res == ncclSuccess, "a capture gave %s", ncclGetErrorString(res));
        }
    }
    /* Every rank captured every one (each leads a GPU or a share of its own): launched twice,
     * each sums twice (a power of the rank count, exact in floats for 2 and 4 ranks). */
    MP_CHECK_COMM(w->comm, ncclAllReduce(&captured, &captured, 1, ncclInt32, ncclSum, w->comm,
                                         NULL));
    if (captured == w->nranks) {
        float want = 1;
        for (int i = 0; i < nstreams; i++) {
            CUgraphExec exec = NULL;
            MP_CU(&st_cu, graph_instantiate(&exec, graphs[i], 0));
            for (int k = 0; k < 2; k++) {
                MP_CU(&st_cu, graph_launch(exec, s[i]));
                want *= (float)w->nranks;
            }
            MP_CU(&st_cu, stream_synchronize(s[i]));
            MP_CU(&st_cu, graph_exec_destroy(exec));
        }
        MP_EXPECT(st_check(x, ST_COUNT, want, 0, s[0], "graphs launched twice each") == 0,
                  "two launches of each captured all-reduce did not sum twice each");
    }
    for (int i = 0; i < nstreams; i++) {
        MP_CU(&st_cu, graph_destroy(graphs[i]));
        MP_CU(&st_cu, stream_destroy(s[i]));
    }
}

/* Review B6: all-reduces of growing sizes on -k buffers (staged where a leader of another
 * process touches them: registered or managed memory through pinned host memory, cudaMalloc
 * memory nobody registered through the device),
 * all made before the first call, called back to back on one stream with no wait between them:
 * staging areas grow (and leaders map them) while earlier calls' waits are queued. Run with
 * FAKE_CUDA_SYNC_STRICT=1: the double fails the test if anything then synchronizes the context
 * while one of them waits. The results are right. */
#define ST_STAGING_STEPS 4

static void
part_staging(const struct mp_world *w)
{
    CUstream s = st_stream();
    float *x[ST_STAGING_STEPS];
    size_t count[ST_STAGING_STEPS];

    for (int i = 0; i < ST_STAGING_STEPS; i++) {
        count[i] = (size_t)65536 << (2 * i); /* 256 KiB to 16 MiB */
        x[i] = st_buffer(count[i], (float)(w->rank + 1), 0, s);
    }
    MP_CU(&st_cu, stream_synchronize(s));
    mp_barrier(w->comm, w->nranks);
    for (int i = 0; i < ST_STAGING_STEPS; i++) {
        MP_CHECK_COMM(w->comm, ncclAllReduce(x[i], x[i], count[i], ncclFloat, ncclSum, w->comm,
                                             s));
    }
    const float sum = (float)(w->nranks * (w->nranks + 1) / 2);
    for (int i = 0; i < ST_STAGING_STEPS; i++) {
        MP_EXPECT(st_check(x[i], count[i], sum, 0, s, "an all-reduce through staging") == 0,
                  "the all-reduce of %zu floats is wrong", count[i]);
    }
    mp_barrier(w->comm, w->nranks);
    for (int i = 0; i < ST_STAGING_STEPS; i++) {
        mp_cuda_free(&st_cu, st_kind, x[i]);
    }
    MP_CU(&st_cu, stream_destroy(s));
}

/* Review B7: an all-reduce called (eager) on stream a, which first waits on a word of host
 * memory the test writes, then one captured on stream b and launched: b's host function posts
 * its group and writes arrive from the host while a's write of the older number is still
 * queued. Then rank 0 releases a last. Both results are right and nothing hangs: the captured
 * group's stream waits for the eager arrive first, so the leaders never take the eager
 * all-reduce's input before a copied it in. */
static void
part_overtake(const struct mp_world *w)
{
    CUstream a = st_stream(), b = st_stream();
    const float n = (float)w->nranks;
    /* ncclMemAlloc memory: mapped by the leaders, and free to go after the graph. */
    st_kind = MP_MEM_MEMALLOC;
    float *x = st_buffer(ST_COUNT, 0, 0, a), *ones = st_buffer(ST_COUNT, 1, 0, a);
    float *y = st_buffer(ST_COUNT, 1, 0, b);
    uint32_t *gate = aligned_alloc(4096, 4096);
    CUdeviceptr gate_dev;
    CUgraph graph;
    CUgraphExec exec;

    MP_ASSERT(gate != NULL, "out of memory");
    memset(gate, 0, 4096);
    MP_CU(&st_cu, host_register(gate, 4096, CU_MEMHOSTREGISTER_PORTABLE |
                                                 CU_MEMHOSTREGISTER_DEVICEMAP));
    MP_CU(&st_cu, host_get_device_pointer(&gate_dev, gate, 0));
    MP_CU(&st_cu, stream_synchronize(a));
    MP_CU(&st_cu, stream_synchronize(b));
    mp_barrier(w->comm, w->nranks);
    /* a: held, then its input copied in, then the all-reduce. */
    MP_CU(&st_cu, stream_wait_value32(a, gate_dev, 1, CU_STREAM_WAIT_VALUE_GEQ));
    MP_CU(&st_cu, memcpy_async((CUdeviceptr)(uintptr_t)x, (CUdeviceptr)(uintptr_t)ones,
                               ST_COUNT * sizeof(float), a));
    MP_CHECK_COMM(w->comm, ncclAllReduce(x, x, ST_COUNT, ncclFloat, ncclSum, w->comm, a));
    MP_CU(&st_cu, stream_begin_capture(b, CU_STREAM_CAPTURE_MODE_GLOBAL));
    MP_CHECK_COMM(w->comm, ncclAllReduce(y, y, ST_COUNT, ncclFloat, ncclSum, w->comm, b));
    MP_CU(&st_cu, stream_end_capture(b, &graph));
    MP_CU(&st_cu, graph_instantiate(&exec, graph, 0));
    MP_CU(&st_cu, graph_launch(exec, b));
    /* Every rank but 0 goes on at once; rank 0 a while later, so that without the wait its
     * host function's arrive would have let the others read x before a copied it in. */
    if (w->rank == 0) {
        usleep(300 * 1000);
    }
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    MP_EXPECT(st_check(x, ST_COUNT, n, 0, a, "the eager all-reduce held back") == 0,
              "an eager all-reduce held on its stream lost its input to a later captured one");
    MP_EXPECT(st_check(y, ST_COUNT, n, 0, b, "the captured all-reduce") == 0,
              "a captured all-reduce launched while an eager one was held is wrong");
    MP_CU(&st_cu, graph_exec_destroy(exec));
    MP_CU(&st_cu, graph_destroy(graph));
    MP_CU(&st_cu, host_unregister(gate));
    free(gate);
    mp_cuda_free(&st_cu, st_kind, x);
    mp_cuda_free(&st_cu, st_kind, ones);
    mp_cuda_free(&st_cu, st_kind, y);
    MP_CU(&st_cu, stream_destroy(a));
    MP_CU(&st_cu, stream_destroy(b));
}

static void
part_fp8(const struct mp_world *w)
{
    /* 1.0 and the sums 1..8 in float8 e4m3: all exact. */
    static const uint8_t e4m3_of[9] = {0x00, 0x38, 0x40, 0x44, 0x48, 0x4a, 0x4c, 0x4e, 0x50};
    CUstream s = st_stream();
    uint8_t ones[64], got[64];
    uint8_t *x = mp_cuda_alloc(&st_cu, MP_MEM_DEVICE, sizeof(ones));

    memset(ones, e4m3_of[1], sizeof(ones));
    mp_cuda_copy(&st_cu, x, ones, sizeof(ones), s);
    ncclResult_t res = ncclAllReduce(x, x, 64, ncclFloat8e4m3, ncclSum, w->comm, s);
    if (st_cu.compute_capability >= 90) {
        /* NCCL reduces fp8 from sm_90 on. */
        MP_EXPECT(res == ncclSuccess, "an fp8 all-reduce on compute capability %d gave %s",
                  st_cu.compute_capability, ncclGetErrorString(res));
        MP_ASSERT(w->nranks < 9, "fp8 part: at most 8 ranks");
        mp_cuda_copy(&st_cu, got, x, sizeof(got), s);
        for (int i = 0; i < 64; i++) {
            MP_EXPECT(got[i] == e4m3_of[w->nranks], "fp8 all-reduce: element %d is 0x%02x, "
                      "expected 0x%02x", i, got[i], e4m3_of[w->nranks]);
        }
    } else {
        MP_EXPECT(res == ncclInvalidArgument,
                  "an fp8 all-reduce on compute capability %d gave %s",
                  st_cu.compute_capability, ncclGetErrorString(res));
        MP_EXPECT(strstr(mp_last_error(w->comm), "fp8") != NULL, "no clear message: \"%s\"",
                  mp_last_error(w->comm));
    }
    MP_CHECK_COMM(w->comm, ncclBroadcast(x, x, 64, ncclFloat8e4m3, 0, w->comm, s));
    MP_CU(&st_cu, stream_synchronize(s));
}

int
main(int argc, char **argv)
{
    struct mp_world world;
    const char *part = "order";
    int opt, poster = 0, nstreams = 1, clique = 3;
    bool graph = false, host = false, revoke = false;

    while ((opt = getopt(argc, argv, "p:r:gk:n:HRS:X")) != -1) {
        if (opt == 'p') {
            part = optarg;
        } else if (opt == 'n') {
            clique = atoi(optarg);
        } else if (opt == 'S') {
            nstreams = atoi(optarg);
        } else if (opt == 'k') {
            st_kind = (enum mp_mem_kind)mp_mem_kind_parse(optarg);
        } else if (opt == 'r') {
            poster = atoi(optarg);
        } else if (opt == 'g') {
            graph = true;
        } else if (opt == 'H') {
            host = true;
        } else if (opt == 'R') {
            revoke = true;
        } else if (opt == 'X') {
            st_across = true;
        } else {
            fprintf(stderr, "usage: streams -p returns|order|group|grouporder|ppsend|devices|"
                            "refuse|memapi|churn|graph|graphfree|twographs|globalcapture|abort|"
                            "abortblocked|onequeuegraph|overtake|staging|fp8|unsupported|"
                            "hostonly|nodevice|suspend|grow|window|windowgroup|fault|leaderleft|"
                            "clique [-r POSTER] [-g] [-k KIND] [-H] [-R] [-S STREAMS] [-n RANKS] "
                            "[-X]\n");
            return 2;
        }
    }
    mp_cuda_init(&st_cu);
    if (strcmp(part, "devices") == 0 || strcmp(part, "nodevice") == 0 ||
        strcmp(part, "clique") == 0) {
        mp_rank_id = 0;
        if (part[0] == 'd') {
            part_devices();
        } else if (part[0] == 'c') {
            part_clique(clique);
        } else {
            part_nodevice();
        }
        printf("streams: %s, %d failed checks\n", part, mp_failures);
        return mp_failures == 0 ? 0 : 1;
    }
    if (strcmp(part, "hostonly") == 0) {
        MP_CU(&st_cu, ctx_set_current(NULL)); /* no current device when the comm is made */
    }
    mp_world_init(&world);
    if (strcmp(part, "returns") == 0) {
        part_returns(&world);
    } else if (strcmp(part, "order") == 0) {
        part_order(&world);
    } else if (strcmp(part, "group") == 0) {
        part_group(&world);
    } else if (strcmp(part, "grouporder") == 0) {
        part_grouporder(&world);
    } else if (strcmp(part, "ppsend") == 0) {
        part_ppsend(&world);
    } else if (strcmp(part, "refuse") == 0) {
        part_refuse(&world);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 32, 0)
    } else if (strcmp(part, "suspend") == 0) {
        part_suspend(&world);
    } else if (strcmp(part, "grow") == 0) {
        part_grow(&world);
    } else if (strcmp(part, "window") == 0) {
        part_window(&world);
    } else if (strcmp(part, "windowgroup") == 0) {
        part_windowgroup(&world);
#endif
    } else if (strcmp(part, "register") == 0) {
        part_register(&world, graph);
    } else if (strcmp(part, "memapi") == 0) {
        part_memapi(&world);
    } else if (strcmp(part, "churn") == 0) {
        part_churn(&world);
    } else if (strcmp(part, "graph") == 0) {
        part_graph(&world);
    } else if (strcmp(part, "graphfree") == 0) {
        part_graphfree(&world);
    } else if (strcmp(part, "twographs") == 0) {
        part_twographs(&world);
    } else if (strcmp(part, "globalcapture") == 0) {
        part_globalcapture(&world);
    } else if (strcmp(part, "capturelife") == 0) {
        part_capturelife(&world);
    } else if (strcmp(part, "torchp2p") == 0) {
        part_torchp2p(&world);
    } else if (strcmp(part, "abort") == 0) {
        part_abort(&world, poster, graph);
        world.comm = NULL;
    } else if (strcmp(part, "abortblocked") == 0) {
        part_abortblocked(&world, host, revoke);
        world.comm = NULL;
    } else if (strcmp(part, "onequeuegraph") == 0) {
        part_onequeuegraph(&world, nstreams);
    } else if (strcmp(part, "overtake") == 0) {
        part_overtake(&world);
    } else if (strcmp(part, "staging") == 0) {
        part_staging(&world);
    } else if (strcmp(part, "fault") == 0) {
        part_fault(&world);
        world.comm = NULL;
    } else if (strcmp(part, "leaderleft") == 0) {
        part_leaderleft(&world);
        world.comm = NULL;
    } else if (strcmp(part, "fp8") == 0) {
        part_fp8(&world);
    } else if (strcmp(part, "hostonly") == 0) {
        part_hostonly(&world);
    } else if (strcmp(part, "unsupported") == 0) {
        part_unsupported(&world);
    } else {
        fprintf(stderr, "streams: unknown part %s\n", part);
        return 2;
    }
    if (world.comm != NULL) {
        MP_CHECK(ncclCommDestroy(world.comm));
    }
    if (world.rank == 0) {
        printf("streams: %s, %d ranks, %d failed checks on rank 0\n", part, world.nranks,
               mp_failures);
    }
    return mp_failures == 0 ? 0 : 1;
}
