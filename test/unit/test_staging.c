/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gpu/staging.c against the driver's test double (LD_LIBRARY_PATH as make test-unit sets it):
 * the lanes wait for the user's stream to arrive, a copy out sees what the in lane wrote
 * before it, tickets finish in order and the in lane's ticket is posted only for new work,
 * the user's stream waits for the in lane's work before done, a failed batch's hold keeps it
 * until released, and the pinned memory grows and is reachable from the device side too.
 */
#include <criterion/criterion.h>
#include <string.h>
#include <unistd.h>

#include "eventually.h"
#include "gpu/driver.h"
#include "gpu/staging.h"
#include "gpu/stream.h"

static const struct gpu_device *device;
static struct gpu_staging *st;
static CUdeviceptr dev; /* 64 KiB of device memory */
/* A gate of the test's own, opened from the host: it holds a stream back until then. */
static uint32_t gate_page[1024] __attribute__((aligned(4096)));
static struct gpu_flag gate;

static void
setup(void)
{
    cr_assert(gpu_driver_present(), "no driver: run with LD_LIBRARY_PATH=build/test/doubles");
    cr_assert_eq(gpu_device_get(0, &device), ncclSuccess);
    cr_assert_eq(gpu_ctx_push(device->ctx), ncclSuccess);
    cr_assert_eq(gpu_staging_create(device, &st), ncclSuccess);
    cr_assert_eq(gpu_cu.cuMemAlloc(&dev, 1 << 16), CUDA_SUCCESS);
    memset(gate_page, 0, sizeof(gate_page));
    /* DEVICEMAP: a stream memory operation needs its device address. */
    cr_assert_eq(gpu_cu.cuMemHostRegister(gate_page, sizeof(gate_page),
                                          CU_MEMHOSTREGISTER_DEVICEMAP),
                 CUDA_SUCCESS);
    gate.host = gate_page;
    cr_assert_eq(gpu_cu.cuMemHostGetDevicePointer(&gate.dev, gate_page, 0), CUDA_SUCCESS);
}

static void
teardown(void)
{
    gpu_flag_release(&gate, 1u << 20); /* whatever a failed test left waiting */
    gpu_staging_destroy(st);
    gpu_cu.cuMemHostUnregister(gate_page);
    gpu_cu.cuMemFree(dev);
    gpu_ctx_pop();
}

TestSuite(staging, .init = setup, .fini = teardown);

