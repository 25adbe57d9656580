/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A communicator's connections (connect.h): its transport worker and its endpoints, then what
 * its ranks share.
 *
 * The shared-memory team (shm/): every rank creates its segment, the ranks trade (host,
 * segment name, device) over the transport, and if all share one host they map each other's
 * segments. A second exchange confirms every rank succeeded, and says which ranks' device
 * memory each rank's process can map (its device, or one with peer access); only then is the
 * team used, and either way each rank removes its segment's name, so /dev/shm keeps nothing
 * once init returns. Any failure means "no team", never an error: the UCX algorithms serve.
 * Then the back-end table (backend.h) picks the row for device memory, handing the device team
 * what the ranks told each other of their devices.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connect.h"

#include "backend.h"
#include "base/check.h"
#include "base/debug.h"
#include "base/env.h"
#include "comm.h"
#include "exec.h"
#include "exec_device.h"
#include "gpu/driver.h"
#include "shm/shm.h"
#include "transports/transport.h"

struct shim_shm_hello {
    uint64_t host;
    char name[SHM_NAME_MAX]; /* empty: this rank has no segment */
    CUuuid device;           /* the rank's device, when has_device */
    uint8_t has_device;
    uint8_t rank_leaders;    /* NCCLSHIM_RANK_LEADERS=1 on this rank */
};

/* Every rank's `bytes` from send into recv (rank i's at i * bytes), over the transport. */
static ncclResult_t
shim_connect_allgather(struct ncclComm *comm, const void *send, void *recv, size_t bytes)
{
    struct alg_sched sched;

    alg_sched_init(&sched);
    memcpy((uint8_t *)recv + (size_t)comm->rank * bytes, send, bytes);
    alg_exchange_all(&sched, NULL, comm->nranks, comm->rank, bytes);
    ncclResult_t res = alg_sched_finish(&sched);
    if (res == ncclSuccess) {
        res = shim_exec_run_schedule(comm, &sched, send, recv);
    }
    alg_sched_free(&sched);
    return res;
}

/* The collectives no filter restricted: the shared-memory path stands in for every row. */
static uint32_t
shim_connect_unfiltered_colls(const struct ncclComm *comm)
{
    struct alg_policy all;
    uint32_t colls = 0;

    if (alg_policy_parse(NULL, NULL, &all) != ncclSuccess) {
        return 0;
    }
    for (int c = 0; c < ALG_COLL_COUNT; c++) {
        if (comm->policy.allowed[c] == all.allowed[c]) {
            colls |= 1u << c;
        }
    }
    return colls;
}

/* This rank's device, for the hello. */
static void
shim_connect_hello_device(const struct ncclComm *comm, struct shim_shm_hello *me)
{
    me->has_device = comm->cuda_dev >= 0 &&
                     gpu_device_uuid(comm->cuda_dev, &me->device) == ncclSuccess;
}

/* row[b]: whether this rank's process can map rank b's device memory. */
static void
shim_connect_reach_row(const struct ncclComm *comm, const struct shim_shm_hello *all,
                       uint8_t *row)
{
    for (int b = 0; b < comm->nranks; b++) {
        int local = all[b].has_device ? gpu_device_by_uuid(&all[b].device) : -1;
        row[b] = local >= 0 && gpu_device_can_reach(comm->cuda_dev, local);
    }
}

/* Whether every rank asked that ranks sharing a GPU each lead their own share of it
 * (NCCLSHIM_RANK_LEADERS=1): then each runs exactly what a rank alone on its GPU runs (its own
 * streams, ring and tree levels, IPC between processes), for tests and for fewer GPUs than
 * ranks, each GPU paying a context switch per operation for every rank on it. Every rank
 * decides from the same hellos: some ranks asking alone changes nothing, with a WARN. */
static bool
shim_connect_rank_leaders(const struct ncclComm *comm, const struct shim_shm_hello *all, int n)
{
    int asked = 0;

    for (int r = 0; r < n; r++) {
        asked += all[r].rank_leaders;
    }
    if (asked > 0 && asked < n && comm->rank == 0) {
        WARN("NCCLSHIM_RANK_LEADERS=1 is set on %d of %d ranks, and must be on every rank: "
             "ranks sharing a GPU share its leader", asked, n);
    }
    return asked == n;
}

