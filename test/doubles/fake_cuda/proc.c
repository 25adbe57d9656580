/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fake driver's entry points by name (cuGetProcAddress), its version and error texts,
 * its devices and their primary contexts, and each thread's context stack.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    *version = CUDA_VERSION;
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

/* Declared in the other files; listed here so cuGetProcAddress can hand them out. */
#define FAKE_ENTRY(name) {#name, (void *)name}

FAKE_API CUresult
cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags,
                 CUdriverProcAddressQueryResult *status)
{
    static const struct {
        const char *name;
        void *fn;
    } entries[] = {
        FAKE_ENTRY(cuInit), FAKE_ENTRY(cuDriverGetVersion), FAKE_ENTRY(cuGetErrorString),
        FAKE_ENTRY(cuGetErrorName), FAKE_ENTRY(cuDeviceGet), FAKE_ENTRY(cuDeviceGetCount),
        FAKE_ENTRY(cuDeviceGetAttribute), FAKE_ENTRY(cuDeviceGetUuid),
        FAKE_ENTRY(cuDeviceCanAccessPeer), FAKE_ENTRY(cuDevicePrimaryCtxRetain),
        FAKE_ENTRY(cuCtxGetCurrent), FAKE_ENTRY(cuCtxSetCurrent), FAKE_ENTRY(cuCtxGetDevice),
        FAKE_ENTRY(cuCtxPushCurrent), FAKE_ENTRY(cuCtxPopCurrent),
        FAKE_ENTRY(cuCtxEnablePeerAccess), FAKE_ENTRY(cuPointerGetAttribute),
        FAKE_ENTRY(cuPointerGetAttributes), FAKE_ENTRY(cuMemGetAddressRange),
        FAKE_ENTRY(cuMemAlloc), FAKE_ENTRY(cuMemFree), FAKE_ENTRY(cuMemAllocManaged),
        FAKE_ENTRY(cuMemHostAlloc), FAKE_ENTRY(cuMemFreeHost), FAKE_ENTRY(cuMemHostRegister),
        FAKE_ENTRY(cuMemHostUnregister), FAKE_ENTRY(cuMemHostGetDevicePointer),
        FAKE_ENTRY(cuIpcGetMemHandle), FAKE_ENTRY(cuIpcOpenMemHandle),
        FAKE_ENTRY(cuIpcCloseMemHandle), FAKE_ENTRY(cuMemCreate), FAKE_ENTRY(cuMemRelease),
        FAKE_ENTRY(cuMemAddressReserve), FAKE_ENTRY(cuMemAddressFree), FAKE_ENTRY(cuMemMap),
        FAKE_ENTRY(cuMemUnmap), FAKE_ENTRY(cuMemSetAccess),
        FAKE_ENTRY(cuMemGetAllocationGranularity), FAKE_ENTRY(cuMemExportToShareableHandle),
        FAKE_ENTRY(cuMemImportFromShareableHandle), FAKE_ENTRY(cuMemRetainAllocationHandle),
        FAKE_ENTRY(cuStreamCreate), FAKE_ENTRY(cuStreamDestroy),
        FAKE_ENTRY(cuStreamSynchronize), FAKE_ENTRY(cuStreamQuery), FAKE_ENTRY(cuStreamGetCtx),
        FAKE_ENTRY(cuStreamIsCapturing), FAKE_ENTRY(cuStreamWaitEvent),
        FAKE_ENTRY(cuStreamWaitValue32), FAKE_ENTRY(cuStreamWriteValue32),
        FAKE_ENTRY(cuEventCreate), FAKE_ENTRY(cuEventRecord), FAKE_ENTRY(cuEventQuery),
        FAKE_ENTRY(cuEventSynchronize), FAKE_ENTRY(cuEventDestroy),
        FAKE_ENTRY(cuModuleLoadData), FAKE_ENTRY(cuModuleUnload),
        FAKE_ENTRY(cuModuleGetFunction), FAKE_ENTRY(cuLaunchKernel), FAKE_ENTRY(cuMemcpyAsync),
        FAKE_ENTRY(cuLaunchHostFunc),
        FAKE_ENTRY(cuMemcpyHtoD), FAKE_ENTRY(cuMemcpyDtoH), FAKE_ENTRY(cuMemsetD8),
    };

    (void)version, (void)flags;
    for (size_t i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
        if (strcmp(entries[i].name, symbol) == 0) {
            *pfn = entries[i].fn;
            if (status != NULL) {
                *status = CU_GET_PROC_ADDRESS_SUCCESS;
            }
            return CUDA_SUCCESS;
        }
    }
    *pfn = NULL;
    if (status != NULL) {
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return CUDA_ERROR_NOT_FOUND;
}
