/* SPDX-License-Identifier: Apache-2.0 */
/* NCCLSHIM_CHECK=1: every rank's collectives checked against the others' before they run. */
#ifndef SHIM_CALL_CHECK_H
#define SHIM_CALL_CHECK_H

#include <nccl.h>

struct shim_exec;

/* Exchanges and compares the calls of execs (a group, in order) with the other ranks;
 * ncclInvalidUsage with a WARN naming the ranks and what differs if any call disagrees. */
ncclResult_t shim_call_check(struct shim_exec *const *execs, int nexecs);

#endif
