/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver, without linking any CUDA library: libcuda.so.1 is opened with dlopen on
 * first use and every entry point is resolved once through cuGetProcAddress, at the API
 * version of the cuda.h we compile against (or the driver's, if older), so each pointer has
 * exactly the prototype cuda.h gives its name. No driver, or one older than CUDA 12.0, means
 * host memory only: gpu_driver_present() is false and nothing else here may be called.
 *
 * Every call goes through gpu_cu, whose members are named as cuda.h names the functions:
 *     GPU_CU_CHECK(cuMemAlloc(&ptr, bytes));
 * calls the driver's cuMemAlloc (cuda.h maps the name to cuMemAlloc_v2, and so does the
 * table) and turns a failure into ncclUnhandledCudaError with a WARN naming the call and
 * the driver's text for the error, as SHIM_SYS_CHECK does for errno.
 *
 * Contexts: ncclshim works in each device's primary context, as the CUDA runtime (and so
 * every NCCL program) does. gpu_ctx_get retains it once per device and keeps it.
 */
#ifndef GPU_DRIVER_H
#define GPU_DRIVER_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdint.h>

/* Every driver function ncclshim calls. */
#define GPU_CU_ENTRIES(X)                                                                    \
    X(cuGetErrorString) X(cuGetErrorName) X(cuDeviceGet) X(cuDeviceGetCount)                 \
    X(cuDeviceGetAttribute) X(cuDeviceGetUuid) X(cuDeviceCanAccessPeer)                      \
    X(cuDevicePrimaryCtxRetain) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice)      \
    X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxEnablePeerAccess)                          \
    X(cuPointerGetAttribute) X(cuPointerGetAttributes) X(cuMemGetAddressRange)               \
    X(cuMemAlloc) X(cuMemFree) X(cuMemHostRegister) X(cuMemHostUnregister)                   \
    X(cuMemHostGetDevicePointer) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle)                  \
    X(cuIpcCloseMemHandle) X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve)             \
    X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)                          \
    X(cuMemGetAllocationGranularity) X(cuMemExportToShareableHandle)                         \
    X(cuMemImportFromShareableHandle) X(cuMemRetainAllocationHandle) X(cuStreamCreate)       \
    X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamGetCtx)             \
    X(cuStreamIsCapturing) X(cuStreamWaitEvent) X(cuStreamWaitValue32)                       \
    X(cuStreamWriteValue32) X(cuEventCreate) X(cuEventRecord) X(cuEventQuery)                \
    X(cuEventSynchronize) X(cuEventDestroy) X(cuModuleLoadData) X(cuModuleUnload)            \
    X(cuModuleGetFunction) X(cuLaunchKernel) X(cuMemcpyAsync) X(cuLaunchHostFunc)

/* The entry points; a member is named after the function as cuda.h spells it (cuMemAlloc is
 * cuMemAlloc_v2 there, and here). Filled once, read-only afterwards. */
struct gpu_cu_table {
#define GPU_CU_MEMBER(name) __typeof__(name) *name;
    GPU_CU_ENTRIES(GPU_CU_MEMBER)
#undef GPU_CU_MEMBER
};
extern struct gpu_cu_table gpu_cu;

/* Loads the driver once; false (with an INFO line saying why) if there is none usable. */
bool gpu_driver_present(void);
/* The driver's CUDA version (12040 for 12.4), 0 without a driver. */
int gpu_driver_version(void);

/* ncclUnhandledCudaError, after a WARN "<call> failed: <name>: <text>" (file:line of the
 * caller). For the check macros. */
ncclResult_t gpu_cu_fail(CUresult res, const char *call, const char *file, int line);

#define GPU_CU_CHECK(call)                                                                   \
    do {                                                                                     \
        CUresult gpu_res_ = gpu_cu.call;                                                     \
        if (gpu_res_ != CUDA_SUCCESS) {                                                      \
            return gpu_cu_fail(gpu_res_, #call, __FILE__, __LINE__);                         \
        }                                                                                    \
    } while (0)

#define GPU_CU_CHECK_GOTO(call, res, label)                                                  \
    do {                                                                                     \
        CUresult gpu_res_ = gpu_cu.call;                                                     \
        if (gpu_res_ != CUDA_SUCCESS) {                                                      \
            (res) = gpu_cu_fail(gpu_res_, #call, __FILE__, __LINE__);                        \
            goto label;                                                                      \
        }                                                                                    \
    } while (0)

#define GPU_MAX_DEVICES 64

/* What ncclshim needs to know of a device. */
struct gpu_device {
    int ordinal;         /* in this process's numbering (CUDA_VISIBLE_DEVICES applies) */
    CUuuid uuid;         /* the same in every process */
    int sm_count;
    int cc_major, cc_minor;
    CUcontext ctx;       /* its primary context, retained for the life of the process */
};

/* The device `ordinal`, its primary context retained on first use. ncclInvalidArgument for
 * an ordinal the driver does not have. */
ncclResult_t gpu_device_get(int ordinal, const struct gpu_device **device_out);
/* The device of the calling thread's current context, -1 when it has none. */
int gpu_device_current(void);
/* How many devices this process sees (0 without a driver). */
int gpu_device_count(void);

/* Device identity across processes, without creating a context: the UUID of `ordinal`; the
 * ordinal of the device with that UUID in this process, -1 if it cannot see it; whether
 * kernels on device `from` can access memory of device `to` (the same, or peer access). */
ncclResult_t gpu_device_uuid(int ordinal, CUuuid *uuid_out);
int gpu_device_by_uuid(const CUuuid *uuid);
bool gpu_device_can_reach(int from, int to);

/* Makes ctx current on the calling thread until gpu_ctx_pop; pairs nest. */
ncclResult_t gpu_ctx_push(CUcontext ctx);
void gpu_ctx_pop(void);

#endif
