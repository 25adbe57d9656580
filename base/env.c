/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The table of every environment variable ncclshim reads. Each entry is read once, on first
 * use, and logged under NCCL_DEBUG_SUBSYS=ENV when set. To add a tunable: one enum entry in
 * env.h, one row here, one row in docs/environment.md.
 */
#include "env.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "debug.h"

struct shim_env_var {
    const char *name;
    const char *fallback; /* default, as text; NULL: unset */
    const char *meaning;
};

static const struct shim_env_var shim_env_table[SHIM_ENV_COUNT] = {
    [SHIM_ENV_NCCL_DEBUG] = {"NCCL_DEBUG", NULL, "log level: VERSION, WARN, INFO, TRACE"},
    [SHIM_ENV_NCCL_DEBUG_SUBSYS] = {"NCCL_DEBUG_SUBSYS", "INIT,ENV",
                                    "subsystems to log, comma list, ^ excludes"},
    [SHIM_ENV_NCCL_DEBUG_FILE] = {"NCCL_DEBUG_FILE", NULL, "log file; %h host, %p pid"},
    [SHIM_ENV_NCCL_COMM_ID] = {"NCCL_COMM_ID", NULL,
                               "host:port of the bootstrap root, instead of the unique id's"},
    [SHIM_ENV_NCCL_SOCKET_IFNAME] = {"NCCL_SOCKET_IFNAME", NULL,
                                     "bootstrap interfaces: prefixes, ^ excludes, = exact"},
    [SHIM_ENV_BOOTSTRAP_TIMEOUT] = {"NCCLSHIM_BOOTSTRAP_TIMEOUT", "120",
                                    "seconds init may wait for the root and the other ranks"},
    [SHIM_ENV_SPIN_US] = {"NCCLSHIM_SPIN_US", NULL,
                          "microseconds a waiting rank polls before it sleeps (default 200 "
                          "on shared memory and device work, growing while sleeps end soon; "
                          "20 on the network)"},
    [SHIM_ENV_WAIT_MS] = {"NCCLSHIM_WAIT_MS", "100",
                          "longest sleep between checks for abort and peer failure"},
    [SHIM_ENV_CHUNK_BYTES] = {"NCCLSHIM_CHUNK_BYTES", NULL,
                              "largest pipeline chunk of the UCX algorithms (default 131072 on "
                              "one host, 524288 across hosts)"},
    [SHIM_ENV_RING_SLOTS] = {"NCCLSHIM_RING_SLOTS", "4",
                             "chunks a ring rank may receive ahead of its reductions"},
    [SHIM_ENV_NCCL_ALGO] = {"NCCL_ALGO", NULL,
                            "algorithm families: Ring, Tree, ^Tree, allreduce:tree;..."},
    [SHIM_ENV_ALGO] = {"NCCLSHIM_ALGO", NULL,
                       "our algorithms by name, NCCL_ALGO's syntax: allgather:bruck;^recdbl"},
    [SHIM_ENV_ALPHA_US] = {"NCCLSHIM_ALPHA_US", NULL,
                           "cost model: microseconds per message (default by transport)"},
    [SHIM_ENV_BETA_GBPS] = {"NCCLSHIM_BETA_GBPS", NULL,
                            "cost model: GB/s a rank sends at (default by transport)"},
    [SHIM_ENV_GAMMA_GBPS] = {"NCCLSHIM_GAMMA_GBPS", NULL,
                             "cost model: GB/s a rank reduces at (default 3.4)"},
    [SHIM_ENV_NET_ALPHA_US] = {"NCCLSHIM_NET_ALPHA_US", NULL,
                               "cost model: microseconds per message between hosts (15)"},
    [SHIM_ENV_NET_BETA_GBPS] = {"NCCLSHIM_NET_BETA_GBPS", NULL,
                                "cost model: GB/s a rank sends at between hosts (1)"},
    [SHIM_ENV_UCX_TLS] = {"UCX_TLS", NULL,
                          "UCX's own; read to pick the cost model's transport defaults"},
    [SHIM_ENV_NCCL_SHM_DISABLE] = {"NCCL_SHM_DISABLE", "0",
                                   "1: no shared-memory collectives, even on one host"},
    [SHIM_ENV_NCCL_HOSTID] = {"NCCL_HOSTID", NULL,
                              "host identity: ranks with equal ids share memory"},
    [SHIM_ENV_SHM_SLOT_BYTES] = {"NCCLSHIM_SHM_SLOT_BYTES", "131072",
                                 "chunk of the shared-memory collectives (equal on all ranks)"},
    [SHIM_ENV_SHM_DIRECT_BYTES] = {"NCCLSHIM_SHM_DIRECT_BYTES", "16384",
                                   "all-reduce and reduce up to this size: every rank reduces it all"},
    [SHIM_ENV_TIMEOUT] = {"NCCLSHIM_TIMEOUT", "0",
                          "seconds without progress before an operation fails (0: never)"},
    [SHIM_ENV_CHECK] = {"NCCLSHIM_CHECK", "0",
                        "1: check that every rank calls the same collective, count, type, op, "
                        "root"},
    [SHIM_ENV_DEVICE_DIRECT] = {"NCCLSHIM_DEVICE_DIRECT", NULL,
                                "device buffers across hosts: 1 to UCX as they are, 0 staged "
                                "through pinned memory (default: 1 if UCX reports CUDA)"},
    [SHIM_ENV_STAGED_PHASES] = {"NCCLSHIM_STAGED_PHASES", "0",
                                "1: device buffers across hosts: time spent per phase, printed "
                                "when the communicator goes"},
    [SHIM_ENV_RANK_LEADERS] = {"NCCLSHIM_RANK_LEADERS", "0",
                               "1 on every rank: ranks sharing a GPU each run their own share "
                               "of it, as with a GPU per rank"},
};

