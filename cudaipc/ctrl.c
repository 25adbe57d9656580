/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The control blocks (internal.h) as every file of the team uses them: registered with the driver
 * so that streams may touch their words, a word as the host and the streams reach it, the
 * team's error and its verdict, and whether a rank is gone. Below every other file of the
 * team: it calls none of them.
 */
#include "internal.h"

#include <stdio.h>

#include "base/check.h"

struct gpu_flag
cipc_flag(struct cipc_team *team, int r, uint32_t *host)
{
    uintptr_t base = (uintptr_t)team->ctrls[r];
    struct gpu_flag flag = {.host = host, .dev = 0};
    CUdeviceptr dev_base = 0;

    /* The block was registered whole: a flag sits at the same offset on the device side. */
    if (gpu_cu.cuMemHostGetDevicePointer(&dev_base, (void *)base, 0) == CUDA_SUCCESS) {
        flag.dev = dev_base + ((uintptr_t)host - base);
    }
    return flag;
}

ncclResult_t
cipc_ctrl_register(struct cipc_team *team, int r)
{
    ncclResult_t res = ncclSuccess;

    pthread_mutex_lock(&team->reg_lock);
    if (!team->registered[r]) {
        /* Portable: every context of this process may use it, whichever device. */
        CUresult cu = gpu_cu.cuMemHostRegister(team->ctrls[r], SHM_AUX_BYTES,
                                               CU_MEMHOSTREGISTER_PORTABLE |
                                                   CU_MEMHOSTREGISTER_DEVICEMAP);
        if (cu == CUDA_SUCCESS) {
            team->registered[r] = true;
        } else {
            res = gpu_cu_fail(cu, "cuMemHostRegister(control block)", __FILE__, __LINE__);
        }
    }
    pthread_mutex_unlock(&team->reg_lock);
    return res;
}

void
cipc_ctrl_unregister_all(struct cipc_team *team)
{
    const struct gpu_device *gpu = NULL;
    bool pushed = false;

    for (int r = 0; r < team->nranks; r++) {
        if (!team->registered[r]) {
            continue;
        }
        if (gpu == NULL && gpu_device_get(team->device, &gpu) == ncclSuccess) {
            pushed = gpu_ctx_push(gpu->ctx) == ncclSuccess;
        }
        gpu_cu.cuMemHostUnregister(team->ctrls[r]);
        team->registered[r] = false;
    }
    if (pushed) {
        gpu_ctx_pop();
    }
}

void
cipc_team_set_error(struct cipc_team *team, ncclResult_t res)
{
    int32_t none = ncclSuccess;

    /* The first failure alone is kept, its text written before the error publishes it. */
    if (__atomic_exchange_n(&team->failing, 1, __ATOMIC_ACQ_REL) != 0) {
        return;
    }
    snprintf(team->cause, sizeof(team->cause), "%s", shim_error_last(team->log));
    __atomic_compare_exchange_n(&team->error, &none, (int32_t)res, false, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
    if (team->lead >= 0) {
        /* A leader's failure is every rank's: its operations involve them all. */
        none = ncclSuccess;
        __atomic_compare_exchange_n(&team->ctrls[CIPC_VERDICT]->error, &none, (int32_t)res,
                                    false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
}

const char *
cipc_team_cause(const struct cipc_team *team)
{
    return cipc_team_error(team) != ncclSuccess ? team->cause : "";
}

ncclResult_t
cipc_team_error(const struct cipc_team *team)
{
    return (ncclResult_t)__atomic_load_n(&team->error, __ATOMIC_ACQUIRE);
}

bool
cipc_rank_gone(const struct cipc_team *team, int r)
{
    return __atomic_load_n(&team->ctrls[r]->left, __ATOMIC_ACQUIRE) != 0 ||
           !shm_team_peer_alive(team->shm, r);
}
