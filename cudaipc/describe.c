/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A rank's operation as a descriptor (internal.h): each buffer described so every GPU's leader
 * whose share touches it (cipc_touchers) can reach it, cheapest first. A leader in the rank's
 * own process uses its address as it is, where its device may touch it; for the leaders in
 * other processes:
 *   - none (every leader touching it is in this process): LOCAL;
 *   - device memory every leader's device reaches, from cudaMalloc, that its owner registered
 *     (ncclCommRegister) or a CUDA graph captured: the allocation's legacy IPC handle (made
 *     once per allocation, cached: it costs about 18 us);
 *   - such memory from a shareable cuMem allocation (ncclMemAlloc, PyTorch's expandable
 *     segments): the allocation's file descriptor, sent once on each leader's channel;
 *   - cudaMalloc memory nobody registered: staged on the device (stage.c). cuIpcOpenMemHandle
 *     makes freeing an allocation another process maps undefined, and PyTorch's
 *     empty_cache() frees such buffers without a word; only a registration promises
 *     otherwise;
 *   - anything else (managed or registered memory, a device some leader cannot reach, memory
 *     a leader of this process may not touch, a buffer across two cuMem allocations): staged
 *     through pinned shared host memory (stage.c).
 * Allocations are told apart by the driver's unique id, never by address: memory freed and
 * allocated again at the same address is a new allocation.
 */
#include <string.h>

#include "base/check.h"
#include "internal.h"
#include "tasks.h"

/* Whether the kernels of leader k, which runs in this process, may touch mem at ptr as it is.
 * Host memory a kernel reaches may be; device memory only of a device its process can map
 * (reach): of its own device, cudaMalloc memory of a device it reaches (peer access), cuMem
 * memory of another device only where its owner granted that device access (cuMemMap grants
 * none, and PyTorch's expandable segments grant their own device alone). */
bool
cipc_leader_touches_local(struct cipc_team *team, int k, const void *ptr,
                          const struct gpu_mem_info *mem)
{
    int leader_device = team->device_here[team->leaders[k]];
    unsigned long long flags = 0;

    if (mem->kind != GPU_MEM_DEVICE) {
        return true;
    }
    if (!team->reach[(size_t)team->leaders[k] * team->nranks + team->rank]) {
        return false;
    }
    if (mem->device == leader_device || mem->legacy_ipc) {
        return true;
    }
    CUmemLocation where = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = leader_device};
    return gpu_cu.cuMemGetAccess(&flags, &where, (CUdeviceptr)(uintptr_t)ptr) ==
               CUDA_SUCCESS &&
           flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* Which buffers of an operation a GPU's share touches (tasks.h), as a mask of leaders. */
enum cipc_which { CIPC_SEND_BUF, CIPC_RECV_BUF, CIPC_SCALAR_BUF };

/* The GPUs with a part of a reduce or broadcast (cipc_share_part), as a mask. */
static uint32_t
cipc_part_gpus(enum alg_coll coll, int g, int root_k)
{
    uint32_t parts = 0;

    for (int k = 0; k < g; k++) {
        int part, nparts;
        cipc_share_part(coll, k, g, root_k, &part, &nparts);
        parts |= part >= 0 ? 1u << k : 0;
    }
    return parts;
}

static uint32_t
cipc_touchers(const struct cipc_team *team, const struct cipc_op *op, enum cipc_which which,
              enum cipc_algo algo)
{
    const uint32_t all = (1u << team->nleaders) - 1;
    const int own = team->leader_of[team->rank];
    const uint32_t mine = own >= 0 ? 1u << own : 0;
    const int root_k = op->root >= 0 && op->root < team->nranks ? team->leader_of[op->root] : -1;
    const uint32_t root_gpu = root_k >= 0 ? 1u << root_k : 0;
    const bool input = which != CIPC_RECV_BUF;

    if (algo != CIPC_ALGO_DIRECT) {
        return all; /* a ring or tree: neighbours read both buffers (levels.h) */
    }
    switch (op->coll) {
    case ALG_COLL_ALLREDUCE:
        return all;
    case ALG_COLL_REDUCE:
        return cipc_part_gpus(op->coll, team->nleaders, root_k);
    case ALG_COLL_BROADCAST:
        return input            ? all
               : own == root_k ? root_gpu
                               : cipc_part_gpus(op->coll, team->nleaders, root_k);
    case ALG_COLL_REDUCESCATTER:
    case ALG_COLL_ALLGATHER:
    case ALG_COLL_ALLTOALL:
    case ALG_COLL_SCATTER:
        return input ? all : mine;
    case ALG_COLL_GATHER:
        return root_gpu;
    default: { /* SEND, RECV: the receiver's */
        int gpu = cipc_message_gpu(op->coll, team->rank, op->root, team->leader_of,
                                   team->nranks);
        return gpu >= 0 ? 1u << gpu : 0;
    }
    }
}

/* Fills buf for bytes at ptr, used by operation seq, for the leaders in `touchers` (a mask:
 * those whose share reads or writes it); *via_out says through which staging area a copy
 * reaches it, if only a copy can. kept: the caller pins what this exports for as long as the
 * memory may be used (a registration, a capture), so cudaMalloc memory may be mapped; else
 * only where it is registered already. */
