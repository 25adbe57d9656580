/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory kinds per pointer (one cuPointerGetAttributes call) and ncclMemAlloc's shareable
 * allocations. See memory.h.
 */
#include "memory.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/check.h"
#include "driver.h"

/* gpu_mem_query where a driver is there to ask. */
static void
gpu_mem_query_driver(const void *ptr, struct gpu_mem_info *info_out)
{
    unsigned int type = 0, managed = 0, legacy = 0;
    int ordinal = -1;
    unsigned long long id = 0, handle_types = 0;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUpointer_attribute attrs[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,    CU_POINTER_ATTRIBUTE_IS_MANAGED,
        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_BUFFER_ID,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
    };
    void *data[] = {&type, &managed, &ordinal, &id, &base, &size, &legacy, &handle_types};

    /* Unknown pointers (plain host memory) come back as success with every value zeroed:
     * "this function will not return an error when the ptr encountered is not a valid CUDA
     * pointer". */
    info_out->error = gpu_cu.cuPointerGetAttributes(sizeof(attrs) / sizeof(attrs[0]), attrs,
                                                    data, (CUdeviceptr)(uintptr_t)ptr);
    if (info_out->error != CUDA_SUCCESS || type == 0) {
        return;
    }
    info_out->alloc_id = id;
    if (managed) {
        info_out->kind = GPU_MEM_MANAGED;
    } else if (type == CU_MEMORYTYPE_HOST) {
        info_out->kind = GPU_MEM_REGISTERED;
    } else if (type == CU_MEMORYTYPE_DEVICE) {
        info_out->kind = GPU_MEM_DEVICE;
        info_out->device = ordinal;
        info_out->alloc_base = (uintptr_t)base;
        info_out->alloc_size = size;
        info_out->legacy_ipc = legacy != 0;
        info_out->fd_ipc = (handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
    }
}

/* Every collective asks this of both its buffers: without a driver (host memory only) the
 * answer costs a check, not the attribute list's setup. */
void
gpu_mem_query(const void *ptr, struct gpu_mem_info *info_out)
{
    *info_out = (struct gpu_mem_info){.kind = GPU_MEM_HOST, .device = -1};
    if (ptr != NULL && gpu_driver_present()) {
        gpu_mem_query_driver(ptr, info_out);
    }
}

/* The allocation handle cuMemMap mapped at p ("guaranteed to be the same handle value used to
 * map the memory"), its retain let go again at once: false where p is no cuMemMap's (a memory
 * pool's allocation, say, whatever its handle types). */
static bool
gpu_mem_handle_at(CUdeviceptr p, CUmemGenericAllocationHandle *handle_out)
{
    if (gpu_cu.cuMemRetainAllocationHandle(handle_out, (void *)(uintptr_t)p) != CUDA_SUCCESS) {
        return false;
    }
    gpu_cu.cuMemRelease(*handle_out);
    return true;
}

/* gpu_mem_mapping_holds's answer. Only what cuda.h documents: cuMemGetAddressRange gives "the
 * mapped region" (RANGE_SIZE's documentation points there for it; the reservation is
 * RANGE_START_ADDR's); cuMemMap maps a handle from its byte 0 ("offset ... currently must be
 * zero"); cuMemRetainAllocationHandle names the handle mapped at any address; BUFFER_ID is "unique
 * ... over a process lifetime" per allocation, never reused. (Attributes 18-20,
 * MAPPING_BASE_ADDR and friends, are not documented for cuPointerGetAttribute(s).) Since cuda.h
 * documents cuMemGetAddressRange for cuMemAlloc's memory alone, its region is taken to be one
 * handle's only where the handles at its first and last bytes are one: a driver that answered
 * a reservation mapped from several handles (PyTorch's expandable segments map 2 MiB or 20 MiB
 * chunks into one) is then not believed. */
static bool
gpu_mem_mapping_of(CUdeviceptr ptr, size_t bytes, CUdeviceptr *base, size_t *size,
                   unsigned long long *id)
{
    CUmemGenericAllocationHandle first, last;

    *base = 0;
    *size = 0;
    *id = 0;
    return gpu_cu.cuMemGetAddressRange(base, size, ptr) == CUDA_SUCCESS && *size > 0 &&
           ptr >= *base && bytes <= *size - (ptr - *base) && gpu_mem_handle_at(*base, &first) &&
           gpu_mem_handle_at(*base + *size - 1, &last) && first == last &&
           gpu_cu.cuPointerGetAttribute(id, CU_POINTER_ATTRIBUTE_BUFFER_ID, ptr) == CUDA_SUCCESS;
}

bool
gpu_mem_mapping_holds(const void *ptr, size_t bytes, uintptr_t *base_out, size_t *size_out,
                      uint64_t *id_out)
{
    CUdeviceptr base;
    size_t size;
    unsigned long long id;

    if (!gpu_mem_mapping_of((CUdeviceptr)(uintptr_t)ptr, bytes ? bytes : 1, &base, &size, &id)) {
        return false;
    }
    *base_out = (uintptr_t)base;
    *size_out = size;
    *id_out = id;
    return true;
}

ncclResult_t
gpu_mem_mapping(const void *ptr, uintptr_t *base_out, size_t *size_out, uint64_t *id_out)
{
    if (!gpu_mem_mapping_holds(ptr, 1, base_out, size_out, id_out)) {
        WARN("the CUDA driver cannot tell which one cuMem allocation's mapping %p lies in", ptr);
        return ncclUnhandledCudaError;
    }
    return ncclSuccess;
}

bool
gpu_mem_alive(uintptr_t base, uint64_t id, bool mapping)
{
    CUdeviceptr got_base;
    size_t size;
    unsigned long long got = 0;

    if (mapping) {
        return gpu_mem_mapping_of((CUdeviceptr)base, 1, &got_base, &size, &got) &&
               got_base == (CUdeviceptr)base && got == id;
    }
    return gpu_cu.cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                        (CUdeviceptr)base) == CUDA_SUCCESS &&
           got == id;
}

