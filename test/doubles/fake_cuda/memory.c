/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fake driver's memory. Device memory is a memfd mapped into the process: its address is
 * the device pointer, and another process maps the same pages through /proc/<pid>/fd/<fd>
 * (legacy IPC) or the memfd itself (a cuMem handle exported as a file descriptor). Every
 * range the driver knows (allocations, registrations, IPC mappings) is one entry of one list,
 * which pointer attributes are answered from. Allocating device memory, page-locking host
 * memory and mapping (cuMemMap, cuIpcOpenMemHandle) synchronize their context (stream.c,
 * fake_ctx_sync); freeing, unregistering and unmapping (cuMemUnmap, cuIpcCloseMemHandle, and
 * cuMemSetAccess, which cuda.h marks \note_sync as cuMemUnmap) also wait for its earlier work.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cuda.h"

#define FAKE_IPC_MAGIC 0xfa4ec0daU
/* cuMemGetAllocationGranularity's answer, minimum and recommended alike, as an H100's (and
 * every other current GPU's) device memory has it. */
#define FAKE_GRANULARITY ((size_t)2 << 20)

/* A cuMem physical allocation: its memfd and references (creation, mappings, retains). */
struct fake_handle {
    int memfd;
    size_t size;
    int device;   /* -1: pinned host memory (a HOST or HOST_NUMA location) */
    int refs;
    bool imported;
    unsigned handle_types; /* CUmemAllocationProp.requestedHandleTypes: what it may export to */
    uint64_t id;
};

/* A cuMemAddressReserve range, which cuMemMap maps into; the double's own view of it (what
 * its mappings' shadows are part of) is reserved alike. */
struct fake_reservation {
    uintptr_t base;
    size_t size;
    uintptr_t shadow;
    uint64_t id;      /* its BUFFER_ID, with FAKE_CUDA_BUFFER_ID=reservation */
    struct fake_reservation *next;
};

/* A memory pool (cuMemPoolCreate): where its allocations live and how they may be shared. */
struct CUmemPoolHandle_st {
    int device;
    unsigned handle_types;
    int allocations; /* not yet freed */
    bool destroyed;
};

struct fake_range {
    uintptr_t base;
    size_t size;
    enum fake_mem_kind kind;
    int device;
    uint64_t id;
    int memfd;                   /* cuMemAlloc: the memfd, kept open for IPC; else -1 */
    struct fake_handle *handle;  /* a cuMem mapping: what it maps */
    struct CUmemPoolHandle_st *pool; /* a pool's allocation (cuMemAllocFromPoolAsync) */
    int pool_fd;                 /* ... its memfd (no legacy IPC handle names it) */
    unsigned access;             /* cuMem or pool memory: the devices that may read, write it */
    unsigned reg_flags;          /* registered or host-allocated memory: its flags */
    bool mapped;                 /* we mmap'd it (cuMemAlloc, managed, host alloc, IPC) */
    int ipc_refs;                /* a cuIpcOpenMemHandle mapping: opens not yet closed */
    int ipc_pid, ipc_fd;         /* ... of the owner's pid and memfd */
    int ipc_lock_fd;             /* ... the owner's memfd opened again, read-locked (below) */
    uintptr_t alias;             /* registered host memory: its device address (see below) */
    uintptr_t shadow;            /* device memory: where the double itself reaches it */
    bool exported;               /* cuIpcGetMemHandle gave a handle of it */
    size_t offset;               /* a cuMem mapping: where it starts in its allocation */
    struct fake_range *next;
};

/* The legacy IPC handle's layout inside CUipcMemHandle's 64 bytes. */
struct fake_ipc_handle {
    uint32_t magic;
    int32_t pid;
    int32_t fd;
    int32_t device;
    uint64_t size;
    uint64_t id;
};

static pthread_mutex_t fake_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_range *fake_ranges;
static struct fake_reservation *fake_reservations;
static uint64_t fake_next_id = 1;

static struct fake_reservation *fake_reservation_find(uintptr_t p, size_t size);

/* With the lock held. */
static struct fake_range *
fake_range_find(uintptr_t p)
{
    for (struct fake_range *r = fake_ranges; r != NULL; r = r->next) {
        if (p >= r->base && p < r->base + (r->size ? r->size : 1)) {
            return r;
        }
    }
    return NULL;
}

/* cuMem allocations' memory files are named this, then their device's ordinal; pinned host
 * ones, the other. */
#define FAKE_MEMFD_DEVICE "fake-cuda-dev"
#define FAKE_MEMFD_HOST "fake-cuda-host"

static struct fake_range *
fake_range_add(uintptr_t base, size_t size, enum fake_mem_kind kind, int device)
{
    struct fake_range *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return NULL;
    }
    r->base = base;
    r->size = size;
    r->kind = kind;
    r->device = device;
    r->memfd = -1;
    r->pool_fd = -1;
    r->id = fake_next_id++;
    r->next = fake_ranges;
    fake_ranges = r;
    return r;
}

static void
fake_range_remove(struct fake_range *gone)
{
    for (struct fake_range **link = &fake_ranges; *link != NULL; link = &(*link)->next) {
        if (*link == gone) {
            *link = gone->next;
            free(gone);
            return;
        }
    }
}

/* Registered host memory's device address. cuMemHostGetDevicePointer: it "may or may not
 * match the original host pointer"; here it never does: an inaccessible reservation of the
 * same size, which the double's streams, copies and kernels translate back, so host code that
 * dereferences a device address faults, and device work given either address works (as on
 * devices with CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM). With the lock held. */
