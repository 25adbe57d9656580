/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Loading the CUDA driver and the table of its entry points (driver.h), the checked-call
 * error path, and the devices with their primary contexts.
 */
#include "driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "base/check.h"
#include "base/debug.h"

/* The oldest driver that has every function of GPU_CU_ENTRIES at its version: below it, host
 * memory only. The device path needs more (a driver of the CUDA that built its kernels),
 * which kr_dev_check_device says at the call. */
#define GPU_DRIVER_MIN_VERSION 12000

struct gpu_cu_table gpu_cu;

static struct {
    pthread_once_t once;
    bool present;
    int version;
    pthread_mutex_t lock; /* guards devices[] as they are filled */
    struct gpu_device devices[GPU_MAX_DEVICES];
    bool known[GPU_MAX_DEVICES]; /* atomic: devices[i] is filled */
    int count;
} gpu_driver = {.once = PTHREAD_ONCE_INIT, .lock = PTHREAD_MUTEX_INITIALIZER};

typedef CUresult (*gpu_get_proc_fn)(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);

/* Resolves every GPU_CU_ENTRIES name at its own version; false (with an INFO) if the driver
 * (of `driver_version`) lacks one. cuGetProcAddress_v2 answers a name it lacks, or a version
 * older than its every variant, with CUDA_SUCCESS and a NULL pointer (the status says which),
 * and a version newer than the driver with CUDA_ERROR_INVALID_VALUE: either way no pointer,
 * which an optional entry point (GPU_CU_OPTIONAL_ENTRIES) is left without. */
