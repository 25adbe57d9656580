/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The per-collective variants of NCCL 2.31 (ncclAllReduceConfig ... ncclScatterConfig): the
 * plain call with a trailing ncclCollConfig_t, NULL meaning the plain call.
 *
 * What each field of the config becomes here:
 *   - ext (vendor options): ignored, as NCCL documents it ignores every one;
 *   - minCTAs, maxCTAs, nvlsCTAs, cgaClusterSize, CTAPolicy: how many blocks NCCL's own kernels
 *     use; they never change a result, and ncclshim sizes its grids itself, so they are checked
 *     for sense and otherwise have no effect;
 *   - userProfilerTag: for profiler plugins, which ncclshim does not load;
 *   - algSelection: refused with a message when forceAlgSelection asks for it to be honoured
 *     (the per-call choice of algorithm is not there yet: NCCL_ALGO and NCCLSHIM_ALGO choose per
 *     communicator); unforced, NCCL itself may fall back to its automatic choice, as here;
 *   - launchCompletionEvent: recorded on the stream once the call has enqueued its work (for
 *     host memory, once it is done), outside a group; inside one, refused for now.
 */
#include <nccl.h>
#include <stddef.h>

#include "api.h"
#include "base/check.h"
#include "engine/op.h"
#include "gpu/driver.h"
#include "group.h"

/* Whether the user's config holds field (it may come from an older, shorter struct). */
#define SHIM_CONFIG_HAS(config, field)                                                        \
    ((config)->size >= offsetof(ncclCollConfig_t, field) + sizeof((config)->field))

static ncclResult_t
shim_coll_config_check(const ncclCollConfig_t *config, const char *api)
{
    if (config->magic != NCCL_API_MAGIC) {
        WARN("%s: ncclCollConfig_t has magic 0x%x, not 0x%x: initialize it with "
             "NCCL_COLLCONFIG_INITIALIZER", api, config->magic, NCCL_API_MAGIC);
        return ncclInvalidArgument;
    }
    if (config->version < NCCL_VERSION(2, 31, 0) || !SHIM_CONFIG_HAS(config, ext)) {
        WARN("%s: ncclCollConfig_t version %u / size %zu is older than any NCCL that had it",
             api, config->version, config->size);
        return ncclInvalidArgument;
    }
    const int ctas[] = {
        SHIM_CONFIG_HAS(config, minCTAs) ? config->minCTAs : NCCL_CONFIG_UNDEF_INT,
        SHIM_CONFIG_HAS(config, maxCTAs) ? config->maxCTAs : NCCL_CONFIG_UNDEF_INT,
        SHIM_CONFIG_HAS(config, nvlsCTAs) ? config->nvlsCTAs : NCCL_CONFIG_UNDEF_INT,
        SHIM_CONFIG_HAS(config, cgaClusterSize) ? config->cgaClusterSize : NCCL_CONFIG_UNDEF_INT,
    };
    for (size_t i = 0; i < sizeof(ctas) / sizeof(ctas[0]); i++) {
        if (ctas[i] != NCCL_CONFIG_UNDEF_INT && ctas[i] < 0) {
            WARN("%s: ncclCollConfig_t has a negative block count (%d)", api, ctas[i]);
            return ncclInvalidArgument;
        }
    }
    if (ctas[0] != NCCL_CONFIG_UNDEF_INT && ctas[1] != NCCL_CONFIG_UNDEF_INT &&
        ctas[0] > ctas[1]) {
        WARN("%s: ncclCollConfig_t minCTAs %d is above maxCTAs %d", api, ctas[0], ctas[1]);
        return ncclInvalidArgument;
    }
    const char *alg = SHIM_CONFIG_HAS(config, algSelection) ? config->algSelection : NULL;
    bool forced = !SHIM_CONFIG_HAS(config, forceAlgSelection) || config->forceAlgSelection != 0;
    if (alg != NULL && alg[0] != '\0' && forced) {
        WARN("%s: ncclCollConfig_t algSelection \"%s\" with forceAlgSelection: ncclshim does "
             "not choose algorithms per call yet (NCCL_ALGO or NCCLSHIM_ALGO choose them per "
             "communicator), and a forced selection must not be ignored", api, alg);
        return ncclInvalidUsage;
    }
    if (alg != NULL && alg[0] != '\0') {
        INFO(SHIM_COLL, "%s: algSelection \"%s\" not forced: the automatic choice stands", api,
             alg);
    }
    if (SHIM_CONFIG_HAS(config, launchCompletionEvent) && config->launchCompletionEvent != NULL &&
        shim_group_active()) {
        WARN("%s: a launchCompletionEvent inside a group is not supported by ncclshim yet",
             api);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* After the call enqueued (or, on host memory, finished) its work on stream. */
static ncclResult_t
shim_coll_config_done(const ncclCollConfig_t *config, cudaStream_t stream)
{
    if (config == NULL || !SHIM_CONFIG_HAS(config, launchCompletionEvent) ||
        config->launchCompletionEvent == NULL) {
        return ncclSuccess;
    }
    if (!gpu_driver_present()) {
        WARN("ncclCollConfig_t launchCompletionEvent: there is no CUDA driver to record it");
        return ncclInvalidUsage;
    }
    GPU_CU_CHECK(cuEventRecord((CUevent)config->launchCompletionEvent, (CUstream)stream));
    return ncclSuccess;
}

/* Every variant: the config checked, the plain call (whose messages name it, `plain`), the
 * event. */
static ncclResult_t
shim_coll_config_call(struct shim_op *op, const ncclCollConfig_t *config, const char *api,
                      const char *plain)
{
    const cudaStream_t stream = op->stream;

    shim_error_clear();
    ncclResult_t res = config != NULL ? shim_coll_config_check(config, api) : ncclSuccess;
    if (res != ncclSuccess) {
        shim_group_fail(res); /* as a refused plain call: the group fails */
        return res;
    }
    SHIM_CHECK(shim_api_collective(op, plain));
    return shim_coll_config_done(config, stream);
}

/* ncclXConfig from its row of the table (api.h). */
#define SHIM_API_DEFINE_COLL_CONFIG(name, coll_id, count_name, mid, op_arg, root_arg)         \
    SHIM_API ncclResult_t                                                                     \
    nccl##name##Config(const void *sendbuff, void *recvbuff, size_t count_name,               \
                       ncclDataType_t datatype, SHIM_API_UNPAREN mid ncclComm_t comm,         \
                       cudaStream_t stream, const ncclCollConfig_t *config)                   \
    {                                                                                         \
        struct shim_op desc = SHIM_API_OP(coll_id, count_name, op_arg, root_arg);             \
        return shim_coll_config_call(&desc, config, "nccl" #name "Config", "nccl" #name);     \
    }                                                                                         \
    SHIM_ALIAS(nccl##name##Config)

SHIM_API_COLLECTIVES(SHIM_API_DEFINE_COLL_CONFIG)
#undef SHIM_API_DEFINE_COLL_CONFIG
