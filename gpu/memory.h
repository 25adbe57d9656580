/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What kind of memory a pointer is, asked of the driver per buffer, and the memory that
 * ncclMemAlloc hands out.
 *
 * Kinds, as NCCL treats them: plain host memory (unknown to the driver) is the host path's;
 * device, managed and host-registered (pinned) memory are all reachable by a kernel, and a
 * call on them is stream ordered. For device memory the driver also tells the allocation the
 * pointer lies in (base, size, a process-wide unique id) and how another process may map it:
 * a legacy IPC handle (cudaMalloc) or a POSIX file descriptor (cuMem allocations made
 * shareable, as ncclMemAlloc's and PyTorch's expandable segments are).
 */
#ifndef GPU_MEMORY_H
#define GPU_MEMORY_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gpu_mem_kind {
    GPU_MEM_HOST,       /* not known to the driver */
    GPU_MEM_DEVICE,     /* cudaMalloc, cuMemAlloc, cuMem* mappings */
    GPU_MEM_MANAGED,    /* cudaMallocManaged */
    GPU_MEM_REGISTERED, /* cudaHostAlloc, cudaHostRegister */
};

struct gpu_mem_info {
    enum gpu_mem_kind kind;
    int device;            /* the device it lives on (DEVICE), or -1 */
    uint64_t alloc_id;     /* the allocation's unique id (BUFFER_ID); 0 for HOST */
    uintptr_t alloc_base;  /* the allocation's first byte and size (DEVICE) */
    size_t alloc_size;
    bool legacy_ipc;       /* cuIpcGetMemHandle works on it */
    bool fd_ipc;           /* its cuMem handle exports as a POSIX file descriptor */
    CUresult error;        /* the driver could not answer (HOST then): a sticky error, say */
};

/* Classifies ptr (NULL and every pointer without a driver are HOST). A pointer the driver
 * does not know is host memory; where the driver fails to answer at all (a context made
 * unusable by a fault answers every call with its sticky error) `error` says so, and the
 * caller must not take the pointer for host memory. */
void gpu_mem_query(const void *ptr, struct gpu_mem_info *info_out);
/* Whether a kernel may read and write it (every kind but HOST). */
static inline bool
gpu_mem_reachable(enum gpu_mem_kind kind)
{
    return kind != GPU_MEM_HOST;
}
const char *gpu_mem_kind_name(enum gpu_mem_kind kind);

/* For device memory that exports as a file descriptor (fd_ipc): whether [ptr, ptr + bytes)
 * lies in the mapping of one cuMem allocation, mapped from its first byte (cuMemMap maps no
 * other way), and if so that mapping's first byte and size (cuMemGetAddressRange) and its
 * BUFFER_ID, which the driver never reuses in a process. False, quietly, for memory mapped
 * from several allocations across the range, for a memory pool's allocation (no cuMemMap made
 * it, whatever its handle types), and where the driver cannot tell: such memory is staged.
 * Whether that id changes when the same addresses are unmapped and mapped to a new allocation
 * (PyTorch's expandable segments) is not documented, and not yet seen on a GPU. */
bool gpu_mem_mapping_holds(const void *ptr, size_t bytes, uintptr_t *base_out,
                           size_t *size_out, uint64_t *id_out);
/* The same for the byte at ptr; ncclUnhandledCudaError (with a WARN) where it is not so. */
ncclResult_t gpu_mem_mapping(const void *ptr, uintptr_t *base_out, size_t *size_out,
                             uint64_t *id_out);
/* Whether the allocation with unique id `id` still begins at base: false once it was freed,
 * and once another took its place (a new id). `mapping`: id is a cuMem mapping's, as
 * gpu_mem_mapping tells it; else a cudaMalloc allocation's (gpu_mem_info.alloc_id). */
bool gpu_mem_alive(uintptr_t base, uint64_t id, bool mapping);

/* Another process's cuMem allocation (size bytes, whole), from the file descriptor it
 * exported, mapped in this process for `device` to read and write. The imported handle keeps
 * the memory alive until gpu_mem_unimport, whatever its owner does meanwhile. The caller
 * keeps fd (and closes it). A context must be current. */
struct gpu_mem_import {
    CUmemGenericAllocationHandle handle;
    CUdeviceptr base;
    size_t size;
};
ncclResult_t gpu_mem_import(int fd, size_t size, int device, struct gpu_mem_import *out);
void gpu_mem_unimport(struct gpu_mem_import *imp);

/* Shared host memory another process made (size bytes behind fd, a memory file), mapped here
 * and registered with the driver, so that streams of every device reach it (dev). The caller
 * keeps fd. A context must be current. */
struct gpu_host_import {
    void *host;
    CUdeviceptr dev;
    size_t size;
};
ncclResult_t gpu_host_import(int fd, size_t size, struct gpu_host_import *out);
/* This process's own such segment: a fresh memory file (name shows in /proc) of size bytes,
 * mapped and populated here, registered like an import; *fd_out stays open, for other
 * processes to import (the caller closes it). Nothing is left behind on failure. */
ncclResult_t gpu_host_segment(const char *name, size_t size, int *fd_out,
                              struct gpu_host_import *out);
void gpu_host_unimport(struct gpu_host_import *imp);

/* Pinned host memory as a cuMem allocation (CU_MEM_LOCATION_TYPE_HOST_NUMA, the node nearest
 * `device`), of at least size bytes (*out: its size, rounded to the granularity), mapped here
 * for `device` to read and write, and exported as a POSIX file descriptor (*fd_out, the caller
 * closes it) that another process maps with gpu_mem_import, with no registration: unlike
 * cuMemHostRegister, which page-locks memory and synchronizes the device's context (CUDA's
 * implicit synchronization), cuMemImportFromShareableHandle, cuMemMap and cuMemSetAccess are
 * no such synchronization. Making it is one (cuMemCreate). ncclUnhandledCudaError (quietly,
 * with an INFO) where the driver has no such memory (a host without NUMA, an older driver).
 * A context must be current. Let go with gpu_mem_unimport. */
ncclResult_t gpu_host_cumem_alloc(size_t size, int device, int *fd_out,
                                  struct gpu_mem_import *out);

/* ncclMemAlloc: device memory of the current device (device 0 without a current context)
 * as a cuMem allocation whose handle exports as a file descriptor, so another rank's process
 * can map it; rounded up to the allocation granularity and mapped read-write for that device.
 * ncclMemFree takes back exactly what this gave out, and refuses anything else with
 * ncclInvalidArgument. */
ncclResult_t gpu_mem_alloc(size_t bytes, void **ptr_out);
ncclResult_t gpu_mem_free(void *ptr);

#endif
