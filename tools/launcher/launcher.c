/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclshim-launch: starts N local ranks of any program, torchrun-style, and watches them.
 *
 *     ncclshim-launch -n N [-t TIMEOUT] [-k GRACE] [--] program [args...]
 *
 * Every rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
 * MASTER_PORT as torchrun sets them, and NCCL_COMM_ID=127.0.0.1:PORT (unless the user set
 * one) so that every rank's ncclGetUniqueId returns the same id; PORT is not MASTER_PORT,
 * which a torch program binds for its own store. Each rank runs in a process
 * group of its own, so that one kill reaches whatever it started. The launcher ends every
 * rank (SIGTERM, then SIGKILL after GRACE seconds) when the timeout expires (exit 124, as
 * timeout(1)), or as soon as one rank exits non-zero or dies from a signal (the launcher
 * exits with that status, or 128 + the signal). SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to
 * the launcher are forwarded to every rank. It exits 0 only if every rank exited 0.
 *
 * Called by people, by `make run` and by test/mp/run.sh. It does not link the library.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LAUNCH_NAME "ncclshim-launch"
#define LAUNCH_MAX_RANKS 4096
#define LAUNCH_DEFAULT_GRACE 5.0
#define LAUNCH_EXIT_TIMEOUT 124 /* as timeout(1) */
#define LAUNCH_EXIT_USAGE 125   /* as timeout(1): the launcher itself failed */

struct launch_rank {
    pid_t pid;    /* also its process group id */
    bool running;
};

struct launch_state {
    int nranks;
    struct launch_rank *ranks;
    int nrunning;
    double timeout;       /* -t, seconds; 0: none */
    double deadline;      /* end of the run, CLOCK_MONOTONIC seconds; 0: none */
    double kill_deadline; /* when SIGTERMed ranks get SIGKILL; 0: not stopping */
    double grace;
    int exit_code;        /* decided by the first event that stops the run; -1: none yet */
};

static void
launch_usage(FILE *out)
{
    fprintf(out,
        "usage: " LAUNCH_NAME " -n N [-t TIMEOUT] [-k GRACE] [--] program [args...]\n"
        "\n"
        "Starts N local ranks of program, each in its own process group, with RANK,\n"
        "WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT and\n"
        "NCCL_COMM_ID=127.0.0.1:PORT (an NCCL_COMM_ID already set is kept) in their\n"
        "environment. Ranks share the launcher's stdout and stderr; rank 0 also gets its\n"
        "stdin unless that is a terminal.\n"
        "\n"
        "  -n, --nranks N       number of ranks to start (1..%d)\n"
        "  -t, --timeout T      end every rank after T seconds (suffix s, m or h; 0: never;\n"
        "                       default never) and exit %d\n"
        "  -k, --kill-after G   SIGKILL ranks still running G seconds after SIGTERM\n"
        "                       (default %g)\n"
        "  -h, --help           print this help\n"
        "\n"
        "When a rank exits non-zero or dies from a signal, the others get SIGTERM and the\n"
        "launcher exits with that rank's status (128 + signal for a signal). SIGINT, SIGTERM,\n"
        "SIGHUP and SIGQUIT are forwarded to every rank. Exit 0 only if every rank exits 0.\n",
        LAUNCH_MAX_RANKS, LAUNCH_EXIT_TIMEOUT, LAUNCH_DEFAULT_GRACE);
}

static double
launch_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Parses "12", "1.5", "30s", "2m", "1h" as timeout(1) does (no 'd'). */
static bool
launch_parse_seconds(const char *text, double *seconds_out)
{
    char *end;
    double value;

    errno = 0;
    value = strtod(text, &end);
    if (errno != 0 || end == text || !isfinite(value) || value < 0)
        return false;
    switch (*end) {
    case '\0':
    case 's':
        break;
    case 'm':
        value *= 60;
        break;
    case 'h':
        value *= 3600;
        break;
    default:
        return false;
    }
    if (*end != '\0' && end[1] != '\0')
        return false;
    *seconds_out = value;
    return true;
}

/* The kernel's ephemeral port range: where bind(0) and connect() pick ports themselves. */
static void
launch_ephemeral_range(int *low_out, int *high_out)
{
    FILE *file = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

    *low_out = 32768; /* Linux's default */
    *high_out = 60999;
    if (file != NULL) {
        if (fscanf(file, "%d %d", low_out, high_out) != 2) {
            *low_out = 32768;
            *high_out = 60999;
        }
        fclose(file);
    }
}

