/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A registered buffer's pin (ncclCommRegister): what a device back-end keeps of a buffer that
 * it made reachable to the other ranks' kernels until ncclCommDeregister, held in the
 * registration's record by the layers above. Its fields are the back-end's; only `pinned`
 * is read above it: whether an unpin is owed. The device team (cudaipc/) fills it in, under
 * its own name for it, cipc_pin.
 */
#ifndef GPU_PIN_H
#define GPU_PIN_H

#include <stdbool.h>
#include <stdint.h>

struct gpu_pin {
    bool pinned;       /* false: nothing to pin (every leader in this process, or staged) */
    uint32_t how;      /* how the back-end reaches it (the device team's enum cipc_buf_how) */
    uint64_t key;      /* the allocation's id */
    uintptr_t base;    /* its first byte */
};

#endif
