/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ranks of each host, for builders that keep traffic inside a host: args->hosts turned
 * around, members listed host by host (in rank order within a host). Without args->hosts
 * every rank is on one host.
 *
 *   host_of  = 0 1 0 1 1        (5 ranks on 2 hosts)
 *   members  = 0 2 | 1 3 4      first = 0 2 5
 */
#ifndef ALG_HOSTS_H
#define ALG_HOSTS_H

#include "alg.h"

/* Ints a map holds in itself: members, place and first of up to 64 ranks, so that a builder
 * allocates nothing for it on every call. */
#define ALG_HOST_MAP_INLINE (3 * 64 + 1)

struct alg_host_map {
    int nhosts;
    int *members; /* nranks ranks, host by host */
    int *first;   /* nhosts + 1 offsets into members */
    int *place;   /* per rank: its place among its host's ranks */
    const int *host_of; /* per rank: its host; NULL: all on host 0 */
    int host;     /* args->rank's host */
    int local;    /* args->rank's place among its host's ranks */
    int inline_ints[ALG_HOST_MAP_INLINE]; /* members, place, first when they fit: a map is
                                             filled and used in place, never copied */
};

/* The ranks in host order from `start`: start's host first, from start's place round, then
 * the hosts after it by number (round), each from place 0. alg_host_order gives the rank at
 * position p, alg_host_position a rank's position. Without hosts: start + p (mod n). A chain
 * or ring in this order crosses between hosts only H - 1 (H) times, wherever `start` is. */
int alg_host_order(const struct alg_host_map *map, int start, int p);
int alg_host_position(const struct alg_host_map *map, int start, int rank);

/* false, the schedule (if any) marked out of memory, if the map cannot be allocated. */
bool alg_host_map_init(struct alg_host_map *map, const struct alg_args *args,
                       struct alg_sched *sched);
void alg_host_map_free(struct alg_host_map *map);

static inline int
alg_host_size(const struct alg_host_map *map, int host)
{
    return map->first[host + 1] - map->first[host];
}

/* The rank at place `local` of host `host`. */
static inline int
alg_host_rank(const struct alg_host_map *map, int host, int local)
{
    return map->members[map->first[host] + local];
}

static inline int
alg_host_of(const struct alg_host_map *map, int rank)
{
    return map->host_of != NULL ? map->host_of[rank] : 0;
}

/* Whether host `host`'s ranks are consecutive, so that their blocks in rank order lie in one
 * range of a buffer. */
static inline bool
alg_host_consecutive(const struct alg_host_map *map, int host)
{
    for (int j = 1; j < alg_host_size(map, host); j++) {
        if (alg_host_rank(map, host, j) != alg_host_rank(map, host, 0) + j) {
            return false;
        }
    }
    return true;
}

/* Rank `rank`'s counterpart on `host`: the rank there at the same place, counted round when
 * that host has fewer ranks. On its own host, a rank is its own counterpart. */
static inline int
alg_host_counterpart(const struct alg_host_map *map, int rank, int host)
{
    return alg_host_rank(map, host, map->place[rank] % alg_host_size(map, host));
}

/* Sends `src` to each other rank of our host, in place order, each send after `dep`. */
void alg_host_send_to_mates(struct alg_sched *sched, const struct alg_host_map *map,
                            struct alg_range src, int dep);

/* The layout as a cost function sees it, alike on every rank (every rank must choose the
 * same row): hosts, the most and fewest ranks one has, and the blocks a rank of the emptiest
 * host moves across when every block crosses once to (or from) each other host. Without
 * args->hosts, one host of every rank. */
struct alg_host_shape {
    double nhosts, widest, narrowest, across;
};

static inline struct alg_host_shape
alg_host_shape(const struct alg_args *args)
{
    const double n = args->nranks;
    struct alg_host_shape shape = {1, n, n, 0};

    if (args->hosts != NULL) {
        shape.nhosts = args->hosts->nhosts;
        shape.widest = args->hosts->widest;
        shape.narrowest = args->hosts->narrowest;
    }
    const double taken = (n - shape.narrowest) / shape.narrowest;
    shape.across = taken > shape.nhosts - 1 ? taken : shape.nhosts - 1;
    return shape;
}

/* The ranks on `rank`'s host, itself included, alike on every rank. Without args->hosts, all. */
static inline int
alg_host_ranks_with(const struct alg_args *args, int rank)
{
    int m = 0;

    if (args->hosts == NULL) {
        return args->nranks;
    }
    for (int r = 0; r < args->nranks; r++) {
        m += args->hosts->host_of[r] == args->hosts->host_of[rank];
    }
    return m;
}

#endif
