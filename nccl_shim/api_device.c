/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host entry points of NCCL's device API (the nccl_device headers: device communicators,
 * teams, barriers, LL all-to-all). The genuine libnccl.so.2 exports them, so a drop-in must too.
 * Those headers are C++ only, so the prototypes are restated here from them, with the same
 * types: ncclTeam_t is returned by value ({nRanks, rank, stride}), everything else passes
 * through pointers we do not dereference.
 *
 * Device-initiated communication needs a GPU and symmetric memory, which ncclshim does not
 * provide: the functions that create resources return ncclInvalidUsage with a message. The
 * team queries are plain rank arithmetic, and answer as for a communicator whose ranks share
 * no memory: the LSA (load/store accessible) team is the rank alone, the rail team is
 * everyone.
 */
#include <nccl.h>

#include "api.h"
#include "base/check.h"
#include "comm.h"

typedef struct ncclTeam {
    int nRanks, rank, stride;
} ncclTeam_t;

struct ncclDevComm;
struct ncclDevCommRequirements;
struct ncclDevResourceRequirements;
struct ncclLsaBarrierHandle;
struct ncclGinBarrierHandle;
struct ncclLLA2AHandle;

SHIM_API ncclResult_t ncclDevCommCreate(ncclComm_t comm,
                                        const struct ncclDevCommRequirements *reqs,
                                        struct ncclDevComm *out_dev_comm);
SHIM_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const struct ncclDevComm *dev_comm);
SHIM_API ncclResult_t ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nbarriers,
                                                      struct ncclLsaBarrierHandle *out_handle,
                                                      struct ncclDevResourceRequirements *out_req);
SHIM_API ncclResult_t ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team,
                                                      int nbarriers,
                                                      struct ncclGinBarrierHandle *out_handle,
                                                      struct ncclDevResourceRequirements *out_req);
SHIM_API int ncclLLA2ACalcSlots(int max_elts, int max_elt_size);
SHIM_API ncclResult_t ncclLLA2ACreateRequirement(int nblocks, int nslots,
                                                 struct ncclLLA2AHandle *out_handle,
                                                 struct ncclDevResourceRequirements *out_req);
SHIM_API ncclTeam_t ncclTeamWorld(ncclComm_t comm);
SHIM_API ncclTeam_t ncclTeamLsa(ncclComm_t comm);
SHIM_API ncclTeam_t ncclTeamRail(ncclComm_t comm);
SHIM_API int ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank);
SHIM_API int ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank);

static ncclResult_t
shim_device_api_unsupported(const char *api)
{
    shim_error_clear();
    WARN("%s: NCCL's device API needs GPU symmetric memory, which ncclshim does not provide",
         api);
    return ncclInvalidUsage;
}

SHIM_API ncclResult_t
ncclDevCommCreate(ncclComm_t comm, const struct ncclDevCommRequirements *reqs,
                  struct ncclDevComm *out_dev_comm)
{
    (void)comm, (void)reqs, (void)out_dev_comm;
    return shim_device_api_unsupported("ncclDevCommCreate");
}
SHIM_ALIAS(ncclDevCommCreate)

SHIM_API ncclResult_t
ncclDevCommDestroy(ncclComm_t comm, const struct ncclDevComm *dev_comm)
{
    (void)comm, (void)dev_comm;
    return shim_device_api_unsupported("ncclDevCommDestroy");
}
SHIM_ALIAS(ncclDevCommDestroy)

SHIM_API ncclResult_t
ncclLsaBarrierCreateRequirement(ncclTeam_t team, int nbarriers,
                                struct ncclLsaBarrierHandle *out_handle,
                                struct ncclDevResourceRequirements *out_req)
{
    (void)team, (void)nbarriers, (void)out_handle, (void)out_req;
    return shim_device_api_unsupported("ncclLsaBarrierCreateRequirement");
}
SHIM_ALIAS(ncclLsaBarrierCreateRequirement)

SHIM_API ncclResult_t
ncclGinBarrierCreateRequirement(ncclComm_t comm, ncclTeam_t team, int nbarriers,
                                struct ncclGinBarrierHandle *out_handle,
                                struct ncclDevResourceRequirements *out_req)
{
    (void)comm, (void)team, (void)nbarriers, (void)out_handle, (void)out_req;
    return shim_device_api_unsupported("ncclGinBarrierCreateRequirement");
}
SHIM_ALIAS(ncclGinBarrierCreateRequirement)

SHIM_API ncclResult_t
ncclLLA2ACreateRequirement(int nblocks, int nslots, struct ncclLLA2AHandle *out_handle,
                           struct ncclDevResourceRequirements *out_req)
{
    (void)nblocks, (void)nslots, (void)out_handle, (void)out_req;
    return shim_device_api_unsupported("ncclLLA2ACreateRequirement");
}
SHIM_ALIAS(ncclLLA2ACreateRequirement)

/* No device buffers, so no slots: 0, with the reason kept for ncclGetLastError. */
SHIM_API int
ncclLLA2ACalcSlots(int max_elts, int max_elt_size)
{
    (void)max_elts, (void)max_elt_size;
    shim_device_api_unsupported("ncclLLA2ACalcSlots");
    return 0;
}
SHIM_ALIAS(ncclLLA2ACalcSlots)

/* The team of all ranks; an invalid communicator gets the empty team. */
SHIM_API ncclTeam_t
ncclTeamWorld(ncclComm_t comm)
{
    ncclTeam_t team = {0, 0, 1};
    shim_error_clear();
    if (shim_comm_check(comm, "ncclTeamWorld") == ncclSuccess) {
        team = (ncclTeam_t){comm->nranks, comm->rank, 1};
    }
    return team;
}
SHIM_ALIAS(ncclTeamWorld)

SHIM_API ncclTeam_t
ncclTeamLsa(ncclComm_t comm)
{
    ncclTeam_t team = {0, 0, 1};
    shim_error_clear();
    if (shim_comm_check(comm, "ncclTeamLsa") == ncclSuccess) {
        team = (ncclTeam_t){1, 0, 1};
    }
    return team;
}
SHIM_ALIAS(ncclTeamLsa)

/* The outer factor of the LSA team: with LSA teams of one rank, everyone. */
SHIM_API ncclTeam_t
ncclTeamRail(ncclComm_t comm)
{
    return ncclTeamWorld(comm);
}
SHIM_ALIAS(ncclTeamRail)

/* A team is an arithmetic progression of world ranks through ours: member i is
 * world rank (our rank) + (i - team.rank) * team.stride. */
SHIM_API int
ncclTeamRankToWorld(ncclComm_t comm, ncclTeam_t team, int rank)
{
    shim_error_clear();
    if (shim_comm_check(comm, "ncclTeamRankToWorld") != ncclSuccess) {
        return -1;
    }
    return comm->rank + (rank - team.rank) * team.stride;
}
SHIM_ALIAS(ncclTeamRankToWorld)

/* Within LSA teams of one rank, a member's LSA rank is 0 for ourselves; others are not
 * LSA-reachable, reported as -1. */
SHIM_API int
ncclTeamRankToLsa(ncclComm_t comm, ncclTeam_t team, int rank)
{
    int world = ncclTeamRankToWorld(comm, team, rank);
    return world >= 0 && world == comm->rank ? 0 : -1;
}
SHIM_ALIAS(ncclTeamRankToLsa)
