/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA layers against the driver's test double (test/doubles/fake_cuda, found through
 * LD_LIBRARY_PATH as make test-unit sets it): the driver table and its checked errors
 * (gpu/driver.c), memory kinds and ncclMemAlloc's allocations (gpu/memory.c), stream
 * ordering (gpu/stream.c): a gate holds later work until released, release only moves
 * forward, a group's fork and join order its streams, a capturing stream is refused; kernel
 * batches (kernels/device.c): any number of tasks, cut into launches, give the host
 * reductions' results; events belong to their context, and the current context's calls fail
 * on a thread that has none, as the driver has it; and the double's model of the driver where
 * the library's design depends on it: streams share hardware queues, allocations, frees and
 * the legacy NULL stream synchronize a context, host functions and user objects' destructors
 * share one thread.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/debug.h"
#include "doubles/fake_cuda/fake_cuda.h"
#include "eventually.h"
#include "gpu/memory.h"
#include "gpu_fixture.h"
#include "gpu/stream.h"
#include "kernels/device.h"

static CUstream
new_stream(void)
{
    CUstream s;
    cr_assert_eq(gpu_cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    return s;
}

/* A flag in registered host memory, as the device team keeps them. */
static struct gpu_flag
new_flag(uint32_t **host_out)
{
    uint32_t *host = aligned_alloc(4096, 4096);
    struct gpu_flag flag = {.host = host};

    memset(host, 0, 4096);
    cr_assert_eq(gpu_cu.cuMemHostRegister(host, 4096, CU_MEMHOSTREGISTER_PORTABLE |
                                                          CU_MEMHOSTREGISTER_DEVICEMAP),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemHostGetDevicePointer(&flag.dev, host, 0), CUDA_SUCCESS);
    *host_out = host;
    return flag;
}

/* Enqueues a copy of one int: after it ran, *dst == value. */
static void
enqueue_mark(CUstream s, int *dst, const int *value)
{
    cr_assert_eq(gpu_cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst,
                                      (CUdeviceptr)(uintptr_t)value, sizeof(int), s),
                 CUDA_SUCCESS);
}

static bool
stream_idle(CUstream s)
{
    return gpu_cu.cuStreamQuery(s) == CUDA_SUCCESS;
}

TestSuite(gpu, .init = setup, .fini = teardown);

Test(gpu, checked_calls_name_the_call_and_the_driver_error)
{
    shim_error_clear();
    ncclResult_t res = ncclSuccess;
    do {
        GPU_CU_CHECK_GOTO(cuMemFree((CUdeviceptr)0x1234), res, out);
    } while (0);
out:
    cr_assert_eq(res, ncclUnhandledCudaError);
    cr_assert(strstr(shim_error_last(NULL), "cuMemFree") != NULL, "%s", shim_error_last(NULL));
    cr_assert(strstr(shim_error_last(NULL), "CUDA_ERROR_INVALID_VALUE") != NULL, "%s",
              shim_error_last(NULL));
}