static bool
fake_alias_reserve(struct fake_range *r)
{
    void *va = mmap(NULL, r->size ? r->size : 1, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (va == MAP_FAILED) {
        return false;
    }
    r->alias = (uintptr_t)va;
    return true;
}

static void
fake_alias_release(struct fake_range *r)
{
    if (r->alias != 0) {
        munmap((void *)r->alias, r->size ? r->size : 1);
        r->alias = 0;
    }
}

uintptr_t
fake_mem_host_of(uintptr_t addr)
{
    uintptr_t host = addr;

    pthread_mutex_lock(&fake_mem_lock);
    for (struct fake_range *r = fake_ranges; r != NULL; r = r->next) {
        size_t size = r->size ? r->size : 1;
        if (r->alias != 0 && addr >= r->alias && addr < r->alias + size) {
            host = r->base + (addr - r->alias);
            break;
        }
        if (r->shadow != 0 && addr >= r->base && addr < r->base + size) {
            host = r->shadow + (addr - r->base);
            break;
        }
    }
    pthread_mutex_unlock(&fake_mem_lock);
    return host;
}

uintptr_t
fake_mem_op_target(uint64_t addr)
{
    enum fake_mem_kind kind;
    int device;
    uintptr_t host = fake_mem_host_of((uintptr_t)addr);
    bool known = host != (uintptr_t)addr || fake_mem_lookup((uintptr_t)addr, &kind, &device);
    return addr % 4 == 0 && known ? host : 0;
}

/* Device memory as a GPU has it: the program's address (returned, *app_out) is an
 * inaccessible reservation, so host code that touches device memory faults at once; the
 * double's streams, copies and kernels reach the pages through a mapping of their own
 * (*shadow_out) that fake_mem_host_of translates to. At fixed (cuMemMap) the reservation is
 * the program's already, and the shadow goes at shadow_fixed, in the reservation's own shadow,
 * so that a copy or kernel running across two mappings of one reservation finds the second
 * right after the first, as on a GPU. false if the address space is short. */
static bool
fake_shadow_map(int fd, off_t offset, size_t len, uintptr_t fixed, uintptr_t shadow_fixed,
                uintptr_t *app_out, uintptr_t *shadow_out)
{
    len = len ? len : 1;
    void *shadow = mmap((void *)shadow_fixed, len, PROT_READ | PROT_WRITE,
                        MAP_SHARED | (shadow_fixed ? MAP_FIXED : 0), fd, offset);
    if (shadow == MAP_FAILED) {
        return false;
    }
    void *app = (void *)fixed;
    if (fake_config()->host_visible) {
        /* As a UCX built with CUDA sees it (FAKE_CUDA_HOST_VISIBLE=1): the same pages. */
        app = mmap(app, len, PROT_READ | PROT_WRITE, MAP_SHARED | (fixed ? MAP_FIXED : 0), fd,
                   offset);
    } else if (fixed == 0) {
        app = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    }
    if (app == MAP_FAILED) {
        munmap(shadow, len);
        return false;
    }
    *app_out = (uintptr_t)app;
    *shadow_out = (uintptr_t)shadow;
    return true;
}

bool
fake_mem_device_reaches(uintptr_t host, int device)
{
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find(host);
    bool reaches = r == NULL || (r->handle == NULL && r->pool == NULL) ||
                   (r->access & (1u << device)) != 0;
    pthread_mutex_unlock(&fake_mem_lock);
    return reaches;
}

static int
fake_current_device(void)
{
    struct CUctx_st *ctx = fake_ctx_current();
    return ctx != NULL ? ctx->device : 0;
}

bool
fake_mem_lookup(uintptr_t p, enum fake_mem_kind *kind_out, int *device_out)
{
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find(p);
    if (r != NULL) {
        *kind_out = r->kind;
        *device_out = r->device;
    }
    pthread_mutex_unlock(&fake_mem_lock);
    return r != NULL;
}

CUresult
fake_mem_op_check(uintptr_t addr, int device, uintptr_t *word_out, bool *fault_out)
{
    const char *why = NULL;
    struct fake_range *r = NULL;
    uintptr_t word = addr;

    *fault_out = false;
    pthread_mutex_lock(&fake_mem_lock);
    for (struct fake_range *a = fake_ranges; a != NULL && r == NULL; a = a->next) {
        if (a->alias != 0 && addr >= a->alias && addr < a->alias + (a->size ? a->size : 1)) {
            r = a; /* registered memory by its device address */
            word = a->base + (addr - a->alias);
        }
    }
    if (r == NULL && (r = fake_range_find(addr)) != NULL && r->shadow != 0) {
        word = r->shadow + (addr - r->base);
    }
    if (addr % 4 != 0) {
        why = "is not 4-byte aligned";
    } else if (r == NULL) {
        why = "is neither device memory nor registered host memory";
    } else if (r->kind == FAKE_MEM_MANAGED) {
        why = "is managed memory (\"None of the operations accepts pointers to managed memory\")";
    } else if (r->kind == FAKE_MEM_REGISTERED && !(r->reg_flags & CU_MEMHOSTREGISTER_DEVICEMAP)) {
        why = "is host memory registered without CU_MEMHOSTREGISTER_DEVICEMAP (no device "
              "address)";
    } else if (r->kind == FAKE_MEM_REGISTERED && !(r->reg_flags & CU_MEMHOSTREGISTER_PORTABLE) &&
               r->device != device) {
        why = "is host memory registered by another device's context without "
              "CU_MEMHOSTREGISTER_PORTABLE";
    } else if ((r->handle != NULL || r->pool != NULL) && !(r->access & (1u << device))) {
        *fault_out = true; /* enqueued; an illegal address when it runs */
    }
    pthread_mutex_unlock(&fake_mem_lock);
    if (why != NULL) {
        fake_complain("a stream memory operation on device %d at 0x%lx, which %s", device,
                      (unsigned long)addr, why);
        return CUDA_ERROR_INVALID_VALUE;
    }
    *word_out = word;
    return CUDA_SUCCESS;
}

/* A fresh memfd of size bytes, mapped as device memory (fake_shadow_map); -1 on failure. */
static int
fake_memfd_map(size_t size, uintptr_t *app_out, uintptr_t *shadow_out)
{
    int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
    size_t len = size ? size : 1;

    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    if (!fake_shadow_map(fd, 0, len, 0, 0, app_out, shadow_out)) {
        close(fd);
        return -1;
    }
    return fd;
}

/* --- allocations ---------------------------------------------------------------------------- */

/* cuIpcOpenMemHandle: "Calling cuMemFree on an exported memory region before calling
 * cuIpcCloseMemHandle in the importing context will result in undefined behavior." So that
 * the owner's cuMemFree can tell, an importer holds a read lock (an open file description's
 * lock, so one per opening) on the allocation's memfd for as long as it maps it; the owner
 * asks for a write lock at free. Locks go with the importer's process, as mappings do. */
static bool
fake_ipc_lock(int fd, short type)
{
    struct flock lock = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};

    return fcntl(fd, F_OFD_SETLK, &lock) == 0;
}

