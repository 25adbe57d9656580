/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Small TCP helpers for the bootstrap (bootstrap.c is the only caller): parsing "host:port",
 * choosing the interface whose address a unique id advertises (NCCL_SOCKET_IFNAME), and
 * listening, connecting, sending and receiving with a deadline.
 *
 * Two error conventions, on purpose. The configuration helpers (address parsing, interface
 * choice) see the user's mistake themselves, so they WARN and return an ncclResult_t. The I/O
 * helpers return 0 or an errno value, as pthreads does, because only the caller knows what it
 * was waiting for ("rank 3 of 4: no reply from bootstrap root ... within 5000 ms"); it writes
 * the WARN. Every socket is non-blocking and close-on-exec; every wait is a poll() bounded by
 * a deadline on CLOCK_MONOTONIC, in nanoseconds (base/clock.h).
 */
#ifndef SHIM_SOCKET_H
#define SHIM_SOCKET_H

#include <nccl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

/* An IPv4 or IPv6 socket address; sa.sa_family says which. */
union shim_sockaddr {
    struct sockaddr sa;
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
};

/* Room for "[ffff:...:ffff%ifname]:65535" and a NUL. */
#define SHIM_SOCKET_ADDR_STRLEN (INET6_ADDRSTRLEN + IF_NAMESIZE + 10)

/* "10.0.0.1:4567" or "[fe80::1%eth0]:4567"; "<unknown family N>" for anything else. */
void shim_socket_addr_str(const union shim_sockaddr *addr, char *buf, size_t len);
socklen_t shim_socket_addr_len(const union shim_sockaddr *addr);

/* Splits "1.2.3.4:5", "[::1]:5" or "name:5" into host and port without resolving anything.
 * The port must be 1..65535 and the host non-empty; an unbracketed host with a ':' is refused
 * (an IPv6 address needs brackets). False with *why_out set on malformed text. */
bool shim_socket_hostport_split(const char *text, char *host, size_t host_len,
                                uint16_t *port_out, const char **why_out);
/* Splits and resolves `text` (numeric first, then DNS) to its first IPv4 or IPv6 address.
 * `what` names the text's origin for the WARN ("NCCL_COMM_ID"). ncclInvalidUsage if the text
 * is malformed or the name does not resolve. */
ncclResult_t shim_socket_addr_parse(const char *text, const char *what,
                                    union shim_sockaddr *addr_out);

/* NCCL_SOCKET_IFNAME syntax: a comma-separated list of name prefixes ("eth,ib"); a leading '^'
 * selects the interfaces that match none of them ("^docker,lo"); '=' after the optional '^'
 * makes every entry an exact name ("=eth0", "^=docker0"). Empty entries are ignored. */
bool shim_socket_ifname_match(const char *spec, const char *ifname);

/* One interface address, as getifaddrs reports it. */
struct shim_ifaddr {
    char name[IF_NAMESIZE];
    union shim_sockaddr addr;
};

/* Which of the n candidates a unique id should advertise: the index, or -1 if none fits.
 * With a spec (NCCL_SOCKET_IFNAME), the first address of a matching interface, IPv4 before
 * IPv6. Without one (NULL or ""), the same over interfaces other than lo* and docker*, then
 * lo*, then docker*. IPv6 link-local addresses are never chosen: their scope means nothing on
 * another host. Pure: the caller lists only interfaces that are up. */
int shim_socket_ifaddr_choose(const struct shim_ifaddr *cands, int n, const char *spec);
/* Lists the interfaces that are up and chooses among them as above; WARNs with ncclInvalidUsage
 * naming the interfaces it saw when NCCL_SOCKET_IFNAME matches none. */
ncclResult_t shim_socket_pick_addr(const char *spec, union shim_sockaddr *addr_out,
                                   char ifname_out[IF_NAMESIZE]);

/* CLOCK_MONOTONIC in nanoseconds, and a deadline `ms` from now. */
int64_t shim_socket_deadline_ns(int64_t ms);

/* A non-blocking listening socket bound to addr (port 0: an ephemeral port). With reuse,
 * SO_REUSEADDR, so a fixed port (NCCL_COMM_ID) can be bound again while old connections on
 * it linger in TIME_WAIT. On success *fd_out is the caller's to close and *bound_out holds
 * the address with its actual port. Returns 0 or an errno value (EADDRINUSE, EADDRNOTAVAIL). */
int shim_socket_listen(const union shim_sockaddr *addr, bool reuse, int *fd_out,
                       union shim_sockaddr *bound_out);

/* Connects to addr by deadline_ns. Refusals and other transient failures (the root may start
 * after the ranks) are retried with a growing pause of up to 100 ms. Returns 0 with a
 * non-blocking *fd_out, or an errno value: at the deadline, the last transient error seen
 * (ECONNREFUSED, ...) or ETIMEDOUT if there was none; at once, any other failure. */
int shim_socket_connect(const union shim_sockaddr *addr, int64_t deadline_ns, int *fd_out);

/* Sends or receives exactly len bytes on a non-blocking socket by deadline_ns. Returns 0, or
 * ETIMEDOUT, or EPIPE when the peer closed the connection before all bytes went through, or
 * the errno of a failed call. send never raises SIGPIPE. */
int shim_socket_send_all(int fd, const void *buf, size_t len, int64_t deadline_ns);
int shim_socket_recv_all(int fd, void *buf, size_t len, int64_t deadline_ns);

/* Milliseconds from now to deadline_ns for poll(): rounded up, 0 once it passed. */
int shim_socket_poll_ms(int64_t deadline_ns);

#endif