Test(staging, lanes_wait_for_arrive_and_a_copy_out_sees_the_in_lane)
{
    int *host_in, *host_out;
    uint32_t in_ticket, out_ticket;
    CUstream user;

    cr_assert_eq(gpu_staging_reserve(st, 4096), ncclSuccess);
    host_in = (int *)st->host;
    host_out = host_in + 256;
    host_in[0] = 7;
    host_out[0] = -1;
    void *buf = (void *)(uintptr_t)dev;

    cr_assert_eq(gpu_cu.cuStreamCreate(&user, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_stream_wait_flag(user, &gate, 1), ncclSuccess); /* the user's work */
    cr_assert_eq(gpu_staging_arrive(st, user), ncclSuccess);
    cr_assert_eq(gpu_staging_follow_arrive(st), ncclSuccess);
    cr_assert_eq(gpu_staging_copy(st, GPU_LANE_IN, buf, host_in, sizeof(int), &in_ticket),
                 ncclSuccess);
    cr_assert_eq(gpu_staging_copy(st, GPU_LANE_OUT, host_out, buf, sizeof(int), &out_ticket),
                 ncclSuccess);
    usleep(20000);
    cr_assert(!gpu_staging_finished(st, GPU_LANE_IN, in_ticket), "copied before arrive");
    cr_assert(!gpu_staging_finished(st, GPU_LANE_OUT, out_ticket), "copied before arrive");
    gpu_flag_release(&gate, 1); /* the user's stream gets there */
    EVENTUALLY(gpu_staging_finished(st, GPU_LANE_OUT, out_ticket));
    cr_assert(gpu_staging_finished(st, GPU_LANE_IN, in_ticket));
    cr_assert_eq(host_out[0], 7, "the copy out ran before the in lane's copy");
    gpu_cu.cuStreamDestroy(user);
}
Test(staging, tickets_finish_in_order_and_the_in_ticket_needs_new_work)
{
    uint32_t a, b, c, d;
    char *host = NULL;

    cr_assert_eq(gpu_staging_reserve(st, 1 << 16), ncclSuccess);
    host = (char *)st->host;
    cr_assert_eq(gpu_staging_in_ticket(st, &a), ncclSuccess);
    cr_assert_eq(gpu_staging_in_ticket(st, &b), ncclSuccess);
    cr_assert_eq(a, b, "a second ticket without new work");
    cr_assert_eq(gpu_staging_copy(st, GPU_LANE_IN, (void *)(uintptr_t)dev, host, 4096, &c),
                 ncclSuccess);
    cr_assert_gt(c, b);
    gpu_staging_in_touched(st);
    cr_assert_eq(gpu_staging_in_ticket(st, &d), ncclSuccess);
    cr_assert_gt(d, c, "work enqueued after a ticket needs a new one");
    EVENTUALLY(gpu_staging_finished(st, GPU_LANE_IN, d));
    cr_assert(gpu_staging_finished(st, GPU_LANE_IN, c));
}

Test(staging, done_releases_the_users_stream_after_the_in_lane)
{
    CUstream user;
    static int mark, one = 1;

    mark = 0;
    cr_assert_eq(gpu_cu.cuStreamCreate(&user, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_staging_arrive(st, user), ncclSuccess);
    cr_assert_eq(gpu_staging_follow_arrive(st), ncclSuccess);
    /* The in lane's work, held back until the gate opens. */
    cr_assert_eq(gpu_stream_wait_flag(gpu_staging_in_stream(st), &gate, 2), ncclSuccess);
    cr_assert_eq(gpu_staging_mark_done(st), ncclSuccess);
    cr_assert_eq(gpu_staging_wait_done(st, user), ncclSuccess);
    cr_assert_eq(gpu_cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)&mark,
                                      (CUdeviceptr)(uintptr_t)&one, sizeof(int), user),
                 CUDA_SUCCESS);
    usleep(20000);
    cr_assert_eq(mark, 0, "the user's stream went past its gate before the in lane's work");
    gpu_flag_release(&gate, 2);
    EVENTUALLY(gpu_cu.cuStreamQuery(user) == CUDA_SUCCESS);
    cr_assert_eq(mark, 1);
    gpu_cu.cuStreamDestroy(user);
}

Test(staging, a_hold_keeps_the_users_stream_until_released)
{
    CUstream user;
    static int mark, one = 1;

    mark = 0;
    cr_assert_eq(gpu_cu.cuStreamCreate(&user, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_staging_hold(st, user, 4), ncclSuccess);
    cr_assert_eq(gpu_cu.cuMemcpyAsync((CUdeviceptr)(uintptr_t)&mark,
                                      (CUdeviceptr)(uintptr_t)&one, sizeof(int), user),
                 CUDA_SUCCESS);
    usleep(20000);
    cr_assert_eq(mark, 0, "the user's stream went past a failed batch's hold");
    gpu_staging_release(st, 4);
    EVENTUALLY(gpu_cu.cuStreamQuery(user) == CUDA_SUCCESS);
    cr_assert_eq(mark, 1);
    gpu_cu.cuStreamDestroy(user);
}

Test(staging, pinned_memory_grows_stays_and_the_device_reaches_it)
{
    uint32_t ticket;

    cr_assert_eq(gpu_staging_reserve(st, 5000), ncclSuccess);
    cr_assert_geq(st->host_bytes, 5000);
    uint8_t *host = st->host;
    cr_assert_eq(gpu_staging_reserve(st, 100), ncclSuccess);
    cr_assert_eq(st->host, host, "a smaller need reallocated");
    cr_assert_eq(gpu_staging_reserve(st, 3u << 20), ncclSuccess);
    cr_assert_geq(st->host_bytes, 3u << 20);
    memset(st->host, 1, st->host_bytes); /* all of it is there */
    /* A copy through the device's view of it, as kernels see scratch. */
    memset(st->host, 9, 64);
    cr_assert_eq(gpu_staging_copy(st, GPU_LANE_IN, st->host + 4096,
                                  (void *)(uintptr_t)st->host_dev, 64, &ticket),
                 ncclSuccess);
    EVENTUALLY(gpu_staging_finished(st, GPU_LANE_IN, ticket));
    cr_assert_eq(st->host[4096 + 63], 9);
}
