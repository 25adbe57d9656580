/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA driver access without linking any CUDA library: libcuda.so.1 is opened with dlopen on
 * first use. No driver (this machine, CI) simply means every pointer is host memory.
 */
#ifndef SHIM_DEVICE_H
#define SHIM_DEVICE_H

#include <stdbool.h>

/* True if ptr is CUDA device memory (not host, pinned host or managed memory). */
bool shim_device_is_device_ptr(const void *ptr);
/* The device of the calling thread's current CUDA context, or -1 (no driver, no context). */
int shim_device_current(void);
/* True once libcuda.so.1 was found and initialised. */
bool shim_device_driver_present(void);

#endif
