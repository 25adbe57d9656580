/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Launching ncclshim's CUDA kernels (reduce_device.cu, parameters in device_abi.h) from the
 * host, through the driver: the fatbin the library embeds is loaded once per device on first
 * use, and a launch is a batch of tasks built here.
 *
 *     struct kr_dev_launch l;
 *     kr_dev_begin(&l, stream, device, &redop);      (NULL redop: copies)
 *     kr_dev_add(&l, srcs, nsrc, dsts, ndst, count); (as many as needed; full batches launch)
 *     kr_dev_end(&l);                                (launches the rest)
 *
 * Every task of one launch has the same reduction (or copies), as a kernel's batch does. The
 * stream must belong to the device's primary context; these functions make it current.
 */
#ifndef KR_DEVICE_H
#define KR_DEVICE_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdint.h>

#include "device_abi.h"
#include "gpu/driver.h"
#include "kernels.h"

/* Whether the library was built with its kernels (nvcc present at build time). */
bool kr_dev_available(void);
/* ncclInvalidUsage with a WARN naming `api` when it was not. */
ncclResult_t kr_dev_check_available(const char *api);

/* Whether the kernels can run on `device` under this driver, checked before a device call
 * enqueues anything: the fatbin must hold a cubin or PTX for the GPU's compute capability,
 * and the driver must be of the CUDA major version that built it (or newer). Then loads the
 * kernels into the device's context, every function at once, so that nothing loads later
 * between a queued stream wait and its release; once they are, a call returns at once,
 * making no driver call. ncclInvalidUsage with a WARN naming `api`,
 * the driver, the GPU and what the library holds, when they cannot run. */
ncclResult_t kr_dev_check_device(const char *api, const struct gpu_device *device);
/* The same load, made where a communicator learns its device (init, a team's first device
 * call), before the program can have queued a wait that the rank's own work releases: loading
 * a module may synchronize the context (lazy loading), and behind such a wait it never
 * returns. Says nothing where the kernels cannot run: the first device call says why. */
void kr_dev_preload(const struct gpu_device *device);

struct kr_dev_launch {
    CUstream stream;
    const struct gpu_device *device;
    bool copy;
    bool collect;       /* kr_dev_begin_collect: build l->batch, launch nothing */
    ncclDataType_t type;
    uint64_t max_count; /* the largest task of the batch, for the grid */
    bool post;          /* the tasks added next get the post-operation */
    uint8_t level;      /* ... and this level (kr_dev_from: the launch that runs them) */
    struct kr_dev_batch batch;
};

/* Starts an empty batch: reductions with op (its kind, type and divisor; each operand brings
 * its own PreMulSum scalar in kr_dev_add), or copies when op is NULL. */
void kr_dev_begin(struct kr_dev_launch *l, CUstream stream, const struct gpu_device *device,
                  const struct kr_redop *op);
/* Whether the batch's results get the op's post-operation (SumPostDiv's divide), which
 * kr_dev_begin sets for every result: a schedule's step applies it only to an element's last
 * reduction, its earlier steps being partial sums. */
void kr_dev_set_post(struct kr_dev_launch *l, bool post);
/* The level of the tasks added next (0 at kr_dev_begin), for a batch collected for several
 * kr_dev_from launches, one per level: levels ascend through the batch. */
void kr_dev_set_level(struct kr_dev_launch *l, uint8_t level);
/* Adds a task (device_abi.h): nsrc operands reduced (a copy takes exactly one) into ndst
 * destinations, count elements (bytes for copies); at most KR_DEV_MAX_SRCS operands and
 * KR_DEV_MAX_DSTS destinations. A task with nothing to do is dropped. Launches the batch
 * first when the task does not fit. */
ncclResult_t kr_dev_add(struct kr_dev_launch *l, const struct kr_dev_src *srcs, int nsrc,
                        const uint64_t *dsts, int ndst, uint64_t count);
/* The same, for a batch only built (l->batch, for a "_from" launch), never launched: a task
 * that does not fit in it is an error. */
void kr_dev_begin_collect(struct kr_dev_launch *l, const struct gpu_device *device,
                          const struct kr_redop *op);
/* Launches what the batch still holds. */
ncclResult_t kr_dev_end(struct kr_dev_launch *l);

/* Enqueues kr_dev_from (device_abi.h) over the tasks of `level` of the batch at device
 * address `batch`, read when it runs (built by kr_dev_begin_collect and kr_dev_add: it names
 * its kernel), for a grid sized for up to max_tasks tasks of up to max_task_bytes each (the
 * level may hold fewer, and smaller: the rest do nothing). */
ncclResult_t kr_dev_launch_from(CUstream stream, const struct gpu_device *device,
                                uint64_t max_task_bytes, uint32_t max_tasks, CUdeviceptr batch,
                                uint32_t level);
/* Enqueues kr_dev_signal over the struct kr_dev_signals at device address `signals`. */
ncclResult_t kr_dev_signal_from(CUstream stream, const struct gpu_device *device,
                                CUdeviceptr signals);

#endif
