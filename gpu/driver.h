/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver, without linking any CUDA library: libcuda.so.1 is opened with dlopen on
 * first use and every entry point is resolved once through cuGetProcAddress, each at the
 * version of the variant we call (GPU_CU_ENTRIES), so each pointer has exactly that variant's
 * prototype. No driver, or one older than CUDA 12.0, means
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
#include <cudaTypedefs.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdint.h>

/* Every driver function ncclshim calls, each with the CUDA version whose variant of it we call.
 * cuGetProcAddress hands back the newest variant of a base name at the version asked, and
 * some variants changed signature (cuCtxGetDevice takes a context since 13.0, cuStreamGetCtx
 * writes a green context since 12.5): asking at the driver's version would hand those back
 * for calls written against the old prototype. So each name is asked for at its version, and
 * its pointer is typed with cudaTypedefs.h's PFN_<name>_v<version>: a call that does not fit
 * that prototype does not compile. The versions are those of the prototypes cuda.h gives the
 * names (cuMemAlloc is cuMemAlloc_v2 there, PFN_cuMemAlloc_v3020 here), except the two
 * above, asked for at their first variant as NCCL does. */
#define GPU_CU_ENTRIES(X)                                                                    \
    X(cuGetErrorString, 6000) X(cuGetErrorName, 6000) X(cuDeviceGet, 2000)                   \
    X(cuDeviceGetCount, 2000) X(cuDeviceGetAttribute, 2000) X(cuDeviceGetUuid, 11040)        \
    X(cuDeviceCanAccessPeer, 4000) X(cuDevicePrimaryCtxRetain, 7000)                         \
    X(cuCtxGetCurrent, 4000) X(cuCtxSetCurrent, 4000) X(cuCtxGetDevice, 2000)                \
    X(cuCtxPushCurrent, 4000) X(cuCtxPopCurrent, 4000) X(cuCtxEnablePeerAccess, 4000)        \
    X(cuPointerGetAttribute, 4000) X(cuPointerGetAttributes, 7000)                           \
    X(cuMemGetAddressRange, 3020) X(cuMemAlloc, 3020) X(cuMemFree, 3020)                     \
    X(cuMemHostRegister, 6050) X(cuMemHostUnregister, 4000)                                  \
    X(cuMemHostGetDevicePointer, 3020) X(cuIpcGetMemHandle, 4010)                            \
    X(cuIpcOpenMemHandle, 11000) X(cuIpcCloseMemHandle, 4010) X(cuMemCreate, 10020)          \
    X(cuMemRelease, 10020) X(cuMemAddressReserve, 10020) X(cuMemAddressFree, 10020)          \
    X(cuMemMap, 10020) X(cuMemUnmap, 10020) X(cuMemSetAccess, 10020)                         \
    X(cuMemGetAccess, 10020) X(cuMemGetAllocationGranularity, 10020)                         \
    X(cuMemExportToShareableHandle, 10020) X(cuMemImportFromShareableHandle, 10020)          \
    X(cuMemRetainAllocationHandle, 11000) X(cuStreamCreate, 2000)                            \
    X(cuStreamDestroy, 4000) X(cuStreamSynchronize, 2000) X(cuStreamQuery, 2000)             \
    X(cuStreamGetCtx, 9020) X(cuStreamIsCapturing, 10000) X(cuStreamWaitEvent, 3020)         \
    X(cuStreamWaitValue32, 11070) X(cuStreamWriteValue32, 11070)                             \
    X(cuThreadExchangeStreamCaptureMode, 10010) X(cuEventCreate, 2000)                       \
    X(cuEventRecord, 2000) X(cuEventQuery, 2000) X(cuEventSynchronize, 2000)                 \
    X(cuEventDestroy, 4000) X(cuModuleLoadData, 2000) X(cuModuleUnload, 2000)                \
    X(cuModuleGetFunction, 2000) X(cuLaunchKernel, 4000) X(cuMemcpyAsync, 4000)              \
    X(cuLaunchHostFunc, 10000) X(cuUserObjectCreate, 11030) X(cuUserObjectRelease, 11030)    \
    X(cuGraphRetainUserObject, 11030) X(cuStreamGetCaptureInfo, 11030)

