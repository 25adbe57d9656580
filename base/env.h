/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every environment variable the library reads, declared once in env.c's table with its
 * default and meaning (docs/environment.md lists that table). NCCL's own variables mean what they
 * mean in NCCL; ours are NCCLSHIM_*. Values are read on first use and then kept.
 */
#ifndef SHIM_ENV_H
#define SHIM_ENV_H

#include <stdint.h>

enum shim_env_id {
    SHIM_ENV_NCCL_DEBUG,
    SHIM_ENV_NCCL_DEBUG_SUBSYS,
    SHIM_ENV_NCCL_DEBUG_FILE,
    SHIM_ENV_NCCL_COMM_ID,
    SHIM_ENV_NCCL_SOCKET_IFNAME,
    SHIM_ENV_BOOTSTRAP_TIMEOUT,
    SHIM_ENV_SPIN_US,
    SHIM_ENV_WAIT_MS,
    SHIM_ENV_CHUNK_BYTES,
    SHIM_ENV_RING_SLOTS,
    SHIM_ENV_NCCL_ALGO,
    SHIM_ENV_ALGO,
    SHIM_ENV_ALPHA_US,
    SHIM_ENV_BETA_GBPS,
    SHIM_ENV_GAMMA_GBPS,
    SHIM_ENV_NET_ALPHA_US,
    SHIM_ENV_NET_BETA_GBPS,
    SHIM_ENV_UCX_TLS,
    SHIM_ENV_NCCL_SHM_DISABLE,
    SHIM_ENV_NCCL_HOSTID,
    SHIM_ENV_SHM_SLOT_BYTES,
    SHIM_ENV_SHM_DIRECT_BYTES,
    SHIM_ENV_TIMEOUT,
    SHIM_ENV_CHECK,
    SHIM_ENV_DEVICE_DIRECT,
    SHIM_ENV_STAGED_PHASES,
    SHIM_ENV_RANK_LEADERS,
    SHIM_ENV_COUNT
};

/* The variable's value, or its default when unset (NULL for a string with no default). */
const char *shim_env_str(enum shim_env_id id);
/* Integer variables; a malformed value WARNs once and falls back to the default. */
int64_t shim_env_int(enum shim_env_id id);
const char *shim_env_name(enum shim_env_id id);
/* What the variable does, one line. */
const char *shim_env_meaning(enum shim_env_id id);
/* The variable named `name` exactly, or -1. */
int shim_env_find(const char *name);
/* Floating-point variables; unset or malformed (WARNed once) gives `fallback`. */
double shim_env_double(enum shim_env_id id, double fallback);

#endif