FAKE_API CUresult
cuMemAlloc(CUdeviceptr *dptr, size_t bytes)
{
    uintptr_t addr, shadow;

    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    fake_ctx_sync(fake_ctx_current(), "cuMemAlloc", false); /* "a device memory allocation" */
    int fd = fake_memfd_map(bytes, &addr, &shadow);
    if (fd < 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_add(addr, bytes, FAKE_MEM_DEVICE, fake_current_device());
    if (r != NULL) {
        r->memfd = fd;
        r->mapped = true;
        r->shadow = shadow;
    }
    pthread_mutex_unlock(&fake_mem_lock);
    if (r == NULL) {
        munmap((void *)addr, bytes ? bytes : 1);
        munmap((void *)shadow, bytes ? bytes : 1);
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = (CUdeviceptr)addr;
    return CUDA_SUCCESS;
}

/* The context of the device p's allocation lives on, for a call that needs none current. */
static struct CUctx_st *
fake_ctx_of(uintptr_t p)
{
    enum fake_mem_kind kind;
    int device;

    if (fake_ctx_current() != NULL) {
        return fake_ctx_current();
    }
    return fake_mem_lookup(p, &kind, &device) && fake_device(device) != NULL
               ? &fake_device(device)->ctx
               : NULL;
}

/* A mapping call's implicit synchronization: of the current context and of every device's in
 * the mask `devices` (those it maps for or on), each once. block: as cuMemFree, the call
 * returns once their earlier work is done (cuMemUnmap and cuMemSetAccess are \note_sync);
 * else as cuMemAlloc. Never with fake_mem_lock held. */
static void
fake_mem_sync(unsigned devices, const char *call, bool block)
{
    struct CUctx_st *current = fake_ctx_current();

    fake_ctx_sync(current, call, block);
    for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
        if ((devices & (1u << d)) && fake_device(d) != NULL &&
            &fake_device(d)->ctx != current) {
            fake_ctx_sync(&fake_device(d)->ctx, call, block);
        }
    }
}

/* The devices of the cuMem mapping at ptr, as a mask: the one its memory lives on, and with
 * `granted` those it is open to; 0 where nothing is mapped there. */
static unsigned
fake_mapping_devices(CUdeviceptr ptr, bool granted)
{
    unsigned devices = 0;

    pthread_mutex_lock(&fake_mem_lock);
    const struct fake_range *m = fake_range_find((uintptr_t)ptr);
    if (m != NULL && m->handle != NULL) {
        devices = (granted ? m->access : 0) |
                  (m->handle->device >= 0 ? 1u << m->handle->device : 0);
    }
    pthread_mutex_unlock(&fake_mem_lock);
    return devices;
}

FAKE_API CUresult
cuMemFree(CUdeviceptr dptr)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    if (fake_pool_free((uintptr_t)dptr)) {
        /* "will not perform any implicit synchronization when the pointer was allocated with
         * cuMemAllocAsync or cuMemAllocFromPoolAsync" */
        return CUDA_SUCCESS;
    }
    /* Not in the programming guide's list, but cudaFree synchronizes: conservatively, it
     * returns once all work enqueued before it in the context is done (so a thread that would
     * release a stream's wait must not make it meanwhile). Never with fake_mem_lock held: the
     * streams' workers translate addresses under it. */
    fake_ctx_sync(fake_ctx_of((uintptr_t)dptr), "cuMemFree", true);
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)dptr);
    /* cuMemAlloc's memory, or managed memory (cuMemFree frees both). */
    if (r == NULL || r->base != (uintptr_t)dptr ||
        (r->memfd < 0 && !(r->kind == FAKE_MEM_MANAGED && r->mapped))) {
        pthread_mutex_unlock(&fake_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap((void *)r->base, r->size ? r->size : 1);
    if (r->shadow != 0) {
        munmap((void *)r->shadow, r->size ? r->size : 1);
    }
    if (r->memfd >= 0) {
        /* Undefined where another process still maps it (fake_ipc_lock): said loudly, and
         * poisoned: an importer that still touches it dies of SIGBUS. */
        if (r->exported && !fake_ipc_lock(r->memfd, F_WRLCK)) {
            fake_complain("cuMemFree(0x%llx): another process still maps this allocation "
                          "(cuIpcOpenMemHandle: undefined behavior before its "
                          "cuIpcCloseMemHandle)", (unsigned long long)dptr);
        }
        if (r->exported && ftruncate(r->memfd, 0) != 0) {
            fake_complain("cuMemFree: could not poison an exported allocation");
        }
        close(r->memfd);
    }
    fake_range_remove(r);
    pthread_mutex_unlock(&fake_mem_lock);
    return CUDA_SUCCESS;
}

/* Managed and host-allocated memory: anonymous pages, known by kind (and flags). */
static CUresult
fake_anon_alloc(void **addr_out, size_t bytes, enum fake_mem_kind kind, unsigned flags)
{
    void *addr = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (addr == MAP_FAILED) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_add((uintptr_t)addr, bytes, kind, fake_current_device());
    if (r != NULL) {
        r->mapped = true;
        r->reg_flags = flags;
        if (kind == FAKE_MEM_REGISTERED) {
            fake_alias_reserve(r);
        }
    }
    pthread_mutex_unlock(&fake_mem_lock);
    *addr_out = addr;
    return CUDA_SUCCESS;
}

static CUresult
fake_anon_free(void *addr, enum fake_mem_kind kind)
{
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)addr);
    if (r == NULL || r->base != (uintptr_t)addr || r->kind != kind || !r->mapped) {
        pthread_mutex_unlock(&fake_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    munmap(addr, r->size ? r->size : 1);
    fake_alias_release(r);
    fake_range_remove(r);
    pthread_mutex_unlock(&fake_mem_lock);
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    void *addr = NULL;

    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    fake_ctx_sync(fake_ctx_current(), "cuMemAllocManaged", false);
    CUresult res = fake_anon_alloc(&addr, bytes, FAKE_MEM_MANAGED, flags);
    *dptr = (CUdeviceptr)(uintptr_t)addr;
    return res;
}

FAKE_API CUresult
cuMemHostAlloc(void **pp, size_t bytes, unsigned int flags)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    if ((flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                             CU_MEMHOSTALLOC_WRITECOMBINED)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    fake_ctx_sync(fake_ctx_current(), "cuMemHostAlloc", false); /* page-locked allocation */
    /* Its flags are cuMemHostRegister's bits (PORTABLE 1, DEVICEMAP 2) where they overlap. */
    return fake_anon_alloc(pp, bytes, FAKE_MEM_REGISTERED, flags & 3u);
}

FAKE_API CUresult
cuMemFreeHost(void *p)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    fake_ctx_sync(fake_ctx_current(), "cuMemFreeHost", true); /* as cuMemHostUnregister */
    return fake_anon_free(p, FAKE_MEM_REGISTERED);
}

