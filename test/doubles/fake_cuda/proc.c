/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fake driver's entry points by name (cuGetProcAddress), its version and error texts,
 * its devices and their primary contexts, and each thread's context stack.
 */
#include <execinfo.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudaTypedefs.h>

#include "fake_cuda.h"

#define FAKE_CTX_DEPTH 16

static struct fake_config fake_cfg;
static struct fake_device fake_devices[FAKE_MAX_DEVICES];
static pthread_once_t fake_once = PTHREAD_ONCE_INIT;
static __thread struct CUctx_st *fake_ctx_stack[FAKE_CTX_DEPTH];
static __thread int fake_ctx_depth;

static int
fake_env_int(const char *name, int fallback)
{
    const char *text = getenv(name);
    return text != NULL && text[0] != '\0' ? atoi(text) : fallback;
}

static void
fake_setup(void)
{
    fake_cfg.ndevices = fake_env_int("FAKE_CUDA_DEVICES", 1);
    if (fake_cfg.ndevices < 1 || fake_cfg.ndevices > FAKE_MAX_DEVICES) {
        fake_cfg.ndevices = 1;
    }
    fake_cfg.cc = fake_env_int("FAKE_CUDA_CC", 90);
    fake_cfg.driver_version = fake_env_int("FAKE_CUDA_DRIVER_VERSION", CUDA_VERSION);
    /* The driver's range is 1 to 32; its default 8. */
    fake_cfg.queues = fake_env_int("CUDA_DEVICE_MAX_CONNECTIONS", 8);
    if (fake_cfg.queues < 1 || fake_cfg.queues > FAKE_MAX_QUEUES) {
        fake_cfg.queues = 8;
    }
    fake_cfg.queue_seed = (unsigned int)fake_env_int("FAKE_CUDA_QUEUE_SEED", 0);
    fake_cfg.sync_strict = fake_env_int("FAKE_CUDA_SYNC_STRICT", 0) != 0;
    fake_cfg.host_visible = fake_env_int("FAKE_CUDA_HOST_VISIBLE", 0) != 0;
    fake_cfg.no_peer = fake_env_int("FAKE_CUDA_NO_PEER", 0) != 0;
    for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
        fake_devices[d].ordinal = d;
        fake_devices[d].ctx.device = d;
        /* The same in every process, as a real GPU's UUID is. */
        memset(fake_devices[d].uuid.bytes, 0xf0 + d, sizeof(fake_devices[d].uuid.bytes));
    }
}

const struct fake_config *
fake_config(void)
{
    pthread_once(&fake_once, fake_setup);
    return &fake_cfg;
}

struct fake_device *
fake_device(int ordinal)
{
    if (ordinal < 0 || ordinal >= fake_config()->ndevices) {
        return NULL;
    }
    return &fake_devices[ordinal];
}

struct CUctx_st *
fake_ctx_current(void)
{
    return fake_ctx_depth > 0 ? fake_ctx_stack[fake_ctx_depth - 1] : NULL;
}

