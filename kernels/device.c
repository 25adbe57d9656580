/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Loading the embedded fatbin once per device, and launching batches (device.h).
 */
#include "device.h"

#include <pthread.h>
#include <string.h>

#include "base/check.h"
#include "fatbin_table.h"

/* fatbin.S: the kernels as nvcc built them; empty without nvcc. */
extern const unsigned char kr_fatbin_start[];
extern const unsigned char kr_fatbin_end[];

enum kr_dev_kernel {
#define KR_DEV_KERNEL_ENUM(type, suffix) KR_DEV_REDUCE_##suffix,
    KR_DEV_TYPE_NAMES(KR_DEV_KERNEL_ENUM)
#undef KR_DEV_KERNEL_ENUM
    KR_DEV_COPY,
    KR_DEV_FROM,
    KR_DEV_SIGNAL,
    KR_DEV_KERNELS
};
/* A batch names its by-value kernel for kr_dev_from by the same number. */
_Static_assert((int)KR_DEV_COPY == (int)KR_DEV_ID_COPY, "kernel numbers differ");

static const struct {
    ncclDataType_t type;
    const char *name;
} kr_dev_kernels[KR_DEV_KERNELS] = {
#define KR_DEV_KERNEL_NAME(type, suffix) [KR_DEV_REDUCE_##suffix] = {type, "kr_dev_reduce_" #suffix},
    KR_DEV_TYPE_NAMES(KR_DEV_KERNEL_NAME)
#undef KR_DEV_KERNEL_NAME
    [KR_DEV_COPY] = {ncclInt8, "kr_dev_copy"},
    [KR_DEV_FROM] = {ncclInt8, "kr_dev_from"},
    [KR_DEV_SIGNAL] = {ncclInt8, "kr_dev_signal"},
};

/* One per device: its module and functions, loaded on first use and kept. */
static struct {
    bool loaded; /* atomic */
    CUmodule module;
    CUfunction functions[KR_DEV_KERNELS];
} kr_dev_modules[GPU_MAX_DEVICES];
static pthread_mutex_t kr_dev_lock = PTHREAD_MUTEX_INITIALIZER;

/* Blocks of a launch: enough to keep every SM busy at a task's size, threads per block by
 * size (small tasks need few threads, and launch no faster with many). */
#define KR_DEV_THREADS_SMALL 128
#define KR_DEV_THREADS 512
#define KR_DEV_SMALL_BYTES 65536
#define KR_DEV_BLOCKS_PER_SM 4

/* The fatbin's size; two symbols of one section, compared as addresses. */
static size_t
kr_fatbin_bytes(void)
{
    return (size_t)((uintptr_t)kr_fatbin_end - (uintptr_t)kr_fatbin_start);
}

bool
kr_dev_available(void)
{
    return kr_fatbin_bytes() > 0;
}

