/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclConfig_t as a user's program hands it over: a struct that grew from NCCL 2.14 (80 bytes
 * in 2.28, 120 in 2.32), whose size says which fields it holds.
 */
#ifndef SHIM_CONFIG_H
#define SHIM_CONFIG_H

#include <nccl.h>
#include <stdbool.h>

#include "engine/comm.h"

#define SHIM_CONFIG_NAME_MAX SHIM_COMM_NAME_MAX

/* What ncclshim takes from a config. */
struct shim_config {
    bool blocking_set;                 /* the config says blocking or not ... */
    bool blocking;                     /* ... this */
    char name[SHIM_CONFIG_NAME_MAX];   /* commName, for the logs; "" without one */
};

/* Reads config (NULL: nothing set) into out. Every field its size holds is checked (a value
 * outside what NCCL accepts is ncclInvalidArgument with a message); the fields that tune
 * NCCL's own kernels, network and one-sided resources change no result and have no effect
 * here, which one INFO line says. api names the caller in messages. */
ncclResult_t shim_config_read(const ncclConfig_t *config, const char *api,
                              struct shim_config *out);

#endif
