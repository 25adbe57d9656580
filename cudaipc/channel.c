/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The team's Unix socket (channel.h). Every socket is non-blocking except a sender's, whose
 * few small messages the kernel buffers at once.
 */
#include "channel.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/check.h"

/* An abstract socket address: sun_path starts with a NUL, then the name. */
static socklen_t
cipc_channel_addr(const char *name, struct sockaddr_un *addr)
{
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    size_t len = strnlen(name, CIPC_CHANNEL_NAME_MAX - 1);
    memcpy(addr->sun_path + 1, name, len);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + len);
}

ncclResult_t
cipc_channel_listen(char name_out[CIPC_CHANNEL_NAME_MAX], int *fd_out)
{
    struct sockaddr_un addr;
    uint64_t nonce = 0;

    if (getrandom(&nonce, sizeof(nonce), 0) != (ssize_t)sizeof(nonce)) {
        nonce = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)name_out;
    }
    snprintf(name_out, CIPC_CHANNEL_NAME_MAX, "ncclshim-cudaipc-%d-%016llx", (int)getpid(),
             (unsigned long long)nonce);
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        WARN("cudaipc: socket(AF_UNIX) failed: %s", strerror(errno));
        return ncclSystemError;
    }
    socklen_t len = cipc_channel_addr(name_out, &addr);
    if (bind(fd, (struct sockaddr *)&addr, len) != 0 || listen(fd, 256) != 0) {
        WARN("cudaipc: cannot listen on the abstract Unix socket @%s: %s", name_out,
             strerror(errno));
        close(fd);
        return ncclSystemError;
    }
    *fd_out = fd;
    return ncclSuccess;
}

int
cipc_channel_connect(const char *name, int *fd_out)
{
    struct sockaddr_un addr;
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        return errno;
    }
    socklen_t len = cipc_channel_addr(name, &addr);
    if (connect(fd, (struct sockaddr *)&addr, len) != 0) {
        int err = errno;
        close(fd);
        return err;
    }
    *fd_out = fd;
    return 0;
}

ncclResult_t
cipc_channel_send(int fd, const struct cipc_channel_msg *msg, int passed_fd)
{
    union {
        struct cmsghdr hdr;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec iov = {.iov_base = (void *)msg, .iov_len = sizeof(*msg)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                        .msg_controllen = sizeof(control.buf)};
    ssize_t sent;

    memset(&control, 0, sizeof(control));
    if (passed_fd >= 0) {
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &passed_fd, sizeof(int));
    } else {
        mh.msg_control = NULL;
        mh.msg_controllen = 0;
    }
    do {
        sent = sendmsg(fd, &mh, MSG_NOSIGNAL);
    } while (sent < 0 && errno == EINTR);
    if (sent != (ssize_t)sizeof(*msg)) {
        WARN("cudaipc: sending a message to the leader failed: %s",
             sent < 0 ? strerror(errno) : "short send");
        return errno == EPIPE || errno == ECONNRESET ? ncclRemoteError : ncclSystemError;
    }
    return ncclSuccess;
}

int
cipc_channel_accept(int listen_fd, int *conn_out)
{
    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
        return errno == EWOULDBLOCK ? EAGAIN : errno;
    }
    *conn_out = fd;
    return 0;
}

int
cipc_channel_recv(int fd, struct cipc_channel_msg *msg_out, int *passed_fd_out)
{
    union {
        struct cmsghdr hdr;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct iovec iov = {.iov_base = msg_out, .iov_len = sizeof(*msg_out)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                        .msg_controllen = sizeof(control.buf)};
    ssize_t got;

    do {
        got = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
        return errno == EWOULDBLOCK ? EAGAIN : errno;
    }
    if (got == 0) {
        return ENOTCONN;
    }
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    if (got == (ssize_t)sizeof(*msg_out) && cm == NULL) {
        *passed_fd_out = -1;
        return 0;
    }
    if (got != (ssize_t)sizeof(*msg_out) || cm == NULL || cm->cmsg_type != SCM_RIGHTS ||
        cm->cmsg_len != CMSG_LEN(sizeof(int))) {
        if (cm != NULL && cm->cmsg_type == SCM_RIGHTS) {
            int stray;
            memcpy(&stray, CMSG_DATA(cm), sizeof(int));
            close(stray);
        }
        return EPROTO;
    }
    memcpy(passed_fd_out, CMSG_DATA(cm), sizeof(int));
    return 0;
}
