/* SPDX-License-Identifier: Apache-2.0 */
/* What the exporting files (api.c, api_device.c) share: visibility and the pnccl aliases. */
#ifndef SHIM_API_H
#define SHIM_API_H

#define SHIM_API __attribute__((visibility("default")))
/* pnccl names are NCCL's profiling interface: the same functions under a second name. */
#define SHIM_ALIAS(name)                                                                     \
    extern __typeof__(name) p##name __attribute__((alias(#name), visibility("default")));

#include <nccl.h>

/* ncclshim's windows are host memory: what asks a window for device pointers, multimem or
 * CFT handles gets ncclInvalidUsage, with a message. */
ncclResult_t shim_api_no_device_window(const char *api);

#endif