FAKE_API CUresult
cuMemHostRegister(void *p, size_t bytes, unsigned int flags)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    /* IOMEMORY (a device's PCI resource) the double has none of. */
    if ((flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                             CU_MEMHOSTREGISTER_READ_ONLY)) != 0) {
        fake_complain("cuMemHostRegister with flags 0x%x", flags);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fake_ctx_sync(fake_ctx_current(), "cuMemHostRegister", false); /* page-locking */
    pthread_mutex_lock(&fake_mem_lock);
    for (struct fake_range *r = fake_ranges; r != NULL; r = r->next) {
        if ((uintptr_t)p < r->base + r->size && r->base < (uintptr_t)p + bytes) {
            pthread_mutex_unlock(&fake_mem_lock);
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        }
    }
    struct fake_range *r = fake_range_add((uintptr_t)p, bytes, FAKE_MEM_REGISTERED,
                                          fake_current_device());
    if (r != NULL && !fake_alias_reserve(r)) {
        fake_range_remove(r);
        r = NULL;
    }
    if (r != NULL) {
        r->reg_flags = flags;
    }
    pthread_mutex_unlock(&fake_mem_lock);
    if (r == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    FAKE_STAT_ADD(registrations, 1);
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuMemHostUnregister(void *p)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    /* Not in the guide's list either; conservatively as cuMemFree: it returns once the
     * context's earlier work is done. */
    fake_ctx_sync(fake_ctx_current(), "cuMemHostUnregister", true);
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)p);
    if (r == NULL || r->base != (uintptr_t)p || r->kind != FAKE_MEM_REGISTERED || r->mapped ||
        r->handle != NULL) {
        pthread_mutex_unlock(&fake_mem_lock);
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    fake_alias_release(r);
    fake_range_remove(r);
    pthread_mutex_unlock(&fake_mem_lock);
    FAKE_STAT_ADD(registrations, -1);
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuMemHostGetDevicePointer(CUdeviceptr *dptr, void *p, unsigned int flags)
{
    if (flags != 0) {
        return CUDA_ERROR_INVALID_VALUE; /* "flags ... must be 0" */
    }
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)p);
    bool ok = r != NULL && r->kind == FAKE_MEM_REGISTERED && r->alias != 0;
    /* "will fail if the CU_MEMHOSTALLOC_DEVICEMAP flag was not specified" (cuMemHostRegister's
     * CU_MEMHOSTREGISTER_DEVICEMAP: "Maps the allocation into the CUDA address space"). */
    bool mapped = ok && (r->reg_flags & CU_MEMHOSTREGISTER_DEVICEMAP) != 0;
    if (mapped) {
        *dptr = (CUdeviceptr)(r->alias + ((uintptr_t)p - r->base));
    }
    pthread_mutex_unlock(&fake_mem_lock);
    if (ok && !mapped) {
        fake_complain("cuMemHostGetDevicePointer(%p): registered without DEVICEMAP", p);
    }
    return mapped ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* --- pointer attributes --------------------------------------------------------------------- */

/* Writes attribute a of ptr, in range r (NULL: an unknown pointer, whose values are all
 * zero), into data, at the width the driver API documents for it. */
static CUresult
fake_attribute(const struct fake_range *r, uintptr_t ptr, CUpointer_attribute a, void *data)
{
    unsigned int u = 0;
    unsigned long long ull = 0;
    bool wide = false;

    switch (a) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        ull = r != NULL && r->device >= 0 ? (uintptr_t)&fake_device(r->device)->ctx : 0;
        wide = true;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        u = r == NULL ? 0 : r->kind == FAKE_MEM_REGISTERED ? CU_MEMORYTYPE_HOST
                                                            : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        u = r != NULL && r->kind == FAKE_MEM_MANAGED;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        memcpy(data, &(int){r != NULL ? r->device : -2}, sizeof(int));
        return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        ull = r != NULL ? r->id : 0;
        wide = true;
        break;
    /* "not necessarily the address of the mapped region, but the address of the mappable
     * address range ptr references (e.g. from cuMemAddressReserve)": a cuMem mapping's is its
     * reservation's; "To retrieve the size of the mapped region, see cuMemGetAddressRange". */
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: {
        const struct fake_reservation *v = r != NULL && r->handle != NULL
                                               ? fake_reservation_find(r->base, r->size)
                                               : NULL;
        uintptr_t base = v != NULL ? v->base : r != NULL ? r->base : 0;
        size_t size = v != NULL ? v->size : r != NULL ? r->size : 0;
        ull = a == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR ? base : size;
        wide = true;
        break;
    }
    case CU_POINTER_ATTRIBUTE_MAPPED:
        u = r != NULL;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        ull = r != NULL ? (uintptr_t)r->pool : 0;
        wide = true;
        break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        u = r != NULL && r->memfd >= 0;
        break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        ull = r == NULL ? 0 : r->handle != NULL ? r->handle->handle_types
                          : r->pool != NULL     ? r->pool->handle_types
                                                : 0;
        wide = true;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        /* "If there is no current CUcontext then CUDA_ERROR_INVALID_CONTEXT is returned." */
        if (fake_need_context("cuPointerGetAttribute(DEVICE_POINTER)") != CUDA_SUCCESS) {
            return CUDA_ERROR_INVALID_CONTEXT;
        }
        if (r == NULL) {
            return CUDA_ERROR_INVALID_VALUE;
        }
        /* Registered memory: its device address of its own (cuMemHostGetDevicePointer's). */
        ull = r->kind == FAKE_MEM_REGISTERED && r->alias != 0 ? r->alias + (ptr - r->base) : ptr;
        wide = true;
        break;
    default:
        /* MAPPING_SIZE, MAPPING_BASE_ADDR and MEMORY_BLOCK_ID among them: cuda.h documents
         * neither for cuPointerGetAttribute nor for cuPointerGetAttributes. */
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (wide) {
        memcpy(data, &ull, sizeof(ull));
    } else {
        memcpy(data, &u, sizeof(u));
    }
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
    FAKE_STICKY_CHECK();
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)ptr);
    CUresult res =
        r != NULL ? fake_attribute(r, (uintptr_t)ptr, attribute, data) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&fake_mem_lock);
    return res;
}

FAKE_API CUresult
cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attributes, void **data,
                       CUdeviceptr ptr)
{
    CUresult res = CUDA_SUCCESS;

    FAKE_STICKY_CHECK();
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)ptr);
    for (unsigned int i = 0; i < n && res == CUDA_SUCCESS; i++) {
        res = fake_attribute(r, (uintptr_t)ptr, attributes[i], data[i]);
    }
    pthread_mutex_unlock(&fake_mem_lock);
    return res;
}

FAKE_API CUresult
cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr ptr)
{
    /* A call of the context-bound API (CUDA_ERROR_INVALID_CONTEXT among its answers). */
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    /* Of a cuMem mapping: the region one cuMemMap mapped (RANGE_SIZE's documentation points
     * here for "the size of the mapped region"), never more of its reservation. */
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)ptr);
    if (r != NULL) {
        if (base != NULL) {
            *base = (CUdeviceptr)r->base;
        }
        if (size != NULL) {
            *size = r->size;
        }
    }
    pthread_mutex_unlock(&fake_mem_lock);
    return r != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

/* --- legacy IPC ----------------------------------------------------------------------------- */

