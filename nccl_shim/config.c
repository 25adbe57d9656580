/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reading a user's ncclConfig_t (config.h). A field is read only where the struct the program
 * was built with holds it (its size), so a program built against NCCL 2.14's nccl.h is read as
 * correctly as one built against 2.32's, and what lies past its end is never touched.
 *
 * ncclshim honours blocking and commName. The rest tune NCCL's own machinery: its kernels'
 * blocks and clusters (cgaClusterSize, minCTAs, maxCTAs, nvlsCTAs, CTAPolicy), its network and
 * channels (netName, trafficClass, collnetEnable, nChannelsPerNetPeer, nvlinkCentricSched,
 * maxP2pPeers), resource sharing with a parent (splitShare, shrinkShare), CUDA graph and
 * launch bookkeeping (graphUsageMode, graphStreamOrdering, launchOrderImplicit), one-sided
 * resources (numRmaCtx, numRmaSig, rmaEagerInit) and NVLink SHARP and CFT (hostCftMode,
 * nvlsHostMode). None changes a result or an ordering a program may rely on, and ncclshim
 * has no such machinery, so they are checked for sense, then have no effect; the INFO line
 * says which were set.
 */
#include "config.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/check.h"

/* Whether the user's struct holds field. */
#define SHIM_CONFIG_HAS(config, field)                                                        \
    ((config)->size >= offsetof(ncclConfig_t, field) + sizeof((config)->field))

/* An int field's rule: [lo, hi], or unset. */
struct shim_config_int {
    const char *name;
    size_t offset, end;
    int lo, hi;
};

#define SHIM_CONFIG_INT(field, lo, hi)                                                        \
    {#field, offsetof(ncclConfig_t, field), offsetof(ncclConfig_t, field) + sizeof(int), lo, hi}

/* The fields that have no effect here, with what NCCL accepts of each. */
static const struct shim_config_int shim_config_tuning[] = {
    SHIM_CONFIG_INT(cgaClusterSize, 0, 8),
    SHIM_CONFIG_INT(minCTAs, 1, 1 << 16),
    SHIM_CONFIG_INT(maxCTAs, 1, 1 << 16),
    SHIM_CONFIG_INT(splitShare, 0, 1),
    SHIM_CONFIG_INT(trafficClass, 0, 1 << 16),
    SHIM_CONFIG_INT(collnetEnable, 0, 1),
    SHIM_CONFIG_INT(CTAPolicy, 0, NCCL_CTA_POLICY_EFFICIENCY | NCCL_CTA_POLICY_ZERO),
    SHIM_CONFIG_INT(shrinkShare, 0, 1),
    SHIM_CONFIG_INT(nvlsCTAs, 1, 1 << 16),
    SHIM_CONFIG_INT(nChannelsPerNetPeer, 1, 1 << 16),
    SHIM_CONFIG_INT(nvlinkCentricSched, 0, 1),
    SHIM_CONFIG_INT(graphUsageMode, 0, 1 << 16),
    SHIM_CONFIG_INT(numRmaCtx, 0, 1 << 16),
    SHIM_CONFIG_INT(maxP2pPeers, 0, 1 << 24),
    SHIM_CONFIG_INT(graphStreamOrdering, 0, 1 << 16),
    SHIM_CONFIG_INT(launchOrderImplicit, 0, 1),
    SHIM_CONFIG_INT(numRmaSig, 0, 1 << 16),
    SHIM_CONFIG_INT(rmaEagerInit, 0, 1),
    SHIM_CONFIG_INT(hostCftMode, ncclHostCftEnable, ncclHostCftFallback),
    SHIM_CONFIG_INT(nvlsHostMode, 0, ncclNvlsHostModeDisable),
};

ncclResult_t
shim_config_read(const ncclConfig_t *config, const char *api, struct shim_config *out)
{
    char tuned[512] = "";
    size_t used = 0;

    memset(out, 0, sizeof(*out));
    if (config == NULL) {
        return ncclSuccess;
    }
    if (config->magic != NCCL_API_MAGIC) {
        WARN("%s: ncclConfig_t has magic 0x%x, not 0x%x: initialize it with "
             "NCCL_CONFIG_INITIALIZER", api, config->magic, NCCL_API_MAGIC);
        return ncclInvalidArgument;
    }
    if (config->version < NCCL_VERSION(2, 14, 0) || !SHIM_CONFIG_HAS(config, blocking)) {
        WARN("%s: ncclConfig_t version %u / size %zu is older than any NCCL that had configs",
             api, config->version, config->size);
        return ncclInvalidArgument;
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
        if (config->blocking != 0 && config->blocking != 1) {
            WARN("%s: ncclConfig_t blocking is %d: it must be 0 or 1", api, config->blocking);
            return ncclInvalidArgument;
        }
        out->blocking_set = true;
        out->blocking = config->blocking != 0;
    }
    for (size_t i = 0; i < sizeof(shim_config_tuning) / sizeof(shim_config_tuning[0]); i++) {
        const struct shim_config_int *f = &shim_config_tuning[i];
        int value;
        if (config->size < f->end) {
            continue; /* an older struct: the field is not there */
        }
        memcpy(&value, (const char *)config + f->offset, sizeof(value));
        if (value == NCCL_CONFIG_UNDEF_INT) {
            continue;
        }
        if (value < f->lo || value > f->hi) {
            WARN("%s: ncclConfig_t %s is %d: it must be in %d..%d", api, f->name, value, f->lo,
                 f->hi);
            return ncclInvalidArgument;
        }
        int len = snprintf(tuned + used, sizeof(tuned) - used, " %s=%d", f->name, value);
        used = len > 0 && used + (size_t)len < sizeof(tuned) ? used + (size_t)len : used;
    }
    if (SHIM_CONFIG_HAS(config, minCTAs) && SHIM_CONFIG_HAS(config, maxCTAs) &&
        config->minCTAs != NCCL_CONFIG_UNDEF_INT && config->maxCTAs != NCCL_CONFIG_UNDEF_INT &&
        config->minCTAs > config->maxCTAs) {
        WARN("%s: ncclConfig_t minCTAs %d is above maxCTAs %d", api, config->minCTAs,
             config->maxCTAs);
        return ncclInvalidArgument;
    }
    if (SHIM_CONFIG_HAS(config, netName) && config->netName != NULL) {
        int len = snprintf(tuned + used, sizeof(tuned) - used, " netName=%s (ncclshim's is UCX)",
                           config->netName);
        used = len > 0 && used + (size_t)len < sizeof(tuned) ? used + (size_t)len : used;
    }
    if (SHIM_CONFIG_HAS(config, commName) && config->commName != NULL) {
        snprintf(out->name, sizeof(out->name), "%s", config->commName);
    }
    if (used > 0) {
        INFO(SHIM_INIT, "%s: ncclConfig_t sets%s: these tune NCCL's own kernels, network and "
             "resources, and have no effect in ncclshim", api, tuned);
    }
    return ncclSuccess;
}