/* Binds a socket to 127.0.0.1:port (0: the kernel's choice) and returns the port it got, or
 * -1; the socket is closed again, leaving the port free for a rank to bind. */
static int
launch_probe_port(int port)
{
    struct sockaddr_in addr;
    socklen_t len = sizeof(addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int got = -1;

    if (fd < 0) {
        return -1;
    }
    memset(&addr, 0, sizeof(addr));
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons((uint16_t)port);
    if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0 &&
        getsockname(fd, (struct sockaddr *)&addr, &len) == 0) {
        got = ntohs(addr.sin_port);
    }
    close(fd);
    return got;
}

/*
 * A free port on 127.0.0.1 for the ranks to bind later. Taken below the kernel's ephemeral
 * range: a port bind(0) hands out is free for the kernel to hand out again, as the source
 * port of any connection or to any other bind(0) (a bootstrap root, a UCX listener of a rank
 * of this very job), before rank 0 binds it; below the range only a process that names the
 * port can take it. Random ports are probed until one binds; the kernel's choice is the
 * fallback when the range leaves no room below it.
 */
static int
launch_free_port(int *port_out)
{
    int low, high, port = -1;
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL) ^ (unsigned)(uintptr_t)port_out;

    launch_ephemeral_range(&low, &high);
    int base = low > 12000 ? 10000 : 1024;
    for (int tries = 0; tries < 100 && port < 0 && low - base > 1000; tries++) {
        port = launch_probe_port(base + (int)(rand_r(&seed) % (unsigned)(low - base)));
    }
    if (port < 0) {
        port = launch_probe_port(0);
    }
    if (port < 0) {
        fprintf(stderr, LAUNCH_NAME ": cannot get a free port on 127.0.0.1: %s\n",
                strerror(errno));
        return -1;
    }
    *port_out = port;
    return 0;
}

static void
launch_setenv_int(const char *name, int value)
{
    char text[16];

    snprintf(text, sizeof(text), "%d", value);
    setenv(name, text, 1);
}

/*
 * In the child, between fork and exec: own process group, environment, signals back to
 * their defaults, death with the launcher. Never returns.
 */
static void
launch_child_exec(int rank, int nranks, int comm_port, int master_port, pid_t parent,
                  const sigset_t *old_mask, char **argv)
{
    char text[64];
    int fd;

    setpgid(0, 0);
    /* If the launcher is SIGKILLed, take the rank down with it instead of leaving it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(LAUNCH_EXIT_USAGE);

    launch_setenv_int("RANK", rank);
    launch_setenv_int("WORLD_SIZE", nranks);
    launch_setenv_int("LOCAL_RANK", rank);
    launch_setenv_int("LOCAL_WORLD_SIZE", nranks);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    launch_setenv_int("MASTER_PORT", master_port);
    snprintf(text, sizeof(text), "127.0.0.1:%d", comm_port);
    setenv("NCCL_COMM_ID", text, 0);

    /* A process group that is not in the foreground must not read the terminal. */
    if (rank != 0 || isatty(STDIN_FILENO)) {
        fd = open("/dev/null", O_RDONLY);
        if (fd >= 0) {
            dup2(fd, STDIN_FILENO);
            if (fd != STDIN_FILENO)
                close(fd);
        }
    }

    /* Whatever the launcher inherited (a shell ignores SIGINT for `&` jobs), the signals it
     * forwards must reach the rank. */
    signal(SIGCHLD, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGQUIT, SIG_DFL);
    sigprocmask(SIG_SETMASK, old_mask, NULL);
    execvp(argv[0], argv);
    fprintf(stderr, LAUNCH_NAME ": rank %d: cannot run '%s': %s\n", rank, argv[0],
            strerror(errno));
    _exit(errno == ENOENT ? 127 : 126);
}

/* Sends sig to the process group of every rank still running. */
static void
launch_signal_all(struct launch_state *st, int sig)
{
    for (int r = 0; r < st->nranks; r++) {
        if (st->ranks[r].running && kill(-st->ranks[r].pid, sig) != 0 && errno == ESRCH)
            kill(st->ranks[r].pid, sig); /* the group is gone but not yet reaped */
    }
}

/* Lists the ranks still running, "1 2 5", into buf. */
static void
launch_running_list(const struct launch_state *st, char *buf, size_t size)
{
    size_t len = 0;

    buf[0] = '\0';
    for (int r = 0; r < st->nranks && len + 1 < size; r++) {
        if (st->ranks[r].running)
            len += (size_t)snprintf(buf + len, size - len, "%s%d", len ? " " : "", r);
    }
    if (len >= size && size > 4)
        strcpy(buf + size - 4, "...");
}

