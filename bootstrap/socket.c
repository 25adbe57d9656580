/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TCP helpers for the bootstrap: "host:port" parsing, NCCL_SOCKET_IFNAME matching and the
 * interface choice, and listen/connect/send/recv bounded by a deadline. bootstrap.c is the only
 * caller. The parsing and matching functions are pure so the unit tests can cover them without
 * a network; the I/O functions return errno values for the caller to explain (see socket.h).
 */
#include "socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/debug.h"

/* The pause between connection attempts doubles from 1 ms up to this. */
#define SHIM_SOCKET_RETRY_MAX_NS (100 * 1000 * 1000LL)

void
shim_socket_addr_str(const union shim_sockaddr *addr, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN];

    if (addr->sa.sa_family == AF_INET) {
        inet_ntop(AF_INET, &addr->in4.sin_addr, host, sizeof(host));
        snprintf(buf, len, "%s:%u", host, (unsigned)ntohs(addr->in4.sin_port));
    } else if (addr->sa.sa_family == AF_INET6) {
        char scope[IF_NAMESIZE + 2] = "";
        inet_ntop(AF_INET6, &addr->in6.sin6_addr, host, sizeof(host));
        if (addr->in6.sin6_scope_id != 0) {
            char name[IF_NAMESIZE];
            if (if_indextoname(addr->in6.sin6_scope_id, name) != NULL) {
                snprintf(scope, sizeof(scope), "%%%s", name);
            } else {
                snprintf(scope, sizeof(scope), "%%%u", (unsigned)addr->in6.sin6_scope_id);
            }
        }
        snprintf(buf, len, "[%s%s]:%u", host, scope, (unsigned)ntohs(addr->in6.sin6_port));
    } else {
        snprintf(buf, len, "<unknown family %d>", (int)addr->sa.sa_family);
    }
}

socklen_t
shim_socket_addr_len(const union shim_sockaddr *addr)
{
    return addr->sa.sa_family == AF_INET6 ? sizeof(addr->in6) : sizeof(addr->in4);
}

bool
shim_socket_hostport_split(const char *text, char *host, size_t host_len, uint16_t *port_out,
                           const char **why_out)
{
    const char *host_start, *host_end, *port_text;

    if (text == NULL || text[0] == '\0') {
        *why_out = "it is empty";
        return false;
    }
    if (text[0] == '[') {
        host_start = text + 1;
        host_end = strchr(host_start, ']');
        if (host_end == NULL) {
            *why_out = "'[' without a closing ']'";
            return false;
        }
        if (host_end[1] != ':') {
            *why_out = "no ':port' after the bracketed address";
            return false;
        }
        port_text = host_end + 2;
    } else {
        host_start = text;
        host_end = strrchr(text, ':');
        if (host_end == NULL) {
            *why_out = "no ':port'";
            return false;
        }
        if (memchr(text, ':', (size_t)(host_end - text)) != NULL) {
            *why_out = "an IPv6 address must be written in brackets, as [addr]:port";
            return false;
        }
        port_text = host_end + 1;
    }
    if (host_end == host_start) {
        *why_out = "the host is empty";
        return false;
    }
    if ((size_t)(host_end - host_start) >= host_len) {
        *why_out = "the host name is too long";
        return false;
    }

    /* Digits only: strtoul would accept a sign, spaces and hex. */
    unsigned long port = 0;
    if (port_text[0] == '\0') {
        *why_out = "the port is empty";
        return false;
    }
    for (const char *p = port_text; *p != '\0'; p++) {
        if (*p < '0' || *p > '9' || port > 65535) {
            *why_out = "the port is not a number from 1 to 65535";
            return false;
        }
        port = port * 10 + (unsigned long)(*p - '0');
    }
    if (port == 0 || port > 65535) {
        *why_out = "the port is not a number from 1 to 65535";
        return false;
    }
    memcpy(host, host_start, (size_t)(host_end - host_start));
    host[host_end - host_start] = '\0';
    *port_out = (uint16_t)port;
    return true;
}

ncclResult_t
shim_socket_addr_parse(const char *text, const char *what, union shim_sockaddr *addr_out)
{
    char host[NI_MAXHOST];
    uint16_t port;
    const char *why;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC};
    struct addrinfo *list, *ai;

    if (!shim_socket_hostport_split(text, host, sizeof(host), &port, &why)) {
        WARN("%s=\"%s\" is not host:port, [ipv6]:port or name:port: %s", what,
             text != NULL ? text : "", why);
        return ncclInvalidUsage;
    }
    int rc = getaddrinfo(host, NULL, &hints, &list);
    if (rc != 0) {
        WARN("%s=\"%s\": cannot resolve \"%s\": %s", what, text, host,
             rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        return ncclInvalidUsage;
    }
    for (ai = list; ai != NULL; ai = ai->ai_next) {
        if (ai->ai_family == AF_INET || ai->ai_family == AF_INET6) {
            break;
        }
    }
    if (ai == NULL) {
        freeaddrinfo(list);
        WARN("%s=\"%s\": \"%s\" has no IPv4 or IPv6 address", what, text, host);
        return ncclInvalidUsage;
    }
    union shim_sockaddr addr;
    memset(&addr, 0, sizeof(addr));
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(list);
    if (addr.sa.sa_family == AF_INET) {
        addr.in4.sin_port = htons(port);
    } else {
        addr.in6.sin6_port = htons(port);
    }
    *addr_out = addr;
    return ncclSuccess;
}