const char *
gpu_mem_kind_name(enum gpu_mem_kind kind)
{
    switch (kind) {
    case GPU_MEM_HOST:
        return "host memory";
    case GPU_MEM_DEVICE:
        return "device memory";
    case GPU_MEM_MANAGED:
        return "managed memory";
    case GPU_MEM_REGISTERED:
        return "registered host memory";
    }
    return "memory of an unknown kind";
}

/* --- another process's memory ------------------------------------------------------------ */

ncclResult_t
gpu_mem_import(int fd, size_t size, int device, struct gpu_mem_import *out)
{
    CUmemAccessDesc access = {
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    struct gpu_mem_import imp = {.size = size};
    ncclResult_t res;

    GPU_CU_CHECK(cuMemImportFromShareableHandle(&imp.handle, (void *)(uintptr_t)fd,
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    /* Alignment 0: the allocation granularity, as cuMemMap requires. */
    GPU_CU_CHECK_GOTO(cuMemAddressReserve(&imp.base, size, 0, 0, 0), res, err_release);
    GPU_CU_CHECK_GOTO(cuMemMap(imp.base, size, 0, imp.handle, 0), res, err_free);
    GPU_CU_CHECK_GOTO(cuMemSetAccess(imp.base, size, &access, 1), res, err_unmap);
    *out = imp;
    return ncclSuccess;

err_unmap:
    gpu_cu.cuMemUnmap(imp.base, size);
err_free:
    gpu_cu.cuMemAddressFree(imp.base, size);
err_release:
    gpu_cu.cuMemRelease(imp.handle);
    return res;
}

void
gpu_mem_unimport(struct gpu_mem_import *imp)
{
    if (imp->base != 0) {
        gpu_cu.cuMemUnmap(imp->base, imp->size);
        gpu_cu.cuMemAddressFree(imp->base, imp->size);
        gpu_cu.cuMemRelease(imp->handle);
    }
    memset(imp, 0, sizeof(*imp));
}

/* fd's size bytes mapped (populate: at once) and registered for every device's streams. */
static ncclResult_t
gpu_host_map(int fd, size_t size, bool populate, struct gpu_host_import *out)
{
    struct gpu_host_import imp = {.size = size};
    ncclResult_t res;

    imp.host = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0),
                    fd, 0);
    if (imp.host == MAP_FAILED) {
        WARN("cannot map a %zu-byte shared segment: %s", size, strerror(errno));
        return ncclSystemError;
    }
    GPU_CU_CHECK_GOTO(cuMemHostRegister(imp.host, size, CU_MEMHOSTREGISTER_PORTABLE |
                                                            CU_MEMHOSTREGISTER_DEVICEMAP),
                      res, err_unmap);
    GPU_CU_CHECK_GOTO(cuMemHostGetDevicePointer(&imp.dev, imp.host, 0), res, err_unregister);
    *out = imp;
    return ncclSuccess;

err_unregister:
    gpu_cu.cuMemHostUnregister(imp.host);
err_unmap:
    munmap(imp.host, size);
    return res;
}

ncclResult_t
gpu_host_import(int fd, size_t size, struct gpu_host_import *out)
{
    return gpu_host_map(fd, size, false, out);
}

ncclResult_t
gpu_host_segment(const char *name, size_t size, int *fd_out, struct gpu_host_import *out)
{
    int fd = memfd_create(name, MFD_CLOEXEC);

    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        WARN("cannot make a %zu-byte shared segment (%s): %s", size, name, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return ncclSystemError;
    }
    ncclResult_t res = gpu_host_map(fd, size, true, out);
    if (res != ncclSuccess) {
        close(fd);
        return res;
    }
    *fd_out = fd;
    return ncclSuccess;
}

void
gpu_host_unimport(struct gpu_host_import *imp)
{
    if (imp->host != NULL) {
        gpu_cu.cuMemHostUnregister(imp->host);
        munmap(imp->host, imp->size);
    }
    memset(imp, 0, sizeof(*imp));
}

ncclResult_t
gpu_host_cumem_alloc(size_t size, int device, int *fd_out, struct gpu_mem_import *out)
{
    const CUdevice_attribute host_vmm =
        CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
    int vmm = 0, numa = -1;
    size_t granularity = 0;
    struct gpu_mem_import imp = {0};
    int fd = -1;

    if (gpu_cu.cuDeviceGetAttribute(&vmm, host_vmm, device) != CUDA_SUCCESS || !vmm ||
        gpu_cu.cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, device) !=
            CUDA_SUCCESS) {
        INFO(SHIM_ALLOC, "device %d has no cuMem host memory", device);
        return ncclUnhandledCudaError;
    }
    /* -1 "when system does not support NUMA", where cuMemCreate wants node 0. */
    numa = numa < 0 ? 0 : numa;
    CUmemAllocationProp prop = {
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = {.type = CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = numa},
    };
    CUmemAccessDesc access = {
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
        .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    CUresult cu = gpu_cu.cuMemGetAllocationGranularity(&granularity, &prop,
                                                       CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (cu == CUDA_SUCCESS) {
        imp.size = (size + granularity - 1) / granularity * granularity;
        cu = gpu_cu.cuMemCreate(&imp.handle, imp.size, &prop, 0);
    }
    if (cu != CUDA_SUCCESS) {
        const char *name = "?";
        gpu_cu.cuGetErrorName(cu, &name);
        INFO(SHIM_ALLOC, "no cuMem host memory on NUMA node %d for device %d (%s)", numa,
             device, name);
        return ncclUnhandledCudaError;
    }
    cu = gpu_cu.cuMemAddressReserve(&imp.base, imp.size, 0, 0, 0);
    if (cu == CUDA_SUCCESS && (cu = gpu_cu.cuMemMap(imp.base, imp.size, 0, imp.handle, 0)) ==
                                  CUDA_SUCCESS) {
        cu = gpu_cu.cuMemSetAccess(imp.base, imp.size, &access, 1);
        if (cu == CUDA_SUCCESS) {
            cu = gpu_cu.cuMemExportToShareableHandle(&fd, imp.handle,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                     0);
        }
        if (cu != CUDA_SUCCESS) {
            gpu_cu.cuMemUnmap(imp.base, imp.size);
        }
    }
    if (cu != CUDA_SUCCESS) {
        if (imp.base != 0) {
            gpu_cu.cuMemAddressFree(imp.base, imp.size);
        }
        gpu_cu.cuMemRelease(imp.handle);
        return gpu_cu_fail(cu, "mapping cuMem host memory", __FILE__, __LINE__);
    }
    *fd_out = fd;
    *out = imp;
    return ncclSuccess;
}

/* --- ncclMemAlloc ---------------------------------------------------------------------- */

/* What ncclMemAlloc gave out, so that ncclMemFree unmaps exactly that and refuses the rest.
 * A list: programs hold few such buffers. */
struct gpu_mem_block {
    uintptr_t va;
    size_t size;
    CUmemGenericAllocationHandle handle;
    struct gpu_mem_block *next;
};

static pthread_mutex_t gpu_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gpu_mem_block *gpu_mem_blocks;

/* Read-write access for dev and for every device that can reach it. */
static ncclResult_t
gpu_mem_grant(CUdeviceptr va, size_t size, int dev)
{
    int count = 0;

    gpu_cu.cuDeviceGetCount(&count);
    for (int d = 0; d < count; d++) {
        int peer = d == dev;
        if (d != dev) {
            gpu_cu.cuDeviceCanAccessPeer(&peer, d, dev);
        }
        if (peer) {
            CUmemAccessDesc access = {
                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = d},
                .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            GPU_CU_CHECK(cuMemSetAccess(va, size, &access, 1));
        }
    }
    return ncclSuccess;
}

ncclResult_t
gpu_mem_alloc(size_t bytes, void **ptr_out)
{
    int dev = gpu_device_current();
    CUmemAllocationProp prop = {
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev >= 0 ? dev : 0},
    };
    struct gpu_mem_block *block;
    size_t granularity = 0;
    CUdeviceptr va = 0;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&block, 1));
    GPU_CU_CHECK_GOTO(cuMemGetAllocationGranularity(&granularity, &prop,
                                                    CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                      res, err_free);
    block->size = (bytes + granularity - 1) / granularity * granularity;
    block->size = block->size ? block->size : granularity;
    GPU_CU_CHECK_GOTO(cuMemCreate(&block->handle, block->size, &prop, 0), res, err_free);
    GPU_CU_CHECK_GOTO(cuMemAddressReserve(&va, block->size, granularity, 0, 0), res,
                      err_release);
    GPU_CU_CHECK_GOTO(cuMemMap(va, block->size, 0, block->handle, 0), res, err_address);
    SHIM_CHECK_GOTO(gpu_mem_grant(va, block->size, prop.location.id), res, err_unmap);
    block->va = (uintptr_t)va;
    pthread_mutex_lock(&gpu_mem_lock);
    block->next = gpu_mem_blocks;
    gpu_mem_blocks = block;
    pthread_mutex_unlock(&gpu_mem_lock);
    INFO(SHIM_ALLOC, "ncclMemAlloc: %zu bytes at %p on device %d (%zu mapped)", bytes,
         (void *)block->va, prop.location.id, block->size);
    *ptr_out = (void *)block->va;
    return ncclSuccess;

err_unmap:
    gpu_cu.cuMemUnmap(va, block->size);
err_address:
    gpu_cu.cuMemAddressFree(va, block->size);
err_release:
    gpu_cu.cuMemRelease(block->handle);
err_free:
    free(block);
    return res;
}

ncclResult_t
gpu_mem_free(void *ptr)
{
    struct gpu_mem_block *block = NULL;

    pthread_mutex_lock(&gpu_mem_lock);
    for (struct gpu_mem_block **link = &gpu_mem_blocks; *link != NULL;
         link = &(*link)->next) {
        if ((*link)->va == (uintptr_t)ptr) {
            block = *link;
            *link = block->next;
            break;
        }
    }
    pthread_mutex_unlock(&gpu_mem_lock);
    if (block == NULL) {
        WARN("ncclMemFree: %p was not allocated by ncclMemAlloc (or was freed already)", ptr);
        return ncclInvalidArgument;
    }
    CUdeviceptr va = (CUdeviceptr)block->va;
    ncclResult_t res = ncclSuccess;
    GPU_CU_CHECK_GOTO(cuMemUnmap(va, block->size), res, out);
    GPU_CU_CHECK_GOTO(cuMemAddressFree(va, block->size), res, out);
    GPU_CU_CHECK_GOTO(cuMemRelease(block->handle), res, out);
out:
    free(block);
    return res;
}
