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
    fake_cfg.sync_hang_ms = fake_env_int("FAKE_CUDA_SYNC_HANG_MS", 5000);
    const char *exempt = getenv("FAKE_CUDA_SYNC_EXEMPT");
    snprintf(fake_cfg.sync_exempt, sizeof(fake_cfg.sync_exempt), "%s", exempt ? exempt : "");
    fake_cfg.host_visible = fake_env_int("FAKE_CUDA_HOST_VISIBLE", 0) != 0;
    fake_cfg.no_peer = fake_env_int("FAKE_CUDA_NO_PEER", 0) != 0;
    fake_cfg.can_flush = fake_env_int("FAKE_CUDA_FLUSH_REMOTE_WRITES", 0) != 0;
    fake_cfg.no_host_cumem = fake_env_int("FAKE_CUDA_NO_HOST_CUMEM", 0) != 0;
    const char *ids = getenv("FAKE_CUDA_BUFFER_ID");
    fake_cfg.reservation_ids = ids != NULL && strcmp(ids, "reservation") == 0;
    fake_cfg.store_delay_us = fake_env_int("FAKE_CUDA_STORE_DELAY_US", 20);
    if (fake_cfg.store_delay_us < 0) {
        fake_cfg.store_delay_us = 0;
    }
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

CUresult
fake_need_context(const char *call)
{
    if (fake_ctx_current() == NULL) {
        fake_complain("%s without a current context", call);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    return CUDA_SUCCESS;
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
    case CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
        *text = "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED";
        break;
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

/* The figures of a real GPU, as the driver reports them (cuDeviceGetAttribute); FAKE_CUDA_CC
 * picks the GPU: 90 (the default) an H100 SXM5 80GB, 80 an A100 SXM4 80GB, 70 a V100 SXM2; any
 * other compute capability answers the H100's figures with its own version. The figures below
 * are from the vendors' data sheets and deviceQuery; those marked "unsure" wait for a real H100
 * to print them (tools/gpu/ipc_probe.c prints every attribute the library asks for). */
struct fake_gpu {
    int cc;
    int sm_count;
    int l2_bytes;
    int shared_per_sm, shared_per_block_optin;
    int clock_khz, memory_clock_khz, bus_bits;
};

static const struct fake_gpu fake_gpus[] = {
    {.cc = 90, .sm_count = 132, .l2_bytes = 50 << 20, .shared_per_sm = 228 << 10,
     .shared_per_block_optin = 227 << 10, .clock_khz = 1980000, .memory_clock_khz = 2619000,
     .bus_bits = 5120},
    {.cc = 80, .sm_count = 108, .l2_bytes = 40 << 20, .shared_per_sm = 164 << 10,
     .shared_per_block_optin = 163 << 10, .clock_khz = 1410000, .memory_clock_khz = 1593000,
     .bus_bits = 5120},
    {.cc = 70, .sm_count = 80, .l2_bytes = 6 << 20, .shared_per_sm = 96 << 10,
     .shared_per_block_optin = 96 << 10, .clock_khz = 1530000, .memory_clock_khz = 877000,
     .bus_bits = 4096},
};

static const struct fake_gpu *
fake_gpu(void)
{
    for (size_t i = 0; i < sizeof(fake_gpus) / sizeof(fake_gpus[0]); i++) {
        if (fake_gpus[i].cc == fake_config()->cc) {
            return &fake_gpus[i];
        }
    }
    return &fake_gpus[0];
}

/* The PCI bus of each GPU of a DGX H100 (its 8 GPUs' order under nvidia-smi). */
static const int fake_pci_bus[FAKE_MAX_DEVICES] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

/* The attribute's value on device dev; false for an attribute the double has no figure for. */
static bool
fake_attribute_value(CUdevice_attribute attrib, int dev, int *value)
{
    const struct fake_gpu *gpu = fake_gpu();
    int v;

    switch ((int)attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 48 << 10; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 64 << 10; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = gpu->clock_khz; break;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = gpu->sm_count; break;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = CU_COMPUTEMODE_DEFAULT; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = fake_pci_bus[dev]; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = gpu->memory_clock_khz; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = gpu->bus_bits; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = gpu->l2_bytes; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = fake_config()->cc / 10; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = fake_config()->cc % 10; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = gpu->shared_per_sm; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: v = dev; break;
    /* x86: no native atomics over PCIe, and (no HMM assumed) no pageable memory access. */
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO: v = 2; break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: v = 0; break; /* unsure: 1 with HMM */
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: v = 1; break;
    /* The double's registered memory is reachable by both addresses (memory.c). unsure. */
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
        v = gpu->shared_per_block_optin;
        break;
    /* unsure (0 on x86 hosts, as far as is known; only some platforms flush): FLUSH refused
     * unless FAKE_CUDA_FLUSH_REMOTE_WRITES=1 says the platform can. */
    case CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES: v = fake_config()->can_flush; break;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_DIRECT_MANAGED_MEM_ACCESS_FROM_HOST: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_KMT_HANDLE_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: v = 1; break;
    /* unsure: the host-side flush, and the memops' one where FLUSH is. */
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS:
        v = CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST |
            (fake_config()->can_flush ? CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_MEMOPS : 0);
        break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING: /* unsure */
        v = CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
        break;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: /* unsure */
        v = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        break;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: v = fake_config()->cc >= 90; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: v = fake_config()->cc >= 90 ? 4 : 1; break;
    case CU_DEVICE_ATTRIBUTE_NUMA_CONFIG: v = CU_DEVICE_NUMA_CONFIG_NONE; break;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: v = -1; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: v = 0; break; /* unsure: the node nearest the GPU */
    /* unsure: cuMem host memory (CUDA 12.2 on); FAKE_CUDA_NO_HOST_CUMEM=1 says it has none. */
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
        v = !fake_config()->no_host_cumem;
        break;
    case CU_DEVICE_ATTRIBUTE_MPS_ENABLED: v = 0; break;
    default:
        return false;
    }
    *value = v;
    return true;
}

/* An attribute outside CUdevice_attribute is an invalid value, as cuda.h has it. One inside
 * that the double has no figure for is too, but loudly: the double's figure is then wanting,
 * not the program (a real GPU would answer). */
FAKE_API CUresult
cuDeviceGetAttribute(int *value, CUdevice_attribute attrib, CUdevice dev)
{
    if (fake_device(dev) == NULL) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if (value == NULL || (int)attrib <= 0 || (int)attrib >= (int)CU_DEVICE_ATTRIBUTE_MAX) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (!fake_attribute_value(attrib, dev, value)) {
        fake_complain("cuDeviceGetAttribute(%d): the double knows no real GPU's figure for this "
                      "attribute (add it to proc.c)", (int)attrib);
        return CUDA_ERROR_INVALID_VALUE;
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

/* As cuda.h lists its answers: no current context, no valid peer or the current one itself
 * is an invalid context; flags must be 0; a second enable is ALREADY_ENABLED. (The double
 * lets kernels reach a peer's memory whether enabled or not.) Refused while a capture forbids
 * this thread unsafe calls. */
FAKE_API CUresult
cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    struct CUctx_st *ctx = fake_ctx_current();
    int can = 0;

    FAKE_CAPTURE_CHECK_UNSAFE(); /* it changes every later kernel's reach: unsafe */
    if (ctx == NULL || peer == NULL || peer == ctx || fake_device(peer->device) == NULL ||
        peer != &fake_device(peer->device)->ctx) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    FAKE_STICKY_CHECK();
    cuDeviceCanAccessPeer(&can, ctx->device, peer->device);
    if (!can) {
        return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    }
    unsigned bit = 1u << peer->device;
    unsigned was = __atomic_fetch_or(&ctx->peers, bit, __ATOMIC_ACQ_REL);
    return was & bit ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
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
    FAKE_ENTRY(cuMemPoolCreate, 11020), FAKE_ENTRY(cuMemPoolDestroy, 11020),
    FAKE_ENTRY(cuMemAllocFromPoolAsync, 11020), FAKE_ENTRY(cuMemFreeAsync, 11020),
};

/* As cuda.h documents cuGetProcAddress_v2: the newest variant of `symbol` introduced at or
 * before `version`. A version newer than the driver's is CUDA_ERROR_INVALID_VALUE; a name the
 * driver does not have, or a version older than every variant it has of it, is CUDA_SUCCESS
 * with *pfn NULL, told apart only by *status (SYMBOL_NOT_FOUND, VERSION_NOT_SUFFICIENT). The
 * variants a name had before the oldest the double has are unknown to it: asking for one is
 * VERSION_NOT_SUFFICIENT, never the wrong prototype; and names ncclshim never calls are
 * SYMBOL_NOT_FOUND, as if the platform had none of them. */
FAKE_API CUresult
cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags,
                 CUdriverProcAddressQueryResult *status)
{
    const struct fake_entry *found = NULL;
    bool named = false;
    int driver = 0;

    if (symbol == NULL || pfn == NULL ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    cuDriverGetVersion(&driver);
    if (version > driver) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (size_t i = 0; i < sizeof(fake_entries) / sizeof(fake_entries[0]); i++) {
        const struct fake_entry *e = &fake_entries[i];
        if (strcmp(e->name, symbol) != 0) {
            continue;
        }
        named = true;
        if (e->version <= version && (found == NULL || e->version > found->version)) {
            found = e;
        }
    }
    *pfn = found != NULL ? found->fn : NULL;
    if (status != NULL) {
        *status = found != NULL ? CU_GET_PROC_ADDRESS_SUCCESS
                  : named      ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                               : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return CUDA_SUCCESS;
}