bool
shim_socket_ifname_match(const char *spec, const char *ifname)
{
    bool exclude = false, exact = false, matched = false;
    const char *p = spec != NULL ? spec : "";
    size_t name_len = strlen(ifname);

    if (*p == '^') {
        exclude = true;
        p++;
    }
    if (*p == '=') {
        exact = true;
        p++;
    }
    while (*p != '\0' && !matched) {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        /* An empty entry would be a prefix of every name: skip it, as an empty list item. */
        if (len > 0 && strncmp(ifname, p, len) == 0 && (!exact || name_len == len)) {
            matched = true;
        }
        p += len;
        if (*p == ',') {
            p++;
        }
    }
    return exclude ? !matched : matched;
}

static bool
shim_socket_ifaddr_usable(const struct shim_ifaddr *cand, int family)
{
    if (cand->addr.sa.sa_family != family) {
        return false;
    }
    return family != AF_INET6 || !IN6_IS_ADDR_LINKLOCAL(&cand->addr.in6.sin6_addr);
}

/* The default tiers: 0 = neither lo* nor docker*, 1 = lo*, 2 = docker*. */
static int
shim_socket_default_tier(const char *ifname)
{
    if (strncmp(ifname, "lo", 2) == 0) {
        return 1;
    }
    return strncmp(ifname, "docker", 6) == 0 ? 2 : 0;
}

int
shim_socket_ifaddr_choose(const struct shim_ifaddr *cands, int n, const char *spec)
{
    static const int families[2] = {AF_INET, AF_INET6};
    bool have_spec = spec != NULL && spec[0] != '\0';
    int ntiers = have_spec ? 1 : 3;

    for (int tier = 0; tier < ntiers; tier++) {
        for (int f = 0; f < 2; f++) {
            for (int i = 0; i < n; i++) {
                bool in_tier = have_spec ? shim_socket_ifname_match(spec, cands[i].name)
                                         : shim_socket_default_tier(cands[i].name) == tier;
                if (in_tier && shim_socket_ifaddr_usable(&cands[i], families[f])) {
                    return i;
                }
            }
        }
    }
    return -1;
}

ncclResult_t
shim_socket_pick_addr(const char *spec, union shim_sockaddr *addr_out,
                      char ifname_out[IF_NAMESIZE])
{
    struct ifaddrs *list;
    struct shim_ifaddr *cands;
    int n = 0, cap = 0;

    if (getifaddrs(&list) != 0) {
        WARN("getifaddrs failed: %s", strerror(errno));
        return ncclSystemError;
    }
    for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
        cap++;
    }
    cands = calloc(cap > 0 ? (size_t)cap : 1, sizeof(*cands));
    if (cands == NULL) {
        freeifaddrs(list);
        WARN("out of memory listing %d interface addresses", cap);
        return ncclSystemError;
    }
    for (struct ifaddrs *ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
        if (ifa->ifa_addr == NULL || !(ifa->ifa_flags & IFF_UP) ||
            (ifa->ifa_addr->sa_family != AF_INET && ifa->ifa_addr->sa_family != AF_INET6)) {
            continue;
        }
        snprintf(cands[n].name, sizeof(cands[n].name), "%s", ifa->ifa_name);
        memcpy(&cands[n].addr, ifa->ifa_addr,
               ifa->ifa_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in)
                                                   : sizeof(struct sockaddr_in6));
        n++;
    }
    freeifaddrs(list);

    int pick = shim_socket_ifaddr_choose(cands, n, spec);
    if (pick < 0) {
        char seen[256] = "";
        size_t used = 0;
        for (int i = 0; i < n && used < sizeof(seen); i++) {
            used += (size_t)snprintf(seen + used, sizeof(seen) - used, "%s%s", i ? ", " : "",
                                     cands[i].name);
        }
        free(cands);
        if (spec != NULL && spec[0] != '\0') {
            WARN("NCCL_SOCKET_IFNAME=%s matches no interface that is up with a usable IPv4 or "
                 "IPv6 address (addresses seen on: %s)", spec, n > 0 ? seen : "none");
            return ncclInvalidUsage;
        }
        WARN("no network interface is up with a usable IPv4 or IPv6 address (seen: %s)",
             n > 0 ? seen : "none");
        return ncclSystemError;
    }
    *addr_out = cands[pick].addr;
    snprintf(ifname_out, IF_NAMESIZE, "%s", cands[pick].name);
    free(cands);
    return ncclSuccess;
}

int64_t
shim_socket_deadline_ns(int64_t ms)
{
    return shim_clock_ns() + ms * 1000000LL;
}

