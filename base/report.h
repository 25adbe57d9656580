/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hang reports on request: SIGUSR1 asks every waiting operation of the process to print where
 * it stands (engine/exec.c and the device teams' threads print; NCCLSHIM_TIMEOUT prints
 * the same before it gives up). The handler
 * only counts requests, which is all a signal handler may safely do; waiting loops compare
 * the count with the one they saw and wake at least every NCCLSHIM_WAIT_MS to look.
 */
#ifndef SHIM_REPORT_H
#define SHIM_REPORT_H

/* Installs the SIGUSR1 handler once per process, unless the program has a disposition of its
 * own for SIGUSR1 (then the signal stays the program's). */
void shim_report_install(void);
/* How many reports were requested so far. */
unsigned shim_report_requests(void);

#endif