/* Begins ending the run: SIGTERM (or the forwarded signal) now, SIGKILL after the grace. */
static void
launch_stop_all(struct launch_state *st, int sig, int exit_code)
{
    if (st->exit_code < 0)
        st->exit_code = exit_code;
    launch_signal_all(st, sig);
    if (st->kill_deadline == 0)
        st->kill_deadline = launch_now() + st->grace;
}

/* Records a rank's end; the first failure stops the others. */
static void
launch_rank_done(struct launch_state *st, int r, int status)
{
    char running[256];
    bool stopping = st->exit_code >= 0;
    int code;

    st->ranks[r].running = false;
    st->nrunning--;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return;
    if (WIFEXITED(status)) {
        code = WEXITSTATUS(status);
        if (!stopping)
            fprintf(stderr, LAUNCH_NAME ": rank %d (pid %d) exited with status %d\n", r,
                    (int)st->ranks[r].pid, code);
    } else {
        code = 128 + WTERMSIG(status);
        if (!stopping)
            fprintf(stderr, LAUNCH_NAME ": rank %d (pid %d) killed by signal %d (%s)\n", r,
                    (int)st->ranks[r].pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
    }
    if (stopping)
        return;
    if (st->nrunning > 0) {
        launch_running_list(st, running, sizeof(running));
        fprintf(stderr, LAUNCH_NAME ": terminating ranks still running: %s\n", running);
    }
    launch_stop_all(st, SIGTERM, code);
}

/* Reaps every rank that has ended. */
static void
launch_reap(struct launch_state *st)
{
    int status;
    pid_t pid;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int r = 0; r < st->nranks; r++) {
            if (st->ranks[r].running && st->ranks[r].pid == pid) {
                launch_rank_done(st, r, status);
                break;
            }
        }
    }
}

static void
launch_on_sigchld(int sig)
{
    (void)sig; /* only here so that SIGCHLD is never discarded; it is taken by sigtimedwait */
}

/* Waits for ranks, signals and deadlines until every rank has been reaped. */
static int
launch_watch(struct launch_state *st, const sigset_t *watched)
{
    char running[256];
    siginfo_t info;
    struct timespec wait;
    double now, until;
    int sig;

    while (st->nrunning > 0) {
        launch_reap(st);
        if (st->nrunning == 0)
            break;
        now = launch_now();
        if (st->deadline > 0 && now >= st->deadline && st->exit_code < 0) {
            launch_running_list(st, running, sizeof(running));
            fprintf(stderr, LAUNCH_NAME ": timed out after %g s; ranks still running: %s; "
                    "sending SIGTERM\n", st->timeout, running);
            launch_stop_all(st, SIGTERM, LAUNCH_EXIT_TIMEOUT);
        }
        if (st->kill_deadline > 0 && now >= st->kill_deadline) {
            launch_running_list(st, running, sizeof(running));
            fprintf(stderr, LAUNCH_NAME ": ranks still running %g s after SIGTERM: %s; "
                    "sending SIGKILL\n", st->grace, running);
            launch_signal_all(st, SIGKILL);
            st->kill_deadline = -1; /* nothing later can be stronger */
        }

        until = -1;
        if (st->deadline > 0 && st->exit_code < 0)
            until = st->deadline;
        if (st->kill_deadline > 0 && (until < 0 || st->kill_deadline < until))
            until = st->kill_deadline;
        if (until < 0) {
            sig = sigwaitinfo(watched, &info);
        } else {
            double left = until - now;

            if (left < 0)
                left = 0;
            wait.tv_sec = (time_t)left;
            wait.tv_nsec = (long)((left - (double)wait.tv_sec) * 1e9);
            sig = sigtimedwait(watched, &info, &wait);
        }
        if (sig < 0 || sig == SIGCHLD)
            continue; /* timeout, EINTR or a child: the top of the loop sorts it out */

        /* A signal for the whole job: pass it on; a second one escalates at once. */
        if (st->kill_deadline != 0 && st->exit_code >= 0 && st->exit_code == 128 + sig) {
            launch_signal_all(st, SIGKILL);
            st->kill_deadline = -1;
            continue;
        }
        launch_stop_all(st, sig, 128 + sig);
    }
    return st->exit_code < 0 ? 0 : st->exit_code;
}

