/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the tests of the device layer share: device 0 of whatever driver is loaded (the
 * double in CI), its context current for each test (setup and teardown, for
 * TestSuite(..., .init = setup, .fini = teardown)), and the driver's functions by name.
 */
#ifndef TEST_UNIT_GPU_FIXTURE_H
#define TEST_UNIT_GPU_FIXTURE_H

#include <criterion/criterion.h>
#include <dlfcn.h>

#include "gpu/driver.h"

static const struct gpu_device *device;

static inline void
setup(void)
{
    cr_assert(gpu_driver_present(), "no driver: run with LD_LIBRARY_PATH=build/test/doubles");
    cr_assert_eq(gpu_device_get(0, &device), ncclSuccess);
    cr_assert_eq(gpu_ctx_push(device->ctx), ncclSuccess);
}

static inline void
teardown(void)
{
    gpu_ctx_pop();
}

/* A function of the loaded driver by name, the double's own ones included (NULL if absent). */
static inline void *
fake_fn(const char *name)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return lib != NULL ? dlsym(lib, name) : NULL;
}

#endif
