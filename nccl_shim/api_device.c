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
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "api.h"
#include "base/check.h"
#include "comm.h"
#include "engine/window.h"

typedef struct ncclTeam {
    int nRanks, rank, stride;
} ncclTeam_t;

/* nccl_device/core.h's enums, restated (C ints, as there). */
typedef int shim_gin_type_t;            /* ncclGinType_t: NCCL_GIN_TYPE_NONE is 0 */
typedef int shim_gin_connection_type_t; /* ncclGinConnectionType_t */
typedef int shim_cft_team_mode_t;       /* ncclCftTeamMode_t */

/* nccl_device/host.h's ncclCommProperties_t of 2.29-2.32, member for member. */
typedef struct ncclCommProperties {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int rank;
    int nRanks;
    int cudaDev;
    int nvmlDev;
    bool deviceApiSupport;
    bool multimemSupport;
    shim_gin_type_t ginType;
    int nLsaTeams;
    bool hostRmaSupport;
    shim_gin_type_t railedGinType;
    uint64_t commHash;
    int ginMinStride;
    shim_gin_connection_type_t ginConnectionType;
    bool ginSupport[64];
    size_t devCommRuntimeVersionSize;
    bool cftSupport;
    bool cftMulticastSupport;
    bool cftCountedSupport;
} ncclCommProperties_t;

struct ncclDevComm;
struct ncclDevCommRequirements;
struct ncclGinOutboxHandle;
struct ncclGinInboxA2AHandle;
struct ncclMultimemHandle;
struct ncclCftLeId;
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
SHIM_API ncclResult_t ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t *props);
SHIM_API ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset,
                                                      void **out_ptr);
SHIM_API ncclResult_t ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset,
                                                   struct ncclMultimemHandle *multimem,
                                                   void **out_ptr);
SHIM_API ncclResult_t ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsa_rank,
                                              void **out_ptr);
SHIM_API ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer,
                                               void **out_ptr);
SHIM_API ncclResult_t ncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset,
                                                  struct ncclCftLeId *le_id, size_t *le_offset);
SHIM_API ncclResult_t ncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peer_cft,
                                             ncclTeam_t cft_team, struct ncclCftLeId *le_id,
                                             size_t *le_offset);
SHIM_API ncclResult_t ncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset,
                                              int peer_world, struct ncclCftLeId *le_id,
                                              size_t *le_offset);
SHIM_API ncclTeam_t ncclTeamCft(ncclComm_t comm, shim_cft_team_mode_t mode);
SHIM_API ncclTeam_t ncclTeamCftMultimem(ncclComm_t comm);
SHIM_API ncclResult_t ncclGinOutboxCreateRequirement(int nblocks, int size_log2,
                                                     struct ncclGinOutboxHandle *out_handle,
                                                     struct ncclDevResourceRequirements *out_req);
SHIM_API ncclResult_t ncclGinInboxA2ACreateRequirement(ncclTeam_t peers, int nblocks,
                                                       int size_log2,
                                                       struct ncclGinInboxA2AHandle *out_handle,
                                                       struct ncclDevResourceRequirements *out_req);

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

/* What is true of a ncclshim communicator: no device API, no multimem, no GIN, no CFT, and
 * LSA teams of one rank each. */
SHIM_API ncclResult_t
ncclCommQueryProperties(ncclComm_t comm, ncclCommProperties_t *props)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclCommQueryProperties"));
    if (props == NULL) {
        WARN("ncclCommQueryProperties: props is NULL");
        return ncclInvalidArgument;
    }
    if (props->magic != NCCL_API_MAGIC || props->size < offsetof(ncclCommProperties_t, nvmlDev)) {
        WARN("ncclCommQueryProperties: ncclCommProperties_t has magic 0x%x and size %zu: "
             "initialize it with NCCL_COMM_PROPERTIES_INITIALIZER", props->magic, props->size);
        return ncclInvalidArgument;
    }
    ncclCommProperties_t ours = {
        .rank = comm->rank,
        .nRanks = comm->nranks,
        .cudaDev = comm->cuda_dev,
        .nvmlDev = -1, /* ncclshim does not load NVML */
        .nLsaTeams = comm->nranks,
        .commHash = comm->id_hash,
        .ginMinStride = 1,
    };
    /* Only what the caller's (perhaps older, shorter) struct holds. */
    size_t head = offsetof(ncclCommProperties_t, rank);
    size_t bytes = props->size < sizeof(ours) ? props->size : sizeof(ours);
    memcpy((char *)props + head, (const char *)&ours + head, bytes - head);
    return ncclSuccess;
}
SHIM_ALIAS(ncclCommQueryProperties)