int
main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "nranks", required_argument, NULL, 'n' },
        { "timeout", required_argument, NULL, 't' },
        { "kill-after", required_argument, NULL, 'k' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    struct launch_state st = { .exit_code = -1, .grace = LAUNCH_DEFAULT_GRACE };
    double timeout = 0;
    sigset_t watched, old_mask;
    int comm_port, master_port;
    pid_t self = getpid();
    char *end;
    long n = 0;
    int c;

    /* '+': stop at the program's name, so that its own options stay its own. */
    while ((c = getopt_long(argc, argv, "+n:t:k:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'n':
            errno = 0;
            n = strtol(optarg, &end, 10);
            if (errno != 0 || *end != '\0' || n < 1 || n > LAUNCH_MAX_RANKS) {
                fprintf(stderr, LAUNCH_NAME ": -n wants a rank count in 1..%d, not '%s'\n",
                        LAUNCH_MAX_RANKS, optarg);
                return LAUNCH_EXIT_USAGE;
            }
            break;
        case 't':
            if (!launch_parse_seconds(optarg, &timeout)) {
                fprintf(stderr, LAUNCH_NAME ": -t wants seconds (e.g. 120, 2m), not '%s'\n",
                        optarg);
                return LAUNCH_EXIT_USAGE;
            }
            break;
        case 'k':
            if (!launch_parse_seconds(optarg, &st.grace)) {
                fprintf(stderr, LAUNCH_NAME ": -k wants seconds (e.g. 5), not '%s'\n",
                        optarg);
                return LAUNCH_EXIT_USAGE;
            }
            break;
        case 'h':
            launch_usage(stdout);
            return 0;
        default:
            launch_usage(stderr);
            return LAUNCH_EXIT_USAGE;
        }
    }
    if (n == 0 || optind >= argc) {
        fprintf(stderr, LAUNCH_NAME ": %s\n",
                n == 0 ? "-n N is required" : "no program to run");
        launch_usage(stderr);
        return LAUNCH_EXIT_USAGE;
    }
    st.nranks = (int)n;
    st.ranks = calloc((size_t)n, sizeof(*st.ranks));
    if (st.ranks == NULL) {
        fprintf(stderr, LAUNCH_NAME ": out of memory for %ld ranks\n", n);
        return LAUNCH_EXIT_USAGE;
    }
    /* Two ports: a torch program binds MASTER_PORT for its store while NCCL binds its own. */
    if (launch_free_port(&comm_port) != 0 || launch_free_port(&master_port) != 0)
        return LAUNCH_EXIT_USAGE;
    if (master_port == comm_port && launch_free_port(&master_port) != 0)
        return LAUNCH_EXIT_USAGE;

    /* Orphaned descendants of a rank are reparented to us and reaped, not left as zombies. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    /* Signals are taken synchronously by sigtimedwait; block them before any fork. */
    signal(SIGCHLD, launch_on_sigchld);
    sigemptyset(&watched);
    sigaddset(&watched, SIGCHLD);
    sigaddset(&watched, SIGINT);
    sigaddset(&watched, SIGTERM);
    sigaddset(&watched, SIGHUP);
    sigaddset(&watched, SIGQUIT);
    sigprocmask(SIG_BLOCK, &watched, &old_mask);
    fflush(NULL);

    st.timeout = timeout;
    if (timeout > 0)
        st.deadline = launch_now() + timeout;
    for (int r = 0; r < st.nranks; r++) {
        pid_t pid = fork();

        if (pid < 0) {
            fprintf(stderr, LAUNCH_NAME ": fork for rank %d: %s\n", r, strerror(errno));
            launch_stop_all(&st, SIGTERM, LAUNCH_EXIT_USAGE);
            break;
        }
        if (pid == 0)
            launch_child_exec(r, st.nranks, comm_port, master_port, self, &old_mask,
                              argv + optind);
        setpgid(pid, pid); /* also in the child: whichever runs first wins the race */
        st.ranks[r].pid = pid;
        st.ranks[r].running = true;
        st.nrunning++;
    }
    c = launch_watch(&st, &watched);
    /* A stopped run leaves nothing behind: what a rank started in its group goes too. */
    if (st.exit_code >= 0) {
        for (int r = 0; r < st.nranks; r++) {
            if (st.ranks[r].pid > 0)
                kill(-st.ranks[r].pid, SIGKILL);
        }
    }
    free(st.ranks);
    return c;
}