/* Per rank, from every rank's hello: the lowest rank on the same GPU (-1 without one; itself
 * where every rank leads its own share), and that GPU as this process numbers it (-1 where it
 * lacks it). */
static void
shim_connect_gpu_ranks(const struct shim_shm_hello *all, int n, bool rank_leaders,
                       int *first_on_device, int *device_here)
{
    for (int r = 0; r < n; r++) {
        first_on_device[r] = rank_leaders && all[r].has_device ? r : -1;
        device_here[r] = all[r].has_device ? gpu_device_by_uuid(&all[r].device) : -1;
        for (int q = 0; q <= r && all[r].has_device && first_on_device[r] < 0; q++) {
            if (all[q].has_device && memcmp(&all[q].device, &all[r].device, sizeof(CUuuid)) == 0) {
                first_on_device[r] = q;
            }
        }
    }
}

/* What the device team needs of the hellos (verdicts holds every rank's reach row, after its
 * ok byte), into *peers_out (its arrays freed by shim_connect_peers_free); NULL where memory
 * ran out, which leaves the ranks without a device team, never fails init. */
static void
shim_connect_devices(const struct ncclComm *comm, const struct shim_shm_hello *all,
                     const uint8_t *verdicts, struct shim_backend_peers **peers_out)
{
    const int n = comm->nranks;
    struct shim_backend_peers *peers = NULL;
    uint8_t *reach = NULL;
    int *first_on_device = NULL, *device_here = NULL;

    if (gpu_device_count() == 0) {
        return; /* no device to tell of */
    }
    if (shim_calloc(&peers, 1) != ncclSuccess ||
        shim_calloc(&reach, (size_t)n * n) != ncclSuccess ||
        shim_calloc(&first_on_device, (size_t)n) != ncclSuccess ||
        shim_calloc(&device_here, (size_t)n) != ncclSuccess) {
        free(peers);
        free(reach);
        free(first_on_device);
        free(device_here);
        return;
    }
    for (int a = 0; a < n; a++) {
        memcpy(reach + (size_t)a * n, verdicts + (size_t)a * (n + 1) + 1, (size_t)n);
    }
    shim_connect_gpu_ranks(all, n, shim_connect_rank_leaders(comm, all, n), first_on_device,
                           device_here);
    *peers = (struct shim_backend_peers){.reach = reach, .first_on_device = first_on_device,
                                         .device_here = device_here};
    *peers_out = peers;
}

static void
shim_connect_peers_free(struct shim_backend_peers *peers)
{
    if (peers != NULL) {
        free((void *)peers->reach);
        free((void *)peers->first_on_device);
        free((void *)peers->device_here);
        free(peers);
    }
}

/* Which ranks share a host, from every rank's hello, for the schedules (alg_hosts): hosts
 * numbered in the order of their lowest rank. Kept only where ranks span hosts; there the
 * pipeline chunk grows to SHIM_CHUNK_BYTES_ACROSS_HOSTS unless the user chose one. */
static ncclResult_t
shim_connect_hosts(struct ncclComm *comm, const struct shim_shm_hello *all)
{
    const int n = comm->nranks;
    int *host_of, *size, nhosts = 0;

    SHIM_CHECK(shim_calloc(&host_of, 2 * (size_t)n));
    size = host_of + n;
    for (int r = 0; r < n; r++) {
        int first = 0;
        while (all[first].host != all[r].host) {
            first++;
        }
        host_of[r] = first == r ? nhosts++ : host_of[first];
        size[host_of[r]]++;
    }
    if (nhosts < 2) {
        free(host_of);
        return ncclSuccess;
    }
    comm->hosts = (struct alg_hosts){.nhosts = nhosts, .widest = size[0],
                                     .narrowest = size[0], .host_of = host_of};
    for (int h = 1; h < nhosts; h++) {
        comm->hosts.widest = size[h] > comm->hosts.widest ? size[h] : comm->hosts.widest;
        comm->hosts.narrowest = size[h] < comm->hosts.narrowest ? size[h]
                                                                : comm->hosts.narrowest;
    }
    comm->hosts.block = alg_hosts_block(host_of, n, nhosts);
    if (!comm->chunk_bytes_set) {
        comm->chunk_bytes = SHIM_CHUNK_BYTES_ACROSS_HOSTS;
        comm->chunk_min_bytes = SHIM_CHUNK_MIN_ACROSS_HOSTS;
    }
    INFO(SHIM_INIT, "comm %p rank %d: %d ranks on %d hosts (%d to %d a host)", (void *)comm,
         comm->rank, n, nhosts, comm->hosts.narrowest, comm->hosts.widest);
    return ncclSuccess;
}