SHIM_API ncclResult_t
ncclGetLsaMultimemDevicePointer(ncclWindow_t window, size_t offset, void **out_ptr)
{
    (void)window, (void)offset, (void)out_ptr;
    shim_error_clear();
    return shim_api_no_device_window("ncclGetLsaMultimemDevicePointer");
}
SHIM_ALIAS(ncclGetLsaMultimemDevicePointer)

SHIM_API ncclResult_t
ncclGetMultimemDevicePointer(ncclWindow_t window, size_t offset,
                             struct ncclMultimemHandle *multimem, void **out_ptr)
{
    (void)window, (void)offset, (void)multimem, (void)out_ptr;
    shim_error_clear();
    return shim_api_no_device_window("ncclGetMultimemDevicePointer");
}
SHIM_ALIAS(ncclGetMultimemDevicePointer)

SHIM_API ncclResult_t
ncclGetLsaDevicePointer(ncclWindow_t window, size_t offset, int lsa_rank, void **out_ptr)
{
    shim_error_clear();
    /* ncclshim's device windows live on one host: the LSA team is the whole communicator. */
    return shim_window_device_ptr(window, offset, lsa_rank, out_ptr, "ncclGetLsaDevicePointer");
}
SHIM_ALIAS(ncclGetLsaDevicePointer)

SHIM_API ncclResult_t
ncclGetPeerDevicePointer(ncclWindow_t window, size_t offset, int peer, void **out_ptr)
{
    shim_error_clear();
    return shim_window_device_ptr(window, offset, peer, out_ptr, "ncclGetPeerDevicePointer");
}
SHIM_ALIAS(ncclGetPeerDevicePointer)

SHIM_API ncclResult_t
ncclGetMultimemDeviceLeInfo(ncclWindow_t window, size_t offset, struct ncclCftLeId *le_id,
                            size_t *le_offset)
{
    (void)window, (void)offset, (void)le_id, (void)le_offset;
    shim_error_clear();
    return shim_api_no_device_window("ncclGetMultimemDeviceLeInfo");
}
SHIM_ALIAS(ncclGetMultimemDeviceLeInfo)

SHIM_API ncclResult_t
ncclGetCftDeviceLeInfo(ncclWindow_t window, size_t offset, int peer_cft, ncclTeam_t cft_team,
                       struct ncclCftLeId *le_id, size_t *le_offset)
{
    (void)window, (void)offset, (void)peer_cft, (void)cft_team, (void)le_id, (void)le_offset;
    shim_error_clear();
    return shim_api_no_device_window("ncclGetCftDeviceLeInfo");
}
SHIM_ALIAS(ncclGetCftDeviceLeInfo)

SHIM_API ncclResult_t
ncclGetPeerDeviceLeInfo(ncclWindow_t window, size_t offset, int peer_world,
                        struct ncclCftLeId *le_id, size_t *le_offset)
{
    (void)window, (void)offset, (void)peer_world, (void)le_id, (void)le_offset;
    shim_error_clear();
    return shim_api_no_device_window("ncclGetPeerDeviceLeInfo");
}
SHIM_ALIAS(ncclGetPeerDeviceLeInfo)

/* CFT teams: with no CFT, the rank alone, as the LSA team. */
SHIM_API ncclTeam_t
ncclTeamCft(ncclComm_t comm, shim_cft_team_mode_t mode)
{
    (void)mode;
    return ncclTeamLsa(comm);
}
SHIM_ALIAS(ncclTeamCft)

SHIM_API ncclTeam_t
ncclTeamCftMultimem(ncclComm_t comm)
{
    return ncclTeamLsa(comm);
}
SHIM_ALIAS(ncclTeamCftMultimem)

SHIM_API ncclResult_t
ncclGinOutboxCreateRequirement(int nblocks, int size_log2, struct ncclGinOutboxHandle *out_handle,
                               struct ncclDevResourceRequirements *out_req)
{
    (void)nblocks, (void)size_log2, (void)out_handle, (void)out_req;
    return shim_device_api_unsupported("ncclGinOutboxCreateRequirement");
}
SHIM_ALIAS(ncclGinOutboxCreateRequirement)

SHIM_API ncclResult_t
ncclGinInboxA2ACreateRequirement(ncclTeam_t peers, int nblocks, int size_log2,
                                 struct ncclGinInboxA2AHandle *out_handle,
                                 struct ncclDevResourceRequirements *out_req)
{
    (void)peers, (void)nblocks, (void)size_log2, (void)out_handle, (void)out_req;
    return shim_device_api_unsupported("ncclGinInboxA2ACreateRequirement");
}
SHIM_ALIAS(ncclGinInboxA2ACreateRequirement)
