/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Message tags. Every message carries who sent it, for which communicator and operation, and
 * its position among the messages that rank sends to the same peer in that operation, so a
 * receive matches exactly one message whatever the arrival order, and concurrent operations
 * or communicators can never mismatch:
 *
 *   63    58 57  56 55            36 35            20 19                0
 *   | comm | kind |  source rank   |  sequence      |  message index    |
 *
 * Collectives number themselves per communicator (every rank calls them in the same order).
 * ncclSend/ncclRecv match in order per pair of ranks, so they use their own kind and a
 * sequence counted per peer and direction. Communicator management (split, shrink) counts
 * per peer and direction as well, in a kind of its own, because only some ranks may take
 * part (shrink) and the others' collective numbering must not move. The sequence and index wrap (2^16
 * operations, 2^20 messages per pair and operation); both far exceed how far ranks can drift
 * apart, since every operation waits on its peers.
 */
#ifndef SHIM_TAG_H
#define SHIM_TAG_H

#include <stdint.h>

#define SHIM_TAG_RANK_BITS 20
#define SHIM_TAG_SEQ_BITS 16
#define SHIM_TAG_INDEX_BITS 20
#define SHIM_TAG_MAX_RANKS (1 << SHIM_TAG_RANK_BITS)

enum shim_tag_kind {
    SHIM_TAG_COLLECTIVE = 0,
    SHIM_TAG_P2P = 1,
    SHIM_TAG_MANAGEMENT = 2,
};

static inline uint64_t
shim_tag_make(uint8_t comm_bits, enum shim_tag_kind kind, int src_rank, uint32_t seq,
              uint32_t index)
{
    return ((uint64_t)(comm_bits >> 2) << 58) | ((uint64_t)kind << 56) |
           (((uint64_t)src_rank & ((1u << SHIM_TAG_RANK_BITS) - 1)) << 36) |
           (((uint64_t)seq & ((1u << SHIM_TAG_SEQ_BITS) - 1)) << 20) |
           ((uint64_t)index & ((1u << SHIM_TAG_INDEX_BITS) - 1));
}

#endif