/* Every rank says which host it runs on (comm->hosts). If every rank runs on this host, they
 * map each other's shared memory: collective over the communicator; a rank that cannot share
 * makes them all go without, which is not an error. *peers_out: what the device team needs,
 * where they formed a team. */
static ncclResult_t
shim_connect_shm(struct ncclComm *comm, struct shim_backend_peers **peers_out)
{
    const int n = comm->nranks;
    const size_t slot_bytes = ((size_t)shim_env_int(SHIM_ENV_SHM_SLOT_BYTES) + 4095) & ~4095ul;
    struct shim_shm_hello me = {.host = shm_host_id(shim_env_str(SHIM_ENV_NCCL_HOSTID))};
    struct shim_shm_hello *all;
    struct shm_segment seg = {0};
    struct shm_team *team = NULL;
    char tag[48];
    ncclResult_t res;

    /* A slot must hold a 64-byte piece per rank (all-to-all, reduce-scatter, scatter). */
    const bool sharing = shim_env_int(SHIM_ENV_NCCL_SHM_DISABLE) == 0 &&
                         slot_bytes >= 64 * (size_t)n;
    if (n < 2) {
        return ncclSuccess;
    }
    snprintf(tag, sizeof(tag), "%016" PRIx64 "-r%d", comm->id_hash, comm->rank);
    shim_connect_hello_device(comm, &me);
    me.rank_leaders = shim_env_int(SHIM_ENV_RANK_LEADERS) != 0;
    if (sharing && shm_segment_create(tag, slot_bytes, &seg) == ncclSuccess) {
        snprintf(me.name, sizeof(me.name), "%s", seg.name);
    }
    SHIM_CHECK_GOTO(shim_calloc(&all, (size_t)n), res, out_seg);
    SHIM_CHECK_GOTO(shim_connect_allgather(comm, &me, all, sizeof(me)), res, out_all);
    SHIM_CHECK_GOTO(shim_connect_hosts(comm, all), res, out_all);
    if (!sharing) {
        res = ncclSuccess;
        goto out_all;
    }

    bool together = true;
    for (int r = 0; r < n; r++) {
        together &= all[r].host == me.host && all[r].name[0] != '\0';
    }
    char (*names)[SHM_NAME_MAX] = NULL;
    if (together && shim_calloc(&names, (size_t)n) == ncclSuccess) {
        for (int r = 0; r < n; r++) {
            memcpy(names[r], all[r].name, SHM_NAME_MAX);
            names[r][SHM_NAME_MAX - 1] = '\0';
        }
        if (shm_team_create(&seg, comm->rank, n, (const char (*)[SHM_NAME_MAX])names,
                            slot_bytes, &team) != ncclSuccess) {
            team = NULL;
        }
        free(names);
    }

    /* Use it only if every rank mapped every segment. */
    uint8_t *mine = NULL, *verdicts = NULL;
    SHIM_CHECK_GOTO(shim_calloc(&mine, 2 * (size_t)n + 2 + (size_t)n * n), res, out_team);
    verdicts = mine + n + 1;
    mine[0] = team != NULL;
    shim_connect_reach_row(comm, all, mine + 1);
    SHIM_CHECK_GOTO(shim_connect_allgather(comm, mine, verdicts, (size_t)n + 1), res, out_mine);
    uint8_t ok = 1;
    for (int r = 0; r < n; r++) {
        ok &= verdicts[(size_t)r * (n + 1)];
    }
    if (ok) {
        team->direct_bytes = (size_t)shim_env_int(SHIM_ENV_SHM_DIRECT_BYTES);
        team->oversubscribed = n > shm_cpus_available();
        comm->shm = team;
        comm->shm_colls = shim_connect_unfiltered_colls(comm);
        team = NULL;
        INFO(SHIM_INIT, "comm %p rank %d: all %d ranks on this host, collectives through "
             "shared memory (%zu-byte slots%s)", (void *)comm, comm->rank, n, slot_bytes,
             comm->shm->oversubscribed ? ", more ranks than CPUs" : "");
        shim_connect_devices(comm, all, verdicts, peers_out);
    } else {
        INFO(SHIM_INIT, "comm %p rank %d: ranks on more than one host (or no shared memory): "
             "UCX serves every collective", (void *)comm, comm->rank);
    }
    res = ncclSuccess;

out_mine:
    free(mine);
out_team:
    shm_team_destroy(team);
out_all:
    free(all);
out_seg:
    /* Everyone has mapped or given up: the name can go. */
    shm_segment_destroy(&seg);
    return res;
}