ncclResult_t
kr_dev_check_available(const char *api)
{
    if (!kr_dev_available()) {
        WARN("%s: this libnccl.so.2 was built without its CUDA kernels (no nvcc at build "
             "time), so it serves host memory only; rebuild with the CUDA toolkit installed",
             api);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* Loads the module into the device's context; called with the lock held. Module loading is
 * among what a global-mode capture forbids, and the first call to load may be made inside
 * the caller's capture: it runs in relaxed mode. */
static ncclResult_t
kr_dev_load(const struct gpu_device *device)
{
    CUmodule module;
    ncclResult_t res;

    SHIM_CHECK(gpu_ctx_push(device->ctx));
    CUstreamCaptureMode mode = gpu_capture_relax();
    GPU_CU_CHECK_GOTO(cuModuleLoadData(&module, kr_fatbin_start), res, out);
    for (int k = 0; k < KR_DEV_KERNELS; k++) {
        CUfunction *f = &kr_dev_modules[device->ordinal].functions[k];
        GPU_CU_CHECK_GOTO(cuModuleGetFunction(f, module, kr_dev_kernels[k].name), res,
                          err_unload);
        /* Under CUDA_MODULE_LOADING=LAZY a function's code loads at its first launch, which
         * synchronizes the context: load it now, before any stream of ours waits. */
        if (gpu_cu.cuFuncLoad != NULL) {
            GPU_CU_CHECK_GOTO(cuFuncLoad(*f), res, err_unload);
        }
    }
    kr_dev_modules[device->ordinal].module = module;
    __atomic_store_n(&kr_dev_modules[device->ordinal].loaded, true, __ATOMIC_RELEASE);
    INFO(SHIM_INIT, "CUDA kernels loaded on device %d (compute capability %d.%d, %zu-byte "
         "fatbin)", device->ordinal, device->cc_major, device->cc_minor, kr_fatbin_bytes());
    res = ncclSuccess;
    goto out;
err_unload:
    gpu_cu.cuModuleUnload(module);
out:
    gpu_capture_restore(mode);
    gpu_ctx_pop();
    return res;
}

/* The fatbin's table, read once. */
static struct kr_fatbin_info kr_dev_fatbin;
static pthread_once_t kr_dev_fatbin_once = PTHREAD_ONCE_INIT;

static void
kr_dev_fatbin_read(void)
{
    if (!kr_fatbin_read(kr_fatbin_start, kr_fatbin_bytes(), &kr_dev_fatbin)) {
        memset(&kr_dev_fatbin, 0, sizeof(kr_dev_fatbin));
    }
}

static ncclResult_t kr_dev_function(const struct gpu_device *device, enum kr_dev_kernel kernel,
                                    CUfunction *function_out);

static bool
kr_dev_loaded(const struct gpu_device *device)
{
    return __atomic_load_n(&kr_dev_modules[device->ordinal].loaded, __ATOMIC_ACQUIRE);
}

/* Code from CUDA N's nvcc needs a driver of CUDA N.0 or newer (cubins and PTX alike). */
static bool
kr_dev_serves(const struct gpu_device *device)
{
    pthread_once(&kr_dev_fatbin_once, kr_dev_fatbin_read);
    return gpu_driver_version() >= CUDA_VERSION / 1000 * 1000 &&
           kr_fatbin_serves(&kr_dev_fatbin, device->cc_major * 10 + device->cc_minor);
}

ncclResult_t
kr_dev_check_device(const char *api, const struct gpu_device *device)
{
    const int needed = CUDA_VERSION / 1000 * 1000, driver = gpu_driver_version();
    char held[256];
    CUfunction any;

    /* Loaded once the check passed: every later call of the device's is served at once. */
    if (kr_dev_loaded(device)) {
        return ncclSuccess;
    }
    SHIM_CHECK(kr_dev_check_available(api));
    if (!kr_dev_serves(device)) {
        kr_fatbin_describe(&kr_dev_fatbin, held, sizeof(held));
        WARN("%s: ncclshim's CUDA kernels cannot run on device %d (compute capability %d.%d) "
             "with CUDA driver %d.%d: they were built by CUDA %d.%d and need a driver of CUDA "
             "%d.0 or newer and a GPU they hold code for (%s)", api, device->ordinal,
             device->cc_major, device->cc_minor, driver / 1000, driver % 1000 / 10,
             CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10, needed / 1000, held);
        return ncclInvalidUsage;
    }
    return kr_dev_function(device, KR_DEV_COPY, &any);
}

void
kr_dev_preload(const struct gpu_device *device)
{
    CUfunction any;

    if (kr_dev_loaded(device) || !kr_dev_available()) {
        return;
    }
    if (kr_dev_serves(device) && kr_dev_function(device, KR_DEV_COPY, &any) != ncclSuccess) {
        INFO(SHIM_INIT, "device %d: the kernels did not load now; the first device call "
             "tries again", device->ordinal);
    }
}

static ncclResult_t
kr_dev_function(const struct gpu_device *device, enum kr_dev_kernel kernel,
                CUfunction *function_out)
{
    ncclResult_t res = ncclSuccess;

    SHIM_CHECK(kr_dev_check_available("a kernel launch"));
    if (!__atomic_load_n(&kr_dev_modules[device->ordinal].loaded, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&kr_dev_lock);
        if (!kr_dev_modules[device->ordinal].loaded) {
            res = kr_dev_load(device);
        }
        pthread_mutex_unlock(&kr_dev_lock);
    }
    if (res == ncclSuccess) {
        *function_out = kr_dev_modules[device->ordinal].functions[kernel];
    }
    return res;
}

static enum kr_dev_kernel
kr_dev_kernel_of(ncclDataType_t type)
{
    for (int k = 0; k < KR_DEV_COPY; k++) {
        if (kr_dev_kernels[k].type == type) {
            return (enum kr_dev_kernel)k;
        }
    }
    return KR_DEV_COPY;
}

void
kr_dev_begin(struct kr_dev_launch *l, CUstream stream, const struct gpu_device *device,
             const struct kr_redop *op)
{
    memset(l, 0, offsetof(struct kr_dev_launch, batch));
    memset(&l->batch, 0, offsetof(struct kr_dev_batch, tasks));
    l->stream = stream;
    l->device = device;
    l->copy = op == NULL;
    l->batch.kernel = op == NULL ? KR_DEV_ID_COPY : (uint32_t)kr_dev_kernel_of(op->type);
    if (op != NULL) {
        l->type = op->type;
        l->batch.kind = (uint32_t)op->kind;
        l->batch.divisor = op->divisor;
        l->post = op->kind == KR_SUMPOSTDIV;
    }
}

void
kr_dev_begin_collect(struct kr_dev_launch *l, const struct gpu_device *device,
                     const struct kr_redop *op)
{
    kr_dev_begin(l, NULL, device, op);
    l->collect = true;
}

void
kr_dev_set_post(struct kr_dev_launch *l, bool post)
{
    l->post = !l->copy && post && l->batch.kind == KR_SUMPOSTDIV;
}

void
kr_dev_set_level(struct kr_dev_launch *l, uint8_t level)
{
    l->level = level;
}

static uint32_t
kr_dev_nsrcs(const struct kr_dev_batch *b)
{
    const struct kr_dev_task *last = b->ntasks ? &b->tasks[b->ntasks - 1] : NULL;
    return last != NULL ? last->first_src + last->nsrc : 0;
}

static uint32_t
kr_dev_ndsts(const struct kr_dev_batch *b)
{
    const struct kr_dev_task *last = b->ntasks ? &b->tasks[b->ntasks - 1] : NULL;
    return last != NULL ? last->first_dst + last->ndst : 0;
}

ncclResult_t
kr_dev_add(struct kr_dev_launch *l, const struct kr_dev_src *srcs, int nsrc,
           const uint64_t *dsts, int ndst, uint64_t count)
{
    struct kr_dev_batch *b = &l->batch;

    if (nsrc < 1 || nsrc > KR_DEV_MAX_SRCS || ndst > KR_DEV_MAX_DSTS || (l->copy && nsrc != 1)) {
        WARN("a kernel task with %d operands and %d destinations (at most %d and %d%s)", nsrc,
             ndst, KR_DEV_MAX_SRCS, KR_DEV_MAX_DSTS, l->copy ? ", one operand to copy" : "");
        return ncclInternalError;
    }
    if (count == 0 || ndst == 0) {
        return ncclSuccess;
    }
    for (int i = 0; i < nsrc + ndst; i++) {
        if ((i < nsrc ? srcs[i].ptr : dsts[i - nsrc]) == 0) {
            WARN("a kernel task whose %s %d is a null address", i < nsrc ? "operand" : "destination",
                 i < nsrc ? i : i - nsrc);
            return ncclInternalError;
        }
    }
    if (b->ntasks > 0 && b->tasks[b->ntasks - 1].level > l->level) {
        WARN("a kernel task of level %u after one of level %u: a batch's levels ascend",
             l->level, b->tasks[b->ntasks - 1].level);
        return ncclInternalError;
    }
    if (b->ntasks == KR_DEV_MAX_TASKS || kr_dev_nsrcs(b) + (uint32_t)nsrc > KR_DEV_MAX_SRCS ||
        kr_dev_ndsts(b) + (uint32_t)ndst > KR_DEV_MAX_DSTS) {
        SHIM_CHECK(kr_dev_end(l));
    }
    struct kr_dev_task *t = &b->tasks[b->ntasks];
    t->first_src = (uint16_t)kr_dev_nsrcs(b);
    t->first_dst = (uint16_t)kr_dev_ndsts(b);
    t->nsrc = (uint8_t)nsrc;
    t->ndst = (uint8_t)ndst;
    t->post = l->post;
    t->level = l->level;
    t->count = count;
    memcpy(&b->srcs[t->first_src], srcs, (size_t)nsrc * sizeof(*srcs));
    memcpy(&b->dsts[t->first_dst], dsts, (size_t)ndst * sizeof(*dsts));
    b->ntasks++;
    l->max_count = count > l->max_count ? count : l->max_count;
    return ncclSuccess;
}

/* The grid of a launch whose largest task moves `bytes`: threads per block by size, blocks
 * enough to spread it over the device's SMs (a thread moves 16 bytes at a time), shared by
 * the batch's tasks. */
static void
kr_dev_grid(const struct gpu_device *device, uint64_t bytes, uint32_t ntasks, unsigned *blocks_out,
            unsigned *threads_out)
{
    unsigned threads = bytes <= KR_DEV_SMALL_BYTES ? KR_DEV_THREADS_SMALL : KR_DEV_THREADS;
    uint64_t blocks = (bytes / 16 + threads - 1) / threads;
    uint64_t most = (uint64_t)device->sm_count * KR_DEV_BLOCKS_PER_SM / (ntasks ? ntasks : 1);

    most = most > 0 ? most : 1;
    *blocks_out = (unsigned)(blocks < 1 ? 1 : blocks > most ? most : blocks);
    *threads_out = threads;
}

static ncclResult_t
kr_dev_launch(const struct gpu_device *device, enum kr_dev_kernel kernel, unsigned blocks,
              unsigned ntasks, unsigned threads, CUstream stream, void *param)
{
    CUfunction function = NULL;
    void *params[] = {param};
    ncclResult_t res;

    SHIM_CHECK(kr_dev_function(device, kernel, &function));
    SHIM_CHECK(gpu_ctx_push(device->ctx));
    GPU_CU_CHECK_GOTO(cuLaunchKernel(function, blocks, ntasks, 1, threads, 1, 1, 0, stream,
                                     params, NULL),
                      res, out);
    res = ncclSuccess;
out:
    gpu_ctx_pop();
    return res;
}

ncclResult_t
kr_dev_end(struct kr_dev_launch *l)
{
    ncclResult_t res;

    if (l->batch.ntasks == 0) {
        return ncclSuccess;
    }
    if (l->collect) {
        WARN("a device batch of %u tasks is full: one launch cannot take this share",
             l->batch.ntasks);
        return ncclInternalError;
    }
    unsigned blocks, threads;
    uint64_t bytes = l->copy ? l->max_count : l->max_count * kr_type_size(l->type);
    kr_dev_grid(l->device, bytes, l->batch.ntasks, &blocks, &threads);
    res = kr_dev_launch(l->device, (enum kr_dev_kernel)l->batch.kernel, blocks,
                        l->batch.ntasks, threads, l->stream, &l->batch);
    l->batch.ntasks = 0;
    l->max_count = 0;
    return res;
}

ncclResult_t
kr_dev_launch_from(CUstream stream, const struct gpu_device *device, uint64_t max_task_bytes,
                   uint32_t max_tasks, CUdeviceptr batch, uint32_t level)
{
    struct kr_dev_from_args args = {.batch = batch, .level = level};
    unsigned blocks, threads;

    if (max_tasks == 0 || max_tasks > KR_DEV_MAX_TASKS) {
        WARN("a device launch of up to %u tasks (at most %d)", max_tasks, KR_DEV_MAX_TASKS);
        return ncclInternalError;
    }
    kr_dev_grid(device, max_task_bytes, max_tasks, &blocks, &threads);
    return kr_dev_launch(device, KR_DEV_FROM, blocks, max_tasks, threads, stream, &args);
}

ncclResult_t
kr_dev_signal_from(CUstream stream, const struct gpu_device *device, CUdeviceptr signals)
{
    return kr_dev_launch(device, KR_DEV_SIGNAL, 1, 1, 32, stream, &signals);
}