FAKE_API CUresult
cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    struct fake_ipc_handle h = {.magic = FAKE_IPC_MAGIC, .pid = (int32_t)getpid()};

    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)dptr);
    if (r == NULL || r->memfd < 0 || r->base != (uintptr_t)dptr) {
        pthread_mutex_unlock(&fake_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    h.fd = r->memfd;
    r->exported = true;
    h.device = r->device;
    h.size = r->size;
    h.id = r->id;
    pthread_mutex_unlock(&fake_mem_lock);
    memset(handle, 0, sizeof(*handle));
    memcpy(handle->reserved, &h, sizeof(h));
    return CUDA_SUCCESS;
}

/* Mapping and unmapping synchronize: cuda.h marks cuMemSetAccess and cuMemUnmap \note_sync
 * ("synchronous behavior for most use cases"), and a driver may do the same in cuMemMap and the
 * legacy IPC calls. So each is an implicit synchronization of the context it maps in, which
 * the program must not make while a stream of it waits on what only the caller (or a thread
 * waiting on it) will release: opening as an allocation (it waits for earlier stream memory
 * operations), closing and unmapping as cuMemFree (for all earlier work). */
FAKE_API CUresult
cuIpcOpenMemHandle(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags)
{
    struct fake_ipc_handle h;
    char path[64];

    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    (void)flags;
    memcpy(&h, handle.reserved, sizeof(h));
    if (h.magic != FAKE_IPC_MAGIC) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (h.pid == (int32_t)getpid()) {
        return CUDA_ERROR_INVALID_CONTEXT; /* as CUDA: never in the exporting process */
    }
    fake_mem_sync(0, "cuIpcOpenMemHandle", false);
    pthread_mutex_lock(&fake_mem_lock);
    for (struct fake_range *r = fake_ranges; r != NULL; r = r->next) {
        if (r->ipc_refs > 0 && r->ipc_pid == h.pid && r->ipc_fd == h.fd && r->id == h.id) {
            r->ipc_refs++; /* the same handle opened again: the same mapping */
            *dptr = (CUdeviceptr)r->base;
            pthread_mutex_unlock(&fake_mem_lock);
            return CUDA_SUCCESS;
        }
    }
    pthread_mutex_unlock(&fake_mem_lock);
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    uintptr_t addr, shadow;
    bool mapped = fake_shadow_map(fd, 0, h.size, 0, 0, &addr, &shadow);
    if (!mapped || !fake_ipc_lock(fd, F_RDLCK)) {
        if (mapped) {
            munmap((void *)addr, h.size ? h.size : 1);
            munmap((void *)shadow, h.size ? h.size : 1);
        }
        close(fd);
        return mapped ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_add(addr, h.size, FAKE_MEM_DEVICE, h.device);
    if (r != NULL) {
        r->mapped = true;
        r->shadow = shadow;
        r->ipc_refs = 1;
        r->ipc_pid = h.pid;
        r->ipc_fd = h.fd;
        r->ipc_lock_fd = fd;
        r->id = h.id;
    } else {
        close(fd);
    }
    pthread_mutex_unlock(&fake_mem_lock);
    FAKE_STAT_ADD(ipc_mappings, 1);
    *dptr = (CUdeviceptr)(uintptr_t)addr;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    FAKE_STICKY_CHECK();
    fake_mem_sync(0, "cuIpcCloseMemHandle", true);
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)dptr);
    if (r == NULL || r->ipc_refs == 0 || r->base != (uintptr_t)dptr) {
        pthread_mutex_unlock(&fake_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    bool last = --r->ipc_refs == 0;
    if (last) {
        munmap((void *)r->base, r->size ? r->size : 1);
        munmap((void *)r->shadow, r->size ? r->size : 1);
        close(r->ipc_lock_fd); /* its read lock with it */
        fake_range_remove(r);
    }
    pthread_mutex_unlock(&fake_mem_lock);
    if (last) {
        FAKE_STAT_ADD(ipc_mappings, -1);
    }
    return CUDA_SUCCESS;
}

/* --- cuMem: handles, address ranges, mappings ------------------------------------------------ */

static void
fake_handle_put(struct fake_handle *h)
{
    if (--h->refs == 0) {
        close(h->memfd);
        if (h->imported) {
            FAKE_STAT_ADD(ipc_mappings, -1);
        }
        free(h);
    }
}

/* A CUmemAllocationProp as cuMemCreate and cuMemGetAllocationGranularity take it: pinned
 * memory of a device or of the host (HOST_NUMA node 0, or HOST unshared), shareable at most as a
 * POSIX file descriptor (Windows handles are not Linux's; fabric handles need IMEX channels the
 * double has none of), no Windows metadata, no sparse tile pool, zeroed reserved bytes. */
static CUresult
fake_prop_check(const CUmemAllocationProp *prop, const char *call)
{
    static const unsigned char zero[sizeof(prop->allocFlags.reserved)];
    CUresult res = CUDA_SUCCESS;

    /* On the host: "HOST allocations are not IPC capable and ... requestedHandleTypes must be
     * 0"; a HOST_NUMA one names its node (the double's host has one, 0); HOST_NUMA_CURRENT is
     * refused. */
    const CUmemLocationType where = prop != NULL ? prop->location.type : 0;
    if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        (where != CU_MEM_LOCATION_TYPE_DEVICE && where != CU_MEM_LOCATION_TYPE_HOST &&
         where != CU_MEM_LOCATION_TYPE_HOST_NUMA) ||
        (where == CU_MEM_LOCATION_TYPE_HOST && prop->requestedHandleTypes != 0) ||
        (where == CU_MEM_LOCATION_TYPE_HOST_NUMA && prop->location.id != 0) ||
        prop->win32HandleMetaData != NULL ||
        prop->allocFlags.compressionType > CU_MEM_ALLOCATION_COMP_GENERIC ||
        prop->allocFlags.gpuDirectRDMACapable > 1 ||
        memcmp(prop->allocFlags.reserved, zero, sizeof(zero)) != 0) {
        res = CUDA_ERROR_INVALID_VALUE;
    } else if (where == CU_MEM_LOCATION_TYPE_DEVICE && fake_device(prop->location.id) == NULL) {
        res = CUDA_ERROR_INVALID_DEVICE;
    } else if (where != CU_MEM_LOCATION_TYPE_DEVICE && fake_config()->no_host_cumem) {
        res = CUDA_ERROR_NOT_SUPPORTED; /* HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 0 */
    } else if ((prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0 ||
               prop->allocFlags.usage != 0) {
        res = CUDA_ERROR_NOT_SUPPORTED;
    }
    if (res != CUDA_SUCCESS) {
        fake_complain("%s: allocation properties the driver refuses (type %d, location %d/%d, "
                      "handle types 0x%x, usage 0x%x)", call, (int)(prop ? prop->type : 0),
                      prop ? (int)prop->location.type : 0, prop ? prop->location.id : 0,
                      prop ? (unsigned)prop->requestedHandleTypes : 0,
                      prop ? (unsigned)prop->allocFlags.usage : 0);
    }
    return res;
}

FAKE_API CUresult
cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                              CUmemAllocationGranularity_flags option)
{
    CUresult res = fake_prop_check(prop, __func__);

    if (res != CUDA_SUCCESS) {
        return res;
    }
    if (granularity == NULL || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    *granularity = FAKE_GRANULARITY;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
            unsigned long long flags)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    CUresult res = fake_prop_check(prop, __func__);
    if (res != CUDA_SUCCESS) {
        return res;
    }
    /* "The size of this allocation must be a multiple of the value given via
     * cuMemGetAllocationGranularity with the CU_MEM_ALLOC_GRANULARITY_MINIMUM flag"; "flags
     * for future use, must be zero now". */
    if (handle == NULL || flags != 0 || size == 0 || size % FAKE_GRANULARITY != 0) {
        fake_complain("cuMemCreate of %zu bytes with flags 0x%llx: the size must be a multiple "
                      "of the granularity (%zu), the flags 0", size, flags, FAKE_GRANULARITY);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* A device memory allocation, in the context of the device it is on; a page-locked host
     * one, in the current context. */
    const bool host = prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE;
    fake_ctx_sync(host ? fake_ctx_current() : &fake_device(prop->location.id)->ctx,
                  "cuMemCreate", false);
    struct fake_handle *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* The name carries the device, so an importer in another process knows where the memory
     * lives, as the real driver does. */
    char name[32];
    if (host) {
        snprintf(name, sizeof(name), "%s", FAKE_MEMFD_HOST);
    } else {
        snprintf(name, sizeof(name), "%s%d", FAKE_MEMFD_DEVICE, prop->location.id);
    }
    h->memfd = memfd_create(name, MFD_CLOEXEC);
    if (h->memfd < 0 || ftruncate(h->memfd, (off_t)size) != 0) {
        if (h->memfd >= 0) {
            close(h->memfd);
        }
        free(h);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->size = size;
    h->device = host ? -1 : prop->location.id;
    h->handle_types = (unsigned)prop->requestedHandleTypes;
    h->refs = 1;
    pthread_mutex_lock(&fake_mem_lock);
    h->id = fake_next_id++;
    pthread_mutex_unlock(&fake_mem_lock);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    pthread_mutex_lock(&fake_mem_lock);
    fake_handle_put((struct fake_handle *)(uintptr_t)handle);
    pthread_mutex_unlock(&fake_mem_lock);
    return CUDA_SUCCESS;
}

/* The reservation holding [p, p + size), or NULL; with the lock held. */
static struct fake_reservation *
fake_reservation_find(uintptr_t p, size_t size)
{
    for (struct fake_reservation *v = fake_reservations; v != NULL; v = v->next) {
        if (p >= v->base && p - v->base <= v->size && size <= v->size - (p - v->base)) {
            return v;
        }
    }
    return NULL;
}

FAKE_API CUresult
cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                    unsigned long long flags)
{
    (void)addr; /* a hint */
    /* As the driver: sizes in whole granules (cuda.h asks for host pages; the double asks for
     * what every mapping in it needs), an alignment of 0 (one granule) or a power of two; the
     * range starts on a granule whatever the alignment asked; flags "must be zero". */
    if (ptr == NULL || size == 0 || size % FAKE_GRANULARITY != 0 ||
        (alignment & (alignment - 1)) != 0 || flags != 0) {
        fake_complain("cuMemAddressReserve of %zu bytes aligned to %zu, flags 0x%llx: the size "
                      "must be a multiple of the granularity (%zu), the alignment a power of "
                      "two, the flags 0", size, alignment, flags, FAKE_GRANULARITY);
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t align = alignment > FAKE_GRANULARITY ? alignment : FAKE_GRANULARITY;
    struct fake_reservation *v = calloc(1, sizeof(*v));
    uint8_t *va = v == NULL ? MAP_FAILED : mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE |
                                                MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void *shadow = va == MAP_FAILED ? MAP_FAILED : mmap(NULL, size, PROT_NONE, MAP_PRIVATE |
                                                        MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (shadow == MAP_FAILED) {
        if (va != MAP_FAILED) {
            munmap(va, size + align);
        }
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uintptr_t start = ((uintptr_t)va + align - 1) & ~(uintptr_t)(align - 1);
    if (start > (uintptr_t)va) {
        munmap(va, start - (uintptr_t)va);
    }
    munmap((void *)(start + size), (uintptr_t)va + size + align - (start + size));
    pthread_mutex_lock(&fake_mem_lock);
    *v = (struct fake_reservation){.base = start, .size = size, .shadow = (uintptr_t)shadow,
                                   .id = fake_next_id++, .next = fake_reservations};
    fake_reservations = v;
    pthread_mutex_unlock(&fake_mem_lock);
    *ptr = (CUdeviceptr)start;
    return CUDA_SUCCESS;
}

/* "The size must match what was given to memAddressReserve and the ptr given must match what
 * was returned"; a range still mapped is the program's mistake, refused as one. */
FAKE_API CUresult
cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    const char *why = NULL;

    pthread_mutex_lock(&fake_mem_lock);
    struct fake_reservation **link = &fake_reservations;
    while (*link != NULL && (*link)->base != (uintptr_t)ptr) {
        link = &(*link)->next;
    }
    if (*link == NULL || (*link)->size != size) {
        why = "not a reservation's start and size";
    }
    for (struct fake_range *r = fake_ranges; r != NULL && why == NULL; r = r->next) {
        if (r->handle != NULL && r->base >= (uintptr_t)ptr && r->base - (uintptr_t)ptr < size) {
            why = "still mapped (cuMemUnmap first)";
        }
    }
    struct fake_reservation *v = why == NULL ? *link : NULL;
    if (v != NULL) {
        *link = v->next;
        munmap((void *)v->base, v->size);
        munmap((void *)v->shadow, v->size);
        free(v);
    }
    pthread_mutex_unlock(&fake_mem_lock);
    if (why != NULL) {
        fake_complain("cuMemAddressFree(0x%llx, %zu): %s", (unsigned long long)ptr, size, why);
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* cuMemMap as cuda.h has it: whole granules of a reservation that no mapping holds yet; the
 * handle's memory "starting from byte offset", which "currently must be zero", up to size (at
 * most the allocation's); flags zero. */
FAKE_API CUresult
cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
         unsigned long long flags)
{
    struct fake_handle *h = (struct fake_handle *)(uintptr_t)handle;
    const char *why = NULL;
    struct fake_reservation *v = NULL;
    FAKE_CAPTURE_CHECK_UNSAFE();

    pthread_mutex_lock(&fake_mem_lock);
    if (h == NULL || offset != 0 || flags != 0) {
        why = "the offset and flags must be zero";
    } else if (size == 0 || size > h->size || size % FAKE_GRANULARITY != 0 ||
               ptr % FAKE_GRANULARITY != 0) {
        why = "not whole granules of the allocation";
    } else if ((v = fake_reservation_find((uintptr_t)ptr, size)) == NULL) {
        why = "not inside one cuMemAddressReserve range";
    }
    for (struct fake_range *r = fake_ranges; r != NULL && why == NULL; r = r->next) {
        if (r->handle != NULL && r->base < (uintptr_t)ptr + size &&
            (uintptr_t)ptr < r->base + r->size) {
            why = "part of it is mapped already";
        }
    }
    pthread_mutex_unlock(&fake_mem_lock);
    if (why != NULL) {
        fake_complain("cuMemMap of %zu bytes at offset %zu to 0x%llx (flags 0x%llx): %s (the "
                      "granularity is %zu, the allocation %zu bytes)", size, offset,
                      (unsigned long long)ptr, flags, why, FAKE_GRANULARITY, h ? h->size : 0);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fake_mem_sync(h->device >= 0 ? 1u << h->device : 0, "cuMemMap", false);
    /* Device memory: the program's addresses stay unreachable from the host; device work
     * reaches it only once cuMemSetAccess granted its device access. */
    uintptr_t app, shadow;
    if (!fake_shadow_map(h->memfd, 0, size, (uintptr_t)ptr, v->shadow + (ptr - v->base), &app,
                         &shadow)) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_add((uintptr_t)ptr, size,
                                          h->device < 0 ? FAKE_MEM_REGISTERED : FAKE_MEM_DEVICE,
                                          h->device);
    if (r != NULL) {
        r->handle = h;
        r->id = fake_config()->reservation_ids ? v->id : h->id;
        r->shadow = shadow;
        r->offset = offset;
        h->refs++;
    }
    pthread_mutex_unlock(&fake_mem_lock);
    return r != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

FAKE_API CUresult
cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    /* \note_sync: of the device it lives on and of those it was open to. */
    fake_mem_sync(fake_mapping_devices(ptr, true), "cuMemUnmap", true);
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)ptr);
    if (r == NULL || r->handle == NULL || r->base != (uintptr_t)ptr || r->size != size) {
        pthread_mutex_unlock(&fake_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* The program's addresses go back to reserved (they were only that unless host-visible),
     * and so do the double's own, part of the reservation's shadow. */
    mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
         MAP_NORESERVE, -1, 0);
    mmap((void *)r->shadow, r->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
         MAP_NORESERVE, -1, 0);
    fake_handle_put(r->handle);
    fake_range_remove(r);
    pthread_mutex_unlock(&fake_mem_lock);
    return CUDA_SUCCESS;
}

/* Grants or takes access to whole mappings of [ptr, ptr + size), which must be mapped, per
 * device: work on a device without it touches an illegal address (the double's launches and
 * copies refuse it). The host never reaches device memory, as on a GPU; pinned host memory
 * (a HOST or HOST_NUMA allocation) it reaches once granted a HOST_NUMA (or HOST) location. */
static bool
fake_access_host(const CUmemAccessDesc *d)
{
    return d->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA ||
           d->location.type == CU_MEM_LOCATION_TYPE_HOST;
}

FAKE_API CUresult
cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CUresult res = CUDA_SUCCESS;

    FAKE_CAPTURE_CHECK_UNSAFE(); /* \note_sync, as cuMemUnmap */
    unsigned devices = 0;
    for (size_t i = 0; i < count; i++) {
        if (!fake_access_host(&desc[i]) &&
            (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
             fake_device(desc[i].location.id) == NULL)) {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        if (!fake_access_host(&desc[i])) {
            devices |= 1u << desc[i].location.id;
        }
    }
    /* \note_sync: of the devices it opens or closes the range to, and the one it lives on. */
    fake_mem_sync(devices | fake_mapping_devices(ptr, false), "cuMemSetAccess", true);
    pthread_mutex_lock(&fake_mem_lock);
    for (uintptr_t p = (uintptr_t)ptr; p < (uintptr_t)ptr + size && res == CUDA_SUCCESS;) {
        struct fake_range *r = fake_range_find(p);
        if (r == NULL || r->handle == NULL || r->base != p ||
            r->base + r->size > (uintptr_t)ptr + size) {
            fake_complain("cuMemSetAccess over 0x%llx + %zu: 0x%lx is not the start of a "
                          "mapping inside it", (unsigned long long)ptr, size, (unsigned long)p);
            res = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        for (size_t i = 0; i < count && res == CUDA_SUCCESS; i++) {
            bool rw = desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            if (!fake_access_host(&desc[i])) {
                unsigned bit = 1u << desc[i].location.id;
                r->access = rw ? r->access | bit : r->access & ~bit;
                continue;
            }
            if (r->handle->device >= 0) {
                /* "Users cannot specify HOST_NUMA accessibility for allocations created on
                 * with other location types." */
                fake_complain("cuMemSetAccess: host access to device memory at 0x%lx",
                              (unsigned long)p);
                res = CUDA_ERROR_INVALID_VALUE;
                break;
            }
            void *at = rw ? mmap((void *)r->base, r->size, PROT_READ | PROT_WRITE,
                                 MAP_SHARED | MAP_FIXED, r->handle->memfd, (off_t)r->offset)
                          : mmap((void *)r->base, r->size, PROT_NONE,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
            res = at == MAP_FAILED ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
        }
        p = r->base + r->size;
    }
    pthread_mutex_unlock(&fake_mem_lock);
    return res;
}

FAKE_API CUresult
cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
    if (flags == NULL || location == NULL || location->type != CU_MEM_LOCATION_TYPE_DEVICE ||
        fake_device(location->id) == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)ptr);
    bool mapped = r != NULL && (r->handle != NULL || r->pool != NULL);
    if (mapped) {
        *flags = r->access & (1u << location->id) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                                  : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    }
    pthread_mutex_unlock(&fake_mem_lock);
    return mapped ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FAKE_API CUresult
cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                             CUmemAllocationHandleType type, unsigned long long flags)
{
    struct fake_handle *h = (struct fake_handle *)(uintptr_t)handle;

    /* Only to a type cuMemCreate's requestedHandleTypes asked for (cuda.h names no error of
     * its own for the others; INVALID_VALUE here, unsure which the driver gives); the flags
     * are "Reserved, must be zero". */
    if (shareable == NULL || h == NULL || flags != 0 ||
        type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || !(h->handle_types & type)) {
        fake_complain("cuMemExportToShareableHandle to type 0x%x, flags 0x%llx, of an "
                      "allocation made for types 0x%x", (unsigned)type, flags,
                      h ? h->handle_types : 0);
        return CUDA_ERROR_INVALID_VALUE;
    }
    int fd = fcntl(h->memfd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memcpy(shareable, &fd, sizeof(fd));
    return CUDA_SUCCESS;
}

/* The device of a cuMem allocation's memory file, from its name (/memfd:fake-cuda-dev<N>);
 * -1 for pinned host memory (fake-cuda-host); 0 for one that does not say. */
static int
fake_memfd_device(int fd)
{
    char path[64], target[128];
    int device = 0;

    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t len = readlink(path, target, sizeof(target) - 1);
    if (len > 0) {
        target[len] = '\0';
        if (strstr(target, FAKE_MEMFD_HOST) != NULL) {
            return -1;
        }
        const char *at = strstr(target, FAKE_MEMFD_DEVICE);
        if (at != NULL) {
            device = atoi(at + strlen(FAKE_MEMFD_DEVICE));
        }
    }
    return device >= 0 && device < FAKE_MAX_DEVICES ? device : 0;
}

FAKE_API CUresult
cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                               CUmemAllocationHandleType type)
{
    int fd = (int)(uintptr_t)os_handle;
    off_t size;

    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
        (size = lseek(fd, 0, SEEK_END)) <= 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fake_handle *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->memfd = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* the caller keeps and closes its fd */
    h->size = (size_t)size;
    h->device = fake_memfd_device(fd);
    h->refs = 1;
    h->imported = true;
    h->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    pthread_mutex_lock(&fake_mem_lock);
    h->id = fake_next_id++;
    pthread_mutex_unlock(&fake_mem_lock);
    FAKE_STAT_ADD(ipc_mappings, 1);
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

FAKE_API CUresult
cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_find((uintptr_t)addr);
    /* "If the address requested is not mapped [by cuMemMap], the function will fail": so
     * for a pool's allocation, whatever handle types the pool has. */
    if (handle == NULL || r == NULL || r->handle == NULL) {
        pthread_mutex_unlock(&fake_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    r->handle->refs++;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)r->handle;
    pthread_mutex_unlock(&fake_mem_lock);
    return CUDA_SUCCESS;
}

/* --- memory pools (stream-ordered allocation) -------------------------------------------- */

/* A pool of a device's pinned memory whose allocations may be shared as its handle types say
 * (cuMemPoolExportPointer, which the double does not have): never through
 * cuMemRetainAllocationHandle, since no cuMemMap made them. */
FAKE_API CUresult
cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    static const unsigned char zero[sizeof(props->reserved)];

    if (pool == NULL || props == NULL || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        fake_device(props->location.id) == NULL || props->win32SecurityAttributes != NULL ||
        props->usage != 0 || memcmp(props->reserved, zero, sizeof(zero)) != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((props->handleTypes & ~(unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0) {
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    struct CUmemPoolHandle_st *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    p->device = props->location.id;
    p->handle_types = (unsigned)props->handleTypes;
    *pool = p;
    return CUDA_SUCCESS;
}

/* "If any pointers obtained from this pool haven't been freed ... the resources associated
 * with the pool will be released automatically once there are no more outstanding
 * allocations". With the lock held. */
static void
fake_pool_put(struct CUmemPoolHandle_st *pool)
{
    if (pool->destroyed && pool->allocations == 0) {
        free(pool);
    }
}

FAKE_API CUresult
cuMemPoolDestroy(CUmemoryPool pool)
{
    if (pool == NULL) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_lock(&fake_mem_lock);
    pool->destroyed = true;
    fake_pool_put(pool);
    pthread_mutex_unlock(&fake_mem_lock);
    return CUDA_SUCCESS;
}

/* Made at once: work after it in stream order may use it, which is what the driver promises;
 * its own device alone may touch it ("By default, the pool's memory will be accessible from
 * the device it is allocated on"). */
FAKE_API CUresult
cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream)
{
    uintptr_t addr, shadow;

    if (dptr == NULL || pool == NULL || pool->destroyed || bytes == 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    if ((stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD) &&
        fake_ctx_current() == NULL) {
        return CUDA_ERROR_INVALID_CONTEXT; /* "default stream specified with no current context" */
    }
    FAKE_STICKY_CHECK();
    int fd = fake_memfd_map(bytes, &addr, &shadow);
    if (fd < 0) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_range_add(addr, bytes, FAKE_MEM_DEVICE, pool->device);
    if (r != NULL) {
        r->pool = pool;
        r->pool_fd = fd;
        r->shadow = shadow;
        r->access = 1u << pool->device;
        pool->allocations++;
    }
    pthread_mutex_unlock(&fake_mem_lock);
    if (r == NULL) {
        munmap((void *)addr, bytes);
        munmap((void *)shadow, bytes);
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *dptr = (CUdeviceptr)addr;
    return CUDA_SUCCESS;
}

/* A pool's allocation starting at p, or NULL; with the lock held. */
static struct fake_range *
fake_pool_range(uintptr_t p)
{
    struct fake_range *r = fake_range_find(p);
    return r != NULL && r->pool != NULL && r->base == p ? r : NULL;
}

bool
fake_pool_free(uintptr_t p)
{
    pthread_mutex_lock(&fake_mem_lock);
    struct fake_range *r = fake_pool_range(p);
    if (r != NULL) {
        struct CUmemPoolHandle_st *pool = r->pool;
        munmap((void *)r->base, r->size);
        munmap((void *)r->shadow, r->size);
        close(r->pool_fd);
        fake_range_remove(r);
        pool->allocations--;
        fake_pool_put(pool);
    }
    pthread_mutex_unlock(&fake_mem_lock);
    return r != NULL;
}

/* Frees when the stream gets there (stream.c). */
FAKE_API CUresult
cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    pthread_mutex_lock(&fake_mem_lock);
    bool known = fake_pool_range((uintptr_t)dptr) != NULL;
    pthread_mutex_unlock(&fake_mem_lock);
    if (!known) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return fake_stream_free(stream, (uintptr_t)dptr);
}

/* --- synchronous copies, for test programs ----------------------------------------------- */

/* Commands of the legacy NULL stream: after the earlier work of the context's blocking
 * streams, before their later work, and waited for. */
FAKE_API CUresult
cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t bytes)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    return fake_null_stream_copy((void *)fake_mem_host_of((uintptr_t)dst), src, bytes);
}

FAKE_API CUresult
cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t bytes)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    return fake_null_stream_copy(dst, (const void *)fake_mem_host_of((uintptr_t)src), bytes);
}

FAKE_API CUresult
cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t n)
{
    FAKE_CAPTURE_CHECK_UNSAFE();
    FAKE_NEED_CONTEXT();
    return fake_null_stream_set((void *)fake_mem_host_of((uintptr_t)dst), value, n);
}