/* Defaults measured on this project's 2-core machines: shared memory about 1.5 us and 4 GB/s
 * a message stream, TCP loopback about 15 us and 1 GB/s; reductions about 3.4 GB/s. Between
 * hosts UCX takes TCP (or whatever network it has): TCP's figures unless the user says. */
struct alg_cost_params
shim_connect_cost_params(void)
{
    const char *tls = shim_env_str(SHIM_ENV_UCX_TLS);
    bool tcp_inside = !tp_tls_has_shm(tls) && tp_tls_has_tcp(tls);
    double alpha_us = shim_env_double(SHIM_ENV_ALPHA_US, tcp_inside ? 15.0 : 1.5);
    double beta_gbps = shim_env_double(SHIM_ENV_BETA_GBPS, tcp_inside ? 1.0 : 4.0);
    double gamma_gbps = shim_env_double(SHIM_ENV_GAMMA_GBPS, 3.4);
    double net_alpha_us = shim_env_double(SHIM_ENV_NET_ALPHA_US, 15.0);
    double net_beta_gbps = shim_env_double(SHIM_ENV_NET_BETA_GBPS, 1.0);

    return (struct alg_cost_params){
        .alpha = alpha_us * 1e-6, .beta = 1.0 / (beta_gbps * 1e9),
        .gamma = 1.0 / (gamma_gbps * 1e9), .alpha_net = net_alpha_us * 1e-6,
        .beta_net = 1.0 / (net_beta_gbps * 1e9)};
}

ncclResult_t
shim_connect_open(struct ncclComm *comm)
{
    return tp_worker_create(&comm->tp);
}

ncclResult_t
shim_connect_address(const struct ncclComm *comm, const void **addr_out, size_t *len_out)
{
    return tp_worker_address(comm->tp, addr_out, len_out);
}

ncclResult_t
shim_connect_peers(struct ncclComm *comm, const void *const *addrs, const size_t *lens)
{
    struct shim_backend_peers *peers = NULL;

    SHIM_CHECK(tp_worker_connect(comm->tp, comm->nranks, comm->rank, addrs, lens));
    ncclResult_t res = shim_connect_shm(comm, &peers);
    if (res == ncclSuccess) {
        shim_backend_connect(comm, peers);
    }
    shim_connect_peers_free(peers);
    return res;
}

void
shim_connect_suspend(struct ncclComm *comm)
{
    /* The shared-memory slots go once the peers read this rank's last chunk; a peer still in
     * the last operation (or gone) leaves them in place, which costs only memory. */
    if (comm->shm != NULL &&
        !shm_team_release_slots(comm->shm, (int)shim_env_int(SHIM_ENV_WAIT_MS))) {
        INFO(SHIM_INIT, "comm %p rank %d: the peers had not all read this rank's last "
             "shared-memory chunk: its slots stay", (void *)comm, comm->rank);
    }
}

void
shim_connect_close(struct ncclComm *comm, bool abort)
{
    shim_devexec_comm_free(comm, abort); /* before the segments its control blocks are in */
    shm_team_destroy(comm->shm);
    comm->shm = NULL;
    free((void *)comm->hosts.host_of);
    comm->hosts = (struct alg_hosts){0};
    if (comm->tp != NULL) {
        tp_worker_destroy(comm->tp);
        comm->tp = NULL;
    }
}