ncclResult_t
cipc_describe(struct cipc_team *team, const void *ptr, const struct gpu_mem_info *mem,
              size_t bytes, uint32_t seq, bool kept, uint32_t touchers, struct cipc_buf *buf,
              uint8_t *via_out)
{
    uintptr_t p = (uintptr_t)ptr;

    memset(buf, 0, sizeof(*buf));
    buf->ptr = p;
    *via_out = CIPC_STAGE_NONE;
    if (ptr == NULL || bytes == 0 || touchers == 0) {
        buf->how = CIPC_BUF_NONE;
        return ncclSuccess;
    }
    /* What each leader that touches it needs: from the segment, since a leader's control
     * block may not be filled in yet. */
    bool remote = false, stage = false, other_device_here = false;
    for (int k = 0; k < team->nleaders; k++) {
        if (!(touchers & (1u << k))) {
            continue;
        }
        int lr = team->leaders[k];
        bool reachable = team->reach[(size_t)lr * team->nranks + team->rank];
        if (cipc_leader_here(team, k)) {
            stage |= !cipc_leader_touches_local(team, k, ptr, mem);
            other_device_here |= team->device_here[lr] != team->device;
        } else {
            remote = true;
            stage |= mem->kind != GPU_MEM_DEVICE || !reachable;
        }
    }
    if (!stage && !remote) {
        /* Every leader touching it is in this process: any address their kernels reach
         * serves as it is. */
        buf->how = CIPC_BUF_LOCAL;
        return ncclSuccess;
    }
    if (!stage) {
        if (mem->legacy_ipc && p + bytes <= mem->alloc_base + mem->alloc_size) {
            if (!kept && !cipc_export_pinned(team, mem->alloc_id, mem->alloc_base)) {
                /* Its owner may free it at any time: no mapping may outlive the call. A
                 * leader here on another device would not reach a staging area of this
                 * device's own (its access is this device's alone). */
                buf->how = CIPC_BUF_STAGED;
                *via_out = other_device_here ? CIPC_STAGE_HOST : CIPC_STAGE_DEVICE;
                return ncclSuccess;
            }
            buf->how = CIPC_BUF_LEGACY;
            buf->key = mem->alloc_id;
            buf->offset = p - mem->alloc_base;
            buf->size = mem->alloc_size;
            return cipc_export_legacy(team, mem, seq, &buf->handle);
        }
        uintptr_t base;
        size_t size;
        uint64_t id;
        /* One cuMem allocation's mapping, whole: else (several across the buffer, a pool's
         * allocation, an id the leaders know for another mapping) staged. */
        if (mem->fd_ipc && gpu_mem_mapping_holds(ptr, bytes, &base, &size, &id) &&
            !cipc_export_clash(team, id, base)) {
            buf->how = CIPC_BUF_CUMEM;
            buf->key = id;
            buf->offset = p - base;
            buf->size = size;
            return cipc_export_cumem(team, ptr, id, base, size, seq);
        }
    }
    buf->how = CIPC_BUF_STAGED;
    *via_out = CIPC_STAGE_HOST;
    return ncclSuccess;
}

/* Bytes of op's send and receive buffers on this rank (alg.h's layouts). */
void
cipc_op_bytes(const struct cipc_op *op, int nranks, size_t *send_out, size_t *recv_out)
{
    size_t block = op->count * kr_type_size(op->redop.type);
    size_t all = block * (size_t)nranks;

    *send_out = block;
    *recv_out = block;
    switch (op->coll) {
    case ALG_COLL_REDUCESCATTER:
    case ALG_COLL_ALLTOALL:
    case ALG_COLL_SCATTER:
        *send_out = all;
        break;
    default:
        break;
    }
    switch (op->coll) {
    case ALG_COLL_ALLGATHER:
    case ALG_COLL_ALLTOALL:
    case ALG_COLL_GATHER:
        *recv_out = all;
        break;
    default:
        break;
    }
    *send_out = op->send != NULL ? *send_out : 0;
    *recv_out = op->recv != NULL ? *recv_out : 0;
}

static void
cipc_desc_fill(struct cipc_team *team, const struct cipc_op *op, uint32_t seq,
               uint32_t group_last, struct cipc_desc *d)
{
    d->seq = seq;
    d->group_last = group_last;
    d->match = op->match;
    d->coll = (uint8_t)op->coll;
    d->algo = (uint8_t)cipc_team_algo(team, op->coll, op->count, op->redop.type);
    d->kind = (uint8_t)op->redop.kind;
    d->pre = op->redop.kind == KR_PREMULSUM;
    d->datatype = (int32_t)op->redop.type;
    d->root = op->root;
    d->count = op->count;
    d->divisor = op->redop.divisor;
    d->area = -1;
    memcpy(&d->scalar, op->redop.scalar, sizeof(d->scalar));
}

ncclResult_t
cipc_desc_make(struct cipc_team *team, const struct cipc_op *op, uint32_t seq,
               uint32_t group_last, bool kept, struct cipc_desc *d, uint8_t via_out[3])
{
    size_t send_bytes, recv_bytes;
    struct gpu_mem_info scalar_mem;

    memset(d, 0, sizeof(*d));
    cipc_desc_fill(team, op, seq, group_last, d);
    cipc_op_bytes(op, team->nranks, &send_bytes, &recv_bytes);
    SHIM_CHECK(cipc_describe(team, op->send, &op->send_mem, send_bytes, seq, kept,
                             cipc_touchers(team, op, CIPC_SEND_BUF, d->algo), &d->send,
                             &via_out[0]));
    SHIM_CHECK(cipc_describe(team, op->recv, &op->recv_mem, recv_bytes, seq, kept,
                             cipc_touchers(team, op, CIPC_RECV_BUF, d->algo), &d->recv,
                             &via_out[1]));
    gpu_mem_query(op->scalar_dev, &scalar_mem);
    return cipc_describe(team, op->scalar_dev, &scalar_mem, kr_type_size(op->redop.type), seq,
                         kept, cipc_touchers(team, op, CIPC_SCALAR_BUF, d->algo), &d->scalar_buf,
                         &via_out[2]);
}