/* Entry points that older drivers lack, where ncclshim works without them: NULL there (the
 * device path needs a driver of CUDA 13 anyway, for its kernels). */
#define GPU_CU_OPTIONAL_ENTRIES(X) X(cuFuncLoad, 12040)

/* The entry points; a member is named after the function as cuda.h spells it (cuMemAlloc is
 * cuMemAlloc_v2 there, and here) and typed with the variant asked for. Filled once, read-only
 * afterwards. */
struct gpu_cu_table {
#define GPU_CU_MEMBER(name, version) PFN_##name##_v##version name;
    GPU_CU_ENTRIES(GPU_CU_MEMBER)
    GPU_CU_OPTIONAL_ENTRIES(GPU_CU_MEMBER)
#undef GPU_CU_MEMBER
};
extern struct gpu_cu_table gpu_cu;

/* Loads the driver once; false (with an INFO line saying why) if there is none usable. */
bool gpu_driver_present(void);
/* The driver's CUDA version (12040 for 12.4), 0 without a driver. */
int gpu_driver_version(void);
/* Whether every context has one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1, as Megatron
 * and Transformer Engine set): all its streams' work runs in the order it was enqueued, so a
 * stream wait blocks whatever was enqueued after it, on any stream of the context. */
bool gpu_one_queue(void);

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
    bool can_flush;      /* CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: waits may flush */
    CUcontext ctx;       /* its primary context, retained for the life of the process */
};

/* The device `ordinal`, its primary context retained on first use. ncclInvalidArgument for
 * an ordinal the driver does not have. */
ncclResult_t gpu_device_get(int ordinal, const struct gpu_device **device_out);
/* The device of the calling thread's current context, -1 when it has none. */
int gpu_device_current(void);
/* The device whose primary context ctx is (filled in by gpu_device_get), else that of ctx
 * asked of the driver; ncclUnhandledCudaError if the driver cannot tell. */
ncclResult_t gpu_device_of_ctx(CUcontext ctx, const struct gpu_device **device_out);
/* How many devices this process sees (0 without a driver). */
int gpu_device_count(void);

/* Device identity across processes, without creating a context: the UUID of `ordinal`; the
 * ordinal of the device with that UUID in this process, -1 if it cannot see it; whether
 * kernels on device `from` can access memory of device `to` (the same, or peer access). */
ncclResult_t gpu_device_uuid(int ordinal, CUuuid *uuid_out);
int gpu_device_by_uuid(const CUuuid *uuid);
bool gpu_device_can_reach(int from, int to);

/* Stream capture and our driver calls. While a program captures a CUDA graph in global mode
 * (PyTorch's default), a potentially unsafe call (allocation, registration, IPC mapping,
 * stream creation or synchronization, module loading) from any thread whose own capture mode
 * is global fails and invalidates the program's capture; the capturing thread itself may make
 * none unless its mode is relaxed. ncclshim makes such calls on its own threads at any time,
 * and on the caller's thread inside a call that may be captured, never on a captured stream:
 * each of our threads sets its mode to relaxed once (gpu_capture_relax_thread), and a call
 * on a caller's thread runs between gpu_capture_relax and gpu_capture_restore, which hands the
 * thread back its own mode. Without a driver they do nothing. */
void gpu_capture_relax_thread(void);
CUstreamCaptureMode gpu_capture_relax(void);
void gpu_capture_restore(CUstreamCaptureMode mode);

/* Makes ctx current on the calling thread until gpu_ctx_pop; pairs nest. */
ncclResult_t gpu_ctx_push(CUcontext ctx);
void gpu_ctx_pop(void);

#endif