static bool
gpu_driver_resolve(gpu_get_proc_fn get_proc, int driver_version)
{
    bool ok = true;
#define GPU_CU_RESOLVE(name, version)                                                        \
    if (ok) {                                                                                \
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;        \
        void *fn = NULL;                                                                     \
        CUresult cu = get_proc(#name, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM,       \
                               &status);                                                     \
        if (cu != CUDA_SUCCESS || fn == NULL) {                                              \
            INFO(SHIM_INIT, "CUDA driver %d has no %s of CUDA %d (error %d, status %d): "    \
                 "host memory only", driver_version, #name, version, (int)cu, (int)status);  \
            fn = NULL;                                                                       \
            ok = false;                                                                      \
        }                                                                                    \
        gpu_cu.name = (PFN_##name##_v##version)fn;                                           \
    }
    GPU_CU_ENTRIES(GPU_CU_RESOLVE)
#undef GPU_CU_RESOLVE
#define GPU_CU_RESOLVE_OPTIONAL(name, version)                                               \
    {                                                                                        \
        void *fn = NULL;                                                                     \
        if (get_proc(#name, &fn, version, CU_GET_PROC_ADDRESS_LEGACY_STREAM, NULL) !=        \
            CUDA_SUCCESS) {                                                                  \
            fn = NULL;                                                                       \
        }                                                                                    \
        gpu_cu.name = (PFN_##name##_v##version)fn;                                           \
    }
    GPU_CU_OPTIONAL_ENTRIES(GPU_CU_RESOLVE_OPTIONAL)
#undef GPU_CU_RESOLVE_OPTIONAL
    return ok;
}

static void
gpu_driver_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        INFO(SHIM_INIT, "no CUDA driver (%s): host memory only", dlerror());
        return;
    }
    __typeof__(cuInit) *init = (__typeof__(cuInit) *)dlsym(lib, "cuInit");
    __typeof__(cuDriverGetVersion) *get_version =
        (__typeof__(cuDriverGetVersion) *)dlsym(lib, "cuDriverGetVersion");
    gpu_get_proc_fn get_proc = (gpu_get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
    int version = 0;
    if (init == NULL || get_version == NULL || get_proc == NULL ||
        get_version(&version) != CUDA_SUCCESS) {
        INFO(SHIM_INIT, "CUDA driver without cuGetProcAddress_v2: host memory only");
        return;
    }
    if (version < GPU_DRIVER_MIN_VERSION) {
        INFO(SHIM_INIT, "CUDA driver %d is older than %d: host memory only", version,
             GPU_DRIVER_MIN_VERSION);
        return;
    }
    CUresult res = init(0);
    if (res != CUDA_SUCCESS) {
        INFO(SHIM_INIT, "CUDA driver %d: cuInit failed with error %d (no usable GPU): host "
             "memory only", version, (int)res);
        return;
    }
    if (!gpu_driver_resolve(get_proc, version)) {
        return;
    }
    int count = 0;
    gpu_cu.cuDeviceGetCount(&count);
    gpu_driver.count = count < GPU_MAX_DEVICES ? count : GPU_MAX_DEVICES;
    gpu_driver.version = version;
    gpu_driver.present = true;
    INFO(SHIM_INIT, "CUDA driver %d.%d, %d device(s)", version / 1000, version % 1000 / 10,
         count);
}

bool
gpu_driver_present(void)
{
    pthread_once(&gpu_driver.once, gpu_driver_load);
    return gpu_driver.present;
}

int
gpu_driver_version(void)
{
    return gpu_driver_present() ? gpu_driver.version : 0;
}

bool
gpu_one_queue(void)
{
    /* The driver reads it once, when it starts; so do we. */
    static int one = -1;
    if (__atomic_load_n(&one, __ATOMIC_RELAXED) < 0) {
        const char *env = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
        __atomic_store_n(&one, env != NULL && atoi(env) == 1, __ATOMIC_RELAXED);
    }
    return __atomic_load_n(&one, __ATOMIC_RELAXED) == 1;
}

ncclResult_t
gpu_cu_fail(CUresult res, const char *call, const char *file, int line)
{
    const char *name = NULL, *text = NULL;

    if (gpu_cu.cuGetErrorName == NULL || gpu_cu.cuGetErrorName(res, &name) != CUDA_SUCCESS) {
        name = "CUDA_ERROR_?";
    }
    if (gpu_cu.cuGetErrorString == NULL ||
        gpu_cu.cuGetErrorString(res, &text) != CUDA_SUCCESS) {
        text = "unknown error";
    }
    const char *base = strrchr(file, '/');
    WARN("%s:%d: %s failed: %s (%d): %s", base != NULL ? base + 1 : file, line, call, name,
         (int)res, text);
    return ncclUnhandledCudaError;
}

/* Fills devices[ordinal]; called with the lock held. */
static ncclResult_t
gpu_device_fill(int ordinal)
{
    struct gpu_device *d = &gpu_driver.devices[ordinal];
    CUdevice dev;

    GPU_CU_CHECK(cuDeviceGet(&dev, ordinal));
    GPU_CU_CHECK(cuDeviceGetUuid(&d->uuid, dev));
    GPU_CU_CHECK(cuDeviceGetAttribute(&d->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                                      dev));
    GPU_CU_CHECK(cuDeviceGetAttribute(&d->cc_major,
                                      CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    GPU_CU_CHECK(cuDeviceGetAttribute(&d->cc_minor,
                                      CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    int flush = 0;
    GPU_CU_CHECK(cuDeviceGetAttribute(&flush, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, dev));
    d->can_flush = flush != 0;
    GPU_CU_CHECK(cuDevicePrimaryCtxRetain(&d->ctx, dev));
    d->ordinal = ordinal;
    __atomic_store_n(&gpu_driver.known[ordinal], true, __ATOMIC_RELEASE);
    return ncclSuccess;
}

ncclResult_t
gpu_device_get(int ordinal, const struct gpu_device **device_out)
{
    ncclResult_t res = ncclSuccess;

    if (!gpu_driver_present() || ordinal < 0 || ordinal >= gpu_driver.count) {
        WARN("CUDA device %d does not exist (%d visible)", ordinal, gpu_driver.count);
        return ncclInvalidArgument;
    }
    if (!__atomic_load_n(&gpu_driver.known[ordinal], __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&gpu_driver.lock);
        if (!gpu_driver.known[ordinal]) {
            res = gpu_device_fill(ordinal);
        }
        pthread_mutex_unlock(&gpu_driver.lock);
    }
    if (res == ncclSuccess) {
        *device_out = &gpu_driver.devices[ordinal];
    }
    return res;
}

int
gpu_device_count(void)
{
    return gpu_driver_present() ? gpu_driver.count : 0;
}

ncclResult_t
gpu_device_uuid(int ordinal, CUuuid *uuid_out)
{
    CUdevice dev;

    if (ordinal < 0 || ordinal >= gpu_device_count()) {
        WARN("CUDA device %d does not exist (%d visible)", ordinal, gpu_device_count());
        return ncclInvalidArgument;
    }
    GPU_CU_CHECK(cuDeviceGet(&dev, ordinal));
    GPU_CU_CHECK(cuDeviceGetUuid(uuid_out, dev));
    return ncclSuccess;
}

int
gpu_device_by_uuid(const CUuuid *uuid)
{
    for (int i = 0; i < gpu_device_count(); i++) {
        CUuuid u;
        if (gpu_device_uuid(i, &u) == ncclSuccess &&
            memcmp(u.bytes, uuid->bytes, sizeof(u.bytes)) == 0) {
            return i;
        }
    }
    return -1;
}

bool
gpu_device_can_reach(int from, int to)
{
    int can = 0;

    if (from == to) {
        return from >= 0;
    }
    if (from < 0 || to < 0 || from >= gpu_device_count() || to >= gpu_device_count()) {
        return false;
    }
    return gpu_cu.cuDeviceCanAccessPeer(&can, from, to) == CUDA_SUCCESS && can;
}

int
gpu_device_current(void)
{
    CUdevice dev;
    CUcontext ctx = NULL;

    if (!gpu_driver_present() || gpu_cu.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL ||
        gpu_cu.cuCtxGetDevice(&dev) != CUDA_SUCCESS) {
        return -1;
    }
    return (int)dev;
}

ncclResult_t
gpu_device_of_ctx(CUcontext ctx, const struct gpu_device **device_out)
{
    CUdevice dev;
    ncclResult_t res;

    for (int i = 0; i < gpu_device_count(); i++) {
        if (__atomic_load_n(&gpu_driver.known[i], __ATOMIC_ACQUIRE) &&
            gpu_driver.devices[i].ctx == ctx) {
            *device_out = &gpu_driver.devices[i];
            return ncclSuccess;
        }
    }
    /* Not a primary context we hold (a program's own, or a device not yet met). */
    SHIM_CHECK(gpu_ctx_push(ctx));
    CUresult cu = gpu_cu.cuCtxGetDevice(&dev);
    gpu_ctx_pop();
    if (cu != CUDA_SUCCESS) {
        return gpu_cu_fail(cu, "cuCtxGetDevice(a stream's context)", __FILE__, __LINE__);
    }
    res = gpu_device_get((int)dev, device_out);
    return res;
}

ncclResult_t
gpu_ctx_push(CUcontext ctx)
{
    GPU_CU_CHECK(cuCtxPushCurrent(ctx));
    return ncclSuccess;
}

void
gpu_ctx_pop(void)
{
    CUcontext ctx;
    gpu_cu.cuCtxPopCurrent(&ctx);
}

CUstreamCaptureMode
gpu_capture_relax(void)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;

    if (gpu_driver_present()) {
        gpu_cu.cuThreadExchangeStreamCaptureMode(&mode);
    }
    return mode;
}

void
gpu_capture_restore(CUstreamCaptureMode mode)
{
    if (gpu_driver_present()) {
        gpu_cu.cuThreadExchangeStreamCaptureMode(&mode);
    }
}

void
gpu_capture_relax_thread(void)
{
    (void)gpu_capture_relax();
}
