/* SPDX-License-Identifier: Apache-2.0 */
#include "report.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>

#include "debug.h"

static unsigned shim_report_count; /* atomic */
static pthread_once_t shim_report_once = PTHREAD_ONCE_INIT;

static void
shim_report_handler(int sig)
{
    (void)sig;
    __atomic_add_fetch(&shim_report_count, 1, __ATOMIC_RELAXED);
}

static void
shim_report_setup(void)
{
    struct sigaction old, act;

    if (sigaction(SIGUSR1, NULL, &old) != 0 || (old.sa_flags & SA_SIGINFO) ||
        old.sa_handler != SIG_DFL) {
        INFO(SHIM_INIT, "SIGUSR1 belongs to the program: no hang reports on it");
        return;
    }
    memset(&act, 0, sizeof(act));
    act.sa_handler = shim_report_handler;
    act.sa_flags = SA_RESTART;
    sigemptyset(&act.sa_mask);
    sigaction(SIGUSR1, &act, NULL);
}

void
shim_report_install(void)
{
    pthread_once(&shim_report_once, shim_report_setup);
}

unsigned
shim_report_requests(void)
{
    return __atomic_load_n(&shim_report_count, __ATOMIC_RELAXED);
}
