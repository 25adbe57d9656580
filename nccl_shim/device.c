/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CUDA driver, reached through dlopen so the library has no CUDA dependency at link time
 * (ldd shows none) and loads on machines without a GPU. cuda.h is included for its types
 * only. The entry points are looked up once; a missing driver or a failing cuInit leaves them
 * NULL and every query answers "host".
 */
#include "device.h"

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>

#include "base/debug.h"

static struct {
    CUresult (*init)(unsigned int flags);
    CUresult (*pointer_get_attribute)(void *data, CUpointer_attribute attribute,
                                      CUdeviceptr ptr);
    CUresult (*ctx_get_device)(CUdevice *device);
    bool present;
} shim_cu;

static pthread_once_t shim_cu_once = PTHREAD_ONCE_INIT;

static void
shim_device_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        INFO(SHIM_INIT, "no CUDA driver (%s): host memory only", dlerror());
        return;
    }
    shim_cu.init = (CUresult(*)(unsigned int))dlsym(lib, "cuInit");
    shim_cu.pointer_get_attribute =
        (CUresult(*)(void *, CUpointer_attribute, CUdeviceptr))dlsym(lib, "cuPointerGetAttribute");
    shim_cu.ctx_get_device = (CUresult(*)(CUdevice *))dlsym(lib, "cuCtxGetDevice");
    if (shim_cu.init == NULL || shim_cu.pointer_get_attribute == NULL ||
        shim_cu.ctx_get_device == NULL || shim_cu.init(0) != CUDA_SUCCESS) {
        INFO(SHIM_INIT, "CUDA driver found but unusable: host memory only");
        return;
    }
    shim_cu.present = true;
}

bool
shim_device_driver_present(void)
{
    pthread_once(&shim_cu_once, shim_device_load);
    return shim_cu.present;
}

bool
shim_device_is_device_ptr(const void *ptr)
{
    unsigned int type = 0;

    if (ptr == NULL || !shim_device_driver_present()) {
        return false;
    }
    /* Plain malloc'd memory is unknown to the driver: CUDA_ERROR_INVALID_VALUE, host. */
    if (shim_cu.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                      (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS) {
        return false;
    }
    int managed = 0;
    shim_cu.pointer_get_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                  (CUdeviceptr)(uintptr_t)ptr);
    return type == CU_MEMORYTYPE_DEVICE && !managed;
}

int
shim_device_current(void)
{
    CUdevice device;

    if (!shim_device_driver_present() || shim_cu.ctx_get_device(&device) != CUDA_SUCCESS) {
        return -1;
    }
    return (int)device;
}