static pthread_once_t shim_env_once = PTHREAD_ONCE_INIT;
static const char *shim_env_values[SHIM_ENV_COUNT];

static void
shim_env_load(void)
{
    for (int i = 0; i < SHIM_ENV_COUNT; i++) {
        const char *value = getenv(shim_env_table[i].name);
        shim_env_values[i] = value != NULL ? value : shim_env_table[i].fallback;
    }
}

const char *
shim_env_str(enum shim_env_id id)
{
    pthread_once(&shim_env_once, shim_env_load);
    return shim_env_values[id];
}

const char *
shim_env_name(enum shim_env_id id)
{
    return shim_env_table[id].name;
}

const char *
shim_env_meaning(enum shim_env_id id)
{
    return shim_env_table[id].meaning;
}

int
shim_env_find(const char *name)
{
    for (int id = 0; id < SHIM_ENV_COUNT; id++) {
        if (strcmp(shim_env_table[id].name, name) == 0) {
            return id;
        }
    }
    return -1;
}

/* Parsed once: the executor reads its tunables on every call. */
static int64_t shim_env_ints[SHIM_ENV_COUNT];
static int shim_env_ints_ready[SHIM_ENV_COUNT]; /* atomic */

int64_t
shim_env_int(enum shim_env_id id)
{
    if (__atomic_load_n(&shim_env_ints_ready[id], __ATOMIC_ACQUIRE)) {
        return shim_env_ints[id];
    }
    const char *text = shim_env_str(id);
    const char *fallback = shim_env_table[id].fallback;
    char *end;

    errno = 0;
    long long value = strtoll(text != NULL ? text : "0", &end, 0);
    if (errno != 0 || end == text || *end != '\0') {
        WARN("%s=%s is not an integer; using %s", shim_env_table[id].name, text, fallback);
        value = strtoll(fallback != NULL ? fallback : "0", NULL, 0);
    }
    shim_env_ints[id] = value;
    __atomic_store_n(&shim_env_ints_ready[id], 1, __ATOMIC_RELEASE);
    return value;
}

double
shim_env_double(enum shim_env_id id, double fallback)
{
    const char *text = shim_env_str(id);
    char *end;

    if (text == NULL) {
        return fallback;
    }
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(value > 0)) {
        WARN("%s=%s is not a positive number; using %g", shim_env_table[id].name, text,
             fallback);
        return fallback;
    }
    return value;
}
