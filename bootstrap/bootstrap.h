/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bootstrap: the unique id and the one rendezvous through the root that lets every rank learn
 * every other rank's transport address. After it, communicators talk over the transport only.
 *
 * The unique id (NCCL_UNIQUE_ID_BYTES) holds the root's listening socket address and a random
 * secret. ncclGetUniqueId starts the root: a thread that waits, with a deadline, for nranks
 * hellos carrying the secret, then sends every rank the table of all ranks' blobs. With
 * NCCL_COMM_ID=host:port the id is computed from that address (every rank computes the same
 * one) and rank 0 starts the root when it joins. NCCL_SOCKET_IFNAME picks the interface whose
 * address the id advertises. The root is root.h, the byte layouts of the id and the messages
 * wire.h, the sockets socket.h.
 */
#ifndef SHIM_BOOTSTRAP_H
#define SHIM_BOOTSTRAP_H

#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

/* Fills *id. Without NCCL_COMM_ID: binds an ephemeral port on the address of the interface
 * NCCL_SOCKET_IFNAME picks and starts a root thread on it, which serves one rendezvous and
 * exits (or gives up after NCCLSHIM_BOOTSTRAP_TIMEOUT seconds if it does not complete). With
 * NCCL_COMM_ID=host:port: encodes that address and a secret derived from the text, starts
 * nothing, and so returns the same id in every process. ncclInvalidUsage for a malformed
 * NCCL_COMM_ID or an NCCL_SOCKET_IFNAME matching no interface; ncclSystemError if the socket or
 * thread cannot be made. Layout: wire.h. */
ncclResult_t shim_bootstrap_get_unique_id(ncclUniqueId *id);

/* A fresh root in this process on the interface NCCL_SOCKET_IFNAME picks, whatever
 * NCCL_COMM_ID says (that address serves the world's communicator): ncclCommGetUniqueId's,
 * for ranks that join a communicator growing. */
ncclResult_t shim_bootstrap_fresh_id(ncclUniqueId *id);

/* As shim_bootstrap_get_unique_id, but always a fresh root in this process, whatever
 * NCCL_COMM_ID says: ncclCommInitAll's ranks all live here. The root listens on 127.0.0.1
 * (NCCL_SOCKET_IFNAME's choice only if loopback cannot be bound). */
ncclResult_t shim_bootstrap_private_id(ncclUniqueId *id);

/* A hash of the whole id, equal on every rank of a communicator: used to derive the
 * communicator's identity. For an id from NCCL_COMM_ID the resolved address is left out, as
 * hosts may resolve the name differently; such ids repeat from one communicator to the next,
 * which the table's session tells apart. ncclInvalidArgument (with a WARN) if the id is not
 * one of ours. */
ncclResult_t shim_bootstrap_id_hash(const ncclUniqueId *id, uint64_t *hash_out);

/* Every rank's blob, in rank order: blob i is data + offsets[i], lens[i] bytes long. session is
 * a random number the root drew for this rendezvous, equal on its ranks and different for the
 * next one: ids made from NCCL_COMM_ID repeat, so it is what tells two such communicators
 * apart. One allocation: shim_bootstrap_table_free frees the struct and the arrays. */
struct shim_bootstrap_table {
    int nranks;
    uint64_t session;
    size_t *offsets;
    size_t *lens;
    uint8_t *data;
};

/* Joins the rendezvous of `id` as `rank` of `nranks`, contributing `blob` (at most
 * SHIM_WIRE_MAX_BLOB = 64 KiB), and returns all the blobs. For an id from NCCL_COMM_ID, rank 0
 * first starts the root in this process, listening on that host:port. Ranks may come before
 * their root: refused connections are retried until the deadline.
 * Errors, each with a WARN naming the rank and the root's address:
 *   ncclInvalidArgument  at once, without touching the network: an id that is not ours, a rank
 *                        outside 0..nranks-1, a blob too big, timeout_ms <= 0;
 *   ncclInvalidUsage     the root refused: two ranks claimed one rank, or the ranks disagree on
 *                        nranks;
 *   ncclSystemError      no connection, or no reply, within timeout_ms; a socket call failed;
 *   ncclRemoteError      the root closed the connection or sent malformed bytes.
 * On success *table_out is the caller's to free with shim_bootstrap_table_free. */
ncclResult_t shim_bootstrap_exchange(const ncclUniqueId *id, int rank, int nranks,
                                     const void *blob, size_t len, int timeout_ms,
                                     struct shim_bootstrap_table **table_out);
void shim_bootstrap_table_free(struct shim_bootstrap_table *table);

#endif
