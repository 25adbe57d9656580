/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ranks of each host (hosts.h).
 */
#include "hosts.h"

#include <stdlib.h>
#include <string.h>

bool
alg_host_map_init(struct alg_host_map *map, const struct alg_args *args,
                  struct alg_sched *sched)
{
    const int n = args->nranks;
    const int nhosts = args->hosts != NULL ? args->hosts->nhosts : 1;

    map->nhosts = nhosts;
    map->host_of = args->hosts != NULL ? args->hosts->host_of : NULL;
    if (2 * (size_t)n + (size_t)nhosts + 1 <= ALG_HOST_MAP_INLINE) {
        map->members = map->inline_ints;
        map->first = map->inline_ints + 2 * n;
        memset(map->first, 0, ((size_t)nhosts + 1) * sizeof(int));
    } else {
        map->members = malloc(2 * (size_t)n * sizeof(int));
        map->first = calloc((size_t)nhosts + 1, sizeof(int));
    }
    if (map->members == NULL || map->first == NULL) {
        alg_host_map_free(map);
        if (sched != NULL) {
            sched->out_of_memory = true;
        }
        return false;
    }
    /* Count each host's ranks, turn counts into offsets, then place the ranks in order. */
    for (int r = 0; r < n; r++) {
        map->first[alg_host_of(map, r) + 1]++;
    }
    for (int h = 0; h < nhosts; h++) {
        map->first[h + 1] += map->first[h];
    }
    for (int h = nhosts; h > 0; h--) {
        map->first[h] = map->first[h - 1];
    }
    for (int r = 0; r < n; r++) {
        map->members[map->first[alg_host_of(map, r) + 1]++] = r;
    }
    map->place = map->members + n;
    for (int h = 0; h < nhosts; h++) {
        for (int j = 0; j < alg_host_size(map, h); j++) {
            map->place[alg_host_rank(map, h, j)] = j;
        }
    }
    map->host = alg_host_of(map, args->rank);
    map->local = map->place[args->rank];
    return true;
}

int
alg_host_order(const struct alg_host_map *map, int start, int p)
{
    const int home = alg_host_of(map, start), m = alg_host_size(map, home);

    if (p < m) {
        return alg_host_rank(map, home, (map->place[start] + p) % m);
    }
    p -= m;
    for (int k = 1; k < map->nhosts; k++) {
        const int host = (home + k) % map->nhosts;
        if (p < alg_host_size(map, host)) {
            return alg_host_rank(map, host, p);
        }
        p -= alg_host_size(map, host);
    }
    return -1; /* p out of range */
}

int
alg_host_position(const struct alg_host_map *map, int start, int rank)
{
    const int home = alg_host_of(map, start), m = alg_host_size(map, home);
    const int host = alg_host_of(map, rank);

    if (host == home) {
        return alg_mod(map->place[rank] - map->place[start], m);
    }
    int p = m;
    for (int h = (home + 1) % map->nhosts; h != host; h = (h + 1) % map->nhosts) {
        p += alg_host_size(map, h);
    }
    return p + map->place[rank];
}

void
alg_host_send_to_mates(struct alg_sched *sched, const struct alg_host_map *map,
                       struct alg_range src, int dep)
{
    for (int j = 0; j < alg_host_size(map, map->host); j++) {
        if (j != map->local) {
            alg_send(sched, alg_host_rank(map, map->host, j), src, dep, -1);
        }
    }
}

void
alg_host_map_free(struct alg_host_map *map)
{
    if (map->members != map->inline_ints) {
        free(map->members);
        free(map->first);
    }
    map->members = map->first = map->place = NULL;
}

int
alg_hosts_block(const int *host_of, int nranks, int nhosts)
{
    const int block = nhosts > 0 ? nranks / nhosts : 0;

    if (block == 0 || block * nhosts != nranks) {
        return 0;
    }
    for (int r = 0; r < nranks; r++) {
        if (host_of[r] != r / block) {
            return 0;
        }
    }
    return block;
}