Test(gpu, memory_kinds)
{
    struct gpu_mem_info info;
    CUdeviceptr dev, managed;
    void *host = calloc(1, 256), *registered = aligned_alloc(4096, 4096), *shared = NULL;

    gpu_mem_query(host, &info);
    cr_assert_eq(info.kind, GPU_MEM_HOST);
    gpu_mem_query(NULL, &info);
    cr_assert_eq(info.kind, GPU_MEM_HOST);

    cr_assert_eq(gpu_cu.cuMemAlloc(&dev, 1000), CUDA_SUCCESS);
    gpu_mem_query((void *)(uintptr_t)(dev + 100), &info);
    cr_assert_eq(info.kind, GPU_MEM_DEVICE);
    cr_assert_eq(info.device, 0);
    cr_assert_eq(info.alloc_base, (uintptr_t)dev);
    cr_assert_eq(info.alloc_size, 1000);
    cr_assert(info.legacy_ipc && !info.fd_ipc);
    uint64_t first_id = info.alloc_id;
    cr_assert_neq(first_id, 0);

    /* Not an entry of the library's table (it never allocates managed memory). */
    __typeof__(cuMemAllocManaged) *alloc_managed = fake_fn("cuMemAllocManaged");
    cr_assert_not_null(alloc_managed);
    cr_assert_eq(alloc_managed(&managed, 64, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    gpu_mem_query((void *)(uintptr_t)managed, &info);
    cr_assert_eq(info.kind, GPU_MEM_MANAGED);

    cr_assert_eq(gpu_cu.cuMemHostRegister(registered, 4096, 0), CUDA_SUCCESS);
    gpu_mem_query(registered, &info);
    cr_assert_eq(info.kind, GPU_MEM_REGISTERED);
    cr_assert(gpu_mem_reachable(info.kind));

    /* ncclMemAlloc's memory: shareable as a file descriptor, a mapping of its own. */
    cr_assert_eq(gpu_mem_alloc(5000, &shared), ncclSuccess);
    gpu_mem_query(shared, &info);
    cr_assert_eq(info.kind, GPU_MEM_DEVICE);
    cr_assert(info.fd_ipc && !info.legacy_ipc);
    uintptr_t base;
    size_t size;
    uint64_t id;
    cr_assert_eq(gpu_mem_mapping((uint8_t *)shared + 17, &base, &size, &id), ncclSuccess);
    cr_assert_eq(base, (uintptr_t)shared);
    cr_assert_geq(size, 5000);
    cr_assert_eq(gpu_mem_free(shared), ncclSuccess);
    cr_assert_eq(gpu_mem_free(shared), ncclInvalidArgument, "freed twice");
    cr_assert_eq(gpu_mem_free(host), ncclInvalidArgument, "not ncclMemAlloc's");

    /* Memory freed and allocated again is a new allocation, whatever its address. */
    cr_assert_eq(gpu_cu.cuMemFree(dev), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAlloc(&dev, 1000), CUDA_SUCCESS);
    gpu_mem_query((void *)(uintptr_t)dev, &info);
    cr_assert_neq(info.alloc_id, first_id);

    gpu_cu.cuMemFree(dev);
    gpu_cu.cuMemFree(managed);
    gpu_cu.cuMemHostUnregister(registered);
    free(registered);
    free(host);
}

/* A gate: post arrive, wait done. Work after it waits until done is released. */
Test(gpu, a_gate_holds_later_work_until_released)
{
    uint32_t *words;
    struct gpu_flag arrive = new_flag(&words);
    struct gpu_flag done = {.host = words + 16, .dev = arrive.dev + 64};
    CUstream s = new_stream();
    static int mark, one = 1;

    mark = 0;
    cr_assert_eq(gpu_stream_post_flag(s, &arrive, 5), ncclSuccess);
    cr_assert_eq(gpu_stream_wait_flag(s, &done, 5), ncclSuccess);
    enqueue_mark(s, &mark, &one);
    EVENTUALLY(gpu_flag_reached(&arrive, 5));
    usleep(20000);
    cr_assert_eq(mark, 0, "work after the gate ran before done");
    cr_assert(!stream_idle(s));
    gpu_flag_release(&done, 4);
    usleep(20000);
    cr_assert_eq(mark, 0, "a release short of the gate opened it");
    gpu_flag_release(&done, 5);
    EVENTUALLY(stream_idle(s));
    cr_assert_eq(mark, 1);
    gpu_cu.cuStreamDestroy(s);
    gpu_cu.cuMemHostUnregister(words);
    free(words);
}

/* How many waits the double was given with CU_STREAM_WAIT_VALUE_FLUSH (-1 on a real driver). */
static long
flush_waits(void)
{
    void (*get_stats)(struct fake_cuda_stats *) = fake_fn("fake_cuda_get_stats");
    struct fake_cuda_stats stats;

    if (get_stats == NULL) {
        return -1;
    }
    get_stats(&stats);
    return stats.flush_waits;
}

/* Where the device cannot flush remote writes (an H100 on x86, as the double is by default),
 * a wait asks for no flush: the driver would refuse it (CUDA_ERROR_NOT_SUPPORTED). */
Test(gpu, waits_ask_no_flush_where_the_device_cannot)
{
    uint32_t *words;
    struct gpu_flag flag = new_flag(&words);
    CUstream s = new_stream();
    long before = flush_waits();

    cr_assert(!device->can_flush);
    cr_assert_eq(gpu_stream_wait_flag(s, &flag, 0), ncclSuccess);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(s), CUDA_SUCCESS);
    cr_assert_eq(flush_waits(), before);
    gpu_cu.cuStreamDestroy(s);
    gpu_cu.cuMemHostUnregister(words);
    free(words);
}

/* Where it can (FAKE_CUDA_FLUSH_REMOTE_WRITES=1), every wait flushes: what a peer GPU wrote
 * before the flag is visible to the work after the wait (review B8, stream.c). */
static void
flushing(void)
{
    setenv("FAKE_CUDA_FLUSH_REMOTE_WRITES", "1", 1); /* before the double reads its settings */
    setup();
}

Test(gpu_flush, waits_flush_remote_writes_where_the_device_can, .init = flushing,
     .fini = teardown)
{
    uint32_t *words;
    struct gpu_flag flag = new_flag(&words);
    CUstream s = new_stream();
    long before = flush_waits();

    if (before < 0) {
        cr_skip_test("a real driver: the double counts the flushing waits");
    }
    cr_assert(device->can_flush);
    cr_assert_eq(gpu_stream_wait_flag(s, &flag, 0), ncclSuccess);
    cr_assert_eq(gpu_stream_wait_flag(NULL, &flag, 0), ncclSuccess, "the legacy stream");
    cr_assert_eq(gpu_cu.cuStreamSynchronize(s), CUDA_SUCCESS);
    cr_assert_eq(flush_waits(), before + 2, "a wait without CU_STREAM_WAIT_VALUE_FLUSH");
    gpu_cu.cuStreamDestroy(s);
    gpu_cu.cuMemHostUnregister(words);
    free(words);
}

/* Release never moves a flag back, and compares cyclically across the wrap. */
Test(gpu, release_only_moves_forward)
{
    uint32_t word = 10;
    struct gpu_flag flag = {.host = &word};

    gpu_flag_release(&flag, 7);
    cr_assert_eq(word, 10);
    gpu_flag_release(&flag, 12);
    cr_assert_eq(word, 12);
    word = UINT32_MAX - 1;
    gpu_flag_release(&flag, 3); /* past the wrap: forward */
    cr_assert_eq(word, 3);
    cr_assert(gpu_flag_reached(&flag, UINT32_MAX));
    cr_assert(!gpu_flag_reached(&flag, 4));
}

/* fork: streams[0] waits for the others' earlier work; join: the others wait for it. */
Test(gpu, fork_and_join_order_a_groups_streams)
{
    uint32_t *words;
    struct gpu_flag hold = new_flag(&words);
    CUstream a = new_stream(), b = new_stream();
    struct gpu_stream_set set = {.ctx = device->ctx};
    static int mark_a, mark_b, one = 1;

    mark_a = mark_b = 0;
    cr_assert_eq(gpu_stream_set_add(&set, a), ncclSuccess);
    cr_assert_eq(gpu_stream_set_add(&set, b), ncclSuccess);
    cr_assert_eq(gpu_stream_set_add(&set, a), ncclSuccess);
    cr_assert_eq(set.n, 2, "a stream is in a set once");

    /* b is busy (held); after the fork, a's group work must wait for it. */
    cr_assert_eq(gpu_stream_wait_flag(b, &hold, 1), ncclSuccess);
    cr_assert_eq(gpu_streams_fork(&set), ncclSuccess);
    enqueue_mark(a, &mark_a, &one);
    usleep(20000);
    cr_assert_eq(mark_a, 0, "the group ran before another stream's earlier work");
    gpu_flag_release(&hold, 1);
    EVENTUALLY(mark_a == 1);

    /* a is busy in the group; after the join, b's later work must wait for it. */
    cr_assert_eq(gpu_stream_wait_flag(a, &hold, 2), ncclSuccess);
    cr_assert_eq(gpu_streams_join(&set), ncclSuccess);
    enqueue_mark(b, &mark_b, &one);
    usleep(20000);
    cr_assert_eq(mark_b, 0, "work after the group ran before the group was done");
    gpu_flag_release(&hold, 2);
    EVENTUALLY(mark_b == 1);
    gpu_cu.cuStreamDestroy(a);
    gpu_cu.cuStreamDestroy(b);
    gpu_cu.cuMemHostUnregister(words);
    free(words);
}

Test(gpu, a_capturing_stream_is_told)
{
    void (*set_capturing)(CUstream, int) = fake_fn("fake_cuda_set_capturing");
    CUstream s = new_stream();
    CUcontext ctx;

    if (set_capturing == NULL) {
        cr_skip_test("a real driver: capture is tested on the GPU machine");
    }
    cr_assert_eq(gpu_stream_ctx(s, 0, &ctx), ncclSuccess);
    cr_assert_eq(ctx, device->ctx);
    bool capturing = true;
    cr_assert_eq(gpu_stream_capturing(s, ctx, &capturing), ncclSuccess);
    cr_assert(!capturing);
    set_capturing(s, 1);
    cr_assert_eq(gpu_stream_capturing(s, ctx, &capturing), ncclSuccess);
    cr_assert(capturing);
    set_capturing(s, 0);
    /* NULL: the legacy stream of the fallback device's primary context. */
    cr_assert_eq(gpu_stream_ctx(NULL, 0, &ctx), ncclSuccess);
    cr_assert_eq(ctx, device->ctx);
    gpu_cu.cuStreamDestroy(s);
}

/* A user object's destructor, as the device team's captured groups have one: it records
 * that it ran, and what a CUDA call made from it gets. */
static CUresult user_destroy_call;

static void CUDA_CB
user_destroy(void *arg)
{
    CUdeviceptr p = 0;
    user_destroy_call = gpu_cu.cuMemAlloc(&p, 64);
    __atomic_store_n((int *)arg, 1, __ATOMIC_RELEASE);
}

/* cuUserObjectCreate, cuGraphRetainUserObject and cuStreamGetCaptureInfo as cuda.h has them:
 * the one flag required, a reference count of at least one, the graph being captured; the
 * destructor runs once the graph, its instantiation and a launch in flight all let go, and a
 * CUDA call from it is refused ("cannot make CUDA API calls"). */
Test(gpu, a_user_object_goes_with_its_graph_and_its_launches)
{
    CUresult (*begin)(CUstream, CUstreamCaptureMode) = fake_fn("cuStreamBeginCapture_v2");
    CUresult (*end)(CUstream, CUgraph *) = fake_fn("cuStreamEndCapture");
    CUresult (*instantiate)(CUgraphExec *, CUgraph, unsigned long long) =
        fake_fn("cuGraphInstantiateWithFlags");
    CUresult (*launch)(CUgraphExec, CUstream) = fake_fn("cuGraphLaunch");
    CUresult (*exec_destroy)(CUgraphExec) = fake_fn("cuGraphExecDestroy");
    CUresult (*graph_destroy)(CUgraph) = fake_fn("cuGraphDestroy");
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    CUgraph captured = NULL, graph = NULL;
    CUgraphExec exec = NULL;
    CUuserObject object;
    uint32_t *gate_host, *mark_host;
    int gone = 0;

    if (fake_fn("fake_cuda_set_capturing") == NULL) {
        cr_skip_test("a real driver: graphs are tested on the GPU machine");
    }
    cr_assert_eq(gpu_cu.cuUserObjectCreate(&object, &gone, user_destroy, 1, 0),
                 CUDA_ERROR_INVALID_VALUE, "the one defined flag is required");
    cr_assert_eq(gpu_cu.cuUserObjectCreate(&object, &gone, user_destroy, 0,
                                           CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
                 CUDA_ERROR_INVALID_VALUE, "a reference count of zero");
    /* "undefined behavior to release references not owned by the caller": refused. */
    int other = 0;
    cr_assert_eq(gpu_cu.cuUserObjectCreate(&object, &other, user_destroy, 1,
                                           CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuUserObjectRelease(object, 2), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(gpu_cu.cuUserObjectRelease(object, 1), CUDA_SUCCESS);
    EVENTUALLY(__atomic_load_n(&other, __ATOMIC_ACQUIRE) == 1);
    struct gpu_flag gate = new_flag(&gate_host), mark = new_flag(&mark_host);
    CUstream s = new_stream();
    cr_assert_eq(gpu_cu.cuStreamGetCaptureInfo(s, NULL, NULL, &captured, NULL, NULL),
                 CUDA_ERROR_INVALID_VALUE, "the status is required");
    cr_assert_eq(gpu_cu.cuStreamGetCaptureInfo(s, &status, NULL, &captured, NULL, NULL),
                 CUDA_SUCCESS);
    cr_assert_eq(status, CU_STREAM_CAPTURE_STATUS_NONE);
    cr_assert_eq(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    cr_assert_eq(gpu_stream_wait_flag(s, &gate, 1), ncclSuccess);
    cr_assert_eq(gpu_stream_post_flag(s, &mark, 1), ncclSuccess);
    cr_assert_eq(gpu_cu.cuStreamGetCaptureInfo(s, &status, NULL, &captured, NULL, NULL),
                 CUDA_SUCCESS);
    cr_assert_eq(status, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    cr_assert_eq(gpu_cu.cuUserObjectCreate(&object, &gone, user_destroy, 1,
                                           CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuGraphRetainUserObject(captured, object, 1, 7),
                 CUDA_ERROR_INVALID_VALUE, "an undefined flag");
    cr_assert_eq(gpu_cu.cuGraphRetainUserObject(captured, object, 1,
                                                CU_GRAPH_USER_OBJECT_MOVE),
                 CUDA_SUCCESS);
    cr_assert_eq(end(s, &graph), CUDA_SUCCESS);
    cr_assert_eq(graph, captured);
    cr_assert_eq(instantiate(&exec, graph, 0), CUDA_SUCCESS);
    cr_assert_eq(launch(exec, s), CUDA_SUCCESS);
    cr_assert_eq(exec_destroy(exec), CUDA_SUCCESS);
    cr_assert_eq(graph_destroy(graph), CUDA_SUCCESS);
    usleep(50 * 1000);
    cr_assert_eq(__atomic_load_n(&gone, __ATOMIC_ACQUIRE), 0,
                 "the destructor ran while a launch of the graph was still waiting");
    __atomic_store_n(gate_host, 1, __ATOMIC_RELEASE);
    EVENTUALLY(__atomic_load_n(&gone, __ATOMIC_ACQUIRE) == 1);
    cr_assert_eq(__atomic_load_n(mark_host, __ATOMIC_ACQUIRE), 1u);
    cr_assert_eq(user_destroy_call, CUDA_ERROR_NOT_PERMITTED,
                 "a CUDA call from a user object's destructor was let through");
    cr_assert_eq(gpu_cu.cuStreamSynchronize(s), CUDA_SUCCESS);
    gpu_cu.cuStreamDestroy(s);
    gpu_cu.cuMemHostUnregister(gate_host);
    gpu_cu.cuMemHostUnregister(mark_host);
    free(gate_host);
    free(mark_host);
}

/* More tasks, operands and destinations than one launch holds, against the host's result. */
Test(gpu, batches_of_any_size_give_the_host_reductions)
{
    enum { TASKS = 150, NSRC = 5, COUNT = 37 };
    static float src[TASKS][NSRC][COUNT], dst[TASKS][2][COUNT], want[COUNT];
    struct kr_redop op = {.kind = KR_PREMULSUM, .type = ncclFloat32};
    struct kr_dev_launch l;
    CUstream s = new_stream();

    if (!kr_dev_available()) {
        cr_skip_test("built without nvcc: no kernels to launch");
    }
    float scalar = 0.5f;
    for (int t = 0; t < TASKS; t++) {
        for (int k = 0; k < NSRC; k++) {
            for (int i = 0; i < COUNT; i++) {
                src[t][k][i] = (float)(t * 7 + k * 3 + i) * 0.25f;
            }
        }
    }
    memset(dst, 0, sizeof(dst));
    kr_dev_begin(&l, s, device, &op);
    for (int t = 0; t < TASKS; t++) {
        struct kr_dev_src srcs[NSRC];
        uint64_t dsts[2] = {(uintptr_t)dst[t][0], (uintptr_t)dst[t][1]};
        for (int k = 0; k < NSRC; k++) {
            /* Each operand its own scalar, on every other operand. */
            srcs[k] = (struct kr_dev_src){.ptr = (uintptr_t)src[t][k], .pre = k % 2};
            memcpy(&srcs[k].scalar, &scalar, sizeof(scalar));
        }
        cr_assert_eq(kr_dev_add(&l, srcs, NSRC, dsts, 2, COUNT), ncclSuccess);
    }
    cr_assert_eq(kr_dev_end(&l), ncclSuccess);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(s), CUDA_SUCCESS);
    for (int t = 0; t < TASKS; t++) {
        struct kr_redop pre = op;
        memcpy(pre.scalar, &scalar, sizeof(scalar));
        memcpy(want, src[t][0], sizeof(want));
        for (int k = 1; k < NSRC; k++) {
            /* acc = acc + pre_k(src_k), operand by operand, as the contract says. */
            kr_reduce_host(want, want, src[t][k], COUNT, &pre, k % 2 ? KR_PRE_B : 0);
        }
        cr_assert_arr_eq(dst[t][0], want, sizeof(want), "task %d", t);
        cr_assert_arr_eq(dst[t][1], want, sizeof(want), "task %d, second destination", t);
    }
    gpu_cu.cuStreamDestroy(s);
}

/* Events belong to a context, as cuda.h says: made in the current one, recorded only on its
 * streams. The double answers as the driver does, so the library's records across the gates
 * (the device team's and the network path's events) are checked where it runs. */
static void
two_devices(void)
{
    setenv("FAKE_CUDA_DEVICES", "2", 1); /* before the double reads its settings */
    cr_assert(gpu_driver_present(), "no driver: run with LD_LIBRARY_PATH=build/test/doubles");
}

Test(gpu_events, belong_to_the_context_they_were_made_in, .init = two_devices)
{
    const struct gpu_device *d0, *d1;
    CUevent event;
    CUstream stream;

    cr_assert_eq(gpu_device_get(0, &d0), ncclSuccess);
    cr_assert_eq(gpu_device_get(1, &d1), ncclSuccess, "FAKE_CUDA_DEVICES=2 gave one device");
    cr_assert_eq(gpu_cu.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING),
                 CUDA_ERROR_INVALID_CONTEXT, "an event made without a current context");
    cr_assert_eq(gpu_ctx_push(d1->ctx), ncclSuccess);
    cr_assert_eq(gpu_cu.cuEventCreate(&event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    gpu_ctx_pop();
    cr_assert_eq(gpu_ctx_push(d0->ctx), ncclSuccess);
    cr_assert_eq(gpu_cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuEventRecord(event, stream), CUDA_ERROR_INVALID_HANDLE,
                 "an event of device 1's context recorded on a stream of device 0's");
    /* Waiting on another context's event is allowed. */
    cr_assert_eq(gpu_cu.cuStreamWaitEvent(stream, event, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(stream), CUDA_SUCCESS);
    gpu_cu.cuStreamDestroy(stream);
    gpu_ctx_pop();
    gpu_cu.cuEventDestroy(event);
}

/* A call that works in the current context fails on a thread that has none, as cuda.h has
 * it (CUDA_ERROR_INVALID_CONTEXT), so that a library call made from a thread of its own
 * (a group's, a leader's) without pushing one fails here as on a GPU; calls that name their
 * object, and pointer attribute queries, need none. */
static void
no_context(void)
{
    cr_assert(gpu_driver_present(), "no driver: run with LD_LIBRARY_PATH=build/test/doubles");
    cr_assert_eq(gpu_device_get(0, &device), ncclSuccess);
}

Test(gpu_contexts, the_current_contexts_calls_fail_without_one, .init = no_context)
{
    CUdeviceptr dev = 0, base = 0, opened = 0;
    size_t size = 0;
    unsigned long long id = 0;
    CUipcMemHandle handle;
    void *mem = NULL;
    uint32_t *host = aligned_alloc(4096, 4096);
    __typeof__(cuMemAllocManaged) *alloc_managed = fake_fn("cuMemAllocManaged");

    cr_assert_eq(gpu_device_current(), -1, "the test's thread starts with a context");
    cr_assert_eq(gpu_ctx_push(device->ctx), ncclSuccess);
    cr_assert_eq(gpu_cu.cuMemAlloc(&dev, 4096), CUDA_SUCCESS);
    cr_assert_eq(gpu_mem_alloc(4096, &mem), ncclSuccess);
    gpu_ctx_pop();

    cr_assert_eq(gpu_cu.cuMemAlloc(&opened, 4096), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(alloc_managed(&opened, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(gpu_cu.cuMemGetAddressRange(&base, &size, dev), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(gpu_cu.cuIpcGetMemHandle(&handle, dev), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(gpu_cu.cuIpcOpenMemHandle(&opened, handle, 0), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(gpu_cu.cuIpcCloseMemHandle(dev), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(gpu_cu.cuMemHostRegister(host, 4096, CU_MEMHOSTREGISTER_PORTABLE),
                 CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(gpu_cu.cuModuleUnload(NULL), CUDA_ERROR_INVALID_CONTEXT);
    cr_assert_eq(gpu_cu.cuMemFree(dev), CUDA_ERROR_INVALID_CONTEXT);
    /* Pointer attributes (but DEVICE_POINTER) and the cuMem calls need none: ncclMemFree
     * unmaps from any thread. */
    struct gpu_mem_info info;
    gpu_mem_query(mem, &info);
    cr_assert_eq(info.kind, GPU_MEM_DEVICE);
    cr_assert(info.fd_ipc);
    cr_assert_eq(gpu_cu.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, dev),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_mem_free(mem), ncclSuccess);

    cr_assert_eq(gpu_ctx_push(device->ctx), ncclSuccess);
    cr_assert_eq(gpu_cu.cuMemGetAddressRange(&base, &size, dev), CUDA_SUCCESS);
    cr_assert_eq(base, dev);
    cr_assert_eq(gpu_cu.cuMemFree(dev), CUDA_SUCCESS);
    gpu_ctx_pop();
    free(host);
}

/* --- the double's hardware queues, implicit synchronization and callback thread ---------- */

/* CUDA_DEVICE_MAX_CONNECTIONS as the driver has it by default (8), whatever the environment
 * says, before the double reads it. */
static void
eight_queues(void)
{
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8", 1);
    setup();
}

/* What `call` wrote on stderr (the double's complaints), as a string the caller frees. */
static char *
stderr_of(void (*call)(void *), void *arg)
{
    FILE *tmp = tmpfile();
    int saved = dup(2);
    char *text = calloc(1, 4096);

    cr_assert(tmp != NULL && saved >= 0 && text != NULL);
    fflush(stderr);
    dup2(fileno(tmp), 2);
    call(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(text, 1, 4095, tmp);
    text[n] = '\0';
    fclose(tmp);
    return text;
}

/* Streams share a context's 8 queues in the order they are made (the double's choice: the
 * driver's is unspecified): the eighth stream made after a stream shares its queue, and a wait
 * on that stream holds up the other's work enqueued after it, while a stream of another queue
 * runs. */
Test(gpu_model, a_waiting_stream_holds_up_its_queue, .init = eight_queues, .fini = teardown,
     .timeout = 30)
{
    uint32_t *words;
    struct gpu_flag hold = new_flag(&words);
    CUstream a = new_stream(), others[8];
    static int mark_same, mark_other, one = 1;

    mark_same = mark_other = 0;
    for (int i = 0; i < 8; i++) {
        others[i] = new_stream();
    }
    cr_assert_eq(gpu_stream_wait_flag(a, &hold, 1), ncclSuccess);
    enqueue_mark(others[7], &mark_same, &one);
    enqueue_mark(others[0], &mark_other, &one);
    EVENTUALLY(__atomic_load_n(&mark_other, __ATOMIC_ACQUIRE) == 1);
    usleep(20000);
    cr_assert_eq(__atomic_load_n(&mark_same, __ATOMIC_ACQUIRE), 0,
                 "work of a stream sharing a waiting stream's queue ran past the wait");
    gpu_flag_release(&hold, 1);
    EVENTUALLY(__atomic_load_n(&mark_same, __ATOMIC_ACQUIRE) == 1);
    for (int i = 0; i < 8; i++) {
        gpu_cu.cuStreamDestroy(others[i]);
    }
    gpu_cu.cuStreamDestroy(a);
    gpu_cu.cuMemHostUnregister(words);
    free(words);
}

static void
alloc_some(void *arg)
{
    cr_assert_eq(gpu_cu.cuMemAlloc((CUdeviceptr *)arg, 256), CUDA_SUCCESS);
}

static int host_fn_may_go;

static void CUDA_CB
waiting_host_fn(void *arg)
{
    (void)arg;
    while (!__atomic_load_n(&host_fn_may_go, __ATOMIC_ACQUIRE)) {
        usleep(100);
    }
}

/* A device allocation is a barrier of its context: work enqueued after it on any stream waits
 * for all work enqueued before it (here a host function that has not returned yet), while work
 * enqueued before it runs. (Behind a stream memory wait not met it does not even return:
 * test_fake_cuda's fake_cuda_sync tests.) */
Test(gpu_model, an_allocation_synchronizes_the_context, .init = eight_queues, .fini = teardown,
     .timeout = 30)
{
    CUstream a = new_stream(), b = new_stream();
    static int before, after, one = 1;
    CUdeviceptr p = 0;

    before = after = host_fn_may_go = 0;
    cr_assert_eq(gpu_cu.cuLaunchHostFunc(a, waiting_host_fn, NULL), CUDA_SUCCESS);
    enqueue_mark(b, &before, &one);
    char *said = stderr_of(alloc_some, &p);
    cr_assert_str_empty(said, "a complaint of a barrier over a host function: \"%s\"", said);
    free(said);
    enqueue_mark(b, &after, &one);
    EVENTUALLY(__atomic_load_n(&before, __ATOMIC_ACQUIRE) == 1);
    usleep(20000);
    cr_assert_eq(__atomic_load_n(&after, __ATOMIC_ACQUIRE), 0,
                 "work enqueued after an allocation ran before work enqueued before it");
    __atomic_store_n(&host_fn_may_go, 1, __ATOMIC_RELEASE);
    EVENTUALLY(__atomic_load_n(&after, __ATOMIC_ACQUIRE) == 1);
    gpu_cu.cuMemFree(p);
    gpu_cu.cuStreamDestroy(a);
    gpu_cu.cuStreamDestroy(b);
}

struct free_call {
    CUcontext ctx;
    CUdeviceptr p;
    int returned;
};

static void *
free_main(void *arg)
{
    struct free_call *f = arg;

    gpu_ctx_push(f->ctx);
    gpu_cu.cuMemFree(f->p);
    gpu_ctx_pop();
    __atomic_store_n(&f->returned, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* cuMemFree returns once the context's earlier work is done (cudaFree synchronizes). */
Test(gpu_model, a_free_waits_for_the_contexts_work, .init = eight_queues, .fini = teardown,
     .timeout = 30)
{
    uint32_t *words;
    struct gpu_flag hold = new_flag(&words);
    CUstream a = new_stream();
    struct free_call f = {.ctx = device->ctx};
    pthread_t thread;
    FILE *quiet = freopen("/dev/null", "w", stderr); /* its complaint: the test above */

    cr_assert(quiet != NULL);
    cr_assert_eq(gpu_cu.cuMemAlloc(&f.p, 256), CUDA_SUCCESS);
    cr_assert_eq(gpu_stream_wait_flag(a, &hold, 1), ncclSuccess);
    cr_assert_eq(pthread_create(&thread, NULL, free_main, &f), 0);
    usleep(20000);
    cr_assert_eq(__atomic_load_n(&f.returned, __ATOMIC_ACQUIRE), 0,
                 "cuMemFree returned while earlier work of its context waited");
    gpu_flag_release(&hold, 1);
    EVENTUALLY(__atomic_load_n(&f.returned, __ATOMIC_ACQUIRE) == 1);
    pthread_join(thread, NULL);
    gpu_cu.cuStreamDestroy(a);
    gpu_cu.cuMemHostUnregister(words);
    free(words);
}

/* The legacy NULL stream's work runs after the earlier work of the blocking streams and
 * before their later work; a stream made CU_STREAM_NON_BLOCKING takes no part. */
Test(gpu_model, the_null_stream_waits_for_blocking_streams_only, .init = eight_queues,
     .fini = teardown, .timeout = 30)
{
    uint32_t *words;
    struct gpu_flag hold = new_flag(&words);
    struct gpu_flag hold_nb = {.host = words + 16, .dev = hold.dev + 64};
    CUstream blocking, nonblocking = new_stream();
    static int on_null, after, one = 1;

    on_null = after = 0;
    cr_assert_eq(gpu_cu.cuStreamCreate(&blocking, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    cr_assert_eq(gpu_stream_wait_flag(nonblocking, &hold_nb, 1), ncclSuccess);
    cr_assert_eq(gpu_stream_wait_flag(blocking, &hold, 1), ncclSuccess);
    enqueue_mark(CU_STREAM_LEGACY, &on_null, &one);
    enqueue_mark(blocking, &after, &one);
    usleep(20000);
    cr_assert_eq(__atomic_load_n(&on_null, __ATOMIC_ACQUIRE), 0,
                 "the NULL stream ran before a blocking stream's earlier work");
    gpu_flag_release(&hold, 1);
    EVENTUALLY(__atomic_load_n(&on_null, __ATOMIC_ACQUIRE) == 1);
    EVENTUALLY(__atomic_load_n(&after, __ATOMIC_ACQUIRE) == 1);
    cr_assert(!stream_idle(nonblocking), "the non-blocking stream's wait was never released");
    gpu_flag_release(&hold_nb, 1);
    EVENTUALLY(stream_idle(nonblocking));
    gpu_cu.cuStreamDestroy(blocking);
    gpu_cu.cuStreamDestroy(nonblocking);
    gpu_cu.cuMemHostUnregister(words);
    free(words);
}

/* Host functions and user objects' destructors run on one thread of the process, one at a
 * time, in the order they are due: a destructor that blocks holds up a later host function,
 * whose stream waits for it. */
static pthread_t callback_threads[2];
static int destructor_may_go, host_fn_ran;

static void CUDA_CB
blocking_destructor(void *arg)
{
    (void)arg;
    callback_threads[0] = pthread_self();
    while (!__atomic_load_n(&destructor_may_go, __ATOMIC_ACQUIRE)) {
        usleep(100);
    }
}

static void CUDA_CB
marking_host_fn(void *arg)
{
    (void)arg;
    callback_threads[1] = pthread_self();
    __atomic_store_n(&host_fn_ran, 1, __ATOMIC_RELEASE);
}

Test(gpu_model, callbacks_share_one_thread, .init = eight_queues, .fini = teardown,
     .timeout = 30)
{
    CUstream s = new_stream();
    CUuserObject object;

    if (fake_fn("fake_cuda_set_capturing") == NULL) {
        cr_skip_test("a real driver: its callback thread is its own");
    }
    destructor_may_go = host_fn_ran = 0;
    cr_assert_eq(gpu_cu.cuUserObjectCreate(&object, NULL, blocking_destructor, 1,
                                           CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuUserObjectRelease(object, 1), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuLaunchHostFunc(s, marking_host_fn, NULL), CUDA_SUCCESS);
    usleep(20000);
    cr_assert_eq(__atomic_load_n(&host_fn_ran, __ATOMIC_ACQUIRE), 0,
                 "a host function ran while a destructor due before it was still running");
    cr_assert(!stream_idle(s));
    __atomic_store_n(&destructor_may_go, 1, __ATOMIC_RELEASE);
    EVENTUALLY(__atomic_load_n(&host_fn_ran, __ATOMIC_ACQUIRE) == 1);
    EVENTUALLY(stream_idle(s));
    cr_assert(pthread_equal(callback_threads[0], callback_threads[1]),
              "the destructor and the host function ran on different threads");
    gpu_cu.cuStreamDestroy(s);
}

/* Review B4's shape, as the double has it: a thread holds a lock across cuMemFree, which
 * returns only once its context's earlier work is done, a host function among it; the host
 * function waits for the callback thread, which runs a destructor that wants the lock. Each
 * waits for the next: the free does not return, the host function does not run, for as long
 * as the destructor waits (here it gives up when the test says so; one that does not is a
 * deadlock). So no host function or destructor of the library may take a lock that a thread
 * holds across a driver call (cudaipc/areas.c, hostpost.c). */
static pthread_mutex_t b4_lock = PTHREAD_MUTEX_INITIALIZER;
static int b4_destructor_started, b4_destructor_locked, b4_give_up;

static bool
b4_lock_held(void)
{
    if (pthread_mutex_trylock(&b4_lock) != 0) {
        return true;
    }
    pthread_mutex_unlock(&b4_lock);
    return false;
}

static void CUDA_CB
locking_destructor(void *arg)
{
    (void)arg;
    __atomic_store_n(&b4_destructor_started, 1, __ATOMIC_RELEASE);
    while (pthread_mutex_trylock(&b4_lock) != 0) {
        if (__atomic_load_n(&b4_give_up, __ATOMIC_ACQUIRE)) {
            return;
        }
        usleep(100);
    }
    __atomic_store_n(&b4_destructor_locked, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&b4_lock);
}

static void *
free_holding_lock_main(void *arg)
{
    pthread_mutex_lock(&b4_lock);
    free_main(arg);
    pthread_mutex_unlock(&b4_lock);
    return NULL;
}

Test(gpu_model, a_callback_waiting_for_a_lock_held_across_a_blocking_call_stalls_it,
     .init = eight_queues, .fini = teardown, .timeout = 30)
{
    CUstream s = new_stream();
    CUuserObject object;
    struct free_call f = {.ctx = device->ctx};
    pthread_t thread;
    uint32_t *words;
    struct gpu_flag hold = new_flag(&words);
    FILE *quiet = freopen("/dev/null", "w", stderr); /* the free's complaint: tested above */

    if (fake_fn("fake_cuda_set_capturing") == NULL) {
        cr_skip_test("a real driver: its callback thread is its own");
    }
    cr_assert(quiet != NULL);
    host_fn_ran = b4_destructor_started = b4_destructor_locked = b4_give_up = 0;
    cr_assert_eq(gpu_cu.cuMemAlloc(&f.p, 256), CUDA_SUCCESS);
    /* The host function waits behind a flag, so the free finds it not run yet. */
    cr_assert_eq(gpu_stream_wait_flag(s, &hold, 1), ncclSuccess);
    cr_assert_eq(gpu_cu.cuLaunchHostFunc(s, marking_host_fn, NULL), CUDA_SUCCESS);
    cr_assert_eq(pthread_create(&thread, NULL, free_holding_lock_main, &f), 0);
    EVENTUALLY(b4_lock_held());
    cr_assert_eq(gpu_cu.cuUserObjectCreate(&object, NULL, locking_destructor, 1,
                                           CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuUserObjectRelease(object, 1), CUDA_SUCCESS);
    EVENTUALLY(__atomic_load_n(&b4_destructor_started, __ATOMIC_ACQUIRE) == 1);
    gpu_flag_release(&hold, 1);
    usleep(50000);
    cr_assert_eq(__atomic_load_n(&f.returned, __ATOMIC_ACQUIRE), 0,
                 "cuMemFree returned before a host function enqueued before it ran");
    cr_assert_eq(__atomic_load_n(&host_fn_ran, __ATOMIC_ACQUIRE), 0,
                 "a host function ran while a destructor due before it waited for a lock");
    __atomic_store_n(&b4_give_up, 1, __ATOMIC_RELEASE);
    EVENTUALLY(__atomic_load_n(&host_fn_ran, __ATOMIC_ACQUIRE) == 1);
    EVENTUALLY(__atomic_load_n(&f.returned, __ATOMIC_ACQUIRE) == 1);
    pthread_join(thread, NULL);
    cr_assert_eq(__atomic_load_n(&b4_destructor_locked, __ATOMIC_ACQUIRE), 0);
    gpu_cu.cuStreamDestroy(s);
    gpu_cu.cuMemHostUnregister(words);
    free(words);
}