int
shim_socket_poll_ms(int64_t deadline_ns)
{
    int64_t left = deadline_ns - shim_clock_ns();
    if (left <= 0) {
        return 0;
    }
    int64_t ms = (left + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

int
shim_socket_listen(const union shim_sockaddr *addr, bool reuse, int *fd_out,
                   union shim_sockaddr *bound_out)
{
    int one = 1, err;
    union shim_sockaddr bound;
    socklen_t bound_len = sizeof(bound);

    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return errno;
    }
    if ((reuse && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) ||
        bind(fd, &addr->sa, shim_socket_addr_len(addr)) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, &bound.sa, &bound_len) != 0) {
        err = errno;
        close(fd);
        return err;
    }
    *fd_out = fd;
    *bound_out = bound;
    return 0;
}

/* Failures worth another attempt: nobody listening yet, or a network still coming up. */
static bool
shim_socket_connect_transient(int err)
{
    switch (err) {
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case ETIMEDOUT:
    case EAGAIN:
    case EINTR:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EHOSTDOWN:
    case ENETDOWN:
        return true;
    default:
        return false;
    }
}

/* One attempt: 0 and a connected fd, or an errno value (ETIMEDOUT if the deadline came). */
static int
shim_socket_connect_once(const union shim_sockaddr *addr, int64_t deadline_ns, int *fd_out)
{
    int err = 0;
    socklen_t err_len = sizeof(err);

    int fd = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return errno;
    }
    if (connect(fd, &addr->sa, shim_socket_addr_len(addr)) != 0) {
        if (errno != EINPROGRESS) {
            err = errno;
            close(fd);
            return err;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int rc;
        do {
            rc = poll(&pfd, 1, shim_socket_poll_ms(deadline_ns));
        } while (rc < 0 && errno == EINTR);
        if (rc <= 0) {
            err = rc == 0 ? ETIMEDOUT : errno;
            close(fd);
            return err;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) {
            err = errno;
        }
        if (err != 0) {
            close(fd);
            return err;
        }
    }
    /* Retrying a local port with nobody on it can end in TCP's simultaneous open with
     * ourselves (the kernel picked the same port as our source): that is a refusal too. */
    union shim_sockaddr self, peer;
    socklen_t self_len = sizeof(self), peer_len = sizeof(peer);
    if (getsockname(fd, &self.sa, &self_len) == 0 && getpeername(fd, &peer.sa, &peer_len) == 0 &&
        self_len == peer_len && memcmp(&self, &peer, self_len) == 0) {
        close(fd);
        return ECONNREFUSED;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* latency only: no check */
    *fd_out = fd;
    return 0;
}

int
shim_socket_connect(const union shim_sockaddr *addr, int64_t deadline_ns, int *fd_out)
{
    int64_t pause_ns = 1000 * 1000;
    int last = 0;

    for (;;) {
        int err = shim_socket_connect_once(addr, deadline_ns, fd_out);
        if (err == 0 || !shim_socket_connect_transient(err)) {
            return err;
        }
        if (err != ETIMEDOUT || last == 0) {
            last = err; /* keep "refused" over the deadline's own ETIMEDOUT */
        }
        int64_t left = deadline_ns - shim_clock_ns();
        if (left <= 0) {
            return last;
        }
        int64_t nap = pause_ns < left ? pause_ns : left;
        struct timespec ts = {.tv_sec = nap / 1000000000LL, .tv_nsec = nap % 1000000000LL};
        nanosleep(&ts, NULL);
        pause_ns = pause_ns * 2 < SHIM_SOCKET_RETRY_MAX_NS ? pause_ns * 2
                                                           : SHIM_SOCKET_RETRY_MAX_NS;
    }
}

/* Waits until fd is ready for `events` or the deadline passes: 0, ETIMEDOUT or an errno. */
static int
shim_socket_wait(int fd, short events, int64_t deadline_ns)
{
    struct pollfd pfd = {.fd = fd, .events = events};

    for (;;) {
        int rc = poll(&pfd, 1, shim_socket_poll_ms(deadline_ns));
        if (rc > 0) {
            return 0; /* readiness or an error: the next call says which */
        }
        if (rc == 0) {
            return ETIMEDOUT;
        }
        if (errno != EINTR) {
            return errno;
        }
    }
}

int
shim_socket_send_all(int fd, const void *buf, size_t len, int64_t deadline_ns)
{
    const uint8_t *p = buf;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int err = shim_socket_wait(fd, POLLOUT, deadline_ns);
            if (err != 0) {
                return err;
            }
        } else if (errno != EINTR) {
            return errno == ECONNRESET ? EPIPE : errno;
        }
    }
    return 0;
}

int
shim_socket_recv_all(int fd, void *buf, size_t len, int64_t deadline_ns)
{
    uint8_t *p = buf;

    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        } else if (n == 0) {
            return EPIPE;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            int err = shim_socket_wait(fd, POLLIN, deadline_ns);
            if (err != 0) {
                return err;
            }
        } else if (errno != EINTR) {
            return errno == ECONNRESET ? EPIPE : errno;
        }
    }
    return 0;
}