void
fake_complain(const char *fmt, ...)
{
    char text[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    fprintf(stderr, "fake_cuda: %s\n", text);
    fake_backtrace();
}

void
fake_backtrace(void)
{
    if (fake_env_int("FAKE_CUDA_BACKTRACE", 0) != 0) {
        /* Who made the call: for whoever debugs a complaint (addr2line the offsets). */
        void *frames[32];
        int n = backtrace(frames, 32);
        backtrace_symbols_fd(frames, n, 2);
    }
}

/* --- version, errors ---------------------------------------------------------------------- */

FAKE_API CUresult
cuInit(unsigned int flags)
{
    (void)flags;
    fake_config();
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuDriverGetVersion(int *version)
{
    *version = fake_config()->driver_version;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuGetErrorName(CUresult error, const char **text)
{
    static char buf[32];
    switch (error) {
    case CUDA_SUCCESS: *text = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *text = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *text = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_INVALID_HANDLE: *text = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_FOUND: *text = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_NOT_READY: *text = "CUDA_ERROR_NOT_READY"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *text = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_INVALID_DEVICE: *text = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_INVALID_IMAGE: *text = "CUDA_ERROR_INVALID_IMAGE"; break;
    case CUDA_ERROR_NO_BINARY_FOR_GPU: *text = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION: *text = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; break;
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: *text = "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"; break;
    case CUDA_ERROR_ILLEGAL_STATE: *text = "CUDA_ERROR_ILLEGAL_STATE"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *text = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case CUDA_ERROR_NOT_PERMITTED: *text = "CUDA_ERROR_NOT_PERMITTED"; break;
    case CUDA_ERROR_ILLEGAL_ADDRESS: *text = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
        *text = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
        break;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
        *text = "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED";
        break;
    default:
        snprintf(buf, sizeof(buf), "CUDA_ERROR_%d", (int)error);
        *text = buf;
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuGetErrorString(CUresult error, const char **text)
{
    cuGetErrorName(error, text);
    return CUDA_SUCCESS;
}

/* --- devices -------------------------------------------------------------------------------- */

FAKE_API CUresult
cuDeviceGetCount(int *count)
{
    *count = fake_config()->ndevices;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuDeviceGet(CUdevice *device, int ordinal)
{
    if (fake_device(ordinal) == NULL) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *device = ordinal;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    struct fake_device *d = fake_device(dev);
    if (d == NULL) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *uuid = d->uuid;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuDeviceGetAttribute(int *value, CUdevice_attribute attrib, CUdevice dev)
{
    if (fake_device(dev) == NULL) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 4; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = fake_config()->cc / 10; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = fake_config()->cc % 10; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: *value = 0; break; /* the host's one node */
    default: *value = 1; break; /* unified addressing, stream memory ops, ... */
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    if (fake_device(dev) == NULL || fake_device(peer) == NULL) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *can = dev != peer && !fake_config()->no_peer;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev)
{
    struct fake_device *d = fake_device(dev);
    if (d == NULL) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    *ctx = &d->ctx;
    return CUDA_SUCCESS;
}

/* --- contexts ------------------------------------------------------------------------------- */

FAKE_API CUresult
cuCtxGetCurrent(CUcontext *ctx)
{
    *ctx = fake_ctx_current();
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuCtxSetCurrent(CUcontext ctx)
{
    if (fake_ctx_depth == 0) {
        if (ctx != NULL) {
            fake_ctx_stack[fake_ctx_depth++] = ctx;
        }
    } else if (ctx == NULL) {
        fake_ctx_depth--;
    } else {
        fake_ctx_stack[fake_ctx_depth - 1] = ctx;
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuCtxGetDevice(CUdevice *device)
{
    struct CUctx_st *ctx = fake_ctx_current();
    if (ctx == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    *device = ctx->device;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuCtxPushCurrent(CUcontext ctx)
{
    if (ctx == NULL || fake_ctx_depth == FAKE_CTX_DEPTH) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    fake_ctx_stack[fake_ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuCtxPopCurrent(CUcontext *ctx)
{
    if (fake_ctx_depth == 0) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    *ctx = fake_ctx_stack[--fake_ctx_depth];
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    struct CUctx_st *ctx = fake_ctx_current();
    int can = 0;

    (void)flags;
    if (ctx == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    cuDeviceCanAccessPeer(&can, ctx->device, peer->device);
    return can ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
}

/* --- entry points by name ------------------------------------------------------------------- */

/* cuCtxGetDevice as CUDA 13.0 changed it: the device of `ctx`, NULL meaning the current one. */
static CUresult
fake_ctx_get_device_v13000(CUdevice *device, CUcontext ctx)
{
    if (ctx == NULL) {
        return cuCtxGetDevice(device);
    }
    if (ctx->device < 0 || ctx->device >= fake_config()->ndevices ||
        ctx != &fake_device(ctx->device)->ctx) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    *device = ctx->device;
    return CUDA_SUCCESS;
}

/* Every variant the double has of a base name, with the CUDA version that introduced it, typed
 * with cudaTypedefs.h's PFN_<name>_v<version> so that a variant whose prototype differs from
 * the typedef does not compile. */
#define FAKE_VARIANT(name, version, fn)                                                      \
    {#name, version, (void *)(1 ? (fn) : (PFN_##name##_v##version)NULL)}
#define FAKE_ENTRY(name, version)                                                            \
    {#name, version, (void *)(1 ? (name) : (PFN_##name##_v##version)NULL)}

static const struct fake_entry {
    const char *name;
    int version;
    void *fn;
} fake_entries[] = {
    FAKE_ENTRY(cuInit, 2000), FAKE_ENTRY(cuDriverGetVersion, 2020),
    FAKE_ENTRY(cuGetErrorString, 6000), FAKE_ENTRY(cuGetErrorName, 6000),
    FAKE_ENTRY(cuDeviceGet, 2000), FAKE_ENTRY(cuDeviceGetCount, 2000),
    FAKE_ENTRY(cuDeviceGetAttribute, 2000), FAKE_ENTRY(cuDeviceGetUuid, 11040),
    FAKE_ENTRY(cuDeviceCanAccessPeer, 4000), FAKE_ENTRY(cuDevicePrimaryCtxRetain, 7000),
    FAKE_ENTRY(cuCtxGetCurrent, 4000), FAKE_ENTRY(cuCtxSetCurrent, 4000),
    FAKE_ENTRY(cuCtxGetDevice, 2000),
    FAKE_VARIANT(cuCtxGetDevice, 13000, fake_ctx_get_device_v13000),
    FAKE_ENTRY(cuCtxPushCurrent, 4000), FAKE_ENTRY(cuCtxPopCurrent, 4000),
    FAKE_ENTRY(cuCtxEnablePeerAccess, 4000), FAKE_ENTRY(cuPointerGetAttribute, 4000),
    FAKE_ENTRY(cuPointerGetAttributes, 7000), FAKE_ENTRY(cuMemGetAddressRange, 3020),
    FAKE_ENTRY(cuMemAlloc, 3020), FAKE_ENTRY(cuMemFree, 3020),
    FAKE_ENTRY(cuMemAllocManaged, 6000), FAKE_ENTRY(cuMemHostAlloc, 2020),
    FAKE_ENTRY(cuMemFreeHost, 2000), FAKE_ENTRY(cuMemHostRegister, 6050),
    FAKE_ENTRY(cuMemHostUnregister, 4000), FAKE_ENTRY(cuMemHostGetDevicePointer, 3020),
    FAKE_ENTRY(cuIpcGetMemHandle, 4010), FAKE_ENTRY(cuIpcOpenMemHandle, 11000),
    FAKE_ENTRY(cuIpcCloseMemHandle, 4010), FAKE_ENTRY(cuMemCreate, 10020),
    FAKE_ENTRY(cuMemRelease, 10020), FAKE_ENTRY(cuMemAddressReserve, 10020),
    FAKE_ENTRY(cuMemAddressFree, 10020), FAKE_ENTRY(cuMemMap, 10020),
    FAKE_ENTRY(cuMemUnmap, 10020), FAKE_ENTRY(cuMemSetAccess, 10020),
    FAKE_ENTRY(cuMemGetAccess, 10020),
    FAKE_ENTRY(cuMemGetAllocationGranularity, 10020),
    FAKE_ENTRY(cuMemExportToShareableHandle, 10020),
    FAKE_ENTRY(cuMemImportFromShareableHandle, 10020),
    FAKE_ENTRY(cuMemRetainAllocationHandle, 11000), FAKE_ENTRY(cuStreamCreate, 2000),
    FAKE_ENTRY(cuStreamDestroy, 4000), FAKE_ENTRY(cuStreamSynchronize, 2000),
    FAKE_ENTRY(cuStreamQuery, 2000), FAKE_ENTRY(cuStreamGetCtx, 9020),
    FAKE_VARIANT(cuStreamGetCtx, 12050, cuStreamGetCtx_v2),
    FAKE_ENTRY(cuStreamIsCapturing, 10000), FAKE_ENTRY(cuStreamWaitEvent, 3020),
    FAKE_ENTRY(cuStreamWaitValue32, 11070), FAKE_ENTRY(cuStreamWriteValue32, 11070),
    FAKE_ENTRY(cuThreadExchangeStreamCaptureMode, 10010),
    FAKE_ENTRY(cuEventCreate, 2000), FAKE_ENTRY(cuEventRecord, 2000),
    FAKE_ENTRY(cuEventQuery, 2000), FAKE_ENTRY(cuEventSynchronize, 2000),
    FAKE_ENTRY(cuEventDestroy, 4000), FAKE_ENTRY(cuModuleLoadData, 2000),
    FAKE_ENTRY(cuModuleUnload, 2000), FAKE_ENTRY(cuModuleGetFunction, 2000),
    FAKE_ENTRY(cuFuncLoad, 12040),
    FAKE_ENTRY(cuLaunchKernel, 4000), FAKE_ENTRY(cuMemcpyAsync, 4000),
    FAKE_ENTRY(cuLaunchHostFunc, 10000), FAKE_ENTRY(cuMemcpyHtoD, 3020),
    FAKE_ENTRY(cuUserObjectCreate, 11030), FAKE_ENTRY(cuUserObjectRelease, 11030),
    FAKE_ENTRY(cuGraphRetainUserObject, 11030),
    FAKE_VARIANT(cuStreamGetCaptureInfo, 11030, fake_stream_get_capture_info_v11030),
    FAKE_ENTRY(cuMemcpyDtoH, 3020), FAKE_ENTRY(cuMemsetD8, 3020),
};

/* As the driver documents it: the newest variant of `symbol` introduced at or before `version`
 * (which may not exceed the driver's own). The variants a name had before the oldest the
 * double has are unknown to it: asking for one is CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT,
 * as for a variant newer than the driver, never the wrong prototype. */
FAKE_API CUresult
cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags,
                 CUdriverProcAddressQueryResult *status)
{
    const struct fake_entry *found = NULL;
    bool named = false;
    CUdriverProcAddressQueryResult answer = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    int driver = 0;

    if (symbol == NULL || pfn == NULL ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    cuDriverGetVersion(&driver);
    for (size_t i = 0; i < sizeof(fake_entries) / sizeof(fake_entries[0]); i++) {
        const struct fake_entry *e = &fake_entries[i];
        if (strcmp(e->name, symbol) != 0) {
            continue;
        }
        named = true;
        if (e->version <= version && e->version <= driver &&
            (found == NULL || e->version > found->version)) {
            found = e;
        }
    }
    if (found != NULL) {
        answer = CU_GET_PROC_ADDRESS_SUCCESS;
    } else if (named) {
        answer = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    }
    *pfn = found != NULL ? found->fn : NULL;
    if (status != NULL) {
        *status = answer;
    }
    return found != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
